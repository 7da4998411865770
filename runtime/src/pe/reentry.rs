//! Every PE's part in a rescale between its stop and its re-entry: it
//! obeys the node's rescale driver ([`PeCommand`]), hands over what it holds
//! (a departing PE sends everything to PE 0), and a surviving PE re-enters
//! in place ([`Scheduler::reenter`]): same thread, same chares, new
//! numbering, with every queued envelope that depends on the old numbering
//! translated, and a broadcast caught half-way down the old spanning tree
//! continued as direct copies to every PE of its old subtree. PE 0's side
//! (driving the rescale, adoption) is `pe/rescale.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tracing::{debug, error, warn};

use super::{Inbox, LoopExit, Scheduler};
use crate::msg::{CollId, Dest, Envelope, MAIN_COLL};
use crate::reduce::Value;
use crate::rescale::plan::Renumbering;
use crate::rescale::NodeEvent;
use crate::system::{Partial, SysMsg};
use crate::topo::{Pe as PeId, Topology};

/// What the node's rescale driver tells a stopped PE.
pub(crate) enum PeCommand {
    /// Drain the inbox; a departing PE also sends what it holds to PE 0.
    HandOver {
        /// This PE's node leaves.
        leaving: bool,
    },
    /// Re-enter the scheduler loop in the new view. The envelopes are what
    /// reached this PE's inbox in the old view after it handed over (the
    /// driver took them out before anyone could send in the new view).
    Resume(Arc<Reentry>, Vec<Envelope>),
    /// End this PE: its node left the job (or is aborting).
    Depart,
}

/// Everything a surviving PE needs to re-enter after a commit.
pub(crate) struct Reentry {
    /// The view that was left.
    pub old: Arc<Topology>,
    /// The committed view.
    pub new: Arc<Topology>,
    /// Old PE numbers to new ones.
    pub plan: Renumbering,
    /// The node's `rescale` span: each PE's re-entry logs under it
    /// (`rescale/spans.rs`).
    pub span: tracing::Span,
    /// A recovery: the PEs roll back to the last buddy checkpoint
    /// (`pe/buddy.rs`) instead of re-entering where they stopped.
    pub rollback: bool,
}

impl Scheduler {
    /// Between `RescaleStop` and re-entry: obeys the node's rescale driver.
    /// Returns how the PE ends, or None when it re-entered and should run on.
    pub(crate) fn rescale(
        &mut self,
        inbox: &Inbox,
        commands: &Receiver<PeCommand>,
        events: &Sender<NodeEvent>,
    ) -> Option<LoopExit> {
        let order = self
            .ctx
            .rescaling
            .stop_order
            .take()
            .expect("stopped by an order");
        let _ = events.send(NodeEvent::Stopped { order });
        loop {
            match commands.recv() {
                Ok(PeCommand::HandOver { leaving }) => {
                    self.hand_over(inbox, leaving);
                    let _ = events.send(NodeEvent::HandedOver);
                }
                Ok(PeCommand::Resume(r, _)) if r.rollback => {
                    self.roll_back(&r);
                    return None;
                }
                Ok(PeCommand::Resume(r, late)) => {
                    self.reenter(&r, late);
                    return None;
                }
                Ok(PeCommand::Depart) => return Some(LoopExit::Departed),
                Err(_) => return Some(LoopExit::Aborted),
            }
        }
    }

    /// Drains the inbox (the network is quiet); a departing PE sends every
    /// element, partial result and message it holds to PE 0, which stays.
    fn hand_over(&mut self, inbox: &Inbox, leaving: bool) {
        while let Some(env) = inbox.queue.pop() {
            self.ctx.enqueue(env);
        }
        if !leaving {
            return;
        }
        let me = self.ctx.pe;
        let subtree = self.ctx.topo.subtree(me);
        let mut colls: Vec<CollId> = self.stores.keys().copied().collect();
        colls.sort_unstable();
        let (mut moved, mut ended) = (0, 0);
        for coll in colls {
            let migratable = self.ctx.is_migratable(coll);
            let store = self.stores.get_mut(&coll).expect("listed");
            for (key, _) in store.locals() {
                let Some((state, meta)) = store.pack(key) else {
                    continue;
                };
                if migratable {
                    moved += 1;
                    self.ctx.send_migrant(coll, key, 0, state, meta, None);
                } else {
                    // A group or nodegroup member ends with its PE.
                    ended += 1;
                    let next_red = meta.next_red;
                    self.ctx.send_sys(0, SysMsg::Death { coll, next_red });
                }
            }
        }
        for ((coll, no), g) in std::mem::take(&mut self.ctx.red.gathered) {
            self.ctx.send_sys(
                0,
                SysMsg::Reduce(Partial {
                    coll,
                    no,
                    value: g.value.unwrap_or(Value::Unit),
                    count: g.count,
                    reducer: g.reducer,
                    callback: g.callback,
                }),
            );
        }
        let held = self.take_held();
        let forwarded = held.len();
        for env in held {
            self.forward_leftover(env, &subtree);
        }
        debug!(
            pe = me,
            moved, ended, forwarded, "departing PE handed over what it held"
        );
    }

    /// Everything queued or parked on this PE, in arrival order where there is one.
    fn take_held(&mut self) -> Vec<Envelope> {
        let c = &mut self.ctx;
        let mut out: Vec<Envelope> = c.queue.fifo.drain(..).collect();
        let mut heap: Vec<_> = std::mem::take(&mut c.queue.heap).into_vec();
        heap.sort_by_key(|q| q.seq);
        out.extend(heap.into_iter().map(|q| q.env));
        out.append(&mut c.startup.held_in);
        let mut unknown: Vec<_> = c.loc.unknown.drain().collect();
        unknown.sort_by_key(|(coll, _)| *coll);
        out.extend(unknown.into_iter().flat_map(|(_, v)| v));
        let mut waiting: Vec<_> = c.loc.waiting.drain().collect();
        waiting.sort_by_key(|(k, _)| *k);
        out.extend(waiting.into_iter().flat_map(|(_, v)| v));
        out
    }

    /// A departing PE's message: to PE 0, or on to the PEs of its old subtree.
    fn forward_leftover(&mut self, env: Envelope, subtree: &[PeId]) {
        let me = self.ctx.pe;
        match env.dest {
            Dest::Element { .. } => self.ctx.send_env(0, env),
            Dest::Member { coll } => warn!(
                pe = me,
                "dropping a message for the member of collection {coll:#x} on a departing PE"
            ),
            Dest::Broadcast { coll, seq } => {
                for &pe in subtree {
                    self.ctx.send_env(pe, leaf_copy(&env, coll, seq));
                }
            }
            // Only this PE's elements were to get it, and they are gone.
            Dest::BroadcastLeaf { .. } => {}
            Dest::System => {
                let msg = match SysMsg::take(env.payload) {
                    Ok(m) => m,
                    Err(e) => {
                        error!(pe = me, "dropping malformed runtime message: {e}");
                        return;
                    }
                };
                if msg.dropped_by_rescale() || matches!(msg, SysMsg::Leaf(_)) {
                    return;
                }
                if msg.is_tree_broadcast() {
                    for &pe in subtree {
                        self.ctx.send_sys(pe, SysMsg::Leaf(Box::new(msg.clone())));
                    }
                } else {
                    self.ctx.send_sys(0, msg);
                }
            }
        }
    }

    /// A survivor re-enters in the new view: new number, translated queues,
    /// rebuilt location and quiescence bookkeeping. Same thread, same chares.
    fn reenter(&mut self, r: &Reentry, late: Vec<Envelope>) {
        let _span =
            tracing::debug_span!(parent: &r.span, "reentry", epoch = r.old.epoch(), pe = self.ctx.pe)
                .entered();
        // The inbox may already hold messages of the new view (from PEs that
        // re-entered first): they stay there, untranslated.
        for env in late {
            self.ctx.enqueue(env);
        }
        let old_me = self.ctx.pe;
        let map = |pe: PeId| r.plan.pe_map.get(pe as usize).copied().flatten();
        let new_me = map(old_me).expect("only survivors re-enter");
        let subtree: Vec<PeId> = r.old.subtree(old_me).into_iter().filter_map(map).collect();
        let held = self.take_held();
        self.ctx.pe = new_me;
        self.ctx.topo = r.new.clone();
        self.ctx.qd.created = 0;
        self.ctx.qd.processed = 0;
        for env in held {
            self.translate(env, &subtree, &map);
        }
        let queued = self.ctx.queue.fifo.iter().filter(|e| e.counted).count()
            + self.ctx.queue.heap.iter().filter(|q| q.env.counted).count();
        self.ctx.qd.created += queued as u64;
        // Locations: every element tells its (new) home where it is.
        self.ctx.loc.cache.clear();
        self.ctx.loc.homes.clear();
        let mut arrays: Vec<CollId> = self
            .stores
            .keys()
            .copied()
            .filter(|&c| c != MAIN_COLL && self.ctx.is_migratable(c))
            .collect();
        arrays.sort_unstable();
        for coll in arrays {
            for (key, hops) in self.stores[&coll].locals() {
                self.ctx.note_local_element(coll, key, hops);
            }
        }
        // Partial results go up the new tree (or complete, on PE 0).
        let mut open: Vec<(CollId, u32)> = self.ctx.red.gathered.keys().copied().collect();
        open.sort_unstable();
        for (coll, no) in open {
            if new_me == 0 {
                self.complete_if_done(coll, no);
            } else if self.stores.get(&coll).is_none_or(|s| s.all_contributed(no)) {
                self.flush_partial(coll, no);
            }
        }
        // Quiescence detection starts its waves over.
        self.ctx.qd.current = None;
        if new_me == 0 && self.ctx.qd.running {
            self.ctx.qd.previous = None;
            self.ctx.qd.next_wave_at = Some(Instant::now());
        }
        self.ctx.lb.here.clear();
        // Buddy checkpoints stay, numbered in the view they were taken in;
        // the next sync point takes a new one.
        self.ctx.buddy_carry(&r.plan, r.new.epoch());
        // The time stopped was neither work nor idleness: the next load
        // statistics start now (else survivors look loaded and newcomers
        // empty to the balancing step that follows).
        self.ctx.lb.busy = Duration::ZERO;
        self.ctx.lb.idle = Duration::ZERO;
        self.ctx.lb.measured_since = Instant::now();
        debug!(old = old_me, new = new_me, "PE re-entered");
        if new_me == 0 {
            self.rescale_resumed(&r.plan);
        }
    }

    /// Re-queues one held message in the new numbering.
    fn translate(&mut self, env: Envelope, subtree: &[PeId], map: &dyn Fn(PeId) -> Option<PeId>) {
        let me = self.ctx.pe;
        match env.dest {
            Dest::Element { coll, key, src } => self.ctx.enqueue(Envelope {
                dest: Dest::Element {
                    coll,
                    key,
                    src: map(src).unwrap_or(me),
                },
                ..env
            }),
            Dest::Broadcast { coll, seq } if seq > 0 => {
                for &pe in subtree {
                    self.ctx.send_env(pe, leaf_copy(&env, coll, seq));
                }
                self.ctx.enqueue(Envelope {
                    dest: Dest::BroadcastLeaf { coll, seq },
                    ..env
                });
            }
            Dest::Member { .. } | Dest::Broadcast { .. } | Dest::BroadcastLeaf { .. } => {
                self.ctx.enqueue(env)
            }
            Dest::System => {
                let (prio, counted) = (env.prio, env.counted);
                let msg = match SysMsg::take(env.payload) {
                    Ok(m) => m,
                    Err(e) => {
                        error!(pe = me, "dropping malformed runtime message: {e}");
                        return;
                    }
                };
                let msg = match msg {
                    m if m.dropped_by_rescale() => return,
                    m if m.is_tree_broadcast() => {
                        for &pe in subtree {
                            self.ctx.send_sys(pe, SysMsg::Leaf(Box::new(m.clone())));
                        }
                        SysMsg::Leaf(Box::new(m))
                    }
                    SysMsg::InsertRequest {
                        coll,
                        key,
                        init,
                        on,
                    } => SysMsg::InsertRequest {
                        coll,
                        key,
                        init,
                        on: on.and_then(map),
                    },
                    m => m,
                };
                self.ctx.requeue_sys(prio, counted, msg);
            }
        }
    }
}

fn leaf_copy(env: &Envelope, coll: CollId, seq: u64) -> Envelope {
    Envelope {
        prio: env.prio,
        dest: Dest::BroadcastLeaf { coll, seq },
        payload: env.payload.duplicate(),
        counted: true,
    }
}
