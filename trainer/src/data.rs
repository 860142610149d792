//! Training data: parallel corpora (or the synthetic copy task), the subword vocabulary,
//! token-count batches and the global data position.
//!
//! The data order is a pure function of (seed, epoch): every rank computes the same global
//! batches and takes its own shard of each, so the position is one number, the count of
//! training examples consumed over all ranks, valid at any world size.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ferrotrain_api::{DataStats, ParallelFiles, Task, TrainerConfig};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use tch::{Device, Tensor};
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

/// How many batches' worth of shuffled examples are sorted by length together: large enough
/// that batches hold sentences of nearly equal length (little padding), small enough that
/// the epoch order stays random.
const BUCKET_BATCHES: usize = 100;

/// One sentence pair as token ids, without BOS/EOS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    pub src: Vec<u32>,
    pub tgt: Vec<u32>,
}

/// Maps text to ids and back: a learned BPE for translation, plain symbols for `copy`.
///
/// Both are a `tokenizers` tokenizer, so both are saved as a tokenizer.json that
/// `ferrotrain translate` and every restart reload.
pub struct Vocabulary {
    tokenizer: Tokenizer,
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
    /// Reads a vocabulary saved by `save` (or any tokenizer.json).
    pub fn load(path: &Path) -> Result<Self> {
        let tokenizer = Tokenizer::from_file(path).map_err(|e| {
            TrainError::Data(Reason::caused(
                format!("cannot load tokenizer {}", path.display()),
                e,
            ))
        })?;
        Self::checked(tokenizer, &path.display().to_string())
    }
    /// Writes it atomically (temp file + rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let json = self.tokenizer.to_string(false).map_err(|e| {
            TrainError::Other(Reason::caused(
                format!("cannot serialize tokenizer for {}", path.display()),
                e,
            ))
        })?;
        write_atomically(path, json.as_bytes())
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

/// Everything a run trains and evaluates on.
pub struct Corpus {
    pub vocab: Vocabulary,
    pub train: Vec<Example>,
    pub valid: Vec<Example>,
    /// Validation source sentences as text (decoded for BLEU).
    pub valid_sources: Vec<String>,
    /// Validation reference translations as text.
    pub valid_references: Vec<String>,
    /// Sizes and filtering, for the start-up log and `/progress`.
    pub stats: DataStats,
}

/// The statistics of a loaded corpus; `lines`, `empty`, `long` and `truncated` are what the
/// loader counted while filtering.
fn data_stats(
    vocab: &Vocabulary,
    train: &[Example],
    valid: &[Example],
    (lines, empty, long, truncated): (usize, usize, usize, usize),
) -> DataStats {
    let stats = token_stats(train);
    DataStats {
        train_lines: lines as u64,
        train_pairs: train.len() as u64,
        train_tokens: train
            .iter()
            .map(|e| (e.src.len() + e.tgt.len()) as u64)
            .sum(),
        vocabulary_size: vocab.size() as u64,
        mean_source_tokens: stats.mean_src,
        mean_target_tokens: stats.mean_tgt,
        filtered_empty: empty as u64,
        filtered_long: long as u64,
        valid_pairs: valid.len() as u64,
        valid_truncated: truncated as u64,
    }
}

/// Loads (or synthesizes) the corpus. The vocabulary comes from `vocab_path` when it exists
/// (every restart reuses it), else from `data.tokenizer.path`, else it is learned from the
/// training data and saved to `vocab_path`. Missing files, empty corpora and unusable
/// vocabularies are `TrainError::Data` naming the file or field.
pub fn load_corpus(config: &TrainerConfig, vocab_path: &Path) -> Result<Corpus> {
    match config.task {
        Task::Translation => translation_corpus(config, vocab_path),
        Task::Copy => copy_corpus(config, vocab_path),
    }
}

/// Reads a line-aligned pair of files; `field` (e.g. `data.train`) names them in errors.
fn read_parallel(files: &ParallelFiles, field: &str) -> Result<(Vec<String>, Vec<String>)> {
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

/// The vocabulary of a translation run: `vocab_path` if present, else `data.tokenizer.path`,
/// else learned from the training sentences; saved to `vocab_path` in the last two cases.
fn translation_vocabulary(
    config: &TrainerConfig,
    vocab_path: &Path,
    source: &[String],
    target: &[String],
) -> Result<Vocabulary> {
    if vocab_path.exists() {
        let vocab = Vocabulary::load(vocab_path)?;
        tracing::info!(path = %vocab_path.display(), size = vocab.size(), "reusing the saved vocabulary");
        return Ok(vocab);
    }
    let tok = &config.data.tokenizer;
    let vocab = if let Some(path) = &tok.path {
        let vocab = Vocabulary::load(Path::new(path))
            .map_err(|e| TrainError::Data(Reason::caused("data.tokenizer.path", e)))?;
        tracing::info!(path, size = vocab.size(), "loaded the configured tokenizer");
        vocab
    } else {
        let started = Instant::now();
        let vocab = Vocabulary::learn(
            source.iter().chain(target),
            tok.vocab_size as usize,
            u64::from(tok.min_frequency),
        )?;
        tracing::info!(
            size = vocab.size(),
            requested = tok.vocab_size,
            sentences = source.len() + target.len(),
            seconds = started.elapsed().as_secs_f64(),
            "learned a joint BPE vocabulary"
        );
        vocab
    };
    vocab.save(vocab_path)?;
    Ok(vocab)
}

fn translation_corpus(config: &TrainerConfig, vocab_path: &Path) -> Result<Corpus> {
    let train_files =
        config.data.train.as_ref().ok_or_else(|| {
            TrainError::Data("data.train: is required for task translation".into())
        })?;
    let (train_src, train_tgt) = read_parallel(train_files, "data.train")?;
    let valid_text = match &config.data.valid {
        Some(files) => Some(read_parallel(files, "data.valid")?),
        None => None,
    };
    let vocab = translation_vocabulary(config, vocab_path, &train_src, &train_tgt)?;
    let max_len = config.data.max_sentence_tokens as usize;

    let src_ids = vocab.encode_all(&train_src);
    let tgt_ids = vocab.encode_all(&train_tgt);
    let (mut empty, mut long) = (0usize, 0usize);
    let mut train = Vec::with_capacity(src_ids.len());
    for ((src, tgt), (src_text, tgt_text)) in src_ids
        .into_iter()
        .zip(tgt_ids)
        .zip(train_src.iter().zip(&train_tgt))
    {
        if src_text.trim().is_empty()
            || tgt_text.trim().is_empty()
            || src.is_empty()
            || tgt.is_empty()
        {
            empty += 1;
        } else if src.len() > max_len || tgt.len() > max_len {
            long += 1;
        } else {
            train.push(Example { src, tgt });
        }
    }
    let stats = token_stats(&train);
    tracing::info!(
        pairs = train.len(),
        skipped_empty = empty,
        skipped_longer_than_max_sentence_tokens = long,
        max_sentence_tokens = max_len,
        mean_source_tokens = stats.mean_src,
        mean_target_tokens = stats.mean_tgt,
        unk_rate = stats.unk_rate,
        "training data"
    );
    if train.is_empty() {
        return Err(TrainError::Data(format!(
            "data.train: none of the {} pairs in {} / {} is usable ({empty} have an empty side, \
             {long} are longer than data.maxSentenceTokens = {max_len} tokens)",
            train_src.len(),
            train_files.source,
            train_files.target
        ).into()));
    }

    let (mut valid, mut valid_sources, mut valid_references) = (Vec::new(), Vec::new(), Vec::new());
    let mut truncated = 0;
    if let Some((src_text, tgt_text)) = valid_text {
        let src_ids = vocab.encode_all(&src_text);
        let tgt_ids = vocab.encode_all(&tgt_text);
        valid = src_ids
            .into_iter()
            .zip(tgt_ids)
            .map(|(mut src, mut tgt)| {
                // Kept (BLEU needs every sentence); the loss sees at most max_len tokens.
                truncated += usize::from(src.len() > max_len || tgt.len() > max_len);
                src.truncate(max_len);
                tgt.truncate(max_len);
                Example { src, tgt }
            })
            .collect();
        let stats = token_stats(&valid);
        tracing::info!(
            pairs = valid.len(),
            unk_rate = stats.unk_rate,
            mean_source_tokens = stats.mean_src,
            "validation data"
        );
        valid_sources = src_text;
        valid_references = tgt_text;
    }
    let stats = data_stats(
        &vocab,
        &train,
        &valid,
        (train_src.len(), empty, long, truncated),
    );
    Ok(Corpus {
        vocab,
        train,
        valid,
        valid_sources,
        valid_references,
        stats,
    })
}

/// Token counts of a set of examples (for logs and tests).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenStats {
    pub mean_src: f64,
    pub mean_tgt: f64,
    /// Fraction of all source and target tokens that are `<unk>`.
    pub unk_rate: f64,
}

pub fn token_stats(examples: &[Example]) -> TokenStats {
    let n = examples.len().max(1) as f64;
    let src: usize = examples.iter().map(|e| e.src.len()).sum();
    let tgt: usize = examples.iter().map(|e| e.tgt.len()).sum();
    let unk = examples
        .iter()
        .flat_map(|e| e.src.iter().chain(&e.tgt))
        .filter(|&&id| i64::from(id) == UNK)
        .count();
    TokenStats {
        mean_src: src as f64 / n,
        mean_tgt: tgt as f64 / n,
        unk_rate: unk as f64 / (src + tgt).max(1) as f64,
    }
}

/// The copy task: random symbol sequences whose target is the source, a pure function of
/// the seed (train and validation from separate random streams).
fn copy_corpus(config: &TrainerConfig, vocab_path: &Path) -> Result<Corpus> {
    let c = &config.copy;
    let vocab =
        if vocab_path.exists() {
            let vocab = Vocabulary::load(vocab_path)?;
            let expected = c.symbols as usize + SPECIAL_TOKENS.len();
            if vocab.size() != expected || vocab.tokenizer.token_to_id("s0") != Some(4) {
                return Err(TrainError::Data(format!(
                "{}: has {} tokens, not the {expected} of a copy task with copy.symbols = {}",
                vocab_path.display(),
                vocab.size(),
                c.symbols
            ).into()));
            }
            vocab
        } else {
            let vocab = Vocabulary::symbols(c.symbols);
            vocab.save(vocab_path)?;
            vocab
        };
    let generate = |stream: u64, count: u64| -> Vec<Example> {
        let mut rng = data_rng(config.seed, DOMAIN_COPY, stream);
        (0..count)
            .map(|_| {
                let span = (c.max_length - c.min_length) as usize + 1;
                let len = c.min_length as usize + below(&mut rng, span);
                let src: Vec<u32> = (0..len)
                    .map(|_| 4 + below(&mut rng, c.symbols as usize) as u32)
                    .collect();
                Example {
                    tgt: src.clone(),
                    src,
                }
            })
            .collect()
    };
    let train = generate(0, c.train_samples);
    let valid = generate(1, c.valid_samples);
    let valid_sources: Vec<String> = valid.iter().map(|e| vocab.decode(&e.src)).collect();
    let valid_references: Vec<String> = valid.iter().map(|e| vocab.decode(&e.tgt)).collect();
    let stats = data_stats(&vocab, &train, &valid, (train.len(), 0, 0, 0));
    Ok(Corpus {
        vocab,
        train,
        valid,
        valid_sources,
        valid_references,
        stats,
    })
}

const DOMAIN_COPY: u64 = 0x636f_7079; // "copy"
const DOMAIN_EPOCH: u64 = 0x6570_6f63; // "epoc"

/// A ChaCha8 stream keyed by (seed, domain, index). Built from explicit seed bytes (not
/// `seed_from_u64`) and consumed only through `next_u64`, so the data order never changes
/// with a `rand` upgrade: checkpoints keep their meaning.
fn data_rng(seed: u64, domain: u64, index: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&domain.to_le_bytes());
    key[16..24].copy_from_slice(&index.to_le_bytes());
    ChaCha8Rng::from_seed(key)
}

/// A number in 0..n (n > 0), by Lemire's multiply-shift (bias below 2^-40 for any n here).
fn below(rng: &mut ChaCha8Rng, n: usize) -> usize {
    ((u128::from(rng.next_u64()) * n as u128) >> 64) as usize
}

/// Fisher-Yates.
fn shuffle<T>(items: &mut [T], rng: &mut ChaCha8Rng) {
    for i in (1..items.len()).rev() {
        items.swap(i, below(rng, i + 1));
    }
}

/// Source and target lengths of each example (what batching needs).
fn lengths(examples: &[Example]) -> Vec<(u32, u32)> {
    examples
        .iter()
        .map(|e| (e.src.len() as u32, e.tgt.len() as u32))
        .collect()
}

/// The global batches of one epoch, each a list of indices into `examples`: shuffled by
/// (seed, epoch), length-bucketed, each with at most `max_tokens` padded tokens per side
/// (length + 2 for BOS/EOS, times sentences).
///
/// An example longer than `max_tokens` on its own still gets a batch (of one); the config
/// check (`batch.maxTokens` >= `data.maxSentenceTokens` + 2) keeps that from happening.
pub fn epoch_batches(
    examples: &[Example],
    max_tokens: usize,
    seed: u64,
    epoch: u64,
) -> Vec<Vec<usize>> {
    batches_of_epoch(&lengths(examples), max_tokens, seed, epoch)
}

fn batches_of_epoch(
    lens: &[(u32, u32)],
    max_tokens: usize,
    seed: u64,
    epoch: u64,
) -> Vec<Vec<usize>> {
    if lens.is_empty() {
        return Vec::new();
    }
    let mut rng = data_rng(seed, DOMAIN_EPOCH, epoch);
    let mut order: Vec<usize> = (0..lens.len()).collect();
    shuffle(&mut order, &mut rng);

    let width = |i: usize| lens[i].0.max(lens[i].1) as usize + 2;
    let mean_width = lens
        .iter()
        .enumerate()
        .map(|(i, _)| width(i))
        .sum::<usize>()
        .div_ceil(lens.len());
    let bucket = (BUCKET_BATCHES * max_tokens / mean_width.max(1)).max(1);

    let mut batches = Vec::new();
    for chunk in order.chunks_mut(bucket) {
        // Stable: equal lengths keep their shuffled order.
        chunk.sort_by_key(|&i| (lens[i].0.max(lens[i].1), lens[i].0, lens[i].1));
        let mut batch: Vec<usize> = Vec::new();
        let (mut src_width, mut tgt_width) = (0usize, 0usize);
        for &i in chunk.iter() {
            let (s, t) = (lens[i].0 as usize + 2, lens[i].1 as usize + 2);
            let (ws, wt) = (src_width.max(s), tgt_width.max(t));
            let count = batch.len() + 1;
            if !batch.is_empty() && (ws * count > max_tokens || wt * count > max_tokens) {
                batches.push(std::mem::take(&mut batch));
                (src_width, tgt_width) = (s, t);
            } else {
                (src_width, tgt_width) = (ws, wt);
            }
            batch.push(i);
        }
        if !batch.is_empty() {
            batches.push(batch);
        }
    }
    shuffle(&mut batches, &mut rng);
    batches
}

/// Where the data stream stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataPosition {
    pub epoch: u64,
    /// Index of the next batch within the epoch.
    pub batch: u64,
    /// Examples consumed over all ranks since the start (the global sample index).
    pub samples: u64,
}

/// An endless stream of global batches, epoch after epoch.
///
/// Every epoch visits every example exactly once, so `samples / examples` is the epoch and
/// the remainder is a prefix of that epoch's batches: a position is recovered from the
/// sample count alone. The position is kept normalized: after the last batch of an epoch it
/// reads (epoch + 1, batch 0), as `seek` to the same sample count does.
pub struct BatchStream {
    lens: Vec<(u32, u32)>,
    max_tokens: usize,
    seed: u64,
    /// The batches of `position.epoch`.
    batches: Vec<Vec<usize>>,
    position: DataPosition,
}

impl BatchStream {
    /// A stream at the start of epoch 0. `examples` must not be empty (`load_corpus` never
    /// returns an empty training set).
    pub fn new(examples: &[Example], max_tokens: usize, seed: u64) -> Self {
        let lens = lengths(examples);
        let batches = batches_of_epoch(&lens, max_tokens, seed, 0);
        Self {
            lens,
            max_tokens,
            seed,
            batches,
            position: DataPosition::default(),
        }
    }
    /// Positions the stream after `samples` consumed examples (resume).
    ///
    /// A checkpoint is always taken between batches, so a count that falls inside a batch
    /// means the batches differ from the ones the checkpoint was trained on (other training
    /// data, `data.maxSentenceTokens` or `batch.maxTokens`, or seed): an
    /// `IncompatibleCheckpoint` error.
    pub fn seek(&mut self, samples: u64) -> Result<()> {
        let n = self.lens.len() as u64;
        if n == 0 {
            return if samples == 0 {
                Ok(())
            } else {
                Err(TrainError::IncompatibleCheckpoint(
                    format!("data position {samples} cannot be resumed: the training set is empty")
                        .into(),
                ))
            };
        }
        let epoch = samples / n;
        let within = samples % n;
        let batches = batches_of_epoch(&self.lens, self.max_tokens, self.seed, epoch);
        let mut consumed = 0u64;
        let mut batch = 0usize;
        while consumed < within {
            consumed += batches[batch].len() as u64;
            batch += 1;
        }
        if consumed != within {
            return Err(TrainError::IncompatibleCheckpoint(
                format!(
                    "data position {samples} (epoch {epoch}, example {within} of {n}) is not on a \
                 batch boundary of this run (the nearest are {} and {}): the training data, \
                 data.maxSentenceTokens, batch.maxTokens or seed differ from the checkpoint's",
                    samples - within + consumed - batches[batch - 1].len() as u64,
                    samples - within + consumed,
                )
                .into(),
            ));
        }
        self.batches = batches;
        self.position = DataPosition {
            epoch,
            batch: batch as u64,
            samples,
        };
        Ok(())
    }
    pub fn position(&self) -> DataPosition {
        self.position
    }
    /// The next global batch (indices into the examples) and advances the position.
    pub fn next_batch(&mut self) -> Vec<usize> {
        assert!(
            !self.lens.is_empty(),
            "BatchStream over an empty training set"
        );
        let batch = self.batches[self.position.batch as usize].clone();
        self.position.batch += 1;
        self.position.samples += batch.len() as u64;
        if self.position.batch as usize == self.batches.len() {
            self.position.epoch += 1;
            self.position.batch = 0;
            self.batches =
                batches_of_epoch(&self.lens, self.max_tokens, self.seed, self.position.epoch);
        }
        batch
    }
    /// Batches in the current epoch.
    pub fn batches_in_epoch(&self) -> usize {
        self.batches.len()
    }
}

/// This rank's share of a global batch: contiguous in length order, balanced by tokens,
/// identical on every rank for the same (batch, world_size). May be empty for tiny batches.
pub fn shard(batch: &[usize], examples: &[Example], rank: usize, world_size: usize) -> Vec<usize> {
    assert!(
        rank < world_size,
        "rank {rank} outside world size {world_size}"
    );
    let mut sorted = batch.to_vec();
    sorted.sort_by_key(|&i| {
        let e = &examples[i];
        (e.src.len().max(e.tgt.len()), e.src.len(), e.tgt.len(), i)
    });
    // prefix[j] = real tokens (with BOS/EOS) of the first j examples.
    let mut prefix = Vec::with_capacity(sorted.len() + 1);
    prefix.push(0u64);
    for &i in &sorted {
        let e = &examples[i];
        prefix.push(prefix.last().unwrap() + (e.src.len() + e.tgt.len() + 2) as u64);
    }
    let total = *prefix.last().unwrap();
    let world = world_size as u64;
    // Cut k sits where the running token count is nearest k/world of the total (integers
    // only, so every rank computes the same cuts); cuts never move backwards.
    let cut = |k: u64| -> usize {
        let target = total * k;
        // First j with prefix[j] * world >= target; exists since prefix[len] * world >= target.
        let after = prefix.partition_point(|&p| p * world < target);
        if after > 0 && target - prefix[after - 1] * world <= prefix[after] * world - target {
            after - 1
        } else {
            after
        }
    };
    sorted[cut(rank as u64)..cut(rank as u64 + 1)].to_vec()
}

/// Padded tensors for a set of examples.
pub struct TensorBatch {
    /// [B, S] source ids with EOS, PAD-padded.
    pub src: Tensor,
    /// [B, T] decoder input: BOS + target.
    pub tgt_in: Tensor,
    /// [B, T] decoder output: target + EOS, PAD-padded.
    pub tgt_out: Tensor,
    /// [N] positions in the flattened `tgt_out` that are not PAD, computed on the host with
    /// the batch: the loss reads only those rows, and finding them on the device (`nonzero`)
    /// would wait for the GPU every micro-batch.
    pub real: Tensor,
    /// Real (non-pad) target tokens (the loss denominator).
    pub tgt_tokens: i64,
    /// Real source + target tokens (for throughput).
    pub tokens: i64,
}

impl TensorBatch {
    /// A batch from tensors made elsewhere (tests, tools): `real` is found with `nonzero`,
    /// which waits for the device; the training loop's batches come from [`to_tensors`].
    pub fn from_tensors(src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Self {
        let real = tgt_out.ne(PAD).reshape([-1]).nonzero().squeeze_dim(1);
        let tgt_tokens = real.size()[0];
        let src_tokens = src.ne(PAD).sum(tch::Kind::Int64).int64_value(&[]);
        TensorBatch {
            src,
            tgt_in,
            tgt_out,
            real,
            tgt_tokens,
            tokens: src_tokens + tgt_tokens,
        }
    }
}

/// `tgt_tokens` counts the target tokens plus EOS (the positions the loss sees); `tokens`
/// adds the source tokens plus EOS. An empty `indices` gives [0, 1] tensors.
pub fn to_tensors(examples: &[Example], indices: &[usize], device: Device) -> TensorBatch {
    let rows = indices.len();
    let src_width = indices
        .iter()
        .map(|&i| examples[i].src.len() + 1)
        .max()
        .unwrap_or(1);
    let tgt_width = indices
        .iter()
        .map(|&i| examples[i].tgt.len() + 1)
        .max()
        .unwrap_or(1);
    let mut src = vec![PAD; rows * src_width];
    let mut tgt_in = vec![PAD; rows * tgt_width];
    let mut tgt_out = vec![PAD; rows * tgt_width];
    let (mut src_tokens, mut tgt_tokens) = (0i64, 0i64);
    let mut real = Vec::new();
    for (row, &i) in indices.iter().enumerate() {
        let e = &examples[i];
        let s = &mut src[row * src_width..(row + 1) * src_width];
        for (slot, &id) in s.iter_mut().zip(&e.src) {
            *slot = i64::from(id);
        }
        s[e.src.len()] = EOS;
        let ti = &mut tgt_in[row * tgt_width..(row + 1) * tgt_width];
        ti[0] = BOS;
        for (slot, &id) in ti[1..].iter_mut().zip(&e.tgt) {
            *slot = i64::from(id);
        }
        let to = &mut tgt_out[row * tgt_width..(row + 1) * tgt_width];
        for (slot, &id) in to.iter_mut().zip(&e.tgt) {
            *slot = i64::from(id);
        }
        to[e.tgt.len()] = EOS;
        real.extend((0..=e.tgt.len()).map(|col| (row * tgt_width + col) as i64));
        src_tokens += e.src.len() as i64 + 1;
        tgt_tokens += e.tgt.len() as i64 + 1;
    }
    // One upload for the four tensors: views of it on the device.
    let (n_src, n_tgt, n_real) = (src.len() as i64, tgt_in.len() as i64, real.len() as i64);
    let mut host = src;
    host.extend(tgt_in);
    host.extend(tgt_out);
    host.extend(real);
    let all = to_device_queued(&Tensor::from_slice(&host), device);
    let part = |start: i64, n: i64| all.narrow(0, start, n);
    TensorBatch {
        src: part(0, n_src).view([rows as i64, src_width as i64]),
        tgt_in: part(n_src, n_tgt).view([rows as i64, tgt_width as i64]),
        tgt_out: part(n_src + n_tgt, n_tgt).view([rows as i64, tgt_width as i64]),
        real: part(n_src + 2 * n_tgt, n_real),
        tgt_tokens,
        tokens: src_tokens + tgt_tokens,
    }
}

/// A host tensor copied to `device`. On a GPU the copy is asynchronous, from pinned memory:
/// a plain `to_device` would wait until the GPU has finished all the work queued before it
/// (a host synchronisation); this copy is queued behind that work instead, and libtorch
/// keeps the pinned block until the copy is done.
pub fn to_device_queued(host: &Tensor, device: Device) -> Tensor {
    match device {
        Device::Cuda(_) => host
            .pin_memory(device)
            .to_device_(device, host.kind(), true, false),
        _ => host.to_device(device),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn config(yaml: &str) -> TrainerConfig {
        TrainerConfig::from_yaml(yaml, "test").unwrap()
    }

    fn write(dir: &Path, name: &str, text: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    fn write_gz(dir: &Path, name: &str, text: &str) -> String {
        let path = dir.join(name);
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&path).unwrap(),
            flate2::Compression::fast(),
        );
        gz.write_all(text.as_bytes()).unwrap();
        gz.finish().unwrap();
        path.display().to_string()
    }

    fn data_error(result: Result<impl Sized>) -> String {
        match result {
            Err(TrainError::Data(message)) => message.to_string(),
            Err(other) => panic!("expected a data error, got {other:?}"),
            Ok(_) => panic!("expected a data error, got Ok"),
        }
    }

    // A small English/German-like corpus with shared words, so a BPE has something to merge.
    const EN: &[&str] = &[
        "A man rides a bike down the street.",
        "Two dogs play in the green grass.",
        "A woman in a red dress sings on a stage.",
        "Children play football in the park.",
        "A man and a woman walk their dog.",
        "The street is full of people.",
        "A boy jumps into the water.",
        "Three men are working on a roof.",
    ];
    const DE: &[&str] = &[
        "Ein Mann fährt mit dem Fahrrad die Straße hinunter.",
        "Zwei Hunde spielen im grünen Gras.",
        "Eine Frau in einem roten Kleid singt auf einer Bühne.",
        "Kinder spielen Fußball im Park.",
        "Ein Mann und eine Frau gehen mit ihrem Hund spazieren.",
        "Die Straße ist voller Menschen.",
        "Ein Junge springt ins Wasser.",
        "Drei Männer arbeiten auf einem Dach.",
    ];

    fn small_vocab() -> Vocabulary {
        Vocabulary::learn(EN.iter().chain(DE), 200, 1).unwrap()
    }

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
        let files: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(files, ["tokenizer.json"]);
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

    #[test]
    fn copy_vocabulary_decodes_symbols_with_spaces() {
        let vocab = Vocabulary::symbols(20);
        assert_eq!(vocab.size(), 24);
        assert_eq!(vocab.encode("s0 s7 s19"), [4, 11, 23]);
        assert_eq!(vocab.decode(&[1, 4, 11, 23, 2, 0]), "s0 s7 s19");
        assert_eq!(vocab.encode("s20"), [UNK as u32]);
    }

    const LEARN: &str = "{vocabSize: 200, minFrequency: 1}";

    fn translation_files(dir: &Path, src: &str, tgt: &str, tokenizer: &str) -> String {
        let s = write(dir, "train.en", src);
        let t = write_gz(dir, "train.de.gz", tgt);
        let long = "A man rides a bike down the street and the dog runs after him all day long.";
        let vs = write(dir, "valid.en", &format!("{long} {long} {long}\n"));
        let vt = write(dir, "valid.de", "Ein Mann fährt Fahrrad.\n");
        format!(
            "task: translation\nmaxSteps: 1\ndata:\n  train: {{source: '{s}', target: '{t}'}}\n  \
             valid: {{source: '{vs}', target: '{vt}'}}\n  maxSentenceTokens: 40\n  \
             tokenizer: {tokenizer}\nbatch:\n  maxTokens: 100\n"
        )
    }

    #[test]
    fn translation_corpus_skips_empty_and_long_pairs_and_keeps_validation_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut src: Vec<String> = EN.iter().map(|s| s.to_string()).collect();
        let mut tgt: Vec<String> = DE.iter().map(|s| s.to_string()).collect();
        src.push("".into()); // empty source
        tgt.push("Leer.".into());
        src.push("A dog.".into()); // whitespace-only target
        tgt.push("   ".into());
        src.push(EN.join(" ")); // far longer than 12 tokens
        tgt.push("Lang.".into());
        let yaml = translation_files(
            dir.path(),
            &(src.join("\n") + "\n"),
            &(tgt.join("\r\n") + "\r\n"),
            LEARN,
        );
        let vocab_path = dir.path().join("out/tokenizer.json");
        let corpus = load_corpus(&config(&yaml), &vocab_path).unwrap();
        assert!(vocab_path.exists());
        // The 8 normal pairs fit in 40 tokens; the empty, blank and long ones go.
        for (e, d) in EN.iter().zip(DE) {
            assert!(corpus.vocab.encode(e).len() <= 40 && corpus.vocab.encode(d).len() <= 40);
        }
        assert!(corpus.vocab.encode(&EN.join(" ")).len() > 40);
        assert_eq!(corpus.train.len(), 8);
        assert_eq!(corpus.train[0].src, corpus.vocab.encode(EN[0]));
        assert_eq!(corpus.train[7].tgt, corpus.vocab.encode(DE[7]));
        // Validation: one pair, kept though long (truncated for the loss), raw text intact.
        assert_eq!(corpus.valid.len(), 1);
        assert_eq!(corpus.valid[0].src.len(), 40);
        assert_eq!(corpus.valid_references, ["Ein Mann fährt Fahrrad."]);
        assert!(corpus.valid_sources[0].ends_with("all day long."));

        // The stats count what was read, kept and dropped.
        let st = &corpus.stats;
        assert_eq!((st.train_lines, st.train_pairs), (11, 8));
        assert_eq!((st.filtered_empty, st.filtered_long), (2, 1));
        assert_eq!((st.valid_pairs, st.valid_truncated), (1, 1));
        assert_eq!(st.vocabulary_size, corpus.vocab.size() as u64);
        let tokens: usize = corpus.train.iter().map(|e| e.src.len() + e.tgt.len()).sum();
        assert_eq!(st.train_tokens, tokens as u64);
        let mean_src = corpus.train.iter().map(|e| e.src.len()).sum::<usize>() as f64 / 8.0;
        assert!((st.mean_source_tokens - mean_src).abs() < 1e-9);
        assert!(st.mean_target_tokens > 0.0);
    }

    #[test]
    fn the_saved_vocabulary_wins_over_learning_again() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = translation_files(dir.path(), &EN.join("\n"), &DE.join("\n"), LEARN);
        let vocab_path = dir.path().join("tokenizer.json");
        let first = load_corpus(&config(&yaml), &vocab_path).unwrap();
        // Different training text now: the ids must still come from the saved vocabulary.
        let yaml = translation_files(dir.path(), &DE.join("\n"), &EN.join("\n"), LEARN);
        let second = load_corpus(&config(&yaml), &vocab_path).unwrap();
        assert_eq!(first.vocab.size(), second.vocab.size());
        assert_eq!(first.train[0].src, second.train[0].tgt);
        // A configured tokenizer.path is used (and copied to vocab_path) when none is saved.
        let other_path = dir.path().join("copied/tokenizer.json");
        let with_path = translation_files(
            dir.path(),
            &DE.join("\n"),
            &EN.join("\n"),
            &format!("{{path: '{}'}}", vocab_path.display()),
        );
        let third = load_corpus(&config(&with_path), &other_path).unwrap();
        assert!(other_path.exists());
        assert_eq!(
            third.vocab.encode("Ein Mann"),
            first.vocab.encode("Ein Mann")
        );
    }

    #[test]
    fn bad_translation_data_is_a_data_error_naming_the_file_or_field() {
        let dir = tempfile::tempdir().unwrap();
        let vocab_path = dir.path().join("tokenizer.json");
        // Line-count mismatch.
        let yaml = translation_files(dir.path(), "a b\nc d\n", "x y\n", LEARN);
        let message = data_error(load_corpus(&config(&yaml), &vocab_path));
        assert!(
            message.contains("data.train") && message.contains("2 lines"),
            "{message}"
        );
        // Empty corpus.
        let yaml = translation_files(dir.path(), "", "", LEARN);
        let message = data_error(load_corpus(&config(&yaml), &vocab_path));
        assert!(
            message.contains("data.train.source") && message.contains("empty"),
            "{message}"
        );
        // Missing file.
        let yaml =
            translation_files(dir.path(), "a\n", "b\n", LEARN).replace("train.en", "missing.en");
        let message = data_error(load_corpus(&config(&yaml), &vocab_path));
        assert!(
            message.contains("data.train.source") && message.contains("missing.en"),
            "{message}"
        );
        // Every pair unusable.
        let yaml = translation_files(dir.path(), "\n\n", "a\nb\n", LEARN);
        let message = data_error(load_corpus(&config(&yaml), &vocab_path));
        assert!(message.contains("none of the 2 pairs"), "{message}");
        // A saved vocabulary that is not a tokenizer.
        std::fs::write(&vocab_path, "[]").unwrap();
        let yaml = translation_files(dir.path(), "a\n", "b\n", LEARN);
        let message = data_error(load_corpus(&config(&yaml), &vocab_path));
        assert!(message.contains("tokenizer.json"), "{message}");
    }

    #[test]
    fn copy_corpus_is_a_deterministic_function_of_the_seed() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = "task: copy\nmaxSteps: 1\nseed: 7\ncopy: {symbols: 10, minLength: 2, maxLength: 5, trainSamples: 300, validSamples: 20}\n";
        let a = load_corpus(&config(yaml), &dir.path().join("a.json")).unwrap();
        let b = load_corpus(&config(yaml), &dir.path().join("b.json")).unwrap();
        let c = load_corpus(
            &config(&yaml.replace("seed: 7", "seed: 8")),
            &dir.path().join("c.json"),
        )
        .unwrap();
        assert_eq!(a.train, b.train);
        assert_eq!(a.valid, b.valid);
        assert_ne!(a.train, c.train);
        assert_ne!(a.train[..20], a.valid[..]);
        assert_eq!((a.train.len(), a.valid.len()), (300, 20));
        for e in a.train.iter().chain(&a.valid) {
            assert_eq!(e.src, e.tgt);
            assert!((2..=5).contains(&e.src.len()));
            assert!(e.src.iter().all(|&id| (4..14).contains(&id)));
        }
        // Every length and symbol shows up.
        for len in 2..=5 {
            assert!(a.train.iter().any(|e| e.src.len() == len));
        }
        for id in 4..14 {
            assert!(a.train.iter().any(|e| e.src.contains(&id)));
        }
        assert_eq!(a.valid_sources, a.valid_references);
        assert_eq!(a.vocab.encode(&a.valid_sources[0]), a.valid[0].src);
        // A saved vocabulary for a different symbol count is refused.
        let message = data_error(load_corpus(
            &config(&yaml.replace("symbols: 10", "symbols: 12")),
            &dir.path().join("a.json"),
        ));
        assert!(
            message.contains("a.json") && message.contains("copy.symbols"),
            "{message}"
        );
    }

    /// Examples with a spread of lengths (deterministic, no tokenizer needed).
    fn synthetic(n: usize) -> Vec<Example> {
        (0..n)
            .map(|i| {
                let s = 1 + (i * 7919) % 40;
                let t = 1 + (i * 104_729 + s) % 45;
                Example {
                    src: vec![5; s],
                    tgt: vec![6; t],
                }
            })
            .collect()
    }

    #[test]
    fn epoch_batches_cover_every_example_once_within_the_token_budget() {
        let examples = synthetic(3000);
        let batches = epoch_batches(&examples, 400, 1, 0);
        let mut seen = vec![0; examples.len()];
        let (mut padded, mut real) = (0usize, 0usize);
        for batch in &batches {
            assert!(!batch.is_empty());
            let ws = batch
                .iter()
                .map(|&i| examples[i].src.len() + 2)
                .max()
                .unwrap();
            let wt = batch
                .iter()
                .map(|&i| examples[i].tgt.len() + 2)
                .max()
                .unwrap();
            assert!(
                ws * batch.len() <= 400 && wt * batch.len() <= 400,
                "{ws} {wt} x {}",
                batch.len()
            );
            for &i in batch {
                seen[i] += 1;
                real += examples[i].src.len() + examples[i].tgt.len() + 4;
            }
            padded += (ws + wt) * batch.len();
        }
        assert!(seen.iter().all(|&c| c == 1));
        // Bucketing keeps padding small (unsorted batches of these lengths waste ~40%).
        let efficiency = real as f64 / padded as f64;
        assert!(efficiency > 0.8, "padding efficiency {efficiency}");
        // Batches are near the budget, not tiny.
        let mean = examples.len() as f64 / batches.len() as f64;
        assert!(mean > 8.0, "mean batch {mean}");
    }

    #[test]
    fn epoch_batches_depend_on_seed_and_epoch_only() {
        let examples = synthetic(500);
        let a = epoch_batches(&examples, 300, 1, 0);
        assert_eq!(a, epoch_batches(&examples, 300, 1, 0));
        assert_ne!(a, epoch_batches(&examples, 300, 1, 1));
        assert_ne!(a, epoch_batches(&examples, 300, 2, 0));
        // Pinned: the order must not change silently (it would move every checkpoint's data
        // position). Update only on purpose, knowing resumed runs will see other batches.
        assert_eq!(a.len(), 56);
        assert_eq!(a[0][..3], [224, 144, 424]);
    }

    #[test]
    fn stream_positions_are_recovered_by_seek_from_the_sample_count() {
        let examples = synthetic(200);
        let mut stream = BatchStream::new(&examples, 250, 3);
        let per_epoch = stream.batches_in_epoch();
        let mut history = Vec::new();
        for _ in 0..per_epoch * 2 + 5 {
            let before = stream.position();
            history.push((before, stream.next_batch()));
        }
        // Epochs roll over: positions are normalized and samples count every example.
        assert_eq!(
            history[per_epoch].0,
            DataPosition {
                epoch: 1,
                batch: 0,
                samples: 200
            }
        );
        assert_eq!(stream.position().epoch, 2);
        assert_eq!(
            stream.position().samples,
            400 + history[2 * per_epoch..]
                .iter()
                .map(|h| h.1.len() as u64)
                .sum::<u64>()
        );
        for (position, batch) in &history {
            let mut resumed = BatchStream::new(&examples, 250, 3);
            resumed.seek(position.samples).unwrap();
            assert_eq!(resumed.position(), *position);
            assert_eq!(&resumed.next_batch(), batch);
        }
        // A count inside a batch is refused as an incompatible checkpoint.
        let inside = history[3].0.samples + 1;
        assert!(history[3].1.len() > 1);
        let mut resumed = BatchStream::new(&examples, 250, 3);
        match resumed.seek(inside) {
            Err(TrainError::IncompatibleCheckpoint(message)) => {
                assert!(
                    message.to_string().contains(&inside.to_string()),
                    "{message}"
                )
            }
            other => panic!("expected IncompatibleCheckpoint, got {:?}", other.err()),
        }
        // Batches of another batch size do not line up with these positions.
        let mut other = BatchStream::new(&examples, 400, 3);
        assert!(history.iter().any(|(p, _)| other.seek(p.samples).is_err()));
    }

    #[test]
    fn shards_partition_the_batch_balanced_by_tokens() {
        let examples = synthetic(1000);
        let batches = epoch_batches(&examples, 2000, 5, 0);
        for batch in batches.iter().take(20) {
            for world in [1, 2, 3, 4, 7] {
                let shards: Vec<Vec<usize>> = (0..world)
                    .map(|r| shard(batch, &examples, r, world))
                    .collect();
                let mut union: Vec<usize> = shards.concat();
                union.sort_unstable();
                let mut expected = batch.clone();
                expected.sort_unstable();
                assert_eq!(union, expected, "world {world}");
                let cost = |s: &Vec<usize>| -> usize {
                    s.iter()
                        .map(|&i| examples[i].src.len() + examples[i].tgt.len() + 2)
                        .sum()
                };
                let biggest = batch
                    .iter()
                    .map(|&i| examples[i].src.len() + examples[i].tgt.len() + 2)
                    .max()
                    .unwrap();
                let total: usize = cost(batch);
                for s in &shards {
                    let share = cost(s) as f64;
                    let fair = total as f64 / world as f64;
                    assert!(
                        (share - fair).abs() <= biggest as f64,
                        "share {share} fair {fair} world {world}"
                    );
                }
                // Same inputs, same shard (what every rank relies on).
                assert_eq!(shard(batch, &examples, world - 1, world), shards[world - 1]);
            }
        }
        let tiny = vec![0, 1];
        let shards: Vec<_> = (0..4).map(|r| shard(&tiny, &examples, r, 4)).collect();
        assert_eq!(shards.iter().map(Vec::len).sum::<usize>(), 2);
        assert!(shards.iter().any(Vec::is_empty));
    }

    #[test]
    fn tensors_hold_eos_bos_and_padding() {
        let examples = vec![
            Example {
                src: vec![10, 11, 12],
                tgt: vec![20],
            },
            Example {
                src: vec![13],
                tgt: vec![21, 22, 23],
            },
        ];
        let b = to_tensors(&examples, &[1, 0], Device::Cpu);
        let rows = |t: &Tensor| -> Vec<Vec<i64>> { Vec::<Vec<i64>>::try_from(t).unwrap() };
        assert_eq!(
            rows(&b.src),
            [vec![13, EOS, PAD, PAD], vec![10, 11, 12, EOS]]
        );
        assert_eq!(
            rows(&b.tgt_in),
            [vec![BOS, 21, 22, 23], vec![BOS, 20, PAD, PAD]]
        );
        assert_eq!(
            rows(&b.tgt_out),
            [vec![21, 22, 23, EOS], vec![20, EOS, PAD, PAD]]
        );
        assert_eq!(b.src.kind(), tch::Kind::Int64);
        assert_eq!((b.tgt_tokens, b.tokens), (6, 12));
        // The non-PAD positions of tgt_out, found on the host, are what nonzero finds.
        assert_eq!(Vec::<i64>::try_from(&b.real).unwrap(), [0, 1, 2, 3, 4, 5]);
        let found = TensorBatch::from_tensors(b.src.copy(), b.tgt_in.copy(), b.tgt_out.copy());
        assert!(found.real.equal(&b.real));
        assert_eq!((found.tgt_tokens, found.tokens), (b.tgt_tokens, b.tokens));
        let empty = to_tensors(&examples, &[], Device::Cpu);
        assert_eq!(empty.src.size(), [0, 1]);
        assert_eq!(empty.real.size(), [0]);
    }
    /// The real corpus, end to end: learn the joint 8k BPE on Multi30k's 29k training pairs,
    /// encode train and validation. Prints the measured numbers (`--nocapture`).
    #[test]
    fn multi30k_joint_bpe_learns_fast_round_trips_and_rarely_needs_unk() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/multi30k");
        if !root.exists() {
            eprintln!("SKIPPED: {} not found", root.display());
            return;
        }
        let file = |name: &str| root.join(name).display().to_string();
        let yaml = format!(
            "task: translation\nmaxSteps: 1\ndata:\n  train: {{source: '{}', target: '{}'}}\n  \
             valid: {{source: '{}', target: '{}'}}\n  tokenizer: {{vocabSize: 8000, minFrequency: 2}}\n",
            file("train.en.gz"),
            file("train.de.gz"),
            file("val.en.gz"),
            file("val.de.gz")
        );
        let dir = tempfile::tempdir().unwrap();
        let vocab_path = dir.path().join("tokenizer.json");
        // Learning alone (what a first start pays), then loading with the saved vocabulary
        // (what every restart pays: read, decompress, encode).
        let lines: Vec<String> = ["train.en.gz", "train.de.gz"]
            .iter()
            .flat_map(|name| read_lines(&root.join(name)).unwrap())
            .collect();
        let started = Instant::now();
        Vocabulary::learn(lines.iter(), 8000, 2)
            .unwrap()
            .save(&vocab_path)
            .unwrap();
        let learn_seconds = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let corpus = load_corpus(&config(&yaml), &vocab_path).unwrap();
        let seconds = started.elapsed().as_secs_f64();
        let train = token_stats(&corpus.train);
        let valid = token_stats(&corpus.valid);
        let round_trips = corpus
            .valid_references
            .iter()
            .chain(&corpus.valid_sources)
            .filter(|line| {
                // Runs of spaces may collapse; everything else (U+00A0 included) comes back.
                let spaces = |s: &str| {
                    s.split(' ')
                        .filter(|w| !w.is_empty())
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                spaces(&corpus.vocab.decode(&corpus.vocab.encode(line))) == spaces(line)
            })
            .count();
        let lines = corpus.valid_references.len() * 2;
        eprintln!(
            "multi30k: learn 8k BPE {learn_seconds:.2} s; load corpus with it {seconds:.2} s; vocab {}; train pairs {}; \
             tokens/sentence en {:.2} de {:.2}; unk rate train {:.5} valid {:.5}; \
             valid round trips {round_trips}/{lines}",
            corpus.vocab.size(),
            corpus.train.len(),
            train.mean_src,
            train.mean_tgt,
            train.unk_rate,
            valid.unk_rate,
        );
        // Batches of at most 2000 padded tokens a side, as in the PyTorch baseline (which
        // reports about 3,560 real source+target tokens a step).
        let batches = epoch_batches(&corpus.train, 2000, 1, 0);
        let (mut real, mut padded) = (0usize, 0usize);
        for batch in &batches {
            let b = to_tensors(&corpus.train, batch, Device::Cpu);
            real += b.tokens as usize;
            padded += (b.src.size()[1] + b.tgt_out.size()[1]) as usize * batch.len();
        }
        let per_batch = real as f64 / batches.len() as f64;
        let efficiency = real as f64 / padded as f64;
        eprintln!(
            "multi30k batches (maxTokens 2000): {} per epoch, {per_batch:.0} real src+tgt \
             tokens each, {:.1}% of padded positions real",
            batches.len(),
            100.0 * efficiency
        );
        assert!(efficiency > 0.85, "{efficiency}");
        assert!((3000.0..4000.0).contains(&per_batch), "{per_batch}");
        assert_eq!(corpus.vocab.size(), 8000);
        assert_eq!(corpus.valid.len(), 1014);
        assert!(
            corpus.train.len() >= 28_900,
            "{} pairs kept",
            corpus.train.len()
        );
        assert!(
            learn_seconds + seconds < 20.0,
            "took {learn_seconds:.1} + {seconds:.1} s"
        );
        assert!((12.0..20.0).contains(&train.mean_src), "{train:?}");
        assert!((12.0..22.0).contains(&train.mean_tgt), "{train:?}");
        assert!(train.unk_rate == 0.0, "{train:?}");
        assert!(valid.unk_rate < 1e-3, "{valid:?}");
        assert!(
            round_trips as f64 >= 0.99 * lines as f64,
            "{round_trips}/{lines}"
        );
    }
}
