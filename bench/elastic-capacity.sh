#!/usr/bin/env bash
# An elastic job and the cluster's free capacity, timed on ../shared/cluster: the e2e test
# e2e/tests/capacity.rs (a 2-pod job, minReplicas 1, that starts on the node that fits, grows
# when the workload holding the other finishes, and is preempted and grows back) with N
# preemption cycles. Prints each time and p50 / max: from capacity freeing up (the holding
# pod's exit) to rank 0's first step at the larger world size, and from a preemption (the
# victim marked for deletion) to its pod's end and to rank 0's first step without it.
# docs/performance.md keeps the numbers.
#
#   bench/elastic-capacity.sh [N]     (default 10; uses the images of the last scripts/e2e.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
cycles="${1:-10}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d), $(nproc) cores, ../shared/cluster, $cycles cycles"
FERROTRAIN_E2E_CYCLES="$cycles" scripts/e2e.sh --no-images --filter 'binary(capacity)' >"$log" 2>&1 \
  || { tail -n 40 "$log" >&2; echo "elastic-capacity: the test failed (above)" >&2; exit 1; }
# The test's lines (nextest prints a passing test's output once more at the end: once here).
grep -E "^ +(created|blocker|cycle|round|seconds by|growth)" "$log" | awk '!seen[$0]++' || true
python3 - "$log" <<'PY'
import re, statistics, sys
text = open(sys.argv[1]).read()
def series(label):
    m = re.search(re.escape(label) + r" \(s\): \[([^\]]*)\]", text)
    return [float(x) for x in m.group(1).split(",")] if m else []
for label, what in [("capacity freed -> first step on it", "node freed -> training on it"),
                    ("new launcher up -> first step on it", "of it ours: the new pod's launcher up -> training on it"),
                    ("preempted -> pod gone", "preemption -> pod gone"),
                    ("preempted -> first step at the smaller size", "preemption -> training at the smaller size")]:
    xs = [x for x in series(label) if x == x]  # NaN: a breakdown not found in the logs
    if xs:
        print(f"{what}: p50 {statistics.median(xs):.2f} s, max {max(xs):.2f} s over {len(xs)}")
PY
