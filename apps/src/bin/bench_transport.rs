//! `bench_transport`: what the transports alone cost, between two processes.
//!
//! ```text
//! bench_transport [--wires tcp,ucx-shm,ucx-tcp] [--sizes 8,65536,1048576,4194304]
//!                 [--reps N] [--budget-ms MS] [--pin] [--busy] [--idle-ms MS]
//!                 [--no-perftest] [--out PATH]
//! ```
//!
//! Per repetition and wire it starts two copies of itself (node 0 and node
//! 1), each with one transport (`TcpTransport` or `UcxTransport`, no PE,
//! no runtime), reconciles them into a two-node view and runs a pingpong
//! from the transports' own delivery callbacks: node 1 sends every frame
//! back from its `Sink::deliver`, node 0 sends the next one from its own.
//! So a row is the transport's cost (send, wire, receive thread, delivery)
//! without the PE loop. Then both idle for `--idle-ms` and report the CPU
//! their threads used meanwhile (`/proc/self/task/*/schedstat`).
//!
//! `--pin` runs node 0 on core 0 and node 1 on core 1 (`taskset`), and
//! `ucx_perftest` (server core 1, client core 0) in the same repetition.
//! `--busy` adds a process that spins on node 0's core for the whole run
//! (an unrelated busy neighbour). Each size runs a tenth untimed first, and
//! that warm-up's pace caps the timed round trips to `--budget-ms`. It prints a table and writes every sample
//! and the medians as JSON to `target/bench/transport.json` (or `--out`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ductile::transport::tcp::TcpTransport;
use ductile::transport::{
    kind, start_ucx, Member, Secret, Sink, Tag, Transport, View, UCX_BUILT,
};
use ductile_apps::bench::*;
use serde_json::{json, Value};

/// `ucx_perftest` prints MB/s as 2^20 bytes per second; this bench uses 10^6.
const MIB_TO_MB: f64 = 1.048_576;
/// How long a child may take for one step before the bench gives up on it.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// Untimed round trips before each size is timed, at least: what
/// `ucx_perftest` gets for large messages.
const WARMUP_MIN: u64 = 20;
/// Timed round trips of `ucx_perftest tag_lat` for messages over 64 KiB.
const PERFTEST_LARGE_ITERS: u64 = 200;

/// The command line (`bench_transport --help`).
#[derive(clap::Parser, Debug)]
#[command(
    name = "bench_transport",
    about = "Two-process pingpong over the transports alone (TCP, UCX shm, UCX tcp), their idle CPU, and ucx_perftest beside them; writes target/bench/transport.json"
)]
struct Cli {
    /// Wires to measure, comma-separated: tcp, ucx-shm (UCX's default
    /// transports, peer error handling), ucx-sm (`UCX_TLS=sm,self`,
    /// `DUCTILE_UCX_ERR_MODE=none`), ucx-tcp (`UCX_TLS=tcp` on lo). UCX ones
    /// are skipped in a build without the `ucx` feature.
    #[arg(long, value_delimiter = ',', default_value = "tcp,ucx-shm,ucx-sm,ucx-tcp")]
    wires: Vec<String>,
    /// Message sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8,65536,1048576,4194304")]
    sizes: Vec<usize>,
    /// Repetitions (a fresh pair of processes each).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Time per message size, in ms.
    #[arg(long = "budget-ms", default_value_t = 200.0)]
    budget_ms: f64,
    /// Pin node 0 to core 0 and node 1 to core 1 (and ucx_perftest the same way).
    #[arg(long)]
    pin: bool,
    /// Run a busy process on node 0's core during every measurement.
    #[arg(long)]
    busy: bool,
    /// How long both nodes idle (connected, nothing sent) while their CPU is counted.
    #[arg(long = "idle-ms", default_value_t = 2000)]
    idle_ms: u64,
    /// Skip ucx_perftest.
    #[arg(long)]
    no_perftest: bool,
    /// Where to write the JSON [default: target/bench/transport.json].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Internal: run as node 0 or 1 of a pair.
    #[arg(long, hide = true)]
    peer: Option<u32>,
    /// Internal: the wire the peer uses.
    #[arg(long, hide = true, default_value = "tcp")]
    wire: String,
    /// Internal: spin forever (the busy neighbour).
    #[arg(long, hide = true)]
    spin: bool,
}

fn main() -> ExitCode {
    let cli = <Cli as clap::Parser>::parse();
    let res = if cli.spin {
        spin_forever()
    } else if let Some(role) = cli.peer {
        peer_main(role, &cli)
    } else {
        parent_main(&cli)
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_transport: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn spin_forever() -> Result<()> {
    let mut x = 0u64;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

// ---------------------------------------------------------------- a node

/// Node 1 echoes every frame; node 0 counts round trips and sends the next.
struct Echo {
    role: u32,
    transport: OnceLock<Arc<dyn Transport>>,
    left: AtomicU64,
    done: Mutex<u64>,
    done_cv: Condvar,
    lost: AtomicBool,
}

impl Echo {
    fn signal(&self) {
        *self.done.lock().expect("lock poisoned") += 1;
        self.done_cv.notify_all();
    }
}

impl Sink for Echo {
    fn deliver(&self, _tag: Tag, frame: Vec<u8>) {
        let Some(t) = self.transport.get() else {
            return;
        };
        let to = 1 - self.role;
        let tag = Tag::new(self.role, 1, kind::ENVELOPE);
        if self.role == 1 {
            if let Err(e) = t.send_frame(to, tag, frame) {
                eprintln!("bench_transport: node 1: echo failed: {e}");
            }
            return;
        }
        if self.left.fetch_sub(1, Ordering::SeqCst) > 1 {
            if let Err(e) = t.send_frame(to, tag, frame) {
                eprintln!("bench_transport: node 0: send failed: {e}");
                self.signal();
            }
        } else {
            self.signal();
        }
    }
    fn lost(&self, uid: u64, reason: String) {
        eprintln!("bench_transport: node {}: lost peer {uid}: {reason}", self.role);
        self.lost.store(true, Ordering::SeqCst);
        self.signal();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(text: &str) -> Result<Vec<u8>> {
    if text.len() % 2 != 0 {
        bail!("odd-length hex");
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).map_err(|e| anyhow!("bad hex: {e}")))
        .collect()
}

/// CPU time (ns) of this process's live threads, from their schedstat.
fn cpu_ns_of_threads() -> Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").context("reading /proc/self/task")? {
        let path = task?.path().join("schedstat");
        if let Ok(text) = std::fs::read_to_string(&path) {
            total += text
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(total)
}

fn peer_main(role: u32, cli: &Cli) -> Result<()> {
    let sink = Arc::new(Echo {
        role,
        transport: OnceLock::new(),
        left: AtomicU64::new(0),
        done: Mutex::new(0),
        done_cv: Condvar::new(),
        lost: AtomicBool::new(false),
    });
    let secret = Secret::from_hex(
        &std::env::var("BENCH_TRANSPORT_SECRET").context("BENCH_TRANSPORT_SECRET unset")?,
    )
    .map_err(|e| anyhow!("BENCH_TRANSPORT_SECRET: {e}"))?;
    let t: Arc<dyn Transport> = match cli.wire.as_str() {
        "tcp" => {
            let t = TcpTransport::bind([127, 0, 0, 1].into(), None, secret, sink.clone())?;
            t.set_uid(100 + role as u64);
            t
        }
        "ucx-shm" => start_ucx(sink.clone(), &[])?,
        "ucx-tcp" => start_ucx(sink.clone(), &[("TLS", "tcp"), ("NET_DEVICES", "lo")])?,
        // Shared memory only (the parent sets DUCTILE_UCX_ERR_MODE=none:
        // UCX 1.13's shm transports refuse peer error handling).
        "ucx-sm" => start_ucx(sink.clone(), &[("TLS", "sm,self")])?,
        other => bail!("unknown wire `{other}`"),
    };
    let _ = sink.transport.set(t.clone());
    let mut out = std::io::stdout().lock();
    writeln!(out, "address {}", hex(&t.address()))?;
    out.flush()?;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut next = || -> Result<String> {
        lines
            .next()
            .ok_or_else(|| anyhow!("stdin closed"))?
            .context("reading stdin")
    };
    let line = next()?;
    let addrs: Vec<Vec<u8>> = line
        .strip_prefix("view ")
        .ok_or_else(|| anyhow!("expected `view`, got `{line}`"))?
        .split_whitespace()
        .map(unhex)
        .collect::<Result<_>>()?;
    let view = View {
        epoch: 1,
        members: addrs
            .into_iter()
            .enumerate()
            .map(|(i, address)| Member {
                node: i as u32,
                uid: 100 + i as u64,
                address,
                pes: 1,
                host: "localhost".into(),
                pid: 0,
            })
            .collect(),
    };
    t.reconcile(&view, role)?;
    writeln!(out, "ready")?;
    out.flush()?;
    loop {
        let line = next()?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["go"] => {
                for &size in &cli.sizes {
                    // Aim at the budget at ~1 GB/s and 10 µs per round trip.
                    let est_us = 10.0 + 2.0 * size as f64 / 1e3;
                    // Large messages get at least the round trips that
                    // `ucx_perftest tag_lat` times for them (`run_perftest`):
                    // with fewer, the figure weighs the first ones, which
                    // are slower even after the warm-up.
                    let least = if size > 65536 { PERFTEST_LARGE_ITERS } else { 10 };
                    let iters =
                        ((cli.budget_ms * 1e3 / est_us) as u64).clamp(least, 200_000);
                    // At least the 20 untimed round trips `ucx_perftest`
                    // gets for large messages (`run_perftest`): with 2, a
                    // 4 MiB figure carried the first receives' fresh buffers.
                    let warmup = (iters / 10).max(WARMUP_MIN);
                    let run = |n: u64| -> Result<Duration> {
                        let seen = *sink.done.lock().expect("lock poisoned");
                        sink.left.store(n, Ordering::SeqCst);
                        let t0 = Instant::now();
                        t.send_frame(1, Tag::new(0, 1, kind::ENVELOPE), vec![7u8; size])?;
                        let g = sink.done.lock().expect("lock poisoned");
                        let (_g, to) = sink
                            .done_cv
                            .wait_timeout_while(g, STEP_TIMEOUT, |d| *d == seen)
                            .expect("lock poisoned");
                        if to.timed_out() {
                            bail!("size {size}: no answer within {STEP_TIMEOUT:?}");
                        }
                        if sink.lost.load(Ordering::SeqCst) {
                            bail!("size {size}: the peer was lost");
                        }
                        Ok(t0.elapsed())
                    };
                    // The warm-up's pace caps the timed round trips to the
                    // budget: beside a busy process one may take milliseconds
                    // (docs/message-path.md), and the estimate's count
                    // would then outrun the step's time limit.
                    let warm = run(warmup)?.as_secs_f64() / warmup as f64;
                    let iters = iters.min((cli.budget_ms / 1e3 / warm) as u64).max(10);
                    let took = run(iters)?;
                    let oneway_us = took.as_secs_f64() * 1e6 / (2 * iters) as f64;
                    writeln!(
                        out,
                        "result size={size} iters={iters} oneway_us={oneway_us:.3} bandwidth_MBps={:.1}",
                        size as f64 / oneway_us
                    )?;
                    out.flush()?;
                }
                writeln!(out, "done")?;
                out.flush()?;
            }
            ["idle", ms] => {
                let ms: u64 = ms.parse().context("idle ms")?;
                // Let what the pingpong left in flight settle first.
                std::thread::sleep(Duration::from_millis(200));
                let before = cpu_ns_of_threads()?;
                std::thread::sleep(Duration::from_millis(ms));
                let used = cpu_ns_of_threads()? - before;
                writeln!(
                    out,
                    "idle cpu_ms={:.3} window_ms={ms} cpu_pct={:.3}",
                    used as f64 / 1e6,
                    used as f64 / 1e6 / ms as f64 * 100.0
                )?;
                out.flush()?;
            }
            ["quit"] => {
                t.shutdown();
                return Ok(());
            }
            _ => bail!("unexpected command `{line}`"),
        }
    }
}

// ---------------------------------------------------------------- the parent

struct Proc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Proc {
    fn say(&mut self, line: &str) -> Result<()> {
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        Ok(())
    }
    fn line(&mut self) -> Result<String> {
        let mut s = String::new();
        if self.stdout.read_line(&mut s)? == 0 {
            let status = self.child.wait()?;
            bail!("a node exited ({status}) before answering");
        }
        Ok(s.trim().to_string())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pinned(core: Option<usize>, exe: &Path) -> Command {
    match core {
        Some(c) => {
            let mut cmd = Command::new("taskset");
            cmd.args(["-c", &c.to_string()]).arg(exe);
            cmd
        }
        None => Command::new(exe),
    }
}

fn spawn_peer(exe: &Path, cli: &Cli, role: u32, wire: &str, secret: &str) -> Result<Proc> {
    let sizes = cli
        .sizes
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = pinned(cli.pin.then_some(role as usize), exe);
    cmd.args(["--peer", &role.to_string(), "--wire", wire, "--sizes", &sizes])
        .args(["--budget-ms", &cli.budget_ms.to_string()])
        .env("BENCH_TRANSPORT_SECRET", secret)
        .env("DUCTILE_UCX_ERR_MODE", err_mode(wire))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    let stdin = child.stdin.take().context("no stdin")?;
    let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
    Ok(Proc {
        child,
        stdin,
        stdout,
    })
}

/// One repetition over one wire: per size (oneway µs, MB/s), and the two nodes' idle CPU %.
struct PairRun {
    rows: Vec<(usize, f64, f64)>,
    idle_pct: [f64; 2],
}

fn run_pair(exe: &Path, cli: &Cli, wire: &str) -> Result<PairRun> {
    let secret = Secret::generate().to_hex();
    let mut a = spawn_peer(exe, cli, 0, wire, &secret)?;
    let mut b = spawn_peer(exe, cli, 1, wire, &secret)?;
    let addr = |p: &mut Proc| -> Result<String> {
        let l = p.line()?;
        l.strip_prefix("address ")
            .map(str::to_string)
            .ok_or_else(|| anyhow!("expected an address, got `{l}`"))
    };
    let view = format!("view {} {}", addr(&mut a)?, addr(&mut b)?);
    a.say(&view)?;
    b.say(&view)?;
    for p in [&mut a, &mut b] {
        let l = p.line()?;
        if l != "ready" {
            bail!("expected ready, got `{l}`");
        }
    }
    a.say("go")?;
    let mut rows = Vec::new();
    loop {
        let l = a.line()?;
        if l == "done" {
            break;
        }
        rows.push((
            num(&l, "size")? as usize,
            num(&l, "oneway_us")?,
            num(&l, "bandwidth_MBps")?,
        ));
    }
    let mut idle_pct = [0.0; 2];
    if cli.idle_ms > 0 {
        let cmd = format!("idle {}", cli.idle_ms);
        a.say(&cmd)?;
        b.say(&cmd)?;
        for (i, p) in [&mut a, &mut b].into_iter().enumerate() {
            idle_pct[i] = num(&p.line()?, "cpu_pct")?;
        }
    }
    a.say("quit")?;
    b.say("quit")?;
    for p in [&mut a, &mut b] {
        let st = p.child.wait()?;
        if !st.success() {
            bail!("a node of the {wire} pair exited with {st}");
        }
    }
    Ok(PairRun { rows, idle_pct })
}

fn find_perftest() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join("ucx_perftest"))
        .find(|p| p.is_file())
}

/// The UCX error handling a wire's nodes run with: peer failure
/// detection (what a job needs to survive a lost node) but on `ucx-sm`.
fn err_mode(wire: &str) -> &'static str {
    if wire == "ucx-sm" {
        "none"
    } else {
        "peer"
    }
}

/// `ucx_perftest` server (core 1) and client (core 0) when pinning; the
/// client's `Final:` line as (one-way µs, MB/s). Its endpoints handle
/// errors as the wire's nodes do (`-e` for peer failure handling): UCX
/// 1.13 moves large messages at about a third of the speed with it.
fn run_perftest(exe: &Path, pin: bool, wire: &str, test: &str, size: usize) -> Result<(f64, f64)> {
    let vars: &[(&str, &str)] = match wire {
        "ucx-tcp" => &[("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", "lo")],
        "ucx-sm" => &[("UCX_TLS", "sm,self")],
        _ => &[],
    };
    let err: &[&str] = if err_mode(wire) == "peer" { &["-e"] } else { &[] };
    let (iters, warmup) = match (test, size) {
        ("tag_lat", s) if s <= 65536 => (100_000, 10_000),
        ("tag_lat", _) => (PERFTEST_LARGE_ITERS, WARMUP_MIN),
        _ => (400, 40),
    };
    let mut last = String::new();
    for _ in 0..3 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port()
            .to_string();
        let mut server = pinned(pin.then_some(1), exe);
        server
            .args(["-p", &port])
            .args(err)
            .envs(vars.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut server = server.spawn().context("starting the ucx_perftest server")?;
        std::thread::sleep(Duration::from_millis(300));
        let mut client = pinned(pin.then_some(0), exe);
        client
            .args(["127.0.0.1", "-p", &port, "-t", test, "-s", &size.to_string()])
            .args(["-n", &iters.to_string(), "-w", &warmup.to_string()])
            .args(err)
            .envs(vars.iter().copied());
        let out = client.output().context("running the ucx_perftest client")?;
        let _ = server.kill();
        let _ = server.wait();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        if let Some(line) = stdout.lines().find(|l| l.trim_start().starts_with("Final:")) {
            let f: Vec<f64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            if f.len() >= 6 && out.status.success() {
                let lat = if test == "tag_bw" { f[2] } else { f[1] };
                return Ok((lat, f[5] * MIB_TO_MB));
            }
        }
        last = tail(&stdout, 3);
    }
    bail!("ucx_perftest {test} {size} failed three times: {last}")
}

fn parent_main(cli: &Cli) -> Result<()> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let (_, target_dir) = bin_and_target_dirs()?;
    let out_path = cli
        .out
        .clone()
        .unwrap_or_else(|| target_dir.join("bench").join("transport.json"));
    let wires: Vec<&str> = cli
        .wires
        .iter()
        .map(String::as_str)
        .filter(|w| {
            let ok = *w == "tcp" || UCX_BUILT;
            if !ok {
                eprintln!("bench_transport: {w}: this build has no UCX transport; skipped");
            }
            ok
        })
        .collect();
    let perftest = (!cli.no_perftest && UCX_BUILT)
        .then(find_perftest)
        .flatten();
    let load_start = loadavg();
    // Samples: wire -> size -> (oneway, MB/s); idle: wire -> [pct].
    let mut samples: BTreeMap<(String, usize), (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let mut idle: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut perf: BTreeMap<(String, String, usize), (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let mut busy = if cli.busy {
        let mut c = pinned(Some(0), &exe);
        c.arg("--spin").stdin(Stdio::null()).stdout(Stdio::null());
        Some(c.spawn().context("starting the busy neighbour")?)
    } else {
        None
    };
    let result = (|| -> Result<()> {
        for rep in 0..cli.reps {
            for wire in &wires {
                eprintln!("bench_transport: {wire} rep {}/{}", rep + 1, cli.reps);
                let run = run_pair(&exe, cli, wire)?;
                for (size, us, mbps) in run.rows {
                    let s = samples.entry((wire.to_string(), size)).or_default();
                    s.0.push(us);
                    s.1.push(mbps);
                }
                idle.entry(wire.to_string())
                    .or_default()
                    .extend(run.idle_pct);
                if let (Some(p), true) = (&perftest, wire.starts_with("ucx")) {
                    for (test, size) in [("tag_lat", 8), ("tag_lat", 4 << 20), ("tag_bw", 4 << 20)] {
                        let (lat, bw) = run_perftest(p, cli.pin, wire, test, size)?;
                        let s = perf
                            .entry((wire.to_string(), test.to_string(), size))
                            .or_default();
                        s.0.push(lat);
                        s.1.push(bw);
                    }
                }
            }
        }
        Ok(())
    })();
    if let Some(b) = busy.as_mut() {
        let _ = b.kill();
        let _ = b.wait();
    }
    result?;
    let load_end = loadavg();

    let mut w = String::new();
    writeln!(
        w,
        "bench_transport: {} reps, pin {}, busy neighbour {}, load {} -> {}",
        cli.reps,
        cli.pin,
        cli.busy,
        load_start.as_deref().unwrap_or("?"),
        load_end.as_deref().unwrap_or("?")
    )?;
    writeln!(w, "one-way µs median [min..max] (MB/s median)")?;
    write!(w, "{:>10}", "size")?;
    for wire in &wires {
        write!(w, " | {:>30}", wire)?;
    }
    writeln!(w)?;
    let mut rows_json = Vec::new();
    for &size in &cli.sizes {
        write!(w, "{size:>10}")?;
        for wire in &wires {
            match samples.get(&(wire.to_string(), size)) {
                Some((us, mbps)) => {
                    let s = stats(us);
                    write!(
                        w,
                        " | {:>8.2} [{:.2}..{:.2}] ({:.0})",
                        s.median,
                        s.min,
                        s.max,
                        median(mbps)
                    )?;
                    rows_json.push(json!({ "wire": wire, "size": size, "oneway_us": stats_json(us), "bandwidth_MBps": stats_json(mbps) }));
                }
                None => write!(w, " | {:>30}", "-")?,
            }
        }
        writeln!(w)?;
    }
    writeln!(w, "idle CPU of a connected node over {} ms, % of one core, median [max]:", cli.idle_ms)?;
    let mut idle_json = Vec::new();
    for (wire, v) in &idle {
        let s = stats(v);
        writeln!(w, "  {wire}: {:.2} [{:.2}]", s.median, s.max)?;
        idle_json.push(json!({ "wire": wire, "cpu_pct": stats_json(v) }));
    }
    let mut perf_json = Vec::new();
    if !perf.is_empty() {
        writeln!(w, "ucx_perftest in the same reps, median: one-way µs (MB/s)")?;
        for ((wire, test, size), (lat, bw)) in &perf {
            writeln!(w, "  {wire} {test} {size}: {:.2} ({:.0})", median(lat), median(bw))?;
            perf_json.push(json!({ "wire": wire, "test": test, "size": size, "oneway_us": stats_json(lat), "bandwidth_MBps": stats_json(bw) }));
        }
        // Ratios measured in the same run.
        for wire in wires.iter().filter(|w| w.starts_with("ucx")) {
            let ours8 = samples.get(&(wire.to_string(), 8)).map(|s| median(&s.0));
            let lat8 = perf
                .get(&(wire.to_string(), "tag_lat".into(), 8))
                .map(|s| median(&s.0));
            let ours4 = samples
                .get(&(wire.to_string(), 4 << 20))
                .map(|s| median(&s.1));
            let bw4 = perf
                .get(&(wire.to_string(), "tag_bw".into(), 4 << 20))
                .map(|s| median(&s.1));
            if let (Some(o), Some(p)) = (ours8, lat8) {
                writeln!(w, "  {wire}: 8 B one-way / tag_lat = {:.2}x", o / p)?;
            }
            if let (Some(o), Some(p)) = (ours4, bw4) {
                writeln!(w, "  {wire}: 4 MiB MB/s / tag_bw = {:.0}%", 100.0 * o / p)?;
            }
        }
    }
    print!("{w}");
    let doc: Value = json!({
        "bench": "transport",
        "reps": cli.reps,
        "pin": cli.pin,
        "busy": cli.busy,
        "budget_ms": cli.budget_ms,
        "idle_ms": cli.idle_ms,
        "load_start": load_start,
        "load_end": load_end,
        "cpu": cpu_model(),
        "nproc": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "rows": rows_json,
        "idle": idle_json,
        "ucx_perftest": perf_json,
        "table": w,
    });
    if let Some(dir) = out_path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out_path, serde_json::to_string_pretty(&doc)?)?;
    eprintln!("bench_transport: wrote {}", out_path.display());
    Ok(())
}
