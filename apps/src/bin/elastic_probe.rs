//! elastic_probe: group, nodegroup and readonly state across rescales.
//!
//! `elastic_probe [--rounds R] [--factor F] [--sync-every S]`. Main sets the readonly factor,
//! creates a group and a nodegroup, and runs R rounds: each round is a
//! broadcast to both, answered by one sum reduction each of
//! `[factor, PE (or node), 1]` per member. A round that began and ended in
//! one view must see exactly that view's members: count = PEs (nodes), the
//! PE (node) numbers summing to P(P-1)/2, and every member reading the
//! readonly factor, newcomers included (they adopt it instead of running
//! main). A round a rescale interrupted is not checked (its members are
//! those of two views). Prints `rescaled pes=P nodes=N` per rescale (the
//! program's rescale callback), and at the end
//! `probe ok rounds=R rescales=K unchecked=U` or `probe FAILED: ...` (exit 1).
//!
//! With `--sync-every S`, every S rounds an array of one element per PE
//! calls `at_sync` (nothing else is in flight then), which is where a
//! `--mode restart` checkpoint is taken: the rounds after a restart check
//! the restored group and nodegroup the same way.

use ductile::prelude::*;
use ductile::NodeGroupProxy;
use ductile_apps::args;

static FACTOR: Readonly<u64> = Readonly::new("elastic_probe.factor");

#[derive(Clone, Debug, Serialize, Deserialize)]
enum MemberMsg {
    Round,
}

#[derive(Serialize, Deserialize)]
struct PerPe;
impl Chare for PerPe {
    const NAME: &'static str = "elastic_probe::PerPe";
    type Index = ();
    type Init = ();
    type Msg = MemberMsg;
    fn new(_: (), _: &mut Ctx<'_, Self>) -> Self {
        PerPe
    }
    fn handle(&mut self, MemberMsg::Round: MemberMsg, ctx: &mut Ctx<'_, Self>) {
        let v = vec![*FACTOR.get(ctx), ctx.my_pe() as u64, 1];
        ctx.contribute(v, Reducer::Sum, Callback::main::<Main>(MainMsg::Group));
    }
}

#[derive(Serialize, Deserialize)]
struct PerNode;
impl Chare for PerNode {
    const NAME: &'static str = "elastic_probe::PerNode";
    type Index = ();
    type Init = ();
    type Msg = MemberMsg;
    fn new(_: (), _: &mut Ctx<'_, Self>) -> Self {
        PerNode
    }
    fn handle(&mut self, MemberMsg::Round: MemberMsg, ctx: &mut Ctx<'_, Self>) {
        let v = vec![*FACTOR.get(ctx), ctx.my_node() as u64, 1];
        ctx.contribute(v, Reducer::Sum, Callback::main::<Main>(MainMsg::Node));
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum SyncMsg {
    Sync,
}

/// An element that only reaches sync points.
#[derive(Serialize, Deserialize)]
struct Syncer;
impl Chare for Syncer {
    const NAME: &'static str = "elastic_probe::Syncer";
    type Index = u64;
    type Init = ();
    type Msg = SyncMsg;
    fn new(_: (), _: &mut Ctx<'_, Self>) -> Self {
        Syncer
    }
    fn handle(&mut self, SyncMsg::Sync: SyncMsg, ctx: &mut Ctx<'_, Self>) {
        ctx.at_sync();
    }
    fn resume_from_sync(&mut self, ctx: &mut Ctx<'_, Self>) {
        ctx.contribute(1u64, Reducer::Sum, Callback::main::<Main>(MainMsg::Synced));
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum MainMsg {
    Group(Vec<u64>),
    Node(Vec<u64>),
    Rescaled(u32),
    Synced(u64),
}

#[derive(Serialize, Deserialize)]
struct Main {
    rounds: u64,
    round: u64,
    factor: u64,
    group: GroupProxy<PerPe>,
    nodes: NodeGroupProxy<PerNode>,
    got: u8,
    /// The view the round in progress began in: (PEs, nodes).
    began_in: (u32, u32),
    rescales: u64,
    unchecked: u64,
    sync_every: u64,
    syncers: (ArrayProxy<Syncer>, u64),
}

fn fail(why: String) -> ! {
    println!("probe FAILED: {why}");
    std::process::exit(1)
}

impl Main {
    fn check(&self, what: &str, v: &[u64], members: u64) {
        let want = vec![self.factor * members, members * (members - 1) / 2, members];
        if v != want {
            fail(format!(
                "round {} {what}: got [factor sum, id sum, count] = {v:?}, want {want:?}",
                self.round
            ));
        }
    }

    fn start_round(&mut self, ctx: &mut PeCtx<'_>) {
        self.got = 0;
        self.began_in = (ctx.num_pes(), ctx.num_nodes());
        self.group.broadcast(ctx, MemberMsg::Round);
        self.nodes.broadcast(ctx, MemberMsg::Round);
    }
}

impl Chare for Main {
    const NAME: &'static str = "elastic_probe::Main";
    type Index = ();
    type Init = Vec<String>;
    type Msg = MainMsg;

    fn new(a: Vec<String>, ctx: &mut Ctx<'_, Self>) -> Self {
        let ProbeArgs {
            rounds,
            factor,
            sync_every,
        } = args::parse_main("elastic_probe", &a);
        FACTOR.set(ctx, factor);
        let elements = ctx.num_pes() as u64;
        let mut m = Main {
            rounds,
            round: 0,
            factor,
            group: GroupProxy::create(ctx, ()),
            nodes: NodeGroupProxy::create(ctx, ()),
            got: 0,
            began_in: (0, 0),
            rescales: 0,
            unchecked: 0,
            sync_every,
            syncers: (ArrayProxy::create(ctx, elements, ()), elements),
        };
        ctx.on_rescale(Callback::main::<Main>(MainMsg::Rescaled));
        m.start_round(ctx);
        m
    }

    fn handle(&mut self, msg: MainMsg, ctx: &mut Ctx<'_, Self>) {
        let exact = self.began_in == (ctx.num_pes(), ctx.num_nodes());
        match msg {
            MainMsg::Rescaled(pes) => {
                if pes != ctx.num_pes() {
                    fail(format!(
                        "the rescale callback says {pes} PEs, the job has {}",
                        ctx.num_pes()
                    ));
                }
                println!("rescaled pes={pes} nodes={}", ctx.num_nodes());
                self.rescales += 1;
                return;
            }
            MainMsg::Synced(n) => {
                if n != self.syncers.1 {
                    fail(format!("{n} syncers resumed, want {}", self.syncers.1));
                }
                self.start_round(ctx);
                return;
            }
            MainMsg::Group(v) => {
                if exact {
                    self.check("group", &v, ctx.num_pes() as u64);
                }
            }
            MainMsg::Node(v) => {
                if exact {
                    self.check("nodegroup", &v, ctx.num_nodes() as u64);
                }
            }
        }
        self.got += 1;
        if self.got < 2 {
            return;
        }
        if !exact {
            self.unchecked += 1;
        }
        self.round += 1;
        if self.round == self.rounds {
            println!(
                "probe ok rounds={} rescales={} unchecked={} pes={}",
                self.rounds,
                self.rescales,
                self.unchecked,
                ctx.num_pes()
            );
            ctx.exit(0);
        } else if self.sync_every > 0 && self.round % self.sync_every == 0 {
            self.syncers.0.broadcast(ctx, SyncMsg::Sync);
        } else {
            self.start_round(ctx);
        }
    }
}

/// The command line (`elastic_probe --help`), checked before the node joins.
#[derive(clap::Parser, Debug)]
#[command(
    name = "elastic_probe",
    about = "Rounds of group and nodegroup reductions checked exactly at every shape, across rescales; ends with `probe ok`"
)]
struct ProbeArgs {
    /// Rounds to run.
    #[arg(long, value_name = "N", default_value_t = 2000, value_parser = args::at_least_one::<u64>)]
    rounds: u64,
    /// The readonly factor each member multiplies in.
    #[arg(long, value_name = "F", default_value_t = 7)]
    factor: u64,
    /// Every S rounds an array joins a sync point (where --mode restart checkpoints); 0: never.
    #[arg(long = "sync-every", value_name = "S", default_value_t = 0)]
    sync_every: u64,
}

fn main() {
    let _: ProbeArgs = args::parse_or_exit("elastic_probe");
    ductile::launch(|reg| {
        reg.main::<Main>()
            .chare::<PerPe>()
            .chare::<PerNode>()
            .chare::<Syncer>()
            .readonly(&FACTOR);
    })
}
