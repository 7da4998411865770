//! A job's state directory and the `job.json` record in it.
//!
//! One directory per job on this machine holds what later commands
//! (`ductile status`, `ductile stop`, ...) need to find a running job:
//!
//! | file | written by | lifetime |
//! |---|---|---|
//! | `launcher.pid` | `ductile run` | while the launcher runs; also the lock that keeps two launchers out |
//! | `launcher.sock` | `ductile run` | while the job runs: its request channel ([`crate::local::channel`]) |
//! | `coordinator.addr` | the coordinator (again by each restarted one) | while the job runs |
//! | `coordinator.log` | the coordinator's stdout and stderr | kept |
//! | `control.addr` | node 0: its control endpoint's address | while the job runs |
//! | `secret` | `ductile run`: the job secret (0600) | while the job runs |
//! | `job.json` | `ductile run` | kept; the final one records the outcome |
//!
//! Where the directory is: `--state-dir DIR` names it exactly; otherwise it is
//! `<root>/<job>` with root `$DUCTILE_STATE_DIR`, else `$XDG_STATE_HOME/ductile`,
//! else `$HOME/.local/state/ductile`.

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::local::process::pid_alive;

/// Environment variable naming the root under which job state directories live.
pub const ENV_STATE_DIR: &str = "DUCTILE_STATE_DIR";
/// The job name when none is given.
pub const DEFAULT_JOB: &str = "default";
/// The lock / pid file of a running launcher.
pub const LAUNCHER_PID_FILE: &str = "launcher.pid";
/// The running launcher's request channel, a Unix-domain socket (mode 0600).
pub const LAUNCHER_SOCKET_FILE: &str = "launcher.sock";
/// Where the coordinator writes the address it bound.
pub const COORDINATOR_ADDR_FILE: &str = "coordinator.addr";
/// File node 0 writes its control endpoint's address to.
pub const CONTROL_ADDR_FILE: &str = "control.addr";
/// Node 0's metrics address (`ductile run --metrics-port`).
pub const METRICS_ADDR_FILE: &str = "metrics.addr";
/// The job secret (hex, mode 0600), for tools that talk to the running job.
pub const SECRET_FILE: &str = "secret";
/// The coordinator's output.
pub const COORDINATOR_LOG_FILE: &str = "coordinator.log";
/// The job record.
pub const JOB_FILE: &str = "job.json";
/// Version of the `job.json` layout; bumped on incompatible changes.
pub const JOB_STATE_FORMAT: u32 = 1;

/// Errors about a job's name or state directory.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The job name cannot be used as a directory name.
    #[error("invalid job name {name:?}: use 1-63 characters from [A-Za-z0-9._-], not starting with '.' or '-'")]
    InvalidJobName {
        /// The rejected name.
        name: String,
    },
    /// No state directory could be derived from the environment.
    #[error("cannot choose a state directory: none of --state-dir, ${ENV_STATE_DIR}, $XDG_STATE_HOME, $HOME is set")]
    NoStateRoot,
    /// Another launcher is running this job.
    #[error("job state directory {dir} is in use by a running launcher (pid {pid}); stop that job, or pick another --job or --state-dir (if pid {pid} is not a ductile launcher, remove {pid_file})", dir = dir.display(), pid_file = dir.join(LAUNCHER_PID_FILE).display())]
    Busy {
        /// The directory.
        dir: PathBuf,
        /// The live launcher's pid.
        pid: u32,
    },
    /// Filesystem trouble.
    #[error("{what} {path}: {source}", path = path.display())]
    Io {
        /// What we were doing.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The launcher's socket would not fit a Unix socket address.
    #[error("state directory {dir} is too long: its launcher socket needs a path of at most {max} bytes, {len} here; choose a shorter --state-dir (or ${ENV_STATE_DIR})", dir = dir.display())]
    PathTooLong {
        /// The directory.
        dir: PathBuf,
        /// Bytes the socket's path would take.
        len: usize,
        /// The most a Unix socket path can take.
        max: usize,
    },
    /// `job.json` does not parse.
    #[error("cannot read {path}: {source}", path = path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
}

/// Checks that a job name is usable as a directory name (and, later, in
/// Kubernetes object names).
pub fn validate_job_name(name: &str) -> Result<(), StateError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('.')
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(StateError::InvalidJobName {
            name: name.to_owned(),
        })
    }
}

/// The state directory for `job`, given an explicit `--state-dir` and a way to
/// read the environment (a parameter so tests need not touch the process env).
pub fn resolve_state_dir(
    explicit: Option<&Path>,
    job: &str,
    env: impl Fn(&str) -> Option<OsString>,
) -> Result<PathBuf, StateError> {
    validate_job_name(job)?;
    if let Some(dir) = explicit {
        return Ok(dir.to_path_buf());
    }
    let set = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let root = if let Some(root) = set(ENV_STATE_DIR) {
        root
    } else if let Some(xdg) = set("XDG_STATE_HOME") {
        xdg.join("ductile")
    } else if let Some(home) = set("HOME") {
        home.join(".local").join("state").join("ductile")
    } else {
        return Err(StateError::NoStateRoot);
    };
    Ok(root.join(job))
}

/// A job's state directory, held by this launcher: creating it takes the lock
/// (`launcher.pid`), dropping it releases the lock.
#[derive(Debug)]
pub struct StateDir {
    dir: PathBuf,
    locked: bool,
}

impl StateDir {
    /// Creates `dir` if needed and takes it for this process. A pid file left
    /// by a launcher that is gone is taken over; one of a live launcher is
    /// refused with [`StateError::Busy`].
    pub fn lock(dir: &Path) -> Result<Self, StateError> {
        // sun_path holds 108 bytes with the terminating NUL; `expand`,
        // `shrink` and `rescale` reach the launcher only through this socket.
        const MAX_SOCKET_PATH: usize = 107;
        let len = dir.join(LAUNCHER_SOCKET_FILE).as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(StateError::PathTooLong {
                dir: dir.to_path_buf(),
                len,
                max: MAX_SOCKET_PATH,
            });
        }
        fs::create_dir_all(dir).map_err(|source| StateError::Io {
            what: "cannot create state directory",
            path: dir.to_path_buf(),
            source,
        })?;
        let pid_file = dir.join(LAUNCHER_PID_FILE);
        // Two rounds: the second follows the removal of a stale pid file.
        for _ in 0..2 {
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&pid_file)
            {
                Ok(mut file) => {
                    writeln!(file, "{}", std::process::id()).map_err(|source| StateError::Io {
                        what: "cannot write",
                        path: pid_file.clone(),
                        source,
                    })?;
                    let held = Self {
                        dir: dir.to_path_buf(),
                        locked: true,
                    };
                    held.forget_processes();
                    held.remove_file(LAUNCHER_SOCKET_FILE);
                    return Ok(held);
                }
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                    match read_pid(&pid_file) {
                        Some(pid) if pid != std::process::id() && pid_alive(pid) => {
                            return Err(StateError::Busy {
                                dir: dir.to_path_buf(),
                                pid,
                            });
                        }
                        _ => {
                            tracing::info!(path = %pid_file.display(), "taking over a stale launcher pid file");
                            let _ = fs::remove_file(&pid_file);
                        }
                    }
                }
                Err(source) => {
                    return Err(StateError::Io {
                        what: "cannot create",
                        path: pid_file,
                        source,
                    })
                }
            }
        }
        // Someone else keeps recreating it: treat as busy by an unknown launcher.
        Err(StateError::Busy {
            dir: dir.to_path_buf(),
            pid: read_pid(&pid_file).unwrap_or(0),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Path of the coordinator's address file.
    pub fn addr_file(&self) -> PathBuf {
        self.dir.join(COORDINATOR_ADDR_FILE)
    }

    /// Path of node 0's control address file.
    pub fn control_file(&self) -> PathBuf {
        self.dir.join(CONTROL_ADDR_FILE)
    }

    /// Path of node 0's metrics address file.
    pub fn metrics_file(&self) -> PathBuf {
        self.dir.join(METRICS_ADDR_FILE)
    }

    /// Path of the launcher's request channel (a Unix-domain socket).
    pub fn launcher_socket(&self) -> PathBuf {
        self.dir.join(LAUNCHER_SOCKET_FILE)
    }

    /// Stores the job secret for tools (`ductile status`), readable by this user only.
    pub fn write_secret(&self, hex: &str) -> Result<(), StateError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.dir.join(SECRET_FILE);
        let _ = fs::remove_file(&path);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| StateError::Io {
                what: "cannot create",
                path: path.clone(),
                source,
            })?;
        f.write_all(hex.as_bytes())
            .map_err(|source| StateError::Io {
                what: "cannot write",
                path,
                source,
            })
    }

    /// Path of the coordinator's log.
    pub fn coordinator_log(&self) -> PathBuf {
        self.dir.join(COORDINATOR_LOG_FILE)
    }

    /// Writes `job.json` atomically (a reader sees the old or the new one).
    pub fn write_job(&self, state: &JobState) -> Result<(), StateError> {
        write_job_state(&self.dir, state)
    }

    /// Removes the run-time files (pid, addresses, secret, socket), keeping `job.json` and the
    /// coordinator log, and releases the lock.
    pub fn release(mut self) {
        self.cleanup();
    }

    fn cleanup(&mut self) {
        if self.locked {
            self.remove_file(COORDINATOR_ADDR_FILE);
            self.remove_file(CONTROL_ADDR_FILE);
            self.remove_file(METRICS_ADDR_FILE);
            self.remove_file(SECRET_FILE);
            self.remove_file(LAUNCHER_SOCKET_FILE);
            self.remove_file(LAUNCHER_PID_FILE);
            self.locked = false;
        }
    }

    /// Removes what the job's processes wrote (addresses, the secret):
    /// files of an earlier run, or of the incarnation a restart replaces,
    /// would mislead; the launcher waits for a fresh coordinator.addr.
    pub fn forget_processes(&self) {
        self.remove_file(COORDINATOR_ADDR_FILE);
        self.remove_file(CONTROL_ADDR_FILE);
        self.remove_file(METRICS_ADDR_FILE);
        self.remove_file(SECRET_FILE);
    }

    fn remove_file(&self, name: &str) {
        let path = self.dir.join(name);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => tracing::warn!(path = %path.display(), %err, "cannot remove"),
        }
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        self.cleanup();
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Reads `job.json` from a state directory.
pub fn read_job_state(dir: &Path) -> Result<JobState, StateError> {
    let path = dir.join(JOB_FILE);
    let text = fs::read_to_string(&path).map_err(|source| StateError::Io {
        what: "cannot read",
        path: path.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| StateError::Corrupt { path, source })
}

/// Writes `job.json` into `dir` atomically (temporary file, then rename).
pub fn write_job_state(dir: &Path, state: &JobState) -> Result<(), StateError> {
    let path = dir.join(JOB_FILE);
    let tmp = dir.join(format!(".{JOB_FILE}.{}.tmp", std::process::id()));
    let io_err = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| StateError::Io { what, path, source }
    };
    let mut text = serde_json::to_string_pretty(state).expect("JobState always serializes");
    text.push('\n');
    fs::write(&tmp, text).map_err(io_err("cannot write", &tmp))?;
    fs::rename(&tmp, &path).map_err(io_err("cannot rename into place", &path))
}

/// Milliseconds since the Unix epoch, for the records.
pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What `job.json` holds: enough for later commands to find, inspect and stop
/// a job, and, once it ended, how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobState {
    /// Layout version ([`JOB_STATE_FORMAT`]).
    pub format: u32,
    /// The job name.
    pub job: String,
    /// The state directory.
    pub state_dir: PathBuf,
    /// Pid of the `ductile run` that launched and supervises the job.
    pub launcher_pid: u32,
    /// The coordinator, once started.
    pub coordinator: Option<CoordinatorRecord>,
    /// The launch nodes, in launch index order.
    pub nodes: Vec<NodeRecord>,
    /// Newcomers the launcher started while the job ran (`ductile expand`,
    /// `ductile rescale --add`), in start order: every one still running,
    /// and the last [`NEWCOMER_RECORDS`] that ended (older ones are only
    /// counted, in `newcomer_counts`). `number` is "newcomer k" in the
    /// launcher's messages. Absent in older records.
    #[serde(default)]
    pub newcomers: Vec<NewcomerRecord>,
    /// Every newcomer of the job, counted, including those whose record
    /// was let go. Absent in older records.
    #[serde(default)]
    pub newcomer_counts: NewcomerCounts,
    /// Attempts at restarting the coordinator after it was lost while the
    /// job ran, in order; `coordinator` names the one running now. Absent
    /// in older records.
    #[serde(default)]
    pub coordinator_restarts: Vec<CoordinatorRestartRecord>,
    /// The shape the job was launched with.
    pub shape: Shape,
    /// Transport name handed to the nodes.
    pub transport: String,
    /// Address the nodes bind.
    pub bind: String,
    /// The program and its arguments (lossily converted to UTF-8).
    pub program: Vec<String>,
    /// When the launch began, ms since the Unix epoch.
    pub launched_at_unix_ms: u64,
    /// When the job ended, ms since the Unix epoch.
    pub finished_at_unix_ms: Option<u64>,
    /// How the job ended; `None` while it runs.
    pub outcome: Option<Outcome>,
}

/// The job's coordinator process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorRecord {
    /// Its pid (and process group).
    pub pid: u32,
    /// The address it listens on, `host:port`.
    pub addr: String,
}

/// One attempt at restarting a job's coordinator (in recovery mode, on the
/// same address).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorRestartRecord {
    /// When the attempt was made, ms since the Unix epoch.
    pub at_unix_ms: u64,
    /// The pid of the coordinator that was lost.
    pub previous_pid: u32,
    /// How it ended (`was killed by signal 9 (SIGKILL)`).
    pub previous_exit: String,
    /// The new coordinator's pid, when the attempt succeeded.
    pub pid: Option<u32>,
    /// Why the attempt failed, when it did.
    pub error: Option<String>,
}

/// One node process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Launch index (`DUCTILE_LAUNCH_INDEX`).
    pub index: u32,
    /// Its pid (and process group).
    pub pid: u32,
    /// PEs it runs.
    pub pes: u32,
}

/// How many records of newcomers that ended `job.json` keeps: a job
/// rescaled for weeks keeps a bounded record (plus [`NewcomerCounts`]).
pub const NEWCOMER_RECORDS: usize = 64;

/// Counts over every newcomer of a job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewcomerCounts {
    /// Newcomers started.
    pub started: u64,
    /// Of those, admitted by a rescale.
    pub admitted: u64,
    /// Of those, ended surely never admitted.
    pub dropped: u64,
    /// Of those, ended (any way).
    pub ended: u64,
}

impl JobState {
    /// The record of newcomer `number`, if it is kept.
    pub fn newcomer_mut(&mut self, number: usize) -> Option<&mut NewcomerRecord> {
        self.newcomers.iter_mut().find(|r| r.number == number)
    }

    /// Lets go of the oldest records of newcomers that ended and whose
    /// judgement is final (`settled(number)`), beyond the last
    /// [`NEWCOMER_RECORDS`] such; running ones are always kept. Whether
    /// any record went.
    pub fn trim_newcomers(&mut self, settled: impl Fn(usize) -> bool) -> bool {
        let done = |r: &NewcomerRecord| r.exit.is_some() && settled(r.number);
        let mut excess = self
            .newcomers
            .iter()
            .filter(|r| done(r))
            .count()
            .saturating_sub(NEWCOMER_RECORDS);
        if excess == 0 {
            return false;
        }
        self.newcomers.retain(|r| {
            if excess > 0 && done(r) {
                excess -= 1;
                false
            } else {
                true
            }
        });
        true
    }
}

/// One newcomer process the launcher started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewcomerRecord {
    /// Its number: "newcomer k" in the launcher's messages, in start order
    /// from 0. Absent in older records (then its place in the list).
    #[serde(default)]
    pub number: usize,
    /// Its pid (and process group).
    pub pid: u32,
    /// PEs it runs.
    pub pes: u32,
    /// When it was started, ms since the Unix epoch.
    pub started_at_unix_ms: u64,
    /// Whether the launcher has seen it as a member of the job's view (a
    /// rescale admitted it). A member that later left keeps `true`.
    pub admitted: bool,
    /// Whether it ended surely never admitted (the launcher followed every
    /// view since it started): dropped, not a failure.
    pub dropped: bool,
    /// How it ended (`exited with code 0`, `was killed by signal 15
    /// (SIGTERM)`), once it did.
    pub exit: Option<String>,
}

impl NewcomerRecord {
    /// Where it stands, in words: `waiting`, `admitted`, `gone: exited with
    /// code 0` (a member that left, or one whose admission the launcher could
    /// not see), `dropped: exited with code 3 before admission`.
    pub fn describe(&self) -> String {
        match (&self.exit, self.admitted) {
            (None, false) => "waiting".to_owned(),
            (None, true) => "admitted".to_owned(),
            (Some(exit), _) if self.dropped => format!("dropped: {exit} before admission"),
            (Some(exit), _) => format!("gone: {exit}"),
        }
    }
}

/// A job's shape: nodes x PEs per node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// Number of nodes (processes).
    pub nodes: u32,
    /// PEs (scheduler threads) per node.
    pub pes_per_node: u32,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The kind of ending.
    pub result: JobResult,
    /// The exit code `ductile run` returned.
    pub exit_code: i32,
    /// What was said to the user (empty on a clean completion).
    pub message: String,
    /// Seconds from launch to the end.
    pub elapsed_s: f64,
}

/// The kinds of job endings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobResult {
    /// The nodes passed the shutdown barrier and exited; `exit_code` is theirs.
    Completed,
    /// A node or the coordinator failed; the job was stopped.
    Failed,
    /// The `--timeout` wall-clock limit was reached; the job was stopped.
    TimedOut,
    /// The launcher was told to stop (SIGINT/SIGTERM); the job was stopped.
    Interrupted,
    /// The job never started: a program, coordinator or node could not be started.
    LaunchFailed,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn explicit_state_dir_wins() {
        let dir = resolve_state_dir(Some(Path::new("/x/y")), "j", env(&[(ENV_STATE_DIR, "/r")]));
        assert_eq!(dir.unwrap(), PathBuf::from("/x/y"));
    }

    #[test]
    fn state_dir_root_precedence() {
        let all = [
            (ENV_STATE_DIR, "/d"),
            ("XDG_STATE_HOME", "/xdg"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(
            resolve_state_dir(None, "j", env(&all)).unwrap(),
            PathBuf::from("/d/j")
        );
        assert_eq!(
            resolve_state_dir(None, "j", env(&all[1..])).unwrap(),
            PathBuf::from("/xdg/ductile/j")
        );
        assert_eq!(
            resolve_state_dir(None, "j", env(&all[2..])).unwrap(),
            PathBuf::from("/home/u/.local/state/ductile/j")
        );
        // Empty values count as unset, as in the XDG spec.
        assert_eq!(
            resolve_state_dir(None, "j", env(&[(ENV_STATE_DIR, ""), ("HOME", "/h")])).unwrap(),
            PathBuf::from("/h/.local/state/ductile/j")
        );
        assert!(matches!(
            resolve_state_dir(None, "j", env(&[])),
            Err(StateError::NoStateRoot)
        ));
    }

    #[test]
    fn job_names_are_checked() {
        for good in ["default", "jacobi-2d", "a.b_c", "X9"] {
            validate_job_name(good).unwrap();
        }
        for bad in ["", ".", "..", "../x", "a/b", "-x", "a b", &"x".repeat(64)] {
            assert!(validate_job_name(bad).is_err(), "{bad:?} accepted");
        }
        assert!(resolve_state_dir(Some(Path::new("/x")), "../etc", env(&[])).is_err());
    }

    #[test]
    fn a_state_directory_too_long_for_the_launcher_socket_is_refused_before_anything_is_created() {
        let tmp = tempfile::tempdir().unwrap();
        let long = tmp.path().join("d".repeat(120));
        match StateDir::lock(&long) {
            Err(err @ StateError::PathTooLong { .. }) => {
                assert!(err.to_string().contains("shorter --state-dir"), "{err}")
            }
            other => panic!("expected PathTooLong, got {other:?}"),
        }
        assert!(!long.exists(), "nothing is created for a refused directory");
        let fits = tmp.path().join("job");
        assert!(StateDir::lock(&fits).is_ok());
    }

    #[test]
    fn lock_refuses_a_live_launcher_and_takes_over_a_stale_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("job");
        let held = StateDir::lock(&dir).unwrap();
        let pid: u32 = fs::read_to_string(dir.join(LAUNCHER_PID_FILE))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(pid, std::process::id());
        drop(held);
        assert!(!dir.join(LAUNCHER_PID_FILE).exists());

        // A live process that is not us: our parent (the test harness or cargo).
        let live = nix::unistd::getppid().as_raw() as u32;
        fs::write(dir.join(LAUNCHER_PID_FILE), format!("{live}\n")).unwrap();
        match StateDir::lock(&dir) {
            Err(err @ StateError::Busy { .. }) => {
                let msg = err.to_string();
                assert!(msg.contains(&live.to_string()), "{msg}");
                assert!(msg.contains("in use"), "{msg}");
            }
            other => panic!("expected Busy, got {other:?}"),
        }

        // A pid that cannot be alive, and garbage: both are stale.
        for stale in ["4194304999\n", "not a pid"] {
            fs::write(dir.join(LAUNCHER_PID_FILE), stale).unwrap();
            fs::write(dir.join(COORDINATOR_ADDR_FILE), "127.0.0.1:1").unwrap();
            let held = StateDir::lock(&dir).unwrap();
            assert!(
                !dir.join(COORDINATOR_ADDR_FILE).exists(),
                "stale addr file kept"
            );
            held.release();
        }
    }

    #[test]
    fn job_state_round_trips() {
        let tmp = tempfile::tempdir().unwrap();
        let state = JobState {
            format: JOB_STATE_FORMAT,
            job: "j".into(),
            state_dir: tmp.path().to_path_buf(),
            launcher_pid: 1,
            coordinator: Some(CoordinatorRecord {
                pid: 2,
                addr: "127.0.0.1:9".into(),
            }),
            nodes: vec![NodeRecord {
                index: 0,
                pid: 3,
                pes: 2,
            }],
            newcomers: vec![NewcomerRecord {
                number: 0,
                pid: 4,
                pes: 2,
                started_at_unix_ms: 7,
                admitted: true,
                dropped: false,
                exit: Some("exited with code 0".into()),
            }],
            newcomer_counts: NewcomerCounts {
                started: 1,
                admitted: 1,
                dropped: 0,
                ended: 1,
            },
            coordinator_restarts: vec![CoordinatorRestartRecord {
                at_unix_ms: 8,
                previous_pid: 2,
                previous_exit: "was killed by signal 9 (SIGKILL)".into(),
                pid: Some(9),
                error: None,
            }],
            shape: Shape {
                nodes: 1,
                pes_per_node: 2,
            },
            transport: "tcp".into(),
            bind: "127.0.0.1".into(),
            program: vec!["prog".into(), "--x".into()],
            launched_at_unix_ms: 5,
            finished_at_unix_ms: Some(6),
            outcome: Some(Outcome {
                result: JobResult::Failed,
                exit_code: 1,
                message: "m".into(),
                elapsed_s: 0.5,
            }),
        };
        write_job_state(tmp.path(), &state).unwrap();
        assert_eq!(read_job_state(tmp.path()).unwrap(), state);
        let text = fs::read_to_string(tmp.path().join(JOB_FILE)).unwrap();
        assert!(text.contains("\"result\": \"failed\""), "{text}");

        // A record written before newcomers existed still reads, with none.
        let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
        old.as_object_mut().unwrap().remove("newcomers");
        old.as_object_mut().unwrap().remove("coordinator_restarts");
        fs::write(tmp.path().join(JOB_FILE), old.to_string()).unwrap();
        let old = read_job_state(tmp.path()).unwrap();
        assert!(old.newcomers.is_empty());
        assert!(old.coordinator_restarts.is_empty());
    }

    #[test]
    fn a_newcomer_is_described_by_admission_and_exit() {
        let mut n = NewcomerRecord {
            number: 0,
            pid: 1,
            pes: 1,
            started_at_unix_ms: 0,
            admitted: false,
            dropped: false,
            exit: None,
        };
        assert_eq!(n.describe(), "waiting");
        n.exit = Some("exited with code 0".into());
        assert_eq!(
            n.describe(),
            "gone: exited with code 0",
            "admission unknown"
        );
        n.dropped = true;
        assert_eq!(n.describe(), "dropped: exited with code 0 before admission");
        n.dropped = false;
        n.admitted = true;
        assert_eq!(n.describe(), "gone: exited with code 0");
        n.exit = None;
        assert_eq!(n.describe(), "admitted");
    }

    /// Issue 15, item 6: a job that started thousands of newcomers keeps the
    /// running ones and the last [`NEWCOMER_RECORDS`] that ended, and counts
    /// them all; a record whose judgement is not final stays.
    #[test]
    fn the_newcomer_record_is_a_bounded_ring_plus_counts() {
        let record = |number: usize, ended: bool| NewcomerRecord {
            number,
            pid: 1000 + number as u32,
            pes: 1,
            started_at_unix_ms: 0,
            admitted: true,
            dropped: false,
            exit: ended.then(|| "exited with code 0".to_owned()),
        };
        let mut state: JobState = serde_json::from_value(serde_json::json!({
            "format": JOB_STATE_FORMAT, "job": "j", "state_dir": "/tmp/x", "launcher_pid": 1,
            "coordinator": null, "nodes": [], "shape": {"nodes": 1, "pes_per_node": 1},
            "transport": "tcp", "bind": "127.0.0.1", "program": ["p"],
            "launched_at_unix_ms": 0, "finished_at_unix_ms": null, "outcome": null
        }))
        .unwrap();
        // Newcomer 0 runs for ever (a member); 1 ended but is not judged yet.
        state.newcomers.push(record(0, false));
        state.newcomers.push(record(1, true));
        let mut sizes = Vec::new();
        for n in 2..5_000 {
            state.newcomers.push(record(n, true));
            state.newcomer_counts.started += 1;
            state.trim_newcomers(|k| k != 1);
            sizes.push(serde_json::to_vec(&state).unwrap().len());
        }
        assert_eq!(state.newcomers.len(), NEWCOMER_RECORDS + 2);
        assert_eq!(state.newcomers[0].number, 0, "running: kept");
        assert_eq!(state.newcomers[1].number, 1, "not settled: kept");
        assert_eq!(state.newcomers[2].number, 5_000 - NEWCOMER_RECORDS);
        assert!(state.newcomer_mut(4_999).is_some());
        assert!(state.newcomer_mut(500).is_none());
        assert_eq!(state.newcomer_counts.started, 4_998);
        // The file stops growing once the ring is full: from newcomer 1,200
        // on (numbers and pids of four digits) only the counters' digits
        // could add bytes.
        let (full, last) = (sizes[1_200], sizes[sizes.len() - 1]);
        assert!(last <= full + 4, "job.json grew from {full} to {last} bytes");
    }
}
