//! Leader election between operator replicas through a
//! `coordination.k8s.io/v1` Lease, with client-go's timings: a lease of
//! 15 s, a leader that gives up when it could not renew for 10 s, attempts
//! every 2 s. Writes go through `replace` with the lease's
//! `resourceVersion`, so two replicas racing for it cannot both win.
//!
//! Expiry is judged on this replica's own clock, never on the holder's
//! `renewTime`: a lease is taken over once its record (holder, renew time,
//! resource version) has not changed for the lease duration since this
//! replica first saw it, so clock skew between nodes cannot make two
//! leaders. The leader stops renewing (and reconciling) after the renew
//! deadline, before any other replica can judge the lease expired.
//!
//! A replica that loses the lease stops its controller and exits (the
//! Deployment restarts it as a follower): simpler and safer than demoting
//! a running controller in place. One that is stopped (SIGTERM) releases
//! the lease so that the follower takes over at once.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::Api;

/// client-go's `LeaseDuration`: how long a lease stays valid without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// client-go's `RenewDeadline`: a leader that could not renew for this long
/// stops leading. Shorter than the lease, so that it stops first.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// client-go's `RetryPeriod`: time between attempts.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// One replica's handle on the Lease.
pub struct LeaseLock {
    /// The Lease API in the operator's namespace.
    pub api: Api<Lease>,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a lease stays valid without renewal ([`LEASE_DURATION`]).
    pub duration: Duration,
    /// The lease record as last seen, and when (this replica's clock) it
    /// was first seen so.
    observed: Mutex<Option<(String, Instant)>>,
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(e) if e.code == 409)
}

/// What identifies one renewal of a lease: a change in any of these is a
/// sign of life of its holder.
fn record_of(lease: &Lease) -> String {
    let spec = lease.spec.as_ref();
    format!(
        "{:?}|{:?}|{:?}",
        spec.and_then(|s| s.holder_identity.as_deref()),
        spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
        lease.metadata.resource_version
    )
}

impl LeaseLock {
    /// A handle with client-go's lease duration.
    pub fn new(api: Api<Lease>, name: String, identity: String) -> Self {
        LeaseLock {
            api,
            name,
            identity,
            duration: LEASE_DURATION,
            observed: Mutex::new(None),
        }
    }

    /// One attempt to take or renew the lease; `now` stamps what is
    /// written, `local` is this replica's monotonic clock, which alone
    /// judges expiry. `Ok(true)` when this replica holds it afterwards.
    pub async fn try_acquire_or_renew(
        &self,
        now: Timestamp,
        local: Instant,
    ) -> Result<bool, kube::Error> {
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
        let record = record_of(&lease);
        let unchanged_for = {
            let mut observed = self.observed.lock().unwrap_or_else(|p| p.into_inner());
            let since = observed
                .as_ref()
                .filter(|(seen, _)| *seen == record)
                .map(|(_, since)| *since);
            match since {
                Some(since) => local.saturating_duration_since(since),
                None => {
                    *observed = Some((record, local));
                    Duration::ZERO
                }
            }
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let mine = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let valid_for = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(seconds)).unwrap_or(0),
        );
        let expired = unchanged_for > valid_for;
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
            Ok(written) => {
                *self.observed.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((record_of(&written), local));
                Ok(true)
            }
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until this replica holds the lease, trying every `retry`.
    pub async fn acquire(&self, retry: Duration) {
        loop {
            match self
                .try_acquire_or_renew(Timestamp::now(), Instant::now())
                .await
            {
                Ok(true) => return,
                Ok(false) => tracing::debug!(lease = %self.name, "another replica leads"),
                Err(error) => tracing::warn!(lease = %self.name, %error, "lease unavailable"),
            }
            tokio::time::sleep(retry).await;
        }
    }

    /// Renews the lease every `every` and returns once it could not be
    /// renewed for `deadline` (shorter than the lease) or another replica
    /// holds it.
    pub async fn keep(&self, every: Duration, deadline: Duration) {
        let mut last_renewal = Instant::now();
        loop {
            tokio::time::sleep(every).await;
            let attempt = tokio::time::timeout(
                deadline.saturating_sub(last_renewal.elapsed()),
                self.try_acquire_or_renew(Timestamp::now(), Instant::now()),
            )
            .await;
            match attempt {
                Ok(Ok(true)) => last_renewal = Instant::now(),
                Ok(Ok(false)) => {
                    tracing::error!(lease = %self.name, "leadership lost to another replica");
                    return;
                }
                Ok(Err(error)) => tracing::warn!(lease = %self.name, %error, "lease renewal failed"),
                Err(_) => tracing::warn!(lease = %self.name, "lease renewal timed out"),
            }
            if last_renewal.elapsed() >= deadline {
                tracing::error!(lease = %self.name, ?deadline, "leadership lost: no renewal within the renew deadline");
                return;
            }
        }
    }

    /// Gives the lease up (on shutdown), so that a follower takes it over
    /// at its next attempt instead of waiting for it to expire. Nothing is
    /// written when another replica holds it.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            // Someone wrote it meanwhile: it is not ours to release any more.
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
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
        let lock = LeaseLock::new(
            Api::namespaced(client, "ductile-system"),
            "ductile-operator".to_owned(),
            "op-b".to_owned(),
        );
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
        crate::k8s::tests::rbac::record(request.method(), request.uri());
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
    pub(crate) async fn a_missing_lease_is_created_and_held() {
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
        assert!(lock.try_acquire_or_renew(now(), Instant::now()).await.unwrap());
        let created = server.await.unwrap();
        assert_eq!(created["spec"]["holderIdentity"], "op-b");
        assert_eq!(created["spec"]["leaseDurationSeconds"], 15);
    }

    #[tokio::test]
    pub(crate) async fn a_live_lease_of_another_replica_is_left_alone() {
        let (lock, mut handle) = lock();
        let server = tokio::spawn(async move {
            answer(&mut handle, Method::GET, PATH, StatusCode::OK, |_| {
                lease("op-a", "2025-06-01T11:59:55.000000Z")
            })
            .await;
            drop(handle); // any write would fail the attempt
        });
        assert!(!lock.try_acquire_or_renew(now(), Instant::now()).await.unwrap());
        server.await.unwrap();
    }

    /// The record (holder, renew time, resource version) unchanged for the
    /// lease duration on this replica's clock: the lease is taken over,
    /// with the resource version read, whatever its renewTime says.
    #[tokio::test]
    pub(crate) async fn an_expired_lease_is_taken_over_with_its_resource_version() {
        let (lock, mut handle) = lock();
        let server = tokio::spawn(async move {
            for _ in 0..2 {
                answer(&mut handle, Method::GET, PATH, StatusCode::OK, |_| {
                    lease("op-a", "2025-06-01T11:59:59.000000Z")
                })
                .await;
            }
            answer(&mut handle, Method::PUT, PATH, StatusCode::OK, |b| b).await
        });
        let t0 = Instant::now();
        assert!(
            !lock.try_acquire_or_renew(now(), t0).await.unwrap(),
            "first seen now: valid for its duration from now"
        );
        assert!(lock
            .try_acquire_or_renew(now(), t0 + Duration::from_secs(16))
            .await
            .unwrap());
        let written = server.await.unwrap();
        assert_eq!(
            written["metadata"]["resourceVersion"], "7",
            "a concurrent writer makes this conflict"
        );
        assert_eq!(written["spec"]["holderIdentity"], "op-b");
        assert_eq!(written["spec"]["leaseTransitions"], 3);
    }

    /// Clock skew: a renewTime far in the past (the holder's clock, or
    /// ours, is off) does not expire a lease this replica just saw.
    #[tokio::test]
    async fn an_old_renew_time_alone_does_not_expire_a_lease() {
        let (lock, mut handle) = lock();
        let server = tokio::spawn(async move {
            answer(&mut handle, Method::GET, PATH, StatusCode::OK, |_| {
                lease("op-a", "2025-06-01T10:00:00.000000Z")
            })
            .await;
            drop(handle); // any write would fail the attempt
        });
        assert!(!lock.try_acquire_or_renew(now(), Instant::now()).await.unwrap());
        server.await.unwrap();
    }

    /// A holder that renews keeps its lease: each change restarts the
    /// duration on this replica's clock.
    #[tokio::test]
    async fn a_renewed_lease_is_not_taken_over() {
        let (lock, mut handle) = lock();
        let server = tokio::spawn(async move {
            for renewed in [
                "2025-06-01T11:59:59.000000Z",
                "2025-06-01T12:00:09.000000Z",
                "2025-06-01T12:00:09.000000Z",
            ] {
                answer(&mut handle, Method::GET, PATH, StatusCode::OK, |_| {
                    lease("op-a", renewed)
                })
                .await;
            }
            drop(handle);
        });
        let t0 = Instant::now();
        for after in [0, 10, 20] {
            assert!(!lock
                .try_acquire_or_renew(now(), t0 + Duration::from_secs(after))
                .await
                .unwrap());
        }
        server.await.unwrap();
    }

    /// Shutdown gives the lease up (no holder), so that a follower takes
    /// it at its next attempt; another replica's lease is left alone.
    #[tokio::test]
    pub(crate) async fn stopping_releases_the_lease_it_holds() {
        let (leader, mut handle) = lock();
        let server = tokio::spawn(async move {
            answer(&mut handle, Method::GET, PATH, StatusCode::OK, |_| {
                lease("op-b", "2025-06-01T11:59:59.000000Z")
            })
            .await;
            let released = answer(&mut handle, Method::PUT, PATH, StatusCode::OK, |b| b).await;
            answer(&mut handle, Method::GET, PATH, StatusCode::OK, |_| {
                lease("op-a", "2025-06-01T11:59:59.000000Z")
            })
            .await;
            drop(handle);
            released
        });
        leader.release().await.unwrap();
        leader.release().await.unwrap();
        let released = server.await.unwrap();
        assert_eq!(released["spec"]["holderIdentity"], Value::Null);
        assert_eq!(released["metadata"]["resourceVersion"], "7");

        // A follower takes a released lease at once.
        let (follower, mut handle) = lock();
        let server = tokio::spawn(async move {
            answer(&mut handle, Method::GET, PATH, StatusCode::OK, move |_| {
                let mut l = lease("", "2025-06-01T11:59:59.000000Z");
                l["spec"]["holderIdentity"] = Value::Null;
                l
            })
            .await;
            answer(&mut handle, Method::PUT, PATH, StatusCode::OK, |b| b).await
        });
        assert!(follower
            .try_acquire_or_renew(now(), Instant::now())
            .await
            .unwrap());
        assert_eq!(server.await.unwrap()["spec"]["holderIdentity"], "op-b");
    }

    /// A leader whose renewals fail stops leading after the renew deadline.
    #[tokio::test]
    async fn a_leader_that_cannot_renew_gives_up_at_the_renew_deadline() {
        let (lock, mut handle) = lock();
        let server = tokio::spawn(async move {
            while let Some((_, send)) = handle.next_request().await {
                send.send_response(
                    Response::builder()
                        .status(StatusCode::INTERNAL_SERVER_ERROR)
                        .body(Body::from(serde_json::to_vec(&json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500, "message": "down", "metadata": {}})).unwrap()))
                        .unwrap(),
                );
            }
        });
        let kept = tokio::time::timeout(
            Duration::from_secs(10),
            lock.keep(Duration::from_millis(10), Duration::from_millis(200)),
        )
        .await;
        assert!(kept.is_ok(), "keep() returned: leadership given up");
        server.abort();
    }

    #[tokio::test]
    pub(crate) async fn losing_the_race_for_a_lease_is_not_an_error() {
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
        assert!(!lock.try_acquire_or_renew(now(), Instant::now()).await.unwrap());
        let renewal = server.await.unwrap();
        assert_eq!(renewal["spec"]["transitions"], Value::Null);
        assert_eq!(
            renewal["spec"]["leaseTransitions"], 2,
            "a renewal is not a transition"
        );
    }
}
