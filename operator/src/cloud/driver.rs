//! The thin shell that runs a job on the simulated cloud in real time.
//!
//! It starts the job with `ductile run` (a child whose output goes to
//! `job.log`), then loops every few milliseconds: it advances the
//! [`Cloud`] to the simulated time, turns what the cloud did into the
//! policy's [`Event`]s (and kills what runs on a terminated instance),
//! watches the job through node 0's control endpoint (members, waiting
//! newcomers, processes gone), and carries out the policy's
//! [`Decision`]s exactly as the Kubernetes reconciler does: replacements
//! become spot instance requests (a node process started in the
//! instance's CPU quota once it has booted), rescales become requests to
//! node 0 fenced by the epoch of the view they were computed from,
//! cancelled newcomers and vacated members give their instance back.
//! No second policy: [`Policy`] decides everything.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ductile_coordinator::control::{CheckpointRequest, ControlClient, JobStatus, RescaleReport, RescaleRequest};
use ductile_coordinator::secret::Secret;
use nix::sys::signal::Signal;

use super::cgroup::{Quotas, CPU_CONTROLLER};
use super::netns::{self, Network};
use super::scenario::Network as NetworkMode;
use super::Scenario;
use super::record::{CheckpointRecord, Mark, NoticeToCommit, RecoveryRecord, Record, RescaleRecord, Sample};
use super::sim::{Cloud, CloudEvent, InstanceState};
use super::{CloudError, Loaded};
use crate::local::channel::{self, Reply, Request};
use crate::local::process::{pid_alive, signal_group};
use crate::local::restart::{self, Killed};
use crate::policy::{Capacity, Decision, Event, MemberId, Policy, Time};
use crate::state::{CONTROL_ADDR_FILE, LAUNCHER_SOCKET_FILE, SECRET_FILE};

/// How often the loop runs.
const TICK: Duration = Duration::from_millis(10);
/// How often the job's status is read.
const STATUS_EVERY: Duration = Duration::from_millis(50);
/// How often the terminal's status line is redrawn.
const LINE_EVERY: Duration = Duration::from_millis(250);
/// How long a rescale request may take before the driver reports it failed.
const RESCALE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a periodic checkpoint may wait for its sync point and write.
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(60);
/// Where `checkpoint-restart` writes its periodic checkpoints, in the
/// state directory: one numbered directory each, the last complete kept.
const PERIODIC_DIR: &str = "ckpt-periodic";
/// The reason of a relaunch after a member was lost (`checkpoint-restart`).
const RECOVERY: &str = "Recovery";
/// How long a killed job's launcher may take to end before it is killed too.
const LAUNCHER_END_TIMEOUT: Duration = Duration::from_secs(15);

/// How the policy's rescales (and, for `checkpoint-restart`, the losses)
/// are carried out: the product, and the papers' three baselines.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Reconfigure the running processes (no process restarts).
    #[default]
    Live,
    /// Checkpoint at the next sync point, end every process, relaunch at
    /// the new size, restore, and balance (the restart with rebalancing).
    Restart,
    /// As `restart`, but the restored job resumes where the restore put
    /// its elements, without a balancing step (`+lb-restore off`).
    RestartNoLb,
    /// Periodic disk checkpoints (`--checkpoint-every`); a rescale kills
    /// every process and relaunches from the last checkpoint, redoing the
    /// work since (the fault-tolerance baseline).
    CheckpointRestart,
}

impl Mode {
    /// The name on the command line and in `cloud.json`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Live => "live",
            Mode::Restart => "restart",
            Mode::RestartNoLb => "restart-no-lb",
            Mode::CheckpointRestart => "checkpoint-restart",
        }
    }

    /// Whether a rescale ends every process and starts the job anew.
    pub fn relaunches(self) -> bool {
        self != Mode::Live
    }
}

/// How a run is carried out.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The `ductile` executable (its `run` starts the job).
    pub ductile: PathBuf,
    /// The launcher's state directory.
    pub state_dir: PathBuf,
    /// Where `job.log`, `cloud.json` and `cloud.svg` go.
    pub out_dir: PathBuf,
    /// How long the job may take before it is stopped (real time).
    pub timeout: Option<Duration>,
    /// Where the cgroup v1 `cpu` controller is (tests may point elsewhere).
    pub cpu_controller: PathBuf,
    /// How the policy's rescales are carried out: live (the product), or by
    /// a relaunch (the baselines; replacement instances then run no process
    /// until the relaunch starts one there).
    pub mode: Mode,
    /// With [`Mode::CheckpointRestart`]: the period of the disk
    /// checkpoints, in simulated seconds (`None`: none, a relaunch starts
    /// the job from the beginning).
    pub checkpoint_every: Option<Duration>,
}

impl RunOptions {
    /// Defaults: `ductile` is this executable, the real controller.
    pub fn new(state_dir: PathBuf, out_dir: PathBuf) -> Self {
        RunOptions {
            ductile: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("ductile")),
            state_dir,
            out_dir,
            timeout: None,
            cpu_controller: PathBuf::from(CPU_CONTROLLER),
            mode: Mode::Live,
            checkpoint_every: None,
        }
    }
}

/// A node process of the job, on an instance.
#[derive(Clone, Debug)]
struct Node {
    pid: u32,
    gone: bool,
}

/// A signal the policy answered: when it came, and the deadline it had.
#[derive(Clone, Debug)]
struct Signalled {
    signal: &'static str,
    real: f64,
    sim: f64,
    deadline: Option<f64>,
}

/// The result of a rescale request, from its thread.
type RescaleOutcome = Result<(RescaleReport, JobStatus), String>;

/// A rescale request on its way.
struct InFlight {
    /// Its entry in the record's rescales.
    index: usize,
    answer: mpsc::Receiver<RescaleOutcome>,
    /// With `--mode restart`: the instances in the relaunched job's node
    /// order (the survivors in their old order, then the admitted ones),
    /// which every process of it will be new on.
    relaunch: Option<Vec<String>>,
    /// With `--mode checkpoint-restart`: real seconds of work since the
    /// checkpoint the relaunch restores, lost and done again.
    redone_s: Option<f64>,
}

/// A kill and relaunch from the last checkpoint, decided and not yet begun
/// (the loop that owns the launcher carries it out).
struct PendingKill {
    /// Its entry in the record's rescales.
    index: usize,
    request: RescaleRequest,
    /// The instances of the relaunched job, in node order.
    order: Vec<String>,
}

/// A periodic checkpoint that completed: where, and when its sync point was.
#[derive(Clone, Debug)]
struct Saved {
    dir: PathBuf,
    /// Real seconds since the start at the checkpoint's sync point (work
    /// after it is lost when the job is killed).
    real: f64,
}

/// With fault tolerance: a member terminated without notice, whose
/// recovery (a view without its node) or catching up is awaited.
struct PendingRecovery {
    /// Its entry in the record's recoveries.
    index: usize,
    /// The epoch of the last view seen before the kill.
    epoch_before: u64,
    /// Progress lines the job had printed when the recovery was seen.
    lines_at_recovery: Option<u64>,
}

/// The result of a periodic checkpoint, from its thread.
type CheckpointOutcome = Result<ductile_coordinator::control::CheckpointReport, String>;

struct Driver<'a> {
    loaded: &'a Loaded,
    opts: &'a RunOptions,
    t0: Instant,
    policy: Policy,
    cloud: Cloud,
    quotas: Option<Quotas>,
    /// The instances' namespaces, with `network: namespaces`.
    net: Option<&'a mut Network>,
    cpu_per_speed: f64,
    addr: String,
    secret: Secret,
    status_client: Option<ControlClient>,
    view: Option<JobStatus>,
    nodes: BTreeMap<String, Node>,
    ready: BTreeSet<String>,
    removed: BTreeSet<String>,
    signalled: BTreeMap<String, Signalled>,
    in_flight: Option<InFlight>,
    /// Members that exited while the rescale removing them was in flight.
    deferred_gone: Vec<String>,
    /// The job's program and arguments as every launch gives them.
    program: PathBuf,
    args: Vec<String>,
    /// `--mode checkpoint-restart`: a kill and relaunch to carry out.
    pending_kill: Option<PendingKill>,
    /// `--mode checkpoint-restart`: the periodic checkpoint being written
    /// (its directory, when it was asked, its answer).
    checkpointing: Option<(PathBuf, f64, mpsc::Receiver<CheckpointOutcome>)>,
    /// `--mode checkpoint-restart`: the last complete checkpoint.
    saved: Option<Saved>,
    /// `--mode checkpoint-restart`: when the next checkpoint is due (simulated).
    next_checkpoint: Option<Time>,
    /// Periodic checkpoints taken so far (their directories' numbers).
    checkpoints_taken: u32,
    /// With fault tolerance (live mode): losses without notice followed.
    recovering: Vec<PendingRecovery>,
    record: Record,
    log: LogTail,
    terminal: Option<io::Stdout>,
    last_line: String,
}

/// Reads the job's log as it grows: its progress and its checksum.
struct LogTail {
    file: Option<File>,
    path: PathBuf,
    partial: String,
    iteration: Option<u64>,
    /// The iteration of the last progress line (it goes back after a
    /// recovery's rollback).
    last: Option<u64>,
    /// Progress lines read.
    lines: u64,
    checksum: Option<String>,
}

impl LogTail {
    fn poll(&mut self) {
        if self.file.is_none() {
            self.file = File::open(&self.path).ok();
        }
        let Some(file) = self.file.as_mut() else { return };
        let mut buf = String::new();
        if file.read_to_string(&mut buf).is_err() {
            return;
        }
        self.partial.push_str(&buf);
        while let Some(end) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=end).collect();
            self.parse(line.trim_end());
        }
    }

    fn parse(&mut self, line: &str) {
        if let Some(i) = progress(line) {
            self.iteration = Some(self.iteration.map_or(i, |j| j.max(i)));
            self.last = Some(i);
            self.lines += 1;
        }
        if let Some(rest) = line.split_whitespace().find_map(|w| w.strip_prefix("checksum=")) {
            self.checksum = Some(rest.to_owned());
        }
    }
}

/// The iteration a program's progress line reports: `iteration N ...`
/// (jacobi2d's residual lines) or `iterations=N` (its last line).
pub fn progress(line: &str) -> Option<u64> {
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        if w == "iteration" {
            if let Some(n) = words.clone().next().and_then(|n| n.parse().ok()) {
                return Some(n);
            }
        }
        if let Some(n) = w.strip_prefix("iterations=").or_else(|| w.strip_prefix("iteration=")) {
            if let Ok(n) = n.parse() {
                return Some(n);
            }
        }
    }
    None
}

/// Runs the job on the cloud until it ends; returns its record (also
/// written to `cloud.json`, with the plot in `cloud.svg`).
pub fn run(loaded: &Loaded, opts: &RunOptions, stop: &Arc<AtomicBool>, say: &mut dyn FnMut(&str)) -> Result<Record, CloudError> {
    check_mode(loaded, opts.mode)?;
    std::fs::create_dir_all(&opts.out_dir).map_err(|e| CloudError::Io(opts.out_dir.clone(), e))?;
    let log_path = opts.out_dir.join("job.log");
    let log = File::create(&log_path).map_err(|e| CloudError::Io(log_path.clone(), e))?;
    let scenario = &loaded.scenario;
    if opts.mode.relaunches() && matches!(scenario.network, NetworkMode::Namespaces) {
        return Err(CloudError::Launch(format!(
            "--mode {} needs `network: loopback`: a relaunch starts every node anew, outside the instances' namespaces",
            opts.mode.name()
        )));
    }

    // Real speed: a CPU quota per instance, or the runtime's emulation.
    let launch = loaded.launch_instances();
    let launch_speed: f64 = launch
        .iter()
        .map(|(_, _, t)| scenario.instance_type(t).map_or(1.0, |t| t.speed * f64::from(t.pes)))
        .sum();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let cpu_per_speed = scenario.cpu_per_speed.unwrap_or(0.9 * cores / launch_speed.max(1e-9));
    let period_us = (scenario.cpu_period_ms * 1000.0).round() as u64;
    let mut quotas = match Quotas::create(&opts.cpu_controller, &loaded.name, period_us) {
        Ok(q) => Some(q),
        Err(e) => {
            say(&format!(
                "warning: CPU quotas are not available ({e}); instance speeds are emulated with +pe-speed for the launch PEs only (they follow PE numbers, not instances, after a rescale)"
            ));
            None
        }
    };
    let mut args = loaded.args.clone();
    if opts.mode == Mode::RestartNoLb {
        // The restored job resumes the restore's placement, unbalanced.
        args.extend(["+lb-restore".to_owned(), "off".to_owned()]);
    }
    if quotas.is_none() {
        if let Some(flag) = emulated_speeds(loaded) {
            args.extend(["+pe-speed".to_owned(), flag]);
        }
    }

    // Real networks: a namespace per instance but node 0's, made before
    // the job starts. Declared before the launcher, so it is removed after
    // the launcher (and every node) is gone, on every way out.
    let mut net = match scenario.network {
        NetworkMode::Loopback => None,
        NetworkMode::Namespaces => Some(create_network(loaded, &opts.state_dir, &launch)?),
    };
    let mut program = PathBuf::from(&loaded.program);
    if let Some(n) = &net {
        args.insert(0, loaded.program.clone());
        program = n.wrapper().to_owned();
    }

    // Each launch node is in its instance's quota from its start, as a pod
    // is inside its limits (the launcher moves it there as it spawns it).
    // Placed once every launch node was in the view, a launch node ran
    // its first load-balancing step unthrottled, at full speed.
    let mut node_cgroups = Vec::new();
    if let Some(q) = quotas.as_mut() {
        let groups: std::io::Result<Vec<PathBuf>> = launch
            .iter()
            .map(|(name, _, itype)| q.prepare(name, instance_cores(scenario, itype, cpu_per_speed).unwrap_or(1.0)))
            .collect();
        match groups {
            Ok(g) => node_cgroups = g,
            Err(e) => say(&format!(
                "warning: the launch instances' CPU quotas cannot be made before their nodes start ({e}); they are placed once the nodes registered"
            )),
        }
    }
    let bind = net.is_some().then(|| netns::BRIDGE_ADDR.to_string());
    let launch_pes = loaded.launch_pes();
    let first = Launch {
        nodes: loaded.replicas,
        node_pes: &launch_pes,
        node_cgroups: &node_cgroups,
        program: &program,
        args: &args,
        restore: None,
        bind: bind.as_deref(),
    };
    let mut cmd = launcher_command(loaded, opts, &first, &log, &log_path)?;
    let started = std::time::SystemTime::now();
    let launcher = cmd
        .spawn()
        .map_err(|e| CloudError::Launch(format!("cannot start {}: {e}", opts.ductile.display())))?;
    let mut launcher = KillOnDrop(Some(launcher));

    let t0 = Instant::now();
    let (addr, secret) = wait_for_job(&opts.state_dir, launcher.child(), stop, Duration::from_secs(60), started)?;
    let mut driver = Driver {
        loaded,
        opts,
        t0,
        policy: Policy::new(loaded.policy.clone(), loaded.replicas),
        cloud: Cloud::new(scenario.clone(), loaded.scripted.clone(), &launch),
        quotas,
        net: net.as_mut(),
        cpu_per_speed,
        addr,
        secret,
        status_client: None,
        view: None,
        nodes: BTreeMap::new(),
        ready: BTreeSet::new(),
        removed: BTreeSet::new(),
        signalled: BTreeMap::new(),
        in_flight: None,
        deferred_gone: Vec::new(),
        program: program.clone(),
        args: args.clone(),
        pending_kill: None,
        checkpointing: None,
        saved: None,
        next_checkpoint: match opts.mode {
            Mode::CheckpointRestart => opts.checkpoint_every,
            _ => None,
        },
        checkpoints_taken: 0,
        recovering: Vec::new(),
        record: Record {
            job: loaded.name.clone(),
            scenario: loaded.scenario_name.clone(),
            time_factor: scenario.time_factor,
            cpu_per_speed,
            cpu_period_ms: scenario.cpu_period_ms,
            target: loaded.replicas,
            target_pes: launch_pes.iter().sum(),
            ..Record::default()
        },
        log: LogTail {
            file: None,
            path: log_path,
            partial: String::new(),
            iteration: None,
            last: None,
            lines: 0,
            checksum: None,
        },
        terminal: io::stdout().is_terminal().then(io::stdout),
        last_line: String::new(),
    };
    driver.record.cgroup = driver.quotas.as_ref().map(|q| q.root().display().to_string());
    driver.record.speed = if driver.quotas.is_some() { "cgroup" } else { "emulated" }.into();
    driver.record.mode = opts.mode.name().into();
    driver.record.fault_tolerance = crate::local::fault_tolerance_every(&args);
    if let Some(n) = driver.net.as_deref() {
        let detail = format!(
            "bridge {} at {}/{}; node 0 and the coordinator there, every other instance in its own namespace",
            n.bridge(),
            netns::BRIDGE_ADDR,
            netns::PREFIX
        );
        driver.mark("network", None, detail, say);
    }
    let exit = driver.run_job(&mut launcher, stop, say);
    driver.finish(exit)
}

/// Refuses, before anything starts, a relaunching mode on a fleet whose
/// types do not all run the job's `pesPerPod` PEs: a relaunch from a
/// checkpoint starts every node with `pesPerPod` PEs (`ductile run
/// --restore` runs nodes of one shape), so it could not keep them.
pub fn check_mode(loaded: &Loaded, mode: Mode) -> Result<(), CloudError> {
    let others = loaded.other_shapes();
    if mode.relaunches() && !others.is_empty() {
        return Err(CloudError::Launch(format!(
            "--mode {} relaunches every node with the job's pesPerPod ({}) PEs, but the fleet has instance types of other PE counts: {}; use --mode live, or types of {} PEs",
            mode.name(),
            loaded.pes,
            others.join(", "),
            loaded.pes
        )));
    }
    Ok(())
}

/// The cores of an instance of type `itype`: its speed times its PEs times
/// the scenario's CPU per unit of speed.
fn instance_cores(scenario: &Scenario, itype: &str, cpu_per_speed: f64) -> Option<f64> {
    let t = scenario.instance_type(itype)?;
    Some(t.speed * f64::from(t.pes) * cpu_per_speed)
}

/// One start of the job by `ductile run`.
struct Launch<'a> {
    nodes: u32,
    /// PEs of each node (`--node-pes`); empty: `pesPerPod` each.
    node_pes: &'a [u32],
    /// The cgroup each node joins before it runs (`--node-cgroups`); empty:
    /// none (the driver places the nodes once they registered).
    node_cgroups: &'a [PathBuf],
    program: &'a Path,
    args: &'a [String],
    /// The checkpoint directory it restores, if any.
    restore: Option<&'a Path>,
    /// The address node 0 and the coordinator bind, if not loopback.
    bind: Option<&'a str>,
}

/// `ductile run` for `launch`, its output going to `log`.
fn launcher_command(loaded: &Loaded, opts: &RunOptions, launch: &Launch<'_>, log: &File, log_path: &Path) -> Result<Command, CloudError> {
    let io = |e| CloudError::Io(log_path.to_owned(), e);
    let mut cmd = Command::new(&opts.ductile);
    cmd.arg("run")
        .arg("--state-dir")
        .arg(&opts.state_dir)
        .arg("--nodes")
        .arg(launch.nodes.to_string())
        .arg("--pes-per-node")
        .arg(loaded.pes.to_string());
    if !launch.node_pes.is_empty() {
        let pes: Vec<String> = launch.node_pes.iter().map(u32::to_string).collect();
        cmd.arg("--node-pes").arg(pes.join(","));
    }
    if !launch.node_cgroups.is_empty() {
        let dirs: Vec<String> = launch.node_cgroups.iter().map(|d| d.display().to_string()).collect();
        cmd.arg("--node-cgroups").arg(dirs.join(","));
    }
    if let Some(t) = opts.timeout {
        cmd.arg("--timeout").arg(format!("{}", t.as_secs_f64()));
    }
    cmd.envs(loaded.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(io)?)
        .stderr(log.try_clone().map_err(io)?);
    if let Some(dir) = launch.restore {
        cmd.arg("--restore").arg(dir);
    }
    if let Some(addr) = launch.bind {
        cmd.arg("--bind").arg(addr);
    }
    cmd.arg("--").arg(launch.program).args(launch.args);
    Ok(cmd)
}

/// The bridge, and a namespace for every launch instance but node 0's,
/// named to the wrapper by launch index.
fn create_network(loaded: &Loaded, state_dir: &Path, launch: &[(String, Capacity, String)]) -> Result<Network, CloudError> {
    std::fs::create_dir_all(state_dir).map_err(|e| CloudError::Io(state_dir.to_owned(), e))?;
    let launch_err = |e: netns::NetError| CloudError::Launch(e.to_string());
    let mut net = Network::create(&loaded.name, state_dir).map_err(launch_err)?;
    for (k, (name, _, _)) in launch.iter().enumerate().skip(1) {
        net.add(name).map_err(launch_err)?;
        net.assign_launch(k as u32, name).map_err(launch_err)?;
    }
    Ok(net)
}

/// Kills the launcher (and so the job) if the driver returns early.
struct KillOnDrop(Option<Child>);

impl KillOnDrop {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("present until dropped")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            if let Ok(None) = child.try_wait() {
                // SIGTERM: the launcher stops every node and the coordinator.
                signal_pid(child.id(), Signal::SIGTERM);
                let _ = child.wait();
            }
        }
    }
}

/// Signals one process (the launcher, which stops its job's process groups itself).
fn signal_pid(pid: u32, signal: Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), signal);
    }
}

/// `+pe-speed` for the launch PEs, relative to the fastest type; global
/// PE numbers are prefix sums of the instances' PE counts.
fn emulated_speeds(loaded: &Loaded) -> Option<String> {
    let types: Vec<(f64, u32)> = loaded
        .launch_instances()
        .iter()
        .map(|(_, _, t)| loaded.scenario.instance_type(t).map_or((1.0, loaded.pes), |t| (t.speed, t.pes)))
        .collect();
    let max = types.iter().map(|t| t.0).fold(0.0, f64::max);
    let mut parts = Vec::new();
    let mut first = 0;
    for (speed, pes) in types {
        if speed < max {
            for pe in first..first + pes {
                parts.push(format!("{pe}:{:.3}", speed / max));
            }
        }
        first += pes;
    }
    (!parts.is_empty()).then(|| parts.join(","))
}

/// Waits until the launcher has written the control address and secret
/// (files older than `since` are a previous job's, not this one's).
fn wait_for_job(
    dir: &Path,
    launcher: &mut Child,
    stop: &AtomicBool,
    limit: Duration,
    since: std::time::SystemTime,
) -> Result<(String, Secret), CloudError> {
    let start = Instant::now();
    let fresh = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).is_ok_and(|t| t >= since);
    loop {
        let read = |n: &str| std::fs::read_to_string(dir.join(n)).map(|s| s.trim().to_owned());
        if let (Ok(addr), Ok(secret)) = (read(CONTROL_ADDR_FILE), read(SECRET_FILE)) {
            if !addr.is_empty() && fresh(&dir.join(CONTROL_ADDR_FILE)) {
                let secret = Secret::from_hex(&secret).map_err(|e| CloudError::Launch(format!("unreadable job secret: {e}")))?;
                return Ok((addr, secret));
            }
        }
        if let Ok(Some(status)) = launcher.try_wait() {
            return Err(CloudError::Launch(format!("the job ended before it started ({status}); see job.log")));
        }
        if stop.load(Ordering::SeqCst) {
            return Err(CloudError::Interrupted);
        }
        if start.elapsed() > limit {
            return Err(CloudError::Launch(format!("the job did not start within {limit:?}; see job.log")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The control address and secret that node 0 published in `dir`.
fn endpoint(dir: &Path) -> Option<(String, Secret)> {
    let read = |n: &str| std::fs::read_to_string(dir.join(n)).ok().map(|s| s.trim().to_owned());
    let addr = read(CONTROL_ADDR_FILE).filter(|a| !a.is_empty())?;
    Some((addr, Secret::from_hex(&read(SECRET_FILE)?).ok()?))
}

impl Driver<'_> {
    fn now(&self) -> (Time, f64) {
        let real = self.t0.elapsed();
        (real.mul_f64(self.record.time_factor), real.as_secs_f64())
    }

    fn mark(&mut self, kind: &str, instance: Option<&str>, detail: String, say: &mut dyn FnMut(&str)) {
        let (sim, real) = self.now();
        let sim = sim.as_secs_f64();
        let who = instance.map(|i| format!(" {i}")).unwrap_or_default();
        let line = format!("[{sim:7.1} s] {kind}{who}{}", if detail.is_empty() { String::new() } else { format!(": {detail}") });
        tracing::info!(sim, kind, instance, "{detail}");
        if self.terminal.is_some() {
            // Events above the status line.
            self.clear_line();
        }
        say(&line);
        self.record.marks.push(Mark {
            sim,
            real,
            kind: kind.to_owned(),
            instance: instance.map(str::to_owned),
            detail,
        });
    }

    fn clear_line(&mut self) {
        if let Some(t) = self.terminal.as_mut() {
            if !self.last_line.is_empty() {
                let _ = write!(t, "\r\x1b[2K");
                let _ = t.flush();
                self.last_line.clear();
            }
        }
    }

    /// Until the job ends: the launcher's exit code.
    fn run_job(&mut self, launcher: &mut KillOnDrop, stop: &AtomicBool, say: &mut dyn FnMut(&str)) -> Option<i32> {
        let mut next_status = Instant::now();
        let mut next_line = Instant::now();
        let mut joined = false;
        let mut stopping = false;
        loop {
            if stop.load(Ordering::SeqCst) && !stopping {
                stopping = true;
                self.mark("report", None, "stopped by the user: stopping the job".into(), say);
                signal_pid(launcher.child().id(), Signal::SIGTERM);
            }
            if let Ok(Some(status)) = launcher.child().try_wait() {
                self.log.poll();
                self.sample();
                return status.code();
            }
            let (now, _) = self.now();
            if Instant::now() >= next_status {
                next_status = Instant::now() + STATUS_EVERY;
                self.read_status(say);
                if !joined {
                    joined = self.join_launch_members(say);
                }
            }
            if joined {
                for event in self.cloud.advance(now) {
                    self.on_cloud(event, say);
                }
                self.poll_rescale(say);
                let decisions = self.policy.decide(self.now().0);
                for d in decisions {
                    self.carry_out(d, say);
                }
                if let Some(kill) = self.pending_kill.take() {
                    self.kill_and_relaunch(launcher, kill, say);
                }
                if self.opts.mode == Mode::CheckpointRestart {
                    self.periodic_checkpoint(say);
                }
            }
            self.log.poll();
            self.follow_catching_up();
            if Instant::now() >= next_line {
                next_line = Instant::now() + LINE_EVERY;
                self.sample();
                self.draw_line();
            }
            std::thread::sleep(TICK);
        }
    }

    fn draw_line(&mut self) {
        let Some(last) = self.record.samples.last().copied() else { return };
        let rate = super::plot::iteration_rate(&self.record).last().map(|r| r.1);
        let event = self.record.marks.last().map_or("-".to_owned(), |m| {
            format!("{} {}", m.kind, m.instance.as_deref().unwrap_or(""))
        });
        let line = format!(
            "sim {:6.0} s  real {:5.1} s | iteration {} ({} it/s) | members {} on-demand + {} spot ({} PEs) | newcomers {} waiting, {} booting | epoch {} | last: {}",
            last.sim,
            last.real,
            last.iteration.map_or("-".into(), |i| i.to_string()),
            rate.map_or("-".into(), |r| format!("{r:.0}")),
            last.on_demand,
            last.spot,
            last.on_demand_pes + last.spot_pes,
            last.waiting,
            last.booting,
            self.view.as_ref().map_or(0, |v| v.epoch),
            event.trim_end()
        );
        if let Some(t) = self.terminal.as_mut() {
            let _ = write!(t, "\r\x1b[2K{line}");
            let _ = t.flush();
            self.last_line = line;
        }
    }

    fn sample(&mut self) {
        let (sim, real) = self.now();
        let (mut on_demand, mut spot, mut on_demand_pes, mut spot_pes) = (0, 0, 0, 0);
        if let Some(view) = &self.view {
            for m in &view.members {
                match self.name_of(m.pid).and_then(|n| self.cloud.instance(n)).map(|i| i.capacity) {
                    Some(Capacity::OnDemand) => (on_demand, on_demand_pes) = (on_demand + 1, on_demand_pes + m.pes),
                    _ => (spot, spot_pes) = (spot + 1, spot_pes + m.pes),
                }
            }
        }
        let booting = self
            .cloud
            .instances()
            .filter(|i| matches!(i.state, InstanceState::Booting | InstanceState::WaitingForCapacity))
            .count() as u32;
        let waiting = self.view.as_ref().map_or(0, |v| v.pending.len()) as u32;
        let waiting_pes = self.view.as_ref().map_or(0, |v| v.pending.iter().map(|p| p.pes).sum());
        self.record.samples.push(Sample {
            sim: sim.as_secs_f64(),
            real,
            on_demand,
            spot,
            on_demand_pes,
            spot_pes,
            waiting,
            waiting_pes,
            booting,
            iteration: self.log.iteration,
        });
    }

    fn name_of(&self, pid: u32) -> Option<&str> {
        self.nodes.iter().find(|(_, n)| n.pid == pid).map(|(name, _)| name.as_str())
    }

    fn read_status(&mut self, say: &mut dyn FnMut(&str)) {
        if self.status_client.is_none() {
            self.status_client = ControlClient::connect(&self.addr, &self.secret, Duration::from_secs(2)).ok();
        }
        let Some(client) = self.status_client.as_mut() else { return };
        match client.status() {
            Ok(status) => self.view = Some(status),
            Err(_) => {
                self.status_client = None;
                return;
            }
        }
        self.follow_recoveries(say);
        self.follow_admissions_outside_rescales(say);
        // Newcomers registered: ready for the policy.
        let pending: Vec<u32> = self.view.as_ref().map(|v| v.pending.iter().map(|p| p.pid).collect()).unwrap_or_default();
        for pid in pending {
            if let Some(name) = self.name_of(pid).map(str::to_owned) {
                if self.ready.insert(name.clone()) {
                    self.check_network(&name, pid, None, say);
                    self.policy.observe(self.now().0, Event::NewcomerReady { newcomer: MemberId(name.clone()) });
                    self.mark("ready", Some(&name), "registered, waiting for admission".into(), say);
                }
            }
        }
        // Processes gone: vacated members, lost members, dead newcomers.
        // During a relaunch every process of the job ends: the survivors
        // are judged again once their instances know their new processes.
        if self.in_flight.as_ref().is_some_and(|f| f.relaunch.is_some()) {
            return;
        }
        let gone: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| !n.gone && !pid_alive(n.pid))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some(n) = self.nodes.get_mut(&name) {
                n.gone = true;
            }
            // A member that the rescale in flight removes may exit before
            // node 0's answer arrives: it is told to the policy after the
            // commit, as a vacated member, not as a lost one.
            let leaving = self
                .in_flight
                .as_ref()
                .is_some_and(|f| self.record.rescales[f.index].remove.contains(&name));
            if leaving {
                self.deferred_gone.push(name);
            } else {
                self.node_gone(name, say);
            }
        }
    }

    fn node_gone(&mut self, name: String, say: &mut dyn FnMut(&str)) {
        let (kind, detail) = if self.removed.contains(&name) {
            ("vacated", "left after the rescale that removed it")
        } else if self.in_view(&name) {
            ("lost", "its node vanished without a rescale")
        } else {
            ("gone", "its newcomer process ended before admission")
        };
        self.mark(kind, Some(&name), detail.into(), say);
        self.policy.observe(self.now().0, Event::MemberGone { member: MemberId(name.clone()) });
        self.cloud.release(self.now().0, &name);
        self.ready.remove(&name);
    }

    fn in_view(&self, name: &str) -> bool {
        let pid = self.nodes.get(name).map(|n| n.pid);
        self.view.as_ref().is_some_and(|v| v.members.iter().any(|m| Some(m.pid) == pid))
    }

    /// Once every launch member is in the view: places them in their
    /// quotas and tells the policy.
    fn join_launch_members(&mut self, say: &mut dyn FnMut(&str)) -> bool {
        let Some(view) = self.view.clone() else { return false };
        if view.members.len() < self.loaded.replicas as usize {
            return false;
        }
        for (k, (name, capacity, itype)) in self.loaded.launch_instances().into_iter().enumerate() {
            let Some(member) = view.members.get(k) else { continue };
            self.nodes.insert(name.clone(), Node { pid: member.pid, gone: false });
            self.place(&name, &itype, member.pid, say);
            let address = String::from_utf8_lossy(&member.address).into_owned();
            self.check_network(&name, member.pid, Some(&address), say);
            self.policy.observe(
                self.now().0,
                Event::MemberJoined {
                    member: MemberId(name.clone()),
                    capacity,
                    root: k == 0,
                },
            );
        }
        self.mark(
            "started",
            None,
            format!("{} members, epoch {}, {} PEs", view.members.len(), view.epoch, view.pes),
            say,
        );
        true
    }

    /// With namespaces: says that `pid` runs in `name`'s namespace (and,
    /// for a member, that it listens on the instance's address), or
    /// reports that it does not.
    fn check_network(&mut self, name: &str, pid: u32, address: Option<&str>, say: &mut dyn FnMut(&str)) {
        let Some(net) = self.net.as_deref() else { return };
        let Some(a) = net.attachment(name).cloned() else { return };
        let inside = net.runs_in(pid, name);
        let listening = address.is_none_or(|addr| addr.starts_with(&format!("{}:", a.addr)));
        if inside == Some(true) && listening {
            let on = address.map(|addr| format!(", listening on {addr}")).unwrap_or_default();
            self.mark("network", Some(name), format!("verified: pid {pid} in namespace {} at {}{on}", a.namespace, a.addr), say);
        } else {
            let msg = format!(
                "pid {pid} is not where it belongs: in namespace {} {inside:?}, address {} (expected {})",
                a.namespace,
                address.unwrap_or("-"),
                a.addr
            );
            self.mark("report", Some(name), msg, say);
        }
    }

    fn place(&mut self, name: &str, itype: &str, pid: u32, say: &mut dyn FnMut(&str)) {
        let Some(cores) = instance_cores(&self.loaded.scenario, itype, self.cpu_per_speed) else { return };
        if let Some(q) = self.quotas.as_mut() {
            if let Err(e) = q.place(name, cores, pid) {
                let msg = format!("cannot put its node into a CPU quota: {e}");
                self.mark("report", Some(name), msg, say);
            }
        }
    }

    fn on_cloud(&mut self, event: CloudEvent, say: &mut dyn FnMut(&str)) {
        let now = self.now().0;
        match event {
            CloudEvent::Booted { instance } => self.start_newcomer(&instance, say),
            CloudEvent::Recommendation { instance } => {
                self.signal(&instance, "recommendation", None);
                self.mark("recommendation", Some(&instance), "rebalance recommendation".into(), say);
                self.policy.observe(now, Event::RebalanceRecommendation { member: MemberId(instance) });
            }
            CloudEvent::Notice { instance, deadline } => {
                self.signal(&instance, "notice", Some(deadline.as_secs_f64()));
                self.mark(
                    "notice",
                    Some(&instance),
                    format!("interruption notice, terminated at {:.0} s", deadline.as_secs_f64()),
                    say,
                );
                self.policy.observe(
                    now,
                    Event::InterruptionNotice {
                        member: MemberId(instance),
                        deadline: Some(deadline),
                    },
                );
            }
            CloudEvent::Terminated { instance, announced } => {
                // Its network goes first, as on a real reclaim.
                let cut = match self.net.as_deref().map(|n| n.cut(&instance)) {
                    Some(Ok(true)) => "link down; ".to_owned(),
                    Some(Err(e)) => format!("its link could not be taken down ({e}); "),
                    Some(Ok(false)) | None => String::new(),
                };
                let running = self.nodes.get(&instance).filter(|n| !n.gone && pid_alive(n.pid)).map(|n| n.pid);
                let what = match running {
                    Some(pid) => {
                        signal_group(pid, Signal::SIGKILL);
                        format!("its node (pid {pid}) was still running and is killed")
                    }
                    None => "nothing ran there any more".into(),
                };
                let kind = if announced { "terminated" } else { "unannounced" };
                self.mark(kind, Some(&instance), format!("{cut}{what}"), say);
                if let (Some(pid), false) = (running, announced) {
                    self.expect_recovery(&instance, pid);
                }
                if !self.nodes.contains_key(&instance) {
                    // A newcomer interrupted while booting, or (restart
                    // mode) before a relaunch put a process there.
                    self.ready.remove(&instance);
                    self.policy.observe(now, Event::MemberGone { member: MemberId(instance) });
                } else if running.is_some() && self.opts.mode == Mode::CheckpointRestart {
                    self.recover(&instance, say);
                }
            }
            CloudEvent::NoSpotCapacity { until } => {
                self.mark("noCapacity", None, format!("no spot capacity until {:.0} s", until.as_secs_f64()), say)
            }
            CloudEvent::Skipped { line, why } => self.mark("skipped", None, format!("scenario line {line}: {why}"), say),
        }
    }

    /// With fault tolerance, in live mode: a member's node killed without
    /// notice is to be recovered from by the runtime (node 0's loss ends
    /// the job: the scenario cannot ask for it). Followed until a view
    /// without it.
    fn expect_recovery(&mut self, instance: &str, pid: u32) {
        if self.record.fault_tolerance.is_none() || self.opts.mode != Mode::Live || !self.in_view(instance) {
            return;
        }
        let (sim, real) = self.now();
        self.record.recoveries.push(RecoveryRecord {
            instance: instance.to_owned(),
            pid,
            sim: sim.as_secs_f64(),
            real,
            iteration_at_kill: self.log.iteration,
            ..RecoveryRecord::default()
        });
        self.recovering.push(PendingRecovery {
            index: self.record.recoveries.len() - 1,
            epoch_before: self.view.as_ref().map_or(0, |v| v.epoch),
            lines_at_recovery: None,
        });
    }

    /// A view of a later epoch without a lost member's node: node 0
    /// committed the recovery.
    fn follow_recoveries(&mut self, say: &mut dyn FnMut(&str)) {
        let Some(view) = self.view.clone() else { return };
        let (_, real) = self.now();
        let lines = self.log.lines;
        let mut done = Vec::new();
        for p in self.recovering.iter_mut().filter(|p| p.lines_at_recovery.is_none()) {
            let r = &mut self.record.recoveries[p.index];
            if view.epoch > p.epoch_before && !view.members.iter().any(|m| m.pid == r.pid) {
                r.recovered_s = Some(real - r.real);
                r.epoch = Some(view.epoch);
                p.lines_at_recovery = Some(lines);
                done.push((r.instance.clone(), real - r.real, view.epoch));
            }
        }
        for (instance, seconds, epoch) in done {
            let detail = format!("the job recovered without its node in {seconds:.2} s (epoch {epoch}), from its last in-memory checkpoint");
            self.mark("recovered", Some(&instance), detail, say);
        }
    }

    /// Newcomers that became members with no rescale in flight: a recovery's
    /// commit admits every newcomer waiting (docs/elasticity.md). The policy
    /// is told they joined, as a commit it asked for would have told it.
    /// While a rescale is in flight its report says whom it admitted.
    fn follow_admissions_outside_rescales(&mut self, say: &mut dyn FnMut(&str)) {
        if self.in_flight.is_some() {
            return;
        }
        let Some(view) = self.view.clone() else { return };
        let joined: Vec<String> = self
            .ready
            .iter()
            .filter(|name| {
                let pid = self.nodes.get(name.as_str()).map(|n| n.pid);
                view.members.iter().any(|m| Some(m.pid) == pid)
            })
            .cloned()
            .collect();
        for name in joined {
            self.ready.remove(&name);
            let capacity = self.cloud.instance(&name).map_or(Capacity::Spot, |i| i.capacity);
            self.policy.observe(
                self.now().0,
                Event::MemberJoined { member: MemberId(name.clone()), capacity, root: false },
            );
            let detail = format!("admitted by the job's own commit (epoch {}): a recovery admits every newcomer waiting", view.epoch);
            self.mark("admitted", Some(&name), detail, say);
        }
    }

    /// A recovered job back past the iteration it had at the kill: the
    /// loss's cost is known.
    fn follow_catching_up(&mut self) {
        let (_, real) = self.now();
        let (lines, last) = (self.log.lines, self.log.last);
        let recoveries = &mut self.record.recoveries;
        self.recovering.retain(|p| {
            let Some(at_recovery) = p.lines_at_recovery else { return true };
            let r = &mut recoveries[p.index];
            let past = match (last, r.iteration_at_kill) {
                (Some(now), Some(then)) => lines > at_recovery && now > then,
                // Nothing to compare with: the recovery is the cost known.
                _ => return false,
            };
            if past {
                r.caught_up_s = Some(real - r.real);
            }
            !past
        });
    }

    fn signal(&mut self, member: &str, signal: &'static str, deadline: Option<f64>) {
        let (sim, real) = self.now();
        let entry = Signalled {
            signal,
            real,
            sim: sim.as_secs_f64(),
            deadline,
        };
        // A notice after a recommendation is what the latency is measured from.
        match self.signalled.get(member) {
            Some(s) if s.signal == "notice" => {}
            _ => {
                self.signalled.insert(member.to_owned(), entry);
            }
        }
    }

    fn start_newcomer(&mut self, instance: &str, say: &mut dyn FnMut(&str)) {
        if self.opts.mode.relaunches() {
            // Nothing to start: a relaunch puts a new process there.
            let itype = self.cloud.instance(instance).map(|i| i.instance_type.clone()).unwrap_or_default();
            self.ready.insert(instance.to_owned());
            self.policy.observe(self.now().0, Event::NewcomerReady { newcomer: MemberId(instance.to_owned()) });
            self.mark("booted", Some(instance), format!("{itype}: ready for the next relaunch"), say);
            return;
        }
        // Its namespace exists before its process does.
        let mut where_ = String::new();
        if let Some(net) = self.net.as_deref_mut() {
            match net.add(instance) {
                Ok(a) => where_ = format!(" in namespace {} at {}", a.namespace, a.addr),
                Err(e) => return self.newcomer_failed(instance, format!("its network namespace could not be made: {e}"), say),
            }
        }
        let socket = self.opts.state_dir.join(LAUNCHER_SOCKET_FILE);
        // Its node runs as many PEs as its type: a replacement may be of
        // another shape than the member it replaces.
        let pes = self.cloud.instance(instance).map_or(self.loaded.pes, |i| i.pes);
        let spawn = Request::Spawn { count: 1, pes: Some(pes) };
        match channel::request(&socket, &spawn, Duration::from_secs(10)) {
            Ok(Reply::Ok(pids)) if pids.len() == 1 => {
                let pid = pids[0];
                self.nodes.insert(instance.to_owned(), Node { pid, gone: false });
                // The wrapper (this pid) waits for its namespace's name.
                if let Some(Err(e)) = self.net.as_deref().map(|n| n.assign_pid(pid, instance)) {
                    signal_group(pid, Signal::SIGKILL);
                    let msg = format!("its node (pid {pid}) could not be told its namespace and is killed: {e}");
                    self.mark("report", Some(instance), msg, say);
                    return;
                }
                let itype = self.cloud.instance(instance).map(|i| i.instance_type.clone()).unwrap_or_default();
                self.place(instance, &itype, pid, say);
                self.mark(
                    "booted",
                    Some(instance),
                    format!("{itype}: newcomer node of {pes} PE{} started (pid {pid}){where_}", if pes == 1 { "" } else { "s" }),
                    say,
                );
            }
            other => {
                let why = match other {
                    Ok(Reply::Error(e)) => e,
                    Ok(Reply::Ok(p)) => format!("unexpected answer {p:?}"),
                    Err(e) => e.to_string(),
                };
                self.newcomer_failed(instance, format!("the launcher did not start its node: {why}"), say);
            }
        }
    }

    fn newcomer_failed(&mut self, instance: &str, why: String, say: &mut dyn FnMut(&str)) {
        self.mark("report", Some(instance), why, say);
        self.cloud.release(self.now().0, instance);
        self.policy.observe(self.now().0, Event::MemberGone { member: MemberId(instance.to_owned()) });
    }

    fn carry_out(&mut self, decision: Decision, say: &mut dyn FnMut(&str)) {
        let now = self.now().0;
        match decision {
            Decision::LaunchReplacement { for_member, newcomer } => {
                let itype = self.cloud.replacement_type(Some(&for_member.0));
                self.cloud.request_spot(now, &newcomer.0, &itype);
                self.mark("launch", Some(&newcomer.0), format!("{itype} spot instance asked for, to replace {for_member}"), say);
            }
            Decision::LaunchNewcomers { newcomers } => {
                for n in newcomers {
                    let itype = self.cloud.replacement_type(None);
                    self.cloud.request_spot(now, &n.0, &itype);
                    self.mark("launch", Some(&n.0), format!("{itype} spot instance asked for, to grow the job"), say);
                }
            }
            Decision::Rescale { remove, admit, reason } => self.request_rescale(remove, admit, reason.to_string(), say),
            Decision::CancelNewcomers { newcomers, reason } => {
                for n in newcomers {
                    if let Some(node) = self.nodes.get(&n.0).filter(|n| !n.gone) {
                        signal_group(node.pid, Signal::SIGTERM);
                    }
                    self.cloud.release(now, &n.0);
                    self.ready.remove(&n.0);
                    self.mark("cancelled", Some(&n.0), reason.to_string(), say);
                }
            }
            Decision::DeleteVacated { member } => self.cloud.release(now, &member.0),
            Decision::Report(r) => self.mark("report", None, format!("{r:?}"), say),
        }
    }

    fn request_rescale(&mut self, remove: Vec<MemberId>, admit: u32, reason: String, say: &mut dyn FnMut(&str)) {
        let (sim, real) = self.now();
        if self.pending_kill.is_some() || self.in_flight.is_some() {
            // Only a recovery relaunch can be under way here (the policy
            // asks for one rescale at a time): it asks again afterwards.
            let why = "a recovery relaunch is under way".to_owned();
            self.mark("report", None, format!("{reason} deferred: {why}"), say);
            self.policy.observe(sim, Event::RescaleFailed { reason: why });
            return;
        }
        let view = self.view.clone();
        let ids: Vec<u32> = remove
            .iter()
            .filter_map(|m| {
                let pid = self.nodes.get(&m.0)?.pid;
                view.as_ref()?.members.iter().find(|v| v.pid == pid).map(|v| v.node)
            })
            .collect();
        let index = self.record.rescales.len();
        self.record.rescales.push(RescaleRecord::asked(
            reason.clone(),
            remove.iter().map(|m| m.0.clone()).collect(),
            admit,
            sim.as_secs_f64(),
            real,
        ));
        let names: Vec<&str> = remove.iter().map(|m| m.0.as_str()).collect();
        self.mark("rescale", None, format!("{reason}: remove [{}], admit {admit}", names.join(", ")), say);
        let (tx, answer) = mpsc::channel();
        let (addr, secret) = (self.addr.clone(), self.secret.clone());
        let epoch = view.as_ref().map_or(0, |v| v.epoch);
        let relaunch = self.opts.mode.relaunches().then(|| self.relaunch_order(&remove, admit));
        let admit = relaunch.as_ref().map_or(admit, |order| (order.len() - self.survivors(&remove).len()) as u32);
        if let (Mode::CheckpointRestart, Some(order)) = (self.opts.mode, relaunch.clone()) {
            // No checkpoint now: the job is killed and relaunched from the
            // last periodic one, by the loop that owns the launcher.
            let request = RescaleRequest { epoch, remove: ids, admit };
            self.pending_kill = Some(PendingKill { index, request, order });
            return;
        }
        let dir = self.opts.state_dir.clone();
        let by_restart = relaunch.is_some();
        std::thread::spawn(move || {
            let outcome = (|| {
                let mut client = ControlClient::connect(&addr, &secret, Duration::from_secs(5)).map_err(|e| e.to_string())?;
                let request = RescaleRequest { epoch, remove: ids, admit };
                if by_restart {
                    let status = client.status().map_err(|e| e.to_string())?;
                    let deadline = Instant::now() + RESCALE_TIMEOUT;
                    let done = restart::restart(&dir, &mut client, &status, &request, deadline).map_err(|e| e.to_string())?;
                    let after = done.status.ok_or("the relaunched job's control endpoint did not answer")?;
                    return Ok((done.report, after));
                }
                let report = client.rescale(request, RESCALE_TIMEOUT).map_err(|e| e.to_string())?;
                let status = client.status().map_err(|e| e.to_string())?;
                Ok((report, status))
            })();
            let _ = tx.send(outcome);
        });
        self.in_flight = Some(InFlight {
            index,
            answer,
            relaunch,
            redone_s: None,
        });
    }

    /// `--mode checkpoint-restart`: kills every process of the job (as the
    /// loss of an instance does), waits for the launcher to end, starts
    /// the job again at the new size from the last periodic checkpoint
    /// (from the beginning when there is none yet), and leaves a thread
    /// waiting for it to have restored.
    fn kill_and_relaunch(&mut self, launcher: &mut KillOnDrop, kill: PendingKill, say: &mut dyn FnMut(&str)) {
        let t0 = Instant::now();
        let Some(before) = self.view.clone() else {
            return self.relaunch_failed(kill.index, "no view of the job to relaunch".into(), say);
        };
        let pids: Vec<u32> = before.members.iter().map(|m| m.pid).filter(|&p| pid_alive(p)).collect();
        for &pid in &pids {
            signal_group(pid, Signal::SIGKILL);
        }
        // The launcher stops the coordinator and ends.
        signal_pid(launcher.child().id(), Signal::SIGTERM);
        let until = Instant::now() + LAUNCHER_END_TIMEOUT;
        loop {
            match launcher.child().try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= until => {
                    let _ = launcher.child().kill();
                    let _ = launcher.child().wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        let kill_ms = t0.elapsed().as_secs_f64() * 1e3;
        // A checkpoint being written died with the job: it is not used.
        if let Some((dir, _, _)) = self.checkpointing.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        let (_, real) = self.now();
        let restore = self.saved.as_ref().map(|s| s.dir.clone());
        let redone_s = real - self.saved.as_ref().map_or(0.0, |s| s.real);
        if let Some(dir) = &restore {
            // A marker from an earlier restore of the same checkpoint.
            let _ = std::fs::remove_file(dir.join(restart::RESTORED_FILE));
        }
        let log_path = self.opts.out_dir.join("job.log");
        let log = match std::fs::OpenOptions::new().append(true).create(true).open(&log_path) {
            Ok(f) => f,
            Err(e) => return self.relaunch_failed(kill.index, format!("cannot open {}: {e}", log_path.display()), say),
        };
        let nodes = kill.order.len() as u32;
        // Uniform shapes only (check_mode): every node runs pesPerPod PEs.
        let launch = Launch {
            nodes,
            node_pes: &[],
            node_cgroups: &[],
            program: &self.program,
            args: &self.args,
            restore: restore.as_deref(),
            bind: None,
        };
        let launched = std::time::SystemTime::now();
        let child = launcher_command(self.loaded, self.opts, &launch, &log, &log_path)
            .map_err(|e| e.to_string())
            .and_then(|mut cmd| cmd.spawn().map_err(|e| format!("cannot start {}: {e}", self.opts.ductile.display())));
        let child = match child {
            Ok(c) => c,
            // The old launcher has ended: the loop sees it and the run ends.
            Err(e) => return self.relaunch_failed(kill.index, e, say),
        };
        launcher.0 = Some(child);
        let from = match &restore {
            Some(dir) => format!("from {} ({redone_s:.2} s of work to redo)", dir.display()),
            None => "from the beginning (no checkpoint yet)".to_owned(),
        };
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let detail = format!(
            "every process of the job (pids {}) killed in {kill_ms:.0} ms; relaunching {nodes} nodes {from}",
            pids.join(",")
        );
        self.mark("killed", None, detail, say);
        let killed = Killed {
            before,
            request: kill.request,
            nodes,
            ckpt: restore,
            t0,
            kill_ms,
            launched,
        };
        let dir = self.opts.state_dir.clone();
        let (tx, answer) = mpsc::channel();
        std::thread::spawn(move || {
            let outcome = restart::await_relaunch(&dir, &killed, Instant::now() + RESCALE_TIMEOUT)
                .map_err(|e| e.to_string())
                .and_then(|done| {
                    let after = done.status.ok_or("the relaunched job's control endpoint did not answer")?;
                    Ok((done.report, after))
                });
            let _ = tx.send(outcome);
        });
        self.in_flight = Some(InFlight {
            index: kill.index,
            answer,
            relaunch: Some(kill.order),
            redone_s: Some(redone_s),
        });
        self.next_checkpoint = self.opts.checkpoint_every.map(|every| self.now().0 + every);
    }

    /// `--mode checkpoint-restart`: a member of the job was killed with
    /// no rescale removing it (unannounced, or at a deadline the policy
    /// did not meet). The job would fail; instead it is killed and
    /// relaunched without that member from the last checkpoint, the
    /// fault-tolerance baseline's recovery. The policy is told the member
    /// is lost, as the reconciler would; the relaunch is the driver's own
    /// (reason `Recovery`), not a rescale the policy asked for. Only when
    /// no other relaunch is under way (then the loss ends the job, as in
    /// the other modes).
    fn recover(&mut self, instance: &str, say: &mut dyn FnMut(&str)) {
        if !self.in_view(instance) || self.removed.contains(instance) || self.in_flight.is_some() || self.pending_kill.is_some() {
            return;
        }
        let (sim, real) = self.now();
        if let Some(n) = self.nodes.get_mut(instance) {
            n.gone = true;
        }
        let detail = "its node was killed with no rescale removing it: the job is relaunched without it from the last checkpoint";
        self.mark("lost", Some(instance), detail.into(), say);
        self.policy.observe(sim, Event::MemberGone { member: MemberId(instance.to_owned()) });
        self.cloud.release(sim, instance);
        self.ready.remove(instance);
        let remove = vec![MemberId(instance.to_owned())];
        let view = self.view.clone();
        let ids: Vec<u32> = view
            .as_ref()
            .and_then(|v| {
                let pid = self.nodes.get(instance)?.pid;
                v.members.iter().find(|m| m.pid == pid).map(|m| m.node)
            })
            .into_iter()
            .collect();
        let index = self.record.rescales.len();
        self.record.rescales.push(RescaleRecord::asked(
            RECOVERY.to_owned(),
            vec![instance.to_owned()],
            0,
            sim.as_secs_f64(),
            real,
        ));
        self.mark("rescale", None, format!("{RECOVERY}: remove [{instance}], admit 0"), say);
        let request = RescaleRequest {
            epoch: view.as_ref().map_or(0, |v| v.epoch),
            remove: ids,
            admit: 0,
        };
        let order = self.survivors(&remove);
        self.pending_kill = Some(PendingKill { index, request, order });
    }

    fn relaunch_failed(&mut self, index: usize, reason: String, say: &mut dyn FnMut(&str)) {
        let (sim, real) = self.now();
        let r = &mut self.record.rescales[index];
        r.done_real = Some(real);
        r.done_sim = Some(sim.as_secs_f64());
        r.error = Some(reason.clone());
        self.mark("failed", None, format!("relaunch failed: {reason}"), say);
        if self.record.rescales[index].reason != RECOVERY {
            self.policy.observe(sim, Event::RescaleFailed { reason });
        }
    }

    /// `--mode checkpoint-restart`: takes in the answer of the checkpoint
    /// being written, and asks node 0 for the next one when it is due (not
    /// while a rescale is under way). Each goes to a directory of its own;
    /// the one before the last complete one is removed.
    fn periodic_checkpoint(&mut self, say: &mut dyn FnMut(&str)) {
        if let Some((dir, asked, answer)) = self.checkpointing.as_ref() {
            let outcome = match answer.try_recv() {
                Err(mpsc::TryRecvError::Empty) => return,
                Ok(o) => o,
                Err(mpsc::TryRecvError::Disconnected) => Err("the checkpoint's thread ended without an answer".into()),
            };
            let (dir, asked) = (dir.clone(), *asked);
            self.checkpointing = None;
            match outcome {
                Ok(report) => {
                    let detail = format!(
                        "{}: {} chares, {} bytes; sync point after {:.0} ms, written in {:.0} ms",
                        dir.display(),
                        report.chares,
                        report.bytes,
                        report.wait_ms,
                        report.write_ms
                    );
                    self.mark("checkpoint", None, detail, say);
                    self.record.checkpoints.push(CheckpointRecord {
                        sim: self.now().0.as_secs_f64(),
                        real: self.now().1,
                        wait_ms: report.wait_ms,
                        write_ms: report.write_ms,
                        bytes: report.bytes,
                    });
                    let saved = Saved {
                        dir,
                        real: asked + report.wait_ms / 1e3,
                    };
                    if let Some(old) = self.saved.replace(saved) {
                        let _ = std::fs::remove_dir_all(old.dir);
                    }
                }
                Err(e) => {
                    self.mark("report", None, format!("periodic checkpoint to {} failed: {e}", dir.display()), say);
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
        }
        let (Some(due), Some(every)) = (self.next_checkpoint, self.opts.checkpoint_every) else { return };
        let (sim, real) = self.now();
        if sim < due || self.in_flight.is_some() || self.pending_kill.is_some() {
            return;
        }
        self.next_checkpoint = Some(sim + every);
        self.checkpoints_taken += 1;
        let dir = self.opts.state_dir.join(PERIODIC_DIR).join(self.checkpoints_taken.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            self.mark("report", None, format!("cannot create {}: {e}", dir.display()), say);
            return;
        }
        let (addr, secret) = (self.addr.clone(), self.secret.clone());
        let request = CheckpointRequest {
            dir: dir.to_string_lossy().into_owned(),
            exit: false,
            wait_ms: 0, // the client sets it from its timeout
        };
        let (tx, answer) = mpsc::channel();
        std::thread::spawn(move || {
            let outcome = ControlClient::connect(&addr, &secret, Duration::from_secs(5))
                .map_err(|e| e.to_string())
                .and_then(|mut c| c.checkpoint(request, CHECKPOINT_TIMEOUT).map_err(|e| e.to_string()));
            let _ = tx.send(outcome);
        });
        self.checkpointing = Some((dir, real, answer));
    }

    /// The members that a rescale removing `remove` keeps, in node order.
    fn survivors(&self, remove: &[MemberId]) -> Vec<String> {
        let Some(view) = self.view.as_ref() else { return Vec::new() };
        view.members
            .iter()
            .filter_map(|m| self.name_of(m.pid))
            .filter(|name| !remove.iter().any(|r| r.0 == *name))
            .map(str::to_owned)
            .collect()
    }

    /// The instances of the job a relaunch makes: the survivors in node
    /// order, then up to `admit` ready instances.
    fn relaunch_order(&self, remove: &[MemberId], admit: u32) -> Vec<String> {
        let mut order = self.survivors(remove);
        let running = |name: &&String| self.cloud.instance(name).is_some_and(|i| i.state == InstanceState::Running);
        order.extend(self.ready.iter().filter(running).take(admit as usize).cloned());
        order
    }

    fn poll_rescale(&mut self, say: &mut dyn FnMut(&str)) {
        let Some(flight) = self.in_flight.as_ref() else { return };
        let index = flight.index;
        let outcome = match flight.answer.try_recv() {
            Ok(o) => o,
            Err(mpsc::TryRecvError::Empty) => return,
            Err(mpsc::TryRecvError::Disconnected) => Err("the rescale request's thread ended without an answer".into()),
        };
        let (relaunch, redone_s) = self.in_flight.take().map_or((None, None), |f| (f.relaunch, f.redone_s));
        let (sim, real) = self.now();
        let sim_s = sim.as_secs_f64();
        {
            let r = &mut self.record.rescales[index];
            r.done_real = Some(real);
            r.done_sim = Some(sim_s);
        }
        match outcome {
            Ok((report, status)) => {
                if let Some(order) = &relaunch {
                    self.relaunched(order, &status, say);
                }
                let admitted: Vec<String> = report
                    .admitted
                    .iter()
                    .filter_map(|id| status.members.get(*id as usize))
                    .filter_map(|m| self.name_of(m.pid).map(str::to_owned))
                    .collect();
                let mechanism: f64 = report.stages.iter().map(|s| s.ms).sum();
                let removed = self.record.rescales[index].remove.clone();
                {
                    let r = &mut self.record.rescales[index];
                    r.epoch = Some(report.epoch);
                    r.admitted = admitted.clone();
                    r.mechanism_ms = Some(mechanism);
                    r.migrations = Some(report.migrations);
                    r.redone_s = redone_s;
                }
                for m in &removed {
                    self.removed.insert(m.clone());
                    if let Some(s) = self.signalled.remove(m) {
                        self.record.notice_to_commit.push(NoticeToCommit {
                            member: m.clone(),
                            signal: s.signal.to_owned(),
                            real_s: real - s.real,
                            sim_s: sim_s - s.sim,
                            before_deadline: s.deadline.map(|d| sim_s <= d),
                        });
                    }
                }
                for a in &admitted {
                    self.ready.remove(a);
                }
                self.view = Some(status);
                self.mark(
                    "committed",
                    None,
                    format!(
                        "{}: removed [{}], admitted [{}], mechanism {mechanism:.1} ms",
                        match (relaunch, self.opts.mode) {
                            (Some(_), Mode::CheckpointRestart) => format!(
                                "killed and relaunched from the last checkpoint ({:.2} s of work redone), epoch {} of a new job",
                                redone_s.unwrap_or(0.0),
                                report.epoch
                            ),
                            (Some(_), Mode::RestartNoLb) => format!(
                                "relaunched from a checkpoint without rebalancing, epoch {} of a new job",
                                report.epoch
                            ),
                            (Some(_), _) => format!(
                                "relaunched from a checkpoint, epoch {} of a new job, {} elements moved by its first step",
                                report.epoch, report.migrations
                            ),
                            (None, _) => format!("epoch {} -> {}", report.epoch_before, report.epoch),
                        },
                        removed.join(", "),
                        admitted.join(", ")
                    ),
                    say,
                );
                // A recovery is the driver's own: the policy asked for none.
                if self.record.rescales[index].reason != RECOVERY {
                    self.policy.observe(
                        sim,
                        Event::RescaleCommitted {
                            epoch: report.epoch,
                            admitted: admitted.into_iter().map(MemberId).collect(),
                        },
                    );
                }
            }
            Err(reason) => {
                self.record.rescales[index].error = Some(reason.clone());
                self.mark("failed", None, format!("rescale failed: {reason}"), say);
                if self.record.rescales[index].reason != RECOVERY {
                    self.policy.observe(sim, Event::RescaleFailed { reason });
                }
            }
        }
        for name in std::mem::take(&mut self.deferred_gone) {
            self.node_gone(name, say);
        }
    }

    /// After a relaunch: every instance of `order` runs the new process
    /// that `status` lists at its index; each goes into its quota, and the
    /// status line and the probes talk to the new node 0.
    fn relaunched(&mut self, order: &[String], status: &JobStatus, say: &mut dyn FnMut(&str)) {
        for (name, member) in order.iter().zip(&status.members) {
            let itype = self.cloud.instance(name).map(|i| i.instance_type.clone()).unwrap_or_default();
            self.nodes.insert(name.clone(), Node { pid: member.pid, gone: false });
            self.place(name, &itype, member.pid, say);
        }
        if order.len() != status.members.len() {
            let msg = format!("the relaunched job has {} members, {} expected", status.members.len(), order.len());
            self.mark("report", None, msg, say);
        }
        match endpoint(&self.opts.state_dir) {
            Some((addr, secret)) => (self.addr, self.secret) = (addr, secret),
            None => self.mark("report", None, "the relaunched job's control endpoint is unreadable".into(), say),
        }
        self.status_client = None;
    }

    fn finish(mut self, exit: Option<i32>) -> Result<Record, CloudError> {
        self.clear_line();
        let (sim, real) = self.now();
        let names: Vec<String> = self.cloud.instances().map(|i| i.name.clone()).collect();
        for n in names {
            self.cloud.release(sim, &n);
        }
        self.record.exit_code = exit;
        self.record.real_seconds = real;
        self.record.sim_seconds = sim.as_secs_f64();
        self.record.iterations = self.log.iteration;
        self.record.checksum = self.log.checksum.clone();
        self.record.instances = self.cloud.instances().cloned().collect();
        self.record.events_not_happened = self.cloud.unreached_scripted();
        if let Some(q) = &self.quotas {
            self.record.throttled = self
                .cloud
                .instances()
                .filter_map(|i| {
                    let (periods, seconds) = q.throttled(&i.name)?;
                    Some(super::record::Throttled { instance: i.name.clone(), periods, seconds })
                })
                .collect();
        }
        // The quotas go once every process of the job is gone.
        drop(self.quotas.take());
        if self.opts.mode == Mode::CheckpointRestart {
            // The periodic checkpoints served this run only.
            let _ = std::fs::remove_dir_all(self.opts.state_dir.join(PERIODIC_DIR));
        }
        Ok(self.record)
    }
}
