//! What the job did, as Prometheus series (docs/metrics.md): every
//! rescale's outcome and stage times, with the GPU work inside the stages as
//! series of their own, every load-balancing step's time and migrations
//! (node 0 decides both), and the program's progress
//! (`Ctx::report_progress`). The node's endpoint is `scrape.rs`.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use ductile_coordinator::control::RescaleReport;
use ductile_coordinator::metrics::prometheus::core::Collector;
use ductile_coordinator::metrics::prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
};
use ductile_coordinator::metrics::{self as exposition};

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

pub(crate) fn histogram(name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("a valid histogram")
}

pub(crate) fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter")
}

/// Node 0's record of rescales and load-balancing steps. Every family is a
/// vector, so none shows before the first observation: only node 0 serves
/// rescales, and a node that never balanced has nothing to say about it.
pub(crate) struct Rescales {
    outcomes: IntCounterVec,
    pub(crate) stages: HistogramVec,
    gpu: HistogramVec,
    mechanism: HistogramVec,
    migrations: IntCounterVec,
    lb_seconds: HistogramVec,
    lb_migrations: IntCounterVec,
    lb_bytes: IntCounterVec,
}

impl Rescales {
    pub(crate) fn new() -> Self {
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

    pub(crate) fn register(&self, registry: &Registry) {
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

    pub(crate) fn ended(&self, outcome: Outcome) {
        self.outcomes.with_label_values(&[outcome.label()]).inc();
    }

    pub(crate) fn committed(&self, report: &RescaleReport) {
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

    pub(crate) fn lb_step(&self, forced: bool, seconds: f64, migrations: u64, bytes: u64) {
        let kind = [if forced { "rescale" } else { "at_sync" }];
        self.lb_seconds.with_label_values(&kind).observe(seconds);
        self.lb_migrations
            .with_label_values(&kind)
            .inc_by(migrations);
        self.lb_bytes.with_label_values(&kind).inc_by(bytes);
    }
}

/// This process's rescale and load-balancing records.
pub(crate) static RESCALES: LazyLock<Rescales> = LazyLock::new(|| {
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

/// Node 0's record of buddy checkpoints and recoveries (`+ft-every`,
/// `pe/buddy.rs`); vectors, so none shows before the first observation.
pub(crate) struct Recoveries {
    recoveries: IntCounterVec,
    last_recovery: GaugeVec,
    checkpoints: HistogramVec,
    pauses: HistogramVec,
    checkpoint_bytes: GaugeVec,
}

impl Recoveries {
    fn new() -> Self {
        Recoveries {
            recoveries: counter(
                "ductile_recoveries_total",
                "Members lost without notice that the job recovered from live (rolled back to its last buddy checkpoint), on node 0.",
                &[],
            ),
            last_recovery: GaugeVec::new(
                Opts::new(
                    "ductile_last_recovery_seconds",
                    "The last recovery's time from the loss noticed to the job running again (excluding the work redone since the checkpoint).",
                ),
                &[],
            )
            .expect("a valid gauge"),
            checkpoints: histogram(
                "ductile_buddy_checkpoint_seconds",
                "Time of complete buddy checkpoints: quiescence, every PE's copy taken and stored at its buddy.",
                &STAGE_BUCKETS,
                &[],
            ),
            pauses: histogram(
                "ductile_buddy_checkpoint_pause_seconds",
                "Time the program waited at each buddy checkpoint: quiescence and every PE's copies taken (packed, and the buddy's handed to the transport).",
                &STAGE_BUCKETS,
                &[],
            ),
            checkpoint_bytes: GaugeVec::new(
                Opts::new(
                    "ductile_buddy_checkpoint_bytes",
                    "Chare state in the last complete buddy checkpoint, summed over PEs (each is held twice: by its PE and by its buddy).",
                ),
                &[],
            )
            .expect("a valid gauge"),
        }
    }

    fn register(&self, registry: &Registry) {
        for family in [
            Box::new(self.recoveries.clone()) as Box<dyn Collector>,
            Box::new(self.last_recovery.clone()),
            Box::new(self.checkpoints.clone()),
            Box::new(self.pauses.clone()),
            Box::new(self.checkpoint_bytes.clone()),
        ] {
            exposition::register(registry, family);
        }
    }
}

static RECOVERIES: LazyLock<Recoveries> = LazyLock::new(|| {
    let r = Recoveries::new();
    r.register(exposition::registry());
    r
});

/// Records a complete buddy checkpoint: the program's pause, the whole
/// time, and the bytes.
pub(crate) fn buddy_checkpoint(pause: f64, seconds: f64, bytes: u64) {
    RECOVERIES
        .pauses
        .with_label_values(&[] as &[&str])
        .observe(pause);
    RECOVERIES
        .checkpoints
        .with_label_values(&[] as &[&str])
        .observe(seconds);
    RECOVERIES
        .checkpoint_bytes
        .with_label_values(&[] as &[&str])
        .set(bytes as f64);
}

/// Records a recovery that took `seconds` from the loss to the job running.
pub(crate) fn recovered(seconds: f64) {
    RECOVERIES
        .recoveries
        .with_label_values(&[] as &[&str])
        .inc();
    RECOVERIES
        .last_recovery
        .with_label_values(&[] as &[&str])
        .set(seconds);
}

/// The program's progress (`Ctx::report_progress`).
pub(crate) static PROGRESS: LazyLock<IntCounter> = LazyLock::new(|| {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scrape::tests::{has_lines, page};
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
        let registry = Registry::new();
        let r = Rescales::new();
        r.register(&registry);
        assert_eq!(
            page(&registry),
            "",
            "no rescale served: no rescale families"
        );

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
}
