//! Nodes lost without notice under `+ft-every` (issue 20; docs/elasticity.md,
//! "Node loss without notice"): real `ductile run` jobs whose node processes
//! are SIGKILLed. A recovered job ends with the checksum of an uninterrupted
//! run and its survivors keep their processes; a loss that no checkpoint
//! covers ends the job with an error that says why, never a hang or a
//! wrong result. The single-loss case, with metrics, is
//! `cli.rs::a_node_killed_without_notice_under_ft_every_is_recovered_from_with_the_same_checksum`.

use std::time::Duration;

use ductile_e2e::background::{Background, WAIT};
use ductile_e2e::{alive, eventually, jacobi_args, reference_checksum, signal};

/// Jacobi2D with a sync point every 10 iterations, and its checksum.
fn spec(iters: u32, extra: &[&str]) -> (Vec<String>, String) {
    let mut plain = jacobi_args(iters);
    plain.extend(["--lb-every".to_owned(), "10".to_owned()]);
    let want = reference_checksum(&plain);
    let mut spec = plain;
    spec.extend(extra.iter().map(|s| s.to_string()));
    (spec, want)
}

fn pids(job: &Background) -> Vec<u32> {
    job.members().iter().map(|m| m.pid).collect()
}

/// Waits until the view no longer lists `gone`; the members then.
fn view_without(job: &Background, gone: u32) -> Vec<u32> {
    assert!(
        eventually(WAIT, || job
            .try_status()
            .is_some_and(|s| !s.members.iter().any(|m| m.pid == gone))),
        "no view without pid {gone}\n{}",
        job.stderr()
    );
    pids(job)
}

/// A 3-node Jacobi2D job under `+ft-every 2` and a 3 s heartbeat timeout
/// (and `flags`) whose node 2 is SIGSTOPped 2 s in; returns once the job
/// recovered without it, with the launch pids (the survivors' unchanged)
/// and the uninterrupted run's checksum.
fn hang_node_2(flags: &[&str]) -> (Background, Vec<u32>, String) {
    let (spec, want) = spec(40_000, &["+ft-every", "2"]);
    let mut all = vec!["--heartbeat-timeout", "3"];
    all.extend_from_slice(flags);
    let job = Background::launch(3, "jacobi2d", &spec)
        .flags(&all)
        .timeout_s(240)
        .start();
    let start = pids(&job);
    std::thread::sleep(Duration::from_secs(2));
    signal(start[2], "-STOP");
    let after = view_without(&job, start[2]);
    assert_eq!(
        after,
        [start[0], start[1]],
        "survivors keep their processes"
    );
    recoveries(&job, 1);
    (job, start, want)
}

/// Waits until node 0 has logged `n` recoveries (a warning: seen under
/// the default log filter).
fn recoveries(job: &Background, n: usize) {
    job.wait_for_log("recovered from the loss of node", n);
}

#[test]
fn two_losses_in_a_row_are_each_recovered_and_the_checksum_holds() {
    let (spec, want) = spec(60_000, &["+ft-every", "2"]);
    let job = Background::launch(4, "jacobi2d", &spec)
        .timeout_s(240)
        .start();
    let start = pids(&job);
    std::thread::sleep(Duration::from_secs(2));
    signal(start[2], "-9");
    let after = view_without(&job, start[2]);
    assert_eq!(
        after,
        [start[0], start[1], start[3]],
        "survivors keep their processes"
    );
    recoveries(&job, 1);
    // The next checkpoint is taken in the new view; the second loss is
    // that of the node that held the first one's copies.
    std::thread::sleep(Duration::from_secs(1));
    signal(start[1], "-9");
    let after = view_without(&job, start[1]);
    assert_eq!(after, [start[0], start[3]]);
    recoveries(&job, 2);
    let done = job.finish();
    done.completes_with(&want);
    assert!(
        alive_none(&[start[0], start[3]]),
        "the job's processes ended"
    );
}

/// Registers a newcomer outside the launcher, SIGKILLs node 2 two seconds
/// in and waits until the recovery admitted the newcomer in its place;
/// the launch pids and the members after.
fn lose_node_2_with_a_newcomer_waiting(job: &mut Background) -> (Vec<u32>, Vec<u32>) {
    let start = pids(job);
    job.start_strays(1);
    std::thread::sleep(Duration::from_secs(2));
    signal(start[2], "-9");
    let after = view_without(job, start[2]);
    assert_eq!(after.len(), 3, "the newcomer took the lost node's place");
    job.wait_for_log("with 1 waiting newcomer admitted", 1);
    (start, after)
}

/// A replacement that registered before a node was lost without notice
/// (here a newcomer started outside the launcher, as a policy's
/// replacement would be) joins in the recovery's commit: the job goes on
/// with as many nodes as before, and the same checksum.
#[test]
fn a_newcomer_waiting_when_a_node_is_lost_joins_in_the_recovery() {
    let (spec, want) = spec(40_000, &["+ft-every", "2"]);
    let mut job = Background::launch(3, "jacobi2d", &spec)
        .timeout_s(240)
        .start();
    let (start, after) = lose_node_2_with_a_newcomer_waiting(&mut job);
    assert_eq!(after[..2], start[..2], "survivors keep their processes");
    assert!(
        job.control().status().expect("status").pending.is_empty(),
        "nobody is left waiting"
    );
    job.finish().completes_with(&want);
}

/// The same with groups and nodegroups (`elastic_probe`, 2 PEs per node):
/// the admitted newcomer's members are counted into the reductions, so
/// every round after the recovery sees exactly the new view's members.
#[test]
fn a_newcomer_admitted_by_a_recovery_joins_the_group_and_nodegroup_reductions() {
    let args = [
        "--rounds",
        "200000",
        "--sync-every",
        "100",
        "+ft-every",
        "1",
    ];
    let mut job = Background::launch(3, "elastic_probe", &args)
        .pes(2)
        .timeout_s(240)
        .start();
    lose_node_2_with_a_newcomer_waiting(&mut job);
    probe_ok(job);
}

/// Ends an `elastic_probe` job: it exits 0 having checked every round.
fn probe_ok(job: Background) {
    let done = job.finish();
    assert_eq!(done.code, Some(0), "{}\n{}", done.stdout, done.stderr);
    assert!(
        done.stdout.lines().any(|l| l.starts_with("probe ok")),
        "{}\n{}",
        done.stdout,
        done.stderr
    );
}

fn alive_none(pids: &[u32]) -> bool {
    eventually(Duration::from_secs(10), || pids.iter().all(|&p| !alive(p)))
}

/// Kills at moments the test does not choose, with a checkpoint at every
/// sync point (so a good share of them land while one is taken: the
/// recovery line says when, `interrupted_checkpoint`).
#[test]
fn losses_at_arbitrary_moments_including_during_checkpoints_keep_the_checksum() {
    let (spec, want) = spec(20_000, &["+ft-every", "1"]);
    let mut interrupted = 0;
    for (i, wait_ms) in [700u64, 1_130, 1_570].into_iter().enumerate() {
        let job = Background::launch(3, "jacobi2d", &spec)
            .timeout_s(240)
            .start();
        let start = pids(&job);
        std::thread::sleep(Duration::from_millis(wait_ms));
        let victim = start[1 + i % 2];
        signal(victim, "-9");
        view_without(&job, victim);
        recoveries(&job, 1);
        let done = job.finish();
        done.completes_with(&want);
        if done.stderr.contains("interrupted_checkpoint=Some") {
            interrupted += 1;
        }
    }
    eprintln!("{interrupted} of 3 losses came while a checkpoint was taken");
}

#[test]
fn a_node_lost_with_its_buddy_ends_the_job_saying_so() {
    let (spec, _) = spec(60_000, &["+ft-every", "2"]);
    let job = Background::launch(4, "jacobi2d", &spec)
        .timeout_s(120)
        .start();
    let start = pids(&job);
    std::thread::sleep(Duration::from_secs(2));
    // Node 2's copies are on node 3: both at once.
    signal(start[2], "-9");
    signal(start[3], "-9");
    let done = job.finish_within(Duration::from_secs(90));
    assert_ne!(done.code, Some(0), "{}", done.stderr);
    done.failed_naming("ending the job", "a second loss during a recovery");
    assert!(
        done.stderr.contains("recovery") || done.stderr.contains("lost node"),
        "{}",
        done.stderr
    );
    assert!(alive_none(&[start[0], start[1]]), "nothing is left running");
}

/// A Jacobi2D job of 30,000 iterations on `nodes` nodes under `+ft-every
/// 1` with sync points ~3 s apart, once its first checkpoint is complete:
/// the job, its launch pids and the uninterrupted run's checksum.
fn first_checkpoint_taken(nodes: u32) -> (Background, Vec<u32>, String) {
    let mut plain = jacobi_args(30_000);
    plain.extend(["--lb-every".to_owned(), "10000".to_owned()]);
    let want = reference_checksum(&plain);
    let mut spec = plain;
    spec.extend(["+ft-every".to_owned(), "1".to_owned()]);
    let job = Background::launch(nodes, "jacobi2d", &spec)
        .env("DUCTILE_LOG", "warn,ductile::pe::buddy=info")
        .timeout_s(240)
        .start();
    let start = pids(&job);
    job.wait_for_log("ft checkpoint=0 ", 1);
    (job, start, want)
}

/// Waits until the job rolled back to checkpoint 0 after the view changed
/// (a rescale or a recovery since it was taken), and checks that no later
/// checkpoint came first: else the test missed the window it is about.
fn rolled_back_to_the_carried_checkpoint(job: &Background) {
    job.wait_for_log(
        "rolled back to buddy checkpoint 0 (the sync point of LB step 1, taken in epoch 1, before the view changed)",
        1,
    );
    assert!(
        !job.stderr().contains("ft checkpoint=1 "),
        "the loss came after the next checkpoint: the test missed its window\n{}",
        job.stderr()
    );
}

/// A loss after a rescale, before the next sync point: the checkpoint
/// taken before the rescale still covers it. Node 1 leaves (its copy is on
/// node 2), then node 3 is killed (its copy is on node 0): the job rolls
/// back to that checkpoint on the two nodes left. Sync points are ~3 s
/// apart here, the shrink and the kill come right after the first
/// checkpoint. (That a rescale which took the lost node's copy away ends
/// the job instead is `pe::buddy::tests`.)
#[test]
fn a_loss_after_a_rescale_rolls_back_to_the_checkpoint_taken_before_it() {
    let (job, start, want) = first_checkpoint_taken(4);
    job.ductile(&["shrink", "--remove", "1"]);
    signal(start[3], "-9");
    let after = view_without(&job, start[3]);
    assert_eq!(
        after,
        [start[0], start[2]],
        "survivors keep their processes"
    );
    rolled_back_to_the_carried_checkpoint(&job);
    job.finish().completes_with(&want);
}

/// A second loss right after a recovery, before the next sync point: the
/// checkpoint rolled back to stays, and covers it when the copies it needs
/// are left. Of 5 nodes, node 2 is lost (its copy is on node 3), then node
/// 4 (its copy is on node 0, and the copy it holds is node 3's, which is
/// alive): the job rolls back to the same checkpoint twice.
#[test]
fn a_second_loss_before_the_next_checkpoint_rolls_back_to_the_same_one() {
    let (job, start, want) = first_checkpoint_taken(5);
    signal(start[2], "-9");
    view_without(&job, start[2]);
    recoveries(&job, 1);
    signal(start[4], "-9");
    let after = view_without(&job, start[4]);
    assert_eq!(
        after,
        [start[0], start[1], start[3]],
        "survivors keep their processes"
    );
    rolled_back_to_the_carried_checkpoint(&job);
    job.finish().completes_with(&want);
}

/// The same across an expand, with groups and nodegroups
/// (`elastic_probe`, 2 PEs per node): node 1 is killed after a newcomer
/// joined. The rollback counts the lost node's members out of the
/// reductions and the newcomer's (admitted after the checkpoint) in, so
/// every round after it sees exactly the members of the view.
#[test]
fn a_loss_after_an_expand_rolls_back_with_the_newcomer_in_every_reduction() {
    let args = [
        "--rounds",
        "100000",
        "--sync-every",
        "50000",
        "+ft-every",
        "1",
    ];
    let job = Background::launch(3, "elastic_probe", &args)
        .pes(2)
        .env("DUCTILE_LOG", "warn,ductile::pe::buddy=info")
        .timeout_s(240)
        .start();
    let start = pids(&job);
    job.wait_for_log("ft checkpoint=0 ", 1);
    job.ductile(&["expand", "--nodes", "1"]);
    signal(start[1], "-9");
    let after = view_without(&job, start[1]);
    assert_eq!(after.len(), 3, "{after:?}");
    assert_eq!(
        after[..2],
        [start[0], start[2]],
        "survivors keep their processes"
    );
    rolled_back_to_the_carried_checkpoint(&job);
    probe_ok(job);
}

#[test]
fn a_loss_before_any_checkpoint_ends_the_job_saying_no_checkpoint_covers_it() {
    // No sync point: no checkpoint is ever taken.
    let mut spec = jacobi_args(200_000);
    spec.extend(["+ft-every".to_owned(), "1".to_owned()]);
    let job = Background::launch(3, "jacobi2d", &spec)
        .timeout_s(120)
        .start();
    let start = pids(&job);
    std::thread::sleep(Duration::from_millis(500));
    signal(start[2], "-9");
    let done = job.finish_within(Duration::from_secs(90));
    assert_ne!(done.code, Some(0), "{}", done.stderr);
    done.failed_naming(
        "no buddy checkpoint of epoch 1 covers it",
        "a loss before the first checkpoint",
    );
    assert!(alive_none(&[start[0], start[1]]), "nothing is left running");
}

/// A node that hangs (SIGSTOP: its process and its connections stay) sends
/// the coordinator no heartbeat: after `--heartbeat-timeout` it is declared
/// lost and the job recovers without it, as from a killed one. Continued
/// later, it finds itself removed and exits.
#[test]
fn a_hung_node_is_declared_lost_after_the_heartbeat_timeout_and_recovered_from() {
    let (job, start, want) = hang_node_2(&[]);
    let log = job.read("coordinator.log");
    assert!(
        log.contains("declared lost"),
        "the coordinator says why: {log}"
    );
    signal(start[2], "-CONT");
    assert!(
        eventually(WAIT, || !alive(start[2])),
        "the hung node, continued, exits"
    );
    let done = job.finish();
    done.completes_with(&want);
}

/// A hung node that never resumes (a frozen VM) is declared lost, the job
/// recovers without it, and the launcher kills the stopped process once it
/// has run `--exit-grace` outside the view: the job completes with exit 0
/// instead of failing at its end for a member that never exited.
#[test]
fn a_hung_node_the_job_recovered_without_is_fenced_by_the_launcher() {
    let (job, start, want) = hang_node_2(&["--exit-grace", "2"]);
    assert!(
        eventually(WAIT, || !alive(start[2])),
        "the stopped node is killed while the job runs\n{}",
        job.stderr()
    );
    let done = job.finish();
    done.completes_with(&want);
    assert!(
        done.stderr
            .contains(&format!("node 2 (pid {}), fenced", start[2])),
        "the launcher says it killed the node: {}",
        done.stderr
    );
}

/// Without `+ft-every` a hung node ends the job, in bounded time and
/// naming it, instead of holding it forever.
#[test]
fn a_hung_node_ends_a_job_without_fault_tolerance_in_bounded_time_naming_it() {
    let job = Background::launch(3, "jacobi2d", &jacobi_args(2_000_000))
        .flags(&["--heartbeat-timeout", "3"])
        .timeout_s(120)
        .start();
    let start = pids(&job);
    std::thread::sleep(Duration::from_secs(1));
    signal(start[2], "-STOP");
    let done = job.finish_within(Duration::from_secs(60));
    assert_ne!(done.code, Some(0), "{}", done.stderr);
    done.failed_naming("lost node 2", "a hung node");
    assert!(
        eventually(Duration::from_secs(10), || !alive(start[2])),
        "the hung node does not outlive the job"
    );
}
