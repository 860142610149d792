#!/usr/bin/env bash
# The end-to-end suite on a real Kubernetes cluster on this machine (../shared/cluster: a
# v1.36 control plane and real kubelets), in one command: builds the cluster's binaries once
# (or finds them cached), starts it if it does not run, builds the images and loads them into
# the nodes (and the S3 server of e2e/tests/store.rs, once per version: ferrotrain/s3-e2e; the
# PyTorch image of e2e/tests/pytorch.rs, once per content: ferrotrain/pytorch), installs the CRD and the chart as the README tells users, runs e2e/ and prints a table of
# tests and seconds. The cluster stays up afterwards unless --down is given.
#
#   scripts/e2e.sh [--microshift GIT_DIR] [--repeat N] [--filter EXPR] [--down]
#                  [--no-images] [--gates] [--setup-only]
#
#   --microshift DIR  a git directory of openshift/microshift, for the one-time build of the
#                     cluster's binaries (../shared/cluster/build.sh; 5-12 minutes); not needed
#                     once they are cached (~/.cache/ferrotrain-cluster/bin)
#   --repeat N        run the suite N times in a row (finds flakes); a table per run, and the
#                     exit status is non-zero if any run failed
#   --filter EXPR     a nextest filter expression, e.g. 'test(deleting_a_pod)'
#   --down            stop the cluster at the end (down.sh; its state is kept)
#   --no-images       test the images of the last run (no cargo build, no docker build)
#   --gates           (re)start the cluster with the native gang-scheduling API on
#                     (GenericWorkload, GangScheduling, scheduling.k8s.io/v1alpha2)
#   --profile P       cargo profile of the images' binaries (default release; CI uses dev,
#                     which its unit tests have just built); the tests are built with dev
#   --skip-if-no-cluster  exit 0, saying so, when the binaries are not cached (CI)
#   --setup-only      the cluster, images and chart, no test (what bench/operator-scale.sh
#                     and bench/restart-speed.sh measure against)
#
# FERROTRAIN_E2E_PREBUILT=1 (what scripts/test.sh sets, with --profile dev): the workspace's
# binaries and tests were just built from this tree; the images take the binaries as they are
# and the tests are built with the same package selection, so that nothing is built twice.
#
# Needs root (the cluster, Docker). Logs of the cluster's processes: /var/lib/ferrotrain-cluster/logs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$SECONDS

KIT="${FERROTRAIN_CLUSTER_KIT:-$ROOT/../shared/cluster}"
MICROSHIFT="${FERROTRAIN_MICROSHIFT:-}"
REPEAT=1
FILTER=""
DOWN=0
IMAGES=1
GATES=0
SKIP_IF_NO_CLUSTER=0
PROFILE=release
SETUP_ONLY=0
# scripts/test.sh sets FERROTRAIN_E2E_PREBUILT=1: the workspace (binaries and tests, dev
# profile) was just built from this tree, so nothing here builds it again.
PREBUILT="${FERROTRAIN_E2E_PREBUILT:-0}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --microshift) MICROSHIFT="$2"; shift 2 ;;
    --repeat) REPEAT="$2"; shift 2 ;;
    --filter) FILTER="$2"; shift 2 ;;
    --down) DOWN=1; shift ;;
    --no-images) IMAGES=0; shift ;;
    --gates) GATES=1; shift ;;
    --skip-if-no-cluster) SKIP_IF_NO_CLUSTER=1; shift ;;
    --profile) PROFILE="$2"; shift 2 ;;
    --setup-only) SETUP_ONLY=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "e2e.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$REPEAT" =~ ^[1-9][0-9]*$ ]] || { echo "e2e.sh: --repeat must be a positive number, not $REPEAT" >&2; exit 2; }

say() { printf '[e2e %4ds] %s\n' $((SECONDS - T0)) "$*"; }
die() { printf '[e2e %4ds] error: %s\n' $((SECONDS - T0)) "$*" >&2; exit 1; }

[[ -d "$KIT" ]] || die "no cluster kit at $KIT (set FERROTRAIN_CLUSTER_KIT)"
[[ $(id -u) == 0 ]] || die "the cluster and Docker need root"
# shellcheck source=/dev/null
. "$KIT/common.sh"
have_binaries() {
  local b
  for b in mini-etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet pause.c; do
    [[ -e $FTC_BIN/$b ]] || return 1
  done
}

# --- the cluster ----------------------------------------------------------------------------
if ! have_binaries; then
  if [[ -z "$MICROSHIFT" ]]; then
    if [[ $SKIP_IF_NO_CLUSTER == 1 ]]; then
      say "SKIPPED: the cluster's binaries are not cached in $FTC_BIN (build them once with scripts/e2e.sh --microshift GIT_DIR)"
      exit 0
    fi
    die "the cluster's binaries are not in $FTC_BIN: pass --microshift GIT_DIR (a git directory of openshift/microshift) to build them once"
  fi
  say "building the cluster's binaries from $MICROSHIFT (once; 5-12 minutes)"
  "$KIT/build.sh" "$MICROSHIFT"
fi
if [[ $GATES == 1 ]]; then
  export FTC_FEATURE_GATES="${FTC_FEATURE_GATES:-GenericWorkload=true,GangScheduling=true}"
  export FTC_RUNTIME_CONFIG="${FTC_RUNTIME_CONFIG:-scheduling.k8s.io/v1alpha2=true}"
fi
# Gates apply as the components start: a running cluster with other gates is restarted.
gates_file="$FTC_DIR/run/ferrotrain-e2e-gates"
want_gates="${FTC_FEATURE_GATES:-}|${FTC_RUNTIME_CONFIG:-}"
if running kube-apiserver && [[ "$(cat "$gates_file" 2>/dev/null || echo '|')" != "$want_gates" ]]; then
  say "restarting the cluster for feature gates '$want_gates'"
  "$KIT/down.sh" >/dev/null
fi
cluster_started=$SECONDS
# The kit's up.sh can start a kubelet before its containerd serves CRI ("server is not
# initialized yet") and then times out waiting for the kubelets; a second up.sh brings them
# up (seen after down.sh/up.sh on this project's machine; reported to the kit's maintainers).
# Once, and said: a cluster that does not come up twice fails the run.
if ! "$KIT/up.sh" >/dev/null; then
  say "the cluster kit's up.sh failed (above); starting it once more"
  "$KIT/up.sh" >/dev/null
fi
mkdir -p "$FTC_DIR/run" && echo "$want_gates" > "$gates_file"
export KUBECONFIG="$ADMIN_KUBECONFIG"
say "cluster up in $((SECONDS - cluster_started)) s (KUBECONFIG=$KUBECONFIG)"
cleanup() { if [[ $DOWN == 1 ]]; then "$KIT/down.sh" >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT

HELM="$(scripts/setup-helm.sh | tail -n1)"

# --- the disk the kubelets measure ----------------------------------------------------------
# The kit's kubelets evict every pod when the disk under $FTC_DIR has less free than their
# evictionHard nodefs.available (2% of the disk): the disk is the machine's, shared with
# cargo's target/ and Docker. The images and the suite's checkpoints need ~3 GiB more. Below
# that the chart's operator is evicted as it starts (CI once failed so: "UPGRADE FAILED ...
# Available: 0/2" after 5 minutes): say so now, with the numbers.
check_disk() {
  local percent size avail need
  percent=$(sed -n 's/.*nodefs\.available: *\([0-9]*\)%.*/\1/p' "$FTC_DIR"/nodes/*/kubelet.yaml | sort -n | tail -n1)
  read -r size avail < <(df -B1 --output=size,avail "$FTC_DIR" | tail -n1)
  need=$(( size / 100 * ${percent:-0} + 3 * 1024 * 1024 * 1024 ))
  if (( avail < need )); then
    die "the disk under $FTC_DIR has $((avail >> 20)) MiB free; the kubelets evict every pod below ${percent:-0}% of it and the suite needs 3 GiB more: $((need >> 20)) MiB. Free space (cargo's target/, docker images) and run again"
  fi
}
check_disk
# The cluster's own kubectl matches its API server (the tests' `kubectl auth can-i` too).
export PATH="$FTC_BIN:$(dirname "$HELM"):$PATH"

# --- images ---------------------------------------------------------------------------------
# A tag of the tree's content: a changed tree gets a new tag (pods with pullPolicy Never would
# otherwise run what an earlier run loaded), an unchanged one reuses the loaded images.
tree_tag() {
  local diff
  diff=$( (echo "$PROFILE"; git diff HEAD -- operator api launch trainer Cargo.lock docker; git ls-files --others --exclude-standard -- operator api launch trainer docker | xargs -r cat) 2>/dev/null | sha256sum | cut -c1-8)
  echo "e2e-$(git rev-parse --short HEAD)-$diff"
}
TAG_FILE="$FTC_DIR/run/ferrotrain-e2e-tag"
if [[ $IMAGES == 1 ]]; then
  TAG=$(tree_tag)
  . scripts/lib/docker-engine.sh
  ensure_docker_engine || die "$DOCKER_ENGINE_ERROR"
  images_started=$SECONDS
  . scripts/env.sh
  images_log="$FTC_DIR/logs/ferrotrain-e2e-images.log"
  # PREBUILT: the binaries scripts/test.sh's tests just built, as they are (a cargo build of
  # two packages alone would unify features differently and build their dependencies again).
  no_cargo=()
  [[ $PREBUILT == 1 ]] && no_cargo=(--no-cargo)
  if ! scripts/images.sh --mode local --tag "$TAG" --profile "$PROFILE" "${no_cargo[@]}" \
    >"$images_log" 2>&1; then
    tail -n 40 "$images_log" >&2
    die "building the images failed (log: $images_log)"
  fi
  "$KIT/load-image.sh" "ferrotrain/operator:$TAG" "ferrotrain/trainer:$TAG" 2>/dev/null
  echo "$TAG" > "$TAG_FILE"
  say "images ferrotrain/{operator,trainer}:$TAG built and loaded in $((SECONDS - images_started)) s"
else
  TAG=$(cat "$TAG_FILE" 2>/dev/null) || die "--no-images: no earlier run's images (run without it once)"
  say "images of the last run: $TAG"
fi

# --- the S3 server of e2e/tests/store.rs ------------------------------------------------------
# A test fixture tagged with its version (docker/versions.env), not with the tree: built once
# (s3s-fs from crates.io into the tool cache, 3-5 minutes on two cores, then its image), also
# with --no-images when missing; loaded into the nodes that lack it. A later run finds both
# and costs about a second.
S3_VERSION=$(. docker/versions.env && echo "$S3S_FS_VERSION")
S3_IMAGE="ferrotrain/s3-e2e:$S3_VERSION"
s3_started=$SECONDS
s3_did=""
. scripts/lib/docker-engine.sh
ensure_docker_engine || die "$DOCKER_ENGINE_ERROR"
if ! docker image inspect "$S3_IMAGE" >/dev/null 2>&1; then
  s3_log="$FTC_DIR/logs/ferrotrain-e2e-s3-image.log"
  if ! scripts/images.sh --mode local --only s3-e2e --tag "$S3_VERSION" >"$s3_log" 2>&1; then
    tail -n 40 "$s3_log" >&2
    die "building $S3_IMAGE failed (log: $s3_log)"
  fi
  s3_did="built"
fi
# Whether every running node's containerd holds IMAGE (after a build, load it anyway: a node
# may hold an image of that tag from before it).
images_on_nodes() {
  local node_dir
  for node_dir in "$FTC_DIR"/nodes/*/; do
    running "containerd-$(basename "$node_dir")" || continue
    ctr --address "$node_dir/containerd.sock" -n k8s.io images ls -q "name==docker.io/$1" \
      | grep -q . || return 1
  done
}
if [[ -n $s3_did ]] || ! images_on_nodes "$S3_IMAGE"; then
  "$KIT/load-image.sh" "$S3_IMAGE" 2>/dev/null
  s3_did="${s3_did:+$s3_did and }loaded"
fi
export FERROTRAIN_E2E_S3_IMAGE="$S3_IMAGE"
say "S3 server image $S3_IMAGE ${s3_did:-already built and loaded} in $((SECONDS - s3_started)) s"

# --- ferrotrain/pytorch, the image of e2e/tests/pytorch.rs ------------------------------------
# Tagged by what goes into it (the launcher's crates, the Python package, the example, the
# Dockerfiles and the torch layout's scripts, the profile), not by the whole tree: built only
# when missing, also with --no-images (its 1.4 GB base once per torch version, about 3
# minutes; then the launcher's layer, seconds), and loaded into the nodes that lack it (about
# 50 s for 1.4 GB). A run that changed none of it costs about a second.
pytorch_tag() {
  { echo "$PROFILE"
    git ls-files -co --exclude-standard -- launch api python examples/pytorch Cargo.lock Cargo.toml \
      docker/pytorch.Dockerfile docker/pytorch-base.Dockerfile docker/versions.env \
      scripts/setup-pytorch.sh scripts/setup-libtorch.sh scripts/lib/cuda_stubs.py scripts/images.sh \
      | sort | while read -r f; do [[ -f $f ]] && sha256sum "$f"; done
  } | sha256sum | cut -c1-8
}
PYTORCH_IMAGE="ferrotrain/pytorch:e2e-$(pytorch_tag)"
pytorch_started=$SECONDS
pytorch_did=""
if ! docker image inspect "$PYTORCH_IMAGE" >/dev/null 2>&1; then
  pytorch_log="$FTC_DIR/logs/ferrotrain-e2e-pytorch-image.log"
  # Cargo builds the launcher for musl (target/x86_64-unknown-linux-musl, which the tests'
  # build does not make), also under FERROTRAIN_E2E_PREBUILT: a binary left there by an
  # earlier tree would not be what the tag says.
  if ! scripts/images.sh --mode local --only pytorch --tag "${PYTORCH_IMAGE#*:}" --profile "$PROFILE" \
      >"$pytorch_log" 2>&1; then
    tail -n 40 "$pytorch_log" >&2
    die "building $PYTORCH_IMAGE failed (log: $pytorch_log)"
  fi
  pytorch_did="built"
fi
if [[ -n $pytorch_did ]] || ! images_on_nodes "$PYTORCH_IMAGE"; then
  "$KIT/load-image.sh" "$PYTORCH_IMAGE" 2>/dev/null
  pytorch_did="${pytorch_did:+$pytorch_did and }loaded"
fi
export FERROTRAIN_E2E_PYTORCH_IMAGE="$PYTORCH_IMAGE"
say "PyTorch image $PYTORCH_IMAGE ${pytorch_did:-already built and loaded} in $((SECONDS - pytorch_started)) s"

. scripts/lib/keep-images.sh
keep_images "$TAG" "$S3_IMAGE" "$PYTORCH_IMAGE"
# Earlier runs' tags of the images this script builds leave Docker: each changed tree adds
# a tag (a trainer and, when its inputs change, a 1.4 GB PyTorch image), and the disk is the
# one the kubelets' eviction threshold measures (check_disk). CI once failed there with 5.4
# GB free. Docker's build cache stays, so a rebuild of a removed tag costs seconds.
docker images --format '{{.Repository}}:{{.Tag}}' \
  | grep -E '^ferrotrain/(operator|trainer|pytorch):e2e-' \
  | grep -vxF -e "ferrotrain/operator:$TAG" -e "ferrotrain/trainer:$TAG" -e "$PYTORCH_IMAGE" \
  | xargs -r docker rmi >/dev/null 2>&1 || true

# --- the CRD and the chart, as the README installs them --------------------------------------
install_started=$SECONDS
# Helm installs crds/ only on the first install: the CRD is applied first, as docs/install.md's
# upgrade says (the new operator may write fields only the new CRD has).
kubectl apply --server-side --force-conflicts -f crds/distributedtrainings.yaml >/dev/null
# Why the operator did not become ready: the nodes' pressure conditions, its pods and events.
explain_install() {
  kubectl get nodes -o custom-columns='NODE:.metadata.name,CONDITIONS:.status.conditions[?(@.status=="True")].type' >&2 || true
  kubectl -n ferrotrain-system get pods -o wide >&2 || true
  kubectl -n ferrotrain-system get events --sort-by=.lastTimestamp 2>/dev/null | tail -n 15 >&2 || true
  die "the chart did not install (above: the nodes' conditions, the operator's pods and events)"
}
helm upgrade --install ferrotrain charts/ferrotrain -n ferrotrain-system --create-namespace \
  --set image.tag="$TAG" --set image.pullPolicy=Never --set trainerImage.tag="$TAG" \
  --wait --timeout 5m >/dev/null || explain_install
kubectl -n ferrotrain-system rollout status deployment/ferrotrain --timeout=5m >/dev/null
say "chart installed in $((SECONDS - install_started)) s"
if [[ $SETUP_ONLY == 1 ]]; then
  say "set up: images ferrotrain/{operator,trainer}:$TAG, the chart; KUBECONFIG=$KUBECONFIG"
  exit 0
fi

# --- the suite ------------------------------------------------------------------------------
# Test namespaces an earlier run left behind (killed before its tests cleaned up: a CI
# timeout, ^C) would go on training beside this run's jobs.
kubectl delete namespace -l ferrotrain.dev/e2e=true --wait=false >/dev/null
# e2e/tests/prometheus.rs runs Debian's Prometheus on this host against the cluster.
if ! command -v prometheus >/dev/null; then
  say "installing prometheus (Debian's package) for e2e/tests/prometheus.rs"
  { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 \
      apt-get install -y -qq --no-install-recommends prometheus; } >/tmp/ferrotrain-apt-prometheus.log 2>&1 \
    || { tail -n 20 /tmp/ferrotrain-apt-prometheus.log >&2; die "apt-get install prometheus failed"; }
fi
# e2e/tests/cli.rs runs `kubectl ferrotrain watch` in a real terminal: tmux's.
if ! command -v tmux >/dev/null; then
  say "installing tmux (Debian's package) for e2e/tests/cli.rs"
  { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 \
      apt-get install -y -qq --no-install-recommends tmux; } >/tmp/ferrotrain-apt-tmux.log 2>&1 \
    || { tail -n 20 /tmp/ferrotrain-apt-tmux.log >&2; die "apt-get install tmux failed"; }
fi
. scripts/env.sh >/dev/null
export FERROTRAIN_E2E_IMAGE="ferrotrain/trainer:$TAG"
say "compiling the e2e tests"
# The tests themselves only talk to the API server: the dev profile (what the unit tests
# built) whatever the images' profile. With PREBUILT (scripts/test.sh) the whole workspace's
# tests were just built: selecting the same packages lets cargo reuse them, where
# ferrotrain-e2e alone unifies its dependencies' features differently and builds them again
# (236 s on two cores).
if [[ $PREBUILT == 1 ]]; then
  SELECT=(--workspace)
else
  SELECT=(-p ferrotrain-e2e)
fi
EXPR='package(ferrotrain-e2e)'
[[ -z "$FILTER" ]] || EXPR="$EXPR & ($FILTER)"
NEXTEST=(cargo nextest run "${SELECT[@]}" --run-ignored only --profile e2e -E "$EXPR")
"${NEXTEST[@]}" --no-run >/dev/null 2>&1 || "${NEXTEST[@]}" --no-run
JUNIT="$ROOT/target/nextest/e2e/junit.xml"
failed_runs=0
for run in $(seq "$REPEAT"); do
  say "run $run of $REPEAT"
  rm -f "$JUNIT"
  run_started=$SECONDS
  status=0
  "${NEXTEST[@]}" || status=$?
  if [[ $status != 0 ]]; then
    failed_runs=$((failed_runs + 1))
    echo "==> operator log (run $run failed)"
    kubectl -n ferrotrain-system logs deployment/ferrotrain --tail=200 || true
  fi
  # Last, so that a log cut to its tail (CI's) still shows the table and why each test failed.
  python3 scripts/lib/junit-table.py "$JUNIT" "run $run of $REPEAT" $((SECONDS - run_started)) \
    || true
done
say "$((REPEAT - failed_runs)) of $REPEAT runs passed; $((SECONDS - T0)) s in all"
[[ $failed_runs == 0 ]]
