//! Fuzz target: arbitrary MADs into two connection managers mid-handshake (`emu_cm::Cm`).
//! The body lives in `softverbs_fuzz_targets::cm_mad`, shared with the replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softverbs_fuzz_targets::cm_mad(data));
