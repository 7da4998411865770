//! `ductile expand`, `ductile shrink` and `ductile rescale` against a job run
//! by `ductile run`: real launcher, real coordinator, real processes.
//!
//! The nodes are a fake that follows the environment contract and the
//! coordinator's protocol but has no runtime (which cannot take newcomers
//! yet): it is this test binary run again, as the ignored test `fake_node`,
//! with `DUCTILE_TEST_FAKE_NODE` naming a directory of switches (files the
//! test creates: `stop`, `newcomers-fail`, `refuse-rescale`). Its node 0
//! serves the control endpoint and does a rescale as a bare coordinator
//! commit, so these tests check the fleet's side (newcomers started,
//! supervised, admitted, dropped, removed, recorded) and the commands'
//! output, not the runtime's rescale. The end-to-end tests in `e2e/` do that.
//!
//! Every run is bounded by a watchdog, and stopped if a test fails.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use ductile_operator::local::process::pid_alive;
use ductile_operator::state::{read_job_state, JobResult, JobState};

const DUCTILE: &str = env!("CARGO_BIN_EXE_ductile");
/// Names the fake's switch directory; set, it makes `fake_node` a node.
const FAKE_ENV: &str = "DUCTILE_TEST_FAKE_NODE";
/// No step here needs anywhere near this; it only stops a hang.
const WATCHDOG: Duration = Duration::from_secs(60);

/// A `ductile run` of fake nodes; stopped (SIGTERM, then waited for) if the
/// test ends without finishing it.
struct Job {
    tmp: tempfile::TempDir,
    state_dir: PathBuf,
    launcher: Option<Child>,
}

/// What a finished command left.
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Job {
    fn start(nodes: u32, pes: u32) -> Job {
        let tmp = tempfile::tempdir().expect("tempdir");
        let state_dir = tmp.path().join("state");
        let switches = tmp.path().join("switches");
        fs::create_dir_all(&switches).expect("switch dir");
        let log = |name: &str| fs::File::create(tmp.path().join(name)).expect("log file");
        let launcher = Command::new(DUCTILE)
            .args([
                "run",
                "--nodes",
                &nodes.to_string(),
                "--pes-per-node",
                &pes.to_string(),
            ])
            .args(["--exit-grace", "5", "--timeout", "120", "--state-dir"])
            .arg(&state_dir)
            .arg("--")
            .arg(std::env::current_exe().expect("test binary"))
            .args([
                "fake_node",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(FAKE_ENV, &switches)
            .stdin(Stdio::null())
            .stdout(log("run.out"))
            .stderr(log("run.err"))
            .spawn()
            .expect("spawn ductile run");
        let job = Job {
            tmp,
            state_dir,
            launcher: Some(launcher),
        };
        job.wait_until("node 0's control endpoint is up", || {
            job.state_dir.join("control.addr").exists()
        });
        job
    }

    fn switch(&self, name: &str, on: bool) {
        let path = self.tmp.path().join("switches").join(name);
        if on {
            fs::write(path, "").expect("switch on");
        } else {
            fs::remove_file(path).expect("switch off");
        }
    }

    /// Runs `ductile ARGS --state-dir STATE`.
    fn ductile(&self, args: &[&str]) -> Out {
        let mut cmd = Command::new(DUCTILE);
        cmd.args(args).arg("--state-dir").arg(&self.state_dir);
        if args[0] != "status" {
            cmd.args(["--timeout", "30"]);
        }
        let out = cmd.stdin(Stdio::null()).output().expect("run ductile");
        Out {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs a command that must succeed with `--json`; returns its JSON.
    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut args = args.to_vec();
        args.push("--json");
        let out = self.ductile(&args);
        assert_eq!(
            out.code,
            Some(0),
            "{args:?}: {}\n{}",
            out.stderr,
            self.launcher_log()
        );
        serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", out.stdout))
    }

    fn record(&self) -> JobState {
        read_job_state(&self.state_dir).expect("job.json")
    }

    fn launcher_log(&self) -> String {
        let err = fs::read_to_string(self.tmp.path().join("run.err")).unwrap_or_default();
        format!("ductile run's stderr:\n{err}")
    }

    fn wait_until(&self, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + WATCHDOG;
        while !done() {
            assert!(
                Instant::now() < deadline,
                "{what}: never happened\n{}",
                self.launcher_log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Lets the members end the job through the shutdown barrier; returns
    /// `ductile run`'s exit code and stderr.
    fn finish(mut self) -> (Option<i32>, String, JobState) {
        self.switch("stop", true);
        let mut launcher = self.launcher.take().expect("running");
        let deadline = Instant::now() + WATCHDOG;
        let status = loop {
            if let Some(status) = launcher.try_wait().expect("wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = launcher.kill();
                panic!("ductile run did not end\n{}", self.launcher_log());
            }
            thread::sleep(Duration::from_millis(20));
        };
        (status.code(), self.launcher_log(), self.record())
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(mut launcher) = self.launcher.take() {
            let _ = Command::new("kill").arg(launcher.id().to_string()).status();
            let _ = launcher.wait();
        }
    }
}

fn pids(value: &serde_json::Value) -> Vec<u32> {
    value
        .as_array()
        .expect("array")
        .iter()
        .map(|v| v.as_u64().expect("number") as u32)
        .collect()
}

fn assert_all_gone(state: &JobState) {
    let all = state
        .nodes
        .iter()
        .map(|n| n.pid)
        .chain(state.newcomers.iter().map(|n| n.pid))
        .chain(state.coordinator.iter().map(|c| c.pid));
    for pid in all {
        assert!(!pid_alive(pid), "pid {pid} of the job is still alive");
    }
}

#[test]
fn expand_shrink_and_rescale_a_running_job() {
    let job = Job::start(2, 2);

    // Grow by two: the launcher starts them, the rescale admits them.
    let report = job.json(&["expand", "--nodes", "2"]);
    assert_eq!(
        (report["epoch_before"].as_u64(), report["epoch"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(
        (report["pes_before"].as_u64(), report["pes"].as_u64()),
        (Some(4), Some(8))
    );
    assert_eq!(pids(&report["admitted"]), [2, 3]);
    assert_eq!(pids(&report["removed"]), [] as [u32; 0]);
    assert_eq!(report["stages"][0]["stage"], "commit");
    let spawned = pids(&report["spawned_pids"]);
    assert_eq!(spawned.len(), 2);

    // They are the launcher's children, recorded in job.json, and members now.
    let status = job.json(&["status"]);
    let members = status["members"].as_array().expect("members");
    let member_pids: Vec<u32> = members
        .iter()
        .map(|m| m["pid"].as_u64().unwrap() as u32)
        .collect();
    // Admitted in the order they registered, which is not always the order started.
    let mut admitted = member_pids[2..].to_vec();
    admitted.sort_unstable();
    let mut started = spawned.clone();
    started.sort_unstable();
    assert_eq!(admitted, started);
    assert!(members.iter().all(|m| m["pes"] == 2));
    let recorded: Vec<u32> = job.record().newcomers.iter().map(|n| n.pid).collect();
    assert_eq!(recorded, spawned);
    job.wait_until("the launcher sees both newcomers admitted", || {
        job.record()
            .newcomers
            .iter()
            .all(|n| n.admitted && n.exit.is_none())
    });

    // Shrink by one: the highest node (a newcomer) leaves, exits 0, and the
    // job goes on.
    let node_3 = member_pids[3];
    let out = job.ductile(&["shrink", "--nodes", "1"]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stderr, job.launcher_log());
    assert!(
        out.stdout
            .starts_with("epoch       2 -> 3\nPEs         8 -> 6\nremoved     3\nadmitted    -\n"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("\nstage "), "{}", out.stdout);
    job.wait_until("the removed newcomer exits 0", || {
        job.record()
            .newcomers
            .iter()
            .any(|n| n.pid == node_3 && n.exit.as_deref() == Some("exited with code 0"))
    });

    // Both at once: launch node 1 leaves, one newcomer joins.
    let report = job.json(&["rescale", "--remove", "1", "--add", "1"]);
    assert_eq!(
        (report["epoch_before"].as_u64(), report["epoch"].as_u64()),
        (Some(3), Some(4))
    );
    assert_eq!(pids(&report["removed"]), [1]);
    assert_eq!(pids(&report["admitted"]), [2]);
    assert_eq!(report["pes"].as_u64(), Some(6));
    let launch_node_1 = job.record().nodes[1].pid;
    job.wait_until("removed launch node 1 exits", || !pid_alive(launch_node_1));
    job.wait_until("the launcher sees the third newcomer admitted", || {
        job.record().newcomers.get(2).is_some_and(|n| n.admitted)
    });

    // What the job cannot do is refused before anything happens.
    for (args, says) in [
        (
            &["shrink", "--nodes", "3"][..],
            "cannot remove 3 of the job's 3 nodes",
        ),
        (&["shrink", "--remove", "0"], "node 0 never leaves"),
        (&["rescale", "--remove", "5"], "there is no node 5"),
    ] {
        let out = job.ductile(args);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
    }
    let status = job.json(&["status"]);
    assert_eq!(
        (status["epoch"].as_u64(), status["pes"].as_u64()),
        (Some(4), Some(6))
    );

    let (code, log, state) = job.finish();
    assert_eq!(code, Some(0), "{log}");
    assert!(
        !log.contains("ductile:"),
        "departures are not failures:\n{log}"
    );
    assert_eq!(
        state.outcome.as_ref().expect("outcome").result,
        JobResult::Completed
    );
    assert!(
        state.newcomers.iter().all(|n| n.admitted && !n.dropped),
        "{:?}",
        state.newcomers
    );
    assert!(
        state
            .newcomers
            .iter()
            .all(|n| n.exit.as_deref() == Some("exited with code 0")),
        "members leave or finish with 0: {:?}",
        state.newcomers
    );
    assert_all_gone(&state);
    assert!(
        !state.state_dir.join("launcher.sock").exists(),
        "launcher.sock left behind"
    );
}

#[test]
fn newcomers_that_are_not_admitted_are_dropped_and_the_job_goes_on() {
    let job = Job::start(2, 1);

    // A newcomer that dies before it registers fails the expand, not the job.
    job.switch("newcomers-fail", true);
    let out = job.ductile(&["expand", "--nodes", "1"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("exited with code 3 before the rescale"),
        "{}",
        out.stderr
    );
    job.wait_until("the launcher says it dropped the newcomer", || {
        job.launcher_log().contains("newcomer 0 (pid")
            && job.launcher_log().contains("dropped (the job goes on)")
    });
    job.switch("newcomers-fail", false);

    // A rescale the job refuses: the command says why and stops its newcomer.
    job.switch("refuse-rescale", true);
    let out = job.ductile(&["expand", "--nodes", "1"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("the job refused the rescale: refused as asked"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("stopped the newcomers started for it"),
        "{}",
        out.stderr
    );
    job.wait_until("the refused newcomer is stopped and dropped", || {
        job.record().newcomers.get(1).is_some_and(|n| {
            n.dropped && n.exit.as_deref() == Some("was killed by signal 15 (SIGTERM)")
        })
    });
    job.switch("refuse-rescale", false);

    let status = job.json(&["status"]);
    assert_eq!(status["epoch"].as_u64(), Some(1));
    assert_eq!(status["members"].as_array().map(Vec::len), Some(2));
    let listed = status["launcher_newcomers"]
        .as_array()
        .expect("newcomers")
        .len();
    assert_eq!(listed, 2);
    let human = job.ductile(&["status"]);
    assert!(
        human
            .stdout
            .contains("dropped: exited with code 3 before admission"),
        "{}",
        human.stdout
    );

    let (code, log, state) = job.finish();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(
        state.outcome.as_ref().expect("outcome").result,
        JobResult::Completed
    );
    assert!(
        state.newcomers.iter().all(|n| !n.admitted && n.dropped),
        "{:?}",
        state.newcomers
    );
    assert_all_gone(&state);
}

#[test]
fn the_commands_say_when_no_job_runs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for args in [
        &["expand", "--nodes", "1"][..],
        &["shrink", "--nodes", "1"],
        &["rescale", "--add", "1"],
    ] {
        let out = Command::new(DUCTILE)
            .args(args)
            .arg("--state-dir")
            .arg(tmp.path())
            .output()
            .expect("run ductile");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("no running job in"), "{args:?}: {stderr}");
    }
}

/// Not a test: the fake node the tests above run under `ductile run`. Run by
/// hand (without `DUCTILE_TEST_FAKE_NODE`) it does nothing.
/// Runs `ductile wait-left ARGS` for the job's node `pid` (the fake nodes
/// all report the host name `fake`).
fn wait_left(job: &Job, pid: u32, timeout: &str) -> Command {
    let mut cmd = Command::new(DUCTILE);
    cmd.args(["wait-left", "--host", "fake", "--pid", &pid.to_string()])
        .args(["--timeout", timeout, "--interval", "0.05", "--state-dir"])
        .arg(&job.state_dir)
        .stdin(Stdio::null());
    cmd
}

#[test]
fn wait_left_returns_once_a_shrink_removed_the_node() {
    let job = Job::start(3, 1);
    let status = job.json(&["status"]);
    let pid_of = |node: usize| status["members"][node]["pid"].as_u64().expect("pid") as u32;
    let (node_1, node_2) = (pid_of(1), pid_of(2));

    // A preStop hook for node 2 waits while node 2 is a member...
    let mut waiter = wait_left(&job, node_2, "30")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn wait-left");
    thread::sleep(Duration::from_millis(500));
    assert!(
        waiter.try_wait().expect("wait").is_none(),
        "wait-left returned while its node is a member"
    );

    // ...and one whose node stays a member gives up at its timeout with 1.
    let out = wait_left(&job, node_1, "0.3").output().expect("wait-left");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is still a member at epoch 1"), "{stderr}");

    // The shrink removes node 2 (the coordinator's Die): the hook ends with 0.
    let out = job.ductile(&["shrink", "--remove", "2"]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stderr, job.launcher_log());
    let deadline = Instant::now() + WATCHDOG;
    let code = loop {
        if let Some(status) = waiter.try_wait().expect("wait") {
            break status.code();
        }
        assert!(Instant::now() < deadline, "wait-left did not return");
        thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut waiter.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "host fake pid {node_2} is not a member of the job at epoch 2"
        )),
        "{stderr}"
    );

    // A node that is not a member (gone, or never admitted) is left at once.
    let out = wait_left(&job, node_2, "30").output().expect("wait-left");
    assert_eq!(out.status.code(), Some(0));

    // No control endpoint answering: 3; no job secret: 2.
    let secret = ductile_coordinator::Secret::generate().to_hex();
    let unreachable = Command::new(DUCTILE)
        .args(["wait-left", "--control", "127.0.0.1:1", "--timeout", "0.5"])
        .env("DUCTILE_SECRET", &secret)
        .output()
        .expect("wait-left");
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert_eq!(unreachable.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("did not answer"), "{stderr}");
    let no_secret = Command::new(DUCTILE)
        .args(["wait-left", "--control", "127.0.0.1:1"])
        .env_remove("DUCTILE_SECRET")
        .env_remove("DUCTILE_SECRET_FILE")
        .output()
        .expect("wait-left");
    let stderr = String::from_utf8_lossy(&no_secret.stderr);
    assert_eq!(no_secret.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no job secret"), "{stderr}");

    let (code, log, _) = job.finish();
    assert_eq!(code, Some(0), "{log}");
}

#[test]
#[ignore = "the fake node process of the rescale tests, not a test"]
fn fake_node() {
    let Some(switches) = std::env::var_os(FAKE_ENV) else {
        return;
    };
    let code = match fake::run(Path::new(&switches)) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("fake node: {err}");
            2
        }
    };
    std::process::exit(code);
}

/// A node with no runtime: registers, serves node 0's control endpoint
/// (status; a rescale as one coordinator commit), leaves when removed, and
/// ends the job through the shutdown barrier once the `stop` switch is on.
mod fake {
    use std::net::TcpListener;
    use std::path::Path;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use ductile_coordinator::contract::{self, role_from_env, secret_from_env};
    use ductile_coordinator::control::{
        serve_connection, ControlReply, ControlRequest, JobStatus, RescaleReport, StageTime,
    };
    use ductile_coordinator::{Admission, Client, Registration, Role, ServerMsg, View};
    use ductile_operator::local::process::pid_alive;

    const WAIT: Duration = Duration::from_secs(30);

    fn var(name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    /// A newcomer must get the contract of a launch member, but as a newcomer.
    fn check_newcomer_contract() -> Result<(), String> {
        if let Some(index) = var(contract::ENV_LAUNCH_INDEX) {
            return Err(format!(
                "newcomer has {}={index}",
                contract::ENV_LAUNCH_INDEX
            ));
        }
        if var(contract::ENV_CONTROL).is_some() || var(contract::ENV_CONTROL_FILE).is_some() {
            return Err("newcomer was told to serve the control endpoint".to_owned());
        }
        let parent = std::os::unix::process::parent_id().to_string();
        if var(contract::ENV_LAUNCHER_PID).as_deref() != Some(parent.as_str()) {
            return Err(format!(
                "newcomer's {} is not its parent {parent}",
                contract::ENV_LAUNCHER_PID
            ));
        }
        Ok(())
    }

    pub fn run(switches: &Path) -> Result<i32, String> {
        let role = role_from_env().map_err(|e| e.to_string())?;
        if role == Role::Newcomer {
            check_newcomer_contract()?;
            if switches.join("newcomers-fail").exists() {
                eprintln!("fake node: newcomer failing as asked");
                return Ok(3);
            }
        }
        let secret = secret_from_env().map_err(|e| e.to_string())?;
        let addr = var(contract::ENV_COORDINATOR).ok_or("no coordinator")?;
        let pes = var(contract::ENV_PES)
            .and_then(|p| p.parse().ok())
            .ok_or("no PEs")?;
        let launcher: u32 = var(contract::ENV_LAUNCHER_PID)
            .and_then(|p| p.parse().ok())
            .ok_or("no launcher pid")?;
        let client = Arc::new(Client::connect(&addr, &secret, WAIT).map_err(|e| e.to_string())?);
        let registration = Registration {
            role,
            address: Vec::new(),
            pes,
            host: "fake".to_owned(),
            pid: std::process::id(),
            fingerprint: 0xfa4e,
        };
        let (mut member, view) = match client
            .register(registration, WAIT)
            .map_err(|e| e.to_string())?
        {
            Admission::Member { node, view } => (Some(node), view),
            Admission::Waiting { view, .. } => (None, view),
        };
        let view = Arc::new(Mutex::new(view));
        if member == Some(0) {
            serve_control(Arc::clone(&client), Arc::clone(&view), secret, switches)?;
        }
        loop {
            if !pid_alive(launcher) {
                return Ok(70);
            }
            if member.is_some() && switches.join("stop").exists() {
                let (current, _) = client.query_view(WAIT).map_err(|e| e.to_string())?;
                let epoch = current.ok_or("no view")?.epoch;
                return client
                    .shutdown_barrier(epoch, 0, WAIT)
                    .map_err(|e| e.to_string());
            }
            match client.events().recv_timeout(Duration::from_millis(20)) {
                Ok(ServerMsg::Die { .. }) => return Ok(0),
                Ok(ServerMsg::Integrate { node, view: new }) => {
                    member = Some(node);
                    *view.lock().unwrap() = new;
                }
                Ok(ServerMsg::ViewUpdate { view: new }) => *view.lock().unwrap() = new,
                Err(e) if e.is_disconnected() => return Ok(71),
                Ok(_) | Err(_) => {}
            }
        }
    }

    fn serve_control(
        client: Arc<Client>,
        view: Arc<Mutex<View>>,
        secret: ductile_coordinator::Secret,
        switches: &Path,
    ) -> Result<(), String> {
        let listen = var(contract::ENV_CONTROL).ok_or("node 0 has no control address")?;
        let file = var(contract::ENV_CONTROL_FILE).ok_or("node 0 has no control file")?;
        let listener = TcpListener::bind(&listen).map_err(|e| e.to_string())?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        let tmp = format!("{file}.tmp");
        std::fs::write(&tmp, bound.to_string()).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &file).map_err(|e| e.to_string())?;
        let refuse = switches.join("refuse-rescale");
        let started = Instant::now();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (client, view, secret, refuse) =
                    (client.clone(), view.clone(), secret.clone(), refuse.clone());
                std::thread::spawn(move || {
                    let _ = serve_connection(stream, &secret, |request| match request {
                        ControlRequest::Status => match client.query_view(WAIT) {
                            Ok((Some(v), pending)) => ControlReply::Status(JobStatus {
                                epoch: v.epoch,
                                pes: v.total_pes(),
                                members: v.members,
                                pending,
                                uptime_ms: started.elapsed().as_millis() as u64,
                            }),
                            other => ControlReply::Error {
                                message: format!("{other:?}"),
                            },
                        },
                        ControlRequest::Rescale(_) if refuse.exists() => ControlReply::Error {
                            message: "refused as asked".to_owned(),
                        },
                        ControlRequest::Rescale(req) => {
                            let t = Instant::now();
                            let before = view.lock().unwrap().clone();
                            match client.commit(before.epoch, req.remove.clone(), req.admit, WAIT) {
                                Ok(after) => {
                                    let ms = t.elapsed().as_secs_f64() * 1e3;
                                    let n = after.members.len() as u32;
                                    *view.lock().unwrap() = after.clone();
                                    ControlReply::Rescaled(RescaleReport {
                                        epoch_before: before.epoch,
                                        epoch: after.epoch,
                                        removed: req.remove.clone(),
                                        admitted: (n - req.admit..n).collect(),
                                        pes_before: before.total_pes(),
                                        pes: after.total_pes(),
                                        migrations: 0,
                                        stages: vec![StageTime {
                                            stage: "commit".to_owned(),
                                            ms,
                                        }],
                                        mechanism_ms: ms,
                                        total_ms: ms,
                                        gpu: vec![],
                                    })
                                }
                                Err(e) => ControlReply::Error {
                                    message: e.to_string(),
                                },
                            }
                        }
                        ControlRequest::Checkpoint(_) => ControlReply::Error {
                            message: "not served by this test".to_owned(),
                        },
                        ControlRequest::Hello { .. } => ControlReply::Error {
                            message: "already authenticated".to_owned(),
                        },
                    });
                });
            }
        });
        Ok(())
    }
}
