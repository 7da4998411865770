//! The communication thread of a node's UCX transport, and what it sleeps on.
//!
//! The thread progresses the worker, receives and delivers, and moves
//! closing endpoints along. It sleeps
//! ([`Handback`](crate::transport::handback::Handback)) on an eventfd for the
//! transport's own calls (stop, an endpoint to close) and on the worker's
//! event fd. In `pe` progress mode an idle PE progresses the worker itself
//! while it spins and then sleeps on the worker's event fd
//! ([`Transport::wait_fd`](crate::transport::Transport::wait_fd));
//! meanwhile the thread neither progresses nor watches the worker, but
//! dozes on its eventfd, so a message wakes the PE alone and nothing
//! competes with it for the core. Once no PE spins (they compute), the
//! thread takes the worker back within its doze and carries what arrives
//! or is in flight (a rendezvous a peer waits on) as in `thread` mode.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{ffi, Rx, Shared};
use crate::transport::handback::HANDBACK_NAP;
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
        // (see `transport::handback`).
        if shared.set.pes_progress() && !stopping {
            let leaving = move_leaving(&shared);
            nap = shared.set.next_nap(&mut turns, nap, SLEEP);
            shared.set.doze(
                if leaving > 0 {
                    nap.min(BUSY_SLEEP)
                } else {
                    nap
                },
                None,
            );
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
        shared.set.sleep(Some(worker.efd()), timeout);
    }
    shared.sleeping.store(false, Ordering::SeqCst);
}
