//! The ElasticJob's `status`: conditions, the status of a running job and
//! of one with no run in progress, written by server-side apply.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::context::*;
use super::error::*;
use super::objects;
use super::pods::*;
use super::MANAGER;
use crate::crd::{ElasticJob, ElasticJobStatus, JobPhase, JobRestartPolicy, MemberStatus};

pub(super) fn condition(
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

pub(super) async fn patch_status(
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

/// The status of a job with no run in progress (suspended, waiting to be
/// relaunched): no epoch, no members; the restart count and the last
/// rescale are kept.
pub(super) fn fresh_status(
    job: &ElasticJob,
    ctx: &Context,
    old: &ElasticJobStatus,
    phase: JobPhase,
    reason: &str,
    message: String,
) -> ElasticJobStatus {
    let now = ctx.now();
    ElasticJobStatus {
        phase: Some(phase),
        observed_generation: job.metadata.generation,
        restarts: old.restarts,
        recoveries: old.recoveries,
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
        // A relaunch keeps counting the deadline from the first launch; a
        // suspension starts it afresh.
        start_time: (phase != JobPhase::Suspended)
            .then(|| old.start_time.clone())
            .flatten(),
        ..ElasticJobStatus::default()
    }
}

/// The `Failed` condition of a job that ended in failure.
pub(super) fn failed_condition(
    job: &ElasticJob,
    old: &ElasticJobStatus,
    why: &str,
    now: Timestamp,
) -> Condition {
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

pub(super) fn build_status(
    job: &ElasticJob,
    ctx: &Context,
    rt: &JobRuntime,
    pods: &PodView,
    phase: JobPhase,
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
    // Growing towards `replicas` (a partial launch, newcomers on the way).
    let progress = if members.len() < usize::try_from(job.spec.replicas).unwrap_or(0) {
        format!(
            "{} of {} nodes in the job, {} newcomer(s) registered",
            members.len(),
            job.spec.replicas,
            rt.view.as_ref().map_or(0, |v| v.pending.len())
        )
    } else {
        String::new()
    };
    let (ready, reason, message) = match phase {
        JobPhase::Running if !progress.is_empty() => (true, "Growing", progress),
        JobPhase::Running => (true, "Running", String::new()),
        JobPhase::Rescaling => (true, "Rescaling", String::new()),
        JobPhase::Launching => (
            false,
            "Launching",
            rt.control_error
                .clone()
                .map_or_else(String::new, |e| format!("control endpoint: {e}")),
        ),
        other => (
            false,
            if other == JobPhase::Succeeded {
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
    if matches!(phase, JobPhase::Running | JobPhase::Rescaling) {
        // The condition the CRD's documentation promises: a rescale in flight.
        let (rescaling, reason, message) = match &rt.rescale {
            Some(flight) => (
                true,
                flight.reason.to_string(),
                format!("removing {:?}", flight.removed),
            ),
            None => (false, "Idle".to_owned(), String::new()),
        };
        conditions.push(condition(
            job,
            &old.conditions,
            "Rescaling",
            rescaling,
            &reason,
            message,
            now,
        ));
    }
    if phase == JobPhase::Succeeded {
        conditions.push(condition(
            job,
            &old.conditions,
            "Succeeded",
            true,
            "NodeZeroSucceeded",
            "node 0 exited 0".to_owned(),
            now,
        ));
    }
    if matches!(phase, JobPhase::Launching | JobPhase::Running | JobPhase::Rescaling) {
        // Pods the scheduler cannot place (no node with the capacity label,
        // no spot capacity, too few CPUs): say why, in the scheduler's words.
        if let Some(message) = unschedulable(pods) {
            conditions.push(condition(
                job,
                &old.conditions,
                "PodsScheduled",
                false,
                "Unschedulable",
                message,
                now,
            ));
        }
    }
    if phase == JobPhase::Running {
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
        recoveries: rt.recoveries.unwrap_or(0).max(old.recoveries),
        at_risk: rt.policy.at_risk().into_iter().map(|m| m.0).collect(),
        members,
        last_rescale: rt.last_rescale.clone().or_else(|| old.last_rescale.clone()),
        conditions,
        selector: Some(objects::selector(job)),
        start_time: old.start_time.clone(),
        completion_time: matches!(phase, JobPhase::Succeeded | JobPhase::Failed)
            .then(|| old.completion_time.clone().unwrap_or(Time(now))),
    }
}
