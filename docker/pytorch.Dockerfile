# ferrotrain/pytorch: ferrotrain's launcher with PyTorch for Python on the CPU, for a script of
# your own (spec.pytorch, docs/pytorch.md) and as a base for your image: ferrotrain/pytorch-base
# (docker/pytorch-base.Dockerfile: Python 3.11, torch 2.11, numpy) with the launcher
# `ferrotrain-launch` (static, musl: it runs on any Linux image), the `ferrotrain` package
# (python/) and the example script at /opt/ferrotrain/examples/gpt.py with its text,
# Multi30k's English captions (/opt/ferrotrain/examples/data/train.en.gz, 569 KB). The operator
# runs it as `ferrotrain-launch -- <your command>` with uid 65532 and a read-only root file
# system.
#
# Build with scripts/images.sh --only pytorch (docs/images.md). BINARIES: `source` builds the
# launcher in the `source` stage, `prebuilt` takes prebuilt/ from the build context
# (scripts/images.sh --mode local). PYTORCH_BASE: the ferrotrain/pytorch-base image to add to.
ARG RUST_IMAGE=rust:1.95-slim-bookworm
ARG PYTORCH_BASE=ferrotrain/pytorch-base:2.11.0
ARG BINARIES=source

FROM ${RUST_IMAGE} AS source
ARG CARGO_PROFILE=release
RUN apt-get update \
 && apt-get install -y --no-install-recommends binutils \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
# The example's text (gpt.py --data): Multi30k's English training captions.
ARG MULTI30K_TRAIN_EN_URL=https://github.com/multi30k/dataset/raw/master/data/task1/raw/train.en.gz
ARG MULTI30K_TRAIN_EN_SHA256=d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f
ADD ${MULTI30K_TRAIN_EN_URL} /out/examples/data/train.en.gz
RUN echo "${MULTI30K_TRAIN_EN_SHA256}  /out/examples/data/train.en.gz" | sha256sum -c --quiet -
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --profile "$CARGO_PROFILE" --target x86_64-unknown-linux-musl \
      -p ferrotrain-launch --bin ferrotrain-launch \
 && out="target/x86_64-unknown-linux-musl/$([ "$CARGO_PROFILE" = dev ] && echo debug || echo "$CARGO_PROFILE")" \
 && mkdir -p /out/bin /out/python \
 && objcopy --strip-debug "$out/ferrotrain-launch" /out/bin/ferrotrain-launch \
 && cp -a python/ferrotrain /out/python/ferrotrain \
 && cp examples/pytorch/gpt.py /out/examples/gpt.py

FROM scratch AS prebuilt
COPY prebuilt/ /out/

FROM ${BINARIES} AS binaries

FROM ${PYTORCH_BASE}
USER 0
COPY --from=binaries /out/bin/ferrotrain-launch /usr/local/bin/ferrotrain-launch
COPY --from=binaries /out/python/ferrotrain/ /opt/ferrotrain/python/ferrotrain/
COPY --from=binaries /out/examples/ /opt/ferrotrain/examples/
RUN python3 -m compileall -q /opt/ferrotrain/python/ferrotrain /opt/ferrotrain/examples >/dev/null \
 && python3 -c "import torch, ferrotrain" \
 && ferrotrain-launch --version
USER 65532:65532
EXPOSE 29500 9090
ENTRYPOINT []
CMD ["ferrotrain-launch", "--help"]
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=
LABEL org.opencontainers.image.title="ferrotrain pytorch" \
      org.opencontainers.image.description="ferrotrain's launcher with PyTorch for Python on the CPU: your own DDP script, restarted in place from warm spares" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="ferrotrain"
