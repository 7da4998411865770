//! Reconcile scenarios against a mock API server (the kube-rs `tower_test`
//! pattern): the test plays the API server, checking each request the
//! reconciler makes, in order, and answering it.

use super::*;
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::Value;

type ApiServerHandle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

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

fn valid_spec() -> Value {
    json!({
        "replicas": 3,
        "pesPerPod": 2,
        "template": {"spec": {"containers": [{"name": "node", "image": "apps:1", "command": ["jacobi2d"]}]}},
    })
}

fn context() -> (Arc<Context>, ApiServerHandle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = Context {
        client: Client::new(service, "default"),
        settings: ObjectSettings::default(),
    };
    (Arc::new(ctx), handle)
}

/// One expected request: its method and path; `reply` answers from the
/// JSON body it carried, which is returned.
async fn expect(
    handle: &mut ApiServerHandle,
    method: Method,
    path: &str,
    reply: impl FnOnce(&Value) -> (StatusCode, Value),
) -> Value {
    let (request, send) = handle
        .next_request()
        .await
        .unwrap_or_else(|| panic!("expected {method} {path}, the reconciler stopped"));
    assert_eq!(request.method(), method, "request for {}", request.uri());
    assert_eq!(request.uri().path(), path);
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

/// Reply to a status patch with the whole ElasticJob carrying that status.
fn job_with_status(job: Value) -> impl FnOnce(&Value) -> (StatusCode, Value) {
    move |body| {
        let mut full = job;
        full["status"] = body["status"].clone();
        (StatusCode::OK, full)
    }
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
    let (ctx, mut handle) = context();
    let job_value = job_json(valid_spec());
    let job = Arc::new(job(valid_spec()));
    let server = tokio::spawn(async move {
        let ns = "/api/v1/namespaces/hpc";
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
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
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
}

#[tokio::test]
async fn an_invalid_spec_is_reported_in_a_condition_and_changes_nothing() {
    let (ctx, mut handle) = context();
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
