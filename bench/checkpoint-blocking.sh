#!/usr/bin/env bash
# What a checkpoint save costs a training step: a 72 MB state (the Multi30k recipe's size: 6 M
# parameters and AdamW's two moments) saved 20 times, each while a step's forward and
# backward run (0.4 s of matmuls reading the weights), then the update, which waits for the
# save to have copied the state out. Prints, per save, the seconds the step was blocked (the
# save call plus the update's wait) and their share of the step (docs/checkpoint-saves.md#measured-cost-of-a-save keeps
# the numbers; the goal is well under 1%).
#
#   bench/checkpoint-blocking.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d), $(nproc) cores"
CKPT_MEASURE_DIR="$dir" cargo test --release -q -p ferrotrain-trainer --lib \
  checkpoint::store::tests::measure_save_blocking_in_a_step -- --ignored --nocapture 2>&1 \
  | grep -E "^saves? "
