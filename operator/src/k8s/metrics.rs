//! The operator's Prometheus metrics and the small HTTP server that serves
//! them with `/healthz` and `/readyz`. The text format is
//! `ductile_coordinator::metrics`, shared with the job's nodes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ductile_coordinator::metrics::{
    head_complete, parse_request, reply, Exposition, Histogram, Request, CONTENT_TYPE,
    MAX_REQUEST_HEAD,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Upper bounds (seconds) of the notice-to-commit histogram's buckets.
pub const NOTICE_TO_COMMIT_BUCKETS: [f64; 10] =
    [1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 90.0, 120.0, 300.0, 600.0];

struct Inner {
    reconciles: u64,
    errors: BTreeMap<String, u64>,
    notices: BTreeMap<String, u64>,
    requested: BTreeMap<String, u64>,
    committed: BTreeMap<String, u64>,
    failed: BTreeMap<String, u64>,
    notice_to_commit: Histogram,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            reconciles: 0,
            errors: BTreeMap::new(),
            notices: BTreeMap::new(),
            requested: BTreeMap::new(),
            committed: BTreeMap::new(),
            failed: BTreeMap::new(),
            notice_to_commit: Histogram::new(&NOTICE_TO_COMMIT_BUCKETS),
        }
    }
}

/// The operator's metrics; cheap to share (`Arc`).
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        // A panic while holding the lock leaves counters usable: take them anyway.
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// One reconcile started.
    pub fn reconcile(&self) {
        self.with(|m| m.reconciles += 1);
    }

    /// A reconcile failed; `kind` is a short error class (`kube`, `secret`...).
    pub fn error(&self, kind: &str) {
        self.with(|m| *m.errors.entry(kind.to_owned()).or_default() += 1);
    }

    /// A notice (interruption, rebalance recommendation...) was seen for a member.
    pub fn notice(&self, kind: &str) {
        self.with(|m| *m.notices.entry(kind.to_owned()).or_default() += 1);
    }

    /// A rescale was requested, for `reason`.
    pub fn rescale_requested(&self, reason: &str) {
        self.with(|m| *m.requested.entry(reason.to_owned()).or_default() += 1);
    }

    /// A rescale requested for `reason` committed.
    pub fn rescale_committed(&self, reason: &str) {
        self.with(|m| *m.committed.entry(reason.to_owned()).or_default() += 1);
    }

    /// A rescale requested for `reason` failed.
    pub fn rescale_failed(&self, reason: &str) {
        self.with(|m| *m.failed.entry(reason.to_owned()).or_default() += 1);
    }

    /// Seconds from a member's first notice to the commit of the rescale that removed it.
    pub fn notice_to_commit(&self, seconds: f64) {
        self.with(|m| m.notice_to_commit.observe(seconds));
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        self.with(|m| {
            let mut page = Exposition::new();
            page.single(
                "ductile_operator_reconciles_total",
                "Reconciles of ElasticJobs started.",
                "counter",
                m.reconciles,
            )
            .counters_by(
                "ductile_operator_reconcile_errors_total",
                "Reconciles that failed, by error class.",
                "error",
                &m.errors,
            )
            .counters_by(
                "ductile_operator_notices_total",
                "Interruption notices, rebalance recommendations and other notices seen for job members, by kind.",
                "kind",
                &m.notices,
            )
            .counters_by(
                "ductile_operator_rescales_requested_total",
                "Rescales requested from PE 0, by reason.",
                "reason",
                &m.requested,
            )
            .counters_by(
                "ductile_operator_rescales_committed_total",
                "Rescales committed, by reason.",
                "reason",
                &m.committed,
            )
            .counters_by(
                "ductile_operator_rescales_failed_total",
                "Rescales that failed, by reason.",
                "reason",
                &m.failed,
            )
            .histogram(
                "ductile_operator_notice_to_commit_seconds",
                "Time from a member's first notice to the commit of the rescale that removed it.",
                &m.notice_to_commit,
            );
            page.finish()
        })
    }
}

/// Serves `GET /metrics`, `/healthz` (always 200) and `/readyz` (200 once
/// `ready` is set) on `listener` until the task is dropped. One request per
/// connection; anything else gets 404, 405 or 400.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, ready: Arc<AtomicBool>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(1024);
            let mut chunk = [0u8; 1024];
            // Read the request head (bounded); the body, if any, is ignored.
            while !head_complete(&buf) && buf.len() < MAX_REQUEST_HEAD {
                match tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    stream.read(&mut chunk),
                )
                .await
                {
                    Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                    _ => return,
                }
            }
            let (status, content_type, body) = match parse_request(&buf) {
                Request::Get(path) => match path.as_str() {
                    "/metrics" => ("200 OK", CONTENT_TYPE, metrics.render()),
                    "/healthz" => ("200 OK", "text/plain", "ok\n".to_owned()),
                    "/readyz" if ready.load(Ordering::Relaxed) => {
                        ("200 OK", "text/plain", "ready\n".to_owned())
                    }
                    "/readyz" => (
                        "503 Service Unavailable",
                        "text/plain",
                        "starting\n".to_owned(),
                    ),
                    _ => ("404 Not Found", "text/plain", "not found\n".to_owned()),
                },
                Request::Other(_) => (
                    "405 Method Not Allowed",
                    "text/plain",
                    "only GET\n".to_owned(),
                ),
                Request::Malformed => (
                    "400 Bad Request",
                    "text/plain",
                    "not an HTTP request\n".to_owned(),
                ),
            };
            let _ = stream
                .write_all(reply(status, content_type, &body).as_bytes())
                .await;
            let _ = stream.shutdown().await;
        });
    }
}

/// Binds `addr` and serves the metrics on it in a background task; returns
/// the bound address.
pub async fn spawn_server(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(serve(listener, metrics, ready));
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpStream;

    async fn get(addr: SocketAddr, path: &str) -> (String, String) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).await.unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        (head.to_owned(), body.to_owned())
    }

    #[tokio::test]
    async fn the_metrics_endpoint_serves_counters_and_the_histogram_over_http() {
        let metrics = Arc::new(Metrics::default());
        let ready = Arc::new(AtomicBool::new(false));
        let addr = spawn_server(
            "127.0.0.1:0".parse().unwrap(),
            metrics.clone(),
            ready.clone(),
        )
        .await
        .unwrap();

        metrics.reconcile();
        metrics.reconcile();
        metrics.error("kube");
        metrics.notice("spot-itn");
        metrics.notice("rebalance-recommendation");
        metrics.notice("rebalance-recommendation");
        metrics.rescale_requested("Emergency");
        metrics.rescale_committed("Emergency");
        metrics.rescale_requested("ScaleUp");
        metrics.rescale_failed("ScaleUp");
        metrics.notice_to_commit(7.5);
        metrics.notice_to_commit(200.0);

        let (head, body) = get(addr, "/metrics").await;
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(head.contains("text/plain; version=0.0.4"), "{head}");
        for line in [
            "ductile_operator_reconciles_total 2",
            "ductile_operator_reconcile_errors_total{error=\"kube\"} 1",
            "ductile_operator_notices_total{kind=\"spot-itn\"} 1",
            "ductile_operator_notices_total{kind=\"rebalance-recommendation\"} 2",
            "ductile_operator_rescales_requested_total{reason=\"Emergency\"} 1",
            "ductile_operator_rescales_requested_total{reason=\"ScaleUp\"} 1",
            "ductile_operator_rescales_committed_total{reason=\"Emergency\"} 1",
            "ductile_operator_rescales_failed_total{reason=\"ScaleUp\"} 1",
            "ductile_operator_notice_to_commit_seconds_bucket{le=\"5\"} 0",
            "ductile_operator_notice_to_commit_seconds_bucket{le=\"10\"} 1",
            "ductile_operator_notice_to_commit_seconds_bucket{le=\"120\"} 1",
            "ductile_operator_notice_to_commit_seconds_bucket{le=\"300\"} 2",
            "ductile_operator_notice_to_commit_seconds_bucket{le=\"+Inf\"} 2",
            "ductile_operator_notice_to_commit_seconds_sum 207.5",
            "ductile_operator_notice_to_commit_seconds_count 2",
            "# TYPE ductile_operator_notice_to_commit_seconds histogram",
        ] {
            assert!(
                body.lines().any(|l| l == line),
                "missing {line:?} in\n{body}"
            );
        }
        // Every sample line belongs to a declared family.
        for line in body.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            let family = name
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(body.contains(&format!("# TYPE {family} ")), "{line}");
        }

        let (head, _) = get(addr, "/readyz").await;
        assert!(head.starts_with("HTTP/1.1 503"), "{head}");
        ready.store(true, Ordering::Relaxed);
        let (head, _) = get(addr, "/readyz").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let (head, body) = get(addr, "/healthz").await;
        assert!(head.starts_with("HTTP/1.1 200") && body == "ok\n", "{head}");
        let (head, _) = get(addr, "/nope").await;
        assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    }
}
