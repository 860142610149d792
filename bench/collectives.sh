#!/usr/bin/env bash
# All-reduce of float32 buffers between ranks on this machine: ferrotrain's TCP ring (the CPU
# backend training uses) against torch.distributed's gloo, same sizes, same number of ranks;
# with --cuda, ferrotrain's NCCL path and torch's NCCL instead (one GPU per rank).
#   bench/collectives.sh [--world N] [--sizes-mb 4,16,40,100,400] [--iters 10] [--cuda]
# Prints one table: median seconds per all-reduce, bus bandwidth, and ring/gloo time ratio.
# The target (issue 13): the ring at <= 0.8x gloo's time from 40 MB up.
set -euo pipefail
cd "$(dirname "$0")/.."
world=2 sizes=4,16,40,100,400 iters=10 device=cpu
while [[ $# -gt 0 ]]; do
  case "$1" in
    --world) world="$2"; shift 2 ;;
    --sizes-mb) sizes="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --cuda) device=cuda; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
. scripts/env.sh
venv="${FERROTRAIN_CACHE:-$HOME/.cache/ferrotrain}/venv-torch"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.11.0 tokenizers
fi
bin="${FERROTRAIN_BIN:-}"
if [[ -z "$bin" ]]; then
  cargo build --release -p ferrotrain-trainer $([[ $device == cuda ]] && echo --features cuda) >&2
  bin=target/release/ferrotrain
fi
out=$(mktemp -d)
trap 'rm -rf "$out"; kill $(jobs -p) 2>/dev/null || true' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
threads=$(( $(nproc) / world )); (( threads > 0 )) || threads=1
pids=()
for ((r = 0; r < world; r++)); do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$world LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port FERROTRAIN_RDZV_TOKEN=$token OMP_NUM_THREADS=$threads \
    timeout 900 "$bin" bench-collective --device "$device" --sizes-mb "$sizes" --iters "$iters" \
    > "$out/ferrotrain-$r.jsonl" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
backend=gloo; [[ $device == cuda ]] && backend=nccl
timeout 900 "$venv/bin/python" bench/collectives_torch.py --backend "$backend" --world "$world" \
  --sizes-mb "$sizes" --iters "$iters" > "$out/torch.jsonl"
python3 - "$out/ferrotrain-0.jsonl" "$out/torch.jsonl" <<'PY'
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
theirs = {r["bytes"]: r for r in (json.loads(l) for l in open(sys.argv[2]) if l.strip())}
b0 = ours[0]["backend"]; b1 = next(iter(theirs.values()))["backend"]
print(f"all-reduce, {ours[0]['world']} ranks, float32: ferrotrain {b0} vs torch.distributed {b1} (median of timed runs)")
print(f"{'MB':>7} {b0+' ms':>10} {b1+' ms':>10} {b0+' busbw GB/s':>17} {b1+' busbw GB/s':>17} {'time ratio':>11}")
for r in ours:
    t = theirs[r["bytes"]]
    print(f"{r['bytes']/1e6:7.0f} {1e3*r['seconds']:10.2f} {1e3*t['seconds']:10.2f} "
          f"{r['busbw_gbps']:17.3f} {t['busbw_gbps']:17.3f} {r['seconds']/t['seconds']:11.2f}")
PY
