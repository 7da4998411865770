//! `bench_soak`: many rescales of random kinds against one running job,
//! watching every long-lived process for growth (issue 15).
//!
//! ```text
//! bench_soak [--nodes N] [--rescales R] [--min-nodes A] [--max-nodes B] [--seed S]
//!            [--grid G] [--block B] [--seconds-per-rescale T] [--sample-every K]
//!            [--rss-tolerance-kb X] [--quick] [--child-timeout SECS] [--out PATH]
//! ```
//!
//! It starts `jacobi2d` on `N` nodes under the sibling `ductile run` (sized
//! by a short calibration job to compute for about `R x T` seconds), then
//! asks for `R` rescales one after the other, each of a kind drawn at random
//! (seeded) among those the job's size allows: `expand` (one newcomer),
//! `shrink` (a random node other than 0 leaves) and `replace` (`rescale
//! --remove k --add 1`), the size kept within `A..=B`. Every `K` rescales
//! (and before the first, after the last) it samples the resident set
//! (`VmRSS`), open descriptors and threads of the coordinator, the launcher
//! and every member (`/proc/PID/...`). Once the job ends by itself, its
//! checksum is compared with a 1-node run of the same problem.
//!
//! For each process that lived through at least half of the samples it
//! fits a least-squares slope per rescale to RSS, descriptors and threads
//! (the first 10% of the samples left out as warm-up) and gives a verdict:
//! growth when the RSS slope is above `--rss-tolerance-kb` KB per rescale or
//! descriptors or threads grow by more than one per 200 rescales. Below 200
//! rescales no verdict is given (a slope over a few samples says nothing).
//!
//! It prints a table and writes the curves (every sample), the slopes, the
//! verdicts, each rescale's kind, epoch and time, and the machine's load
//! before and after to `target/bench/soak.json` (or `--out`). Exit 1 when a
//! rescale fails or the job fails, 3 when the checksum differs, 4 when a
//! process grows; timings never decide the exit code.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use ductile_apps::args;
use ductile_apps::bench::*;
use serde_json::{json, Value};

const BUILD: &str =
    "cargo build --release -p ductile-apps --bin bench_soak --bin jacobi2d -p ductile-operator --bin ductile";

/// Iterations of the calibration job (a tenth with `--quick`).
const CALIBRATION_ITERS: u64 = 20_000;
/// `--timeout` of each `ductile expand/shrink/rescale/status`.
const TOOL_TIMEOUT_S: u64 = 60;
/// Samples left out of the slopes as warm-up (a fraction).
const WARMUP: f64 = 0.1;
/// Most growth of descriptors or threads per rescale that is not growth
/// (one per 200 rescales).
const COUNT_TOLERANCE: f64 = 1.0 / 200.0;
/// Fewest rescales a verdict is given for.
const VERDICT_MIN_RESCALES: usize = 200;

/// The command line (`bench_soak --help`).
#[derive(clap::Parser, Debug)]
#[command(
    name = "bench_soak",
    about = "Many rescales of random kinds against one running Jacobi2D job; RSS, descriptors and threads of every long-lived process, with a verdict on growth; writes target/bench/soak.json"
)]
struct Cli {
    #[command(flatten)]
    bench: args::BenchArgs,
    /// Nodes the job starts with (1 PE each).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=32))]
    nodes: u32,
    /// Rescales to do [default: 1000, or 20 with --quick].
    #[arg(long, value_name = "R", value_parser = args::at_least_one::<usize>)]
    rescales: Option<usize>,
    /// The fewest nodes a shrink may leave (at least 2: node 0 and one more).
    #[arg(long = "min-nodes", value_name = "A", default_value_t = 2, value_parser = clap::value_parser!(u32).range(2..=32))]
    min_nodes: u32,
    /// The most nodes an expand may make [default: --nodes + 2].
    #[arg(long = "max-nodes", value_name = "B", value_parser = clap::value_parser!(u32).range(2..=32))]
    max_nodes: Option<u32>,
    /// Seed of the random kinds and nodes.
    #[arg(long, value_name = "S", default_value_t = 1)]
    seed: u64,
    /// Jacobi2D grid side in points.
    #[arg(long, value_name = "G", default_value_t = 64, value_parser = args::at_least_one::<u32>)]
    grid: u32,
    /// Jacobi2D block side in points (at least as many blocks as --max-nodes).
    #[arg(long, value_name = "B", default_value_t = 16, value_parser = args::at_least_one::<u32>)]
    block: u32,
    /// Seconds of computing the job is sized for, per rescale (the job must
    /// outlive the rescales; it is not stopped early).
    #[arg(long = "seconds-per-rescale", value_name = "T", default_value_t = 0.6)]
    seconds_per_rescale: f64,
    /// Sample the processes every K rescales.
    #[arg(long = "sample-every", value_name = "K", default_value_t = 1, value_parser = args::at_least_one::<usize>)]
    sample_every: usize,
    /// Most RSS growth per rescale, in KB, that is not growth.
    #[arg(long = "rss-tolerance-kb", value_name = "X", default_value_t = 0.25)]
    rss_tolerance_kb: f64,
}

struct Opts {
    nodes: u32,
    rescales: usize,
    min_nodes: u32,
    max_nodes: u32,
    seed: u64,
    grid: u32,
    block: u32,
    seconds_per_rescale: f64,
    sample_every: usize,
    rss_tolerance_kb: f64,
    child_timeout_s: Option<u64>,
    out: Option<PathBuf>,
    calibration_iters: u64,
}

impl Opts {
    fn from_cli(c: Cli) -> Result<Opts, String> {
        let max_nodes = c.max_nodes.unwrap_or(c.nodes + 2);
        if c.min_nodes > c.nodes || c.nodes > max_nodes {
            return Err(format!(
                "--min-nodes {} <= --nodes {} <= --max-nodes {max_nodes} does not hold",
                c.min_nodes, c.nodes
            ));
        }
        if c.block > c.grid {
            return Err("--block must be 1..=--grid".into());
        }
        let blocks = c.grid.div_ceil(c.block).pow(2);
        if blocks < max_nodes {
            return Err(format!(
                "--grid {} --block {} makes {blocks} blocks, fewer than --max-nodes {max_nodes}",
                c.grid, c.block
            ));
        }
        if !(c.seconds_per_rescale.is_finite() && c.seconds_per_rescale > 0.0) {
            return Err("--seconds-per-rescale must be above 0".into());
        }
        if !(c.rss_tolerance_kb.is_finite() && c.rss_tolerance_kb >= 0.0) {
            return Err("--rss-tolerance-kb must be 0 or more".into());
        }
        Ok(Opts {
            nodes: c.nodes,
            rescales: c.bench.pick(c.rescales, 20, 1000),
            min_nodes: c.min_nodes,
            max_nodes,
            seed: c.seed,
            grid: c.grid,
            block: c.block,
            seconds_per_rescale: c.seconds_per_rescale,
            sample_every: c.sample_every,
            rss_tolerance_kb: c.rss_tolerance_kb,
            child_timeout_s: c.bench.child_timeout_s,
            calibration_iters: c.bench.pick(None, CALIBRATION_ITERS / 10, CALIBRATION_ITERS),
            out: c.bench.out,
        })
    }

    fn problem(&self) -> Vec<String> {
        vec![
            "--grid".into(),
            self.grid.to_string(),
            "--block".into(),
            self.block.to_string(),
        ]
    }
}

/// A small seeded generator (SplitMix64): the same seed, the same soak.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The kinds of rescale.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Expand,
    Shrink,
    Replace,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Expand => "expand",
            Kind::Shrink => "shrink",
            Kind::Replace => "replace",
        }
    }
}

/// One process's resources at one moment.
#[derive(Clone, Copy, Debug)]
struct Usage {
    rss_kb: u64,
    fds: u64,
    threads: u64,
}

/// `/proc/PID`'s RSS, descriptors and threads; `None` once it is gone.
fn usage(pid: u64) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(Usage {
        rss_kb: field("VmRSS:")?,
        fds,
        threads: field("Threads:")?,
    })
}

/// A process watched through the soak, and its curve: (rescales done, usage).
struct Series {
    role: String,
    pid: u64,
    points: Vec<(usize, Usage)>,
}

/// Least-squares slope of `ys` over `xs` (0 with fewer than two points).
fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    if xs.len() < 2 {
        return 0.0;
    }
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (x, y) in xs.iter().zip(ys) {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
    }
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

/// What a series says about growth.
struct Growth {
    rss_kb_per_rescale: f64,
    fds_per_rescale: f64,
    threads_per_rescale: f64,
    first: Usage,
    last: Usage,
    /// `Some(true)`: no growth; `None`: too few rescales for a verdict.
    ok: Option<bool>,
}

fn growth(s: &Series, o: &Opts, verdict: bool) -> Growth {
    let skip = ((s.points.len() as f64) * WARMUP).floor() as usize;
    let kept = &s.points[skip.min(s.points.len().saturating_sub(2))..];
    let xs: Vec<f64> = kept.iter().map(|(x, _)| *x as f64).collect();
    let of = |f: fn(&Usage) -> u64| kept.iter().map(|(_, u)| f(u) as f64).collect::<Vec<_>>();
    let rss = slope(&xs, &of(|u| u.rss_kb));
    let fds = slope(&xs, &of(|u| u.fds));
    let threads = slope(&xs, &of(|u| u.threads));
    let ok = verdict.then(|| {
        rss <= o.rss_tolerance_kb && fds <= COUNT_TOLERANCE && threads <= COUNT_TOLERANCE
    });
    Growth {
        rss_kb_per_rescale: rss,
        fds_per_rescale: fds,
        threads_per_rescale: threads,
        first: s.points[0].1,
        last: s.points[s.points.len() - 1].1,
        ok,
    }
}

/// Runs `ductile ARGS --state-dir D --json --timeout T`: success, stdout, stderr, ms.
fn tool(ductile: &Path, state: &Path, cli: &[String]) -> Result<(bool, String, String, f64)> {
    let t = Instant::now();
    let out = Command::new(ductile)
        .args(cli)
        .arg("--state-dir")
        .arg(state)
        .args(["--json", "--timeout", &TOOL_TIMEOUT_S.to_string()])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {} {cli:?}", ductile.display()))?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t.elapsed().as_secs_f64() * 1e3,
    ))
}

/// The members' pids, in node order.
fn members(ductile: &Path, state: &Path) -> Result<Vec<u64>> {
    let (ok, out, err, _) = tool(ductile, state, &["status".into()])?;
    if !ok {
        bail!("ductile status failed: {err}");
    }
    let v: Value = serde_json::from_str(&out).context("ductile status printed no JSON")?;
    v["members"]
        .as_array()
        .ok_or_else(|| anyhow!("no members in {v}"))?
        .iter()
        .map(|m| m["pid"].as_u64().ok_or_else(|| anyhow!("a member without a pid: {m}")))
        .collect()
}

/// The soak job under `ductile run`; stopped when dropped.
struct SoakJob {
    child: Child,
    state: PathBuf,
    log: PathBuf,
    stdout: Option<std::thread::JoinHandle<String>>,
}

impl SoakJob {
    fn start(ductile: &Path, jacobi: &Path, state: &Path, log: &Path, nodes: u32, timeout_s: u64, args: &[String]) -> Result<SoakJob> {
        let err = std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
        let mut child = Command::new(ductile)
            .args(["run", "--nodes", &nodes.to_string(), "--pes-per-node", "1", "--job", "soak"])
            .arg("--state-dir")
            .arg(state)
            .args(["--timeout", &timeout_s.to_string(), "--"])
            .arg(jacobi)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .with_context(|| format!("cannot start {}", ductile.display()))?;
        let mut pipe = child.stdout.take().expect("piped stdout");
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut pipe, &mut s);
            s
        });
        let mut job = SoakJob {
            child,
            state: state.to_owned(),
            log: log.to_owned(),
            stdout: Some(stdout),
        };
        let end = Instant::now() + Duration::from_secs(60);
        while !state.join("control.addr").exists() {
            if job.child.try_wait()?.is_some() || Instant::now() > end {
                bail!("the soak job did not start\n{}", job.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(job)
    }

    fn log_tail(&self) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 30)
    }

    fn record(&self) -> Result<Value> {
        let text = std::fs::read_to_string(self.state.join("job.json")).context("job.json")?;
        serde_json::from_str(&text).context("job.json is not JSON")
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits (at most `limit`) for the job to end by itself: its stdout.
    fn finish(mut self, limit: Duration) -> Result<String> {
        let end = Instant::now() + limit;
        let status = loop {
            if let Some(st) = self.child.try_wait()? {
                break st;
            }
            if Instant::now() > end {
                bail!("the soak job did not end within {limit:?} after the rescales\n{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = self.log_tail();
        let stdout = self
            .stdout
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        if !status.success() {
            bail!("the soak job failed ({status})\n{log}\n{}", tail(&stdout, 5));
        }
        Ok(stdout)
    }
}

impl Drop for SoakJob {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
            let end = Instant::now() + Duration::from_secs(5);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn checksum(stdout: &str) -> Result<String> {
    stdout
        .lines()
        .find(|l| l.starts_with("checksum="))
        .and_then(|l| field(l, "checksum"))
        .map(str::to_string)
        .ok_or_else(|| anyhow!("jacobi2d printed no checksum line:\n{}", tail(stdout, 10)))
}

/// One rescale done.
struct Done {
    kind: Kind,
    epoch: u64,
    nodes: u32,
    total_ms: f64,
    command_ms: f64,
}

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bench_soak: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn real_main() -> Result<ExitCode> {
    let o = Opts::from_cli(<Cli as clap::Parser>::parse()).unwrap_or_else(|e| {
        <Cli as clap::CommandFactory>::command()
            .error(clap::error::ErrorKind::ArgumentConflict, e)
            .exit()
    });
    let (bin_dir, target_dir) = bin_and_target_dirs()?;
    let ductile = sibling(&bin_dir, "ductile", "bench_soak", BUILD)?;
    let jacobi = sibling(&bin_dir, "jacobi2d", "bench_soak", BUILD)?;
    let out_path = o.out.clone().unwrap_or_else(|| target_dir.join("bench").join("soak.json"));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let state_base = std::env::temp_dir().join(format!("ductile-soak-{}-{}", std::process::id(), now.as_secs()));
    std::fs::create_dir_all(&state_base).with_context(|| format!("cannot create {}", state_base.display()))?;
    let load_start = loadavg();
    let started = Instant::now();
    let mut env = Env {
        ductile: ductile.clone(),
        state_base: state_base.clone(),
        timeout_s: o.child_timeout_s.unwrap_or(600),
        runs: 0,
        prefix: "bench-soak",
    };

    // 1. Calibration: the computing time of an iteration at N nodes.
    let mut cal = o.problem();
    cal.extend(["--iters".into(), o.calibration_iters.to_string(), "--quiet".into()]);
    let out = env.run("calibration", o.nodes, 1, &jacobi, &cal)?;
    let line = out
        .stdout
        .lines()
        .find(|l| l.contains("time_per_iter_ms="))
        .ok_or_else(|| anyhow!("the calibration printed no time_per_iter_ms:\n{}", out.stdout))?;
    let ms_per_iter = num(line, "time_per_iter_ms")?.max(1e-4);
    let seconds = o.rescales as f64 * o.seconds_per_rescale;
    let iters = ((seconds * 1e3 / ms_per_iter) as u64).max(o.calibration_iters);
    let mut job_args = o.problem();
    job_args.extend(["--iters".into(), iters.to_string(), "--quiet".into()]);
    eprintln!(
        "bench_soak: {} rescales on {} nodes; job of {iters} iterations ({ms_per_iter:.4} ms each, about {seconds:.0} s of computing)",
        o.rescales, o.nodes
    );

    // 2. The soak job and its long-lived processes.
    let state = state_base.join("soak");
    let log = state_base.join("soak.log");
    let timeout_s = o.child_timeout_s.unwrap_or((seconds * 4.0) as u64 + 600);
    let mut job = SoakJob::start(&ductile, &jacobi, &state, &log, o.nodes, timeout_s, &job_args)?;
    let record = job.record()?;
    let coordinator = record["coordinator"]["pid"].as_u64().ok_or_else(|| anyhow!("no coordinator pid in job.json"))?;
    let launcher = record["launcher_pid"].as_u64().ok_or_else(|| anyhow!("no launcher pid in job.json"))?;
    let mut series: Vec<Series> = vec![
        Series { role: "coordinator".into(), pid: coordinator, points: vec![] },
        Series { role: "launcher".into(), pid: launcher, points: vec![] },
    ];
    let mut samples = 0usize;
    let mut sample = |series: &mut Vec<Series>, done: usize| -> Result<()> {
        samples += 1;
        let pids = members(&ductile, &state)?;
        for (i, pid) in pids.iter().enumerate() {
            if !series.iter().any(|s| s.pid == *pid) {
                let role = if i == 0 { "node 0".to_owned() } else { format!("node pid {pid}") };
                series.push(Series { role, pid: *pid, points: vec![] });
            }
        }
        for s in series.iter_mut() {
            let current = s.pid == coordinator || s.pid == launcher || pids.contains(&s.pid);
            if current {
                if let Some(u) = usage(s.pid) {
                    s.points.push((done, u));
                }
            }
        }
        Ok(())
    };

    // 3. The rescales.
    let mut rng = Rng(o.seed);
    let mut size = o.nodes;
    let mut done: Vec<Done> = Vec::new();
    let mut failure: Option<String> = None;
    let mut admitted = 0u64;
    sample(&mut series, 0)?;
    for i in 0..o.rescales {
        let mut kinds = vec![Kind::Replace];
        if size < o.max_nodes {
            kinds.push(Kind::Expand);
        }
        if size > o.min_nodes {
            kinds.push(Kind::Shrink);
        }
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let victim = (1 + rng.below(u64::from(size - 1))).to_string();
        let cli: Vec<String> = match kind {
            Kind::Expand => vec!["expand".into(), "--nodes".into(), "1".into()],
            Kind::Shrink => vec!["shrink".into(), "--remove".into(), victim],
            Kind::Replace => vec!["rescale".into(), "--remove".into(), victim, "--add".into(), "1".into()],
        };
        let (ok, out, err, command_ms) = tool(&ductile, &state, &cli)?;
        if !ok {
            failure = Some(format!(
                "rescale {} ({} {cli:?}) failed: {}\n  job log tail:\n{}",
                i + 1,
                kind.name(),
                err.trim(),
                job.log_tail()
            ));
            break;
        }
        let report: Value = serde_json::from_str(&out).with_context(|| format!("no JSON report from {cli:?}: {out}"))?;
        let pes = report["pes"].as_u64().ok_or_else(|| anyhow!("no pes in {report}"))? as u32;
        admitted += report["admitted"].as_array().map_or(0, |a| a.len() as u64);
        size = pes;
        done.push(Done {
            kind,
            epoch: report["epoch"].as_u64().unwrap_or(0),
            nodes: pes,
            total_ms: report["total_ms"].as_f64().unwrap_or(f64::NAN),
            command_ms,
        });
        if (i + 1) % o.sample_every == 0 || i + 1 == o.rescales {
            sample(&mut series, i + 1)?;
        }
        if !job.running() {
            failure = Some(format!("the job ended during the soak, after {} rescales (raise --seconds-per-rescale)\n{}", i + 1, job.log_tail()));
            break;
        }
        if (i + 1) % 100 == 0 {
            eprintln!("bench_soak: {} rescales, {size} nodes", i + 1);
        }
    }

    // 4. The job ends by itself; its result against a 1-node run.
    let mut job_sum = None;
    if failure.is_none() {
        match job.finish(Duration::from_secs(timeout_s)) {
            Ok(stdout) => job_sum = Some(checksum(&stdout)?),
            Err(e) => failure = Some(format!("{e:#}")),
        }
    } else {
        drop(job);
    }
    let reference = env.run("reference", 1, 1, &jacobi, &job_args)?;
    let reference = checksum(&reference.stdout)?;
    let equal = job_sum.as_ref().map(|s| *s == reference);
    let load_end = loadavg();

    // 5. Verdicts, table, JSON.
    let verdict_given = done.len() >= VERDICT_MIN_RESCALES;
    let total_samples = samples.max(1);
    let watched: Vec<(&Series, Growth)> = series
        .iter()
        .filter(|s| s.points.len() * 2 >= total_samples && s.points.len() >= 2)
        .map(|s| (s, growth(s, &o, verdict_given)))
        .collect();
    let grows = watched.iter().any(|(_, g)| g.ok == Some(false));
    let count = |k: Kind| done.iter().filter(|d| d.kind == k).count();
    let med = |k: Option<Kind>, f: fn(&Done) -> f64| {
        let v: Vec<f64> = done.iter().filter(|d| k.is_none_or(|k| d.kind == k)).map(f).filter(|x| x.is_finite()).collect();
        if v.is_empty() { f64::NAN } else { median(&v) }
    };
    let mut table = String::new();
    writeln!(
        table,
        "bench_soak: {} of {} rescales on a {}-node jacobi2d ({}x{} grid, {} blocks), seed {}: {} expand, {} shrink, {} replace; {} failed; {admitted} newcomers admitted; {:.0} s",
        done.len(),
        o.rescales,
        o.nodes,
        o.grid,
        o.grid,
        o.grid.div_ceil(o.block).pow(2),
        o.seed,
        count(Kind::Expand),
        count(Kind::Shrink),
        count(Kind::Replace),
        usize::from(failure.is_some()),
        started.elapsed().as_secs_f64()
    )?;
    writeln!(
        table,
        "rescale total_ms median: expand {:.1}, shrink {:.1}, replace {:.1}; command (CLI process included) {:.1} ms",
        med(Some(Kind::Expand), |d| d.total_ms),
        med(Some(Kind::Shrink), |d| d.total_ms),
        med(Some(Kind::Replace), |d| d.total_ms),
        med(None, |d| d.command_ms)
    )?;
    writeln!(
        table,
        "{:<16} {:>8} {:>7} {:>17} {:>11} {:>10} {:>9} {:>12} {:>9}  verdict",
        "process", "pid", "samples", "RSS KB first>last", "KB/rescale", "fds f>l", "fds/resc", "threads f>l", "thr/resc"
    )?;
    for (s, g) in &watched {
        writeln!(
            table,
            "{:<16} {:>8} {:>7} {:>17} {:>11.3} {:>10} {:>9.4} {:>12} {:>9.4}  {}",
            s.role,
            s.pid,
            s.points.len(),
            format!("{}>{}", g.first.rss_kb, g.last.rss_kb),
            g.rss_kb_per_rescale,
            format!("{}>{}", g.first.fds, g.last.fds),
            g.fds_per_rescale,
            format!("{}>{}", g.first.threads, g.last.threads),
            g.threads_per_rescale,
            match g.ok {
                Some(true) => "flat",
                Some(false) => "GROWS",
                None => "(too few rescales)",
            }
        )?;
    }
    writeln!(
        table,
        "checksum: job {} reference {} -> {}; load average {} at the start, {} at the end",
        job_sum.as_deref().unwrap_or("-"),
        reference,
        match equal {
            Some(true) => "equal",
            Some(false) => "DIFFERENT",
            None => "no result",
        },
        load_start.as_deref().unwrap_or("?"),
        load_end.as_deref().unwrap_or("?")
    )?;
    print!("{table}");
    if let Some(f) = &failure {
        eprintln!("bench_soak: FAILED: {f}");
    }

    let root = target_dir.parent().map(Path::to_path_buf).unwrap_or_default();
    let json = json!({
        "bench": "soak",
        "date": utc_date(now.as_secs()),
        "commit": git_commit(&root),
        "dirty": git_dirty(&root),
        "cpu": cpu_model(),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "mem_total_kib": mem_total_kib(),
        "load_start": load_start,
        "load_end": load_end,
        "options": {
            "nodes": o.nodes, "rescales": o.rescales, "min_nodes": o.min_nodes, "max_nodes": o.max_nodes,
            "seed": o.seed, "grid": o.grid, "block": o.block, "seconds_per_rescale": o.seconds_per_rescale,
            "sample_every": o.sample_every, "rss_tolerance_kb": o.rss_tolerance_kb,
            "count_tolerance_per_rescale": COUNT_TOLERANCE, "warmup": WARMUP,
        },
        "calibration_ms_per_iter": ms_per_iter,
        "job_args": job_args,
        "wall_s": started.elapsed().as_secs_f64(),
        "rescales_done": done.len(),
        "kinds": { "expand": count(Kind::Expand), "shrink": count(Kind::Shrink), "replace": count(Kind::Replace) },
        "failed": usize::from(failure.is_some()),
        "failure": failure,
        "admitted": admitted,
        "total_ms_median": { "expand": med(Some(Kind::Expand), |d| d.total_ms), "shrink": med(Some(Kind::Shrink), |d| d.total_ms), "replace": med(Some(Kind::Replace), |d| d.total_ms) },
        "rescales": done.iter().map(|d| json!([d.kind.name(), d.epoch, d.nodes, d.total_ms, d.command_ms])).collect::<Vec<_>>(),
        "rescales_columns": ["kind", "epoch", "nodes", "total_ms", "command_ms"],
        "checksum": { "job": job_sum, "reference": reference, "equal": equal },
        "verdict_given": verdict_given,
        "grows": verdict_given.then_some(grows),
        "processes": series.iter().map(|s| {
            let g = watched.iter().find(|(w, _)| w.pid == s.pid).map(|(_, g)| g);
            json!({
                "role": s.role,
                "pid": s.pid,
                "watched": g.is_some(),
                "rss_kb_per_rescale": g.map(|g| g.rss_kb_per_rescale),
                "fds_per_rescale": g.map(|g| g.fds_per_rescale),
                "threads_per_rescale": g.map(|g| g.threads_per_rescale),
                "flat": g.and_then(|g| g.ok),
                "curve_columns": ["rescales", "rss_kb", "fds", "threads"],
                "curve": s.points.iter().map(|(x, u)| json!([x, u.rss_kb, u.fds, u.threads])).collect::<Vec<_>>(),
            })
        }).collect::<Vec<_>>(),
        "table": table,
    });
    if let Some(dir) = out_path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&out_path, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("cannot write {}", out_path.display()))?;
    eprintln!("bench_soak: wrote {}", out_path.display());
    if failure.is_none() {
        let _ = std::fs::remove_dir_all(&state_base);
    } else {
        eprintln!("bench_soak: the job's log is kept in {}", state_base.display());
    }
    Ok(if failure.is_some() {
        ExitCode::from(1)
    } else if equal != Some(true) {
        ExitCode::from(3)
    } else if grows {
        ExitCode::from(4)
    } else {
        ExitCode::SUCCESS
    })
}
