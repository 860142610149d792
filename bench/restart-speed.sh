#!/usr/bin/env bash
# How fast the gang trains again after a failure, and how many steps it trains twice, in the
# shapes users run (one pod of several ranks, several pods of one or several ranks):
#   - locally (`ferrotrain launch`): kill -9 of a rank's process KILLS times, one launcher of
#     two ranks, two launchers of one and of two ranks, in place, with spare trainers and
#     without (bench/restart_speed_local.py);
#   - on a cluster (when $KUBECONFIG or ../shared/cluster is up with the operator installed, as
#     scripts/e2e.sh leaves it): every kind of failure (kill -9 of a trainer of each local
#     rank, SIGSTOP of one, a launcher killed, a pod deleted or evicted, node 0's pod deleted),
#     KILLS of each, in jobs of examples/copy-dt.yaml as shipped but for their shape: 2x1, 1x2,
#     2x2, 3x1 (e2e/src/bin/restart-speed.rs; 2x1-multi30k: the Multi30k recipe's model size).
#   bench/restart-speed.sh [KILLS] [2x1|1x2|2x2|3x1|2x1-multi30k ...]
set -euo pipefail
cd "$(dirname "$0")/.."
KILLS="${1:-10}"
shift || true
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
  cargo run --quiet --bin restart-speed -- "$KILLS" "$@"
else
  echo "restart-speed: no cluster with the operator (scripts/e2e.sh sets one up): local numbers only"
fi
