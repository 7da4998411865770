//! A node's Prometheus metrics on `GET /metrics` (`DUCTILE_METRICS`, see
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

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use ductile_coordinator::control::RescaleReport;
use ductile_coordinator::metrics::prometheus::core::{Collector, Desc};
use ductile_coordinator::metrics::prometheus::proto::MetricFamily;
use ductile_coordinator::metrics::prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};
use ductile_coordinator::metrics::{self as exposition, Limits, Routes};
use ductile_coordinator::proto::{NodeId, View};

use crate::node::NodeShared;
use crate::transport::{Reconciled, Sink, Tag, Transport, TransportError};

/// Upper bounds (seconds) of the rescale-mechanism histogram's buckets:
/// from a quarter of a millisecond (a rescale at 4 nodes takes a few) to 5 s.
pub const MECHANISM_BUCKETS: [f64; 14] = [
    0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
];

/// Upper bounds (seconds) of the stage, GPU-work and load-balancing
/// histograms: a stage takes from tens of microseconds to seconds.
pub const STAGE_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
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

fn histogram(name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> HistogramVec {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)
        .expect("a valid histogram")
}

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter")
}

/// Node 0's record of rescales and load-balancing steps. Every family is a
/// vector, so none shows before the first observation: only node 0 serves
/// rescales, and a node that never balanced has nothing to say about it.
pub(crate) struct Rescales {
    outcomes: IntCounterVec,
    stages: HistogramVec,
    gpu: HistogramVec,
    mechanism: HistogramVec,
    migrations: IntCounterVec,
    lb_seconds: HistogramVec,
    lb_migrations: IntCounterVec,
    lb_bytes: IntCounterVec,
}

impl Rescales {
    fn new() -> Self {
        Rescales {
            outcomes: counter(
                "ductile_rescales_total",
                "Rescale requests served by this node (node 0), by outcome: committed, refused, failed.",
                &["outcome"],
            ),
            stages: histogram(
                "ductile_rescale_stage_seconds",
                "Time of each stage of committed rescales (docs/elasticity.md), by stage.",
                &STAGE_BUCKETS,
                &["stage"],
            ),
            gpu: histogram(
                "ductile_rescale_gpu_seconds",
                "GPU work inside the stages of committed rescales, by kind: staging (device buffers of migrated chares, summed over PEs) and context (contexts created on the critical path; zero unless measuring).",
                &STAGE_BUCKETS,
                &["work"],
            ),
            mechanism: histogram(
                "ductile_rescale_mechanism_seconds",
                "The rescale mechanism's time (every stage but evacuate and balance) of committed rescales.",
                &MECHANISM_BUCKETS,
                &[],
            ),
            migrations: counter(
                "ductile_rescale_migrations_total",
                "Chares migrated by the evacuations and balancing steps of committed rescales.",
                &[],
            ),
            lb_seconds: histogram(
                "ductile_lb_step_seconds",
                "Time of load-balancing steps (statistics, strategy, migrations), by kind: at_sync (the program's) or rescale (a rescale's evacuation or balancing).",
                &STAGE_BUCKETS,
                &["kind"],
            ),
            lb_migrations: counter(
                "ductile_lb_migrations_total",
                "Chares migrated by load-balancing steps, by kind.",
                &["kind"],
            ),
            lb_bytes: counter(
                "ductile_lb_migrated_bytes_total",
                "Bytes of chare state sent by the migrations of load-balancing steps, by kind.",
                &["kind"],
            ),
        }
    }

    fn register(&self, registry: &Registry) {
        let families: [Box<dyn Collector>; 8] = [
            Box::new(self.outcomes.clone()),
            Box::new(self.stages.clone()),
            Box::new(self.gpu.clone()),
            Box::new(self.mechanism.clone()),
            Box::new(self.migrations.clone()),
            Box::new(self.lb_seconds.clone()),
            Box::new(self.lb_migrations.clone()),
            Box::new(self.lb_bytes.clone()),
        ];
        for family in families {
            exposition::register(registry, family);
        }
    }

    fn ended(&self, outcome: Outcome) {
        self.outcomes.with_label_values(&[outcome.label()]).inc();
    }

    fn committed(&self, report: &RescaleReport) {
        self.ended(Outcome::Committed);
        for s in &report.stages {
            self.stages
                .with_label_values(&[s.stage.as_str()])
                .observe(s.ms / 1e3);
        }
        // One observation per kind and rescale: the known kinds always
        // (zero where there was none), any other kind the report names.
        let mut gpu_ms: BTreeMap<&str, f64> = GPU_WORK.iter().map(|&w| (w, 0.0)).collect();
        for g in &report.gpu {
            *gpu_ms.entry(&g.stage).or_default() += g.ms;
        }
        for (work, ms) in gpu_ms {
            self.gpu.with_label_values(&[work]).observe(ms / 1e3);
        }
        self.mechanism
            .with_label_values::<&str>(&[])
            .observe(report.mechanism_ms / 1e3);
        self.migrations
            .with_label_values::<&str>(&[])
            .inc_by(report.migrations);
    }

    fn lb_step(&self, forced: bool, seconds: f64, migrations: u64, bytes: u64) {
        let kind = [if forced { "rescale" } else { "at_sync" }];
        self.lb_seconds.with_label_values(&kind).observe(seconds);
        self.lb_migrations
            .with_label_values(&kind)
            .inc_by(migrations);
        self.lb_bytes.with_label_values(&kind).inc_by(bytes);
    }
}

/// This process's rescale and load-balancing records.
static RESCALES: LazyLock<Rescales> = LazyLock::new(|| {
    let r = Rescales::new();
    r.register(exposition::registry());
    r
});

/// Records a rescale request that ended without a report.
pub(crate) fn rescale_ended(outcome: Outcome) {
    RESCALES.ended(outcome);
}

/// Records a committed rescale.
pub(crate) fn rescale_committed(report: &RescaleReport) {
    RESCALES.committed(report);
}

/// Records a load-balancing step that ended (on PE 0): `forced` for a
/// rescale's, its wall time, and what it moved.
pub(crate) fn lb_step(forced: bool, seconds: f64, migrations: u64, bytes: u64) {
    RESCALES.lb_step(forced, seconds, migrations, bytes);
}

/// The program's progress (`Ctx::report_progress`).
static PROGRESS: LazyLock<IntCounter> = LazyLock::new(|| {
    let c = IntCounter::new(
        "ductile_app_iterations_total",
        "Iterations the program reported done on this node (Ctx::report_progress); its rate is the job's progress.",
    )
    .expect("a valid counter");
    exposition::register(exposition::registry(), Box::new(c.clone()));
    c
});

/// Adds `iterations` to the program's progress.
pub(crate) fn progress(iterations: u64) {
    PROGRESS.inc_by(iterations);
}

// ---------------------------------------------------------------------------
// The transport's traffic, counted without a lock or a shared cache line.

/// Thread slots of a striped counter: more than PEs per node usually are;
/// threads beyond share slots, which costs only contention.
const STRIPES: usize = 16;

#[repr(align(128))]
#[derive(Default)]
struct Slot(AtomicU64);

/// A counter that threads add to without sharing a cache line.
#[derive(Default)]
pub(crate) struct Striped([Slot; STRIPES]);

impl Striped {
    /// Adds `n` (relaxed: it orders nothing).
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0[stripe()].0.fetch_add(n, Ordering::Relaxed);
    }

    /// The total so far.
    pub(crate) fn sum(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

/// Frames and bytes one transport sent and received.
#[derive(Default)]
pub(crate) struct Traffic {
    sent_frames: Striped,
    sent_bytes: Striped,
    received_frames: Striped,
    received_bytes: Striped,
}

/// Transports a node may run, each with its counters.
const TRANSPORTS: [&str; 2] = ["tcp", "ucx"];

/// The traffic of each transport, and the collector that exports it.
struct TrafficCollector {
    traffic: [Traffic; TRANSPORTS.len()],
    frames: IntCounterVec,
    bytes: IntCounterVec,
    descs: Vec<Desc>,
}

static TRAFFIC: LazyLock<Arc<TrafficCollector>> = LazyLock::new(|| {
    let frames = counter(
        "ductile_transport_messages_total",
        "Frames this node's transport sent to or received from other nodes, by transport and direction (sent, received).",
        &["transport", "direction"],
    );
    let bytes = counter(
        "ductile_transport_bytes_total",
        "Bytes of the frames this node's transport sent or received, by transport and direction.",
        &["transport", "direction"],
    );
    let descs = frames
        .desc()
        .into_iter()
        .chain(bytes.desc())
        .cloned()
        .collect();
    let c = Arc::new(TrafficCollector {
        traffic: Default::default(),
        frames,
        bytes,
        descs,
    });
    exposition::register(exposition::registry(), Box::new(Shared(c.clone())));
    c
});

/// A collector shared between the registry and the code that feeds it.
struct Shared<C>(Arc<C>);

impl<C: Collector> Collector for Shared<C> {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }
    fn collect(&self) -> Vec<MetricFamily> {
        self.0.collect()
    }
}

impl Collector for TrafficCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        // Fresh families each time, holding the sums: a counter cannot be set.
        let frames = self.frames.clone();
        frames.reset();
        let bytes = self.bytes.clone();
        bytes.reset();
        for (name, t) in TRANSPORTS.iter().zip(&self.traffic) {
            let (sent_frames, received_frames) = (t.sent_frames.sum(), t.received_frames.sum());
            if sent_frames + received_frames == 0 {
                continue;
            }
            frames
                .with_label_values(&[name, "sent"])
                .inc_by(sent_frames);
            frames
                .with_label_values(&[name, "received"])
                .inc_by(received_frames);
            bytes
                .with_label_values(&[name, "sent"])
                .inc_by(t.sent_bytes.sum());
            bytes
                .with_label_values(&[name, "received"])
                .inc_by(t.received_bytes.sum());
        }
        frames.collect().into_iter().chain(bytes.collect()).collect()
    }
}

fn traffic_of(transport: &str) -> &'static Traffic {
    let i = TRANSPORTS
        .iter()
        .position(|t| *t == transport)
        .unwrap_or(0);
    &LazyLock::force(&TRAFFIC).traffic[i]
}

/// A transport whose frames are counted (`ductile_transport_*`).
pub(crate) struct CountedTransport {
    inner: Arc<dyn Transport>,
    traffic: &'static Traffic,
}

/// `transport` (named `name`: `tcp`, `ucx`) with its sent frames counted.
pub(crate) fn counted(name: &str, transport: Arc<dyn Transport>) -> Arc<dyn Transport> {
    Arc::new(CountedTransport {
        inner: transport,
        traffic: traffic_of(name),
    })
}

impl Transport for CountedTransport {
    fn address(&self) -> Vec<u8> {
        self.inner.address()
    }
    fn send(&self, to: NodeId, tag: Tag, parts: &[&[u8]]) -> Result<(), TransportError> {
        self.traffic.sent_frames.add(1);
        self.traffic
            .sent_bytes
            .add(parts.iter().map(|p| p.len() as u64).sum());
        self.inner.send(to, tag, parts)
    }
    fn send_frame(&self, to: NodeId, tag: Tag, frame: Vec<u8>) -> Result<(), TransportError> {
        self.traffic.sent_frames.add(1);
        self.traffic.sent_bytes.add(frame.len() as u64);
        self.inner.send_frame(to, tag, frame)
    }
    fn reconcile(&self, view: &View, me: NodeId) -> Result<Reconciled, TransportError> {
        self.inner.reconcile(view, me)
    }
    fn shutdown(&self) {
        self.inner.shutdown()
    }
    fn poll(&self) -> bool {
        self.inner.poll()
    }
}

/// A sink whose received frames are counted.
pub(crate) struct CountedSink<S> {
    inner: S,
    traffic: &'static Traffic,
}

impl<S: Sink> CountedSink<S> {
    /// `sink` of the transport named `name`, counted.
    pub(crate) fn new(name: &str, sink: S) -> Self {
        CountedSink {
            inner: sink,
            traffic: traffic_of(name),
        }
    }
}

impl<S: Sink> Sink for CountedSink<S> {
    fn deliver(&self, tag: Tag, frame: Vec<u8>) {
        self.traffic.received_frames.add(1);
        self.traffic.received_bytes.add(frame.len() as u64);
        self.inner.deliver(tag, frame)
    }
    fn lost(&self, peer_uid: u64, reason: String) {
        self.inner.lost(peer_uid, reason)
    }
}

// ---------------------------------------------------------------------------
// Series computed at scrape time.

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
            descs: Vec::new(),
        };
        let metrics: [&dyn Collector; 9] = [
            &c.pes,
            &c.member,
            &c.id,
            &c.epoch,
            &c.nodes,
            &c.job_pes,
            &c.gpu_devices,
            &c.gpu_contexts,
            &c.gpu_start,
        ];
        let descs = metrics
            .iter()
            .flat_map(|m| m.desc())
            .cloned()
            .collect();
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
        let mut out = [self.pes.collect(), self.member.collect()].concat();
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
    let singles: [&dyn Collector; 9] = [
        &node.pes,
        &node.member,
        &node.id,
        &node.epoch,
        &node.nodes,
        &node.job_pes,
        &node.gpu_devices,
        &node.gpu_contexts,
        &node.gpu_start,
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

/// The page a scrape gets (tests).
#[cfg(test)]
fn page(registry: &Registry) -> String {
    exposition::Page::metrics(registry).body
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

    fn has_lines(text: &str, lines: &[&str]) {
        for line in lines {
            assert!(
                text.lines().any(|l| l == *line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn rescales_are_counted_by_outcome_and_gpu_work_has_series_of_its_own() {
        let registry = Registry::new();
        let r = Rescales::new();
        r.register(&registry);
        assert_eq!(page(&registry), "", "no rescale served: no rescale families");

        r.ended(Outcome::Refused);
        r.committed(&report(
            vec![stage("stop", 2.0), stage("reentry", 1.0)],
            vec![stage("staging", 4.0)],
            3.0,
        ));
        // A CPU job: no GPU work, yet both kinds get a zero observation.
        r.committed(&report(vec![stage("stop", 0.5)], vec![], 0.5));
        r.ended(Outcome::Failed);
        let text = page(&registry);
        has_lines(
            &text,
            &[
                "ductile_rescales_total{outcome=\"committed\"} 2",
                "ductile_rescales_total{outcome=\"refused\"} 1",
                "ductile_rescales_total{outcome=\"failed\"} 1",
                "ductile_rescale_stage_seconds_sum{stage=\"stop\"} 0.0025",
                "ductile_rescale_stage_seconds_count{stage=\"stop\"} 2",
                "ductile_rescale_stage_seconds_count{stage=\"reentry\"} 1",
                // Millisecond buckets: 0.5 ms and 2 ms fall apart.
                "ductile_rescale_stage_seconds_bucket{stage=\"stop\",le=\"0.0005\"} 1",
                "ductile_rescale_stage_seconds_bucket{stage=\"stop\",le=\"0.001\"} 1",
                "ductile_rescale_stage_seconds_bucket{stage=\"stop\",le=\"0.0025\"} 2",
                "ductile_rescale_gpu_seconds_sum{work=\"staging\"} 0.004",
                "ductile_rescale_gpu_seconds_count{work=\"staging\"} 2",
                "ductile_rescale_gpu_seconds_sum{work=\"context\"} 0",
                "ductile_rescale_gpu_seconds_count{work=\"context\"} 2",
                "ductile_rescale_mechanism_seconds_bucket{le=\"0.0005\"} 1",
                "ductile_rescale_mechanism_seconds_bucket{le=\"0.001\"} 1",
                "ductile_rescale_mechanism_seconds_bucket{le=\"0.005\"} 2",
                "ductile_rescale_mechanism_seconds_count 2",
                "ductile_rescale_migrations_total 10",
                "# TYPE ductile_rescale_gpu_seconds histogram",
            ],
        );
        assert!(!text.contains("ductile_lb_"), "no LB step yet\n{text}");
        r.lb_step(false, 0.003, 4, 4096);
        r.lb_step(true, 0.02, 1, 100);
        r.lb_step(false, 0.001, 0, 0);
        has_lines(
            &page(&registry),
            &[
                "ductile_lb_step_seconds_count{kind=\"at_sync\"} 2",
                "ductile_lb_step_seconds_bucket{kind=\"at_sync\",le=\"0.001\"} 1",
                "ductile_lb_step_seconds_count{kind=\"rescale\"} 1",
                "ductile_lb_migrations_total{kind=\"at_sync\"} 4",
                "ductile_lb_migrated_bytes_total{kind=\"at_sync\"} 4096",
                "ductile_lb_migrated_bytes_total{kind=\"rescale\"} 100",
            ],
        );
    }

    #[test]
    fn striped_counters_sum_what_every_thread_added() {
        let c = Arc::new(Striped::default());
        let threads: Vec<_> = (0..40)
            .map(|i| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.add(i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.sum(), 1000 * (0..40).sum::<u64>());
    }

    #[test]
    fn traffic_is_counted_by_transport_and_direction() {
        struct Null;
        impl Transport for Null {
            fn address(&self) -> Vec<u8> {
                Vec::new()
            }
            fn send(&self, _: NodeId, _: Tag, _: &[&[u8]]) -> Result<(), TransportError> {
                Ok(())
            }
            fn reconcile(&self, _: &View, _: NodeId) -> Result<Reconciled, TransportError> {
                Ok(Reconciled::default())
            }
            fn shutdown(&self) {}
        }
        impl Sink for Null {
            fn deliver(&self, _: Tag, _: Vec<u8>) {}
            fn lost(&self, _: u64, _: String) {}
        }
        // The only test of this binary that counts "ucx" traffic: the
        // counters are process-wide, as they are in a node.
        let t = counted("ucx", Arc::new(Null));
        let tag = Tag::new(0, 1, 1);
        t.send(1, tag, &[b"abc", b"de"]).unwrap();
        t.send_frame(1, tag, vec![0; 10]).unwrap();
        CountedSink::new("ucx", Null).deliver(tag, vec![0; 7]);
        has_lines(
            &page(exposition::registry()),
            &[
                "ductile_transport_messages_total{direction=\"sent\",transport=\"ucx\"} 2",
                "ductile_transport_bytes_total{direction=\"sent\",transport=\"ucx\"} 15",
                "ductile_transport_messages_total{direction=\"received\",transport=\"ucx\"} 1",
                "ductile_transport_bytes_total{direction=\"received\",transport=\"ucx\"} 7",
            ],
        );
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
