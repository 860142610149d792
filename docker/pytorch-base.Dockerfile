# ferrotrain/pytorch-base: Debian's Python 3.11 with PyPI's torch 2.11 wheel laid out for the
# CPU by scripts/setup-pytorch.sh (its other CUDA libraries stubbed: torch.cuda.is_available()
# is False) and numpy, every module compiled (the pods' root file system is read-only: Python
# would otherwise compile torch's modules in every process). The layer ferrotrain/pytorch
# (docker/pytorch.Dockerfile) adds the launcher to; tagged by the torch version and the
# layout's scripts, built once and cached (scripts/images.sh --only pytorch builds it when
# missing).
#
# BINARIES: `source` lays torch out in the `source` stage (a laptop with Docker Hub and PyPI);
# `prebuilt` takes prebuilt/python/ from the build context (scripts/images.sh --mode local).
# BASE_IMAGE must have Python 3.11 (the wheel's ABI): python:3.11-slim-bookworm, or Debian 12
# with python3 (local mode debootstraps one).
ARG RUST_IMAGE=rust:1.95-slim-bookworm
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG BINARIES=source

FROM ${RUST_IMAGE} AS source
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip binutils gcc \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY scripts/setup-libtorch.sh scripts/setup-pytorch.sh scripts/
COPY scripts/lib/cuda_stubs.py scripts/lib/
RUN --mount=type=cache,target=/var/cache/ferrotrain \
    export FERROTRAIN_CACHE=/var/cache/ferrotrain PIP_NO_CACHE_DIR=1 \
 && mkdir -p /out/python \
 && cp -a "$(scripts/setup-pytorch.sh | tail -n1)/." /out/python/ \
 && rm -rf /out/python/torch/include

FROM scratch AS prebuilt
COPY prebuilt/python/ /out/python/

FROM ${BINARIES} AS binaries

FROM ${BASE_IMAGE}
COPY --from=binaries /out/python/ /opt/ferrotrain/python/
# The interpreter finds the packages through a .pth file in its own site directory (a pod's
# PYTHONPATH stays the user's).
RUN python3 -c "import site; open(site.getsitepackages()[0] + '/ferrotrain.pth', 'w').write('/opt/ferrotrain/python\n')" \
 && python3 -m compileall -q -j 0 /opt/ferrotrain/python >/dev/null \
 && python3 -c "import torch; assert not torch.cuda.is_available()" \
 && (grep -q '^nonroot:' /etc/passwd || echo 'nonroot:x:65532:65532:nonroot:/tmp:/usr/sbin/nologin' >> /etc/passwd) \
 && (grep -q '^nonroot:' /etc/group || echo 'nonroot:x:65532:' >> /etc/group)
ENV HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /tmp
ARG TORCH_VERSION=2.11.0
LABEL org.opencontainers.image.title="ferrotrain pytorch-base" \
      org.opencontainers.image.description="Python 3.11 with PyTorch ${TORCH_VERSION} for the CPU (PyPI's wheel, CUDA libraries stubbed)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="ferrotrain"
