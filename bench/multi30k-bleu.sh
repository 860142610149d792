#!/usr/bin/env bash
# The issue-2 bar: train examples/multi30k.yaml for its 30-minute budget on this machine,
# then translate test_2016_flickr greedily and with beam 4 and score both with ferrotrain's
# sacreBLEU-compatible BLEU. Prints steps, minutes and BLEU. Not a test: it takes ~35 minutes.
#
#   bench/multi30k-bleu.sh [config]        (default examples/multi30k.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
config="${1:-examples/multi30k.yaml}"
data="${MULTI30K:-../shared/data/multi30k}"
runs="${RUNS:-runs/bench}"
job="multi30k-$(date +%Y%m%d-%H%M%S)"

cargo build -p ferrotrain-trainer
start=$(date +%s)
ferrotrain run --config "$config" --checkpoint-dir "$runs" --job "$job"
end=$(date +%s)

job_dir="$runs/$job"
steps=$(tail -n 200 "$job_dir/train-log.jsonl" | grep -o '"step":[0-9]*' | tail -n1 | cut -d: -f2)
for beam in 1 4; do
  zcat "$data/test_2016_flickr.en.gz" \
    | ferrotrain translate --checkpoint "$job_dir" --beam "$beam" > "$job_dir/test.beam$beam.de"
  score=$(ferrotrain bleu --reference "$data/test_2016_flickr.de.gz" < "$job_dir/test.beam$beam.de")
  echo "multi30k test_2016_flickr: steps=$steps train_minutes=$(( (end - start) / 60 )) beam=$beam $score"
done
