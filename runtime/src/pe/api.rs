//! What entry methods, proxies, readonly handles and collection stores may
//! do with their PE, and the [`PePort`] that hands it to them as
//! [`PeCtx`](crate::PeCtx): sending, creating, inserting, contributing and
//! readonly data; everything else about the PE stays behind it.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::location::CollInfo;
use super::PeState;
use crate::msg::{CallbackSpec, CollId, Dest, Envelope, IndexKey, Payload, MAIN_COLL};
use crate::port::{PePort, Sealed};
use crate::reduce::{Reducer, Value};
use crate::system::{CreateSpec, Departure, Partial, Shape, SysMsg};
use crate::topo::{Pe as PeId, Topology};

impl PeState {
    /// Number of PEs in the job.
    pub(crate) fn num_pes(&self) -> u32 {
        self.topo.num_pes()
    }
    /// The program's command-line arguments (without the program name).
    pub(crate) fn args(&self) -> &[String] {
        &self.node.args
    }

    /// Ends the job: every PE stops, every node passes the shutdown barrier,
    /// and every process exits with `code`.
    pub(crate) fn exit(&mut self, code: i32) {
        self.send_sys(0, SysMsg::ExitRequest { code });
    }

    /// Calls `callback` with the job's new PE count after every rescale, once
    /// the job runs at its new size (Charm++'s resume-after-shrink/expand).
    pub(crate) fn on_rescale(&mut self, callback: CallbackSpec) {
        self.send_sys(0, SysMsg::OnRescale { callback });
    }

    /// Calls `callback` once no application message is queued or in flight
    /// anywhere in the job (Charm++'s quiescence detection).
    pub(crate) fn start_quiescence(&mut self, callback: CallbackSpec) {
        self.send_sys(0, SysMsg::QdStart { callback });
    }

    /// Calls `callback` on this PE once `delay` has passed.
    pub(crate) fn after(&mut self, delay: Duration, callback: CallbackSpec) {
        self.timers.add(Instant::now() + delay, callback);
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

impl Sealed for PeState {}

impl PePort for PeState {
    #[inline]
    fn port_pe(&self) -> PeId {
        self.pe
    }
    #[inline]
    fn port_topology(&self) -> &Topology {
        &self.topo
    }
    fn port_args(&self) -> &[String] {
        self.args()
    }
    fn port_exit(&mut self, code: i32) {
        self.exit(code);
    }
    fn on_rescale_spec(&mut self, callback: CallbackSpec) {
        self.on_rescale(callback);
    }
    fn start_quiescence_spec(&mut self, callback: CallbackSpec) {
        self.start_quiescence(callback);
    }
    fn after_spec(&mut self, delay: Duration, callback: CallbackSpec) {
        self.after(delay, callback);
    }
    fn set_readonly(&mut self, id: u64, name: &str, value: Arc<dyn Any + Send + Sync>) {
        PeState::set_readonly(self, id, name, value);
    }
    fn readonly_value(&self, id: u64) -> Option<&(dyn Any + Send + Sync)> {
        PeState::readonly_value(self, id)
    }
    fn create_collection(&mut self, type_id: u64, shape: Shape, init: Vec<u8>) -> CollId {
        PeState::create_collection(self, type_id, shape, init)
    }
    fn insert(&mut self, coll: CollId, key: IndexKey, init: Vec<u8>, on: Option<PeId>) {
        PeState::insert(self, coll, key, init, on);
    }
    #[inline]
    fn send_element(&mut self, coll: CollId, key: IndexKey, prio: i32, payload: Payload) {
        PeState::send_element(self, coll, key, prio, payload);
    }
    #[inline]
    fn send_member(&mut self, coll: CollId, pe: PeId, prio: i32, payload: Payload) {
        PeState::send_member(self, coll, pe, prio, payload);
    }
    #[inline]
    fn broadcast(&mut self, coll: CollId, prio: i32, payload: Payload) {
        PeState::broadcast(self, coll, prio, payload);
    }
    #[inline]
    fn charge(&mut self, spent: Duration) -> Duration {
        PeState::charge(self, spent)
    }
    fn is_migratable(&self, coll: CollId) -> bool {
        PeState::is_migratable(self, coll)
    }
    fn depart(&mut self, d: Departure) {
        PeState::depart(self, d);
    }
    #[inline]
    fn contribute(
        &mut self,
        coll: CollId,
        no: u32,
        value: Value,
        reducer: Reducer,
        callback: CallbackSpec,
    ) {
        PeState::contribute(self, coll, no, value, reducer, callback);
    }
    fn note_local_element(&mut self, coll: CollId, key: IndexKey, hops: u64) {
        PeState::note_local_element(self, coll, key, hops);
    }
}
