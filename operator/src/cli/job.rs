//! Finding a running local job: its state directory, control address and
//! secret, and an authenticated connection to node 0's control endpoint.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ductile_coordinator::control::ControlClient;
use ductile_coordinator::secret::Secret;

use super::JobTarget;
use crate::local::process::{pid_alive, POLL_INTERVAL};
use crate::state::{resolve_state_dir, CONTROL_ADDR_FILE, LAUNCHER_PID_FILE, SECRET_FILE};

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

/// The pid of the launcher running in `dir`, if one runs there.
pub(super) fn running_launcher(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join(LAUNCHER_PID_FILE))
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .filter(|&pid| pid_alive(pid))
}

/// The state directory, control address and secret of the local job named
/// by `target`. A job whose launcher runs but whose node 0 has not published
/// its control endpoint yet is starting: waited for, up to `wait`.
pub(super) fn local_endpoint(
    target: &JobTarget,
    wait: Duration,
) -> Result<(PathBuf, String, Secret), Unreachable> {
    let dir = resolve_state_dir(target.state_dir.as_deref(), &target.job, |k| {
        std::env::var_os(k)
    })
    .map_err(|err| Unreachable::Usage(err.to_string()))?;
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).map(|s| s.trim().to_string());
    let deadline = Instant::now() + wait;
    let (addr, secret) = loop {
        if let (Ok(addr), Ok(secret)) = (read(CONTROL_ADDR_FILE), read(SECRET_FILE)) {
            break (addr, secret);
        }
        let Some(pid) = running_launcher(&dir) else {
            return Err(Unreachable::NoJob(format!(
                "no running job in {} (start one with `ductile run`)",
                dir.display()
            )));
        };
        if Instant::now() >= deadline {
            return Err(Unreachable::NoJob(format!(
                "the job in {} is still starting after {:.1}s (its launcher, pid {pid}, runs); try again, or give the command a longer --timeout",
                dir.display(),
                wait.as_secs_f64()
            )));
        }
        std::thread::sleep(POLL_INTERVAL);
    };
    let secret = Secret::from_hex(&secret).map_err(|e| {
        Unreachable::NoJob(format!(
            "the job secret in {} is unreadable: {e}",
            dir.display()
        ))
    })?;
    Ok((dir, addr, secret))
}

/// Finds the job named by `target` (waiting up to `wait` for one that is
/// starting) and connects to its control endpoint.
pub(super) fn connect_job(
    target: &JobTarget,
    wait: Duration,
) -> Result<JobConnection, Unreachable> {
    let (dir, addr, secret) = local_endpoint(target, wait)?;
    let client = ControlClient::connect(&addr, &secret, Duration::from_secs(10)).map_err(|e| {
        Unreachable::NoJob(format!(
            "cannot reach the job's control endpoint at {addr}: {e}"
        ))
    })?;
    Ok(JobConnection { dir, addr, client })
}
