//! Rescale planning: what a shrink/expand request means for PE numbering,
//! computed identically on every node from the current view and the request.
//!
//! This is the pure core the rescale protocol (DESIGN.md, "Launch and
//! rescale", steps 1 and 3) stands on: which PEs the load balancer must
//! evacuate, and the compact renumbering every subsystem's rescale hook
//! applies. Survivors keep their relative order and are renumbered from 0;
//! admitted newcomers are appended after them (exactly as
//! `View::renumbered` orders the new view), so survivors' new numbers are
//! known before the coordinator says how many newcomers it admits.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;
use ductile_coordinator::client::Client;
pub use ductile_coordinator::control::RescaleRequest;
use ductile_coordinator::control::{ControlReply, Peer, RescaleReport};
use ductile_coordinator::proto::{NodeId, View};
use tracing::warn;

use crate::metrics::{self, Outcome};
use crate::msg::{Dest, Envelope, Payload};
use crate::node::NodeShared;
use crate::rescale::{overdue, Desk, Overdue, Stage, StageBounds};
use crate::system::{StopOrder, SysMsg};

use crate::topo::Pe;

/// Why a request cannot be carried out; nothing changes when one is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RescaleError {
    /// The request was computed against another view: node ids are
    /// renumbered by every commit, so its ids may name other nodes now.
    #[error("{}", ductile_coordinator::control::view_changed_message(*asked, *now))]
    ViewChanged {
        /// The epoch the request named.
        asked: u64,
        /// The view's epoch.
        now: u64,
    },
    /// Node 0 hosts PE 0, which drives every rescale: it never leaves.
    #[error("node 0 cannot be removed: it hosts PE 0, which drives every rescale")]
    RemovesNodeZero,
    /// A node id that is not in the current view.
    #[error("node {node} is not in the current view (epoch {epoch}, {nodes} nodes)")]
    UnknownNode {
        /// The id asked for.
        node: NodeId,
        /// The view's epoch.
        epoch: u64,
        /// Its node count.
        nodes: usize,
    },
    /// The same node named twice.
    #[error("node {0} is named twice")]
    Duplicate(NodeId),
    /// Nothing would change.
    #[error("the request removes no node and admits no newcomer")]
    Empty,
}

/// What a request does to PE numbering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Renumbering {
    /// For each current node, its id after the rescale (None: it leaves).
    pub node_map: Vec<Option<NodeId>>,
    /// For each current global PE, its number after the rescale (None: it leaves).
    pub pe_map: Vec<Option<Pe>>,
    /// The PEs the load balancer must evacuate, ascending.
    pub leaving_pes: Vec<Pe>,
    /// PEs that survive (newcomers' PEs are numbered from here on).
    pub surviving_pes: u32,
}

/// Checks `req` against `view` and computes the renumbering it implies.
pub fn plan(view: &View, req: &RescaleRequest) -> Result<Renumbering, RescaleError> {
    if req.epoch != view.epoch {
        return Err(RescaleError::ViewChanged {
            asked: req.epoch,
            now: view.epoch,
        });
    }
    let n = view.members.len();
    let mut leaving = vec![false; n];
    for &node in &req.remove {
        if node as usize >= n {
            return Err(RescaleError::UnknownNode {
                node,
                epoch: view.epoch,
                nodes: n,
            });
        }
        if node == 0 {
            return Err(RescaleError::RemovesNodeZero);
        }
        if std::mem::replace(&mut leaving[node as usize], true) {
            return Err(RescaleError::Duplicate(node));
        }
    }
    if req.remove.is_empty() && req.admit == 0 {
        return Err(RescaleError::Empty);
    }
    let mut node_map = Vec::with_capacity(n);
    let mut pe_map = Vec::with_capacity(view.total_pes() as usize);
    let mut leaving_pes = Vec::new();
    let (mut next_node, mut next_pe, mut old_pe) = (0 as NodeId, 0 as Pe, 0 as Pe);
    for (i, m) in view.members.iter().enumerate() {
        if leaving[i] {
            node_map.push(None);
            for _ in 0..m.pes {
                pe_map.push(None);
                leaving_pes.push(old_pe);
                old_pe += 1;
            }
        } else {
            node_map.push(Some(next_node));
            next_node += 1;
            for _ in 0..m.pes {
                pe_map.push(Some(next_pe));
                next_pe += 1;
                old_pe += 1;
            }
        }
    }
    Ok(Renumbering {
        node_map,
        pe_map,
        leaving_pes,
        surviving_pes: next_pe,
    })
}

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
    // Checked again below under the desk's lock; checked here first so that
    // a request that cannot run does not wait for the coordinator.
    if let Err(reply) = check_admission(node, &view, &req) {
        return Err((Outcome::Refused, reply));
    }
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
    {
        let mut desk = node.desk.lock().expect("rescale desk poisoned");
        // The view changes only by a rescale, which holds the desk: with the
        // desk empty and the epoch checked under its lock, the ids of the
        // request name the nodes the tool meant until this rescale commits.
        let view = node.view().unwrap_or(view);
        if let Err(reply) = check_admission_locked(node, desk.is_some(), &view, &req) {
            return Err((Outcome::Refused, reply));
        }
        let order = StopOrder {
            epoch: view.epoch,
            remove: req.remove,
            admit,
        };
        *desk = Some(Desk::new(order, &view, tx));
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
            Ok(Err(e)) => return Err(failed(e)),
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
                let message = format!("the rescale failed after the commit: {why}; ending the job");
                node.abort(message.clone());
                node.finish_rescale(Err(message.clone()));
                return Err(failed(message));
            }
            _ => {}
        }
    }
}

/// Whether `req` may start now: nothing else in flight, computed against
/// `view`, and a request `plan` accepts. The refusal is the reply.
fn check_admission(
    node: &NodeShared,
    view: &View,
    req: &RescaleRequest,
) -> Result<(), ControlReply> {
    let busy = node.desk.lock().expect("rescale desk poisoned").is_some();
    check_admission_locked(node, busy, view, req)
}

fn check_admission_locked(
    node: &NodeShared,
    rescaling: bool,
    view: &View,
    req: &RescaleRequest,
) -> Result<(), ControlReply> {
    if rescaling {
        return Err(ControlReply::Busy {
            message: "another rescale is in progress; ask again once it ended (node ids will have changed)".into(),
        });
    }
    if node
        .checkpoint
        .lock()
        .expect("checkpoint desk poisoned")
        .is_some()
    {
        return Err(ControlReply::Busy {
            message: "a checkpoint is in progress; ask again once it ended".into(),
        });
    }
    match plan(view, req) {
        Ok(_) => Ok(()),
        Err(RescaleError::ViewChanged { asked, now }) => {
            Err(ControlReply::ViewChanged { asked, now })
        }
        Err(e) => Err(ControlReply::Error {
            message: format!("rescale refused: {e}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::Topology;
    use ductile_coordinator::proto::Member;
    use proptest::prelude::*;

    fn view(pes: &[u32]) -> View {
        let members = pes
            .iter()
            .enumerate()
            .map(|(i, &p)| Member {
                node: i as u32,
                uid: 10 + i as u64,
                address: vec![],
                pes: p,
                host: "h".into(),
                pid: 0,
            })
            .collect();
        View { epoch: 4, members }
    }

    #[test]
    fn bad_requests_are_refused_with_a_reason() {
        let v = view(&[2, 1, 3]);
        let req = |remove: Vec<u32>, admit| RescaleRequest {
            epoch: 4,
            remove,
            admit,
        };
        assert_eq!(
            plan(&v, &req(vec![0], 0)),
            Err(RescaleError::RemovesNodeZero)
        );
        assert_eq!(
            plan(&v, &req(vec![3], 0)),
            Err(RescaleError::UnknownNode {
                node: 3,
                epoch: 4,
                nodes: 3
            })
        );
        assert_eq!(
            plan(&v, &req(vec![1, 1], 0)),
            Err(RescaleError::Duplicate(1))
        );
        assert_eq!(plan(&v, &req(vec![], 0)), Err(RescaleError::Empty));
        assert!(
            plan(&v, &req(vec![], 2)).is_ok(),
            "a pure expansion is a request"
        );
        let stale = RescaleRequest {
            epoch: 3,
            remove: vec![1],
            admit: 0,
        };
        let e = plan(&v, &stale).unwrap_err();
        assert_eq!(e, RescaleError::ViewChanged { asked: 3, now: 4 });
        assert!(
            e.to_string()
                .contains("the view changed: epoch 3, now 4; node ids are renumbered"),
            "{e}"
        );
    }

    #[test]
    fn removing_the_middle_node_shifts_the_last_down() {
        let r = plan(
            &view(&[2, 1, 3]),
            &RescaleRequest {
                epoch: 4,
                remove: vec![1],
                admit: 0,
            },
        )
        .unwrap();
        assert_eq!(r.node_map, vec![Some(0), None, Some(1)]);
        assert_eq!(
            r.pe_map,
            vec![Some(0), Some(1), None, Some(2), Some(3), Some(4)]
        );
        assert_eq!(r.leaving_pes, vec![2]);
        assert_eq!(r.surviving_pes, 5);
    }

    #[test]
    fn the_bitmap_form_names_the_nodes_to_remove() {
        assert_eq!(
            RescaleRequest::from_keep_bitmap(4, &[true, false, true, false], 1),
            RescaleRequest {
                epoch: 4,
                remove: vec![1, 3],
                admit: 1
            }
        );
    }

    proptest! {
        /// The renumbering is compact, keeps survivors' order, drops exactly
        /// the removed nodes' PEs, and agrees with the view the coordinator
        /// will commit (`View::renumbered`), whatever newcomers it admits.
        #[test]
        fn renumbering_matches_the_committed_view(
            pes in proptest::collection::vec(1u32..4, 1..12),
            picks in proptest::collection::vec(any::<bool>(), 12),
            newcomers in proptest::collection::vec(1u32..4, 0..3),
        ) {
            let v = view(&pes);
            let remove: Vec<u32> = (1..pes.len() as u32).filter(|&i| picks[i as usize]).collect();
            let req = RescaleRequest { epoch: v.epoch, remove: remove.clone(), admit: newcomers.len() as u32 };
            prop_assume!(!(remove.is_empty() && newcomers.is_empty()));
            let r = plan(&v, &req).unwrap();
            let admitted: Vec<Member> = newcomers.iter().enumerate()
                .map(|(i, &p)| Member { node: 0, uid: 100 + i as u64, address: vec![], pes: p, host: "n".into(), pid: 0 })
                .collect();
            let next = v.renumbered(&remove, &admitted).unwrap();
            let old = Topology::new(&v, 0);
            let new = Topology::new(&next, 0);
            let mut last = None;
            for pe in 0..old.num_pes() {
                let node = old.node_of(pe);
                match r.pe_map[pe as usize] {
                    None => {
                        prop_assert!(remove.contains(&node));
                        prop_assert!(r.leaving_pes.contains(&pe));
                    }
                    Some(np) => {
                        prop_assert!(last.is_none_or(|l| np == l + 1), "compact and ordered");
                        last = Some(np);
                        let nn = r.node_map[node as usize].unwrap();
                        prop_assert_eq!(next.members[nn as usize].uid, v.members[node as usize].uid);
                        prop_assert_eq!(new.node_of(np), nn);
                        prop_assert_eq!(new.rank_of(np), old.rank_of(pe));
                    }
                }
            }
            prop_assert_eq!(r.surviving_pes + newcomers.iter().sum::<u32>(), new.num_pes());
        }
    }
}
