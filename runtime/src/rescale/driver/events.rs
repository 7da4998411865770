//! What goes into the rescale driver and what comes out of it: its
//! configuration, events, actions, and the failure that names a step.
//! Plain data, shared by the driver, its shell and its tests.
//!
//! May touch: nothing.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ductile_coordinator::proto::{NodeId, ServerMsg, View};

use super::super::plan::Renumbering;
use super::super::{ControlFrame, Stage};
use crate::system::StopOrder;
use crate::topo::Topology;

/// How the drain's counts travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DrainMode {
    /// Summed up the node tree, totals down: one frame per tree edge.
    Tree,
    /// Every node tells every peer: N-1 frames out and in per node
    /// (`DUCTILE_DRAIN=all`, measurement only).
    AllToAll,
}

/// What a node's driver is set up with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Config {
    /// PEs of this node (one `PeStopped` and one `HandedOver` each).
    pub local_pes: usize,
    /// How the drain's counts travel.
    pub drain: DrainMode,
    /// The bound of each wait ([`super::StageBounds::step`]).
    pub step: Duration,
    /// How long a newcomer waits to be admitted.
    pub admission: Duration,
    /// Commits node 0 tries when newcomers vanish between query and commit.
    pub commit_tries: u32,
    /// A member lost without notice (not node 0) starts a recovery instead
    /// of ending the job (docs/elasticity.md, "Node loss without notice:
    /// design"). False in the shell: the PEs' rollback does not exist yet.
    pub recover: bool,
}

/// Envelope frames this node sent to and received from each node of its
/// epoch, indexed by node id (missing entries are zero).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Sent to node n.
    pub sent: Vec<u64>,
    /// Received from node n.
    pub received: Vec<u64>,
}

impl Counts {
    pub(super) fn sent_to(&self, n: NodeId) -> u64 {
        self.sent.get(n as usize).copied().unwrap_or(0)
    }

    pub(super) fn received_from(&self, n: NodeId) -> u64 {
        self.received.get(n as usize).copied().unwrap_or(0)
    }
}

/// Why node 0's question to the coordinator (the query for newcomers or
/// the commit) got no answer it can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unanswered {
    /// The commit asked for more newcomers than the coordinator had: one
    /// vanished between the query and the commit. Worth asking again.
    NewcomerGone(String),
    /// The coordinator refused it (its code and message).
    Refused(String),
    /// The coordinator refused the commit because it keeps a member
    /// announced lost: the job is to recover without it.
    MemberLost(String),
    /// The connection ended before the answer came (the coordinator was
    /// lost, or restarted). For a commit, whether the coordinator carried
    /// it out is not known: node 0 asks for the coordinator's view to
    /// learn it ([`Action::AskView`]).
    Lost(String),
    /// No usable answer on a live connection (it timed out, or was not a
    /// frame of the protocol).
    NoAnswer(String),
}

impl Unanswered {
    /// What went wrong, as the client said it.
    pub(crate) fn message(&self) -> &str {
        match self {
            Unanswered::NewcomerGone(m)
            | Unanswered::Refused(m)
            | Unanswered::MemberLost(m)
            | Unanswered::Lost(m)
            | Unanswered::NoAnswer(m) => m,
        }
    }
}

/// What the shell tells the driver.
#[derive(Clone, Debug)]
pub(crate) enum Event {
    /// A local PE stopped for the rescale `order` (its plan included).
    PeStopped(StopOrder),
    /// A local PE handed over.
    HandedOver,
    /// The frame counts now (the shell sends them before `PeStopped` and
    /// `HandedOver`, after [`Action::Draining`]`(true)`, and whenever an
    /// envelope frame arrived while draining).
    Counts(Counts),
    /// A control frame from node `src`, tagged with the low 16 bits of the
    /// sender's epoch.
    Frame {
        /// The sender.
        src: NodeId,
        /// Low 16 bits of the epoch the frame was sent in.
        epoch_bits: u64,
        /// The frame.
        frame: ControlFrame,
    },
    /// A notice from the coordinator.
    Coordinator(ServerMsg),
    /// Answer to [`Action::QueryPending`]: newcomers waiting.
    Pending(Result<u32, Unanswered>),
    /// Answer to [`Action::Commit`].
    Committed(Result<View, Unanswered>),
    /// Answer to [`Action::AskView`]: the coordinator's view now, or why
    /// it could not be learned within the bound.
    ViewNow(Result<View, ViewUnanswered>),
    /// Answer to [`Action::Install`]: the installed topology.
    Installed(Result<Arc<Topology>, String>),
    /// An [`Action::Send`] failed.
    SendFailed {
        /// The node it was for.
        to: NodeId,
        /// Why.
        error: String,
    },
    /// The node is aborting (a peer was lost, an error elsewhere).
    Aborting,
    /// Time passed (the shell's wait ended with no event).
    Tick,
}

/// What the driver asks the shell to do, in order.
#[derive(Clone, Debug)]
pub(crate) enum Action {
    /// Send a control frame to `to`, tagged with `epoch`.
    Send {
        /// The node.
        to: NodeId,
        /// The epoch to tag it with.
        epoch: u64,
        /// The frame.
        frame: ControlFrame,
    },
    /// Report envelope frames as they arrive (`Event::Counts`), or stop.
    Draining(bool),
    /// Tell every local PE to hand over.
    HandOver {
        /// This node leaves.
        leaving: bool,
    },
    /// Every envelope of the old epoch arrived: take them out of the
    /// inboxes now, before the first of the new epoch lands there.
    TakeLate,
    /// Node 0: a stage of the rescale ended (the shell times it).
    StageEnded(Stage),
    /// Node 0: ask the coordinator how many newcomers wait.
    QueryPending {
        /// The epoch being left.
        epoch: u64,
    },
    /// Node 0: commit at the coordinator.
    Commit {
        /// The epoch being left.
        epoch: u64,
        /// Nodes removed.
        remove: Vec<NodeId>,
        /// Newcomers admitted.
        admit: u32,
    },
    /// Node 0, after the coordinator connection ended under its commit:
    /// ask the coordinator (the same one reached again, or the one the
    /// launcher restarted and this node restores) for its current view,
    /// to learn whether the commit was made. Answered by
    /// [`Event::ViewNow`].
    AskView {
        /// The epoch being left.
        epoch: u64,
    },
    /// Reconcile endpoints with `view`, in which this node is `me`, and
    /// install it.
    Install {
        /// The committed view.
        view: View,
        /// This node's id in it.
        me: NodeId,
    },
    /// Resume the local PEs in the new view.
    Resume {
        /// The view left.
        old: Arc<Topology>,
        /// The view joined.
        new: Arc<Topology>,
        /// Old PE numbers to new ones.
        plan: Renumbering,
        /// A recovery: every PE rolls back to its last buddy checkpoint and
        /// the lost node's chares are restored from their buddies' copies.
        rollback: bool,
    },
    /// A recovery: every local PE stops where it is, drops its work in
    /// progress and answers [`Event::PeStopped`] (it rolls back later, at
    /// [`Action::Resume`]). PEs that stopped for a rescale this recovery
    /// abandons stay stopped and answer nothing.
    Recover {
        /// The recovery's plan (the lost node removed).
        order: StopOrder,
    },
    /// A recovery: every envelope of the failed epoch between survivors
    /// arrived; drop them from the inboxes, unread.
    Discard,
    /// A newcomer was admitted and passed the barrier: start its PEs.
    Joined {
        /// Its node id.
        me: NodeId,
    },
    /// This node was removed: end its PEs.
    Depart,
    /// The rescale failed on this node: end the job. When a member was
    /// lost ([`Cause::MemberLost`]), the loss is said once for the job
    /// (by the lowest-numbered survivor), naming the step.
    Fail(Failure),
    /// No rescale runs, but the coordinator reported member `node` lost:
    /// the job ends, the loss said once for the job.
    PeerLost {
        /// Its id in this node's view.
        node: NodeId,
        /// Its uid.
        uid: u64,
    },
}

/// A wait of the protocol, named in errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Tree drain: the counts of this node's subtree.
    DrainCounts {
        /// Drain round (1 before the hand-over, 2 after; a recovery's: 3).
        round: u8,
        /// This node.
        node: NodeId,
    },
    /// Tree drain: the totals from the parent.
    DrainTotals {
        /// Drain round.
        round: u8,
        /// The parent.
        parent: NodeId,
    },
    /// The frames counted as sent to this node.
    DrainFrames {
        /// Drain round.
        round: u8,
        /// How many.
        expect: u64,
    },
    /// All-to-all drain: every peer's count.
    DrainPeers {
        /// Drain round.
        round: u8,
    },
    /// The local PEs' hand-over.
    HandOver,
    /// A departing node: the coordinator's Die.
    Die,
    /// Node 0: the coordinator's count of newcomers.
    Pending,
    /// Node 0: the commit.
    Commit,
    /// Node 0: the commit's outcome, asked of the coordinator after the
    /// connection ended under the commit.
    CommitOutcome,
    /// A survivor: the committed view from node 0.
    NewView,
    /// Reconciling endpoints with the committed view.
    Reconcile {
        /// Its epoch.
        epoch: u64,
    },
    /// Barrier: the children of the new view's node tree.
    BarrierReady,
    /// Barrier: the release from the parent.
    BarrierGo,
    /// A newcomer: the coordinator's Integrate.
    Admission,
    /// A recovery: the local PEs stopping.
    Recover,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::DrainCounts { round, node } => {
                write!(
                    f,
                    "drain round {round} (the counts of node {node}'s subtree)"
                )
            }
            Step::DrainTotals { round, parent } => {
                write!(f, "drain round {round} (the totals from node {parent})")
            }
            Step::DrainFrames { round, expect } => {
                write!(f, "drain round {round} ({expect} frames)")
            }
            Step::DrainPeers { round } => write!(f, "drain round {round} (every peer's count)"),
            Step::HandOver => f.write_str("the PEs' hand-over"),
            Step::Die => f.write_str("Die from the coordinator"),
            Step::Pending => f.write_str("the newcomers waiting at the coordinator"),
            Step::Commit => f.write_str("the commit"),
            Step::CommitOutcome => f.write_str(
                "the commit's outcome (the coordinator connection ended before its answer)",
            ),
            Step::NewView => f.write_str("the new view from node 0"),
            Step::Reconcile { epoch } => write!(f, "reconciling endpoints with epoch {epoch}"),
            Step::BarrierReady => f.write_str("the barrier (children ready)"),
            Step::BarrierGo => f.write_str("the barrier (release)"),
            Step::Admission => f.write_str("admission"),
            Step::Recover => f.write_str("the PEs stopping for a recovery"),
        }
    }
}

/// Why a step failed.
/// Why node 0 could not read the coordinator's view after a connection
/// ended under its commit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the coordinator at {addr} did not answer within {bound:?} (last: {last})")]
pub(crate) struct ViewUnanswered {
    /// The coordinator's address.
    pub(crate) addr: String,
    /// How long node 0 asked.
    pub(crate) bound: Duration,
    /// The last thing that went wrong.
    pub(crate) last: String,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Cause {
    /// Its deadline passed.
    #[error("timed out after {0:?}")]
    TimedOut(Duration),
    /// The coordinator reported a member lost.
    #[error("node {node} (uid {uid}) was lost during the rescale")]
    MemberLost {
        /// Its id.
        node: NodeId,
        /// Its uid.
        uid: u64,
    },
    /// The node is aborting.
    #[error("the node is aborting")]
    Aborting,
    /// The node is shutting down (its event channel closed).
    #[error("the node is shutting down")]
    ShuttingDown,
    /// A drain frame whose counts do not fit the view.
    #[error("node {src}: {counts} counts for a view of {nodes} nodes")]
    Counts {
        /// The sender.
        src: NodeId,
        /// Counts it sent.
        counts: usize,
        /// Nodes of the view.
        nodes: u32,
    },
    /// Counts that overflow.
    #[error("node {src}: frame counts overflow")]
    Overflow {
        /// The sender.
        src: NodeId,
    },
    /// The request's plan is for another view.
    #[error("the plan is for {planned} nodes of epoch {epoch}, this view has {nodes}")]
    Plan {
        /// The request's epoch.
        epoch: u64,
        /// Nodes the plan covers.
        planned: usize,
        /// Nodes of this view.
        nodes: u32,
    },
    /// The coordinator did not answer the query.
    #[error("asking the coordinator for newcomers: {0}")]
    Pending(String),
    /// The coordinator refused the commit.
    #[error("the coordinator refused the commit: {0}")]
    Refused(String),
    /// The commit got no answer on a live connection.
    #[error("the coordinator did not answer the commit: {0}")]
    NoAnswer(String),
    /// The coordinator connection ended under the commit, and the tries
    /// to learn its outcome or to commit again ran out.
    #[error("the coordinator connection ended under the commit {tries} times: {last}")]
    LostAgain {
        /// Commits tried.
        tries: u32,
        /// The last loss.
        last: String,
    },
    /// The coordinator's view could not be read after the connection
    /// ended under the commit: whether it was made is unknown.
    #[error("whether the commit was made could not be learned: {0}")]
    Unlearned(ViewUnanswered),
    /// The coordinator's view is neither the one left nor one this commit
    /// could have made.
    #[error("the coordinator's view (epoch {epoch}) is not the one this rescale left (epoch {left}) nor the commit it asked for")]
    Diverged {
        /// The coordinator's epoch.
        epoch: u64,
        /// The epoch the rescale leaves.
        left: u64,
    },
    /// This node is not in the committed view.
    #[error("this node (uid {uid}) is not in the committed view")]
    NotInView {
        /// Its uid.
        uid: u64,
    },
    /// Endpoints could not be reconciled.
    #[error("{0}")]
    Reconcile(String),
    /// A frame could not be sent.
    #[error("sending to node {to}: {error}")]
    Send {
        /// The node.
        to: NodeId,
        /// Why.
        error: String,
    },
}

/// A rescale that failed on this node, and the step it failed in.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{step}: {cause}")]
pub(crate) struct Failure {
    /// Where.
    pub step: Step,
    /// Why.
    pub cause: Cause,
    /// When the rescale was a recovery: the node (of the view it left)
    /// whose loss it recovered from.
    pub recovering: Option<NodeId>,
}
