//! The reconciler's shared state ([`Context`]), what it remembers of each
//! job between reconciles ([`JobRuntime`]), and the reconciles the operator
//! asks for itself ([`Requeue`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ductile_coordinator::control::{JobStatus, RescaleReport};
use ductile_coordinator::Secret;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event as K8sEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};

use super::control::{ControlEndpoint, TcpControl};
use super::error::*;
use super::metrics::Metrics;
use super::notices::NoticeKind;
use super::objects::{self, ObjectSettings};
use super::pods::PodCache;
use super::MANAGER;
use crate::crd::{ElasticJob, RescaleRecord};
use crate::policy::{Policy, PolicyConfig};

/// A wall clock the reconciler reads (tests substitute their own).
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// What the reconciler remembers of one job between reconciles.
pub(super) struct JobRuntime {
    pub(super) uid: String,
    /// Virtual time zero of this job's policy.
    pub(super) origin: Timestamp,
    pub(super) policy: Policy,
    /// `spec.replicas` as last fed to the policy.
    pub(super) desired: u32,
    pub(super) secret: Option<Secret>,
    /// Notices fed to the policy, by pod and kind.
    pub(super) noticed: BTreeSet<(String, NoticeKind)>,
    /// First notice per pod, for the notice-to-commit histogram.
    pub(super) first_notice: BTreeMap<String, Timestamp>,
    /// Pods reported gone to the policy.
    pub(super) gone: BTreeSet<String>,
    /// Newcomer pods created, with the member each replaces.
    pub(super) newcomers: BTreeMap<String, Option<String>>,
    /// The job's status as PE 0 last reported it.
    pub(super) view: Option<JobStatus>,
    pub(super) last_rescale: Option<RescaleRecord>,
    pub(super) control_error: Option<String>,
    /// The rescale PE 0 is working on, in a background task.
    pub(super) rescale: Option<RescaleInFlight>,
    /// The run was torn down (suspend, relaunch): the next launch starts
    /// afresh, whatever a stale cached status still says.
    pub(super) fresh_start: bool,
    /// With `faultTolerance`: members whose pod ended while the view still
    /// listed them; a later view without them is the runtime's recovery.
    pub(super) awaiting_recovery: BTreeSet<String>,
    /// Recoveries counted so far (`status.recoveries`), from the status
    /// first seen on; `None` until the first.
    pub(super) recoveries: Option<i32>,
}

/// A rescale request running in a background task: the reconcile that
/// asked goes on, and the task triggers a reconcile of the job when PE 0
/// answers (the result waits here).
pub(super) struct RescaleInFlight {
    pub(super) reason: crate::policy::RescaleReason,
    /// Pods asked to leave.
    pub(super) removed: Vec<String>,
    pub(super) result: tokio::sync::oneshot::Receiver<Result<(RescaleReport, JobStatus), String>>,
}

/// Reconciles asked for by the operator itself (a finished rescale), for
/// the controllers to pick up ([`Requeue::stream`]).
#[derive(Clone)]
pub struct Requeue {
    pub(super) tx: tokio::sync::broadcast::Sender<ObjectRef<ElasticJob>>,
}

impl Default for Requeue {
    fn default() -> Self {
        Requeue {
            tx: tokio::sync::broadcast::channel(256).0,
        }
    }
}

impl Requeue {
    /// Asks for a reconcile of `job`.
    pub fn send(&self, job: ObjectRef<ElasticJob>) {
        // No receiver: no controller runs (tests, shutdown); nothing to wake.
        let _ = self.tx.send(job);
    }

    /// The requests for the jobs of `namespace` (`None`: all), as a stream.
    pub fn stream(
        &self,
        namespace: Option<String>,
    ) -> impl futures::Stream<Item = ObjectRef<ElasticJob>> + Send + 'static {
        let rx = self.tx.subscribe();
        futures::stream::unfold(rx, move |mut rx| {
            let namespace = namespace.clone();
            async move {
                loop {
                    match rx.recv().await {
                        Ok(job) if namespace.is_none() || job.namespace == namespace => {
                            return Some((job, rx))
                        }
                        Ok(_) => {}
                        // Missed some: the jobs' own requeues cover them.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(missed = n, "reconcile requests lagged");
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }
        })
    }
}

impl JobRuntime {
    pub(super) fn new(job: &ElasticJob, now: Timestamp) -> Self {
        let name = job.name_any();
        let desired = u32::try_from(job.spec.replicas).unwrap_or(1);
        JobRuntime {
            uid: job.uid().unwrap_or_default(),
            origin: now,
            policy: Policy::new(PolicyConfig::from_spec(&name, &job.spec), desired),
            desired,
            secret: None,
            noticed: BTreeSet::new(),
            first_notice: BTreeMap::new(),
            gone: BTreeSet::new(),
            newcomers: BTreeMap::new(),
            view: None,
            last_rescale: None,
            control_error: None,
            rescale: None,
            fresh_start: false,
            awaiting_recovery: BTreeSet::new(),
            recoveries: None,
        }
    }

    /// Virtual time of a wall-clock instant.
    pub(super) fn vt(&self, at: Timestamp) -> Duration {
        Duration::try_from(at.duration_since(self.origin)).unwrap_or(Duration::ZERO)
    }

    pub(super) fn member_pods(&self) -> BTreeSet<String> {
        self.policy.members().map(|m| m.0.clone()).collect()
    }
}

/// Shared state of the reconciler.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Settings the objects depend on.
    pub settings: ObjectSettings,
    /// How PE 0's control endpoint is reached.
    pub control: Arc<dyn ControlEndpoint>,
    /// Port of the control endpoint in node 0's pod.
    pub control_port: u16,
    /// Longest wait for a rescale's report.
    pub rescale_timeout: Duration,
    /// Nodes, as a reflector keeps them (taints carry the notices).
    pub nodes: Store<Node>,
    /// The jobs' pods, as the controllers' reflectors keep them.
    pub pods: PodCache,
    /// Publishes Kubernetes Events.
    pub recorder: Recorder,
    /// The operator's metrics.
    pub metrics: Arc<Metrics>,
    /// Reconciles the operator asks for itself (finished rescales).
    pub requeue: Requeue,
    /// The wall clock.
    pub clock: Clock,
    pub(super) jobs: Mutex<HashMap<String, JobRuntime>>,
    pub(super) failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    /// A context with the real control endpoint, the system clock and fresh metrics.
    pub fn new(
        client: Client,
        settings: ObjectSettings,
        nodes: Store<Node>,
        pods: PodCache,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: MANAGER.to_owned(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Context {
            client,
            settings,
            control: Arc::new(TcpControl::default()),
            control_port: objects::CONTROL_PORT as u16,
            rescale_timeout: Duration::from_secs(600),
            nodes,
            pods,
            recorder,
            metrics: Arc::new(Metrics::default()),
            requeue: Requeue::default(),
            clock: Arc::new(Timestamp::now),
            jobs: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn now(&self) -> Timestamp {
        (self.clock)()
    }

    /// Takes the job's runtime out of the map (a job is never reconciled
    /// twice at once); a new one when the job is new or was recreated.
    pub(super) fn take_runtime(&self, key: &str, job: &ElasticJob) -> JobRuntime {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        match jobs.remove(key) {
            Some(rt) if Some(&rt.uid) == job.uid().as_ref() => rt,
            _ => JobRuntime::new(job, self.now()),
        }
    }

    pub(super) fn put_runtime(&self, key: String, rt: JobRuntime) {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, rt);
    }

    pub(super) fn forget(&self, key: &str) {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    pub(super) async fn publish(
        &self,
        job: &ElasticJob,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = K8sEvent {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        // An Event that cannot be written is not worth failing the reconcile for.
        if let Err(error) = self.recorder.publish(&event, &job.object_ref(&())).await {
            tracing::warn!(job = %job.name_any(), %error, reason, "could not publish an Event");
        }
    }
}

pub(super) fn key(job: &ElasticJob) -> String {
    format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any())
}
