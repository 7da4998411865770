//! Reductions and populations.
//!
//! Each element carries the number of its next contribution, and each store
//! counts how many local elements still owe each reduction. A PE merges
//! contributions and its children's partial results for reduction *k* and
//! sends them up the spanning tree once none of its local elements owes *k*.
//! PE 0 completes *k* when the contributions it counted equal the
//! collection's population at *k* (the bulk size plus insertions minus
//! destructions), and delivers results in reduction order.

use std::collections::{BTreeMap, HashMap};

use tracing::error;

use super::{misrouted, PeState, Scheduler};
use crate::msg::{CallbackSpec, CollId, Payload, Target, MAIN_COLL};
use crate::reduce::{combine, Reducer, Value};
use crate::system::{Partial, SysMsg};
use crate::topo::Pe as PeId;

/// Per-collection membership bookkeeping on the reduction root (PE 0).
pub(super) struct Population {
    pub(super) base: u64,
    /// Insertions: how many elements joined from each reduction number on.
    pub(super) births: BTreeMap<u32, i64>,
    /// The lowest reduction number whose result has not been delivered.
    pub(super) next_open: u32,
    /// Results complete but waiting for an earlier reduction (delivered in order).
    pub(super) done: BTreeMap<u32, (Value, CallbackSpec)>,
}

impl Population {
    /// A collection of `base` members, before its first reduction.
    pub(super) fn new(base: u64) -> Self {
        Population {
            base,
            births: BTreeMap::new(),
            next_open: 0,
            done: BTreeMap::new(),
        }
    }

    /// How many contributions reduction `no` needs.
    pub(super) fn expected(&self, no: u32) -> u64 {
        (self.base as i64 + self.births.range(..=no).map(|(_, n)| n).sum::<i64>()).max(0) as u64
    }
}

/// A reduction's contributions merged so far on this PE.
pub(super) struct Gathered {
    pub(super) value: Option<Value>,
    pub(super) count: u64,
    pub(super) reducer: Reducer,
    pub(super) callback: CallbackSpec,
    pub(super) failed: bool,
}

/// A PE's reductions in progress, and the root's populations.
pub(super) struct Reductions {
    /// Partial results by (collection, reduction number).
    pub(super) gathered: HashMap<(CollId, u32), Gathered>,
    /// Root: every collection's population.
    pub(super) populations: HashMap<CollId, Population>,
    /// Contributions the last handler made.
    pub(super) contributions: Vec<Partial>,
}

impl Reductions {
    /// PE 0 counts main's one element from the start.
    pub(super) fn new(pe: PeId) -> Self {
        let mut populations = HashMap::new();
        if pe == 0 {
            populations.insert(MAIN_COLL, Population::new(1));
        }
        Reductions {
            gathered: HashMap::new(),
            populations,
            contributions: Vec::new(),
        }
    }

    /// Root: an element is inserted into `coll`; returns the first reduction
    /// it takes part in (the lowest one still open).
    pub(super) fn insertion(&mut self, coll: CollId) -> u32 {
        let pop = self
            .populations
            .get_mut(&coll)
            .expect("PE 0 creates a population with the store");
        *pop.births.entry(pop.next_open).or_insert(0) += 1;
        pop.next_open
    }
}

impl PeState {
    /// Delivers a completed reduction's (or quiescence's) value to its callback.
    pub(super) fn deliver_callback(&mut self, cb: &CallbackSpec, value: &Value) {
        let mut bytes = cb.prefix.clone();
        bytes.extend(value.encode_payload());
        let payload = Payload::encoded(bytes);
        match cb.target {
            Target::Ignore => {}
            Target::Element { coll, key } => self.send_element(coll, key, 0, payload),
            Target::Broadcast { coll } => self.broadcast(coll, 0, payload),
            Target::Member { coll, pe } => self.send_member(coll, pe, 0, payload),
            Target::Checkpoint { coll } => self.checkpoint_quiescent(coll),
            Target::BuddyCheckpoint { .. } => self.buddy_quiescent(),
            // Root: every element of `coll` is at sync.
            Target::LbSync { coll } => self.lb_sync(coll),
        }
    }
}

impl Scheduler {
    /// After elements left, partial results that waited only for them can go up.
    pub(super) fn recheck_partials(&mut self, coll: CollId) {
        if self.ctx.pe == 0 {
            return;
        }
        let waiting: Vec<u32> = self
            .ctx
            .red
            .gathered
            .keys()
            .filter(|(c, _)| *c == coll)
            .map(|(_, n)| *n)
            .collect();
        for no in waiting {
            if self.stores.get(&coll).is_none_or(|s| s.all_contributed(no)) {
                self.flush_partial(coll, no);
            }
        }
    }

    /// Merges a partial result; forwards it up the tree once every local
    /// element has contributed to that reduction, or completes it at the root.
    pub(super) fn gather(&mut self, p: Partial) {
        let key = (p.coll, p.no);
        let reg = self.ctx.node.registry.clone();
        let g = self
            .ctx
            .red
            .gathered
            .entry(key)
            .or_insert_with(|| Gathered {
                value: None,
                count: 0,
                reducer: p.reducer,
                callback: p.callback.clone(),
                failed: false,
            });
        g.count += p.count;
        if g.reducer != p.reducer {
            error!(
                "reduction {} of collection {:#x} mixes reducers {:?} and {:?}",
                p.no, p.coll, g.reducer, p.reducer
            );
            g.failed = true;
        }
        g.value = match g.value.take() {
            None => Some(p.value),
            Some(acc) => match combine(acc, p.value, g.reducer, &*reg) {
                Ok(v) => Some(v),
                Err(e) => {
                    error!("reduction {} of collection {:#x} failed: {e}", p.no, p.coll);
                    g.failed = true;
                    None
                }
            },
        };
        if self.ctx.pe == 0 {
            self.complete_if_done(p.coll, p.no);
            return;
        }
        let local_done = self
            .stores
            .get(&p.coll)
            .is_none_or(|s| s.all_contributed(p.no));
        if local_done {
            self.flush_partial(p.coll, p.no);
        }
    }

    pub(super) fn flush_partial(&mut self, coll: CollId, no: u32) {
        let Some(g) = self.ctx.red.gathered.remove(&(coll, no)) else {
            return;
        };
        let parent = self
            .ctx
            .topo
            .parent(self.ctx.pe)
            .expect("only PE 0 has no parent");
        let value = g.value.unwrap_or(Value::Unit);
        self.ctx.send_sys(
            parent,
            SysMsg::Reduce(Partial {
                coll,
                no,
                value,
                count: g.count,
                reducer: g.reducer,
                callback: g.callback,
            }),
        );
    }

    pub(super) fn complete_if_done(&mut self, coll: CollId, no: u32) {
        let Some(pop) = self.ctx.red.populations.get_mut(&coll) else {
            error!("reduction over unknown collection {coll:#x}");
            return;
        };
        let expected = pop.expected(no);
        let Some(g) = self.ctx.red.gathered.get(&(coll, no)) else {
            return;
        };
        if g.count < expected {
            return;
        }
        if g.count > expected {
            error!("reduction {no} of collection {coll:#x} got {} contributions for {expected} elements", g.count);
        }
        let g = self.ctx.red.gathered.remove(&(coll, no)).expect("present");
        if g.failed {
            error!("reduction {no} of collection {coll:#x} is not delivered: its contributions did not combine");
            pop.done.insert(
                no,
                (
                    Value::Unit,
                    CallbackSpec {
                        target: Target::Ignore,
                        prefix: vec![],
                    },
                ),
            );
        } else {
            pop.done
                .insert(no, (g.value.unwrap_or(Value::Unit), g.callback));
        }
        let mut ready = Vec::new();
        while let Some((v, cb)) = pop.done.remove(&pop.next_open) {
            ready.push((v, cb));
            pop.next_open += 1;
        }
        for (v, cb) in ready {
            self.ctx.deliver_callback(&cb, &v);
        }
    }

    /// The reduction service's runtime messages.
    pub(super) fn on_reduction(&mut self, msg: SysMsg) {
        match msg {
            SysMsg::Reduce(p) => self.gather(p),
            SysMsg::Death { coll, next_red } => match self.ctx.red.populations.get_mut(&coll) {
                Some(pop) => {
                    *pop.births.entry(next_red).or_insert(0) -= 1;
                    // Reductions waiting for the destroyed element may be complete now.
                    let open: Vec<u32> = self
                        .ctx
                        .red
                        .gathered
                        .keys()
                        .filter(|(c, _)| *c == coll)
                        .map(|(_, n)| *n)
                        .collect();
                    for no in open {
                        self.complete_if_done(coll, no);
                    }
                }
                None => error!("destruction in unknown collection {coll:#x}"),
            },
            other => misrouted(self.ctx.pe, "reduction", &other),
        }
    }
}
