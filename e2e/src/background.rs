//! A job running in the background under `ductile run`, for the suites that
//! act on a job while it computes (rescales, faults, a coordinator killed):
//! its state directory, its control endpoint, `ductile` subcommands against
//! it, its output collected as it comes, and an end that is always bounded.
//! Dropping a [`Background`] kills whatever of it still runs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ductile_coordinator::control::{ControlClient, JobStatus};
use ductile_coordinator::proto::Member;
use ductile_coordinator::Secret;
use serde_json::Value;

use crate::{bin, collect, eventually};

/// How long a test waits for a job to show something (its control
/// endpoint, a log line, a newcomer registering).
pub const WAIT: Duration = Duration::from_secs(60);

/// What a background job is started with; [`Launch::start`] starts it.
pub struct Launch {
    nodes: u32,
    pes: u32,
    program: PathBuf,
    args: Vec<String>,
    prefix: Option<PathBuf>,
    flags: Vec<String>,
    env: Vec<(String, String)>,
    state: Option<tempfile::TempDir>,
    timeout_s: u32,
}

impl Launch {
    /// PEs per node (default 1).
    pub fn pes(mut self, pes: u32) -> Launch {
        self.pes = pes;
        self
    }

    /// Extra `ductile run` flags.
    pub fn flags(mut self, flags: &[&str]) -> Launch {
        self.flags.extend(flags.iter().map(|f| f.to_string()));
        self
    }

    /// An environment variable for the launcher and every process of the job.
    pub fn env(mut self, key: &str, value: &str) -> Launch {
        self.env.push((key.into(), value.into()));
        self
    }

    /// A wrapper every node is started through (`prefix program args`).
    pub fn prefix(mut self, wrapper: &Path) -> Launch {
        self.prefix = Some(wrapper.to_path_buf());
        self
    }

    /// A state directory the test prepared (wrappers, files) instead of a
    /// fresh one.
    pub fn state(mut self, dir: tempfile::TempDir) -> Launch {
        self.state = Some(dir);
        self
    }

    /// `ductile run --timeout` (default 300 s).
    pub fn timeout_s(mut self, secs: u32) -> Launch {
        self.timeout_s = secs;
        self
    }

    /// Starts the job and waits until node 0 published its control endpoint.
    pub fn start(self) -> Background {
        let state = match self.state {
            Some(dir) => dir,
            None => tempfile::tempdir().expect("temp dir"),
        };
        let mut child = Command::new(bin("ductile"))
            .arg("run")
            .args(["--nodes", &self.nodes.to_string()])
            .args(["--pes-per-node", &self.pes.to_string()])
            .arg("--state-dir")
            .arg(state.path())
            .args(["--timeout", &self.timeout_s.to_string()])
            .args(&self.flags)
            .arg("--")
            .args(&self.prefix)
            .arg(&self.program)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning ductile run");
        let stdout = collect(child.stdout.take().expect("stdout"));
        let stderr = collect(child.stderr.take().expect("stderr"));
        let job = Background {
            child: Some(child),
            state,
            stdout,
            stderr,
            pes: self.pes,
            program: self.program,
            args: self.args,
            strays: Vec::new(),
        };
        assert!(
            eventually(WAIT, || job.path("control.addr").exists()),
            "the job never published its control endpoint\n{}",
            job.stderr()
        );
        job
    }
}

/// How a background job ended.
pub struct Finished {
    /// `ductile run`'s exit code (None: killed by a signal).
    pub code: Option<i32>,
    /// Everything the job printed on stdout.
    pub stdout: String,
    /// Everything on stderr.
    pub stderr: String,
    /// The launcher's final `job.json` (Null if it wrote none).
    pub record: Value,
}

impl Finished {
    /// The value of the last `checksum=` token on stdout.
    pub fn checksum(&self) -> String {
        crate::last_value(&self.stdout, "checksum").unwrap_or_else(|| {
            panic!(
                "no checksum\n--- stdout\n{}\n--- stderr\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// Panics unless the job failed the way a fault must end it: its stderr
    /// says `needle` (`what`, for the message), it did not run until its
    /// `--timeout`, and it printed no result.
    pub fn failed_naming(&self, needle: &str, what: &str) {
        assert!(
            self.stderr.contains(needle),
            "{what}: no {needle:?} in the job's stderr\n{}",
            self.stderr
        );
        assert!(
            !self.stderr.contains("ran past its --timeout"),
            "the job stalled until its timeout\n{}",
            self.stderr
        );
        assert_eq!(
            crate::last_value(&self.stdout, "checksum"),
            None,
            "a failed job printed a result\n{}",
            self.stdout
        );
    }

    /// Panics with the job's output unless it exited 0 with checksum `want`.
    pub fn completes_with(&self, want: &str) {
        assert_eq!(
            self.code,
            Some(0),
            "the job failed\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout,
            self.stderr
        );
        assert_eq!(self.checksum(), want, "checksum changed\n{}", self.stderr);
    }
}

/// A job running under `ductile run` (see the module docs).
pub struct Background {
    child: Option<Child>,
    state: tempfile::TempDir,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    pes: u32,
    program: PathBuf,
    args: Vec<String>,
    /// Newcomers the test started itself (not through the launcher).
    strays: Vec<Child>,
}

impl Background {
    /// A job of `program args` (a release binary's name) on `nodes` nodes,
    /// to be configured and started.
    pub fn launch<S: AsRef<str>>(nodes: u32, program: &str, args: &[S]) -> Launch {
        Launch {
            nodes,
            pes: 1,
            program: bin(program),
            args: args.iter().map(|a| a.as_ref().to_owned()).collect(),
            prefix: None,
            flags: Vec::new(),
            env: Vec::new(),
            state: None,
            timeout_s: 300,
        }
    }

    /// The job's state directory.
    pub fn state(&self) -> &Path {
        self.state.path()
    }

    /// A file of the state directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.state.path().join(name)
    }

    /// A file of the state directory, trimmed; panics if it is missing.
    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name))
            .unwrap_or_else(|e| panic!("reading {name}: {e}"))
            .trim()
            .to_string()
    }

    /// The job's secret.
    pub fn secret(&self) -> Secret {
        Secret::from_hex(&self.read("secret")).expect("the state directory holds the secret")
    }

    /// A client of node 0's control endpoint.
    pub fn control(&self) -> ControlClient {
        ControlClient::connect(&self.read("control.addr"), &self.secret(), WAIT)
            .expect("connecting to the control endpoint")
    }

    /// The job's status, or `None` when node 0 does not answer (within 5 s).
    pub fn try_status(&self) -> Option<JobStatus> {
        let secret = Secret::from_hex(std::fs::read_to_string(self.path("secret")).ok()?.trim());
        let addr = std::fs::read_to_string(self.path("control.addr")).ok()?;
        ControlClient::connect(addr.trim(), &secret.ok()?, Duration::from_secs(5))
            .ok()?
            .status()
            .ok()
    }

    /// The members of the job's current view.
    pub fn members(&self) -> Vec<Member> {
        self.control().status().expect("status").members
    }

    /// The launcher's `job.json`.
    pub fn record(&self) -> Value {
        serde_json::from_str(&self.read("job.json")).expect("job.json is JSON")
    }

    /// The coordinator's pid and address, from `job.json`.
    pub fn coordinator(&self) -> (u32, String) {
        let record = self.record();
        let pid = record["coordinator"]["pid"]
            .as_u64()
            .unwrap_or_else(|| panic!("no coordinator pid in {record}"));
        let addr = record["coordinator"]["addr"]
            .as_str()
            .unwrap_or_else(|| panic!("no coordinator address in {record}"));
        (pid as u32, addr.to_owned())
    }

    /// Asks the launcher, through its request channel (`launcher.sock`),
    /// to start one newcomer; its pid.
    pub fn spawn_newcomer(&self) -> u32 {
        use std::io::{BufRead, BufReader, Write};
        let mut socket = std::os::unix::net::UnixStream::connect(self.path("launcher.sock"))
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

    /// Whether `ductile run` still runs.
    pub fn running(&mut self) -> bool {
        let child = self.child.as_mut().expect("running");
        child.try_wait().expect("try_wait").is_none()
    }

    /// What the job printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().expect("output lock").clone()
    }

    /// Waits until the job's stderr holds `needle` `times` times.
    pub fn wait_for_log(&self, needle: &str, times: usize) {
        assert!(
            eventually(WAIT, || self.stderr().matches(needle).count() >= times),
            "no {needle:?} (x{times}) in the job's log\n{}",
            self.stderr()
        );
    }

    /// `ductile ARGS --state-dir D --json`, started in the background
    /// (with `--timeout 120` unless `args` name one).
    pub fn spawn_ductile(&self, args: &[&str]) -> Child {
        Command::new(bin("ductile"))
            .args(args)
            .arg("--state-dir")
            .arg(self.state.path())
            .arg("--json")
            .args(if args.contains(&"--timeout") {
                &[][..]
            } else {
                &["--timeout", "120"][..]
            })
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running ductile")
    }

    /// A `ductile` subcommand that must succeed; its JSON report.
    pub fn ductile(&self, args: &[&str]) -> Value {
        report(
            args,
            self.spawn_ductile(args)
                .wait_with_output()
                .expect("ductile"),
        )
    }

    /// A `ductile` subcommand (without `--json`) that must fail with exit
    /// code 1; its stderr.
    pub fn ductile_fails(&self, args: &[&str]) -> String {
        let out = Command::new(bin("ductile"))
            .args(args)
            .arg("--state-dir")
            .arg(self.state.path())
            .stdin(Stdio::null())
            .output()
            .expect("running ductile");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(
            out.status.code(),
            Some(1),
            "ductile {args:?} should fail\n{}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        stderr
    }

    /// Starts `k` newcomer processes of the job's program outside the
    /// launcher and waits until the coordinator lists them as pending.
    pub fn start_strays(&mut self, k: usize) {
        let before = self.control().status().expect("status").pending.len();
        for _ in 0..k {
            let child = Command::new(&self.program)
                .args(&self.args)
                .env("DUCTILE_COORDINATOR", self.read("coordinator.addr"))
                .env("DUCTILE_SECRET", self.secret().to_hex())
                .env("DUCTILE_ROLE", "newcomer")
                .env("DUCTILE_PES", self.pes.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("spawning a newcomer");
            self.strays.push(child);
        }
        let pending = || self.control().status().expect("status").pending.len();
        assert!(
            eventually(WAIT, || pending() >= before + k),
            "newcomers never registered"
        );
    }

    /// Kills the `i`th newcomer [`Background::start_strays`] started and
    /// reaps it; its pid.
    pub fn kill_stray(&mut self, i: usize) -> u32 {
        let stray = &mut self.strays[i];
        stray.kill().expect("killing a newcomer");
        let _ = stray.wait();
        stray.id()
    }

    /// Waits for the job to end (at most 5 minutes).
    pub fn finish(self) -> Finished {
        self.finish_within(Duration::from_secs(300))
    }

    /// Waits at most `limit` for the job to end; a job still running then
    /// is killed and the test fails, saying it hung.
    pub fn finish_within(mut self, limit: Duration) -> Finished {
        let mut child = self.child.take().expect("running");
        let end = Instant::now() + limit;
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= end {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the job hung: still running after {limit:?}\n--- stderr\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for mut n in std::mem::take(&mut self.strays) {
            let _ = n.wait();
        }
        // The collectors end with the pipes; give them a moment to take the rest.
        let (out, err) = (Arc::clone(&self.stdout), Arc::clone(&self.stderr));
        eventually(Duration::from_secs(5), || {
            Arc::strong_count(&out) == 2 && Arc::strong_count(&err) == 2
        });
        let record = std::fs::read_to_string(self.path("job.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        Finished {
            code: status.code(),
            stdout: self.stdout.lock().expect("output lock").clone(),
            stderr: self.stderr(),
            record,
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &mut self.strays {
            let _ = n.kill();
            let _ = n.wait();
        }
    }
}

/// A `ductile` run that must have succeeded; its JSON report.
pub fn report(args: &[&str], out: Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ductile {args:?} failed ({:?})\n{stdout}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}
