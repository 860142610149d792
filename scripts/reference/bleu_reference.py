#!/usr/bin/env python3
"""Reference numbers for trainer/src/bleu.rs, computed with the real sacreBLEU.

    python3 -m venv ~/.cache/ferrotrain/venv-ref
    ~/.cache/ferrotrain/venv-ref/bin/pip install sacrebleu==2.5.1
    ~/.cache/ferrotrain/venv-ref/bin/python scripts/reference/bleu_reference.py [MULTI30K_DIR]

Prints Rust table rows that the tests in trainer/src/bleu.rs hard-code: the 13a tokenization
of tricky strings, and corpus BLEU (default settings: 13a, cased, exp smoothing) of small
corpora and of the whole Multi30k validation set against a deterministic perturbation of it
(the Rust test recomputes the same perturbation, see `perturb` there).
"""
import gzip
import json
import os
import sys

import sacrebleu
from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

TOKENIZE = [
    "Hello, world!",
    "It costs $1,000.50 (or 1.000,5 EUR).",
    "Numbers: 3.14, 2,5 and 10-20 and x-ray and 5-year-old.",
    "Ein 3-jähriges Kind, das \"Hallo\" sagt.",
    "She said: 'don't' -- well...",
    "A.B.C. and a.b, c;d",
    "&quot;quoted&quot; &amp; &lt;tag&gt; &amp;lt;",
    "tabs\tand  double  spaces  ",
    "line-\nbreak and\nnewline",
    "<skipped> text",
    "Größe Übergröße straße, Äpfel.",
    "end with period.",
    "email@example.com / path\\to{x}[y]^_`~|",
    "1990s-era 1,000,000.5.",
    "",
    "  ",
    ".,.,",
    "9.9.9,9,",
    "a-9 9-a 9--9",
    "«Anführungszeichen» „deutsch“ — dash – en",
    "non\u00a0breaking\u2009thin",
]

# Named corpora: (hypotheses, references).
CORPORA = {
    "perfect": (
        ["The cat sat on the mat.", "A man rides a bike down the street."],
        ["The cat sat on the mat.", "A man rides a bike down the street."],
    ),
    "partial": (
        ["The cat is on the mat.", "A man is riding a bicycle on the street."],
        ["The cat sat on the mat.", "A man rides a bike down the street."],
    ),
    "short_hypothesis_brevity": (
        ["the cat sat", "a man rides a bike"],
        ["the cat sat on the mat today", "a man rides a bike down the busy street"],
    ),
    "no_fourgram_match_exp_smoothing": (
        ["the cat the dog a bird the fish"],
        ["the cat and the dog and a bird and the fish"],
    ),
    "no_fourgrams_at_all": (
        ["the cat", "a dog"],
        ["the cat sat", "a dog ran"],
    ),
    "no_match": (
        ["completely different words here"],
        ["nothing in common at all"],
    ),
    "empty_hypothesis": (
        ["", "A man rides a bike down the street."],
        ["The cat sat on the mat.", "A man rides a bike down the street."],
    ),
    "all_empty_hypotheses": (
        ["", ""],
        ["The cat sat on the mat.", "A man rides a bike."],
    ),
    "punctuation_numbers": (
        [
            "It costs $1,000.50, she said.",
            "A 5-year-old boy (in red) jumps!",
            "\"Hallo\", sagt der Mann.",
            "Die Größe ist 3.5 m-groß.",
        ],
        [
            "It costs $1,000.50 , she said.",
            "A 5 - year - old boy ( in red ) jumps !",
            "\"Hallo\" , sagt der Mann .",
            "Die Größe ist 3,5 m groß.",
        ],
    ),
    "multi30k_lines": (
        [
            "Eine Gruppe Männer lädt Baumwolle auf einen Lastwagen",
            "Ein Mann schläft auf einem Sofa in einem grünen Raum.",
            "Ein Junge mit Kopfhörern sitzt auf den Schultern einer Frau.",
            "Zwei Männer bauen eine Hütte auf einem See auf",
            "Ein Mann mit Glatze, der eine rote Weste trägt, sitzt in einem Boot.",
        ],
        [
            "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen",
            "Ein Mann schläft in einem grünen Raum auf einem Sofa.",
            "Ein Junge mit Kopfhörern sitzt auf den Schultern einer Frau.",
            "Zwei Männer bauen eine blaue Eisfischerhütte auf einem zugefrorenen See auf",
            "Ein Mann mit beginnender Glatze, der eine rote Rettungsweste trägt, sitzt in einem kleinen Boot.",
        ],
    ),
}


def perturb(i, line):
    """Deterministic damage to reference line i (mirrored in bleu.rs)."""
    words = line.split(" ")
    if i % 5 == 0:
        return ""
    if i % 3 == 0:
        return " ".join(reversed(words))
    if i % 2 == 0:
        return " ".join(words[:-1])
    return line


def rust_str(s):
    return json.dumps(s, ensure_ascii=False)


def bleu_row(name, hyps, refs):
    s = BLEU().corpus_score(hyps, [refs])
    p = ", ".join(repr(float(x)) for x in s.precisions)
    return f"    ({rust_str(name)}, {float(s.score)!r}, [{p}], {float(s.bp)!r}, {s.sys_len}, {s.ref_len}),"


def main():
    m = BLEU()
    m.corpus_score(["a"], [["a"]])
    print(f"// sacrebleu {sacrebleu.__version__}: {m.get_signature()}")
    tok = Tokenizer13a()
    print("// TOKENIZE_13A: (input, sacrebleu Tokenizer13a output)")
    for line in TOKENIZE:
        print(f"    ({rust_str(line)}, {rust_str(tok(line))}),")
    print("// CORPORA: (name, score, precisions, bp, sys_len, ref_len)")
    for name, (hyps, refs) in CORPORA.items():
        print(bleu_row(name, hyps, refs))
    data = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "..", "..", "shared", "data", "multi30k")
    with gzip.open(os.path.join(data, "val.de.gz"), "rt", encoding="utf-8") as f:
        refs = [l.rstrip("\n").rstrip("\r") for l in f]
    hyps = [perturb(i, l) for i, l in enumerate(refs)]
    print("// Multi30k val.de against perturb(val.de)")
    print(bleu_row("multi30k_val_perturbed", hyps, refs))


if __name__ == "__main__":
    main()
