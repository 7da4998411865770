//! A job survives its coordinator restarting, with real processes: Jacobi2D
//! runs under `ductile run`, the test kills the coordinator with SIGKILL
//! mid-run, the launcher starts a new one on the same address in recovery
//! mode, node 0 restores it and the other nodes reattach. The job must end
//! as if nothing happened (exit 0, the checksum of a 1-node run) and
//! `job.json` must record the restart.

use ductile_e2e::background::{Background, Finished, WAIT};
use ductile_e2e::{alive, eventually, reference_checksum, signal};
use serde_json::Value;

/// Kills the coordinator with SIGKILL while the job runs; returns its pid.
fn kill_coordinator(job: &mut Background) -> u32 {
    let pid = coordinator_pid(&job.record());
    assert!(alive(pid), "the coordinator (pid {pid}) is not running");
    assert!(
        job.running(),
        "the job ended before the test could kill its coordinator"
    );
    signal(pid, "-KILL");
    pid
}

/// Waits until the launcher recorded a coordinator other than `old`
/// listening again; returns the new pid.
fn wait_for_restart(job: &Background, old: u32) -> u32 {
    let mut pid = 0;
    let back = eventually(WAIT, || {
        let record = job.record();
        pid = coordinator_pid(&record);
        pid != old
            && restarts(&record)
                .iter()
                .any(|r| r["pid"].as_u64() == Some(pid as u64))
    });
    assert!(back, "the coordinator was not restarted\n{}", job.stderr());
    pid
}

fn coordinator_pid(record: &Value) -> u32 {
    record["coordinator"]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no coordinator pid in {record}")) as u32
}

fn restarts(record: &Value) -> Vec<Value> {
    record["coordinator_restarts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Long enough for a test to kill the coordinator, see it restarted and
/// rescale before the job ends (about 14 s at 3 nodes on 2 cores).
const LONG: u32 = 40_000;

fn member_pids(status: &Value) -> Vec<u64> {
    status["members"]
        .as_array()
        .unwrap_or_else(|| panic!("no members in {status}"))
        .iter()
        .map(|m| m["pid"].as_u64().expect("pid"))
        .collect()
}

/// Checks the record of a job that completed after one restart of its
/// coordinator (pid `old`, killed by SIGKILL).
fn assert_one_restart(record: &Value, old: u32, new: u32) {
    assert_eq!(record["outcome"]["result"], "completed", "{record}");
    let restarts = restarts(record);
    assert_eq!(restarts.len(), 1, "{record}");
    let r = &restarts[0];
    assert_eq!(r["previous_pid"].as_u64(), Some(old as u64), "{r}");
    assert_eq!(
        r["previous_exit"], "was killed by signal 9 (SIGKILL)",
        "{r}"
    );
    assert_eq!(r["pid"].as_u64(), Some(new as u64), "{r}");
    assert!(r["error"].is_null(), "{r}");
    assert_eq!(coordinator_pid(record), new);
}

#[test]
fn a_job_goes_on_after_its_coordinator_is_killed() {
    let spec = ductile_e2e::jacobi_args(20_000);
    let want = reference_checksum(&spec);
    let mut job = Background::launch(3, "jacobi2d", &spec).start();
    let old = kill_coordinator(&mut job);
    let new = wait_for_restart(&job, old);
    let end = job.finish();
    end.completes_with(&want);
    let Finished { stderr, record, .. } = end;
    assert_one_restart(&record, old, new);
    assert!(
        stderr.contains(&format!("the coordinator (pid {old}) was killed by signal 9 (SIGKILL) while the job was running; restarting it on")),
        "{stderr}"
    );
    assert!(
        !alive(new),
        "the restarted coordinator (pid {new}) outlived the job"
    );
}

#[test]
fn status_and_a_shrink_work_after_a_coordinator_restart() {
    let spec = ductile_e2e::jacobi_args(LONG);
    let want = reference_checksum(&spec);
    let mut job = Background::launch(3, "jacobi2d", &spec).start();
    let before = job.ductile(&["status"]);
    assert_eq!(member_pids(&before).len(), 3, "{before}");
    let old = kill_coordinator(&mut job);
    let new = wait_for_restart(&job, old);
    // Every node rejoins the new coordinator: node 0 restores it, nodes 1
    // and 2 reattach (each says so on stderr).
    assert!(
        eventually(WAIT, || job
            .stderr()
            .matches("rejoined the coordinator at")
            .count()
            >= 3),
        "not every node rejoined the restarted coordinator\n{}",
        job.stderr()
    );
    let after = job.ductile(&["status"]);
    assert_eq!(member_pids(&after), member_pids(&before), "{after}");
    assert_eq!(after["epoch"], before["epoch"], "{after}");
    let report = job.ductile(&["shrink", "--nodes", "1"]);
    assert_eq!(report["removed"], serde_json::json!([2]), "{report}");
    let shrunk = job.ductile(&["status"]);
    assert_eq!(member_pids(&shrunk), member_pids(&before)[..2], "{shrunk}");
    let end = job.finish();
    end.completes_with(&want);
    assert_one_restart(&end.record, old, new);
}

#[test]
fn a_coordinator_lost_once_too_often_fails_the_job_and_stops_it() {
    let spec = ductile_e2e::jacobi_args(LONG);
    let mut job = Background::launch(3, "jacobi2d", &spec)
        .flags(&["--coordinator-restarts", "1"])
        .start();
    let first = kill_coordinator(&mut job);
    let second = wait_for_restart(&job, first);
    assert!(
        eventually(WAIT, || job
            .stderr()
            .matches("rejoined the coordinator at")
            .count()
            >= 3),
        "not every node rejoined the restarted coordinator\n{}",
        job.stderr()
    );
    let killed = kill_coordinator(&mut job);
    assert_eq!(killed, second);
    let Finished {
        code,
        stdout,
        stderr,
        record,
    } = job.finish();
    assert_eq!(code, Some(1), "the job did not fail\n{stdout}\n{stderr}");
    assert!(
        stderr.contains("ductile: the coordinator was killed by signal 9 (SIGKILL) at"),
        "{stderr}"
    );
    assert!(
        stderr.contains("while the job was running and was not restarted: it had been restarted 1 time already, the most allowed; stopping the job"),
        "{stderr}"
    );
    assert_eq!(record["outcome"]["result"], "failed", "{record}");
    assert_eq!(restarts(&record).len(), 1, "{record}");
    let nodes: Vec<u32> = record["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["pid"].as_u64().expect("pid") as u32)
        .collect();
    for pid in nodes.into_iter().chain([first, second]) {
        assert!(!alive(pid), "pid {pid} of the job is still running");
    }
}

fn pending_pids(status: &Value) -> Vec<u64> {
    status["pending"]
        .as_array()
        .unwrap_or_else(|| panic!("no pending in {status}"))
        .iter()
        .map(|p| p["pid"].as_u64().expect("pid"))
        .collect()
}

/// A newcomer waiting for admission when the coordinator is lost registers
/// again with the restarted one, and a later rescale admits it.
#[test]
fn a_waiting_newcomer_registers_again_and_is_admitted_after_a_restart() {
    let spec = ductile_e2e::jacobi_args(LONG);
    let want = reference_checksum(&spec);
    let mut job = Background::launch(3, "jacobi2d", &spec).start();
    let newcomer = job.spawn_newcomer() as u64;
    assert!(
        eventually(WAIT, || pending_pids(&job.ductile(&["status"]))
            == [newcomer]),
        "the newcomer never registered\n{}",
        job.stderr()
    );
    let old = kill_coordinator(&mut job);
    let new = wait_for_restart(&job, old);
    assert!(
        eventually(WAIT, || {
            let err = job.stderr();
            err.matches("rejoined the coordinator at").count() >= 3
                && err.contains("registered again with the coordinator at")
        }),
        "the nodes and the newcomer did not all come back\n{}",
        job.stderr()
    );
    let status = job.ductile(&["status"]);
    assert_eq!(pending_pids(&status), [newcomer], "{status}");
    let secret = std::fs::read_to_string(job.path("secret")).expect("secret");
    let secret = ductile_coordinator::Secret::from_hex(secret.trim()).expect("hex secret");
    let control = std::fs::read_to_string(job.path("control.addr")).expect("control.addr");
    let mut control =
        ductile_coordinator::control::ControlClient::connect(control.trim(), &secret, WAIT)
            .expect("control endpoint");
    let request = ductile_coordinator::control::RescaleRequest {
        epoch: control.status().expect("status").epoch,
        remove: vec![],
        admit: 1,
    };
    let report = control
        .rescale(request, WAIT)
        .expect("admitting the newcomer");
    assert_eq!(report.admitted, vec![3], "{report:?}");
    let members = member_pids(&job.ductile(&["status"]));
    assert_eq!(members.len(), 4);
    assert_eq!(members[3], newcomer);
    let end = job.finish();
    end.completes_with(&want);
    assert_one_restart(&end.record, old, new);
    let record = end.record;
    assert_eq!(record["newcomers"][0]["admitted"], true, "{record}");
}
