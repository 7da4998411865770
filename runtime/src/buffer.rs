//! Holding messages that arrive ahead of their step.
//!
//! Message-driven programs without global barriers see a neighbour's message
//! for step k+1 while still in step k. [`Pending`] keeps such messages, in
//! arrival order, until the element reaches their step. It is plain data, so
//! it migrates with the element that owns it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Messages held by step number.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(serialize = "M: Serialize", deserialize = "M: Deserialize<'de>"))]
pub struct Pending<M> {
    by_step: BTreeMap<u64, Vec<M>>,
}

impl<M> Default for Pending<M> {
    fn default() -> Self {
        Pending {
            by_step: BTreeMap::new(),
        }
    }
}

impl<M> Pending<M> {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps `msg` until step `step`.
    pub fn hold(&mut self, step: u64, msg: M) {
        self.by_step.entry(step).or_default().push(msg);
    }

    /// Takes every message held for `step`, in arrival order.
    pub fn release(&mut self, step: u64) -> Vec<M> {
        self.by_step.remove(&step).unwrap_or_default()
    }

    /// Number of messages held.
    pub fn len(&self) -> usize {
        self.by_step.values().map(Vec::len).sum()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.by_step.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_only_the_asked_step_in_order() {
        let mut p = Pending::new();
        p.hold(3, "c1");
        p.hold(2, "b");
        p.hold(3, "c2");
        assert_eq!(p.len(), 3);
        assert_eq!(p.release(3), vec!["c1", "c2"]);
        assert!(p.release(3).is_empty());
        assert_eq!(p.release(2), vec!["b"]);
        assert!(p.is_empty());
    }
}
