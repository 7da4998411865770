//! TCP transport: one outgoing connection per peer for the frames this node
//! sends, one incoming connection per peer for the frames it receives.
//! Unidirectional connections make per-pair ordering trivial and avoid
//! simultaneous-open races.
//!
//! Every connection starts with a mutual challenge-response over the job
//! secret (HMAC-SHA256), so only members of the job can inject frames.
//! Frame layout: `[u32 LE length][u64 LE tag][length bytes]`.
//!
//! Sends write the header and the caller's parts with one `writev` (no
//! gather copy); `send_with` writes a frame piece by piece as the runtime
//! encodes it, a large body straight from the message's memory. Every
//! incoming connection is watched by one epoll set (mio) and read by an
//! idle PE of the node while it spins (no thread hop, no wake-up), or
//! else by the node's receive thread (`ductile-tcp-rx`), which also
//! accepts peers: small frames are parsed out of a per-connection staging
//! buffer (one `read` for many frames), a large one is read straight into
//! the buffer that is handed to the runtime (no zero-fill, no copy after
//! receipt). When nothing arrives the thread blocks in epoll, after an
//! optional bounded spin (`DUCTILE_TCP_SPIN_US`), so an idle node's
//! transport uses no CPU.
//! Handshakes run on short-lived threads of their own, so a slow or hostile
//! peer cannot stall the others' frames.
//!
//! Its parts: `handshake.rs` (dialling a peer and accepting one, both sides
//! of the challenge), `receive.rs` (the receive thread: epoll, the staging
//! buffer, frame parsing), `send.rs` (outgoing endpoints and the frame
//! writer); this file holds the transport itself and its endpoint table.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use ductile_coordinator::proto::{NodeId, View};
use ductile_coordinator::secret::Secret;
use tracing::debug;

use super::{FrameWrite, Reconciled, Sink, Tag, Transport, TransportError};

mod handshake;
mod receive;
mod send;
#[cfg(test)]
mod tests;

pub use receive::DEFAULT_SPIN_US;
use receive::{start_receiver, RxShared};
use send::{write_frame, write_frame_with, Endpoint};

/// Largest frame accepted from a peer (1 GiB): bigger claims are malformed input.
pub const MAX_FRAME: usize = 1 << 30;
/// Kind of the frame a node sends before closing an endpoint on purpose.
const KIND_BYE: u32 = 0;
/// How long an idle PE watches only its inbox before it reads the
/// connections (two `epoll_ctl` and an `epoll_wait` per poll): a reply from
/// a PE of the same node comes within a microsecond or two, one from
/// another node takes longer (5.7 µs one-way at best on loopback on the
/// 2-vCPU VM). Measured against 2, 10 and 20 µs in docs/message-path.md.
const PE_PROGRESS_AFTER: std::time::Duration = std::time::Duration::from_micros(5);
/// The TCP transport of one node.
pub struct TcpTransport {
    local: SocketAddr,
    secret: Secret,
    my_uid: RwLock<u64>,
    /// Outgoing endpoints by the peer's node id in the current view.
    out: RwLock<HashMap<NodeId, Arc<Endpoint>>>,
    closing: Arc<AtomicBool>,
    rx: Arc<RxShared>,
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> TransportError {
    move |source| TransportError::Io {
        context: context.into(),
        source,
    }
}

impl TcpTransport {
    /// Listens on `bind` (port chosen by the OS) and starts accepting
    /// authenticated peers, whose frames go to `sink`.
    pub fn bind(
        bind: IpAddr,
        advertise: Option<IpAddr>,
        secret: Secret,
        sink: Arc<dyn Sink>,
    ) -> Result<Arc<Self>, TransportError> {
        let listener =
            TcpListener::bind((bind, 0)).map_err(io_err(format!("listening on {bind}")))?;
        let mut local = listener
            .local_addr()
            .map_err(io_err("reading the listening address"))?;
        if let Some(ip) = advertise {
            local.set_ip(ip);
        }
        let closing = Arc::new(AtomicBool::new(false));
        let rx = start_receiver(listener, secret.clone(), sink, closing.clone())?;
        Ok(Arc::new(TcpTransport {
            local,
            secret,
            my_uid: RwLock::new(0),
            out: RwLock::new(HashMap::new()),
            closing,
            rx,
        }))
    }

    /// The receive thread's kernel thread id (0 before it started).
    #[cfg(test)]
    pub(crate) fn receive_tid(&self) -> u64 {
        self.rx.tid.load(Ordering::SeqCst)
    }

    /// Sets the uid this node announces when it dials (known once registered).
    pub fn set_uid(&self, uid: u64) {
        *self.my_uid.write().expect("uid lock poisoned") = uid;
    }

    /// The outgoing connection to node `to` in the current view.
    fn endpoint(&self, to: NodeId) -> Result<Arc<Endpoint>, TransportError> {
        self.out
            .read()
            .expect("endpoint table poisoned")
            .get(&to)
            .cloned()
            .ok_or(TransportError::NoEndpoint(to))
    }
}

impl Transport for TcpTransport {
    fn address(&self) -> Vec<u8> {
        self.local.to_string().into_bytes()
    }

    fn send(&self, to: NodeId, tag: Tag, parts: &[&[u8]]) -> Result<(), TransportError> {
        let ep = self.endpoint(to)?;
        let mut s = ep.stream.lock().expect("endpoint lock poisoned");
        write_frame(&mut s, tag, parts).map_err(io_err(format!("sending to node {to}")))
    }

    fn send_with(
        &self,
        to: NodeId,
        tag: Tag,
        len: usize,
        fill: &mut dyn FnMut(&mut FrameWrite<'_>) -> io::Result<()>,
    ) -> Result<(), TransportError> {
        let ep = self.endpoint(to)?;
        let mut s = ep.stream.lock().expect("endpoint lock poisoned");
        write_frame_with(&mut s, tag, len, fill).map_err(io_err(format!("sending to node {to}")))
    }

    fn reconcile(&self, view: &View, me: NodeId) -> Result<Reconciled, TransportError> {
        let mut stats = Reconciled::default();
        let mut by_uid: HashMap<u64, Arc<Endpoint>> =
            std::mem::take(&mut *self.out.write().expect("endpoint table poisoned"))
                .into_values()
                .map(|e| (e.uid, e))
                .collect();
        let mut next = HashMap::new();
        // A peer that cannot be dialled (a node a rescale removed meanwhile,
        // seen by a newcomer still opening its speculative endpoints) fails
        // the reconcile, but only after every other endpoint is in place:
        // dropping the table here would close the live connections without
        // a BYE, and their peers would report this node lost.
        let mut failure = None;
        for m in &view.members {
            if m.node == me {
                continue;
            }
            let ep = match by_uid.remove(&m.uid) {
                Some(ep) => {
                    stats.kept += 1;
                    ep
                }
                None => {
                    let my_uid = *self.my_uid.read().expect("uid lock poisoned");
                    let dialled = handshake::dial(m.node, &m.address, &self.secret, my_uid)
                        .and_then(|stream| {
                            Endpoint::new(m.uid, stream)
                                .map_err(io_err(format!("opening the endpoint to node {}", m.node)))
                        });
                    match dialled {
                        Ok(ep) => {
                            stats.opened += 1;
                            Arc::new(ep)
                        }
                        Err(e) => {
                            failure.get_or_insert(e);
                            continue;
                        }
                    }
                }
            };
            next.insert(m.node, ep);
        }
        for (uid, ep) in by_uid {
            stats.closed += 1;
            let mut s = ep.stream.lock().expect("endpoint lock poisoned");
            let _ = write_frame(&mut s, Tag::new(me, view.epoch, KIND_BYE), &[]);
            let _ = s.shutdown(Shutdown::Write);
            debug!(uid, "closed endpoint to a departed peer");
        }
        *self.out.write().expect("endpoint table poisoned") = next;
        match failure {
            Some(e) => Err(e),
            None => Ok(stats),
        }
    }

    fn disconnect(&self, peer_uid: u64) {
        let out = self.out.read().expect("endpoint table poisoned");
        for ep in out.values().filter(|e| e.uid == peer_uid) {
            ep.cut();
            debug!(uid = peer_uid, "cut the connection to a lost peer");
        }
    }

    fn poll(&self) -> bool {
        self.rx.progress()
    }

    fn progress_after(&self) -> std::time::Duration {
        PE_PROGRESS_AFTER
    }

    fn pe_spinning(&self, spinning: bool) {
        self.rx.pe_spinning(spinning);
    }
    fn pe_sleeps(&self) -> bool {
        self.rx.pe_sleeps()
    }
    fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.rx.wait_fd()
    }

    fn shutdown(&self) {
        self.closing.store(true, Ordering::SeqCst);
        for ep in self
            .out
            .write()
            .expect("endpoint table poisoned")
            .drain()
            .map(|(_, e)| e)
        {
            let mut s = ep.stream.lock().expect("endpoint lock poisoned");
            let _ = write_frame(&mut s, Tag(KIND_BYE as u64), &[]);
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.rx.stop.store(true, Ordering::SeqCst);
        self.rx.handback.wake();
    }
}
