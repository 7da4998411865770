//! What a cloud run saw, and the summary made from it: the timeline of
//! events, membership and progress samples, each rescale with the notices
//! it answered, and the bill. Written as `cloud.json`; summarised as a table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::sim::{Instance, Unreached};

/// One thing that happened, at simulated and real time (seconds).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mark {
    /// Simulated seconds since the start.
    pub sim: f64,
    /// Real seconds since the start.
    pub real: f64,
    /// Kind: `recommendation`, `notice`, `terminated`, `unannounced`,
    /// `noCapacity`, `booted`, `ready`, `rescale`, `committed`, `failed`,
    /// `cancelled`, `vacated`, `lost`, `report`, `skipped`; with
    /// `checkpoint-restart`, `checkpoint` (a periodic one written) and
    /// `killed` (every process of the job, before a relaunch).
    pub kind: String,
    /// The instance or member it concerns, if one.
    pub instance: Option<String>,
    /// Words for humans.
    pub detail: String,
}

/// Membership and progress at one moment.
#[derive(Clone, Copy, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// Simulated seconds.
    pub sim: f64,
    /// Real seconds.
    pub real: f64,
    /// On-demand members in the view.
    pub on_demand: u32,
    /// Spot members in the view.
    pub spot: u32,
    /// PEs of the on-demand members (instance types may differ in PEs).
    pub on_demand_pes: u32,
    /// PEs of the spot members.
    pub spot_pes: u32,
    /// Newcomers registered and waiting for admission.
    pub waiting: u32,
    /// Their PEs.
    pub waiting_pes: u32,
    /// Instances requested and not yet running a node (booting, no capacity).
    pub booting: u32,
    /// The job's last reported iteration.
    pub iteration: Option<u64>,
}

/// One rescale the policy asked for.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RescaleRecord {
    /// The policy's reason.
    pub reason: String,
    /// Members removed.
    pub remove: Vec<String>,
    /// Newcomers asked to be admitted.
    pub admit: u32,
    /// Asked at (simulated, real seconds).
    pub asked_sim: f64,
    /// Asked at, real seconds.
    pub asked_real: f64,
    /// Committed (or failed) at, real seconds.
    pub done_real: Option<f64>,
    /// Committed at, simulated seconds.
    pub done_sim: Option<f64>,
    /// The new epoch, when committed.
    pub epoch: Option<u64>,
    /// Newcomers admitted.
    pub admitted: Vec<String>,
    /// The job's own measure of the mechanism (PE 0's stage times summed), ms.
    pub mechanism_ms: Option<f64>,
    /// Why it failed.
    pub error: Option<String>,
    /// Elements the first step of a relaunched job moved (relaunching
    /// modes; 0 for `restart-no-lb`, which runs no step).
    pub migrations: Option<u64>,
    /// `checkpoint-restart`: real seconds of work between the checkpoint
    /// restored and the kill, lost and done again.
    pub redone_s: Option<f64>,
}

impl RescaleRecord {
    /// A rescale just asked for, at `asked_sim` simulated and `asked_real`
    /// real seconds; its outcome is filled in when it ends.
    pub fn asked(
        reason: String,
        remove: Vec<String>,
        admit: u32,
        asked_sim: f64,
        asked_real: f64,
    ) -> Self {
        RescaleRecord {
            reason,
            remove,
            admit,
            asked_sim,
            asked_real,
            done_real: None,
            done_sim: None,
            epoch: None,
            admitted: Vec::new(),
            mechanism_ms: None,
            error: None,
            migrations: None,
            redone_s: None,
        }
    }
}

/// One periodic checkpoint that completed (`checkpoint-restart`).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointRecord {
    /// Completed at, simulated seconds.
    pub sim: f64,
    /// Completed at, real seconds.
    pub real: f64,
    /// From the request to the sync point it took, ms.
    pub wait_ms: f64,
    /// Writing every PE's files, ms (the job waits meanwhile).
    pub write_ms: f64,
    /// Bytes written.
    pub bytes: u64,
}

/// From a notice (or recommendation) for a member to the commit that
/// removed it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NoticeToCommit {
    /// The member.
    pub member: String,
    /// `notice` or `recommendation`.
    pub signal: String,
    /// Real seconds from the signal to the commit.
    pub real_s: f64,
    /// Simulated seconds.
    pub sim_s: f64,
    /// It left before its deadline (notices only).
    pub before_deadline: Option<bool>,
}

/// A member lost without notice while the job runs with fault tolerance
/// (the runtime's `+ft-every`), and the job's recovery without it.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryRecord {
    /// The instance terminated.
    pub instance: String,
    /// Its node's pid.
    pub pid: u32,
    /// Simulated seconds at the termination.
    pub sim: f64,
    /// Real seconds at the termination.
    pub real: f64,
    /// Real seconds from the kill to the first view seen without its node
    /// (node 0 committed the recovery); `None`: never seen.
    pub recovered_s: Option<f64>,
    /// The epoch of that view.
    pub epoch: Option<u64>,
    /// The iteration the job had reported at the kill.
    pub iteration_at_kill: Option<u64>,
    /// Real seconds from the kill until the job reported an iteration past
    /// that one again, after the recovery: the time the loss cost (the
    /// recovery, and the work since the last checkpoint done again).
    pub caught_up_s: Option<f64>,
}

/// The whole record of a run.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The job's name.
    pub job: String,
    /// The scenario file.
    pub scenario: String,
    /// Simulated seconds per real second.
    pub time_factor: f64,
    /// How instance speed was made real: `cgroup` or `emulated`.
    pub speed: String,
    /// How rescales were carried out: `live`, `restart`, `restart-no-lb`
    /// or `checkpoint-restart` (docs/cloud.md).
    pub mode: String,
    /// The job's cgroup directory (removed at the end), with quotas.
    pub cgroup: Option<String>,
    /// Cores that speed 1.0 gives a PE.
    pub cpu_per_speed: f64,
    /// The CFS period of the quotas asked for, ms (`cpuPeriodMs`).
    pub cpu_period_ms: f64,
    /// Events.
    pub marks: Vec<Mark>,
    /// Samples.
    pub samples: Vec<Sample>,
    /// Rescales.
    pub rescales: Vec<RescaleRecord>,
    /// Notice-to-commit latencies.
    pub notice_to_commit: Vec<NoticeToCommit>,
    /// Periodic checkpoints (`checkpoint-restart`).
    pub checkpoints: Vec<CheckpointRecord>,
    /// With fault tolerance: K of the job's `+ft-every K`.
    pub fault_tolerance: Option<u64>,
    /// With fault tolerance: members lost without notice, and the recoveries.
    pub recoveries: Vec<RecoveryRecord>,
    /// Every instance and its bill.
    pub instances: Vec<Instance>,
    /// The job's exit code (from `ductile run`).
    pub exit_code: Option<i32>,
    /// The job's last line `checksum=...`, if it printed one.
    pub checksum: Option<String>,
    /// The checksum of an uninterrupted run, when verified.
    pub reference_checksum: Option<String>,
    /// Iterations the job reported last.
    pub iterations: Option<u64>,
    /// Wall time of the job, real seconds.
    pub real_seconds: f64,
    /// Simulated seconds.
    pub sim_seconds: f64,
    /// The policy's target size, in members (instances).
    pub target: u32,
    /// PEs of the launch fleet: the capacity a job of mixed shapes is
    /// measured against in PE-seconds (a replacement of another shape
    /// changes the PEs, not the member count).
    pub target_pes: u32,
    /// Scripted events due after the job ended: they never happened, so
    /// the run did not test what the scenario meant it to.
    pub events_not_happened: Vec<Unreached>,
    /// Per instance with a CPU quota: how long its quota held it back.
    pub throttled: Vec<Throttled>,
}

/// How much an instance's CPU quota throttled it (`cpu.stat` of its cgroup,
/// read at the end of the run).
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Throttled {
    /// The instance.
    pub instance: String,
    /// CFS periods in which it ran out of quota.
    pub periods: u64,
    /// Real seconds its threads waited for quota.
    pub seconds: f64,
}

/// Figures derived from a record.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Rescales committed, by reason.
    pub committed_by_reason: BTreeMap<String, u32>,
    /// Rescales that failed.
    pub failed: u32,
    /// Simulated member-seconds (instance-seconds) the job ran below its
    /// target size.
    pub member_seconds_short: f64,
    /// Simulated PE-seconds the job ran below the launch fleet's PEs.
    pub pe_seconds_short: f64,
    /// Simulated instance-seconds newcomers waited, running, for admission.
    pub idle_newcomer_seconds: f64,
    /// The same in PE-seconds.
    pub idle_newcomer_pe_seconds: f64,
    /// Cost of the fleet as run.
    pub cost: f64,
    /// Cost of the same instance time all on demand.
    pub on_demand_cost: f64,
    /// Notices whose member was removed before its deadline / all notices.
    pub notices_handled: (u32, u32),
    /// Members lost without a rescale.
    pub lost: u32,
    /// Median notice-to-commit, real seconds.
    pub median_notice_to_commit_s: Option<f64>,
    /// Periodic checkpoints written (`checkpoint-restart`).
    pub checkpoints: u32,
    /// Their sync-point waits and writes summed, real seconds.
    pub checkpoint_s: f64,
    /// Real seconds of work lost to kills and done again.
    pub redone_s: f64,
    /// With fault tolerance: losses without notice the job recovered from /
    /// all of them.
    pub recoveries: (u32, u32),
    /// Median real seconds from a kill to the view without its node.
    pub median_recovery_s: Option<f64>,
    /// Real seconds the recovered losses cost, kill to the job back past
    /// its iteration at the kill, summed.
    pub recovery_lost_s: f64,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

impl Record {
    /// The summary figures.
    pub fn summary(&self) -> Summary {
        let mut s = Summary::default();
        for r in &self.rescales {
            match (&r.epoch, &r.error) {
                (Some(_), _) => *s.committed_by_reason.entry(r.reason.clone()).or_default() += 1,
                (None, Some(_)) => s.failed += 1,
                _ => {}
            }
        }
        for w in self.samples.windows(2) {
            let dt = w[1].sim - w[0].sim;
            let members = w[0].on_demand + w[0].spot;
            s.member_seconds_short += f64::from(self.target.saturating_sub(members)) * dt;
            let pes = w[0].on_demand_pes + w[0].spot_pes;
            s.pe_seconds_short += f64::from(self.target_pes.saturating_sub(pes)) * dt;
            s.idle_newcomer_seconds += f64::from(w[0].waiting) * dt;
            s.idle_newcomer_pe_seconds += f64::from(w[0].waiting_pes) * dt;
        }
        let end = std::time::Duration::from_secs_f64(self.sim_seconds);
        for i in &self.instances {
            let (cost, od) = i.cost(end);
            s.cost += cost;
            s.on_demand_cost += od;
        }
        let notices: Vec<&NoticeToCommit> = self.notice_to_commit.iter().filter(|n| n.signal == "notice").collect();
        let noticed = self.marks.iter().filter(|m| m.kind == "notice").count() as u32;
        s.notices_handled = (
            notices.iter().filter(|n| n.before_deadline == Some(true)).count() as u32,
            noticed,
        );
        s.lost = self.marks.iter().filter(|m| m.kind == "lost").count() as u32;
        s.median_notice_to_commit_s = median(notices.iter().map(|n| n.real_s).collect());
        s.checkpoints = self.checkpoints.len() as u32;
        s.checkpoint_s = self.checkpoints.iter().map(|c| (c.wait_ms + c.write_ms) / 1e3).sum();
        s.redone_s = self.rescales.iter().filter(|r| r.epoch.is_some()).filter_map(|r| r.redone_s).sum();
        let recovered: Vec<&RecoveryRecord> = self.recoveries.iter().filter(|r| r.recovered_s.is_some()).collect();
        s.recoveries = (recovered.len() as u32, self.recoveries.len() as u32);
        s.median_recovery_s = median(recovered.iter().filter_map(|r| r.recovered_s).collect());
        s.recovery_lost_s = recovered.iter().filter_map(|r| r.caught_up_s.or(r.recovered_s)).sum();
        s
    }

    /// The summary as a table for the terminal.
    pub fn table(&self) -> String {
        let s = self.summary();
        let mut out = String::new();
        let mut row = |k: &str, v: String| {
            let _ = writeln!(out, "  {k:<24} {v}");
        };
        row(
            "job",
            format!(
                "{} on {} (time factor {}, speed by {}, rescales {})",
                self.job, self.scenario, self.time_factor, self.speed, self.mode
            ),
        );
        row(
            "iterations",
            format!(
                "{} in {:.1} s real ({:.0} s simulated)",
                self.iterations.map_or("-".into(), |i| i.to_string()),
                self.real_seconds,
                self.sim_seconds
            ),
        );
        let reasons: Vec<String> = s.committed_by_reason.iter().map(|(r, n)| format!("{r} {n}")).collect();
        let committed: u32 = s.committed_by_reason.values().sum();
        row(
            "rescales",
            format!(
                "{committed} committed{}, {} failed",
                if reasons.is_empty() { String::new() } else { format!(" ({})", reasons.join(", ")) },
                s.failed
            ),
        );
        for n in &self.notice_to_commit {
            row(
                &format!("{} -> commit", n.signal),
                format!(
                    "{}: {:.2} s real ({:.1} s simulated){}",
                    n.member,
                    n.real_s,
                    n.sim_s,
                    match n.before_deadline {
                        Some(true) => ", before its deadline",
                        Some(false) => ", AFTER its deadline",
                        None => "",
                    }
                ),
            );
        }
        row(
            "notices handled",
            format!("{} of {} before their deadline; {} member(s) lost", s.notices_handled.0, s.notices_handled.1, s.lost),
        );
        row(
            "capacity lost",
            format!(
                "{:.0} member-seconds below the target of {} members, {:.0} PE-seconds below the launch fleet's {} PEs (simulated)",
                s.member_seconds_short, self.target, s.pe_seconds_short, self.target_pes
            ),
        );
        row(
            "idle newcomers",
            format!(
                "{:.0} instance-seconds ({:.0} PE-seconds) waiting for admission",
                s.idle_newcomer_seconds, s.idle_newcomer_pe_seconds
            ),
        );
        if self.mode == "checkpoint-restart" {
            row(
                "checkpoints",
                format!(
                    "{} written ({:.2} s of sync-point waits and writes); {:.2} s of work redone after kills",
                    s.checkpoints, s.checkpoint_s, s.redone_s
                ),
            );
        }
        if let Some(every) = self.fault_tolerance {
            let median = s.median_recovery_s.map_or(String::new(), |m| format!(", median {m:.2} s to a view without the lost node"));
            row(
                "recoveries",
                format!(
                    "{} of {} member(s) lost without notice{median}; {:.2} s lost to them (kill to the job back at its iteration; checkpoints every {every} sync points)",
                    s.recoveries.0, s.recoveries.1, s.recovery_lost_s
                ),
            );
        }
        let saving = if s.on_demand_cost > 0.0 { 100.0 * (1.0 - s.cost / s.on_demand_cost) } else { 0.0 };
        row(
            "cost",
            format!("{:.4} against {:.4} all on demand ({saving:.0}% saved)", s.cost, s.on_demand_cost),
        );
        let verdict = match (&self.checksum, &self.reference_checksum) {
            (Some(c), Some(r)) if c == r => format!("{c}, equal to the uninterrupted run's"),
            (Some(c), Some(r)) => format!("{c} DIFFERS from the uninterrupted run's {r}"),
            (Some(c), None) => format!("{c} (not verified)"),
            (None, _) => "- (the job printed none)".into(),
        };
        row("checksum", verdict);
        row(
            "exit",
            self.exit_code.map_or("-".into(), |c| c.to_string()),
        );
        if !self.events_not_happened.is_empty() {
            let events: Vec<String> = self
                .events_not_happened
                .iter()
                .map(|e| format!("line {}: {} at {:.0} s", e.line, e.event, e.at))
                .collect();
            row(
                "WARNING",
                format!(
                    "{} scripted event(s) never happened, the job ended at {:.0} s simulated first: {}",
                    events.len(),
                    self.sim_seconds,
                    events.join("; ")
                ),
            );
        }
        out
    }

    /// The checksum is verified equal (or there was nothing to verify).
    pub fn checksum_ok(&self) -> bool {
        match (&self.checksum, &self.reference_checksum) {
            (Some(c), Some(r)) => c == r,
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sim: f64, od: u32, spot: u32, waiting: u32) -> Sample {
        Sample {
            sim,
            on_demand: od,
            spot,
            on_demand_pes: od,
            spot_pes: spot,
            waiting,
            waiting_pes: waiting,
            ..Sample::default()
        }
    }

    #[test]
    fn the_summary_integrates_shortfall_and_idle_time_and_counts_rescales() {
        let mut r = Record {
            target: 4,
            target_pes: 4,
            sim_seconds: 30.0,
            ..Record::default()
        };
        r.samples = vec![sample(0.0, 1, 3, 0), sample(10.0, 1, 2, 1), sample(20.0, 1, 3, 0), sample(30.0, 1, 3, 0)];
        let rescale = |reason: &str, epoch: Option<u64>, error: Option<&str>| RescaleRecord {
            reason: reason.into(),
            remove: vec![],
            admit: 0,
            asked_sim: 0.0,
            asked_real: 0.0,
            done_real: None,
            done_sim: None,
            epoch,
            admitted: vec![],
            mechanism_ms: None,
            error: error.map(Into::into),
            migrations: None,
            redone_s: if reason == "Emergency" { Some(1.5) } else { None },
        };
        r.rescales = vec![
            rescale("Emergency", Some(2), None),
            rescale("Emergency", Some(3), None),
            rescale("Timeout", None, Some("refused")),
        ];
        let s = r.summary();
        assert_eq!(s.member_seconds_short, 10.0, "one member short for 10 s");
        assert_eq!(s.idle_newcomer_seconds, 10.0);
        assert_eq!(s.committed_by_reason["Emergency"], 2);
        assert_eq!(s.failed, 1);
        let table = r.table();
        assert!(table.contains("2 committed (Emergency 2), 1 failed"), "{table}");
        assert_eq!(s.redone_s, 3.0, "work redone by the committed relaunches");
        assert!(!table.contains("checkpoints"), "{table}");
        r.mode = "checkpoint-restart".into();
        r.checkpoints.push(CheckpointRecord {
            sim: 5.0,
            real: 0.5,
            wait_ms: 100.0,
            write_ms: 150.0,
            bytes: 10,
        });
        let table = r.table();
        assert!(table.contains("1 written (0.25 s of sync-point waits and writes); 3.00 s of work redone"), "{table}");
    }

    #[test]
    fn capacity_is_counted_in_members_and_in_pes() {
        // Launch: one on-demand and three spot instances of 1 PE; a spot
        // member is lost for 10 s, then a 2-PE instance replaces it.
        let mut r = Record {
            target: 4,
            target_pes: 4,
            sim_seconds: 30.0,
            ..Record::default()
        };
        let s = |sim, spot, spot_pes, waiting_pes| Sample {
            sim,
            on_demand: 1,
            on_demand_pes: 1,
            spot,
            spot_pes,
            waiting: u32::from(waiting_pes > 0),
            waiting_pes,
            ..Sample::default()
        };
        r.samples = vec![s(0.0, 3, 3, 0), s(10.0, 2, 2, 2), s(20.0, 3, 4, 0), s(30.0, 3, 4, 0)];
        let sum = r.summary();
        assert_eq!(sum.member_seconds_short, 10.0);
        assert_eq!(sum.pe_seconds_short, 10.0, "more PEs than at launch is no shortfall");
        assert_eq!(sum.idle_newcomer_seconds, 10.0);
        assert_eq!(sum.idle_newcomer_pe_seconds, 20.0, "the waiting newcomer runs 2 PEs");
        let table = r.table();
        assert!(table.contains("10 member-seconds below the target of 4 members, 10 PE-seconds below the launch fleet's 4 PEs"), "{table}");
        assert!(table.contains("10 instance-seconds (20 PE-seconds) waiting"), "{table}");
    }

    #[test]
    fn events_that_never_happened_get_a_warning_line_and_a_json_field() {
        let mut r = Record {
            sim_seconds: 173.0,
            ..Record::default()
        };
        assert!(!r.table().contains("WARNING"), "{}", r.table());
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["eventsNotHappened"], serde_json::json!([]));
        r.events_not_happened.push(Unreached {
            line: 7,
            at: 200.0,
            event: "interruption of j-3 (deadline 120 s)".into(),
        });
        let table = r.table();
        assert!(
            table.contains("WARNING                  1 scripted event(s) never happened, the job ended at 173 s simulated first: line 7: interruption of j-3 (deadline 120 s) at 200 s"),
            "{table}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["eventsNotHappened"][0]["line"], 7);
        assert_eq!(json["eventsNotHappened"][0]["at"], 200.0);
    }

    #[test]
    fn the_checksum_verdict_says_equal_or_differs() {
        let mut r = Record {
            checksum: Some("ab".into()),
            reference_checksum: Some("ab".into()),
            ..Record::default()
        };
        assert!(r.checksum_ok());
        assert!(r.table().contains("ab, equal to the uninterrupted run's"));
        r.reference_checksum = Some("cd".into());
        assert!(!r.checksum_ok());
        assert!(r.table().contains("DIFFERS"));
    }

    #[test]
    fn recoveries_are_counted_with_their_median_and_the_time_they_cost() {
        let rec = |recovered_s: Option<f64>, caught_up_s: Option<f64>| RecoveryRecord {
            instance: "j-2".into(),
            recovered_s,
            caught_up_s,
            ..RecoveryRecord::default()
        };
        let mut r = Record {
            fault_tolerance: Some(5),
            ..Record::default()
        };
        r.recoveries = vec![rec(Some(0.4), Some(2.0)), rec(Some(0.6), None), rec(None, None)];
        let s = r.summary();
        assert_eq!(s.recoveries, (2, 3));
        assert_eq!(s.median_recovery_s, Some(0.5));
        // A recovery whose catching up was not seen counts its recovery only.
        assert!((s.recovery_lost_s - 2.6).abs() < 1e-9, "{}", s.recovery_lost_s);
        let table = r.table();
        assert!(table.contains("recoveries"), "{table}");
        assert!(table.contains("2 of 3 member(s) lost without notice, median 0.50 s"), "{table}");
        assert!(!Record::default().table().contains("recoveries"), "no row without fault tolerance");
    }
}
