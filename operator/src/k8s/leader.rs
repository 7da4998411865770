//! Leader election between operator replicas through a
//! `coordination.k8s.io/v1` Lease: the holder renews it every few seconds;
//! another replica takes it over once it has not been renewed for its
//! duration. Writes go through `replace` with the lease's
//! `resourceVersion`, so two replicas racing for it cannot both win.
//!
//! A replica that cannot renew stops its controller and exits (the
//! Deployment restarts it as a follower): simpler and safer than demoting
//! a running controller in place.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::Api;

/// One replica's handle on the Lease.
pub struct LeaseLock {
    /// The Lease API in the operator's namespace.
    pub api: Api<Lease>,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a lease stays valid without renewal.
    pub duration: Duration,
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(e) if e.code == 409)
}

impl LeaseLock {
    /// One attempt at `now` to take or renew the lease; `Ok(true)` when this
    /// replica holds it afterwards.
    pub async fn try_acquire_or_renew(&self, now: Timestamp) -> Result<bool, kube::Error> {
        let seconds = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) if is_conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let mine = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let valid_for = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(seconds)).unwrap_or(0),
        );
        let expired = match &spec.renew_time {
            Some(MicroTime(renewed)) => {
                let age =
                    Duration::try_from(now.duration_since(*renewed)).unwrap_or(Duration::ZERO);
                age > valid_for
            }
            None => true,
        };
        let unheld = spec.holder_identity.as_deref().is_none_or(str::is_empty);
        if !mine && !expired && !unheld {
            return Ok(false);
        }
        if !mine {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(seconds);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until this replica holds the lease, trying every `retry`.
    pub async fn acquire(&self, retry: Duration) {
        loop {
            match self.try_acquire_or_renew(Timestamp::now()).await {
                Ok(true) => return,
                Ok(false) => tracing::debug!(lease = %self.name, "another replica leads"),
                Err(error) => tracing::warn!(lease = %self.name, %error, "lease unavailable"),
            }
            tokio::time::sleep(retry).await;
        }
    }

    /// Renews the lease every `every` and returns once it could not be
    /// renewed for longer than its duration (or another replica holds it).
    pub async fn keep(&self, every: Duration) {
        let mut last_renewal = std::time::Instant::now();
        loop {
            tokio::time::sleep(every).await;
            match self.try_acquire_or_renew(Timestamp::now()).await {
                Ok(true) => last_renewal = std::time::Instant::now(),
                Ok(false) => {
                    tracing::error!(lease = %self.name, "leadership lost to another replica");
                    return;
                }
                Err(error) => {
                    tracing::warn!(lease = %self.name, %error, "lease renewal failed");
                    if last_renewal.elapsed() > self.duration {
                        tracing::error!(lease = %self.name, "leadership lost: no renewal within the lease duration");
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Method, Request, Response, StatusCode};
    use kube::client::Body;
    use kube::Client;
    use serde_json::{json, Value};

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
    const PATH: &str =
        "/apis/coordination.k8s.io/v1/namespaces/ductile-system/leases/ductile-operator";

    fn lock() -> (LeaseLock, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "ductile-system");
        let lock = LeaseLock {
            api: Api::namespaced(client, "ductile-system"),
            name: "ductile-operator".to_owned(),
            identity: "op-b".to_owned(),
            duration: Duration::from_secs(15),
        };
        (lock, handle)
    }

    async fn answer(
        handle: &mut Handle,
        method: Method,
        path: &str,
        status: StatusCode,
        reply: impl FnOnce(Value) -> Value,
    ) -> Value {
        let (request, send) = handle.next_request().await.expect("a request");
        assert_eq!((request.method(), request.uri().path()), (&method, path));
        let body = request.into_body().collect_bytes().await.unwrap();
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).unwrap()
        };
        let out = reply(body.clone());
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&out).unwrap()))
                .unwrap(),
        );
        body
    }

    fn lease(holder: &str, renewed: &str) -> Value {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "ductile-operator", "namespace": "ductile-system", "resourceVersion": "7"},
               "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed, "leaseTransitions": 2}})
    }

    fn not_found(_: Value) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "nf", "metadata": {}})
    }

    fn now() -> Timestamp {
        "2025-06-01T12:00:00Z".parse().unwrap()
    }

    #[tokio::test]
    async fn a_missing_lease_is_created_and_held() {
        let (lock, mut handle) = lock();
        let server = tokio::spawn(async move {
            answer(
                &mut handle,
                Method::GET,
                PATH,
                StatusCode::NOT_FOUND,
                not_found,
            )
            .await;
            answer(
                &mut handle,
                Method::POST,
                "/apis/coordination.k8s.io/v1/namespaces/ductile-system/leases",
                StatusCode::CREATED,
                |b| b,
            )
            .await
        });
        assert!(lock.try_acquire_or_renew(now()).await.unwrap());
        let created = server.await.unwrap();
        assert_eq!(created["spec"]["holderIdentity"], "op-b");
        assert_eq!(created["spec"]["leaseDurationSeconds"], 15);
    }

    #[tokio::test]
    async fn a_live_lease_of_another_replica_is_left_alone() {
        let (lock, mut handle) = lock();
        let server = tokio::spawn(async move {
            answer(&mut handle, Method::GET, PATH, StatusCode::OK, |_| {
                lease("op-a", "2025-06-01T11:59:55.000000Z")
            })
            .await;
            drop(handle); // any write would fail the attempt
        });
        assert!(!lock.try_acquire_or_renew(now()).await.unwrap());
        server.await.unwrap();
    }

    #[tokio::test]
    async fn an_expired_lease_is_taken_over_with_its_resource_version() {
        let (lock, mut handle) = lock();
        let server = tokio::spawn(async move {
            answer(&mut handle, Method::GET, PATH, StatusCode::OK, |_| {
                lease("op-a", "2025-06-01T11:59:40.000000Z")
            })
            .await;
            answer(&mut handle, Method::PUT, PATH, StatusCode::OK, |b| b).await
        });
        assert!(lock.try_acquire_or_renew(now()).await.unwrap());
        let written = server.await.unwrap();
        assert_eq!(
            written["metadata"]["resourceVersion"], "7",
            "a concurrent writer makes this conflict"
        );
        assert_eq!(written["spec"]["holderIdentity"], "op-b");
        assert_eq!(written["spec"]["leaseTransitions"], 3);
    }

    #[tokio::test]
    async fn losing_the_race_for_a_lease_is_not_an_error() {
        let (lock, mut handle) = lock();
        let server = tokio::spawn(async move {
            answer(&mut handle, Method::GET, PATH, StatusCode::OK, |_| {
                lease("op-b", "2025-06-01T11:59:58.000000Z")
            })
            .await;
            answer(&mut handle, Method::PUT, PATH, StatusCode::CONFLICT, |_| {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "changed", "metadata": {}})
            })
            .await
        });
        assert!(!lock.try_acquire_or_renew(now()).await.unwrap());
        let renewal = server.await.unwrap();
        assert_eq!(renewal["spec"]["transitions"], Value::Null);
        assert_eq!(
            renewal["spec"]["leaseTransitions"], 2,
            "a renewal is not a transition"
        );
    }
}
