//! The InfiniBand connection manager (IBTA vol. 1 ch. 12) as a sans-IO state machine.
//!
//! What it is: the CM protocol of one port — REQ, MRA, REJ, REP, RTU, DREQ, DREP management
//! datagrams (MADs, class `CM` version 2) exchanged with the CM of a peer's QP1, their
//! transaction IDs, retries and timeouts, and the per-connection state machine (idle → REQ
//! sent → REP received → established; the passive side; disconnect and timewait). It takes
//! MADs, calls and `now`, and returns MADs to send, events and a deadline, like the RC engine
//! (`emu_proto::Hca`).
//!
//! What it is not: it owns no socket, thread, clock or QP. Its user (the `librdmacm.so.1`
//! drop-in) sends and receives the MADs on the device's GSI QP (QP1, Q_Key 0x8001_0000), moves
//! the QPs through INIT/RTR/RTS with what the events carry, and maps rdma_cm calls onto this
//! API.
//!
//! [`connector`] drives one CM for a fixed set of nodes with one RC QP per peer (the harness's
//! `softverbs run --cm rdma`).
//!
//! API contract shared by the CM and its user (keep it; extend it only additively):
//! [`Cm::new`], [`Cm::listen`], [`Cm::unlisten`], [`Cm::connect`], [`Cm::accept`],
//! [`Cm::establish`], [`Cm::reject`], [`Cm::disconnect`], [`Cm::destroy`], [`Cm::handle_mad`],
//! [`Cm::poll_transmit`], [`Cm::poll_event`], [`Cm::poll_timeout`], [`Cm::handle_timeout`].

mod api;
pub mod connector;
mod machine;
pub mod wire;

pub use api::*;
pub use machine::{ib_time, reason};
