//! The operator's Prometheus metrics and the server of its metrics port,
//! with `/healthz` and `/readyz`. The registry, the text format and the
//! HTTP server (hyper, with bounds on connections and request time) are
//! `ductile_coordinator::metrics`, shared with the job's nodes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ductile_coordinator::metrics::prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
};
use ductile_coordinator::metrics::{self as exposition, Limits, Page, Routes, StatusCode};
use tokio::net::TcpListener;

/// Upper bounds (seconds) of the notice-to-commit histogram's buckets.
pub const NOTICE_TO_COMMIT_BUCKETS: [f64; 10] =
    [1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 90.0, 120.0, 300.0, 600.0];

/// Upper bounds (seconds) of the per-signal notice-to-commit histogram,
/// chosen for milliseconds at the low end: an emergency shrink is the
/// operator's processing (milliseconds: the scenario benchmark
/// `bench_notice_to_rescale_request`)
/// plus PE 0's rescale (milliseconds to seconds); a replacement waits for
/// its newcomer's start (tens of seconds).
pub const NOTICE_TO_COMMIT_BY_SIGNAL_BUCKETS: [f64; 20] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
    60.0, 90.0, 120.0, 300.0, 600.0,
];

/// Members whose first notice is remembered at once; beyond, the oldest
/// entries go (a member noticed and never removed by a commit).
const REMEMBERED_NOTICES: usize = 4096;

/// The operator's metrics; cheap to share (`Arc`).
pub struct Metrics {
    registry: Registry,
    reconciles: IntCounter,
    errors: IntCounterVec,
    notices: IntCounterVec,
    requested: IntCounterVec,
    committed: IntCounterVec,
    failed: IntCounterVec,
    ended: IntCounterVec,
    notice_to_commit: Histogram,
    notice_to_commit_by_signal: HistogramVec,
    /// The kind of each member's first notice, until a commit removes it.
    first_notice: Mutex<BTreeMap<String, String>>,
}

impl Default for Metrics {
    /// Metrics in a registry of their own (tests; a process uses
    /// [`Metrics::process`]).
    fn default() -> Self {
        Metrics::in_registry(Registry::new())
    }
}

impl Metrics {
    /// The operator's metrics in the process's registry. Call it once.
    pub fn process() -> Self {
        Metrics::in_registry(exposition::registry().clone())
    }

    /// The operator's metrics, registered in `registry`.
    pub fn in_registry(registry: Registry) -> Self {
        let counters = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, help), &[label]).expect("a valid counter")
        };
        let m = Metrics {
            reconciles: IntCounter::new(
                "ductile_operator_reconciles_total",
                "Reconciles of ElasticJobs started.",
            )
            .expect("a valid counter"),
            errors: counters(
                "ductile_operator_reconcile_errors_total",
                "Reconciles that failed, by error class.",
                "error",
            ),
            notices: counters(
                "ductile_operator_notices_total",
                "Interruption notices, rebalance recommendations and other notices seen for job members, by kind.",
                "kind",
            ),
            requested: counters(
                "ductile_operator_rescales_requested_total",
                "Rescales requested from PE 0, by reason.",
                "reason",
            ),
            committed: counters(
                "ductile_operator_rescales_committed_total",
                "Rescales committed, by reason.",
                "reason",
            ),
            failed: counters(
                "ductile_operator_rescales_failed_total",
                "Rescales that failed, by reason.",
                "reason",
            ),
            ended: counters(
                "ductile_operator_jobs_ended_total",
                "ElasticJobs that ended, by phase (Succeeded, Failed).",
                "phase",
            ),
            notice_to_commit: Histogram::with_opts(
                HistogramOpts::new(
                    "ductile_operator_notice_to_commit_seconds",
                    "Time from a member's first notice to the commit of the rescale that removed it.",
                )
                .buckets(NOTICE_TO_COMMIT_BUCKETS.to_vec()),
            )
            .expect("a valid histogram"),
            notice_to_commit_by_signal: HistogramVec::new(
                HistogramOpts::new(
                    "ductile_operator_notice_to_commit_by_signal_seconds",
                    "Time from a member's first notice to the commit of the rescale that removed it, by the kind of that notice (the signal).",
                )
                .buckets(NOTICE_TO_COMMIT_BY_SIGNAL_BUCKETS.to_vec()),
                &["signal"],
            )
            .expect("a valid histogram"),
            first_notice: Mutex::new(BTreeMap::new()),
            registry,
        };
        let families: [Box<dyn exposition::prometheus::core::Collector>; 9] = [
            Box::new(m.reconciles.clone()),
            Box::new(m.errors.clone()),
            Box::new(m.notices.clone()),
            Box::new(m.requested.clone()),
            Box::new(m.committed.clone()),
            Box::new(m.failed.clone()),
            Box::new(m.ended.clone()),
            Box::new(m.notice_to_commit.clone()),
            Box::new(m.notice_to_commit_by_signal.clone()),
        ];
        for family in families {
            exposition::register(&m.registry, family);
        }
        m
    }

    /// The registry the metrics are in.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// A job ended in `phase` (Succeeded or Failed); counted once per job,
    /// when its status first says so.
    pub fn job_ended(&self, phase: &str) {
        self.ended.with_label_values(&[phase]).inc();
    }

    /// One reconcile started.
    pub fn reconcile(&self) {
        self.reconciles.inc();
    }

    /// A reconcile failed; `kind` is a short error class (`kube`, `secret`...).
    pub fn error(&self, kind: &str) {
        self.errors.with_label_values(&[kind]).inc();
    }

    /// A notice (interruption, rebalance recommendation...) was seen for a member.
    pub fn notice(&self, kind: &str) {
        self.notices.with_label_values(&[kind]).inc();
    }

    /// A notice of `kind` was seen for `member`: counted, and its kind kept
    /// if it is the member's first, for [`Metrics::notice_to_commit_for`].
    pub fn member_notice(&self, member: &str, kind: &str) {
        self.notice(kind);
        let mut first = self.first_notice.lock().unwrap_or_else(|p| p.into_inner());
        if !first.contains_key(member) {
            while first.len() >= REMEMBERED_NOTICES {
                first.pop_first();
            }
            first.insert(member.to_owned(), kind.to_owned());
        }
    }

    /// A rescale was requested, for `reason`.
    pub fn rescale_requested(&self, reason: &str) {
        self.requested.with_label_values(&[reason]).inc();
    }

    /// A rescale requested for `reason` committed.
    pub fn rescale_committed(&self, reason: &str) {
        self.committed.with_label_values(&[reason]).inc();
    }

    /// A rescale requested for `reason` failed.
    pub fn rescale_failed(&self, reason: &str) {
        self.failed.with_label_values(&[reason]).inc();
    }

    /// Seconds from a member's first notice to the commit of the rescale that removed it.
    pub fn notice_to_commit(&self, seconds: f64) {
        self.notice_to_commit.observe(seconds);
    }

    /// [`Metrics::notice_to_commit`] for `member`, also by the kind of its
    /// first notice (`unknown` when none was recorded with
    /// [`Metrics::member_notice`]).
    pub fn notice_to_commit_for(&self, member: &str, seconds: f64) {
        self.notice_to_commit(seconds);
        let signal = self
            .first_notice
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(member)
            .unwrap_or_else(|| "unknown".to_owned());
        self.notice_to_commit_by_signal
            .with_label_values(&[signal.as_str()])
            .observe(seconds);
    }

    /// Every sample name the operator can export (histograms as their
    /// `_bucket`, `_sum` and `_count`): what a dashboard may query.
    pub fn exported_series() -> Vec<String> {
        let m = Metrics::default();
        m.reconcile();
        m.error("e");
        m.member_notice("m", "k");
        m.rescale_requested("r");
        m.rescale_committed("r");
        m.rescale_failed("r");
        m.job_ended("Failed");
        m.notice_to_commit_for("m", 1.0);
        exposition::series_names(&m.registry.gather())
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        exposition::render(&self.registry)
    }
}

/// The routes of the operator's port: `/metrics`, `/healthz` (always 200)
/// and `/readyz` (200 once `ready` is set, 503 before).
fn routes(metrics: Arc<Metrics>, ready: Arc<AtomicBool>) -> Routes {
    Arc::new(move |path| match path {
        "/metrics" => Some(Page::metrics(metrics.registry())),
        "/healthz" => Some(Page::text(StatusCode::OK, "ok\n")),
        "/readyz" if ready.load(Ordering::Relaxed) => Some(Page::text(StatusCode::OK, "ready\n")),
        "/readyz" => Some(Page::text(StatusCode::SERVICE_UNAVAILABLE, "starting\n")),
        _ => None,
    })
}

/// Serves `GET /metrics`, `/healthz` and `/readyz` on `listener` until the
/// task is dropped, within the default [`Limits`]; anything else gets 404
/// or 405, and bytes that are not HTTP 400.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, ready: Arc<AtomicBool>) {
    exposition::serve(listener, Limits::default(), routes(metrics, ready)).await
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn get(addr: SocketAddr, path: &str) -> (String, String) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).await.unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        (head.to_owned(), body.to_owned())
    }

    #[tokio::test]
    async fn the_metrics_endpoint_serves_counters_and_the_histograms_over_http() {
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
        metrics.member_notice("pod-a", "spot-itn");
        metrics.member_notice("pod-b", "rebalance-recommendation");
        metrics.notice("rebalance-recommendation");
        // A later notice of another kind does not change pod-a's signal.
        metrics.member_notice("pod-a", "rebalance-recommendation");
        metrics.rescale_requested("Emergency");
        metrics.rescale_committed("Emergency");
        metrics.rescale_requested("ScaleUp");
        metrics.rescale_failed("ScaleUp");
        metrics.notice_to_commit_for("pod-a", 0.5);
        metrics.notice_to_commit_for("pod-b", 200.0);
        metrics.notice_to_commit(7.5);

        let (head, body) = get(addr, "/metrics").await;
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(head.contains("text/plain; version=0.0.4"), "{head}");
        for line in [
            "ductile_operator_reconciles_total 2",
            "ductile_operator_reconcile_errors_total{error=\"kube\"} 1",
            "ductile_operator_notices_total{kind=\"spot-itn\"} 1",
            "ductile_operator_notices_total{kind=\"rebalance-recommendation\"} 3",
            "ductile_operator_rescales_requested_total{reason=\"Emergency\"} 1",
            "ductile_operator_rescales_requested_total{reason=\"ScaleUp\"} 1",
            "ductile_operator_rescales_committed_total{reason=\"Emergency\"} 1",
            "ductile_operator_rescales_failed_total{reason=\"ScaleUp\"} 1",
            "ductile_operator_notice_to_commit_seconds_bucket{le=\"1\"} 1",
            "ductile_operator_notice_to_commit_seconds_bucket{le=\"5\"} 1",
            "ductile_operator_notice_to_commit_seconds_bucket{le=\"10\"} 2",
            "ductile_operator_notice_to_commit_seconds_bucket{le=\"300\"} 3",
            "ductile_operator_notice_to_commit_seconds_bucket{le=\"+Inf\"} 3",
            "ductile_operator_notice_to_commit_seconds_sum 208",
            "ductile_operator_notice_to_commit_seconds_count 3",
            "# TYPE ductile_operator_notice_to_commit_seconds histogram",
            "ductile_operator_notice_to_commit_by_signal_seconds_bucket{signal=\"spot-itn\",le=\"0.5\"} 1",
            "ductile_operator_notice_to_commit_by_signal_seconds_count{signal=\"spot-itn\"} 1",
            "ductile_operator_notice_to_commit_by_signal_seconds_count{signal=\"rebalance-recommendation\"} 1",
            "ductile_operator_notice_to_commit_by_signal_seconds_sum{signal=\"rebalance-recommendation\"} 200",
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
