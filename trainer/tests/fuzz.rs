//! Generated input against what the trainer reads back from disk (issue 44): a checkpoint's
//! safetensors file (header, tensor table and data) and a tokenizer.json. Two fuzz targets,
//! `checkpoint_header` and `tokenizer_json` (`bench/fuzz.sh` runs them longer). The trainer
//! links jemalloc, so allocation sizes are bounded by the parsers' own checks here (a header
//! over 100 MB or larger than its file is refused before it is read), not measured.

use ferrotrain_fuzz::Verdict;
use ferrotrain_trainer::checkpoint::tensors_from_bytes;
use ferrotrain_trainer::data::Vocabulary;

/// Seconds per target in the test suite (`FERROTRAIN_FUZZ_SECONDS` overrides).
const SHORT_RUN: f64 = 3.0;

/// The `checkpoint_header` target: a whole safetensors file as `CheckpointStore::load` reads
/// it. Whatever is accepted must describe exactly the bytes there are.
fn checkpoint(input: &[u8]) -> Verdict {
    match tensors_from_bytes(input) {
        Ok(tensors) => {
            let bytes: usize = tensors
                .iter()
                .map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes())
                .sum();
            let header = u64::from_le_bytes(input[..8].try_into().expect("8 bytes")) as usize;
            if 8 + header + bytes != input.len() {
                return Err(format!(
                    "accepted {bytes} tensor bytes in a file of {} with a {header}-byte header",
                    input.len()
                ));
            }
            Ok(format!("{} tensors", tensors.len().min(4)))
        }
        Err(e) => Ok(refusal(&e)),
    }
}

/// A refusal's kind: its message without the numbers and names that vary.
fn refusal(message: &str) -> String {
    message
        .split(|c: char| c.is_ascii_digit() || c == ':')
        .next()
        .unwrap_or_default()
        .chars()
        .take(40)
        .collect()
}

#[test]
fn fuzz_checkpoint_header() {
    let report = ferrotrain_fuzz::check("checkpoint_header", SHORT_RUN, checkpoint);
    assert!(report.corpus >= 2, "{report}");
}

/// The `tokenizer_json` target: a tokenizer.json as a run loads its vocabulary; one that is
/// accepted must encode and decode text without failing.
fn tokenizer(input: &[u8]) -> Verdict {
    match Vocabulary::from_json(input, "fuzz") {
        Ok(vocab) => {
            let ids = vocab.encode("hello world, a small test");
            let _ = vocab.decode(&ids);
            Ok("loaded".into())
        }
        Err(e) => Ok(refusal(&e.to_string())),
    }
}

#[test]
fn fuzz_tokenizer_json() {
    let report = ferrotrain_fuzz::check("tokenizer_json", SHORT_RUN, tokenizer);
    assert!(report.corpus >= 1, "{report}");
}
