//! Fuzz target: arbitrary verbs calls against the in-process backend (`emu_sim::SimProvider`)
//! compared with a reference model of the QP state machine. The body lives in
//! `softverbs_fuzz_targets::verbs_ops`, shared with the replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softverbs_fuzz_targets::verbs_ops(data));
