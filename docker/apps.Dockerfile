# The apps image: the Ductile programs (jacobi2d, pingpong, lbbench,
# megatest, counter, elastic_probe) and `ductile`, for ElasticJob pod
# templates (`command: ["jacobi2d", "--grid", "16384"]`). The runtime reads
# its contract (DUCTILE_*) from the environment the operator sets.
#
#   docker build -f docker/apps.Dockerfile -t ghcr.io/ductile/apps:0.1.0 .
#
# TCP transport only; a UCX build (cargo feature `ucx`, libucx-dev at build
# time, libucx0 at run time) is a variant not written yet. Not built where it
# was written (no Docker there): see docs/operator.md.

FROM rust:1.85-bookworm AS build
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

FROM debian:bookworm-slim
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
# No entrypoint: each ElasticJob names its program in the pod template's command.
