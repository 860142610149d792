#!/usr/bin/env bash
# The whole test suite: formatting, lints, generated-file drift, Helm chart, every Rust test
# (unit, cross-process, mocked Kubernetes API), the alert rules (promtool), then the container
# images built and run (scripts/test-images.sh). Installs what it needs (libtorch, torch for Python, helm;
# docker.io, debootstrap and prometheus's promtool as root on Debian) on first use. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
# Torch for Python, laid out for the CPU from the wheel setup-libtorch.sh caches: the launcher's
# Python tests (launch/tests/launch_python.rs: torchrun's environment and loss curve, the
# example's recovery) skip without it.
FERROTRAIN_PYTORCH="$(scripts/setup-pytorch.sh | tail -n1)"
export FERROTRAIN_PYTORCH
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# A CI run builds once from a clean clone: incremental caches would only cost disk (GBs).
if [[ -n "${CI:-}" ]]; then export CARGO_INCREMENTAL=0; fi

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings

# clippy checks every target with the feature (the binary included); the library's tests link
# it. A separate `cargo build --features cuda` of the binary was one more build that checked nothing
# more (cudarc loads the CUDA libraries at run time: nothing to link).
step "cargo clippy and unit tests --features cuda (the NCCL path compiles and its GPU-free tests run)"
cargo clippy -p ferrotrain-trainer --features cuda --all-targets -- -D warnings
cargo nextest run -p ferrotrain-trainer --features cuda --lib --profile ci -E 'test(/nccl|watchdog|distributed::/)'

if [[ -x scripts/setup-helm.sh ]]; then
  step "helm"
  HELM_BIN="$(scripts/setup-helm.sh | tail -n1)"
  export HELM_BIN
fi

# The alert rules the chart installs: promtool checks them and runs their unit tests; the
# self-test runs those tests on rules with a threshold moved, which must fail (exit 1).
step "Prometheus alerts: promtool check rules, promtool test rules (scripts/check-alerts.sh)"
scripts/check-alerts.sh
step "Prometheus alerts self-test (scripts/check-alerts.sh --self-test must exit 1)"
rc=0; scripts/check-alerts.sh --self-test >/dev/null || rc=$?
[[ $rc == 1 ]] || { echo "FAILED: scripts/check-alerts.sh --self-test exited $rc, not 1" >&2; exit 1; }

# Each phase that runs tests has a limit of its own, well past its usual time, so that a run
# that hangs somewhere fails with its log before CI's own limit ends it without one (a stop
# whose CI timed out left nothing on record to learn from). Without a terminal (CI) `timeout`
# signals the phase's whole process group; on a terminal it keeps the phase in the
# foreground (nextest reads keys there) and signals the phase's own process.
phase() {
  local minutes="$1" name="$2"; shift 2
  local rc=0 foreground=()
  [[ -t 0 ]] && foreground=(--foreground)
  timeout "${foreground[@]}" --kill-after=60 "${minutes}m" "$@" || rc=$?
  if [[ $rc == 124 || $rc == 137 ]]; then
    echo "FAILED: $name did not finish within $minutes minutes (its usual time is a fraction)" >&2
  fi
  return "$rc"
}

step "tests (cargo nextest)"
tests_status=0
# Usually 3-5 minutes once built; the build itself, on a clean clone, about 20.
phase 45 "cargo nextest" cargo nextest run --workspace --no-fail-fast --profile ci \
  || tests_status=$?

# A release of the workspace's version, every step but the images and the push (the tests just
# built the plugin it packages): the chart renders from its package, the plugin archive holds
# what its krew manifest names, with the archive's sha256 (docs/install.md, "Releases").
step "release dry run (scripts/release.sh VERSION --dry-run)"
version=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' Cargo.toml)
scripts/release.sh "$version" --dry-run

# Third-party checks of what the operator creates (docs/security.md), run with the
# ferrotrain-operator binary the tests just built (no earlier step builds it: clippy builds no
# binaries): checkov on the chart and on the operator's objects for the example jobs, and
# network-config-analyzer on what the jobs' NetworkPolicies mean. Each self-test proves its
# check can fail: it must exit 1 (2 means the check itself is broken).
step "security scan: checkov (scripts/scan.sh)"
scripts/scan.sh
step "security scan self-test (scripts/scan.sh --self-test must exit 1)"
rc=0; scripts/scan.sh --self-test >/dev/null || rc=$?
[[ $rc == 1 ]] || { echo "FAILED: scripts/scan.sh --self-test exited $rc, not 1" >&2; exit 1; }
step "NetworkPolicy semantics: network-config-analyzer (scripts/netpol-check.sh)"
scripts/netpol-check.sh
step "NetworkPolicy semantics self-test (scripts/netpol-check.sh --self-test must exit 1)"
rc=0; scripts/netpol-check.sh --self-test >/dev/null || rc=$?
[[ $rc == 1 ]] || { echo "FAILED: scripts/netpol-check.sh --self-test exited $rc, not 1" >&2; exit 1; }

# The real images, built from the binaries the tests just built, and tested with real
# containers (docs/images.md). They run even when a Rust test failed, so CI shows both.
step "container images (scripts/test-images.sh)"
images_started=$SECONDS
images_status=0
FERROTRAIN_IMAGE_CARGO=0 scripts/test-images.sh || images_status=$?
echo "container images: $((SECONDS - images_started)) s (exit $images_status)"

# The end-to-end suite on a real cluster (scripts/e2e.sh, ../shared/cluster), where its
# binaries are cached on this machine; it says plainly when it skips. With the dev profile the
# images and the tests reuse what the unit tests just built.
step "end-to-end tests on ../shared/cluster (scripts/e2e.sh)"
e2e_started=$SECONDS
e2e_status=0
if [[ "${FERROTRAIN_E2E:-auto}" == 0 ]]; then
  echo "SKIPPED: FERROTRAIN_E2E=0"
elif [[ $(id -u) != 0 || ! -d ../shared/cluster ]]; then
  echo "SKIPPED: the e2e suite needs root and ../shared/cluster"
else
  # Usually 18-20 minutes (images about 1, tests about 16).
  phase 40 "the end-to-end suite" env FERROTRAIN_E2E_PREBUILT=1 \
    scripts/e2e.sh --profile dev --skip-if-no-cluster --down || e2e_status=$?
fi
echo "end-to-end tests: $((SECONDS - e2e_started)) s (exit $e2e_status)"

echo "disk: target/ holds $(du -sh target 2>/dev/null | cut -f1); $(df -h . | awk 'NR==2 {print $4}') free"

if [[ $tests_status != 0 || $images_status != 0 || $e2e_status != 0 ]]; then
  echo "FAILED: cargo nextest exit $tests_status, image tests exit $images_status, e2e exit $e2e_status" >&2
  exit 1
fi
