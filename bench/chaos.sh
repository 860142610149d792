#!/usr/bin/env bash
# The chaos soak, long version (e2e/tests/chaos.rs is the short one in the e2e suite): in each
# job shape (2 pods x 1 rank, 2 x 2 and 1 x 2 fixed, 3 x 1 elastic with minReplicas 2), the copy
# job of examples/copy-dt.yaml under a seeded schedule of real faults: kill -9 and SIGSTOP of
# trainers (any rank, any local rank), a launcher killed from the host, pods deleted, evicted
# through the Eviction API and by their own kubelet (200 MiB into /tmp against a 100Mi
# ephemeral-storage limit), a pod cut off (iptables in its network namespace, its node's
# kubelet stopped), the operator's pod deleted, the kit's API server down 10-20 s, its DNS
# server down while a pod is replaced; two pairs per shape overlapping. Each job must Succeed
# with its ledger telling every fault right, no step trained twice beyond the one in flight
# (but where a checkpoint is read), its final checkpoint kept and, fixed, the very bytes of the
# same job run without faults (also run). Prints the report (Markdown): faults by kind, the
# time from each to the next step (p50, max), steps trained twice, goodput, seed and commit;
# then every fault. Exits 1 on any finding (listed in the report).
#
#   bench/chaos.sh [--seed N] [--faults N] [--shapes 2x1,2x2,1x2,3x1] [--kinds K,...]
#                  [--overlaps N] [--no-reference]
#
# Needs root on the machine of ../shared/cluster (its processes, its pods' network namespaces)
# with the operator installed (scripts/e2e.sh --setup-only), and the cluster to itself: it
# stops the kit's API server and DNS server. About 60-80 minutes with the defaults (64 faults).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${KUBECONFIG:-}" && -f /var/lib/ferrotrain-cluster/kubeconfig ]]; then
  export KUBECONFIG=/var/lib/ferrotrain-cluster/kubeconfig
fi
[[ -n "${KUBECONFIG:-}" ]] || { echo "chaos.sh: set KUBECONFIG (or run scripts/e2e.sh --setup-only first)" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "chaos.sh: needs root (the kit's processes and pods' network namespaces)" >&2; exit 2; }
. scripts/env.sh
tag_file=/var/lib/ferrotrain-cluster/run/ferrotrain-e2e-tag
if [[ -z "${FERROTRAIN_E2E_IMAGE:-}" && -f $tag_file ]]; then
  FERROTRAIN_E2E_IMAGE="ferrotrain/trainer:$(cat "$tag_file")"
  export FERROTRAIN_E2E_IMAGE
fi
if command -v kubectl >/dev/null && [[ -n "$(kubectl get dt -A --no-headers 2>/dev/null)" ]]; then
  echo "chaos.sh: other jobs run on the cluster (kubectl get dt -A); the soak stops its API server and DNS" >&2
fi
echo "chaos: $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD), $(nproc) cores"
# The harness is a client: the dev profile builds in a minute.
cargo run --quiet -p ferrotrain-e2e --bin chaos -- "$@"
