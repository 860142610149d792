#!/usr/bin/env bash
# Tokens/s of the issue-2 recipe in PyTorch eager vs ferrotrain, same machine, same BPE.
#   bench/run-pytorch-baseline.sh [--steps N] [--threads T]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
venv="${FERROTRAIN_CACHE:-$HOME/.cache/ferrotrain}/venv-torch"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch, tokenizers" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.11.0 tokenizers
fi
cargo build -p ferrotrain-trainer
runs=runs/bench-baseline
rm -rf "$runs"
# ferrotrain: 70 steps of the same config (learns and saves the BPE the PyTorch run reuses).
sed -e 's/^maxSteps: .*/maxSteps: 70/' -e 's/^maxSeconds: .*//' -e 's/^logEverySteps: .*/logEverySteps: 70/' \
    -e 's/everySteps: 1000/everySteps: 0/' -e 's/bleu: true/bleu: false/' examples/multi30k.yaml > "$runs.yaml"
ferrotrain run --config "$runs.yaml" --checkpoint-dir "$runs" --job ferrotrain 2>&1 | grep "step 70/"
"$venv/bin/python" bench/pytorch_transformer.py --tokenizer "$runs/ferrotrain/tokenizer.json" "$@"
