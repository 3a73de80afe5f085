//! `emu-proto`: the sans-IO software HCA of softverbs.
//!
//! This crate is deterministic: it has no sockets, threads, system clock or unseeded RNG.
//! Packets, verbs calls and `now` go in; packets, completions and timer deadlines come out.
//! Most users want a driver around it: `emu-sim` (in-process, virtual time) or the UDP driver.
//!
//! It is not a verbs provider by itself: drivers wrap it to implement `verbs_api`.
#![forbid(unsafe_code)]

pub mod config;
mod cq;
mod events;
pub mod hca;
mod ids;
pub mod memory;
mod mw;
mod qp;
mod rc;
mod srq;
pub mod stats;
mod table;
pub mod time;
mod timers;
pub mod trace;
mod uc;
mod ud;
pub mod wire;

pub use config::{HcaConfig, Limits};
pub use events::EventRouter;
pub use hca::{
    FIRST_QPN, GID_TBL_LEN, GSI_QKEY, GSI_QPN, Hca, MAX_PACKET_LEN, Notification, Transmit,
};
pub use ids::{AhId, ChannelId, CqId, MrInfo, PdId, SrqId};
pub use memory::{AtomicOp, Memory, MemoryFault, NoMemory};
pub use rc::PacketClass;
pub use stats::{RxDropCause, RxDrops, Stats};
pub use time::Instant;
