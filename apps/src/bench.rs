//! What the benchmark programs (`bench_core`, `bench_lb`, `bench_rescale`)
//! share: running a child job under `ductile run` with a time limit (and
//! timing it), medians, parsing `key=value` output, and describing the
//! machine the numbers came from.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use serde_json::{json, Value};

/// Median, minimum and maximum of some samples.
#[derive(Clone, Copy)]
pub struct Stats {
    /// Median.
    pub median: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
}

/// Median, minimum and maximum (NaN for no samples).
pub fn stats(samples: &[f64]) -> Stats {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    Stats {
        median,
        min: s.first().copied().unwrap_or(f64::NAN),
        max: s.last().copied().unwrap_or(f64::NAN),
    }
}

/// The samples and their statistics, as JSON.
pub fn stats_json(samples: &[f64]) -> Value {
    let st = stats(samples);
    json!({ "samples": samples, "median": st.median, "min": st.min, "max": st.max })
}

/// The median.
pub fn median(samples: &[f64]) -> f64 {
    stats(samples).median
}

// ---------------------------------------------------------------- child runs

/// How child jobs are run.
pub struct Env {
    /// The `ductile` launcher.
    pub ductile: PathBuf,
    /// Parent of every child job's state directory.
    pub state_base: PathBuf,
    /// Each child job's `--timeout`.
    pub timeout_s: u64,
    /// Child jobs started so far.
    pub runs: usize,
    /// Prefix of the child jobs' names (the benchmark's name).
    pub prefix: &'static str,
}

/// Output of a child job that exited 0.
pub struct ChildOut {
    /// Everything the job printed on stdout.
    pub stdout: String,
    /// From spawning the launcher to seeing it exit, to within the poll
    /// interval ([`Env::run_timed`] polls every millisecond).
    pub wall: Duration,
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

impl Env {
    /// A fresh job name and its state directory, for a job run by hand.
    pub fn next_job(&mut self, tag: &str) -> (String, PathBuf) {
        self.runs += 1;
        let job = format!("{}-{}-{tag}-{}", self.prefix, std::process::id(), self.runs);
        // Short: the job's `launcher.sock` lives there, and `ductile run`
        // refuses a directory whose socket path would not fit in 107 bytes.
        let state_dir = self.state_base.join(format!("j{}", self.runs));
        (job, state_dir)
    }

    /// Runs `program args` as a job of `nodes x pes` under the launcher, with a
    /// wall-clock limit; a failure is an error carrying the child's output tails.
    pub fn run(
        &mut self,
        tag: &str,
        nodes: u32,
        pes: u32,
        program: &Path,
        prog_args: &[String],
    ) -> Result<ChildOut> {
        self.run_with_env(tag, nodes, pes, program, prog_args, &[])
    }

    /// As [`Env::run`], with environment changes for the launcher and its
    /// nodes: `(name, Some(value))` sets a variable, `(name, None)` removes it.
    pub fn run_with_env(
        &mut self,
        tag: &str,
        nodes: u32,
        pes: u32,
        program: &Path,
        prog_args: &[String],
        vars: &[(&str, Option<&str>)],
    ) -> Result<ChildOut> {
        self.run_polled(
            tag,
            (nodes, pes),
            program,
            prog_args,
            vars,
            Duration::from_millis(20),
        )
    }

    /// As [`Env::run`], but watches the launcher every millisecond, so that
    /// [`ChildOut::wall`] times the whole job to about a millisecond.
    pub fn run_timed(
        &mut self,
        tag: &str,
        nodes: u32,
        pes: u32,
        program: &Path,
        prog_args: &[String],
    ) -> Result<ChildOut> {
        self.run_polled(
            tag,
            (nodes, pes),
            program,
            prog_args,
            &[],
            Duration::from_millis(1),
        )
    }

    /// `shape`: (nodes, PEs per node).
    fn run_polled(
        &mut self,
        tag: &str,
        (nodes, pes): (u32, u32),
        program: &Path,
        prog_args: &[String],
        vars: &[(&str, Option<&str>)],
        poll: Duration,
    ) -> Result<ChildOut> {
        let (job, state_dir) = self.next_job(tag);
        let mut cmd = Command::new(&self.ductile);
        for (name, value) in vars {
            match value {
                Some(v) => cmd.env(name, v),
                None => cmd.env_remove(name),
            };
        }
        cmd.arg("run")
            .args([
                "--nodes",
                &nodes.to_string(),
                "--pes-per-node",
                &pes.to_string(),
            ])
            .args(["--job", &job])
            .arg("--state-dir")
            .arg(&state_dir)
            .args(["--timeout", &self.timeout_s.to_string()])
            .arg("--")
            .arg(program)
            .args(prog_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let shown = format!("{cmd:?}");
        let spawned = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", self.ductile.display()))?;
        let mut out_pipe = child.stdout.take().expect("piped stdout");
        let mut err_pipe = child.stderr.take().expect("piped stderr");
        let out_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out_pipe.read_to_string(&mut s);
            s
        });
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err_pipe.read_to_string(&mut s);
            s
        });
        // The launcher enforces --timeout; this is only a backstop in case it hangs itself.
        let deadline = Instant::now() + Duration::from_secs(self.timeout_s + 30);
        let status = loop {
            if let Some(st) = child.try_wait()? {
                break Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(poll);
        };
        let wall = spawned.elapsed();
        let stdout = out_reader.join().unwrap_or_default();
        let stderr = err_reader.join().unwrap_or_default();
        match status {
            Some(st) if st.success() => Ok(ChildOut { stdout, wall }),
            other => {
                let why = match other {
                    Some(st) => format!("exited with {st}"),
                    None => format!(
                        "did not finish within {} s and was killed",
                        self.timeout_s + 30
                    ),
                };
                Err(anyhow!(
                    "child run `{tag}` {why}\n  command: {shown}\n  --- stderr (tail) ---\n{}\n  --- stdout (tail) ---\n{}",
                    tail(&stderr, 30),
                    tail(&stdout, 10)
                ))
            }
        }
    }
}

/// `key=value` fields of a line.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// Field `key` of `line`, as a number.
pub fn num(line: &str, key: &str) -> Result<f64> {
    let v = field(line, key).ok_or_else(|| anyhow!("no `{key}=` in `{line}`"))?;
    v.parse()
        .map_err(|_| anyhow!("bad `{key}={v}` in `{line}`"))
}

/// The CPU model, from /proc/cpuinfo.
pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// Total memory in KiB, from /proc/meminfo.
pub fn mem_total_kib() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("MemTotal:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The 1-, 5- and 15-minute load averages: how busy the (shared) machine was.
pub fn loadavg() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The git commit checked out at `root`.
pub fn git_commit(root: &Path) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether the checkout at `root` has uncommitted changes to tracked files.
pub fn git_dirty(root: &Path) -> Option<bool> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()?;
    out.status.success().then_some(!out.stdout.is_empty())
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the epoch (proleptic Gregorian, UTC).
pub fn utc_date(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// A target's verdict as text.
pub fn pass_str(p: Option<bool>) -> &'static str {
    match p {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "skipped",
    }
}

// ------------------------------------------------------------- the sitting

/// One sitting of a benchmark: where its programs are and its JSON goes,
/// when it began, on what machine under what load, from which commit, and
/// a directory for its child jobs' state. Every benchmark's JSON starts with
/// the same header ([`Sitting::write_json`]).
pub struct Sitting {
    /// The benchmark's name (`bench_core`).
    pub bench: &'static str,
    /// Where this benchmark's binary and its sibling programs are.
    pub bin_dir: PathBuf,
    /// The cargo target directory above it.
    pub target_dir: PathBuf,
    /// The JSON result's path.
    pub out_path: PathBuf,
    /// Seconds since the epoch at the start.
    pub unix_time: u64,
    /// The start as `YYYY-MM-DDTHH:MM:SSZ`.
    pub date: String,
    /// Cores this process may use.
    pub nproc: usize,
    /// The CPU's model name.
    pub cpu_model: Option<String>,
    /// The load average at the start.
    pub load_start: Option<String>,
    /// A fresh directory for child jobs' state, short enough for the Unix
    /// socket a job keeps in its state directory (107 bytes in all).
    pub state_base: PathBuf,
}

impl Sitting {
    /// Begins a sitting of `bench`, whose JSON goes to `out` or else to
    /// `target/bench/{json_name}`.
    pub fn begin(bench: &'static str, json_name: &str, out: Option<PathBuf>) -> Result<Sitting> {
        let (bin_dir, target_dir) = bin_and_target_dirs()?;
        let unix_time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let state_base = std::env::temp_dir().join(format!(
            "ductile-{}-{}-{unix_time}",
            bench.trim_start_matches("bench_"),
            std::process::id()
        ));
        std::fs::create_dir_all(&state_base)
            .with_context(|| format!("cannot create {}", state_base.display()))?;
        Ok(Sitting {
            bench,
            out_path: out.unwrap_or_else(|| target_dir.join("bench").join(json_name)),
            bin_dir,
            target_dir,
            unix_time,
            date: utc_date(unix_time),
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model: cpu_model(),
            load_start: loadavg(),
            state_base,
        })
    }

    /// Program `name`, built next to this benchmark; the error says how to
    /// build it (`build`).
    pub fn program(&self, name: &str, build: &str) -> Result<PathBuf> {
        sibling(&self.bin_dir, name, self.bench, build)
    }

    /// The commit the binaries came from and whether the checkout had
    /// changes: the checkout above the target directory, else the one the
    /// benchmark runs in.
    pub fn sources(&self) -> (Option<String>, Option<bool>) {
        let root = self
            .target_dir
            .parent()
            .filter(|p| git_commit(p).is_some())
            .map(Path::to_path_buf)
            .or_else(|| std::env::current_dir().ok())
            .unwrap_or_default();
        (git_commit(&root), git_dirty(&root))
    }

    /// The command line this sitting was started with.
    pub fn command(&self) -> String {
        std::iter::once(self.bench.to_string())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Writes `body` (a JSON object) behind the sitting's header
    /// (benchmark, date, command, commit, machine and load at start and
    /// now) to [`Sitting::out_path`], and says where.
    pub fn write_json(&self, body: Value) -> Result<()> {
        let (commit, dirty) = self.sources();
        let mut doc = json!({
            "benchmark": self.bench,
            "date_utc": self.date,
            "unix_time": self.unix_time,
            "command": self.command(),
            "git_commit": commit,
            "git_dirty": dirty,
            "machine": {
                "nproc": self.nproc, "cpu_model": self.cpu_model,
                "mem_total_kib": mem_total_kib(),
                "loadavg_start": self.load_start, "loadavg_end": loadavg(),
            },
        });
        if let (Some(doc), Value::Object(body)) = (doc.as_object_mut(), body) {
            doc.extend(body);
        }
        if let Some(dir) = self.out_path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(&self.out_path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("cannot write {}", self.out_path.display()))?;
        println!("\nJSON: {}", self.out_path.display());
        Ok(())
    }
}

/// The directory holding this benchmark's binary, and the cargo target
/// directory above it (where results go, under `bench/`).
pub fn bin_and_target_dirs() -> Result<(PathBuf, PathBuf)> {
    let exe = std::env::current_exe().context("cannot locate the current executable")?;
    let bin_dir = exe
        .parent()
        .ok_or_else(|| anyhow!("executable has no parent directory"))?
        .to_path_buf();
    let target_dir = bin_dir
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", bin_dir.display()))?
        .to_path_buf();
    Ok((bin_dir, target_dir))
}

/// Program `name`, built next to benchmark `bench`; the error says how to build it.
pub fn sibling(bin_dir: &Path, name: &str, bench: &str, build: &str) -> Result<PathBuf> {
    let p = bin_dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(anyhow!(
            "{} not found next to {bench}; build it with `{build}`",
            p.display()
        ))
    }
}
