//! Start-up order on a PE (main's constructor and the readonly broadcast)
//! and the job's end (exit).
//!
//! Main is constructed on PE 0; everything it sends waits until its readonly
//! values are on their way, and every other PE holds everything but the
//! readonly broadcast (and exit, and a newcomer's adoption) until it has them,
//! so nothing can read a readonly before it is set.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use tracing::error;

use super::{misrouted, Scheduler};
use crate::msg::{Dest, Envelope, Payload, MAIN_COLL};
use crate::system::SysMsg;
use crate::topo::Pe as PeId;

/// A PE's readonly values and what waits for them.
pub(super) struct Startup {
    /// Readonly values arrived (PE 0: set them itself).
    pub(super) ready: bool,
    /// Messages that arrived before the readonly values.
    pub(super) held_in: Vec<Envelope>,
    /// Main's constructor runs: its sends are held.
    pub(super) in_main_ctor: bool,
    /// What main's constructor sent.
    pub(super) held_out: Vec<(PeId, Envelope)>,
    /// The readonly values, by id.
    pub(super) readonly: HashMap<u64, Arc<dyn Any + Send + Sync>>,
}

impl Startup {
    pub(super) fn new(pe: PeId) -> Self {
        Startup {
            ready: pe == 0,
            held_in: Vec::new(),
            in_main_ctor: false,
            held_out: Vec::new(),
            readonly: HashMap::new(),
        }
    }
}

impl Scheduler {
    /// Constructs the main chare (PE 0 at launch), then releases readonly data
    /// ahead of everything main sent.
    pub(crate) fn start_main(&mut self) {
        let reg = self.ctx.node.registry.clone();
        let Some(main_type) = reg.main_type else {
            error!("no main chare registered: call `reg.main::<Main>()`");
            self.ctx.exit(crate::node::EXIT_STARTUP);
            return;
        };
        let entry = reg.chares.get(&main_type).expect("main type is registered");
        let mut store = (entry.make)(MAIN_COLL);
        let args =
            postcard::to_allocvec(&self.ctx.node.args).expect("encoding into a Vec cannot fail");
        self.ctx.startup.in_main_ctor = true;
        let built = store.construct(0, &args, 0, &mut self.ctx);
        self.ctx.startup.in_main_ctor = false;
        if let Err(e) = built {
            error!("constructing the main chare failed: {e}");
            self.ctx.exit(crate::node::EXIT_STARTUP);
            return;
        }
        self.stores.insert(MAIN_COLL, store);
        let entries = self
            .ctx
            .startup
            .readonly
            .iter()
            .map(|(id, v)| (*id, (reg.readonlies[id].encode)(&**v)))
            .collect();
        self.ctx.send_sys(0, SysMsg::Readonly { entries });
        for (pe, env) in std::mem::take(&mut self.ctx.startup.held_out) {
            self.ctx.send_env(pe, env);
        }
        self.settle();
    }

    /// Before readonly data arrives only the readonly broadcast itself (and
    /// exit, a newcomer's adoption and a stop) may run: everything else
    /// could read a readonly that is not there.
    pub(super) fn hold_until_ready(&mut self, env: Envelope) -> Option<Envelope> {
        if !matches!(env.dest, Dest::System) {
            self.ctx.startup.held_in.push(env);
            return None;
        }
        let msg = match SysMsg::take(env.payload) {
            Ok(m) => m,
            Err(e) => {
                error!(pe = self.ctx.pe, "dropping malformed runtime message: {e}");
                return None;
            }
        };
        // A stop (a recovery's, which may come before a newcomer adopted
        // anything) always takes effect.
        let pass = matches!(
            msg,
            SysMsg::Readonly { .. }
                | SysMsg::Exit { .. }
                | SysMsg::Adopt(_)
                | SysMsg::RescaleStop(_)
        );
        let env = Envelope {
            payload: Payload::local(msg),
            ..env
        };
        if pass {
            Some(env)
        } else {
            self.ctx.startup.held_in.push(env);
            None
        }
    }

    pub(super) fn adopt_readonly(&mut self, entries: Vec<(u64, Vec<u8>)>) {
        // PE 0 of a running job set them itself; a restoring one did not.
        let entries: Vec<_> = entries
            .into_iter()
            .filter(|(id, _)| !self.ctx.startup.readonly.contains_key(id))
            .collect();
        if !entries.is_empty() {
            let reg = self.ctx.node.registry.clone();
            let mut table = self
                .ctx
                .node
                .readonly
                .lock()
                .expect("readonly table poisoned");
            for (id, bytes) in entries {
                let Some(entry) = reg.readonlies.get(&id) else {
                    error!("readonly with id {id:#x} is not registered on this node; ignoring it");
                    continue;
                };
                let value = match table.entry(id) {
                    std::collections::hash_map::Entry::Occupied(o) => o.get().clone(),
                    std::collections::hash_map::Entry::Vacant(v) => match (entry.decode)(&bytes) {
                        Ok(value) => v.insert(value).clone(),
                        Err(e) => {
                            error!("readonly `{}` did not decode: {e}", entry.name);
                            continue;
                        }
                    },
                };
                self.ctx.startup.readonly.insert(id, value);
            }
        }
        if !self.ctx.startup.ready {
            self.ctx.startup.ready = true;
            for env in std::mem::take(&mut self.ctx.startup.held_in) {
                self.ctx.enqueue(env);
            }
        }
    }

    /// The start-up and exit runtime messages.
    pub(super) fn on_startup(&mut self, msg: SysMsg) {
        match msg {
            SysMsg::Readonly { entries } => self.adopt_readonly(entries),
            SysMsg::ExitRequest { code } => {
                if !self.ctx.exiting {
                    self.ctx.send_sys(0, SysMsg::Exit { code });
                }
            }
            SysMsg::Exit { code } => {
                self.ctx.exiting = true;
                self.ctx.exit = Some(code);
            }
            other => misrouted(self.ctx.pe, "start-up", &other),
        }
    }
}
