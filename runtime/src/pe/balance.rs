//! One load-balancing step of one array, as seen by each PE and by PE 0.
//!
//! 1. Every element called `at_sync`: that is a reduction, whose completion
//!    at PE 0 broadcasts `LbCollect`.
//! 2. Every PE measures its speed, reports its elements' loads and its own
//!    background and idle time to PE 0 (`LbReport`), and resets its counters.
//! 3. PE 0 runs the configured strategy on the statistics (dumping them when
//!    asked) and broadcasts the plan (`LbPlan`).
//! 4. Every PE packs and sends the elements the plan moves away, counts the
//!    ones it receives, and tells PE 0 when both are complete (`LbDone`).
//! 5. PE 0 broadcasts `LbResume`; every PE calls `resume_from_sync` on its
//!    elements.
//!
//! Element loads are wall seconds of entry methods on the element's current
//! PE, including any emulated slowdown, which is what the strategies' cost
//! model expects. A PE's speed is measured by timing a fixed kernel under the
//! same conditions as entry methods (see [`calibrate`]), times the share of
//! a core its node's CPU quota leaves it (`quota.rs`), which a kernel that
//! short does not see.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use tracing::{debug, error, info};

use super::{misrouted, PeState, Scheduler};
use crate::lb::stats::{LbStats, ObjId, ObjStat, PeStat};
use crate::lb::strategy::{Assignment, CostModel};
use crate::msg::{CollId, IndexKey};
use crate::node::NodeShared;
use crate::system::SysMsg;
use crate::topo::Pe as PeId;

/// Work of the calibration kernel: a dependent integer chain, so the time
/// measures the core (and any emulated slowdown), not memory.
const CALIBRATION_STEPS: u64 = 200_000;

/// Times the calibration kernel on this PE (best of three, charged like an
/// entry method) and returns a speed: kernels per second, comparable across PEs.
fn calibrate(charge: &mut dyn FnMut(Duration) -> Duration) -> f64 {
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        let mut x = black_box(0x9E37_79B9_7F4A_7C15u64);
        for i in 0..CALIBRATION_STEPS {
            x = x.rotate_left(7) ^ i.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        }
        black_box(x);
        best = best.min(charge(start.elapsed()));
    }
    1.0 / best.as_secs_f64().max(1e-9)
}

/// A PE's part in one load-balancing step of one array.
#[derive(Default)]
pub(super) struct LbStep {
    pub(super) step: u64,
    /// Elements the plan sends here (known once the plan arrived).
    pub(super) expected: Option<usize>,
    /// Elements received for this step (they can arrive before the plan).
    pub(super) received: usize,
    pub(super) bytes_sent: u64,
    pub(super) done: bool,
}

/// PE 0's bookkeeping of one load-balancing step of one array.
pub(super) struct LbRoot {
    pub(super) step: u64,
    pub(super) started: Instant,
    pub(super) reports: Vec<(PeStat, Vec<ObjStat>)>,
    pub(super) planned: Option<Instant>,
    /// A step a rescale runs (evacuation, populating newcomers): the elements
    /// are not at sync, so nothing resumes them.
    pub(super) forced: bool,
    /// PEs the plan must empty.
    pub(super) leaving: Vec<PeId>,
    /// The first step of a restored job: its elements were placed by the
    /// restore, not measured where they are, so it balances like a
    /// rescale's step (`+lb-rescale`, every move carried out).
    pub(super) restore: bool,
    pub(super) migrations: u64,
    pub(super) summary: String,
    pub(super) done: u32,
    pub(super) bytes: u64,
    /// Device staging time the PEs reported (GPU chares' buffers).
    pub(super) staging_ns: u64,
}

/// A PE's load-balancing state: its measurements and the steps in progress.
pub(super) struct Balancing {
    /// 1 / emulated speed: how much longer entry methods take here.
    pub(super) slowdown: f64,
    /// The share of a core the node's CPU quota left this PE at the last
    /// step (logged when it changes).
    pub(super) quota_share: Option<f64>,
    /// Time in entry methods and idle since the last statistics report.
    pub(super) busy: Duration,
    pub(super) idle: Duration,
    pub(super) measured_since: Instant,
    /// This PE's part of each array's step in progress.
    pub(super) here: HashMap<CollId, LbStep>,
    /// Root: each array's step in progress.
    pub(super) roots: HashMap<CollId, LbRoot>,
    /// Root: each array's loads and speeds at earlier steps (smoothing).
    pub(super) history: HashMap<CollId, crate::lb::steady::History>,
    /// Root: each array's last step number.
    pub(super) steps: HashMap<CollId, u64>,
    /// Root, with `+lb-period`: when each collection was last balanced.
    pub(super) last_balanced: HashMap<CollId, Instant>,
}

impl Balancing {
    /// `+pe-speed` emulates a slower PE.
    pub(super) fn new(node: &NodeShared, pe: PeId) -> Self {
        Balancing {
            slowdown: node
                .options
                .pe_speed
                .get(&pe)
                .map_or(1.0, |speed| 1.0 / speed),
            quota_share: None,
            busy: Duration::ZERO,
            idle: Duration::ZERO,
            measured_since: Instant::now(),
            here: HashMap::new(),
            roots: HashMap::new(),
            history: HashMap::new(),
            steps: HashMap::new(),
            last_balanced: HashMap::new(),
        }
    }
}

impl PeState {
    /// Root: starts a load-balancing step of `coll` by collecting statistics.
    pub(super) fn lb_start(&mut self, coll: CollId, forced: bool, leaving: Vec<PeId>) {
        let step = self.lb.steps.entry(coll).or_insert(0);
        *step += 1;
        let step = *step;
        self.lb.roots.insert(
            coll,
            LbRoot {
                step,
                started: Instant::now(),
                reports: Vec::new(),
                planned: None,
                forced,
                leaving,
                restore: false,
                migrations: 0,
                summary: String::new(),
                done: 0,
                bytes: 0,
                staging_ns: 0,
            },
        );
        self.send_sys(0, SysMsg::LbCollect { coll, step });
    }

    /// Root: every element of `coll` is at sync (its `at_sync` reduction
    /// completed): a checkpoint, a rescale or a buddy checkpoint may take
    /// the step, `+lb-period` may skip it, otherwise a step starts.
    pub(super) fn lb_sync(&mut self, coll: CollId) {
        if self.checkpoint_at_sync(coll) {
            return;
        }
        if let Some(r) = &mut self.rescaling.root {
            // The rescale runs its own steps; this one waits for it.
            r.defer_sync(coll);
            return;
        }
        if self.buddy_at_sync(coll) {
            return;
        }
        self.lb_periodic(coll);
    }

    /// Root: a buddy checkpoint held `coll`'s sync point and is over: a
    /// rescale requested meanwhile takes the step, or it runs.
    pub(super) fn lb_after_checkpoint(&mut self, coll: CollId) {
        if let Some(r) = &mut self.rescaling.root {
            r.defer_sync(coll);
            return;
        }
        self.lb_periodic(coll);
    }

    /// Root: `+lb-period` may skip the step; otherwise it starts.
    fn lb_periodic(&mut self, coll: CollId) {
        if let Some(period) = self.node.options.lb_period {
            let last = self
                .lb
                .last_balanced
                .get(&coll)
                .copied()
                .unwrap_or(self.lb.measured_since);
            if last.elapsed() < period {
                // Periodic balancing: too soon, resume without a step.
                let step = self.lb.steps.get(&coll).copied().unwrap_or(0);
                self.send_sys(0, SysMsg::LbResume { coll, step });
                return;
            }
            self.lb.last_balanced.insert(coll, Instant::now());
        }
        self.lb_start(coll, false, Vec::new());
    }
}

impl Scheduler {
    /// The span of this PE's part `phase` of LB step `step`: in the logs,
    /// `lb_step{epoch step pe phase}`, timed when it closes.
    fn lb_span(&self, phase: &'static str, step: u64) -> tracing::span::EnteredSpan {
        tracing::debug_span!(
            "lb_step",
            epoch = self.ctx.topo.epoch(),
            step,
            pe = self.ctx.pe,
            phase
        )
        .entered()
    }

    pub(super) fn lb_collect(&mut self, coll: CollId, step: u64) {
        let me = self.ctx.pe;
        let _span = self.lb_span("collect", step);
        let busy_before = self.ctx.lb.busy;
        // The kernel runs between a CPU quota's throttlings: the share of
        // the core the quota leaves this PE scales what it measured.
        let share = crate::quota::pe_share(self.ctx.topo.local_pes());
        if self.ctx.lb.quota_share != Some(share) {
            info!(pe = me, share, "the CPU quota leaves this PE {share:.3} of a core");
            self.ctx.lb.quota_share = Some(share);
        }
        let speed = calibrate(&mut |d| self.ctx.charge(d)) * share;
        // The calibration is the runtime's work, not an element's.
        self.ctx.lb.busy = busy_before;
        let loads = self
            .stores
            .get_mut(&coll)
            .map(|s| s.loads(true))
            .unwrap_or_default();
        let wall = self.ctx.lb.measured_since.elapsed().as_secs_f64();
        let idle = self.ctx.lb.idle.as_secs_f64();
        let object_time: f64 = loads.iter().map(|(_, l)| l).sum();
        let background = (wall - idle - object_time).max(0.0);
        self.ctx.lb.busy = Duration::ZERO;
        self.ctx.lb.idle = Duration::ZERO;
        self.ctx.lb.measured_since = Instant::now();
        // Group and nodegroup members, and main, stay where they are.
        let migratable = self.ctx.is_migratable(coll);
        let objs = loads
            .into_iter()
            .map(|(key, load)| ObjStat {
                id: ObjId::new(coll, key),
                pe: me,
                load,
                bytes: 0,
                migratable,
            })
            .collect();
        let pe = PeStat {
            pe: me,
            speed,
            background,
            idle,
            leaving: false,
        };
        let s = self.ctx.lb.here.entry(coll).or_default();
        if s.step != step {
            *s = LbStep {
                step,
                ..LbStep::default()
            };
        }
        self.ctx.send_sys(
            0,
            SysMsg::LbReport {
                coll,
                step,
                pe,
                objs,
            },
        );
    }

    pub(super) fn lb_report(&mut self, coll: CollId, step: u64, pe: PeStat, objs: Vec<ObjStat>) {
        let _span = self.lb_span("report", step);
        let npes = self.ctx.num_pes() as usize;
        let Some(root) = self.ctx.lb.roots.get_mut(&coll).filter(|r| r.step == step) else {
            error!("ignoring load statistics for an unknown step {step} of collection {coll:#x}");
            return;
        };
        root.reports.push((pe, objs));
        if root.reports.len() < npes {
            return;
        }
        let mut stats = LbStats {
            step,
            objs: Vec::new(),
            pes: Vec::new(),
        };
        for (pe, objs) in root.reports.drain(..) {
            stats.pes.push(pe);
            stats.objs.extend(objs);
        }
        stats.pes.sort_by_key(|p| p.pe);
        let forced = root.forced;
        let restore = root.restore;
        for p in &mut stats.pes {
            p.leaving = root.leaving.contains(&p.pe);
        }
        let options = self.ctx.node.options.clone();
        // Every step balances averaged measurements (lb::steady); after a
        // rescale's step the PEs are renumbered, so their speeds start over.
        let history = self.ctx.lb.history.entry(coll).or_default();
        history.smooth(&mut stats, options.lb_smoothing);
        if forced || restore {
            history.forget_pes();
        }
        let strategy = if forced || restore {
            options.rescale_strategy.clone()
        } else {
            options.strategy.clone()
        };
        if let Some(dir) = &options.lb_dump {
            let path = dir.join(format!("lb-{coll:x}-{step}.json"));
            if let Err(e) = std::fs::create_dir_all(dir)
                .map_err(|e| e.to_string())
                .and_then(|_| stats.dump(&path).map_err(|e| e.to_string()))
            {
                error!("cannot dump load statistics to {}: {e}", path.display());
            }
        }
        let solve_start = Instant::now();
        let plan = match strategy.solve(&stats) {
            Ok(plan) => plan,
            Err(e) => {
                error!("load balancing step {step} of collection {coll:#x} failed ({}): {e}; keeping the placement", strategy.name());
                Assignment::current(&stats)
            }
        };
        let solve_ms = solve_start.elapsed().as_secs_f64() * 1e3;
        if let Some(dir) = &options.lb_dump {
            // The plan beside its statistics, so a replay can be checked against it.
            let path = dir.join(format!("lb-{coll:x}-{step}.plan.json"));
            let written = serde_json::to_string(&plan)
                .map_err(|e| e.to_string())
                .and_then(|j| std::fs::write(&path, j).map_err(|e| e.to_string()));
            if let Err(e) = written {
                error!(
                    "cannot dump the load-balancing plan to {}: {e}",
                    path.display()
                );
            }
        }
        let moves: Vec<(IndexKey, PeId, PeId)> = plan
            .migrations(&stats)
            .iter()
            .map(|m| (m.id.index, m.from, m.to))
            .collect();
        let ratio = |a: &Assignment| {
            a.max_avg_ratio(&stats, CostModel::RateAware)
                .unwrap_or(f64::NAN)
        };
        let before = ratio(&Assignment::current(&stats));
        let after = ratio(&plan);
        // With no element's load measured (every one discounted it:
        // `Ctx::discount_load`), the ratios weigh only the PEs' background,
        // and the strategy's placement by count is all there is to go by.
        let unmeasured = stats
            .objs
            .iter()
            .filter(|o| o.migratable)
            .all(|o| o.load == 0.0);
        let worth = forced
            || restore
            || unmeasured
            || !strategy.balances()
            || crate::lb::steady::worth_moving(before, after, options.lb_min_gain);
        let moves = if worth { moves } else { Vec::new() };
        let root = self.ctx.lb.roots.get_mut(&coll).expect("present");
        root.planned = Some(Instant::now());
        root.migrations = moves.len() as u64;
        root.summary = format!(
            "lb step={step} strategy={} objs={} pes={} migrations={} max_avg_before={before:.4} max_avg_after={after:.4} strategy_ms={solve_ms:.3} collect_ms={:.3}{}",
            strategy.name(),
            stats.objs.len(),
            stats.pes.len(),
            moves.len(),
            (solve_start - root.started).as_secs_f64() * 1e3,
            if worth { "" } else { " kept=gain_below_min" },
        );
        debug!("{}", root.summary);
        self.ctx.send_sys(0, SysMsg::LbPlan { coll, step, moves });
    }

    pub(super) fn lb_apply(&mut self, coll: CollId, step: u64, moves: Vec<(IndexKey, PeId, PeId)>) {
        let _span = self.lb_span("migrate", step);
        let me = self.ctx.pe;
        let mut sent = 0u64;
        let mut outgoing = Vec::new();
        if let Some(store) = self.stores.get_mut(&coll) {
            for &(key, from, to) in &moves {
                if from != me {
                    continue;
                }
                match store.pack(key) {
                    Some((state, meta)) => outgoing.push((key, to, state, meta)),
                    None => error!(pe = me, "the plan moves element {key:#x} of collection {coll:#x}, which is not here"),
                }
            }
        }
        let moved_out = !outgoing.is_empty();
        for (key, to, state, meta) in outgoing {
            sent += state.len() as u64;
            self.ctx
                .send_migrant(coll, key, to, state, meta, Some(step));
        }
        if moved_out {
            // Partial results that waited only for the elements that left can go up.
            self.recheck_partials(coll);
        }
        let expected = moves.iter().filter(|(_, _, to)| *to == me).count();
        let s = self.ctx.lb.here.entry(coll).or_default();
        if s.step != step {
            *s = LbStep {
                step,
                ..LbStep::default()
            };
        }
        s.expected = Some(expected);
        s.bytes_sent = sent;
        self.lb_check_done(coll);
    }

    pub(super) fn lb_check_done(&mut self, coll: CollId) {
        let Some(s) = self.ctx.lb.here.get_mut(&coll) else {
            return;
        };
        if s.done || s.expected != Some(s.received) {
            return;
        }
        s.done = true;
        let (step, bytes) = (s.step, s.bytes_sent);
        // Device buffers of the chares that left or arrived were staged on
        // this thread since its last report.
        let staging_ns = crate::gpu::take_staging_ns();
        self.ctx.send_sys(
            0,
            SysMsg::LbDone {
                coll,
                step,
                bytes,
                staging_ns,
            },
        );
    }

    pub(super) fn lb_done(&mut self, coll: CollId, step: u64, bytes: u64, staging_ns: u64) {
        let _span = self.lb_span("done", step);
        let npes = self.ctx.num_pes();
        let report = self.ctx.node.options.lb_report;
        let Some(root) = self.ctx.lb.roots.get_mut(&coll).filter(|r| r.step == step) else {
            error!(
                "ignoring a migration report for an unknown step {step} of collection {coll:#x}"
            );
            return;
        };
        root.done += 1;
        root.bytes += bytes;
        root.staging_ns += staging_ns;
        if root.done < npes {
            return;
        }
        let migration_ms = root
            .planned
            .map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        let total_ms = root.started.elapsed().as_secs_f64() * 1e3;
        let line = format!(
            "{} bytes={} migration_ms={migration_ms:.3} total_ms={total_ms:.3}",
            root.summary, root.bytes
        );
        info!("{line}");
        crate::activity::lb_step(root.forced, total_ms / 1e3, root.migrations, root.bytes);
        if report {
            println!("{line}");
        }
        let root = self.ctx.lb.roots.remove(&coll).expect("present");
        if root.forced {
            // A rescale's step: the elements never stopped, nothing resumes.
            self.rescale_lb_done(coll, root.migrations, root.staging_ns);
        } else {
            self.ctx.send_sys(0, SysMsg::LbResume { coll, step });
            if self.ctx.ckpt.restoring.is_some() {
                self.restore_balanced(coll, root.migrations);
            }
            if self.ctx.rescaling.root.is_some() {
                // A rescale was waiting for this step to end.
                self.rescale_advance();
            }
        }
    }

    /// An element migrated here for LB step `step` of `coll`.
    pub(super) fn lb_received(&mut self, coll: CollId, step: u64) {
        let s = self.ctx.lb.here.entry(coll).or_default();
        if s.step != step {
            *s = LbStep {
                step,
                ..LbStep::default()
            };
        }
        s.received += 1;
        self.lb_check_done(coll);
    }

    /// The load-balancing service's runtime messages.
    pub(super) fn on_balance(&mut self, msg: SysMsg) {
        match msg {
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
                    pe = self.ctx.pe,
                    step,
                    "resuming {} after load balancing",
                    self.coll_name(coll)
                );
                self.ctx.lb.here.remove(&coll);
                if let Some(store) = self.stores.get_mut(&coll) {
                    store.resume_all(&mut self.ctx);
                }
            }
            other => misrouted(self.ctx.pe, "load-balancing", &other),
        }
    }
}
