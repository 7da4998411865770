//! The driver's new-view stages (steps 3 to 6 of `driver.rs`): node 0's
//! query and commit (and, when the coordinator connection ended under the
//! commit, learning its outcome), the committed view installed on every
//! node, and the barrier of its node tree that ends the rescale (or a
//! newcomer's admission).
//!
//! May touch: the driver's state. No I/O.

use std::sync::Arc;
use std::time::Instant;

use ductile_coordinator::proto::{NodeId, View};
use tracing::{debug, info};

use super::{
    Action, BarrierWait, Cause, ControlFrame, Counts, Driver, Rescale, Stage, State, Step,
    ViewUnanswered,
};
use crate::topo::Topology;

impl Driver {
    /// Node 0: asks how many newcomers wait (when the request admits any).
    pub(super) fn query(
        &mut self,
        r: Box<Rescale>,
        tries: u32,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        if r.order.admit == 0 {
            self.commit(r, tries, 0, now, out);
            return;
        }
        debug!(
            epoch = r.order.epoch,
            "asking the coordinator how many newcomers wait"
        );
        out.push(Action::QueryPending {
            epoch: r.order.epoch,
        });
        self.wait(now, Step::Pending, self.cfg.step);
        self.set(State::Pending { r, tries });
    }

    pub(super) fn commit(
        &mut self,
        r: Box<Rescale>,
        tries: u32,
        admit: u32,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        debug!(
            epoch = r.order.epoch,
            admit, "asking the coordinator to commit"
        );
        out.push(Action::Commit {
            epoch: r.order.epoch,
            remove: r.order.remove.clone(),
            admit,
        });
        self.wait(now, Step::Commit, self.cfg.step);
        self.set(State::Commit { r, tries, admit });
    }

    /// Node 0: the commit was made; `view` is its answer. Sends it to the
    /// survivors and installs it.
    pub(super) fn committed(
        &mut self,
        r: Box<Rescale>,
        view: View,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        out.push(Action::StageEnded(Stage::Commit));
        let epoch = r.old.epoch();
        for (node, next) in r.order.plan.node_map.iter().enumerate() {
            if node != 0 && next.is_some() {
                out.push(Action::Send {
                    to: node as NodeId,
                    epoch,
                    frame: ControlFrame::View(view.clone()),
                });
            }
        }
        self.install(Some(r), view, now, out);
    }

    /// Node 0 learned the coordinator's view after the connection ended
    /// under commit number `tries` (`lost` said how). The next epoch, as
    /// this commit would make it, is the commit's answer: it was made. The
    /// epoch left: nothing was committed (the connection ended before the
    /// coordinator read it, or a restarted coordinator was restored with
    /// the view left), and the plan is as valid as it was, so node 0
    /// commits again, asking for newcomers first. Anything else ends the
    /// rescale: node 0 does not guess.
    pub(super) fn outcome(
        &mut self,
        r: Box<Rescale>,
        tries: u32,
        lost: String,
        answer: &Result<View, ViewUnanswered>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let left = r.old.epoch();
        match answer {
            Err(e) => self.fail(Step::CommitOutcome, Cause::Unlearned(e.clone()), out),
            Ok(view) if view.epoch == left + 1 && made_by(&r, view) => {
                info!(
                    epoch = view.epoch,
                    "the commit was made before the coordinator connection ended; going on with its view"
                );
                self.committed(r, view.clone(), now, out);
            }
            // A member lost meanwhile: nothing is made without it.
            Ok(view) if view.epoch == left && self.loss.is_some() => {
                let lost = self.loss.take().expect("checked");
                info!(
                    epoch = left,
                    lost,
                    "nothing was committed before the coordinator connection ended, and a member was lost since; recovering without it"
                );
                self.state = State::Outcome {
                    r,
                    tries,
                    lost: String::new(),
                };
                self.recover(lost, now, out);
            }
            Ok(view) if view.epoch == left && tries < self.cfg.commit_tries => {
                info!(
                    epoch = left,
                    "nothing was committed before the coordinator connection ended; committing again"
                );
                self.query(r, tries + 1, now, out);
            }
            Ok(view) if view.epoch == left => {
                let cause = Cause::LostAgain { tries, last: lost };
                self.fail(Step::Commit, cause, out);
            }
            Ok(view) => {
                let cause = Cause::Diverged {
                    epoch: view.epoch,
                    left,
                };
                self.fail(Step::CommitOutcome, cause, out);
            }
        }
    }

    /// The committed view: reconcile endpoints and install it.
    pub(super) fn install(
        &mut self,
        r: Option<Box<Rescale>>,
        view: View,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let epoch = view.epoch;
        // A loss of the view left, heard while the commit was made anyway:
        // a node it removed (nothing lost), or one the view names, which
        // the node recovers from once it resumed in it.
        if let (Some(lost), Some(r)) = (self.loss.take(), &r) {
            let uid = r.old.uid_of(lost);
            if view.by_uid(uid).is_some() {
                self.lost_after = Some(uid);
            }
        }
        let uid = r.as_ref().map(|r| r.old.my_uid());
        let me = uid.and_then(|uid| view.by_uid(uid).map(|m| m.node));
        match (uid, me) {
            (Some(_), Some(me)) => {
                out.push(Action::Install { view, me });
                self.wait(now, Step::Reconcile { epoch }, self.cfg.step);
                self.set(State::Installing { r, epoch });
            }
            (uid, _) => {
                let cause = Cause::NotInView {
                    uid: uid.unwrap_or(0),
                };
                self.fail(Step::Reconcile { epoch }, cause, out);
            }
        }
    }

    /// The new view is installed: the barrier of its node tree.
    pub(super) fn barrier(
        &mut self,
        r: Option<Box<Rescale>>,
        topo: Arc<Topology>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        self.topo = Some(topo.clone());
        if topo.my_node() == 0 {
            if let Some(lost) = self.lost_in_view() {
                self.resume_then_recover(r, topo, lost, now, out);
                return;
            }
        }
        if topo.node_children(topo.my_node()).is_empty() {
            self.barrier_up(r, topo, now, out);
        } else {
            self.wait(now, Step::BarrierReady, self.cfg.step);
            let wait = BarrierWait::Ready { ready: 0 };
            self.set(State::Barrier { r, topo, wait });
        }
    }

    pub(super) fn barrier_up(
        &mut self,
        r: Option<Box<Rescale>>,
        topo: Arc<Topology>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        match topo.node_parent(topo.my_node()) {
            Some(parent) => {
                out.push(Action::Send {
                    to: parent,
                    epoch: topo.epoch(),
                    frame: ControlFrame::Ready,
                });
                self.wait(now, Step::BarrierGo, self.cfg.step);
                let wait = BarrierWait::Go;
                self.set(State::Barrier { r, topo, wait });
            }
            None => self.barrier_done(r, topo, now, out),
        }
    }

    pub(super) fn barrier_done(
        &mut self,
        r: Option<Box<Rescale>>,
        topo: Arc<Topology>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        for c in topo.node_children(topo.my_node()) {
            out.push(Action::Send {
                to: c,
                epoch: topo.epoch(),
                frame: ControlFrame::Go,
            });
        }
        // A member lost before this node resumed: recovered from now.
        match self.lost_in_view() {
            Some(lost) => self.resume_then_recover(r, topo, lost, now, out),
            None => self.resume(r, topo, out),
        }
    }

    /// The PEs go on in the installed view `topo` (a newcomer's start).
    fn resume(&mut self, r: Option<Box<Rescale>>, topo: Arc<Topology>, out: &mut Vec<Action>) {
        let go = self.resumption(r, topo, out);
        out.push(go);
    }

    /// What resumes the PEs in `topo`; the driver runs from then on.
    fn resumption(
        &mut self,
        r: Option<Box<Rescale>>,
        topo: Arc<Topology>,
        out: &mut Vec<Action>,
    ) -> Action {
        let go = match r {
            Some(r) => {
                if r.old.my_node() == 0 {
                    out.push(Action::StageEnded(Stage::Reconcile));
                }
                let rollback = r.lost.iter().any(|&l| l);
                Action::Resume {
                    old: r.old,
                    new: topo,
                    plan: r.order.plan,
                    rollback,
                }
            }
            None => Action::Joined { me: topo.my_node() },
        };
        self.deadline = None;
        self.counts = Counts::default();
        self.set(State::Running { stopped: 0 });
        go
    }

    /// Node `lost` of the view entered (installed: `topo`) was lost before
    /// this node passed its barrier: the commit was made before the
    /// coordinator knew, and the barrier cannot complete without it. The
    /// node resumes without the barrier, and recovers from the loss in
    /// that view at once (node 0 tells every node to do the same). The
    /// PEs re-enter in place, so the checkpoint is carried into the view,
    /// then stop and roll back to it. The recovery's stop is in their
    /// inboxes before they resume: they take it before anything of the
    /// view left that reached them late.
    pub(super) fn resume_then_recover(
        &mut self,
        r: Option<Box<Rescale>>,
        topo: Arc<Topology>,
        lost: NodeId,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        debug!(
            lost,
            epoch = topo.epoch(),
            "a member of the view entered was lost before its barrier; resuming to recover without it"
        );
        self.lost_after = None;
        let go = self.resumption(r, topo, out);
        self.recover(lost, now, out);
        out.push(go);
    }

    /// The member noted lost after the commit ([`Driver::lost_after`]),
    /// by its id in the installed view; None when none is (a node the
    /// commit removed is no member).
    pub(super) fn lost_in_view(&mut self) -> Option<NodeId> {
        let uid = self.lost_after.take()?;
        let topo = self.topo.as_ref()?;
        (0..topo.num_nodes()).find(|&n| topo.uid_of(n) == uid)
    }
}

/// Whether `view` is what the commit of `r` makes of the view it leaves:
/// every member keeps the id the plan gives it, or is gone when it leaves,
/// and the others are at most the newcomers asked for.
fn made_by(r: &Rescale, view: &View) -> bool {
    let map = &r.order.plan.node_map;
    let old = &r.old;
    let planned = (0..old.num_nodes()).all(|n| {
        let now = view.by_uid(old.uid_of(n)).map(|m| m.node);
        map.get(n as usize).copied().flatten() == now
    });
    let kept = map.iter().flatten().count();
    planned && view.members.len() <= kept + r.order.admit as usize
}
