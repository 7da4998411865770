//! A node's Prometheus endpoint on `GET /metrics` (`DUCTILE_METRICS`, see
//! docs/metrics.md): the job as this node sees it, its GPUs, the program's
//! progress (`Ctx::report_progress`), the transport's traffic, and on node 0
//! (where rescales and load balancing are decided) every rescale's outcome
//! and stage times, with the GPU work inside the stages as series of their
//! own, and every load-balancing step's time and migrations.
//!
//! Everything is in the process's one registry
//! (`ductile_coordinator::metrics::registry`). Series that describe state
//! the node keeps anyway (its view, its GPUs) are computed at scrape time;
//! the hot path (a frame sent or received) adds to relaxed atomics spread
//! over cache lines, one per thread slot, that a scrape sums.
//!
//! Every node serves them when the variable is set: a newcomer from the start,
//! so its GPU start-up (paid while it waits, off the rescale's critical path)
//! can be scraped before it is admitted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Weak};

use ductile_coordinator::control::RescaleReport;
use ductile_coordinator::metrics::prometheus::core::{Collector, Desc};
use ductile_coordinator::metrics::prometheus::proto::MetricFamily;
use ductile_coordinator::metrics::prometheus::{GaugeVec, IntCounter, IntGauge, Opts, Registry};
use ductile_coordinator::metrics::{self as exposition, Limits, Routes};

use crate::activity::{Outcome, Rescales, PROGRESS, RESCALES};
use crate::node::NodeShared;
use crate::traffic::TRAFFIC;

/// The job as this node sees it, and its GPUs.
struct NodeCollector {
    node: Weak<NodeShared>,
    pes: IntGauge,
    member: IntGauge,
    id: IntGauge,
    epoch: IntGauge,
    nodes: IntGauge,
    job_pes: IntGauge,
    gpu_devices: IntGauge,
    gpu_contexts: IntCounter,
    gpu_start: GaugeVec,
    pe_wakeups: IntCounter,
    pe_sleeps: IntCounter,
    descs: Vec<Desc>,
}

impl NodeCollector {
    fn new(node: Weak<NodeShared>) -> Self {
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("a valid gauge");
        let mut c = NodeCollector {
            node,
            pes: gauge("ductile_node_pes", "PEs (scheduler threads) this process runs."),
            member: gauge(
                "ductile_node_member",
                "1 once this node is a member of the job (0 while a newcomer waits).",
            ),
            id: gauge(
                "ductile_node_id",
                "This node's id in the current view (ids are renumbered by rescales).",
            ),
            epoch: gauge("ductile_job_epoch", "The job's membership epoch."),
            nodes: gauge("ductile_job_nodes", "Nodes in the job."),
            job_pes: gauge("ductile_job_pes", "PEs in the job."),
            gpu_devices: gauge("ductile_gpu_devices", "GPUs this process uses."),
            gpu_contexts: IntCounter::new(
                "ductile_gpu_contexts_created_total",
                "CUDA contexts this process created; one per device at start, and no more: rescales keep them.",
            )
            .expect("a valid counter"),
            gpu_start: GaugeVec::new(
                Opts::new(
                    "ductile_gpu_start_seconds",
                    "GPU start-up of this process by step (a newcomer pays it while it waits, before admission).",
                ),
                &["step"],
            )
            .expect("a valid gauge"),
            pe_wakeups: IntCounter::new(
                "ductile_pe_wakeups_total",
                "Wake-ups of this node's sleeping PEs paid by senders (a message pushed to a PE that slept); a push to a PE that is awake costs none.",
            )
            .expect("a valid counter"),
            pe_sleeps: IntCounter::new(
                "ductile_pe_sleeps_total",
                "Times this node's idle PEs blocked (after their spin); each ends with a message, a timer or the node's abort.",
            )
            .expect("a valid counter"),
            descs: Vec::new(),
        };
        let metrics: [&dyn Collector; 11] = [
            &c.pes,
            &c.member,
            &c.id,
            &c.epoch,
            &c.nodes,
            &c.job_pes,
            &c.gpu_devices,
            &c.gpu_contexts,
            &c.gpu_start,
            &c.pe_wakeups,
            &c.pe_sleeps,
        ];
        let descs = metrics.iter().flat_map(|m| m.desc()).cloned().collect();
        c.descs = descs;
        c
    }

    /// The GPU section: nothing until GPUs started.
    fn gpu(&self) -> Vec<MetricFamily> {
        let Some(start) = crate::gpu::start_times() else {
            return Vec::new();
        };
        self.gpu_devices.set(start.devices as i64);
        let contexts = self.gpu_contexts.clone();
        contexts.reset();
        contexts.inc_by(crate::gpu::contexts_created() as u64);
        for (step, seconds) in [
            ("context", start.context_s),
            ("compile", start.compile_s),
            ("load", start.load_s),
        ] {
            self.gpu_start.with_label_values(&[step]).set(seconds);
        }
        [
            self.gpu_devices.collect(),
            contexts.collect(),
            self.gpu_start.collect(),
        ]
        .concat()
    }
}

impl Collector for NodeCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Some(node) = self.node.upgrade() else {
            return Vec::new();
        };
        let topo = node.topology_now();
        self.pes.set(node.inboxes.len() as i64);
        self.member.set(i64::from(topo.is_some()));
        let (wakeups, sleeps) = node.pe_sleep_counts();
        for (c, v) in [(&self.pe_wakeups, wakeups), (&self.pe_sleeps, sleeps)] {
            c.reset();
            c.inc_by(v);
        }
        let mut out = [
            self.pes.collect(),
            self.member.collect(),
            self.pe_wakeups.collect(),
            self.pe_sleeps.collect(),
        ]
        .concat();
        // A newcomer has no id, epoch or job yet: those stay out.
        if let Some(t) = &topo {
            self.id.set(i64::from(t.my_node()));
            self.epoch.set(t.epoch() as i64);
            self.nodes.set(t.num_nodes() as i64);
            self.job_pes.set(t.num_pes() as i64);
            for g in [&self.id, &self.epoch, &self.nodes, &self.job_pes] {
                out.extend(g.collect());
            }
        }
        out.extend(self.gpu());
        out
    }
}

/// Every sample name a node can export (histograms as their `_bucket`,
/// `_sum` and `_count`), from the collectors themselves: what a dashboard
/// or an alert may query (docs/metrics.md).
pub fn exported_series() -> Vec<String> {
    let registry = Registry::new();
    let r = Rescales::new();
    r.register(&registry);
    r.ended(Outcome::Refused);
    r.committed(&RescaleReport {
        epoch_before: 1,
        epoch: 2,
        removed: Vec::new(),
        admitted: Vec::new(),
        pes_before: 1,
        pes: 1,
        migrations: 0,
        stages: Vec::new(),
        mechanism_ms: 0.0,
        total_ms: 0.0,
        gpu: Vec::new(),
    });
    r.stages.with_label_values(&["stop"]).observe(0.0);
    r.lb_step(false, 0.0, 0, 0);
    let mut families = registry.gather();
    let node = NodeCollector::new(Weak::new());
    node.gpu_start.with_label_values(&["context"]).set(0.0);
    let singles: [&dyn Collector; 11] = [
        &node.pes,
        &node.member,
        &node.id,
        &node.epoch,
        &node.nodes,
        &node.job_pes,
        &node.gpu_devices,
        &node.gpu_contexts,
        &node.gpu_start,
        &node.pe_wakeups,
        &node.pe_sleeps,
    ];
    for c in singles {
        families.extend(c.collect());
    }
    // Scratch families, refilled by every scrape.
    for c in [&TRAFFIC.frames, &TRAFFIC.bytes] {
        c.with_label_values(&["tcp", "sent"]).inc_by(0);
        families.extend(c.collect());
    }
    families.extend(PROGRESS.collect());
    exposition::series_names(&families)
}

/// Binds `listen` and serves `/metrics` from a thread; writes the bound
/// address to `addr_file` (atomically) when given.
pub(crate) fn start(
    listen: SocketAddr,
    addr_file: Option<PathBuf>,
    node: Arc<NodeShared>,
) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(listen)?;
    let registry = exposition::registry();
    exposition::register(
        registry,
        Box::new(NodeCollector::new(Arc::downgrade(&node))),
    );
    // The families that exist from the start, so that the first scrape
    // already names them (empty until something is observed).
    LazyLock::force(&RESCALES);
    LazyLock::force(&TRAFFIC);
    LazyLock::force(&PROGRESS);
    let routes: Routes = exposition::metrics_only(registry);
    let bound = exposition::serve_in_thread(listener, Limits::default(), routes)?;
    if let Some(path) = addr_file {
        crate::files::write_atomically(&path, bound.to_string())?;
    }
    Ok(bound)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The page a scrape gets.
    pub(crate) fn page(registry: &Registry) -> String {
        exposition::Page::metrics(registry).body
    }

    pub(crate) fn has_lines(text: &str, lines: &[&str]) {
        for line in lines {
            assert!(
                text.lines().any(|l| l == *line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn the_gpu_section_appears_once_the_gpus_started_and_counts_contexts() {
        // The only test of this binary that starts "GPUs": the records are
        // process-wide, as they are in a node.
        let c = NodeCollector::new(Weak::new());
        assert!(c.gpu().is_empty(), "no GPUs started: no GPU section");
        crate::gpu::record_start(crate::gpu::StartTimes {
            devices: 2,
            context_s: 0.25,
            compile_s: 0.5,
            load_s: 0.125,
        });
        crate::gpu::context_created();
        crate::gpu::context_created();
        let mut text = String::new();
        ductile_coordinator::metrics::prometheus::TextEncoder::new()
            .encode_utf8(&c.gpu(), &mut text)
            .unwrap();
        has_lines(
            &text,
            &[
                "ductile_gpu_devices 2",
                "ductile_gpu_contexts_created_total 2",
                "ductile_gpu_start_seconds{step=\"context\"} 0.25",
                "ductile_gpu_start_seconds{step=\"compile\"} 0.5",
                "ductile_gpu_start_seconds{step=\"load\"} 0.125",
                "# TYPE ductile_gpu_start_seconds gauge",
            ],
        );
    }
}
