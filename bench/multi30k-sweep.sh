#!/usr/bin/env bash
# A sweep over Multi30k recipe settings that reads the validation set only: each setting
# trains examples/multi30k.yaml changed by sed expressions for its budget, then
# `ferrotrain select` picks its best checkpoint or average by val BLEU (beam 4). Prints one
# line per setting: val BLEU, the choice, steps. The test set is never touched here; score
# the winner once with bench/multi30k-bleu.sh.
#
#   bench/multi30k-sweep.sh SETTINGS_FILE [MINUTES]
#
# SETTINGS_FILE: one setting a line, `name<TAB>sed expressions` (`;`-separated), e.g.
#   base	s/^x//
#   drop0.2	s/^  dropout: .*/  dropout: 0.2/
#   ls0.2	s/^labelSmoothing: .*/labelSmoothing: 0.2/
# MINUTES (default 30) replaces maxSeconds.
set -euo pipefail
cd "$(dirname "$0")/.."
# The run owns the machine: idle OpenMP threads spin instead of sleeping (22-24% faster steps
# than PASSIVE, which scripts/env.sh sets for tests; docs/performance.md). Yours wins if set.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-ACTIVE}" # env.sh keeps a value already set
. scripts/env.sh
settings="${1:?usage: bench/multi30k-sweep.sh SETTINGS_FILE [MINUTES]}"
minutes="${2:-30}"
data="${MULTI30K:-../shared/data/multi30k}"
runs="${RUNS:-runs/sweep}"
cargo build -p ferrotrain-trainer
mkdir -p "$runs"
while IFS=$'\t' read -r name expr; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  job="$name-$(date +%Y%m%d-%H%M%S)"
  sed -e "$expr" -e "s/^maxSeconds: .*/maxSeconds: $(( minutes * 60 ))/" examples/multi30k.yaml > "$runs/$job.yaml"
  ferrotrain run --config "$runs/$job.yaml" --checkpoint-dir "$runs" --job "$job" 2> "$runs/$job.log"
  steps=$(grep -o '"step":[0-9]*' "$runs/$job/train-log.jsonl" | tail -n1 | cut -d: -f2)
  chosen=$(ferrotrain select --job "$runs/$job" --source "$data/val.en.gz" \
    --reference "$data/val.de.gz" --beam 4 | tail -n1)
  echo "$name: steps=$steps $chosen"
done < "$settings"
