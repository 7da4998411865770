//! The Kubernetes fleet: a kube-runtime `Controller` that reconciles
//! ElasticJobs into the objects of [`objects`] and drives each running job
//! with the rescale policy of [`crate::policy`].
//!
//! Per reconcile of one ElasticJob:
//!
//! 1. an invalid spec is reported in the `SpecValid=False` condition and
//!    nothing else changes (a job being deleted is still torn down);
//! 2. the finalizer [`objects::FINALIZER`] is added (kube-runtime's
//!    `finalizer` helper); on deletion, [`cleanup`] deletes the job's pods
//!    and forgets its policy before the finalizer goes;
//! 3. the job Secret (generated when `secretRef` is absent), the headless
//!    Service, and before the first epoch the missing launch pods;
//! 4. `spec.suspend` deletes the job's pods (phase Suspended); a resumed
//!    or relaunched job waits until the last run's pods are gone, then
//!    launches afresh; node 0's pod decides the phase: ended with success
//!    the job is Succeeded, with failure it is relaunched under
//!    `restartPolicy: OnFailure` until `backoffLimit`, else Failed; running, the job's status is read from
//!    its control endpoint ([`control`]) at the pod's IP;
//! 5. what Kubernetes and the job show becomes policy [`Event`]s, each fed
//!    once: view members (`MemberJoined`), registered newcomers
//!    (`NewcomerReady`), notices from node taints and pod deletion
//!    ([`notices`]), pods that ended or vanished (`MemberGone`), and
//!    `spec.replicas` (`DesiredReplicas`);
//! 6. the policy's [`Decision`]s are carried out: newcomer pods
//!    (`DUCTILE_ROLE=newcomer`) are created, cancelled newcomers' pods
//!    deleted, rescales are requested from PE 0 in a background task that
//!    wakes the job when PE 0 answers ([`Requeue`]; the phase is Rescaling
//!    meanwhile and PE 0 is not asked for its status), vacated pods are
//!    deleted, and every decision is recorded as a Kubernetes Event;
//! 7. `status` is written by server-side apply (phase, epoch, replicas,
//!    members, at-risk pods, last rescale with its stage timings,
//!    conditions with `observedGeneration`), and the reconcile is requeued
//!    at the policy's next wake-up (timeouts, deadlines) or to poll the
//!    control endpoint while newcomers register.
//!
//! A reconcile reads its job's pods from the controllers' pod cache
//! ([`PodCache`], one reflector per watched namespace), never by listing
//! them, and creates pods by server-side apply with [`MANAGER`]. A change
//! to `minReplicas`, `maxReplicas` or `rescalePolicy` is handed to the
//! job's running policy at the next reconcile.
//!
//! Pods and view members are matched by name: every pod's `hostname` is its
//! own name, and a node reports its host name when it registers.
//!
//! The policy of a job lives in memory ([`Context`]); after an operator
//! restart it is rebuilt from what the job and the cluster show (members,
//! pending newcomers, taints), but replacement pairings and in-flight
//! timeouts restart from that moment.

pub mod control;
pub mod entry;
pub mod leader;
pub mod metrics;
pub mod notices;
pub mod objects;

mod context;
mod decide;
mod error;
mod lifecycle;
mod observe;
mod pods;
mod reconcile;
mod rescale;
mod run;
mod status;

/// Field manager of every server-side apply the operator makes.
pub const MANAGER: &str = "ductile-operator";

pub use context::{Clock, Context, Requeue};
pub use error::{Error, Result};
pub use pods::PodCache;
pub use reconcile::{backoff, cleanup, error_policy, reconcile};
pub use run::run;

#[cfg(test)]
mod tests;
