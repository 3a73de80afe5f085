//! Fuzz target: arbitrary bytes as a fault plan (`emu_fault::FaultPlan::from_toml`) and an
//! `Injector` run. The body lives in `softverbs_fuzz_targets::fault_plan`, shared with the
//! replay test.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softverbs_fuzz_targets::fault_plan(data));
