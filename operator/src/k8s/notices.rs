//! Reading capacity notices from what Kubernetes shows: node taints put by
//! the AWS Node Termination Handler (queue or IMDS mode) and by Karpenter,
//! and pods being deleted or evicted. Pure functions over API objects.

use std::fmt;

use k8s_openapi::api::core::v1::{Node, Pod};

/// NTH: the instance got a spot interruption notice (two minutes).
pub const TAINT_SPOT_ITN: &str = "aws-node-termination-handler/spot-itn";
/// NTH: EC2 recommends rebalancing away from the instance (elevated risk).
pub const TAINT_REBALANCE: &str = "aws-node-termination-handler/rebalance-recommendation";
/// NTH: the instance has a scheduled maintenance event.
pub const TAINT_SCHEDULED_MAINTENANCE: &str = "aws-node-termination-handler/scheduled-maintenance";
/// Karpenter: the node is being disrupted (drained, then terminated).
pub const TAINT_KARPENTER_DISRUPTED: &str = "karpenter.sh/disrupted";
/// NTH (queue mode): the Auto Scaling group is terminating the instance
/// (scale-in, instance refresh, AZ rebalancing) and holds it in a
/// lifecycle hook meanwhile.
pub const TAINT_ASG_LIFECYCLE: &str = "aws-node-termination-handler/asg-lifecycle-termination";

/// One kind of notice about a member's capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NoticeKind {
    /// NTH `spot-itn`: the instance goes away within two minutes.
    SpotInterruption,
    /// NTH `rebalance-recommendation`.
    RebalanceRecommendation,
    /// NTH `scheduled-maintenance`: treated as elevated risk (replace, then move).
    ScheduledMaintenance,
    /// Karpenter `disrupted`: the node is drained and terminated soon.
    KarpenterDisrupted,
    /// NTH `asg-lifecycle-termination`: the ASG terminates the instance
    /// once its lifecycle hook ends.
    AsgLifecycleTermination,
    /// The pod itself is being deleted or evicted (its deletion timestamp is set).
    PodDeleted,
}

impl NoticeKind {
    /// Whether the member must go by a deadline (an interruption), rather
    /// than merely being at risk (a recommendation).
    pub fn is_interruption(self) -> bool {
        matches!(
            self,
            NoticeKind::SpotInterruption
                | NoticeKind::KarpenterDisrupted
                | NoticeKind::AsgLifecycleTermination
                | NoticeKind::PodDeleted
        )
    }

    /// The metric label of this kind.
    pub fn label(self) -> &'static str {
        match self {
            NoticeKind::SpotInterruption => "spot-itn",
            NoticeKind::RebalanceRecommendation => "rebalance-recommendation",
            NoticeKind::ScheduledMaintenance => "scheduled-maintenance",
            NoticeKind::KarpenterDisrupted => "karpenter-disrupted",
            NoticeKind::AsgLifecycleTermination => "asg-lifecycle-termination",
            NoticeKind::PodDeleted => "pod-deleted",
        }
    }
}

impl fmt::Display for NoticeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The notices a node's taints carry, in a stable order.
pub fn node_notices(node: &Node) -> Vec<NoticeKind> {
    let mut out: Vec<NoticeKind> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|taint| match taint.key.as_str() {
            TAINT_SPOT_ITN => Some(NoticeKind::SpotInterruption),
            TAINT_REBALANCE => Some(NoticeKind::RebalanceRecommendation),
            TAINT_SCHEDULED_MAINTENANCE => Some(NoticeKind::ScheduledMaintenance),
            TAINT_KARPENTER_DISRUPTED => Some(NoticeKind::KarpenterDisrupted),
            TAINT_ASG_LIFECYCLE => Some(NoticeKind::AsgLifecycleTermination),
            _ => None,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Whether a node carries any notice (the node watch triggers reconciles only then).
pub fn node_has_notice(node: &Node) -> bool {
    !node_notices(node).is_empty()
}

/// Where a pod stands, as far as the job is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    /// Not scheduled or not started yet.
    Pending,
    /// Its node process runs.
    Running,
    /// It is being deleted or evicted, its process still runs.
    Terminating,
    /// Its process ended with exit code 0 (a removed node leaves that way).
    Succeeded,
    /// Its process ended otherwise.
    Failed,
}

/// The state of a pod from its phase and deletion timestamp.
pub fn pod_state(pod: &Pod) -> PodState {
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    match phase {
        "Succeeded" => PodState::Succeeded,
        "Failed" => PodState::Failed,
        _ if pod.metadata.deletion_timestamp.is_some() => PodState::Terminating,
        "Running" => PodState::Running,
        _ => PodState::Pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(taints: serde_json::Value) -> Node {
        serde_json::from_value(
            json!({"metadata": {"name": "ip-10-0-0-1"}, "spec": {"taints": taints}}),
        )
        .unwrap()
    }

    #[test]
    fn every_documented_taint_is_a_notice_and_others_are_not() {
        let n = node(json!([
            {"key": "aws-node-termination-handler/spot-itn", "value": "itn-1", "effect": "NoSchedule"},
            {"key": "aws-node-termination-handler/rebalance-recommendation", "effect": "NoSchedule"},
            {"key": "aws-node-termination-handler/scheduled-maintenance", "effect": "NoSchedule"},
            {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"},
            {"key": "aws-node-termination-handler/asg-lifecycle-termination", "value": "asg-lifecycle-term-1", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
            {"key": "aws-node-termination-handler/spot-itn", "value": "itn-2", "effect": "NoExecute"},
        ]));
        assert_eq!(
            node_notices(&n),
            [
                NoticeKind::SpotInterruption,
                NoticeKind::RebalanceRecommendation,
                NoticeKind::ScheduledMaintenance,
                NoticeKind::KarpenterDisrupted,
                NoticeKind::AsgLifecycleTermination
            ]
        );
        assert!(node_has_notice(&n));
        assert!(!node_has_notice(&node(
            json!([{"key": "dedicated", "effect": "NoSchedule"}])
        )));
        assert!(!node_has_notice(
            &serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap()
        ));
    }

    #[test]
    fn interruptions_are_the_notices_with_a_deadline() {
        assert!(NoticeKind::SpotInterruption.is_interruption());
        assert!(NoticeKind::KarpenterDisrupted.is_interruption());
        assert!(NoticeKind::AsgLifecycleTermination.is_interruption());
        assert!(NoticeKind::PodDeleted.is_interruption());
        assert!(!NoticeKind::RebalanceRecommendation.is_interruption());
        assert!(!NoticeKind::ScheduledMaintenance.is_interruption());
    }

    #[test]
    fn pod_states() {
        let pod = |v: serde_json::Value| -> Pod { serde_json::from_value(v).unwrap() };
        assert_eq!(pod_state(&pod(json!({"metadata": {}}))), PodState::Pending);
        assert_eq!(
            pod_state(&pod(
                json!({"metadata": {}, "status": {"phase": "Running"}})
            )),
            PodState::Running
        );
        assert_eq!(
            pod_state(&pod(
                json!({"metadata": {"deletionTimestamp": "2025-01-01T00:00:00Z"}, "status": {"phase": "Running"}})
            )),
            PodState::Terminating
        );
        assert_eq!(
            pod_state(&pod(
                json!({"metadata": {}, "status": {"phase": "Succeeded"}})
            )),
            PodState::Succeeded
        );
        assert_eq!(
            pod_state(&pod(json!({"metadata": {}, "status": {"phase": "Failed"}}))),
            PodState::Failed
        );
    }
}
