#!/usr/bin/env bash
# Builds the container images: ferrotrain/trainer, ferrotrain/operator and (with --cuda)
# ferrotrain/trainer-cuda, all with one tag. See docs/images.md. Only when named in --only:
# ferrotrain/pytorch (the launcher with PyTorch for Python on the CPU, for spec.pytorch; on
# ferrotrain/pytorch-base, which is tagged by its torch version and built only when missing),
# and ferrotrain/s3-e2e, the end-to-end tests' S3 server (s3s-fs; never a product image).
#
#   scripts/images.sh [--tag TAG] [--mode local|source] [--cuda] [--only LIST]
#                     [--profile dev|release] [--no-cargo]
#
#   --tag TAG       image tag (env TAG; default dev)
#   --mode local    binaries built on this machine with cargo, copied into a Debian base made
#                   here with debootstrap from this machine's apt mirror: needs a Rust
#                   toolchain, debootstrap and root, but no image registry (what CI uses)
#   --mode source   everything compiled inside `docker build` from the Dockerfiles'
#                   multi-stage form (rust and debian images from Docker Hub): a laptop, a
#                   release pipeline
#                   (env FERROTRAIN_IMAGE_MODE; default: local where debootstrap can run, else
#                   source)
#   --cuda          also build ferrotrain/trainer-cuda (the CUDA libtorch from torch's
#                   nvidia-* wheels: about 3.5 GB to download, a 4 GB image)
#   --only LIST     comma-separated subset of trainer,operator,trainer-cuda,pytorch,
#                   pytorch-base,s3-e2e
#   --profile P     cargo profile of the binaries (env FERROTRAIN_IMAGE_PROFILE; default dev in
#                   local mode, the tests' build; release in source mode)
#   --no-cargo      local mode: take the binaries already in target/ as they are
#
# Versions live in docker/versions.env (images) and scripts/setup-libtorch.sh (PyTorch);
# FERROTRAIN_RUST_IMAGE / FERROTRAIN_BASE_IMAGE replace the source mode's base images (e.g.
# with copies in your own registry).
# Prints each image's size and build time at the end; the last line is `images: <refs>`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# shellcheck source=/dev/null
. docker/versions.env
# A mirror of the base images (a release pipeline's own registry) replaces them here.
RUST_IMAGE="${FERROTRAIN_RUST_IMAGE:-$RUST_IMAGE}"
BASE_IMAGE="${FERROTRAIN_BASE_IMAGE:-$BASE_IMAGE}"

TAG="${TAG:-dev}"
MODE="${FERROTRAIN_IMAGE_MODE:-auto}"
PROFILE="${FERROTRAIN_IMAGE_PROFILE:-}"
ONLY="trainer,operator"
CUDA=0
CARGO=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tag) TAG="$2"; shift 2 ;;
    --tag=*) TAG="${1#*=}"; shift ;;
    --mode) MODE="$2"; shift 2 ;;
    --mode=*) MODE="${1#*=}"; shift ;;
    --cuda) CUDA=1; shift ;;
    --only) ONLY="$2"; shift 2 ;;
    --only=*) ONLY="${1#*=}"; shift ;;
    --profile) PROFILE="$2"; shift 2 ;;
    --profile=*) PROFILE="${1#*=}"; shift ;;
    --release) PROFILE=release; shift ;;
    --no-cargo) CARGO=0; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "images.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $CUDA == 1 && ",$ONLY," != *,trainer-cuda,* ]] && ONLY="$ONLY,trainer-cuda"
IFS=, read -r -a IMAGES <<<"$ONLY"
for image in "${IMAGES[@]}"; do
  case "$image" in trainer|operator|trainer-cuda|pytorch|pytorch-base|s3-e2e) ;; *)
    echo "images.sh: unknown image $image (trainer, operator, trainer-cuda, pytorch, pytorch-base, s3-e2e)" >&2; exit 2 ;;
  esac
done
if [[ ! "$TAG" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]]; then
  echo "images.sh: invalid tag '$TAG'" >&2; exit 2
fi

log() { printf 'images.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

if [[ "$MODE" == auto ]]; then
  # Local where debootstrap runs or apt can install it (ensure_local_base does).
  if [[ $(id -u) == 0 ]] && command -v cargo >/dev/null \
    && { command -v debootstrap || command -v apt-get; } >/dev/null; then
    MODE=local
  else
    MODE=source
  fi
fi
case "$MODE" in local|source) ;; *) die "--mode must be local or source, not $MODE" ;; esac
[[ -n "$PROFILE" ]] || { [[ $MODE == local ]] && PROFILE=dev || PROFILE=release; }
profile_dir() { [[ "$1" == dev ]] && echo debug || echo "$1"; }

command -v docker >/dev/null || die "docker is required"
docker info >/dev/null 2>&1 || die "no Docker engine answers (start dockerd, or see docs/images.md)"

# The Dockerfiles need BuildKit (it also skips the stages a build does not use, so the local
# mode never pulls the Rust image). Docker >= 23 has it through buildx; Debian's docker.io
# (20.10) client has it built in behind DOCKER_BUILDKIT=1.
BUILD=()
if docker buildx version >/dev/null 2>&1; then
  BUILD=(docker buildx build --load)
else
  while read -r client; do
    version=$("$client" version --format '{{.Client.Version}}' 2>/dev/null || true)
    if [[ "$version" =~ ^([0-9]+)\. ]] && (( BASH_REMATCH[1] < 23 )); then
      BUILD=(env DOCKER_BUILDKIT=1 "$client" build)
      break
    fi
  done < <(type -ap docker)
fi
[[ ${#BUILD[@]} -gt 0 ]] || die "BuildKit is needed: install docker-buildx (or Debian's docker.io, whose client has it built in)"
log "mode $MODE, profile $PROFILE, tag $TAG, builder: ${BUILD[*]}"

REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null || true)" ]]; then
  REVISION="$REVISION-dirty"
fi
# The commit's time, not the build's: the same commit gives the same labels.
CREATED=$(git log -1 --format=%cI 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)
COMMON_ARGS=(--progress=plain
  --build-arg "RUST_IMAGE=$RUST_IMAGE"
  --build-arg "VERSION=$TAG" --build-arg "REVISION=$REVISION" --build-arg "CREATED=$CREATED")

# --- local mode: a Debian base made here --------------------------------------------------
# The mirror comes from this machine's apt configuration (one-line or deb822 sources), or
# from FERROTRAIN_DEBIAN_MIRROR; nothing in the repository names a mirror.
debian_mirror() {
  if [[ -n "${FERROTRAIN_DEBIAN_MIRROR:-}" ]]; then echo "$FERROTRAIN_DEBIAN_MIRROR"; return; fi
  python3 - "$DEBIAN_SUITE" <<'PY'
import glob, sys
suite = sys.argv[1]
entries = []  # (uri, suites)
for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        words = line.split("#", 1)[0].split()
        if len(words) < 3 or words[0] != "deb":
            continue
        words = words[1:]
        if words[0].startswith("["):
            while not words[0].endswith("]"):
                words.pop(0)
            words.pop(0)
        entries.append((words[0], [words[1]]))
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    try:
        text = open(path).read()
    except OSError:
        continue
    for para in text.split("\n\n"):
        fields = {}
        for line in para.splitlines():
            if line.startswith("#") or ":" not in line or line[0].isspace():
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.split()
        if "deb" in fields.get("types", []) and fields.get("enabled", ["yes"])[0] != "no":
            for uri in fields.get("uris", []):
                entries.append((uri, fields.get("suites", [])))
for uri, suites in entries:
    if suite in suites:
        print(uri); sys.exit(0)
for uri, suites in entries:  # a Debian host of another release: its main archive serves ours
    if uri.rstrip("/").endswith("/debian"):
        print(uri); sys.exit(0)
sys.exit(1)
PY
}

LOCAL_BASE="ferrotrain-local/debian:$DEBIAN_SUITE-minbase"
# The pytorch images' base: the same with Debian's Python 3.11 (torch's wheel is cp311).
LOCAL_PYTHON_BASE="ferrotrain-local/debian:$DEBIAN_SUITE-python3"
ROOTFS=
trap '[[ -z "$ROOTFS" ]] || rm -rf "$ROOTFS" "$ROOTFS.log"' EXIT
# ensure_local_base [IMAGE PACKAGES]: the minbase image, or IMAGE with PACKAGES (comma list).
ensure_local_base() {
  local LOCAL_BASE="${1:-$LOCAL_BASE}" include="ca-certificates${2:+,$2}"
  if docker image inspect "$LOCAL_BASE" >/dev/null 2>&1 && [[ "${FERROTRAIN_REBUILD_BASE:-0}" != 1 ]]; then
    log "base image $LOCAL_BASE exists (FERROTRAIN_REBUILD_BASE=1 remakes it)"
    return
  fi
  [[ $(id -u) == 0 ]] || die "debootstrap needs root; run as root or use --mode source"
  if ! command -v debootstrap >/dev/null && command -v apt-get >/dev/null; then
    log "installing debootstrap (the local mode's base image)"
    { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 \
        apt-get install -y -qq debootstrap; } >/dev/null 2>&1 || log "could not install debootstrap"
  fi
  command -v debootstrap >/dev/null || die "local mode needs debootstrap (apt-get install debootstrap), or use --mode source"
  local mirror rootfs started
  mirror=$(debian_mirror) || die "no Debian mirror in /etc/apt/sources*; set FERROTRAIN_DEBIAN_MIRROR"
  rootfs=$(mktemp -d /tmp/ferrotrain-rootfs.XXXXXX)
  ROOTFS="$rootfs"
  started=$SECONDS
  log "debootstrap $DEBIAN_SUITE (minbase + $include) from $mirror"
  debootstrap --variant=minbase --include="$include" "$DEBIAN_SUITE" "$rootfs" "$mirror" \
    >"$rootfs.log" 2>&1 || { tail -n 30 "$rootfs.log" >&2; rm -f "$rootfs.log"; die "debootstrap failed"; }
  rm -f "$rootfs.log"
  # What debian:*-slim leaves out too: docs, man pages, locales, package caches.
  rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/* "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/* "$rootfs"/tmp/* 2>/dev/null || true
  tar --numeric-owner -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    --message "debootstrap --variant=minbase --include=$include $DEBIAN_SUITE" - "$LOCAL_BASE" >/dev/null
  rm -rf "$rootfs"
  ROOTFS=
  log "base image $LOCAL_BASE made in $((SECONDS - started)) s"
}

# Strips debug info (the symbol table stays, for backtraces) while copying into the context.
stage_binary() {
  local src="$1" dest="$2"
  [[ -x "$src" ]] || die "$src is missing (build it, or drop --no-cargo)"
  mkdir -p "$(dirname "$dest")"
  objcopy --strip-debug "$src" "$dest"
}

# Lays out libtorch's libraries in the context: hard links when the cache is on the same file
# system (instant), copies otherwise.
stage_libtorch() {
  local libtorch="$1" dest="$2"
  mkdir -p "$dest"
  cp -al "$libtorch/lib/." "$dest/" 2>/dev/null || cp -a "$libtorch/lib/." "$dest/"
}

cargo_build() {
  [[ $CARGO == 1 ]] || return 0
  log "cargo build --profile $PROFILE $*"
  cargo build --profile "$PROFILE" "$@" >&2
}

# ferrotrain/pytorch-base's tag: its torch version and a digest of what lays it out, so a
# change to either builds it again and nothing else does.
PYTORCH_BASE_TAG="$(scripts/setup-libtorch.sh --print-version)-py311-$(cat scripts/setup-pytorch.sh \
  scripts/lib/cuda_stubs.py docker/pytorch-base.Dockerfile docker/versions.env | sha256sum | cut -c1-8)"
image_ref() {
  if [[ "$1" == pytorch-base ]]; then echo "ferrotrain/pytorch-base:$PYTORCH_BASE_TAG"; else echo "ferrotrain/$1:$TAG"; fi
}

declare -A BUILD_SECONDS=()
build_image() {
  local image="$1"; shift
  local started=$SECONDS ref
  ref=$(image_ref "$image")
  log "building $ref"
  "${BUILD[@]}" "${COMMON_ARGS[@]}" -t "$ref" "$@" >&2
  BUILD_SECONDS[$image]=$((SECONDS - started))
}

# The launcher for any Linux image: static, musl (a glibc build needs glibc 2.34). Built also
# with --no-cargo when missing: the tests' build (what --no-cargo takes) has no musl target.
build_static_launcher() {
  local bin
  bin="${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-musl/$(profile_dir "$PROFILE")/ferrotrain-launch"
  if [[ $CARGO == 1 || ! -x "$bin" ]]; then
    rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl \
      || rustup target add x86_64-unknown-linux-musl >&2
    log "cargo build --profile $PROFILE --target x86_64-unknown-linux-musl -p ferrotrain-launch"
    cargo build --profile "$PROFILE" --target x86_64-unknown-linux-musl -p ferrotrain-launch \
      --bin ferrotrain-launch >&2
  fi
  echo "$bin"
}

# The example's text (gpt.py's --data): Multi30k's English training captions, 569 KB, from
# $FERROTRAIN_MULTI30K_DIR or ../shared/data/multi30k, else downloaded; checked by its sha256.
MULTI30K_TRAIN_EN_URL=https://github.com/multi30k/dataset/raw/master/data/task1/raw/train.en.gz
MULTI30K_TRAIN_EN_SHA256=d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f
example_text() {
  local src="${FERROTRAIN_MULTI30K_DIR:-$ROOT/../shared/data/multi30k}/train.en.gz"
  if [[ -f "$src" ]]; then
    cp "$src" "$1"
  else
    log "downloading $MULTI30K_TRAIN_EN_URL (no $src)"
    curl -fsSL -o "$1" "$MULTI30K_TRAIN_EN_URL" || die "cannot download Multi30k's train.en.gz: set FERROTRAIN_MULTI30K_DIR to a directory holding it"
  fi
  echo "$MULTI30K_TRAIN_EN_SHA256  $1" | sha256sum -c --quiet - >&2 || die "$src is not Multi30k's train.en.gz (sha256)"
}

# Local mode fetches nothing while building (the base and the binaries are made here): its RUN
# steps get no network, so a Docker engine without a bridge network (dockerd --bridge=none)
# builds them too.
LOCAL_ARGS=(--network=none)

build_local() {
  local image="$1" ctx="$ROOT/target/images/$1" libtorch bin
  rm -rf "$ctx"
  mkdir -p "$ctx/prebuilt/bin"
  case "$image" in
    trainer)
      libtorch=$(scripts/setup-libtorch.sh | tail -n1)
      LIBTORCH="$libtorch" cargo_build -p ferrotrain-trainer
      bin="${CARGO_TARGET_DIR:-target}/$(profile_dir "$PROFILE")/ferrotrain"
      stage_binary "$bin" "$ctx/prebuilt/bin/ferrotrain"
      stage_libtorch "$libtorch" "$ctx/prebuilt/lib"
      build_image trainer -f docker/trainer.Dockerfile --build-arg BINARIES=prebuilt \
        --build-arg "BASE_IMAGE=$LOCAL_BASE" --build-arg LIBTORCH_VARIANT=cpu "${LOCAL_ARGS[@]}" "$ctx"
      ;;
    trainer-cuda)
      libtorch=$(scripts/setup-libtorch.sh --cuda | tail -n1)
      # A target directory of its own: pointing the shared one at another LIBTORCH would
      # rebuild torch-sys and everything above it for every other build.
      local target="${FERROTRAIN_CUDA_TARGET_DIR:-$ROOT/target/cuda}"
      LIBTORCH="$libtorch" CARGO_TARGET_DIR="$target" cargo_build -p ferrotrain-trainer --features cuda
      bin="$target/$(profile_dir "$PROFILE")/ferrotrain"
      readelf -d "$bin" | grep -q 'NEEDED.*\[libtorch_cuda\.so\]' \
        || die "$bin does not link libtorch_cuda.so (trainer/build.rs links it with the cuda feature)"
      stage_binary "$bin" "$ctx/prebuilt/bin/ferrotrain"
      stage_libtorch "$libtorch" "$ctx/prebuilt/lib"
      build_image trainer-cuda -f docker/trainer.Dockerfile --build-arg BINARIES=prebuilt \
        --build-arg "BASE_IMAGE=$LOCAL_BASE" --build-arg LIBTORCH_VARIANT=cuda "${LOCAL_ARGS[@]}" "$ctx"
      ;;
    operator)
      cargo_build -p ferrotrain-operator
      stage_binary "${CARGO_TARGET_DIR:-target}/$(profile_dir "$PROFILE")/ferrotrain-operator" "$ctx/prebuilt/bin/ferrotrain-operator"
      build_image operator -f docker/operator.Dockerfile --build-arg BINARIES=prebuilt \
        --build-arg "BASE_IMAGE=$LOCAL_BASE" "${LOCAL_ARGS[@]}" "$ctx"
      ;;
    pytorch-base)
      ensure_local_base "$LOCAL_PYTHON_BASE" python3
      local site
      site=$(scripts/setup-pytorch.sh | tail -n1)
      mkdir -p "$ctx/prebuilt/python"
      cp -al "$site/." "$ctx/prebuilt/python/" 2>/dev/null || cp -a "$site/." "$ctx/prebuilt/python/"
      # Headers are for building extensions, which this image does not.
      rm -rf "$ctx/prebuilt/python/torch/include"
      build_image pytorch-base -f docker/pytorch-base.Dockerfile --build-arg BINARIES=prebuilt \
        --build-arg "BASE_IMAGE=$LOCAL_PYTHON_BASE" "${LOCAL_ARGS[@]}" "$ctx"
      rm -rf "$ctx"
      ;;
    pytorch)
      if ! docker image inspect "$(image_ref pytorch-base)" >/dev/null 2>&1; then
        build_local pytorch-base
      fi
      bin=$(build_static_launcher | tail -n1)
      stage_binary "$bin" "$ctx/prebuilt/bin/ferrotrain-launch"
      mkdir -p "$ctx/prebuilt/python" "$ctx/prebuilt/examples"
      cp -a python/ferrotrain "$ctx/prebuilt/python/ferrotrain"
      find "$ctx/prebuilt/python" -name __pycache__ -prune -exec rm -rf {} +
      cp examples/pytorch/gpt.py "$ctx/prebuilt/examples/gpt.py"
      mkdir -p "$ctx/prebuilt/examples/data"
      example_text "$ctx/prebuilt/examples/data/train.en.gz"
      build_image pytorch -f docker/pytorch.Dockerfile --build-arg BINARIES=prebuilt \
        --build-arg "PYTORCH_BASE=$(image_ref pytorch-base)" "${LOCAL_ARGS[@]}" "$ctx"
      ;;
    s3-e2e)
      # A tool of the tests, built once into the cache (not from this workspace).
      bin=$(scripts/setup-s3s-fs.sh | tail -n1)
      stage_binary "$bin" "$ctx/prebuilt/bin/s3s-fs"
      build_image s3-e2e -f docker/s3-e2e.Dockerfile --build-arg BINARIES=prebuilt \
        --build-arg "BASE_IMAGE=$LOCAL_BASE" "${LOCAL_ARGS[@]}" "$ctx"
      ;;
  esac
}

build_source() {
  local image="$1"
  local args=(--build-arg BINARIES=source --build-arg "BASE_IMAGE=$BASE_IMAGE"
              --build-arg "CARGO_PROFILE=$PROFILE")
  case "$image" in
    trainer) build_image trainer -f docker/trainer.Dockerfile "${args[@]}" \
               --build-arg LIBTORCH_VARIANT=cpu --build-arg CARGO_FEATURES= . ;;
    trainer-cuda) build_image trainer-cuda -f docker/trainer.Dockerfile "${args[@]}" \
               --build-arg LIBTORCH_VARIANT=cuda --build-arg CARGO_FEATURES=cuda . ;;
    operator) build_image operator -f docker/operator.Dockerfile "${args[@]}" . ;;
    s3-e2e) build_image s3-e2e -f docker/s3-e2e.Dockerfile "${args[@]}" \
               --build-arg "S3S_FS_VERSION=$S3S_FS_VERSION" . ;;
    pytorch-base) build_image pytorch-base -f docker/pytorch-base.Dockerfile --build-arg BINARIES=source \
               --build-arg "BASE_IMAGE=${FERROTRAIN_PYTHON_BASE_IMAGE:-python:3.11-slim-bookworm}" . ;;
    pytorch)
      docker image inspect "$(image_ref pytorch-base)" >/dev/null 2>&1 || build_source pytorch-base
      build_image pytorch -f docker/pytorch.Dockerfile --build-arg BINARIES=source \
               --build-arg "CARGO_PROFILE=$PROFILE" --build-arg "PYTORCH_BASE=$(image_ref pytorch-base)" . ;;
  esac
}

started=$SECONDS
if [[ $MODE == local ]]; then
  command -v objcopy >/dev/null || die "local mode needs objcopy (binutils)"
  ensure_local_base
  # The trainer's libtorch and cargo's environment (the same as the tests').
  # shellcheck source=/dev/null
  . scripts/env.sh
fi
for image in "${IMAGES[@]}"; do
  "build_$MODE" "$image"
done

printf '\n%-44s %10s %8s\n' IMAGE SIZE BUILD >&2
refs=()
for image in "${IMAGES[@]}"; do
  ref=$(image_ref "$image")
  bytes=$(docker image inspect -f '{{.Size}}' "$ref")
  printf '%-44s %7d MB %6d s\n' "$ref" $((bytes / 1000000)) "${BUILD_SECONDS[$image]:-0}" >&2
  refs+=("$ref")
done
log "done in $((SECONDS - started)) s"
echo "images: ${refs[*]}"
