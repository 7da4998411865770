//! Command-line front end of the coordinator, shared by the `ductile-coordinator`
//! binary and the operator's `ductile coordinator` subcommand.
//!
//! On success the process prints one line to stdout, the bound address
//! (`127.0.0.1:41234`), so a launcher can read it; `--addr-file` writes the same
//! line to a file atomically. The exit code is the job's, after the shutdown
//! barrier; a launch timeout exits with [`EXIT_LAUNCH_TIMEOUT`].

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::contract::{self, ContractError};
use crate::core::Config;
pub use crate::core::EXIT_LAUNCH_TIMEOUT;
use crate::secret::{Secret, SecretError};
use crate::server::{self, ServerError};

/// Exit code for usage errors, unreadable secrets and I/O failures.
pub const EXIT_FAILURE: i32 = 2;

/// Arguments of `ductile-coordinator`.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "ductile-coordinator",
    version,
    about = "Membership coordinator for one Ductile job"
)]
pub struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Launch size: the number of launch members to wait for.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..),
          required_unless_present = "recover", conflicts_with = "recover")]
    pub expect: Option<u32>,
    /// Restarted coordinator: wait for node 0's Restore instead of a launch.
    #[arg(long)]
    pub recover: bool,
    /// Read the hex secret from this environment variable (default: DUCTILE_SECRET, then DUCTILE_SECRET_FILE).
    #[arg(long, value_name = "VAR", conflicts_with = "secret_file")]
    pub secret_env: Option<String>,
    /// Read the hex secret from this file.
    #[arg(long, value_name = "PATH")]
    pub secret_file: Option<PathBuf>,
    /// Write the bound address to this file (atomically) once listening.
    #[arg(long, value_name = "PATH")]
    pub addr_file: Option<PathBuf>,
    /// Seconds the launch (or the wait for Restore) may take.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub launch_timeout: u64,
    /// Seconds a started job may have no member connected before the
    /// coordinator gives it up (exit 5): its nodes are gone. Longer than the
    /// nodes' rejoin window after a coordinator restart.
    #[arg(long, value_name = "SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout: u64,
    /// Seconds a running member may send nothing (its node sends a heartbeat
    /// every second) before it is declared lost: a hung node's peers are
    /// told, as for one whose connection ended. 0: never. At least 3.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = heartbeat_secs)]
    pub heartbeat_timeout: u64,
    /// Log lines as `text` or as one JSON object per line (`json`).
    #[arg(long, value_enum, env = "DUCTILE_LOG_FORMAT", default_value_t = crate::logs::LogFormat::Text)]
    pub log_format: crate::logs::LogFormat,
}

/// `--heartbeat-timeout` (here and in `ductile run`): whole seconds, 0
/// (never) or several heartbeats long.
pub fn heartbeat_secs(text: &str) -> Result<u64, String> {
    let secs: u64 = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    let least = 3 * crate::proto::HEARTBEAT_EVERY.as_secs();
    if secs != 0 && secs < least {
        return Err(format!(
            "{secs} s is too short: members send a heartbeat every {} s; give at least {least}, or 0 for never",
            crate::proto::HEARTBEAT_EVERY.as_secs()
        ));
    }
    Ok(secs)
}

/// Why the coordinator command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The secret could not be read.
    #[error(transparent)]
    Contract(#[from] ContractError),
    /// `--secret-env` names an unset variable.
    #[error("--secret-env {0}: the variable is not set")]
    SecretEnvUnset(String),
    /// `--secret-env` names a malformed secret.
    #[error("--secret-env {var}: {error}")]
    BadSecret {
        /// The variable.
        var: String,
        /// What is wrong.
        error: SecretError,
    },
    /// The server failed.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The launcher's lifeline was handed down but cannot be watched.
    #[error(transparent)]
    Lifeline(#[from] crate::lifeline::LifelineError),
}

impl CliError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Server(ServerError::LaunchTimeout(_)) => EXIT_LAUNCH_TIMEOUT,
            CliError::Server(ServerError::NoMembers(_)) => crate::core::EXIT_NO_MEMBERS,
            _ => EXIT_FAILURE,
        }
    }
}

fn load_secret(args: &Args) -> Result<Secret, CliError> {
    if let Some(var) = &args.secret_env {
        let text = std::env::var(var).map_err(|_| CliError::SecretEnvUnset(var.clone()))?;
        return Secret::from_hex(&text).map_err(|error| CliError::BadSecret {
            var: var.clone(),
            error,
        });
    }
    if let Some(path) = &args.secret_file {
        return Ok(contract::secret_from_file(&path.to_string_lossy())?);
    }
    Ok(contract::secret_from_env()?)
}

/// Runs the coordinator described by `args`; prints the bound address line; returns the job's exit code.
pub fn run(args: Args) -> Result<i32, CliError> {
    let secret = load_secret(&args)?;
    let mut cfg = match args.expect {
        Some(n) => Config::launch(secret, n),
        None => Config::recovery(secret),
    };
    cfg.launch_timeout = Duration::from_secs(args.launch_timeout);
    cfg.idle_timeout = Duration::from_secs(args.idle_timeout);
    cfg.heartbeat_timeout =
        (args.heartbeat_timeout > 0).then(|| Duration::from_secs(args.heartbeat_timeout));
    // Started by a local launcher: end with it, however it ends.
    crate::lifeline::watch(|| {
        tracing::error!("the launcher that started this coordinator is gone; exiting");
        eprintln!("ductile-coordinator: the launcher that started it is gone; exiting");
        std::process::exit(EXIT_FAILURE);
    })
    .map_err(CliError::Lifeline)?;
    let code = server::run_with(cfg, args.listen, args.addr_file.as_deref(), |addr| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{addr}");
        let _ = out.flush();
    })?;
    Ok(code)
}

/// Installs a stderr `tracing` subscriber filtered by `DUCTILE_LOG` (default `info`),
/// in `format` (`--log-format`, `DUCTILE_LOG_FORMAT`);
/// does nothing if one is already installed.
pub fn init_tracing(format: crate::logs::LogFormat) {
    crate::logs::init(
        crate::logs::LogSetup {
            default_filter: "info",
            target: true,
            span_close: false,
        },
        format,
    );
}

/// Parses `args` (the first item is the program name), runs, and returns the
/// process exit code; errors are reported on stderr.
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args = match Args::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { EXIT_FAILURE } else { 0 };
        }
    };
    init_tracing(args.log_format);
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("ductile-coordinator: {e}");
            e.exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_parse() {
        let a = Args::try_parse_from(["x", "--expect", "4", "--listen", "0.0.0.0:7000"])
            .expect("parse");
        assert_eq!(a.expect, Some(4));
        assert_eq!(a.launch_timeout, 60);
        assert!(Args::try_parse_from(["x", "--recover"]).is_ok());
        assert!(Args::try_parse_from(["x"]).is_err());
        assert!(Args::try_parse_from(["x", "--expect", "2", "--recover"]).is_err());
        assert!(Args::try_parse_from(["x", "--expect", "0"]).is_err());
    }
}
