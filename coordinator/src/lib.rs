//! `ductile-coordinator`: the membership server of one Ductile job, and its
//! blocking client.
//!
//! The coordinator holds the job's canonical membership (an epoch and an
//! ordered member list) and the queue of newcomers, and runs four flows: the
//! launch registration and start barrier, newcomer registration, rescale
//! commits (QueryPending / Commit / Integrate / Die), and the shutdown barrier.
//! After a restart it rebuilds its state from node 0's view.
//!
//! * [`proto`]: the wire types and the frame codec;
//! * [`secret`], [`contract`]: the job secret and the environment contract;
//!   [`lifeline`]: how a local launcher's processes notice it is gone;
//! * [`core`]: the sans-IO state machine (all protocol rules live here);
//! * [`server`]: the tokio layer that drives it; [`cli`]: the command line;
//! * [`client`]: the blocking client the runtime's nodes use;
//! * [`fuzzing`]: the fuzz targets and a seeded mutation driver for stable;
//! * [`metrics`]: the process's Prometheus registry and the HTTP server of
//!   its metrics port, for the runtime and the operator; [`logs`]: the
//!   `tracing` set-up every binary shares (text or JSON).
//!
//! It does not depend on the runtime. See `docs/coordinator.md`.

pub mod cli;
pub mod client;
pub mod contract;
pub mod control;
pub mod core;
pub mod fuzzing;
pub mod lifeline;
pub mod logs;
pub mod metrics;
pub mod proto;
pub mod secret;
pub mod server;

pub use client::{Admission, Client, ClientError};
pub use proto::{ClientMsg, Epoch, Member, NodeId, Registration, Role, ServerMsg, View};
pub use secret::Secret;
