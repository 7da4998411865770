//! The thin tokio layer that drives the sans-IO [`Coordinator`] over TCP.
//!
//! One task owns the state machine; each connection has a reader task (bytes
//! in, as events on a bounded channel, so a flooding peer is back-pressured)
//! and a writer task (encoded frames out). `Action::Close` lets the writer flush
//! what was queued, then half-closes; the reader keeps draining briefly so the
//! peer reads the last error frame rather than a connection reset.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::core::{Action, ConnId, Coordinator};
use crate::proto::encode;

/// Configuration of a served coordinator: the same as the state machine's.
pub type ServerConfig = crate::core::Config;

/// How long a closed connection keeps draining input so its peer sees our last frame.
const CLOSE_DRAIN: Duration = Duration::from_secs(2);
/// Connections beyond this are dropped at accept (a job has far fewer nodes).
pub const MAX_CONNECTIONS: usize = 4096;
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

struct ConnIo {
    writer: mpsc::UnboundedSender<Vec<u8>>,
    closed: watch::Sender<bool>,
}

async fn read_loop(
    id: ConnId,
    mut rd: OwnedReadHalf,
    events: mpsc::Sender<Event>,
    mut closed: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            r = rd.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    let _ = events.send(Event::Closed(id)).await;
                    return;
                }
                Ok(n) => {
                    if events.send(Event::Bytes(id, buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            },
            _ = closed.changed() => break,
        }
    }
    let drain = async {
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(CLOSE_DRAIN, drain).await;
}

async fn write_loop(mut wr: OwnedWriteHalf, mut frames: mpsc::UnboundedReceiver<Vec<u8>>) {
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
    let mut conns: HashMap<ConnId, ConnIo> = HashMap::new();
    let mut writers = JoinSet::new();
    let mut next_id = 0u64;
    let mut actions = core.on_tick(std::time::Instant::now());
    let code = 'serve: loop {
        for action in actions.drain(..) {
            match action {
                Action::Send(id, msg) => {
                    if let Some(c) = conns.get(&id) {
                        let _ = c.writer.send(encode(&msg));
                    }
                }
                Action::Close(id) => {
                    if let Some(c) = conns.remove(&id) {
                        let _ = c.closed.send(true);
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
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // Typically EMFILE: back off instead of spinning.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if conns.len() >= MAX_CONNECTIONS {
                    warn!(%peer, "connection limit reached; dropping the new connection");
                    continue;
                }
                let _ = stream.set_nodelay(true);
                let id = ConnId(next_id);
                next_id += 1;
                debug!(conn = id.0, %peer, "connection accepted");
                let (rd, wr) = stream.into_split();
                let (wtx, wrx) = mpsc::unbounded_channel();
                let (ctx, crx) = watch::channel(false);
                writers.spawn(write_loop(wr, wrx));
                tokio::spawn(read_loop(id, rd, ev_tx.clone(), crx));
                conns.insert(id, ConnIo { writer: wtx, closed: ctx });
                actions = core.on_connect(id, std::time::Instant::now());
            }
            Some(event) = ev_rx.recv() => {
                let now = std::time::Instant::now();
                actions = match event {
                    Event::Bytes(id, bytes) if conns.contains_key(&id) => core.on_frame(id, &bytes, now),
                    Event::Closed(id) if conns.remove(&id).is_some() => {
                        debug!(conn = id.0, "connection closed by peer");
                        core.on_disconnect(id, now)
                    }
                    _ => Vec::new(),
                };
            }
            () = timer => {
                actions = core.on_tick(std::time::Instant::now());
            }
        }
    };
    for (_, c) in conns.drain() {
        let _ = c.closed.send(true);
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
