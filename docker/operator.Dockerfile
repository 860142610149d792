# The operator image: a static-ish Rust binary (rustls, no OpenSSL) on distroless, non-root.
#   docker build -f docker/operator.Dockerfile -t ferrotrain/operator:dev .
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# The trainer crate needs libtorch; the operator does not, so build only its package.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p ferrotrain-operator \
 && install -D target/release/ferrotrain-operator /out/ferrotrain-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ferrotrain-operator /usr/local/bin/ferrotrain-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/ferrotrain-operator"]
CMD ["run"]
