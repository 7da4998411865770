//! Jacobi2D: a 5-point stencil on an `nx x ny` grid, decomposed into a 2D
//! chare array of blocks that exchange one-cell ghost layers with their four
//! neighbours every iteration.
//!
//! The point update `((((c + n) + s) + w) + e) * 0.2` is evaluated in the same
//! order for every point whatever block holds it, and the checksum is a
//! wrapping sum of a hash of each point's bits and global coordinates, so the
//! result is bit-identical across PE counts, node counts, block sizes,
//! migrations and rescales. [`reference`] solves the same problem
//! sequentially so tests can check that claim against an independent solver.

use std::time::Instant;

use ductile::prelude::*;
use ductile::Readonly;

use crate::args;

/// The problem: grid size, block size, iterations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    /// Grid columns.
    pub nx: u32,
    /// Grid rows.
    pub ny: u32,
    /// Block columns.
    pub bx: u32,
    /// Block rows.
    pub by: u32,
    /// Iterations to run.
    pub iters: u64,
    /// Report the max residual every this many iterations (0: never).
    pub residual_every: u64,
    /// Load-balance (AtSync) every this many iterations (0: never).
    pub lb_every: u64,
    /// Load-balance once before the first iteration too, by count and PE
    /// speed ([`ductile::Ctx::discount_load`]).
    pub lb_at_start: bool,
}

/// `jacobi2d`'s command line (the program's own flags; the runtime's
/// `+flags` are split off before, see [`crate::args`]).
#[derive(clap::Parser, Debug, Clone, PartialEq, Eq)]
#[command(
    name = "jacobi2d",
    about = "Jacobi relaxation on a 2D grid of migratable blocks; prints a checksum that no rescale changes",
    after_help = "Runtime options go with a `+`: +lb STRATEGY, +pe-speed PE:F,... (docs/runtime.md).\nRun it across processes with `ductile run --nodes N -- jacobi2d ...`."
)]
pub struct JacobiArgs {
    /// Grid size in points: N (N x N) or NXxNY.
    #[arg(long, value_name = "NX[xNY]", default_value = "256", value_parser = args::pair)]
    pub grid: (u32, u32),
    /// Block size in points: N or BXxBY (one chare per block).
    #[arg(long, value_name = "BX[xBY]", default_value = "64", value_parser = args::pair)]
    pub block: (u32, u32),
    /// Iterations to run.
    #[arg(long, value_name = "K", default_value_t = 100)]
    pub iters: u64,
    /// Print the residual (with the PE count and iterations/s) every R iterations; 0: never.
    #[arg(long, value_name = "R", default_value_t = 10)]
    pub residual_every: u64,
    /// Load-balance (AtSync) every L iterations; 0: never.
    #[arg(long, value_name = "L", default_value_t = 0)]
    pub lb_every: u64,
    /// Load-balance once before the first iteration as well, counting every
    /// block alike: with a rate-aware strategy (`+lb ContiguousRateAware`)
    /// the blocks start spread by the PEs' speeds (a fleet of unequal
    /// instances), where the first measured step comes only after --lb-every
    /// iterations.
    #[arg(long)]
    pub lb_at_start: bool,
    /// Keep the blocks on the nodes' GPUs (docs/gpu.md); same checksum.
    #[arg(long)]
    pub gpu: bool,
    /// Print only the summary and checksum lines.
    #[arg(long)]
    pub quiet: bool,
}

impl Spec {
    /// Parses Jacobi2D's arguments (see [`JacobiArgs`]).
    pub fn from_args(a: &[String]) -> Result<Spec, String> {
        let parsed: JacobiArgs = args::try_parse("jacobi2d", a).map_err(|e| e.to_string())?;
        Spec::from_parsed(&parsed)
    }

    /// The spec of parsed arguments; sizes must be positive.
    pub fn from_parsed(parsed: &JacobiArgs) -> Result<Spec, String> {
        let ((nx, ny), (bx, by)) = (parsed.grid, parsed.block);
        let (iters, residual_every, lb_every) =
            (parsed.iters, parsed.residual_every, parsed.lb_every);
        let s = Spec {
            nx,
            ny,
            bx,
            by,
            iters,
            residual_every,
            lb_every,
            lb_at_start: parsed.lb_at_start,
        };
        if nx == 0 || ny == 0 || bx == 0 || by == 0 {
            return Err(format!("grid and block sizes must be positive: {s:?}"));
        }
        Ok(s)
    }

    /// Number of block rows and columns (the array's dims).
    pub fn blocks(&self) -> (i32, i32) {
        (
            self.ny.div_ceil(self.by) as i32,
            self.nx.div_ceil(self.bx) as i32,
        )
    }
}

/// Initial value of interior point `(x, y)`: deterministic, in [0, 1).
pub fn initial(x: u32, y: u32) -> f64 {
    (mix((x as u64) << 32 | y as u64) >> 11) as f64 / (1u64 << 53) as f64
}

/// Fixed value just outside the grid (`x` or `y` is -1 or the size).
pub fn boundary(x: i64, y: i64, spec: &Spec) -> f64 {
    if y < 0 {
        1.0
    } else if x < 0 {
        0.5
    } else if y >= spec.ny as i64 {
        0.25
    } else {
        0.0
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The checksum term of one point.
pub fn point_hash(x: u32, y: u32, v: f64) -> u64 {
    mix(v.to_bits() ^ mix((x as u64) << 32 | y as u64))
}

/// One sweep over rows of a padded grid (`stride` = width + 2): writes
/// `next`'s interior from `cur`, returns the max |change| when `residual`.
pub fn sweep(cur: &[f64], next: &mut [f64], w: usize, h: usize, residual: bool) -> f64 {
    let stride = w + 2;
    let mut res = 0.0f64;
    for ly in 1..=h {
        // Exact-length slices and zipped iterators: no bounds checks in the
        // inner loop, so it vectorises.
        let up = &cur[(ly - 1) * stride + 1..ly * stride - 1];
        let mid = &cur[ly * stride..(ly + 1) * stride];
        let down = &cur[(ly + 1) * stride + 1..(ly + 2) * stride - 1];
        let out = &mut next[ly * stride + 1..(ly + 1) * stride - 1];
        let cells = out.iter_mut().zip(mid.windows(3)).zip(up.iter().zip(down));
        if residual {
            for ((o, m), (u, d)) in cells {
                let v = ((((m[1] + u) + d) + m[0]) + m[2]) * 0.2;
                res = res.max((v - m[1]).abs());
                *o = v;
            }
        } else {
            for ((o, m), (u, d)) in cells {
                *o = ((((m[1] + u) + d) + m[0]) + m[2]) * 0.2;
            }
        }
    }
    res
}

/// The edge of a padded `w x h` grid that a neighbour whose halo is
/// `their_halo` needs (our first row fills the south halo of the block above).
pub fn edge_of(cur: &[f64], w: usize, h: usize, their_halo: Side) -> Vec<f64> {
    let stride = w + 2;
    match their_halo {
        Side::South => cur[stride + 1..stride + 1 + w].to_vec(),
        Side::North => cur[h * stride + 1..h * stride + 1 + w].to_vec(),
        Side::East => (1..=h).map(|y| cur[y * stride + 1]).collect(),
        Side::West => (1..=h).map(|y| cur[y * stride + w]).collect(),
    }
}

/// Writes a received ghost layer into the `side` halo of a padded `w x h` grid.
pub fn fill_halo(cur: &mut [f64], w: usize, h: usize, side: Side, data: &[f64]) {
    let stride = w + 2;
    match side {
        Side::North => cur[1..1 + w].copy_from_slice(data),
        Side::South => cur[(h + 1) * stride + 1..(h + 1) * stride + 1 + w].copy_from_slice(data),
        Side::West => (1..=h).zip(data).for_each(|(y, v)| cur[y * stride] = *v),
        Side::East => (1..=h)
            .zip(data)
            .for_each(|(y, v)| cur[y * stride + w + 1] = *v),
    }
}

/// A padded block of the grid covering `[x0, x0+w) x [y0, y0+h)`, halo filled
/// with boundary values where the block touches the grid's edge.
fn padded(spec: &Spec, x0: u32, y0: u32, w: usize, h: usize) -> Vec<f64> {
    let stride = w + 2;
    let mut g = vec![0.0; stride * (h + 2)];
    for ly in 0..h + 2 {
        for lx in 0..w + 2 {
            let (gx, gy) = (x0 as i64 + lx as i64 - 1, y0 as i64 + ly as i64 - 1);
            let inside = gx >= 0 && gy >= 0 && gx < spec.nx as i64 && gy < spec.ny as i64;
            g[ly * stride + lx] = if inside {
                initial(gx as u32, gy as u32)
            } else {
                boundary(gx, gy, spec)
            };
        }
    }
    g
}

/// Sequential reference: runs `spec` on one grid and returns the checksum.
pub fn reference(spec: &Spec) -> u64 {
    let (w, h) = (spec.nx as usize, spec.ny as usize);
    let mut cur = padded(spec, 0, 0, w, h);
    let mut next = cur.clone();
    for _ in 0..spec.iters {
        sweep(&cur, &mut next, w, h, false);
        std::mem::swap(&mut cur, &mut next);
    }
    checksum_of(&cur, 0, 0, w, h)
}

fn checksum_of(g: &[f64], x0: u32, y0: u32, w: usize, h: usize) -> u64 {
    let stride = w + 2;
    let mut sum = 0u64;
    for ly in 0..h {
        for lx in 0..w {
            sum = sum.wrapping_add(point_hash(
                x0 + lx as u32,
                y0 + ly as u32,
                g[(ly + 1) * stride + lx + 1],
            ));
        }
    }
    sum
}

/// The problem, set by main and read by every block.
pub static SPEC: Readonly<Spec> = Readonly::new("jacobi2d.spec");

/// Which halo of the receiving block a ghost layer fills.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Side {
    North,
    South,
    West,
    East,
}

/// A block's entry methods.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum BlockMsg {
    /// Begin iterating.
    Start,
    /// A neighbour's edge at iteration `iter`, for halo `side`.
    Ghost {
        /// Iteration the values belong to.
        iter: u64,
        /// Halo to fill.
        side: Side,
        /// The values.
        data: Bulk<f64>,
    },
}

/// One block of the grid.
#[derive(Serialize, Deserialize)]
pub struct Block {
    x0: u32,
    y0: u32,
    w: usize,
    h: usize,
    /// The values, halos included: one byte string when the block is
    /// packed (a migration, a checkpoint), not one element at a time.
    cur: Bulk<f64>,
    /// Scratch for the next sweep, never packed: re-made from `cur` (whose
    /// boundary halos it needs) before the first sweep after an unpack.
    #[serde(skip)]
    next: Bulk<f64>,
    iter: u64,
    got: u32,
    need: u32,
    /// Waiting in `at_sync` for the load balancer.
    synced: bool,
    /// `Start` arrived. Ghosts can overtake it (a neighbour's `Start` and
    /// its ghost may travel a shorter path than this block's `Start` down
    /// the broadcast tree): they wait in `pending`, or this block would
    /// sweep without having sent its own first ghosts.
    started: bool,
    pending: Pending<(Side, Bulk<f64>)>,
    /// The grid on the PE's GPU (`jacobi2d --gpu`); `cur` and `next` are
    /// then empty.
    #[cfg(feature = "cuda")]
    dev: Option<crate::jacobi_gpu::DeviceGrid>,
}

impl Block {
    fn neighbours(&self, (r, c): (i32, i32), dims: (i32, i32)) -> Vec<((i32, i32), Side)> {
        // (neighbour, halo of the neighbour that our edge fills)
        let mut n = Vec::with_capacity(4);
        if r > 0 {
            n.push(((r - 1, c), Side::South));
        }
        if r + 1 < dims.0 {
            n.push(((r + 1, c), Side::North));
        }
        if c > 0 {
            n.push(((r, c - 1), Side::East));
        }
        if c + 1 < dims.1 {
            n.push(((r, c + 1), Side::West));
        }
        n
    }

    fn edge(&self, their_halo: Side) -> Vec<f64> {
        #[cfg(feature = "cuda")]
        if let Some(dev) = &self.dev {
            return dev.edge(their_halo).to_vec();
        }
        edge_of(&self.cur, self.w, self.h, their_halo)
    }

    fn fill(&mut self, side: Side, data: &[f64]) {
        #[cfg(feature = "cuda")]
        if let Some(dev) = &mut self.dev {
            dev.stage_ghost(side, data);
            return;
        }
        fill_halo(&mut self.cur, self.w, self.h, side, data);
    }

    fn send_ghosts(&mut self, ctx: &mut Ctx<'_, Self>) {
        let dims = SPEC.get(ctx).blocks();
        let me = ctx.index();
        let array = ctx.this_array();
        #[cfg(feature = "cuda")]
        if let Some(dev) = &mut self.dev {
            dev.pack_edges(gpu(ctx, me))
                .unwrap_or_else(|e| gpu_failed(me, e));
        }
        for (to, side) in self.neighbours(me, dims) {
            let data = Bulk(self.edge(side));
            array.elem(to).send(
                ctx,
                BlockMsg::Ghost {
                    iter: self.iter,
                    side,
                    data,
                },
            );
        }
    }

    /// Runs every iteration whose ghosts have all arrived.
    fn advance(&mut self, ctx: &mut Ctx<'_, Self>) {
        let spec = *SPEC.get(ctx);
        while self.got == self.need && self.iter < spec.iters {
            let report = spec.residual_every > 0 && (self.iter + 1) % spec.residual_every == 0;
            let res = self.sweep(ctx, report);
            self.iter += 1;
            self.got = 0;
            if ctx.index() == (0, 0) {
                // One block speaks for the job: its rate is the job's.
                ctx.report_progress(1);
            }
            if report {
                ctx.contribute(res, Reducer::Max, Callback::main::<Main>(MainMsg::Residual));
            }
            if self.iter == spec.iters {
                let sum = self.checksum(ctx);
                ctx.contribute(sum, Reducer::Sum, Callback::main::<Main>(MainMsg::Checksum));
                return;
            }
            if spec.lb_every > 0 && self.iter % spec.lb_every == 0 {
                // Load balancing point: ghosts of this iteration go out after resume.
                self.synced = true;
                ctx.at_sync();
                return;
            }
            self.start_iteration(ctx);
        }
    }

    /// One sweep: `cur` becomes the next iteration's values.
    fn sweep(&mut self, ctx: &mut Ctx<'_, Self>, residual: bool) -> f64 {
        #[cfg(feature = "cuda")]
        if let Some(dev) = &mut self.dev {
            let me = ctx.index();
            return dev
                .sweep(gpu(ctx, me), residual)
                .unwrap_or_else(|e| gpu_failed(me, e));
        }
        let _ = ctx;
        if self.next.len() != self.cur.len() {
            self.next = self.cur.clone();
        }
        let res = sweep(&self.cur, &mut self.next, self.w, self.h, residual);
        std::mem::swap(&mut self.cur, &mut self.next);
        res
    }

    fn checksum(&self, ctx: &mut Ctx<'_, Self>) -> u64 {
        #[cfg(feature = "cuda")]
        if let Some(dev) = &self.dev {
            let me = ctx.index();
            let grid = dev.to_host().unwrap_or_else(|e| gpu_failed(me, e));
            return checksum_of(&grid, self.x0, self.y0, self.w, self.h);
        }
        let _ = ctx;
        checksum_of(&self.cur, self.x0, self.y0, self.w, self.h)
    }

    fn start_iteration(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.send_ghosts(ctx);
        for (side, data) in self.pending.release(self.iter) {
            self.fill(side, &data);
            self.got += 1;
        }
    }
}

impl Chare for Block {
    const NAME: &'static str = "jacobi2d::Block";
    type Index = (i32, i32);
    type Init = ();
    type Msg = BlockMsg;

    fn new(_: (), ctx: &mut Ctx<'_, Self>) -> Self {
        let spec = *SPEC.get(ctx);
        let (r, c) = ctx.index();
        let (x0, y0) = (c as u32 * spec.bx, r as u32 * spec.by);
        let w = spec.bx.min(spec.nx - x0) as usize;
        let h = spec.by.min(spec.ny - y0) as usize;
        let cur = padded(&spec, x0, y0, w, h);
        // On the GPU when the job was started with GPUs (`--gpu`).
        #[cfg(feature = "cuda")]
        let (dev, cur) = match ctx.gpu() {
            Ok(g) => (
                Some(
                    crate::jacobi_gpu::DeviceGrid::new(g, &cur, w, h)
                        .unwrap_or_else(|e| gpu_failed((r, c), e)),
                ),
                Vec::new(),
            ),
            Err(_) => (None, cur),
        };
        let mut b = Block {
            x0,
            y0,
            w,
            h,
            next: Bulk(cur.clone()),
            cur: Bulk(cur),
            iter: 0,
            got: 0,
            need: 0,
            synced: false,
            started: false,
            pending: Pending::new(),
            #[cfg(feature = "cuda")]
            dev,
        };
        b.need = b.neighbours((r, c), spec.blocks()).len() as u32;
        ctx.barrier(Callback::main::<Main>(MainMsg::Ready));
        b
    }

    fn handle(&mut self, msg: BlockMsg, ctx: &mut Ctx<'_, Self>) {
        match msg {
            BlockMsg::Start => {
                self.started = true;
                if SPEC.get(ctx).lb_at_start {
                    // Nothing measured yet predicts the work: every block
                    // counts alike, and the step spreads them by speed.
                    self.synced = true;
                    ctx.discount_load();
                    ctx.at_sync();
                    return;
                }
                self.start_iteration(ctx);
                self.advance(ctx);
            }
            BlockMsg::Ghost { iter, side, data } => {
                if iter == self.iter && self.started && !self.synced {
                    self.fill(side, &data);
                    self.got += 1;
                    self.advance(ctx);
                } else {
                    assert!(
                        iter >= self.iter,
                        "ghost from iteration {iter} reached a block at iteration {}",
                        self.iter
                    );
                    self.pending.hold(iter, (side, data));
                }
            }
        }
    }

    fn resume_from_sync(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.synced = false;
        self.start_iteration(ctx);
        self.advance(ctx);
    }
}

/// The PE's GPU (the block is on it, so the job has GPUs).
#[cfg(feature = "cuda")]
fn gpu(ctx: &Ctx<'_, Block>, me: (i32, i32)) -> &'static ductile::gpu::PeGpu {
    ctx.gpu().unwrap_or_else(|e| gpu_failed(me, e))
}

/// A GPU failure in the middle of a run cannot be recovered from here: the
/// PE's panic ends the node (exit 101) with this message.
#[cfg(feature = "cuda")]
fn gpu_failed(me: (i32, i32), e: ductile::gpu::GpuError) -> ! {
    panic!("jacobi2d block {me:?}: {e}")
}

/// The main chare's entry methods.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MainMsg {
    /// Every block is constructed.
    Ready(()),
    /// Max residual of the last reporting iteration.
    Residual(f64),
    /// The final checksum.
    Checksum(u64),
}

/// Sets up the problem, starts the blocks, reports the result.
#[derive(Serialize, Deserialize)]
pub struct Main {
    blocks: ArrayProxy<Block>,
    #[serde(skip)]
    started: Option<Instant>,
    /// The start as a wall-clock reading (seconds since the Unix epoch): a
    /// checkpoint carries it, so a job relaunched by `--mode restart`
    /// reports the seconds since its first start, relaunch included.
    #[serde(default)]
    started_unix_s: f64,
    residuals: u64,
    last_residual: f64,
    /// When the last progress line was printed, and at which iteration
    /// (a clock reading: not carried by a checkpoint).
    #[serde(skip)]
    last_report: Option<(Instant, u64)>,
    quiet: bool,
    device: String,
}

impl Chare for Main {
    const NAME: &'static str = "jacobi2d::Main";
    type Index = ();
    type Init = Vec<String>;
    type Msg = MainMsg;

    fn new(args: Vec<String>, ctx: &mut Ctx<'_, Self>) -> Self {
        // `main` checked the arguments before the node joined; this is the
        // same parse, on node 0, from the arguments the runtime passed.
        let parsed: JacobiArgs = args::try_parse("jacobi2d", &args).unwrap_or_else(|e| {
            let _ = e.print();
            std::process::exit(e.exit_code())
        });
        let spec = Spec::from_parsed(&parsed).unwrap_or_else(|e| {
            eprintln!("jacobi2d: {e}");
            std::process::exit(2)
        });
        SPEC.set(ctx, spec);
        let blocks = ArrayProxy::<Block>::create(ctx, spec.blocks(), ());
        Main {
            blocks,
            started: None,
            started_unix_s: 0.0,
            residuals: 0,
            last_residual: f64::NAN,
            last_report: None,
            quiet: parsed.quiet,
            device: if parsed.gpu { "gpu" } else { "cpu" }.into(),
        }
    }

    fn handle(&mut self, msg: MainMsg, ctx: &mut Ctx<'_, Self>) {
        let spec = *SPEC.get(ctx);
        match msg {
            MainMsg::Ready(()) => {
                self.started = Some(Instant::now());
                self.started_unix_s = unix_now_s();
                self.blocks.broadcast(ctx, BlockMsg::Start);
            }
            MainMsg::Residual(r) => {
                self.residuals += 1;
                self.last_residual = r;
                let iteration = self.residuals * spec.residual_every;
                // The rate since the last line (since the start for the
                // first): after an `expand` it visibly goes up.
                let now = Instant::now();
                let (since, from) = self
                    .last_report
                    .or(self.started.map(|t| (t, 0)))
                    .unwrap_or((now, iteration));
                let secs = now.duration_since(since).as_secs_f64();
                let rate = if secs > 0.0 {
                    (iteration - from) as f64 / secs
                } else {
                    0.0
                };
                self.last_report = Some((now, iteration));
                if !self.quiet {
                    println!(
                        "iteration {iteration} residual {r:.6e} pes {} nodes {} iterations/s {rate:.1}",
                        ctx.num_pes(),
                        ctx.num_nodes()
                    );
                }
            }
            MainMsg::Checksum(sum) => {
                // In the process that started (a monotonic clock), else
                // after a restart by the wall clock the checkpoint carried.
                let secs = match self.started {
                    Some(t) => t.elapsed().as_secs_f64(),
                    None if self.started_unix_s > 0.0 => {
                        (unix_now_s() - self.started_unix_s).max(0.0)
                    }
                    None => 0.0,
                };
                let (br, bc) = spec.blocks();
                println!(
                    "jacobi2d grid={}x{} blocks={}x{} pes={} nodes={} iterations={} seconds={secs:.6} time_per_iter_ms={:.4} residual={:.6e} device={}",
                    spec.nx,
                    spec.ny,
                    br,
                    bc,
                    ctx.num_pes(),
                    ctx.num_nodes(),
                    spec.iters,
                    secs * 1e3 / spec.iters.max(1) as f64,
                    self.last_residual,
                    self.device
                );
                println!("checksum={sum:016x} iterations={}", spec.iters);
                ctx.exit(0);
            }
        }
    }
}

fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Registers Jacobi2D's types.
pub fn register(reg: &mut Registry) {
    reg.main::<Main>().chare::<Block>().readonly(&SPEC);
}

/// Registers Jacobi2D with its blocks on GPUs (`jacobi2d --gpu`): every node
/// then starts its GPUs and compiles the kernels at start, and fails there
/// if it cannot (no driver, no device, or a build without the `cuda` feature).
pub fn register_gpu(reg: &mut Registry) {
    register(reg);
    #[cfg(feature = "cuda")]
    reg.gpu_module(crate::jacobi_gpu::module());
    #[cfg(not(feature = "cuda"))]
    reg.gpus();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_parse_with_defaults_and_unknown_flags_are_refused() {
        let s = Spec::from_args(&strings(&["--grid", "64x32", "--iters=5"])).unwrap();
        assert_eq!((s.nx, s.ny, s.bx, s.by, s.iters), (64, 32, 64, 64, 5));
        assert_eq!((s.residual_every, s.lb_every), (10, 0), "the defaults");
        let err =
            args::try_parse::<JacobiArgs>("jacobi2d", &strings(&["--size", "4096"])).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let err =
            args::try_parse::<JacobiArgs>("jacobi2d", &strings(&["--iter", "5"])).unwrap_err();
        assert!(err.to_string().contains("--iters"), "did you mean: {err}");
        assert!(Spec::from_args(&strings(&["--grid", "abc"])).is_err());
        assert!(Spec::from_args(&strings(&["--grid", "0"])).is_err());
        let help = args::try_parse::<JacobiArgs>("jacobi2d", &strings(&["--help"])).unwrap_err();
        assert_eq!(help.exit_code(), 0);
        assert!(help.to_string().contains("[default: 256]"), "{help}");
    }

    #[test]
    fn reference_changes_with_iterations_and_is_deterministic() {
        let s = Spec {
            nx: 16,
            ny: 12,
            bx: 4,
            by: 4,
            iters: 5,
            residual_every: 0,
            lb_every: 0,
            lb_at_start: false,
        };
        assert_eq!(reference(&s), reference(&s));
        assert_ne!(reference(&s), reference(&Spec { iters: 6, ..s }));
    }

    #[test]
    fn blocks_cover_uneven_grids() {
        let s = Spec {
            nx: 10,
            ny: 7,
            bx: 4,
            by: 3,
            iters: 1,
            residual_every: 0,
            lb_every: 0,
            lb_at_start: false,
        };
        assert_eq!(s.blocks(), (3, 3));
    }
}
