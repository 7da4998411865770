//! Pingpong: round-trip latency and bandwidth between two array elements on
//! PE 0 and PE 1, or the PE `--peer-pe` names (same node or not, depending
//! on how the job is shaped: with 2 PEs per node, `--peer-pe 2` measures
//! across nodes while each node's other PE idles). With `--pairs N`, N
//! pairs exchange at once, pair k between PE k and PE `peer-pe + k` (with
//! 2 PEs per node, `--peer-pe 2 --pairs 2`: both PEs of each node busy,
//! their frames through the node's one transport).
//!
//! `pingpong [--sizes 8,1024,...] [--min-iters N] [--budget-ms MS] [--gap-us US] [--peer-pe P] [--pairs N] [--hold SECS]`
//! prints one `pingpong size=<bytes> iters=<n> pairs=<N> oneway_us=<us>
//! slowest_us=<us> bandwidth_MBps=<MB/s>` line per size: `oneway_us` the
//! pairs' mean, `slowest_us` the slowest pair's, `bandwidth_MBps` the
//! pairs' sum. With `--gap-us`, element 0 waits
//! that long (a timer) between round trips, so the other PE has spun out
//! and sleeps when each ping comes: the figure is then a message to a
//! sleeping PE, wake-up included (only the round trips are timed, not the
//! gaps). With `--hold`, the job then idles
//! for SECS (nothing queued anywhere, main waits on a timer) before it
//! exits, printing `pingpong holding secs=<s>` when the hold starts: what
//! an idle job costs is measured over that window.

use std::time::{Duration, Instant};

use ductile::prelude::*;
use ductile_apps::args;

const DEFAULT_SIZES: &[usize] = &[8, 64, 512, 1024, 8192, 65536, 262_144, 1 << 20, 4 << 20];

#[derive(Clone, Debug, Serialize, Deserialize)]
enum PlayerMsg {
    /// To a pair's first element: run `iters` round trips of `size` bytes (after `warmup` untimed ones).
    Run {
        size: usize,
        iters: u64,
        warmup: u64,
    },
    Ping(Bulk<u8>),
    Pong(Bulk<u8>),
    /// To a pair's first element: the gap is over, send the next ping.
    Next(()),
}

#[derive(Serialize, Deserialize)]
struct Player {
    left: u64,
    warmup: u64,
    iters: u64,
    size: usize,
    /// Between round trips (`--gap-us`); zero: none.
    gap: Duration,
    /// The timed round trips' total, with a gap (without one, `t0` times
    /// them all at once).
    timed: Duration,
    /// The payload kept over a gap.
    #[serde(skip)]
    held: Option<Bulk<u8>>,
    #[serde(skip)]
    t0: Option<Instant>,
}

impl Chare for Player {
    const NAME: &'static str = "pingpong::Player";
    type Index = u32;
    type Init = Duration;
    type Msg = PlayerMsg;

    fn new(gap: Duration, _: &mut Ctx<'_, Self>) -> Self {
        Player {
            left: 0,
            warmup: 0,
            iters: 0,
            size: 0,
            gap,
            timed: Duration::ZERO,
            held: None,
            t0: None,
        }
    }

    fn handle(&mut self, msg: PlayerMsg, ctx: &mut Ctx<'_, Self>) {
        // Pair k: elements 2k (the pinger) and 2k + 1.
        let other = ctx.this_array().elem(ctx.index() ^ 1);
        match msg {
            PlayerMsg::Run {
                size,
                iters,
                warmup,
            } => {
                (self.size, self.iters, self.warmup, self.left) =
                    (size, iters, warmup, iters + warmup);
                self.timed = Duration::ZERO;
                self.t0 = Some(Instant::now());
                other.send(ctx, PlayerMsg::Ping(Bulk(vec![7u8; size])));
            }
            PlayerMsg::Ping(data) => other.send(ctx, PlayerMsg::Pong(data)),
            PlayerMsg::Next(()) => {
                let data = self.held.take().expect("a payload kept over the gap");
                self.t0 = Some(Instant::now());
                other.send(ctx, PlayerMsg::Ping(data));
            }
            PlayerMsg::Pong(data) => {
                let timing = self.left <= self.iters;
                self.left -= 1;
                if self.gap.is_zero() {
                    if self.left == self.iters {
                        self.t0 = Some(Instant::now());
                    }
                } else if timing {
                    self.timed += self.t0.map_or(Duration::ZERO, |t| t.elapsed());
                }
                if self.left > 0 && self.gap.is_zero() {
                    other.send(ctx, PlayerMsg::Ping(data));
                } else if self.left > 0 {
                    self.held = Some(data);
                    let me = ctx.this_array().elem(ctx.index());
                    ctx.after(self.gap, Callback::element(me, PlayerMsg::Next));
                } else {
                    let secs = if self.gap.is_zero() {
                        self.t0.map_or(0.0, |t| t.elapsed().as_secs_f64())
                    } else {
                        self.timed.as_secs_f64()
                    };
                    main_chare::<Main>().send(
                        ctx,
                        MainMsg::Done {
                            size: self.size,
                            iters: self.iters,
                            secs,
                        },
                    );
                }
            }
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum MainMsg {
    /// A pair finished a size: `iters` timed round trips took `secs`.
    Done { size: usize, iters: u64, secs: f64 },
    /// The `--hold` is over.
    Held(()),
}

#[derive(Serialize, Deserialize)]
struct Main {
    players: ArrayProxy<Player>,
    pairs: u32,
    /// One-way µs of each pair that finished the current size.
    done: Vec<f64>,
    sizes: Vec<usize>,
    next: usize,
    min_iters: u64,
    budget_ms: f64,
    gap: Duration,
    hold_s: f64,
}

impl Main {
    fn run_next(&mut self, ctx: &mut PeCtx<'_>) {
        let Some(&size) = self.sizes.get(self.next) else {
            if self.hold_s > 0.0 {
                println!("pingpong holding secs={}", self.hold_s);
                let hold = Duration::from_secs_f64(self.hold_s);
                self.hold_s = 0.0;
                ctx.after(hold, Callback::main::<Main>(MainMsg::Held));
                return;
            }
            println!(
                "pingpong done pes={} nodes={}",
                ctx.num_pes(),
                ctx.num_nodes()
            );
            ctx.exit(0);
            return;
        };
        self.next += 1;
        // Fewer round trips for big messages: aim for the time budget at ~1 GB/s.
        let est_us = 20.0 + size as f64 / 1e3 + self.gap.as_secs_f64() * 1e6;
        let iters = ((self.budget_ms * 1e3 / est_us) as u64).clamp(self.min_iters, 20_000);
        for k in 0..self.pairs {
            self.players.elem(2 * k).send(
                ctx,
                PlayerMsg::Run {
                    size,
                    iters,
                    warmup: (iters / 10).max(2),
                },
            );
        }
    }
}

impl Chare for Main {
    const NAME: &'static str = "pingpong::Main";
    type Index = ();
    type Init = Vec<String>;
    type Msg = MainMsg;

    fn new(a: Vec<String>, ctx: &mut Ctx<'_, Self>) -> Self {
        if ctx.num_pes() < 2 {
            eprintln!("pingpong needs at least 2 PEs");
            std::process::exit(2);
        }
        let PingpongArgs {
            sizes,
            min_iters,
            budget_ms,
            gap_us,
            peer_pe,
            pairs,
            hold,
        } = args::parse_main("pingpong", &a);
        if pairs > peer_pe || peer_pe + pairs > ctx.num_pes() {
            eprintln!(
                "pingpong: {pairs} pair(s) from --peer-pe {peer_pe} need PEs 0..{} and {peer_pe}..{}, \
                 each PE in one pair; this job has {} PEs",
                pairs - 1,
                peer_pe + pairs - 1,
                ctx.num_pes()
            );
            std::process::exit(2);
        }
        let gap = Duration::from_secs_f64(gap_us / 1e6);
        // Elements spread over all PEs would land elsewhere; place each
        // pair's on its two PEs.
        let players = ArrayProxy::<Player>::create_empty(ctx);
        for k in 0..pairs {
            players.insert_on(ctx, 2 * k, k, gap);
            players.insert_on(ctx, 2 * k + 1, peer_pe + k, gap);
        }
        let mut m = Main {
            players,
            pairs,
            done: Vec::new(),
            sizes,
            next: 0,
            min_iters,
            budget_ms,
            gap,
            hold_s: hold,
        };
        m.run_next(ctx);
        m
    }

    fn handle(&mut self, msg: MainMsg, ctx: &mut Ctx<'_, Self>) {
        let MainMsg::Done { size, iters, secs } = msg else {
            self.run_next(ctx);
            return;
        };
        self.done.push(secs * 1e6 / iters as f64 / 2.0);
        if self.done.len() < self.pairs as usize {
            return;
        }
        let oneway: Vec<f64> = std::mem::take(&mut self.done);
        let mean_us = oneway.iter().sum::<f64>() / oneway.len() as f64;
        let slowest_us = oneway.iter().copied().fold(0.0, f64::max);
        let mbps: f64 = oneway
            .iter()
            .filter(|&&us| us > 0.0)
            .map(|us| size as f64 / us)
            .sum();
        println!(
            "pingpong size={size} iters={iters} pairs={} oneway_us={mean_us:.3} slowest_us={slowest_us:.3} bandwidth_MBps={mbps:.1}",
            self.pairs
        );
        self.run_next(ctx);
    }
}

/// The command line (`pingpong --help`), checked before the node joins.
#[derive(clap::Parser, Debug)]
#[command(
    name = "pingpong",
    about = "Round-trip latency and bandwidth between PE 0 and PE 1, or --peer-pe, or --pairs at once (needs at least 2 PEs); one line per message size"
)]
struct PingpongArgs {
    /// Message sizes in bytes, comma-separated.
    #[arg(long, value_name = "B,...", value_delimiter = ',', default_values_t = DEFAULT_SIZES.to_vec())]
    sizes: Vec<usize>,
    /// Round trips per size at least (more while within --budget-ms).
    #[arg(long = "min-iters", value_name = "N", default_value_t = 20, value_parser = args::at_least_one::<u64>)]
    min_iters: u64,
    /// Time to spend per size, in ms.
    #[arg(long = "budget-ms", value_name = "MS", default_value_t = 200.0)]
    budget_ms: f64,
    /// Wait this long between round trips (a timer on PE 0), so the other
    /// PE sleeps when each ping comes; only the round trips are timed.
    #[arg(long = "gap-us", value_name = "US", default_value_t = 0.0, value_parser = args::non_negative)]
    gap_us: f64,
    /// The PE of the second element (PE 0 has the first); not 0.
    #[arg(long = "peer-pe", value_name = "P", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    peer_pe: u32,
    /// Pairs exchanging at once: pair k between PE k and PE peer-pe + k
    /// (at most peer-pe pairs, so each PE is in one).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pairs: u32,
    /// After the sizes, idle this many seconds before exiting (to measure
    /// an idle job's CPU); 0: exit at once.
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    hold: f64,
}

fn main() {
    let _: PingpongArgs = args::parse_or_exit("pingpong");
    ductile::launch(|reg| {
        reg.main::<Main>().chare::<Player>();
    })
}
