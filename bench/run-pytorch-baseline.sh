#!/usr/bin/env bash
# Tokens/s of the Multi30k recipe in PyTorch eager vs ferrotrain, same machine, same BPE, the
# same model (the sizes in CONFIG's model: section on both sides).
#   bench/run-pytorch-baseline.sh [--config CONFIG] [--steps N] [--threads T]
# CONFIG defaults to examples/multi30k.yaml; the other options go to pytorch_transformer.py.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
config=examples/multi30k.yaml
if [[ "${1:-}" == --config ]]; then config="$2"; shift 2; fi
. bench/torch-venv.sh
cargo build -p ferrotrain-trainer
runs=runs/bench-baseline
rm -rf "$runs"
mkdir -p "$(dirname "$runs")"   # a fresh clone has no runs/
# bf16 is only fast on CPUs with bf16 matrix units (AMX-BF16, AVX512-BF16); elsewhere it is
# emulated, and slower than fp32 (docs/performance.md).
units=$(grep -ow -e amx_bf16 -e avx512_bf16 /proc/cpuinfo 2>/dev/null | sort -u | tr '\n' ' ' || true)
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | xargs); bf16 units: ${units:-none (bf16 is emulated here)}"
# ferrotrain: 70 steps of the Multi30k recipe in fp32, bf16 and auto (the first run learns
# and saves the BPE that every other run reuses); auto says what it picked and why.
declare -A ours theirs
for precision in fp32 bf16 auto; do
  sed -e 's/^maxSteps: .*/maxSteps: 70/' -e 's/^maxSeconds: .*//' -e 's/^logEverySteps: .*/logEverySteps: 70/' \
      -e 's/horizon: time/horizon: steps/' -e "s/^precision: .*/precision: $precision/" \
      -e 's/everySteps: 1000/everySteps: 0/' -e 's/bleu: true/bleu: false/' "$config" > "$runs-$precision.yaml"
  [[ -f "$runs/fp32/tokenizer.json" ]] && mkdir -p "$runs/$precision" && cp "$runs/fp32/tokenizer.json" "$runs/$precision/"
  log=$(ferrotrain run --config "$runs-$precision.yaml" --checkpoint-dir "$runs" --job "$precision" 2>&1)
  used=$(grep -o 'precision: [a-z0-9]* (.*)' <<<"$log" | head -1)
  line=$(grep "step 70/" <<<"$log" | sed 's/.*step 70/step 70/')
  echo "ferrotrain precision=$precision: $line; $used"
  ours[$precision]=$(grep -o '[0-9]* tok/s' <<<"$line" | cut -d' ' -f1)
  [[ $precision == auto ]] && ours[auto_used]=$(awk '{print $2}' <<<"$used")
done
for flag in "" --bf16; do
  p=$([[ -n $flag ]] && echo bf16 || echo fp32)
  line=$("$venv/bin/python" bench/pytorch_transformer.py --config "$config" --tokenizer "$runs/fp32/tokenizer.json" $flag "$@")
  echo "PyTorch eager precision=$p: $line"
  theirs[$p]=$(grep -o '[0-9]* tokens/s' <<<"$line" | cut -d' ' -f1)
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }'; }
echo "ratio ferrotrain/PyTorch eager (tokens/s): fp32 $(ratio "${ours[fp32]}" "${theirs[fp32]}")," \
  "bf16 $(ratio "${ours[bf16]}" "${theirs[bf16]}")," \
  "auto (${ours[auto_used]:-?}) $(ratio "${ours[auto]}" "${theirs[${ours[auto_used]:-fp32}]:-0}")"
