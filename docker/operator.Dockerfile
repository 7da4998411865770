# The operator image: `ductile` (entrypoint; node 0's pod runs `ductile
# coordinator` from this image) and `ductile-operator` (the chart's
# Deployment runs it as its command). Multi-stage: the toolchain stays in
# the build stage; the image is distroless (glibc, CA certificates, no
# shell), about 35 MB, and runs as the non-root user 65532.
#
#   docker build -f docker/operator.Dockerfile -t $REGISTRY/ductile-operator:0.1.0 .
#
# The toolchain is the workspace's `rust-version` (the locked kube 5 crates
# need 1.89); `operator/tests/manifests.rs` fails when the two differ or when
# a locked crate needs a newer one. Not built where it was written (no
# Docker there): see docs/operator.md.

FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p ductile-operator --bin ductile --bin ductile-operator \
 && install -D -m 0755 target/release/ductile /out/ductile \
 && install -D -m 0755 target/release/ductile-operator /out/ductile-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
# The chart runs it as non-root (runAsNonRoot); a numeric user satisfies that check.
USER 65532:65532
ENTRYPOINT ["ductile"]
