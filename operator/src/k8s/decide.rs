//! The policy's decisions carried out: pods created and deleted, rescales
//! started, Events recorded.

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};

use super::context::*;
use super::control::ControlTarget;
use super::error::*;
use super::pods::*;
use super::rescale::*;
use crate::crd::ElasticJob;
use crate::policy::{Decision, Report};

pub(super) fn report_event(report: &Report) -> (EventType, &'static str, String) {
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
pub(super) async fn carry_out(
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
