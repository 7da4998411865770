//! The driver's new-view stages (steps 3 to 6 of `driver.rs`): node 0's
//! query and commit, the committed view installed on every node, and the
//! barrier of its node tree that ends the rescale (or a newcomer's
//! admission).
//!
//! May touch: the driver's state. No I/O.

use std::sync::Arc;
use std::time::Instant;

use ductile_coordinator::proto::View;

use super::{
    Action, BarrierWait, Cause, ControlFrame, Counts, Driver, Rescale, Stage, State, Step,
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
        out.push(Action::Commit {
            epoch: r.order.epoch,
            remove: r.order.remove.clone(),
            admit,
        });
        self.wait(now, Step::Commit, self.cfg.step);
        self.set(State::Commit { r, tries, admit });
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
            None => self.barrier_done(r, topo, out),
        }
    }

    pub(super) fn barrier_done(
        &mut self,
        r: Option<Box<Rescale>>,
        topo: Arc<Topology>,
        out: &mut Vec<Action>,
    ) {
        for c in topo.node_children(topo.my_node()) {
            out.push(Action::Send {
                to: c,
                epoch: topo.epoch(),
                frame: ControlFrame::Go,
            });
        }
        match r {
            Some(r) => {
                if r.old.my_node() == 0 {
                    out.push(Action::StageEnded(Stage::Reconcile));
                }
                let rollback = r.lost.iter().any(|&l| l);
                out.push(Action::Resume {
                    old: r.old,
                    new: topo,
                    plan: r.order.plan,
                    rollback,
                });
            }
            None => out.push(Action::Joined { me: topo.my_node() }),
        }
        self.deadline = None;
        self.counts = Counts::default();
        self.set(State::Running { stopped: 0 });
    }
}
