//! Fuzzes the coordinator's frame codec ([`fuzzing::frame_decoder`]):
//! arbitrary bytes, whole or streamed in chunks, must decode or fail with a
//! `FrameError`, never panic or allocate without bound.
#![no_main]

use ductile_coordinator::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fuzzing::frame_decoder(data));
