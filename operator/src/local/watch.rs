//! The launcher's watch over a running job: the thin shell around the
//! sans-IO [`Supervisor`]. Every [`POLL_INTERVAL`] it tells the supervisor
//! what the processes did (exits, the coordinator's views and admissions,
//! the user's stop), answers the requests on the launcher's channel
//! (newcomers to start or stop, a restart to arrange), restarts a lost
//! coordinator when the supervisor says so, keeps `job.json` up to date,
//! and asks the supervisor for its verdict; then it stops what is left.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use ductile_coordinator::{Client, Secret};
use nix::sys::signal::Signal;

use super::channel::{Channel, Reply, Request};
use super::process::{self, signal_group, Exit, Supervised, POLL_INTERVAL};
use super::supervise::{self, JobEnd, Limits, Supervisor};
use super::{
    node_command, restart_lost_coordinator, tail_of, Fleet, JobSpec, Joining, RunningJob,
    StopRequest,
};
use crate::state::{unix_ms, JobState, NewcomerRecord};

/// How often the view probe of a job with fault tolerance asks while
/// nothing waits for a view: often enough to fence a hung member soon after
/// the grace, rarely enough to cost the coordinator nothing.
const MEMBER_WATCH_INTERVAL: Duration = Duration::from_millis(500);

/// A restart arranged by `ductile rescale --mode restart`: the node count
/// and the checkpoint directory to relaunch from.
pub(super) type ArrangedRestart = Option<(u32, PathBuf)>;

/// Watches the running job until the supervisor's verdict, answering the
/// requests that arrive on the launcher's channel meanwhile, then stops what
/// is left. Returns the verdict, whether every process is gone, and the
/// restart arranged, if one was.
pub(super) fn supervise(
    job: &RunningJob<'_>,
    fleet: &mut Fleet,
    state: &mut JobState,
    stop: &StopRequest,
    say: &mut dyn FnMut(&str),
) -> (JobEnd, bool, ArrangedRestart) {
    let mut watch = Watch::start(job, fleet, state);
    let end = loop {
        let now = job.t0.elapsed();
        watch.note_start();
        watch.note_exits(now);
        watch.read_probe();
        watch.note_admissions();
        watch.report_exits(say);
        watch.answer_requests();
        if let Some(attempt) = watch.sup.coordinator_restart_due(job.t0.elapsed()) {
            restart_lost_coordinator(
                job,
                attempt,
                watch.fleet,
                &mut watch.sup,
                watch.state,
                stop,
                say,
            );
            watch.record_changed = true;
        }
        watch.save_record();
        watch.forget_settled();
        watch
            .probe_watch
            .store(watch.sup.wants_views(), Ordering::SeqCst);
        if let Some(signal) = stop.take() {
            watch.sup.interrupt(signal);
        }
        if let Some(end) = watch.sup.poll(now) {
            break end;
        }
        watch.fence();
        thread::sleep(POLL_INTERVAL);
    };
    let restart = watch.close();
    if let Some(message) = end.message() {
        say(&message);
    }
    if matches!(
        end,
        JobEnd::Failed(
            supervise::Failure::Coordinator { .. }
                | supervise::Failure::CoordinatorNotRestarted { .. }
                | supervise::Failure::NotStarted { .. }
        )
    ) {
        let tail = tail_of(&job.dir.coordinator_log(), 20);
        if !tail.trim().is_empty() {
            say(&format!(
                "coordinator log (last lines of {}):\n{tail}",
                job.dir.coordinator_log().display()
            ));
        }
    }
    let all_stopped = stop_the_rest(&end, job, fleet, state, stop, say);
    (end, all_stopped, restart)
}

/// The loop's state: the supervisor, the probe's answers, the channel.
struct Watch<'a, 'j> {
    job: &'a RunningJob<'j>,
    fleet: &'a mut Fleet,
    state: &'a mut JobState,
    sup: Supervisor,
    probe: mpsc::Receiver<ProbeAnswer>,
    /// Set while the supervisor wants views (the probe idles otherwise).
    probe_watch: Arc<AtomicBool>,
    /// Set when the job ended: the probe thread exits.
    probe_done: Arc<AtomicBool>,
    channel: Option<Channel>,
    restart: ArrangedRestart,
    /// `job.json` is due to be written.
    record_changed: bool,
}

impl<'a, 'j> Watch<'a, 'j> {
    fn start(job: &'a RunningJob<'j>, fleet: &'a mut Fleet, state: &'a mut JobState) -> Self {
        let spec = job.spec;
        let node_pids: Vec<u32> = fleet.nodes.iter().map(Supervised::pid).collect();
        let coordinator_pid = fleet.coordinator.as_ref().map(Supervised::pid).unwrap_or(0);
        let limits = Limits {
            exit_grace: spec.exit_grace,
            timeout: spec.timeout,
            launch_timeout: Some(spec.launch_timeout),
            coordinator_restarts: spec.coordinator_restarts,
            coordinator_settle: spec.coordinator_settle,
            recovery: spec.recovery_bound(),
        };
        let probe_done = Arc::new(AtomicBool::new(false));
        let probe_watch = Arc::new(AtomicBool::new(true));
        let addr = state
            .coordinator
            .as_ref()
            .map(|c| c.addr.clone())
            .unwrap_or_default();
        let probe = spawn_view_probe(
            addr,
            job.secret.clone(),
            job.t0,
            limits.recovery.is_some(),
            Arc::clone(&probe_watch),
            Arc::clone(&probe_done),
        );
        let channel = match Channel::open(&job.dir.launcher_socket()) {
            Ok(channel) => Some(channel),
            Err(err) => {
                // The job runs all the same; only `ductile expand` cannot reach it.
                tracing::warn!(%err, path = %job.dir.launcher_socket().display(), "cannot open the launcher's request channel");
                None
            }
        };
        Watch {
            job,
            fleet,
            state,
            sup: Supervisor::new(&node_pids, coordinator_pid, limits),
            probe,
            probe_watch,
            probe_done,
            channel,
            restart: None,
            record_changed: false,
        }
    }

    /// Node 0 publishes its control endpoint only once the launch is
    /// complete: proof that the job started, even if the coordinator is
    /// lost before the probe has seen a view (it would not be restarted).
    fn note_start(&mut self) {
        if !self.sup.started() && self.job.dir.control_file().exists() {
            tracing::info!(elapsed = ?self.job.t0.elapsed(), "job started (node 0's control endpoint is up)");
            self.sup.job_started();
        }
    }

    /// The coordinator first: when it and the nodes end together, its exit
    /// explains theirs.
    fn note_exits(&mut self, now: Duration) {
        if let Some(exit) = self.fleet.coordinator.as_mut().and_then(Supervised::poll) {
            tracing::info!(%exit, "coordinator ended");
            self.sup.coordinator_exited(exit, now);
        }
        for (index, node) in self.fleet.nodes.iter_mut().enumerate() {
            if let Some(exit) = node.poll() {
                tracing::info!(index, pid = node.pid(), %exit, "node ended");
                self.sup.node_exited(index, exit, now);
            }
        }
        for (&n, newcomer) in self.fleet.newcomers.iter_mut() {
            if let Some(exit) = newcomer.poll() {
                tracing::info!(newcomer = n, pid = newcomer.pid(), %exit, "newcomer ended");
                self.sup.newcomer_exited(n, exit, now);
                if let Some(record) = self.state.newcomer_mut(n) {
                    record.exit = Some(exit.to_string());
                }
                self.state.newcomer_counts.ended += 1;
                self.record_changed = true;
            }
        }
    }

    fn read_probe(&mut self) {
        while let Ok(answer) = self.probe.try_recv() {
            match answer {
                ProbeAnswer::View {
                    asked_at,
                    epoch,
                    member_pids,
                    admitted,
                } => {
                    if !self.sup.started() {
                        tracing::info!(elapsed = ?self.job.t0.elapsed(), "job started");
                    }
                    self.sup.admissions_seen(&admitted);
                    self.sup.members_seen(asked_at, epoch, &member_pids);
                }
                ProbeAnswer::NotStarted(asked_at) => self.sup.not_started(asked_at),
            }
        }
    }

    fn note_admissions(&mut self) {
        for record in self.state.newcomers.iter_mut() {
            let n = record.number;
            if !record.admitted && self.sup.newcomer_admitted(n) {
                tracing::info!(newcomer = n, pid = record.pid, "newcomer admitted");
                record.admitted = true;
                self.state.newcomer_counts.admitted += 1;
                self.record_changed = true;
            }
        }
    }

    fn report_exits(&mut self, say: &mut dyn FnMut(&str)) {
        for note in self.sup.take_notes() {
            say(&note);
        }
        for dropped in self.sup.take_dropped() {
            if let Some(record) = self.state.newcomer_mut(dropped.newcomer) {
                record.dropped = dropped.never_admitted;
            }
            self.state.newcomer_counts.dropped += u64::from(dropped.never_admitted);
            self.record_changed = true;
            // Exiting 0 unseen is most likely a departure: those go unsaid.
            if dropped.never_admitted || dropped.exit != Exit::Code(0) {
                say(&dropped.to_string());
            }
        }
    }

    fn answer_requests(&mut self) {
        while let Some(request) = self.channel.as_ref().and_then(Channel::try_next) {
            let reply = match &request.request {
                Request::Spawn { count, pes } => {
                    let pes = pes.unwrap_or(self.job.spec.pes_per_node);
                    let reply = spawn_newcomers(
                        self.job,
                        *count,
                        pes,
                        self.fleet,
                        &mut self.sup,
                        self.state,
                    );
                    self.record_changed |= matches!(reply, Reply::Ok(_));
                    reply
                }
                Request::Stop { pids } => stop_newcomers(pids, self.fleet, &self.sup),
                Request::Restart { nodes, dir } => {
                    if let Some(pes) = mixed_shapes(self.job.spec, self.state) {
                        Reply::Error(format!(
                            "{MIXED_RELAUNCH}: this job runs nodes of {pes} PEs"
                        ))
                    } else if self.restart.is_some() {
                        Reply::Error("a restart is already arranged".to_owned())
                    } else {
                        tracing::info!(nodes, dir = %dir.display(), "restart arranged for when the job checkpoints");
                        self.restart = Some((*nodes, dir.clone()));
                        Reply::Ok(Vec::new())
                    }
                }
                Request::CancelRestart => match self.restart.take() {
                    Some((nodes, dir)) => {
                        tracing::info!(nodes, dir = %dir.display(), "arranged restart cancelled");
                        Reply::Ok(Vec::new())
                    }
                    None => Reply::Error("no restart is arranged".to_owned()),
                },
            };
            request.answer(reply);
        }
    }

    /// Kills the members the job no longer counts on that still run (a
    /// hung node declared lost): their process groups, with SIGKILL, since
    /// a stopped process takes no other signal.
    fn fence(&mut self) {
        for (who, pid) in self.sup.take_fenced() {
            tracing::info!(%who, pid, "fencing a process the job no longer counts on");
            signal_group(pid, Signal::SIGKILL);
        }
    }

    /// Lets go of the newcomers whose end is judged, in the supervisor
    /// and in the fleet (once their process group is gone): what the
    /// launcher holds stays bounded however many rescales the job has;
    /// `job.json` keeps the recent ones and the counts.
    fn forget_settled(&mut self) {
        self.sup.forget_settled();
        let sup = &self.sup;
        self.fleet.forget_newcomers(|n| sup.holds_newcomer(n));
    }

    fn save_record(&mut self) {
        if !std::mem::take(&mut self.record_changed) {
            return;
        }
        let sup = &self.sup;
        self.state.trim_newcomers(|n| sup.newcomer_settled(n));
        if let Err(err) = self.job.dir.write_job(self.state) {
            tracing::warn!(%err, "cannot update the job record");
        }
    }

    /// The job ended: no more newcomers, no more views.
    fn close(self) -> ArrangedRestart {
        drop(self.channel);
        self.probe_done.store(true, Ordering::SeqCst);
        self.restart
    }
}

/// Stops every process still running after the verdict (a completed job's
/// coordinator first gets a moment to exit by itself); returns whether all
/// are gone, and says which are not.
fn stop_the_rest(
    end: &JobEnd,
    job: &RunningJob<'_>,
    fleet: &mut Fleet,
    state: &mut JobState,
    stop: &StopRequest,
    say: &mut dyn FnMut(&str),
) -> bool {
    let first = match end {
        JobEnd::Completed { code, .. } => {
            // The coordinator exits right after the shutdown barrier: give it
            // a moment to do so by itself before stopping it.
            let deadline = Instant::now() + job.spec.kill_grace;
            while let Some(coordinator) = fleet.coordinator.as_mut() {
                if coordinator.exit.is_some()
                    || coordinator.poll().is_some()
                    || Instant::now() >= deadline
                {
                    break;
                }
                thread::sleep(POLL_INTERVAL);
            }
            if let Some(Exit::Code(c)) = fleet.coordinator.as_ref().and_then(|c| c.exit) {
                if c != *code {
                    tracing::warn!(
                        coordinator = c,
                        job = code,
                        "the coordinator's exit code differs from node 0's"
                    );
                }
            }
            Signal::SIGTERM
        }
        JobEnd::Interrupted { signal } => Signal::try_from(*signal).unwrap_or(Signal::SIGTERM),
        _ => Signal::SIGTERM,
    };
    let all_stopped = fleet.stop(first, stop);
    for record in state.newcomers.iter_mut() {
        if record.exit.is_none() {
            record.exit = fleet
                .newcomers
                .get(&record.number)
                .and_then(|n| n.exit)
                .map(|e| e.to_string());
        }
    }
    if !all_stopped {
        let left: Vec<String> = fleet
            .all()
            .iter()
            .filter(|c| c.exit.is_none() || process::group_alive(c.pid()))
            .map(|c| format!("{} (pid {})", c.label, c.pid()))
            .collect();
        say(&format!(
            "could not stop {}; kill them by hand",
            left.join(", ")
        ));
    }
    all_stopped
}

/// What the view probe learnt from the coordinator.
enum ProbeAnswer {
    /// The coordinator has a view (so every launch node registered), whose
    /// members reported these pids, in answer to a question asked at this
    /// time since launch.
    View {
        /// When the question was asked, since launch.
        asked_at: Duration,
        /// The view's epoch.
        epoch: u64,
        /// The pids the members reported.
        member_pids: Vec<u32>,
        /// The coordinator's recent admissions `(epoch, pid)`, asked for
        /// after the view (empty from a coordinator that has no history).
        admitted: Vec<(u64, u32)>,
    },
    /// No view yet, in answer to a question asked at this time since launch.
    NotStarted(Duration),
}

/// Asks the coordinator for its view every [`POLL_INTERVAL`]: until the job
/// has started, then while `watch` is set (a newcomer's admission is
/// unknown), and otherwise, for a job with fault tolerance
/// (`follow_members`: members the views drop while they run, hung nodes
/// the job recovered without, are fenced), every [`MEMBER_WATCH_INTERVAL`],
/// until `done` is set. Never blocks the launcher: it runs on its own
/// thread and every call on the connection has a timeout.
fn spawn_view_probe(
    addr: String,
    secret: Secret,
    t0: Instant,
    follow_members: bool,
    watch: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
) -> mpsc::Receiver<ProbeAnswer> {
    let (tx, rx) = mpsc::channel();
    let spawned = thread::Builder::new()
        .name("ductile-view-probe".to_owned())
        .spawn(move || {
            let timeout = Duration::from_secs(1);
            let mut started = false;
            let mut client: Option<Client> = None;
            let mut last_asked: Option<Instant> = None;
            while !done.load(Ordering::SeqCst) {
                let recent = last_asked.is_some_and(|t| t.elapsed() < MEMBER_WATCH_INTERVAL);
                if started && !watch.load(Ordering::SeqCst) && (!follow_members || recent) {
                    thread::sleep(POLL_INTERVAL);
                    continue;
                }
                let Some(connected) = client.as_ref() else {
                    match Client::connect(&addr, &secret, timeout) {
                        Ok(c) => client = Some(c),
                        Err(err) => {
                            tracing::debug!(%err, "view probe cannot reach the coordinator");
                            thread::sleep(POLL_INTERVAL);
                        }
                    }
                    continue;
                };
                let asked_at = t0.elapsed();
                last_asked = Some(Instant::now());
                let answer = match connected.query_view(timeout) {
                    Ok((Some(view), _)) => {
                        started = true;
                        // After the view: an admission before a newcomer's
                        // exit, itself before the view was asked for, is
                        // listed (the history keeps the last 256).
                        let admitted = match connected.query_admissions(timeout) {
                            Ok((_, recent)) => recent.iter().map(|a| (a.epoch, a.pid)).collect(),
                            Err(err) => {
                                tracing::debug!(%err, "the coordinator gave no admission history");
                                Vec::new()
                            }
                        };
                        ProbeAnswer::View {
                            asked_at,
                            epoch: view.epoch,
                            member_pids: view.members.iter().map(|m| m.pid).collect(),
                            admitted,
                        }
                    }
                    Ok((None, _)) => ProbeAnswer::NotStarted(asked_at),
                    Err(err) => {
                        tracing::debug!(%err, "view probe lost the coordinator");
                        client = None;
                        continue;
                    }
                };
                if tx.send(answer).is_err() {
                    return;
                }
                thread::sleep(POLL_INTERVAL);
            }
        });
    if let Err(err) = spawned {
        // Without the probe the supervisor still decides, only later (grace
        // backstops), and newcomers' exits count as drops.
        tracing::warn!(%err, "cannot start the view probe thread");
    }
    rx
}

/// Why a relaunch from a checkpoint is refused for a job of mixed shapes.
pub const MIXED_RELAUNCH: &str = "a relaunch from a checkpoint starts every node with --pes-per-node PEs, and cannot keep nodes of different PE counts";

/// The PE counts of the job's running processes (launch nodes and
/// newcomers not ended), as `1, 2`, when they are not all the job's
/// `--pes-per-node`.
fn mixed_shapes(spec: &JobSpec, state: &JobState) -> Option<String> {
    let running = state
        .nodes
        .iter()
        .map(|n| n.pes)
        .chain(state.newcomers.iter().filter(|n| n.exit.is_none()).map(|n| n.pes));
    let counts: std::collections::BTreeSet<u32> =
        running.chain([spec.pes_per_node]).collect();
    (counts.len() > 1).then(|| {
        counts
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// Starts `count` newcomers of `pes` PEs each as children of this
/// launcher, supervised and recorded like the launch members. All or
/// nothing: if one cannot be started, those started with it are stopped
/// again (and dropped).
fn spawn_newcomers(
    job: &RunningJob<'_>,
    count: u32,
    pes: u32,
    fleet: &mut Fleet,
    sup: &mut Supervisor,
    state: &mut JobState,
) -> Reply {
    if let Err(why) = sup.accepts_newcomers() {
        return Reply::Error(format!("no newcomers now: {why}"));
    }
    let mut pids = Vec::new();
    for _ in 0..count {
        // Numbered after the launch nodes and every newcomer before it.
        let earlier = u32::try_from(sup.next_newcomer()).unwrap_or(u32::MAX);
        let slot = Some(job.spec.nodes.saturating_add(earlier));
        let spawned = node_command(
            job.spec,
            job.program,
            job.env,
            &Joining::Newcomer,
            pes,
            slot,
        )
        .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(err) => {
                for &pid in &pids {
                    signal_group(pid, Signal::SIGTERM);
                }
                let program = job.spec.program.to_string_lossy();
                return Reply::Error(format!("cannot start a newcomer ({program:?}): {err}"));
            }
        };
        let pid = child.id();
        let n = sup.newcomer_spawned(pid, job.t0.elapsed());
        tracing::info!(newcomer = n, pid, pes, "newcomer started");
        fleet
            .newcomers
            .insert(n, Supervised::new(format!("newcomer {n}"), child));
        state.newcomer_counts.started += 1;
        state.newcomers.push(NewcomerRecord {
            number: n,
            pid,
            pes,
            started_at_unix_ms: unix_ms(SystemTime::now()),
            admitted: false,
            dropped: false,
            exit: None,
        });
        pids.push(pid);
    }
    Reply::Ok(pids)
}

/// Stops (SIGTERM to their process groups) newcomers that are running and
/// were never seen admitted; refuses, stopping none, if any pid is not one.
fn stop_newcomers(pids: &[u32], fleet: &Fleet, sup: &Supervisor) -> Reply {
    for &pid in pids {
        let waiting = fleet
            .newcomers
            .iter()
            .find(|(_, c)| c.pid() == pid)
            .is_some_and(|(&n, _)| sup.newcomer_waiting(n));
        if !waiting {
            return Reply::Error(format!(
                "pid {pid} is not a newcomer of this job waiting for admission"
            ));
        }
    }
    for &pid in pids {
        tracing::info!(pid, "stopping a newcomer on request");
        signal_group(pid, Signal::SIGTERM);
    }
    Reply::Ok(pids.to_vec())
}
