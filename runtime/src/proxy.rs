//! Typed proxies: the handles through which chares are created and messaged.
//!
//! A proxy is a collection id and a type; it is `Copy` and serialisable, so
//! it can be kept in chare state and sent in messages. All sends are
//! asynchronous and return at once.

use std::marker::PhantomData;

use serde::{Deserialize, Serialize};

use crate::chare::{ArrayIndex, BulkIndex, Chare};
use crate::ids::fnv1a;
use crate::msg::{CollId, Payload};
use crate::port::PeCtx;
use crate::system::Shape;
use crate::topo::Pe;

macro_rules! proxy_common {
    ($name:ident) => {
        impl<C: Chare> Clone for $name<C> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<C: Chare> Copy for $name<C> {}
        impl<C: Chare> PartialEq for $name<C> {
            fn eq(&self, other: &Self) -> bool {
                self.coll == other.coll
            }
        }
        impl<C: Chare> Eq for $name<C> {}
        impl<C: Chare> std::fmt::Debug for $name<C> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}<{}>({:#x})", stringify!($name), C::NAME, self.coll)
            }
        }
        impl<C: Chare> $name<C> {
            pub(crate) fn from_id(coll: CollId) -> Self {
                $name {
                    coll,
                    _c: PhantomData,
                }
            }
            /// The collection's job-wide id.
            pub fn id(&self) -> CollId {
                self.coll
            }
        }
    };
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).expect("encoding into a Vec cannot fail")
}

/// A chare array.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct ArrayProxy<C: Chare> {
    pub(crate) coll: CollId,
    #[serde(skip)]
    _c: PhantomData<fn() -> C>,
}
proxy_common!(ArrayProxy);

impl<C: Chare> ArrayProxy<C> {
    /// Creates an array with every index of the range `dims`, block-mapped over
    /// the PEs, each element constructed with a copy of `init`.
    pub fn create(ctx: &mut PeCtx<'_>, dims: C::Index, init: C::Init) -> Self
    where
        C::Index: BulkIndex,
    {
        let shape = Shape::Array {
            dims: Some(dims.to_key()),
            count: C::Index::count(&dims),
        };
        Self::from_id(ctx.create_collection(fnv1a(C::NAME.as_bytes()), shape, encode(&init)))
    }

    /// Creates an empty array that grows with [`ArrayProxy::insert`].
    pub fn create_empty(ctx: &mut PeCtx<'_>) -> Self {
        let shape = Shape::Array {
            dims: None,
            count: 0,
        };
        Self::from_id(ctx.create_collection(fnv1a(C::NAME.as_bytes()), shape, Vec::new()))
    }

    /// Inserts element `index` on its home PE. Messages sent to it before it
    /// exists wait at the home PE.
    pub fn insert(&self, ctx: &mut PeCtx<'_>, index: C::Index, init: C::Init) {
        ctx.insert(self.coll, index.to_key(), encode(&init), None);
    }

    /// Inserts element `index` on PE `pe`.
    pub fn insert_on(&self, ctx: &mut PeCtx<'_>, index: C::Index, pe: Pe, init: C::Init) {
        ctx.insert(self.coll, index.to_key(), encode(&init), Some(pe));
    }

    /// The proxy of one element.
    pub fn elem(&self, index: C::Index) -> ElementProxy<C> {
        ElementProxy {
            coll: self.coll,
            index,
        }
    }

    /// Sends `msg` to every element.
    pub fn broadcast(&self, ctx: &mut PeCtx<'_>, msg: C::Msg) {
        ctx.broadcast(self.coll, 0, Payload::local(msg));
    }
}

/// One element of a chare array.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct ElementProxy<C: Chare> {
    pub(crate) coll: CollId,
    pub(crate) index: C::Index,
}

impl<C: Chare> Clone for ElementProxy<C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C: Chare> Copy for ElementProxy<C> {}
impl<C: Chare> std::fmt::Debug for ElementProxy<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{:?}]", C::NAME, self.index)
    }
}

impl<C: Chare> ElementProxy<C> {
    /// Sends `msg` (priority 0).
    pub fn send(&self, ctx: &mut PeCtx<'_>, msg: C::Msg) {
        self.send_prio(ctx, msg, 0);
    }

    /// Sends `msg` with priority `prio`: among queued messages, lower runs first.
    pub fn send_prio(&self, ctx: &mut PeCtx<'_>, msg: C::Msg, prio: i32) {
        ctx.send_element(self.coll, self.index.to_key(), prio, Payload::local(msg));
    }

    /// The element's index.
    pub fn index(&self) -> C::Index {
        self.index
    }
}

/// A group: one member per PE.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct GroupProxy<C: Chare> {
    pub(crate) coll: CollId,
    #[serde(skip)]
    _c: PhantomData<fn() -> C>,
}
proxy_common!(GroupProxy);

impl<C: Chare<Index = ()>> GroupProxy<C> {
    /// Creates the group; every PE constructs its member from a copy of `init`.
    pub fn create(ctx: &mut PeCtx<'_>, init: C::Init) -> Self {
        Self::from_id(ctx.create_collection(fnv1a(C::NAME.as_bytes()), Shape::Group, encode(&init)))
    }

    /// Sends `msg` to the member on `pe`.
    pub fn send(&self, ctx: &mut PeCtx<'_>, pe: Pe, msg: C::Msg) {
        ctx.send_member(self.coll, pe, 0, Payload::local(msg));
    }

    /// Sends `msg` to every member.
    pub fn broadcast(&self, ctx: &mut PeCtx<'_>, msg: C::Msg) {
        ctx.broadcast(self.coll, 0, Payload::local(msg));
    }
}

/// A nodegroup: one member per node, living on the node's first PE.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct NodeGroupProxy<C: Chare> {
    pub(crate) coll: CollId,
    #[serde(skip)]
    _c: PhantomData<fn() -> C>,
}
proxy_common!(NodeGroupProxy);

impl<C: Chare<Index = ()>> NodeGroupProxy<C> {
    /// Creates the nodegroup; every node constructs its member from a copy of `init`.
    pub fn create(ctx: &mut PeCtx<'_>, init: C::Init) -> Self {
        Self::from_id(ctx.create_collection(
            fnv1a(C::NAME.as_bytes()),
            Shape::NodeGroup,
            encode(&init),
        ))
    }

    /// Sends `msg` to the member of node `node`.
    pub fn send(&self, ctx: &mut PeCtx<'_>, node: u32, msg: C::Msg) {
        let pe = ctx.topology().first_pe(node);
        ctx.send_member(self.coll, pe, 0, Payload::local(msg));
    }

    /// Sends `msg` to every member.
    pub fn broadcast(&self, ctx: &mut PeCtx<'_>, msg: C::Msg) {
        ctx.broadcast(self.coll, 0, Payload::local(msg));
    }
}

/// The main chare, as an element proxy (it lives on PE 0).
pub fn main_chare<M: Chare<Index = ()>>() -> ElementProxy<M> {
    ElementProxy {
        coll: crate::msg::MAIN_COLL,
        index: (),
    }
}
