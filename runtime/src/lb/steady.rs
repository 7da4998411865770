//! What a steady-state load-balancing step acts on, and whether it acts.
//!
//! Measured loads and speeds are noisy on real machines (an OS that moves
//! threads, a neighbour's burst, a CPU quota's period): a strategy that
//! trusts one step's numbers chases the noise and pays for migrations that
//! buy nothing. Two rules keep it steady:
//!
//! * **smoothing**: each object's work and each PE's speed is an
//!   exponentially weighted average over the steps (`+lb-smoothing A`: the
//!   newest measurement's weight; 1 turns it off). What is averaged is an
//!   object's work (its load times the speed of the PE it ran on), not its
//!   load: an object that moved between PEs of different speeds took a
//!   different time for the same work, and averaging times would make the
//!   work of every object that moved to a slower PE look smaller, and of
//!   one that moved to a faster PE larger, so the next step would send
//!   them back. Objects keep their history across a rescale, which
//!   renumbers the PEs: their speeds start over. A rescale's own steps
//!   smooth too, so its placement does not follow one period's noise
//!   (under a CPU quota a block's measured time includes the time its
//!   thread was throttled);
//! * **worth moving**: a step migrates only when the plan's predicted
//!   makespan is better than the current placement's by more than a fraction
//!   (`+lb-min-gain G`, default 5%): below it the gain does not pay for the
//!   moves and is within the noise. Steps a rescale runs (evacuation,
//!   populating newcomers) always move, and so do strategies that do not
//!   balance (`Rotate`, which exists to move).
//!
//! Pure functions of the statistics, like the strategies: a dumped step
//! replays to the same plan.

use std::collections::HashMap;

use super::stats::{LbStats, ObjId};

/// Default weight of the newest measurement.
pub const DEFAULT_SMOOTHING: f64 = 0.5;
/// Default fraction of the makespan a plan must gain to be carried out.
pub const DEFAULT_MIN_GAIN: f64 = 0.05;

/// Work and speeds seen at earlier steps of one collection.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// Each object's work: load times the speed of the PE it ran on.
    work: HashMap<ObjId, f64>,
    speeds: HashMap<u32, f64>,
    pes: Vec<u32>,
}

impl History {
    /// Forgets everything.
    pub fn reset(&mut self) {
        *self = History::default();
    }

    /// Forgets the PEs' speeds, keeping the objects' work (the PEs are
    /// about to be renumbered by a rescale; objects keep their ids).
    pub fn forget_pes(&mut self) {
        self.speeds.clear();
        self.pes.clear();
    }

    /// Replaces the speeds of `stats` by their averages over the steps so
    /// far, with weight `alpha` (0 < alpha <= 1) on this step's, and each
    /// object's load by the time its averaged work takes at its PE's
    /// averaged speed; remembers them for the next step.
    pub fn smooth(&mut self, stats: &mut LbStats, alpha: f64) {
        let alpha = if alpha.is_finite() {
            alpha.clamp(f64::MIN_POSITIVE, 1.0)
        } else {
            1.0
        };
        let pes: Vec<u32> = stats.pes.iter().map(|p| p.pe).collect();
        if pes != self.pes {
            self.forget_pes();
            self.pes = pes;
        }
        let blend = |old: Option<&f64>, new: f64| match old {
            Some(old) if old.is_finite() && new.is_finite() => alpha * new + (1.0 - alpha) * old,
            _ => new,
        };
        // The averaged speeds a load is measured and given back at.
        let mut speed = HashMap::with_capacity(stats.pes.len());
        for p in &mut stats.pes {
            p.speed = blend(self.speeds.get(&p.pe), p.speed);
            self.speeds.insert(p.pe, p.speed);
            if p.speed.is_finite() && p.speed > 0.0 {
                speed.insert(p.pe, p.speed);
            }
        }
        let mut work = HashMap::with_capacity(stats.objs.len());
        for o in &mut stats.objs {
            // A PE with no usable speed: its objects' loads as they are.
            let s = speed.get(&o.pe).copied().unwrap_or(1.0);
            let w = blend(self.work.get(&o.id), o.load * s);
            o.load = w / s;
            work.insert(o.id, w);
        }
        // Objects that left the collection are forgotten.
        self.work = work;
    }
}

/// Whether a plan whose max/average load ratio is `after`, against
/// `before` for the current placement, gains more than `min_gain` of the
/// makespan.
pub fn worth_moving(before: f64, after: f64, min_gain: f64) -> bool {
    if !(before.is_finite() && after.is_finite()) || before <= 0.0 {
        // Nothing to judge by (no load measured): let the strategy decide.
        return true;
    }
    before - after > min_gain.max(0.0) * before
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lb::stats::{ObjStat, PeStat};

    fn stats(loads: &[f64], speeds: &[f64]) -> LbStats {
        LbStats {
            step: 0,
            pes: speeds
                .iter()
                .enumerate()
                .map(|(i, s)| PeStat {
                    pe: i as u32,
                    speed: *s,
                    background: 0.0,
                    idle: 0.0,
                    leaving: false,
                })
                .collect(),
            objs: loads
                .iter()
                .enumerate()
                .map(|(i, l)| ObjStat {
                    id: ObjId::new(0, i as u128),
                    pe: 0,
                    load: *l,
                    bytes: 8,
                    migratable: true,
                })
                .collect(),
        }
    }

    #[test]
    fn smoothing_averages_over_steps_and_starts_over_when_the_pes_change() {
        let mut h = History::default();
        let mut s = stats(&[1.0, 2.0], &[1.0, 1.0]);
        h.smooth(&mut s, 0.5);
        assert_eq!(s.objs[0].load, 1.0, "the first step is taken as measured");
        let mut s = stats(&[3.0, 2.0], &[1.0, 1.0]);
        h.smooth(&mut s, 0.5);
        assert_eq!(s.objs[0].load, 2.0);
        assert_eq!(s.objs[1].load, 2.0);
        // A noisy spike moves the average half way, not all the way.
        let mut s = stats(&[10.0, 2.0], &[1.0, 1.0]);
        h.smooth(&mut s, 0.5);
        assert_eq!(s.objs[0].load, 6.0);
        let mut s = stats(&[6.0, 2.0], &[0.5, 1.0]);
        h.smooth(&mut s, 0.5);
        assert_eq!(s.pes[0].speed, 0.75);
        // Three PEs now: the old numbering means nothing, the objects'
        // work still does.
        let mut s = stats(&[10.0, 2.0], &[0.5, 1.0, 1.0]);
        h.smooth(&mut s, 0.5);
        assert_eq!(s.pes[0].speed, 0.5, "speeds start over");
        // Work: 5.25 before ((6 + 6 * 0.75) / 2), 10 * 0.5 = 5 now.
        assert_eq!(s.objs[0].load, 10.25, "work carries on: 5.125 at speed 0.5");
        // Renumbered without a change of count (a swap): forget_pes.
        h.forget_pes();
        let mut s = stats(&[8.0, 2.0], &[1.0, 1.0, 1.0]);
        h.smooth(&mut s, 0.5);
        assert_eq!(s.pes[0].speed, 1.0);
        assert_eq!(s.objs[0].load, 6.5625, "(5.125 + 8) / 2 at speed 1");
        // alpha 1: no smoothing at all.
        let mut s = stats(&[4.0, 2.0], &[1.0, 1.0, 1.0]);
        h.smooth(&mut s, 1.0);
        assert_eq!(s.objs[0].load, 4.0);
    }

    /// An object that moves to a PE half as fast takes twice as long for
    /// the same work: its smoothed load there is twice its load before,
    /// not the average of the two times.
    #[test]
    fn an_object_that_moves_keeps_its_work_not_its_time() {
        let mut h = History::default();
        let mut s = stats(&[1.0, 1.0], &[2.0, 1.0]);
        h.smooth(&mut s, 0.5);
        // Object 0 moved from the speed-2 PE 0 to the speed-1 PE 1.
        let mut s = stats(&[2.0, 1.0], &[2.0, 1.0]);
        s.objs[0].pe = 1;
        h.smooth(&mut s, 0.5);
        assert_eq!(s.objs[0].load, 2.0, "the same work, at half the speed");
        assert_eq!(s.objs[1].load, 1.0, "unmoved and unchanged");
        // A PE with no speed measured: the loads as they are.
        let mut s = stats(&[3.0, 1.0], &[0.0, 1.0]);
        h.smooth(&mut s, 1.0);
        assert_eq!(s.objs[0].load, 3.0);
    }

    #[test]
    fn a_plan_is_carried_out_only_when_it_gains_more_than_the_threshold() {
        assert!(worth_moving(1.5, 1.05, 0.05), "30% better");
        assert!(!worth_moving(1.04, 1.01, 0.05), "3% is noise");
        assert!(!worth_moving(1.2, 1.3, 0.0), "worse never moves");
        assert!(
            worth_moving(f64::NAN, 1.0, 0.05),
            "nothing measured: the strategy decides"
        );
        assert!(worth_moving(1.2, 1.1, 0.0), "threshold 0: any gain moves");
    }
}
