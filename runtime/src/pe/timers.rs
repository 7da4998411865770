//! A PE's timers ([`PeCtx::after`](crate::PeCtx::after)): callbacks due at
//! an instant. The scheduler loop fires the due ones before it idles, and an
//! idle PE sleeps no later than the earliest one.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::msg::CallbackSpec;

/// Callbacks by due time, in the order they were set among equal times.
#[derive(Default)]
pub(super) struct Timers {
    due: BTreeMap<(Instant, u64), CallbackSpec>,
    seq: u64,
}

impl Timers {
    /// Calls `callback` (with `()`) at `at` or soon after.
    pub(super) fn add(&mut self, at: Instant, callback: CallbackSpec) {
        self.seq += 1;
        self.due.insert((at, self.seq), callback);
    }

    /// When the earliest timer is due.
    pub(super) fn next(&self) -> Option<Instant> {
        self.due.keys().next().map(|&(at, _)| at)
    }

    /// The earliest timer, if it is due at `now`.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<CallbackSpec> {
        match self.due.first_entry() {
            Some(e) if e.key().0 <= now => Some(e.remove()),
            _ => None,
        }
    }

    /// How many are set.
    pub(super) fn len(&self) -> usize {
        self.due.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::msg::Target;

    fn cb(n: u8) -> CallbackSpec {
        CallbackSpec {
            target: Target::Ignore,
            prefix: vec![n],
        }
    }

    #[test]
    fn timers_fire_in_due_order_and_only_once_due() {
        let now = Instant::now();
        let mut t = Timers::default();
        t.add(now + Duration::from_secs(2), cb(2));
        t.add(now + Duration::from_secs(1), cb(1));
        t.add(now + Duration::from_secs(1), cb(3));
        assert_eq!(t.next(), Some(now + Duration::from_secs(1)));
        assert!(t.pop_due(now).is_none(), "nothing is due yet");
        let later = now + Duration::from_secs(1);
        let fired: Vec<u8> = std::iter::from_fn(|| t.pop_due(later))
            .map(|c| c.prefix[0])
            .collect();
        assert_eq!(fired, vec![1, 3], "due ones, in the order they were set");
        assert_eq!(t.len(), 1);
        assert_eq!(t.next(), Some(now + Duration::from_secs(2)));
    }
}
