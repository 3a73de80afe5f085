//! `verbs-api`: the RDMA verbs API of softverbs, shared by every backend.
//!
//! An application written against these traits runs unchanged on the emulator (in-process or
//! over UDP) or on a real NIC through libibverbs, chosen by configuration. The object model is
//! rdma-core's: a device is opened into a [`Context`], which allocates protection domains,
//! memory regions, completion queues (optionally with a completion channel), shared receive
//! queues and queue pairs. Names and numbers (states, status codes, opcodes, flags, masks)
//! are rdma-core's, so RDMA users find what they know.
//!
//! This crate is only the contract: plain data types and traits, no IO, no `unsafe` code
//! (`unsafe_code` is denied; the one exception declares [`Context::reg_mr_raw`], which is `unsafe` to call).
//!
//! * [`traits`]: `Provider` → `Device` → `Context` → `Pd`, `Mr`, `Cq`, `Channel`, `Srq`, `Qp`,
//!   `Ah`.
//! * [`attr`], [`types`], [`wr`], [`wc`], [`event`]: the values that cross the API.
//! * [`error`]: [`Error`] for the control path, [`PostError`] for posting.
//! * [`connect`]: the RESET → RTS walk for an RC QP.
//! * [`dynamic`]: run-time backend selection (`SOFTVERBS_PROVIDER`).
//!
//! Supported by the emulator today: RC QPs with every send opcode listed in [`SendOp`], SRQ, and
//! UD QPs (SEND and SEND_WITH_IMM through an [`AddressHandle`], see [`ud`]).
//! Memory windows of type 1 and 2 ([`MemoryWindow`], [`SendOp::BindMw`], [`SendOp::LocalInv`],
//! [`SendOp::SendWithInv`]).
//! Rejected with `NotSupported`: UC QPs, alternate paths.
#![deny(unsafe_code)]

pub mod attr;
pub mod connect;
pub mod dynamic;
pub mod error;
pub mod event;
pub mod traits;
pub mod types;
pub mod ud;
pub mod wc;
pub mod wr;

pub use attr::{
    AhAttr, AtomicCap, DeviceAttr, PortAttr, QpAttr, QpCap, QpInitAttr, Recovery, SrqAttr,
};
pub use connect::{RcConnectOptions, connect_rc};
pub use error::{Error, ErrorKind, PostError, Result};
pub use event::{AsyncEvent, AsyncEventKind, EventElement};
pub use traits::{
    AddressHandle, CompletionChannel, CompletionQueue, Context, Device, MemoryRegion, MemoryWindow,
    ProtectionDomain, Provider, QueuePair, SharedReceiveQueue,
};
pub use types::{
    AccessFlags, DeviceCapFlags, Endpoint, Gid, LinkLayer, MAX_24BIT, Mtu, MwType, PortState,
    QpAttrMask, QpState, QpType, ROCE_V2_UDP_PORT, SendFlags, WcFlags, inc_rkey,
};
pub use ud::{GRH_LEN, init_ah_from_wc};
pub use wc::{WcOpcode, WcStatus, WorkCompletion};
pub use wr::{MwBind, QKEY_CONTROLLED, RecvWr, SendOp, SendWr, Sge, UdDest};
