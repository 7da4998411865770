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
//!
//! This file holds the argument definitions and the dispatch; each command
//! lives in a file of its own under `cli/` (`job.rs`: finding a running
//! job, shared by the commands that talk to one).

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand};
use ductile_coordinator::proto::NodeId;

use crate::local::channel::{MAX_SPAWN, MAX_SPAWN_PES};
use crate::state::DEFAULT_JOB;

mod cloud;
mod job;
mod list;
mod rescale;
mod run;
mod status;
mod stop;
mod wait_left;

pub use crate::local::restart::Mode;
pub use rescale::{plan_rescale, render_report, rescale, Removal};
pub use run::run;
pub use status::{render_status, status};
pub use wait_left::{is_member, wait_left};

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
    /// Log lines as `text` or one JSON object per line (`json`), here and
    /// in the job's processes [default: DUCTILE_LOG_FORMAT, else text].
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub log_format: Option<ductile_coordinator::logs::LogFormat>,
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
    /// Show a running job's membership: epoch, nodes, PEs, waiting newcomers
    /// (or how an ended job ended).
    Status(StatusArgs),
    /// Stop a running job (as Ctrl-C in its `ductile run` terminal would) and
    /// wait until every process of it is gone.
    Stop(StopArgs),
    /// List the jobs under the state root, running or ended.
    List(ListArgs),
    /// Resize a running job to N nodes in all (adds or removes the difference).
    Scale(ScaleArgs),
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
    /// Rehearse an ElasticJob on the local cloud: spot instances that get
    /// recommendations, notices and replacements, driven by the operator's policy.
    Cloud(cloud::CloudArgs),
}

/// Which running job a command talks to.
#[derive(Args, Debug, Clone)]
pub struct JobTarget {
    /// Job name (as given to `ductile run --job`).
    #[arg(long, value_name = "NAME", default_value = DEFAULT_JOB, conflicts_with = "state_dir")]
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
    /// Seconds the command may take (a job that is starting is waited for).
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_secs)]
    pub timeout: Duration,
}

/// Arguments of `ductile stop`.
#[derive(Args, Debug, Clone)]
pub struct StopArgs {
    /// The job.
    #[command(flatten)]
    pub target: JobTarget,
    /// Seconds to wait for the job's processes to end.
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = parse_secs)]
    pub timeout: Duration,
}

/// Arguments of `ductile list`.
#[derive(Args, Debug, Clone)]
pub struct ListArgs {
    /// The root under which the jobs' state directories are [default:
    /// $DUCTILE_STATE_DIR, else ${XDG_STATE_HOME:-$HOME/.local/state}/ductile].
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `ductile scale`.
#[derive(Args, Debug, Clone)]
pub struct ScaleArgs {
    /// The number of nodes the job should have, in all (at least 1: node 0
    /// never leaves).
    #[arg(long, short = 'n', value_name = "N", value_parser = parse_count)]
    pub nodes: u32,
    /// PEs each newcomer runs, when the job grows [default: the job's --pes-per-node]: a
    /// node of another shape, as an instance type with more or fewer
    /// vCPUs. Live rescales only.
    #[arg(long, value_name = "P", value_parser = parse_spawn_pes)]
    pub pes: Option<u32>,
    /// Common options.
    #[command(flatten)]
    pub options: RescaleOptions,
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

/// Arguments of `ductile expand`.
#[derive(Args, Debug, Clone)]
pub struct ExpandArgs {
    /// Number of nodes to add (a change, not a total: see `ductile scale`).
    #[arg(long, short = 'n', value_name = "K", value_parser = parse_spawn_count)]
    pub nodes: u32,
    /// PEs each newcomer runs [default: the job's --pes-per-node]: a
    /// node of another shape, as an instance type with more or fewer
    /// vCPUs. Live rescales only.
    #[arg(long, value_name = "P", value_parser = parse_spawn_pes)]
    pub pes: Option<u32>,
    /// Common options.
    #[command(flatten)]
    pub options: RescaleOptions,
}

/// Arguments of `ductile shrink`.
#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("which").required(true).args(["nodes", "remove"])))]
pub struct ShrinkArgs {
    /// Remove the K highest-numbered nodes (a change, not a total; at most
    /// all but node 0).
    #[arg(long, short = 'n', value_name = "K", value_parser = parse_count)]
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
    #[arg(long, value_name = "K", value_parser = parse_spawn_count)]
    pub add: Option<u32>,
    /// PEs each newcomer runs [default: the job's --pes-per-node]: a
    /// node of another shape, as an instance type with more or fewer
    /// vCPUs. Live rescales only.
    #[arg(long, value_name = "P", value_parser = parse_spawn_pes, requires = "add")]
    pub pes: Option<u32>,
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
    #[arg(long, short = 'n', value_name = "N", value_parser = parse_count)]
    pub nodes: u32,
    /// PEs (scheduler threads) per node.
    #[arg(long, short = 'p', value_name = "P", default_value_t = 1, value_parser = parse_count)]
    pub pes_per_node: u32,
    /// PEs of each launch node, node 0 first, one count per node (nodes of
    /// different shapes, as instance types with more or fewer vCPUs);
    /// default: every node runs --pes-per-node, which newcomers started
    /// by `ductile expand` and `ductile rescale --add` still run.
    #[arg(long, value_name = "P0,P1,...", value_delimiter = ',', value_parser = parse_count)]
    pub node_pes: Vec<u32>,
    /// A cgroup directory for each launch node, node 0 first: each node is
    /// moved into its group as soon as it is spawned, so the group's CPU
    /// quota holds before its PEs start (what `ductile cloud` gives its
    /// instances).
    #[arg(long, value_name = "DIR0,DIR1,...", value_delimiter = ',')]
    pub node_cgroups: Vec<PathBuf>,
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
    /// Seconds a running node may send the coordinator nothing (nodes send a
    /// heartbeat every second) before it is declared lost, as one whose
    /// process ended: a hung node. 0: never; otherwise at least 3.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_heartbeat)]
    pub heartbeat_timeout: Duration,
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
    /// Start the job from this checkpoint directory (written by a
    /// checkpoint through node 0's control endpoint) instead of running
    /// main, at this run's size: node 0 restores every chare and balances.
    #[arg(long, value_name = "DIR")]
    pub restore: Option<PathBuf>,
    /// The program every node runs, and its arguments (after `--`). The
    /// program's own flags follow it; a flag before it is `ductile run`'s
    /// (an unknown one is refused, not taken for the program).
    #[arg(
        required = true,
        trailing_var_arg = true,
        value_name = "PROGRAM [ARGS]"
    )]
    pub command: Vec<OsString>,
}

/// Parses a count of at least 1 (nodes, PEs).
pub fn parse_count(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{text:?} is not a whole number (at least 1)")),
    }
}

/// Parses a number of newcomers to start at once: 1 to [`MAX_SPAWN`].
pub fn parse_spawn_count(text: &str) -> Result<u32, String> {
    let n = parse_count(text)?;
    if n > MAX_SPAWN {
        return Err(format!(
            "at most {MAX_SPAWN} newcomers at once (run the command again for more)"
        ));
    }
    Ok(n)
}

/// Parses the PE count of newcomers: 1 to [`MAX_SPAWN_PES`].
pub fn parse_spawn_pes(text: &str) -> Result<u32, String> {
    let n = parse_count(text)?;
    if n > MAX_SPAWN_PES {
        return Err(format!("at most {MAX_SPAWN_PES} PEs per node"));
    }
    Ok(n)
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

/// `--heartbeat-timeout`: the coordinator's rule, as a duration (0: never).
fn parse_heartbeat(text: &str) -> Result<Duration, String> {
    ductile_coordinator::cli::heartbeat_secs(text.trim()).map(Duration::from_secs)
}

/// Prints a user-facing line: `ductile: ...` on stderr (continuation lines as they are).
pub fn say(line: &str) {
    eprintln!("ductile: {line}");
}

/// An error and its causes as one line, each said once. Libraries often
/// put their source's message into their own (kube's configuration
/// inference does, three levels deep), so `{:#}` would repeat it: a cause
/// whose text the line already holds is left out.
pub fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
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
    if let Some(format) = cli.log_format {
        // Before any thread starts; the job's processes inherit it.
        std::env::set_var(ductile_coordinator::logs::ENV_LOG_FORMAT, format.name());
    }
    match cli.command {
        Command::Run(args) => {
            init_tracing();
            run(args)
        }
        Command::Status(args) => status(args),
        Command::Stop(args) => stop::stop(&args),
        Command::List(args) => list::list(&args),
        Command::Scale(args) => rescale::scale(args.nodes, args.pes, &args.options),
        Command::Expand(args) => rescale(Removal::None, args.nodes, args.pes, &args.options),
        Command::Shrink(args) => {
            let removal = match args.nodes {
                Some(k) => Removal::Highest(k),
                None => Removal::Ids(args.remove),
            };
            rescale(removal, 0, None, &args.options)
        }
        Command::Rescale(args) => {
            let removal = if args.remove.is_empty() {
                Removal::None
            } else {
                Removal::Ids(args.remove)
            };
            rescale(removal, args.add.unwrap_or(0), args.pes, &args.options)
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
        Command::Cloud(args) => cloud::cloud(args),
    }
}

/// Installs the launcher's stderr logger, filtered by `DUCTILE_LOG` (default `warn`).
/// `DUCTILE_LOG_FORMAT=json` writes one JSON object per line.
fn init_tracing() {
    ductile_coordinator::logs::init_from_env(ductile_coordinator::logs::LogSetup {
        default_filter: "warn",
        target: true,
        span_close: false,
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_error_chain_says_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("failed to read kubeconfig: {0}")]
        struct Read(#[source] std::io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("failed to infer config: kubeconfig: ({0})")]
        struct Infer(#[source] Read);
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let error = anyhow::Error::new(Infer(Read(io))).context("cannot start");
        assert_eq!(
            super::one_line(&error),
            "cannot start: failed to infer config: kubeconfig: (failed to read kubeconfig: no such file)"
        );
        let plain = anyhow::anyhow!("outer").context("top");
        assert_eq!(super::one_line(&plain), "top: outer");
    }

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
        assert!(args.node_pes.is_empty(), "every node runs --pes-per-node");
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
    fn run_takes_a_pe_count_per_node_before_the_program() {
        let cli = Cli::try_parse_from([
            "ductile",
            "run",
            "-n",
            "3",
            "--node-pes",
            "1,2,4",
            "jacobi2d",
            "--iters",
            "5",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert_eq!(args.node_pes, [1, 2, 4]);
        assert_eq!(args.pes_per_node, 1);
        assert_eq!(
            args.command,
            ["jacobi2d", "--iters", "5"].map(OsString::from)
        );
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
            &["ductile", "run", "-n", "2", "--node-pes", "1,0", "--", "p"],
            &["ductile", "run", "-n", "2", "--node-pes", "1,x", "p"],
        ] {
            let err = Cli::try_parse_from(bad).unwrap_err();
            assert_eq!(err.exit_code(), EXIT_USAGE, "{bad:?}");
        }
    }

    #[test]
    fn a_flag_before_the_program_is_ductiles_never_the_program() {
        // `--pes` is not a flag of `run`: refused with a suggestion, not run.
        let err = parse(&["run", "--nodes", "1", "--pes", "2", "--", "jacobi2d"]).unwrap_err();
        assert_eq!(err.exit_code(), EXIT_USAGE);
        let text = err.to_string();
        assert!(text.contains("--pes-per-node"), "a suggestion: {text}");
        let err = parse(&["run", "--node", "2", "--", "jacobi2d"]).unwrap_err();
        assert!(err.to_string().contains("--nodes"), "{err}");
        // The program's own flags, after it, are the program's.
        let Command::Run(args) =
            parse(&["run", "-n", "1", "jacobi2d", "--grid", "8", "-q"]).unwrap()
        else {
            panic!("not run")
        };
        assert_eq!(
            args.command,
            ["jacobi2d", "--grid", "8", "-q"].map(OsString::from)
        );
    }

    #[test]
    fn counts_say_what_they_accept() {
        let err = parse(&["run", "--nodes", "0", "--", "p"]).unwrap_err();
        assert!(err.to_string().contains("must be at least 1"), "{err}");
        assert!(!err.to_string().contains("4294967295"), "{err}");
        let err = parse(&["expand", "--nodes", "65"]).unwrap_err();
        assert!(err.to_string().contains("at most 64 newcomers"), "{err}");
    }

    #[test]
    fn job_and_state_dir_together_are_refused() {
        for cmd in ["status", "stop"] {
            let err = parse(&[cmd, "--job", "a", "--state-dir", "/s"]).unwrap_err();
            assert_eq!(err.exit_code(), EXIT_USAGE, "{cmd}");
        }
        // Either alone is fine; the default job name is not "given".
        assert!(parse(&["status", "--state-dir", "/s"]).is_ok());
        assert!(parse(&["status", "--job", "a"]).is_ok());
    }

    #[test]
    fn scale_stop_and_list_parse() {
        let Command::Scale(args) = parse(&["scale", "--nodes", "3", "--timeout", "5"]).unwrap()
        else {
            panic!("not scale")
        };
        assert_eq!(args.nodes, 3);
        assert_eq!(args.options.timeout, Duration::from_secs(5));
        assert!(parse(&["scale"]).is_err());
        assert!(parse(&["scale", "--nodes", "0"]).is_err());
        let Command::Stop(args) = parse(&["stop", "--job", "j"]).unwrap() else {
            panic!("not stop")
        };
        assert_eq!(args.target.job, "j");
        assert_eq!(args.timeout, Duration::from_secs(60));
        let Command::List(args) = parse(&["list", "--json"]).unwrap() else {
            panic!("not list")
        };
        assert!(args.json && args.root.is_none());
        let Command::Status(args) = parse(&["status"]).unwrap() else {
            panic!("not status")
        };
        assert_eq!(args.timeout, Duration::from_secs(10));
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

        let Command::Expand(args) = parse(&["expand", "-n", "1", "--pes", "4"]).unwrap() else {
            panic!("not expand")
        };
        assert_eq!((args.nodes, args.pes), (1, Some(4)));
        let Command::Rescale(args) =
            parse(&["rescale", "--remove", "1", "--add", "1", "--pes", "2"]).unwrap()
        else {
            panic!("not rescale")
        };
        assert_eq!((args.add, args.pes), (Some(1), Some(2)));
        let Command::Scale(args) = parse(&["scale", "-n", "3", "--pes", "2"]).unwrap() else {
            panic!("not scale")
        };
        assert_eq!(args.pes, Some(2));
        for bad in [
            &["expand", "-n", "1", "--pes", "0"][..],
            &["expand", "-n", "1", "--pes", "1025"],
            &["rescale", "--remove", "1", "--pes", "2"],
            &["shrink", "-n", "1", "--pes", "2"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }

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
}
