//! Rejoining in every role, against real coordinators on loopback.

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
    assert!(
        matches!(&err, RejoinError::TimedOut { addr: a, .. } if *a == addr),
        "{err}"
    );
    let err = err.to_string();
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
    assert!(
        matches!(
            &err,
            RejoinError::Refused(ClientError::Server {
                code: ErrorCode::NotMember,
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("NotMember"), "{err}");
    assert!(started.elapsed() < T);
    // A node that no longer needs the coordinator stops rejoining.
    let err = link
        .rejoin(Instant::now() + T, || None)
        .expect_err("not needed");
    assert!(matches!(err, RejoinError::NotNeeded), "{err}");
    assert!(err.to_string().contains("no longer needs"), "{err}");
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
    let _second =
        Background::start(Config::recovery(secret), addr.parse().expect("addr")).expect("restart");
    let after = link.live(T).expect("dialled again");
    assert!(!Arc::ptr_eq(&before, &after));
    let (view, pending) = after.query_view(T).expect("query");
    assert!(
        view.is_none() && pending.is_empty(),
        "a recovering coordinator has no view yet"
    );
}
