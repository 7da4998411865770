//! Checkpoint to a directory and restart from it: the kill-and-restart
//! baseline that no-restart rescaling is measured against (Charm++'s
//! `CkStartCheckpoint` and `+restart`), not the product.
//!
//! A tool asks node 0's control endpoint ([`service::serve_request`]); PE 0 waits for
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
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::msg::CollId;
use crate::system::CreateSpec;

pub(crate) mod service;

/// First bytes of every checkpoint file.
pub const MAGIC: &[u8; 8] = b"DUCTCKPT";
/// Format version; bumped on any change of the types below.
pub const VERSION: u32 = 2;
/// The longest a checkpoint request waits for a sync point (a request's
/// `wait_ms` may ask for less).
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a checkpoint whose files are being written may still take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(120);

/// One chare as written (a runtime message type too: buddy copies carry it).
pub(crate) use crate::system::SavedChare;

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
    pub rescale_callbacks: Vec<crate::msg::CallbackSpec>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system::ElemMeta;

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
                state: crate::Bulk(vec![1, 2, 3]),
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
        assert_eq!(back.chares[0].state.0, vec![1, 2, 3]);
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
