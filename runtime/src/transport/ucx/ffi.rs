//! The only `unsafe` code of the runtime: a thin, safe wrapper over the
//! parts of libucp (through `ucx1-sys`) the UCX transport uses. Every block
//! says why it is sound; everything above this module is safe Rust.
//!
//! Ownership rules the wrapper enforces:
//! - [`Worker`] owns the UCP context and worker and destroys them on drop;
//!   every object made from it ([`Ep`], [`RecvSlot`], [`Closing`]) holds an
//!   `Arc<Worker>`, so the worker outlives them.
//! - A send owns its bytes (`Vec<u8>`) until UCX reports completion; a
//!   receive owns its buffer until its request completed or was cancelled.
//!   Buffers UCX may still write are leaked rather than freed.

// The workspace denies unsafe code; this module is the one exception, because
// UCX is a C library reached only through FFI. Nothing unsafe leaks out of it.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ucx1_sys as sys;

/// Sends handed to UCX that have not completed yet (all workers of the
/// process): the communication thread does not sleep while this is non-zero.
pub(super) static SENDS_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

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
}

// SAFETY: the worker is created in UCS_THREAD_MODE_MULTI (checked in `new`),
// so libucp serialises calls on it internally; the context is only used to
// create it and to clean up after it is destroyed.
unsafe impl Send for Worker {}
// SAFETY: see `Send`: every method takes the worker's internal lock.
unsafe impl Sync for Worker {}

impl Worker {
    /// Reads the UCX configuration from the environment (`UCX_TLS`,
    /// `UCX_NET_DEVICES`, ...) and creates a context with tag matching and
    /// wake-up, and one worker that many threads may call.
    pub(super) fn new() -> UcxResult<Arc<Worker>> {
        let mut config: *mut sys::ucp_config_t = ptr::null_mut();
        // SAFETY: null prefix and file mean "UCX_ variables and defaults";
        // `config` is a valid out-pointer.
        check(
            unsafe { sys::ucp_config_read(ptr::null(), ptr::null(), &mut config) },
            "reading the UCX configuration",
        )?;
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

    /// Arms the event fd and waits on it up to `timeout_ms`. Returns at once
    /// when events are already pending.
    pub(super) fn sleep(&self, timeout_ms: i32) {
        // SAFETY: the worker is live and was created with UCP_FEATURE_WAKEUP.
        let st = unsafe { sys::ucp_worker_arm(self.h) };
        if st != sys::ucs_status_t::UCS_OK {
            return; // UCS_ERR_BUSY: progress first.
        }
        let mut fd = libc::pollfd {
            fd: self.efd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the fd belongs to the live worker.
        unsafe { libc::poll(&mut fd, 1, timeout_ms) };
    }

    /// Wakes a thread sleeping in [`Worker::sleep`].
    pub(super) fn signal(&self) {
        // SAFETY: the worker is live; ucp_worker_signal is thread-safe.
        unsafe { sys::ucp_worker_signal(self.h) };
    }

    /// Opens an endpoint to the worker whose address is `remote`.
    pub(super) fn connect(self: &Arc<Self>, remote: &[u8]) -> UcxResult<Ep> {
        if remote.is_empty() {
            return Err("empty UCX worker address".into());
        }
        // SAFETY: all-zero ucp_ep_params_t is valid (err_mode 0 = NONE).
        let mut p: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
        p.field_mask = (sys::ucp_ep_params_field::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
            | sys::ucp_ep_params_field::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE)
            .0 as u64;
        p.address = remote.as_ptr() as *const sys::ucp_address_t;
        p.err_mode = sys::ucp_err_handling_mode_t::UCP_ERR_HANDLING_MODE_NONE;
        let mut ep: sys::ucp_ep_h = ptr::null_mut();
        // SAFETY: the worker is live; `remote` stays borrowed for the call
        // (UCX copies what it needs). The bytes come from the coordinator's
        // view, which only authenticated members of the job write; UCX
        // parses them and rejects malformed ones with an error status.
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

impl Drop for Worker {
    fn drop(&mut self) {
        // SAFETY: every Ep, RecvSlot and Closing holds an Arc<Worker>, so none
        // is left; the worker and then the context are destroyed once.
        unsafe {
            sys::ucp_worker_destroy(self.h);
            sys::ucp_cleanup(self.ctx);
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

unsafe extern "C" fn send_done(request: *mut c_void, _st: sys::ucs_status_t, user: *mut c_void) {
    // SAFETY: `user` is the Box<Vec<u8>> leaked by `Ep::send` for this
    // request, reclaimed exactly once here; the request is ours to free.
    unsafe {
        drop(Box::from_raw(user as *mut Vec<u8>));
        sys::ucp_request_free(request);
    }
    SENDS_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
}

impl Ep {
    /// Sends `bytes` with `tag`. UCX picks eager or rendezvous by size; the
    /// buffer is kept alive until it completes. Returns true when the send
    /// is still in flight (someone must progress the worker).
    pub(super) fn send(&self, tag: u64, bytes: Vec<u8>) -> UcxResult<bool> {
        let len = bytes.len();
        let data = Box::into_raw(Box::new(bytes));
        // SAFETY: all-zero ucp_request_param_t is valid (memory type 0 = host).
        let mut p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        p.op_attr_mask = sys::ucp_op_attr_t::UCP_OP_ATTR_FIELD_CALLBACK as u32
            | sys::ucp_op_attr_t::UCP_OP_ATTR_FIELD_USER_DATA as u32;
        p.cb.send = Some(send_done);
        p.user_data = data as *mut c_void;
        SENDS_IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the endpoint is live; `data` points to `len` bytes that stay
        // allocated until send_done runs (or until we reclaim them below when
        // UCX says it will not call it).
        let r = unsafe {
            sys::ucp_tag_send_nbx(
                self.h,
                (*data).as_ptr() as *const c_void,
                len as sys::size_t,
                tag,
                &p,
            )
        };
        match status_ptr(r) {
            StatusPtr::Pending(_) => Ok(true),
            done => {
                SENDS_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
                // SAFETY: completed at once or failed: UCX will not call
                // send_done, so the buffer is ours again.
                drop(unsafe { Box::from_raw(data) });
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
    /// stdout). Callers close only when no frame is in flight to the peer.
    pub(super) fn close(self) -> Option<Closing> {
        // SAFETY: all-zero ucp_request_param_t is valid (no callback).
        let mut p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        p.op_attr_mask = sys::ucp_op_attr_t::UCP_OP_ATTR_FIELD_FLAGS as u32;
        p.flags = sys::ucp_ep_close_flags_t::UCP_EP_CLOSE_FLAG_FORCE.0;
        // SAFETY: the endpoint is live and closed exactly once (self is consumed).
        let r = unsafe { sys::ucp_ep_close_nbx(self.h, &p) };
        match status_ptr(r) {
            StatusPtr::Pending(req) => Some(Closing {
                req,
                worker: self.worker.clone(),
            }),
            _ => None,
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
            // SAFETY: an unfinished close: ucp_request_free on an incomplete
            // request is allowed (UCX releases it when it completes).
            unsafe { sys::ucp_request_free(self.req) };
        }
        let _ = &self.worker;
    }
}

/// A posted tag receive into a buffer it owns.
pub(super) struct RecvSlot {
    worker: Arc<Worker>,
    buf: Vec<u8>,
    state: RecvState,
}

enum RecvState {
    InFlight(*mut c_void),
    Done(u64, usize),
    Failed(String),
    Taken,
}

// SAFETY: the request belongs to a multi-threaded worker; the buffer is owned.
unsafe impl Send for RecvSlot {}

impl RecvSlot {
    /// Posts a receive into `buf` (its whole length) for messages whose tag
    /// equals `tag` on the bits set in `mask`.
    pub(super) fn post(worker: &Arc<Worker>, mut buf: Vec<u8>, tag: u64, mask: u64) -> RecvSlot {
        let mut info = sys::ucp_tag_recv_info_t {
            sender_tag: 0,
            length: 0,
        };
        // SAFETY: all-zero ucp_request_param_t is valid.
        let mut p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        // Always get a request (NO_IMM_CMPL): with UCX 1.13 over tcp, receives
        // re-posted onto an already-arrived message and completed inside the
        // call were seen reporting a zero tag, so every completion goes
        // through ucp_tag_recv_request_test instead.
        p.op_attr_mask = sys::ucp_op_attr_t::UCP_OP_ATTR_FIELD_RECV_INFO as u32
            | sys::ucp_op_attr_t::UCP_OP_ATTR_FLAG_NO_IMM_CMPL as u32;
        p.recv_info.tag_info = &mut info;
        // SAFETY: the worker is live; `buf` stays allocated (and is not moved:
        // a Vec's heap buffer does not move with the Vec) until the request
        // completes or is cancelled; `info` is written only during this call.
        let r = unsafe {
            sys::ucp_tag_recv_nbx(
                worker.h,
                buf.as_mut_ptr() as *mut c_void,
                buf.len() as sys::size_t,
                tag,
                mask,
                &p,
            )
        };
        let state = match status_ptr(r) {
            StatusPtr::Done => RecvState::Done(info.sender_tag, info.length as usize),
            StatusPtr::Pending(req) => RecvState::InFlight(req),
            StatusPtr::Failed(code) => RecvState::Failed(status_text(code)),
        };
        RecvSlot {
            worker: worker.clone(),
            buf,
            state,
        }
    }

    /// `None` while in flight; then the matched tag and length, or why it failed.
    pub(super) fn poll(&mut self) -> Option<UcxResult<(u64, usize)>> {
        if let RecvState::InFlight(req) = self.state {
            let mut info = sys::ucp_tag_recv_info_t {
                sender_tag: 0,
                length: 0,
            };
            // SAFETY: req is a live receive request of this worker.
            let st = unsafe { sys::ucp_tag_recv_request_test(req, &mut info) };
            if st == sys::ucs_status_t::UCS_INPROGRESS {
                return None;
            }
            // SAFETY: completed: freed exactly once, state updated below.
            unsafe { sys::ucp_request_free(req) };
            self.state = match st {
                sys::ucs_status_t::UCS_OK => RecvState::Done(info.sender_tag, info.length as usize),
                other => RecvState::Failed(status_text(other as i32 as isize)),
            };
        }
        match &self.state {
            RecvState::Done(t, l) => Some(Ok((*t, *l))),
            RecvState::Failed(e) => Some(Err(e.clone())),
            RecvState::InFlight(_) | RecvState::Taken => None,
        }
    }

    /// The buffer of a completed receive (its full length; the message is
    /// the prefix `poll` reported).
    pub(super) fn into_buf(mut self) -> Vec<u8> {
        assert!(
            !matches!(self.state, RecvState::InFlight(_)),
            "taking the buffer of a receive in flight"
        );
        self.state = RecvState::Taken;
        std::mem::take(&mut self.buf)
    }
}

impl Drop for RecvSlot {
    fn drop(&mut self) {
        let RecvState::InFlight(req) = self.state else {
            return;
        };
        // SAFETY: req is a live receive of this worker; cancelling an
        // unmatched receive completes it with UCS_ERR_CANCELED.
        unsafe { sys::ucp_request_cancel(self.worker.h, req) };
        for _ in 0..1000 {
            self.worker.progress();
            if self.poll().is_some() {
                return;
            }
        }
        // Matched and still being written: leak the buffer rather than free
        // memory UCX may write to, and let UCX release the request.
        std::mem::forget(std::mem::take(&mut self.buf));
        // SAFETY: freeing an incomplete request is allowed; UCX releases it
        // when it completes.
        unsafe { sys::ucp_request_free(req) };
    }
}
