//! The node: one OS process of a job. It reads the fleet's environment
//! contract, registers with the coordinator, connects to its peers, runs one
//! scheduler thread per PE, and passes the shutdown barrier before it exits
//! with the job's code.
//!
//! Exit codes of a node process: the job's code after a clean exit; 2 when it
//! could not start (bad environment, refused by the coordinator, registry
//! errors); 3 when it stopped because a peer or the coordinator was lost;
//! 101 when a PE panicked.
//!
//! A coordinator connection that drops while the job runs does not end the
//! job at once: the node rejoins the coordinator at the same address (a
//! restarted one, see `link.rs`) within `DUCTILE_COORDINATOR_RECONNECT`
//! seconds, and only then gives up.
//!
//! Its parts, one job each:
//! - `shared.rs`: [`NodeShared`], the state every thread of the node reads
//!   (inboxes, topology, view, transport, frame counts, the operation slot),
//!   and the transport's sink with the buffer for frames that come before
//!   the first view;
//! - `startup.rs`: [`launch`], the environment contract, the transport,
//!   registration and admission, then the node's main thread until the end;
//! - `coordinator.rs`: the watcher that forwards the coordinator's notices,
//!   rejoining a restarted coordinator, and the shutdown barrier;
//! - `pes.rs`: the PE threads.

mod coordinator;
mod pes;
mod shared;
mod startup;

pub(crate) use shared::NodeShared;
pub use startup::launch;

/// Exit code of a node that could not start.
pub const EXIT_STARTUP: i32 = 2;
/// Exit code of a node that stopped because a peer or the coordinator was lost.
pub const EXIT_ABORTED: i32 = 3;
/// Exit code of a node whose PE panicked.
pub const EXIT_PANIC: i32 = 101;

/// An environment variable's value; unset and empty are the same.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}
