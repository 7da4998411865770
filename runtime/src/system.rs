//! The runtime's own messages: collection creation, insertion, location
//! updates, readonly distribution, reductions, quiescence detection and exit.
//!
//! They travel in ordinary envelopes with [`crate::msg::Dest::System`], so they
//! share queues, priorities, the spanning tree and the transport with
//! application messages.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::lb::stats::{ObjStat, PeStat};
use crate::msg::{CallbackSpec, CollId, IndexKey};
use crate::reduce::{Reducer, Value};
use crate::topo::Pe;

/// Runtime bookkeeping that travels with an element.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct ElemMeta {
    /// The reduction number of this element's next contribution.
    pub next_red: u32,
    /// The sequence number of the last broadcast this element ran.
    pub bcast_seen: u64,
    /// Seconds spent in this element's entry methods since the last LB step.
    pub load: f64,
    /// The element called `at_sync` and waits for `resume_from_sync`.
    pub at_sync: bool,
    /// How many times the element has moved: orders location information.
    pub hops: u64,
    /// Asked to move to this PE after the current entry method.
    #[serde(skip)]
    pub migrate_to: Option<Pe>,
    /// Asked to be destroyed after the current entry method.
    #[serde(skip)]
    pub destroy: bool,
}

/// An element that left this PE during an entry method: moved or destroyed.
pub(crate) enum Departure {
    /// Packed for PE `to`.
    Moved {
        coll: CollId,
        key: IndexKey,
        to: Pe,
        state: Vec<u8>,
        meta: ElemMeta,
    },
    /// Destroyed; it owed reduction `next_red` and later ones.
    Destroyed {
        coll: CollId,
        key: IndexKey,
        next_red: u32,
    },
}

/// How a collection's members are placed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Shape {
    /// An array. `dims`/`count`: the bulk range constructed at creation (block
    /// mapped); `None` for an array that starts empty and grows by insertion.
    Array {
        /// Key of the bulk range's extent index (see [`crate::BulkIndex`]).
        dims: Option<IndexKey>,
        /// Number of elements constructed at creation.
        count: u64,
    },
    /// One member per PE.
    Group,
    /// One member per node, on the node's first PE.
    NodeGroup,
}

/// Creation of a collection, broadcast to every PE.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct CreateSpec {
    pub coll: CollId,
    /// Stable hash of the chare type's name.
    pub type_id: u64,
    pub shape: Shape,
    /// postcard encoding of the constructor argument.
    pub init: Vec<u8>,
}

/// A partial reduction result on its way to the root.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Partial {
    pub coll: CollId,
    pub no: u32,
    pub value: Value,
    pub count: u64,
    pub reducer: Reducer,
    pub callback: CallbackSpec,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum SysMsg {
    /// Tree broadcast: create a collection's local members.
    Create(CreateSpec),
    /// To PE 0: register one more element, then forward the insertion.
    InsertRequest {
        coll: CollId,
        key: IndexKey,
        init: Vec<u8>,
        on: Option<Pe>,
    },
    /// To the element's PE: construct it; it joins reductions from `red_start` on.
    Insert {
        coll: CollId,
        key: IndexKey,
        init: Vec<u8>,
        red_start: u32,
    },
    /// To an element's home PE: the element now lives on `pe`, after `hops` moves.
    HomeUpdate {
        coll: CollId,
        key: IndexKey,
        pe: Pe,
        hops: u64,
    },
    /// To a sender whose message was forwarded: the element's PE, after `hops` moves.
    LocationHint {
        coll: CollId,
        key: IndexKey,
        pe: Pe,
        hops: u64,
    },
    /// Tree broadcast from PE 0: readonly values, `(id, postcard bytes)`.
    Readonly { entries: Vec<(u64, Vec<u8>)> },
    /// Up the spanning tree.
    Reduce(Partial),
    /// To PE 0: call `callback` once the job is quiescent.
    QdStart { callback: CallbackSpec },
    /// Tree broadcast: report your message counters for wave `wave`.
    QdWave { wave: u64 },
    /// Up the tree: counters of a subtree for `wave`.
    QdReport {
        wave: u64,
        created: u64,
        processed: u64,
    },
    /// To PE 0: end the job with `code`.
    ExitRequest { code: i32 },
    /// Tree broadcast: stop every PE; the job's exit code is `code`.
    Exit { code: i32 },
    /// An element moving in; `lb_step` when a load-balancing plan moved it.
    Migrate {
        coll: CollId,
        key: IndexKey,
        state: crate::Bulk<u8>,
        meta: ElemMeta,
        lb_step: Option<u64>,
    },
    /// To PE 0: an element was destroyed; it owed reductions from `next_red` on.
    Death { coll: CollId, next_red: u32 },
    /// Tree broadcast: every element of `coll` is at sync; report statistics.
    LbCollect { coll: CollId, step: u64 },
    /// To PE 0: one PE's statistics for step `step`.
    LbReport {
        coll: CollId,
        step: u64,
        pe: PeStat,
        objs: Vec<ObjStat>,
    },
    /// Tree broadcast: the plan, as `(element, from, to)` moves.
    LbPlan {
        coll: CollId,
        step: u64,
        moves: Vec<(IndexKey, Pe, Pe)>,
    },
    /// To PE 0: this PE sent and received every move of the plan (`bytes`
    /// sent; `staging_ns` spent copying device buffers of moving chares
    /// through host memory, see `gpu`).
    LbDone {
        coll: CollId,
        step: u64,
        bytes: u64,
        staging_ns: u64,
    },
    /// Tree broadcast: call `resume_from_sync` on every element.
    LbResume { coll: CollId, step: u64 },
    /// To PE 0: call `callback` with the new PE count after every rescale.
    OnRescale { callback: CallbackSpec },
    /// PE 0 to itself: the control endpoint queued a rescale (see
    /// [`crate::elastic`]); start it.
    RescaleBegin,
    /// From PE 0 to every PE: leave the scheduler loop for the node's
    /// rescale driver (evacuation is done).
    RescaleStop(StopOrder),
    /// A tree broadcast to handle here without forwarding it: a rescale
    /// replaced the tree it was travelling down, and sent a copy to every
    /// PE of its old subtree instead.
    Leaf(Box<SysMsg>),
    /// From PE 0 to each newcomer PE: the job's state to adopt.
    Adopt(Adoption),
    /// To PE 0: a newcomer PE adopted the job's state.
    Adopted,
    /// PE 0 to itself: the control endpoint queued a checkpoint (see
    /// [`crate::checkpoint`]); take it at the next sync point.
    CheckpointBegin,
    /// From PE 0 to every PE (the job is quiescent): write your chares to
    /// directory `dir`.
    CheckpointWrite { dir: String },
    /// To PE 0: what this PE wrote (chares, bytes), or why it could not.
    CheckpointWritten {
        pe: Pe,
        result: Result<(u64, u64), String>,
    },
    /// A checkpointed chare, from the restoring PE 0 to its new PE: it
    /// replaces any member constructed there.
    Restore {
        coll: CollId,
        key: IndexKey,
        state: crate::Bulk<u8>,
        meta: ElemMeta,
    },
    /// From the restoring PE 0, after every `Restore` for this PE.
    RestoreSent,
    /// To PE 0: every `Restore` sent here arrived.
    RestoreAck,
    /// From PE 0 to every PE (the job is quiescent at a sync point): take
    /// buddy checkpoint `gen` (`+ft-every`, see `pe/buddy.rs`).
    BuddySnapshot { ckpt: u64 },
    /// From every PE to PE 0: it is done with checkpoint `ckpt` (its own
    /// copy kept and its buddy's sent, or `BuddyStored` says why not).
    /// Once every PE said so the step runs; the copies travel meanwhile.
    BuddyTaken { ckpt: u64 },
    /// From a PE to its buddy: its chares at checkpoint `ckpt`.
    BuddyCopy {
        ckpt: u64,
        /// The owner, numbered in the checkpoint's view.
        pe: Pe,
        /// Its group and nodegroup members: `(collection, next reduction)`.
        members: Vec<(CollId, u32)>,
        /// Shared with the owner's own copy: sent without copying it again.
        #[serde(with = "shared_chares")]
        chares: Arc<Vec<SavedChare>>,
    },
    /// To PE 0: PE `pe`'s copy of checkpoint `ckpt` is stored at its buddy
    /// (chares, bytes of their state), or why not.
    BuddyStored {
        ckpt: u64,
        pe: Pe,
        members: Vec<(CollId, u32)>,
        result: Result<(u64, u64), String>,
    },
    /// From PE 0 to every PE: checkpoint `ckpt` is complete everywhere;
    /// older ones may go.
    BuddyComplete { ckpt: u64 },
    /// From PE 0 to every PE of a recovery, after its `Adopt`: restore your
    /// own chares of checkpoint `ckpt` and the copies you hold of the lost
    /// PEs `lost` (numbered in the checkpoint's view), then `RestoreSent`.
    BuddyRestore { ckpt: u64, lost: Vec<Pe> },
}

/// One chare as saved: in a checkpoint file (`checkpoint.rs`) or a buddy
/// copy (`pe/buddy.rs`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SavedChare {
    pub coll: CollId,
    pub key: IndexKey,
    /// The packed chare, as one byte string (not one element at a time).
    pub state: crate::Bulk<u8>,
    pub meta: ElemMeta,
}

/// A buddy copy's chares on the wire: the `Vec` they share with the
/// owner's copy, serialized in place; received as a new one.
mod shared_chares {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::SavedChare;

    pub(super) fn serialize<S: Serializer>(
        chares: &Arc<Vec<SavedChare>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        chares.as_slice().serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Arc<Vec<SavedChare>>, D::Error> {
        Vec::deserialize(d).map(Arc::new)
    }
}

/// What every node needs to know to take part in a rescale.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StopOrder {
    /// The epoch being left.
    pub epoch: u64,
    /// Node ids (of `epoch`) that leave.
    pub remove: Vec<u32>,
    /// Newcomers to admit (at most).
    pub admit: u32,
    /// What the request does to node and PE numbering, computed once by
    /// the control service and carried to every PE and node driver.
    pub plan: crate::rescale::plan::Renumbering,
}

/// The state a newcomer PE adopts instead of running main.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Adoption {
    /// Readonly values, `(id, postcard bytes)`.
    pub readonly: Vec<(u64, Vec<u8>)>,
    /// Every collection, in creation order.
    pub colls: Vec<AdoptedColl>,
}

/// One collection as a newcomer adopts it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct AdoptedColl {
    /// How it was created (arrays are not constructed again).
    pub spec: CreateSpec,
    /// The last broadcast the job delivered to it.
    pub last_bcast: u64,
    /// The first reduction a new group or nodegroup member joins.
    pub red_start: u32,
    /// Construct no member here: a restored one arrives (`Restore`).
    pub skip_members: bool,
}

/// The per-PE service that handles a runtime message (`pe.rs` routes by it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Service {
    /// Start-up order and the job's end: readonly data, exit.
    Startup,
    /// Location management: creation, insertion, homes, migration.
    Location,
    /// Reductions and populations.
    Reduction,
    /// Quiescence detection.
    Quiescence,
    /// Load balancing.
    Balance,
    /// Checkpoint and restore.
    Checkpoint,
    /// The rescale's PE side.
    Rescale,
    /// Buddy checkpoints and the rollback of a recovery.
    Buddy,
    /// A `Leaf` inside a `Leaf`: no service, dropped.
    None,
}

impl SysMsg {
    /// Which service handles this message. Exhaustive, so a new message
    /// cannot be added without giving it one.
    pub(crate) fn service(&self) -> Service {
        match self {
            SysMsg::Readonly { .. } | SysMsg::ExitRequest { .. } | SysMsg::Exit { .. } => {
                Service::Startup
            }
            SysMsg::Create(_)
            | SysMsg::InsertRequest { .. }
            | SysMsg::Insert { .. }
            | SysMsg::HomeUpdate { .. }
            | SysMsg::LocationHint { .. }
            | SysMsg::Migrate { .. } => Service::Location,
            SysMsg::Reduce(_) | SysMsg::Death { .. } => Service::Reduction,
            SysMsg::QdStart { .. } | SysMsg::QdWave { .. } | SysMsg::QdReport { .. } => {
                Service::Quiescence
            }
            SysMsg::LbCollect { .. }
            | SysMsg::LbReport { .. }
            | SysMsg::LbPlan { .. }
            | SysMsg::LbDone { .. }
            | SysMsg::LbResume { .. } => Service::Balance,
            SysMsg::CheckpointBegin
            | SysMsg::CheckpointWrite { .. }
            | SysMsg::CheckpointWritten { .. }
            | SysMsg::Restore { .. }
            | SysMsg::RestoreSent
            | SysMsg::RestoreAck => Service::Checkpoint,
            SysMsg::OnRescale { .. }
            | SysMsg::RescaleBegin
            | SysMsg::RescaleStop(_)
            | SysMsg::Adopt(_)
            | SysMsg::Adopted => Service::Rescale,
            SysMsg::BuddySnapshot { .. }
            | SysMsg::BuddyTaken { .. }
            | SysMsg::BuddyCopy { .. }
            | SysMsg::BuddyStored { .. }
            | SysMsg::BuddyComplete { .. }
            | SysMsg::BuddyRestore { .. } => Service::Buddy,
            SysMsg::Leaf(_) => Service::None,
        }
    }

    /// Runtime bookkeeping is invisible to quiescence detection; insertions and
    /// creations are application activity.
    pub(crate) fn counts_for_qd(&self) -> bool {
        matches!(
            self,
            SysMsg::Create(_)
                | SysMsg::InsertRequest { .. }
                | SysMsg::Insert { .. }
                | SysMsg::Migrate { .. }
        )
    }

    /// The collection this message acts on, for messages that must wait on a
    /// PE until that collection's creation has arrived there (insertions are
    /// sent straight from PE 0 and migrants straight from their old PE, while
    /// the creation travels down the spanning tree).
    pub(crate) fn awaits_collection(&self) -> Option<CollId> {
        match self {
            SysMsg::InsertRequest { coll, .. }
            | SysMsg::Insert { coll, .. }
            | SysMsg::Migrate { coll, .. }
            | SysMsg::Restore { coll, .. } => Some(*coll),
            _ => None,
        }
    }

    /// Whether the message is forwarded down the spanning tree before it is handled.
    pub(crate) fn is_tree_broadcast(&self) -> bool {
        matches!(
            self,
            SysMsg::Create(_)
                | SysMsg::Readonly { .. }
                | SysMsg::QdWave { .. }
                | SysMsg::Exit { .. }
                | SysMsg::LbCollect { .. }
                | SysMsg::LbPlan { .. }
                | SysMsg::LbResume { .. }
        )
    }

    /// Runtime messages that only mean something in the view they were sent
    /// in, and that a rescale drops (the state they update is rebuilt).
    pub(crate) fn dropped_by_rescale(&self) -> bool {
        matches!(
            self,
            SysMsg::HomeUpdate { .. }
                | SysMsg::LocationHint { .. }
                | SysMsg::QdWave { .. }
                | SysMsg::QdReport { .. }
        )
    }
}
