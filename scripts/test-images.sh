#!/usr/bin/env bash
# The container image tests (scripts/test.sh runs them after the Rust tests; docs/images.md):
#   - static: versions pinned once, the CUDA image's recipe (libtorch_cuda, NCCL);
#   - builds ferrotrain/trainer and ferrotrain/operator with scripts/images.sh (local mode);
#   - every image's binary resolves all its shared libraries inside the image;
#   - the operator image prints the CRD byte-identical to crds/, as uid 65532 with a read-only
#     root, and has no shell;
#   - `ferrotrain validate` refuses a bad config with exit 2;
#   - two trainer containers on a Docker network, started with the operator's env contract,
#     read-only root, uid 65532: train the copy task to the end and checkpoint to a volume;
#     then a second job where one container is killed mid-training: the other exits with the
#     retryable code, and both restarted as the next attempt resume from the checkpoint.
#
# Needs a Docker engine: starts dockerd (installing Debian's docker.io when missing) if none
# answers; skips, loudly, only where no engine can be started (FERROTRAIN_REQUIRE_DOCKER=1 makes
# that a failure). Everything it starts (containers, network, files) is removed on exit; the
# images stay (tag $TAG, default `ci`), so the next run's build is warm.
#   FERROTRAIN_IMAGE_CARGO=0   use the binaries already in target/debug (test.sh: the tests
#                              just built them)
#   FERROTRAIN_TEST_CUDA_IMAGE=1  also build ferrotrain/trainer-cuda and check its closure
#   FERROTRAIN_IMAGE_BUILD=0   test the images already tagged $TAG, build nothing
set -euo pipefail
cd "$(dirname "$0")/.."

T0=$SECONDS
TAG="${TAG:-ci}"
RUN_ID="ftimg-$$-$RANDOM"
TRAINER="ferrotrain/trainer:$TAG"
OPERATOR="ferrotrain/operator:$TAG"

say() { printf '[images %4ds] %s\n' $((SECONDS - T0)) "$*"; }
fail() { printf '[images %4ds] FAIL: %s\n' $((SECONDS - T0)) "$*" >&2; exit 1; }
# Runs "$@" until it succeeds or $1 seconds pass.
wait_for() {
  local limit="$1"; shift
  local deadline=$((SECONDS + limit))
  until "$@"; do
    (( SECONDS < deadline )) || return 1
    sleep 1
  done
}

skip() {
  local line='!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!'
  printf '\n%s\n!!! IMAGE TESTS SKIPPED: %s\n!!! (no container image was built or tested)\n%s\n\n' "$line" "$*" "$line" >&2
  if [[ "${FERROTRAIN_REQUIRE_DOCKER:-0}" == 1 ]]; then exit 1; fi
  exit 0
}

# --- a Docker engine ----------------------------------------------------------------------
# shellcheck source=lib/docker-engine.sh
. scripts/lib/docker-engine.sh
ensure_engine() { ensure_docker_engine || skip "$DOCKER_ENGINE_ERROR"; }

# --- static checks (no engine needed) ------------------------------------------------------
check_static() {
  # Versions: docker/versions.env is the one place; the Dockerfiles' ARG defaults repeat it.
  # shellcheck source=/dev/null
  . docker/versions.env
  local f name
  for f in docker/trainer.Dockerfile docker/operator.Dockerfile docker/s3-e2e.Dockerfile; do
    for name in RUST_IMAGE BASE_IMAGE; do
      grep -qx "ARG $name=${!name}" "$f" || fail "$f: ARG $name default differs from docker/versions.env (${!name})"
    done
  done
  for f in docker/pytorch-base.Dockerfile docker/pytorch.Dockerfile; do
    grep -qx "ARG RUST_IMAGE=$RUST_IMAGE" "$f" || fail "$f: ARG RUST_IMAGE default differs from docker/versions.env ($RUST_IMAGE)"
  done
  grep -qx "ARG S3S_FS_VERSION=$S3S_FS_VERSION" docker/s3-e2e.Dockerfile \
    || fail "docker/s3-e2e.Dockerfile: ARG S3S_FS_VERSION differs from docker/versions.env ($S3S_FS_VERSION)"
  # The CUDA image's recipe: setup-libtorch.sh --cuda keeps libtorch_cuda and fetches NCCL
  # (libnccl.so.2); the Dockerfile builds with the cuda feature from that layout; the build
  # script links libtorch_cuda with --no-as-needed.
  local plan
  plan=$(scripts/setup-libtorch.sh --cuda --plan) || fail "setup-libtorch.sh --cuda --plan failed"
  for want in 'keep libtorch_cuda.so' 'keep libc10_cuda.so' 'fetch nvidia-nccl-cu13==' 'fetch nvidia-cudnn-cu13==' 'fetch cuda-toolkit\[.*cublas'; do
    grep -q "^$want" <<<"$plan" || fail "the CUDA libtorch plan lacks '$want':"$'\n'"$plan"
  done
  grep -q 'FERROTRAIN_LIBTORCH_VARIANT="$LIBTORCH_VARIANT" scripts/setup-libtorch.sh' docker/trainer.Dockerfile \
    || fail "docker/trainer.Dockerfile does not lay out libtorch by variant"
  grep -q -- '--features "$CARGO_FEATURES"' docker/trainer.Dockerfile || fail "docker/trainer.Dockerfile ignores CARGO_FEATURES"
  grep -q 'LIBTORCH_VARIANT=cuda --build-arg CARGO_FEATURES=cuda' scripts/images.sh || fail "images.sh does not build trainer-cuda with the cuda feature"
  grep -q -- '--no-as-needed,-ltorch_cuda' trainer/build.rs || fail "trainer/build.rs does not force-link libtorch_cuda"
  # A CUDA layout already on this machine (setup-libtorch.sh --cuda ran): its link closure.
  local cuda_dir
  cuda_dir="${FERROTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrotrain}/libtorch-$(scripts/setup-libtorch.sh --print-version)-cuda"
  if [[ -f "$cuda_dir/.complete" ]]; then
    local missing
    missing=$(closure_missing "$cuda_dir/lib" libtorch_cuda.so)
    [[ -z "$missing" ]] || fail "the CUDA libtorch layout misses: $missing"
    [[ -f "$cuda_dir/lib/libnccl.so.2" ]] || fail "$cuda_dir/lib has no libnccl.so.2"
    say "CUDA libtorch layout in $cuda_dir: libtorch_cuda.so's closure and libnccl.so.2 present"
  else
    say "no CUDA libtorch on this machine: its layout was checked by plan only"
  fi
  say "static checks passed (versions, CUDA recipe)"
}

# The NEEDED libraries reachable from $2 in directory $1 that are neither there nor glibc/
# libstdc++/libgcc (which every base image has) nor the driver's libcuda.
closure_missing() {
  python3 - "$@" <<'PY'
import subprocess, sys, os
libdir, root = sys.argv[1], sys.argv[2]
system = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libutil.so.1",
          "ld-linux-x86-64.so.2", "libstdc++.so.6", "libgcc_s.so.1", "libcuda.so.1"}
seen, todo, missing = set(), [root], set()
while todo:
    name = todo.pop()
    if name in seen: continue
    seen.add(name)
    path = os.path.join(libdir, name)
    if not os.path.exists(path):
        if name not in system: missing.add(name)
        continue
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    todo += [l.split("[", 1)[1].rstrip("]") for l in out.splitlines() if "(NEEDED)" in l]
print(" ".join(sorted(missing)))
PY
}

# --- cleanup ---------------------------------------------------------------------------------
WORK=
cleanup() {
  local ids
  ids=$(docker ps -aq --filter "label=ferrotrain.test=$RUN_ID" 2>/dev/null || true)
  # shellcheck disable=SC2086 # one id per word
  [[ -z "$ids" ]] || docker rm -f $ids >/dev/null 2>&1 || true
  docker network rm "$RUN_ID" >/dev/null 2>&1 || true
  [[ -z "$WORK" ]] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- checks of one image ------------------------------------------------------------------
# The dynamic loader of the image itself lists what the binary loads: ldd without a shell.
check_closure() {
  local image="$1" bin="$2" out
  out=$(docker run --rm --network none --entrypoint /lib64/ld-linux-x86-64.so.2 "$image" --list "$bin" 2>&1) \
    || fail "$image: the loader cannot resolve $bin:"$'\n'"$out"
  if grep -q 'not found' <<<"$out"; then fail "$image: unresolved libraries of $bin:"$'\n'"$out"; fi
  say "$image: $bin resolves all $(grep -c '=>' <<<"$out") shared libraries inside the image"
}

check_labels_user() {
  local image="$1" user labels
  user=$(docker image inspect -f '{{.Config.User}}' "$image")
  [[ "$user" == 65532:65532 ]] || fail "$image runs as '$user', not 65532:65532"
  labels=$(docker image inspect -f '{{json .Config.Labels}}' "$image")
  for key in title version revision created licenses; do
    grep -q "\"org.opencontainers.image.$key\":\"[^\"]" <<<"$labels" || fail "$image: label org.opencontainers.image.$key missing or empty: $labels"
  done
}

size_mb() { echo $(( $(docker image inspect -f '{{.Size}}' "$1") / 1000000 )); }

check_operator() {
  check_labels_user "$OPERATOR"
  check_closure "$OPERATOR" /usr/local/bin/ferrotrain-operator
  docker run --rm --network none --read-only --user 65532:65532 --cap-drop ALL \
    --security-opt no-new-privileges "$OPERATOR" crd > "$WORK/crd.yaml" \
    || fail "$OPERATOR crd failed"
  cmp -s "$WORK/crd.yaml" crds/distributedtrainings.yaml \
    || { diff -u crds/distributedtrainings.yaml "$WORK/crd.yaml" | sed -n 1,40p >&2 || true; fail "$OPERATOR crd differs from crds/distributedtrainings.yaml"; }
  if docker run --rm --network none --entrypoint /bin/sh "$OPERATOR" -c true >/dev/null 2>&1; then
    fail "$OPERATOR has a shell"
  fi
  local mb; mb=$(size_mb "$OPERATOR")
  (( mb < 60 )) || fail "$OPERATOR is $mb MB (limit 60)"
  say "$OPERATOR: CRD identical to crds/ as uid 65532 on a read-only root, no shell, $mb MB"
}

# The operator image, started with the Helm chart's rendered args and env (uid 65532, read-only
# root, host network to reach the test's in-process fake API server), runs the copy example's
# pods and stops on SIGTERM releasing its Lease: operator/tests/chart_operator.rs.
check_operator_as_the_chart_runs_it() {
  if ! FERROTRAIN_OPERATOR_IMAGE="$OPERATOR" cargo nextest run -p ferrotrain-operator \
    --test chart_operator --profile ci 2>&1 | sed 's/^/    /'; then
    fail "$OPERATOR, started as the chart starts it, did not run the copy example"
  fi
  say "$OPERATOR: started as the chart starts it, ran the copy example's pods against the fake API server"
}

check_trainer_static() {
  check_labels_user "$TRAINER"
  check_closure "$TRAINER" /usr/local/bin/ferrotrain
  local mb; mb=$(size_mb "$TRAINER")
  (( mb < 1200 )) || fail "$TRAINER is $mb MB (limit 1200)"
  # validate refuses a config error with exit 2 (permanent: the operator fails the job).
  # A complete config whose model.dModel (30) is not divisible by model.heads (4).
  write_config bad 10 10
  sed -i 's/^  dModel: 32$/  dModel: 30/; s/^  heads: 2$/  heads: 4/' "$WORK/bad.yaml"
  grep -q '^  dModel: 30$' "$WORK/bad.yaml" || fail "could not make the bad config"
  local rc=0
  docker run --rm --network none --read-only --user 65532:65532 --tmpfs /tmp \
    -v "$WORK/bad.yaml:/etc/ferrotrain/bad.yaml:ro" "$TRAINER" \
    ferrotrain validate --config /etc/ferrotrain/bad.yaml > "$WORK/validate.log" 2>&1 || rc=$?
  [[ $rc == 2 ]] || { cat "$WORK/validate.log" >&2; fail "ferrotrain validate of a bad config exited $rc, not 2"; }
  say "$TRAINER: validate refuses a bad config with exit 2 ($(tail -n1 "$WORK/validate.log" | cut -c1-100)); $mb MB"
}

# --- two trainer containers with the operator's env contract --------------------------------
# start_rank JOB ATTEMPT NODE_RANK [extra docker args]: container <job>-<attempt>-<rank>, as the
# operator names pods; MASTER_ADDR is node 0's container name; only node 0 mounts the
# checkpoint volume (ReadWriteOnce semantics, like the operator).
start_rank() {
  local job="$1" attempt="$2" rank="$3"; shift 3
  local name="$RUN_ID-$job-$attempt-$rank" ckpt=()
  [[ $rank == 0 ]] && ckpt=(-v "$WORK/checkpoints:/checkpoints")
  : > "$WORK/term-$job-$attempt-$rank"; chmod 666 "$WORK/term-$job-$attempt-$rank"
  docker run -d --name "$name" --hostname "$name" --network "$RUN_ID" \
    --label "ferrotrain.test=$RUN_ID" \
    --read-only --user 65532:65532 --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges \
    --env-file "$WORK/token.env" \
    -e MASTER_ADDR="$RUN_ID-$job-$attempt-0" -e MASTER_PORT=29500 \
    -e WORLD_SIZE=2 -e NNODES=2 -e NODE_RANK="$rank" -e NPROC_PER_NODE=1 \
    -e PET_MASTER_ADDR="$RUN_ID-$job-$attempt-0" -e PET_MASTER_PORT=29500 \
    -e PET_NNODES=2 -e PET_NODE_RANK="$rank" -e PET_NPROC_PER_NODE=1 \
    -e TORCHELASTIC_RESTART_COUNT="$attempt" -e FERROTRAIN_ATTEMPT="$attempt" \
    -e FERROTRAIN_JOB="$job" -e FERROTRAIN_CONFIG="/etc/ferrotrain/$job.yaml" \
    -e FERROTRAIN_CHECKPOINT_DIR=/checkpoints -e FERROTRAIN_METRICS_PORT=9090 -e HOME=/tmp \
    -e OMP_NUM_THREADS=1 \
    -v "$WORK/$job.yaml:/etc/ferrotrain/$job.yaml:ro" \
    -v "$WORK/term-$job-$attempt-$rank:/dev/termination-log" \
    "${ckpt[@]}" "$@" "$TRAINER" >/dev/null
  echo "$name"
}

# Waits (bounded) for a container to exit; prints its exit code.
wait_exit() {
  local name="$1" limit="$2" code
  code=$(timeout "$limit" docker wait "$name" 2>/dev/null) || {
    docker logs --tail 30 "$name" >&2 2>&1 || true
    fail "$name did not exit within $limit s"
  }
  echo "$code"
}

write_config() {
  local job="$1" steps="$2" every="$3"
  cat > "$WORK/$job.yaml" <<YAML
# A small copy task: a tiny model, $steps steps, a checkpoint every $every steps.
task: copy
seed: 1
maxSteps: $steps
copy:
  symbols: 12
  minLength: 3
  maxLength: 8
  trainSamples: 4000
  validSamples: 64
model:
  dModel: 32
  heads: 2
  encoderLayers: 1
  decoderLayers: 1
  ffnDim: 64
  dropout: 0.0
  maxPositions: 16
batch:
  maxTokens: 256
optimizer:
  lr: 0.003
schedule:
  kind: inverseSqrt
  warmupSteps: 20
labelSmoothing: 0.0
eval:
  everySteps: $steps
  beamSize: 1
checkpoint:
  everySteps: $every
  keepLatest: 2
distributed:
  collectiveTimeoutSeconds: 10
  rendezvousTimeoutSeconds: 60
logEverySteps: 25
YAML
  chmod 644 "$WORK/$job.yaml"
}

latest_checkpoint_step() {
  local dir="$WORK/checkpoints/$1" last
  last=$(find "$dir" -maxdepth 1 -name 'step-*' -type d 2>/dev/null | grep -E '/step-[0-9]{8,}$' | sort | tail -n1 || true)
  [[ -n "$last" && -f "$last/trainer.json" ]] || { echo 0; return; }
  echo $((10#${last##*/step-}))
}
checkpoint_exists() { (( $(latest_checkpoint_step "$1") > 0 )); }

run_two_containers() {
  mkdir -p "$WORK/checkpoints"
  chown 65532:65532 "$WORK/checkpoints" 2>/dev/null || chmod 777 "$WORK/checkpoints"
  # The rendezvous token, from a file (the operator takes it from a Secret).
  printf 'FERROTRAIN_RDZV_TOKEN=%s\n' "$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')" > "$WORK/token.env"
  chmod 600 "$WORK/token.env"
  docker network create --label "ferrotrain.test=$RUN_ID" "$RUN_ID" >/dev/null

  # 1. Train to the end.
  local steps=200 t0 a b ca cb
  write_config copy "$steps" 50
  t0=$SECONDS
  a=$(start_rank copy 0 0); b=$(start_rank copy 0 1)
  ca=$(wait_exit "$a" 300); cb=$(wait_exit "$b" 60)
  if [[ $ca != 0 || $cb != 0 ]]; then
    docker logs --tail 40 "$a" >&2 2>&1; docker logs --tail 40 "$b" >&2 2>&1
    fail "two-container training exited $ca / $cb"
  fi
  local last; last=$(latest_checkpoint_step copy)
  [[ $last == "$steps" && -f "$WORK/checkpoints/copy/step-$(printf %08d "$steps")/model.safetensors" ]] \
    || fail "no checkpoint of step $steps on the volume (latest: $last)"
  local final; final=$(docker logs "$a" 2>&1 | grep -oE "step $steps/$steps loss [0-9.]+" | tail -n1 || true)
  [[ -n "$final" ]] || { docker logs --tail 20 "$a" >&2 2>&1; fail "rank 0 never logged step $steps/$steps"; }
  TRAIN_LINE="$steps steps in $((SECONDS - t0)) s on 2 containers ($final), checkpoint step-$(printf %08d "$steps") on the volume"
  say "trained: $TRAIN_LINE"
  docker rm "$a" "$b" >/dev/null

  # 2. A longer job. Once a checkpoint exists, one container is killed (SIGKILL): the other
  #    must exit with the retryable code. Then both restart as attempt 1 and resume.
  local ksteps=1500 every=100
  write_config kill "$ksteps" "$every"
  a=$(start_rank kill 0 0); b=$(start_rank kill 0 1)
  wait_for 240 checkpoint_exists kill || { docker logs --tail 30 "$a" >&2 2>&1; fail "no checkpoint within 240 s"; }
  fail_peer kill "$a" "$b" kill
  KILL_LINE="$FAIL_LINE"
  say "kill: $KILL_LINE"
  resume_attempt kill 1 "$ksteps"
  RESUME_LINE="$RESUMED_LINE"
  say "attempt 1: $RESUME_LINE"

  # 3. A hung peer (docker pause: SIGSTOP-like, its sockets stay open) costs one collective
  #    timeout; then attempt 2 resumes and trains to the end.
  a="$RUN_ID-kill-1-0"; b="$RUN_ID-kill-1-1"
  local after=$((RESUMED_STEP + every))
  wait_for 240 bash -c "(( \$(find '$WORK/checkpoints/kill' -maxdepth 1 -name 'step-*' | sed 's/.*step-0*//' | sort -n | tail -n1) >= $after ))" \
    || { docker logs --tail 30 "$a" >&2 2>&1; fail "attempt 1 wrote no checkpoint past step $after within 240 s"; }
  fail_peer kill "$a" "$b" pause
  PAUSE_LINE="$FAIL_LINE"
  say "pause: $PAUSE_LINE"
  resume_attempt kill 2 "$ksteps" to-the-end
  FINISH_LINE="$RESUMED_LINE"
  say "attempt 2: $FINISH_LINE"
}

# fail_peer JOB NODE0 NODE1 kill|pause: fails node 1 while the job trains; node 0 must exit 1
# (retryable) within the collective timeout (10 s). Sets FAIL_LINE.
fail_peer() {
  local job="$1" a="$2" b="$3" how="$4" code detect reason ck before limit
  ck=$(latest_checkpoint_step "$job")
  before=$(docker logs "$a" 2>&1 | grep -oE 'step [0-9]+/' | tail -n1 | grep -oE '[0-9]+' || true)
  if [[ $how == kill ]]; then
    docker kill --signal KILL "$b" >/dev/null
    limit=5
  else
    docker pause "$b" >/dev/null
    limit=15
  fi
  local t_fail; t_fail=$(date +%s.%N)
  code=$(wait_exit "$a" 60)
  # Time to detect, by the engine's clock: from the killed container's end (or the pause) to
  # the survivor's exit.
  local t_end; t_end=$(docker inspect -f '{{.State.FinishedAt}}' "$a")
  [[ $how == kill ]] && t_fail=$(docker inspect -f '{{.State.FinishedAt}}' "$b")
  detect=$(python3 - "$t_fail" "$t_end" <<'PY'
import sys, datetime
def t(s):  # epoch seconds, or RFC 3339 with nanoseconds
    if "T" not in s:
        return float(s)
    head, frac = (s.rstrip("Z").split(".") + ["0"])[:2]
    return datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.timezone.utc).timestamp() + float("0." + frac)
print(f"{t(sys.argv[2]) - t(sys.argv[1]):.2f}")
PY
)
  [[ $code == 1 ]] || { docker logs --tail 30 "$a" >&2 2>&1; fail "after the $how of node 1, node 0 exited $code, not the retryable 1"; }
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)" "$detect" "$limit" \
    || fail "node 0 took $detect s to detect the failed peer ($how) (limit $limit s; collective timeout 10 s)"
  reason=$(head -c 300 "$WORK/term-$(basename "$a" | sed "s/^$RUN_ID-//")")
  FAIL_LINE="node 1 $([[ $how == kill ]] && echo "SIGKILLed" || echo "frozen (docker pause)") at step ~${before:-?} (latest checkpoint $ck): node 0 exited $code after $detect s; its termination message: ${reason:-<none>}"
  docker rm -f "$a" "$b" >/dev/null
}

# resume_attempt JOB ATTEMPT MAXSTEPS [to-the-end]: starts both nodes as ATTEMPT; node 0 must
# resume from a checkpoint (step > 0) and train on (to the end, exit 0, with to-the-end).
# Sets RESUMED_STEP and RESUMED_LINE.
resume_attempt() {
  local job="$1" attempt="$2" steps="$3" end="${4:-}" a b ca cb after
  local ck; ck=$(latest_checkpoint_step "$job")
  a=$(start_rank "$job" "$attempt" 0); b=$(start_rank "$job" "$attempt" 1)
  wait_for 120 bash -c "docker logs '$a' 2>&1 | grep -q 'resuming from checkpoint'" \
    || { docker logs --tail 30 "$a" >&2 2>&1; fail "attempt $attempt did not resume from a checkpoint"; }
  RESUMED_STEP=$(docker logs "$a" 2>&1 | grep 'resuming from checkpoint' | grep -oE 'step=[0-9]+' | sed -n 1p | cut -d= -f2 || true)
  (( ${RESUMED_STEP:-0} > 0 && RESUMED_STEP == ck )) \
    || fail "attempt $attempt resumed from step '${RESUMED_STEP}', not the latest checkpoint $ck"
  if [[ $end == to-the-end ]]; then
    ca=$(wait_exit "$a" 300); cb=$(wait_exit "$b" 60)
    [[ $ca == 0 && $cb == 0 ]] || { docker logs --tail 30 "$a" >&2 2>&1; fail "attempt $attempt exited $ca / $cb"; }
    (( $(latest_checkpoint_step "$job") == steps )) || fail "attempt $attempt left no checkpoint of step $steps"
    RESUMED_LINE="resumed from step $RESUMED_STEP, trained to step $steps/$steps and exited 0 (both nodes)"
    docker rm "$a" "$b" >/dev/null
  else
    wait_for 120 bash -c "docker logs '$a' 2>&1 | grep -oE 'step [0-9]+/$steps' | awk -F'[ /]' '\$2 > $RESUMED_STEP' | grep -q ." \
      || { docker logs --tail 30 "$a" >&2 2>&1; fail "attempt $attempt did not train past step $RESUMED_STEP"; }
    after=$(docker logs "$a" 2>&1 | grep -oE "step [0-9]+/$steps" | tail -n1 || true)
    RESUMED_LINE="resumed from step $RESUMED_STEP (the latest checkpoint), training on (${after})"
  fi
}

# --- main --------------------------------------------------------------------------------------
check_static
ensure_engine
WORK=$(mktemp -d /tmp/ferrotrain-images.XXXXXX)
chmod 755 "$WORK"

# Old images of this tag, replaced by the build, are left dangling: remove them.
docker image prune -f --filter label=org.opencontainers.image.vendor=ferrotrain >/dev/null 2>&1 || true
args=(--tag "$TAG" --mode local)
[[ "${FERROTRAIN_IMAGE_CARGO:-1}" == 0 && -x target/debug/ferrotrain && -x target/debug/ferrotrain-operator ]] && args+=(--no-cargo)
[[ "${FERROTRAIN_TEST_CUDA_IMAGE:-0}" == 1 ]] && args+=(--cuda)
b0=$SECONDS
if [[ "${FERROTRAIN_IMAGE_BUILD:-1}" == 0 ]]; then
  say "FERROTRAIN_IMAGE_BUILD=0: testing the images already tagged $TAG"
else
  say "scripts/images.sh ${args[*]}"
  scripts/images.sh "${args[@]}" 2>&1 | sed 's/^/    /'
fi
BUILD_SECONDS=$((SECONDS - b0))
say "images built in $BUILD_SECONDS s"

check_operator
check_operator_as_the_chart_runs_it
check_trainer_static
if [[ "${FERROTRAIN_TEST_CUDA_IMAGE:-0}" == 1 ]]; then
  check_labels_user "ferrotrain/trainer-cuda:$TAG"
  check_closure "ferrotrain/trainer-cuda:$TAG" /usr/local/bin/ferrotrain
fi
# Containers on a user-defined bridge talk through the FORWARD chain when br_netfilter is
# loaded; dockerd adds ACCEPT rules for its own bridges (its FORWARD policy is DROP), so no
# rule of ours is needed: the run below is the proof.
run_two_containers

printf '\n==> image tests passed in %d s (build %d s)\n' $((SECONDS - T0)) "$BUILD_SECONDS"
printf '    sizes: %s %s MB, %s %s MB\n' "$TRAINER" "$(size_mb "$TRAINER")" "$OPERATOR" "$(size_mb "$OPERATOR")"
printf '    train:     %s\n    kill:      %s\n    attempt 1: %s\n    pause:     %s\n    attempt 2: %s\n' \
  "$TRAIN_LINE" "$KILL_LINE" "$RESUME_LINE" "$PAUSE_LINE" "$FINISH_LINE"
