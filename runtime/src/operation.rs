//! Node 0's operation slot: the one job-wide operation in flight, a
//! rescale or a checkpoint, with its record (where the answer goes, stage
//! times). One mutex and one `Option`, so a rescale and a checkpoint can
//! never both start: before this slot they had a desk each, taken in
//! different orders by the two control services, and a checkpoint admitted
//! while a rescale was being admitted could run beside it.
//!
//! May touch: nothing but the records it holds. The control services put
//! an operation in ([`OperationSlot::try_begin`]); PE 0 and node 0's
//! driver shell read and update it; whoever answers the tool takes it out.

use std::sync::{Mutex, MutexGuard};

use crate::checkpoint::service::CheckpointDesk;
use crate::rescale::Desk;

/// The operation in flight.
pub(crate) enum Operation {
    /// A rescale being served.
    Rescale(Desk),
    /// A checkpoint being taken.
    Checkpoint(CheckpointDesk),
}

impl Operation {
    fn busy(&self) -> Busy {
        match self {
            Operation::Rescale(_) => Busy::Rescale,
            Operation::Checkpoint(_) => Busy::Checkpoint,
        }
    }
}

/// What holds the slot when another operation asks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Busy {
    /// A rescale.
    #[error("a rescale is in progress")]
    Rescale,
    /// A checkpoint.
    #[error("a checkpoint is in progress")]
    Checkpoint,
}

/// The slot.
#[derive(Default)]
pub(crate) struct OperationSlot(Mutex<Option<Operation>>);

impl OperationSlot {
    fn lock(&self) -> MutexGuard<'_, Option<Operation>> {
        self.0.lock().expect("operation slot poisoned")
    }

    /// What is in flight, if anything.
    pub(crate) fn busy(&self) -> Option<Busy> {
        self.lock().as_ref().map(Operation::busy)
    }

    /// Puts `op` in when the slot is free and `check` (run under the
    /// slot's lock) accepts; otherwise gives `op` back with the reason.
    pub(crate) fn try_begin<E>(
        &self,
        op: Operation,
        check: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), Refusal<E>> {
        let mut slot = self.lock();
        if let Some(current) = slot.as_ref() {
            return Err(Refusal::Busy(current.busy()));
        }
        check().map_err(Refusal::Check)?;
        *slot = Some(op);
        Ok(())
    }

    /// Runs `f` on the rescale in flight, if one is.
    pub(crate) fn with_rescale<R>(&self, f: impl FnOnce(&mut Desk) -> R) -> Option<R> {
        match self.lock().as_mut() {
            Some(Operation::Rescale(d)) => Some(f(d)),
            _ => None,
        }
    }

    /// Runs `f` on the checkpoint in flight, if one is.
    pub(crate) fn with_checkpoint<R>(&self, f: impl FnOnce(&mut CheckpointDesk) -> R) -> Option<R> {
        match self.lock().as_mut() {
            Some(Operation::Checkpoint(d)) => Some(f(d)),
            _ => None,
        }
    }

    /// Takes the rescale out (it ended), if one is in flight.
    pub(crate) fn take_rescale(&self) -> Option<Desk> {
        let mut slot = self.lock();
        match slot.take() {
            Some(Operation::Rescale(d)) => Some(d),
            other => {
                *slot = other;
                None
            }
        }
    }

    /// Takes the checkpoint out when `pred` holds for it.
    pub(crate) fn take_checkpoint_if(
        &self,
        pred: impl FnOnce(&CheckpointDesk) -> bool,
    ) -> Option<CheckpointDesk> {
        let mut slot = self.lock();
        match slot.take() {
            Some(Operation::Checkpoint(d)) if pred(&d) => Some(d),
            other => {
                *slot = other;
                None
            }
        }
    }
}

/// Why [`OperationSlot::try_begin`] refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal<E> {
    /// Another operation is in flight.
    Busy(Busy),
    /// The caller's check refused.
    Check(E),
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::{Arc, Barrier};
    use std::time::Instant;

    use ductile_coordinator::proto::{Member, View};

    use super::*;
    use crate::rescale::plan::{plan, RescaleRequest};
    use crate::system::StopOrder;

    fn rescale() -> Operation {
        let view = View {
            epoch: 3,
            members: (0..2)
                .map(|i| Member {
                    node: i,
                    uid: 10 + u64::from(i),
                    address: vec![],
                    pes: 1,
                    host: "h".into(),
                    pid: 0,
                })
                .collect(),
        };
        let req = RescaleRequest {
            epoch: 3,
            remove: vec![1],
            admit: 0,
        };
        let order = StopOrder {
            epoch: 3,
            remove: vec![1],
            admit: 0,
            plan: plan(&view, &req).expect("a valid request"),
        };
        let (tx, _rx) = crossbeam_channel::bounded(1);
        Operation::Rescale(Desk::new(order, &view, tx))
    }

    fn checkpoint() -> Operation {
        let (tx, _rx) = crossbeam_channel::bounded(1);
        Operation::Checkpoint(CheckpointDesk {
            dir: PathBuf::from("/nonexistent"),
            exit: false,
            started: Instant::now(),
            writing_from: None,
            reply: tx,
        })
    }

    /// The suspected race of issue 14: a rescale and a checkpoint admitted
    /// at the same moment by two control connections. With one slot,
    /// exactly one of them starts, every time.
    #[test]
    fn a_rescale_and_a_checkpoint_never_both_start() {
        let slot = Arc::new(OperationSlot::default());
        for round in 0..300 {
            let gate = Arc::new(Barrier::new(2));
            let threads: Vec<_> = [true, false]
                .into_iter()
                .map(|is_rescale| {
                    let (slot, gate) = (slot.clone(), gate.clone());
                    std::thread::spawn(move || {
                        let op = if is_rescale { rescale() } else { checkpoint() };
                        gate.wait();
                        slot.try_begin(op, || Ok::<(), ()>(())).is_ok()
                    })
                })
                .collect();
            let started: Vec<bool> = threads
                .into_iter()
                .map(|t| t.join().expect("no panic"))
                .collect();
            assert_eq!(
                started.iter().filter(|&&s| s).count(),
                1,
                "round {round}: {started:?}"
            );
            // Whoever lost was told what holds the slot.
            let busy = slot.busy().expect("one started");
            let other = if busy == Busy::Rescale {
                checkpoint()
            } else {
                rescale()
            };
            assert_eq!(
                slot.try_begin(other, || Ok::<(), ()>(())),
                Err(Refusal::Busy(busy))
            );
            // The operation ends; the slot is free again.
            match busy {
                Busy::Rescale => assert!(slot.take_rescale().is_some()),
                Busy::Checkpoint => assert!(slot.take_checkpoint_if(|_| true).is_some()),
            }
            assert_eq!(slot.busy(), None);
        }
    }

    #[test]
    fn each_side_sees_only_its_own_operation() {
        let slot = OperationSlot::default();
        slot.try_begin(checkpoint(), || Ok::<(), ()>(()))
            .expect("free");
        assert_eq!(slot.with_rescale(|_| ()), None);
        assert!(
            slot.take_rescale().is_none(),
            "a checkpoint is not taken as a rescale"
        );
        assert_eq!(slot.with_checkpoint(|d| d.exit), Some(false));
        assert!(slot
            .take_checkpoint_if(|d| d.writing_from.is_some())
            .is_none());
        assert_eq!(slot.busy(), Some(Busy::Checkpoint));
        assert!(slot
            .take_checkpoint_if(|d| d.writing_from.is_none())
            .is_some());
        // A check that refuses leaves the slot free.
        assert_eq!(
            slot.try_begin(rescale(), || Err("stale")),
            Err(Refusal::Check("stale"))
        );
        assert_eq!(slot.busy(), None);
    }
}
