//! Checkpoint to a directory and restart from it: the kill-and-restart
//! baseline that no-restart rescaling is measured against (Charm++'s
//! `CkStartCheckpoint` and `+restart`), not the product.
//!
//! A tool asks node 0's control endpoint ([`serve_request`]); PE 0 waits for
//! the next load-balancing sync point and for quiescence, so no application
//! message is queued or in flight, then every PE writes its chares
//! (`pe-<N>.ckpt`) and PE 0 the job's own state (`job.ckpt`: readonly
//! values, collections, reduction and broadcast counters, main). A job
//! started with `DUCTILE_RESTORE=DIR`, at any size, does not run main: PE 0
//! reads the directory, re-creates every collection, sends each chare to a
//! PE of the new job and runs the interrupted load-balancing step, which
//! spreads the elements and resumes them (`pe/checkpoint.rs`).
//!
//! Files are postcard, written to a temporary name and renamed; each starts
//! with [`MAGIC`] and a version, so a stale or foreign file is refused with
//! a clear error rather than misread.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use ductile_coordinator::control::{CheckpointReport, CheckpointRequest, ControlReply};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::chare::IndexKey;
use crate::collection::ElemMeta;
use crate::msg::{CollId, Dest, Envelope, Payload};
use crate::node::NodeShared;
use crate::operation::{Busy, Operation, Refusal};
use crate::system::{CreateSpec, SysMsg};

/// First bytes of every checkpoint file.
pub const MAGIC: &[u8; 8] = b"DUCTCKPT";
/// Format version; bumped on any change of the types below.
pub const VERSION: u32 = 1;
/// The longest a checkpoint request waits for a sync point (a request's
/// `wait_ms` may ask for less).
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a checkpoint whose files are being written may still take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(120);

/// One chare as written.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SavedChare {
    pub coll: CollId,
    pub key: IndexKey,
    pub state: Vec<u8>,
    pub meta: ElemMeta,
}

/// `pe-<N>.ckpt`: the chares of PE `pe` and of its node.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PeFile {
    pub pe: u32,
    /// The node the PE belonged to (nodegroup members follow their node).
    pub node: u32,
    pub chares: Vec<SavedChare>,
}

/// PE 0's bookkeeping of one collection's population.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SavedPopulation {
    pub base: u64,
    pub births: BTreeMap<u32, i64>,
    pub next_open: u32,
}

/// `job.ckpt`: what only PE 0 holds.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct JobFile {
    /// PEs and nodes of the job that wrote it.
    pub pes: u32,
    pub nodes: u32,
    /// Readonly values, `(id, postcard bytes)`.
    pub readonly: Vec<(u64, Vec<u8>)>,
    /// Every collection, in creation order.
    pub specs: Vec<CreateSpec>,
    pub populations: Vec<(CollId, SavedPopulation)>,
    /// The last broadcast number of each collection.
    pub broadcasts: Vec<(CollId, u64)>,
    pub lb_steps: Vec<(CollId, u64)>,
    /// The array whose sync point the checkpoint was taken at.
    pub synced: CollId,
    /// The main chare.
    pub main: SavedChare,
    /// The program's rescale callbacks (`ctx.on_rescale`).
    pub rescale_callbacks: Vec<crate::callback::CallbackSpec>,
}

/// A checkpoint file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing failed.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Not a checkpoint of this format.
    #[error("{path} is not a Ductile checkpoint of version {VERSION}", path = path.display())]
    Foreign {
        /// The file.
        path: PathBuf,
    },
    /// The contents do not decode.
    #[error("{path} is corrupt: {source}", path = path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: postcard::Error,
    },
    /// PE 0 found a rescale in progress when the request reached it.
    #[error("a rescale is in progress")]
    Rescaling,
    /// Some PEs could not write their files (their reports, joined).
    #[error("{0}")]
    Pes(String),
    /// The request was withdrawn while the files were being written.
    #[error("the checkpoint request went away")]
    Withdrawn,
    /// State a checkpoint cannot capture (results waiting, messages queued).
    #[error("{0}")]
    Unsettled(String),
    /// The main chare is not where a checkpoint expects it.
    #[error("the main chare is not on PE 0")]
    NoMain,
}

pub(crate) fn job_path(dir: &Path) -> PathBuf {
    dir.join("job.ckpt")
}

pub(crate) fn pe_path(dir: &Path, pe: u32) -> PathBuf {
    dir.join(format!("pe-{pe}.ckpt"))
}

/// Writes `value` to `path` atomically; returns the bytes written.
pub(crate) fn write<T: Serialize>(path: &Path, value: &T) -> Result<u64, CheckpointError> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend(VERSION.to_le_bytes());
    bytes.extend(postcard::to_allocvec(value).expect("encoding into a Vec cannot fail"));
    crate::files::write_atomically(path, &bytes).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(bytes.len() as u64)
}

/// Reads a file [`write`] wrote.
pub(crate) fn read<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let head = MAGIC.len() + 4;
    if bytes.len() < head
        || &bytes[..MAGIC.len()] != MAGIC
        || bytes[MAGIC.len()..head] != VERSION.to_le_bytes()
    {
        return Err(CheckpointError::Foreign {
            path: path.to_path_buf(),
        });
    }
    postcard::from_bytes(&bytes[head..]).map_err(|source| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        source,
    })
}

/// Node 0's record of the checkpoint being taken.
pub(crate) struct CheckpointDesk {
    pub dir: PathBuf,
    pub exit: bool,
    pub started: Instant,
    /// When every PE was told to write.
    pub writing_from: Option<Instant>,
    pub reply: Sender<Result<CheckpointReport, CheckpointError>>,
}

/// Serves a checkpoint request on node 0's control endpoint: queues it for
/// PE 0 and waits until every file is written.
pub(crate) fn serve_request(node: &Arc<NodeShared>, req: CheckpointRequest) -> ControlReply {
    let refuse = |message: String| ControlReply::Error { message };
    if req.dir.is_empty() {
        return refuse("checkpoint refused: no directory given".into());
    }
    let dir = PathBuf::from(&req.dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return refuse(format!(
            "checkpoint refused: cannot create {}: {e}",
            dir.display()
        ));
    }
    let (tx, rx) = crossbeam_channel::bounded(1);
    let desk = CheckpointDesk {
        dir,
        exit: req.exit,
        started: Instant::now(),
        writing_from: None,
        reply: tx,
    };
    if let Err(Refusal::Busy(busy) | Refusal::Check(busy)) = node
        .operation
        .try_begin(Operation::Checkpoint(desk), || Ok::<(), Busy>(()))
    {
        let message = match busy {
            Busy::Rescale => {
                "checkpoint refused: a rescale is in progress; ask again once it ended"
            }
            Busy::Checkpoint => "a checkpoint is already in progress",
        };
        return ControlReply::Busy {
            message: message.into(),
        };
    }
    node.inboxes[0].push(Envelope {
        prio: 0,
        dest: Dest::System,
        payload: Payload::local(SysMsg::CheckpointBegin),
        counted: false,
    });
    let wait = match req.wait_ms {
        0 => CHECKPOINT_TIMEOUT,
        ms => Duration::from_millis(ms).min(CHECKPOINT_TIMEOUT),
    };
    let answer = |r: Result<CheckpointReport, CheckpointError>| match r {
        Ok(report) => ControlReply::Checkpointed(report),
        Err(e) => refuse(format!("the checkpoint failed: {e}")),
    };
    if let Ok(r) = rx.recv_timeout(wait) {
        return answer(r);
    }
    // No answer in time. Before PE 0 began writing, the request is
    // withdrawn (PE 0 finds no desk and goes on from its sync point), so
    // it cannot end the job after the tool gave up; once it writes, it is
    // finished and answered.
    {
        let withdrawn = node
            .operation
            .take_checkpoint_if(|d| d.writing_from.is_none());
        if withdrawn.is_some() {
            warn!("checkpoint withdrawn: no sync point within {wait:?}");
            return refuse(format!(
                "no sync point within {wait:?}: a checkpoint is taken when an array calls at_sync; \
                 the request was withdrawn and the job goes on"
            ));
        }
    }
    match rx.recv_timeout(WRITE_TIMEOUT) {
        Ok(r) => answer(r),
        Err(_) => refuse(format!(
            "the checkpoint began writing but did not finish within {WRITE_TIMEOUT:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_round_trip_and_foreign_or_truncated_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pe-3.ckpt");
        let file = PeFile {
            pe: 3,
            node: 1,
            chares: vec![SavedChare {
                coll: 7,
                key: 42,
                state: vec![1, 2, 3],
                meta: ElemMeta {
                    next_red: 5,
                    at_sync: true,
                    ..ElemMeta::default()
                },
            }],
        };
        let n = write(&path, &file).unwrap();
        assert_eq!(n, std::fs::metadata(&path).unwrap().len());
        let back: PeFile = read(&path).unwrap();
        assert_eq!((back.pe, back.node, back.chares.len()), (3, 1, 1));
        assert_eq!(back.chares[0].state, vec![1, 2, 3]);
        assert_eq!(back.chares[0].meta.next_red, 5);
        assert!(back.chares[0].meta.at_sync);

        std::fs::write(&path, b"not a checkpoint").unwrap();
        assert!(matches!(
            read::<PeFile>(&path),
            Err(CheckpointError::Foreign { .. })
        ));
        let mut truncated = MAGIC.to_vec();
        truncated.extend(VERSION.to_le_bytes());
        truncated.push(0x80);
        std::fs::write(&path, truncated).unwrap();
        let err = read::<PeFile>(&path).unwrap_err();
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
        let missing = read::<PeFile>(&dir.path().join("nope.ckpt")).unwrap_err();
        assert!(missing.to_string().contains("nope.ckpt"), "{missing}");
    }
}
