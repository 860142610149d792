#!/usr/bin/env bash
# Creates a kind cluster, builds and loads the operator and trainer images, installs the Helm
# chart, and runs the end-to-end tests (e2e/tests/*.rs, package ferrotrain-e2e) against it.
#   e2e/kind.sh            # create (or reuse) the cluster, test, keep the cluster
#   KEEP=0 e2e/kind.sh     # delete the cluster afterwards
# Needs docker and kind on PATH; helm and kubectl come from scripts/setup-helm.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER="${CLUSTER:-ferrotrain-e2e}"
# A new tag for every run: with pullPolicy Never a reused tag would test the images an earlier
# run loaded into the nodes.
TAG="${TAG:-e2e-$(git rev-parse --short HEAD 2>/dev/null || echo nogit)-$(date +%Y%m%d%H%M%S)-$RANDOM}"
KEEP="${KEEP:-1}"
NAMESPACE="${NAMESPACE:-ferrotrain-system}"

for tool in docker kind; do
  command -v "$tool" >/dev/null || { echo "kind.sh: $tool is required" >&2; exit 1; }
done
HELM="$(scripts/setup-helm.sh | tail -n1)"
KUBECTL="$(dirname "$HELM")/kubectl"

if ! kind get clusters | grep -qx "$CLUSTER"; then
  # Two workers: a gang of 2 spreads over nodes like a real one.
  kind create cluster --name "$CLUSTER" --wait 120s --config - <<'KIND'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
  - role: worker
KIND
fi
export KUBECONFIG="${KUBECONFIG_OUT:-$(mktemp)}"
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG"
cleanup() {
  if [[ "$KEEP" == 0 ]]; then kind delete cluster --name "$CLUSTER"; fi
}
trap cleanup EXIT

echo "==> building images (tag $TAG; docs/images.md)"
scripts/images.sh --tag "$TAG" --only trainer,operator
kind load docker-image --name "$CLUSTER" "ferrotrain/operator:$TAG" "ferrotrain/trainer:$TAG"
# The S3 server of tests/store.rs: a test fixture tagged with its version, built once.
S3_VERSION=$(. docker/versions.env && echo "$S3S_FS_VERSION")
S3_IMAGE="ferrotrain/s3-e2e:$S3_VERSION"
docker image inspect "$S3_IMAGE" >/dev/null 2>&1 \
  || scripts/images.sh --tag "$S3_VERSION" --only s3-e2e
kind load docker-image --name "$CLUSTER" "$S3_IMAGE"

echo "==> installing the chart"
"$HELM" upgrade --install ferrotrain charts/ferrotrain \
  --namespace "$NAMESPACE" --create-namespace \
  --set image.repository=ferrotrain/operator --set image.tag="$TAG" \
  --set image.pullPolicy=Never \
  --set trainerImage.repository=ferrotrain/trainer --set trainerImage.tag="$TAG" \
  --set log.filter='info,ferrotrain_operator=debug' \
  --wait --timeout 5m
"$KUBECTL" -n "$NAMESPACE" rollout status deployment/ferrotrain --timeout=5m

echo "==> end-to-end tests"
status=0
FERROTRAIN_E2E_IMAGE="ferrotrain/trainer:$TAG" FERROTRAIN_E2E_S3_IMAGE="$S3_IMAGE" \
  cargo test -p ferrotrain-e2e -- --ignored --test-threads 2 || status=$?
if [[ $status != 0 ]]; then
  echo "==> operator logs (tests failed)"
  "$KUBECTL" -n "$NAMESPACE" logs deployment/ferrotrain --tail=300 || true
fi
exit $status
