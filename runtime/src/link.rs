//! A node's connection to its job's coordinator, kept across a coordinator
//! restart.
//!
//! The threads of a node that talk to the coordinator (the watcher that
//! forwards its notices, the rescale driver, the shutdown barrier) share one
//! [`CoordinatorLink`] and take its [`CoordinatorLink::current`] client for
//! each exchange. When the connection drops while the job runs, the watcher
//! calls [`CoordinatorLink::rejoin`]: it dials the same address again (with
//! backoff, within the bound of `DUCTILE_COORDINATOR_RECONNECT`) and rejoins
//! as the node's role says ([`rejoin_as`]):
//!
//! * node 0 reattaches if the coordinator still holds the job, else restores a
//!   restarted one (`--recover`) with its view and the registry fingerprint;
//! * another member reattaches with its epoch and uid, asking again while node
//!   0 has not restored the coordinator yet;
//! * a newcomer still waiting for admission registers again (and gets a new uid).
//!
//! A member removed by a commit while it was away (a rescale right after the
//! restart, before it reattached) is answered with the `Die` it missed.
//!
//! The new client then replaces the old one for every thread. The control
//! endpoint's own connection (a tool connection, never registered) uses
//! [`CoordinatorLink::live`], which only dials again.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ductile_coordinator::client::{Admission, Client, ClientError};
use ductile_coordinator::proto::{Epoch, ErrorCode, NodeId, Registration, Role, ServerMsg, View};
use ductile_coordinator::secret::Secret;
use tracing::debug;

/// How long one dial or one request of a rejoin may take.
const ATTEMPT: Duration = Duration::from_secs(5);
/// First pause between dials; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Pause before asking again while node 0 has not restored the coordinator.
const NOT_READY_PAUSE: Duration = Duration::from_millis(50);
/// How often [`CoordinatorLink::settled`] looks for a new connection.
const SETTLE_POLL: Duration = Duration::from_millis(10);
/// Why a node could not rejoin its coordinator.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RejoinError {
    /// `DUCTILE_COORDINATOR_RECONNECT=0`: the node does not try.
    #[error(
        "{}=0: not trying to rejoin it",
        ductile_coordinator::contract::ENV_COORDINATOR_RECONNECT
    )]
    Disabled,
    /// The bound passed; `last` says what the last attempt came to.
    #[error("the coordinator at {addr} did not take this node back in time (last: {last})")]
    TimedOut {
        /// The coordinator's address.
        addr: String,
        /// The last attempt's failure.
        last: String,
    },
    /// The node's `who` said it no longer needs the coordinator.
    #[error("the node no longer needs the coordinator")]
    NotNeeded,
    /// Refused for good (not a member any more, another build).
    #[error(transparent)]
    Refused(ClientError),
}

/// How a node rejoins its coordinator.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Rejoin {
    /// Node 0 of `view`: reattaches, or restores a restarted coordinator.
    Restore {
        /// Node 0's current view.
        view: View,
        /// The job's build fingerprint.
        fingerprint: u64,
    },
    /// Another member of the view of `epoch`.
    Reattach {
        /// The epoch the node runs in.
        epoch: Epoch,
        /// Its uid.
        uid: u64,
    },
    /// A newcomer not admitted yet: registers again.
    Register(Registration),
}

/// What the coordinator answered to a rejoin.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Rejoined {
    /// A member again: node `node` of `view`.
    Member {
        /// Its node id.
        node: NodeId,
        /// The coordinator's view.
        view: View,
    },
    /// A newcomer queued again, under a new uid.
    Waiting {
        /// The new uid.
        uid: u64,
        /// The current view (for speculative endpoints).
        view: View,
    },
    /// Removed by a commit made while this node was away: the coordinator
    /// answered with the `Die` it missed.
    Removed {
        /// The epoch of the `Die`.
        epoch: Epoch,
    },
}

/// How a node with uid `uid` rejoins: from its installed view (`installed`),
/// else the view it was admitted to but has not installed yet (`admitted`,
/// the launch view or an `Integrate`'s), else as the newcomer `registration`
/// describes. `None` when the node is not in its own view (removed by a
/// rescale): it has nothing to rejoin.
pub(crate) fn rejoin_as(
    installed: Option<View>,
    admitted: Option<&View>,
    uid: u64,
    fingerprint: u64,
    registration: &Registration,
) -> Option<Rejoin> {
    let Some(view) = installed.or_else(|| admitted.cloned()) else {
        return Some(Rejoin::Register(Registration {
            role: Role::Newcomer,
            ..registration.clone()
        }));
    };
    match view.by_uid(uid).map(|m| m.node) {
        None => None,
        Some(0) => Some(Rejoin::Restore { view, fingerprint }),
        Some(_) => Some(Rejoin::Reattach {
            epoch: view.epoch,
            uid,
        }),
    }
}

/// Why one connection did not rejoin.
enum Attempt {
    /// Worth another connection (the coordinator went away again, or is mute).
    Retry(String),
    /// Refused for good, or no longer needed: give up.
    Fatal(RejoinError),
}

/// The node's coordinator connection, replaced when it is rejoined.
pub(crate) struct CoordinatorLink {
    addr: String,
    secret: Secret,
    client: RwLock<Arc<Client>>,
}

impl CoordinatorLink {
    /// A link over `client`, connected to `addr` with `secret`.
    pub(crate) fn new(addr: &str, secret: Secret, client: Client) -> Self {
        CoordinatorLink {
            addr: addr.to_owned(),
            secret,
            client: RwLock::new(Arc::new(client)),
        }
    }

    /// Dials `addr` for a tool connection (status queries), not registered.
    pub(crate) fn connect(
        addr: &str,
        secret: Secret,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let client = Client::connect(addr, &secret, timeout)?;
        Ok(Self::new(addr, secret, client))
    }

    /// The coordinator's address.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// The client to use now (after a rejoin, the new one).
    pub(crate) fn current(&self) -> Arc<Client> {
        self.client
            .read()
            .expect("coordinator link poisoned")
            .clone()
    }

    /// The current client once it is connected: while the connection is
    /// down (the watcher is rejoining), waits up to `timeout` for the new
    /// one. After the timeout, the closed one (using it fails clearly).
    pub(crate) fn settled(&self, timeout: Duration) -> Arc<Client> {
        let deadline = Instant::now() + timeout;
        loop {
            let client = self.current();
            if !client.is_closed() || Instant::now() >= deadline {
                return client;
            }
            std::thread::sleep(SETTLE_POLL);
        }
    }

    fn install(&self, client: Client) -> Arc<Client> {
        let client = Arc::new(client);
        *self.client.write().expect("coordinator link poisoned") = client.clone();
        client
    }

    /// For a tool connection: the current client, dialled again first if its
    /// connection has ended (the coordinator restarted).
    pub(crate) fn live(&self, timeout: Duration) -> Result<Arc<Client>, ClientError> {
        let client = self.current();
        if !client.is_closed() {
            return Ok(client);
        }
        debug!(addr = %self.addr, "the tool connection to the coordinator ended; dialling again");
        Ok(self.install(Client::connect(&self.addr, &self.secret, timeout)?))
    }

    /// Dials the coordinator again and rejoins as `who` says, until
    /// `deadline`. `who` is asked before every request, since the node's
    /// epoch may move meanwhile; `None` means the node no longer needs the
    /// coordinator (it is finishing or was removed): the rejoin stops. On
    /// success the new client is [`CoordinatorLink::current`].
    pub(crate) fn rejoin(
        &self,
        deadline: Instant,
        mut who: impl FnMut() -> Option<Rejoin>,
    ) -> Result<Rejoined, RejoinError> {
        let mut backoff = FIRST_BACKOFF;
        let mut last = "no attempt was made".to_owned();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RejoinError::TimedOut {
                    addr: self.addr.clone(),
                    last,
                });
            }
            if who().is_none() {
                return Err(RejoinError::NotNeeded);
            }
            match Client::connect(&self.addr, &self.secret, left.min(ATTEMPT)) {
                Err(e) => last = e.to_string(),
                Ok(client) => match rejoin_on(&client, deadline, &mut who) {
                    Ok(rejoined) => {
                        self.install(client);
                        return Ok(rejoined);
                    }
                    Err(Attempt::Fatal(e)) => return Err(e),
                    Err(Attempt::Retry(e)) => last = e,
                },
            }
            debug!(addr = %self.addr, %last, "rejoining the coordinator: trying again");
            let left = deadline.saturating_duration_since(Instant::now());
            std::thread::sleep(backoff.min(left));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// One connection's try at rejoining.
fn rejoin_on(
    client: &Client,
    deadline: Instant,
    who: &mut impl FnMut() -> Option<Rejoin>,
) -> Result<Rejoined, Attempt> {
    let mut last = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Attempt::Retry(last));
        }
        let Some(me) = who() else {
            return Err(Attempt::Fatal(RejoinError::NotNeeded));
        };
        let t = left.min(ATTEMPT);
        let answer = match me {
            Rejoin::Restore { view, fingerprint } => {
                // A coordinator that still holds the job (the connection
                // dropped, the process did not restart) takes node 0 back
                // like any member; a restarted one has no view yet.
                let uid = view.members[0].uid;
                match client.reattach(view.epoch, uid, t) {
                    Err(ClientError::Server {
                        code: ErrorCode::NotReady,
                        ..
                    }) => client
                        .restore(view, fingerprint, t)
                        .map(|view| Rejoined::Member { node: 0, view }),
                    other => other.map(|(node, view)| Rejoined::Member { node, view }),
                }
            }
            Rejoin::Reattach { epoch, uid } => client
                .reattach(epoch, uid, t)
                .map(|(node, view)| Rejoined::Member { node, view }),
            // A restarted coordinator answers newcomers once node 0 restored
            // it, and a registration cannot be sent twice on one connection:
            // wait for the answer as long as the bound allows.
            Rejoin::Register(registration) => {
                client.register(registration, left).map(|a| match a {
                    Admission::Waiting { uid, view } => Rejoined::Waiting { uid, view },
                    Admission::Member { node, view } => Rejoined::Member { node, view },
                })
            }
        };
        match answer {
            Ok(rejoined) => return Ok(rejoined),
            // Node 0 has not restored the restarted coordinator yet, or this
            // node's epoch is about to move (a rescale in flight): ask again.
            Err(ClientError::Server {
                code: ErrorCode::NotReady | ErrorCode::StaleEpoch,
                message,
            }) => {
                last = message;
                std::thread::sleep(NOT_READY_PAUSE.min(left));
            }
            Err(e @ ClientError::Server { .. }) => {
                // Removed while away: the Die it missed came before the refusal.
                let not_member = matches!(
                    e,
                    ClientError::Server {
                        code: ErrorCode::NotMember,
                        ..
                    }
                );
                if not_member {
                    if let Ok(ServerMsg::Die { epoch }) = client.events().try_recv() {
                        return Ok(Rejoined::Removed { epoch });
                    }
                }
                return Err(Attempt::Fatal(RejoinError::Refused(e)));
            }
            Err(e) => return Err(Attempt::Retry(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests;
