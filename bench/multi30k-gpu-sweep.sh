#!/usr/bin/env bash
# A Multi30k recipe sweep on one GPU, several runs at once, chosen on val only. Each setting
# (the format of bench/multi30k-sweep.sh: `name<TAB>sed expressions`) at each seed trains
# examples/multi30k.yaml for a fixed number of steps (default 4,000: what the recipe's 30
# minutes buy on the 2-core CPU VM, so the GPU's minute stands for the CPU's half hour), then
# `ferrotrain select` chooses a checkpoint or average on val twice, with beam 4 and greedily,
# and test_2016_flickr is translated once with each choice (for the record: choose by the
# val columns). Steps are fixed, not time, so a setting that makes a CPU step slower must be
# timed on the CPU as well (bench/multi30k-sweep.sh).
#
#   bench/multi30k-gpu-sweep.sh --bin BIN --python PY --settings FILE [--data DIR]
#       [--out DIR] [--seeds "1 2 3"] [--steps 4000] [--jobs 6] [--device cuda|cpu]
#       [--limit SECONDS]
#
# BIN and PY as for bench/gpu-validate.sh (a CUDA build of the trainer; a Python whose torch
# wheel brings the CUDA libraries). --jobs runs that many trainings at once on the one GPU
# (a 2,000-token step leaves an H200 mostly idle), each with 2 CPU threads. --device cpu
# rehearses the script with a CPU build (use a small --steps). Writes OUT/results.tsv (one
# line a run) and prints it, then one summary line a setting: the mean over its seeds.
set -uo pipefail
cd "$(dirname "$0")/.."
bin="" py="" settings="" data=../shared/data/multi30k out="" seeds="1 2 3" steps=4000 jobs=6
device=cuda limit=300
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --python) py="$2"; shift 2 ;;
    --settings) settings="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --limit) limit="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x "$bin" && -x "$py" && -f "$settings" ]] || {
  echo "usage: $0 --bin BIN --python PY --settings FILE [--data DIR] [--out DIR] [--seeds LIST] [--steps N] [--jobs N]" >&2
  exit 2
}
bin=$(realpath "$bin") data=$(realpath "$data") out=${out:-$(mktemp -d)}
mkdir -p "$out"
export OMP_WAIT_POLICY=PASSIVE RUST_LOG=info
# The torch wheel's libraries and every nvidia-* wheel's, for the dynamic loader.
LD_LIBRARY_PATH=$("$py" bench/torch_libs.py)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH

# `name val-BLEU` of a selection file.
chosen() { "$py" -c 'import json, sys; d = json.load(open(sys.argv[1])); print("%s\t%.2f" % (d["chosen"]["name"], d["valBleu"]))' "$1"; }
# Test BLEU of the job's current selection, decoded with beam $2.
test_bleu() {
  zcat "$data/test_2016_flickr.en.gz" \
    | timeout "$limit" "$bin" translate --checkpoint "$1" --selected --beam "$2" --threads 2 2>> "$1/decode.log" \
    | "$bin" bleu --reference "$data/test_2016_flickr.de.gz" | awk '{print $3}'
}

# One run: train, choose on val with beam 4 and with greedy search, score test with each.
# Prints: name seed steps val-loss | beam-4 choice, its val BLEU, test greedy, test beam 4 |
# greedy choice, its val BLEU, test greedy | seconds.
one() {
  local name="$1" expr="$2" seed="$3" r="$out/$1-s$3" start=$SECONDS
  mkdir -p "$r"
  sed -e "s|\.\./shared/data/multi30k|$data|g" -e "s/^maxSteps: .*/maxSteps: $steps/" \
    -e 's/^maxSeconds: .*/maxSeconds: 1000000/' -e 's/horizon: time/horizon: steps/' \
    -e 's/^logEverySteps: .*/logEverySteps: 500/' -e "s/^seed: .*/seed: $seed/" -e "$expr" \
    examples/multi30k.yaml > "$r/config.yaml"
  printf 'device: %s\nthreads: 2\n' "$device" >> "$r/config.yaml"
  if ! timeout "$limit" "$bin" run --config "$r/config.yaml" --checkpoint-dir "$r" --job mt > "$r/train.log" 2>&1; then
    printf '%s\t%s\tFAIL: training exited (%s)\n' "$name" "$seed" "$(tail -1 "$r/train.log" | cut -c1-160)"
    return
  fi
  local last
  last=$(grep evalLoss "$r/mt/train-log.jsonl" | tail -1)
  local cols=("$name" "$seed" "$(grep -o '"step":[0-9]*' <<<"$last" | cut -d: -f2)"
    "$(grep -o '"evalLoss":[0-9.]*' <<<"$last" | cut -d: -f2 | cut -c1-5)")
  for beam in 4 1; do
    if ! timeout "$limit" "$bin" select --job "$r/mt" --source "$data/val.en.gz" --reference "$data/val.de.gz" \
        --beam "$beam" --threads 2 > "$r/select-beam$beam.log" 2>&1; then
      cols+=("FAIL: select --beam $beam" "" "")
      [[ $beam == 4 ]] && cols+=("")
      continue
    fi
    cp "$r/mt/selected.json" "$r/selected-beam$beam.json"
    cols+=("$(chosen "$r/mt/selected.json")" "$(test_bleu "$r/mt" 1)")
    [[ $beam == 4 ]] && cols+=("$(test_bleu "$r/mt" 4)")
  done
  cols+=("$((SECONDS - start))")
  (IFS=$'\t'; echo "${cols[*]}")
}

printf 'setting\tseed\tsteps\tval_loss\tchoice_b4\tval_b4\ttest_greedy\ttest_b4\tchoice_greedy\tval_greedy\ttest_greedy_gchoice\tseconds\n' > "$out/results.tsv"
running=0
while IFS=$'\t' read -r name expr; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  for seed in $seeds; do
    one "$name" "$expr" "$seed" >> "$out/results.tsv" &
    running=$((running + 1))
    if [[ $running -ge $jobs ]]; then wait -n; running=$((running - 1)); fi
  done
done < "$settings"
wait
if command -v column > /dev/null; then column -t -s $'\t' "$out/results.tsv"; else cat "$out/results.tsv"; fi
echo
echo "mean over seeds (choose by val):"
awk -F'\t' 'NR > 1 && $3 ~ /^[0-9]+$/ {
    n[$1]++; vl[$1] += $4; v4[$1] += $6; tg[$1] += $7; t4[$1] += $8; vg[$1] += $10; tgg[$1] += $11 }
  END { for (s in n) printf "%-24s runs %d  val loss %.3f  val b4 %.2f  val greedy %.2f  |  test greedy %.2f  b4 %.2f  greedy-chosen greedy %.2f\n",
    s, n[s], vl[s] / n[s], v4[s] / n[s], vg[s] / n[s], tg[s] / n[s], t4[s] / n[s], tgg[s] / n[s] }' "$out/results.tsv" | sort
