//! The TCP transport's tests: real sockets on loopback.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::handshake::dial_context;
use super::*;
use crossbeam_channel::{unbounded, Receiver, Sender};
use ductile_coordinator::proto::Member;

struct Collect(Sender<(Tag, Vec<u8>)>, Sender<String>);
impl Sink for Collect {
    fn deliver(&self, tag: Tag, frame: Vec<u8>) {
        let _ = self.0.send((tag, frame));
    }
    fn lost(&self, _uid: u64, reason: String) {
        let _ = self.1.send(reason);
    }
}

struct Node {
    t: Arc<TcpTransport>,
    frames: Receiver<(Tag, Vec<u8>)>,
    lost: Receiver<String>,
    uid: u64,
}

fn node(secret: &Secret, uid: u64) -> Node {
    let (ft, fr) = unbounded();
    let (lt, lr) = unbounded();
    let t = bound(secret, uid, Arc::new(Collect(ft, lt)));
    Node {
        t,
        frames: fr,
        lost: lr,
        uid,
    }
}

fn bound(secret: &Secret, uid: u64, sink: Arc<dyn Sink>) -> Arc<TcpTransport> {
    let t = TcpTransport::bind(IpAddr::from([127, 0, 0, 1]), None, secret.clone(), sink).unwrap();
    t.set_uid(uid);
    t
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

/// Two nodes (uids 1 and 2) of one view at epoch 1, each reconciled to it.
fn connected_pair() -> (Node, Node) {
    let s = Secret::generate();
    let (a, b) = (node(&s, 1), node(&s, 2));
    let v = view(1, &[&a, &b]);
    a.t.reconcile(&v, 0).unwrap();
    b.t.reconcile(&v, 1).unwrap();
    (a, b)
}

const WAIT: Duration = Duration::from_secs(5);

#[test]
fn frames_arrive_in_order_with_the_sender_in_the_tag() {
    let s = Secret::generate();
    let (a, b) = (node(&s, 10), node(&s, 11));
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
fn a_peer_without_the_secret_is_refused_both_ways() {
    let (good, bad) = (Secret::generate(), Secret::generate());
    let (a, b) = (node(&good, 1), node(&bad, 2));
    let err = a.t.reconcile(&view(1, &[&a, &b]), 0).unwrap_err();
    assert!(matches!(err, TransportError::Handshake(_)), "{err}");
    let err = b.t.reconcile(&view(1, &[&b, &a]), 0).unwrap_err();
    assert!(matches!(err, TransportError::Handshake(_)), "{err}");
    assert!(a.frames.try_recv().is_err() && b.frames.try_recv().is_err());
}

#[test]
fn garbage_and_oversized_frames_close_the_connection_and_nothing_is_delivered() {
    let s = Secret::generate();
    let a = node(&s, 1);
    let addr: SocketAddr = String::from_utf8(a.t.address()).unwrap().parse().unwrap();
    // Garbage instead of a handshake: refused, the transport keeps serving.
    let mut raw = TcpStream::connect(addr).unwrap();
    let mut nonce = [0u8; 32];
    raw.read_exact(&mut nonce).unwrap();
    raw.write_all(&[0xAB; 72]).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(
        raw.read(&mut buf).unwrap_or(0),
        0,
        "the connection is closed"
    );
    // An authenticated peer that claims a frame above the limit.
    let mut raw = raw_peer(addr, &s, 7);
    let mut head = [0u8; 12];
    head[..4].copy_from_slice(&(u32::MAX).to_le_bytes());
    head[4..].copy_from_slice(&Tag::new(3, 1, 1).0.to_le_bytes());
    raw.write_all(&head).unwrap();
    let reason = a.lost.recv_timeout(WAIT).unwrap();
    assert!(reason.contains("limit"), "{reason}");
    assert!(a.frames.try_recv().is_err());
}

#[test]
fn reconcile_keeps_survivors_reindexed_closes_the_departed_and_opens_newcomers() {
    let s = Secret::generate();
    let (a, b, c, d) = (node(&s, 1), node(&s, 2), node(&s, 3), node(&s, 4));
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

/// A peer that cannot be dialled (a node removed while a newcomer opened
/// its speculative endpoints) fails the reconcile, but the endpoints to the
/// others stay open and in place: their peers see no loss, and frames flow.
#[test]
fn a_peer_that_cannot_be_dialled_fails_the_reconcile_without_closing_the_others() {
    let s = Secret::generate();
    let (a, b, c, gone) = (node(&s, 1), node(&s, 2), node(&s, 3), node(&s, 4));
    a.t.reconcile(&view(1, &[&a, &b]), 0).unwrap();
    // `gone` stops listening: dialling it is refused.
    let mut v = view(2, &[&a, &b, &gone, &c]);
    drop(gone);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = listener.local_addr().unwrap();
    drop(listener);
    v.members[2].address = dead.to_string().into_bytes();
    assert!(
        a.t.reconcile(&v, 0).is_err(),
        "an unreachable peer is an error"
    );
    a.t.send(1, Tag::new(0, 2, 1), &[b"to-b"]).unwrap();
    a.t.send(3, Tag::new(0, 2, 1), &[b"to-c"]).unwrap();
    assert_eq!(b.frames.recv_timeout(WAIT).unwrap().1, b"to-b");
    assert_eq!(c.frames.recv_timeout(WAIT).unwrap().1, b"to-c");
    assert!(
        b.lost.recv_timeout(Duration::from_millis(300)).is_err(),
        "a's connection to b was closed by the failed reconcile"
    );
    assert!(matches!(
        a.t.send(2, Tag::new(0, 2, 1), &[b"x"]),
        Err(TransportError::NoEndpoint(2))
    ));
}

/// A hand-driven peer that passed the handshake as `uid`.
fn raw_peer(addr: SocketAddr, secret: &Secret, uid: u64) -> TcpStream {
    let mut raw = TcpStream::connect(addr).unwrap();
    let mut nonce = [0u8; 32];
    raw.read_exact(&mut nonce).unwrap();
    let mut hello = Vec::new();
    hello.extend_from_slice(&uid.to_le_bytes());
    hello.extend_from_slice(&[1u8; 32]);
    hello.extend_from_slice(&secret.proof(&dial_context(uid), &nonce));
    raw.write_all(&hello).unwrap();
    let mut answer = [0u8; 32];
    raw.read_exact(&mut answer).unwrap();
    raw
}

/// Frame `i` of the interleaving tests: small and large in turn.
fn mixed_frame(i: u32) -> Vec<u8> {
    let len = match i % 4 {
        0 => 8,
        1 => 3 << 20,
        2 => 0,
        _ => 70_000,
    }
    .max(4);
    let mut f = vec![(i % 251) as u8; len];
    f[..4].copy_from_slice(&i.to_le_bytes());
    f
}

fn check_mixed(frames: &Receiver<(Tag, Vec<u8>)>, n: u32, src: NodeId) {
    for i in 0..n {
        let (tag, f) = frames.recv_timeout(WAIT).unwrap();
        assert_eq!(tag.src(), src);
        let want = mixed_frame(i);
        assert_eq!(f.len(), want.len(), "frame {i}: length");
        assert_eq!(&f[..4], &i.to_le_bytes(), "frame {i} arrived out of order");
        assert!(f == want, "frame {i}: content");
    }
}

#[test]
fn small_frames_interleaved_with_large_ones_keep_per_pair_order() {
    let (a, b) = connected_pair();
    const N: u32 = 40;
    // Both directions at once, through send (parts) and send_frame.
    let bt = b.t.clone();
    let back = std::thread::spawn(move || {
        for i in 0..N {
            bt.send_frame(0, Tag::new(1, 1, 1), mixed_frame(i)).unwrap();
        }
    });
    for i in 0..N {
        let f = mixed_frame(i);
        let (x, y) = f.split_at(f.len() / 2);
        a.t.send(1, Tag::new(0, 1, 1), &[x, y]).unwrap();
    }
    check_mixed(&b.frames, N, 0);
    check_mixed(&a.frames, N, 1);
    back.join().unwrap();
    assert!(a.lost.try_recv().is_err() && b.lost.try_recv().is_err());
}

/// Sends `f` through `send_with` in three pieces, the way the runtime
/// writes a message: a small header, the body, a small tail.
fn send_in_pieces(t: &TcpTransport, tag: Tag, f: &[u8]) -> Result<(), TransportError> {
    let cut = f.len().min(3);
    let (head, rest) = f.split_at(cut);
    let (body, tail) = rest.split_at(rest.len() - rest.len().min(2));
    t.send_with(1, tag, f.len(), &mut |w| {
        w(&[head])?;
        w(&[body])?;
        w(&[tail])
    })
}

#[test]
fn frames_written_in_pieces_from_two_threads_arrive_whole_and_in_order() {
    let (a, b) = connected_pair();
    const N: u32 = 40;
    // Two senders on one node share the connection: kind 1 writes in
    // pieces, kind 2 whole frames; neither may tear the other's frames.
    let at = a.t.clone();
    let other = std::thread::spawn(move || {
        for i in 0..N {
            at.send(1, Tag::new(0, 1, 2), &[&mixed_frame(i)]).unwrap();
        }
    });
    for i in 0..N {
        send_in_pieces(&a.t, Tag::new(0, 1, 1), &mixed_frame(i)).unwrap();
    }
    other.join().unwrap();
    let mut next = [0u32; 2];
    for _ in 0..2 * N {
        let (tag, f) = b.frames.recv_timeout(WAIT).unwrap();
        let k = tag.kind() as usize - 1;
        let i = next[k];
        assert!(
            f == mixed_frame(i),
            "kind {} frame {i}: content or order",
            k + 1
        );
        next[k] += 1;
    }
    assert_eq!(next, [N, N]);
    assert!(a.lost.try_recv().is_err() && b.lost.try_recv().is_err());
}

#[test]
fn a_frame_written_short_of_its_length_is_refused_and_never_misread() {
    let (a, b) = connected_pair();
    send_in_pieces(&a.t, Tag::new(0, 1, 1), b"whole").unwrap();
    let err =
        a.t.send_with(1, Tag::new(0, 1, 1), 100_000, &mut |w| w(&[&[7u8; 70_000]]))
            .unwrap_err();
    assert!(err.to_string().contains("were announced"), "{err}");
    assert_eq!(b.frames.recv_timeout(WAIT).unwrap().1, b"whole");
    // The torn frame ends the connection: the peer reports it, delivers nothing of it.
    let reason = b.lost.recv_timeout(WAIT).unwrap();
    assert!(reason.contains("inside a frame"), "{reason}");
    assert!(
        b.frames.try_recv().is_err(),
        "no partial frame is delivered"
    );
    // A fill that fails before writing leaves the connection usable.
    let (c, d) = connected_pair();
    let err =
        c.t.send_with(1, Tag::new(0, 1, 1), 8, &mut |_| {
            Err(std::io::Error::other("no"))
        })
        .unwrap_err();
    assert!(err.to_string().contains("no"), "{err}");
    send_in_pieces(&c.t, Tag::new(0, 1, 1), b"after").unwrap();
    assert_eq!(d.frames.recv_timeout(WAIT).unwrap().1, b"after");
}

#[test]
fn a_peer_lost_inside_a_large_frame_is_reported_and_nothing_hangs() {
    let s = Secret::generate();
    let a = node(&s, 1);
    let addr: SocketAddr = String::from_utf8(a.t.address()).unwrap().parse().unwrap();
    let mut raw = raw_peer(addr, &s, 9);
    // One whole small frame, then 1 MiB of a 4 MiB one, then the peer dies.
    let mut head = [0u8; 12];
    head[..4].copy_from_slice(&3u32.to_le_bytes());
    head[4..].copy_from_slice(&Tag::new(5, 1, 1).0.to_le_bytes());
    raw.write_all(&head).unwrap();
    raw.write_all(b"abc").unwrap();
    head[..4].copy_from_slice(&(4u32 << 20).to_le_bytes());
    raw.write_all(&head).unwrap();
    raw.write_all(&vec![1u8; 1 << 20]).unwrap();
    drop(raw);
    assert_eq!(a.frames.recv_timeout(WAIT).unwrap().1, b"abc");
    let reason = a.lost.recv_timeout(WAIT).unwrap();
    assert!(reason.contains("inside a frame"), "{reason}");
    assert!(
        a.frames.try_recv().is_err(),
        "no partial frame is delivered"
    );
    // The transport keeps serving the others.
    let b = node(&s, 2);
    b.t.reconcile(&view(1, &[&a, &b]), 1).unwrap();
    b.t.send(0, Tag::new(1, 1, 1), &[b"still here"]).unwrap();
    assert_eq!(a.frames.recv_timeout(WAIT).unwrap().1, b"still here");
}

/// A hung peer: its receive thread takes one frame and then blocks, so it
/// reads nothing more (a stopped process, a frozen VM).
struct Stall(Receiver<()>);
impl Sink for Stall {
    fn deliver(&self, _: Tag, _: Vec<u8>) {
        let _ = self.0.recv();
    }
    fn lost(&self, _: u64, _: String) {}
}

/// A send blocked on a peer that reads nothing (its socket buffers full)
/// fails once the peer is disconnected as lost, from another thread, and
/// later sends to it fail at once: a PE stuck there can take its stop
/// order, where it would otherwise wait forever.
#[test]
fn a_send_blocked_on_a_hung_peer_fails_once_it_is_disconnected() {
    let s = Secret::generate();
    let a = node(&s, 1);
    let (release, gate) = unbounded::<()>();
    let hung =
        TcpTransport::bind(IpAddr::from([127, 0, 0, 1]), None, s, Arc::new(Stall(gate))).unwrap();
    let mut v = view(1, &[&a]);
    v.members.push(Member {
        node: 1,
        uid: 2,
        address: hung.address(),
        pes: 1,
        host: "h".into(),
        pid: 0,
    });
    a.t.reconcile(&v, 0).unwrap();
    let (done, sent) = unbounded();
    let sender = Arc::clone(&a.t);
    std::thread::spawn(move || {
        let body = vec![7u8; 1 << 20];
        // 1 GiB: far more than the kernel buffers a peer that reads nothing.
        let r = (0..1024).try_for_each(|_| sender.send(1, Tag::new(0, 1, 5), &[&body]));
        let _ = done.send(r);
    });
    assert!(
        sent.recv_timeout(Duration::from_millis(500)).is_err(),
        "1 GiB cannot reach a peer that reads nothing"
    );
    a.t.disconnect(2);
    let r = sent.recv_timeout(WAIT).expect("the blocked send returns");
    assert!(r.is_err(), "{r:?}");
    assert!(a.t.send(1, Tag::new(0, 1, 5), &[b"more"]).is_err());
    drop(release);
}

#[test]
fn an_idle_transport_sleeps() {
    let (a, b) = connected_pair();
    for i in 0..100u32 {
        a.t.send(1, Tag::new(0, 1, 1), &[&i.to_le_bytes()]).unwrap();
        b.t.send(0, Tag::new(1, 1, 1), &[&i.to_le_bytes()]).unwrap();
    }
    for _ in 0..100 {
        a.frames.recv_timeout(WAIT).unwrap();
        b.frames.recv_timeout(WAIT).unwrap();
    }
    // Connected, nothing in flight: the receive threads block in epoll.
    std::thread::sleep(Duration::from_millis(100));
    let tids = [a.t.receive_tid(), b.t.receive_tid()];
    let before: Vec<u64> = tids
        .iter()
        .map(|&t| super::super::thread_cpu_ns(t).expect("the receive thread runs"))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    for (i, &t) in tids.iter().enumerate() {
        let used = super::super::thread_cpu_ns(t).unwrap() - before[i];
        assert!(
            used < 50_000_000,
            "an idle receive thread used {} ms of CPU in 1 s",
            used / 1_000_000
        );
    }
}

/// Records which thread delivered each frame.
struct ByThread(Sender<(u64, Vec<u8>)>);
impl Sink for ByThread {
    fn deliver(&self, _: Tag, frame: Vec<u8>) {
        let _ = self.0.send((super::super::current_tid(), frame));
    }
    fn lost(&self, _: u64, reason: String) {
        panic!("no peer is lost here: {reason}");
    }
}

/// Frames as `ByThread` records them: (delivering thread, frame).
type Delivered = Receiver<(u64, Vec<u8>)>;

/// A node whose frames are recorded with the thread that delivered them.
fn node_by_thread(secret: &Secret, uid: u64) -> (Node, Delivered) {
    let (tx, rx) = unbounded();
    let n = Node {
        t: bound(secret, uid, Arc::new(ByThread(tx))),
        frames: unbounded().1,
        lost: unbounded().1,
        uid,
    };
    (n, rx)
}

/// A sender (uid 1) and a receiver (uid 2) whose frames are recorded with
/// the thread that delivered them.
fn pair_by_thread() -> (Node, Arc<TcpTransport>, Delivered) {
    let s = Secret::generate();
    let a = node(&s, 1);
    let (b, rx) = node_by_thread(&s, 2);
    let v = view(1, &[&a, &b]);
    a.t.reconcile(&v, 0).unwrap();
    b.t.reconcile(&v, 1).unwrap();
    // The connection is adopted by the receive thread once a frame came
    // through it; then that thread goes back to epoll.
    a.t.send(1, Tag::new(0, 1, 1), &[b"first"]).unwrap();
    let (by, f) = rx.recv_timeout(WAIT).unwrap();
    assert_eq!((by, &f[..]), (b.t.receive_tid(), &b"first"[..]));
    std::thread::sleep(Duration::from_millis(100));
    (a, b.t, rx)
}

/// Polls `t` on this thread, as a spinning PE does, until `n` frames came.
fn poll_for(t: &TcpTransport, rx: &Delivered, n: usize) -> Vec<(u64, Vec<u8>)> {
    let until = std::time::Instant::now() + WAIT;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(
            std::time::Instant::now() < until,
            "{} of {n} frames came",
            got.len()
        );
        t.poll();
        got.extend(rx.try_iter());
    }
    got
}

#[test]
fn a_spinning_pe_reads_frames_on_its_own_thread_and_the_receive_thread_after_it_stops() {
    let (a, b, rx) = pair_by_thread();
    let me = super::super::current_tid();
    b.pe_spinning(true);
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
    b.pe_spinning(false);
    // No PE spins: the receive thread reads again, without any poll.
    a.t.send(1, Tag::new(0, 1, 1), &[b"after"]).unwrap();
    let (by, f) = rx.recv_timeout(WAIT).unwrap();
    assert_eq!((by, &f[..]), (b.receive_tid(), &b"after"[..]));
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
fn a_pe_sleeping_on_the_wait_fd_is_woken_by_a_frame_and_reads_it_itself() {
    let (a, b, rx) = pair_by_thread();
    let me = super::super::current_tid();
    b.pe_spinning(true);
    let fd = b.wait_fd().expect("TCP gives a spinning PE a descriptor");
    assert!(
        !readable_within(fd, Duration::from_millis(50)),
        "readable with nothing sent"
    );
    for round in 0..20u32 {
        a.t.send(1, Tag::new(0, 1, 1), &[&round.to_le_bytes()])
            .unwrap();
        assert!(
            readable_within(fd, WAIT),
            "round {round}: a frame did not make the descriptor readable"
        );
        // The PE reads what woke it, on its own thread; nothing is left to
        // make the descriptor readable again.
        let got = poll_for(&b, &rx, 1);
        assert_eq!(got, [(me, round.to_le_bytes().to_vec())], "round {round}");
        assert!(
            !readable_within(fd, Duration::ZERO),
            "round {round}: still readable after the frame was read"
        );
    }
    b.pe_spinning(false);
    // The receive thread reads again once no PE holds the connections.
    a.t.send(1, Tag::new(0, 1, 1), &[b"after"]).unwrap();
    let (by, f) = rx.recv_timeout(WAIT).unwrap();
    assert_eq!((by, &f[..]), (b.receive_tid(), &b"after"[..]));
}

/// While a PE holds the connections the receive thread dozes, but still
/// accepts and adopts: a peer that connects then (a newcomer during a
/// rescale) completes its handshake, and its frames reach the spinning PE.
#[test]
fn a_peer_that_connects_while_a_pe_spins_is_adopted_and_read_by_that_pe() {
    let s = Secret::generate();
    let a = node(&s, 1);
    let (b, rx) = node_by_thread(&s, 2);
    let me = super::super::current_tid();
    b.t.pe_spinning(true);
    // Long enough for the receive thread's doze to grow past its first nap.
    std::thread::sleep(Duration::from_millis(100));
    let v = view(1, &[&a, &b]);
    a.t.reconcile(&v, 0).unwrap();
    // The first frame may be read by the receive thread as it adopts the
    // connection (what waits there then is read at once).
    a.t.send(1, Tag::new(0, 1, 1), &[b"first"]).unwrap();
    let got = poll_for(&b.t, &rx, 1);
    assert_eq!(got[0].1, b"first");
    a.t.send(1, Tag::new(0, 1, 1), &[b"hello"]).unwrap();
    let got = poll_for(&b.t, &rx, 1);
    assert_eq!(got, [(me, b"hello".to_vec())]);
    b.t.pe_spinning(false);
}

#[test]
fn frames_that_came_while_a_pe_spun_without_polling_are_read_once_it_stops() {
    let (a, b, rx) = pair_by_thread();
    b.pe_spinning(true);
    b.pe_spinning(true);
    for i in 0..5u32 {
        a.t.send(1, Tag::new(0, 1, 1), &[&i.to_le_bytes()]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        rx.try_recv().is_err(),
        "read by the receive thread while PEs spin"
    );
    // One of two spinning PEs stops: the other still has the connections.
    b.pe_spinning(false);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        rx.try_recv().is_err(),
        "read by the receive thread while a PE spins"
    );
    // The last one stops with frames waiting: the receive thread is woken
    // for them (nothing would read them otherwise).
    b.pe_spinning(false);
    for i in 0..5u32 {
        let (by, f) = rx.recv_timeout(WAIT).unwrap();
        assert_eq!((by, &f[..]), (b.receive_tid(), &i.to_le_bytes()[..]));
    }
}

#[test]
fn frames_read_by_spinning_pes_and_the_receive_thread_in_turn_keep_per_pair_order() {
    let (a, b, rx) = pair_by_thread();
    const N: u32 = 40;
    let sender = std::thread::spawn(move || {
        for i in 0..N {
            a.t.send_frame(1, Tag::new(0, 1, 1), mixed_frame(i))
                .unwrap();
        }
        a
    });
    // Two "PEs" that spin and stop in turn, while the receive thread reads
    // whenever neither spins.
    let pes = crate::transport::SpinningPes::start(b.clone());
    for i in 0..N {
        let (_, f) = rx.recv_timeout(WAIT).unwrap();
        let want = mixed_frame(i);
        assert_eq!(&f[..4], &i.to_le_bytes(), "frame {i} arrived out of order");
        assert!(f == want, "frame {i}: content");
    }
    pes.stop();
    sender.join().unwrap();
}
