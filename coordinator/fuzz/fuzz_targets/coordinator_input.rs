//! Fuzzes the coordinator state machine ([`fuzzing::coordinator_input`])
//! with arbitrary bytes from a member, an authenticated peer and a stranger,
//! after a launch of two: it must refuse or act, never panic.
#![no_main]

use ductile_coordinator::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fuzzing::coordinator_input(data));
