//! `ductile expand`, `ductile shrink` and `ductile rescale`: resize a running
//! job without restarting it (or, with `--mode restart`, by a checkpoint and
//! a relaunch, the baseline). Newcomers are started by the job's launcher
//! (asked through [`crate::local::channel`]); the rescale itself is asked of
//! node 0's control endpoint.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use ductile_coordinator::control::{ControlError, JobStatus, RescaleReport, RescaleRequest};
use ductile_coordinator::proto::{Epoch, NodeId};
use serde::Serialize;

use super::job::{connect_job, JobConnection};
use super::{say, Mode, RescaleOptions, EXIT_FAILED, EXIT_USAGE};
use crate::local::channel::{self, ChannelError, Reply, Request, MAX_SPAWN};
use crate::local::process::{pid_alive, POLL_INTERVAL};
use crate::local::restart::{self, RestartError};
use crate::state::{read_job_state, LAUNCHER_SOCKET_FILE};

/// Which nodes a rescale removes, as the user named them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// None.
    None,
    /// The K highest-numbered nodes.
    Highest(u32),
    /// These node ids.
    Ids(Vec<NodeId>),
}

/// Turns what the user asked for into the request for a job of `nodes`
/// nodes in the view of `epoch`: the ids to remove (ascending) and how many
/// newcomers to admit. Node 0 never leaves.
pub fn plan_rescale(
    removal: &Removal,
    add: u32,
    nodes: u32,
    epoch: Epoch,
) -> Result<RescaleRequest, String> {
    let remove: Vec<NodeId> = match removal {
        Removal::None => Vec::new(),
        Removal::Highest(k) if *k >= nodes => {
            return Err(format!(
                "cannot remove {k} of the job's {nodes} node{}: node 0 never leaves, so at most {}",
                if nodes == 1 { "" } else { "s" },
                nodes.saturating_sub(1)
            ))
        }
        Removal::Highest(k) => (nodes - k..nodes).collect(),
        Removal::Ids(ids) => {
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            for pair in sorted.windows(2) {
                if pair[0] == pair[1] {
                    return Err(format!("node {} is named twice", pair[0]));
                }
            }
            if sorted.first() == Some(&0) {
                return Err("node 0 never leaves: it runs the job's main chare and serves its control endpoint".to_owned());
            }
            if let Some(&id) = sorted.iter().find(|&&id| id >= nodes) {
                return Err(format!(
                    "there is no node {id}: the job's nodes are 0..={}",
                    nodes.saturating_sub(1)
                ));
            }
            sorted
        }
    };
    if remove.is_empty() && add == 0 {
        return Err("nothing to do: name nodes to remove or a number to add".to_owned());
    }
    Ok(RescaleRequest {
        epoch,
        remove,
        admit: add,
    })
}

/// `ductile expand/shrink/rescale --json`: the job's report, plus the pids of
/// the newcomers this command had the launcher start.
#[derive(Serialize)]
struct RescaleOutput<'a> {
    #[serde(flatten)]
    report: &'a RescaleReport,
    spawned_pids: &'a [u32],
    /// `--mode restart`: the job was relaunched from a checkpoint, a new
    /// job whose epochs count again from 1 (absent for a live rescale).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    relaunched: bool,
}

fn ids(ids: &[NodeId]) -> String {
    if ids.is_empty() {
        return "-".to_owned();
    }
    ids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The human form of a rescale's report.
pub fn render_report(report: &RescaleReport, spawned_pids: &[u32]) -> String {
    render(report, spawned_pids, false)
}

/// The human form of a live rescale's report, or (`relaunched`) of a
/// `--mode restart` one, whose epoch after is the new job's.
fn render(report: &RescaleReport, spawned_pids: &[u32], relaunched: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "epoch       {} -> {}{}",
        report.epoch_before,
        report.epoch,
        if relaunched {
            " (relaunched from a checkpoint: a new job, its epochs count from 1)"
        } else {
            ""
        }
    );
    let _ = writeln!(out, "PEs         {} -> {}", report.pes_before, report.pes);
    let _ = writeln!(out, "removed     {}", ids(&report.removed));
    let _ = writeln!(out, "admitted    {}", ids(&report.admitted));
    if !spawned_pids.is_empty() {
        let pids: Vec<String> = spawned_pids.iter().map(u32::to_string).collect();
        let _ = writeln!(out, "started     pids {}", pids.join(", "));
    }
    let _ = writeln!(out, "migrations  {}", report.migrations);
    // GPU work is part of the stages above it; shown indented under them.
    let gpu: Vec<(String, f64)> = report
        .gpu
        .iter()
        .map(|g| (format!("  of which gpu {}", g.stage), g.ms))
        .collect();
    let width = report
        .stages
        .iter()
        .map(|s| s.stage.len())
        .chain(gpu.iter().map(|(name, _)| name.len()))
        .chain(["mechanism".len()])
        .max()
        .unwrap_or(0);
    let _ = writeln!(out);
    let _ = writeln!(out, "{:<width$} {:>10}", "stage", "ms");
    for stage in &report.stages {
        let _ = writeln!(out, "{:<width$} {:>10.2}", stage.stage, stage.ms);
    }
    for (name, ms) in &gpu {
        let _ = writeln!(out, "{name:<width$} {ms:>10.2}");
    }
    let _ = writeln!(out, "{:<width$} {:>10.2}", "mechanism", report.mechanism_ms);
    let _ = writeln!(out, "{:<width$} {:>10.2}", "total", report.total_ms);
    out
}

/// How a newcomer this command started is gone, if it is (as the launcher
/// recorded it, once it has).
fn newcomer_gone(dir: &Path, pid: u32) -> Option<Option<String>> {
    if pid_alive(pid) {
        return None;
    }
    let recorded = read_job_state(dir)
        .ok()
        .and_then(|state| state.newcomers.into_iter().find(|n| n.pid == pid))
        .and_then(|n| n.exit);
    Some(recorded)
}

/// Asks the launcher to stop newcomers that will not be admitted, so none is
/// left waiting; tells the user if it cannot.
fn stop_unadmitted(dir: &Path, pids: &[u32]) {
    let alive: Vec<u32> = pids.iter().copied().filter(|&p| pid_alive(p)).collect();
    if alive.is_empty() {
        return;
    }
    let socket = dir.join(LAUNCHER_SOCKET_FILE);
    match channel::request(
        &socket,
        &Request::Stop {
            pids: alive.clone(),
        },
        Duration::from_secs(10),
    ) {
        Ok(Reply::Ok(_)) => say(&format!(
            "stopped the newcomers started for it (pids {})",
            pid_list(&alive)
        )),
        Ok(Reply::Error(message)) => say(&format!(
            "could not stop the newcomers started for it (pids {}): {message}",
            pid_list(&alive)
        )),
        Err(err) => say(&format!(
            "could not stop the newcomers started for it (pids {}): {err}",
            pid_list(&alive)
        )),
    }
}

fn pid_list(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `ductile scale --nodes N`: the job's size as a target (like `kubectl
/// scale --replicas`): the difference to the current size is added
/// (`expand`) or removed from the highest-numbered nodes (`shrink`).
pub fn scale(nodes: u32, pes: Option<u32>, options: &RescaleOptions) -> i32 {
    let current = match connect_job(&options.target, options.timeout) {
        Ok(mut job) => match job.client.status() {
            Ok(status) => status.members.len() as u32,
            Err(e) => {
                say(&format!("the job did not answer a status request: {e}"));
                return EXIT_FAILED;
            }
        },
        Err(err) => {
            say(err.message());
            return EXIT_USAGE;
        }
    };
    match nodes.cmp(&current) {
        std::cmp::Ordering::Equal => {
            say(&format!(
                "the job already has {nodes} node{}; nothing to do",
                if nodes == 1 { "" } else { "s" }
            ));
            0
        }
        std::cmp::Ordering::Greater => {
            let add = nodes - current;
            if add > MAX_SPAWN {
                say(&format!(
                    "that adds {add} nodes; at most {MAX_SPAWN} at once"
                ));
                return EXIT_USAGE;
            }
            rescale(Removal::None, add, pes, options)
        }
        std::cmp::Ordering::Less => rescale(Removal::Highest(current - nodes), 0, None, options),
    }
}

/// The least time the launcher gets to answer a spawn request.
const SPAWN_REPLY_FLOOR: Duration = Duration::from_secs(10);

/// `ductile expand`, `ductile shrink` and `ductile rescale`: checks the
/// request against the job's membership, has the launcher start the
/// newcomers and waits until they are registered, then asks node 0 for the
/// rescale and reports it. Returns the exit code.
/// `pes`: the newcomers' PE count (`None`: the job's).
pub fn rescale(removal: Removal, add: u32, pes: Option<u32>, options: &RescaleOptions) -> i32 {
    if pes.is_some() && options.mode == Mode::Restart {
        // A relaunch starts every node with one shape (docs/cli.md).
        say("--pes is for live rescales: --mode restart relaunches every node with the job's --pes-per-node");
        return EXIT_USAGE;
    }
    let deadline = Instant::now() + options.timeout;
    let mut job = match connect_job(&options.target, options.timeout) {
        Ok(job) => job,
        Err(err) => {
            say(err.message());
            return EXIT_USAGE;
        }
    };
    let status = match job.client.status() {
        Ok(status) => status,
        Err(e) => {
            say(&format!("the job did not answer a status request: {e}"));
            return EXIT_FAILED;
        }
    };
    let request = match plan_rescale(&removal, add, status.members.len() as u32, status.epoch) {
        Ok(request) => request,
        Err(message) => {
            say(&message);
            return EXIT_USAGE;
        }
    };

    if options.mode == Mode::Restart {
        return rescale_by_restart(job, &status, &request, options, deadline);
    }

    let mut spawned: Vec<u32> = Vec::new();
    if add > 0 {
        // Starting processes takes the launcher milliseconds; a reply cut
        // off by a very short --timeout would leave newcomers nobody knows
        // of, so the spawn itself gets a floor (what it started is stopped
        // below when the command gives up).
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(SPAWN_REPLY_FLOOR);
        let asked = ask_launcher(&job.dir, &Request::Spawn { count: add, pes }, left);
        match asked {
            Ok(pids) => spawned = pids,
            Err(code) => return code,
        }
        say(&format!(
            "started {} newcomer{} (pid{} {}); waiting for {} to register",
            spawned.len(),
            if spawned.len() == 1 { "" } else { "s" },
            if spawned.len() == 1 { "" } else { "s" },
            pid_list(&spawned),
            if spawned.len() == 1 { "it" } else { "them" },
        ));
        if let Err(message) = wait_for_newcomers(&mut job, &spawned, add, deadline, options.timeout)
        {
            say(&message);
            stop_unadmitted(&job.dir, &spawned);
            return EXIT_FAILED;
        }
    }

    let report = match ask_fenced(&mut job, &removal, add, request, deadline) {
        Ok(report) => report,
        Err(e @ (ControlError::ViewChanged { .. } | ControlError::Busy(_))) => {
            let advice = if matches!(removal, Removal::Ids(_)) {
                "the node ids you named were read from the old view and may name other nodes now: \
                 see `ductile status` and ask again"
            } else {
                "nothing was rescaled"
            };
            say(&format!("the job refused the rescale: {e}; {advice}"));
            stop_unadmitted(&job.dir, &spawned);
            return EXIT_FAILED;
        }
        Err(ControlError::Refused(message)) => {
            say(&format!("the job refused the rescale: {message}"));
            stop_unadmitted(&job.dir, &spawned);
            return EXIT_FAILED;
        }
        Err(ControlError::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            say(&format!(
                "the job did not report the rescale within --timeout ({:.1}s); it may still complete: see `ductile status`",
                options.timeout.as_secs_f64()
            ));
            // A command that gives up cancels what it started: newcomers not
            // admitted by now are stopped (the launcher refuses to stop one
            // that was admitted meanwhile).
            stop_unadmitted(&job.dir, &spawned);
            return EXIT_FAILED;
        }
        Err(e) => {
            say(&format!(
                "the rescale failed: {e}; see `ductile status` for where the job stands"
            ));
            return EXIT_FAILED;
        }
    };
    print_report(&report, &spawned, options.json)
}

/// Asks node 0 for `request` (computed against the view of its epoch).
/// When the view changed meanwhile or another rescale is in flight, a
/// request that can be recomputed (`--nodes K`, additions only) is computed
/// again from a fresh view and asked again until `deadline`; one that names
/// node ids the user saw is not (they may name other nodes now): the
/// refusal is returned.
fn ask_fenced(
    job: &mut JobConnection,
    removal: &Removal,
    add: u32,
    mut request: RescaleRequest,
    deadline: Instant,
) -> Result<RescaleReport, ControlError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let refusal = match job
            .client
            .rescale(request.clone(), left.max(Duration::from_millis(1)))
        {
            Err(e @ (ControlError::ViewChanged { .. } | ControlError::Busy(_)))
                if !matches!(removal, Removal::Ids(_)) && Instant::now() < deadline =>
            {
                e
            }
            other => return other,
        };
        say(&format!("{refusal}; reading the view again"));
        if matches!(refusal, ControlError::Busy(_)) {
            std::thread::sleep(POLL_INTERVAL);
        }
        let status = job.client.status()?;
        request = plan_rescale(removal, add, status.members.len() as u32, status.epoch)
            .map_err(|message| ControlError::Refused(message))?;
    }
}

/// Sends `request` to the job's launcher (`STATE/launcher.sock`); its
/// answer's pids, or the exit code after saying what went wrong.
fn ask_launcher(dir: &Path, request: &Request, timeout: Duration) -> Result<Vec<u32>, i32> {
    channel::ask(&dir.join(LAUNCHER_SOCKET_FILE), request, timeout).map_err(|err| {
        say(&err.to_string());
        match err {
            ChannelError::NoLauncher { .. } => EXIT_USAGE,
            _ => EXIT_FAILED,
        }
    })
}

/// Prints a rescale's report as a table or JSON; returns the exit code.
fn print_report(report: &RescaleReport, spawned: &[u32], json: bool) -> i32 {
    emit_report(report, spawned, json, false)
}

fn emit_report(report: &RescaleReport, spawned: &[u32], json: bool, relaunched: bool) -> i32 {
    if json {
        let output = RescaleOutput {
            report,
            spawned_pids: spawned,
            relaunched,
        };
        match serde_json::to_string_pretty(&output) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                say(&format!("cannot encode the report: {e}"));
                return EXIT_FAILED;
            }
        }
    } else {
        print!("{}", render(report, spawned, relaunched));
    }
    0
}

/// `--mode restart`: the kill-and-restart baseline
/// ([`crate::local::restart`]), reported like a live rescale.
fn rescale_by_restart(
    mut job: JobConnection,
    status: &JobStatus,
    request: &RescaleRequest,
    options: &RescaleOptions,
    deadline: Instant,
) -> i32 {
    match restart::restart(&job.dir, &mut job.client, status, request, deadline) {
        Ok(restarted) => emit_report(&restarted.report, &[], options.json, true),
        Err(e) => {
            say(&e.to_string());
            match e {
                // Nothing happened: no launcher, or it refused (a relaunch
                // already arranged, nodes of different PE counts).
                RestartError::Launcher(
                    ChannelError::NoLauncher { .. } | ChannelError::Refused { .. },
                ) => EXIT_USAGE,
                _ => EXIT_FAILED,
            }
        }
    }
}

/// Polls the job's status until at least `count` newcomers wait for
/// admission; fails if one of `spawned` ends first or the deadline passes.
fn wait_for_newcomers(
    job: &mut JobConnection,
    spawned: &[u32],
    count: u32,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), String> {
    // A pid gone but not yet recorded by the launcher: give the record a moment.
    let mut gone_since: Option<Instant> = None;
    loop {
        let status = job
            .client
            .status()
            .map_err(|e| format!("the job did not answer a status request: {e}"))?;
        if status.pending.len() >= count as usize {
            return Ok(());
        }
        for &pid in spawned {
            if let Some(exit) = newcomer_gone(&job.dir, pid) {
                let since = *gone_since.get_or_insert_with(Instant::now);
                if exit.is_some() || since.elapsed() >= Duration::from_millis(500) {
                    let how = exit.unwrap_or_else(|| "is gone".to_owned());
                    return Err(format!(
                        "newcomer pid {pid} {how} before the rescale (its output is in the `ductile run` terminal); nothing was rescaled"
                    ));
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "only {} of {count} newcomers registered with the job within --timeout ({:.1}s); nothing was rescaled",
                status.pending.len(),
                timeout.as_secs_f64()
            ));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rescale_plans_are_checked_against_the_membership() {
        let ok = |remove: Vec<NodeId>, admit: u32| {
            Ok(RescaleRequest {
                epoch: 7,
                remove,
                admit,
            })
        };
        let table: &[(Removal, u32, u32, Result<RescaleRequest, &str>)] = &[
            (Removal::None, 2, 2, ok(vec![], 2)),
            (Removal::Highest(1), 0, 4, ok(vec![3], 0)),
            (Removal::Highest(3), 0, 4, ok(vec![1, 2, 3], 0)),
            (Removal::Highest(4), 0, 4, Err("cannot remove 4 of the job's 4 nodes: node 0 never leaves, so at most 3")),
            (Removal::Highest(1), 0, 1, Err("cannot remove 1 of the job's 1 node: node 0 never leaves, so at most 0")),
            (Removal::Ids(vec![3, 1]), 0, 4, ok(vec![1, 3], 0)),
            (Removal::Ids(vec![2]), 1, 3, ok(vec![2], 1)),
            (Removal::Ids(vec![0, 2]), 0, 4, Err("node 0 never leaves: it runs the job's main chare and serves its control endpoint")),
            (Removal::Ids(vec![2, 2]), 0, 4, Err("node 2 is named twice")),
            (Removal::Ids(vec![1, 4]), 0, 4, Err("there is no node 4: the job's nodes are 0..=3")),
            (Removal::None, 0, 4, Err("nothing to do: name nodes to remove or a number to add")),
        ];
        for (removal, add, nodes, want) in table {
            let got = plan_rescale(removal, *add, *nodes, 7);
            assert_eq!(
                got,
                want.clone().map_err(str::to_owned),
                "{removal:?} +{add} of {nodes}"
            );
        }
    }

    fn report() -> RescaleReport {
        use ductile_coordinator::control::StageTime;
        RescaleReport {
            epoch_before: 1,
            epoch: 2,
            removed: vec![3],
            admitted: vec![3, 4],
            pes_before: 8,
            pes: 10,
            migrations: 12,
            stages: ["evacuate", "stop", "commit", "reconcile"]
                .iter()
                .zip([3.214, 0.4, 1.0, 12.5])
                .map(|(stage, ms)| StageTime {
                    stage: (*stage).to_owned(),
                    ms,
                })
                .collect(),
            mechanism_ms: 13.9,
            total_ms: 17.114,
            gpu: vec![],
        }
    }

    #[test]
    fn a_report_renders_as_a_table() {
        let text = render_report(&report(), &[4711, 4712]);
        let want = "\
epoch       1 -> 2
PEs         8 -> 10
removed     3
admitted    3, 4
started     pids 4711, 4712
migrations  12

stage             ms
evacuate        3.21
stop            0.40
commit          1.00
reconcile      12.50
mechanism      13.90
total          17.11
";
        assert_eq!(text, want);
        let shrink = RescaleReport {
            admitted: vec![],
            ..report()
        };
        let text = render_report(&shrink, &[]);
        assert!(text.contains("admitted    -\n"), "{text}");
        assert!(!text.contains("started"), "{text}");
        assert!(!text.contains("gpu"), "{text}");
    }

    #[test]
    fn gpu_work_is_listed_under_the_stages() {
        use ductile_coordinator::control::StageTime;
        let gpu = RescaleReport {
            gpu: vec![StageTime {
                stage: "staging".into(),
                ms: 2.5,
            }],
            ..report()
        };
        let text = render_report(&gpu, &[]);
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("  of which gpu staging"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(lines[at].ends_with("2.50"), "{text}");
        assert!(lines[at - 1].starts_with("reconcile"), "{text}");
        assert!(lines[at + 1].starts_with("mechanism"), "{text}");
        // Older reports (no `gpu` field) still read.
        let mut value = serde_json::to_value(report()).unwrap();
        value.as_object_mut().unwrap().remove("gpu");
        let back: RescaleReport = serde_json::from_value(value).unwrap();
        assert!(back.gpu.is_empty());
    }

    #[test]
    fn a_report_as_json_is_the_report_and_the_started_pids() {
        let report = report();
        let text = serde_json::to_string(&RescaleOutput {
            report: &report,
            spawned_pids: &[4711],
            relaunched: false,
        })
        .unwrap();
        let back: RescaleReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back, report);
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["spawned_pids"], serde_json::json!([4711]));
        assert_eq!(value["stages"][0]["stage"], "evacuate");
        assert!(value.get("relaunched").is_none(), "{value}");
    }

    #[test]
    fn a_restart_report_says_the_job_was_relaunched() {
        let report = RescaleReport {
            epoch_before: 3,
            epoch: 1,
            ..report()
        };
        let text = render(&report, &[], true);
        assert!(
            text.starts_with("epoch       3 -> 1 (relaunched from a checkpoint"),
            "{text}"
        );
        assert!(text.contains("admitted    3, 4\n"), "{text}");
        let json = serde_json::to_value(RescaleOutput {
            report: &report,
            spawned_pids: &[],
            relaunched: true,
        })
        .unwrap();
        assert_eq!(json["relaunched"], true);
    }
}
