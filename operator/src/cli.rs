//! The `ductile` command line: clap definitions and dispatch.
//!
//! * `ductile run`: run a job on the local fleet ([`crate::local::launch`]);
//! * `ductile coordinator`: run a job's coordinator (what `ductile run` and
//!   the Kubernetes operator's pods start), forwarded to
//!   `ductile_coordinator::cli`.
//!
//! Exit codes of `ductile run`: the job's own code when it completed; 1 when
//! it failed, timed out or could not be stopped cleanly; 2 for usage and
//! launch errors (bad flags, program not found, state directory in use,
//! coordinator or node could not start); 128+N when stopped by signal N.
//! See `docs/cli.md`.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::local::{launch, JobSpec, StopRequest};
use crate::state::{resolve_state_dir, DEFAULT_JOB};

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
}

/// Arguments of `ductile status`.
#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// Job name (as given to `ductile run --job`).
    #[arg(long, value_name = "NAME", default_value = DEFAULT_JOB)]
    pub job: String,
    /// The job's state directory (as given to `ductile run --state-dir`).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
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
        Command::Coordinator { args } => {
            let argv = std::iter::once(OsString::from("ductile coordinator")).chain(args);
            ductile_coordinator::cli::main_with_args(argv)
        }
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

/// `ductile status`: asks the running job's node 0 through its control endpoint.
pub fn status(args: StatusArgs) -> i32 {
    use ductile_coordinator::control::ControlClient;
    use ductile_coordinator::secret::Secret;
    let dir = match resolve_state_dir(args.state_dir.as_deref(), &args.job, |k| std::env::var_os(k)) {
        Ok(dir) => dir,
        Err(err) => {
            say(&err.to_string());
            return EXIT_USAGE;
        }
    };
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).map(|s| s.trim().to_string());
    let (addr, secret) = match (read(crate::state::CONTROL_ADDR_FILE), read(crate::state::SECRET_FILE)) {
        (Ok(a), Ok(s)) => (a, s),
        _ => {
            say(&format!("no running job in {} (start one with `ductile run`)", dir.display()));
            return 1;
        }
    };
    let secret = match Secret::from_hex(&secret) {
        Ok(s) => s,
        Err(e) => {
            say(&format!("the job secret in {} is unreadable: {e}", dir.display()));
            return 1;
        }
    };
    let status = ControlClient::connect(&addr, &secret, Duration::from_secs(10)).and_then(|mut c| c.status());
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            say(&format!("cannot reach the job's control endpoint at {addr}: {e}"));
            return 1;
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&status) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                say(&format!("cannot encode the status: {e}"));
                return 1;
            }
        }
        return 0;
    }
    println!(
        "epoch {}  nodes {}  PEs {}  pending newcomers {}  up {:.1}s",
        status.epoch,
        status.members.len(),
        status.pes,
        status.pending.len(),
        status.uptime_ms as f64 / 1e3
    );
    println!("{:>5} {:>6} {:>4} {:>8}  host", "node", "uid", "PEs", "pid");
    for m in &status.members {
        println!("{:>5} {:>6} {:>4} {:>8}  {}", m.node, m.uid, m.pes, m.pid, m.host);
    }
    for p in &status.pending {
        println!("pending newcomer uid {} ({} PEs, pid {}, {})", p.uid, p.pes, p.pid, p.host);
    }
    0
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
        assert_eq!(args.command, ["prog", "--x", "-y"].map(OsString::from));
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
}
