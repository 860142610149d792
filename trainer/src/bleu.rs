//! Corpus BLEU exactly as sacreBLEU computes its default (13a tokenization, cased, exponential
//! brevity penalty, no smoothing needed at corpus level beyond sacreBLEU's 'exp' method).
//!
//! A port of sacreBLEU 2.5.1 (`sacrebleu/tokenizers/tokenizer_13a.py`, `tokenizer_re.py`,
//! `metrics/bleu.py`), one reference per hypothesis. The 'exp' smoothing matters only when an
//! n-gram order has hypothesis n-grams but no match: its precision becomes
//! `100 / (2^k * total)` for the k-th such order instead of 0. When an order has no hypothesis
//! n-grams at all (every hypothesis shorter than n tokens) the score is 0, and when nothing
//! matches at all the score is 0, as in sacreBLEU.

use std::collections::HashMap;

/// A BLEU score with its parts, as sacreBLEU prints them.
#[derive(Clone, Debug, PartialEq)]
pub struct Bleu {
    /// 0..100.
    pub score: f64,
    /// n-gram precisions for n = 1..4, in percent.
    pub precisions: [f64; 4],
    pub brevity_penalty: f64,
    pub hyp_len: usize,
    pub ref_len: usize,
}

impl std::fmt::Display for Bleu {
    /// sacreBLEU's one-line form: `BLEU = 35.12 66.1/41.2/27.5/18.9 (BP = 1.000 ratio = 1.003 hyp_len = 12000 ref_len = 11960)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.precisions;
        let ratio = if self.ref_len > 0 {
            self.hyp_len as f64 / self.ref_len as f64
        } else {
            0.0
        };
        write!(
            f,
            "BLEU = {:.2} {:.1}/{:.1}/{:.1}/{:.1} (BP = {:.3} ratio = {:.3} hyp_len = {} ref_len = {})",
            self.score,
            p[0],
            p[1],
            p[2],
            p[3],
            self.brevity_penalty,
            ratio,
            self.hyp_len,
            self.ref_len
        )
    }
}

const MAX_ORDER: usize = 4;

/// sacreBLEU's `13a` tokenizer (mteval-v13a).
pub fn tokenize_13a(line: &str) -> String {
    let mut line = line
        .replace("<skipped>", "")
        .replace("-\n", "")
        .replace('\n', " ");
    if line.contains('&') {
        line = line
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">");
    }
    let chars: Vec<char> = format!(" {line} ").chars().collect();
    // The four substitutions of sacreBLEU's TokenizerRegexp, applied in order. Each pattern
    // matches a fixed number of characters, so Python's `re.sub` (leftmost, non-overlapping,
    // scanning on after each match) is reproduced by the scans below.
    let chars = substitute(
        &chars,
        1,
        |w| is_13a_symbol(w[0]),
        |w, out| {
            out.extend([' ', w[0], ' ']);
        },
    );
    let chars = substitute(
        &chars,
        2,
        |w| !is_digit(w[0]) && is_period_or_comma(w[1]),
        |w, out| {
            out.extend([w[0], ' ', w[1], ' ']);
        },
    );
    let chars = substitute(
        &chars,
        2,
        |w| is_period_or_comma(w[0]) && !is_digit(w[1]),
        |w, out| {
            out.extend([' ', w[0], ' ', w[1]]);
        },
    );
    let chars = substitute(
        &chars,
        2,
        |w| is_digit(w[0]) && w[1] == '-',
        |w, out| {
            out.extend([w[0], ' ', w[1], ' ']);
        },
    );
    let text: String = chars.into_iter().collect();
    python_split(&text).collect::<Vec<_>>().join(" ")
}

/// `re.sub` for a pattern of exactly `width` characters.
fn substitute(
    chars: &[char],
    width: usize,
    matches: impl Fn(&[char]) -> bool,
    replace: impl Fn(&[char], &mut Vec<char>),
) -> Vec<char> {
    let mut out = Vec::with_capacity(chars.len() + chars.len() / 2);
    let mut i = 0;
    while i < chars.len() {
        if i + width <= chars.len() && matches(&chars[i..i + width]) {
            replace(&chars[i..i + width], &mut out);
            i += width;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// The class `[\{-\~\[-\` -\&\(-\+\:-\@\/]`: ASCII punctuation and symbols except
/// `'`, `,`, `-` and `.`, plus the space.
fn is_13a_symbol(c: char) -> bool {
    matches!(c, '{'..='~' | '['..='`' | ' '..='&' | '('..='+' | ':'..='@' | '/')
}

fn is_digit(c: char) -> bool {
    c.is_ascii_digit()
}

fn is_period_or_comma(c: char) -> bool {
    c == '.' || c == ','
}

/// Python's `str.isspace`: Unicode White_Space plus the ASCII separators U+001C..U+001F.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.split()` without arguments.
fn python_split(s: &str) -> impl Iterator<Item = &str> {
    s.split(is_python_space).filter(|t| !t.is_empty())
}

/// Python's `str.rstrip()` without arguments.
fn python_rstrip(s: &str) -> &str {
    s.trim_end_matches(is_python_space)
}

/// The sufficient statistics of corpus BLEU: additive over sentences, so over ranks too (sum
/// `to_vector()` with an all-reduce, rebuild with `from_vector`, then `score`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BleuStats {
    /// Hypothesis n-grams found in the reference (clipped by the reference count), n = 1..4.
    pub matches: [u64; MAX_ORDER],
    /// Hypothesis n-grams, n = 1..4.
    pub totals: [u64; MAX_ORDER],
    /// Hypothesis tokens (after 13a tokenization).
    pub hyp_len: u64,
    /// Reference tokens.
    pub ref_len: u64,
}

impl std::ops::AddAssign for BleuStats {
    fn add_assign(&mut self, other: Self) {
        for n in 0..MAX_ORDER {
            self.matches[n] += other.matches[n];
            self.totals[n] += other.totals[n];
        }
        self.hyp_len += other.hyp_len;
        self.ref_len += other.ref_len;
    }
}

impl BleuStats {
    /// Length of `to_vector`.
    pub const VECTOR_LEN: usize = 2 * MAX_ORDER + 2;

    /// The statistics of one hypothesis against its reference (sacreBLEU: rstrip, 13a).
    pub fn sentence(hypothesis: &str, reference: &str) -> Self {
        let hyp = tokenize_13a(python_rstrip(hypothesis));
        let reference = tokenize_13a(python_rstrip(reference));
        let hyp_tokens: Vec<&str> = python_split(&hyp).collect();
        let ref_tokens: Vec<&str> = python_split(&reference).collect();
        let mut stats = Self {
            hyp_len: hyp_tokens.len() as u64,
            ref_len: ref_tokens.len() as u64,
            ..Self::default()
        };
        let ref_counts = ngram_counts(&ref_tokens);
        for (ngram, count) in ngram_counts(&hyp_tokens) {
            let n = ngram.len() - 1;
            stats.totals[n] += count;
            if let Some(&in_ref) = ref_counts.get(&ngram) {
                stats.matches[n] += count.min(in_ref);
            }
        }
        stats
    }

    /// `[matches 1..4, totals 1..4, hyp_len, ref_len]`.
    pub fn to_vector(&self) -> Vec<u64> {
        let mut v = self.matches.to_vec();
        v.extend(self.totals);
        v.extend([self.hyp_len, self.ref_len]);
        v
    }

    /// The inverse of `to_vector`; panics unless `v.len() == VECTOR_LEN`.
    pub fn from_vector(v: &[u64]) -> Self {
        assert_eq!(v.len(), Self::VECTOR_LEN, "BLEU statistics vector");
        let mut stats = Self::default();
        stats.matches.copy_from_slice(&v[..MAX_ORDER]);
        stats.totals.copy_from_slice(&v[MAX_ORDER..2 * MAX_ORDER]);
        stats.hyp_len = v[2 * MAX_ORDER];
        stats.ref_len = v[2 * MAX_ORDER + 1];
        stats
    }

    /// sacreBLEU's `BLEU.compute_bleu` with `smooth_method='exp'`, `effective_order=False`.
    pub fn score(&self) -> Bleu {
        let (sys_len, ref_len) = (self.hyp_len, self.ref_len);
        let brevity_penalty = if sys_len < ref_len {
            if sys_len > 0 {
                (1.0 - ref_len as f64 / sys_len as f64).exp()
            } else {
                0.0
            }
        } else {
            1.0
        };
        let mut bleu = Bleu {
            score: 0.0,
            precisions: [0.0; MAX_ORDER],
            brevity_penalty,
            hyp_len: sys_len as usize,
            ref_len: ref_len as usize,
        };
        if self.matches.iter().all(|&c| c == 0) {
            return bleu;
        }
        let mut smooth = 1.0;
        for n in 0..MAX_ORDER {
            if self.totals[n] == 0 {
                break;
            }
            bleu.precisions[n] = if self.matches[n] == 0 {
                smooth *= 2.0;
                100.0 / (smooth * self.totals[n] as f64)
            } else {
                100.0 * self.matches[n] as f64 / self.totals[n] as f64
            };
        }
        // sacreBLEU floors log(0) at -9999999999, which makes the score exactly 0.
        let log_sum: f64 = bleu
            .precisions
            .iter()
            .map(|&p| if p == 0.0 { -9_999_999_999.0 } else { p.ln() })
            .sum();
        // exp(ln 100) is 100.00000000000004 in floating point: a perfect score is 100, as
        // sacreBLEU prints it.
        bleu.score = (brevity_penalty * (log_sum / MAX_ORDER as f64).exp()).min(100.0);
        bleu
    }
}

fn ngram_counts<'t, 'a>(tokens: &'t [&'a str]) -> HashMap<&'t [&'a str], u64> {
    let mut counts = HashMap::new();
    for n in 1..=MAX_ORDER {
        for window in tokens.windows(n) {
            *counts.entry(window).or_insert(0) += 1;
        }
    }
    counts
}

/// Corpus BLEU of `hypotheses` against one reference each.
///
/// Like sacreBLEU, pairs are formed with `zip`: extra hypotheses or references are ignored
/// (a mismatch is logged, since it is a caller's bug).
pub fn corpus_bleu(hypotheses: &[String], references: &[String]) -> Bleu {
    if hypotheses.len() != references.len() {
        tracing::warn!(
            hypotheses = hypotheses.len(),
            references = references.len(),
            "BLEU over different numbers of hypotheses and references; extra lines ignored"
        );
    }
    let mut stats = BleuStats::default();
    for (hyp, reference) in hypotheses.iter().zip(references) {
        stats += BleuStats::sentence(hyp, reference);
    }
    stats.score()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Produced by `~/.cache/ferrotrain/venv-ref/bin/python scripts/reference/bleu_reference.py`
    // with sacrebleu 2.5.1 (signature nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1).
    // Pairs: (input, sacrebleu's Tokenizer13a()(input)).
    const TOKENIZE_13A: &[(&str, &str)] = &[
        ("Hello, world!", "Hello , world !"),
        (
            "It costs $1,000.50 (or 1.000,5 EUR).",
            "It costs $ 1,000.50 ( or 1.000,5 EUR ) .",
        ),
        (
            "Numbers: 3.14, 2,5 and 10-20 and x-ray and 5-year-old.",
            "Numbers : 3.14 , 2,5 and 10 - 20 and x-ray and 5 - year-old .",
        ),
        (
            "Ein 3-jähriges Kind, das \"Hallo\" sagt.",
            "Ein 3 - jähriges Kind , das \" Hallo \" sagt .",
        ),
        (
            "She said: 'don't' -- well...",
            "She said : 'don't' -- well . . .",
        ),
        ("A.B.C. and a.b, c;d", "A . B . C . and a . b , c ; d"),
        (
            "&quot;quoted&quot; &amp; &lt;tag&gt; &amp;lt;",
            "\" quoted \" & < tag > <",
        ),
        ("tabs\tand  double  spaces  ", "tabs and double spaces"),
        ("line-\nbreak and\nnewline", "linebreak and newline"),
        ("<skipped> text", "text"),
        (
            "Größe Übergröße straße, Äpfel.",
            "Größe Übergröße straße , Äpfel .",
        ),
        ("end with period.", "end with period ."),
        (
            "email@example.com / path\\to{x}[y]^_`~|",
            "email @ example . com / path \\ to { x } [ y ] ^ _ ` ~ |",
        ),
        ("1990s-era 1,000,000.5.", "1990s-era 1,000,000.5 ."),
        ("", ""),
        ("  ", ""),
        (".,.,", ". , . ,"),
        ("9.9.9,9,", "9.9.9,9 ,"),
        ("a-9 9-a 9--9", "a-9 9 - a 9 - -9"),
        (
            "«Anführungszeichen» „deutsch“ — dash – en",
            "«Anführungszeichen» „deutsch“ — dash – en",
        ),
        ("non\u{a0}breaking\u{2009}thin", "non breaking thin"),
    ];

    #[test]
    fn tokenize_13a_matches_sacrebleu() {
        for (input, expected) in TOKENIZE_13A {
            assert_eq!(tokenize_13a(input), *expected, "input {input:?}");
        }
    }

    fn corpus(name: &str) -> (Vec<String>, Vec<String>) {
        let (h, r): (&[&str], &[&str]) = match name {
            "perfect" => (
                &[
                    "The cat sat on the mat.",
                    "A man rides a bike down the street.",
                ],
                &[
                    "The cat sat on the mat.",
                    "A man rides a bike down the street.",
                ],
            ),
            "partial" => (
                &[
                    "The cat is on the mat.",
                    "A man is riding a bicycle on the street.",
                ],
                &[
                    "The cat sat on the mat.",
                    "A man rides a bike down the street.",
                ],
            ),
            "short_hypothesis_brevity" => (
                &["the cat sat", "a man rides a bike"],
                &[
                    "the cat sat on the mat today",
                    "a man rides a bike down the busy street",
                ],
            ),
            "no_fourgram_match_exp_smoothing" => (
                &["the cat the dog a bird the fish"],
                &["the cat and the dog and a bird and the fish"],
            ),
            "no_fourgrams_at_all" => (&["the cat", "a dog"], &["the cat sat", "a dog ran"]),
            "no_match" => (
                &["completely different words here"],
                &["nothing in common at all"],
            ),
            "empty_hypothesis" => (
                &["", "A man rides a bike down the street."],
                &[
                    "The cat sat on the mat.",
                    "A man rides a bike down the street.",
                ],
            ),
            "all_empty_hypotheses" => (
                &["", ""],
                &["The cat sat on the mat.", "A man rides a bike."],
            ),
            "punctuation_numbers" => (
                &[
                    "It costs $1,000.50, she said.",
                    "A 5-year-old boy (in red) jumps!",
                    "\"Hallo\", sagt der Mann.",
                    "Die Größe ist 3.5 m-groß.",
                ],
                &[
                    "It costs $1,000.50 , she said.",
                    "A 5 - year - old boy ( in red ) jumps !",
                    "\"Hallo\" , sagt der Mann .",
                    "Die Größe ist 3,5 m groß.",
                ],
            ),
            "multi30k_lines" => (
                &[
                    "Eine Gruppe Männer lädt Baumwolle auf einen Lastwagen",
                    "Ein Mann schläft auf einem Sofa in einem grünen Raum.",
                    "Ein Junge mit Kopfhörern sitzt auf den Schultern einer Frau.",
                    "Zwei Männer bauen eine Hütte auf einem See auf",
                    "Ein Mann mit Glatze, der eine rote Weste trägt, sitzt in einem Boot.",
                ],
                &[
                    "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen",
                    "Ein Mann schläft in einem grünen Raum auf einem Sofa.",
                    "Ein Junge mit Kopfhörern sitzt auf den Schultern einer Frau.",
                    "Zwei Männer bauen eine blaue Eisfischerhütte auf einem zugefrorenen See auf",
                    "Ein Mann mit beginnender Glatze, der eine rote Rettungsweste trägt, sitzt in einem kleinen Boot.",
                ],
            ),
            other => panic!("unknown corpus {other}"),
        };
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        (owned(h), owned(r))
    }

    type Expected = (&'static str, f64, [f64; 4], f64, usize, usize);

    // Same provenance as TOKENIZE_13A: (name, score, precisions, bp, sys_len, ref_len) of
    // `sacrebleu.metrics.BLEU().corpus_score(hyps, [refs])`.
    const CORPORA: &[Expected] = &[
        (
            "perfect",
            100.00000000000004,
            [100.0, 100.0, 100.0, 100.0],
            1.0,
            16,
            16,
        ),
        (
            "partial",
            28.83241900654793,
            [
                70.58823529411765,
                46.666666666666664,
                23.076923076923077,
                9.090909090909092,
            ],
            1.0,
            17,
            16,
        ),
        (
            "short_hypothesis_brevity",
            36.78794411714425,
            [100.0, 100.0, 100.0, 100.0],
            0.36787944117144233,
            8,
            16,
        ),
        (
            "no_fourgram_match_exp_smoothing",
            15.181939159382823,
            [100.0, 57.142857142857146, 8.333333333333334, 5.0],
            0.6872892787909722,
            8,
            11,
        ),
        (
            "no_fourgrams_at_all",
            0.0,
            [100.0, 100.0, 0.0, 0.0],
            0.6065306597126334,
            4,
            6,
        ),
        (
            "no_match",
            0.0,
            [0.0, 0.0, 0.0, 0.0],
            0.7788007830714049,
            4,
            5,
        ),
        (
            "empty_hypothesis",
            45.94258240359268,
            [100.0, 100.0, 100.0, 100.0],
            0.45942582403592663,
            9,
            16,
        ),
        (
            "all_empty_hypotheses",
            0.0,
            [0.0, 0.0, 0.0, 0.0],
            0.0,
            0,
            13,
        ),
        (
            "punctuation_numbers",
            71.74710904453877,
            [90.9090909090909, 82.75862068965517, 76.0, 66.66666666666667],
            0.9131007162822624,
            33,
            36,
        ),
        (
            "multi30k_lines",
            57.72037136538669,
            [94.54545454545455, 76.0, 55.55555555555556, 40.0],
            0.9131007162822624,
            55,
            60,
        ),
    ];

    fn assert_matches(bleu: &Bleu, expected: &Expected) {
        let (name, score, precisions, bp, hyp_len, ref_len) = *expected;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
        assert!(
            close(bleu.score, score),
            "{name}: score {} != {score}",
            bleu.score
        );
        for (n, (got, want)) in bleu.precisions.iter().zip(precisions).enumerate() {
            assert!(
                close(*got, want),
                "{name}: precision {} {got} != {want}",
                n + 1
            );
        }
        assert!(
            close(bleu.brevity_penalty, bp),
            "{name}: bp {} != {bp}",
            bleu.brevity_penalty
        );
        assert_eq!(
            (bleu.hyp_len, bleu.ref_len),
            (hyp_len, ref_len),
            "{name}: lengths"
        );
    }

    #[test]
    fn corpus_bleu_matches_sacrebleu() {
        for expected in CORPORA {
            let (hyps, refs) = corpus(expected.0);
            assert_matches(&corpus_bleu(&hyps, &refs), expected);
        }
    }

    /// The reference script's `perturb`: drop every 5th line, reverse every 3rd, cut the last
    /// word of every 2nd.
    fn perturb(i: usize, line: &str) -> String {
        let words: Vec<&str> = line.split(' ').collect();
        if i.is_multiple_of(5) {
            String::new()
        } else if i.is_multiple_of(3) {
            words.iter().rev().copied().collect::<Vec<_>>().join(" ")
        } else if i.is_multiple_of(2) {
            words[..words.len() - 1].join(" ")
        } else {
            line.to_string()
        }
    }

    #[test]
    fn multi30k_validation_set_matches_sacrebleu() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/data/multi30k/val.de.gz");
        if !path.exists() {
            eprintln!("SKIPPED: {} not found", path.display());
            return;
        }
        let refs = crate::data::read_lines(&path).unwrap();
        assert_eq!(refs.len(), 1014);
        let hyps: Vec<String> = refs
            .iter()
            .enumerate()
            .map(|(i, l)| perturb(i, l))
            .collect();
        let expected: Expected = (
            "multi30k_val_perturbed",
            52.62931432831749,
            [
                100.0,
                68.67565424266455,
                64.88273453093812,
                64.62669997224535,
            ],
            0.7184420265185802,
            9638,
            12825,
        );
        assert_matches(&corpus_bleu(&hyps, &refs), &expected);
    }

    #[test]
    fn display_reads_like_sacrebleu() {
        let (hyps, refs) = corpus("partial");
        let text = corpus_bleu(&hyps, &refs).to_string();
        assert_eq!(
            text,
            "BLEU = 28.83 70.6/46.7/23.1/9.1 (BP = 1.000 ratio = 1.062 hyp_len = 17 ref_len = 16)"
        );
    }

    #[test]
    fn trailing_whitespace_is_stripped_before_tokenizing() {
        // sacreBLEU rstrips each segment first, so a trailing "-\n" is not a line-break join.
        let a = corpus_bleu(&["well-\n".to_string()], &["well-".to_string()]);
        assert_eq!(a.score, 0.0); // one token each, no bigrams
        assert_eq!((a.hyp_len, a.ref_len), (1, 1));
        assert_eq!(a.precisions[0], 100.0);
    }
    #[test]
    fn statistics_add_up_across_shards_like_the_whole_corpus() {
        let (hyps, refs) = corpus("multi30k_lines");
        let whole = corpus_bleu(&hyps, &refs);
        // Two "ranks" score halves, sum their vectors, score the sum.
        let half = |range: std::ops::Range<usize>| {
            let mut stats = BleuStats::default();
            for i in range {
                stats += BleuStats::sentence(&hyps[i], &refs[i]);
            }
            stats.to_vector()
        };
        let (a, b) = (half(0..2), half(2..5));
        let summed: Vec<u64> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(summed.len(), BleuStats::VECTOR_LEN);
        assert_eq!(BleuStats::from_vector(&summed).score(), whole);
        let one = BleuStats::sentence("Ein Mann , ein Mann .", "Ein Mann .");
        assert_eq!(one.matches, [3, 2, 0, 0]); // sacrebleu: [6, 3, 3, 2, 0, 0, 6, 5, 4, 3]
        assert_eq!(one.totals, [6, 5, 4, 3]);
        assert_eq!((one.hyp_len, one.ref_len), (6, 3));
    }

    #[test]
    fn a_perfect_translation_scores_exactly_100() {
        let text = vec!["a man rides a red bicycle down the street".to_string()];
        let b = corpus_bleu(&text, &text);
        assert_eq!(b.score, 100.0);
        assert_eq!(format!("{}", b.score), "100");
    }
}
