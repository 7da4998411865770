//! The `ElasticJob` custom resource (`ductile.dev/v1alpha1`, short name `ej`).
//!
//! One ElasticJob is one malleable Ductile job on Kubernetes: a pod template
//! for its nodes, how many nodes it wants (`replicas`, bounded by
//! `minReplicas`/`maxReplicas`, with a scale subresource so `kubectl scale`
//! and an HPA resize the running job in place), where the on-demand part
//! (coordinator + PE 0) and the spot part run, and the rescale policy that
//! decides when at-risk spot nodes are swapped for replacements.
//!
//! The Rust types are the source of truth: the CRD YAML in `crds/` is
//! generated from them by the `crdgen` binary ([`crd_yaml`]), and a test fails
//! when the committed file is stale. Validation lives in two places that say
//! the same thing: the schema (minimums and CEL `x-kubernetes-validations`,
//! enforced by the API server) and [`ElasticJobSpec::validate`] (used by the
//! reconciler to report an invalid spec in a condition, and by tests).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PodTemplateSpec, ResourceRequirements, SecurityContext, Toleration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of the ElasticJob resource.
pub const GROUP: &str = "ductile.dev";
/// API version of the ElasticJob resource.
pub const VERSION: &str = "v1alpha1";

/// Node label of EKS managed node groups that says whether a node is spot or on-demand.
pub const EKS_CAPACITY_TYPE_LABEL: &str = "eks.amazonaws.com/capacityType";
/// [`EKS_CAPACITY_TYPE_LABEL`]'s value on on-demand nodes.
pub const EKS_ON_DEMAND: &str = "ON_DEMAND";
/// [`EKS_CAPACITY_TYPE_LABEL`]'s value on spot nodes.
pub const EKS_SPOT: &str = "SPOT";
/// Node label Karpenter puts on the nodes it provisions.
pub const KARPENTER_CAPACITY_TYPE_LABEL: &str = "karpenter.sh/capacity-type";
/// [`KARPENTER_CAPACITY_TYPE_LABEL`]'s value on on-demand nodes.
pub const KARPENTER_ON_DEMAND: &str = "on-demand";
/// [`KARPENTER_CAPACITY_TYPE_LABEL`]'s value on spot nodes.
pub const KARPENTER_SPOT: &str = "spot";

/// Desired state of an ElasticJob: one malleable Ductile job.
///
/// `replicas` counts every node of the job (one process per pod), the
/// on-demand ones (node 0, which hosts PE 0 next to the coordinator) included.
// Several `printcolumn(type_ = "integer", ...)` look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ductile.dev",
    version = "v1alpha1",
    kind = "ElasticJob",
    plural = "elasticjobs",
    singular = "elasticjob",
    shortname = "ej",
    category = "ductile",
    namespaced,
    status = "ElasticJobStatus",
    derive = "PartialEq",
    doc = "A malleable Ductile job: its nodes grow and shrink while it runs, and at-risk spot nodes are replaced without a restart.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Lifecycle phase"
    ),
    printcolumn(
        name = "Epoch",
        type_ = "integer",
        json_path = ".status.epoch",
        description = "Membership epoch"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Nodes that are members of the current view"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "Desired nodes"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("self.minReplicas <= self.replicas").message("replicas must be >= minReplicas").field_path(".replicas"),
    validation = Rule::new("!has(self.maxReplicas) || self.replicas <= self.maxReplicas").message("replicas must be <= maxReplicas").field_path(".replicas"),
    validation = Rule::new("!has(self.maxReplicas) || self.minReplicas <= self.maxReplicas").message("minReplicas must be <= maxReplicas").field_path(".minReplicas"),
    validation = Rule::new("!has(self.onDemand) || self.onDemand.replicas <= self.minReplicas").message("onDemand.replicas must be <= minReplicas: on-demand nodes are never removed").field_path(".onDemand.replicas")
)]
#[serde(rename_all = "camelCase")]
pub struct ElasticJobSpec {
    /// Pod template of the job's nodes. Its first container runs the node
    /// program (image, command, resources, GPUs included, and env); the
    /// operator adds the Ductile environment contract (coordinator address,
    /// job secret, role, PEs) and the placement of each pod.
    pub template: PodTemplateSpec,

    /// PEs (scheduler threads) each node runs.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1))]
    pub pes_per_pod: i32,

    /// Desired number of nodes, on-demand ones included. The scale
    /// subresource writes it: `kubectl scale ej/NAME --replicas=N`.
    #[schemars(range(min = 1))]
    pub replicas: i32,

    /// Fewest nodes the job may shrink to (also when a spot node is lost with
    /// no replacement).
    #[serde(default = "default_one")]
    #[schemars(range(min = 1))]
    pub min_replicas: i32,

    /// Most nodes the job may grow to; absent: no bound but `replicas`' own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_replicas: Option<i32>,

    /// Placement of the on-demand part: the coordinator and node 0 (PE 0),
    /// plus any further on-demand nodes. These are never chosen for removal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_demand: Option<OnDemandPlacement>,

    /// Placement of the spot part: every node past the on-demand ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot: Option<Placement>,

    /// When and how at-risk spot nodes are replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescale_policy: Option<RescalePolicy>,

    /// Secret holding the job secret (64 hex characters) that authenticates
    /// the job's processes to the coordinator; absent: the operator generates
    /// one, owned by the ElasticJob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,

    /// Prometheus metrics of the job's nodes; absent: no metrics port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsSpec>,

    /// Survive a node lost without notice (a pod or instance gone with no
    /// interruption notice): the runtime keeps in-memory checkpoints on
    /// buddy nodes and, when a node other than node 0 dies, rolls the
    /// survivors back to the last complete one and goes on without it;
    /// the operator counts the recovery (`status.recoveries`) and launches
    /// a replacement. Absent: a lost node fails the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault_tolerance: Option<FaultTolerance>,

    /// What happens when the job fails (node 0 or the coordinator fails, or a
    /// node exits with an error). A lost spot node is not a failure: the job
    /// shrinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<JobRestartPolicy>,

    /// Whole-job relaunches allowed under `restartPolicy: OnFailure` before
    /// the job is marked Failed (default 6, as for a Job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub backoff_limit: Option<i32>,

    /// The coordinator container of node 0's pod: resources and security
    /// context; absent: the defaults of [`CoordinatorSpec`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator: Option<CoordinatorSpec>,

    /// Suspends the job: its pods are deleted; unsuspending relaunches it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,

    /// How the job starts: `AllReplicas` (default) waits until all
    /// `replicas` launch members registered (within the launch timeout);
    /// `MinReplicas` starts as soon as `minReplicas` are in and grows to
    /// `replicas` through newcomers, admitted as they come (spot capacity is
    /// often short at launch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_policy: Option<LaunchPolicy>,

    /// Seconds the job may run from its first launch (relaunches included,
    /// suspension resets it); past them its pods are deleted and it is
    /// Failed with reason `DeadlineExceeded`, as for a Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,

    /// Seconds after the job ended (Succeeded or Failed) at which the
    /// operator deletes the ElasticJob, as for a Job; absent: kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
}

/// How many nodes a job waits for before it starts.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum LaunchPolicy {
    /// Every one of `replicas`: all or nothing.
    #[default]
    AllReplicas,
    /// `minReplicas`; the rest join as newcomers by rescales.
    MinReplicas,
}

fn default_one() -> i32 {
    1
}

/// The coordinator container the operator adds to node 0's pod. Its image
/// is the operator's; image pull secrets are the pod's
/// (`template.spec.imagePullSecrets`).
///
/// Defaults: requests equal to limits (`cpu: 100m`, `memory: 128Mi`), so a
/// node container with equal requests and limits keeps node 0's pod in the
/// Guaranteed class (static CPU pinning for PE 0) and a CPU-utilisation HPA
/// finds a request on every container; and the `restricted` Pod Security
/// profile (non-root, no privilege escalation, every capability dropped,
/// the runtime's seccomp profile, a read-only root file system).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoordinatorSpec {
    /// Resources of the coordinator container, as in a Container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Security context of the coordinator container, as in a Container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
}

/// Node selector, affinity and tolerations of one part of the job.
///
/// When neither `nodeSelector` nor `affinity` is given, the operator uses
/// the capacity-type labels of EKS managed node groups
/// (`eks.amazonaws.com/capacityType`) and of Karpenter
/// (`karpenter.sh/capacity-type`), either one matching.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Labels a node must carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Scheduling constraints, as in a Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Taints tolerated, as in a Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Require the capacity type's node label (EKS managed node groups'
    /// `eks.amazonaws.com/capacityType` or Karpenter's
    /// `karpenter.sh/capacity-type`), ANDed with `nodeSelector` and
    /// `affinity` (default true). Set false for nodes that carry neither
    /// label (self-managed node groups), and pin by `nodeSelector` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_capacity_type: Option<bool>,
}

/// Placement of the on-demand part of the job, and its size.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OnDemandPlacement {
    /// On-demand nodes: node 0 and the next `replicas - 1` launch members.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1))]
    pub replicas: i32,
    /// Labels a node must carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Scheduling constraints, as in a Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Taints tolerated, as in a Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Require the capacity type's node label (EKS managed node groups'
    /// `eks.amazonaws.com/capacityType` or Karpenter's
    /// `karpenter.sh/capacity-type`), ANDed with `nodeSelector` and
    /// `affinity` (default true). Set false for nodes that carry neither
    /// label (self-managed node groups), and pin by `nodeSelector` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_capacity_type: Option<bool>,
}

impl Default for OnDemandPlacement {
    fn default() -> Self {
        OnDemandPlacement {
            replicas: 1,
            node_selector: None,
            affinity: None,
            tolerations: None,
            pin_capacity_type: None,
        }
    }
}

impl OnDemandPlacement {
    /// The placement part, without the count.
    pub fn placement(&self) -> Placement {
        Placement {
            node_selector: self.node_selector.clone(),
            affinity: self.affinity.clone(),
            tolerations: self.tolerations.clone(),
            pin_capacity_type: self.pin_capacity_type,
        }
    }
}

/// Which kind of capacity a part of the job runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CapacityType {
    /// On-demand capacity: the coordinator and node 0.
    OnDemand,
    /// Spot capacity: may be reclaimed with a short notice.
    Spot,
}

impl CapacityType {
    /// The (EKS, Karpenter) label values for this capacity type.
    pub fn label_values(self) -> (&'static str, &'static str) {
        match self {
            CapacityType::OnDemand => (EKS_ON_DEMAND, KARPENTER_ON_DEMAND),
            CapacityType::Spot => (EKS_SPOT, KARPENTER_SPOT),
        }
    }
}

impl Placement {
    /// Whether the capacity type's label is required (default true).
    pub fn pins_capacity_type(&self) -> bool {
        self.pin_capacity_type.unwrap_or(true)
    }

    /// The affinity a pod of this part gets: the template's (`template`),
    /// then this part's `affinity`, then the capacity-type requirement, all
    /// merged: required node selector terms are ANDed (each term of one
    /// with each of the other, as terms are ORed within one), preferred
    /// terms and pod (anti-)affinities are kept side by side.
    pub fn effective_affinity(
        &self,
        template: Option<&Affinity>,
        capacity: CapacityType,
    ) -> Option<Affinity> {
        let mut merged = template.cloned();
        if let Some(part) = &self.affinity {
            merged = Some(merge_affinity(merged, part));
        }
        if self.pins_capacity_type() {
            merged = Some(merge_affinity(merged, &default_capacity_affinity(capacity)));
        }
        merged
    }
}

/// `extra` merged into `base` (see [`Placement::effective_affinity`]).
pub fn merge_affinity(base: Option<Affinity>, extra: &Affinity) -> Affinity {
    let mut out = base.unwrap_or_default();
    fn append<T: Clone>(into: &mut Option<Vec<T>>, from: &Option<Vec<T>>) {
        if let Some(from) = from {
            into.get_or_insert_with(Vec::new)
                .extend(from.iter().cloned());
        }
    }
    if let Some(extra_node) = &extra.node_affinity {
        let node = out.node_affinity.get_or_insert_with(NodeAffinity::default);
        append(
            &mut node.preferred_during_scheduling_ignored_during_execution,
            &extra_node.preferred_during_scheduling_ignored_during_execution,
        );
        if let Some(extra_required) =
            &extra_node.required_during_scheduling_ignored_during_execution
        {
            node.required_during_scheduling_ignored_during_execution = Some(
                match node
                    .required_during_scheduling_ignored_during_execution
                    .take()
                {
                    None => extra_required.clone(),
                    Some(required) => NodeSelector {
                        node_selector_terms: and_terms(
                            &required.node_selector_terms,
                            &extra_required.node_selector_terms,
                        ),
                    },
                },
            );
        }
    }
    if let Some(extra_pod) = &extra.pod_affinity {
        let pod = out.pod_affinity.get_or_insert_with(Default::default);
        append(
            &mut pod.required_during_scheduling_ignored_during_execution,
            &extra_pod.required_during_scheduling_ignored_during_execution,
        );
        append(
            &mut pod.preferred_during_scheduling_ignored_during_execution,
            &extra_pod.preferred_during_scheduling_ignored_during_execution,
        );
    }
    if let Some(extra_anti) = &extra.pod_anti_affinity {
        let anti = out.pod_anti_affinity.get_or_insert_with(Default::default);
        append(
            &mut anti.required_during_scheduling_ignored_during_execution,
            &extra_anti.required_during_scheduling_ignored_during_execution,
        );
        append(
            &mut anti.preferred_during_scheduling_ignored_during_execution,
            &extra_anti.preferred_during_scheduling_ignored_during_execution,
        );
    }
    out
}

/// Two ORed lists of node selector terms ANDed: every pair's requirements together.
fn and_terms(a: &[NodeSelectorTerm], b: &[NodeSelectorTerm]) -> Vec<NodeSelectorTerm> {
    let mut out = Vec::with_capacity(a.len() * b.len());
    for x in a {
        for y in b {
            let mut term = x.clone();
            if let Some(e) = &y.match_expressions {
                term.match_expressions
                    .get_or_insert_with(Vec::new)
                    .extend(e.iter().cloned());
            }
            if let Some(f) = &y.match_fields {
                term.match_fields
                    .get_or_insert_with(Vec::new)
                    .extend(f.iter().cloned());
            }
            out.push(term);
        }
    }
    out
}

/// Required node affinity matching EKS managed node groups' or Karpenter's
/// capacity-type label for `capacity`.
pub fn default_capacity_affinity(capacity: CapacityType) -> Affinity {
    let (eks, karpenter) = capacity.label_values();
    let term = |key: &str, value: &str| NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: key.to_owned(),
            operator: "In".to_owned(),
            values: Some(vec![value.to_owned()]),
        }]),
        match_fields: None,
    };
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![
                    term(EKS_CAPACITY_TYPE_LABEL, eks),
                    term(KARPENTER_CAPACITY_TYPE_LABEL, karpenter),
                ],
            }),
            preferred_during_scheduling_ignored_during_execution: None,
        }),
        pod_affinity: None,
        pod_anti_affinity: None,
    }
}

/// When and how at-risk spot nodes are replaced (see `docs/operator.md`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RescalePolicy {
    /// Proactive replacement on rebalance recommendations.
    #[serde(default)]
    pub rebalance: RebalancePolicy,
    /// An interruption notice for an at-risk node forces a rescale at once,
    /// with whatever replacements are ready (default true).
    #[serde(default = "default_true")]
    pub emergency_on_interruption: bool,
    /// When a node must go (interruption) and no replacement is ready by its
    /// deadline, shrink the job rather than lose the node uncleanly (default true).
    #[serde(default = "default_true")]
    pub shrink_when_no_replacement: bool,
    /// Time between an interruption notice and the node's loss, when the
    /// notice itself does not say (AWS gives two minutes).
    #[serde(default = "default_interruption_seconds")]
    #[schemars(range(min = 0))]
    pub interruption_deadline_seconds: i32,
}

fn default_true() -> bool {
    true
}

fn default_interruption_seconds() -> i32 {
    120
}

fn default_timeout_seconds() -> i32 {
    120
}

/// Proactive replacement of nodes that got a rebalance recommendation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebalancePolicy {
    /// `CompleteReplacement`: one rescale once every at-risk node has a ready
    /// replacement (or at the timeout); `Immediate`: one rescale per
    /// replacement as soon as it is ready.
    #[serde(default)]
    pub mode: RebalanceMode,
    /// Seconds after the oldest rebalance recommendation at which the job
    /// rescales with the replacements that are ready.
    #[serde(default = "default_timeout_seconds")]
    #[schemars(range(min = 0))]
    pub timeout_seconds: i32,
}

impl Default for RebalancePolicy {
    fn default() -> Self {
        RebalancePolicy {
            mode: RebalanceMode::default(),
            timeout_seconds: default_timeout_seconds(),
        }
    }
}

impl Default for RescalePolicy {
    fn default() -> Self {
        RescalePolicy {
            rebalance: RebalancePolicy::default(),
            emergency_on_interruption: true,
            shrink_when_no_replacement: true,
            interruption_deadline_seconds: default_interruption_seconds(),
        }
    }
}

/// How replacements are folded into the job.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RebalanceMode {
    /// Wait until every at-risk node has a ready replacement: one rescale.
    #[default]
    CompleteReplacement,
    /// Rescale for each replacement as soon as it is ready.
    Immediate,
}

/// A key in a Secret of the job's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Key holding the hex secret (default `secret`).
    #[serde(default = "default_secret_key")]
    pub key: String,
}

fn default_secret_key() -> String {
    "secret".to_owned()
}

/// Prometheus metrics of the job's nodes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsSpec {
    /// Container port serving `/metrics`.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// The runtime's fault tolerance (docs/operator.md, "Fault tolerance").
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FaultTolerance {
    /// An in-memory checkpoint every this many load-balancing sync points
    /// (`at_sync`) of the program: the operator appends the runtime option
    /// `+ft-every K` to the node container's arguments in every pod.
    #[schemars(range(min = 1))]
    pub checkpoint_every: i32,
}

/// `backoffLimit` when the spec does not say (a Kubernetes Job's default).
pub const DEFAULT_BACKOFF_LIMIT: i32 = 6;

/// Job-level failure handling.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum JobRestartPolicy {
    /// A failed job stays Failed.
    #[default]
    Never,
    /// A failed job is relaunched from the start, up to `backoffLimit` times.
    OnFailure,
}

/// Lifecycle phase of an ElasticJob.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum JobPhase {
    /// Accepted; nothing created yet.
    Pending,
    /// Pods created; waiting for every launch member to register.
    Launching,
    /// Running at epoch `status.epoch`.
    Running,
    /// A rescale was requested and is not yet committed.
    Rescaling,
    /// Node 0's program ended with success.
    Succeeded,
    /// The job failed (and is not relaunched).
    Failed,
    /// `spec.suspend` is set; no pods.
    Suspended,
}

impl fmt::Display for JobPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Observed state of an ElasticJob.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElasticJobStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<JobPhase>,
    /// `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Membership epoch of the job's current view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    /// Nodes of the job (pods that are or are becoming members); the scale
    /// subresource reads it.
    #[serde(default)]
    pub replicas: i32,
    /// Nodes that are members of the current view.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Newcomers registered and waiting to be admitted by a rescale.
    #[serde(default)]
    pub pending_newcomers: i32,
    /// Whole-job relaunches so far (`restartPolicy: OnFailure`).
    #[serde(default)]
    pub restarts: i32,
    /// Members lost without notice that the job recovered from (with
    /// `faultTolerance`): it went on without them from its last in-memory
    /// checkpoint.
    #[serde(default)]
    pub recoveries: i32,
    /// Pods whose node got a rebalance recommendation or an interruption notice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub at_risk: Vec<String>,
    /// Members of the current view, in view order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,
    /// The last committed (or failed) rescale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rescale: Option<RescaleRecord>,
    /// Conditions (`Ready`, `SpecValid`, `Rescaling`, ...), each with its
    /// `observedGeneration`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Label selector of the job's pods, in string form, for the scale
    /// subresource (and so for an HPA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// When the job was first launched (`activeDeadlineSeconds` counts from
    /// it; a suspension clears it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the job ended (`ttlSecondsAfterFinished` counts from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
}

/// One member of the job's view.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// Pod name.
    pub pod: String,
    /// Kubernetes node the pod runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Ductile node id in the current view.
    pub node_id: i32,
    /// PEs the node runs.
    pub pes: i32,
}

/// A rescale, as recorded in status.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RescaleRecord {
    /// Why it happened (`CompleteReplacement`, `Emergency`, `Timeout`, `ScaleUp`, ...).
    pub reason: String,
    /// Pods removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// Pods admitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<String>,
    /// Milliseconds per rescale stage (evacuate, barrier, commit, reconcile, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stage_timings: BTreeMap<String, i64>,
    /// Milliseconds from request to commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
    /// Epoch the rescale committed (absent when it failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
}

/// One thing wrong with an ElasticJob spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecProblem {
    /// `pesPerPod` below 1.
    #[error("pesPerPod is {0}; it must be at least 1")]
    PesPerPod(i32),
    /// `replicas` below 1.
    #[error("replicas is {0}; it must be at least 1")]
    Replicas(i32),
    /// `minReplicas` below 1.
    #[error("minReplicas is {0}; it must be at least 1")]
    MinReplicas(i32),
    /// `replicas` below `minReplicas`.
    #[error("replicas ({replicas}) is below minReplicas ({min})")]
    BelowMin {
        /// `replicas`.
        replicas: i32,
        /// `minReplicas`.
        min: i32,
    },
    /// `replicas` above `maxReplicas`.
    #[error("replicas ({replicas}) is above maxReplicas ({max})")]
    AboveMax {
        /// `replicas`.
        replicas: i32,
        /// `maxReplicas`.
        max: i32,
    },
    /// `minReplicas` above `maxReplicas`.
    #[error("minReplicas ({min}) is above maxReplicas ({max})")]
    MinAboveMax {
        /// `minReplicas`.
        min: i32,
        /// `maxReplicas`.
        max: i32,
    },
    /// `onDemand.replicas` out of range.
    #[error("onDemand.replicas ({on_demand}) must be between 1 and minReplicas ({min}): on-demand nodes are never removed")]
    OnDemand {
        /// `onDemand.replicas`.
        on_demand: i32,
        /// `minReplicas`.
        min: i32,
    },
    /// The pod template has no container to run the node.
    #[error("template.spec.containers is empty: the first container runs the node")]
    NoContainer,
    /// A negative duration.
    #[error("{field} is {value}; it must not be negative")]
    Negative {
        /// The field's path.
        field: &'static str,
        /// Its value.
        value: i32,
    },
    /// Metrics port out of range.
    #[error("metrics.port is {0}; it must be in 1..=65535")]
    MetricsPort(i32),
    /// Metrics port taken by the coordinator or the control endpoint.
    #[error(
        "metrics.port is {0}, which node 0's pod uses already (coordinator {coordinator}, control endpoint {control})",
        coordinator = crate::contract::COORDINATOR_PORT,
        control = crate::contract::CONTROL_PORT
    )]
    MetricsPortTaken(i32),
    /// Empty secret name.
    #[error("secretRef.name is empty")]
    SecretName,
    /// `faultTolerance.checkpointEvery` below 1.
    #[error("faultTolerance.checkpointEvery is {0}; it must be at least 1")]
    CheckpointEvery(i32),
    /// Fault tolerance on a node container with neither command nor args.
    #[error("faultTolerance needs the node container's command or args: the operator appends +ft-every to its arguments, and cannot extend an image's own CMD")]
    FaultToleranceNoCommand,
}

/// Every problem found in an ElasticJob spec (never empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid ElasticJob spec: {}", join(.problems))]
pub struct InvalidSpec {
    /// The problems, in field order.
    pub problems: Vec<SpecProblem>,
}

fn join(problems: &[SpecProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl ElasticJobSpec {
    /// Checks what the API server's schema checks (minimums and the CEL
    /// rules) and what it cannot (a container to run the node), returning
    /// every problem at once. The reconciler reports the error in the
    /// `SpecValid` condition and changes nothing.
    pub fn validate(&self) -> Result<(), InvalidSpec> {
        use SpecProblem as P;
        let mut problems = Vec::new();
        if self.pes_per_pod < 1 {
            problems.push(P::PesPerPod(self.pes_per_pod));
        }
        if self.replicas < 1 {
            problems.push(P::Replicas(self.replicas));
        }
        if self.min_replicas < 1 {
            problems.push(P::MinReplicas(self.min_replicas));
        }
        if self.replicas < self.min_replicas {
            problems.push(P::BelowMin {
                replicas: self.replicas,
                min: self.min_replicas,
            });
        }
        if let Some(max) = self.max_replicas {
            if self.replicas > max {
                problems.push(P::AboveMax {
                    replicas: self.replicas,
                    max,
                });
            }
            if self.min_replicas > max {
                problems.push(P::MinAboveMax {
                    min: self.min_replicas,
                    max,
                });
            }
        }
        let on_demand = self.on_demand_replicas();
        if on_demand < 1 || on_demand > self.min_replicas.max(1) {
            problems.push(P::OnDemand {
                on_demand,
                min: self.min_replicas,
            });
        }
        let no_container = self
            .template
            .spec
            .as_ref()
            .is_none_or(|spec| spec.containers.is_empty());
        if no_container {
            problems.push(P::NoContainer);
        }
        if let Some(policy) = &self.rescale_policy {
            if policy.rebalance.timeout_seconds < 0 {
                problems.push(P::Negative {
                    field: "rescalePolicy.rebalance.timeoutSeconds",
                    value: policy.rebalance.timeout_seconds,
                });
            }
            if policy.interruption_deadline_seconds < 0 {
                problems.push(P::Negative {
                    field: "rescalePolicy.interruptionDeadlineSeconds",
                    value: policy.interruption_deadline_seconds,
                });
            }
        }
        if let Some(limit) = self.backoff_limit {
            if limit < 0 {
                problems.push(P::Negative {
                    field: "backoffLimit",
                    value: limit,
                });
            }
        }
        if let Some(metrics) = &self.metrics {
            if !(1..=65535).contains(&metrics.port) {
                problems.push(P::MetricsPort(metrics.port));
            } else if [
                crate::contract::COORDINATOR_PORT,
                crate::contract::CONTROL_PORT,
            ]
            .contains(&metrics.port)
            {
                problems.push(P::MetricsPortTaken(metrics.port));
            }
        }
        if let Some(secret) = &self.secret_ref {
            if secret.name.is_empty() {
                problems.push(P::SecretName);
            }
        }
        if let Some(ft) = &self.fault_tolerance {
            if ft.checkpoint_every < 1 {
                problems.push(P::CheckpointEvery(ft.checkpoint_every));
            }
            let no_command = self
                .template
                .spec
                .as_ref()
                .and_then(|spec| spec.containers.first())
                .is_some_and(|c| c.command.is_none() && c.args.is_none());
            if no_command {
                problems.push(P::FaultToleranceNoCommand);
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(InvalidSpec { problems })
        }
    }

    /// Number of on-demand nodes (node 0 and the next launch members).
    pub fn on_demand_replicas(&self) -> i32 {
        self.on_demand.as_ref().map_or(1, |p| p.replicas)
    }

    /// The rescale policy, defaults filled in.
    pub fn rescale_policy(&self) -> RescalePolicy {
        self.rescale_policy.clone().unwrap_or_default()
    }

    /// Placement of the on-demand part, defaults filled in.
    pub fn on_demand_placement(&self) -> Placement {
        self.on_demand.clone().unwrap_or_default().placement()
    }

    /// Placement of the spot part, defaults filled in.
    pub fn spot_placement(&self) -> Placement {
        self.spot.clone().unwrap_or_default()
    }

    /// The job's restart policy, default filled in.
    pub fn restart_policy(&self) -> JobRestartPolicy {
        self.restart_policy.unwrap_or_default()
    }

    /// Launch members: the nodes the job starts with (the coordinator's
    /// `--expect`); the rest of `replicas` join as newcomers.
    pub fn launch_replicas(&self) -> i32 {
        match self.launch_policy.unwrap_or_default() {
            LaunchPolicy::AllReplicas => self.replicas,
            LaunchPolicy::MinReplicas => self.min_replicas.clamp(1, self.replicas.max(1)),
        }
    }

    /// With `faultTolerance`: K of the runtime's `+ft-every K` (at least 1).
    pub fn checkpoint_every(&self) -> Option<u32> {
        self.fault_tolerance
            .as_ref()
            .and_then(|ft| u32::try_from(ft.checkpoint_every).ok())
            .filter(|&k| k >= 1)
    }

    /// Relaunches allowed under `OnFailure`, default filled in.
    pub fn backoff_limit(&self) -> i32 {
        self.backoff_limit.unwrap_or(DEFAULT_BACKOFF_LIMIT).max(0)
    }
}

/// Subtrees of the spec schema copied from the Kubernetes API (pod template,
/// affinity, tolerations); their descriptions are dropped from the CRD.
const EMBEDDED_K8S_SCHEMAS: &[&[&str]] = &[
    &["template"],
    &["onDemand", "affinity"],
    &["onDemand", "tolerations"],
    &["spot", "affinity"],
    &["spot", "tolerations"],
];

/// Longest ElasticJob name: its pods' host names `{job}-n{k}` stay DNS
/// labels (63 characters) for newcomer numbers up to 11 digits.
pub const MAX_NAME_LEN: usize = 50;

/// Why `name` cannot name an ElasticJob (what the CRD's CEL rule refuses),
/// or `None`.
pub fn name_problem(name: &str) -> Option<String> {
    let dns1035 = name.len() <= MAX_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    (!dns1035).then(|| {
        format!(
            "the name {name:?} must be a DNS-1035 label of at most {MAX_NAME_LEN} characters: it names the job's Service and prefixes its pods' host names"
        )
    })
}

/// The ElasticJob CRD, as installed.
///
/// It is [`ElasticJob::crd`] with two changes that keep it under the sizes
/// Kubernetes tooling accepts (the full pod schema with its documentation is
/// over 600 kB; client-side `kubectl apply` stops at 256 kB): the
/// descriptions inside the embedded Kubernetes schemas (pod template,
/// affinity, tolerations) are dropped, as `controller-gen crd:maxDescLen=0`
/// does, and the template's `metadata` is reduced to the labels and
/// annotations the operator copies to the pods.
pub fn crd() -> CustomResourceDefinition {
    let crd = ElasticJob::crd();
    let mut value = serde_json::to_value(&crd).expect("a CRD serialises to JSON");
    for version in value["spec"]["versions"]
        .as_array_mut()
        .expect("a CRD has versions")
    {
        let spec = &mut version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for path in EMBEDDED_K8S_SCHEMAS {
            let mut node = &mut *spec;
            for (i, key) in path.iter().enumerate() {
                node = &mut node[*key];
                if i + 1 < path.len() {
                    node = &mut node["properties"];
                }
            }
            // Keep the field's own description (ours); strip everything below it.
            for child in children_mut(node) {
                strip_descriptions(child);
            }
        }
        let string_map = serde_json::json!({
            "type": "object",
            "additionalProperties": {"type": "string"}
        });
        spec["template"]["properties"]["metadata"] = serde_json::json!({
            "description": "Labels and annotations copied to every pod of the job.",
            "type": "object",
            "properties": {"labels": string_map, "annotations": string_map}
        });
        let root = &mut version["schema"]["openAPIV3Schema"];
        // Conditions are a map keyed by type: server-side apply merges them
        // by type, and two of one type are refused.
        let conditions = &mut root["properties"]["status"]["properties"]["conditions"];
        conditions["x-kubernetes-list-type"] = "map".into();
        conditions["x-kubernetes-list-map-keys"] = serde_json::json!(["type"]);
        // The name becomes the Service's (a DNS-1035 label) and the prefix of
        // every pod's hostname, `{job}-n{k}` (a DNS label, 63 characters).
        root["x-kubernetes-validations"] = serde_json::json!([{
            "rule": format!("self.metadata.name.size() <= {MAX_NAME_LEN} && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"),
            "message": format!("the name must be a DNS-1035 label of at most {MAX_NAME_LEN} characters: it names the job's Service and prefixes its pods' host names ({{name}}-n{{k}})"),
        }]);
    }
    serde_json::from_value(value).expect("the edited CRD is still a CRD")
}

/// The schema nodes directly below `node` (properties, items, additionalProperties).
fn children_mut(node: &mut serde_json::Value) -> Vec<&mut serde_json::Value> {
    let mut out = Vec::new();
    if let Some(object) = node.as_object_mut() {
        for (key, child) in object.iter_mut() {
            match key.as_str() {
                "properties" => {
                    if let Some(props) = child.as_object_mut() {
                        out.extend(props.values_mut());
                    }
                }
                "items" | "additionalProperties" => out.push(child),
                "allOf" | "anyOf" | "oneOf" => {
                    if let Some(list) = child.as_array_mut() {
                        out.extend(list.iter_mut());
                    }
                }
                _ => {}
            }
        }
    }
    out
}

fn strip_descriptions(node: &mut serde_json::Value) {
    if let Some(object) = node.as_object_mut() {
        object.remove("description");
    }
    for child in children_mut(node) {
        strip_descriptions(child);
    }
}

/// The ElasticJob CRD as YAML, as committed in `crds/elasticjob.yaml`.
pub fn crd_yaml() -> String {
    let crd = crd();
    let yaml = serde_yaml::to_string(&crd).expect("a CRD always serialises to YAML");
    format!("# Generated by `cargo run -p ductile-operator --bin crdgen`; do not edit.\n{yaml}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    #[test]
    fn a_name_must_leave_room_for_newcomer_host_names() {
        assert_eq!(name_problem("jacobi2d"), None);
        assert_eq!(name_problem(&"a".repeat(MAX_NAME_LEN)), None);
        assert!(name_problem(&"a".repeat(MAX_NAME_LEN + 1)).is_some());
        for bad in ["2d", "Jacobi", "job-", "a_b", "a.b", ""] {
            assert!(name_problem(bad).is_some(), "{bad:?} accepted");
        }
        // A newcomer's host name with an 11-digit number is still a DNS label.
        assert!(format!("{}-n{}", "a".repeat(MAX_NAME_LEN), 99_999_999_999u64).len() <= 63);
        let crd = serde_json::to_value(crd()).unwrap();
        let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        assert!(root["x-kubernetes-validations"][0]["rule"]
            .as_str()
            .unwrap()
            .contains(&format!("size() <= {MAX_NAME_LEN}")));
        let conditions = &root["properties"]["status"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map");
        assert_eq!(conditions["x-kubernetes-list-map-keys"], serde_json::json!(["type"]));
    }

    fn spec(replicas: i32, min: i32, max: Option<i32>) -> ElasticJobSpec {
        ElasticJobSpec {
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "node".into(),
                        image: Some("ductile/jacobi2d:latest".into()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            pes_per_pod: 2,
            replicas,
            min_replicas: min,
            max_replicas: max,
            on_demand: None,
            spot: None,
            rescale_policy: None,
            secret_ref: None,
            metrics: None,
            fault_tolerance: None,
            restart_policy: None,
            backoff_limit: None,
            coordinator: None,
            suspend: false,
            launch_policy: None,
            active_deadline_seconds: None,
            ttl_seconds_after_finished: None,
        }
    }

    #[test]
    fn a_partial_launch_starts_with_min_replicas() {
        let mut s = spec(4, 2, None);
        assert_eq!(s.launch_replicas(), 4, "all replicas by default");
        s.launch_policy = Some(LaunchPolicy::MinReplicas);
        assert_eq!(s.launch_replicas(), 2);
        let mut all_min = spec(3, 3, None);
        all_min.launch_policy = Some(LaunchPolicy::MinReplicas);
        assert_eq!(all_min.launch_replicas(), 3);
    }

    #[test]
    fn fault_tolerance_needs_a_period_of_at_least_one_and_a_command_to_extend() {
        let mut s = spec(4, 2, None);
        assert_eq!(s.checkpoint_every(), None);
        s.fault_tolerance = Some(FaultTolerance {
            checkpoint_every: 0,
        });
        assert_eq!(
            s.validate().unwrap_err().problems,
            vec![
                SpecProblem::CheckpointEvery(0),
                SpecProblem::FaultToleranceNoCommand
            ]
        );
        assert_eq!(s.checkpoint_every(), None);
        s.fault_tolerance = Some(FaultTolerance {
            checkpoint_every: 5,
        });
        if let Some(pod) = s.template.spec.as_mut() {
            pod.containers[0].args = Some(vec!["--iters".into(), "9".into()]);
        }
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.checkpoint_every(), Some(5));
    }

    #[test]
    fn a_sane_spec_is_valid() {
        assert_eq!(spec(4, 2, Some(8)).validate(), Ok(()));
        assert_eq!(spec(1, 1, None).validate(), Ok(()));
    }

    #[test]
    fn out_of_bounds_replicas_are_reported_all_at_once() {
        let mut s = spec(9, 10, Some(8));
        s.pes_per_pod = 0;
        let err = s.validate().unwrap_err();
        assert_eq!(
            err.problems,
            vec![
                SpecProblem::PesPerPod(0),
                SpecProblem::BelowMin {
                    replicas: 9,
                    min: 10
                },
                SpecProblem::AboveMax {
                    replicas: 9,
                    max: 8
                },
                SpecProblem::MinAboveMax { min: 10, max: 8 },
            ]
        );
        let text = err.to_string();
        assert!(text.contains("pesPerPod is 0"), "{text}");
        assert!(
            text.contains("replicas (9) is above maxReplicas (8)"),
            "{text}"
        );
    }

    #[test]
    fn a_metrics_port_must_be_a_port_and_not_one_of_node_0s() {
        let mut s = spec(4, 2, None);
        for (port, problem) in [
            (0, SpecProblem::MetricsPort(0)),
            (70000, SpecProblem::MetricsPort(70000)),
            (7070, SpecProblem::MetricsPortTaken(7070)),
            (7071, SpecProblem::MetricsPortTaken(7071)),
        ] {
            s.metrics = Some(MetricsSpec { port });
            assert_eq!(s.validate().unwrap_err().problems, vec![problem]);
        }
        s.metrics = Some(MetricsSpec { port: 9464 });
        assert_eq!(s.validate(), Ok(()));
    }

    #[test]
    fn on_demand_part_must_fit_under_min_replicas() {
        let mut s = spec(4, 2, None);
        s.on_demand = Some(OnDemandPlacement {
            replicas: 3,
            ..OnDemandPlacement::default()
        });
        assert_eq!(
            s.validate().unwrap_err().problems,
            vec![SpecProblem::OnDemand {
                on_demand: 3,
                min: 2
            }]
        );
    }

    #[test]
    fn a_template_without_container_is_invalid() {
        let mut s = spec(2, 1, None);
        s.template.spec = None;
        assert_eq!(
            s.validate().unwrap_err().problems,
            vec![SpecProblem::NoContainer]
        );
    }

    #[test]
    fn default_placement_matches_either_capacity_label() {
        let affinity = Placement::default()
            .effective_affinity(None, CapacityType::Spot)
            .unwrap();
        let terms = affinity
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        let pairs: Vec<(String, String)> = terms
            .iter()
            .map(|t| {
                let r = &t.match_expressions.as_ref().unwrap()[0];
                (r.key.clone(), r.values.as_ref().unwrap()[0].clone())
            })
            .collect();
        assert_eq!(
            pairs,
            vec![
                (EKS_CAPACITY_TYPE_LABEL.into(), EKS_SPOT.into()),
                (KARPENTER_CAPACITY_TYPE_LABEL.into(), KARPENTER_SPOT.into()),
            ]
        );
    }

    #[test]
    fn user_placement_is_merged_with_the_capacity_requirement() {
        // A node selector no longer disables the capacity pinning.
        let placement = Placement {
            node_selector: Some([("pool".to_owned(), "hpc".to_owned())].into()),
            ..Placement::default()
        };
        assert_eq!(
            placement.effective_affinity(None, CapacityType::OnDemand),
            Some(default_capacity_affinity(CapacityType::OnDemand))
        );
        // The template's anti-affinity and node terms survive; each of its
        // required terms is ANDed with each capacity term.
        let template: Affinity = serde_json::from_value(serde_json::json!({
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}]}
        }))
        .unwrap();
        let merged = Placement::default()
            .effective_affinity(Some(&template), CapacityType::Spot)
            .unwrap();
        assert_eq!(merged.pod_anti_affinity, template.pod_anti_affinity);
        let terms = merged
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 2);
        for (term, label) in terms
            .iter()
            .zip([EKS_CAPACITY_TYPE_LABEL, KARPENTER_CAPACITY_TYPE_LABEL])
        {
            let keys: Vec<&str> = term
                .match_expressions
                .as_ref()
                .unwrap()
                .iter()
                .map(|e| e.key.as_str())
                .collect();
            assert_eq!(keys, ["zone", label]);
        }
        // Pinning off: only what the user gave.
        let unpinned = Placement {
            pin_capacity_type: Some(false),
            ..Placement::default()
        };
        assert_eq!(unpinned.effective_affinity(None, CapacityType::Spot), None);
        assert_eq!(
            unpinned.effective_affinity(Some(&template), CapacityType::Spot),
            Some(template)
        );
    }

    #[test]
    fn spec_defaults_fill_in_when_deserialising() {
        let s: ElasticJobSpec = serde_json::from_value(serde_json::json!({
            "template": {"spec": {"containers": [{"name": "node", "image": "x"}]}},
            "replicas": 3
        }))
        .unwrap();
        assert_eq!(s.pes_per_pod, 1);
        assert_eq!(s.min_replicas, 1);
        assert_eq!(s.rescale_policy().rebalance.timeout_seconds, 120);
        assert_eq!(
            s.rescale_policy().rebalance.mode,
            RebalanceMode::CompleteReplacement
        );
        assert!(s.rescale_policy().emergency_on_interruption);
        assert_eq!(s.on_demand_replicas(), 1);
        assert_eq!(s.validate(), Ok(()));
    }

    #[test]
    fn the_crd_has_the_names_subresources_and_columns() {
        let crd = crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("elasticjobs.ductile.dev")
        );
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.short_names, Some(vec!["ej".to_owned()]));
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, VERSION);
        let sub = version.subresources.as_ref().unwrap();
        assert!(sub.status.is_some());
        let scale = sub.scale.as_ref().unwrap();
        assert_eq!(scale.spec_replicas_path, ".spec.replicas");
        assert_eq!(scale.status_replicas_path, ".status.replicas");
        assert_eq!(
            scale.label_selector_path.as_deref(),
            Some(".status.selector")
        );
        let columns: Vec<&str> = version
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(columns, ["Phase", "Epoch", "Ready", "Desired", "Age"]);
        let json = serde_json::to_string(&crd).unwrap();
        assert!(json.contains("x-kubernetes-validations"));
        assert!(json.contains("self.minReplicas <= self.replicas"));
    }
}
