//! The one narrow interface between the chare-facing API (`Ctx`, proxies,
//! callbacks, readonly handles, collection stores, device buffers) and the
//! PE that runs them: [`PeCtx`].
//!
//! `PeCtx` is a trait object: the scheduler's state (`pe.rs`) implements
//! [`PePort`] (and so does `Ctx`, by handing each call to its PE), and an entry method sees only what the trait offers —
//! sending, creating and inserting, contributing, readonly data, the job's
//! shape. So the chare-facing modules import this file, never the
//! scheduler, and the scheduler (which calls the stores) sits above them.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use crate::msg::{CallbackSpec, CollId, IndexKey, Payload};
use crate::reduce::{Reducer, Value};
use crate::system::{Departure, Shape};
use crate::topo::{Pe, Topology};

mod sealed {
    /// Only the runtime's scheduler implements [`super::PePort`].
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// The per-PE runtime handle that entry methods, proxies and stores send
/// through (`&mut PeCtx`; a [`Ctx`](crate::Ctx) is one, and dereferences to
/// the PE's).
pub type PeCtx<'a> = dyn PePort + 'a;

/// What the chare-facing API may ask of its PE. Implemented by the runtime
/// only (sealed); programs use it as [`PeCtx`] and call the methods of
/// `PeCtx` itself. Its methods are the runtime's internals.
// The methods name crate-private types (payloads, shapes, departures): the
// trait is public only so that `PeCtx` can be, and no program can call them.
#[allow(private_interfaces)]
pub trait PePort: Sealed {
    #[doc(hidden)]
    fn port_pe(&self) -> Pe;
    #[doc(hidden)]
    fn port_topology(&self) -> &Topology;
    #[doc(hidden)]
    fn port_args(&self) -> &[String];
    #[doc(hidden)]
    fn port_exit(&mut self, code: i32);
    #[doc(hidden)]
    fn on_rescale_spec(&mut self, callback: CallbackSpec);
    #[doc(hidden)]
    fn start_quiescence_spec(&mut self, callback: CallbackSpec);
    #[doc(hidden)]
    fn after_spec(&mut self, delay: Duration, callback: CallbackSpec);
    #[doc(hidden)]
    fn set_readonly(&mut self, id: u64, name: &str, value: Arc<dyn Any + Send + Sync>);
    #[doc(hidden)]
    fn readonly_value(&self, id: u64) -> Option<&(dyn Any + Send + Sync)>;
    #[doc(hidden)]
    fn create_collection(&mut self, type_id: u64, shape: Shape, init: Vec<u8>) -> CollId;
    #[doc(hidden)]
    fn insert(&mut self, coll: CollId, key: IndexKey, init: Vec<u8>, on: Option<Pe>);
    #[doc(hidden)]
    fn send_element(&mut self, coll: CollId, key: IndexKey, prio: i32, payload: Payload);
    #[doc(hidden)]
    fn send_member(&mut self, coll: CollId, pe: Pe, prio: i32, payload: Payload);
    #[doc(hidden)]
    fn broadcast(&mut self, coll: CollId, prio: i32, payload: Payload);
    #[doc(hidden)]
    fn charge(&mut self, spent: Duration) -> Duration;
    #[doc(hidden)]
    fn is_migratable(&self, coll: CollId) -> bool;
    #[doc(hidden)]
    fn depart(&mut self, d: Departure);
    #[doc(hidden)]
    fn contribute(
        &mut self,
        coll: CollId,
        no: u32,
        value: Value,
        reducer: Reducer,
        callback: CallbackSpec,
    );
    #[doc(hidden)]
    fn note_local_element(&mut self, coll: CollId, key: IndexKey, hops: u64);
}

impl<'a> PeCtx<'a> {
    /// This PE's global number.
    pub fn my_pe(&self) -> Pe {
        self.port_pe()
    }
    /// Number of PEs in the job.
    pub fn num_pes(&self) -> u32 {
        self.port_topology().num_pes()
    }
    /// This node's id.
    pub fn my_node(&self) -> u32 {
        self.port_topology().my_node()
    }
    /// Number of nodes in the job.
    pub fn num_nodes(&self) -> u32 {
        self.port_topology().num_nodes()
    }
    /// The current topology.
    pub fn topology(&self) -> &Topology {
        self.port_topology()
    }
    /// The program's command-line arguments (without the program name).
    pub fn args(&self) -> &[String] {
        self.port_args()
    }

    /// Ends the job: every PE stops, every node passes the shutdown barrier,
    /// and every process exits with `code`.
    pub fn exit(&mut self, code: i32) {
        self.port_exit(code);
    }

    /// This PE's GPU: its device, the node's context for it (the same one
    /// for the whole life of the process, whatever rescales happen) and the
    /// PE's stream. An error when the program did not ask for GPUs.
    #[cfg(feature = "cuda")]
    pub fn gpu(&self) -> Result<&'static crate::gpu::PeGpu, crate::gpu::GpuError> {
        crate::gpu::current()
    }
}
