//! No-restart elasticity with real processes: jobs started with `ductile
//! run`, rescaled with `ductile expand/shrink/rescale` while they compute
//! (ghost messages are always in flight in Jacobi2D), newcomers started by
//! the launcher. Every test checks that survivors are the same processes
//! (pids) and that the result does not depend on the rescales.

use ductile_coordinator::control::{ControlClient, ControlError};
use ductile_coordinator::proto::Member;
use ductile_coordinator::{Client, Secret};
use ductile_e2e::background::{Background, WAIT};
use ductile_e2e::{alive, eventually, reference_checksum};
use serde_json::Value;

fn pids(members: &[Member]) -> Vec<u32> {
    members.iter().map(|m| m.pid).collect()
}

fn num(report: &Value, key: &str) -> u64 {
    report[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {report}"))
}

/// Ends an `elastic_probe` job, which must exit 0; its stdout and its
/// `probe ok ...` line.
fn probe_verdict(job: Background) -> (String, String) {
    let end = job.finish();
    assert_eq!(end.code, Some(0), "{}\n{}", end.stdout, end.stderr);
    let ok = end
        .stdout
        .lines()
        .find(|l| l.starts_with("probe ok"))
        .unwrap_or_else(|| panic!("no verdict\n{}\n{}", end.stdout, end.stderr))
        .to_string();
    (end.stdout, ok)
}

fn start_jacobi(nodes: u32, pes: u32, args: &[String]) -> Background {
    Background::launch(nodes, "jacobi2d", args).pes(pes).start()
}

/// Ends the job and checks it completed with the reference checksum.
fn completes_with(job: Background, want: &str) {
    job.finish().completes_with(want);
}

#[test]
fn shrink_four_to_three_keeps_survivors_and_the_checksum() {
    let spec = ductile_e2e::jacobi_args(12_000);
    let want = reference_checksum(&spec);
    let job = start_jacobi(4, 1, &spec);
    let before = job.members();
    let report = job.ductile(&["shrink", "--remove", "2"]);
    assert_eq!((num(&report, "pes_before"), num(&report, "pes")), (4, 3));
    assert_eq!(num(&report, "epoch"), num(&report, "epoch_before") + 1);
    let after = job.members();
    assert_eq!(
        pids(&after),
        vec![before[0].pid, before[1].pid, before[3].pid]
    );
    assert!(
        eventually(WAIT, || !alive(before[2].pid)),
        "the removed node did not exit"
    );
    assert!(pids(&after).into_iter().all(alive), "a survivor is gone");
    completes_with(job, &want);
}

#[test]
fn expand_three_to_four_admits_a_newcomer_that_adopts_the_job() {
    let spec = ductile_e2e::jacobi_args(12_000);
    let want = reference_checksum(&spec);
    let job = start_jacobi(3, 1, &spec);
    let before = job.members();
    let report = job.ductile(&["expand", "--nodes", "1"]);
    assert_eq!((num(&report, "pes_before"), num(&report, "pes")), (3, 4));
    assert_eq!(report["admitted"], serde_json::json!([3]));
    // The balancing step after an expansion gives the newcomer blocks.
    assert!(num(&report, "migrations") > 0, "{report}");
    let after = job.members();
    assert_eq!(pids(&after[..3]), pids(&before));
    assert_eq!(
        report["spawned_pids"][0].as_u64(),
        Some(after[3].pid as u64)
    );
    completes_with(job, &want);
}

/// Newcomers of another shape, as a spot instance of a bigger type:
/// `--pes` gives the newcomers of a live rescale their own PE count. A
/// 1-PE node is replaced by a 2-PE one, then a 3-PE node joins; the PE
/// counts add up, the survivors stay, and the result is the one-node one.
/// A relaunch cannot keep mixed shapes, so `--pes` with `--mode restart`
/// is refused before anything starts.
#[test]
fn newcomers_of_another_pe_count_join_live_and_the_checksum_holds() {
    let spec = ductile_e2e::jacobi_args(12_000);
    let want = reference_checksum(&spec);
    let job = start_jacobi(2, 1, &spec);
    let before = job.members();
    let report = job.ductile(&["rescale", "--remove", "1", "--add", "1", "--pes", "2"]);
    assert_eq!((num(&report, "pes_before"), num(&report, "pes")), (2, 3));
    let report = job.ductile(&["expand", "--nodes", "1", "--pes", "3"]);
    assert_eq!((num(&report, "pes_before"), num(&report, "pes")), (3, 6));
    let after = job.members();
    assert_eq!(after[0].pid, before[0].pid, "node 0 stays");
    assert_eq!(after.iter().map(|m| m.pes).collect::<Vec<_>>(), [1, 2, 3]);

    let out = job
        .spawn_ductile(&["expand", "--nodes", "1", "--pes", "2", "--mode", "restart"])
        .wait_with_output()
        .expect("ductile");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--pes is for live rescales"), "{stderr}");
    assert_eq!(job.members().len(), 3, "nothing was started");
    completes_with(job, &want);
}

#[test]
fn one_rescale_removes_two_nodes_and_admits_two() {
    let spec = ductile_e2e::jacobi_args(12_000);
    let want = reference_checksum(&spec);
    let job = start_jacobi(4, 2, &spec);
    let before = job.members();
    let report = job.ductile(&["rescale", "--remove", "1,2", "--add", "2"]);
    assert_eq!((num(&report, "pes_before"), num(&report, "pes")), (8, 8));
    assert_eq!(report["removed"], serde_json::json!([1, 2]));
    assert_eq!(report["admitted"], serde_json::json!([2, 3]));
    let after = job.members();
    assert_eq!(pids(&after[..2]), vec![before[0].pid, before[3].pid]);
    for gone in [before[1].pid, before[2].pid] {
        assert!(
            eventually(WAIT, || !alive(gone)),
            "removed node {gone} did not exit"
        );
    }
    completes_with(job, &want);
}

#[test]
fn twenty_shrinks_and_expands_in_one_run() {
    let spec = ductile_e2e::jacobi_args(60_000);
    let want = reference_checksum(&spec);
    let job = start_jacobi(3, 1, &spec);
    let first = job.members();
    let mut epoch = 1;
    for cycle in 0..20 {
        let r = job.ductile(&["shrink", "--nodes", "1"]);
        assert_eq!(num(&r, "epoch_before"), epoch, "cycle {cycle}");
        let r = job.ductile(&["expand", "--nodes", "1"]);
        epoch += 2;
        assert_eq!(num(&r, "epoch"), epoch, "cycle {cycle}");
        let now = job.members();
        assert_eq!(now.len(), 3);
        // Nodes 0 and 1 never leave: same processes all along.
        assert_eq!(pids(&now[..2]), pids(&first[..2]), "cycle {cycle}");
    }
    completes_with(job, &want);
}

#[test]
fn a_newcomer_that_dies_before_admission_is_dropped_not_fatal() {
    let spec = ductile_e2e::jacobi_args(12_000);
    let want = reference_checksum(&spec);
    let mut job = start_jacobi(2, 1, &spec);
    job.start_strays(2);
    let victim = job.kill_stray(0);
    assert!(
        eventually(WAIT, || job
            .control()
            .status()
            .expect("status")
            .pending
            .len()
            == 1),
        "the dead newcomer stayed pending"
    );
    let mut c = job.control();
    let epoch = c.status().expect("status").epoch;
    let report = c
        .rescale(
            ductile_coordinator::control::RescaleRequest {
                epoch,
                remove: vec![],
                admit: 2,
            },
            WAIT,
        )
        .expect("admitting what waits");
    assert_eq!(report.admitted, vec![2], "only the living newcomer joins");
    assert!(!pids(&job.members()).contains(&victim));
    completes_with(job, &want);
}

/// Issue 17, item 9: an `expand` that gives up (`--timeout 0.001`) stops the
/// newcomer it started unless the job admitted it meanwhile, so the next
/// `expand` admits its own newcomer, not the first one's.
#[test]
fn an_expand_that_gives_up_leaves_no_newcomer_waiting() {
    let spec = ductile_e2e::jacobi_args(12_000);
    let want = reference_checksum(&spec);
    let job = start_jacobi(2, 1, &spec);
    let stderr = job.ductile_fails(&["expand", "--nodes", "1", "--timeout", "0.001"]);
    assert!(stderr.contains("within --timeout"), "{stderr}");
    // The first command's newcomer is either a member (the rescale went
    // through after the command gave up) or gone; never left waiting.
    let settled = || {
        let record = job.record();
        let newcomers = record["newcomers"].as_array().cloned().unwrap_or_default();
        newcomers
            .iter()
            .all(|n| n["admitted"] == true || n["exit"].is_string())
            .then_some(newcomers)
    };
    assert!(
        eventually(WAIT, || settled().is_some()),
        "a newcomer of the command that gave up is still waiting: {}",
        job.record()
    );
    let members = job.members().len();
    let report = job.ductile(&["expand", "--nodes", "1"]);
    assert_eq!(report["admitted"], serde_json::json!([members]), "{report}");
    let after = job.members();
    assert_eq!(after.len(), members + 1);
    assert_eq!(
        report["spawned_pids"][0].as_u64(),
        Some(after[members].pid as u64),
        "the second expand admitted another command's newcomer: {report}"
    );
    completes_with(job, &want);
}

#[test]
fn strangers_are_refused_and_change_nothing() {
    let spec = ductile_e2e::jacobi_args(8_000);
    let want = reference_checksum(&spec);
    let job = start_jacobi(3, 1, &spec);
    job.ductile(&["shrink", "--nodes", "1"]);
    // The control endpoint refuses a wrong secret.
    let wrong = Secret::generate();
    match ControlClient::connect(&job.read("control.addr"), &wrong, WAIT) {
        Err(ControlError::Refused(m)) => assert!(m.contains("unauthenticated"), "{m}"),
        other => panic!("a wrong secret was not refused: {:?}", other.err()),
    }
    // So does the coordinator.
    assert!(Client::connect(&job.read("coordinator.addr"), &wrong, WAIT).is_err());
    // A tool holding the secret is no member: its commit, at the epoch the
    // job left behind, is refused.
    let tool = Client::connect(&job.read("coordinator.addr"), &job.secret(), WAIT)
        .expect("the secret opens the coordinator");
    let refused = tool
        .commit(1, vec![1], 0, WAIT)
        .expect_err("a stale commit from a non-member");
    assert!(
        refused.to_string().contains("epoch") || refused.to_string().contains("member"),
        "{refused}"
    );
    let status = job.control().status().expect("status");
    assert_eq!(
        (status.epoch, status.members.len()),
        (2, 2),
        "nothing changed"
    );
    completes_with(job, &want);
}

#[test]
fn groups_nodegroups_and_readonly_follow_every_rescale() {
    let job = Background::launch(3, "elastic_probe", &["--rounds", "30000"])
        .pes(2)
        .start();
    let first = job.members();
    job.ductile(&["expand", "--nodes", "1"]);
    job.ductile(&["shrink", "--remove", "1"]);
    let report = job.ductile(&["rescale", "--remove", "1", "--add", "2"]);
    assert_eq!((num(&report, "pes_before"), num(&report, "pes")), (6, 8));
    assert_eq!(job.members()[0].pid, first[0].pid);
    // Every round that began and ended in one view saw exactly its members
    // (newcomers' group and nodegroup members included, reading the
    // readonly they adopted); at most one round per rescale straddled it.
    let (stdout, ok) = probe_verdict(job);
    let ok = ok.as_str();
    assert!(ok.contains("rescales=3"), "the rescale callback ran {ok}");
    let unchecked: u64 = ok
        .split_whitespace()
        .find_map(|t| t.strip_prefix("unchecked="))
        .and_then(|v| v.parse().ok())
        .expect("unchecked=N");
    assert!(unchecked <= 3, "{ok}");
    let rescaled: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("rescaled"))
        .collect();
    assert_eq!(
        rescaled,
        [
            "rescaled pes=8 nodes=4",
            "rescaled pes=6 nodes=3",
            "rescaled pes=8 nodes=4"
        ]
    );
}

/// The kill-and-restart baseline (`--mode restart`): the job is
/// checkpointed at a sync point, every process ends, and the job is
/// relaunched at its new size from the checkpoint; the result is the same.
/// The opposite of a live rescale: no process survives.
#[test]
fn restart_mode_replaces_every_process_and_keeps_the_checksum() {
    let mut spec = ductile_e2e::jacobi_args(12_000);
    spec.extend(["--lb-every", "10"].map(String::from));
    let want = reference_checksum(&spec);
    let job = start_jacobi(3, 1, &spec);
    let first = pids(&job.members());
    let report = job.ductile(&["shrink", "--nodes", "1", "--mode", "restart"]);
    assert_eq!((num(&report, "pes_before"), num(&report, "pes")), (3, 2));
    let stages: Vec<&str> = report["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| s["stage"].as_str().expect("stage name"))
        .collect();
    assert_eq!(
        stages,
        ["sync", "checkpoint", "relaunch", "restore", "balance"]
    );
    let second = pids(&job.members());
    assert_eq!(second.len(), 2);
    assert!(
        second.iter().all(|p| !first.contains(p)),
        "a process survived a restart: {first:?} -> {second:?}"
    );
    assert!(
        eventually(WAIT, || first.iter().all(|&p| !alive(p))),
        "a process of the first incarnation is still running"
    );
    let report = job.ductile(&["rescale", "--add", "2", "--mode", "restart"]);
    assert_eq!((num(&report, "pes_before"), num(&report, "pes")), (2, 4));
    // The report names the nodes added (the relaunched job's last two)
    // and says the job was relaunched.
    assert_eq!(report["admitted"], serde_json::json!([2, 3]), "{report}");
    assert_eq!(report["relaunched"], true, "{report}");
    assert_eq!(job.members().len(), 4);
    let end = job.finish();
    end.completes_with(&want);
    let stdout = end.stdout;
    // The timer is carried by the checkpoint: the seconds count from the
    // first start, not from the last relaunch (or zero).
    let seconds: f64 = stdout
        .split_whitespace()
        .find_map(|t| t.strip_prefix("seconds="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no seconds= in\n{stdout}"));
    assert!(seconds > 0.0, "{stdout}");
}

/// `--mode restart` keeps group, nodegroup and readonly state too: after a
/// restart that drops members and one that adds some, every round still
/// sees exactly the job's members, and the program's rescale callback runs.
#[test]
fn restart_mode_restores_groups_nodegroups_and_readonly() {
    let job = Background::launch(
        3,
        "elastic_probe",
        &["--rounds", "20000", "--sync-every", "20"],
    )
    .pes(2)
    .start();
    let report = job.ductile(&["shrink", "--nodes", "1", "--mode", "restart"]);
    assert_eq!((num(&report, "pes_before"), num(&report, "pes")), (6, 4));
    let report = job.ductile(&["expand", "--nodes", "2", "--mode", "restart"]);
    assert_eq!((num(&report, "pes_before"), num(&report, "pes")), (4, 8));
    let (stdout, ok) = probe_verdict(job);
    assert!(ok.contains("rescales=2") && ok.contains("pes=8"), "{ok}");
    let rescaled: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("rescaled"))
        .collect();
    assert_eq!(
        rescaled,
        ["rescaled pes=4 nodes=2", "rescaled pes=8 nodes=4"]
    );
}

/// A `--mode restart` rescale of a job that never reaches a sync point (no
/// `--lb-every`): the node withdraws the checkpoint before the CLI's
/// timeout and says why, the CLI cancels the relaunch it arranged, and the
/// job goes on with the same processes: a later live rescale works (no
/// checkpoint left queued) and the checksum is the reference's.
#[test]
fn a_restart_that_finds_no_sync_point_is_withdrawn_and_the_job_goes_on() {
    let spec = ductile_e2e::jacobi_args(40_000);
    let want = reference_checksum(&spec);
    let job = start_jacobi(3, 1, &spec);
    let first = pids(&job.members());
    let stderr = job.ductile_fails(&[
        "shrink",
        "--nodes",
        "1",
        "--mode",
        "restart",
        "--timeout",
        "4",
    ]);
    assert!(
        stderr.contains("no sync point within") && stderr.contains("withdrawn"),
        "{stderr}"
    );
    assert!(
        stderr.contains("the arranged relaunch was cancelled"),
        "{stderr}"
    );
    assert_eq!(pids(&job.members()), first, "the job was relaunched");
    assert!(
        !job.path("ckpt").exists(),
        "the withdrawn checkpoint's directory was left behind"
    );
    let report = job.ductile(&["shrink", "--nodes", "1"]);
    assert_eq!((num(&report, "pes_before"), num(&report, "pes")), (3, 2));
    completes_with(job, &want);
}
