# The operator image: `ferrotrain-operator` (rustls, no OpenSSL) on a distroless root file
# system cut from Debian: the binary, exactly the shared libraries `ldd` says it loads (libc,
# libm, libgcc_s, the loader), CA certificates, and passwd/group entries for uid 65532.
# No shell, no package manager, nothing else: the same content as distroless/cc, but made from
# the one Debian base the other images use, so it builds where only a Debian mirror is
# reachable and no distroless registry.
#
# Build with scripts/images.sh (docs/images.md), which passes the versions from
# docker/versions.env. Needs BuildKit (any Docker since 23, or DOCKER_BUILDKIT=1).
# BINARIES: `source` compiles in the `source` stage (context = the repository), `prebuilt`
# takes prebuilt/ferrotrain-operator from the build context (scripts/images.sh --mode local).
ARG RUST_IMAGE=rust:1.95-slim-bookworm
ARG BASE_IMAGE=debian:bookworm-slim
ARG BINARIES=source

FROM ${RUST_IMAGE} AS source
ARG CARGO_PROFILE=release
RUN apt-get update \
 && apt-get install -y --no-install-recommends binutils \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The operator does not need libtorch: build only its package.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --profile "$CARGO_PROFILE" -p ferrotrain-operator \
 && out="target/$([ "$CARGO_PROFILE" = dev ] && echo debug || echo "$CARGO_PROFILE")" \
 && mkdir -p /out \
 && objcopy --strip-debug "$out/ferrotrain-operator" /out/ferrotrain-operator

FROM scratch AS prebuilt
COPY prebuilt/bin/ferrotrain-operator /out/ferrotrain-operator

FROM ${BINARIES} AS binaries

FROM ${BASE_IMAGE} AS rootfs
RUN [ -s /etc/ssl/certs/ca-certificates.crt ] \
 || { apt-get update && apt-get install -y --no-install-recommends ca-certificates \
      && rm -rf /var/lib/apt/lists/*; }
COPY --from=binaries /out/ferrotrain-operator /rootfs/usr/local/bin/ferrotrain-operator
RUN set -eu; \
    bin=/rootfs/usr/local/bin/ferrotrain-operator; \
    ldd "$bin" > /tmp/ldd; cat /tmp/ldd; \
    if grep -q 'not found' /tmp/ldd; then echo "unresolved libraries" >&2; exit 1; fi; \
    for lib in $(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' /tmp/ldd); do \
      mkdir -p "/rootfs$(dirname "$lib")"; cp -L "$lib" "/rootfs$lib"; \
    done; \
    mkdir -p /rootfs/etc/ssl/certs /rootfs/tmp /rootfs/home/nonroot; \
    cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/; \
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > /rootfs/etc/passwd; \
    printf 'root:x:0:\nnonroot:x:65532:\n' > /rootfs/etc/group; \
    printf 'hosts: files dns\n' > /rootfs/etc/nsswitch.conf; \
    chmod 1777 /rootfs/tmp; chown 65532:65532 /rootfs/home/nonroot

FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=
LABEL org.opencontainers.image.title="ferrotrain operator" \
      org.opencontainers.image.description="ferrotrain: Kubernetes operator for DistributedTraining jobs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="ferrotrain"
COPY --from=rootfs /rootfs/ /
ENV HOME=/home/nonroot
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/ferrotrain-operator"]
CMD ["run"]
