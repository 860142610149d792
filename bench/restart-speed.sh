#!/usr/bin/env bash
# How fast the gang trains again after a failure, and how many steps it trains twice:
#   - locally (`ferrotrain launch`): kill -9 of rank 1's process, in place on two launchers vs
#     the single-node group restart (KILLS times each);
#   - on a cluster (when $KUBECONFIG or ../shared/cluster is up with the operator installed, as
#     scripts/e2e.sh leaves it): every kind of failure that leaves a rank alive (kill -9 of
#     rank 0's and rank 1's trainer, rank 1's launcher killed, rank 1's pod deleted and
#     evicted, node 0's pod deleted), KILLS of each, in a 2-pod job of examples/copy-dt.yaml as
#     shipped, at its model size and at the Multi30k recipe's (e2e/src/bin/restart-speed.rs).
#   bench/restart-speed.sh [KILLS] [example|multi30k ...]
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
