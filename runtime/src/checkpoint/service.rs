//! The checkpoint's node side: node 0's control endpoint queues a request
//! for PE 0 (one operation at a time: never with a rescale) and waits until
//! every file is written. The file formats are the parent module's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use ductile_coordinator::control::{CheckpointReport, CheckpointRequest, ControlReply};
use tracing::warn;

use super::{CheckpointError, CHECKPOINT_TIMEOUT, WRITE_TIMEOUT};
use crate::msg::{Dest, Envelope, Payload};
use crate::node::NodeShared;
use crate::operation::{Busy, Operation, Refusal};
use crate::system::SysMsg;

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
