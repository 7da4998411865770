//! Envelopes: how a message is addressed, queued, and (only when it leaves its
//! node) encoded.
//!
//! Inside a node an envelope carries the message value itself
//! ([`Payload::Local`]); it is serialised only when it crosses to another node,
//! into one frame: a postcard [`WireHeader`] followed by the postcard body.

use std::any::Any;

use serde::{Deserialize, Serialize};

use crate::chare::{IndexKey, Message};
use crate::topo::Pe;

/// Identifies a collection (array, group, nodegroup) job-wide. The upper 32
/// bits are the creating node's stable uid, the lower its creation counter,
/// so creation needs no coordination and ids survive renumbering.
pub type CollId = u64;

/// The main chare's collection id.
pub const MAIN_COLL: CollId = 1;

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
    /// The runtime itself.
    System,
}

/// A message value that can be encoded on demand and cloned for broadcasts.
pub(crate) trait ErasedMsg: Send {
    fn encode(&self) -> Vec<u8>;
    fn clone_box(&self) -> Box<dyn ErasedMsg>;
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<T: Message> ErasedMsg for T {
    fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("encoding into a Vec cannot fail")
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

    /// The encoded body, for sending to another node.
    pub(crate) fn body(&self) -> std::borrow::Cow<'_, [u8]> {
        match self {
            Payload::Local(b) => std::borrow::Cow::Owned(b.encode()),
            Payload::Wire { bytes, offset } => std::borrow::Cow::Borrowed(&bytes[*offset..]),
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
