//! Fuzzing on the stable toolchain (issue 15): every fuzz target of the
//! project run by a seeded mutation driver
//! ([`ductile_coordinator::fuzzing::drive`]) from the corpus in
//! `coordinator/fuzz/corpus/<target>/`, for a bounded time.
//!
//! * `frame_decoder`, `coordinator_input`: the coordinator's frame codec and
//!   state machine (the same functions as the cargo-fuzz targets);
//! * `control_request`: the control endpoint's request and reply decoders;
//! * `runtime_frame`: the runtime's decoder of frames from other nodes and
//!   of the runtime messages they carry ([`ductile::decode_frame_rank`]),
//!   as node 1 of a 3-node view.
//!
//! Each runs `DUCTILE_FUZZ_SECONDS` (default 3) from seed
//! `DUCTILE_FUZZ_SEED` (default fixed per target, so CI is reproducible).
//! An input that panics is written to `target/fuzz-crashes/` before the
//! test fails; add it to the corpus once fixed. A longer run:
//! `DUCTILE_FUZZ_SECONDS=600 DUCTILE_FUZZ_SEED=$RANDOM cargo test --release -p ductile-e2e --test fuzz`.
//! `cargo test --release -p ductile-e2e --test fuzz -- --ignored write_corpus`
//! writes the generated seeds again (from the real encoders).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use ductile::topo::Topology;
use ductile::transport::{kind, Tag};
use ductile_coordinator::control::{ControlReply, ControlRequest};
use ductile_coordinator::fuzzing;
use ductile_coordinator::proto::{
    encode, ClientMsg, ErrorCode, Member, Registration, Role, ServerMsg, View, PROTOCOL_VERSION,
};

/// The runtime's frame decoder, as node 1 of a 3-node view of epoch 7 (two
/// PEs each). The first byte picks the tag: even, a well-formed envelope
/// tag from the node the second byte names; odd, the next 8 bytes raw.
fn runtime_frame(data: &[u8]) {
    let Some((tag, frame)) = runtime_input(data) else {
        return;
    };
    if let Ok(rank) = ductile::decode_frame_rank(&node_1(), tag, frame.to_vec()) {
        assert!(rank < 2, "node 1 hosts two PEs, got local rank {rank}");
    }
}

/// Node 1 of a 3-node view of epoch 7, two PEs each.
fn node_1() -> Topology {
    let members = (0..3)
        .map(|i| Member {
            node: i,
            uid: u64::from(i) + 1,
            address: vec![],
            pes: 2,
            host: "h".into(),
            pid: 0,
        })
        .collect();
    Topology::new(&View { epoch: 7, members }, 1)
}

/// The tag and frame a `runtime_frame` input stands for.
fn runtime_input(data: &[u8]) -> Option<(Tag, &[u8])> {
    match data {
        [even, src, rest @ ..] if even % 2 == 0 => {
            Some((Tag::new(u32::from(*src) % 3, 7, kind::ENVELOPE), rest))
        }
        [_, rest @ ..] if rest.len() >= 8 => {
            let (raw, frame) = rest.split_at(8);
            let raw: [u8; 8] = raw.try_into().unwrap_or([0; 8]);
            Some((Tag(u64::from_le_bytes(raw)), frame))
        }
        _ => None,
    }
}

/// The runtime's seeds are frames it accepts (all but the one of another
/// kind): a seed the decoder refuses would start the fuzzer far from
/// every path past the footer and the header.
#[test]
fn the_runtime_frame_seeds_are_frames_the_runtime_accepts() {
    let seeds = corpus("runtime_frame");
    let accepted = seeds
        .iter()
        .filter_map(|s| runtime_input(s))
        .filter(|(tag, frame)| ductile::decode_frame_rank(&node_1(), *tag, frame.to_vec()).is_ok())
        .count();
    assert_eq!(accepted, seeds.len() - 1, "of {} seeds", seeds.len());
}

type Target = (&'static str, fn(&[u8]), u64);

const TARGETS: &[Target] = &[
    ("frame_decoder", fuzzing::frame_decoder, 0xf7a3e),
    ("coordinator_input", fuzzing::coordinator_input, 0xc00d),
    ("control_request", fuzzing::control_request, 0xc7e1),
    ("runtime_frame", runtime_frame, 0x7f7a),
];

fn corpus_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../coordinator/fuzz/corpus")
        .join(name)
}

fn corpus(name: &str) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir(name))
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .collect()
}

/// The input running now, for the panic hook.
static CURRENT: Mutex<Vec<u8>> = Mutex::new(Vec::new());

fn fuzz(name: &str) {
    let &(_, target, default_seed) = TARGETS
        .iter()
        .find(|t| t.0 == name)
        .expect("a known target");
    let seconds: f64 = std::env::var("DUCTILE_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let seed: u64 = std::env::var("DUCTILE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_seed);
    let seeds = corpus(name);
    assert!(
        !seeds.is_empty(),
        "no corpus in {} (write it: -- --ignored write_corpus)",
        corpus_dir(name).display()
    );
    let crashes = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz-crashes");
    let crash_file = crashes.join(format!("{name}-seed{seed}.bin"));
    let hook_file = crash_file.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if let Ok(input) = CURRENT.lock() {
            let _ = std::fs::create_dir_all(hook_file.parent().unwrap_or(&hook_file));
            let _ = std::fs::write(&hook_file, &*input);
            eprintln!("fuzz input that panicked written to {}", hook_file.display());
        }
        previous(info);
    }));
    let driven = fuzzing::drive(
        target,
        &seeds,
        seed,
        Duration::from_secs_f64(seconds),
        u64::MAX,
        |input| {
            if let Ok(mut c) = CURRENT.lock() {
                c.clear();
                c.extend_from_slice(input);
            }
        },
    );
    println!(
        "{name}: {} inputs ({} bytes) in {seconds}s from {} seeds, seed {seed}",
        driven.inputs,
        driven.bytes,
        seeds.len()
    );
    assert!(driven.inputs > seeds.len() as u64, "no mutation ran");
}

// One test per target, so a failure names its target. They may run in
// parallel and share the panic hook's slot: the file written names the
// input last seen by any of them, which the failing test's seed reproduces.

#[test]
fn fuzz_frame_decoder() {
    fuzz("frame_decoder");
}

#[test]
fn fuzz_coordinator_input() {
    fuzz("coordinator_input");
}

#[test]
fn fuzz_control_request() {
    fuzz("control_request");
}

#[test]
fn fuzz_runtime_frame() {
    fuzz("runtime_frame");
}

fn registration(role: Role) -> Registration {
    Registration {
        role,
        address: b"127.0.0.1:4000".to_vec(),
        pes: 2,
        host: "h".into(),
        pid: 42,
        fingerprint: 1,
    }
}

/// Writes the generated part of the corpus (valid messages of every kind
/// from the real encoders, and a few classic bad frames). Not a check: it
/// rewrites the committed corpus, so it runs only when asked
/// (`cargo test --release -p ductile-e2e --test fuzz -- --ignored write_corpus`).
#[test]
#[ignore = "rewrites the committed corpus: run with --ignored write_corpus"]
fn write_corpus() {
    let view = View {
        epoch: 3,
        members: vec![Member {
            node: 0,
            uid: 1,
            address: b"a".to_vec(),
            pes: 1,
            host: "h".into(),
            pid: 1,
        }],
    };
    let client: Vec<Vec<u8>> = vec![
        encode(&ClientMsg::Hello {
            protocol: PROTOCOL_VERSION,
            proof: [7; 32],
        }),
        encode(&ClientMsg::Register(registration(Role::Launch { index: 1 }))),
        encode(&ClientMsg::Register(registration(Role::Newcomer))),
        encode(&ClientMsg::QueryPending { epoch: 1 }),
        encode(&ClientMsg::Commit {
            epoch: 1,
            remove: vec![1],
            admit: 1,
        }),
        encode(&ClientMsg::ShutdownReady { epoch: 1, code: 0 }),
        encode(&ClientMsg::Restore {
            view: view.clone(),
            fingerprint: 1,
        }),
        encode(&ClientMsg::Reattach { epoch: 1, uid: 2 }),
        encode(&ClientMsg::QueryView),
        encode(&ClientMsg::QueryAdmissions),
    ];
    let server: Vec<Vec<u8>> = vec![
        encode(&ServerMsg::Welcome),
        encode(&ServerMsg::Committed { view: view.clone() }),
        encode(&ServerMsg::Error {
            code: ErrorCode::StaleEpoch,
            message: "stale".into(),
        }),
    ];
    let bad: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        b"DUCT\x02\x00\x00\x00\xff\xff\xff\xff".to_vec(),
        b"DUCT\x09\x00\x00\x00\x01\x00\x00\x00\x00".to_vec(),
    ];
    let control: Vec<Vec<u8>> = vec![
        encode(&ControlRequest::Hello { proof: [3; 32] }),
        encode(&ControlRequest::Status),
        encode(&ControlReply::Challenge { nonce: [1; 32] }),
        encode(&ControlReply::Welcome),
    ];
    // Tag selector, source node, then a WireHeader (dest PE 2, priority 0,
    // counted, Dest::Member { coll: 5 }) and a body, with the footer of a
    // frame without large strings (its length, no entries); a raw-tag
    // variant; and frames from the real encoder, large strings out of line.
    let footed = |head: Vec<u8>, frame: Vec<u8>| {
        let len = (frame.len() + 9) as u64;
        [head, frame, len.to_le_bytes().to_vec(), vec![0]].concat()
    };
    let runtime: Vec<Vec<u8>> = vec![
        footed(vec![0, 0], vec![2, 0, 1, 1, 5, 0xaa, 0xbb]),
        footed(vec![0, 2], vec![3, 1, 0, 0, 9, 42, 4, 1, 2, 3, 4]),
        footed(
            [vec![1], Tag::new(0, 7, kind::ENVELOPE).0.to_le_bytes().to_vec()].concat(),
            vec![2, 0, 1, 1, 5],
        ),
        [vec![1], Tag::new(2, 6, kind::CONTROL).0.to_le_bytes().to_vec(), vec![0; 4]].concat(),
        [vec![0, 0], ductile::buddy_copy_frame(2, 24)].concat(),
        [vec![0, 0], ductile::buddy_copy_frame(3, 4096)].concat(),
        [vec![0, 1], ductile::migrate_frame(2, 5000)].concat(),
    ];
    let write = |name: &str, inputs: &[Vec<u8>]| {
        let dir = corpus_dir(name);
        std::fs::create_dir_all(&dir).expect("corpus dir");
        for (i, input) in inputs.iter().enumerate() {
            std::fs::write(dir.join(format!("gen-{i:02}")), input).expect("corpus file");
        }
    };
    let frames: Vec<Vec<u8>> = client.iter().chain(&server).chain(&bad).cloned().collect();
    // frame_decoder's first byte is its chunk size.
    let chunked: Vec<Vec<u8>> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| [vec![[1u8, 3, 12, 255][i % 4]], f.clone()].concat())
        .collect();
    write("frame_decoder", &chunked);
    write("coordinator_input", &[client.clone(), bad.clone()].concat());
    write("control_request", &[control, bad].concat());
    write("runtime_frame", &runtime);
}
