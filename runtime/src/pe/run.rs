//! The scheduler loop: drain the inbox, run the most urgent message, and
//! when there is nothing to run, spin briefly, then park.

use std::sync::atomic::Ordering as AtOrd;
use std::time::{Duration, Instant};

use tracing::debug;

use super::{Inbox, LoopExit, Scheduler};
use crate::reduce::Value;

/// How long an idle PE busy-waits before it starts yielding its core.
const HOT_SPIN: Duration = Duration::from_micros(5);
/// Longest a parked PE sleeps before re-checking timers and the abort flag.
const PARK_LIMIT: Duration = Duration::from_millis(5);

impl Scheduler {
    /// Runs the scheduler loop until the job exits, the node aborts, or a
    /// rescale stops this PE (then the loop can be entered again).
    pub(crate) fn run(&mut self, inbox: &Inbox, spin: Duration) -> LoopExit {
        let _ = inbox.thread.set(std::thread::current());
        loop {
            while let Some(env) = inbox.queue.pop() {
                self.ctx.queue.push(env);
            }
            if let Some(env) = self.ctx.queue.pop() {
                self.dispatch(env);
                if let Some(code) = self.ctx.exit {
                    return LoopExit::Exit(code);
                }
                if self.ctx.rescaling.stop_order.is_some() {
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
            if let Some(cb) = self.ctx.timers.pop_due(now) {
                self.ctx.deliver_callback(&cb, &Value::Unit);
                continue;
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
                self.ctx.lb.idle += idle_from.elapsed();
                continue;
            }
            inbox.sleeping.store(true, AtOrd::SeqCst);
            if inbox.queue.is_empty() {
                let mut nap = PARK_LIMIT;
                for at in [self.ctx.qd.next_wave_at, self.ctx.timers.next()]
                    .into_iter()
                    .flatten()
                {
                    nap = nap.min(at.saturating_duration_since(Instant::now()));
                }
                std::thread::park_timeout(nap);
            }
            inbox.sleeping.store(false, AtOrd::SeqCst);
            self.ctx.lb.idle += idle_from.elapsed();
        }
    }

    /// What this PE still holds when the job is being ended from outside
    /// (a lost peer, the launcher's timeout): the first place to look when
    /// a job hangs.
    fn log_stuck_state(&self) {
        let c = &self.ctx;
        let unknown: usize = c.loc.unknown.values().map(Vec::len).sum();
        let waiting: usize = c.loc.waiting.values().map(Vec::len).sum();
        let partials: Vec<String> = c
            .red
            .gathered
            .iter()
            .map(|((coll, no), g)| format!("{coll:#x}#{no}:{}", g.count))
            .collect();
        // Debug level: on a lost node every PE of every survivor gets here,
        // and the loss itself is already said once (`lose_peer`).
        debug!(
            pe = c.pe,
            ready = c.startup.ready,
            queued = c.queue.len(),
            held_until_ready = c.startup.held_in.len(),
            held_for_collection = unknown,
            held_collections = ?c.loc.unknown.keys().collect::<Vec<_>>(),
            waiting_for_insertion = waiting,
            collections = c.loc.colls.len(),
            elements = self.stores.values().map(|s| s.locals().len()).sum::<usize>(),
            partial_reductions = ?partials,
            timers = c.timers.len(),
            created = c.qd.created,
            processed = c.qd.processed,
            "PE state when the job was ended"
        );
    }
}
