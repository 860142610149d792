#!/usr/bin/env bash
# The GPU path end to end, on a machine with an NVIDIA GPU (issue 13); prints one table.
#
#   bench/gpu-validate.sh --bin BIN --python PY [--data DIR] [--out DIR] [--quick]
#                         [--device cuda|cpu] [--limit SECONDS] [--only LETTERS] [--steps N]
#
# BIN: a trainer built elsewhere with the CUDA libtorch and the cuda feature:
#   FERROTRAIN_CUDA_TARGET_DIR=... scripts/setup-libtorch.sh --cuda   (the libtorch layout)
#   LIBTORCH=<that dir> cargo build --release -p ferrotrain-trainer --features cuda
#   strip -o ferrotrain-cuda target/release/ferrotrain   (144 MB with line tables, 11 MB
#   stripped: the device tool carries at most 64 MiB; carry the corpus too, into an ignored
#   path, since ../shared is not on the GPU machine)
# PY: a Python with torch 2.11.0 (CUDA 13) and tokenizers: the libraries of its torch and
# nvidia-* packages (libtorch_cuda, cuDNN, cuBLAS, NCCL's libnccl.so.2) are what BIN loads
# here, so no libtorch needs to be copied to the GPU machine.
# DIR: the Multi30k corpus (train/val .en.gz/.de.gz); default ../shared/data/multi30k.
# --device cpu runs every step on the CPU (a rehearsal of the script itself, with a CPU build:
# the rows about libtorch_cuda and NCCL then fail, the others must pass); --limit bounds each
# run (default 240 s: a hang costs one row, not the GPU lease); the table is also written to
# OUT/table.txt. --only (e.g. `--only ade`) runs only those sections (a to i); (f), (h)'s first
# row and (i) need (e)'s files.
#
# It checks, in order: (a) BIN links libtorch_cuda and every library resolves, and a run picks
# the GPU; (b) the copy task converges on one GPU in fp32 and in bf16; (c) NCCL's init and
# every collective (all-reduce, broadcast, barrier) on one rank, and NCCL all-reduce
# bandwidth; (d) two ranks over the TCP ring on the one GPU follow one rank's losses;
# (e) Multi30k tokens/s in bf16 at 2k and 16k tokens per batch, against
# bench/pytorch_transformer.py (PyTorch eager, fused AdamW, bf16 autocast) on the same GPU;
# (f) fp32, bf16 and fp16 (loss scaling) at 16k tokens: tokens/s and loss; (g) a rank killed
# with kill -9 resumes from its checkpoint and the run finishes; (h) the gang's NCCL path on
# the one GPU (a communicator of one rank) against one rank without it, and a hung
# collective failing at the collective timeout; (i) the host memory (peak resident set) of a
# Multi30k 16k-token bf16 run. The Multi30k recipe itself (train 4,000 steps, choose on val,
# score test) runs on a GPU with bench/multi30k-gpu-sweep.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="" py="" data=../shared/data/multi30k out="" steps=200 device=cuda limit=240 only=abcdefghi
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --python) py="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --quick) steps=40; shift ;;
    --steps) steps="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --limit) limit="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x "$bin" && -x "$py" ]] || { echo "usage: $0 --bin BIN --python PY [--data DIR] [--out DIR]" >&2; exit 2; }
bin=$(realpath "$bin")
out=${out:-$(mktemp -d)}
mkdir -p "$out"
export OMP_WAIT_POLICY=PASSIVE RUST_LOG=info

# The torch wheel's libraries and every nvidia-* wheel's, for the dynamic loader.
libs=$("$py" bench/torch_libs.py)
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
declare -a rows=()
row() { rows+=("$(printf '%-44s %-8s %s' "$1" "$2" "$3")"); printf '%-44s %-8s %s\n' "$1" "$2" "$3" >&2; }
# Every run is bounded: a hang fails its row (exit 124) and the script goes on.
bounded() { timeout --kill-after=10 "$limit" "$@"; }

# A copy of examples/copy.yaml (or multi30k.yaml) with `key: value` lines replaced or added.
config() {
  local src="$1" dst="$2"; shift 2
  cp "$src" "$dst"
  local kv key
  for kv in "$@"; do
    key="${kv%%:*}"
    if grep -q "^$key:" "$dst"; then sed -i "s|^$key:.*|$kv|" "$dst"; else echo "$kv" >> "$dst"; fi
  done
}
last_eval_loss() { grep -o 'eval_loss=[0-9.e+-]*' "$1" | tail -1 | cut -d= -f2 || true; }
last_loss() { grep -o 'step [0-9]*/[0-9]* loss [0-9.]*' "$1" | tail -1 | awk '{print $4}' || true; }
tokens_per_second() { grep -o '[0-9.]* tok/s' "$1" | tail -1 | awk '{print $1}' || true; }
# The trainer logs tok/s over the last 20 steps; with logEverySteps 20 the windows after the
# first cover steps 21..N: their mean is the steady rate (what PyTorch is timed over), the
# first window the warm-up.
steady_rate() {
  grep -o 'step [0-9]*/[0-9]* .* [0-9.]* tok/s' "$1" | awk '{ split($2, s, "/"); if (s[1] > 20) { n++; t += $(NF-1) } }
    END { if (n) printf "%.0f", t / n }' || true
}
first_rate() { grep -o 'step 20/[0-9]* .* [0-9.]* tok/s' "$1" | awk '{ print $(NF-1) }' || true; }
loss_at() { grep -o "step $2/[0-9]* loss [0-9.]*" "$1" | awk '{print $4}' || true; }
section() { [[ $only == *"$1"* ]]; }

# (a) link and device
if section a; then
if readelf -d "$bin" | grep -q 'NEEDED.*libtorch_cuda'; then row "a. links libtorch_cuda" PASS ""; else row "a. links libtorch_cuda" FAIL "readelf -d shows no libtorch_cuda"; fi
missing=$(ldd "$bin" | grep 'not found' || true)
if [[ -z "$missing" ]]; then row "a. every library resolves" PASS ""; else row "a. every library resolves" FAIL "$(echo "$missing" | tr '\n' ' ')"; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
# What a user runs first when a GPU job fails: CUDA, NCCL, NVML, topology, /dev/shm, network.
if bounded "$bin" doctor > "$out/doctor.log" 2>&1; then verdict=PASS; else verdict=FAIL; fi
cat "$out/doctor.log" >&2
row "a. ferrotrain doctor" "$verdict" \
  "$(grep -E '^[a-z!]+ +(CUDA devices|NCCL|NVML) ' "$out/doctor.log" | sed -E 's/^[a-z!]+ +//; s/  +/: /' | paste -sd ';')"
fi

# (b) the copy task on one GPU in every precision; auto must pick bf16 on compute capability
# >= 8.0 (fp16 on 7.x), and says so on its start-up line
section b && for precision in fp32 bf16 fp16 auto; do
  c="$out/copy-$precision.yaml" log="$out/copy-$precision.log"
  config examples/copy.yaml "$c" "device: $device" "precision: $precision"
  if bounded "$bin" run --config "$c" --checkpoint-dir "$out/runs" --job "copy-$precision" > "$log" 2>&1; then
    device_line=$(grep -o 'device Cuda([0-9]*)[^"]*' "$log" | head -1 || true)
    loss=$(last_eval_loss "$log")
    verdict=$(awk -v l="${loss:-99}" 'BEGIN { print (l < 0.5) ? "PASS" : "FAIL" }')
    used=$(grep -o 'precision: [a-z0-9]* (.*)' "$log" | head -1 || true)
    row "b. copy task, 1 GPU, $precision" "$verdict" "eval loss $loss, $(tokens_per_second "$log") tok/s; ${used:-no precision line}; ${device_line:-no cuda device line}"
  else
    row "b. copy task, 1 GPU, $precision" FAIL "exit $?: $(tail -1 "$log")"
  fi
done

# (c) NCCL: init, every collective, bandwidth (one rank: NCCL refuses two ranks on one GPU)
if section c; then
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
if RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
   bounded "$bin" bench-collective --device "$device" --sizes-mb 4,40,400 > "$out/nccl.jsonl" 2> "$out/nccl.log"; then
  row "c. NCCL init + all-reduce/broadcast/barrier" PASS "$(grep -o 'correct on.*' "$out/nccl.log" | head -1)"
else
  row "c. NCCL init + all-reduce/broadcast/barrier" FAIL "$(tail -1 "$out/nccl.log")"
fi
fi

# (d) two ranks over the TCP ring on the one GPU vs one rank, on the same batches
# (globalTokens): the losses of the first 30 steps agree to 0.2% (later, GPU reductions in
# another order make the runs drift apart, as any two GPU runs do).
if section d; then
for world in 1 2; do
  c="$out/copy-ring-$world.yaml" log="$out/copy-ring-$world.log"
  config examples/copy.yaml "$c" "device: $device" "precision: fp32" "maxSteps: 30" "logEverySteps: 10"
  sed -i 's/^distributed:$/distributed:\n  backend: ring/' "$c"
  sed -i "s|^  maxTokens: .*|  maxTokens: 1024\n  globalTokens: 1024|" "$c"
  FERROTRAIN_CHECKPOINT_DIR="$out/runs" FERROTRAIN_JOB="ring-$world" \
    bounded "$bin" launch --config "$c" --nproc-per-node "$world" --master-port 0 --max-restarts 0 > "$log" 2>&1 || true
done
pairs="" worst=""
for at in 10 20 30; do
  pairs="$pairs step $at: $(loss_at "$out/copy-ring-1.log" $at) vs $(loss_at "$out/copy-ring-2.log" $at);"
  worst=$(awk -v a="$(loss_at "$out/copy-ring-1.log" $at)" -v b="$(loss_at "$out/copy-ring-2.log" $at)" -v w="${worst:-0}" \
    'BEGIN { if (a == "" || b == "") { print 99; exit } d = (a - b) / a; if (d < 0) d = -d; print (d > w) ? d : w }')
done
verdict=$(awk -v w="$worst" 'BEGIN { print (w <= 0.002) ? "PASS" : "FAIL" }')
nvml=$(grep -c 'NVML: no such GPU' "$out/copy-ring-2.log" || true)
row "d. ring on 1 GPU: 2 ranks vs 1 rank" "$verdict" "train loss (1 rank vs 2)$pairs max rel. diff $worst; NVML misses: $nvml"
fi

# (e) Multi30k tokens/s, bf16, 2k and 16k tokens per batch, ferrotrain vs PyTorch eager
section e && for tokens in 2000 16000; do
  c="$out/m30k-$tokens.yaml" log="$out/m30k-$tokens.log"
  config examples/multi30k.yaml "$c" "device: $device" "maxSteps: $steps" "logEverySteps: 20" \
    "maxSeconds: 100000"
  sed -i -e "s|^  maxTokens: .*|  maxTokens: $tokens|" -e "s|^  globalTokens: .*|  globalTokens: $tokens|" \
    -e 's/horizon: time/horizon: steps/' \
    -e 's/^  everySteps: 1000/  everySteps: 0/' -e 's/bleu: true/bleu: false/' \
    -e "s|\.\./shared/data/multi30k|$(realpath "$data")|g" "$c"
  mkdir -p "$out/runs/m30k-$tokens"
  [[ -f "$out/runs/m30k-2000/tokenizer.json" ]] && cp "$out/runs/m30k-2000/tokenizer.json" "$out/runs/m30k-$tokens/"
  bounded "$bin" run --config "$c" --checkpoint-dir "$out/runs" --job "m30k-$tokens" > "$log" 2>&1 || true
  ours=$(steady_rate "$log")
  theirs=$(bounded "$py" bench/pytorch_transformer.py --device "$device" --bf16 --data "$data" \
    --config examples/multi30k.yaml --warmup-steps 20 --steps $((steps - 20)) \
    --max-tokens "$tokens" --tokenizer "$out/runs/m30k-2000/tokenizer.json" 2>/dev/null \
    | grep -o '[0-9]* tokens/s' | awk '{print $1}' || true)
  ratio=$(awk -v a="${ours:-0}" -v b="${theirs:-0}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
  verdict=$(awk -v r="$ratio" -v a="${ours:-}" -v t="$tokens" 'BEGIN { if (r == "-" || a == "") print "FAIL"; else if (t < 16000 || r >= 0.9) print "PASS"; else print "BELOW" }')
  row "e. Multi30k bf16, $tokens tokens/batch" "$verdict" "steps 21-$steps: ferrotrain ${ours:-?} tok/s (steps 1-20: $(first_rate "$log")), PyTorch ${theirs:-?} tok/s, ratio $ratio (target >= 0.9 at 16k)"
done
# What cuDNN attention (PyTorch 2.11's first choice on Hopper, off in ferrotrain: see
# trainer/src/attention.rs) costs: the same run with it allowed, on both sides.
if section e; then
  c="$out/m30k-16000.yaml" log="$out/m30k-cudnn.log"
  mkdir -p "$out/runs/m30k-cudnn"
  cp "$out/runs/m30k-2000/tokenizer.json" "$out/runs/m30k-cudnn/" 2>/dev/null || true
  FERROTRAIN_CUDNN_ATTENTION=1 bounded "$bin" run --config "$c" --checkpoint-dir "$out/runs" --job m30k-cudnn > "$log" 2>&1 || true
  theirs=$(bounded "$py" bench/pytorch_transformer.py --device "$device" --bf16 --data "$data" --cudnn-sdp \
    --config examples/multi30k.yaml --warmup-steps 20 --steps 40 --max-tokens 16000 --tokenizer "$out/runs/m30k-2000/tokenizer.json" 2>/dev/null \
    | grep -o '[0-9]* tokens/s' | awk '{print $1}' || true)
  row "e. the same, cuDNN attention allowed" "$([[ -n $(steady_rate "$log") ]] && echo INFO || echo FAIL)" \
    "steps 21-$steps: ferrotrain $(steady_rate "$log") tok/s (steps 1-20: $(first_rate "$log")); steps 21-60: PyTorch ${theirs:-?} tok/s"
fi

# (f) Multi30k at 16k tokens per batch in fp32, bf16 and fp16 (loss scaling): tokens/s and
# the training loss after the same steps (the loss must agree within a few percent)
section f && for precision in fp32 bf16 fp16; do
  c="$out/m30k-$precision.yaml" log="$out/m30k-$precision.log"
  config "$out/m30k-16000.yaml" "$c" "precision: $precision"
  mkdir -p "$out/runs/m30k-$precision"
  cp "$out/runs/m30k-2000/tokenizer.json" "$out/runs/m30k-$precision/" 2>/dev/null || true
  bounded "$bin" run --config "$c" --checkpoint-dir "$out/runs" --job "m30k-$precision" > "$log" 2>&1 || true
  loss=$(last_loss "$log")
  [[ $precision == fp32 ]] && fp32_loss=$loss
  skipped=$(grep -o '([0-9]* skipped)' "$log" | tail -1 | tr -dc '0-9' || true)
  # A finished run whose loss after the same steps is within 5% of fp32's.
  verdict=$(awk -v l="${loss:-0}" -v r="${fp32_loss:-0}" -v done="$(grep -c ' finished step=' "$log")" \
    'BEGIN { d = l - r; if (d < 0) d = -d; print (done > 0 && r > 0 && d <= 0.05 * r) ? "PASS" : "FAIL" }')
  row "f. Multi30k 16k tokens, $precision" "$verdict" \
    "$(steady_rate "$log") tok/s, loss ${loss:-?} at step $steps (fp32 ${fp32_loss:-?})${skipped:+; skipped steps $skipped}"
done

# Seconds between the first lines of $1 matching $2 and $3 (their timestamps), or nothing.
seconds_between() {
  local a b
  a=$(grep -m1 -e "$2" "$1" | awk '{print $1}' || true)
  b=$(grep -m1 -e "$3" "$1" | awk '{print $1}' || true)
  awk -v a="$(date -d "${a:-x}" +%s.%N 2>/dev/null)" -v b="$(date -d "${b:-x}" +%s.%N 2>/dev/null)" \
    'BEGIN { if (a != "" && b != "") printf "%.1f", b - a }'
}

# (g) kill -9 of a rank mid-run: the launcher restarts it in place as round 1 (one rank, so no
# survivor holds a newer state: from the latest checkpoint) and the run finishes. The kill
# waits until the round is 5 s old, so that the next round's spare trainer (started 3 s into a
# round: launch/spare.rs) is waiting and the restart runs on it; the row gives the launcher's
# time from the failure to the resumed rank's first step (the first failure in a row restarts
# at once: no back-off).
if section g; then
c="$out/copy-kill.yaml" log="$out/copy-kill.log"
# Long enough that the kill lands mid-run on a GPU (the copy model steps in milliseconds there).
kill_steps=$([[ $device == cuda ]] && echo 3000 || echo 400)
config examples/copy.yaml "$c" "device: $device" "maxSteps: $kill_steps" "logEverySteps: 500"
sed -i 's/^  everySteps: .*/  everySteps: 50/' "$c"
FERROTRAIN_CHECKPOINT_DIR="$out/runs" FERROTRAIN_JOB="kill" \
  bounded "$bin" launch --config "$c" --nproc-per-node 1 --master-port 0 --max-restarts 2 > "$log" 2>&1 &
launcher=$!
launched=$SECONDS
# Any checkpoint (retention removes the early ones within a second on a GPU) and 5 s in.
for _ in $(seq 1 1200); do
  compgen -G "$out/runs/kill/step-*/trainer.json" > /dev/null && (( SECONDS - launched >= 5 )) && break
  sleep 0.1
done
# The rank, not its waiting spare (same command line, process name ft-spare).
for pid in $(pgrep -f "run --config $c"); do
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == ft-spare ]] || kill -9 "$pid" 2>/dev/null || true
done
if wait "$launcher" && grep -q 'resuming from checkpoint' "$log"; then
  back=$(grep -o 'failure to next first step [0-9.]* s' "$log" | tail -1)
  spares=$(grep -o 'round 1: started [0-9]* rank(s), [0-9]* of them spares' "$log" || echo 'round 1 from a fresh process')
  row "g. kill -9 of a rank, resume" PASS "$(grep -o 'resuming from checkpoint step=[0-9]*' "$log" | tail -1); ${back:-no recovery line}; $spares"
else
  row "g. kill -9 of a rank, resume" FAIL "$(tail -1 "$log")"
fi
fi

# (h) a collective hung for HOLD seconds (FERROTRAIN_INJECT_HANG holds NCCL's stream) in a
# run of the copy task under the launcher, collective timeout 10 s: the rank must see it at
# the timeout, naming the collectives, and report its failure once the abort returned or
# was given up (15 s); the next round resumes and finishes. When the process exits is
# printed, not judged: NCCL's abort, and the process's end, wait for the held queue.
hang_row() {
  local hold="$1" what="$2" c="$out/copy-hang-$1.yaml" log="$out/copy-hang-$1.log" code=0
  config examples/copy.yaml "$c" "device: $device" "maxSteps: 1500" "logEverySteps: 500"
  sed -i -e '/^checkpoint:/,/^[a-z]/ s/^  everySteps: .*/  everySteps: 50/' \
    -e 's/collectiveTimeoutSeconds: .*/collectiveTimeoutSeconds: 10/' "$c"
  FERROTRAIN_GANG_OF_ONE=1 FERROTRAIN_INJECT_HANG="800:$hold" FERROTRAIN_CHECKPOINT_DIR="$out/runs" \
    FERROTRAIN_JOB="hang-$hold" bounded "$bin" launch --config "$c" --nproc-per-node 1 --master-port 0 \
    --max-restarts 1 > "$log" 2>&1 || code=$?
  local seen reported exited verdict
  seen=$(seconds_between "$log" FERROTRAIN_INJECT_HANG 'did not complete within')
  reported=$(seconds_between "$log" 'did not complete within' 'communicator aborted in\|ncclCommAbort did not return')
  exited=$(seconds_between "$log" 'did not complete within' 'rank 0 exited with code')
  verdict=$(awk -v s="${seen:-0}" -v r="${reported:-99}" -v c="$code" -v n="$(grep -c '(the collectives)' "$log")" \
    'BEGIN { print (c == 0 && n > 0 && s >= 9 && s <= 14 && r <= 16.5) ? "PASS" : "FAIL" }')
  row "h. NCCL collective hung ${hold} s, timeout 10 s" "$verdict" \
    "$what: seen ${seen:-?} s after the hold began; abort ${reported:-?} s later ($(grep -m1 -o -e 'communicator aborted in [0-9.]* s' -e 'ncclCommAbort did not return within [0-9]* s' "$log" || echo 'no abort line')); process exited ${exited:-?} s after the timeout; launcher exit $code; $(grep -o 'resuming from checkpoint step=[0-9]*' "$log" | tail -1)"
}

# (h) the gang's NCCL path on one GPU (FERROTRAIN_GANG_OF_ONE=1: a communicator of one rank,
# gradient buckets during backward, the per-collective waits, the GPU-timed commFraction):
# Multi30k at 16k tokens in bf16 beside (e)'s single rank without it (same batches: the loss
# agrees within 2%); then two hung collectives (hang_row above).
if section h && [[ ! -f $out/m30k-16000.yaml ]]; then
  row "h. NCCL gang of one, Multi30k 16k bf16" SKIP "needs (e)'s files in the same --out"
elif section h; then
  c="$out/m30k-gang.yaml" log="$out/m30k-gang.log"
  mkdir -p "$out/runs/m30k-gang"
  cp "$out/runs/m30k-2000/tokenizer.json" "$out/runs/m30k-gang/" 2>/dev/null || true
  config "$out/m30k-16000.yaml" "$c" "precision: bf16"
  port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  FERROTRAIN_GANG_OF_ONE=1 RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    bounded "$bin" run --config "$c" --checkpoint-dir "$out/runs" --job m30k-gang > "$log" 2>&1 || true
  alone="$out/m30k-bf16.log"; [[ -f $alone ]] || alone="$out/m30k-16000.log"
  ours=$(loss_at "$log" "$steps") theirs=$(loss_at "$alone" "$steps")
  comm=$(grep -o 'comm [0-9]*%' "$log" | tail -1 || true)
  verdict=$(awk -v a="${ours:-0}" -v b="${theirs:-0}" -v n="$(grep -c 'NCCL' "$log")" -v c="$comm" \
    'BEGIN { d = (a - b) / b; if (d < 0) d = -d; print (b > 0 && a > 0 && d <= 0.02 && n > 0 && c != "") ? "PASS" : "FAIL" }' 2>/dev/null || echo FAIL)
  row "h. NCCL gang of one, Multi30k 16k bf16" "$verdict" \
    "$(steady_rate "$log") tok/s against $(steady_rate "$alone") alone; loss ${ours:-?} vs ${theirs:-?} at step $steps; ${comm:-no comm figure}; $(grep -o 'NCCL [0-9.]*' "$log" | head -1)"
fi
if section h; then
  hang_row 20 "the abort returns when the hold ends"
  hang_row 60 "the abort is given up after 15 s"
fi

# (i) host memory: the peak resident set (VmHWM, read every 0.2 s) of a Multi30k 16k-token
# bf16 run like (e)'s, with the allocator its start-up line names: what a pod's memory limit
# must allow on the host beside the GPU's memory (jemalloc keeps freed pages, so the peak is
# what counts).
if section i && [[ ! -f $out/m30k-16000.yaml ]]; then
  row "i. host memory, Multi30k 16k bf16" SKIP "needs (e)'s files in the same --out"
elif section i; then
  log="$out/m30k-rss.log" hwm=0 ticks=0 code=0
  mkdir -p "$out/runs/m30k-rss"
  cp "$out/runs/m30k-2000/tokenizer.json" "$out/runs/m30k-rss/" 2>/dev/null || true
  # Not `bounded`: the sampler needs the trainer's own pid, so the bound is the loop's.
  "$bin" run --config "$out/m30k-16000.yaml" --checkpoint-dir "$out/runs" --job m30k-rss > "$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    ticks=$((ticks + 1))
    (( ticks > limit * 5 )) && kill -9 "$pid" 2>/dev/null
    peak=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    [[ -n $peak ]] && hwm=$peak
    sleep 0.2
  done
  wait "$pid" || code=$?
  row "i. host memory, Multi30k 16k bf16" "$([[ $code == 0 && $hwm -gt 0 ]] && echo INFO || echo FAIL)" \
    "peak resident $((hwm / 1024)) MiB (VmHWM) over $steps steps; $(grep -o 'allocator="[a-z]*"' "$log" | head -1); exit $code"
fi

echo
echo "GPU validation ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)); logs in $out"
printf '%s\n' "${rows[@]}" | tee "$out/table.txt"
grep -h '"backend"' "$out/nccl.jsonl" 2>/dev/null | sed 's/^/  nccl: /' || true
