//! Helpers for the end-to-end tests: find the release binaries, run a job
//! through `ductile run` with its own state directory, and read its output.
//!
//! The binaries must be built first (`cargo build --release --workspace
//! --bins`); `scripts/test` does that before it runs the tests.

pub mod background;
pub mod flood;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The node x PE shapes every feature is exercised at (Charm++ megatest style).
pub const SHAPES: &[(u32, u32)] = &[(1, 1), (1, 2), (2, 1), (2, 2), (3, 1)];

/// Directory holding the release binaries.
pub fn bin_dir() -> PathBuf {
    if let Ok(d) = std::env::var("DUCTILE_BIN_DIR") {
        return PathBuf::from(d);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("release")
}

/// Path of a release binary, with a clear panic if it was not built.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(p.exists(), "{} is missing: build the binaries first (`cargo build --release --workspace --bins`, or run scripts/test)", p.display());
    p
}

/// What a finished job left behind.
pub struct Job {
    /// `ductile run`'s exit code (None: killed by a signal).
    pub code: Option<i32>,
    /// Everything the job printed on stdout.
    pub stdout: String,
    /// Everything on stderr.
    pub stderr: String,
    /// The job's state directory (kept until the value is dropped).
    pub state: tempfile::TempDir,
}

impl Job {
    /// The value of the last `key=value` token named `key` in stdout.
    pub fn value(&self, key: &str) -> Option<String> {
        last_value(&self.stdout, key)
    }

    /// Panics with the job's output unless it exited with `code`.
    pub fn expect_code(&self, code: i32, what: &str) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "{what}: unexpected exit\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout,
            self.stderr
        );
        self
    }

    /// The job record written by the launcher.
    pub fn record(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.state.path().join("job.json"))
            .expect("job.json written by ductile run");
        serde_json::from_str(&text).expect("job.json is JSON")
    }
}

/// Runs `program args` as a `nodes` x `pes` job through `ductile run`.
pub fn run(nodes: u32, pes: u32, program: &str, args: &[&str]) -> Job {
    run_with(nodes, pes, program, args, &[])
}

/// As [`run`], with extra `ductile run` flags (a `--timeout` among them
/// replaces the default of 120 s).
pub fn run_with(nodes: u32, pes: u32, program: &str, args: &[&str], flags: &[&str]) -> Job {
    let state = tempfile::tempdir().expect("temp dir");
    let out: Output = Command::new(bin("ductile"))
        .arg("run")
        .args([
            "--nodes",
            &nodes.to_string(),
            "--pes-per-node",
            &pes.to_string(),
        ])
        .arg("--state-dir")
        .arg(state.path())
        .args(if flags.contains(&"--timeout") {
            &[][..]
        } else {
            &["--timeout", "120"][..]
        })
        .args(flags)
        .arg("--")
        .arg(bin(program))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawning ductile run");
    Job {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        state,
    }
}

/// The value of the last `key=value` token named `key` in `text`.
pub fn last_value(text: &str, key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    text.lines()
        .flat_map(|l| l.split_whitespace())
        .filter_map(|tok| tok.strip_prefix(&prefix))
        .next_back()
        .map(str::to_string)
}

/// Jacobi2D's arguments for the end-to-end jobs: a 192x192 grid of 24x24
/// blocks, `iters` iterations, quiet.
pub fn jacobi_args(iters: u32) -> Vec<String> {
    let iters = iters.to_string();
    [
        "--grid", "192", "--block", "24", "--iters", &iters, "--quiet",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The checksum of a 1-node, 1-PE Jacobi2D run of `spec`: what every
/// rescaled, migrated or recovered run of the same spec must print.
/// Computed once per spec and test process.
pub fn reference_checksum(spec: &[String]) -> String {
    static KNOWN: std::sync::Mutex<Vec<(Vec<String>, String)>> = std::sync::Mutex::new(Vec::new());
    if let Some((_, sum)) = KNOWN
        .lock()
        .expect("reference lock")
        .iter()
        .find(|(s, _)| s == spec)
    {
        return sum.clone();
    }
    let args: Vec<&str> = spec.iter().map(String::as_str).collect();
    let job = run(1, 1, "jacobi2d", &args);
    job.expect_code(0, "jacobi2d reference");
    let sum = job
        .value("checksum")
        .unwrap_or_else(|| panic!("no checksum in the reference run\n{}", job.stdout));
    KNOWN
        .lock()
        .expect("reference lock")
        .push((spec.to_vec(), sum.clone()));
    sum
}

/// Sends `sig` (`-STOP`, `-CONT`, `-KILL`...) to `pid` with kill(1).
pub fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("running kill");
    assert!(st.success(), "kill {sig} {pid} failed");
}

/// Whether a process with this pid still exists.
pub fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.split_whitespace().nth(2) == Some("Z"))
}

/// Waits up to `limit` for `cond`.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + limit;
    while std::time::Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Collects what `from` (a child's stdout or stderr) writes, as it comes,
/// on a thread of its own: a test can wait for a line while the job runs.
pub fn collect(
    mut from: impl std::io::Read + Send + 'static,
) -> std::sync::Arc<std::sync::Mutex<String>> {
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let into = std::sync::Arc::clone(&text);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock()
                .expect("output lock")
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    text
}
