//! `bench_cloud`: the papers' experiments on the local cloud (`ductile
//! cloud`), as tables + JSON (`target/bench/cloud.json`) + a plot of the
//! rescale-period sweep (`target/bench/cloud-period.svg`).
//!
//! Every run is a real Jacobi2D job on a fleet of node processes in CPU
//! quotas, driven by the operator's policy; each experiment compares runs
//! made in one sitting against an uninterrupted run of the same job on the
//! same fleet, and checks that every run printed the same checksum.
//!
//! * `modes`: one interruption notice at 4, 8 and 16 instances, handled in
//!   each of `ductile cloud`'s four modes: live rescales, checkpoint +
//!   relaunch with rebalancing (`restart`) and without (`restart-no-lb`),
//!   and periodic disk checkpoints with a kill and a relaunch from the last
//!   one (`checkpoint-restart`), against an uninterrupted run;
//! * `simultaneous`: 16 instances, 1/2/4/8 interruption notices at once,
//!   with proactive replacement (a rebalance recommendation early enough
//!   for the replacements to boot before the notice) and without;
//! * `period`: 8 instances, one live swap (recommendation, replacement,
//!   one commit) every P real seconds: slowdown against P;
//! * `staggered`: 8 instances, a seeded random trace of notices, under
//!   three policies: CompleteReplacement with emergency rescales, Immediate
//!   with emergency rescales, and CompleteReplacement waiting late in the
//!   notice window for the replacement (one commit per notice);
//! * `hetero`: two instance types of different real speed (quota), load
//!   balancing rate-aware against none, against the ideal: an equal-speed
//!   fleet of as many instances with the same total quota, run interleaved
//!   in the same sitting (`--repeat` runs of each, medians), for each CFS
//!   period of `--cpu-period-ms` (the scenario's `cpuPeriodMs`); the mixed
//!   fleet rate-aware twice: from the block map, and with a step before
//!   the first iteration that spreads the blocks by speed
//!   (`jacobi2d --lb-at-start`).
//!
//! This machine has few cores: every instance is one PE, the quotas share
//! 90% of the cores, and the oversubscription is printed with each table.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Context, Result};
use ductile_apps::bench;
use serde_json::{json, Value};

/// One job on one fleet with one scenario.
#[derive(Clone, Debug)]
struct Run {
    label: String,
    instances: u32,
    grid: u32,
    block: u32,
    iters: u32,
    /// Iterations between load-balancing steps (`--lb-every`).
    lb_every: u32,
    /// One more step before the first iteration (`--lb-at-start`).
    lb_at_start: bool,
    lb: &'static str,
    /// More runtime options for the job (e.g. `+lb-dump DIR`).
    extra: Vec<String>,
    /// The rebalance policy's mode.
    mode: &'static str,
    /// How rescales are carried out: `ductile cloud --mode`.
    rescale: &'static str,
    /// `--checkpoint-every` (simulated seconds), for `checkpoint-restart`.
    checkpoint_every: Option<f64>,
    emergency: bool,
    /// `instanceTypes` and `fleet` of the scenario.
    fleet: String,
    time_factor: f64,
    events: Vec<String>,
    random: Option<String>,
    cpu_per_speed: Option<f64>,
    /// The scenario's `cpuPeriodMs`; `None`: its default.
    cpu_period_ms: Option<f64>,
}

impl Run {
    fn job_yaml(&self) -> String {
        format!(
            "apiVersion: ductile.dev/v1alpha1
kind: ElasticJob
metadata: {{ name: j }}
spec:
  replicas: {n}
  minReplicas: 1
  pesPerPod: 1
  template:
    spec:
      containers:
        - name: node
          image: apps
          command: [jacobi2d, --grid, '{g}', --block, '{b}', --iters, '{i}', --residual-every, '100', --lb-every, '{le}'{start}, +lb, {lb}{extra}]
          env: [{{ name: DUCTILE_LOG, value: warn }}]
  onDemand: {{ replicas: 1 }}
  rescalePolicy:
    rebalance: {{ mode: {mode}, timeoutSeconds: 120 }}
    emergencyOnInterruption: {em}
    shrinkWhenNoReplacement: true
",
            n = self.instances,
            g = self.grid,
            b = self.block,
            i = self.iters,
            le = self.lb_every,
            start = if self.lb_at_start { ", --lb-at-start" } else { "" },
            lb = self.lb,
            extra = self.extra.iter().map(|a| format!(", '{a}'")).collect::<String>(),
            mode = self.mode,
            em = self.emergency
        )
    }

    fn scenario_yaml(&self) -> String {
        let mut s = format!("timeFactor: {}\n", self.time_factor);
        if let Some(c) = self.cpu_per_speed {
            s += &format!("cpuPerSpeed: {c}\n");
        }
        if let Some(p) = self.cpu_period_ms {
            s += &format!("cpuPeriodMs: {p}\n");
        }
        s += &self.fleet;
        if !self.events.is_empty() {
            s += "events:\n";
            for e in &self.events {
                s += &format!("  - {e}\n");
            }
        }
        if let Some(r) = &self.random {
            s += &format!("random: {r}\n");
        }
        s
    }
}

/// What a run measured.
#[derive(Clone, Debug)]
struct Outcome {
    label: String,
    /// The job's own compute time (jacobi2d's `seconds=`).
    seconds: f64,
    checksum: String,
    summary: Value,
    rescales: u64,
    /// Each committed rescale's stage times summed, ms.
    mechanisms: Vec<f64>,
    /// Elements the relaunched jobs' first steps moved, summed (relaunching modes).
    moved: u64,
    /// `cloud.json`'s record.
    record: Value,
}

const HOMOGENEOUS: &str = "instanceTypes:
  - { name: m5.large, pes: 1, speed: 1.0, price: { onDemand: 0.096, spot: 0.037 } }
fleet: { onDemand: m5.large, spot: [m5.large], bootSeconds: 40 }
";

struct Bench {
    ductile: PathBuf,
    path_env: String,
    dir: PathBuf,
    quick: bool,
}

impl Bench {
    fn run(&self, run: &Run) -> Result<Outcome> {
        let dir = self.dir.join(run.label.replace([' ', '/', '='], "_"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("job.yaml"), run.job_yaml())?;
        std::fs::write(dir.join("scenario.yaml"), run.scenario_yaml())?;
        let mut cmd = Command::new(&self.ductile);
        cmd.args(["cloud", "--no-verify", "--timeout", "600", "--mode", run.rescale]);
        if let Some(every) = run.checkpoint_every {
            cmd.arg("--checkpoint-every").arg(every.to_string());
        }
        let out = cmd
            .arg("-f")
            .arg(dir.join("job.yaml"))
            .arg("-s")
            .arg(dir.join("scenario.yaml"))
            .arg("--out")
            .arg(&dir)
            .arg("--state-dir")
            .arg(dir.join("s"))
            .env("PATH", &self.path_env)
            .stdin(Stdio::null())
            .output()
            .context("running ductile cloud")?;
        let log = std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
        if !out.status.success() {
            bail!(
                "{}: ductile cloud exited {:?}:\n{}\n{}",
                run.label,
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                bench::tail(&log, 20)
            );
        }
        let record: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("cloud.json"))?)?;
        let line = log
            .lines()
            .rev()
            .find(|l| l.starts_with("jacobi2d "))
            .ok_or_else(|| anyhow!("{}: no jacobi2d summary line in job.log", run.label))?;
        let rescales = record["summary"]["committedByReason"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
        Ok(Outcome {
            label: run.label.clone(),
            seconds: bench::num(line, "seconds")?,
            checksum: record["record"]["checksum"].as_str().unwrap_or("-").to_owned(),
            summary: record["summary"].clone(),
            rescales,
            mechanisms: record["record"]["rescales"]
                .as_array()
                .map(|r| r.iter().filter_map(|r| r["mechanismMs"].as_f64()).collect())
                .unwrap_or_default(),
            moved: record["record"]["rescales"]
                .as_array()
                .map_or(0, |r| r.iter().filter_map(|r| r["migrations"].as_u64()).sum()),
            record: record["record"].clone(),
        })
    }

    fn base(&self, label: &str, instances: u32, iters: u32) -> Run {
        Run {
            label: label.to_owned(),
            instances,
            grid: if self.quick { 512 } else { 1024 },
            block: 64,
            iters: if self.quick { iters / 4 } else { iters },
            lb_every: 20,
            lb_at_start: false,
            extra: Vec::new(),
            // Jacobi2D's load is uniform: no steady-state balancing, so the
            // runs differ only by what the cloud did (a rescale still
            // evacuates and populates with +lb-rescale's strategy).
            lb: "Null",
            mode: "CompleteReplacement",
            rescale: "live",
            checkpoint_every: None,
            emergency: true,
            fleet: HOMOGENEOUS.to_owned(),
            time_factor: 20.0,
            events: Vec::new(),
            random: None,
            cpu_per_speed: None,
            cpu_period_ms: None,
        }
    }
}

fn overhead(o: &Outcome, base: &Outcome) -> f64 {
    100.0 * (o.seconds / base.seconds - 1.0)
}

fn row(o: &Outcome, base: &Outcome, extra: &str) -> String {
    format!(
        "| {} | {:.2} | {:+.1}% | {} | {} | {}{} |",
        o.label,
        o.seconds,
        overhead(o, base),
        o.rescales,
        o.summary["noticesHandled"],
        if o.checksum == base.checksum { "same" } else { "DIFFERS" },
        extra
    )
}

fn outcome_json(o: &Outcome, base: &Outcome) -> Value {
    json!({
        "label": o.label, "seconds": o.seconds, "overheadPct": overhead(o, base),
        "rescales": o.rescales, "checksum": o.checksum, "checksumEqual": o.checksum == base.checksum,
        "summary": o.summary,
    })
}

/// `checkpoint-restart`'s period in simulated seconds: at time factor 20,
/// a checkpoint every 2.5 s real.
const CHECKPOINT_EVERY: f64 = 50.0;
/// When `modes`' notice comes (simulated seconds): early enough for the
/// 4-instance job (about 7 s real, 140 s simulated), and half a period
/// after `checkpoint-restart`'s first checkpoint, the average loss of a
/// notice at a random time.
const MODES_NOTICE_AT: f64 = 75.0;

/// One interruption notice at 4, 8 and 16 instances, in each of the four
/// modes, against an uninterrupted run.
fn modes(b: &Bench) -> Result<Value> {
    let mut rows = Vec::new();
    let mut out = Vec::new();
    for n in [4u32, 8, 16] {
        let base = b.run(&b.base(&format!("{n} instances, no interruption"), n, 2000))?;
        rows.push(row(&base, &base, " | - | - | -"));
        out.push(outcome_json(&base, &base));
        for rescale in ["live", "restart", "restart-no-lb", "checkpoint-restart"] {
            let mut r = b.base(&format!("{n} instances, 1 notice, {rescale}"), n, 2000);
            r.rescale = rescale;
            if rescale == "checkpoint-restart" {
                r.checkpoint_every = Some(CHECKPOINT_EVERY);
            }
            r.events.push(format!("{{ at: {MODES_NOTICE_AT}, interruption: j-{}, deadline: 120 }}", n - 1));
            let o = b.run(&r)?;
            let ms: Vec<String> = o.mechanisms.iter().map(|m| format!("{m:.0}")).collect();
            let moved = if rescale == "live" { "-".to_owned() } else { o.moved.to_string() };
            let ckpt = if rescale == "checkpoint-restart" {
                format!(
                    "{} ({:.2} s), {:.2} s redone",
                    o.summary["checkpoints"],
                    o.summary["checkpointS"].as_f64().unwrap_or(0.0),
                    o.summary["redoneS"].as_f64().unwrap_or(0.0)
                )
            } else {
                "-".to_owned()
            };
            rows.push(row(&o, &base, &format!(" | {} | {moved} | {ckpt}", ms.join(", "))));
            let mut j = outcome_json(&o, &base);
            j["mode"] = json!(rescale);
            j["mechanismsMs"] = json!(o.mechanisms);
            j["moved"] = json!(o.moved);
            j["checkpointEvery"] = json!(r.checkpoint_every);
            out.push(j);
        }
    }
    println!("\n## one interruption by mode (notice at {MODES_NOTICE_AT} s simulated; instances of 1 PE on this machine's cores; checkpoint-restart every {CHECKPOINT_EVERY} s simulated)\n");
    println!("| run | seconds | overhead | rescales | notices handled | checksum | ms per rescale | elements moved after restore | checkpoints (their time), work redone |\n|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    Ok(json!(out))
}

/// 16 instances, k notices at once, with and without proactive replacement.
fn simultaneous(b: &Bench) -> Result<Value> {
    let base = b.run(&b.base("16 instances, no interruption", 16, 2000))?;
    let mut rows = vec![row(&base, &base, "")];
    let mut out = vec![outcome_json(&base, &base)];
    for k in [1u32, 2, 4, 8] {
        for proactive in [true, false] {
            let mut r = b.base(&format!("{k} at once, {}", if proactive { "proactive" } else { "notice only" }), 16, 2000);
            for m in 1..=k {
                if proactive {
                    r.events.push(format!("{{ at: 20, rebalanceRecommendation: j-{m} }}"));
                }
                r.events.push(format!("{{ at: 120, interruption: j-{m}, deadline: 120 }}"));
            }
            let o = b.run(&r)?;
            rows.push(row(&o, &base, ""));
            out.push(outcome_json(&o, &base));
        }
    }
    println!("\n## simultaneous interruptions (16 instances of 1 PE on this machine's cores)\n");
    println!("| run | seconds | overhead | rescales | notices handled | checksum |\n|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    Ok(json!(out))
}

/// One live swap every P real seconds, 8 instances.
fn period(b: &Bench) -> Result<(Value, Vec<(f64, f64)>)> {
    let base = b.run(&b.base("8 instances, no rescale", 8, 3000))?;
    let mut rows = vec![row(&base, &base, " | -")];
    let mut out = vec![outcome_json(&base, &base)];
    let mut curve = Vec::new();
    let factor = 20.0;
    for p in [2.0f64, 4.0, 8.0, 16.0] {
        let mut r = b.base(&format!("a swap every {p} s"), 8, 3000);
        r.mode = "Immediate";
        // Boot quicker than the period, so each recommendation is one swap.
        r.fleet = HOMOGENEOUS.replace("bootSeconds: 40", &format!("bootSeconds: {}", (p * factor / 2.0).min(40.0)));
        let horizon = 120.0 * factor;
        let mut t = p * factor;
        let mut i = 0u32;
        while t < horizon {
            let victim = if i < 7 { format!("j-{}", i + 1) } else { format!("j-n{}", i - 7) };
            r.events.push(format!("{{ at: {t}, rebalanceRecommendation: {victim} }}"));
            t += p * factor;
            i += 1;
        }
        let o = b.run(&r)?;
        curve.push((p, overhead(&o, &base)));
        rows.push(row(&o, &base, &format!(" | {:.2}", o.seconds / o.rescales.max(1) as f64)));
        out.push(outcome_json(&o, &base));
    }
    println!("\n## rescale-period sweep (8 instances of 1 PE, one swap per period)\n");
    println!("| run | seconds | overhead | rescales | notices handled | checksum | s per rescale |\n|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    Ok((json!(out), curve))
}

/// Staggered random notices under three policies, 8 instances.
fn staggered(b: &Bench) -> Result<Value> {
    let base = b.run(&b.base("8 instances, no interruption", 8, 3000))?;
    let mut rows = vec![row(&base, &base, " | - | -")];
    let mut out = vec![outcome_json(&base, &base)];
    let trace = "{ seed: 7, noticesPerInstanceHour: 40, batch: 1, recommendationLead: 0, deadline: 120, until: 600 }";
    for (label, mode, emergency) in [
        ("CompleteReplacement + emergency", "CompleteReplacement", true),
        ("Immediate + emergency", "Immediate", true),
        ("CompleteReplacement, late (no emergency)", "CompleteReplacement", false),
    ] {
        let mut r = b.base(label, 8, 3000);
        r.mode = mode;
        r.emergency = emergency;
        r.random = Some(trace.to_owned());
        let o = b.run(&r)?;
        rows.push(row(
            &o,
            &base,
            &format!(
                " | {:.0} | {:.0}",
                o.summary["idleNewcomerSeconds"].as_f64().unwrap_or(0.0),
                o.summary["memberSecondsShort"].as_f64().unwrap_or(0.0)
            ),
        ));
        out.push(outcome_json(&o, &base));
    }
    println!("\n## staggered random interruptions (8 instances of 1 PE, seeded trace)\n");
    println!("| policy | seconds | overhead | rescales | notices handled | checksum | idle newcomer inst-s | member-s short |\n|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    Ok(json!(out))
}

/// Blocks per PE in the last statistics a job dumped (`+lb-dump DIR`): the
/// placement its last step measured.
fn blocks_per_pe(dump: &Path) -> Vec<u64> {
    let last = std::fs::read_dir(dump)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let step: u64 = name.strip_suffix(".json")?.rsplit('-').next()?.parse().ok()?;
            Some((step, name))
        })
        .max();
    let Some((_, name)) = last else { return Vec::new() };
    let Ok(stats) = std::fs::read_to_string(dump.join(name)).map_err(anyhow::Error::from).and_then(|t| Ok(serde_json::from_str::<Value>(&t)?)) else {
        return Vec::new();
    };
    let pes = stats["pes"].as_array().map_or(0, Vec::len);
    let mut count = vec![0u64; pes];
    for o in stats["objs"].as_array().into_iter().flatten() {
        if let Some(c) = o["pe"].as_u64().and_then(|p| count.get_mut(p as usize)) {
            *c += 1;
        }
    }
    count
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Two instance types of different real speed (quota), balanced rate-aware
/// or not, against the ideal: the same job on an equal-speed fleet of as
/// many instances with the same total quota, run in the same sitting,
/// interleaved with the mixed runs so that the machine's load falls on
/// both alike.
fn hetero(b: &Bench, repeat: usize, periods: &[f64]) -> Result<Value> {
    let types = "instanceTypes:
  - { name: fast, pes: 1, speed: 1.0, price: { onDemand: 0.1, spot: 0.04 } }
  - { name: slow, pes: 1, speed: 0.5, price: { onDemand: 0.05, spot: 0.02 } }
  - { name: even, pes: 1, speed: 0.75, price: { onDemand: 0.075, spot: 0.03 } }
";
    let cpu = 0.6;
    // Mixed: 0.6 + 0.3 + 0.6 + 0.3 cores; equal: 4 x 0.45, the same 1.8.
    let mixed = format!("{types}fleet: {{ onDemand: fast, spot: [slow, fast, slow] }}\n");
    let equal = format!("{types}fleet: {{ onDemand: even, spot: [even, even, even] }}\n");
    // The last: the blocks spread by the PEs' speeds before the first
    // iteration (`jacobi2d --lb-at-start`), where the others start even
    // and meet their first step at iteration 50.
    let configs: [(&str, &String, &'static str, bool); 5] = [
        ("equal 4 x 0.45 core (ideal)", &equal, "Null", false),
        ("equal 4 x 0.45 core", &equal, "ContiguousRateAware", false),
        ("mixed 2 x 0.6 + 2 x 0.3 core", &mixed, "Null", false),
        ("mixed 2 x 0.6 + 2 x 0.3 core", &mixed, "ContiguousRateAware", false),
        ("mixed 2 x 0.6 + 2 x 0.3 core, a step at start", &mixed, "ContiguousRateAware", true),
    ];
    // Compute-bound and short: 2048² in 128² blocks (256 blocks, 4x the
    // work per message of 1024² in 64² blocks), a step every 50 iterations.
    let (grid, block, iters) = if b.quick { (1024, 64, 200) } else { (2048, 128, 400) };
    // seconds[period][config]
    let mut seconds = vec![vec![Vec::new(); configs.len()]; periods.len()];
    let mut runs = Vec::new();
    let mut reference: Option<String> = None;
    let mut same = true;
    for rep in 0..repeat {
        for (p, &period) in periods.iter().enumerate() {
            for (c, (fleet_label, fleet, lb, at_start)) in configs.iter().enumerate() {
                let label = format!("{fleet_label}, +lb {lb}, period {period} ms, run {}", rep + 1);
                // A short name: the run's directory holds the launcher's socket.
                let mut r = b.base(&format!("het{c}p{p}r{rep}"), 4, iters);
                r.grid = grid;
                r.block = block;
                r.iters = iters;
                r.lb_every = 50;
                r.lb_at_start = *at_start;
                r.lb = lb;
                r.fleet = (*fleet).clone();
                r.cpu_per_speed = Some(cpu);
                r.cpu_period_ms = Some(period);
                let dump = b.dir.join(format!("hetero-dump-{c}-{p}-{rep}"));
                let _ = std::fs::remove_dir_all(&dump);
                r.extra = vec!["+lb-report".into(), "+lb-dump".into(), dump.display().to_string()];
                let load = bench::loadavg().unwrap_or_default();
                let o = b.run(&r)?;
                let blocks = blocks_per_pe(&dump);
                // Steps that moved blocks (the others kept the placement).
                let log = std::fs::read_to_string(b.dir.join(&r.label).join("job.log")).unwrap_or_default();
                let steps = log.lines().filter(|l| l.starts_with("lb step=")).count();
                let moving = log.lines().filter(|l| l.starts_with("lb step=") && !l.contains(" migrations=0 ")).count();
                let _ = std::fs::remove_dir_all(&dump);
                same &= reference.get_or_insert_with(|| o.checksum.clone()) == &o.checksum;
                seconds[p][c].push(o.seconds);
                runs.push(json!({
                    "fleet": fleet_label, "lb": lb, "cpuPeriodMs": period, "run": rep + 1, "seconds": o.seconds, "checksum": o.checksum,
                    "blocksPerPe": blocks, "lbSteps": steps, "movingSteps": moving, "throttled": o.record["throttled"], "loadBefore": load,
                }));
                let throttled: Vec<String> = o.record["throttled"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| format!("{:.2}", t["seconds"].as_f64().unwrap_or(0.0)))
                    .collect();
                eprintln!(
                    "{label}: {:.2} s, blocks per PE {blocks:?} (measured at the last step), {moving} of {steps} steps moved, throttled s per instance [{}], load {load}",
                    o.seconds,
                    throttled.join(", ")
                );
            }
        }
    }
    let mut rows = Vec::new();
    let mut out = Vec::new();
    for (p, &period) in periods.iter().enumerate() {
        // Each period against its own ideal: the equal fleet at that period.
        let ideal = median(&seconds[p][0]);
        for (c, (fleet_label, _, lb, _)) in configs.iter().enumerate() {
            let v = &seconds[p][c];
            let m = median(v);
            // Each sitting's ratio to the ideal run next to it.
            let ratios: Vec<f64> = v.iter().zip(&seconds[p][0]).map(|(s, i)| s / i).collect();
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(0.0, f64::max);
            rows.push(format!(
                "| {period} ms | {fleet_label} | `{lb}` | {m:.2} [{min:.2}..{max:.2}] | {:+.1}% | {:+.1}% |",
                100.0 * (m / ideal - 1.0),
                100.0 * (median(&ratios) - 1.0),
            ));
            out.push(json!({
                "fleet": fleet_label, "lb": lb, "cpuPeriodMs": period, "seconds": v, "medianSeconds": m,
                "aboveIdealPct": 100.0 * (m / ideal - 1.0), "medianPairRatio": median(&ratios), "idealSeconds": ideal,
            }));
        }
    }
    println!("\n## heterogeneous fleet ({repeat} runs of each, interleaved; jacobi2d {grid}² in {block}² blocks, {iters} iterations, a step every 50)\n");
    println!("| CFS period | fleet | `+lb` | seconds: median [min..max] | median above ideal | median of per-sitting ratios |\n|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    println!("\nchecksums: {}", if same { "all the same" } else { "DIFFER" });
    Ok(json!({ "configs": out, "runs": runs, "checksumsEqual": same }))
}

fn period_svg(curve: &[(f64, f64)]) -> String {
    let (w, h, l, t, pw, ph) = (560.0, 320.0, 60.0, 30.0, 460.0, 230.0);
    let max_p = curve.iter().map(|c| c.0).fold(1.0, f64::max);
    let max_o = curve.iter().map(|c| c.1).fold(1.0, f64::max) * 1.1;
    let x = |p: f64| l + pw * (p.log2() + 1.0) / (max_p.log2() + 1.0);
    let y = |o: f64| t + ph * (1.0 - o.max(0.0) / max_o);
    let pts: Vec<String> = curve.iter().map(|(p, o)| format!("{:.1},{:.1}", x(*p), y(*o))).collect();
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="{w}" height="{h}" fill="white"/><text x="{l}" y="18">slowdown against rescale period (live swaps, 8 instances)</text><polyline points="{}" fill="none" stroke="#1f77b4" stroke-width="2"/><line x1="{l}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#d62728" stroke-dasharray="4 3"/><text x="{}" y="{:.1}" fill="#d62728">1%</text><line x1="{l}" x2="{l}" y1="{t}" y2="{}" stroke="#000"/><line x1="{l}" x2="{}" y1="{}" y2="{}" stroke="#000"/>"##,
        pts.join(" "),
        l + pw,
        y(1.0),
        y(1.0),
        l + pw + 4.0,
        y(1.0) + 4.0,
        t + ph,
        l + pw,
        t + ph,
        t + ph
    );
    for (p, o) in curve {
        s += &format!(
            r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#1f77b4"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{p} s</text><text x="{:.1}" y="{:.1}" text-anchor="middle">{o:.1}%</text>"##,
            x(*p),
            y(*o),
            x(*p),
            t + ph + 16.0,
            x(*p),
            y(*o) - 8.0
        );
    }
    s += &format!(r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">rescale period (real seconds)</text><text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle">overhead</text></svg>"#, l + pw / 2.0, t + ph + 34.0, t + ph / 2.0, t + ph / 2.0);
    s
}

/// The papers' experiments on the local cloud (docs/benchmarks.md).
#[derive(clap::Parser, Debug)]
#[command(name = "bench_cloud", about = "Runs the local-cloud experiments; writes target/bench/cloud.json and cloud-period.svg")]
struct Args {
    /// Experiments to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "modes,simultaneous,period,staggered,hetero")]
    experiments: Vec<Experiment>,
    /// Shorter jobs (a quarter of the iterations, a smaller grid): checks the harness, not the figures.
    #[arg(long)]
    quick: bool,
    /// `hetero`: runs of each fleet and strategy (medians are reported).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// `hetero`: the CFS periods of the instances' quotas to compare, ms
    /// (the scenario's `cpuPeriodMs`), run interleaved.
    #[arg(long, value_delimiter = ',', default_value = "10", value_parser = parse_period)]
    cpu_period_ms: Vec<f64>,
}

fn parse_period(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (1.0..=1000.0).contains(&p) => Ok(p),
        _ => Err(format!("{s:?} is not a CFS period from 1 to 1000 ms")),
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Experiment {
    Modes,
    Simultaneous,
    Period,
    Staggered,
    Hetero,
}

fn main() -> Result<()> {
    let args = <Args as clap::Parser>::parse();
    let quick = args.quick;
    let (bin_dir, target) = bench::bin_and_target_dirs()?;
    let ductile = bench::sibling(&bin_dir, "ductile", "bench_cloud", "cargo build --release --workspace --bins")?;
    bench::sibling(&bin_dir, "jacobi2d", "bench_cloud", "cargo build --release --workspace --bins")?;
    let out_dir = target.join("bench");
    let b = Bench {
        ductile,
        path_env: format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default()),
        dir: out_dir.join("cloud-runs"),
        quick,
    };
    let load_before = bench::loadavg();
    let mut results = serde_json::Map::new();
    let has = |w: Experiment| args.experiments.contains(&w);
    if has(Experiment::Modes) {
        results.insert("modes".into(), modes(&b)?);
    }
    if has(Experiment::Simultaneous) {
        results.insert("simultaneous".into(), simultaneous(&b)?);
    }
    if has(Experiment::Period) {
        let (v, curve) = period(&b)?;
        results.insert("period".into(), v);
        std::fs::write(out_dir.join("cloud-period.svg"), period_svg(&curve))?;
    }
    if has(Experiment::Staggered) {
        results.insert("staggered".into(), staggered(&b)?);
    }
    if has(Experiment::Hetero) {
        results.insert("hetero".into(), hetero(&b, args.repeat.max(1), &args.cpu_period_ms)?);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = json!({
        "bench": "cloud",
        "quick": quick,
        "machine": { "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1), "cpu": bench::cpu_model(), "loadBefore": load_before.clone(), "loadAfter": bench::loadavg() },
        "commit": bench::git_commit(&root),
        "results": results,
    });
    std::fs::create_dir_all(&out_dir)?;
    std::fs::write(out_dir.join("cloud.json"), serde_json::to_string_pretty(&doc)?)?;
    // Each experiment on its own too, so a later sitting of another one
    // does not overwrite it.
    for (name, result) in &results {
        let mut one = doc.clone();
        one["results"] = json!({ name.clone(): result });
        std::fs::write(out_dir.join(format!("cloud-{name}.json")), serde_json::to_string_pretty(&one)?)?;
    }
    println!("\nload average before {}, after {}", load_before.unwrap_or_default(), bench::loadavg().unwrap_or_default());
    println!("wrote {}", out_dir.join("cloud.json").display());
    Ok(())
}
