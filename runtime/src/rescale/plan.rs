//! Rescale planning: what a shrink/expand request means for PE numbering,
//! computed once per request, on node 0 when the control endpoint accepts
//! it, and carried from there (in the request's [`StopOrder`] to every PE
//! and node driver) rather than computed again.
//!
//! This is the pure core the rescale protocol (DESIGN.md, "Launch and
//! rescale", steps 1 and 3) stands on: which PEs the load balancer must
//! evacuate, and the compact renumbering every subsystem's rescale hook
//! applies. Survivors keep their relative order and are renumbered from 0;
//! admitted newcomers are appended after them (exactly as
//! `View::renumbered` orders the new view), so survivors' new numbers are
//! known before the coordinator says how many newcomers it admits.
//!
//! May touch: the view and the request. Nothing else (no node, no PE).
//!
//! [`StopOrder`]: crate::system::StopOrder

pub use ductile_coordinator::control::RescaleRequest;
use ductile_coordinator::proto::{NodeId, View};
use serde::{Deserialize, Serialize};

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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// What a recovery's order admits: every newcomer waiting at its commit
/// (node 0 asks the coordinator how many wait, as for a rescale, and
/// admits `min(this, waiting)`). A replacement that registered before the
/// loss joins in the recovery's commit instead of waiting for a rescale.
pub(crate) const EVERY_WAITING_NEWCOMER: u32 = u32::MAX;

/// The plan of a recovery from the loss of node `lost` of `topo`'s view:
/// the same renumbering as a request removing it (newcomers are numbered
/// after the survivors whatever their count), computed by every survivor
/// from its own topology.
pub(crate) fn recovery_plan(
    topo: &crate::topo::Topology,
    lost: NodeId,
) -> Result<Renumbering, RescaleError> {
    let view = View {
        epoch: topo.epoch(),
        members: (0..topo.num_nodes())
            .map(|n| ductile_coordinator::proto::Member {
                node: n,
                uid: topo.uid_of(n),
                address: Vec::new(),
                pes: topo.pes_on(n),
                host: String::new(),
                pid: 0,
            })
            .collect(),
    };
    let req = RescaleRequest {
        epoch: topo.epoch(),
        remove: vec![lost],
        admit: 0,
    };
    plan(&view, &req)
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
