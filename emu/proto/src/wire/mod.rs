//! RoCEv2 wire codec (rc-transport.md §1, §2).
//!
//! What it is: sans-IO, allocation-free parsing and emission of the InfiniBand transport headers
//! that RoCEv2 carries in a UDP payload, in the style of smoltcp's `wire` module:
//!
//! * a *view* per header ([`Bth`], [`Reth`], [`Aeth`], [`AtomicEth`], [`AtomicAckEth`],
//!   [`ImmDt`], [`Ieth`], [`Deth`]) wraps any `T: AsRef<[u8]>` and reads (or, for
//!   `AsMut<[u8]>`, writes) fields in place. `new_checked` verifies the length; `new_unchecked`
//!   does not, and its accessors panic on a short buffer, exactly as slice indexing does;
//! * a *repr* per header (`BthRepr`, ...) is the parsed, owned form with `parse(&view)`,
//!   `emit(&self, &mut view)` and `buffer_len()`;
//! * [`Packet`] / [`PacketRepr`] handle a whole UDP payload: BTH, the extension headers the
//!   opcode table ([`Opcode::ext_headers`]) prescribes, payload (borrowed, zero-copy), pad and
//!   ICRC ([`icrc`]);
//! * [`Psn`] (24-bit serial arithmetic), [`Opcode`] and the AETH [`Syndrome`];
//! * the selective ACK of softverbs' selective-repeat extension ([`SackPacketRepr`], a
//!   manufacturer-specific opcode only QPs that enabled it send or accept).
//!
//! Parsing is total: every byte string yields `Ok` or a [`WireError`]; nothing on a parse path
//! panics, allocates or indexes unchecked.
//!
//! What it is not: it opens no sockets and implements no transport state machine. UC, UD, CNP
//! and the IBTA 1.5 FLUSH/ATOMIC_WRITE opcodes are recognised only as [`Opcode::Unknown`] (the
//! DETH view exists for later UD support). IP and UDP headers are only *emitted* ([`ip`]), for
//! the ICRC pseudo-header and for capture framing; they are never parsed here.

mod aeth;
mod atomic_ack_eth;
mod atomic_eth;
mod bth;
mod deth;
pub mod icrc;
mod ieth;
mod immdt;
pub mod ip;
mod opcode;
mod packet;
mod psn;
mod reth;
mod sack;

pub use aeth::{Aeth, AethRepr, Credits, NakCode, RnrTimer, Syndrome};
pub use atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr};
pub use atomic_eth::{AtomicEth, AtomicEthRepr};
pub use bth::{Bth, BthRepr};
pub use deth::{Deth, DethRepr};
pub use icrc::{ICRC_LEN, check_icrc, compute_icrc, fill_icrc, ipv4_ident_basis, solve_ipv4_ident};
pub use ieth::{Ieth, IethRepr};
pub use immdt::{ImmDt, ImmDtRepr};
pub use ip::{IpAddrs, IpContext, ROCE_V2_UDP_PORT};
pub use opcode::{ALL_RC, ExtHeaders, Opcode, Position};
pub use packet::{Packet, PacketRepr, pad_len};
pub use psn::Psn;
pub use reth::{Reth, RethRepr};
pub use sack::{
    SACK_ETH_LEN, SACK_OPCODE, SACK_PACKET_LEN, SACK_SPAN, SackBitmap, SackEth, SackPacketRepr,
    SackRepr,
};

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
/// DETH length in bytes (rc-transport.md §1.4).
pub const DETH_LEN: usize = 8;

/// Everything that can go wrong while parsing or emitting RoCEv2 transport bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer is shorter than the headers (plus ICRC) it must hold (rc-transport.md §1.10
    /// "runt packet"), or an emit target is too small.
    #[error("buffer too short: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes required.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The BTH opcode is not a named RC opcode (rc-transport.md §1.3).
    #[error("unknown or unsupported opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// BTH TVer is not 0 (rc-transport.md §1.2; rxe drops such packets).
    #[error("unsupported transport header version {0}")]
    BadTver(u8),
    /// On parse: PadCnt exceeds the bytes between the headers and the ICRC. On emit: PadCnt is
    /// not `(4 − payload mod 4) mod 4` (rc-transport.md §1.6).
    #[error("pad count {pad} is invalid for {len} bytes of payload")]
    BadPad {
        /// The BTH PadCnt.
        pad: u8,
        /// Bytes between the headers and the ICRC (parse) or payload length (emit).
        len: usize,
    },
    /// An opcode that carries no payload (READ request, ACK, atomics; rc-transport.md §1.3) has
    /// bytes after its headers.
    #[error("opcode {opcode:?} carries no payload but has {len} payload bytes")]
    UnexpectedPayload {
        /// The packet's opcode.
        opcode: Opcode,
        /// Number of stray bytes.
        len: usize,
    },
    /// A [`PacketRepr`]'s extension headers differ from the set its opcode requires
    /// (rc-transport.md §1.3).
    #[error("extension headers do not match opcode {0:?}")]
    HeaderMismatch(Opcode),
    /// The UDP payload is too long for the IP/UDP length fields the ICRC covers
    /// (rc-transport.md §1.8).
    #[error("UDP payload of {0} bytes does not fit the IP/UDP length fields")]
    TooLong(usize),
    /// An IP header handed to [`icrc::icrc_over_headers`] is not a 20-byte IPv4 header (IHL 5)
    /// or a 40-byte IPv6 header followed by 8 UDP bytes.
    #[error("unsupported IP header (version/IHL byte {0:#04x})")]
    BadIpHeader(u8),
    /// The stored ICRC differs from the computed one (rc-transport.md §1.8).
    #[error("ICRC mismatch: computed {computed:#010x}, packet carries {stored:#010x}")]
    BadIcrc {
        /// ICRC computed over the packet.
        computed: u32,
        /// ICRC found in the last four bytes (decoded little-endian).
        stored: u32,
    },
}

/// Reads `N` bytes at `at`. Callers have checked the length (views) or use `get` first.
#[inline]
fn read<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// Reads a big-endian 24-bit field at `at`.
#[inline]
fn read_u24(b: &[u8], at: usize) -> u32 {
    let [x, y, z] = read(b, at);
    u32::from_be_bytes([0, x, y, z])
}

/// Writes the low 24 bits of `v` big-endian at `at`.
#[inline]
fn write_u24(b: &mut [u8], at: usize, v: u32) {
    let [_, x, y, z] = v.to_be_bytes();
    b[at..at + 3].copy_from_slice(&[x, y, z]);
}

/// Defines a smoltcp-style view type over a fixed-length header.
macro_rules! header_view {
    ($(#[$meta:meta])* $name:ident, $len:expr) => {
        $(#[$meta])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Header length in bytes.
            pub const LEN: usize = $len;

            /// Wraps `buffer` without a length check; accessors panic if it is shorter than
            /// [`Self::LEN`]. Use [`Self::new_checked`] on untrusted input.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps `buffer` after checking it holds at least [`Self::LEN`] bytes (extra bytes
            /// are ignored); otherwise [`WireError::Truncated`].
            pub fn new_checked(buffer: T) -> Result<Self, WireError> {
                let view = Self::new_unchecked(buffer);
                view.check_len()?;
                Ok(view)
            }

            /// `Ok` if the buffer holds at least [`Self::LEN`] bytes, else
            /// [`WireError::Truncated`].
            pub fn check_len(&self) -> Result<(), WireError> {
                let have = self.buffer.as_ref().len();
                if have < Self::LEN {
                    Err(WireError::Truncated { need: Self::LEN, have })
                } else {
                    Ok(())
                }
            }

            /// Returns the wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}
use header_view;
