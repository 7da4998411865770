//! Envelopes: how a message is addressed, queued, and (only when it leaves its
//! node) encoded.
//!
//! Inside a node an envelope carries the message value itself
//! ([`Payload::Local`]); it is serialised only when it crosses to another node,
//! into one frame: the body's large byte strings, then a postcard
//! [`WireHeader`] and the body's small fields, then a footer ([`large`]).
//! The frame is written in pieces ([`write_frame`]): small fields gathered
//! into one buffer, each large byte string (a [`Bulk`](crate::Bulk) body, a
//! forwarded wire body) handed to the transport from the payload's own
//! memory, so a transport that writes vectored (TCP) copies nothing; and a
//! frame's one large string received becomes the `Bulk<u8>` that reads it.

use std::any::Any;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::topo::Pe;
use crate::transport::FrameWrite;

mod large;

pub(crate) use large::{offered, take_shared, Large};

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
    /// The length of the encoding and how many of its strings go out of
    /// line, without encoding.
    fn encoded_size(&self) -> large::Sizing;
    /// Writes the encoding through `g`.
    fn encode_gather(&self, g: &mut Gather<'_, '_>) -> postcard::Result<()>;
    fn clone_box(&self) -> Box<dyn ErasedMsg>;
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<T: Message> ErasedMsg for T {
    fn encoded_size(&self) -> large::Sizing {
        let mut size = large::Sizing::default();
        postcard::serialize_with_flavor(self, &mut size).expect("sizing an encoding cannot fail");
        size
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
    /// Received from another node, or encoded here: `bytes[offset..]` is
    /// the postcard body's small fields, `large` its large strings out of
    /// line (none in a body encoded here), their bytes at the start of
    /// `bytes`.
    Wire {
        bytes: std::sync::Arc<Vec<u8>>,
        offset: usize,
        large: Vec<Large>,
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

    /// A body encoded here with plain postcard (a callback's value, a
    /// collection's init).
    pub(crate) fn encoded(bytes: Vec<u8>) -> Payload {
        Payload::Wire {
            bytes: std::sync::Arc::new(bytes),
            offset: 0,
            large: Vec::new(),
        }
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
            Payload::Wire {
                bytes,
                offset,
                large,
            } => large::decode_owned(bytes, offset, &large).map_err(|source| {
                DecodeError::Malformed {
                    expected: std::any::type_name::<M>(),
                    source,
                }
            }),
        }
    }

    /// A copy for one more recipient (broadcast fan-out). Wire bodies share their buffer.
    pub(crate) fn duplicate(&self) -> Payload {
        match self {
            Payload::Local(b) => Payload::Local(b.clone_box()),
            Payload::Wire {
                bytes,
                offset,
                large,
            } => Payload::Wire {
                bytes: bytes.clone(),
                offset: *offset,
                large: large.clone(),
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
    mut frame: Vec<u8>,
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
    let footer = large::read_footer(&frame).map_err(FrameRefused::Malformed)?;
    frame.truncate(footer.end);
    let (header, rest) = postcard::take_from_bytes::<WireHeader>(&frame[footer.total..])
        .map_err(FrameRefused::Malformed)?;
    let offset = frame.len() - rest.len();
    let large = footer.place(offset).map_err(FrameRefused::Malformed)?;
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
            large,
        },
    };
    Ok((rank, env))
}

/// A postcard flavor that writes a frame in pieces through a [`FrameWrite`]
/// (layout: [`large`]): each byte string of the body of [`large::GATHER_MIN`]
/// bytes or more written at once, straight from the value's memory; the
/// header and the small fields gathered into one buffer, written last with
/// the footer that says where the strings belong.
pub(crate) struct Gather<'a, 'w> {
    buf: Vec<u8>,
    write: &'a mut FrameWrite<'w>,
    error: Option<std::io::Error>,
    /// Where the body starts in `buf` (after the header); `None` while the
    /// header is written.
    body: Option<usize>,
    /// The strings written: their offsets among the body's small fields,
    /// their lengths.
    large: Vec<(usize, usize)>,
}

impl<'a, 'w> Gather<'a, 'w> {
    fn new(write: &'a mut FrameWrite<'w>) -> Self {
        Gather {
            buf: Vec::with_capacity(256),
            write,
            error: None,
            body: None,
            large: Vec::new(),
        }
    }
    /// Writes what is gathered and the footer; the io error that stopped
    /// the frame, if any.
    fn finish(mut self, r: postcard::Result<()>) -> std::io::Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        r.map_err(|e| std::io::Error::other(format!("encoding the message: {e}")))?;
        let strings: usize = self.large.iter().map(|&(_, len)| len).sum();
        let frame_len = strings + self.buf.len() + large::footer_len(self.large.len());
        large::write_footer(&mut self.buf, self.large.iter().copied(), frame_len);
        (self.write)(&[&self.buf])
    }
}

impl postcard::ser_flavors::Flavor for &mut Gather<'_, '_> {
    type Output = ();
    fn try_push(&mut self, b: u8) -> postcard::Result<()> {
        self.buf.push(b);
        Ok(())
    }
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        match self.body {
            Some(body) if large::out_of_line(data.len(), self.large.len()) => {
                self.large.push((self.buf.len() - body, data.len()));
                (self.write)(&[data]).map_err(|e| {
                    self.error = Some(e);
                    postcard::Error::SerializeBufferFull
                })
            }
            _ => {
                self.buf.extend_from_slice(data);
                Ok(())
            }
        }
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
        Payload::Local(b) => {
            let size = b.encoded_size();
            size.len + large::footer_len(size.large)
        }
        Payload::Wire {
            bytes,
            offset,
            large,
        } => bytes.len() - offset + strings_len(large) + large::footer_len(large.len()),
    }
}

/// The bytes of a received body's large strings, all together.
fn strings_len(large: &[Large]) -> usize {
    large.last().map_or(0, |l| l.from + l.len)
}

/// Writes the frame of an envelope leaving for PE `dest_pe` through
/// `write`, exactly [`frame_len`] bytes. Large byte strings of the body (a
/// [`Bulk`](crate::Bulk)'s contents) and the body of a wire payload sent on
/// go to `write` from their own memory.
pub(crate) fn write_frame(
    dest_pe: Pe,
    env: &Envelope,
    write: &mut FrameWrite<'_>,
) -> std::io::Result<()> {
    let header = wire_header(dest_pe, env);
    match &env.payload {
        Payload::Local(b) => {
            let mut g = Gather::new(write);
            let mut r = postcard::serialize_with_flavor(&header, &mut g);
            g.body = Some(g.buf.len());
            if r.is_ok() {
                r = b.encode_gather(&mut g);
            }
            g.finish(r)
        }
        // Sent on as it came: its strings first, then the new header and
        // its small fields.
        Payload::Wire {
            bytes,
            offset,
            large,
        } => {
            let strings = strings_len(large);
            if strings > 0 {
                write(&[&bytes[..strings]])?;
            }
            let head = postcard::to_allocvec(&header).map_err(std::io::Error::other)?;
            let mut footer = Vec::with_capacity(large::footer_len(large.len()));
            let frame_len =
                strings + head.len() + bytes.len() - offset + large::footer_len(large.len());
            large::write_footer(
                &mut footer,
                large.iter().map(|l| (l.at - offset, l.len)),
                frame_len,
            );
            write(&[&head, &bytes[*offset..], &footer])
        }
    }
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
    use super::large::GATHER_MIN;
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
        // A wire body sent on (broadcast forwarding) is written from its
        // buffer too: its large string, then its small fields.
        let frame = encode_frame(2, &env);
        let (_, got) = decode_frame(&topo(), Tag::new(0, 7, kind::ENVELOPE), frame).unwrap();
        let Payload::Wire { bytes, offset, .. } = &got.payload else {
            unreachable!()
        };
        let parts = pieces(3, &got);
        assert!(parts
            .iter()
            .any(|(a, p)| *a == bytes.as_ptr() as usize && p.len() == 50_000 * 8));
        let small = bytes[*offset..].as_ptr() as usize;
        assert!(parts
            .iter()
            .any(|(a, p)| *a == small && p.len() == bytes.len() - offset));
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

    fn received(env: &Envelope) -> Payload {
        let frame = encode_frame(3, env);
        decode_frame(&topo(), Tag::new(0, 7, kind::ENVELOPE), frame)
            .unwrap()
            .1
            .payload
    }

    /// The frame's allocation becomes the `Bulk<u8>` of a message whose one
    /// large string it is: received into the memory the chare keeps.
    #[test]
    fn a_received_bulk_of_bytes_is_the_frames_own_memory() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let env = Envelope {
            prio: 0,
            dest: Dest::System,
            payload: Payload::local((5u32, crate::Bulk(data.clone()), 9u64)),
            counted: false,
        };
        let payload = received(&env);
        let Payload::Wire { bytes, large, .. } = &payload else {
            unreachable!()
        };
        assert_eq!(large.len(), 1);
        assert_eq!(large[0].from, 0, "the string leads the frame");
        let frame = bytes.as_ptr() as usize;
        let (a, got, b) = payload.take::<(u32, crate::Bulk<u8>, u64)>().unwrap();
        assert_eq!((a, b), (5, 9));
        assert_eq!(got.as_ptr() as usize, frame, "no copy after the read");
        assert_eq!(got.0, data);
        // The same frame shared (a broadcast's fan-out): each copy reads its own.
        let payload = received(&env);
        let other = payload.duplicate();
        let got = payload.take::<(u32, crate::Bulk<u8>, u64)>().unwrap().1;
        assert_eq!(got.0, data);
        assert_eq!(
            other.take::<(u32, crate::Bulk<u8>, u64)>().unwrap().1 .0,
            data
        );
    }

    /// A large string read by something other than a `Bulk<u8>` (a
    /// `String`, a `Bulk<f64>`) is read whole all the same.
    #[test]
    fn a_large_string_not_for_a_byte_bulk_reads_whole() {
        let text: String = (0..6000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let env = Envelope {
            prio: 0,
            dest: Dest::System,
            payload: Payload::local((text.clone(), crate::Bulk::<u8>(Vec::new()), 1u8)),
            counted: false,
        };
        let got = received(&env)
            .take::<(String, crate::Bulk<u8>, u8)>()
            .unwrap();
        assert_eq!(got, (text, crate::Bulk(Vec::new()), 1));
        let row = crate::Bulk((0..1000).map(f64::from).collect::<Vec<f64>>());
        let env = Envelope {
            prio: 0,
            dest: Dest::System,
            payload: Payload::local(row.clone()),
            counted: false,
        };
        assert_eq!(received(&env).take::<crate::Bulk<f64>>().unwrap(), row);
    }

    /// Past the 255 strings a footer counts, the rest are gathered among
    /// the small fields, and the body reads back whole.
    #[test]
    fn strings_past_the_footers_count_are_gathered_inline() {
        let msg: Vec<crate::Bulk<u8>> = (0..300u32)
            .map(|k| crate::Bulk(vec![k as u8; GATHER_MIN]))
            .collect();
        let env = Envelope {
            prio: 0,
            dest: Dest::System,
            payload: Payload::local(msg.clone()),
            counted: false,
        };
        let frame = encode_frame(3, &env);
        assert_eq!(frame.len(), frame_len(3, &env));
        assert_eq!(*frame.last().unwrap(), 255);
        assert_eq!(received(&env).take::<Vec<crate::Bulk<u8>>>().unwrap(), msg);
    }

    /// A footer that does not fit its frame, or puts a string where none
    /// can be, is refused as malformed.
    #[test]
    fn a_footer_that_lies_is_refused() {
        let (env, _) = big_env(5000);
        let good = encode_frame(3, &env);
        let count = usize::from(*good.last().unwrap());
        assert_eq!(count, 2, "the row and the bytes");
        let entry = |i: usize| good.len() - 9 - (count - i) * 16;
        let mut lies = Vec::new();
        // More entries than the frame holds.
        let mut f = good.clone();
        *f.last_mut().unwrap() = 255;
        lies.push(f);
        // A string longer than the frame.
        let mut f = good.clone();
        f[entry(1) + 8..entry(1) + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        lies.push(f);
        // A string placed past the body's end.
        let mut f = good.clone();
        f[entry(1)..entry(1) + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        lies.push(f);
        // Out of order.
        let mut f = good.clone();
        f[entry(0)..entry(0) + 8].copy_from_slice(&1000u64.to_le_bytes());
        lies.push(f);
        // Too short to have gone out of line.
        let mut f = good.clone();
        f[entry(0) + 8..entry(0) + 16].copy_from_slice(&10u64.to_le_bytes());
        lies.push(f);
        for (i, f) in lies.into_iter().enumerate() {
            match decode_frame(&topo(), Tag::new(0, 7, kind::ENVELOPE), f) {
                Err(FrameRefused::Malformed(_)) => {}
                Err(e) => panic!("lie {i}: refused for another reason: {e}"),
                Ok((_, got)) => panic!(
                    "lie {i}: accepted, body {:?}",
                    got.payload.take::<Big>().map(|_| ())
                ),
            }
        }
        // A string the body never reaches is an error, not a silent loss.
        let mut f = good.clone();
        f[entry(1)..entry(1) + 8].copy_from_slice(&0u64.to_le_bytes());
        f[entry(0)..entry(0) + 8].copy_from_slice(&0u64.to_le_bytes());
        if let Ok((_, got)) = decode_frame(&topo(), Tag::new(0, 7, kind::ENVELOPE), f) {
            assert!(got.payload.take::<Big>().is_err());
        }
    }

    proptest! {
        /// Any mix of small and large strings round trips: written in
        /// pieces, decoded from the frame owned or shared, and sent on.
        #[test]
        fn bodies_round_trip_owned_shared_and_sent_on(
            sizes in proptest::collection::vec(
                prop_oneof![0usize..100, GATHER_MIN - 2..GATHER_MIN + 2, 5000usize..70_000], 0..5),
            text in 0usize..9000,
        ) {
            let msg: (Vec<crate::Bulk<u8>>, String) = (
                sizes.iter().enumerate().map(|(k, &n)| {
                    crate::Bulk((0..n).map(|i| (i * 7 + k) as u8).collect())
                }).collect(),
                "x".repeat(text),
            );
            let env = Envelope {
                prio: 1,
                dest: Dest::System,
                payload: Payload::local(msg.clone()),
                counted: true,
            };
            let frame: Vec<u8> = pieces(3, &env).into_iter().flat_map(|(_, p)| p).collect();
            prop_assert_eq!(frame.len(), frame_len(3, &env));
            let payload = received(&env);
            let forward = Envelope { payload: payload.duplicate(), ..env };
            let sent_on = encode_frame(2, &forward);
            prop_assert_eq!(sent_on.len(), frame_len(2, &forward));
            // Shared with `payload`, then `payload` alone (owned).
            prop_assert_eq!(&forward.payload.take::<(Vec<crate::Bulk<u8>>, String)>().unwrap(), &msg);
            prop_assert_eq!(&payload.take::<(Vec<crate::Bulk<u8>>, String)>().unwrap(), &msg);
            let (_, again) = decode_frame(&topo(), Tag::new(0, 7, kind::ENVELOPE), sent_on).unwrap();
            prop_assert_eq!(&again.payload.take::<(Vec<crate::Bulk<u8>>, String)>().unwrap(), &msg);
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
