//! A run's beginning and end: suspend, whole-job relaunch, and how node
//! 0's pod ended.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};

use super::context::*;
use super::notices::{self, PodState};
use super::objects;
use super::error::*;
use super::pods::*;
use super::status::*;
use crate::crd::{ElasticJob, ElasticJobStatus, JobPhase, JobRestartPolicy};

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
    if old.phase != Some(JobPhase::Suspended) {
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
        JobPhase::Suspended,
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
    why: &str,
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
        JobPhase::Pending,
        "Relaunching",
        format!("{why}; relaunch {attempt} of {limit}"),
    );
    status.restarts = attempt;
    patch_status(jobs, job, &status).await?;
    Ok(Some(Action::requeue(Duration::from_secs(5))))
}

/// How node 0's run ended, judged by its node container (and the
/// coordinator's): a pod's phase alone misses a node container that died
/// while the coordinator container keeps the pod `Running`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum RootEnd {
    /// The node program exited 0: the job is done.
    Succeeded,
    /// Node 0 failed; why, in words (the container, its exit code and reason).
    Failed(String),
}

/// How node 0's pod `root` ended, if it did. `launched`: the job had
/// started, so a missing node-0 pod (deleted, evicted, its node gone) is a
/// failure too. `node_container` is the name of the node's container.
pub(super) fn root_end(root: Option<&Pod>, launched: bool, node_container: &str) -> Option<RootEnd> {
    let Some(pod) = root else {
        return launched.then(|| {
            RootEnd::Failed("node 0's pod is gone (deleted or evicted while the job ran)".to_owned())
        });
    };
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    let terminated = |name: &str| {
        statuses
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.state.as_ref()?.terminated.clone())
    };
    let describe = |name: &str, t: &k8s_openapi::api::core::v1::ContainerStateTerminated| {
        let mut how = format!("container {name} exited with code {}", t.exit_code);
        if let Some(reason) = t.reason.as_deref().filter(|r| !r.is_empty()) {
            how.push_str(&format!(" ({reason})"));
        }
        how
    };
    if let Some(t) = terminated(node_container) {
        return Some(if t.exit_code == 0 {
            RootEnd::Succeeded
        } else {
            RootEnd::Failed(format!("node 0 failed: {}", describe(node_container, &t)))
        });
    }
    // The coordinator ends after the job; one that fails first fails it.
    if let Some(t) = terminated(objects::COORDINATOR_CONTAINER).filter(|t| t.exit_code != 0) {
        return Some(RootEnd::Failed(format!(
            "node 0 failed: {}",
            describe(objects::COORDINATOR_CONTAINER, &t)
        )));
    }
    match notices::pod_state(pod) {
        PodState::Succeeded => Some(RootEnd::Succeeded),
        PodState::Failed => {
            let status = pod.status.as_ref();
            let reason = status.and_then(|s| s.reason.clone()).unwrap_or_default();
            let message = status.and_then(|s| s.message.clone()).unwrap_or_default();
            Some(RootEnd::Failed(
                format!("node 0's pod failed {reason} {message}").trim_end().to_owned(),
            ))
        }
        _ => None,
    }
}
