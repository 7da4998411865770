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

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
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
        let parse = || -> Result<Setup, String> {
            let per_pe = args::parse(&a, "per-pe", 8u64)?;
            let load = match args::value(&a, "load").unwrap_or("uniform") {
                "uniform" => Load::Uniform,
                "random" => Load::Random,
                "heavy" => Load::Heavy,
                other => return Err(format!("--load {other}: expected uniform, random or heavy")),
            };
            Ok(Setup {
                elems: per_pe * ctx.num_pes() as u64,
                iters: args::parse(&a, "iters", 100u64)?,
                lb_every: args::parse(&a, "lb-every", 0u64)?,
                work_us: args::parse(&a, "work-us", 200.0f64)?,
                msg_bytes: args::parse(&a, "msg-bytes", 1024usize)?,
                load,
                per_pe,
            })
        };
        let setup = parse().unwrap_or_else(|e| {
            eprintln!("lbbench: {e}");
            std::process::exit(2)
        });
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

fn main() {
    ductile::launch(|reg| {
        reg.main::<Main>().chare::<Elem>().readonly(&SETUP);
    })
}
