//! GPUs: CUDA contexts that outlive every rescale, device buffers that
//! migrate with their chare, kernels compiled at node start (docs/gpu.md).
//!
//! A program asks for GPUs in its registration function
//! ([`crate::Registry::gpus`], [`crate::Registry::gpu_module`]). The node
//! then, before it even registers with the coordinator, loads the CUDA
//! driver, creates one context per device it uses, one stream per PE,
//! compiles the registered modules with NVRTC and loads them. A newcomer
//! therefore pays all of that before it can be admitted, off the rescale's
//! critical path; a survivor keeps all of it, because nothing a rescale
//! resets (topology, trees, tables, queues) holds it. Where no driver or
//! device exists the node exits at start (code 2) with a message saying so.
//!
//! Everything that touches CUDA is in `device` (feature `cuda`, the one
//! module of the runtime allowed `unsafe` besides the UCX FFI). This module
//! holds what is plain data: the registration types, the errors, the staged
//! buffer format ([`staged`]) and the counters rescales report.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use thiserror::Error;

pub mod staged;

#[cfg(feature = "cuda")]
mod device;

/// The CUDA bindings the runtime is built on, for launch configurations and
/// anything [`PeGpu`] does not wrap.
#[cfg(feature = "cuda")]
pub use cudarc;
#[cfg(feature = "cuda")]
pub(crate) use device::current;
#[cfg(feature = "cuda")]
pub use device::{compile_ptx, probe_bandwidth, Bandwidth, DeviceBuffer, Kernel, KernelArg, PeGpu};
pub use staged::{DeviceElem, ElemKind, StagedError};

/// Measurement only: when `1`, every surviving node creates (and destroys) a
/// fresh CUDA context per device, with its modules, during re-entry, so a
/// rescale pays context creation on its critical path the way a runtime that
/// drops contexts would. The report's `gpu` entry `context` shows the cost.
pub const ENV_CONTEXT_ON_REENTRY: &str = "DUCTILE_GPU_CONTEXT_ON_REENTRY";

/// A directory of PTX files made beforehand (`<module>.ptx`, written by
/// [`write_shipped_ptx`]): when set, a node loads its modules from there
/// instead of compiling them with NVRTC, for machines that have a driver
/// but no CUDA toolkit. Each file names the source and options it was
/// compiled from; one made from another source is refused.
pub const ENV_PTX_DIR: &str = "DUCTILE_GPU_PTX_DIR";

/// What went wrong with a GPU.
#[derive(Debug, Error)]
pub enum GpuError {
    /// The program asks for GPUs but the runtime was built without them.
    #[error("this program asks for GPUs, but it was built without the `cuda` feature of the ductile runtime (rebuild with `--features cuda`)")]
    NotBuilt,
    /// No CUDA driver library could be loaded.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// The driver loaded but found no device.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// NVRTC (the run-time compiler) could not be loaded.
    #[error("no NVRTC library (libnvrtc.so): the program compiles its GPU kernels at start and needs the CUDA toolkit's NVRTC on the library path (LD_LIBRARY_PATH), or PTX made beforehand in {ENV_PTX_DIR}")]
    NoNvrtc,
    /// A shipped PTX file (see [`ENV_PTX_DIR`]) is missing or was not made
    /// from this program's module.
    #[error("shipped PTX {path}: {detail}")]
    ShippedPtx {
        /// The file.
        path: String,
        /// What is wrong with it.
        detail: String,
    },
    /// This PE has no GPU: the job was not started with GPUs.
    #[error("this PE has no GPU: the program did not ask for GPUs at registration (`Registry::gpus` or `Registry::gpu_module`), or this thread is not a PE")]
    NotStarted,
    /// A CUDA call failed.
    #[error("CUDA failed while {what}: {detail}")]
    Cuda {
        /// What the runtime was doing.
        what: String,
        /// The driver's error.
        detail: String,
    },
    /// NVRTC refused a module's source.
    #[error("NVRTC could not compile GPU module `{module}`: {log}")]
    Compile {
        /// The module's name.
        module: String,
        /// NVRTC's log.
        log: String,
    },
    /// No kernel of that name was registered.
    #[error("no GPU kernel `{module}::{kernel}` was registered")]
    UnknownKernel {
        /// Module name.
        module: String,
        /// Kernel name.
        kernel: String,
    },
    /// A launch's arguments do not match the kernel's declaration.
    #[error("launching `{kernel}`: {detail}")]
    BadLaunch {
        /// Kernel name.
        kernel: String,
        /// What does not match.
        detail: String,
    },
    /// A staged buffer could not be read.
    #[error(transparent)]
    Staged(#[from] StagedError),
}

/// One parameter of a kernel, as declared at registration; launches are
/// checked against the declaration, so a kernel cannot be handed a buffer
/// of another element type or a read-only buffer where it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// A device buffer the kernel only reads (`const T*`).
    In(ElemKind),
    /// A device buffer the kernel writes (`T*`); the launch borrows it mutably.
    Out(ElemKind),
    /// `int`.
    I32,
    /// `unsigned int`.
    U32,
    /// `unsigned long long`.
    U64,
    /// `double`.
    F64,
}

/// A CUDA C++ module a program registers: compiled with NVRTC once per node
/// at start, loaded into every context the node holds, with the kernels it
/// exports and their parameters.
#[derive(Clone, Debug)]
pub struct GpuModule {
    pub(crate) name: &'static str,
    pub(crate) source: &'static str,
    pub(crate) kernels: Vec<(&'static str, Vec<Param>)>,
    pub(crate) options: Vec<String>,
}

impl GpuModule {
    /// A module named `name` (unique in the program) from CUDA C++ `source`.
    /// It is compiled with `--fmad=false`: no multiply-add contraction, so
    /// floating-point results are those of the operations as written.
    pub fn new(name: &'static str, source: &'static str) -> Self {
        GpuModule {
            name,
            source,
            kernels: Vec::new(),
            options: Vec::new(),
        }
    }

    /// Declares an `extern "C" __global__` kernel of the module and its parameters.
    pub fn kernel(mut self, name: &'static str, params: &[Param]) -> Self {
        self.kernels.push((name, params.to_vec()));
        self
    }

    /// Adds an NVRTC option (e.g. `-DBLOCK=256`).
    pub fn option(mut self, option: impl Into<String>) -> Self {
        self.options.push(option.into());
        self
    }

    /// The name the module is registered under.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The declared kernels' names, in declaration order.
    pub fn kernel_names(&self) -> Vec<&'static str> {
        self.kernels.iter().map(|(k, _)| *k).collect()
    }

    pub(crate) fn signature(&self) -> String {
        let kernels: Vec<String> = self
            .kernels
            .iter()
            .map(|(k, p)| format!("{k}{p:?}"))
            .collect();
        format!(
            "gpu module {} source={:016x} options={:?} kernels={}",
            self.name,
            crate::ids::fnv1a(self.source.as_bytes()),
            self.options,
            kernels.join(",")
        )
    }
}

/// The first line of a shipped PTX file: a PTX comment naming the module's
/// source (its hash), options and kernels.
fn ptx_header(module: &GpuModule) -> String {
    format!("// ductile {}", module.signature())
}

/// Where `module`'s shipped PTX lives in `dir`.
pub fn shipped_ptx_path(dir: &Path, module: &GpuModule) -> PathBuf {
    dir.join(format!("{}.ptx", module.name))
}

/// Writes `ptx` (from [`compile_ptx`]) as `module`'s shipped PTX in `dir`,
/// headed by the line that ties it to the module's source.
pub fn write_shipped_ptx(dir: &Path, module: &GpuModule, ptx: &str) -> std::io::Result<PathBuf> {
    let path = shipped_ptx_path(dir, module);
    std::fs::write(&path, format!("{}\n{ptx}", ptx_header(module)))?;
    Ok(path)
}

/// Reads `module`'s shipped PTX from `dir`; refuses a file made from
/// another source, other options or other kernels.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn read_shipped_ptx(dir: &Path, module: &GpuModule) -> Result<String, GpuError> {
    let path = shipped_ptx_path(dir, module);
    let fail = |detail: String| GpuError::ShippedPtx {
        path: path.display().to_string(),
        detail,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| fail(format!("cannot be read: {e}")))?;
    let (first, _) = text.split_once('\n').unwrap_or((&text, ""));
    let want = ptx_header(module);
    if first != want {
        return Err(fail(format!(
            "was not made from this program's module (it says {first:?}, the program has {want:?}); make it again"
        )));
    }
    Ok(text)
}

/// What a program's registration asks of GPUs.
#[derive(Clone, Debug, Default)]
pub(crate) struct GpuSpec {
    pub modules: Vec<GpuModule>,
}

thread_local! {
    /// Time this thread spent staging device buffers (out and in) since it
    /// last reported.
    static STAGING: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// Adds `d` to this thread's staging time.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn add_staging(d: Duration) {
    STAGING.with(|s| s.set(s.get() + d));
}

/// This thread's staging time since the last call, in nanoseconds (what a
/// PE reports at the end of a load-balancing step).
pub(crate) fn take_staging_ns() -> u64 {
    STAGING.with(|s| s.replace(Duration::ZERO)).as_nanos() as u64
}

/// What this process's GPU start-up took (the node's metrics show it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct StartTimes {
    /// Devices in use.
    pub devices: usize,
    /// Seconds creating (retaining) the contexts.
    pub context_s: f64,
    /// Seconds compiling modules with NVRTC (or reading shipped PTX).
    pub compile_s: f64,
    /// Seconds loading modules into the contexts.
    pub load_s: f64,
}

static START_TIMES: OnceLock<StartTimes> = OnceLock::new();
/// Contexts this process created; rescales never add to it.
static CONTEXTS_CREATED: AtomicUsize = AtomicUsize::new(0);

/// Records this process's GPU start-up (once; later calls are ignored).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record_start(times: StartTimes) {
    let _ = START_TIMES.set(times);
}

/// Counts one context created.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn context_created() {
    CONTEXTS_CREATED.fetch_add(1, Ordering::SeqCst);
}

/// This process's GPU start-up, once its GPUs started (None without GPUs).
pub(crate) fn start_times() -> Option<StartTimes> {
    START_TIMES.get().copied()
}

/// CUDA contexts this process created (at start; the measurement mode's
/// throw-away contexts are not counted).
pub(crate) fn contexts_created() -> usize {
    CONTEXTS_CREATED.load(Ordering::SeqCst)
}

/// Node start: creates the contexts, streams and modules `spec` asks for,
/// for `pes` local PEs.
pub(crate) fn start(spec: &GpuSpec, pes: u32) -> Result<(), GpuError> {
    #[cfg(feature = "cuda")]
    {
        device::start(spec, pes)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (spec, pes);
        Err(GpuError::NotBuilt)
    }
}

/// Marks the calling thread as local PE `rank` (its stream, its device).
pub(crate) fn bind_pe(rank: usize) {
    #[cfg(feature = "cuda")]
    device::bind_pe(rank);
    #[cfg(not(feature = "cuda"))]
    let _ = rank;
}

/// Re-entry after a rescale: with [`ENV_CONTEXT_ON_REENTRY`] set and GPUs in
/// use, creates and destroys fresh contexts and returns the milliseconds it
/// took; otherwise does nothing.
pub(crate) fn context_on_reentry() -> Option<f64> {
    #[cfg(feature = "cuda")]
    {
        device::context_on_reentry()
    }
    #[cfg(not(feature = "cuda"))]
    None
}

/// Process end: checks and logs that each PE's context and device memory are
/// those created at start.
pub(crate) fn at_exit() {
    #[cfg(feature = "cuda")]
    device::at_exit();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_ptx_is_tied_to_its_module() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let m = GpuModule::new(
            "stencil",
            "extern \"C\" __global__ void k(int* p) { *p = 1; }",
        )
        .kernel("k", &[Param::Out(ElemKind::I32)]);
        let ptx = ".version 8.4\n.target sm_80\n";
        let path = write_shipped_ptx(dir.path(), &m, ptx).expect("written");
        assert_eq!(path, dir.path().join("stencil.ptx"));
        let read = read_shipped_ptx(dir.path(), &m).expect("the same module reads it");
        assert!(read.ends_with(ptx) && read.starts_with("// ductile gpu module stencil"));

        // Another source, another option or another kernel list: refused.
        let others = [
            GpuModule::new(
                "stencil",
                "extern \"C\" __global__ void k(int* p) { *p = 2; }",
            )
            .kernel("k", &[Param::Out(ElemKind::I32)]),
            m.clone().option("-DX=1"),
            m.clone().kernel("j", &[]),
        ];
        for other in &others {
            let e = read_shipped_ptx(dir.path(), other).expect_err("stale PTX");
            assert!(
                e.to_string()
                    .contains("was not made from this program's module"),
                "{e}"
            );
        }
        // A module with no file: the path is named.
        let missing = GpuModule::new("other", "");
        let e = read_shipped_ptx(dir.path(), &missing).expect_err("no file");
        assert!(
            e.to_string().contains("other.ptx") && e.to_string().contains("cannot be read"),
            "{e}"
        );
    }

    #[test]
    fn staging_time_is_taken_once() {
        add_staging(Duration::from_micros(3));
        add_staging(Duration::from_micros(4));
        assert_eq!(take_staging_ns(), 7_000);
        assert_eq!(take_staging_ns(), 0);
    }

    #[test]
    fn module_signature_covers_source_and_kernels() {
        let a = GpuModule::new("m", "__global__ void k(){}").kernel("k", &[Param::I32]);
        let b = GpuModule::new("m", "__global__ void k(){ }").kernel("k", &[Param::I32]);
        let c = GpuModule::new("m", "__global__ void k(){}").kernel("k", &[Param::U32]);
        assert_ne!(a.signature(), b.signature());
        assert_ne!(a.signature(), c.signature());
        assert_eq!(a.signature(), a.clone().signature());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_the_feature_gpus_are_refused_clearly() {
        let e = start(&GpuSpec::default(), 1).unwrap_err();
        assert!(matches!(e, GpuError::NotBuilt));
        assert!(e.to_string().contains("--features cuda"), "{e}");
        assert_eq!(context_on_reentry(), None);
    }
}
