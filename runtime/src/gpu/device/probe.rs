//! Copy-bandwidth probes of a device, for benchmarks (a process that is
//! not a node).

use super::*;

/// Copy bandwidths of one device, measured with pinned host memory.
#[derive(Clone, Debug, Serialize)]
pub struct Bandwidth {
    /// The device's name.
    pub device: String,
    /// Its compute capability.
    pub compute_capability: (i32, i32),
    /// Bytes per copy.
    pub bytes: usize,
    /// Creating this probe's context (the first in the process: it includes
    /// loading and initialising the driver), in milliseconds.
    pub context_ms: f64,
    /// Host to device, GB/s.
    pub h2d_gbs: f64,
    /// Device to host, GB/s.
    pub d2h_gbs: f64,
    /// Device to device, GB/s counting bytes read and written (2 x bytes per copy).
    pub d2d_gbs: f64,
}

/// Measures device `ordinal`'s copy bandwidths with `bytes`-byte copies,
/// the median of `reps` each after one warm-up. For benchmarks; a process
/// that is not a node.
pub fn probe_bandwidth(ordinal: usize, bytes: usize, reps: usize) -> Result<Bandwidth, GpuError> {
    guarded("probing the copy bandwidth", || {
        probe_unguarded(ordinal, bytes, reps)
    })
}

fn probe_unguarded(ordinal: usize, bytes: usize, reps: usize) -> Result<Bandwidth, GpuError> {
    if !driver_present() {
        return Err(no_driver());
    }
    let t = Instant::now();
    let ctx = CudaContext::new(ordinal).map_err(cuda("creating a context"))?;
    let context_ms = ms_since(t);
    let stream = ctx.new_stream().map_err(cuda("creating a stream"))?;
    let n = bytes / 8;
    let mut a = stream.alloc_zeros::<u64>(n).map_err(cuda("allocating"))?;
    let mut b = stream.alloc_zeros::<u64>(n).map_err(cuda("allocating"))?;
    // SAFETY: `n` u64 of page-locked, uninitialised memory owned by `host`;
    // zeroed below before any reference to them exists.
    let mut host = unsafe { ctx.alloc_pinned_with_flags::<u64>(n, 0) }
        .map_err(cuda("allocating pinned memory"))?;
    let ptr = host
        .as_mut_ptr()
        .map_err(cuda("allocating pinned memory"))?;
    // SAFETY: `ptr` starts the `n` u64 `host` owns, valid for writes, unaliased.
    unsafe { std::ptr::write_bytes(ptr, 0, n) };
    let time = |f: &mut dyn FnMut() -> Result<(), DriverError>| -> Result<f64, GpuError> {
        let mut secs = Vec::with_capacity(reps);
        for i in 0..=reps {
            let t = Instant::now();
            f().map_err(cuda("copying"))?;
            stream.synchronize().map_err(cuda("copying"))?;
            if i > 0 {
                secs.push(t.elapsed().as_secs_f64());
            }
        }
        secs.sort_by(f64::total_cmp);
        Ok(secs[secs.len() / 2])
    };
    let moved = (n * 8) as f64;
    let h2d = time(&mut || stream.memcpy_htod(&host, &mut a))?;
    let d2h = time(&mut || stream.memcpy_dtoh(&a, &mut host))?;
    let d2d = time(&mut || stream.memcpy_dtod(&a, &mut b))?;
    Ok(Bandwidth {
        device: ctx.name().unwrap_or_else(|_| "?".into()),
        compute_capability: ctx
            .compute_capability()
            .map_err(cuda("reading the compute capability"))?,
        bytes: n * 8,
        context_ms,
        h2d_gbs: moved / h2d / 1e9,
        d2h_gbs: moved / d2h / 1e9,
        d2d_gbs: 2.0 * moved / d2d / 1e9,
    })
}
