//! The scheduler loop: drain the inbox, run the most urgent message, and
//! when there is nothing to run, spin briefly, then sleep.
//!
//! An idle PE sleeps with no periodic re-check: what can make it work again
//! wakes it. A message from another PE, from the transport's receive thread
//! or from the node's main thread goes through [`Inbox::push`], which wakes
//! it only if it sleeps; its own timers (quiescence waves, `PeCtx::after`)
//! are the sleep's deadline; the node's abort (a lost peer, the launcher's
//! timeout) interrupts every PE (`NodeShared::abort`). A transport that the
//! PEs progress (TCP by default, UCX with `DUCTILE_UCX_PROGRESS=pe`) is
//! progressed only while they spin; while they run or sleep its own thread
//! delivers through the inbox like any other.

use std::time::{Duration, Instant};

use tracing::debug;

use super::{Inbox, LoopExit, Scheduler};
use crate::reduce::Value;

/// How long an idle PE busy-waits before it starts yielding its core.
const HOT_SPIN: Duration = Duration::from_micros(5);

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
            // Idle: spin (a reply from another PE of this node comes within
            // microseconds), then sleep until a message, the earliest
            // timer, or the node's abort wakes the PE.
            let idle_from = now;
            if !self.spin_for(inbox, now, spin) {
                let deadline = [self.ctx.qd.next_wave_at, self.ctx.timers.next()]
                    .into_iter()
                    .flatten()
                    .min();
                inbox.sleep(deadline, || self.ctx.node.aborting());
            }
            self.ctx.lb.idle += idle_from.elapsed();
        }
    }

    /// Waits up to `spin` from `now` for the inbox to fill: busy for the
    /// first microseconds, then yielding the core, so that a transport's
    /// thread or another node's PE that shares it is not starved. An idle
    /// PE progresses a transport that asks for it (TCP by default, UCX with
    /// `DUCTILE_UCX_PROGRESS=pe`) meanwhile, from the transport's
    /// [`progress_after`](crate::transport::Transport::progress_after) on, telling it when it starts and
    /// stops. True when something came.
    fn spin_for(&self, inbox: &Inbox, now: Instant, spin: Duration) -> bool {
        if spin.is_zero() {
            return !inbox.queue.is_empty();
        }
        let until = now + spin;
        let hot_until = now + HOT_SPIN;
        // The transport, and when the PE starts progressing it.
        let transport = self
            .ctx
            .node
            .transport_if_any()
            .map(|t| (now + t.progress_after(), t));
        let mut progressing = false;
        let came = loop {
            if !inbox.queue.is_empty() {
                break true;
            }
            if progressing && transport.as_ref().is_some_and(|(_, t)| t.poll()) {
                continue;
            }
            let t = Instant::now();
            if t >= until {
                break false;
            }
            if let Some((from, transport)) = &transport {
                if !progressing && t >= *from {
                    transport.pe_spinning(true);
                    progressing = true;
                    continue;
                }
            }
            if t < hot_until {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        };
        if let Some((_, t)) = transport.as_ref().filter(|_| progressing) {
            t.pe_spinning(false);
        }
        came
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::msg::{CallbackSpec, Dest, Envelope, Payload, Target};
    use crate::node::NodeShared;
    use crate::transport::{current_tid, thread_cpu_ns};

    /// Waits (at most 20 s, then fails) until `cond` holds.
    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let limit = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(Instant::now() < limit, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// A one-PE node whose PE runs its loop on a thread of its own:
    /// returns the node, the PE thread's kernel id, and what the loop
    /// returns (with the scheduler) once it ends.
    fn start_pe(
        prepare: impl FnOnce(&mut Scheduler) + Send + 'static,
    ) -> (
        Arc<NodeShared>,
        u64,
        crossbeam_channel::Receiver<(LoopExit, Scheduler)>,
    ) {
        let node = NodeShared::for_tests(1);
        let tid = Arc::new(AtomicU64::new(0));
        let (tx, rx) = crossbeam_channel::bounded(1);
        let (n, t) = (node.clone(), tid.clone());
        std::thread::spawn(move || {
            t.store(current_tid(), Ordering::SeqCst);
            let mut pe = Scheduler::new(n.clone(), n.current_topology(), 0);
            prepare(&mut pe);
            let exit = pe.run(&n.inboxes[0], Duration::from_micros(100));
            let _ = tx.send((exit, pe));
        });
        wait_for("the PE thread started", || tid.load(Ordering::SeqCst) != 0);
        let tid = tid.load(Ordering::SeqCst);
        (node, tid, rx)
    }

    fn stop(
        node: &NodeShared,
        rx: &crossbeam_channel::Receiver<(LoopExit, Scheduler)>,
    ) -> Scheduler {
        node.abort("the test is over".into());
        let (exit, pe) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the abort woke the sleeping PE and ended its loop");
        assert_eq!(exit, LoopExit::Aborted);
        pe
    }

    /// An idle PE really sleeps: over 1 s idle its thread uses under 1%
    /// of that in CPU time (a PE that re-checked every few ms, spinning
    /// each time, used about 2%; one that spun used 100%). A message then
    /// wakes it with one wake-up, and the abort ends its loop.
    #[test]
    fn an_idle_pe_sleeps_until_a_message_or_the_abort_wakes_it() {
        let (node, tid, rx) = start_pe(|_| {});
        let inbox = &node.inboxes[0];
        wait_for("the PE slept", || inbox.sleeps() >= 1);
        let sleeps = inbox.sleeps();
        let cpu0 = thread_cpu_ns(tid).expect("the PE thread's schedstat");
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs(1));
        let cpu = thread_cpu_ns(tid).expect("the PE thread's schedstat") - cpu0;
        let elapsed = t0.elapsed().as_nanos() as u64;
        assert!(
            cpu < elapsed / 100,
            "an idle PE used {cpu} ns of CPU in {elapsed} ns"
        );
        assert_eq!(inbox.sleeps(), sleeps, "nothing woke the idle PE");
        assert_eq!(inbox.wakeups(), 0);
        // For a collection this PE does not know: it holds the message.
        inbox.push(Envelope {
            prio: 0,
            dest: Dest::Member { coll: 7 },
            payload: Payload::local(1u64),
            counted: false,
        });
        wait_for("the message woke the PE and it slept again", || {
            inbox.sleeps() > sleeps
        });
        assert_eq!(inbox.wakeups(), 1, "one message, one wake-up");
        assert!(inbox.queue.is_empty(), "the PE took the message in");
        stop(&node, &rx);
    }

    /// A sleeping PE wakes for its earliest timer, runs it, and sleeps again.
    #[test]
    fn a_timer_wakes_a_sleeping_pe() {
        let (node, _, rx) = start_pe(|pe| {
            let ignore = CallbackSpec {
                target: Target::Ignore,
                prefix: Vec::new(),
            };
            pe.ctx
                .timers
                .add(Instant::now() + Duration::from_millis(200), ignore);
        });
        let inbox = &node.inboxes[0];
        wait_for("the PE slept, woke for its timer and slept again", || {
            inbox.sleeps() >= 2
        });
        assert_eq!(inbox.wakeups(), 0, "no message woke it");
        let pe = stop(&node, &rx);
        assert_eq!(pe.ctx.timers.len(), 0, "the timer ran");
    }
}
