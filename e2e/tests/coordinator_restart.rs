//! A job survives its coordinator restarting, with real processes: Jacobi2D
//! runs under `ductile run`, the test kills the coordinator with SIGKILL
//! mid-run, the launcher starts a new one on the same address in recovery
//! mode, node 0 restores it and the other nodes reattach. The job must end
//! as if nothing happened (exit 0, the checksum of a 1-node run) and
//! `job.json` must record the restart.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ductile_e2e::{alive, bin, collect, eventually, run};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// A job running in the background under `ductile run`, its output
/// collected as it comes (so a test can wait for a line).
struct Running {
    child: Option<Child>,
    state: tempfile::TempDir,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Running {
    fn start(nodes: u32, args: &[String]) -> Running {
        Self::start_with(nodes, &[], args)
    }

    /// As [`Running::start`], with extra `ductile run` flags.
    fn start_with(nodes: u32, flags: &[&str], args: &[String]) -> Running {
        let state = tempfile::tempdir().expect("temp dir");
        let mut child = Command::new(bin("ductile"))
            .arg("run")
            .args(["--nodes", &nodes.to_string()])
            .arg("--state-dir")
            .arg(state.path())
            .args(["--timeout", "300"])
            .args(flags)
            .arg("--")
            .arg(bin("jacobi2d"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning ductile run");
        let stdout = collect(child.stdout.take().expect("stdout"));
        let stderr = collect(child.stderr.take().expect("stderr"));
        let job = Running {
            child: Some(child),
            state,
            stdout,
            stderr,
        };
        assert!(
            eventually(WAIT, || job.path("control.addr").exists()),
            "the job never published its control endpoint\n{}",
            job.stderr()
        );
        job
    }

    fn path(&self, name: &str) -> PathBuf {
        self.state.path().join(name)
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("output lock").clone()
    }

    fn record(&self) -> Value {
        record(self.state.path())
    }

    fn running(&mut self) -> bool {
        let child = self.child.as_mut().expect("running");
        child.try_wait().expect("try_wait").is_none()
    }

    /// Kills the coordinator with SIGKILL while the job runs; returns its pid.
    fn kill_coordinator(&mut self) -> u32 {
        let pid = coordinator_pid(&self.record());
        assert!(alive(pid), "the coordinator (pid {pid}) is not running");
        assert!(
            self.running(),
            "the job ended before the test could kill its coordinator"
        );
        let killed = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .expect("running kill");
        assert!(killed.success(), "kill -KILL {pid} failed");
        pid
    }

    /// Waits until the launcher recorded a coordinator other than `old`
    /// listening again; returns the new pid.
    fn wait_for_restart(&self, old: u32) -> u32 {
        let mut pid = 0;
        let back = eventually(WAIT, || {
            let record = self.record();
            pid = coordinator_pid(&record);
            pid != old
                && restarts(&record)
                    .iter()
                    .any(|r| r["pid"].as_u64() == Some(pid as u64))
        });
        assert!(back, "the coordinator was not restarted\n{}", self.stderr());
        pid
    }

    /// Runs `ductile ARGS --state-dir D --json`; returns its JSON output.
    fn ductile(&self, args: &[&str]) -> Value {
        let out = Command::new(bin("ductile"))
            .args(args)
            .arg("--state-dir")
            .arg(self.state.path())
            .arg("--json")
            .output()
            .expect("running ductile");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "ductile {args:?} failed ({:?})\n{stdout}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
    }

    /// Waits for the job to end; returns `ductile run`'s code, stdout,
    /// stderr, and the final `job.json`.
    fn finish(mut self) -> (Option<i32>, String, String, Value) {
        let mut child = self.child.take().expect("running");
        let status = child.wait().expect("waiting for ductile run");
        // The collectors end with the pipes; give them a moment to take the rest.
        let (stdout, stderr) = (Arc::clone(&self.stdout), Arc::clone(&self.stderr));
        eventually(Duration::from_secs(5), || {
            Arc::strong_count(&stdout) == 1 && Arc::strong_count(&stderr) == 1
        });
        let stdout = stdout.lock().expect("output lock").clone();
        let stderr = stderr.lock().expect("output lock").clone();
        (status.code(), stdout, stderr, self.record())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn record(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("job.json")).expect("job.json");
    serde_json::from_str(&text).expect("job.json is JSON")
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

fn checksum(stdout: &str) -> String {
    ductile_e2e::last_value(stdout, "checksum")
        .unwrap_or_else(|| panic!("no checksum in\n{stdout}"))
}

/// The checksum of a 1-node run of the same spec (computed once per spec:
/// the tests of this file run in one process).
fn reference(args: &[String]) -> String {
    static KNOWN: Mutex<Vec<(Vec<String>, String)>> = Mutex::new(Vec::new());
    let mut known = KNOWN.lock().expect("reference lock");
    if let Some((_, sum)) = known.iter().find(|(spec, _)| spec == args) {
        return sum.clone();
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let job = run(1, 1, "jacobi2d", &argv);
    job.expect_code(0, "jacobi2d reference");
    let sum = checksum(&job.stdout);
    known.push((args.to_vec(), sum.clone()));
    sum
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
    let want = reference(&spec);
    let mut job = Running::start(3, &spec);
    let old = job.kill_coordinator();
    let new = job.wait_for_restart(old);
    let (code, stdout, stderr, record) = job.finish();
    assert_eq!(code, Some(0), "the job failed\n{stdout}\n{stderr}");
    assert_eq!(checksum(&stdout), want, "checksum changed\n{stderr}");
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
    let want = reference(&spec);
    let mut job = Running::start(3, &spec);
    let before = job.ductile(&["status"]);
    assert_eq!(member_pids(&before).len(), 3, "{before}");
    let old = job.kill_coordinator();
    let new = job.wait_for_restart(old);
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
    let (code, stdout, stderr, record) = job.finish();
    assert_eq!(code, Some(0), "the job failed\n{stdout}\n{stderr}");
    assert_eq!(checksum(&stdout), want, "checksum changed\n{stderr}");
    assert_one_restart(&record, old, new);
}

#[test]
fn a_coordinator_lost_once_too_often_fails_the_job_and_stops_it() {
    let spec = ductile_e2e::jacobi_args(LONG);
    let mut job = Running::start_with(3, &["--coordinator-restarts", "1"], &spec);
    let first = job.kill_coordinator();
    let second = job.wait_for_restart(first);
    assert!(
        eventually(WAIT, || job
            .stderr()
            .matches("rejoined the coordinator at")
            .count()
            >= 3),
        "not every node rejoined the restarted coordinator\n{}",
        job.stderr()
    );
    let killed = job.kill_coordinator();
    assert_eq!(killed, second);
    let (code, stdout, stderr, record) = job.finish();
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

/// Asks the launcher, through its request channel, to start one newcomer;
/// returns its pid.
fn spawn_newcomer(job: &Running) -> u32 {
    use std::io::{BufRead, BufReader, Write};
    let mut socket = std::os::unix::net::UnixStream::connect(job.path("launcher.sock"))
        .expect("connecting to the launcher");
    socket
        .write_all(b"spawn 1\n")
        .expect("asking for a newcomer");
    let mut reply = String::new();
    BufReader::new(socket)
        .read_line(&mut reply)
        .expect("the launcher's reply");
    reply
        .trim()
        .strip_prefix("ok ")
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("the launcher refused: {reply}"))
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
    let want = reference(&spec);
    let mut job = Running::start(3, &spec);
    let newcomer = spawn_newcomer(&job) as u64;
    assert!(
        eventually(WAIT, || pending_pids(&job.ductile(&["status"]))
            == [newcomer]),
        "the newcomer never registered\n{}",
        job.stderr()
    );
    let old = job.kill_coordinator();
    let new = job.wait_for_restart(old);
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
    let (code, stdout, stderr, record) = job.finish();
    assert_eq!(code, Some(0), "the job failed\n{stdout}\n{stderr}");
    assert_eq!(checksum(&stdout), want, "checksum changed\n{stderr}");
    assert_one_restart(&record, old, new);
    assert_eq!(record["newcomers"][0]["admitted"], true, "{record}");
}
