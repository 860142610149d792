# The trainer image: `ferrotrain` on slim Debian with the CPU libtorch laid out the way
# scripts/setup-libtorch.sh lays it out (PyTorch 2.11 from the PyPI wheel). The operator runs it
# as `ferrotrain launch --max-restarts 0` with uid 65532 and a read-only root file system.
#   docker build -f docker/trainer.Dockerfile -t ferrotrain/trainer:dev .
FROM rust:1.95-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip g++ pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ENV FERROTRAIN_CACHE=/opt/ferrotrain-cache
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    export LIBTORCH="$(scripts/setup-libtorch.sh | tail -n1)" \
 && cargo build --release --locked -p ferrotrain-trainer \
 && install -D target/release/ferrotrain /out/bin/ferrotrain \
 && mkdir -p /out/libtorch \
 && cp -a "$LIBTORCH/lib" /out/libtorch/lib

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libgomp1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/libtorch /opt/libtorch
COPY --from=build /out/bin/ferrotrain /usr/local/bin/ferrotrain
ENV LD_LIBRARY_PATH=/opt/libtorch/lib \
    OMP_WAIT_POLICY=PASSIVE \
    HOME=/tmp
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT []
CMD ["ferrotrain", "launch", "--max-restarts", "0"]
