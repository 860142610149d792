#!/usr/bin/env bash
# ferrotrain's Prometheus alerts (charts/ferrotrain/files/prometheus-rules.yaml, which the chart
# installs as a PrometheusRule): `promtool check rules` (syntax, PromQL, templates) and
# `promtool test rules` on charts/ferrotrain/tests/prometheus-rules.test.yaml (each alert fires
# for the series made to trip it and not for the healthy ones). promtool is Debian's
# `prometheus` package, installed as root with apt when missing (scripts/test.sh).
#
#   scripts/check-alerts.sh [--self-test]
#
# --self-test runs the unit tests against the rules with the goodput alert's threshold moved
# (80% -> 50%), and must fail (exit 1): the tests bite.
set -euo pipefail
cd "$(dirname "$0")/.."

RULES=charts/ferrotrain/files/prometheus-rules.yaml
TESTS=charts/ferrotrain/tests/prometheus-rules.test.yaml

if ! command -v promtool >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "installing promtool (Debian's prometheus package)" >&2
    if ! { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 \
        apt-get install -y -qq --no-install-recommends prometheus; } >/tmp/ferrotrain-apt-prometheus.log 2>&1; then
      tail -n 20 /tmp/ferrotrain-apt-prometheus.log >&2
      echo "check-alerts: apt-get install prometheus failed" >&2
      exit 2
    fi
  else
    echo "check-alerts: promtool is missing (apt-get install prometheus, as root)" >&2
    exit 2
  fi
fi

if [[ "${1:-}" == --self-test ]]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/files" "$work/tests"
  sed 's/ferrotrain_operator_job_goodput_percent < 80/ferrotrain_operator_job_goodput_percent < 50/' \
    "$RULES" > "$work/files/prometheus-rules.yaml"
  cmp -s "$RULES" "$work/files/prometheus-rules.yaml" && { echo "self-test: nothing changed" >&2; exit 2; }
  cp "$TESTS" "$work/tests/"
  if promtool test rules "$work/tests/$(basename "$TESTS")"; then
    echo "self-test: the alert tests passed on broken rules" >&2
    exit 0
  fi
  exit 1
fi

promtool check rules "$RULES"
promtool test rules "$TESTS"
