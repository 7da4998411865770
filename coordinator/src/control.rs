//! The control endpoint's protocol: how tools (`ductile status`, the
//! Kubernetes operator) talk to a running job's PE 0, the role Charm++'s CCS
//! plays. Node 0 serves it; this crate holds the messages, the server side of
//! one connection and a blocking client, so fleets need no runtime dependency.
//!
//! Same frames as the coordinator ([`crate::proto`]: magic, version, length
//! bound, postcard payload) and the same authentication: the server sends a
//! nonce, the client answers with an HMAC of it under the job secret, and
//! nothing else is served before that.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::proto::{
    decode_payload, encode, parse_header, Epoch, FrameError, Member, NodeId, PendingNewcomer,
    HEADER_LEN,
};
use crate::secret::Secret;

/// HMAC context of control-endpoint proofs (distinct from the coordinator's).
pub const CONTROL_CONTEXT: &[u8] = b"ductile/control/v1";

/// What a tool asks PE 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ControlRequest {
    /// The answer to the server's challenge.
    Hello {
        /// `Secret::proof(CONTROL_CONTEXT, nonce)`.
        proof: [u8; 32],
    },
    /// The job's membership and progress.
    Status,
    /// Reconfigure the running job: remove nodes and admit waiting newcomers
    /// in one commit. The reply comes once the job runs at its new size.
    Rescale(RescaleRequest),
    /// Write every chare, readonly value and collection to a directory at
    /// the next load-balancing sync point (the kill-and-restart baseline;
    /// see docs/elasticity.md). The reply comes once it is written.
    Checkpoint(CheckpointRequest),
}

/// How much sooner than a client's timeout the node withdraws a checkpoint
/// that found no sync point, so that its answer arrives in time.
const CHECKPOINT_REPLY_MARGIN: Duration = Duration::from_secs(2);

/// A checkpoint as a tool asks for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRequest {
    /// Directory (on node 0's machine, shared by every node) to write to.
    pub dir: String,
    /// End the job afterwards (every process exits with the
    /// checkpointed code) instead of going on.
    pub exit: bool,
    /// How long PE 0 may wait for a sync point, in ms (0: the node's own
    /// limit). When no sync point came by then, the request is withdrawn,
    /// so it cannot fire after the tool gave up. [`ControlClient::checkpoint`]
    /// sets it a little below its own timeout.
    pub wait_ms: u64,
}

/// What a checkpoint wrote, as PE 0 reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointReport {
    /// The epoch it was taken in.
    pub epoch: Epoch,
    /// PEs of the job that wrote it.
    pub pes: u32,
    /// Chares written (array elements, group and nodegroup members, main).
    pub chares: u64,
    /// Bytes written, all files together.
    pub bytes: u64,
    /// From the request to the sync point and quiescence, in milliseconds.
    pub wait_ms: f64,
    /// Writing every file, in milliseconds.
    pub write_ms: f64,
    /// From the request's arrival to the reply, in milliseconds.
    pub total_ms: f64,
}

/// A rescale as a tool asks for it.
///
/// Node ids are renumbered by every commit, so a request names the view it
/// was computed against: node 0 refuses it with
/// [`ControlReply::ViewChanged`] when the job's epoch is no longer `epoch`,
/// and the tool reads the view again (and recomputes, or gives up if the
/// ids came from a user who saw the old view).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RescaleRequest {
    /// The epoch of the view `remove` was read from ([`JobStatus::epoch`]).
    pub epoch: Epoch,
    /// Nodes (ids in the view of `epoch`) to remove.
    pub remove: Vec<NodeId>,
    /// How many waiting newcomers to admit (fewer if fewer wait).
    pub admit: u32,
}

impl RescaleRequest {
    /// A request from a keep/remove bitmap over the nodes of the view of
    /// `epoch` (`true` = keep).
    pub fn from_keep_bitmap(epoch: Epoch, keep: &[bool], admit: u32) -> Self {
        let remove = keep
            .iter()
            .enumerate()
            .filter(|(_, k)| !**k)
            .map(|(i, _)| i as NodeId)
            .collect();
        RescaleRequest {
            epoch,
            remove,
            admit,
        }
    }
}

/// The text of a [`ControlReply::ViewChanged`] refusal.
pub fn view_changed_message(asked: Epoch, now: Epoch) -> String {
    format!(
        "the view changed: epoch {asked}, now {now}; node ids are renumbered by every commit — read the view again"
    )
}

/// How long one stage of a rescale took.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageTime {
    /// Stage name: `evacuate`, `stop`, `commit`, `reconcile`, `reentry`,
    /// `state`, `balance` (see docs/elasticity.md).
    pub stage: String,
    /// Milliseconds.
    pub ms: f64,
}

/// What a rescale did, as PE 0 reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RescaleReport {
    /// The epoch before the rescale.
    pub epoch_before: Epoch,
    /// The epoch the job runs in now.
    pub epoch: Epoch,
    /// Node ids (of the old view) that left.
    pub removed: Vec<NodeId>,
    /// Node ids (of the new view) of the admitted newcomers.
    pub admitted: Vec<NodeId>,
    /// PEs before and after.
    pub pes_before: u32,
    /// PEs now.
    pub pes: u32,
    /// Elements migrated by the evacuation and the balancing after it.
    pub migrations: u64,
    /// Stage timings, in protocol order.
    pub stages: Vec<StageTime>,
    /// The mechanism's time: every stage but `evacuate` and `balance` (the
    /// load balancer's work), in milliseconds.
    pub mechanism_ms: f64,
    /// From the request's arrival to the reply, in milliseconds.
    pub total_ms: f64,
    /// GPU work inside the stages above (already counted in them):
    /// `staging` (device buffers of migrated chares copied through host
    /// memory, summed over PEs, in `evacuate`/`balance`) and `context` (CUDA
    /// contexts created on the critical path, in `reentry`; only when
    /// measuring with `DUCTILE_GPU_CONTEXT_ON_REENTRY=1`). Empty without GPU work.
    #[serde(default)]
    pub gpu: Vec<StageTime>,
}

/// What PE 0 answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ControlReply {
    /// First frame of every connection.
    Challenge {
        /// Random bytes to prove the secret over.
        nonce: [u8; 32],
    },
    /// The proof was right.
    Welcome,
    /// The answer to [`ControlRequest::Status`].
    Status(JobStatus),
    /// The answer to [`ControlRequest::Rescale`].
    Rescaled(RescaleReport),
    /// The answer to [`ControlRequest::Checkpoint`].
    Checkpointed(CheckpointReport),
    /// A refusal, with its reason; the connection closes after it.
    Error {
        /// Why.
        message: String,
    },
    /// A rescale request computed against another view than the job's:
    /// nothing was done. Read the view again; see [`view_changed_message`].
    ViewChanged {
        /// The epoch the request named.
        asked: Epoch,
        /// The job's epoch now.
        now: Epoch,
    },
    /// Another rescale or checkpoint is in flight: nothing was done. Ask
    /// again once it ended (its view will have changed after a rescale).
    Busy {
        /// What is in flight, in words.
        message: String,
    },
}

/// A running job as PE 0 sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    /// The current view's epoch.
    pub epoch: Epoch,
    /// The current members, in node order.
    pub members: Vec<Member>,
    /// Total PEs.
    pub pes: u32,
    /// Newcomers registered with the coordinator and waiting to be admitted.
    pub pending: Vec<PendingNewcomer>,
    /// Milliseconds since node 0 started.
    pub uptime_ms: u64,
}

/// What went wrong on a control connection.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// A socket error (including timeouts).
    #[error("control endpoint I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A frame that is not one.
    #[error("bad frame on the control endpoint: {0}")]
    Frame(#[from] FrameError),
    /// The peer refused (wrong secret, unknown request...).
    #[error("the control endpoint refused: {0}")]
    Refused(String),
    /// A message out of place.
    #[error("unexpected message on the control endpoint: {0}")]
    Unexpected(String),
    /// The rescale was refused because the view changed since the request
    /// was computed (node ids are renumbered by every commit); nothing was
    /// done. A request that can be recomputed is asked again.
    #[error("rescale refused: {}", view_changed_message(*asked, *now))]
    ViewChanged {
        /// The epoch the request named.
        asked: Epoch,
        /// The job's epoch now.
        now: Epoch,
    },
    /// Another rescale or checkpoint is in flight; nothing was done.
    #[error("refused: {0}")]
    Busy(String),
    /// The other end closed the connection before it answered: node 0
    /// ended (its log, or `ductile run`'s output, says why and in which
    /// stage), or the tool went away.
    #[error("the connection closed before {0} was answered (node 0 ended or was ended; its log says why)")]
    Closed(&'static str),
    /// An authenticated tool said nothing for this long; the server ended
    /// the connection.
    #[error("no request for {0:?}: connection closed")]
    Idle(Duration),
}

impl ControlError {
    /// Whether asking again later, after reading the view again, may succeed
    /// (nothing was done by this request).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ControlError::ViewChanged { .. } | ControlError::Busy(_)
        )
    }
}

/// The error a reply other than the one expected stands for.
fn refusal(reply: ControlReply) -> ControlError {
    match reply {
        ControlReply::Error { message } => ControlError::Refused(message),
        ControlReply::ViewChanged { asked, now } => ControlError::ViewChanged { asked, now },
        ControlReply::Busy { message } => ControlError::Busy(message),
        other => ControlError::Unexpected(format!("{other:?}")),
    }
}

fn send<T: Serialize>(s: &mut TcpStream, msg: &T) -> Result<(), ControlError> {
    s.write_all(&encode(msg))?;
    Ok(())
}

fn recv<T: serde::de::DeserializeOwned>(s: &mut TcpStream) -> Result<T, ControlError> {
    let mut header = [0u8; HEADER_LEN];
    s.read_exact(&mut header)?;
    let len = parse_header(&header)?;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload)?;
    Ok(decode_payload(&payload)?)
}

/// How long a peer has, in total, to prove the job secret: a peer that
/// trickles a byte at a time does not keep its connection longer.
pub const AUTH_DEADLINE: Duration = Duration::from_secs(3);

/// How long an authenticated tool may stay silent between requests.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads exactly `buf` by `deadline`, however the bytes are spread out.
fn read_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the peer did not authenticate within {AUTH_DEADLINE:?}"),
            ));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[at..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The first frame of a connection, read by `deadline` in total.
fn recv_by<T: serde::de::DeserializeOwned>(
    s: &mut TcpStream,
    deadline: Instant,
) -> Result<T, ControlError> {
    let mut header = [0u8; HEADER_LEN];
    read_by(s, &mut header, deadline)?;
    let len = parse_header(&header)?;
    let mut payload = vec![0u8; len];
    read_by(s, &mut payload, deadline)?;
    Ok(decode_payload(&payload)?)
}

/// The tool on the other end of a control connection, as seen while its
/// request is being served: a long request (a rescale) asks whether the
/// tool is still there before it does something nobody waits for.
pub struct Peer<'a> {
    stream: &'a TcpStream,
}

impl Peer<'_> {
    /// Whether the tool closed its end (or the connection broke). A tool
    /// waits for its answer without writing, so a readable end of file
    /// means it went away.
    pub fn gone(&self) -> bool {
        if self.stream.set_nonblocking(true).is_err() {
            return true;
        }
        let gone = match self.stream.peek(&mut [0u8; 1]) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        };
        gone || self.stream.set_nonblocking(false).is_err()
    }
}

/// Serves one control connection: authenticates it, then answers requests
/// with `answer` until the peer closes. Bad frames and wrong secrets get an
/// error reply and end the connection.
pub fn serve_connection(
    stream: TcpStream,
    secret: &Secret,
    mut answer: impl FnMut(&ControlRequest) -> ControlReply,
) -> Result<(), ControlError> {
    serve_watched(stream, secret, || {}, |req, _| answer(req))
}

/// As [`serve_connection`]; `answer` also gets the [`Peer`], to notice a
/// tool that went away while its request was served, and `welcomed` is
/// called once the peer proved the secret (a server that keeps a small
/// budget for unauthenticated peers releases its slot there). The proof
/// must come within [`AUTH_DEADLINE`] in total; an authenticated tool may
/// then stay silent up to [`IDLE_TIMEOUT`] between requests.
pub fn serve_watched(
    mut stream: TcpStream,
    secret: &Secret,
    welcomed: impl FnOnce(),
    mut answer: impl FnMut(&ControlRequest, &Peer<'_>) -> ControlReply,
) -> Result<(), ControlError> {
    let deadline = Instant::now() + AUTH_DEADLINE;
    stream.set_write_timeout(Some(AUTH_DEADLINE))?;
    let mut nonce = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut nonce);
    send(&mut stream, &ControlReply::Challenge { nonce })?;
    match recv_by::<ControlRequest>(&mut stream, deadline) {
        Ok(ControlRequest::Hello { proof }) if secret.verify(CONTROL_CONTEXT, &nonce, &proof) => {
            send(&mut stream, &ControlReply::Welcome)?;
            welcomed();
            stream.set_read_timeout(Some(IDLE_TIMEOUT))?;
            stream.set_write_timeout(Some(IDLE_TIMEOUT))?;
        }
        Ok(_) => {
            let message =
                "unauthenticated: the first message must prove the job secret".to_string();
            send(
                &mut stream,
                &ControlReply::Error {
                    message: message.clone(),
                },
            )?;
            return Err(ControlError::Refused(message));
        }
        Err(e) => {
            let _ = send(
                &mut stream,
                &ControlReply::Error {
                    message: e.to_string(),
                },
            );
            return Err(e);
        }
    }
    loop {
        let req = match recv::<ControlRequest>(&mut stream) {
            Ok(r) => r,
            Err(ControlError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Ok(())
            }
            // An idle tool's connection ends quietly: nothing was refused.
            Err(ControlError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ControlError::Idle(IDLE_TIMEOUT))
            }
            Err(e) => {
                let _ = send(
                    &mut stream,
                    &ControlReply::Error {
                        message: e.to_string(),
                    },
                );
                return Err(e);
            }
        };
        let reply = answer(&req, &Peer { stream: &stream });
        send(&mut stream, &reply)?;
    }
}

/// The answer to a request; an end of file is [`ControlError::Closed`].
fn reply(s: &mut TcpStream, what: &'static str) -> Result<ControlReply, ControlError> {
    match recv::<ControlReply>(s) {
        Err(ControlError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(ControlError::Closed(what))
        }
        other => other,
    }
}

/// A blocking, authenticated connection to a job's control endpoint.
pub struct ControlClient {
    stream: TcpStream,
}

impl ControlClient {
    /// Connects to `addr` and proves the job secret.
    pub fn connect(addr: &str, secret: &Secret, timeout: Duration) -> Result<Self, ControlError> {
        let sock = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| ControlError::Unexpected(format!("{addr} resolves to no address")))?;
        let mut stream = TcpStream::connect_timeout(&sock, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let nonce = match recv::<ControlReply>(&mut stream)? {
            ControlReply::Challenge { nonce } => nonce,
            other => return Err(ControlError::Unexpected(format!("{other:?}"))),
        };
        send(
            &mut stream,
            &ControlRequest::Hello {
                proof: secret.proof(CONTROL_CONTEXT, &nonce),
            },
        )?;
        match recv::<ControlReply>(&mut stream)? {
            ControlReply::Welcome => Ok(ControlClient { stream }),
            other => Err(refusal(other)),
        }
    }

    /// The job's status.
    pub fn status(&mut self) -> Result<JobStatus, ControlError> {
        send(&mut self.stream, &ControlRequest::Status)?;
        match reply(&mut self.stream, "the status request")? {
            ControlReply::Status(s) => Ok(s),
            other => Err(refusal(other)),
        }
    }

    /// Asks for a rescale and waits up to `timeout` for the job to run at
    /// its new size.
    pub fn rescale(
        &mut self,
        req: RescaleRequest,
        timeout: Duration,
    ) -> Result<RescaleReport, ControlError> {
        self.stream.set_read_timeout(Some(timeout))?;
        send(&mut self.stream, &ControlRequest::Rescale(req))?;
        match reply(&mut self.stream, "the rescale")? {
            ControlReply::Rescaled(r) => Ok(r),
            other => Err(refusal(other)),
        }
    }

    /// Asks for a checkpoint; waits up to `timeout` for it to be written.
    pub fn checkpoint(
        &mut self,
        req: CheckpointRequest,
        timeout: Duration,
    ) -> Result<CheckpointReport, ControlError> {
        self.stream.set_read_timeout(Some(timeout))?;
        // The node gives up (and says so) before this client would.
        let own = timeout.saturating_sub(CHECKPOINT_REPLY_MARGIN.min(timeout / 4));
        let own = own.as_millis().max(1) as u64;
        let mut req = req;
        req.wait_ms = if req.wait_ms == 0 {
            own
        } else {
            req.wait_ms.min(own)
        };
        send(&mut self.stream, &ControlRequest::Checkpoint(req))?;
        match reply(&mut self.stream, "the checkpoint")? {
            ControlReply::Checkpointed(r) => Ok(r),
            other => Err(refusal(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn server(secret: Secret) -> (String, std::thread::JoinHandle<Result<(), ControlError>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let h = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            serve_connection(s, &secret, |req| match req {
                ControlRequest::Status => ControlReply::Status(JobStatus {
                    epoch: 3,
                    members: vec![],
                    pes: 4,
                    pending: vec![],
                    uptime_ms: 1,
                }),
                ControlRequest::Rescale(r) if r.epoch != 3 => ControlReply::ViewChanged {
                    asked: r.epoch,
                    now: 3,
                },
                ControlRequest::Rescale(_) => ControlReply::Busy {
                    message: "another rescale is in progress".into(),
                },
                ControlRequest::Hello { .. } | ControlRequest::Checkpoint(_) => {
                    ControlReply::Error {
                        message: "not served here".into(),
                    }
                }
            })
        });
        (addr, h)
    }

    #[test]
    fn status_after_authentication() {
        let secret = Secret::generate();
        let (addr, h) = server(secret.clone());
        let mut c = ControlClient::connect(&addr, &secret, Duration::from_secs(5)).unwrap();
        let s = c.status().unwrap();
        assert_eq!((s.epoch, s.pes), (3, 4));
        drop(c);
        h.join().unwrap().unwrap();
    }

    #[test]
    fn refusals_of_a_stale_view_and_of_a_busy_job_are_told_apart() {
        let secret = Secret::generate();
        let (addr, h) = server(secret.clone());
        let mut c = ControlClient::connect(&addr, &secret, Duration::from_secs(5)).unwrap();
        let req = |epoch| RescaleRequest {
            epoch,
            remove: vec![1],
            admit: 0,
        };
        let e = c.rescale(req(2), Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(e, ControlError::ViewChanged { asked: 2, now: 3 }),
            "{e}"
        );
        assert!(e.is_retryable());
        assert!(
            e.to_string().contains(
                "the view changed: epoch 2, now 3; node ids are renumbered by every commit"
            ),
            "{e}"
        );
        // The connection stays usable after a refusal.
        let e = c.rescale(req(3), Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(e, ControlError::Busy(ref m) if m.contains("in progress")),
            "{e}"
        );
        assert!(e.is_retryable());
        assert_eq!(c.status().unwrap().epoch, 3);
        drop(c);
        h.join().unwrap().unwrap();
    }

    #[test]
    fn a_wrong_secret_is_refused_and_served_nothing() {
        let (addr, h) = server(Secret::generate());
        let err = ControlClient::connect(&addr, &Secret::generate(), Duration::from_secs(5))
            .err()
            .unwrap();
        assert!(
            matches!(err, ControlError::Refused(ref m) if m.contains("unauthenticated")),
            "{err}"
        );
        assert!(h.join().unwrap().is_err());
    }

    #[test]
    fn a_peer_that_trickles_bytes_is_cut_off_at_the_authentication_deadline() {
        let (addr, h) = server(Secret::generate());
        let mut s = TcpStream::connect(&addr).unwrap();
        let started = Instant::now();
        let _: ControlReply = recv(&mut s).unwrap();
        // One byte of a header every half second: each read is quick, the
        // whole never completes.
        let mut cut = false;
        for b in b"DUCT\x02\x00\x00\x00\xff\x00\x00\x00" {
            std::thread::sleep(Duration::from_millis(500));
            if s.write_all(&[*b]).is_err() {
                cut = true;
                break;
            }
        }
        let r = h.join().unwrap();
        assert!(
            matches!(&r, Err(ControlError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut),
            "{r:?}"
        );
        assert!(cut || started.elapsed() >= AUTH_DEADLINE);
    }

    #[test]
    fn garbage_gets_an_error_frame_and_a_closed_connection() {
        let (addr, h) = server(Secret::generate());
        let mut s = TcpStream::connect(&addr).unwrap();
        let _: ControlReply = recv(&mut s).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let reply: ControlReply = recv(&mut s).unwrap();
        assert!(matches!(reply, ControlReply::Error { .. }));
        assert!(h.join().unwrap().is_err());
    }
}
