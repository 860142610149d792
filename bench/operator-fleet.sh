#!/usr/bin/env bash
# The operator at fleet scale on hollow nodes (issue 43): N simulated GPU nodes on the live
# cluster's real API server and scheduler (e2e/src/hollow: a kubelet simulator after kwok's
# stages), running and suspended jobs, two operators on this machine (a leader and a
# standby, release build, each with a ServiceAccount of its own so that the API server counts
# their requests). Measures the operator's RSS and CPU per running job, apply -> pods for a
# burst of jobs, API writes per running job per minute and the API server's request rate, a
# drain's replacement pods per second and time to step again, the same when nodes report
# NotReady at once (the operator's own force-deletes and creates), leader failover, isolation from
# a job whose /progress hangs and one whose pods admission refuses, and the simulator's own
# cost. Prints a Markdown table (docs/performance.md keeps the results).
#
#   bench/operator-fleet.sh [--nodes 1000] [--running-jobs 500] [--pods-per-job 8]
#                           [--suspended-jobs 1000] [--latency-jobs 100] [--drain-nodes 100]
#                           [--lost-nodes 100] [--window-seconds 60] [--renew-seconds 10] [--operator-flag=--x=y]
#   FLEET_BINARIES=DIR bench/operator-fleet.sh ...   (DIR's binaries, no build)
#
# Needs the cluster with the CRD and the chart's RBAC (scripts/e2e.sh --setup-only). The
# installed operator (Deployment ferrotrain in ferrotrain-system) would act on the bench's
# jobs too: it is scaled to 0 for the run and back afterwards, whatever happens. On this
# project's machines the cluster is shared: hold its lock for the run,
#   flock /tmp/ferrotrain-cluster.lock bench/operator-fleet.sh
# Everything the bench creates (a namespace, its nodes, ServiceAccounts, roles, FlowSchemas,
# an admission policy) is deleted at the end. Minutes at the defaults on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${KUBECONFIG:-}" && -f /var/lib/ferrotrain-cluster/kubeconfig ]]; then
  export KUBECONFIG=/var/lib/ferrotrain-cluster/kubeconfig
fi
[[ -n "${KUBECONFIG:-}" ]] || { echo "operator-fleet.sh: set KUBECONFIG (or run scripts/e2e.sh --setup-only)" >&2; exit 2; }
KUBECTL="${KUBECTL:-$HOME/.cache/ferrotrain-cluster/bin/kubectl}"
[[ -x "$KUBECTL" ]] || KUBECTL=kubectl

# Release builds: the operator as its image ships it, and the simulator's cost at its least.
# (--bin, not -p: the workspace's feature unification, so the dependencies are built once.)
# FLEET_BINARIES=DIR runs the three binaries in DIR as they are (a build kept for a before /
# after comparison) instead.
if [[ -n "${FLEET_BINARIES:-}" ]]; then
  BIN="$FLEET_BINARIES"
else
  nice -n 5 cargo build --quiet --release --bin ferrotrain-operator --bin operator-fleet --bin hollow-nodes
  BIN="${CARGO_TARGET_DIR:-$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')}/release"
fi
for b in ferrotrain-operator operator-fleet hollow-nodes; do
  [[ -x "$BIN/$b" ]] || { echo "operator-fleet.sh: no $BIN/$b" >&2; exit 2; }
done
echo "operator-fleet: cluster $("$KUBECTL" version -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])' 2>/dev/null || echo '?'), commit $(git rev-parse --short HEAD), $(nproc) cores" >&2

# The installed operator steps aside for the run.
replicas=$("$KUBECTL" -n ferrotrain-system get deployment ferrotrain -o jsonpath='{.spec.replicas}' 2>/dev/null || true)
restore() {
  if [[ -n "$replicas" && "$replicas" != 0 ]]; then
    "$KUBECTL" -n ferrotrain-system scale deployment ferrotrain --replicas="$replicas" >/dev/null || true
    echo "operator-fleet: the installed operator is back at $replicas replicas" >&2
  fi
}
trap restore EXIT
trap 'exit 130' INT TERM
if [[ -n "$replicas" && "$replicas" != 0 ]]; then
  "$KUBECTL" -n ferrotrain-system scale deployment ferrotrain --replicas=0 >/dev/null
  "$KUBECTL" -n ferrotrain-system wait --for=delete pod -l app.kubernetes.io/name=ferrotrain-operator --timeout=120s >/dev/null 2>&1 || true
fi
"$BIN/operator-fleet" "$@"
