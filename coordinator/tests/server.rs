//! The real tokio server on 127.0.0.1:0 with real blocking clients (and the
//! binary): launch, shutdown barrier, authentication, garbage input, a rescale
//! round. Every wait has a timeout; nothing asserts a duration.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use ductile_coordinator::client::{Admission, Client, ClientError};
use ductile_coordinator::core::Config;
use ductile_coordinator::proto::{
    decode, encode, ClientMsg, ErrorCode, Registration, Role, ServerMsg, HEADER_LEN,
    PROTOCOL_VERSION,
};
use ductile_coordinator::secret::Secret;
use ductile_coordinator::server::{serve, ServerError};

const T: Duration = Duration::from_secs(20);
const FP: u64 = 0x1234;

struct Server {
    addr: String,
    done: mpsc::Receiver<Result<i32, ServerError>>,
}

impl Server {
    fn start(cfg: Config) -> Server {
        let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
        let (done_tx, done) = mpsc::channel();
        thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let result = rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                addr_tx
                    .send(listener.local_addr().expect("addr"))
                    .expect("send addr");
                serve(listener, cfg).await
            });
            let _ = done_tx.send(result);
        });
        let addr = addr_rx.recv_timeout(T).expect("server started").to_string();
        Server { addr, done }
    }

    fn result(&self) -> Result<i32, ServerError> {
        self.done.recv_timeout(T).expect("server finished")
    }
}

fn reg(role: Role, tag: u8) -> Registration {
    Registration {
        role,
        address: vec![tag; 4],
        pes: 1,
        host: "localhost".into(),
        pid: u32::from(tag),
        fingerprint: FP,
    }
}

fn launch(server: &Server, secret: &Secret, n: u32) -> Vec<(Client, u32)> {
    // Register from threads in reverse index order; each blocks until all are in.
    let handles: Vec<_> = (0..n)
        .rev()
        .map(|index| {
            let (addr, secret) = (server.addr.clone(), secret.clone());
            thread::spawn(move || {
                let c = Client::connect(&addr, &secret, T).expect("connect");
                match c
                    .register(reg(Role::Launch { index }, index as u8), T)
                    .expect("register")
                {
                    Admission::Member { node, view } => {
                        assert_eq!(node, index);
                        assert_eq!(view.epoch, 1);
                        assert_eq!(view.members.len(), n as usize);
                        (c, node)
                    }
                    other => panic!("launch member got {other:?}"),
                }
            })
        })
        .collect();
    let mut members: Vec<(Client, u32)> = handles
        .into_iter()
        .map(|h| h.join().expect("thread"))
        .collect();
    members.sort_by_key(|(_, node)| *node);
    members
}

fn barrier(members: Vec<(Client, u32)>, epoch: u64, codes: &[i32]) -> Vec<i32> {
    let handles: Vec<_> = members
        .into_iter()
        .map(|(c, node)| {
            let code = codes[node as usize];
            thread::spawn(move || {
                let r = c.shutdown_barrier(epoch, code, T).expect("barrier");
                c.close();
                r
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("thread"))
        .collect()
}

#[test]
fn launch_three_and_shutdown_barrier() {
    let secret = Secret::generate();
    let server = Server::start(Config::launch(secret.clone(), 3));
    let members = launch(&server, &secret, 3);
    let results = barrier(members, 1, &[5, 0, 1]);
    assert_eq!(results, vec![5, 5, 5]);
    assert_eq!(server.result().expect("clean finish"), 5);
}

#[test]
fn bad_secret_is_refused() {
    let secret = Secret::generate();
    let server = Server::start(Config::launch(secret.clone(), 1));
    match Client::connect(&server.addr, &Secret::generate(), T) {
        Err(ClientError::Server {
            code: ErrorCode::Unauthenticated,
            ..
        }) => {}
        other => panic!("expected Unauthenticated, got {other:?}"),
    }
    // The server is unaffected.
    let members = launch(&server, &secret, 1);
    assert_eq!(barrier(members, 1, &[0]), vec![0]);
    assert_eq!(server.result().expect("finish"), 0);
}

/// Reads everything until the server closes; returns the bytes after the challenge frame.
fn read_after_challenge(stream: &mut TcpStream) -> Vec<u8> {
    stream.set_read_timeout(Some(T)).expect("timeout");
    let mut all = Vec::new();
    stream
        .read_to_end(&mut all)
        .expect("server closes the connection");
    let len = u32::from_le_bytes([all[8], all[9], all[10], all[11]]) as usize;
    let challenge: ServerMsg = decode(&all[..HEADER_LEN + len]).expect("challenge");
    assert!(matches!(challenge, ServerMsg::Challenge { .. }));
    all.split_off(HEADER_LEN + len)
}

#[test]
fn garbage_gets_an_error_frame_and_a_closed_connection() {
    let secret = Secret::generate();
    let server = Server::start(Config::launch(secret.clone(), 1));
    let mut oversized = b"DUCT".to_vec();
    oversized.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    oversized.extend_from_slice(&0u16.to_le_bytes());
    oversized.extend_from_slice(&u32::MAX.to_le_bytes());
    for (bytes, expected) in [
        (
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            ErrorCode::Malformed,
        ),
        (oversized, ErrorCode::Oversized),
        (encode(&ClientMsg::QueryView), ErrorCode::Unauthenticated),
    ] {
        let mut s = TcpStream::connect(&server.addr).expect("connect");
        s.write_all(&bytes).expect("write");
        let rest = read_after_challenge(&mut s);
        match decode::<ServerMsg>(&rest) {
            Ok(ServerMsg::Error { code, .. }) => assert_eq!(code, expected),
            other => panic!("expected an error frame, got {other:?}"),
        }
    }
    let members = launch(&server, &secret, 1);
    assert_eq!(barrier(members, 1, &[0]), vec![0]);
    assert_eq!(server.result().expect("finish"), 0);
}

#[test]
fn commit_round_with_removal_and_admission() {
    let secret = Secret::generate();
    let server = Server::start(Config::launch(secret.clone(), 2));
    let mut members = launch(&server, &secret, 2);
    let newcomer = Client::connect(&server.addr, &secret, T).expect("connect");
    let uid = match newcomer
        .register(reg(Role::Newcomer, 9), T)
        .expect("register")
    {
        Admission::Waiting { uid, view } => {
            assert_eq!(view.epoch, 1);
            uid
        }
        other => panic!("newcomer got {other:?}"),
    };
    let (node0, _) = &members[0];
    let pending = node0.query_pending(1, T).expect("pending");
    assert_eq!(pending.iter().map(|p| p.uid).collect::<Vec<_>>(), vec![uid]);
    // A stale commit is refused and changes nothing.
    match node0.commit(0, vec![], 1, T) {
        Err(ClientError::Server {
            code: ErrorCode::StaleEpoch,
            ..
        }) => {}
        other => panic!("expected StaleEpoch, got {other:?}"),
    }
    let view = node0.commit(1, vec![1], 1, T).expect("commit");
    assert_eq!(view.epoch, 2);
    assert_eq!(view.members.len(), 2);
    assert_eq!(view.members[1].uid, uid);
    let (departing, _) = members.pop().expect("node 1");
    assert_eq!(
        departing.events().recv_timeout(T).expect("die"),
        ServerMsg::Die { epoch: 2 }
    );
    departing.close();
    match newcomer.events().recv_timeout(T).expect("integrate") {
        ServerMsg::Integrate { node, view: v } => {
            assert_eq!(node, 1);
            assert_eq!(v, view);
        }
        other => panic!("expected Integrate, got {other:?}"),
    }
    members.push((newcomer, 1));
    assert_eq!(barrier(members, 2, &[0, 0]), vec![0, 0]);
    assert_eq!(server.result().expect("finish"), 0);
}

#[test]
fn member_lost_reaches_the_survivors() {
    let secret = Secret::generate();
    let server = Server::start(Config::launch(secret.clone(), 2));
    let mut members = launch(&server, &secret, 2);
    let (lost, _) = members.pop().expect("node 1");
    lost.close();
    let (node0, _) = &members[0];
    match node0.recv_timeout(T).expect("notice") {
        ServerMsg::MemberLost {
            epoch: 1, node: 1, ..
        } => {}
        other => panic!("expected MemberLost, got {other:?}"),
    }
    let view = node0
        .commit(1, vec![1], 0, T)
        .expect("remove the lost node");
    assert_eq!(view.members.len(), 1);
    assert_eq!(barrier(members, 2, &[0]), vec![0]);
    assert_eq!(server.result().expect("finish"), 0);
}

#[test]
fn launch_timeout_is_reported_to_waiting_members() {
    let secret = Secret::generate();
    let mut cfg = Config::launch(secret.clone(), 2);
    cfg.launch_timeout = Duration::from_millis(300);
    let server = Server::start(cfg);
    let c = Client::connect(&server.addr, &secret, T).expect("connect");
    match c.register(reg(Role::Launch { index: 0 }, 0), T) {
        Err(ClientError::Server {
            code: ErrorCode::LaunchTimeout,
            message,
        }) => assert!(message.contains("1 of 2")),
        other => panic!("expected LaunchTimeout, got {other:?}"),
    }
    assert!(matches!(
        server.result(),
        Err(ServerError::LaunchTimeout(_))
    ));
}

#[test]
fn binary_prints_address_and_exits_with_the_job_code() {
    let secret = Secret::generate();
    let dir = tempfile::tempdir().expect("tempdir");
    let addr_file = dir.path().join("coord.addr");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ductile-coordinator"))
        .args(["--expect", "1", "--addr-file"])
        .arg(&addr_file)
        .env("DUCTILE_SECRET", secret.to_hex())
        .env_remove("DUCTILE_SECRET_FILE")
        .env("DUCTILE_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).expect("address line");
    let addr = line.trim().to_owned();
    assert_eq!(
        std::fs::read_to_string(&addr_file)
            .expect("addr file")
            .trim(),
        addr
    );
    let server = Server {
        addr,
        done: mpsc::channel().1,
    };
    let members = launch(&server, &secret, 1);
    assert_eq!(barrier(members, 1, &[3]), vec![3]);
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx.recv_timeout(T).expect("binary exits").expect("wait");
    assert_eq!(status.code(), Some(3));
}

/// Starts the binary with `args` (and the secret in its environment);
/// returns the child and the address it printed.
fn spawn_binary(secret: &Secret, args: &[&str]) -> (std::process::Child, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ductile-coordinator"))
        .args(args)
        .env("DUCTILE_SECRET", secret.to_hex())
        .env_remove("DUCTILE_SECRET_FILE")
        .env("DUCTILE_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).expect("address line");
    (child, line.trim().to_owned())
}

fn wait_exit(mut child: std::process::Child) -> std::process::ExitStatus {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    rx.recv_timeout(T).expect("binary exits").expect("wait")
}

/// The binary killed with SIGKILL while members are connected, then started
/// again with `--recover` on the address it had: node 0 restores it, node 1
/// reattaches (refused as not ready before that), and the job finishes with
/// node 0's code.
#[test]
fn binary_killed_and_restarted_with_recover_on_the_same_address() {
    let secret = Secret::generate();
    let (mut first, addr) = spawn_binary(&secret, &["--expect", "2"]);
    let server = Server {
        addr: addr.clone(),
        done: mpsc::channel().1,
    };
    let members = launch(&server, &secret, 2);
    let view = match members[0].0.query_view(T).expect("view") {
        (Some(view), _) => view,
        other => panic!("no view: {other:?}"),
    };
    first.kill().expect("SIGKILL");
    assert_eq!(
        first.wait().expect("wait").code(),
        None,
        "killed by a signal"
    );
    for (c, _) in &members {
        assert!(
            matches!(c.recv_timeout(T), Err(ClientError::Disconnected)),
            "the connection outlived the coordinator"
        );
    }
    let (second, again) = spawn_binary(&secret, &["--recover", "--listen", &addr]);
    assert_eq!(again, addr, "not the same address");
    let c1 = Client::connect(&addr, &secret, T).expect("node 1 connects");
    match c1.reattach(view.epoch, view.members[1].uid, T) {
        Err(ClientError::Server {
            code: ErrorCode::NotReady,
            ..
        }) => {}
        other => panic!("reattach before Restore: {other:?}"),
    }
    let c0 = Client::connect(&addr, &secret, T).expect("node 0 connects");
    assert_eq!(c0.restore(view.clone(), FP, T).expect("restore"), view);
    assert_eq!(
        c1.reattach(view.epoch, view.members[1].uid, T)
            .expect("reattach"),
        (1, view.clone())
    );
    assert_eq!(
        barrier(vec![(c0, 0), (c1, 1)], view.epoch, &[5, 5]),
        vec![5, 5]
    );
    assert_eq!(wait_exit(second).code(), Some(5));
}
