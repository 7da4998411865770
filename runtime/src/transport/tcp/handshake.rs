//! Both sides of a TCP connection's start: the dialler and the acceptor
//! each send a nonce and prove with an HMAC over the job secret that they
//! hold it (the dialler also says its uid). Blocking, with a timeout: the
//! acceptor's side runs on a short-lived thread per peer (`receive.rs`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use ductile_coordinator::proto::NodeId;
use ductile_coordinator::secret::Secret;
use rand::RngCore;

use super::io_err;
use crate::transport::TransportError;

pub(super) const DIAL_CONTEXT: &[u8] = b"ductile/tcp/v1/dialer";
pub(super) const ACCEPT_CONTEXT: &[u8] = b"ductile/tcp/v1/acceptor";
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Dials node `node` at `address` and proves to it that this node (uid
/// `my_uid`) holds the job secret, and checks that it does too.
pub(super) fn dial(
    node: NodeId,
    address: &[u8],
    secret: &Secret,
    my_uid: u64,
) -> Result<TcpStream, TransportError> {
    let text = std::str::from_utf8(address)
        .map_err(|_| TransportError::Address(node, "not UTF-8".into()))?;
    let addr: SocketAddr = text
        .parse()
        .map_err(|e| TransportError::Address(node, format!("{text}: {e}")))?;
    let mut s = TcpStream::connect_timeout(&addr, HANDSHAKE_TIMEOUT)
        .map_err(io_err(format!("connecting to node {node} at {addr}")))?;
    s.set_nodelay(true).map_err(io_err("setting TCP_NODELAY"))?;
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io_err("setting a timeout"))?;
    // Acceptor's nonce; our uid, nonce and proof; the acceptor's proof.
    let mut theirs = [0u8; 32];
    s.read_exact(&mut theirs)
        .map_err(io_err(format!("handshake with node {node}")))?;
    let mut mine = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut mine);
    let proof = secret.proof(&dial_context(my_uid), &theirs);
    let mut hello = Vec::with_capacity(72);
    hello.extend_from_slice(&my_uid.to_le_bytes());
    hello.extend_from_slice(&mine);
    hello.extend_from_slice(&proof);
    s.write_all(&hello)
        .map_err(io_err(format!("handshake with node {node}")))?;
    let mut answer = [0u8; 32];
    // The acceptor closes without answering when the proof is wrong;
    // it also closes when it is ending. Say what is known, not a guess.
    s.read_exact(&mut answer).map_err(|e| {
        TransportError::Handshake(match e.kind() {
            std::io::ErrorKind::UnexpectedEof => format!(
                "node {node} at {addr} closed the connection during the handshake \
                 (it refuses a wrong job secret so, and so does a node that is ending)"
            ),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
                "node {node} at {addr} did not answer the handshake within {HANDSHAKE_TIMEOUT:?}"
            ),
            _ => format!("handshake with node {node} at {addr}: {e}"),
        })
    })?;
    if !secret.verify(ACCEPT_CONTEXT, &mine, &answer) {
        return Err(TransportError::Handshake(format!(
            "node {node} at {addr} does not hold the job secret"
        )));
    }
    s.set_read_timeout(None)
        .map_err(io_err("clearing a timeout"))?;
    Ok(s)
}

pub(super) fn dial_context(uid: u64) -> Vec<u8> {
    [DIAL_CONTEXT, &uid.to_le_bytes()].concat()
}

pub(super) fn accept_handshake(mut s: &TcpStream, secret: &Secret) -> Result<u64, TransportError> {
    s.set_nodelay(true).map_err(io_err("setting TCP_NODELAY"))?;
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io_err("setting a timeout"))?;
    let mut nonce = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut nonce);
    s.write_all(&nonce).map_err(io_err("handshake"))?;
    let mut hello = [0u8; 72];
    s.read_exact(&mut hello).map_err(io_err("handshake"))?;
    let uid = u64::from_le_bytes(hello[..8].try_into().expect("8 bytes"));
    let theirs: [u8; 32] = hello[8..40].try_into().expect("32 bytes");
    let proof: [u8; 32] = hello[40..72].try_into().expect("32 bytes");
    if !secret.verify(&dial_context(uid), &nonce, &proof) {
        let _ = s.shutdown(Shutdown::Both);
        return Err(TransportError::Handshake(format!(
            "peer claiming uid {uid} does not hold the job secret"
        )));
    }
    s.write_all(&secret.proof(ACCEPT_CONTEXT, &theirs))
        .map_err(io_err("handshake"))?;
    s.set_read_timeout(None)
        .map_err(io_err("clearing a timeout"))?;
    Ok(uid)
}
