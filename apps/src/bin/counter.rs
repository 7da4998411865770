//! The "Writing a chare" example of the README, kept compiling and tested.

use ductile::prelude::*;

#[derive(Serialize, Deserialize)]
struct Counter {
    hits: u64,
}

#[derive(Clone, Serialize, Deserialize)]
enum CounterMsg {
    Hit(u64),
    Report,
}

impl Chare for Counter {
    const NAME: &'static str = "example::Counter"; // identity on the wire: keep it stable
    type Index = u32; // u32/u64/i32/i64, 2D and 3D tuples, or your own
    type Init = (); // constructor argument
    type Msg = CounterMsg;

    fn new(_: (), _ctx: &mut Ctx<'_, Self>) -> Self {
        Counter { hits: 0 }
    }

    fn handle(&mut self, msg: CounterMsg, ctx: &mut Ctx<'_, Self>) {
        match msg {
            CounterMsg::Hit(n) => self.hits += n,
            // Every element contributes once; the sum reaches main's `Total` entry.
            CounterMsg::Report => ctx.contribute(
                self.hits,
                Reducer::Sum,
                Callback::main::<Main>(MainMsg::Total),
            ),
        }
    }
}

#[derive(Clone, Serialize, Deserialize)]
enum MainMsg {
    Total(u64),
}

#[derive(Serialize, Deserialize)]
struct Main;

impl Chare for Main {
    const NAME: &'static str = "example::Main";
    type Index = ();
    type Init = Vec<String>; // the program's arguments
    type Msg = MainMsg;

    fn new(_args: Vec<String>, ctx: &mut Ctx<'_, Self>) -> Self {
        let counters = ArrayProxy::<Counter>::create(ctx, 100, ()); // 100 elements, block-mapped over PEs
        counters.broadcast(ctx, CounterMsg::Hit(5)); // every element
        counters.broadcast(ctx, CounterMsg::Report); // broadcasts arrive in the order sent
        Main
    }

    fn handle(&mut self, msg: MainMsg, ctx: &mut Ctx<'_, Self>) {
        let MainMsg::Total(n) = msg;
        println!("total hits: {n}");
        ctx.exit(0); // every PE stops; the job exits 0
    }
}

/// `counter` takes no arguments of its own; `--help` says what it does and
/// anything else is refused (exit 2) before the node joins.
#[derive(clap::Parser)]
#[command(
    name = "counter",
    about = "The README's \"Writing a chare\" example: 100 counters, one broadcast, one reduction; prints `total hits: 500`"
)]
struct CounterArgs {}

fn main() {
    let _: CounterArgs = ductile_apps::args::parse_or_exit("counter");
    ductile::launch(|reg| {
        reg.main::<Main>().chare::<Counter>();
    })
}
