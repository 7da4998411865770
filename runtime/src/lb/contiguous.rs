//! `Contiguous`: every PE holds one run of consecutive elements, in index order,
//! sized to its share of the work. The strategy for a rescale's steps.
//!
//! The other strategies balance load and ignore who talks to whom. That is
//! harmless at start (the block map gives each PE a contiguous run, so most
//! neighbours of a stencil element live on its own PE) but not after a
//! rescale: `Refine` scatters a leaving PE's elements one by one over the
//! least-loaded PEs and fills a newcomer with one element from each, so the
//! number of elements whose neighbours are remote grows, and with it the
//! messages each iteration waits for. Measured on this machine (jacobi2d
//! 1024², 64² blocks, 8 nodes of 1 PE, `+lb Null`): one 1-for-1 swap under
//! `Refine` halved the iteration rate for the rest of the run.
//!
//! Index order is the locality the block map already assumes (Charm++'s
//! default map does the same): consecutive keys are neighbours along the
//! innermost dimension, and runs of them are rows or slabs. `Contiguous`
//! keeps that shape:
//!
//! 1. Each target PE (not leaving) gets a share of the collection's movable
//!    work: water-filling, so that every PE ends at the same time given its
//!    background and non-migratable load (and, rate-aware, its speed).
//! 2. PEs are ordered by where their elements are now (the mean rank of
//!    their elements in index order); a PE with no elements (a newcomer) is
//!    inserted, one at a time in id order, at the position that moves the
//!    least work, which is where a leaving PE left its gap when there is one.
//! 3. The elements, in index order, are cut into consecutive runs of those
//!    shares: each goes to the PE whose run holds the midpoint of its work,
//!    so no PE is over its share by more than half of one element.
//!
//! A 1-for-1 swap therefore moves exactly the leaver's run to the newcomer; a
//! shrink or growth shifts the run boundaries, moving more elements than
//! `Refine` but keeping each PE's elements together. Non-migratable elements
//! stay where they are and count as their PE's load. Cost: `O(P² · N)` for
//! `P` PEs and `N` elements when newcomers are inserted (each candidate
//! position is tried), `O(N + P log P)` otherwise.
use super::strategy::{Assignment, CostModel, Problem, Strategy};
use super::{LbError, LbStats, Result};

/// One run of consecutive elements per PE, sized to its share of the work;
/// newcomers take the gaps leavers left. See the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Contiguous {
    /// Cost model; [`CostModel::RateAware`] is `ContiguousRateAware`.
    pub model: CostModel,
}

impl Strategy for Contiguous {
    fn name(&self) -> &'static str {
        match self.model {
            CostModel::Uniform => "Contiguous",
            CostModel::RateAware => "ContiguousRateAware",
        }
    }

    fn solve(&self, stats: &LbStats) -> Result<Assignment> {
        let p = Problem::new(stats, self.model)?;
        let cut = Cut::new(&p);
        let order = cut.order()?;
        Ok(p.assignment(&cut.place(&order)))
    }
}

/// The problem seen as one sequence of movable elements in index order.
struct Cut<'a> {
    p: &'a Problem,
    /// Movable elements, in id (index) order.
    movable: Vec<usize>,
    /// Work of each movable element; every element counts 1 when nothing has
    /// been measured yet (a first step), so the runs are even by count.
    work: Vec<f64>,
    /// Per PE: background plus non-migratable load, in seconds; none when
    /// the elements are counted, not measured (a count and seconds do not
    /// add up: a step at start once put 1 block of 64 on the PE whose
    /// startup had left it 22 ms of background).
    base: Vec<f64>,
}

impl<'a> Cut<'a> {
    fn new(p: &'a Problem) -> Self {
        let movable: Vec<usize> = (0..p.objs.len()).filter(|&o| p.objs[o].movable).collect();
        let measured: Vec<f64> = movable.iter().map(|&o| p.objs[o].work.max(0.0)).collect();
        let (work, base) = if measured.iter().sum::<f64>() > 0.0 {
            (measured, p.base_loads())
        } else {
            (vec![1.0; movable.len()], vec![0.0; p.pes.len()])
        };
        Cut {
            p,
            movable,
            work,
            base,
        }
    }

    /// Target PEs in the order their runs follow each other.
    fn order(&self) -> Result<Vec<usize>> {
        let targets: Vec<usize> = self.p.targets().collect();
        if targets.is_empty() {
            return Err(LbError::AllLeaving);
        }
        // Mean rank of each PE's movable elements now.
        let mut rank_sum = vec![0.0; self.p.pes.len()];
        let mut count = vec![0usize; self.p.pes.len()];
        for (rank, &o) in self.movable.iter().enumerate() {
            let home = self.p.objs[o].home;
            rank_sum[home] += rank as f64;
            count[home] += 1;
        }
        let (mut placed, newcomers): (Vec<usize>, Vec<usize>) =
            targets.into_iter().partition(|&q| count[q] > 0);
        placed.sort_by(|&a, &b| {
            (rank_sum[a] / count[a] as f64)
                .total_cmp(&(rank_sum[b] / count[b] as f64))
                .then(a.cmp(&b))
        });
        let mut order = placed;
        for q in newcomers {
            let best = (0..=order.len())
                .map(|at| {
                    let mut candidate = order.clone();
                    candidate.insert(at, q);
                    (self.moved(&self.place(&candidate)), at)
                })
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
                .map_or(order.len(), |(_, at)| at);
            order.insert(best, q);
        }
        Ok(order)
    }

    /// Work each PE of `order` should receive: water-filling to a common
    /// finishing time `t`, PE `q` taking `(t - base[q]) * speed[q]`.
    fn shares(&self, order: &[usize]) -> Vec<f64> {
        let total: f64 = self.work.iter().sum();
        let capacity = |t: f64| -> f64 {
            order
                .iter()
                .map(|&q| (t - self.base[q]).max(0.0) * self.p.pes[q].speed)
                .sum()
        };
        let slowest = order
            .iter()
            .map(|&q| self.p.pes[q].speed)
            .fold(f64::INFINITY, f64::min)
            .max(f64::MIN_POSITIVE);
        let mut lo = order
            .iter()
            .map(|&q| self.base[q])
            .fold(f64::INFINITY, f64::min);
        let mut hi = order.iter().map(|&q| self.base[q]).fold(0.0, f64::max) + total / slowest;
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if capacity(mid) < total {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        order
            .iter()
            .map(|&q| (hi - self.base[q]).max(0.0) * self.p.pes[q].speed)
            .collect()
    }

    /// The placement that cuts the elements into runs for the PEs of `order`.
    fn place(&self, order: &[usize]) -> Vec<usize> {
        let mut place: Vec<usize> = self.p.objs.iter().map(|o| o.home).collect();
        let shares = self.shares(order);
        let (mut k, mut bound, mut done) = (0, shares[0], 0.0);
        for (i, &o) in self.movable.iter().enumerate() {
            let midpoint = done + 0.5 * self.work[i];
            while midpoint >= bound && k + 1 < order.len() {
                k += 1;
                bound += shares[k];
            }
            place[o] = order[k];
            done += self.work[i];
        }
        place
    }

    /// Work that `place` moves off its current PE.
    fn moved(&self, place: &[usize]) -> f64 {
        self.movable
            .iter()
            .zip(&self.work)
            .filter(|(&o, _)| place[o] != self.p.objs[o].home)
            .map(|(_, &w)| w)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lb::{ObjId, ObjStat, PeStat};

    fn pe(pe: u32, leaving: bool) -> PeStat {
        PeStat {
            pe,
            speed: 1.0,
            background: 0.0,
            idle: 0.0,
            leaving,
        }
    }

    /// `n` elements of load 1, in runs of `n / homes.len()` on `homes`.
    fn stats(n: u128, homes: &[u32], pes: Vec<PeStat>) -> LbStats {
        let run = n / homes.len() as u128;
        LbStats {
            step: 1,
            objs: (0..n)
                .map(|i| ObjStat {
                    id: ObjId::new(0, i),
                    pe: homes[(i / run) as usize],
                    load: 1.0,
                    bytes: 64,
                    migratable: true,
                })
                .collect(),
            pes,
        }
    }

    fn solve(stats: &LbStats) -> Vec<u32> {
        let plan = Contiguous {
            model: CostModel::Uniform,
        }
        .solve(stats)
        .unwrap();
        stats
            .objs
            .iter()
            .map(|o| plan.pe_of(o.id).unwrap())
            .collect()
    }

    /// PE of each element -> the list of runs, as (pe, length).
    fn runs(place: &[u32]) -> Vec<(u32, usize)> {
        let mut out: Vec<(u32, usize)> = Vec::new();
        for &q in place {
            match out.last_mut() {
                Some((last, n)) if *last == q => *n += 1,
                _ => out.push((q, 1)),
            }
        }
        out
    }

    #[test]
    fn a_swap_moves_exactly_the_leavers_run_to_the_newcomer() {
        // PEs 0..4 hold 4 runs of 8; PE 2 leaves, PE 4 (new, empty) joins.
        let mut pes: Vec<PeStat> = (0..5).map(|q| pe(q, q == 2)).collect();
        pes[4].leaving = false;
        let s = stats(32, &[0, 1, 2, 3], pes);
        let place = solve(&s);
        assert_eq!(runs(&place), vec![(0, 8), (1, 8), (4, 8), (3, 8)]);
        let plan = Contiguous {
            model: CostModel::Uniform,
        }
        .solve(&s)
        .unwrap();
        assert_eq!(plan.migrations(&s).len(), 8);
    }

    #[test]
    fn a_shrink_keeps_one_run_per_pe_in_the_same_order() {
        let pes: Vec<PeStat> = (0..4).map(|q| pe(q, q == 1)).collect();
        let place = solve(&stats(30, &[0, 1, 2], pes[..3].to_vec()));
        assert_eq!(runs(&place), vec![(0, 15), (2, 15)]);
    }

    #[test]
    fn a_newcomer_without_a_gap_goes_where_it_moves_the_least() {
        // Two full PEs and a newcomer: it takes the end of the sequence or
        // the middle, never splits a PE's run in two.
        let pes: Vec<PeStat> = (0..3).map(|q| pe(q, false)).collect();
        let place = solve(&stats(30, &[0, 1], pes));
        let r = runs(&place);
        assert_eq!(r.len(), 3, "{r:?}");
        assert!(r.iter().all(|&(_, n)| n == 10), "{r:?}");
        let order: Vec<u32> = r.iter().map(|&(q, _)| q).collect();
        assert!(order.windows(2).all(|w| w[0] != w[1]));
        assert_eq!(order.iter().filter(|&&q| q == 2).count(), 1);
    }

    #[test]
    fn shares_follow_speed_and_background() {
        // Rate-aware: PE 1 is twice as fast as PE 0 and gets twice the work;
        // PE 2 already carries 10 s of background and gets nothing.
        let mut pes: Vec<PeStat> = (0..3).map(|q| pe(q, false)).collect();
        pes[1].speed = 2.0;
        pes[2].background = 10.0;
        let mut s = stats(30, &[0, 1, 2], pes);
        for o in &mut s.objs {
            o.load = if o.pe == 1 { 0.1 } else { 0.2 };
        }
        let plan = Contiguous {
            model: CostModel::RateAware,
        }
        .solve(&s)
        .unwrap();
        let place: Vec<u32> = s.objs.iter().map(|o| plan.pe_of(o.id).unwrap()).collect();
        assert_eq!(runs(&place), vec![(0, 10), (1, 20)]);
    }

    #[test]
    fn unmeasured_elements_are_cut_by_count_and_speed_when_rate_aware() {
        let mut pes: Vec<PeStat> = (0..2).map(|q| pe(q, false)).collect();
        pes[0].speed = 2.0 * pes[1].speed;
        // Background seconds (a startup) do not weigh against a count.
        pes[1].background = 5.0;
        let mut s = stats(30, &[0, 1], pes);
        for o in &mut s.objs {
            o.load = 0.0;
        }
        let plan = Contiguous {
            model: CostModel::RateAware,
        }
        .solve(&s)
        .unwrap();
        let place: Vec<u32> = s.objs.iter().map(|o| plan.pe_of(o.id).unwrap()).collect();
        assert_eq!(runs(&place), vec![(0, 20), (1, 10)]);
    }

    #[test]
    fn unmeasured_elements_are_cut_by_count_and_all_leaving_is_an_error() {
        let pes: Vec<PeStat> = (0..2).map(|q| pe(q, false)).collect();
        let mut s = stats(10, &[0, 1], pes);
        for o in &mut s.objs {
            o.load = 0.0;
        }
        assert_eq!(runs(&solve(&s)), vec![(0, 5), (1, 5)]);
        for p in &mut s.pes {
            p.leaving = true;
        }
        let err = Contiguous {
            model: CostModel::Uniform,
        }
        .solve(&s)
        .unwrap_err();
        assert!(matches!(err, LbError::AllLeaving), "{err}");
    }
}
