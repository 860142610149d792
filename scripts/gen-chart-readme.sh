#!/usr/bin/env bash
# Rewrites the values table of charts/ferrotrain/README.md from values.yaml (each value's
# default and the comment above it) and values.schema.json (its type). The generator is the
# drift test itself (operator/tests/chart_values.rs), run here with FERROTRAIN_REGENERATE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
FERROTRAIN_REGENERATE=1 cargo test -q -p ferrotrain-operator --test chart_values -- \
  the_values_table_of_the_chart_readme_is_generated_from_values_yaml
