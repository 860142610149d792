//! A page's blocks: its fenced blocks, its ```sh blocks with the ```console block after each,
//! the markers right above a block (`<!-- not run by CI: why -->`, `<!-- state: NAME -->`),
//! and a section of a page (the text under one `## ` heading).

/// What marks a block that CI does not run, up to the reason.
const NOT_RUN: &str = "<!-- not run by CI:";
/// What marks a block run against a job in a state the test puts it in, up to its name.
const STATE: &str = "<!-- state:";

/// One ```sh block of a page, with the output the page shows for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The line of its opening fence (1-based).
    pub line: usize,
    /// The commands, as written.
    pub script: String,
    /// The ```console block right after it: its fence's line and its text.
    pub expected: Option<(usize, String)>,
    /// Why CI does not run it, from `<!-- not run by CI: why -->` right above it.
    pub not_run: Option<String>,
    /// The state its job is put in first, from `<!-- state: NAME -->` right above it.
    pub state: Option<String>,
}

/// A fenced block: its fence's line (1-based), language, text, and the prose line right
/// above it (where a marker is).
struct Block {
    line: usize,
    lang: String,
    text: String,
    above: String,
}

impl Block {
    /// The text of the marker `<!-- PREFIX text -->` right above the block.
    fn marker(&self, prefix: &str) -> Option<String> {
        self.above
            .trim()
            .strip_prefix(prefix)
            .and_then(|r| r.strip_suffix("-->"))
            .map(|r| r.trim().to_string())
    }
}

fn blocks(page: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(String, Block)> = None;
    let mut last_prose = "";
    for (i, line) in page.lines().enumerate() {
        let trimmed = line.trim_start();
        let fence = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f));
        match (&mut open, fence) {
            (None, Some(f)) => {
                let block = Block {
                    line: i + 1,
                    lang: trimmed[f.len()..].trim().to_string(),
                    text: String::new(),
                    above: last_prose.to_string(),
                };
                open = Some((f.to_string(), block));
            }
            (Some((f, _)), Some(g)) if *f == g && trimmed[g.len()..].trim().is_empty() => {
                out.push(open.take().unwrap().1);
                last_prose = "";
            }
            (Some((_, block)), _) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {
                if !line.trim().is_empty() {
                    last_prose = line;
                }
            }
        }
    }
    out
}

/// The page's ```sh blocks in order, each with the ```console block that comes next on the
/// page (when no other block comes first).
pub fn steps(page: &str) -> Vec<Step> {
    let blocks = blocks(page);
    let mut steps = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        if block.lang != "sh" {
            continue;
        }
        let expected = blocks
            .get(i + 1)
            .filter(|next| next.lang == "console")
            .map(|next| (next.line, next.text.clone()));
        steps.push(Step {
            line: block.line,
            script: block.text.clone(),
            expected,
            not_run: block.marker(NOT_RUN),
            state: block.marker(STATE),
        });
    }
    steps
}

/// The section of `page` under the heading `## heading` (up to the next `## ` heading), with
/// the lines above it blanked so that its blocks keep their line numbers; None without it.
pub fn section(page: &str, heading: &str) -> Option<String> {
    let lines: Vec<&str> = page.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.strip_prefix("## ").is_some_and(|h| h.trim() == heading))?;
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("## "))
        .map_or(lines.len(), |n| start + 1 + n);
    let mut text = "\n".repeat(start);
    for line in &lines[start..end] {
        text.push_str(line);
        text.push('\n');
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "\
# A page

```sh
kubectl apply -f examples/copy-dt.yaml
```

It prints:

```console
distributedtraining.ferrotrain.dev/copy created
```

<!-- not run by CI: kind is not on the test cluster -->
```sh
kind load docker-image ferrotrain/trainer:dev
```

```console
Image: \"ferrotrain/trainer:dev\" ...
```

<!-- state: unschedulable -->
```sh
kubectl exec copy-0-1 -- true
```

```yaml
spec:
  replicas: 2
```

```console
not this block's
```
";

    #[test]
    fn the_sh_blocks_are_taken_in_order_with_their_console_blocks_and_markers() {
        let steps = steps(PAGE);
        assert_eq!(steps.len(), 3, "{steps:?}");
        assert_eq!(steps[0].line, 3);
        assert_eq!(steps[0].script, "kubectl apply -f examples/copy-dt.yaml\n");
        assert_eq!(
            steps[0].expected,
            Some((
                9,
                "distributedtraining.ferrotrain.dev/copy created\n".to_string()
            ))
        );
        assert_eq!(steps[0].not_run, None);
        assert_eq!(
            steps[1].not_run.as_deref(),
            Some("kind is not on the test cluster")
        );
        assert_eq!(steps[1].expected.as_ref().map(|e| e.0), Some(18));
        // A YAML block in between: the console block after it is not this block's output.
        assert_eq!(steps[2].expected, None);
        assert_eq!(steps[2].not_run, None);
        assert_eq!(steps[2].state.as_deref(), Some("unschedulable"));
        assert_eq!(steps[0].state, None);
        assert_eq!(steps[1].state, None);
    }

    #[test]
    fn a_section_is_the_text_under_its_heading_at_its_own_lines() {
        let page = "# Page\n\n## Install\n\n```sh\ninstall\n```\n\n## Verify\n\n\
                    ```sh\nverify\n```\n\n### A step\n\n```sh\nmore\n```\n\n## Uninstall\n\n\
                    ```sh\nuninstall\n```\n";
        let verify = section(page, "Verify").expect("the section");
        let steps = steps(&verify);
        let scripts: Vec<&str> = steps.iter().map(|s| s.script.as_str()).collect();
        assert_eq!(scripts, ["verify\n", "more\n"]);
        assert_eq!(steps[0].line, 11, "the page's own line");
        let last = section(page, "Uninstall").unwrap();
        assert_eq!(steps_of(&last), ["uninstall\n"]);
        assert_eq!(section(page, "Verif"), None);
    }

    fn steps_of(text: &str) -> Vec<String> {
        steps(text).into_iter().map(|s| s.script).collect()
    }
}
