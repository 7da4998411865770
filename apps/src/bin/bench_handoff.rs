//! `bench_handoff`: what handing a message between two threads costs on
//! this machine, apart from the runtime: the floor under the in-process
//! one-way figure (`pingpong` on 1 node x 2 PEs, issue 19's 0.3 µs target).
//!
//! `bench_handoff [--reps N] [--trips N] [--out PATH]`
//!
//! Two threads pinned to the first two CPUs this process may use pass a
//! token back and forth `--trips` times; one-way ns is half a round trip:
//! - `line`: one atomic word each way (a cache line's transfer: nothing
//!   below it moves a message between cores);
//! - `queue`: crossbeam's `SegQueue` (the PE inbox's queue) of a 48-byte
//!   value, polled by `pop` as an idle PE polls;
//! - `queue+box`: the same with the value boxed, as an in-process message
//!   travels (`Payload::Local`);
//! - `ring`: what a queue per sending thread could cost, each slot one
//!   cache line holding the 48-byte value and its sequence number, polled
//!   by the receiver at the slot it expects next (a single-producer ring,
//!   without the check a full ring needs: a ping-pong has one message
//!   out).
//!
//! Prints medians [min..max] of `--reps` runs and writes them as JSON to
//! `target/bench/handoff.json` (or `--out`). Timings only.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use crossbeam_queue::SegQueue;
use ductile::affinity::{allowed_cpus, pin_this_pe, Affinity};
use ductile_apps::bench::{loadavg, stats, stats_json};
use serde_json::json;

/// The command line (`bench_handoff --help`).
#[derive(clap::Parser, Debug)]
#[command(
    name = "bench_handoff",
    about = "One-way cost of handing a message between two pinned threads (a cache line, the inbox's queue, a boxed message); writes target/bench/handoff.json"
)]
struct Cli {
    /// Runs of each kind (the median is reported).
    #[arg(long, value_name = "N", default_value_t = 7)]
    reps: usize,
    /// Round trips per run.
    #[arg(long, value_name = "N", default_value_t = 300_000)]
    trips: u64,
    /// Where to write the JSON [default: target/bench/handoff.json].
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
}

/// A value the size of an envelope.
#[derive(Default)]
struct Msg([u64; 6]);

/// One way of passing a token: `send` to the other side, `recv` spins
/// until the other side's token comes.
trait Channel: Send + Sync + 'static {
    fn send(&self, token: u64);
    fn recv(&self) -> u64;
}

/// One atomic word per direction.
#[derive(Default)]
struct Line(AtomicU64);

impl Channel for Line {
    fn send(&self, token: u64) {
        self.0.store(token, Ordering::Release);
    }
    fn recv(&self) -> u64 {
        loop {
            let t = self.0.swap(0, Ordering::Acquire);
            if t != 0 {
                return t;
            }
            std::hint::spin_loop();
        }
    }
}

/// Pops `q`'s next value, polling as an idle PE polls its inbox.
fn spin_pop<T>(q: &SegQueue<T>) -> T {
    loop {
        if let Some(v) = q.pop() {
            return v;
        }
        std::hint::spin_loop();
    }
}

#[derive(Default)]
struct Queue(SegQueue<Msg>);

impl Channel for Queue {
    fn send(&self, token: u64) {
        self.0.push(Msg([token; 6]));
    }
    fn recv(&self) -> u64 {
        spin_pop(&self.0).0[0]
    }
}

#[derive(Default)]
struct Boxed(SegQueue<Box<Msg>>);

impl Channel for Boxed {
    fn send(&self, token: u64) {
        self.0.push(Box::new(Msg([token; 6])));
    }
    fn recv(&self) -> u64 {
        spin_pop(&self.0).0[0]
    }
}

/// A single-producer ring of one-line slots.
struct Ring {
    slots: Vec<Slot>,
    /// Sent so far (the producer's own count).
    sent: AtomicU64,
    /// Received so far (the consumer's own count).
    received: AtomicU64,
}

#[repr(align(64))]
#[derive(Default)]
struct Slot {
    /// The message number this slot holds, plus one (0: empty).
    seq: AtomicU64,
    value: [AtomicU64; 6],
}

const RING: usize = 64;

impl Default for Ring {
    fn default() -> Self {
        Ring {
            slots: (0..RING).map(|_| Slot::default()).collect(),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
        }
    }
}

impl Channel for Ring {
    fn send(&self, token: u64) {
        let n = self.sent.load(Ordering::Relaxed);
        let slot = &self.slots[n as usize % RING];
        for w in &slot.value {
            w.store(token, Ordering::Relaxed);
        }
        slot.seq.store(n + 1, Ordering::Release);
        self.sent.store(n + 1, Ordering::Relaxed);
    }
    fn recv(&self) -> u64 {
        let n = self.received.load(Ordering::Relaxed);
        let slot = &self.slots[n as usize % RING];
        while slot.seq.load(Ordering::Acquire) != n + 1 {
            std::hint::spin_loop();
        }
        self.received.store(n + 1, Ordering::Relaxed);
        slot.value[0].load(Ordering::Relaxed)
    }
}

/// One run: nanoseconds one way.
fn one_way<C: Channel + Default>(trips: u64, cpus: &[usize]) -> f64 {
    let (ping, pong) = (Arc::new(C::default()), Arc::new(C::default()));
    let (p, q) = (ping.clone(), pong.clone());
    let allowed = cpus.to_vec();
    let echo = std::thread::spawn(move || {
        pin_this_pe(1, 2, &allowed, Affinity::On, None);
        for _ in 0..trips {
            q.send(p.recv());
        }
    });
    pin_this_pe(0, 2, cpus, Affinity::On, None);
    let t0 = Instant::now();
    for t in 1..=trips {
        ping.send(t);
        let back = pong.recv();
        assert_eq!(back, t, "the token came back changed");
    }
    let ns = t0.elapsed().as_nanos() as f64 / trips as f64 / 2.0;
    echo.join().expect("the echo thread");
    ns
}

fn main() -> Result<()> {
    let cli: Cli = ductile_apps::args::parse_or_exit("bench_handoff");
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        bail!("bench_handoff needs two CPUs, this process may use {cpus:?}");
    }
    let kinds: [(&str, fn(u64, &[usize]) -> f64); 4] = [
        ("line", one_way::<Line>),
        ("queue", one_way::<Queue>),
        ("queue+box", one_way::<Boxed>),
        ("ring", one_way::<Ring>),
    ];
    let load = loadavg();
    let mut samples = vec![Vec::new(); kinds.len()];
    // Kinds alternated run by run, so drift in the machine's load falls
    // on each alike.
    for _ in 0..cli.reps {
        for (k, (_, run)) in kinds.iter().enumerate() {
            samples[k].push(run(cli.trips, &cpus));
        }
    }
    println!(
        "bench_handoff: CPUs {} and {}, {} round trips x {} runs, load {}",
        cpus[0],
        cpus[1],
        cli.trips,
        cli.reps,
        load.as_deref().unwrap_or("?")
    );
    println!("| handoff | one-way ns, median [min..max] |");
    println!("|---|---|");
    let mut out = serde_json::Map::new();
    for ((name, _), s) in kinds.iter().zip(&samples) {
        let st = stats(s);
        println!(
            "| {name} | {:.0} [{:.0}..{:.0}] |",
            st.median, st.min, st.max
        );
        out.insert((*name).into(), stats_json(s));
    }
    let path = cli
        .out
        .unwrap_or_else(|| PathBuf::from("target/bench/handoff.json"));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let doc = json!({
        "trips": cli.trips, "cpus": [cpus[0], cpus[1]], "load": load, "one_way_ns": out,
    });
    std::fs::write(&path, serde_json::to_string_pretty(&doc)? + "\n")?;
    println!("wrote {}", path.display());
    Ok(())
}
