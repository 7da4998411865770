# The CUDA apps image (`manifests/examples/jacobi2d-gpu.yaml`): the same
# programs built with the `cuda` feature (CUDA 12.4 driver API, loaded at
# run time, docs/gpu.md) on NVIDIA's CUDA 12.4 runtime image, which brings
# NVRTC for the kernels; the driver (libcuda) comes from the node through
# the NVIDIA container toolkit. Built on the same Ubuntu as it runs on, so
# the glibc matches. Non-root user 65532.
#
#   docker build -f docker/apps-cuda.Dockerfile -t $REGISTRY/ductile-apps-cuda:0.1.0 .
#
# Toolchain: the workspace's `rust-version` (checked by
# `operator/tests/manifests.rs`). Not built where it was written (no Docker,
# no GPU there): see docs/operator.md.

FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04 AS build
ARG RUST_TOOLCHAIN=1.89.0
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl gcc libc6-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
ENV CARGO_HOME=/usr/local/cargo RUSTUP_HOME=/usr/local/rustup PATH=/usr/local/cargo/bin:$PATH
RUN curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain "$RUST_TOOLCHAIN"
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p ductile-apps \
        --bin jacobi2d --bin gpu_probe --bin counter --bin elastic_probe \
 && cargo build --release --locked -p ductile-operator --bin ductile \
 && for b in jacobi2d gpu_probe counter elastic_probe ductile; do \
        install -D -m 0755 "target/release/$b" "/out/$b"; \
    done

FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04
COPY --from=build /out/ /usr/local/bin/
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
# No entrypoint: each ElasticJob names its program in the pod template's command.
