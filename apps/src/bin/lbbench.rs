//! lbbench: a synthetic load-balancing benchmark. A 1D array of elements
//! each does a fixed amount of compute per iteration (its *weight*) and passes
//! a message around a ring; every `--lb-every` iterations the array joins a
//! load-balancing step.
//!
//! `lbbench [--per-pe E] [--iters K] [--lb-every L] [--load uniform|random|heavy]
//!          [--work-us W] [--msg-bytes B] [+lb STRATEGY] [+pe-speed PE:F,...] [+lb-report]`
//!
//! Work is counted in kernel steps, not time, so a slower PE (real or emulated
//! with `+pe-speed`) really takes longer. The result line is
//! `lbbench ... time_per_iter_ms=<ms>`, then `checksum=<hex>` of the work
//! done, which does not depend on placement.

use std::hint::black_box;
use std::time::Instant;

use ductile::prelude::*;
use ductile_apps::args;
use ductile_apps::megatest::draw;

/// Kernel steps per nominal microsecond of work (roughly, on a current core).
const STEPS_PER_US: u64 = 400;

fn work(steps: u64, seed: u64) -> u64 {
    let mut x = black_box(seed | 1);
    for i in 0..steps {
        x = x.rotate_left(5) ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    black_box(x)
}

/// The benchmark's parameters, shared by every element.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Setup {
    elems: u64,
    iters: u64,
    lb_every: u64,
    work_us: f64,
    msg_bytes: usize,
    load: Load,
    per_pe: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, clap::ValueEnum)]
enum Load {
    Uniform,
    Random,
    Heavy,
}

static SETUP: Readonly<Setup> = Readonly::new("lbbench.setup");

#[derive(Clone, Debug, Serialize, Deserialize)]
enum ElemMsg {
    Start,
    Pass { iter: u64, data: Bulk<u8> },
}

#[derive(Serialize, Deserialize)]
struct Elem {
    weight: f64,
    iter: u64,
    have_left: bool,
    synced: bool,
    /// `Start` arrived; a `Pass` that overtook it waits in `early`, or this
    /// element would skip sending its own first `Pass`.
    started: bool,
    acc: u64,
    early: Pending<Bulk<u8>>,
}

impl Elem {
    fn step(&mut self, ctx: &mut Ctx<'_, Self>) {
        let s = *SETUP.get(ctx);
        while self.have_left && !self.synced && self.iter < s.iters {
            let steps = (self.weight * s.work_us * STEPS_PER_US as f64) as u64;
            self.acc = self.acc.wrapping_add(work(steps, ctx.index() ^ self.iter));
            self.iter += 1;
            self.have_left = false;
            if self.iter == s.iters {
                ctx.contribute(
                    self.acc,
                    Reducer::Sum,
                    Callback::main::<Main>(MainMsg::Done),
                );
                return;
            }
            if s.lb_every > 0 && self.iter % s.lb_every == 0 {
                self.synced = true;
                ctx.at_sync();
                return;
            }
            self.pass(ctx);
        }
    }

    fn pass(&mut self, ctx: &mut Ctx<'_, Self>) {
        let s = *SETUP.get(ctx);
        let right = (ctx.index() + 1) % s.elems;
        let msg = ElemMsg::Pass {
            iter: self.iter,
            data: Bulk(vec![0u8; s.msg_bytes]),
        };
        ctx.this_array().elem(right).send(ctx, msg);
        if !self.early.release(self.iter).is_empty() {
            self.have_left = true;
        }
    }
}

impl Chare for Elem {
    const NAME: &'static str = "lbbench::Elem";
    type Index = u64;
    type Init = ();
    type Msg = ElemMsg;

    fn new(_: (), ctx: &mut Ctx<'_, Self>) -> Self {
        let s = *SETUP.get(ctx);
        let i = ctx.index();
        let weight = match s.load {
            Load::Uniform => 1.0,
            Load::Random => 0.5 + (draw(7, i) % 1000) as f64 / 1000.0,
            // The first PE's share of the block map is three times heavier.
            Load::Heavy => {
                if i < s.per_pe {
                    3.0
                } else {
                    1.0
                }
            }
        };
        Elem {
            weight,
            iter: 0,
            have_left: false,
            synced: false,
            started: false,
            acc: 0,
            early: Pending::new(),
        }
    }

    fn handle(&mut self, msg: ElemMsg, ctx: &mut Ctx<'_, Self>) {
        match msg {
            ElemMsg::Start => {
                self.started = true;
                self.pass(ctx);
                self.step(ctx);
            }
            ElemMsg::Pass { iter, data } => {
                if iter == self.iter && self.started && !self.have_left {
                    self.have_left = true;
                    self.step(ctx);
                } else {
                    self.early.hold(iter, data);
                }
            }
        }
    }

    fn resume_from_sync(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.synced = false;
        self.pass(ctx);
        self.step(ctx);
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum MainMsg {
    Done(u64),
}

#[derive(Serialize, Deserialize)]
struct Main {
    #[serde(skip)]
    started: Option<Instant>,
}

impl Chare for Main {
    const NAME: &'static str = "lbbench::Main";
    type Index = ();
    type Init = Vec<String>;
    type Msg = MainMsg;

    fn new(a: Vec<String>, ctx: &mut Ctx<'_, Self>) -> Self {
        let a: LbbenchArgs = args::parse_main("lbbench", &a);
        let setup = Setup {
            elems: a.per_pe * ctx.num_pes() as u64,
            iters: a.iters,
            lb_every: a.lb_every,
            work_us: a.work_us,
            msg_bytes: a.msg_bytes,
            load: a.load,
            per_pe: a.per_pe,
        };
        SETUP.set(ctx, setup);
        let arr = ArrayProxy::<Elem>::create(ctx, setup.elems, ());
        arr.broadcast(ctx, ElemMsg::Start);
        Main {
            started: Some(Instant::now()),
        }
    }

    fn handle(&mut self, msg: MainMsg, ctx: &mut Ctx<'_, Self>) {
        let MainMsg::Done(acc) = msg;
        let s = *SETUP.get(ctx);
        let secs = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        println!(
            "lbbench elems={} pes={} load={:?} iters={} lb_every={} seconds={secs:.6} time_per_iter_ms={:.4}",
            s.elems,
            ctx.num_pes(),
            s.load,
            s.iters,
            s.lb_every,
            secs * 1e3 / s.iters as f64
        );
        println!("checksum={acc:016x}");
        ctx.exit(0);
    }
}

/// The command line (`lbbench --help`), checked before the node joins; the
/// runtime's `+lb`, `+pe-speed`, `+lb-report` go beside it.
#[derive(clap::Parser, Debug)]
#[command(
    name = "lbbench",
    about = "A synthetic load-balancing benchmark: elements of chosen weights pass a message around a ring and join LB steps"
)]
struct LbbenchArgs {
    /// Elements per PE.
    #[arg(long = "per-pe", value_name = "E", default_value_t = 8, value_parser = args::at_least_one::<u64>)]
    per_pe: u64,
    /// Iterations to run.
    #[arg(long, value_name = "K", default_value_t = 100, value_parser = args::at_least_one::<u64>)]
    iters: u64,
    /// Load-balance (AtSync) every L iterations; 0: never.
    #[arg(long = "lb-every", value_name = "L", default_value_t = 0)]
    lb_every: u64,
    /// How the elements' weights are drawn.
    #[arg(long, value_enum, default_value_t = Load::Uniform)]
    load: Load,
    /// Nominal microseconds of work per element and iteration at weight 1.
    #[arg(long = "work-us", value_name = "W", default_value_t = 200.0)]
    work_us: f64,
    /// Bytes of the message each element passes on per iteration.
    #[arg(long = "msg-bytes", value_name = "B", default_value_t = 1024)]
    msg_bytes: usize,
}

fn main() {
    let _: LbbenchArgs = args::parse_or_exit("lbbench");
    ductile::launch(|reg| {
        reg.main::<Main>().chare::<Elem>().readonly(&SETUP);
    })
}
