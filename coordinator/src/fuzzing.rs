//! Fuzz targets and a fuzzing driver that works on the stable toolchain.
//!
//! Each target takes arbitrary bytes and must return without panicking or
//! allocating without bound; what it decodes is thrown away. The same
//! functions serve two drivers:
//!
//! * cargo-fuzz (libFuzzer, nightly): `coordinator/fuzz/fuzz_targets/*.rs`
//!   call them;
//! * [`drive`], a seeded mutation driver (bit flips, byte changes, inserts,
//!   deletions, splices of two inputs, boundary integers, repeated slices)
//!   over a corpus of seed files: `e2e/tests/fuzz.rs` runs it for every
//!   target on stable, a few seconds each in CI, longer on demand.
//!
//! The corpus lives in `coordinator/fuzz/corpus/<target>/`; both drivers
//! read it.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::control::{ControlReply, ControlRequest};
use crate::core::{Action, Config, ConnId, Coordinator};
use crate::proto::{
    decode, encode, ClientMsg, FrameReader, Registration, Role, ServerMsg, PROTOCOL_VERSION,
};
use crate::secret::{Secret, AUTH_CONTEXT};

/// The coordinator's frame codec: `data` decoded whole as either side's
/// message, then streamed through a [`FrameReader`] in chunks whose size the
/// first byte picks (split frames, several frames in one read).
pub fn frame_decoder(data: &[u8]) {
    let _ = decode::<ClientMsg>(data);
    let _ = decode::<ServerMsg>(data);
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut reader = FrameReader::new();
    for piece in rest.chunks(chunk) {
        reader.push(piece);
        while let Ok(Some(_)) = reader.next_msg::<ClientMsg>() {}
    }
}

/// The control endpoint's decoders: `data` as a tool's request and as node
/// 0's reply, whole and streamed.
pub fn control_request(data: &[u8]) {
    let _ = decode::<ControlRequest>(data);
    let _ = decode::<ControlReply>(data);
    let mut reader = FrameReader::new();
    for piece in data.chunks(7) {
        reader.push(piece);
        while let Ok(Some(_)) = reader.next_msg::<ControlRequest>() {}
    }
}

fn authenticate(core: &mut Coordinator, secret: &Secret, conn: ConnId, now: Instant) {
    let actions = core.on_connect(conn, now);
    let nonce = actions.iter().find_map(|a| match a {
        Action::Send(_, ServerMsg::Challenge { nonce, .. }) => Some(*nonce),
        _ => None,
    });
    if let Some(nonce) = nonce {
        let proof = secret.proof(AUTH_CONTEXT, &nonce);
        let hello = ClientMsg::Hello {
            protocol: PROTOCOL_VERSION,
            proof,
        };
        core.on_frame(conn, &encode(&hello), now);
    }
}

/// The coordinator's state machine after a launch of two: half of `data`
/// arrives from a member, half from another authenticated connection, then
/// the clock runs. It must refuse or act, never panic.
pub fn coordinator_input(data: &[u8]) {
    let secret = Secret::from_bytes([9; 32]);
    let mut core = Coordinator::new(Config::launch(secret.clone(), 2), StdRng::seed_from_u64(1));
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
    let stranger = ConnId(3);
    core.on_connect(stranger, now);
    let (a, b) = data.split_at(data.len() / 2);
    core.on_frame(ConnId(0), a, now);
    core.on_frame(attacker, b, now);
    core.on_frame(stranger, data, now);
    let _ = core.on_tick(now + Duration::from_secs(3600));
}

/// What one [`drive`] run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Driven {
    /// Inputs run (seeds included).
    pub inputs: u64,
    /// Bytes fed in all.
    pub bytes: u64,
}

/// Longest input the driver makes.
pub const MAX_INPUT: usize = 64 * 1024;

/// Runs `target` on every seed, then on mutations of them until `budget`
/// has passed or `max_inputs` inputs ran, whichever comes first; the
/// mutations follow `seed`, so a run is reproducible by its seed (and the
/// count it reached). `current` is told each input before it runs, so a
/// caller can save the one that panicked (a panic hook).
pub fn drive(
    target: fn(&[u8]),
    seeds: &[Vec<u8>],
    seed: u64,
    budget: Duration,
    max_inputs: u64,
    mut current: impl FnMut(&[u8]),
) -> Driven {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut done = Driven::default();
    let mut run = |input: &[u8], done: &mut Driven| {
        current(input);
        target(input);
        done.inputs += 1;
        done.bytes += input.len() as u64;
    };
    for s in seeds {
        run(s, &mut done);
    }
    let empty = vec![Vec::new()];
    let pool = if seeds.is_empty() { &empty } else { seeds };
    while done.inputs < max_inputs && started.elapsed() < budget {
        let mut input = pool[rng.gen_range(0..pool.len())].clone();
        let rounds = 1 + rng.gen_range(0..4);
        for _ in 0..rounds {
            mutate(&mut input, pool, &mut rng);
        }
        run(&input, &mut done);
    }
    done
}

/// One random change to `input`.
pub fn mutate(input: &mut Vec<u8>, pool: &[Vec<u8>], rng: &mut StdRng) {
    const INTERESTING: &[u64] = &[
        0,
        1,
        0x7f,
        0x80,
        0xff,
        0x100,
        0x7fff,
        0xffff,
        0x10_0000,
        0x10_0001,
        0x7fff_ffff,
        0xffff_ffff,
        u64::MAX,
    ];
    let len = input.len();
    match rng.gen_range(0..9) {
        // Flip a bit.
        0 if len > 0 => {
            let i = rng.gen_range(0..len);
            input[i] ^= 1 << rng.gen_range(0..8);
        }
        // Set a byte.
        1 if len > 0 => {
            let i = rng.gen_range(0..len);
            input[i] = rng.gen();
        }
        // Insert random bytes.
        2 => {
            let at = rng.gen_range(0..=len);
            let n = rng.gen_range(1..=16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            input.splice(at..at, bytes);
        }
        // Delete a range.
        3 if len > 0 => {
            let at = rng.gen_range(0..len);
            let n = rng.gen_range(1..=(len - at).min(32));
            input.drain(at..at + n);
        }
        // Overwrite with a boundary integer (LE, 1, 2, 4 or 8 bytes).
        4 if len > 0 => {
            let v = INTERESTING[rng.gen_range(0..INTERESTING.len())].to_le_bytes();
            let width = [1, 2, 4, 8][rng.gen_range(0..4)];
            let at = rng.gen_range(0..len);
            for (k, b) in v.iter().take(width).enumerate() {
                if let Some(x) = input.get_mut(at + k) {
                    *x = *b;
                }
            }
        }
        // Splice: a prefix of this input, a suffix of another.
        5 => {
            let other = &pool[rng.gen_range(0..pool.len())];
            let cut = rng.gen_range(0..=len);
            let from = rng.gen_range(0..=other.len());
            input.truncate(cut);
            input.extend_from_slice(&other[from..]);
        }
        // Append another input whole (two frames in one read).
        6 => {
            let other = &pool[rng.gen_range(0..pool.len())];
            input.extend_from_slice(other);
        }
        // Repeat a slice (long runs, lengths that overflow).
        7 if len > 0 => {
            let at = rng.gen_range(0..len);
            let n = rng.gen_range(1..=(len - at).min(8));
            let piece = input[at..at + n].to_vec();
            for _ in 0..rng.gen_range(1..64) {
                input.extend_from_slice(&piece);
            }
        }
        // Truncate.
        _ => {
            let keep = rng.gen_range(0..=len);
            input.truncate(keep);
        }
    }
    input.truncate(MAX_INPUT);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_is_reproducible_by_its_seed_and_stops_at_its_bounds() {
        let seeds = vec![encode(&ClientMsg::QueryView), b"GET /".to_vec()];
        let record = |seed| {
            let mut seen = Vec::new();
            let d = drive(|_| {}, &seeds, seed, Duration::from_secs(60), 200, |i| {
                seen.push(i.to_vec())
            });
            (d, seen)
        };
        let (a, seen_a) = record(7);
        let (b, seen_b) = record(7);
        let (_, seen_c) = record(8);
        assert_eq!(a.inputs, 200);
        assert_eq!((a, &seen_a), (b, &seen_b));
        assert_ne!(seen_a, seen_c, "another seed, other inputs");
        assert_eq!(&seen_a[..2], &seeds[..], "the seeds run first");
        assert!(seen_a.iter().all(|i| i.len() <= MAX_INPUT));
        let mutated = seen_a[2..].iter().filter(|i| !seeds.contains(i)).count();
        assert!(mutated > 150, "most inputs are new: {mutated}");
    }

    #[test]
    fn every_target_survives_a_short_run() {
        let seeds = vec![
            encode(&ClientMsg::QueryView),
            encode(&ControlRequest::Status),
        ];
        for target in [frame_decoder, control_request, coordinator_input] {
            let d = drive(target, &seeds, 1, Duration::from_secs(10), 300, |_| {});
            assert_eq!(d.inputs, 300);
        }
    }
}
