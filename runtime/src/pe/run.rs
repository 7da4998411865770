//! The scheduler loop: drain the inbox, run the most urgent message, and
//! when there is nothing to run, spin briefly, then sleep.
//!
//! An idle PE sleeps with no periodic re-check: what can make it work again
//! wakes it. A message from another PE, from the transport's receive thread
//! or from the node's main thread goes through [`Inbox::push`], which wakes
//! it only if it sleeps; its own timers (quiescence waves, `PeCtx::after`)
//! are the sleep's deadline; the node's abort (a lost peer, the launcher's
//! timeout) interrupts every PE (`NodeShared::abort`). A transport that the
//! PEs progress (TCP and UCX by default; `DUCTILE_TCP_PROGRESS` and
//! `DUCTILE_UCX_PROGRESS` say `thread` to keep it off the PEs) is
//! progressed while they spin and stays the PE's through its sleep, on
//! the descriptor the transport gives (TCP's connections, UCX's worker),
//! so a frame from another node wakes the PE, which receives it on its
//! own thread. While PEs run, the transport's own thread receives and
//! delivers through the inbox like any other.

use std::time::{Duration, Instant};

use tracing::debug;

use super::queue::Woken;
use super::{Inbox, LoopExit, Scheduler};
use crate::contention::Contention;
use crate::reduce::Value;
use crate::transport::Transport;

/// How an idle PE's spin ended.
struct Spun {
    /// Something came (else the spin is over with nothing).
    came: bool,
    /// The PE had started progressing the transport
    /// (`Transport::pe_spinning(true)`), and must say when it stops.
    progressing: bool,
    /// The spin's last reading of the clock: when it ended, to within one
    /// round of looks.
    at: Instant,
}

/// How long an idle PE busy-waits before it starts yielding its core.
const HOT_SPIN: Duration = Duration::from_micros(5);

/// While it busy-waits, a PE looks at its inbox this many times per
/// reading of the clock: a reading costs more than a look (about 25 ns
/// against a few on this project's VMs), and a message waits for the
/// round of looks in progress to notice it.
const LOOKS_PER_READING: u32 = 8;

impl Scheduler {
    /// Runs the scheduler loop until the job exits, the node aborts, or a
    /// rescale stops this PE (then the loop can be entered again).
    pub(crate) fn run(&mut self, inbox: &Inbox, spin: Duration) -> LoopExit {
        self.run_beside(inbox, spin, Contention::default())
    }

    /// [`Scheduler::run`], with what the PE knows of its core's contention.
    fn run_beside(&mut self, inbox: &Inbox, spin: Duration, contention: Contention) -> LoopExit {
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
            let woke = self.idle(inbox, now, spin, &contention);
            self.ctx.lb.idle += woke.saturating_duration_since(now);
        }
    }

    /// Nothing to run: spin (a reply from another PE of this node comes
    /// within microseconds), then sleep until a message, the earliest timer,
    /// or the node's abort wakes the PE. A transport the PE progressed
    /// while it spun and that has a descriptor to wait on (TCP, UCX) is
    /// watched through the sleep by one PE of the node, the last to hold
    /// it ([`Transport::pe_sleeps`]): a frame wakes that PE, which reads it
    /// here. The transport gets its own thread back before the PE runs
    /// anything.
    /// Returns when the PE stopped idling (a message that came during the
    /// spin costs no further reading of the clock).
    fn idle(
        &self,
        inbox: &Inbox,
        now: Instant,
        spin: Duration,
        contention: &Contention,
    ) -> Instant {
        let transport = self.ctx.node.transport_if_any();
        let Spun {
            came,
            mut progressing,
            mut at,
        } = self.spin_for(inbox, now, spin, transport, contention);
        if !came {
            // One PE of the node sleeps on the transport; the others let
            // go and sleep on their inboxes.
            if progressing && transport.is_some_and(|t| !t.pe_sleeps()) {
                progressing = false;
            }
            let fd = transport.filter(|_| progressing).and_then(|t| t.wait_fd());
            // The transport bounds the sleep on its descriptor where an
            // event may not come (`Transport::wait_limit`).
            let limit = fd
                .and(transport)
                .and_then(|t| t.wait_limit())
                .map(|d| Instant::now() + d);
            let deadline = [self.ctx.qd.next_wave_at, self.ctx.timers.next(), limit]
                .into_iter()
                .flatten()
                .min();
            if inbox.sleep(deadline, fd, || self.ctx.node.aborting()) == Woken::Transport {
                if let Some(t) = transport {
                    t.poll();
                }
            }
            at = Instant::now();
        }
        if let Some(t) = transport.filter(|_| progressing) {
            t.pe_spinning(false);
        }
        at
    }

    /// Waits up to `spin` from `now`, or from the transport's last
    /// progress, for the inbox to fill: busy for the
    /// first microseconds, then yielding the core, so that a transport's
    /// thread or another node's PE that shares it is not starved; beside a
    /// busy thread, whose yields showed it, the spin ends there (the sleep
    /// that follows is woken within microseconds, a yield gives the core
    /// away for a time slice: [`crate::contention`]). An idle
    /// PE progresses a transport that asks for it (TCP and UCX by default)
    /// meanwhile, from the transport's
    /// [`progress_after`](crate::transport::Transport::progress_after) on,
    /// telling it when it starts; the caller tells it when the PE stops.
    fn spin_for(
        &self,
        inbox: &Inbox,
        now: Instant,
        spin: Duration,
        transport: Option<&dyn Transport>,
        contention: &Contention,
    ) -> Spun {
        if spin.is_zero() {
            return Spun {
                came: !inbox.queue.is_empty(),
                progressing: false,
                at: now,
            };
        }
        let mut until = now + spin;
        let hot_until = now + HOT_SPIN;
        // When the PE starts progressing the transport.
        let from = transport.map(|t| now + t.progress_after());
        let mut progressing = false;
        let mut t = now;
        let mut looks = 0u32;
        // The transport moved since the last reading of the clock.
        let mut moved = false;
        loop {
            if !inbox.queue.is_empty() {
                return Spun {
                    came: true,
                    progressing,
                    at: t,
                };
            }
            if progressing && transport.is_some_and(|t| t.poll()) {
                moved = true;
                continue;
            }
            looks += 1;
            if t < hot_until && !looks.is_multiple_of(LOOKS_PER_READING) {
                std::hint::spin_loop();
                continue;
            }
            t = Instant::now();
            if std::mem::take(&mut moved) {
                // Work in flight that moves (a large message arriving in
                // pieces) keeps the PE polling: a sleep would cost a
                // wake-up per piece.
                until = t + spin;
            }
            if t >= until {
                return Spun {
                    came: false,
                    progressing,
                    at: t,
                };
            }
            if let (Some(from), Some(transport)) = (from, transport) {
                if !progressing && t >= from {
                    transport.pe_spinning(true);
                    progressing = true;
                    continue;
                }
            }
            if t < hot_until {
                std::hint::spin_loop();
            } else if contention.contended() {
                return Spun {
                    came: false,
                    progressing,
                    at: t,
                };
            } else {
                contention.yield_now();
            }
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
        spawn_pe(prepare, |pe, inbox| {
            pe.run(inbox, Duration::from_micros(100))
        })
    }

    /// [`start_pe`] with the PE's spin (`DUCTILE_SPIN_US`) set to `spin`,
    /// and blind to its core's contention: it spins as on a core of its
    /// own, whatever else the test machine runs.
    fn start_pe_spinning(
        spin: Duration,
        prepare: impl FnOnce(&mut Scheduler) + Send + 'static,
    ) -> (
        Arc<NodeShared>,
        u64,
        crossbeam_channel::Receiver<(LoopExit, Scheduler)>,
    ) {
        spawn_pe(prepare, move |pe, inbox| {
            pe.run_beside(inbox, spin, Contention::blind())
        })
    }

    fn spawn_pe(
        prepare: impl FnOnce(&mut Scheduler) + Send + 'static,
        run: impl FnOnce(&mut Scheduler, &Inbox) -> LoopExit + Send + 'static,
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
            let exit = run(&mut pe, &n.inboxes[0]);
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
        inbox.push(stray_envelope());
        wait_for("the message woke the PE and it slept again", || {
            inbox.sleeps() > sleeps
        });
        assert_eq!(inbox.wakeups(), 1, "one message, one wake-up");
        assert!(inbox.queue.is_empty(), "the PE took the message in");
        stop(&node, &rx);
    }

    /// The `Transport` methods of a test transport that sends nothing and
    /// connects to no one.
    macro_rules! no_wire {
        () => {
            fn address(&self) -> Vec<u8> {
                Vec::new()
            }
            fn send(
                &self,
                _: ductile_coordinator::proto::NodeId,
                _: crate::transport::Tag,
                _: &[&[u8]],
            ) -> Result<(), crate::transport::TransportError> {
                Ok(())
            }
            fn reconcile(
                &self,
                _: &crate::transport::View,
                _: ductile_coordinator::proto::NodeId,
            ) -> Result<crate::transport::Reconciled, crate::transport::TransportError> {
                Ok(Default::default())
            }
            fn shutdown(&self) {}
        };
    }

    /// A transport with a descriptor the test rings, as TCP's connections
    /// turn readable: its `poll` then delivers one message to PE 0, noting
    /// the thread that called it. `limit` is its `wait_limit`; with
    /// `held_by_another`, another PE of the node holds it whenever this one
    /// is about to sleep (`pe_sleeps` is false).
    struct Ringable {
        node: std::sync::OnceLock<std::sync::Weak<NodeShared>>,
        bell: nix::sys::eventfd::EventFd,
        polled_by: std::sync::Mutex<Vec<u64>>,
        /// `pe_spinning` calls, and `pe_sleeps` that let go (as false).
        spinning: std::sync::Mutex<Vec<bool>>,
        limit: Option<Duration>,
        held_by_another: bool,
        fds_asked: AtomicU64,
    }

    impl Ringable {
        fn new(limit: Option<Duration>) -> Arc<Ringable> {
            Self::held(limit, false)
        }

        fn held(limit: Option<Duration>, held_by_another: bool) -> Arc<Ringable> {
            use nix::sys::eventfd::{EfdFlags, EventFd};
            Arc::new(Ringable {
                node: std::sync::OnceLock::new(),
                bell: EventFd::from_flags(EfdFlags::EFD_NONBLOCK).unwrap(),
                polled_by: Default::default(),
                spinning: Default::default(),
                limit,
                held_by_another,
                fds_asked: AtomicU64::new(0),
            })
        }
    }

    /// A one-PE node ([`start_pe`]) whose transport is `ring`.
    fn start_pe_on(
        ring: &Arc<Ringable>,
    ) -> (
        Arc<NodeShared>,
        u64,
        crossbeam_channel::Receiver<(LoopExit, Scheduler)>,
    ) {
        let t = ring.clone();
        start_pe(move |pe| {
            let _ = t.node.set(Arc::downgrade(&pe.ctx.node));
            pe.ctx.node.set_transport_for_tests(t);
        })
    }

    /// A message for a collection the PE does not know: it holds it.
    fn stray_envelope() -> Envelope {
        Envelope {
            prio: 0,
            dest: Dest::Member { coll: 7 },
            payload: Payload::local(1u64),
            counted: false,
        }
    }

    impl Transport for Ringable {
        no_wire!();
        fn poll(&self) -> bool {
            // Non-blocking: an error when it was not rung.
            if self.bell.read().is_err() {
                return false;
            }
            self.polled_by.lock().unwrap().push(current_tid());
            let node = self.node.get().and_then(|n| n.upgrade()).expect("the node");
            node.inboxes[0].push(stray_envelope());
            true
        }
        fn pe_spinning(&self, spinning: bool) {
            self.spinning.lock().unwrap().push(spinning);
        }
        fn pe_sleeps(&self) -> bool {
            if self.held_by_another {
                self.spinning.lock().unwrap().push(false);
            }
            !self.held_by_another
        }
        fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
            use std::os::fd::AsFd;
            self.fds_asked.fetch_add(1, Ordering::SeqCst);
            Some(self.bell.as_fd())
        }
        fn wait_limit(&self) -> Option<Duration> {
            self.limit
        }
    }

    /// A PE that spun out keeps the transport through its sleep: what makes
    /// the transport's descriptor readable wakes it (no push, no wake-up
    /// paid by another thread), it reads on its own thread, and it hands the
    /// transport back before it runs what came.
    #[test]
    fn a_frame_for_a_sleeping_pe_wakes_it_through_the_transport_s_descriptor() {
        let ring = Ringable::new(None);
        let (node, tid, rx) = start_pe_on(&ring);
        let inbox = &node.inboxes[0];
        wait_for("the PE slept", || inbox.sleeps() >= 1);
        let sleeps = inbox.sleeps();
        assert_eq!(
            *ring.spinning.lock().unwrap(),
            [true],
            "the PE holds the transport through its sleep"
        );
        ring.bell.write(1).unwrap();
        wait_for("the PE read what came and slept again", || {
            inbox.sleeps() > sleeps
        });
        assert_eq!(
            *ring.polled_by.lock().unwrap(),
            [tid],
            "read on the PE's thread"
        );
        assert_eq!(inbox.wakeups(), 0, "no other thread had to wake the PE");
        assert!(inbox.queue.is_empty(), "the PE took the message in");
        assert_eq!(
            ring.spinning.lock().unwrap()[..3],
            [true, false, true],
            "the transport went back before the PE ran, then the PE spun again"
        );
        stop(&node, &rx);
        let spinning = ring.spinning.lock().unwrap();
        assert_eq!(
            spinning.last(),
            Some(&false),
            "given back at the end: {spinning:?}"
        );
        assert_eq!(
            spinning.iter().filter(|s| **s).count() * 2,
            spinning.len(),
            "every start has its stop: {spinning:?}"
        );
    }

    /// A PE that spun out while another PE of its node holds the transport
    /// lets go of it and sleeps on its inbox alone: the transport's
    /// descriptor is not asked for and does not wake it (each arrival woke
    /// every sleeping PE of the node, and over UCX shared memory a
    /// cross-node 8 B message took 9.2 µs with 2 PEs per node against 1.1),
    /// a message pushed to its inbox does, and it lets go again when it
    /// next sleeps.
    #[test]
    fn a_pe_sleeps_on_its_inbox_alone_while_another_holds_the_transport() {
        let ring = Ringable::held(None, true);
        let (node, _, rx) = start_pe_on(&ring);
        let inbox = &node.inboxes[0];
        wait_for("the PE slept", || inbox.sleeps() >= 1);
        let sleeps = inbox.sleeps();
        assert_eq!(
            ring.fds_asked.load(Ordering::SeqCst),
            0,
            "no descriptor asked for"
        );
        assert_eq!(
            *ring.spinning.lock().unwrap(),
            [true, false],
            "let go before the sleep"
        );
        ring.bell.write(1).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(inbox.sleeps(), sleeps, "the descriptor woke the PE");
        assert!(ring.polled_by.lock().unwrap().is_empty());
        inbox.push(stray_envelope());
        wait_for("the PE ran the message and slept again", || {
            inbox.sleeps() > sleeps
        });
        assert!(inbox.queue.is_empty(), "the PE took the message in");
        stop(&node, &rx);
        let spinning = ring.spinning.lock().unwrap();
        assert_eq!(spinning[..4], [true, false, true, false], "{spinning:?}");
        assert_eq!(
            spinning.iter().filter(|s| **s).count() * 2,
            spinning.len(),
            "every hold let go: {spinning:?}"
        );
        assert_eq!(
            ring.fds_asked.load(Ordering::SeqCst),
            0,
            "no descriptor asked for"
        );
    }

    /// Work in flight that no event announces (UCX: a send waiting for
    /// room in a peer's queue) bounds a sleep on the transport's
    /// descriptor: the PE wakes after the transport's `wait_limit` and
    /// progresses again, where without a limit it sleeps on.
    #[test]
    fn a_pe_sleeping_on_the_transport_wakes_after_its_wait_limit() {
        for limit in [None, Some(Duration::from_millis(10))] {
            let ring = Ringable::new(limit);
            let (node, _, rx) = start_pe_on(&ring);
            let inbox = &node.inboxes[0];
            wait_for("the PE slept", || inbox.sleeps() >= 1);
            let sleeps = inbox.sleeps();
            std::thread::sleep(Duration::from_millis(300));
            let more = inbox.sleeps() - sleeps;
            match limit {
                None => assert_eq!(more, 0, "the PE woke with nothing to wake it"),
                Some(_) => assert!(
                    more >= 5,
                    "with a 10 ms limit the PE slept again only {more} times in 300 ms"
                ),
            }
            stop(&node, &rx);
        }
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

    /// A transport whose work in flight moves one piece per `every`, from
    /// its first poll after `started` until `lasting` later (a large
    /// message arriving in pieces); it delivers nothing.
    struct Trickling {
        /// Never rung: the PE sleeps on it for `wait_limit` at most.
        idle: nix::sys::eventfd::EventFd,
        started: std::sync::Mutex<Option<Instant>>,
        last: std::sync::Mutex<Option<Instant>>,
        pieces: AtomicU64,
        every: Duration,
        lasting: Duration,
    }

    impl Transport for Trickling {
        no_wire!();
        fn poll(&self) -> bool {
            let Some(started) = *self.started.lock().unwrap() else {
                return false;
            };
            let now = Instant::now();
            let mut last = self.last.lock().unwrap();
            if now > started + self.lasting || last.is_some_and(|l| now - l < self.every) {
                return false;
            }
            *last = Some(now);
            self.pieces.fetch_add(1, Ordering::SeqCst);
            true
        }
        fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
            use std::os::fd::AsFd;
            Some(self.idle.as_fd())
        }
        fn wait_limit(&self) -> Option<Duration> {
            Some(Duration::from_millis(5))
        }
    }

    /// An idle PE keeps polling while the transport's work in flight
    /// moves, past its spin: a piece every 1 ms for 600 ms against a 20 ms
    /// spin, and the PE does not sleep until the pieces stop (sleeping
    /// between them would cost a wake-up per piece). Asleep, it polls
    /// again after the transport's 5 ms wait limit: a PE whose spin ended
    /// 20 ms after it went idle whatever moved would sleep about 12 times
    /// in 300 ms. (Blind to contention: on a loaded machine a PE stops
    /// spinning on purpose, `crate::contention`.)
    #[test]
    fn an_idle_pe_polls_on_while_the_transport_moves() {
        use nix::sys::eventfd::{EfdFlags, EventFd};
        let tr = Arc::new(Trickling {
            idle: EventFd::from_flags(EfdFlags::EFD_NONBLOCK).unwrap(),
            started: Default::default(),
            last: Default::default(),
            pieces: AtomicU64::new(0),
            every: Duration::from_millis(1),
            lasting: Duration::from_millis(600),
        });
        let t = tr.clone();
        let (node, _, rx) = start_pe_spinning(Duration::from_millis(20), move |pe| {
            pe.ctx.node.set_transport_for_tests(t);
        });
        let inbox = &node.inboxes[0];
        wait_for("the PE slept", || inbox.sleeps() >= 1);
        *tr.started.lock().unwrap() = Some(Instant::now());
        let sleeps = inbox.sleeps();
        std::thread::sleep(Duration::from_millis(300));
        // One sleep may have been on its way when the pieces started.
        let slept = inbox.sleeps() - sleeps;
        assert!(
            slept <= 1,
            "the PE slept {slept} times while the transport moved ({} pieces)",
            tr.pieces.load(Ordering::SeqCst)
        );
        assert!(
            tr.pieces.load(Ordering::SeqCst) > 30,
            "the PE polled through"
        );
        let sleeps = inbox.sleeps();
        wait_for("the PE slept again once the pieces stopped", || {
            inbox.sleeps() > sleeps + 5
        });
        stop(&node, &rx);
    }
}
