//! Fuzz target: arbitrary bytes as the plan file of `softverbs run --faults` (process faults,
//! harness settings and network rules). The body lives in `softverbs_fuzz_targets::run_plan`,
//! shared with the replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softverbs_fuzz_targets::run_plan(data));
