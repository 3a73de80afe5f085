//! `softverbs-cli`: the command-line tool of the softverbs RDMA verbs emulator. Backend
//! selection (`open_from_env`, the registry) is the `softverbs` facade crate's, re-exported here.
//!
//! The binary (`softverbs`) is documented in the README: `demo`, `capture`, `run` (the
//! multi-process fault-injection harness, [`run`]), `exec` and `env` (unmodified libibverbs
//! programs on the drop-in library, [`exec`]).
// `deny`, not `forbid`: the harness's one `kill(2)` call (SIGSTOP/SIGCONT, `run::signal`)
// is allowed locally; everything else stays safe code.
#![deny(unsafe_code)]

pub use softverbs::{
    SIM_DEVICES_ENV, UDP_ADDRS_ENV, open_from_env, registry, sim_provider, udp_provider,
};

pub mod capture;
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod demo;
pub mod exec;
pub mod interop;
pub mod ladder;
pub mod perf;
pub mod recovery;
pub mod run;
