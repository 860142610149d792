#!/usr/bin/env bash
# The Multi30k bar: train examples/multi30k.yaml for its 30-minute budget on this machine (one
# rank, or N local ranks with --ranks N), choose the checkpoint or average on the validation
# set only (`ferrotrain select`, beam 4), then translate test_2016_flickr once with that
# choice, greedily and with beam 4, and score with ferrotrain's sacreBLEU-compatible BLEU.
# Prints steps, tokens/s, the validation choice and BLEU, and test BLEU. Not a test: it takes
# ~40 minutes.
#
# Then, unless --no-baseline, the same model and batch in PyTorch eager against ferrotrain
# (bench/run-pytorch-baseline.sh: tokens/s and the ratios, ~5 minutes more).
#
#   bench/multi30k-bleu.sh [--ranks N] [--no-baseline] [config]   (default 1 rank, examples/multi30k.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
# The run owns the machine: idle OpenMP threads spin instead of sleeping (22-24% faster steps
# than PASSIVE, which scripts/env.sh sets for tests; docs/performance.md). Yours wins if set.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-ACTIVE}" # env.sh keeps a value already set
. scripts/env.sh
ranks=1
baseline=1
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --no-baseline) baseline=0; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
config="${1:-examples/multi30k.yaml}"
data="${MULTI30K:-../shared/data/multi30k}"
runs="${RUNS:-runs/bench}"
job="multi30k-${ranks}r-$(date +%Y%m%d-%H%M%S)"

cargo build -p ferrotrain-trainer
mkdir -p "$runs"
start=$(date +%s)
if [[ "$ranks" == 1 ]]; then
  ferrotrain run --config "$config" --checkpoint-dir "$runs" --job "$job" 2> "$runs/$job.log"
else
  FERROTRAIN_CHECKPOINT_DIR="$runs" FERROTRAIN_JOB="$job" \
    ferrotrain launch --config "$config" --nproc-per-node "$ranks" --master-port 0 2> "$runs/$job.log"
fi
end=$(date +%s)

job_dir="$runs/$job"
steps=$(grep -o '"step":[0-9]*' "$job_dir/train-log.jsonl" | tail -n1 | cut -d: -f2)
toks=$(grep -o '[0-9]* tok/s' "$runs/$job.log" | tail -n1)
echo "multi30k: ranks=$ranks steps=$steps train_minutes=$(( (end - start) / 60 )) last $toks; $(grep -o 'precision: [a-z0-9]* (.*)' "$runs/$job.log" | head -1)"

# The choice, on val only.
chosen=$(ferrotrain select --job "$job_dir" --source "$data/val.en.gz" --reference "$data/val.de.gz" --beam 4)
sed 's/^/  val: /' <<<"$chosen"
# The test set, once, with that choice.
declare -A test_bleu
for beam in 1 4; do
  zcat "$data/test_2016_flickr.en.gz" \
    | ferrotrain translate --checkpoint "$job_dir" --selected --beam "$beam" > "$job_dir/test.beam$beam.de"
  score=$(ferrotrain bleu --reference "$data/test_2016_flickr.de.gz" < "$job_dir/test.beam$beam.de")
  echo "multi30k test_2016_flickr (selected on val): ranks=$ranks steps=$steps beam=$beam $score"
  test_bleu[$beam]=$(awk '{print $3}' <<<"$score")
done
# A row for docs/performance-history.md ("Chosen on validation data").
choice=$(tail -n1 <<<"$chosen" | sed -e 's/^selected: //' -e 's/; written to.*//')
echo "| $(git rev-parse --short HEAD) | $(basename "$config") | $ranks | $steps | ${toks% tok/s} | $choice | ${test_bleu[1]} | ${test_bleu[4]} |"
# Throughput against PyTorch eager, same model and batch, in the same run.
if [[ "$baseline" == 1 ]]; then
  bash bench/run-pytorch-baseline.sh --config "$config"
fi
