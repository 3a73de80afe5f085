//! Fuzz target: hostile request packets against an RC QP in RTS (`emu_proto::Hca`'s responder).
//! The body lives in `softverbs_fuzz_targets::responder`, shared with the replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softverbs_fuzz_targets::responder(data));
