//! Everything that touches CUDA (feature `cuda`): the node's contexts,
//! streams and modules, device buffers and their staging, kernel launches.
//!
//! The node's GPU state is a process-wide `OnceLock`, set once at node start
//! and never replaced: a rescale re-runs runtime initialisation in the same
//! process, and nothing on that path can reach it. PE threads find their
//! stream through a thread-local set when the thread starts.
//!
//! `unsafe` is allowed here and nowhere else in the runtime's GPU code; each
//! block says why it holds.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchArgs, LaunchConfig,
    PinnedHostSlice, PushKernelArg,
};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tracing::{error, info, warn};

use super::staged::{self, DeviceElem, ElemKind, HEADER_LEN};
use super::{
    add_staging, GpuError, GpuModule, GpuSpec, Param, ENV_CONTEXT_ON_REENTRY, ENV_PTX_DIR,
};

mod buffer;
mod probe;

#[cfg(test)]
use buffer::restore;
pub use buffer::{DeviceBuffer, KernelArg};
pub use probe::{probe_bandwidth, Bandwidth};

/// The node's GPU state, created once at node start.
static NODE: OnceLock<NodeGpu> = OnceLock::new();

thread_local! {
    /// The local PE this thread runs, if it is a PE thread.
    static PE_RANK: Cell<Option<usize>> = const { Cell::new(None) };
    /// This thread's page-locked staging buffer, grown to the largest
    /// buffer it staged.
    static PINNED: RefCell<Option<PinnedHostSlice<u8>>> = const { RefCell::new(None) };
}

struct NodeGpu {
    devices: Vec<Device>,
    pes: Vec<PeGpu>,
    /// Compiled modules: name, PTX, kernel names (for the measurement mode,
    /// which loads them into fresh contexts).
    modules: Vec<(&'static str, String, Vec<&'static str>)>,
}

struct Device {
    ordinal: usize,
    ctx: Arc<CudaContext>,
}

/// A registered kernel, loaded in one context.
#[derive(Clone, Debug)]
pub struct Kernel {
    module: &'static str,
    name: &'static str,
    params: Vec<Param>,
    func: CudaFunction,
}

impl Kernel {
    /// `module::name`.
    pub fn name(&self) -> String {
        format!("{}::{}", self.module, self.name)
    }
}

/// One PE's GPU: the device it runs on, the node's context for that device
/// (created at node start, kept across every rescale) and the PE's own
/// stream. Returned by [`PeCtx::gpu`](crate::PeCtx::gpu).
pub struct PeGpu {
    rank: usize,
    ordinal: usize,
    device_name: String,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: HashMap<(&'static str, &'static str), Kernel>,
    /// Device memory written at start and checked at exit: evidence that the
    /// context and its allocations lived through whatever happened between.
    canary: CudaSlice<u64>,
    context_at_start: usize,
}

fn cuda(what: impl Into<String>) -> impl FnOnce(DriverError) -> GpuError {
    let what = what.into();
    move |e| GpuError::Cuda {
        what,
        detail: e.to_string(),
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn canary_pattern(rank: usize) -> Vec<u64> {
    (0..1024u64)
        .map(|i| 0xD0C7_11E0_0000_0000 ^ ((rank as u64) << 32) ^ i.wrapping_mul(0x9E37_79B9))
        .collect()
}

/// The NVRTC architecture of a device, where NVRTC knows it by name.
fn arch_of((major, minor): (i32, i32)) -> Option<&'static str> {
    Some(match (major, minor) {
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        _ => return None,
    })
}

/// Whether the driver library can be loaded, without panicking where it cannot.
fn driver_present() -> bool {
    // SAFETY: this only dlopen()s the driver library by its known names to
    // see whether one loads, running the library's own initialisers (the
    // NVIDIA driver's); no symbol of it is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn no_driver() -> GpuError {
    GpuError::NoDriver(
        "libcuda.so (the NVIDIA driver's library) could not be loaded; is an NVIDIA driver \
         installed, and its library directory on LD_LIBRARY_PATH?"
            .into(),
    )
}

/// Compiles `module` to PTX with NVRTC, as a node does at start, for a
/// device of compute capability `cc` (NVRTC's default architecture when
/// `None` or unknown). Needs NVRTC, not a driver or a device: this is how
/// PTX is made for [`ENV_PTX_DIR`](super::ENV_PTX_DIR) on a build machine.
pub fn compile_ptx(module: &GpuModule, cc: Option<(i32, i32)>) -> Result<String, GpuError> {
    // SAFETY: as for the driver: a dlopen() of NVRTC by name, nothing called.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::NoNvrtc);
    }
    let opts = CompileOptions {
        // No contraction of a*b+c into one FMA: results are exactly the
        // operations as written, as on the CPU.
        fmad: Some(false),
        arch: cc.and_then(arch_of),
        options: module.options.clone(),
        name: Some(format!("{}.cu", module.name)),
        ..Default::default()
    };
    guarded("compiling with NVRTC", || {
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(module.source, opts).map_err(|e| {
            GpuError::Compile {
                module: module.name.into(),
                log: match e {
                    CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
                    other => other.to_string(),
                },
            }
        })?;
        Ok(ptx.to_src())
    })
}

/// Runs `f`, turning a panic of the CUDA bindings into an error: with
/// dynamic loading, cudarc panics when the driver lacks an entry point its
/// bindings (the CUDA 12.4 API) name, as a driver older than 12.4 may. A
/// node then exits with a message instead of a panic.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        Err(GpuError::Cuda {
            what: what.into(),
            detail: format!(
                "the CUDA bindings failed: {message} (is the library older than the entry points the bindings expect?)"
            ),
        })
    })
}

pub(super) fn start(spec: &GpuSpec, pes: u32) -> Result<(), GpuError> {
    guarded("starting the node's GPUs", || start_unguarded(spec, pes))
}

fn start_unguarded(spec: &GpuSpec, pes: u32) -> Result<(), GpuError> {
    let started = Instant::now();
    if !driver_present() {
        return Err(no_driver());
    }
    let count = CudaContext::device_count().map_err(|e| GpuError::NoDevice(e.to_string()))?;
    if count <= 0 {
        return Err(GpuError::NoDevice(
            "the driver reports no device (is CUDA_VISIBLE_DEVICES empty?)".into(),
        ));
    }
    let used = (count as usize).min(pes.max(1) as usize);
    let mut devices = Vec::with_capacity(used);
    for ordinal in 0..used {
        let ctx = CudaContext::new(ordinal)
            .map_err(cuda(format!("creating the context of device {ordinal}")))?;
        // Each device's primary context, retained once and never released
        // while the process lives.
        super::context_created();
        devices.push(Device { ordinal, ctx });
    }
    let context_ms = ms_since(started);

    let t = Instant::now();
    let cc = devices[0]
        .ctx
        .compute_capability()
        .map_err(cuda("reading the compute capability"))?;
    let shipped = std::env::var_os(ENV_PTX_DIR);
    let mut modules = Vec::new();
    for m in &spec.modules {
        let ptx = match &shipped {
            Some(dir) => super::read_shipped_ptx(std::path::Path::new(dir), m)?,
            None => compile_ptx(m, Some(cc))?,
        };
        modules.push((m.name, ptx, m.kernel_names()));
    }
    let compile_ms = ms_since(t);

    let t = Instant::now();
    let mut kernels_of = Vec::with_capacity(devices.len());
    for d in &devices {
        let mut kernels = HashMap::new();
        for (m, (name, ptx, _)) in spec.modules.iter().zip(&modules) {
            let module = d
                .ctx
                .load_module(Ptx::from_src(ptx.clone()))
                .map_err(cuda(format!(
                    "loading module `{name}` on device {}",
                    d.ordinal
                )))?;
            for (k, params) in &m.kernels {
                let func = module
                    .load_function(k)
                    .map_err(cuda(format!("finding kernel `{name}::{k}`")))?;
                kernels.insert(
                    (m.name, *k),
                    Kernel {
                        module: m.name,
                        name: k,
                        params: params.clone(),
                        func,
                    },
                );
            }
        }
        kernels_of.push(kernels);
    }
    let load_ms = ms_since(t);

    let mut pe_gpus = Vec::with_capacity(pes as usize);
    for rank in 0..pes as usize {
        let d = rank % devices.len();
        let (ctx, ordinal) = (devices[d].ctx.clone(), devices[d].ordinal);
        let stream = ctx
            .new_stream()
            .map_err(cuda(format!("creating the stream of PE {rank}")))?;
        let canary = stream
            .clone_htod(&canary_pattern(rank))
            .map_err(cuda("writing the canary"))?;
        stream.synchronize().map_err(cuda("writing the canary"))?;
        let pe = PeGpu {
            rank,
            ordinal,
            device_name: ctx.name().unwrap_or_else(|_| "?".into()),
            context_at_start: ctx.cu_ctx() as usize,
            ctx,
            stream,
            kernels: kernels_of[d].clone(),
            canary,
        };
        info!(
            pid = std::process::id(),
            rank,
            device = ordinal,
            name = %pe.device_name,
            context = %format!("{:#x}", pe.context_at_start),
            stream = %format!("{:#x}", pe.stream.cu_stream() as usize),
            "gpu pe ready"
        );
        pe_gpus.push(pe);
    }
    let n_devices = devices.len();
    let node = NodeGpu {
        devices,
        pes: pe_gpus,
        modules,
    };
    if NODE.set(node).is_err() {
        return Err(GpuError::Cuda {
            what: "starting the node's GPUs".into(),
            detail: "they were already started in this process".into(),
        });
    }
    super::record_start(super::StartTimes {
        devices: n_devices,
        context_s: context_ms / 1e3,
        compile_s: compile_ms / 1e3,
        load_s: load_ms / 1e3,
    });
    info!(
        pid = std::process::id(),
        devices = n_devices,
        pes,
        context_ms = %format!("{context_ms:.3}"),
        compile_ms = %format!("{compile_ms:.3}"),
        load_ms = %format!("{load_ms:.3}"),
        total_ms = %format!("{:.3}", ms_since(started)),
        "gpu ready"
    );
    Ok(())
}

pub(super) fn bind_pe(rank: usize) {
    PE_RANK.with(|r| r.set(Some(rank)));
}

/// The calling PE thread's GPU.
pub(crate) fn current() -> Result<&'static PeGpu, GpuError> {
    let rank = PE_RANK.with(Cell::get).ok_or(GpuError::NotStarted)?;
    NODE.get()
        .and_then(|n| n.pes.get(rank))
        .ok_or(GpuError::NotStarted)
}

pub(super) fn context_on_reentry() -> Option<f64> {
    if std::env::var(ENV_CONTEXT_ON_REENTRY).ok().as_deref() != Some("1") {
        return None;
    }
    let node = NODE.get()?;
    let t = Instant::now();
    for d in &node.devices {
        let fresh = guarded("creating a fresh context", || {
            fresh_context(d.ordinal, &node.modules)
        });
        if let Err(e) = fresh {
            warn!(
                "{ENV_CONTEXT_ON_REENTRY}: creating a context on device {} failed: {e}",
                d.ordinal
            );
        }
    }
    let ms = ms_since(t);
    info!(
        pid = std::process::id(),
        ms = %format!("{ms:.3}"),
        "gpu contexts created on the rescale's critical path ({ENV_CONTEXT_ON_REENTRY}=1)"
    );
    Some(ms)
}

/// What a runtime that drops its contexts would pay again: a context, a
/// stream, a first allocation, the modules loaded (JIT from PTX). The
/// process-wide driver initialisation (cuInit) is not paid again, so this is
/// a lower bound of a restart's context cost.
fn fresh_context(
    ordinal: usize,
    modules: &[(&'static str, String, Vec<&'static str>)],
) -> Result<(), GpuError> {
    let ctx = CudaContext::new_non_primary(ordinal, 0).map_err(cuda("creating a context"))?;
    let stream = ctx.new_stream().map_err(cuda("creating a stream"))?;
    let scratch = stream
        .alloc_zeros::<u8>(1 << 20)
        .map_err(cuda("allocating"))?;
    for (name, ptx, kernels) in modules {
        let m = ctx
            .load_module(Ptx::from_src(ptx.clone()))
            .map_err(cuda(format!("loading module `{name}`")))?;
        for k in kernels {
            m.load_function(k).map_err(cuda(format!("finding `{k}`")))?;
        }
    }
    stream.synchronize().map_err(cuda("synchronising"))?;
    drop(scratch);
    drop(stream);
    drop(ctx);
    Ok(())
}

pub(super) fn at_exit() {
    let Some(node) = NODE.get() else { return };
    for pe in &node.pes {
        let now = pe.ctx.cu_ctx() as usize;
        let canary_intact = pe
            .stream
            .clone_dtoh(&pe.canary)
            .and_then(|v| pe.stream.synchronize().map(|()| v))
            .map(|v| v == canary_pattern(pe.rank));
        let canary_intact = match canary_intact {
            Ok(ok) => ok,
            Err(e) => {
                error!("gpu: reading PE {}'s canary failed: {e}", pe.rank);
                false
            }
        };
        info!(
            pid = std::process::id(),
            rank = pe.rank,
            device = pe.ordinal,
            context = %format!("{now:#x}"),
            context_at_start = %format!("{:#x}", pe.context_at_start),
            same_context = now == pe.context_at_start,
            contexts_created = super::contexts_created(),
            canary_intact,
            "gpu pe at exit"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pe_without_gpu_says_so() {
        // Not a PE thread, and no GPU started in this test process.
        let e = current().err().expect("no GPU here");
        assert!(matches!(e, GpuError::NotStarted), "{e}");
        assert!(e.to_string().contains("did not ask for GPUs"), "{e}");
    }

    #[test]
    fn restoring_a_staged_buffer_checks_the_bytes_before_any_device() {
        // Malformed bytes fail on the format, whatever the machine has.
        let bad = restore::<f64>(b"DDVB\x01").unwrap_err();
        assert!(
            matches!(bad, GpuError::Staged(staged::StagedError::Short { .. })),
            "{bad}"
        );
        let wrong = restore::<f64>(&staged::encode(&[1u32, 2])).unwrap_err();
        assert!(
            matches!(
                wrong,
                GpuError::Staged(staged::StagedError::WrongKind { .. })
            ),
            "{wrong}"
        );
        // Well-formed bytes on a thread that is not a GPU PE: a clear refusal.
        let good = staged::encode(&[1.0f64, 2.0, 3.0]);
        let e = restore::<f64>(&good).unwrap_err();
        assert!(matches!(e, GpuError::NotStarted), "{e}");
    }

    #[test]
    fn a_chare_with_a_device_buffer_fails_to_unpack_without_a_gpu_and_does_not_panic() {
        #[derive(Deserialize)]
        struct Chare {
            _n: u32,
            _data: DeviceBuffer<f64>,
        }
        // The wire form a packed chare has: its fields, the buffer as bytes.
        let wire = postcard::to_allocvec(&(7u32, staged::encode(&[0.5f64; 4]))).unwrap();
        assert!(postcard::from_bytes::<Chare>(&wire).is_err());
    }

    #[test]
    fn a_panic_in_the_bindings_becomes_an_error() {
        let e = guarded::<()>("starting", || panic!("Missing symbol cuCtxCreate_v4")).unwrap_err();
        assert!(
            e.to_string().contains("while starting")
                && e.to_string().contains("Missing symbol cuCtxCreate_v4"),
            "{e}"
        );
        assert_eq!(guarded("x", || Ok(7)).unwrap(), 7);
    }

    #[test]
    fn without_a_driver_start_fails_cleanly() {
        if driver_present() {
            return; // a machine with a driver: covered by e2e/gpu/run.sh
        }
        let e = start(&GpuSpec::default(), 2).unwrap_err();
        assert!(matches!(e, GpuError::NoDriver(_)), "{e}");
        assert!(e.to_string().contains("libcuda.so"), "{e}");
        assert!(probe_bandwidth(0, 1 << 20, 1).is_err());
    }

    // The two tests below need NVRTC on the loader's path:
    // `scripts/install-cuda-tools` and LD_LIBRARY_PATH=target/cuda-tools/lib
    // (scripts/test runs them so). No driver or device is needed.

    #[test]
    #[ignore = "needs NVRTC on LD_LIBRARY_PATH (scripts/install-cuda-tools; scripts/test runs it)"]
    fn nvrtc_compiles_a_module_for_the_device_and_without_contraction() {
        let m = GpuModule::new(
            "axpy",
            r#"extern "C" __global__ void axpy(const double* x, double* y, double a, int n) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) y[i] = a * x[i] + y[i];
            }"#,
        )
        .kernel(
            "axpy",
            &[
                Param::In(ElemKind::F64),
                Param::Out(ElemKind::F64),
                Param::F64,
                Param::I32,
            ],
        );
        let ptx = compile_ptx(&m, Some((9, 0))).expect("NVRTC compiles it");
        assert!(ptx.contains(".target sm_90"), "{ptx}");
        assert!(ptx.contains(".entry axpy"), "{ptx}");
        // `a * x + y` as written: a multiply and an add, never one FMA.
        assert!(
            ptx.contains("mul.rn.f64") && ptx.contains("add.rn.f64"),
            "{ptx}"
        );
        assert!(!ptx.contains("fma."), "{ptx}");
        // An architecture NVRTC has no name for: its default, still PTX.
        let default = compile_ptx(&m, Some((1, 0))).expect("default architecture");
        assert!(default.contains(".entry axpy"), "{default}");
    }

    #[test]
    #[ignore = "needs NVRTC on LD_LIBRARY_PATH (scripts/install-cuda-tools; scripts/test runs it)"]
    fn nvrtc_refuses_a_broken_module_with_its_log() {
        let m = GpuModule::new(
            "broken",
            r#"extern "C" __global__ void k(int* p) { *p = undeclared; }"#,
        );
        let e = compile_ptx(&m, Some((8, 0))).expect_err("does not compile");
        let GpuError::Compile { module, log } = &e else {
            panic!("not a compile error: {e}")
        };
        assert_eq!(module, "broken");
        assert!(
            log.contains("broken.cu") && log.contains("undeclared"),
            "{log}"
        );
    }
}
