//! The kill-and-restart baseline as one call: a running local job reaches a
//! new size by a checkpoint, the end of every process and a relaunch
//! (docs/elasticity.md, "The restart baseline"). `ductile rescale --mode
//! restart` makes this call once; `ductile cloud --mode restart` makes it
//! for every rescale the policy asks for, so an interruption can be handled
//! both ways on the same fleet.
//!
//! The steps: ask the launcher (`STATE/launcher.sock`) to relaunch the job
//! with the new number of nodes once it ends with the checkpointed code,
//! ask node 0 for a checkpoint that ends the job, then wait until the
//! relaunched job has restored it and run its first load-balancing step
//! (`restored.json` in the checkpoint directory). A checkpoint that node 0
//! refuses cancels the arranged relaunch: the job goes on at its size.
//!
//! [`await_relaunch`] serves the fault-tolerance baseline (`ductile cloud
//! --mode checkpoint-restart`), where no checkpoint is taken at the
//! rescale: the caller kills every process and starts the job again from
//! its last periodic checkpoint (`ductile run --restore DIR`), and this
//! waits for the restore and reports it in the same shape.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ductile_coordinator::control::{
    CheckpointRequest, ControlClient, ControlError, JobStatus, RescaleReport, RescaleRequest,
    StageTime,
};
use ductile_coordinator::secret::Secret;

use super::channel::{self, ChannelError, Request};
use super::process::POLL_INTERVAL;
use crate::state::{CONTROL_ADDR_FILE, LAUNCHER_SOCKET_FILE, SECRET_FILE};

/// How a rescale is carried out.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Reconfigure the running processes.
    #[default]
    Live,
    /// Checkpoint, end every process, relaunch at the new size, restore.
    Restart,
}

/// Why a restart did not complete.
#[derive(Debug, thiserror::Error)]
pub enum RestartError {
    /// The launcher could not arrange the relaunch (none runs the job, it
    /// refused, it did not answer); nothing happened.
    #[error(transparent)]
    Launcher(#[from] ChannelError),
    /// The checkpoint directory could not be made.
    #[error("cannot create {}: {source}", dir.display())]
    Directory {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Node 0 refused the checkpoint; the job goes on at its size.
    #[error("the checkpoint failed: {reason}; {}", if *cancelled {
        "the job goes on at its size; the arranged relaunch was cancelled"
    } else {
        "the arranged relaunch could not be cancelled (see `ductile status`)"
    })]
    Refused {
        /// Node 0's answer.
        reason: ControlError,
        /// Whether the arranged relaunch was cancelled.
        cancelled: bool,
    },
    /// No answer to the checkpoint: it may still happen at the next sync point.
    #[error("no answer to the checkpoint: {reason}; the job may still checkpoint at its next sync point and be relaunched with {nodes} node(s) (see `ductile status`)")]
    NoAnswer {
        /// The failure.
        reason: ControlError,
        /// The size the relaunch was arranged for.
        nodes: u32,
    },
    /// The relaunched job did not restore before the deadline.
    #[error("the relaunched job did not restore within {:.1}s; see the launcher's output and `ductile status`", .0.as_secs_f64())]
    NotRestored(Duration),
    /// The restored job's marker could not be read.
    #[error("{} is unreadable: {reason}", path.display())]
    Marker {
        /// `restored.json`.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// What a completed restart reports.
#[derive(Debug, Clone)]
pub struct Restarted {
    /// Shaped like a live rescale's report. Stages: `sync` (until the next
    /// sync point and quiescence), `checkpoint`, `relaunch` (processes
    /// ending and starting, launch barrier), `restore` (reading and placing
    /// every chare), `balance`; the mechanism is checkpoint + relaunch +
    /// restore. The relaunched job numbers its nodes 0..n: the survivors
    /// first, in their old order, then the added ones.
    pub report: RescaleReport,
    /// The relaunched job's status, when its control endpoint answered.
    pub status: Option<JobStatus>,
}

/// Restarts the job in `dir` (answering on `client`, whose status before
/// is `status`) at the size `request` asks for, within `deadline`.
pub fn restart(
    dir: &Path,
    client: &mut ControlClient,
    status: &JobStatus,
    request: &RescaleRequest,
    deadline: Instant,
) -> Result<Restarted, RestartError> {
    let t0 = Instant::now();
    let nodes = status.members.len() as u32 - request.remove.len() as u32 + request.admit;
    let ckpt = dir.join("ckpt");
    let _ = std::fs::remove_dir_all(&ckpt);
    std::fs::create_dir_all(&ckpt).map_err(|source| RestartError::Directory {
        dir: ckpt.clone(),
        source,
    })?;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let arranged = Request::Restart {
        nodes,
        dir: ckpt.clone(),
    };
    let socket = dir.join(LAUNCHER_SOCKET_FILE);
    if let Err(e) = channel::ask(&socket, &arranged, left()) {
        let _ = std::fs::remove_dir_all(&ckpt);
        return Err(e.into());
    }
    let checkpoint = CheckpointRequest {
        dir: ckpt.to_string_lossy().into_owned(),
        exit: true,
        wait_ms: 0, // the client sets it from its timeout
    };
    let written = match client.checkpoint(checkpoint, left()) {
        Ok(written) => written,
        Err(reason @ ControlError::Refused(_)) => {
            // Nothing was checkpointed: the relaunch must not fire later.
            let cancelled =
                channel::ask(&socket, &Request::CancelRestart, Duration::from_secs(5)).is_ok();
            if cancelled {
                // Nothing will read the checkpoint directory: it goes too.
                let _ = std::fs::remove_dir_all(&ckpt);
            }
            return Err(RestartError::Refused { reason, cancelled });
        }
        Err(reason) => return Err(RestartError::NoAnswer { reason, nodes }),
    };
    let checkpointed = Instant::now();
    let restored = wait_restored(&ckpt, t0, deadline)?;
    let restored_at = Instant::now();
    let field = |k: &str| restored[k].as_f64().unwrap_or(0.0);
    let (place_ms, balance_ms, restore_total) =
        (field("place_ms"), field("balance_ms"), field("total_ms"));
    let relaunch_ms = ((restored_at - checkpointed).as_secs_f64() * 1e3 - restore_total).max(0.0);
    let after = relaunched_status(dir);
    let stage = |stage: &str, ms: f64| StageTime {
        stage: stage.to_owned(),
        ms,
    };
    let report = RescaleReport {
        epoch_before: status.epoch,
        epoch: after.as_ref().map_or(0, |s| s.epoch),
        removed: request.remove.clone(),
        admitted: (nodes - request.admit..nodes).collect(),
        pes_before: status.pes,
        pes: restored["pes"].as_u64().unwrap_or(0) as u32,
        migrations: restored["migrations"].as_u64().unwrap_or(0),
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
    Ok(Restarted {
        report,
        status: after,
    })
}

/// Waits for `ckpt/restored.json`, which node 0 of a job restored from
/// `ckpt` writes once its first step ended, and returns it.
fn wait_restored(
    ckpt: &Path,
    t0: Instant,
    deadline: Instant,
) -> Result<serde_json::Value, RestartError> {
    let marker = ckpt.join(RESTORED_FILE);
    loop {
        if let Ok(text) = std::fs::read_to_string(&marker) {
            return serde_json::from_str(&text).map_err(|e| RestartError::Marker {
                path: marker.clone(),
                reason: e.to_string(),
            });
        }
        if Instant::now() >= deadline {
            return Err(RestartError::NotRestored(deadline - t0));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The marker a restored job writes into its checkpoint directory.
pub const RESTORED_FILE: &str = "restored.json";

/// A job that its supervisor killed and relaunched itself, from a periodic
/// checkpoint (`ductile cloud --mode checkpoint-restart`): what it was,
/// and where it restarts from.
#[derive(Debug, Clone)]
pub struct Killed {
    /// The status of the job before the kill.
    pub before: JobStatus,
    /// The rescale the relaunch carries out.
    pub request: RescaleRequest,
    /// Node count of the relaunched job.
    pub nodes: u32,
    /// The checkpoint it restores (`None`: it starts from the beginning).
    pub ckpt: Option<PathBuf>,
    /// When the kill began.
    pub t0: Instant,
    /// How long killing every process and the launcher took, ms.
    pub kill_ms: f64,
    /// When the new launcher was started (its files are newer).
    pub launched: std::time::SystemTime,
}

/// Waits until the job relaunched after `killed` has restored its
/// checkpoint (or, from the beginning, until every node is in its view),
/// within `deadline`; reports it like [`restart`]: stages `kill`,
/// `relaunch`, `restore`, `balance`.
pub fn await_relaunch(
    dir: &Path,
    killed: &Killed,
    deadline: Instant,
) -> Result<Restarted, RestartError> {
    let restored = match &killed.ckpt {
        Some(ckpt) => Some(wait_restored(ckpt, killed.t0, deadline)?),
        None => None,
    };
    let restored_at = Instant::now();
    // The new node 0's endpoint (files older than the launch are the old job's).
    let after = loop {
        let fresh = std::fs::metadata(dir.join(CONTROL_ADDR_FILE))
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= killed.launched);
        if fresh {
            if let Some(s) =
                relaunched_status(dir).filter(|s| s.members.len() == killed.nodes as usize)
            {
                break s;
            }
        }
        if Instant::now() >= deadline {
            return Err(RestartError::NotRestored(deadline - killed.t0));
        }
        std::thread::sleep(POLL_INTERVAL);
    };
    let field = |k: &str| restored.as_ref().and_then(|r| r[k].as_f64()).unwrap_or(0.0);
    let (place_ms, balance_ms, restore_total) =
        (field("place_ms"), field("balance_ms"), field("total_ms"));
    let since_kill = (restored_at - killed.t0).as_secs_f64() * 1e3;
    let relaunch_ms = (since_kill - killed.kill_ms - restore_total).max(0.0);
    let stage = |stage: &str, ms: f64| StageTime {
        stage: stage.to_owned(),
        ms,
    };
    let report = RescaleReport {
        epoch_before: killed.before.epoch,
        epoch: after.epoch,
        removed: killed.request.remove.clone(),
        admitted: (killed.nodes - killed.request.admit..killed.nodes).collect(),
        pes_before: killed.before.pes,
        pes: after.pes,
        migrations: restored
            .as_ref()
            .and_then(|r| r["migrations"].as_u64())
            .unwrap_or(0),
        stages: vec![
            stage("kill", killed.kill_ms),
            stage("relaunch", relaunch_ms),
            stage("restore", place_ms),
            stage("balance", balance_ms),
        ],
        mechanism_ms: killed.kill_ms + relaunch_ms + place_ms,
        total_ms: killed.t0.elapsed().as_secs_f64() * 1e3,
        gpu: Vec::new(),
    };
    Ok(Restarted {
        report,
        status: Some(after),
    })
}

/// The relaunched job's status, read through the control endpoint its
/// node 0 published in `dir` (a new address and secret).
fn relaunched_status(dir: &Path) -> Option<JobStatus> {
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .map(|s| s.trim().to_owned())
    };
    let (addr, secret) = (read(CONTROL_ADDR_FILE)?, read(SECRET_FILE)?);
    let secret = Secret::from_hex(&secret).ok()?;
    let mut client = ControlClient::connect(&addr, &secret, Duration::from_secs(10)).ok()?;
    client.status().ok()
}
