//! Fuzz target: hostile ACKs, NAKs, READ responses and atomic ACKs against an RC requester
//! with outstanding work (`emu_proto::Hca`'s completer). The body lives in
//! `softverbs_fuzz_targets::completer`, shared with the replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softverbs_fuzz_targets::completer(data));
