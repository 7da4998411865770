//! A run's beginning and end: suspend, whole-job relaunch, and how node
//! 0's pod ended.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};

use super::context::*;
use super::error::*;
use super::pods::*;
use super::status::*;
use crate::crd::{ElasticJob, ElasticJobStatus, JobRestartPolicy, Phase};

/// `spec.suspend`: the job's pods are deleted (the run is abandoned, a
/// rescale in flight with it) and the phase is Suspended; turning it off
/// launches the job afresh.
pub(super) async fn suspend(
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
pub(super) async fn relaunch(
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
pub(super) fn root_failure(pod: &Pod) -> String {
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
