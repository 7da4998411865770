#!/usr/bin/env bash
# Builds the binaries e2e/gpu/run.sh needs (release, CUDA loaded at run
# time, so no CUDA is needed here) into .gpu-bin/, stripped: a GPU machine
# without a Rust toolchain or network runs them from there (carry .gpu-bin),
# with the kernels as PTX for a machine without NVRTC.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p ductile-apps -p ductile-operator --bins
target="${CARGO_TARGET_DIR:-target}"
rm -rf .gpu-bin && mkdir -p .gpu-bin
for b in jacobi2d ductile bench_rescale gpu_probe; do
  cp "$target/release/$b" .gpu-bin/
  strip .gpu-bin/$b 2>/dev/null || true
done
# Shipped PTX (DUCTILE_GPU_PTX_DIR) for a GPU machine with a driver but no
# NVRTC: compiled here by NVRTC from NVIDIA's PyPI wheel, for compute
# capability 8.0 so that any device from A100 on can JIT it.
scripts/install-cuda-tools
LD_LIBRARY_PATH="$PWD/target/cuda-tools/lib" .gpu-bin/gpu_probe --emit-ptx .gpu-bin/ptx --cc 8.0
du -sh .gpu-bin
size=$(du -sb .gpu-bin | cut -f1)
if [ "$size" -gt $((60 << 20)) ]; then
  echo "bundle.sh: .gpu-bin is $size bytes; the device tool carries 64 MiB in all" >&2
  exit 1
fi
