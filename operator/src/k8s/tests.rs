//! Reconcile scenarios against a mock API server (the kube-rs `tower_test`
//! pattern): the test plays the API server, checking each request the
//! reconciler makes, in order, and answering it ([`reconcile_against`]:
//! a request after the script's last is an error). PE 0's control endpoint
//! is a fake job behind a real `serve_connection` server on loopback.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::context::JobRuntime;
use super::objects::{self, ObjectSettings};
use super::*;
use crate::crd::ElasticJob;
use crate::policy::{Capacity, Decision, Event};
use ductile_coordinator::control::{JobStatus, RescaleReport, RescaleRequest};
use ductile_coordinator::Secret;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::Client;
use serde_json::json;
use ductile_coordinator::control::{serve_connection, ControlReply, ControlRequest, StageTime};
use ductile_coordinator::proto::{Member, PendingNewcomer};
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use kube::runtime::reflector::store::Writer;
use serde_json::Value;
use std::future::Future;
use std::net::TcpListener;
use std::sync::Condvar;

pub(super) mod rbac;

type ApiServerHandle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

const FINALIZERS: &str = "ductile.dev/teardown";
const JOB_STATUS_PATH: &str = "/apis/ductile.dev/v1alpha1/namespaces/hpc/elasticjobs/jacobi/status";
const JOB_PATH: &str = "/apis/ductile.dev/v1alpha1/namespaces/hpc/elasticjobs/jacobi";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/hpc/events";
const NS: &str = "/api/v1/namespaces/hpc";

fn job_json(spec: Value) -> Value {
    json!({
        "apiVersion": "ductile.dev/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": "jacobi", "namespace": "hpc", "uid": "u-1", "generation": 1},
        "spec": spec,
    })
}

fn job(spec: Value) -> ElasticJob {
    serde_json::from_value(job_json(spec)).unwrap()
}

/// The job as the API server shows it once the finalizer is on.
fn managed_job_json(spec: Value) -> Value {
    let mut value = job_json(spec);
    value["metadata"]["finalizers"] = json!([FINALIZERS]);
    value
}

fn managed_job(spec: Value) -> ElasticJob {
    serde_json::from_value(managed_job_json(spec)).unwrap()
}

fn valid_spec() -> Value {
    json!({
        "replicas": 3,
        "pesPerPod": 2,
        "template": {"spec": {"containers": [{"name": "node", "image": "apps:1", "command": ["jacobi2d"]}]}},
    })
}

struct Harness {
    ctx: Arc<Context>,
    nodes: Writer<Node>,
}

fn context() -> (Harness, ApiServerHandle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (store, writer) = reflector::store::<Node>();
    let (pod_store, pod_writer) = reflector::store::<Pod>();
    POD_FEED.with(|feed| *feed.borrow_mut() = Some(pod_writer));
    let mut ctx = Context::new(
        Client::new(service, "default"),
        ObjectSettings::default(),
        store,
        PodCache::new(vec![(None, pod_store)]).with_ready_timeout(Duration::from_secs(5)),
    );
    // A fixed clock: virtual time stands still within a scenario.
    ctx.clock = Arc::new(|| "2025-06-01T12:00:00Z".parse().unwrap());
    (
        Harness {
            ctx: Arc::new(ctx),
            nodes: writer,
        },
        handle,
    )
}

impl Harness {
    fn with_control(mut self, port: u16) -> Self {
        Arc::get_mut(&mut self.ctx)
            .expect("not shared yet")
            .control_port = port;
        self
    }

    fn node(&mut self, name: &str, taints: Value) {
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"taints": taints}}))
                .unwrap();
        self.nodes.apply_watcher_event(&watcher::Event::Apply(node));
    }
}

/// One expected request: its method and path; `reply` answers from the
/// JSON body it carried, which is returned.
async fn expect(
    handle: &mut ApiServerHandle,
    method: Method,
    path: &str,
    reply: impl FnOnce(&Value) -> (StatusCode, Value),
) -> Value {
    expect_query(handle, method, path, |_| {}, reply).await
}

async fn expect_query(
    handle: &mut ApiServerHandle,
    method: Method,
    path: &str,
    check_query: impl FnOnce(&str),
    reply: impl FnOnce(&Value) -> (StatusCode, Value),
) -> Value {
    let (request, send) = handle
        .next_request()
        .await
        .unwrap_or_else(|| panic!("expected {method} {path}, the reconciler stopped"));
    rbac::record(request.method(), request.uri());
    assert_eq!(request.method(), method, "request for {}", request.uri());
    assert_eq!(request.uri().path(), path);
    check_query(request.uri().query().unwrap_or(""));
    let uri = request.uri().clone();
    let body = request.into_body().collect_bytes().await.unwrap();
    let body = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap()
    };
    let (status, reply) = reply(&body);
    rbac::record_answer(&method, &uri, status);
    send.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&reply).unwrap()))
            .unwrap(),
    );
    body
}

/// One reconcile of `job` while `script` plays the API server. A request
/// the script did not expect (one too many) is answered by nobody, which
/// fails the reconcile and the test with its method and path. Returns the
/// reconcile's result, the handle for the next reconcile, and what the
/// script returned.
async fn reconcile_against<T, F, Fut>(
    ctx: &Arc<Context>,
    job: &Value,
    handle: ApiServerHandle,
    script: F,
) -> (Result<Action>, ApiServerHandle, T)
where
    F: FnOnce(ApiServerHandle) -> Fut,
    Fut: Future<Output = (ApiServerHandle, T)> + Send + 'static,
    T: Send + 'static,
{
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let scripted = script(handle);
    let server = tokio::spawn(async move {
        let (mut handle, out) = scripted.await;
        let mut extra = Vec::new();
        loop {
            tokio::select! {
                _ = &mut stopped => return (handle, out, extra),
                next = handle.next_request() => match next {
                    Some((request, _unanswered)) => {
                        extra.push(format!("{} {}", request.method(), request.uri()));
                    }
                    None => return (handle, out, extra),
                },
            }
        }
    });
    let job: ElasticJob = serde_json::from_value(job.clone()).unwrap();
    let result = reconcile(Arc::new(job), ctx.clone()).await;
    let _ = stop.send(());
    let (handle, out, extra) = server.await.expect("the script panicked");
    assert!(
        extra.is_empty(),
        "requests the scenario did not expect: {extra:?}"
    );
    (result, handle, out)
}

/// The requests every reconcile of a valid, managed job starts with: the
/// job secret (only while the operator does not know it yet), the headless
/// Service and node 0's PodDisruptionBudget; the pod cache holds `pods`
/// (no request: a reconcile never lists pods).
async fn expect_objects(handle: &mut ApiServerHandle, secret: Option<&Secret>, pods: &[Value]) {
    feed_pods(pods);
    if let Some(secret) = secret {
        expect(
            handle,
            Method::GET,
            &format!("{NS}/secrets/jacobi-secret"),
            reply_with(secret_object(secret)),
        )
        .await;
    }
    expect_query(
        handle,
        Method::PATCH,
        &format!("{NS}/services/jacobi"),
        |query| assert!(!query.contains("force"), "the Service is never forced: {query}"),
        echo(StatusCode::OK),
    )
    .await;
    expect_pdb(handle).await;
}

thread_local! {
    /// The pod cache's writer of the scenario running on this thread (a
    /// `#[tokio::test]` runs its tasks, the script too, on its own thread).
    static POD_FEED: std::cell::RefCell<Option<Writer<Pod>>> = const { std::cell::RefCell::new(None) };
}

/// Puts `pods` in the pod cache, as the reflector's list would: exactly
/// these, and the cache is ready. A scenario feeds it before the request
/// the reconcile reads the cache after is answered; the mock API server
/// never sees a pod LIST.
fn feed_pods(pods: &[Value]) {
    POD_FEED.with(|feed| {
        let mut feed = feed.borrow_mut();
        let writer = feed.as_mut().expect("context() made the pod cache");
        writer.apply_watcher_event(&watcher::Event::Init);
        for pod in pods {
            let pod: Pod = serde_json::from_value(pod.clone()).unwrap();
            writer.apply_watcher_event(&watcher::Event::InitApply(pod));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
    });
}

/// Expects a pod created by server-side apply (PATCH of the pod's own path
/// with the operator's field manager, not forced) and answers with the pod.
async fn expect_pod_apply(handle: &mut ApiServerHandle) -> Value {
    let (request, send) = handle
        .next_request()
        .await
        .unwrap_or_else(|| panic!("expected a pod apply, the reconciler stopped"));
    rbac::record(request.method(), request.uri());
    assert_eq!(request.method(), Method::PATCH, "request for {}", request.uri());
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    assert!(query.contains("fieldManager=ductile-operator"), "{query}");
    assert!(!query.contains("force"), "a pod is never force-applied: {query}");
    assert_eq!(
        request.headers()["content-type"],
        "application/apply-patch+yaml",
        "server-side apply"
    );
    let body = request.into_body().collect_bytes().await.unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap();
    let name = body["metadata"]["name"].as_str().expect("the pod is named");
    assert_eq!(path, format!("{NS}/pods/{name}"));
    assert_eq!((body["apiVersion"].as_str(), body["kind"].as_str()), (Some("v1"), Some("Pod")));
    rbac::record_answer(&Method::PATCH, &path.parse().unwrap(), StatusCode::CREATED);
    send.send_response(
        Response::builder()
            .status(StatusCode::CREATED)
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
    body
}

/// Expects node 0's PodDisruptionBudget (server-side apply, not forced) and
/// checks what it protects.
async fn expect_pdb(handle: &mut ApiServerHandle) {
    expect_pdb_answered(handle, StatusCode::OK).await;
}

/// [`expect_pdb`] answered with `status` (201: the apply created it).
async fn expect_pdb_answered(handle: &mut ApiServerHandle, status: StatusCode) {
    let pdb = expect_query(
        handle,
        Method::PATCH,
        "/apis/policy/v1/namespaces/hpc/poddisruptionbudgets/jacobi-on-demand",
        |query| {
            assert!(query.contains("fieldManager=ductile-operator"), "{query}");
            assert!(!query.contains("force"), "{query}");
        },
        echo(status),
    )
    .await;
    assert_eq!(pdb["spec"]["maxUnavailable"], 0);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        json!({"ductile.dev/job": "jacobi", "ductile.dev/capacity": "on-demand"})
    );
    assert_eq!(pdb["metadata"]["ownerReferences"][0]["name"], "jacobi");
}

/// Expects the status patch and answers with `job` carrying it; returns the
/// patch's `status`.
async fn expect_status(handle: &mut ApiServerHandle, job: &Value) -> Value {
    let patch = expect(
        handle,
        Method::PATCH,
        JOB_STATUS_PATH,
        job_with_status(job.clone()),
    )
    .await;
    patch["status"].clone()
}

/// Expects the deletion of every pod of the job, by label.
async fn expect_pods_deleted(handle: &mut ApiServerHandle) {
    expect_query(
        handle,
        Method::DELETE,
        &format!("{NS}/pods"),
        |query| {
            assert!(
                query.contains("labelSelector=ductile.dev%2Fjob%3Djacobi"),
                "{query}"
            )
        },
        reply_with(pod_list(&[])),
    )
    .await;
}

fn not_found(_: &Value) -> (StatusCode, Value) {
    (
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found", "metadata": {}}),
    )
}

/// Reply with the object the request carried, as the API server would.
fn echo(status: StatusCode) -> impl FnOnce(&Value) -> (StatusCode, Value) {
    move |body| (status, body.clone())
}

fn reply_with(value: Value) -> impl FnOnce(&Value) -> (StatusCode, Value) {
    move |_| (StatusCode::OK, value)
}

/// Reply to a status patch with the whole ElasticJob carrying that status.
fn job_with_status(job: Value) -> impl FnOnce(&Value) -> (StatusCode, Value) {
    move |body| {
        let mut full = job;
        full["status"] = body["status"].clone();
        (StatusCode::OK, full)
    }
}

/// Expects one Event and returns (reason, note).
async fn expect_event(handle: &mut ApiServerHandle) -> (String, String) {
    let event = expect(handle, Method::POST, EVENTS_PATH, echo(StatusCode::CREATED)).await;
    assert_eq!(event["regarding"]["name"], "jacobi");
    assert_eq!(event["reportingController"], "ductile-operator");
    (
        event["reason"].as_str().unwrap().to_owned(),
        event["note"].as_str().unwrap_or("").to_owned(),
    )
}

fn node_affinity_values(pod: &Value) -> Vec<String> {
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t["matchExpressions"][0]["values"][0]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

fn env_of(container: &Value, name: &str) -> Option<String> {
    container["env"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == name)
        .and_then(|v| v["value"].as_str().map(str::to_owned))
}

#[tokio::test]
async fn first_apply_creates_the_on_demand_and_spot_objects() {
    let (harness, handle) = context();
    let ctx = harness.ctx.clone();

    // A new ElasticJob first gets the finalizer, and nothing else.
    let (action, handle, patch) = reconcile_against(
        &ctx,
        &job_json(valid_spec()),
        handle,
        |mut handle| async move {
            let patch = expect(
                &mut handle,
                Method::PATCH,
                JOB_PATH,
                reply_with(managed_job_json(valid_spec())),
            )
            .await;
            (handle, patch)
        },
    )
    .await;
    assert_eq!(action.expect("reconcile succeeds"), Action::await_change());
    assert!(
        patch
            .as_array()
            .unwrap()
            .iter()
            .any(|op| op["op"] == "add" && op["value"] == json!([FINALIZERS])),
        "{patch}"
    );

    let job_value = managed_job_json(valid_spec());
    let (action, _, (pods, status)) =
        reconcile_against(&ctx, &job_value.clone(), handle, |mut handle| async move {
            // No pod yet; the cache has its first list (no pod LIST follows).
            feed_pods(&[]);
            expect(
                &mut handle,
                Method::GET,
                &format!("{NS}/secrets/jacobi-secret"),
                not_found,
            )
            .await;
            let secret = expect(
                &mut handle,
                Method::POST,
                &format!("{NS}/secrets"),
                echo(StatusCode::CREATED),
            )
            .await;
            assert_eq!(secret["metadata"]["name"], "jacobi-secret");
            assert_eq!(secret["metadata"]["ownerReferences"][0]["uid"], "u-1");
            let hex = secret["data"]["secret"].as_str().unwrap();
            assert!(!hex.is_empty());

            // The first apply creates the Service and the budget (201).
            let service = expect(
                &mut handle,
                Method::PATCH,
                &format!("{NS}/services/jacobi"),
                echo(StatusCode::CREATED),
            )
            .await;
            assert_eq!(service["spec"]["clusterIP"], "None");
            assert_eq!(service["spec"]["publishNotReadyAddresses"], true);
            expect_pdb_answered(&mut handle, StatusCode::CREATED).await;
            let mut pods = Vec::new();
            for _ in 0..3 {
                let pod = expect_pod_apply(&mut handle)
                .await;
                pods.push(pod);
            }
            let status = expect_status(&mut handle, &job_value).await;
            (handle, (pods, status))
        })
        .await;
    // activeDeadlineSeconds counts from here.
    assert_eq!(status["startTime"], "2025-06-01T12:00:00Z");
    // Node 0 is not running yet: look again soon for its control endpoint.
    assert_eq!(
        action.expect("reconcile succeeds"),
        Action::requeue(Duration::from_secs(5))
    );

    // Node 0: on-demand, coordinator + node containers, control endpoint.
    let pod0 = &pods[0];
    assert_eq!(pod0["metadata"]["name"], "jacobi-0");
    assert_eq!(
        pod0["metadata"]["labels"]["ductile.dev/capacity"],
        "on-demand"
    );
    assert_eq!(node_affinity_values(pod0), ["ON_DEMAND", "on-demand"]);
    let containers = pod0["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers[0]["name"], "coordinator");
    assert_eq!(containers[0]["args"][0], "coordinator");
    let node0 = &containers[1];
    assert_eq!(node0["name"], "node");
    assert_eq!(env_of(node0, "DUCTILE_LAUNCH_INDEX").as_deref(), Some("0"));
    assert_eq!(
        env_of(node0, "DUCTILE_CONTROL").as_deref(),
        Some("0.0.0.0:7071")
    );
    assert_eq!(
        env_of(node0, "DUCTILE_COORDINATOR").as_deref(),
        Some("jacobi-0.jacobi.hpc.svc:7070")
    );
    assert_eq!(pod0["spec"]["restartPolicy"], "Never");
    // Node 0 never leaves: no hook holds its pod, its grace period is the template's.
    assert!(node0["lifecycle"].is_null(), "{node0}");
    assert!(pod0["spec"]["terminationGracePeriodSeconds"].is_null());

    // Nodes 1 and 2: spot, node container only, same contract, and a preStop
    // hook that waits until the node has left the job.
    for (k, pod) in pods.iter().enumerate().skip(1) {
        assert_eq!(pod["metadata"]["name"], format!("jacobi-{k}"));
        assert_eq!(pod["metadata"]["labels"]["ductile.dev/capacity"], "spot");
        assert_eq!(node_affinity_values(pod), ["SPOT", "spot"]);
        let containers = pod["spec"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1);
        assert_eq!(
            env_of(&containers[0], "DUCTILE_ROLE").as_deref(),
            Some("launch")
        );
        assert_eq!(env_of(&containers[0], "DUCTILE_PES").as_deref(), Some("2"));
        assert_eq!(env_of(&containers[0], "DUCTILE_CONTROL"), None);
        assert_eq!(pod["spec"]["subdomain"], "jacobi");
        assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 120);
        assert_eq!(
            containers[0]["lifecycle"]["preStop"]["exec"]["command"],
            json!([
                "ductile",
                "wait-left",
                "--control",
                "jacobi-0.jacobi.hpc.svc:7071",
                "--timeout",
                "115"
            ])
        );
    }

    assert_eq!(status["phase"], "Launching");
    assert_eq!(status["replicas"], 3);
    assert_eq!(status["selector"], "ductile.dev/job=jacobi");
    assert_eq!(status["conditions"][0]["type"], "SpecValid");
    assert_eq!(status["conditions"][0]["status"], "True");
    assert_eq!(status["conditions"][1]["type"], "Ready");
    assert_eq!(status["conditions"][1]["status"], "False");
    assert_eq!(status["conditions"][1]["observedGeneration"], 1);
}

#[tokio::test]
async fn an_invalid_spec_is_reported_in_a_condition_and_changes_nothing() {
    let (harness, handle) = context();
    let mut spec = valid_spec();
    spec["minReplicas"] = 5.into();
    let job_value = job_json(spec);
    let (action, _, status) = reconcile_against(
        &harness.ctx,
        &job_value.clone(),
        handle,
        |mut handle| async move {
            let status = expect_status(&mut handle, &job_value).await;
            (handle, status)
        },
    )
    .await;
    assert_eq!(
        action.expect("an invalid spec is not an error"),
        Action::await_change()
    );
    let condition = &status["conditions"][0];
    assert_eq!(condition["type"], "SpecValid");
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "InvalidSpec");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("replicas (3) is below minReplicas (5)"),
        "{condition}"
    );
    assert_eq!(condition["observedGeneration"], 1);
}

#[test]
fn objects_follow_user_placement_and_secret_ref() {
    let mut spec = valid_spec();
    spec["secretRef"] = json!({"name": "mine", "key": "hex"});
    spec["spot"] = json!({"nodeSelector": {"pool": "spot-c6gn"}, "tolerations": [{"key": "spot", "operator": "Exists"}]});
    let job = job(spec);
    let pod = objects::launch_pod(&job, 2, &ObjectSettings::default());
    let pod = serde_json::to_value(&pod).unwrap();
    assert_eq!(pod["spec"]["nodeSelector"]["pool"], "spot-c6gn");
    assert_eq!(node_affinity_values(&pod), ["SPOT", "spot"], "a user selector is ANDed with the capacity pinning");
    assert_eq!(pod["spec"]["tolerations"][0]["key"], "spot");
    let volume = &pod["spec"]["volumes"][0]["secret"];
    assert_eq!(volume["secretName"], "mine");
    assert_eq!(volume["items"][0]["key"], "hex");
}

#[test]
fn a_metrics_port_reaches_every_node_as_address_port_and_scrape_annotations() {
    let mut spec = valid_spec();
    spec["metrics"] = json!({"port": 9464});
    spec["template"]["metadata"] = json!({"annotations": {"prometheus.io/path": "/custom"}});
    let with_metrics = job(spec);
    let pods = [
        objects::launch_pod(&with_metrics, 0, &ObjectSettings::default()),
        objects::launch_pod(&with_metrics, 2, &ObjectSettings::default()),
        objects::newcomer_pod(&with_metrics, "jacobi-n0", None),
    ];
    for pod in pods {
        let pod = serde_json::to_value(&pod).unwrap();
        let containers = pod["spec"]["containers"].as_array().unwrap();
        let node = containers.iter().find(|c| c["name"] == "node").unwrap();
        assert_eq!(
            env_of(node, "DUCTILE_METRICS").as_deref(),
            Some("0.0.0.0:9464")
        );
        let ports = node["ports"].as_array().unwrap();
        assert!(
            ports
                .iter()
                .any(|p| p["name"] == "metrics" && p["containerPort"] == 9464),
            "{ports:?}"
        );
        let annotations = &pod["metadata"]["annotations"];
        assert_eq!(annotations["prometheus.io/scrape"], "true");
        assert_eq!(annotations["prometheus.io/port"], "9464");
        assert_eq!(
            annotations["prometheus.io/path"], "/custom",
            "the template's value wins"
        );
    }
    // Without `metrics`, nothing of it.
    let pod = objects::launch_pod(&job(valid_spec()), 0, &ObjectSettings::default());
    let pod = serde_json::to_value(&pod).unwrap();
    let node = &pod["spec"]["containers"][1];
    assert_eq!(env_of(node, "DUCTILE_METRICS"), None);
    let annotations = pod["metadata"]["annotations"].as_object().unwrap();
    assert!(!annotations.contains_key("prometheus.io/scrape"), "{pod}");
    // Node 0 is protected from voluntary disruption; `kubectl logs` shows the node.
    assert_eq!(annotations["karpenter.sh/do-not-disrupt"], "true");
    assert_eq!(annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"], "false");
    assert_eq!(annotations["kubectl.kubernetes.io/default-container"], "node");
    let coordinator = &pod["spec"]["containers"][0];
    assert_eq!(coordinator["resources"]["requests"], coordinator["resources"]["limits"]);
    assert_eq!(coordinator["securityContext"]["runAsNonRoot"], true);
    assert_eq!(coordinator["securityContext"]["capabilities"]["drop"][0], "ALL");
}

#[test]
fn a_template_keeps_its_own_grace_period_and_prestop_hook() {
    let mut spec = valid_spec();
    spec["rescalePolicy"] = json!({"interruptionDeadlineSeconds": 90});
    let pod = |spec: Value| {
        serde_json::to_value(objects::newcomer_pod(&job(spec), "jacobi-n0", None)).unwrap()
    };
    // The deadline sets the grace period; the hook stops 5 s before it.
    let newcomer = pod(spec.clone());
    assert_eq!(newcomer["spec"]["terminationGracePeriodSeconds"], 90);
    assert_eq!(
        newcomer["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][5],
        "85"
    );
    // The template's grace period wins, and the hook follows it.
    spec["template"]["spec"]["terminationGracePeriodSeconds"] = 30.into();
    let newcomer = pod(spec.clone());
    assert_eq!(newcomer["spec"]["terminationGracePeriodSeconds"], 30);
    assert_eq!(
        newcomer["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][5],
        "25"
    );
    // A template's own hook is kept.
    spec["template"]["spec"]["containers"][0]["lifecycle"] =
        json!({"preStop": {"exec": {"command": ["/drain.sh"]}}});
    let newcomer = pod(spec.clone());
    assert_eq!(
        newcomer["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"],
        json!(["/drain.sh"])
    );
    // No grace period, no time to wait: no hook.
    spec["template"]["spec"]["terminationGracePeriodSeconds"] = 0.into();
    spec["template"]["spec"]["containers"][0]["lifecycle"] = Value::Null;
    let newcomer = pod(spec);
    assert!(
        newcomer["spec"]["containers"][0]["lifecycle"].is_null(),
        "{newcomer}"
    );
}

// ---- A running job: a fake PE 0 behind a real control endpoint ----

/// Holds PE 0's rescales until the test opens it (a long evacuation).
#[derive(Default)]
struct Gate {
    closed: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn set_closed(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.opened.notify_all();
    }

    /// Waits until the gate opens (20 s at most: a failed test leaves it shut).
    fn wait_open(&self) {
        let closed = self.closed.lock().unwrap();
        let _ = self
            .opened
            .wait_timeout_while(closed, Duration::from_secs(20), |closed| *closed)
            .unwrap();
    }
}

/// What the fake job holds: its view, newcomers waiting, and the requests it got.
struct FakeJob {
    epoch: u64,
    members: Vec<String>,
    pending: Vec<String>,
    rescales: Vec<RescaleRequest>,
    /// When each rescale request arrived (the latency benchmark).
    asked_at: Vec<std::time::Instant>,
    /// Status requests answered.
    statuses: usize,
    refuse: Option<String>,
    gate: Arc<Gate>,
}

fn member(node: usize, host: &str) -> Member {
    Member {
        node: node as u32,
        uid: 100 + node as u64,
        address: vec![],
        pes: 2,
        host: host.to_owned(),
        pid: 4000 + node as u32,
    }
}

impl FakeJob {
    fn status(&mut self) -> JobStatus {
        self.statuses += 1;
        JobStatus {
            epoch: self.epoch,
            members: self
                .members
                .iter()
                .enumerate()
                .map(|(i, h)| member(i, h))
                .collect(),
            pes: 2 * self.members.len() as u32,
            pending: self
                .pending
                .iter()
                .enumerate()
                .map(|(i, h)| PendingNewcomer {
                    uid: 200 + i as u64,
                    pes: 2,
                    host: h.clone(),
                    pid: 5000,
                })
                .collect(),
            uptime_ms: 1000,
        }
    }

    /// A rescale as node 0 does it: survivors keep their order, newcomers follow.
    fn rescale(&mut self, request: &RescaleRequest) -> ControlReply {
        if let Some(message) = self.refuse.take() {
            return ControlReply::Error { message };
        }
        if request.epoch != self.epoch {
            return ControlReply::ViewChanged {
                asked: request.epoch,
                now: self.epoch,
            };
        }
        let before = self.epoch;
        let pes_before = 2 * self.members.len() as u32;
        let survivors: Vec<String> = self
            .members
            .iter()
            .enumerate()
            .filter(|(i, _)| !request.remove.contains(&(*i as u32)))
            .map(|(_, h)| h.clone())
            .collect();
        let admit = (request.admit as usize).min(self.pending.len());
        let admitted: Vec<String> = self.pending.drain(..admit).collect();
        let first_new = survivors.len();
        self.members = survivors
            .into_iter()
            .chain(admitted.iter().cloned())
            .collect();
        self.epoch += 1;
        let stage = |stage: &str, ms: f64| StageTime {
            stage: stage.into(),
            ms,
        };
        ControlReply::Rescaled(RescaleReport {
            epoch_before: before,
            epoch: self.epoch,
            removed: request.remove.clone(),
            admitted: (first_new..self.members.len()).map(|i| i as u32).collect(),
            pes_before,
            pes: 2 * self.members.len() as u32,
            migrations: 12,
            stages: vec![
                stage("stop", 1.4),
                stage("commit", 0.6),
                stage("reconcile", 3.2),
            ],
            mechanism_ms: 5.2,
            total_ms: 9.7,
            gpu: vec![StageTime {
                stage: "staging".into(),
                ms: 2.2,
            }],
        })
    }
}

/// Serves the fake job's control endpoint on loopback until the test ends.
fn fake_job(secret: &Secret, members: &[&str]) -> (u16, Arc<Mutex<FakeJob>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let gate = Arc::new(Gate::default());
    let job = Arc::new(Mutex::new(FakeJob {
        epoch: 1,
        members: members.iter().map(|m| (*m).to_owned()).collect(),
        pending: Vec::new(),
        rescales: Vec::new(),
        asked_at: Vec::new(),
        statuses: 0,
        refuse: None,
        gate: gate.clone(),
    }));
    let shared = job.clone();
    let secret = secret.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let (job, secret, gate) = (shared.clone(), secret.clone(), gate.clone());
            std::thread::spawn(move || {
                let _ = serve_connection(stream, &secret, |request| match request {
                    ControlRequest::Status => ControlReply::Status(job.lock().unwrap().status()),
                    ControlRequest::Rescale(r) => {
                        {
                            let mut job = job.lock().unwrap();
                            job.rescales.push(r.clone());
                            job.asked_at.push(std::time::Instant::now());
                        }
                        // PE 0 evacuates for as long as the gate is closed.
                        gate.wait_open();
                        job.lock().unwrap().rescale(r)
                    }
                    ControlRequest::Checkpoint(_) => ControlReply::Error {
                        message: "the operator never checkpoints".into(),
                    },
                    ControlRequest::Hello { .. } => ControlReply::Error {
                        message: "hello twice".into(),
                    },
                });
            });
        }
    });
    (port, job)
}

fn running_pod(name: &str, capacity: &str, role: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "hpc", "labels": {
            "ductile.dev/job": "jacobi", "ductile.dev/capacity": capacity, "ductile.dev/role": role}},
        "spec": {"nodeName": node, "containers": [{"name": "node", "image": "apps:1"}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    })
}

fn pod_list(pods: &[Value]) -> Value {
    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods})
}

fn launch_pods() -> Vec<Value> {
    vec![
        running_pod("jacobi-0", "on-demand", "launch", "od-1"),
        running_pod("jacobi-1", "spot", "launch", "spot-1"),
        running_pod("jacobi-2", "spot", "launch", "spot-2"),
    ]
}

fn secret_object(secret: &Secret) -> Value {
    // ByteString serialises as base64, as the API server sends it.
    let data = serde_json::to_value(k8s_openapi::ByteString(secret.to_hex().into_bytes())).unwrap();
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "jacobi-secret", "namespace": "hpc"},
           "data": {"secret": data}})
}

/// A running job at epoch 1 (its status says so).
fn running_job_json() -> Value {
    let mut value = managed_job_json(valid_spec());
    value["status"] = json!({"phase": "Running", "epoch": 1, "replicas": 3, "readyReplicas": 3});
    value
}

/// Waits (bounded) for the operator's own request to reconcile the job.
async fn next_requeue(requests: &mut (impl futures::Stream<Item = ObjectRef<ElasticJob>> + Unpin)) {
    let job = tokio::time::timeout(Duration::from_secs(10), requests.next())
        .await
        .expect("the rescale task asks for a reconcile when PE 0 answers")
        .expect("the request stream is open");
    assert_eq!(
        (job.name.as_str(), job.namespace.as_deref()),
        ("jacobi", Some("hpc"))
    );
}

/// The first reconcile of a running job whose pod `jacobi-2` is on a
/// tainted node: returns the newcomer pod created and the status written.
async fn reconcile_tainted(
    ctx: &Arc<Context>,
    handle: ApiServerHandle,
    secret: &Secret,
) -> (ApiServerHandle, Value, Value, Vec<(String, String)>, Action) {
    let secret = secret.clone();
    let (action, handle, (newcomer, status, events)) =
        reconcile_against(ctx, &running_job_json(), handle, |mut handle| async move {
            expect_objects(&mut handle, Some(&secret), &launch_pods()).await;
            let mut events = vec![expect_event(&mut handle).await];
            let newcomer = expect_pod_apply(&mut handle)
            .await;
            events.push(expect_event(&mut handle).await);
            let status = expect_status(&mut handle, &running_job_json()).await;
            (handle, (newcomer, status, events))
        })
        .await;
    let action = action.expect("reconcile succeeds");
    (handle, newcomer, status, events, action)
}

#[tokio::test]
async fn a_taint_triggers_a_replacement() {
    let secret = Secret::generate();
    let (port, fake) = fake_job(&secret, &["jacobi-0", "jacobi-1", "jacobi-2"]);
    let (mut harness, handle) = context();
    harness.node("spot-2", json!([{"key": "aws-node-termination-handler/rebalance-recommendation", "effect": "NoSchedule"}]));
    harness.node("spot-1", json!([]));
    let harness = harness.with_control(port);

    let (_handle, newcomer, status, events, action) =
        reconcile_tainted(&harness.ctx, handle, &secret).await;

    assert_eq!(events[0].0, "Notice");
    assert!(
        events[0]
            .1
            .contains("rebalance-recommendation for pod jacobi-2"),
        "{:?}",
        events[0]
    );
    assert_eq!(events[1].0, "LaunchReplacement");
    assert!(
        events[1].1.contains("jacobi-n0") && events[1].1.contains("jacobi-2"),
        "{:?}",
        events[1]
    );

    // The replacement: a spot newcomer pod, no launch index, named by the policy.
    assert_eq!(newcomer["metadata"]["name"], "jacobi-n0");
    assert_eq!(
        newcomer["metadata"]["labels"]["ductile.dev/role"],
        "newcomer"
    );
    assert_eq!(
        newcomer["metadata"]["labels"]["ductile.dev/capacity"],
        "spot"
    );
    assert_eq!(
        newcomer["metadata"]["annotations"]["ductile.dev/replaces"],
        "jacobi-2"
    );
    assert!(newcomer["metadata"]["labels"]["ductile.dev/launch-index"].is_null());
    assert_eq!(node_affinity_values(&newcomer), ["SPOT", "spot"]);
    assert_eq!(newcomer["spec"]["hostname"], "jacobi-n0");
    let containers = newcomer["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "no coordinator in a newcomer's pod");
    assert_eq!(
        env_of(&containers[0], "DUCTILE_ROLE").as_deref(),
        Some("newcomer")
    );
    assert_eq!(env_of(&containers[0], "DUCTILE_LAUNCH_INDEX"), None);
    assert_eq!(env_of(&containers[0], "DUCTILE_CONTROL"), None);
    assert_eq!(
        containers[0]["lifecycle"]["preStop"]["exec"]["command"][1],
        "wait-left"
    );

    // Nothing asked of the job yet: complete replacement waits for the newcomer.
    assert!(fake.lock().unwrap().rescales.is_empty());
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["epoch"], 1);
    assert_eq!(status["atRisk"], json!(["jacobi-2"]));
    assert_eq!(status["readyReplicas"], 3);
    assert_eq!(status["replicas"], 4, "three members and one newcomer");
    assert_eq!(
        status["members"][2],
        json!({"pod": "jacobi-2", "node": "spot-2", "nodeId": 2, "pes": 2})
    );
    // The newcomer has not registered: poll the control endpoint soon.
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    assert!(harness
        .ctx
        .metrics
        .render()
        .contains("ductile_operator_notices_total{kind=\"rebalance-recommendation\"} 1"));
}

#[tokio::test]
async fn a_rescale_runs_in_the_background_and_its_commit_deletes_vacated_pods_and_patches_status() {
    let secret = Secret::generate();
    let (port, fake) = fake_job(&secret, &["jacobi-0", "jacobi-1", "jacobi-2"]);
    let (mut harness, handle) = context();
    harness.node("spot-2", json!([{"key": "aws-node-termination-handler/rebalance-recommendation", "effect": "NoSchedule"}]));
    let harness = harness.with_control(port);
    let ctx = harness.ctx.clone();
    let mut requeues = Box::pin(ctx.requeue.stream(Some("hpc".to_owned())));
    let (handle, _, _, _, _) = reconcile_tainted(&ctx, handle, &secret).await;

    // The replacement's pod runs and its node registered with the coordinator;
    // PE 0 will take its time over the rescale.
    let gate = {
        let mut job = fake.lock().unwrap();
        job.pending.push("jacobi-n0".to_owned());
        job.gate.set_closed(true);
        job.gate.clone()
    };
    let mut pods = launch_pods();
    pods.push(running_pod("jacobi-n0", "spot", "newcomer", "spot-3"));
    let listed = pods.clone();
    let asked = tokio::time::timeout(
        Duration::from_secs(10),
        reconcile_against(&ctx, &running_job_json(), handle, |mut handle| async move {
            // The secret is known by now: no GET.
            expect_objects(&mut handle, None, &listed).await;
            let requested = expect_event(&mut handle).await;
            let status = expect_status(&mut handle, &running_job_json()).await;
            (handle, (requested, status))
        }),
    )
    .await
    .expect("the reconcile does not wait for PE 0's rescale");
    let (action, handle, (requested, rescaling)) = asked;
    // Waiting newcomers are polled for; the rescale's end wakes the job sooner.
    assert_eq!(
        action.expect("reconcile succeeds"),
        Action::requeue(Duration::from_secs(5))
    );
    assert_eq!(requested.0, "RescaleRequested");
    assert!(
        requested
            .1
            .starts_with("CompleteReplacement: remove [jacobi-2], admit 1"),
        "{requested:?}"
    );
    assert_eq!(rescaling["phase"], "Rescaling");
    assert_eq!(rescaling["epoch"], 1);
    let condition = rescaling["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Rescaling")
        .unwrap_or_else(|| panic!("no Rescaling condition: {rescaling}"));
    assert_eq!(
        (&condition["status"], &condition["reason"]),
        (&json!("True"), &json!("CompleteReplacement"))
    );

    // The request reaches PE 0 from the task, in its own time.
    let asked_by = std::time::Instant::now() + Duration::from_secs(10);
    while fake.lock().unwrap().rescales.is_empty() {
        assert!(
            std::time::Instant::now() < asked_by,
            "PE 0 never got the rescale"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Meanwhile the job is reconciled as usual, without asking PE 0 anything.
    let statuses = fake.lock().unwrap().statuses;
    let listed = pods.clone();
    let (action, handle, status) =
        reconcile_against(&ctx, &running_job_json(), handle, |mut handle| async move {
            expect_objects(&mut handle, None, &listed).await;
            let status = expect_status(&mut handle, &running_job_json()).await;
            (handle, status)
        })
        .await;
    action.expect("reconcile succeeds");
    assert_eq!(status["phase"], "Rescaling");
    assert_eq!(fake.lock().unwrap().statuses, statuses, "PE 0 is busy");
    assert_eq!(
        fake.lock().unwrap().rescales.len(),
        1,
        "one rescale at a time"
    );

    // PE 0 commits: the task wakes the job, whose next reconcile takes the report.
    gate.set_closed(false);
    next_requeue(&mut requeues).await;
    let (action, _, (events, status)) =
        reconcile_against(&ctx, &running_job_json(), handle, |mut handle| async move {
            expect_objects(&mut handle, None, &pods).await;
            let committed = expect_event(&mut handle).await;
            expect(
                &mut handle,
                Method::DELETE,
                &format!("{NS}/pods/jacobi-2"),
                reply_with(running_pod("jacobi-2", "spot", "launch", "spot-2")),
            )
            .await;
            let deleted = expect_event(&mut handle).await;
            let status = expect_status(&mut handle, &running_job_json()).await;
            (handle, (vec![committed, deleted], status))
        })
        .await;

    // One rescale reached PE 0: node 2 out, one newcomer in.
    assert_eq!(
        fake.lock().unwrap().rescales,
        [RescaleRequest {
            epoch: 1,
            remove: vec![2],
            admit: 1
        }]
    );
    assert_eq!(events[0].0, "RescaleCommitted");
    assert!(
        events[0].1.contains("epoch 1 -> 2") && events[0].1.contains("admitted [jacobi-n0]"),
        "{:?}",
        events[0]
    );
    assert_eq!(events[1].0, "DeleteVacated");

    assert_eq!(status["phase"], "Running");
    assert_eq!(status["epoch"], 2);
    assert_eq!(status["readyReplicas"], 3);
    assert_eq!(status["replicas"], 3, "the vacated pod is deleted");
    assert!(status["atRisk"].is_null(), "{status}");
    let members: Vec<&str> = status["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pod"].as_str().unwrap())
        .collect();
    assert_eq!(members, ["jacobi-0", "jacobi-1", "jacobi-n0"]);
    assert_eq!(status["members"][2]["nodeId"], 2);
    assert_eq!(status["members"][2]["node"], "spot-3");
    let last = &status["lastRescale"];
    assert_eq!(last["reason"], "CompleteReplacement");
    assert_eq!(last["removed"], json!(["jacobi-2"]));
    assert_eq!(last["added"], json!(["jacobi-n0"]));
    assert_eq!(last["epoch"], 2);
    assert_eq!(last["durationMs"], 10);
    assert_eq!(
        last["stageTimings"],
        json!({"stop": 1, "commit": 1, "reconcile": 3, "gpu_staging": 2})
    );
    assert_eq!(
        action.expect("reconcile succeeds"),
        Action::requeue(Duration::from_secs(60))
    );

    let metrics = ctx.metrics.render();
    for line in [
        "ductile_operator_rescales_requested_total{reason=\"CompleteReplacement\"} 1",
        "ductile_operator_rescales_committed_total{reason=\"CompleteReplacement\"} 1",
        "ductile_operator_notice_to_commit_seconds_count 1",
        // By the signal that put the member at risk, in millisecond buckets
        // (the scenario's clock stands still: 0 ms).
        "ductile_operator_notice_to_commit_by_signal_seconds_count{signal=\"rebalance-recommendation\"} 1",
        "ductile_operator_notice_to_commit_by_signal_seconds_bucket{signal=\"rebalance-recommendation\",le=\"0.001\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "missing {line} in\n{metrics}"
        );
    }
}

#[tokio::test]
async fn an_interruption_notice_with_no_replacement_shrinks_at_once_and_a_refusal_is_retried() {
    let secret = Secret::generate();
    let (port, fake) = fake_job(&secret, &["jacobi-0", "jacobi-1", "jacobi-2"]);
    fake.lock().unwrap().refuse = Some("a rescale is already in progress".to_owned());
    let (mut harness, handle) = context();
    harness.node("spot-1", json!([{"key": "aws-node-termination-handler/spot-itn", "value": "itn-1", "effect": "NoSchedule"}]));
    let harness = harness.with_control(port);
    let ctx = harness.ctx.clone();
    let mut requeues = Box::pin(ctx.requeue.stream(None));
    let (action, handle, (mut reasons, newcomer, rescaling)) =
        reconcile_against(&ctx, &running_job_json(), handle, |mut handle| async move {
            expect_objects(&mut handle, Some(&secret), &launch_pods()).await;
            let mut reasons = vec![expect_event(&mut handle).await.0];
            // Emergency: the replacement is launched and the shrink requested together.
            let newcomer = expect_pod_apply(&mut handle)
            .await;
            reasons.push(expect_event(&mut handle).await.0);
            reasons.push(expect_event(&mut handle).await.0);
            let status = expect_status(&mut handle, &running_job_json()).await;
            (handle, (reasons, newcomer, status))
        })
        .await;
    action.expect("reconcile succeeds");
    assert_eq!(rescaling["phase"], "Rescaling");

    // PE 0 refuses; the next reconcile reports it, and the policy waits
    // before it tries again.
    next_requeue(&mut requeues).await;
    let mut pods = launch_pods();
    pods.push(running_pod("jacobi-n0", "spot", "newcomer", "spot-3"));
    let (action, _, (reason, status)) =
        reconcile_against(&ctx, &running_job_json(), handle, |mut handle| async move {
            expect_objects(&mut handle, None, &pods).await;
            let reason = expect_event(&mut handle).await.0;
            let status = expect_status(&mut handle, &running_job_json()).await;
            (handle, (reason, status))
        })
        .await;
    reasons.push(reason);
    assert_eq!(
        reasons,
        [
            "Notice",
            "LaunchReplacement",
            "RescaleRequested",
            "RescaleFailed"
        ]
    );
    assert_eq!(
        newcomer["metadata"]["annotations"]["ductile.dev/replaces"],
        "jacobi-1"
    );
    assert_eq!(
        fake.lock().unwrap().rescales,
        [RescaleRequest {
            epoch: 1,
            remove: vec![1],
            admit: 0
        }]
    );
    let last = &status["lastRescale"];
    assert!(
        last["reason"]
            .as_str()
            .unwrap()
            .starts_with("Emergency (failed: "),
        "{last}"
    );
    assert!(last["epoch"].is_null());
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["atRisk"], json!(["jacobi-1"]));
    assert_eq!(status["epoch"], 1);
    // The retry comes after the policy's 10 s pause, or sooner to poll the newcomer.
    assert_eq!(
        action.expect("a refused rescale is not a reconcile error"),
        Action::requeue(Duration::from_secs(5))
    );
    assert!(ctx
        .metrics
        .render()
        .contains("ductile_operator_rescales_failed_total{reason=\"Emergency\"} 1"));
}

/// Notice-to-rescale-request latency, the operator's own processing: from
/// the start of the reconcile that first sees a `spot-itn` taint (already
/// in the node store, as the shared reflector puts it there before it
/// wakes the job) to PE 0's control endpoint receiving the emergency
/// shrink. The mock API server answers at once and PE 0 is on loopback, so
/// the figure is the reconcile's work: the policy, the pod apply, Events,
/// the request's connection and authentication. A benchmark, not an
/// assert: the table is printed and the JSON written to
/// `target/bench/operator_notice_to_request.json`.
#[tokio::test]
async fn bench_notice_to_rescale_request() {
    const RUNS: usize = 30;
    let mut samples_ms = Vec::new();
    for _ in 0..RUNS {
        let secret = Secret::generate();
        let (port, fake) = fake_job(&secret, &["jacobi-0", "jacobi-1", "jacobi-2"]);
        let (mut harness, handle) = context();
        harness.node("spot-1", json!([{"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}]));
        let ctx = harness.with_control(port).ctx;
        let secret_for_script = secret.clone();
        let started = std::time::Instant::now();
        let (action, _, ()) =
            reconcile_against(&ctx, &running_job_json(), handle, |mut handle| async move {
                expect_objects(&mut handle, Some(&secret_for_script), &launch_pods()).await;
                expect_event(&mut handle).await;
                expect_pod_apply(&mut handle).await;
                expect_event(&mut handle).await;
                expect_event(&mut handle).await;
                expect_status(&mut handle, &running_job_json()).await;
                (handle, ())
            })
            .await;
        action.expect("reconcile succeeds");
        let asked_by = std::time::Instant::now() + Duration::from_secs(10);
        let asked = loop {
            if let Some(at) = fake.lock().unwrap().asked_at.first().copied() {
                break at;
            }
            assert!(std::time::Instant::now() < asked_by, "PE 0 never got the rescale");
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        assert_eq!(fake.lock().unwrap().rescales[0].remove, vec![1], "the emergency shrink");
        samples_ms.push(asked.duration_since(started).as_secs_f64() * 1e3);
    }
    samples_ms.sort_by(f64::total_cmp);
    let pick = |q: f64| samples_ms[((samples_ms.len() - 1) as f64 * q).round() as usize];
    let (min, median, p90, max) = (pick(0.0), pick(0.5), pick(0.9), pick(1.0));
    println!("notice-to-rescale-request (spot-itn, emergency shrink), {RUNS} runs, ms");
    println!("| min | median | p90 | max |");
    println!("|---|---|---|---|");
    println!("| {min:.3} | {median:.3} | {p90:.3} | {max:.3} |");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    let report = json!({
        "bench": "operator_notice_to_request",
        "what": "reconcile start (spot-itn taint in the node store) to PE 0 receiving the emergency shrink; mock API server, PE 0 on loopback",
        "runs": RUNS,
        "ms": {"min": min, "median": median, "p90": p90, "max": max},
        "samples_ms": samples_ms,
    });
    std::fs::write(
        dir.join("operator_notice_to_request.json"),
        serde_json::to_vec_pretty(&report).unwrap(),
    )
    .unwrap();
}

/// `rescalePolicy` (and the bounds) edited while the job runs: the next
/// reconcile's decision follows the new spec, with no operator restart.
#[tokio::test]
async fn a_spec_change_to_the_rescale_policy_takes_effect_without_a_restart() {
    let secret = Secret::generate();
    let (port, fake) = fake_job(&secret, &["jacobi-0", "jacobi-1", "jacobi-2"]);
    let (mut harness, handle) = context();
    harness.node("spot-1", json!([{"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}]));
    let ctx = harness.with_control(port).ctx;
    // No emergency rescales: an interrupted member waits for its
    // replacement (or its deadline, 120 s away on the fixed clock).
    let mut patient = running_job_json();
    patient["spec"]["rescalePolicy"] = json!({"emergencyOnInterruption": false});
    let job_value = patient.clone();
    let (action, handle, reasons) =
        reconcile_against(&ctx, &patient, handle, |mut handle| async move {
            expect_objects(&mut handle, Some(&secret), &launch_pods()).await;
            let mut reasons = vec![expect_event(&mut handle).await.0];
            let pod = expect_pod_apply(&mut handle).await;
            assert_eq!(pod["metadata"]["annotations"]["ductile.dev/replaces"], "jacobi-1");
            reasons.push(expect_event(&mut handle).await.0);
            expect_status(&mut handle, &job_value).await;
            (handle, reasons)
        })
        .await;
    action.expect("reconcile succeeds");
    assert_eq!(reasons, ["Notice", "LaunchReplacement"]);
    assert!(fake.lock().unwrap().rescales.is_empty(), "no emergency rescale");

    // kubectl edit: emergency rescales on, maxReplicas 5. The next
    // reconcile records the change and asks PE 0 for the emergency shrink.
    let mut edited = running_job_json();
    edited["metadata"]["generation"] = 2.into();
    edited["spec"]["maxReplicas"] = 5.into();
    edited["spec"]["rescalePolicy"] = json!({"emergencyOnInterruption": true});
    let mut pods = launch_pods();
    pods.push(running_pod("jacobi-n0", "spot", "newcomer", "spot-3"));
    let job_value = edited.clone();
    let (action, _, (changed, requested, status)) =
        reconcile_against(&ctx, &edited, handle, |mut handle| async move {
            expect_objects(&mut handle, None, &pods).await;
            let changed = expect_event(&mut handle).await;
            let requested = expect_event(&mut handle).await;
            let status = expect_status(&mut handle, &job_value).await;
            (handle, (changed, requested, status))
        })
        .await;
    action.expect("reconcile succeeds");
    assert_eq!(changed.0, "PolicyChanged");
    assert!(
        changed.1.contains("maxReplicas 5") && changed.1.contains("emergencyOnInterruption true"),
        "{changed:?}"
    );
    assert_eq!(requested.0, "RescaleRequested");
    assert!(requested.1.starts_with("Emergency: remove [jacobi-1], admit 0"), "{requested:?}");
    assert_eq!(status["phase"], "Rescaling");
    let asked_by = std::time::Instant::now() + Duration::from_secs(10);
    while fake.lock().unwrap().rescales.is_empty() {
        assert!(std::time::Instant::now() < asked_by, "PE 0 never got the rescale");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        fake.lock().unwrap().rescales,
        [RescaleRequest { epoch: 1, remove: vec![1], admit: 0 }]
    );
}

#[tokio::test]
async fn a_lowered_replicas_cancels_a_newcomer_not_yet_admitted() {
    let secret = Secret::generate();
    let (port, fake) = fake_job(&secret, &["jacobi-0", "jacobi-1", "jacobi-2"]);
    let (harness, handle) = context();
    let ctx = harness.with_control(port).ctx;
    // `kubectl scale --replicas=4`: one newcomer is launched.
    let mut grown = running_job_json();
    grown["spec"]["replicas"] = 4.into();
    let (action, handle, launched) =
        reconcile_against(&ctx, &grown.clone(), handle, |mut handle| async move {
            expect_objects(&mut handle, Some(&secret), &launch_pods()).await;
            let pod = expect_pod_apply(&mut handle)
            .await;
            let event = expect_event(&mut handle).await;
            expect_status(&mut handle, &grown).await;
            (handle, (pod["metadata"]["name"].clone(), event.0))
        })
        .await;
    action.expect("reconcile succeeds");
    assert_eq!(launched, (json!("jacobi-n0"), "LaunchNewcomers".to_owned()));

    // Back to 3 before it registered: its pod is deleted, nothing is rescaled.
    let mut pods = launch_pods();
    pods.push(running_pod("jacobi-n0", "spot", "newcomer", "spot-3"));
    let (action, _, (event, status)) =
        reconcile_against(&ctx, &running_job_json(), handle, |mut handle| async move {
            expect_objects(&mut handle, None, &pods).await;
            expect(
                &mut handle,
                Method::DELETE,
                &format!("{NS}/pods/jacobi-n0"),
                reply_with(running_pod("jacobi-n0", "spot", "newcomer", "spot-3")),
            )
            .await;
            let event = expect_event(&mut handle).await;
            let status = expect_status(&mut handle, &running_job_json()).await;
            (handle, (event, status))
        })
        .await;
    action.expect("reconcile succeeds");
    assert_eq!(event.0, "CancelNewcomers");
    assert!(
        event.1.contains("jacobi-n0") && event.1.contains("more newcomers than the job needs"),
        "{event:?}"
    );
    assert_eq!(status["replicas"], 3);
    assert!(fake.lock().unwrap().rescales.is_empty());
}

#[tokio::test]
async fn a_suspended_job_is_not_launched() {
    let (harness, handle) = context();
    let mut spec = valid_spec();
    spec["suspend"] = true.into();
    let job_value = managed_job_json(spec);
    let (action, _, (reason, status)) = reconcile_against(
        &harness.ctx,
        &job_value.clone(),
        handle,
        |mut handle| async move {
            expect(
                &mut handle,
                Method::GET,
                &format!("{NS}/secrets/jacobi-secret"),
                not_found,
            )
            .await;
            expect(
                &mut handle,
                Method::POST,
                &format!("{NS}/secrets"),
                echo(StatusCode::CREATED),
            )
            .await;
            expect_objects(&mut handle, None, &[]).await;
            // No pod is created, none deleted.
            let reason = expect_event(&mut handle).await.0;
            let status = expect_status(&mut handle, &job_value).await;
            (handle, (reason, status))
        },
    )
    .await;
    assert_eq!(action.expect("reconcile succeeds"), Action::await_change());
    assert_eq!(reason, "Suspended");
    assert_eq!(status["phase"], "Suspended");
    assert_eq!(status["replicas"], 0);
    assert_eq!(status["conditions"][1]["reason"], "Suspended");
}

#[tokio::test]
async fn suspending_a_running_job_deletes_its_pods_and_resuming_relaunches_it() {
    let secret = Secret::generate();
    let (port, _fake) = fake_job(&secret, &["jacobi-0", "jacobi-1", "jacobi-2"]);
    let (harness, handle) = context();
    let ctx = harness.with_control(port).ctx;
    let mut suspended = running_job_json();
    suspended["spec"]["suspend"] = true.into();
    suspended["status"]["lastRescale"] = json!({"reason": "ScaleUp", "epoch": 1});
    let (action, handle, (reason, status)) =
        reconcile_against(&ctx, &suspended.clone(), handle, |mut handle| async move {
            expect_objects(&mut handle, Some(&secret), &launch_pods()).await;
            expect_pods_deleted(&mut handle).await;
            let reason = expect_event(&mut handle).await;
            let status = expect_status(&mut handle, &suspended).await;
            (handle, (reason, status))
        })
        .await;
    assert_eq!(action.expect("reconcile succeeds"), Action::await_change());
    assert_eq!(reason.0, "Suspended");
    assert!(reason.1.contains("3 pod(s) deleted"), "{reason:?}");
    assert_eq!(status["phase"], "Suspended");
    assert!(status["epoch"].is_null(), "the run is over: {status}");
    assert!(status["members"].is_null(), "{status}");
    assert_eq!(
        status["lastRescale"]["reason"], "ScaleUp",
        "history is kept"
    );

    // Resumed while the old pods still terminate: wait for them, delete nothing twice.
    let mut resumed = managed_job_json(valid_spec());
    resumed["status"] = json!({"phase": "Suspended"});
    let terminating: Vec<Value> = launch_pods()
        .into_iter()
        .map(|mut p| {
            p["metadata"]["deletionTimestamp"] = json!("2025-06-01T12:00:30Z");
            p
        })
        .collect();
    let (action, handle, (reason, status)) =
        reconcile_against(&ctx, &resumed.clone(), handle, |mut handle| async move {
            expect_objects(&mut handle, None, &terminating).await;
            let reason = expect_event(&mut handle).await.0;
            let status = expect_status(&mut handle, &resumed).await;
            (handle, (reason, status))
        })
        .await;
    assert_eq!(
        action.expect("reconcile succeeds"),
        Action::requeue(Duration::from_secs(5))
    );
    assert_eq!(reason, "Resumed");
    assert_eq!(status["phase"], "Pending");
    assert_eq!(status["conditions"][1]["reason"], "WaitingForPods");

    // Once they are gone the launch pods are created again.
    let mut pending = managed_job_json(valid_spec());
    pending["status"] = json!({"phase": "Pending"});
    let (action, _, (created, status)) =
        reconcile_against(&ctx, &pending.clone(), handle, |mut handle| async move {
            expect_objects(&mut handle, None, &[]).await;
            let mut created = Vec::new();
            for _ in 0..3 {
                let pod = expect_pod_apply(&mut handle)
                .await;
                created.push(pod["metadata"]["name"].as_str().unwrap().to_owned());
            }
            let status = expect_status(&mut handle, &pending).await;
            (handle, (created, status))
        })
        .await;
    assert_eq!(
        action.expect("reconcile succeeds"),
        Action::requeue(Duration::from_secs(5))
    );
    assert_eq!(created, ["jacobi-0", "jacobi-1", "jacobi-2"]);
    assert_eq!(status["phase"], "Launching");
}

/// Node 0's pod after its node container died while the coordinator
/// container runs on: the pod stays `Running`, only the node container's
/// state says the job is over.
fn failed_root() -> Value {
    let mut pod = running_pod("jacobi-0", "on-demand", "launch", "od-1");
    pod["status"] = json!({"phase": "Running", "podIP": "127.0.0.1", "containerStatuses": [
        {"name": "coordinator", "ready": true, "restartCount": 0, "image": "op:1", "imageID": "",
         "state": {"running": {"startedAt": "2025-06-01T11:00:00Z"}}},
        {"name": "node", "ready": false, "restartCount": 0, "image": "apps:1", "imageID": "",
         "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]});
    pod
}

#[test]
fn node_zero_is_judged_by_its_node_container() {
    use super::lifecycle::{root_end, RootEnd};
    let pod = |value: Value| serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(value).unwrap();
    let failed = pod(failed_root());
    assert_eq!(
        root_end(Some(&failed), true, "node"),
        Some(RootEnd::Failed("node 0 failed: container node exited with code 3 (Error)".into()))
    );
    // OOM-killed node, coordinator running: failed, with the reason.
    let mut oom = failed_root();
    oom["status"]["containerStatuses"][1]["state"] = json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}});
    assert!(matches!(root_end(Some(&pod(oom)), true, "node"), Some(RootEnd::Failed(why)) if why.contains("137 (OOMKilled)")));
    // The node exited 0 (the coordinator follows): the job succeeded.
    let mut done = failed_root();
    done["status"]["containerStatuses"][1]["state"] = json!({"terminated": {"exitCode": 0}});
    assert_eq!(root_end(Some(&pod(done)), true, "node"), Some(RootEnd::Succeeded));
    // The coordinator failed while the node runs: failed.
    let mut coordinator = failed_root();
    coordinator["status"]["containerStatuses"][0]["state"] = json!({"terminated": {"exitCode": 1}});
    coordinator["status"]["containerStatuses"][1]["state"] = json!({"running": {}});
    assert!(matches!(root_end(Some(&pod(coordinator)), true, "node"), Some(RootEnd::Failed(why)) if why.contains("container coordinator exited with code 1")));
    // Both running: not over.
    let mut running = failed_root();
    running["status"]["containerStatuses"][1]["state"] = json!({"running": {}});
    assert_eq!(root_end(Some(&pod(running)), true, "node"), None);
    // An evicted pod (phase Failed, no container states).
    let mut evicted = running_pod("jacobi-0", "on-demand", "launch", "od-1");
    evicted["status"] = json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"});
    assert!(matches!(root_end(Some(&pod(evicted)), true, "node"), Some(RootEnd::Failed(why)) if why.contains("Evicted low on memory")));
    // No pod: a failure once the job ran, nothing before.
    assert!(matches!(root_end(None, true, "node"), Some(RootEnd::Failed(why)) if why.contains("gone")));
    assert_eq!(root_end(None, false, "node"), None);
}

#[tokio::test]
async fn a_deleted_node_zero_pod_fails_the_job_and_relaunches_it() {
    // A fresh context: the operator restarted; the status says Running at
    // epoch 1, and node 0's pod is gone.
    let secret = Secret::generate();
    let (harness, handle) = context();
    let mut job_value = running_job_json();
    job_value["spec"]["restartPolicy"] = "OnFailure".into();
    let listed = launch_pods()[1..].to_vec();
    let first = job_value.clone();
    let (action, _, (event, status)) =
        reconcile_against(&harness.ctx, &first.clone(), handle, |mut handle| async move {
            expect_objects(&mut handle, Some(&secret), &listed).await;
            expect_pods_deleted(&mut handle).await;
            let event = expect_event(&mut handle).await;
            let status = expect_status(&mut handle, &first).await;
            (handle, (event, status))
        })
        .await;
    assert_eq!(
        action.expect("reconcile succeeds"),
        Action::requeue(Duration::from_secs(5))
    );
    assert_eq!(event.0, "Relaunch");
    assert!(event.1.contains("node 0's pod is gone"), "{event:?}");
    assert_eq!(status["phase"], "Pending");
    assert_eq!(status["restarts"], 1);

    // Under restartPolicy Never the same job is Failed at once, saying why.
    let (harness, handle) = context();
    let never = running_job_json();
    let listed = launch_pods()[1..].to_vec();
    let secret = Secret::generate();
    let (action, _, (event, status)) =
        reconcile_against(&harness.ctx, &never.clone(), handle, |mut handle| async move {
            expect_objects(&mut handle, Some(&secret), &listed).await;
            let event = expect_event(&mut handle).await;
            let status = expect_status(&mut handle, &never).await;
            (handle, (event, status))
        })
        .await;
    assert_eq!(action.expect("reconcile succeeds"), Action::await_change());
    assert_eq!(event.0, "Failed");
    assert!(event.1.contains("gone"), "{event:?}");
    assert_eq!(status["phase"], "Failed");
    let failed = &status["conditions"][2];
    assert_eq!(failed["reason"], "NodeZeroFailed");
    assert!(failed["message"].as_str().unwrap().contains("gone"), "{failed}");
}

#[tokio::test]
async fn a_failed_job_is_relaunched_until_the_backoff_limit_then_failed() {
    let secret = Secret::generate();
    let (harness, handle) = context();
    let ctx = harness.ctx;
    let mut job_value = running_job_json();
    job_value["spec"]["restartPolicy"] = "OnFailure".into();
    job_value["spec"]["backoffLimit"] = 1.into();
    let mut pods = launch_pods();
    pods[0] = failed_root();

    // Node 0 failed: every pod goes, the job waits to start again.
    let first = job_value.clone();
    let listed = pods.clone();
    let (action, handle, (event, status)) =
        reconcile_against(&ctx, &first.clone(), handle, |mut handle| async move {
            expect_objects(&mut handle, Some(&secret), &listed).await;
            expect_pods_deleted(&mut handle).await;
            let event = expect_event(&mut handle).await;
            let status = expect_status(&mut handle, &first).await;
            (handle, (event, status))
        })
        .await;
    assert_eq!(
        action.expect("reconcile succeeds"),
        Action::requeue(Duration::from_secs(5))
    );
    assert_eq!(event.0, "Relaunch");
    assert!(
        event.1.contains("container node exited with code 3")
            && event.1.contains("relaunch 1 of 1"),
        "{event:?}"
    );
    assert_eq!(status["phase"], "Pending");
    assert_eq!(status["restarts"], 1);
    assert!(status["epoch"].is_null(), "{status}");
    assert_eq!(status["conditions"][1]["reason"], "Relaunching");

    // A cached status from before the relaunch does not fail or relaunch
    // the job again while the old pods terminate.
    let stale = job_value.clone();
    let terminating: Vec<Value> = pods
        .iter()
        .cloned()
        .map(|mut p| {
            p["metadata"]["deletionTimestamp"] = json!("2025-06-01T12:00:30Z");
            p
        })
        .collect();
    let (action, handle, status) =
        reconcile_against(&ctx, &stale.clone(), handle, |mut handle| async move {
            expect_objects(&mut handle, None, &terminating).await;
            let status = expect_status(&mut handle, &stale).await;
            (handle, status)
        })
        .await;
    assert_eq!(
        action.expect("reconcile succeeds"),
        Action::requeue(Duration::from_secs(5))
    );
    assert_eq!(status["phase"], "Pending");
    assert_eq!(status["conditions"][1]["reason"], "WaitingForPods");

    // They are gone: the launch pods are created again.
    let mut pending = managed_job_json(job_value["spec"].clone());
    pending["status"] = json!({"phase": "Pending", "restarts": 1});
    let (action, handle, created) =
        reconcile_against(&ctx, &pending.clone(), handle, |mut handle| async move {
            expect_objects(&mut handle, None, &[]).await;
            for _ in 0..3 {
                expect_pod_apply(&mut handle)
                .await;
            }
            let status = expect_status(&mut handle, &pending).await;
            (handle, status)
        })
        .await;
    action.expect("reconcile succeeds");
    assert_eq!(created["phase"], "Launching");
    assert_eq!(created["restarts"], 1);

    // The relaunched run failed too: the limit is reached, the job is Failed.
    job_value["status"]["restarts"] = 1.into();
    let second = job_value.clone();
    let (action, _, (event, status)) =
        reconcile_against(&ctx, &second.clone(), handle, |mut handle| async move {
            expect_objects(&mut handle, None, &pods).await;
            let event = expect_event(&mut handle).await;
            let status = expect_status(&mut handle, &second).await;
            (handle, (event, status))
        })
        .await;
    assert_eq!(action.expect("reconcile succeeds"), Action::await_change());
    assert_eq!(event.0, "Failed");
    assert_eq!(status["phase"], "Failed");
    assert_eq!(status["restarts"], 1);
    let failed = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Failed")
        .expect("a Failed condition");
    assert_eq!(failed["status"], "True");
    assert_eq!(failed["reason"], "BackoffLimitExceeded");
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("1 relaunch(es) used of backoffLimit 1"),
        "{failed}"
    );
}

#[tokio::test]
async fn a_failed_job_under_restart_policy_never_is_failed_at_once() {
    let secret = Secret::generate();
    let (harness, handle) = context();
    let mut pods = launch_pods();
    pods[0] = failed_root();
    let job_value = running_job_json();
    let (action, _, (event, status)) = reconcile_against(
        &harness.ctx,
        &job_value.clone(),
        handle,
        |mut handle| async move {
            expect_objects(&mut handle, Some(&secret), &pods).await;
            let event = expect_event(&mut handle).await;
            let status = expect_status(&mut handle, &job_value).await;
            (handle, (event, status))
        },
    )
    .await;
    assert_eq!(action.expect("reconcile succeeds"), Action::await_change());
    assert_eq!(event.0, "Failed");
    assert_eq!(status["phase"], "Failed");
    assert_eq!(status["restarts"], 0);
    let failed = &status["conditions"][2];
    assert_eq!(
        (failed["type"].as_str(), failed["reason"].as_str()),
        (Some("Failed"), Some("NodeZeroFailed"))
    );
    // The alert DuctileJobFailed counts it.
    assert!(
        harness
            .ctx
            .metrics
            .render()
            .contains("ductile_operator_jobs_ended_total{phase=\"Failed\"} 1"),
        "{}",
        harness.ctx.metrics.render()
    );
}

#[tokio::test]
async fn deletion_runs_the_finalizer() {
    let (harness, handle) = context();
    let ctx = harness.ctx.clone();
    let mut value = managed_job_json(valid_spec());
    value["metadata"]["deletionTimestamp"] = json!("2025-06-01T12:00:00Z");
    let job: ElasticJob = serde_json::from_value(value.clone()).unwrap();
    // The job had a policy in memory: teardown forgets it.
    ctx.put_runtime("hpc/jacobi".to_owned(), JobRuntime::new(&job, ctx.now()));
    let gone = {
        let mut gone = value.clone();
        gone["metadata"]["finalizers"] = json!([]);
        gone
    };
    let (action, _, (event, patch)) =
        reconcile_against(&ctx, &value, handle, |mut handle| async move {
            expect_pods_deleted(&mut handle).await;
            let event = expect_event(&mut handle).await;
            let patch = expect(&mut handle, Method::PATCH, JOB_PATH, reply_with(gone)).await;
            (handle, (event, patch))
        })
        .await;
    assert_eq!(action.expect("teardown succeeds"), Action::await_change());
    assert_eq!(event.0, "TornDown");
    let ops = patch.as_array().unwrap();
    assert!(
        ops.iter()
            .any(|op| op["op"] == "remove" && op["path"] == "/metadata/finalizers/0"),
        "{patch}"
    );
    assert!(
        ctx.jobs.lock().unwrap().is_empty(),
        "the job's policy is forgotten"
    );
}

#[tokio::test]
async fn one_request_too_many_fails_the_scenario() {
    // The harness itself: a reconcile that goes on after the script ended
    // is caught, with what it asked.
    let (harness, handle) = context();
    let ctx = harness.ctx.clone();
    let outcome = tokio::spawn(async move {
        reconcile_against(&ctx, &job_json(valid_spec()), handle, |handle| async move {
            (handle, ())
        })
        .await
    })
    .await;
    let panic = outcome.expect_err("the scenario fails").into_panic();
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("PATCH /apis/ductile.dev/v1alpha1/namespaces/hpc/elasticjobs/jacobi"),
        "{message}"
    );
}

#[test]
fn backoff_doubles_up_to_five_minutes() {
    let waits: Vec<u64> = (0..9).map(|n| backoff(n).as_secs()).collect();
    assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
}

#[test]
fn newcomer_names_skip_existing_pods() {
    let job = managed_job(valid_spec());
    let mut rt = JobRuntime::new(&job, "2025-06-01T12:00:00Z".parse().unwrap());
    rt.policy.reserve_names(["jacobi-n3", "jacobi-0"]);
    rt.policy.observe(
        Duration::ZERO,
        Event::MemberJoined {
            member: "jacobi-0".into(),
            capacity: Capacity::OnDemand,
            root: true,
        },
    );
    let decisions = rt.policy.decide(Duration::ZERO);
    assert_eq!(
        decisions,
        [Decision::LaunchNewcomers {
            newcomers: vec!["jacobi-n4".into(), "jacobi-n5".into()]
        }]
    );
}

#[tokio::test]
async fn a_repeated_event_is_patched_into_a_series() {
    let (harness, mut handle) = context();
    let ctx = harness.ctx.clone();
    let job = managed_job(valid_spec());
    let server = tokio::spawn(async move {
        let first = expect(&mut handle, Method::POST, EVENTS_PATH, echo(StatusCode::CREATED)).await;
        let name = first["metadata"]["name"].as_str().unwrap().to_owned();
        expect(
            &mut handle,
            Method::PATCH,
            &format!("{EVENTS_PATH}/{name}"),
            echo(StatusCode::OK),
        )
        .await
    });
    for _ in 0..2 {
        ctx.publish(
            &job,
            kube::runtime::events::EventType::Warning,
            "RescaleFailed",
            "Rescale",
            "refused".to_owned(),
        )
        .await;
    }
    let series = server.await.unwrap();
    assert_eq!(series["series"]["count"], 2, "{series}");
}

#[tokio::test]
async fn a_pod_the_scheduler_cannot_place_is_reported_in_a_condition() {
    let (harness, handle) = context();
    // Nothing listens there: the job is still launching.
    let harness = harness.with_control(free_port());
    let ctx = harness.ctx.clone();
    let secret = Secret::generate();
    let mut stuck = running_pod("jacobi-2", "spot", "launch", "");
    stuck["spec"]["nodeName"] = Value::Null;
    stuck["status"] = json!({"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."}]});
    let pods = vec![
        running_pod("jacobi-0", "on-demand", "launch", "od-1"),
        running_pod("jacobi-1", "spot", "launch", "spot-1"),
        stuck,
    ];
    let job_value = managed_job_json(valid_spec());
    let (action, _, status) = reconcile_against(&ctx, &job_value.clone(), handle, |mut handle| async move {
        expect_objects(&mut handle, Some(&secret), &pods).await;
        let status = expect_status(&mut handle, &job_value).await;
        (handle, status)
    })
    .await;
    assert_eq!(action.expect("reconcile succeeds"), Action::requeue(Duration::from_secs(5)));
    assert_eq!(status["phase"], "Launching");
    let condition = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "PodsScheduled")
        .unwrap_or_else(|| panic!("no PodsScheduled condition: {status}"));
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "Unschedulable");
    assert_eq!(
        condition["message"],
        "jacobi-2: 0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."
    );
}

/// A loopback port nothing listens on.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn min_launch_spec() -> Value {
    let mut spec = valid_spec();
    spec["minReplicas"] = 2.into();
    spec["launchPolicy"] = "MinReplicas".into();
    spec
}

#[tokio::test]
async fn a_partial_launch_starts_with_min_replicas_and_grows_as_newcomers_arrive() {
    // Launch: only minReplicas launch pods, and the coordinator expects them alone.
    let (harness, handle) = context();
    let job_value = managed_job_json(min_launch_spec());
    let (action, _, created) =
        reconcile_against(&harness.ctx, &job_value.clone(), handle, |mut handle| async move {
            expect(&mut handle, Method::GET, &format!("{NS}/secrets/jacobi-secret"), not_found).await;
            expect(&mut handle, Method::POST, &format!("{NS}/secrets"), echo(StatusCode::CREATED)).await;
            expect_objects(&mut handle, None, &[]).await;
            let mut created = Vec::new();
            for _ in 0..2 {
                created.push(
                    expect_pod_apply(&mut handle)
                        .await,
                );
            }
            expect_status(&mut handle, &job_value).await;
            (handle, created)
        })
        .await;
    action.expect("reconcile succeeds");
    assert_eq!(created[0]["metadata"]["name"], "jacobi-0");
    assert_eq!(created[1]["metadata"]["name"], "jacobi-1");
    let args = &created[0]["spec"]["containers"][0]["args"];
    let expect_at = args.as_array().unwrap().iter().position(|a| a == "--expect").unwrap();
    assert_eq!(args[expect_at + 1], "2", "{args}");

    // Epoch 1 with the two: the policy grows the job to replicas by a newcomer.
    let secret = Secret::generate();
    let (port, fake) = fake_job(&secret, &["jacobi-0", "jacobi-1"]);
    let (harness, handle) = context();
    let ctx = harness.with_control(port).ctx;
    let mut running = running_job_json();
    running["spec"] = min_launch_spec();
    let pods = launch_pods()[..2].to_vec();
    let listed = pods.clone();
    let job_value = running.clone();
    let (action, handle, (newcomer, event, status)) =
        reconcile_against(&ctx, &running.clone(), handle, |mut handle| async move {
            expect_objects(&mut handle, Some(&secret), &listed).await;
            let pod = expect_pod_apply(&mut handle).await;
            let event = expect_event(&mut handle).await;
            let status = expect_status(&mut handle, &job_value).await;
            (handle, (pod, event, status))
        })
        .await;
    action.expect("reconcile succeeds");
    assert_eq!(newcomer["metadata"]["name"], "jacobi-n0");
    assert_eq!(newcomer["metadata"]["labels"]["ductile.dev/role"], "newcomer");
    assert_eq!(event.0, "LaunchNewcomers");
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["readyReplicas"], 2);
    let ready = &status["conditions"][1];
    assert_eq!((&ready["type"], &ready["reason"]), (&json!("Ready"), &json!("Growing")));
    assert_eq!(ready["message"], "2 of 3 nodes in the job, 0 newcomer(s) registered");

    // The newcomer registered: it is admitted by a rescale.
    fake.lock().unwrap().pending.push("jacobi-n0".to_owned());
    let mut pods = pods;
    pods.push(running_pod("jacobi-n0", "spot", "newcomer", "spot-3"));
    let job_value = running.clone();
    let (action, _, event) =
        reconcile_against(&ctx, &running, handle, |mut handle| async move {
            expect_objects(&mut handle, None, &pods).await;
            let event = expect_event(&mut handle).await;
            expect_status(&mut handle, &job_value).await;
            (handle, event)
        })
        .await;
    action.expect("reconcile succeeds");
    assert_eq!(event.0, "RescaleRequested");
    assert!(event.1.contains("admit 1"), "{event:?}");
    let asked_by = std::time::Instant::now() + Duration::from_secs(10);
    while fake.lock().unwrap().rescales.is_empty() {
        assert!(std::time::Instant::now() < asked_by, "PE 0 never got the rescale");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let request = fake.lock().unwrap().rescales[0].clone();
    assert!(request.remove.is_empty());
    assert_eq!(request.admit, 1);
}

#[tokio::test]
async fn with_network_policies_every_job_gets_one() {
    let (mut harness, handle) = context();
    let mut settings = ObjectSettings::default();
    settings.network_policy = Some("ductile-system".to_owned());
    Arc::get_mut(&mut harness.ctx).expect("not shared yet").settings = settings;
    // Launched, node 0 not answering yet: nothing but the objects and status.
    let ctx = harness.with_control(free_port()).ctx;
    let secret = Secret::generate();
    let mut spec = valid_spec();
    spec["metrics"] = json!({"port": 9464});
    let job_value = managed_job_json(spec);
    let status_job = job_value.clone();
    let (_, _, policy) = reconcile_against(&ctx, &job_value, handle, |mut handle| async move {
        feed_pods(&launch_pods());
        expect(&mut handle, Method::GET, &format!("{NS}/secrets/jacobi-secret"), reply_with(secret_object(&secret))).await;
        expect(&mut handle, Method::PATCH, &format!("{NS}/services/jacobi"), echo(StatusCode::OK)).await;
        expect_pdb(&mut handle).await;
        let policy = expect_query(
            &mut handle,
            Method::PATCH,
            "/apis/networking.k8s.io/v1/namespaces/hpc/networkpolicies/jacobi-nodes",
            |query| assert!(!query.contains("force"), "{query}"),
            echo(StatusCode::CREATED),
        )
        .await;
        expect_status(&mut handle, &status_job).await;
        (handle, policy)
    })
    .await;
    let spec = &policy["spec"];
    assert_eq!(spec["podSelector"]["matchLabels"], json!({"ductile.dev/job": "jacobi"}));
    assert_eq!(spec["policyTypes"], json!(["Ingress"]));
    let ingress = spec["ingress"].as_array().unwrap();
    // The job's own pods: every port.
    assert_eq!(ingress[0]["from"][0]["podSelector"]["matchLabels"], json!({"ductile.dev/job": "jacobi"}));
    assert!(ingress[0]["ports"].is_null());
    // The operator's namespace: the control endpoint only.
    assert_eq!(
        ingress[1]["from"][0]["namespaceSelector"]["matchLabels"],
        json!({"kubernetes.io/metadata.name": "ductile-system"})
    );
    assert_eq!(ingress[1]["ports"], json!([{"port": 7071, "protocol": "TCP"}]));
    // Scrapes from anywhere, on the metrics port only.
    assert!(ingress[2]["from"].is_null());
    assert_eq!(ingress[2]["ports"], json!([{"port": 9464, "protocol": "TCP"}]));
    assert_eq!(ingress.len(), 3);
}

#[tokio::test]
async fn an_active_deadline_fails_the_job_and_its_ttl_deletes_it() {
    let secret = Secret::generate();
    let (harness, handle) = context();
    let ctx = harness.ctx.clone();
    let mut spec = valid_spec();
    spec["activeDeadlineSeconds"] = 600.into();
    spec["ttlSecondsAfterFinished"] = 300.into();
    let mut job_value = running_job_json();
    job_value["spec"] = spec;
    // Launched an hour before the (fixed) clock.
    job_value["status"]["startTime"] = "2025-06-01T11:00:00Z".into();
    let status_job = job_value.clone();
    let (action, _, (event, status)) =
        reconcile_against(&ctx, &job_value, handle, |mut handle| async move {
            expect_objects(&mut handle, Some(&secret), &launch_pods()).await;
            expect_pods_deleted(&mut handle).await;
            let event = expect_event(&mut handle).await;
            let status = expect_status(&mut handle, &status_job).await;
            (handle, (event, status))
        })
        .await;
    // Deleted 300 s after it ended.
    assert_eq!(
        action.expect("reconcile succeeds"),
        Action::requeue(Duration::from_secs(300))
    );
    assert_eq!(event.0, "DeadlineExceeded");
    assert!(event.1.contains("ran 3600 s, past activeDeadlineSeconds 600"), "{event:?}");
    assert_eq!(status["phase"], "Failed");
    assert_eq!(status["startTime"], "2025-06-01T11:00:00Z");
    assert_eq!(status["completionTime"], "2025-06-01T12:00:00Z");
    let failed = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Failed")
        .unwrap_or_else(|| panic!("no Failed condition: {status}"));
    assert_eq!(failed["reason"], "DeadlineExceeded");

    // Later, with its pods gone: no relaunch, no node-0 failure; once the
    // TTL passed, the ElasticJob is deleted (its finalizer does the rest).
    let mut ended = job_value.clone();
    ended["spec"]["restartPolicy"] = "OnFailure".into();
    ended["status"] = status.clone();
    ended["status"]["completionTime"] = "2025-06-01T11:50:00Z".into();
    let (harness, handle) = context();
    let (action, _, deleted) =
        reconcile_against(&harness.ctx, &ended, handle, |mut handle| async move {
            let deleted = expect(&mut handle, Method::DELETE, JOB_PATH, |_| {
                (StatusCode::OK, managed_job_json(valid_spec()))
            })
            .await;
            (handle, deleted)
        })
        .await;
    assert_eq!(action.expect("reconcile succeeds"), Action::await_change());
    let _ = deleted;
}

/// What one reconcile asked of the API server, answered as it would be.
#[derive(Default, Debug)]
struct Seen {
    /// Events (reason, note), in order.
    events: Vec<(String, String)>,
    /// Pods applied.
    applied: Vec<Value>,
    /// Pods deleted by name.
    deleted: Vec<String>,
    /// The status patched.
    status: Value,
}

/// Answers every request after the first objects (events, pod applies and
/// deletions, in whatever order the policy's decisions come) until the
/// status patch, which ends the reconcile.
async fn answer_until_status(handle: &mut ApiServerHandle, job: &Value) -> Seen {
    let mut seen = Seen::default();
    loop {
        let (request, send) = handle
            .next_request()
            .await
            .expect("the reconciler stopped before it patched the status");
        rbac::record(request.method(), request.uri());
        let method = request.method().clone();
        let uri = request.uri().clone();
        let path = uri.path().to_owned();
        let body = request.into_body().collect_bytes().await.unwrap();
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).unwrap()
        };
        let pod_name = path.strip_prefix(&format!("{NS}/pods/")).map(str::to_owned);
        let mut done = false;
        let (status, reply) = match (&method, pod_name) {
            (&Method::POST, _) if path == EVENTS_PATH => {
                seen.events.push((
                    body["reason"].as_str().unwrap_or("").to_owned(),
                    body["note"].as_str().unwrap_or("").to_owned(),
                ));
                (StatusCode::CREATED, body)
            }
            // A repeated Event, patched into a series.
            (&Method::PATCH, None) if path.starts_with(&format!("{EVENTS_PATH}/")) => {
                seen.events
                    .push(("(series)".to_owned(), body["series"]["count"].to_string()));
                (StatusCode::OK, body)
            }
            (&Method::PATCH, Some(_)) => {
                seen.applied.push(body.clone());
                (StatusCode::CREATED, body)
            }
            (&Method::DELETE, Some(name)) => {
                seen.deleted.push(name.clone());
                (
                    StatusCode::OK,
                    running_pod(&name, "spot", "launch", "spot-2"),
                )
            }
            (&Method::PATCH, None) if path == JOB_STATUS_PATH => {
                seen.status = body["status"].clone();
                done = true;
                let mut full = job.clone();
                full["status"] = body["status"].clone();
                (StatusCode::OK, full)
            }
            _ => panic!("unexpected request {method} {uri}"),
        };
        rbac::record_answer(&method, &uri, status);
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap(),
        );
        if done {
            return seen;
        }
    }
}

/// How pod `jacobi-2` is lost in [`lose_a_member_without_notice`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// Its pod vanished.
    Vanished,
    /// Its pod ended Failed while the view still listed it, then vanished.
    FailedFirst,
    /// Its pod still runs (a frozen instance the coordinator declared lost).
    Hung,
}

/// Issue 20: a running job of three pods; then pod `jacobi-2` is lost
/// without notice (no taint, no deletion: see [`Loss`]), and the job's
/// view at epoch 2 no longer lists it. Returns what each reconcile after
/// the first did.
async fn lose_a_member_without_notice(fault_tolerance: bool, loss: Loss) -> Vec<Seen> {
    let secret = Secret::generate();
    let (port, fake) = fake_job(&secret, &["jacobi-0", "jacobi-1", "jacobi-2"]);
    let (mut harness, handle) = context();
    harness.node("spot-1", json!([]));
    harness.node("spot-2", json!([]));
    let harness = harness.with_control(port);
    let mut spec = valid_spec();
    if fault_tolerance {
        spec["faultTolerance"] = json!({"checkpointEvery": 5});
    }
    let mut job = managed_job_json(spec);
    job["status"] = json!({"phase": "Running", "epoch": 1, "replicas": 3, "readyReplicas": 3});

    // The job runs: every member known to the policy.
    let s = secret.clone();
    let j = job.clone();
    let (action, mut handle, first) =
        reconcile_against(&harness.ctx, &job, handle, |mut handle| async move {
            expect_objects(&mut handle, Some(&s), &launch_pods()).await;
            let seen = answer_until_status(&mut handle, &j).await;
            (handle, seen)
        })
        .await;
    action.expect("reconcile succeeds");
    assert!(first.events.is_empty(), "{first:?}");
    assert_eq!(first.status["readyReplicas"], 3);

    let mut rounds = Vec::new();
    let survivors = vec![
        running_pod("jacobi-0", "on-demand", "launch", "od-1"),
        running_pod("jacobi-1", "spot", "launch", "spot-1"),
    ];
    if loss == Loss::FailedFirst {
        // Its pod ended (killed); the runtime has not committed yet.
        let mut failed = running_pod("jacobi-2", "spot", "launch", "spot-2");
        failed["status"]["phase"] = json!("Failed");
        let mut pods = survivors.clone();
        pods.push(failed);
        let j = job.clone();
        let (action, h, seen) =
            reconcile_against(&harness.ctx, &job, handle, |mut handle| async move {
                expect_objects(&mut handle, None, &pods).await;
                let seen = answer_until_status(&mut handle, &j).await;
                (handle, seen)
            })
            .await;
        action.expect("reconcile succeeds");
        handle = h;
        rounds.push(seen);
    }
    // The newcomers launched so far are pods now (not registered yet).
    let launched: Vec<Value> = rounds
        .iter()
        .flat_map(|r: &Seen| r.applied.iter())
        .filter_map(|p| p["metadata"]["name"].as_str())
        .map(|name| running_pod(name, "spot", "newcomer", "spot-3"))
        .collect();
    // The runtime's recovery committed a view without it.
    {
        let mut fake = fake.lock().unwrap();
        fake.members.retain(|m| m != "jacobi-2");
        fake.epoch = 2;
    }
    let j = job.clone();
    let mut pods = survivors.clone();
    pods.extend(launched);
    if loss == Loss::Hung {
        pods.push(running_pod("jacobi-2", "spot", "launch", "spot-2"));
    }
    let (action, _handle, seen) =
        reconcile_against(&harness.ctx, &job, handle, |mut handle| async move {
            expect_objects(&mut handle, None, &pods).await;
            let seen = answer_until_status(&mut handle, &j).await;
            (handle, seen)
        })
        .await;
    action.expect("reconcile succeeds");
    rounds.push(seen);
    rounds
}

fn reasons(seen: &Seen) -> Vec<&str> {
    seen.events.iter().map(|(r, _)| r.as_str()).collect()
}

fn all_applied(rounds: &[Seen]) -> Vec<&Value> {
    rounds.iter().flat_map(|s| s.applied.iter()).collect()
}

/// With `faultTolerance`, a member pod that vanishes without notice and
/// leaves the view is a recovered loss: an Event `Recovered`, counted in
/// `status.recoveries`, and a spot replacement through the policy, whose
/// node runs with `+ft-every 5` like every pod of the job.
#[tokio::test]
async fn with_fault_tolerance_a_member_lost_without_notice_is_a_recovery_and_is_replaced() {
    let rounds = lose_a_member_without_notice(true, Loss::Vanished).await;
    let seen = &rounds[0];
    let recovered: Vec<&(String, String)> = seen
        .events
        .iter()
        .filter(|(r, _)| r == "Recovered")
        .collect();
    assert_eq!(recovered.len(), 1, "{:?}", seen.events);
    assert!(
        recovered[0]
            .1
            .contains("pod jacobi-2 was lost without notice")
            && recovered[0].1.contains("epoch 2"),
        "{recovered:?}"
    );
    assert_eq!(seen.status["recoveries"], 1, "{}", seen.status);
    assert_eq!(seen.status["epoch"], 2);
    assert_eq!(seen.status["readyReplicas"], 2);
    let newcomers: Vec<&Value> = all_applied(&rounds)
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["ductile.dev/role"] == "newcomer")
        .collect();
    assert_eq!(newcomers.len(), 1, "one replacement: {:?}", reasons(seen));
    let pod = newcomers[0];
    assert_eq!(pod["metadata"]["labels"]["ductile.dev/capacity"], "spot");
    let args = &pod["spec"]["containers"][0]["args"];
    assert_eq!(args, &json!(["+ft-every", "5"]), "{pod}");
    assert_eq!(pod["spec"]["containers"][0]["command"], json!(["jacobi2d"]));
}

/// The same loss seen in two steps: the pod ended Failed while the view
/// still listed it (the recovery's commit takes time: no verdict yet),
/// then the view without it: one recovery, said once.
#[tokio::test]
async fn with_fault_tolerance_a_member_whose_pod_failed_is_a_recovery_once_the_view_drops_it() {
    let rounds = lose_a_member_without_notice(true, Loss::FailedFirst).await;
    assert!(
        !reasons(&rounds[0]).contains(&"Recovered"),
        "{:?}",
        rounds[0].events
    );
    assert_eq!(rounds[0].status["recoveries"], 0);
    assert_eq!(
        reasons(&rounds[1])
            .iter()
            .filter(|r| **r == "Recovered")
            .count(),
        1,
        "{:?}",
        rounds[1].events
    );
    assert_eq!(rounds[1].status["recoveries"], 1);
    let newcomers = all_applied(&rounds)
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["ductile.dev/role"] == "newcomer")
        .count();
    assert_eq!(newcomers, 1);
}

/// A member that hangs (a frozen instance: its pod still Running, the
/// coordinator declared it lost and the runtime recovered without it) is
/// fenced: its pod is deleted, once, besides the recovery and its
/// replacement, so it holds neither its capacity nor a place in the job.
#[tokio::test]
async fn with_fault_tolerance_a_hung_member_the_job_recovered_without_is_fenced() {
    let rounds = lose_a_member_without_notice(true, Loss::Hung).await;
    let seen = &rounds[0];
    let reasons = reasons(seen);
    assert!(reasons.contains(&"Recovered"), "{:?}", seen.events);
    assert!(reasons.contains(&"DeleteVacated"), "{:?}", seen.events);
    assert_eq!(seen.deleted, ["jacobi-2"]);
    assert_eq!(seen.status["recoveries"], 1, "{}", seen.status);
    let newcomers = all_applied(&rounds)
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["ductile.dev/role"] == "newcomer")
        .count();
    assert_eq!(newcomers, 1, "one replacement");
}

/// Without `faultTolerance` nothing changes: the loss is reported as
/// before (`MemberLost`), no recovery is counted, and no pod gets
/// `+ft-every`.
#[tokio::test]
async fn without_fault_tolerance_a_member_lost_without_notice_is_no_recovery() {
    let rounds = lose_a_member_without_notice(false, Loss::Vanished).await;
    let seen = &rounds[0];
    assert!(reasons(seen).contains(&"MemberLost"), "{:?}", seen.events);
    assert!(!reasons(seen).contains(&"Recovered"), "{:?}", seen.events);
    assert_eq!(seen.status["recoveries"], 0);
    for pod in all_applied(&rounds) {
        assert!(pod["spec"]["containers"][0]["args"].is_null(), "{pod}");
    }
}

/// `+ft-every K` reaches the node container of every pod, launch and
/// newcomer, after the template's own arguments; node 0's coordinator
/// container does not get it.
#[test]
fn fault_tolerance_appends_ft_every_to_every_node_container() {
    let mut spec = valid_spec();
    spec["template"]["spec"]["containers"][0]["args"] = json!(["--iters", "100"]);
    spec["faultTolerance"] = json!({"checkpointEvery": 3});
    let job = managed_job(spec);
    let settings = ObjectSettings::default();
    for pod in [
        objects::launch_pod(&job, 0, &settings),
        objects::launch_pod(&job, 2, &settings),
        objects::newcomer_pod(&job, "jacobi-n0", Some("jacobi-2")),
    ] {
        let containers = &pod.spec.as_ref().unwrap().containers;
        let node = containers.iter().find(|c| c.name == "node").unwrap();
        assert_eq!(
            node.args.as_deref(),
            Some(
                &[
                    "--iters".to_owned(),
                    "100".to_owned(),
                    "+ft-every".to_owned(),
                    "3".to_owned()
                ][..]
            )
        );
        for other in containers.iter().filter(|c| c.name != "node") {
            assert!(
                !other.args.iter().flatten().any(|a| a == "+ft-every"),
                "{other:?}"
            );
        }
    }
}
