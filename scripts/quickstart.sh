#!/usr/bin/env bash
# The quick start: builds the trainer and the kubectl plugin, and trains the copy task
# (examples/copy.yaml) on two local ranks exchanging gradients over the TCP ring. Once a
# checkpoint of step 300 (or later) exists it kills rank 1's trainer process with SIGKILL
# (never a waiting spare: spares are named `ft-spare`) and lets the launcher restart the ranks
# in place, as a new round. Rank 0 survives and leaves the state of the last step it
# completed, so the restarted ranks start from that step, not from the checkpoint
# (docs/losing-nothing.md). It prints the launcher's account of the restart
# from its recovery ledger (--recovery-file): the rank it blamed, the step the ranks resumed
# from and where that state came from, the time from the kill to the next step and the steps
# trained twice. It exits 1 when no restart happened, so what it prints is what it did.
#
#   scripts/quickstart.sh [--config FILE] [--kill-after-checkpoint STEP] [--no-build]
#
# FERROTRAIN_CHECKPOINT_DIR (default runs/) holds the job `quickstart`, its launcher log
# (quickstart.log) and ledger (quickstart.recovery.json). FERROTRAIN names the binary (default:
# the one just built). trainer/tests/quickstart.rs runs this script with a shorter config.
set -euo pipefail
cd "$(dirname "$0")/.."

config=examples/copy.yaml
kill_after=300
build=yes
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --kill-after-checkpoint) kill_after="$2"; shift 2 ;;
    --no-build) build=no; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "quickstart: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

. scripts/env.sh
if [[ $build == yes ]]; then
  echo "==> building ferrotrain (cargo build -p ferrotrain-trainer)"
  cargo build -p ferrotrain-trainer
  # The kubectl plugin (docs/cli.md), beside ferrotrain in target/debug, which scripts/env.sh
  # puts on PATH: `kubectl ferrotrain` works from then on. A build of its own: built together,
  # the trainer's dependencies would take the plugin's features and be built twice.
  echo "==> building kubectl ferrotrain (cargo build -p kubectl-ferrotrain)"
  cargo build -p kubectl-ferrotrain
fi
ferrotrain="${FERROTRAIN:-ferrotrain}"

export FERROTRAIN_JOB=quickstart
export FERROTRAIN_CHECKPOINT_DIR="${FERROTRAIN_CHECKPOINT_DIR:-runs}"
job_dir="$FERROTRAIN_CHECKPOINT_DIR/$FERROTRAIN_JOB"
log="$FERROTRAIN_CHECKPOINT_DIR/quickstart.log"
ledger="$FERROTRAIN_CHECKPOINT_DIR/quickstart.recovery.json"
mkdir -p "$FERROTRAIN_CHECKPOINT_DIR"
rm -rf "$job_dir" "$ledger"

echo "==> ferrotrain launch --nproc-per-node 2 --max-restarts 3 --config $config"
"$ferrotrain" launch --nproc-per-node 2 --max-restarts 3 --recovery-file "$ledger" \
  --config "$config" > "$log" 2>&1 &
launcher=$!
trap 'kill "$launcher" 2>/dev/null || true' EXIT
# The launcher's and rank 0's log, as it is written (tail ends with the launcher).
tail -n +1 -f --pid="$launcher" "$log" &
follower=$!

# Rank 1's trainer: a child of the launcher named `ferrotrain` (a spare waiting for the next
# round is named `ft-spare`) whose environment says RANK=1.
rank_1() {
  local pid
  for pid in $(pgrep -P "$launcher" -x ferrotrain || true); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx 'RANK=1'; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}

# The newest complete checkpoint's step (a step directory appears complete: it is renamed into
# place), or nothing.
newest_checkpoint() {
  local newest
  newest=$(ls "$job_dir" 2>/dev/null | grep -E '^step-[0-9]+$' | sort | tail -n1)
  [[ -n $newest ]] && echo $((10#${newest#step-}))
}

# Wait (at most 10 minutes) for a checkpoint at or past the step, then kill rank 1.
killed=
for _ in $(seq 1 6000); do
  if ! kill -0 "$launcher" 2>/dev/null; then break; fi
  if [[ -z $killed ]] && step=$(newest_checkpoint) && ((step >= kill_after)) \
      && victim=$(rank_1); then
    echo "==> demo: checkpoint step $step is complete; kill -9 of rank 1's trainer (pid $victim)"
    kill -9 "$victim"
    killed=$victim
  fi
  sleep 0.1
done
status=0
wait "$launcher" || status=$?
trap - EXIT
wait "$follower" || true
echo "==> the launcher exited with code $status; checkpoints in $job_dir: $(ls "$job_dir" | grep '^step-' | tr '\n' ' ')"
[[ -n $killed ]] || { echo "FAILED: training ended before checkpoint step $kill_after; nothing was killed" >&2; exit 1; }

echo "==> the launcher's log of the restart ($log):"
grep -E 'agent: round [0-9]+( ended|: started)' "$log" | sed 's/^.*agent: /    agent: /'
# What the ranks said about their state: rank 0 leaving it, the next round resuming from it.
grep -E "heal: left the state|resuming from (a peer's state|checkpoint)" "$log" \
  | sed -E 's/^.*(heal: left|resuming from)/    rank: \1/' || true
# The ledger as logged at the end (it is logged at every round's end; the last is whole).
awk '/launch: attempt 0 round 0: resumed/ { first = NR } { line[NR] = $0 }
  END { for (i = first; i <= NR; i++) if (line[i] ~ /launch: (attempt [0-9]+ round [0-9]+: resumed|recovery:)/) print line[i] }' \
  "$log" | sed 's/^.*launch: /    launch: /'

echo "==> the restart, from the launcher's recovery ledger ($ledger):"
python3 - "$ledger" "$status" <<'PY'
import json, sys
from datetime import datetime

ledger, status = json.load(open(sys.argv[1])), int(sys.argv[2])

def at(text):
    # RFC 3339 with up to nanoseconds; Python reads microseconds.
    text = text.replace("Z", "+00:00")
    if "." in text:
        head, tail = text.split(".", 1)
        digits = tail[: len(tail) - 6]
        text = f"{head}.{digits[:6].ljust(6, '0')}{tail[len(digits):]}"
    return datetime.fromisoformat(text)

rounds = ledger.get("attempts", [])
failed = rounds[0].get("end", {}) if rounds else {}
if len(rounds) < 2 or failed.get("cause") != "Failure" or failed.get("rank") != 1:
    sys.exit(f"FAILED: no restart after rank 1's kill in the ledger: {json.dumps(ledger)}")
first, second = rounds[0], rounds[1]
code = failed.get("exitCode")
how = f"killed by signal {code - 128}" if code and code > 128 else f"exit code {code}"
print(f"    rank 1 ({how}) ended round 0 at step {first.get('lastStep', 0)}; "
      f"the launcher blamed it: {failed.get('reason')}")
resumed, healed = second.get("resumedFromStep", 0), second.get("healedFrom")
if healed == "peers":
    source = "the state a surviving rank left when round 0 ended (healedFrom peers)"
elif healed == "checkpoint":
    source = "the latest checkpoint (healedFrom checkpoint: no rank left a state as new)"
else:
    source = "nothing: a fresh start"
print(f"    the same launcher restarted both ranks in place as round 1 (no new job, nothing "
      f"else restarted), resuming from step {resumed}: {source}")
if "firstStepAt" in second:
    gap = (at(second["firstStepAt"]) - at(failed["failedAt"])).total_seconds()
    print(f"    from the failure to round 1's first step: {gap:.2f} s")
else:
    sys.exit("FAILED: round 1 never completed a step")
print(f"    steps lost (trained again): {first.get('lostSteps', 0)}")
end = rounds[-1].get("end", {})
goodput = ledger.get("goodputPercent")
print(f"    the run: {len(rounds)} rounds, ended {end.get('cause', 'running')}, goodput "
      + (f"{goodput:.1f}%" if goodput is not None else "-"))
if status != 0 or end.get("cause") != "Succeeded":
    sys.exit(f"FAILED: the run did not finish (launcher exit {status})")
PY
