//! Per-PE storage of a collection's local members, behind a type-erased
//! [`Store`] so the scheduler can dispatch to any registered chare type.
//!
//! Arrays, groups and nodegroups share one store type: a group is an array
//! with one element per PE (index `()`), a nodegroup one per node. The store
//! also tracks, for reductions, how many local elements still owe a
//! contribution to each reduction number.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::chare::{ArrayIndex, Chare, IndexKey};
use crate::ctx::Ctx;
use crate::msg::{CollId, DecodeError, Payload};
use crate::pe::PeCtx;

/// Runtime bookkeeping that travels with an element.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct ElemMeta {
    /// The reduction number of this element's next contribution.
    pub next_red: u32,
}

struct Slot<C: Chare> {
    chare: C,
    index: C::Index,
    meta: ElemMeta,
}

/// Why a store refused an operation.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A message body or constructor argument did not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A key that is not an index of this array's type.
    #[error("key {0:#x} is not an index of {1}")]
    BadKey(IndexKey, &'static str),
    /// Insertion of an index that already exists here.
    #[error("element {0} of {1} already exists")]
    Duplicate(String, &'static str),
}

/// The type-erased face of a collection's local members.
pub(crate) trait Store: Send {
    fn has(&self, key: IndexKey) -> bool;
    fn len(&self) -> usize;
    /// Runs `payload` as an entry method of element `key` (which must be local).
    fn deliver(&mut self, key: IndexKey, payload: Payload, pe: &mut PeCtx) -> Result<(), StoreError>;
    /// Delivers a copy of `payload` to every local element, in index order.
    fn deliver_all(&mut self, payload: Payload, pe: &mut PeCtx) -> Result<(), StoreError>;
    /// Constructs element `key` from an encoded constructor argument.
    fn construct(&mut self, key: IndexKey, init: &[u8], red_start: u32, pe: &mut PeCtx) -> Result<(), StoreError>;
    /// Constructs this PE's share of a bulk range of `count` elements, block-mapped.
    fn construct_bulk(&mut self, dims: IndexKey, count: u64, init: &[u8], pe: &mut PeCtx) -> Result<(), StoreError>;
    /// Whether every local element has contributed to reduction `no` (true when empty).
    fn all_contributed(&self, no: u32) -> bool;
}

/// Row-major position of `key` in the bulk range `dims`, for the block map.
pub(crate) fn linear_of<I: ArrayIndex>(key: IndexKey, dims: IndexKey) -> Option<u64> {
    I::from_key(key)?.linear(&I::from_key(dims)?)
}

/// Local members of one collection of chare type `C`.
pub(crate) struct ArrayStore<C: Chare> {
    coll: CollId,
    elems: BTreeMap<IndexKey, Slot<C>>,
    /// Number of local elements whose next contribution is to reduction `k`.
    owed: BTreeMap<u32, usize>,
}

pub(crate) fn make_store<C: Chare>(coll: CollId) -> Box<dyn Store> {
    Box::new(ArrayStore::<C> { coll, elems: BTreeMap::new(), owed: BTreeMap::new() })
}

impl<C: Chare> ArrayStore<C> {
    fn index_of(key: IndexKey) -> Result<C::Index, StoreError> {
        C::Index::from_key(key).ok_or(StoreError::BadKey(key, C::NAME))
    }

    fn owe(&mut self, no: u32, delta: isize) {
        let e = self.owed.entry(no).or_insert(0);
        *e = e.checked_add_signed(delta).expect("reduction bookkeeping underflow");
        if *e == 0 {
            self.owed.remove(&no);
        }
    }

    fn run(&mut self, key: IndexKey, msg: C::Msg, pe: &mut PeCtx) {
        let slot = self.elems.get_mut(&key).expect("caller checked the element is local");
        let before = slot.meta.next_red;
        {
            let mut ctx = Ctx::new(pe, self.coll, slot.index, &mut slot.meta);
            slot.chare.handle(msg, &mut ctx);
        }
        let after = slot.meta.next_red;
        if after != before {
            self.owe(before, -1);
            self.owe(after, 1);
        }
    }
}

impl<C: Chare> Store for ArrayStore<C> {
    fn has(&self, key: IndexKey) -> bool {
        self.elems.contains_key(&key)
    }

    fn len(&self) -> usize {
        self.elems.len()
    }

    fn deliver(&mut self, key: IndexKey, payload: Payload, pe: &mut PeCtx) -> Result<(), StoreError> {
        let msg = payload.take::<C::Msg>()?;
        self.run(key, msg, pe);
        Ok(())
    }

    fn deliver_all(&mut self, payload: Payload, pe: &mut PeCtx) -> Result<(), StoreError> {
        let msg = payload.take::<C::Msg>()?;
        let keys: Vec<IndexKey> = self.elems.keys().copied().collect();
        for key in keys {
            // An earlier delivery may have destroyed or moved this element.
            if self.elems.contains_key(&key) {
                self.run(key, msg.clone(), pe);
            }
        }
        Ok(())
    }

    fn construct(&mut self, key: IndexKey, init: &[u8], red_start: u32, pe: &mut PeCtx) -> Result<(), StoreError> {
        let index = Self::index_of(key)?;
        if self.elems.contains_key(&key) {
            return Err(StoreError::Duplicate(format!("{index:?}"), C::NAME));
        }
        let init: C::Init = Payload::Wire { bytes: std::sync::Arc::new(init.to_vec()), offset: 0 }.take()?;
        let mut meta = ElemMeta { next_red: red_start };
        let chare = {
            let mut ctx = Ctx::new(pe, self.coll, index, &mut meta);
            C::new(init, &mut ctx)
        };
        self.owe(meta.next_red, 1);
        self.elems.insert(key, Slot { chare, index, meta });
        pe.note_local_element(self.coll, key);
        Ok(())
    }

    fn construct_bulk(&mut self, dims: IndexKey, count: u64, init: &[u8], pe: &mut PeCtx) -> Result<(), StoreError> {
        let dims_ix = Self::index_of(dims)?;
        let (me, npes) = (pe.my_pe() as u128, pe.num_pes() as u128);
        let total = count as u128;
        // The block map sends position `lin` to PE floor(lin * npes / total).
        let lo = (me * total).div_ceil(npes) as u64;
        let hi = ((me + 1) * total).div_ceil(npes) as u64;
        for lin in lo..hi {
            let key = C::Index::from_linear(lin, &dims_ix).to_key();
            self.construct(key, init, 0, pe)?;
        }
        Ok(())
    }

    fn all_contributed(&self, no: u32) -> bool {
        self.owed.range(..=no).next().is_none()
    }
}
