//! `bench_rescale`: what rescaling a running job costs, stage by stage, next
//! to the same operations done by kill-and-restart (`--mode restart`), in one run.
//!
//! ```text
//! bench_rescale [--nodes 4,8,16] [--step K] [--reps R] [--grid G] [--block B] [--job-seconds S]
//!               [--quick] [--child-timeout SECS] [--out PATH]
//!               [--program-args "ARGS"] [--keep-logs DIR] [--no-restart]
//! ```
//!
//! `--program-args` adds arguments to every `jacobi2d` it starts (e.g.
//! `--gpu`, which `e2e/gpu/run.sh` uses to measure the same rescales with
//! the blocks on GPUs); `--keep-logs` copies the jobs' logs to `DIR` at the end;
//! `--no-restart` skips step 3 (restart columns empty).
//!
//! For each node count `N` (1 PE per node) it launches the sibling `ductile`
//! and `jacobi2d` binaries (found next to this executable):
//!
//! 1. a short calibration job at `N` nodes, to size the measured job so that
//!    it computes for about `--job-seconds` (and prints a residual line about
//!    every 100 ms, which is how the bench sees it make progress);
//! 2. the measured job, `jacobi2d --grid G --block B` at `N` nodes under
//!    `ductile run`; while it computes, `R` times: `ductile shrink -n K
//!    --json` (`N -> N-K`), then `ductile expand -n K --json` (`N-K -> N`),
//!    `K` being `--step` (default 1). After each rescale the job must print
//!    two more residual lines before the next one (it computes at its new
//!    size). Every report's stage times are kept;
//!    afterwards the launch members that never left must still be the same
//!    processes, and the job's checksum must equal that of a 1-node run of
//!    the same program and arguments (exit 3 otherwise);
//! 3. the same operations in `--mode restart` (the kill-and-restart
//!    baseline, docs/elasticity.md): a job of the same problem that calls
//!    `at_sync` about every 5 ms of computing, shrunk and expanded `R` times
//!    by checkpoint, relaunch at the new size and restore; its mechanism
//!    (checkpoint + relaunch + restore, without waiting for the sync point
//!    and without the balancing step) is compared with the live one. That
//!    job must end with the 1-node checksum too.
//!
//! Per `N` and operation it reports the median of each stage, of the
//! mechanism (every stage but `evacuate` and `balance`, the load balancer's
//! work), of the operation's load-balancing stage (`evacuate` for a shrink,
//! `balance` for an expand), and restart mechanism / live mechanism. It prints a
//! table and writes every raw report, the medians and the targets to
//! `target/bench/rescale.json` (or `--out`).
//!
//! The jobs inherit `DUCTILE_LOG`. The measured job's stderr (its nodes',
//! newcomers' and launcher's logs) goes to a file. When a rescale fails or the
//! job stalls, the bench stops the job, prints the failing command, its output
//! and the job's log tail, keeps the directory holding the logs, goes on with
//! the next node count, lists the failure under the table and in the JSON,
//! and exits 1. Run it with `DUCTILE_LOG=ductile=debug` to get the runtime's
//! logs there. Exit 3 (first) when a checksum differs.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ductile_apps::args;
use ductile_apps::bench::*;
use serde_json::{json, Value};

const BUILD: &str =
    "cargo build --release -p ductile-apps --bin bench_rescale --bin jacobi2d -p ductile-operator";

/// Every stage a rescale report holds, in protocol order.
const STAGES: &[&str] = &[
    "evacuate",
    "stop",
    "commit",
    "reconcile",
    "reentry",
    "state",
    "balance",
];
/// Iterations of the calibration job.
const CALIBRATION_ITERS: u64 = 300;
/// How often the measured job should print a residual line.
const PROGRESS_EVERY_MS: f64 = 100.0;
/// Residual lines the job must print after a rescale before the next one.
const SETTLE_LINES: u64 = 2;
/// The measured job is stalled when it prints no residual line for this long
/// while it should compute.
const STALL: Duration = Duration::from_secs(60);
/// How often (ms of computing) the `--mode restart` job reaches a sync
/// point, where a checkpoint can be taken.
const RESTART_SYNC_MS: f64 = 5.0;
/// `--timeout` of each `ductile shrink/expand`.
const RESCALE_TIMEOUT_S: u64 = 120;

// Targets.
/// Median mechanism time of a shrink or expand at these node counts...
const TARGET_MECHANISM_NODES: &[u32] = &[4, 8];
/// ...must be under this.
const TARGET_MECHANISM_MS: f64 = 5.0;
/// Restart mechanism / live mechanism must be at least this, in every row.
const TARGET_RATIO: f64 = 100.0;

struct Opts {
    nodes: Vec<u32>,
    /// Nodes each shrink removes and each expand adds.
    step: u32,
    reps: usize,
    grid: u32,
    block: u32,
    job_seconds: f64,
    quick: bool,
    child_timeout_s: u64,
    out: Option<PathBuf>,
    /// More arguments for every jacobi2d run.
    program_args: Vec<String>,
    /// Where to copy the jobs' logs at the end.
    keep_logs: Option<PathBuf>,
    /// Measure `--mode restart` too (not with `--no-restart`).
    restart: bool,
}

/// The command line (`bench_rescale --help`).
#[derive(clap::Parser, Debug)]
#[command(
    name = "bench_rescale",
    about = "Live shrink/expand of a Jacobi2D job at several sizes, stage by stage, against --mode restart; writes target/bench/rescale.json"
)]
struct Cli {
    #[command(flatten)]
    bench: args::BenchArgs,
    /// Node counts to measure at, comma-separated, each 2..=64 [default: 4,8,16, or 4 with --quick].
    #[arg(long, value_name = "N,...", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(2..=64))]
    nodes: Option<Vec<u32>>,
    /// Nodes each shrink removes and each expand adds (less than every node count: node 0 stays).
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = args::at_least_one::<u32>)]
    step: u32,
    /// Jacobi2D grid side in points.
    #[arg(long, value_name = "G", default_value_t = 256)]
    grid: u32,
    /// Jacobi2D block side in points (1..=--grid; at least as many blocks as nodes).
    #[arg(long, value_name = "B", default_value_t = 32, value_parser = args::at_least_one::<u32>)]
    block: u32,
    /// Seconds each measured job computes, at least 1 [default: 30, or 10 with --quick].
    #[arg(long = "job-seconds", value_name = "S")]
    job_seconds: Option<f64>,
    /// More arguments for every jacobi2d run, as one string.
    #[arg(long = "program-args", value_name = "ARGS", allow_hyphen_values = true)]
    program_args: Option<String>,
    /// Copy the jobs' logs here at the end.
    #[arg(long = "keep-logs", value_name = "DIR")]
    keep_logs: Option<PathBuf>,
    /// Measure live rescales only, not --mode restart.
    #[arg(long = "no-restart")]
    no_restart: bool,
}

impl Opts {
    /// The options, with the checks that involve more than one flag.
    fn from_cli(c: Cli) -> Result<Opts, String> {
        let quick = c.bench.quick;
        let nodes = c
            .nodes
            .clone()
            .unwrap_or_else(|| if quick { vec![4] } else { vec![4, 8, 16] });
        if nodes.is_empty() {
            return Err("--nodes: name at least one node count".into());
        }
        let step = c.step;
        if nodes.iter().any(|&n| n <= step) {
            return Err(format!(
                "--step {step}: must be less than every node count (node 0 stays)"
            ));
        }
        let reps = c.bench.reps();
        let (grid, block) = (c.grid, c.block);
        if grid < block {
            return Err("--block must be 1..=--grid".into());
        }
        let blocks = grid.div_ceil(block).pow(2);
        let most = nodes.iter().copied().max().unwrap_or(0);
        if blocks < most {
            return Err(format!(
                "--grid {grid} --block {block} makes {blocks} blocks, fewer than {most} nodes"
            ));
        }
        let job_seconds = c.bench.pick(c.job_seconds, 10.0, 30.0);
        if job_seconds.is_nan() || job_seconds < 1.0 {
            return Err("--job-seconds must be at least 1".into());
        }
        Ok(Opts {
            nodes,
            step,
            reps,
            grid,
            block,
            job_seconds,
            quick,
            child_timeout_s: c.bench.child_timeout_s(600),
            out: c.bench.out.clone(),
            program_args: c
                .program_args
                .as_deref()
                .unwrap_or("")
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            keep_logs: c.keep_logs,
            restart: !c.no_restart,
        })
    }

    /// `jacobi2d`'s problem arguments, without iterations and output control.
    fn problem(&self) -> Vec<String> {
        let mut v = strs(&[
            "--grid",
            &self.grid.to_string(),
            "--block",
            &self.block.to_string(),
        ]);
        v.extend(self.program_args.iter().cloned());
        v
    }
}

/// Copies every file of `from` into `to` (created).
fn copy_logs(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        if e.file_type()?.is_file() {
            std::fs::copy(e.path(), to.join(e.file_name()))?;
        }
    }
    Ok(())
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------- operations

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Shrink,
    Expand,
}

const OPS: [Op; 2] = [Op::Shrink, Op::Expand];

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Shrink => "shrink",
            Op::Expand => "expand",
        }
    }

    /// The load balancer's stage of this operation.
    fn lb_stage(self) -> &'static str {
        match self {
            Op::Shrink => "evacuate",
            Op::Expand => "balance",
        }
    }

    /// Node counts before and after, changing a job of `n` nodes at full
    /// size by `step` nodes.
    fn change(self, n: u32, step: u32) -> (u32, u32) {
        match self {
            Op::Shrink => (n, n - step),
            Op::Expand => (n - step, n),
        }
    }
}

/// One rescale as measured.
struct OpSample {
    /// The command's JSON output: the job's report plus `spawned_pids`.
    report: Value,
    /// Stage name -> ms.
    stages: Vec<(String, f64)>,
    mechanism_ms: f64,
    total_ms: f64,
    /// Wall time of the `ductile shrink/expand` command (for an expand, it
    /// includes starting the newcomer and its registration).
    command_ms: f64,
    /// Last iteration the job reported before the rescale.
    job_iteration: u64,
}

impl OpSample {
    fn stage(&self, name: &str) -> Option<f64> {
        self.stages
            .iter()
            .find(|(s, _)| s == name)
            .map(|(_, ms)| *ms)
    }

    fn json(&self) -> Value {
        json!({
            "report": self.report, "command_ms": self.command_ms,
            "job_iteration_before": self.job_iteration,
        })
    }
}

fn parse_report(
    op: Op,
    n: u32,
    step: u32,
    text: &str,
    command_ms: f64,
    job_iteration: u64,
) -> Result<OpSample> {
    let report: Value = serde_json::from_str(text)
        .with_context(|| format!("`ductile {}` printed no JSON report:\n{text}", op.name()))?;
    let number = |key: &str| {
        report[key]
            .as_f64()
            .ok_or_else(|| anyhow!("the report has no number `{key}`: {report}"))
    };
    let ids = |key: &str| -> Vec<u64> {
        report[key]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    };
    let (from, to) = op.change(n, step);
    let (pes_before, pes) = (number("pes_before")?, number("pes")?);
    let (epoch_before, epoch) = (number("epoch_before")?, number("epoch")?);
    // A shrink removes the highest-numbered nodes; newcomers take the next ids.
    let expected_ids: Vec<u64> = (u64::from(n - step)..u64::from(n)).collect();
    let moved = match op {
        Op::Shrink => ids("removed") == expected_ids && ids("admitted").is_empty(),
        Op::Expand => ids("admitted") == expected_ids && ids("removed").is_empty(),
    };
    if pes_before != f64::from(from) || pes != f64::from(to) || epoch <= epoch_before || !moved {
        bail!(
            "the {} reported something else than {from} -> {to} nodes (nodes {expected_ids:?} {}): {report}",
            op.name(),
            if op == Op::Shrink {
                "removed"
            } else {
                "admitted"
            }
        );
    }
    let stages = report["stages"]
        .as_array()
        .ok_or_else(|| anyhow!("the report has no stages: {report}"))?
        .iter()
        .map(|s| {
            Ok((
                s["stage"]
                    .as_str()
                    .ok_or_else(|| anyhow!("a stage without a name: {s}"))?
                    .to_string(),
                s["ms"]
                    .as_f64()
                    .ok_or_else(|| anyhow!("a stage without ms: {s}"))?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(OpSample {
        mechanism_ms: number("mechanism_ms")?,
        total_ms: number("total_ms")?,
        stages,
        report,
        command_ms,
        job_iteration,
    })
}

// ---------------------------------------------------------------- the measured job

/// What the measured job printed so far.
struct Progress {
    lines: Vec<String>,
    /// Residual lines seen.
    residuals: u64,
    /// The iteration of the last one.
    iteration: u64,
    /// When the last one came.
    at: Instant,
}

/// The long-running job the rescales act on, under `ductile run` in the
/// background. Dropping it stops whatever still runs.
struct LongJob {
    child: Child,
    state_dir: PathBuf,
    stderr_path: PathBuf,
    command: String,
    progress: Arc<Mutex<Progress>>,
    reader: Option<JoinHandle<()>>,
}

impl LongJob {
    #[allow(clippy::too_many_arguments)]
    fn start(
        ductile: &Path,
        job: &str,
        state_dir: &Path,
        stderr_path: &Path,
        nodes: u32,
        timeout_s: u64,
        program: &Path,
        prog_args: &[String],
    ) -> Result<LongJob> {
        let stderr = File::create(stderr_path)
            .with_context(|| format!("cannot create {}", stderr_path.display()))?;
        let mut cmd = Command::new(ductile);
        cmd.arg("run")
            .args([
                "--nodes",
                &nodes.to_string(),
                "--pes-per-node",
                "1",
                "--job",
                job,
            ])
            .arg("--state-dir")
            .arg(state_dir)
            .args(["--timeout", &timeout_s.to_string()])
            .arg("--")
            .arg(program)
            .args(prog_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        let command = format!("{cmd:?}");
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", ductile.display()))?;
        let out = child.stdout.take().expect("piped stdout");
        let progress = Arc::new(Mutex::new(Progress {
            lines: Vec::new(),
            residuals: 0,
            iteration: 0,
            at: Instant::now(),
        }));
        let seen = progress.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let mut p = seen.lock().expect("progress lock");
                // `iteration K residual R`
                if let Some(k) = line
                    .strip_prefix("iteration ")
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|k| k.parse().ok())
                {
                    p.residuals += 1;
                    p.iteration = k;
                    p.at = Instant::now();
                }
                p.lines.push(line);
            }
        });
        Ok(LongJob {
            child,
            state_dir: state_dir.to_path_buf(),
            stderr_path: stderr_path.to_path_buf(),
            command,
            progress,
            reader: Some(reader),
        })
    }

    /// (residual lines, last iteration).
    fn seen(&self) -> (u64, u64) {
        let p = self.progress.lock().expect("progress lock");
        (p.residuals, p.iteration)
    }

    /// The job's command, state directory and log tail, for error messages.
    fn context(&self) -> String {
        let log = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        let out = self
            .progress
            .lock()
            .expect("progress lock")
            .lines
            .join("\n");
        format!(
            "  job command: {}\n  job state directory: {}\n  job stderr (whole log: {}), tail:\n{}\n  job stdout, tail:\n{}",
            self.command,
            self.state_dir.display(),
            self.stderr_path.display(),
            tail(&log, 40),
            tail(&out, 5)
        )
    }

    /// Waits until the job printed `residuals` residual lines in all. The
    /// job ending first, or printing nothing for [`STALL`], is an error.
    fn wait_for(&mut self, residuals: u64, what: &str) -> Result<()> {
        loop {
            let (seen, at) = {
                let p = self.progress.lock().expect("progress lock");
                (p.residuals, p.at)
            };
            if seen >= residuals {
                return Ok(());
            }
            if let Some(st) = self.child.try_wait()? {
                bail!("the job ended ({st}) {what}\n{}", self.context());
            }
            if at.elapsed() > STALL {
                bail!(
                    "the job STALLED {what}: no residual line for {} s (last at iteration {})\n{}",
                    STALL.as_secs(),
                    self.seen().1,
                    self.context()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the job to end by itself; returns its stdout. A failure,
    /// or no progress for [`STALL`], is an error.
    fn finish(&mut self) -> Result<String> {
        let status = loop {
            if let Some(st) = self.child.try_wait()? {
                break st;
            }
            let at = self.progress.lock().expect("progress lock").at;
            if at.elapsed() > STALL {
                bail!(
                    "the job STALLED after the rescales: no residual line for {} s (last at iteration {})\n{}",
                    STALL.as_secs(),
                    self.seen().1,
                    self.context()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        if !status.success() {
            bail!(
                "the job failed after the rescales ({status})\n{}",
                self.context()
            );
        }
        Ok(self
            .progress
            .lock()
            .expect("progress lock")
            .lines
            .join("\n"))
    }

    /// Stops the launcher (SIGTERM, which it forwards to every node), then
    /// kills it if it is still there after 5 s.
    fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for LongJob {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `ductile ARGS`; returns (exit status, stdout, stderr, wall ms, command as text).
fn ductile_cmd(ductile: &Path, cli_args: &[String]) -> Result<(bool, String, String, f64, String)> {
    let mut cmd = Command::new(ductile);
    cmd.args(cli_args).stdin(Stdio::null());
    let shown = format!("{cmd:?}");
    let t = Instant::now();
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {shown}"))?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        ms,
        format!("{shown} -> {}", out.status),
    ))
}

/// The pids of the job's members, in node order.
fn member_pids(ductile: &Path, state_dir: &Path) -> Result<Vec<u64>> {
    let cli = vec![
        "status".to_string(),
        "--state-dir".to_string(),
        state_dir.display().to_string(),
        "--json".to_string(),
    ];
    let (ok, out, err, _, shown) = ductile_cmd(ductile, &cli)?;
    if !ok {
        bail!("{shown}\n{err}");
    }
    let v: Value =
        serde_json::from_str(&out).with_context(|| format!("{shown} printed no JSON"))?;
    v["members"]
        .as_array()
        .ok_or_else(|| anyhow!("{shown}: no members in {v}"))?
        .iter()
        .map(|m| {
            m["pid"]
                .as_u64()
                .ok_or_else(|| anyhow!("a member without a pid: {m}"))
        })
        .collect()
}

/// The checksum in a jacobi2d output.
fn checksum(stdout: &str) -> Result<String> {
    stdout
        .lines()
        .find(|l| l.starts_with("checksum="))
        .and_then(|l| field(l, "checksum"))
        .map(str::to_string)
        .ok_or_else(|| anyhow!("jacobi2d printed no checksum line:\n{}", tail(stdout, 10)))
}

/// Everything measured at one node count.
struct NodeRun {
    nodes: u32,
    calibration_ms_per_iter: f64,
    job_args: Vec<String>,
    job_seconds: f64,
    /// Per operation (shrink, expand): the rescales.
    samples: [Vec<OpSample>; 2],
    job_checksum: String,
    reference_checksum: String,
    launch_pids: Vec<u64>,
    final_pids: Vec<u64>,
    /// Per operation: `--mode restart` mechanism samples, ms (fewer than `--reps`
    /// when one failed).
    restart_ms: [Vec<f64>; 2],
    /// Why the `--mode restart` rescales stopped early, if they did.
    restart_failure: Option<String>,
}

fn measure(env: &mut Env, o: &Opts, n: u32, jacobi: &Path, logs: &Path) -> Result<NodeRun> {
    // 1. Calibration: how fast an iteration is at N nodes, to size the job.
    eprintln!("bench_rescale: {n} nodes: calibration ({CALIBRATION_ITERS} iterations)");
    let mut cal_args = o.problem();
    cal_args.extend(strs(&[
        "--iters",
        &CALIBRATION_ITERS.to_string(),
        "--residual-every",
        "0",
        "--quiet",
    ]));
    let cal = env.run(&format!("calibrate-{n}"), n, 1, jacobi, &cal_args)?;
    let cal_line = cal
        .stdout
        .lines()
        .find(|l| l.starts_with("jacobi2d ") && field(l, "time_per_iter_ms").is_some())
        .ok_or_else(|| {
            anyhow!(
                "the calibration run printed no result:\n{}",
                tail(&cal.stdout, 10)
            )
        })?;
    let ms_per_iter = num(cal_line, "time_per_iter_ms")?.max(1e-3);
    let iters = ((o.job_seconds * 1e3 / ms_per_iter).ceil() as u64).max(100);
    let every = ((PROGRESS_EVERY_MS / ms_per_iter).round() as u64).clamp(1, iters);
    let mut job_args = o.problem();
    job_args.extend(strs(&[
        "--iters",
        &iters.to_string(),
        "--residual-every",
        &every.to_string(),
    ]));

    // 2. The measured job, and the rescales while it computes.
    let (job, state_dir) = env.next_job(&format!("job-{n}"));
    let stderr_path = logs.join(format!("{job}.stderr"));
    eprintln!(
        "bench_rescale: {n} nodes: job of {iters} iterations ({:.3} ms each at {n} nodes), {} shrink+expand pairs; log {}",
        ms_per_iter,
        o.reps,
        stderr_path.display()
    );
    let mut long = LongJob::start(
        &env.ductile,
        &job,
        &state_dir,
        &stderr_path,
        n,
        env.timeout_s,
        jacobi,
        &job_args,
    )?;
    let started = Instant::now();
    long.wait_for(1, "before it started computing")?;
    let launch_pids =
        member_pids(&env.ductile, &state_dir).map_err(|e| anyhow!("{e:#}\n{}", long.context()))?;
    if launch_pids.len() != n as usize {
        bail!(
            "the job has {} members, not {n}\n{}",
            launch_pids.len(),
            long.context()
        );
    }
    let mut samples: [Vec<OpSample>; 2] = [Vec::new(), Vec::new()];
    for rep in 0..o.reps {
        for (oi, op) in OPS.iter().enumerate() {
            let (from, to) = op.change(n, o.step);
            let iteration = long.seen().1;
            let cli = vec![
                op.name().to_string(),
                "--state-dir".to_string(),
                state_dir.display().to_string(),
                "-n".to_string(),
                o.step.to_string(),
                "--json".to_string(),
                "--timeout".to_string(),
                RESCALE_TIMEOUT_S.to_string(),
            ];
            let (ok, out, err, ms, shown) = ductile_cmd(&env.ductile, &cli)?;
            if !ok {
                bail!(
                    "RESCALE FAILED: {} {from} -> {to} nodes (rep {}/{}, job at iteration {iteration})\n  command: {shown}\n  its stderr:\n{}\n  its stdout:\n{}\n{}",
                    op.name(),
                    rep + 1,
                    o.reps,
                    err.trim_end(),
                    out.trim_end(),
                    long.context()
                );
            }
            let sample = parse_report(*op, n, o.step, &out, ms, iteration)
                .map_err(|e| anyhow!("{e:#}\n  command: {shown}\n{}", long.context()))?;
            eprintln!(
                "bench_rescale: {n} nodes: {} {from} -> {to} rep {}/{}: mechanism {:.3} ms, {} {:.3} ms, command {:.0} ms",
                op.name(),
                rep + 1,
                o.reps,
                sample.mechanism_ms,
                op.lb_stage(),
                sample.stage(op.lb_stage()).unwrap_or(f64::NAN),
                ms
            );
            samples[oi].push(sample);
            // The job computes at its new size before the next rescale.
            let after = long.seen().0;
            long.wait_for(
                after + SETTLE_LINES,
                &format!("after the {} to {to} nodes (rep {})", op.name(), rep + 1),
            )?;
        }
    }
    let final_pids =
        member_pids(&env.ductile, &state_dir).map_err(|e| anyhow!("{e:#}\n{}", long.context()))?;
    // A rescale must not restart anyone: the launch members that never left
    // are the same processes.
    let kept = (n - o.step) as usize;
    if final_pids.len() != n as usize || final_pids[..kept] != launch_pids[..kept] {
        bail!(
            "the job's processes changed: launch pids {launch_pids:?}, now {final_pids:?} (nodes 0..{kept} never left)\n{}",
            long.context()
        );
    }
    let measured_s = started.elapsed().as_secs_f64();
    eprintln!("bench_rescale: {n} nodes: rescales done after {measured_s:.1} s; waiting for the job to finish");
    let out = long.finish()?;
    let job_checksum = checksum(&out).map_err(|e| anyhow!("{e:#}\n{}", long.context()))?;
    let job_seconds = started.elapsed().as_secs_f64();
    drop(long);

    // The same program and arguments on one node: the answer the job must give.
    eprintln!("bench_rescale: {n} nodes: 1-node reference run of the same job");
    let reference = env.run(&format!("reference-{n}"), 1, 1, jacobi, &job_args)?;
    let reference_checksum = checksum(&reference.stdout)?;
    if job_checksum != reference_checksum {
        eprintln!(
            "bench_rescale: !!! CHECKSUM MISMATCH at {n} nodes: the rescaled job printed {job_checksum}, \
             the same job on 1 node {reference_checksum} ({})",
            job_args.join(" ")
        );
    }

    // 3. The same operations in `--mode restart`: a job of the same problem
    // that calls at_sync often (a checkpoint waits for a sync point),
    // checkpointed, ended and relaunched at the new size by each rescale.
    let sync_every = ((RESTART_SYNC_MS / ms_per_iter).round() as u64).max(1);
    let mut restart_args = job_args.clone();
    restart_args.extend(strs(&["--lb-every", &sync_every.to_string()]));
    let restarts = if o.restart {
        measure_restarts(env, o, n, jacobi, logs, &restart_args, &reference_checksum)
    } else {
        Ok(Default::default())
    };
    let (restart_ms, restart_failure) = match restarts {
        Ok(samples) => (samples, None),
        Err((samples, e)) => {
            eprintln!("bench_rescale: error: {n} nodes: a --mode restart rescale FAILED: {e:#}");
            (samples, Some(format!("restart mode: {e:#}")))
        }
    };

    Ok(NodeRun {
        nodes: n,
        calibration_ms_per_iter: ms_per_iter,
        job_args,
        job_seconds,
        samples,
        job_checksum,
        reference_checksum,
        launch_pids,
        final_pids,
        restart_ms,
        restart_failure,
    })
}

/// Samples per operation of [`OPS`], in ms.
type PerOp = [Vec<f64>; 2];

/// `R` shrink+expand pairs in `--mode restart` on a job at `n` nodes; the
/// mechanism (checkpoint + relaunch + restore) of each, per operation. The
/// job must end with the reference checksum. On failure, the samples taken
/// so far and the error.
fn measure_restarts(
    env: &mut Env,
    o: &Opts,
    n: u32,
    jacobi: &Path,
    logs: &Path,
    args: &[String],
    reference: &str,
) -> std::result::Result<PerOp, (PerOp, anyhow::Error)> {
    let mut samples: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let (job, state_dir) = env.next_job(&format!("restart-{n}"));
    let stderr_path = logs.join(format!("{job}.stderr"));
    eprintln!(
        "bench_rescale: {n} nodes: --mode restart job, {} shrink+expand pairs; log {}",
        o.reps,
        stderr_path.display()
    );
    let mut long = match LongJob::start(
        &env.ductile,
        &job,
        &state_dir,
        &stderr_path,
        n,
        env.timeout_s,
        jacobi,
        args,
    ) {
        Ok(long) => long,
        Err(e) => return Err((samples, e)),
    };
    let run = (|| -> Result<()> {
        long.wait_for(1, "before it started computing")?;
        for rep in 0..o.reps {
            for (oi, op) in OPS.iter().enumerate() {
                let (from, to) = op.change(n, o.step);
                let cli = strs(&[
                    op.name(),
                    "--state-dir",
                    &state_dir.display().to_string(),
                    "-n",
                    &o.step.to_string(),
                    "--mode",
                    "restart",
                    "--json",
                    "--timeout",
                    &RESCALE_TIMEOUT_S.to_string(),
                ]);
                let (ok, out, err, _, shown) = ductile_cmd(&env.ductile, &cli)?;
                if !ok {
                    bail!(
                        "RESTART FAILED: {} {from} -> {to} nodes (rep {}/{})\n  command: {shown}\n  its stderr:\n{}\n{}",
                        op.name(),
                        rep + 1,
                        o.reps,
                        err.trim_end(),
                        long.context()
                    );
                }
                let report: Value =
                    serde_json::from_str(&out).map_err(|e| anyhow!("not JSON ({e}): {out}"))?;
                let ms = report["mechanism_ms"]
                    .as_f64()
                    .ok_or_else(|| anyhow!("no mechanism_ms in {report}"))?;
                eprintln!(
                    "bench_rescale: {n} nodes: restart {} {from} -> {to} rep {}/{}: mechanism {ms:.1} ms",
                    op.name(),
                    rep + 1,
                    o.reps
                );
                samples[oi].push(ms);
                let after = long.seen().0;
                long.wait_for(after + SETTLE_LINES, "after a restart")?;
            }
        }
        let out = long.finish()?;
        let got = checksum(&out)?;
        if got != reference {
            bail!("CHECKSUM MISMATCH after restarts: {got}, the 1-node run {reference}");
        }
        Ok(())
    })();
    match run {
        Ok(()) => Ok(samples),
        Err(e) => Err((samples, e)),
    }
}

// ---------------------------------------------------------------- main

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bench_rescale: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// One row of the table: the medians of one operation at one node count.
struct Row {
    nodes: u32,
    op: Op,
    stages: Vec<(&'static str, f64)>,
    lb_ms: f64,
    mechanism: Stats,
    total_ms: f64,
    command_ms: f64,
    restart: Stats,
    /// `--mode restart` rescales that completed (fewer than `--reps` when one failed).
    restarts: usize,
    ratio: f64,
}

fn real_main() -> Result<ExitCode> {
    let o = Opts::from_cli(<Cli as clap::Parser>::parse()).unwrap_or_else(|e| {
        <Cli as clap::CommandFactory>::command()
            .error(clap::error::ErrorKind::ArgumentConflict, e)
            .exit()
    });

    let sitting = Sitting::begin("bench_rescale", "rescale.json", o.out.clone())?;
    let ductile = sitting.program("ductile", BUILD)?;
    let jacobi = sitting.program("jacobi2d", BUILD)?;
    let (date, nproc, model) = (&sitting.date, sitting.nproc, &sitting.cpu_model);
    let state_base = &sitting.state_base;
    let logs = state_base.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let mut env = Env {
        ductile: ductile.clone(),
        state_base: state_base.clone(),
        timeout_s: o.child_timeout_s,
        runs: 0,
        prefix: "bench-rescale",
    };
    let load_start = &sitting.load_start;
    let (commit, dirty) = sitting.sources();
    let command = sitting.command();

    // A node count that fails (a rescale refused, a stalled job, a child
    // run failing) is reported in full at once and again at the end, and
    // makes the exit status 1; the other node counts are still measured.
    let mut runs = Vec::new();
    let mut failures: Vec<(u32, String)> = Vec::new();
    for &n in &o.nodes {
        match measure(&mut env, &o, n, &jacobi, &logs) {
            Ok(r) => {
                if let Some(e) = &r.restart_failure {
                    failures.push((n, e.clone()));
                }
                runs.push(r);
            }
            Err(e) => {
                eprintln!("bench_rescale: error: {n} nodes FAILED: {e:#}");
                failures.push((n, format!("{e:#}")));
            }
        }
    }
    if let Some(keep) = &o.keep_logs {
        if let Err(e) = copy_logs(&logs, keep) {
            eprintln!(
                "bench_rescale: could not keep the logs in {}: {e:#}",
                keep.display()
            );
        }
    }
    if failures.is_empty() {
        let _ = std::fs::remove_dir_all(&state_base);
    } else {
        eprintln!(
            "bench_rescale: the job logs and state directories are kept in {}",
            state_base.display()
        );
    }
    let load_end = loadavg();

    // Medians.
    let mut rows = Vec::new();
    for r in &runs {
        for (oi, op) in OPS.iter().enumerate() {
            let s = &r.samples[oi];
            let med_of = |f: &dyn Fn(&OpSample) -> Option<f64>| {
                median(&s.iter().filter_map(f).collect::<Vec<_>>())
            };
            let stages = STAGES
                .iter()
                .map(|&st| (st, med_of(&|x: &OpSample| x.stage(st))))
                .collect::<Vec<_>>();
            let mechanism = stats(&s.iter().map(|x| x.mechanism_ms).collect::<Vec<_>>());
            let restart = stats(&r.restart_ms[oi]);
            rows.push(Row {
                nodes: r.nodes,
                op: *op,
                lb_ms: med_of(&|x: &OpSample| x.stage(op.lb_stage())),
                stages,
                mechanism,
                total_ms: med_of(&|x: &OpSample| Some(x.total_ms)),
                command_ms: med_of(&|x: &OpSample| Some(x.command_ms)),
                ratio: restart.median / mechanism.median,
                restart,
                restarts: r.restart_ms[oi].len(),
            });
        }
    }

    let mut report = String::new();
    let w = &mut report;
    writeln!(
        w,
        "bench_rescale  {date}  nproc={nproc}  cpu={}",
        model.as_deref().unwrap_or("unknown")
    )?;
    writeln!(w, "command: {command}")?;
    writeln!(
        w,
        "sources: commit {}{}",
        commit.as_deref().unwrap_or("unknown"),
        match dirty {
            Some(true) => " with uncommitted changes",
            Some(false) => " (clean)",
            None => "",
        }
    )?;
    writeln!(
        w,
        "parameters: nodes {:?} x 1 PE, step {} node(s), reps={}, jacobi2d {} (~{} s of iterations per measured job){}",
        o.nodes,
        o.step,
        o.reps,
        o.problem().join(" "),
        o.job_seconds,
        if o.quick { " (--quick)" } else { "" }
    )?;
    writeln!(
        w,
        "load average (1/5/15 min) at start: {}, at end: {}",
        load_start.as_deref().unwrap_or("unknown"),
        load_end.as_deref().unwrap_or("unknown")
    )?;
    writeln!(
        w,
        "\nRescaling a running jacobi2d job by {} node(s); ms, median of {} rescales per row.",
        o.step, o.reps
    )?;
    writeln!(
        w,
        "lb = the load balancer's stage (evacuate for shrink, balance for expand); mechanism = stop+commit+reconcile+reentry+state;"
    )?;
    writeln!(
        w,
        "restart_ms = mechanism of the same operation in --mode restart (checkpoint + relaunch + restore); ratio = restart_ms / mechanism"
    )?;
    writeln!(
        w,
        "  {:>5} | {:<6} | {:>7} | {:>8} | {:>7} | {:>7} | {:>9} | {:>7} | {:>7} | {:>12} | {:>13} | {:>7} | {:>8} | {:>7}",
        "nodes", "op", "change", "lb_ms", "stop", "commit", "reconcile", "reentry", "state", "mechanism_ms", "restart_ms", "ratio",
        "total_ms", "cmd_ms"
    )?;
    for r in &rows {
        let (from, to) = r.op.change(r.nodes, o.step);
        let st = |name: &str| {
            r.stages
                .iter()
                .find(|(s, _)| *s == name)
                .map_or(f64::NAN, |(_, v)| *v)
        };
        writeln!(
            w,
            "  {:>5} | {:<6} | {:>7} | {:>8.3} | {:>7.3} | {:>7.3} | {:>9.3} | {:>7.3} | {:>7.3} | {:>12.3} | {:>13.1} | {:>6.0}x | {:>8.3} | {:>7.0}",
            r.nodes,
            r.op.name(),
            format!("{from}->{to}"),
            r.lb_ms,
            st("stop"),
            st("commit"),
            st("reconcile"),
            st("reentry"),
            st("state"),
            r.mechanism.median,
            r.restart.median,
            r.ratio,
            r.total_ms,
            r.command_ms
        )?;
    }
    writeln!(
        w,
        "total_ms = request at node 0 to reply (every stage); cmd_ms = the whole `ductile shrink/expand` command (an expand's includes starting the newcomer)"
    )?;
    writeln!(
        w,
        "\nSpread: median [min..max] over {} rescales / restarts",
        o.reps
    )?;
    writeln!(
        w,
        "  {:>5} | {:<6} | {:>28} | {:>28}",
        "nodes", "op", "mechanism_ms", "restart_ms"
    )?;
    for r in &rows {
        writeln!(
            w,
            "  {:>5} | {:<6} | {:>28} | {:>28}{}",
            r.nodes,
            r.op.name(),
            format!(
                "{:.3} [{:.3}..{:.3}]",
                r.mechanism.median, r.mechanism.min, r.mechanism.max
            ),
            format!(
                "{:.1} [{:.1}..{:.1}]",
                r.restart.median, r.restart.min, r.restart.max
            ),
            if r.restarts < o.reps {
                format!(
                    "  (only {} of {} restarts completed: see FAILED below)",
                    r.restarts, o.reps
                )
            } else {
                String::new()
            }
        )?;
    }

    let mut checksum_ok = true;
    for r in &runs {
        let agree = r.job_checksum == r.reference_checksum;
        checksum_ok &= agree;
        writeln!(
            w,
            "  {:>2} nodes: rescaled job checksum {} vs 1-node run {}: {}; launch nodes 0..{} kept their processes",
            r.nodes,
            r.job_checksum,
            r.reference_checksum,
            if agree { "identical" } else { "!!! MISMATCH" },
            r.nodes - o.step - 1
        )?;
    }

    for (n, e) in &failures {
        // The first lines say what failed and how; the whole error went to stderr and the JSON.
        let head: Vec<&str> = e.lines().take(4).collect();
        writeln!(w, "  {n:>2} nodes: !!! FAILED: {}", head.join("\n      "))?;
    }

    // Targets.
    type TargetRow = (String, f64, &'static str, String, Option<bool>);
    let mut targets: Vec<TargetRow> = Vec::new();
    for r in &rows {
        if TARGET_MECHANISM_NODES.contains(&r.nodes) {
            targets.push((
                format!("{} mechanism median at {} nodes", r.op.name(), r.nodes),
                r.mechanism.median,
                "ms",
                format!("< {TARGET_MECHANISM_MS}"),
                Some(r.mechanism.median < TARGET_MECHANISM_MS),
            ));
        }
    }
    for r in &rows {
        targets.push((
            format!(
                "{} restart / live mechanism at {} nodes",
                r.op.name(),
                r.nodes
            ),
            r.ratio,
            "x",
            format!(">= {TARGET_RATIO}"),
            Some(r.ratio >= TARGET_RATIO),
        ));
    }
    // Growth with the job's size at a fixed change (one node): informational.
    let (lo, hi) = (
        o.nodes.iter().copied().min().unwrap_or(0),
        o.nodes.iter().copied().max().unwrap_or(0),
    );
    let mut growth = Vec::new();
    if hi > lo {
        for op in OPS {
            let at = |n: u32| {
                rows.iter()
                    .find(|r| r.nodes == n && r.op == op)
                    .map(|r| r.mechanism.median)
            };
            if let (Some(a), Some(b)) = (at(lo), at(hi)) {
                growth.push(json!({
                    "op": op.name(), "from_nodes": lo, "to_nodes": hi,
                    "job_size_ratio": f64::from(hi) / f64::from(lo),
                    "mechanism_ratio": b / a,
                }));
                targets.push((
                    format!(
                        "{} mechanism {hi} vs {lo} nodes (job {:.0}x bigger)",
                        op.name(),
                        f64::from(hi) / f64::from(lo)
                    ),
                    b / a,
                    "x",
                    "info".to_string(),
                    None,
                ));
            }
        }
    }
    writeln!(w, "\nTargets")?;
    writeln!(
        w,
        "  {:<48} | {:>10} | {:>8} | result",
        "target", "value", "limit"
    )?;
    for (name, v, unit, limit, pass) in &targets {
        writeln!(
            w,
            "  {name:<48} | {:>10} | {:>8} | {}",
            format!("{v:.3} {unit}"),
            if pass.is_some() {
                format!("{limit} {unit}")
            } else {
                "-".into()
            },
            if pass.is_some() {
                pass_str(*pass)
            } else {
                "info"
            }
        )?;
    }
    print!("{report}");

    let nodes_json: Vec<Value> = runs
        .iter()
        .map(|r| {
            let ops: Vec<Value> = OPS
                .iter()
                .enumerate()
                .map(|(oi, op)| {
                    let s = &r.samples[oi];
                    let (from, to) = op.change(r.nodes, o.step);
                    let series = |f: &dyn Fn(&OpSample) -> Option<f64>| stats_json(&s.iter().filter_map(f).collect::<Vec<_>>());
                    let row = rows.iter().find(|x| x.nodes == r.nodes && x.op == *op).expect("a row per op");
                    json!({
                        "op": op.name(), "from_nodes": from, "to_nodes": to,
                        "lb_stage": op.lb_stage(),
                        "lb_ms": series(&|x: &OpSample| x.stage(op.lb_stage())),
                        "stages_ms": STAGES.iter().map(|&st| (st.to_string(), series(&|x: &OpSample| x.stage(st))))
                            .collect::<serde_json::Map<_, _>>(),
                        "mechanism_ms": series(&|x: &OpSample| Some(x.mechanism_ms)),
                        "total_ms": series(&|x: &OpSample| Some(x.total_ms)),
                        "command_ms": series(&|x: &OpSample| Some(x.command_ms)),
                        "restart_ms": {
                            "nodes": to,
                            "what": "mechanism of the same operation in --mode restart: checkpoint write + relaunch \
                                     (processes ending and starting, launch barrier) + restore (reading and placing \
                                     every chare); without the wait for a sync point and the balancing step",
                            "samples_stats": stats_json(&r.restart_ms[oi]),
                        },
                        "ratio_restart_to_mechanism": row.ratio,
                        "rescales": s.iter().map(OpSample::json).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "nodes": r.nodes,
                "pes_per_node": 1,
                "calibration_ms_per_iter": r.calibration_ms_per_iter,
                "restart_failure": r.restart_failure,
                "job": {
                    "program": "jacobi2d", "args": r.job_args, "seconds": r.job_seconds,
                    "checksum": r.job_checksum, "reference_1_node_checksum": r.reference_checksum,
                    "checksums_agree": r.job_checksum == r.reference_checksum,
                    "launch_pids": r.launch_pids, "final_pids": r.final_pids,
                },
                "ops": ops,
            })
        })
        .collect();
    sitting.write_json(json!({
        "parameters": {
            "nodes": o.nodes, "step": o.step, "pes_per_node": 1, "reps": o.reps, "quick": o.quick,
            "problem": o.problem(), "job_seconds": o.job_seconds,
            "calibration_iters": CALIBRATION_ITERS, "progress_every_ms": PROGRESS_EVERY_MS,
            "settle_residual_lines": SETTLE_LINES, "child_timeout_s": o.child_timeout_s,
            "stages": STAGES,
            "mechanism": "every stage but evacuate and balance (the load balancer's work)",
        },
        "runs": nodes_json,
        "mechanism_growth_with_job_size": growth,
        "targets": targets.iter().map(|(name, v, unit, limit, pass)| json!({
            "name": name, "value": v, "unit": unit, "limit": limit, "pass": pass,
        })).collect::<Vec<_>>(),
        "failures": failures.iter().map(|(n, e)| json!({ "nodes": n, "error": e })).collect::<Vec<_>>(),
        "logs_kept_in": (!failures.is_empty()).then(|| state_base.display().to_string()),
        "ok": checksum_ok && failures.is_empty(),
        "table": report,
    }))?;

    if !checksum_ok {
        eprintln!("bench_rescale: ERROR: CHECKSUM MISMATCH: a rescaled job computed something else than the same job on 1 node");
        return Ok(ExitCode::from(3));
    }
    if !failures.is_empty() {
        let which: Vec<String> = failures.iter().map(|(n, _)| n.to_string()).collect();
        eprintln!(
            "bench_rescale: ERROR: the measurement at {} node(s) failed (see above); job logs in {}",
            which.join(", "),
            state_base.display()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
