//! Collectives and migration: what a broadcast + reduction round and one
//! migration of a small element cost (issue 19's targets; docs/message-path.md).
//!
//! `collectives [--rounds N] [--hops N] [--carry BYTES]` prints
//! `collectives round pes=P rounds=N round_us=X`: main broadcasts to an
//! array of one element per PE, each contributes 1 to a sum reduction whose
//! callback is main's, which checks the sum and starts the next round;
//! and `collectives migration hops=N hop_us=X`: one small element moves
//! between PE 0 and PE 1, each hop its own `migrate_me` and the message it
//! sent itself just before, forwarded to where it went. Both after a tenth
//! as many untimed. With `--carry`, that message brings BYTES of payload
//! the element keeps and takes along on its next hop, right after: each
//! arrival checks the payload it carried over and the one just received,
//! byte for byte. Timings only: the job fails only on a wrong sum or a
//! payload that changed.

use std::time::Instant;

use ductile::prelude::*;
use ductile_apps::args;

#[derive(Clone, Debug, Serialize, Deserialize)]
enum MemberMsg {
    Round,
}

#[derive(Serialize, Deserialize)]
struct Member;

impl Chare for Member {
    const NAME: &'static str = "collectives::Member";
    type Index = u32;
    type Init = ();
    type Msg = MemberMsg;

    fn new(_: (), _: &mut Ctx<'_, Self>) -> Self {
        Member
    }

    fn handle(&mut self, MemberMsg::Round: MemberMsg, ctx: &mut Ctx<'_, Self>) {
        ctx.contribute(1u64, Reducer::Sum, Callback::main::<Main>(MainMsg::Summed));
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum TravellerMsg {
    /// Move to the other PE and hop on, `left` more times; `payload` is
    /// the hop's (`--carry`), to keep.
    Hop {
        left: u64,
        payload: Option<Bulk<u8>>,
    },
}

/// A small element that moves between PE 0 and PE 1.
#[derive(Serialize, Deserialize)]
struct Traveller {
    hops: u64,
    /// The last hop's payload (`--carry`) and the hop it was made for,
    /// carried over the migration that followed.
    carried: Option<(u64, Bulk<u8>)>,
}

/// Hop `hop`'s payload of `len` bytes (none without `--carry`): each
/// hop's differs.
fn payload(hop: u64, len: usize) -> Option<Bulk<u8>> {
    (len > 0).then(|| Bulk((0..len as u64).map(|i| (i * 31 + hop * 7) as u8).collect()))
}

impl Chare for Traveller {
    const NAME: &'static str = "collectives::Traveller";
    type Index = u32;
    type Init = ();
    type Msg = TravellerMsg;

    fn new(_: (), _: &mut Ctx<'_, Self>) -> Self {
        Traveller {
            hops: 0,
            carried: None,
        }
    }

    fn handle(&mut self, msg: TravellerMsg, ctx: &mut Ctx<'_, Self>) {
        let TravellerMsg::Hop { left, payload: p } = msg;
        let len = p.as_ref().map_or(0, |p| p.len());
        // Made for this hop, sent before the migration this element kept
        // the last payload through.
        let carried_intact = self
            .carried
            .as_ref()
            .is_none_or(|(hop, c)| Some(c) == payload(*hop, len).as_ref());
        if p != payload(self.hops, len) || !carried_intact {
            eprintln!(
                "collectives: a payload of {len} bytes changed on hop {}",
                self.hops
            );
            ctx.exit(1);
            return;
        }
        self.carried = p.map(|p| (self.hops, p));
        if left == 0 {
            main_chare::<Main>().send(ctx, MainMsg::Arrived(self.hops));
            return;
        }
        self.hops += 1;
        let here = ctx.my_pe();
        ctx.migrate_me(1 - here.min(1));
        let payload = payload(self.hops, len);
        ctx.this_element().send(
            ctx,
            TravellerMsg::Hop {
                left: left - 1,
                payload,
            },
        );
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum MainMsg {
    Summed(u64),
    Arrived(u64),
}

#[derive(Serialize, Deserialize)]
struct Main {
    members: ArrayProxy<Member>,
    traveller: ArrayProxy<Traveller>,
    rounds: u64,
    hops: u64,
    /// Rounds left, timed ones included.
    left: u64,
    /// Bytes each hop carries.
    carry: usize,
    /// Hops the traveller has made.
    travelled: u64,
    #[serde(skip)]
    t0: Option<Instant>,
}

impl Main {
    fn warmup(n: u64) -> u64 {
        (n / 10).max(1)
    }

    fn hop(&mut self, ctx: &mut PeCtx<'_>) {
        let payload = payload(self.travelled, self.carry);
        self.traveller.elem(0).send(
            ctx,
            TravellerMsg::Hop {
                left: self.left,
                payload,
            },
        );
    }
}

impl Chare for Main {
    const NAME: &'static str = "collectives::Main";
    type Index = ();
    type Init = Vec<String>;
    type Msg = MainMsg;

    fn new(a: Vec<String>, ctx: &mut Ctx<'_, Self>) -> Self {
        if ctx.num_pes() < 2 {
            eprintln!("collectives needs at least 2 PEs");
            std::process::exit(2);
        }
        let CollectivesArgs {
            rounds,
            hops,
            carry,
        } = args::parse_main("collectives", &a);
        // Block-mapped: element i on PE i; the traveller starts on PE 0.
        let pes = ctx.num_pes();
        let members = ArrayProxy::<Member>::create(ctx, pes, ());
        let traveller = ArrayProxy::<Traveller>::create(ctx, 1, ());
        let m = Main {
            members,
            traveller,
            rounds,
            hops,
            left: rounds + Self::warmup(rounds),
            carry,
            travelled: 0,
            t0: None,
        };
        m.members.broadcast(ctx, MemberMsg::Round);
        m
    }

    fn handle(&mut self, msg: MainMsg, ctx: &mut Ctx<'_, Self>) {
        match msg {
            MainMsg::Summed(sum) => {
                let pes = u64::from(ctx.num_pes());
                if sum != pes {
                    eprintln!("collectives: a round summed {sum}, not {pes}");
                    ctx.exit(1);
                    return;
                }
                self.left -= 1;
                if self.left == self.rounds {
                    self.t0 = Some(Instant::now());
                }
                if self.left > 0 {
                    self.members.broadcast(ctx, MemberMsg::Round);
                    return;
                }
                let us = self.t0.map_or(0.0, |t| t.elapsed().as_secs_f64()) * 1e6;
                println!(
                    "collectives round pes={pes} rounds={} round_us={:.3}",
                    self.rounds,
                    us / self.rounds as f64
                );
                // The hops: a tenth untimed, then the timed ones.
                self.left = Self::warmup(self.hops);
                self.t0 = None;
                self.hop(ctx);
            }
            MainMsg::Arrived(done) => {
                self.travelled = done;
                if let Some(t0) = self.t0 {
                    let us = t0.elapsed().as_secs_f64() * 1e6;
                    let hops = done - Self::warmup(self.hops);
                    println!(
                        "collectives migration hops={hops} hop_us={:.3}",
                        us / hops as f64
                    );
                    ctx.exit(0);
                    return;
                }
                self.left = self.hops;
                self.t0 = Some(Instant::now());
                self.hop(ctx);
            }
        }
    }
}

/// The command line (`collectives --help`), checked before the node joins.
#[derive(clap::Parser, Debug)]
#[command(
    name = "collectives",
    about = "Broadcast + reduction rounds over one element per PE, then one small element migrating between PE 0 and PE 1 (needs at least 2 PEs)"
)]
struct CollectivesArgs {
    /// Timed broadcast + reduction rounds.
    #[arg(long, value_name = "N", default_value_t = 20_000, value_parser = args::at_least_one::<u64>)]
    rounds: u64,
    /// Timed migrations.
    #[arg(long, value_name = "N", default_value_t = 20_000, value_parser = args::at_least_one::<u64>)]
    hops: u64,
    /// Bytes of payload each hop brings and the element keeps over its next migration.
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    carry: usize,
}

fn main() {
    let _: CollectivesArgs = args::parse_or_exit("collectives");
    ductile::launch(|reg| {
        reg.main::<Main>().chare::<Member>().chare::<Traveller>();
    })
}
