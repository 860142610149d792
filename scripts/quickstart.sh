#!/usr/bin/env bash
# Sets everything up and runs the default job: the copy task on two local ranks exchanging
# gradients over the TCP ring. Half-way, one rank is killed with SIGKILL to show the launcher
# restarting the gang from the latest checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh

echo "==> building ferrotrain"
cargo build -p ferrotrain-trainer

export FERROTRAIN_JOB=quickstart
export FERROTRAIN_CHECKPOINT_DIR="${FERROTRAIN_CHECKPOINT_DIR:-runs}"
job_dir="$FERROTRAIN_CHECKPOINT_DIR/$FERROTRAIN_JOB"
rm -rf "$job_dir"

echo "==> ferrotrain launch --nproc-per-node 2 --config examples/copy.yaml"
ferrotrain launch --nproc-per-node 2 --max-restarts 3 --config examples/copy.yaml &
launcher=$!
trap 'kill $launcher 2>/dev/null || true' EXIT

# Wait (at most 10 minutes) for the first checkpoints, then kill rank 1.
killed=no
for _ in $(seq 1 600); do
  if ! kill -0 "$launcher" 2>/dev/null; then break; fi
  if [[ $killed == no ]] && compgen -G "$job_dir/step-00000300" >/dev/null; then
    victim=$(pgrep -P "$launcher" -f "ferrotrain run" | tail -n1 || true)
    if [[ -n "$victim" ]]; then
      echo "==> demo: kill -9 of rank process $victim at step ~300; the gang restarts from the latest checkpoint"
      kill -9 "$victim"
      killed=yes
    fi
  fi
  sleep 1
done
status=0
wait "$launcher" || status=$?
trap - EXIT
echo "==> finished with exit code $status; checkpoints in $job_dir:"
ls "$job_dir"
exit "$status"
