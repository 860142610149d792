#!/usr/bin/env bash
# How fast a killed trainer is training again: kill -9 of rank 1's process, 5 times, and the
# time from each kill to the next completed step, median and max:
#   - locally (`ferrotrain launch`): in place on two launchers vs the single-node group restart;
#   - on a cluster (when $KUBECONFIG or ../shared/cluster is up with the operator installed, as
#     scripts/e2e.sh leaves it): a 2-pod copy job with in-place restarts vs whole-gang restarts.
#   bench/restart-speed.sh [KILLS]
set -euo pipefail
cd "$(dirname "$0")/.."
KILLS="${1:-5}"
. scripts/env.sh
cargo build --quiet --release -p ferrotrain-trainer
echo "restart-speed: commit $(git rev-parse --short HEAD), $(nproc) cores, $KILLS kills each"
python3 bench/restart_speed_local.py target/release/ferrotrain "$KILLS"
if [[ -z "${KUBECONFIG:-}" && -f /var/lib/ferrotrain-cluster/kubeconfig ]]; then
  export KUBECONFIG=/var/lib/ferrotrain-cluster/kubeconfig
fi
if [[ -n "${KUBECONFIG:-}" ]] && kubectl get deployment -n ferrotrain-system ferrotrain >/dev/null 2>&1; then
  tag_file=/var/lib/ferrotrain-cluster/run/ferrotrain-e2e-tag
  if [[ -z "${FERROTRAIN_E2E_IMAGE:-}" && -f $tag_file ]]; then
    export FERROTRAIN_E2E_IMAGE="ferrotrain/trainer:$(cat "$tag_file")"
  fi
  cargo run --quiet -p ferrotrain-e2e --bin restart-speed -- "$KILLS"
else
  echo "restart-speed: no cluster with the operator (scripts/e2e.sh sets one up): local numbers only"
fi
