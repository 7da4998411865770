//! Finding a running local job: its state directory, control address and
//! secret, and an authenticated connection to node 0's control endpoint.

use std::path::PathBuf;
use std::time::Duration;

use ductile_coordinator::control::ControlClient;
use ductile_coordinator::secret::Secret;

use super::JobTarget;
use crate::state::{resolve_state_dir, CONTROL_ADDR_FILE, SECRET_FILE};

/// Why a command could not talk to a running job.
#[derive(Debug)]
pub(super) enum Unreachable {
    /// The job name or state directory is unusable.
    Usage(String),
    /// No job runs there, or its endpoint does not answer.
    NoJob(String),
}

impl Unreachable {
    pub(super) fn message(&self) -> &str {
        match self {
            Unreachable::Usage(m) | Unreachable::NoJob(m) => m,
        }
    }
}

/// A running job as a tool finds it: its state directory and an
/// authenticated connection to node 0's control endpoint.
pub(super) struct JobConnection {
    pub(super) dir: PathBuf,
    pub(super) addr: String,
    pub(super) client: ControlClient,
}

/// The state directory, control address and secret of the local job named
/// by `target`.
pub(super) fn local_endpoint(target: &JobTarget) -> Result<(PathBuf, String, Secret), Unreachable> {
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
pub(super) fn connect_job(target: &JobTarget) -> Result<JobConnection, Unreachable> {
    let (dir, addr, secret) = local_endpoint(target)?;
    let client = ControlClient::connect(&addr, &secret, Duration::from_secs(10)).map_err(|e| {
        Unreachable::NoJob(format!(
            "cannot reach the job's control endpoint at {addr}: {e}"
        ))
    })?;
    Ok(JobConnection { dir, addr, client })
}
