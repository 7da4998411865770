//! Migration and load balancing, seen from outside: real jobs where elements
//! move while messages fly, checked against sequential computations.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use ductile_apps::jacobi::{reference, Spec};
use ductile_apps::megatest::walk_expectation;
use ductile_e2e::{run, SHAPES};
use proptest::prelude::*;

/// The machine the jobs of this file run on: two at a time (the test
/// threads), but the test that reads measured speeds runs alone, since
/// another job's PEs on the same cores are measured as slowness.
static MACHINE: RwLock<()> = RwLock::new(());

/// A share of the machine, beside one other job.
fn shared() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|e| e.into_inner())
}

/// The machine to one job.
fn alone() -> RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(|e| e.into_inner())
}

proptest! {
    // Each case is a real multi-process job: few cases, each a fresh random setup.
    #![proptest_config(ProptestConfig { cases: 8, failure_persistence: None, ..ProptestConfig::default() })]

    /// Tokens on random walks while their receivers jump to random PEs: every
    /// element ends with exactly the tokens sent to it (a lost or duplicated
    /// message changes the digest).
    #[test]
    fn messages_to_migrating_elements_arrive_exactly_once(
        seed in any::<u64>(),
        shape in prop::sample::select(vec![(1u32, 2u32), (2, 1), (2, 2), (3, 1)]),
        per_pe in 1u64..5,
        chains in 1u64..4,
        len in 5u64..40,
    ) {
        let _machine = shared();
        let (n, p) = shape;
        let elems = per_pe * (n * p) as u64 + 1;
        let job = run(n, p, "megatest", &[
            "migrate", "--seed", &seed.to_string(), "--elems", &elems.to_string(),
            "--chains", &chains.to_string(), "--len", &len.to_string(),
        ]);
        job.expect_code(0, "megatest migrate");
        let want = walk_expectation(seed, elems, chains, len);
        prop_assert_eq!(job.value("walk_digest"), Some(want.to_string()));
    }
}

#[test]
fn elements_that_move_actually_move() {
    let _machine = shared();
    let job = run(
        2,
        2,
        "megatest",
        &[
            "migrate", "--seed", "11", "--elems", "24", "--chains", "3", "--len", "30",
        ],
    );
    job.expect_code(0, "megatest migrate");
    let moves: u64 = job
        .value("walk_moves")
        .expect("moves printed")
        .parse()
        .expect("a number");
    assert!(
        moves > 10,
        "the test must exercise migration, saw {moves} moves"
    );
}

#[test]
fn destroyed_elements_leave_reductions_and_the_rest_complete() {
    let _machine = shared();
    for &(n, p) in SHAPES {
        let elems = 6 * n * p + 2;
        let job = run(
            n,
            p,
            "megatest",
            &["destroy", "--elems", &elems.to_string()],
        );
        job.expect_code(0, "megatest destroy");
        let want: u64 = (0..elems as u64).filter(|i| i % 3 != 0).sum();
        assert_eq!(
            job.value("survivor_index_sum"),
            Some(want.to_string()),
            "{n}x{p}"
        );
    }
}

/// Rotate moves every block at every step: the checksum must not notice.
#[test]
fn jacobi_checksum_is_unchanged_by_load_balancing() {
    let _machine = shared();
    let spec = Spec {
        nx: 96,
        ny: 80,
        bx: 96,
        by: 80,
        iters: 24,
        residual_every: 4,
        lb_every: 0,
        lb_at_start: false,
    };
    let want = format!("{:016x}", reference(&spec));
    for &(n, p) in &[(1, 2), (2, 2), (3, 1)] {
        for lb in [
            ["+lb", "Rotate"],
            ["+lb", "GreedyRefineRateAware"],
            ["+lb", "Greedy"],
        ] {
            for lb_every in ["1", "5"] {
                let job = run(
                    n,
                    p,
                    "jacobi2d",
                    &[
                        "--grid",
                        "96x80",
                        "--block",
                        "13x7",
                        "--iters",
                        "24",
                        "--residual-every",
                        "4",
                        "--lb-every",
                        lb_every,
                        "--quiet",
                        lb[0],
                        lb[1],
                        "+lb-report",
                        "+pe-speed",
                        "1:0.5",
                    ],
                );
                job.expect_code(0, &format!("jacobi2d {n}x{p} {lb:?} every {lb_every}"));
                assert_eq!(
                    job.value("checksum").as_deref(),
                    Some(want.as_str()),
                    "{n}x{p} {lb:?} every {lb_every}"
                );
                let steps = job
                    .stdout
                    .lines()
                    .filter(|l| l.starts_with("lb step="))
                    .count();
                let expect_steps = if lb_every == "1" { 23 } else { 4 };
                assert_eq!(
                    steps, expect_steps,
                    "one LB step per --lb-every iterations:\n{}",
                    job.stdout
                );
                if lb[1] == "Rotate" {
                    assert!(
                        job.stdout.contains("migrations=96"),
                        "Rotate moves every block:\n{}",
                        job.stdout
                    );
                }
            }
        }
    }
}

/// A strategy name the runtime does not know stops the job at start, saying
/// which exist: a usage error (exit 2, docs/cli.md), nothing started.
#[test]
fn an_unknown_strategy_is_refused_with_the_list() {
    let _machine = shared();
    let job = run(1, 1, "jacobi2d", &["--grid", "16", "+lb", "Nope"]);
    job.expect_code(2, "unknown strategy");
    assert!(job.stderr.contains("GreedyRefine"), "{}", job.stderr);
}

/// With +lb-period, at_sync every iteration balances only now and then, and
/// the result is the same.
#[test]
fn periodic_balancing_skips_steps_but_not_results() {
    let _machine = shared();
    let spec = Spec {
        nx: 128,
        ny: 128,
        bx: 128,
        by: 128,
        iters: 200,
        residual_every: 0,
        lb_every: 0,
        lb_at_start: false,
    };
    let want = format!("{:016x}", reference(&spec));
    // Jacobi2D calling at_sync every iteration, balanced with Rotate at most once per `period` seconds.
    let steps_with_period = |period: &str| {
        let job = run(
            1,
            2,
            "jacobi2d",
            &[
                "--grid",
                "128",
                "--block",
                "32",
                "--iters",
                "200",
                "--residual-every",
                "0",
                "--lb-every",
                "1",
                "--quiet",
                "+lb",
                "Rotate",
                "+lb-report",
                "+lb-period",
                period,
            ],
        );
        job.expect_code(0, &format!("jacobi2d with +lb-period {period}"));
        assert_eq!(
            job.value("checksum").as_deref(),
            Some(want.as_str()),
            "+lb-period {period}"
        );
        job.stdout
            .lines()
            .filter(|l| l.starts_with("lb step="))
            .count()
    };
    assert_eq!(
        steps_with_period("1000"),
        0,
        "a 1000 s period never comes round in this run"
    );
    assert_eq!(
        steps_with_period("0"),
        199,
        "period 0 balances at every at_sync"
    );
}

/// Statistics dumped by a live step, replayed into the same strategy
/// offline, give exactly the plan the live step made.
#[test]
fn replayed_statistics_give_the_live_plan() {
    let _machine = shared();
    let dump = tempfile::tempdir().expect("temp dir");
    let dir = dump.path().to_str().expect("utf-8 path");
    let job = run(
        2,
        2,
        "jacobi2d",
        &[
            "--grid",
            "128",
            "--block",
            "16",
            "--iters",
            "30",
            "--lb-every",
            "10",
            "--quiet",
            "+lb",
            "GreedyRefineRateAware",
            "+lb-dump",
            dir,
            "+pe-speed",
            "1:0.5,2:0.75",
        ],
    );
    job.expect_code(0, "jacobi2d with +lb-dump");
    let mut replayed = 0;
    for entry in std::fs::read_dir(dump.path()).expect("dump dir") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
            .to_string();
        if !name.ends_with(".json") || name.ends_with(".plan.json") {
            continue;
        }
        let stats = ductile::lb::stats::LbStats::load(&path).expect("statistics load");
        let strategy =
            ductile::lb::by_name("GreedyRefineRateAware", ductile::lb::Params::default())
                .expect("strategy");
        let offline = strategy.solve(&stats).expect("replay solves");
        let live_text = std::fs::read_to_string(path.with_extension("plan.json"))
            .expect("plan dumped beside the statistics");
        let live: ductile::lb::strategy::Assignment =
            serde_json::from_str(&live_text).expect("plan parses");
        assert_eq!(offline, live, "replay of {name}");
        assert_eq!(stats.pes.len(), 4);
        replayed += 1;
    }
    assert_eq!(replayed, 2, "one dump per LB step (iterations 10 and 20)");
}

/// Steady-state steps move only when the plan gains enough (`+lb-min-gain`,
/// default 5% of the makespan): a uniform Jacobi2D gives Greedy nothing worth
/// 50% (measurement noise alone is a few percent), so no step reshuffles the
/// blocks; a PE at a quarter of the speed is worth a rate-aware rebalance
/// at the default threshold.
#[test]
fn steady_state_steps_move_only_when_the_gain_is_worth_it() {
    let _machine = shared();
    let lb_lines = |extra: &[&str]| {
        let mut args = vec![
            "--grid",
            "256",
            "--block",
            "32",
            "--iters",
            "40",
            "--lb-every",
            "10",
            "--quiet",
            "+lb-report",
        ];
        args.extend_from_slice(extra);
        let job = run(2, 1, "jacobi2d", &args);
        job.expect_code(0, &format!("jacobi2d {extra:?}"));
        let lines: Vec<String> = job
            .stdout
            .lines()
            .filter(|l| l.starts_with("lb step="))
            .map(String::from)
            .collect();
        assert_eq!(lines.len(), 3, "{}", job.stdout);
        lines
    };
    for line in lb_lines(&["+lb", "Greedy", "+lb-min-gain", "0.5"]) {
        assert!(
            line.contains("migrations=0") && line.contains("kept=gain_below_min"),
            "{line}"
        );
    }
    let skewed = lb_lines(&["+lb", "GreedyRefineRateAware", "+pe-speed", "1:0.25"]);
    assert!(
        skewed
            .iter()
            .any(|l| !l.contains("migrations=0") && !l.contains("kept=")),
        "a PE at a quarter speed is worth moving blocks off:\n{}",
        skewed.join("\n")
    );
}

/// The statistics of step `n` that a job dumped into `dir` (`+lb-dump`).
fn dumped_step(dir: &std::path::Path, n: u32) -> ductile::lb::stats::LbStats {
    let name = std::fs::read_dir(dir)
        .expect("dump dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find(|f| f.ends_with(&format!("-{n}.json")))
        .unwrap_or_else(|| panic!("statistics of step {n} dumped"));
    ductile::lb::stats::LbStats::load(&dir.join(name)).expect("statistics load")
}

/// Elements on PEs 0 and 1 when `stats` were taken.
fn blocks_per_pe(stats: &ductile::lb::stats::LbStats) -> [usize; 2] {
    let mut blocks = [0usize; 2];
    for o in &stats.objs {
        blocks[o.pe as usize] += 1;
    }
    blocks
}

/// Rate-aware balancing on a mixed-speed shape (PE 0 at full speed, PE 1
/// at a tenth, emulated with `+pe-speed`) gives the fast PE more blocks
/// than the slow one, and the result does not change. Where the blocks are
/// is read from the statistics the job dumped at its last step: the
/// placement the earlier steps left. Speeds are measured in wall time, and
/// the emulated slowness spins, so this runs alone, one PE per core: with
/// three PEs on the two cores (PEs 0 and 2 fast, PE 1 slow) and another
/// test's job beside them, CI runs measured a fast PE slower than the slow
/// one sharing its core, leaving [10, 17, 37] and [52, 6, 6].
#[test]
fn rate_aware_balancing_puts_more_blocks_on_faster_pes() {
    let _machine = alone();
    let spec = Spec {
        nx: 512,
        ny: 512,
        bx: 64,
        by: 64,
        iters: 60,
        residual_every: 10,
        lb_every: 0,
        lb_at_start: false,
    };
    let want = format!("{:016x}", reference(&spec));
    let dump = tempfile::tempdir().expect("temp dir");
    let dir = dump.path().to_str().expect("utf-8 path");
    let job = run(
        2,
        1,
        "jacobi2d",
        &[
            "--grid",
            "512",
            "--block",
            "64",
            "--iters",
            "60",
            "--residual-every",
            "10",
            "--lb-every",
            "10",
            "--quiet",
            "+lb",
            "ContiguousRateAware",
            "+lb-dump",
            dir,
            "+pe-speed",
            "1:0.1",
        ],
    );
    job.expect_code(0, "jacobi2d, ContiguousRateAware on PEs of speeds 1, 1/10");
    assert_eq!(job.value("checksum").as_deref(), Some(want.as_str()));
    // Five steps (iterations 10 to 50); the last one's statistics show
    // where steps 1 to 4 put the 64 blocks.
    let blocks = blocks_per_pe(&dumped_step(dump.path(), 5));
    assert_eq!(blocks.iter().sum::<usize>(), 64);
    assert!(
        blocks[1] < blocks[0] && blocks[1] < 64 / 2,
        "blocks per PE {blocks:?}: the tenth-speed PE 1 must hold fewer than the fast PE 0 and than an even share (1 : 1/10 is 58 : 6)"
    );
}

/// `jacobi2d --lb-at-start` balances before the first iteration, with
/// every block counted alike (`Ctx::discount_load`): the first step's
/// statistics hold no load at all, and `ContiguousRateAware` cuts the 64
/// blocks by the PEs' speeds alone (1 : 1/10, emulated with `+pe-speed`),
/// so the next step finds most of them on the fast PE. Alone on the
/// machine for the reason of the test above.
#[test]
fn a_step_before_the_first_iteration_spreads_the_blocks_by_speed() {
    let _machine = alone();
    let spec = Spec {
        nx: 512,
        ny: 512,
        bx: 64,
        by: 64,
        iters: 40,
        residual_every: 10,
        lb_every: 30,
        lb_at_start: true,
    };
    let want = format!("{:016x}", reference(&spec));
    let dump = tempfile::tempdir().expect("temp dir");
    let dir = dump.path().to_str().expect("utf-8 path");
    let job = run(
        2,
        1,
        "jacobi2d",
        &[
            "--grid",
            "512",
            "--block",
            "64",
            "--iters",
            "40",
            "--residual-every",
            "10",
            "--lb-every",
            "30",
            "--lb-at-start",
            "--quiet",
            "+lb",
            "ContiguousRateAware",
            "+lb-dump",
            dir,
            "+pe-speed",
            "1:0.1",
        ],
    );
    job.expect_code(0, "jacobi2d --lb-at-start on PEs of speeds 1, 1/10");
    assert_eq!(job.value("checksum").as_deref(), Some(want.as_str()));
    // Step 1, before the first iteration: nothing measured, the blocks
    // where the block map created them (32 and 32).
    let first = dumped_step(dump.path(), 1);
    assert!(
        first.objs.iter().all(|o| o.load == 0.0),
        "the blocks discounted their load, yet step 1 saw loads"
    );
    assert_eq!(blocks_per_pe(&first), [32, 32], "created by the block map");
    // Step 2 (iteration 30) shows where step 1 put them.
    let blocks = blocks_per_pe(&dumped_step(dump.path(), 2));
    assert_eq!(blocks.iter().sum::<usize>(), 64);
    assert!(
        blocks[1] < 64 / 4,
        "blocks per PE {blocks:?} after the start step: the tenth-speed PE 1 must hold far fewer than an even share (1 : 1/10 is 58 : 6)"
    );
}

/// `ductile run --node-cgroups` puts each launch node into its own group
/// as it spawns it (what `ductile cloud` does for its instances), before
/// its PEs start: a node of 0.5 core and one of 0.25 core report those
/// shares at their first load-balancing step (the step before the first
/// iteration, `--lb-at-start`), never a whole core, and the checksum is the
/// reference's. Needs root and the cgroup v1 `cpu` controller; elsewhere
/// it says why and checks nothing.
#[test]
fn launch_nodes_are_in_their_cgroups_before_their_first_step() {
    let _machine = shared();
    let controller = std::path::Path::new("/sys/fs/cgroup/cpu");
    let groups: Vec<std::path::PathBuf> = (0..2)
        .map(|k| controller.join(format!("ductile-e2e-node-{k}-{}", std::process::id())))
        .collect();
    for g in &groups {
        if let Err(e) = std::fs::create_dir(g) {
            eprintln!(
                "skipped: cannot create a cgroup under {} ({e})",
                controller.display()
            );
            for g in &groups {
                let _ = std::fs::remove_dir(g);
            }
            return;
        }
    }
    let limits = groups
        .iter()
        .zip(["5000", "2500"])
        .try_for_each(|(g, quota)| {
            std::fs::write(g.join("cpu.cfs_period_us"), "10000")?;
            std::fs::write(g.join("cpu.cfs_quota_us"), quota)
        });
    let state = tempfile::tempdir().expect("temp dir");
    let listed = format!("{},{}", groups[0].display(), groups[1].display());
    let job = limits.map(|()| {
        std::process::Command::new(ductile_e2e::bin("ductile"))
            .args([
                "run",
                "--nodes",
                "2",
                "--timeout",
                "120",
                "--node-cgroups",
                &listed,
            ])
            .arg("--state-dir")
            .arg(state.path())
            .arg("--")
            .arg(ductile_e2e::bin("jacobi2d"))
            .args([
                "--grid",
                "256",
                "--block",
                "32",
                "--iters",
                "40",
                "--lb-every",
                "20",
                "--lb-at-start",
            ])
            .args(["--quiet", "+lb", "ContiguousRateAware"])
            .env("DUCTILE_LOG", "ductile::pe::balance=info")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("spawning the job")
    });
    let removed: Vec<_> = groups.iter().map(std::fs::remove_dir).collect();
    let out = job.expect("setting the groups' quotas");
    for r in removed {
        r.expect("removing the test's cgroup");
    }
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "the job failed:\n{stdout}\n{stderr}"
    );
    let spec = Spec {
        nx: 256,
        ny: 256,
        bx: 32,
        by: 32,
        iters: 40,
        residual_every: 10,
        lb_every: 20,
        lb_at_start: true,
    };
    let want = format!("{:016x}", reference(&spec));
    assert_eq!(
        ductile_e2e::last_value(&stdout, "checksum").as_deref(),
        Some(want.as_str())
    );
    for (pe, share) in [(0, "0.500"), (1, "0.250")] {
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains(&format!("pe={pe} share=")))
            .collect();
        assert!(
            !said.is_empty()
                && said
                    .iter()
                    .all(|l| l.contains(&format!("{share} of a core"))),
            "PE {pe} must report {share} of a core from its first step on:\n{stderr}"
        );
    }
}

/// A node in a cgroup with a CFS quota tells the balancer the share of a
/// core each PE gets, read from its own cgroup, not from a timing: the job
/// runs in a fresh group of 0.5 core (two PEs: a quarter each), the
/// node's log says so at its first step, and the checksum is the
/// reference's. The speeds themselves are timings and stay out of the
/// assertion. Needs root and the cgroup v1 `cpu` controller (this
/// machine's); elsewhere it says why and checks nothing.
#[test]
fn a_node_in_a_cpu_quota_sees_its_share_of_a_core() {
    let _machine = shared();
    let controller = std::path::Path::new("/sys/fs/cgroup/cpu");
    let group = controller.join(format!("ductile-e2e-quota-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&group) {
        eprintln!(
            "skipped: cannot create a cgroup under {} ({e})",
            controller.display()
        );
        return;
    }
    let limit = (|| {
        std::fs::write(group.join("cpu.cfs_period_us"), "10000")?;
        std::fs::write(group.join("cpu.cfs_quota_us"), "5000")
    })();
    // Its own state directory: the default one may hold another job.
    let state = tempfile::tempdir().expect("temp dir");
    let job = limit.map(|()| {
        // The shell joins the group, then becomes the launcher: every
        // process of the job starts inside it.
        let launch = format!(
            "echo $$ > {}/cgroup.procs && exec {} run --nodes 1 --pes-per-node 2 --state-dir {} --timeout 120 -- {} --grid 256 --block 32 --iters 40 --lb-every 10 --quiet +lb ContiguousRateAware",
            group.display(),
            ductile_e2e::bin("ductile").display(),
            state.path().display(),
            ductile_e2e::bin("jacobi2d").display(),
        );
        std::process::Command::new("sh")
            .args(["-c", &launch])
            .env("DUCTILE_LOG", "ductile::pe::balance=info")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("spawning the job")
    });
    // The group can go once its processes are gone.
    let removed = std::fs::remove_dir(&group);
    let out = job.expect("setting the group's quota");
    removed.expect("removing the test's cgroup");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "the job failed:\n{stdout}\n{stderr}"
    );
    let spec = Spec {
        nx: 256,
        ny: 256,
        bx: 32,
        by: 32,
        iters: 40,
        residual_every: 10,
        lb_every: 0,
        lb_at_start: false,
    };
    let want = format!("{:016x}", reference(&spec));
    assert_eq!(
        ductile_e2e::last_value(&stdout, "checksum").as_deref(),
        Some(want.as_str())
    );
    for pe in 0..2 {
        let line = format!("pe={pe} share=0.25");
        assert!(
            stderr.lines().any(|l| l.contains(&line)),
            "no `{line}` in the node's log:\n{stderr}"
        );
    }
}
