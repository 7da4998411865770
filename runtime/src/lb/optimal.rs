//! How good the best possible placement of a case is, so that a benchmark can say
//! "within X% of best possible": a lower bound on the maximum load, and an exact
//! branch-and-bound search where the case is small enough.
//!
//! Bounds use the same cost model and the same constraints as the strategies:
//! non-migratable objects stay, leaving PEs get nothing, background stays put.
//! Migration cost is ignored — "best" means best balance.

use super::strategy::{CostModel, Problem};
use super::{LbStats, Result};

/// Search nodes [`best`] may visit before it settles for bounds.
pub const DEFAULT_NODE_BUDGET: u64 = 2_000_000;

/// Above this many migratable objects [`best`] does not search (recursion depth);
/// it reports Greedy's maximum and the lower bound.
pub const MAX_SEARCH_OBJECTS: usize = 256;

/// The best possible maximum load of a case, or bounds on it.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Best {
    /// The speed-weighted average load (the denominator of
    /// [`Assignment::max_avg_ratio`](super::Assignment::max_avg_ratio)).
    pub ideal: f64,
    /// No placement has a smaller maximum load than this.
    pub lower: f64,
    /// The smallest maximum load found; the optimum when `exact`.
    pub upper: f64,
    /// Whether `upper` is proven optimal.
    pub exact: bool,
    /// Search nodes visited.
    pub nodes: u64,
}

impl Best {
    /// Best max/avg ratio found (`upper / ideal`); the optimum when `exact`.
    pub fn ratio(&self) -> f64 {
        ratio(self.upper, self.ideal)
    }

    /// No placement has a smaller max/avg ratio than this.
    pub fn lower_ratio(&self) -> f64 {
        ratio(self.lower, self.ideal)
    }
}

fn ratio(load: f64, ideal: f64) -> f64 {
    if ideal > 0.0 {
        load / ideal
    } else {
        1.0
    }
}

/// A lower bound on the maximum load (seconds) of any valid placement under
/// `model`: the largest of the heaviest fixed load, the cheapest home for the
/// heaviest object, and the level the work reaches if poured across PEs in
/// proportion to speed (LPT-style bounds).
pub fn lower_bound(stats: &LbStats, model: CostModel) -> Result<f64> {
    let p = Problem::new(stats, model)?;
    let targets: Vec<usize> = p.targets().collect();
    Ok(root_lower(&p, &targets))
}

/// The best placement's maximum load under `model`, found by branch and bound
/// within [`DEFAULT_NODE_BUDGET`] nodes.
pub fn best(stats: &LbStats, model: CostModel) -> Result<Best> {
    best_with_budget(stats, model, DEFAULT_NODE_BUDGET)
}

/// [`best`] with an explicit node budget.
pub fn best_with_budget(stats: &LbStats, model: CostModel, budget: u64) -> Result<Best> {
    let p = Problem::new(stats, model)?;
    let targets: Vec<usize> = p.targets().collect();
    let greedy = p.greedy()?;
    let mut upper = p.makespan(&greedy);
    let lower = root_lower(&p, &targets).min(upper);
    let ideal = p.ideal();
    if upper <= lower {
        return Ok(Best {
            ideal,
            lower,
            upper,
            exact: true,
            nodes: 0,
        });
    }
    // Identical objects (same home, same load) next to each other, so the search
    // can insist they take non-decreasing PEs and skip their permutations.
    let mut order = p.heaviest_first();
    if order.len() > MAX_SEARCH_OBJECTS {
        return Ok(Best {
            ideal,
            lower,
            upper,
            exact: false,
            nodes: 0,
        });
    }
    order.sort_by(|&a, &b| {
        let (x, y) = (&p.objs[a], &p.objs[b]);
        y.work
            .total_cmp(&x.work)
            .then(x.home.cmp(&y.home))
            .then(x.load.total_cmp(&y.load))
            .then(a.cmp(&b))
    });
    let same_as_prev: Vec<bool> = (0..order.len())
        .map(|i| {
            i > 0 && {
                let (x, y) = (&p.objs[order[i - 1]], &p.objs[order[i]]);
                x.home == y.home && x.load.to_bits() == y.load.to_bits()
            }
        })
        .collect();
    let mut remaining = vec![0.0; order.len() + 1];
    for i in (0..order.len()).rev() {
        remaining[i] = remaining[i + 1] + p.objs[order[i]].work;
    }
    let loads = p.base_loads();
    let start_max = targets.iter().map(|&q| loads[q]).fold(0.0, f64::max);
    let mut s = Search {
        p: &p,
        targets: &targets,
        order: &order,
        same_as_prev: &same_as_prev,
        remaining: &remaining,
        loads,
        place: p.objs.iter().map(|o| o.home).collect(),
        pos: vec![0; order.len()],
        best: upper,
        best_place: None,
        nodes: 0,
        budget,
        aborted: false,
    };
    s.dfs(0, start_max);
    if let Some(place) = &s.best_place {
        upper = upper.min(p.makespan(place));
    }
    Ok(Best {
        ideal,
        // The bound and the makespan sum the same loads in different orders:
        // when the search meets the bound they may differ in the last bit.
        lower: lower.min(upper),
        upper,
        exact: !s.aborted,
        nodes: s.nodes,
    })
}

fn root_lower(p: &Problem, targets: &[usize]) -> f64 {
    let base = p.base_loads();
    let movable = p.heaviest_first();
    let mut lb = targets.iter().map(|&q| base[q]).fold(0.0, f64::max);
    if let Some(&o) = movable.first() {
        lb = lb.max(cheapest_finish(p, targets, &base, o));
    }
    let work: f64 = movable.iter().map(|&o| p.objs[o].work).sum();
    lb.max(water_level(p, targets, &base, work))
}

/// The earliest `o` could finish anywhere, given `loads`.
fn cheapest_finish(p: &Problem, targets: &[usize], loads: &[f64], o: usize) -> f64 {
    targets
        .iter()
        .map(|&q| loads[q] + p.cost(o, q))
        .fold(f64::INFINITY, f64::min)
}

/// The lowest level `L` with `sum over PEs of speed * max(0, L - load) >= work`:
/// no placement of `work` on top of `loads` can finish everything before `L`.
fn water_level(p: &Problem, targets: &[usize], loads: &[f64], work: f64) -> f64 {
    let mut by_load = targets.to_vec();
    by_load.sort_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(a.cmp(&b)));
    let (mut speed, mut filled) = (0.0, 0.0);
    for (i, &q) in by_load.iter().enumerate() {
        speed += p.pes[q].speed;
        filled += p.pes[q].speed * loads[q];
        let level = (work + filled) / speed;
        if i + 1 == by_load.len() || level <= loads[by_load[i + 1]] {
            return level;
        }
    }
    0.0
}

struct Search<'a> {
    p: &'a Problem,
    targets: &'a [usize],
    order: &'a [usize],
    same_as_prev: &'a [bool],
    remaining: &'a [f64],
    loads: Vec<f64>,
    place: Vec<usize>,
    /// Position in `targets` chosen at each depth.
    pos: Vec<usize>,
    best: f64,
    best_place: Option<Vec<usize>>,
    nodes: u64,
    budget: u64,
    aborted: bool,
}

impl Search<'_> {
    fn dfs(&mut self, depth: usize, current_max: f64) {
        if self.aborted {
            return;
        }
        self.nodes += 1;
        if self.nodes > self.budget {
            self.aborted = true;
            return;
        }
        let Some(&o) = self.order.get(depth) else {
            if current_max < self.best {
                self.best = current_max;
                self.best_place = Some(self.place.clone());
            }
            return;
        };
        let bound = current_max
            .max(water_level(
                self.p,
                self.targets,
                &self.loads,
                self.remaining[depth],
            ))
            .max(cheapest_finish(self.p, self.targets, &self.loads, o));
        if bound >= self.best {
            return;
        }
        let first = if self.same_as_prev[depth] {
            self.pos[depth - 1]
        } else {
            0
        };
        let mut choices: Vec<(f64, usize)> = (first..self.targets.len())
            .map(|k| {
                (
                    self.loads[self.targets[k]] + self.p.cost(o, self.targets[k]),
                    k,
                )
            })
            .collect();
        choices.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (finish, k) in choices {
            if finish >= self.best || self.aborted {
                break;
            }
            let q = self.targets[k];
            let before = self.loads[q];
            self.loads[q] = finish;
            self.place[o] = q;
            self.pos[depth] = k;
            self.dfs(depth + 1, current_max.max(finish));
            self.loads[q] = before;
        }
    }
}
