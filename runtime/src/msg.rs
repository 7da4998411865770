//! Envelopes: how a message is addressed, queued, and (only when it leaves its
//! node) encoded.
//!
//! Inside a node an envelope carries the message value itself
//! ([`Payload::Local`]); it is serialised only when it crosses to another node,
//! into one frame: a postcard [`WireHeader`] followed by the postcard body.
//! The frame is written in pieces ([`write_frame`]): small fields gathered
//! into one buffer, each large byte string (a [`Bulk`](crate::Bulk) body, a
//! forwarded wire body) handed to the transport from the payload's own
//! memory, so a transport that writes vectored (TCP) copies nothing.

use std::any::Any;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::topo::Pe;
use crate::transport::FrameWrite;

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

/// A map keyed by collection ids, index keys, or both: the tables every
/// message looks up on its way (the PE's stores, its location tables).
/// FxHash, not the standard SipHash: a lookup costs a few nanoseconds
/// instead of tens, and these keys are the job's own ids, not input an
/// attacker chooses (a peer that could send frames could do worse than
/// collide hashes, and peers prove the job's secret when they connect).
pub(crate) type IdMap<K, V> = std::collections::HashMap<K, V, rustc_hash::FxBuildHasher>;

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
    /// The runtime: the job is quiescent at `coll`'s sync point; take the
    /// buddy checkpoint that is waiting (`+ft-every`).
    BuddyCheckpoint {
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
    /// The length of the encoding, without encoding.
    fn encoded_len(&self) -> usize;
    /// Writes the encoding through `g`.
    fn encode_gather(&self, g: &mut Gather<'_, '_>) -> postcard::Result<()>;
    fn clone_box(&self) -> Box<dyn ErasedMsg>;
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<T: Message> ErasedMsg for T {
    fn encoded_len(&self) -> usize {
        postcard::experimental::serialized_size(self).expect("sizing an encoding cannot fail")
    }
    fn encode_gather(&self, g: &mut Gather<'_, '_>) -> postcard::Result<()> {
        postcard::serialize_with_flavor(self, g)
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

/// A byte string at least this long is written from its own memory rather
/// than gathered into the small-field buffer.
pub(crate) const GATHER_MIN: usize = 4096;
/// Small fields are written once this many have gathered.
const GATHER_BUF: usize = 64 * 1024;

/// A postcard flavor that writes a frame in pieces through a [`FrameWrite`]:
/// small fields gathered into one buffer, each byte string of
/// [`GATHER_MIN`] bytes or more written straight from the value's memory,
/// together with the buffer before it (one vectored write, no copy).
pub(crate) struct Gather<'a, 'w> {
    buf: Vec<u8>,
    write: &'a mut FrameWrite<'w>,
    error: Option<std::io::Error>,
}

impl<'a, 'w> Gather<'a, 'w> {
    fn new(write: &'a mut FrameWrite<'w>) -> Self {
        Gather {
            buf: Vec::with_capacity(256),
            write,
            error: None,
        }
    }
    fn emit(&mut self, big: &[u8]) -> postcard::Result<()> {
        let r = if self.buf.is_empty() {
            (self.write)(&[big])
        } else {
            (self.write)(&[&self.buf, big])
        };
        self.buf.clear();
        r.map_err(|e| {
            self.error = Some(e);
            postcard::Error::SerializeBufferFull
        })
    }
    /// Writes what is still gathered; the io error that stopped the frame, if any.
    fn finish(mut self, r: postcard::Result<()>) -> std::io::Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        r.map_err(|e| std::io::Error::other(format!("encoding the message: {e}")))?;
        if !self.buf.is_empty() {
            (self.write)(&[&self.buf])?;
        }
        Ok(())
    }
}

impl postcard::ser_flavors::Flavor for &mut Gather<'_, '_> {
    type Output = ();
    fn try_push(&mut self, b: u8) -> postcard::Result<()> {
        self.buf.push(b);
        Ok(())
    }
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        if data.len() >= GATHER_MIN {
            return self.emit(data);
        }
        self.buf.extend_from_slice(data);
        if self.buf.len() >= GATHER_BUF {
            return self.emit(&[]);
        }
        Ok(())
    }
    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

fn wire_header(dest_pe: Pe, env: &Envelope) -> WireHeader {
    WireHeader {
        dest_pe,
        prio: env.prio,
        counted: env.counted,
        dest: env.dest.clone(),
    }
}

/// The length of the frame [`write_frame`] writes for `env` leaving for PE
/// `dest_pe`, without encoding it (a transport announces it first).
pub(crate) fn frame_len(dest_pe: Pe, env: &Envelope) -> usize {
    let head = postcard::experimental::serialized_size(&wire_header(dest_pe, env))
        .expect("sizing an encoding cannot fail");
    head + match &env.payload {
        Payload::Local(b) => b.encoded_len(),
        Payload::Wire { bytes, offset } => bytes.len() - offset,
    }
}

/// Writes the frame of an envelope leaving for PE `dest_pe` through
/// `write`: the header, then the body, exactly [`frame_len`] bytes. Large
/// byte strings of the body (a [`Bulk`](crate::Bulk)'s contents, the body
/// of a wire payload sent on) go to `write` from their own memory.
pub(crate) fn write_frame(
    dest_pe: Pe,
    env: &Envelope,
    write: &mut FrameWrite<'_>,
) -> std::io::Result<()> {
    let mut g = Gather::new(write);
    let mut r = postcard::serialize_with_flavor(&wire_header(dest_pe, env), &mut g);
    if r.is_ok() {
        r = match &env.payload {
            Payload::Local(b) => b.encode_gather(&mut g),
            Payload::Wire { bytes, offset } => {
                postcard::ser_flavors::Flavor::try_extend(&mut &mut g, &bytes[*offset..])
            }
        };
    }
    g.finish(r)
}

/// Encodes an envelope leaving for PE `dest_pe` as one frame in one buffer
/// (what [`write_frame`] writes, gathered).
pub(crate) fn encode_frame(dest_pe: Pe, env: &Envelope) -> Vec<u8> {
    let mut out = Vec::with_capacity(frame_len(dest_pe, env));
    write_frame(dest_pe, env, &mut |parts: &[&[u8]]| {
        parts.iter().for_each(|p| out.extend_from_slice(p));
        Ok(())
    })
    .expect("encoding into a Vec cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system::SysMsg;
    use crate::topo::Topology;
    use crate::transport::{Tag, kind};
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

    /// A message with a large byte body among small fields, as an
    /// application sends one (`pingpong`'s, a ghost row).
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    enum Big {
        Small(u32),
        Data {
            step: u64,
            row: crate::Bulk<f64>,
            bytes: crate::Bulk<u8>,
        },
    }

    fn big_env(n: usize) -> (Envelope, Big) {
        let msg = Big::Data {
            step: 77,
            row: crate::Bulk((0..n).map(|i| i as f64 * 0.5).collect()),
            bytes: crate::Bulk((0..n).map(|i| (i % 251) as u8).collect()),
        };
        let env = Envelope {
            prio: 2,
            dest: Dest::Element {
                coll: 3,
                key: 1,
                src: 0,
            },
            payload: Payload::local(msg.clone()),
            counted: true,
        };
        (env, msg)
    }

    /// The pieces `write_frame` hands to a transport: (address, bytes) each.
    fn pieces(dest_pe: Pe, env: &Envelope) -> Vec<(usize, Vec<u8>)> {
        let mut out = Vec::new();
        write_frame(dest_pe, env, &mut |parts: &[&[u8]]| {
            out.extend(parts.iter().map(|p| (p.as_ptr() as usize, p.to_vec())));
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn a_large_body_is_written_from_the_messages_own_memory_and_round_trips() {
        for n in [0, 10, GATHER_MIN, 100_000] {
            let (env, msg) = big_env(n);
            let parts = pieces(3, &env);
            let frame: Vec<u8> = parts.iter().flat_map(|(_, p)| p.clone()).collect();
            assert_eq!(frame.len(), frame_len(3, &env), "n={n}: announced length");
            assert_eq!(frame, encode_frame(3, &env), "n={n}: one encoding");
            let (rank, got) = decode_frame(&topo(), Tag::new(0, 7, kind::ENVELOPE), frame).unwrap();
            assert_eq!(rank, 1);
            assert_eq!(got.payload.take::<Big>().unwrap(), msg, "n={n}");
            // Bodies of GATHER_MIN bytes or more are pieces of their own.
            let big_pieces = parts.iter().filter(|(_, p)| p.len() >= GATHER_MIN).count();
            let want = [n * 8, n].iter().filter(|&&l| l >= GATHER_MIN).count();
            assert!(big_pieces >= want, "n={n}: {big_pieces} large pieces");
        }
    }

    #[test]
    fn no_byte_of_a_large_bulk_is_copied_on_the_way_out() {
        let row = crate::Bulk(vec![1.25f64; 50_000]);
        let addr = row.as_ptr() as usize;
        let env = Envelope {
            prio: 0,
            dest: Dest::System,
            payload: Payload::local(row),
            counted: false,
        };
        // Boxing into the envelope moved the vector, not its data.
        let parts = pieces(2, &env);
        let body = parts
            .iter()
            .find(|(_, p)| p.len() == 50_000 * 8)
            .expect("the body is one piece");
        assert_eq!(body.0, addr, "the piece is the Bulk's own memory");
        // A wire body sent on (broadcast forwarding) is written from its buffer too.
        let frame = encode_frame(2, &env);
        let (_, got) = decode_frame(&topo(), Tag::new(0, 7, kind::ENVELOPE), frame).unwrap();
        let Payload::Wire { bytes, offset } = &got.payload else {
            unreachable!()
        };
        let start = bytes[*offset..].as_ptr() as usize;
        let parts = pieces(3, &got);
        assert!(
            parts
                .iter()
                .any(|(a, p)| *a == start && p.len() == bytes.len() - offset)
        );
        let again: Vec<u8> = parts.into_iter().flat_map(|(_, p)| p).collect();
        let (_, env2) = decode_frame(&topo(), Tag::new(0, 7, kind::ENVELOPE), again).unwrap();
        assert_eq!(
            env2.payload.take::<crate::Bulk<f64>>().unwrap().0,
            vec![1.25; 50_000]
        );
    }

    #[test]
    fn a_truncated_frame_is_refused_with_a_reason_never_misread() {
        let (env, _) = big_env(5000);
        let frame = encode_frame(3, &env);
        for cut in [0, 1, 5, 20, frame.len() / 2, frame.len() - 1] {
            let t = frame[..cut].to_vec();
            match decode_frame(&topo(), Tag::new(0, 7, kind::ENVELOPE), t) {
                Err(FrameRefused::Malformed(_)) => {}
                Err(e) => panic!("cut {cut}: refused for another reason: {e}"),
                Ok((_, got)) => {
                    let e = got.payload.take::<Big>().unwrap_err();
                    let why = e.to_string();
                    assert!(
                        why.contains("malformed") && why.contains("Big"),
                        "cut {cut}: {why}"
                    );
                }
            }
        }
    }

    proptest! {
        /// Whatever arrives from the wire, decoding it and then the body it
        /// carries returns errors, never panics.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), kind_bits in 0u32..4) {
            if let Ok((rank, env)) = decode_frame(&topo(), Tag::new(0, 7, kind_bits), bytes) {
                prop_assert!(rank < 2);
                let _ = SysMsg::take(env.payload);
            }
        }
    }
}
