//! The coordinator's wire protocol: membership types (`View`, `Member`), the
//! messages each side sends, and the one frame codec both sides use.
//!
//! A frame is a 12-byte header followed by a postcard payload:
//!
//! ```text
//! offset 0  b"DUCT"                magic
//! offset 4  u16 LE                 protocol version (PROTOCOL_VERSION)
//! offset 6  u16 LE                 reserved, must be 0
//! offset 8  u32 LE                 payload length (at most MAX_FRAME)
//! offset 12 payload                postcard encoding of ClientMsg / ServerMsg
//! ```
//!
//! The header is checked before the payload is buffered, so an oversized or
//! foreign stream is refused after 12 bytes. Decoding never panics.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Monotonic membership version. Epoch 1 is the launch view; each commit adds one.
pub type Epoch = u64;

/// Compact index of a member in a view: `view.members[i].node == i`.
pub type NodeId = u32;

/// Version carried in every frame header and in `Hello` (2: rescale
/// requests name the epoch of their view).
pub const PROTOCOL_VERSION: u16 = 2;

/// Largest payload a frame may carry, in bytes.
pub const MAX_FRAME: usize = 1 << 20;

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"DUCT";

/// Size of the frame header in bytes.
pub const HEADER_LEN: usize = 12;

/// One process of the job as the view records it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Member {
    /// Compact index in the view (equal to the position in `View::members`).
    pub node: NodeId,
    /// Stable identity assigned by the coordinator; never reused within a job.
    pub uid: u64,
    /// Opaque transport address bytes (the runtime's own encoding).
    pub address: Vec<u8>,
    /// Number of PEs (scheduler threads) the node runs.
    pub pes: u32,
    /// Host name the node reported, for humans and placement tools.
    pub host: String,
    /// OS process id the node reported.
    pub pid: u32,
}

/// The canonical membership: an epoch and the ordered member list.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct View {
    /// Version of this membership.
    pub epoch: Epoch,
    /// Members ordered by node id; global PE numbers are prefix sums of `pes`.
    pub members: Vec<Member>,
}

/// Why a view operation was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    /// Node 0 runs the program's main and the control endpoint; it never leaves.
    #[error("node 0 cannot be removed")]
    RemovesNodeZero,
    /// A removal named a node id that the view does not have.
    #[error("node {node} is not in view epoch {epoch} ({len} members)")]
    UnknownNode {
        /// The offending id.
        node: NodeId,
        /// The view's epoch.
        epoch: Epoch,
        /// The view's size.
        len: usize,
    },
    /// A removal named the same node twice.
    #[error("node {0} is listed twice in the removal set")]
    DuplicateNode(NodeId),
    /// Nothing would be left.
    #[error("the removal set empties the view")]
    RemovesEveryone,
    /// Two members would share a uid.
    #[error("uid {0} appears twice")]
    DuplicateUid(u64),
    /// A view whose node ids are not `0..len` in order.
    #[error("member at position {position} has node id {node}")]
    NotCompact {
        /// Position in the list.
        position: usize,
        /// Its recorded node id.
        node: NodeId,
    },
    /// A member with no PE.
    #[error("member uid {0} has zero PEs")]
    NoPes(u64),
    /// A view with no member or epoch 0.
    #[error("a view needs at least one member and an epoch of at least 1")]
    Empty,
}

impl View {
    /// Total number of PEs across all members (saturating).
    pub fn total_pes(&self) -> u32 {
        self.members
            .iter()
            .fold(0u32, |acc, m| acc.saturating_add(m.pes))
    }

    /// The member with compact id `node`.
    pub fn member(&self, node: NodeId) -> Option<&Member> {
        self.members.get(node as usize).filter(|m| m.node == node)
    }

    /// The member with the given stable uid.
    pub fn by_uid(&self, uid: u64) -> Option<&Member> {
        self.members.iter().find(|m| m.uid == uid)
    }

    /// Checks the structural rules every view obeys: non-empty, epoch >= 1,
    /// node ids compact and in order, uids unique, every member has a PE.
    pub fn check(&self) -> Result<(), ViewError> {
        if self.members.is_empty() || self.epoch == 0 {
            return Err(ViewError::Empty);
        }
        let mut uids = std::collections::HashSet::new();
        for (position, m) in self.members.iter().enumerate() {
            if m.node as usize != position {
                return Err(ViewError::NotCompact {
                    position,
                    node: m.node,
                });
            }
            if m.pes == 0 {
                return Err(ViewError::NoPes(m.uid));
            }
            if !uids.insert(m.uid) {
                return Err(ViewError::DuplicateUid(m.uid));
            }
        }
        Ok(())
    }

    fn check_removal(&self, remove: &[NodeId]) -> Result<Vec<bool>, ViewError> {
        let mut removed = vec![false; self.members.len()];
        for &node in remove {
            if node == 0 {
                return Err(ViewError::RemovesNodeZero);
            }
            let slot = removed
                .get_mut(node as usize)
                .ok_or(ViewError::UnknownNode {
                    node,
                    epoch: self.epoch,
                    len: self.members.len(),
                })?;
            if *slot {
                return Err(ViewError::DuplicateNode(node));
            }
            *slot = true;
        }
        if removed.iter().all(|&r| r) {
            return Err(ViewError::RemovesEveryone);
        }
        Ok(removed)
    }

    /// Compact renumbering, computed identically by the coordinator and every node:
    /// survivors keep their relative order and are renumbered `0..`; admitted
    /// newcomers are appended in order (their `node` field is overwritten); epoch+1.
    ///
    /// Errors: removing node 0, unknown or duplicate node ids, removing everyone,
    /// an admitted uid that collides with another member's.
    pub fn renumbered(&self, remove: &[NodeId], admitted: &[Member]) -> Result<View, ViewError> {
        let removed = self.check_removal(remove)?;
        let mut members: Vec<Member> = Vec::with_capacity(self.members.len() + admitted.len());
        let mut uids = std::collections::HashSet::new();
        let survivors = self
            .members
            .iter()
            .zip(&removed)
            .filter(|(_, &r)| !r)
            .map(|(m, _)| m);
        for m in survivors.chain(admitted) {
            if !uids.insert(m.uid) {
                return Err(ViewError::DuplicateUid(m.uid));
            }
            let node = NodeId::try_from(members.len()).unwrap_or(NodeId::MAX);
            members.push(Member { node, ..m.clone() });
        }
        Ok(View {
            epoch: self.epoch + 1,
            members,
        })
    }

    /// Maps each old node id (the index) to its new id after removing `remove`
    /// (`None` for removed nodes). Invalid ids in `remove` are ignored; use
    /// [`View::renumbered`] to validate.
    pub fn survivor_map(&self, remove: &[NodeId]) -> Vec<Option<NodeId>> {
        let mut next: NodeId = 0;
        (0..self.members.len())
            .map(|i| {
                if remove.iter().any(|&r| r as usize == i) {
                    None
                } else {
                    let id = next;
                    next += 1;
                    Some(id)
                }
            })
            .collect()
    }
}

/// How a node joins the job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// One of the N processes started at launch; `index` in `0..N` becomes its node id.
    Launch {
        /// Launch index (`DUCTILE_LAUNCH_INDEX`).
        index: u32,
    },
    /// A process started later, waiting to be admitted by a commit.
    Newcomer,
}

/// What a node tells the coordinator about itself when it registers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// Launch member or newcomer.
    pub role: Role,
    /// Opaque transport address bytes peers use to reach it.
    pub address: Vec<u8>,
    /// PEs it runs (at least 1).
    pub pes: u32,
    /// Host name, informational.
    pub host: String,
    /// OS process id, informational.
    pub pid: u32,
    /// Build fingerprint of the program (entry-method table etc.); all nodes must agree.
    pub fingerprint: u64,
}

/// A newcomer waiting for admission, as reported to committers and status tools.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingNewcomer {
    /// Its uid (it keeps it once admitted).
    pub uid: u64,
    /// PEs it runs.
    pub pes: u32,
    /// Host name it reported.
    pub host: String,
    /// OS process id it reported.
    pub pid: u32,
}

/// One admission in the coordinator's recent history (`QueryAdmissions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admitted {
    /// The epoch of the view that admitted it.
    pub epoch: Epoch,
    /// Its uid.
    pub uid: u64,
    /// OS process id it reported when it registered.
    pub pid: u32,
}

/// Messages from a node (or a tool) to the coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientMsg {
    /// Answer to `Challenge`: `proof = Secret::proof(AUTH_CONTEXT, nonce)`.
    Hello {
        /// The client's protocol version.
        protocol: u16,
        /// HMAC-SHA256 proof of the job secret over the nonce.
        proof: [u8; 32],
    },
    /// Join as a launch member or a newcomer.
    Register(Registration),
    /// Shutdown barrier: this member is done, with its exit code.
    ShutdownReady {
        /// The epoch the member believes current.
        epoch: Epoch,
        /// Its exit code (node 0's becomes the job's).
        code: i32,
    },
    /// Ask for the newcomers waiting for admission.
    QueryPending {
        /// The epoch the member believes current.
        epoch: Epoch,
    },
    /// Apply a rescale: remove these nodes and admit the first `admit` pending newcomers.
    Commit {
        /// Must equal the current epoch.
        epoch: Epoch,
        /// Node ids (of `epoch`) that leave.
        remove: Vec<NodeId>,
        /// How many pending newcomers join, taken in registration order.
        admit: u32,
    },
    /// After a coordinator restart: rebuild state from PE 0's view. The sender becomes node 0.
    Restore {
        /// The view node 0 holds.
        view: View,
        /// The build fingerprint of the job.
        fingerprint: u64,
    },
    /// After a coordinator restart (or a dropped connection): a member reconnects.
    Reattach {
        /// The epoch the member believes current.
        epoch: Epoch,
        /// Its uid in that view.
        uid: u64,
    },
    /// Ask for the current view and pending newcomers (status tools).
    QueryView,
    /// Ask for the recent admissions (a launcher keeping its record of
    /// newcomers from the view history rather than from its looks at it).
    QueryAdmissions,
    /// A member is alive (every [`HEARTBEAT_EVERY`] from its node; any
    /// message counts). No answer.
    Heartbeat,
}

/// How often a member's node sends [`ClientMsg::Heartbeat`]: the
/// coordinator's `--heartbeat-timeout` must be several times longer.
pub const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Error classes the coordinator reports in `ServerMsg::Error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// Bad magic, reserved bits, undecodable payload, or a message out of protocol order.
    Malformed,
    /// A frame longer than `MAX_FRAME`.
    Oversized,
    /// A frame header or `Hello` with another protocol version.
    UnsupportedVersion,
    /// No `Hello` first, or a wrong proof.
    Unauthenticated,
    /// The node runs another build than the rest of the job.
    FingerprintMismatch,
    /// A launch index registered twice, or launch registration after launch.
    DuplicateIndex,
    /// The message refers to an epoch that is not the current one.
    StaleEpoch,
    /// The sender is not a member of the current view.
    NotMember,
    /// A commit (or launch index, or restore view) that breaks the rules.
    InvalidCommit,
    /// The coordinator is not in a state to answer (launch or restore not done, barrier in progress).
    NotReady,
    /// The launch did not complete in time; the coordinator exits.
    LaunchTimeout,
    /// A bug on the coordinator side.
    Internal,
    /// A commit that keeps a member announced lost in its epoch: the job
    /// is to recover without it (a commit made now would hand the
    /// survivors a view with a dead member).
    MemberLost,
}

/// Messages from the coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerMsg {
    /// First message on every connection.
    Challenge {
        /// The server's protocol version.
        protocol: u16,
        /// Random nonce the client must prove the secret over.
        nonce: [u8; 32],
    },
    /// The client is authenticated.
    Welcome,
    /// You are member `node` of `view`: a launch member at epoch 1, or the
    /// answer to `Restore` / `Reattach`.
    Start {
        /// Your node id.
        node: NodeId,
        /// The current view.
        view: View,
    },
    /// Newcomer queued; the current view lets it build speculative endpoints.
    Waiting {
        /// Its uid.
        uid: u64,
        /// The current view.
        view: View,
    },
    /// Newcomer admitted by a commit.
    Integrate {
        /// Its node id in `view`.
        node: NodeId,
        /// The new view.
        view: View,
    },
    /// The receiving member was removed by a commit and should exit.
    Die {
        /// The epoch of the view it is no longer part of (the new epoch).
        epoch: Epoch,
    },
    /// Reply to the committer.
    Committed {
        /// The new view.
        view: View,
    },
    /// To survivors other than the committer (informational: the runtime tree-broadcasts too).
    ViewUpdate {
        /// The new view.
        view: View,
    },
    /// Reply to `QueryPending`.
    Pending {
        /// The current epoch.
        epoch: Epoch,
        /// Newcomers in admission order.
        newcomers: Vec<PendingNewcomer>,
    },
    /// A member's connection dropped without Die or ShutdownReady; it stays in the view.
    MemberLost {
        /// The current epoch.
        epoch: Epoch,
        /// Its node id.
        node: NodeId,
        /// Its uid.
        uid: u64,
    },
    /// Every member reached the shutdown barrier.
    ShutdownDone {
        /// The epoch of the barrier.
        epoch: Epoch,
        /// The job's exit code (node 0's).
        code: i32,
    },
    /// Reply to `QueryView`.
    CurrentView {
        /// The view, if launch or restore is done.
        view: Option<View>,
        /// Newcomers waiting.
        pending: Vec<PendingNewcomer>,
    },
    /// A refusal; see `code`.
    Error {
        /// The class.
        code: ErrorCode,
        /// A human-readable explanation.
        message: String,
    },
    /// Reply to `QueryAdmissions`: the last admissions (at most
    /// `ADMISSION_HISTORY`, oldest first) and how many there were since
    /// this coordinator started, so a reader can tell it missed some.
    Admissions {
        /// Admissions since this coordinator started.
        total: u64,
        /// The most recent ones, oldest first.
        recent: Vec<Admitted>,
    },
}

/// Why bytes could not be turned into a message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The stream does not start with `b"DUCT"`.
    #[error("bad frame magic {0:02x?} (not a ductile coordinator stream)")]
    BadMagic([u8; 4]),
    /// The header's version is not ours.
    #[error("frame protocol version {0} is not supported (this side speaks {PROTOCOL_VERSION})")]
    UnsupportedVersion(u16),
    /// Reserved header bits set.
    #[error("reserved frame header field is {0:#x}, expected 0")]
    Reserved(u16),
    /// Payload longer than `MAX_FRAME`.
    #[error("frame payload of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    Oversized(usize),
    /// The buffer ends before the frame does.
    #[error("truncated frame: need {needed} bytes, have {have}")]
    Truncated {
        /// Bytes the frame needs.
        needed: usize,
        /// Bytes available.
        have: usize,
    },
    /// The payload is not a valid message (or has trailing bytes).
    #[error("undecodable payload: {0}")]
    Malformed(String),
}

impl FrameError {
    /// The error code the coordinator reports for this decoding failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            FrameError::Oversized(_) => ErrorCode::Oversized,
            FrameError::UnsupportedVersion(_) => ErrorCode::UnsupportedVersion,
            _ => ErrorCode::Malformed,
        }
    }
}

/// Encodes `msg` as one complete frame (header and payload).
///
/// Serializing the protocol's own types cannot fail; should a payload exceed
/// `MAX_FRAME` anyway, the peer refuses it as oversized.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let payload = postcard::to_stdvec(msg).unwrap_or_default();
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Checks a frame header and returns the payload length it announces.
pub fn parse_header(header: &[u8; HEADER_LEN]) -> Result<usize, FrameError> {
    let magic = [header[0], header[1], header[2], header[3]];
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version != PROTOCOL_VERSION {
        return Err(FrameError::UnsupportedVersion(version));
    }
    let reserved = u16::from_le_bytes([header[6], header[7]]);
    if reserved != 0 {
        return Err(FrameError::Reserved(reserved));
    }
    let len = u32::from_le_bytes([header[8], header[9], header[10], header[11]]) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::Oversized(len));
    }
    Ok(len)
}

/// Decodes a postcard payload (no header); trailing bytes are an error.
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    match postcard::take_from_bytes::<T>(payload) {
        Ok((msg, [])) => Ok(msg),
        Ok((_, rest)) => Err(FrameError::Malformed(format!(
            "{} trailing bytes",
            rest.len()
        ))),
        Err(e) => Err(FrameError::Malformed(e.to_string())),
    }
}

/// Decodes exactly one complete frame held in `buf`.
pub fn decode<T: DeserializeOwned>(buf: &[u8]) -> Result<T, FrameError> {
    let header: &[u8; HEADER_LEN] = buf
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(FrameError::Truncated {
            needed: HEADER_LEN,
            have: buf.len(),
        })?;
    let len = parse_header(header)?;
    let body = &buf[HEADER_LEN..];
    if body.len() < len {
        return Err(FrameError::Truncated {
            needed: HEADER_LEN + len,
            have: buf.len(),
        });
    }
    if body.len() > len {
        return Err(FrameError::Malformed(format!(
            "{} bytes after the frame",
            body.len() - len
        )));
    }
    decode_payload(body)
}

/// Reassembles frames from a byte stream delivered in arbitrary chunks.
///
/// After the first error the reader is poisoned: the stream has lost framing
/// and the connection must be closed.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    poisoned: bool,
}

impl FrameReader {
    /// An empty reader.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if !self.poisoned {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// Bytes buffered and not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete payload, `Ok(None)` if more bytes are needed.
    /// The header is validated as soon as its 12 bytes are in.
    pub fn next_payload(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        if self.poisoned {
            return Ok(None);
        }
        let Some(header) = self.buf.get(..HEADER_LEN) else {
            // Reject a foreign stream early, before a full header arrives.
            let n = self.buf.len().min(MAGIC.len());
            if self.buf[..n] != MAGIC[..n] {
                self.poisoned = true;
                let mut magic = [0u8; 4];
                magic[..n].copy_from_slice(&self.buf[..n]);
                return Err(FrameError::BadMagic(magic));
            }
            return Ok(None);
        };
        let header: [u8; HEADER_LEN] = header.try_into().unwrap_or([0; HEADER_LEN]);
        let len = match parse_header(&header) {
            Ok(len) => len,
            Err(e) => {
                self.poisoned = true;
                return Err(e);
            }
        };
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some(payload))
    }

    /// The next complete message, `Ok(None)` if more bytes are needed.
    pub fn next_msg<T: DeserializeOwned>(&mut self) -> Result<Option<T>, FrameError> {
        match self.next_payload()? {
            None => Ok(None),
            Some(p) => match decode_payload(&p) {
                Ok(m) => Ok(Some(m)),
                Err(e) => {
                    self.poisoned = true;
                    Err(e)
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn member(node: NodeId, uid: u64) -> Member {
        Member {
            node,
            uid,
            address: vec![uid as u8],
            pes: 2,
            host: format!("h{uid}"),
            pid: 100 + uid as u32,
        }
    }

    fn view(n: u32) -> View {
        View {
            epoch: 3,
            members: (0..n).map(|i| member(i, 10 + u64::from(i))).collect(),
        }
    }

    #[test]
    fn renumber_remove_and_admit() {
        let v = view(4);
        let next = v.renumbered(&[2, 1], &[member(99, 50)]).expect("valid");
        assert_eq!(next.epoch, 4);
        let uids: Vec<u64> = next.members.iter().map(|m| m.uid).collect();
        assert_eq!(uids, vec![10, 13, 50]);
        assert!(next.check().is_ok());
        assert_eq!(v.survivor_map(&[2, 1]), vec![Some(0), None, None, Some(1)]);
    }

    #[test]
    fn renumber_refusals() {
        let v = view(3);
        assert_eq!(v.renumbered(&[0], &[]), Err(ViewError::RemovesNodeZero));
        assert!(matches!(
            v.renumbered(&[3], &[]),
            Err(ViewError::UnknownNode { node: 3, .. })
        ));
        assert_eq!(v.renumbered(&[1, 1], &[]), Err(ViewError::DuplicateNode(1)));
        assert_eq!(
            v.renumbered(&[], &[member(0, 10)]),
            Err(ViewError::DuplicateUid(10))
        );
        let single = view(1);
        assert_eq!(
            single.renumbered(&[0], &[]),
            Err(ViewError::RemovesNodeZero)
        );
    }

    #[test]
    fn header_errors_map_to_codes() {
        let mut f = encode(&ClientMsg::QueryView);
        f[4] = 9;
        assert_eq!(
            decode::<ClientMsg>(&f).map_err(|e| e.code()),
            Err(ErrorCode::UnsupportedVersion)
        );
        let mut f = encode(&ClientMsg::QueryView);
        f[0] = b'X';
        assert_eq!(
            decode::<ClientMsg>(&f).map_err(|e| e.code()),
            Err(ErrorCode::Malformed)
        );
        let mut f = encode(&ClientMsg::QueryView);
        f[8..12].copy_from_slice(&((MAX_FRAME as u32) + 1).to_le_bytes());
        assert_eq!(
            decode::<ClientMsg>(&f).map_err(|e| e.code()),
            Err(ErrorCode::Oversized)
        );
        let mut f = encode(&ClientMsg::QueryView);
        f.push(0);
        f[8] += 1;
        assert_eq!(
            decode::<ClientMsg>(&f).map_err(|e| e.code()),
            Err(ErrorCode::Malformed)
        );
    }

    #[test]
    fn reader_rejects_foreign_stream_early() {
        let mut r = FrameReader::new();
        r.push(b"GE");
        assert!(matches!(r.next_payload(), Err(FrameError::BadMagic(_))));
        assert_eq!(r.next_payload(), Ok(None));
    }

    fn arb_member() -> impl Strategy<Value = Member> {
        (
            any::<u32>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..16),
            1u32..64,
            ".{0,8}",
            any::<u32>(),
        )
            .prop_map(|(node, uid, address, pes, host, pid)| Member {
                node,
                uid,
                address,
                pes,
                host,
                pid,
            })
    }

    fn arb_view() -> impl Strategy<Value = View> {
        (1u64..1000, proptest::collection::vec(arb_member(), 1..12)).prop_map(|(epoch, ms)| View {
            epoch,
            members: ms
                .into_iter()
                .enumerate()
                .map(|(i, m)| Member {
                    node: i as u32,
                    uid: i as u64 * 1000 + (m.uid % 1000),
                    ..m
                })
                .collect(),
        })
    }

    fn arb_client_msg() -> impl Strategy<Value = ClientMsg> {
        prop_oneof![
            (any::<u16>(), any::<[u8; 32]>())
                .prop_map(|(protocol, proof)| ClientMsg::Hello { protocol, proof }),
            (arb_member(), any::<Option<u32>>(), any::<u64>()).prop_map(|(m, idx, fingerprint)| {
                ClientMsg::Register(Registration {
                    role: idx.map_or(Role::Newcomer, |index| Role::Launch { index }),
                    address: m.address,
                    pes: m.pes,
                    host: m.host,
                    pid: m.pid,
                    fingerprint,
                })
            }),
            (any::<u64>(), any::<i32>())
                .prop_map(|(epoch, code)| ClientMsg::ShutdownReady { epoch, code }),
            any::<u64>().prop_map(|epoch| ClientMsg::QueryPending { epoch }),
            (
                any::<u64>(),
                proptest::collection::vec(any::<u32>(), 0..8),
                any::<u32>()
            )
                .prop_map(|(epoch, remove, admit)| ClientMsg::Commit {
                    epoch,
                    remove,
                    admit
                }),
            (arb_view(), any::<u64>())
                .prop_map(|(view, fingerprint)| ClientMsg::Restore { view, fingerprint }),
            (any::<u64>(), any::<u64>())
                .prop_map(|(epoch, uid)| ClientMsg::Reattach { epoch, uid }),
            Just(ClientMsg::QueryView),
            Just(ClientMsg::QueryAdmissions),
            Just(ClientMsg::Heartbeat),
        ]
    }

    fn arb_server_msg() -> impl Strategy<Value = ServerMsg> {
        prop_oneof![
            any::<[u8; 32]>().prop_map(|nonce| ServerMsg::Challenge {
                protocol: PROTOCOL_VERSION,
                nonce
            }),
            Just(ServerMsg::Welcome),
            (any::<u32>(), arb_view()).prop_map(|(node, view)| ServerMsg::Start { node, view }),
            (any::<u64>(), arb_view()).prop_map(|(uid, view)| ServerMsg::Waiting { uid, view }),
            (any::<u32>(), arb_view()).prop_map(|(node, view)| ServerMsg::Integrate { node, view }),
            any::<u64>().prop_map(|epoch| ServerMsg::Die { epoch }),
            arb_view().prop_map(|view| ServerMsg::Committed { view }),
            proptest::option::of(arb_view()).prop_map(|view| ServerMsg::CurrentView {
                view,
                pending: vec![]
            }),
            (any::<u64>(), any::<i32>())
                .prop_map(|(epoch, code)| ServerMsg::ShutdownDone { epoch, code }),
            (
                any::<u64>(),
                proptest::collection::vec((any::<u64>(), any::<u64>(), any::<u32>()), 0..4)
            )
                .prop_map(|(total, r)| ServerMsg::Admissions {
                    total,
                    recent: r
                        .into_iter()
                        .map(|(epoch, uid, pid)| Admitted { epoch, uid, pid })
                        .collect()
                }),
            ".{0,40}".prop_map(|message| ServerMsg::Error {
                code: ErrorCode::StaleEpoch,
                message
            }),
        ]
    }

    proptest! {
        #[test]
        fn client_frames_round_trip(msg in arb_client_msg(), split in 0usize..64) {
            let frame = encode(&msg);
            prop_assert_eq!(decode::<ClientMsg>(&frame), Ok(msg.clone()));
            // Any chunking yields the same message through the streaming reader.
            let mut r = FrameReader::new();
            let cut = split.min(frame.len());
            r.push(&frame[..cut]);
            let first = r.next_msg::<ClientMsg>();
            prop_assert!(first.is_ok());
            r.push(&frame[cut..]);
            let got = match first { Ok(Some(m)) => Some(m), _ => r.next_msg::<ClientMsg>().ok().flatten() };
            prop_assert_eq!(got, Some(msg));
            prop_assert_eq!(r.buffered(), 0);
        }

        #[test]
        fn server_frames_round_trip(msg in arb_server_msg()) {
            prop_assert_eq!(decode::<ServerMsg>(&encode(&msg)), Ok(msg));
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<ClientMsg>(&bytes);
            let _ = decode::<ServerMsg>(&bytes);
            let _ = decode_payload::<ClientMsg>(&bytes);
            let mut r = FrameReader::new();
            r.push(&bytes);
            for _ in 0..4 { let _ = r.next_msg::<ServerMsg>(); }
        }

        #[test]
        fn random_payload_behind_valid_header_never_panics(payload in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut frame = Vec::new();
            frame.extend_from_slice(&MAGIC);
            frame.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
            frame.extend_from_slice(&0u16.to_le_bytes());
            frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            frame.extend_from_slice(&payload);
            let _ = decode::<ClientMsg>(&frame);
            let _ = decode::<ServerMsg>(&frame);
        }

        #[test]
        fn renumbered_is_compact_and_ordered(v in arb_view(), picks in proptest::collection::vec(any::<bool>(), 12), admit in 0usize..4) {
            let remove: Vec<NodeId> = (1..v.members.len() as u32).filter(|&i| picks[i as usize]).collect();
            let admitted: Vec<Member> = (0..admit).map(|i| member(7, 1_000_000 + i as u64)).collect();
            let next = v.renumbered(&remove, &admitted).expect("valid removal");
            prop_assert_eq!(next.epoch, v.epoch + 1);
            prop_assert!(next.check().is_ok());
            prop_assert_eq!(next.members.len(), v.members.len() - remove.len() + admit);
            prop_assert_eq!(next.members[0].uid, v.members[0].uid);
            let map = v.survivor_map(&remove);
            let mut last: Option<NodeId> = None;
            for (old, new) in map.iter().enumerate() {
                match new {
                    None => prop_assert!(remove.contains(&(old as u32))),
                    Some(n) => {
                        prop_assert_eq!(next.members[*n as usize].uid, v.members[old].uid);
                        prop_assert!(last.is_none_or(|l| l < *n));
                        last = Some(*n);
                    }
                }
            }
            for (i, a) in admitted.iter().enumerate() {
                prop_assert_eq!(next.members[v.members.len() - remove.len() + i].uid, a.uid);
            }
        }
    }
}
