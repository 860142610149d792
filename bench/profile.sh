#!/usr/bin/env bash
# Where one training step's time goes, ferrotrain against PyTorch eager, on this machine: the
# Multi30k recipe (or CONFIG), same model, batches of at most 2000 padded tokens per side,
# fp32 and bf16. Prints, per precision, the mean milliseconds of each phase (data, forward,
# output projection + loss, backward, optimizer, other) on both sides, each side's matmul
# FLOP/s as a fraction of what this machine's GEMMs do at the recipe's shapes, and the CPU
# time by kind (GEMM, attention, other ATen kernels, allocator, kernel, OpenMP, Rust,
# Python) from `perf record` (attached after the warm-up steps). Also writes
# torch.profiler's ops tables. Results, logs and perf data: runs/bench-profile/ (or --out).
#   bench/profile.sh [--config CONFIG] [--binary BIN] [--out DIR] [--steps 70] [--precisions fp32,bf16] [--no-perf]
# BIN: another ferrotrain build to profile (an older commit's, for a before/after); default
# this checkout's dev build. DIR: where results go (default runs/bench-profile).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
config=examples/multi30k.yaml
if [[ "${1:-}" == --config ]]; then config="$2"; shift 2; fi
. bench/torch-venv.sh
command -v perf >/dev/null || { echo "perf not found (apt-get install linux-perf), or pass --no-perf" >&2; exit 1; }
cargo build -p ferrotrain-trainer
runs=runs/bench-profile
for ((i = 1; i <= $#; i++)); do
  if [[ ${!i} == --out ]]; then j=$((i + 1)); runs=${!j}; fi
done
rm -rf "$runs"
mkdir -p "$runs"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores;" \
  "bf16 units: $(grep -ow -e amx_bf16 -e avx512_bf16 /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet -- trainer bench || echo ' (with local changes)')"
# The configs of bench/run-pytorch-baseline.sh: no evaluation, no checkpoints.
for precision in fp32 bf16; do
  sed -e 's/^maxSteps: .*/maxSteps: 70/' -e 's/^maxSeconds: .*//' -e 's/^logEverySteps: .*/logEverySteps: 70/' \
      -e 's/horizon: time/horizon: steps/' -e "s/^precision: .*/precision: $precision/" \
      -e 's/everySteps: 1000/everySteps: 0/' -e 's/bleu: true/bleu: false/' "$config" > "$runs/$precision.yaml"
done
steps=70
binary=$(command -v ferrotrain)
args=()
while (($#)); do
  case "$1" in
    --steps) steps="$2"; args+=(--steps "$2"); shift 2 ;;
    --binary) binary=$(realpath "$2"); shift 2 ;;
    --out) shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
sed -i "s/^maxSteps: .*/maxSteps: $steps/" "$runs"/fp32.yaml "$runs"/bf16.yaml
# One BPE for both sides: learned by a short ferrotrain run unless the baseline's is there.
tokenizer=runs/bench-baseline/fp32/tokenizer.json
if [[ ! -f $tokenizer ]]; then
  sed -e 's/^maxSteps: .*/maxSteps: 1/' "$runs/fp32.yaml" > "$runs/bpe.yaml"
  ferrotrain run --config "$runs/bpe.yaml" --checkpoint-dir "$runs" --job bpe >/dev/null 2>&1
  tokenizer=$runs/bpe/tokenizer.json
fi
echo "binary $binary"
"$venv/bin/python" bench/step_profile.py --ferrotrain "$binary" --runs "$runs" \
  --tokenizer "$tokenizer" --config "$config" "${args[@]}"
