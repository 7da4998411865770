//! Named scenarios driving the sans-IO coordinator in virtual time: frames go in
//! as bytes, actions come out; no sockets, no sleeping.

use super::*;
use crate::proto::{encode, MAGIC, MAX_FRAME};
use rand::SeedableRng;

const FP: u64 = 0x00c0_ffee_d00d_f00d;

struct Harness {
    core: Coordinator,
    secret: Secret,
    now: Instant,
    next: u64,
}

fn reg(role: Role, fingerprint: u64, tag: u8) -> Registration {
    Registration {
        role,
        address: vec![tag, tag, tag],
        pes: 2,
        host: format!("host{tag}"),
        pid: 1000 + u32::from(tag),
        fingerprint,
    }
}

fn to(actions: &[Action], conn: ConnId) -> Vec<ServerMsg> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send(c, m) if *c == conn => Some(m.clone()),
            _ => None,
        })
        .collect()
}

fn closed(actions: &[Action], conn: ConnId) -> bool {
    actions.contains(&Action::Close(conn))
}

fn error_code(actions: &[Action], conn: ConnId) -> Option<(ErrorCode, String)> {
    to(actions, conn).into_iter().find_map(|m| match m {
        ServerMsg::Error { code, message } => Some((code, message)),
        _ => None,
    })
}

fn finished(actions: &[Action]) -> Option<i32> {
    actions.iter().find_map(|a| match a {
        Action::Finished { code } => Some(*code),
        _ => None,
    })
}

impl Harness {
    fn new(expected: Option<u32>) -> Self {
        let secret = Secret::from_bytes([42; 32]);
        let mut cfg = Config::recovery(secret.clone());
        cfg.expected = expected;
        // Silences are their own scenarios (`heartbeat_*` below).
        cfg.heartbeat_timeout = None;
        let mut h = Harness {
            core: Coordinator::new(cfg, StdRng::seed_from_u64(7)),
            secret,
            now: Instant::now(),
            next: 0,
        };
        let first = h.core.on_tick(h.now);
        assert!(first.is_empty());
        h
    }

    fn advance(&mut self, by: Duration) -> Vec<Action> {
        self.now += by;
        self.core.on_tick(self.now)
    }

    /// Connects without authenticating; returns the nonce.
    fn connect(&mut self) -> (ConnId, [u8; 32]) {
        let conn = ConnId(self.next);
        self.next += 1;
        let out = self.core.on_connect(conn, self.now);
        match to(&out, conn).as_slice() {
            [ServerMsg::Challenge {
                protocol: PROTOCOL_VERSION,
                nonce,
            }] => (conn, *nonce),
            other => panic!("expected a challenge, got {other:?}"),
        }
    }

    fn send(&mut self, conn: ConnId, msg: &ClientMsg) -> Vec<Action> {
        self.core.on_frame(conn, &encode(msg), self.now)
    }

    fn auth(&mut self) -> ConnId {
        let (conn, nonce) = self.connect();
        let proof = self.secret.proof(AUTH_CONTEXT, &nonce);
        let out = self.send(
            conn,
            &ClientMsg::Hello {
                protocol: PROTOCOL_VERSION,
                proof,
            },
        );
        assert_eq!(to(&out, conn), vec![ServerMsg::Welcome]);
        conn
    }

    /// Launches `n` members registering in index order; returns their conns (conn i = node i).
    fn launched(n: u32) -> (Self, Vec<ConnId>) {
        let mut h = Harness::new(Some(n));
        let conns: Vec<ConnId> = (0..n).map(|_| h.auth()).collect();
        let mut last = Vec::new();
        for (i, &c) in conns.iter().enumerate() {
            last = h.send(
                c,
                &ClientMsg::Register(reg(Role::Launch { index: i as u32 }, FP, i as u8)),
            );
        }
        for &c in &conns {
            assert!(matches!(to(&last, c).as_slice(), [ServerMsg::Start { .. }]));
        }
        (h, conns)
    }

    fn newcomer(&mut self, tag: u8) -> (ConnId, Vec<Action>) {
        let c = self.auth();
        let out = self.send(c, &ClientMsg::Register(reg(Role::Newcomer, FP, tag)));
        (c, out)
    }

    fn epoch(&self) -> Epoch {
        self.core.view().map_or(0, |v| v.epoch)
    }
}

#[test]
fn launch_of_three_with_shuffled_registration_order() {
    let mut h = Harness::new(Some(3));
    let conns: Vec<ConnId> = (0..3).map(|_| h.auth()).collect();
    // Connection k registers launch index order[k].
    let order = [2u32, 0, 1];
    let mut out = Vec::new();
    for (k, &index) in order.iter().enumerate() {
        assert!(
            out.is_empty(),
            "nothing is sent before the launch is complete"
        );
        out = h.send(
            conns[k],
            &ClientMsg::Register(reg(Role::Launch { index }, FP, index as u8)),
        );
    }
    let view = h.core.view().cloned().expect("epoch 1 exists");
    assert_eq!(view.epoch, 1);
    assert!(view.check().is_ok());
    assert_eq!(view.total_pes(), 6);
    for (k, &index) in order.iter().enumerate() {
        assert_eq!(
            to(&out, conns[k]),
            vec![ServerMsg::Start {
                node: index,
                view: view.clone()
            }]
        );
        let m = view.member(index).expect("member");
        assert_eq!(
            m.address,
            vec![index as u8; 3],
            "members are ordered by launch index"
        );
    }
    let mut uids: Vec<u64> = view.members.iter().map(|m| m.uid).collect();
    uids.dedup();
    assert_eq!(uids.len(), 3);
    assert_eq!(
        h.core.next_deadline(),
        None,
        "no launch timeout once launched"
    );
}

#[test]
fn fingerprint_mismatch_is_refused_and_changes_nothing() {
    let mut h = Harness::new(Some(2));
    let a = h.auth();
    let b = h.auth();
    h.send(
        a,
        &ClientMsg::Register(reg(Role::Launch { index: 0 }, 0xaaaa, 0)),
    );
    let out = h.send(
        b,
        &ClientMsg::Register(reg(Role::Launch { index: 1 }, 0xbbbb, 1)),
    );
    let (code, message) = error_code(&out, b).expect("error");
    assert_eq!(code, ErrorCode::FingerprintMismatch);
    assert!(
        message.contains("000000000000aaaa") && message.contains("000000000000bbbb"),
        "{message}"
    );
    assert!(message.contains("same build"), "{message}");
    assert!(closed(&out, b));
    assert!(h.core.view().is_none());
    // The index is still free for a process of the right build.
    let c = h.auth();
    let out = h.send(
        c,
        &ClientMsg::Register(reg(Role::Launch { index: 1 }, 0xaaaa, 1)),
    );
    assert!(matches!(
        to(&out, c).as_slice(),
        [ServerMsg::Start { node: 1, .. }]
    ));
}

#[test]
fn duplicate_and_out_of_range_launch_indices_are_refused() {
    let mut h = Harness::new(Some(2));
    let a = h.auth();
    let b = h.auth();
    let c = h.auth();
    h.send(
        a,
        &ClientMsg::Register(reg(Role::Launch { index: 0 }, FP, 0)),
    );
    let out = h.send(
        b,
        &ClientMsg::Register(reg(Role::Launch { index: 0 }, FP, 1)),
    );
    assert_eq!(
        error_code(&out, b).map(|e| e.0),
        Some(ErrorCode::DuplicateIndex)
    );
    assert!(closed(&out, b));
    let out = h.send(
        c,
        &ClientMsg::Register(reg(Role::Launch { index: 2 }, FP, 2)),
    );
    assert_eq!(
        error_code(&out, c).map(|e| e.0),
        Some(ErrorCode::InvalidCommit)
    );
    assert!(closed(&out, c));
    assert!(h.core.view().is_none());
}

#[test]
fn launch_member_leaving_before_launch_frees_its_index() {
    let mut h = Harness::new(Some(2));
    let a = h.auth();
    h.send(
        a,
        &ClientMsg::Register(reg(Role::Launch { index: 1 }, FP, 1)),
    );
    assert!(h.core.on_disconnect(a, h.now).is_empty());
    let b = h.auth();
    let c = h.auth();
    h.send(
        b,
        &ClientMsg::Register(reg(Role::Launch { index: 1 }, FP, 1)),
    );
    let out = h.send(
        c,
        &ClientMsg::Register(reg(Role::Launch { index: 0 }, FP, 0)),
    );
    assert!(matches!(
        to(&out, b).as_slice(),
        [ServerMsg::Start { node: 1, .. }]
    ));
}

#[test]
fn unauthenticated_peers_are_refused() {
    let mut h = Harness::new(Some(1));
    // No Hello first.
    let (a, _) = h.connect();
    let out = h.send(
        a,
        &ClientMsg::Register(reg(Role::Launch { index: 0 }, FP, 0)),
    );
    assert_eq!(
        error_code(&out, a).map(|e| e.0),
        Some(ErrorCode::Unauthenticated)
    );
    assert!(closed(&out, a));
    // Wrong secret.
    let (b, nonce) = h.connect();
    let proof = Secret::from_bytes([1; 32]).proof(AUTH_CONTEXT, &nonce);
    let out = h.send(
        b,
        &ClientMsg::Hello {
            protocol: PROTOCOL_VERSION,
            proof,
        },
    );
    assert_eq!(
        error_code(&out, b).map(|e| e.0),
        Some(ErrorCode::Unauthenticated)
    );
    assert!(closed(&out, b));
    // A proof replayed from another connection's nonce.
    let (c, _) = h.connect();
    let stale = h.secret.proof(AUTH_CONTEXT, &nonce);
    let out = h.send(
        c,
        &ClientMsg::Hello {
            protocol: PROTOCOL_VERSION,
            proof: stale,
        },
    );
    assert_eq!(
        error_code(&out, c).map(|e| e.0),
        Some(ErrorCode::Unauthenticated)
    );
    // Wrong protocol version.
    let (d, nonce) = h.connect();
    let proof = h.secret.proof(AUTH_CONTEXT, &nonce);
    let out = h.send(
        d,
        &ClientMsg::Hello {
            protocol: 99,
            proof,
        },
    );
    assert_eq!(
        error_code(&out, d).map(|e| e.0),
        Some(ErrorCode::UnsupportedVersion)
    );
    assert!(closed(&out, d));
    // Silent connection: refused when the hello timeout fires.
    let (e, _) = h.connect();
    let out = h.advance(Duration::from_secs(11));
    assert_eq!(
        error_code(&out, e).map(|e| e.0),
        Some(ErrorCode::Unauthenticated)
    );
    assert!(closed(&out, e));
    assert!(h.core.view().is_none());
}

#[test]
fn malformed_and_oversized_frames_are_refused() {
    let mut h = Harness::new(Some(1));
    let mut cases: Vec<(Vec<u8>, ErrorCode)> = Vec::new();
    cases.push((b"GET / HTTP/1.1\r\n\r\n".to_vec(), ErrorCode::Malformed));
    let mut header = MAGIC.to_vec();
    header.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    header.extend_from_slice(&0u16.to_le_bytes());
    header.extend_from_slice(&(MAX_FRAME as u32 + 1).to_le_bytes());
    cases.push((header, ErrorCode::Oversized));
    let mut bad_version = encode(&ClientMsg::QueryView);
    bad_version[4] = 7;
    cases.push((bad_version, ErrorCode::UnsupportedVersion));
    let mut garbage_payload = MAGIC.to_vec();
    garbage_payload.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    garbage_payload.extend_from_slice(&0u16.to_le_bytes());
    garbage_payload.extend_from_slice(&3u32.to_le_bytes());
    garbage_payload.extend_from_slice(&[0xff, 0xff, 0xff]);
    cases.push((garbage_payload, ErrorCode::Malformed));
    for (bytes, expected) in cases {
        // Before and after authentication alike.
        let (raw, _) = h.connect();
        let out = h.core.on_frame(raw, &bytes, h.now);
        assert_eq!(error_code(&out, raw).map(|e| e.0), Some(expected));
        assert!(closed(&out, raw));
        let authed = h.auth();
        let out = h.core.on_frame(authed, &bytes, h.now);
        assert_eq!(error_code(&out, authed).map(|e| e.0), Some(expected));
        assert!(closed(&out, authed));
        // Bytes after the close are ignored.
        assert!(h.core.on_frame(authed, &bytes, h.now).is_empty());
    }
    // Nothing changed: the launch still works, fed one byte at a time.
    let c = h.auth();
    let frame = encode(&ClientMsg::Register(reg(Role::Launch { index: 0 }, FP, 0)));
    let mut out = Vec::new();
    for b in &frame {
        out.extend(h.core.on_frame(c, std::slice::from_ref(b), h.now));
    }
    assert!(matches!(
        to(&out, c).as_slice(),
        [ServerMsg::Start { node: 0, .. }]
    ));
}

#[test]
fn launch_timeout_fails_the_job() {
    let mut h = Harness::new(Some(3));
    let start = h.now;
    let a = h.auth();
    let b = h.auth();
    h.send(
        a,
        &ClientMsg::Register(reg(Role::Launch { index: 0 }, FP, 0)),
    );
    h.send(
        b,
        &ClientMsg::Register(reg(Role::Launch { index: 2 }, FP, 2)),
    );
    let deadline = h.core.next_deadline().expect("a launch deadline");
    assert!(deadline >= start + Duration::from_secs(60));
    assert!(h.advance(Duration::from_secs(30)).is_empty());
    let out = h.advance(Duration::from_secs(31));
    for c in [a, b] {
        let (code, message) = error_code(&out, c).expect("error");
        assert_eq!(code, ErrorCode::LaunchTimeout);
        assert!(
            message.contains("2 of 3") && message.contains("[1]"),
            "{message}"
        );
        assert!(closed(&out, c));
    }
    assert_eq!(finished(&out), Some(EXIT_LAUNCH_TIMEOUT));
    assert!(h.core.failure().is_some());
    assert_eq!(h.core.phase(), Lifecycle::Finished);
    assert_eq!(h.core.next_deadline(), None);
}

#[test]
fn newcomer_queued_during_launch_then_integrated() {
    let mut h = Harness::new(Some(2));
    let a = h.auth();
    let b = h.auth();
    h.send(
        a,
        &ClientMsg::Register(reg(Role::Launch { index: 0 }, FP, 0)),
    );
    let (n, out) = h.newcomer(9);
    assert!(out.is_empty(), "no Waiting before epoch 1 exists");
    let out = h.send(
        b,
        &ClientMsg::Register(reg(Role::Launch { index: 1 }, FP, 1)),
    );
    let view1 = h.core.view().cloned().expect("launched");
    let uid = match to(&out, n).as_slice() {
        [ServerMsg::Waiting { uid, view }] => {
            assert_eq!(view, &view1);
            *uid
        }
        other => panic!("expected Waiting, got {other:?}"),
    };
    assert!(view1.by_uid(uid).is_none());
    let out = h.send(a, &ClientMsg::QueryPending { epoch: 1 });
    match to(&out, a).as_slice() {
        [ServerMsg::Pending {
            epoch: 1,
            newcomers,
        }] => {
            assert_eq!(newcomers.len(), 1);
            assert_eq!(
                (newcomers[0].uid, newcomers[0].pes, newcomers[0].pid),
                (uid, 2, 1009)
            );
        }
        other => panic!("expected Pending, got {other:?}"),
    }
    let out = h.send(
        a,
        &ClientMsg::Commit {
            epoch: 1,
            remove: vec![],
            admit: 1,
        },
    );
    let view2 = h.core.view().cloned().expect("view");
    assert_eq!(view2.epoch, 2);
    assert_eq!(view2.members.len(), 3);
    assert_eq!(view2.member(2).map(|m| m.uid), Some(uid));
    assert_eq!(
        to(&out, n),
        vec![ServerMsg::Integrate {
            node: 2,
            view: view2.clone()
        }]
    );
    assert_eq!(
        to(&out, a),
        vec![ServerMsg::Committed {
            view: view2.clone()
        }]
    );
    assert_eq!(
        to(&out, b),
        vec![ServerMsg::ViewUpdate {
            view: view2.clone()
        }]
    );
    // The integrated newcomer is a full member: it can query at the new epoch.
    let out = h.send(n, &ClientMsg::QueryPending { epoch: 2 });
    assert!(matches!(
        to(&out, n).as_slice(),
        [ServerMsg::Pending { epoch: 2, .. }]
    ));
}

#[test]
fn combined_remove_and_admit_commit() {
    let (mut h, m) = Harness::launched(4);
    let view1 = h.core.view().cloned().expect("view");
    let (n1, _) = h.newcomer(21);
    let (n2, _) = h.newcomer(22);
    let out = h.send(
        m[0],
        &ClientMsg::Commit {
            epoch: 1,
            remove: vec![1, 2],
            admit: 1,
        },
    );
    let view2 = h.core.view().cloned().expect("view");
    assert_eq!(view2.epoch, 2);
    let uids: Vec<u64> = view2.members.iter().map(|x| x.uid).collect();
    assert_eq!(uids[..2], [view1.members[0].uid, view1.members[3].uid]);
    assert_eq!(uids.len(), 3);
    assert_eq!(
        view2,
        view1
            .renumbered(&[1, 2], &[view2.members[2].clone()])
            .expect("same rule")
    );
    for departing in [m[1], m[2]] {
        assert_eq!(to(&out, departing), vec![ServerMsg::Die { epoch: 2 }]);
    }
    assert_eq!(
        to(&out, n1),
        vec![ServerMsg::Integrate {
            node: 2,
            view: view2.clone()
        }]
    );
    assert!(to(&out, n2).is_empty(), "the second newcomer keeps waiting");
    assert_eq!(
        to(&out, m[0]),
        vec![ServerMsg::Committed {
            view: view2.clone()
        }]
    );
    assert_eq!(
        to(&out, m[3]),
        vec![ServerMsg::ViewUpdate {
            view: view2.clone()
        }]
    );
    assert_eq!(h.core.pending().len(), 1);
    // Departed members leaving is expected: no MemberLost.
    for departing in [m[1], m[2]] {
        assert!(h.core.on_disconnect(departing, h.now).is_empty());
    }
}

#[test]
fn stale_and_duplicate_commits_are_refused() {
    let (mut h, m) = Harness::launched(3);
    let commit = ClientMsg::Commit {
        epoch: 1,
        remove: vec![2],
        admit: 0,
    };
    h.send(m[0], &commit);
    let after = h.core.view().cloned().expect("view");
    assert_eq!(after.epoch, 2);
    // The same commit again (a retry): refused, state unchanged.
    let out = h.send(m[0], &commit);
    let (code, message) = error_code(&out, m[0]).expect("error");
    assert_eq!(code, ErrorCode::StaleEpoch);
    assert!(message.contains('1') && message.contains('2'), "{message}");
    assert!(!closed(&out, m[0]), "a refusal keeps the connection");
    assert_eq!(h.core.view(), Some(&after));
    // A future epoch, invalid removals, admitting more than pending.
    for (msg, expected) in [
        (
            ClientMsg::Commit {
                epoch: 3,
                remove: vec![],
                admit: 0,
            },
            ErrorCode::StaleEpoch,
        ),
        (
            ClientMsg::Commit {
                epoch: 2,
                remove: vec![0],
                admit: 0,
            },
            ErrorCode::InvalidCommit,
        ),
        (
            ClientMsg::Commit {
                epoch: 2,
                remove: vec![5],
                admit: 0,
            },
            ErrorCode::InvalidCommit,
        ),
        (
            ClientMsg::Commit {
                epoch: 2,
                remove: vec![1, 1],
                admit: 0,
            },
            ErrorCode::InvalidCommit,
        ),
        (
            ClientMsg::Commit {
                epoch: 2,
                remove: vec![],
                admit: 1,
            },
            ErrorCode::InvalidCommit,
        ),
        (ClientMsg::QueryPending { epoch: 1 }, ErrorCode::StaleEpoch),
    ] {
        let out = h.send(m[0], &msg);
        assert_eq!(
            error_code(&out, m[0]).map(|e| e.0),
            Some(expected),
            "{msg:?}"
        );
        assert_eq!(h.core.view(), Some(&after));
    }
    // A non-zero member may commit but not remove itself.
    let out = h.send(
        m[1],
        &ClientMsg::Commit {
            epoch: 2,
            remove: vec![1],
            admit: 0,
        },
    );
    assert_eq!(
        error_code(&out, m[1]).map(|e| e.0),
        Some(ErrorCode::InvalidCommit)
    );
}

#[test]
fn commit_from_a_non_member_is_refused() {
    let (mut h, _m) = Harness::launched(2);
    let tool = h.auth();
    let (newcomer, _) = h.newcomer(5);
    for c in [tool, newcomer] {
        let out = h.send(
            c,
            &ClientMsg::Commit {
                epoch: 1,
                remove: vec![],
                admit: 1,
            },
        );
        assert_eq!(error_code(&out, c).map(|e| e.0), Some(ErrorCode::NotMember));
        let out = h.send(c, &ClientMsg::ShutdownReady { epoch: 1, code: 0 });
        assert_eq!(error_code(&out, c).map(|e| e.0), Some(ErrorCode::NotMember));
    }
    assert_eq!(h.epoch(), 1);
    assert_eq!(h.core.pending().len(), 1);
    // A member removed by a commit is no longer a member.
    let (mut h, m) = Harness::launched(3);
    h.send(
        m[0],
        &ClientMsg::Commit {
            epoch: 1,
            remove: vec![2],
            admit: 0,
        },
    );
    let out = h.send(
        m[2],
        &ClientMsg::Commit {
            epoch: 2,
            remove: vec![1],
            admit: 0,
        },
    );
    assert_eq!(
        error_code(&out, m[2]).map(|e| e.0),
        Some(ErrorCode::NotMember)
    );
    assert_eq!(h.epoch(), 2);
}

#[test]
fn newcomer_dying_before_integration_is_dropped() {
    let (mut h, m) = Harness::launched(2);
    let (n, _) = h.newcomer(7);
    assert_eq!(h.core.pending().len(), 1);
    let out = h.core.on_disconnect(n, h.now);
    assert!(out.is_empty(), "not an error, nobody is told");
    let out = h.send(m[0], &ClientMsg::QueryPending { epoch: 1 });
    assert_eq!(
        to(&out, m[0]),
        vec![ServerMsg::Pending {
            epoch: 1,
            newcomers: vec![]
        }]
    );
    let out = h.send(
        m[0],
        &ClientMsg::Commit {
            epoch: 1,
            remove: vec![],
            admit: 1,
        },
    );
    assert_eq!(
        error_code(&out, m[0]).map(|e| e.0),
        Some(ErrorCode::InvalidCommit)
    );
    assert_eq!(h.epoch(), 1);
}

#[test]
fn member_lost_notice() {
    let (mut h, m) = Harness::launched(3);
    let view = h.core.view().cloned().expect("view");
    let (n, _) = h.newcomer(8);
    let out = h.core.on_disconnect(m[2], h.now);
    let uid = view.members[2].uid;
    for c in [m[0], m[1]] {
        assert_eq!(
            to(&out, c),
            vec![ServerMsg::MemberLost {
                epoch: 1,
                node: 2,
                uid
            }]
        );
    }
    assert!(to(&out, n).is_empty(), "newcomers are not told");
    assert_eq!(
        h.core.view(),
        Some(&view),
        "removing it is the runtime's decision"
    );
    // The runtime removes it; the job can still shut down.
    h.send(
        m[0],
        &ClientMsg::Commit {
            epoch: 1,
            remove: vec![2],
            admit: 0,
        },
    );
    assert_eq!(h.epoch(), 2);
}

/// A commit that would keep a member announced lost is refused, naming it:
/// a rescale node 0 committed without knowing of the loss must not hand the
/// survivors a view with a dead member. The recovery's commit, which
/// removes it, is made, and a later view starts with no loss.
#[test]
fn a_commit_keeping_a_member_announced_lost_is_refused() {
    let (mut h, m) = Harness::launched(4);
    let uid = h.core.view().expect("view").members[2].uid;
    h.core.on_disconnect(m[2], h.now);
    for remove in [vec![3], vec![]] {
        let out = h.send(
            m[0],
            &ClientMsg::Commit {
                epoch: 1,
                remove,
                admit: 0,
            },
        );
        let (code, message) = error_code(&out, m[0]).expect("refused");
        assert_eq!(code, ErrorCode::MemberLost);
        assert!(
            message.contains(&format!("node 2 (uid {uid}) was lost in epoch 1")),
            "{message}"
        );
        assert_eq!(h.epoch(), 1, "nothing committed");
    }
    h.send(
        m[0],
        &ClientMsg::Commit {
            epoch: 1,
            remove: vec![2, 3],
            admit: 0,
        },
    );
    assert_eq!(h.epoch(), 2);
    h.send(
        m[0],
        &ClientMsg::Commit {
            epoch: 2,
            remove: vec![1],
            admit: 0,
        },
    );
    assert_eq!(h.epoch(), 3, "the loss was the old view's");
}

#[test]
fn shutdown_barrier_returns_node_zero_code() {
    let (mut h, m) = Harness::launched(3);
    let out = h.send(m[1], &ClientMsg::ShutdownReady { epoch: 0, code: 0 });
    assert_eq!(
        error_code(&out, m[1]).map(|e| e.0),
        Some(ErrorCode::StaleEpoch)
    );
    assert!(h
        .send(m[2], &ClientMsg::ShutdownReady { epoch: 1, code: 1 })
        .is_empty());
    // A member that is ready may drop its connection without a MemberLost.
    assert!(h.core.on_disconnect(m[2], h.now).is_empty());
    // No rescale once the barrier is gathering.
    let out = h.send(
        m[0],
        &ClientMsg::Commit {
            epoch: 1,
            remove: vec![1],
            admit: 0,
        },
    );
    assert_eq!(
        error_code(&out, m[0]).map(|e| e.0),
        Some(ErrorCode::NotReady)
    );
    assert!(h
        .send(m[0], &ClientMsg::ShutdownReady { epoch: 1, code: 7 })
        .is_empty());
    let out = h.send(m[1], &ClientMsg::ShutdownReady { epoch: 1, code: 0 });
    for c in [m[0], m[1]] {
        assert_eq!(
            to(&out, c),
            vec![ServerMsg::ShutdownDone { epoch: 1, code: 7 }]
        );
        assert!(closed(&out, c));
    }
    assert_eq!(finished(&out), Some(7));
    assert_eq!(out.last(), Some(&Action::Finished { code: 7 }));
    assert_eq!(h.core.phase(), Lifecycle::Finished);
}

#[test]
fn query_view_for_status_tools() {
    let mut h = Harness::new(Some(1));
    let tool = h.auth();
    let out = h.send(tool, &ClientMsg::QueryView);
    assert_eq!(
        to(&out, tool),
        vec![ServerMsg::CurrentView {
            view: None,
            pending: vec![]
        }]
    );
    let a = h.auth();
    h.send(
        a,
        &ClientMsg::Register(reg(Role::Launch { index: 0 }, FP, 0)),
    );
    h.newcomer(3);
    let out = h.send(tool, &ClientMsg::QueryView);
    match to(&out, tool).as_slice() {
        [ServerMsg::CurrentView {
            view: Some(v),
            pending,
        }] => {
            assert_eq!(v.epoch, 1);
            assert_eq!(pending.len(), 1);
        }
        other => panic!("{other:?}"),
    }
}

fn restored_view() -> View {
    let members = [(10u64, 4u32), (20, 4), (30, 2)]
        .iter()
        .enumerate()
        .map(|(i, &(uid, pes))| Member {
            node: i as u32,
            uid,
            address: vec![i as u8],
            pes,
            host: format!("h{i}"),
            pid: 1,
        })
        .collect();
    View { epoch: 5, members }
}

#[test]
fn restore_after_restart() {
    let mut h = Harness::new(None);
    assert_eq!(h.core.phase(), Lifecycle::Recovering);
    // A newcomer re-registers before node 0 is back: queued, no uid yet.
    let (n, out) = h.newcomer(40);
    assert!(out.is_empty());
    // A member trying to reattach too early is told to retry.
    let m1 = h.auth();
    let out = h.send(m1, &ClientMsg::Reattach { epoch: 5, uid: 20 });
    assert_eq!(error_code(&out, m1).map(|e| e.0), Some(ErrorCode::NotReady));
    // Launch registrations make no sense here.
    let l = h.auth();
    let out = h.send(
        l,
        &ClientMsg::Register(reg(Role::Launch { index: 0 }, FP, 0)),
    );
    assert_eq!(
        error_code(&out, l).map(|e| e.0),
        Some(ErrorCode::DuplicateIndex)
    );
    // An invalid view is refused.
    let m0 = h.auth();
    let mut broken = restored_view();
    broken.members[2].uid = 10;
    let out = h.send(
        m0,
        &ClientMsg::Restore {
            view: broken,
            fingerprint: FP,
        },
    );
    assert_eq!(
        error_code(&out, m0).map(|e| e.0),
        Some(ErrorCode::InvalidCommit)
    );
    assert!(h.core.view().is_none());
    // Node 0 restores.
    let view = restored_view();
    let out = h.send(
        m0,
        &ClientMsg::Restore {
            view: view.clone(),
            fingerprint: FP,
        },
    );
    assert_eq!(
        to(&out, m0),
        vec![ServerMsg::Start {
            node: 0,
            view: view.clone()
        }]
    );
    let new_uid = match to(&out, n).as_slice() {
        [ServerMsg::Waiting { uid, view: v }] => {
            assert_eq!(v, &view);
            *uid
        }
        other => panic!("expected Waiting, got {other:?}"),
    };
    assert!(new_uid > 30, "new uids never collide with restored ones");
    // A second Restore is refused.
    let other = h.auth();
    let out = h.send(
        other,
        &ClientMsg::Restore {
            view: view.clone(),
            fingerprint: FP,
        },
    );
    assert_eq!(
        error_code(&out, other).map(|e| e.0),
        Some(ErrorCode::InvalidCommit)
    );
    // Members reattach; wrong epoch or unknown uid refused.
    let out = h.send(m1, &ClientMsg::Reattach { epoch: 4, uid: 20 });
    assert_eq!(
        error_code(&out, m1).map(|e| e.0),
        Some(ErrorCode::StaleEpoch)
    );
    let out = h.send(m1, &ClientMsg::Reattach { epoch: 5, uid: 99 });
    assert_eq!(
        error_code(&out, m1).map(|e| e.0),
        Some(ErrorCode::NotMember)
    );
    let out = h.send(m1, &ClientMsg::Reattach { epoch: 5, uid: 20 });
    assert_eq!(
        to(&out, m1),
        vec![ServerMsg::Start {
            node: 1,
            view: view.clone()
        }]
    );
    // Node 2 has not reattached: commits still work, and remove it while admitting the newcomer.
    let out = h.send(
        m0,
        &ClientMsg::Commit {
            epoch: 5,
            remove: vec![2],
            admit: 1,
        },
    );
    let next = h.core.view().cloned().expect("view");
    assert_eq!(next.epoch, 6);
    assert_eq!(
        next.members.iter().map(|m| m.uid).collect::<Vec<_>>(),
        vec![10, 20, new_uid]
    );
    assert_eq!(
        to(&out, n),
        vec![ServerMsg::Integrate {
            node: 2,
            view: next.clone()
        }]
    );
    assert_eq!(
        to(&out, m1),
        vec![ServerMsg::ViewUpdate { view: next.clone() }]
    );
    // Node 2, removed while away, reattaches in its old epoch: it is told
    // to leave (the Die it missed), and its later disconnect is expected.
    let m2 = h.auth();
    let out = h.send(m2, &ClientMsg::Reattach { epoch: 5, uid: 30 });
    assert_eq!(
        to(&out, m2)[0],
        ServerMsg::Die { epoch: 6 },
        "Die comes before the refusal"
    );
    assert_eq!(
        error_code(&out, m2).map(|e| e.0),
        Some(ErrorCode::NotMember)
    );
    assert!(!closed(&out, m2));
    let out = h.core.on_disconnect(m2, h.now);
    assert!(
        out.is_empty(),
        "no MemberLost for a departed member: {out:?}"
    );
    // A uid never seen, in the current epoch, is simply not a member.
    let stranger = h.auth();
    let out = h.send(stranger, &ClientMsg::Reattach { epoch: 6, uid: 77 });
    assert_eq!(to(&out, stranger).len(), 1, "no Die: {out:?}");
    assert_eq!(
        error_code(&out, stranger).map(|e| e.0),
        Some(ErrorCode::NotMember)
    );
    // And the barrier completes with the restored members.
    let (n2, _) = h.newcomer(41);
    h.send(m1, &ClientMsg::ShutdownReady { epoch: 6, code: 0 });
    h.send(n, &ClientMsg::ShutdownReady { epoch: 6, code: 0 });
    let out = h.send(m0, &ClientMsg::ShutdownReady { epoch: 6, code: 0 });
    assert_eq!(finished(&out), Some(0));
    assert!(closed(&out, n2));
}

#[test]
fn restore_refuses_newcomers_of_another_build() {
    let mut h = Harness::new(None);
    let c = h.auth();
    h.send(c, &ClientMsg::Register(reg(Role::Newcomer, 0xdead, 1)));
    let m0 = h.auth();
    let out = h.send(
        m0,
        &ClientMsg::Restore {
            view: restored_view(),
            fingerprint: FP,
        },
    );
    assert_eq!(
        error_code(&out, c).map(|e| e.0),
        Some(ErrorCode::FingerprintMismatch)
    );
    assert!(closed(&out, c));
    assert!(h.core.pending().is_empty());
}

#[test]
fn recovery_times_out_without_restore() {
    let mut h = Harness::new(None);
    let c = h.auth();
    let out = h.advance(Duration::from_secs(61));
    assert_eq!(
        error_code(&out, c).map(|e| e.0),
        Some(ErrorCode::LaunchTimeout)
    );
    assert_eq!(finished(&out), Some(EXIT_LAUNCH_TIMEOUT));
}

#[test]
fn reattach_replaces_a_stale_connection() {
    let (mut h, m) = Harness::launched(2);
    let uid = h.core.view().map(|v| v.members[1].uid).expect("view");
    let fresh = h.auth();
    let out = h.send(fresh, &ClientMsg::Reattach { epoch: 1, uid });
    assert!(matches!(
        to(&out, fresh).as_slice(),
        [ServerMsg::Start { node: 1, .. }]
    ));
    assert!(closed(&out, m[1]));
    assert!(
        to(&out, m[0]).is_empty(),
        "no MemberLost for a replaced connection"
    );
    let out = h.core.on_disconnect(m[1], h.now);
    assert!(out.is_empty());
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Arbitrary bytes from a member and from a stranger never panic the
        /// coordinator, and never change the view without a valid commit frame.
        #[test]
        fn random_input_never_panics(a in proptest::collection::vec(any::<u8>(), 0..512),
                                     b in proptest::collection::vec(any::<u8>(), 0..512)) {
            let (mut h, m) = Harness::launched(2);
            let before = h.core.view().cloned();
            let stranger = h.auth();
            h.core.on_frame(m[1], &a, h.now);
            h.core.on_frame(stranger, &b, h.now);
            h.advance(Duration::from_secs(1));
            prop_assert_eq!(h.core.view().cloned(), before);
        }
    }
}

#[test]
fn members_lost_during_the_barrier_are_not_waited_for() {
    let (mut h, m) = Harness::launched(3);
    // Node 2's connection is gone before the barrier: the runtime did not remove it.
    h.core.on_disconnect(m[2], h.now);
    assert!(h
        .send(m[0], &ClientMsg::ShutdownReady { epoch: 1, code: 0 })
        .is_empty());
    // Node 1 crashes during the barrier: nobody hangs.
    let out = h.core.on_disconnect(m[1], h.now);
    assert_eq!(
        to(&out, m[0])[1],
        ServerMsg::ShutdownDone { epoch: 1, code: 0 }
    );
    assert_eq!(finished(&out), Some(0));
    // Node 0 lost: the job's code is unknown, hence EXIT_NODE0_LOST.
    let (mut h, m) = Harness::launched(2);
    h.send(m[1], &ClientMsg::ShutdownReady { epoch: 1, code: 0 });
    let out = h.core.on_disconnect(m[0], h.now);
    assert_eq!(finished(&out), Some(EXIT_NODE0_LOST));
}

#[test]
fn a_started_job_without_members_is_given_up_after_the_idle_timeout() {
    let (mut h, m) = Harness::launched(2);
    // One member gone: the job goes on, however long.
    h.core.on_disconnect(m[1], h.now);
    assert!(finished(&h.advance(Duration::from_secs(600))).is_none());
    // The last one gone: the clock starts, and fires once, at the timeout.
    h.core.on_disconnect(m[0], h.now);
    assert_eq!(
        h.core.next_deadline(),
        Some(h.now + Duration::from_secs(60))
    );
    assert!(finished(&h.advance(Duration::from_secs(59))).is_none());
    let out = h.advance(Duration::from_secs(1));
    assert_eq!(finished(&out), Some(EXIT_NO_MEMBERS));
    assert_eq!(h.core.phase(), Lifecycle::Finished);
    assert!(h.core.failure().is_some_and(|f| f.contains("no member")));
}

#[test]
fn a_member_back_in_time_stops_the_idle_clock() {
    let (mut h, m) = Harness::launched(1);
    let uid = h.core.view().expect("view").members[0].uid;
    h.core.on_disconnect(m[0], h.now);
    assert!(finished(&h.advance(Duration::from_secs(50))).is_none());
    // The member rejoins (as after a coordinator hiccup) before the timeout.
    let again = h.auth();
    let out = h.send(again, &ClientMsg::Reattach { epoch: 1, uid });
    assert!(matches!(
        to(&out, again).as_slice(),
        [ServerMsg::Start { .. }]
    ));
    assert_eq!(h.core.next_deadline(), None);
    assert!(finished(&h.advance(Duration::from_secs(600))).is_none());
}

#[test]
fn rescales_and_a_restore_with_rejoin_never_fire_the_idle_clock() {
    // A rescale: departing members leave, survivors stay connected.
    let (mut h, m) = Harness::launched(3);
    let (n, _) = h.newcomer(9);
    h.send(
        m[0],
        &ClientMsg::Commit {
            epoch: 1,
            remove: vec![1, 2],
            admit: 1,
        },
    );
    for departing in [m[1], m[2]] {
        h.core.on_disconnect(departing, h.now);
    }
    assert!(finished(&h.advance(Duration::from_secs(600))).is_none());
    assert_eq!(h.core.next_deadline(), None);
    let _ = n;

    // A restarted coordinator waits for Restore under the launch timeout
    // only, without members all along; once node 0 restored the view, its
    // connection keeps the job.
    let mut h = Harness::new(None);
    assert!(finished(&h.advance(Duration::from_secs(50))).is_none());
    let m0 = h.auth();
    h.send(
        m0,
        &ClientMsg::Restore {
            view: restored_view(),
            fingerprint: FP,
        },
    );
    assert_eq!(h.core.phase(), Lifecycle::Running);
    assert_eq!(h.core.next_deadline(), None);
    assert!(finished(&h.advance(Duration::from_secs(600))).is_none());
}

/// Issue 15, items 3 and 6: a thousand rescales, each admitting a newcomer
/// and removing the previous one (which then disconnects), leave the
/// coordinator holding what it held after the first; its admission history
/// is a ring of the last [`ADMISSION_HISTORY`] with a total, answered to
/// `QueryAdmissions`, and lists a newcomer admitted and removed again.
#[test]
fn a_thousand_rescales_leave_the_state_bounded_and_the_history_a_ring() {
    let (mut h, m) = Harness::launched(2);
    let tool = h.auth();
    let mut previous: Option<(ConnId, NodeId)> = None;
    let mut after_first = None;
    for round in 0..1_000u32 {
        let (newcomer, _) = h.newcomer((round % 200) as u8);
        let epoch = h.epoch();
        let remove = previous.map(|(_, node)| vec![node]).unwrap_or_default();
        let out = h.send(
            m[0],
            &ClientMsg::Commit {
                epoch,
                remove,
                admit: 1,
            },
        );
        assert!(error_code(&out, m[0]).is_none(), "round {round}: {out:?}");
        if let Some((gone, _)) = previous {
            assert_eq!(to(&out, gone), vec![ServerMsg::Die { epoch: epoch + 1 }]);
            assert!(h.core.on_disconnect(gone, h.now).is_empty());
        }
        previous = Some((newcomer, 2));
        if round == 0 {
            after_first = Some(h.core.footprint());
        }
    }
    let fp = h.core.footprint();
    assert_eq!(fp.admissions, ADMISSION_HISTORY);
    assert_eq!(
        Footprint {
            admissions: 1,
            ..fp
        },
        after_first.expect("first round"),
        "the state grew with the rescales"
    );
    let out = h.send(tool, &ClientMsg::QueryAdmissions);
    match to(&out, tool).as_slice() {
        [ServerMsg::Admissions { total, recent }] => {
            assert_eq!(*total, 1_000);
            assert_eq!(recent.len(), ADMISSION_HISTORY);
            assert_eq!(recent.last().map(|a| a.epoch), Some(h.epoch()));
            // The newcomer of round 998 was admitted, then removed by the
            // last commit: the history still lists it.
            let gone = recent[ADMISSION_HISTORY - 2];
            assert_eq!(gone.epoch, h.epoch() - 1);
            assert!(h.core.view().expect("view").by_uid(gone.uid).is_none());
            assert!(recent.windows(2).all(|w| w[0].epoch < w[1].epoch));
        }
        other => panic!("expected Admissions, got {other:?}"),
    }
}

/// Launches `n` members under a heartbeat timeout of `secs`.
fn launched_with_heartbeat(n: u32, secs: u64) -> (Harness, Vec<ConnId>) {
    let (mut h, conns) = Harness::launched(n);
    h.core.cfg.heartbeat_timeout = Some(Duration::from_secs(secs));
    (h, conns)
}

/// Virtual seconds pass, `beating` sending a heartbeat each; the actions.
fn beat_for(h: &mut Harness, secs: u64, beating: &[ConnId]) -> Vec<Action> {
    let mut out = Vec::new();
    for _ in 0..secs {
        out.extend(h.advance(Duration::from_secs(1)));
        for &c in beating {
            out.extend(h.send(c, &ClientMsg::Heartbeat));
        }
    }
    out
}

#[test]
fn heartbeat_a_silent_member_is_declared_lost_to_the_others_and_may_not_reattach() {
    let (mut h, m) = launched_with_heartbeat(3, 10);
    let uid = h.core.view().expect("view").members[2].uid;
    // Members that send anything, heartbeats or requests, stay.
    let out = beat_for(&mut h, 30, &m);
    assert!(out.is_empty(), "{out:?}");
    // Node 2 falls silent (stopped, frozen, cut off).
    let out = beat_for(&mut h, 9, &m[..2]);
    assert!(out.is_empty(), "not before the timeout: {out:?}");
    assert_eq!(
        h.core.next_deadline(),
        Some(h.now + Duration::from_secs(1)),
        "the driver's next tick is the silent member's deadline"
    );
    let out = beat_for(&mut h, 1, &m[..2]);
    for &c in &m[..2] {
        assert_eq!(
            to(&out, c),
            vec![ServerMsg::MemberLost {
                epoch: 1,
                node: 2,
                uid
            }],
            "every other member is told, once"
        );
    }
    assert!(
        closed(&out, m[2]),
        "the silent member's connection is closed"
    );
    assert!(to(&out, m[2]).is_empty());
    // Back from its pause, it may not come in again.
    let again = h.auth();
    let out = h.send(again, &ClientMsg::Reattach { epoch: 1, uid });
    let (code, message) = error_code(&out, again).expect("refused");
    assert_eq!(code, ErrorCode::NotMember);
    assert!(message.contains("declared lost"), "{message}");
    assert!(beat_for(&mut h, 60, &m[..2]).is_empty(), "declared once");
}

#[test]
fn heartbeat_a_paused_coordinator_declares_nobody_and_counts_again_from_its_return() {
    let (mut h, m) = launched_with_heartbeat(2, 10);
    assert!(beat_for(&mut h, 5, &m).is_empty());
    // The coordinator itself does not run for 40 s (stopped, a VM pause):
    // its first event after is a tick with every member silent.
    let out = h.advance(Duration::from_secs(40));
    assert!(
        out.is_empty(),
        "nobody lost for the coordinator's own pause: {out:?}"
    );
    // Silences count from its return: node 1 is lost 10 s after it.
    let out = beat_for(&mut h, 9, &m[..1]);
    assert!(out.is_empty(), "{out:?}");
    let out = beat_for(&mut h, 1, &m[..1]);
    assert!(closed(&out, m[1]));
    assert_eq!(to(&out, m[0]).len(), 1);
}

#[test]
fn heartbeat_members_in_the_shutdown_barrier_are_not_waited_on_for_heartbeats() {
    let (mut h, m) = launched_with_heartbeat(2, 10);
    // Node 1 is done and waits in the barrier, silent; node 0 computes on.
    let out = h.send(m[1], &ClientMsg::ShutdownReady { epoch: 1, code: 0 });
    assert!(to(&out, m[1]).is_empty(), "the barrier waits for node 0");
    let out = beat_for(&mut h, 60, &m[..1]);
    assert!(out.is_empty(), "{out:?}");
    let out = h.send(m[0], &ClientMsg::ShutdownReady { epoch: 1, code: 0 });
    assert!(matches!(
        to(&out, m[1]).as_slice(),
        [ServerMsg::ShutdownDone { .. }]
    ));
}

#[test]
fn heartbeat_every_member_silent_at_once_is_declared_lost_at_the_timeout() {
    let (mut h, m) = launched_with_heartbeat(3, 10);
    assert!(beat_for(&mut h, 3, &m).is_empty());
    // Every node hangs; the coordinator, awake, ticks on its own.
    let mut out = Vec::new();
    while let Some(at) = h.core.next_deadline().filter(|_| out.is_empty()) {
        assert!(
            at <= h.now + Duration::from_secs(10) / 4,
            "it ticks at least every quarter of the timeout"
        );
        let by = at - h.now;
        out = h.advance(by);
    }
    for &c in &m {
        assert!(closed(&out, c), "all at once: {out:?}");
    }
}

#[test]
fn heartbeat_a_paused_coordinator_whose_first_event_is_a_frame_declares_nobody() {
    let (mut h, m) = launched_with_heartbeat(2, 10);
    assert!(beat_for(&mut h, 5, &m).is_empty());
    // Back from a 40 s pause, it reads node 0's queued heartbeat first and
    // ticks before it reads node 1's.
    h.now += Duration::from_secs(40);
    assert!(h.send(m[0], &ClientMsg::Heartbeat).is_empty());
    let out = h.advance(Duration::from_millis(1));
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn heartbeat_off_declares_nobody() {
    let (mut h, m) = launched_with_heartbeat(2, 10);
    h.core.cfg.heartbeat_timeout = None;
    assert!(beat_for(&mut h, 120, &m[..1]).is_empty());
    assert_eq!(h.core.next_deadline(), None);
}
