//! The data files: lines of text (gzip or not, CRLF, a byte-order mark), line-aligned
//! pairs, and the check that the configured files exist before a rank meets the others.

use std::io::Read;
use std::path::Path;

use ferrotrain_api::{ParallelFiles, Task, TrainerConfig};

use crate::error::{Reason, Result, TrainError};

/// Checks that configured data files exist before meeting other ranks, so a typo fails fast
/// with exit code 3 on every rank instead of as a collective timeout.
pub fn preflight_data(config: &TrainerConfig) -> Result<()> {
    if config.task != Task::Translation {
        return Ok(());
    }
    let mut files = Vec::new();
    for (field, pair) in [
        ("data.train", &config.data.train),
        ("data.valid", &config.data.valid),
    ] {
        if let Some(p) = pair {
            files.push((format!("{field}.source"), p.source.clone()));
            files.push((format!("{field}.target"), p.target.clone()));
        }
    }
    if let Some(p) = &config.data.tokenizer.path {
        files.push(("data.tokenizer.path".into(), p.clone()));
    }
    for (field, file) in files {
        if !Path::new(&file).is_file() {
            return Err(TrainError::Data(
                format!("{field}: file {file} does not exist or is not a file").into(),
            ));
        }
    }
    Ok(())
}

/// The lines of a text file (gzip-compressed or not, detected by content), without their
/// line terminators ("\n" or "\r\n") and without a leading UTF-8 byte-order mark.
pub fn read_lines(path: &Path) -> Result<Vec<String>> {
    let raw = std::fs::read(path).map_err(|e| {
        TrainError::Data(Reason::caused(format!("cannot read {}", path.display()), e))
    })?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::with_capacity(raw.len() * 3);
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| {
                TrainError::Data(Reason::caused(
                    format!("cannot decompress {}", path.display()),
                    e,
                ))
            })?;
        out
    } else {
        raw
    };
    let text = String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..valid]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        TrainError::Data(format!("{}: line {line} is not valid UTF-8 text", path.display()).into())
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let mut lines: Vec<String> = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l).to_string())
        .collect();
    if text.is_empty() || text.ends_with('\n') {
        lines.pop();
    }
    Ok(lines)
}

/// Reads a line-aligned pair of files; `field` (e.g. `data.train`) names them in errors.
pub(super) fn read_parallel(
    files: &ParallelFiles,
    field: &str,
) -> Result<(Vec<String>, Vec<String>)> {
    let read = |side: &str, file: &str| -> Result<Vec<String>> {
        let lines = read_lines(Path::new(file))
            .map_err(|e| TrainError::Data(Reason::caused(format!("{field}.{side}"), e)))?;
        if lines.is_empty() {
            return Err(TrainError::Data(
                format!("{field}.{side}: {file} is empty (one sentence a line expected)").into(),
            ));
        }
        Ok(lines)
    };
    let source = read("source", &files.source)?;
    let target = read("target", &files.target)?;
    if source.len() != target.len() {
        return Err(TrainError::Data(format!(
            "{field}: source {} has {} lines but target {} has {} (the files must be line-aligned)",
            files.source,
            source.len(),
            files.target,
            target.len()
        ).into()));
    }
    Ok((source, target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::fixtures::*;

    #[test]
    fn read_lines_handles_gzip_crlf_bom_and_missing_final_newline() {
        let dir = tempfile::tempdir().unwrap();
        let plain = write(dir.path(), "a.txt", "\u{feff}eins\r\nzwei\n\ndrei");
        assert_eq!(
            read_lines(Path::new(&plain)).unwrap(),
            ["eins", "zwei", "", "drei"]
        );
        let gz = write_gz(dir.path(), "a.txt.gz", "Größe\r\nÜber\n");
        assert_eq!(read_lines(Path::new(&gz)).unwrap(), ["Größe", "Über"]);
        let empty = write(dir.path(), "empty.txt", "");
        assert!(read_lines(Path::new(&empty)).unwrap().is_empty());
        let one_blank = write(dir.path(), "blank.txt", "\n");
        assert_eq!(read_lines(Path::new(&one_blank)).unwrap(), [""]);
    }

    #[test]
    fn read_lines_names_the_file_and_line_of_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.txt");
        let message = data_error(read_lines(&missing));
        assert!(message.contains("nope.txt"), "{message}");
        let bad = dir.path().join("latin1.txt");
        std::fs::write(&bad, b"ok\nstill ok\nGr\xf6\xdfe\n").unwrap();
        let message = data_error(read_lines(&bad));
        assert!(
            message.contains("latin1.txt") && message.contains("line 3"),
            "{message}"
        );
    }
}
