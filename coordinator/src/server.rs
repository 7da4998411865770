//! The thin tokio layer that drives the sans-IO [`Coordinator`] over TCP.
//!
//! One task owns the state machine; each connection has a reader task (bytes
//! in, as events on a bounded channel, so a flooding peer is back-pressured)
//! and a writer task (encoded frames out). `Action::Close` lets the writer flush
//! what was queued, then half-closes; the reader keeps draining briefly so the
//! peer reads the last error frame rather than a connection reset.
//!
//! What a peer without the job secret can hold is bounded, whatever it does:
//! at most [`MAX_UNAUTHENTICATED`] such connections exist at once (their
//! closing drains included), each may send [`UNAUTHENTICATED_BYTES`] and has
//! the core's `hello_timeout` in total to prove the secret. When that budget
//! is full, a new connection takes the slot of the oldest stranger (closed
//! without a word, and closed before the next connection is accepted: an
//! aborted task lets go of its socket only when the runtime next polls it,
//! and a fast flood otherwise outran that): a flood of idle connections
//! then churns through the budget instead of holding it, and a node that connects during the flood
//! gets its round trip to authenticate (the client dials again if it was
//! pushed out before its `Welcome`). Authenticated connections (members,
//! newcomers, tools) never count against that budget; every connection
//! counts against [`MAX_CONNECTIONS`], so the process's descriptors are
//! bounded. An idle reader holds no buffer (it waits for readability first).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};
use tracing::{debug, info, warn};

use crate::core::{Action, ConnId, Coordinator};
use crate::proto::{encode, ServerMsg};

/// Configuration of a served coordinator: the same as the state machine's.
pub type ServerConfig = crate::core::Config;

/// How long a closed authenticated connection keeps draining input so its
/// peer sees our last frame.
const CLOSE_DRAIN: Duration = Duration::from_secs(2);
/// The same for a connection that never authenticated (it holds a slot of
/// the strangers' budget meanwhile).
const STRANGER_DRAIN: Duration = Duration::from_millis(250);
/// Connections held at once, authenticated or not (closing ones included);
/// beyond this a new one is closed at accept. A job has far fewer nodes.
pub const MAX_CONNECTIONS: usize = 4096;
/// Connections that have not proved the job secret (closing ones included):
/// a flood of strangers is served from this budget only.
pub const MAX_UNAUTHENTICATED: usize = 64;
/// Bytes a peer may send before it has proved the secret (a `Hello` frame is
/// about 60); past it the connection is closed.
pub const UNAUTHENTICATED_BYTES: usize = 4096;
/// How long the server waits for queued frames to flush when the job finishes.
const FINISH_FLUSH: Duration = Duration::from_secs(5);

/// Why the server stopped without a job exit code.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {error}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        error: std::io::Error,
    },
    /// The address file could not be written.
    #[error("cannot write the address file {path}: {error}")]
    AddrFile {
        /// The path.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// The tokio runtime could not be built, or the listener failed.
    #[error("coordinator I/O failure: {0}")]
    Io(#[from] std::io::Error),
    /// The launch (or recovery) did not complete in time.
    #[error("{0}")]
    LaunchTimeout(String),
    /// The job started, then no member stayed connected for the idle
    /// timeout: its nodes are gone ([`crate::core::EXIT_NO_MEMBERS`]).
    #[error("{0}")]
    NoMembers(String),
}

/// Result alias for this module.
pub type Result<T, E = ServerError> = std::result::Result<T, E>;

enum Event {
    Bytes(ConnId, Vec<u8>),
    Closed(ConnId),
}

/// A connection the state machine knows.
struct ConnIo {
    writer: mpsc::UnboundedSender<Vec<u8>>,
    /// `Some(d)`: close, draining input for at most `d`.
    closed: watch::Sender<Option<Duration>>,
}

/// A connection whose socket is still open (known to the state machine, or
/// closing): what its budgets count.
struct Open {
    reader: AbortHandle,
    writer: AbortHandle,
    /// Held by the reader and the writer: alive while either holds a half
    /// of the socket, which is open until both are dropped.
    socket: Weak<()>,
    /// Bytes received so far while unauthenticated; `None` once welcomed.
    stranger: Option<usize>,
}

/// The budgets of open connections, in the order they were accepted.
#[derive(Default)]
struct Budget {
    open: BTreeMap<ConnId, Open>,
    strangers: BTreeSet<ConnId>,
    turned_away: u64,
    pushed_out: u64,
    /// Sockets whose tasks were aborted and are not dropped yet (an abort
    /// takes effect when the runtime next polls the task), with when.
    closing: Vec<(Weak<()>, std::time::Instant)>,
}

/// How long the accept loop waits for an aborted connection's socket to
/// close before it accepts again regardless.
const CLOSE_WAIT: Duration = Duration::from_millis(100);

impl Budget {
    /// Forgets `id` and closes its socket at once (no flush, no drain).
    fn drop_now(&mut self, id: ConnId) {
        if let Some(o) = self.open.remove(&id) {
            o.reader.abort();
            o.writer.abort();
            self.closing.push((o.socket, std::time::Instant::now()));
        }
        self.strangers.remove(&id);
    }

    /// The reader of `id` ended: the socket is closed or about to be.
    fn ended(&mut self, id: ConnId) {
        if let Some(o) = self.open.remove(&id) {
            o.writer.abort();
            self.closing.push((o.socket, std::time::Instant::now()));
        }
        self.strangers.remove(&id);
    }

    /// Whether every socket aborted before is closed (or waited for past
    /// [`CLOSE_WAIT`]): only then is another accepted, so the descriptors
    /// of strangers stay within the budget, one more at most, however fast
    /// they come.
    fn sockets_closed(&mut self) -> bool {
        self.closing
            .retain(|(socket, since)| socket.strong_count() > 0 && since.elapsed() < CLOSE_WAIT);
        self.closing.is_empty()
    }

    fn welcomed(&mut self, id: ConnId) {
        if let Some(o) = self.open.get_mut(&id) {
            o.stranger = None;
        }
        self.strangers.remove(&id);
    }

    fn is_stranger(&self, id: ConnId) -> bool {
        self.strangers.contains(&id)
    }

    /// Counts `n` bytes from `id`; false when a stranger went past its allowance.
    fn received(&mut self, id: ConnId, n: usize) -> bool {
        match self.open.get_mut(&id).and_then(|o| o.stranger.as_mut()) {
            Some(bytes) => {
                *bytes += n;
                *bytes <= UNAUTHENTICATED_BYTES
            }
            None => true,
        }
    }
}

async fn read_loop(
    id: ConnId,
    rd: OwnedReadHalf,
    events: mpsc::Sender<Event>,
    mut closed: watch::Receiver<Option<Duration>>,
    ended: mpsc::UnboundedSender<ConnId>,
    _socket: Arc<()>,
) {
    let drain = loop {
        tokio::select! {
            r = rd.readable() => {
                let got = match r {
                    Ok(()) => read_some(&rd),
                    Err(e) => Err(e),
                };
                match got {
                    Ok(None) => {}
                    Ok(Some(bytes)) if !bytes.is_empty() => {
                        if events.send(Event::Bytes(id, bytes)).await.is_err() {
                            break None;
                        }
                    }
                    Ok(Some(_)) | Err(_) => {
                        let _ = events.send(Event::Closed(id)).await;
                        break None;
                    }
                }
            },
            r = closed.changed() => break if r.is_ok() { *closed.borrow() } else { None },
        }
    };
    if let Some(limit) = drain {
        let drain = async {
            while rd.readable().await.is_ok() {
                match read_some(&rd) {
                    Ok(None) => {}
                    Ok(Some(bytes)) if !bytes.is_empty() => {}
                    Ok(Some(_)) | Err(_) => break,
                }
            }
        };
        let _ = tokio::time::timeout(limit, drain).await;
    }
    let _ = ended.send(id);
}

/// What is readable now: `Ok(None)` if nothing after all, empty at end of
/// input. The buffer lives only for this call, so an idle connection holds none.
fn read_some(rd: &OwnedReadHalf) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = [0u8; 16 * 1024];
    match rd.try_read(&mut buf) {
        Ok(n) => Ok(Some(buf[..n].to_vec())),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut frames: mpsc::UnboundedReceiver<Vec<u8>>,
    _socket: Arc<()>,
) {
    while let Some(frame) = frames.recv().await {
        if wr.write_all(&frame).await.is_err() {
            return;
        }
    }
    let _ = wr.shutdown().await;
}

/// Serves one job's coordinator on `listener` until the shutdown barrier passes
/// (returns the job's exit code) or the launch times out (returns
/// [`ServerError::LaunchTimeout`]).
pub async fn serve(listener: TcpListener, cfg: ServerConfig) -> Result<i32> {
    let mut core = Coordinator::new(cfg, StdRng::from_entropy());
    let (ev_tx, mut ev_rx) = mpsc::channel::<Event>(1024);
    let (ended_tx, mut ended_rx) = mpsc::unbounded_channel::<ConnId>();
    let mut conns: HashMap<ConnId, ConnIo> = HashMap::new();
    let mut budget = Budget::default();
    let mut writers = JoinSet::new();
    let mut next_id = 0u64;
    let mut actions = core.on_tick(std::time::Instant::now());
    let code = 'serve: loop {
        for action in actions.drain(..) {
            match action {
                Action::Send(id, msg) => {
                    if matches!(msg, ServerMsg::Welcome) {
                        budget.welcomed(id);
                    }
                    if let Some(c) = conns.get(&id) {
                        let _ = c.writer.send(encode(&msg));
                    }
                }
                Action::Close(id) => {
                    if let Some(c) = conns.remove(&id) {
                        let drain = if budget.is_stranger(id) {
                            STRANGER_DRAIN
                        } else {
                            CLOSE_DRAIN
                        };
                        let _ = c.closed.send(Some(drain));
                    }
                }
                Action::Finished { code } => break 'serve code,
            }
        }
        let deadline = core.next_deadline();
        let timer = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
                None => std::future::pending().await,
            }
        };
        let may_accept = budget.sockets_closed();
        tokio::select! {
            accepted = listener.accept(), if may_accept => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // Typically EMFILE: back off instead of spinning.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if budget.open.len() >= MAX_CONNECTIONS {
                    budget.turned_away += 1;
                    if budget.turned_away.is_power_of_two() {
                        warn!(%peer, turned_away = budget.turned_away, max = MAX_CONNECTIONS,
                            "connection limit reached; closing new connections");
                    }
                    continue;
                }
                let now = std::time::Instant::now();
                actions = Vec::new();
                if budget.strangers.len() >= MAX_UNAUTHENTICATED {
                    // The oldest stranger makes room: it had the longest to
                    // prove the secret.
                    if let Some(&oldest) = budget.strangers.first() {
                        budget.drop_now(oldest);
                        if conns.remove(&oldest).is_some() {
                            actions.extend(core.on_disconnect(oldest, now));
                        }
                        budget.pushed_out += 1;
                        if budget.pushed_out.is_power_of_two() {
                            warn!(pushed_out = budget.pushed_out, max = MAX_UNAUTHENTICATED,
                                "unauthenticated connections over budget; closing the oldest");
                        }
                    }
                }
                let _ = stream.set_nodelay(true);
                let id = ConnId(next_id);
                next_id += 1;
                debug!(conn = id.0, %peer, "connection accepted");
                let (rd, wr) = stream.into_split();
                let (wtx, wrx) = mpsc::unbounded_channel();
                let (ctx, crx) = watch::channel(None);
                let held = Arc::new(());
                let socket = Arc::downgrade(&held);
                let writer = writers.spawn(write_loop(wr, wrx, held.clone()));
                let read = read_loop(id, rd, ev_tx.clone(), crx, ended_tx.clone(), held);
                let reader = tokio::spawn(read).abort_handle();
                budget.open.insert(id, Open { reader, writer, socket, stranger: Some(0) });
                budget.strangers.insert(id);
                conns.insert(id, ConnIo { writer: wtx, closed: ctx });
                actions.extend(core.on_connect(id, now));
            }
            Some(event) = ev_rx.recv() => {
                let now = std::time::Instant::now();
                actions = match event {
                    Event::Bytes(id, bytes) if conns.contains_key(&id) => {
                        if budget.received(id, bytes.len()) {
                            core.on_frame(id, &bytes, now)
                        } else {
                            debug!(conn = id.0, "unauthenticated peer sent too much; closing");
                            budget.drop_now(id);
                            conns.remove(&id);
                            core.on_disconnect(id, now)
                        }
                    }
                    Event::Closed(id) if conns.remove(&id).is_some() => {
                        debug!(conn = id.0, "connection closed by peer");
                        core.on_disconnect(id, now)
                    }
                    _ => Vec::new(),
                };
            }
            Some(id) = ended_rx.recv() => {
                budget.ended(id);
                actions = Vec::new();
            }
            Some(_) = writers.join_next(), if !writers.is_empty() => {
                actions = Vec::new();
            }
            // An aborted socket's tasks are dropped by the runtime: let it
            // run them, then look again.
            () = tokio::task::yield_now(), if !may_accept => {
                actions = Vec::new();
            }
            () = timer => {
                actions = core.on_tick(std::time::Instant::now());
            }
        }
    };
    for (_, c) in conns.drain() {
        let _ = c.closed.send(Some(CLOSE_DRAIN));
    }
    let flushed = tokio::time::timeout(FINISH_FLUSH, async {
        while writers.join_next().await.is_some() {}
    })
    .await;
    if flushed.is_err() {
        warn!("some connections did not take their last frames in time");
    }
    match core.failure() {
        Some(reason) if code == crate::core::EXIT_NO_MEMBERS => {
            Err(ServerError::NoMembers(reason.to_owned()))
        }
        Some(reason) => Err(ServerError::LaunchTimeout(reason.to_owned())),
        None => {
            info!(code, "coordinator finished");
            Ok(code)
        }
    }
}

/// Writes `addr` to `path` atomically (temporary file in the same folder, then rename),
/// so a reader never sees a partial address.
pub fn write_addr_file(path: &Path, addr: SocketAddr) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "addr".to_owned());
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let err = |error| ServerError::AddrFile {
        path: path.to_owned(),
        error,
    };
    std::fs::write(&tmp, format!("{addr}\n")).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(|error| {
        let _ = std::fs::remove_file(&tmp);
        err(error)
    })
}

/// Blocking entry point: builds a tokio runtime, binds `listen`, writes the
/// bound address to `addr_file` (atomically) and calls `on_bound` with it, then
/// serves until the job finishes. Returns the job's exit code.
pub fn run_with(
    cfg: ServerConfig,
    listen: SocketAddr,
    addr_file: Option<&Path>,
    on_bound: impl FnOnce(SocketAddr),
) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|error| ServerError::Bind {
                addr: listen,
                error,
            })?;
        let addr = listener.local_addr()?;
        info!(%addr, expected = ?cfg.expected, "coordinator listening");
        if let Some(path) = addr_file {
            write_addr_file(path, addr)?;
        }
        on_bound(addr);
        serve(listener, cfg).await
    })
}

/// Blocking entry point without a callback; see [`run_with`].
pub fn run(cfg: ServerConfig, listen: SocketAddr, addr_file: Option<PathBuf>) -> Result<i32> {
    run_with(cfg, listen, addr_file.as_deref(), |_| {})
}

/// A coordinator served on a thread of its own, for tests and for programs
/// that embed one: [`Background::abort`] stops it the way a crash would, so
/// clients can be tested against a coordinator that goes away and comes back
/// (in recovery mode, on the same address).
#[derive(Debug)]
pub struct Background {
    addr: SocketAddr,
    abort: Option<tokio::sync::oneshot::Sender<()>>,
    done: std::sync::mpsc::Receiver<Result<i32>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    /// Binds `listen` (port 0 picks one) and serves `cfg` on a new thread.
    pub fn start(cfg: ServerConfig, listen: SocketAddr) -> Result<Background> {
        let (bound_tx, bound_rx) = std::sync::mpsc::channel::<Result<SocketAddr>>();
        let (done_tx, done) = std::sync::mpsc::channel();
        let (abort, aborted) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ductile-coordinator".to_owned())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = bound_tx.send(Err(e.into()));
                        return;
                    }
                };
                rt.block_on(async move {
                    let listener = match TcpListener::bind(listen).await {
                        Ok(l) => l,
                        Err(error) => {
                            let _ = bound_tx.send(Err(ServerError::Bind {
                                addr: listen,
                                error,
                            }));
                            return;
                        }
                    };
                    let _ = bound_tx.send(listener.local_addr().map_err(ServerError::Io));
                    tokio::select! {
                        result = serve(listener, cfg) => {
                            let _ = done_tx.send(result);
                        }
                        _ = aborted => debug!("coordinator aborted"),
                    }
                });
                // Dropping the runtime drops every connection task: the
                // clients see their connections end, as after a crash.
            })?;
        let addr = bound_rx
            .recv()
            .map_err(|_| ServerError::Io(std::io::Error::other("coordinator thread ended")))??;
        Ok(Background {
            addr,
            abort: Some(abort),
            done,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits up to `timeout` for the job to finish; `None` if it has not.
    pub fn wait(&self, timeout: Duration) -> Option<Result<i32>> {
        self.done.recv_timeout(timeout).ok()
    }

    /// Stops at once without a word to anyone, as a crash would, and waits
    /// until every connection and the listener are closed.
    pub fn abort(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(abort) = self.abort.take() {
            let _ = abort.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}
