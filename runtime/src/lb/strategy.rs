//! Load-balancing strategies — pure functions from [`LbStats`] to an [`Assignment`]
//! of every object to a PE — and the cost model they share.
//!
//! Every strategy validates its input, never places an object on a leaving PE
//! (objects there are evacuated), keeps non-migratable objects where they are, and is
//! deterministic: objects are visited in [`ObjId`] order (heaviest first where
//! weight matters) and PE ties go to the object's current PE, then the lowest PE id,
//! so the input's order and hash seeds never change the plan.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::stats::{LbStats, ObjId};
use super::{LbError, Result};

/// How measured loads become predicted time on another PE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CostModel {
    /// Every PE is taken to run at speed 1: an object costs its measured load
    /// wherever it goes.
    Uniform,
    /// An object measured at `load` seconds on PE `p` costs
    /// `load * speed(p) / speed(q)` on PE `q`. This is the model that predicts
    /// wall time; use it to judge any plan on a heterogeneous fleet.
    RateAware,
}

/// A load-balancing strategy: a pure function of the statistics.
pub trait Strategy: Send + Sync + fmt::Debug {
    /// The name [`by_name`](super::by_name) knows it by.
    fn name(&self) -> &'static str;
    /// Places every object of `stats` on a PE.
    fn solve(&self, stats: &LbStats) -> Result<Assignment>;
    /// Whether it balances load, so that a plan that gains too little may
    /// be skipped ([`super::steady::worth_moving`]); `Rotate` moves for the
    /// sake of moving.
    fn balances(&self) -> bool {
        true
    }
}

/// One object's place in a plan (the serialized form of an [`Assignment`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The object.
    pub id: ObjId,
    /// The PE it is to live on.
    pub pe: u32,
}

/// A plan: the PE of every object. Iterates in [`ObjId`] order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<Placement>", into = "Vec<Placement>")]
pub struct Assignment {
    pe_of: BTreeMap<ObjId, u32>,
}

/// One object that a plan moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migration {
    /// The object.
    pub id: ObjId,
    /// Its current PE.
    pub from: u32,
    /// Its PE after the step.
    pub to: u32,
    /// Its migration size estimate.
    pub bytes: u64,
}

impl From<Vec<Placement>> for Assignment {
    fn from(v: Vec<Placement>) -> Self {
        v.into_iter().map(|p| (p.id, p.pe)).collect()
    }
}

impl From<Assignment> for Vec<Placement> {
    fn from(a: Assignment) -> Self {
        a.iter().map(|(id, pe)| Placement { id, pe }).collect()
    }
}

impl FromIterator<(ObjId, u32)> for Assignment {
    fn from_iter<I: IntoIterator<Item = (ObjId, u32)>>(iter: I) -> Self {
        Self {
            pe_of: iter.into_iter().collect(),
        }
    }
}

impl Assignment {
    /// The plan that moves nothing: every object stays on its current PE.
    pub fn current(stats: &LbStats) -> Self {
        stats.objs.iter().map(|o| (o.id, o.pe)).collect()
    }

    /// Puts `id` on `pe`, returning its previous PE in this plan.
    pub fn insert(&mut self, id: ObjId, pe: u32) -> Option<u32> {
        self.pe_of.insert(id, pe)
    }

    /// The PE the plan gives `id`.
    pub fn pe_of(&self, id: ObjId) -> Option<u32> {
        self.pe_of.get(&id).copied()
    }

    /// `(object, PE)` in object order.
    pub fn iter(&self) -> impl Iterator<Item = (ObjId, u32)> + '_ {
        self.pe_of.iter().map(|(&id, &pe)| (id, pe))
    }

    /// How many objects the plan places.
    pub fn len(&self) -> usize {
        self.pe_of.len()
    }

    /// Whether the plan places no object.
    pub fn is_empty(&self) -> bool {
        self.pe_of.is_empty()
    }

    /// The objects of `stats` whose PE changes, in object order. Objects the plan
    /// does not mention are taken to stay.
    pub fn migrations(&self, stats: &LbStats) -> Vec<Migration> {
        let mut moves: Vec<Migration> = stats
            .objs
            .iter()
            .filter_map(|o| {
                let to = self.pe_of(o.id)?;
                (to != o.pe).then_some(Migration {
                    id: o.id,
                    from: o.pe,
                    to,
                    bytes: o.bytes,
                })
            })
            .collect();
        moves.sort_by_key(|m| m.id);
        moves
    }

    /// Bytes the plan's migrations send.
    pub fn bytes_moved(&self, stats: &LbStats) -> u64 {
        self.migrations(stats).iter().map(|m| m.bytes).sum()
    }

    /// Predicted load (seconds) of each PE after the plan under `model`: its
    /// background plus the cost of the objects placed on it. Lists every PE that is
    /// not leaving, and a leaving PE only if the plan leaves objects on it.
    /// Errors if the plan and `stats` do not name the same objects.
    pub fn predicted_loads(&self, stats: &LbStats, model: CostModel) -> Result<BTreeMap<u32, f64>> {
        let p = Problem::new(stats, model)?;
        let place = p.place_of(self)?;
        let loads = p.loads(&place);
        Ok(p.reported(&place)
            .map(|q| (p.pes[q].id, loads[q]))
            .collect())
    }

    /// The largest of [`predicted_loads`](Self::predicted_loads).
    pub fn max_load(&self, stats: &LbStats, model: CostModel) -> Result<f64> {
        let p = Problem::new(stats, model)?;
        let place = p.place_of(self)?;
        Ok(p.makespan(&place))
    }

    /// Max over average load under `model`, where the average is what every
    /// non-leaving PE would carry if all work (objects and background) were spread
    /// in proportion to speed — the plain average when speeds are equal. 1.0 is
    /// perfect; a plan with no load at all reports 1.0.
    pub fn max_avg_ratio(&self, stats: &LbStats, model: CostModel) -> Result<f64> {
        let p = Problem::new(stats, model)?;
        let place = p.place_of(self)?;
        Ok(p.ratio(p.makespan(&place)))
    }
}

/// Heaviest object first onto the PE where it would finish earliest (the least
/// loaded PE when speeds are equal), ignoring where objects are now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Greedy {
    /// Cost model; [`CostModel::RateAware`] is `GreedyRateAware`.
    pub model: CostModel,
}

/// Greedy placement that keeps an object on its current PE whenever that keeps
/// the maximum load within `tolerance` x Greedy's maximum (Charm++'s
/// GreedyRefineLB). Never worse than `tolerance` x Greedy; moves nothing when the
/// current placement is already that good.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GreedyRefine {
    /// Cost model; [`CostModel::RateAware`] is `GreedyRefineRateAware`.
    pub model: CostModel,
    /// Allowed maximum relative to Greedy's maximum (`>= 1`).
    pub tolerance: f64,
}

/// Moves objects only off PEs above `tolerance` x average, until each such PE is
/// under it or nothing more helps: heaviest object first onto a PE that stays at
/// or below the threshold, then (objects too coarse to fit) onto a PE that ends
/// below the donor, so the maximum never grows. Objects on other PEs never move.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Refine {
    /// Cost model; [`CostModel::RateAware`] is `RefineRateAware`.
    pub model: CostModel,
    /// Overload threshold relative to the (speed-weighted) average (`>= 1`).
    pub tolerance: f64,
}

/// Every migratable object to the next non-leaving PE by id (wrapping around); an
/// object on a leaving PE goes to the first non-leaving PE above it. For tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rotate;

/// Moves nothing except objects on leaving PEs, which go heaviest first to the
/// least-loaded PE (measured loads, speeds ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Null;

impl Strategy for Greedy {
    fn name(&self) -> &'static str {
        match self.model {
            CostModel::Uniform => "Greedy",
            CostModel::RateAware => "GreedyRateAware",
        }
    }

    fn solve(&self, stats: &LbStats) -> Result<Assignment> {
        let p = Problem::new(stats, self.model)?;
        Ok(p.assignment(&p.greedy()?))
    }
}

impl Strategy for GreedyRefine {
    fn name(&self) -> &'static str {
        match self.model {
            CostModel::Uniform => "GreedyRefine",
            CostModel::RateAware => "GreedyRefineRateAware",
        }
    }

    fn solve(&self, stats: &LbStats) -> Result<Assignment> {
        let p = Problem::new(stats, self.model)?;
        let greedy = p.greedy()?;
        let limit = self.tolerance * p.makespan(&greedy);
        let mut loads = p.base_loads();
        let mut place: Vec<usize> = p.objs.iter().map(|o| o.home).collect();
        for o in p.heaviest_first() {
            let home = p.objs[o].home;
            let q = if !p.pes[home].leaving && loads[home] + p.cost(o, home) <= limit {
                home
            } else {
                p.best_target(&loads, o, None)?
            };
            loads[q] += p.cost(o, q);
            place[o] = q;
        }
        // Keeping objects home can, in corner cases, cost more than the tolerance
        // allows; Greedy's own plan is then the answer.
        if p.makespan(&place) > limit {
            place = greedy;
        }
        Ok(p.assignment(&place))
    }
}

impl Strategy for Refine {
    fn name(&self) -> &'static str {
        match self.model {
            CostModel::Uniform => "Refine",
            CostModel::RateAware => "RefineRateAware",
        }
    }

    fn solve(&self, stats: &LbStats) -> Result<Assignment> {
        let p = Problem::new(stats, self.model)?;
        let (mut place, mut loads) = p.evacuated()?;
        let limit = self.tolerance * p.ideal();
        // Donors are fixed up front and visited once, most loaded first.
        let mut donors: Vec<usize> = p.targets().filter(|&q| loads[q] > limit).collect();
        donors.sort_by(|&a, &b| loads[b].total_cmp(&loads[a]).then(a.cmp(&b)));
        for d in donors {
            let mut mine: Vec<usize> = (0..p.objs.len())
                .filter(|&o| place[o] == d && p.objs[o].movable)
                .collect();
            mine.sort_by(|&a, &b| p.cost(b, d).total_cmp(&p.cost(a, d)).then(a.cmp(&b)));
            // First only moves that keep the receiver under the limit; then, if the
            // donor is still over (objects too coarse to fit), moves to a PE not
            // over the limit that at least lower the pair's maximum. Never onto a
            // PE over the limit: a donor that received would pass on more than it
            // started with, and a receiver could end above every donor's load.
            for fits_under_limit in [true, false] {
                for &o in &mine {
                    if loads[d] <= limit {
                        break;
                    }
                    if place[o] != d {
                        continue;
                    }
                    let q = p.best_target(&loads, o, Some(d))?;
                    let after = loads[q] + p.cost(o, q);
                    let accept = if fits_under_limit {
                        after <= limit
                    } else {
                        loads[q] <= limit && after < loads[d]
                    };
                    if q != d && accept {
                        loads[d] -= p.cost(o, d);
                        loads[q] = after;
                        place[o] = q;
                    }
                }
            }
        }
        Ok(p.assignment(&place))
    }
}

impl Strategy for Rotate {
    fn name(&self) -> &'static str {
        "Rotate"
    }

    fn balances(&self) -> bool {
        false
    }

    fn solve(&self, stats: &LbStats) -> Result<Assignment> {
        let p = Problem::new(stats, CostModel::Uniform)?;
        let targets: Vec<usize> = p.targets().collect();
        let place: Vec<usize> = p
            .objs
            .iter()
            .map(|o| {
                if !o.movable {
                    return o.home;
                }
                // PEs are sorted by id, so the next target by index is the next by id.
                targets
                    .iter()
                    .copied()
                    .find(|&q| q > o.home)
                    .unwrap_or(targets[0])
            })
            .collect();
        Ok(p.assignment(&place))
    }
}

impl Strategy for Null {
    fn name(&self) -> &'static str {
        "Null"
    }

    fn solve(&self, stats: &LbStats) -> Result<Assignment> {
        let p = Problem::new(stats, CostModel::Uniform)?;
        Ok(p.assignment(&p.evacuated()?.0))
    }
}

/// A PE as the strategies model it (not [`crate::topo::Pe`], the PE number).
#[derive(Debug)]
pub(crate) struct PeModel {
    pub(crate) id: u32,
    /// 1.0 under [`CostModel::Uniform`].
    pub(crate) speed: f64,
    pub(crate) background: f64,
    pub(crate) leaving: bool,
}

/// An object as the strategies see it.
#[derive(Debug)]
pub(crate) struct Obj {
    pub(crate) id: ObjId,
    /// Index of its current PE in [`Problem::pes`].
    pub(crate) home: usize,
    /// Measured seconds on `home`.
    pub(crate) load: f64,
    /// Nominal work: `load * speed(home)`.
    pub(crate) work: f64,
    pub(crate) movable: bool,
}

/// Validated statistics in canonical order (PEs by id, objects by id), with the
/// cost model applied. Placements are `Vec<usize>`: PE index per object index.
#[derive(Debug)]
pub(crate) struct Problem {
    pub(crate) pes: Vec<PeModel>,
    pub(crate) objs: Vec<Obj>,
}

impl Problem {
    pub(crate) fn new(stats: &LbStats, model: CostModel) -> Result<Self> {
        stats.validate()?;
        let mut pes: Vec<PeModel> = stats
            .pes
            .iter()
            .map(|p| PeModel {
                id: p.pe,
                speed: match model {
                    CostModel::Uniform => 1.0,
                    CostModel::RateAware => p.speed,
                },
                background: p.background,
                leaving: p.leaving,
            })
            .collect();
        pes.sort_by_key(|p| p.id);
        let mut objs: Vec<Obj> = stats
            .objs
            .iter()
            .map(|o| {
                // validate() has checked that every object's PE is listed.
                let home = pes.binary_search_by_key(&o.pe, |p| p.id).unwrap_or(0);
                Obj {
                    id: o.id,
                    home,
                    load: o.load,
                    work: o.load * pes[home].speed,
                    movable: o.migratable,
                }
            })
            .collect();
        objs.sort_by_key(|o| o.id);
        Ok(Self { pes, objs })
    }

    /// Seconds object `o` would take on PE `q`; exactly its measured load at home.
    pub(crate) fn cost(&self, o: usize, q: usize) -> f64 {
        let obj = &self.objs[o];
        if q == obj.home {
            obj.load
        } else {
            obj.work / self.pes[q].speed
        }
    }

    /// Indices of the PEs that may receive objects, in id order.
    pub(crate) fn targets(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.pes.len()).filter(|&q| !self.pes[q].leaving)
    }

    /// Per PE: background plus the non-migratable objects (which never move).
    pub(crate) fn base_loads(&self) -> Vec<f64> {
        let mut loads: Vec<f64> = self.pes.iter().map(|p| p.background).collect();
        for (o, obj) in self.objs.iter().enumerate() {
            if !obj.movable {
                loads[obj.home] += self.cost(o, obj.home);
            }
        }
        loads
    }

    /// Migratable objects, heaviest (most work) first, then by id.
    pub(crate) fn heaviest_first(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.objs.len())
            .filter(|&o| self.objs[o].movable)
            .collect();
        order.sort_by(|&a, &b| {
            self.objs[b]
                .work
                .total_cmp(&self.objs[a].work)
                .then(a.cmp(&b))
        });
        order
    }

    /// The non-leaving PE (other than `except`) where `o` would finish earliest;
    /// ties go to `o`'s current PE, then the lowest id.
    pub(crate) fn best_target(
        &self,
        loads: &[f64],
        o: usize,
        except: Option<usize>,
    ) -> Result<usize> {
        let home = self.objs[o].home;
        self.targets()
            .filter(|&q| Some(q) != except)
            .map(|q| (loads[q] + self.cost(o, q), q != home, q))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)))
            .map(|(_, _, q)| q)
            .or(except)
            .ok_or(LbError::AllLeaving)
    }

    /// Greedy's placement (also the starting upper bound of `optimal`).
    pub(crate) fn greedy(&self) -> Result<Vec<usize>> {
        let mut loads = self.base_loads();
        let mut place: Vec<usize> = self.objs.iter().map(|o| o.home).collect();
        for o in self.heaviest_first() {
            let q = self.best_target(&loads, o, None)?;
            loads[q] += self.cost(o, q);
            place[o] = q;
        }
        Ok(place)
    }

    /// Everything stays except objects on leaving PEs, which go heaviest first to
    /// the PE where they finish earliest. Returns the placement and its loads.
    pub(crate) fn evacuated(&self) -> Result<(Vec<usize>, Vec<f64>)> {
        let mut place: Vec<usize> = self.objs.iter().map(|o| o.home).collect();
        let mut loads = self.base_loads();
        let mut evacuees = Vec::new();
        for o in self.heaviest_first() {
            let home = self.objs[o].home;
            if self.pes[home].leaving {
                evacuees.push(o);
            } else {
                loads[home] += self.cost(o, home);
            }
        }
        for o in evacuees {
            let q = self.best_target(&loads, o, None)?;
            loads[q] += self.cost(o, q);
            place[o] = q;
        }
        Ok((place, loads))
    }

    /// Per-PE load of a placement, summed in object order.
    pub(crate) fn loads(&self, place: &[usize]) -> Vec<f64> {
        let mut loads: Vec<f64> = self.pes.iter().map(|p| p.background).collect();
        for (o, &q) in place.iter().enumerate() {
            loads[q] += self.cost(o, q);
        }
        loads
    }

    /// PEs that count in a plan's max: non-leaving ones, and leaving ones that
    /// still hold objects.
    fn reported<'a>(&'a self, place: &'a [usize]) -> impl Iterator<Item = usize> + 'a {
        (0..self.pes.len()).filter(move |&q| !self.pes[q].leaving || place.contains(&q))
    }

    /// The largest load of a placement over the PEs that count.
    pub(crate) fn makespan(&self, place: &[usize]) -> f64 {
        let loads = self.loads(place);
        self.reported(place).map(|q| loads[q]).fold(0.0, f64::max)
    }

    /// The load every non-leaving PE would carry if all work were spread in
    /// proportion to speed.
    pub(crate) fn ideal(&self) -> f64 {
        let speed: f64 = self.targets().map(|q| self.pes[q].speed).sum();
        let background: f64 = self
            .targets()
            .map(|q| self.pes[q].background * self.pes[q].speed)
            .sum();
        let work: f64 = self.objs.iter().map(|o| o.work).sum();
        (background + work) / speed
    }

    /// `max_load` over [`ideal`](Self::ideal); 1.0 when there is no load at all.
    pub(crate) fn ratio(&self, max_load: f64) -> f64 {
        let ideal = self.ideal();
        if ideal > 0.0 {
            max_load / ideal
        } else {
            1.0
        }
    }

    pub(crate) fn assignment(&self, place: &[usize]) -> Assignment {
        place
            .iter()
            .enumerate()
            .map(|(o, &q)| (self.objs[o].id, self.pes[q].id))
            .collect()
    }

    /// The placement an assignment describes; it must name exactly our objects and
    /// only listed PEs.
    fn place_of(&self, a: &Assignment) -> Result<Vec<usize>> {
        if a.len() != self.objs.len() {
            return Err(LbError::PlanMismatch(format!(
                "plan places {} objects, statistics list {}",
                a.len(),
                self.objs.len()
            )));
        }
        self.objs
            .iter()
            .map(|o| {
                let pe = a.pe_of(o.id).ok_or_else(|| {
                    LbError::PlanMismatch(format!("object {} is not placed", o.id))
                })?;
                self.pes.binary_search_by_key(&pe, |p| p.id).map_err(|_| {
                    LbError::PlanMismatch(format!("object {} placed on unknown PE {pe}", o.id))
                })
            })
            .collect()
    }
}
