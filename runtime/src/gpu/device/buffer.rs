//! A PE's GPU at work: device buffers that migrate with their chare (staged
//! through a pinned host buffer), and kernel launches.

use super::*;

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
pub(super) fn restore<T: DeviceElem>(bytes: &[u8]) -> Result<DeviceBuffer<T>, GpuError> {
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
