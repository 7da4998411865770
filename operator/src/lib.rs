//! `ductile-operator`: the fleets that run Ductile jobs, and the `ductile`
//! command line.
//!
//! * [`local`]: the local fleet, nodes as processes on this machine: launch,
//!   supervision, termination (later: newcomers, fault injection);
//! * [`state`]: a job's state directory and its `job.json` record;
//! * [`cli`]: the `ductile` command line (clap definitions and dispatch);
//! * [`contract`]: the environment contract with the job's processes,
//!   re-exported from the coordinator crate.
//!
//! The Kubernetes operator (ElasticJob CRD, reconciler, rescale policy) will
//! live here too. See `docs/cli.md` for the command line.

pub mod cli;
pub mod contract;
pub mod local;
pub mod state;

pub use local::{launch, JobReport, JobSpec, LaunchError, StopRequest};
pub use state::{JobResult, JobState, Outcome};
