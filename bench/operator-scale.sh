#!/usr/bin/env bash
# The operator at scale on a live cluster: apply -> pods created (p50/p99 over 50 jobs), API
# writes per running job per minute (the API server's own counters, by the operator's
# ServiceAccount), the operator's RSS, CPU and reconciles per minute with 100 and 1,000 jobs.
# Prints a Markdown table (docs/performance-history.md keeps the results).
#
#   bench/operator-scale.sh [--latency-jobs 50] [--running-jobs 4] [--window-seconds 120]
#                           [--idle-jobs 100,1000]
#
# Needs the operator installed on the cluster $KUBECONFIG names. On this project's machines:
# scripts/e2e.sh --setup-only sets up ../shared/cluster (binaries, images, chart) without
# running a test, then this script uses it. Takes 10-15 minutes with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${KUBECONFIG:-}" && -f /var/lib/ferrotrain-cluster/kubeconfig ]]; then
  export KUBECONFIG=/var/lib/ferrotrain-cluster/kubeconfig
fi
[[ -n "${KUBECONFIG:-}" ]] || { echo "operator-scale.sh: set KUBECONFIG (or run scripts/e2e.sh first)" >&2; exit 2; }
. scripts/env.sh
if [[ -f /var/lib/ferrotrain-cluster/run/ferrotrain-e2e-tag && -z "${FERROTRAIN_E2E_IMAGE:-}" ]]; then
  FERROTRAIN_E2E_IMAGE="ferrotrain/trainer:$(cat /var/lib/ferrotrain-cluster/run/ferrotrain-e2e-tag)"
  export FERROTRAIN_E2E_IMAGE
fi
echo "operator-scale: cluster $(kubectl version -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])' 2>/dev/null || echo '?'), commit $(git rev-parse --short HEAD), $(nproc) cores"
# The harness is a client: the dev profile measures the operator as well and builds in
# minutes (a release build of the e2e crate takes ~25 minutes on 2 cores).
cargo run --quiet -p ferrotrain-e2e --bin operator-scale -- "$@"
