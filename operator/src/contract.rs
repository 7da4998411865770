//! The environment contract between a launcher and the processes it starts.
//!
//! The single source of the variable names is `ductile_coordinator::contract`;
//! this module re-exports it so the fleets in this crate never spell a name
//! twice. See `docs/cli.md` for the table of variables.

pub use ductile_coordinator::contract::*;
