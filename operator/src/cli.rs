//! The `ductile` command line: clap definitions and dispatch.
//!
//! * `ductile run`: run a job on the local fleet ([`crate::local::launch`]);
//! * `ductile status`: a running job's membership, from node 0's control
//!   endpoint;
//! * `ductile expand`, `ductile shrink`, `ductile rescale`: resize a running
//!   job without restarting it: newcomers are started by the job's launcher
//!   (asked through [`crate::local::channel`]), the rescale itself is asked of
//!   node 0's control endpoint;
//! * `ductile coordinator`: run a job's coordinator (what `ductile run` and
//!   the Kubernetes operator's pods start), forwarded to
//!   `ductile_coordinator::cli`;
//! * `ductile wait-left`: wait until a node has left its job's view (what
//!   the operator's preStop hook runs; exit codes in [`crate::contract`]);
//! * `ductile operator`: the Kubernetes operator
//!   ([`crate::k8s::entry`], the same as the `ductile-operator` binary).
//!
//! Exit codes of `ductile run`: the job's own code when it completed; 1 when
//! it failed, timed out or could not be stopped cleanly; 2 for usage and
//! launch errors (bad flags, program not found, state directory in use,
//! coordinator or node could not start); 128+N when stopped by signal N.
//! Of the rescaling commands: 0 done, 1 the job or its launcher refused or
//! failed the rescale, 2 usage errors or no running job.
//! See `docs/cli.md`.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{ArgGroup, Args, Parser, Subcommand};
use ductile_coordinator::control::{
    CheckpointRequest, ControlClient, ControlError, JobStatus, RescaleReport, RescaleRequest,
    StageTime,
};
use ductile_coordinator::proto::NodeId;
use ductile_coordinator::secret::Secret;
use serde::Serialize;

use crate::local::channel::{self, ChannelError, Reply, Request, MAX_SPAWN};
use crate::local::process::{pid_alive, POLL_INTERVAL};
use crate::local::{launch, JobSpec, StopRequest};
use crate::state::{
    read_job_state, resolve_state_dir, NewcomerRecord, CONTROL_ADDR_FILE, DEFAULT_JOB,
    LAUNCHER_SOCKET_FILE, SECRET_FILE,
};

/// Exit code for usage and launch errors.
pub const EXIT_USAGE: i32 = 2;
/// Exit code for a job that failed (or timed out, or was left running).
pub const EXIT_FAILED: i32 = 1;

/// `ductile`: run malleable Ductile jobs.
#[derive(Parser, Debug)]
#[command(
    name = "ductile",
    version,
    about = "Run malleable Ductile jobs",
    propagate_version = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a job on this machine: a coordinator and N node processes of PROGRAM.
    #[command(override_usage = "ductile run [OPTIONS] --nodes <N> -- <PROGRAM> [ARGS]...")]
    Run(RunArgs),
    /// Show a running job's membership: epoch, nodes, PEs, waiting newcomers.
    Status(StatusArgs),
    /// Grow a running job: start K newcomers and admit them in one rescale.
    Expand(ExpandArgs),
    /// Shrink a running job: remove its K highest-numbered nodes, or the nodes named.
    Shrink(ShrinkArgs),
    /// Remove nodes and admit K new ones in one rescale.
    Rescale(RescaleArgs),
    /// Run a job's coordinator (started by `ductile run` and by the operator's pods).
    ///
    /// Arguments are those of `ductile coordinator --help`.
    #[command(disable_help_flag = true, disable_version_flag = true)]
    Coordinator {
        /// Arguments for the coordinator.
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGS"
        )]
        args: Vec<OsString>,
    },
    /// Wait until a node has left its job (a pod's preStop hook runs this).
    ///
    /// Asks node 0's control endpoint for the view until no member matches
    /// the host name (and pid, when given). Exit codes: 0 not or no longer a
    /// member, 1 still a member at --timeout, 2 usage errors, 3 the control
    /// endpoint did not answer.
    #[command(name = "wait-left")]
    WaitLeft(WaitLeftArgs),
    /// Run the Kubernetes operator for ElasticJobs (as the `ductile-operator` binary).
    Operator(crate::k8s::entry::OperatorArgs),
}

/// Which running job a command talks to.
#[derive(Args, Debug, Clone)]
pub struct JobTarget {
    /// Job name (as given to `ductile run --job`).
    #[arg(long, value_name = "NAME", default_value = DEFAULT_JOB)]
    pub job: String,
    /// The job's state directory (as given to `ductile run --state-dir`).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// Arguments of `ductile status`.
#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// The job.
    #[command(flatten)]
    pub target: JobTarget,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Options every rescaling command takes.
#[derive(Args, Debug, Clone)]
pub struct RescaleOptions {
    /// The job.
    #[command(flatten)]
    pub target: JobTarget,
    /// Print the report as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Seconds the whole command may take: newcomers registering, then the
    /// rescale itself.
    #[arg(long, value_name = "SECS", default_value = "120", value_parser = parse_secs)]
    pub timeout: Duration,
    /// `live`: reconfigure the running processes (the product). `restart`:
    /// checkpoint at the next load-balancing sync point, end every process
    /// and relaunch the job at its new size from the checkpoint (the
    /// baseline to measure live rescaling against).
    #[arg(long, value_enum, default_value = "live")]
    pub mode: Mode,
}

/// How a rescale is carried out.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Reconfigure the running processes.
    #[default]
    Live,
    /// Checkpoint, end every process, relaunch at the new size, restore.
    Restart,
}

/// Arguments of `ductile expand`.
#[derive(Args, Debug, Clone)]
pub struct ExpandArgs {
    /// Number of nodes to add.
    #[arg(long, short = 'n', value_name = "K", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SPAWN)))]
    pub nodes: u32,
    /// Common options.
    #[command(flatten)]
    pub options: RescaleOptions,
}

/// Arguments of `ductile shrink`.
#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("which").required(true).args(["nodes", "remove"])))]
pub struct ShrinkArgs {
    /// Remove the K highest-numbered nodes (at most all but node 0).
    #[arg(long, short = 'n', value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub nodes: Option<u32>,
    /// Remove these nodes (ids as `ductile status` shows them; never 0).
    #[arg(long, value_name = "ID,...", value_delimiter = ',', num_args = 1..)]
    pub remove: Vec<NodeId>,
    /// Common options.
    #[command(flatten)]
    pub options: RescaleOptions,
}

/// Arguments of `ductile rescale`.
#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("change").required(true).multiple(true).args(["remove", "add"])))]
pub struct RescaleArgs {
    /// Remove these nodes (ids as `ductile status` shows them; never 0).
    #[arg(long, value_name = "ID,...", value_delimiter = ',', num_args = 1..)]
    pub remove: Vec<NodeId>,
    /// Start this many newcomers and admit them.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SPAWN)))]
    pub add: Option<u32>,
    /// Common options.
    #[command(flatten)]
    pub options: RescaleOptions,
}

/// Arguments of `ductile wait-left`.
#[derive(Args, Debug, Clone)]
pub struct WaitLeftArgs {
    /// `host:port` of the job's control endpoint (node 0); the secret then
    /// comes from --secret-file, else DUCTILE_SECRET / DUCTILE_SECRET_FILE.
    /// Absent: the local job named by --job / --state-dir.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "state_dir")]
    pub control: Option<String>,
    /// File holding the job secret (64 hex characters), with --control.
    #[arg(long, value_name = "PATH", requires = "control")]
    pub secret_file: Option<PathBuf>,
    /// The node's host name as it registered [default: this machine's host
    /// name, which in a pod is the pod's name].
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// The node's process id as it registered (where several nodes share a
    /// host name, as on the local fleet).
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Seconds to wait at most.
    #[arg(long, value_name = "SECS", default_value = "115", value_parser = parse_secs)]
    pub timeout: Duration,
    /// Seconds between two status requests.
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_secs)]
    pub interval: Duration,
    /// The local job, when --control is absent.
    #[command(flatten)]
    pub target: JobTarget,
}

/// Arguments of `ductile run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Number of node processes.
    #[arg(long, short = 'n', value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub nodes: u32,
    /// PEs (scheduler threads) per node.
    #[arg(long, short = 'p', value_name = "P", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub pes_per_node: u32,
    /// Job name; names the default state directory.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_JOB)]
    pub job: String,
    /// The job's state directory [default: $DUCTILE_STATE_DIR/NAME, else
    /// ${XDG_STATE_HOME:-$HOME/.local/state}/ductile/NAME].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Transport the nodes use.
    #[arg(long, value_name = "NAME", env = "DUCTILE_TRANSPORT", default_value = "tcp", value_parser = ["tcp", "ucx"])]
    pub transport: String,
    /// IP address the nodes and the coordinator bind.
    #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// Seconds the nodes have to register with the coordinator.
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = parse_secs)]
    pub launch_timeout: Duration,
    /// Wall-clock limit for the whole job, in seconds (default: none).
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub timeout: Option<Duration>,
    /// Seconds the other nodes may keep running after node 0 (or any node
    /// with a nonzero code) exited.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_secs)]
    pub exit_grace: Duration,
    /// How many times the coordinator may be restarted (on the same address,
    /// in recovery mode) if it is lost while the job runs; 0: never.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub coordinator_restarts: u32,
    /// Node 0 serves Prometheus metrics on this port of --bind (0: any free
    /// port; the address is written to metrics.addr in the state directory).
    #[arg(long, value_name = "PORT")]
    pub metrics_port: Option<u16>,
    /// The program every node runs, and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM [ARGS]"
    )]
    pub command: Vec<OsString>,
}

/// Parses a positive number of seconds (`2`, `0.5`).
pub fn parse_secs(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 || secs > 1e9 {
        return Err(format!("{text:?}: expected a positive number of seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Prints a user-facing line: `ductile: ...` on stderr (continuation lines as they are).
pub fn say(line: &str) {
    eprintln!("ductile: {line}");
}

fn to_exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(EXIT_FAILED as u8))
}

/// Parses the process arguments and runs; the binary's `main`.
pub fn main() -> ExitCode {
    match Cli::try_parse() {
        Ok(cli) => to_exit_code(dispatch(cli)),
        Err(err) => {
            let _ = err.print();
            to_exit_code(err.exit_code())
        }
    }
}

/// Runs a parsed command line; returns the process exit code.
pub fn dispatch(cli: Cli) -> i32 {
    match cli.command {
        Command::Run(args) => {
            init_tracing();
            run(args)
        }
        Command::Status(args) => status(args),
        Command::Expand(args) => rescale(Removal::None, args.nodes, &args.options),
        Command::Shrink(args) => {
            let removal = match args.nodes {
                Some(k) => Removal::Highest(k),
                None => Removal::Ids(args.remove),
            };
            rescale(removal, 0, &args.options)
        }
        Command::Rescale(args) => {
            let removal = if args.remove.is_empty() {
                Removal::None
            } else {
                Removal::Ids(args.remove)
            };
            rescale(removal, args.add.unwrap_or(0), &args.options)
        }
        Command::Coordinator { args } => {
            let argv = std::iter::once(OsString::from("ductile coordinator")).chain(args);
            ductile_coordinator::cli::main_with_args(argv)
        }
        Command::WaitLeft(args) => {
            init_tracing();
            wait_left(&args)
        }
        Command::Operator(args) => crate::k8s::entry::run_process("ductile operator", &args),
    }
}

/// Installs the launcher's stderr logger, filtered by `DUCTILE_LOG` (default `warn`).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env(crate::contract::ENV_LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Why a command could not talk to a running job.
#[derive(Debug)]
enum Unreachable {
    /// The job name or state directory is unusable.
    Usage(String),
    /// No job runs there, or its endpoint does not answer.
    NoJob(String),
}

impl Unreachable {
    fn message(&self) -> &str {
        match self {
            Unreachable::Usage(m) | Unreachable::NoJob(m) => m,
        }
    }
}

/// A running job as a tool finds it: its state directory and an
/// authenticated connection to node 0's control endpoint.
struct JobConnection {
    dir: PathBuf,
    addr: String,
    client: ControlClient,
}

/// The state directory, control address and secret of the local job named
/// by `target`.
fn local_endpoint(target: &JobTarget) -> Result<(PathBuf, String, Secret), Unreachable> {
    let dir = resolve_state_dir(target.state_dir.as_deref(), &target.job, |k| {
        std::env::var_os(k)
    })
    .map_err(|err| Unreachable::Usage(err.to_string()))?;
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).map(|s| s.trim().to_string());
    let (Ok(addr), Ok(secret)) = (read(CONTROL_ADDR_FILE), read(SECRET_FILE)) else {
        return Err(Unreachable::NoJob(format!(
            "no running job in {} (start one with `ductile run`)",
            dir.display()
        )));
    };
    let secret = Secret::from_hex(&secret).map_err(|e| {
        Unreachable::NoJob(format!(
            "the job secret in {} is unreadable: {e}",
            dir.display()
        ))
    })?;
    Ok((dir, addr, secret))
}

/// Finds the job named by `target` and connects to its control endpoint.
fn connect_job(target: &JobTarget) -> Result<JobConnection, Unreachable> {
    let (dir, addr, secret) = local_endpoint(target)?;
    let client = ControlClient::connect(&addr, &secret, Duration::from_secs(10)).map_err(|e| {
        Unreachable::NoJob(format!(
            "cannot reach the job's control endpoint at {addr}: {e}"
        ))
    })?;
    Ok(JobConnection { dir, addr, client })
}

/// `ductile status --json`: the job's status, plus the newcomers its
/// launcher started (from `job.json`).
#[derive(Serialize)]
struct StatusOutput<'a> {
    #[serde(flatten)]
    status: &'a JobStatus,
    launcher_newcomers: &'a [NewcomerRecord],
}

/// `ductile status`: asks the running job's node 0 through its control endpoint.
pub fn status(args: StatusArgs) -> i32 {
    let mut job = match connect_job(&args.target) {
        Ok(job) => job,
        Err(err @ Unreachable::Usage(_)) => {
            say(err.message());
            return EXIT_USAGE;
        }
        Err(err) => {
            say(err.message());
            return EXIT_FAILED;
        }
    };
    let status = match job.client.status() {
        Ok(s) => s,
        Err(e) => {
            say(&format!(
                "cannot reach the job's control endpoint at {}: {e}",
                job.addr
            ));
            return EXIT_FAILED;
        }
    };
    // Newcomers are the launcher's to report; a job started otherwise has none.
    let newcomers = read_job_state(&job.dir)
        .map(|state| state.newcomers)
        .unwrap_or_default();
    if args.json {
        let output = StatusOutput {
            status: &status,
            launcher_newcomers: &newcomers,
        };
        match serde_json::to_string_pretty(&output) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                say(&format!("cannot encode the status: {e}"));
                return EXIT_FAILED;
            }
        }
        return 0;
    }
    print!("{}", render_status(&status, &newcomers));
    0
}

/// Whether the node named by `host` (and `pid`, when given) is a member of
/// the view `status` shows. A waiting newcomer is not a member.
pub fn is_member(status: &JobStatus, host: &str, pid: Option<u32>) -> bool {
    status
        .members
        .iter()
        .any(|m| m.host == host && pid.is_none_or(|p| m.pid == p))
}

/// This machine's host name, as a node reports it when it registers.
fn this_host_name() -> Result<String, String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .map_err(|e| format!("cannot read this machine's host name ({e}); pass --host"))
}

/// `ductile wait-left`: polls the job's view until the node has left it
/// (exit codes in [`crate::contract`]).
pub fn wait_left(args: &WaitLeftArgs) -> i32 {
    use crate::contract::{
        WAIT_LEFT_GONE, WAIT_LEFT_STILL_MEMBER, WAIT_LEFT_UNREACHABLE, WAIT_LEFT_UNREACHABLE_AFTER,
        WAIT_LEFT_USAGE,
    };
    let start = Instant::now();
    let deadline = start + args.timeout;
    let host = match args.host.clone().map_or_else(this_host_name, Ok) {
        Ok(host) if !host.is_empty() => host,
        Ok(_) => {
            say("the host name is empty; pass --host");
            return WAIT_LEFT_USAGE;
        }
        Err(problem) => {
            say(&problem);
            return WAIT_LEFT_USAGE;
        }
    };
    let (addr, secret) = match &args.control {
        Some(addr) => {
            let secret = match &args.secret_file {
                Some(path) => crate::contract::secret_from_file(&path.to_string_lossy()),
                None => crate::contract::secret_from_env(),
            };
            match secret {
                Ok(secret) => (addr.clone(), secret),
                Err(e) => {
                    say(&e.to_string());
                    return WAIT_LEFT_USAGE;
                }
            }
        }
        None => match local_endpoint(&args.target) {
            Ok((_, addr, secret)) => (addr, secret),
            Err(err) => {
                say(err.message());
                return WAIT_LEFT_USAGE;
            }
        },
    };
    let who = match args.pid {
        Some(pid) => format!("host {host} pid {pid}"),
        None => format!("host {host}"),
    };
    tracing::info!(%addr, node = %who, timeout = ?args.timeout, "waiting for the node to leave the job");
    let mut client: Option<ControlClient> = None;
    let mut failing_since: Option<Instant> = None;
    loop {
        let answer = match client.as_mut() {
            Some(c) => c.status(),
            None => {
                ControlClient::connect(&addr, &secret, Duration::from_secs(5)).and_then(|mut c| {
                    let status = c.status();
                    client = Some(c);
                    status
                })
            }
        };
        let now = Instant::now();
        match answer {
            Ok(status) => {
                failing_since = None;
                if !is_member(&status, &host, args.pid) {
                    say(&format!(
                        "{who} is not a member of the job at epoch {} (waited {:.1}s)",
                        status.epoch,
                        start.elapsed().as_secs_f64()
                    ));
                    return WAIT_LEFT_GONE;
                }
                tracing::debug!(epoch = status.epoch, node = %who, "still a member");
                if now >= deadline {
                    say(&format!(
                        "{who} is still a member at epoch {} after --timeout ({:.1}s)",
                        status.epoch,
                        args.timeout.as_secs_f64()
                    ));
                    return WAIT_LEFT_STILL_MEMBER;
                }
            }
            Err(error) => {
                client = None;
                let since = *failing_since.get_or_insert(now);
                tracing::info!(%addr, %error, "the control endpoint did not answer");
                if now.duration_since(since) >= WAIT_LEFT_UNREACHABLE_AFTER || now >= deadline {
                    say(&format!(
                        "the job's control endpoint at {addr} did not answer for {:.1}s: {error}",
                        now.duration_since(since).as_secs_f64()
                    ));
                    return WAIT_LEFT_UNREACHABLE;
                }
            }
        }
        std::thread::sleep(args.interval.min(deadline.saturating_duration_since(now)));
    }
}

/// The human form of `ductile status`.
pub fn render_status(status: &JobStatus, newcomers: &[NewcomerRecord]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "epoch {}  nodes {}  PEs {}  pending newcomers {}  up {:.1}s",
        status.epoch,
        status.members.len(),
        status.pes,
        status.pending.len(),
        status.uptime_ms as f64 / 1e3
    );
    let _ = writeln!(
        out,
        "{:>5} {:>6} {:>4} {:>8}  host",
        "node", "uid", "PEs", "pid"
    );
    for m in &status.members {
        let _ = writeln!(
            out,
            "{:>5} {:>6} {:>4} {:>8}  {}",
            m.node, m.uid, m.pes, m.pid, m.host
        );
    }
    for p in &status.pending {
        let _ = writeln!(
            out,
            "pending newcomer uid {} ({} PEs, pid {}, {})",
            p.uid, p.pes, p.pid, p.host
        );
    }
    if !newcomers.is_empty() {
        let _ = writeln!(out, "newcomers started by the launcher:");
        let _ = writeln!(out, "{:>9} {:>8}  state", "newcomer", "pid");
        for (n, record) in newcomers.iter().enumerate() {
            let _ = writeln!(out, "{n:>9} {:>8}  {}", record.pid, record.describe());
        }
    }
    out
}

/// Which nodes a rescale removes, as the user named them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// None.
    None,
    /// The K highest-numbered nodes.
    Highest(u32),
    /// These node ids.
    Ids(Vec<NodeId>),
}

/// Turns what the user asked for into the request for a job of `nodes`
/// nodes: the ids to remove (ascending) and how many newcomers to admit.
/// Node 0 never leaves.
pub fn plan_rescale(removal: &Removal, add: u32, nodes: u32) -> Result<RescaleRequest, String> {
    let remove: Vec<NodeId> = match removal {
        Removal::None => Vec::new(),
        Removal::Highest(k) if *k >= nodes => {
            return Err(format!(
                "cannot remove {k} of the job's {nodes} node{}: node 0 never leaves, so at most {}",
                if nodes == 1 { "" } else { "s" },
                nodes.saturating_sub(1)
            ))
        }
        Removal::Highest(k) => (nodes - k..nodes).collect(),
        Removal::Ids(ids) => {
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            for pair in sorted.windows(2) {
                if pair[0] == pair[1] {
                    return Err(format!("node {} is named twice", pair[0]));
                }
            }
            if sorted.first() == Some(&0) {
                return Err("node 0 never leaves: it runs the job's main chare and serves its control endpoint".to_owned());
            }
            if let Some(&id) = sorted.iter().find(|&&id| id >= nodes) {
                return Err(format!(
                    "there is no node {id}: the job's nodes are 0..={}",
                    nodes.saturating_sub(1)
                ));
            }
            sorted
        }
    };
    if remove.is_empty() && add == 0 {
        return Err("nothing to do: name nodes to remove or a number to add".to_owned());
    }
    Ok(RescaleRequest { remove, admit: add })
}

/// `ductile expand/shrink/rescale --json`: the job's report, plus the pids of
/// the newcomers this command had the launcher start.
#[derive(Serialize)]
struct RescaleOutput<'a> {
    #[serde(flatten)]
    report: &'a RescaleReport,
    spawned_pids: &'a [u32],
}

fn ids(ids: &[NodeId]) -> String {
    if ids.is_empty() {
        return "-".to_owned();
    }
    ids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The human form of a rescale's report.
pub fn render_report(report: &RescaleReport, spawned_pids: &[u32]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "epoch       {} -> {}",
        report.epoch_before, report.epoch
    );
    let _ = writeln!(out, "PEs         {} -> {}", report.pes_before, report.pes);
    let _ = writeln!(out, "removed     {}", ids(&report.removed));
    let _ = writeln!(out, "admitted    {}", ids(&report.admitted));
    if !spawned_pids.is_empty() {
        let pids: Vec<String> = spawned_pids.iter().map(u32::to_string).collect();
        let _ = writeln!(out, "started     pids {}", pids.join(", "));
    }
    let _ = writeln!(out, "migrations  {}", report.migrations);
    // GPU work is part of the stages above it; shown indented under them.
    let gpu: Vec<(String, f64)> = report
        .gpu
        .iter()
        .map(|g| (format!("  of which gpu {}", g.stage), g.ms))
        .collect();
    let width = report
        .stages
        .iter()
        .map(|s| s.stage.len())
        .chain(gpu.iter().map(|(name, _)| name.len()))
        .chain(["mechanism".len()])
        .max()
        .unwrap_or(0);
    let _ = writeln!(out);
    let _ = writeln!(out, "{:<width$} {:>10}", "stage", "ms");
    for stage in &report.stages {
        let _ = writeln!(out, "{:<width$} {:>10.2}", stage.stage, stage.ms);
    }
    for (name, ms) in &gpu {
        let _ = writeln!(out, "{name:<width$} {ms:>10.2}");
    }
    let _ = writeln!(out, "{:<width$} {:>10.2}", "mechanism", report.mechanism_ms);
    let _ = writeln!(out, "{:<width$} {:>10.2}", "total", report.total_ms);
    out
}

/// How a newcomer this command started is gone, if it is (as the launcher
/// recorded it, once it has).
fn newcomer_gone(dir: &Path, pid: u32) -> Option<Option<String>> {
    if pid_alive(pid) {
        return None;
    }
    let recorded = read_job_state(dir)
        .ok()
        .and_then(|state| state.newcomers.into_iter().find(|n| n.pid == pid))
        .and_then(|n| n.exit);
    Some(recorded)
}

/// Asks the launcher to stop newcomers that will not be admitted, so none is
/// left waiting; tells the user if it cannot.
fn stop_unadmitted(dir: &Path, pids: &[u32]) {
    let alive: Vec<u32> = pids.iter().copied().filter(|&p| pid_alive(p)).collect();
    if alive.is_empty() {
        return;
    }
    let socket = dir.join(LAUNCHER_SOCKET_FILE);
    match channel::request(
        &socket,
        &Request::Stop {
            pids: alive.clone(),
        },
        Duration::from_secs(10),
    ) {
        Ok(Reply::Ok(_)) => say(&format!(
            "stopped the newcomers started for it (pids {})",
            pid_list(&alive)
        )),
        Ok(Reply::Error(message)) => say(&format!(
            "could not stop the newcomers started for it (pids {}): {message}",
            pid_list(&alive)
        )),
        Err(err) => say(&format!(
            "could not stop the newcomers started for it (pids {}): {err}",
            pid_list(&alive)
        )),
    }
}

fn pid_list(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `ductile expand`, `ductile shrink` and `ductile rescale`: checks the
/// request against the job's membership, has the launcher start the
/// newcomers and waits until they are registered, then asks node 0 for the
/// rescale and reports it. Returns the exit code.
pub fn rescale(removal: Removal, add: u32, options: &RescaleOptions) -> i32 {
    let deadline = Instant::now() + options.timeout;
    let mut job = match connect_job(&options.target) {
        Ok(job) => job,
        Err(err) => {
            say(err.message());
            return EXIT_USAGE;
        }
    };
    let status = match job.client.status() {
        Ok(status) => status,
        Err(e) => {
            say(&format!("the job did not answer a status request: {e}"));
            return EXIT_FAILED;
        }
    };
    let request = match plan_rescale(&removal, add, status.members.len() as u32) {
        Ok(request) => request,
        Err(message) => {
            say(&message);
            return EXIT_USAGE;
        }
    };

    if options.mode == Mode::Restart {
        return rescale_by_restart(job, &status, &request, options, deadline);
    }

    let mut spawned: Vec<u32> = Vec::new();
    if add > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        let asked = ask_launcher(&job.dir, &Request::Spawn { count: add }, left);
        match asked {
            Ok(pids) => spawned = pids,
            Err(code) => return code,
        }
        say(&format!(
            "started {} newcomer{} (pid{} {}); waiting for {} to register",
            spawned.len(),
            if spawned.len() == 1 { "" } else { "s" },
            if spawned.len() == 1 { "" } else { "s" },
            pid_list(&spawned),
            if spawned.len() == 1 { "it" } else { "them" },
        ));
        if let Err(message) = wait_for_newcomers(&mut job, &spawned, add, deadline, options.timeout)
        {
            say(&message);
            stop_unadmitted(&job.dir, &spawned);
            return EXIT_FAILED;
        }
    }

    let left = deadline.saturating_duration_since(Instant::now());
    let report = match job
        .client
        .rescale(request, left.max(Duration::from_millis(1)))
    {
        Ok(report) => report,
        Err(ControlError::Refused(message)) => {
            say(&format!("the job refused the rescale: {message}"));
            stop_unadmitted(&job.dir, &spawned);
            return EXIT_FAILED;
        }
        Err(ControlError::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            say(&format!(
                "the job did not report the rescale within --timeout ({:.1}s); it may still complete: see `ductile status`",
                options.timeout.as_secs_f64()
            ));
            return EXIT_FAILED;
        }
        Err(e) => {
            say(&format!(
                "the rescale failed: {e}; see `ductile status` for where the job stands"
            ));
            return EXIT_FAILED;
        }
    };
    print_report(&report, &spawned, options.json)
}

/// Sends `request` to the job's launcher (`STATE/launcher.sock`); its
/// answer's pids, or the exit code after saying what went wrong.
fn ask_launcher(dir: &Path, request: &Request, timeout: Duration) -> Result<Vec<u32>, i32> {
    let socket = dir.join(LAUNCHER_SOCKET_FILE);
    match channel::request(&socket, request, timeout) {
        Ok(Reply::Ok(pids)) => Ok(pids),
        Ok(Reply::Error(message)) => {
            say(&format!(
                "the launcher refused `{}`: {message}",
                request.to_line().trim_end()
            ));
            Err(EXIT_FAILED)
        }
        Err(err @ ChannelError::NoLauncher { .. }) => {
            say(&err.to_string());
            Err(EXIT_USAGE)
        }
        Err(err) => {
            say(&err.to_string());
            Err(EXIT_FAILED)
        }
    }
}

/// Prints a rescale's report as a table or JSON; returns the exit code.
fn print_report(report: &RescaleReport, spawned: &[u32], json: bool) -> i32 {
    if json {
        let output = RescaleOutput {
            report,
            spawned_pids: spawned,
        };
        match serde_json::to_string_pretty(&output) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                say(&format!("cannot encode the report: {e}"));
                return EXIT_FAILED;
            }
        }
    } else {
        print!("{}", render_report(report, spawned));
    }
    0
}

/// `--mode restart`: the kill-and-restart baseline. Arranges with the
/// launcher to relaunch the job at its new size, asks node 0 for a
/// checkpoint that ends the job, and waits until the relaunched job has
/// restored it and run its first load-balancing step (`restored.json` in
/// the checkpoint directory). Stages: `sync` (until the next sync point and
/// quiescence), `checkpoint` (writing), `relaunch` (processes ending and
/// starting, launch barrier), `restore` (reading and placing every chare),
/// `balance`; the mechanism is checkpoint + relaunch + restore.
fn rescale_by_restart(
    mut job: JobConnection,
    status: &JobStatus,
    request: &RescaleRequest,
    options: &RescaleOptions,
    deadline: Instant,
) -> i32 {
    let t0 = Instant::now();
    let nodes = status.members.len() as u32 - request.remove.len() as u32 + request.admit;
    let ckpt = job.dir.join("ckpt");
    let _ = std::fs::remove_dir_all(&ckpt);
    if let Err(e) = std::fs::create_dir_all(&ckpt) {
        say(&format!("cannot create {}: {e}", ckpt.display()));
        return EXIT_FAILED;
    }
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let arranged = Request::Restart {
        nodes,
        dir: ckpt.clone(),
    };
    if let Err(code) = ask_launcher(&job.dir, &arranged, left()) {
        return code;
    }
    let checkpoint = CheckpointRequest {
        dir: ckpt.to_string_lossy().into_owned(),
        exit: true,
        wait_ms: 0, // the client sets it from its timeout
    };
    let written = match job.client.checkpoint(checkpoint, left()) {
        Ok(written) => written,
        Err(e @ ControlError::Refused(_)) => {
            // Nothing was checkpointed and the job goes on: the relaunch
            // arranged above must not fire later.
            say(&format!("the checkpoint failed: {e}"));
            let cancel = ask_launcher(&job.dir, &Request::CancelRestart, Duration::from_secs(5));
            if cancel.is_ok() {
                say("the job goes on at its size; the arranged relaunch was cancelled");
            }
            return EXIT_FAILED;
        }
        Err(e) => {
            say(&format!(
                "no answer to the checkpoint: {e}; the job may still checkpoint at its next sync point \
                 and be relaunched with {nodes} node(s) (see `ductile status`)"
            ));
            return EXIT_FAILED;
        }
    };
    let checkpointed = Instant::now();
    let marker = ckpt.join("restored.json");
    let restored: serde_json::Value = loop {
        if let Ok(text) = std::fs::read_to_string(&marker) {
            match serde_json::from_str(&text) {
                Ok(v) => break v,
                Err(e) => {
                    say(&format!("{} is unreadable: {e}", marker.display()));
                    return EXIT_FAILED;
                }
            }
        }
        if Instant::now() >= deadline {
            say(&format!(
                "the relaunched job did not restore within --timeout ({:.1}s); see the launcher's output and `ductile status`",
                options.timeout.as_secs_f64()
            ));
            return EXIT_FAILED;
        }
        std::thread::sleep(POLL_INTERVAL);
    };
    let restored_at = Instant::now();
    let field = |k: &str| restored[k].as_f64().unwrap_or(0.0);
    let (place_ms, balance_ms, restore_total) =
        (field("place_ms"), field("balance_ms"), field("total_ms"));
    let relaunch_ms = ((restored_at - checkpointed).as_secs_f64() * 1e3 - restore_total).max(0.0);
    let epoch = connect_job(&options.target)
        .ok()
        .and_then(|mut j| j.client.status().ok())
        .map_or(0, |s| s.epoch);
    let stage = |stage: &str, ms: f64| StageTime {
        stage: stage.to_owned(),
        ms,
    };
    let report = RescaleReport {
        epoch_before: status.epoch,
        epoch,
        removed: request.remove.clone(),
        admitted: Vec::new(),
        pes_before: status.pes,
        pes: restored["pes"].as_u64().unwrap_or(0) as u32,
        migrations: 0,
        stages: vec![
            stage("sync", written.wait_ms),
            stage("checkpoint", written.write_ms),
            stage("relaunch", relaunch_ms),
            stage("restore", place_ms),
            stage("balance", balance_ms),
        ],
        mechanism_ms: written.write_ms + relaunch_ms + place_ms,
        total_ms: t0.elapsed().as_secs_f64() * 1e3,
        gpu: Vec::new(),
    };
    print_report(&report, &[], options.json)
}

/// Polls the job's status until at least `count` newcomers wait for
/// admission; fails if one of `spawned` ends first or the deadline passes.
fn wait_for_newcomers(
    job: &mut JobConnection,
    spawned: &[u32],
    count: u32,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), String> {
    // A pid gone but not yet recorded by the launcher: give the record a moment.
    let mut gone_since: Option<Instant> = None;
    loop {
        let status = job
            .client
            .status()
            .map_err(|e| format!("the job did not answer a status request: {e}"))?;
        if status.pending.len() >= count as usize {
            return Ok(());
        }
        for &pid in spawned {
            if let Some(exit) = newcomer_gone(&job.dir, pid) {
                let since = *gone_since.get_or_insert_with(Instant::now);
                if exit.is_some() || since.elapsed() >= Duration::from_millis(500) {
                    let how = exit.unwrap_or_else(|| "is gone".to_owned());
                    return Err(format!(
                        "newcomer pid {pid} {how} before the rescale (its output is in the `ductile run` terminal); nothing was rescaled"
                    ));
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "only {} of {count} newcomers registered with the job within --timeout ({:.1}s); nothing was rescaled",
                status.pending.len(),
                timeout.as_secs_f64()
            ));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// `ductile run`: builds the [`JobSpec`], runs it, reports; returns the exit code.
pub fn run(args: RunArgs) -> i32 {
    let state_dir = match resolve_state_dir(args.state_dir.as_deref(), &args.job, |k| {
        std::env::var_os(k)
    }) {
        Ok(dir) => dir,
        Err(err) => {
            say(&err.to_string());
            return EXIT_USAGE;
        }
    };
    let mut command = args.command.into_iter();
    let Some(program) = command.next() else {
        say("no PROGRAM given");
        return EXIT_USAGE;
    };
    let mut spec = JobSpec::new(
        program,
        command.collect(),
        args.nodes,
        args.pes_per_node,
        state_dir,
    );
    spec.job = args.job;
    spec.transport = args.transport;
    spec.bind = args.bind;
    spec.launch_timeout = args.launch_timeout;
    spec.timeout = args.timeout;
    spec.exit_grace = args.exit_grace;
    spec.coordinator_restarts = args.coordinator_restarts;
    spec.metrics_port = args.metrics_port;
    match std::env::current_exe() {
        Ok(exe) => spec.coordinator_exe = exe,
        Err(err) => {
            say(&format!(
                "cannot find the ductile executable to start the coordinator: {err}"
            ));
            return EXIT_USAGE;
        }
    }

    let stop = StopRequest::new();
    if let Err(err) = stop.install_signal_handlers() {
        say(&format!("cannot install signal handlers: {err}"));
        return EXIT_USAGE;
    }
    match launch(&spec, &stop, &mut |line| say(line)) {
        Ok(report) if !report.all_stopped => EXIT_FAILED,
        Ok(report) => report.exit_code(),
        Err(err) => {
            say(&err.to_string());
            err.exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_parses_program_and_its_flags() {
        let cli = Cli::try_parse_from([
            "ductile",
            "run",
            "--nodes",
            "4",
            "--pes-per-node",
            "2",
            "--timeout",
            "1.5",
            "--",
            "prog",
            "--x",
            "-y",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert_eq!(args.nodes, 4);
        assert_eq!(args.pes_per_node, 2);
        assert_eq!(args.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(args.launch_timeout, Duration::from_secs(60));
        assert_eq!(args.coordinator_restarts, 3, "the default");
        assert_eq!(args.command, ["prog", "--x", "-y"].map(OsString::from));
        let cli = Cli::try_parse_from([
            "ductile",
            "run",
            "-n",
            "1",
            "--coordinator-restarts",
            "0",
            "--",
            "prog",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert_eq!(args.coordinator_restarts, 0);
    }

    #[test]
    fn run_rejects_bad_shapes_and_durations() {
        for bad in [
            &["ductile", "run", "--nodes", "0", "--", "p"][..],
            &["ductile", "run", "--nodes", "1"],
            &[
                "ductile",
                "run",
                "--nodes",
                "1",
                "--timeout",
                "-1",
                "--",
                "p",
            ],
            &[
                "ductile",
                "run",
                "--nodes",
                "1",
                "--transport",
                "carrier-pigeon",
                "--",
                "p",
            ],
        ] {
            let err = Cli::try_parse_from(bad).unwrap_err();
            assert_eq!(err.exit_code(), EXIT_USAGE, "{bad:?}");
        }
    }

    #[test]
    fn coordinator_args_are_forwarded_untouched() {
        let cli =
            Cli::try_parse_from(["ductile", "coordinator", "--expect", "2", "--help"]).unwrap();
        let Command::Coordinator { args } = cli.command else {
            panic!("not coordinator")
        };
        assert_eq!(args, ["--expect", "2", "--help"].map(OsString::from));
    }

    #[test]
    fn seconds_parse() {
        assert_eq!(parse_secs("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_secs("0.25"), Ok(Duration::from_millis(250)));
        assert!(parse_secs("0").is_err());
        assert!(parse_secs("soon").is_err());
        assert!(parse_secs("inf").is_err());
    }

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("ductile").chain(args.iter().copied()))
            .map(|c| c.command)
    }

    #[test]
    fn rescaling_commands_parse() {
        let Command::Expand(args) =
            parse(&["expand", "--nodes", "2", "--job", "j", "--json"]).unwrap()
        else {
            panic!("not expand")
        };
        assert_eq!(args.nodes, 2);
        assert_eq!(args.options.target.job, "j");
        assert!(args.options.json);
        assert_eq!(args.options.timeout, Duration::from_secs(120));

        let Command::Shrink(args) = parse(&[
            "shrink",
            "--remove",
            "3,1",
            "--state-dir",
            "/s",
            "--timeout",
            "5",
        ])
        .unwrap() else {
            panic!("not shrink")
        };
        assert_eq!((args.nodes, args.remove), (None, vec![3, 1]));
        assert_eq!(args.options.target.state_dir, Some(PathBuf::from("/s")));
        assert_eq!(args.options.timeout, Duration::from_secs(5));

        let Command::Shrink(args) = parse(&["shrink", "-n", "1"]).unwrap() else {
            panic!("not shrink")
        };
        assert_eq!((args.nodes, args.remove), (Some(1), vec![]));

        let Command::Rescale(args) =
            parse(&["rescale", "--remove", "2", "--remove", "4", "--add", "3"]).unwrap()
        else {
            panic!("not rescale")
        };
        assert_eq!((args.remove, args.add), (vec![2, 4], Some(3)));
        let Command::Rescale(args) = parse(&["rescale", "--add", "1"]).unwrap() else {
            panic!("not rescale")
        };
        assert_eq!((args.remove, args.add), (vec![], Some(1)));
    }

    #[test]
    fn rescaling_commands_refuse_bad_arguments_with_exit_2() {
        for bad in [
            &["expand"][..],
            &["expand", "--nodes", "0"],
            &["expand", "--nodes", "65"],
            &["expand", "--nodes", "two"],
            &["expand", "--nodes", "1", "--timeout", "0"],
            &["shrink"],
            &["shrink", "--nodes", "1", "--remove", "2"],
            &["shrink", "--nodes", "0"],
            &["shrink", "--remove", "x"],
            &["shrink", "--remove", "-1"],
            &["rescale"],
            &["rescale", "--add", "0"],
            &["rescale", "--json"],
        ] {
            let err = parse(bad).unwrap_err();
            assert_eq!(err.exit_code(), EXIT_USAGE, "{bad:?}");
        }
    }

    #[test]
    fn rescale_plans_are_checked_against_the_membership() {
        let ok = |remove: Vec<NodeId>, admit: u32| Ok(RescaleRequest { remove, admit });
        let table: &[(Removal, u32, u32, Result<RescaleRequest, &str>)] = &[
            (Removal::None, 2, 2, ok(vec![], 2)),
            (Removal::Highest(1), 0, 4, ok(vec![3], 0)),
            (Removal::Highest(3), 0, 4, ok(vec![1, 2, 3], 0)),
            (Removal::Highest(4), 0, 4, Err("cannot remove 4 of the job's 4 nodes: node 0 never leaves, so at most 3")),
            (Removal::Highest(1), 0, 1, Err("cannot remove 1 of the job's 1 node: node 0 never leaves, so at most 0")),
            (Removal::Ids(vec![3, 1]), 0, 4, ok(vec![1, 3], 0)),
            (Removal::Ids(vec![2]), 1, 3, ok(vec![2], 1)),
            (Removal::Ids(vec![0, 2]), 0, 4, Err("node 0 never leaves: it runs the job's main chare and serves its control endpoint")),
            (Removal::Ids(vec![2, 2]), 0, 4, Err("node 2 is named twice")),
            (Removal::Ids(vec![1, 4]), 0, 4, Err("there is no node 4: the job's nodes are 0..=3")),
            (Removal::None, 0, 4, Err("nothing to do: name nodes to remove or a number to add")),
        ];
        for (removal, add, nodes, want) in table {
            let got = plan_rescale(removal, *add, *nodes);
            assert_eq!(
                got,
                want.clone().map_err(str::to_owned),
                "{removal:?} +{add} of {nodes}"
            );
        }
    }

    fn report() -> RescaleReport {
        use ductile_coordinator::control::StageTime;
        RescaleReport {
            epoch_before: 1,
            epoch: 2,
            removed: vec![3],
            admitted: vec![3, 4],
            pes_before: 8,
            pes: 10,
            migrations: 12,
            stages: ["evacuate", "stop", "commit", "reconcile"]
                .iter()
                .zip([3.214, 0.4, 1.0, 12.5])
                .map(|(stage, ms)| StageTime {
                    stage: (*stage).to_owned(),
                    ms,
                })
                .collect(),
            mechanism_ms: 13.9,
            total_ms: 17.114,
            gpu: vec![],
        }
    }

    #[test]
    fn a_report_renders_as_a_table() {
        let text = render_report(&report(), &[4711, 4712]);
        let want = "\
epoch       1 -> 2
PEs         8 -> 10
removed     3
admitted    3, 4
started     pids 4711, 4712
migrations  12

stage             ms
evacuate        3.21
stop            0.40
commit          1.00
reconcile      12.50
mechanism      13.90
total          17.11
";
        assert_eq!(text, want);
        let shrink = RescaleReport {
            admitted: vec![],
            ..report()
        };
        let text = render_report(&shrink, &[]);
        assert!(text.contains("admitted    -\n"), "{text}");
        assert!(!text.contains("started"), "{text}");
        assert!(!text.contains("gpu"), "{text}");
    }

    #[test]
    fn gpu_work_is_listed_under_the_stages() {
        use ductile_coordinator::control::StageTime;
        let gpu = RescaleReport {
            gpu: vec![StageTime {
                stage: "staging".into(),
                ms: 2.5,
            }],
            ..report()
        };
        let text = render_report(&gpu, &[]);
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("  of which gpu staging"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(lines[at].ends_with("2.50"), "{text}");
        assert!(lines[at - 1].starts_with("reconcile"), "{text}");
        assert!(lines[at + 1].starts_with("mechanism"), "{text}");
        // Older reports (no `gpu` field) still read.
        let mut value = serde_json::to_value(report()).unwrap();
        value.as_object_mut().unwrap().remove("gpu");
        let back: RescaleReport = serde_json::from_value(value).unwrap();
        assert!(back.gpu.is_empty());
    }

    #[test]
    fn a_report_as_json_is_the_report_and_the_started_pids() {
        let report = report();
        let text = serde_json::to_string(&RescaleOutput {
            report: &report,
            spawned_pids: &[4711],
        })
        .unwrap();
        let back: RescaleReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back, report);
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["spawned_pids"], serde_json::json!([4711]));
        assert_eq!(value["stages"][0]["stage"], "evacuate");
    }

    #[test]
    fn status_lists_the_launchers_newcomers() {
        use ductile_coordinator::proto::{Member, PendingNewcomer};
        let member = |node: u32, pid: u32| Member {
            node,
            uid: u64::from(node) + 1,
            address: vec![],
            pes: 2,
            host: "vm".into(),
            pid,
        };
        let status = JobStatus {
            epoch: 2,
            members: vec![member(0, 10), member(1, 11), member(2, 20)],
            pes: 6,
            pending: vec![PendingNewcomer {
                uid: 9,
                pes: 2,
                host: "vm".into(),
                pid: 21,
            }],
            uptime_ms: 2500,
        };
        let record = |pid: u32, admitted: bool, exit: Option<&str>| NewcomerRecord {
            pid,
            pes: 2,
            started_at_unix_ms: 0,
            admitted,
            dropped: exit.is_some() && !admitted,
            exit: exit.map(str::to_owned),
        };
        let newcomers = [
            record(20, true, None),
            record(21, false, None),
            record(22, false, Some("exited with code 3")),
        ];
        let text = render_status(&status, &newcomers);
        let want = "\
epoch 2  nodes 3  PEs 6  pending newcomers 1  up 2.5s
 node    uid  PEs      pid  host
    0      1    2       10  vm
    1      2    2       11  vm
    2      3    2       20  vm
pending newcomer uid 9 (2 PEs, pid 21, vm)
newcomers started by the launcher:
 newcomer      pid  state
        0       20  admitted
        1       21  waiting
        2       22  dropped: exited with code 3 before admission
";
        assert_eq!(text, want);
        assert!(!render_status(&status, &[]).contains("launcher"));

        let json = serde_json::to_value(StatusOutput {
            status: &status,
            launcher_newcomers: &newcomers,
        })
        .unwrap();
        assert_eq!(json["epoch"], 2);
        assert_eq!(json["launcher_newcomers"][2]["exit"], "exited with code 3");
    }
}
