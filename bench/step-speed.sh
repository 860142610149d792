#!/usr/bin/env bash
# Seconds per step and tokens/s at a given point of a run: copies the newest checkpoint of a
# job (with its tokenizer and config), trains N more steps with evaluation and checkpoints
# off, and prints the average of all but the first 5. Every run of the same checkpoint sees
# the same batches, so two binaries or settings compare fairly; interleave them, because
# a shared machine's speed drifts.
#
#   bench/step-speed.sh JOB_DIR [STEPS] [BINARY]      (default 60 steps, target/debug/ferrotrain)
#   e.g. bench/step-speed.sh runs/bench/multi30k-20261122-041007
#
# RANKS=N runs N ranks under `ferrotrain launch` (one thread each when the config says
# `threads: 0`) and also prints the share of a step spent waiting for the gradient exchange.
# MAX_TOKENS=N overrides batch.maxTokens (per rank: 2 ranks at 1000 see the batches 1 rank
# at 2000 sees; binaries before the change to per-rank maxTokens took it per gang).
set -euo pipefail
cd "$(dirname "$0")/.."
# The run owns the machine: idle OpenMP threads spin instead of sleeping (22-24% faster steps
# than PASSIVE, which scripts/env.sh sets for tests; docs/performance.md). Yours wins if set.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-ACTIVE}" # env.sh keeps a value already set
. scripts/env.sh
job="${1:?usage: bench/step-speed.sh JOB_DIR [STEPS] [BINARY]}"
steps="${2:-60}"
binary="${3:-target/debug/ferrotrain}"
last=$(ls -d "$job"/step-* | sort | tail -n1)
from=$((10#$(basename "$last" | cut -d- -f2)))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/job"
cp -r "$last" "$work/job/"
cp "$job/tokenizer.json" "$work/job/" 2>/dev/null || true
sed -e "s/^maxSteps: .*/maxSteps: $((from + steps))/" -e 's/^maxSeconds: .*//' \
    -e 's/^  horizon: time/  horizon: steps/' -e 's/^  everySteps: .*/  everySteps: 0/' \
    -e 's/^  bleu: true/  bleu: false/' "$job/config.yaml" > "$work/job.yaml"
if [ -n "${MAX_TOKENS:-}" ]; then
  sed -i "s/^  maxTokens: .*/  maxTokens: $MAX_TOKENS/" "$work/job.yaml"
fi
ranks="${RANKS:-1}"
if [ "$ranks" -gt 1 ]; then
  "$binary" launch --config "$work/job.yaml" --nproc-per-node "$ranks" --master-port 0 \
    --max-restarts 0 -- --checkpoint-dir "$work" --job job > "$work/log" 2>&1 \
    || { cat "$work/log"; exit 1; }
else
  "$binary" run --config "$work/job.yaml" --checkpoint-dir "$work" --job job > "$work/log" 2>&1 \
    || { cat "$work/log"; exit 1; }
fi
python3 - "$work/job/train-log.jsonl" "$from" <<'PY'
import json, sys
path, start = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(path)]
rows = [r for r in rows if "loss" in r and r.get("step", 0) > start + 5]
secs = sum(r["seconds"] for r in rows)
toks = sum(r["tokens"] for r in rows)
comm = sum(r.get("commSeconds", 0.0) for r in rows)
print(f"from step {start}: {len(rows)} steps, {secs / len(rows):.3f} s/step, "
      f"{toks / secs:.0f} tokens/s, exchange wait {comm / len(rows) * 1000:.1f} ms/step")
PY
