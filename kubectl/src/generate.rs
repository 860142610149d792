//! Shell completion scripts (clap_complete) and man pages (clap_mangen), both from the one
//! clap definition (src/cli.rs), so that neither can name a flag the plugin does not take.

use std::io::Write;
use std::path::Path;

use clap::{Command, CommandFactory};
use clap_complete::Shell;

use crate::cli::Cli;
use crate::error::{Error, Result};

/// The name a shell completes: the binary's (`kubectl ferrotrain` is kubectl's to complete).
pub const BINARY: &str = "kubectl-ferrotrain";

/// The completion script for `shell`.
pub fn completion(shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), BINARY, &mut out);
    out
}

/// The man page of `command` (roff).
fn page(command: Command) -> Vec<u8> {
    let mut out = Vec::new();
    clap_mangen::Man::new(command)
        .render(&mut out)
        .expect("rendering into memory");
    out
}

/// The main page, `kubectl-ferrotrain(1)`.
pub fn man() -> Vec<u8> {
    page(Cli::command())
}

/// Every page: the main one and one per command (`kubectl-ferrotrain-watch.1`, ...), by
/// file name.
pub fn man_pages() -> Vec<(String, Vec<u8>)> {
    let main = Cli::command();
    let mut pages = vec![(format!("{BINARY}.1"), page(main.clone()))];
    for sub in main.get_subcommands() {
        let name = format!("{BINARY}-{}", sub.get_name());
        // clap takes a command's name as a &'static str (without its `string` feature, which
        // would rebuild clap for the whole workspace): a handful of short names, once.
        let leaked: &'static str = Box::leak(name.clone().into_boxed_str());
        let command = sub
            .clone()
            .name(leaked)
            .bin_name(format!("kubectl ferrotrain {}", sub.get_name()));
        pages.push((format!("{name}.1"), page(command)));
    }
    pages
}

/// Writes [`man_pages`] into `dir`.
pub fn write_man_pages(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Write {
        path: dir.display().to_string(),
        source,
    })?;
    for (name, text) in man_pages() {
        let path = dir.join(&name);
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(&text))
            .map_err(|source| Error::Write {
                path: path.display().to_string(),
                source,
            })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_offers_the_commands_and_their_flags() {
        let bash = String::from_utf8(completion(Shell::Bash)).unwrap();
        for word in [
            "submit",
            "watch",
            "logs",
            "recovery",
            "--rank",
            "--round",
            "--context",
        ] {
            assert!(bash.contains(word), "{word}");
        }
        let zsh = String::from_utf8(completion(Shell::Zsh)).unwrap();
        assert!(zsh.contains("#compdef kubectl-ferrotrain"), "{zsh}");
    }

    #[test]
    fn a_man_page_per_command() {
        let main = String::from_utf8(man()).unwrap();
        assert!(main.contains(".TH kubectl-ferrotrain"), "{main}");
        assert!(main.contains("recovery"), "{main}");
        let pages = man_pages();
        let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"kubectl-ferrotrain-logs.1"), "{names:?}");
        let logs = String::from_utf8(
            pages
                .iter()
                .find(|(n, _)| n.ends_with("-logs.1"))
                .unwrap()
                .1
                .clone(),
        )
        .unwrap();
        assert!(logs.contains("previous"), "{logs}");
        let dir =
            std::env::temp_dir().join(format!("kubectl-ferrotrain-man-{}", std::process::id()));
        write_man_pages(&dir).unwrap();
        assert!(dir.join("kubectl-ferrotrain-watch.1").is_file());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
