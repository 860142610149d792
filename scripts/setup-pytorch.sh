#!/usr/bin/env bash
# Lays out PyTorch for Python on the CPU from PyPI's torch wheel (the one
# scripts/setup-libtorch.sh caches: PyPI is the index this project reaches, and its torch is
# the CUDA build) as a directory of packages: what the Python tests and bench/ put on
# PYTHONPATH, and what scripts/images.sh copies into the pytorch image's site-packages. Holds
# torch, its pure-Python dependencies and numpy; the two CUDA runtime libraries torch's CPU
# library links (libcudart, libcupti: real, they report no GPU) and, for the other CUDA
# libraries libtorch_cuda links (cuBLAS, cuDNN, NCCL, ... about 3 GB), stubs of a few KB made
# by scripts/lib/cuda_stubs.py (needs cc and readelf). Idempotent: a complete cache (marked
# .complete) is reused. Prints the directory on its last line.
#
#   scripts/setup-pytorch.sh              # $CACHE/pytorch-<torch>-cpu-py311/site-packages
#   scripts/setup-pytorch.sh --python     # the python3 that can use it (prints its path)
#
# The wheels are cp311: python3 must be Python 3.11 (Debian 12's). $FERROTRAIN_CACHE overrides
# the cache root (default ~/.cache/ferrotrain). Versions are pinned here.
set -euo pipefail
cd "$(dirname "$0")/.."

# Pure-Python dependencies of torch 2.11.0 (its Requires-Dist, but setuptools, nvidia-*,
# cuda-*, triton: CUDA only) and numpy, at the versions pip resolved on 2026-12-07.
DEPS=(typing_extensions==4.16.0 filelock==4.3.2 sympy==1.14.0 mpmath==1.3.0 networkx==3.6.1
      jinja2==3.1.6 markupsafe==3.0.4 fsspec==2026.9.0 numpy==2.4.6)

if [[ "${1:-}" == --python ]]; then
  command -v python3
  exit 0
fi
TORCH_VERSION=$(scripts/setup-libtorch.sh --print-version)
version=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [[ "$version" != 3.11 ]]; then
  echo "setup-pytorch: python3 is $version; the torch wheel is for Python 3.11" >&2
  exit 1
fi
CACHE_ROOT="${FERROTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrotrain}"
DEST="$CACHE_ROOT/pytorch-$TORCH_VERSION-cpu-py311"
if [[ -f "$DEST/.complete" ]]; then
  echo "$DEST/site-packages"
  exit 0
fi
started=$SECONDS
# The torch wheel, and libcudart and libcupti laid out from their wheels.
libtorch=$(scripts/setup-libtorch.sh | tail -n1)
wheels="$CACHE_ROOT/wheels"
torch_whl=$(ls "$wheels"/torch-"$TORCH_VERSION"-cp311-*.whl | head -n1)
platforms=(--platform manylinux2014_x86_64)
for glibc_minor in $(seq 17 36); do platforms+=(--platform "manylinux_2_${glibc_minor}_x86_64"); done
echo "setup-pytorch: fetching ${DEPS[*]}" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
  "${platforms[@]}" -d "$wheels" "${DEPS[@]}" >&2
mkdir -p "$CACHE_ROOT"
work=$(mktemp -d "$CACHE_ROOT/tmp.XXXXXX")
trap 'rm -rf "$work"' EXIT
site="$work/site-packages"
dep_wheels=()
for dep in "${DEPS[@]}"; do
  name=${dep%%==*}; ver=${dep#*==}
  # Wheel names normalise - and . to _ and may capitalise (Jinja2, MarkupSafe).
  whl=$(ls "$wheels" | grep -iE "^${name//[-_.]/[-_.]}-${ver//./\\.}-" | head -n1)
  [[ -n "$whl" ]] || { echo "setup-pytorch: no wheel for $dep in $wheels" >&2; exit 1; }
  dep_wheels+=("$wheels/$whl")
done
echo "setup-pytorch: installing $(basename "$torch_whl") and ${#dep_wheels[@]} dependencies" >&2
python3 -m pip install --quiet --no-deps --no-index --no-compile --target "$site" \
  "$torch_whl" "${dep_wheels[@]}" >&2
# Console scripts name this machine's interpreter; nothing here needs them.
rm -rf "$site/bin"
cp "$libtorch"/lib/libcudart.so.* "$libtorch"/lib/libcupti.so.* "$site/torch/lib/"
python3 scripts/lib/cuda_stubs.py "$site/torch" "$site/torch/lib" "$site/torch/lib" >&2
PYTHONPATH="$site" python3 -c 'import torch, torch.distributed; assert not torch.cuda.is_available()' \
  2>/dev/null || { echo "setup-pytorch: torch does not import from $site" >&2; exit 1; }
touch "$work/.complete"
rm -rf "$DEST"
mv "$work" "$DEST"
trap - EXIT
echo "setup-pytorch: $(du -sh "$DEST/site-packages" | cut -f1) in $((SECONDS - started)) s" >&2
echo "$DEST/site-packages"
