# The operator image: `ductile` (entrypoint; node 0's pod runs `ductile
# coordinator` from this image) and `ductile-operator` (the chart's
# Deployment runs it as its command).
#
#   docker build -f docker/operator.Dockerfile -t ghcr.io/ductile/ductile-operator:0.1.0 .
#
# Not built where it was written (no Docker there): see docs/operator.md.

FROM rust:1.85-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p ductile-operator --bin ductile --bin ductile-operator \
 && install -D -m 0755 target/release/ductile /out/ductile \
 && install -D -m 0755 target/release/ductile-operator /out/ductile-operator

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
# The chart runs it as non-root (runAsNonRoot); a numeric user satisfies that check.
USER 65532:65532
ENTRYPOINT ["ductile"]
