//! Ductile: a Charm++-style message-driven runtime for malleable HPC jobs.
//!
//! Programs are written as chares — migratable objects with entry methods —
//! in indexed arrays, groups and nodegroups, with readonly globals,
//! asynchronous messages through typed proxies, broadcasts, reductions and
//! quiescence detection. One scheduler thread runs per PE; a node is one OS
//! process with several PEs; nodes talk through a [`transport`].
//!
//! A program registers its types and hands control to the runtime:
//! ```ignore
//! fn main() {
//!     ductile::launch(|reg| {
//!         reg.main::<Main>().chare::<Block>().readonly(&GRID);
//!     })
//! }
//! ```
//! See the README's "Writing a chare" for a walk-through.

mod activity;
pub mod affinity;
pub mod buffer;
pub mod bulk;
pub mod callback;
pub mod chare;
pub mod checkpoint;
mod collection;
mod contention;
mod control;
pub mod ctx;
pub mod elastic;
mod files;
pub mod gpu;
mod ids;
pub mod lb;
mod link;
mod malloc;
mod msg;
pub mod node;
mod operation;
pub mod options;
mod pe;
mod port;
pub mod proxy;
mod quota;
pub mod readonly;
pub mod reduce;
pub mod registry;
mod rescale;
mod scrape;
pub use scrape::exported_series;
mod system;
pub mod topo;
mod traffic;
pub mod transport;

pub use buffer::Pending;
pub use bulk::Bulk;
pub use callback::Callback;
pub use chare::{ArrayIndex, BulkIndex, Chare, IndexKey, Message};
pub use ctx::Ctx;
pub use msg::CollId;
pub use node::launch;
pub use port::PeCtx;
pub use proxy::{main_chare, ArrayProxy, ElementProxy, GroupProxy, NodeGroupProxy};
pub use readonly::Readonly;
pub use reduce::{Reducer, Reducible, Value};
pub use registry::Registry;
#[doc(hidden)]
pub use system::{buddy_copy_frame, migrate_frame};
pub use system::decode_frame_rank;
pub use topo::{Pe, Topology};

/// Re-exports for `use ductile::prelude::*`.
pub mod prelude {
    pub use crate::{
        main_chare, ArrayIndex, ArrayProxy, Bulk, BulkIndex, Callback, Chare, Ctx, ElementProxy,
        GroupProxy, NodeGroupProxy, PeCtx, Pending, Readonly, Reducer, Registry,
    };
    pub use serde::{Deserialize, Serialize};
}
