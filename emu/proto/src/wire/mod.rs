//! RoCEv2 wire codec (rc-transport.md §1, §2).
//!
//! What it is: sans-IO, allocation-free parsing and emission of the InfiniBand transport headers
//! that RoCEv2 carries in a UDP payload (BTH, extension headers, payload, pad, ICRC), plus PSN
//! arithmetic and the RC opcode table.
//!
//! What it is not: it does not open sockets, build Ethernet/IP frames for sending, or implement
//! any transport state machine; UC/UD/CNP opcodes are recognised only as [`Opcode::Unknown`].

mod opcode;
mod psn;

pub use opcode::{ALL_RC, ExtHeaders, Opcode, Position};
pub use psn::Psn;

/// Base transport header length in bytes (rc-transport.md §1.2).
pub const BTH_LEN: usize = 12;
/// RETH length in bytes (rc-transport.md §1.4).
pub const RETH_LEN: usize = 16;
/// AETH length in bytes (rc-transport.md §1.4).
pub const AETH_LEN: usize = 4;
/// AtomicETH length in bytes (rc-transport.md §1.4).
pub const ATOMIC_ETH_LEN: usize = 28;
/// AtomicAckETH length in bytes (rc-transport.md §1.4).
pub const ATOMIC_ACK_ETH_LEN: usize = 8;
/// ImmDt length in bytes (rc-transport.md §1.4).
pub const IMMDT_LEN: usize = 4;
/// IETH length in bytes (rc-transport.md §1.4).
pub const IETH_LEN: usize = 4;
