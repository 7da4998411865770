//! The Kubernetes objects an ElasticJob owns, built as plain values (no
//! client): the job secret, the headless Service, and one pod per node.
//!
//! Spot pods leave the job before they stop: a preStop hook (`ductile
//! wait-left`) and a grace period from the interruption deadline, the
//! contract of [`crate::contract`].
//!
//! Node 0's pod carries two containers: the coordinator (the operator image's
//! `ductile coordinator`) and node 0 itself. One pod rather than two because
//! both must be scheduled, live and die together on the same on-demand node;
//! every node, node 0 included, reaches the coordinator by its pod DNS name
//! through the headless Service. Every pod
//! gets the environment contract of [`crate::contract`], identical to what
//! `ductile run` sets locally.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, ExecAction, Lifecycle,
    LifecycleHandler, ObjectFieldSelector, Pod, PodSpec, ResourceRequirements, SeccompProfile,
    Secret, SecretVolumeSource, SecurityContext, Service, ServicePort, ServiceSpec, Volume,
    VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::ByteString;
use kube::{Resource, ResourceExt};

use crate::contract;
use crate::crd::{CapacityType, ElasticJob};

/// Label carrying the owning ElasticJob's name on every object.
pub const JOB_LABEL: &str = "ductile.dev/job";
/// Label with the node's launch index (launch members only).
pub const LAUNCH_INDEX_LABEL: &str = "ductile.dev/launch-index";
/// Label saying `on-demand` or `spot`.
pub const CAPACITY_LABEL: &str = "ductile.dev/capacity";
/// Label saying `launch` or `newcomer`.
pub const ROLE_LABEL: &str = "ductile.dev/role";
/// Annotation on a replacement newcomer's pod naming the member it replaces.
pub const REPLACES_ANNOTATION: &str = "ductile.dev/replaces";
/// Finalizer the operator puts on every ElasticJob it manages.
pub const FINALIZER: &str = "ductile.dev/teardown";
/// Name of the coordinator's container in node 0's pod.
pub const COORDINATOR_CONTAINER: &str = "coordinator";
pub use crate::contract::{CONTROL_PORT, COORDINATOR_PORT};
/// Karpenter's annotation that keeps a pod's node from voluntary disruption
/// (consolidation, drift, expiry).
pub const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// The Cluster Autoscaler's annotation that keeps it from evicting a pod to
/// scale its node down.
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
/// The container `kubectl logs` and `kubectl exec` pick without `-c`.
pub const DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";
/// Where the job secret is mounted in every pod.
pub const SECRET_DIR: &str = "/var/run/ductile";
/// Key of the job secret in a generated Secret.
pub const SECRET_KEY: &str = "secret";

/// Operator-wide settings the objects depend on.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectSettings {
    /// Image with the `ductile` binary, for the coordinator container.
    pub coordinator_image: String,
    /// Seconds the coordinator waits for every launch member.
    pub launch_timeout_s: u32,
    /// The operator's namespace, when every job gets a NetworkPolicy that
    /// lets only its own pods and that namespace reach its pods; `None`:
    /// no NetworkPolicy.
    pub network_policy: Option<String>,
}

impl Default for ObjectSettings {
    fn default() -> Self {
        ObjectSettings {
            coordinator_image: "ghcr.io/ductile/ductile-operator:0.1.0".to_owned(),
            launch_timeout_s: 300,
            network_policy: None,
        }
    }
}

fn owner(job: &ElasticJob) -> OwnerReference {
    job.controller_owner_ref(&())
        .expect("an ElasticJob from the API server has a name and uid")
}

/// Labels common to every object of `job`.
pub fn job_labels(job: &ElasticJob) -> BTreeMap<String, String> {
    BTreeMap::from([
        (JOB_LABEL.to_owned(), job.name_any()),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "ductile-operator".to_owned(),
        ),
    ])
}

/// The label selector of the job's pods, as `status.selector` shows it.
pub fn selector(job: &ElasticJob) -> String {
    format!("{JOB_LABEL}={}", job.name_any())
}

/// Name of the generated job Secret.
pub fn secret_name(job: &ElasticJob) -> String {
    match &job.spec.secret_ref {
        Some(reference) => reference.name.clone(),
        None => format!("{}-secret", job.name_any()),
    }
}

fn secret_key(job: &ElasticJob) -> String {
    job.spec
        .secret_ref
        .as_ref()
        .map_or_else(|| SECRET_KEY.to_owned(), |r| r.key.clone())
}

/// The generated job Secret holding `secret_hex` (when `spec.secretRef` is absent).
pub fn job_secret(job: &ElasticJob, secret_hex: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(job)),
            namespace: job.namespace(),
            labels: Some(job_labels(job)),
            owner_references: Some(vec![owner(job)]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            SECRET_KEY.to_owned(),
            ByteString(secret_hex.as_bytes().to_vec()),
        )])),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    }
}

/// The headless Service that gives each pod a DNS name
/// (`{pod}.{job}.{namespace}.svc`), the coordinator's included.
pub fn headless_service(job: &ElasticJob) -> Service {
    let port = |name: &str, port: i32| ServicePort {
        name: Some(name.to_owned()),
        port,
        ..ServicePort::default()
    };
    Service {
        metadata: ObjectMeta {
            name: Some(job.name_any()),
            namespace: job.namespace(),
            labels: Some(job_labels(job)),
            owner_references: Some(vec![owner(job)]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            selector: Some(BTreeMap::from([(JOB_LABEL.to_owned(), job.name_any())])),
            // Nodes register before they are Ready: they must resolve each other.
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![
                port("coordinator", COORDINATOR_PORT),
                port("control", CONTROL_PORT),
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// Name of launch member `index`'s pod.
pub fn pod_name(job: &ElasticJob, index: u32) -> String {
    format!("{}-{index}", job.name_any())
}

/// `host:port` of PE 0's control endpoint (in node 0's pod), as the other
/// pods reach it through the headless Service (their preStop hook).
pub fn control_address(job: &ElasticJob) -> String {
    format!(
        "{}.{}.{}.svc:{CONTROL_PORT}",
        pod_name(job, 0),
        job.name_any(),
        job.namespace().unwrap_or_else(|| "default".to_owned())
    )
}

/// `host:port` of the coordinator (in node 0's pod).
pub fn coordinator_address(job: &ElasticJob) -> String {
    format!(
        "{}.{}.{}.svc:{COORDINATOR_PORT}",
        pod_name(job, 0),
        job.name_any(),
        job.namespace().unwrap_or_else(|| "default".to_owned())
    )
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn secret_mount() -> VolumeMount {
    VolumeMount {
        name: "ductile-secret".to_owned(),
        mount_path: SECRET_DIR.to_owned(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

/// Launch member `index`'s pod: the template's first container with the
/// contract's environment, placed on on-demand capacity for the first
/// `onDemand.replicas` members and on spot capacity after; node 0's pod
/// also runs the coordinator.
pub fn launch_pod(job: &ElasticJob, index: u32, settings: &ObjectSettings) -> Pod {
    node_pod(job, NodeRole::Launch(index), settings)
}

/// A newcomer's pod, named by the policy (`{job}-n{k}`): a node that
/// registers with the coordinator and waits until a rescale admits it.
/// Newcomers always run on spot capacity (the on-demand part is fixed at
/// launch); `replaces` names the at-risk member it was launched for.
pub fn newcomer_pod(job: &ElasticJob, name: &str, replaces: Option<&str>) -> Pod {
    let mut pod = node_pod(
        job,
        NodeRole::Newcomer(name.to_owned()),
        &ObjectSettings::default(),
    );
    if let Some(member) = replaces {
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(REPLACES_ANNOTATION.to_owned(), member.to_owned());
    }
    pod
}

/// Which kind of node a pod runs.
enum NodeRole {
    /// A launch member with its launch index.
    Launch(u32),
    /// A newcomer with its pod name.
    Newcomer(String),
}

fn node_pod(job: &ElasticJob, role: NodeRole, settings: &ObjectSettings) -> Pod {
    let spec = &job.spec;
    let (name, index) = match &role {
        NodeRole::Launch(index) => (pod_name(job, *index), Some(*index)),
        NodeRole::Newcomer(name) => (name.clone(), None),
    };
    let on_demand = index.is_some_and(|i| i64::from(i) < i64::from(spec.on_demand_replicas()));
    let (capacity, placement) = if on_demand {
        (CapacityType::OnDemand, spec.on_demand_placement())
    } else {
        (CapacityType::Spot, spec.spot_placement())
    };
    let root = index == Some(0);
    let mut pod_spec: PodSpec = spec.template.spec.clone().unwrap_or_default();

    let secret_file = format!("{SECRET_DIR}/{SECRET_KEY}");
    let role_name = if index.is_some() {
        contract::ROLE_LAUNCH
    } else {
        contract::ROLE_NEWCOMER
    };
    let mut contract_env = vec![
        env(contract::ENV_COORDINATOR, coordinator_address(job)),
        env(contract::ENV_SECRET_FILE, secret_file.clone()),
        env(contract::ENV_ROLE, role_name),
    ];
    if let Some(index) = index {
        contract_env.push(env(contract::ENV_LAUNCH_INDEX, index.to_string()));
    }
    contract_env.extend([
        env(contract::ENV_PES, spec.pes_per_pod.to_string()),
        env(contract::ENV_BIND, "0.0.0.0"),
        env(contract::ENV_TRANSPORT, "tcp"),
        EnvVar {
            name: contract::ENV_ADVERTISE.to_owned(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.podIP".to_owned(),
                    api_version: None,
                }),
                ..EnvVarSource::default()
            }),
        },
    ]);
    if root {
        contract_env.push(env(
            contract::ENV_CONTROL,
            format!("0.0.0.0:{CONTROL_PORT}"),
        ));
    }
    let metrics_port = spec.metrics.as_ref().map(|m| m.port);
    if let Some(port) = metrics_port {
        // Every node serves its metrics: node 0 the rescales, each node its
        // GPUs (a newcomer's start-up before it is admitted).
        contract_env.push(env(contract::ENV_METRICS, format!("0.0.0.0:{port}")));
    }
    if let Some(node) = pod_spec.containers.first_mut() {
        let mut merged = contract_env;
        // The user's variables win, except for the contract's own names.
        for var in node.env.take().unwrap_or_default() {
            if !merged.iter().any(|v| v.name == var.name) {
                merged.push(var);
            }
        }
        node.env = Some(merged);
        if let Some(every) = spec.checkpoint_every() {
            // Appended to the arguments: after `command`, or after the
            // image's entrypoint when the template gives `args` only.
            node.args
                .get_or_insert_with(Vec::new)
                .extend([contract::FT_EVERY_FLAG.to_owned(), every.to_string()]);
        }
        node.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(secret_mount());
        if root {
            node.ports.get_or_insert_with(Vec::new).push(ContainerPort {
                name: Some("control".to_owned()),
                container_port: CONTROL_PORT,
                ..ContainerPort::default()
            });
        }
        if let Some(port) = metrics_port {
            node.ports.get_or_insert_with(Vec::new).push(ContainerPort {
                name: Some("metrics".to_owned()),
                container_port: port,
                ..ContainerPort::default()
            });
        }
    }
    if !on_demand {
        leave_before_stopping(job, &mut pod_spec);
    }
    let node_container = pod_spec.containers.first().map(|c| c.name.clone());
    if root {
        let coordinator = spec.coordinator.clone().unwrap_or_default();
        pod_spec.containers.insert(
            0,
            Container {
                name: COORDINATOR_CONTAINER.to_owned(),
                image: Some(settings.coordinator_image.clone()),
                args: Some(vec![
                    "coordinator".to_owned(),
                    "--listen".to_owned(),
                    format!("0.0.0.0:{COORDINATOR_PORT}"),
                    "--expect".to_owned(),
                    spec.launch_replicas().to_string(),
                    "--secret-file".to_owned(),
                    secret_file,
                    "--launch-timeout".to_owned(),
                    settings.launch_timeout_s.to_string(),
                ]),
                ports: Some(vec![ContainerPort {
                    name: Some("coordinator".to_owned()),
                    container_port: COORDINATOR_PORT,
                    ..ContainerPort::default()
                }]),
                volume_mounts: Some(vec![secret_mount()]),
                resources: Some(
                    coordinator
                        .resources
                        .clone()
                        .unwrap_or_else(default_coordinator_resources),
                ),
                security_context: Some(
                    coordinator
                        .security_context
                        .clone()
                        .unwrap_or_else(restricted_security_context),
                ),
                ..Container::default()
            },
        );
    }
    pod_spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: "ductile-secret".to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret_name(job)),
            items: Some(vec![k8s_openapi::api::core::v1::KeyToPath {
                key: secret_key(job),
                path: SECRET_KEY.to_owned(),
                mode: None,
            }]),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    });
    // A node is never restarted in place: a process that ends has left the job.
    pod_spec.restart_policy = Some("Never".to_owned());
    pod_spec.hostname = Some(name.clone());
    pod_spec.subdomain = Some(job.name_any());
    if let Some(selector) = placement.node_selector.clone() {
        pod_spec
            .node_selector
            .get_or_insert_with(BTreeMap::new)
            .extend(selector);
    }
    pod_spec.affinity = placement.effective_affinity(pod_spec.affinity.as_ref(), capacity);
    if let Some(tolerations) = placement.tolerations.clone() {
        pod_spec
            .tolerations
            .get_or_insert_with(Vec::new)
            .extend(tolerations);
    }

    let template_meta = spec.template.metadata.clone().unwrap_or_default();
    let mut labels = template_meta.labels.unwrap_or_default();
    labels.extend(job_labels(job));
    if let Some(index) = index {
        labels.insert(LAUNCH_INDEX_LABEL.to_owned(), index.to_string());
    }
    labels.insert(
        CAPACITY_LABEL.to_owned(),
        if on_demand { "on-demand" } else { "spot" }.to_owned(),
    );
    labels.insert(ROLE_LABEL.to_owned(), role_name.to_owned());
    let mut annotations = template_meta.annotations;
    {
        let a = annotations.get_or_insert_with(BTreeMap::new);
        if let Some(node) = node_container {
            a.entry(DEFAULT_CONTAINER.to_owned()).or_insert(node);
        }
        if on_demand {
            // Never chosen for removal, so never to be evicted voluntarily
            // either: Karpenter and the Cluster Autoscaler leave the node be.
            a.insert(KARPENTER_DO_NOT_DISRUPT.to_owned(), "true".to_owned());
            a.insert(SAFE_TO_EVICT.to_owned(), "false".to_owned());
        }
    }
    if let Some(port) = metrics_port {
        // The convention of Prometheus's Kubernetes pod discovery (the
        // `prometheus.io/*` relabelling of its example configuration); the
        // template's own values win.
        let a = annotations.get_or_insert_with(BTreeMap::new);
        for (key, value) in [
            ("prometheus.io/scrape", "true".to_owned()),
            ("prometheus.io/port", port.to_string()),
            ("prometheus.io/path", "/metrics".to_owned()),
        ] {
            a.entry(key.to_owned()).or_insert(value);
        }
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: job.namespace(),
            labels: Some(labels),
            annotations,
            owner_references: Some(vec![owner(job)]),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

/// The coordinator's resources when the spec gives none: requests equal to
/// limits (see [`crate::crd::CoordinatorSpec`]).
pub fn default_coordinator_resources() -> ResourceRequirements {
    let amounts = BTreeMap::from([
        ("cpu".to_owned(), Quantity("100m".to_owned())),
        ("memory".to_owned(), Quantity("128Mi".to_owned())),
    ]);
    ResourceRequirements {
        requests: Some(amounts.clone()),
        limits: Some(amounts),
        ..ResourceRequirements::default()
    }
}

/// A container security context that the `restricted` Pod Security
/// profile admits.
pub fn restricted_security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: None,
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    }
}

/// Name of the job's PodDisruptionBudget.
pub fn pdb_name(job: &ElasticJob) -> String {
    format!("{}-on-demand", job.name_any())
}

/// The PodDisruptionBudget that forbids voluntary evictions (drains,
/// consolidation) of the job's on-demand pods, node 0 among them: the job
/// has no other root. Spot pods are not covered: they leave through a
/// rescale when evicted (their preStop hook).
pub fn on_demand_pdb(job: &ElasticJob) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(pdb_name(job)),
            namespace: job.namespace(),
            labels: Some(job_labels(job)),
            owner_references: Some(vec![owner(job)]),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(0)),
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([
                    (JOB_LABEL.to_owned(), job.name_any()),
                    (CAPACITY_LABEL.to_owned(), "on-demand".to_owned()),
                ])),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

/// Name of the job's NetworkPolicy.
pub fn network_policy_name(job: &ElasticJob) -> String {
    format!("{}-nodes", job.name_any())
}

/// The NetworkPolicy of a job's pods: the job's own pods reach each other
/// on every port (the coordinator, the control endpoint, the nodes'
/// links); pods of the operator's namespace reach the control endpoint
/// (status, rescales); anyone reaches the metrics port, when there is one;
/// nothing else gets in.
pub fn job_network_policy(job: &ElasticJob, operator_namespace: &str) -> NetworkPolicy {
    let job_pods = LabelSelector {
        match_labels: Some(BTreeMap::from([(JOB_LABEL.to_owned(), job.name_any())])),
        match_expressions: None,
    };
    let tcp = |port: i32| NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".to_owned()),
        end_port: None,
    };
    let mut ingress = vec![
        NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                pod_selector: Some(job_pods.clone()),
                ..NetworkPolicyPeer::default()
            }]),
            ports: None,
        },
        NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        "kubernetes.io/metadata.name".to_owned(),
                        operator_namespace.to_owned(),
                    )])),
                    match_expressions: None,
                }),
                ..NetworkPolicyPeer::default()
            }]),
            ports: Some(vec![tcp(CONTROL_PORT)]),
        },
    ];
    if let Some(metrics) = &job.spec.metrics {
        ingress.push(NetworkPolicyIngressRule {
            from: None,
            ports: Some(vec![tcp(metrics.port)]),
        });
    }
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(network_policy_name(job)),
            namespace: job.namespace(),
            labels: Some(job_labels(job)),
            owner_references: Some(vec![owner(job)]),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(job_pods),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(ingress),
            egress: None,
        }),
    }
}

/// A spot pod that is deleted leaves the job first (see
/// [`crate::contract`]): its grace period is the interruption deadline
/// (unless the template sets one) and its node container's preStop hook
/// waits until the node has left the view (unless the template brings its
/// own hook).
fn leave_before_stopping(job: &ElasticJob, pod_spec: &mut PodSpec) {
    let grace = *pod_spec
        .termination_grace_period_seconds
        .get_or_insert(i64::from(
            job.spec.rescale_policy().interruption_deadline_seconds,
        ));
    let Some(command) = contract::wait_left_command(&control_address(job), grace) else {
        return;
    };
    let Some(node) = pod_spec.containers.first_mut() else {
        return;
    };
    let lifecycle = node.lifecycle.get_or_insert_with(Lifecycle::default);
    if lifecycle.pre_stop.is_none() {
        lifecycle.pre_stop = Some(LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(command),
            }),
            ..LifecycleHandler::default()
        });
    }
}

/// Whether a pod runs on on-demand capacity (its capacity label).
pub fn is_on_demand(pod: &Pod) -> bool {
    pod.labels().get(CAPACITY_LABEL).map(String::as_str) == Some("on-demand")
}

/// Whether `job` is being deleted.
pub fn is_deleting(job: &ElasticJob) -> bool {
    job.meta().deletion_timestamp.is_some()
}
