//! Jacobi2D's blocks on the GPU (`jacobi2d --gpu`, feature `cuda`).
//!
//! The same blocks, ghost exchange and checksum as the CPU version
//! ([`crate::jacobi`]); only where a block's grid lives changes. The padded
//! `(w+2) x (h+2)` grid stays on the device in a [`DeviceBuffer`] (so it
//! migrates with its block, through host staging); every iteration one
//! kernel packs the four edges on the device, they are copied to the host in
//! one piece and sent as the CPU version sends them; the ghosts a block
//! receives are gathered on the host and unpacked on the device by one
//! kernel just before the sweep.
//!
//! Bit-for-bit agreement with the CPU: the sweep kernel computes
//! `((((c + up) + down) + west) + east) * 0.2` with one correctly rounded
//! IEEE operation each (`__dadd_rn`, `__dmul_rn`, which the compiler never
//! contracts), and the module is compiled with `--fmad=false` besides. The
//! residual is a maximum (exact in any order), taken over the bit patterns of
//! non-negative doubles, which order as the doubles do. The checksum is
//! computed by the CPU code on the grid copied back.

use ductile::gpu::cudarc::driver::LaunchConfig;
use ductile::gpu::{DeviceBuffer, ElemKind, GpuError, GpuModule, Param, PeGpu};
use serde::{Deserialize, Serialize};

use crate::jacobi::Side;

/// The module's name.
pub const MODULE: &str = "jacobi2d";

pub(crate) const SOURCE: &str = r#"
// Jacobi2D on a padded (w+2) x (h+2) row-major grid of doubles.

extern "C" __global__ void jacobi_sweep(const double* cur, double* next, int w, int h,
                                        unsigned long long* residual, int want_residual)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x + 1;
    int y = blockIdx.y * blockDim.y + threadIdx.y + 1;
    unsigned long long r = 0ull;
    if (x <= w && y <= h) {
        long long s = (long long)w + 2;
        long long i = (long long)y * s + x;
        double c = cur[i];
        // The CPU's operations, in its order, each rounded on its own.
        double v = __dmul_rn(
            __dadd_rn(__dadd_rn(__dadd_rn(__dadd_rn(c, cur[i - s]), cur[i + s]), cur[i - 1]),
                      cur[i + 1]),
            0.2);
        next[i] = v;
        if (want_residual) {
            r = (unsigned long long)__double_as_longlong(fabs(__dsub_rn(v, c)));
        }
    }
    if (want_residual) {
        // Non-negative doubles order like their bit patterns.
        for (int o = 16; o > 0; o >>= 1) {
            unsigned long long t = __shfl_xor_sync(0xffffffffu, r, o);
            r = t > r ? t : r;
        }
        if (((threadIdx.y * blockDim.x + threadIdx.x) & 31) == 0 && r != 0ull) {
            atomicMax(residual, r);
        }
    }
}

// edges: [row 1: w][row h: w][column 1: h][column w: h]
extern "C" __global__ void jacobi_pack(const double* cur, double* edges, int w, int h)
{
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long s = (long long)w + 2;
    if (t < w) {
        edges[t] = cur[s + 1 + t];
    } else if (t < 2 * w) {
        edges[t] = cur[h * s + 1 + (t - w)];
    } else if (t < 2 * w + h) {
        edges[t] = cur[(t - 2 * w + 1) * s + 1];
    } else if (t < 2 * (long long)w + 2 * h) {
        edges[t] = cur[(t - 2 * w - h + 1) * s + w];
    }
}

// halo: [north: w][south: w][west: h][east: h]; mask bits 1 2 4 8 say which arrived.
extern "C" __global__ void jacobi_unpack(double* cur, const double* halo, int w, int h, int mask)
{
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long s = (long long)w + 2;
    if (t < w) {
        if (mask & 1) cur[1 + t] = halo[t];
    } else if (t < 2 * w) {
        if (mask & 2) cur[(h + 1) * s + 1 + (t - w)] = halo[t];
    } else if (t < 2 * w + h) {
        if (mask & 4) cur[(t - 2 * w + 1) * s] = halo[t];
    } else if (t < 2 * (long long)w + 2 * h) {
        if (mask & 8) cur[(t - 2 * w - h + 1) * s + w + 1] = halo[t];
    }
}
"#;

/// The module and its kernels, for [`ductile::Registry::gpu_module`].
pub fn module() -> GpuModule {
    use ElemKind::{F64, U64};
    GpuModule::new(MODULE, SOURCE)
        .kernel(
            "jacobi_sweep",
            &[
                Param::In(F64),
                Param::Out(F64),
                Param::I32,
                Param::I32,
                Param::Out(U64),
                Param::I32,
            ],
        )
        .kernel(
            "jacobi_pack",
            &[Param::In(F64), Param::Out(F64), Param::I32, Param::I32],
        )
        .kernel(
            "jacobi_unpack",
            &[
                Param::Out(F64),
                Param::In(F64),
                Param::I32,
                Param::I32,
                Param::I32,
            ],
        )
}

/// Where a side's values sit in the edge and halo layouts, and its mask bit.
/// `Side` names the halo of the *receiving* block.
fn halo_range(side: Side, w: usize, h: usize) -> (std::ops::Range<usize>, u32) {
    match side {
        Side::North => (0..w, 1),
        Side::South => (w..2 * w, 2),
        Side::West => (2 * w..2 * w + h, 4),
        Side::East => (2 * w + h..2 * w + 2 * h, 8),
    }
}

/// The edge a neighbour whose halo is `their_halo` needs, in the packed edges.
fn edge_range(their_halo: Side, w: usize, h: usize) -> std::ops::Range<usize> {
    match their_halo {
        // The neighbour above fills its south halo with our first row.
        Side::South => 0..w,
        Side::North => w..2 * w,
        Side::East => 2 * w..2 * w + h,
        Side::West => 2 * w + h..2 * w + 2 * h,
    }
}

/// The sweep's launch: a thread per interior point, blocks of 32 x 8 (one
/// warp per row of a block, which the residual's warp reduction relies on).
fn sweep_config(w: usize, h: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (w.div_ceil(32) as u32, h.div_ceil(8) as u32, 1),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    }
}

/// Packing and unpacking: a thread per edge value.
fn edges_config(w: usize, h: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems((2 * w + 2 * h) as u32)
}

fn dim(n: usize) -> Result<i32, GpuError> {
    i32::try_from(n).map_err(|_| GpuError::BadLaunch {
        kernel: MODULE.into(),
        detail: format!("block dimension {n} does not fit an int"),
    })
}

/// A block's grid on its PE's device.
#[derive(Serialize, Deserialize)]
pub struct DeviceGrid {
    w: usize,
    h: usize,
    /// The current values, halo included: what migrates.
    cur: DeviceBuffer<f64>,
    /// Ghosts received for the coming sweep, still on the host.
    halo: Vec<f64>,
    /// Which sides of `halo` arrived.
    mask: u32,
    /// Device work space, rebuilt after a migration.
    #[serde(skip)]
    scratch: Option<Scratch>,
}

struct Scratch {
    next: DeviceBuffer<f64>,
    edges: DeviceBuffer<f64>,
    halo: DeviceBuffer<f64>,
    residual: DeviceBuffer<u64>,
    edges_host: Vec<f64>,
}

impl DeviceGrid {
    /// A grid of `w x h` points from its padded host form.
    pub fn new(gpu: &PeGpu, padded: &[f64], w: usize, h: usize) -> Result<Self, GpuError> {
        Ok(DeviceGrid {
            w,
            h,
            cur: gpu.upload(padded)?,
            halo: vec![0.0; 2 * w + 2 * h],
            mask: 0,
            scratch: None,
        })
    }

    fn scratch(&mut self, gpu: &PeGpu) -> Result<(), GpuError> {
        if self.scratch.is_none() {
            let n = 2 * self.w + 2 * self.h;
            self.scratch = Some(Scratch {
                // The boundary halos of `next` must be those of `cur`; the
                // interior is overwritten by every sweep.
                next: self.cur.duplicate()?,
                edges: gpu.zeros(n)?,
                halo: gpu.zeros(n)?,
                residual: gpu.zeros(1)?,
                edges_host: vec![0.0; n],
            });
        }
        Ok(())
    }

    /// Packs the four edges on the device and copies them to the host, for
    /// [`Self::edge`].
    pub fn pack_edges(&mut self, gpu: &PeGpu) -> Result<(), GpuError> {
        self.scratch(gpu)?;
        let (w, h) = (dim(self.w)?, dim(self.h)?);
        let s = self.scratch.as_mut().expect("scratch was just made");
        gpu.launch(
            gpu.kernel(MODULE, "jacobi_pack")?,
            edges_config(self.w, self.h),
            &mut [self.cur.arg(), s.edges.arg_mut(), w.into(), h.into()],
        )?;
        s.edges.copy_to_host(&mut s.edges_host)
    }

    /// The packed edge for a neighbour whose halo is `their_halo` (after [`Self::pack_edges`]).
    pub fn edge(&self, their_halo: Side) -> &[f64] {
        let s = self.scratch.as_ref().expect("edges are packed first");
        &s.edges_host[edge_range(their_halo, self.w, self.h)]
    }

    /// Keeps a ghost layer for the coming sweep.
    pub fn stage_ghost(&mut self, side: Side, data: &[f64]) {
        let (range, bit) = halo_range(side, self.w, self.h);
        self.halo[range].copy_from_slice(data);
        self.mask |= bit;
    }

    /// Unpacks the staged ghosts, sweeps once (`cur` becomes the new values),
    /// and returns the max |change| when `residual`.
    pub fn sweep(&mut self, gpu: &PeGpu, residual: bool) -> Result<f64, GpuError> {
        self.scratch(gpu)?;
        let (w, h) = (dim(self.w)?, dim(self.h)?);
        let s = self.scratch.as_mut().expect("scratch was just made");
        if self.mask != 0 {
            s.halo.copy_from_host(&self.halo)?;
            gpu.launch(
                gpu.kernel(MODULE, "jacobi_unpack")?,
                edges_config(self.w, self.h),
                &mut [
                    self.cur.arg_mut(),
                    s.halo.arg(),
                    w.into(),
                    h.into(),
                    (self.mask as i32).into(),
                ],
            )?;
            self.mask = 0;
        }
        if residual {
            s.residual.zero()?;
        }
        gpu.launch(
            gpu.kernel(MODULE, "jacobi_sweep")?,
            sweep_config(self.w, self.h),
            &mut [
                self.cur.arg(),
                s.next.arg_mut(),
                w.into(),
                h.into(),
                s.residual.arg_mut(),
                i32::from(residual).into(),
            ],
        )?;
        std::mem::swap(&mut self.cur, &mut s.next);
        if residual {
            let bits = s.residual.to_host()?[0];
            Ok(f64::from_bits(bits))
        } else {
            Ok(0.0)
        }
    }

    /// The padded grid, copied to the host.
    pub fn to_host(&self) -> Result<Vec<f64>, GpuError> {
        self.cur.to_host()
    }
}

#[cfg(test)]
mod emulated;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_and_halos_pair_up() {
        // What a block packs for the neighbour whose halo is `side` lands in
        // that neighbour's `side` halo slot: same length, and the four slots
        // tile the buffer exactly, as the kernels assume.
        let (w, h) = (5, 3);
        let mut seen = vec![0u32; 2 * w + 2 * h];
        let mut bits = 0;
        for side in [Side::North, Side::South, Side::West, Side::East] {
            let (halo, bit) = halo_range(side, w, h);
            assert_eq!(halo.len(), edge_range(side, w, h).len());
            halo.for_each(|i| seen[i] += 1);
            assert_eq!(bits & bit, 0);
            bits |= bit;
        }
        assert!(seen.iter().all(|&n| n == 1));
        assert_eq!(bits, 15);
        let names: Vec<_> = module().kernel_names();
        assert_eq!(names, ["jacobi_sweep", "jacobi_pack", "jacobi_unpack"]);
        for k in names {
            assert!(SOURCE.contains(&format!("__global__ void {k}(")), "{k}");
        }
    }
}
