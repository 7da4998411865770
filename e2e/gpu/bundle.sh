#!/usr/bin/env bash
# Builds the binaries e2e/gpu/run.sh needs (release, CUDA loaded at run
# time, so no CUDA is needed here) into .gpu-bin/, stripped: a GPU machine
# without a Rust toolchain or network runs them from there (carry .gpu-bin).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p ductile-apps -p ductile-operator --bins
target="${CARGO_TARGET_DIR:-target}"
rm -rf .gpu-bin && mkdir -p .gpu-bin
for b in jacobi2d ductile bench_rescale gpu_probe; do
  cp "$target/release/$b" .gpu-bin/
  strip .gpu-bin/$b 2>/dev/null || true
done
du -sh .gpu-bin
