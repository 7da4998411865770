//! The receive side: one thread per node (`ductile-tcp-rx`) that accepts
//! peers and reads every incoming, authenticated connection from one epoll
//! set (mio). Small frames are parsed out of a per-connection staging
//! buffer (one `read` for many frames); a large one is read straight into
//! the buffer handed to the runtime. When nothing arrives the thread blocks
//! in epoll, after an optional bounded spin (`DUCTILE_TCP_SPIN_US`).

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ductile_coordinator::secret::Secret;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use tracing::{debug, error, warn};

use super::handshake::accept_handshake;
use super::{io_err, KIND_BYE, MAX_FRAME};
use crate::transport::{current_tid, Sink, Tag, TransportError};

/// The receive side: one thread per node that accepts peers and reads
/// every incoming connection, woken by epoll (mio).
pub(super) struct RxShared {
    /// Set by `shutdown`: connections that end are no longer losses.
    pub(super) closing: Arc<AtomicBool>,
    /// Set when the transport is dropped: the receive thread ends.
    pub(super) stop: AtomicBool,
    /// Authenticated connections the handshake threads hand over.
    pub(super) handed: Mutex<Vec<(u64, TcpStream)>>,
    pub(super) waker: Waker,
    /// The receive thread's kernel thread id, once it started (tests).
    pub(super) tid: AtomicU64,
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
pub(super) fn start_receiver(
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
