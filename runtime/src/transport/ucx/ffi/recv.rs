//! The receive side of the wrapper: a message probed by tag and received
//! into a buffer of its exact size ([`Incoming`]). The parent module's
//! safety rules hold here too.

use std::ffi::c_void;
use std::sync::Arc;

use ucx1_sys as sys;

use super::{status_ptr, status_text, StatusPtr, UcxResult, Worker};

impl Worker {
    /// Takes the oldest message that arrived and starts receiving it into a
    /// buffer of its exact size. Every message is received this way: UCX
    /// chooses eager or rendezvous by size on the sending side, and a
    /// rendezvous body lands straight in the buffer handed to the runtime.
    /// Probing with an empty mask matches any source, epoch and kind, in
    /// arrival order, so nothing depends on node numbering.
    pub(in crate::transport::ucx) fn receive_next(self: &Arc<Self>) -> Option<Incoming> {
        let mut info = sys::ucp_tag_recv_info_t {
            sender_tag: 0,
            length: 0,
        };
        // SAFETY: the worker is live; `info` is a valid out-struct. With
        // remove = 1 the handle becomes ours and is consumed just below.
        let msg = unsafe { sys::ucp_tag_probe_nb(self.h, 0, 0, 1, &mut info) };
        if msg.is_null() {
            return None;
        }
        let len = info.length as usize;
        let mut buf: Vec<u8> = Vec::with_capacity(len);
        // SAFETY: all-zero ucp_request_param_t is valid (contiguous bytes,
        // host memory, no callback).
        let p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        // SAFETY: `msg` is the handle probed above, received exactly once;
        // `buf` has room for `len` bytes and its heap block does not move
        // (it is owned by the Incoming below and never reallocated) until
        // the request completes.
        let r = unsafe {
            sys::ucp_tag_msg_recv_nbx(
                self.h,
                buf.as_mut_ptr() as *mut c_void,
                len as sys::size_t,
                msg,
                &p,
            )
        };
        let state = match status_ptr(r) {
            StatusPtr::Done => {
                // SAFETY: the receive completed inside the call, so UCX has
                // written the whole message, `len` bytes, into `buf`.
                unsafe { buf.set_len(len) };
                RecvState::Done
            }
            StatusPtr::Pending(req) => RecvState::InFlight(req),
            StatusPtr::Failed(code) => RecvState::Failed(status_text(code)),
        };
        Some(Incoming {
            worker: self.clone(),
            tag: info.sender_tag,
            len,
            buf,
            state,
        })
    }
}

/// A message taken by [`Worker::receive_next`], being received into a
/// buffer of its exact size.
pub(in crate::transport::ucx) struct Incoming {
    worker: Arc<Worker>,
    tag: u64,
    len: usize,
    buf: Vec<u8>,
    state: RecvState,
}

enum RecvState {
    InFlight(*mut c_void),
    Done,
    Failed(String),
}

// SAFETY: the request belongs to a multi-threaded worker; the buffer is owned.
unsafe impl Send for Incoming {}

impl Incoming {
    /// The sender's tag.
    pub(in crate::transport::ucx) fn tag(&self) -> u64 {
        self.tag
    }

    /// `None` while in flight; then whether it arrived whole.
    pub(in crate::transport::ucx) fn poll(&mut self) -> Option<UcxResult<()>> {
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
                sys::ucs_status_t::UCS_OK if info.length as usize == self.len => {
                    // SAFETY: the receive completed successfully with the
                    // probed length, so UCX wrote all `len` bytes of `buf`.
                    unsafe { self.buf.set_len(self.len) };
                    RecvState::Done
                }
                sys::ucs_status_t::UCS_OK => RecvState::Failed(format!(
                    "received {} bytes of a {}-byte message",
                    info.length, self.len
                )),
                other => RecvState::Failed(status_text(other as i32 as isize)),
            };
        }
        match &self.state {
            RecvState::Done => Some(Ok(())),
            RecvState::Failed(e) => Some(Err(e.clone())),
            RecvState::InFlight(_) => None,
        }
    }

    /// The received frame (empty unless `poll` reported success).
    pub(in crate::transport::ucx) fn into_frame(mut self) -> Vec<u8> {
        assert!(
            !matches!(self.state, RecvState::InFlight(_)),
            "taking the buffer of a receive in flight"
        );
        std::mem::take(&mut self.buf)
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        let RecvState::InFlight(req) = self.state else {
            return;
        };
        // A matched message cannot be cancelled: give it a moment to land.
        for _ in 0..1000 {
            self.worker.progress();
            if self.poll().is_some() {
                return;
            }
        }
        // Still being written: the worker keeps the buffer until the
        // request completed, and finishes it before it goes.
        self.worker.abandon(req, std::mem::take(&mut self.buf));
    }
}
