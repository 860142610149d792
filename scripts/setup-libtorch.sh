#!/usr/bin/env bash
# Fetches the CPU libtorch that tch 0.24.0 needs (PyTorch 2.11.0) from PyPI wheels and lays it
# out as a LIBTORCH directory under a versioned cache outside the repo. Idempotent: a complete
# cache (marked by .complete) is reused. Prints the LIBTORCH path on its last line.
set -euo pipefail

TORCH_VERSION=2.11.0
CUDART_VERSION=13.0.96
CUPTI_VERSION=13.0.85
CACHE_ROOT="${FERROTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrotrain}"
DEST="$CACHE_ROOT/libtorch-$TORCH_VERSION"

if [[ -f "$DEST/.complete" ]]; then
  echo "$DEST"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
work=$(mktemp -d "$CACHE_ROOT/tmp.XXXXXX")
trap 'rm -rf "$work"' EXIT

platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_25_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
wheels="$CACHE_ROOT/wheels"
mkdir -p "$wheels"
for spec in "torch==$TORCH_VERSION" "nvidia-cuda-runtime==$CUDART_VERSION" "nvidia-cuda-cupti==$CUPTI_VERSION"; do
  echo "setup-libtorch: fetching $spec" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    "${platforms[@]}" -d "$wheels" "$spec" >&2
done

stage="$work/libtorch"
mkdir -p "$stage/lib"
torch_whl=$(ls "$wheels"/torch-"$TORCH_VERSION"*.whl | head -n1)
echo "setup-libtorch: unpacking $(basename "$torch_whl")" >&2
python3 - "$torch_whl" "$stage" <<'PY'
import sys, zipfile, os, shutil
whl, stage = sys.argv[1], sys.argv[2]
keep_libs = ("libtorch_cpu.so", "libtorch.so", "libc10.so", "libgomp")
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        name = info.filename
        if name.startswith("torch/include/") and not name.endswith("/"):
            out = os.path.join(stage, "include", name[len("torch/include/"):])
        elif name.startswith("torch/lib/") and os.path.basename(name).startswith(keep_libs):
            out = os.path.join(stage, "lib", os.path.basename(name))
        else:
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
PY
for pkg in nvidia_cuda_runtime nvidia_cuda_cupti; do
  whl=$(ls "$wheels"/${pkg}-*.whl | head -n1)
  python3 - "$whl" "$stage/lib" <<'PY'
import sys, zipfile, os, shutil
whl, lib = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        base = os.path.basename(info.filename)
        if base.startswith(("libcudart.so", "libcupti.so")):
            with z.open(info) as src, open(os.path.join(lib, base), "wb") as dst:
                shutil.copyfileobj(src, dst)
PY
done
echo "$TORCH_VERSION" > "$stage/build-version"
touch "$stage/.complete"
rm -rf "$DEST"
mv "$stage" "$DEST"
echo "$DEST"
