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
/// Why a rejoin stopped when its `who` said the node no longer needs one.
pub(crate) const NOT_NEEDED: &str = "the node no longer needs the coordinator";

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
    /// Refused for good (not a member any more, another build): give up.
    Fatal(String),
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
    ) -> Result<Rejoined, String> {
        let mut backoff = FIRST_BACKOFF;
        let mut last = "no attempt was made".to_owned();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "the coordinator at {} did not take this node back in time (last: {last})",
                    self.addr
                ));
            }
            if who().is_none() {
                return Err(NOT_NEEDED.to_owned());
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
            return Err(Attempt::Fatal(NOT_NEEDED.to_owned()));
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
                return Err(Attempt::Fatal(e.to_string()));
            }
            Err(e) => return Err(Attempt::Retry(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ductile_coordinator::core::Config;
    use ductile_coordinator::proto::Member;
    use ductile_coordinator::server::Background;
    use std::net::SocketAddr;
    use std::thread;

    const T: Duration = Duration::from_secs(20);
    const FP: u64 = 0xfeed;

    fn registration(role: Role, pid: u32) -> Registration {
        Registration {
            role,
            address: vec![pid as u8; 4],
            pes: 2,
            host: "h".into(),
            pid,
            fingerprint: FP,
        }
    }

    fn member(node: NodeId, uid: u64) -> Member {
        Member {
            node,
            uid,
            address: vec![1],
            pes: 1,
            host: "h".into(),
            pid: 1,
        }
    }

    #[test]
    fn the_role_decides_how_a_node_rejoins() {
        let view = View {
            epoch: 3,
            members: vec![member(0, 5), member(1, 9)],
        };
        let reg = registration(Role::Launch { index: 1 }, 7);
        /// Name, installed view, admitting view, uid, how it rejoins.
        type Case<'a> = (&'a str, Option<View>, Option<&'a View>, u64, Option<Rejoin>);
        let cases: &[Case<'_>] = &[
            (
                "node 0 restores its installed view",
                Some(view.clone()),
                None,
                5,
                Some(Rejoin::Restore {
                    view: view.clone(),
                    fingerprint: FP,
                }),
            ),
            (
                "another member reattaches in its epoch",
                Some(view.clone()),
                None,
                9,
                Some(Rejoin::Reattach { epoch: 3, uid: 9 }),
            ),
            (
                "admitted but not installed yet: a member of the admitting view",
                None,
                Some(&view),
                9,
                Some(Rejoin::Reattach { epoch: 3, uid: 9 }),
            ),
            (
                "the installed view wins over the admitting one",
                Some(View {
                    epoch: 4,
                    ..view.clone()
                }),
                Some(&view),
                9,
                Some(Rejoin::Reattach { epoch: 4, uid: 9 }),
            ),
            (
                "removed by a rescale: nothing to rejoin",
                Some(view.clone()),
                None,
                11,
                None,
            ),
            (
                "a waiting newcomer registers again, as a newcomer",
                None,
                None,
                11,
                Some(Rejoin::Register(registration(Role::Newcomer, 7))),
            ),
        ];
        for (name, installed, admitted, uid, want) in cases {
            let got = rejoin_as(installed.clone(), *admitted, *uid, FP, &reg);
            assert_eq!(&got, want, "{name}");
        }
    }

    fn localhost() -> SocketAddr {
        "127.0.0.1:0".parse().expect("address")
    }

    fn closed(client: &Client) -> bool {
        let end = Instant::now() + T;
        while Instant::now() < end {
            if client.is_closed() {
                return true;
            }
            thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// Two launch members and a waiting newcomer lose their coordinator; a
    /// new one starts in recovery mode on the same address; node 0 restores
    /// it, node 1 reattaches, the newcomer registers again, and the job
    /// goes on: node 0 admits the newcomer through its new client.
    #[test]
    fn members_and_newcomers_rejoin_a_restarted_coordinator() {
        let secret = Secret::generate();
        let first =
            Background::start(Config::launch(secret.clone(), 2), localhost()).expect("coordinator");
        let addr = first.addr().to_string();
        let launch: Vec<_> = (0..2u32)
            .map(|index| {
                let (addr, secret) = (addr.clone(), secret.clone());
                thread::spawn(move || {
                    let client = Client::connect(&addr, &secret, T).expect("connect");
                    let reg = registration(Role::Launch { index }, 100 + index);
                    match client.register(reg, T).expect("register") {
                        Admission::Member { view, .. } => (client, view),
                        other => panic!("launch member got {other:?}"),
                    }
                })
            })
            .collect();
        let mut launch: Vec<(Client, View)> = launch
            .into_iter()
            .map(|h| h.join().expect("launch"))
            .collect();
        let (c1, view) = launch.pop().expect("node 1");
        let (c0, _) = launch.pop().expect("node 0");
        let cn = Client::connect(&addr, &secret, T).expect("connect");
        let newcomer_reg = registration(Role::Newcomer, 200);
        let old_uid = match cn.register(newcomer_reg.clone(), T).expect("register") {
            Admission::Waiting { uid, .. } => uid,
            other => panic!("newcomer got {other:?}"),
        };
        let links: Vec<Arc<CoordinatorLink>> = [c0, c1, cn]
            .into_iter()
            .map(|c| Arc::new(CoordinatorLink::new(&addr, secret.clone(), c)))
            .collect();

        first.abort();
        for link in &links {
            assert!(closed(&link.current()), "the connection did not end");
        }
        // The rescale driver waits for node 0's new connection.
        let waiting = {
            let link = links[0].clone();
            thread::spawn(move || link.settled(T))
        };
        // Everyone starts rejoining before the new coordinator listens.
        let deadline = Instant::now() + T;
        let rejoins: Vec<_> = links
            .iter()
            .enumerate()
            .map(|(i, link)| {
                let (link, view, reg) = (link.clone(), view.clone(), newcomer_reg.clone());
                let uid = if i < 2 { view.members[i].uid } else { old_uid };
                thread::spawn(move || {
                    let admitted = (i < 2).then_some(&view);
                    link.rejoin(deadline, || rejoin_as(None, admitted, uid, FP, &reg))
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(200));
        let second = Background::start(
            Config::recovery(secret.clone()),
            addr.parse().expect("addr"),
        )
        .expect("restart on the same address");
        let rejoined: Vec<Rejoined> = rejoins
            .into_iter()
            .map(|h| h.join().expect("thread").expect("rejoined"))
            .collect();
        assert_eq!(
            rejoined[0],
            Rejoined::Member {
                node: 0,
                view: view.clone()
            }
        );
        assert_eq!(
            rejoined[1],
            Rejoined::Member {
                node: 1,
                view: view.clone()
            }
        );
        let settled = waiting.join().expect("thread");
        assert!(!settled.is_closed());
        assert!(Arc::ptr_eq(&settled, &links[0].current()));
        let Rejoined::Waiting { uid: new_uid, .. } = rejoined[2] else {
            panic!("the newcomer got {:?}", rejoined[2]);
        };
        assert!(new_uid > 2, "uid {new_uid} collides with a restored member");

        // The job goes on through the new clients.
        let next = links[0]
            .current()
            .commit(view.epoch, vec![], 1, T)
            .expect("commit on the restored coordinator");
        assert_eq!(next.members.len(), 3);
        assert_eq!(next.members[2].uid, new_uid);
        match links[2].current().events().recv_timeout(T) {
            Ok(ServerMsg::Integrate { node: 2, view }) => assert_eq!(view, next),
            other => panic!("the newcomer expected Integrate, got {other:?}"),
        }
        match links[1].current().events().recv_timeout(T) {
            Ok(ServerMsg::ViewUpdate { view }) => assert_eq!(view, next),
            other => panic!("node 1 expected ViewUpdate, got {other:?}"),
        }
        let barrier: Vec<_> = links
            .iter()
            .map(|link| {
                let client = link.current();
                thread::spawn(move || client.shutdown_barrier(2, 0, T).expect("barrier"))
            })
            .collect();
        for h in barrier {
            assert_eq!(h.join().expect("thread"), 0);
        }
        assert_eq!(second.wait(T).expect("finished").expect("code"), 0);
    }

    /// Node 0 restores a restarted coordinator and removes node 2 before
    /// node 2 rejoined (a shrink right after the restart): node 2 gets the
    /// Die it missed when it reattaches.
    #[test]
    fn a_member_removed_while_away_is_told_to_leave() {
        let secret = Secret::generate();
        let first =
            Background::start(Config::launch(secret.clone(), 3), localhost()).expect("coordinator");
        let addr = first.addr().to_string();
        let launch: Vec<_> = (0..3u32)
            .map(|index| {
                let (addr, secret) = (addr.clone(), secret.clone());
                thread::spawn(move || {
                    let client = Client::connect(&addr, &secret, T).expect("connect");
                    let reg = registration(Role::Launch { index }, 100 + index);
                    match client.register(reg, T).expect("register") {
                        Admission::Member { view, .. } => (client, view),
                        other => panic!("launch member got {other:?}"),
                    }
                })
            })
            .collect();
        let launch: Vec<(Client, View)> = launch
            .into_iter()
            .map(|h| h.join().expect("launch"))
            .collect();
        let view = launch[0].1.clone();
        let links: Vec<CoordinatorLink> = launch
            .into_iter()
            .map(|(c, _)| CoordinatorLink::new(&addr, secret.clone(), c))
            .collect();
        first.abort();
        assert!(closed(&links[0].current()));
        let _second = Background::start(
            Config::recovery(secret.clone()),
            addr.parse().expect("addr"),
        )
        .expect("restart on the same address");
        let reg = registration(Role::Newcomer, 1);
        let who = |uid: u64| rejoin_as(Some(view.clone()), None, uid, FP, &reg);
        let deadline = Instant::now() + T;
        let node0 = links[0]
            .rejoin(deadline, || who(view.members[0].uid))
            .expect("node 0");
        assert_eq!(
            node0,
            Rejoined::Member {
                node: 0,
                view: view.clone()
            }
        );
        let next = links[0]
            .current()
            .commit(view.epoch, vec![2], 0, T)
            .expect("remove node 2");
        assert_eq!(next.members.len(), 2);
        let removed = links[2]
            .rejoin(deadline, || who(view.members[2].uid))
            .expect("node 2 rejoins");
        assert_eq!(removed, Rejoined::Removed { epoch: next.epoch });
        // Node 1, a survivor still in the old epoch, is told to ask again
        // until it runs in the new one.
        let mut epoch = view.epoch;
        let mut asked = 0;
        let node1 = links[1]
            .rejoin(deadline, || {
                asked += 1;
                if asked > 2 {
                    epoch = next.epoch;
                }
                Some(Rejoin::Reattach {
                    epoch,
                    uid: view.members[1].uid,
                })
            })
            .expect("node 1");
        assert_eq!(
            node1,
            Rejoined::Member {
                node: 1,
                view: next.clone()
            }
        );
        assert!(asked > 2, "the stale epoch was accepted");
    }

    #[test]
    fn rejoining_gives_up_at_the_deadline_naming_the_address() {
        let secret = Secret::generate();
        let gone =
            Background::start(Config::launch(secret.clone(), 1), localhost()).expect("coordinator");
        let addr = gone.addr().to_string();
        let client = Client::connect(&addr, &secret, T).expect("connect");
        let link = CoordinatorLink::new(&addr, secret, client);
        gone.abort();
        let err = link
            .rejoin(Instant::now() + Duration::from_millis(300), || {
                Some(Rejoin::Reattach { epoch: 1, uid: 1 })
            })
            .expect_err("nobody listens");
        assert!(err.contains(&addr), "{err}");
        assert!(err.contains("did not take this node back"), "{err}");
    }

    #[test]
    fn a_refusal_ends_the_rejoin_at_once() {
        let secret = Secret::generate();
        let coordinator =
            Background::start(Config::launch(secret.clone(), 1), localhost()).expect("coordinator");
        let addr = coordinator.addr().to_string();
        let client = Client::connect(&addr, &secret, T).expect("connect");
        let reg = registration(Role::Launch { index: 0 }, 1);
        let Admission::Member { view, .. } = client.register(reg, T).expect("register") else {
            panic!("not a member");
        };
        let link = CoordinatorLink::new(&addr, secret, client);
        // The coordinator still holds the job: node 0 simply reattaches...
        let again = link
            .rejoin(Instant::now() + T, || {
                Some(Rejoin::Restore {
                    view: view.clone(),
                    fingerprint: FP,
                })
            })
            .expect("node 0 reattaches");
        assert_eq!(
            again,
            Rejoined::Member {
                node: 0,
                view: view.clone()
            }
        );
        // ...but a uid it does not know is refused for good, long before the deadline.
        let started = Instant::now();
        let err = link
            .rejoin(started + T, || Some(Rejoin::Reattach { epoch: 1, uid: 77 }))
            .expect_err("unknown uid");
        assert!(err.contains("NotMember"), "{err}");
        assert!(started.elapsed() < T);
        // A node that no longer needs the coordinator stops rejoining.
        let err = link
            .rejoin(Instant::now() + T, || None)
            .expect_err("not needed");
        assert!(err.contains("no longer needs"), "{err}");
    }

    #[test]
    fn a_tool_connection_dials_again_once_its_connection_ended() {
        let secret = Secret::generate();
        let first =
            Background::start(Config::launch(secret.clone(), 1), localhost()).expect("coordinator");
        let addr = first.addr().to_string();
        let link = CoordinatorLink::connect(&addr, secret.clone(), T).expect("connect");
        let before = link.live(T).expect("live");
        assert!(
            Arc::ptr_eq(&before, &link.current()),
            "a live client is kept"
        );
        first.abort();
        assert!(closed(&before));
        assert!(
            link.live(Duration::from_millis(200)).is_err(),
            "nobody listens"
        );
        let _second = Background::start(Config::recovery(secret), addr.parse().expect("addr"))
            .expect("restart");
        let after = link.live(T).expect("dialled again");
        assert!(!Arc::ptr_eq(&before, &after));
        let (view, pending) = after.query_view(T).expect("query");
        assert!(
            view.is_none() && pending.is_empty(),
            "a recovering coordinator has no view yet"
        );
    }
}
