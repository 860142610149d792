//! Pages whose commands run: the ```sh blocks of a page (docs/getting-started.md,
//! docs/recovery.md) are taken from the markdown as written, run in order, each with bash,
//! and what each prints is compared with the ```console block that follows it on the page.
//!
//! - A block runs as `bash -c` with `set -euo pipefail`, stderr into stdout (a terminal shows
//!   both), from the repository's root, within [`BLOCK_LIMIT`]. Blocks share no shell: a
//!   variable a block sets is gone in the next (the environment comes from the runner).
//! - `<!-- not run by CI: why -->` on the last line before a block's fence leaves it out
//!   (and the console block after it), for the few commands the test cluster cannot run.
//! - A block followed by no console block must print nothing.
//! - Comparison ([`compare`]): every line of the console block must be in the output, in
//!   order; a line `...` stands for any number of output lines, and `...` inside a line for
//!   any text. Without a `...` line at its start (end) the block shows the output's first
//!   (last) line. Numbers, durations and ages (`42`, `0.0118`, `1m`, `2m5s`, `1h05m`) match
//!   any other, whitespace runs match any other, blank lines are ignored. The runner's own
//!   names in the output (its namespace, its image tag) are first replaced by the page's
//!   ([`Page::shown_as`]). kubectl's own diagnostic log lines (client-go's klog format,
//!   `W1202 03:42:45.722885   123 reflector.go:561] ...`: a watch that `kubectl wait` closes
//!   may log one) are not the command's output and are left out ([`is_klog`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

/// The most one block may take (the pages' own `kubectl wait`s are bounded below it).
pub const BLOCK_LIMIT: Duration = Duration::from_secs(360);

/// The pages CI runs (e2e/tests/pages.rs).
pub const PAGES: [&str; 2] = ["docs/getting-started.md", "docs/recovery.md"];

/// What marks a block that CI does not run, up to the reason.
const NOT_RUN: &str = "<!-- not run by CI:";

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
}

/// A fenced block: its fence's line (1-based), language, text, and the reason of a
/// `not run by CI` marker right above it.
struct Block {
    line: usize,
    lang: String,
    text: String,
    not_run: Option<String>,
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
                let not_run = last_prose
                    .trim()
                    .strip_prefix(NOT_RUN)
                    .and_then(|r| r.strip_suffix("-->"))
                    .map(|r| r.trim().to_string());
                let block = Block {
                    line: i + 1,
                    lang: trimmed[f.len()..].trim().to_string(),
                    text: String::new(),
                    not_run,
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
            not_run: block.not_run.clone(),
        });
    }
    steps
}

/// A line of output as compared: every number, duration and age becomes `#`, whitespace
/// runs one space but the indentation (`kubectl describe`'s nesting), none at the end.
pub fn normalize(line: &str) -> String {
    let body = line.trim_start();
    let mut out = line[..line.len() - body.len()].replace('\t', "    ");
    let chars: Vec<char> = body.chars().collect();
    let mut i = 0;
    let digit = |i: usize| chars.get(i).is_some_and(|c| c.is_ascii_digit());
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            while i < chars.len() && chars[i].is_whitespace() {
                i += 1;
            }
            out.push(' ');
            continue;
        }
        if !c.is_ascii_digit() {
            out.push(c);
            i += 1;
            continue;
        }
        // A number: digits, a fraction, an exponent, then units (`1m`, `2m5s`, `1h05m`,
        // `250ms`) when a unit ends the word or another number follows it.
        loop {
            while digit(i) {
                i += 1;
            }
            if chars.get(i) == Some(&'.') && digit(i + 1) {
                i += 1;
                while digit(i) {
                    i += 1;
                }
            }
            if matches!(chars.get(i), Some('e' | 'E')) {
                let sign = usize::from(matches!(chars.get(i + 1), Some('+' | '-')));
                if digit(i + 1 + sign) {
                    i += 1 + sign;
                    while digit(i) {
                        i += 1;
                    }
                }
            }
            let unit = ["ms", "s", "m", "h", "d"].into_iter().find(|u| {
                u.chars()
                    .enumerate()
                    .all(|(k, uc)| chars.get(i + k) == Some(&uc))
            });
            let Some(unit) = unit else { break };
            let after = i + unit.len();
            if digit(after) {
                i = after;
                continue;
            }
            if !chars.get(after).is_some_and(|c| c.is_alphanumeric()) {
                i = after;
            }
            break;
        }
        out.push('#');
    }
    if out.trim().is_empty() {
        return String::new();
    }
    out.trim_end().to_string()
}

/// One line of a console block: `...` alone, or a line whose `...`s stand for any text.
#[derive(Debug)]
enum Expected {
    Gap,
    Line { shown: String, parts: Vec<String> },
}

impl Expected {
    fn parse(line: &str) -> Expected {
        let normal = normalize(line);
        if normal.trim() == "..." {
            return Expected::Gap;
        }
        Expected::Line {
            shown: line.trim_end().to_string(),
            // The first part keeps its indentation.
            parts: normal
                .split("...")
                .enumerate()
                .map(|(i, p)| if i == 0 { p.trim_end() } else { p.trim() }.to_string())
                .collect(),
        }
    }

    fn matches(&self, output: &str) -> bool {
        let Expected::Line { parts, .. } = self else {
            return true;
        };
        if parts.len() == 1 {
            return parts[0] == output;
        }
        let (first, last) = (&parts[0], &parts[parts.len() - 1]);
        if !output.starts_with(first.as_str()) {
            return false;
        }
        let mut rest = &output[first.len()..];
        for part in &parts[1..parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        rest.ends_with(last.as_str())
    }

    fn shown(&self) -> &str {
        match self {
            Expected::Gap => "...",
            Expected::Line { shown, .. } => shown,
        }
    }
}

/// Whether a line is client-go's klog header (`Lmmdd hh:mm:ss.uuuuuu threadid file:line] `):
/// kubectl's diagnostics on stderr, not what the command prints.
pub fn is_klog(line: &str) -> bool {
    let b = line.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let Some(close) = line.find("] ") else {
        return false;
    };
    matches!(b.first(), Some(b'I' | b'W' | b'E' | b'F'))
        && digits(1..5)
        && b.get(5) == Some(&b' ')
        && digits(6..8)
        && b.get(8) == Some(&b':')
        && line[..close].rsplit_once(' ').is_some_and(|(_, at)| {
            at.rsplit_once(':').is_some_and(|(file, n)| {
                file.ends_with(".go") && !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit())
            })
        })
}

/// Compares a command's output with the console block the page shows for it (see the
/// module's documentation); the error says which line of the block was not found where.
pub fn compare(expected: &str, output: &str) -> Result<(), String> {
    let want: Vec<Expected> = expected
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(Expected::parse)
        .collect();
    let got: Vec<String> = output
        .lines()
        .filter(|l| !is_klog(l))
        .map(normalize)
        .filter(|l| !l.is_empty())
        .collect();
    let open_start = matches!(want.first(), Some(Expected::Gap));
    let open_end = matches!(want.last(), Some(Expected::Gap));
    let runs: Vec<&[Expected]> = want
        .split(|e| matches!(e, Expected::Gap))
        .filter(|run| !run.is_empty())
        .collect();
    if runs.is_empty() {
        return if want.is_empty() && !got.is_empty() {
            Err(format!(
                "the page shows no output, but the command printed `{}`",
                got[0]
            ))
        } else {
            Ok(())
        };
    }
    let fits = |run: &[Expected], at: usize| {
        at + run.len() <= got.len() && run.iter().zip(&got[at..]).all(|(e, g)| e.matches(g))
    };
    // How far a run gets at each start it may take: the line it fails at, for the error.
    let stuck = |run: &[Expected], starts: &mut dyn Iterator<Item = usize>| {
        let (best, at) = starts
            .map(|at| {
                let n = run
                    .iter()
                    .zip(got.get(at..).unwrap_or_default())
                    .take_while(|(e, g)| e.matches(g))
                    .count();
                (n, at)
            })
            .max_by_key(|(n, at)| (*n, std::cmp::Reverse(*at)))
            .unwrap_or((0, got.len()));
        let seen = got
            .get(at + best)
            .map_or("the end of the output".to_string(), |g| format!("`{g}`"));
        format!(
            "the page's line `{}` is not in the output (the closest place: output line {}, {seen})",
            run[best.min(run.len() - 1)].shown(),
            at + best + 1
        )
    };
    let more = |run: &[Expected], at: usize| {
        let after = at + run.len();
        format!(
            "the command printed more than the page shows: after `{}`, output line {} `{}`",
            run[run.len() - 1].shown(),
            after + 1,
            got[after]
        )
    };
    let mut next = 0;
    for (i, run) in runs.iter().enumerate() {
        let first = i == 0 && !open_start;
        let last = i == runs.len() - 1 && !open_end;
        let leftmost = (next..got.len()).find(|&at| fits(run, at));
        let at = if first {
            if !fits(run, 0) {
                return Err(stuck(run, &mut std::iter::once(0)));
            }
            if last && run.len() < got.len() {
                return Err(more(run, 0));
            }
            0
        } else if last {
            // The last run ends the output.
            let tail = got
                .len()
                .checked_sub(run.len())
                .filter(|&t| t >= next && fits(run, t));
            match (tail, leftmost) {
                (Some(t), _) => t,
                (None, Some(at)) => return Err(more(run, at)),
                (None, None) => return Err(stuck(run, &mut (next..got.len().max(next + 1)))),
            }
        } else {
            match leftmost {
                Some(at) => at,
                None => return Err(stuck(run, &mut (next..got.len().max(next + 1)))),
            }
        };
        next = at + run.len();
    }
    Ok(())
}

/// Replaces the runner's own names (its namespace, its image tag) with the page's.
pub fn shown_as(output: &str, names: &[(String, String)]) -> String {
    let mut names: Vec<&(String, String)> = names.iter().filter(|(a, _)| !a.is_empty()).collect();
    names.sort_by_key(|(a, _)| std::cmp::Reverse(a.len()));
    names.iter().fold(output.to_string(), |text, (from, to)| {
        text.replace(from, to)
    })
}

/// A page to run: its path in the repository and what its blocks run with.
pub struct Page {
    /// Repository-relative path, e.g. `docs/getting-started.md`.
    pub path: String,
    /// Environment variables of every block (KUBECONFIG, what the page documents).
    pub env: Vec<(String, String)>,
    /// The runner's names in the output and what the page shows instead: (namespace,
    /// `default`), (image tag, `dev`).
    pub shown_as: Vec<(String, String)>,
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ is in the repository")
        .to_path_buf()
}

/// What a block did: its exit status (None when it ran past the limit) and its output.
pub struct Ran {
    pub status: Option<i32>,
    pub output: String,
    pub seconds: f64,
}

/// Runs `script` with bash (`set -euo pipefail`, stderr into stdout) in `dir` with `env`,
/// for at most `limit`: past it the whole process group is killed.
pub async fn run_script(
    script: &str,
    dir: &Path,
    env: &[(String, String)],
    limit: Duration,
) -> Ran {
    let started = Instant::now();
    let mut child = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(format!("exec 2>&1\nset -euo pipefail\n{script}"))
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("starting bash");
    let pid = child.id();
    let mut stdout = child.stdout.take().expect("bash's stdout");
    let mut bytes = Vec::new();
    let finished = tokio::time::timeout(limit, async {
        let _ = stdout.read_to_end(&mut bytes).await;
        child.wait().await
    })
    .await;
    let status = match finished {
        Ok(Ok(status)) => Some(status.code().unwrap_or(-1)),
        Ok(Err(e)) => panic!("waiting for bash: {e}"),
        Err(_) => {
            if let Some(pid) = pid {
                // The block's commands (kubectl wait, ...) are in bash's process group.
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .status();
            }
            None
        }
    };
    Ran {
        status,
        output: String::from_utf8_lossy(&bytes).into_owned(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Runs the page's blocks in order; the first that fails (a non-zero exit, the time limit, or
/// output the page does not show) panics naming the page, the block's line, the commands,
/// what they printed and what the page shows.
pub async fn run_page(page: &Page) {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join(&page.path))
        .unwrap_or_else(|e| panic!("reading {}: {e}", page.path));
    let steps = steps(&text);
    assert!(
        steps.iter().any(|s| s.not_run.is_none()),
        "{}: no ```sh block to run",
        page.path
    );
    for step in &steps {
        let at = format!("{}:{}", page.path, step.line);
        if let Some(why) = &step.not_run {
            eprintln!("[pages] {at}: not run ({why})");
            continue;
        }
        let ran = run_script(&step.script, &root, &page.env, BLOCK_LIMIT).await;
        let output = shown_as(&ran.output, &page.shown_as);
        eprintln!(
            "[pages] {at}: exit {:?} after {:.1} s",
            ran.status, ran.seconds
        );
        let (expected_at, expected) = match &step.expected {
            Some((line, text)) => (format!("{}:{line}", page.path), text.as_str()),
            None => ("(no console block: nothing)".to_string(), ""),
        };
        let problem = match ran.status {
            None => Some(format!("the block ran past {BLOCK_LIMIT:?}")),
            Some(0) => compare(expected, &output)
                .err()
                .map(|e| format!("the block's output is not what the page shows: {e}")),
            Some(code) => Some(format!("the block exited with status {code}")),
        };
        if let Some(problem) = problem {
            let mut report = format!("{at}: {problem}\n");
            let _ = writeln!(report, "--- the block ({at})\n{}", step.script.trim_end());
            let _ = writeln!(report, "--- its output\n{}", output.trim_end());
            let _ = writeln!(
                report,
                "--- what the page shows ({expected_at})\n{}",
                expected.trim_end()
            );
            panic!("{report}");
        }
    }
}

/// A copy of `$KUBECONFIG` (its current context alone) whose context's namespace is the
/// test's, so that a page's `kubectl` commands without `-n` work there; removed on drop.
pub struct NamespacedKubeconfig {
    pub path: PathBuf,
}

impl NamespacedKubeconfig {
    pub fn create(namespace: &str) -> NamespacedKubeconfig {
        let path = std::env::temp_dir().join(format!("{namespace}.kubeconfig"));
        let view = std::process::Command::new("kubectl")
            .args(["config", "view", "--raw", "--flatten", "--minify"])
            .output()
            .expect("kubectl config view (kubectl on PATH)");
        assert!(
            view.status.success(),
            "kubectl config view: {}",
            String::from_utf8_lossy(&view.stderr)
        );
        // Owner-only, or helm warns that the file is readable by others on every command.
        {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            file.write_all(&view.stdout)
                .expect("writing the kubeconfig");
        }
        let set = std::process::Command::new("kubectl")
            .args(["config", "set-context", "--current"])
            .arg(format!("--namespace={namespace}"))
            .env("KUBECONFIG", &path)
            .output()
            .expect("kubectl config set-context");
        assert!(
            set.status.success(),
            "kubectl config set-context: {}",
            String::from_utf8_lossy(&set.stderr)
        );
        NamespacedKubeconfig { path }
    }
}

impl Drop for NamespacedKubeconfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The tag of the images the installed chart runs: `$FERROTRAIN_E2E_IMAGE`'s (what
/// scripts/e2e.sh sets), else `$TAG`.
pub fn image_tag() -> String {
    crate::jobs::trainer_image()
        .and_then(|image| image.rsplit_once(':').map(|(_, tag)| tag.to_string()))
        .or_else(|| std::env::var("TAG").ok().filter(|t| !t.is_empty()))
        .expect("set FERROTRAIN_E2E_IMAGE (ferrotrain/trainer:TAG) or TAG: the tag of the images the chart runs")
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
    }

    #[test]
    fn numbers_durations_ages_and_spacing_are_wildcards() {
        assert_eq!(
            normalize("copy   Running   1450   35.9      0.0118    43s   0          51s"),
            "copy Running # # # # # #"
        );
        for same in ["1m", "2m5s", "1h05m", "2d04h", "250ms", "4.21e-05", "12"] {
            assert_eq!(normalize(same), "#", "{same}");
        }
        assert_eq!(normalize("copy-0-1"), "copy-#-#");
        assert_eq!(normalize("3000 steps, 0.26 s"), "# steps, # s");
        // A unit is a unit only at the end of a word.
        assert_eq!(normalize("5seconds"), "#seconds");
        // The indentation stays: it is `kubectl describe`'s nesting.
        assert_eq!(normalize("    Lost Steps:   0  "), "    Lost Steps: #");
        assert_ne!(
            normalize("      Lost Steps:  0"),
            normalize("    Lost Steps:  0")
        );
        assert_eq!(normalize("   "), "");
    }

    const GET: &str = "\
NAME   PHASE     STEP   STEPS/S   LOSS     ETA   RESTARTS   AGE
copy   Running   120    38.2      1.02     1m    0          14s
";

    #[test]
    fn the_output_matches_when_only_numbers_and_spacing_differ() {
        let output = "NAME   PHASE     STEP   STEPS/S   LOSS      ETA   RESTARTS   AGE\n\
                      copy   Running   1450   35.9      0.0118    43s   0          2m5s\n";
        assert_eq!(compare(GET, output), Ok(()));
    }

    #[test]
    fn kubectls_own_log_lines_are_not_output() {
        let warning = r#"W1202 03:42:48.123456   28225 reflector.go:561] "Warning: watch ended with error" err="context canceled""#;
        assert!(is_klog(warning));
        assert!(is_klog("I1202 03:42:48.1   1 informerwatcher.go:12] x"));
        assert!(!is_klog(
            "distributedtraining.ferrotrain.dev/copy condition met"
        ));
        assert!(!is_klog("I1202 is not a klog line] x"));
        assert!(!is_klog("W1202 03:42:48.123456   1 reflector] no file"));
        let page = "created\ncondition met\ncondition met\n";
        let output = format!("created\ncondition met\n{warning}\ncondition met\n");
        assert_eq!(compare(page, &output), Ok(()));
        let shown = format!("created\n{warning}\n");
        assert!(
            compare(page, &shown).is_err(),
            "a klog line stands for nothing"
        );
    }

    #[test]
    fn a_planted_mismatch_fails() {
        let output = "NAME   PHASE     STEP   STEPS/S   LOSS     ETA   RESTARTS   AGE\n\
                      copy   Failed    120    38.2      1.02     1m    0          14s\n";
        let err = compare(GET, output).unwrap_err();
        assert!(err.contains("copy   Running"), "{err}");
        assert!(err.contains("output line 2"), "{err}");
        // An empty column is not a number.
        let output = "NAME   PHASE     STEP   STEPS/S   LOSS     ETA   RESTARTS   AGE\n\
                      copy   Running                                0          14s\n";
        assert!(compare(GET, output).is_err());
    }

    #[test]
    fn output_the_page_does_not_show_fails() {
        let more = format!("{GET}copy   Running   130    38.2      1.02     1m    0   15s\n");
        let err = compare(GET, &more).unwrap_err();
        assert!(err.contains("more than the page shows"), "{err}");
        let before = format!("Warning: something\n{GET}");
        assert!(compare(GET, &before).is_err());
        // A block with no console block must print nothing.
        assert!(compare("", "").is_ok());
        assert!(compare("", "\n\n").is_ok());
        assert!(compare("", "error: no such pod").is_err());
        // A missing line.
        let err = compare(GET, "NAME   PHASE\n").unwrap_err();
        assert!(err.contains("not in the output"), "{err}");
    }

    #[test]
    fn gaps_skip_lines_and_inline_gaps_skip_text() {
        let expected = "\
...
NAME: ferrotrain
LAST DEPLOYED: ...
STATUS: deployed
...
";
        let output = "Release \"ferrotrain\" has been upgraded. Happy Helming!\n\
                      NAME: ferrotrain\n\
                      LAST DEPLOYED: Tue Dec  1 10:00:00 2026\n\
                      STATUS: deployed\n\
                      REVISION: 3\n\
                      NOTES:\n";
        assert_eq!(compare(expected, output), Ok(()));
        // Without the gaps the first and the last lines must be the output's.
        let strict = "NAME: ferrotrain\nLAST DEPLOYED: ...\nSTATUS: deployed\n";
        assert!(compare(strict, output).is_err());
        // Lines between two shown lines need a gap.
        let no_gap = "...\nNAME: ferrotrain\nSTATUS: deployed\n...\n";
        assert!(compare(no_gap, output).is_err());
        // An inline gap in the middle of a line.
        let inline = "...\nLAST DEPLOYED: Tue ... 2026\n...\n";
        assert_eq!(compare(inline, output), Ok(()));
        let wrong = "...\nLAST DEPLOYED: Wed ... 2026\n...\n";
        assert!(compare(wrong, output).is_err());
        // A gap in the middle, the last run anchored at the end.
        let ends = "...\nNAME: ferrotrain\n...\nNOTES:\n";
        assert_eq!(compare(ends, output), Ok(()));
        let not_last = "...\nNAME: ferrotrain\n...\nSTATUS: deployed\n";
        assert!(compare(not_last, output).is_err());
    }

    #[test]
    fn the_runners_names_are_shown_as_the_pages() {
        let names = vec![
            ("ft-e2e-pages-1a2b".to_string(), "default".to_string()),
            ("e2e-abc1234-deadbeef".to_string(), "dev".to_string()),
        ];
        let output = "pod \"copy-0-0\" deleted from ft-e2e-pages-1a2b namespace\n\
                      Jobs without spec.image run ferrotrain/trainer:e2e-abc1234-deadbeef.\n";
        assert_eq!(
            shown_as(output, &names),
            "pod \"copy-0-0\" deleted from default namespace\n\
             Jobs without spec.image run ferrotrain/trainer:dev.\n"
        );
    }

    /// What CI runs: every page has blocks to run, each shows what it prints (or prints
    /// nothing on purpose), and every block left out says why.
    #[test]
    fn the_pages_ci_runs_have_blocks_with_their_output() {
        for page in PAGES {
            let text = std::fs::read_to_string(repo_root().join(page)).unwrap();
            let steps = steps(&text);
            let run: Vec<&Step> = steps.iter().filter(|s| s.not_run.is_none()).collect();
            assert!(run.len() >= 4, "{page}: {} blocks run", run.len());
            for step in &steps {
                if let Some(why) = &step.not_run {
                    assert!(why.len() > 10, "{page}:{}: say why", step.line);
                }
            }
            assert!(
                run.iter().filter(|s| s.expected.is_some()).count() >= run.len() - 1,
                "{page}: blocks without their output"
            );
            // The job is cleaned up by the page itself.
            assert!(
                run.last().unwrap().script.contains("kubectl delete"),
                "{page}: the last block cleans up"
            );
        }
    }

    #[tokio::test]
    async fn a_block_runs_with_bash_strictly_and_within_its_limit() {
        let root = repo_root();
        let env = vec![("GREETING".to_string(), "hello".to_string())];
        let ran = run_script(
            "echo \"$GREETING\"; echo oops >&2; test -f examples/copy-dt.yaml",
            &root,
            &env,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(
            (ran.status, ran.output.as_str()),
            (Some(0), "hello\noops\n")
        );
        // -u: an unset variable fails the block; pipefail: so does a failed pipe.
        let ran = run_script(
            "echo \"$NOT_SET_ANYWHERE\"",
            &root,
            &[],
            Duration::from_secs(30),
        )
        .await;
        assert_ne!(ran.status, Some(0));
        let ran = run_script(
            "false | cat\necho after",
            &root,
            &[],
            Duration::from_secs(30),
        )
        .await;
        assert_ne!(ran.status, Some(0));
        assert!(!ran.output.contains("after"));
        let ran = run_script("echo started; sleep 30", &root, &[], Duration::from_secs(1)).await;
        assert_eq!((ran.status, ran.output.as_str()), (None, "started\n"));
    }
}
