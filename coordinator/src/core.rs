//! The coordinator's protocol state machine, sans-IO.
//!
//! [`Coordinator`] owns the job's membership (epoch, ordered members, pending
//! newcomers) and the per-connection protocol state. It has no sockets and no
//! clock: the driver (the tokio server in [`crate::server`], or a test) feeds it
//! connection events, received bytes and the current time, and carries out the
//! [`Action`]s it returns, in order. Timeouts are reported through
//! [`Coordinator::next_deadline`] and fired by [`Coordinator::on_tick`].
//!
//! Invariant kept throughout: a refused message changes nothing but the
//! refused connection's own state.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::RngCore;
use tracing::{debug, error, info, warn};

use crate::proto::{
    Admitted, ClientMsg, Epoch, ErrorCode, FrameReader, Member, NodeId, PendingNewcomer,
    Registration, Role, ServerMsg, View, PROTOCOL_VERSION,
};
use crate::secret::{Secret, AUTH_CONTEXT};

/// Exit code the coordinator finishes with when the launch (or the wait for
/// `Restore`) does not complete within `launch_timeout`.
pub const EXIT_LAUNCH_TIMEOUT: i32 = 3;

/// Job exit code when the shutdown barrier completes without node 0's code (node 0 was lost).
pub const EXIT_NODE0_LOST: i32 = 4;

/// Exit code the coordinator finishes with when the job started but no
/// member has been connected for `idle_timeout` (its nodes are gone).
pub const EXIT_NO_MEMBERS: i32 = 5;

/// A member silent this long is declared lost (`--heartbeat-timeout`).
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(30);

/// Admissions the coordinator remembers (answers to `QueryAdmissions`):
/// a ring, so a job rescaled for weeks keeps no more than this.
pub const ADMISSION_HISTORY: usize = 256;

/// Driver-chosen identifier of one connection; never reused by a driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// What the coordinator needs to know about its job.
#[derive(Clone, Debug)]
pub struct Config {
    /// Launch size N; `None` starts in recovery mode, waiting for `Restore`.
    pub expected: Option<u32>,
    /// How long launch registration (or the wait for `Restore`) may take.
    pub launch_timeout: Duration,
    /// How long a new connection may take to authenticate, in total from
    /// its accept (a peer trickling bytes gets no longer); 3 s by default.
    pub hello_timeout: Duration,
    /// How long a started job may have no member connected before the
    /// coordinator gives it up and finishes with [`EXIT_NO_MEMBERS`]: its
    /// nodes are gone, and nobody else would end it. Longer than a node's
    /// rejoin window after a coordinator restart (30 s by default), so a
    /// rejoin is never cut short.
    pub idle_timeout: Duration,
    /// How long a running member may send nothing (its node sends a
    /// heartbeat every [`crate::proto::HEARTBEAT_EVERY`]) before it is
    /// declared lost: the others get `MemberLost`, its connection is closed
    /// and it may not reattach. A hung node (stopped, frozen, cut off) is
    /// found this way; a dead one by its connection's end. `None`: never.
    pub heartbeat_timeout: Option<Duration>,
    /// The job secret.
    pub secret: Secret,
}

impl Config {
    /// A coordinator for a fresh launch of `expected` nodes (60 s launch timeout).
    pub fn launch(secret: Secret, expected: u32) -> Self {
        Config {
            expected: Some(expected),
            ..Self::recovery(secret)
        }
    }

    /// A restarted coordinator that waits for node 0's `Restore`.
    pub fn recovery(secret: Secret) -> Self {
        Config {
            expected: None,
            launch_timeout: Duration::from_secs(60),
            hello_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(60),
            heartbeat_timeout: Some(DEFAULT_HEARTBEAT_TIMEOUT),
            secret,
        }
    }
}

/// What the driver must do, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send a message on a connection.
    Send(ConnId, ServerMsg),
    /// Close a connection once everything sent before on it is flushed.
    Close(ConnId),
    /// The job is over (shutdown barrier passed, or launch failed): flush, close everything, exit with `code`.
    Finished {
        /// Process exit code.
        code: i32,
    },
}

/// Coarse life-cycle stage of the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    /// Waiting for the N launch members.
    Launching,
    /// Restarted; waiting for node 0's `Restore`.
    Recovering,
    /// A view exists: rescales and the shutdown barrier are possible.
    Running,
    /// Done; every further event is ignored.
    Finished,
}

#[derive(Debug)]
enum Peer {
    Unauthenticated {
        nonce: [u8; 32],
        deadline: Instant,
    },
    /// Authenticated, not registered (also tools and replaced connections).
    Idle,
    LaunchWaiting {
        index: u32,
    },
    Newcomer,
    Member {
        uid: u64,
    },
    /// Removed by a commit; its disconnect is expected.
    Departed,
}

#[derive(Debug)]
struct Conn {
    reader: FrameReader,
    peer: Peer,
    /// When it last sent a message.
    heard: Instant,
}

#[derive(Debug)]
struct Pending {
    conn: ConnId,
    /// Assigned when a view exists (deferred in recovery so it cannot collide with restored uids).
    uid: Option<u64>,
    reg: Registration,
}

type Refusal = (ErrorCode, String);

/// The coordinator state machine. See the module docs.
#[derive(Debug)]
pub struct Coordinator {
    cfg: Config,
    rng: StdRng,
    phase: Lifecycle,
    conns: BTreeMap<ConnId, Conn>,
    view: Option<View>,
    member_conn: HashMap<u64, ConnId>,
    launch: BTreeMap<u32, (ConnId, Registration)>,
    pending: Vec<Pending>,
    fingerprint: Option<u64>,
    next_uid: u64,
    /// Shutdown barrier: uid -> exit code.
    ready: BTreeMap<u64, i32>,
    launch_deadline: Option<Instant>,
    /// Since when the running job has had no member connected.
    alone_since: Option<Instant>,
    failure: Option<String>,
    /// The last [`ADMISSION_HISTORY`] admissions, oldest first.
    admissions: VecDeque<Admitted>,
    /// Admissions since this coordinator started.
    admitted_total: u64,
    /// Members declared lost for their silence: they may not reattach.
    silent: BTreeSet<u64>,
    /// Members of the current view announced lost (`MemberLost`): no
    /// commit from this view may keep them.
    lost: BTreeSet<u64>,
    /// The last event of any kind (ticks included).
    last_event: Option<Instant>,
}

/// How much per-connection and per-job state the coordinator holds (for
/// tests and soak runs: none of it may grow with the number of rescales).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// Connections it knows (any state).
    pub conns: usize,
    /// Members with a connection.
    pub member_conns: usize,
    /// Newcomers waiting.
    pub pending: usize,
    /// Admissions remembered.
    pub admissions: usize,
    /// Entries of the shutdown barrier and of the launch table.
    pub barrier_and_launch: usize,
}

impl Coordinator {
    /// A coordinator with `cfg`; nonces come from `rng` (seed it from the OS in
    /// production, from a constant in tests).
    pub fn new(cfg: Config, rng: StdRng) -> Self {
        let phase = if cfg.expected.is_some() {
            Lifecycle::Launching
        } else {
            Lifecycle::Recovering
        };
        Coordinator {
            cfg,
            rng,
            phase,
            conns: BTreeMap::new(),
            view: None,
            member_conn: HashMap::new(),
            launch: BTreeMap::new(),
            pending: Vec::new(),
            fingerprint: None,
            next_uid: 1,
            ready: BTreeMap::new(),
            launch_deadline: None,
            alone_since: None,
            failure: None,
            admissions: VecDeque::new(),
            admitted_total: 0,
            silent: BTreeSet::new(),
            lost: BTreeSet::new(),
            last_event: None,
        }
    }

    /// The state held now; see [`Footprint`].
    pub fn footprint(&self) -> Footprint {
        Footprint {
            conns: self.conns.len(),
            member_conns: self.member_conn.len(),
            pending: self.pending.len(),
            admissions: self.admissions.len(),
            barrier_and_launch: self.ready.len() + self.launch.len(),
        }
    }

    /// The recent admissions, oldest first, and how many there were in all.
    pub fn admissions(&self) -> (u64, Vec<Admitted>) {
        (
            self.admitted_total,
            self.admissions.iter().copied().collect(),
        )
    }

    /// The current view, once launch or restore is done.
    pub fn view(&self) -> Option<&View> {
        self.view.as_ref()
    }

    /// The life-cycle stage.
    pub fn phase(&self) -> Lifecycle {
        self.phase
    }

    /// Why the coordinator finished unsuccessfully (launch timeout), if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Newcomers waiting for admission, in admission order (uid 0 until a view exists).
    pub fn pending(&self) -> Vec<PendingNewcomer> {
        self.pending
            .iter()
            .map(|p| PendingNewcomer {
                uid: p.uid.unwrap_or(0),
                pes: p.reg.pes,
                host: p.reg.host.clone(),
                pid: p.reg.pid,
            })
            .collect()
    }

    /// The earliest time at which `on_tick` has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.phase == Lifecycle::Finished {
            return None;
        }
        let hello = self.conns.values().filter_map(|c| match c.peer {
            Peer::Unauthenticated { deadline, .. } => Some(deadline),
            _ => None,
        });
        let launch = match self.phase {
            Lifecycle::Launching | Lifecycle::Recovering => self.launch_deadline,
            _ => None,
        };
        let alone = self.alone_since.map(|since| since + self.cfg.idle_timeout);
        let silent = self.heartbeat_timeout().and_then(|timeout| {
            self.member_conn
                .iter()
                .filter(|(uid, _)| !self.ready.contains_key(uid))
                .filter_map(|(_, c)| self.conns.get(c))
                .map(|c| c.heard + timeout)
                .min()
        });
        // Ticks at least every quarter of the timeout: a longer gap between
        // events is then the coordinator's own pause (see `arm`), never
        // the members' silence.
        let awake = self
            .heartbeat_timeout()
            .and_then(|timeout| Some(self.last_event? + timeout / 4));
        hello
            .chain(launch)
            .chain(alone)
            .chain(silent)
            .chain(awake)
            .min()
    }

    /// The silence after which a member is lost, while the job runs.
    fn heartbeat_timeout(&self) -> Option<Duration> {
        self.cfg
            .heartbeat_timeout
            .filter(|_| self.phase == Lifecycle::Running)
    }

    /// Starts or stops the clock of a running job without connected members
    /// (called after every event, when membership and connections may have changed).
    fn note_members(&mut self, now: Instant) {
        if self.phase == Lifecycle::Running && self.member_conn.is_empty() {
            self.alone_since.get_or_insert(now);
        } else {
            self.alone_since = None;
        }
    }

    fn arm(&mut self, now: Instant) {
        let last = self.last_event.replace(now);
        let gap = last.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        if self
            .heartbeat_timeout()
            .is_some_and(|timeout| gap > timeout / 2)
        {
            // The coordinator itself did not run (stopped, its host paused):
            // nobody could be heard meanwhile, whatever its first event is.
            warn!(
                "the coordinator itself did not run for {:.1}s: members' silences are counted from now",
                gap.as_secs_f64()
            );
            for c in self.conns.values_mut() {
                c.heard = now;
            }
        }
        if self.launch_deadline.is_none()
            && matches!(self.phase, Lifecycle::Launching | Lifecycle::Recovering)
        {
            self.launch_deadline = Some(now + self.cfg.launch_timeout);
        }
    }

    /// A new connection: the coordinator challenges it.
    pub fn on_connect(&mut self, conn: ConnId, now: Instant) -> Vec<Action> {
        self.arm(now);
        if self.phase == Lifecycle::Finished {
            return vec![Action::Close(conn)];
        }
        let mut nonce = [0u8; 32];
        self.rng.fill_bytes(&mut nonce);
        let deadline = now + self.cfg.hello_timeout;
        self.conns.insert(
            conn,
            Conn {
                reader: FrameReader::new(),
                peer: Peer::Unauthenticated { nonce, deadline },
                heard: now,
            },
        );
        vec![Action::Send(
            conn,
            ServerMsg::Challenge {
                protocol: PROTOCOL_VERSION,
                nonce,
            },
        )]
    }

    /// Bytes received on `conn`, in any chunking; complete frames are handled in order.
    pub fn on_frame(&mut self, conn: ConnId, bytes: &[u8], now: Instant) -> Vec<Action> {
        self.arm(now);
        let mut out = Vec::new();
        if let Some(c) = self.conns.get_mut(&conn) {
            c.reader.push(bytes);
        }
        while self.phase != Lifecycle::Finished {
            let Some(c) = self.conns.get_mut(&conn) else {
                break;
            };
            match c.reader.next_msg::<ClientMsg>() {
                Ok(Some(msg)) => self.handle(conn, msg, now, &mut out),
                Ok(None) => break,
                Err(e) => {
                    warn!(conn = conn.0, error = %e, "refusing bad frame");
                    self.refuse_and_close(conn, e.code(), e.to_string(), &mut out);
                    break;
                }
            }
        }
        self.note_members(now);
        out
    }

    /// One decoded message from `conn` (drivers that decode themselves, and tests).
    pub fn on_message(&mut self, conn: ConnId, msg: ClientMsg, now: Instant) -> Vec<Action> {
        self.arm(now);
        let mut out = Vec::new();
        if self.phase != Lifecycle::Finished && self.conns.contains_key(&conn) {
            self.handle(conn, msg, now, &mut out);
        }
        self.note_members(now);
        out
    }

    /// The connection is gone (peer closed, I/O error).
    pub fn on_disconnect(&mut self, conn: ConnId, now: Instant) -> Vec<Action> {
        self.arm(now);
        let mut out = Vec::new();
        self.forget(conn, &mut out);
        self.note_members(now);
        out
    }

    /// Time passed: fires the launch and authentication timeouts that are due.
    pub fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        self.arm(now);
        let mut out = Vec::new();
        if self.phase == Lifecycle::Finished {
            return out;
        }
        let late: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.peer, Peer::Unauthenticated { deadline, .. } if deadline <= now))
            .map(|(&id, _)| id)
            .collect();
        for conn in late {
            let msg = format!("no Hello within {:?}", self.cfg.hello_timeout);
            self.refuse_and_close(conn, ErrorCode::Unauthenticated, msg, &mut out);
        }
        self.silences(now, &mut out);
        let waiting = matches!(self.phase, Lifecycle::Launching | Lifecycle::Recovering);
        if waiting && self.launch_deadline.is_some_and(|d| d <= now) {
            let message = match self.cfg.expected {
                Some(n) => {
                    let missing: Vec<u32> =
                        (0..n).filter(|i| !self.launch.contains_key(i)).collect();
                    format!(
                        "launch timed out after {:?}: {} of {} launch members registered; missing launch indices {:?}",
                        self.cfg.launch_timeout,
                        self.launch.len(),
                        n,
                        missing
                    )
                }
                None => format!(
                    "recovery timed out after {:?}: node 0 never sent Restore",
                    self.cfg.launch_timeout
                ),
            };
            error!("{message}");
            let conns: Vec<ConnId> = self.conns.keys().copied().collect();
            for conn in conns {
                out.push(Action::Send(
                    conn,
                    ServerMsg::Error {
                        code: ErrorCode::LaunchTimeout,
                        message: message.clone(),
                    },
                ));
                out.push(Action::Close(conn));
            }
            self.conns.clear();
            self.phase = Lifecycle::Finished;
            self.failure = Some(message);
            out.push(Action::Finished {
                code: EXIT_LAUNCH_TIMEOUT,
            });
        }
        self.note_members(now);
        if let Some(since) = self
            .alone_since
            .filter(|&s| s + self.cfg.idle_timeout <= now)
        {
            let message = format!(
                "no member of the job has been connected for {:.1}s (epoch {}): its nodes are gone; the coordinator exits",
                now.duration_since(since).as_secs_f64(),
                self.view.as_ref().map_or(0, |v| v.epoch)
            );
            error!("{message}");
            for &conn in self.conns.keys() {
                out.push(Action::Close(conn));
            }
            self.conns.clear();
            self.phase = Lifecycle::Finished;
            self.alone_since = None;
            self.failure = Some(message);
            out.push(Action::Finished {
                code: EXIT_NO_MEMBERS,
            });
        }
        out
    }

    fn send(out: &mut Vec<Action>, conn: ConnId, msg: ServerMsg) {
        out.push(Action::Send(conn, msg));
    }

    fn refuse(out: &mut Vec<Action>, conn: ConnId, code: ErrorCode, message: String) {
        debug!(conn = conn.0, ?code, %message, "refused");
        out.push(Action::Send(conn, ServerMsg::Error { code, message }));
    }

    fn refuse_and_close(
        &mut self,
        conn: ConnId,
        code: ErrorCode,
        message: String,
        out: &mut Vec<Action>,
    ) {
        if !self.conns.contains_key(&conn) {
            return;
        }
        Self::refuse(out, conn, code, message);
        out.push(Action::Close(conn));
        self.forget(conn, out);
    }

    /// Drops all state of `conn`; a member that leaves this way is announced as lost.
    fn forget(&mut self, conn: ConnId, out: &mut Vec<Action>) {
        let Some(c) = self.conns.remove(&conn) else {
            return;
        };
        match c.peer {
            Peer::Unauthenticated { .. } | Peer::Idle | Peer::Departed => {}
            Peer::LaunchWaiting { index } => {
                if self
                    .launch
                    .get(&index)
                    .is_some_and(|(owner, _)| *owner == conn)
                {
                    info!(
                        index,
                        "launch member left before launch completed; its index is free again"
                    );
                    self.launch.remove(&index);
                }
            }
            Peer::Newcomer => {
                self.pending.retain(|p| p.conn != conn);
                info!(
                    conn = conn.0,
                    "pending newcomer disconnected; dropped from the queue"
                );
            }
            Peer::Member { uid } => {
                if self.member_conn.get(&uid) != Some(&conn) {
                    return;
                }
                self.member_conn.remove(&uid);
                if self.phase != Lifecycle::Running || self.ready.contains_key(&uid) {
                    return;
                }
                let Some(view) = &self.view else { return };
                let Some(m) = view.by_uid(uid) else { return };
                let (epoch, node) = (view.epoch, m.node);
                warn!(epoch, node, uid, "member lost its coordinator connection");
                self.lost.insert(uid);
                for m in &view.members {
                    if let Some(&c) = self.member_conn.get(&m.uid) {
                        Self::send(out, c, ServerMsg::MemberLost { epoch, node, uid });
                    }
                }
                if !self.ready.is_empty() {
                    // The job is shutting down: a member lost now is not waited
                    // for, so one crash cannot hang everybody else's exit.
                    self.complete_barrier(out);
                }
            }
        }
    }

    /// Declares lost the members silent for the heartbeat timeout (a
    /// pause of the coordinator's own does not count: see `arm`).
    fn silences(&mut self, now: Instant, out: &mut Vec<Action>) {
        let Some(timeout) = self.heartbeat_timeout() else {
            return;
        };
        let silent: Vec<(u64, ConnId, Instant)> = self
            .member_conn
            .iter()
            // Members in the shutdown barrier wait there, silent.
            .filter(|(uid, _)| !self.ready.contains_key(uid))
            .filter_map(|(&uid, &conn)| Some((uid, conn, self.conns.get(&conn)?.heard)))
            .filter(|&(_, _, heard)| heard + timeout <= now)
            .collect();
        for (uid, conn, heard) in silent {
            let node = self
                .view
                .as_ref()
                .and_then(|v| v.by_uid(uid))
                .map(|m| m.node);
            warn!(
                ?node,
                uid,
                "member sent nothing for {:.1}s (heartbeat timeout {:?}): declared lost, its connection closed",
                now.duration_since(heard).as_secs_f64(),
                timeout
            );
            self.silent.insert(uid);
            self.forget(conn, out);
            out.push(Action::Close(conn));
        }
    }

    fn handle(&mut self, conn: ConnId, msg: ClientMsg, now: Instant, out: &mut Vec<Action>) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.heard = now;
        if let Peer::Unauthenticated { nonce, .. } = c.peer {
            let ClientMsg::Hello { protocol, proof } = msg else {
                let message = "the first message must be Hello".to_owned();
                return self.refuse_and_close(conn, ErrorCode::Unauthenticated, message, out);
            };
            if protocol != PROTOCOL_VERSION {
                let message = format!(
                    "client speaks protocol {protocol}, coordinator speaks {PROTOCOL_VERSION}"
                );
                return self.refuse_and_close(conn, ErrorCode::UnsupportedVersion, message, out);
            }
            if !self.cfg.secret.verify(AUTH_CONTEXT, &nonce, &proof) {
                warn!(conn = conn.0, "authentication failed (wrong job secret?)");
                let message = "authentication failed: wrong job secret".to_owned();
                return self.refuse_and_close(conn, ErrorCode::Unauthenticated, message, out);
            }
            c.peer = Peer::Idle;
            return Self::send(out, conn, ServerMsg::Welcome);
        }
        match msg {
            ClientMsg::Hello { .. } => {
                self.refuse_and_close(
                    conn,
                    ErrorCode::Malformed,
                    "Hello sent twice".to_owned(),
                    out,
                );
            }
            ClientMsg::Register(reg) => self.register(conn, reg, now, out),
            ClientMsg::QueryPending { epoch } => match self.require_member(conn, epoch) {
                Err((code, message)) => Self::refuse(out, conn, code, message),
                Ok(_) => {
                    let newcomers = self.pending();
                    Self::send(out, conn, ServerMsg::Pending { epoch, newcomers });
                }
            },
            ClientMsg::Commit {
                epoch,
                remove,
                admit,
            } => {
                if let Err((code, message)) = self.commit(conn, epoch, &remove, admit, out) {
                    Self::refuse(out, conn, code, message);
                }
            }
            ClientMsg::ShutdownReady { epoch, code } => {
                if let Err((ecode, message)) = self.shutdown_ready(conn, epoch, code, out) {
                    Self::refuse(out, conn, ecode, message);
                }
            }
            ClientMsg::Restore { view, fingerprint } => {
                if let Err((code, message)) = self.restore(conn, view, fingerprint, out) {
                    Self::refuse(out, conn, code, message);
                }
            }
            ClientMsg::Reattach { epoch, uid } => {
                if let Err((code, message)) = self.reattach(conn, epoch, uid, out) {
                    Self::refuse(out, conn, code, message);
                }
            }
            ClientMsg::QueryView => {
                let msg = ServerMsg::CurrentView {
                    view: self.view.clone(),
                    pending: self.pending(),
                };
                Self::send(out, conn, msg);
            }
            ClientMsg::QueryAdmissions => {
                let (total, recent) = self.admissions();
                Self::send(out, conn, ServerMsg::Admissions { total, recent });
            }
            ClientMsg::Heartbeat => {}
        }
    }

    fn check_fingerprint(&self, fingerprint: u64) -> Result<(), Refusal> {
        match self.fingerprint {
            Some(job) if job != fingerprint => Err((
                ErrorCode::FingerprintMismatch,
                format!(
                    "build fingerprint mismatch: this node has {fingerprint:016x}, the job has {job:016x}; \
                     all nodes of a job must run the same build"
                ),
            )),
            _ => Ok(()),
        }
    }

    fn register(&mut self, conn: ConnId, reg: Registration, now: Instant, out: &mut Vec<Action>) {
        let registered = !matches!(self.conns.get(&conn).map(|c| &c.peer), Some(Peer::Idle));
        if registered {
            let message = "this connection is already registered".to_owned();
            return self.refuse_and_close(conn, ErrorCode::Malformed, message, out);
        }
        if reg.pes == 0 {
            return self.refuse_and_close(
                conn,
                ErrorCode::Malformed,
                "a node needs at least one PE".to_owned(),
                out,
            );
        }
        let defer_fingerprint =
            self.phase == Lifecycle::Recovering && matches!(reg.role, Role::Newcomer);
        if !defer_fingerprint {
            if let Err((code, message)) = self.check_fingerprint(reg.fingerprint) {
                warn!(pid = reg.pid, host = %reg.host, "{message}");
                return self.refuse_and_close(conn, code, message, out);
            }
        }
        match reg.role {
            Role::Launch { index } => {
                let expected = match (self.phase, self.cfg.expected) {
                    (Lifecycle::Launching, Some(n)) => n,
                    _ => {
                        let message = match &self.view {
                            Some(v) => format!(
                                "launch is over (epoch {}); a process started later must register as a newcomer",
                                v.epoch
                            ),
                            None => "coordinator is recovering: members reattach, new processes register as newcomers"
                                .to_owned(),
                        };
                        return self.refuse_and_close(
                            conn,
                            ErrorCode::DuplicateIndex,
                            message,
                            out,
                        );
                    }
                };
                if index >= expected {
                    let message = format!("launch index {index} is out of range 0..{expected}");
                    return self.refuse_and_close(conn, ErrorCode::InvalidCommit, message, out);
                }
                if let Some((_, other)) = self.launch.get(&index) {
                    let message = format!(
                        "launch index {index} is already registered (pid {} on {})",
                        other.pid, other.host
                    );
                    return self.refuse_and_close(conn, ErrorCode::DuplicateIndex, message, out);
                }
                self.fingerprint = Some(reg.fingerprint);
                debug!(index, pid = reg.pid, host = %reg.host, "launch member registered");
                self.launch.insert(index, (conn, reg));
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.peer = Peer::LaunchWaiting { index };
                }
                if self.launch.len() == expected as usize {
                    self.complete_launch(now, out);
                }
            }
            Role::Newcomer => {
                if !defer_fingerprint {
                    self.fingerprint = Some(reg.fingerprint);
                }
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.peer = Peer::Newcomer;
                }
                info!(pid = reg.pid, host = %reg.host, pes = reg.pes, "newcomer registered");
                self.pending.push(Pending {
                    conn,
                    uid: None,
                    reg,
                });
                self.announce_pending(out);
            }
        }
    }

    /// Gives queued newcomers their uid and current view, once a view exists.
    fn announce_pending(&mut self, out: &mut Vec<Action>) {
        let Some(view) = &self.view else { return };
        for p in self.pending.iter_mut().filter(|p| p.uid.is_none()) {
            let uid = self.next_uid;
            self.next_uid += 1;
            p.uid = Some(uid);
            out.push(Action::Send(
                p.conn,
                ServerMsg::Waiting {
                    uid,
                    view: view.clone(),
                },
            ));
        }
    }

    fn complete_launch(&mut self, _now: Instant, out: &mut Vec<Action>) {
        let launch = std::mem::take(&mut self.launch);
        let mut members = Vec::with_capacity(launch.len());
        let mut conns = Vec::with_capacity(launch.len());
        for (index, (conn, reg)) in launch {
            let uid = self.next_uid;
            self.next_uid += 1;
            members.push(Member {
                node: index,
                uid,
                address: reg.address,
                pes: reg.pes,
                host: reg.host,
                pid: reg.pid,
            });
            conns.push((conn, uid));
        }
        let view = View { epoch: 1, members };
        info!(
            nodes = view.members.len(),
            pes = view.total_pes(),
            "launch complete: epoch 1"
        );
        for (node, (conn, uid)) in conns.into_iter().enumerate() {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.peer = Peer::Member { uid };
            }
            self.member_conn.insert(uid, conn);
            let node = NodeId::try_from(node).unwrap_or(NodeId::MAX);
            out.push(Action::Send(
                conn,
                ServerMsg::Start {
                    node,
                    view: view.clone(),
                },
            ));
        }
        self.view = Some(view);
        self.phase = Lifecycle::Running;
        self.launch_deadline = None;
        self.announce_pending(out);
    }

    /// The uid of `conn` if it is a member of the current view and `epoch` is current.
    fn require_member(&self, conn: ConnId, epoch: Epoch) -> Result<u64, Refusal> {
        let Some(view) = &self.view else {
            return Err((
                ErrorCode::NotReady,
                "no view yet: launch or restore is not complete".to_owned(),
            ));
        };
        let uid = match self.conns.get(&conn).map(|c| &c.peer) {
            Some(Peer::Member { uid }) if view.by_uid(*uid).is_some() => *uid,
            _ => {
                let message = format!(
                    "this connection is not a member of view epoch {}",
                    view.epoch
                );
                return Err((ErrorCode::NotMember, message));
            }
        };
        if epoch != view.epoch {
            let message = format!(
                "message refers to epoch {epoch} but the current epoch is {}",
                view.epoch
            );
            return Err((ErrorCode::StaleEpoch, message));
        }
        Ok(uid)
    }

    fn commit(
        &mut self,
        conn: ConnId,
        epoch: Epoch,
        remove: &[NodeId],
        admit: u32,
        out: &mut Vec<Action>,
    ) -> Result<(), Refusal> {
        let committer = self.require_member(conn, epoch)?;
        if !self.ready.is_empty() {
            return Err((
                ErrorCode::NotReady,
                "a shutdown barrier is in progress".to_owned(),
            ));
        }
        let Some(view) = self.view.clone() else {
            return Err((ErrorCode::Internal, "no view".to_owned()));
        };
        let admit = admit as usize;
        if admit > self.pending.len() {
            let message = format!(
                "admit {admit} exceeds the {} pending newcomers",
                self.pending.len()
            );
            return Err((ErrorCode::InvalidCommit, message));
        }
        if view
            .by_uid(committer)
            .is_some_and(|m| remove.contains(&m.node))
        {
            return Err((
                ErrorCode::InvalidCommit,
                "the committer cannot remove itself".to_owned(),
            ));
        }
        let mut admitted = Vec::with_capacity(admit);
        for p in &self.pending[..admit] {
            let Some(uid) = p.uid else {
                return Err((
                    ErrorCode::Internal,
                    "pending newcomer without uid".to_owned(),
                ));
            };
            let r = &p.reg;
            admitted.push(Member {
                node: 0,
                uid,
                address: r.address.clone(),
                pes: r.pes,
                host: r.host.clone(),
                pid: r.pid,
            });
        }
        if let Some(m) = view
            .members
            .iter()
            .find(|m| self.lost.contains(&m.uid) && !remove.contains(&m.node))
        {
            return Err((
                ErrorCode::MemberLost,
                format!(
                    "node {} (uid {}) was lost in epoch {epoch}; a commit from it must remove that node",
                    m.node, m.uid
                ),
            ));
        }
        let next = view
            .renumbered(remove, &admitted)
            .map_err(|e| (ErrorCode::InvalidCommit, e.to_string()))?;
        let removed: Vec<u64> = remove
            .iter()
            .filter_map(|&n| view.member(n))
            .map(|m| m.uid)
            .collect();
        info!(
            from = epoch,
            to = next.epoch,
            removed = removed.len(),
            admitted = admit,
            nodes = next.members.len(),
            pes = next.total_pes(),
            "commit applied"
        );
        for uid in removed {
            if let Some(c) = self.member_conn.remove(&uid) {
                if let Some(state) = self.conns.get_mut(&c) {
                    state.peer = Peer::Departed;
                }
                Self::send(out, c, ServerMsg::Die { epoch: next.epoch });
            }
        }
        let admitted_conns: Vec<ConnId> = self.pending.drain(..admit).map(|p| p.conn).collect();
        for m in &admitted {
            if self.admissions.len() == ADMISSION_HISTORY {
                self.admissions.pop_front();
            }
            self.admissions.push_back(Admitted {
                epoch: next.epoch,
                uid: m.uid,
                pid: m.pid,
            });
            self.admitted_total += 1;
        }
        for (m, c) in admitted.iter().zip(admitted_conns) {
            if let Some(state) = self.conns.get_mut(&c) {
                state.peer = Peer::Member { uid: m.uid };
            }
            self.member_conn.insert(m.uid, c);
            let node = next.by_uid(m.uid).map_or(0, |m| m.node);
            Self::send(
                out,
                c,
                ServerMsg::Integrate {
                    node,
                    view: next.clone(),
                },
            );
        }
        Self::send(out, conn, ServerMsg::Committed { view: next.clone() });
        for m in &next.members[..next.members.len() - admit] {
            match self.member_conn.get(&m.uid) {
                Some(&c) if c != conn => {
                    Self::send(out, c, ServerMsg::ViewUpdate { view: next.clone() })
                }
                _ => {}
            }
        }
        self.view = Some(next);
        // Every member announced lost was removed by this commit.
        self.lost.clear();
        Ok(())
    }

    fn shutdown_ready(
        &mut self,
        conn: ConnId,
        epoch: Epoch,
        code: i32,
        out: &mut Vec<Action>,
    ) -> Result<(), Refusal> {
        let uid = self.require_member(conn, epoch)?;
        self.ready.insert(uid, code);
        debug!(uid, code, ready = self.ready.len(), "shutdown ready");
        self.complete_barrier(out);
        Ok(())
    }

    /// Ends the job once the barrier has started and every member of the current
    /// view is ready or has no connection (lost members are not waited for).
    fn complete_barrier(&mut self, out: &mut Vec<Action>) {
        let Some(view) = &self.view else { return };
        let done =
            |m: &Member| self.ready.contains_key(&m.uid) || !self.member_conn.contains_key(&m.uid);
        if self.ready.is_empty() || !view.members.iter().all(done) {
            return;
        }
        let epoch = view.epoch;
        let job_code = self
            .ready
            .get(&view.members[0].uid)
            .copied()
            .unwrap_or(EXIT_NODE0_LOST);
        info!(epoch, code = job_code, "shutdown barrier complete");
        for m in &view.members {
            if let Some(&c) = self.member_conn.get(&m.uid) {
                Self::send(
                    out,
                    c,
                    ServerMsg::ShutdownDone {
                        epoch,
                        code: job_code,
                    },
                );
            }
        }
        for &c in self.conns.keys() {
            out.push(Action::Close(c));
        }
        self.conns.clear();
        self.phase = Lifecycle::Finished;
        out.push(Action::Finished { code: job_code });
    }

    fn restore(
        &mut self,
        conn: ConnId,
        view: View,
        fingerprint: u64,
        out: &mut Vec<Action>,
    ) -> Result<(), Refusal> {
        if self.phase != Lifecycle::Recovering {
            let message = match &self.view {
                Some(v) => format!(
                    "coordinator already holds view epoch {}; Restore is refused",
                    v.epoch
                ),
                None => {
                    "Restore is only accepted by a coordinator started in recovery mode".to_owned()
                }
            };
            return Err((ErrorCode::InvalidCommit, message));
        }
        if !matches!(self.conns.get(&conn).map(|c| &c.peer), Some(Peer::Idle)) {
            return Err((
                ErrorCode::InvalidCommit,
                "a registered connection cannot send Restore".to_owned(),
            ));
        }
        view.check().map_err(|e| {
            (
                ErrorCode::InvalidCommit,
                format!("restored view is invalid: {e}"),
            )
        })?;
        let node0 = view.members[0].uid;
        let max_uid = view.members.iter().map(|m| m.uid).max().unwrap_or(0);
        self.next_uid = self.next_uid.max(max_uid.saturating_add(1));
        self.fingerprint = Some(fingerprint);
        info!(
            epoch = view.epoch,
            nodes = view.members.len(),
            "state restored from node 0's view"
        );
        if let Some(c) = self.conns.get_mut(&conn) {
            c.peer = Peer::Member { uid: node0 };
        }
        self.member_conn.insert(node0, conn);
        Self::send(
            out,
            conn,
            ServerMsg::Start {
                node: 0,
                view: view.clone(),
            },
        );
        self.view = Some(view);
        self.phase = Lifecycle::Running;
        self.launch_deadline = None;
        // Newcomers that re-registered before Restore are checked now.
        let mismatched: Vec<ConnId> = self
            .pending
            .iter()
            .filter(|p| p.reg.fingerprint != fingerprint)
            .map(|p| p.conn)
            .collect();
        for c in mismatched {
            let fp = self
                .pending
                .iter()
                .find(|p| p.conn == c)
                .map_or(0, |p| p.reg.fingerprint);
            if let Err((code, message)) = self.check_fingerprint(fp) {
                self.refuse_and_close(c, code, message, out);
            }
        }
        self.announce_pending(out);
        Ok(())
    }

    fn reattach(
        &mut self,
        conn: ConnId,
        epoch: Epoch,
        uid: u64,
        out: &mut Vec<Action>,
    ) -> Result<(), Refusal> {
        if !matches!(self.conns.get(&conn).map(|c| &c.peer), Some(Peer::Idle)) {
            return Err((
                ErrorCode::InvalidCommit,
                "a registered connection cannot reattach".to_owned(),
            ));
        }
        if self.silent.contains(&uid) {
            return Err((
                ErrorCode::NotMember,
                format!(
                    "uid {uid} was declared lost after {:?} without a message; it may not reattach",
                    self.cfg.heartbeat_timeout.unwrap_or_default()
                ),
            ));
        }
        let Some(view) = &self.view else {
            return Err((
                ErrorCode::NotReady,
                "no view yet: node 0 has not restored the coordinator".to_owned(),
            ));
        };
        let current = view.epoch;
        let member = view.by_uid(uid).map(|m| m.node);
        if member.is_none() && epoch < current {
            // A member removed by a commit made while its connection was
            // down (the coordinator restarted): it waits for its Die, so it
            // gets it now, as it would have then.
            info!(
                uid,
                epoch, current, "a member removed while away reattached; telling it to leave"
            );
            if let Some(c) = self.conns.get_mut(&conn) {
                c.peer = Peer::Departed;
            }
            Self::send(out, conn, ServerMsg::Die { epoch: current });
            return Err((
                ErrorCode::NotMember,
                format!(
                    "uid {uid} was removed after epoch {epoch}; the current epoch is {current}: Die sent"
                ),
            ));
        }
        if epoch != current {
            let message =
                format!("reattach refers to epoch {epoch} but the current epoch is {current}");
            return Err((ErrorCode::StaleEpoch, message));
        }
        let Some(node) = member else {
            return Err((
                ErrorCode::NotMember,
                format!("uid {uid} is not a member of view epoch {epoch}"),
            ));
        };
        let view = view.clone();
        if let Some(old) = self.member_conn.insert(uid, conn) {
            // A newer connection for the same member wins; the old one is closed quietly.
            if let Some(state) = self.conns.get_mut(&old) {
                state.peer = Peer::Idle;
            }
            let message = format!("replaced by a newer connection for uid {uid}");
            self.refuse_and_close(old, ErrorCode::NotMember, message, out);
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            c.peer = Peer::Member { uid };
        }
        info!(epoch, node, uid, "member reattached");
        Self::send(out, conn, ServerMsg::Start { node, view });
        Ok(())
    }
}

#[cfg(test)]
mod tests;
