//! Node 0's control service for rescales: checks a request against the
//! view, computes its plan (once: the plan travels with the request from
//! here), admits at most the newcomers that wait, puts it into the node's
//! operation slot, hands it to PE 0 and waits for the job to run at its
//! new size, watching every stage's bound (docs/elasticity.md, "Bounds").
//!
//! May touch: the node's view, operation slot and PE 0's inbox, the
//! coordinator client it is given, the metrics of rescales. Runs on a
//! control connection's thread and blocks it until the rescale ended.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;
use ductile_coordinator::client::Client;
use ductile_coordinator::control::{ControlReply, Peer, RescaleReport};
use ductile_coordinator::proto::View;
use tracing::warn;

use super::plan::{plan, Renumbering, RescaleError, RescaleRequest};
use super::{overdue, Desk, Overdue, RescaleFailed, Stage, StageBounds};
use crate::activity::{self as metrics, Outcome};
use crate::msg::{Dest, Envelope, Payload};
use crate::node::NodeShared;
use crate::operation::{Busy, Operation, Refusal};
use crate::system::{StopOrder, SysMsg};

/// How often node 0's watchdog looks at the rescale it serves.
const WATCH_TICK: Duration = Duration::from_millis(50);

/// Serves a rescale request on node 0's control endpoint: checks it, admits
/// at most the newcomers that wait, hands it to PE 0 and waits for the job
/// to run at its new size. One rescale at a time.
pub(crate) fn serve_request(
    node: &Arc<NodeShared>,
    coordinator: &Client,
    req: RescaleRequest,
    peer: &Peer<'_>,
) -> ControlReply {
    match serve(node, coordinator, req, peer) {
        Ok(report) => {
            metrics::rescale_committed(&report);
            ControlReply::Rescaled(report)
        }
        Err((outcome, reply)) => {
            metrics::rescale_ended(outcome);
            reply
        }
    }
}

fn serve(
    node: &Arc<NodeShared>,
    coordinator: &Client,
    req: RescaleRequest,
    peer: &Peer<'_>,
) -> Result<RescaleReport, (Outcome, ControlReply)> {
    let refuse = |message: String| Err((Outcome::Refused, ControlReply::Error { message }));
    let Some(view) = node.view() else {
        return refuse("the job has no view yet".into());
    };
    // The plan is computed here, once; below, under the desk's lock, only
    // the epoch it was computed against is checked again. Checked here
    // first so that a request that cannot run does not wait for the
    // coordinator.
    let plan = match check_admission(node, &view, &req) {
        Ok(plan) => plan,
        Err(reply) => return Err((Outcome::Refused, reply)),
    };
    let mut admit = req.admit;
    if admit > 0 {
        let waiting = match coordinator.query_view(Duration::from_secs(10)) {
            Ok((_, pending)) => pending.len() as u32,
            Err(e) => return refuse(format!("the coordinator did not answer: {e}")),
        };
        admit = admit.min(waiting);
        if admit == 0 && req.remove.is_empty() {
            return refuse(format!(
                "rescale refused: {} newcomer(s) asked for, none is waiting (start newcomers first, e.g. `ductile expand`)",
                req.admit
            ));
        }
    }
    let (tx, rx) = crossbeam_channel::bounded(1);
    let order = StopOrder {
        epoch: view.epoch,
        remove: req.remove,
        admit,
        plan,
    };
    // The view changes only by a rescale, which holds the slot: with the
    // slot free and the epoch checked under its lock, the ids of the
    // request name the nodes the tool meant until this rescale commits.
    let began = node
        .operation
        .try_begin(Operation::Rescale(Desk::new(order, &view, tx)), || {
            let now = node.view().map_or(view.epoch, |v| v.epoch);
            if now == view.epoch {
                Ok(())
            } else {
                Err(ControlReply::ViewChanged {
                    asked: view.epoch,
                    now,
                })
            }
        });
    match began {
        Ok(()) => {}
        Err(Refusal::Busy(busy)) => return Err((Outcome::Refused, busy_reply(busy))),
        Err(Refusal::Check(reply)) => return Err((Outcome::Refused, reply)),
    }
    // PE 0 is local rank 0 of node 0, where the control endpoint runs.
    node.inboxes[0].push(Envelope {
        prio: 0,
        dest: Dest::System,
        payload: Payload::local(SysMsg::RescaleBegin),
        counted: false,
    });
    let failed = |message: String| (Outcome::Failed, ControlReply::Error { message });
    let bounds = StageBounds::get();
    let mut abandoning = false;
    // The watchdog: every stage is bounded (docs/elasticity.md, "Bounds").
    loop {
        match rx.recv_timeout(WATCH_TICK) {
            Ok(Ok(report)) => return Ok(report),
            Ok(Err(e)) => return Err(failed(e.to_string())),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(failed("the rescale ended without an answer".into()))
            }
        }
        let Some((stage, elapsed)) = node.with_desk(|d| (d.stage, d.stage_since.elapsed())) else {
            continue;
        };
        let verdict = if stage == Stage::Evacuate && peer.gone() {
            // Nobody waits for it: it must not run later.
            Some(Overdue::Abandon(
                "the tool that asked for it went away".to_string(),
            ))
        } else {
            overdue(stage, elapsed, &bounds)
        };
        match verdict {
            Some(Overdue::Abandon(why)) if !abandoning => {
                abandoning = true;
                warn!("abandoning the rescale: {why}");
                node.with_desk(|d| d.abandon = Some(why));
                // PE 0 looks at the desk when it gets this again.
                node.inboxes[0].push(Envelope {
                    prio: 0,
                    dest: Dest::System,
                    payload: Payload::local(SysMsg::RescaleBegin),
                    counted: false,
                });
            }
            Some(Overdue::Fail(why)) => {
                let e = RescaleFailed::Overdue { why };
                node.abort(e.to_string());
                node.finish_rescale(Err(e.clone()));
                return Err(failed(e.to_string()));
            }
            _ => {}
        }
    }
}

/// Whether `req` may start now: nothing else in flight, computed against
/// `view`, and a request `plan` accepts. Its plan, or the refusal to reply.
fn check_admission(
    node: &NodeShared,
    view: &View,
    req: &RescaleRequest,
) -> Result<Renumbering, ControlReply> {
    if let Some(busy) = node.operation.busy() {
        return Err(busy_reply(busy));
    }
    match plan(view, req) {
        Ok(plan) => Ok(plan),
        Err(RescaleError::ViewChanged { asked, now }) => {
            Err(ControlReply::ViewChanged { asked, now })
        }
        Err(e) => Err(ControlReply::Error {
            message: format!("rescale refused: {e}"),
        }),
    }
}

/// The refusal of a request while another operation is in flight.
fn busy_reply(busy: Busy) -> ControlReply {
    let message = match busy {
        Busy::Rescale => {
            "another rescale is in progress; ask again once it ended (node ids will have changed)"
        }
        Busy::Checkpoint => "a checkpoint is in progress; ask again once it ended",
    };
    ControlReply::Busy {
        message: message.into(),
    }
}
