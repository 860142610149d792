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
mkdir -p "$(dirname "$runs")"   # a fresh clone has no runs/
# bf16 is only fast on CPUs with bf16 matrix units (AMX-BF16, AVX512-BF16); elsewhere it is
# emulated, and slower than fp32 (docs/performance.md).
units=$(grep -ow -e amx_bf16 -e avx512_bf16 /proc/cpuinfo 2>/dev/null | sort -u | tr '\n' ' ' || true)
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | xargs); bf16 units: ${units:-none (bf16 is emulated here)}"
# ferrotrain: 70 steps of the Multi30k recipe in fp32 and in bf16 (the first run learns and
# saves the BPE that every other run reuses).
for precision in fp32 bf16; do
  sed -e 's/^maxSteps: .*/maxSteps: 70/' -e 's/^maxSeconds: .*//' -e 's/^logEverySteps: .*/logEverySteps: 70/' \
      -e 's/horizon: time/horizon: steps/' -e "s/^precision: .*/precision: $precision/" \
      -e 's/everySteps: 1000/everySteps: 0/' -e 's/bleu: true/bleu: false/' examples/multi30k.yaml > "$runs-$precision.yaml"
  [[ -f "$runs/fp32/tokenizer.json" ]] && mkdir -p "$runs/$precision" && cp "$runs/fp32/tokenizer.json" "$runs/$precision/"
  echo -n "ferrotrain precision=$precision: "
  ferrotrain run --config "$runs-$precision.yaml" --checkpoint-dir "$runs" --job "$precision" 2>&1 \
    | grep "step 70/" | sed 's/.*step 70/step 70/'
done
for flag in "" --bf16; do
  echo -n "PyTorch eager precision=$([[ -n $flag ]] && echo bf16 || echo fp32): "
  "$venv/bin/python" bench/pytorch_transformer.py --tokenizer "$runs/fp32/tokenizer.json" $flag "$@"
done
