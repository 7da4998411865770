//! Faults and races around rescales, with real processes: requests that
//! overlap, nodes stopped or killed at chosen steps. Each case must end
//! cleanly (the job goes on at a size it reports, or fails naming the step),
//! never hang, never remove the wrong node, never change the checksum.
//!
//! Timing is made deterministic by holding processes with SIGSTOP at the
//! point the race needs: newcomers of these jobs start through a wrapper
//! that stops itself before it becomes the program, so a test decides when
//! a newcomer registers.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use ductile_coordinator::proto::Member;
use ductile_e2e::background::{report, Background, WAIT};
use ductile_e2e::{alive, eventually, reference_checksum, signal};
use serde_json::Value;

/// A shell wrapper that stops a newcomer (SIGSTOP to itself, same pid as
/// the program it then becomes) until the test continues it.
const HOLD_NEWCOMERS: &str = "#!/bin/sh\n\
if [ \"$DUCTILE_ROLE\" = newcomer ]; then kill -STOP $$; fi\n\
exec \"$@\"\n";

/// Starts `jacobi2d spec` on `nodes` x 1 PE with `env` for every process;
/// newcomers stop themselves when `hold_newcomers`.
fn start(nodes: u32, spec: &[String], hold_newcomers: bool, env: &[(&str, &str)]) -> Background {
    let state = tempfile::tempdir().expect("temp dir");
    let mut launch = Background::launch(nodes, "jacobi2d", spec);
    if hold_newcomers {
        let wrapper = state.path().join("hold.sh");
        std::fs::write(&wrapper, HOLD_NEWCOMERS).expect("wrapper");
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        launch = launch.prefix(&wrapper);
    }
    // Every node says how it learned of a loss (the lowest-numbered survivor
    // alone says it at error level): a failure here then shows which node
    // noticed first, and how.
    launch = launch.env("DUCTILE_LOG", DIAGNOSTIC_LOG);
    for (k, v) in env {
        launch = launch.env(k, v);
    }
    launch.state(state).start()
}

/// Node log filter of these jobs: warnings, plus each node's account of a
/// lost peer (`info`) and of failed sends and cut connections (`debug`).
const DIAGNOSTIC_LOG: &str =
    "warn,ductile::node::shared=info,ductile::pe::send=debug,ductile::transport::tcp=debug";

fn uids(members: &[Member]) -> Vec<u64> {
    members.iter().map(|m| m.uid).collect()
}

/// The state letter of `/proc/PID/stat` (`T`: stopped).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces.
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Waits for a newcomer the launcher started (listed in `job.json`) that is
/// not in `seen` and has stopped itself; its pid.
fn held_newcomer(job: &Background, seen: &[u32]) -> u32 {
    let mut found = None;
    let ok = eventually(WAIT, || {
        let Ok(text) = std::fs::read_to_string(job.path("job.json")) else {
            return false;
        };
        let Ok(record) = serde_json::from_str::<Value>(&text) else {
            return false;
        };
        let pids = record["newcomers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n["pid"].as_u64())
            .map(|p| p as u32);
        for pid in pids {
            if !seen.contains(&pid) && proc_state(pid) == Some('T') {
                found = Some(pid);
                return true;
            }
        }
        false
    });
    assert!(ok, "no held newcomer appeared in job.json");
    found.expect("found")
}

/// Issue 15, item 1: tool A asks to remove node 2 and admit a newcomer;
/// while A's newcomer is held (so A has not asked node 0 yet), tool B
/// removes node 1, which renumbers node 3 as node 2. A's request names the
/// view it was computed against, so node 0 refuses it instead of removing
/// the node that had been node 3; A says why, stops its newcomer, and
/// exits 1. A request that can be recomputed (`expand`, `shrink --nodes`)
/// is read again and carried out in the new view.
#[test]
fn a_request_computed_against_an_old_view_is_refused_not_misapplied() {
    let spec = ductile_e2e::jacobi_args(40_000);
    let want = reference_checksum(&spec);
    let job = start(4, &spec, true, &[]);
    let first = job.members();
    assert_eq!(first.len(), 4);

    // A: ids the user saw. Held once its newcomer started.
    let a = job.spawn_ductile(&["rescale", "--remove", "2", "--add", "1"]);
    let held = held_newcomer(&job, &[]);
    // B, meanwhile: node 1 leaves; node 3 becomes node 2.
    let b = job.ductile(&["shrink", "--remove", "1"]);
    assert_eq!(b["removed"], serde_json::json!([1]));
    assert_eq!(b["epoch"].as_u64(), Some(2), "{b}");
    signal(held, "-CONT");
    let out = a.wait_with_output().expect("tool A");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "tool A must fail\n{stderr}");
    assert!(
        stderr.contains("the view changed: epoch 1, now 2"),
        "tool A does not say why\n{stderr}"
    );
    // The node A meant (old node 2) is still there; old node 3 too.
    let now = job.members();
    assert_eq!(
        uids(&now),
        vec![first[0].uid, first[2].uid, first[3].uid],
        "a node A did not mean was removed"
    );
    assert!(
        eventually(WAIT, || !alive(held)),
        "tool A left its newcomer running"
    );

    // A recomputable request survives the same race: re-read, asked again.
    let c = job.spawn_ductile(&["expand", "--nodes", "1"]);
    let held = held_newcomer(&job, &[held]);
    let d = job.ductile(&["shrink", "--nodes", "1"]);
    assert_eq!(d["epoch"].as_u64(), Some(3), "{d}");
    signal(held, "-CONT");
    let c = report(&["expand"], c.wait_with_output().expect("tool C"));
    assert_eq!(c["epoch_before"].as_u64(), Some(3), "{c}");
    assert_eq!(c["admitted"], serde_json::json!([2]), "{c}");
    let now = job.members();
    assert_eq!(now.len(), 3);
    assert_eq!(now[2].pid, held, "the held newcomer was admitted");
    assert_eq!(uids(&now[..2]), vec![first[0].uid, first[2].uid]);
    job.finish().completes_with(&want);
}

/// Issue 15, item 2: with a node stopped (SIGSTOP), a shrink cannot
/// evacuate (the load-balancing step waits for that node's statistics).
/// Past the stage's bound node 0 abandons it, names the node, and the job
/// goes on at its size; once the node runs again, a rescale works and the
/// checksum is the reference's.
#[test]
fn a_stopped_node_gets_the_evacuate_stage_abandoned_not_stalled() {
    let spec = ductile_e2e::jacobi_args(30_000);
    let want = reference_checksum(&spec);
    let job = start(
        4,
        &spec,
        false,
        &[("DUCTILE_RESCALE_STAGE_TIMEOUT_MS", "2000")],
    );
    let first = job.members();
    signal(first[3].pid, "-STOP");
    let out = job
        .spawn_ductile(&["shrink", "--remove", "2"])
        .wait_with_output()
        .expect("ductile shrink");
    signal(first[3].pid, "-CONT");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "the shrink must fail\n{stderr}");
    assert!(
        stderr.contains("abandoned in stage evacuate")
            && stderr.contains("node 3")
            && stderr.contains("the job goes on at its size"),
        "the refusal does not say what happened\n{stderr}"
    );
    // Nothing changed, and nothing runs later.
    std::thread::sleep(Duration::from_millis(500));
    let status = job.control().status().expect("status");
    assert_eq!(status.epoch, 1);
    assert_eq!(uids(&status.members), uids(&first));
    // The job is sound: the same shrink now goes through.
    let r = job.ductile(&["shrink", "--remove", "2"]);
    assert_eq!(r["epoch"].as_u64(), Some(2), "{r}");
    job.finish().completes_with(&want);
}

/// Issue 15, item 4: strangers flood the job's coordinator — idle
/// connections re-dialled as the coordinator sheds them, and peers sending
/// garbage — while `ductile expand` starts a newcomer that must register
/// with it. The expand succeeds, the coordinator's descriptors and threads
/// stay within bounds that do not depend on the flood, and the checksum is
/// the reference's.
#[test]
fn a_flood_of_strangers_at_the_coordinator_does_not_stop_an_expand() {
    use ductile_e2e::flood::{fds_and_threads, Flood, Peak};
    let spec = ductile_e2e::jacobi_args(30_000);
    let want = reference_checksum(&spec);
    let job = start(2, &spec, false, &[]);
    assert_eq!(job.members().len(), 2);
    let (pid, addr) = job.coordinator();
    let (base_fds, base_threads) = fds_and_threads(pid);

    // Three threads holding up to 150 idle connections each, one sending
    // garbage.
    let flood = Flood::start(&addr, 3, 150, 1);
    let peak = Peak::watch(pid);
    assert!(
        eventually(WAIT, || flood.dialled() > 300),
        "the flood did not get going"
    );
    let r = job.ductile(&["expand", "--nodes", "1"]);
    let during = flood.dialled();
    flood.stop();
    let (worst_fds, worst_threads) = peak.stop();
    assert_eq!(r["admitted"], serde_json::json!([2]), "{r}");
    assert_eq!(job.members().len(), 3);
    let budget = ductile_coordinator::server::MAX_UNAUTHENTICATED;
    assert!(during > 300, "the flood was too small to mean anything");
    // The newcomer's connection and a tool's are the only new authenticated ones.
    assert!(
        worst_fds <= base_fds + budget + 4,
        "the coordinator's descriptors grew with the flood: {worst_fds} (before: {base_fds}, budget {budget}, {during} dialled)"
    );
    assert!(
        worst_threads <= base_threads + 2,
        "the coordinator's threads grew with the flood: {worst_threads} (before: {base_threads})"
    );
    job.finish().completes_with(&want);
}
