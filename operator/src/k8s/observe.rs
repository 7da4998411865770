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
    // With fault tolerance, a member (not node 0, whose loss ends the job)
    // that leaves the view without a rescale removing it was lost without
    // notice and recovered from: the runtime committed a view without it.
    // Members of the policy are never being vacated (a committed rescale
    // moved those out), so this tells a recovered loss from a departure.
    let fault_tolerant = job.spec.checkpoint_every().is_some();
    let root_pod = objects::pod_name(job, 0);
    let mut recovered: Vec<String> = Vec::new();
    for pod in &known {
        if !status.members.iter().any(|m| &m.host == pod) && rt.gone.insert(pod.clone()) {
            if fault_tolerant && pod != &root_pod {
                recovered.push(pod.clone());
            }
            rt.policy.observe(
                now,
                Event::MemberGone {
                    member: MemberId(pod.clone()),
                },
            );
        }
    }
    // Pods that ended while the view still listed them, now out of it.
    let out_of_view: Vec<String> = rt
        .awaiting_recovery
        .iter()
        .filter(|pod| !status.members.iter().any(|m| &m.host == *pod))
        .cloned()
        .collect();
    for pod in out_of_view {
        rt.awaiting_recovery.remove(&pod);
        recovered.push(pod);
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
        let listed = status.members.iter().any(|m| m.host == name);
        if fault_tolerant && listed && name != root_pod && members.contains(&name) {
            rt.awaiting_recovery.insert(name.clone());
        }
        if rt.gone.insert(name.clone()) {
            rt.policy.observe(
                now,
                Event::MemberGone {
                    member: MemberId(name),
                },
            );
        }
    }
    for pod in recovered {
        let base = job.status.as_ref().map_or(0, |s| s.recoveries);
        let count = rt.recoveries.get_or_insert(base);
        *count += 1;
        tracing::info!(job = %job.name_any(), %pod, epoch = status.epoch, "recovered from a member lost without notice");
        ctx.publish(
            job,
            EventType::Normal,
            "Recovered",
            "Observe",
            format!(
                "pod {pod} was lost without notice; the job recovered without it from its last in-memory checkpoint (epoch {})",
                status.epoch
            ),
        )
        .await;
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
