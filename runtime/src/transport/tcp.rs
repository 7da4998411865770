//! TCP transport: one outgoing connection per peer for the frames this node
//! sends, one incoming connection per peer for the frames it receives.
//! Unidirectional connections make per-pair ordering trivial and avoid
//! simultaneous-open races.
//!
//! Every connection starts with a mutual challenge-response over the job
//! secret (HMAC-SHA256), so only members of the job can inject frames.
//! Frame layout: `[u32 LE length][u64 LE tag][length bytes]`.
//!
//! Sends write the header and the caller's parts with one `writev` (no
//! gather copy). One receive thread per node (`ductile-tcp-rx`) accepts
//! peers and reads every incoming connection from one epoll set (mio):
//! small frames are parsed out of a per-connection staging buffer (one
//! `read` for many frames), a large one is read straight into the buffer
//! that is handed to the runtime (no zero-fill, no copy after receipt).
//! When nothing arrives it blocks in epoll, after an optional bounded spin
//! (`DUCTILE_TCP_SPIN_US`), so an idle node's transport uses no CPU.
//! Handshakes run on short-lived threads of their own, so a slow or hostile
//! peer cannot stall the others' frames.

use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ductile_coordinator::proto::{NodeId, View};
use ductile_coordinator::secret::Secret;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use rand::RngCore;
use tracing::{debug, error, warn};

use super::{current_tid, Reconciled, Sink, Tag, Transport, TransportError};

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
    rx: Arc<RxShared>,
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
        let rx = start_receiver(listener, secret.clone(), sink, closing.clone())?;
        Ok(Arc::new(TcpTransport {
            local,
            secret,
            my_uid: RwLock::new(0),
            out: RwLock::new(HashMap::new()),
            closing,
            rx,
        }))
    }

    /// The receive thread's kernel thread id (0 before it started).
    #[cfg(test)]
    pub(crate) fn receive_tid(&self) -> u64 {
        self.rx.tid.load(Ordering::SeqCst)
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

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.rx.stop.store(true, Ordering::SeqCst);
        let _ = self.rx.waker.wake();
    }
}

/// The receive side: one thread per node that accepts peers and reads
/// every incoming connection, woken by epoll (mio).
struct RxShared {
    /// Set by `shutdown`: connections that end are no longer losses.
    closing: Arc<AtomicBool>,
    /// Set when the transport is dropped: the receive thread ends.
    stop: AtomicBool,
    /// Authenticated connections the handshake threads hand over.
    handed: Mutex<Vec<(u64, TcpStream)>>,
    waker: Waker,
    /// The receive thread's kernel thread id, once it started (tests).
    tid: AtomicU64,
}

/// Token of the listening socket and of the waker; connections count up from `FIRST_CONN`.
const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

/// Bytes staged per connection: small frames are parsed out of it (one
/// `read` for many frames); a frame that does not fit is read straight into
/// its own buffer instead.
const STAGE: usize = 64 << 10;
/// Frames whose body is larger than this and not staged yet are read into
/// their own allocation (no copy after receipt).
const DIRECT: usize = STAGE / 2;

/// How long the receive thread polls without blocking after it delivered
/// something, before it blocks in epoll (`DUCTILE_TCP_SPIN_US`, default
/// [`DEFAULT_SPIN_US`]; 0: block at once). Measured in docs/message-path.md.
fn spin_from_env() -> Duration {
    std::env::var("DUCTILE_TCP_SPIN_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(
            Duration::from_micros(DEFAULT_SPIN_US),
            Duration::from_micros,
        )
}

/// The default receive spin, in µs (see [`spin_from_env`]): none. While a
/// PE thread of the same node spins or runs, a spinning receive thread takes
/// its core: measured on 2 cores (docs/message-path.md), a 50 µs spin made
/// the 8 B one-way PE-to-PE latency 71 µs against 25 µs without, a 200 µs
/// spin 283 µs. It pays only for the transport alone beside a busy
/// neighbour, where nothing else of the node wants the core.
pub const DEFAULT_SPIN_US: u64 = 0;

/// What reading a connection came to.
enum ConnState {
    /// Still open; nothing more to read now.
    Open,
    /// The peer said `BYE`: closed in order.
    Bye,
}

/// One incoming, authenticated connection.
struct Conn {
    stream: TcpStream,
    uid: u64,
    stage: Box<[u8]>,
    start: usize,
    end: usize,
    /// A large frame being read into its own buffer: (tag, buffer, length).
    big: Option<(Tag, Vec<u8>, usize)>,
}

impl Conn {
    fn new(stream: TcpStream, uid: u64) -> Conn {
        Conn {
            stream,
            uid,
            stage: vec![0u8; STAGE].into_boxed_slice(),
            start: 0,
            end: 0,
            big: None,
        }
    }

    /// Delivers the complete frames that are staged; starts a direct read
    /// for a large one. Err: the peer broke the protocol.
    fn parse(&mut self, sink: &dyn Sink) -> Result<Option<ConnState>, String> {
        while self.end - self.start >= 12 {
            let head = &self.stage[self.start..self.start + 12];
            let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
            let tag = Tag(u64::from_le_bytes(head[4..].try_into().expect("8 bytes")));
            if len > MAX_FRAME {
                return Err(format!(
                    "peer sent a frame of {len} bytes (limit {MAX_FRAME}); closing the connection"
                ));
            }
            if tag.kind() == KIND_BYE {
                debug!(uid = self.uid, "peer closed its endpoint");
                return Ok(Some(ConnState::Bye));
            }
            let body = self.start + 12;
            let staged = self.end - body;
            if staged >= len {
                let frame = self.stage[body..body + len].to_vec();
                self.start = body + len;
                sink.deliver(tag, frame);
                continue;
            }
            if len > DIRECT {
                // Into the frame's own allocation: what is staged, then the
                // rest straight from the socket.
                let mut frame = Vec::with_capacity(len);
                frame.extend_from_slice(&self.stage[body..self.end]);
                self.start = 0;
                self.end = 0;
                self.big = Some((tag, frame, len));
            }
            break;
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 && STAGE - self.start < 12 + DIRECT {
            // Make room for the rest of a staged frame.
            self.stage.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        Ok(None)
    }

    /// Reads everything the socket holds (the registration is edge-triggered).
    fn on_readable(&mut self, sink: &dyn Sink) -> Result<ConnState, String> {
        loop {
            if let Some((_, frame, len)) = &mut self.big {
                let want = (*len - frame.len()) as u64;
                // read_to_end fills the spare capacity without zeroing it and
                // keeps what it read when the socket runs dry (WouldBlock).
                match (&self.stream).take(want).read_to_end(frame) {
                    Ok(_) if frame.len() == *len => {
                        let (tag, frame, _) = self.big.take().expect("a frame in progress");
                        sink.deliver(tag, frame);
                    }
                    Ok(_) => return Err("connection ended inside a frame".into()),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(ConnState::Open),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(format!("connection ended inside a frame: {e}")),
                }
            }
            if let Some(state) = self.parse(sink)? {
                return Ok(state);
            }
            if self.big.is_some() {
                continue;
            }
            match (&self.stream).read(&mut self.stage[self.end..]) {
                Ok(0) if self.end > self.start => {
                    return Err("connection ended inside a frame".into())
                }
                Ok(0) => return Err("connection ended: no BYE".into()),
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(ConnState::Open),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("connection ended: {e}")),
            }
        }
    }
}

/// Starts the receive thread: it accepts peers (their handshakes on
/// short-lived threads of their own) and reads every authenticated
/// connection from one epoll set.
fn start_receiver(
    listener: TcpListener,
    secret: Secret,
    sink: Arc<dyn Sink>,
    closing: Arc<AtomicBool>,
) -> Result<Arc<RxShared>, TransportError> {
    listener
        .set_nonblocking(true)
        .map_err(io_err("making the listener non-blocking"))?;
    let poll = Poll::new().map_err(io_err("creating the epoll set"))?;
    let waker = Waker::new(poll.registry(), WAKER).map_err(io_err("creating a waker"))?;
    poll.registry()
        .register(
            &mut SourceFd(&listener.as_raw_fd()),
            LISTENER,
            Interest::READABLE,
        )
        .map_err(io_err("watching the listener"))?;
    let rx = Arc::new(RxShared {
        closing,
        stop: AtomicBool::new(false),
        handed: Mutex::new(Vec::new()),
        waker,
        tid: AtomicU64::new(0),
    });
    let shared = rx.clone();
    std::thread::Builder::new()
        .name("ductile-tcp-rx".into())
        .spawn(move || receive_loop(poll, listener, secret, sink, shared))
        .map_err(io_err("starting the receive thread"))?;
    Ok(rx)
}

fn receive_loop(
    mut poll: Poll,
    listener: TcpListener,
    secret: Secret,
    sink: Arc<dyn Sink>,
    rx: Arc<RxShared>,
) {
    rx.tid.store(current_tid(), Ordering::SeqCst);
    let spin = spin_from_env();
    let mut events = Events::with_capacity(64);
    let mut conns: HashMap<Token, Conn> = HashMap::new();
    let mut next_token = FIRST_CONN;
    let mut active_at = Instant::now();
    loop {
        if rx.stop.load(Ordering::SeqCst) {
            return;
        }
        let timeout = (active_at.elapsed() < spin).then_some(Duration::ZERO);
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != io::ErrorKind::Interrupted {
                error!("the TCP receive thread's epoll failed: {e}; no more frames are received");
                return;
            }
            continue;
        }
        if events.is_empty() {
            continue;
        }
        active_at = Instant::now();
        let mut ended: Vec<(Token, Option<String>)> = Vec::new();
        for ev in events.iter() {
            match ev.token() {
                LISTENER => accept_all(&listener, &secret, &rx),
                WAKER => {
                    let handed = std::mem::take(&mut *rx.handed.lock().expect("handover poisoned"));
                    for (uid, stream) in handed {
                        let token = Token(next_token);
                        next_token += 1;
                        let registered = stream.set_nonblocking(true).and_then(|()| {
                            poll.registry().register(
                                &mut SourceFd(&stream.as_raw_fd()),
                                token,
                                Interest::READABLE,
                            )
                        });
                        match registered {
                            Ok(()) => {
                                let mut conn = Conn::new(stream, uid);
                                // Frames may have arrived before registration:
                                // epoll reports a socket that is already readable,
                                // but read now anyway so none waits for the next.
                                match conn.on_readable(&*sink) {
                                    Ok(ConnState::Open) => {
                                        conns.insert(token, conn);
                                    }
                                    Ok(ConnState::Bye) => {}
                                    Err(reason) => {
                                        if !rx.closing.load(Ordering::SeqCst) {
                                            sink.lost(uid, reason);
                                        }
                                    }
                                }
                            }
                            Err(e) => error!("cannot watch the connection of peer {uid}: {e}"),
                        }
                    }
                }
                token => {
                    if let Some(conn) = conns.get_mut(&token) {
                        match conn.on_readable(&*sink) {
                            Ok(ConnState::Open) => {}
                            Ok(ConnState::Bye) => ended.push((token, None)),
                            Err(reason) => ended.push((token, Some(reason))),
                        }
                    }
                }
            }
        }
        for (token, reason) in ended {
            if let Some(conn) = conns.remove(&token) {
                let _ = poll
                    .registry()
                    .deregister(&mut SourceFd(&conn.stream.as_raw_fd()));
                if let Some(reason) = reason {
                    if !rx.closing.load(Ordering::SeqCst) {
                        sink.lost(conn.uid, reason);
                    }
                }
            }
        }
    }
}

/// Accepts every pending peer; each handshake runs on a short-lived thread
/// (a slow or hostile peer cannot stall the frames of the others), which
/// hands the authenticated stream to the receive thread.
fn accept_all(listener: &TcpListener, secret: &Secret, rx: &Arc<RxShared>) {
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                warn!("accepting a peer connection failed: {e}");
                return;
            }
        };
        let (secret, rx) = (secret.clone(), rx.clone());
        let spawned = std::thread::Builder::new()
            .name("ductile-tcp-hs".into())
            .spawn(move || {
                let peer = stream
                    .peer_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_else(|_| "?".into());
                // The listener is non-blocking; the handshake blocks (with a timeout).
                if let Err(e) = stream.set_nonblocking(false) {
                    warn!("refused a connection from {peer}: {e}");
                    return;
                }
                match accept_handshake(&stream, &secret) {
                    Ok(uid) => {
                        rx.handed
                            .lock()
                            .expect("handover poisoned")
                            .push((uid, stream));
                        if let Err(e) = rx.waker.wake() {
                            error!("cannot wake the TCP receive thread: {e}");
                        }
                    }
                    Err(e) => warn!("refused a connection from {peer}: {e}"),
                }
            });
        if let Err(e) = spawned {
            error!("cannot start a handshake thread: {e}");
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
        let s = Secret::generate();
        let (a, b) = (node(&s, 1), node(&s, 2));
        let v = view(1, &[&a, &b]);
        a.t.reconcile(&v, 0).unwrap();
        b.t.reconcile(&v, 1).unwrap();
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

    #[test]
    fn an_idle_transport_sleeps() {
        let s = Secret::generate();
        let (a, b) = (node(&s, 1), node(&s, 2));
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
}
