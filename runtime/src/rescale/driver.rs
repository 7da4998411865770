//! The node-level rescale protocol as a sans-IO state machine: events and
//! the time in, actions out. No thread, no clock, no socket, no channel:
//! the shell ([`super::shell`]) reads the clock, carries out the actions
//! and feeds back what happened; the tests (`driver/tests.rs`) run whole
//! jobs of these machines in virtual time.
//!
//! Once every local PE has stopped (one [`Event::PeStopped`] per PE, each
//! carrying the request with its plan), a node
//!
//! 1. drains the network: the envelope frames every node sent to every
//!    other in this epoch are summed up a node tree and the totals come
//!    back down ([`DrainMode::Tree`]; the tree keeps leaving nodes at its
//!    leaves, see `drain.rs`; or every node tells every peer,
//!    [`DrainMode::AllToAll`]), and the node waits until it received its
//!    total (counts come as [`Event::Counts`]);
//! 2. has its PEs hand over ([`Action::HandOver`]) and drains again, then
//!    takes the old epoch's late envelopes out of its inboxes
//!    ([`Action::TakeLate`]);
//! 3. a departing node waits for the coordinator's Die and departs; node 0
//!    asks the coordinator for the newcomers waiting (when the request
//!    admits any), commits, asking again when a newcomer vanished between
//!    the query and the commit, and sends the committed view to every
//!    survivor; a survivor waits for it. When the coordinator connection
//!    ends under the commit, node 0 does not guess: it asks the
//!    coordinator's view ([`Action::AskView`]) once it is reachable again
//!    (the launcher restarts a lost one, which node 0 restores with the
//!    view it left). The next epoch there: the commit was made, and node 0
//!    goes on with that view. Still the epoch it left: nothing was
//!    committed, and node 0 commits again (asking for newcomers first, as
//!    they register again with a restarted coordinator). The query and
//!    commit tries are bounded together ([`Config::commit_tries`]);
//! 4. reconciles endpoints with the new view and installs it
//!    ([`Action::Install`]);
//! 5. passes a barrier up and down the node tree of the new view;
//! 6. resumes its PEs in the new view ([`Action::Resume`]).
//!
//! A newcomer starts at step 4 when the coordinator's `Integrate` comes and
//! ends with [`Action::Joined`].
//!
//! Every wait has a deadline ([`Driver::next_deadline`]); past it, or when a
//! member is lost, the node is aborting or an answer is an error, the
//! machine fails with a [`Failure`] that names the step it was in.
//!
//! With recovery on (`+ft-every`), a member other than node 0 lost without
//! notice starts a recovery instead (`drain.rs`, [`Driver::recover`]): a
//! rescale of the node's own, without the lost node, that rolls the PEs
//! back. A loss during a rescale does too. Before the rescale's commit is
//! made it abandons the rescale ([`Driver::lost_in_rescale`]); after it,
//! before this node resumed in the new view, the recovery runs in that view
//! ([`Driver::lost_after_commit`]). Node 0 decides which, as it alone knows
//! whether it asked for the commit, and says so to every node
//! ([`ControlFrame::Recover`]).
//! Frames of an epoch that is neither this node's nor the next are late
//! frames of an old epoch and are dropped; frames and coordinator notices
//! that come before the step that wants them are kept until it comes.
//!
//! May touch: nothing but itself. Reads the topology and the plan it is
//! given.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ductile_coordinator::proto::{NodeId, ServerMsg};
use tracing::{debug, info, warn};

use super::{ControlFrame, Stage};
use crate::system::StopOrder;
use crate::topo::Topology;

mod drain;
mod events;
mod view;
pub(crate) use drain::add_counts;
use drain::DrainTree;
pub(crate) use events::{
    Action, Cause, Config, Counts, DrainMode, Event, Failure, Step, Unanswered, ViewUnanswered,
};

/// The rescale this node takes part in.
#[derive(Debug)]
struct Rescale {
    order: StopOrder,
    old: Arc<Topology>,
    leaving: bool,
    /// This node's place in the drain's tree.
    tree: DrainTree,
    /// A recovery: the old view's nodes lost without notice (none in a
    /// rescale). They take no part; their frames are neither counted nor
    /// waited for.
    lost: Vec<bool>,
}

#[derive(Debug)]
enum DrainWait {
    /// Tree: DrainUp from the children.
    Children { heard: usize, sum: Vec<u64> },
    /// Tree: DrainDown from the parent.
    Totals,
    /// Until the frames counted as sent here arrived.
    Frames { expect: u64 },
    /// All-to-all: every peer's Drain, then its frames.
    Peers { expected: BTreeMap<NodeId, u64> },
}

#[derive(Debug)]
enum BarrierWait {
    Ready { ready: usize },
    Go,
}

#[derive(Debug)]
enum State {
    /// PEs run; counts those that stopped.
    Running {
        stopped: usize,
    },
    /// A recovery from the loss of `lost`: the PEs stop and roll back
    /// (counts those that stopped).
    Recovering {
        order: StopOrder,
        lost: NodeId,
        stopped: usize,
    },
    Drain {
        r: Box<Rescale>,
        round: u8,
        wait: DrainWait,
    },
    HandOver {
        r: Box<Rescale>,
        handed: usize,
    },
    /// A departing node: the rescale is over for it at the Die.
    Die {
        r: Box<Rescale>,
    },
    Pending {
        r: Box<Rescale>,
        tries: u32,
    },
    Commit {
        r: Box<Rescale>,
        tries: u32,
        admit: u32,
    },
    /// Node 0: the coordinator refused the commit because a member was
    /// announced lost; waiting for that notice, to recover without it.
    Refused {
        r: Box<Rescale>,
    },
    /// Node 0: the connection ended under commit number `tries`; waiting
    /// for the coordinator's view to learn whether it was made.
    Outcome {
        r: Box<Rescale>,
        tries: u32,
        /// The loss, for the error if the tries run out.
        lost: String,
    },
    NewView {
        r: Box<Rescale>,
    },
    /// `r` is None for a newcomer.
    Installing {
        r: Option<Box<Rescale>>,
        epoch: u64,
    },
    Barrier {
        r: Option<Box<Rescale>>,
        topo: Arc<Topology>,
        wait: BarrierWait,
    },
    /// A newcomer waiting for Integrate.
    Admission,
    Departed,
    Failed,
    /// Only while a transition is in progress.
    Moving,
}

impl Rescale {
    /// Whether the member `uid` of the old view is one this recovery is for.
    fn was_lost(&self, uid: u64) -> bool {
        (0..self.old.num_nodes())
            .find(|&n| self.old.uid_of(n) == uid)
            .is_some_and(|n| self.is_lost(n))
    }

    /// Whether node `n` of the old view is one this recovery is for.
    fn is_lost(&self, n: NodeId) -> bool {
        self.lost.get(n as usize).copied().unwrap_or(false)
    }

    /// Whether the member `uid` of the old view leaves in this rescale.
    fn leaves(&self, uid: u64) -> bool {
        (0..self.old.num_nodes())
            .find(|&n| self.old.uid_of(n) == uid)
            .is_some_and(|n| self.order.plan.node_map[n as usize].is_none())
    }
}

/// One node's rescale driver.
#[derive(Debug)]
pub(crate) struct Driver {
    cfg: Config,
    /// The installed topology (None: a newcomer waiting).
    topo: Option<Arc<Topology>>,
    state: State,
    /// Frames and notices kept for a later step, in arrival order.
    early: VecDeque<Event>,
    counts: Counts,
    /// When the current wait ends, which step it is, and its bound.
    deadline: Option<(Instant, Step, Duration)>,
    /// The step changed: kept events are offered again.
    moved: bool,
    /// A member of the view left, lost during a rescale that has no new
    /// view yet: node 0 decides (see [`Driver::lost_in_rescale`]).
    loss: Option<NodeId>,
    /// A member of the view being entered (by uid), lost before this node
    /// resumed in it: recovered from once it did (`view.rs`,
    /// [`Driver::resume_then_recover`]).
    lost_after: Option<u64>,
}

impl Driver {
    /// A member's driver, in the view of `topo`.
    pub(crate) fn member(cfg: Config, topo: Arc<Topology>) -> Self {
        Driver {
            cfg,
            topo: Some(topo),
            state: State::Running { stopped: 0 },
            early: VecDeque::new(),
            counts: Counts::default(),
            deadline: None,
            moved: false,
            loss: None,
            lost_after: None,
        }
    }

    /// A newcomer's driver, registered at `now` and waiting for admission.
    pub(crate) fn newcomer(cfg: Config, now: Instant) -> Self {
        let mut d = Driver {
            cfg,
            topo: None,
            state: State::Admission,
            early: VecDeque::new(),
            counts: Counts::default(),
            deadline: None,
            moved: false,
            loss: None,
            lost_after: None,
        };
        d.wait(now, Step::Admission, cfg.admission);
        d
    }

    /// When the shell must call with [`Event::Tick`] at the latest.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadline.as_ref().map(|(at, _, _)| *at)
    }

    /// Whether a rescale (or an admission) is under way on this node.
    pub(crate) fn busy(&self) -> bool {
        !matches!(
            self.state,
            State::Running { .. } | State::Departed | State::Failed
        )
    }

    /// The stage of the rescale under way on this node, with the epoch it
    /// leaves (a newcomer: the one it joins); None when none is.
    pub(crate) fn stage(&self) -> Option<(Stage, u64)> {
        let old = |r: &Rescale| r.old.epoch();
        match &self.state {
            State::Drain { r, .. } | State::HandOver { r, .. } => Some((Stage::Stop, old(r))),
            State::Recovering { order, .. } => Some((Stage::Stop, order.epoch)),
            State::Die { r }
            | State::Pending { r, .. }
            | State::Commit { r, .. }
            | State::Refused { r }
            | State::Outcome { r, .. } => Some((Stage::Commit, old(r))),
            State::NewView { r } => Some((Stage::Commit, old(r))),
            State::Installing { r, epoch } => {
                Some((Stage::Reconcile, r.as_deref().map_or(*epoch, old)))
            }
            State::Barrier { r, topo, .. } => {
                Some((Stage::Reconcile, r.as_deref().map_or(topo.epoch(), old)))
            }
            _ => None,
        }
    }

    /// Whether the driver wants [`Event::Counts`] now.
    pub(crate) fn draining(&self) -> bool {
        matches!(self.state, State::Drain { .. } | State::HandOver { .. })
    }

    /// The installed topology, if any.
    pub(crate) fn topology(&self) -> Option<&Arc<Topology>> {
        self.topo.as_ref()
    }

    /// Takes one event at time `now`; returns what to do, in order.
    pub(crate) fn on_event(&mut self, event: Event, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        self.handle(event, now, &mut out);
        while std::mem::take(&mut self.moved) {
            self.poll(now, &mut out);
            let early = std::mem::take(&mut self.early);
            for e in early {
                if !self.offer(&e, now, &mut out) {
                    self.early.push_back(e);
                }
            }
        }
        out
    }

    fn handle(&mut self, event: Event, now: Instant, out: &mut Vec<Action>) {
        if let Some((at, step, bound)) = &self.deadline {
            if now >= *at {
                let (step, bound) = (step.clone(), *bound);
                self.fail(step, Cause::TimedOut(bound), out);
                return;
            }
        }
        match &event {
            Event::Tick => return,
            Event::Counts(c) => {
                self.counts = c.clone();
                self.poll(now, out);
                return;
            }
            Event::Aborting => {
                self.fail_busy(Cause::Aborting, out);
                return;
            }
            Event::Coordinator(ServerMsg::MemberLost { epoch, node, uid }) => {
                let (epoch, node, uid) = (*epoch, *node, *uid);
                if self.rescale().is_some_and(|r| r.was_lost(uid)) {
                    debug!(node, uid, "a lost node reported again during its recovery");
                } else if matches!(&self.state, State::Recovering { lost, .. } if self.topo.as_ref().is_some_and(|t| t.uid_of(*lost) == uid))
                {
                    debug!(node, uid, "a lost node reported again during its recovery");
                } else if self.rescale().is_some_and(|r| r.leaving && r.leaves(uid)) {
                    // A leaving node waits on no other leaving node (they
                    // are leaves of the drain tree): a loss that matters
                    // fails a survivor, and that loss reaches this node.
                    debug!(node, uid, "another leaving node was lost");
                } else if matches!(&self.state, State::Installing { r: Some(r), .. } | State::Barrier { r: Some(r), .. } if r.leaves(uid))
                {
                    // Removed by the commit this node installs: no member.
                    debug!(node, uid, "a node the commit removed was lost");
                } else if matches!(self.state, State::Admission) {
                    // A waiting newcomer takes no part in what the members
                    // do about it (a recovery may admit it).
                    debug!(node, uid, "a member was lost while this newcomer waits");
                } else if self.busy() {
                    if let Some(lost) = self.abandonable(epoch, uid) {
                        self.lost_in_rescale(lost, now, out);
                    } else if self.entering(epoch) {
                        self.lost_after_commit(uid, now, out);
                    } else {
                        self.fail_busy(Cause::MemberLost { node, uid }, out);
                    }
                } else if matches!(self.state, State::Running { .. }) {
                    // Named by its id in this node's view; one that is not
                    // in it (removed by a commit this node has installed
                    // since) is no loss of the job.
                    let here = self
                        .topo
                        .as_ref()
                        .and_then(|t| (0..t.num_nodes()).find(|&n| t.uid_of(n) == uid));
                    match here {
                        // Some PEs may have stopped for a rescale already.
                        Some(node) if self.cfg.recover && node != 0 => {
                            self.recover(node, now, out);
                        }
                        Some(node) => out.push(Action::PeerLost { node, uid }),
                        None => debug!(node, uid, "a node no longer a member was reported lost"),
                    }
                }
                return;
            }
            // The node this recovery is without, unreachable by a frame
            // sent before the recovery began (a barrier's Ready to it):
            // nothing more is lost.
            Event::SendFailed { to, error } if self.recovering_without(*to) => {
                debug!(to, error, "a frame to the node lost could not be sent");
                return;
            }
            // A member of the view entered unreachable (node 0's View to
            // it, the barrier's Ready): as if reported lost.
            Event::SendFailed { to, .. } if self.unreachable_in_view_entered(*to).is_some() => {
                let uid = self.unreachable_in_view_entered(*to).expect("checked");
                self.lost_after_commit(uid, now, out);
                return;
            }
            // A peer of the view left unreachable: as if reported lost.
            Event::SendFailed { to, .. }
                if *to != 0
                    && self
                        .before_new_view()
                        .is_some_and(|r| *to < r.old.num_nodes()) =>
            {
                self.lost_in_rescale(*to, now, out);
                return;
            }
            Event::Frame {
                src, epoch_bits, ..
            } if self.stale(*epoch_bits) => {
                debug!(src, epoch_bits, "dropping a control frame of an old epoch");
                return;
            }
            _ => {}
        }
        if matches!(self.state, State::Failed | State::Departed) {
            return;
        }
        if !self.offer(&event, now, out) {
            match event {
                // For a later step of this rescale (or the next).
                e @ (Event::Frame { .. }
                | Event::Coordinator(ServerMsg::Die { .. } | ServerMsg::Integrate { .. })) => {
                    self.early.push_back(e)
                }
                Event::Coordinator(other) => debug!("coordinator notice {other:?}"),
                other => debug!("ignoring {other:?} in {:?}", self.state_name()),
            }
        }
    }

    /// Fails the rescale (or admission) in progress; nothing when none is.
    fn fail_busy(&mut self, cause: Cause, out: &mut Vec<Action>) {
        if !self.busy() {
            return;
        }
        let step = match &self.deadline {
            Some((_, step, _)) => step.clone(),
            None => Step::Commit,
        };
        self.fail(step, cause, out);
    }

    /// With recovery on, during a rescale (not a recovery) that has no new
    /// view yet: the node of the view left (not node 0) with member id
    /// `uid`, reported lost in that view's `epoch`. Its loss may turn the
    /// rescale into a recovery ([`Driver::lost_in_rescale`]). None: the
    /// loss fails the rescale, as without recovery (node 0 lost, a loss
    /// the coordinator reported in the next epoch: the commit was made).
    fn abandonable(&self, epoch: u64, uid: u64) -> Option<NodeId> {
        let r = self.before_new_view()?;
        if epoch != r.old.epoch() {
            return None;
        }
        (1..r.old.num_nodes()).find(|&n| r.old.uid_of(n) == uid)
    }

    /// With recovery on, the rescale (not a recovery) under way that has no
    /// new view yet: every node of its view is still a member.
    fn before_new_view(&self) -> Option<&Rescale> {
        if !self.cfg.recover {
            return None;
        }
        let r = match &self.state {
            State::Drain { r, .. }
            | State::HandOver { r, .. }
            | State::Die { r }
            | State::Pending { r, .. }
            | State::Commit { r, .. }
            | State::Refused { r }
            | State::Outcome { r, .. }
            | State::NewView { r } => r,
            _ => return None,
        };
        (!r.lost.iter().any(|&l| l)).then_some(&**r)
    }

    /// With recovery on, whether this node is entering the view of epoch
    /// `epoch`, committed by a rescale (or admitting this newcomer), and
    /// has not resumed in it: a loss of one of its members is then
    /// recovered from in it ([`Driver::lost_after_commit`]).
    fn entering(&self, epoch: u64) -> bool {
        if !self.cfg.recover {
            return false;
        }
        let recovery = |r: &Rescale| r.lost.iter().any(|&l| l);
        match &self.state {
            // Not installed yet (still draining, even: the lost node's
            // frames were all sent before node 0 could commit): a notice
            // of the next epoch says the commit was made.
            State::Drain { r, .. }
            | State::HandOver { r, .. }
            | State::Die { r }
            | State::Pending { r, .. }
            | State::Commit { r, .. }
            | State::Refused { r }
            | State::Outcome { r, .. }
            | State::NewView { r } => !recovery(r) && epoch == r.old.epoch() + 1,
            // A loss noticed here before the install is numbered in the
            // view left.
            State::Installing { r, epoch: next } => {
                !r.as_deref().is_some_and(recovery) && (epoch == *next || epoch + 1 == *next)
            }
            State::Barrier { r, topo, .. } => {
                let next = topo.epoch();
                !r.as_deref().is_some_and(recovery) && (epoch == next || epoch + 1 == next)
            }
            _ => false,
        }
    }

    /// With recovery on, entering a view committed by a rescale: the
    /// member id of node `to`, to which a control frame could not be
    /// sent, if it is a member of that view. Before the install the only
    /// frames sent are node 0's View to the nodes kept (numbered in the
    /// view left); from the barrier on, frames name nodes of the view
    /// installed.
    fn unreachable_in_view_entered(&self, to: NodeId) -> Option<u64> {
        match &self.state {
            State::Installing { r: Some(r), epoch } if self.entering(*epoch) => {
                (to < r.old.num_nodes()).then(|| r.old.uid_of(to))
            }
            State::Barrier { topo, .. } if self.entering(topo.epoch()) => {
                (to < topo.num_nodes()).then(|| topo.uid_of(to))
            }
            _ => None,
        }
    }

    /// Member `uid` of the view this node enters was lost before the node
    /// resumed in it: the commit was made before the coordinator knew.
    /// Node 0 resumes without the barrier (which cannot complete) and
    /// recovers in the new view, telling every node to do the same
    /// ([`ControlFrame::Recover`], tagged with the new epoch); it waits for
    /// its install first. The others note the loss and go on when node 0
    /// says so or the barrier completes (the lost node passed it first),
    /// recovering at once.
    fn lost_after_commit(&mut self, uid: u64, now: Instant, out: &mut Vec<Action>) {
        match self.lost_after {
            Some(u) if u == uid => return,
            Some(_) => {
                let node = self
                    .topo
                    .as_ref()
                    .and_then(|t| (0..t.num_nodes()).find(|&n| t.uid_of(n) == uid))
                    .unwrap_or(NodeId::MAX);
                self.fail_busy(Cause::MemberLost { node, uid }, out);
                return;
            }
            None => {}
        }
        debug!(
            uid,
            step = self.state_name(),
            "a member of the view entered was lost before this node resumed in it"
        );
        self.lost_after = Some(uid);
        if self.me() != 0 || !matches!(self.state, State::Barrier { .. }) {
            return;
        }
        // None: a node the commit removed, no member.
        let Some(lost) = self.lost_in_view() else {
            return;
        };
        let State::Barrier { r, topo, .. } = std::mem::replace(&mut self.state, State::Moving)
        else {
            unreachable!("matched above");
        };
        self.resume_then_recover(r, topo, lost, now, out);
    }

    /// Node `lost` of the view left was lost during a rescale with no new
    /// view yet. Node 0 decides what becomes of the rescale, as it alone
    /// knows whether it asked for the commit: before it did, or once the
    /// coordinator refused it for the loss, or it learned that nothing was
    /// committed, it recovers and tells every node so
    /// ([`ControlFrame::Recover`]); while the commit is asked, or its
    /// outcome learned, it waits for the answer (made: the rescale goes
    /// on, and the loss is the next view's). The other nodes wait for node 0's word or the
    /// view, within their step's bound.
    fn lost_in_rescale(&mut self, lost: NodeId, now: Instant, out: &mut Vec<Action>) {
        match self.loss {
            Some(l) if l == lost => return,
            Some(_) => {
                let uid = self.topo.as_ref().map_or(0, |t| t.uid_of(lost));
                self.fail_busy(Cause::MemberLost { node: lost, uid }, out);
                return;
            }
            None => {}
        }
        // While the commit is asked, or its outcome learned (the
        // connection ended under it), node 0 waits for the answer.
        if self.me() == 0 && !matches!(self.state, State::Commit { .. } | State::Outcome { .. }) {
            self.recover(lost, now, out);
        } else {
            debug!(
                lost,
                step = self.state_name(),
                "a member was lost during the rescale; node 0 decides"
            );
            self.loss = Some(lost);
        }
    }

    fn fail(&mut self, step: Step, cause: Cause, out: &mut Vec<Action>) {
        let failure = Failure {
            step,
            cause,
            recovering: self.recovering_from(),
        };
        if matches!(failure.cause, Cause::MemberLost { .. }) {
            // Said once for the job, by the shell (`NodeShared::lose_peer`).
            debug!("rescale failed on this node: {failure}");
        } else {
            warn!("rescale failed on this node: {failure}");
        }
        self.state = State::Failed;
        self.deadline = None;
        self.early.clear();
        out.push(Action::Fail(failure));
    }

    /// The node (of the view left) whose loss the rescale under way
    /// recovers from, if it is a recovery.
    fn recovering_from(&self) -> Option<NodeId> {
        match &self.state {
            State::Recovering { lost, .. } => Some(*lost),
            _ => self
                .rescale()
                .and_then(|r| r.lost.iter().position(|&l| l))
                .map(|n| n as NodeId),
        }
    }

    /// Whether node `to`, numbered in the view this node is in, is the
    /// one the recovery under way is without. Not once the recovery's
    /// view is installed: nodes are numbered in that view then.
    fn recovering_without(&self, to: NodeId) -> bool {
        match &self.state {
            State::Recovering { lost, .. } => *lost == to,
            State::Installing { .. } | State::Barrier { .. } => false,
            _ => self.rescale().is_some_and(|r| r.is_lost(to)),
        }
    }

    /// The rescale this node takes part in, if one is under way.
    fn rescale(&self) -> Option<&Rescale> {
        match &self.state {
            State::Drain { r, .. }
            | State::HandOver { r, .. }
            | State::Pending { r, .. }
            | State::Commit { r, .. }
            | State::Refused { r }
            | State::Outcome { r, .. }
            | State::NewView { r }
            | State::Die { r } => Some(r),
            State::Installing { r, .. } | State::Barrier { r, .. } => r.as_deref(),
            _ => None,
        }
    }

    fn state_name(&self) -> &'static str {
        match self.state {
            State::Running { .. } => "running",
            State::Recovering { .. } => "recovering",
            State::Drain { .. } => "drain",
            State::HandOver { .. } => "hand-over",
            State::Die { .. } => "die",
            State::Pending { .. } => "pending",
            State::Commit { .. } => "commit",
            State::Refused { .. } => "commit refused",
            State::Outcome { .. } => "commit outcome",
            State::NewView { .. } => "new view",
            State::Installing { .. } => "installing",
            State::Barrier { .. } => "barrier",
            State::Admission => "admission",
            State::Departed => "departed",
            State::Failed => "failed",
            State::Moving => "moving",
        }
    }

    /// A frame of an epoch that is neither this node's nor the next one.
    fn stale(&self, bits: u64) -> bool {
        let Some(topo) = &self.topo else {
            return false;
        };
        let cur = topo.epoch() & 0xffff;
        bits != cur && bits != (cur + 1) & 0xffff
    }

    fn wait(&mut self, now: Instant, step: Step, bound: Duration) {
        self.deadline = Some((now + bound, step, bound));
    }

    fn set(&mut self, state: State) {
        self.state = state;
        self.moved = true;
    }

    fn me(&self) -> NodeId {
        self.topo.as_ref().map_or(NodeId::MAX, |t| t.my_node())
    }

    /// Offers `e` to the step in progress; false: not for it.
    fn offer(&mut self, e: &Event, now: Instant, out: &mut Vec<Action>) -> bool {
        let state = std::mem::replace(&mut self.state, State::Moving);
        let (state, took) = self.offer_to(state, e, now, out);
        if let Some(s) = state {
            self.state = s;
        }
        took
    }

    /// Returns the state to keep (None: a transition set it) and whether
    /// the event was taken.
    fn offer_to(
        &mut self,
        state: State,
        e: &Event,
        now: Instant,
        out: &mut Vec<Action>,
    ) -> (Option<State>, bool) {
        match (state, e) {
            (State::Running { stopped }, Event::PeStopped(order)) => {
                let stopped = stopped + 1;
                if stopped < self.cfg.local_pes {
                    return (Some(State::Running { stopped }), true);
                }
                self.begin(order.clone(), Vec::new(), now, out);
                (None, true)
            }
            (
                State::Recovering {
                    order,
                    lost,
                    stopped,
                },
                Event::PeStopped(_),
            ) => {
                let stopped = stopped + 1;
                if stopped < self.cfg.local_pes {
                    let state = State::Recovering {
                        order,
                        lost,
                        stopped,
                    };
                    return (Some(state), true);
                }
                let mut gone = vec![false; order.plan.node_map.len()];
                if let Some(g) = gone.get_mut(lost as usize) {
                    *g = true;
                }
                self.begin(order, gone, now, out);
                (None, true)
            }
            (State::Running { stopped }, Event::HandedOver) => {
                (Some(State::Running { stopped }), true)
            }
            (
                State::Drain {
                    r,
                    round,
                    wait: DrainWait::Children { heard, mut sum },
                },
                Event::Frame {
                    src,
                    epoch_bits,
                    frame: ControlFrame::DrainUp { round: fr, sent },
                },
            ) if *fr == round && *epoch_bits == r.old.epoch() & 0xffff => {
                if let Err(cause) = add_counts(&mut sum, sent, *src) {
                    let step = Step::DrainCounts {
                        round,
                        node: self.me(),
                    };
                    self.fail(step, cause, out);
                    return (None, true);
                }
                let heard = heard + 1;
                if heard < r.tree.children.len() {
                    let wait = DrainWait::Children { heard, sum };
                    return (Some(State::Drain { r, round, wait }), true);
                }
                self.drain_up(r, round, sum, now, out);
                (None, true)
            }
            (
                State::Drain {
                    r,
                    round,
                    wait: DrainWait::Totals,
                },
                Event::Frame {
                    epoch_bits,
                    frame: ControlFrame::DrainDown { round: fr, totals },
                    ..
                },
            ) if *fr == round && *epoch_bits == r.old.epoch() & 0xffff => {
                self.drain_down(r, round, totals.clone(), now, out);
                (None, true)
            }
            (
                State::Drain {
                    r,
                    round,
                    wait: DrainWait::Peers { mut expected },
                },
                Event::Frame {
                    src,
                    epoch_bits,
                    frame: ControlFrame::Drain { round: fr, sent },
                },
            ) if *fr == round && *epoch_bits == r.old.epoch() & 0xffff => {
                expected.insert(*src, *sent);
                self.moved = true;
                let wait = DrainWait::Peers { expected };
                (Some(State::Drain { r, round, wait }), true)
            }
            (State::HandOver { r, handed }, Event::HandedOver) => {
                let handed = handed + 1;
                if handed < self.cfg.local_pes {
                    return (Some(State::HandOver { r, handed }), true);
                }
                self.drain(r, 2, now, out);
                (None, true)
            }
            (State::Die { .. }, Event::Coordinator(ServerMsg::Die { .. })) => {
                info!(node = self.me(), "removed by the rescale; leaving the job");
                self.deadline = None;
                out.push(Action::Depart);
                self.set(State::Departed);
                (None, true)
            }
            (State::Pending { r, tries }, Event::Pending(answer)) => match answer {
                Ok(waiting) => {
                    let admit = r.order.admit.min(*waiting);
                    self.commit(r, tries, admit, now, out);
                    (None, true)
                }
                // A question that changes nothing: asked again, once the
                // coordinator is reachable again.
                Err(Unanswered::Lost(why)) if tries < self.cfg.commit_tries => {
                    warn!("the coordinator connection ended under the query for newcomers ({why}); asking again");
                    self.query(r, tries + 1, now, out);
                    (None, true)
                }
                Err(e) => {
                    let cause = Cause::Pending(e.message().to_owned());
                    self.fail(Step::Pending, cause, out);
                    (None, true)
                }
            },
            (State::Commit { r, tries, admit }, Event::Committed(answer)) => match answer {
                Ok(view) => {
                    self.committed(r, view.clone(), now, out);
                    (None, true)
                }
                Err(Unanswered::NewcomerGone(why))
                    if admit > 0 && tries < self.cfg.commit_tries =>
                {
                    warn!("the coordinator refused the commit ({why}); asking again");
                    self.query(r, tries + 1, now, out);
                    (None, true)
                }
                Err(Unanswered::Lost(why)) => {
                    warn!("the coordinator connection ended under the commit ({why}); asking the coordinator whether it was made");
                    out.push(Action::AskView {
                        epoch: r.old.epoch(),
                    });
                    self.wait(now, Step::CommitOutcome, self.cfg.step);
                    let lost = why.clone();
                    self.set(State::Outcome { r, tries, lost });
                    (None, true)
                }
                Err(Unanswered::MemberLost(why)) if self.cfg.recover => {
                    match self.loss {
                        Some(lost) => self.recover(lost, now, out),
                        None => {
                            // Its notice comes after the answer: wait for it.
                            debug!("the coordinator refused the commit ({why}); waiting for the notice of the loss");
                            self.wait(now, Step::Commit, self.cfg.step);
                            self.set(State::Refused { r });
                        }
                    }
                    (None, true)
                }
                Err(
                    Unanswered::NewcomerGone(why)
                    | Unanswered::Refused(why)
                    | Unanswered::MemberLost(why),
                ) => {
                    self.fail(Step::Commit, Cause::Refused(why.clone()), out);
                    (None, true)
                }
                Err(Unanswered::NoAnswer(why)) => {
                    self.fail(Step::Commit, Cause::NoAnswer(why.clone()), out);
                    (None, true)
                }
            },
            (State::Outcome { r, tries, lost }, Event::ViewNow(answer)) => {
                self.outcome(r, tries, lost, answer, now, out);
                (None, true)
            }
            (
                State::NewView { r },
                Event::Frame {
                    src: 0,
                    frame: ControlFrame::View(view),
                    ..
                },
            ) => {
                self.install(Some(r), view.clone(), now, out);
                (None, true)
            }
            (State::Admission, Event::Coordinator(ServerMsg::Integrate { node, view })) => {
                out.push(Action::Install {
                    view: view.clone(),
                    me: *node,
                });
                self.wait(now, Step::Reconcile { epoch: view.epoch }, self.cfg.step);
                self.set(State::Installing {
                    r: None,
                    epoch: view.epoch,
                });
                (None, true)
            }
            (State::Installing { r, epoch }, Event::Installed(result)) => match result {
                Ok(topo) => {
                    self.barrier(r, topo.clone(), now, out);
                    (None, true)
                }
                Err(e) => {
                    self.fail(Step::Reconcile { epoch }, Cause::Reconcile(e.clone()), out);
                    (None, true)
                }
            },
            (
                State::Barrier {
                    r,
                    topo,
                    wait: BarrierWait::Ready { ready },
                },
                Event::Frame {
                    epoch_bits,
                    frame: ControlFrame::Ready,
                    ..
                },
            ) if *epoch_bits == topo.epoch() & 0xffff => {
                let ready = ready + 1;
                if ready < topo.node_children(topo.my_node()).len() {
                    let wait = BarrierWait::Ready { ready };
                    return (Some(State::Barrier { r, topo, wait }), true);
                }
                self.barrier_up(r, topo, now, out);
                (None, true)
            }
            (
                State::Barrier {
                    r,
                    topo,
                    wait: BarrierWait::Go,
                },
                Event::Frame {
                    epoch_bits,
                    frame: ControlFrame::Go,
                    ..
                },
            ) if *epoch_bits == topo.epoch() & 0xffff => {
                self.barrier_done(r, topo, now, out);
                (None, true)
            }
            // Node 0 committed and recovers in the view it committed while
            // this node still drains (for totals the lost node was to
            // relay, say): it all rolls back, so the drain is not needed.
            // The frame is kept for the barrier of that view.
            (
                State::Drain { r, round: 2, .. },
                Event::Frame {
                    src: 0,
                    epoch_bits,
                    frame: ControlFrame::Recover { lost },
                },
            ) if self.cfg.recover
                && *lost != 0
                && !r.lost.iter().any(|&l| l)
                && *epoch_bits == (r.old.epoch() + 1) & 0xffff =>
            {
                debug!(
                    lost,
                    "node 0 recovers in the view committed; leaving the drain"
                );
                out.push(Action::Draining(false));
                out.push(Action::TakeLate);
                self.early.push_back(e.clone());
                if r.leaving {
                    self.wait(now, Step::Die, self.cfg.step);
                    self.set(State::Die { r });
                } else {
                    self.wait(now, Step::NewView, self.cfg.step);
                    self.set(State::NewView { r });
                }
                (None, true)
            }
            (
                state,
                Event::Frame {
                    src: 0,
                    epoch_bits,
                    frame: ControlFrame::Recover { lost },
                },
            ) if self
                .topo
                .as_ref()
                .is_some_and(|t| *epoch_bits == t.epoch() & 0xffff) =>
            {
                self.state = state;
                if !self
                    .topo
                    .as_ref()
                    .is_some_and(|t| (1..t.num_nodes()).contains(lost))
                {
                    warn!(
                        lost,
                        "dropping a Recover frame that names no node of the view but node 0"
                    );
                    return (None, true);
                }
                let recovering = match &self.state {
                    State::Recovering { lost: l, .. } => Some(*l == *lost),
                    _ => self
                        .rescale()
                        .filter(|r| r.lost.iter().any(|&l| l))
                        .map(|r| r.is_lost(*lost)),
                };
                match recovering {
                    Some(true) => {}
                    Some(false) => {
                        let uid = self.topo.as_ref().map_or(0, |t| t.uid_of(*lost));
                        self.fail_busy(Cause::MemberLost { node: *lost, uid }, out);
                    }
                    None if matches!(self.state, State::Running { .. })
                        || self.before_new_view().is_some() =>
                    {
                        self.recover(*lost, now, out)
                    }
                    // The view entered lost a member before its barrier.
                    None if matches!(self.state, State::Barrier { .. })
                        && self.entering(self.topo.as_ref().map_or(0, |t| t.epoch())) =>
                    {
                        let State::Barrier { r, topo, .. } =
                            std::mem::replace(&mut self.state, State::Moving)
                        else {
                            unreachable!("matched above");
                        };
                        self.resume_then_recover(r, topo, *lost, now, out);
                    }
                    // A later step of this node's (the next view's barrier): kept.
                    None => return (None, false),
                }
                (None, true)
            }
            (state, Event::SendFailed { to, error }) if !matches!(state, State::Running { .. }) => {
                self.state = state;
                let cause = Cause::Send {
                    to: *to,
                    error: error.clone(),
                };
                self.fail_busy(cause, out);
                (None, true)
            }
            (state, _) => (Some(state), false),
        }
    }
}

#[cfg(test)]
mod tests;
