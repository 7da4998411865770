//! Rescales in the background: the request to PE 0 and what its answer changes.

use std::time::Duration;

use ductile_coordinator::control::{ControlError, JobStatus, RescaleReport, RescaleRequest};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::context::*;
use super::control::ControlTarget;
use super::error::*;
use crate::crd::{ElasticJob, RescaleRecord};
use crate::policy::{Event, MemberId};

pub(super) fn record(
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
pub(super) fn start_rescale(
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
    // The ids are those of this view: node 0 refuses the request if the
    // view changed since (ids are renumbered by every commit).
    let epoch = rt.view.as_ref().map_or(0, |v| v.epoch);
    let request = RescaleRequest {
        epoch,
        remove: ids,
        admit,
    };
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
pub(super) async fn finish_rescale(job: &ElasticJob, ctx: &Context, rt: &mut JobRuntime) {
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
pub(super) async fn rescale_outcome(
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
                    ctx.metrics.notice_to_commit_for(pod, waited.as_secs_f64());
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
