//! The TCP transport's tests, ported to UCX, plus renumbering and large
//! frames. They run over whatever `UCX_TLS` selects (shared memory by
//! default; `UCX_TLS=tcp UCX_NET_DEVICES=lo` for TCP on loopback).

use super::*;
use crossbeam_channel::{unbounded, Receiver, Sender};
use ductile_coordinator::proto::Member;

struct Collect(Sender<(Tag, Vec<u8>)>, Sender<String>);
impl Sink for Collect {
    fn deliver(&self, tag: Tag, frame: Vec<u8>) {
        let _ = self.0.send((tag, frame));
    }
    fn lost(&self, uid: u64, reason: String) {
        let _ = self.1.send(format!("uid {uid}: {reason}"));
    }
}

struct Node {
    t: Arc<UcxTransport>,
    frames: Receiver<(Tag, Vec<u8>)>,
    lost: Receiver<String>,
    uid: u64,
}

fn node(uid: u64) -> Node {
    node_with(uid, &[])
}

fn node_with(uid: u64, settings: &[(&str, &str)]) -> Node {
    let (ft, fr) = unbounded();
    let (lt, lr) = unbounded();
    let t = UcxTransport::with_ucx_settings(Arc::new(Collect(ft, lt)), settings).unwrap();
    Node {
        t,
        frames: fr,
        lost: lr,
        uid,
    }
}

/// A node in peer error-handling mode whatever `DUCTILE_UCX_ERR_MODE`
/// says: the loss tests need the transport to notice a dead peer.
fn node_reporting_loss(uid: u64, settings: &[(&str, &str)]) -> Node {
    let (ft, fr) = unbounded();
    let (lt, lr) = unbounded();
    let t = UcxTransport::with_err_mode(Arc::new(Collect(ft, lt)), settings, true).unwrap();
    Node {
        t,
        frames: fr,
        lost: lr,
        uid,
    }
}

fn view(epoch: u64, nodes: &[&Node]) -> View {
    View {
        epoch,
        members: nodes
            .iter()
            .enumerate()
            .map(|(i, n)| Member {
                node: i as u32,
                uid: n.uid,
                address: n.t.address(),
                pes: 1,
                host: "h".into(),
                pid: 0,
            })
            .collect(),
    }
}

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn frames_arrive_in_order_with_the_sender_in_the_tag() {
    let (a, b) = (node(10), node(11));
    let v = view(1, &[&a, &b]);
    assert_eq!(
        a.t.reconcile(&v, 0).unwrap(),
        Reconciled {
            kept: 0,
            opened: 1,
            closed: 0
        }
    );
    for i in 0..100u32 {
        a.t.send(1, Tag::new(0, 1, 5), &[&i.to_le_bytes(), b"-payload"])
            .unwrap();
    }
    for i in 0..100u32 {
        let (tag, frame) = b.frames.recv_timeout(WAIT).unwrap();
        assert_eq!((tag.src(), tag.kind(), tag.epoch_bits()), (0, 5, 1));
        assert_eq!(&frame[..4], &i.to_le_bytes());
        assert_eq!(&frame[4..], b"-payload");
    }
}

#[test]
fn large_and_small_frames_keep_their_order() {
    let (a, b) = (node(1), node(2));
    a.t.reconcile(&view(1, &[&a, &b]), 0).unwrap();
    let sizes = [8usize, 4 << 20, 16, 8192, 8193, 1 << 16, 0, 3 << 20, 1];
    for (i, &n) in sizes.iter().enumerate() {
        let body: Vec<u8> = (0..n).map(|k| (k as u8).wrapping_add(i as u8)).collect();
        a.t.send(1, Tag::new(0, 1, 1), &[&body[..n / 2], &body[n / 2..]])
            .unwrap();
    }
    for (i, &n) in sizes.iter().enumerate() {
        let (tag, frame) = b.frames.recv_timeout(WAIT).unwrap();
        assert_eq!((tag.src(), tag.kind()), (0, 1), "frame {i}");
        assert_eq!(frame.len(), n, "frame {i}");
        assert!(
            frame
                .iter()
                .enumerate()
                .all(|(k, &x)| x == (k as u8).wrapping_add(i as u8)),
            "frame {i} content"
        );
    }
    assert!(b.frames.try_recv().is_err());
}

#[test]
fn reconcile_keeps_survivors_reindexed_closes_the_departed_and_opens_newcomers() {
    let (a, b, c, d) = (node(1), node(2), node(3), node(4));
    assert_eq!(
        a.t.reconcile(&view(1, &[&a, &b, &c]), 0).unwrap(),
        Reconciled {
            kept: 0,
            opened: 2,
            closed: 0
        }
    );
    // b leaves, c is renumbered 2 -> 1, d joins as node 2.
    let v2 = view(2, &[&a, &c, &d]);
    assert_eq!(
        a.t.reconcile(&v2, 0).unwrap(),
        Reconciled {
            kept: 1,
            opened: 1,
            closed: 1
        }
    );
    a.t.send(1, Tag::new(0, 2, 1), &[b"to-c"]).unwrap();
    a.t.send(2, Tag::new(0, 2, 1), &[b"to-d"]).unwrap();
    assert_eq!(c.frames.recv_timeout(WAIT).unwrap().1, b"to-c");
    assert_eq!(d.frames.recv_timeout(WAIT).unwrap().1, b"to-d");
    assert!(
        b.frames.try_recv().is_err(),
        "nothing reaches the departed node"
    );
    assert!(
        b.lost.recv_timeout(Duration::from_millis(200)).is_err(),
        "an orderly close is not a loss"
    );
    assert!(matches!(
        a.t.send(3, Tag::new(0, 2, 1), &[b"x"]),
        Err(TransportError::NoEndpoint(3))
    ));
}

#[test]
fn renumbering_changes_source_ids_without_starting_receives() {
    let nodes = [node(100), node(101), node(102), node(103)];
    let all: Vec<&Node> = nodes.iter().collect();
    let v1 = view(1, &all);
    for (i, n) in nodes.iter().enumerate() {
        n.t.reconcile(&v1, i as u32).unwrap();
    }
    // Epoch 1: everyone sends to node 0 under its old id.
    for i in 1..4u32 {
        nodes[i as usize]
            .t
            .send(0, Tag::new(i, 1, 1), &[&i.to_le_bytes()])
            .unwrap();
    }
    let mut seen: Vec<u32> = (0..3)
        .map(|_| nodes[0].frames.recv_timeout(WAIT).unwrap().0.src())
        .collect();
    seen.sort();
    assert_eq!(seen, [1, 2, 3]);

    // Drop node 1; nodes 2 and 3 become 1 and 2.
    let before: Vec<u64> = nodes.iter().map(|n| n.t.receives()).collect();
    let v2 = view(2, &[&nodes[0], &nodes[2], &nodes[3]]);
    for (new_id, old) in [(0u32, 0usize), (1, 2), (2, 3)] {
        let r = nodes[old].t.reconcile(&v2, new_id).unwrap();
        assert_eq!((r.kept, r.closed, r.opened), (2, 1, 0), "node {old}");
    }
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(
            n.t.receives(),
            before[i],
            "reconcile started receives on node {i}"
        );
    }

    // Old node 3 (now 2) sends to old node 2 (now 1) and to node 0;
    // old node 2 (now 1) sends to node 0.
    nodes[3].t.send(1, Tag::new(2, 2, 1), &[b"3->2"]).unwrap();
    nodes[3].t.send(0, Tag::new(2, 2, 1), &[b"3->0"]).unwrap();
    nodes[2].t.send(0, Tag::new(1, 2, 1), &[b"2->0"]).unwrap();
    let (t, f) = nodes[2].frames.recv_timeout(WAIT).unwrap();
    assert_eq!((t.src(), t.epoch_bits(), &f[..]), (2, 2, &b"3->2"[..]));
    let mut at0: Vec<(u32, Vec<u8>)> = (0..2)
        .map(|_| {
            let (t, f) = nodes[0].frames.recv_timeout(WAIT).unwrap();
            (t.src(), f)
        })
        .collect();
    at0.sort();
    assert_eq!(at0, [(1, b"2->0".to_vec()), (2, b"3->0".to_vec())]);
    // One receive per delivered frame, and nothing else: the departed
    // node's BYEs are not frames.
    assert_eq!(nodes[0].t.receives(), before[0] + 2);
    assert_eq!(nodes[2].t.receives(), before[2] + 1);
    assert_eq!(nodes[3].t.receives(), before[3]);
    assert_eq!(nodes[1].t.receives(), before[1]);
    // Node 1 is gone from every survivor's table.
    assert!(matches!(
        nodes[0].t.send(3, Tag::new(0, 2, 1), &[b"x"]),
        Err(TransportError::NoEndpoint(3))
    ));
    assert!(nodes[1].frames.try_recv().is_err());
}

#[test]
fn an_unusable_address_is_an_error_not_a_crash() {
    let a = node(1);
    let mut v = view(1, &[&a]);
    v.members.push(Member {
        node: 1,
        uid: 2,
        address: Vec::new(),
        pes: 1,
        host: "h".into(),
        pid: 0,
    });
    assert!(matches!(
        a.t.reconcile(&v, 0),
        Err(TransportError::Address(1, _))
    ));
}

/// A peer that vanishes without shutting down (its worker destroyed, as when
/// its process dies) is reported as lost; one that shut down is not. Over
/// UCX's tcp on loopback, where the closed sockets show the loss at once
/// (over shared memory UCX notices through its keepalive, within
/// `UCX_KEEPALIVE_INTERVAL`, 20 s by default).
#[test]
fn a_vanished_peer_is_reported_lost_and_one_that_shut_down_is_not() {
    let tcp = [("TLS", "tcp"), ("NET_DEVICES", "lo")];
    let (a, b, c) = (
        node_reporting_loss(1, &tcp),
        node_reporting_loss(2, &tcp),
        node_reporting_loss(3, &tcp),
    );
    let v = view(1, &[&a, &b, &c]);
    for (i, n) in [&a, &b, &c].iter().enumerate() {
        n.t.reconcile(&v, i as u32).unwrap();
    }
    // Traffic both ways, so every pair is wired up.
    for (i, n) in [&a, &b, &c].iter().enumerate() {
        for j in 0..3u32 {
            if j != i as u32 {
                n.t.send(j, Tag::new(i as u32, 1, 1), &[b"hi"]).unwrap();
            }
        }
    }
    for n in [&a, &b, &c] {
        for _ in 0..2 {
            n.frames.recv_timeout(WAIT).unwrap();
        }
    }
    c.t.shutdown();
    drop(c);
    drop(b);
    let why = a
        .lost
        .recv_timeout(WAIT)
        .expect("the vanished peer was not reported");
    assert!(why.starts_with("uid 2: UCX"), "{why}");
    assert!(
        a.lost.recv_timeout(Duration::from_millis(500)).is_err(),
        "only the vanished peer is lost, not the one that shut down"
    );
}

#[test]
fn an_idle_transport_sleeps() {
    let (a, b) = (node(20), node(21));
    let v = view(1, &[&a, &b]);
    a.t.reconcile(&v, 0).unwrap();
    b.t.reconcile(&v, 1).unwrap();
    for i in 0..100u32 {
        a.t.send(1, Tag::new(0, 1, 1), &[&i.to_le_bytes()]).unwrap();
        b.t.send(0, Tag::new(1, 1, 1), &[&i.to_le_bytes()]).unwrap();
    }
    for _ in 0..100 {
        a.frames.recv_timeout(WAIT).unwrap();
        b.frames.recv_timeout(WAIT).unwrap();
    }
    // Connected, nothing in flight: after its short spin the communication
    // thread blocks on the worker's event fd.
    std::thread::sleep(Duration::from_millis(100));
    let tids = [a.t.comm_tid(), b.t.comm_tid()];
    let before: Vec<u64> = tids
        .iter()
        .map(|&t| crate::transport::thread_cpu_ns(t).expect("the thread runs"))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    for (i, &t) in tids.iter().enumerate() {
        let used = crate::transport::thread_cpu_ns(t).unwrap() - before[i];
        assert!(
            used < 50_000_000,
            "an idle communication thread used {} ms of CPU in 1 s",
            used / 1_000_000
        );
    }
    // And a message still wakes it at once (the sleep's timeout is 30 s in
    // the tests).
    let t0 = Instant::now();
    a.t.send(1, Tag::new(0, 1, 1), &[b"wake"]).unwrap();
    assert_eq!(b.frames.recv_timeout(WAIT).unwrap().1, b"wake");
    assert!(
        t0.elapsed() < Duration::from_millis(900),
        "a message waited for the sleep's timeout"
    );
}

/// A sender that vanishes while a large frame is on its way (a rendezvous
/// over UCX's tcp on loopback) is reported lost, no partial frame is
/// delivered, and the receiver keeps serving others.
#[test]
fn a_peer_lost_mid_rendezvous_is_reported_and_nothing_hangs() {
    let tcp = [("TLS", "tcp"), ("NET_DEVICES", "lo")];
    let (a, b, c) = (
        node_reporting_loss(31, &tcp),
        node_reporting_loss(32, &tcp),
        node_reporting_loss(33, &tcp),
    );
    let v = view(1, &[&a, &b, &c]);
    for (i, n) in [&a, &b, &c].iter().enumerate() {
        n.t.reconcile(&v, i as u32).unwrap();
    }
    const BIG: usize = 64 << 20;
    a.t.send_frame(1, Tag::new(0, 1, 1), vec![3u8; BIG])
        .unwrap();
    drop(a);
    let why = b
        .lost
        .recv_timeout(WAIT)
        .expect("the vanished sender was not reported");
    assert!(why.starts_with("uid 31: UCX"), "{why}");
    while let Ok((_, f)) = b.frames.try_recv() {
        assert_eq!(f.len(), BIG, "a partial frame was delivered");
    }
    c.t.send(1, Tag::new(2, 1, 1), &[b"still here"]).unwrap();
    assert_eq!(b.frames.recv_timeout(WAIT).unwrap().1, b"still here");
}

/// A transport dropped without a shutdown while its large sends are still
/// on their way (a rendezvous the peer is reading) ends cleanly: its
/// endpoints are closed and its worker finishes what is in flight before it
/// is destroyed (UCX 1.13 aborts the process when a worker is destroyed
/// under an endpoint's requests: a CI run died so). Whatever reached the
/// peer is whole, and the peer goes on serving others. In both error modes.
#[test]
fn a_transport_dropped_with_sends_in_flight_ends_without_aborting() {
    for peer_errors in [true, false] {
        for round in 0..3u64 {
            let mk = |uid| {
                let (ft, fr) = unbounded();
                let (lt, lr) = unbounded();
                let t = UcxTransport::with_err_mode(Arc::new(Collect(ft, lt)), &[], peer_errors)
                    .unwrap();
                Node {
                    t,
                    frames: fr,
                    lost: lr,
                    uid,
                }
            };
            let base = 40 + 10 * round + if peer_errors { 0 } else { 100 };
            let (a, b, c) = (mk(base), mk(base + 1), mk(base + 2));
            let v = view(1, &[&a, &b, &c]);
            for (i, n) in [&a, &b, &c].iter().enumerate() {
                n.t.reconcile(&v, i as u32).unwrap();
            }
            const BIG: usize = 16 << 20;
            for k in 0..3u8 {
                a.t.send_frame(1, Tag::new(0, 1, 1), vec![k; BIG]).unwrap();
            }
            drop(a);
            while let Ok((_, f)) = b.frames.try_recv() {
                assert_eq!(f.len(), BIG, "a partial frame was delivered");
            }
            c.t.send(1, Tag::new(2, 1, 1), &[b"still here"]).unwrap();
            loop {
                let (_, f) = b.frames.recv_timeout(WAIT).expect("b stopped serving");
                if f == b"still here" {
                    break;
                }
                assert_eq!(f.len(), BIG, "a partial frame was delivered");
            }
        }
    }
}

/// Records each frame with the kernel id of the thread that delivered it.
struct ByThread(Sender<(u64, Vec<u8>)>);
impl Sink for ByThread {
    fn deliver(&self, _tag: Tag, frame: Vec<u8>) {
        let _ = self.0.send((crate::transport::current_tid(), frame));
    }
    fn lost(&self, _uid: u64, _reason: String) {}
}

type Delivered = Receiver<(u64, Vec<u8>)>;

/// A sender (uid 1) and a receiver (uid 2) in `pe` progress mode whose
/// frames are recorded with the thread that delivered them; the first
/// frame, sent while no PE spins, came through the communication thread.
fn pe_mode_pair() -> (Node, Arc<UcxTransport>, Delivered) {
    let a = node(1);
    let (tx, rx) = unbounded();
    let b = UcxTransport::build(
        Arc::new(ByThread(tx)),
        &[],
        peer_errors_from_env().unwrap(),
        Progress::Pe,
    )
    .unwrap();
    let b = Node {
        t: b,
        frames: unbounded().1,
        lost: unbounded().1,
        uid: 2,
    };
    let v = view(1, &[&a, &b]);
    a.t.reconcile(&v, 0).unwrap();
    b.t.reconcile(&v, 1).unwrap();
    a.t.send(1, Tag::new(0, 1, 1), &[b"first"]).unwrap();
    let (by, f) = rx.recv_timeout(WAIT).unwrap();
    assert_eq!((by, &f[..]), (b.t.comm_tid(), &b"first"[..]));
    (a, b.t, rx)
}

/// Polls `t` on this thread, as a spinning PE does, until `n` frames came.
fn poll_for(t: &UcxTransport, rx: &Delivered, n: usize) -> Vec<(u64, Vec<u8>)> {
    let until = Instant::now() + WAIT;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < until, "{} of {n} frames came", got.len());
        t.poll();
        got.extend(rx.try_iter());
    }
    got
}

/// Whether `fd` turns readable within `within` (poll(2), as a sleeping PE
/// waits on it beside its inbox).
fn readable_within(fd: std::os::fd::BorrowedFd<'_>, within: Duration) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let ms = PollTimeout::try_from(within).unwrap();
    nix::poll::poll(&mut fds, ms).unwrap() == 1
}

#[test]
fn a_spinning_pe_receives_on_its_own_thread_and_the_communication_thread_after_it_stops() {
    let (a, b, rx) = pe_mode_pair();
    let me = crate::transport::current_tid();
    b.pe_spinning(true);
    // The communication thread, still in its spin after the first frame,
    // sees the PE at its next turn: from then on it stays out.
    std::thread::sleep(Duration::from_millis(20));
    let busy_before = crate::transport::thread_cpu_ns(b.comm_tid()).unwrap();
    for i in 0..200u32 {
        a.t.send(1, Tag::new(0, 1, 1), &[&i.to_le_bytes()]).unwrap();
    }
    let got = poll_for(&b, &rx, 200);
    for (i, (by, f)) in got.iter().enumerate() {
        assert_eq!(
            *by, me,
            "frame {i} was delivered by another thread than the spinning one"
        );
        assert_eq!(&f[..], &(i as u32).to_le_bytes());
    }
    // The communication thread stayed asleep meanwhile: a spinning PE has
    // the worker to itself.
    let used = crate::transport::thread_cpu_ns(b.comm_tid()).unwrap() - busy_before;
    assert!(
        used < 20_000_000,
        "the communication thread ran {} ms while a PE progressed the worker",
        used / 1_000_000
    );
    b.pe_spinning(false);
    // No PE spins: the communication thread receives again, without a poll.
    a.t.send(1, Tag::new(0, 1, 1), &[b"after"]).unwrap();
    let (by, f) = rx.recv_timeout(WAIT).unwrap();
    assert_eq!((by, &f[..]), (b.comm_tid(), &b"after"[..]));
}

/// Whether `t`'s wait fd, armed, stays quiet for 50 ms, progressing what
/// woke it (UCX may still be finishing an endpoint's wire-up: events, not
/// frames) up to 20 times first. False: it never stays quiet, as a
/// sleeping PE would spin on it.
fn settles(t: &UcxTransport) -> bool {
    (0..20).any(|_| {
        let quiet = !readable_within(
            t.wait_fd().expect("pe mode gives a descriptor"),
            Duration::from_millis(50),
        );
        if !quiet {
            t.poll();
        }
        quiet
    })
}

/// A PE never sleeps on the worker's event fd for good: with nothing in
/// flight its sleep is bounded too, so an arrival UCX does not announce
/// (seen over shared memory without peer error handling) waits at most
/// that long instead of hanging the job.
#[test]
fn an_idle_pe_sleeps_on_the_worker_for_a_bounded_time() {
    let (_a, b, _rx) = pe_mode_pair();
    b.pe_spinning(true);
    assert!(settles(&b), "readable again and again with nothing sent");
    let _fd = b.wait_fd().unwrap();
    assert_eq!(b.worker.sends_in_flight(), 0);
    assert_eq!(b.wait_limit(), Some(IDLE_NAP));
    b.pe_spinning(false);
}

#[test]
fn a_pe_sleeping_on_the_wait_fd_is_woken_by_a_frame_and_receives_it_itself() {
    let (a, b, rx) = pe_mode_pair();
    let me = crate::transport::current_tid();
    b.pe_spinning(true);
    assert!(settles(&b), "readable again and again with nothing sent");
    for round in 0..20u32 {
        // Armed again before each sleep, as the PE loop does.
        let fd = b.wait_fd().unwrap();
        a.t.send(1, Tag::new(0, 1, 1), &[&round.to_le_bytes()])
            .unwrap();
        assert!(
            readable_within(fd, WAIT),
            "round {round}: a frame did not make the descriptor readable"
        );
        let got = poll_for(&b, &rx, 1);
        assert_eq!(got, [(me, round.to_le_bytes().to_vec())], "round {round}");
    }
    // Everything was received: armed again, the descriptor stays quiet.
    assert!(
        settles(&b),
        "readable again and again after every frame was received"
    );
    assert!(rx.try_recv().is_err(), "a frame nobody sent");
    b.pe_spinning(false);
    a.t.send(1, Tag::new(0, 1, 1), &[b"after"]).unwrap();
    let (by, f) = rx.recv_timeout(WAIT).unwrap();
    assert_eq!((by, &f[..]), (b.comm_tid(), &b"after"[..]));
}

#[test]
fn frames_that_came_while_pes_spun_without_progress_are_received_once_the_last_stops() {
    let (a, b, rx) = pe_mode_pair();
    b.pe_spinning(true);
    b.pe_spinning(true);
    // The communication thread, still in its spin after the first frame,
    // sees the PE at its next turn: from then on it stays out.
    std::thread::sleep(Duration::from_millis(20));
    for i in 0..5u32 {
        a.t.send(1, Tag::new(0, 1, 1), &[&i.to_le_bytes()]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        rx.try_recv().is_err(),
        "received by the communication thread while PEs spin"
    );
    b.pe_spinning(false);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        rx.try_recv().is_err(),
        "received by the communication thread while a PE spins"
    );
    // The last one stops with frames waiting: the thread is woken for them
    // (the sleep's timeout is 30 s in the tests).
    let t0 = Instant::now();
    b.pe_spinning(false);
    for i in 0..5u32 {
        let (by, f) = rx.recv_timeout(WAIT).unwrap();
        assert_eq!((by, &f[..]), (b.comm_tid(), &i.to_le_bytes()[..]));
    }
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "the frames waited for the thread's sleep to time out"
    );
}

#[test]
fn frames_received_by_spinning_pes_and_the_thread_in_turn_keep_per_pair_order() {
    let (a, b, rx) = pe_mode_pair();
    const N: usize = 40;
    /// Frame `i`: small and rendezvous-sized ones interleaved, numbered.
    fn fill(i: usize) -> Vec<u8> {
        let size = [8usize, 3 << 20, 16, 8193, 1 << 16][i % 5];
        let mut f: Vec<u8> = (0..size).map(|k| (k + i) as u8).collect();
        f[..4].copy_from_slice(&(i as u32).to_le_bytes());
        f
    }
    let sender = std::thread::spawn(move || {
        for i in 0..N {
            a.t.send_frame(1, Tag::new(0, 1, 1), fill(i)).unwrap();
        }
        a
    });
    // Two "PEs" that spin and stop in turn, while the communication thread
    // progresses whenever neither spins.
    let pes = crate::transport::SpinningPes::start(b.clone());
    for i in 0..N {
        let (_, f) = rx.recv_timeout(WAIT).unwrap();
        assert!(f == fill(i), "frame {i} arrived out of order or damaged");
    }
    pes.stop();
    drop(sender.join().unwrap());
}
