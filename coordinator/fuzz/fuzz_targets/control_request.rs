//! Fuzzes the control endpoint's request and reply decoders
//! ([`fuzzing::control_request`]).
#![no_main]

use ductile_coordinator::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fuzzing::control_request(data));
