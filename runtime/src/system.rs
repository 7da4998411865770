//! The runtime's own messages: collection creation, insertion, location
//! updates, readonly distribution, reductions, quiescence detection and exit.
//!
//! They travel in ordinary envelopes with [`crate::msg::Dest::System`], so they
//! share queues, priorities, the spanning tree and the transport with
//! application messages.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::lb::stats::{ObjStat, PeStat};
use crate::msg::{CallbackSpec, CollId, DecodeError, IndexKey, Payload};
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
    /// The element discounted that load ([`Ctx::discount_load`](crate::Ctx::discount_load)):
    /// the next step counts it as unmeasured.
    #[serde(default)]
    pub unmeasured: bool,
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
    /// To the element's PE: construct it; it joins reductions from
    /// `red_start` on and runs the broadcasts numbered after `bcast_seen`
    /// (those the root numbered before it took the insertion are not its).
    Insert {
        coll: CollId,
        key: IndexKey,
        init: Vec<u8>,
        red_start: u32,
        bcast_seen: u64,
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
        /// Shared with the owner's own copy when sent; kept as the frame
        /// it came in when received (see [`BuddyChares`]).
        chares: BuddyChares,
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

/// One saved chare read in place from the bytes it was encoded into:
/// `state` borrows them. Encoded exactly as [`SavedChare`].
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SavedChareRef<'a> {
    pub coll: CollId,
    pub key: IndexKey,
    #[serde(borrow, with = "byte_string")]
    pub state: &'a [u8],
    pub meta: ElemMeta,
}

/// `&[u8]` as one byte string (serde's default for a slice is a sequence
/// of bytes, written one at a time; postcard encodes both alike).
mod byte_string {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(b)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<&'de [u8], D::Error> {
        <&'de [u8]>::deserialize(d)
    }
}

/// A buddy copy's chares (`+ft-every`, `pe/buddy.rs`).
///
/// The sender's are shared with its own copy and written to the wire in
/// place. A copy received from another node stays the frame it came in:
/// checked and counted when it arrives, decoded only if a recovery restores
/// it. A checkpoint passes over a PE's state once less than if every copy
/// were decoded into chares of its own on arrival.
#[derive(Clone, Debug)]
pub(crate) enum BuddyChares {
    Shared(Arc<Vec<SavedChare>>),
    Received(ReceivedChares),
}

/// A received copy: `bytes[offset..]` encodes a `Vec<SavedChare>`, its
/// states out of line (`large`).
#[derive(Clone, Debug)]
pub(crate) struct ReceivedChares {
    bytes: Arc<Vec<u8>>,
    offset: usize,
    large: Vec<crate::msg::Large>,
    count: u64,
    state_bytes: u64,
}

impl BuddyChares {
    /// Chares in the copy.
    pub(crate) fn count(&self) -> u64 {
        match self {
            BuddyChares::Shared(c) => c.len() as u64,
            BuddyChares::Received(r) => r.count,
        }
    }

    /// Bytes of the chares' packed state.
    pub(crate) fn state_bytes(&self) -> u64 {
        match self {
            BuddyChares::Shared(c) => c.iter().map(|c| c.state.len() as u64).sum(),
            BuddyChares::Received(r) => r.state_bytes,
        }
    }

    /// The chares, read in place.
    pub(crate) fn chares(&self) -> Result<Vec<SavedChareRef<'_>>, postcard::Error> {
        match self {
            BuddyChares::Shared(c) => Ok(c
                .iter()
                .map(|c| SavedChareRef {
                    coll: c.coll,
                    key: c.key,
                    state: c.state.0.as_slice(),
                    meta: c.meta.clone(),
                })
                .collect()),
            BuddyChares::Received(r) => {
                crate::msg::take_shared(&r.bytes, r.offset, &r.large).map(|(c, _)| c)
            }
        }
    }
}

impl Serialize for BuddyChares {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            BuddyChares::Shared(c) => c.as_slice().serialize(s),
            // Sent on again (a departing PE forwards what it holds).
            BuddyChares::Received(_) => self
                .chares()
                .map_err(serde::ser::Error::custom)?
                .serialize(s),
        }
    }
}

/// Decoded as chares of its own; a frame from another node goes through
/// [`SysMsg::take`], which keeps it as it came.
impl<'de> Deserialize<'de> for BuddyChares {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::deserialize(d).map(|c| BuddyChares::Shared(Arc::new(c)))
    }
}

/// The fields of [`SysMsg::BuddyCopy`] before its chares, in its order.
#[derive(Deserialize)]
struct BuddyCopyHead {
    ckpt: u64,
    pe: Pe,
    members: Vec<(CollId, u32)>,
}

/// The variant index postcard writes first for a [`SysMsg::BuddyCopy`].
fn buddy_copy_variant() -> u32 {
    static VARIANT: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *VARIANT.get_or_init(|| {
        let sample = SysMsg::BuddyCopy {
            ckpt: 0,
            pe: 0,
            members: Vec::new(),
            chares: BuddyChares::Shared(Arc::default()),
        };
        let bytes = postcard::to_allocvec(&sample).expect("encoding into a Vec cannot fail");
        postcard::take_from_bytes::<u32>(&bytes)
            .expect("a variant index leads")
            .0
    })
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
    /// The runtime message an envelope carries. A buddy copy from another
    /// node keeps its chares in the frame they came in ([`BuddyChares`]).
    pub(crate) fn take(payload: Payload) -> Result<SysMsg, DecodeError> {
        match payload {
            Payload::Wire {
                bytes,
                offset,
                large,
            } => {
                let malformed = |source| DecodeError::Malformed {
                    expected: std::any::type_name::<SysMsg>(),
                    source,
                };
                match crate::msg::take_shared::<u32>(&bytes, offset, &large) {
                    Ok((v, at)) if v == buddy_copy_variant() => {
                        let (head, at) =
                            crate::msg::take_shared::<BuddyCopyHead>(&bytes, at, &large)
                                .map_err(malformed)?;
                        let (read, _) =
                            crate::msg::take_shared::<Vec<SavedChareRef<'_>>>(&bytes, at, &large)
                                .map_err(malformed)?;
                        let count = read.len() as u64;
                        let state_bytes = read.iter().map(|c| c.state.len() as u64).sum();
                        drop(read);
                        let chares = BuddyChares::Received(ReceivedChares {
                            bytes,
                            offset: at,
                            large,
                            count,
                            state_bytes,
                        });
                        Ok(SysMsg::BuddyCopy {
                            ckpt: head.ckpt,
                            pe: head.pe,
                            members: head.members,
                            chares,
                        })
                    }
                    _ => Payload::Wire {
                        bytes,
                        offset,
                        large,
                    }
                    .take(),
                }
            }
            local => local.take(),
        }
    }

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

/// [`crate::msg::decode_frame`] for fuzzers and tests outside the crate,
/// and the runtime message a system envelope carries (a buddy copy's
/// chares read in place, as a PE takes it): the local rank of the PE
/// `frame` (received with `tag`) is for, or why it was refused. Never
/// panics, whatever the bytes.
pub fn decode_frame_rank(
    topo: &crate::topo::Topology,
    tag: crate::transport::Tag,
    frame: Vec<u8>,
) -> Result<usize, String> {
    let (rank, env) = crate::msg::decode_frame(topo, tag, frame).map_err(|e| e.to_string())?;
    if matches!(env.dest, crate::msg::Dest::System) {
        SysMsg::take(env.payload).map_err(|e| e.to_string())?;
    }
    Ok(rank)
}

/// A frame for PE `dest_pe` carrying a buddy copy of two chares of
/// `state_len` bytes each, as a PE sends one: a seed for fuzz corpora
/// (from 4 KiB on, the states travel out of line, `msg::large`).
#[doc(hidden)]
pub fn buddy_copy_frame(dest_pe: Pe, state_len: usize) -> Vec<u8> {
    let chares = (0..2u8)
        .map(|k| SavedChare {
            coll: 3,
            key: IndexKey::from(k),
            state: crate::Bulk(vec![k; state_len]),
            meta: ElemMeta::default(),
        })
        .collect();
    let msg = SysMsg::BuddyCopy {
        ckpt: 2,
        pe: 0,
        members: vec![(1, 4)],
        chares: BuddyChares::Shared(Arc::new(chares)),
    };
    let env = crate::msg::Envelope {
        prio: 0,
        dest: crate::msg::Dest::System,
        payload: Payload::local(msg),
        counted: false,
    };
    crate::msg::encode_frame(dest_pe, &env)
}

/// A frame for PE `dest_pe` carrying one element migrating in with
/// `state_len` bytes of state: a seed for fuzz corpora.
#[doc(hidden)]
pub fn migrate_frame(dest_pe: Pe, state_len: usize) -> Vec<u8> {
    let env = crate::msg::Envelope {
        prio: 0,
        dest: crate::msg::Dest::System,
        payload: Payload::local(SysMsg::Migrate {
            coll: 3,
            key: 1,
            state: crate::Bulk(vec![9; state_len]),
            meta: ElemMeta::default(),
            lb_step: Some(2),
        }),
        counted: true,
    };
    crate::msg::encode_frame(dest_pe, &env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy() -> Vec<SavedChare> {
        (0..3u8)
            .map(|k| SavedChare {
                coll: 7,
                key: u128::from(k) << 70,
                state: crate::Bulk(vec![k; 1000 + usize::from(k)]),
                meta: ElemMeta {
                    next_red: 4 + u32::from(k),
                    hops: 2,
                    ..Default::default()
                },
            })
            .collect()
    }

    fn wire(msg: &SysMsg) -> Payload {
        let mut bytes = vec![0xAB; 5];
        bytes.extend(postcard::to_allocvec(msg).unwrap());
        Payload::Wire {
            bytes: Arc::new(bytes),
            offset: 5,
            large: Vec::new(),
        }
    }

    fn same(a: &SavedChareRef<'_>, b: &SavedChare) -> bool {
        a.coll == b.coll
            && a.key == b.key
            && a.state == b.state.0.as_slice()
            && a.meta.next_red == b.meta.next_red
            && a.meta.hops == b.meta.hops
    }

    /// A buddy copy from another node is kept in the frame it came in,
    /// counted on arrival, and reads back exactly what was sent.
    #[test]
    fn a_received_buddy_copy_stays_in_its_frame_and_reads_back_the_chares_sent() {
        let sent = copy();
        let msg = SysMsg::BuddyCopy {
            ckpt: 9,
            pe: 3,
            members: vec![(2, 11)],
            chares: BuddyChares::Shared(Arc::new(sent.clone())),
        };
        let Ok(SysMsg::BuddyCopy {
            ckpt,
            pe,
            members,
            chares,
        }) = SysMsg::take(wire(&msg))
        else {
            panic!("not a buddy copy");
        };
        assert_eq!((ckpt, pe, members), (9, 3, vec![(2, 11)]));
        assert!(matches!(chares, BuddyChares::Received(_)), "kept undecoded");
        assert_eq!(chares.count(), 3);
        assert_eq!(chares.state_bytes(), 1000 + 1001 + 1002);
        let back = chares.chares().unwrap();
        assert_eq!(back.len(), 3);
        assert!(back.iter().zip(&sent).all(|(a, b)| same(a, b)));
        // Sent on again (a departing PE forwarding it): the same encoding.
        let again = SysMsg::BuddyCopy {
            ckpt,
            pe,
            members: vec![(2, 11)],
            chares: chares.clone(),
        };
        assert_eq!(
            postcard::to_allocvec(&again).unwrap(),
            postcard::to_allocvec(&msg).unwrap()
        );
    }

    /// A torn copy is refused when it arrives, not when a recovery needs it.
    #[test]
    fn a_torn_buddy_copy_is_refused_on_arrival() {
        let msg = SysMsg::BuddyCopy {
            ckpt: 1,
            pe: 0,
            members: Vec::new(),
            chares: BuddyChares::Shared(Arc::new(copy())),
        };
        let mut bytes = postcard::to_allocvec(&msg).unwrap();
        bytes.truncate(bytes.len() - 10);
        let torn = Payload::encoded(bytes);
        let err = SysMsg::take(torn).unwrap_err();
        assert!(err.to_string().contains("malformed"), "{err}");
    }

    /// Other runtime messages decode as before.
    #[test]
    fn other_runtime_messages_decode_as_before() {
        let msg = SysMsg::BuddyRestore {
            ckpt: 4,
            lost: vec![1, 2],
        };
        let Ok(SysMsg::BuddyRestore { ckpt, lost }) = SysMsg::take(wire(&msg)) else {
            panic!("not decoded");
        };
        assert_eq!((ckpt, lost), (4, vec![1, 2]));
    }
}
