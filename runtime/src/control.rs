//! Node 0's control endpoint (the role of Charm++'s CCS): tools ask a running
//! job for its status and ask it to rescale (see [`crate::rescale::service`]). The
//! protocol lives in `ductile_coordinator::control`, so fleets need no
//! runtime dependency.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ductile_coordinator::control::{
    serve_watched, ControlError, ControlReply, ControlRequest, JobStatus,
};
use ductile_coordinator::secret::Secret;
use tracing::{debug, warn};

use crate::link::CoordinatorLink;
use crate::node::NodeShared;

/// How long the control endpoint waits to reach the coordinator.
const COORDINATOR_WAIT: Duration = Duration::from_secs(10);

/// Connections served at once, authenticated or not.
const MAX_CONNECTIONS: usize = 64;

/// Connections that have not proved the job secret yet (each for at most
/// `AUTH_DEADLINE`): a flood of strangers is served from this budget and
/// cannot take the slots of tools that authenticated.
const MAX_UNAUTHENTICATED: usize = 8;

/// A slot in one of the endpoint's budgets, given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(count.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts the control endpoint on `listen`; writes the bound address to
/// `addr_file` (atomically) when given. Returns the bound address.
pub(crate) fn start(
    listen: SocketAddr,
    addr_file: Option<PathBuf>,
    secret: Secret,
    node: Arc<NodeShared>,
    coordinator: &str,
) -> std::io::Result<SocketAddr> {
    // Its own coordinator connection: replies must not mix with the node's.
    // It is dialled again when it ended (the coordinator restarted).
    let coordinator = Arc::new(
        CoordinatorLink::connect(coordinator, secret.clone(), COORDINATOR_WAIT)
            .map_err(|e| std::io::Error::other(format!("connecting to the coordinator: {e}")))?,
    );
    let listener = TcpListener::bind(listen)?;
    let bound = listener.local_addr()?;
    if let Some(path) = addr_file {
        crate::files::write_atomically(&path, bound.to_string())?;
    }
    let started = Instant::now();
    std::thread::Builder::new()
        .name("ductile-control".into())
        .spawn(move || {
            let (open, strangers) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            let mut turned_away = 0u64;
            for conn in listener.incoming() {
                let Ok(stream) = conn else { continue };
                // Over a budget the connection is closed at once: no thread,
                // no buffer for it.
                let slots = Slot::take(&open, MAX_CONNECTIONS)
                    .and_then(|all| Slot::take(&strangers, MAX_UNAUTHENTICATED).map(|s| (all, s)));
                let Some((slot, stranger)) = slots else {
                    turned_away += 1;
                    if turned_away.is_power_of_two() {
                        warn!(
                            turned_away,
                            "control endpoint full: closing new connections"
                        );
                    }
                    continue;
                };
                let (secret, node, coordinator) =
                    (secret.clone(), node.clone(), coordinator.clone());
                let _ = std::thread::Builder::new()
                    .name("ductile-control-conn".into())
                    .stack_size(256 * 1024)
                    .spawn(move || {
                        let _slot = slot;
                        let peer = stream
                            .peer_addr()
                            .map(|a| a.to_string())
                            .unwrap_or_default();
                        let welcomed = move || drop(stranger);
                        let result =
                            serve_watched(stream, &secret, welcomed, |req, peer| match req {
                                ControlRequest::Status => status(&node, &coordinator, started),
                                ControlRequest::Rescale(req) => {
                                    match coordinator.live(COORDINATOR_WAIT) {
                                        Ok(client) => crate::rescale::service::serve_request(
                                            &node,
                                            &client,
                                            req.clone(),
                                            peer,
                                        ),
                                        Err(e) => unreachable_coordinator(&coordinator, e),
                                    }
                                }
                                ControlRequest::Checkpoint(req) => {
                                    crate::checkpoint::service::serve_request(&node, req.clone())
                                }
                                ControlRequest::Hello { .. } => ControlReply::Error {
                                    message: "already authenticated".into(),
                                },
                            });
                        match result {
                            Ok(()) => debug!(peer, "control connection closed"),
                            Err(e @ ControlError::Idle(_)) => debug!(peer, "{e}"),
                            Err(e) => warn!(peer, "control connection refused or broken: {e}"),
                        }
                    });
            }
        })?;
    Ok(bound)
}

fn unreachable_coordinator(link: &CoordinatorLink, e: impl std::fmt::Display) -> ControlReply {
    ControlReply::Error {
        message: format!("the coordinator at {} cannot be reached: {e}", link.addr()),
    }
}

fn status(node: &NodeShared, coordinator: &CoordinatorLink, started: Instant) -> ControlReply {
    let Some(view) = node.view() else {
        return ControlReply::Error {
            message: "the job has no view yet".into(),
        };
    };
    let client = match coordinator.live(COORDINATOR_WAIT) {
        Ok(client) => client,
        Err(e) => return unreachable_coordinator(coordinator, e),
    };
    let pending = match client.query_view(Duration::from_secs(5)) {
        Ok((_, pending)) => pending,
        Err(e) => {
            return ControlReply::Error {
                message: format!("the coordinator did not answer: {e}"),
            }
        }
    };
    ControlReply::Status(JobStatus {
        epoch: view.epoch,
        pes: view.total_pes(),
        members: view.members,
        pending,
        uptime_ms: started.elapsed().as_millis() as u64,
    })
}
