//! Faults in the middle of a rescale, with real processes (issue 15): a
//! departing node killed after it was told to leave, a newcomer killed while
//! it integrates, the coordinator killed while node 0 commits, and a
//! departing node's network cut (its link down, in a network namespace).
//! Each must end cleanly — the job goes on at a size it reports, or fails
//! with an error naming the node — within a bounded time, and never with a
//! checksum other than an uninterrupted run's.
//!
//! The moments are found, not slept for. A rescale's stop stage (both
//! drains and the hand-over) lasts about half a millisecond, too short to
//! hit from outside, so a test holds the rescale at the commit instead:
//!
//! 1. a surviving node is stopped (SIGSTOP) before the request, so the
//!    evacuate stage waits for its load statistics;
//! 2. once PE 0 logs `rescale requested`, the coordinator is stopped too;
//! 3. the survivor is continued: evacuate, the drains and the hand-over run,
//!    and node 0's first question to the (stopped) coordinator sits unread
//!    in the coordinator's receive queue (read from `/proc/net/tcp`), which
//!    is how the test knows every node is past the hand-over and node 0 is
//!    in the commit.
//!
//! Every wait is bounded; a job still running past its bound is a failure
//! ("hung"), never a pass.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use ductile_coordinator::control::RescaleRequest;
use ductile_coordinator::Secret;
use ductile_e2e::background::{Background, Finished, WAIT};
use ductile_e2e::{alive, eventually, reference_checksum, signal};
use serde_json::Value;

/// The stage bound every node of these jobs gets: a stalled step fails in
/// seconds, so a test that finds a stall ends quickly.
const STAGE_BOUND_MS: &str = "4000";

/// What the nodes log for these tests: PE 0's `rescale requested` (the
/// one line a test waits for), the driver's and the PEs' rescale steps
/// (for the failure messages).
const LOG: &str =
    "warn,ductile::rescale=debug,ductile::pe::rescale=debug,ductile::pe::reentry=debug";

/// Iterations long enough for a hold and its aftermath (a few seconds of
/// rescaling) before the job ends.
const ITERS: u32 = 40_000;

/// `jacobi2d spec` on `nodes` x 1 PE, each node run through `prefix` (a
/// wrapper) when given, with `flags` for `ductile run`, the stage bound and
/// the log these tests read.
fn start(
    state: tempfile::TempDir,
    nodes: u32,
    spec: &[String],
    prefix: Option<&Path>,
    flags: &[&str],
) -> Background {
    let mut launch = Background::launch(nodes, "jacobi2d", spec)
        .state(state)
        .timeout_s(120)
        .flags(flags)
        .env("DUCTILE_LOG", LOG)
        .env("DUCTILE_RESCALE_STAGE_TIMEOUT_MS", STAGE_BOUND_MS);
    if let Some(wrapper) = prefix {
        launch = launch.prefix(wrapper);
    }
    launch.start()
}

/// `ductile ARGS` against the job in the background, bounded like a test's
/// own waits (`--timeout 60`).
fn spawn_tool(job: &Background, args: &[&str]) -> Child {
    job.spawn_ductile(&[args, &["--timeout", "60"]].concat())
}

/// Waits at most `limit` for a tool to end; its code and stderr.
fn tool_result(mut tool: Child, limit: Duration) -> (Option<i32>, String, String) {
    let end = Instant::now() + limit;
    loop {
        if tool.try_wait().expect("try_wait").is_some() {
            break;
        }
        if Instant::now() >= end {
            let _ = tool.kill();
            let out = tool.wait_with_output().expect("tool output");
            panic!(
                "the tool hung past {limit:?}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = tool.wait_with_output().expect("tool output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Bytes waiting unread in the receive queues of the established TCP
/// connections whose local port is `port` (this network namespace's
/// `/proc/net/tcp`).
fn unread_at(port: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let want = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let (local, state, queues) = (cols.get(1)?, cols.get(3)?, cols.get(4)?);
            (local.ends_with(&want) && *state == "01").then_some(())?;
            u64::from_str_radix(queues.split(':').nth(1)?, 16).ok()
        })
        .sum()
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr}"))
}

/// A rescale held at its commit (see the module docs).
struct Held {
    /// The coordinator (stopped).
    coordinator: u32,
    /// The tool that asked for the rescale.
    tool: Child,
}

/// Starts `ductile ARGS` (a rescale) and holds it at the commit: every node
/// is past the hand-over and node 0 waits for the stopped coordinator.
/// `survivor` is a node that stays (not node 0).
fn hold_at_commit(job: &Background, args: &[&str], survivor: u32) -> Held {
    let (coordinator, addr) = job.coordinator();
    let port = port_of(&addr);
    assert_eq!(
        unread_at(port),
        0,
        "the coordinator has unread bytes already"
    );
    signal(survivor, "-STOP");
    let tool = spawn_tool(job, args);
    job.wait_for_log("rescale requested", 1);
    signal(coordinator, "-STOP");
    signal(survivor, "-CONT");
    assert!(
        eventually(WAIT, || unread_at(port) > 0),
        "node 0 never asked the coordinator (the rescale did not reach its commit)\n{}",
        job.stderr()
    );
    Held { coordinator, tool }
}

/// Starts a newcomer outside the launcher and waits until it registered;
/// its pid.
fn registered_newcomer(job: &Background) -> u32 {
    let newcomer = job.spawn_newcomer();
    assert!(
        eventually(WAIT, || job
            .try_status()
            .is_some_and(|s| s.pending.iter().any(|p| p.pid == newcomer))),
        "the newcomer never registered\n{}",
        job.stderr()
    );
    newcomer
}

/// Asks the job, from a thread, for a rescale that admits one newcomer;
/// the thread ends with the answer (an error as its message).
fn admit_one(job: &Background) -> std::thread::JoinHandle<Result<(), String>> {
    let mut control = job.control();
    let epoch = control.status().expect("status").epoch;
    std::thread::spawn(move || {
        let request = RescaleRequest {
            epoch,
            remove: vec![],
            admit: 1,
        };
        control
            .rescale(request, WAIT)
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
}

/// Every pid in `pids` has ended.
fn all_gone(pids: &[u32]) -> bool {
    eventually(Duration::from_secs(10), || pids.iter().all(|&p| !alive(p)))
}

/// A departing node is killed (SIGKILL) after it was told to leave: it
/// stopped, drained and handed its PE's work to PE 0, and waits for the
/// commit that removes it. The job fails, naming the node and its signal,
/// within a bounded time (a node killed by a signal fails the job at any
/// time, docs/cli.md); no process is left; no checksum is printed. The
/// tool says what happened to its rescale: either it failed, or (when
/// node 0's commit won the race with the loss) it was committed, and then
/// the report names node 3 as removed.
#[test]
fn a_departing_node_killed_after_its_hand_over_fails_the_job_naming_it() {
    let spec = ductile_e2e::jacobi_args(ITERS);
    let job = start(tempfile::tempdir().expect("temp dir"), 4, &spec, None, &[]);
    let members = job.members();
    let pids: Vec<u32> = members.iter().map(|m| m.pid).collect();
    let held = hold_at_commit(&job, &["shrink", "--remove", "3"], pids[1]);
    signal(pids[3], "-KILL");
    signal(held.coordinator, "-CONT");
    let (tool_code, tool_out, tool_err) = tool_result(held.tool, WAIT);
    let end = job.finish_within(WAIT);
    assert_eq!(
        end.code,
        Some(1),
        "the job must fail\n{}\n{}",
        end.stdout,
        end.stderr
    );
    end.failed_naming(
        &format!("node 3 (pid {}) was killed by signal 9", pids[3]),
        "the failure does not name the killed node",
    );
    if tool_code == Some(0) {
        let report: Value = serde_json::from_str(&tool_out).expect("JSON report");
        assert_eq!(
            report["removed"],
            serde_json::json!([3]),
            "the tool reported a rescale that did not happen\n{tool_out}\n{tool_err}"
        );
    }
    assert!(all_gone(&pids), "processes of the job are left: {pids:?}");
}

/// The coordinator is killed (SIGKILL) while node 0 commits: node 0's
/// question sits unread when it dies. The launcher restarts it, node 0
/// restores it with the view it left, the other nodes reattach; node 0,
/// whose commit lost its connection, asks the restored coordinator's view,
/// finds nothing committed and commits again: the rescale completes (node
/// 3 leaves, the tool gets its report) and the job finishes with the
/// checksum of an uninterrupted run.
#[test]
fn the_coordinator_killed_in_the_commit_leaves_the_job_whole() {
    let spec = ductile_e2e::jacobi_args(ITERS);
    let want = reference_checksum(&spec);
    let job = start(tempfile::tempdir().expect("temp dir"), 4, &spec, None, &[]);
    let members = job.members();
    let pids: Vec<u32> = members.iter().map(|m| m.pid).collect();
    let held = hold_at_commit(&job, &["shrink", "--remove", "3"], pids[1]);
    signal(held.coordinator, "-KILL");
    assert!(
        eventually(WAIT, || job.coordinator().0 != held.coordinator),
        "the launcher did not restart the coordinator\n{}",
        job.stderr()
    );
    let (tool_code, tool_out, tool_err) = tool_result(held.tool, WAIT);
    assert_eq!(
        tool_code,
        Some(0),
        "the rescale did not complete\n{tool_out}\n{tool_err}\n--- job\n{}",
        job.stderr()
    );
    let report: Value = serde_json::from_str(&tool_out).expect("JSON report");
    assert_eq!(report["removed"], serde_json::json!([3]), "{report}");
    let status = job.control().status().expect("status after the restart");
    let now: Vec<u32> = status.members.iter().map(|m| m.pid).collect();
    assert_eq!(now, pids[..3], "the rescale completed: node 3 left");
    assert!(
        eventually(WAIT, || !alive(pids[3])),
        "node 3 was removed but runs"
    );
    let log = job.stderr();
    assert!(
        log.contains(
            "nothing was committed before the coordinator connection ended; committing again"
        ),
        "node 0 did not learn the commit's outcome from the restored coordinator\n{log}"
    );
    assert!(
        !log.contains("refused the commit"),
        "a lost connection reported as a refusal\n{log}"
    );
    // The job is sound: a rescale works after the restart.
    let again = spawn_tool(&job, &["shrink", "--nodes", "1"]);
    let (again_code, again_out, again_err) = tool_result(again, WAIT);
    assert_eq!(
        again_code,
        Some(0),
        "a rescale after the restart failed\n{again_out}\n{again_err}\n--- job\n{}",
        job.stderr()
    );
    let Finished {
        code,
        stdout,
        stderr,
        ..
    } = job.finish_within(Duration::from_secs(120));
    assert_eq!(code, Some(0), "the job failed\n{stdout}\n{stderr}");
    assert_eq!(
        ductile_e2e::last_value(&stdout, "checksum").as_deref(),
        Some(want.as_str()),
        "checksum changed"
    );
}

/// A newcomer is killed (SIGKILL) while it integrates: it registered and
/// was held (SIGSTOP) before the request, so the commit admits it, the
/// coordinator's `Integrate` waits unread in its socket and the survivors'
/// reconciliation waits for it. Killed there, it fails the job, named,
/// within the stage bound: the survivors cannot go on without a member
/// of the committed view. The tool gets an error; no checksum; nothing left.
#[test]
fn a_newcomer_killed_while_it_integrates_fails_the_job_naming_it() {
    let spec = ductile_e2e::jacobi_args(ITERS);
    let job = start(tempfile::tempdir().expect("temp dir"), 3, &spec, None, &[]);
    let pids: Vec<u32> = job.members().iter().map(|m| m.pid).collect();
    let newcomer = registered_newcomer(&job);
    signal(newcomer, "-STOP");
    let asked = admit_one(&job);
    // Committed: the coordinator's view lists the held newcomer (node 0's
    // status still shows the view it has installed).
    let (_, addr) = job.coordinator();
    let secret = Secret::from_hex(&job.read("secret")).expect("secret");
    let coordinator = ductile_coordinator::Client::connect(&addr, &secret, WAIT)
        .expect("a tool connection to the coordinator");
    assert!(
        eventually(WAIT, || coordinator.query_view(WAIT).is_ok_and(
            |(view, _)| view.is_some_and(|v| v.members.iter().any(|m| m.pid == newcomer))
        )),
        "the held newcomer was never committed\n{}",
        job.stderr()
    );
    signal(newcomer, "-KILL");
    let answer = asked.join().expect("the request's thread");
    let end = job.finish_within(WAIT);
    assert_eq!(
        end.code,
        Some(1),
        "the job must fail\n{}\n{}",
        end.stdout,
        end.stderr
    );
    end.failed_naming(
        &format!("(pid {newcomer}) was killed by signal 9"),
        "the failure does not name the newcomer",
    );
    let err = answer.expect_err("the request reported a rescale of a failed job");
    assert!(!err.is_empty());
    assert!(all_gone(&pids), "processes of the job are left: {pids:?}");
}

/// With fault tolerance (`+ft-every`), a surviving node killed (SIGKILL)
/// while a rescale waits on the coordinator does not end the job. The
/// rescale (admitting a waiting newcomer) is held at node 0's question for
/// newcomers, every node past its hand-over; node 2 is killed; the
/// coordinator goes on. It refuses any commit that keeps the dead node, so
/// node 0 abandons the rescale for a recovery and tells every node: the job
/// rolls back to its last buddy checkpoint without node 2, the newcomer
/// joins in the recovery's commit, the survivors keep their processes and
/// the job ends with the checksum of an uninterrupted run. The request is
/// answered as abandoned.
#[test]
fn a_survivor_killed_in_a_rescale_under_ft_every_is_recovered_from_live() {
    let mut spec = ductile_e2e::jacobi_args(ITERS);
    spec.extend(["--lb-every".to_owned(), "10".to_owned()]);
    let want = reference_checksum(&spec);
    spec.extend(["+ft-every".to_owned(), "2".to_owned()]);
    let job = Background::launch(4, "jacobi2d", &spec)
        .state(tempfile::tempdir().expect("temp dir"))
        .timeout_s(120)
        .env("DUCTILE_LOG", &format!("{LOG},ductile::pe::buddy=info"))
        .env("DUCTILE_RESCALE_STAGE_TIMEOUT_MS", STAGE_BOUND_MS)
        .start();
    let pids: Vec<u32> = job.members().iter().map(|m| m.pid).collect();
    job.wait_for_log("ft checkpoint=0 ", 1);
    let newcomer = registered_newcomer(&job);
    // Held: node 1 stopped, the evacuate stage waits for it; the
    // coordinator stopped once the request is in; node 1 goes on, and
    // node 0 reaches its question to the stopped coordinator.
    let (coordinator, _) = job.coordinator();
    signal(pids[1], "-STOP");
    let asked = admit_one(&job);
    job.wait_for_log("rescale requested", 1);
    signal(coordinator, "-STOP");
    signal(pids[1], "-CONT");
    job.wait_for_log("asking the coordinator how many newcomers wait", 1);
    signal(pids[2], "-KILL");
    // `kill` returns before the victim's sockets are closed: continued at
    // once, the coordinator could answer node 0 and make its commit before
    // it reads node 2's end. That commit (with node 2) is recovered from
    // in the view it made (the driver's tests); this test is about the
    // rescale abandoned before its commit.
    assert!(all_gone(&[pids[2]]), "node 2 outlived SIGKILL");
    signal(coordinator, "-CONT");
    let answer = asked.join().expect("the request's thread");
    let err = answer.expect_err("the rescale was abandoned, not made");
    assert!(
        err.contains("abandoned before its commit: a node was lost without notice"),
        "{err}\n{}",
        job.stderr()
    );
    job.wait_for_log("recovered from the loss of node 2", 1);
    let members = [pids[0], pids[1], pids[3], newcomer];
    assert!(
        eventually(WAIT, || job.try_status().is_some_and(|s| s
            .members
            .iter()
            .map(|m| m.pid)
            .eq(members))),
        "the survivors and the newcomer are not the members\n{}",
        job.stderr()
    );
    let Finished {
        code,
        stdout,
        stderr,
        ..
    } = job.finish_within(Duration::from_secs(120));
    assert_eq!(code, Some(0), "the job failed\n{stdout}\n{stderr}");
    assert_eq!(
        ductile_e2e::last_value(&stdout, "checksum").as_deref(),
        Some(want.as_str()),
        "checksum changed\n{stderr}"
    );
    assert!(all_gone(&members), "processes of the job are left");
}

/// With fault tolerance, a surviving node that hangs (SIGSTOP) after the
/// commit, before the new view's barrier, does not end the job. The shrink
/// (node 3 leaves) is held at node 0's commit, node 1 is stopped, the
/// coordinator goes on and makes the commit (node 1 still has its
/// connection). The barrier cannot complete without node 1; once the
/// coordinator declares it lost (the heartbeat timeout, 3 s here), node 0
/// resumes without the barrier and recovers in the new view, telling every
/// node to do the same: the job rolls back to its last buddy checkpoint on
/// nodes 0 and 2 (node 1's copy is on node 2; node 2's was on node 3, which
/// left, but node 2 restores its own), the
/// launcher fences the stopped node, and the job ends with the checksum of
/// an uninterrupted run. The shrink itself completed (its report came
/// when PE 0 re-entered, before the recovery stopped the PEs).
#[test]
fn a_survivor_hung_after_the_commit_under_ft_every_is_recovered_from_in_the_new_view() {
    let mut spec = ductile_e2e::jacobi_args(ITERS);
    spec.extend(["--lb-every".to_owned(), "10".to_owned()]);
    let want = reference_checksum(&spec);
    spec.extend(["+ft-every".to_owned(), "2".to_owned()]);
    let job = Background::launch(4, "jacobi2d", &spec)
        .state(tempfile::tempdir().expect("temp dir"))
        .timeout_s(120)
        .flags(&["--heartbeat-timeout", "3", "--exit-grace", "2"])
        .env("DUCTILE_LOG", &format!("{LOG},ductile::pe::buddy=info"))
        // The barrier waits out the heartbeat timeout.
        .env("DUCTILE_RESCALE_STAGE_TIMEOUT_MS", "20000")
        .start();
    let pids: Vec<u32> = job.members().iter().map(|m| m.pid).collect();
    job.wait_for_log("ft checkpoint=0 ", 1);
    let (coordinator, _) = job.coordinator();
    signal(pids[2], "-STOP");
    let tool = spawn_tool(&job, &["shrink", "--remove", "3"]);
    job.wait_for_log("rescale requested", 1);
    signal(coordinator, "-STOP");
    signal(pids[2], "-CONT");
    job.wait_for_log("asking the coordinator to commit", 1);
    signal(pids[1], "-STOP");
    signal(coordinator, "-CONT");
    // A shrink is complete once PE 0 re-entered: node 0 resumes without
    // the barrier, so the report comes, and the recovery follows.
    let (code, out, err) = tool_result(tool, WAIT);
    assert_eq!(code, Some(0), "{out}\n{err}\n{}", job.stderr());
    let report: Value = serde_json::from_str(&out).expect("JSON report");
    assert_eq!(report["removed"], serde_json::json!([3]), "{report}");
    job.wait_for_log("recovered from the loss of node 1", 1);
    let Finished {
        code,
        stdout,
        stderr,
        ..
    } = job.finish_within(Duration::from_secs(120));
    assert_eq!(code, Some(0), "the job failed\n{stdout}\n{stderr}");
    assert_eq!(
        ductile_e2e::last_value(&stdout, "checksum").as_deref(),
        Some(want.as_str()),
        "checksum changed\n{stderr}"
    );
    assert!(all_gone(&pids), "processes of the job are left: {pids:?}");
}

/// A departing node loses its network (its veth link taken down, as a
/// reclaimed instance does) after it handed over, before the commit that
/// removes it. The commit goes ahead without it; the survivors carry on at
/// the new size, the job ends with the reference checksum, and the cut-off
/// node does not hang the job. Nodes 1-3 run in network namespaces of their
/// own (`ductile_operator::cloud::netns`, as `network: namespaces` does).
///
/// The cut-off node never gets its `Die`, fails its wait after the stage
/// bound and exits 3; the launcher judges that exit by the view asked for
/// after it, where the node is no longer a member, so the job goes on
/// (issue 15; before, it stopped the healthy job).
#[test]
fn a_departing_node_cut_off_before_its_commit_leaves_the_job_whole() {
    let Some(mut nj) = NetnsJob::start("rescale-faults-netns") else {
        return;
    };
    let pids = nj.pids.clone();
    let held = hold_at_commit(nj.job(), &["shrink", "--remove", "3"], pids[1]);
    assert_eq!(nj.net.cut(&nj.instance(3)).ok(), Some(true));
    signal(held.coordinator, "-CONT");
    let (tool_code, tool_out, tool_err) = tool_result(held.tool, WAIT);
    assert_eq!(
        tool_code,
        Some(0),
        "the shrink failed\n{tool_out}\n{tool_err}\n--- job\n{}",
        nj.job().stderr()
    );
    let report: Value = serde_json::from_str(&tool_out).expect("JSON report");
    assert_eq!(report["removed"], serde_json::json!([3]), "{report}");
    let now: Vec<u32> = nj.job().members().iter().map(|m| m.pid).collect();
    assert_eq!(now, pids[..3]);
    let job = nj.job.take().expect("the job");
    let Finished {
        code,
        stdout,
        stderr,
        ..
    } = job.finish_within(Duration::from_secs(120));
    assert_eq!(code, Some(0), "the job failed\n{stdout}\n{stderr}");
    assert_eq!(
        ductile_e2e::last_value(&stdout, "checksum").as_deref(),
        Some(nj.want.as_str()),
        "checksum changed"
    );
    assert!(all_gone(&pids), "processes of the job are left: {pids:?}");
    nj.finish();
}

/// A surviving node loses its network (link down) while the rescale is
/// held at the commit: the commit goes ahead, and the other nodes' barrier
/// over the new view cannot reach it. The job fails within the stage bound,
/// node 0 naming the stage, and nothing is left running; no checksum.
#[test]
fn a_survivor_cut_off_in_a_rescale_fails_the_job_within_the_bound_naming_the_stage() {
    let Some(mut nj) = NetnsJob::start("rescale-faults-cut2") else {
        return;
    };
    let pids = nj.pids.clone();
    let held = hold_at_commit(nj.job(), &["shrink", "--remove", "3"], pids[1]);
    assert_eq!(nj.net.cut(&nj.instance(2)).ok(), Some(true));
    signal(held.coordinator, "-CONT");
    let (tool_code, tool_out, tool_err) = tool_result(held.tool, WAIT);
    let job = nj.job.take().expect("the job");
    let end = job.finish_within(WAIT);
    assert_ne!(
        end.code,
        Some(0),
        "the job must fail\n{}\n{}",
        end.stdout,
        end.stderr
    );
    end.failed_naming(
        "rescale failed in stage reconcile",
        "node 0 does not name the stage",
    );
    assert_ne!(
        tool_code,
        Some(0),
        "the tool reported a rescale of a failed job\n{tool_out}\n{tool_err}"
    );
    // The cut-off node is stopped by the launcher too.
    assert!(all_gone(&pids), "processes of the job are left: {pids:?}");
    nj.finish();
}

/// A 4-node job whose nodes 1-3 run in network namespaces of their own on
/// the bridge at 10.200.0.1 (node 0, its control endpoint and the
/// coordinator stay in the root namespace, as with `network: namespaces`).
struct NetnsJob {
    name: &'static str,
    net: ductile_operator::cloud::netns::Network,
    job: Option<Background>,
    pids: Vec<u32>,
    want: String,
}

impl NetnsJob {
    /// `None` (with the reason printed) where namespaces cannot be used.
    fn start(name: &'static str) -> Option<NetnsJob> {
        use ductile_operator::cloud::netns;
        if let Err(why) = netns::available() {
            eprintln!("skipped: {why}");
            return None;
        }
        if std::env::var("DUCTILE_TRANSPORT").as_deref() == Ok("ucx") {
            // scripts/test-ucx pins UCX to `lo`, which is each namespace's own.
            eprintln!("skipped: network namespaces are tested over TCP (UCX here is pinned to lo)");
            return None;
        }
        let spec = ductile_e2e::jacobi_args(ITERS);
        let want = reference_checksum(&spec);
        let state = tempfile::tempdir().expect("temp dir");
        // 10.200.0.0/16 serves one job at a time: wait (bounded) while
        // another test (e2e/tests/cloud.rs) holds it.
        let mut made = netns::Network::create(name, state.path());
        let end = Instant::now() + Duration::from_secs(180);
        while matches!(&made, Err(e) if e.to_string().contains("is already on interface"))
            && Instant::now() < end
        {
            std::thread::sleep(Duration::from_millis(500));
            made = netns::Network::create(name, state.path());
        }
        let mut net = made.unwrap_or_else(|e| panic!("cannot make the job's network: {e}"));
        for index in 1..4u32 {
            let instance = format!("{name}-{index}");
            net.add(&instance).expect("a namespace");
            net.assign_launch(index, &instance).expect("assigning it");
        }
        let wrapper = net.wrapper().to_owned();
        let bind = netns::BRIDGE_ADDR.to_string();
        let job = start(state, 4, &spec, Some(&wrapper), &["--bind", &bind]);
        let pids: Vec<u32> = job.members().iter().map(|m| m.pid).collect();
        for (index, pid) in pids.iter().enumerate().skip(1) {
            let instance = format!("{name}-{index}");
            assert_eq!(
                net.runs_in(*pid, &instance),
                Some(true),
                "node {index} not in {instance}"
            );
        }
        Some(NetnsJob {
            name,
            net,
            job: Some(job),
            pids,
            want,
        })
    }

    fn job(&self) -> &Background {
        self.job.as_ref().expect("the job runs")
    }

    fn instance(&self, index: u32) -> String {
        format!("{}-{index}", self.name)
    }

    /// Removes the network and checks nothing of it is left.
    fn finish(self) {
        let name = self.name;
        drop(self.job);
        drop(self.net);
        assert!(
            ductile_operator::cloud::netns::remaining(name).is_empty(),
            "the job's network is left"
        );
    }
}
