#!/usr/bin/env bash
# The whole test suite: formatting, lints, generated-file drift, Helm chart, every Rust test
# (unit, cross-process, mocked Kubernetes API). Installs what it needs (libtorch, helm) into
# ~/.cache/ferrotrain on first use. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

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
cargo nextest run --workspace --no-fail-fast --profile ci
