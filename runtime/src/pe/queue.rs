//! A PE's queues: the inbox other threads push to, and the run queue the
//! scheduler loop takes the next message from (a FIFO for priority 0, a heap
//! for the others: lower first, oldest first among equals).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering as AtOrd};
use std::sync::OnceLock;
use std::thread::Thread;

use crossbeam_queue::SegQueue;

use crate::msg::Envelope;

/// A PE's incoming queue, shared with the threads that push to it.
pub(crate) struct Inbox {
    pub(super) queue: SegQueue<Envelope>,
    pub(super) sleeping: AtomicBool,
    pub(super) thread: OnceLock<Thread>,
}

impl Inbox {
    pub(crate) fn new() -> Self {
        Inbox {
            queue: SegQueue::new(),
            sleeping: AtomicBool::new(false),
            thread: OnceLock::new(),
        }
    }

    /// Empties the queue (the PE is stopped).
    pub(crate) fn take_all(&self) -> Vec<Envelope> {
        std::iter::from_fn(|| self.queue.pop()).collect()
    }

    /// Queues `env` and wakes the PE if it is parked.
    pub(crate) fn push(&self, env: Envelope) {
        self.queue.push(env);
        if self.sleeping.load(AtOrd::SeqCst) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
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
