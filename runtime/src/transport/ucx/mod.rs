//! UCX transport (cargo feature `ucx`): tag matching over one
//! multi-threaded UCP worker per node.
//!
//! - Tags are the transport's [`Tag`]: `[source node | epoch | kind]`. The
//!   receive side keeps a ring of [`RING`] receives posted once with a mask on
//!   kind bits only, so they match whoever sent and survive renumbering; the
//!   receiver reads the source from the matched tag. A reconciliation never
//!   re-posts them ([`UcxTransport::posts`] counts posts).
//! - Frames up to [`EAGER_MAX`] bytes go in one tagged send (UCX's eager
//!   protocols). Larger frames send an 8-byte announcement in the same
//!   ordered stream, then the body under the `BODY` kind bit; the receiver
//!   posts an exact-size receive for it, so UCX's rendezvous lands the body
//!   directly in the buffer that is handed to the runtime (no copy on receive).
//! - Delivery follows match order (the ring is drained front first and a
//!   frame waits behind an announced body), so frames between a pair of
//!   nodes arrive in the order they were sent, whatever protocol UCX chose.
//! - Senders (the PE threads) call UCX directly; one communication thread
//!   progresses the worker, spins briefly when idle and then sleeps on the
//!   worker's event fd.
//! - Endpoints are keyed by node id and carry the peer's uid:
//!   [`Transport::reconcile`] keeps and re-indexes survivors, starts closing
//!   removed ones without waiting (the communication thread finishes the
//!   flush), and opens new ones from the view's opaque address bytes.
//!
//! UCX has no job-secret handshake: whoever has a worker address can send to
//! it. Addresses only travel in the coordinator's authenticated view. Peer
//! loss is reported by the coordinator, not by this transport.

mod ffi;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ductile_coordinator::proto::{NodeId, View};
use tracing::{debug, error};

use super::{Reconciled, Sink, Tag, Transport, TransportError, KIND_BITS};

/// Largest frame sent in one eager message; larger ones use rendezvous.
pub const EAGER_MAX: usize = 8192;
/// Receives kept posted for small frames and announcements.
pub const RING: usize = 64;
/// Kind bit of a large frame's body (never matched by the ring).
const BODY: u64 = 1 << (KIND_BITS - 1);
/// Kind bit of the announcement that precedes a body.
const ANNOUNCE: u64 = 1 << (KIND_BITS - 2);
/// How long the communication thread spins before sleeping on the event fd.
const SPIN: Duration = Duration::from_micros(200);
/// How long the communication thread busy-waits before it starts yielding its core.
const HOT_SPIN: Duration = Duration::from_micros(5);
/// Longest sleep on the event fd.
const SLEEP_MS: i32 = 5;
/// How long a closing endpoint may take to flush before it is abandoned.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

fn ucx_err(context: impl Into<String>) -> impl FnOnce(String) -> TransportError {
    move |e| TransportError::Io {
        context: context.into(),
        source: std::io::Error::other(e),
    }
}

struct Peer {
    uid: u64,
    ep: ffi::Ep,
    /// Held across an announcement and its body, so bodies to one peer go
    /// out in the order of their announcements.
    large: Mutex<()>,
}

struct Shared {
    stop: AtomicBool,
    sleeping: AtomicBool,
    posts: AtomicU64,
    closing: Mutex<Vec<(Instant, ffi::Closing)>>,
}

/// The UCX transport of one node.
pub struct UcxTransport {
    worker: Arc<ffi::Worker>,
    peers: RwLock<HashMap<NodeId, Peer>>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl UcxTransport {
    /// Creates the worker (configured by `UCX_*` variables), posts the
    /// receive ring and starts the communication thread, which hands frames
    /// to `sink`.
    pub fn new(sink: Arc<dyn Sink>) -> Result<Arc<Self>, TransportError> {
        let worker = ffi::Worker::new().map_err(ucx_err("starting UCX"))?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            posts: AtomicU64::new(0),
            closing: Mutex::new(Vec::new()),
        });
        let mut rx = Rx {
            worker: worker.clone(),
            ring: VecDeque::with_capacity(RING),
            pending: VecDeque::new(),
            shared: shared.clone(),
        };
        for _ in 0..RING {
            rx.post(vec![0u8; EAGER_MAX]);
        }
        let thread = {
            let (worker, shared) = (worker.clone(), shared.clone());
            std::thread::Builder::new()
                .name("ductile-ucx".into())
                .spawn(move || comm_loop(worker, shared, rx, sink))
                .map_err(|e| TransportError::Io {
                    context: "starting the UCX progress thread".into(),
                    source: e,
                })?
        };
        Ok(Arc::new(UcxTransport {
            worker,
            peers: RwLock::new(HashMap::new()),
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// Receives posted so far (the initial ring plus one re-post per
    /// delivered small frame or announcement).
    pub fn posts(&self) -> u64 {
        self.shared.posts.load(Ordering::SeqCst)
    }

    fn wake(&self) {
        if self.shared.sleeping.load(Ordering::SeqCst) {
            self.worker.signal();
        }
    }

    fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.worker.signal();
        if let Some(t) = self.thread.lock().expect("thread lock poisoned").take() {
            let _ = t.join();
        }
    }
}

fn gather(parts: &[&[u8]], len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    for p in parts {
        v.extend_from_slice(p);
    }
    v
}

impl Transport for UcxTransport {
    fn address(&self) -> Vec<u8> {
        self.worker.address().to_vec()
    }

    fn send(&self, to: NodeId, tag: Tag, parts: &[&[u8]]) -> Result<(), TransportError> {
        assert!(
            (tag.kind() as u64) < ANNOUNCE,
            "message kind {} collides with the UCX transport's reserved kind bits",
            tag.kind()
        );
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let peers = self.peers.read().expect("endpoint table poisoned");
        let peer = peers.get(&to).ok_or(TransportError::NoEndpoint(to))?;
        let context = || format!("sending to node {to}");
        let pending = if len <= EAGER_MAX {
            peer.ep
                .send(tag.0, gather(parts, len))
                .map_err(ucx_err(context()))?
        } else {
            let _order = peer.large.lock().expect("endpoint lock poisoned");
            let a = peer
                .ep
                .send(tag.0 | ANNOUNCE, (len as u64).to_le_bytes().to_vec())
                .map_err(ucx_err(context()))?;
            let b = peer
                .ep
                .send(tag.0 | BODY, gather(parts, len))
                .map_err(ucx_err(context()))?;
            a || b
        };
        if pending {
            self.wake();
        }
        Ok(())
    }

    fn reconcile(&self, view: &View, me: NodeId) -> Result<Reconciled, TransportError> {
        let mut stats = Reconciled::default();
        let mut table = self.peers.write().expect("endpoint table poisoned");
        let mut by_uid: HashMap<u64, Peer> = table.drain().map(|(_, p)| (p.uid, p)).collect();
        let mut next = HashMap::new();
        let mut failure = None;
        for m in &view.members {
            if m.node == me {
                continue;
            }
            let peer = match by_uid.remove(&m.uid) {
                Some(p) => {
                    stats.kept += 1;
                    p
                }
                None => match self.worker.connect(&m.address) {
                    Ok(ep) => {
                        stats.opened += 1;
                        Peer {
                            uid: m.uid,
                            ep,
                            large: Mutex::new(()),
                        }
                    }
                    Err(e) => {
                        failure = Some(TransportError::Address(m.node, e));
                        break;
                    }
                },
            };
            next.insert(m.node, peer);
        }
        // Endpoints to nodes outside the view: start a flushing close and
        // let the communication thread finish it.
        let mut closing = self.shared.closing.lock().expect("closing list poisoned");
        for (uid, p) in by_uid {
            stats.closed += 1;
            if let Some(c) = p.ep.close() {
                closing.push((Instant::now() + CLOSE_GRACE, c));
            }
            debug!(uid, "closing the endpoint to a departed peer");
        }
        drop(closing);
        *table = next;
        drop(table);
        self.wake();
        match failure {
            Some(e) => Err(e),
            None => Ok(stats),
        }
    }

    fn shutdown(&self) {
        let peers: Vec<Peer> = self
            .peers
            .write()
            .expect("endpoint table poisoned")
            .drain()
            .map(|(_, p)| p)
            .collect();
        {
            let mut closing = self.shared.closing.lock().expect("closing list poisoned");
            for p in peers {
                if let Some(c) = p.ep.close() {
                    closing.push((Instant::now() + Duration::from_millis(500), c));
                }
            }
        }
        self.stop();
    }
}

impl Drop for UcxTransport {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A frame waiting for delivery, in match order.
enum Item {
    Ready(Tag, Vec<u8>),
    Body(Tag, ffi::RecvSlot),
}

/// Receive state, owned by the communication thread.
struct Rx {
    worker: Arc<ffi::Worker>,
    /// Posted receives, in post order (= match order).
    ring: VecDeque<ffi::RecvSlot>,
    pending: VecDeque<Item>,
    shared: Arc<Shared>,
}

impl Rx {
    fn post(&mut self, buf: Vec<u8>) {
        // Match any source and epoch, any kind without the BODY bit.
        self.ring
            .push_back(ffi::RecvSlot::post(&self.worker, buf, 0, BODY));
        self.shared.posts.fetch_add(1, Ordering::SeqCst);
    }

    /// Moves completed receives to the delivery queue and delivers what is
    /// ready. True when something happened.
    fn poll(&mut self, sink: &dyn Sink) -> bool {
        let mut did = false;
        while let Some(res) = self.ring.front_mut().and_then(|s| s.poll()) {
            did = true;
            let slot = self.ring.pop_front().expect("front exists");
            let buf = slot.into_buf();
            match res {
                Ok((raw, len)) if raw & ANNOUNCE != 0 => {
                    let tag = Tag(raw & !ANNOUNCE);
                    match buf.get(..8).filter(|_| len == 8) {
                        Some(b) => {
                            let n = u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize;
                            let body = ffi::RecvSlot::post(
                                &self.worker,
                                vec![0u8; n],
                                raw ^ ANNOUNCE | BODY,
                                u64::MAX,
                            );
                            self.pending.push_back(Item::Body(tag, body));
                        }
                        None => error!(
                            "dropping a malformed large-frame announcement from node {}",
                            tag.src()
                        ),
                    }
                }
                Ok((raw, len)) => self
                    .pending
                    .push_back(Item::Ready(Tag(raw), buf[..len].to_vec())),
                Err(e) => error!("a UCX receive failed: {e}"),
            }
            self.post(buf);
        }
        while let Some(front) = self.pending.front_mut() {
            match front {
                Item::Ready(..) => {}
                Item::Body(_, slot) => match slot.poll() {
                    None => break,
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        error!("a UCX large-frame receive failed: {e}");
                        self.pending.pop_front();
                        continue;
                    }
                },
            }
            did = true;
            match self.pending.pop_front().expect("front exists") {
                Item::Ready(tag, frame) => sink.deliver(tag, frame),
                Item::Body(tag, slot) => sink.deliver(tag, slot.into_buf()),
            }
        }
        did
    }
}

fn comm_loop(worker: Arc<ffi::Worker>, shared: Arc<Shared>, mut rx: Rx, sink: Arc<dyn Sink>) {
    let mut idle_since = Instant::now();
    loop {
        let stopping = shared.stop.load(Ordering::SeqCst);
        let mut did = worker.progress();
        did |= rx.poll(&*sink);
        let closing_left = {
            let mut closing = shared.closing.lock().expect("closing list poisoned");
            let now = Instant::now();
            closing.retain_mut(|(deadline, c)| !c.done() && now < *deadline);
            closing.len()
        };
        if stopping && closing_left == 0 {
            break;
        }
        let busy = ffi::SENDS_IN_FLIGHT.load(Ordering::SeqCst) > 0 || closing_left > 0;
        if did || busy {
            idle_since = Instant::now();
            continue;
        }
        let idle_for = idle_since.elapsed();
        if idle_for < SPIN {
            // Spin briefly, then keep polling but let the PE threads that
            // share the core run (they are what will produce the next send).
            if idle_for < HOT_SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            continue;
        }
        shared.sleeping.store(true, Ordering::SeqCst);
        if ffi::SENDS_IN_FLIGHT.load(Ordering::SeqCst) == 0 && !shared.stop.load(Ordering::SeqCst) {
            worker.sleep(SLEEP_MS);
        }
        shared.sleeping.store(false, Ordering::SeqCst);
    }
    drop(rx); // cancels the posted receives while the worker is alive
}

#[cfg(test)]
mod tests;
