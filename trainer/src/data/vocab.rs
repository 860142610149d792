//! The vocabulary: a learned BPE for translation, plain symbols for `copy`, both a
//! `tokenizers` tokenizer with the special tokens at fixed ids.

use std::path::{Path, PathBuf};

use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    Tokenizer, TokenizerBuilder,
};

use crate::error::{Reason, Result, TrainError};

pub const PAD: i64 = 0;
pub const BOS: i64 = 1;
pub const EOS: i64 = 2;
pub const UNK: i64 = 3;

/// The special tokens, in id order (their ids are the constants above).
pub const SPECIAL_TOKENS: [&str; 4] = ["<pad>", "<s>", "</s>", "<unk>"];

/// Maps text to ids and back: a learned BPE for translation, plain symbols for `copy`.
///
/// Both are a `tokenizers` tokenizer, so both are saved as a tokenizer.json that
/// `ferrotrain translate` and every restart reload.
pub struct Vocabulary {
    pub(super) tokenizer: Tokenizer,
}

impl Vocabulary {
    pub fn size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }
    /// Ids of `text`, without BOS/EOS.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self.tokenizer.encode_fast(text, false) {
            Ok(encoding) => encoding.get_ids().to_vec(),
            // The models used here cannot fail on a &str; be safe rather than panic.
            Err(_) => vec![UNK as u32],
        }
    }
    /// Ids of many texts (in parallel), without BOS/EOS.
    pub fn encode_all(&self, texts: &[String]) -> Vec<Vec<u32>> {
        let inputs: Vec<&str> = texts.iter().map(String::as_str).collect();
        match self.tokenizer.encode_batch_fast(inputs, false) {
            Ok(encodings) => encodings.iter().map(|e| e.get_ids().to_vec()).collect(),
            Err(_) => texts.iter().map(|t| self.encode(t)).collect(),
        }
    }
    /// Text of `ids` (special tokens dropped, subwords joined, ready for BLEU).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }
    /// Reads a vocabulary saved by `save` (or any tokenizer.json). One that `save` wrote has
    /// its CRC-32C beside it ([`CRC_SUFFIX`]): a flipped byte in a token or a merge would
    /// shift ids under the checkpoint's embeddings, so a file that does not match is refused.
    pub fn load(path: &Path) -> Result<Self> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| {
                TrainError::Data(Reason::caused(
                    format!("cannot read tokenizer {}", path.display()),
                    e,
                ))
            })
        };
        let bytes = read(path)?;
        let sidecar = crc_path(path);
        if sidecar.exists() {
            check_crc(&bytes, &read(&sidecar)?, path)?;
        }
        Self::from_json(&bytes, &path.display().to_string())
    }

    /// Parses a tokenizer.json's bytes; `origin` names them in errors.
    pub fn from_json(bytes: &[u8], origin: &str) -> Result<Self> {
        // tokenizers 0.22 panics on some malformed files (a file cut short inside the
        // `decoder`, found by fuzzing): that is a refusal naming the file, not a crash.
        let parsed = std::panic::catch_unwind(|| Tokenizer::from_bytes(bytes)).map_err(|_| {
            TrainError::Data(
                format!("cannot load tokenizer {origin}: not a valid tokenizer.json").into(),
            )
        })?;
        let tokenizer = parsed.map_err(|e| {
            TrainError::Data(Reason::caused(format!("cannot load tokenizer {origin}"), e))
        })?;
        Self::checked(tokenizer, origin)
    }
    /// Writes it atomically (temp file + rename), then its CRC-32C beside it (a file of its
    /// own: the tokenizers library refuses a tokenizer.json with a field it does not know).
    pub fn save(&self, path: &Path) -> Result<()> {
        let json = self.tokenizer.to_string(false).map_err(|e| {
            TrainError::Other(Reason::caused(
                format!("cannot serialize tokenizer for {}", path.display()),
                e,
            ))
        })?;
        write_atomically(path, json.as_bytes())?;
        let crc = format!("{:08x}\n", crc32c::crc32c(json.as_bytes()));
        write_atomically(&crc_path(path), crc.as_bytes())
    }

    /// Learns a joint BPE over `lines` (source and target sentences), with the special
    /// tokens at their fixed ids and a reversible whitespace marker (Metaspace, like
    /// SentencePiece), so `decode(encode(s))` gives back `s` up to runs of spaces.
    pub fn learn<S: AsRef<str> + Send>(
        lines: impl Iterator<Item = S> + Send,
        vocab_size: usize,
        min_frequency: u64,
    ) -> Result<Self> {
        let model = BPE::builder()
            .unk_token(SPECIAL_TOKENS[UNK as usize].to_string())
            .build()
            .map_err(|e| TrainError::Other(Reason::caused("cannot build BPE model", e)))?;
        let metaspace = Metaspace::new('▁', PrependScheme::Always, true);
        let mut tokenizer = TokenizerBuilder::<
            BPE,
            NormalizerWrapper,
            PreTokenizerWrapper,
            PostProcessorWrapper,
            DecoderWrapper,
        >::default()
        .with_model(model)
        .with_pre_tokenizer(Some(metaspace.clone().into()))
        .with_decoder(Some(metaspace.into()))
        .build()
        .map_err(|e| TrainError::Other(Reason::caused("cannot build tokenizer", e)))?;
        let mut trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(min_frequency)
            .show_progress(false)
            .special_tokens(
                SPECIAL_TOKENS
                    .iter()
                    .map(|t| AddedToken::from(*t, true))
                    .collect(),
            )
            .build();
        tokenizer
            .train(&mut trainer, lines)
            .map_err(|e| TrainError::Data(Reason::caused("cannot learn a BPE vocabulary", e)))?;
        Self::checked(Tokenizer::from(tokenizer), "the learned vocabulary")
    }

    /// The `copy` task's vocabulary: the special tokens, then symbols `s0`..`s{n-1}` at ids
    /// 4..4+n, separated by spaces.
    pub fn symbols(n: u32) -> Self {
        let mut vocab = serde_json::Map::new();
        for (id, token) in SPECIAL_TOKENS.iter().enumerate() {
            vocab.insert(token.to_string(), id.into());
        }
        for s in 0..n {
            vocab.insert(format!("s{s}"), (s + 4).into());
        }
        let added: Vec<_> = SPECIAL_TOKENS
            .iter()
            .enumerate()
            .map(|(id, token)| {
                serde_json::json!({"id": id, "content": token, "single_word": false,
                    "lstrip": false, "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let json = serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": SPECIAL_TOKENS[UNK as usize]},
        });
        let tokenizer: Tokenizer =
            serde_json::from_value(json).expect("the copy vocabulary is a valid tokenizer.json");
        Self { tokenizer }
    }

    /// Accepts a tokenizer only if the special tokens sit at their fixed ids.
    fn checked(tokenizer: Tokenizer, origin: &str) -> Result<Self> {
        for (id, token) in SPECIAL_TOKENS.iter().enumerate() {
            match tokenizer.token_to_id(token) {
                Some(found) if found as usize == id => {}
                Some(found) => {
                    return Err(TrainError::Data(
                        format!(
                            "{origin}: special token {token} has id {found}, ferrotrain needs {id} \
                         (<pad>=0 <s>=1 </s>=2 <unk>=3)"
                        )
                        .into(),
                    ));
                }
                None => {
                    return Err(TrainError::Data(
                        format!(
                            "{origin}: lacks the special token {token} (ferrotrain needs \
                         <pad>=0 <s>=1 </s>=2 <unk>=3)"
                        )
                        .into(),
                    ));
                }
            }
        }
        let vocab = Self { tokenizer };
        if vocab.size() <= SPECIAL_TOKENS.len() {
            return Err(TrainError::Data(
                format!("{origin}: has no tokens besides the special ones").into(),
            ));
        }
        Ok(vocab)
    }
}

/// What a saved tokenizer.json's CRC-32C file adds to its name.
pub const CRC_SUFFIX: &str = ".crc32c";

fn crc_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(CRC_SUFFIX);
    PathBuf::from(name)
}

/// Refuses `bytes` (of tokenizer `path`) unless they hash to the CRC-32C `recorded`.
fn check_crc(bytes: &[u8], recorded: &[u8], path: &Path) -> Result<()> {
    let recorded = String::from_utf8_lossy(recorded);
    let recorded = recorded.trim();
    let actual = format!("{:08x}", crc32c::crc32c(bytes));
    if actual == recorded {
        return Ok(());
    }
    Err(TrainError::Data(
        format!(
            "cannot load tokenizer {}: its CRC-32C is {actual}, {} says {recorded:?}: the file \
             is damaged (restore both from a copy; a new job directory learns a new vocabulary)",
            path.display(),
            crc_path(path).display()
        )
        .into(),
    ))
}

/// Writes `bytes` to a temporary file beside `path`, syncs it and renames it over `path`, so
/// a reader sees the old file or the new one, never half of one.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let io = |what: &str, e: std::io::Error| {
        TrainError::Other(Reason::caused(
            format!("cannot {what} {}", path.display()),
            e,
        ))
    };
    std::fs::create_dir_all(&dir).map_err(|e| io("create the directory of", e))?;
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // Make the rename itself durable (best effort: not every filesystem allows it).
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e| io("write", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::fixtures::*;

    fn small_vocab() -> Vocabulary {
        Vocabulary::learn(EN.iter().chain(DE), 200, 1).unwrap()
    }

    #[test]
    fn learned_vocabulary_has_fixed_special_ids_and_round_trips() {
        let vocab = small_vocab();
        assert!(
            vocab.size() > 60 && vocab.size() <= 200,
            "size {}",
            vocab.size()
        );
        for (id, token) in SPECIAL_TOKENS.iter().enumerate() {
            assert_eq!(vocab.tokenizer.token_to_id(token), Some(id as u32));
        }
        for line in EN.iter().chain(DE) {
            let ids = vocab.encode(line);
            assert!(!ids.is_empty());
            assert!(
                ids.iter().all(|&id| id >= 4),
                "{line}: special id in {ids:?}"
            );
            assert_eq!(vocab.decode(&ids), *line);
        }
        // Merges happened: a frequent word is one token, not a letter sequence.
        assert_eq!(vocab.encode("Mann").len(), 1);
        // Unseen characters become <unk>; special ids vanish from decoded text.
        let ids = vocab.encode("Ein Mann 😀");
        assert!(ids.contains(&(UNK as u32)), "{ids:?}");
        let mut with_specials = vec![BOS as u32];
        with_specials.extend(vocab.encode("Ein Mann"));
        with_specials.extend([EOS as u32, PAD as u32]);
        assert_eq!(vocab.decode(&with_specials), "Ein Mann");
    }

    #[test]
    fn learning_is_deterministic() {
        let a = small_vocab().tokenizer.to_string(false).unwrap();
        let b = small_vocab().tokenizer.to_string(false).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn saved_vocabulary_reloads_with_the_same_ids_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ckpt").join("tokenizer.json");
        let vocab = small_vocab();
        vocab.save(&path).unwrap();
        let mut files: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        assert_eq!(files, ["tokenizer.json", "tokenizer.json.crc32c"]);
        let again = Vocabulary::load(&path).unwrap();
        assert_eq!(again.size(), vocab.size());
        for line in DE {
            assert_eq!(again.encode(line), vocab.encode(line));
        }
    }

    #[test]
    fn a_tokenizer_without_the_special_tokens_is_rejected_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"[PAD]": 0, "a": 1, "b": 2}, "unk_token": "[PAD]"},
        });
        let path = write(dir.path(), "foreign.json", &json.to_string());
        let message = data_error(Vocabulary::load(Path::new(&path)));
        assert!(
            message.contains("foreign.json") && message.contains("<pad>"),
            "{message}"
        );
        let garbage = write(dir.path(), "garbage.json", "{not json");
        let message = data_error(Vocabulary::load(Path::new(&garbage)));
        assert!(message.contains("garbage.json"), "{message}");
    }

    /// Issue 44's fuzzing: tokenizers panics on a file cut short inside its `decoder`.
    #[test]
    fn a_tokenizer_cut_short_is_refused_naming_the_file_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let cut = r#"{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": "#;
        let path = write(dir.path(), "cut.json", cut);
        let message = data_error(Vocabulary::load(Path::new(&path)));
        assert!(message.contains("cut.json"), "{message}");
    }

    /// Issue 44: the job's tokenizer.json, or its CRC-32C file, truncated, bit-flipped or
    /// zeroed at ten offsets is refused naming the file (the run fails before training) or,
    /// where the damage cannot change it, gives the same ids. Before its CRC-32C, a flipped
    /// byte in a token's text loaded and trained with ids the checkpoint's embeddings were
    /// not trained for.
    #[test]
    fn a_damaged_saved_tokenizer_is_refused_naming_it_never_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        let vocab = small_vocab();
        vocab.save(&path).unwrap();
        let ids = |v: &Vocabulary| EN.iter().chain(DE).map(|l| v.encode(l)).collect::<Vec<_>>();
        let (mut refused, mut same) = (0, 0);
        for file in [path.clone(), crc_path(&path)] {
            let good = std::fs::read(&file).unwrap();
            for copy in ferrotrain_fuzz::damage::copies(&good) {
                std::fs::write(&file, &copy.bytes).unwrap();
                match Vocabulary::load(&path) {
                    Err(TrainError::Data(m)) if m.to_string().contains("tokenizer.json") => {
                        refused += 1
                    }
                    Err(other) => panic!("{copy}: {other:?}"),
                    Ok(loaded) => {
                        assert_eq!(ids(&loaded), ids(&vocab), "{} {copy}", file.display());
                        assert_eq!(loaded.size(), vocab.size(), "{copy}");
                        same += 1;
                    }
                }
            }
            std::fs::write(&file, &good).unwrap();
        }
        println!("{refused} damaged tokenizers refused, {same} harmless");
        assert!(refused >= 40, "{refused} refused, {same} harmless");
        let good = std::fs::read(&path).unwrap();
        // A token's text changed by one letter, the file otherwise valid JSON.
        let text = String::from_utf8(good).unwrap();
        let renamed = text.replacen("\"▁Mann\"", "\"▁Mand\"", 1);
        assert_ne!(renamed, text);
        std::fs::write(&path, renamed).unwrap();
        let message = data_error(Vocabulary::load(&path));
        assert!(message.contains("CRC-32C"), "{message}");
    }

    #[test]
    fn copy_vocabulary_decodes_symbols_with_spaces() {
        let vocab = Vocabulary::symbols(20);
        assert_eq!(vocab.size(), 24);
        assert_eq!(vocab.encode("s0 s7 s19"), [4, 11, 23]);
        assert_eq!(vocab.decode(&[1, 4, 11, 23, 2, 0]), "s0 s7 s19");
        assert_eq!(vocab.encode("s20"), [UNK as u32]);
    }
}
