//! Reconcile scenarios against a mock API server (the kube-rs `tower_test`
//! pattern): the test plays the API server, checking each request the
//! reconciler makes, in order, and answering it. PE 0's control endpoint is
//! a fake job behind a real `serve_connection` server on loopback.

use super::*;
use ductile_coordinator::control::{serve_connection, ControlReply, ControlRequest, StageTime};
use ductile_coordinator::proto::{Member, PendingNewcomer};
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use kube::runtime::reflector::store::Writer;
use serde_json::Value;
use std::net::TcpListener;

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
    let mut ctx = Context::new(
        Client::new(service, "default"),
        ObjectSettings::default(),
        store,
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
    assert_eq!(request.method(), method, "request for {}", request.uri());
    assert_eq!(request.uri().path(), path);
    check_query(request.uri().query().unwrap_or(""));
    let body = request.into_body().collect_bytes().await.unwrap();
    let body = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap()
    };
    let (status, reply) = reply(&body);
    send.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&reply).unwrap()))
            .unwrap(),
    );
    body
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
    let (harness, mut handle) = context();
    let ctx = harness.ctx.clone();

    // A new ElasticJob first gets the finalizer, and nothing else.
    let fresh = Arc::new(job(valid_spec()));
    let server = tokio::spawn(async move {
        let patch = expect(
            &mut handle,
            Method::PATCH,
            JOB_PATH,
            reply_with(managed_job_json(valid_spec())),
        )
        .await;
        (handle, patch)
    });
    let action = reconcile(fresh, ctx.clone())
        .await
        .expect("reconcile succeeds");
    assert_eq!(action, Action::await_change());
    let (mut handle, patch) = server.await.unwrap();
    assert!(
        patch
            .as_array()
            .unwrap()
            .iter()
            .any(|op| op["op"] == "add" && op["value"] == json!([FINALIZERS])),
        "{patch}"
    );

    let job_value = managed_job_json(valid_spec());
    let job = Arc::new(managed_job(valid_spec()));
    let server = tokio::spawn(async move {
        let ns = NS;
        expect(
            &mut handle,
            Method::GET,
            &format!("{ns}/secrets/jacobi-secret"),
            not_found,
        )
        .await;
        let secret = expect(
            &mut handle,
            Method::POST,
            &format!("{ns}/secrets"),
            echo(StatusCode::CREATED),
        )
        .await;
        assert_eq!(secret["metadata"]["name"], "jacobi-secret");
        assert_eq!(secret["metadata"]["ownerReferences"][0]["uid"], "u-1");
        let hex = secret["data"]["secret"].as_str().unwrap();
        assert!(!hex.is_empty());

        let service = expect(
            &mut handle,
            Method::PATCH,
            &format!("{ns}/services/jacobi"),
            echo(StatusCode::OK),
        )
        .await;
        assert_eq!(service["spec"]["clusterIP"], "None");
        assert_eq!(service["spec"]["publishNotReadyAddresses"], true);

        let empty = json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []});
        expect(&mut handle, Method::GET, &format!("{ns}/pods"), |_| {
            (StatusCode::OK, empty)
        })
        .await;
        let mut pods = Vec::new();
        for _ in 0..3 {
            let pod = expect(
                &mut handle,
                Method::POST,
                &format!("{ns}/pods"),
                echo(StatusCode::CREATED),
            )
            .await;
            pods.push(pod);
        }
        let status = expect(
            &mut handle,
            Method::PATCH,
            "/apis/ductile.dev/v1alpha1/namespaces/hpc/elasticjobs/jacobi/status",
            job_with_status(job_value),
        )
        .await;
        (pods, status)
    });

    let action = reconcile(job, ctx).await.expect("reconcile succeeds");
    // Node 0 is not running yet: look again soon for its control endpoint.
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    let (pods, status) = server.await.unwrap();

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

    // Nodes 1 and 2: spot, node container only, same contract.
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
    }

    assert_eq!(status["status"]["phase"], "Launching");
    assert_eq!(status["status"]["replicas"], 3);
    assert_eq!(status["status"]["selector"], "ductile.dev/job=jacobi");
    assert_eq!(status["status"]["conditions"][0]["type"], "SpecValid");
    assert_eq!(status["status"]["conditions"][0]["status"], "True");
    assert_eq!(status["status"]["conditions"][1]["type"], "Ready");
    assert_eq!(status["status"]["conditions"][1]["status"], "False");
    assert_eq!(status["status"]["conditions"][1]["observedGeneration"], 1);
}

#[tokio::test]
async fn an_invalid_spec_is_reported_in_a_condition_and_changes_nothing() {
    let (harness, mut handle) = context();
    let ctx = harness.ctx.clone();
    let mut spec = valid_spec();
    spec["minReplicas"] = 5.into();
    let job_value = job_json(spec.clone());
    let job = Arc::new(job(spec));
    let server = tokio::spawn(async move {
        let status = expect(
            &mut handle,
            Method::PATCH,
            "/apis/ductile.dev/v1alpha1/namespaces/hpc/elasticjobs/jacobi/status",
            job_with_status(job_value),
        )
        .await;
        // Nothing else: the next request would be the reconciler's mistake.
        drop(handle);
        status
    });
    let action = reconcile(job, ctx)
        .await
        .expect("an invalid spec is not an error");
    assert_eq!(action, Action::await_change());
    let status = server.await.unwrap();
    let condition = &status["status"]["conditions"][0];
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
    assert!(
        pod["spec"]["affinity"].is_null(),
        "a user selector replaces the default affinity"
    );
    assert_eq!(pod["spec"]["tolerations"][0]["key"], "spot");
    let volume = &pod["spec"]["volumes"][0]["secret"];
    assert_eq!(volume["secretName"], "mine");
    assert_eq!(volume["items"][0]["key"], "hex");
}

// ---- A running job: a fake PE 0 behind a real control endpoint ----

/// What the fake job holds: its view, newcomers waiting, and the requests it got.
struct FakeJob {
    epoch: u64,
    members: Vec<String>,
    pending: Vec<String>,
    rescales: Vec<RescaleRequest>,
    refuse: Option<String>,
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
    fn status(&self) -> JobStatus {
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
        self.rescales.push(request.clone());
        if let Some(message) = self.refuse.take() {
            return ControlReply::Error { message };
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
        ControlReply::Rescaled(RescaleReport {
            epoch_before: before,
            epoch: self.epoch,
            removed: request.remove.clone(),
            admitted: (first_new..self.members.len()).map(|i| i as u32).collect(),
            pes_before,
            pes: 2 * self.members.len() as u32,
            migrations: 12,
            stages: vec![
                StageTime {
                    stage: "stop".into(),
                    ms: 1.4,
                },
                StageTime {
                    stage: "commit".into(),
                    ms: 0.6,
                },
                StageTime {
                    stage: "reconcile".into(),
                    ms: 3.2,
                },
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
    let job = Arc::new(Mutex::new(FakeJob {
        epoch: 1,
        members: members.iter().map(|m| (*m).to_owned()).collect(),
        pending: Vec::new(),
        rescales: Vec::new(),
        refuse: None,
    }));
    let shared = job.clone();
    let secret = secret.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let job = shared.clone();
            let secret = secret.clone();
            std::thread::spawn(move || {
                let _ = serve_connection(stream, &secret, |request| {
                    let mut job = job.lock().unwrap();
                    match request {
                        ControlRequest::Status => ControlReply::Status(job.status()),
                        ControlRequest::Rescale(r) => job.rescale(r),
                        ControlRequest::Checkpoint(_) => ControlReply::Error {
                            message: "the operator never checkpoints".into(),
                        },
                        ControlRequest::Hello { .. } => ControlReply::Error {
                            message: "hello twice".into(),
                        },
                    }
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

/// A running job at epoch 1 (its status says so) whose pod `jacobi-2` sits
/// on a node with a rebalance recommendation.
fn running_job_json() -> Value {
    let mut value = managed_job_json(valid_spec());
    value["status"] = json!({"phase": "Running", "epoch": 1, "replicas": 3, "readyReplicas": 3});
    value
}

/// The first reconcile of a running job whose pod `jacobi-2` is on a
/// tainted node: returns the newcomer pod created and the status written.
async fn reconcile_tainted(
    ctx: Arc<Context>,
    mut handle: ApiServerHandle,
    secret: &Secret,
) -> (ApiServerHandle, Value, Value, Vec<(String, String)>, Action) {
    let secret_value = secret_object(secret);
    let server = tokio::spawn(async move {
        expect(
            &mut handle,
            Method::GET,
            &format!("{NS}/secrets/jacobi-secret"),
            reply_with(secret_value),
        )
        .await;
        expect(
            &mut handle,
            Method::PATCH,
            &format!("{NS}/services/jacobi"),
            echo(StatusCode::OK),
        )
        .await;
        expect(
            &mut handle,
            Method::GET,
            &format!("{NS}/pods"),
            reply_with(pod_list(&launch_pods())),
        )
        .await;
        let mut events = vec![expect_event(&mut handle).await];
        let newcomer = expect(
            &mut handle,
            Method::POST,
            &format!("{NS}/pods"),
            echo(StatusCode::CREATED),
        )
        .await;
        events.push(expect_event(&mut handle).await);
        let status = expect(
            &mut handle,
            Method::PATCH,
            JOB_STATUS_PATH,
            job_with_status(running_job_json()),
        )
        .await;
        (handle, newcomer, status, events)
    });
    let job: ElasticJob = serde_json::from_value(running_job_json()).unwrap();
    let action = reconcile(Arc::new(job), ctx)
        .await
        .expect("reconcile succeeds");
    let (handle, newcomer, status, events) = server.await.unwrap();
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
        reconcile_tainted(harness.ctx.clone(), handle, &secret).await;

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

    // Nothing asked of the job yet: complete replacement waits for the newcomer.
    assert!(fake.lock().unwrap().rescales.is_empty());
    let status = &status["status"];
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
async fn a_committed_rescale_deletes_vacated_pods_and_patches_status() {
    let secret = Secret::generate();
    let (port, fake) = fake_job(&secret, &["jacobi-0", "jacobi-1", "jacobi-2"]);
    let (mut harness, handle) = context();
    harness.node("spot-2", json!([{"key": "aws-node-termination-handler/rebalance-recommendation", "effect": "NoSchedule"}]));
    let harness = harness.with_control(port);
    let ctx = harness.ctx.clone();
    let (mut handle, _, _, _, _) = reconcile_tainted(ctx.clone(), handle, &secret).await;

    // The replacement's pod runs and its node registered with the coordinator.
    fake.lock().unwrap().pending.push("jacobi-n0".to_owned());
    let mut pods = launch_pods();
    pods.push(running_pod("jacobi-n0", "spot", "newcomer", "spot-3"));
    let server = tokio::spawn(async move {
        // The secret is known by now: no GET.
        expect(
            &mut handle,
            Method::PATCH,
            &format!("{NS}/services/jacobi"),
            echo(StatusCode::OK),
        )
        .await;
        expect(
            &mut handle,
            Method::GET,
            &format!("{NS}/pods"),
            reply_with(pod_list(&pods)),
        )
        .await;
        let requested = expect_event(&mut handle).await;
        let rescaling = expect(
            &mut handle,
            Method::PATCH,
            JOB_STATUS_PATH,
            job_with_status(running_job_json()),
        )
        .await;
        let committed = expect_event(&mut handle).await;
        expect(
            &mut handle,
            Method::DELETE,
            &format!("{NS}/pods/jacobi-2"),
            reply_with(running_pod("jacobi-2", "spot", "launch", "spot-2")),
        )
        .await;
        let deleted = expect_event(&mut handle).await;
        let status = expect(
            &mut handle,
            Method::PATCH,
            JOB_STATUS_PATH,
            job_with_status(running_job_json()),
        )
        .await;
        drop(handle);
        (vec![requested, committed, deleted], rescaling, status)
    });
    let job: ElasticJob = serde_json::from_value(running_job_json()).unwrap();
    let action = reconcile(Arc::new(job), ctx.clone())
        .await
        .expect("reconcile succeeds");
    let (events, rescaling, status) = server.await.unwrap();

    // One rescale reached PE 0: node 2 out, one newcomer in.
    assert_eq!(
        fake.lock().unwrap().rescales,
        [RescaleRequest {
            remove: vec![2],
            admit: 1
        }]
    );
    assert_eq!(events[0].0, "RescaleRequested");
    assert!(
        events[0]
            .1
            .starts_with("CompleteReplacement: remove [jacobi-2], admit 1"),
        "{:?}",
        events[0]
    );
    assert_eq!(events[1].0, "RescaleCommitted");
    assert!(
        events[1].1.contains("epoch 1 -> 2") && events[1].1.contains("admitted [jacobi-n0]"),
        "{:?}",
        events[1]
    );
    assert_eq!(events[2].0, "DeleteVacated");
    assert_eq!(rescaling["status"]["phase"], "Rescaling");

    let status = &status["status"];
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["epoch"], 2);
    assert_eq!(status["readyReplicas"], 3);
    assert_eq!(status["replicas"], 3, "the vacated pod is deleted");
    assert!(status["atRisk"].is_null(), "{status}");
    let pods: Vec<&str> = status["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pod"].as_str().unwrap())
        .collect();
    assert_eq!(pods, ["jacobi-0", "jacobi-1", "jacobi-n0"]);
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
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));

    let metrics = ctx.metrics.render();
    for line in [
        "ductile_operator_rescales_requested_total{reason=\"CompleteReplacement\"} 1",
        "ductile_operator_rescales_committed_total{reason=\"CompleteReplacement\"} 1",
        "ductile_operator_notice_to_commit_seconds_count 1",
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
    let (mut harness, mut handle) = context();
    harness.node("spot-1", json!([{"key": "aws-node-termination-handler/spot-itn", "value": "itn-1", "effect": "NoSchedule"}]));
    let harness = harness.with_control(port);
    let ctx = harness.ctx.clone();
    let secret_value = secret_object(&secret);
    let server = tokio::spawn(async move {
        expect(
            &mut handle,
            Method::GET,
            &format!("{NS}/secrets/jacobi-secret"),
            reply_with(secret_value),
        )
        .await;
        expect(
            &mut handle,
            Method::PATCH,
            &format!("{NS}/services/jacobi"),
            echo(StatusCode::OK),
        )
        .await;
        expect(
            &mut handle,
            Method::GET,
            &format!("{NS}/pods"),
            reply_with(pod_list(&launch_pods())),
        )
        .await;
        let mut reasons = vec![expect_event(&mut handle).await.0];
        // Emergency: the replacement is launched and the shrink requested together.
        let newcomer = expect(
            &mut handle,
            Method::POST,
            &format!("{NS}/pods"),
            echo(StatusCode::CREATED),
        )
        .await;
        reasons.push(expect_event(&mut handle).await.0);
        reasons.push(expect_event(&mut handle).await.0);
        expect(
            &mut handle,
            Method::PATCH,
            JOB_STATUS_PATH,
            job_with_status(running_job_json()),
        )
        .await;
        // PE 0 refuses; the policy reports it and waits before trying again.
        reasons.push(expect_event(&mut handle).await.0);
        let status = expect(
            &mut handle,
            Method::PATCH,
            JOB_STATUS_PATH,
            job_with_status(running_job_json()),
        )
        .await;
        drop(handle);
        (reasons, newcomer, status)
    });
    let job: ElasticJob = serde_json::from_value(running_job_json()).unwrap();
    let action = reconcile(Arc::new(job), ctx.clone())
        .await
        .expect("a refused rescale is not a reconcile error");
    let (reasons, newcomer, status) = server.await.unwrap();
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
            remove: vec![1],
            admit: 0
        }]
    );
    let last = &status["status"]["lastRescale"];
    assert!(
        last["reason"]
            .as_str()
            .unwrap()
            .starts_with("Emergency (failed: "),
        "{last}"
    );
    assert!(last["epoch"].is_null());
    assert_eq!(status["status"]["atRisk"], json!(["jacobi-1"]));
    assert_eq!(status["status"]["epoch"], 1);
    // The retry comes after the policy's 10 s pause, or sooner to poll the newcomer.
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    assert!(ctx
        .metrics
        .render()
        .contains("ductile_operator_rescales_failed_total{reason=\"Emergency\"} 1"));
}

#[tokio::test]
async fn deletion_runs_the_finalizer() {
    let (harness, mut handle) = context();
    let ctx = harness.ctx.clone();
    let mut value = managed_job_json(valid_spec());
    value["metadata"]["deletionTimestamp"] = json!("2025-06-01T12:00:00Z");
    let job: ElasticJob = serde_json::from_value(value.clone()).unwrap();
    // The job had a policy in memory: teardown forgets it.
    ctx.put_runtime("hpc/jacobi".to_owned(), JobRuntime::new(&job, ctx.now()));
    let server = tokio::spawn(async move {
        expect_query(
            &mut handle,
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
        let event = expect_event(&mut handle).await;
        let mut gone = value.clone();
        gone["metadata"]["finalizers"] = json!([]);
        let patch = expect(&mut handle, Method::PATCH, JOB_PATH, reply_with(gone)).await;
        drop(handle);
        (event, patch)
    });
    let action = reconcile(Arc::new(job), ctx.clone())
        .await
        .expect("teardown succeeds");
    assert_eq!(action, Action::await_change());
    let (event, patch) = server.await.unwrap();
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
