//! The communication thread of a node's UCX transport, and what it sleeps on.
//!
//! The thread progresses the worker, receives and delivers, and moves
//! closing endpoints along. It sleeps ([`WakeSet`]) on an eventfd for the
//! transport's own calls (stop, an endpoint to close) and on the worker's
//! event fd. In `pe` progress mode an idle PE progresses the worker itself
//! while it spins and then sleeps on the worker's event fd
//! ([`Transport::wait_fd`](crate::transport::Transport::wait_fd));
//! meanwhile the thread neither progresses nor watches the worker, but
//! dozes on its eventfd, so a message wakes the PE alone and nothing
//! competes with it for the core. Once no PE spins (they compute), the
//! thread takes the worker back within its doze and carries what arrives
//! or is in flight (a rendezvous a peer waits on) as in `thread` mode.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::os::fd::AsFd;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use tracing::error;

use super::{ffi, Rx, Shared};
use crate::transport::Sink;

/// How long the communication thread spins before sleeping on the event fd.
const SPIN: Duration = Duration::from_micros(200);
/// How long the communication thread busy-waits before it starts yielding its core.
const HOT_SPIN: Duration = Duration::from_micros(5);
/// Longest sleep on the event fd when nothing is in flight. A message, a
/// send left in flight (the sender signals) or a close wakes the thread at
/// once; the timeout only bounds a wake-up that would not come. (A 1 s
/// timeout was withdrawn in issue 19 for a stall beside a busy process
/// that turned out to be the yields, not a lost wake-up: docs/ucx.md.)
/// 20 wake-ups a second cost an idle node about 0.1% of a core.
#[cfg(not(test))]
const SLEEP: Duration = Duration::from_millis(50);
/// In the unit tests the timeout is far longer than what they wait for a
/// frame, so a wake-up that does not come fails them.
#[cfg(test)]
const SLEEP: Duration = Duration::from_secs(30);
/// How long the communication thread keeps yielding while work is in
/// flight and nothing moves, before it sleeps on the event fd instead.
const BUSY_YIELD: Duration = Duration::from_micros(100);
/// Longest sleep on the event fd while work is in flight, and between two
/// looks at the closing endpoints while PEs progress the worker.
const BUSY_SLEEP: Duration = Duration::from_millis(1);
/// How long a closing endpoint may take before it is abandoned.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// How long the communication thread dozes at first while PEs hold the
/// worker and come and go: the longest a hand-back may wait for it.
const HANDBACK_NAP: Duration = Duration::from_millis(1);

/// An endpoint on its way out.
pub(super) enum Leaving {
    /// Its `BYE` is in flight; close once it left (or at the deadline).
    AfterBye {
        ep: ffi::Ep,
        bye: Arc<AtomicBool>,
        deadline: Instant,
    },
    /// A close in progress.
    Closing {
        close: ffi::Closing,
        deadline: Instant,
    },
}

/// How the communication thread sleeps, and what the PEs tell it.
///
/// The thread sleeps on its own eventfd and, when it progresses the
/// worker, on the worker's event fd (armed). While a PE spins (`pe` mode)
/// the PE progresses the worker and sleeps on the worker's fd itself, and
/// the thread dozes on its eventfd alone: for [`HANDBACK_NAP`] at first,
/// twice as long each time no PE came or went meanwhile, up to
/// [`SLEEP`]. The last PE to stop wakes it only from such a long doze:
/// a PE that stops to run a message and spins again microseconds later
/// (a message exchange) costs no system call and no wake-up, and the
/// worker is not armed on the way, so peers send to it without signalling.
pub(super) struct WakeSet {
    own: EventFd,
    /// PEs of this node spinning now (`pe` progress mode only).
    spinning: AtomicUsize,
    /// Counts every `pe_spinning` call: whether PEs came or went.
    turns: AtomicU64,
    /// The thread dozes longer than [`HANDBACK_NAP`].
    dozing: AtomicBool,
}

impl WakeSet {
    pub(super) fn new() -> io::Result<WakeSet> {
        Ok(WakeSet {
            own: EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?,
            spinning: AtomicUsize::new(0),
            turns: AtomicU64::new(0),
            dozing: AtomicBool::new(false),
        })
    }

    /// Wakes the thread whoever progresses the worker: for what only the
    /// thread does (stopping, closing endpoints).
    pub(super) fn wake(&self) {
        let _ = self.own.write(1);
    }

    /// Whether any PE of the node spins, and so progresses the worker and
    /// may sleep on its event fd.
    pub(super) fn pes_progress(&self) -> bool {
        self.spinning.load(Ordering::SeqCst) > 0
    }

    /// A PE of this node starts (`true`) or stops spinning.
    pub(super) fn pe_spinning(&self, spinning: bool) {
        let before = if spinning {
            self.spinning.fetch_add(1, Ordering::SeqCst)
        } else {
            self.spinning
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    Some(n.saturating_sub(1))
                })
                .expect("the update always applies")
        };
        self.turns.fetch_add(1, Ordering::SeqCst);
        if !spinning && before == 1 && self.dozing.load(Ordering::SeqCst) {
            self.wake();
        }
    }

    /// Sleeps up to `timeout` on the thread's eventfd and, with `worker`
    /// (armed by the caller), on the worker's event fd.
    fn sleep(&self, worker: Option<&ffi::Worker>, timeout: Duration) {
        let mut fds = [
            PollFd::new(self.own.as_fd(), PollFlags::POLLIN),
            PollFd::new(
                worker.map_or(self.own.as_fd(), |w| w.efd()),
                PollFlags::POLLIN,
            ),
        ];
        let watched = if worker.is_some() { 2 } else { 1 };
        let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        match nix::poll::poll(&mut fds[..watched], timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                error!("the UCX communication thread cannot sleep (poll: {e}); it naps 1 ms");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if fds[0].revents().is_some_and(|r| !r.is_empty()) {
            let _ = self.own.read();
        }
    }

    /// While PEs hold the worker: dozes `nap` on the thread's eventfd, and
    /// returns at once if the last PE stopped meanwhile.
    fn doze(&self, nap: Duration) {
        let long = nap > HANDBACK_NAP;
        self.dozing.store(long, Ordering::SeqCst);
        if !long || self.pes_progress() {
            self.sleep(None, nap);
        }
        self.dozing.store(false, Ordering::SeqCst);
    }
}

/// Moves leaving endpoints along; returns how many are left.
fn move_leaving(shared: &Shared) -> usize {
    let mut leaving = shared.leaving.lock().expect("leaving list poisoned");
    let now = Instant::now();
    let mut next = Vec::with_capacity(leaving.len());
    for l in leaving.drain(..) {
        match l {
            Leaving::AfterBye { ep, bye, deadline } => {
                if bye.load(Ordering::SeqCst) || now >= deadline {
                    if let Some(close) = ep.close() {
                        next.push(Leaving::Closing {
                            close,
                            deadline: now + CLOSE_GRACE,
                        });
                    }
                } else {
                    next.push(Leaving::AfterBye { ep, bye, deadline });
                }
            }
            Leaving::Closing {
                mut close,
                deadline,
            } => {
                if !close.done() && now < deadline {
                    next.push(Leaving::Closing { close, deadline });
                }
            }
        }
    }
    *leaving = next;
    leaving.len()
}

pub(super) fn comm_loop(
    worker: Arc<ffi::Worker>,
    shared: Arc<Shared>,
    rx: Arc<Mutex<Rx>>,
    sink: Arc<dyn Sink>,
) {
    shared
        .tid
        .store(crate::transport::current_tid(), Ordering::SeqCst);
    let mut idle_since = Instant::now();
    // While PEs hold the worker: the turns last seen, and the last doze.
    let (mut turns, mut nap) = (u64::MAX, HANDBACK_NAP);
    loop {
        let stopping = shared.stop.load(Ordering::SeqCst);
        // While a PE spins it progresses the worker: the thread only
        // closes endpoints, and dozes until the PEs hand the worker back
        // (see `WakeSet`).
        if shared.set.pes_progress() && !stopping {
            let leaving = move_leaving(&shared);
            let now = shared.set.turns.load(Ordering::SeqCst);
            nap = if now != turns {
                HANDBACK_NAP
            } else {
                (nap * 2).min(SLEEP)
            };
            turns = now;
            shared.set.doze(if leaving > 0 {
                nap.min(BUSY_SLEEP)
            } else {
                nap
            });
            idle_since = Instant::now();
            continue;
        }
        turns = u64::MAX;
        let mut did = worker.progress();
        let receiving = {
            let mut rx = rx.lock().expect("receive state poisoned");
            did |= rx.poll(&*sink);
            !rx.pending.is_empty()
        };
        let leaving = move_leaving(&shared);
        worker.reap_abandoned();
        if stopping && leaving == 0 {
            break;
        }
        if did {
            idle_since = Instant::now();
            continue;
        }
        // Nothing happened. Busy-wait for the first microseconds, then keep
        // polling but yield the core: on a small machine the thread that
        // must act next (a PE, the peer's communication thread doing a
        // rendezvous get) may be waiting for it. Sleep only when nothing is
        // in flight. In `pe` mode too: while the PEs compute, the thread
        // catches the next arrival within its spin, where an armed sleep
        // would cost the sender a signal and this node a wake-up per
        // message (measured: Jacobi2D 0.7-0.8 ms per iteration against
        // 0.4 with the spin).
        let busy = worker.sends_in_flight() > 0 || leaving > 0 || receiving;
        let idle_for = idle_since.elapsed();
        if busy && idle_for >= BUSY_YIELD.max(SPIN) {
            // Work in flight but nothing moved for a while: yielding again
            // would hand the core to a busy neighbour for a whole time
            // slice; a sleep on the event fd is woken by UCX's next event
            // (the peer's reply, an arrival) and the scheduler favours a
            // thread that slept.
            sleep_armed(&worker, &shared, BUSY_SLEEP);
            continue;
        }
        // Beside a busy process each yield may give the core away for a
        // tick; the PE loop stops yielding then (`crate::contention`), but
        // this thread must not: here the busy thread is most often another
        // node's PE of the same job, and sleeping through every short wait
        // made Jacobi2D over UCX twice as slow (docs/message-path.md).
        if busy || idle_for < SPIN {
            if idle_for < HOT_SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            continue;
        }
        if worker.sends_in_flight() == 0 {
            sleep_armed(&worker, &shared, SLEEP);
        }
    }
    // Finishes or abandons receives while the worker is alive.
    rx.lock().expect("receive state poisoned").pending.clear();
}

/// Arms the worker and sleeps up to `timeout` on its event fd and the
/// thread's eventfd; returns at once when events are pending (the caller
/// progresses) or the transport stops.
fn sleep_armed(worker: &ffi::Worker, shared: &Shared, timeout: Duration) {
    shared.sleeping.store(true, Ordering::SeqCst);
    if !shared.stop.load(Ordering::SeqCst) && worker.arm() {
        shared.set.sleep(Some(worker), timeout);
    }
    shared.sleeping.store(false, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rung(set: &WakeSet) -> bool {
        let mut fds = [PollFd::new(set.own.as_fd(), PollFlags::POLLIN)];
        nix::poll::poll(&mut fds, PollTimeout::ZERO).unwrap() == 1
    }

    /// PEs that stop and spin again (a message exchange) cost the thread
    /// no wake-up; the last PE to stop while the thread dozes long wakes
    /// it, and one of several stopping does not.
    #[test]
    fn only_the_last_pe_to_stop_wakes_a_thread_in_a_long_doze() {
        let set = WakeSet::new().unwrap();
        set.pe_spinning(true);
        set.pe_spinning(false);
        assert!(!rung(&set), "woken with the thread not dozing long");
        set.pe_spinning(true);
        set.pe_spinning(true);
        set.dozing.store(true, Ordering::SeqCst);
        set.pe_spinning(false);
        assert!(!rung(&set), "woken while a PE still spins");
        assert!(set.pes_progress());
        set.pe_spinning(false);
        assert!(
            rung(&set),
            "the last PE to stop did not wake the dozing thread"
        );
        assert!(!set.pes_progress());
        assert_eq!(set.turns.load(Ordering::SeqCst), 6);
    }
}
