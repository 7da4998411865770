//! What entry methods, proxies, readonly handles and collection stores may
//! do with their PE: the chare-facing API's one way into the runtime. It
//! sends, creates, inserts, contributes and reads readonly data; everything
//! else about the PE stays behind it.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::location::CollInfo;
use super::PeCtx;
use crate::msg::{CallbackSpec, CollId, Dest, Envelope, IndexKey, Payload, MAIN_COLL};
use crate::reduce::{Reducer, Value};
use crate::system::{CreateSpec, Departure, Partial, Shape, SysMsg};
use crate::topo::{Pe as PeId, Topology};

impl PeCtx {
    /// This PE's global number.
    pub fn my_pe(&self) -> PeId {
        self.pe
    }
    /// Number of PEs in the job.
    pub fn num_pes(&self) -> u32 {
        self.topo.num_pes()
    }
    /// This node's id.
    pub fn my_node(&self) -> u32 {
        self.topo.my_node()
    }
    /// Number of nodes in the job.
    pub fn num_nodes(&self) -> u32 {
        self.topo.num_nodes()
    }
    /// The current topology.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }
    /// The program's command-line arguments (without the program name).
    pub fn args(&self) -> &[String] {
        &self.node.args
    }

    /// Ends the job: every PE stops, every node passes the shutdown barrier,
    /// and every process exits with `code`.
    pub fn exit(&mut self, code: i32) {
        self.send_sys(0, SysMsg::ExitRequest { code });
    }

    /// Calls `callback` with the job's new PE count after every rescale, once
    /// the job runs at its new size (Charm++'s resume-after-shrink/expand).
    pub fn on_rescale(&mut self, callback: crate::Callback<u32>) {
        self.send_sys(
            0,
            SysMsg::OnRescale {
                callback: callback.spec,
            },
        );
    }

    /// Calls `callback` once no application message is queued or in flight
    /// anywhere in the job (Charm++'s quiescence detection).
    pub fn start_quiescence(&mut self, callback: crate::Callback<()>) {
        self.send_sys(
            0,
            SysMsg::QdStart {
                callback: callback.spec,
            },
        );
    }

    /// This PE's GPU: its device, the node's context for it (the same one
    /// for the whole life of the process, whatever rescales happen) and the
    /// PE's stream. An error when the program did not ask for GPUs.
    #[cfg(feature = "cuda")]
    pub fn gpu(&self) -> Result<&'static crate::gpu::PeGpu, crate::gpu::GpuError> {
        crate::gpu::current()
    }

    // ---- internals used by proxies, contexts and stores ----

    pub(crate) fn set_readonly(&mut self, id: u64, name: &str, value: Arc<dyn Any + Send + Sync>) {
        assert!(
            self.startup.in_main_ctor,
            "readonly `{name}` can only be set in the main chare's constructor"
        );
        assert!(
            self.node.registry.readonlies.contains_key(&id),
            "readonly `{name}` is not registered"
        );
        self.node
            .readonly
            .lock()
            .expect("readonly table poisoned")
            .insert(id, value.clone());
        self.startup.readonly.insert(id, value);
    }

    pub(crate) fn readonly_value(&self, id: u64) -> Option<&(dyn Any + Send + Sync)> {
        self.startup.readonly.get(&id).map(|v| &**v)
    }

    pub(crate) fn create_collection(
        &mut self,
        type_id: u64,
        shape: Shape,
        init: Vec<u8>,
    ) -> CollId {
        assert!(
            self.node.registry.chares.contains_key(&type_id),
            "chare type with id {type_id:#x} is not registered: call `reg.chare::<T>()` in the registration function"
        );
        let coll = self.node.new_collection_id();
        // The creator can route to the new collection at once; its homes hold
        // what arrives before the creation does.
        let linear = self.node.registry.chares[&type_id].linear;
        self.loc.colls.insert(
            coll,
            CollInfo {
                shape: shape.clone(),
                linear,
            },
        );
        self.send_sys(
            0,
            SysMsg::Create(CreateSpec {
                coll,
                type_id,
                shape,
                init,
            }),
        );
        coll
    }

    pub(crate) fn insert(&mut self, coll: CollId, key: IndexKey, init: Vec<u8>, on: Option<PeId>) {
        if let Some(pe) = on {
            assert!(
                pe < self.num_pes(),
                "cannot insert on PE {pe}: the job has {} PEs",
                self.num_pes()
            );
        }
        self.send_sys(
            0,
            SysMsg::InsertRequest {
                coll,
                key,
                init,
                on,
            },
        );
    }

    pub(crate) fn send_element(
        &mut self,
        coll: CollId,
        key: IndexKey,
        prio: i32,
        payload: Payload,
    ) {
        let dest = Dest::Element {
            coll,
            key,
            src: self.pe,
        };
        match self.locate(coll, key) {
            Some(pe) => self.send_env(
                pe,
                Envelope {
                    prio,
                    dest,
                    payload,
                    counted: true,
                },
            ),
            // The collection's creation has not reached this PE yet: hold the message here.
            None => self.hold_for_creation(
                coll,
                Envelope {
                    prio,
                    dest,
                    payload,
                    counted: false,
                },
            ),
        }
    }

    pub(crate) fn send_member(&mut self, coll: CollId, pe: PeId, prio: i32, payload: Payload) {
        assert!(
            pe < self.num_pes(),
            "no PE {pe}: the job has {} PEs",
            self.num_pes()
        );
        self.send_env(
            pe,
            Envelope {
                prio,
                dest: Dest::Member { coll },
                payload,
                counted: true,
            },
        );
    }

    pub(crate) fn broadcast(&mut self, coll: CollId, prio: i32, payload: Payload) {
        self.send_env(
            0,
            Envelope {
                prio,
                dest: Dest::Broadcast { coll, seq: 0 },
                payload,
                counted: true,
            },
        );
    }

    /// Charges an entry method that took `spent`: emulates this PE's slowdown
    /// by spinning for the extra time, and returns what the method cost in all.
    pub(crate) fn charge(&mut self, spent: Duration) -> Duration {
        let total = if self.lb.slowdown > 1.0 {
            let total = spent.mul_f64(self.lb.slowdown);
            let until = Instant::now() + (total - spent);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            total
        } else {
            spent
        };
        self.lb.busy += total;
        total
    }

    /// Whether elements of `coll` may move: array elements, but not main or
    /// group and nodegroup members (whose PE is their identity).
    pub(crate) fn is_migratable(&self, coll: CollId) -> bool {
        coll != MAIN_COLL
            && matches!(
                self.loc.colls.get(&coll).map(|c| &c.shape),
                Some(Shape::Array { .. })
            )
    }

    pub(crate) fn depart(&mut self, d: Departure) {
        self.loc.departures.push(d);
    }

    pub(crate) fn contribute(
        &mut self,
        coll: CollId,
        no: u32,
        value: Value,
        reducer: Reducer,
        callback: CallbackSpec,
    ) {
        self.red.contributions.push(Partial {
            coll,
            no,
            value,
            count: 1,
            reducer,
            callback,
        });
    }

    pub(crate) fn note_local_element(&mut self, coll: CollId, key: IndexKey, hops: u64) {
        let me = self.pe;
        self.loc.cache.insert((coll, key), (me, hops));
        if let Some(home) = self.home_of(coll, key) {
            if home != me {
                self.send_sys(
                    home,
                    SysMsg::HomeUpdate {
                        coll,
                        key,
                        pe: me,
                        hops,
                    },
                );
            } else {
                self.loc.homes.insert((coll, key), (me, hops));
            }
        }
        if let Some(held) = self.loc.waiting.remove(&(coll, key)) {
            for env in held {
                self.release(self.pe, env);
            }
        }
    }
}
