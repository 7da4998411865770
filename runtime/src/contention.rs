//! Whether a spinning thread shares its core with a busy one, as its own
//! yields tell (docs/message-path.md, "Yielding beside a busy process").
//!
//! A thread that waits for something that comes within microseconds (a
//! reply, a rendezvous get) spins, yielding its core so that the thread it
//! waits for can run on it. On a core of its own a `sched_yield` returns in
//! about a microsecond. Beside a busy thread it often hands that thread the
//! core until the scheduler's next tick: milliseconds. Once a
//! yield took that long, the waiter should stop yielding and sleep on what
//! wakes it (an event fd, its inbox): a wake-up gets the core back within
//! microseconds, since the scheduler favours a thread that slept.
//!
//! The PE loop's idle spin uses it. UCX's communication thread does not:
//! the thread that keeps its core is most often another node's PE of the
//! same job, and sleeping through every short wait doubled Jacobi2D over
//! UCX on 2 cores.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// A yield that took this long gave the core to another thread for a time
/// slice. Measured here (kernel 6.18, HZ 250, pinned): alone on its core a
/// `sched_yield` returns in 0.4 µs (99th percentile 0.7); beside a
/// spinning process half return in 1.5 µs and one in ten takes the rest
/// of the tick, 4 ms. A sibling thread's real work (a PE copying a 1 MiB
/// message, some 250 µs) stays below it.
pub(crate) const STOLEN: Duration = Duration::from_millis(1);
/// How long a stolen yield marks the core as contended: meanwhile the
/// waiter sleeps instead of yielding. Renewed by every stolen yield, so a
/// neighbour that stays busy is re-detected at most every 200 ms.
pub(crate) const CONTENDED_FOR: Duration = Duration::from_millis(200);

/// One thread's view of its core (`Cell`: the thread's own, not shared).
#[derive(Debug, Default)]
pub(crate) struct Contention {
    /// Contended until then.
    until: Cell<Option<Instant>>,
    /// Never says contended (tests of what a thread does on a core of its
    /// own, run on a loaded machine).
    #[cfg(test)]
    blind: bool,
}

impl Contention {
    /// Yields the core, and notes whether another thread kept it.
    pub(crate) fn yield_now(&self) {
        let before = Instant::now();
        std::thread::yield_now();
        let now = Instant::now();
        self.yielded(now - before, now);
    }

    /// A yield that took `took` ended at `now`.
    fn yielded(&self, took: Duration, now: Instant) {
        if took >= STOLEN {
            self.until.set(Some(now + CONTENDED_FOR));
        }
    }

    /// Whether a yield was stolen within the last [`CONTENDED_FOR`].
    pub(crate) fn contended(&self) -> bool {
        self.contended_at(Instant::now())
    }

    fn contended_at(&self, now: Instant) -> bool {
        #[cfg(test)]
        if self.blind {
            return false;
        }
        self.until.get().is_some_and(|until| now < until)
    }

    /// A view that never says the core is contended.
    #[cfg(test)]
    pub(crate) fn blind() -> Contention {
        Contention {
            blind: true,
            ..Contention::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stolen_yield_marks_the_core_contended_for_a_while() {
        let c = Contention::default();
        let t0 = Instant::now();
        assert!(!c.contended_at(t0), "nothing yielded yet");
        c.yielded(Duration::from_micros(2), t0);
        assert!(!c.contended_at(t0), "a quick yield says nothing");
        c.yielded(STOLEN, t0);
        assert!(c.contended_at(t0 + CONTENDED_FOR / 2));
        assert!(!c.contended_at(t0 + CONTENDED_FOR), "it wears off");
        // Another stolen yield renews it; quick ones do not end it early.
        c.yielded(STOLEN * 10, t0 + CONTENDED_FOR / 2);
        c.yielded(Duration::ZERO, t0 + CONTENDED_FOR);
        assert!(c.contended_at(t0 + CONTENDED_FOR));
    }
}
