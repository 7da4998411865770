//! What the job and the cluster show, turned into policy events.

use std::time::Duration;

use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::context::*;
use super::notices::{self, NoticeKind, PodState};
use super::objects;
use super::pods::*;
use crate::crd::ElasticJob;
use crate::policy::{Capacity, Event, MemberId, PolicyConfig};

/// Turns what the job and the cluster show into policy events, each once.
pub(super) async fn observe(job: &ElasticJob, ctx: &Context, rt: &mut JobRuntime, pods: &PodView) {
    let now_ts = ctx.now();
    let now = rt.vt(now_ts);
    let Some(status) = rt.view.clone() else {
        return;
    };

    let desired = u32::try_from(job.spec.replicas).unwrap_or(1);
    // minReplicas, maxReplicas or rescalePolicy changed: the policy takes
    // the new settings in place (no restart), and the next decision
    // follows them.
    let config = PolicyConfig::from_spec(&job.name_any(), &job.spec);
    if &config != rt.policy.config() {
        let before = rt.policy.config().clone();
        rt.policy.reconfigure(config.clone(), desired);
        rt.desired = desired;
        tracing::info!(job = %job.name_any(), ?before, after = ?config, "rescale policy changed");
        ctx.publish(
            job,
            EventType::Normal,
            "PolicyChanged",
            "Reconfigure",
            format!(
                "minReplicas {}, maxReplicas {}, rebalance {:?} (timeout {} s), emergencyOnInterruption {}, shrinkWhenNoReplacement {}, interruptionDeadlineSeconds {}: in force from now",
                config.min_replicas,
                config.max_replicas.map_or("none".to_owned(), |m| m.to_string()),
                config.mode,
                config.rebalance_timeout.as_secs(),
                config.emergency_on_interruption,
                config.shrink_when_no_replacement,
                config.interruption_deadline.as_secs(),
            ),
        )
        .await;
    }
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
        ctx.metrics.member_notice(&pod, kind.label());
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
