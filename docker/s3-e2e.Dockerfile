# ferrotrain/s3-e2e: s3s-fs, an S3-compatible server over a directory, as the checkpoint bucket
# of the end-to-end tests (e2e/src/s3.rs starts it in a test's namespace). A test fixture, not
# a product image: scripts/images.sh builds it only when asked (--only s3-e2e; scripts/e2e.sh
# does, once per version), the chart and the release never name it.
#
# BINARIES: `source` runs `cargo install s3s-fs` in the `source` stage (a laptop with Docker
# Hub); `prebuilt` takes prebuilt/bin/s3s-fs from the build context (scripts/images.sh --mode
# local, from scripts/setup-s3s-fs.sh's cache). Versions from docker/versions.env.
ARG RUST_IMAGE=rust:1.95-slim-bookworm
ARG BASE_IMAGE=debian:bookworm-slim
ARG BINARIES=source

FROM ${RUST_IMAGE} AS source
ARG S3S_FS_VERSION=0.14.1
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo install --locked "s3s-fs@${S3S_FS_VERSION}" --features binary --root /opt/s3s \
 && mkdir -p /out && cp /opt/s3s/bin/s3s-fs /out/s3s-fs

FROM scratch AS prebuilt
COPY prebuilt/bin/s3s-fs /out/s3s-fs

FROM ${BINARIES} AS binaries

FROM ${BASE_IMAGE}
COPY --from=binaries /out/s3s-fs /usr/local/bin/s3s-fs
# The pod runs it under a shell (a test kills the server, not the container's first process)
# with the buckets in a volume at /data; alone it serves /tmp, without authentication.
USER 65532:65532
WORKDIR /tmp
EXPOSE 9000
ENTRYPOINT []
CMD ["s3s-fs", "--host", "0.0.0.0", "--port", "9000", "/tmp"]
ARG VERSION=dev
LABEL org.opencontainers.image.title="ferrotrain e2e S3 server (s3s-fs)" \
      org.opencontainers.image.description="s3s-fs for ferrotrain's end-to-end tests only" \
      org.opencontainers.image.version="${VERSION}"
