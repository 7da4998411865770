//! `bench_lb`: what measurement-based load balancing buys on a heterogeneous
//! fleet, and what an LB step costs, side by side in one run.
//!
//! ```text
//! bench_lb [--reps N] [--quick] [--child-timeout SECS] [--out PATH]
//! ```
//!
//! It launches the sibling `ductile`, `lbbench` and `jacobi2d` binaries (found
//! next to this executable) as ordinary jobs on 1 node x 2 PEs, three cases:
//!
//! 1. `lbbench-half`: lbbench, uniform loads, PE 1 at half speed (`+pe-speed 1:0.5`);
//! 2. `lbbench-heavy`: lbbench, the first PE's elements three times heavier, equal speeds;
//! 3. `jacobi-half`: Jacobi2D, PE 1 at half speed;
//!
//! each with `+lb Null` (no balancing), `+lb GreedyRefine` and
//! `+lb GreedyRefineRateAware`, all with `+lb-report`. Each rep runs every case
//! and strategy once (the strategy order rotates from rep to rep), so drift on
//! a shared machine hits all alike; medians over `--reps` are reported:
//!
//! - time per iteration, and the improvement over Null ("recovered time");
//! - max/avg predicted load (rate-aware model) after the last LB step's plan, and
//!   before it, i.e. the balance the previous step's plan actually produced;
//! - the LB step's own cost: strategy time, migration time, bytes moved, total
//!   step time (medians over steps and reps).
//!
//! Then each case runs once more with `+lb GreedyRefineRateAware +lb-dump DIR`;
//! the first and last dumped statistics are replayed into the same strategy and
//! its plan's max/avg is compared with the best possible assignment
//! (`ductile::lb::optimal::best`, branch and bound).
//!
//! It prints a table and writes every raw sample, the medians and the targets
//! (with pass/fail flags) as JSON to `target/bench/lb.json` (or `--out`).
//! Exit status: 1 when a child run fails or times out, 3 when runs of the same
//! case print different checksums; a missed performance target is reported, not
//! an error.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use ductile::lb::{self, optimal, Assignment, CostModel, LbStats, Params};
use ductile_apps::args;
use ductile_apps::bench::*;
use serde_json::{json, Value};

const STRATEGIES: &[&str] = &["Null", "GreedyRefine", "GreedyRefineRateAware"];
const RATE_AWARE: &str = "GreedyRefineRateAware";
const PES: u32 = 2;
const HALF_SPEED: &str = "1:0.5";

// Targets.
/// Rate-aware GreedyRefine must cut time per iteration by at least this much vs Null on the half-speed cases.
const TARGET_RECOVERED: f64 = 0.25;
/// Its plan's max/avg must be within this fraction of the best possible assignment's.
const TARGET_GAP_TO_BEST: f64 = 0.05;

struct Opts {
    reps: usize,
    quick: bool,
    child_timeout_s: u64,
    out: Option<PathBuf>,
}

/// The command line (`bench_lb --help`).
#[derive(clap::Parser, Debug)]
#[command(
    name = "bench_lb",
    about = "Load-balancing strategies on lbbench and jacobi2d cases (a PE at half speed, heavy elements); writes target/bench/lb.json"
)]
struct Cli {
    #[command(flatten)]
    bench: args::BenchArgs,
}

impl Opts {
    fn from_cli(c: &Cli) -> Opts {
        Opts {
            reps: c.bench.reps(),
            quick: c.bench.quick,
            child_timeout_s: c.bench.child_timeout_s(300),
            out: c.bench.out.clone(),
        }
    }
}

// ---------------------------------------------------------------- cases

#[derive(Clone, Copy, PartialEq)]
enum Prog {
    Lbbench,
    Jacobi,
}

impl Prog {
    fn bin(self) -> &'static str {
        match self {
            Prog::Lbbench => "lbbench",
            Prog::Jacobi => "jacobi2d",
        }
    }
}

struct Case {
    name: &'static str,
    what: &'static str,
    prog: Prog,
    args: Vec<String>,
    /// `+pe-speed` value, if a PE is slowed down.
    speed: Option<&'static str>,
    /// Whether the >= 25% recovered-time and within-5%-of-best targets apply.
    targeted: bool,
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn cases(quick: bool) -> Vec<Case> {
    let lb = if quick {
        strs(&[
            "--per-pe",
            "8",
            "--iters",
            "40",
            "--lb-every",
            "10",
            "--work-us",
            "200",
        ])
    } else {
        strs(&[
            "--per-pe",
            "16",
            "--iters",
            "400",
            "--lb-every",
            "20",
            "--work-us",
            "400",
        ])
    };
    let jac = if quick {
        strs(&[
            "--grid",
            "512",
            "--block",
            "128",
            "--iters",
            "40",
            "--lb-every",
            "10",
            "--residual-every",
            "0",
            "--quiet",
        ])
    } else {
        strs(&[
            "--grid",
            "2048",
            "--block",
            "256",
            "--iters",
            "200",
            "--lb-every",
            "20",
            "--residual-every",
            "0",
            "--quiet",
        ])
    };
    let with = |base: &[String], extra: &[&str]| -> Vec<String> {
        base.iter().cloned().chain(strs(extra)).collect()
    };
    vec![
        Case {
            name: "lbbench-half",
            what: "lbbench, uniform loads, PE 1 at half speed",
            prog: Prog::Lbbench,
            args: with(&lb, &["--load", "uniform"]),
            speed: Some(HALF_SPEED),
            targeted: true,
        },
        Case {
            name: "lbbench-heavy",
            what: "lbbench, PE 0's elements 3x heavier, equal speeds",
            prog: Prog::Lbbench,
            args: with(&lb, &["--load", "heavy"]),
            speed: None,
            targeted: false,
        },
        Case {
            name: "jacobi-half",
            what: "Jacobi2D, PE 1 at half speed",
            prog: Prog::Jacobi,
            args: jac,
            speed: Some(HALF_SPEED),
            targeted: true,
        },
    ]
}

fn case_args(c: &Case, strategy: &str, dump: Option<&Path>) -> Vec<String> {
    let mut v = c.args.clone();
    v.extend(strs(&["+lb", strategy, "+lb-report"]));
    if let Some(s) = c.speed {
        v.extend(strs(&["+pe-speed", s]));
    }
    if let Some(d) = dump {
        v.push("+lb-dump".into());
        v.push(d.display().to_string());
    }
    v
}

// ---------------------------------------------------------------- statistics

// ---------------------------------------------------------------- one run

/// One `lb step=...` line.
#[derive(Clone)]
struct LbStep {
    step: f64,
    strategy: String,
    migrations: f64,
    before: f64,
    after: f64,
    strategy_ms: f64,
    collect_ms: f64,
    bytes: f64,
    migration_ms: f64,
    total_ms: f64,
}

impl LbStep {
    fn parse(line: &str) -> Result<LbStep> {
        Ok(LbStep {
            step: num(line, "step")?,
            strategy: field(line, "strategy").unwrap_or_default().to_string(),
            migrations: num(line, "migrations")?,
            before: num(line, "max_avg_before")?,
            after: num(line, "max_avg_after")?,
            strategy_ms: num(line, "strategy_ms")?,
            collect_ms: num(line, "collect_ms")?,
            bytes: num(line, "bytes")?,
            migration_ms: num(line, "migration_ms")?,
            total_ms: num(line, "total_ms")?,
        })
    }

    fn json(&self) -> Value {
        json!({
            "step": self.step, "strategy": self.strategy, "migrations": self.migrations,
            "max_avg_before": self.before, "max_avg_after": self.after,
            "strategy_ms": self.strategy_ms, "collect_ms": self.collect_ms, "bytes": self.bytes,
            "migration_ms": self.migration_ms, "total_ms": self.total_ms,
        })
    }
}

struct RunSample {
    ms_per_iter: f64,
    checksum: String,
    steps: Vec<LbStep>,
}

fn parse_run(prog: Prog, stdout: &str) -> Result<RunSample> {
    let prefix = format!("{} ", prog.bin());
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&prefix) && field(l, "time_per_iter_ms").is_some())
        .ok_or_else(|| {
            anyhow!(
                "{} printed no result line:\n{}",
                prog.bin(),
                tail(stdout, 10)
            )
        })?;
    let sum_line = stdout
        .lines()
        .find(|l| l.starts_with("checksum="))
        .ok_or_else(|| {
            anyhow!(
                "{} printed no checksum line:\n{}",
                prog.bin(),
                tail(stdout, 10)
            )
        })?;
    let pes = num(line, "pes")?;
    if pes != f64::from(PES) {
        bail!("{} ran on {pes} PEs, expected {PES}", prog.bin());
    }
    let steps = stdout
        .lines()
        .filter(|l| l.starts_with("lb step="))
        .map(LbStep::parse)
        .collect::<Result<Vec<_>>>()?;
    Ok(RunSample {
        ms_per_iter: num(line, "time_per_iter_ms")?,
        checksum: field(sum_line, "checksum").unwrap_or_default().to_string(),
        steps,
    })
}

// ---------------------------------------------------------------- replay vs best

/// The dumped statistics files of `dir`, by step number.
fn dumps(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let p = e?.path();
        let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // Statistics are `lb-<coll>-<step>.json`; the live plan beside them is `....plan.json`.
        if name.ends_with(".plan.json") {
            continue;
        }
        let Some(stem) = name
            .strip_prefix("lb-")
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        if let Some(step) = stem
            .rsplit_once('-')
            .and_then(|(_, s)| s.parse::<u64>().ok())
        {
            v.push((step, p));
        }
    }
    v.sort();
    Ok(v)
}

/// The rate-aware plan for one dumped step, against the best possible assignment.
struct Replay {
    step: u64,
    objs: usize,
    speeds: Vec<(u32, f64)>,
    current_ratio: f64,
    plan_ratio: f64,
    best_ratio: f64,
    lower_ratio: f64,
    exact: bool,
    nodes: u64,
    migrations: usize,
    gap: f64,
}

impl Replay {
    fn json(&self) -> Value {
        json!({
            "step": self.step, "objs": self.objs,
            "pe_speeds": self.speeds.iter().map(|(p, s)| json!({ "pe": p, "speed": s })).collect::<Vec<_>>(),
            "current_max_avg": self.current_ratio, "plan_max_avg": self.plan_ratio,
            "best_max_avg": self.best_ratio, "best_lower_bound_max_avg": self.lower_ratio,
            "best_exact": self.exact, "search_nodes": self.nodes, "plan_migrations": self.migrations,
            "gap_to_best": self.gap,
        })
    }
}

fn replay(step: u64, path: &Path) -> Result<Replay> {
    let st = LbStats::load(path).with_context(|| format!("cannot load {}", path.display()))?;
    let strategy = lb::by_name(RATE_AWARE, Params::default())?;
    let plan = strategy.solve(&st)?;
    let plan_ratio = plan.max_avg_ratio(&st, CostModel::RateAware)?;
    let current_ratio = Assignment::current(&st).max_avg_ratio(&st, CostModel::RateAware)?;
    let best = optimal::best(&st, CostModel::RateAware)?;
    Ok(Replay {
        step,
        objs: st.objs.len(),
        speeds: st.pes.iter().map(|p| (p.pe, p.speed)).collect(),
        current_ratio,
        plan_ratio,
        best_ratio: best.ratio(),
        lower_ratio: best.lower_ratio(),
        exact: best.exact,
        nodes: best.nodes,
        migrations: plan.migrations(&st).len(),
        gap: plan_ratio / best.ratio() - 1.0,
    })
}

// ---------------------------------------------------------------- machine info

// ---------------------------------------------------------------- main

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bench_lb: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Samples of one case: per strategy, per rep.
type CaseSamples = Vec<Vec<RunSample>>;

fn real_main() -> Result<ExitCode> {
    let o = Opts::from_cli(&<Cli as clap::Parser>::parse());

    let sitting = Sitting::begin("bench_lb", "lb.json", o.out.clone())?;
    let program = |name: &str| {
        sitting.program(name, "cargo build --release -p ductile-apps --bin bench_lb --bin lbbench --bin jacobi2d -p ductile-operator")
    };
    let ductile = program("ductile")?;
    let lbbench_bin = program("lbbench")?;
    let jacobi_bin = program("jacobi2d")?;
    let bin_of = |p: Prog| match p {
        Prog::Lbbench => &lbbench_bin,
        Prog::Jacobi => &jacobi_bin,
    };
    let (date, nproc, model) = (&sitting.date, sitting.nproc, &sitting.cpu_model);
    let state_base = &sitting.state_base;
    let mut env = Env {
        ductile,
        state_base: state_base.clone(),
        timeout_s: o.child_timeout_s,
        runs: 0,
        prefix: "bench-lb",
    };
    let cases = cases(o.quick);
    let load_start = &sitting.load_start;

    let children = (|| -> Result<_> {
        let mut samples: Vec<CaseSamples> = cases
            .iter()
            .map(|_| STRATEGIES.iter().map(|_| Vec::new()).collect())
            .collect();
        // Reps outermost and the strategy order rotating, so drift hits every strategy alike.
        for rep in 0..o.reps {
            for (ci, c) in cases.iter().enumerate() {
                for k in 0..STRATEGIES.len() {
                    let si = (k + rep) % STRATEGIES.len();
                    let strat = STRATEGIES[si];
                    eprintln!(
                        "bench_lb: {} +lb {strat} rep {}/{}",
                        c.name,
                        rep + 1,
                        o.reps
                    );
                    let out = env.run(
                        &format!("{}-{strat}", c.name),
                        1,
                        PES,
                        bin_of(c.prog),
                        &case_args(c, strat, None),
                    )?;
                    samples[ci][si].push(parse_run(c.prog, &out.stdout)?);
                }
            }
        }
        // One more rate-aware run per case, with its statistics dumped for replay.
        let mut dumped = Vec::new();
        for c in &cases {
            eprintln!(
                "bench_lb: {} +lb {RATE_AWARE} +lb-dump (replay against the best assignment)",
                c.name
            );
            let dir = env.state_base.join(format!("dump-{}", c.name));
            let out = env.run(
                &format!("{}-dump", c.name),
                1,
                PES,
                bin_of(c.prog),
                &case_args(c, RATE_AWARE, Some(&dir)),
            )?;
            let run = parse_run(c.prog, &out.stdout)?;
            let files = dumps(&dir)?;
            let (first, last) = match (files.first(), files.last()) {
                (Some(f), Some(l)) => (f.clone(), l.clone()),
                _ => bail!(
                    "{}: the +lb-dump run wrote no statistics to {}",
                    c.name,
                    dir.display()
                ),
            };
            let first = replay(first.0, &first.1)?;
            let last = replay(last.0, &last.1)?;
            dumped.push((run, first, last));
        }
        Ok((samples, dumped))
    })();
    let _ = std::fs::remove_dir_all(&state_base);
    let (samples, dumped) = children?;
    let load_end = loadavg();

    let mut report = String::new();
    let w = &mut report;
    writeln!(
        w,
        "bench_lb  {date}  nproc={nproc}  cpu={}",
        model.as_deref().unwrap_or("unknown")
    )?;
    writeln!(
        w,
        "parameters: 1 node x {PES} PEs, reps={}, strategies {STRATEGIES:?}, child timeout {} s{}",
        o.reps,
        o.child_timeout_s,
        if o.quick { " (--quick)" } else { "" }
    )?;
    writeln!(
        w,
        "load average (1/5/15 min) at start: {}, at end: {}",
        load_start.as_deref().unwrap_or("unknown"),
        load_end.as_deref().unwrap_or("unknown")
    )?;
    for c in &cases {
        let speed = c.speed.map_or(String::new(), |s| format!(" +pe-speed {s}"));
        writeln!(
            w,
            "  {:<13} {} {}{speed}   ({})",
            c.name,
            c.prog.bin(),
            c.args.join(" "),
            c.what
        )?;
    }

    writeln!(
        w,
        "\nTime per iteration (median of {} jobs [min..max]); max/avg = rate-aware predicted max/avg load; \
         LB cost = median over steps and reps",
        o.reps
    )?;
    writeln!(
        w,
        "  {:<13} | {:<21} | {:>27} | {:>8} | {:>11} | {:>12} | {:>5} | {:>8} | {:>8} | {:>8} | {:>8}",
        "case",
        "strategy",
        "ms/iter",
        "vs Null",
        "after last",
        "before last",
        "migr",
        "strat ms",
        "migr ms",
        "bytes",
        "step ms"
    )?;
    let mut checksum_ok = true;
    let mut mismatches = Vec::new();
    let mut cases_json = Vec::new();
    // (case, recovered fraction) for the rate-aware strategy.
    let mut recovered = Vec::new();
    for (ci, c) in cases.iter().enumerate() {
        let null_ms = median(
            &samples[ci][0]
                .iter()
                .map(|s| s.ms_per_iter)
                .collect::<Vec<_>>(),
        );
        let mut strat_json = Vec::new();
        for (si, strat) in STRATEGIES.iter().enumerate() {
            let runs = &samples[ci][si];
            let ms: Vec<f64> = runs.iter().map(|s| s.ms_per_iter).collect();
            let st = stats(&ms);
            let gain = 1.0 - st.median / null_ms;
            if *strat == RATE_AWARE {
                recovered.push((c.name, c.targeted, gain));
            }
            let last_after: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.steps.last().map(|s| s.after))
                .collect();
            let last_before: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.steps.last().map(|s| s.before))
                .collect();
            let all_steps: Vec<&LbStep> = runs.iter().flat_map(|r| r.steps.iter()).collect();
            let med =
                |f: fn(&LbStep) -> f64| median(&all_steps.iter().map(|s| f(s)).collect::<Vec<_>>());
            let (migr, strat_ms, migr_ms, bytes, total_ms) = (
                med(|s| s.migrations),
                med(|s| s.strategy_ms),
                med(|s| s.migration_ms),
                med(|s| s.bytes),
                med(|s| s.total_ms),
            );
            writeln!(
                w,
                "  {:<13} | {:<21} | {:>27} | {:>7.1}% | {:>11.3} | {:>12.3} | {:>5.0} | {:>8.3} | {:>8.3} | {:>8.0} | {:>8.3}",
                c.name,
                strat,
                format!("{:.3} [{:.3}..{:.3}]", st.median, st.min, st.max),
                gain * 100.0,
                median(&last_after),
                median(&last_before),
                migr,
                strat_ms,
                migr_ms,
                bytes,
                total_ms
            )?;
            strat_json.push(json!({
                "strategy": strat,
                "ms_per_iter": stats_json(&ms),
                "improvement_vs_null": gain,
                "max_avg_after_last_step": stats_json(&last_after),
                "max_avg_before_last_step": stats_json(&last_before),
                "lb_steps_per_run": runs.first().map_or(0, |r| r.steps.len()),
                "lb_step_cost_median": {
                    "migrations": migr, "strategy_ms": strat_ms, "migration_ms": migr_ms,
                    "bytes": bytes, "total_ms": total_ms,
                    "collect_ms": med(|s| s.collect_ms),
                },
                "checksums": runs.iter().map(|r| r.checksum.clone()).collect::<Vec<_>>(),
                "runs": runs.iter().map(|r| json!({
                    "ms_per_iter": r.ms_per_iter, "checksum": r.checksum,
                    "lb_steps": r.steps.iter().map(LbStep::json).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            }));
        }
        // Every run of this case, whatever the strategy (and the dump run), must compute the same thing.
        let (dump_run, first, last) = &dumped[ci];
        let sums: Vec<&str> = samples[ci]
            .iter()
            .flatten()
            .map(|r| r.checksum.as_str())
            .chain(std::iter::once(dump_run.checksum.as_str()))
            .collect();
        let agree = sums.iter().all(|s| *s == sums[0] && !s.is_empty());
        if !agree {
            checksum_ok = false;
            mismatches.push(format!("{}: {sums:?}", c.name));
        }
        let live_after = dump_run.steps.last().map(|s| s.after);
        cases_json.push(json!({
            "case": c.name, "description": c.what, "program": c.prog.bin(), "args": c.args,
            "pe_speed": c.speed, "targeted": c.targeted,
            "checksum": sums[0], "checksums_agree": agree,
            "strategies": strat_json,
            "replay": {
                "dump_run_ms_per_iter": dump_run.ms_per_iter,
                "dump_run_last_step_max_avg_after": live_after,
                "first_step": first.json(),
                "last_step": last.json(),
            },
        }));
    }
    for (ci, c) in cases.iter().enumerate() {
        let sums: Vec<&str> = samples[ci]
            .iter()
            .flatten()
            .map(|r| r.checksum.as_str())
            .collect();
        if !mismatches.iter().any(|m| m.starts_with(c.name)) {
            writeln!(
                w,
                "  {:<13} checksum {} (identical in all {} runs)",
                c.name,
                sums[0],
                sums.len() + 1
            )?;
        }
    }
    for m in &mismatches {
        writeln!(
            w,
            "  !!! CHECKSUM MISMATCH between runs of the same case: {m}"
        )?;
    }

    writeln!(
        w,
        "\n{RATE_AWARE} plan replayed on dumped statistics vs the best possible assignment (rate-aware max/avg)"
    )?;
    writeln!(
        w,
        "  {:<13} | {:>4} | {:>4} | {:>15} | {:>9} | {:>6} | {:>9} | {:>6} | {:>11} | {:>8} | {:>9}",
        "case", "step", "objs", "rel. speeds", "current", "plan", "plan migr", "best", "lower bound", "exact", "gap"
    )?;
    for (ci, c) in cases.iter().enumerate() {
        let (_, first, last) = &dumped[ci];
        for r in [first, last] {
            // Speeds relative to the fastest PE (the runtime measures them in work per second).
            let top = r.speeds.iter().map(|(_, s)| *s).fold(0.0, f64::max);
            let speeds = r
                .speeds
                .iter()
                .map(|(_, s)| format!("{:.2}", s / top))
                .collect::<Vec<_>>()
                .join("/");
            writeln!(
                w,
                "  {:<13} | {:>4} | {:>4} | {:>15} | {:>9.4} | {:>6.4} | {:>9} | {:>6.4} | {:>11.4} | {:>8} | {:>8.2}%",
                c.name,
                r.step,
                r.objs,
                speeds,
                r.current_ratio,
                r.plan_ratio,
                r.migrations,
                r.best_ratio,
                r.lower_ratio,
                r.exact,
                r.gap * 100.0
            )?;
        }
    }

    // Targets.
    // (name, measured value, unit, limit as text, passed)
    type TargetRow = (String, Option<f64>, &'static str, String, Option<bool>);
    let mut targets: Vec<TargetRow> = Vec::new();
    for &(name, targeted, gain) in &recovered {
        if targeted {
            targets.push((
                format!("{name}: {RATE_AWARE} recovers vs Null"),
                Some(gain * 100.0),
                "%",
                format!(">= {}", TARGET_RECOVERED * 100.0),
                Some(gain >= TARGET_RECOVERED),
            ));
        }
    }
    for (ci, c) in cases.iter().enumerate() {
        if c.targeted {
            let last = &dumped[ci].2;
            targets.push((
                format!("{}: plan max/avg vs best (step {})", c.name, last.step),
                Some(last.gap * 100.0),
                "%",
                format!("<= {}", TARGET_GAP_TO_BEST * 100.0),
                Some(last.gap <= TARGET_GAP_TO_BEST),
            ));
        }
    }
    writeln!(w, "\nTargets")?;
    writeln!(
        w,
        "  {:<54} | {:>9} | {:>7} | result",
        "target", "value", "limit"
    )?;
    for (name, v, unit, limit, pass) in &targets {
        let val = v.map_or("-".to_string(), |v| format!("{v:.2} {unit}"));
        writeln!(
            w,
            "  {name:<54} | {val:>9} | {:>7} | {}",
            format!("{limit} {unit}"),
            pass_str(*pass)
        )?;
    }
    print!("{report}");

    sitting.write_json(json!({
        "parameters": {
            "reps": o.reps, "quick": o.quick, "nodes": 1, "pes_per_node": PES,
            "strategies": STRATEGIES, "child_timeout_s": o.child_timeout_s,
            "cost_model": "RateAware",
        },
        "cases": cases_json,
        "targets": targets.iter().map(|(name, v, unit, limit, pass)| json!({
            "name": name, "value": v, "unit": unit, "limit": limit, "pass": pass,
        })).collect::<Vec<_>>(),
        "ok": checksum_ok,
        "table": report,
    }))?;

    if !checksum_ok {
        eprintln!(
            "bench_lb: ERROR: CHECKSUM MISMATCH between runs of the same case: {}",
            mismatches.join("; ")
        );
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}
