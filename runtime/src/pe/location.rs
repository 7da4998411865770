//! Location management: which collections exist here, where each element
//! is, the home tables, messages waiting for a creation or an insertion,
//! and creation, insertion and migration.
//!
//! An element's home PE is computed from the topology (the block map of its
//! position, or a hash of its key). Each PE keeps a location cache; a home
//! keeps where the elements it is home for live. A message goes to the
//! cached PE or the home; the home forwards it and tells the sender where
//! the element is.

use tracing::error;

use super::{misrouted, PeState, Scheduler};
use crate::msg::{CollId, Dest, Envelope, IdMap, IndexKey, MAIN_COLL};
use crate::node::NodeShared;
use crate::registry::LinearFn;
use crate::system::{CreateSpec, Departure, ElemMeta, Shape, SysMsg};
use crate::topo::Pe as PeId;

/// What every PE knows of a collection.
pub(super) struct CollInfo {
    pub(super) shape: Shape,
    pub(super) linear: LinearFn,
}

/// A PE's location tables.
pub(super) struct Locations {
    /// The collections created here (or by this PE), by id.
    pub(super) colls: IdMap<CollId, CollInfo>,
    /// Messages for collections not created here yet.
    pub(super) unknown: IdMap<CollId, Vec<Envelope>>,
    /// Where an element is (or was last sent): `(PE, its move count there)`.
    /// Entries only ever move to a higher move count, so following them
    /// always ends at the element (see [`PeState::learn`]).
    pub(super) cache: IdMap<(CollId, IndexKey), (PeId, u64)>,
    /// For elements whose home is this PE: where they live, by move count.
    pub(super) homes: IdMap<(CollId, IndexKey), (PeId, u64)>,
    /// At the home: messages for elements not inserted yet.
    pub(super) waiting: IdMap<(CollId, IndexKey), Vec<Envelope>>,
    /// Elements that left this PE in the last handler (moved or destroyed).
    pub(super) departures: Vec<Departure>,
    /// Root: broadcast sequence numbers, by collection.
    pub(super) next_bcast: IdMap<CollId, u64>,
    /// Root: every collection's creation, in order (newcomers adopt them).
    pub(super) specs: Vec<CreateSpec>,
}

impl Locations {
    /// Every PE knows the main chare's collection: one element, on PE 0.
    pub(super) fn new(node: &NodeShared, _pe: PeId) -> Self {
        let mut colls = IdMap::default();
        if let Some(main) = node
            .registry
            .main_type
            .and_then(|t| node.registry.chares.get(&t))
        {
            colls.insert(
                MAIN_COLL,
                CollInfo {
                    shape: Shape::Array {
                        dims: Some(0),
                        count: 1,
                    },
                    linear: main.linear,
                },
            );
        }
        Locations {
            colls,
            unknown: IdMap::default(),
            cache: IdMap::default(),
            homes: IdMap::default(),
            waiting: IdMap::default(),
            departures: Vec::new(),
            next_bcast: IdMap::default(),
            specs: Vec::new(),
        }
    }
}

impl PeState {
    /// Records that element `key` is on `pe` after `hops` moves, unless a
    /// newer location is known. Forwarding follows these entries, and since
    /// a PE's entry only changes to a later location, a message can never
    /// cycle between stale ones.
    pub(crate) fn learn(&mut self, coll: CollId, key: IndexKey, pe: PeId, hops: u64) {
        let e = self.loc.cache.entry((coll, key)).or_insert((pe, hops));
        if hops >= e.1 {
            *e = (pe, hops);
        }
    }

    /// Sends a packed element to PE `to` and remembers where it went.
    pub(crate) fn send_migrant(
        &mut self,
        coll: CollId,
        key: IndexKey,
        to: PeId,
        state: Vec<u8>,
        meta: ElemMeta,
        lb_step: Option<u64>,
    ) {
        self.learn(coll, key, to, meta.hops);
        self.send_sys(
            to,
            SysMsg::Migrate {
                coll,
                key,
                // One byte string, sent from its own memory.
                state: crate::Bulk(state),
                meta,
                lb_step,
            },
        );
    }

    pub(super) fn home_of(&self, coll: CollId, key: IndexKey) -> Option<PeId> {
        let info = self.loc.colls.get(&coll)?;
        Some(match &info.shape {
            Shape::Array {
                dims: Some(dims),
                count,
            } => match (info.linear)(key, *dims) {
                Some(lin) => self.topo.block_home(lin, *count),
                None => self.topo.hash_home(key),
            },
            _ => self.topo.hash_home(key),
        })
    }

    pub(super) fn locate(&self, coll: CollId, key: IndexKey) -> Option<PeId> {
        self.loc
            .cache
            .get(&(coll, key))
            .map(|&(pe, _)| pe)
            .or_else(|| self.home_of(coll, key))
    }
}

impl Scheduler {
    pub(super) fn route_element(&mut self, coll: CollId, key: IndexKey, src: PeId, env: Envelope) {
        if !self.ctx.loc.colls.contains_key(&coll) {
            self.ctx.hold_for_creation(coll, env);
            return;
        }
        if let Some(store) = self.stores.get_mut(&coll) {
            if store.has(key) {
                if let Err(e) = store.deliver(key, env.payload, &mut self.ctx) {
                    error!(
                        pe = self.ctx.pe,
                        "dropping message for {}[{key:#x}]: {e}",
                        self.coll_name(coll)
                    );
                }
                return;
            }
        }
        let me = self.ctx.pe;
        let home = self.ctx.home_of(coll, key).expect("collection is known");
        // The newest location known here: the home's table, or where the
        // element went when it last left this PE.
        let known = match (
            self.ctx.loc.homes.get(&(coll, key)),
            self.ctx.loc.cache.get(&(coll, key)),
        ) {
            (Some(&h), Some(&c)) => Some(if c.1 > h.1 { c } else { h }),
            (h, c) => h.or(c).copied(),
        };
        let target = match known {
            Some((pe, hops)) if pe != me => {
                if home == me && src != me && src != pe {
                    self.ctx.send_sys(
                        src,
                        SysMsg::LocationHint {
                            coll,
                            key,
                            pe,
                            hops,
                        },
                    );
                }
                pe
            }
            // Not inserted yet (or gone): wait here, the home, for its insertion.
            _ if home == me => {
                self.ctx
                    .loc
                    .waiting
                    .entry((coll, key))
                    .or_default()
                    .push(Envelope {
                        counted: false,
                        ..env
                    });
                return;
            }
            _ => home,
        };
        self.ctx.send_env(target, env);
    }

    pub(super) fn deliver_member(&mut self, coll: CollId, env: Envelope) {
        if !self.ctx.loc.colls.contains_key(&coll) {
            self.ctx.hold_for_creation(coll, env);
            return;
        }
        let me = self.ctx.pe;
        match self.stores.get_mut(&coll) {
            Some(store) if store.has(0) => {
                if let Err(e) = store.deliver(0, env.payload, &mut self.ctx) {
                    error!(
                        pe = me,
                        "dropping message for {}: {e}",
                        self.coll_name(coll)
                    );
                }
            }
            _ => error!(
                pe = me,
                "dropping message for {}: it has no member on PE {me}",
                self.coll_name(coll)
            ),
        }
    }

    pub(super) fn deliver_broadcast(
        &mut self,
        coll: CollId,
        seq: u64,
        env: Envelope,
        forward: bool,
    ) {
        if !self.ctx.loc.colls.contains_key(&coll) {
            self.ctx.hold_for_creation(coll, env);
            return;
        }
        let seq = if seq == 0 {
            // The root numbers the collection's broadcasts, so every PE sees them in one order.
            let n = self.ctx.loc.next_bcast.entry(coll).or_insert(0);
            *n += 1;
            *n
        } else {
            seq
        };
        let children = if forward {
            self.ctx.topo.children(self.ctx.pe)
        } else {
            Vec::new()
        };
        for child in children {
            let dest = Dest::Broadcast { coll, seq };
            let copy = Envelope {
                prio: env.prio,
                dest,
                payload: env.payload.duplicate(),
                counted: true,
            };
            self.ctx.send_env(child, copy);
        }
        if let Some(store) = self.stores.get_mut(&coll) {
            {
                if let Err(e) = store.deliver_all(seq, env.payload, &mut self.ctx) {
                    error!(
                        pe = self.ctx.pe,
                        "dropping broadcast to {}: {e}",
                        self.coll_name(coll)
                    );
                }
            }
        }
    }

    pub(super) fn create(&mut self, spec: CreateSpec) {
        self.create_as(spec, None);
    }

    /// Creates a collection's local part. `adopted`: a newcomer adopting a
    /// collection created before it joined, with the job's last broadcast
    /// and the first reduction new members join; arrays are then not
    /// constructed again (their elements exist elsewhere).
    pub(super) fn create_as(&mut self, spec: CreateSpec, adopted: Option<(u64, u32, bool)>) {
        if self.ctx.pe == 0 && adopted.is_none() {
            self.ctx.loc.specs.push(spec.clone());
        }
        let reg = self.ctx.node.registry.clone();
        let Some(entry) = reg.chares.get(&spec.type_id) else {
            error!(
                pe = self.ctx.pe,
                "cannot create collection of unregistered chare type {:#x}", spec.type_id
            );
            return;
        };
        let coll = spec.coll;
        self.ctx.loc.colls.insert(
            coll,
            CollInfo {
                shape: spec.shape.clone(),
                linear: entry.linear,
            },
        );
        let mut store = (entry.make)(coll);
        let topo = self.ctx.topo.clone();
        let me = self.ctx.pe;
        let red_start = adopted.map_or(0, |(_, r, _)| r);
        // A restore brings this PE's saved member instead.
        let skip_members = adopted.is_some_and(|(_, _, skip)| skip);
        let (result, base) = match spec.shape {
            Shape::Array { .. } if adopted.is_some() => (Ok(()), 0),
            Shape::Array {
                dims: Some(dims),
                count,
            } => (
                store.construct_bulk(dims, count, &spec.init, &mut self.ctx),
                count,
            ),
            Shape::Array { dims: None, .. } => (Ok(()), 0),
            Shape::Group if skip_members => (Ok(()), topo.num_pes() as u64),
            Shape::Group => (
                store.construct(0, &spec.init, red_start, &mut self.ctx),
                topo.num_pes() as u64,
            ),
            Shape::NodeGroup => {
                let r = if topo.first_pe(topo.my_node()) == me && !skip_members {
                    store.construct(0, &spec.init, red_start, &mut self.ctx)
                } else {
                    Ok(())
                };
                (r, topo.num_nodes() as u64)
            }
        };
        if let Err(e) = result {
            error!(pe = me, "creating {} failed: {e}", entry.name);
        }
        if let Some((last_bcast, _, _)) = adopted {
            store.set_last_broadcast(last_bcast);
        }
        self.stores.insert(coll, store);
        if me == 0 && adopted.is_none() {
            self.ctx
                .red
                .populations
                .insert(coll, super::reduction::Population::new(base));
        }
        if let Some(held) = self.ctx.loc.unknown.remove(&coll) {
            for env in held {
                self.ctx.release(me, env);
            }
        }
    }

    /// The location service's runtime messages.
    pub(super) fn on_location(&mut self, msg: SysMsg) {
        let me = self.ctx.pe;
        match msg {
            SysMsg::Create(spec) => self.create(spec),
            SysMsg::InsertRequest {
                coll,
                key,
                init,
                on,
            } => {
                // Root: the element joins the reductions still open, and
                // the broadcasts numbered from now on (in the order the
                // root takes them: an insertion and then a broadcast sent
                // by one chare reach the element in that order).
                let red_start = self.ctx.red.insertion(coll);
                let bcast_seen = self.ctx.loc.next_bcast.get(&coll).copied().unwrap_or(0);
                let target = on
                    .or_else(|| self.ctx.home_of(coll, key))
                    .expect("collection is known on PE 0");
                self.ctx.send_sys(
                    target,
                    SysMsg::Insert {
                        coll,
                        key,
                        init,
                        red_start,
                        bcast_seen,
                    },
                );
            }
            SysMsg::Insert {
                coll,
                key,
                init,
                red_start,
                bcast_seen,
            } => {
                let store = self.stores.get_mut(&coll).expect("held until created");
                let built = store.insert(key, &init, red_start, bcast_seen, &mut self.ctx);
                if let Err(e) = built {
                    error!(
                        pe = me,
                        "insertion into {} failed: {e}",
                        self.coll_name(coll)
                    );
                }
            }
            SysMsg::HomeUpdate {
                coll,
                key,
                pe,
                hops,
            } => {
                let e = self.ctx.loc.homes.entry((coll, key)).or_insert((pe, hops));
                if hops >= e.1 {
                    *e = (pe, hops);
                }
                if let Some(held) = self.ctx.loc.waiting.remove(&(coll, key)) {
                    for env in held {
                        self.ctx.release(me, env);
                    }
                }
            }
            SysMsg::LocationHint {
                coll,
                key,
                pe,
                hops,
            } => {
                if self.stores.get(&coll).is_none_or(|s| !s.has(key)) {
                    self.ctx.learn(coll, key, pe, hops);
                }
            }
            SysMsg::Migrate {
                coll,
                key,
                state,
                meta,
                lb_step,
            } => {
                let store = self.stores.get_mut(&coll).expect("held until created");
                if let Err(e) = store.unpack(key, &state, meta, &mut self.ctx) {
                    error!(
                        pe = me,
                        "a migrated element of {} was lost: {e}",
                        self.coll_name(coll)
                    );
                }
                if let Some(step) = lb_step {
                    self.lb_received(coll, step);
                }
            }
            other => misrouted(me, "location", &other),
        }
    }
}
