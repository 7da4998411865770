//! The local fleet: a job's nodes as processes on this machine.
//!
//! [`launch`] runs one job from start to end: it takes the job's state
//! directory, starts the coordinator (this binary's `coordinator` subcommand)
//! and N node processes with the environment contract, supervises them until
//! the job ends, and leaves nothing running behind. While the job runs it
//! starts newcomers on request (`ductile expand`, `ductile rescale --add`,
//! through the [`channel`] socket in the state directory) as its own children,
//! supervised and stopped like the launch members; a rescale admits them.
//! The judgement of what the processes did lives in [`supervise`] (sans-IO),
//! the loop that feeds it and carries out its verdict in `watch`, the
//! process plumbing in [`process`].
//!
//! Later: node-per-network-namespace, and the fault injector that plays the
//! cloud.

pub mod channel;
pub mod process;
pub mod restart;
pub mod supervise;
mod watch;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use ductile_coordinator::{lifeline, Secret};
use nix::sys::signal::Signal;

use crate::contract;
use crate::state::{
    unix_ms, CoordinatorRecord, CoordinatorRestartRecord, JobResult, JobState, NodeRecord, Outcome,
    Shape, StateDir, StateError, JOB_STATE_FORMAT,
};
use process::{signal_name, stop_all, Supervised, POLL_INTERVAL};
use supervise::{JobEnd, Supervisor};

/// Everything needed to run one job on the local fleet.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Job name (recorded in `job.json`).
    pub job: String,
    /// The job's state directory (see [`crate::state`]).
    pub state_dir: PathBuf,
    /// Number of node processes.
    pub nodes: u32,
    /// PEs per node (`DUCTILE_PES`), for every node [`Self::node_pes`]
    /// does not name and for newcomers started without a count of their own.
    pub pes_per_node: u32,
    /// PEs of each launch node, node 0 first (`ductile run --node-pes`);
    /// empty: every node runs [`Self::pes_per_node`]. Otherwise exactly
    /// [`Self::nodes`] counts of at least 1.
    pub node_pes: Vec<u32>,
    /// A cgroup directory for each launch node, node 0 first (`ductile run
    /// --node-cgroups`): the launcher moves each node into its group as
    /// soon as it spawned it, so the group's CPU quota holds before the
    /// node's PEs start, as a pod's limits do (the local cloud's
    /// instances). Empty: none.
    pub node_cgroups: Vec<PathBuf>,
    /// Transport name handed to the nodes (`DUCTILE_TRANSPORT`).
    pub transport: String,
    /// Address the nodes' transports and the coordinator bind.
    pub bind: IpAddr,
    /// How long the coordinator waits for every node to register.
    pub launch_timeout: Duration,
    /// How long a running node may send the coordinator nothing before it
    /// is declared lost (a hung node), in whole seconds, at least 3 (the
    /// coordinator's floor); `None`: never.
    pub heartbeat_timeout: Option<Duration>,
    /// Optional wall-clock limit for the whole job.
    pub timeout: Option<Duration>,
    /// Once the job began to finish (node 0, a nonzero exit, the coordinator),
    /// how long the other nodes may keep running.
    pub exit_grace: Duration,
    /// Between SIGTERM and SIGKILL when stopping the job.
    pub kill_grace: Duration,
    /// How long the coordinator may take to bind and write its address.
    pub coordinator_start_timeout: Duration,
    /// How many times the coordinator may be restarted while the job runs
    /// (attempts, successful or not); 0: a lost coordinator fails the job.
    pub coordinator_restarts: u32,
    /// How long a coordinator that exited with a code while the job ran
    /// waits for a member to exit too (the shutdown barrier) before it is
    /// restarted.
    pub coordinator_settle: Duration,
    /// The program each node runs.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The executable whose `coordinator` subcommand runs the coordinator
    /// (normally the `ductile` binary itself).
    pub coordinator_exe: PathBuf,
    /// Start from this checkpoint directory instead of running main
    /// (`DUCTILE_RESTORE`; see docs/elasticity.md, "The restart baseline").
    pub restore: Option<PathBuf>,
    /// Node 0 serves Prometheus metrics on this port of [`Self::bind`] (0:
    /// the OS chooses) and writes the address to `metrics.addr` in the
    /// state directory; `None`: no metrics.
    pub metrics_port: Option<u16>,
}

impl JobSpec {
    /// A spec with the documented defaults: job `default`, tcp on 127.0.0.1,
    /// 60 s launch timeout, no wall-clock limit, 10 s exit grace, 3 s kill
    /// grace, this executable as the coordinator, restarted at most 3 times
    /// (2 s settle period).
    pub fn new(
        program: impl Into<OsString>,
        args: Vec<OsString>,
        nodes: u32,
        pes_per_node: u32,
        state_dir: PathBuf,
    ) -> Self {
        Self {
            job: crate::state::DEFAULT_JOB.to_owned(),
            state_dir,
            nodes,
            pes_per_node,
            node_pes: Vec::new(),
            node_cgroups: Vec::new(),
            transport: "tcp".to_owned(),
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            launch_timeout: Duration::from_secs(60),
            heartbeat_timeout: Some(ductile_coordinator::core::DEFAULT_HEARTBEAT_TIMEOUT),
            timeout: None,
            exit_grace: Duration::from_secs(10),
            kill_grace: Duration::from_secs(3),
            coordinator_start_timeout: Duration::from_secs(10),
            coordinator_restarts: 3,
            coordinator_settle: Duration::from_secs(2),
            program: program.into(),
            args,
            coordinator_exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("ductile")),
            restore: None,
            metrics_port: None,
        }
    }

    /// PEs of launch node `index`.
    pub fn launch_pes(&self, index: u32) -> u32 {
        self.node_pes
            .get(index as usize)
            .copied()
            .unwrap_or(self.pes_per_node)
    }

    /// Whether the launch nodes do not all run [`Self::pes_per_node`] PEs.
    pub fn mixed_shapes(&self) -> bool {
        self.node_pes.iter().any(|&p| p != self.pes_per_node)
    }

    /// With fault tolerance (the program's arguments turn on the runtime's
    /// in-memory checkpoints, `+ft-every K` or `+ft-every=K` with K ≥ 1):
    /// how long the runtime's recovery from a lost member may take, its
    /// rescale stage bound (`DUCTILE_RESCALE_STAGE_TIMEOUT_MS` in the
    /// launcher's environment, which the nodes inherit; 30 s by default).
    /// `None` without fault tolerance.
    pub fn recovery_bound(&self) -> Option<Duration> {
        fault_tolerance_every(&self.args)?;
        let ms = std::env::var(ENV_STAGE_TIMEOUT_MS)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&ms| ms > 0)
            .unwrap_or(DEFAULT_STAGE_TIMEOUT_MS);
        Some(Duration::from_millis(ms))
    }

    fn command_line(&self) -> Vec<String> {
        std::iter::once(&self.program)
            .chain(&self.args)
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }
}

/// The runtime's bound on each stage of a rescale, a recovery's included
/// (docs/elasticity.md, "Bounds"), in ms.
pub const ENV_STAGE_TIMEOUT_MS: &str = "DUCTILE_RESCALE_STAGE_TIMEOUT_MS";
/// Its default.
pub const DEFAULT_STAGE_TIMEOUT_MS: u64 = 30_000;
pub use crate::contract::FT_EVERY_FLAG;

/// K of the program arguments' last `+ft-every K` (or `+ft-every=K`), when
/// it is a whole number of at least 1: the job runs with fault tolerance.
pub fn fault_tolerance_every<S: AsRef<OsStr>>(args: &[S]) -> Option<u64> {
    let mut every = None;
    let mut it = args.iter().map(|a| a.as_ref().to_string_lossy());
    while let Some(arg) = it.next() {
        let value = if arg == FT_EVERY_FLAG {
            it.next().map(|v| v.into_owned())
        } else if let Some(v) = arg
            .strip_prefix(FT_EVERY_FLAG)
            .and_then(|r| r.strip_prefix('='))
        {
            Some(v.to_owned())
        } else {
            continue;
        };
        every = value
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&k| k >= 1);
    }
    every
}

/// Why a job could not be launched (nothing of it is left running).
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The spec makes no sense.
    #[error("{0}")]
    InvalidSpec(String),
    /// The program cannot be run.
    #[error("cannot run {program:?}: {reason}")]
    Program {
        /// The program as given.
        program: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The state directory is unusable or taken.
    #[error(transparent)]
    State(#[from] StateError),
    /// The coordinator process could not be spawned.
    #[error("cannot start the coordinator ({exe} coordinator): {source}", exe = exe.display())]
    CoordinatorSpawn {
        /// The executable.
        exe: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The coordinator did not come up.
    #[error("the coordinator did not start: {reason}{tail}", tail = log_tail_suffix(log_tail))]
    CoordinatorStart {
        /// What happened.
        reason: String,
        /// The last lines of its log.
        log_tail: String,
    },
    /// A node process could not be spawned.
    #[error("cannot start node {index} ({program:?}): {source}")]
    NodeSpawn {
        /// The node.
        index: u32,
        /// The program.
        program: String,
        /// The cause.
        source: io::Error,
    },
    /// A node could not join its cgroup (`--node-cgroups`): it would run
    /// outside its CPU quota.
    #[error("cannot put node {index} into the cgroup {}: {source}", dir.display())]
    NodeCgroup {
        /// The node.
        index: u32,
        /// Its cgroup.
        dir: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The launcher was told to stop while launching.
    #[error("received {} while launching; stopped", signal_name(*signal))]
    Interrupted {
        /// The signal number.
        signal: i32,
    },
}

impl LaunchError {
    /// The exit code `ductile run` returns: 2 for launch errors, 128+signal
    /// when interrupted.
    pub fn exit_code(&self) -> i32 {
        match self {
            LaunchError::Interrupted { signal } => 128 + signal,
            _ => 2,
        }
    }
}

fn log_tail_suffix(tail: &str) -> String {
    if tail.trim().is_empty() {
        String::new()
    } else {
        format!("\ncoordinator log (last lines):\n{}", tail.trim_end())
    }
}

/// A stop request for a running [`launch`]: set from signal handlers (see
/// [`StopRequest::install_signal_handlers`]) or by calling
/// [`StopRequest::request`] from another thread.
#[derive(Debug, Clone, Default)]
pub struct StopRequest(Arc<AtomicUsize>);

impl StopRequest {
    /// No stop requested yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes SIGINT, SIGTERM and SIGHUP to this process set the request
    /// instead of killing it, so the job is stopped cleanly. Children get the
    /// default dispositions back when they exec.
    pub fn install_signal_handlers(&self) -> io::Result<()> {
        for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            signal_hook::flag::register_usize(signal as i32, Arc::clone(&self.0), signal as usize)?;
        }
        Ok(())
    }

    /// Asks the launch to stop as if `signal` had been received.
    pub fn request(&self, signal: i32) {
        self.0
            .store(usize::try_from(signal).unwrap_or(15), Ordering::SeqCst);
    }

    /// Whether a stop was requested and not taken yet.
    fn pending(&self) -> bool {
        self.0.load(Ordering::SeqCst) != 0
    }

    /// Takes the pending request, if any.
    fn take(&self) -> Option<i32> {
        match self.0.swap(0, Ordering::SeqCst) {
            0 => None,
            n => Some(i32::try_from(n).unwrap_or(15)),
        }
    }
}

/// How a launched job ended.
#[derive(Debug, Clone)]
pub struct JobReport {
    /// The supervisor's verdict.
    pub end: JobEnd,
    /// The final `job.json` record (also written to the state directory).
    pub state: JobState,
    /// Whether every process of the job is gone (false: some could not be killed).
    pub all_stopped: bool,
}

impl JobReport {
    /// The exit code for `ductile run`: the job's code when it completed, 1
    /// when it failed or timed out, 128+signal when interrupted.
    pub fn exit_code(&self) -> i32 {
        self.end.exit_code()
    }
}

/// Checks that `program` can be executed, looking it up in `path` (the value
/// of `PATH`) when it has no slash, as the shell would. Returns the path to run.
pub fn resolve_program(program: &OsStr, path: Option<&OsStr>) -> Result<PathBuf, LaunchError> {
    let shown = program.to_string_lossy().into_owned();
    let fail = |reason: &str| LaunchError::Program {
        program: shown.clone(),
        reason: reason.to_owned(),
    };
    if program.is_empty() {
        return Err(fail("empty program name"));
    }
    let executable = |p: &Path| match p.metadata() {
        Ok(m) if m.is_file() => Some(m.permissions().mode() & 0o111 != 0),
        _ => None,
    };
    if program.as_bytes().contains(&b'/') {
        let p = PathBuf::from(program);
        return match p.metadata() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(fail("no such file")),
            Err(e) => Err(fail(&e.to_string())),
            Ok(m) if m.is_dir() => Err(fail("is a directory")),
            Ok(_) if executable(&p) == Some(true) => Ok(p),
            Ok(_) => Err(fail("not executable (permission denied)")),
        };
    }
    let mut found_not_executable = false;
    for dir in std::env::split_paths(path.unwrap_or_default()) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let candidate = dir.join(program);
        match executable(&candidate) {
            Some(true) => return Ok(candidate),
            Some(false) => found_not_executable = true,
            None => {}
        }
    }
    if found_not_executable {
        Err(fail("found in PATH but not executable (permission denied)"))
    } else {
        Err(fail("command not found in PATH"))
    }
}

/// The job's processes; dropping it kills whatever is still running, so no
/// early return (or panic) leaves a process behind.
struct Fleet {
    coordinator: Option<Supervised>,
    nodes: Vec<Supervised>,
    /// Newcomers by number (`newcomer k` is `newcomers[&k]`), until they
    /// are let go ([`Fleet::forget_newcomers`]).
    newcomers: BTreeMap<usize, Supervised>,
    kill_grace: Duration,
}

impl Fleet {
    fn all(&mut self) -> Vec<&mut Supervised> {
        self.nodes
            .iter_mut()
            .chain(self.newcomers.values_mut())
            .chain(self.coordinator.as_mut())
            .collect()
    }

    /// Lets go of newcomers that ended, whose process group is gone (so
    /// there is nothing left to stop), and that the supervisor no longer
    /// holds (`held(k)` false: their end is judged). A job rescaled for
    /// weeks keeps its running newcomers only. How many went.
    fn forget_newcomers(&mut self, held: impl Fn(usize) -> bool) -> usize {
        let before = self.newcomers.len();
        self.newcomers
            .retain(|&k, c| held(k) || c.exit.is_none() || process::group_alive(c.pid()));
        before - self.newcomers.len()
    }

    /// Stops everything that is still running; returns whether all is gone.
    fn stop(&mut self, first: Signal, stop: &StopRequest) -> bool {
        let grace = self.kill_grace;
        let mut all = self.all();
        stop_all(&mut all, first, grace, || stop.take().is_some())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let mut all = self.all();
        if all
            .iter()
            .any(|c| c.exit.is_none() || process::group_alive(c.pid()))
        {
            stop_all(&mut all, Signal::SIGKILL, Duration::ZERO, || true);
        }
    }
}

/// What the supervision loop needs of a job whose processes started.
struct RunningJob<'a> {
    spec: &'a JobSpec,
    /// The resolved program the nodes run.
    program: &'a Path,
    dir: &'a StateDir,
    env: &'a NodeEnv,
    secret: Secret,
    t0: Instant,
}

fn tail_of(path: &Path, max_lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(8192)));
    let mut text = String::new();
    let mut bytes = Vec::new();
    if file.read_to_end(&mut bytes).is_ok() {
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(max_lines)..].join("\n")
}

/// Runs the job described by `spec` to its end. `say` receives the
/// user-facing lines (a failure, a stop) as soon as they are known; the CLI
/// prefixes them with `ductile:` on stderr.
///
/// `Err` means the job never ran (exit code 2, see [`LaunchError::exit_code`]);
/// `Ok` carries the verdict of a job that ran, whatever it was.
pub fn launch(
    spec: &JobSpec,
    stop: &StopRequest,
    say: &mut dyn FnMut(&str),
) -> Result<JobReport, LaunchError> {
    if spec.nodes == 0 || spec.pes_per_node == 0 {
        return Err(LaunchError::InvalidSpec(
            "--nodes and --pes-per-node must be at least 1".to_owned(),
        ));
    }
    if !spec.node_pes.is_empty() && spec.node_pes.len() != spec.nodes as usize {
        return Err(LaunchError::InvalidSpec(format!(
            "--node-pes names {} PE counts for {} nodes: give one per node",
            spec.node_pes.len(),
            spec.nodes
        )));
    }
    if !spec.node_cgroups.is_empty() && spec.node_cgroups.len() != spec.nodes as usize {
        return Err(LaunchError::InvalidSpec(format!(
            "--node-cgroups names {} cgroups for {} nodes: give one per node",
            spec.node_cgroups.len(),
            spec.nodes
        )));
    }
    if spec.node_pes.contains(&0) {
        return Err(LaunchError::InvalidSpec(
            "--node-pes: every node runs at least 1 PE".to_owned(),
        ));
    }
    if spec.restore.is_some() && spec.mixed_shapes() {
        return Err(LaunchError::InvalidSpec(
            "--restore with --node-pes of different counts: a relaunch from a checkpoint runs nodes of one shape (--pes-per-node)".to_owned(),
        ));
    }
    if spec.transport.is_empty() {
        return Err(LaunchError::InvalidSpec(
            "--transport must not be empty".to_owned(),
        ));
    }
    crate::state::validate_job_name(&spec.job)?;
    let program = resolve_program(&spec.program, std::env::var_os("PATH").as_deref())?;
    let dir = StateDir::lock(&spec.state_dir)?;

    let t0 = Instant::now();
    let launched_at = SystemTime::now();
    let mut state = JobState {
        format: JOB_STATE_FORMAT,
        job: spec.job.clone(),
        state_dir: spec.state_dir.clone(),
        launcher_pid: std::process::id(),
        coordinator: None,
        nodes: Vec::new(),
        newcomers: Vec::new(),
        newcomer_counts: Default::default(),
        coordinator_restarts: Vec::new(),
        shape: Shape {
            nodes: spec.nodes,
            pes_per_node: spec.pes_per_node,
        },
        transport: spec.transport.clone(),
        bind: spec.bind.to_string(),
        program: spec.command_line(),
        launched_at_unix_ms: unix_ms(launched_at),
        finished_at_unix_ms: None,
        outcome: None,
    };
    let mut fleet = Fleet {
        coordinator: None,
        nodes: Vec::new(),
        newcomers: BTreeMap::new(),
        kill_grace: spec.kill_grace,
    };

    // A `restart` request makes the job run again, at its new size, once it
    // ended with the checkpointed code: same launcher, state directory and
    // deadline; a new coordinator and new processes.
    let mut relaunch: Option<JobSpec> = None;
    loop {
        let spec = relaunch.as_ref().unwrap_or(spec);
        let started = start_processes(spec, &program, &dir, &mut fleet, &mut state, stop, t0);
        let (secret, env) = match started {
            Ok(started) => started,
            Err(err) => {
                // Stop whatever did start, then record why the launch failed.
                fleet.stop(Signal::SIGTERM, stop);
                let outcome = Outcome {
                    result: JobResult::LaunchFailed,
                    exit_code: err.exit_code(),
                    message: err.to_string(),
                    elapsed_s: t0.elapsed().as_secs_f64(),
                };
                finish_record(&dir, &mut state, outcome);
                return Err(err);
            }
        };

        let job = RunningJob {
            spec,
            program: &program,
            dir: &dir,
            env: &env,
            secret,
            t0,
        };
        let (end, all_stopped, restart) = watch::supervise(&job, &mut fleet, &mut state, stop, say);
        if let (Some((nodes, ckpt)), JobEnd::Completed { code, .. }) = (restart, &end) {
            if *code == contract::EXIT_CHECKPOINTED && all_stopped {
                tracing::info!(nodes, dir = %ckpt.display(), "relaunching the job from its checkpoint");
                let mut next = spec.clone();
                next.nodes = nodes;
                // Refused for mixed shapes (watch.rs): one shape again.
                next.node_pes.clear();
                next.node_cgroups.clear();
                next.restore = Some(ckpt);
                state.nodes.clear();
                state.newcomers.clear();
                state.coordinator_restarts.clear();
                state.shape.nodes = nodes;
                fleet = Fleet {
                    coordinator: None,
                    nodes: Vec::new(),
                    newcomers: BTreeMap::new(),
                    kill_grace: spec.kill_grace,
                };
                dir.forget_processes();
                relaunch = Some(next);
                continue;
            }
        }
        let outcome = Outcome {
            result: match &end {
                JobEnd::Completed { .. } => JobResult::Completed,
                JobEnd::Failed(_) => JobResult::Failed,
                JobEnd::TimedOut { .. } => JobResult::TimedOut,
                JobEnd::Interrupted { .. } => JobResult::Interrupted,
            },
            exit_code: end.exit_code(),
            message: end.message().unwrap_or_default(),
            elapsed_s: t0.elapsed().as_secs_f64(),
        };
        finish_record(&dir, &mut state, outcome);
        dir.release();
        return Ok(JobReport {
            end,
            state,
            all_stopped,
        });
    }
}

fn finish_record(dir: &StateDir, state: &mut JobState, outcome: Outcome) {
    state.finished_at_unix_ms = Some(unix_ms(SystemTime::now()));
    state.outcome = Some(outcome);
    if let Err(err) = dir.write_job(state) {
        tracing::warn!(%err, "cannot write the final job record");
    }
}

/// What every node process of the job is told, launch member or newcomer.
struct NodeEnv {
    /// The coordinator's `host:port`.
    coordinator: String,
    /// The job secret, hex.
    secret_hex: String,
    /// This launcher's pid (the nodes' watchdog).
    launcher_pid: String,
}

/// How a node process joins the job.
enum Joining {
    /// As launch member `index`; node 0 serves the control endpoint and
    /// writes its address to `control_file`.
    Launch {
        /// Its launch index.
        index: u32,
        /// Where node 0 writes its control address.
        control_file: PathBuf,
        /// Where node 0 writes its metrics address (with `metrics_port`).
        metrics_file: PathBuf,
    },
    /// As a newcomer, waiting for a rescale to admit it.
    Newcomer,
}

/// The command that starts one node of the job: the program and its
/// arguments, the environment contract, standard input from /dev/null and its
/// own process group; standard output and error inherited. `host_slot`:
/// the node's number among the job's nodes on this machine, when it has
/// more than one.
fn node_command(
    spec: &JobSpec,
    program: &Path,
    env: &NodeEnv,
    joining: &Joining,
    pes: u32,
    host_slot: Option<u32>,
) -> Command {
    let mut cmd = Command::new(program);
    cmd.arg0(&spec.program)
        .args(&spec.args)
        .env(contract::ENV_COORDINATOR, &env.coordinator)
        .env(contract::ENV_SECRET, &env.secret_hex)
        .env(contract::ENV_PES, pes.to_string())
        .env(contract::ENV_BIND, spec.bind.to_string())
        .env(contract::ENV_TRANSPORT, &spec.transport)
        .env(contract::ENV_LAUNCHER_PID, &env.launcher_pid)
        // Inherited values would contradict the ones above.
        .env_remove(contract::ENV_SECRET_FILE)
        .env_remove(contract::ENV_ADVERTISE)
        // Nodes never read the terminal; in their own process groups a
        // read would stop them (SIGTTIN).
        .stdin(Stdio::null())
        .process_group(0);
    hand_down_lifeline(&mut cmd);
    // Several nodes on this machine: each pins its PEs from a CPU of its
    // own on, not every node's PE 0 to the same CPU.
    match host_slot {
        Some(slot) => cmd.env(contract::ENV_HOST_SLOT, slot.to_string()),
        None => cmd.env_remove(contract::ENV_HOST_SLOT),
    };
    match joining {
        Joining::Launch {
            index,
            control_file,
            metrics_file,
        } => {
            cmd.env(contract::ENV_ROLE, contract::ROLE_LAUNCH)
                .env(contract::ENV_LAUNCH_INDEX, index.to_string());
            match &spec.restore {
                Some(dir) => cmd.env(contract::ENV_RESTORE, dir),
                None => cmd.env_remove(contract::ENV_RESTORE),
            };
            if *index == 0 {
                // Node 0 serves the control endpoint (`ductile status`) on a port of its choosing.
                cmd.env(
                    contract::ENV_CONTROL,
                    SocketAddr::new(spec.bind, 0).to_string(),
                )
                .env(contract::ENV_CONTROL_FILE, control_file);
            } else {
                cmd.env_remove(contract::ENV_CONTROL)
                    .env_remove(contract::ENV_CONTROL_FILE);
            }
            match spec.metrics_port {
                // Locally only node 0 serves metrics: the nodes share one
                // address, and node 0 is where the rescales are.
                Some(port) if *index == 0 => cmd
                    .env(
                        contract::ENV_METRICS,
                        SocketAddr::new(spec.bind, port).to_string(),
                    )
                    .env(contract::ENV_METRICS_FILE, metrics_file),
                _ => cmd
                    .env_remove(contract::ENV_METRICS)
                    .env_remove(contract::ENV_METRICS_FILE),
            };
        }
        Joining::Newcomer => {
            // Node 0 never leaves, so a newcomer never serves the control endpoint.
            cmd.env(contract::ENV_ROLE, contract::ROLE_NEWCOMER)
                .env_remove(contract::ENV_RESTORE)
                .env_remove(contract::ENV_LAUNCH_INDEX)
                .env_remove(contract::ENV_CONTROL)
                .env_remove(contract::ENV_CONTROL_FILE)
                .env_remove(contract::ENV_METRICS)
                .env_remove(contract::ENV_METRICS_FILE);
        }
    }
    cmd
}

/// Starts the coordinator and the nodes; records them in `state` and `job.json`.
fn start_processes(
    spec: &JobSpec,
    program: &Path,
    dir: &StateDir,
    fleet: &mut Fleet,
    state: &mut JobState,
    stop: &StopRequest,
    t0: Instant,
) -> Result<(Secret, NodeEnv), LaunchError> {
    let secret = Secret::generate();
    let secret_hex = secret.to_hex();
    dir.write_secret(&secret_hex)?;

    let log_path = dir.coordinator_log();
    let addr_file = dir.addr_file();
    let child = spawn_coordinator(spec, dir, &secret_hex, CoordinatorMode::Launch)?;
    let coordinator_pid = child.id();
    fleet.coordinator = Some(Supervised::new("the coordinator", child));
    tracing::info!(pid = coordinator_pid, "coordinator started");

    let addr = wait_for_addr(spec, &addr_file, &log_path, fleet, stop)?;
    tracing::info!(%addr, "coordinator listening");
    state.coordinator = Some(CoordinatorRecord {
        pid: coordinator_pid,
        addr: addr.clone(),
    });

    let env = NodeEnv {
        coordinator: addr,
        secret_hex,
        launcher_pid: std::process::id().to_string(),
    };
    for index in 0..spec.nodes {
        if let Some(signal) = stop.take() {
            return Err(LaunchError::Interrupted { signal });
        }
        let joining = Joining::Launch {
            index,
            control_file: dir.control_file(),
            metrics_file: dir.metrics_file(),
        };
        let pes = spec.launch_pes(index);
        let slot = (spec.nodes > 1).then_some(index);
        let child = node_command(spec, program, &env, &joining, pes, slot)
            .spawn()
            .map_err(|source| LaunchError::NodeSpawn {
                index,
                program: spec.program.to_string_lossy().into_owned(),
                source,
            })?;
        let pid = child.id();
        tracing::info!(index, pid, pes, "node started");
        state.nodes.push(NodeRecord { index, pid, pes });
        fleet
            .nodes
            .push(Supervised::new(format!("node {index}"), child));
        // At once, while the node is still loading: its quota holds before
        // its PEs start, as a pod's limits hold before its container runs.
        // (Joining between fork and exec would need `unsafe`.)
        if let Some(dir) = spec.node_cgroups.get(index as usize) {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string()).map_err(|source| {
                LaunchError::NodeCgroup {
                    index,
                    dir: dir.clone(),
                    source,
                }
            })?;
        }
    }
    dir.write_job(state)?;
    tracing::debug!(elapsed = ?t0.elapsed(), "all processes started");
    Ok((secret, env))
}

/// Gives a child the launcher's lifeline (its watchdog ends it when this
/// launcher ends, however it ends; see [`process::lifeline_fd`]).
fn hand_down_lifeline(cmd: &mut Command) {
    match process::lifeline_fd() {
        Ok(fd) => cmd.env(lifeline::ENV_LAUNCHER_FD, fd.to_string()),
        Err(problem) => {
            tracing::warn!(%problem, "children will not notice if this launcher is killed");
            cmd.env_remove(lifeline::ENV_LAUNCHER_FD)
        }
    };
}

/// How a coordinator starts.
#[derive(Debug, Clone, Copy)]
enum CoordinatorMode {
    /// For the launch: on a port of its choosing, waiting for the nodes.
    Launch,
    /// After the job's coordinator was lost: on the address the nodes know,
    /// waiting for node 0 to restore it (`--recover`).
    Recover(SocketAddr),
}

/// Starts the coordinator: this binary's `coordinator` subcommand, its output
/// in the state directory's log (appended to by a restarted one), the secret
/// in its environment only, in its own process group.
fn spawn_coordinator(
    spec: &JobSpec,
    dir: &StateDir,
    secret_hex: &str,
    mode: CoordinatorMode,
) -> Result<std::process::Child, LaunchError> {
    let log_path = dir.coordinator_log();
    let log = match mode {
        CoordinatorMode::Launch => File::create(&log_path),
        CoordinatorMode::Recover(_) => File::options().append(true).create(true).open(&log_path),
    }
    .map_err(|source| StateError::Io {
        what: "cannot create",
        path: log_path.clone(),
        source,
    })?;
    let log_err = log.try_clone().map_err(|source| StateError::Io {
        what: "cannot open",
        path: log_path.clone(),
        source,
    })?;
    let launch_timeout_s = spec.launch_timeout.as_secs_f64().ceil().max(1.0) as u64;
    let mut cmd = Command::new(&spec.coordinator_exe);
    cmd.arg("coordinator");
    match mode {
        CoordinatorMode::Launch => cmd
            .arg("--listen")
            .arg(SocketAddr::new(spec.bind, 0).to_string())
            .arg("--expect")
            .arg(spec.nodes.to_string()),
        CoordinatorMode::Recover(addr) => {
            cmd.arg("--listen").arg(addr.to_string()).arg("--recover")
        }
    };
    cmd.arg("--addr-file")
        .arg(dir.addr_file())
        .arg("--secret-env")
        .arg(contract::ENV_SECRET)
        // For a restarted one: how long it waits for node 0's Restore.
        .arg("--launch-timeout")
        .arg(launch_timeout_s.to_string())
        .arg("--heartbeat-timeout")
        .arg(
            spec.heartbeat_timeout
                .map_or(0, |t| t.as_secs().max(3))
                .to_string(),
        )
        .env(contract::ENV_SECRET, secret_hex)
        .env_remove(contract::ENV_SECRET_FILE)
        // Its log is a file: no terminal colour codes in it.
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .process_group(0);
    hand_down_lifeline(&mut cmd);
    cmd.spawn().map_err(|source| LaunchError::CoordinatorSpawn {
        exe: spec.coordinator_exe.clone(),
        source,
    })
}

/// Starts a new coordinator for the running job after the last one was
/// lost: in recovery mode, on the address the nodes know (bound explicitly),
/// with the job's secret, and waits (bounded by the coordinator start
/// timeout) until it listens. On failure nothing of it is left running.
fn restart_coordinator(
    job: &RunningJob<'_>,
    addr: &str,
    stop: &StopRequest,
) -> Result<Supervised, String> {
    let listen: SocketAddr = addr.parse().map_err(|err| {
        format!("the job's coordinator address {addr:?} is not an address: {err}")
    })?;
    let addr_file = job.dir.addr_file();
    // A fresh address file says the new coordinator listens.
    let _ = std::fs::remove_file(&addr_file);
    let child = spawn_coordinator(
        job.spec,
        job.dir,
        &job.env.secret_hex,
        CoordinatorMode::Recover(listen),
    )
    .map_err(|err| err.to_string())?;
    let mut coordinator = Supervised::new("the coordinator", child);
    let deadline = Instant::now() + job.spec.coordinator_start_timeout;
    let failure = loop {
        let listening = std::fs::read_to_string(&addr_file)
            .ok()
            .and_then(|text| text.trim().parse::<SocketAddr>().ok());
        if listening.is_some() {
            return Ok(coordinator);
        }
        if let Some(exit) = coordinator.poll() {
            let last = tail_of(&job.dir.coordinator_log(), 1);
            break format!("it {exit} before listening on {addr} ({})", last.trim());
        }
        if stop.pending() {
            break "the launcher was told to stop".to_owned();
        }
        if Instant::now() >= deadline {
            break format!(
                "it did not listen on {addr} within {:.1}s",
                job.spec.coordinator_start_timeout.as_secs_f64()
            );
        }
        thread::sleep(POLL_INTERVAL);
    };
    stop_all(
        &mut [&mut coordinator],
        Signal::SIGKILL,
        Duration::ZERO,
        || true,
    );
    Err(failure)
}

/// Restarts the lost coordinator (attempt `attempt` of the job), tells the
/// user, records the attempt in the job record, and reports it to the
/// supervisor.
fn restart_lost_coordinator(
    job: &RunningJob<'_>,
    attempt: u32,
    fleet: &mut Fleet,
    sup: &mut Supervisor,
    state: &mut JobState,
    stop: &StopRequest,
    say: &mut dyn FnMut(&str),
) {
    let addr = state
        .coordinator
        .as_ref()
        .map(|c| c.addr.clone())
        .unwrap_or_default();
    let (previous_pid, previous_exit) = fleet
        .coordinator
        .as_ref()
        .map(|c| (c.pid(), c.exit.map(|e| e.to_string()).unwrap_or_default()))
        .unwrap_or_default();
    say(&format!(
        "the coordinator (pid {previous_pid}) {previous_exit} while the job was running; restarting it on {addr} (attempt {attempt} of at most {})",
        job.spec.coordinator_restarts
    ));
    let at_unix_ms = unix_ms(SystemTime::now());
    let mut record = CoordinatorRestartRecord {
        at_unix_ms,
        previous_pid,
        previous_exit,
        pid: None,
        error: None,
    };
    let reported = match restart_coordinator(job, &addr, stop) {
        Ok(coordinator) => {
            let pid = coordinator.pid();
            tracing::info!(pid, %addr, "coordinator restarted");
            say(&format!(
                "the coordinator is back (pid {pid}) on {addr}; the nodes rejoin it and the job goes on"
            ));
            fleet.coordinator = Some(coordinator);
            if let Some(c) = state.coordinator.as_mut() {
                c.pid = pid;
            }
            record.pid = Some(pid);
            Ok(pid)
        }
        Err(why) => {
            say(&format!("the coordinator could not be restarted: {why}"));
            record.error = Some(why.clone());
            Err(why)
        }
    };
    state.coordinator_restarts.push(record);
    sup.coordinator_restart(reported, job.t0.elapsed());
}

/// Waits (bounded) for the coordinator to write its address.
fn wait_for_addr(
    spec: &JobSpec,
    addr_file: &Path,
    log_path: &Path,
    fleet: &mut Fleet,
    stop: &StopRequest,
) -> Result<String, LaunchError> {
    let deadline = Instant::now() + spec.coordinator_start_timeout;
    loop {
        if let Ok(text) = std::fs::read_to_string(addr_file) {
            let text = text.trim();
            if text.parse::<SocketAddr>().is_ok() {
                return Ok(text.to_owned());
            }
        }
        let coordinator = fleet.coordinator.as_mut().expect("coordinator spawned");
        if let Some(exit) = coordinator.poll() {
            return Err(LaunchError::CoordinatorStart {
                reason: format!("it {exit} before writing its address"),
                log_tail: tail_of(log_path, 20),
            });
        }
        if let Some(signal) = stop.take() {
            return Err(LaunchError::Interrupted { signal });
        }
        if Instant::now() >= deadline {
            return Err(LaunchError::CoordinatorStart {
                reason: format!(
                    "no address in {} after {:.1}s",
                    addr_file.display(),
                    spec.coordinator_start_timeout.as_secs_f64()
                ),
                log_tail: tail_of(log_path, 20),
            });
        }
        thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(dir: &Path, name: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn fault_tolerance_is_read_from_the_programs_arguments() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(fault_tolerance_every(&args(&["--iters", "5"])), None);
        assert_eq!(
            fault_tolerance_every(&args(&["+ft-every", "5", "--iters", "9"])),
            Some(5)
        );
        assert_eq!(fault_tolerance_every(&args(&["+ft-every=3"])), Some(3));
        assert_eq!(fault_tolerance_every(&args(&["+ft-every", "0"])), None);
        assert_eq!(fault_tolerance_every(&args(&["+ft-every"])), None);
        assert_eq!(
            fault_tolerance_every(&args(&["+ft-every=2", "+ft-every", "7"])),
            Some(7)
        );
        assert_eq!(fault_tolerance_every(&args(&["+ft-everyone"])), None);
        let mut spec = JobSpec::new("p", args(&["+ft-every", "5"]), 2, 1, PathBuf::from("/tmp"));
        assert!(spec.recovery_bound().is_some());
        spec.args = args(&["--iters", "5"]);
        assert_eq!(spec.recovery_bound(), None);
    }

    #[test]
    fn programs_are_found_in_path_like_the_shell_does() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        script(&a, "tool", 0o644);
        let good = script(&b, "tool", 0o755);
        let path = std::env::join_paths([&a, &b]).unwrap();
        // The first executable match wins; a non-executable one earlier is skipped.
        assert_eq!(
            resolve_program(OsStr::new("tool"), Some(&path)).unwrap(),
            good
        );
        let err = resolve_program(OsStr::new("tool"), Some(a.as_os_str())).unwrap_err();
        assert!(err.to_string().contains("not executable"), "{err}");
        let err = resolve_program(OsStr::new("nothere"), Some(&path)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot run \"nothere\": command not found in PATH"
        );
        assert!(resolve_program(OsStr::new(""), Some(&path)).is_err());
    }

    #[test]
    fn programs_with_a_slash_are_taken_as_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let good = script(tmp.path(), "run.sh", 0o700);
        assert_eq!(resolve_program(good.as_os_str(), None).unwrap(), good);
        let plain = script(tmp.path(), "data.txt", 0o600);
        assert!(resolve_program(plain.as_os_str(), None)
            .unwrap_err()
            .to_string()
            .contains("not executable"));
        assert!(resolve_program(tmp.path().as_os_str(), None)
            .unwrap_err()
            .to_string()
            .contains("directory"));
        let missing = tmp.path().join("missing");
        assert!(resolve_program(missing.as_os_str(), None)
            .unwrap_err()
            .to_string()
            .contains("no such file"));
    }

    #[test]
    fn a_stop_request_is_taken_once() {
        let stop = StopRequest::new();
        assert_eq!(stop.take(), None);
        stop.request(2);
        assert_eq!(stop.take(), Some(2));
        assert_eq!(stop.take(), None);
    }

    #[test]
    fn launch_errors_exit_2_and_interruptions_128_plus_signal() {
        let err = LaunchError::InvalidSpec("x".into());
        assert_eq!(err.exit_code(), 2);
        assert_eq!(LaunchError::Interrupted { signal: 15 }.exit_code(), 143);
    }

    #[test]
    fn invalid_shapes_are_refused_before_anything_starts() {
        let tmp = tempfile::tempdir().unwrap();
        let spec = JobSpec::new("true", vec![], 0, 1, tmp.path().join("s"));
        let err = launch(&spec, &StopRequest::new(), &mut |_| {}).unwrap_err();
        assert!(matches!(err, LaunchError::InvalidSpec(_)));
        assert!(!tmp.path().join("s").exists());
    }
}
