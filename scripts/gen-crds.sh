#!/usr/bin/env bash
# Regenerates the DistributedTraining CRD from the Rust types (api/src/crd/) into crds/ and
# the Helm chart. The operator's tests fail when the committed files drift from the types.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cargo run --quiet -p ferrotrain-operator -- crd > "$out"
install -m 0644 "$out" crds/distributedtrainings.yaml
mkdir -p charts/ferrotrain/crds
install -m 0644 "$out" charts/ferrotrain/crds/distributedtrainings.yaml
echo "wrote crds/distributedtrainings.yaml and charts/ferrotrain/crds/distributedtrainings.yaml"
