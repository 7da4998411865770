//! The only way out of a PE: to itself, to another PE of the node (its
//! inbox), or to another node (one frame, written through the transport
//! from the message's memory).
//! Messages for a collection this PE has not seen created yet wait here.

use tracing::debug;

use super::PeState;
use crate::msg::{CollId, Dest, Envelope, Payload};
use crate::system::SysMsg;
use crate::topo::Pe as PeId;

impl PeState {
    /// Keeps an envelope until collection `coll` is created on this PE.
    ///
    /// Held envelopes leave quiescence detection's books balanced (their
    /// sending and any earlier handling were both counted); [`Self::release`]
    /// counts them again as new messages.
    pub(super) fn hold_for_creation(&mut self, coll: CollId, mut env: Envelope) {
        env.counted = false;
        self.loc.unknown.entry(coll).or_default().push(env);
    }

    /// Keeps a runtime message until collection `coll` is created on this PE.
    pub(super) fn hold_sys_for_creation(&mut self, coll: CollId, msg: SysMsg) {
        let env = Envelope {
            prio: 0,
            dest: Dest::System,
            payload: Payload::local(msg),
            counted: false,
        };
        self.hold_for_creation(coll, env);
    }

    /// Sends on an envelope that was held, as a newly created message.
    pub(super) fn release(&mut self, pe: PeId, mut env: Envelope) {
        env.counted = true;
        self.send_env(pe, env);
    }

    /// Sends a runtime message to PE `pe`.
    pub(super) fn send_sys(&mut self, pe: PeId, msg: SysMsg) {
        let counted = msg.counts_for_qd();
        self.send_env(
            pe,
            Envelope {
                prio: 0,
                dest: Dest::System,
                payload: Payload::local(msg),
                counted,
            },
        );
    }

    /// The one place an envelope leaves this PE.
    pub(crate) fn send_env(&mut self, pe: PeId, env: Envelope) {
        if self.startup.in_main_ctor {
            // Main's sends wait until readonly data is on its way (see `Scheduler::start_main`).
            self.startup.held_out.push((pe, env));
            return;
        }
        if env.counted {
            self.qd.created += 1;
        }
        if pe == self.pe {
            self.enqueue(env);
        } else if self.topo.is_local(pe) {
            self.node.inboxes[self.topo.rank_of(pe)].push(env);
        } else {
            self.send_remote(pe, env);
        }
    }

    fn send_remote(&mut self, pe: PeId, env: Envelope) {
        let node = self.topo.node_of(pe);
        if let Err(e) = self.node.send_to_node(node, pe, &env) {
            // Every PE sending to a lost node gets here: one line per node
            // says so (`peer_lost`), the rest is debug detail.
            debug!(pe = self.pe, to_node = node, "send failed: {e}");
            self.node.peer_lost(
                self.topo.uid_of(node),
                &format!("sending to it failed ({e})"),
            );
        }
    }

    /// Queues `env` to run on this PE.
    #[inline]
    pub(super) fn enqueue(&mut self, env: Envelope) {
        self.queue.push(env);
    }
}
