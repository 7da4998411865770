//! The node: one OS process of a job. It reads the fleet's environment
//! contract, registers with the coordinator, connects to its peers, runs one
//! scheduler thread per PE, and passes the shutdown barrier before it exits
//! with the job's code.
//!
//! Exit codes of a node process: the job's code after a clean exit; 2 when it
//! could not start (bad environment, refused by the coordinator, registry
//! errors); 3 when it stopped because a peer or the coordinator was lost;
//! 101 when a PE panicked.

use std::any::Any;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

use ductile_coordinator::client::{Admission, Client};
use ductile_coordinator::contract;
use ductile_coordinator::proto::{Registration, Role, ServerMsg, View};
use tracing::{error, info, warn};

use crate::msg::{decode_frame, CollId};
use crate::options::Options;
use crate::pe::{Inbox, LoopExit, Pe};
use crate::registry::Registry;
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
const TOPOLOGY_WAIT: Duration = Duration::from_secs(60);

/// State shared by every thread of a node.
pub(crate) struct NodeShared {
    pub registry: Arc<Registry>,
    pub inboxes: Vec<Inbox>,
    pub readonly: Mutex<HashMap<u64, Arc<dyn Any + Send + Sync>>>,
    pub args: Vec<String>,
    pub options: Options,
    topo: Mutex<Option<Arc<Topology>>>,
    topo_set: Condvar,
    view: Mutex<Option<View>>,
    transport: OnceLock<Arc<dyn Transport>>,
    uid: AtomicU64,
    next_coll: AtomicU32,
    aborting: AtomicBool,
    abort_reason: Mutex<Option<String>>,
    finished: AtomicBool,
}

impl NodeShared {
    fn new(registry: Arc<Registry>, pes: u32, args: Vec<String>, options: Options) -> Self {
        NodeShared {
            registry,
            inboxes: (0..pes).map(|_| Inbox::new()).collect(),
            readonly: Mutex::new(HashMap::new()),
            args,
            options,
            topo: Mutex::new(None),
            topo_set: Condvar::new(),
            view: Mutex::new(None),
            transport: OnceLock::new(),
            uid: AtomicU64::new(0),
            next_coll: AtomicU32::new(1),
            aborting: AtomicBool::new(false),
            abort_reason: Mutex::new(None),
            finished: AtomicBool::new(false),
        }
    }

    fn install(&self, topo: Arc<Topology>) {
        *self.topo.lock().expect("topology lock poisoned") = Some(topo);
        self.topo_set.notify_all();
    }

    /// The current membership view (None before the job started or standalone).
    pub(crate) fn view(&self) -> Option<View> {
        self.view.lock().expect("view lock poisoned").clone()
    }

    fn topology(&self, wait: Duration) -> Option<Arc<Topology>> {
        let guard = self.topo.lock().expect("topology lock poisoned");
        let (guard, _) = self
            .topo_set
            .wait_timeout_while(guard, wait, |t| t.is_none())
            .expect("topology lock poisoned");
        guard.clone()
    }

    /// A fresh job-wide collection id: this node's uid and a local counter.
    pub(crate) fn new_collection_id(&self) -> CollId {
        let n = self.next_coll.fetch_add(1, Ordering::Relaxed);
        ((self.uid.load(Ordering::Relaxed) + 1) << 32) | n as u64
    }

    pub(crate) fn send_to_node(
        &self,
        node: u32,
        head: &[u8],
        body: &[u8],
    ) -> Result<(), TransportError> {
        let topo = self
            .topology(Duration::ZERO)
            .expect("sending before the topology is installed");
        let t = self
            .transport
            .get()
            .ok_or(TransportError::NoEndpoint(node))?;
        t.send(
            node,
            Tag::new(topo.my_node(), topo.epoch(), kind::ENVELOPE),
            &[head, body],
        )
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

    pub(crate) fn aborting(&self) -> bool {
        self.aborting.load(Ordering::Relaxed)
    }
}

/// Delivers frames from the transport to the right PE's inbox.
struct NodeSink(Weak<NodeShared>);

impl Sink for NodeSink {
    fn deliver(&self, tag: Tag, frame: Vec<u8>) {
        let Some(node) = self.0.upgrade() else { return };
        let Some(topo) = node.topology(TOPOLOGY_WAIT) else {
            error!(
                "dropping a frame from node {}: this node never received its view",
                tag.src()
            );
            return;
        };
        match decode_frame(&topo, tag, frame) {
            Ok((rank, env)) => node.inboxes[rank].push(env),
            Err(e) => error!("dropping a frame from node {}: {e}", tag.src()),
        }
    }

    fn lost(&self, peer_uid: u64, reason: String) {
        if let Some(node) = self.0.upgrade() {
            node.abort(format!(
                "lost the connection from the node with uid {peer_uid}: {reason}; ending the job"
            ));
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

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env(contract::ENV_LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
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
/// killed `ductile run` never leaves orphans behind.
fn watch_launcher() {
    let Some(pid) = env_var(contract::ENV_LAUNCHER_PID).and_then(|p| p.parse::<u32>().ok()) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("ductile-watchdog".into())
        .spawn(move || loop {
            if std::os::unix::process::parent_id() != pid {
                eprintln!("ductile node: the launcher (pid {pid}) is gone; exiting");
                std::process::exit(EXIT_ABORTED);
            }
            std::thread::sleep(Duration::from_millis(200));
        });
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
    let node = Arc::new(NodeShared::new(registry.clone(), pes, args, options));
    let code = match env_var(contract::ENV_COORDINATOR) {
        None => {
            node.install(Arc::new(Topology::standalone(pes)));
            match run_pes(&node, true) {
                LoopExit::Exit(code) => code,
                LoopExit::Aborted => EXIT_ABORTED,
            }
        }
        Some(addr) => run_member(&node, &addr),
    };
    std::process::exit(code)
}

fn run_member(node: &Arc<NodeShared>, coordinator: &str) -> i32 {
    watch_launcher();
    let secret = contract::secret_from_env().unwrap_or_else(|e| fail_startup(e));
    let role = contract::role_from_env().unwrap_or_else(|e| fail_startup(e));
    if role == Role::Newcomer {
        fail_startup(
            "this build cannot join a running job as a newcomer yet (elasticity is not built in)",
        );
    }
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
    let sink = Arc::new(NodeSink(Arc::downgrade(node)));
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
    let (me, view) = match client.register(registration, LAUNCH_TIMEOUT) {
        Ok(Admission::Member { node, view }) => (node, view),
        Ok(Admission::Waiting { .. }) => {
            fail_startup("the coordinator queued this launch member as a newcomer")
        }
        Err(e) => fail_startup(format!("the coordinator refused this node: {e}")),
    };
    let uid = view.members[me as usize].uid;
    if let Some(t) = &tcp {
        t.set_uid(uid);
    }
    node.uid.store(uid, Ordering::Relaxed);
    let topo = Arc::new(Topology::new(&view, me));
    *node.view.lock().expect("view lock poisoned") = Some(view.clone());
    info!(
        node = me,
        epoch = view.epoch,
        pes = topo.num_pes(),
        "joined the job"
    );
    if let Err(e) = transport.reconcile(&view, me) {
        error!("connecting to peers failed: {e}");
        return EXIT_ABORTED;
    }
    node.install(topo.clone());

    let client = Arc::new(client);
    if me == 0 {
        if let Some(listen) = env_var(contract::ENV_CONTROL) {
            let listen = listen.parse().unwrap_or_else(|e| {
                fail_startup(format!("{}={listen}: {e}", contract::ENV_CONTROL))
            });
            let file = env_var(contract::ENV_CONTROL_FILE).map(std::path::PathBuf::from);
            match crate::control::start(listen, file, secret.clone(), node.clone(), client.clone())
            {
                Ok(addr) => info!(%addr, "control endpoint listening"),
                Err(e) => fail_startup(format!(
                    "cannot start the control endpoint on {listen}: {e}"
                )),
            }
        }
    }
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (client, node, watching) = (client.clone(), node.clone(), watching.clone());
        std::thread::Builder::new()
            .name("ductile-coord".into())
            .spawn(move || {
                while watching.load(Ordering::SeqCst) {
                    match client.events().recv_timeout(Duration::from_millis(50)) {
                        Ok(ServerMsg::MemberLost {
                            node: lost, uid, ..
                        }) => node.abort(format!(
                            "node {lost} (uid {uid}) left the job unexpectedly; ending the job"
                        )),
                        Ok(other) => warn!("ignoring coordinator notice {other:?}"),
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                            node.abort("lost the coordinator connection; ending the job".into());
                            return;
                        }
                    }
                }
            })
            .expect("spawning the coordinator watcher")
    };

    let outcome = run_pes(node, me == 0);
    watching.store(false, Ordering::SeqCst);
    let _ = watcher.join();
    match outcome {
        LoopExit::Exit(code) => {
            node.finished.store(true, Ordering::SeqCst);
            let code = match client.shutdown_barrier(topo.epoch(), code, SHUTDOWN_TIMEOUT) {
                Ok(job_code) => job_code,
                Err(e) => {
                    error!("shutdown barrier failed: {e}");
                    EXIT_ABORTED
                }
            };
            transport.shutdown();
            code
        }
        LoopExit::Aborted => EXIT_ABORTED,
    }
}

/// Runs one scheduler thread per local PE; the job's main chare starts on
/// global PE 0 when `main_here`.
fn run_pes(node: &Arc<NodeShared>, main_here: bool) -> LoopExit {
    let topo = node
        .topology(Duration::ZERO)
        .expect("topology installed before PEs start");
    let spin = Duration::from_micros(
        env_var("DUCTILE_SPIN_US")
            .and_then(|s| s.parse().ok())
            .unwrap_or(100),
    );
    let handles: Vec<_> = (0..topo.local_pes() as usize)
        .map(|rank| {
            let (node, topo) = (node.clone(), topo.clone());
            let pe_id = topo.local_pe(rank);
            std::thread::Builder::new()
                .name(format!("ductile-pe-{pe_id}"))
                .spawn(move || {
                    let mut pe = Pe::new(node.clone(), topo, pe_id);
                    if pe_id == 0 && main_here {
                        pe.start_main();
                    }
                    pe.run(&node.inboxes[rank], spin)
                })
                .expect("spawning a PE thread")
        })
        .collect();
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
    outcome
}
