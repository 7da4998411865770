//! Fuzzes the frame codec: arbitrary bytes, whole or streamed in chunks, must
//! decode or fail with a `FrameError`, never panic or allocate without bound.
#![no_main]

use ductile_coordinator::proto::{decode, ClientMsg, FrameReader, ServerMsg};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode::<ClientMsg>(data);
    let _ = decode::<ServerMsg>(data);
    // The first byte picks a chunk size, so split frames are covered too.
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut reader = FrameReader::new();
    for piece in rest.chunks(chunk) {
        reader.push(piece);
        while let Ok(Some(_)) = reader.next_msg::<ClientMsg>() {}
    }
});
