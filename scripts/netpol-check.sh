#!/usr/bin/env bash
# What the jobs' NetworkPolicies mean, checked by a third-party analyzer: the operator binary
# renders the jobs of scripts/netpol/jobs.yaml (alpha, beta with metricsFrom, gamma with
# restrictEgress, delta with restrictEgress and a checkpoint store behind a Service) into the
# policies and pods it would create, network-config-analyzer computes who reaches whom on
# which ports over the fixture of scripts/netpol/cluster.yaml (the operator, strangers,
# another namespace, a Prometheus, the store's namespace), and scripts/netpol/check.py
# compares every pair, port by port, with the table in docs/security-checks.md.
#
#   scripts/netpol-check.sh               the check: prints the table
#   scripts/netpol-check.sh --self-test   alpha's policy broken three ways and delta's one on
#                                         purpose; each must be caught (the check exits 1)
#
# Exit status: 0 the policies mean what they should; 1 a pair does not (in --self-test: the
# expected outcome); 2 the check itself failed (no operator binary, install, render, nca, or in
# --self-test a broken policy that went unnoticed).
# Needs target/debug/ferrotrain-operator (cargo build -p ferrotrain-operator; or set
# FERROTRAIN_OPERATOR_BIN). network-config-analyzer (pinned below) is installed from PyPI into
# a venv in the cache beside checkov's (scripts/scan.sh), once.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/python-tool.sh

NCA_VERSION=2.1.0
CACHE_ROOT="${FERROTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrotrain}"
VENV="$CACHE_ROOT/nca"
OPERATOR="${FERROTRAIN_OPERATOR_BIN:-target/debug/ferrotrain-operator}"
# The labels and namespace the Helm chart gives the operator's pods (release "ferrotrain",
# installed as the README says).
OPERATOR_PODS=(--pod-labels app.kubernetes.io/name=ferrotrain-operator,app.kubernetes.io/instance=ferrotrain
  --pod-namespace ferrotrain-system)

die() { echo "netpol-check: $*" >&2; exit 2; }

self_test=()
for arg in "$@"; do
  case "$arg" in
    --self-test) self_test=(--self-test) ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $arg (see --help)" ;;
  esac
done
started=$SECONDS

[[ -x "$OPERATOR" ]] || die "$OPERATOR is missing: cargo build -p ferrotrain-operator (or set FERROTRAIN_OPERATOR_BIN)"

# --- network-config-analyzer, in its own venv ----------------------------------------------
ensure_python_tool "$VENV" network-config-analyzer "$NCA_VERSION" || die "cannot install network-config-analyzer"

work=$(mktemp -d "${TMPDIR:-/tmp}/ferrotrain-netpol.XXXXXX")
trap 'rm -rf "$work"' EXIT

# --- the operator's objects for the fixture's jobs -----------------------------------------
render() {
  RUST_BACKTRACE=0 "$OPERATOR" render -f scripts/netpol/jobs.yaml "$@" 2> "$work/render.log" \
    || { cat "$work/render.log" >&2; die "ferrotrain-operator render failed"; }
}
render "${OPERATOR_PODS[@]}" > "$work/rendered.yaml"
render > "$work/rendered-open.yaml"

echo "netpol-check: $("$VENV/bin/nca" --version | tr -d '\n'), operator $OPERATOR" >&2
rc=0
"$VENV/bin/python" -B scripts/netpol/check.py "$VENV/bin/nca" "$work" scripts/netpol/cluster.yaml \
  "$work/rendered.yaml" "$work/rendered-open.yaml" "${self_test[@]}" || rc=$?
echo "netpol-check: $((SECONDS - started)) s in all (exit $rc)" >&2
exit $rc
