//! A node's Prometheus metrics on `GET /metrics` (`DUCTILE_METRICS`, see
//! docs/metrics.md): the job as this node sees it, its GPUs, and on node 0
//! (where rescales are served) every rescale's outcome and stage times, with
//! the GPU work inside the stages as series of their own.
//!
//! Every node serves them when the variable is set: a newcomer from the start,
//! so its GPU start-up (paid while it waits, off the rescale's critical path)
//! can be scraped before it is admitted.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use ductile_coordinator::control::RescaleReport;
use ductile_coordinator::metrics::{
    head_complete, parse_request, reply, Exposition, Histogram, Request, Summary, CONTENT_TYPE,
    MAX_REQUEST_HEAD,
};
use tracing::debug;

use crate::node::NodeShared;

/// Upper bounds (seconds) of the rescale-mechanism histogram's buckets.
pub const MECHANISM_BUCKETS: [f64; 12] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
];

/// GPU work a rescale report may name (`RescaleReport::gpu`); each gets a
/// series from the first rescale on, zero where there was none.
pub const GPU_WORK: [&str; 2] = ["staging", "context"];

/// How a rescale request ended, the `outcome` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Committed: the job runs in a new epoch.
    Committed,
    /// Refused before anything stopped (invalid, busy, nothing to admit).
    Refused,
    /// Began and did not complete.
    Failed,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Committed => "committed",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
        }
    }
}

struct Rescales {
    outcomes: BTreeMap<String, u64>,
    stages: BTreeMap<String, Summary>,
    gpu: BTreeMap<String, Summary>,
    mechanism: Histogram,
    migrations: u64,
}

impl Rescales {
    fn new() -> Self {
        Rescales {
            outcomes: BTreeMap::new(),
            stages: BTreeMap::new(),
            gpu: BTreeMap::new(),
            mechanism: Histogram::new(&MECHANISM_BUCKETS),
            migrations: 0,
        }
    }

    fn ended(&mut self, outcome: Outcome) {
        *self.outcomes.entry(outcome.label().into()).or_default() += 1;
    }

    fn committed(&mut self, report: &RescaleReport) {
        self.ended(Outcome::Committed);
        for s in &report.stages {
            self.stages
                .entry(s.stage.clone())
                .or_default()
                .observe(s.ms / 1e3);
        }
        // One observation per kind and rescale: the known kinds always
        // (zero where there was none), any other kind the report names.
        let mut gpu_ms: BTreeMap<&str, f64> = GPU_WORK.iter().map(|&w| (w, 0.0)).collect();
        for g in &report.gpu {
            *gpu_ms.entry(&g.stage).or_default() += g.ms;
        }
        for (work, ms) in gpu_ms {
            self.gpu.entry(work.into()).or_default().observe(ms / 1e3);
        }
        self.mechanism.observe(report.mechanism_ms / 1e3);
        self.migrations += report.migrations;
    }

    /// Nothing before the first request: only node 0 serves rescales.
    fn write(&self, page: &mut Exposition) {
        if self.outcomes.is_empty() {
            return;
        }
        page.counters_by(
            "ductile_rescales_total",
            "Rescale requests served by this node (node 0), by outcome: committed, refused, failed.",
            "outcome",
            &self.outcomes,
        )
        .summaries_by(
            "ductile_rescale_stage_seconds",
            "Time of each stage of committed rescales (docs/elasticity.md), by stage.",
            "stage",
            &self.stages,
        )
        .summaries_by(
            "ductile_rescale_gpu_seconds",
            "GPU work inside the stages of committed rescales, by kind: staging (device buffers of migrated chares, summed over PEs) and context (contexts created on the critical path; zero unless measuring).",
            "work",
            &self.gpu,
        )
        .histogram(
            "ductile_rescale_mechanism_seconds",
            "The rescale mechanism's time (every stage but evacuate and balance) of committed rescales.",
            &self.mechanism,
        )
        .single(
            "ductile_rescale_migrations_total",
            "Chares migrated by the evacuations and balancing steps of committed rescales.",
            "counter",
            self.migrations,
        );
    }
}

/// This process's rescale records.
static RESCALES: LazyLock<Mutex<Rescales>> = LazyLock::new(|| Mutex::new(Rescales::new()));

fn rescales<R>(f: impl FnOnce(&mut Rescales) -> R) -> R {
    // A panic elsewhere while holding the lock leaves counters usable.
    f(&mut RESCALES.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Records a rescale request that ended without a report.
pub(crate) fn rescale_ended(outcome: Outcome) {
    rescales(|r| r.ended(outcome));
}

/// Records a committed rescale.
pub(crate) fn rescale_committed(report: &RescaleReport) {
    rescales(|r| r.committed(report));
}

/// The page: what `GET /metrics` answers.
pub(crate) fn render(node: &NodeShared) -> String {
    let mut page = Exposition::new();
    let topo = node.topology_now();
    let local_pes = node.inboxes.len();
    page.single(
        "ductile_node_pes",
        "PEs (scheduler threads) this process runs.",
        "gauge",
        local_pes,
    );
    page.single(
        "ductile_node_member",
        "1 once this node is a member of the job (0 while a newcomer waits).",
        "gauge",
        u8::from(topo.is_some()),
    );
    if let Some(t) = &topo {
        page.single(
            "ductile_node_id",
            "This node's id in the current view (ids are renumbered by rescales).",
            "gauge",
            t.my_node(),
        )
        .single(
            "ductile_job_epoch",
            "The job's membership epoch.",
            "gauge",
            t.epoch(),
        )
        .single(
            "ductile_job_nodes",
            "Nodes in the job.",
            "gauge",
            t.num_nodes(),
        )
        .single("ductile_job_pes", "PEs in the job.", "gauge", t.num_pes());
    }
    gpu_section(&mut page);
    rescales(|r| r.write(&mut page));
    page.finish()
}

fn gpu_section(page: &mut Exposition) {
    let Some(start) = crate::gpu::start_times() else {
        return;
    };
    page.single(
        "ductile_gpu_devices",
        "GPUs this process uses.",
        "gauge",
        start.devices,
    )
    .single(
        "ductile_gpu_contexts_created_total",
        "CUDA contexts this process created; one per device at start, and no more: rescales keep them.",
        "counter",
        crate::gpu::contexts_created(),
    );
    let name = "ductile_gpu_start_seconds";
    page.family(
        name,
        "GPU start-up of this process by step (a newcomer pays it while it waits, before admission).",
        "gauge",
    );
    for (step, seconds) in [
        ("context", start.context_s),
        ("compile", start.compile_s),
        ("load", start.load_s),
    ] {
        page.sample(name, &[("step", step)], seconds);
    }
}

/// Binds `listen` and serves `/metrics` from a thread; writes the bound
/// address to `addr_file` (atomically) when given.
pub(crate) fn start(
    listen: SocketAddr,
    addr_file: Option<PathBuf>,
    node: Arc<NodeShared>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(listen)?;
    let bound = listener.local_addr()?;
    if let Some(path) = addr_file {
        crate::files::write_atomically(&path, bound.to_string())?;
    }
    std::thread::Builder::new()
        .name("ductile-metrics".into())
        .spawn(move || {
            // One scrape at a time: a scrape is a few kilobytes, and a slow
            // client times out rather than holding the thread.
            for stream in listener.incoming().flatten() {
                if let Err(e) = serve(stream, &node) {
                    debug!("metrics request failed: {e}");
                }
            }
        })?;
    Ok(bound)
}

fn serve(mut stream: TcpStream, node: &NodeShared) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !head_complete(&head) && head.len() < MAX_REQUEST_HEAD {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let (status, content_type, body) = match parse_request(&head) {
        Request::Get(path) if path == "/metrics" => ("200 OK", CONTENT_TYPE, render(node)),
        Request::Get(_) => ("404 Not Found", "text/plain", "not found\n".into()),
        Request::Other(_) => ("405 Method Not Allowed", "text/plain", "only GET\n".into()),
        Request::Malformed => (
            "400 Bad Request",
            "text/plain",
            "not an HTTP request\n".into(),
        ),
    };
    stream.write_all(reply(status, content_type, &body).as_bytes())?;
    stream.shutdown(std::net::Shutdown::Write)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ductile_coordinator::control::StageTime;

    fn stage(stage: &str, ms: f64) -> StageTime {
        StageTime {
            stage: stage.into(),
            ms,
        }
    }

    fn report(stages: Vec<StageTime>, gpu: Vec<StageTime>, mechanism_ms: f64) -> RescaleReport {
        RescaleReport {
            epoch_before: 1,
            epoch: 2,
            removed: vec![2],
            admitted: vec![],
            pes_before: 3,
            pes: 2,
            migrations: 5,
            stages,
            mechanism_ms,
            total_ms: mechanism_ms + 1.0,
            gpu,
        }
    }

    #[test]
    fn rescales_are_counted_by_outcome_and_gpu_work_has_series_of_its_own() {
        let mut r = Rescales::new();
        let mut page = Exposition::new();
        r.write(&mut page);
        assert_eq!(page.finish(), "", "no rescale served: no rescale families");

        r.ended(Outcome::Refused);
        r.committed(&report(
            vec![stage("stop", 2.0), stage("reentry", 1.0)],
            vec![stage("staging", 4.0)],
            3.0,
        ));
        // A CPU job: no GPU work, yet both kinds get a zero observation.
        r.committed(&report(vec![stage("stop", 0.5)], vec![], 0.5));
        r.ended(Outcome::Failed);
        let mut page = Exposition::new();
        r.write(&mut page);
        let text = page.finish();
        for line in [
            "ductile_rescales_total{outcome=\"committed\"} 2",
            "ductile_rescales_total{outcome=\"refused\"} 1",
            "ductile_rescales_total{outcome=\"failed\"} 1",
            "ductile_rescale_stage_seconds_sum{stage=\"stop\"} 0.0025",
            "ductile_rescale_stage_seconds_count{stage=\"stop\"} 2",
            "ductile_rescale_stage_seconds_count{stage=\"reentry\"} 1",
            "ductile_rescale_gpu_seconds_sum{work=\"staging\"} 0.004",
            "ductile_rescale_gpu_seconds_count{work=\"staging\"} 2",
            "ductile_rescale_gpu_seconds_sum{work=\"context\"} 0",
            "ductile_rescale_gpu_seconds_count{work=\"context\"} 2",
            "ductile_rescale_mechanism_seconds_bucket{le=\"0.001\"} 1",
            "ductile_rescale_mechanism_seconds_bucket{le=\"0.005\"} 2",
            "ductile_rescale_mechanism_seconds_count 2",
            "ductile_rescale_migrations_total 10",
            "# TYPE ductile_rescale_gpu_seconds summary",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn the_gpu_section_appears_once_the_gpus_started_and_counts_contexts() {
        // The only test of this binary that starts "GPUs": the records are
        // process-wide, as they are in a node.
        let mut page = Exposition::new();
        gpu_section(&mut page);
        assert_eq!(page.finish(), "", "no GPUs started: no GPU section");
        crate::gpu::record_start(crate::gpu::StartTimes {
            devices: 2,
            context_s: 0.25,
            compile_s: 0.5,
            load_s: 0.125,
        });
        crate::gpu::context_created();
        crate::gpu::context_created();
        let mut page = Exposition::new();
        gpu_section(&mut page);
        let text = page.finish();
        for line in [
            "ductile_gpu_devices 2",
            "ductile_gpu_contexts_created_total 2",
            "ductile_gpu_start_seconds{step=\"context\"} 0.25",
            "ductile_gpu_start_seconds{step=\"compile\"} 0.5",
            "ductile_gpu_start_seconds{step=\"load\"} 0.125",
            "# TYPE ductile_gpu_start_seconds gauge",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
