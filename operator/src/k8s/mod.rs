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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ductile_coordinator::control::{ControlError, JobStatus, RescaleReport, RescaleRequest};
use ductile_coordinator::Secret;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Secret as K8sSecret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as K8sEvent, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::crd::{
    ElasticJob, ElasticJobStatus, JobRestartPolicy, MemberStatus, Phase, RescaleRecord,
};
use crate::policy::{Capacity, Decision, Event, MemberId, Policy, PolicyConfig, Report};
use control::{ControlEndpoint, ControlTarget, TcpControl};
use metrics::Metrics;
use notices::{NoticeKind, PodState};
use objects::ObjectSettings;

/// Field manager of every server-side apply the operator makes.
pub const MANAGER: &str = "ductile-operator";

/// What can go wrong in a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The ElasticJob has no namespace (it is a namespaced resource).
    #[error("ElasticJob {0} has no namespace")]
    NoNamespace(String),
    /// The job secret named by `spec.secretRef` is missing or malformed.
    #[error("job secret {name}: {problem}")]
    Secret {
        /// The Secret's name.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// Adding or removing the finalizer, or the work it wraps, failed.
    #[error("{0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// A blocking call to the control endpoint could not run.
    #[error("control endpoint task: {0}")]
    Task(String),
}

impl Error {
    /// A short class for the error metric.
    pub fn class(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::NoNamespace(_) => "no-namespace",
            Error::Secret { .. } => "secret",
            Error::Task(_) => "task",
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.class(),
                _ => "finalizer",
            },
        }
    }
}

/// Result of the reconciler's operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A wall clock the reconciler reads (tests substitute their own).
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// What the reconciler remembers of one job between reconciles.
struct JobRuntime {
    uid: String,
    /// Virtual time zero of this job's policy.
    origin: Timestamp,
    policy: Policy,
    /// `spec.replicas` as last fed to the policy.
    desired: u32,
    secret: Option<Secret>,
    /// Notices fed to the policy, by pod and kind.
    noticed: BTreeSet<(String, NoticeKind)>,
    /// First notice per pod, for the notice-to-commit histogram.
    first_notice: BTreeMap<String, Timestamp>,
    /// Pods reported gone to the policy.
    gone: BTreeSet<String>,
    /// Newcomer pods created, with the member each replaces.
    newcomers: BTreeMap<String, Option<String>>,
    /// The job's status as PE 0 last reported it.
    view: Option<JobStatus>,
    last_rescale: Option<RescaleRecord>,
    control_error: Option<String>,
    /// The rescale PE 0 is working on, in a background task.
    rescale: Option<RescaleInFlight>,
    /// The run was torn down (suspend, relaunch): the next launch starts
    /// afresh, whatever a stale cached status still says.
    fresh_start: bool,
}

/// A rescale request running in a background task: the reconcile that
/// asked goes on, and the task triggers a reconcile of the job when PE 0
/// answers (the result waits here).
struct RescaleInFlight {
    reason: crate::policy::RescaleReason,
    /// Pods asked to leave.
    removed: Vec<String>,
    result: tokio::sync::oneshot::Receiver<Result<(RescaleReport, JobStatus), String>>,
}

/// Reconciles asked for by the operator itself (a finished rescale), for
/// the controllers to pick up ([`Requeue::stream`]).
#[derive(Clone)]
pub struct Requeue {
    tx: tokio::sync::broadcast::Sender<ObjectRef<ElasticJob>>,
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
    fn new(job: &ElasticJob, now: Timestamp) -> Self {
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
        }
    }

    /// Virtual time of a wall-clock instant.
    fn vt(&self, at: Timestamp) -> Duration {
        Duration::try_from(at.duration_since(self.origin)).unwrap_or(Duration::ZERO)
    }

    fn member_pods(&self) -> BTreeSet<String> {
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
    /// Publishes Kubernetes Events.
    pub recorder: Recorder,
    /// The operator's metrics.
    pub metrics: Arc<Metrics>,
    /// Reconciles the operator asks for itself (finished rescales).
    pub requeue: Requeue,
    /// The wall clock.
    pub clock: Clock,
    jobs: Mutex<HashMap<String, JobRuntime>>,
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    /// A context with the real control endpoint, the system clock and fresh metrics.
    pub fn new(client: Client, settings: ObjectSettings, nodes: Store<Node>) -> Self {
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
            recorder,
            metrics: Arc::new(Metrics::default()),
            requeue: Requeue::default(),
            clock: Arc::new(Timestamp::now),
            jobs: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn now(&self) -> Timestamp {
        (self.clock)()
    }

    /// Takes the job's runtime out of the map (a job is never reconciled
    /// twice at once); a new one when the job is new or was recreated.
    fn take_runtime(&self, key: &str, job: &ElasticJob) -> JobRuntime {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        match jobs.remove(key) {
            Some(rt) if Some(&rt.uid) == job.uid().as_ref() => rt,
            _ => JobRuntime::new(job, self.now()),
        }
    }

    fn put_runtime(&self, key: String, rt: JobRuntime) {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, rt);
    }

    fn forget(&self, key: &str) {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    async fn publish(
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

fn key(job: &ElasticJob) -> String {
    format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any())
}

fn condition(
    job: &ElasticJob,
    old: &[Condition],
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    now: Timestamp,
) -> Condition {
    let status = if ok { "True" } else { "False" }.to_owned();
    // The transition time moves only when the status does.
    let since = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        observed_generation: job.metadata.generation,
        last_transition_time: since,
    }
}

async fn patch_status(
    jobs: &Api<ElasticJob>,
    job: &ElasticJob,
    status: &ElasticJobStatus,
) -> Result<()> {
    let patch = json!({
        "apiVersion": "ductile.dev/v1alpha1",
        "kind": "ElasticJob",
        "status": status,
    });
    jobs.patch_status(
        &job.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// One reconcile of one ElasticJob (see the module docs for what it does).
pub async fn reconcile(job: Arc<ElasticJob>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconcile();
    let name = job.name_any();
    let ns = job
        .namespace()
        .ok_or_else(|| Error::NoNamespace(name.clone()))?;
    let jobs: Api<ElasticJob> = Api::namespaced(ctx.client.clone(), &ns);

    if !objects::is_deleting(&job) {
        if let Err(invalid) = job.spec.validate() {
            tracing::warn!(job = %name, %invalid, "invalid spec: nothing changed");
            let old = job.status.clone().unwrap_or_default();
            let status = ElasticJobStatus {
                observed_generation: job.metadata.generation,
                conditions: vec![condition(
                    &job,
                    &old.conditions,
                    "SpecValid",
                    false,
                    "InvalidSpec",
                    invalid.to_string(),
                    ctx.now(),
                )],
                ..old
            };
            patch_status(&jobs, &job, &status).await?;
            return Ok(Action::await_change());
        }
    }

    let job_key = key(&job);
    let result = finalizer(&jobs, objects::FINALIZER, job, |event| async {
        match event {
            FinalizerEvent::Apply(job) => {
                let mut rt = ctx.take_runtime(&job_key, &job);
                let result = apply(&job, &ctx, &mut rt).await;
                ctx.put_runtime(job_key.clone(), rt);
                result
            }
            FinalizerEvent::Cleanup(job) => cleanup(&job, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    if result.is_ok() {
        ctx.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&job_key);
    }
    result
}

/// Teardown before the finalizer goes: the job's pods are deleted now (not
/// left to the garbage collector, so that no newcomer keeps waiting and no
/// node outlives its job), and the job's policy is forgotten. The Service
/// and generated Secret go with their owner reference.
pub async fn cleanup(job: &ElasticJob, ctx: &Context) -> Result<Action> {
    let ns = job
        .namespace()
        .ok_or_else(|| Error::NoNamespace(job.name_any()))?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    delete_job_pods(job, &pods).await?;
    ctx.forget(&key(job));
    tracing::info!(job = %job.name_any(), "torn down");
    ctx.publish(
        job,
        EventType::Normal,
        "TornDown",
        "Cleanup",
        "the job's pods were deleted".to_owned(),
    )
    .await;
    Ok(Action::await_change())
}

/// What the pods of a job look like in one reconcile.
struct PodView {
    by_name: BTreeMap<String, Pod>,
    /// Pods deleted in this reconcile.
    deleted: BTreeSet<String>,
}

impl PodView {
    fn alive(&self) -> usize {
        self.by_name
            .iter()
            .filter(|(name, pod)| {
                !self.deleted.contains(*name)
                    && !matches!(
                        notices::pod_state(pod),
                        PodState::Succeeded | PodState::Failed
                    )
            })
            .count()
    }
}

async fn ensure_secret(job: &ElasticJob, ctx: &Context, rt: &mut JobRuntime) -> Result<()> {
    if rt.secret.is_some() {
        return Ok(());
    }
    let ns = job.namespace().unwrap_or_default();
    let secrets: Api<K8sSecret> = Api::namespaced(ctx.client.clone(), &ns);
    let name = objects::secret_name(job);
    let key = job
        .spec
        .secret_ref
        .as_ref()
        .map_or(objects::SECRET_KEY, |r| r.key.as_str());
    match secrets.get_opt(&name).await? {
        Some(existing) => {
            let bytes = existing
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .ok_or_else(|| Error::Secret {
                    name: name.clone(),
                    problem: format!("has no key {key:?}"),
                })?;
            let text = String::from_utf8_lossy(&bytes.0);
            let secret = Secret::from_hex(text.trim()).map_err(|e| Error::Secret {
                name: name.clone(),
                problem: e.to_string(),
            })?;
            rt.secret = Some(secret);
        }
        None if job.spec.secret_ref.is_none() => {
            let secret = Secret::generate();
            secrets
                .create(
                    &PostParams::default(),
                    &objects::job_secret(job, &secret.to_hex()),
                )
                .await?;
            tracing::info!(job = %job.name_any(), secret = %name, "job secret created");
            rt.secret = Some(secret);
        }
        None => {
            return Err(Error::Secret {
                name,
                problem: "not found (spec.secretRef names it)".to_owned(),
            });
        }
    }
    Ok(())
}

async fn apply(job: &ElasticJob, ctx: &Context, rt: &mut JobRuntime) -> Result<Action> {
    let name = job.name_any();
    let ns = job
        .namespace()
        .ok_or_else(|| Error::NoNamespace(name.clone()))?;
    let client = ctx.client.clone();
    let jobs: Api<ElasticJob> = Api::namespaced(client.clone(), &ns);
    let old = job.status.clone().unwrap_or_default();

    ensure_secret(job, ctx, rt).await?;

    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    services
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&objects::headless_service(job)),
        )
        .await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let listed = pods
        .list(&ListParams::default().labels(&objects::selector(job)))
        .await?;
    let mut view = PodView {
        by_name: listed
            .items
            .into_iter()
            .map(|p| (p.name_any(), p))
            .collect(),
        deleted: BTreeSet::new(),
    };
    rt.policy
        .reserve_names(view.by_name.keys().map(String::as_str));

    if job.spec.suspend {
        return suspend(job, ctx, rt, &mut view, &pods, &jobs, &old).await;
    }

    // Before epoch 1 the launch members are the pods 0..replicas; after it,
    // growth goes through newcomers (the policy).
    let launched = !rt.fresh_start && (old.epoch.is_some() || rt.view.is_some());
    if !launched {
        // A resumed or relaunched job starts afresh: every pod of the run
        // before must be gone first (their names are the launch pods').
        if old.phase == Some(Phase::Suspended) {
            ctx.publish(
                job,
                EventType::Normal,
                "Resumed",
                "Launch",
                "spec.suspend is off: the job is launched again".to_owned(),
            )
            .await;
        }
        if rt.fresh_start || matches!(old.phase, Some(Phase::Pending | Phase::Suspended)) {
            let leftovers = leftover_pods(&view);
            if !leftovers.is_empty() {
                tracing::info!(job = %name, ?leftovers, "waiting for the pods of the last run to go");
                if leftovers.iter().any(|(_, deleting)| !deleting) {
                    delete_job_pods(job, &pods).await?;
                }
                let waiting = leftovers.len();
                let mut status = fresh_status(
                    job,
                    ctx,
                    &old,
                    Phase::Pending,
                    "WaitingForPods",
                    format!("{waiting} pod(s) of the last run are still terminating"),
                );
                status.replicas = i32::try_from(waiting).unwrap_or(i32::MAX);
                patch_status(&jobs, job, &status).await?;
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
        }
        let replicas = u32::try_from(job.spec.replicas).unwrap_or(0);
        for index in 0..replicas {
            if let std::collections::btree_map::Entry::Vacant(slot) =
                view.by_name.entry(objects::pod_name(job, index))
            {
                let pod = pods
                    .create(
                        &PostParams::default(),
                        &objects::launch_pod(job, index, &ctx.settings),
                    )
                    .await?;
                slot.insert(pod);
            }
        }
        rt.fresh_start = false;
    }

    // Node 0 ends the job: its program's exit is the job's. A pod already
    // being deleted (a relaunch's) ended nothing new.
    let root = view.by_name.get(&objects::pod_name(job, 0)).cloned();
    let root_state = root.as_ref().map(notices::pod_state);
    let root_deleting = root
        .as_ref()
        .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
    if let Some(end @ (PodState::Succeeded | PodState::Failed)) = root_state {
        if end == PodState::Failed && !root_deleting {
            if let Some(action) = relaunch(job, ctx, rt, root.as_ref(), &pods, &jobs, &old).await? {
                return Ok(action);
            }
        }
        let phase = if end == PodState::Succeeded {
            Phase::Succeeded
        } else {
            Phase::Failed
        };
        if old.phase != Some(phase) {
            ctx.publish(
                job,
                if phase == Phase::Failed {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                &phase.to_string(),
                "JobEnded",
                format!("node 0 ended: the job {phase}"),
            )
            .await;
        }
        let mut status = build_status(job, ctx, rt, &view, phase, &old);
        if phase == Phase::Failed {
            status
                .conditions
                .push(failed_condition(job, &old, root.as_ref(), ctx.now()));
        }
        patch_status(&jobs, job, &status).await?;
        return Ok(Action::await_change());
    }

    // The answer of a rescale running in the background, if it came.
    finish_rescale(job, ctx, rt).await;

    // The job's own view, from PE 0 (not while it works on a rescale: the
    // last view holds until the answer).
    let root_ip = root
        .as_ref()
        .filter(|_| root_state == Some(PodState::Running))
        .and_then(|p| p.status.as_ref()?.pod_ip.clone());
    let target = root_ip
        .zip(rt.secret.clone())
        .map(|(ip, secret)| ControlTarget {
            address: format!("{ip}:{}", ctx.control_port),
            secret,
        });
    if let (Some(target), None) = (&target, &rt.rescale) {
        let endpoint = ctx.control.clone();
        let t = target.clone();
        match tokio::task::spawn_blocking(move || endpoint.status(&t)).await {
            Ok(Ok(status)) => {
                rt.view = Some(status);
                rt.control_error = None;
            }
            Ok(Err(error)) => {
                tracing::info!(job = %name, %error, "control endpoint not answering");
                rt.control_error = Some(error.to_string());
            }
            Err(join) => return Err(Error::Task(join.to_string())),
        }
    }

    if rt.view.is_some() {
        observe(job, ctx, rt, &view).await;
        if let Some(target) = &target {
            carry_out(job, ctx, rt, &mut view, &pods, target).await?;
        }
    }

    let phase = if rt.rescale.is_some() {
        Phase::Rescaling
    } else if rt.view.is_some() {
        Phase::Running
    } else {
        Phase::Launching
    };
    let status = build_status(job, ctx, rt, &view, phase, &old);
    patch_status(&jobs, job, &status).await?;
    Ok(Action::requeue(requeue_after(ctx, rt)))
}

/// Pods of a run that is over (being deleted, or ended), with whether each
/// is being deleted already.
fn leftover_pods(view: &PodView) -> Vec<(String, bool)> {
    view.by_name
        .iter()
        .filter_map(|(name, pod)| {
            let deleting = pod.metadata.deletion_timestamp.is_some();
            let ended = matches!(
                notices::pod_state(pod),
                PodState::Succeeded | PodState::Failed
            );
            (deleting || ended).then(|| (name.clone(), deleting))
        })
        .collect()
}

/// Deletes every pod of the job (one call, by label).
async fn delete_job_pods(job: &ElasticJob, pods: &Api<Pod>) -> Result<()> {
    pods.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(&objects::selector(job)),
    )
    .await?;
    Ok(())
}

/// The status of a job with no run in progress (suspended, waiting to be
/// relaunched): no epoch, no members; the restart count and the last
/// rescale are kept.
fn fresh_status(
    job: &ElasticJob,
    ctx: &Context,
    old: &ElasticJobStatus,
    phase: Phase,
    reason: &str,
    message: String,
) -> ElasticJobStatus {
    let now = ctx.now();
    ElasticJobStatus {
        phase: Some(phase),
        observed_generation: job.metadata.generation,
        restarts: old.restarts,
        last_rescale: old.last_rescale.clone(),
        conditions: vec![
            condition(
                job,
                &old.conditions,
                "SpecValid",
                true,
                "Valid",
                String::new(),
                now,
            ),
            condition(job, &old.conditions, "Ready", false, reason, message, now),
        ],
        selector: Some(objects::selector(job)),
        ..ElasticJobStatus::default()
    }
}

/// `spec.suspend`: the job's pods are deleted (the run is abandoned, a
/// rescale in flight with it) and the phase is Suspended; turning it off
/// launches the job afresh.
async fn suspend(
    job: &ElasticJob,
    ctx: &Context,
    rt: &mut JobRuntime,
    view: &mut PodView,
    pods: &Api<Pod>,
    jobs: &Api<ElasticJob>,
    old: &ElasticJobStatus,
) -> Result<Action> {
    let running: Vec<&String> = view
        .by_name
        .iter()
        .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
        .map(|(name, _)| name)
        .collect();
    if !running.is_empty() {
        delete_job_pods(job, pods).await?;
        tracing::info!(job = %job.name_any(), pods = running.len(), "suspended: pods deleted");
    }
    if old.phase != Some(Phase::Suspended) {
        ctx.publish(
            job,
            EventType::Normal,
            "Suspended",
            "Suspend",
            if running.is_empty() {
                "spec.suspend is set: nothing is launched".to_owned()
            } else {
                format!("spec.suspend is set: {} pod(s) deleted", running.len())
            },
        )
        .await;
    }
    // What the policy knew belongs to the run that ended.
    let secret = rt.secret.take();
    *rt = JobRuntime::new(job, ctx.now());
    rt.secret = secret;
    rt.fresh_start = true;
    view.deleted.extend(view.by_name.keys().cloned());
    let status = fresh_status(
        job,
        ctx,
        old,
        Phase::Suspended,
        "Suspended",
        "spec.suspend is set".to_owned(),
    );
    patch_status(jobs, job, &status).await?;
    Ok(Action::await_change())
}

/// `restartPolicy: OnFailure`: a job whose node 0 failed is relaunched from
/// the start while relaunches remain (`backoffLimit`): its pods are
/// deleted, the phase is Pending until they are gone, then the launch pods
/// are created again. `None`: no relaunch (the job is Failed).
async fn relaunch(
    job: &ElasticJob,
    ctx: &Context,
    rt: &mut JobRuntime,
    root: Option<&Pod>,
    pods: &Api<Pod>,
    jobs: &Api<ElasticJob>,
    old: &ElasticJobStatus,
) -> Result<Option<Action>> {
    if job.spec.restart_policy() != JobRestartPolicy::OnFailure {
        return Ok(None);
    }
    let limit = job.spec.backoff_limit();
    if old.restarts >= limit {
        return Ok(None);
    }
    let attempt = old.restarts + 1;
    let why = root.map_or_else(|| "node 0 failed".to_owned(), root_failure);
    delete_job_pods(job, pods).await?;
    tracing::warn!(job = %job.name_any(), attempt, limit, %why, "relaunching the job");
    ctx.publish(
        job,
        EventType::Warning,
        "Relaunch",
        "Relaunch",
        format!(
            "{why}; relaunch {attempt} of {limit}: every pod is deleted and the job starts again"
        ),
    )
    .await;
    let secret = rt.secret.take();
    *rt = JobRuntime::new(job, ctx.now());
    rt.secret = secret;
    rt.fresh_start = true;
    let mut status = fresh_status(
        job,
        ctx,
        old,
        Phase::Pending,
        "Relaunching",
        format!("{why}; relaunch {attempt} of {limit}"),
    );
    status.restarts = attempt;
    patch_status(jobs, job, &status).await?;
    Ok(Some(Action::requeue(Duration::from_secs(5))))
}

/// How node 0's pod failed, from its node container's termination state.
fn root_failure(pod: &Pod) -> String {
    let terminated = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|all| {
            all.iter()
                .find(|c| {
                    c.name != "coordinator"
                        && c.state
                            .as_ref()
                            .and_then(|s| s.terminated.as_ref())
                            .is_some_and(|t| t.exit_code != 0)
                })
                .or_else(|| {
                    all.iter().find(|c| {
                        c.state
                            .as_ref()
                            .and_then(|s| s.terminated.as_ref())
                            .is_some_and(|t| t.exit_code != 0)
                    })
                })
        })
        .and_then(|c| {
            let t = c.state.as_ref()?.terminated.as_ref()?;
            Some(format!(
                "container {} exited with code {}",
                c.name, t.exit_code
            ))
        });
    match terminated {
        Some(how) => format!("node 0 failed ({how})"),
        None => "node 0 failed".to_owned(),
    }
}

/// The `Failed` condition of a job that ended in failure.
fn failed_condition(
    job: &ElasticJob,
    old: &ElasticJobStatus,
    root: Option<&Pod>,
    now: Timestamp,
) -> Condition {
    let why = root.map_or_else(|| "node 0 failed".to_owned(), root_failure);
    let (reason, message) = match job.spec.restart_policy() {
        JobRestartPolicy::OnFailure => (
            "BackoffLimitExceeded",
            format!(
                "{why}; {} relaunch(es) used of backoffLimit {}",
                old.restarts,
                job.spec.backoff_limit()
            ),
        ),
        JobRestartPolicy::Never => ("NodeZeroFailed", format!("{why}; restartPolicy is Never")),
    };
    condition(job, &old.conditions, "Failed", true, reason, message, now)
}

/// Turns what the job and the cluster show into policy events, each once.
async fn observe(job: &ElasticJob, ctx: &Context, rt: &mut JobRuntime, pods: &PodView) {
    let now_ts = ctx.now();
    let now = rt.vt(now_ts);
    let Some(status) = rt.view.clone() else {
        return;
    };

    let desired = u32::try_from(job.spec.replicas).unwrap_or(1);
    if desired != rt.desired {
        rt.desired = desired;
        rt.policy
            .observe(now, Event::DesiredReplicas { replicas: desired });
    }

    let known = rt.member_pods();
    for member in &status.members {
        if !known.contains(&member.host) && !rt.gone.contains(&member.host) {
            let capacity = match pods.by_name.get(&member.host) {
                Some(pod) if objects::is_on_demand(pod) => Capacity::OnDemand,
                _ => Capacity::Spot,
            };
            rt.policy.observe(
                now,
                Event::MemberJoined {
                    member: MemberId(member.host.clone()),
                    capacity,
                    root: member.node == 0,
                },
            );
        }
    }
    for pod in &known {
        if !status.members.iter().any(|m| &m.host == pod) && rt.gone.insert(pod.clone()) {
            rt.policy.observe(
                now,
                Event::MemberGone {
                    member: MemberId(pod.clone()),
                },
            );
        }
    }
    for pending in &status.pending {
        rt.policy.observe(
            now,
            Event::NewcomerReady {
                newcomer: MemberId(pending.host.clone()),
            },
        );
    }

    let members = rt.member_pods();
    let tracked = |pod: &str| {
        members.contains(pod)
            || rt.newcomers.contains_key(pod)
            || status.pending.iter().any(|p| p.host == pod)
    };
    let mut notices: Vec<(String, NoticeKind, Option<Duration>)> = Vec::new();
    let mut ended: Vec<String> = Vec::new();
    for (name, pod) in &pods.by_name {
        if !tracked(name) {
            continue;
        }
        match notices::pod_state(pod) {
            PodState::Succeeded | PodState::Failed => {
                ended.push(name.clone());
                continue;
            }
            PodState::Terminating => {
                let deadline = pod.metadata.deletion_timestamp.as_ref().map(|t| rt.vt(t.0));
                notices.push((name.clone(), NoticeKind::PodDeleted, deadline));
            }
            PodState::Pending | PodState::Running => {}
        }
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if let Some(node) = node.and_then(|n| ctx.nodes.get(&ObjectRef::new(&n))) {
            for kind in notices::node_notices(&node) {
                notices.push((name.clone(), kind, None));
            }
        }
    }
    for name in rt.newcomers.keys() {
        if !pods.by_name.contains_key(name) && !members.contains(name) {
            ended.push(name.clone());
        }
    }
    for name in ended {
        if rt.gone.insert(name.clone()) {
            rt.policy.observe(
                now,
                Event::MemberGone {
                    member: MemberId(name),
                },
            );
        }
    }
    for (pod, kind, deadline) in notices {
        if !rt.noticed.insert((pod.clone(), kind)) {
            continue;
        }
        ctx.metrics.notice(kind.label());
        rt.first_notice.entry(pod.clone()).or_insert(now_ts);
        let member = MemberId(pod.clone());
        let event = if kind.is_interruption() {
            Event::InterruptionNotice { member, deadline }
        } else {
            Event::RebalanceRecommendation { member }
        };
        rt.policy.observe(now, event);
        tracing::info!(job = %job.name_any(), %pod, %kind, "notice");
        ctx.publish(
            job,
            EventType::Warning,
            "Notice",
            "Observe",
            format!("{kind} for pod {pod}"),
        )
        .await;
    }
}

fn report_event(report: &Report) -> (EventType, &'static str, String) {
    match report {
        Report::ProtectedMemberAtRisk { member, root } => (
            EventType::Warning,
            "ProtectedMemberAtRisk",
            format!("{member} ({}) is at risk; it is never removed", if *root { "node 0" } else { "on-demand" }),
        ),
        Report::NoReplacementByDeadline { member } => (
            EventType::Warning,
            "NoReplacementByDeadline",
            format!("{member} has no replacement and shrinking is disabled: it will be lost at its deadline"),
        ),
        Report::BelowMinReplicas { members, min } => (
            EventType::Warning,
            "BelowMinReplicas",
            format!("an interruption takes the job to {members} members, below minReplicas {min}"),
        ),
        Report::MemberLost { member } => (EventType::Warning, "MemberLost", format!("{member} left without a rescale")),
        Report::DesiredClamped { requested, target } => (
            EventType::Normal,
            "DesiredClamped",
            format!("replicas {requested} is outside [minReplicas, maxReplicas]: the job aims at {target}"),
        ),
        Report::RescaleFailed { reason } => (EventType::Warning, "RescaleFailed", reason.clone()),
    }
}

/// Carries out the policy's decisions until it has nothing more to say.
async fn carry_out(
    job: &ElasticJob,
    ctx: &Context,
    rt: &mut JobRuntime,
    view: &mut PodView,
    pods: &Api<Pod>,
    target: &ControlTarget,
) -> Result<()> {
    // A refused rescale is reported in the next round: a few rounds settle
    // every chain.
    for _ in 0..4 {
        let now = rt.vt(ctx.now());
        let decisions = rt.policy.decide(now);
        if decisions.is_empty() {
            break;
        }
        for decision in decisions {
            match decision {
                Decision::LaunchReplacement {
                    for_member,
                    newcomer,
                } => {
                    create_newcomer(job, pods, view, &newcomer.0, Some(&for_member.0)).await?;
                    rt.newcomers
                        .insert(newcomer.0.clone(), Some(for_member.0.clone()));
                    ctx.publish(
                        job,
                        EventType::Normal,
                        "LaunchReplacement",
                        "Launch",
                        format!("newcomer {newcomer} launched to replace {for_member}"),
                    )
                    .await;
                }
                Decision::LaunchNewcomers { newcomers } => {
                    for newcomer in &newcomers {
                        create_newcomer(job, pods, view, &newcomer.0, None).await?;
                        rt.newcomers.insert(newcomer.0.clone(), None);
                    }
                    let names: Vec<&str> = newcomers.iter().map(|n| n.0.as_str()).collect();
                    ctx.publish(
                        job,
                        EventType::Normal,
                        "LaunchNewcomers",
                        "Launch",
                        format!("newcomers {} launched", names.join(", ")),
                    )
                    .await;
                }
                Decision::Rescale {
                    remove,
                    admit,
                    reason,
                } => {
                    let reason_text = reason.to_string();
                    ctx.metrics.rescale_requested(&reason_text);
                    let names: Vec<&str> = remove.iter().map(|m| m.0.as_str()).collect();
                    ctx.publish(
                        job,
                        EventType::Normal,
                        "RescaleRequested",
                        "Rescale",
                        format!(
                            "{reason_text}: remove [{}], admit {admit}",
                            names.join(", ")
                        ),
                    )
                    .await;
                    let removed: Vec<String> = remove.iter().map(|m| m.0.clone()).collect();
                    if let Err(problem) = start_rescale(job, ctx, rt, target, remove, admit, reason)
                    {
                        rescale_outcome(job, ctx, rt, reason, &removed, Err(problem)).await;
                    }
                }
                Decision::CancelNewcomers { newcomers, reason } => {
                    for newcomer in &newcomers {
                        delete_pod(pods, &newcomer.0).await?;
                        view.deleted.insert(newcomer.0.clone());
                    }
                    let names: Vec<&str> = newcomers.iter().map(|n| n.0.as_str()).collect();
                    tracing::info!(job = %job.name_any(), ?names, %reason, "newcomers cancelled");
                    ctx.publish(
                        job,
                        EventType::Normal,
                        "CancelNewcomers",
                        "Delete",
                        format!("newcomers {} deleted: {reason}", names.join(", ")),
                    )
                    .await;
                }
                Decision::DeleteVacated { member } => {
                    delete_pod(pods, &member.0).await?;
                    view.deleted.insert(member.0.clone());
                    ctx.publish(
                        job,
                        EventType::Normal,
                        "DeleteVacated",
                        "Delete",
                        format!("pod {member} left the job and was deleted"),
                    )
                    .await;
                }
                Decision::Report(report) => {
                    let (type_, reason, note) = report_event(&report);
                    ctx.publish(job, type_, reason, "Report", note).await;
                }
            }
        }
    }
    Ok(())
}

/// Deletes a pod; one already gone is fine.
async fn delete_pod(pods: &Api<Pod>, name: &str) -> Result<()> {
    match pods.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn create_newcomer(
    job: &ElasticJob,
    pods: &Api<Pod>,
    view: &mut PodView,
    name: &str,
    replaces: Option<&str>,
) -> Result<()> {
    match pods
        .create(
            &PostParams::default(),
            &objects::newcomer_pod(job, name, replaces),
        )
        .await
    {
        Ok(pod) => {
            view.by_name.insert(name.to_owned(), pod);
        }
        // Created by a reconcile whose answer was lost: it is the same pod.
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    tracing::info!(job = %job.name_any(), newcomer = name, ?replaces, "newcomer pod created");
    Ok(())
}

fn record(
    reason: &str,
    report: Option<&RescaleReport>,
    removed: &[String],
    added: Vec<String>,
) -> RescaleRecord {
    RescaleRecord {
        reason: reason.to_owned(),
        removed: removed.to_vec(),
        added,
        stage_timings: report
            .map(|r| {
                // GPU work inside the stages, marked apart: `gpu_staging`, `gpu_context`.
                r.stages
                    .iter()
                    .map(|s| (s.stage.clone(), s.ms.round() as i64))
                    .chain(
                        r.gpu
                            .iter()
                            .map(|g| (format!("gpu_{}", g.stage), g.ms.round() as i64)),
                    )
                    .collect()
            })
            .unwrap_or_default(),
        duration_ms: report.map(|r| r.total_ms.round() as i64),
        epoch: report.map(|r| r.epoch as i64),
    }
}

/// Starts one rescale: the policy's member names become node ids of the
/// current view, and PE 0 is asked in a background task, which triggers a
/// reconcile of the job when the answer is in ([`finish_rescale`] takes it).
fn start_rescale(
    job: &ElasticJob,
    ctx: &Context,
    rt: &mut JobRuntime,
    target: &ControlTarget,
    remove: Vec<MemberId>,
    admit: u32,
    reason: crate::policy::RescaleReason,
) -> Result<(), String> {
    let members = rt
        .view
        .as_ref()
        .map(|v| v.members.clone())
        .unwrap_or_default();
    let ids = remove
        .iter()
        .map(|m| {
            members
                .iter()
                .find(|v| v.host == m.0)
                .map(|v| v.node)
                .ok_or_else(|| format!("pod {m} is not a member of the job's view"))
        })
        .collect::<std::result::Result<Vec<u32>, String>>()?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let endpoint = ctx.control.clone();
    let t = target.clone();
    let timeout = ctx.rescale_timeout;
    let request = RescaleRequest { remove: ids, admit };
    let requeue = ctx.requeue.clone();
    let job_ref = ObjectRef::from_obj(job);
    tokio::spawn(async move {
        let answer =
            tokio::task::spawn_blocking(move || endpoint.rescale(&t, request, timeout)).await;
        let result = match answer {
            Ok(result) => result.map_err(|e: ControlError| e.to_string()),
            Err(join) => Err(format!("control endpoint task: {join}")),
        };
        // The result first, then the wake-up: the reconcile it starts finds it.
        let _ = tx.send(result);
        requeue.send(job_ref);
    });
    rt.rescale = Some(RescaleInFlight {
        reason,
        removed: remove.into_iter().map(|m| m.0).collect(),
        result: rx,
    });
    Ok(())
}

/// Takes the answer of the rescale in flight, if it came: the outcome goes
/// to the policy, the metrics, an Event and `lastRescale`.
async fn finish_rescale(job: &ElasticJob, ctx: &Context, rt: &mut JobRuntime) {
    let Some(flight) = rt.rescale.as_mut() else {
        return;
    };
    let outcome = match flight.result.try_recv() {
        Ok(outcome) => outcome,
        Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return,
        Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
            Err("the rescale task ended without an answer".to_owned())
        }
    };
    let flight = rt.rescale.take().expect("checked above");
    rescale_outcome(job, ctx, rt, flight.reason, &flight.removed, outcome).await;
}

/// What a rescale's outcome changes.
async fn rescale_outcome(
    job: &ElasticJob,
    ctx: &Context,
    rt: &mut JobRuntime,
    reason: crate::policy::RescaleReason,
    removed: &[String],
    outcome: std::result::Result<(RescaleReport, JobStatus), String>,
) {
    let reason_text = reason.to_string();
    let now_ts = ctx.now();
    let now = rt.vt(now_ts);
    match outcome {
        Ok((report, after)) => {
            let added: Vec<String> = report
                .admitted
                .iter()
                .filter_map(|id| {
                    after
                        .members
                        .iter()
                        .find(|m| m.node == *id)
                        .map(|m| m.host.clone())
                })
                .collect();
            rt.policy.observe(
                now,
                Event::RescaleCommitted {
                    epoch: report.epoch,
                    admitted: added.iter().map(|a| MemberId(a.clone())).collect(),
                },
            );
            // The removed nodes left the view: the coordinator told them to exit.
            for pod in removed {
                if rt.gone.insert(pod.clone()) {
                    rt.policy.observe(
                        now,
                        Event::MemberGone {
                            member: MemberId(pod.clone()),
                        },
                    );
                }
                if let Some(first) = rt.first_notice.remove(pod) {
                    let waited =
                        Duration::try_from(now_ts.duration_since(first)).unwrap_or_default();
                    ctx.metrics.notice_to_commit(waited.as_secs_f64());
                }
            }
            ctx.metrics.rescale_committed(&reason_text);
            ctx.publish(
                job,
                EventType::Normal,
                "RescaleCommitted",
                "Rescale",
                format!(
                    "{reason_text}: epoch {} -> {}, removed [{}], admitted [{}], {:.1} ms (mechanism {:.1} ms)",
                    report.epoch_before,
                    report.epoch,
                    removed.join(", "),
                    added.join(", "),
                    report.total_ms,
                    report.mechanism_ms
                ),
            )
            .await;
            tracing::info!(job = %job.name_any(), epoch = report.epoch, ?removed, ?added, "rescale committed");
            rt.last_rescale = Some(record(&reason_text, Some(&report), removed, added));
            rt.view = Some(after);
        }
        Err(problem) => {
            tracing::warn!(job = %job.name_any(), %problem, "rescale failed");
            rt.policy.observe(
                now,
                Event::RescaleFailed {
                    reason: problem.clone(),
                },
            );
            ctx.metrics.rescale_failed(&reason_text);
            rt.last_rescale = Some(record(
                &format!("{reason_text} (failed: {problem})"),
                None,
                removed,
                Vec::new(),
            ));
        }
    }
}

fn build_status(
    job: &ElasticJob,
    ctx: &Context,
    rt: &JobRuntime,
    pods: &PodView,
    phase: Phase,
    old: &ElasticJobStatus,
) -> ElasticJobStatus {
    let now = ctx.now();
    let members: Vec<MemberStatus> = rt
        .view
        .iter()
        .flat_map(|v| v.members.iter())
        .map(|m| MemberStatus {
            pod: m.host.clone(),
            node: pods
                .by_name
                .get(&m.host)
                .and_then(|p| p.spec.as_ref()?.node_name.clone()),
            node_id: i32::try_from(m.node).unwrap_or(i32::MAX),
            pes: i32::try_from(m.pes).unwrap_or(i32::MAX),
        })
        .collect();
    let (ready, reason, message) = match phase {
        Phase::Running => (true, "Running", String::new()),
        Phase::Rescaling => (true, "Rescaling", String::new()),
        Phase::Launching => (
            false,
            "Launching",
            rt.control_error
                .clone()
                .map_or_else(String::new, |e| format!("control endpoint: {e}")),
        ),
        other => (
            false,
            if other == Phase::Succeeded {
                "Succeeded"
            } else {
                "Failed"
            },
            String::new(),
        ),
    };
    let mut conditions = vec![condition(
        job,
        &old.conditions,
        "SpecValid",
        true,
        "Valid",
        String::new(),
        now,
    )];
    conditions.push(condition(
        job,
        &old.conditions,
        "Ready",
        ready,
        reason,
        message,
        now,
    ));
    if phase == Phase::Running {
        if let Some(error) = &rt.control_error {
            conditions.push(condition(
                job,
                &old.conditions,
                "ControlReachable",
                false,
                "Unreachable",
                error.clone(),
                now,
            ));
        }
    }
    ElasticJobStatus {
        phase: Some(phase),
        observed_generation: job.metadata.generation,
        epoch: rt.view.as_ref().map(|v| v.epoch as i64).or(old.epoch),
        replicas: i32::try_from(pods.alive()).unwrap_or(i32::MAX),
        ready_replicas: i32::try_from(members.len()).unwrap_or(i32::MAX),
        pending_newcomers: rt
            .view
            .as_ref()
            .map_or(0, |v| i32::try_from(v.pending.len()).unwrap_or(i32::MAX)),
        restarts: old.restarts,
        at_risk: rt.policy.at_risk().into_iter().map(|m| m.0).collect(),
        members,
        last_rescale: rt.last_rescale.clone().or_else(|| old.last_rescale.clone()),
        conditions,
        selector: Some(objects::selector(job)),
    }
}

/// When to look again: the policy's next wake-up, or soon while the job
/// launches or newcomers register (only the control endpoint shows that).
fn requeue_after(ctx: &Context, rt: &JobRuntime) -> Duration {
    let now = rt.vt(ctx.now());
    let mut after = Duration::from_secs(60);
    if let Some(wake) = rt.policy.next_wakeup(now) {
        after = after.min(wake.saturating_sub(now).max(Duration::from_secs(1)));
    }
    let waiting_newcomers = rt
        .newcomers
        .keys()
        .any(|n| !rt.gone.contains(n) && !rt.policy.members().any(|m| &m.0 == n));
    if rt.view.is_none() || rt.control_error.is_some() || waiting_newcomers {
        after = after.min(Duration::from_secs(5));
    }
    after
}

/// Requeue after a failed reconcile, with exponential backoff per job
/// (5 s, 10 s, 20 s ... up to 5 minutes; reset by a success).
pub fn error_policy(job: Arc<ElasticJob>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(error.class());
    let mut failures = ctx.failures.lock().unwrap_or_else(|p| p.into_inner());
    let count = failures.entry(key(&job)).or_insert(0);
    let delay = backoff(*count);
    *count = count.saturating_add(1);
    tracing::warn!(job = %job.name_any(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// The wait after `failures` consecutive failed reconciles.
pub fn backoff(failures: u32) -> Duration {
    Duration::from_secs(5u64.saturating_mul(1u64 << failures.min(6)).min(300))
}

/// Runs the controllers until SIGINT/SIGTERM (or until `stop` resolves:
/// leadership lost). `namespaces`: one controller per namespace, sharing
/// one node watch and one [`Context`]; empty: one controller for every
/// namespace.
pub async fn run(
    client: Client,
    namespaces: Vec<String>,
    settings: ObjectSettings,
    metrics: Arc<Metrics>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let nodes_api = Api::<Node>::all(client.clone());
    let (nodes, writer) = reflector::store();
    // The node store the reconciler reads taints from.
    tokio::spawn(
        reflector(
            writer,
            watcher(nodes_api.clone(), watcher::Config::default()),
        )
        .default_backoff()
        .applied_objects()
        .for_each(|_| async {}),
    );
    let mut context = Context::new(client.clone(), settings, nodes);
    context.metrics = metrics;
    let ctx = Arc::new(context);
    let stop = futures::FutureExt::shared(Box::pin(stop));
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.into_iter().map(Some).collect()
    };
    tracing::info!(namespaces = ?scopes, "starting the controllers");
    futures::future::join_all(scopes.into_iter().map(|ns| {
        run_one(
            client.clone(),
            ns,
            nodes_api.clone(),
            ctx.clone(),
            stop.clone(),
        )
    }))
    .await;
}

/// One controller: the ElasticJobs of `namespace` (`None`: all), the pods
/// and Services they own, and the nodes whose taints concern them.
async fn run_one(
    client: Client,
    namespace: Option<String>,
    nodes_api: Api<Node>,
    ctx: Arc<Context>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let ns = namespace.as_deref();
    let jobs: Api<ElasticJob> = api(&client, ns);
    let owned = watcher::Config::default().labels(objects::JOB_LABEL);
    let controller = Controller::new(jobs, watcher::Config::default())
        .owns(api::<Pod>(&client, ns), owned.clone())
        .owns(api::<Service>(&client, ns), owned);
    let store = controller.store();
    let requeue = ctx.requeue.clone();
    // A node with a notice concerns every job with a pod on it; which pods
    // are there is the reconcile's business, so each job looks.
    controller
        .watches(nodes_api, watcher::Config::default(), move |node: Node| {
            if notices::node_has_notice(&node) {
                store
                    .state()
                    .iter()
                    .map(|job| ObjectRef::from_obj(job.as_ref()))
                    .collect()
            } else {
                Vec::new()
            }
        })
        .reconcile_on(requeue.stream(namespace))
        .graceful_shutdown_on(stop)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((job, _)) => tracing::debug!(job = %job.name, "reconciled"),
                Err(error) => tracing::warn!(%error, "reconcile error"),
            }
        })
        .await;
}

#[cfg(test)]
mod tests;
