//! A node's side of its coordinator connection while the job runs: the
//! watcher thread that forwards the coordinator's notices to the node's
//! main thread, rejoining a restarted coordinator within the bound
//! (`DUCTILE_COORDINATOR_RECONNECT`), and the shutdown barrier.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ductile_coordinator::client::ClientError;
use ductile_coordinator::proto::{ClientMsg, HEARTBEAT_EVERY, Registration, ServerMsg, View};
use tracing::{error, warn};

use super::EXIT_ABORTED;
use super::shared::NodeShared;
use crate::link::{CoordinatorLink, RejoinError, Rejoined, rejoin_as};
use crate::rescale::NodeEvent;
use crate::transport::tcp::TcpTransport;

const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(60);

/// What a node needs to rejoin its coordinator after the connection
/// dropped (see [`crate::link`]).
pub(super) struct Rejoiner {
    pub(super) link: Arc<CoordinatorLink>,
    pub(super) node: Arc<NodeShared>,
    /// This node's registration: a newcomer not admitted yet sends it again.
    pub(super) registration: Registration,
    /// How long to keep trying (`DUCTILE_COORDINATOR_RECONNECT`); zero: not at all.
    pub(super) bound: Duration,
    /// The TCP transport announces this node's uid when it dials.
    pub(super) tcp: Option<Arc<TcpTransport>>,
}

impl Rejoiner {
    pub(super) fn set_uid(&self, uid: u64) {
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
    ) -> Result<Rejoined, RejoinError> {
        let addr = self.link.addr();
        if self.bound.is_zero() {
            return Err(RejoinError::Disabled);
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
/// departed node's connection). Sends a heartbeat every
/// [`HEARTBEAT_EVERY`]: a node that stops sending (hung, frozen, cut off)
/// is declared lost by the coordinator.
pub(super) fn watch_coordinator(
    rejoiner: Arc<Rejoiner>,
    watching: Arc<AtomicBool>,
    mut admitted: Option<View>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("ductile-coord".into())
        .spawn(move || {
            let node = rejoiner.node.clone();
            let needed = || watching.load(Ordering::SeqCst) && !node.aborting();
            let mut beat = Instant::now();
            while watching.load(Ordering::SeqCst) {
                let client = rejoiner.link.current();
                if beat.elapsed() >= HEARTBEAT_EVERY {
                    // A failed send shows as the connection's end below.
                    let _ = client.send(&ClientMsg::Heartbeat);
                    beat = Instant::now();
                }
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
pub(super) fn shutdown_barrier(rejoiner: &Rejoiner, code: i32) -> i32 {
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
                        error!(
                            "shutdown barrier failed: lost the coordinator and could not rejoin it: {e}"
                        );
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
