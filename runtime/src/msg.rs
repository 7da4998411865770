//! Envelopes: how a message is addressed, queued, and (only when it leaves its
//! node) encoded.
//!
//! Inside a node an envelope carries the message value itself
//! ([`Payload::Local`]); it is serialised only when it crosses to another node,
//! into one frame: a postcard [`WireHeader`] followed by the postcard body.

use std::any::Any;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::topo::Pe;

/// A type that can travel as a message: serialisable for other nodes, cloneable
/// for broadcasts, passed by value inside a node.
pub trait Message: Serialize + DeserializeOwned + Clone + Send + 'static {}
impl<T: Serialize + DeserializeOwned + Clone + Send + 'static> Message for T {}

/// The 128-bit routing key of an element index. Every
/// [`ArrayIndex`](crate::ArrayIndex) maps to one key and back; routing,
/// location tables and home maps see only keys.
pub type IndexKey = u128;

/// Identifies a collection (array, group, nodegroup) job-wide. The upper 32
/// bits are the creating node's stable uid, the lower its creation counter,
/// so creation needs no coordination and ids survive renumbering.
pub type CollId = u64;

/// The main chare's collection id.
pub const MAIN_COLL: CollId = 1;

/// The serialisable form of a callback ([`Callback`](crate::Callback)):
/// its target and the encoding prefix of the entry method that receives the value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackSpec {
    pub(crate) target: Target,
    /// Encoding of the target variant's tag.
    pub(crate) prefix: Vec<u8>,
}

/// Where a callback delivers: an element, a whole array, a group member, or
/// the runtime itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Target {
    Ignore,
    Element {
        coll: CollId,
        key: IndexKey,
    },
    Broadcast {
        coll: CollId,
    },
    Member {
        coll: CollId,
        pe: Pe,
    },
    /// The runtime: every element of `coll` reached `at_sync`.
    LbSync {
        coll: CollId,
    },
    /// The runtime: the job is quiescent at `coll`'s sync point; write the
    /// checkpoint that is waiting.
    Checkpoint {
        coll: CollId,
    },
}

/// Where an envelope goes once it reaches its destination PE.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Dest {
    /// An array element; `src` is the sending PE (for location-cache hints).
    Element {
        coll: CollId,
        key: IndexKey,
        src: Pe,
    },
    /// The group or nodegroup member on the destination PE.
    Member { coll: CollId },
    /// Every local element of a collection, then down the spanning tree.
    /// `seq` numbers the collection's broadcasts (assigned by PE 0; 0 until then).
    Broadcast { coll: CollId, seq: u64 },
    /// A numbered broadcast delivered to this PE's elements only, not
    /// forwarded: what a rescale turns a broadcast into when the spanning
    /// tree it was travelling down is replaced.
    BroadcastLeaf { coll: CollId, seq: u64 },
    /// The runtime itself.
    System,
}

/// A message value that can be encoded on demand and cloned for broadcasts.
pub(crate) trait ErasedMsg: Send {
    /// Appends the encoding to `out` (one buffer for header and body).
    fn encode_into(&self, out: Vec<u8>) -> Vec<u8>;
    fn clone_box(&self) -> Box<dyn ErasedMsg>;
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<T: Message> ErasedMsg for T {
    fn encode_into(&self, out: Vec<u8>) -> Vec<u8> {
        postcard::to_extend(self, out).expect("encoding into a Vec cannot fail")
    }
    fn clone_box(&self) -> Box<dyn ErasedMsg> {
        Box::new(self.clone())
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// A message body: a value inside the node, bytes once it came from the wire.
pub(crate) enum Payload {
    /// Passed by value between PEs of one node.
    Local(Box<dyn ErasedMsg>),
    /// Received from another node: `bytes[offset..]` is the postcard body.
    Wire {
        bytes: std::sync::Arc<Vec<u8>>,
        offset: usize,
    },
}

/// A body that did not decode into the type its destination expects.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Wire bytes were not a valid encoding.
    #[error("malformed {expected} message body: {source}")]
    Malformed {
        /// Rust type expected.
        expected: &'static str,
        /// postcard's reason.
        source: postcard::Error,
    },
    /// A local value of another type reached this destination (a bug in the sender).
    #[error("message of the wrong type for {expected}")]
    WrongType {
        /// Rust type expected.
        expected: &'static str,
    },
}

impl Payload {
    pub(crate) fn local<M: Message>(m: M) -> Payload {
        Payload::Local(Box::new(m))
    }

    /// Takes the typed message out.
    pub(crate) fn take<M: Message>(self) -> Result<M, DecodeError> {
        match self {
            Payload::Local(b) => {
                b.into_any()
                    .downcast::<M>()
                    .map(|b| *b)
                    .map_err(|_| DecodeError::WrongType {
                        expected: std::any::type_name::<M>(),
                    })
            }
            Payload::Wire { bytes, offset } => {
                postcard::from_bytes(&bytes[offset..]).map_err(|source| DecodeError::Malformed {
                    expected: std::any::type_name::<M>(),
                    source,
                })
            }
        }
    }

    /// A copy for one more recipient (broadcast fan-out). Wire bodies share their buffer.
    pub(crate) fn duplicate(&self) -> Payload {
        match self {
            Payload::Local(b) => Payload::Local(b.clone_box()),
            Payload::Wire { bytes, offset } => Payload::Wire {
                bytes: bytes.clone(),
                offset: *offset,
            },
        }
    }
}

/// One queued message.
pub(crate) struct Envelope {
    /// Lower runs first; 0 is the default. Charm++ integer-priority semantics.
    pub prio: i32,
    pub dest: Dest,
    pub payload: Payload,
    /// Whether this envelope is counted by quiescence detection (set when sent).
    pub counted: bool,
}

/// The header of an envelope that crosses nodes.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WireHeader {
    pub dest_pe: Pe,
    pub prio: i32,
    pub counted: bool,
    pub dest: Dest,
}

/// Why a frame from another node was not delivered.
#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum FrameRefused {
    /// Sent under another view: a message must never cross a rescale.
    #[error("it was sent at another epoch ({sent:#x} in the tag, {here} here)")]
    StaleEpoch { sent: u64, here: u64 },
    /// Not a kind this runtime sends.
    #[error("unknown message kind {0}")]
    UnknownKind(u32),
    /// The header did not decode.
    #[error("malformed header: {0}")]
    Malformed(postcard::Error),
    /// Addressed to a PE this node does not host.
    #[error("it is addressed to PE {0}, which is not on this node")]
    NotHere(Pe),
}

/// Decodes a frame received from another node into the envelope for one of
/// this node's PEs (by local rank). Never panics, whatever the bytes.
pub(crate) fn decode_frame(
    topo: &crate::topo::Topology,
    tag: crate::transport::Tag,
    frame: Vec<u8>,
) -> Result<(usize, Envelope), FrameRefused> {
    if tag.epoch_bits() != topo.epoch() & 0xffff {
        return Err(FrameRefused::StaleEpoch {
            sent: tag.epoch_bits(),
            here: topo.epoch(),
        });
    }
    if tag.kind() != crate::transport::kind::ENVELOPE {
        return Err(FrameRefused::UnknownKind(tag.kind()));
    }
    let (header, rest) =
        postcard::take_from_bytes::<WireHeader>(&frame).map_err(FrameRefused::Malformed)?;
    let offset = frame.len() - rest.len();
    if header.dest_pe >= topo.num_pes() || !topo.is_local(header.dest_pe) {
        return Err(FrameRefused::NotHere(header.dest_pe));
    }
    let rank = topo.rank_of(header.dest_pe);
    let env = Envelope {
        prio: header.prio,
        dest: header.dest,
        counted: header.counted,
        payload: Payload::Wire {
            bytes: std::sync::Arc::new(frame),
            offset,
        },
    };
    Ok((rank, env))
}

/// [`decode_frame`] for fuzzers and tests outside the crate: the local
/// rank of the PE `frame` (received with `tag`) is for, or why it was
/// refused. Never panics, whatever the bytes.
pub fn decode_frame_rank(
    topo: &crate::topo::Topology,
    tag: crate::transport::Tag,
    frame: Vec<u8>,
) -> Result<usize, String> {
    decode_frame(topo, tag, frame)
        .map(|(rank, _)| rank)
        .map_err(|e| e.to_string())
}

/// Encodes an envelope leaving for PE `dest_pe` as one frame: the header,
/// then the body, in one buffer, so that a transport can hand the buffer
/// itself to the network (UCX) instead of gathering parts into a copy.
pub(crate) fn encode_frame(dest_pe: Pe, env: &Envelope) -> Vec<u8> {
    let header = WireHeader {
        dest_pe,
        prio: env.prio,
        counted: env.counted,
        dest: env.dest.clone(),
    };
    let head = postcard::to_allocvec(&header).expect("encoding into a Vec cannot fail");
    match &env.payload {
        Payload::Local(b) => b.encode_into(head),
        Payload::Wire { bytes, offset } => {
            let mut f = head;
            f.extend_from_slice(&bytes[*offset..]);
            f
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system::SysMsg;
    use crate::topo::Topology;
    use crate::transport::{kind, Tag};
    use ductile_coordinator::proto::{Member, View};
    use proptest::prelude::*;

    /// Node 1 of a 3-node view with 2 PEs each: hosts PEs 2 and 3.
    fn topo() -> Topology {
        let members = (0..3)
            .map(|i| Member {
                node: i,
                uid: i as u64 + 1,
                address: vec![],
                pes: 2,
                host: "h".into(),
                pid: 0,
            })
            .collect();
        Topology::new(&View { epoch: 7, members }, 1)
    }

    fn frame(dest_pe: Pe, env: &Envelope) -> Vec<u8> {
        encode_frame(dest_pe, env)
    }

    #[test]
    fn a_frame_round_trips_to_the_right_pe() {
        let env = Envelope {
            prio: -3,
            dest: Dest::Element {
                coll: 9,
                key: 42,
                src: 5,
            },
            payload: Payload::local(vec![1u64, 2, 3]),
            counted: true,
        };
        let (rank, got) =
            decode_frame(&topo(), Tag::new(0, 7, kind::ENVELOPE), frame(3, &env)).unwrap();
        assert_eq!(rank, 1);
        assert_eq!((got.prio, got.counted), (-3, true));
        assert!(matches!(
            got.dest,
            Dest::Element {
                coll: 9,
                key: 42,
                src: 5
            }
        ));
        assert_eq!(got.payload.take::<Vec<u64>>().unwrap(), vec![1, 2, 3]);
    }

    #[test]
    fn frames_of_another_epoch_kind_or_node_are_refused() {
        let env = Envelope {
            prio: 0,
            dest: Dest::System,
            payload: Payload::local(SysMsg::Exit { code: 1 }),
            counted: false,
        };
        let t = topo();
        assert!(matches!(
            decode_frame(&t, Tag::new(0, 6, kind::ENVELOPE), frame(2, &env)),
            Err(FrameRefused::StaleEpoch { .. })
        ));
        assert!(matches!(
            decode_frame(&t, Tag::new(0, 7, 99), frame(2, &env)),
            Err(FrameRefused::UnknownKind(99))
        ));
        assert!(matches!(
            decode_frame(&t, Tag::new(0, 7, kind::ENVELOPE), frame(0, &env)),
            Err(FrameRefused::NotHere(0))
        ));
        assert!(matches!(
            decode_frame(&t, Tag::new(0, 7, kind::ENVELOPE), frame(9, &env)),
            Err(FrameRefused::NotHere(9))
        ));
        assert!(matches!(
            decode_frame(&t, Tag::new(0, 7, kind::ENVELOPE), vec![0xff; 3]),
            Err(FrameRefused::Malformed(_))
        ));
    }

    proptest! {
        /// Whatever arrives from the wire, decoding it and then the body it
        /// carries returns errors, never panics.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), kind_bits in 0u32..4) {
            if let Ok((rank, env)) = decode_frame(&topo(), Tag::new(0, 7, kind_bits), bytes) {
                prop_assert!(rank < 2);
                let _ = env.payload.take::<SysMsg>();
            }
        }
    }
}
