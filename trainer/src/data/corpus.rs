//! The corpus a run trains and evaluates on: a parallel corpus encoded with the vocabulary
//! (pairs with an empty side or too long dropped, validation kept whole), or the synthetic
//! copy task; with its statistics.

use std::path::Path;
use std::time::Instant;

use ferrotrain_api::{DataStats, Task, TrainerConfig};

use super::files::read_parallel;
use super::rng::{DOMAIN_COPY, below, data_rng};
use super::vocab::{SPECIAL_TOKENS, UNK, Vocabulary};
use crate::error::{Reason, Result, TrainError};

/// One sentence pair as token ids, without BOS/EOS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    pub src: Vec<u32>,
    pub tgt: Vec<u32>,
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

    let (train, empty, long) = train_examples(&vocab, &train_src, &train_tgt, max_len);
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
        (valid, truncated) = valid_examples(&vocab, &src_text, &tgt_text, max_len);
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

/// The training pairs as examples, without the pairs that have an empty side or a side
/// longer than `max_len` tokens; with how many of each were dropped.
fn train_examples(
    vocab: &Vocabulary,
    source: &[String],
    target: &[String],
    max_len: usize,
) -> (Vec<Example>, usize, usize) {
    let src_ids = vocab.encode_all(source);
    let tgt_ids = vocab.encode_all(target);
    let (mut empty, mut long) = (0usize, 0usize);
    let mut train = Vec::with_capacity(src_ids.len());
    for ((src, tgt), (src_text, tgt_text)) in src_ids
        .into_iter()
        .zip(tgt_ids)
        .zip(source.iter().zip(target))
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
    (train, empty, long)
}

/// The validation pairs as examples, every one kept (BLEU needs every sentence) but cut to
/// `max_len` tokens for the loss; with how many were cut.
fn valid_examples(
    vocab: &Vocabulary,
    source: &[String],
    target: &[String],
    max_len: usize,
) -> (Vec<Example>, usize) {
    let mut truncated = 0;
    let valid = vocab
        .encode_all(source)
        .into_iter()
        .zip(vocab.encode_all(target))
        .map(|(mut src, mut tgt)| {
            // Kept (BLEU needs every sentence); the loss sees at most max_len tokens.
            truncated += usize::from(src.len() > max_len || tgt.len() > max_len);
            src.truncate(max_len);
            tgt.truncate(max_len);
            Example { src, tgt }
        })
        .collect();
    (valid, truncated)
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Instant;

    use super::*;
    use crate::data::fixtures::*;
    use tch::Device;

    use crate::data::{epoch_batches, read_lines, to_tensors};

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
