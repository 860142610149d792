#!/usr/bin/env bash
# Fetches the libtorch that tch 0.24.0 needs (PyTorch 2.11.0) from PyPI wheels and lays it out
# as a LIBTORCH directory (include/ + lib/) under a versioned cache outside the repo.
# Idempotent: a complete cache (marked by .complete) is reused. Prints the LIBTORCH path on its
# last line.
#
#   scripts/setup-libtorch.sh            # CPU: libtorch_cpu + libc10 (+ the two small CUDA
#                                        # runtime libraries libtorch_cpu links), ~440 MB
#   scripts/setup-libtorch.sh --cuda     # GPU: every library of the torch wheel and of its
#                                        # nvidia-* wheels (cuBLAS, cuDNN, NCCL, ...), several GB
#   FERROTRAIN_LIBTORCH_VARIANT=cuda scripts/setup-libtorch.sh   # the same as --cuda
#   scripts/setup-libtorch.sh --cuda --plan   # fetch only the torch wheel and print what the
#                                        # layout would hold: `keep <lib>`, `fetch <wheel spec>`
#
# The CPU layout lives in $CACHE/libtorch-<version>, the GPU one in
# $CACHE/libtorch-<version>-cuda, so the two never mix. $FERROTRAIN_CACHE overrides the cache
# root (default ~/.cache/ferrotrain). The torch version is pinned here and only here
# (docker/versions.env refers here).
set -euo pipefail

TORCH_VERSION=2.11.0
# The two CUDA runtime libraries that libtorch_cpu.so itself links (the CPU layout needs them).
CUDART_VERSION=13.0.96
CUPTI_VERSION=13.0.85

VARIANT="${FERROTRAIN_LIBTORCH_VARIANT:-cpu}"
PLAN=0
for arg in "$@"; do
  case "$arg" in
    --cuda) VARIANT=cuda ;;
    --cpu) VARIANT=cpu ;;
    --print-version) echo "$TORCH_VERSION"; exit 0 ;;
    --plan) PLAN=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "setup-libtorch: unknown argument $arg (--cpu, --cuda, --plan, --print-version)" >&2; exit 2 ;;
  esac
done
case "$VARIANT" in
  cpu) SUFFIX="" ;;
  cuda) SUFFIX="-cuda" ;;
  *) echo "setup-libtorch: FERROTRAIN_LIBTORCH_VARIANT must be cpu or cuda, not $VARIANT" >&2; exit 2 ;;
esac

CACHE_ROOT="${FERROTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrotrain}"
DEST="$CACHE_ROOT/libtorch-$TORCH_VERSION$SUFFIX"

if [[ -f "$DEST/.complete" && $PLAN == 0 ]]; then
  echo "$DEST"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
work=$(mktemp -d "$CACHE_ROOT/tmp.XXXXXX")
trap 'rm -rf "$work"' EXIT

# pip does not widen an explicit --platform to older glibc tags: name every manylinux tag a
# Debian 12 (glibc 2.36) system accepts.
platforms=(--platform manylinux2014_x86_64)
for glibc_minor in $(seq 17 36); do platforms+=(--platform "manylinux_2_${glibc_minor}_x86_64"); done
pip_download() {
  python3 -m pip download --quiet --only-binary=:all: --python-version 3.11 \
    "${platforms[@]}" -d "$wheels" "$@" >&2
}
wheels="$CACHE_ROOT/wheels"
mkdir -p "$wheels"
if ! ls "$wheels"/torch-"$TORCH_VERSION"-*.whl >/dev/null 2>&1; then
  echo "setup-libtorch: fetching torch==$TORCH_VERSION" >&2
  pip_download --no-deps "torch==$TORCH_VERSION"
fi
torch_whl=$(ls "$wheels"/torch-"$TORCH_VERSION"-*.whl | head -n1)

stage="$work/libtorch"
mkdir -p "$stage/lib"
echo "setup-libtorch: $([[ $PLAN == 1 ]] && echo reading || echo unpacking) $(basename "$torch_whl") ($VARIANT)" >&2
# CPU: the libraries a CPU build links. CUDA: every library of the wheel except the Python
# bindings (libtorch_python needs libpython; nothing of ours loads it).
python3 - "$torch_whl" "$stage" "$VARIANT" "$PLAN" <<'PY'
import sys, zipfile, os, shutil
whl, stage, variant, plan = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
cpu_libs = ("libtorch_cpu.so", "libtorch.so", "libc10.so", "libgomp")
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        name = info.filename
        base = os.path.basename(name)
        if name.startswith("torch/include/") and not name.endswith("/"):
            out = os.path.join(stage, "include", name[len("torch/include/"):])
        elif name.startswith("torch/lib/") and ".so" in base and "/" not in name[len("torch/lib/"):]:
            if variant == "cpu" and not base.startswith(cpu_libs):
                continue
            if variant == "cuda" and base.startswith("libtorch_python"):
                continue
            out = os.path.join(stage, "lib", base)
            if plan:
                print("keep", base)
        else:
            continue
        if plan:
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
PY

if [[ "$VARIANT" == cpu ]]; then
  specs=("nvidia-cuda-runtime==$CUDART_VERSION" "nvidia-cuda-cupti==$CUPTI_VERSION")
  if [[ $PLAN == 1 ]]; then printf 'fetch %s\n' "${specs[@]}"; exit 0; fi
  echo "setup-libtorch: fetching ${specs[*]}" >&2
  pip_download --no-deps "${specs[@]}"
  nv_wheels=("$wheels"/nvidia_cuda_runtime-"$CUDART_VERSION"-*.whl "$wheels"/nvidia_cuda_cupti-"$CUPTI_VERSION"-*.whl)
  keep="libcudart.so,libcupti.so"
else
  # The torch wheel pins its CUDA stack itself (Requires-Dist: cuda-toolkit[...]==13.0.2,
  # nvidia-cudnn-cu13, nvidia-nccl-cu13, ...): take exactly those pins and their
  # dependencies, so the GPU layout is the one `pip install torch==2.11.0` gives.
  mapfile -t specs < <(python3 - "$torch_whl" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        spec, _, marker = req.partition(";")
        name = spec.strip().split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip()
        if "extra ==" in marker:
            continue
        if name.startswith("nvidia-") or name == "cuda-toolkit":
            print(spec.strip().replace(" ", ""))
PY
)
  [[ ${#specs[@]} -gt 0 ]] || { echo "setup-libtorch: no nvidia-* requirements in $torch_whl" >&2; exit 1; }
  if [[ $PLAN == 1 ]]; then printf 'fetch %s\n' "${specs[@]}"; exit 0; fi
  echo "setup-libtorch: fetching ${specs[*]} (with their dependencies; several GB)" >&2
  list="$work/downloaded"
  if ! python3 -m pip download --only-binary=:all: --python-version 3.11 "${platforms[@]}" \
      -d "$wheels" --progress-bar off "${specs[@]}" >"$list" 2>"$work/pip.err"; then
    cat "$list" "$work/pip.err" >&2
    exit 1
  fi
  # pip names each wheel it used ("Saved ..." or "File was already downloaded ...").
  mapfile -t nv_wheels < <(grep -oE '[^ /]+\.whl' "$list" | sort -u | grep -E '^nvidia_' | sed "s|^|$wheels/|")
  [[ ${#nv_wheels[@]} -gt 0 ]] || { echo "setup-libtorch: pip downloaded no nvidia-* wheels:" >&2; cat "$list" >&2; exit 1; }
  keep="*"
fi
for whl in "${nv_wheels[@]}"; do
  echo "setup-libtorch: unpacking $(basename "$whl")" >&2
  python3 - "$whl" "$stage/lib" "$keep" <<'PY'
import sys, zipfile, os, shutil
whl, lib, keep = sys.argv[1], sys.argv[2], sys.argv[3]
prefixes = None if keep == "*" else tuple(keep.split(","))
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        base = os.path.basename(info.filename)
        if info.is_dir() or ".so" not in base:
            continue
        if prefixes is None:
            # Every shared object of the wheel's lib/ (NVSHMEM's bootstrap plugins too).
            if "/lib/" not in info.filename:
                continue
        elif not base.startswith(prefixes):
            continue
        with z.open(info) as src, open(os.path.join(lib, base), "wb") as dst:
            shutil.copyfileobj(src, dst)
PY
done
echo "$TORCH_VERSION" > "$stage/build-version"
echo "$VARIANT" > "$stage/variant"
touch "$stage/.complete"
rm -rf "$DEST"
mv "$stage" "$DEST"
echo "$DEST"
