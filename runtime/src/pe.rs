//! One PE: its scheduler loop, its message routing, and the per-PE state of
//! every runtime service (location tables, reductions, quiescence detection).
//!
//! A PE is a plain thread that polls: it drains its inbox (a lock-free queue
//! that other PEs of the node and the transport's reader threads push to),
//! runs the most urgent queued message, and spins briefly before parking when
//! idle. [`PeCtx`] is the part an entry method may touch (sends, creation,
//! contributions); [`Pe`] adds the collection stores and dispatch.

use std::any::Any;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering as AtOrd};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;

mod balance;
mod checkpoint;
mod rescale;
pub(crate) use rescale::{PeCommand, Reentry, RootRescale};
use tracing::{debug, error, warn};

use crate::callback::{CallbackSpec, Target};
use crate::chare::IndexKey;
use crate::collection::{Departure, ElemMeta, Store};
use crate::lb::stats::{ObjStat, PeStat};
use crate::msg::{encode_frame, CollId, Dest, Envelope, Payload, MAIN_COLL};
use crate::node::NodeShared;
use crate::reduce::{combine, Reducer, Value};
use crate::registry::LinearFn;
use crate::system::{CreateSpec, Partial, Shape, StopOrder, SysMsg};
use crate::topo::{Pe as PeId, Topology};

/// Delay between quiescence-detection waves while the job is busy.
const QD_WAVE_GAP: Duration = Duration::from_micros(200);
/// How long an idle PE busy-waits before it starts yielding its core.
const HOT_SPIN: Duration = Duration::from_micros(5);
/// Longest a parked PE sleeps before re-checking timers and the abort flag.
const PARK_LIMIT: Duration = Duration::from_millis(5);

/// A PE's incoming queue, shared with the threads that push to it.
pub(crate) struct Inbox {
    queue: SegQueue<Envelope>,
    sleeping: AtomicBool,
    thread: OnceLock<Thread>,
}

impl Inbox {
    pub(crate) fn new() -> Self {
        Inbox {
            queue: SegQueue::new(),
            sleeping: AtomicBool::new(false),
            thread: OnceLock::new(),
        }
    }

    /// Empties the queue (the PE is stopped).
    pub(crate) fn take_all(&self) -> Vec<Envelope> {
        std::iter::from_fn(|| self.queue.pop()).collect()
    }

    /// Queues `env` and wakes the PE if it is parked.
    pub(crate) fn push(&self, env: Envelope) {
        self.queue.push(env);
        if self.sleeping.load(AtOrd::SeqCst) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }
}

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

struct Queued {
    prio: i32,
    seq: u64,
    env: Envelope,
}
impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        self.prio == o.prio && self.seq == o.seq
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    // BinaryHeap is a max-heap: the lowest priority value, then the oldest, is greatest.
    fn cmp(&self, o: &Self) -> Ordering {
        o.prio.cmp(&self.prio).then(o.seq.cmp(&self.seq))
    }
}

struct CollInfo {
    shape: Shape,
    linear: LinearFn,
}

/// Per-collection membership bookkeeping on the reduction root (PE 0).
struct Population {
    base: u64,
    /// Insertions: how many elements joined from each reduction number on.
    births: BTreeMap<u32, i64>,
    /// The lowest reduction number whose result has not been delivered.
    next_open: u32,
    /// Results complete but waiting for an earlier reduction (delivered in order).
    done: BTreeMap<u32, (Value, CallbackSpec)>,
}

impl Population {
    fn expected(&self, no: u32) -> u64 {
        (self.base as i64 + self.births.range(..=no).map(|(_, n)| n).sum::<i64>()).max(0) as u64
    }
}

struct Gathered {
    value: Option<Value>,
    count: u64,
    reducer: Reducer,
    callback: CallbackSpec,
    failed: bool,
}

#[derive(Default)]
struct Qd {
    /// Root only: callbacks waiting for quiescence.
    callbacks: Vec<CallbackSpec>,
    running: bool,
    wave: u64,
    previous: Option<(u64, u64)>,
    next_wave_at: Option<Instant>,
    /// The wave this PE is collecting: (wave, children pending, created, processed).
    current: Option<(u64, usize, u64, u64)>,
}

/// A PE's part in one load-balancing step of one array.
#[derive(Default)]
struct LbStep {
    step: u64,
    /// Elements the plan sends here (known once the plan arrived).
    expected: Option<usize>,
    /// Elements received for this step (they can arrive before the plan).
    received: usize,
    bytes_sent: u64,
    done: bool,
}

/// PE 0's bookkeeping of one load-balancing step of one array.
struct LbRoot {
    step: u64,
    started: Instant,
    reports: Vec<(PeStat, Vec<ObjStat>)>,
    planned: Option<Instant>,
    /// A step a rescale runs (evacuation, populating newcomers): the elements
    /// are not at sync, so nothing resumes them.
    forced: bool,
    /// PEs the plan must empty.
    leaving: Vec<PeId>,
    migrations: u64,
    summary: String,
    done: u32,
    bytes: u64,
    /// Device staging time the PEs reported (GPU chares' buffers).
    staging_ns: u64,
}

/// The per-PE runtime handle that entry methods send through.
pub struct PeCtx {
    pe: PeId,
    node: Arc<NodeShared>,
    topo: Arc<Topology>,
    fifo: VecDeque<Envelope>,
    heap: BinaryHeap<Queued>,
    seq: u64,
    ready: bool,
    held_in: Vec<Envelope>,
    in_main_ctor: bool,
    held_out: Vec<(PeId, Envelope)>,
    readonly: HashMap<u64, Arc<dyn Any + Send + Sync>>,
    colls: HashMap<CollId, CollInfo>,
    unknown: HashMap<CollId, Vec<Envelope>>,
    /// Where an element is (or was last sent): `(PE, its move count there)`.
    /// Entries only ever move to a higher move count, so following them
    /// always ends at the element (see [`PeCtx::learn`]).
    cache: HashMap<(CollId, IndexKey), (PeId, u64)>,
    /// For elements whose home is this PE: where they live, by move count.
    homes: HashMap<(CollId, IndexKey), (PeId, u64)>,
    waiting: HashMap<(CollId, IndexKey), Vec<Envelope>>,
    gathered: HashMap<(CollId, u32), Gathered>,
    populations: HashMap<CollId, Population>,
    contributions: Vec<Partial>,
    created: u64,
    processed: u64,
    qd: Qd,
    exiting: bool,
    exit: Option<i32>,
    departures: Vec<Departure>,
    /// 1 / emulated speed: how much longer entry methods take here.
    slowdown: f64,
    /// Time in entry methods and idle since the last statistics report.
    busy: Duration,
    idle: Duration,
    measured_since: Instant,
    /// Root: broadcast sequence numbers, LB steps.
    next_bcast: HashMap<CollId, u64>,
    lb_root: HashMap<CollId, LbRoot>,
    /// PE 0: each array's loads and speeds at earlier steps (smoothing).
    lb_history: HashMap<CollId, crate::lb::steady::History>,
    lb_steps: HashMap<CollId, u64>,
    lb: HashMap<CollId, LbStep>,
    /// Root, with `+lb-period`: when each collection was last balanced.
    last_balanced: HashMap<CollId, Instant>,
    /// Set by `RescaleStop`: the scheduler loop hands over to the node.
    stop_order: Option<StopOrder>,
    /// Root: every collection's creation, in order (newcomers adopt them).
    specs: Vec<CreateSpec>,
    /// Root: the rescale in progress.
    rescale: Option<RootRescale>,
    /// Root: callbacks to call with the new PE count after every rescale.
    rescale_callbacks: Vec<CallbackSpec>,
    /// Root: the checkpoint being taken.
    checkpoint: Option<checkpoint::RootCheckpoint>,
    /// Root: the restore in progress.
    restoring: Option<checkpoint::RootRestore>,
}

impl PeCtx {
    /// This PE's global number.
    pub fn my_pe(&self) -> PeId {
        self.pe
    }
    /// Number of PEs in the job.
    pub fn num_pes(&self) -> u32 {
        self.topo.num_pes()
    }
    /// This node's id.
    pub fn my_node(&self) -> u32 {
        self.topo.my_node()
    }
    /// Number of nodes in the job.
    pub fn num_nodes(&self) -> u32 {
        self.topo.num_nodes()
    }
    /// The current topology.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }
    /// The program's command-line arguments (without the program name).
    pub fn args(&self) -> &[String] {
        &self.node.args
    }

    /// Ends the job: every PE stops, every node passes the shutdown barrier,
    /// and every process exits with `code`.
    pub fn exit(&mut self, code: i32) {
        self.send_sys(0, SysMsg::ExitRequest { code });
    }

    /// Calls `callback` with the job's new PE count after every rescale, once
    /// the job runs at its new size (Charm++'s resume-after-shrink/expand).
    pub fn on_rescale(&mut self, callback: crate::Callback<u32>) {
        self.send_sys(
            0,
            SysMsg::OnRescale {
                callback: callback.spec,
            },
        );
    }

    /// Calls `callback` once no application message is queued or in flight
    /// anywhere in the job (Charm++'s quiescence detection).
    pub fn start_quiescence(&mut self, callback: crate::Callback<()>) {
        self.send_sys(
            0,
            SysMsg::QdStart {
                callback: callback.spec,
            },
        );
    }

    // ---- internals used by proxies, contexts and stores ----

    pub(crate) fn set_readonly(&mut self, id: u64, name: &str, value: Arc<dyn Any + Send + Sync>) {
        assert!(
            self.in_main_ctor,
            "readonly `{name}` can only be set in the main chare's constructor"
        );
        assert!(
            self.node.registry.readonlies.contains_key(&id),
            "readonly `{name}` is not registered"
        );
        self.node
            .readonly
            .lock()
            .expect("readonly table poisoned")
            .insert(id, value.clone());
        self.readonly.insert(id, value);
    }

    pub(crate) fn readonly_value(&self, id: u64) -> Option<&(dyn Any + Send + Sync)> {
        self.readonly.get(&id).map(|v| &**v)
    }

    pub(crate) fn create_collection(
        &mut self,
        type_id: u64,
        shape: Shape,
        init: Vec<u8>,
    ) -> CollId {
        assert!(
            self.node.registry.chares.contains_key(&type_id),
            "chare type with id {type_id:#x} is not registered: call `reg.chare::<T>()` in the registration function"
        );
        let coll = self.node.new_collection_id();
        // The creator can route to the new collection at once; its homes hold
        // what arrives before the creation does.
        let linear = self.node.registry.chares[&type_id].linear;
        self.colls.insert(
            coll,
            CollInfo {
                shape: shape.clone(),
                linear,
            },
        );
        self.send_sys(
            0,
            SysMsg::Create(CreateSpec {
                coll,
                type_id,
                shape,
                init,
            }),
        );
        coll
    }

    pub(crate) fn insert(&mut self, coll: CollId, key: IndexKey, init: Vec<u8>, on: Option<PeId>) {
        if let Some(pe) = on {
            assert!(
                pe < self.num_pes(),
                "cannot insert on PE {pe}: the job has {} PEs",
                self.num_pes()
            );
        }
        self.send_sys(
            0,
            SysMsg::InsertRequest {
                coll,
                key,
                init,
                on,
            },
        );
    }

    pub(crate) fn send_element(
        &mut self,
        coll: CollId,
        key: IndexKey,
        prio: i32,
        payload: Payload,
    ) {
        let dest = Dest::Element {
            coll,
            key,
            src: self.pe,
        };
        match self.locate(coll, key) {
            Some(pe) => self.send_env(
                pe,
                Envelope {
                    prio,
                    dest,
                    payload,
                    counted: true,
                },
            ),
            // The collection's creation has not reached this PE yet: hold the message here.
            None => self.hold_for_creation(
                coll,
                Envelope {
                    prio,
                    dest,
                    payload,
                    counted: false,
                },
            ),
        }
    }

    pub(crate) fn send_member(&mut self, coll: CollId, pe: PeId, prio: i32, payload: Payload) {
        assert!(
            pe < self.num_pes(),
            "no PE {pe}: the job has {} PEs",
            self.num_pes()
        );
        self.send_env(
            pe,
            Envelope {
                prio,
                dest: Dest::Member { coll },
                payload,
                counted: true,
            },
        );
    }

    pub(crate) fn broadcast(&mut self, coll: CollId, prio: i32, payload: Payload) {
        self.send_env(
            0,
            Envelope {
                prio,
                dest: Dest::Broadcast { coll, seq: 0 },
                payload,
                counted: true,
            },
        );
    }

    /// Charges an entry method that took `spent`: emulates this PE's slowdown
    /// by spinning for the extra time, and returns what the method cost in all.
    pub(crate) fn charge(&mut self, spent: Duration) -> Duration {
        let total = if self.slowdown > 1.0 {
            let total = spent.mul_f64(self.slowdown);
            let until = Instant::now() + (total - spent);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            total
        } else {
            spent
        };
        self.busy += total;
        total
    }

    /// Whether elements of `coll` may move: array elements, but not main or
    /// group and nodegroup members (whose PE is their identity).
    pub(crate) fn is_migratable(&self, coll: CollId) -> bool {
        coll != MAIN_COLL
            && matches!(
                self.colls.get(&coll).map(|c| &c.shape),
                Some(Shape::Array { .. })
            )
    }

    pub(crate) fn depart(&mut self, d: Departure) {
        self.departures.push(d);
    }

    pub(crate) fn contribute(
        &mut self,
        coll: CollId,
        no: u32,
        value: Value,
        reducer: Reducer,
        callback: CallbackSpec,
    ) {
        self.contributions.push(Partial {
            coll,
            no,
            value,
            count: 1,
            reducer,
            callback,
        });
    }

    /// Records that element `key` is on `pe` after `hops` moves, unless a
    /// newer location is known. Forwarding follows these entries, and since
    /// a PE's entry only changes to a later location, a message can never
    /// cycle between stale ones.
    pub(crate) fn learn(&mut self, coll: CollId, key: IndexKey, pe: PeId, hops: u64) {
        let e = self.cache.entry((coll, key)).or_insert((pe, hops));
        if hops >= e.1 {
            *e = (pe, hops);
        }
    }

    pub(crate) fn note_local_element(&mut self, coll: CollId, key: IndexKey, hops: u64) {
        let me = self.pe;
        self.cache.insert((coll, key), (me, hops));
        if let Some(home) = self.home_of(coll, key) {
            if home != me {
                self.send_sys(
                    home,
                    SysMsg::HomeUpdate {
                        coll,
                        key,
                        pe: me,
                        hops,
                    },
                );
            } else {
                self.homes.insert((coll, key), (me, hops));
            }
        }
        if let Some(held) = self.waiting.remove(&(coll, key)) {
            for env in held {
                self.release(self.pe, env);
            }
        }
    }

    /// Keeps an envelope until collection `coll` is created on this PE.
    ///
    /// Held envelopes leave quiescence detection's books balanced (their
    /// sending and any earlier handling were both counted); [`Self::release`]
    /// counts them again as new messages.
    fn hold_for_creation(&mut self, coll: CollId, mut env: Envelope) {
        env.counted = false;
        self.unknown.entry(coll).or_default().push(env);
    }

    /// Keeps a runtime message until collection `coll` is created on this PE.
    fn hold_sys_for_creation(&mut self, coll: CollId, msg: SysMsg) {
        let env = Envelope {
            prio: 0,
            dest: Dest::System,
            payload: Payload::local(msg),
            counted: false,
        };
        self.hold_for_creation(coll, env);
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
                state,
                meta,
                lb_step,
            },
        );
    }

    /// Sends on an envelope that was held, as a newly created message.
    fn release(&mut self, pe: PeId, mut env: Envelope) {
        env.counted = true;
        self.send_env(pe, env);
    }

    fn home_of(&self, coll: CollId, key: IndexKey) -> Option<PeId> {
        let info = self.colls.get(&coll)?;
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

    fn locate(&self, coll: CollId, key: IndexKey) -> Option<PeId> {
        self.cache
            .get(&(coll, key))
            .map(|&(pe, _)| pe)
            .or_else(|| self.home_of(coll, key))
    }

    fn send_sys(&mut self, pe: PeId, msg: SysMsg) {
        let counted = msg.counts_for_qd();
        self.send_env(
            pe,
            Envelope {
                prio: 0,
                dest: Dest::System,
                payload: Payload::local(msg),
                counted,
            },
        );
    }

    /// The one place an envelope leaves this PE.
    pub(crate) fn send_env(&mut self, pe: PeId, env: Envelope) {
        if self.in_main_ctor {
            // Main's sends wait until readonly data is on its way (see `Pe::start_main`).
            self.held_out.push((pe, env));
            return;
        }
        if env.counted {
            self.created += 1;
        }
        if pe == self.pe {
            self.enqueue(env);
        } else if self.topo.is_local(pe) {
            self.node.inboxes[self.topo.rank_of(pe)].push(env);
        } else {
            self.send_remote(pe, env);
        }
    }

    fn send_remote(&mut self, pe: PeId, env: Envelope) {
        let frame = encode_frame(pe, &env);
        let node = self.topo.node_of(pe);
        if let Err(e) = self.node.send_to_node(node, frame) {
            // Every PE sending to a lost node gets here: one line per node
            // says so (`lose_peer`), the rest is debug detail.
            debug!(pe = self.pe, to_node = node, "send failed: {e}");
            self.node
                .lose_peer(self.topo.uid_of(node), &format!("sending to it failed ({e})"));
        }
    }

    fn enqueue(&mut self, env: Envelope) {
        if env.prio == 0 {
            self.fifo.push_back(env);
        } else {
            self.seq += 1;
            self.heap.push(Queued {
                prio: env.prio,
                seq: self.seq,
                env,
            });
        }
    }

    fn next(&mut self) -> Option<Envelope> {
        match self.heap.peek() {
            Some(q) if q.prio < 0 || self.fifo.is_empty() => self.heap.pop().map(|q| q.env),
            _ => self.fifo.pop_front(),
        }
    }

    fn deliver_callback(&mut self, cb: &CallbackSpec, value: &Value) {
        let mut bytes = cb.prefix.clone();
        bytes.extend(value.encode_payload());
        let payload = Payload::Wire {
            bytes: Arc::new(bytes),
            offset: 0,
        };
        match cb.target {
            Target::Ignore => {}
            Target::Element { coll, key } => self.send_element(coll, key, 0, payload),
            Target::Broadcast { coll } => self.broadcast(coll, 0, payload),
            Target::Member { coll, pe } => self.send_member(coll, pe, 0, payload),
            Target::Checkpoint { coll } => self.checkpoint_quiescent(coll),
            Target::LbSync { coll } => {
                // Root: every element of `coll` is at sync.
                if self.checkpoint_at_sync(coll) {
                    return;
                }
                if let Some(r) = &mut self.rescale {
                    // The rescale runs its own steps; this one waits for it.
                    r.defer_sync(coll);
                    return;
                }
                if let Some(period) = self.node.options.lb_period {
                    let last = self
                        .last_balanced
                        .get(&coll)
                        .copied()
                        .unwrap_or(self.measured_since);
                    if last.elapsed() < period {
                        // Periodic balancing: too soon, resume without a step.
                        let step = self.lb_steps.get(&coll).copied().unwrap_or(0);
                        self.send_sys(0, SysMsg::LbResume { coll, step });
                        return;
                    }
                    self.last_balanced.insert(coll, Instant::now());
                }
                self.lb_start(coll, false, Vec::new());
            }
        }
    }

    /// Root: starts a load-balancing step of `coll` by collecting statistics.
    fn lb_start(&mut self, coll: CollId, forced: bool, leaving: Vec<PeId>) {
        let step = self.lb_steps.entry(coll).or_insert(0);
        *step += 1;
        let step = *step;
        self.lb_root.insert(
            coll,
            LbRoot {
                step,
                started: Instant::now(),
                reports: Vec::new(),
                planned: None,
                forced,
                leaving,
                migrations: 0,
                summary: String::new(),
                done: 0,
                bytes: 0,
                staging_ns: 0,
            },
        );
        self.send_sys(0, SysMsg::LbCollect { coll, step });
    }
}

/// A PE: its runtime handle plus the local members of every collection.
pub(crate) struct Pe {
    ctx: PeCtx,
    stores: HashMap<CollId, Box<dyn Store>>,
}

impl Pe {
    pub(crate) fn new(node: Arc<NodeShared>, topo: Arc<Topology>, pe: PeId) -> Self {
        let mut ctx = PeCtx {
            pe,
            node,
            topo,
            fifo: VecDeque::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            ready: pe == 0,
            held_in: Vec::new(),
            in_main_ctor: false,
            held_out: Vec::new(),
            readonly: HashMap::new(),
            colls: HashMap::new(),
            unknown: HashMap::new(),
            cache: HashMap::new(),
            homes: HashMap::new(),
            waiting: HashMap::new(),
            gathered: HashMap::new(),
            populations: HashMap::new(),
            contributions: Vec::new(),
            created: 0,
            processed: 0,
            qd: Qd::default(),
            exiting: false,
            exit: None,
            departures: Vec::new(),
            slowdown: 1.0,
            busy: Duration::ZERO,
            idle: Duration::ZERO,
            measured_since: Instant::now(),
            next_bcast: HashMap::new(),
            lb_root: HashMap::new(),
            lb_history: HashMap::new(),
            lb_steps: HashMap::new(),
            lb: HashMap::new(),
            last_balanced: HashMap::new(),
            stop_order: None,
            specs: Vec::new(),
            rescale: None,
            rescale_callbacks: Vec::new(),
            checkpoint: None,
            restoring: None,
        };
        if let Some(speed) = ctx.node.options.pe_speed.get(&pe) {
            ctx.slowdown = 1.0 / speed;
        }
        // Every PE knows the main chare's collection: one element, on PE 0.
        if let Some(main) = ctx
            .node
            .registry
            .main_type
            .and_then(|t| ctx.node.registry.chares.get(&t))
        {
            ctx.colls.insert(
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
        if pe == 0 {
            ctx.populations.insert(
                MAIN_COLL,
                Population {
                    base: 1,
                    births: BTreeMap::new(),
                    next_open: 0,
                    done: BTreeMap::new(),
                },
            );
        }
        Pe {
            ctx,
            stores: HashMap::new(),
        }
    }

    /// Constructs the main chare (PE 0 at launch), then releases readonly data
    /// ahead of everything main sent.
    pub(crate) fn start_main(&mut self) {
        let reg = self.ctx.node.registry.clone();
        let Some(main_type) = reg.main_type else {
            error!("no main chare registered: call `reg.main::<Main>()`");
            self.ctx.exit(crate::node::EXIT_STARTUP);
            return;
        };
        let entry = reg.chares.get(&main_type).expect("main type is registered");
        let mut store = (entry.make)(MAIN_COLL);
        let args =
            postcard::to_allocvec(&self.ctx.node.args).expect("encoding into a Vec cannot fail");
        self.ctx.in_main_ctor = true;
        let built = store.construct(0, &args, 0, &mut self.ctx);
        self.ctx.in_main_ctor = false;
        if let Err(e) = built {
            error!("constructing the main chare failed: {e}");
            self.ctx.exit(crate::node::EXIT_STARTUP);
            return;
        }
        self.stores.insert(MAIN_COLL, store);
        let entries = self
            .ctx
            .readonly
            .iter()
            .map(|(id, v)| (*id, (reg.readonlies[id].encode)(&**v)))
            .collect();
        self.ctx.send_sys(0, SysMsg::Readonly { entries });
        for (pe, env) in std::mem::take(&mut self.ctx.held_out) {
            self.ctx.send_env(pe, env);
        }
        self.settle();
    }

    /// Runs the scheduler loop until the job exits, the node aborts, or a
    /// rescale stops this PE (then the loop can be entered again).
    pub(crate) fn run(&mut self, inbox: &Inbox, spin: Duration) -> LoopExit {
        let _ = inbox.thread.set(std::thread::current());
        loop {
            while let Some(env) = inbox.queue.pop() {
                self.ctx.enqueue(env);
            }
            if let Some(env) = self.ctx.next() {
                self.dispatch(env);
                if let Some(code) = self.ctx.exit {
                    return LoopExit::Exit(code);
                }
                if self.ctx.stop_order.is_some() {
                    return LoopExit::Stopped;
                }
                continue;
            }
            if self.ctx.node.aborting() {
                self.log_stuck_state();
                return LoopExit::Aborted;
            }
            let now = Instant::now();
            if let Some(at) = self.ctx.qd.next_wave_at {
                if now >= at {
                    self.ctx.qd.next_wave_at = None;
                    self.start_qd_wave();
                    continue;
                }
            }
            // Idle: spin (sub-microsecond wake-up), then park.
            let idle_from = now;
            // Busy-wait for the first microseconds (a reply from another PE
            // of this node usually comes that fast), then keep waiting but
            // yield the core, so that a transport's progress thread or
            // another node's PE that shares it is not starved.
            let until = now + spin;
            let hot_until = now + HOT_SPIN;
            let transport = self.ctx.node.transport_if_any();
            while inbox.queue.is_empty() {
                if transport.as_ref().is_some_and(|t| t.poll()) {
                    continue;
                }
                let t = Instant::now();
                if t >= until {
                    break;
                }
                if t < hot_until {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if !inbox.queue.is_empty() {
                self.ctx.idle += idle_from.elapsed();
                continue;
            }
            inbox.sleeping.store(true, AtOrd::SeqCst);
            if inbox.queue.is_empty() {
                let mut nap = PARK_LIMIT;
                if let Some(at) = self.ctx.qd.next_wave_at {
                    nap = nap.min(at.saturating_duration_since(Instant::now()));
                }
                std::thread::park_timeout(nap);
            }
            inbox.sleeping.store(false, AtOrd::SeqCst);
            self.ctx.idle += idle_from.elapsed();
        }
    }

    /// What this PE still holds when the job is being ended from outside
    /// (a lost peer, the launcher's timeout): the first place to look when
    /// a job hangs.
    fn log_stuck_state(&self) {
        let c = &self.ctx;
        let unknown: usize = c.unknown.values().map(Vec::len).sum();
        let waiting: usize = c.waiting.values().map(Vec::len).sum();
        let partials: Vec<String> = c
            .gathered
            .iter()
            .map(|((coll, no), g)| format!("{coll:#x}#{no}:{}", g.count))
            .collect();
        // Debug level: on a lost node every PE of every survivor gets here,
        // and the loss itself is already said once (`lose_peer`).
        debug!(
            pe = c.pe,
            ready = c.ready,
            queued = c.fifo.len() + c.heap.len(),
            held_until_ready = c.held_in.len(),
            held_for_collection = unknown,
            held_collections = ?c.unknown.keys().collect::<Vec<_>>(),
            waiting_for_insertion = waiting,
            collections = c.colls.len(),
            elements = self.stores.values().map(|s| s.locals().len()).sum::<usize>(),
            partial_reductions = ?partials,
            created = c.created,
            processed = c.processed,
            "PE state when the job was ended"
        );
    }

    fn dispatch(&mut self, env: Envelope) {
        let env = if self.ctx.ready {
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
            self.ctx.processed += 1;
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

    /// Before readonly data arrives only the readonly broadcast itself (and
    /// exit) may run: everything else could read a readonly that is not there.
    fn hold_until_ready(&mut self, env: Envelope) -> Option<Envelope> {
        if !matches!(env.dest, Dest::System) {
            self.ctx.held_in.push(env);
            return None;
        }
        let msg = match env.payload.take::<SysMsg>() {
            Ok(m) => m,
            Err(e) => {
                error!(pe = self.ctx.pe, "dropping malformed runtime message: {e}");
                return None;
            }
        };
        let pass = matches!(
            msg,
            SysMsg::Readonly { .. } | SysMsg::Exit { .. } | SysMsg::Adopt(_)
        );
        let env = Envelope {
            payload: Payload::local(msg),
            ..env
        };
        if pass {
            Some(env)
        } else {
            self.ctx.held_in.push(env);
            None
        }
    }

    fn route_element(&mut self, coll: CollId, key: IndexKey, src: PeId, env: Envelope) {
        if !self.ctx.colls.contains_key(&coll) {
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
            self.ctx.homes.get(&(coll, key)),
            self.ctx.cache.get(&(coll, key)),
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

    fn deliver_member(&mut self, coll: CollId, env: Envelope) {
        if !self.ctx.colls.contains_key(&coll) {
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

    fn deliver_broadcast(&mut self, coll: CollId, seq: u64, env: Envelope, forward: bool) {
        if !self.ctx.colls.contains_key(&coll) {
            self.ctx.hold_for_creation(coll, env);
            return;
        }
        let seq = if seq == 0 {
            // The root numbers the collection's broadcasts, so every PE sees them in one order.
            let n = self.ctx.next_bcast.entry(coll).or_insert(0);
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

    fn system(&mut self, env: Envelope) {
        // Tree broadcasts are forwarded before they are handled.
        let msg = match env.payload.take::<SysMsg>() {
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
        let me = self.ctx.pe;
        match msg {
            SysMsg::Create(spec) => self.create(spec),
            SysMsg::InsertRequest {
                coll,
                key,
                init,
                on,
            } => {
                let pop = self
                    .ctx
                    .populations
                    .get_mut(&coll)
                    .expect("PE 0 creates a population with the store");
                *pop.births.entry(pop.next_open).or_insert(0) += 1;
                let red_start = pop.next_open;
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
                    },
                );
            }
            SysMsg::Insert {
                coll,
                key,
                init,
                red_start,
            } => {
                let store = self.stores.get_mut(&coll).expect("held until created");
                if let Err(e) = store.construct(key, &init, red_start, &mut self.ctx) {
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
                let e = self.ctx.homes.entry((coll, key)).or_insert((pe, hops));
                if hops >= e.1 {
                    *e = (pe, hops);
                }
                if let Some(held) = self.ctx.waiting.remove(&(coll, key)) {
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
            SysMsg::Readonly { entries } => self.adopt_readonly(entries),
            SysMsg::Reduce(p) => self.gather(p),
            SysMsg::QdStart { callback } => {
                self.ctx.qd.callbacks.push(callback);
                if !self.ctx.qd.running {
                    self.ctx.qd.running = true;
                    self.ctx.qd.previous = None;
                    self.start_qd_wave();
                }
            }
            SysMsg::QdWave { wave } => {
                let pending = self.ctx.topo.children(me).len();
                self.ctx.qd.current = Some((wave, pending, 0, 0));
                if pending == 0 {
                    self.qd_report();
                }
            }
            SysMsg::QdReport {
                wave,
                created,
                processed,
            } => match &mut self.ctx.qd.current {
                Some((w, pending, c, p)) if *w == wave && *pending > 0 => {
                    *pending -= 1;
                    *c += created;
                    *p += processed;
                    if *pending == 0 {
                        self.qd_report();
                    }
                }
                _ => warn!(
                    pe = me,
                    "ignoring a stray quiescence report for wave {wave}"
                ),
            },
            SysMsg::ExitRequest { code } => {
                if !self.ctx.exiting {
                    self.ctx.send_sys(0, SysMsg::Exit { code });
                }
            }
            SysMsg::Exit { code } => {
                self.ctx.exiting = true;
                self.ctx.exit = Some(code);
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
                    let s = self.ctx.lb.entry(coll).or_default();
                    if s.step != step {
                        *s = LbStep {
                            step,
                            ..LbStep::default()
                        };
                    }
                    s.received += 1;
                    self.lb_check_done(coll);
                }
            }
            SysMsg::Death { coll, next_red } => match self.ctx.populations.get_mut(&coll) {
                Some(pop) => {
                    *pop.births.entry(next_red).or_insert(0) -= 1;
                    // Reductions waiting for the destroyed element may be complete now.
                    let open: Vec<u32> = self
                        .ctx
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
            SysMsg::LbCollect { coll, step } => self.lb_collect(coll, step),
            SysMsg::LbReport {
                coll,
                step,
                pe,
                objs,
            } => self.lb_report(coll, step, pe, objs),
            SysMsg::LbPlan { coll, step, moves } => self.lb_apply(coll, step, moves),
            SysMsg::LbDone {
                coll,
                step,
                bytes,
                staging_ns,
            } => self.lb_done(coll, step, bytes, staging_ns),
            SysMsg::LbResume { coll, step } => {
                debug!(
                    pe = me,
                    step,
                    "resuming {} after load balancing",
                    self.coll_name(coll)
                );
                self.ctx.lb.remove(&coll);
                if let Some(store) = self.stores.get_mut(&coll) {
                    store.resume_all(&mut self.ctx);
                }
            }
            SysMsg::OnRescale { callback } => self.ctx.rescale_callbacks.push(callback),
            SysMsg::RescaleBegin => self.rescale_begin(),
            SysMsg::RescaleStop(order) => self.ctx.stop_order = Some(order),
            SysMsg::Adopt(adoption) => self.adopt(adoption),
            SysMsg::Adopted if self.ctx.restoring.is_some() => {}
            SysMsg::Adopted => self.rescale_adopted(),
            SysMsg::CheckpointBegin => self.ctx.checkpoint_begin(),
            SysMsg::CheckpointWrite { dir } => self.checkpoint_write(&dir),
            SysMsg::CheckpointWritten { pe, result } => self.checkpoint_written(pe, result),
            SysMsg::Restore {
                coll,
                key,
                state,
                meta,
            } => self.restore_chare(coll, key, &state, meta),
            SysMsg::RestoreSent => self.ctx.send_sys(0, SysMsg::RestoreAck),
            SysMsg::RestoreAck => self.restore_acked(),
            SysMsg::Leaf(_) => error!(pe = me, "dropping a doubly wrapped runtime message"),
        }
    }

    fn create(&mut self, spec: CreateSpec) {
        self.create_as(spec, None);
    }

    /// Creates a collection's local part. `adopted`: a newcomer adopting a
    /// collection created before it joined, with the job's last broadcast
    /// and the first reduction new members join; arrays are then not
    /// constructed again (their elements exist elsewhere).
    fn create_as(&mut self, spec: CreateSpec, adopted: Option<(u64, u32, bool)>) {
        if self.ctx.pe == 0 && adopted.is_none() {
            self.ctx.specs.push(spec.clone());
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
        self.ctx.colls.insert(
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
            self.ctx.populations.insert(
                coll,
                Population {
                    base,
                    births: BTreeMap::new(),
                    next_open: 0,
                    done: BTreeMap::new(),
                },
            );
        }
        if let Some(held) = self.ctx.unknown.remove(&coll) {
            for env in held {
                self.ctx.release(me, env);
            }
        }
    }

    fn adopt_readonly(&mut self, entries: Vec<(u64, Vec<u8>)>) {
        // PE 0 of a running job set them itself; a restoring one did not.
        let entries: Vec<_> = entries
            .into_iter()
            .filter(|(id, _)| !self.ctx.readonly.contains_key(id))
            .collect();
        if !entries.is_empty() {
            let reg = self.ctx.node.registry.clone();
            let mut table = self
                .ctx
                .node
                .readonly
                .lock()
                .expect("readonly table poisoned");
            for (id, bytes) in entries {
                let Some(entry) = reg.readonlies.get(&id) else {
                    error!("readonly with id {id:#x} is not registered on this node; ignoring it");
                    continue;
                };
                let value = match table.entry(id) {
                    std::collections::hash_map::Entry::Occupied(o) => o.get().clone(),
                    std::collections::hash_map::Entry::Vacant(v) => match (entry.decode)(&bytes) {
                        Ok(value) => v.insert(value).clone(),
                        Err(e) => {
                            error!("readonly `{}` did not decode: {e}", entry.name);
                            continue;
                        }
                    },
                };
                self.ctx.readonly.insert(id, value);
            }
        }
        if !self.ctx.ready {
            self.ctx.ready = true;
            for env in std::mem::take(&mut self.ctx.held_in) {
                self.ctx.enqueue(env);
            }
        }
    }

    /// Applies what the last handler asked for.
    fn settle(&mut self) {
        for p in std::mem::take(&mut self.ctx.contributions) {
            self.gather(p);
        }
        for d in std::mem::take(&mut self.ctx.departures) {
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
                    self.ctx.cache.remove(&(coll, key));
                    self.ctx.send_sys(0, SysMsg::Death { coll, next_red });
                    self.recheck_partials(coll);
                }
            }
        }
    }

    /// After elements left, partial results that waited only for them can go up.
    pub(super) fn recheck_partials(&mut self, coll: CollId) {
        if self.ctx.pe == 0 {
            return;
        }
        let waiting: Vec<u32> = self
            .ctx
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
    fn gather(&mut self, p: Partial) {
        let key = (p.coll, p.no);
        let reg = self.ctx.node.registry.clone();
        let g = self.ctx.gathered.entry(key).or_insert_with(|| Gathered {
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
            Some(acc) => match combine(acc, p.value, g.reducer, &reg) {
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

    fn flush_partial(&mut self, coll: CollId, no: u32) {
        let Some(g) = self.ctx.gathered.remove(&(coll, no)) else {
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

    fn complete_if_done(&mut self, coll: CollId, no: u32) {
        let Some(pop) = self.ctx.populations.get_mut(&coll) else {
            error!("reduction over unknown collection {coll:#x}");
            return;
        };
        let expected = pop.expected(no);
        let Some(g) = self.ctx.gathered.get(&(coll, no)) else {
            return;
        };
        if g.count < expected {
            return;
        }
        if g.count > expected {
            error!("reduction {no} of collection {coll:#x} got {} contributions for {expected} elements", g.count);
        }
        let g = self.ctx.gathered.remove(&(coll, no)).expect("present");
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

    fn start_qd_wave(&mut self) {
        self.ctx.qd.wave += 1;
        let wave = self.ctx.qd.wave;
        self.ctx.send_sys(0, SysMsg::QdWave { wave });
    }

    fn qd_report(&mut self) {
        let Some((wave, _, c, p)) = self.ctx.qd.current.take() else {
            return;
        };
        let created = c + self.ctx.created;
        let processed = p + self.ctx.processed;
        match self.ctx.topo.parent(self.ctx.pe) {
            Some(parent) => self.ctx.send_sys(
                parent,
                SysMsg::QdReport {
                    wave,
                    created,
                    processed,
                },
            ),
            None => {
                // Root: quiescent when two consecutive waves saw the same, balanced counts.
                let now = (created, processed);
                tracing::trace!(wave, created, processed, "quiescence wave");
                if created == processed && self.ctx.qd.previous == Some(now) {
                    debug!("quiescence detected after wave {wave}");
                    self.ctx.qd.running = false;
                    self.ctx.qd.previous = None;
                    for cb in std::mem::take(&mut self.ctx.qd.callbacks) {
                        self.ctx.deliver_callback(&cb, &Value::Unit);
                    }
                } else {
                    self.ctx.qd.previous = (created == processed).then_some(now);
                    self.ctx.qd.next_wave_at = Some(Instant::now() + QD_WAVE_GAP);
                }
            }
        }
    }

    fn coll_name(&self, coll: CollId) -> String {
        format!("collection {coll:#x}")
    }
}
