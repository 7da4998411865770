//! The receive side: one thread per node (`ductile-tcp-rx`) that accepts
//! peers, and the reading of every incoming, authenticated connection.
//! Small frames are parsed out of a per-connection staging buffer (one
//! `read` for many frames); a large one is read straight into the buffer
//! handed to the runtime.
//!
//! The connections are watched by an epoll set of their own ([`Conns`]),
//! read by whoever holds it: a PE of the node while it spins
//! (`DUCTILE_TCP_PROGRESS=pe`, the default: [`RxShared::progress`]), so a
//! frame that arrives for a waiting PE costs no thread hop and no wake-up;
//! otherwise the receive thread, whose own epoll set holds the
//! connections' set. While PEs hold them the thread leaves them alone and
//! dozes ([`Handback`]); it takes them back within its doze once no PE
//! spins, so a PE that stops to run a message and spins again costs no
//! system call. When nothing arrives the thread blocks in epoll, after an
//! optional bounded spin (`DUCTILE_TCP_SPIN_US`).

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ductile_coordinator::secret::Secret;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use tracing::{debug, error, warn};

use super::handshake::accept_handshake;
use super::{io_err, KIND_BYE, MAX_FRAME};
use crate::transport::handback::{Handback, HANDBACK_NAP};
use crate::transport::{current_tid, Sink, Tag, TransportError};

/// Who reads the connections while a PE of the node spins
/// (`DUCTILE_TCP_PROGRESS`, measured in docs/message-path.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Progress {
    /// `thread`: always the receive thread; a frame reaches its PE through
    /// the PE's inbox, waking the PE if it sleeps.
    Thread,
    /// `pe` (default): a spinning PE reads them itself, delivering to its
    /// own inbox (and to the others', waking those that sleep); the
    /// receive thread reads them while no PE spins.
    Pe,
}

impl Progress {
    fn from_env() -> Result<Progress, TransportError> {
        match std::env::var("DUCTILE_TCP_PROGRESS").ok().as_deref() {
            None | Some("") | Some("pe") => Ok(Progress::Pe),
            Some("thread") => Ok(Progress::Thread),
            Some(other) => Err(TransportError::Io {
                context: "DUCTILE_TCP_PROGRESS".into(),
                source: io::Error::other(format!(
                    "`{other}` is not a progress mode (pe or thread)"
                )),
            }),
        }
    }
}

/// The receive side of one node's transport.
pub(super) struct RxShared {
    /// Set by `shutdown`: connections that end are no longer losses.
    pub(super) closing: Arc<AtomicBool>,
    /// Set when the transport is dropped: the receive thread ends.
    pub(super) stop: AtomicBool,
    /// Authenticated connections the handshake threads hand over.
    pub(super) handed: Mutex<Vec<(u64, TcpStream)>>,
    /// Who holds the connections, and the receive thread's wake-ups (its
    /// eventfd is in the thread's epoll set as [`WAKER`]).
    pub(super) handback: Handback,
    /// The receive thread's kernel thread id, once it started (tests).
    pub(super) tid: AtomicU64,
    /// The incoming connections: whoever reads them holds this for the
    /// call, so frames of a connection are delivered in order.
    conns: Mutex<Conns>,
    /// The connections' epoll set, for a PE to sleep on
    /// ([`RxShared::wait_fd`]); it is in the receive thread's set too.
    conns_wait: OwnedFd,
    progress: Progress,
    sink: Arc<dyn Sink>,
}

/// The incoming connections and the epoll set that watches them.
struct Conns {
    poll: Poll,
    events: Events,
    by_token: HashMap<Token, Conn>,
    next_token: usize,
}

/// Tokens of the receive thread's epoll set (the connections' set numbers
/// its connections from 0).
const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const CONNS: Token = Token(2);

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

/// The receive thread's longest doze while PEs hold the connections: a
/// hand-back that no PE announces (it stopped while the thread dozed
/// short) waits at most [`HANDBACK_NAP`]; this bounds one that should have
/// been announced and was not.
#[cfg(not(test))]
const DOZE_MAX: Duration = Duration::from_millis(50);
/// In the unit tests far longer than what they wait for a frame, so a
/// hand-back that does not wake the thread fails them.
#[cfg(test)]
const DOZE_MAX: Duration = Duration::from_secs(30);

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

    /// Reads everything the socket holds (the registration is
    /// edge-triggered). A read that comes back short of the room it was
    /// given has emptied the socket (epoll(7), on stream sockets): what
    /// arrives after it raises a new edge, so no read is spent to hear
    /// `EAGAIN` (one system call per message saved).
    fn on_readable(&mut self, sink: &dyn Sink) -> Result<ConnState, String> {
        let mut drained = false;
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
            if drained {
                return Ok(ConnState::Open);
            }
            if self.big.is_some() {
                continue;
            }
            let room = STAGE - self.end;
            match (&self.stream).read(&mut self.stage[self.end..]) {
                Ok(0) if self.end > self.start => {
                    return Err("connection ended inside a frame".into())
                }
                Ok(0) => return Err("connection ended: no BYE".into()),
                Ok(n) => {
                    self.end += n;
                    drained = n < room;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(ConnState::Open),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("connection ended: {e}")),
            }
        }
    }
}

/// Starts the receive thread: it accepts peers (their handshakes on
/// short-lived threads of their own) and reads every authenticated
/// connection, from the connections' epoll set nested in its own.
pub(super) fn start_receiver(
    listener: TcpListener,
    secret: Secret,
    sink: Arc<dyn Sink>,
    closing: Arc<AtomicBool>,
) -> Result<Arc<RxShared>, TransportError> {
    listener
        .set_nonblocking(true)
        .map_err(io_err("making the listener non-blocking"))?;
    let progress = Progress::from_env()?;
    let poll = Poll::new().map_err(io_err("creating the epoll set"))?;
    let handback = Handback::new().map_err(io_err("creating the receive thread's eventfd"))?;
    poll.registry()
        .register(
            &mut SourceFd(&handback.own_fd().as_raw_fd()),
            WAKER,
            Interest::READABLE,
        )
        .map_err(io_err("watching the receive thread's eventfd"))?;
    poll.registry()
        .register(
            &mut SourceFd(&listener.as_raw_fd()),
            LISTENER,
            Interest::READABLE,
        )
        .map_err(io_err("watching the listener"))?;
    let conns = Conns::new().map_err(io_err("creating the connections' epoll set"))?;
    let conns_fd = conns.poll.as_raw_fd();
    let conns_wait = conns
        .poll
        .registry()
        .as_fd()
        .try_clone_to_owned()
        .map_err(io_err("sharing the connections' epoll set"))?;
    poll.registry()
        .register(&mut SourceFd(&conns_fd), CONNS, Interest::READABLE)
        .map_err(io_err("watching the connections' epoll set"))?;
    let rx = Arc::new(RxShared {
        closing,
        stop: AtomicBool::new(false),
        handed: Mutex::new(Vec::new()),
        handback,
        tid: AtomicU64::new(0),
        conns: Mutex::new(conns),
        conns_wait,
        progress,
        sink,
    });
    let shared = rx.clone();
    std::thread::Builder::new()
        .name("ductile-tcp-rx".into())
        .spawn(move || receive_loop(poll, listener, secret, shared))
        .map_err(io_err("starting the receive thread"))?;
    Ok(rx)
}

impl RxShared {
    /// Reads what the connections hold now, if no one else is reading
    /// them: a spinning PE's progress ([`Transport::poll`](crate::transport::Transport::poll)).
    /// True when a connection had something.
    pub(super) fn progress(&self) -> bool {
        if self.progress != Progress::Pe {
            return false;
        }
        match self.conns.try_lock() {
            Ok(mut conns) => conns.read_ready(&*self.sink, &self.closing),
            Err(_) => false,
        }
    }

    /// The connections' epoll set, readable while a connection has
    /// something to read: what a PE that spins sleeps on once its spin is
    /// over (the set is then out of the receive thread's, so the frame wakes
    /// the PE alone). None in `thread` mode.
    pub(super) fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        (self.progress == Progress::Pe).then(|| self.conns_wait.as_fd())
    }

    /// A PE of this node starts (`true`) or stops spinning. While any
    /// spins, the connections are the PEs': the receive thread neither
    /// reads nor watches them (on two cores its wake-up cost more than the
    /// frame), and takes them back within its doze once none spins
    /// ([`Handback`]). An atomic count, no system call: a PE that stops to
    /// run a message and spins again costs nothing here.
    pub(super) fn pe_spinning(&self, spinning: bool) {
        if self.progress == Progress::Pe {
            self.handback.pe_spinning(spinning);
        }
    }

    /// A spinning PE is about to sleep: whether it keeps the connections
    /// ([`Handback::pe_sleeps`]).
    pub(super) fn pe_sleeps(&self) -> bool {
        self.progress != Progress::Pe || self.handback.pe_sleeps()
    }

    /// Watches the connections the handshake threads handed over.
    fn adopt_handed(&self) {
        let handed = std::mem::take(&mut *self.handed.lock().expect("handover poisoned"));
        if !handed.is_empty() {
            let mut conns = self.conns.lock().expect("connections poisoned");
            conns.adopt(handed, &*self.sink, &self.closing);
        }
    }

    /// Reads what the connections hold now (the receive thread).
    fn read_all(&self) {
        let mut conns = self.conns.lock().expect("connections poisoned");
        conns.read_ready(&*self.sink, &self.closing);
    }
}

impl Conns {
    fn new() -> io::Result<Conns> {
        Ok(Conns {
            poll: Poll::new()?,
            events: Events::with_capacity(64),
            by_token: HashMap::new(),
            next_token: 0,
        })
    }

    /// Watches the authenticated connections the handshakes handed over,
    /// and reads what they already hold.
    fn adopt(&mut self, handed: Vec<(u64, TcpStream)>, sink: &dyn Sink, closing: &AtomicBool) {
        for (uid, stream) in handed {
            let token = Token(self.next_token);
            self.next_token += 1;
            let registered = stream.set_nonblocking(true).and_then(|()| {
                self.poll.registry().register(
                    &mut SourceFd(&stream.as_raw_fd()),
                    token,
                    Interest::READABLE,
                )
            });
            if let Err(e) = registered {
                error!("cannot watch the connection of peer {uid}: {e}");
                continue;
            }
            let mut conn = Conn::new(stream, uid);
            // Frames may have arrived before registration: epoll reports a
            // socket that is already readable, but read now anyway so none
            // waits for the next.
            match conn.on_readable(sink) {
                Ok(ConnState::Open) => {
                    self.by_token.insert(token, conn);
                }
                Ok(ConnState::Bye) => self.forget(conn, None, sink, closing),
                Err(reason) => self.forget(conn, Some(reason), sink, closing),
            }
        }
    }

    /// Reads every connection epoll reports readable, until none is (the
    /// registrations are edge-triggered: an event taken is read to the
    /// end). True when there was any.
    fn read_ready(&mut self, sink: &dyn Sink, closing: &AtomicBool) -> bool {
        let mut any = false;
        loop {
            if let Err(e) = self.poll.poll(&mut self.events, Some(Duration::ZERO)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    error!("polling the TCP connections failed: {e}");
                    return any;
                }
                continue;
            }
            let mut taken = 0;
            let mut ended: Vec<(Token, Option<String>)> = Vec::new();
            for ev in self.events.iter() {
                taken += 1;
                let token = ev.token();
                if let Some(conn) = self.by_token.get_mut(&token) {
                    match conn.on_readable(sink) {
                        Ok(ConnState::Open) => {}
                        Ok(ConnState::Bye) => ended.push((token, None)),
                        Err(reason) => ended.push((token, Some(reason))),
                    }
                }
            }
            for (token, reason) in ended {
                if let Some(conn) = self.by_token.remove(&token) {
                    self.forget(conn, reason, sink, closing);
                }
            }
            any |= taken > 0;
            if taken < self.events.capacity() {
                return any;
            }
        }
    }

    /// Stops watching a connection that ended; one that ended without a
    /// BYE (`reason`) is a lost peer, unless the transport is closing.
    fn forget(
        &mut self,
        conn: Conn,
        reason: Option<String>,
        sink: &dyn Sink,
        closing: &AtomicBool,
    ) {
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&conn.stream.as_raw_fd()));
        if let Some(reason) = reason {
            if !closing.load(Ordering::SeqCst) {
                sink.lost(conn.uid, reason);
            }
        }
    }
}

fn receive_loop(mut poll: Poll, listener: TcpListener, secret: Secret, rx: Arc<RxShared>) {
    rx.tid.store(current_tid(), Ordering::SeqCst);
    let spin = spin_from_env();
    let mut events = Events::with_capacity(8);
    let mut active_at = Instant::now();
    // While PEs hold the connections: the turns last seen, and the last doze.
    let (mut turns, mut nap) = (u64::MAX, HANDBACK_NAP);
    // The PEs held the connections since the thread last read them: what
    // arrived meanwhile may be waiting with no event left to announce it
    // (the connections' set is in this thread's set edge-triggered).
    let mut held = false;
    loop {
        if rx.stop.load(Ordering::SeqCst) {
            return;
        }
        if rx.handback.pes_progress() {
            // The PEs read; the thread only adopts and accepts peers (a
            // newcomer's connection must not wait for the PEs to stop).
            held = true;
            nap = rx.handback.next_nap(&mut turns, nap, DOZE_MAX);
            rx.handback.doze(nap, Some(listener.as_fd()));
            rx.adopt_handed();
            accept_all(&listener, &secret, &rx);
            continue;
        }
        turns = u64::MAX;
        if std::mem::take(&mut held) {
            rx.read_all();
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
        for ev in events.iter() {
            match ev.token() {
                LISTENER => accept_all(&listener, &secret, &rx),
                WAKER => {
                    rx.handback.drain();
                    rx.adopt_handed();
                }
                // A PE started spinning since: the frame is its to read.
                CONNS if rx.handback.pes_progress() => held = true,
                CONNS => rx.read_all(),
                _ => {}
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
                        rx.handback.wake();
                    }
                    Err(e) => warn!("refused a connection from {peer}: {e}"),
                }
            });
        if let Err(e) = spawned {
            error!("cannot start a handshake thread: {e}");
        }
    }
}
