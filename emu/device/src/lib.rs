//! `emu-device`: one emulated RDMA device as every softverbs emulator backend shares it — the
//! device state around an [`emu_proto::Hca`] and the `verbs_api` handles over it, written once.
//!
//! A backend (the in-process `emu-sim`, the UDP `emu-udp`) provides a [`Port`]: its device
//! type, which says how a call reaches the [`DeviceState`] (which lock, which clock) and how the
//! device is driven while the application posts, polls or blocks (pump an in-memory fabric,
//! run a socket pass, wake a progress thread). Everything else is here:
//!
//! * [`DeviceState`]: the HCA, its MR memory ([`DeviceMemory`] over [`mr_region::Region`]), its
//!   completion channels ([`ChannelShared`]) and the routing of async events to contexts;
//! * the handles [`Context`], [`Pd`], [`Mr`], [`Channel`], [`Cq`], [`Srq`], [`Qp`], [`Mw`], which
//!   implement the `verbs_api` traits for every port. Backends name them with type aliases
//!   (`SimQp = Qp<SimDevice>`); a context derefs to its device, where backend extras live.
//!
//! Not here: packets. Where datagrams go (fabric, socket), faults, capture and time are the
//! backend's; the handles never see a packet.
//!
//! The only `unsafe` is `reg_mr_raw`, whose contract passes straight to
//! [`mr_region::Region::caller`].
#![deny(unsafe_code)]

mod channel;
mod context;
mod handles;
mod memory;
mod port;
mod state;
#[cfg(test)]
mod tests;

pub use channel::ChannelShared;
pub use context::Context;
pub use handles::{Ah, Channel, Cq, Mr, Mw, Pd, Qp, Srq};
pub use memory::DeviceMemory;
pub use mr_region::{OutOfBounds, Region};
pub use port::{Idle, Port, Waiting};
pub use state::{DeviceState, MrAddresses};
