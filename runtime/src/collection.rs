//! Per-PE storage of a collection's local members, behind a type-erased
//! [`Store`] so the scheduler can dispatch to any registered chare type.
//!
//! Arrays, groups and nodegroups share one store type: a group is an array
//! with one element per PE (index `()`), a nodegroup one per node. The store
//! also keeps what the runtime needs to know about its elements as a whole:
//! how many still owe a contribution to each reduction, how much time each
//! spent in entry methods (for load balancing), which broadcasts each has seen
//! (so an element that migrates neither misses nor repeats one), and which
//! elements asked to move or to be destroyed.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use crate::chare::{ArrayIndex, Chare, IndexKey};
use crate::ctx::Ctx;
use crate::msg::{CollId, DecodeError, Payload};
use crate::port::PeCtx;
use crate::system::{Departure, ElemMeta};

/// How many recent broadcasts a PE keeps per collection, to replay to
/// elements that migrate in having missed them.
const BROADCAST_LOG: usize = 256;

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
    /// A migrated element's state did not decode.
    #[error("migrated state of {0} did not decode: {1}")]
    State(&'static str, postcard::Error),
}

/// The type-erased face of a collection's local members.
pub(crate) trait Store: Send {
    fn has(&self, key: IndexKey) -> bool;
    /// Runs `payload` as an entry method of element `key` (which must be local).
    fn deliver(
        &mut self,
        key: IndexKey,
        payload: Payload,
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError>;
    /// Delivers broadcast number `seq` to every local element that has not run it, in index order.
    fn deliver_all(
        &mut self,
        seq: u64,
        payload: Payload,
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError>;
    /// Constructs element `key` from an encoded constructor argument.
    fn construct(
        &mut self,
        key: IndexKey,
        init: &[u8],
        red_start: u32,
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError>;
    /// Constructs an inserted element that runs the broadcasts numbered
    /// after `bcast_seen` (the root numbered that many when it took the
    /// insertion): those this PE already delivered are replayed to it.
    fn insert(
        &mut self,
        key: IndexKey,
        init: &[u8],
        red_start: u32,
        bcast_seen: u64,
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError>;
    /// Constructs this PE's share of a bulk range of `count` elements, block-mapped.
    fn construct_bulk(
        &mut self,
        dims: IndexKey,
        count: u64,
        init: &[u8],
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError>;
    /// Whether every local element has contributed to reduction `no` (true when empty).
    fn all_contributed(&self, no: u32) -> bool;
    /// Removes element `key` and encodes it for another PE.
    fn pack(&mut self, key: IndexKey) -> Option<(Vec<u8>, ElemMeta)>;
    /// Serialises a local element (and its bookkeeping) without moving it:
    /// a checkpoint. The state is appended to `buf` (a buffer kept from an
    /// earlier checkpoint costs no fresh memory).
    fn snapshot_into(&self, key: IndexKey, buf: &mut Vec<u8>) -> Option<ElemMeta>;
    /// [`Store::snapshot_into`] a new buffer.
    fn snapshot(&self, key: IndexKey) -> Option<(Vec<u8>, ElemMeta)> {
        let mut state = Vec::new();
        let meta = self.snapshot_into(key, &mut state)?;
        Some((state, meta))
    }
    /// Re-creates a migrated element here and replays broadcasts it missed.
    fn unpack(
        &mut self,
        key: IndexKey,
        state: &[u8],
        meta: ElemMeta,
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError>;
    /// `(key, load seconds)` of every local element; resets the loads when `reset`.
    fn loads(&mut self, reset: bool) -> Vec<(IndexKey, f64)>;
    /// Calls `resume_from_sync` on every local element waiting in `at_sync`.
    fn resume_all(&mut self, pe: &mut PeCtx<'_>);
    /// The local elements' keys and move counts (for rebuilding home tables).
    fn locals(&self) -> Vec<(IndexKey, u64)>;
    /// The next reduction number of the local element `key`.
    fn next_reduction(&self, key: IndexKey) -> Option<u32>;
    /// The last broadcast this PE delivered (a newcomer adopts the job's).
    fn last_broadcast(&self) -> u64;
    /// Sets where a newcomer's broadcast numbering starts.
    fn set_last_broadcast(&mut self, seq: u64);
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
    /// Recent broadcasts, oldest first, for elements that migrate in behind them.
    log: VecDeque<(u64, Payload)>,
    /// Sequence number of the last broadcast this PE delivered.
    last_bcast: u64,
}

pub(crate) fn make_store<C: Chare>(coll: CollId) -> Box<dyn Store> {
    Box::new(ArrayStore::<C> {
        coll,
        elems: BTreeMap::new(),
        owed: BTreeMap::new(),
        log: VecDeque::new(),
        last_bcast: 0,
    })
}

impl<C: Chare> ArrayStore<C> {
    fn index_of(key: IndexKey) -> Result<C::Index, StoreError> {
        C::Index::from_key(key).ok_or(StoreError::BadKey(key, C::NAME))
    }

    fn owe(&mut self, no: u32, delta: isize) {
        let e = self.owed.entry(no).or_insert(0);
        *e = e
            .checked_add_signed(delta)
            .expect("reduction bookkeeping underflow");
        if *e == 0 {
            self.owed.remove(&no);
        }
    }

    /// Runs `f` as an entry method of element `key`: measures it, applies the
    /// PE's emulated slowdown, and carries out a move or destruction it asked for.
    fn run(&mut self, key: IndexKey, pe: &mut PeCtx<'_>, f: impl FnOnce(&mut C, &mut Ctx<'_, C>)) {
        let slot = self
            .elems
            .get_mut(&key)
            .expect("caller checked the element is local");
        let before = slot.meta.next_red;
        let start = Instant::now();
        {
            let mut ctx = Ctx::new(pe, self.coll, slot.index, &mut slot.meta);
            f(&mut slot.chare, &mut ctx);
        }
        let spent = pe.charge(start.elapsed());
        slot.meta.load += spent.as_secs_f64();
        let after = slot.meta.next_red;
        if after != before {
            self.owe(before, -1);
            self.owe(after, 1);
        }
        let slot = &mut self.elems.get_mut(&key).expect("still here");
        if slot.meta.destroy {
            let next_red = slot.meta.next_red;
            self.elems.remove(&key);
            self.owe(next_red, -1);
            pe.depart(Departure::Destroyed {
                coll: self.coll,
                key,
                next_red,
            });
        } else if let Some(to) = slot.meta.migrate_to.take() {
            if to != pe.my_pe() {
                let (state, meta) = self.pack(key).expect("still here");
                pe.depart(Departure::Moved {
                    coll: self.coll,
                    key,
                    to,
                    state,
                    meta,
                });
            }
        }
    }

    /// Constructs element `key`, which has run the broadcasts up to `bcast_seen`.
    fn construct_seen(
        &mut self,
        key: IndexKey,
        init: &[u8],
        red_start: u32,
        bcast_seen: u64,
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError> {
        let index = Self::index_of(key)?;
        if self.elems.contains_key(&key) {
            return Err(StoreError::Duplicate(format!("{index:?}"), C::NAME));
        }
        let init: C::Init = Payload::encoded(init.to_vec()).take()?;
        let mut meta = ElemMeta {
            next_red: red_start,
            bcast_seen,
            ..ElemMeta::default()
        };
        let chare = {
            let mut ctx = Ctx::new(pe, self.coll, index, &mut meta);
            C::new(init, &mut ctx)
        };
        self.owe(meta.next_red, 1);
        self.elems.insert(key, Slot { chare, index, meta });
        pe.note_local_element(self.coll, key, 0);
        Ok(())
    }

    /// Runs on element `key` the broadcasts this PE delivered after number
    /// `seen` (one that arrived by migration or insertion after them).
    fn replay_missed(
        &mut self,
        key: IndexKey,
        seen: u64,
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError> {
        let missed: Vec<(u64, Payload)> = self
            .log
            .iter()
            .filter(|(s, _)| *s > seen)
            .map(|(s, p)| (*s, p.duplicate()))
            .collect();
        if let Some((oldest, _)) = self.log.front() {
            if seen + 1 < *oldest && self.last_bcast > seen {
                let index = self.elems.get(&key).map(|s| format!("{:?}", s.index));
                tracing::error!(
                    "{}[{}] missed broadcasts older than this PE keeps ({} kept)",
                    C::NAME,
                    index.unwrap_or_default(),
                    BROADCAST_LOG
                );
            }
        }
        for (seq, payload) in missed {
            let msg = payload.take::<C::Msg>()?;
            match self.elems.get_mut(&key) {
                Some(slot) => slot.meta.bcast_seen = seq,
                None => break,
            }
            self.run(key, pe, |c, ctx| c.handle(msg, ctx));
        }
        Ok(())
    }
}

impl<C: Chare> Store for ArrayStore<C> {
    fn has(&self, key: IndexKey) -> bool {
        self.elems.contains_key(&key)
    }

    fn deliver(
        &mut self,
        key: IndexKey,
        payload: Payload,
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError> {
        let msg = payload.take::<C::Msg>()?;
        self.run(key, pe, |c, ctx| c.handle(msg, ctx));
        Ok(())
    }

    fn deliver_all(
        &mut self,
        seq: u64,
        payload: Payload,
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError> {
        let msg = payload.duplicate().take::<C::Msg>()?;
        self.last_bcast = self.last_bcast.max(seq);
        if self.log.len() == BROADCAST_LOG {
            self.log.pop_front();
        }
        self.log.push_back((seq, payload));
        let keys: Vec<IndexKey> = self.elems.keys().copied().collect();
        for key in keys {
            // An earlier delivery may have destroyed or moved this element; an
            // element that migrated in may have run this broadcast elsewhere.
            match self.elems.get_mut(&key) {
                Some(slot) if slot.meta.bcast_seen < seq => slot.meta.bcast_seen = seq,
                _ => continue,
            }
            let m = msg.clone();
            self.run(key, pe, |c, ctx| c.handle(m, ctx));
        }
        Ok(())
    }

    fn construct(
        &mut self,
        key: IndexKey,
        init: &[u8],
        red_start: u32,
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError> {
        let seen = self.last_bcast;
        self.construct_seen(key, init, red_start, seen, pe)
    }

    fn insert(
        &mut self,
        key: IndexKey,
        init: &[u8],
        red_start: u32,
        bcast_seen: u64,
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError> {
        self.construct_seen(key, init, red_start, bcast_seen, pe)?;
        self.replay_missed(key, bcast_seen, pe)
    }

    fn construct_bulk(
        &mut self,
        dims: IndexKey,
        count: u64,
        init: &[u8],
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError> {
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

    fn pack(&mut self, key: IndexKey) -> Option<(Vec<u8>, ElemMeta)> {
        let mut slot = self.elems.remove(&key)?;
        self.owe(slot.meta.next_red, -1);
        slot.meta.hops += 1;
        let state = postcard::to_allocvec(&slot.chare).expect("encoding into a Vec cannot fail");
        Some((state, slot.meta))
    }

    fn snapshot_into(&self, key: IndexKey, buf: &mut Vec<u8>) -> Option<ElemMeta> {
        let slot = self.elems.get(&key)?;
        postcard::to_io(&slot.chare, &mut *buf).expect("encoding into a Vec cannot fail");
        Some(slot.meta.clone())
    }

    fn unpack(
        &mut self,
        key: IndexKey,
        state: &[u8],
        meta: ElemMeta,
        pe: &mut PeCtx<'_>,
    ) -> Result<(), StoreError> {
        let index = Self::index_of(key)?;
        if self.elems.contains_key(&key) {
            return Err(StoreError::Duplicate(format!("{index:?}"), C::NAME));
        }
        let chare: C = postcard::from_bytes(state).map_err(|e| StoreError::State(C::NAME, e))?;
        let (seen, hops) = (meta.bcast_seen, meta.hops);
        self.owe(meta.next_red, 1);
        self.elems.insert(key, Slot { chare, index, meta });
        pe.note_local_element(self.coll, key, hops);
        // Broadcasts this PE delivered after the element left its old PE.
        self.replay_missed(key, seen, pe)
    }

    fn loads(&mut self, reset: bool) -> Vec<(IndexKey, f64)> {
        self.elems
            .iter_mut()
            .map(|(k, s)| {
                let l = if s.meta.unmeasured { 0.0 } else { s.meta.load };
                if reset {
                    s.meta.load = 0.0;
                    s.meta.unmeasured = false;
                }
                (*k, l)
            })
            .collect()
    }

    fn locals(&self) -> Vec<(IndexKey, u64)> {
        self.elems.iter().map(|(k, s)| (*k, s.meta.hops)).collect()
    }

    fn next_reduction(&self, key: IndexKey) -> Option<u32> {
        self.elems.get(&key).map(|s| s.meta.next_red)
    }

    fn last_broadcast(&self) -> u64 {
        self.last_bcast
    }

    fn set_last_broadcast(&mut self, seq: u64) {
        self.last_bcast = seq;
    }

    fn resume_all(&mut self, pe: &mut PeCtx<'_>) {
        let keys: Vec<IndexKey> = self
            .elems
            .iter()
            .filter(|(_, s)| s.meta.at_sync)
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            if let Some(slot) = self.elems.get_mut(&key) {
                slot.meta.at_sync = false;
            } else {
                continue;
            }
            self.run(key, pe, |c, ctx| c.resume_from_sync(ctx));
        }
    }
}
