//! A PE's queues: the inbox other threads push to, and the run queue the
//! scheduler loop takes the next message from (a FIFO for priority 0, a heap
//! for the others: lower first, oldest first among equals).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering as AtOrd};
use std::time::Instant;

use crossbeam_queue::SegQueue;
use nix::poll::{PollFd, PollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::time::TimeSpec;

use crate::msg::Envelope;

/// A PE's incoming queue, shared with the threads that push to it (other
/// PEs of the node, the transport's receive thread, the node's main
/// thread), and the PE's sleep.
///
/// A push is one lock-free push and, only if the PE sleeps, one wake-up
/// (a write to the inbox's eventfd). No wake-up is lost: the PE sets
/// `sleeping`, then (after a SeqCst fence) looks at the queue once more
/// before it blocks; a sender pushes, then (after a SeqCst fence) reads
/// `sleeping`. Of two such fences one comes first, so either the PE sees
/// the message or the sender sees the flag. The first sender to see the
/// flag clears it and wakes the PE, so a burst of pushes to a sleeping PE
/// costs one wake-up, not one each.
///
/// The PE sleeps in `ppoll` on the eventfd and, when it has one, a file
/// descriptor of the transport that turns readable when frames arrive
/// ([`Transport::wait_fd`](crate::transport::Transport::wait_fd)): a frame
/// from another node then wakes the PE itself, which reads it, with no
/// thread between.
pub(crate) struct Inbox {
    pub(super) queue: SegQueue<Envelope>,
    sleeping: AtomicBool,
    /// Written to wake the PE (non-blocking: a full counter is a PE woken
    /// already).
    wake: EventFd,
    /// Wake-ups senders paid (a push that found the PE asleep).
    wakeups: AtomicU64,
    /// Times the PE blocked.
    sleeps: AtomicU64,
}

/// What ended a PE's [`Inbox::sleep`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// A push, an interrupt, the deadline, a signal, or no sleep at all
    /// (work waited, or the stop condition held).
    Inbox,
    /// The transport's descriptor turned readable: frames to read.
    Transport,
}

impl Inbox {
    /// An empty inbox; an error when no eventfd can be created (out of
    /// file descriptors).
    pub(crate) fn new() -> io::Result<Self> {
        let wake = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Inbox {
            queue: SegQueue::new(),
            sleeping: AtomicBool::new(false),
            wake,
            wakeups: AtomicU64::new(0),
            sleeps: AtomicU64::new(0),
        })
    }

    /// Empties the queue (the PE is stopped).
    pub(crate) fn take_all(&self) -> Vec<Envelope> {
        std::iter::from_fn(|| self.queue.pop()).collect()
    }

    /// Queues `env` and wakes the PE if it sleeps.
    #[inline]
    pub(crate) fn push(&self, env: Envelope) {
        self.queue.push(env);
        fence(AtOrd::SeqCst);
        // The plain load keeps the common case (the PE is awake) free of a
        // write to the line the PE polls; the swap picks one waker.
        if self.sleeping.load(AtOrd::Relaxed) && self.sleeping.swap(false, AtOrd::Relaxed) {
            self.wakeups.fetch_add(1, AtOrd::Relaxed);
            self.ring();
        }
    }

    /// Wakes the PE whatever it waits for, so that it looks at the node's
    /// flags (the node is aborting). The caller sets its flag, then a
    /// SeqCst fence, then calls this; `sleep` checks `stop` after its own.
    pub(crate) fn interrupt(&self) {
        self.ring();
    }

    fn ring(&self) {
        // EAGAIN: the counter is full, the PE has a wake-up waiting.
        let _ = self.wake.write(1);
    }

    /// Blocks the PE's own thread until a push, an `interrupt`, `until`
    /// (none: no deadline) or, with `transport`, that descriptor turning
    /// readable, unless the queue holds something or `stop()` is already
    /// true. May return early (a spurious wake-up, a signal): the caller
    /// loops.
    pub(crate) fn sleep(
        &self,
        until: Option<Instant>,
        transport: Option<BorrowedFd<'_>>,
        stop: impl Fn() -> bool,
    ) -> Woken {
        self.sleeping.store(true, AtOrd::Relaxed);
        fence(AtOrd::SeqCst);
        let mut woken = Woken::Inbox;
        if self.queue.is_empty() && !stop() {
            let nap = until.map(|at| at.saturating_duration_since(Instant::now()));
            if nap != Some(std::time::Duration::ZERO) {
                self.sleeps.fetch_add(1, AtOrd::Relaxed);
                woken = self.block(nap.map(TimeSpec::from_duration), transport);
            }
        }
        self.sleeping.store(false, AtOrd::Relaxed);
        woken
    }

    /// `ppoll` on the eventfd and the transport's descriptor; drains the
    /// eventfd if it rang.
    fn block(&self, timeout: Option<TimeSpec>, transport: Option<BorrowedFd<'_>>) -> Woken {
        let mut fds = [
            PollFd::new(self.wake.as_fd(), PollFlags::POLLIN),
            PollFd::new(transport.unwrap_or(self.wake.as_fd()), PollFlags::POLLIN),
        ];
        let watched = if transport.is_some() { 2 } else { 1 };
        match nix::poll::ppoll(&mut fds[..watched], timeout, None) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                // Not expected (bad descriptors); a sleep that cannot block
                // must not spin the caller at full speed unseen, nor say so
                // a thousand times a second: once per process.
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, AtOrd::Relaxed) {
                    tracing::error!("a PE could not sleep (ppoll: {e}); it naps 1 ms instead");
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let readable = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
        if readable(&fds[0]) {
            let _ = self.wake.read();
        }
        if watched == 2 && readable(&fds[1]) {
            Woken::Transport
        } else {
            Woken::Inbox
        }
    }

    /// Wake-ups senders paid so far (a push that found the PE asleep).
    pub(crate) fn wakeups(&self) -> u64 {
        self.wakeups.load(AtOrd::Relaxed)
    }

    /// Times the PE blocked so far.
    pub(crate) fn sleeps(&self) -> u64 {
        self.sleeps.load(AtOrd::Relaxed)
    }
}

pub(super) struct Queued {
    pub(super) prio: i32,
    pub(super) seq: u64,
    pub(super) env: Envelope,
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

/// The messages a PE will run, in order.
#[derive(Default)]
pub(super) struct RunQueue {
    pub(super) fifo: VecDeque<Envelope>,
    pub(super) heap: BinaryHeap<Queued>,
    seq: u64,
}

impl RunQueue {
    /// Queues `env` behind everything of its priority.
    #[inline]
    pub(super) fn push(&mut self, env: Envelope) {
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

    /// The most urgent message: negative priorities before the FIFO, the
    /// FIFO before positive ones.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<Envelope> {
        match self.heap.peek() {
            Some(q) if q.prio < 0 || self.fifo.is_empty() => self.heap.pop().map(|q| q.env),
            _ => self.fifo.pop_front(),
        }
    }

    /// How many messages wait.
    pub(super) fn len(&self) -> usize {
        self.fifo.len() + self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::msg::{Dest, Payload};

    fn message(n: u64) -> Envelope {
        Envelope {
            prio: 0,
            dest: Dest::Member { coll: 1 },
            payload: Payload::local(n),
            counted: false,
        }
    }

    /// Many senders race the receiver going to sleep: every message is
    /// received, the receiver never sleeps through one (a lost wake-up
    /// would leave it blocked with no deadline: the test then fails at its
    /// limit instead of hanging), and a wake-up is paid per sleep, not per
    /// push: never more wake-ups than the receiver's calls to `sleep`.
    #[test]
    fn no_wake_up_is_lost_when_pushes_race_the_receiver_going_to_sleep() {
        const SENDERS: u64 = 4;
        const EACH: u64 = 20_000;
        let inbox = Arc::new(Inbox::new().unwrap());
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let rx_inbox = inbox.clone();
        std::thread::spawn(move || {
            let (mut got, mut sum, mut calls) = (0u64, 0u64, 0u64);
            while got < SENDERS * EACH {
                while let Some(env) = rx_inbox.queue.pop() {
                    got += 1;
                    sum += env.payload.take::<u64>().expect("a u64");
                }
                if got < SENDERS * EACH {
                    calls += 1;
                    rx_inbox.sleep(None, None, || false);
                }
            }
            let _ = done_tx.send((sum, calls));
        });
        let senders: Vec<_> = (0..SENDERS)
            .map(|s| {
                let inbox = inbox.clone();
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        inbox.push(message(s * EACH + i));
                        // Pauses let the receiver drain the queue and go to
                        // sleep, so that pushes keep meeting it there.
                        if i % 64 == 0 {
                            std::thread::sleep(Duration::from_micros(20));
                        } else if i % 8 == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for s in senders {
            s.join().expect("a sender");
        }
        let n = SENDERS * EACH;
        let (sum, calls) = done_rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the receiver got every message (a lost wake-up leaves it asleep)");
        assert_eq!(sum, n * (n - 1) / 2, "every message once");
        assert!(
            inbox.sleeps() > 0,
            "the receiver slept while messages came (else the race was not tested)"
        );
        // A wake-up is paid only by the first push that finds the flag
        // set, and each call to `sleep` sets it once: at most one wake-up
        // per call, however many pushes met the sleeping PE. (How many
        // calls there are depends on the scheduler: under load the
        // receiver may sleep after nearly every message.)
        assert!(
            inbox.wakeups() <= calls,
            "{} wake-ups for {calls} calls to sleep ({n} messages)",
            inbox.wakeups()
        );
    }

    #[test]
    fn a_push_to_an_awake_receiver_costs_no_wake_up() {
        let inbox = Inbox::new().unwrap();
        for i in 0..100 {
            inbox.push(message(i));
        }
        assert_eq!(inbox.wakeups(), 0);
        assert_eq!(inbox.take_all().len(), 100);
    }

    #[test]
    fn a_sleep_ends_at_its_deadline_and_not_at_all_when_work_waits() {
        let inbox = Inbox::new().unwrap();
        let until = Instant::now() + Duration::from_millis(20);
        inbox.sleep(Some(until), None, || false);
        // A sleep may return early (a signal); a sleep loop would go on.
        while Instant::now() < until {
            inbox.sleep(Some(until), None, || false);
        }
        assert!(inbox.sleeps() >= 1);
        let before = inbox.sleeps();
        inbox.push(message(1));
        inbox.sleep(None, None, || false);
        assert_eq!(inbox.sleeps(), before, "a queued message: no sleep");
        inbox.take_all();
        inbox.sleep(None, None, || true);
        assert_eq!(inbox.sleeps(), before, "stop already set: no sleep");
    }
}
