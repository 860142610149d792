# The trainer images: `ferrotrain` on Debian with libtorch laid out by scripts/setup-libtorch.sh
# (PyTorch 2.11.0 from the PyPI wheels). The operator runs it as
# `ferrotrain launch --max-restarts 0` with uid 65532 and a read-only root file system.
#
# Build with scripts/images.sh (docs/images.md), which passes the versions from
# docker/versions.env. Needs BuildKit (any Docker since 23, or DOCKER_BUILDKIT=1).
#
#   ferrotrain/trainer       LIBTORCH_VARIANT=cpu  CARGO_FEATURES=
#   ferrotrain/trainer-cuda  LIBTORCH_VARIANT=cuda CARGO_FEATURES=cuda   (torch's nvidia-*
#                            wheels: cuBLAS, cuDNN, NCCL...; the driver comes from the node)
#
# BINARIES picks where the binary and libtorch come from:
#   source    compile in the `source` stage below (a laptop with Docker Hub, a release
#             pipeline; context = the repository, filtered by .dockerignore)
#   prebuilt  take them from prebuilt/ in the build context (scripts/images.sh --mode local:
#             binaries built on the host, no registry needed); BuildKit then skips `source`.
ARG RUST_IMAGE=rust:1.95-slim-bookworm
ARG BASE_IMAGE=debian:bookworm-slim
ARG BINARIES=source

FROM ${RUST_IMAGE} AS source
ARG LIBTORCH_VARIANT=cpu
ARG CARGO_FEATURES=
ARG CARGO_PROFILE=release
# g++ for csrc/ against libtorch, make for jemalloc (built from source by tikv-jemalloc-sys).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip g++ make pkg-config binutils \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# libtorch first, in a layer of its own: changing the sources never refetches the wheels.
COPY scripts/setup-libtorch.sh scripts/setup-libtorch.sh
RUN --mount=type=cache,target=/var/cache/ferrotrain/wheels \
    export FERROTRAIN_CACHE=/var/cache/ferrotrain PIP_NO_CACHE_DIR=1 \
 && dir="$(FERROTRAIN_LIBTORCH_VARIANT="$LIBTORCH_VARIANT" scripts/setup-libtorch.sh | tail -n1)" \
 && mv "$dir" /opt/libtorch
COPY . .
# One target directory per variant: torch-sys decides at build time whether to link the CUDA
# libraries, so the CPU and CUDA builds must not share its artifacts.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    export LIBTORCH=/opt/libtorch CARGO_TARGET_DIR="/src/target/$LIBTORCH_VARIANT" \
 && cargo build --locked --profile "$CARGO_PROFILE" -p ferrotrain-trainer \
      ${CARGO_FEATURES:+--features "$CARGO_FEATURES"} \
 && out="$CARGO_TARGET_DIR/$([ "$CARGO_PROFILE" = dev ] && echo debug || echo "$CARGO_PROFILE")" \
 && if [ "$LIBTORCH_VARIANT" = cuda ] && ! readelf -d "$out/ferrotrain" | grep -q 'NEEDED.*\[libtorch_cuda\.so\]'; then \
      echo "ferrotrain does not link libtorch_cuda.so: it would train on the CPU" >&2; exit 1; \
    fi \
 && mkdir -p /out \
 && objcopy --strip-debug "$out/ferrotrain" /out/ferrotrain

FROM scratch AS prebuilt
COPY prebuilt/lib/ /opt/libtorch/lib/
COPY prebuilt/bin/ferrotrain /out/ferrotrain

FROM ${BINARIES} AS binaries

FROM ${BASE_IMAGE}
COPY --from=binaries /opt/libtorch/lib/ /opt/libtorch/lib/
COPY --from=binaries /out/ferrotrain /usr/local/bin/ferrotrain
# The loader finds libtorch through its cache, so no LD_LIBRARY_PATH is needed (and a user's
# env cannot lose it). uid 65532 gets a name; $HOME is /tmp (the only writable place).
RUN echo /opt/libtorch/lib > /etc/ld.so.conf.d/ferrotrain-libtorch.conf \
 && ldconfig \
 && echo 'nonroot:x:65532:65532:nonroot:/tmp:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'nonroot:x:65532:' >> /etc/group
# NVIDIA's container runtime mounts the driver's compute libraries when it sees this (the CPU
# image ignores it). OMP_WAIT_POLICY is left unset: a CPU rank picks ACTIVE itself when its
# pod's CPU limit covers its threads, else libgomp's default (trainer/src/omp.rs); a pod's env
# decides when it sets it.
ENV HOME=/tmp \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
WORKDIR /tmp
EXPOSE 29500 9090
ENTRYPOINT []
CMD ["ferrotrain", "launch", "--max-restarts", "0"]
# Metadata last: a new version or date never invalidates the layers above.
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=
ARG LIBTORCH_VARIANT=cpu
LABEL org.opencontainers.image.title="ferrotrain trainer" \
      org.opencontainers.image.description="ferrotrain: data-parallel transformer training on libtorch 2.11 (${LIBTORCH_VARIANT})" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="ferrotrain" \
      dev.ferrotrain.libtorch.variant="${LIBTORCH_VARIANT}"
