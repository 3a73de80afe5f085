//! Fuzz target: arbitrary bytes through the RoCEv2 codec (`emu_proto::wire`).
//! The body lives in `softverbs_fuzz_targets::wire_decode`, shared with the replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softverbs_fuzz_targets::wire_decode(data));
