//! The coordinator binary under a flood of strangers (issue 15, item 4):
//! hundreds of idle connections that never authenticate, re-dialled as the
//! server sheds them, and peers that send garbage. Meanwhile a newcomer
//! registers and node 0 admits it (an expand), and the coordinator's
//! descriptors and threads stay within bounds that do not depend on the
//! flood's size.

use std::thread;
use std::time::Duration;

use ductile_coordinator::client::{Admission, Client};
use ductile_coordinator::proto::{Registration, Role, ServerMsg};
use ductile_coordinator::secret::Secret;
use ductile_coordinator::server::MAX_UNAUTHENTICATED;
use ductile_e2e::flood::{fds_and_threads, Flood, Peak};

const T: Duration = Duration::from_secs(30);

fn reg(role: Role, tag: u8) -> Registration {
    Registration {
        role,
        address: vec![tag; 4],
        pes: 1,
        host: "localhost".into(),
        pid: u32::from(tag),
        fingerprint: 7,
    }
}

#[test]
fn a_flood_of_idle_and_garbage_connections_does_not_stop_an_expand() {
    let secret = Secret::generate();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ductile-coordinator"))
        .args(["--listen", "127.0.0.1:0", "--expect", "2"])
        .env("DUCTILE_SECRET", secret.to_hex())
        .env_remove("DUCTILE_SECRET_FILE")
        .env("DUCTILE_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the coordinator");
    let pid = child.id();
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut addr = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut addr).expect("address line");
    let addr = addr.trim().to_owned();

    // Launch two members before the flood.
    let launch: Vec<_> = (0..2u32)
        .map(|index| {
            let (addr, secret) = (addr.clone(), secret.clone());
            thread::spawn(move || {
                let c = Client::connect(&addr, &secret, T).expect("connect");
                match c.register(reg(Role::Launch { index }, index as u8), T) {
                    Ok(Admission::Member { .. }) => c,
                    other => panic!("launch member {index}: {other:?}"),
                }
            })
        })
        .collect();
    let members: Vec<Client> = launch.into_iter().map(|h| h.join().expect("launch")).collect();
    let (base_fds, base_threads) = fds_and_threads(pid);

    let flood = Flood::start(&addr, 3, 150, 2);
    let peak = Peak::watch(pid);
    // Let the flood fill the strangers' budget many times over.
    let ok = (0..200).any(|_| {
        thread::sleep(Duration::from_millis(25));
        flood.dialled() > 4 * MAX_UNAUTHENTICATED as u64
    });
    assert!(ok, "the flood did not get going ({} dialled)", flood.dialled());

    // An expand under the flood: a newcomer registers, node 0 admits it.
    let newcomer = Client::connect(&addr, &secret, T).expect("the newcomer connects during the flood");
    let uid = match newcomer.register(reg(Role::Newcomer, 9), T).expect("register") {
        Admission::Waiting { uid, .. } => uid,
        other => panic!("newcomer got {other:?}"),
    };
    let pending = members[0].query_pending(1, T).expect("query pending");
    assert_eq!(pending.iter().map(|p| p.uid).collect::<Vec<_>>(), vec![uid]);
    let view = members[0].commit(1, vec![], 1, T).expect("commit");
    assert_eq!(view.epoch, 2);
    assert_eq!(view.members.len(), 3);
    match newcomer.events().recv_timeout(T).expect("integrate") {
        ServerMsg::Integrate { node, .. } => assert_eq!(node, 2),
        other => panic!("expected Integrate, got {other:?}"),
    }
    let dialled = flood.dialled();
    flood.stop();
    let (worst_fds, worst_threads) = peak.stop();
    assert!(
        dialled > 4 * MAX_UNAUTHENTICATED as u64,
        "the flood was too small to mean anything ({dialled} connections)"
    );
    // Strangers hold at most their budget, whatever the flood's size; the
    // newcomer is one more descriptor.
    assert!(
        worst_fds <= base_fds + MAX_UNAUTHENTICATED + 2,
        "descriptors grew with the flood: {worst_fds} (before it: {base_fds}, budget {MAX_UNAUTHENTICATED}, {dialled} dialled)"
    );
    assert!(
        worst_threads <= base_threads + 2,
        "threads grew with the flood: {worst_threads} (before it: {base_threads})"
    );

    // The job ends normally: every member through the shutdown barrier.
    let all: Vec<Client> = members.into_iter().chain([newcomer]).collect();
    let barrier: Vec<_> = all
        .into_iter()
        .map(|c| {
            thread::spawn(move || {
                let r = c.shutdown_barrier(2, 0, T).expect("barrier");
                c.close();
                r
            })
        })
        .collect();
    for b in barrier {
        assert_eq!(b.join().expect("barrier thread"), 0);
    }
    let status = child.wait().expect("coordinator exit");
    assert_eq!(status.code(), Some(0));
}
