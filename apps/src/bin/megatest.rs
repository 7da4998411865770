//! megatest: many small runtime tests in one program, run by the e2e suite at
//! several node x PE shapes (Charm++'s megatest, in spirit).
//!
//! `megatest <module> [--seed S] [--elems N] ...`; each module prints
//! `megatest <module> ok` plus the values it computed (which the e2e tests
//! compare with sequential computations), or `megatest <module> FAILED: ...`
//! and exits 1.
//!
//! Modules: arrays, reduce, group, readonly, insert, priority, qd, migrate,
//! destroy, exit, panic.

use std::collections::BTreeSet;

use ductile::prelude::*;
use ductile::ArrayIndex;
use ductile_apps::args;
use ductile_apps::megatest::{bool_of, chain_len, draw, float_of, int_of, readonly_digest};

fn fail(module: &str, why: impl std::fmt::Display) -> ! {
    println!("megatest {module} FAILED: {why}");
    std::process::exit(1)
}

// ---------------------------------------------------------------- arrays

/// A user-defined index: not a dense range, so its elements are inserted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
struct Cell {
    level: u8,
    id: u16,
}

impl ArrayIndex for Cell {
    fn to_key(&self) -> u128 {
        ((self.level as u128) << 16) | self.id as u128
    }
    fn from_key(key: u128) -> Option<Self> {
        (key >> 24 == 0).then_some(Cell {
            level: (key >> 16) as u8,
            id: key as u16,
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum ProbeMsg {
    /// Reply with `k` plus this element's key hash, by reduction.
    Sum(u64),
    /// Point-to-point: contribute 1 to a count.
    Ping,
}

fn key_hash(kind: u64, key: u128) -> u64 {
    draw(draw(kind, key as u64), (key >> 64) as u64)
}

macro_rules! probe {
    ($name:ident, $index:ty, $kind:expr) => {
        #[derive(Serialize, Deserialize)]
        struct $name {
            key: u64,
        }
        impl Chare for $name {
            const NAME: &'static str = concat!("megatest::", stringify!($name));
            type Index = $index;
            type Init = ();
            type Msg = ProbeMsg;
            fn new(_: (), ctx: &mut Ctx<'_, Self>) -> Self {
                let key = key_hash($kind, ctx.index().to_key());
                let pe = ctx.my_pe() as u64;
                let hello = MainMsg::Hello {
                    kind: $kind,
                    key: ctx.index().to_key(),
                    pe,
                };
                main_chare::<Main>().send(ctx, hello);
                $name { key }
            }
            fn handle(&mut self, msg: ProbeMsg, ctx: &mut Ctx<'_, Self>) {
                match msg {
                    ProbeMsg::Sum(k) => ctx.contribute(
                        k.wrapping_add(self.key),
                        Reducer::Sum,
                        Callback::main::<Main>(MainMsg::Summed),
                    ),
                    ProbeMsg::Ping => {
                        ctx.contribute(1u64, Reducer::Sum, Callback::main::<Main>(MainMsg::Pinged))
                    }
                }
            }
        }
    };
}
probe!(Probe1, u32, 1);
probe!(Probe2, (i32, i32), 2);
probe!(Probe3, (u32, u32, u32), 3);
probe!(ProbeC, Cell, 4);

// ---------------------------------------------------------------- reduce

#[derive(Clone, Debug, Serialize, Deserialize)]
enum RedMsg {
    Go {
        seed: u64,
    },
    /// Result of the element-callback reduction (element 0 only).
    Got(i64),
    /// Result of the broadcast-callback reduction (every element).
    All(i64),
}

#[derive(Serialize, Deserialize)]
struct Reducing;

impl Chare for Reducing {
    const NAME: &'static str = "megatest::Reducing";
    type Index = u32;
    type Init = ();
    type Msg = RedMsg;
    fn new(_: (), _: &mut Ctx<'_, Self>) -> Self {
        Reducing
    }
    fn handle(&mut self, msg: RedMsg, ctx: &mut Ctx<'_, Self>) {
        let i = ctx.index() as u64;
        match msg {
            RedMsg::Go { seed } => {
                // Several reductions back to back: results must arrive in this order.
                ctx.contribute(
                    int_of(seed, i),
                    Reducer::Sum,
                    Callback::main::<Main>(MainMsg::SumI64),
                );
                ctx.contribute(
                    int_of(seed, i) as u64,
                    Reducer::Xor,
                    Callback::main::<Main>(MainMsg::XorU64),
                );
                ctx.contribute(
                    float_of(seed, i),
                    Reducer::Max,
                    Callback::main::<Main>(MainMsg::MaxF64),
                );
                ctx.contribute(
                    float_of(seed, i),
                    Reducer::Min,
                    Callback::main::<Main>(MainMsg::MinF64),
                );
                let v = int_of(seed, i);
                ctx.contribute(
                    vec![v, v.wrapping_neg(), i as i64],
                    Reducer::Sum,
                    Callback::main::<Main>(MainMsg::VSumI64),
                );
                ctx.contribute(
                    bool_of(seed, i),
                    Reducer::And,
                    Callback::main::<Main>(MainMsg::And),
                );
                ctx.contribute(
                    bool_of(seed, i),
                    Reducer::Or,
                    Callback::main::<Main>(MainMsg::Or),
                );
                ctx.contribute(
                    1i32,
                    Reducer::Sum,
                    Callback::main::<Main>(MainMsg::CountI32),
                );
                ctx.contribute(
                    vec![draw(seed, i) % 1000],
                    Reducer::custom("merge-sorted"),
                    Callback::main::<Main>(MainMsg::CustomSorted),
                );
                let first = ctx.this_array().elem(0);
                ctx.contribute(
                    int_of(seed, i),
                    Reducer::Sum,
                    Callback::element(first, RedMsg::Got),
                );
                let all = ctx.this_array();
                ctx.contribute(
                    int_of(seed, i),
                    Reducer::Sum,
                    Callback::broadcast(all, RedMsg::All),
                );
            }
            RedMsg::Got(sum) => main_chare::<Main>().send(ctx, MainMsg::ElementCb(sum)),
            RedMsg::All(sum) => ctx.contribute(
                sum,
                Reducer::Sum,
                Callback::main::<Main>(MainMsg::BroadcastCb),
            ),
        }
    }
}

fn merge_sorted(a: Vec<u64>, b: Vec<u64>) -> Vec<u64> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if j == b.len() || (i < a.len() && a[i] <= b[j]) {
            out.push(a[i]);
            i += 1;
        } else {
            out.push(b[j]);
            j += 1;
        }
    }
    out
}

// ---------------------------------------------------------------- groups

#[derive(Clone, Debug, Serialize, Deserialize)]
enum GroupMsg {
    /// Contribute your PE (groups) or node (nodegroups) plus `k`.
    Report(u64),
    /// Point-to-point to one member: reply with where you are.
    Where,
}

#[derive(Serialize, Deserialize)]
struct PerPe {
    pe: u32,
}
impl Chare for PerPe {
    const NAME: &'static str = "megatest::PerPe";
    type Index = ();
    type Init = u32;
    type Msg = GroupMsg;
    fn new(tag: u32, ctx: &mut Ctx<'_, Self>) -> Self {
        assert_eq!(tag, 77, "group init argument was not delivered");
        PerPe { pe: ctx.my_pe() }
    }
    fn handle(&mut self, msg: GroupMsg, ctx: &mut Ctx<'_, Self>) {
        match msg {
            GroupMsg::Report(k) => ctx.contribute(
                self.pe as u64 + k,
                Reducer::Sum,
                Callback::main::<Main>(MainMsg::GroupSum),
            ),
            GroupMsg::Where => {
                let pe = ctx.my_pe() as u64;
                main_chare::<Main>().send(ctx, MainMsg::GroupWhere(pe))
            }
        }
    }
}

#[derive(Serialize, Deserialize)]
struct PerNode {
    node: u32,
}
impl Chare for PerNode {
    const NAME: &'static str = "megatest::PerNode";
    type Index = ();
    type Init = u32;
    type Msg = GroupMsg;
    fn new(_: u32, ctx: &mut Ctx<'_, Self>) -> Self {
        let node = ctx.my_node();
        assert_eq!(
            ctx.my_pe(),
            ctx.topology().first_pe(node),
            "nodegroup member not on its node's first PE"
        );
        PerNode { node }
    }
    fn handle(&mut self, msg: GroupMsg, ctx: &mut Ctx<'_, Self>) {
        match msg {
            GroupMsg::Report(k) => ctx.contribute(
                self.node as u64 + k,
                Reducer::Sum,
                Callback::main::<Main>(MainMsg::NodeGroupSum),
            ),
            GroupMsg::Where => {
                let pe = ctx.my_pe() as u64;
                main_chare::<Main>().send(ctx, MainMsg::NodeGroupWhere(pe))
            }
        }
    }
}

// ---------------------------------------------------------------- readonly

static RO_TABLE: Readonly<Vec<u64>> = Readonly::new("megatest.table");
static RO_NAME: Readonly<String> = Readonly::new("megatest.name");

#[derive(Serialize, Deserialize)]
struct Reader;
impl Chare for Reader {
    const NAME: &'static str = "megatest::Reader";
    type Index = u32;
    type Init = ();
    type Msg = ();
    fn new(_: (), ctx: &mut Ctx<'_, Self>) -> Self {
        // Constructors run after readonly data arrived, on every PE.
        let d = readonly_digest(RO_TABLE.get(ctx), RO_NAME.get(ctx));
        ctx.contribute(
            d,
            Reducer::Sum,
            Callback::main::<Main>(MainMsg::ReadonlySum),
        );
        Reader
    }
    fn handle(&mut self, _: (), _: &mut Ctx<'_, Self>) {}
}

// ---------------------------------------------------------------- insert

#[derive(Clone, Debug, Serialize, Deserialize)]
enum InsMsg {
    /// Point-to-point, sent before the element's insertion.
    Early,
    /// Point-to-point, sent after it.
    Late,
    /// A broadcast sent before the insertions: no element runs it.
    Before,
    /// A broadcast sent right after them: every element runs it.
    After,
}

#[derive(Serialize, Deserialize)]
struct Inserted {
    got: u32,
}
impl Chare for Inserted {
    const NAME: &'static str = "megatest::Inserted";
    type Index = u64;
    type Init = u64;
    type Msg = InsMsg;
    fn new(expect_pe: u64, ctx: &mut Ctx<'_, Self>) -> Self {
        if expect_pe != u64::MAX && expect_pe != ctx.my_pe() as u64 {
            fail(
                "insert",
                format!(
                    "element {} built on PE {} instead of {expect_pe}",
                    ctx.index(),
                    ctx.my_pe()
                ),
            );
        }
        Inserted { got: 0 }
    }
    fn handle(&mut self, msg: InsMsg, ctx: &mut Ctx<'_, Self>) {
        if let InsMsg::Before = msg {
            fail(
                "insert",
                format!(
                    "element {} ran a broadcast sent before its insertion",
                    ctx.index()
                ),
            );
        }
        self.got += 1;
        if self.got == 3 {
            ctx.contribute(
                ctx.index(),
                Reducer::Sum,
                Callback::main::<Main>(MainMsg::InsertSum),
            );
        }
    }
}

// ---------------------------------------------------------------- priority

#[derive(Clone, Debug, Serialize, Deserialize)]
enum PrioMsg {
    Go { seed: u64, n: u32 },
    Item { prio: i32, seq: u32 },
}

#[derive(Serialize, Deserialize)]
struct Prioritised {
    seen: Vec<(i32, u32)>,
    n: u32,
}
impl Chare for Prioritised {
    const NAME: &'static str = "megatest::Prioritised";
    type Index = u32;
    type Init = ();
    type Msg = PrioMsg;
    fn new(_: (), _: &mut Ctx<'_, Self>) -> Self {
        Prioritised {
            seen: Vec::new(),
            n: 0,
        }
    }
    fn handle(&mut self, msg: PrioMsg, ctx: &mut Ctx<'_, Self>) {
        match msg {
            PrioMsg::Go { seed, n } => {
                self.n = n;
                let me = ctx.this_element();
                // All queued before any runs: the scheduler must order them.
                for seq in 0..n {
                    let prio = (draw(seed, seq as u64) % 7) as i32 - 3;
                    me.send_prio(ctx, PrioMsg::Item { prio, seq }, prio);
                }
            }
            PrioMsg::Item { prio, seq } => {
                self.seen.push((prio, seq));
                if self.seen.len() as u32 == self.n {
                    let mut sorted = self.seen.clone();
                    sorted.sort();
                    let ok = sorted == self.seen;
                    main_chare::<Main>().send(ctx, MainMsg::PriorityOrdered(ok));
                }
            }
        }
    }
}

// ---------------------------------------------------------------- qd

#[derive(Clone, Debug, Serialize, Deserialize)]
enum HopMsg {
    Go { seed: u64 },
    Hop { left: u64, salt: u64 },
    Report,
}

#[derive(Serialize, Deserialize)]
struct Hopper {
    hops: u64,
    n: u32,
}
impl Chare for Hopper {
    const NAME: &'static str = "megatest::Hopper";
    type Index = u32;
    type Init = u32;
    type Msg = HopMsg;
    fn new(n: u32, _: &mut Ctx<'_, Self>) -> Self {
        Hopper { hops: 0, n }
    }
    fn handle(&mut self, msg: HopMsg, ctx: &mut Ctx<'_, Self>) {
        let me = ctx.index() as u64;
        match msg {
            HopMsg::Go { seed } => {
                let left = chain_len(seed, me);
                if left > 0 {
                    let to = (draw(seed, me) % self.n as u64) as u32;
                    ctx.this_array().elem(to).send(
                        ctx,
                        HopMsg::Hop {
                            left,
                            salt: draw(seed, me + 1),
                        },
                    );
                }
            }
            HopMsg::Hop { left, salt } => {
                self.hops += 1;
                if left > 1 {
                    let to = (draw(salt, me) % self.n as u64) as u32;
                    ctx.this_array().elem(to).send(
                        ctx,
                        HopMsg::Hop {
                            left: left - 1,
                            salt: draw(salt, 7),
                        },
                    );
                }
            }
            HopMsg::Report => ctx.contribute(
                self.hops,
                Reducer::Sum,
                Callback::main::<Main>(MainMsg::QdHops),
            ),
        }
    }
}

// ---------------------------------------------------------------- migrate

#[derive(Clone, Debug, Serialize, Deserialize)]
enum WalkMsg {
    Go { seed: u64, chains: u64, len: u64 },
    Token { salt: u64, hop: u64, len: u64 },
    Report,
}

/// Receives tokens on random walks and jumps to random PEs while they fly.
#[derive(Serialize, Deserialize)]
struct Walker {
    n: u64,
    count: u64,
    sum: u64,
    moves: u64,
}
impl Chare for Walker {
    const NAME: &'static str = "megatest::Walker";
    type Index = u64;
    type Init = u64;
    type Msg = WalkMsg;
    fn new(n: u64, _: &mut Ctx<'_, Self>) -> Self {
        Walker {
            n,
            count: 0,
            sum: 0,
            moves: 0,
        }
    }
    fn handle(&mut self, msg: WalkMsg, ctx: &mut Ctx<'_, Self>) {
        let me = ctx.index();
        match msg {
            WalkMsg::Go { seed, chains, len } => {
                for t in 0..chains {
                    let salt = draw(seed, me * chains + t);
                    let to = walk_target(salt, 0, self.n);
                    ctx.this_array()
                        .elem(to)
                        .send(ctx, WalkMsg::Token { salt, hop: 0, len });
                }
            }
            WalkMsg::Token { salt, hop, len } => {
                self.count += 1;
                self.sum = self.sum.wrapping_add(walk_value(salt, hop));
                if hop + 1 < len {
                    let to = walk_target(salt, hop + 1, self.n);
                    ctx.this_array().elem(to).send(
                        ctx,
                        WalkMsg::Token {
                            salt,
                            hop: hop + 1,
                            len,
                        },
                    );
                }
                if draw(salt, hop + 2000) % 4 == 0 {
                    let pe = (draw(salt, hop + 3000) % ctx.num_pes() as u64) as u32;
                    if pe != ctx.my_pe() {
                        self.moves += 1;
                        ctx.migrate_me(pe);
                    }
                }
            }
            WalkMsg::Report => {
                let digest = ductile_apps::megatest::walk_digest(me, self.count, self.sum);
                ctx.contribute(
                    digest,
                    Reducer::Sum,
                    Callback::main::<Main>(MainMsg::WalkDigest),
                );
                ctx.contribute(
                    self.moves,
                    Reducer::Sum,
                    Callback::main::<Main>(MainMsg::WalkMoves),
                );
            }
        }
    }
}

use ductile_apps::megatest::{walk_target, walk_value};

// ---------------------------------------------------------------- destroy

#[derive(Clone, Debug, Serialize, Deserialize)]
enum DoomMsg {
    Kill(u64),
    Count,
}

#[derive(Serialize, Deserialize)]
struct Doomed;
impl Chare for Doomed {
    const NAME: &'static str = "megatest::Doomed";
    type Index = u64;
    type Init = ();
    type Msg = DoomMsg;
    fn new(_: (), _: &mut Ctx<'_, Self>) -> Self {
        Doomed
    }
    fn handle(&mut self, msg: DoomMsg, ctx: &mut Ctx<'_, Self>) {
        match msg {
            DoomMsg::Kill(every) => {
                if ctx.index() % every == 0 {
                    ctx.destroy();
                }
            }
            DoomMsg::Count => ctx.contribute(
                ctx.index(),
                Reducer::Sum,
                Callback::main::<Main>(MainMsg::Survivors),
            ),
        }
    }
}

// ---------------------------------------------------------------- panic

#[derive(Serialize, Deserialize)]
struct Bomb;
impl Chare for Bomb {
    const NAME: &'static str = "megatest::Bomb";
    type Index = ();
    type Init = u32;
    type Msg = u32;
    fn new(_: u32, _: &mut Ctx<'_, Self>) -> Self {
        Bomb
    }
    fn handle(&mut self, target: u32, ctx: &mut Ctx<'_, Self>) {
        if ctx.my_pe() == target {
            panic!("megatest panic requested on PE {target}");
        }
    }
}

// ---------------------------------------------------------------- main

#[derive(Clone, Debug, Serialize, Deserialize)]
enum MainMsg {
    Hello { kind: u64, key: u128, pe: u64 },
    Summed(u64),
    Pinged(u64),
    Quiet(()),
    SumI64(i64),
    XorU64(u64),
    MaxF64(f64),
    MinF64(f64),
    VSumI64(Vec<i64>),
    And(bool),
    Or(bool),
    CountI32(i32),
    CustomSorted(Vec<u64>),
    ElementCb(i64),
    BroadcastCb(i64),
    GroupSum(u64),
    NodeGroupSum(u64),
    GroupWhere(u64),
    NodeGroupWhere(u64),
    ReadonlySum(u64),
    InsertSum(u64),
    PriorityOrdered(bool),
    QdHops(u64),
    WalkDigest(u64),
    WalkMoves(u64),
    Survivors(u64),
}

impl MainMsg {
    /// A result's printed name and value.
    fn result(&self) -> Option<(&'static str, String)> {
        Some(match self {
            MainMsg::SumI64(v) => ("sum_i64", v.to_string()),
            MainMsg::XorU64(v) => ("xor_u64", v.to_string()),
            MainMsg::MaxF64(v) => ("max_f64", format!("{v:?}")),
            MainMsg::MinF64(v) => ("min_f64", format!("{v:?}")),
            MainMsg::VSumI64(v) => ("vsum_i64", format!("{v:?}").replace(' ', "")),
            MainMsg::And(v) => ("and", v.to_string()),
            MainMsg::Or(v) => ("or", v.to_string()),
            MainMsg::CountI32(v) => ("count_i32", v.to_string()),
            MainMsg::CustomSorted(v) => ("custom_sorted", format!("{v:?}").replace(' ', "")),
            MainMsg::ElementCb(v) => ("element_cb", v.to_string()),
            MainMsg::BroadcastCb(v) => ("broadcast_cb", v.to_string()),
            MainMsg::GroupSum(v) => ("group_sum", v.to_string()),
            MainMsg::GroupWhere(v) => ("group_where", v.to_string()),
            MainMsg::NodeGroupSum(v) => ("nodegroup_sum", v.to_string()),
            MainMsg::NodeGroupWhere(v) => ("nodegroup_where", v.to_string()),
            MainMsg::ReadonlySum(v) => ("readonly_sum", v.to_string()),
            MainMsg::InsertSum(v) => ("insert_sum", v.to_string()),
            MainMsg::PriorityOrdered(v) => ("priority_ordered", v.to_string()),
            MainMsg::QdHops(v) => ("qd_hops", v.to_string()),
            MainMsg::WalkDigest(v) => ("walk_digest", v.to_string()),
            MainMsg::WalkMoves(v) => ("walk_moves", v.to_string()),
            MainMsg::Survivors(v) => ("survivor_index_sum", v.to_string()),
            _ => return None,
        })
    }
}

/// The arrays module's four arrays: 1D, 2D, 3D, custom index.
type Probes = (
    Option<ArrayProxy<Probe1>>,
    Option<ArrayProxy<Probe2>>,
    Option<ArrayProxy<Probe3>>,
    Option<ArrayProxy<ProbeC>>,
);

#[derive(Serialize, Deserialize)]
struct Main {
    module: String,
    seed: u64,
    elems: u32,
    /// The exit code once the module passed (`--code`).
    code: i32,
    expected: u64,
    seen: BTreeSet<(u64, u128)>,
    pes_used: BTreeSet<u64>,
    results: Vec<(String, String)>,
    wanted: usize,
    hoppers: Option<ArrayProxy<Hopper>>,
    walkers: Option<ArrayProxy<Walker>>,
    probes: Probes,
}

impl Main {
    fn record(&mut self, name: &str, value: String, ctx: &mut PeCtx<'_>) {
        self.results.push((name.to_string(), value));
        if self.results.len() == self.wanted {
            for (k, v) in &self.results {
                println!("{k}={v}");
            }
            println!(
                "megatest {} ok pes={} nodes={}",
                self.module,
                ctx.num_pes(),
                ctx.num_nodes()
            );
            ctx.exit(self.code);
        }
    }
}

impl Chare for Main {
    const NAME: &'static str = "megatest::Main";
    type Index = ();
    type Init = Vec<String>;
    type Msg = MainMsg;

    fn new(a: Vec<String>, ctx: &mut Ctx<'_, Self>) -> Self {
        let parsed: MegatestArgs = args::parse_main("megatest", &a);
        let module = parsed.module.name();
        let seed = parsed.seed;
        let elems = parsed.elems.unwrap_or(4 * ctx.num_pes());
        let p = ctx.num_pes();
        let mut m = Main {
            module: module.clone(),
            seed,
            elems,
            code: parsed.code,
            expected: 0,
            seen: BTreeSet::new(),
            pes_used: BTreeSet::new(),
            results: Vec::new(),
            wanted: 1,
            hoppers: None,
            walkers: None,
            probes: (None, None, None, None),
        };
        match module.as_str() {
            "arrays" => {
                m.probes.0 = Some(ArrayProxy::create(ctx, elems, ()));
                m.probes.1 = Some(ArrayProxy::create(ctx, (3, 4), ()));
                m.probes.2 = Some(ArrayProxy::create(ctx, (2, 3, 2), ()));
                let custom = ArrayProxy::<ProbeC>::create_empty(ctx);
                for id in 0..5u16 {
                    custom.insert(ctx, Cell { level: 2, id: id * 1000 }, ());
                }
                m.probes.3 = Some(custom);
                m.expected = elems as u64 + 12 + 12 + 5;
                m.wanted = 5;
            }
            "reduce" => {
                let arr = ArrayProxy::<Reducing>::create(ctx, elems, ());
                arr.broadcast(ctx, RedMsg::Go { seed });
                m.wanted = 11;
            }
            "group" => {
                let g = GroupProxy::<PerPe>::create(ctx, 77);
                let ng = ductile::NodeGroupProxy::<PerNode>::create(ctx, 77);
                g.broadcast(ctx, GroupMsg::Report(10));
                ng.broadcast(ctx, GroupMsg::Report(100));
                g.send(ctx, p - 1, GroupMsg::Where);
                let last_node = ctx.num_nodes() - 1;
                ng.send(ctx, last_node, GroupMsg::Where);
                m.wanted = 4;
            }
            "readonly" => {
                let table = ductile_apps::megatest::readonly_table(seed);
                RO_TABLE.set(ctx, table);
                RO_NAME.set(ctx, format!("seed-{seed}"));
                ArrayProxy::<Reader>::create(ctx, elems, ());
                m.wanted = 1;
            }
            "insert" => {
                let arr = ArrayProxy::<Inserted>::create_empty(ctx);
                arr.broadcast(ctx, InsMsg::Before);
                for i in 0..elems as u64 {
                    arr.elem(i).send(ctx, InsMsg::Early);
                }
                for i in 0..elems as u64 {
                    if i % 3 == 0 {
                        arr.insert(ctx, i, u64::MAX);
                    } else {
                        let pe = (i * 7 % p as u64) as u32;
                        arr.insert_on(ctx, i, pe, pe as u64);
                    }
                }
                for i in 0..elems as u64 {
                    arr.elem(i).send(ctx, InsMsg::Late);
                }
                arr.broadcast(ctx, InsMsg::After);
                m.wanted = 1;
            }
            "priority" => {
                let arr = ArrayProxy::<Prioritised>::create(ctx, p, ());
                arr.broadcast(ctx, PrioMsg::Go { seed, n: 200 });
                m.wanted = p as usize;
            }
            "qd" => {
                let arr = ArrayProxy::<Hopper>::create(ctx, elems, elems);
                arr.broadcast(ctx, HopMsg::Go { seed });
                ctx.start_quiescence(Callback::main::<Main>(MainMsg::Quiet));
                m.hoppers = Some(arr);
                m.wanted = 1;
            }
            "migrate" => {
                let (chains, len) = (parsed.chains, parsed.len);
                let arr = ArrayProxy::<Walker>::create(ctx, elems as u64, elems as u64);
                arr.broadcast(ctx, WalkMsg::Go { seed, chains, len });
                ctx.start_quiescence(Callback::main::<Main>(MainMsg::Quiet));
                m.walkers = Some(arr);
                m.wanted = 2;
            }
            "destroy" => {
                let arr = ArrayProxy::<Doomed>::create(ctx, elems as u64, ());
                arr.broadcast(ctx, DoomMsg::Kill(3));
                arr.broadcast(ctx, DoomMsg::Count);
                m.wanted = 1;
            }
            "exit" => {
                // Exit from a PE other than 0, after a round trip through a group.
                let g = GroupProxy::<PerPe>::create(ctx, 77);
                g.broadcast(ctx, GroupMsg::Report(0));
                m.wanted = 1;
            }
            "panic" => {
                let target = parsed.pe.unwrap_or(p - 1);
                let g = GroupProxy::<Bomb>::create(ctx, 0);
                g.broadcast(ctx, target);
                m.wanted = usize::MAX;
            }
            other => fail(other, "unknown module (arrays, reduce, group, readonly, insert, priority, qd, migrate, destroy, exit, panic)"),
        }
        m
    }

    fn handle(&mut self, msg: MainMsg, ctx: &mut Ctx<'_, Self>) {
        let module = self.module.clone();
        match msg {
            MainMsg::Hello { kind, key, pe } => {
                if !self.seen.insert((kind, key)) {
                    fail(
                        &module,
                        format!("element kind {kind} key {key:#x} constructed twice"),
                    );
                }
                if pe >= ctx.num_pes() as u64 {
                    fail(&module, format!("element on PE {pe} of {}", ctx.num_pes()));
                }
                self.pes_used.insert(pe);
                if self.seen.len() as u64 == self.expected {
                    // Every element exists: reduce over each array, then message each element.
                    let (a, b, c, d) = self.probes;
                    a.expect("created").broadcast(ctx, ProbeMsg::Sum(5));
                    b.expect("created").broadcast(ctx, ProbeMsg::Sum(5));
                    c.expect("created").broadcast(ctx, ProbeMsg::Sum(5));
                    d.expect("created").broadcast(ctx, ProbeMsg::Sum(5));
                }
            }
            MainMsg::Summed(s) => {
                self.expected_sum_check(s, ctx);
            }
            MainMsg::Pinged(n) => {
                if n != self.elems as u64 {
                    fail(
                        &module,
                        format!("{n} of {} elements answered a ping", self.elems),
                    );
                }
                let spread = self.pes_used.len() as u32 == ctx.num_pes().min(self.elems);
                self.record("pes_used_all", spread.to_string(), ctx);
            }
            MainMsg::Quiet(()) => {
                if let Some(h) = self.hoppers {
                    h.broadcast(ctx, HopMsg::Report);
                }
                if let Some(w) = self.walkers {
                    w.broadcast(ctx, WalkMsg::Report);
                }
            }
            other => {
                let (k, v) = other.result().expect("every other message is a result");
                self.record(k, v, ctx);
            }
        }
    }
}

impl Main {
    /// The four probe arrays each answer `Sum(5)` with sum(5 + draw(kind, key));
    /// check each against the keys main saw in the hellos.
    fn expected_sum_check(&mut self, got: u64, ctx: &mut PeCtx<'_>) {
        let candidates: Vec<u64> = (1..=4u64)
            .map(|kind| {
                self.seen
                    .iter()
                    .filter(|(k, _)| *k == kind)
                    .fold(0u64, |acc, (_, key)| {
                        acc.wrapping_add(5).wrapping_add(key_hash(kind, *key))
                    })
            })
            .collect();
        if !candidates.contains(&got) {
            fail(
                &self.module,
                format!("array sum {got} matches none of {candidates:?}"),
            );
        }
        let done = self
            .results
            .iter()
            .filter(|(k, _)| k.starts_with("array_sum"))
            .count();
        self.results
            .push((format!("array_sum_{done}"), "ok".into()));
        if done == 3 {
            // Reductions and broadcasts work; now message each element point to point.
            // (Only now: a ping overtaking the broadcast would join the wrong reduction.)
            let a = self.probes.0.expect("created");
            for i in 0..self.elems {
                a.elem(i).send(ctx, ProbeMsg::Ping);
            }
        }
    }
}

/// The command line (`megatest --help`), checked before the node joins.
#[derive(clap::Parser, Debug)]
#[command(
    name = "megatest",
    about = "One of the runtime's feature tests per run; prints `megatest <module> ok` and the values it computed"
)]
struct MegatestArgs {
    /// The module to run.
    #[arg(value_enum)]
    module: Module,
    /// Seed of the module's random choices.
    #[arg(long, value_name = "S", default_value_t = 1)]
    seed: u64,
    /// Array elements [default: 4 per PE].
    #[arg(long, value_name = "N")]
    elems: Option<u32>,
    /// migrate: chains of hops.
    #[arg(long, value_name = "C", default_value_t = 3)]
    chains: u64,
    /// migrate: hops per chain.
    #[arg(long, value_name = "L", default_value_t = 30)]
    len: u64,
    /// panic: the PE that panics [default: the last].
    #[arg(long, value_name = "PE")]
    pe: Option<u32>,
    /// The job's exit code once the module passed.
    #[arg(long, value_name = "CODE", default_value_t = 0, allow_negative_numbers = true)]
    code: i32,
}

/// The modules, each a small test of one runtime feature.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Module {
    /// 1D, 2D, 3D and user-indexed arrays: every element constructed once.
    Arrays,
    /// Built-in and custom reducers.
    Reduce,
    /// Groups and nodegroups: one member per PE / node.
    Group,
    /// Readonly data seen by every element.
    Readonly,
    /// Dynamic insertion, with messages and broadcasts sent before and after.
    Insert,
    /// Message priorities.
    Priority,
    /// Quiescence detection.
    Qd,
    /// Migration while messages chase the elements.
    Migrate,
    /// Destroying elements.
    Destroy,
    /// Exit from a PE other than 0.
    Exit,
    /// A panicking PE ends the job with a clear message.
    Panic,
}

impl Module {
    /// The name on the command line.
    fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map_or_else(String::new, |v| v.get_name().to_owned())
    }
}

fn main() {
    let _: MegatestArgs = args::parse_or_exit("megatest");
    ductile::launch(|reg| {
        reg.main::<Main>()
            .chare::<Probe1>()
            .chare::<Probe2>()
            .chare::<Probe3>()
            .chare::<ProbeC>()
            .chare::<Reducing>()
            .chare::<PerPe>()
            .chare::<PerNode>()
            .chare::<Reader>()
            .chare::<Inserted>()
            .chare::<Prioritised>()
            .chare::<Hopper>()
            .chare::<Bomb>()
            .chare::<Walker>()
            .chare::<Doomed>()
            .readonly(&RO_TABLE)
            .readonly(&RO_NAME)
            .reducer("merge-sorted", merge_sorted);
    })
}
