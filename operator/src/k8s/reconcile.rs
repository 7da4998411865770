//! One reconcile of one ElasticJob: validation, the finalizer, the owned
//! objects, then the steps of the other modules in order; and the requeue
//! and error backoff.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ductile_coordinator::Secret;
use k8s_openapi::api::core::v1::{Pod, Secret as K8sSecret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::{Api, ResourceExt};

use super::context::*;
use super::control::ControlTarget;
use super::decide::*;
use super::error::*;
use super::lifecycle::*;
use super::notices::{self, PodState};
use super::objects;
use super::observe::*;
use super::pods::*;
use super::rescale::*;
use super::status::*;
use super::MANAGER;
use crate::crd::{ElasticJob, ElasticJobStatus, JobPhase};

/// One reconcile of one ElasticJob (see the module docs for what it does).
pub async fn reconcile(job: Arc<ElasticJob>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconcile();
    let name = job.name_any();
    let ns = job
        .namespace()
        .ok_or_else(|| Error::NoNamespace(name.clone()))?;
    let jobs: Api<ElasticJob> = Api::namespaced(ctx.client.clone(), &ns);

    if !objects::is_deleting(&job) {
        // The CRD's CEL rule refuses such names; an API server without it
        // (an older CRD) reaches here.
        let invalid = match crate::crd::name_problem(&name) {
            Some(problem) => Err(problem),
            None => job.spec.validate().map_err(|e| e.to_string()),
        };
        if let Err(invalid) = invalid {
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
                    invalid.clone(),
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

pub(super) async fn ensure_secret(
    job: &ElasticJob,
    ctx: &Context,
    rt: &mut JobRuntime,
) -> Result<()> {
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

pub(super) async fn apply(job: &ElasticJob, ctx: &Context, rt: &mut JobRuntime) -> Result<Action> {
    let name = job.name_any();
    let ns = job
        .namespace()
        .ok_or_else(|| Error::NoNamespace(name.clone()))?;
    let client = ctx.client.clone();
    let jobs: Api<ElasticJob> = Api::namespaced(client.clone(), &ns);
    let mut old = job.status.clone().unwrap_or_default();

    // A job failed by its deadline stays so (its pods are gone: node 0's
    // absence is no new failure to relaunch for); only its TTL runs.
    if old.phase == Some(JobPhase::Failed)
        && old
            .conditions
            .iter()
            .any(|c| c.type_ == "Failed" && c.reason == DEADLINE_EXCEEDED)
    {
        return after_finished(job, ctx, &jobs, &old).await;
    }

    ensure_secret(job, ctx, rt).await?;

    // Applied without force: an object of the same name that another
    // manager owns is reported, never taken over.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    apply_owned(&services, &name, &objects::headless_service(job), "Service").await?;
    // Node 0 (and every on-demand member) is protected from voluntary
    // eviction: the job has no other root.
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    apply_owned(
        &budgets,
        &objects::pdb_name(job),
        &objects::on_demand_pdb(job),
        "PodDisruptionBudget",
    )
    .await?;
    if let Some(operator_namespace) = &ctx.settings.network_policy {
        let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
        apply_owned(
            &policies,
            &objects::network_policy_name(job),
            &objects::job_network_policy(job, operator_namespace),
            "NetworkPolicy",
        )
        .await?;
    }

    // The job's pods from the controllers' cache: no LIST per reconcile.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut view = PodView {
        by_name: ctx
            .pods
            .pods_of(job)
            .await?
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
        if old.phase == Some(JobPhase::Suspended) {
            ctx.publish(
                job,
                EventType::Normal,
                "Resumed",
                "Launch",
                "spec.suspend is off: the job is launched again".to_owned(),
            )
            .await;
        }
        if rt.fresh_start || matches!(old.phase, Some(JobPhase::Pending | JobPhase::Suspended)) {
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
                    JobPhase::Pending,
                    "WaitingForPods",
                    format!("{waiting} pod(s) of the last run are still terminating"),
                );
                status.replicas = i32::try_from(waiting).unwrap_or(i32::MAX);
                patch_status(&jobs, job, &status).await?;
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
        }
        // Launch members only: with `launchPolicy: MinReplicas` the rest of
        // `replicas` are newcomers the policy launches once epoch 1 exists.
        // activeDeadlineSeconds counts from the first launch.
        if old.start_time.is_none() {
            old.start_time = Some(Time(ctx.now()));
        }
        let replicas = u32::try_from(job.spec.launch_replicas()).unwrap_or(0);
        for index in 0..replicas {
            if let std::collections::btree_map::Entry::Vacant(slot) =
                view.by_name.entry(objects::pod_name(job, index))
            {
                let pod =
                    apply_pod(&pods, &objects::launch_pod(job, index, &ctx.settings)).await?;
                slot.insert(pod);
            }
        }
        rt.fresh_start = false;
    }

    // Node 0 ends the job: its node container's exit is the job's. A pod
    // already being deleted (a relaunch's) ended nothing new.
    let root = view.by_name.get(&objects::pod_name(job, 0)).cloned();
    let root_state = root.as_ref().map(notices::pod_state);
    let root_deleting = root
        .as_ref()
        .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
    let node_container = job
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map_or("", |c| c.name.as_str());
    let judged = launched && old.phase != Some(JobPhase::Succeeded);
    if let Some(end) = root_end(root.as_ref(), judged, node_container) {
        if let RootEnd::Failed(why) = &end {
            if !root_deleting {
                if let Some(action) = relaunch(job, ctx, rt, why, &pods, &jobs, &old).await? {
                    return Ok(action);
                }
            }
        }
        let phase = match end {
            RootEnd::Succeeded => JobPhase::Succeeded,
            RootEnd::Failed(_) => JobPhase::Failed,
        };
        if old.phase != Some(phase) {
            let note = match &end {
                RootEnd::Failed(why) => format!("{why}: the job Failed"),
                RootEnd::Succeeded => format!("node 0 ended: the job {phase}"),
            };
            let type_ = if phase == JobPhase::Failed {
                EventType::Warning
            } else {
                EventType::Normal
            };
            ctx.publish(job, type_, &phase.to_string(), "JobEnded", note)
                .await;
            ctx.metrics.job_ended(&phase.to_string());
        }
        let mut status = build_status(job, ctx, rt, &view, phase, &old);
        if let RootEnd::Failed(why) = &end {
            status
                .conditions
                .push(failed_condition(job, &old, why, ctx.now()));
        }
        patch_status(&jobs, job, &status).await?;
        return after_finished(job, ctx, &jobs, &status).await;
    }

    // Past activeDeadlineSeconds: the job's pods go and it is Failed.
    let ran = old
        .start_time
        .as_ref()
        .and_then(|t| Duration::try_from(ctx.now().duration_since(t.0)).ok());
    if let (Some(limit), Some(ran)) = (job.spec.active_deadline_seconds, ran) {
        if ran.as_secs() >= u64::try_from(limit).unwrap_or(u64::MAX) {
            delete_job_pods(job, &pods).await?;
            let why = format!(
                "the job ran {} s, past activeDeadlineSeconds {limit}: its pods were deleted",
                ran.as_secs()
            );
            tracing::warn!(job = %name, %why, "deadline exceeded");
            ctx.publish(job, EventType::Warning, DEADLINE_EXCEEDED, "JobEnded", why.clone())
                .await;
            ctx.metrics.job_ended(&JobPhase::Failed.to_string());
            rt.rescale = None;
            let mut status = build_status(job, ctx, rt, &view, JobPhase::Failed, &old);
            status
                .conditions
                .push(condition(job, &old.conditions, "Failed", true, DEADLINE_EXCEEDED, why, ctx.now()));
            patch_status(&jobs, job, &status).await?;
            return after_finished(job, ctx, &jobs, &status).await;
        }
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
        JobPhase::Rescaling
    } else if rt.view.is_some() {
        JobPhase::Running
    } else {
        JobPhase::Launching
    };
    let status = build_status(job, ctx, rt, &view, phase, &old);
    patch_status(&jobs, job, &status).await?;
    Ok(Action::requeue(requeue_after(ctx, rt)))
}

/// Reason of the `Failed` condition of a job past its `activeDeadlineSeconds`.
const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

/// What follows the end of a job: with `ttlSecondsAfterFinished`, the
/// ElasticJob is deleted that long after `status.completionTime` (its
/// finalizer then tears down what is left); before, a requeue for then.
async fn after_finished(
    job: &ElasticJob,
    ctx: &Context,
    jobs: &Api<ElasticJob>,
    status: &ElasticJobStatus,
) -> Result<Action> {
    let (Some(ttl), Some(done)) = (job.spec.ttl_seconds_after_finished, &status.completion_time)
    else {
        return Ok(Action::await_change());
    };
    let age = Duration::try_from(ctx.now().duration_since(done.0)).unwrap_or(Duration::ZERO);
    let ttl = Duration::from_secs(u64::try_from(ttl).unwrap_or(0));
    if age < ttl {
        return Ok(Action::requeue(ttl - age));
    }
    tracing::info!(job = %job.name_any(), "ttlSecondsAfterFinished passed: deleting the ElasticJob");
    match jobs.delete(&job.name_any(), &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

/// Server-side apply of an object the job owns, without force: a conflict
/// (another manager owns the fields) is [`Error::NotOwned`].
async fn apply_owned<K>(api: &Api<K>, name: &str, object: &K, kind: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api
        .patch(name, &PatchParams::apply(MANAGER), &Patch::Apply(object))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Err(Error::NotOwned {
            object: format!("{kind}/{name}"),
            message: e.message,
        }),
        Err(e) => Err(e.into()),
    }
}

/// When to look again: the policy's next wake-up, or soon while the job
/// launches or newcomers register (only the control endpoint shows that).
pub(super) fn requeue_after(ctx: &Context, rt: &JobRuntime) -> Duration {
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
