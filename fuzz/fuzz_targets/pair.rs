//! Fuzz target: two RC QPs exchanging arbitrary operations under an input-driven schedule of
//! losses, duplicates and reordering, in virtual time. The body lives in
//! `softverbs_fuzz_targets::pair`, shared with the replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softverbs_fuzz_targets::pair(data));
