//! `bench_core`: the core performance numbers of Ductile, side by side, in one run.
//!
//! ```text
//! bench_core [--reps N] [--iters K] [--grid N] [--quick] [--skip-pingpong] [--skip-jacobi]
//!            [--budget-ms MS] [--child-timeout SECS] [--out PATH]
//! ```
//!
//! It measures, by launching the sibling `ductile`, `pingpong` and `jacobi2d`
//! binaries (found next to this executable) as ordinary jobs:
//!
//! 1. pingpong one-way latency and bandwidth, same node (1 node x 2 PEs) and
//!    across nodes (2 nodes x 1 PE) over the TCP transport on loopback and,
//!    when the binaries were built with the `ucx` feature, over UCX shared
//!    memory and UCX's tcp on loopback, median/min/max over `--reps` jobs per
//!    layout; beside them `ucx_perftest` (ucx-utils) on the same machine:
//!    `tag_lat` 8 B, `tag_lat` and `tag_bw` 4 MiB, server and client on
//!    loopback, with the same `UCX_TLS`;
//! 2. Jacobi2D time per iteration on a `--grid`² grid at 1 and 2 PEs with 1, 4
//!    and 16 blocks per PE, median/min/max over `--reps` jobs, and checks that
//!    every run printed the same checksum;
//! 3. the memory-bandwidth bound for that stencil, from a STREAM-triad-like
//!    kernel run in this process with 1 and 2 threads: a 5-point sweep moves at
//!    least 16 bytes per point (read one grid, write the other), so an
//!    iteration takes at least `16 * points / bandwidth`.
//!
//! It prints a table and writes every raw sample, the medians and the targets
//! (with pass/fail flags) as JSON to `target/bench/core.json` (or `--out`).
//! It exits non-zero when a child run fails or times out, or when Jacobi
//! checksums disagree; a missed performance target is reported, not an error.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Barrier;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use ductile_apps::args;
use ductile_apps::bench::*;
use serde_json::{json, Value};

const PINGPONG_SIZES: &[usize] = &[8, 1024, 65536, 1 << 20, 4 << 20];
const PINGPONG_SIZES_QUICK: &[usize] = &[8, 1024, 65536];
const BLOCKS_PER_PE: &[u32] = &[1, 4, 16];
const JACOBI_PES: &[u32] = &[1, 2];
/// Bytes a 5-point Jacobi sweep moves per point at least: read one f64 grid, write another.
const JACOBI_BYTES_PER_POINT: f64 = 16.0;
/// Bytes a triad moves per element as counted by STREAM: read b and c, write a.
const TRIAD_BYTES_PER_ELEM: f64 = 24.0;

// Targets.
const TARGET_INTRA_8B_US: f64 = 1.0;
const TARGET_CROSS_8B_US: f64 = 15.0;
const TARGET_UCX_SHM_8B_US: f64 = 1.0;
/// Pingpong bandwidth at the largest size over UCX / `ucx_perftest tag_bw`.
const TARGET_UCX_VS_PERFTEST: f64 = 0.8;
/// Size of the `ucx_perftest` bandwidth runs (and of the pingpong row compared with it).
const PERFTEST_BIG: usize = 4 << 20;
/// `ucx_perftest` prints MB/s as 2^20 bytes per second; this bench uses 10^6.
const MIB_TO_MB: f64 = 1.048_576;
const TARGET_JACOBI_VS_BOUND: f64 = 1.5;
const TARGET_OVERDECOMP_4: f64 = 0.10;

struct Opts {
    reps: usize,
    iters: u64,
    grid: u32,
    quick: bool,
    skip_pingpong: bool,
    skip_jacobi: bool,
    budget_ms: f64,
    child_timeout_s: u64,
    out: Option<PathBuf>,
    triad_mib: usize,
    triad_passes: usize,
}

/// The command line (`bench_core --help`).
#[derive(clap::Parser, Debug)]
#[command(
    name = "bench_core",
    about = "Pingpong latency/bandwidth, Jacobi2D time per iteration and the memory-bandwidth bound, side by side; writes target/bench/core.json"
)]
struct Cli {
    #[command(flatten)]
    bench: args::BenchArgs,
    /// Jacobi2D iterations per job [default: 30, or 10 with --quick].
    #[arg(long, value_name = "K", value_parser = args::at_least_one::<u64>)]
    iters: Option<u64>,
    /// Jacobi2D grid side in points, at least 64 [default: 4096, or 512 with --quick].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(64..))]
    grid: Option<u32>,
    /// Skip the pingpong rows.
    #[arg(long)]
    skip_pingpong: bool,
    /// Skip the Jacobi2D rows.
    #[arg(long)]
    skip_jacobi: bool,
    /// Pingpong time per message size, in ms [default: 200, or 20 with --quick].
    #[arg(long = "budget-ms", value_name = "MS")]
    budget_ms: Option<f64>,
}

impl Opts {
    fn from_cli(c: Cli) -> Opts {
        let b = &c.bench;
        Opts {
            reps: b.reps(),
            iters: b.pick(c.iters, 10, 30),
            grid: b.pick(c.grid, 512, 4096),
            quick: b.quick,
            skip_pingpong: c.skip_pingpong,
            skip_jacobi: c.skip_jacobi,
            budget_ms: b.pick(c.budget_ms, 20.0, 200.0),
            child_timeout_s: b.child_timeout_s(300),
            out: b.out.clone(),
            triad_mib: b.pick(None, 16, 64),
            triad_passes: b.pick(None, 4, 10),
        }
    }
}

// ---------------------------------------------------------------- statistics

// ---------------------------------------------------------------- pingpong

/// How the nodes of a pingpong job talk: the runtime's transport and, for
/// UCX, the UCX variables of the launcher and its nodes.
#[derive(Clone, Copy, PartialEq)]
enum Wire {
    Tcp,
    UcxShm,
    UcxTcp,
}

impl Wire {
    fn label(self) -> &'static str {
        match self {
            Wire::Tcp => "TCP transport",
            Wire::UcxShm => "UCX shm",
            Wire::UcxTcp => "UCX tcp on lo",
        }
    }

    /// Variables for the job (`None`: removed), so the row measures what
    /// it says whatever the caller's environment holds.
    fn vars(self) -> Vec<(&'static str, Option<&'static str>)> {
        match self {
            Wire::Tcp => vec![("DUCTILE_TRANSPORT", Some("tcp"))],
            Wire::UcxShm => vec![
                ("DUCTILE_TRANSPORT", Some("ucx")),
                ("UCX_TLS", None),
                ("UCX_NET_DEVICES", None),
            ],
            Wire::UcxTcp => vec![
                ("DUCTILE_TRANSPORT", Some("ucx")),
                ("UCX_TLS", Some("tcp")),
                ("UCX_NET_DEVICES", Some("lo")),
            ],
        }
    }

    /// The UCX variables alone (for `ucx_perftest`).
    fn ucx_vars(self) -> Vec<(&'static str, Option<&'static str>)> {
        self.vars()
            .into_iter()
            .filter(|(n, _)| n.starts_with("UCX_"))
            .collect()
    }
}

struct Layout {
    name: &'static str,
    nodes: u32,
    pes: u32,
    wire: Wire,
}

const LAYOUTS: &[Layout] = &[
    Layout {
        name: "same-node",
        nodes: 1,
        pes: 2,
        wire: Wire::Tcp,
    },
    Layout {
        name: "cross-node",
        nodes: 2,
        pes: 1,
        wire: Wire::Tcp,
    },
    Layout {
        name: "cross-node-ucx-shm",
        nodes: 2,
        pes: 1,
        wire: Wire::UcxShm,
    },
    Layout {
        name: "cross-node-ucx-tcp",
        nodes: 2,
        pes: 1,
        wire: Wire::UcxTcp,
    },
];

/// Whether the nodes were built with the `ucx` feature: a one-round-trip
/// job with `DUCTILE_TRANSPORT=ucx` either runs or is refused at startup
/// with "not built into this program". Any other failure is an error.
fn ucx_built(env: &mut Env, bin: &Path) -> Result<bool> {
    let args: Vec<String> = ["--sizes", "8", "--min-iters", "1", "--budget-ms", "1"]
        .map(String::from)
        .into();
    match env.run_with_env("ucx-probe", 2, 1, bin, &args, &Wire::UcxShm.vars()) {
        Ok(_) => Ok(true),
        Err(e) if format!("{e:#}").contains("not built into this program") => Ok(false),
        Err(e) => Err(e.context("a UCX pingpong failed (not for want of the `ucx` feature)")),
    }
}

// ---------------------------------------------------------------- ucx_perftest

/// One `ucx_perftest` measurement.
struct PerfSample {
    wire: Wire,
    test: &'static str,
    size: usize,
    /// One-way latency, µs (typical = median, as printed for `tag_lat`; average for `tag_bw`).
    latency_us: f64,
    /// Bandwidth in 10^6 bytes/s (converted from its MiB/s).
    bandwidth_mbps: f64,
    line: String,
}

/// The `ucx_perftest` runs of one repetition: (test, size, iterations, warm-up).
fn perftest_plan(quick: bool) -> Vec<(&'static str, usize, u32, u32)> {
    let k = if quick { 10 } else { 1 };
    vec![
        ("tag_lat", 8, 100_000 / k, 10_000 / k),
        ("tag_lat", PERFTEST_BIG, 100 / k, 10 / k),
        ("tag_bw", PERFTEST_BIG, 200 / k, 20 / k),
    ]
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// Runs a `ucx_perftest` server and client on loopback with `wire`'s UCX
/// variables and parses the client's `Final:` line.
fn run_perftest(
    exe: &Path,
    wire: Wire,
    test: &'static str,
    size: usize,
    iters: u32,
    warmup: u32,
) -> Result<PerfSample> {
    use std::process::{Command, Stdio};
    let with_vars = |cmd: &mut Command| {
        for (n, v) in wire.ucx_vars() {
            match v {
                Some(v) => cmd.env(n, v),
                None => cmd.env_remove(n),
            };
        }
    };
    let mut last_err = String::new();
    // The server must listen before the client connects: retry a few times.
    for _ in 0..3 {
        let port = free_port()?.to_string();
        let mut server = Command::new(exe);
        server
            .args(["-p", &port])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        with_vars(&mut server);
        let mut server = server.spawn().context("starting the ucx_perftest server")?;
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut client = Command::new(exe);
        client.args([
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            test,
            "-s",
            &size.to_string(),
            "-n",
            &iters.to_string(),
            "-w",
            &warmup.to_string(),
        ]);
        with_vars(&mut client);
        let shown = format!("{client:?}");
        let out = client.output().context("running the ucx_perftest client")?;
        let _ = server.kill();
        let _ = server.wait();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let fin = stdout
            .lines()
            .find(|l| l.trim_start().starts_with("Final:"));
        match fin {
            Some(line) if out.status.success() => {
                // Final: iters, typical lat, avg lat, overall lat (µs), avg bw, overall bw (MiB/s), ...
                let f: Vec<f64> = line
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect();
                if f.len() < 6 {
                    bail!("cannot read `{line}` from {shown}");
                }
                let latency_us = if test == "tag_bw" { f[2] } else { f[1] };
                return Ok(PerfSample {
                    wire,
                    test,
                    size,
                    latency_us,
                    bandwidth_mbps: f[5] * MIB_TO_MB,
                    line: line.trim().to_string(),
                });
            }
            _ => {
                last_err = format!(
                    "{shown} exited with {}:
{}
{}",
                    out.status,
                    tail(&stdout, 5),
                    tail(&String::from_utf8_lossy(&out.stderr), 5)
                );
            }
        }
    }
    bail!("ucx_perftest failed three times; last: {last_err}")
}

/// `ucx_perftest` on the PATH, if installed.
fn find_perftest() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join("ucx_perftest"))
        .find(|p| p.is_file())
}

/// A target: (name, measured value, unit, limit as text, passed; `None`: not judged).
type TargetRow = (String, Option<f64>, &'static str, String, Option<bool>);

/// Per layout, per size: (oneway_us samples, MB/s samples, iters samples).
type PingSamples = Vec<Vec<(Vec<f64>, Vec<f64>, Vec<f64>)>>;

fn run_pingpong(
    env: &mut Env,
    bin: &Path,
    o: &Opts,
    sizes: &[usize],
    with_ucx: bool,
    perftest: Option<&Path>,
    perf: &mut Vec<PerfSample>,
) -> Result<PingSamples> {
    let mut samples: PingSamples = LAYOUTS
        .iter()
        .map(|_| sizes.iter().map(|_| Default::default()).collect())
        .collect();
    let size_list = sizes
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let min_iters = if o.quick { "10" } else { "20" };
    let prog_args: Vec<String> = [
        "--sizes",
        &size_list,
        "--min-iters",
        min_iters,
        "--budget-ms",
        &o.budget_ms.to_string(),
    ]
    .map(String::from)
    .into();
    // Reps outermost, so drift on a shared machine spreads over every layout.
    for rep in 0..o.reps {
        for (li, l) in LAYOUTS.iter().enumerate() {
            if l.wire != Wire::Tcp && !with_ucx {
                continue;
            }
            eprintln!("bench_core: pingpong {} rep {}/{}", l.name, rep + 1, o.reps);
            let out = env.run_with_env(
                &format!("pingpong-{}", l.name),
                l.nodes,
                l.pes,
                bin,
                &prog_args,
                &l.wire.vars(),
            )?;
            for (si, &size) in sizes.iter().enumerate() {
                let line = out
                    .stdout
                    .lines()
                    .find(|ln| {
                        ln.starts_with("pingpong ") && field(ln, "size") == Some(&size.to_string())
                    })
                    .ok_or_else(|| {
                        anyhow!(
                            "pingpong {} printed no line for size {size}:\n{}",
                            l.name,
                            tail(&out.stdout, 10)
                        )
                    })?;
                let s = &mut samples[li][si];
                s.0.push(num(line, "oneway_us")?);
                s.1.push(num(line, "bandwidth_MBps")?);
                s.2.push(num(line, "iters")?);
            }
        }
        // ucx_perftest in the same repetition, so drift spreads over both.
        if let (true, Some(exe)) = (with_ucx, perftest) {
            for wire in [Wire::UcxShm, Wire::UcxTcp] {
                for (test, size, iters, warmup) in perftest_plan(o.quick) {
                    eprintln!(
                        "bench_core: ucx_perftest {test} {size} B {} rep {}/{}",
                        wire.label(),
                        rep + 1,
                        o.reps
                    );
                    perf.push(run_perftest(exe, wire, test, size, iters, warmup)?);
                }
            }
        }
    }
    Ok(samples)
}

// ---------------------------------------------------------------- jacobi

/// Near-square decomposition of `n` blocks: (rows, cols) with rows >= cols.
fn decompose(n: u32) -> (u32, u32) {
    let mut c = (f64::from(n).sqrt() as u32).max(1);
    while n % c != 0 {
        c -= 1;
    }
    (n / c, c)
}

struct JacobiCfg {
    pes: u32,
    blocks_per_pe: u32,
    bx: u32,
    by: u32,
}

struct JacobiSample {
    ms_per_iter: f64,
    seconds: f64,
    checksum: String,
    blocks: String,
}

fn jacobi_configs(grid: u32) -> Vec<JacobiCfg> {
    let mut v = Vec::new();
    for &pes in JACOBI_PES {
        for &b in BLOCKS_PER_PE {
            let (rows, cols) = decompose(pes * b);
            v.push(JacobiCfg {
                pes,
                blocks_per_pe: b,
                bx: grid.div_ceil(cols),
                by: grid.div_ceil(rows),
            });
        }
    }
    v
}

fn run_jacobi(
    env: &mut Env,
    bin: &Path,
    o: &Opts,
    cfgs: &[JacobiCfg],
) -> Result<Vec<Vec<JacobiSample>>> {
    let mut samples: Vec<Vec<JacobiSample>> = cfgs.iter().map(|_| Vec::new()).collect();
    for rep in 0..o.reps {
        for (ci, c) in cfgs.iter().enumerate() {
            eprintln!(
                "bench_core: jacobi2d {}x{} pes={} blocks/pe={} block={}x{} rep {}/{}",
                o.grid,
                o.grid,
                c.pes,
                c.blocks_per_pe,
                c.bx,
                c.by,
                rep + 1,
                o.reps
            );
            let prog_args: Vec<String> = [
                "--grid".to_string(),
                o.grid.to_string(),
                "--block".into(),
                format!("{}x{}", c.bx, c.by),
                "--iters".into(),
                o.iters.to_string(),
                "--residual-every".into(),
                "0".into(),
                "--quiet".into(),
            ]
            .into();
            let out = env.run(
                &format!("jacobi-{}pe-{}b", c.pes, c.blocks_per_pe),
                1,
                c.pes,
                bin,
                &prog_args,
            )?;
            let line = out
                .stdout
                .lines()
                .find(|l| l.starts_with("jacobi2d "))
                .ok_or_else(|| {
                    anyhow!(
                        "jacobi2d printed no result line:\n{}",
                        tail(&out.stdout, 10)
                    )
                })?;
            let sum_line = out
                .stdout
                .lines()
                .find(|l| l.starts_with("checksum="))
                .ok_or_else(|| {
                    anyhow!(
                        "jacobi2d printed no checksum line:\n{}",
                        tail(&out.stdout, 10)
                    )
                })?;
            let pes = num(line, "pes")?;
            if pes != f64::from(c.pes) {
                bail!("jacobi2d ran on {pes} PEs, expected {}", c.pes);
            }
            samples[ci].push(JacobiSample {
                ms_per_iter: num(line, "time_per_iter_ms")?,
                seconds: num(line, "seconds")?,
                checksum: field(sum_line, "checksum").unwrap_or_default().to_string(),
                blocks: field(line, "blocks").unwrap_or_default().to_string(),
            });
        }
    }
    Ok(samples)
}

// ---------------------------------------------------------------- triad

fn triad(a: &mut [f64], b: &[f64], c: &[f64], s: f64) {
    for ((x, y), z) in a.iter_mut().zip(b).zip(c) {
        *x = y + s * z;
    }
}

/// Best-of-`passes` GB/s (and every pass's GB/s) of `a = b + s*c` split over `threads` threads.
fn run_triad(mib: usize, passes: usize, threads: usize) -> (f64, Vec<f64>) {
    let n = mib * (1 << 20) / 8;
    let mut a = vec![0.0f64; n];
    let b = vec![1.0f64; n];
    let c = vec![2.0f64; n];
    let bytes = TRIAD_BYTES_PER_ELEM * n as f64;
    let chunk = n.div_ceil(threads);
    let barrier = Barrier::new(threads);
    let mut secs = Vec::new();
    std::thread::scope(|sc| {
        let mut handles = Vec::new();
        for (t, (ac, (bc, cc))) in a
            .chunks_mut(chunk)
            .zip(b.chunks(chunk).zip(c.chunks(chunk)))
            .enumerate()
        {
            let barrier = &barrier;
            handles.push(sc.spawn(move || {
                let mut times = Vec::new();
                // One untimed pass faults in `a`'s pages.
                triad(ac, bc, cc, 3.0);
                for p in 0..passes {
                    barrier.wait();
                    let t0 = Instant::now();
                    triad(ac, bc, cc, std::hint::black_box(3.0 + p as f64));
                    barrier.wait();
                    if t == 0 {
                        times.push(t0.elapsed().as_secs_f64());
                    }
                }
                std::hint::black_box(&ac[0]);
                times
            }));
        }
        for (t, h) in handles.into_iter().enumerate() {
            let times = h.join().expect("triad thread panicked");
            if t == 0 {
                secs = times;
            }
        }
    });
    let gbps: Vec<f64> = secs.iter().map(|s| bytes / s / 1e9).collect();
    (gbps.iter().copied().fold(0.0, f64::max), gbps)
}

// ---------------------------------------------------------------- machine info

// ---------------------------------------------------------------- main

fn fmt_size(b: usize) -> String {
    if b >= 1 << 20 && b % (1 << 20) == 0 {
        format!("{} MiB", b >> 20)
    } else if b >= 1024 && b % 1024 == 0 {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bench_core: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn real_main() -> Result<ExitCode> {
    let o = Opts::from_cli(<Cli as clap::Parser>::parse());

    let sitting = Sitting::begin("bench_core", "core.json", o.out.clone())?;
    let program = |name: &str| {
        sitting.program(
            name,
            "cargo build --release -p ductile-apps -p ductile-operator",
        )
    };
    let ductile = program("ductile")?;
    let pingpong_bin = program("pingpong")?;
    let jacobi_bin = program("jacobi2d")?;
    let (date, nproc, model) = (&sitting.date, sitting.nproc, &sitting.cpu_model);
    let state_base = &sitting.state_base;
    let mut env = Env {
        prefix: "bench-core",
        ductile,
        state_base: state_base.clone(),
        timeout_s: o.child_timeout_s,
        runs: 0,
    };

    // 1. Memory bandwidth, first, while nothing else of ours runs.
    eprintln!(
        "bench_core: STREAM triad, {} MiB per array, {} passes",
        o.triad_mib, o.triad_passes
    );
    let (bw1, bw1_samples) = run_triad(o.triad_mib, o.triad_passes, 1);
    let (bw2, bw2_samples) = run_triad(o.triad_mib, o.triad_passes, 2);

    // 2. Pingpong.
    let sizes = if o.quick {
        PINGPONG_SIZES_QUICK
    } else {
        PINGPONG_SIZES
    };
    let cfgs = jacobi_configs(o.grid);
    let mut with_ucx = false;
    let perftest = find_perftest();
    let mut perf = Vec::new();
    let children = (|| -> Result<_> {
        let ping = if o.skip_pingpong {
            None
        } else {
            with_ucx = ucx_built(&mut env, &pingpong_bin)?;
            if !with_ucx {
                eprintln!("bench_core: UCX: not built (the nodes refuse DUCTILE_TRANSPORT=ucx); UCX rows skipped");
            } else if perftest.is_none() {
                eprintln!("bench_core: ucx_perftest not found on PATH (scripts/install-ucx installs ucx-utils); skipped");
            }
            Some(run_pingpong(
                &mut env,
                &pingpong_bin,
                &o,
                sizes,
                with_ucx,
                perftest.as_deref(),
                &mut perf,
            )?)
        };
        // 3. Jacobi.
        let jac = if o.skip_jacobi {
            None
        } else {
            Some(run_jacobi(&mut env, &jacobi_bin, &o, &cfgs)?)
        };
        Ok((ping, jac))
    })();
    let _ = std::fs::remove_dir_all(&state_base);
    let (ping, jac) = children?;

    let mut report = String::new();
    let w = &mut report;
    writeln!(
        w,
        "bench_core  {date}  nproc={nproc}  cpu={}",
        model.as_deref().unwrap_or("unknown")
    )?;
    writeln!(
        w,
        "parameters: reps={} grid={}x{} iters={} pingpong budget={} ms{}",
        o.reps,
        o.grid,
        o.grid,
        o.iters,
        o.budget_ms,
        if o.quick { " (--quick)" } else { "" }
    )?;

    // Memory bandwidth and bounds.
    let points = f64::from(o.grid) * f64::from(o.grid);
    let bound_ms = |gbps: f64| JACOBI_BYTES_PER_POINT * points / (gbps * 1e9) * 1e3;
    writeln!(
        w,
        "\nMemory bandwidth (triad a=b+s*c, f64, {} MiB/array, 24 B/elem, best of {})",
        o.triad_mib, o.triad_passes
    )?;
    writeln!(
        w,
        "  threads | best GB/s | Jacobi {0}x{0} bound, ms/iter (16 B/point)",
        o.grid
    )?;
    writeln!(w, "  {:>7} | {:>9.2} | {:>10.3}", 1, bw1, bound_ms(bw1))?;
    writeln!(w, "  {:>7} | {:>9.2} | {:>10.3}", 2, bw2, bound_ms(bw2))?;

    let mut ping_json = Vec::new();
    let mut intra_8b = None;
    let mut cross_8b = None;
    let mut ucx_json = json!({ "built": with_ucx, "ucx_perftest": perftest.as_ref().map(|p| p.display().to_string()) });
    // (name, value, unit, limit, pass) rows for UCX, added to the targets.
    let mut ucx_targets: Vec<TargetRow> = Vec::new();
    if let Some(ping) = &ping {
        writeln!(w, "\nPingpong one-way latency, median of {} jobs [min..max]; bandwidth = size / one-way time", o.reps)?;
        writeln!(
            w,
            "  {:>7} | {:>28} | {:>10} | {:>28} | {:>10}",
            "size", "same-node 1x2 one-way µs", "MB/s", "cross-node 2x1 one-way µs", "MB/s"
        )?;
        for (si, &size) in sizes.iter().enumerate() {
            let mut row = format!("  {:>7}", fmt_size(size));
            for layout in ping.iter().take(2) {
                let (lat, bw, _) = &layout[si];
                let (l, b) = (stats(lat), stats(bw));
                let cell = format!("{:.3} [{:.3}..{:.3}]", l.median, l.min, l.max);
                write!(row, " | {cell:>28} | {:>10.1}", b.median)?;
            }
            writeln!(w, "{row}")?;
        }
        let active: Vec<usize> = (0..LAYOUTS.len())
            .filter(|&li| !ping[li].iter().all(|s| s.0.is_empty()))
            .collect();
        for &li in &active {
            let l = &LAYOUTS[li];
            let per_size: Vec<Value> = sizes
                .iter()
                .enumerate()
                .map(|(si, &size)| {
                    let (lat, bw, it) = &ping[li][si];
                    json!({ "size_bytes": size, "oneway_us": stats_json(lat), "bandwidth_MBps": stats_json(bw), "iters": it })
                })
                .collect();
            ping_json.push(json!({ "layout": l.name, "transport": l.wire.label(), "nodes": l.nodes, "pes_per_node": l.pes, "sizes": per_size }));
        }
        if let Some(si) = sizes.iter().position(|&s| s == 8) {
            intra_8b = Some(stats(&ping[0][si].0).median);
            cross_8b = Some(stats(&ping[1][si].0).median);
        }

        // Cross-node by transport, and ucx_perftest beside it.
        if !with_ucx {
            writeln!(w, "\nUCX: not built (nodes started with DUCTILE_TRANSPORT=ucx refuse it); UCX rows skipped")?;
        } else {
            writeln!(w, "\nCross-node pingpong (2 nodes x 1 PE) by transport, one-way µs median of {} jobs (MB/s)", o.reps)?;
            let cross: Vec<usize> = (1..LAYOUTS.len()).collect();
            let mut head = format!("  {:>7}", "size");
            for &li in &cross {
                write!(head, " | {:>24}", LAYOUTS[li].wire.label())?;
            }
            writeln!(w, "{head}")?;
            for (si, &size) in sizes.iter().enumerate() {
                let mut row = format!("  {:>7}", fmt_size(size));
                for &li in &cross {
                    let (lat, bw, _) = &ping[li][si];
                    let cell = format!("{:.3} ({:.1})", stats(lat).median, stats(bw).median);
                    write!(row, " | {cell:>24}")?;
                }
                writeln!(w, "{row}")?;
            }
            let median_of = |li: usize, size: usize, bw: bool| {
                sizes.iter().position(|&s| s == size).map(|si| {
                    let (lat, b, _) = &ping[li][si];
                    stats(if bw { b } else { lat }).median
                })
            };
            let perf_median = |wire: Wire, test: &str, size: usize, bw: bool| {
                let v: Vec<f64> = perf
                    .iter()
                    .filter(|p| p.wire == wire && p.test == test && p.size == size)
                    .map(|p| if bw { p.bandwidth_mbps } else { p.latency_us })
                    .collect();
                (!v.is_empty()).then(|| stats(&v).median)
            };
            if perftest.is_some() {
                writeln!(w, "\nucx_perftest on loopback (server + client), median of {} runs; one-way µs (MB/s, 10^6 B/s)", o.reps)?;
                writeln!(
                    w,
                    "  {:<16} | {:>24} | {:>24}",
                    "test",
                    Wire::UcxShm.label(),
                    Wire::UcxTcp.label()
                )?;
                for (test, size, _, _) in perftest_plan(o.quick) {
                    let mut row = format!("  {:<16}", format!("{test} {}", fmt_size(size)));
                    for wire in [Wire::UcxShm, Wire::UcxTcp] {
                        let cell = match (
                            perf_median(wire, test, size, false),
                            perf_median(wire, test, size, true),
                        ) {
                            (Some(l), Some(b)) => format!("{l:.3} ({b:.1})"),
                            _ => "-".into(),
                        };
                        write!(row, " | {cell:>24}")?;
                    }
                    writeln!(w, "{row}")?;
                }
            } else {
                writeln!(
                    w,
                    "\nucx_perftest: not found on PATH; its comparison is skipped"
                )?;
            }
            let shm_8b = median_of(2, 8, false);
            ucx_targets.push((
                "UCX shm 8 B one-way".into(),
                shm_8b,
                "µs",
                format!("< {TARGET_UCX_SHM_8B_US}"),
                shm_8b.map(|v| v < TARGET_UCX_SHM_8B_US),
            ));
            for (li, wire) in [(2, Wire::UcxShm), (3, Wire::UcxTcp)] {
                let ours = median_of(li, PERFTEST_BIG, true);
                let theirs = perf_median(wire, "tag_bw", PERFTEST_BIG, true);
                let ratio = ours.zip(theirs).map(|(a, b)| a / b);
                ucx_targets.push((
                    format!("{} 4 MiB bw / perftest tag_bw", wire.label()),
                    ratio,
                    "x",
                    format!(">= {TARGET_UCX_VS_PERFTEST}"),
                    ratio.map(|r| r >= TARGET_UCX_VS_PERFTEST),
                ));
                let lat_ratio = ours
                    .zip(perf_median(wire, "tag_lat", PERFTEST_BIG, true))
                    .map(|(a, b)| a / b);
                ucx_targets.push((
                    format!("{} 4 MiB bw / perftest tag_lat", wire.label()),
                    lat_ratio,
                    "x",
                    "-".into(),
                    None,
                ));
            }
            ucx_json["perftest_samples"] = perf
                .iter()
                .map(|p| json!({ "ucx": p.wire.label(), "test": p.test, "size_bytes": p.size, "oneway_us": p.latency_us, "bandwidth_MBps": p.bandwidth_mbps, "final_line": p.line }))
                .collect();
        }
    }

    let mut jac_json = Value::Null;
    let mut checksum_ok = true;
    let mut ratio_1pe = None;
    let mut overhead = Vec::new();
    if let Some(jac) = &jac {
        let all_sums: Vec<&str> = jac.iter().flatten().map(|s| s.checksum.as_str()).collect();
        let first = all_sums.first().copied().unwrap_or("");
        checksum_ok = all_sums.iter().all(|s| *s == first && !s.is_empty());
        let median_of =
            |ci: usize| stats(&jac[ci].iter().map(|s| s.ms_per_iter).collect::<Vec<_>>()).median;
        let base_of = |pes: u32| {
            cfgs.iter()
                .position(|c| c.pes == pes && c.blocks_per_pe == 1)
                .map(median_of)
        };
        writeln!(
            w,
            "\nJacobi2D {0}x{0}, {1} iterations, time per iteration, median of {2} jobs [min..max]",
            o.grid, o.iters, o.reps
        )?;
        writeln!(
            w,
            "  {:>3} | {:>9} | {:>6} | {:>9} | {:>26} | {:>13} | {:>8}",
            "PEs", "blocks/PE", "blocks", "block", "ms/iter", "vs 1 block/PE", "vs bound"
        )?;
        let mut runs = Vec::new();
        for (ci, c) in cfgs.iter().enumerate() {
            let ms: Vec<f64> = jac[ci].iter().map(|s| s.ms_per_iter).collect();
            let st = stats(&ms);
            let base = base_of(c.pes).unwrap_or(f64::NAN);
            let bound = bound_ms(if c.pes == 1 { bw1 } else { bw2 });
            let vs_base = st.median / base - 1.0;
            let vs_bound = st.median / bound;
            if c.pes == 1 && c.blocks_per_pe == 1 {
                ratio_1pe = Some(vs_bound);
            }
            if c.pes == 1 && c.blocks_per_pe > 1 {
                overhead.push((c.blocks_per_pe, vs_base));
            }
            let blocks = jac[ci].first().map_or(String::new(), |s| s.blocks.clone());
            writeln!(
                w,
                "  {:>3} | {:>9} | {:>6} | {:>9} | {:>26} | {:>12.1}% | {:>7.2}x",
                c.pes,
                c.blocks_per_pe,
                blocks,
                format!("{}x{}", c.bx, c.by),
                format!("{:.3} [{:.3}..{:.3}]", st.median, st.min, st.max),
                vs_base * 100.0,
                vs_bound
            )?;
            runs.push(json!({
                "pes": c.pes, "nodes": 1, "blocks_per_pe": c.blocks_per_pe, "block": [c.bx, c.by], "blocks_rows_x_cols": blocks,
                "ms_per_iter": stats_json(&ms),
                "seconds": jac[ci].iter().map(|s| s.seconds).collect::<Vec<_>>(),
                "checksums": jac[ci].iter().map(|s| s.checksum.clone()).collect::<Vec<_>>(),
                "vs_1_block_per_pe": vs_base, "vs_bound": vs_bound, "bound_ms_per_iter": bound,
            }));
        }
        if checksum_ok {
            writeln!(
                w,
                "  checksum {first} (identical in all {} runs)",
                all_sums.len()
            )?;
        } else {
            writeln!(w, "  !!! CHECKSUM MISMATCH across Jacobi runs of the same grid and iterations: {all_sums:?}")?;
        }
        jac_json = json!({
            "grid": [o.grid, o.grid], "iters": o.iters, "checksum": first, "checksums_agree": checksum_ok,
            "bound_ms_per_iter": { "1_thread": bound_ms(bw1), "2_threads": bound_ms(bw2) },
            "bytes_per_point": JACOBI_BYTES_PER_POINT,
            "ratio_1pe_1block_vs_bound": ratio_1pe,
            "overdecomposition_cost_1pe": overhead.iter().map(|(b, v)| (b.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "runs": runs,
        });
    }

    // Targets.
    let over4 = overhead.iter().find(|(b, _)| *b == 4).map(|(_, v)| *v);
    let mut targets: Vec<TargetRow> = vec![
        (
            "intra-node 8 B one-way".into(),
            intra_8b,
            "µs",
            format!("< {TARGET_INTRA_8B_US}"),
            intra_8b.map(|v| v < TARGET_INTRA_8B_US),
        ),
        (
            "cross-node 8 B one-way".into(),
            cross_8b,
            "µs",
            format!("< {TARGET_CROSS_8B_US}"),
            cross_8b.map(|v| v < TARGET_CROSS_8B_US),
        ),
        (
            "Jacobi 1 PE / bandwidth bound".into(),
            ratio_1pe,
            "x",
            format!("<= {TARGET_JACOBI_VS_BOUND}"),
            ratio_1pe.map(|v| v <= TARGET_JACOBI_VS_BOUND),
        ),
        (
            "4 blocks/PE overhead at 1 PE".into(),
            over4.map(|v| v * 100.0),
            "%",
            format!("< {}", TARGET_OVERDECOMP_4 * 100.0),
            over4.map(|v| v < TARGET_OVERDECOMP_4),
        ),
    ];
    targets.extend(ucx_targets);
    writeln!(w, "\nTargets")?;
    writeln!(
        w,
        "  {:<40} | {:>10} | {:>8} | result",
        "target", "value", "limit"
    )?;
    for (name, v, unit, limit, pass) in &targets {
        let val = v.map_or("-".to_string(), |v| format!("{v:.3} {unit}"));
        writeln!(
            w,
            "  {name:<40} | {val:>10} | {:>8} | {}",
            format!("{limit} {unit}"),
            pass_str(*pass)
        )?;
    }
    print!("{report}");

    sitting.write_json(json!({
        "parameters": {
            "reps": o.reps, "iters": o.iters, "grid": o.grid, "quick": o.quick,
            "skip_pingpong": o.skip_pingpong, "skip_jacobi": o.skip_jacobi,
            "pingpong_sizes": sizes, "pingpong_budget_ms": o.budget_ms,
            "jacobi_pes": JACOBI_PES, "jacobi_blocks_per_pe": BLOCKS_PER_PE,
            "triad_mib_per_array": o.triad_mib, "triad_passes": o.triad_passes,
            "child_timeout_s": o.child_timeout_s,
        },
        "stream_triad": {
            "bytes_per_element": TRIAD_BYTES_PER_ELEM,
            "threads_1": { "best_GBps": bw1, "samples_GBps": bw1_samples },
            "threads_2": { "best_GBps": bw2, "samples_GBps": bw2_samples },
        },
        "pingpong": ping_json,
        "ucx": ucx_json,
        "jacobi": jac_json,
        "targets": targets.iter().map(|(name, v, unit, limit, pass)| json!({
            "name": name, "value": v, "unit": unit, "limit": limit, "pass": pass,
        })).collect::<Vec<_>>(),
        "ok": checksum_ok,
        "table": report,
    }))?;

    if !checksum_ok {
        eprintln!("bench_core: ERROR: Jacobi checksums differ between runs of the same grid and iterations");
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}
