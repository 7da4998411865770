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
use crate::pe::PeCtx;

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
/// stream. Returned by [`PeCtx::gpu`].
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
fn current() -> Result<&'static PeGpu, GpuError> {
    let rank = PE_RANK.with(Cell::get).ok_or(GpuError::NotStarted)?;
    NODE.get()
        .and_then(|n| n.pes.get(rank))
        .ok_or(GpuError::NotStarted)
}

impl PeCtx {
    /// This PE's GPU: its device, the node's context for it (the same one
    /// for the whole life of the process, whatever rescales happen) and the
    /// PE's stream. An error when the program did not ask for GPUs.
    pub fn gpu(&self) -> Result<&'static PeGpu, GpuError> {
        current()
    }
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

impl PeGpu {
    /// The local PE number (rank in its node) this GPU belongs to.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The device's ordinal (as CUDA numbers the visible devices).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The node's context for this device.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The raw context handle, for logs (it never changes in a process).
    pub fn context_handle(&self) -> usize {
        self.ctx.cu_ctx() as usize
    }

    /// This PE's stream: every buffer it creates and every kernel it launches uses it.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// A kernel registered with [`crate::Registry::gpu_module`].
    pub fn kernel(&self, module: &str, name: &str) -> Result<&Kernel, GpuError> {
        self.kernels
            .iter()
            .find(|((m, k), _)| *m == module && *k == name)
            .map(|(_, k)| k)
            .ok_or_else(|| GpuError::UnknownKernel {
                module: module.into(),
                kernel: name.into(),
            })
    }

    /// A device buffer of `len` zeros on this PE's device.
    pub fn zeros<T: DeviceElem>(&self, len: usize) -> Result<DeviceBuffer<T>, GpuError> {
        let slice = self
            .stream
            .alloc_zeros::<T>(len)
            .map_err(cuda("allocating device memory"))?;
        Ok(DeviceBuffer { slice })
    }

    /// A device buffer holding a copy of `data`.
    pub fn upload<T: DeviceElem>(&self, data: &[T]) -> Result<DeviceBuffer<T>, GpuError> {
        let slice = self
            .stream
            .clone_htod(data)
            .map_err(cuda("copying to the device"))?;
        Ok(DeviceBuffer { slice })
    }

    /// Waits until everything queued on this PE's stream ran.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.stream
            .synchronize()
            .map_err(cuda("synchronising the PE's stream"))
    }

    /// Queues `kernel` on this PE's stream. The arguments are checked against
    /// the kernel's declared parameters (count, element types, writability)
    /// and must be buffers of this PE's device.
    pub fn launch(
        &self,
        kernel: &Kernel,
        cfg: LaunchConfig,
        args: &mut [KernelArg<'_>],
    ) -> Result<(), GpuError> {
        self.check(kernel, args)?;
        let mut builder = self.stream.launch_builder(&kernel.func);
        for a in args.iter_mut() {
            match &mut a.0 {
                Arg::In(_, s) => {
                    let s: &dyn Push = *s;
                    s.push_in(&mut builder);
                }
                Arg::Out(_, s) => s.push_out(&mut builder),
                Arg::I32(v) => {
                    builder.arg(&*v);
                }
                Arg::U32(v) => {
                    builder.arg(&*v);
                }
                Arg::U64(v) => {
                    builder.arg(&*v);
                }
                Arg::F64(v) => {
                    builder.arg(&*v);
                }
            }
        }
        // SAFETY: the argument list matches the kernel's registered
        // declaration in count, and each argument matches its parameter's
        // kind (a device pointer to the declared element type, or the
        // declared scalar), which `check` verified above; every buffer
        // belongs to this context and lives (borrowed by `args`) until the
        // launch is queued, and cudarc orders its later use or free after
        // the kernel through the stream. Scalars are read by cuLaunchKernel
        // before it returns. That the declaration matches the CUDA source is
        // the registering program's promise, as with any FFI declaration.
        unsafe { builder.launch(cfg) }.map_err(cuda(format!("launching `{}`", kernel.name())))?;
        Ok(())
    }

    fn check(&self, kernel: &Kernel, args: &[KernelArg<'_>]) -> Result<(), GpuError> {
        let bad = |detail: String| GpuError::BadLaunch {
            kernel: kernel.name(),
            detail,
        };
        if args.len() != kernel.params.len() {
            return Err(bad(format!(
                "it takes {} arguments ({:?}), {} given",
                kernel.params.len(),
                kernel.params,
                args.len()
            )));
        }
        let mine = self.context_handle();
        for (i, (p, a)) in kernel.params.iter().zip(args).enumerate() {
            let ok = match (p, &a.0) {
                (Param::In(k), Arg::In(g, _) | Arg::Out(g, _)) => k == g,
                (Param::Out(k), Arg::Out(g, _)) => k == g,
                (Param::I32, Arg::I32(_))
                | (Param::U32, Arg::U32(_))
                | (Param::U64, Arg::U64(_))
                | (Param::F64, Arg::F64(_)) => true,
                _ => false,
            };
            if !ok {
                return Err(bad(format!(
                    "argument {i} is {}, the kernel declares {p:?}",
                    a.describe()
                )));
            }
            let ctx = match &a.0 {
                Arg::In(_, s) => Some(s.context()),
                Arg::Out(_, s) => Some(s.context()),
                _ => None,
            };
            if ctx.is_some_and(|c| c != mine) {
                return Err(bad(format!(
                    "argument {i} is a buffer of another context ({:#x}; this PE's is {mine:#x})",
                    ctx.unwrap_or(0)
                )));
            }
        }
        Ok(())
    }

    /// A buffer of `T` from the payload of a staged buffer, through this
    /// thread's pinned staging buffer.
    fn restore<T: DeviceElem>(&self, payload: &[u8]) -> Result<DeviceBuffer<T>, GpuError> {
        if payload.is_empty() {
            return self.zeros(0);
        }
        with_pinned(&self.ctx, payload.len(), |pinned| {
            pinned.copy_from_slice(payload);
            let src: &[T] = bytemuck::try_cast_slice(pinned).map_err(|e| GpuError::Cuda {
                what: "viewing the staging buffer".into(),
                detail: e.to_string(),
            })?;
            let slice = self
                .stream
                .clone_htod(src)
                .map_err(cuda("copying a migrated buffer to the device"))?;
            // The staging buffer is reused by the next restore.
            self.stream
                .synchronize()
                .map_err(cuda("copying a migrated buffer to the device"))?;
            Ok(DeviceBuffer { slice })
        })
    }
}

/// Runs `f` on `bytes` bytes of this thread's page-locked staging buffer,
/// allocating (or growing) it in `ctx` first.
fn with_pinned<R>(
    ctx: &Arc<CudaContext>,
    bytes: usize,
    f: impl FnOnce(&mut [u8]) -> Result<R, GpuError>,
) -> Result<R, GpuError> {
    PINNED.with(|cell| {
        let mut slot = cell.borrow_mut();
        let fits = slot
            .as_ref()
            .is_some_and(|p| p.len() >= bytes && Arc::ptr_eq(p.context(), ctx));
        if !fits {
            *slot = None;
            let len = bytes.next_power_of_two().max(1 << 16);
            // SAFETY: cuMemHostAlloc returns `len` bytes of page-locked,
            // uninitialised memory owned by `p`; they are zeroed just below,
            // before any reference to them exists. PORTABLE (not the default
            // write-combined) because the host reads what devices write here.
            let mut p = unsafe {
                ctx.alloc_pinned_with_flags::<u8>(
                    len,
                    cudarc::driver::sys::CU_MEMHOSTALLOC_PORTABLE,
                )
            }
            .map_err(cuda("allocating a pinned staging buffer"))?;
            let ptr = p
                .as_mut_ptr()
                .map_err(cuda("allocating a pinned staging buffer"))?;
            // SAFETY: `ptr` is the start of the `len` bytes `p` owns, valid
            // for writes, and nothing else refers to them yet.
            unsafe { std::ptr::write_bytes(ptr, 0, len) };
            *slot = Some(p);
        }
        let p = slot.as_mut().expect("the staging buffer was just set");
        let all = p
            .as_mut_slice()
            .map_err(cuda("waiting for the staging buffer"))?;
        f(&mut all[..bytes])
    })
}

/// Device memory a chare owns: `len` elements of `T` on its PE's device.
///
/// It migrates with its chare. Serialising it (when the chare is packed)
/// copies it to host memory through a pinned buffer on the PE's stream and
/// writes the staged form ([`staged`]); deserialising it (when the chare is
/// unpacked on its new PE) copies it to that PE's device. Deserialising on a
/// thread that is not a PE with a GPU is an error, logged with its reason.
pub struct DeviceBuffer<T: DeviceElem> {
    slice: CudaSlice<T>,
}

impl<T: DeviceElem> DeviceBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }

    /// The cudarc slice, for what this type does not wrap.
    pub fn slice(&self) -> &CudaSlice<T> {
        &self.slice
    }

    /// Copies `src` (exactly `len` elements) to the device.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<(), GpuError> {
        if src.len() != self.len() {
            return Err(GpuError::BadLaunch {
                kernel: "copy to device".into(),
                detail: format!(
                    "{} elements given for a buffer of {}",
                    src.len(),
                    self.len()
                ),
            });
        }
        let stream = self.slice.stream().clone();
        stream
            .memcpy_htod(src, &mut self.slice)
            .map_err(cuda("copying to the device"))
    }

    /// Copies the buffer into `dst` (exactly `len` elements) and waits for it.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<(), GpuError> {
        if dst.len() != self.len() {
            return Err(GpuError::BadLaunch {
                kernel: "copy to host".into(),
                detail: format!(
                    "{} elements of room for a buffer of {}",
                    dst.len(),
                    self.len()
                ),
            });
        }
        let stream = self.slice.stream();
        stream
            .memcpy_dtoh(&self.slice, dst)
            .map_err(cuda("copying to the host"))?;
        stream.synchronize().map_err(cuda("copying to the host"))
    }

    /// The buffer's contents on the host.
    pub fn to_host(&self) -> Result<Vec<T>, GpuError> {
        let mut v = vec![T::default(); self.len()];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    /// A copy on the same device (device to device).
    pub fn duplicate(&self) -> Result<Self, GpuError> {
        let slice = self
            .slice
            .stream()
            .clone_dtod(&self.slice)
            .map_err(cuda("copying on the device"))?;
        Ok(DeviceBuffer { slice })
    }

    /// Sets every element to zero.
    pub fn zero(&mut self) -> Result<(), GpuError> {
        let stream = self.slice.stream().clone();
        stream
            .memset_zeros(&mut self.slice)
            .map_err(cuda("zeroing device memory"))
    }

    /// This buffer as a read-only kernel argument.
    pub fn arg(&self) -> KernelArg<'_> {
        KernelArg(Arg::In(T::KIND, &self.slice))
    }

    /// This buffer as a kernel argument the kernel writes.
    pub fn arg_mut(&mut self) -> KernelArg<'_> {
        KernelArg(Arg::Out(T::KIND, &mut self.slice))
    }

    /// The staged form: header, then the contents through pinned memory.
    fn stage_out(&self) -> Result<Vec<u8>, GpuError> {
        let n = self.slice.num_bytes();
        let mut out = Vec::with_capacity(HEADER_LEN + n);
        out.extend_from_slice(&staged::header(T::KIND, self.len()));
        if n == 0 {
            return Ok(out);
        }
        let stream = self.slice.stream().clone();
        with_pinned(stream.context(), n, |pinned| {
            let dst: &mut [T] =
                bytemuck::try_cast_slice_mut(pinned).map_err(|e| GpuError::Cuda {
                    what: "viewing the staging buffer".into(),
                    detail: e.to_string(),
                })?;
            stream
                .memcpy_dtoh(&self.slice, dst)
                .map_err(cuda("copying a migrating buffer to the host"))?;
            stream
                .synchronize()
                .map_err(cuda("copying a migrating buffer to the host"))?;
            out.extend_from_slice(pinned);
            Ok(())
        })?;
        Ok(out)
    }
}

impl<T: DeviceElem> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer<{:?}>[{}]", T::KIND, self.len())
    }
}

impl<T: DeviceElem> Serialize for DeviceBuffer<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let t = Instant::now();
        let bytes = self.stage_out().map_err(|e| {
            error!("staging a device buffer for migration failed: {e}");
            serde::ser::Error::custom(e)
        })?;
        add_staging(t.elapsed());
        s.serialize_bytes(&bytes)
    }
}

/// Restores a staged buffer on the calling PE's device.
fn restore<T: DeviceElem>(bytes: &[u8]) -> Result<DeviceBuffer<T>, GpuError> {
    let t = Instant::now();
    let payload = staged::decode(bytes, T::KIND)?;
    let buf = current()?.restore(payload)?;
    add_staging(t.elapsed());
    Ok(buf)
}

impl<'de, T: DeviceElem> Deserialize<'de> for DeviceBuffer<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Staged<T>(PhantomData<T>);
        impl<T: DeviceElem> Visitor<'_> for Staged<T> {
            type Value = DeviceBuffer<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "a staged device buffer of {:?}", T::KIND)
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
                // Some codecs (postcard) keep only that an error happened:
                // say which here.
                restore(v).map_err(|e| {
                    error!("restoring a migrated device buffer failed: {e}");
                    E::custom(e)
                })
            }
        }
        d.deserialize_bytes(Staged(PhantomData))
    }
}

/// One argument of a kernel launch: a device buffer (see
/// [`DeviceBuffer::arg`], [`DeviceBuffer::arg_mut`]) or a scalar (`From`).
pub struct KernelArg<'a>(Arg<'a>);

enum Arg<'a> {
    In(ElemKind, &'a dyn Push),
    Out(ElemKind, &'a mut dyn Push),
    I32(i32),
    U32(u32),
    U64(u64),
    F64(f64),
}

impl KernelArg<'_> {
    fn describe(&self) -> String {
        match &self.0 {
            Arg::In(k, _) => format!("a read-only {k:?} buffer"),
            Arg::Out(k, _) => format!("a writable {k:?} buffer"),
            Arg::I32(_) => "an i32".into(),
            Arg::U32(_) => "a u32".into(),
            Arg::U64(_) => "a u64".into(),
            Arg::F64(_) => "an f64".into(),
        }
    }
}

impl From<i32> for KernelArg<'_> {
    fn from(v: i32) -> Self {
        KernelArg(Arg::I32(v))
    }
}
impl From<u32> for KernelArg<'_> {
    fn from(v: u32) -> Self {
        KernelArg(Arg::U32(v))
    }
}
impl From<u64> for KernelArg<'_> {
    fn from(v: u64) -> Self {
        KernelArg(Arg::U64(v))
    }
}
impl From<f64> for KernelArg<'_> {
    fn from(v: f64) -> Self {
        KernelArg(Arg::F64(v))
    }
}

/// A device slice of any element type, pushed onto a launch.
trait Push {
    fn push_in<'b>(&'b self, b: &mut LaunchArgs<'b>);
    fn push_out<'b>(&'b mut self, b: &mut LaunchArgs<'b>);
    fn context(&self) -> usize;
}

impl<T> Push for CudaSlice<T> {
    fn push_in<'b>(&'b self, b: &mut LaunchArgs<'b>) {
        b.arg(self);
    }
    fn push_out<'b>(&'b mut self, b: &mut LaunchArgs<'b>) {
        b.arg(self);
    }
    fn context(&self) -> usize {
        CudaSlice::context(self).cu_ctx() as usize
    }
}

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
