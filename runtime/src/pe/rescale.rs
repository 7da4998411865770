//! A PE's part in a rescale (DESIGN.md, "Launch and rescale").
//!
//! PE 0 drives it: it waits for load-balancing steps in progress, runs a
//! step of every array that evacuates the departing PEs, and tells every
//! PE to stop. The node's rescale driver ([`crate::rescale::driver`]) then drains
//! the network, has departing PEs hand what they hold to PE 0, commits the
//! new view and reconciles endpoints. Each surviving PE re-enters in place
//! (`pe/reentry.rs`): same thread, same chares, new numbering. PE 0 then
//! hands the job's state to the newcomers ([`Scheduler::adopt`]), balances
//! onto them, and answers the control endpoint.
//!
//! Why nothing is lost: the driver stops every PE and drains the network
//! before anything is renumbered, so every message sent in the old epoch
//! sits in some PE's queue. Queued messages are then either kept (their
//! destination does not depend on numbering, or is translated), sent to
//! PE 0 (a departing PE's), or rebuilt (location and quiescence
//! bookkeeping). A broadcast caught half-way down the old spanning tree
//! continues as direct copies to every PE of its old subtree.

use std::time::Instant;

use tracing::{debug, error, info, warn};

use super::{PeState, Scheduler};
use crate::msg::{CallbackSpec, CollId, Dest, Envelope, Payload};
use crate::reduce::Value;
use crate::rescale::plan::Renumbering;
use crate::rescale::{Desk, Stage};
use crate::system::{AdoptedColl, Adoption, Shape, StopOrder, SysMsg};
use crate::topo::Pe as PeId;

/// Where PE 0's rescale stands.
#[derive(Debug, PartialEq, Eq)]
enum RootPhase {
    /// Waiting for load-balancing steps in progress to end.
    Waiting,
    /// Steps evacuating the departing PEs, by collection.
    Evacuating(Vec<CollId>),
    /// Every PE was told to stop; the node driver has the rescale.
    Stopped,
    /// Newcomer PEs still adopting the job's state.
    Adopting(u32),
    /// Steps populating the newcomers, by collection.
    Balancing(Vec<CollId>),
}

/// The rescale's state on a PE (the PE side of `rescale/`).
#[derive(Default)]
pub(super) struct Rescaling {
    /// Set by `RescaleStop`: the scheduler loop hands over to the node.
    pub(super) stop_order: Option<StopOrder>,
    /// Root: the rescale in progress.
    pub(super) root: Option<RootRescale>,
    /// Root: callbacks to call with the new PE count after every rescale.
    pub(super) callbacks: Vec<CallbackSpec>,
}

/// PE 0's bookkeeping of the rescale in progress.
pub(crate) struct RootRescale {
    /// The request, with its plan.
    order: StopOrder,
    phase: RootPhase,
    /// When the current phase began.
    since: Instant,
    /// `at_sync` steps that arrived during the rescale: run after it.
    deferred: Vec<CollId>,
    /// PE count before.
    pes_before: u32,
    /// Newcomer PEs admitted (known after re-entry).
    new_pes: u32,
}

impl RootRescale {
    /// The epoch the request was made in (the view it leaves).
    pub(super) fn epoch(&self) -> u64 {
        self.order.epoch
    }

    pub(crate) fn defer_sync(&mut self, coll: CollId) {
        self.deferred.push(coll);
    }
}

impl PeState {
    fn desk<R>(&self, f: impl FnOnce(&mut Desk) -> R) -> Option<R> {
        self.node.with_desk(f)
    }

    /// Root: the arrays a rescale's steps balance.
    fn balanced_arrays(&self) -> Vec<CollId> {
        let mut colls: Vec<CollId> = self
            .loc
            .colls
            .keys()
            .copied()
            .filter(|&c| self.is_migratable(c))
            .collect();
        colls.sort_unstable();
        colls
    }

    /// Enqueues `msg` here without counting it as a new message.
    pub(super) fn requeue_sys(&mut self, prio: i32, counted: bool, msg: SysMsg) {
        self.enqueue(Envelope {
            prio,
            dest: Dest::System,
            payload: Payload::local(msg),
            counted,
        });
    }
}

impl Scheduler {
    // ---- PE 0: driving the rescale ----

    /// The rescale service's runtime messages.
    pub(super) fn on_rescale(&mut self, msg: SysMsg) {
        match msg {
            SysMsg::OnRescale { callback } => self.ctx.rescaling.callbacks.push(callback),
            SysMsg::RescaleBegin => self.rescale_begin(),
            SysMsg::RescaleStop(order) => self.ctx.rescaling.stop_order = Some(order),
            SysMsg::Adopt(adoption) => self.adopt(adoption),
            // A restore's newcomer-style adoption is the checkpoint service's.
            SysMsg::Adopted if self.ctx.ckpt.restoring.is_some() => {}
            SysMsg::Adopted => self.rescale_adopted(),
            other => super::misrouted(self.ctx.pe, "rescale", &other),
        }
    }

    /// The control endpoint queued a request on the desk, or (while one
    /// is in progress) asks PE 0 to look at the desk again: its watchdog
    /// may have asked to abandon it.
    pub(super) fn rescale_begin(&mut self) {
        if self.ctx.rescaling.root.is_some() {
            self.rescale_check_abandon();
            return;
        }
        let Some(order) = self.ctx.desk(|d| d.order.clone()) else {
            // A late look at a rescale that ended meanwhile.
            debug!("no rescale on the desk");
            return;
        };
        info!(
            remove = ?order.remove,
            admit = order.admit,
            epoch = order.epoch,
            "rescale requested"
        );
        self.ctx.rescaling.root = Some(RootRescale {
            order,
            phase: RootPhase::Waiting,
            since: Instant::now(),
            deferred: Vec::new(),
            pes_before: self.ctx.num_pes(),
            new_pes: 0,
        });
        self.rescale_advance();
    }

    /// Moves the root's rescale on as far as it can go now.
    pub(super) fn rescale_advance(&mut self) {
        enum Next {
            Evacuate(Vec<PeId>),
            Stop(StopOrder),
            Populate(bool),
            Finish,
        }
        loop {
            let Some(r) = self.ctx.rescaling.root.as_ref() else {
                return;
            };
            let next = match &r.phase {
                // `lb_done` calls again when the step in progress ends.
                // A buddy checkpoint in progress too (`pe/buddy.rs` calls
                // again when it is complete).
                RootPhase::Waiting if !self.ctx.lb.roots.is_empty() || self.ctx.buddy_busy() => {
                    return
                }
                RootPhase::Waiting => Next::Evacuate(r.order.plan.leaving_pes.clone()),
                RootPhase::Evacuating(colls) if colls.is_empty() => Next::Stop(r.order.clone()),
                RootPhase::Adopting(0) => Next::Populate(r.new_pes > 0),
                RootPhase::Balancing(colls) if colls.is_empty() => Next::Finish,
                _ => return,
            };
            match next {
                Next::Evacuate(leaving) => {
                    let colls = if leaving.is_empty() {
                        Vec::new()
                    } else {
                        self.ctx.balanced_arrays()
                    };
                    self.set_phase(RootPhase::Evacuating(colls.clone()));
                    for coll in colls {
                        self.ctx.lb_start(coll, true, leaving.clone());
                    }
                }
                Next::Stop(order) => {
                    self.record(Stage::Evacuate);
                    self.ctx.desk(|d| d.stop_sent = Some(Instant::now()));
                    self.set_phase(RootPhase::Stopped);
                    for pe in 0..self.ctx.num_pes() {
                        self.ctx.send_sys(pe, SysMsg::RescaleStop(order.clone()));
                    }
                    return;
                }
                Next::Populate(expanded) => {
                    self.record(Stage::State);
                    let colls = if expanded {
                        self.ctx.balanced_arrays()
                    } else {
                        Vec::new()
                    };
                    self.set_phase(RootPhase::Balancing(colls.clone()));
                    for coll in colls {
                        self.ctx.lb_start(coll, true, Vec::new());
                    }
                }
                Next::Finish => {
                    self.record(Stage::Balance);
                    self.rescale_finish();
                    return;
                }
            }
        }
    }

    /// Drops the rescale if node 0's watchdog asked to and no PE was told
    /// to stop yet: nothing was committed, so the job goes on at its size.
    /// The evacuation's steps in progress are forgotten (their late
    /// reports are ignored, as for any unknown step); elements they moved
    /// stay where they are, a valid placement in the current view.
    fn rescale_check_abandon(&mut self) {
        let Some(why) = self.ctx.desk(|d| d.abandon.clone()).flatten() else {
            return;
        };
        let r = self
            .ctx
            .rescaling
            .root
            .as_ref()
            .expect("checked by the caller");
        let stuck = match &r.phase {
            RootPhase::Waiting => self.unanswered_lb(None),
            RootPhase::Evacuating(colls) => self.unanswered_lb(Some(colls)),
            // Too late: the node drivers bound the rest.
            _ => return,
        };
        let r = self.ctx.rescaling.root.take().expect("in progress");
        if let RootPhase::Evacuating(colls) = &r.phase {
            for coll in colls {
                self.ctx.lb.roots.remove(coll);
            }
        }
        warn!(
            remove = ?r.order.remove,
            admit = r.order.admit,
            "rescale abandoned in stage evacuate: {why}{stuck}"
        );
        self.ctx
            .node
            .finish_rescale(Err(crate::rescale::RescaleFailed::Abandoned {
                when: "in stage evacuate",
                why: format!("{why}{stuck}"),
            }));
        // `at_sync` steps that waited for the rescale run now.
        for coll in r.deferred {
            let cb = CallbackSpec {
                target: crate::callback::Target::LbSync { coll },
                prefix: Vec::new(),
            };
            self.ctx.deliver_callback(&cb, &Value::Unit);
        }
    }

    /// Which nodes a load-balancing step in progress (of `colls`, or any)
    /// still waits for, in words (empty when it cannot tell).
    fn unanswered_lb(&self, colls: Option<&Vec<CollId>>) -> String {
        let topo = &self.ctx.topo;
        let mut nodes = std::collections::BTreeSet::new();
        for (coll, root) in &self.ctx.lb.roots {
            if colls.is_some_and(|c| !c.contains(coll)) {
                continue;
            }
            if root.planned.is_none() {
                let answered: std::collections::HashSet<PeId> =
                    root.reports.iter().map(|(p, _)| p.pe).collect();
                for pe in 0..topo.num_pes() {
                    if !answered.contains(&pe) {
                        nodes.insert(topo.node_of(pe));
                    }
                }
            }
        }
        if nodes.is_empty() {
            return String::new();
        }
        let list: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        format!(
            " (load statistics missing from node{} {})",
            if nodes.len() == 1 { "" } else { "s" },
            list.join(", ")
        )
    }

    fn set_phase(&mut self, phase: RootPhase) {
        let r = self
            .ctx
            .rescaling
            .root
            .as_mut()
            .expect("a rescale is in progress");
        r.phase = phase;
        r.since = Instant::now();
    }

    /// Records the current phase's duration as `stage`.
    fn record(&mut self, stage: Stage) {
        let since = self.ctx.rescaling.root.as_ref().expect("in progress").since;
        let ms = since.elapsed().as_secs_f64() * 1e3;
        self.ctx.desk(|d| d.record(stage, ms));
    }

    /// A rescale's load-balancing step of `coll` completed.
    pub(super) fn rescale_lb_done(&mut self, coll: CollId, migrations: u64, staging_ns: u64) {
        self.ctx.desk(|d| {
            d.migrations += migrations;
            d.gpu_staging_ms += staging_ns as f64 / 1e6;
        });
        if let Some(r) = self.ctx.rescaling.root.as_mut() {
            if let RootPhase::Evacuating(c) | RootPhase::Balancing(c) = &mut r.phase {
                c.retain(|&x| x != coll);
            }
        }
        self.rescale_advance();
    }

    /// A newcomer PE adopted the job's state.
    pub(super) fn rescale_adopted(&mut self) {
        if let Some(RootPhase::Adopting(n)) = self.ctx.rescaling.root.as_mut().map(|r| &mut r.phase)
        {
            *n = n.saturating_sub(1);
        }
        self.rescale_advance();
    }

    /// PE 0 re-entered: hand the job's state to every newcomer PE.
    pub(super) fn rescale_resumed(&mut self, plan: &Renumbering) {
        if self.ctx.rescaling.root.is_none() {
            error!("PE 0 re-entered without a rescale in progress");
            return;
        }
        let topo = self.ctx.topo.clone();
        let new_pes = topo.num_pes() - plan.surviving_pes;
        self.ctx.rescaling.root.as_mut().expect("checked").new_pes = new_pes;
        if let Some(t) = self.ctx.desk(|d| d.reentry_from).flatten() {
            let ms = t.elapsed().as_secs_f64() * 1e3;
            self.ctx.desk(|d| d.record(Stage::Reentry, ms));
        }
        self.set_phase(RootPhase::Adopting(new_pes));
        if new_pes > 0 {
            let new_nodes = topo.num_nodes() - topo.node_of(plan.surviving_pes);
            let adoption = self.adoption(new_pes, new_nodes);
            for pe in plan.surviving_pes..topo.num_pes() {
                self.ctx.send_sys(pe, SysMsg::Adopt(adoption.clone()));
            }
        }
        self.rescale_advance();
    }

    /// The job's state for newcomers; counts their group and nodegroup
    /// members into the reduction populations.
    fn adoption(&mut self, new_pes: u32, new_nodes: u32) -> Adoption {
        let reg = self.ctx.node.registry.clone();
        let readonly = self
            .ctx
            .startup
            .readonly
            .iter()
            .map(|(id, v)| (*id, (reg.readonlies[id].encode)(&**v)))
            .collect();
        let mut colls = Vec::new();
        for spec in self.ctx.loc.specs.clone() {
            let joining = match spec.shape {
                Shape::Group => new_pes as i64,
                Shape::NodeGroup => new_nodes as i64,
                Shape::Array { .. } => 0,
            };
            // New members join the reductions PE 0's own member has not
            // contributed to yet: PE 0, the spanning tree's root, is the
            // first to run every broadcast, so in broadcast-driven code its
            // member is the most advanced (docs/elasticity.md).
            let pe0_next = self
                .stores
                .get(&spec.coll)
                .and_then(|s| s.next_reduction(0));
            let red_start = match self.ctx.red.populations.get_mut(&spec.coll) {
                Some(pop) => {
                    let start = pe0_next.unwrap_or(pop.next_open).max(pop.next_open);
                    if joining > 0 {
                        *pop.births.entry(start).or_insert(0) += joining;
                    }
                    start
                }
                None => 0,
            };
            let last_bcast = match self.stores.get(&spec.coll) {
                Some(s) => s.last_broadcast(),
                None => 0,
            }
            .max(
                self.ctx
                    .loc
                    .next_bcast
                    .get(&spec.coll)
                    .copied()
                    .unwrap_or(0),
            );
            colls.push(AdoptedColl {
                spec,
                last_bcast,
                red_start,
                skip_members: false,
            });
        }
        Adoption { readonly, colls }
    }

    /// Answers the control endpoint, runs what waited, and calls the
    /// program's rescale callbacks.
    fn rescale_finish(&mut self) {
        let r = self.ctx.rescaling.root.take().expect("in progress");
        let pes = self.ctx.num_pes();
        info!(
            pes_before = r.pes_before,
            pes,
            epoch = self.ctx.topo.epoch(),
            "rescale complete"
        );
        self.ctx.node.finish_rescale(Ok(()));
        for coll in r.deferred {
            let cb = CallbackSpec {
                target: crate::callback::Target::LbSync { coll },
                prefix: Vec::new(),
            };
            self.ctx.deliver_callback(&cb, &Value::Unit);
        }
        for cb in self.ctx.rescaling.callbacks.clone() {
            self.ctx.deliver_callback(&cb, &Value::U32(pes));
        }
    }

    // ---- newcomers ----

    /// A newcomer PE adopts the job's readonly data and collections.
    pub(super) fn adopt(&mut self, adoption: Adoption) {
        self.adopt_readonly(adoption.readonly);
        for c in adoption.colls {
            self.create_as(c.spec, Some((c.last_bcast, c.red_start, c.skip_members)));
        }
        debug!(pe = self.ctx.pe, "newcomer PE adopted the job's state");
        self.ctx.send_sys(0, SysMsg::Adopted);
    }
}
