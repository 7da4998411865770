//! The only `unsafe` code of the runtime: a thin, safe wrapper over the
//! parts of libucp (through `ucx1-sys`) the UCX transport uses. Every block
//! says why it is sound; everything above this module is safe Rust.
//!
//! Ownership rules the wrapper enforces:
//! - [`Worker`] owns the UCP context and worker and destroys them on drop;
//!   every object made from it ([`Ep`], [`Incoming`], [`Closing`]) holds an
//!   `Arc<Worker>`, so the worker outlives them. A close or a receive let
//!   go before it completed (an endpoint dropped unclosed included) is
//!   handed to the worker, which finishes it before it is destroyed: UCX
//!   1.13 aborts when a worker is destroyed under an endpoint's requests.
//! - A send owns its bytes (`Vec<u8>`) until UCX reports completion; a
//!   receive owns its buffer until its request completed (then the worker
//!   does, if the receive was let go). Only a worker whose requests do not
//!   finish within [`TEARDOWN_GRACE`] leaks them, and itself, rather than
//!   free memory UCX may still write.
//! - Endpoints use `UCP_ERR_HANDLING_MODE_PEER`: a failed peer is queued by
//!   the error callback and read with [`Worker::take_failed`].

// The workspace denies unsafe code; this module is the one exception, because
// UCX is a C library reached only through FFI. Nothing unsafe leaks out of it.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ucx1_sys as sys;

/// How long a worker being dropped progresses the requests left to it
/// before it gives up and leaks itself rather than abort the process.
const TEARDOWN_GRACE: Duration = Duration::from_secs(2);

/// A UCX failure, as text.
pub(super) type UcxResult<T> = Result<T, String>;

fn status_text(code: isize) -> String {
    let name = match code {
        -1 => "no message",
        -2 => "no resource",
        -3 => "I/O error",
        -4 => "out of memory",
        -5 => "invalid parameter",
        -6 => "destination unreachable",
        -7 => "invalid address",
        -8 => "not implemented",
        -9 => "message truncated",
        -16 => "request cancelled",
        -20 => "endpoint timeout",
        -25 => "connection reset",
        _ => "error",
    };
    format!("UCX {name} ({code})")
}

fn check(st: sys::ucs_status_t, what: &str) -> UcxResult<()> {
    match st {
        sys::ucs_status_t::UCS_OK => Ok(()),
        other => Err(format!("{what}: {}", status_text(other as i32 as isize))),
    }
}

/// What a `ucs_status_ptr_t` holds.
enum StatusPtr {
    Done,
    Pending(*mut c_void),
    Failed(isize),
}

fn status_ptr(p: sys::ucs_status_ptr_t) -> StatusPtr {
    let v = p as isize;
    if p.is_null() {
        StatusPtr::Done
    } else if (-100..0).contains(&v) {
        // UCS_PTR_IS_ERR: the pointer encodes a status in [UCS_ERR_LAST, 0).
        StatusPtr::Failed(v)
    } else {
        StatusPtr::Pending(p)
    }
}

/// A UCP context and one multi-threaded worker.
pub(super) struct Worker {
    ctx: sys::ucp_context_h,
    h: sys::ucp_worker_h,
    efd: i32,
    address: Vec<u8>,
    /// Peers whose endpoint failed: (peer uid, why), queued by `ep_failed`.
    failed: Arc<Mutex<Vec<(u64, String)>>>,
    /// The error-callback arguments of every endpoint ever created, freed
    /// with the worker (after which no callback can run).
    ep_ctxs: Mutex<Vec<*mut EpCtx>>,
    /// Endpoints in `UCP_ERR_HANDLING_MODE_PEER` (failures reported, forced
    /// close) or `NONE` (which UCX 1.13's shared-memory transports require).
    peer_errors: bool,
    /// This worker's sends that have not completed yet.
    sends: Arc<AtomicUsize>,
    /// Requests whose owner let go before they completed, finished by
    /// [`Worker::finish_abandoned`] before the worker is destroyed.
    abandoned: Mutex<Vec<Abandoned>>,
}

/// A request nobody waits for any more, with the buffer UCX may still write.
struct Abandoned {
    req: *mut c_void,
    _buf: Vec<u8>,
}

/// What an endpoint's error callback needs.
struct EpCtx {
    uid: u64,
    failed: Arc<Mutex<Vec<(u64, String)>>>,
}

// SAFETY: the worker is created in UCS_THREAD_MODE_MULTI (checked in `new`),
// so libucp serialises calls on it internally; the context is only used to
// create it and to clean up after it is destroyed.
unsafe impl Send for Worker {}
// SAFETY: see `Send`: every method takes the worker's internal lock.
unsafe impl Sync for Worker {}

impl Worker {
    /// Reads the UCX configuration from the environment (`UCX_TLS`,
    /// `UCX_NET_DEVICES`, ...), applies `overrides` (names without the
    /// `UCX_` prefix) on top, and creates a context with tag matching and
    /// wake-up, and one worker that many threads may call.
    pub(super) fn new(overrides: &[(&str, &str)], peer_errors: bool) -> UcxResult<Arc<Worker>> {
        let mut config: *mut sys::ucp_config_t = ptr::null_mut();
        // SAFETY: null prefix and file mean "UCX_ variables and defaults";
        // `config` is a valid out-pointer.
        check(
            unsafe { sys::ucp_config_read(ptr::null(), ptr::null(), &mut config) },
            "reading the UCX configuration",
        )?;
        for (name, value) in overrides {
            let (Ok(n), Ok(v)) = (
                std::ffi::CString::new(*name),
                std::ffi::CString::new(*value),
            ) else {
                // SAFETY: config came from ucp_config_read and is released once.
                unsafe { sys::ucp_config_release(config) };
                return Err(format!("UCX setting {name}={value} contains a NUL byte"));
            };
            // SAFETY: config is live; n and v are NUL-terminated and outlive the call.
            let st = unsafe { sys::ucp_config_modify(config, n.as_ptr(), v.as_ptr()) };
            if let Err(e) = check(st, &format!("setting UCX_{name}={value}")) {
                // SAFETY: as above.
                unsafe { sys::ucp_config_release(config) };
                return Err(e);
            }
        }
        // SAFETY: ucp_params_t is a plain C struct of integers, pointers and
        // optional callbacks, for which all-zero bytes are valid (null/None).
        let mut params: sys::ucp_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = (sys::ucp_params_field::UCP_PARAM_FIELD_FEATURES
            | sys::ucp_params_field::UCP_PARAM_FIELD_MT_WORKERS_SHARED)
            .0 as u64;
        params.features =
            (sys::ucp_feature::UCP_FEATURE_TAG | sys::ucp_feature::UCP_FEATURE_WAKEUP).0 as u64;
        params.mt_workers_shared = 1;
        let mut ctx: sys::ucp_context_h = ptr::null_mut();
        // SAFETY: params and config are valid for the call; ctx is an out-pointer.
        let st = unsafe {
            sys::ucp_init_version(
                sys::UCP_API_MAJOR,
                sys::UCP_API_MINOR,
                &params,
                config,
                &mut ctx,
            )
        };
        // SAFETY: config came from ucp_config_read and is released once.
        unsafe { sys::ucp_config_release(config) };
        check(st, "initialising UCX")?;

        // SAFETY: as for ucp_params_t; thread_mode 0 is a valid enum value
        // and is overwritten below.
        let mut wp: sys::ucp_worker_params_t = unsafe { std::mem::zeroed() };
        wp.field_mask = sys::ucp_worker_params_field::UCP_WORKER_PARAM_FIELD_THREAD_MODE.0 as u64;
        wp.thread_mode = sys::ucs_thread_mode_t::UCS_THREAD_MODE_MULTI;
        let mut h: sys::ucp_worker_h = ptr::null_mut();
        // SAFETY: ctx is a live context; wp is valid; h is an out-pointer.
        let st = unsafe { sys::ucp_worker_create(ctx, &wp, &mut h) };
        if let Err(e) = check(st, "creating the UCX worker") {
            // SAFETY: ctx is live and owns no worker.
            unsafe { sys::ucp_cleanup(ctx) };
            return Err(e);
        }
        // From here on, dropping `w` destroys the worker and the context.
        let mut w = Worker {
            ctx,
            h,
            efd: -1,
            address: Vec::new(),
            failed: Arc::new(Mutex::new(Vec::new())),
            ep_ctxs: Mutex::new(Vec::new()),
            peer_errors,
            sends: Arc::new(AtomicUsize::new(0)),
            abandoned: Mutex::new(Vec::new()),
        };

        // SAFETY: all-zero ucp_worker_attr_t is valid (see above).
        let mut attr: sys::ucp_worker_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = sys::ucp_worker_attr_field::UCP_WORKER_ATTR_FIELD_THREAD_MODE.0 as u64;
        // SAFETY: h is live; attr is a valid out-struct.
        check(
            unsafe { sys::ucp_worker_query(h, &mut attr) },
            "querying the UCX worker",
        )?;
        if attr.thread_mode != sys::ucs_thread_mode_t::UCS_THREAD_MODE_MULTI {
            return Err(format!(
                "this libucp gives a {:?} worker; the transport needs UCS_THREAD_MODE_MULTI \
                 (UCX built with --enable-mt, as Debian's libucx0 is)",
                attr.thread_mode
            ));
        }

        let mut addr: *mut sys::ucp_address_t = ptr::null_mut();
        let mut len: sys::size_t = 0;
        // SAFETY: h is live; addr and len are out-pointers.
        check(
            unsafe { sys::ucp_worker_get_address(h, &mut addr, &mut len) },
            "reading the UCX worker address",
        )?;
        // SAFETY: UCX returned `len` readable bytes at `addr`; we copy them
        // and release the address exactly once.
        w.address = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) }.to_vec();
        // SAFETY: addr came from ucp_worker_get_address on this worker.
        unsafe { sys::ucp_worker_release_address(h, addr) };

        let mut efd: i32 = -1;
        // SAFETY: h is live and was created with UCP_FEATURE_WAKEUP.
        check(
            unsafe { sys::ucp_worker_get_efd(h, &mut efd) },
            "reading the UCX event fd",
        )?;
        w.efd = efd;
        Ok(Arc::new(w))
    }

    /// This worker's address (opaque bytes for the view).
    pub(super) fn address(&self) -> &[u8] {
        &self.address
    }

    /// Progresses communication once; true when something happened.
    pub(super) fn progress(&self) -> bool {
        // SAFETY: the worker is live and multi-threaded.
        unsafe { sys::ucp_worker_progress(self.h) != 0 }
    }

    /// Arms the event fd ([`Worker::efd`]): the next event makes it
    /// readable. False when events are pending already (`UCS_ERR_BUSY`):
    /// the caller progresses instead of sleeping.
    pub(super) fn arm(&self) -> bool {
        // SAFETY: the worker is live and was created with UCP_FEATURE_WAKEUP.
        unsafe { sys::ucp_worker_arm(self.h) == sys::ucs_status_t::UCS_OK }
    }

    /// The worker's event fd: readable once an event comes after
    /// [`Worker::arm`], or after [`Worker::signal`].
    pub(super) fn efd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: UCX owns the descriptor and keeps it open for the
        // worker's life, which the borrow does not outlive.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.efd) }
    }

    /// Makes the event fd readable, waking whoever sleeps on it.
    pub(super) fn signal(&self) {
        // SAFETY: the worker is live; ucp_worker_signal is thread-safe.
        unsafe { sys::ucp_worker_signal(self.h) };
    }

    /// Sends of this worker handed to UCX and not completed yet: its
    /// communication thread does not sleep while there are any.
    pub(super) fn sends_in_flight(&self) -> usize {
        self.sends.load(Ordering::SeqCst)
    }

    /// Takes over a request its owner no longer waits for (and the buffer
    /// UCX may still write into), to be finished before the worker goes.
    fn abandon(&self, req: *mut c_void, buf: Vec<u8>) {
        self.abandoned
            .lock()
            .expect("abandoned requests poisoned")
            .push(Abandoned { req, _buf: buf });
    }

    /// Frees the abandoned requests that completed since the last call, so
    /// a long job does not accumulate them; the communication thread calls
    /// this as it goes.
    pub(super) fn reap_abandoned(&self) {
        let mut abandoned = self.abandoned.lock().expect("abandoned requests poisoned");
        if !abandoned.is_empty() {
            reap(&mut abandoned);
        }
    }

    /// Progresses the worker until every abandoned request and every send
    /// completed, for at most [`TEARDOWN_GRACE`]. False when some are left.
    fn finish_abandoned(&mut self) -> bool {
        let until = Instant::now() + TEARDOWN_GRACE;
        loop {
            self.progress();
            let abandoned = self
                .abandoned
                .get_mut()
                .expect("abandoned requests poisoned");
            reap(abandoned);
            if abandoned.is_empty() && self.sends_in_flight() == 0 {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Peers whose endpoint failed since the last call: (uid, why).
    pub(super) fn take_failed(&self) -> Vec<(u64, String)> {
        std::mem::take(&mut *self.failed.lock().expect("failed list poisoned"))
    }

    /// Opens an endpoint to the worker whose address is `remote` (the peer
    /// whose uid is `uid`), in `UCP_ERR_HANDLING_MODE_PEER`: if the peer
    /// fails, UCX reports it (see [`Worker::take_failed`]) instead of
    /// leaving sends hanging, and a forced close is allowed.
    pub(super) fn connect(self: &Arc<Self>, remote: &[u8], uid: u64) -> UcxResult<Ep> {
        if remote.is_empty() {
            return Err("empty UCX worker address".into());
        }
        let ctx = Box::into_raw(Box::new(EpCtx {
            uid,
            failed: self.failed.clone(),
        }));
        // Freed with the worker, whatever becomes of the endpoint.
        self.ep_ctxs
            .lock()
            .expect("endpoint contexts poisoned")
            .push(ctx);
        // SAFETY: all-zero ucp_ep_params_t is valid (err_mode 0 = NONE, no
        // callback); the fields used are set below.
        let mut p: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
        p.field_mask = sys::ucp_ep_params_field::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS.0 as u64;
        p.address = remote.as_ptr() as *const sys::ucp_address_t;
        if self.peer_errors {
            p.field_mask |= (sys::ucp_ep_params_field::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | sys::ucp_ep_params_field::UCP_EP_PARAM_FIELD_ERR_HANDLER)
                .0 as u64;
            p.err_mode = sys::ucp_err_handling_mode_t::UCP_ERR_HANDLING_MODE_PEER;
            p.err_handler.cb = Some(ep_failed);
            p.err_handler.arg = ctx as *mut c_void;
        }
        let mut ep: sys::ucp_ep_h = ptr::null_mut();
        // SAFETY: the worker is live; `remote` stays borrowed for the call
        // (UCX copies what it needs); `ctx` lives until the worker is
        // destroyed, so the callback never sees a dangling argument. The
        // address bytes come from the coordinator's view, which only
        // authenticated members of the job write; UCX parses them and
        // rejects malformed ones with an error status.
        check(
            unsafe { sys::ucp_ep_create(self.h, &p, &mut ep) },
            "creating a UCX endpoint",
        )?;
        Ok(Ep {
            h: ep,
            worker: self.clone(),
        })
    }
}

/// Frees and drops the requests of `abandoned` that completed.
fn reap(abandoned: &mut Vec<Abandoned>) {
    abandoned.retain(|a| {
        // SAFETY: a live request of this worker, freed only here.
        let st = unsafe { sys::ucp_request_check_status(a.req) };
        if st == sys::ucs_status_t::UCS_INPROGRESS {
            return true;
        }
        // SAFETY: completed; freed once and dropped from the list.
        unsafe { sys::ucp_request_free(a.req) };
        false
    });
}

/// Queues the failure of the endpoint whose context is `arg`.
unsafe extern "C" fn ep_failed(arg: *mut c_void, _ep: sys::ucp_ep_h, st: sys::ucs_status_t) {
    // SAFETY: `arg` is the EpCtx registered with this endpoint, alive until
    // the worker is destroyed (and no callback runs after that).
    let ctx = unsafe { &*(arg as *const EpCtx) };
    let why = status_text(st as i32 as isize);
    if let Ok(mut failed) = ctx.failed.lock() {
        failed.push((ctx.uid, why));
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if !self.finish_abandoned() {
            // Destroying the worker now would abort the process (UCX 1.13
            // asserts that no endpoint has requests left): leak it instead,
            // with the buffers UCX may still write into.
            let left = self.abandoned.get_mut().map(|a| a.len()).unwrap_or(0);
            tracing::warn!(
                requests = left,
                sends = self.sends_in_flight(),
                "UCX requests did not finish within {TEARDOWN_GRACE:?}; \
                 leaving the worker undestroyed"
            );
            std::mem::forget(std::mem::take(self.abandoned.get_mut().expect("poisoned")));
            return;
        }
        // SAFETY: every Ep, Incoming and Closing holds an Arc<Worker>, so
        // none is left, and nothing is in flight any more; the worker and
        // then the context are destroyed once.
        unsafe {
            sys::ucp_worker_destroy(self.h);
            sys::ucp_cleanup(self.ctx);
        }
        for ctx in self
            .ep_ctxs
            .get_mut()
            .expect("endpoint contexts poisoned")
            .drain(..)
        {
            // SAFETY: made by Box::into_raw in `connect`, freed once, after
            // the worker whose error callbacks used it is gone.
            drop(unsafe { Box::from_raw(ctx) });
        }
    }
}

/// An endpoint to one peer.
pub(super) struct Ep {
    h: sys::ucp_ep_h,
    worker: Arc<Worker>,
}

// SAFETY: endpoints of a multi-threaded worker may be used from any thread.
unsafe impl Send for Ep {}
// SAFETY: as for Send.
unsafe impl Sync for Ep {}

/// What a send keeps alive until UCX is done with it.
struct SendCtx {
    /// Held, never read: UCX reads it through the pointer given to it.
    _bytes: Vec<u8>,
    done: Option<Arc<AtomicBool>>,
    /// The worker's count of sends in flight.
    sends: Arc<AtomicUsize>,
}

unsafe extern "C" fn send_done(request: *mut c_void, _st: sys::ucs_status_t, user: *mut c_void) {
    // SAFETY: `user` is the Box<SendCtx> leaked by `Ep::send` for this
    // request, reclaimed exactly once here; the request is ours to free.
    let ctx = unsafe {
        sys::ucp_request_free(request);
        Box::from_raw(user as *mut SendCtx)
    };
    if let Some(done) = &ctx.done {
        done.store(true, Ordering::SeqCst);
    }
    ctx.sends.fetch_sub(1, Ordering::SeqCst);
}

impl Ep {
    /// Sends `bytes` with `tag`, keeping the buffer (no copy) until UCX
    /// completes the send; UCX picks eager or rendezvous by size. Returns
    /// true when the send is still in flight (someone must progress the
    /// worker). `done`, if given, is set once the send completed, failed or
    /// was cancelled.
    pub(super) fn send(
        &self,
        tag: u64,
        bytes: Vec<u8>,
        done: Option<Arc<AtomicBool>>,
    ) -> UcxResult<bool> {
        let (ptr, len) = (bytes.as_ptr(), bytes.len());
        let data = Box::into_raw(Box::new(SendCtx {
            _bytes: bytes,
            done,
            sends: self.worker.sends.clone(),
        }));
        // SAFETY: all-zero ucp_request_param_t is valid (memory type 0 = host).
        let mut p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        p.op_attr_mask = sys::ucp_op_attr_t::UCP_OP_ATTR_FIELD_CALLBACK as u32
            | sys::ucp_op_attr_t::UCP_OP_ATTR_FIELD_USER_DATA as u32;
        p.cb.send = Some(send_done);
        p.user_data = data as *mut c_void;
        self.worker.sends.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the endpoint is live; `ptr` points to `len` bytes owned by
        // the SendCtx (a Vec's heap block does not move with the Vec), which
        // stays allocated until send_done runs (or until we reclaim it below
        // when UCX says it will not call it).
        let r = unsafe {
            sys::ucp_tag_send_nbx(self.h, ptr as *const c_void, len as sys::size_t, tag, &p)
        };
        match status_ptr(r) {
            StatusPtr::Pending(_) => Ok(true),
            done => {
                self.worker.sends.fetch_sub(1, Ordering::SeqCst);
                // SAFETY: completed at once or failed: UCX will not call
                // send_done, so the context is ours again.
                let ctx = unsafe { Box::from_raw(data) };
                if let Some(d) = &ctx.done {
                    d.store(true, Ordering::SeqCst);
                }
                match done {
                    StatusPtr::Failed(code) => Err(format!("sending: {}", status_text(code))),
                    _ => Ok(false),
                }
            }
        }
    }

    /// Starts closing the endpoint without waiting and without a flush
    /// handshake with the peer (which may already be gone: a flush to an
    /// exited peer over tcp ends in an "Endpoint timeout" that UCX prints on
    /// stdout). A forced close needs `UCP_ERR_HANDLING_MODE_PEER` on both
    /// sides, which every endpoint has. Sends still in flight are cancelled,
    /// so callers close once what must arrive has been sent.
    pub(super) fn close(mut self) -> Option<Closing> {
        let req = self.start_close()?;
        Some(Closing {
            req,
            worker: self.worker.clone(),
        })
    }

    /// Starts the close once (the handle is nulled, so `Drop` does not
    /// close again); the pending request, if the close did not finish at once.
    fn start_close(&mut self) -> Option<*mut c_void> {
        let h = std::mem::replace(&mut self.h, ptr::null_mut());
        if h.is_null() {
            return None;
        }
        // SAFETY: all-zero ucp_request_param_t is valid (no callback).
        let mut p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        if self.worker.peer_errors {
            p.op_attr_mask = sys::ucp_op_attr_t::UCP_OP_ATTR_FIELD_FLAGS as u32;
            p.flags = sys::ucp_ep_close_flags_t::UCP_EP_CLOSE_FLAG_FORCE.0;
        }
        // Without peer error handling a close flushes (a forced one is not
        // allowed); a flush that does not finish is abandoned at its deadline.
        // SAFETY: the endpoint is live and closed exactly once (the handle
        // was taken out of self above).
        let r = unsafe { sys::ucp_ep_close_nbx(h, &p) };
        match status_ptr(r) {
            StatusPtr::Pending(req) => Some(req),
            _ => None,
        }
    }
}

impl Drop for Ep {
    fn drop(&mut self) {
        // An endpoint nobody closed (its transport dropped without a
        // shutdown, as a test does to play a vanished peer): closed here and
        // finished by the worker before it is destroyed.
        if let Some(req) = self.start_close() {
            self.worker.abandon(req, Vec::new());
        }
    }
}

/// An endpoint close in progress.
pub(super) struct Closing {
    req: *mut c_void,
    worker: Arc<Worker>,
}

// SAFETY: requests of a multi-threaded worker may be checked from any thread.
unsafe impl Send for Closing {}

impl Closing {
    /// True once the close finished (and the request was freed).
    pub(super) fn done(&mut self) -> bool {
        // SAFETY: req is a live request of this worker, not yet freed.
        let st = unsafe { sys::ucp_request_check_status(self.req) };
        if st == sys::ucs_status_t::UCS_INPROGRESS {
            return false;
        }
        // SAFETY: completed, freed once; `req` is nulled so Drop skips it.
        unsafe { sys::ucp_request_free(self.req) };
        self.req = ptr::null_mut();
        true
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        if !self.req.is_null() {
            // An unfinished close: the worker finishes it before it goes.
            self.worker.abandon(self.req, Vec::new());
        }
    }
}

mod recv;
pub(super) use recv::Incoming;
