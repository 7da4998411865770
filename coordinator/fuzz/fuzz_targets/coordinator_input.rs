//! Fuzzes the coordinator state machine with arbitrary bytes from an
//! authenticated connection, after a launch of two: it must refuse or act,
//! never panic.
#![no_main]

use std::time::Instant;

use ductile_coordinator::core::{Action, Config, ConnId, Coordinator};
use ductile_coordinator::proto::{
    encode, ClientMsg, Registration, Role, ServerMsg, PROTOCOL_VERSION,
};
use ductile_coordinator::secret::{Secret, AUTH_CONTEXT};
use libfuzzer_sys::fuzz_target;
use rand::SeedableRng;

fn authenticate(core: &mut Coordinator, secret: &Secret, conn: ConnId, now: Instant) {
    let actions = core.on_connect(conn, now);
    let nonce = actions.iter().find_map(|a| match a {
        Action::Send(_, ServerMsg::Challenge { nonce, .. }) => Some(*nonce),
        _ => None,
    });
    if let Some(nonce) = nonce {
        let proof = secret.proof(AUTH_CONTEXT, &nonce);
        core.on_frame(
            conn,
            &encode(&ClientMsg::Hello {
                protocol: PROTOCOL_VERSION,
                proof,
            }),
            now,
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let secret = Secret::from_bytes([9; 32]);
    let mut core = Coordinator::new(
        Config::launch(secret.clone(), 2),
        rand::rngs::StdRng::seed_from_u64(1),
    );
    let now = Instant::now();
    for (i, conn) in [ConnId(0), ConnId(1)].into_iter().enumerate() {
        authenticate(&mut core, &secret, conn, now);
        let reg = Registration {
            role: Role::Launch { index: i as u32 },
            address: vec![],
            pes: 1,
            host: String::new(),
            pid: 0,
            fingerprint: 1,
        };
        core.on_frame(conn, &encode(&ClientMsg::Register(reg)), now);
    }
    let attacker = ConnId(2);
    authenticate(&mut core, &secret, attacker, now);
    // Half the input from a member, half from a stranger.
    let (a, b) = data.split_at(data.len() / 2);
    core.on_frame(ConnId(0), a, now);
    core.on_frame(attacker, b, now);
    let _ = core.on_tick(now);
});
