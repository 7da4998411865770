//! `ductile run` seen from outside: real processes, real coordinator.
//!
//! Every run is watched by a bounded wait (the test fails rather than hangs),
//! and every test checks that the processes recorded in `job.json` are gone.
//! Assertions are about behaviour (exit codes, messages, records), never times.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use ductile_operator::local::process::{group_alive, pid_alive};
use ductile_operator::state::{read_job_state, JobResult, JobState};

const DUCTILE: &str = env!("CARGO_BIN_EXE_ductile");
const STUB: &str = env!("CARGO_BIN_EXE_ductile-stub-node");
/// No run in these tests needs anywhere near this; it only stops a hang.
const WATCHDOG: Duration = Duration::from_secs(90);

struct Run {
    _tmp: tempfile::TempDir,
    state_dir: PathBuf,
}

impl Run {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let state_dir = tmp.path().join("state");
        Self {
            _tmp: tmp,
            state_dir,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(DUCTILE);
        cmd.arg("run")
            .arg("--state-dir")
            .arg(&self.state_dir)
            .args(args);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn run(&self, args: &[&str]) -> Result {
        let child = self.command(args).spawn().expect("spawn ductile");
        finish(child)
    }

    fn job(&self) -> JobState {
        read_job_state(&self.state_dir).expect("job.json")
    }

    /// Every process the job had is gone, and so are the run-time files.
    fn assert_nothing_left(&self) {
        let job = self.job();
        let mut pids: Vec<u32> = job.nodes.iter().map(|n| n.pid).collect();
        pids.extend(job.coordinator.iter().map(|c| c.pid));
        for pid in pids {
            assert!(!pid_alive(pid), "pid {pid} of the job is still alive");
            assert!(
                !group_alive(pid),
                "process group {pid} of the job still has processes"
            );
        }
        assert!(
            !self.state_dir.join("launcher.pid").exists(),
            "launcher.pid left behind"
        );
        assert!(
            !self.state_dir.join("coordinator.addr").exists(),
            "coordinator.addr left behind"
        );
    }
}

struct Result {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Waits for `child` with the watchdog; kills it and fails the test on a hang.
fn finish(mut child: Child) -> Result {
    let deadline = Instant::now() + WATCHDOG;
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "ductile run hung; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().expect("output");
    Result {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + WATCHDOG;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_job_that_completes_passes_node_zeros_code_through() {
    let run = Run::new();
    let out = run.run(&[
        "--nodes",
        "3",
        "--pes-per-node",
        "2",
        "--",
        STUB,
        "--code",
        "7",
    ]);
    assert_eq!(out.code, Some(7), "stderr:\n{}", out.stderr);
    assert!(
        out.stdout.contains("stub: job started with 3 nodes, 6 PEs"),
        "stdout:\n{}",
        out.stdout
    );
    assert!(
        !out.stderr.contains("ductile:"),
        "a clean run says nothing:\n{}",
        out.stderr
    );
    let job = run.job();
    let outcome = job.outcome.clone().expect("outcome");
    assert_eq!(outcome.result, JobResult::Completed);
    assert_eq!(outcome.exit_code, 7);
    assert_eq!(job.nodes.len(), 3);
    assert_eq!((job.shape.nodes, job.shape.pes_per_node), (3, 2));
    assert_eq!(job.program[0], STUB);
    assert!(job.coordinator.is_some());
    run.assert_nothing_left();
}

#[test]
fn an_unknown_program_is_a_launch_error_naming_it() {
    let run = Run::new();
    let out = run.run(&["--nodes", "2", "--", "ductile-no-such-program-here", "x"]);
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr
            .contains("ductile: cannot run \"ductile-no-such-program-here\""),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("not found"), "{}", out.stderr);
    // Nothing was started, so nothing is recorded or locked.
    assert!(!run.state_dir.join("job.json").exists());
    assert!(!run.state_dir.join("launcher.pid").exists());
}

#[test]
fn a_program_that_is_not_executable_is_a_launch_error() {
    let run = Run::new();
    let script = run.state_dir.with_file_name("not-executable.sh");
    fs::write(&script, "#!/bin/sh\nexit 0\n").expect("write");
    let out = run.run(&["--nodes", "1", "--", script.to_str().expect("utf8")]);
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("not executable"), "{}", out.stderr);
}

#[test]
fn a_node_killed_by_a_signal_fails_the_job_and_everything_is_stopped() {
    let run = Run::new();
    // Node 1 kills itself; the others would run for a long time.
    let script = "if [ \"$DUCTILE_LAUNCH_INDEX\" = 1 ]; then kill -9 $$; fi; exec sleep 60";
    let out = run.run(&["--nodes", "3", "--", "sh", "-c", script]);
    assert_eq!(out.code, Some(1), "stderr:\n{}", out.stderr);
    let job = run.job();
    let pid = job.nodes[1].pid;
    let expected = format!("ductile: node 1 (pid {pid}) was killed by signal 9 (SIGKILL) at ");
    assert!(out.stderr.contains(&expected), "{}", out.stderr);
    assert!(out.stderr.contains("stopping the job"), "{}", out.stderr);
    assert_eq!(job.outcome.expect("outcome").result, JobResult::Failed);
    run.assert_nothing_left();
}

#[test]
fn a_node_exiting_before_registering_fails_the_launch() {
    let run = Run::new();
    let out = run.run(&["--nodes", "2", "--", "sh", "-c", "exit 0"]);
    assert_eq!(out.code, Some(1), "stderr:\n{}", out.stderr);
    assert!(out.stderr.contains("exited with code 0"), "{}", out.stderr);
    assert!(
        out.stderr.contains("before the job started"),
        "{}",
        out.stderr
    );
    run.assert_nothing_left();
}

#[test]
fn nodes_that_never_register_hit_the_launch_timeout() {
    let run = Run::new();
    let out = run.run(&["--nodes", "2", "--launch-timeout", "2", "--", "sleep", "60"]);
    assert_eq!(out.code, Some(1), "stderr:\n{}", out.stderr);
    assert!(
        out.stderr.contains("before the job started"),
        "{}",
        out.stderr
    );
    // The coordinator's own explanation is shown.
    assert!(out.stderr.contains("launch timed out"), "{}", out.stderr);
    run.assert_nothing_left();
}

#[test]
fn the_wall_clock_limit_stops_the_job_and_what_the_nodes_started() {
    let run = Run::new();
    let marks = run.state_dir.with_file_name("marks");
    fs::create_dir_all(&marks).expect("mkdir");
    // Each node leaves a grandchild in its process group: it must go too.
    let script = format!(
        "sleep 60 & echo $! > {}/$DUCTILE_LAUNCH_INDEX; wait",
        marks.display()
    );
    let out = run.run(&["--nodes", "2", "--timeout", "1", "--", "sh", "-c", &script]);
    assert_eq!(out.code, Some(1), "stderr:\n{}", out.stderr);
    assert!(
        out.stderr
            .contains("ductile: the job ran past its --timeout of 1.0s; stopping the job"),
        "{}",
        out.stderr
    );
    assert_eq!(
        run.job().outcome.expect("outcome").result,
        JobResult::TimedOut
    );
    run.assert_nothing_left();
    for index in 0..2 {
        let text = fs::read_to_string(marks.join(index.to_string())).expect("grandchild pid");
        let pid: u32 = text.trim().parse().expect("pid");
        assert!(
            !pid_alive(pid),
            "grandchild {pid} of node {index} is still alive"
        );
    }
}

#[test]
fn a_node_failing_while_the_others_keep_running_fails_the_job() {
    let run = Run::new();
    let out = run.run(&[
        "--nodes",
        "3",
        "--exit-grace",
        "1",
        "--",
        STUB,
        "--work",
        "60",
        "--fail-node",
        "1",
        "--fail-code",
        "5",
    ]);
    assert_eq!(out.code, Some(1), "stderr:\n{}", out.stderr);
    let pid = run.job().nodes[1].pid;
    let expected = format!("ductile: node 1 (pid {pid}) exited with code 5 at ");
    assert!(out.stderr.contains(&expected), "{}", out.stderr);
    assert!(
        out.stderr.contains("but nodes 0, 2 kept running"),
        "{}",
        out.stderr
    );
    run.assert_nothing_left();
}

#[test]
fn a_busy_state_dir_is_refused_and_sigint_stops_the_running_job() {
    let run = Run::new();
    let first = run
        .command(&["--nodes", "2", "--", STUB, "--work", "60"])
        .spawn()
        .expect("spawn");
    wait_for(&run.state_dir.join("job.json"));

    let second = run.run(&["--nodes", "1", "--", "true"]);
    assert_eq!(second.code, Some(2));
    assert!(
        second.stderr.contains("is in use by a running launcher"),
        "{}",
        second.stderr
    );
    assert!(
        second.stderr.contains(&format!("pid {}", first.id())),
        "{}",
        second.stderr
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("signal");
    let out = finish(first);
    assert_eq!(out.code, Some(130), "stderr:\n{}", out.stderr);
    assert!(
        out.stderr
            .contains("ductile: received SIGINT; stopping the job"),
        "{}",
        out.stderr
    );
    assert_eq!(
        run.job().outcome.expect("outcome").result,
        JobResult::Interrupted
    );
    run.assert_nothing_left();
}

#[test]
fn usage_errors_exit_2() {
    let out = finish(
        Command::new(DUCTILE)
            .args(["run", "--nodes", "0", "--", "true"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    assert_eq!(out.code, Some(2));
    let out = finish(
        Command::new(DUCTILE)
            .args(["run", "--nodes", "1", "--job", "../etc", "--", "true"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("invalid job name"), "{}", out.stderr);
}

#[test]
fn the_coordinator_subcommand_is_the_coordinators_cli() {
    let out = finish(
        Command::new(DUCTILE)
            .args(["coordinator", "--help"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    assert_eq!(out.code, Some(0));
    assert!(out.stdout.contains("--expect"), "{}", out.stdout);
    assert!(out.stdout.contains("--launch-timeout"), "{}", out.stdout);
}
