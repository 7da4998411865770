//! Who holds a transport's receive side: its own thread, or the node's
//! spinning PEs ([`Handback`]). Shared by the TCP receive thread and UCX's
//! communication thread.
//!
//! While any PE of the node spins (`pe` progress mode), the PEs progress
//! the transport, and the last of them to spin out sleeps on its
//! descriptor ([`Transport::wait_fd`](super::Transport::wait_fd)); the
//! others let go and sleep on their inboxes ([`Handback::pe_sleeps`]), so
//! an arrival wakes one PE, not all of them. The thread keeps
//! out of their way: it neither reads nor watches the transport, so an
//! arrival wakes the PE alone, and it dozes on an eventfd of its own. A
//! PE that stops to run a message and spins again microseconds later (a
//! message exchange) costs no system call and no wake-up: the thread
//! takes the transport back within its doze when no PE spins any more,
//! and only the last PE to stop while the thread dozes long wakes it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use tracing::error;

/// How long the thread dozes at first while PEs hold the transport and
/// come and go: the longest a hand-back may wait for it.
pub(crate) const HANDBACK_NAP: Duration = Duration::from_millis(1);

/// The thread's side of the hand-back, and what the PEs tell it.
///
/// The thread dozes for [`HANDBACK_NAP`] at first, twice as long each
/// time no PE came or went meanwhile ([`Handback::next_nap`]), up to the
/// caller's longest sleep.
pub(crate) struct Handback {
    own: EventFd,
    /// PEs of this node holding the transport now: spinning, or the one
    /// asleep on it (`pe` progress mode only).
    spinning: AtomicUsize,
    /// Counts every `pe_spinning` call, and every PE that let go as it
    /// went to sleep: whether PEs came or went.
    turns: AtomicU64,
    /// The thread dozes longer than [`HANDBACK_NAP`].
    dozing: AtomicBool,
}

impl Handback {
    pub(crate) fn new() -> io::Result<Handback> {
        Ok(Handback {
            own: EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?,
            spinning: AtomicUsize::new(0),
            turns: AtomicU64::new(0),
            dozing: AtomicBool::new(false),
        })
    }

    /// The thread's eventfd: readable once [`Handback::wake`] was called
    /// and until a sleep or doze consumed it.
    pub(crate) fn own_fd(&self) -> BorrowedFd<'_> {
        self.own.as_fd()
    }

    /// Wakes the thread whoever holds the transport: for what only the
    /// thread does (stopping, closing, adopting connections).
    pub(crate) fn wake(&self) {
        // EAGAIN: the counter is full, a wake-up is waiting already.
        let _ = self.own.write(1);
    }

    /// Consumes a [`Handback::wake`] (the thread's eventfd is
    /// non-blocking: nothing to consume is no error).
    pub(crate) fn drain(&self) {
        let _ = self.own.read();
    }

    /// Whether any PE of the node spins, and so holds the transport.
    pub(crate) fn pes_progress(&self) -> bool {
        self.spinning.load(Ordering::SeqCst) > 0
    }

    /// A PE of this node starts (`true`) or stops spinning.
    pub(crate) fn pe_spinning(&self, spinning: bool) {
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

    /// A spinning PE is about to sleep: it keeps holding the transport
    /// (true) when no other PE of the node holds it, and lets go (false,
    /// as [`Handback::pe_spinning`]`(false)`) when one does.
    pub(crate) fn pe_sleeps(&self) -> bool {
        let let_go = self
            .spinning
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n > 1).then(|| n - 1)
            })
            .is_ok();
        if let_go {
            self.turns.fetch_add(1, Ordering::SeqCst);
        }
        !let_go
    }

    /// The thread's next doze: [`HANDBACK_NAP`] if PEs came or went since
    /// the turns it last saw (`seen`, updated), else twice `nap`, at most
    /// `longest`.
    pub(crate) fn next_nap(&self, seen: &mut u64, nap: Duration, longest: Duration) -> Duration {
        let now = self.turns.load(Ordering::SeqCst);
        let next = if now != *seen {
            HANDBACK_NAP
        } else {
            (nap * 2).min(longest)
        };
        *seen = now;
        next
    }

    /// Sleeps up to `timeout` on the thread's eventfd and, with `also`, on
    /// that descriptor (the transport's own, armed by the caller, or a
    /// listener the thread accepts on); consumes a wake-up.
    pub(crate) fn sleep(&self, also: Option<BorrowedFd<'_>>, timeout: Duration) {
        let mut fds = [
            PollFd::new(self.own.as_fd(), PollFlags::POLLIN),
            PollFd::new(also.unwrap_or(self.own.as_fd()), PollFlags::POLLIN),
        ];
        let watched = if also.is_some() { 2 } else { 1 };
        let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        match nix::poll::poll(&mut fds[..watched], timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                // Not expected (bad descriptors); a thread that cannot
                // sleep must not say so a thousand times a second: once
                // per process.
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    error!("a transport thread cannot sleep (poll: {e}); it naps 1 ms instead");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if fds[0].revents().is_some_and(|r| !r.is_empty()) {
            self.drain();
        }
    }

    /// While PEs hold the transport: dozes `nap` (watching `also` too),
    /// and returns at once if the last PE stopped meanwhile.
    pub(crate) fn doze(&self, nap: Duration, also: Option<BorrowedFd<'_>>) {
        let long = nap > HANDBACK_NAP;
        self.dozing.store(long, Ordering::SeqCst);
        if !long || self.pes_progress() {
            self.sleep(also, nap);
        }
        self.dozing.store(false, Ordering::SeqCst);
    }

    /// Counts of `pe_spinning` calls and of PEs letting go as they sleep
    /// (tests).
    #[cfg(test)]
    pub(crate) fn turns(&self) -> u64 {
        self.turns.load(Ordering::SeqCst)
    }

    /// Marks the thread as dozing long (tests).
    #[cfg(test)]
    pub(crate) fn set_dozing(&self, long: bool) {
        self.dozing.store(long, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rung(h: &Handback) -> bool {
        let mut fds = [PollFd::new(h.own.as_fd(), PollFlags::POLLIN)];
        nix::poll::poll(&mut fds, PollTimeout::ZERO).unwrap() == 1
    }

    /// PEs that stop and spin again (a message exchange) cost the thread
    /// no wake-up; the last PE to stop while the thread dozes long wakes
    /// it, and one of several stopping does not.
    #[test]
    fn only_the_last_pe_to_stop_wakes_a_thread_in_a_long_doze() {
        let h = Handback::new().unwrap();
        h.pe_spinning(true);
        h.pe_spinning(false);
        assert!(!rung(&h), "woken with the thread not dozing long");
        h.pe_spinning(true);
        h.pe_spinning(true);
        h.set_dozing(true);
        h.pe_spinning(false);
        assert!(!rung(&h), "woken while a PE still spins");
        assert!(h.pes_progress());
        h.pe_spinning(false);
        assert!(
            rung(&h),
            "the last PE to stop did not wake the dozing thread"
        );
        assert!(!h.pes_progress());
        assert_eq!(h.turns(), 6);
    }

    /// Of the PEs that hold the transport, one goes to sleep on it: each
    /// that is about to sleep while another still holds it lets go, the
    /// last keeps it (and still counts as holding it: the thread stays
    /// out); it lets go when it wakes to run something.
    #[test]
    fn only_the_last_pe_holding_the_transport_sleeps_on_it() {
        let h = Handback::new().unwrap();
        h.pe_spinning(true);
        h.pe_spinning(true);
        let turns = h.turns();
        assert!(!h.pe_sleeps(), "kept it with another PE holding it");
        assert_eq!(h.turns(), turns + 1, "letting go is a turn");
        assert!(h.pe_sleeps(), "the last one let go");
        assert_eq!(h.turns(), turns + 1, "keeping it is no turn");
        assert!(h.pes_progress(), "the sleeper holds it");
        h.set_dozing(true);
        h.pe_spinning(false);
        assert!(
            rung(&h),
            "the sleeper woke to run something: the thread's turn"
        );
        assert!(!h.pes_progress());
    }

    /// The doze starts short after PEs came or went and doubles while
    /// none did, up to the longest.
    #[test]
    fn the_doze_doubles_while_no_pe_comes_or_goes() {
        let h = Handback::new().unwrap();
        let longest = Duration::from_millis(50);
        let mut seen = u64::MAX;
        let mut nap = h.next_nap(&mut seen, HANDBACK_NAP, longest);
        assert_eq!(nap, HANDBACK_NAP);
        for want in [2, 4, 8, 16, 32, 50, 50] {
            nap = h.next_nap(&mut seen, nap, longest);
            assert_eq!(nap, Duration::from_millis(want));
        }
        h.pe_spinning(true);
        assert_eq!(h.next_nap(&mut seen, nap, longest), HANDBACK_NAP);
    }
}
