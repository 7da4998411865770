//! Least privilege, derived from the code: every request the mock-API
//! scenarios see (the reconcile scenarios of `tests.rs`, the leader
//! election tests, the controllers' watches, an Event series) is recorded
//! as (API group, resource, verb), and the chart's rules must grant exactly
//! those, no verb missing and none extra. The install bundle's rules must be
//! the chart's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode, Uri};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};

use super::*;

/// One kind of call: API group ("" for the core group), resource (with its
/// subresource, `elasticjobs/status`), verb, and whether it named a
/// namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Call {
    pub(crate) group: String,
    pub(crate) resource: String,
    pub(crate) verb: String,
    pub(crate) namespaced: bool,
}

static CALLS: Mutex<BTreeSet<Call>> = Mutex::new(BTreeSet::new());

/// Records one request a mock API server answered.
pub(crate) fn record(method: &Method, uri: &Uri) {
    if let Some(call) = call_of(method, uri) {
        CALLS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(call);
    }
}

/// Records what an answer adds to a request's verb: a server-side apply
/// (PATCH) answered 201 Created made the object, which the API server
/// authorizes as `create` as well as `patch`.
pub(crate) fn record_answer(method: &Method, uri: &Uri, status: StatusCode) {
    if method == Method::PATCH && status == StatusCode::CREATED {
        if let Some(call) = call_of(method, uri) {
            CALLS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(Call {
                    verb: "create".to_owned(),
                    ..call
                });
        }
    }
}

/// The RBAC verb of a request, as the API server's authorizer names it.
pub(crate) fn call_of(method: &Method, uri: &Uri) -> Option<Call> {
    let parts: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespaced, rest) = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => (true, rest),
        rest => (false, rest),
    };
    let (resource, named) = match rest {
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => return None,
    };
    let watch = uri
        .query()
        .unwrap_or("")
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method.as_str(), named) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some(Call {
        group: group.to_owned(),
        resource,
        verb: verb.to_owned(),
        namespaced,
    })
}

#[test]
fn requests_map_to_the_verbs_the_authorizer_checks() {
    let call = |m: Method, u: &str| {
        let c = call_of(&m, &u.parse().unwrap()).unwrap();
        format!("{}:{}:{}:{}", c.group, c.resource, c.verb, c.namespaced)
    };
    assert_eq!(call(Method::GET, "/api/v1/nodes?limit=500"), ":nodes:list:false");
    assert_eq!(
        call(Method::GET, "/api/v1/nodes?watch=true&resourceVersion=1"),
        ":nodes:watch:false"
    );
    assert_eq!(
        call(Method::GET, "/api/v1/namespaces/hpc/secrets/s"),
        ":secrets:get:true"
    );
    assert_eq!(
        call(Method::DELETE, "/api/v1/namespaces/hpc/pods?labelSelector=x"),
        ":pods:deletecollection:true"
    );
    assert_eq!(
        call(
            Method::PATCH,
            "/apis/ductile.dev/v1alpha1/namespaces/hpc/elasticjobs/j/status"
        ),
        "ductile.dev:elasticjobs/status:patch:true"
    );
    assert_eq!(
        call(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/o/leases/l"
        ),
        "coordination.k8s.io:leases:update:true"
    );
    assert_eq!(
        call(Method::GET, "/apis/ductile.dev/v1alpha1/elasticjobs?watch=1"),
        "ductile.dev:elasticjobs:watch:false"
    );
}

/// (group, resource, verb) a rule list grants, from the YAML of one of the
/// chart's named rule templates (`{{- define "NAME" -}}` ... `{{- end -}}`).
fn chart_rules(name: &str) -> BTreeSet<(String, String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/ductile/templates/rbac.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = format!("{{{{- define \"{name}\" -}}}}");
    let body = text
        .split_once(&start)
        .unwrap_or_else(|| panic!("{} defines no {name}", path.display()))
        .1
        .split_once("{{- end -}}")
        .expect("the define ends")
        .0;
    assert!(
        !body.contains("{{"),
        "{name}: rule bodies stay plain YAML (no template actions)"
    );
    let rules: Vec<Value> = serde_yaml::from_str(body).unwrap();
    grants(&rules)
}

fn grants(rules: &[Value]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in rules {
        let list = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .unwrap_or_else(|| panic!("rule without {key}: {rule}"))
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect()
        };
        for group in list("apiGroups") {
            for resource in list("resources") {
                for verb in list("verbs") {
                    assert!(
                        group != "*" && resource != "*" && verb != "*",
                        "wildcard in {rule}"
                    );
                    out.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    out
}

/// Grants no scenario can show because no call makes them, each with why.
const GRANTED_WITHOUT_A_CALL: &[(&str, &str, &str, &str)] = &[(
    "ductile.dev",
    "elasticjobs/finalizers",
    "update",
    "owner references with blockOwnerDeletion need it under OwnerReferencesPermissionEnforcement",
)];

/// The controllers' list and watch requests: `run` against a mock API
/// server that answers every list with nothing and holds every watch open,
/// until no request has come for two seconds. Returns the calls, the node
/// watches and the pod lists.
async fn watch_requests(namespaces: Vec<String>) -> (BTreeSet<Call>, usize, usize) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controllers = tokio::spawn(run(
        client,
        namespaces,
        ObjectSettings::default(),
        Arc::new(super::super::metrics::Metrics::default()),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut seen = BTreeSet::new();
    let mut held = Vec::new();
    let mut node_watches = 0;
    let mut pod_lists = 0;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < give_up {
        let next = tokio::time::timeout(Duration::from_secs(2), handle.next_request()).await;
        let Ok(Some((request, send))) = next else {
            break;
        };
        let (method, uri) = (request.method().clone(), request.uri().clone());
        record(&method, &uri);
        let call = call_of(&method, &uri).unwrap_or_else(|| panic!("unexpected {method} {uri}"));
        if call.verb == "watch" && call.resource == "nodes" {
            node_watches += 1;
        }
        if call.verb == "list" && call.resource == "pods" {
            pod_lists += 1;
        }
        if call.verb == "watch" {
            // Held open: a watch that ends is restarted at once.
            held.push(send);
        } else {
            let body = json!({"apiVersion": "v1", "kind": "List",
                "metadata": {"resourceVersion": "1"}, "items": []});
            send.send_response(
                Response::builder()
                    .status(StatusCode::OK)
                    .body(Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap(),
            );
        }
        seen.insert(call);
    }
    let _ = stop.send(());
    drop(held);
    drop(handle);
    let _ = tokio::time::timeout(Duration::from_secs(5), controllers).await;
    (seen, node_watches, pod_lists)
}

#[test]
fn the_rbac_grants_exactly_the_verbs_the_scenarios_use() {
    // Every scenario that plays the API server, run here so that the
    // calls are recorded whatever the test order.
    let scenarios: &[(&str, fn())] = &[
        ("first_apply", super::first_apply_creates_the_on_demand_and_spot_objects),
        ("invalid_spec", super::an_invalid_spec_is_reported_in_a_condition_and_changes_nothing),
        ("taint", super::a_taint_triggers_a_replacement),
        ("background_rescale", super::a_rescale_runs_in_the_background_and_its_commit_deletes_vacated_pods_and_patches_status),
        ("emergency", super::an_interruption_notice_with_no_replacement_shrinks_at_once_and_a_refusal_is_retried),
        ("cancel", super::a_lowered_replicas_cancels_a_newcomer_not_yet_admitted),
        ("spec_change", super::a_spec_change_to_the_rescale_policy_takes_effect_without_a_restart),
        ("suspended", super::a_suspended_job_is_not_launched),
        ("suspend_resume", super::suspending_a_running_job_deletes_its_pods_and_resuming_relaunches_it),
        ("deleted_root", super::a_deleted_node_zero_pod_fails_the_job_and_relaunches_it),
        ("relaunch", super::a_failed_job_is_relaunched_until_the_backoff_limit_then_failed),
        ("never", super::a_failed_job_under_restart_policy_never_is_failed_at_once),
        ("finalizer", super::deletion_runs_the_finalizer),
        ("event_series", super::a_repeated_event_is_patched_into_a_series),
        ("unschedulable", super::a_pod_the_scheduler_cannot_place_is_reported_in_a_condition),
        ("partial_launch", super::a_partial_launch_starts_with_min_replicas_and_grows_as_newcomers_arrive),
        ("network_policy", super::with_network_policies_every_job_gets_one),
        ("deadline_ttl", super::an_active_deadline_fails_the_job_and_its_ttl_deletes_it),
        ("lease_created", super::super::leader::tests::a_missing_lease_is_created_and_held),
        ("lease_taken_over", super::super::leader::tests::an_expired_lease_is_taken_over_with_its_resource_version),
        ("lease_race", super::super::leader::tests::losing_the_race_for_a_lease_is_not_an_error),
        ("lease_released", super::super::leader::tests::stopping_releases_the_lease_it_holds),
    ];
    for (name, scenario) in scenarios {
        if std::panic::catch_unwind(scenario).is_err() {
            panic!("scenario {name} failed (its own test says why)");
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (all, node_watches, pod_lists) = runtime.block_on(watch_requests(Vec::new()));
    let (scoped, scoped_node_watches, scoped_pod_lists) =
        runtime.block_on(watch_requests(vec!["hpc".to_owned(), "ml".to_owned()]));
    // One node watch feeds the taint store and every controller's trigger.
    assert_eq!((node_watches, scoped_node_watches), (1, 1));
    // Pods are listed once per scope, at the start, by the reflector that
    // keeps the pod cache (a reconcile reads the cache: the scenarios see
    // no pod LIST at all).
    assert_eq!((pod_lists, scoped_pod_lists), (1, 2));
    drop(runtime);

    // With watchNamespaces, nothing but nodes is asked for cluster-wide:
    // namespaced Roles are enough.
    let cluster_wide: Vec<&Call> = scoped
        .iter()
        .filter(|c| !c.namespaced && c.resource != "nodes")
        .collect();
    assert!(cluster_wide.is_empty(), "cluster-wide calls with watchNamespaces: {cluster_wide:?}");
    for resource in ["elasticjobs", "pods", "services", "nodes"] {
        for calls in [&all, &scoped] {
            assert!(
                calls.iter().any(|c| c.resource == resource && c.verb == "watch"),
                "the controllers never watched {resource}: {calls:?}"
            );
        }
    }

    let calls = CALLS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut used: BTreeMap<&str, BTreeSet<(String, String, String)>> = BTreeMap::new();
    for call in &calls {
        let set = match (call.group.as_str(), call.resource.as_str()) {
            ("", "nodes") => "ductile.nodeRules",
            ("coordination.k8s.io", "leases") => "ductile.leaseRules",
            ("networking.k8s.io", "networkpolicies") => "ductile.networkPolicyRules",
            _ => "ductile.jobRules",
        };
        used.entry(set).or_default().insert((
            call.group.clone(),
            call.resource.clone(),
            call.verb.clone(),
        ));
    }
    let mut problems = Vec::new();
    for set in [
        "ductile.nodeRules",
        "ductile.jobRules",
        "ductile.leaseRules",
        "ductile.networkPolicyRules",
    ] {
        let granted = chart_rules(set);
        let needed = used.remove(set).unwrap_or_default();
        for call in needed.difference(&granted) {
            problems.push(format!("{set} lacks {call:?}, which the code calls"));
        }
        for grant in granted.difference(&needed) {
            let explained = GRANTED_WITHOUT_A_CALL
                .iter()
                .any(|(g, r, v, _)| (*g, *r, *v) == (grant.0.as_str(), grant.1.as_str(), grant.2.as_str()));
            if !explained {
                problems.push(format!("{set} grants {grant:?}, which no scenario calls"));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The install bundle grants what the chart grants with its defaults.
#[test]
fn the_install_bundle_grants_what_the_chart_grants() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/install.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let rules_of = |kind: &str, name: &str| -> BTreeSet<(String, String, String)> {
        let doc = docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("install.yaml has no {kind} {name}"));
        grants(doc["rules"].as_array().unwrap())
    };
    assert_eq!(rules_of("ClusterRole", "ductile-nodes"), chart_rules("ductile.nodeRules"));
    assert_eq!(rules_of("ClusterRole", "ductile-jobs"), chart_rules("ductile.jobRules"));
    assert_eq!(
        rules_of("Role", "ductile-leader-election"),
        chart_rules("ductile.leaseRules")
    );
    let roles = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        .count();
    assert_eq!(roles, 3, "no other role in the bundle");
}
