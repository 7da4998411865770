//! Properties every strategy must keep, and table-driven cases (half-speed PE, one
//! heavy PE, evacuation, bad input) checked against `optimal`.

use std::collections::BTreeMap;

use proptest::prelude::{
    any, prop, prop_assert, prop_assert_eq, prop_assert_ne, prop_assume, prop_oneof, proptest,
    Just, ProptestConfig,
};

use super::optimal;
use super::strategy::Problem;
use super::strategy::Strategy as _;
use super::*;
use proptest::strategy::Strategy as _;

const EPS: f64 = 1e-9;

fn pe(pe: u32, speed: f64) -> PeStat {
    PeStat {
        pe,
        speed,
        background: 0.0,
        idle: 0.0,
        leaving: false,
    }
}

fn obj(index: u128, pe: u32, load: f64) -> ObjStat {
    ObjStat {
        id: ObjId::new(1, index),
        pe,
        load,
        bytes: 100 + index as u64,
        migratable: true,
    }
}

fn solve(name: &str, stats: &LbStats) -> Assignment {
    by_name(name, Params::default())
        .unwrap()
        .solve(stats)
        .unwrap()
}

fn count_on(plan: &Assignment, pe: u32) -> usize {
    plan.iter().filter(|&(_, p)| p == pe).count()
}

/// Random but valid statistics: 1-5 PEs with arbitrary ids, speeds and background,
/// some leaving (never all), up to 24 objects, some pinned (never on a leaving PE).
fn arb_stats() -> impl proptest::strategy::Strategy<Value = LbStats> {
    let pes = prop::collection::btree_map(
        0u32..40,
        (
            prop_oneof![Just(1.0), Just(0.5), 0.1f64..4.0],
            prop_oneof![Just(0.0), 0.0f64..3.0],
            0.0f64..1.0,
            prop::bool::weighted(0.25),
        ),
        1..6,
    );
    let objs = prop::collection::vec(
        (
            0u64..3,
            prop_oneof![0u128..8, any::<u128>()],
            any::<prop::sample::Index>(),
            prop_oneof![Just(1.0), Just(0.0), 0.0f64..10.0],
            0u64..1_000_000,
            prop::bool::weighted(0.85),
        ),
        0..24,
    );
    (pes, objs, 0u64..1000).prop_map(|(pes, objs, step)| {
        let mut pes: Vec<PeStat> = pes
            .into_iter()
            .map(|(id, (speed, background, idle, leaving))| PeStat {
                pe: id,
                speed,
                background,
                idle,
                leaving,
            })
            .collect();
        if pes.iter().all(|p| p.leaving) {
            pes[0].leaving = false;
        }
        let mut seen = BTreeMap::new();
        for (collection, index, at, load, bytes, migratable) in objs {
            let home = &pes[at.index(pes.len())];
            let id = ObjId::new(collection, index);
            let migratable = migratable || home.leaving;
            seen.entry(id).or_insert(ObjStat {
                id,
                pe: home.pe,
                load,
                bytes,
                migratable,
            });
        }
        LbStats {
            step,
            objs: seen.into_values().collect(),
            pes,
        }
    })
}

fn shuffled(stats: &LbStats, seed: u64) -> LbStats {
    fn shuffle<T>(v: &mut [T], mut seed: u64) {
        for i in (1..v.len()).rev() {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            v.swap(i, (seed >> 33) as usize % (i + 1));
        }
    }
    let mut s = stats.clone();
    shuffle(&mut s.objs, seed);
    shuffle(&mut s.pes, seed ^ 0x9e37_79b9);
    s
}

fn model_of(name: &str) -> CostModel {
    if name.ends_with("RateAware") {
        CostModel::RateAware
    } else {
        CostModel::Uniform
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_strategy_places_each_object_once_off_leaving_pes(
        stats in arb_stats(), tolerance in 1.0f64..1.5, seed in any::<u64>()
    ) {
        let leaving: BTreeMap<u32, bool> = stats.pes.iter().map(|p| (p.pe, p.leaving)).collect();
        for &name in STRATEGIES {
            let strategy = by_name(name, Params { tolerance }).unwrap();
            prop_assert_eq!(strategy.name(), name);
            let plan = strategy.solve(&stats).unwrap();
            prop_assert_eq!(plan.len(), stats.objs.len());
            for o in &stats.objs {
                let to = plan.pe_of(o.id).expect("placed");
                prop_assert!(!leaving[&to], "{} put {} on leaving PE {}", name, o.id, to);
                if !o.migratable {
                    prop_assert_eq!(to, o.pe, "{} moved pinned {}", name, o.id);
                }
                if leaving[&o.pe] {
                    prop_assert!(plan.migrations(&stats).iter().any(|m| m.id == o.id));
                }
            }
            // Deterministic, whatever the input order.
            prop_assert_eq!(&strategy.solve(&stats).unwrap(), &plan);
            prop_assert_eq!(&strategy.solve(&shuffled(&stats, seed)).unwrap(), &plan, "{} order-dependent", name);
            // Predicted loads account for every object and PE that counts.
            let loads = plan.predicted_loads(&stats, model_of(name)).unwrap();
            prop_assert!(loads.keys().all(|pe| !leaving[pe]));
            prop_assert_eq!(loads.len(), leaving.values().filter(|&&l| !l).count());
        }
    }

    #[test]
    fn replaying_a_dump_gives_the_same_plan(stats in arb_stats()) {
        let back = LbStats::from_json(&stats.to_json().unwrap()).unwrap();
        prop_assert_eq!(&back, &stats);
        for &name in STRATEGIES {
            let s = by_name(name, Params::default()).unwrap();
            prop_assert_eq!(s.solve(&back).unwrap(), s.solve(&stats).unwrap());
        }
    }

    #[test]
    fn rotate_moves_every_migratable_object(stats in arb_stats()) {
        let targets = stats.pes.iter().filter(|p| !p.leaving).count();
        let plan = Rotate.solve(&stats).unwrap();
        for o in &stats.objs {
            let to = plan.pe_of(o.id).unwrap();
            if o.migratable && targets >= 2 {
                prop_assert_ne!(to, o.pe);
            }
        }
    }

    /// List scheduling: whenever an object is placed, the least-loaded PE holds at
    /// most the average, so (speeds equal) Greedy's max is at most
    /// max(heaviest fixed load, average + heaviest object).
    #[test]
    fn greedy_is_within_the_list_scheduling_bound(stats in arb_stats()) {
        let p = Problem::new(&stats, CostModel::Uniform).unwrap();
        let base = p.base_loads();
        let targets: Vec<usize> = p.targets().collect();
        let fixed = targets.iter().map(|&q| base[q]).fold(0.0, f64::max);
        let movable: Vec<f64> = p.objs.iter().filter(|o| o.movable).map(|o| o.load).collect();
        let avg = (targets.iter().map(|&q| base[q]).sum::<f64>() + movable.iter().sum::<f64>())
            / targets.len() as f64;
        let heaviest = movable.iter().copied().fold(0.0, f64::max);
        let max = solve("Greedy", &stats).max_load(&stats, CostModel::Uniform).unwrap();
        prop_assert!(max <= fixed.max(avg + heaviest) * (1.0 + EPS) + EPS, "{max} {fixed} {avg} {heaviest}");
    }

    /// GreedyRefine never exceeds tolerance x Greedy's max, and moves nothing when
    /// the current placement is already within that (and nothing must be evacuated).
    #[test]
    fn greedy_refine_stays_within_tolerance_of_greedy(stats in arb_stats(), tolerance in 1.0f64..1.5) {
        for model in [CostModel::Uniform, CostModel::RateAware] {
            let greedy = Greedy { model }.solve(&stats).unwrap().max_load(&stats, model).unwrap();
            let plan = GreedyRefine { model, tolerance }.solve(&stats).unwrap();
            prop_assert!(plan.max_load(&stats, model).unwrap() <= tolerance * greedy);
            let evacuating = stats.objs.iter().any(|o| stats.pes.iter().any(|p| p.pe == o.pe && p.leaving));
            let current = Assignment::current(&stats).max_load(&stats, model).unwrap();
            // (A hair of slack: the strategy sums loads in a different order.)
            if !evacuating && current <= tolerance * greedy * (1.0 - EPS) {
                prop_assert!(plan.migrations(&stats).is_empty());
            }
        }
    }

    /// Refine (nothing leaving): the max never grows, objects leave only PEs above
    /// the threshold, and a PE that receives ends at or below the threshold or
    /// below the sender's load before the step.
    #[test]
    fn refine_moves_only_off_overloaded_pes(stats in arb_stats(), tolerance in 1.0f64..1.5) {
        let mut stats = stats;
        stats.pes.iter_mut().for_each(|p| p.leaving = false);
        for model in [CostModel::Uniform, CostModel::RateAware] {
            let limit = tolerance * Problem::new(&stats, model).unwrap().ideal();
            let before = Assignment::current(&stats).predicted_loads(&stats, model).unwrap();
            let plan = Refine { model, tolerance }.solve(&stats).unwrap();
            let after = plan.predicted_loads(&stats, model).unwrap();
            let max = |m: &BTreeMap<u32, f64>| m.values().copied().fold(0.0, f64::max);
            prop_assert!(max(&after) <= max(&before) * (1.0 + EPS) + EPS);
            for m in plan.migrations(&stats) {
                prop_assert!(before[&m.from] > limit * (1.0 - EPS));
                prop_assert!(after[&m.to] <= limit.max(before[&m.from]) * (1.0 + EPS) + EPS);
            }
        }
    }

    /// optimal: lower <= best <= every strategy's max; and the search agrees with
    /// brute force on small cases.
    #[test]
    fn optimal_brackets_every_plan(stats in arb_stats()) {
        for model in [CostModel::Uniform, CostModel::RateAware] {
            let best = optimal::best(&stats, model).unwrap();
            prop_assert!(best.lower <= best.upper);
            prop_assert!(optimal::lower_bound(&stats, model).unwrap() >= best.lower);
            for &name in STRATEGIES {
                let max = solve(name, &stats).max_load(&stats, model).unwrap();
                prop_assert!(max >= best.lower * (1.0 - EPS) - EPS, "{} below the lower bound", name);
                if best.exact {
                    prop_assert!(max >= best.upper * (1.0 - EPS) - EPS, "{} beat the optimum", name);
                }
            }
        }
    }

    #[test]
    fn branch_and_bound_matches_brute_force(stats in arb_stats()) {
        let mut stats = stats;
        stats.objs.truncate(6);
        stats.pes.truncate(3);
        let ids: Vec<u32> = stats.pes.iter().map(|p| p.pe).collect();
        stats.objs.retain(|o| ids.contains(&o.pe));
        prop_assume!(stats.validate().is_ok());
        for model in [CostModel::Uniform, CostModel::RateAware] {
            let best = optimal::best(&stats, model).unwrap();
            prop_assert!(best.exact);
            let brute = brute_force(&stats, model);
            prop_assert!((best.upper - brute).abs() <= EPS * brute.max(1.0), "{} vs {}", best.upper, brute);
        }
    }
}

fn brute_force(stats: &LbStats, model: CostModel) -> f64 {
    let targets: Vec<u32> = stats
        .pes
        .iter()
        .filter(|p| !p.leaving)
        .map(|p| p.pe)
        .collect();
    let movable: Vec<usize> = (0..stats.objs.len())
        .filter(|&i| stats.objs[i].migratable)
        .collect();
    let mut best = f64::INFINITY;
    let combos = targets.len().pow(movable.len() as u32);
    for mut c in 0..combos {
        let mut plan = Assignment::current(stats);
        for &i in &movable {
            plan.insert(stats.objs[i].id, targets[c % targets.len()]);
            c /= targets.len();
        }
        best = best.min(plan.max_load(stats, model).unwrap());
    }
    best
}

/// 2 PEs, PE 1 at half speed, 16 objects of equal work, 8 per PE. Loads are wall
/// time as measured: 1 s on PE 0, 2 s on the half-speed PE 1.
fn half_speed() -> LbStats {
    LbStats {
        step: 1,
        pes: vec![pe(0, 1.0), pe(1, 0.5)],
        objs: (0..16)
            .map(|i| obj(i, (i / 8) as u32, if i < 8 { 1.0 } else { 2.0 }))
            .collect(),
    }
}

#[test]
fn half_speed_rate_aware_reaches_the_optimum_and_plain_does_not() {
    let stats = half_speed();
    let best = optimal::best(&stats, CostModel::RateAware).unwrap();
    assert!(best.exact);
    assert_eq!(best.upper, 11.0); // 11 objects x 1 s vs 5 x 2 s
    let none = Assignment::current(&stats)
        .max_avg_ratio(&stats, CostModel::RateAware)
        .unwrap();
    assert!(
        (none - 1.5).abs() < EPS,
        "16 s against an ideal of 10.67 s: {none}"
    );

    for name in [
        "GreedyRefineRateAware",
        "GreedyRateAware",
        "RefineRateAware",
    ] {
        let plan = solve(name, &stats);
        assert_eq!((count_on(&plan, 0), count_on(&plan, 1)), (11, 5), "{name}");
        let ratio = plan.max_avg_ratio(&stats, CostModel::RateAware).unwrap();
        assert!(
            ratio <= best.ratio() * 1.05,
            "{name}: {ratio} vs best {}",
            best.ratio()
        );
    }
    let plan = solve("GreedyRefineRateAware", &stats);
    assert_eq!(
        plan.migrations(&stats).len(),
        3,
        "only the excess leaves PE 1"
    );
    assert!(plan
        .migrations(&stats)
        .iter()
        .all(|m| m.from == 1 && m.to == 0));

    // Without speeds the 2 s objects look twice as heavy, so plain GreedyRefine
    // balances measured seconds (10/6) and leaves PE 1 the bottleneck at 12 s.
    let plain = solve("GreedyRefine", &stats);
    assert_eq!((count_on(&plain, 0), count_on(&plain, 1)), (10, 6));
    assert_eq!(plain.max_load(&stats, CostModel::Uniform).unwrap(), 12.0);
    assert_eq!(plain.max_load(&stats, CostModel::RateAware).unwrap(), 12.0);
    let plain_ratio = plain.max_avg_ratio(&stats, CostModel::RateAware).unwrap();
    assert!(plain_ratio > best.ratio() * 1.05);
}

#[test]
fn half_speed_with_equal_measured_loads_keeps_eight_and_eight() {
    // If both PEs measured 1 s per object, PE 1's objects are half the work of PE
    // 0's: both PEs already finish together, so neither model moves anything.
    let mut stats = half_speed();
    stats.objs.iter_mut().for_each(|o| o.load = 1.0);
    for name in [
        "GreedyRefine",
        "GreedyRefineRateAware",
        "Refine",
        "RefineRateAware",
        "Null",
    ] {
        let plan = solve(name, &stats);
        assert!(plan.migrations(&stats).is_empty(), "{name}");
        assert_eq!((count_on(&plan, 0), count_on(&plan, 1)), (8, 8));
    }
    let ratio = Assignment::current(&stats)
        .max_avg_ratio(&stats, CostModel::RateAware)
        .unwrap();
    assert!((ratio - 1.0).abs() < EPS);
}

#[test]
fn one_heavy_pe_sheds_only_its_own_objects() {
    // PE 0: 8 x 1 s; PEs 1-3: 2 x 1 s each. Average 3.5 s.
    let stats = LbStats {
        step: 3,
        pes: (0..4).map(|p| pe(p, 1.0)).collect(),
        objs: (0..14)
            .map(|i| obj(i, if i < 8 { 0 } else { 1 + (i as u32 - 8) / 2 }, 1.0))
            .collect(),
    };
    for name in [
        "GreedyRefine",
        "Refine",
        "GreedyRefineRateAware",
        "RefineRateAware",
    ] {
        let plan = solve(name, &stats);
        let moves = plan.migrations(&stats);
        assert!(moves.iter().all(|m| m.from == 0), "{name}: {moves:?}");
        assert_eq!(moves.len(), 4, "{name}: 8 -> 4, others 2 -> 3 or 4");
        assert_eq!(
            plan.max_load(&stats, CostModel::Uniform).unwrap(),
            4.0,
            "{name}"
        );
    }
    let greedy = solve("Greedy", &stats);
    assert_eq!(greedy.max_load(&stats, CostModel::Uniform).unwrap(), 4.0);
    assert!(solve("Null", &stats).migrations(&stats).is_empty());
    let best = optimal::best(&stats, CostModel::Uniform).unwrap();
    assert_eq!((best.upper, best.exact), (4.0, true));
}

#[test]
fn evacuation_empties_a_leaving_pe() {
    let mut stats = LbStats {
        step: 9,
        pes: vec![pe(0, 1.0), pe(1, 1.0), pe(5, 1.0)],
        objs: (0..9)
            .map(|i| obj(i, [0, 1, 5][i as usize % 3], 1.0 + i as f64))
            .collect(),
    };
    stats.pes[2].leaving = true;
    stats.objs[0].migratable = false; // pinned on PE 0, which stays: fine
    for &name in STRATEGIES {
        let plan = solve(name, &stats);
        assert_eq!(count_on(&plan, 5), 0, "{name}");
        assert_eq!(plan.pe_of(stats.objs[0].id), Some(0), "{name}");
    }
    // Null and Refine (already balanced otherwise) move exactly the evacuees.
    for name in ["Null", "Refine"] {
        let moved: Vec<u32> = solve(name, &stats)
            .migrations(&stats)
            .iter()
            .map(|m| m.from)
            .collect();
        assert_eq!(moved, vec![5, 5, 5], "{name}");
    }
    // Rotate sends objects above the last PE around to the first.
    let rot = solve("Rotate", &stats);
    assert_eq!(rot.pe_of(stats.objs[2].id), Some(0));
    assert_eq!(rot.pe_of(stats.objs[1].id), Some(0));
    assert_eq!(rot.pe_of(stats.objs[3].id), Some(1));
}

#[test]
fn bad_input_is_an_error_not_a_plan() {
    let ok = half_speed();
    let with = |f: &dyn Fn(&mut LbStats)| {
        let mut s = ok.clone();
        f(&mut s);
        s
    };
    type Expect = fn(&LbError) -> bool;
    let cases: Vec<(&str, LbStats, Expect)> = vec![
        ("no PEs", with(&|s| s.pes.clear()), |e| {
            matches!(e, LbError::NoPes)
        }),
        (
            "all leaving",
            with(&|s| s.pes.iter_mut().for_each(|p| p.leaving = true)),
            |e| matches!(e, LbError::AllLeaving),
        ),
        ("unknown PE", with(&|s| s.objs[3].pe = 7), |e| {
            matches!(e, LbError::UnknownPe { pe: 7, .. })
        }),
        ("NaN load", with(&|s| s.objs[0].load = f64::NAN), |e| {
            matches!(e, LbError::BadLoad { .. })
        }),
        ("negative load", with(&|s| s.objs[0].load = -1.0), |e| {
            matches!(e, LbError::BadLoad { .. })
        }),
        (
            "infinite load",
            with(&|s| s.objs[0].load = f64::INFINITY),
            |e| matches!(e, LbError::BadLoad { .. }),
        ),
        ("zero speed", with(&|s| s.pes[1].speed = 0.0), |e| {
            matches!(
                e,
                LbError::BadPeStat {
                    pe: 1,
                    field: "speed",
                    ..
                }
            )
        }),
        ("negative speed", with(&|s| s.pes[1].speed = -0.5), |e| {
            matches!(e, LbError::BadPeStat { field: "speed", .. })
        }),
        (
            "NaN background",
            with(&|s| s.pes[0].background = f64::NAN),
            |e| {
                matches!(
                    e,
                    LbError::BadPeStat {
                        field: "background",
                        ..
                    }
                )
            },
        ),
        ("negative idle", with(&|s| s.pes[0].idle = -1.0), |e| {
            matches!(e, LbError::BadPeStat { field: "idle", .. })
        }),
        ("duplicate PE", with(&|s| s.pes.push(pe(0, 1.0))), |e| {
            matches!(e, LbError::DuplicatePe(0))
        }),
        (
            "duplicate object",
            with(&|s| s.objs.push(s.objs[0].clone())),
            |e| matches!(e, LbError::DuplicateObj(_)),
        ),
        (
            "pinned on a leaving PE",
            with(&|s| {
                s.pes[1].leaving = true;
                s.objs[9].migratable = false;
            }),
            |e| matches!(e, LbError::Pinned { pe: 1, .. }),
        ),
    ];
    for (what, stats, expected) in cases {
        for &name in STRATEGIES {
            let err = solve_err(name, &stats);
            assert!(expected(&err), "{what}: {name} gave {err}");
        }
        assert!(
            optimal::best(&stats, CostModel::RateAware).is_err(),
            "{what}"
        );
    }
}

fn solve_err(name: &str, stats: &LbStats) -> LbError {
    by_name(name, Params::default())
        .unwrap()
        .solve(stats)
        .expect_err("must refuse")
}

#[test]
fn names_and_parameters() {
    let err = by_name("GreedyRefin", Params::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("GreedyRefin`") && STRATEGIES.iter().all(|n| text.contains(n)),
        "{text}"
    );
    for &name in STRATEGIES {
        assert_eq!(by_name(name, Params::default()).unwrap().name(), name);
    }
    assert_eq!(Params::parse("").unwrap(), Params::default());
    assert_eq!(Params::parse(" tolerance = 1.2 ").unwrap().tolerance, 1.2);
    for bad in [
        "tolerance=0.9",
        "tolerance=NaN",
        "tolerance=x",
        "speed=2",
        "tolerance",
    ] {
        assert!(
            matches!(Params::parse(bad), Err(LbError::BadParam { .. })),
            "{bad}"
        );
    }
    assert!(by_name("Refine", Params { tolerance: 0.5 }).is_err());
}

#[test]
fn assignment_helpers_and_plan_mismatch() {
    let stats = half_speed();
    let plan = solve("GreedyRefineRateAware", &stats);
    assert_eq!(
        plan.bytes_moved(&stats),
        plan.migrations(&stats).iter().map(|m| m.bytes).sum::<u64>()
    );
    let loads = plan.predicted_loads(&stats, CostModel::RateAware).unwrap();
    assert_eq!(loads, BTreeMap::from([(0, 11.0), (1, 10.0)]));
    let json = serde_json::to_string(&plan).unwrap();
    assert_eq!(serde_json::from_str::<Assignment>(&json).unwrap(), plan);

    let mut partial = plan.clone();
    partial.insert(ObjId::new(9, 9), 0);
    assert!(matches!(
        partial.max_load(&stats, CostModel::Uniform),
        Err(LbError::PlanMismatch(_))
    ));
    let mut wrong_pe = plan;
    wrong_pe.insert(stats.objs[0].id, 42);
    assert!(matches!(
        wrong_pe.predicted_loads(&stats, CostModel::Uniform),
        Err(LbError::PlanMismatch(_))
    ));
}

#[test]
fn background_counts_where_it_is() {
    // PE 0 is busy 6 s with non-object work: objects go to PE 1 first.
    let mut stats = LbStats {
        step: 0,
        pes: vec![pe(0, 1.0), pe(1, 1.0)],
        objs: (0..4).map(|i| obj(i, 0, 1.0)).collect(),
    };
    stats.pes[0].background = 6.0;
    let plan = solve("Greedy", &stats);
    assert_eq!(count_on(&plan, 1), 4);
    assert_eq!(plan.max_load(&stats, CostModel::Uniform).unwrap(), 6.0);
    assert!((plan.max_avg_ratio(&stats, CostModel::Uniform).unwrap() - 1.2).abs() < EPS);
}

#[test]
fn large_cases_solve_and_search_stays_within_budget() {
    // 3000 objects of varied load on 48 PEs of mixed speed, two leaving.
    let pes: Vec<PeStat> = (0..48)
        .map(|p| PeStat {
            leaving: p % 23 == 5,
            ..pe(p, [1.0, 0.5, 2.0, 0.75][p as usize % 4])
        })
        .collect();
    let objs: Vec<ObjStat> = (0..3000u128)
        .map(|i| obj(i, (i % 48) as u32, 0.001 * ((i * 7919) % 97 + 1) as f64))
        .collect();
    let stats = LbStats { step: 1, objs, pes };
    for &name in STRATEGIES {
        let plan = solve(name, &stats);
        assert_eq!(plan.len(), 3000);
    }
    let best = optimal::best(&stats, CostModel::RateAware).unwrap();
    assert!(best.lower <= best.upper && best.nodes == 0);
    let plan = solve("GreedyRefineRateAware", &stats);
    assert!(plan.max_load(&stats, CostModel::RateAware).unwrap() <= best.upper * 1.05);

    // Small enough to search, too big to finish: the budget stops it.
    let mut small = stats.clone();
    small.objs.truncate(120);
    let best = optimal::best_with_budget(&small, CostModel::RateAware, 20_000).unwrap();
    assert!(best.nodes <= 20_001 && best.lower <= best.upper);
}
