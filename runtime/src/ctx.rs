//! The context an entry method runs in: which element it is, where it runs,
//! and what it may do besides sending (contribute, exit, quiescence).
//!
//! `Ctx<C>` dereferences to [`PeCtx`], the untyped per-PE runtime handle that
//! proxies send through, so `proxy.elem(i).send(ctx, msg)` works from any
//! entry method.

use std::any::Any;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use crate::callback::Callback;
use crate::chare::Chare;
use crate::msg::{CallbackSpec, CollId, IndexKey, Payload, Target};
use crate::port::{PeCtx, PePort, Sealed};
use crate::proxy::{ArrayProxy, ElementProxy, GroupProxy};
use crate::reduce::{custom_value, Reducer, Reducible, Value};
use crate::system::{Departure, ElemMeta, Shape};
use crate::topo::{Pe, Topology};

/// The context of one entry-method invocation on element `C`.
pub struct Ctx<'a, C: Chare> {
    pe: &'a mut PeCtx<'a>,
    coll: CollId,
    index: C::Index,
    meta: &'a mut ElemMeta,
}

impl<'a, C: Chare> Ctx<'a, C> {
    pub(crate) fn new(
        pe: &'a mut PeCtx<'a>,
        coll: CollId,
        index: C::Index,
        meta: &'a mut ElemMeta,
    ) -> Self {
        Ctx {
            pe,
            coll,
            index,
            meta,
        }
    }

    /// This element's index.
    pub fn index(&self) -> C::Index {
        self.index
    }

    /// A proxy to this element's array.
    pub fn this_array(&self) -> ArrayProxy<C> {
        ArrayProxy::from_id(self.coll)
    }

    /// A proxy to this element.
    pub fn this_element(&self) -> ElementProxy<C> {
        self.this_array().elem(self.index)
    }

    /// A proxy to this member's group (meaningful for group and nodegroup members).
    pub fn this_group(&self) -> GroupProxy<C> {
        GroupProxy::from_id(self.coll)
    }

    /// Contributes `value` to this collection's next reduction. Every element
    /// (or group member) contributes once per reduction, in the same order;
    /// the combined value reaches `callback` once all have.
    pub fn contribute<T: Reducible>(&mut self, value: T, reducer: Reducer, callback: Callback<T>) {
        let v = match reducer {
            Reducer::Custom(_) => custom_value(&value),
            _ => value.into_value(),
        };
        let no = self.meta.next_red;
        self.meta.next_red += 1;
        self.pe.contribute(self.coll, no, v, reducer, callback.spec);
    }

    /// Joins this collection's next reduction without a value: a barrier whose
    /// completion is delivered to `callback`.
    pub fn barrier(&mut self, callback: Callback<()>) {
        self.contribute((), Reducer::Sum, callback);
    }

    /// Says that what this element ran since the last load-balancing step
    /// (its setup, before the first one) does not predict its work: the
    /// next step counts it as unmeasured. When every element of the array
    /// discounts its load, that step places them by count, and with a
    /// rate-aware strategy by the PEs' speeds (`Contiguous*`: even runs of
    /// elements, sized to each PE's speed): a placement for a fleet of
    /// unequal PEs before anything was measured. Call it before
    /// [`Ctx::at_sync`]. (Charm++ turns the measurement off instead,
    /// `LBTurnInstrumentOff`, for the whole PE.)
    pub fn discount_load(&mut self) {
        self.meta.unmeasured = true;
    }

    /// Joins a load-balancing step (Charm++'s AtSync): once every element of
    /// this array has called it, the runtime measures, runs the strategy,
    /// migrates elements, and calls [`Chare::resume_from_sync`] on each.
    /// It counts as one of the array's reductions, so every element must call
    /// it at the same point of its sequence of contributions.
    pub fn at_sync(&mut self) {
        self.meta.at_sync = true;
        let no = self.meta.next_red;
        self.meta.next_red += 1;
        let callback = CallbackSpec {
            target: Target::LbSync { coll: self.coll },
            prefix: Vec::new(),
        };
        self.pe
            .contribute(self.coll, no, Value::Unit, Reducer::Sum, callback);
    }

    /// Reports `iterations` more iterations of the program done, for the
    /// node's `ductile_app_iterations_total` (docs/metrics.md): its rate is
    /// the job's progress, which an HPA or an alert can follow. One relaxed
    /// atomic add; have one element (or main) report for the job.
    pub fn report_progress(&self, iterations: u64) {
        crate::activity::progress(iterations);
    }

    /// Moves this element to PE `pe` once this entry method returns. Messages
    /// sent to it before, during and after the move are delivered exactly once.
    ///
    /// # Panics
    /// If `pe` is not a PE of the job, or this is not an array element.
    pub fn migrate_me(&mut self, pe: Pe) {
        assert!(
            self.pe.is_migratable(self.coll),
            "{}: only array elements can migrate",
            C::NAME
        );
        assert!(
            pe < self.pe.num_pes(),
            "cannot migrate to PE {pe}: the job has {} PEs",
            self.pe.num_pes()
        );
        self.meta.migrate_to = Some(pe);
    }

    /// Destroys this element once this entry method returns. It stops owing
    /// contributions to the array's later reductions.
    ///
    /// # Panics
    /// If this is not an array element (groups and main live as long as the job).
    pub fn destroy(&mut self) {
        assert!(
            self.pe.is_migratable(self.coll),
            "{}: only array elements can be destroyed",
            C::NAME
        );
        self.meta.destroy = true;
    }
}

impl<'a, C: Chare> Deref for Ctx<'a, C> {
    type Target = PeCtx<'a>;
    fn deref(&self) -> &PeCtx<'a> {
        self.pe
    }
}

impl<'a, C: Chare> DerefMut for Ctx<'a, C> {
    fn deref_mut(&mut self) -> &mut PeCtx<'a> {
        self.pe
    }
}

impl<C: Chare> Sealed for Ctx<'_, C> {}

/// A `Ctx` is a [`PeCtx`] too, so `&mut Ctx` goes wherever `&mut PeCtx`
/// does (a proxy's `send`, a program's own helpers): each call goes to the
/// PE the entry method runs on.
// The trait's methods name crate-private types; programs cannot call them.
#[allow(private_interfaces)]
impl<C: Chare> PePort for Ctx<'_, C> {
    fn port_pe(&self) -> Pe {
        self.pe.port_pe()
    }
    fn port_topology(&self) -> &Topology {
        self.pe.port_topology()
    }
    fn port_args(&self) -> &[String] {
        self.pe.port_args()
    }
    fn port_exit(&mut self, code: i32) {
        self.pe.port_exit(code);
    }
    fn on_rescale_spec(&mut self, callback: CallbackSpec) {
        self.pe.on_rescale_spec(callback);
    }
    fn start_quiescence_spec(&mut self, callback: CallbackSpec) {
        self.pe.start_quiescence_spec(callback);
    }
    fn after_spec(&mut self, delay: Duration, callback: CallbackSpec) {
        self.pe.after_spec(delay, callback);
    }
    fn set_readonly(&mut self, id: u64, name: &str, value: Arc<dyn Any + Send + Sync>) {
        self.pe.set_readonly(id, name, value);
    }
    fn readonly_value(&self, id: u64) -> Option<&(dyn Any + Send + Sync)> {
        self.pe.readonly_value(id)
    }
    fn create_collection(&mut self, type_id: u64, shape: Shape, init: Vec<u8>) -> CollId {
        self.pe.create_collection(type_id, shape, init)
    }
    fn insert(&mut self, coll: CollId, key: IndexKey, init: Vec<u8>, on: Option<Pe>) {
        self.pe.insert(coll, key, init, on);
    }
    #[inline]
    fn send_element(&mut self, coll: CollId, key: IndexKey, prio: i32, payload: Payload) {
        self.pe.send_element(coll, key, prio, payload);
    }
    #[inline]
    fn send_member(&mut self, coll: CollId, pe: Pe, prio: i32, payload: Payload) {
        self.pe.send_member(coll, pe, prio, payload);
    }
    #[inline]
    fn broadcast(&mut self, coll: CollId, prio: i32, payload: Payload) {
        self.pe.broadcast(coll, prio, payload);
    }
    fn charge(&mut self, spent: Duration) -> Duration {
        self.pe.charge(spent)
    }
    fn is_migratable(&self, coll: CollId) -> bool {
        self.pe.is_migratable(coll)
    }
    fn depart(&mut self, d: Departure) {
        self.pe.depart(d);
    }
    fn contribute(
        &mut self,
        coll: CollId,
        no: u32,
        value: Value,
        reducer: Reducer,
        callback: CallbackSpec,
    ) {
        self.pe.contribute(coll, no, value, reducer, callback);
    }
    fn note_local_element(&mut self, coll: CollId, key: IndexKey, hops: u64) {
        self.pe.note_local_element(coll, key, hops);
    }
}
