//! The node's side of a rescale: the driver that runs on each node's main
//! thread while its PEs are stopped (DESIGN.md, "Launch and rescale",
//! steps 2-6), and the desk where node 0 keeps the request being served.
//!
//! Once every local PE has stopped, the driver
//!
//! 1. drains the network: it tells every peer how many envelope frames it
//!    sent it in this epoch and waits until it received as many from each
//!    peer (counting, not ordering, so it holds for any transport);
//! 2. has its PEs hand over (a departing node's PEs send what they hold to
//!    PE 0) and drains again;
//! 3. on node 0, asks the coordinator for the pending newcomers and commits;
//!    node 0 sends the new view to the survivors over the transport; a
//!    departing node waits for the coordinator's Die and ends;
//! 4. reconciles transport endpoints with the new view and installs it;
//! 5. passes a barrier up and down the node-level tree of the new view;
//! 6. tells its PEs to re-enter ([`crate::pe::PeCommand::Resume`]).
//!
//! Newcomers join at step 4: they waited, registered, with endpoints built
//! speculatively from the view they were given.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use ductile_coordinator::client::ClientError;
use ductile_coordinator::control::{RescaleReport, StageTime};
use ductile_coordinator::proto::{ErrorCode, NodeId, ServerMsg, View};
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use crate::link::CoordinatorLink;
use crate::msg::Envelope;
use crate::node::NodeShared;
use crate::pe::{LoopExit, PeCommand, Reentry};
use crate::system::StopOrder;
use crate::topo::Topology;

/// How long any one step of a rescale may wait for its peers, by default.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// Environment variable: the bound of every wait of a rescale, in ms
/// (default 30,000). The evacuate stage gets the same bound; each step of
/// the node drivers (a drain round, the hand-over, the commit, the barrier)
/// and each of PE 0's later stages too.
pub(crate) const ENV_STAGE_TIMEOUT_MS: &str = "DUCTILE_RESCALE_STAGE_TIMEOUT_MS";

/// How long each stage of a rescale may take (docs/elasticity.md,
/// "Bounds"). Read once per node from [`ENV_STAGE_TIMEOUT_MS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StageBounds {
    /// The evacuate stage, waiting for load-balancing steps in progress
    /// included. Past it the rescale is abandoned: nothing was committed.
    pub evacuate: Duration,
    /// One wait of a node driver, and each of PE 0's stages after the
    /// commit (reentry, state, balance).
    pub step: Duration,
}

impl StageBounds {
    /// The bounds this process runs with.
    pub(crate) fn get() -> StageBounds {
        static BOUNDS: std::sync::OnceLock<StageBounds> = std::sync::OnceLock::new();
        *BOUNDS.get_or_init(|| {
            let step = std::env::var(ENV_STAGE_TIMEOUT_MS)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|&ms| ms > 0)
                .map_or(STEP_TIMEOUT, Duration::from_millis);
            StageBounds {
                evacuate: step,
                step,
            }
        })
    }

    /// The stop, commit and reconcile stages are bounded by the node
    /// drivers' own waits (a few steps each); this is node 0's backstop
    /// over all of them together.
    fn driver_backstop(&self) -> Duration {
        self.step * 8
    }
}

/// What node 0 does about a rescale whose stage ran past its bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Overdue {
    /// Nothing was committed: drop the rescale, the job goes on at its size.
    Abandon(String),
    /// The commit happened (or may have): end the job with this error.
    Fail(String),
}

/// Whether a rescale that has been in `stage` for `elapsed` ran past its
/// bound, and what to do then. Pure, so it is tested in virtual time.
pub(crate) fn overdue(stage: Stage, elapsed: Duration, bounds: &StageBounds) -> Option<Overdue> {
    let over = |bound: Duration| elapsed > bound;
    match stage {
        Stage::Evacuate if over(bounds.evacuate) => Some(Overdue::Abandon(format!(
            "stage evacuate did not end within {:?}",
            bounds.evacuate
        ))),
        Stage::Stop | Stage::Commit | Stage::Reconcile if over(bounds.driver_backstop()) => {
            Some(Overdue::Fail(format!(
                "stage {} did not end within {:?}",
                stage.name(),
                bounds.driver_backstop()
            )))
        }
        Stage::Reentry | Stage::State | Stage::Balance if over(bounds.step) => {
            Some(Overdue::Fail(format!(
                "stage {} did not end within {:?}",
                stage.name(),
                bounds.step
            )))
        }
        _ => None,
    }
}

/// The stages of a rescale, in protocol order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Load balancing that empties the departing PEs.
    Evacuate,
    /// Stopping every PE, draining the network, hand-over.
    Stop,
    /// Pending newcomers and the commit at the coordinator.
    Commit,
    /// The new view to survivors, endpoint reconciliation, tree barrier.
    Reconcile,
    /// PE 0's re-entry: queues translated, locations rebuilt.
    Reentry,
    /// Newcomers adopting readonly data and collections.
    State,
    /// Load balancing that populates the newcomers.
    Balance,
}

impl Stage {
    /// The stage after this one (`None` after the last).
    pub(crate) fn next(self) -> Option<Stage> {
        Some(match self {
            Stage::Evacuate => Stage::Stop,
            Stage::Stop => Stage::Commit,
            Stage::Commit => Stage::Reconcile,
            Stage::Reconcile => Stage::Reentry,
            Stage::Reentry => Stage::State,
            Stage::State => Stage::Balance,
            Stage::Balance => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Stage::Evacuate => "evacuate",
            Stage::Stop => "stop",
            Stage::Commit => "commit",
            Stage::Reconcile => "reconcile",
            Stage::Reentry => "reentry",
            Stage::State => "state",
            Stage::Balance => "balance",
        }
    }

    /// Whether the stage is the load balancer's work, reported apart from
    /// the mechanism.
    fn is_balancing(self) -> bool {
        matches!(self, Stage::Evacuate | Stage::Balance)
    }
}

impl StopOrder {
    pub(crate) fn request(&self) -> crate::elastic::RescaleRequest {
        crate::elastic::RescaleRequest {
            epoch: self.epoch,
            remove: self.remove.clone(),
            admit: self.admit,
        }
    }
}

/// Node 0's record of the rescale being served: the request, where its
/// answer goes, and the stage times measured so far (by PE 0 and by the
/// node driver).
pub(crate) struct Desk {
    pub order: StopOrder,
    reply: Sender<Result<RescaleReport, String>>,
    started: Instant,
    pes_before: u32,
    old_members: usize,
    stages: Vec<(Stage, f64)>,
    pub migrations: u64,
    /// When PE 0 told every PE to stop.
    pub stop_sent: Option<Instant>,
    /// When node 0's barrier completed (re-entry starts).
    pub reentry_from: Option<Instant>,
    /// GPU work inside the stages: device staging of migrated chares
    /// (summed over PEs), contexts created on the critical path (node 0's;
    /// only in the measurement mode of `gpu::ENV_CONTEXT_ON_REENTRY`).
    pub gpu_staging_ms: f64,
    pub gpu_context_ms: Option<f64>,
    /// The stage in progress, and since when (what node 0's watchdog
    /// checks against [`StageBounds`]).
    pub stage: Stage,
    pub stage_since: Instant,
    /// Set by node 0's watchdog: PE 0 drops the rescale if it has not
    /// told the PEs to stop yet (the reason goes to the tool).
    pub abandon: Option<String>,
}

impl Desk {
    pub(crate) fn new(
        order: StopOrder,
        old: &View,
        reply: Sender<Result<RescaleReport, String>>,
    ) -> Self {
        Desk {
            order,
            reply,
            started: Instant::now(),
            pes_before: old.total_pes(),
            old_members: old.members.len(),
            stages: Vec::new(),
            migrations: 0,
            stop_sent: None,
            reentry_from: None,
            gpu_staging_ms: 0.0,
            gpu_context_ms: None,
            stage: Stage::Evacuate,
            stage_since: Instant::now(),
            abandon: None,
        }
    }

    /// `stage` ended after `ms`; the next one begins.
    pub(crate) fn record(&mut self, stage: Stage, ms: f64) {
        self.stages.push((stage, ms));
        if let Some(next) = stage.next() {
            self.stage = next;
            self.stage_since = Instant::now();
        }
    }

    /// Sends the answer: the report against `view` (the job's view now), or the error.
    pub(crate) fn answer(self, view: &View, result: Result<(), String>) {
        let report = result.map(|()| {
            let mut stages = self.stages.clone();
            stages.sort_by_key(|(s, _)| *s as u8);
            let mechanism_ms = stages
                .iter()
                .filter(|(s, _)| !s.is_balancing())
                .map(|(_, ms)| ms)
                .sum();
            // Survivors keep their order at the front; newcomers follow.
            let survivors = (self.old_members - self.order.remove.len()) as NodeId;
            let mut gpu = Vec::new();
            if let Some(ms) = self.gpu_context_ms {
                gpu.push(StageTime {
                    stage: "context".into(),
                    ms,
                });
            }
            if self.gpu_staging_ms > 0.0 {
                gpu.push(StageTime {
                    stage: "staging".into(),
                    ms: self.gpu_staging_ms,
                });
            }
            RescaleReport {
                epoch_before: self.order.epoch,
                epoch: view.epoch,
                removed: self.order.remove.clone(),
                admitted: (survivors..view.members.len() as NodeId).collect(),
                pes_before: self.pes_before,
                pes: view.total_pes(),
                migrations: self.migrations,
                stages: stages
                    .into_iter()
                    .map(|(s, ms)| StageTime {
                        stage: s.name().into(),
                        ms,
                    })
                    .collect(),
                mechanism_ms,
                total_ms: self.started.elapsed().as_secs_f64() * 1e3,
                gpu,
            }
        });
        if let Ok(r) = &report {
            // One line per rescale where the job runs (its stderr), so a
            // rescale is visible without asking for it.
            eprintln!(
                "ductile: rescaled epoch {} -> {}: nodes {} -> {}, PEs {} -> {}, {:.1} ms (mechanism)",
                r.epoch_before,
                r.epoch,
                self.old_members,
                view.members.len(),
                r.pes_before,
                r.pes,
                r.mechanism_ms
            );
        }
        let _ = self.reply.send(report);
    }
}

/// A node-level frame of the rescale protocol (transport kind
/// [`crate::transport::kind::CONTROL`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum ControlFrame {
    /// Drain round `round`, all-to-all: the sender sent `sent` envelope
    /// frames to the receiver in this epoch.
    Drain { round: u8, sent: u64 },
    /// Drain round `round`, up the node tree: the envelope frames the
    /// sender's subtree sent to each node of the epoch (`sent[n]` to node n).
    DrainUp { round: u8, sent: Vec<u64> },
    /// Drain round `round`, down the node tree: the envelope frames sent to
    /// each node of the epoch by all the others.
    DrainDown { round: u8, totals: Vec<u64> },
    /// From node 0 to each survivor: the committed view.
    View(View),
    /// Barrier, up the node tree of the new view: this subtree is ready.
    Ready,
    /// Barrier, down the tree: everyone is ready.
    Go,
}

/// What the node's main thread hears about.
pub(crate) enum NodeEvent {
    /// A PE stopped for a rescale.
    Stopped { order: StopOrder },
    /// A PE handed over (drained its inbox; sent what it held if departing).
    HandedOver,
    /// A PE's thread ended.
    Exited { rank: usize, exit: LoopExit },
    /// A control frame from node `src` (numbered in the tag's epoch).
    Frame {
        src: NodeId,
        epoch_bits: u64,
        frame: ControlFrame,
    },
    /// An envelope frame arrived while the node drains.
    Counted,
    /// A notice from the coordinator.
    Coordinator(ServerMsg),
}

/// What a wait's predicate makes of an event.
pub(crate) enum Pick<T> {
    /// Not for this wait: keep it for a later one.
    Keep,
    /// Consumed; keep waiting.
    Took,
    /// Consumed; the wait is over. Only for an event the wait consumes (or
    /// `None`): a wait whose condition became true by itself must `Keep` an
    /// event meant for another, and finish on the next `None` poll, or that
    /// event is lost.
    Done(T),
}

/// Envelope frames sent to and received from each peer in this epoch.
#[derive(Default)]
pub(crate) struct FrameCounts {
    pub sent: HashMap<NodeId, u64>,
    pub received: HashMap<NodeId, u64>,
}

/// How a node's PEs ended, as the driver saw it.
pub(crate) struct Driver {
    node: Arc<NodeShared>,
    events: Receiver<NodeEvent>,
    commands: Vec<Sender<PeCommand>>,
    client: Arc<CoordinatorLink>,
    /// Control frames and PE events that arrived before they were awaited.
    early: VecDeque<NodeEvent>,
    exits: Vec<Option<LoopExit>>,
    stopped: usize,
}

impl Driver {
    pub(crate) fn new(
        node: Arc<NodeShared>,
        events: Receiver<NodeEvent>,
        client: Arc<CoordinatorLink>,
    ) -> Self {
        Driver {
            node,
            events,
            commands: Vec::new(),
            client,
            early: VecDeque::new(),
            exits: Vec::new(),
            stopped: 0,
        }
    }

    /// The PEs' command channels, once they run.
    pub(crate) fn attach(&mut self, commands: Vec<Sender<PeCommand>>) {
        self.exits = vec![None; commands.len()];
        self.commands = commands;
    }

    /// Serves the node until every PE ended; returns how the job ended here.
    pub(crate) fn run(&mut self) -> LoopExit {
        loop {
            let event = match self.events.recv_timeout(Duration::from_millis(100)) {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return LoopExit::Aborted,
            };
            match event {
                NodeEvent::Exited { rank, exit } => {
                    self.exits[rank] = Some(exit);
                    if self.exits.iter().all(Option::is_some) {
                        return combine(self.exits.iter().flatten().copied());
                    }
                }
                NodeEvent::Stopped { order, .. } => {
                    self.stopped += 1;
                    if self.stopped == self.commands.len() {
                        self.stopped = 0;
                        if let Err(e) = self.rescale(&order) {
                            let stage = self
                                .node
                                .with_desk(|d| format!(" in stage {}", d.stage.name()))
                                .unwrap_or_default();
                            self.node
                                .abort(format!("rescale failed{stage}: {e}; ending the job"));
                            self.node.finish_rescale(Err(format!(
                                "the rescale failed{stage}: {e}; the job ends"
                            )));
                            self.command_all(|| PeCommand::Depart);
                        }
                    }
                }
                NodeEvent::Coordinator(ServerMsg::MemberLost { node, uid, .. }) => self.node.abort(
                    format!("node {node} (uid {uid}) left the job unexpectedly; ending the job"),
                ),
                NodeEvent::Coordinator(other) => debug!("coordinator notice {other:?}"),
                e @ NodeEvent::Frame { .. } => self.early.push_back(e),
                NodeEvent::Counted | NodeEvent::HandedOver => {}
            }
        }
    }

    fn command_all(&self, cmd: impl Fn() -> PeCommand) {
        for c in &self.commands {
            let _ = c.send(cmd());
        }
    }

    /// Feeds events to `pick` (those that arrived early first, in order)
    /// until it says `Done`; `pick(None)` is a tick on which it may check
    /// counters. Events it keeps stay for later waits. `what` names the
    /// wait in errors.
    pub(crate) fn wait_for<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pick: impl FnMut(Option<&NodeEvent>) -> Pick<T>,
    ) -> Result<T, String> {
        let early = std::mem::take(&mut self.early);
        let mut rest = early.into_iter();
        while let Some(e) = rest.next() {
            match pick(Some(&e)) {
                Pick::Keep => self.early.push_back(e),
                Pick::Took => {}
                Pick::Done(t) => {
                    self.early.extend(rest);
                    return Ok(t);
                }
            }
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Pick::Done(t) = pick(None) {
                return Ok(t);
            }
            if self.node.aborting() {
                return Err(format!("the node is aborting while waiting for {what}"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("timed out after {timeout:?} waiting for {what}"));
            }
            let e = match self.events.recv_timeout(left.min(Duration::from_millis(1))) {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err("the node is shutting down".into())
                }
            };
            match pick(Some(&e)) {
                Pick::Done(t) => return Ok(t),
                Pick::Took => {}
                Pick::Keep => match e {
                    NodeEvent::Coordinator(ServerMsg::MemberLost { node, uid, .. }) => {
                        return Err(format!(
                            "node {node} (uid {uid}) was lost during the rescale"
                        ))
                    }
                    // A later step of this rescale waits for these (Die can
                    // come while a departing node still drains).
                    e @ NodeEvent::Coordinator(
                        ServerMsg::Die { .. } | ServerMsg::Integrate { .. },
                    ) => self.early.push_back(e),
                    NodeEvent::Counted | NodeEvent::Coordinator(_) => {}
                    e => self.early.push_back(e),
                },
            }
        }
    }

    /// Runs one rescale on this node; PEs are all stopped.
    fn rescale(&mut self, order: &StopOrder) -> Result<(), String> {
        let node = self.node.clone();
        let view = node.view().ok_or("no view")?;
        let old = node.current_topology();
        let me = old.my_node();
        let plan = crate::elastic::plan(&view, &order.request()).map_err(|e| e.to_string())?;
        let leaving = plan.node_map[me as usize].is_none();
        // One tree per rescale in the logs (`DUCTILE_LOG=ductile=debug`,
        // docs/metrics.md): its stages are children, timed when they close.
        let _rescale = tracing::debug_span!("rescale", epoch = old.epoch(), node = me).entered();
        let stop = tracing::debug_span!("stop").entered();
        debug!(node = me, leaving, "all PEs stopped; draining");
        node.set_draining(true);
        self.drain(1, &old)?;
        self.command_all(|| PeCommand::HandOver { leaving });
        let local = self.commands.len();
        let mut handed = 0;
        self.wait_for("the PEs' hand-over", StageBounds::get().step, |e| match e {
            Some(NodeEvent::HandedOver) => {
                handed += 1;
                if handed == local {
                    Pick::Done(())
                } else {
                    Pick::Took
                }
            }
            _ => Pick::Keep,
        })?;
        self.drain(2, &old)?;
        node.set_draining(false);
        drop(stop);
        // Everything sent in the old view has arrived: take it out of the
        // inboxes now, before the first message of the new view can land there.
        let late: Vec<Vec<Envelope>> = (0..local)
            .map(|rank| node.inboxes[rank].take_all())
            .collect();
        if me == 0 {
            node.with_desk(|d| {
                if let Some(t) = d.stop_sent {
                    d.record(Stage::Stop, ms_since(t));
                }
            });
        }
        if leaving {
            self.wait_for(
                "Die from the coordinator",
                StageBounds::get().step,
                |e| match e {
                    Some(NodeEvent::Coordinator(ServerMsg::Die { .. })) => Pick::Done(()),
                    _ => Pick::Keep,
                },
            )?;
            info!(node = me, "removed by the rescale; leaving the job");
            self.command_all(|| PeCommand::Depart);
            return Ok(());
        }
        let commit = tracing::debug_span!("commit").entered();
        let next = if me == 0 {
            let t = Instant::now();
            let next = self.commit(order)?;
            node.with_desk(|d| d.record(Stage::Commit, ms_since(t)));
            for m in &view.members {
                if m.node != 0 && plan.node_map[m.node as usize].is_some() {
                    node.send_control(m.node, old.epoch(), &ControlFrame::View(next.clone()))
                        .map_err(|e| format!("sending the new view to node {}: {e}", m.node))?;
                }
            }
            next
        } else {
            self.wait_for(
                "the new view from node 0",
                StageBounds::get().step,
                |e| match e {
                    Some(NodeEvent::Frame {
                        src: 0,
                        frame: ControlFrame::View(v),
                        ..
                    }) => Pick::Done(v.clone()),
                    _ => Pick::Keep,
                },
            )?
        };
        drop(commit);
        let _reconcile = tracing::debug_span!("reconcile").entered();
        let t = Instant::now();
        let uid = old.my_uid();
        let new_me = next
            .by_uid(uid)
            .map(|m| m.node)
            .ok_or_else(|| format!("this node (uid {uid}) is not in the committed view"))?;
        let new = self.join_view(next, new_me)?;
        if me == 0 {
            node.with_desk(|d| {
                d.record(Stage::Reconcile, ms_since(t));
                d.reentry_from = Some(Instant::now());
            });
        }
        // Measurement only: contexts re-created here are on the critical
        // path, inside node 0's re-entry stage.
        if let Some(ms) = crate::gpu::context_on_reentry() {
            node.with_desk(|d| d.gpu_context_ms = Some(ms));
        }
        let reentry = Arc::new(Reentry { old, new, plan });
        for (c, late) in self.commands.iter().zip(late) {
            let _ = c.send(PeCommand::Resume(reentry.clone(), late));
        }
        Ok(())
    }

    /// Reconciles endpoints with `view` (this node is `me` in it), installs
    /// it, and passes the barrier of its node tree.
    pub(crate) fn join_view(&mut self, view: View, me: NodeId) -> Result<Arc<Topology>, String> {
        let node = self.node.clone();
        let r = node
            .transport()
            .reconcile(&view, me)
            .map_err(|e| format!("reconciling endpoints with epoch {}: {e}", view.epoch))?;
        debug!(
            kept = r.kept,
            opened = r.opened,
            closed = r.closed,
            "endpoints reconciled"
        );
        let topo = node.install_view(view, me);
        self.barrier(&topo)?;
        Ok(topo)
    }

    /// Up and down the node-level tree of `topo`, over its endpoints.
    fn barrier(&mut self, topo: &Topology) -> Result<(), String> {
        let node = self.node.clone();
        let (me, epoch) = (topo.my_node(), topo.epoch());
        let bits = epoch & 0xffff;
        let children = topo.node_children(me);
        let mut ready = 0;
        if !children.is_empty() {
            self.wait_for(
                "the barrier (children ready)",
                StageBounds::get().step,
                |e| match e {
                    Some(NodeEvent::Frame {
                        frame: ControlFrame::Ready,
                        epoch_bits,
                        ..
                    }) if *epoch_bits == bits => {
                        ready += 1;
                        if ready == children.len() {
                            Pick::Done(())
                        } else {
                            Pick::Took
                        }
                    }
                    _ => Pick::Keep,
                },
            )?;
        }
        if let Some(parent) = topo.node_parent(me) {
            node.send_control(parent, epoch, &ControlFrame::Ready)
                .map_err(|e| format!("barrier: {e}"))?;
            self.wait_for(
                "the barrier (release)",
                StageBounds::get().step,
                |e| match e {
                    Some(NodeEvent::Frame {
                        frame: ControlFrame::Go,
                        epoch_bits,
                        ..
                    }) if *epoch_bits == bits => Pick::Done(()),
                    _ => Pick::Keep,
                },
            )?;
        }
        for c in children {
            node.send_control(c, epoch, &ControlFrame::Go)
                .map_err(|e| format!("barrier: {e}"))?;
        }
        Ok(())
    }

    /// Waits until every envelope frame sent in `topo`'s epoch, before this
    /// round, has arrived. By default over the node tree
    /// ([`Self::drain_tree`]); `DUCTILE_DRAIN=all` (measurement only) has
    /// every node tell every peer ([`Self::drain_all_to_all`]).
    fn drain(&mut self, round: u8, topo: &Topology) -> Result<(), String> {
        if std::env::var("DUCTILE_DRAIN").ok().as_deref() == Some("all") {
            self.drain_all_to_all(round, topo)
        } else {
            self.drain_tree(round, topo)
        }
    }

    /// Tells every peer of `topo` how many frames it was sent, and waits
    /// until as many arrived here from each: N-1 frames out and in per node.
    fn drain_all_to_all(&mut self, round: u8, topo: &Topology) -> Result<(), String> {
        let node = self.node.clone();
        let me = topo.my_node();
        let peers: Vec<NodeId> = (0..topo.num_nodes()).filter(|&n| n != me).collect();
        for &p in &peers {
            let sent = node.frames_sent_to(p);
            node.send_control(p, topo.epoch(), &ControlFrame::Drain { round, sent })
                .map_err(|e| format!("drain: {e}"))?;
        }
        let bits = topo.epoch() & 0xffff;
        let mut expected: HashMap<NodeId, u64> = HashMap::new();
        let what = format!("drain round {round}");
        self.wait_for(&what, StageBounds::get().step, |e| {
            let took = match e {
                Some(NodeEvent::Frame {
                    src,
                    epoch_bits,
                    frame: ControlFrame::Drain { round: r, sent },
                }) if *r == round && *epoch_bits == bits => {
                    expected.insert(*src, *sent);
                    true
                }
                Some(NodeEvent::Counted) | None => true,
                Some(_) => false,
            };
            let complete = expected.len() == peers.len()
                && expected
                    .iter()
                    .all(|(&src, &n)| node.frames_received_from(src) >= n);
            match (complete, took) {
                (true, true) => Pick::Done(()),
                (false, true) => Pick::Took,
                // Done or not, another wait's event is kept for it.
                (_, false) => Pick::Keep,
            }
        })
    }

    /// The drain over the node tree of `topo`: each subtree's counts of
    /// frames sent to every node are summed on the way up, the totals come
    /// back down, and each node waits until it has received its total. A
    /// node sends and receives one frame per tree edge, not one per peer.
    ///
    /// Sums suffice: from each peer a node receives at most what that peer
    /// sent it (PEs are stopped, so the counts taken here are final until
    /// the next round), so a total received equal to the total sent means
    /// every peer's frames arrived.
    fn drain_tree(&mut self, round: u8, topo: &Topology) -> Result<(), String> {
        let node = self.node.clone();
        let (me, epoch, n) = (topo.my_node(), topo.epoch(), topo.num_nodes());
        let bits = epoch & 0xffff;
        let mut sum: Vec<u64> = (0..n)
            .map(|p| if p == me { 0 } else { node.frames_sent_to(p) })
            .collect();
        let children = topo.node_children(me);
        if !children.is_empty() {
            let mut heard = 0;
            let what = format!("drain round {round} (the counts of node {me}'s subtree)");
            self.wait_for(&what, StageBounds::get().step, |e| match e {
                Some(NodeEvent::Frame {
                    src,
                    epoch_bits,
                    frame: ControlFrame::DrainUp { round: r, sent },
                }) if *r == round && *epoch_bits == bits => {
                    heard += 1;
                    if let Err(e) = add_counts(&mut sum, sent) {
                        return Pick::Done(Err(format!("drain: node {src}: {e}")));
                    }
                    if heard == children.len() {
                        Pick::Done(Ok(()))
                    } else {
                        Pick::Took
                    }
                }
                _ => Pick::Keep,
            })??;
        }
        let totals = match topo.node_parent(me) {
            Some(parent) => {
                node.send_control(parent, epoch, &ControlFrame::DrainUp { round, sent: sum })
                    .map_err(|e| format!("drain: {e}"))?;
                let what = format!("drain round {round} (the totals from node {parent})");
                self.wait_for(&what, StageBounds::get().step, |e| match e {
                    Some(NodeEvent::Frame {
                        epoch_bits,
                        frame: ControlFrame::DrainDown { round: r, totals },
                        ..
                    }) if *r == round && *epoch_bits == bits => Pick::Done(totals.clone()),
                    _ => Pick::Keep,
                })?
            }
            None => sum,
        };
        let Some(&expect) = totals
            .get(me as usize)
            .filter(|_| totals.len() == n as usize)
        else {
            return Err(format!(
                "drain: {} totals for a view of {n} nodes",
                totals.len()
            ));
        };
        for &c in &children {
            node.send_control(
                c,
                epoch,
                &ControlFrame::DrainDown {
                    round,
                    totals: totals.clone(),
                },
            )
            .map_err(|e| format!("drain: {e}"))?;
        }
        let peers: Vec<NodeId> = (0..n).filter(|&p| p != me).collect();
        let what = format!("drain round {round} ({expect} frames)");
        self.wait_for(&what, StageBounds::get().step, |e| {
            // Another wait's event (a DrainUp of the next round, the new
            // view) is kept even when the count is complete: the next
            // `None` poll ends this wait.
            if !matches!(e, Some(NodeEvent::Counted) | None) {
                Pick::Keep
            } else if node.frames_received_from_all(&peers) >= expect {
                Pick::Done(())
            } else {
                Pick::Took
            }
        })
    }

    /// Node 0: admits what waits (at most what was asked) and commits.
    fn commit(&self, order: &StopOrder) -> Result<View, String> {
        let mut tries = 0;
        loop {
            tries += 1;
            let admit = if order.admit > 0 {
                let pending = self
                    .client
                    .settled(StageBounds::get().step)
                    .query_pending(order.epoch, StageBounds::get().step)
                    .map_err(|e| format!("asking the coordinator for newcomers: {e}"))?;
                order.admit.min(pending.len() as u32)
            } else {
                0
            };
            match self.client.settled(StageBounds::get().step).commit(
                order.epoch,
                order.remove.clone(),
                admit,
                StageBounds::get().step,
            ) {
                Ok(view) => return Ok(view),
                // A newcomer vanished between the query and the commit: ask again.
                Err(ClientError::Server {
                    code: ErrorCode::InvalidCommit,
                    message,
                }) if admit > 0 && tries < 3 => {
                    warn!("the coordinator refused the commit ({message}); asking again");
                }
                Err(e) => return Err(format!("the coordinator refused the commit: {e}")),
            }
        }
    }
}

/// Adds a subtree's per-node counts into `sum`.
fn add_counts(sum: &mut [u64], counts: &[u64]) -> Result<(), String> {
    if counts.len() != sum.len() {
        return Err(format!(
            "{} counts for a view of {} nodes",
            counts.len(),
            sum.len()
        ));
    }
    for (s, c) in sum.iter_mut().zip(counts) {
        *s = s
            .checked_add(*c)
            .ok_or_else(|| "frame counts overflow".to_string())?;
    }
    Ok(())
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// How a node ended, from how its PEs ended.
fn combine(exits: impl Iterator<Item = LoopExit>) -> LoopExit {
    let mut out = LoopExit::Exit(0);
    for e in exits {
        out = match (out, e) {
            (LoopExit::Aborted, _) | (_, LoopExit::Aborted) => LoopExit::Aborted,
            (_, LoopExit::Departed) => LoopExit::Departed,
            (_, LoopExit::Exit(code)) => LoopExit::Exit(code),
            (o, LoopExit::Stopped) => o,
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Summing the rows of any tree shape gives the column totals that
        /// the all-to-all drain would have compared one by one.
        #[test]
        fn tree_sums_are_the_column_totals(
            rows in proptest::collection::vec(proptest::collection::vec(0u64..1 << 40, 6), 1..12),
            split in 0usize..12,
        ) {
            let n = rows[0].len();
            let split = split.min(rows.len());
            let mut left = vec![0; n];
            let mut right = vec![0; n];
            rows[..split].iter().try_for_each(|r| add_counts(&mut left, r)).unwrap();
            rows[split..].iter().try_for_each(|r| add_counts(&mut right, r)).unwrap();
            add_counts(&mut left, &right).unwrap();
            for (col, total) in left.iter().enumerate() {
                proptest::prop_assert_eq!(*total, rows.iter().map(|r| r[col]).sum::<u64>());
            }
        }
    }

    #[test]
    fn every_stage_is_bounded_and_only_evacuate_is_abandoned() {
        let b = StageBounds {
            evacuate: Duration::from_secs(5),
            step: Duration::from_secs(2),
        };
        let ms = Duration::from_millis;
        let mut stage = Some(Stage::Evacuate);
        let mut seen = 0;
        while let Some(s) = stage {
            seen += 1;
            // Within its bound, nothing happens, however long the rescale ran.
            assert_eq!(overdue(s, ms(1999), &b), None, "{s:?}");
            // Far past any bound, every stage ends one way or the other.
            match overdue(s, Duration::from_secs(3600), &b) {
                Some(Overdue::Abandon(why)) => {
                    assert_eq!(s, Stage::Evacuate);
                    assert!(why.contains("stage evacuate"), "{why}");
                }
                Some(Overdue::Fail(why)) => {
                    assert_ne!(s, Stage::Evacuate);
                    assert!(why.contains(&format!("stage {}", s.name())), "{why}");
                }
                None => panic!("stage {s:?} is unbounded"),
            }
            stage = s.next();
        }
        assert_eq!(seen, 7, "every stage visited once, in order");
        assert_eq!(
            overdue(Stage::Evacuate, ms(5001), &b).map(|o| matches!(o, Overdue::Abandon(_))),
            Some(true)
        );
        assert_eq!(
            overdue(Stage::State, ms(2001), &b).map(|o| matches!(o, Overdue::Fail(_))),
            Some(true)
        );
        // The drivers' stages get node 0's backstop, beyond their own waits.
        assert_eq!(overdue(Stage::Stop, ms(2001), &b), None);
    }

    #[test]
    fn counts_of_another_view_or_that_overflow_are_refused() {
        let mut sum = vec![1, 2, 3];
        let e = add_counts(&mut sum, &[1, 2]).unwrap_err();
        assert!(e.contains("2 counts for a view of 3 nodes"), "{e}");
        assert!(add_counts(&mut sum, &[0, u64::MAX, 0]).is_err());
        add_counts(&mut sum, &[1, 0, 1]).unwrap();
        assert_eq!(sum[0], 2);
    }

    #[test]
    fn drain_frames_round_trip() {
        for f in [
            ControlFrame::DrainUp {
                round: 1,
                sent: vec![0, 5, 7],
            },
            ControlFrame::DrainDown {
                round: 2,
                totals: vec![9, 0, 1 << 50],
            },
        ] {
            let bytes = postcard::to_allocvec(&f).unwrap();
            assert_eq!(postcard::from_bytes::<ControlFrame>(&bytes).unwrap(), f);
        }
    }
}
