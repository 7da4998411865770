//! The node's main thread: runs the rescale [`Driver`] against the real
//! world. It turns what the node hears ([`NodeEvent`]: PEs, transport,
//! coordinator) into driver events with the clock's time, and carries out
//! the driver's actions: control frames over the transport, commands to
//! the PEs, the coordinator's query and commit, endpoint reconciliation,
//! node 0's stage times. It also waits for the PEs' threads to end.
//!
//! Node 0's questions to the coordinator go over the node's member
//! connection. When one ends under a question (the coordinator was lost;
//! the launcher restarts it and the node's watcher rejoins it, restoring
//! it with the view this node runs in), the driver is told the connection
//! was lost, not that the coordinator refused, and the next question waits
//! for the rejoined connection, within the stage bound.
//!
//! May touch: the node ([`NodeShared`]: transport, inboxes, view, frame
//! counts, the operation slot's stage times), the PEs' command channels,
//! the coordinator link. Holds no protocol logic of its own.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use ductile_coordinator::client::{Client, ClientError};
use ductile_coordinator::proto::{ErrorCode, NodeId, View};
use tracing::{debug, info};

use super::driver::{
    Action, Cause, Config, DrainMode, Driver, Event, Failure, Unanswered, ViewUnanswered,
};
use super::spans::RescaleSpans;
use super::{NodeEvent, RescaleFailed, Stage, StageBounds};
use crate::link::CoordinatorLink;
use crate::msg::Envelope;
use crate::node::NodeShared;
use crate::pe::{LoopExit, PeCommand, Reentry};

/// How long the node's thread waits for an event when no deadline is near.
const IDLE_WAIT: Duration = Duration::from_millis(100);
/// How often a node in a rescale looks at its aborting flag.
const BUSY_WAIT: Duration = Duration::from_millis(5);
/// Questions node 0 asks the coordinator in one rescale (newcomers
/// vanishing between query and commit, connections ending under them).
const COMMIT_TRIES: u32 = 3;
/// How often node 0 looks for the rejoined coordinator connection.
const REJOIN_POLL: Duration = Duration::from_millis(10);
/// Pause between two asks for the coordinator's view.
const ASK_PAUSE: Duration = Duration::from_millis(50);

/// What a newcomer's wait for admission ended with.
pub(crate) type Admitted = Result<NodeId, Failure>;

/// The node's main thread: the rescale driver and the PEs' ends.
pub(crate) struct Shell {
    node: Arc<NodeShared>,
    events: Receiver<NodeEvent>,
    commands: Vec<Sender<PeCommand>>,
    client: Arc<CoordinatorLink>,
    driver: Option<Driver>,
    exits: Vec<Option<LoopExit>>,
    /// Answers to actions, fed before anything else.
    answers: VecDeque<Event>,
    /// Envelopes of the old view, taken out of the inboxes after the drain.
    late: Vec<Vec<Envelope>>,
    /// Node 0: when the stage in progress began (the last stage's end).
    stage_from: Option<Instant>,
    /// Set when a newcomer's driver said it joined (or failed to).
    admitted: Option<Admitted>,
    /// The aborting flag was passed on.
    told_aborting: bool,
    /// The tracing spans of the rescale under way.
    spans: RescaleSpans,
    /// The coordinator connection that last ended under a question: not
    /// asked again (a rejoin replaces it).
    lost: Option<Arc<Client>>,
}

impl Shell {
    pub(crate) fn new(
        node: Arc<NodeShared>,
        events: Receiver<NodeEvent>,
        client: Arc<CoordinatorLink>,
    ) -> Self {
        Shell {
            node,
            events,
            commands: Vec::new(),
            client,
            driver: None,
            exits: Vec::new(),
            answers: VecDeque::new(),
            late: Vec::new(),
            stage_from: None,
            admitted: None,
            told_aborting: false,
            spans: RescaleSpans::default(),
            lost: None,
        }
    }

    fn config(&self) -> Config {
        let drain = if std::env::var("DUCTILE_DRAIN").ok().as_deref() == Some("all") {
            DrainMode::AllToAll
        } else {
            DrainMode::Tree
        };
        Config {
            local_pes: self.node.inboxes.len(),
            drain,
            step: StageBounds::get().step,
            admission: super::ADMISSION_WAIT,
            commit_tries: COMMIT_TRIES,
            recover: self.node.options.ft_every > 0,
        }
    }

    /// A newcomer: waits until the coordinator admits it and it passed the
    /// barrier of its first view; returns its node id.
    pub(crate) fn admit(&mut self) -> Admitted {
        self.driver = Some(Driver::newcomer(self.config(), Instant::now()));
        loop {
            if let Some(done) = self.admitted.take() {
                return done;
            }
            if self.next().is_some() {
                return Err(Failure {
                    step: super::driver::Step::Admission,
                    cause: super::driver::Cause::ShuttingDown,
                    recovering: None,
                });
            }
        }
    }

    /// The PEs' command channels, once they run.
    pub(crate) fn attach(&mut self, commands: Vec<Sender<PeCommand>>) {
        self.exits = vec![None; commands.len()];
        self.commands = commands;
        if self.driver.is_none() {
            let topo = self.node.current_topology();
            self.driver = Some(Driver::member(self.config(), topo));
        }
    }

    /// Serves the node until every PE ended; returns how the job ended here.
    pub(crate) fn run(&mut self) -> LoopExit {
        loop {
            if let Some(exit) = self.next() {
                return exit;
            }
        }
    }

    fn driver(&mut self) -> &mut Driver {
        self.driver.as_mut().expect("the driver is set up first")
    }

    /// Waits for one event and handles it; Some when the node's PEs all ended.
    fn next(&mut self) -> Option<LoopExit> {
        if let Some(e) = self.answers.pop_front() {
            self.feed(e);
            return None;
        }
        let busy = self.driver().busy();
        if busy && self.node.aborting() && !self.told_aborting {
            self.told_aborting = true;
            self.feed(Event::Aborting);
            return None;
        }
        let wait = match self.driver().next_deadline() {
            Some(at) => at.saturating_duration_since(Instant::now()).min(if busy {
                BUSY_WAIT
            } else {
                IDLE_WAIT
            }),
            None => IDLE_WAIT,
        };
        let event = match self.events.recv_timeout(wait) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => {
                self.feed(Event::Tick);
                return None;
            }
            Err(RecvTimeoutError::Disconnected) => return Some(LoopExit::Aborted),
        };
        match event {
            NodeEvent::Exited { rank, exit } => {
                self.exits[rank] = Some(exit);
                if self.exits.iter().all(Option::is_some) {
                    return Some(combine(self.exits.iter().flatten().copied()));
                }
            }
            NodeEvent::Stopped { order } => {
                self.feed_counts();
                self.feed(Event::PeStopped(order));
            }
            NodeEvent::HandedOver => {
                self.feed_counts();
                self.feed(Event::HandedOver);
            }
            NodeEvent::Counted => {
                if self.driver().draining() {
                    self.feed_counts();
                }
            }
            NodeEvent::Frame {
                src,
                epoch_bits,
                frame,
            } => self.feed(Event::Frame {
                src,
                epoch_bits,
                frame,
            }),
            NodeEvent::Coordinator(msg) => self.feed(Event::Coordinator(msg)),
        }
        None
    }

    fn feed_counts(&mut self) {
        let Some(n) = self.driver().topology().map(|t| t.num_nodes()) else {
            return;
        };
        let counts = self.node.frame_counts(n);
        self.feed(Event::Counts(counts));
    }

    /// Feeds the driver and carries out its actions, in the span of the
    /// stage it is in (a stage that begins: its new span; one that ends:
    /// its last, so the end's actions are logged where they belong).
    fn feed(&mut self, event: Event) {
        let span = self.spans.current();
        let actions = span.in_scope(|| self.driver().on_event(event, Instant::now()));
        let stage = self.driver().stage();
        let node = self
            .driver()
            .topology()
            .map_or(NodeId::MAX, |t| t.my_node());
        if stage.is_some() {
            self.spans.follow(stage, node);
        }
        let span = match stage {
            Some(_) => self.spans.current(),
            None => span,
        };
        span.in_scope(|| {
            for a in actions {
                self.act(a);
            }
        });
        if stage.is_none() {
            self.spans.follow(None, node);
        }
    }

    fn command_all(&self, cmd: impl Fn() -> PeCommand) {
        for c in &self.commands {
            let _ = c.send(cmd());
        }
    }

    fn act(&mut self, action: Action) {
        let node = self.node.clone();
        let step = StageBounds::get().step;
        match action {
            Action::Send { to, epoch, frame } => {
                if let Err(e) = node.send_control(to, epoch, &frame) {
                    self.answers.push_back(Event::SendFailed {
                        to,
                        error: e.to_string(),
                    });
                }
            }
            Action::Draining(on) => {
                node.set_draining(on);
                if on {
                    // Frames that arrived before the flag was up sent no
                    // event: the counts now include them.
                    if let Some(n) = self.driver().topology().map(|t| t.num_nodes()) {
                        self.answers.push_back(Event::Counts(node.frame_counts(n)));
                    }
                }
            }
            Action::HandOver { leaving } => self.command_all(|| PeCommand::HandOver { leaving }),
            Action::TakeLate => {
                self.late = node.inboxes.iter().map(|i| i.take_all()).collect();
            }
            Action::StageEnded(stage) => self.stage_ended(stage),
            Action::QueryPending { epoch } => {
                let client = self.coordinator(step);
                let answer = client
                    .query_pending(epoch, step)
                    .map(|p| p.len() as u32)
                    .map_err(|e| self.unanswered(&client, e));
                self.answers.push_back(Event::Pending(answer));
            }
            Action::Commit {
                epoch,
                remove,
                admit,
            } => {
                let client = self.coordinator(step);
                let answer = match client.commit(epoch, remove, admit, step) {
                    Ok(view) => Ok(view),
                    Err(ClientError::Server {
                        code: ErrorCode::InvalidCommit,
                        message,
                    }) => Err(Unanswered::NewcomerGone(message)),
                    Err(ClientError::Server {
                        code: ErrorCode::MemberLost,
                        message,
                    }) => Err(Unanswered::MemberLost(message)),
                    Err(e) => Err(self.unanswered(&client, e)),
                };
                self.answers.push_back(Event::Committed(answer));
            }
            Action::AskView { epoch } => {
                debug!(
                    epoch,
                    "asking the coordinator's view for the commit's outcome"
                );
                let answer = self.view_now(step);
                self.answers.push_back(Event::ViewNow(answer));
            }
            Action::Install { view, me } => {
                let epoch = view.epoch;
                let answer = match node.transport().reconcile(&view, me) {
                    Ok(r) => {
                        debug!(
                            kept = r.kept,
                            opened = r.opened,
                            closed = r.closed,
                            "endpoints reconciled"
                        );
                        Ok(node.install_view(view, me))
                    }
                    Err(e) => Err(format!("reconciling endpoints with epoch {epoch}: {e}")),
                };
                self.answers.push_back(Event::Installed(answer));
            }
            Action::Recover { order } => {
                // A member was lost without notice: every local PE stops
                // before anything it queued runs, and rolls back later.
                let topo = self.driver().topology().cloned();
                if let (Some(topo), Some(&lost)) = (topo, order.remove.first()) {
                    let uid = topo.uid_of(lost);
                    node.note_loss(lost, uid);
                    // A PE blocked sending to it (a hung peer reads
                    // nothing) could not take its stop order otherwise.
                    if let Some(transport) = node.transport_if_any() {
                        transport.disconnect(uid);
                    }
                }
                for inbox in &node.inboxes {
                    inbox.push(crate::pe::recovery_stop(order.clone()));
                }
            }
            Action::Discard => {
                let dropped: usize = node.inboxes.iter().map(|i| i.take_all().len()).sum();
                debug!(dropped, "the failed epoch's envelopes dropped");
            }
            Action::Resume {
                old,
                new,
                plan,
                rollback,
            } => {
                // Measurement only: contexts re-created here are on the
                // critical path, inside node 0's re-entry stage.
                if let Some(ms) = crate::gpu::context_on_reentry() {
                    node.with_desk(|d| d.gpu_context_ms = Some(ms));
                }
                let reentry = Arc::new(Reentry {
                    old,
                    new,
                    plan,
                    span: self.spans.rescale(),
                    rollback,
                });
                let late = std::mem::take(&mut self.late);
                let mut late = late.into_iter();
                for c in &self.commands {
                    let _ = c.send(PeCommand::Resume(
                        reentry.clone(),
                        late.next().unwrap_or_default(),
                    ));
                }
            }
            Action::Joined { me } => self.admitted = Some(Ok(me)),
            Action::Depart => {
                info!("removed by the rescale; leaving the job");
                self.command_all(|| PeCommand::Depart);
            }
            Action::Fail(failure) => {
                if self.commands.is_empty() {
                    // A newcomer not admitted: it has no PEs yet.
                    self.admitted = Some(Err(failure));
                    return;
                }
                let stage = node
                    .with_desk(|d| format!(" in stage {}", d.stage.name()))
                    .unwrap_or_default();
                let what = match failure.recovering {
                    Some(lost) => format!("the recovery from the loss of node {lost}"),
                    None => "the rescale".to_owned(),
                };
                match failure.cause {
                    // One line for the job, by one survivor, with the step.
                    Cause::MemberLost { uid, .. } => node.lose_peer(
                        uid,
                        &format!(
                            "the coordinator reported it gone during {what}{stage} (step: {})",
                            failure.step
                        ),
                    ),
                    _ => node.abort(format!("{what} failed{stage}: {failure}; ending the job")),
                }
                node.finish_rescale(Err(RescaleFailed::Step { stage, failure }));
                self.command_all(|| PeCommand::Depart);
            }
            Action::PeerLost { node: lost, uid } => {
                debug!(lost, uid, "the coordinator reported a member lost");
                node.lose_peer(uid, "the coordinator reported it gone");
            }
        }
    }

    /// The member connection to ask the coordinator over: the link's
    /// current one once it is connected and is not the one that ended
    /// under the last question (the node's watcher rejoins meanwhile).
    /// Waits up to `bound`; then the current one, whose use fails clearly.
    fn coordinator(&self, bound: Duration) -> Arc<Client> {
        let deadline = Instant::now() + bound;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let client = self.client.settled(left);
            let ended = self
                .lost
                .as_ref()
                .is_some_and(|lost| Arc::ptr_eq(lost, &client));
            if !ended || left.is_zero() {
                return client;
            }
            std::thread::sleep(REJOIN_POLL.min(left));
        }
    }

    /// What an error of `client` means to the driver: a refusal, a lost
    /// connection (remembered, so the next question waits for the rejoined
    /// one), or no answer.
    fn unanswered(&mut self, client: &Arc<Client>, e: ClientError) -> Unanswered {
        match e {
            ClientError::Server { code, message } => {
                Unanswered::Refused(format!("{code:?}: {message}"))
            }
            e @ (ClientError::Disconnected | ClientError::Io(_)) => {
                self.lost = Some(client.clone());
                Unanswered::Lost(e.to_string())
            }
            e => Unanswered::NoAnswer(e.to_string()),
        }
    }

    /// Node 0, after the connection ended under its commit: the
    /// coordinator's view, asked over the rejoined connection (a restarted
    /// coordinator holds the view node 0 restored it with), within `bound`.
    fn view_now(&mut self, bound: Duration) -> Result<View, ViewUnanswered> {
        let deadline = Instant::now() + bound;
        let mut last = "no connection came back".to_owned();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ViewUnanswered {
                    addr: self.client.addr().to_string(),
                    bound,
                    last,
                });
            }
            let client = self.coordinator(left);
            let left = deadline.saturating_duration_since(Instant::now());
            match client.query_view(left) {
                Ok((Some(view), _)) => return Ok(view),
                Ok((None, _)) => last = "it holds no view yet".to_owned(),
                Err(e) => last = self.unanswered(&client, e).message().to_owned(),
            }
            std::thread::sleep(ASK_PAUSE.min(left));
        }
    }

    /// Node 0: times a stage that ended on its driver.
    fn stage_ended(&mut self, stage: Stage) {
        let now = Instant::now();
        let from = match stage {
            Stage::Stop => self.node.with_desk(|d| d.stop_sent).flatten(),
            _ => self.stage_from,
        };
        if let Some(t) = from {
            let ms = now.saturating_duration_since(t).as_secs_f64() * 1e3;
            self.node.with_desk(|d| {
                d.record(stage, ms);
                if stage == Stage::Reconcile {
                    d.reentry_from = Some(now);
                }
            });
        }
        self.stage_from = Some(now);
    }
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
