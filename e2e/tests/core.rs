//! The runtime core, seen from outside: real jobs of real processes over TCP
//! loopback, at every shape in `SHAPES`, checked against sequential
//! computations of the same inputs.

use std::process::{Command, Stdio};
use std::time::Duration;

use ductile_apps::jacobi::{reference, Spec};
use ductile_apps::megatest::{chain_len, readonly_digest, readonly_table, reduce_expectations};
use ductile_e2e::{alive, bin, eventually, run, run_with, SHAPES};

fn megatest(nodes: u32, pes: u32, module: &str, extra: &[&str]) -> ductile_e2e::Job {
    let mut args = vec![module];
    args.extend_from_slice(extra);
    let job = run(nodes, pes, "megatest", &args);
    job.expect_code(0, &format!("megatest {module} at {nodes}x{pes}"));
    assert!(
        job.stdout.contains(&format!("megatest {module} ok")),
        "megatest {module} at {nodes}x{pes}:\n{}",
        job.stdout
    );
    job
}

#[test]
fn arrays_of_every_dimension_are_built_once_and_reachable() {
    for &(n, p) in SHAPES {
        let job = megatest(n, p, "arrays", &[]);
        // 1D, 2D, 3D and custom-index arrays each summed correctly; every PE got elements.
        for i in 0..4 {
            assert_eq!(
                job.value(&format!("array_sum_{i}")).as_deref(),
                Some("ok"),
                "{n}x{p}"
            );
        }
        assert_eq!(
            job.value("pes_used_all").as_deref(),
            Some("true"),
            "{n}x{p}: some PE got no element"
        );
    }
}

#[test]
fn reductions_match_sequential_folds() {
    for &(n, p) in SHAPES {
        for seed in [1u64, 42, 0xDEAD_BEEF] {
            let elems = 7 * n * p + 3;
            let job = megatest(
                n,
                p,
                "reduce",
                &["--seed", &seed.to_string(), "--elems", &elems.to_string()],
            );
            for (key, want) in reduce_expectations(seed, elems as u64) {
                assert_eq!(
                    job.value(&key).as_deref(),
                    Some(want.as_str()),
                    "{key} at {n}x{p}, seed {seed}"
                );
            }
        }
    }
}

#[test]
fn groups_and_nodegroups_have_one_member_per_pe_and_node() {
    for &(n, p) in SHAPES {
        let job = megatest(n, p, "group", &[]);
        let total = n * p;
        let pe_sum: u32 = (0..total).sum();
        let node_sum: u32 = (0..n).sum();
        assert_eq!(
            job.value("group_sum"),
            Some((pe_sum as u64 + 10 * total as u64).to_string()),
            "{n}x{p}"
        );
        assert_eq!(
            job.value("nodegroup_sum"),
            Some((node_sum as u64 + 100 * n as u64).to_string()),
            "{n}x{p}"
        );
        assert_eq!(
            job.value("group_where"),
            Some((total - 1).to_string()),
            "{n}x{p}: member of the last PE"
        );
        assert_eq!(
            job.value("nodegroup_where"),
            Some(((n - 1) * p).to_string()),
            "{n}x{p}: first PE of the last node"
        );
    }
}

#[test]
fn readonly_data_reaches_every_pe_before_any_element_runs() {
    for &(n, p) in SHAPES {
        let elems = 3 * n * p;
        let job = megatest(
            n,
            p,
            "readonly",
            &["--seed", "9", "--elems", &elems.to_string()],
        );
        let digest = readonly_digest(&readonly_table(9), "seed-9");
        assert_eq!(
            job.value("readonly_sum"),
            Some(digest.wrapping_mul(elems as u64).to_string()),
            "{n}x{p}"
        );
    }
}

/// Messages sent to an inserted element before and after its insertion
/// arrive; a broadcast sent right after the insertions reaches every
/// element (also one inserted on PE 0 by main on PE 0, which missed it
/// before 2026-12-07), and one sent before them reaches none.
#[test]
fn dynamic_insertion_delivers_messages_and_broadcasts_sent_after_it() {
    for &(n, p) in SHAPES {
        let elems = 5 * n * p + 1;
        let job = megatest(n, p, "insert", &["--elems", &elems.to_string()]);
        let want: u64 = (0..elems as u64).sum();
        assert_eq!(job.value("insert_sum"), Some(want.to_string()), "{n}x{p}");
    }
}

#[test]
fn priorities_order_queued_messages() {
    for &(n, p) in SHAPES {
        let job = megatest(n, p, "priority", &["--seed", "5"]);
        let ordered = job
            .stdout
            .lines()
            .filter(|l| *l == "priority_ordered=true")
            .count();
        assert_eq!(
            ordered as u32,
            n * p,
            "{n}x{p}: every PE's element saw its messages in priority order\n{}",
            job.stdout
        );
    }
}

#[test]
fn quiescence_is_detected_only_after_every_message_ran() {
    for &(n, p) in SHAPES {
        for seed in [3u64, 17] {
            let elems = 4 * n * p;
            let job = megatest(
                n,
                p,
                "qd",
                &["--seed", &seed.to_string(), "--elems", &elems.to_string()],
            );
            let want: u64 = (0..elems as u64).map(|i| chain_len(seed, i)).sum();
            assert_eq!(
                job.value("qd_hops"),
                Some(want.to_string()),
                "{n}x{p} seed {seed}: hops counted when quiescence fired"
            );
        }
    }
}

#[test]
fn exit_code_reaches_the_launcher() {
    for &(n, p) in &[(1, 1), (2, 2), (3, 1)] {
        let job = run(n, p, "megatest", &["exit", "--code", "7"]);
        job.expect_code(7, "exit --code 7");
        assert!(job.stdout.contains("megatest exit ok"));
    }
}

#[test]
fn a_panicking_node_ends_the_job_with_its_name_and_leaves_nothing_behind() {
    let job = run(3, 1, "megatest", &["panic", "--pe", "1"]);
    job.expect_code(1, "a node panicked");
    assert!(
        job.stderr.contains("node 1"),
        "the error names node 1:\n{}",
        job.stderr
    );
    assert!(
        job.stderr.contains("101"),
        "the error gives the panic exit code:\n{}",
        job.stderr
    );
    let record = job.record();
    let pids: Vec<u32> = record["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["pid"].as_u64().expect("pid") as u32)
        .collect();
    assert_eq!(pids.len(), 3);
    assert!(
        eventually(Duration::from_secs(5), || pids.iter().all(|&p| !alive(p))),
        "node processes left behind: {pids:?}"
    );
}

#[test]
fn jacobi_checksum_is_identical_across_shapes_and_decompositions() {
    let spec = Spec {
        nx: 96,
        ny: 80,
        bx: 96,
        by: 80,
        iters: 25,
        residual_every: 5,
        lb_every: 0,
        lb_at_start: false,
    };
    let want = format!("{:016x}", reference(&spec));
    for &(n, p) in SHAPES {
        for block in ["96x80", "32x16", "24x40", "13x7"] {
            let job = run(
                n,
                p,
                "jacobi2d",
                &[
                    "--grid",
                    "96x80",
                    "--block",
                    block,
                    "--iters",
                    "25",
                    "--residual-every",
                    "5",
                    "--quiet",
                ],
            );
            job.expect_code(0, &format!("jacobi2d {n}x{p} block {block}"));
            assert_eq!(
                job.value("checksum").as_deref(),
                Some(want.as_str()),
                "{n}x{p}, block {block}"
            );
            assert_eq!(
                job.stdout
                    .lines()
                    .last()
                    .map(|l| l.starts_with("checksum=")),
                Some(true),
                "the checksum is the last line"
            );
        }
    }
}

/// Messages on different paths overtake each other: with one block per
/// node and random link delays, a block's ghosts often arrive before its
/// `Start` (which travels down the broadcast tree). Jacobi2D and lbbench
/// once swept on those early ghosts without sending their own first, and
/// hung (3 runs in 10 at this shape). Each run must finish, with the
/// checksum of the sequential reference.
#[test]
fn messages_that_overtake_the_start_broadcast_are_held_not_lost() {
    let spec = Spec {
        nx: 48,
        ny: 48,
        bx: 16,
        by: 16,
        iters: 2,
        residual_every: 0,
        lb_every: 0,
        lb_at_start: false,
    };
    let want = format!("{:016x}", reference(&spec));
    for run_no in 0..6 {
        let job = run_with(
            9,
            1,
            "jacobi2d",
            &[
                "--grid",
                "48",
                "--block",
                "16",
                "--iters",
                "2",
                "--residual-every",
                "0",
                "--quiet",
                "+link-delay-us",
                "5000",
            ],
            &["--timeout", "30"],
        );
        job.expect_code(0, &format!("jacobi2d with link delays, run {run_no}"));
        assert_eq!(
            job.value("checksum").as_deref(),
            Some(want.as_str()),
            "run {run_no}"
        );
    }
    let lbbench = ["--per-pe", "1", "--iters", "3", "--work-us", "10"];
    let calm = run(8, 1, "lbbench", &lbbench);
    calm.expect_code(0, "lbbench without link delays");
    let want = calm.value("checksum").expect("lbbench prints its checksum");
    for run_no in 0..3 {
        let args: Vec<&str> = lbbench
            .iter()
            .copied()
            .chain(["+link-delay-us", "5000"])
            .collect();
        let job = run_with(8, 1, "lbbench", &args, &["--timeout", "30"]);
        job.expect_code(0, &format!("lbbench with link delays, run {run_no}"));
        assert_eq!(
            job.value("checksum"),
            Some(want.clone()),
            "lbbench run {run_no}"
        );
    }
}

/// The collectives bench program (broadcast + reduction rounds, one element
/// migrating to and fro) completes with every round's sum right, in one
/// process and across two.
#[test]
fn collectives_rounds_and_migrations_complete_same_node_and_cross_node() {
    for (n, p) in [(1, 2), (2, 1)] {
        let job = run(n, p, "collectives", &["--rounds", "200", "--hops", "200"]);
        job.expect_code(0, "collectives");
        assert!(
            job.stdout
                .contains("collectives round pes=2 rounds=200 round_us="),
            "{}",
            job.stdout
        );
        assert!(
            job.stdout.contains("collectives migration hops=200 hop_us="),
            "{}",
            job.stdout
        );
    }
}

/// A payload received from another node is kept by the element it came to
/// (since the frame's own memory when it is the message's one large
/// string) and survives the element's migration right after: each hop of
/// `collectives --carry` checks byte for byte the payload it carried over
/// and the one it just received, and fails the job otherwise.
#[test]
fn a_payload_received_into_chare_memory_survives_a_migration_right_after() {
    for (n, p) in [(2, 1), (1, 2)] {
        let job = run(
            n,
            p,
            "collectives",
            &["--rounds", "1", "--hops", "40", "--carry", "300000"],
        );
        job.expect_code(0, "collectives --carry");
        assert!(
            job.stdout.contains("collectives migration hops=40 hop_us="),
            "{}",
            job.stdout
        );
    }
}

/// The per-size result lines of a pingpong run.
fn pingpong_lines(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("pingpong size="))
        .collect()
}

#[test]
fn pingpong_runs_same_node_and_cross_node() {
    for (n, p) in [(1, 2), (2, 1)] {
        let job = run(
            n,
            p,
            "pingpong",
            &[
                "--sizes",
                "8,65536,1048576",
                "--min-iters",
                "5",
                "--budget-ms",
                "5",
            ],
        );
        job.expect_code(0, "pingpong");
        let lines = pingpong_lines(&job.stdout);
        assert_eq!(lines.len(), 3, "{}", job.stdout);
        assert!(job
            .stdout
            .contains(&format!("pingpong done pes=2 nodes={n}")));
    }
}

/// `pingpong --pairs`: both pairs of 2 nodes x 2 PEs exchange at once and
/// report together; pairs that would share a PE are refused up front.
#[test]
fn pingpong_runs_pairs_at_once_and_refuses_pairs_that_share_a_pe() {
    let args = ["--sizes", "8,65536", "--min-iters", "5", "--budget-ms", "5"];
    let job = run(
        2,
        2,
        "pingpong",
        &[&args[..], &["--peer-pe", "2", "--pairs", "2"]].concat(),
    );
    job.expect_code(0, "pingpong --pairs 2");
    let lines = pingpong_lines(&job.stdout);
    assert_eq!(lines.len(), 2, "{}", job.stdout);
    assert!(
        lines.iter().all(|l| l.contains(" pairs=2 ")),
        "{}",
        job.stdout
    );
    let refused = run(
        2,
        2,
        "pingpong",
        &[&args[..], &["--peer-pe", "2", "--pairs", "3"]].concat(),
    );
    refused.expect_code(2, "pingpong --pairs 3 on 4 PEs");
    assert!(
        refused.stderr.contains("each PE in one pair"),
        "{}",
        refused.stderr
    );
}

/// Two different programs in one job: the second to register is refused by
/// the coordinator because its registry fingerprint differs.
#[test]
fn a_node_running_another_build_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let secret = ductile_coordinator::secret::Secret::generate().to_hex();
    let addr_file = dir.path().join("coord.addr");
    let mut coord = Command::new(bin("ductile"))
        .args([
            "coordinator",
            "--expect",
            "2",
            "--launch-timeout",
            "20",
            "--addr-file",
        ])
        .arg(&addr_file)
        .env("DUCTILE_SECRET", &secret)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("coordinator");
    assert!(
        eventually(Duration::from_secs(10), || addr_file.exists()),
        "coordinator did not start"
    );
    let addr = std::fs::read_to_string(&addr_file)
        .expect("address")
        .trim()
        .to_string();
    let node = |program: &str, args: &[&str], index: u32| {
        Command::new(bin(program))
            .args(args)
            .env("DUCTILE_COORDINATOR", &addr)
            .env("DUCTILE_SECRET", &secret)
            .env("DUCTILE_ROLE", "launch")
            .env("DUCTILE_LAUNCH_INDEX", index.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("node")
    };
    let first = node("megatest", &["arrays"], 0);
    std::thread::sleep(Duration::from_millis(300));
    let second = node("pingpong", &[], 1).wait_with_output().expect("second node");
    assert_eq!(
        second.status.code(),
        Some(2),
        "the mismatched node exits with the startup code"
    );
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("fingerprint"), "the refusal says why:\n{err}");
    let _ = coord.kill();
    let _ = coord.wait();
    let out = first.wait_with_output().expect("first node");
    assert_ne!(
        out.status.code(),
        Some(0),
        "the first node cannot run without its peer"
    );
}

#[test]
fn the_readme_example_runs_as_written() {
    for &(n, p) in SHAPES {
        let job = run(n, p, "counter", &[]);
        job.expect_code(0, "counter");
        assert_eq!(job.stdout.trim(), "total hits: 500", "{n}x{p}");
    }
}

/// A node killed from outside (a vanished host) ends the job with an error
/// naming it; the survivors stop instead of waiting forever.
#[test]
fn a_killed_node_ends_the_job_with_its_name() {
    let state = tempfile::tempdir().expect("temp dir");
    let child = Command::new(bin("ductile"))
        .args([
            "run",
            "--nodes",
            "3",
            "--pes-per-node",
            "1",
            "--timeout",
            "120",
            "--state-dir",
        ])
        .arg(state.path())
        .arg("--")
        .arg(bin("jacobi2d"))
        .args([
            "--grid",
            "256",
            "--block",
            "32",
            "--iters",
            "100000000",
            "--quiet",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ductile run");
    let job_json = state.path().join("job.json");
    let node_pid = |i: usize| -> Option<u32> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&job_json).ok()?).ok()?;
        v["nodes"].as_array()?.get(i)?["pid"]
            .as_u64()
            .map(|p| p as u32)
    };
    assert!(
        eventually(Duration::from_secs(20), || node_pid(2).is_some()),
        "the job never started"
    );
    std::thread::sleep(Duration::from_millis(500));
    let victim = node_pid(1).expect("node 1's pid");
    let killed = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let out = child.wait_with_output().expect("ductile run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("node 1") && err.contains("SIGKILL"),
        "the error names node 1 and the signal:\n{err}"
    );
    let pids: Vec<u32> = (0..3).filter_map(node_pid).collect();
    assert!(
        eventually(Duration::from_secs(5), || pids.iter().all(|&p| !alive(p))),
        "processes left behind: {pids:?}"
    );
}

/// `ductile status` asks a running job's node 0 over its authenticated
/// control endpoint, and says so plainly when no job runs.
#[test]
fn status_reports_the_running_jobs_membership() {
    let state = tempfile::tempdir().expect("temp dir");
    let mut job = Command::new(bin("ductile"))
        .args([
            "run",
            "--nodes",
            "3",
            "--pes-per-node",
            "2",
            "--timeout",
            "120",
            "--state-dir",
        ])
        .arg(state.path())
        .arg("--")
        .arg(bin("jacobi2d"))
        .args([
            "--grid",
            "256",
            "--block",
            "32",
            "--iters",
            "100000000",
            "--quiet",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ductile run");
    let status = || {
        Command::new(bin("ductile"))
            .args(["status", "--json", "--state-dir"])
            .arg(state.path())
            .output()
            .expect("ductile status")
    };
    let mut answer = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            let out = status();
            if out.status.success() {
                answer = serde_json::from_slice::<serde_json::Value>(&out.stdout).ok();
            }
            answer.is_some()
        }),
        "status never answered"
    );
    let s = answer.expect("status");
    assert_eq!(s["epoch"], 1);
    assert_eq!(s["pes"], 6);
    let members = s["members"].as_array().expect("members");
    assert_eq!(members.len(), 3);
    assert!(members
        .iter()
        .enumerate()
        .all(|(i, m)| m["node"] == i && m["pes"] == 2));
    let _ = Command::new("kill").arg(job.id().to_string()).status();
    let _ = job.wait();
    // An ended job's status says how it ended (docs/cli.md, `ductile status`).
    let out = status();
    assert_eq!(out.status.code(), Some(0));
    let ended: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(ended["running"], false, "{ended}");
}
