//! The node: one OS process of a job. It reads the fleet's environment
//! contract, registers with the coordinator, connects to its peers, runs one
//! scheduler thread per PE, and passes the shutdown barrier before it exits
//! with the job's code.
//!
//! Exit codes of a node process: the job's code after a clean exit; 2 when it
//! could not start (bad environment, refused by the coordinator, registry
//! errors); 3 when it stopped because a peer or the coordinator was lost;
//! 101 when a PE panicked.
//!
//! A coordinator connection that drops while the job runs does not end the
//! job at once: the node rejoins the coordinator at the same address (a
//! restarted one, see `link.rs`) within `DUCTILE_COORDINATOR_RECONNECT`
//! seconds, and only then gives up.

use std::any::Any;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use ductile_coordinator::client::{Admission, Client, ClientError};
use ductile_coordinator::contract;
use ductile_coordinator::proto::{NodeId, Registration, Role, ServerMsg, View};
use tracing::{error, info, warn};

use crate::link::{rejoin_as, CoordinatorLink, Rejoined};
use crate::msg::{decode_frame, CollId};
use crate::operation::OperationSlot;
use crate::options::Options;
use crate::pe::{Inbox, LoopExit, PeCommand, Scheduler};
use crate::registry::Registry;
use crate::rescale::driver::Counts;
use crate::rescale::{ControlFrame, Desk, FrameCounts, NodeEvent, Shell};
use crate::topo::Topology;
use crate::transport::tcp::TcpTransport;
use crate::transport::{kind, Sink, Tag, Transport, TransportError};

/// Exit code of a node that could not start.
pub const EXIT_STARTUP: i32 = 2;
/// Exit code of a node that stopped because a peer or the coordinator was lost.
pub const EXIT_ABORTED: i32 = 3;
/// Exit code of a node whose PE panicked.
pub const EXIT_PANIC: i32 = 101;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(120);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(60);

/// State shared by every thread of a node.
pub(crate) struct NodeShared {
    pub registry: Arc<Registry>,
    pub inboxes: Vec<Inbox>,
    pub readonly: Mutex<HashMap<u64, Arc<dyn Any + Send + Sync>>>,
    pub args: Vec<String>,
    pub options: Options,
    topo: Mutex<Option<Arc<Topology>>>,
    /// Envelope frames that arrived before this node's first view, in
    /// arrival order. The transport's receive thread must never wait (one
    /// thread serves every peer and accepts new ones: a wait there stalls
    /// the handshakes of peers that are themselves waiting to connect), so
    /// such frames wait here and are delivered when the view is installed.
    /// Taken before `topo` wherever both are.
    early: Mutex<Vec<(Tag, Vec<u8>)>>,
    view: Mutex<Option<View>>,
    transport: OnceLock<Arc<dyn Transport>>,
    uid: AtomicU64,
    next_coll: AtomicU32,
    aborting: AtomicBool,
    abort_reason: Mutex<Option<String>>,
    finished: AtomicBool,
    /// Node 0: the rescale or checkpoint in flight (one at a time).
    pub(crate) operation: OperationSlot,
    /// Envelope frames per peer in this epoch (the rescale's drain counts them).
    frames: Mutex<FrameCounts>,
    draining: AtomicBool,
    events: crossbeam_channel::Sender<NodeEvent>,
}

impl NodeShared {
    fn new(
        registry: Arc<Registry>,
        pes: u32,
        args: Vec<String>,
        options: Options,
        events: crossbeam_channel::Sender<NodeEvent>,
    ) -> Self {
        NodeShared {
            registry,
            inboxes: (0..pes).map(|_| Inbox::new()).collect(),
            readonly: Mutex::new(HashMap::new()),
            args,
            options,
            topo: Mutex::new(None),
            early: Mutex::new(Vec::new()),
            view: Mutex::new(None),
            transport: OnceLock::new(),
            uid: AtomicU64::new(0),
            next_coll: AtomicU32::new(1),
            aborting: AtomicBool::new(false),
            abort_reason: Mutex::new(None),
            finished: AtomicBool::new(false),
            operation: OperationSlot::default(),
            frames: Mutex::new(FrameCounts::default()),
            draining: AtomicBool::new(false),
            events,
        }
    }

    /// Installs `view`, in which this node is `me`, as the current one.
    pub(crate) fn install_view(&self, view: View, me: u32) -> Arc<Topology> {
        let topo = Arc::new(Topology::new(&view, me));
        *self.view.lock().expect("view lock poisoned") = Some(view);
        *self.frames.lock().expect("frame counts poisoned") = FrameCounts::default();
        self.install(topo.clone());
        topo
    }

    /// The installed topology, if there is one yet (a newcomer waiting has none).
    pub(crate) fn topology_now(&self) -> Option<Arc<Topology>> {
        self.topo.lock().expect("topology lock poisoned").clone()
    }

    /// The installed topology.
    pub(crate) fn current_topology(&self) -> Arc<Topology> {
        self.topology_now()
            .expect("topology installed before it is asked for")
    }

    /// The transport, once there is one (a standalone node has none).
    pub(crate) fn transport_if_any(&self) -> Option<Arc<dyn Transport>> {
        self.transport.get().cloned()
    }

    pub(crate) fn transport(&self) -> Arc<dyn Transport> {
        self.transport
            .get()
            .expect("members have a transport")
            .clone()
    }

    /// Sends a rescale-protocol frame to `node`, tagged with `epoch`.
    pub(crate) fn send_control(
        &self,
        node: u32,
        epoch: u64,
        frame: &ControlFrame,
    ) -> Result<(), TransportError> {
        let me = self.current_topology().my_node();
        let body = postcard::to_allocvec(frame).expect("encoding into a Vec cannot fail");
        self.transport()
            .send(node, Tag::new(me, epoch, kind::CONTROL), &[&body])
    }

    /// Envelope frames sent to and received from each of the first
    /// `nodes` node ids in this epoch (what the rescale's drain compares).
    pub(crate) fn frame_counts(&self, nodes: u32) -> Counts {
        let f = self.frames.lock().expect("frame counts poisoned");
        let get = |m: &HashMap<u32, u64>, n: u32| m.get(&n).copied().unwrap_or(0);
        Counts {
            sent: (0..nodes).map(|n| get(&f.sent, n)).collect(),
            received: (0..nodes).map(|n| get(&f.received, n)).collect(),
        }
    }

    pub(crate) fn set_draining(&self, on: bool) {
        self.draining.store(on, Ordering::SeqCst);
    }

    /// Runs `f` on the desk of the rescale being served, if any.
    pub(crate) fn with_desk<R>(&self, f: impl FnOnce(&mut Desk) -> R) -> Option<R> {
        self.operation.with_rescale(f)
    }

    /// Answers the rescale being served (no-op when none is).
    pub(crate) fn finish_rescale(&self, result: Result<(), crate::rescale::RescaleFailed>) {
        let desk = self.operation.take_rescale();
        if let (Some(desk), Some(view)) = (desk, self.view()) {
            desk.answer(&view, result);
        }
    }

    /// Installs `topo`, then delivers the frames that came before the
    /// first one, all under the `early` lock: a frame that arrives
    /// meanwhile waits for them, so every pair's order holds.
    fn install(&self, topo: Arc<Topology>) {
        let mut early = self.early.lock().expect("early frames poisoned");
        *self.topo.lock().expect("topology lock poisoned") = Some(topo.clone());
        for (tag, frame) in early.drain(..) {
            self.deliver_envelope(&topo, tag, frame);
        }
    }

    /// The current membership view (None before the job started or standalone).
    pub(crate) fn view(&self) -> Option<View> {
        self.view.lock().expect("view lock poisoned").clone()
    }

    /// Hands an envelope frame to its PE's inbox and counts it.
    fn deliver_envelope(&self, topo: &Topology, tag: Tag, frame: Vec<u8>) {
        match decode_frame(topo, tag, frame) {
            Ok((rank, env)) => self.inboxes[rank].push(env),
            Err(e) => error!("dropping a frame from node {}: {e}", tag.src()),
        }
        *self
            .frames
            .lock()
            .expect("frame counts poisoned")
            .received
            .entry(tag.src())
            .or_insert(0) += 1;
        if self.draining.load(Ordering::SeqCst) {
            let _ = self.events.send(NodeEvent::Counted);
        }
    }

    /// A fresh job-wide collection id: this node's uid and a local counter.
    pub(crate) fn new_collection_id(&self) -> CollId {
        let n = self.next_coll.fetch_add(1, Ordering::Relaxed);
        ((self.uid.load(Ordering::Relaxed) + 1) << 32) | n as u64
    }

    /// Sends an encoded envelope frame (see `msg::encode_frame`) to `node`.
    pub(crate) fn send_to_node(&self, node: u32, frame: Vec<u8>) -> Result<(), TransportError> {
        let topo = self
            .topology_now()
            .expect("sending before the topology is installed");
        let t = self
            .transport
            .get()
            .ok_or(TransportError::NoEndpoint(node))?;
        t.send_frame(
            node,
            Tag::new(topo.my_node(), topo.epoch(), kind::ENVELOPE),
            frame,
        )?;
        *self
            .frames
            .lock()
            .expect("frame counts poisoned")
            .sent
            .entry(node)
            .or_insert(0) += 1;
        Ok(())
    }

    /// Makes every PE leave its loop; the node then exits with [`EXIT_ABORTED`].
    pub(crate) fn abort(&self, reason: String) {
        if self.finished.load(Ordering::SeqCst) {
            return;
        }
        let mut r = self.abort_reason.lock().expect("abort lock poisoned");
        if r.is_none() {
            error!("{reason}");
            *r = Some(reason);
        }
        self.aborting.store(true, Ordering::SeqCst);
    }

    /// Ends the job because the member `peer_uid` is gone (its connection
    /// ended, or a send to it failed). Every survivor ends its part of the
    /// job, but only one says so as an error, naming the node: the
    /// lowest-numbered survivor; the others log it at info level, so a lost
    /// node is one line on the job's terminal, not one per node and PE.
    pub(crate) fn lose_peer(&self, peer_uid: u64, reason: &str) {
        let view = self.view();
        let me = self.topology_now().map(|t| t.my_uid());
        let (reason, speaks) = loss_report(view.as_ref(), peer_uid, me, reason);
        if speaks {
            self.abort(reason);
        } else {
            if !self.finished.load(Ordering::SeqCst) {
                let mut r = self.abort_reason.lock().expect("abort lock poisoned");
                if r.is_none() {
                    info!("{reason}");
                    *r = Some(reason);
                }
            }
            self.aborting.store(true, Ordering::SeqCst);
        }
    }

    pub(crate) fn aborting(&self) -> bool {
        self.aborting.load(Ordering::Relaxed)
    }
}

/// The line that says member `peer_uid` was lost (`reason`: how it was
/// noticed), and whether this node (uid `me`) is the one to say it as an
/// error: the lowest-numbered member of `view` other than the lost one.
fn loss_report(
    view: Option<&View>,
    peer_uid: u64,
    me: Option<u64>,
    reason: &str,
) -> (String, bool) {
    let peer = view.and_then(|v| v.by_uid(peer_uid)).map(|m| m.node);
    let speaker = view.and_then(|v| {
        v.members
            .iter()
            .filter(|m| m.uid != peer_uid)
            .min_by_key(|m| m.node)
            .map(|m| m.uid)
    });
    let line = match peer {
        Some(node) => format!("lost node {node} (uid {peer_uid}): {reason}; ending the job"),
        None => format!("lost the node with uid {peer_uid}: {reason}; ending the job"),
    };
    (line, speaker.is_some() && speaker == me)
}

/// Delivers frames from the transport to the right PE's inbox.
struct NodeSink(Weak<NodeShared>);

impl Sink for NodeSink {
    fn deliver(&self, tag: Tag, frame: Vec<u8>) {
        let Some(node) = self.0.upgrade() else { return };
        if tag.kind() == kind::CONTROL {
            match postcard::from_bytes::<ControlFrame>(&frame) {
                Ok(frame) => {
                    let _ = node.events.send(NodeEvent::Frame {
                        src: tag.src(),
                        epoch_bits: tag.epoch_bits(),
                        frame,
                    });
                }
                Err(e) => error!(
                    "dropping a malformed control frame from node {}: {e}",
                    tag.src()
                ),
            }
            return;
        }
        let max = node.options.link_delay;
        if !max.is_zero() {
            // +link-delay-us: the transport delivers each link's frames in
            // order, so sleeping here delays frames, not their order (with
            // TCP's one receive thread, every link's).
            std::thread::sleep(max.mul_f64(rand::random::<f64>()));
        }
        let topo = {
            let mut early = node.early.lock().expect("early frames poisoned");
            match node.topology_now() {
                Some(topo) => topo,
                None => return early.push((tag, frame)),
            }
        };
        node.deliver_envelope(&topo, tag, frame);
    }

    fn lost(&self, peer_uid: u64, reason: String) {
        if let Some(node) = self.0.upgrade() {
            let member = node.view().is_some_and(|v| v.by_uid(peer_uid).is_some());
            if !member {
                // A newcomer that dialled speculatively and died before it
                // was admitted, or a node already removed: not the job's loss.
                warn!("the connection from uid {peer_uid}, not a member, ended: {reason}");
                return;
            }
            node.lose_peer(peer_uid, &format!("its connection ended ({reason})"));
        }
    }
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn fail_startup(msg: impl std::fmt::Display) -> ! {
    eprintln!("ductile node: {msg}");
    std::process::exit(EXIT_STARTUP)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "localhost".into())
}

/// `DUCTILE_LOG` (default `warn`) in the format of `DUCTILE_LOG_FORMAT`;
/// spans log their close, so `DUCTILE_LOG=ductile=debug` times each rescale
/// stage and LB step.
fn init_logging() {
    ductile_coordinator::logs::init_from_env(ductile_coordinator::logs::LogSetup {
        default_filter: "warn",
        target: false,
        span_close: true,
    });
}

fn install_panic_exit() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        let thread = std::thread::current();
        eprintln!(
            "ductile node: {} panicked; the node exits with {EXIT_PANIC}",
            thread.name().unwrap_or("a thread")
        );
        std::process::exit(EXIT_PANIC);
    }));
}

/// Exits when the local launcher that started this node goes away, so a
/// killed `ductile run` never leaves orphans behind. The launcher's lifeline
/// (an inherited pipe, [`ductile_coordinator::lifeline`]) reaches the node
/// through wrapper scripts too, which the parent pid would not.
fn watch_launcher() {
    let watched = ductile_coordinator::lifeline::watch(|| {
        eprintln!("ductile node: the launcher that started this job is gone; exiting");
        std::process::exit(EXIT_ABORTED);
    });
    if let Err(error) = watched {
        tracing::warn!(%error, "this node will not notice if its launcher is killed");
    }
}

/// Runs this process as a node of a job, with the chare types, readonlies and
/// reducers that `register` declares. Never returns: the process exits with
/// the job's code.
///
/// Without `DUCTILE_COORDINATOR` the program runs alone as a one-node job
/// with `DUCTILE_PES` PEs (default 1); under `ductile run` or the Kubernetes
/// operator it joins its job through the coordinator.
pub fn launch(register: impl FnOnce(&mut Registry)) -> ! {
    init_logging();
    install_panic_exit();
    let mut reg = Registry::new();
    register(&mut reg);
    if let Some(e) = reg.errors().first() {
        fail_startup(format!("registration failed: {e}"));
    }
    if reg.main_type.is_none() {
        fail_startup(
            "no main chare registered: call `reg.main::<Main>()` in the registration function",
        );
    }
    let registry = Arc::new(reg);
    let pes = match env_var(contract::ENV_PES) {
        None => 1,
        Some(p) => p.parse::<u32>().ok().filter(|&p| p > 0).unwrap_or_else(|| {
            fail_startup(format!("{}={p} is not a PE count", contract::ENV_PES))
        }),
    };
    let (options, args) = crate::options::parse(std::env::args().skip(1).collect())
        .unwrap_or_else(|e| fail_startup(e));
    // GPUs before anything else: a newcomer has its contexts before it
    // registers, so admitting it never waits for CUDA (docs/gpu.md).
    if let Some(spec) = &registry.gpu {
        if let Err(e) = crate::gpu::start(spec, pes) {
            fail_startup(e);
        }
    }
    let options_coordinator = options.coordinator.clone();
    let (events, events_rx) = crossbeam_channel::unbounded();
    let node = Arc::new(NodeShared::new(
        registry.clone(),
        pes,
        args,
        options,
        events,
    ));
    if let Some(listen) = env_var(contract::ENV_METRICS) {
        let listen = listen
            .parse()
            .unwrap_or_else(|e| fail_startup(format!("{}={listen}: {e}", contract::ENV_METRICS)));
        let file = env_var(contract::ENV_METRICS_FILE).map(std::path::PathBuf::from);
        match crate::scrape::start(listen, file, node.clone()) {
            Ok(addr) => info!(%addr, "metrics on /metrics"),
            Err(e) => fail_startup(format!("cannot serve metrics on {listen}: {e}")),
        }
    }
    let coordinator = options_coordinator.or_else(|| env_var(contract::ENV_COORDINATOR));
    let code = match coordinator {
        None => {
            node.install(Arc::new(Topology::standalone(pes)));
            let (handles, _commands) = start_pes(&node, true);
            let mut outcome = LoopExit::Exit(0);
            for h in handles {
                match h.join() {
                    Ok(LoopExit::Exit(code)) if outcome != LoopExit::Aborted => {
                        outcome = LoopExit::Exit(code)
                    }
                    Ok(_) => outcome = LoopExit::Aborted,
                    Err(_) => std::process::exit(EXIT_PANIC),
                }
            }
            match outcome {
                LoopExit::Exit(code) => code,
                _ => EXIT_ABORTED,
            }
        }
        Some(addr) => run_member(&node, events_rx, &addr),
    };
    crate::gpu::at_exit();
    std::process::exit(code)
}

fn run_member(
    node: &Arc<NodeShared>,
    events: crossbeam_channel::Receiver<NodeEvent>,
    coordinator: &str,
) -> i32 {
    watch_launcher();
    let secret = contract::secret_from_env().unwrap_or_else(|e| fail_startup(e));
    let role = if node.options.newcomer {
        Role::Newcomer
    } else {
        contract::role_from_env().unwrap_or_else(|e| fail_startup(e))
    };
    let reconnect = contract::reconnect_from_env().unwrap_or_else(|e| fail_startup(e));
    let bind: IpAddr = env_var(contract::ENV_BIND)
        .map(|b| {
            b.parse()
                .unwrap_or_else(|e| fail_startup(format!("{}={b}: {e}", contract::ENV_BIND)))
        })
        .unwrap_or(IpAddr::from([127, 0, 0, 1]));
    let advertise: Option<IpAddr> = env_var(contract::ENV_ADVERTISE).map(|a| {
        a.parse()
            .unwrap_or_else(|e| fail_startup(format!("{}={a}: {e}", contract::ENV_ADVERTISE)))
    });
    // DUCTILE_TRANSPORT: tcp, or ucx when built with the `ucx` feature (then
    // the default); UCX itself reads UCX_TLS, UCX_NET_DEVICES, ... from the
    // environment the node inherits.
    let available: &[&str] = if cfg!(feature = "ucx") {
        &["ucx", "tcp"]
    } else {
        &["tcp"]
    };
    let chosen = env_var(contract::ENV_TRANSPORT).unwrap_or_else(|| available[0].to_owned());
    if !available.contains(&chosen.as_str()) {
        fail_startup(format!(
            "transport `{chosen}` is not built into this program (available: {})",
            available.join(", ")
        ));
    }
    // Frames counted both ways for the metrics (relaxed atomics, no lock).
    let sink = Arc::new(crate::traffic::CountedSink::new(
        &chosen,
        NodeSink(Arc::downgrade(node)),
    ));
    // The TCP transport also needs this node's uid once registered.
    let (transport, tcp): (Arc<dyn Transport>, Option<Arc<TcpTransport>>) = match chosen.as_str() {
        #[cfg(feature = "ucx")]
        "ucx" => (
            crate::transport::ucx::UcxTransport::new(sink).unwrap_or_else(|e| fail_startup(e)),
            None,
        ),
        _ => {
            let t = TcpTransport::bind(bind, advertise, secret.clone(), sink)
                .unwrap_or_else(|e| fail_startup(e));
            (t.clone(), Some(t))
        }
    };
    let transport = crate::traffic::counted(&chosen, transport);
    let _ = node.transport.set(transport.clone());
    let client = Client::connect(coordinator, &secret, CONNECT_TIMEOUT).unwrap_or_else(|e| {
        fail_startup(format!(
            "cannot reach the coordinator at {coordinator}: {e}"
        ))
    });
    let registration = Registration {
        role,
        address: transport.address(),
        pes: node.inboxes.len() as u32,
        host: hostname(),
        pid: std::process::id(),
        fingerprint: node.registry.fingerprint(),
    };
    let admission = client
        .register(registration.clone(), LAUNCH_TIMEOUT)
        .unwrap_or_else(|e| fail_startup(format!("the coordinator refused this node: {e}")));
    let rejoiner = Arc::new(Rejoiner {
        link: Arc::new(CoordinatorLink::new(coordinator, secret.clone(), client)),
        node: node.clone(),
        registration,
        bound: reconnect,
        tcp,
    });
    let set_uid = |uid: u64| rejoiner.set_uid(uid);
    let admitted = match &admission {
        Admission::Member { view, .. } => Some(view.clone()),
        Admission::Waiting { .. } => None,
    };
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = watch_coordinator(rejoiner.clone(), watching.clone(), admitted);
    let mut shell = Shell::new(node.clone(), events, rejoiner.link.clone());
    let (me, newcomer) = match admission {
        Admission::Member { node: me, view } => {
            set_uid(view.members[me as usize].uid);
            if let Err(e) = transport.reconcile(&view, me) {
                error!("connecting to peers failed: {e}");
                return EXIT_ABORTED;
            }
            node.install_view(view, me);
            (me, false)
        }
        Admission::Waiting { uid, view } => {
            set_uid(uid);
            // Speculative endpoints: dialled now, kept by the reconciliation
            // that follows admission, so the rescale does not wait for them.
            if let Err(e) = transport.reconcile(&view, NodeId::MAX) {
                warn!("speculative endpoints to epoch {} failed: {e}", view.epoch);
            }
            info!(
                uid,
                epoch = view.epoch,
                "newcomer registered; waiting for admission"
            );
            match shell.admit() {
                Ok(me) => (me, true),
                Err(e) => {
                    error!("joining the job failed: {e}");
                    return EXIT_ABORTED;
                }
            }
        }
    };
    let topo = node.current_topology();
    info!(
        node = me,
        epoch = topo.epoch(),
        pes = topo.num_pes(),
        newcomer,
        "joined the job"
    );
    if me == 0 {
        if let Some(listen) = env_var(contract::ENV_CONTROL) {
            let listen = listen.parse().unwrap_or_else(|e| {
                fail_startup(format!("{}={listen}: {e}", contract::ENV_CONTROL))
            });
            let file = env_var(contract::ENV_CONTROL_FILE).map(std::path::PathBuf::from);
            match crate::control::start(listen, file, secret.clone(), node.clone(), coordinator) {
                Ok(addr) => info!(%addr, "control endpoint listening"),
                Err(e) => fail_startup(format!(
                    "cannot start the control endpoint on {listen}: {e}"
                )),
            }
        }
    }
    let (handles, commands) = start_pes(node, me == 0 && !newcomer);
    shell.attach(commands);
    let outcome = shell.run();
    for h in handles {
        if h.join().is_err() {
            std::process::exit(EXIT_PANIC);
        }
    }
    watching.store(false, Ordering::SeqCst);
    let _ = watcher.join();
    if node.aborting() {
        return EXIT_ABORTED;
    }
    match outcome {
        LoopExit::Exit(code) => {
            node.finished.store(true, Ordering::SeqCst);
            let code = shutdown_barrier(&rejoiner, code);
            transport.shutdown();
            code
        }
        LoopExit::Departed => {
            node.finished.store(true, Ordering::SeqCst);
            transport.shutdown();
            0
        }
        LoopExit::Aborted | LoopExit::Stopped => EXIT_ABORTED,
    }
}

/// What a node needs to rejoin its coordinator after the connection
/// dropped (see [`crate::link`]).
struct Rejoiner {
    link: Arc<CoordinatorLink>,
    node: Arc<NodeShared>,
    /// This node's registration: a newcomer not admitted yet sends it again.
    registration: Registration,
    /// How long to keep trying (`DUCTILE_COORDINATOR_RECONNECT`); zero: not at all.
    bound: Duration,
    /// The TCP transport announces this node's uid when it dials.
    tcp: Option<Arc<TcpTransport>>,
}

impl Rejoiner {
    fn set_uid(&self, uid: u64) {
        if let Some(t) = &self.tcp {
            t.set_uid(uid);
        }
        self.node.uid.store(uid, Ordering::Relaxed);
    }

    /// Rejoins the coordinator as this node's role says, within the bound;
    /// `admitted` is the view the node was admitted to (launch or
    /// `Integrate`) in case it has not installed it yet, and `needed` says
    /// whether the node still needs the coordinator.
    fn rejoin(
        &self,
        admitted: Option<&View>,
        needed: impl Fn() -> bool,
    ) -> Result<Rejoined, String> {
        let addr = self.link.addr();
        if self.bound.is_zero() {
            return Err(format!(
                "{}=0: not trying to rejoin it",
                contract::ENV_COORDINATOR_RECONNECT
            ));
        }
        warn!(
            "lost the coordinator connection; trying to rejoin the coordinator at {addr} for up to {:.1}s",
            self.bound.as_secs_f64()
        );
        let started = Instant::now();
        let node = &self.node;
        let fingerprint = node.registry.fingerprint();
        let rejoined = self.link.rejoin(started + self.bound, || {
            if !needed() {
                return None;
            }
            let uid = node.uid.load(Ordering::Relaxed);
            rejoin_as(node.view(), admitted, uid, fingerprint, &self.registration)
        })?;
        match &rejoined {
            Rejoined::Member { node: me, view } => warn!(
                "rejoined the coordinator at {addr} as node {me} of epoch {} after {:.2}s",
                view.epoch,
                started.elapsed().as_secs_f64()
            ),
            Rejoined::Waiting { uid, .. } => {
                // Endpoints dialled from now on announce the new uid. The
                // speculative ones are kept as they are (admission reconciles
                // them with the view it brings); to their peers they name the
                // old uid, which a peer only uses to report a lost connection,
                // and the coordinator's MemberLost reports that too.
                self.set_uid(*uid);
                warn!(
                    "registered again with the coordinator at {addr} as a newcomer (uid {uid}) after {:.2}s; waiting for admission",
                    started.elapsed().as_secs_f64()
                );
            }
            Rejoined::Removed { epoch } => warn!(
                "the coordinator at {addr} says this node was removed at epoch {epoch} while it was away"
            ),
        }
        Ok(rejoined)
    }
}

/// Forwards the coordinator's notices to the node's driver. When the
/// connection drops while the job runs, rejoins the coordinator (a restarted
/// one) and goes on with the new connection; the job ends only if that fails
/// within the bound. Stops after Die (the coordinator then closes the
/// departed node's connection).
fn watch_coordinator(
    rejoiner: Arc<Rejoiner>,
    watching: Arc<AtomicBool>,
    mut admitted: Option<View>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("ductile-coord".into())
        .spawn(move || {
            let node = rejoiner.node.clone();
            let needed = || watching.load(Ordering::SeqCst) && !node.aborting();
            while watching.load(Ordering::SeqCst) {
                let client = rejoiner.link.current();
                match client.events().recv_timeout(Duration::from_millis(50)) {
                    Ok(msg) => {
                        if let ServerMsg::Integrate { view, .. } = &msg {
                            admitted = Some(view.clone());
                        }
                        let die = matches!(msg, ServerMsg::Die { .. });
                        let _ = node.events.send(NodeEvent::Coordinator(msg));
                        if die {
                            return;
                        }
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                        if !needed() {
                            return;
                        }
                        match rejoiner.rejoin(admitted.as_ref(), needed) {
                            Ok(Rejoined::Removed { epoch }) => {
                                // The Die this departing node waits for.
                                let die = ServerMsg::Die { epoch };
                                let _ = node.events.send(NodeEvent::Coordinator(die));
                                return;
                            }
                            Ok(_) => {}
                            Err(e) => {
                                if needed() {
                                    node.abort(format!(
                                        "lost the coordinator connection and could not rejoin it: {e}; ending the job"
                                    ));
                                }
                                return;
                            }
                        }
                    }
                }
            }
        })
        .expect("spawning the coordinator watcher")
}

/// Passes the shutdown barrier with this node's `code`; returns the job's.
/// If the coordinator connection drops meanwhile (a restart), rejoins and
/// enters the barrier again: a restarted coordinator knows nothing of it.
fn shutdown_barrier(rejoiner: &Rejoiner, code: i32) -> i32 {
    let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
    loop {
        let epoch = rejoiner.node.current_topology().epoch();
        let left = deadline.saturating_duration_since(Instant::now());
        match rejoiner.link.current().shutdown_barrier(epoch, code, left) {
            Ok(job_code) => return job_code,
            Err(ClientError::Disconnected | ClientError::Io(_)) if !left.is_zero() => {
                match rejoiner.rejoin(None, || true) {
                    Ok(Rejoined::Member { .. }) => {}
                    Ok(other) => {
                        error!(
                            "shutdown barrier failed: the restarted coordinator answered {other:?}"
                        );
                        return EXIT_ABORTED;
                    }
                    Err(e) => {
                        error!("shutdown barrier failed: lost the coordinator and could not rejoin it: {e}");
                        return EXIT_ABORTED;
                    }
                }
            }
            Err(e) => {
                error!("shutdown barrier failed: {e}");
                return EXIT_ABORTED;
            }
        }
    }
}

/// Starts one scheduler thread per local PE; the job's main chare starts on
/// global PE 0 when `main_here`. Returns the threads and their command
/// channels (a rescale's driver steers stopped PEs through them).
fn start_pes(
    node: &Arc<NodeShared>,
    main_here: bool,
) -> (
    Vec<std::thread::JoinHandle<LoopExit>>,
    Vec<crossbeam_channel::Sender<PeCommand>>,
) {
    let topo = node.current_topology();
    let spin = Duration::from_micros(
        env_var("DUCTILE_SPIN_US")
            .and_then(|s| s.parse().ok())
            .unwrap_or(100),
    );
    let mut commands = Vec::new();
    let cpus = crate::affinity::allowed_cpus();
    let handles = (0..topo.local_pes() as usize)
        .map(|rank| {
            let (tx, rx) = crossbeam_channel::unbounded();
            commands.push(tx);
            let (node, topo, cpus) = (node.clone(), topo.clone(), cpus.clone());
            let pe_id = topo.local_pe(rank);
            std::thread::Builder::new()
                .name(format!("ductile-pe-{rank}"))
                .spawn(move || {
                    crate::gpu::bind_pe(rank);
                    let pes = topo.local_pes() as usize;
                    crate::affinity::pin_this_pe(rank, pes, &cpus, node.options.pe_affinity);
                    let mut pe = Scheduler::new(node.clone(), topo, pe_id);
                    if pe_id == 0 && main_here {
                        match env_var(contract::ENV_RESTORE) {
                            Some(dir) => pe.restore(dir.into()),
                            None => pe.start_main(),
                        }
                    }
                    let inbox = &node.inboxes[rank];
                    let exit = loop {
                        match pe.run(inbox, spin) {
                            LoopExit::Stopped => match pe.rescale(inbox, &rx, &node.events) {
                                Some(exit) => break exit,
                                None => continue,
                            },
                            exit => break exit,
                        }
                    };
                    let _ = node.events.send(NodeEvent::Exited { rank, exit });
                    exit
                })
                .expect("spawning a PE thread")
        })
        .collect();
    (handles, commands)
}

#[cfg(test)]
mod tests {
    use ductile_coordinator::proto::Member;

    use super::*;

    #[test]
    fn a_lost_member_is_said_as_an_error_by_one_survivor_only() {
        let view = View {
            epoch: 3,
            members: (0..4)
                .map(|i| Member {
                    node: i,
                    uid: 50 + u64::from(i),
                    address: vec![],
                    pes: 1,
                    host: "t".into(),
                    pid: i,
                })
                .collect(),
        };
        let speakers: Vec<u64> = (50..54)
            .filter(|&me| me != 52)
            .filter(|&me| loss_report(Some(&view), 52, Some(me), "gone").1)
            .collect();
        assert_eq!(speakers, vec![50], "node 0 speaks for the job");
        let (line, _) = loss_report(
            Some(&view),
            52,
            Some(51),
            "the coordinator reported it gone",
        );
        assert_eq!(
            line,
            "lost node 2 (uid 52): the coordinator reported it gone; ending the job"
        );
        // Node 0 lost: node 1 speaks.
        assert!(loss_report(Some(&view), 50, Some(51), "x").1);
        assert!(!loss_report(Some(&view), 50, Some(52), "x").1);
        // Not in the view (a newcomer admitted later): named by uid.
        let (line, _) = loss_report(Some(&view), 99, Some(50), "x");
        assert!(line.starts_with("lost the node with uid 99: x"), "{line}");
        assert!(
            !loss_report(None, 52, Some(50), "x").1,
            "no view, no speaker"
        );
    }
}
