//! Node 0's control endpoint (the role of Charm++'s CCS): tools ask a running
//! job for its status and ask it to rescale (see [`crate::elastic`]). The
//! protocol lives in `ductile_coordinator::control`, so fleets need no
//! runtime dependency.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ductile_coordinator::control::{serve_watched, ControlReply, ControlRequest, JobStatus};
use ductile_coordinator::secret::Secret;
use tracing::{debug, warn};

use crate::link::CoordinatorLink;
use crate::node::NodeShared;

/// How long the control endpoint waits to reach the coordinator.
const COORDINATOR_WAIT: Duration = Duration::from_secs(10);

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
            for conn in listener.incoming() {
                let Ok(stream) = conn else { continue };
                let (secret, node, coordinator) =
                    (secret.clone(), node.clone(), coordinator.clone());
                let _ = std::thread::Builder::new()
                    .name("ductile-control-conn".into())
                    .spawn(move || {
                        let peer = stream
                            .peer_addr()
                            .map(|a| a.to_string())
                            .unwrap_or_default();
                        let result = serve_watched(stream, &secret, |req, peer| match req {
                            ControlRequest::Status => status(&node, &coordinator, started),
                            ControlRequest::Rescale(req) => {
                                match coordinator.live(COORDINATOR_WAIT) {
                                    Ok(client) => crate::elastic::serve_request(
                                        &node,
                                        &client,
                                        req.clone(),
                                        peer,
                                    ),
                                    Err(e) => unreachable_coordinator(&coordinator, e),
                                }
                            }
                            ControlRequest::Checkpoint(req) => {
                                crate::checkpoint::serve_request(&node, req.clone())
                            }
                            ControlRequest::Hello { .. } => ControlReply::Error {
                                message: "already authenticated".into(),
                            },
                        });
                        match result {
                            Ok(()) => debug!(peer, "control connection closed"),
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
