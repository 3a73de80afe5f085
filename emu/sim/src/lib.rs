//! `emu-sim`: the in-process softverbs backend.
//!
//! Any number of emulated devices live in one process on an in-memory fabric: no sockets, no
//! threads. Start with [`SimProvider::builder`], list its devices with
//! [`verbs_api::Provider::devices`] and open one; everything else is the `verbs_api` object model.
//!
//! What is emulated today: the whole control path of an RDMA device (PDs, MRs owned by the
//! emulator, backed by a shared file mapping or registered from caller memory, CQs with
//! completion channels, SRQs, RC QPs with the full state machine, posting rules and flush).
//! Rejected: UC/UD QPs (`NotSupported`), memory windows, alternate paths.
//!
//! The only `unsafe` code is in the module that touches MR memory (`region`).
#![deny(unsafe_code)]

mod channel;
mod fabric;
mod provider;
mod region;

pub use provider::{
    SimBuilder, SimChannel, SimContext, SimCq, SimDevice, SimMr, SimPd, SimProvider, SimQp, SimSrq,
};
