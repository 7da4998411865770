//! The drain's node tree: the tree the drain's counts travel up and its
//! totals down. Survivors form the node tree of the old view among
//! themselves (node 0 at the root, the topology's arity, old order);
//! leaving nodes hang below them as leaves, dealt round-robin.
//!
//! Why leaves: a leaving node may be killed once the root committed (it
//! is then no member, and nobody is told it was lost). Were it an inner
//! vertex, its subtree would never get the totals and a node the job no
//! longer waits for (a leaving child) or one it does (a survivor) would
//! fail at its deadline while the job goes on. As a leaf, nothing waits
//! on it after it sent its counts up. When nobody leaves (an expansion),
//! the drain tree is the view's node tree.
//!
//! Also the driver's drain stage (steps 1 and 2 of `driver.rs`): the
//! rescale's beginning, both drain rounds and the hand-over between them.
//!
//! May touch: the driver's state. No I/O.

use std::collections::BTreeMap;
use std::time::Instant;

use ductile_coordinator::proto::NodeId;
use tracing::debug;

use super::{
    Action, Cause, ControlFrame, DrainMode, DrainWait, Driver, Event, Rescale, Stage, State, Step,
};
use crate::rescale::plan::{recovery_plan, EVERY_WAITING_NEWCOMER};
use crate::system::StopOrder;
use crate::topo::TREE_ARITY;

/// The drain round of a recovery. A rescale drains in rounds 1 and 2; a
/// recovery that abandons one may begin while a node's counts of those
/// rounds are still on their way, and they must not count for it.
pub(super) const RECOVERY_ROUND: u8 = 3;

impl Driver {
    /// Member `lost` (not node 0) was lost without notice and recovery is
    /// on: every survivor plans the same removal itself, has its PEs stop
    /// and roll back ([`Action::Recover`]), and drains among survivors.
    /// The commit admits every newcomer waiting then.
    ///
    /// The PEs may have stopped already, for a rescale that has no new
    /// view yet: the rescale is abandoned (PE 0 answers its request so)
    /// and the recovery drains at once. Node 0 tells every other node
    /// ([`ControlFrame::Recover`]): it alone knows whether a commit was
    /// asked for, so the others wait for its word (or the view) when a
    /// loss reaches them during a rescale.
    pub(super) fn recover(&mut self, lost: NodeId, now: Instant, out: &mut Vec<Action>) {
        let Some(topo) = self.topo.clone() else {
            return;
        };
        let plan = match recovery_plan(&topo, lost) {
            Ok(plan) => plan,
            Err(e) => {
                let uid = topo.uid_of(lost);
                debug!(lost, uid, "no recovery: {e}");
                if self.busy() {
                    self.fail_busy(Cause::MemberLost { node: lost, uid }, out);
                } else {
                    out.push(Action::PeerLost { node: lost, uid });
                }
                return;
            }
        };
        let abandoned = self.busy();
        debug!(lost, abandoned, "a member was lost; recovering without it");
        self.loss = None;
        let order = StopOrder {
            epoch: topo.epoch(),
            remove: vec![lost],
            admit: EVERY_WAITING_NEWCOMER,
            plan,
        };
        if topo.my_node() == 0 {
            for n in (1..topo.num_nodes()).filter(|&n| n != lost) {
                out.push(Action::Send {
                    to: n,
                    epoch: topo.epoch(),
                    frame: ControlFrame::Recover { lost },
                });
            }
        }
        out.push(Action::Recover {
            order: order.clone(),
        });
        if abandoned {
            // Every local PE stopped for the rescale and waits for its
            // driver: the recovery's drain begins now. What is kept of
            // the rescale's drain rounds counts for nothing.
            self.early.retain(|e| {
                !matches!(e, Event::Frame { frame: ControlFrame::Drain { round, .. }
                    | ControlFrame::DrainUp { round, .. }
                    | ControlFrame::DrainDown { round, .. }, .. } if *round < RECOVERY_ROUND)
            });
            let mut gone = vec![false; order.plan.node_map.len()];
            gone[lost as usize] = true;
            self.begin(order, gone, now, out);
            return;
        }
        let stopped = match self.state {
            State::Running { stopped } => stopped,
            _ => 0,
        };
        self.wait(now, Step::Recover, self.cfg.step);
        self.set(State::Recovering {
            order,
            lost,
            stopped,
        });
    }

    /// Conditions that may hold without an event: the drain's frames in.
    pub(super) fn poll(&mut self, now: Instant, out: &mut Vec<Action>) {
        let done = match &self.state {
            State::Drain {
                r,
                wait: DrainWait::Frames { expect },
                ..
            } => {
                let me = r.old.my_node();
                let got: u64 = (0..r.old.num_nodes())
                    .filter(|&p| p != me && !r.is_lost(p))
                    .map(|p| self.counts.received_from(p))
                    .sum();
                got >= *expect
            }
            State::Drain {
                r,
                wait: DrainWait::Peers { expected },
                ..
            } => {
                let lost = r.lost.iter().filter(|&&l| l).count();
                expected.len() + 1 + lost == r.old.num_nodes() as usize
                    && expected
                        .iter()
                        .all(|(&src, &n)| self.counts.received_from(src) >= n)
            }
            _ => false,
        };
        if done {
            let State::Drain { r, round, .. } = std::mem::replace(&mut self.state, State::Moving)
            else {
                unreachable!("matched above")
            };
            self.drained(r, round, now, out);
        }
    }

    /// All local PEs stopped for `order`: the rescale (a recovery when
    /// some node is `lost`) begins here.
    pub(super) fn begin(
        &mut self,
        order: StopOrder,
        lost: Vec<bool>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let Some(old) = self.topo.clone() else {
            self.state = State::Admission;
            return;
        };
        let me = old.my_node();
        if order.plan.node_map.len() != old.num_nodes() as usize || order.epoch != old.epoch() {
            let cause = Cause::Plan {
                epoch: order.epoch,
                planned: order.plan.node_map.len(),
                nodes: old.num_nodes(),
            };
            self.fail(Step::DrainCounts { round: 1, node: me }, cause, out);
            return;
        }
        let leaving = order.plan.node_map[me as usize].is_none();
        debug!(node = me, leaving, "all PEs stopped; draining");
        out.push(Action::Draining(true));
        let gone: Vec<bool> = order
            .plan
            .node_map
            .iter()
            .enumerate()
            .map(|(n, m)| m.is_none() && !lost.get(n).copied().unwrap_or(false))
            .collect();
        let tree = DrainTree::among(me, &gone, &lost);
        let recovering = lost.iter().any(|&l| l);
        let r = Box::new(Rescale {
            order,
            old,
            leaving,
            tree,
            lost,
        });
        let round = if recovering { RECOVERY_ROUND } else { 1 };
        self.drain(r, round, now, out);
    }

    /// Starts drain round `round`.
    pub(super) fn drain(
        &mut self,
        r: Box<Rescale>,
        round: u8,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let (me, epoch, n) = (r.old.my_node(), r.old.epoch(), r.old.num_nodes());
        match self.cfg.drain {
            DrainMode::AllToAll => {
                for p in (0..n).filter(|&p| p != me && !r.is_lost(p)) {
                    out.push(Action::Send {
                        to: p,
                        epoch,
                        frame: ControlFrame::Drain {
                            round,
                            sent: self.counts.sent_to(p),
                        },
                    });
                }
                self.wait(now, Step::DrainPeers { round }, self.cfg.step);
                let wait = DrainWait::Peers {
                    expected: BTreeMap::new(),
                };
                self.set(State::Drain { r, round, wait });
            }
            DrainMode::Tree => {
                let sum: Vec<u64> = (0..n)
                    .map(|p| if p == me { 0 } else { self.counts.sent_to(p) })
                    .collect();
                if r.tree.children.is_empty() {
                    self.drain_up(r, round, sum, now, out);
                } else {
                    self.wait(now, Step::DrainCounts { round, node: me }, self.cfg.step);
                    let wait = DrainWait::Children { heard: 0, sum };
                    self.set(State::Drain { r, round, wait });
                }
            }
        }
    }

    /// Tree drain: the subtree's counts are in; up to the parent, or (the
    /// root) they are the totals.
    pub(super) fn drain_up(
        &mut self,
        r: Box<Rescale>,
        round: u8,
        sum: Vec<u64>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        match r.tree.parent {
            Some(parent) => {
                out.push(Action::Send {
                    to: parent,
                    epoch: r.old.epoch(),
                    frame: ControlFrame::DrainUp { round, sent: sum },
                });
                self.wait(now, Step::DrainTotals { round, parent }, self.cfg.step);
                let wait = DrainWait::Totals;
                self.set(State::Drain { r, round, wait });
            }
            None => self.drain_down(r, round, sum, now, out),
        }
    }

    /// Tree drain: the totals are known; down to the children, then wait
    /// for this node's own.
    pub(super) fn drain_down(
        &mut self,
        r: Box<Rescale>,
        round: u8,
        totals: Vec<u64>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let (me, n) = (r.old.my_node(), r.old.num_nodes());
        if totals.len() != n as usize {
            let step = match r.tree.parent {
                Some(parent) => Step::DrainTotals { round, parent },
                None => Step::DrainCounts { round, node: me },
            };
            let cause = Cause::Counts {
                src: r.tree.parent.unwrap_or(me),
                counts: totals.len(),
                nodes: n,
            };
            self.fail(step, cause, out);
            return;
        }
        let expect = totals[me as usize];
        for c in r.tree.children.clone() {
            out.push(Action::Send {
                to: c,
                epoch: r.old.epoch(),
                frame: ControlFrame::DrainDown {
                    round,
                    totals: totals.clone(),
                },
            });
        }
        self.wait(now, Step::DrainFrames { round, expect }, self.cfg.step);
        let wait = DrainWait::Frames { expect };
        self.set(State::Drain { r, round, wait });
    }

    /// Drain round `round` is over.
    pub(super) fn drained(
        &mut self,
        r: Box<Rescale>,
        round: u8,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let recovering = r.lost.iter().any(|&l| l);
        if round == 1 && !recovering {
            out.push(Action::HandOver { leaving: r.leaving });
            self.wait(now, Step::HandOver, self.cfg.step);
            self.set(State::HandOver { r, handed: 0 });
            return;
        }
        out.push(Action::Draining(false));
        // A recovery rolls back: the failed epoch's envelopes go, unread.
        out.push(if recovering {
            Action::Discard
        } else {
            Action::TakeLate
        });
        let me = r.old.my_node();
        if me == 0 {
            out.push(Action::StageEnded(Stage::Stop));
        }
        if r.leaving {
            self.wait(now, Step::Die, self.cfg.step);
            self.set(State::Die { r });
        } else if me == 0 {
            self.query(r, 1, now, out);
        } else {
            self.wait(now, Step::NewView, self.cfg.step);
            self.set(State::NewView { r });
        }
    }
}

/// Adds a subtree's per-node counts (from node `src`) into `sum`.
pub(crate) fn add_counts(sum: &mut [u64], counts: &[u64], src: NodeId) -> Result<(), Cause> {
    if counts.len() != sum.len() {
        return Err(Cause::Counts {
            src,
            counts: counts.len(),
            nodes: sum.len() as u32,
        });
    }
    for (s, c) in sum.iter_mut().zip(counts) {
        *s = s.checked_add(*c).ok_or(Cause::Overflow { src })?;
    }
    Ok(())
}

/// One node's place in the drain tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DrainTree {
    /// Where this node's subtree counts go (None: the root, node 0).
    pub parent: Option<NodeId>,
    /// Whose subtree counts it sums, and to whom the totals go down.
    pub children: Vec<NodeId>,
}

impl DrainTree {
    /// `me`'s place in the drain tree of a view whose node `n` leaves when
    /// `leaving[n]` (node 0 never leaves).
    #[cfg(test)]
    pub(crate) fn of(me: NodeId, leaving: &[bool]) -> DrainTree {
        DrainTree::among(me, leaving, &[])
    }

    /// As [`DrainTree::of`], with the nodes `lost[n]` left out of the tree
    /// (a recovery: they are gone).
    pub(crate) fn among(me: NodeId, leaving: &[bool], lost: &[bool]) -> DrainTree {
        let gone = |n: NodeId| lost.get(n as usize).copied().unwrap_or(false);
        let survivors: Vec<NodeId> = (0..leaving.len() as NodeId)
            .filter(|&n| !leaving[n as usize] && !gone(n))
            .collect();
        let departing: Vec<NodeId> = (0..leaving.len() as NodeId)
            .filter(|&n| leaving[n as usize])
            .collect();
        let a = TREE_ARITY as usize;
        let s = survivors.len().max(1);
        if let Some(j) = departing.iter().position(|&n| n == me) {
            return DrainTree {
                parent: Some(survivors.get(j % s).copied().unwrap_or(0)),
                children: Vec::new(),
            };
        }
        let i = survivors.iter().position(|&n| n == me).unwrap_or(0);
        let parent = (i > 0).then(|| survivors[(i - 1) / a]);
        let mut children: Vec<NodeId> = (i * a + 1..=i * a + a)
            .filter_map(|c| survivors.get(c).copied())
            .collect();
        children.extend(
            departing
                .iter()
                .enumerate()
                .filter(|(j, _)| j % s == i)
                .map(|(_, &n)| n),
        );
        DrainTree { parent, children }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ductile_coordinator::proto::{Member, View};
    use proptest::prelude::*;

    use super::*;
    use crate::topo::Topology;

    fn view(n: u32) -> View {
        View {
            epoch: 1,
            members: (0..n)
                .map(|i| Member {
                    node: i,
                    uid: 10 + u64::from(i),
                    address: vec![],
                    pes: 1,
                    host: "t".into(),
                    pid: i,
                })
                .collect(),
        }
    }

    #[test]
    fn without_leaving_nodes_it_is_the_views_node_tree() {
        for n in [1u32, 2, 5, 17, 40] {
            let v = view(n);
            for me in 0..n {
                let topo = Arc::new(Topology::new(&v, me));
                let t = DrainTree::of(me, &vec![false; n as usize]);
                assert_eq!(t.parent, topo.node_parent(me), "n {n} me {me}");
                assert_eq!(t.children, topo.node_children(me), "n {n} me {me}");
            }
        }
    }

    #[test]
    fn a_leaving_node_under_a_leaving_node_in_the_view_tree_hangs_below_a_survivor() {
        // Node tree of 6: node 1's children are 5..; 1 and 5 both leave.
        let leaving = [false, true, false, false, false, true];
        assert_eq!(DrainTree::of(5, &leaving).parent, Some(2));
        assert_eq!(DrainTree::of(1, &leaving).parent, Some(0));
        assert!(DrainTree::of(1, &leaving).children.is_empty());
        assert_eq!(DrainTree::of(0, &leaving).children, vec![2, 3, 4, 1]);
        assert_eq!(DrainTree::of(2, &leaving).children, vec![5]);
    }

    proptest! {
        /// Every node but the root has one parent, which lists it as a
        /// child; leaving nodes are leaves under survivors; every node is
        /// reached from the root.
        #[test]
        fn leaving_nodes_are_leaves_of_one_tree(
            picks in proptest::collection::vec(any::<bool>(), 1..40),
        ) {
            let mut leaving = picks;
            leaving[0] = false;
            let n = leaving.len() as NodeId;
            let trees: Vec<DrainTree> = (0..n).map(|me| DrainTree::of(me, &leaving)).collect();
            prop_assert_eq!(trees[0].parent, None);
            for me in 1..n {
                let p = trees[me as usize].parent.expect("a parent");
                prop_assert!(!leaving[p as usize], "node {}'s parent {} leaves", me, p);
                prop_assert!(trees[p as usize].children.contains(&me));
                if leaving[me as usize] {
                    prop_assert!(trees[me as usize].children.is_empty());
                }
            }
            let mut seen = vec![false; n as usize];
            let mut stack = vec![0];
            while let Some(x) = stack.pop() {
                prop_assert!(!seen[x as usize], "node {} reached twice", x);
                seen[x as usize] = true;
                stack.extend(trees[x as usize].children.iter().copied());
            }
            prop_assert!(seen.iter().all(|&s| s));
        }
    }
}
