//! Faults and races around rescales, with real processes: requests that
//! overlap, nodes stopped or killed at chosen steps. Each case must end
//! cleanly (the job goes on at a size it reports, or fails naming the step),
//! never hang, never remove the wrong node, never change the checksum.
//!
//! Timing is made deterministic by holding processes with SIGSTOP at the
//! point the race needs: newcomers of these jobs start through a wrapper
//! that stops itself before it becomes the program, so a test decides when
//! a newcomer registers.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use ductile_coordinator::control::ControlClient;
use ductile_coordinator::proto::Member;
use ductile_coordinator::Secret;
use ductile_e2e::{alive, bin, eventually, run};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// A shell wrapper that stops a newcomer (SIGSTOP to itself, same pid as
/// the program it then becomes) until the test continues it.
const HOLD_NEWCOMERS: &str = "#!/bin/sh\n\
if [ \"$DUCTILE_ROLE\" = newcomer ]; then kill -STOP $$; fi\n\
exec \"$@\"\n";

/// A job running in the background under `ductile run`.
struct Job {
    child: Option<Child>,
    state: tempfile::TempDir,
}

impl Job {
    /// Starts `jacobi2d spec` on `nodes` x 1 PE; newcomers stop themselves
    /// when `hold_newcomers`.
    fn start(nodes: u32, spec: &[String], hold_newcomers: bool) -> Job {
        Job::start_with(nodes, spec, hold_newcomers, &[])
    }

    /// As [`Job::start`], with environment variables for every process.
    fn start_with(nodes: u32, spec: &[String], hold_newcomers: bool, env: &[(&str, &str)]) -> Job {
        let state = tempfile::tempdir().expect("temp dir");
        let mut command: Vec<PathBuf> = Vec::new();
        if hold_newcomers {
            let wrapper = state.path().join("hold.sh");
            let mut f = std::fs::File::create(&wrapper).expect("wrapper");
            f.write_all(HOLD_NEWCOMERS.as_bytes()).expect("wrapper");
            drop(f);
            std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
            command.push(wrapper);
        }
        command.push(bin("jacobi2d"));
        let child = Command::new(bin("ductile"))
            .args(["run", "--nodes", &nodes.to_string(), "--pes-per-node", "1"])
            .arg("--state-dir")
            .arg(state.path())
            .args(["--timeout", "300", "--"])
            .args(&command)
            .args(spec)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning ductile run");
        let job = Job {
            child: Some(child),
            state,
        };
        assert!(
            eventually(WAIT, || job.path("control.addr").exists()),
            "the job never published its control endpoint"
        );
        job
    }

    fn path(&self, name: &str) -> PathBuf {
        self.state.path().join(name)
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name))
            .unwrap_or_else(|e| panic!("reading {name}: {e}"))
            .trim()
            .to_string()
    }

    fn control(&self) -> ControlClient {
        let secret = Secret::from_hex(&self.read("secret")).expect("secret");
        ControlClient::connect(&self.read("control.addr"), &secret, WAIT)
            .expect("connecting to the control endpoint")
    }

    fn members(&self) -> Vec<Member> {
        self.control().status().expect("status").members
    }

    /// A `ductile` subcommand against this job, started in the background.
    fn spawn_ductile(&self, args: &[&str]) -> Child {
        Command::new(bin("ductile"))
            .args(args)
            .arg("--state-dir")
            .arg(self.state.path())
            .args(["--json", "--timeout", "120"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running ductile")
    }

    /// A `ductile` subcommand that must succeed; its JSON report.
    fn ductile(&self, args: &[&str]) -> Value {
        report(self.spawn_ductile(args).wait_with_output().expect("ductile"))
    }

    /// Waits for the job to end; `ductile run`'s code, stdout, stderr.
    fn finish(mut self) -> (Option<i32>, String, String) {
        let out = self
            .child
            .take()
            .expect("running")
            .wait_with_output()
            .expect("waiting for ductile run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn report(out: Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ductile failed ({:?})\n{stdout}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

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
fn held_newcomer(job: &Job, seen: &[u32]) -> u32 {
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

fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill {sig} {pid}");
}

fn checksum(stdout: &str) -> String {
    ductile_e2e::last_value(stdout, "checksum")
        .unwrap_or_else(|| panic!("no checksum in\n{stdout}"))
}

fn reference(spec: &[String]) -> String {
    let args: Vec<&str> = spec.iter().map(String::as_str).collect();
    let job = run(1, 1, "jacobi2d", &args);
    job.expect_code(0, "jacobi2d reference");
    checksum(&job.stdout)
}

fn completes_with(job: Job, want: &str) {
    let (code, stdout, stderr) = job.finish();
    assert_eq!(code, Some(0), "the job failed\n{stdout}\n{stderr}");
    assert_eq!(checksum(&stdout), want, "checksum changed\n{stderr}");
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
    let want = reference(&spec);
    let job = Job::start(4, &spec, true);
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
    let c = report(c.wait_with_output().expect("tool C"));
    assert_eq!(c["epoch_before"].as_u64(), Some(3), "{c}");
    assert_eq!(c["admitted"], serde_json::json!([2]), "{c}");
    let now = job.members();
    assert_eq!(now.len(), 3);
    assert_eq!(now[2].pid, held, "the held newcomer was admitted");
    assert_eq!(uids(&now[..2]), vec![first[0].uid, first[2].uid]);
    completes_with(job, &want);
}

/// Issue 15, item 2: with a node stopped (SIGSTOP), a shrink cannot
/// evacuate (the load-balancing step waits for that node's statistics).
/// Past the stage's bound node 0 abandons it, names the node, and the job
/// goes on at its size; once the node runs again, a rescale works and the
/// checksum is the reference's.
#[test]
fn a_stopped_node_gets_the_evacuate_stage_abandoned_not_stalled() {
    let spec = ductile_e2e::jacobi_args(30_000);
    let want = reference(&spec);
    let job = Job::start_with(
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
    completes_with(job, &want);
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
    let want = reference(&spec);
    let job = Job::start(2, &spec, false);
    assert_eq!(job.members().len(), 2);
    let record: Value = serde_json::from_str(&job.read("job.json")).expect("job.json");
    let pid = record["coordinator"]["pid"].as_u64().expect("coordinator pid") as u32;
    let addr = record["coordinator"]["addr"]
        .as_str()
        .expect("coordinator addr")
        .to_owned();
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
    completes_with(job, &want);
}
