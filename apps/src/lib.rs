//! Programs built on Ductile, and the pieces of them that tests and
//! benchmarks reuse: Jacobi2D's kernel, boundary conditions and checksum, a
//! sequential reference solver, and the command-line parsing shared by the
//! binaries.

pub mod args;
pub mod bench;
pub mod jacobi;
#[cfg(feature = "cuda")]
pub mod jacobi_gpu;
pub mod megatest;

/// Every GPU module of these programs (what `gpu_probe --emit-ptx` compiles).
#[cfg(feature = "cuda")]
pub fn gpu_modules() -> Vec<ductile::gpu::GpuModule> {
    vec![jacobi_gpu::module()]
}
