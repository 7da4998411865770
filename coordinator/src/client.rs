//! Blocking coordinator client for node processes (std::net, no async runtime).
//!
//! `Client::connect` authenticates; a background reader thread then decodes the
//! server's messages and sorts them in two channels:
//!
//! * replies to this client's requests (`Start`, `Waiting`, `Pending`,
//!   `Committed`, `ShutdownDone`, `CurrentView`, `Error`), consumed by the
//!   request helpers (`register`, `commit`, ...);
//! * unsolicited notices (`Integrate`, `Die`, `ViewUpdate`, `MemberLost`),
//!   exposed by [`Client::events`], so a helper waiting for its reply never
//!   swallows a notice the runtime must see.
//!
//! [`Client::recv_timeout`] takes from both. Every wait has a timeout.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use tracing::debug;

use crate::proto::{
    encode, Admitted, ClientMsg, Epoch, ErrorCode, FrameError, FrameReader, NodeId, PendingNewcomer,
    Registration, ServerMsg, View, PROTOCOL_VERSION,
};
use crate::secret::{Secret, AUTH_CONTEXT};

/// What went wrong talking to the coordinator.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address did not resolve.
    #[error("cannot resolve coordinator address {addr}: {error}")]
    Resolve {
        /// The address as given.
        addr: String,
        /// The cause.
        error: std::io::Error,
    },
    /// A socket error.
    #[error("coordinator connection I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// No answer in time.
    #[error("timed out waiting for the coordinator")]
    Timeout,
    /// The connection is closed.
    #[error("the coordinator connection is closed")]
    Disconnected,
    /// The coordinator refused a request.
    #[error("coordinator refused: {code:?}: {message}")]
    Server {
        /// Error class.
        code: ErrorCode,
        /// Explanation from the server.
        message: String,
    },
    /// The server sent bytes that are not a valid frame.
    #[error("bad frame from the coordinator: {0}")]
    Frame(#[from] FrameError),
    /// A message that makes no sense at this point of the protocol.
    #[error("unexpected message from the coordinator: {0}")]
    Unexpected(String),
}

/// Result alias for this module.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// The coordinator's answer to a registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// A launch member: node `node` of `view` (epoch 1).
    Member {
        /// Node id.
        node: NodeId,
        /// The launch view.
        view: View,
    },
    /// A newcomer queued for admission; `Integrate` arrives later on [`Client::events`].
    Waiting {
        /// Its uid.
        uid: u64,
        /// The current view (for speculative endpoints).
        view: View,
    },
}

/// A blocking, authenticated connection to a job's coordinator.
#[derive(Debug)]
pub struct Client {
    writer: Mutex<TcpStream>,
    replies: Receiver<ServerMsg>,
    events: Receiver<ServerMsg>,
    reader: Option<JoinHandle<()>>,
    peer: SocketAddr,
    /// Set by the reader thread when the connection ended.
    closed: Arc<AtomicBool>,
}

fn remaining(deadline: Instant) -> Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(ClientError::Timeout)
    } else {
        Ok(left)
    }
}

/// Reads one message before the reader thread exists (the handshake).
fn read_msg(
    stream: &mut TcpStream,
    reader: &mut FrameReader,
    deadline: Instant,
) -> Result<ServerMsg> {
    let mut buf = [0u8; 4096];
    loop {
        if let Some(msg) = reader.next_msg::<ServerMsg>()? {
            return Ok(msg);
        }
        stream.set_read_timeout(Some(remaining(deadline)?))?;
        match stream.read(&mut buf) {
            Ok(0) => return Err(ClientError::Disconnected),
            Ok(n) => reader.push(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ClientError::Timeout)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether a handshake failed because the server closed an accepted
/// connection before `Welcome` (shed under load), not because it refused us.
fn pushed_out(e: &ClientError) -> bool {
    match e {
        ClientError::Disconnected => true,
        ClientError::Io(e) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

fn is_notice(msg: &ServerMsg) -> bool {
    matches!(
        msg,
        ServerMsg::Integrate { .. }
            | ServerMsg::Die { .. }
            | ServerMsg::ViewUpdate { .. }
            | ServerMsg::MemberLost { .. }
    )
}

fn reader_thread(
    stream: TcpStream,
    reader: FrameReader,
    replies: Sender<ServerMsg>,
    events: Sender<ServerMsg>,
    closed: Arc<AtomicBool>,
) {
    read_until_closed(stream, reader, replies, events);
    closed.store(true, Ordering::SeqCst);
}

fn read_until_closed(
    mut stream: TcpStream,
    mut reader: FrameReader,
    replies: Sender<ServerMsg>,
    events: Sender<ServerMsg>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        loop {
            match reader.next_msg::<ServerMsg>() {
                Ok(Some(msg)) => {
                    let target = if is_notice(&msg) { &events } else { &replies };
                    if target.send(msg).is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "bad frame from the coordinator; dropping the connection");
                    let _ = stream.shutdown(Shutdown::Both);
                    return;
                }
            }
        }
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => reader.push(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

impl Client {
    /// One dial and handshake, by `deadline`: the authenticated stream, the
    /// reader holding what came after `Welcome`, and the peer's address.
    fn handshake(
        addr: &str,
        secret: &Secret,
        deadline: Instant,
    ) -> Result<(TcpStream, FrameReader, SocketAddr)> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|error| ClientError::Resolve {
                addr: addr.to_owned(),
                error,
            })?
            .collect();
        let mut last_error = None;
        let mut stream = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, remaining(deadline)?) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last_error = Some(e),
            }
        }
        let mut stream = match (stream, last_error) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(e.into()),
            (None, None) => {
                let error = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
                return Err(ClientError::Resolve {
                    addr: addr.to_owned(),
                    error,
                });
            }
        };
        stream.set_nodelay(true)?;
        let peer = stream.peer_addr()?;
        let mut reader = FrameReader::new();
        let nonce = match read_msg(&mut stream, &mut reader, deadline)? {
            ServerMsg::Challenge {
                protocol: PROTOCOL_VERSION,
                nonce,
            } => nonce,
            ServerMsg::Challenge { protocol, .. } => {
                return Err(ClientError::Unexpected(format!(
                    "coordinator speaks protocol {protocol}, this client speaks {PROTOCOL_VERSION}"
                )))
            }
            ServerMsg::Error { code, message } => {
                return Err(ClientError::Server { code, message })
            }
            other => {
                return Err(ClientError::Unexpected(format!(
                    "{other:?} instead of Challenge"
                )))
            }
        };
        let proof = secret.proof(AUTH_CONTEXT, &nonce);
        stream.write_all(&encode(&ClientMsg::Hello {
            protocol: PROTOCOL_VERSION,
            proof,
        }))?;
        match read_msg(&mut stream, &mut reader, deadline)? {
            ServerMsg::Welcome => {}
            ServerMsg::Error { code, message } => {
                return Err(ClientError::Server { code, message })
            }
            other => {
                return Err(ClientError::Unexpected(format!(
                    "{other:?} instead of Welcome"
                )))
            }
        }
        Ok((stream, reader, peer))
    }

    /// Connects to `addr` (`host:port`) and authenticates with `secret`, all
    /// within `timeout`. A connection the coordinator closes before its
    /// `Welcome` (it sheds unauthenticated connections when strangers flood
    /// it) is dialled again, with a short backoff, until `timeout`; a refused
    /// connection or a refusal (wrong secret) is returned at once.
    pub fn connect(addr: &str, secret: &Secret, timeout: Duration) -> Result<Client> {
        let deadline = Instant::now() + timeout;
        let mut backoff = Duration::from_millis(10);
        let (stream, reader, peer) = loop {
            match Self::handshake(addr, secret, deadline) {
                Err(e) if pushed_out(&e) && Instant::now() + backoff < deadline => {
                    debug!(error = %e, "the coordinator closed the connection before Welcome; dialling again");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                other => break other?,
            }
        };
        stream.set_read_timeout(None)?;
        let (reply_tx, replies) = crossbeam_channel::unbounded();
        let (event_tx, events) = crossbeam_channel::unbounded();
        let read_half = stream.try_clone()?;
        let closed = Arc::new(AtomicBool::new(false));
        let reader_closed = Arc::clone(&closed);
        let reader = std::thread::Builder::new()
            .name("ductile-coord-client".to_owned())
            .spawn(move || reader_thread(read_half, reader, reply_tx, event_tx, reader_closed))?;
        debug!(%peer, "connected to coordinator");
        Ok(Client {
            writer: Mutex::new(stream),
            replies,
            events,
            reader: Some(reader),
            peer,
            closed,
        })
    }

    /// The coordinator's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Whether the connection has ended (the coordinator closed it, went
    /// away, or sent bytes that are not frames). Replies and notices read
    /// before the end can still be taken.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Sends one message.
    pub fn send(&self, msg: &ClientMsg) -> Result<()> {
        let frame = encode(msg);
        let mut w = self.writer.lock().map_err(|_| ClientError::Disconnected)?;
        w.write_all(&frame).map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                ClientError::Disconnected
            }
            _ => ClientError::Io(e),
        })
    }

    /// The next message of either kind (reply or notice); `Error` frames become
    /// [`ClientError::Server`].
    pub fn recv_timeout(&self, timeout: Duration) -> Result<ServerMsg> {
        let got = crossbeam_channel::select! {
            recv(self.replies) -> m => m.ok(),
            recv(self.events) -> m => m.ok(),
            default(timeout) => return Err(ClientError::Timeout),
        };
        // One channel may be closed and empty while the other still holds messages.
        let msg = match got {
            Some(m) => m,
            None => match self.events.try_recv().or_else(|_| self.replies.try_recv()) {
                Ok(m) => m,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => {
                    return Err(ClientError::Disconnected)
                }
            },
        };
        match msg {
            ServerMsg::Error { code, message } => Err(ClientError::Server { code, message }),
            m => Ok(m),
        }
    }

    /// Unsolicited notices: `Integrate`, `Die`, `ViewUpdate`, `MemberLost`.
    /// The channel disconnects when the connection closes.
    pub fn events(&self) -> &Receiver<ServerMsg> {
        &self.events
    }

    /// Waits for a reply that `pick` accepts; other replies (late answers to
    /// timed-out requests) are skipped.
    fn wait_reply<T>(
        &self,
        deadline: Instant,
        mut pick: impl FnMut(ServerMsg) -> Option<T>,
    ) -> Result<T> {
        loop {
            let left = remaining(deadline)?;
            match self.replies.recv_timeout(left) {
                Ok(ServerMsg::Error { code, message }) => {
                    return Err(ClientError::Server { code, message })
                }
                Ok(msg) => {
                    let text = format!("{msg:?}");
                    if let Some(t) = pick(msg) {
                        return Ok(t);
                    }
                    debug!(msg = %text, "skipping unrelated coordinator reply");
                }
                Err(RecvTimeoutError::Timeout) => return Err(ClientError::Timeout),
                Err(RecvTimeoutError::Disconnected) => return Err(ClientError::Disconnected),
            }
        }
    }

    /// Registers as a launch member or a newcomer and waits for the admission
    /// (launch members wait for the whole launch, so give it the launch timeout).
    pub fn register(&self, reg: Registration, timeout: Duration) -> Result<Admission> {
        let deadline = Instant::now() + timeout;
        self.send(&ClientMsg::Register(reg))?;
        self.wait_reply(deadline, |m| match m {
            ServerMsg::Start { node, view } => Some(Admission::Member { node, view }),
            ServerMsg::Waiting { uid, view } => Some(Admission::Waiting { uid, view }),
            _ => None,
        })
    }

    /// Enters the shutdown barrier with this member's exit code; returns the job's (node 0's) code.
    pub fn shutdown_barrier(&self, epoch: Epoch, code: i32, timeout: Duration) -> Result<i32> {
        let deadline = Instant::now() + timeout;
        self.send(&ClientMsg::ShutdownReady { epoch, code })?;
        self.wait_reply(deadline, |m| match m {
            ServerMsg::ShutdownDone { code, .. } => Some(code),
            _ => None,
        })
    }

    /// Newcomers waiting for admission, in admission order.
    pub fn query_pending(&self, epoch: Epoch, timeout: Duration) -> Result<Vec<PendingNewcomer>> {
        let deadline = Instant::now() + timeout;
        self.send(&ClientMsg::QueryPending { epoch })?;
        self.wait_reply(deadline, |m| match m {
            ServerMsg::Pending {
                epoch: e,
                newcomers,
            } if e == epoch => Some(newcomers),
            _ => None,
        })
    }

    /// Commits a rescale and returns the new view.
    pub fn commit(
        &self,
        epoch: Epoch,
        remove: Vec<NodeId>,
        admit: u32,
        timeout: Duration,
    ) -> Result<View> {
        let deadline = Instant::now() + timeout;
        self.send(&ClientMsg::Commit {
            epoch,
            remove,
            admit,
        })?;
        self.wait_reply(deadline, |m| match m {
            ServerMsg::Committed { view } => Some(view),
            _ => None,
        })
    }

    /// Node 0 after a coordinator restart: hands over its view; returns it as accepted.
    pub fn restore(&self, view: View, fingerprint: u64, timeout: Duration) -> Result<View> {
        let deadline = Instant::now() + timeout;
        self.send(&ClientMsg::Restore { view, fingerprint })?;
        self.wait_reply(deadline, |m| match m {
            ServerMsg::Start { view, .. } => Some(view),
            _ => None,
        })
    }

    /// A member reconnecting (after a coordinator restart): returns its node id and the current view.
    pub fn reattach(&self, epoch: Epoch, uid: u64, timeout: Duration) -> Result<(NodeId, View)> {
        let deadline = Instant::now() + timeout;
        self.send(&ClientMsg::Reattach { epoch, uid })?;
        self.wait_reply(deadline, |m| match m {
            ServerMsg::Start { node, view } => Some((node, view)),
            _ => None,
        })
    }

    /// The current view (if any) and pending newcomers, for status tools.
    pub fn query_view(&self, timeout: Duration) -> Result<(Option<View>, Vec<PendingNewcomer>)> {
        let deadline = Instant::now() + timeout;
        self.send(&ClientMsg::QueryView)?;
        self.wait_reply(deadline, |m| match m {
            ServerMsg::CurrentView { view, pending } => Some((view, pending)),
            _ => None,
        })
    }

    /// The coordinator's recent admissions (oldest first) and how many
    /// there were since it started ([`ServerMsg::Admissions`]).
    pub fn query_admissions(&self, timeout: Duration) -> Result<(u64, Vec<Admitted>)> {
        let deadline = Instant::now() + timeout;
        self.send(&ClientMsg::QueryAdmissions)?;
        self.wait_reply(deadline, |m| match m {
            ServerMsg::Admissions { total, recent } => Some((total, recent)),
            _ => None,
        })
    }

    /// Closes the connection and waits for the reader thread.
    pub fn close(mut self) {
        self.shutdown_socket();
        if let Some(handle) = self.reader.take() {
            let _ = handle.join();
        }
    }

    fn shutdown_socket(&self) {
        if let Ok(w) = self.writer.lock() {
            let _ = w.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Ends the reader thread (its blocking read returns); no join in Drop.
        self.shutdown_socket();
    }
}
