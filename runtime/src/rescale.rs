//! The rescale, node side (DESIGN.md, "Launch and rescale"). One folder,
//! one file per role, each saying what it may touch:
//!
//! - [`plan`]: what a request means for node and PE numbering; pure,
//!   computed once per request (by [`service`]) and carried in the
//!   [`StopOrder`] to every PE and node driver.
//! - [`service`]: node 0's control endpoint service: admits a request into
//!   the node's operation slot, hands it to PE 0, watches its stages'
//!   bounds and answers the tool.
//! - [`driver`]: the node-level protocol (drain, hand-over, commit, new
//!   view, reconciliation, barrier) as a sans-IO state machine, tested in
//!   virtual time.
//! - [`shell`]: the node's main thread, which runs the driver with the
//!   real clock, transport, coordinator and PEs.
//! - `pe/rescale.rs`: each PE's part (PE 0 drives evacuation, stop,
//!   adoption and the final balancing; every PE stops, hands over and
//!   re-enters).
//!
//! This file holds what they share: the stages and their bounds, the
//! operation slot's rescale record ([`Desk`]) and the control frames.
//! Newcomers join at the driver's reconciliation step: they waited,
//! registered, with endpoints built speculatively from the view they were
//! given.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use ductile_coordinator::control::{RescaleReport, StageTime};
use ductile_coordinator::proto::{NodeId, ServerMsg, View};
use serde::{Deserialize, Serialize};

use crate::pe::LoopExit;
use crate::system::StopOrder;

pub(crate) mod driver;
pub(crate) mod plan;
pub(crate) mod service;
mod shell;
mod spans;

pub(crate) use shell::Shell;

/// How long a newcomer waits to be admitted before it gives up.
const ADMISSION_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long any one step of a rescale may wait for its peers, by default.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// Environment variable: the bound of every wait of a rescale, in ms
/// (default 30,000). The evacuate stage gets the same bound; each step of
/// the node drivers (a drain round, the hand-over, the commit, the barrier)
/// and each of PE 0's later stages too.
pub(crate) const ENV_STAGE_TIMEOUT_MS: &str = "DUCTILE_RESCALE_STAGE_TIMEOUT_MS";

/// How long each stage of a rescale may take (docs/elasticity.md,
/// "Bounds"). Read once per node from [`ENV_STAGE_TIMEOUT_MS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StageBounds {
    /// The evacuate stage, waiting for load-balancing steps in progress
    /// included. Past it the rescale is abandoned: nothing was committed.
    pub evacuate: Duration,
    /// One wait of a node driver, and each of PE 0's stages after the
    /// commit (reentry, state, balance).
    pub step: Duration,
}

impl StageBounds {
    /// The bounds this process runs with.
    pub(crate) fn get() -> StageBounds {
        static BOUNDS: std::sync::OnceLock<StageBounds> = std::sync::OnceLock::new();
        *BOUNDS.get_or_init(|| {
            let step = std::env::var(ENV_STAGE_TIMEOUT_MS)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|&ms| ms > 0)
                .map_or(STEP_TIMEOUT, Duration::from_millis);
            StageBounds {
                evacuate: step,
                step,
            }
        })
    }

    /// The stop, commit and reconcile stages are bounded by the node
    /// drivers' own waits (a few steps each); this is node 0's backstop
    /// over all of them together.
    fn driver_backstop(&self) -> Duration {
        self.step * 8
    }
}

/// What node 0 does about a rescale whose stage ran past its bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Overdue {
    /// Nothing was committed: drop the rescale, the job goes on at its size.
    Abandon(String),
    /// The commit happened (or may have): end the job with this error.
    Fail(String),
}

/// Whether a rescale that has been in `stage` for `elapsed` ran past its
/// bound, and what to do then. Pure, so it is tested in virtual time.
pub(crate) fn overdue(stage: Stage, elapsed: Duration, bounds: &StageBounds) -> Option<Overdue> {
    let over = |bound: Duration| elapsed > bound;
    match stage {
        Stage::Evacuate if over(bounds.evacuate) => Some(Overdue::Abandon(format!(
            "stage evacuate did not end within {:?}",
            bounds.evacuate
        ))),
        Stage::Stop | Stage::Commit | Stage::Reconcile if over(bounds.driver_backstop()) => {
            Some(Overdue::Fail(format!(
                "stage {} did not end within {:?}",
                stage.name(),
                bounds.driver_backstop()
            )))
        }
        Stage::Reentry | Stage::State | Stage::Balance if over(bounds.step) => {
            Some(Overdue::Fail(format!(
                "stage {} did not end within {:?}",
                stage.name(),
                bounds.step
            )))
        }
        _ => None,
    }
}

/// The stages of a rescale, in protocol order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Load balancing that empties the departing PEs.
    Evacuate,
    /// Stopping every PE, draining the network, hand-over.
    Stop,
    /// Pending newcomers and the commit at the coordinator.
    Commit,
    /// The new view to survivors, endpoint reconciliation, tree barrier.
    Reconcile,
    /// PE 0's re-entry: queues translated, locations rebuilt.
    Reentry,
    /// Newcomers adopting readonly data and collections.
    State,
    /// Load balancing that populates the newcomers.
    Balance,
}

impl Stage {
    /// The stage after this one (`None` after the last).
    pub(crate) fn next(self) -> Option<Stage> {
        Some(match self {
            Stage::Evacuate => Stage::Stop,
            Stage::Stop => Stage::Commit,
            Stage::Commit => Stage::Reconcile,
            Stage::Reconcile => Stage::Reentry,
            Stage::Reentry => Stage::State,
            Stage::State => Stage::Balance,
            Stage::Balance => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Stage::Evacuate => "evacuate",
            Stage::Stop => "stop",
            Stage::Commit => "commit",
            Stage::Reconcile => "reconcile",
            Stage::Reentry => "reentry",
            Stage::State => "state",
            Stage::Balance => "balance",
        }
    }

    /// Whether the stage is the load balancer's work, reported apart from
    /// the mechanism.
    fn is_balancing(self) -> bool {
        matches!(self, Stage::Evacuate | Stage::Balance)
    }
}

/// Why a rescale node 0 accepted did not complete (what the tool is told).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RescaleFailed {
    /// Dropped before its commit (in the evacuate stage, or for a node
    /// lost without notice): nothing was committed.
    #[error("the rescale was abandoned {when}: {why}; nothing was committed and the job goes on at its size")]
    Abandoned {
        /// "in stage evacuate", "before its commit".
        when: &'static str,
        /// Why, with the nodes that did not answer when known.
        why: String,
    },
    /// Committed, then a node was lost without notice before the rescale
    /// completed, and the job rolled back in a recovery of its own.
    #[error("the rescale was committed, then {why}; the job goes on in the view its recovery committed")]
    RolledBack {
        /// What happened after the commit.
        why: String,
    },
    /// A node driver failed a step (`stage` says where node 0 was); the
    /// job ends.
    #[error("the rescale failed{stage}: {failure}; the job ends")]
    Step {
        /// " in stage X", or empty.
        stage: String,
        /// The step and its cause.
        failure: driver::Failure,
    },
    /// A stage ran past its bound after the commit; the job ends.
    #[error("the rescale failed after the commit: {why}; ending the job")]
    Overdue {
        /// Which stage and its bound.
        why: String,
    },
}

/// Node 0's record of the rescale being served: the request, where its
/// answer goes, and the stage times measured so far (by PE 0 and by the
/// node driver).
pub(crate) struct Desk {
    pub order: StopOrder,
    reply: Sender<Result<RescaleReport, RescaleFailed>>,
    started: Instant,
    pes_before: u32,
    old_members: usize,
    stages: Vec<(Stage, f64)>,
    pub migrations: u64,
    /// When PE 0 told every PE to stop.
    pub stop_sent: Option<Instant>,
    /// When node 0's barrier completed (re-entry starts).
    pub reentry_from: Option<Instant>,
    /// GPU work inside the stages: device staging of migrated chares
    /// (summed over PEs), contexts created on the critical path (node 0's;
    /// only in the measurement mode of `gpu::ENV_CONTEXT_ON_REENTRY`).
    pub gpu_staging_ms: f64,
    pub gpu_context_ms: Option<f64>,
    /// The stage in progress, and since when (what node 0's watchdog
    /// checks against [`StageBounds`]).
    pub stage: Stage,
    pub stage_since: Instant,
    /// Set by node 0's watchdog: PE 0 drops the rescale if it has not
    /// told the PEs to stop yet (the reason goes to the tool).
    pub abandon: Option<String>,
}

impl Desk {
    pub(crate) fn new(
        order: StopOrder,
        old: &View,
        reply: Sender<Result<RescaleReport, RescaleFailed>>,
    ) -> Self {
        Desk {
            order,
            reply,
            started: Instant::now(),
            pes_before: old.total_pes(),
            old_members: old.members.len(),
            stages: Vec::new(),
            migrations: 0,
            stop_sent: None,
            reentry_from: None,
            gpu_staging_ms: 0.0,
            gpu_context_ms: None,
            stage: Stage::Evacuate,
            stage_since: Instant::now(),
            abandon: None,
        }
    }

    /// `stage` ended after `ms`; the next one begins.
    pub(crate) fn record(&mut self, stage: Stage, ms: f64) {
        self.stages.push((stage, ms));
        if let Some(next) = stage.next() {
            self.stage = next;
            self.stage_since = Instant::now();
        }
    }

    /// Sends the answer: the report against `view` (the job's view now), or the error.
    pub(crate) fn answer(self, view: &View, result: Result<(), RescaleFailed>) {
        let report = result.map(|()| {
            let mut stages = self.stages.clone();
            stages.sort_by_key(|(s, _)| *s as u8);
            let mechanism_ms = stages
                .iter()
                .filter(|(s, _)| !s.is_balancing())
                .map(|(_, ms)| ms)
                .sum();
            // Survivors keep their order at the front; newcomers follow.
            let survivors = (self.old_members - self.order.remove.len()) as NodeId;
            let mut gpu = Vec::new();
            if let Some(ms) = self.gpu_context_ms {
                gpu.push(StageTime {
                    stage: "context".into(),
                    ms,
                });
            }
            if self.gpu_staging_ms > 0.0 {
                gpu.push(StageTime {
                    stage: "staging".into(),
                    ms: self.gpu_staging_ms,
                });
            }
            RescaleReport {
                epoch_before: self.order.epoch,
                epoch: view.epoch,
                removed: self.order.remove.clone(),
                admitted: (survivors..view.members.len() as NodeId).collect(),
                pes_before: self.pes_before,
                pes: view.total_pes(),
                migrations: self.migrations,
                stages: stages
                    .into_iter()
                    .map(|(s, ms)| StageTime {
                        stage: s.name().into(),
                        ms,
                    })
                    .collect(),
                mechanism_ms,
                total_ms: self.started.elapsed().as_secs_f64() * 1e3,
                gpu,
            }
        });
        if let Ok(r) = &report {
            // One line per rescale where the job runs (its stderr), so a
            // rescale is visible without asking for it.
            eprintln!(
                "ductile: rescaled epoch {} -> {}: nodes {} -> {}, PEs {} -> {}, {:.1} ms (mechanism)",
                r.epoch_before,
                r.epoch,
                self.old_members,
                view.members.len(),
                r.pes_before,
                r.pes,
                r.mechanism_ms
            );
        }
        let _ = self.reply.send(report);
    }
}

/// A node-level frame of the rescale protocol (transport kind
/// [`crate::transport::kind::CONTROL`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum ControlFrame {
    /// Drain round `round`, all-to-all: the sender sent `sent` envelope
    /// frames to the receiver in this epoch.
    Drain { round: u8, sent: u64 },
    /// Drain round `round`, up the node tree: the envelope frames the
    /// sender's subtree sent to each node of the epoch (`sent[n]` to node n).
    DrainUp { round: u8, sent: Vec<u64> },
    /// Drain round `round`, down the node tree: the envelope frames sent to
    /// each node of the epoch by all the others.
    DrainDown { round: u8, totals: Vec<u64> },
    /// From node 0 to each survivor: the committed view.
    View(View),
    /// Barrier, up the node tree of the new view: this subtree is ready.
    Ready,
    /// Barrier, down the tree: everyone is ready.
    Go,
    /// From node 0 to every other node of its view: node `lost` was lost
    /// without notice; recover without it (abandoning the rescale under
    /// way, if one is and has no new view yet). Tagged with the epoch a
    /// rescale committed, before the nodes passed its barrier: recover in
    /// that view.
    Recover { lost: NodeId },
}

/// What the node's main thread hears about.
pub(crate) enum NodeEvent {
    /// A PE stopped for a rescale.
    Stopped { order: StopOrder },
    /// A PE handed over (drained its inbox; sent what it held if departing).
    HandedOver,
    /// A PE's thread ended.
    Exited { rank: usize, exit: LoopExit },
    /// A control frame from node `src` (numbered in the tag's epoch).
    Frame {
        src: NodeId,
        epoch_bits: u64,
        frame: ControlFrame,
    },
    /// An envelope frame arrived while the node drains.
    Counted,
    /// A notice from the coordinator.
    Coordinator(ServerMsg),
}

/// Envelope frames sent to and received from each peer in this epoch.
#[derive(Default)]
pub(crate) struct FrameCounts {
    pub sent: HashMap<NodeId, u64>,
    pub received: HashMap<NodeId, u64>,
}

#[cfg(test)]
mod tests {
    use super::driver::add_counts;
    use super::*;

    proptest::proptest! {
        /// Summing the rows of any tree shape gives the column totals that
        /// the all-to-all drain would have compared one by one.
        #[test]
        fn tree_sums_are_the_column_totals(
            rows in proptest::collection::vec(proptest::collection::vec(0u64..1 << 40, 6), 1..12),
            split in 0usize..12,
        ) {
            let n = rows[0].len();
            let split = split.min(rows.len());
            let mut left = vec![0; n];
            let mut right = vec![0; n];
            rows[..split].iter().try_for_each(|r| add_counts(&mut left, r, 1)).unwrap();
            rows[split..].iter().try_for_each(|r| add_counts(&mut right, r, 2)).unwrap();
            add_counts(&mut left, &right, 3).unwrap();
            for (col, total) in left.iter().enumerate() {
                proptest::prop_assert_eq!(*total, rows.iter().map(|r| r[col]).sum::<u64>());
            }
        }
    }

    #[test]
    fn every_stage_is_bounded_and_only_evacuate_is_abandoned() {
        let b = StageBounds {
            evacuate: Duration::from_secs(5),
            step: Duration::from_secs(2),
        };
        let ms = Duration::from_millis;
        let mut stage = Some(Stage::Evacuate);
        let mut seen = 0;
        while let Some(s) = stage {
            seen += 1;
            // Within its bound, nothing happens, however long the rescale ran.
            assert_eq!(overdue(s, ms(1999), &b), None, "{s:?}");
            // Far past any bound, every stage ends one way or the other.
            match overdue(s, Duration::from_secs(3600), &b) {
                Some(Overdue::Abandon(why)) => {
                    assert_eq!(s, Stage::Evacuate);
                    assert!(why.contains("stage evacuate"), "{why}");
                }
                Some(Overdue::Fail(why)) => {
                    assert_ne!(s, Stage::Evacuate);
                    assert!(why.contains(&format!("stage {}", s.name())), "{why}");
                }
                None => panic!("stage {s:?} is unbounded"),
            }
            stage = s.next();
        }
        assert_eq!(seen, 7, "every stage visited once, in order");
        assert_eq!(
            overdue(Stage::Evacuate, ms(5001), &b).map(|o| matches!(o, Overdue::Abandon(_))),
            Some(true)
        );
        assert_eq!(
            overdue(Stage::State, ms(2001), &b).map(|o| matches!(o, Overdue::Fail(_))),
            Some(true)
        );
        // The drivers' stages get node 0's backstop, beyond their own waits.
        assert_eq!(overdue(Stage::Stop, ms(2001), &b), None);
    }

    #[test]
    fn drain_frames_round_trip() {
        for f in [
            ControlFrame::DrainUp {
                round: 1,
                sent: vec![0, 5, 7],
            },
            ControlFrame::DrainDown {
                round: 2,
                totals: vec![9, 0, 1 << 50],
            },
            ControlFrame::Recover { lost: 3 },
        ] {
            let bytes = postcard::to_allocvec(&f).unwrap();
            assert_eq!(postcard::from_bytes::<ControlFrame>(&bytes).unwrap(), f);
        }
    }
}
