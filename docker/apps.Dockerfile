# The apps image: the Ductile programs (jacobi2d, pingpong, lbbench,
# megatest, counter, elastic_probe) and `ductile` (the spot pods' preStop
# hook runs `ductile wait-left`), for ElasticJob pod templates
# (`command: ["jacobi2d", "--grid", "16384"]`). The runtime reads its
# contract (DUCTILE_*) from the environment the operator sets.
#
#   docker build -f docker/apps.Dockerfile -t $REGISTRY/ductile-apps:0.1.0 .
#
# Multi-stage, distroless (no shell: pod commands name the program, as the
# examples do), non-root user 65532. TCP transport; the CUDA build of the
# same programs is `apps-cuda.Dockerfile`. Toolchain: the workspace's
# `rust-version` (checked by `operator/tests/manifests.rs`). Not built where
# it was written (no Docker there): see docs/operator.md.

FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p ductile-apps \
        --bin jacobi2d --bin pingpong --bin lbbench --bin megatest --bin counter --bin elastic_probe \
 && cargo build --release --locked -p ductile-operator --bin ductile \
 && for b in jacobi2d pingpong lbbench megatest counter elastic_probe ductile; do \
        install -D -m 0755 "target/release/$b" "/out/$b"; \
    done

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
# No entrypoint: each ElasticJob names its program in the pod template's command.
