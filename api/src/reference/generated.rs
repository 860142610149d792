//! A generated page against its committed copy: the drift tests compare, and write the page
//! instead when [`REGENERATE`] is set (as the repository's `scripts/gen-*.sh` set it).

use std::path::Path;

/// Set, a drift test writes its file instead of comparing (`FERROTRAIN_REGENERATE=1`).
pub const REGENERATE: &str = "FERROTRAIN_REGENERATE";

/// The command that writes the reference.
pub const COMMAND: &str = "scripts/gen-reference.sh";

/// Whether `path` (relative to `root`) holds `text`; with [`REGENERATE`] set it is written
/// first. The error names the first line that differs and the command that fixes it.
pub fn current_or_regenerated(root: &Path, path: &str, text: &str) -> Result<(), String> {
    let file = root.join(path);
    if std::env::var_os(REGENERATE).is_some() {
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::write(&file, text).map_err(|e| format!("{path}: {e}"))?;
    }
    let committed = std::fs::read_to_string(&file)
        .map_err(|e| format!("{path}: {e}: run {COMMAND} and commit the result"))?;
    drift(path, &committed, text)
}

/// Ok when `committed` is `generated`, else what differs first.
pub fn drift(path: &str, committed: &str, generated: &str) -> Result<(), String> {
    if committed == generated {
        return Ok(());
    }
    let (mut old, mut new) = (committed.lines(), generated.lines());
    let mut line = 1;
    loop {
        match (old.next(), new.next()) {
            (a, b) if a == b && a.is_some() => line += 1,
            (None, None) => {
                return Err(format!(
                    "{path} is out of date with the code: run {COMMAND} and commit the result \
                     (it ends differently)"
                ));
            }
            (a, b) => {
                return Err(format!(
                    "{path} is out of date with the code: run {COMMAND} and commit the result \
                     (line {line} is {:?}, the code makes {:?})",
                    a.unwrap_or("<end of file>"),
                    b.unwrap_or("<end of file>")
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_line_fails_naming_it_and_the_command() {
        assert_eq!(drift("p.md", "a\nb\n", "a\nb\n"), Ok(()));
        let e = drift("p.md", "a\nb\n", "a\nc\n").unwrap_err();
        assert!(e.contains("line 2 is \"b\", the code makes \"c\""), "{e}");
        assert!(e.contains("run scripts/gen-reference.sh"), "{e}");
        let e = drift("p.md", "a\n", "a\nb\n").unwrap_err();
        assert!(e.contains("<end of file>"), "{e}");
        // A difference in line endings alone still fails.
        assert!(drift("p.md", "a\n", "a").is_err());
    }
}
