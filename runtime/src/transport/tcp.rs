//! TCP transport: one outgoing connection per peer for the frames this node
//! sends, one incoming connection per peer (with its reader thread) for the
//! frames it receives. Unidirectional connections make per-pair ordering
//! trivial and avoid simultaneous-open races.
//!
//! Every connection starts with a mutual challenge-response over the job
//! secret (HMAC-SHA256), so only members of the job can inject frames.
//! Frame layout: `[u32 LE length][u64 LE tag][length bytes]`.

use std::collections::HashMap;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use ductile_coordinator::proto::{NodeId, View};
use ductile_coordinator::secret::Secret;
use rand::RngCore;
use tracing::{debug, error, warn};

use super::{Reconciled, Sink, Tag, Transport, TransportError};

/// Largest frame accepted from a peer (1 GiB): bigger claims are malformed input.
pub const MAX_FRAME: usize = 1 << 30;
/// Kind of the frame a node sends before closing an endpoint on purpose.
const KIND_BYE: u32 = 0;
const DIAL_CONTEXT: &[u8] = b"ductile/tcp/v1/dialer";
const ACCEPT_CONTEXT: &[u8] = b"ductile/tcp/v1/acceptor";
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

struct Endpoint {
    uid: u64,
    stream: Mutex<TcpStream>,
}

/// The TCP transport of one node.
pub struct TcpTransport {
    local: SocketAddr,
    secret: Secret,
    my_uid: RwLock<u64>,
    /// Outgoing endpoints by the peer's node id in the current view.
    out: RwLock<HashMap<NodeId, Arc<Endpoint>>>,
    closing: Arc<AtomicBool>,
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> TransportError {
    move |source| TransportError::Io {
        context: context.into(),
        source,
    }
}

impl TcpTransport {
    /// Listens on `bind` (port chosen by the OS) and starts accepting
    /// authenticated peers, whose frames go to `sink`.
    pub fn bind(
        bind: IpAddr,
        advertise: Option<IpAddr>,
        secret: Secret,
        sink: Arc<dyn Sink>,
    ) -> Result<Arc<Self>, TransportError> {
        let listener =
            TcpListener::bind((bind, 0)).map_err(io_err(format!("listening on {bind}")))?;
        let mut local = listener
            .local_addr()
            .map_err(io_err("reading the listening address"))?;
        if let Some(ip) = advertise {
            local.set_ip(ip);
        }
        let closing = Arc::new(AtomicBool::new(false));
        let t = Arc::new(TcpTransport {
            local,
            secret: secret.clone(),
            my_uid: RwLock::new(0),
            out: RwLock::new(HashMap::new()),
            closing: closing.clone(),
        });
        std::thread::Builder::new()
            .name("ductile-accept".into())
            .spawn(move || accept_loop(listener, secret, sink, closing))
            .map_err(io_err("starting the accept thread"))?;
        Ok(t)
    }

    /// Sets the uid this node announces when it dials (known once registered).
    pub fn set_uid(&self, uid: u64) {
        *self.my_uid.write().expect("uid lock poisoned") = uid;
    }

    fn dial(&self, node: NodeId, uid: u64, address: &[u8]) -> Result<Endpoint, TransportError> {
        let text = std::str::from_utf8(address)
            .map_err(|_| TransportError::Address(node, "not UTF-8".into()))?;
        let addr: SocketAddr = text
            .parse()
            .map_err(|e| TransportError::Address(node, format!("{text}: {e}")))?;
        let mut s = TcpStream::connect_timeout(&addr, HANDSHAKE_TIMEOUT)
            .map_err(io_err(format!("connecting to node {node} at {addr}")))?;
        s.set_nodelay(true).map_err(io_err("setting TCP_NODELAY"))?;
        s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
            .map_err(io_err("setting a timeout"))?;
        // Acceptor's nonce; our uid, nonce and proof; the acceptor's proof.
        let mut theirs = [0u8; 32];
        s.read_exact(&mut theirs)
            .map_err(io_err(format!("handshake with node {node}")))?;
        let my_uid = *self.my_uid.read().expect("uid lock poisoned");
        let mut mine = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut mine);
        let proof = self.secret.proof(&dial_context(my_uid), &theirs);
        let mut hello = Vec::with_capacity(72);
        hello.extend_from_slice(&my_uid.to_le_bytes());
        hello.extend_from_slice(&mine);
        hello.extend_from_slice(&proof);
        s.write_all(&hello)
            .map_err(io_err(format!("handshake with node {node}")))?;
        let mut answer = [0u8; 32];
        // The acceptor closes without answering when the proof is wrong;
        // it also closes when it is ending. Say what is known, not a guess.
        s.read_exact(&mut answer).map_err(|e| {
            TransportError::Handshake(match e.kind() {
                std::io::ErrorKind::UnexpectedEof => format!(
                    "node {node} at {addr} closed the connection during the handshake \
                     (it refuses a wrong job secret so, and so does a node that is ending)"
                ),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
                    "node {node} at {addr} did not answer the handshake within {HANDSHAKE_TIMEOUT:?}"
                ),
                _ => format!("handshake with node {node} at {addr}: {e}"),
            })
        })?;
        if !self.secret.verify(ACCEPT_CONTEXT, &mine, &answer) {
            return Err(TransportError::Handshake(format!(
                "node {node} at {addr} does not hold the job secret"
            )));
        }
        s.set_read_timeout(None)
            .map_err(io_err("clearing a timeout"))?;
        Ok(Endpoint {
            uid,
            stream: Mutex::new(s),
        })
    }
}

fn dial_context(uid: u64) -> Vec<u8> {
    [DIAL_CONTEXT, &uid.to_le_bytes()].concat()
}

fn write_frame(s: &mut TcpStream, tag: Tag, parts: &[&[u8]]) -> io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let len = u32::try_from(len)
        .ok()
        .filter(|&l| (l as usize) <= MAX_FRAME)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"),
            )
        })?;
    let mut head = [0u8; 12];
    head[..4].copy_from_slice(&len.to_le_bytes());
    head[4..].copy_from_slice(&tag.0.to_le_bytes());
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len() + 1);
    slices.push(IoSlice::new(&head));
    slices.extend(
        parts
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| IoSlice::new(p)),
    );
    let mut bufs = &mut slices[..];
    while !bufs.is_empty() {
        match s.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Transport for TcpTransport {
    fn address(&self) -> Vec<u8> {
        self.local.to_string().into_bytes()
    }

    fn send(&self, to: NodeId, tag: Tag, parts: &[&[u8]]) -> Result<(), TransportError> {
        let ep = self
            .out
            .read()
            .expect("endpoint table poisoned")
            .get(&to)
            .cloned()
            .ok_or(TransportError::NoEndpoint(to))?;
        let mut s = ep.stream.lock().expect("endpoint lock poisoned");
        write_frame(&mut s, tag, parts).map_err(io_err(format!("sending to node {to}")))
    }

    fn reconcile(&self, view: &View, me: NodeId) -> Result<Reconciled, TransportError> {
        let mut stats = Reconciled::default();
        let mut by_uid: HashMap<u64, Arc<Endpoint>> =
            std::mem::take(&mut *self.out.write().expect("endpoint table poisoned"))
                .into_values()
                .map(|e| (e.uid, e))
                .collect();
        let mut next = HashMap::new();
        for m in &view.members {
            if m.node == me {
                continue;
            }
            let ep = match by_uid.remove(&m.uid) {
                Some(ep) => {
                    stats.kept += 1;
                    ep
                }
                None => {
                    stats.opened += 1;
                    Arc::new(self.dial(m.node, m.uid, &m.address)?)
                }
            };
            next.insert(m.node, ep);
        }
        for (uid, ep) in by_uid {
            stats.closed += 1;
            let mut s = ep.stream.lock().expect("endpoint lock poisoned");
            let _ = write_frame(&mut s, Tag::new(me, view.epoch, KIND_BYE), &[]);
            let _ = s.shutdown(Shutdown::Write);
            debug!(uid, "closed endpoint to a departed peer");
        }
        *self.out.write().expect("endpoint table poisoned") = next;
        Ok(stats)
    }

    fn shutdown(&self) {
        self.closing.store(true, Ordering::SeqCst);
        for ep in self
            .out
            .write()
            .expect("endpoint table poisoned")
            .drain()
            .map(|(_, e)| e)
        {
            let mut s = ep.stream.lock().expect("endpoint lock poisoned");
            let _ = write_frame(&mut s, Tag(KIND_BYE as u64), &[]);
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    secret: Secret,
    sink: Arc<dyn Sink>,
    closing: Arc<AtomicBool>,
) {
    for conn in listener.incoming() {
        if closing.load(Ordering::SeqCst) {
            return;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                warn!("accepting a peer connection failed: {e}");
                continue;
            }
        };
        let (secret, sink, closing) = (secret.clone(), sink.clone(), closing.clone());
        let spawned = std::thread::Builder::new()
            .name("ductile-recv".into())
            .spawn(move || {
                let peer = stream
                    .peer_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_else(|_| "?".into());
                match accept_handshake(&stream, &secret) {
                    Ok(uid) => read_loop(stream, uid, &*sink, &closing),
                    Err(e) => warn!("refused a connection from {peer}: {e}"),
                }
            });
        if let Err(e) = spawned {
            error!("cannot start a reader thread: {e}");
        }
    }
}

fn accept_handshake(mut s: &TcpStream, secret: &Secret) -> Result<u64, TransportError> {
    s.set_nodelay(true).map_err(io_err("setting TCP_NODELAY"))?;
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io_err("setting a timeout"))?;
    let mut nonce = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut nonce);
    s.write_all(&nonce).map_err(io_err("handshake"))?;
    let mut hello = [0u8; 72];
    s.read_exact(&mut hello).map_err(io_err("handshake"))?;
    let uid = u64::from_le_bytes(hello[..8].try_into().expect("8 bytes"));
    let theirs: [u8; 32] = hello[8..40].try_into().expect("32 bytes");
    let proof: [u8; 32] = hello[40..72].try_into().expect("32 bytes");
    if !secret.verify(&dial_context(uid), &nonce, &proof) {
        let _ = s.shutdown(Shutdown::Both);
        return Err(TransportError::Handshake(format!(
            "peer claiming uid {uid} does not hold the job secret"
        )));
    }
    s.write_all(&secret.proof(ACCEPT_CONTEXT, &theirs))
        .map_err(io_err("handshake"))?;
    s.set_read_timeout(None)
        .map_err(io_err("clearing a timeout"))?;
    Ok(uid)
}

fn read_loop(stream: TcpStream, uid: u64, sink: &dyn Sink, closing: &AtomicBool) {
    let mut r = BufReader::with_capacity(1 << 16, stream);
    let mut head = [0u8; 12];
    let reason = loop {
        if let Err(e) = r.read_exact(&mut head) {
            break format!("connection ended: {e}");
        }
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
        let tag = Tag(u64::from_le_bytes(head[4..].try_into().expect("8 bytes")));
        if len > MAX_FRAME {
            break format!(
                "peer sent a frame of {len} bytes (limit {MAX_FRAME}); closing the connection"
            );
        }
        if tag.kind() == KIND_BYE {
            debug!(uid, "peer closed its endpoint");
            return;
        }
        let mut frame = vec![0u8; len];
        if let Err(e) = r.read_exact(&mut frame) {
            break format!("connection ended inside a frame: {e}");
        }
        sink.deliver(tag, frame);
    };
    if !closing.load(Ordering::SeqCst) {
        sink.lost(uid, reason);
    }
}

#[cfg(test)]
mod tests {
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
        let t = TcpTransport::bind(
            IpAddr::from([127, 0, 0, 1]),
            None,
            secret.clone(),
            Arc::new(Collect(ft, lt)),
        )
        .unwrap();
        t.set_uid(uid);
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
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.read_exact(&mut nonce).unwrap();
        let mut hello = Vec::new();
        hello.extend_from_slice(&7u64.to_le_bytes());
        hello.extend_from_slice(&[1u8; 32]);
        hello.extend_from_slice(&s.proof(&dial_context(7), &nonce));
        raw.write_all(&hello).unwrap();
        let mut answer = [0u8; 32];
        raw.read_exact(&mut answer).unwrap();
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
}
