//! UCX transport (cargo feature `ucx`): tag matching over one
//! multi-threaded UCP worker per node.
//!
//! - Tags are the transport's [`Tag`]: `[source node | epoch | kind]`. The
//!   receiving side posts no receive in advance: whoever progresses the
//!   worker probes for whatever arrived (`ucp_tag_probe_nb` with an empty mask:
//!   any source, epoch and kind) and receives it into a buffer of its exact
//!   size (`ucp_tag_msg_recv_nbx`). The receiver reads the source from the
//!   matched tag, so nothing depends on node numbering and a reconciliation
//!   starts no receive ([`UcxTransport::receives`] counts them).
//! - UCX chooses eager or rendezvous by size. A frame handed over with
//!   [`Transport::send_frame`] is sent from its own buffer (no copy on
//!   either side: a rendezvous body lands in the buffer given to the
//!   runtime); [`Transport::send`] gathers its parts into one buffer first.
//! - Delivery follows probe order (arrival order, which UCX keeps per
//!   sender), and a frame waits behind an earlier one still being received,
//!   so frames between a pair of nodes arrive in the order they were sent.
//! - Senders (the PE threads) call UCX directly. Who receives is the
//!   progress mode's choice (`DUCTILE_UCX_PROGRESS`, [`Progress`]): by
//!   default an idle PE progresses the worker on its own thread while it
//!   spins, and then sleeps on the worker's event fd beside its inbox, so
//!   a message wakes its PE directly; the communication thread stays out
//!   meanwhile and carries what arrives or is in flight while every PE
//!   computes ([`thread`](self::thread)). With `thread`, only the
//!   communication thread receives, and hands each frame to its PE's
//!   inbox.
//! - Endpoints are keyed by node id and carry the peer's uid:
//!   [`Transport::reconcile`] keeps and re-indexes survivors, sends a `BYE`
//!   to removed ones and then closes them without waiting (the
//!   communication thread finishes), and opens new ones from the view's
//!   opaque address bytes.
//! - Endpoints use `UCP_ERR_HANDLING_MODE_PEER` (`DUCTILE_UCX_ERR_MODE=peer`,
//!   the default): a peer that fails without having said `BYE` is reported
//!   to the sink as lost, as the TCP transport reports a connection that
//!   ends without its `BYE`. UCX 1.13's shared-memory transports refuse that
//!   mode, so UCX then carries local traffic over tcp; `none` lets it use
//!   shared memory and leaves a dead peer to the coordinator.
//!
//! UCX has no job-secret handshake: whoever has a worker address can send to
//! it. Addresses only travel in the coordinator's authenticated view.

mod ffi;
mod thread;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ductile_coordinator::proto::{NodeId, View};
use tracing::{debug, error};

use super::handback::Handback;
use super::{Reconciled, Sink, Tag, Transport, TransportError, KIND_BITS};
use thread::{comm_loop, Leaving};

/// Kind bit of the frame a node sends before closing an endpoint on purpose
/// (its body: the sender's uid). Runtime kinds stay below it.
const BYE: u64 = 1 << (KIND_BITS - 1);
/// How often a PE about to sleep tries to arm the worker, progressing
/// what is pending between two tries.
const ARM_TRIES: usize = 3;
/// Longest sleep of an idle PE on the worker's event fd while work is in
/// flight (see [`UcxTransport::wait_limit`]).
const IN_FLIGHT_NAP: Duration = Duration::from_millis(1);
/// Longest sleep of an idle PE on the worker's event fd with nothing in
/// flight. Over shared memory without peer error handling
/// (`DUCTILE_UCX_ERR_MODE=none`), UCX 1.13 at times leaves the fd quiet
/// for an arrival: every PE of a job then slept for good (2 of 13
/// expansions of 3 nodes to 4, docs/ucx.md). The bound makes such a lost
/// wake-up a delay of at most this long (the communication thread's own
/// sleep is bounded too). Longer than that thread's 50 ms: each timeout
/// costs a PE's spin, and an idle job paid 0.8% of a core at 50 ms.
const IDLE_NAP: Duration = Duration::from_millis(200);
/// How long a departed peer's `BYE` may take before its endpoint is closed anyway.
const BYE_GRACE: Duration = Duration::from_secs(1);
/// How long `shutdown` waits for its `BYE`s to leave.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// Who progresses the worker (`DUCTILE_UCX_PROGRESS`, measured in
/// docs/message-path.md, "UCX progressed by the PEs").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Progress {
    /// `thread`: only the communication thread polls; it spins briefly
    /// when idle, then sleeps on the event fd, and hands every frame to
    /// its PE through the PE's inbox.
    Thread,
    /// `pe` (default): an idle PE polls while it spins
    /// ([`Transport::poll`]) and then sleeps on the worker's event fd
    /// ([`Transport::wait_fd`]); the communication thread stays out while
    /// any PE does, and works as in `thread` mode while every PE computes.
    Pe,
}

impl Progress {
    fn from_env() -> Result<Progress, TransportError> {
        match std::env::var("DUCTILE_UCX_PROGRESS").ok().as_deref() {
            None | Some("") | Some("pe") => Ok(Progress::Pe),
            Some("thread") => Ok(Progress::Thread),
            Some(other) => Err(TransportError::Io {
                context: "DUCTILE_UCX_PROGRESS".into(),
                source: std::io::Error::other(format!(
                    "`{other}` is not a progress mode (pe or thread)"
                )),
            }),
        }
    }
}

/// `DUCTILE_UCX_ERR_MODE`: `peer` (default) puts endpoints in
/// `UCP_ERR_HANDLING_MODE_PEER`: a peer that dies is reported lost and
/// endpoints close forced. UCX 1.13's shared-memory transports (posix,
/// sysv) have no peer failure handler, so in that mode UCX carries even
/// local traffic over tcp (measured in docs/message-path.md). `none` lets
/// UCX use shared memory; then a dead peer is noticed by the coordinator
/// (`MemberLost`) rather than by the transport, and closes flush (abandoned
/// at their deadline).
fn peer_errors_from_env() -> Result<bool, TransportError> {
    match std::env::var("DUCTILE_UCX_ERR_MODE").ok().as_deref() {
        None | Some("") | Some("peer") => Ok(true),
        Some("none") => Ok(false),
        Some(other) => Err(TransportError::Io {
            context: "DUCTILE_UCX_ERR_MODE".into(),
            source: std::io::Error::other(format!(
                "`{other}` is not an error-handling mode (peer or none)"
            )),
        }),
    }
}

fn ucx_err(context: impl Into<String>) -> impl FnOnce(String) -> TransportError {
    move |e| TransportError::Io {
        context: context.into(),
        source: std::io::Error::other(e),
    }
}

struct Peer {
    uid: u64,
    ep: ffi::Ep,
}

struct Shared {
    stop: AtomicBool,
    /// The communication thread's kernel thread id (0 before it started).
    tid: AtomicU64,
    /// The communication thread sleeps on `set` with the worker armed.
    sleeping: AtomicBool,
    receives: AtomicU64,
    leaving: Mutex<Vec<Leaving>>,
    /// What the communication thread sleeps on.
    set: Handback,
}

/// The UCX transport of one node.
pub struct UcxTransport {
    worker: Arc<ffi::Worker>,
    progress: Progress,
    rx: Arc<Mutex<Rx>>,
    sink: Arc<dyn Sink>,
    peers: RwLock<HashMap<NodeId, Peer>>,
    /// This node's uid in the last view that held it (`u64::MAX`: none yet),
    /// the body of its `BYE`s.
    my_uid: AtomicU64,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl UcxTransport {
    /// Creates the worker (configured by `UCX_*` variables) and starts the
    /// communication thread, which hands frames to `sink`.
    pub fn new(sink: Arc<dyn Sink>) -> Result<Arc<Self>, TransportError> {
        Self::with_ucx_settings(sink, &[])
    }

    /// As [`UcxTransport::new`], with UCX settings (names without the
    /// `UCX_` prefix, e.g. `("TLS", "tcp")`) over the environment's.
    pub fn with_ucx_settings(
        sink: Arc<dyn Sink>,
        settings: &[(&str, &str)],
    ) -> Result<Arc<Self>, TransportError> {
        Self::with_err_mode(sink, settings, peer_errors_from_env()?)
    }

    /// As [`UcxTransport::with_ucx_settings`], with the error-handling mode
    /// chosen here instead of by `DUCTILE_UCX_ERR_MODE` (true: `peer`).
    pub(crate) fn with_err_mode(
        sink: Arc<dyn Sink>,
        settings: &[(&str, &str)],
        peer_errors: bool,
    ) -> Result<Arc<Self>, TransportError> {
        Self::build(sink, settings, peer_errors, Progress::from_env()?)
    }

    fn build(
        sink: Arc<dyn Sink>,
        settings: &[(&str, &str)],
        peer_errors: bool,
        progress: Progress,
    ) -> Result<Arc<Self>, TransportError> {
        let worker = ffi::Worker::new(settings, peer_errors).map_err(ucx_err("starting UCX"))?;
        let set = Handback::new().map_err(|source| TransportError::Io {
            context: "setting up the UCX communication thread's wake-ups".into(),
            source,
        })?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            tid: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            receives: AtomicU64::new(0),
            leaving: Mutex::new(Vec::new()),
            set,
        });
        let rx = Arc::new(Mutex::new(Rx {
            worker: worker.clone(),
            pending: VecDeque::new(),
            said_bye: HashSet::new(),
            failures: Vec::new(),
            shared: shared.clone(),
        }));
        let thread = {
            let (worker, shared, rx, sink) =
                (worker.clone(), shared.clone(), rx.clone(), sink.clone());
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
            progress,
            rx,
            sink,
            peers: RwLock::new(HashMap::new()),
            my_uid: AtomicU64::new(u64::MAX),
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// Frame receives started so far: one per frame that arrived, none by
    /// a reconciliation (`BYE`s are not counted).
    pub fn receives(&self) -> u64 {
        self.shared.receives.load(Ordering::SeqCst)
    }

    /// The communication thread's kernel thread id (0 before it started).
    #[cfg(test)]
    fn comm_tid(&self) -> u64 {
        self.shared.tid.load(Ordering::SeqCst)
    }

    /// Wakes whoever sleeps on the worker's event fd (the communication
    /// thread, or an idle PE in `pe` mode): a send is left in flight.
    fn wake(&self) {
        if self.shared.sleeping.load(Ordering::SeqCst) || self.shared.set.pes_progress() {
            self.worker.signal();
        }
    }

    /// Sends a `BYE` on `ep`; the flag is set once it left.
    fn bye(&self, ep: &ffi::Ep) -> Arc<AtomicBool> {
        let done = Arc::new(AtomicBool::new(false));
        let uid = self.my_uid.load(Ordering::SeqCst);
        if let Err(e) = ep.send(BYE, uid.to_le_bytes().to_vec(), Some(done.clone())) {
            debug!("a BYE was not sent: {e}");
        }
        done
    }

    fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.set.wake();
        if let Some(t) = self.thread.lock().expect("thread lock poisoned").take() {
            let _ = t.join();
        }
    }
}

impl Transport for UcxTransport {
    fn address(&self) -> Vec<u8> {
        self.worker.address().to_vec()
    }

    fn send(&self, to: NodeId, tag: Tag, parts: &[&[u8]]) -> Result<(), TransportError> {
        // UCX keeps the bytes until the send completes, after this returns:
        // borrowed parts have to be copied into a buffer it can own.
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut frame = Vec::with_capacity(len);
        for p in parts {
            frame.extend_from_slice(p);
        }
        self.send_frame(to, tag, frame)
    }

    fn send_frame(&self, to: NodeId, tag: Tag, frame: Vec<u8>) -> Result<(), TransportError> {
        assert!(
            (tag.kind() as u64) < BYE,
            "message kind {} collides with the UCX transport's reserved kind bit",
            tag.kind()
        );
        let pending = {
            let peers = self.peers.read().expect("endpoint table poisoned");
            let peer = peers.get(&to).ok_or(TransportError::NoEndpoint(to))?;
            peer.ep
                .send(tag.0, frame, None)
                .map_err(ucx_err(format!("sending to node {to}")))?
        };
        if pending {
            self.wake();
        }
        Ok(())
    }

    fn reconcile(&self, view: &View, me: NodeId) -> Result<Reconciled, TransportError> {
        if let Some(m) = view.members.iter().find(|m| m.node == me) {
            self.my_uid.store(m.uid, Ordering::SeqCst);
        }
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
                None => match self.worker.connect(&m.address, m.uid) {
                    Ok(ep) => {
                        stats.opened += 1;
                        Peer { uid: m.uid, ep }
                    }
                    Err(e) => {
                        // The others stay open and in place (as over TCP):
                        // the first failure is the reconcile's error.
                        failure.get_or_insert(TransportError::Address(m.node, e));
                        continue;
                    }
                },
            };
            next.insert(m.node, peer);
        }
        // Endpoints to nodes outside the view: say BYE (so the peer does not
        // report this side's close as a loss) and let the communication
        // thread close them once it left, without waiting here.
        let deadline = Instant::now() + BYE_GRACE;
        let leaving: Vec<Leaving> = by_uid
            .into_values()
            .map(|p| {
                stats.closed += 1;
                debug!(uid = p.uid, "closing the endpoint to a departed peer");
                Leaving::AfterBye {
                    bye: self.bye(&p.ep),
                    ep: p.ep,
                    deadline,
                }
            })
            .collect();
        *table = next;
        drop(table);
        self.shared
            .leaving
            .lock()
            .expect("leaving list poisoned")
            .extend(leaving);
        self.wake();
        self.shared.set.wake();
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
        let byes: Vec<Arc<AtomicBool>> = peers.iter().map(|p| self.bye(&p.ep)).collect();
        self.wake();
        let until = Instant::now() + SHUTDOWN_GRACE;
        while Instant::now() < until && !byes.iter().all(|b| b.load(Ordering::SeqCst)) {
            std::thread::sleep(Duration::from_micros(100));
            self.wake();
        }
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        let mut leaving = self.shared.leaving.lock().expect("leaving list poisoned");
        for p in peers {
            if let Some(close) = p.ep.close() {
                leaving.push(Leaving::Closing { close, deadline });
            }
        }
        drop(leaving);
        self.stop();
    }

    fn poll(&self) -> bool {
        if self.progress != Progress::Pe {
            return false;
        }
        let mut did = self.worker.progress();
        if let Ok(mut rx) = self.rx.try_lock() {
            did |= rx.poll(&*self.sink);
        }
        did
    }

    fn pe_spinning(&self, spinning: bool) {
        if self.progress == Progress::Pe {
            self.shared.set.pe_spinning(spinning);
        }
    }

    fn pe_sleeps(&self) -> bool {
        self.progress != Progress::Pe || self.shared.set.pe_sleeps()
    }

    /// The worker's event fd, armed: what arrives after this call makes it
    /// readable. An arm refused for events already pending (UCX counts a
    /// past `ucp_worker_signal` among them) progresses them and tries
    /// again; still refused, the fd is made readable at once, so the PE
    /// wakes and progresses instead of sleeping past them.
    fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        if self.progress != Progress::Pe {
            return None;
        }
        let armed = (0..ARM_TRIES).any(|_| {
            if self.worker.arm() {
                return true;
            }
            self.poll();
            false
        });
        if !armed {
            self.worker.signal();
        }
        Some(self.worker.efd())
    }

    /// While a send or a receive is under way, 1 ms: UCX announces a
    /// peer's reply and an arrival, but not room freed in a peer's queue
    /// for the rest of a send (a 64 KiB message over shared memory hung
    /// without this limit). Otherwise [`IDLE_NAP`], for an arrival UCX
    /// does not announce.
    fn wait_limit(&self) -> Option<Duration> {
        let receiving = self.rx.try_lock().map_or(true, |rx| !rx.pending.is_empty());
        Some(if self.worker.sends_in_flight() > 0 || receiving {
            IN_FLIGHT_NAP
        } else {
            IDLE_NAP
        })
    }
}

impl Drop for UcxTransport {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Receive state, owned by the communication thread.
struct Rx {
    worker: Arc<ffi::Worker>,
    /// Messages being received, in arrival order (= delivery order).
    pending: VecDeque<ffi::Incoming>,
    /// Peers (uids) that said BYE: their endpoint failing next is no loss.
    said_bye: HashSet<u64>,
    /// Endpoint failures not reported yet: (uid, why).
    failures: Vec<(u64, String)>,
    shared: Arc<Shared>,
}

impl Rx {
    /// Starts receiving what arrived, delivers what is complete, in order,
    /// and reports failed peers. True when something happened.
    fn poll(&mut self, sink: &dyn Sink) -> bool {
        let mut did = false;
        while let Some(incoming) = self.worker.receive_next() {
            did = true;
            if incoming.tag() & BYE == 0 {
                self.shared.receives.fetch_add(1, Ordering::SeqCst);
            }
            self.pending.push_back(incoming);
        }
        while let Some(res) = self.pending.front_mut().and_then(|m| m.poll()) {
            did = true;
            let m = self.pending.pop_front().expect("front exists");
            let tag = Tag(m.tag());
            match res {
                Ok(()) if tag.0 & BYE != 0 => match <[u8; 8]>::try_from(&m.into_frame()[..]) {
                    Ok(b) => {
                        let uid = u64::from_le_bytes(b);
                        debug!(uid, "peer closed its endpoint");
                        self.said_bye.insert(uid);
                    }
                    Err(_) => error!("dropping a malformed UCX BYE"),
                },
                Ok(()) => sink.deliver(tag, m.into_frame()),
                Err(e) => error!("a UCX receive from node {} failed: {e}", tag.src()),
            }
        }
        self.failures.extend(self.worker.take_failed());
        // A failure is judged once everything that arrived before it was
        // delivered, so a peer's BYE is always seen before its close.
        if self.pending.is_empty() && !self.failures.is_empty() {
            did = true;
            for (uid, why) in self.failures.drain(..) {
                if self.said_bye.contains(&uid) {
                    debug!(uid, "endpoint to a peer that said BYE ended: {why}");
                } else {
                    sink.lost(uid, format!("UCX reported the endpoint failed: {why}"));
                }
            }
        }
        did
    }
}

#[cfg(test)]
mod tests;
