//! One PE: the scheduler that composes the per-PE services.
//!
//! A PE is a plain thread that polls ([`run`]): it drains its inbox (a
//! lock-free queue that other PEs of the node and the transport's reader
//! threads push to), runs the most urgent queued message, and spins briefly
//! before parking when idle.
//!
//! Each runtime service keeps its own state and handles its own runtime
//! messages, in a file of its own:
//!
//! | service | state | file |
//! |---|---|---|
//! | start-up order, readonly data | [`startup::Startup`] | `pe/startup.rs` |
//! | location management, creation, insertion, migration | [`location::Locations`] | `pe/location.rs` |
//! | reductions and populations | [`reduction::Reductions`] | `pe/reduction.rs` |
//! | quiescence detection | [`quiescence::Quiescence`] | `pe/quiescence.rs` |
//! | load balancing | [`balance::Balancing`] | `pe/balance.rs` |
//! | checkpoint and restore | [`checkpoint::Checkpointing`] | `pe/checkpoint.rs` |
//! | buddy checkpoints in memory, a recovery's rollback | [`buddy::Buddy`] | `pe/buddy.rs` |
//! | the rescale's PE side | [`rescale::Rescaling`] | `pe/rescale.rs` (PE 0's), `pe/reentry.rs` (every PE's stop and re-entry) |
//! | timers (`PeCtx::after`) | [`timers::Timers`] | `pe/timers.rs` |
//!
//! [`PeState`] is the composition of those states plus the PE's identity and
//! run queue. Entry methods, proxies and stores see it only as
//! [`PeCtx`](crate::PeCtx), the narrow interface of `port.rs` (implemented in
//! `pe/api.rs`); the only way out of the PE is `pe/send.rs`. [`Scheduler`] adds the collection stores, dispatch, and
//! [`Scheduler::system`], which hands each runtime message to its service.

use std::sync::Arc;

use tracing::error;

mod api;
mod balance;
mod buddy;
mod checkpoint;
mod location;
mod queue;
mod quiescence;
mod reduction;
mod reentry;
mod rescale;
mod run;
mod send;
mod startup;
mod timers;

pub(crate) use queue::Inbox;
pub(crate) use reentry::{PeCommand, Reentry};

use crate::collection::Store;
use crate::msg::{CollId, Dest, Envelope, IdMap};
use crate::node::NodeShared;
use crate::system::{Departure, Service, SysMsg};
use crate::topo::{Pe as PeId, Topology};

/// How a PE's scheduler loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoopExit {
    /// The job called exit with this code.
    Exit(i32),
    /// The node is aborting (a peer or the coordinator was lost).
    Aborted,
    /// A rescale stopped the PE; the node's rescale driver takes over.
    Stopped,
    /// A rescale removed this PE's node: the PE ends, the process exits 0.
    Departed,
}

/// A PE's runtime state: its identity and run queue, and the state of each
/// per-PE service. Entry methods reach it as [`PeCtx`](crate::PeCtx).
pub(crate) struct PeState {
    pe: PeId,
    node: Arc<NodeShared>,
    topo: Arc<Topology>,
    queue: queue::RunQueue,
    startup: startup::Startup,
    loc: location::Locations,
    red: reduction::Reductions,
    qd: quiescence::Quiescence,
    lb: balance::Balancing,
    ckpt: checkpoint::Checkpointing,
    ft: buddy::Buddy,
    rescaling: rescale::Rescaling,
    timers: timers::Timers,
    /// The job is ending: nothing more runs here.
    exiting: bool,
    /// The code the job exits with, once it does.
    exit: Option<i32>,
}

/// A PE: its runtime handle plus the local members of every collection.
pub(crate) struct Scheduler {
    ctx: PeState,
    stores: IdMap<CollId, Box<dyn Store>>,
}

impl Scheduler {
    pub(crate) fn new(node: Arc<NodeShared>, topo: Arc<Topology>, pe: PeId) -> Self {
        let loc = location::Locations::new(&node, pe);
        let lb = balance::Balancing::new(&node, pe);
        let ctx = PeState {
            pe,
            node,
            topo,
            queue: queue::RunQueue::default(),
            startup: startup::Startup::new(pe),
            loc,
            red: reduction::Reductions::new(pe),
            qd: quiescence::Quiescence::default(),
            lb,
            ckpt: checkpoint::Checkpointing::default(),
            ft: buddy::Buddy::default(),
            rescaling: rescale::Rescaling::default(),
            timers: timers::Timers::default(),
            exiting: false,
            exit: None,
        };
        Scheduler {
            ctx,
            stores: IdMap::default(),
        }
    }

    /// Runs one message: an element's, a group member's, a broadcast, or
    /// the runtime's own; then applies what its handler asked for.
    fn dispatch(&mut self, env: Envelope) {
        let env = if self.ctx.startup.ready {
            env
        } else {
            match self.hold_until_ready(env) {
                Some(env) => env,
                None => return,
            }
        };
        if self.ctx.exiting {
            return;
        }
        if env.counted {
            self.ctx.qd.processed += 1;
        }
        match env.dest {
            Dest::Element { coll, key, src } => self.route_element(coll, key, src, env),
            Dest::Member { coll } => self.deliver_member(coll, env),
            Dest::Broadcast { coll, seq } => self.deliver_broadcast(coll, seq, env, true),
            Dest::BroadcastLeaf { coll, seq } => self.deliver_broadcast(coll, seq, env, false),
            Dest::System => self.system(env),
        }
        self.settle();
    }

    /// Hands a runtime message to the service it belongs to, once the
    /// collection it needs exists here. Tree broadcasts are forwarded first.
    fn system(&mut self, env: Envelope) {
        let msg = match SysMsg::take(env.payload) {
            Ok(m) => m,
            Err(e) => {
                error!(pe = self.ctx.pe, "dropping malformed runtime message: {e}");
                return;
            }
        };
        if let Some(coll) = msg.awaits_collection() {
            if !self.stores.contains_key(&coll) {
                self.ctx.hold_sys_for_creation(coll, msg);
                return;
            }
        }
        let msg = match msg {
            // Sent to every PE of a replaced subtree: handled here only.
            SysMsg::Leaf(inner) => *inner,
            msg => {
                if msg.is_tree_broadcast() {
                    for child in self.ctx.topo.children(self.ctx.pe) {
                        self.ctx.send_sys(child, msg.clone());
                    }
                }
                msg
            }
        };
        match msg.service() {
            Service::Startup => self.on_startup(msg),
            Service::Location => self.on_location(msg),
            Service::Reduction => self.on_reduction(msg),
            Service::Quiescence => self.on_quiescence(msg),
            Service::Balance => self.on_balance(msg),
            Service::Checkpoint => self.on_checkpoint(msg),
            Service::Rescale => self.on_rescale(msg),
            Service::Buddy => self.on_buddy(msg),
            Service::None => error!(
                pe = self.ctx.pe,
                "dropping a doubly wrapped runtime message"
            ),
        }
    }

    /// Applies what the last handler asked for: its contributions go to
    /// the reductions, its departed elements to the location service.
    fn settle(&mut self) {
        for p in std::mem::take(&mut self.ctx.red.contributions) {
            self.gather(p);
        }
        for d in std::mem::take(&mut self.ctx.loc.departures) {
            match d {
                Departure::Moved {
                    coll,
                    key,
                    to,
                    state,
                    meta,
                } => {
                    self.ctx.send_migrant(coll, key, to, state, meta, None);
                    self.recheck_partials(coll);
                }
                Departure::Destroyed {
                    coll,
                    key,
                    next_red,
                } => {
                    self.ctx.loc.cache.remove(&(coll, key));
                    self.ctx.send_sys(0, SysMsg::Death { coll, next_red });
                    self.recheck_partials(coll);
                }
            }
        }
    }

    fn coll_name(&self, coll: CollId) -> String {
        format!("collection {coll:#x}")
    }
}

impl PeState {
    /// A recovery: forgets every runtime service's state of the failed
    /// epoch (queued and held messages, locations, reductions, quiescence,
    /// load statistics, timers), as on a fresh PE of the current view; the
    /// buddy copies and readonly values stay. Not ready until PE 0's
    /// `Adopt` (PE 0 is).
    fn reset_runtime_state(&mut self) {
        let pe = self.pe;
        self.queue = queue::RunQueue::default();
        self.startup.ready = pe == 0;
        self.startup.held_in.clear();
        self.startup.held_out.clear();
        self.startup.in_main_ctor = false;
        self.loc = location::Locations::new(&self.node, pe);
        self.red = reduction::Reductions::new(pe);
        self.qd = quiescence::Quiescence::default();
        self.lb = balance::Balancing::new(&self.node, pe);
        self.ckpt = checkpoint::Checkpointing::default();
        self.timers = timers::Timers::default();
        self.rescaling.stop_order = None;
    }
}

/// The message the node puts first in a PE's inbox to stop it for a
/// recovery: the PE leaves its scheduler loop as for a rescale's stop,
/// before anything queued runs.
pub(crate) fn recovery_stop(order: crate::system::StopOrder) -> Envelope {
    Envelope {
        prio: i32::MIN,
        dest: Dest::System,
        payload: crate::msg::Payload::local(SysMsg::RescaleStop(order)),
        counted: false,
    }
}

/// A runtime message reached a service that does not handle it: a bug in
/// [`SysMsg::service`], said rather than acted on.
fn misrouted(pe: PeId, service: &str, msg: &SysMsg) {
    error!(
        pe,
        "the {service} service got a message it does not handle: {msg:?}"
    );
}
