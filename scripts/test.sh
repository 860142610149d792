#!/usr/bin/env bash
# The whole test suite: formatting, lints, generated-file drift, Helm chart, every Rust test
# (unit, cross-process, mocked Kubernetes API), then the container images built and run
# (scripts/test-images.sh). Installs what it needs (libtorch, helm; docker.io and debootstrap
# as root on Debian) on first use. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# A CI run builds once from a clean clone: incremental caches would only cost disk (GBs).
if [[ -n "${CI:-}" ]]; then export CARGO_INCREMENTAL=0; fi

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo build --features cuda (the NCCL path compiles without a GPU)"
cargo build -p ferrotrain-trainer --features cuda

if [[ -x scripts/setup-helm.sh ]]; then
  step "helm"
  HELM_BIN="$(scripts/setup-helm.sh | tail -n1)"
  export HELM_BIN
fi

step "tests (cargo nextest)"
tests_status=0
cargo nextest run --workspace --no-fail-fast --profile ci || tests_status=$?

# The real images, built from the binaries the tests just built, and tested with real
# containers (docs/images.md). They run even when a Rust test failed, so CI shows both.
step "container images (scripts/test-images.sh)"
images_started=$SECONDS
images_status=0
FERROTRAIN_IMAGE_CARGO=0 scripts/test-images.sh || images_status=$?
echo "container images: $((SECONDS - images_started)) s (exit $images_status)"

echo "disk: target/ holds $(du -sh target 2>/dev/null | cut -f1); $(df -h . | awk 'NR==2 {print $4}') free"

if [[ $tests_status != 0 || $images_status != 0 ]]; then
  echo "FAILED: cargo nextest exit $tests_status, image tests exit $images_status" >&2
  exit 1
fi
