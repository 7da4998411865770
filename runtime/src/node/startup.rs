//! How a node process starts: [`launch`] reads the environment contract and
//! the registry, then runs the program alone (no coordinator) or as a member
//! of its job: it chooses the transport, registers with the coordinator, is
//! admitted (at launch, or later as a newcomer), starts its PEs and runs the
//! node's main thread (`rescale::Shell`) until the job ends for it.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ductile_coordinator::client::{Admission, Client};
use ductile_coordinator::contract;
use ductile_coordinator::proto::{NodeId, Registration, Role};
use tracing::{debug, error, info, warn};

use super::coordinator::{shutdown_barrier, watch_coordinator, Rejoiner};
use super::pes::start_pes;
use super::shared::{NodeShared, NodeSink};
use super::{env_var, EXIT_ABORTED, EXIT_PANIC, EXIT_STARTUP};
use crate::link::CoordinatorLink;
use crate::pe::LoopExit;
use crate::registry::Registry;
use crate::rescale::{NodeEvent, Shell};
use crate::topo::Topology;
use crate::transport::tcp::TcpTransport;
use crate::transport::Transport;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(120);

pub(super) fn fail_startup(msg: impl std::fmt::Display) -> ! {
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
    if options.ft_every > 0 {
        // Buddy checkpoints reuse memory instead of faulting it in anew.
        match crate::malloc::decide(env_var) {
            crate::malloc::Decision::Keep if crate::malloc::keep_freed_memory() => {
                debug!("+ft-every: glibc keeps freed memory for the next checkpoint")
            }
            crate::malloc::Decision::Keep => {
                warn!("+ft-every: glibc refused the settings that keep freed memory; checkpoints will fault their memory in")
            }
            crate::malloc::Decision::UserSet(var) => {
                debug!("+ft-every: {var} is set, glibc's malloc is left as configured")
            }
        }
    }
    let options_coordinator = options.coordinator.clone();
    let (events, events_rx) = crossbeam_channel::unbounded();
    let node = Arc::new(
        NodeShared::new(registry.clone(), pes, args, options, events).unwrap_or_else(|e| {
            fail_startup(format!("cannot create the eventfds that wake the PEs: {e}"))
        }),
    );
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
    // DUCTILE_TRANSPORT: tcp (the default, whatever the build, as for
    // `ductile run` and the operator: a node started by hand joins a TCP
    // job), or ucx when built with the `ucx` feature; UCX itself reads
    // UCX_TLS, UCX_NET_DEVICES, ... from the environment the node inherits.
    let available: &[&str] = if cfg!(feature = "ucx") {
        &["tcp", "ucx"]
    } else {
        &["tcp"]
    };
    let chosen = env_var(contract::ENV_TRANSPORT).unwrap_or_else(|| "tcp".to_owned());
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
