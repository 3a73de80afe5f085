//! RC opcodes and the per-opcode header table (rc-transport.md §1.3).
//!
//! This module knows, for every RC opcode, which extension headers follow the BTH, how long the
//! fixed headers are, whether a payload may follow and how the opcode sits in a message
//! (first/middle/last/only). It does not parse bytes (see [`super::PacketRepr`]) and knows
//! nothing about UC, UD, CNP or the IBTA 1.5 FLUSH/ATOMIC_WRITE extensions: those decode to
//! [`Opcode::Unknown`].

/// An 8-bit BTH opcode, rc-transport.md §1.2/§1.3.
///
/// The named variants are the RC opcodes 0x00..=0x17 (transport bits 000); every other byte value,
/// including the reserved RC value 0x15 and all UC/UD/CNP opcodes, is [`Opcode::Unknown`] carrying
/// the raw byte, so `u8::from(Opcode::from(b)) == b` for every `b`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// `SEND_FIRST` (0x00).
    SendFirst,
    /// `SEND_MIDDLE` (0x01).
    SendMiddle,
    /// `SEND_LAST` (0x02).
    SendLast,
    /// `SEND_LAST_WITH_IMMEDIATE` (0x03).
    SendLastWithImmediate,
    /// `SEND_ONLY` (0x04).
    SendOnly,
    /// `SEND_ONLY_WITH_IMMEDIATE` (0x05).
    SendOnlyWithImmediate,
    /// `RDMA_WRITE_FIRST` (0x06).
    RdmaWriteFirst,
    /// `RDMA_WRITE_MIDDLE` (0x07).
    RdmaWriteMiddle,
    /// `RDMA_WRITE_LAST` (0x08).
    RdmaWriteLast,
    /// `RDMA_WRITE_LAST_WITH_IMMEDIATE` (0x09).
    RdmaWriteLastWithImmediate,
    /// `RDMA_WRITE_ONLY` (0x0A).
    RdmaWriteOnly,
    /// `RDMA_WRITE_ONLY_WITH_IMMEDIATE` (0x0B).
    RdmaWriteOnlyWithImmediate,
    /// `RDMA_READ_REQUEST` (0x0C).
    RdmaReadRequest,
    /// `RDMA_READ_RESPONSE_FIRST` (0x0D).
    RdmaReadResponseFirst,
    /// `RDMA_READ_RESPONSE_MIDDLE` (0x0E).
    RdmaReadResponseMiddle,
    /// `RDMA_READ_RESPONSE_LAST` (0x0F).
    RdmaReadResponseLast,
    /// `RDMA_READ_RESPONSE_ONLY` (0x10).
    RdmaReadResponseOnly,
    /// `ACKNOWLEDGE` (0x11).
    Acknowledge,
    /// `ATOMIC_ACKNOWLEDGE` (0x12).
    AtomicAcknowledge,
    /// `COMPARE_SWAP` (0x13).
    CompareSwap,
    /// `FETCH_ADD` (0x14).
    FetchAdd,
    /// `SEND_LAST_WITH_INVALIDATE` (0x16).
    SendLastWithInvalidate,
    /// `SEND_ONLY_WITH_INVALIDATE` (0x17).
    SendOnlyWithInvalidate,
    /// Any byte that is not a named RC opcode (rc-transport.md §1.3): reserved 0x15, UC, UD,
    /// CNP, ...
    Unknown(u8),
}

/// Every named RC opcode in wire-value order (rc-transport.md §1.3); excludes [`Opcode::Unknown`].
pub const ALL_RC: [Opcode; 23] = [
    Opcode::SendFirst,
    Opcode::SendMiddle,
    Opcode::SendLast,
    Opcode::SendLastWithImmediate,
    Opcode::SendOnly,
    Opcode::SendOnlyWithImmediate,
    Opcode::RdmaWriteFirst,
    Opcode::RdmaWriteMiddle,
    Opcode::RdmaWriteLast,
    Opcode::RdmaWriteLastWithImmediate,
    Opcode::RdmaWriteOnly,
    Opcode::RdmaWriteOnlyWithImmediate,
    Opcode::RdmaReadRequest,
    Opcode::RdmaReadResponseFirst,
    Opcode::RdmaReadResponseMiddle,
    Opcode::RdmaReadResponseLast,
    Opcode::RdmaReadResponseOnly,
    Opcode::Acknowledge,
    Opcode::AtomicAcknowledge,
    Opcode::CompareSwap,
    Opcode::FetchAdd,
    Opcode::SendLastWithInvalidate,
    Opcode::SendOnlyWithInvalidate,
];

impl From<u8> for Opcode {
    /// Decodes a BTH opcode byte; never fails (rc-transport.md §1.3).
    fn from(v: u8) -> Self {
        use Opcode::*;
        match v {
            0x00 => SendFirst,
            0x01 => SendMiddle,
            0x02 => SendLast,
            0x03 => SendLastWithImmediate,
            0x04 => SendOnly,
            0x05 => SendOnlyWithImmediate,
            0x06 => RdmaWriteFirst,
            0x07 => RdmaWriteMiddle,
            0x08 => RdmaWriteLast,
            0x09 => RdmaWriteLastWithImmediate,
            0x0A => RdmaWriteOnly,
            0x0B => RdmaWriteOnlyWithImmediate,
            0x0C => RdmaReadRequest,
            0x0D => RdmaReadResponseFirst,
            0x0E => RdmaReadResponseMiddle,
            0x0F => RdmaReadResponseLast,
            0x10 => RdmaReadResponseOnly,
            0x11 => Acknowledge,
            0x12 => AtomicAcknowledge,
            0x13 => CompareSwap,
            0x14 => FetchAdd,
            0x16 => SendLastWithInvalidate,
            0x17 => SendOnlyWithInvalidate,
            other => Unknown(other),
        }
    }
}

impl From<Opcode> for u8 {
    /// Encodes the opcode as its BTH byte (rc-transport.md §1.3). `Unknown(v)` encodes as `v`.
    fn from(op: Opcode) -> u8 {
        use Opcode::*;
        match op {
            SendFirst => 0x00,
            SendMiddle => 0x01,
            SendLast => 0x02,
            SendLastWithImmediate => 0x03,
            SendOnly => 0x04,
            SendOnlyWithImmediate => 0x05,
            RdmaWriteFirst => 0x06,
            RdmaWriteMiddle => 0x07,
            RdmaWriteLast => 0x08,
            RdmaWriteLastWithImmediate => 0x09,
            RdmaWriteOnly => 0x0A,
            RdmaWriteOnlyWithImmediate => 0x0B,
            RdmaReadRequest => 0x0C,
            RdmaReadResponseFirst => 0x0D,
            RdmaReadResponseMiddle => 0x0E,
            RdmaReadResponseLast => 0x0F,
            RdmaReadResponseOnly => 0x10,
            Acknowledge => 0x11,
            AtomicAcknowledge => 0x12,
            CompareSwap => 0x13,
            FetchAdd => 0x14,
            SendLastWithInvalidate => 0x16,
            SendOnlyWithInvalidate => 0x17,
            Unknown(v) => v,
        }
    }
}

/// Where a packet sits inside its message (rc-transport.md §3.1).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message (`*_FIRST`).
    First,
    /// Inner packet of a multi-packet message (`*_MIDDLE`).
    Middle,
    /// Last packet of a multi-packet message (`*_LAST*`).
    Last,
    /// Single-packet message, or a packet that is not segmented (READ request, ACK, atomics).
    Only,
}

/// The extension headers an opcode carries after the BTH, in wire order RETH, AETH, AtomicETH,
/// AtomicAckETH, ImmDt, IETH (rc-transport.md §1.3/§1.4). At most one of ImmDt/IETH is set.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders {
    /// RDMA extended transport header (16 B).
    pub reth: bool,
    /// ACK extended transport header (4 B).
    pub aeth: bool,
    /// Atomic extended transport header (28 B).
    pub atomic_eth: bool,
    /// Atomic-ACK extended transport header (8 B).
    pub atomic_ack_eth: bool,
    /// Immediate data (4 B).
    pub immdt: bool,
    /// Invalidate extended transport header (4 B).
    pub ieth: bool,
}

impl ExtHeaders {
    /// Total length in bytes of the flagged extension headers (rc-transport.md §1.4).
    pub const fn len(self) -> usize {
        (self.reth as usize) * super::RETH_LEN
            + (self.aeth as usize) * super::AETH_LEN
            + (self.atomic_eth as usize) * super::ATOMIC_ETH_LEN
            + (self.atomic_ack_eth as usize) * super::ATOMIC_ACK_ETH_LEN
            + (self.immdt as usize) * super::IMMDT_LEN
            + (self.ieth as usize) * super::IETH_LEN
    }

    /// True if no extension header follows the BTH.
    pub const fn is_empty(self) -> bool {
        self.len() == 0
    }
}

const NONE: ExtHeaders = ExtHeaders {
    reth: false,
    aeth: false,
    atomic_eth: false,
    atomic_ack_eth: false,
    immdt: false,
    ieth: false,
};

impl Opcode {
    /// The IBTA/rxe name, e.g. `"SEND_ONLY"`, `"RDMA_READ_RESPONSE_FIRST"` (rc-transport.md §1.3);
    /// `"UNKNOWN"` for [`Opcode::Unknown`].
    pub fn name(self) -> &'static str {
        use Opcode::*;
        match self {
            SendFirst => "SEND_FIRST",
            SendMiddle => "SEND_MIDDLE",
            SendLast => "SEND_LAST",
            SendLastWithImmediate => "SEND_LAST_WITH_IMMEDIATE",
            SendOnly => "SEND_ONLY",
            SendOnlyWithImmediate => "SEND_ONLY_WITH_IMMEDIATE",
            RdmaWriteFirst => "RDMA_WRITE_FIRST",
            RdmaWriteMiddle => "RDMA_WRITE_MIDDLE",
            RdmaWriteLast => "RDMA_WRITE_LAST",
            RdmaWriteLastWithImmediate => "RDMA_WRITE_LAST_WITH_IMMEDIATE",
            RdmaWriteOnly => "RDMA_WRITE_ONLY",
            RdmaWriteOnlyWithImmediate => "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            RdmaReadRequest => "RDMA_READ_REQUEST",
            RdmaReadResponseFirst => "RDMA_READ_RESPONSE_FIRST",
            RdmaReadResponseMiddle => "RDMA_READ_RESPONSE_MIDDLE",
            RdmaReadResponseLast => "RDMA_READ_RESPONSE_LAST",
            RdmaReadResponseOnly => "RDMA_READ_RESPONSE_ONLY",
            Acknowledge => "ACKNOWLEDGE",
            AtomicAcknowledge => "ATOMIC_ACKNOWLEDGE",
            CompareSwap => "COMPARE_SWAP",
            FetchAdd => "FETCH_ADD",
            SendLastWithInvalidate => "SEND_LAST_WITH_INVALIDATE",
            SendOnlyWithInvalidate => "SEND_ONLY_WITH_INVALIDATE",
            Unknown(_) => "UNKNOWN",
        }
    }

    /// Inverse of [`Opcode::name`], ASCII case-insensitive; `None` for any other string
    /// (including `"UNKNOWN"`, which has no single byte value).
    pub fn from_name(s: &str) -> Option<Opcode> {
        ALL_RC
            .into_iter()
            .find(|op| op.name().eq_ignore_ascii_case(s))
    }

    /// True for requester-to-responder opcodes: SEND*, RDMA_WRITE*, RDMA_READ_REQUEST,
    /// COMPARE_SWAP, FETCH_ADD (rc-transport.md §1.3).
    pub fn is_request(self) -> bool {
        self.is_send()
            || self.is_write()
            || matches!(
                self,
                Opcode::RdmaReadRequest | Opcode::CompareSwap | Opcode::FetchAdd
            )
    }

    /// True for the four RDMA_READ_RESPONSE_* opcodes.
    pub fn is_read_response(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            RdmaReadResponseFirst
                | RdmaReadResponseMiddle
                | RdmaReadResponseLast
                | RdmaReadResponseOnly
        )
    }

    /// True for ACKNOWLEDGE only (ACK and NAK share it; see [`super::Syndrome`]).
    pub fn is_ack(self) -> bool {
        self == Opcode::Acknowledge
    }

    /// True for COMPARE_SWAP, FETCH_ADD and ATOMIC_ACKNOWLEDGE.
    pub fn is_atomic(self) -> bool {
        use Opcode::*;
        matches!(self, CompareSwap | FetchAdd | AtomicAcknowledge)
    }

    /// True for responder-to-requester opcodes: read responses, ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE.
    pub fn is_response(self) -> bool {
        self.is_read_response() || matches!(self, Opcode::Acknowledge | Opcode::AtomicAcknowledge)
    }

    /// True for [`Opcode::Unknown`].
    pub fn is_unknown(self) -> bool {
        matches!(self, Opcode::Unknown(_))
    }

    /// True for SEND_* opcodes (including with-immediate and with-invalidate).
    pub fn is_send(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            SendFirst
                | SendMiddle
                | SendLast
                | SendLastWithImmediate
                | SendOnly
                | SendOnlyWithImmediate
                | SendLastWithInvalidate
                | SendOnlyWithInvalidate
        )
    }

    /// True for RDMA_WRITE_* opcodes (including with-immediate).
    pub fn is_write(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            RdmaWriteFirst
                | RdmaWriteMiddle
                | RdmaWriteLast
                | RdmaWriteLastWithImmediate
                | RdmaWriteOnly
                | RdmaWriteOnlyWithImmediate
        )
    }

    /// The extension headers this opcode carries after the BTH (rc-transport.md §1.3);
    /// `None` for [`Opcode::Unknown`].
    pub fn ext_headers(self) -> Option<ExtHeaders> {
        use Opcode::*;
        let h = match self {
            SendFirst | SendMiddle | SendLast | SendOnly => NONE,
            RdmaWriteMiddle | RdmaWriteLast | RdmaReadResponseMiddle => NONE,
            SendLastWithImmediate | SendOnlyWithImmediate | RdmaWriteLastWithImmediate => {
                ExtHeaders {
                    immdt: true,
                    ..NONE
                }
            }
            RdmaWriteFirst | RdmaWriteOnly | RdmaReadRequest => ExtHeaders { reth: true, ..NONE },
            RdmaWriteOnlyWithImmediate => ExtHeaders {
                reth: true,
                immdt: true,
                ..NONE
            },
            RdmaReadResponseFirst | RdmaReadResponseLast | RdmaReadResponseOnly | Acknowledge => {
                ExtHeaders { aeth: true, ..NONE }
            }
            AtomicAcknowledge => ExtHeaders {
                aeth: true,
                atomic_ack_eth: true,
                ..NONE
            },
            CompareSwap | FetchAdd => ExtHeaders {
                atomic_eth: true,
                ..NONE
            },
            SendLastWithInvalidate | SendOnlyWithInvalidate => ExtHeaders { ieth: true, ..NONE },
            Unknown(_) => return None,
        };
        Some(h)
    }

    /// Fixed header bytes from the start of the BTH to the payload: 12 + extension headers
    /// (the "Header bytes" column of rc-transport.md §1.3); `None` for [`Opcode::Unknown`].
    pub fn header_len(self) -> Option<usize> {
        self.ext_headers().map(|h| super::BTH_LEN + h.len())
    }

    /// True if packets with this opcode may carry payload bytes: SEND*, RDMA_WRITE* and read
    /// responses. READ requests, ACKs and atomics carry none (rc-transport.md §1.3).
    pub fn has_payload(self) -> bool {
        self.is_send() || self.is_write() || self.is_read_response()
    }

    /// Position of the packet within its message (rc-transport.md §3.1); `None` for Unknown.
    pub fn position(self) -> Option<Position> {
        use Opcode::*;
        Some(match self {
            SendFirst | RdmaWriteFirst | RdmaReadResponseFirst => Position::First,
            SendMiddle | RdmaWriteMiddle | RdmaReadResponseMiddle => Position::Middle,
            SendLast
            | SendLastWithImmediate
            | SendLastWithInvalidate
            | RdmaWriteLast
            | RdmaWriteLastWithImmediate
            | RdmaReadResponseLast => Position::Last,
            SendOnly
            | SendOnlyWithImmediate
            | SendOnlyWithInvalidate
            | RdmaWriteOnly
            | RdmaWriteOnlyWithImmediate
            | RdmaReadRequest
            | RdmaReadResponseOnly
            | Acknowledge
            | AtomicAcknowledge
            | CompareSwap
            | FetchAdd => Position::Only,
            Unknown(_) => return None,
        })
    }

    /// True for the last packet of a message (`*_LAST*` and `*_ONLY*`, and the unsegmented
    /// request/response opcodes).
    pub fn is_last_or_only(self) -> bool {
        matches!(self.position(), Some(Position::Last | Position::Only))
    }

    /// True if a requester may set BTH AckReq on this opcode: every request opcode
    /// (rc-transport.md §2.7). Responses never carry AckReq.
    pub fn may_request_ack(self) -> bool {
        self.is_request()
    }

    /// True if the responder consumes a receive WQE when this packet arrives ("RWR"):
    /// SEND_FIRST, SEND_ONLY*, RDMA_WRITE_LAST_WITH_IMMEDIATE, RDMA_WRITE_ONLY_WITH_IMMEDIATE
    /// (rc-transport.md §1.3).
    pub fn consumes_recv_wqe(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            SendFirst
                | SendOnly
                | SendOnlyWithImmediate
                | SendOnlyWithInvalidate
                | RdmaWriteLastWithImmediate
                | RdmaWriteOnlyWithImmediate
        )
    }

    /// True if the responder generates a receive completion for this packet ("COMP"):
    /// every SEND_LAST*/SEND_ONLY* plus the two write-with-immediate end opcodes
    /// (rc-transport.md §1.3).
    pub fn generates_recv_completion(self) -> bool {
        (self.is_send() && self.is_last_or_only())
            || matches!(
                self,
                Opcode::RdmaWriteLastWithImmediate | Opcode::RdmaWriteOnlyWithImmediate
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_round_trip_for_every_value() {
        for b in 0..=u8::MAX {
            assert_eq!(u8::from(Opcode::from(b)), b);
        }
        for (i, op) in ALL_RC.into_iter().enumerate() {
            assert!(!op.is_unknown());
            let v = u8::from(op);
            assert!(v <= 0x17 && v != 0x15, "{op:?}");
            if i > 0 {
                assert!(u8::from(ALL_RC[i - 1]) < v, "ALL_RC is in wire order");
            }
        }
        assert_eq!(Opcode::from(0x15), Opcode::Unknown(0x15));
        assert_eq!(Opcode::from(0x24), Opcode::Unknown(0x24));
        assert_eq!(Opcode::from(0x81), Opcode::Unknown(0x81));
    }

    #[test]
    fn names_round_trip() {
        for op in ALL_RC {
            assert_eq!(Opcode::from_name(op.name()), Some(op));
            assert_eq!(Opcode::from_name(&op.name().to_ascii_lowercase()), Some(op));
        }
        assert_eq!(Opcode::Unknown(0x15).name(), "UNKNOWN");
        assert_eq!(Opcode::from_name("UNKNOWN"), None);
        assert_eq!(Opcode::from_name("SEND"), None);
    }

    /// The "Header bytes" column of rc-transport.md §1.3, by wire value.
    #[test]
    fn header_table_matches_spec() {
        let table: [(u8, usize); 23] = [
            (0x00, 12),
            (0x01, 12),
            (0x02, 12),
            (0x03, 16),
            (0x04, 12),
            (0x05, 16),
            (0x06, 28),
            (0x07, 12),
            (0x08, 12),
            (0x09, 16),
            (0x0A, 28),
            (0x0B, 32),
            (0x0C, 28),
            (0x0D, 16),
            (0x0E, 12),
            (0x0F, 16),
            (0x10, 16),
            (0x11, 16),
            (0x12, 24),
            (0x13, 40),
            (0x14, 40),
            (0x16, 16),
            (0x17, 16),
        ];
        for (v, len) in table {
            assert_eq!(Opcode::from(v).header_len(), Some(len), "opcode {v:#04x}");
        }
        assert_eq!(Opcode::Unknown(0x15).header_len(), None);
        let h = Opcode::RdmaWriteOnlyWithImmediate.ext_headers();
        assert_eq!(
            h,
            Some(ExtHeaders {
                reth: true,
                immdt: true,
                ..NONE
            })
        );
    }

    #[test]
    fn classification() {
        let mut requests = 0;
        for op in ALL_RC {
            assert_ne!(op.is_request(), op.is_response(), "{op:?}");
            requests += usize::from(op.is_request());
            if op.consumes_recv_wqe() || op.generates_recv_completion() {
                assert!(op.is_send() || op.is_write(), "{op:?}");
            }
        }
        assert_eq!(requests, 17);
        assert!(!Opcode::RdmaReadRequest.has_payload());
        assert!(Opcode::RdmaReadResponseMiddle.has_payload());
        assert!(!Opcode::CompareSwap.has_payload());
        assert!(Opcode::AtomicAcknowledge.is_atomic() && Opcode::AtomicAcknowledge.is_response());
        assert!(!Opcode::AtomicAcknowledge.is_ack());
        assert!(Opcode::SendFirst.consumes_recv_wqe());
        assert!(!Opcode::SendFirst.generates_recv_completion());
        assert!(!Opcode::RdmaWriteOnly.consumes_recv_wqe());
        assert!(Opcode::RdmaWriteLastWithImmediate.generates_recv_completion());
        assert!(Opcode::SendLastWithInvalidate.generates_recv_completion());
        assert!(!Opcode::SendLastWithInvalidate.consumes_recv_wqe());
        let u = Opcode::Unknown(0x64);
        assert!(!u.is_request() && !u.is_response() && !u.has_payload());
        assert_eq!(u.position(), None);
    }

    /// Every RC row of rc-transport.md §1.3: value, name, extension headers in wire order,
    /// message position (§3.1), kind and the "RWR" / "COMP" notes under the table. Kinds:
    /// `S` SEND, `W` RDMA WRITE, `R` READ request, `r` READ response, `A` ACKNOWLEDGE,
    /// `a` atomic request, `k` ATOMIC_ACKNOWLEDGE.
    #[rustfmt::skip]
    const SPEC: [(u8, &str, &str, Position, char, bool, bool); 23] = {
        use Position::{First as F, Last as L, Middle as M, Only as O};
        [
            (0x00, "SEND_FIRST", "", F, 'S', true, false),
            (0x01, "SEND_MIDDLE", "", M, 'S', false, false),
            (0x02, "SEND_LAST", "", L, 'S', false, true),
            (0x03, "SEND_LAST_WITH_IMMEDIATE", "ImmDt", L, 'S', false, true),
            (0x04, "SEND_ONLY", "", O, 'S', true, true),
            (0x05, "SEND_ONLY_WITH_IMMEDIATE", "ImmDt", O, 'S', true, true),
            (0x06, "RDMA_WRITE_FIRST", "RETH", F, 'W', false, false),
            (0x07, "RDMA_WRITE_MIDDLE", "", M, 'W', false, false),
            (0x08, "RDMA_WRITE_LAST", "", L, 'W', false, false),
            (0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", "ImmDt", L, 'W', true, true),
            (0x0A, "RDMA_WRITE_ONLY", "RETH", O, 'W', false, false),
            (0x0B, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", "RETH ImmDt", O, 'W', true, true),
            (0x0C, "RDMA_READ_REQUEST", "RETH", O, 'R', false, false),
            (0x0D, "RDMA_READ_RESPONSE_FIRST", "AETH", F, 'r', false, false),
            (0x0E, "RDMA_READ_RESPONSE_MIDDLE", "", M, 'r', false, false),
            (0x0F, "RDMA_READ_RESPONSE_LAST", "AETH", L, 'r', false, false),
            (0x10, "RDMA_READ_RESPONSE_ONLY", "AETH", O, 'r', false, false),
            (0x11, "ACKNOWLEDGE", "AETH", O, 'A', false, false),
            (0x12, "ATOMIC_ACKNOWLEDGE", "AETH AtomicAckETH", O, 'k', false, false),
            (0x13, "COMPARE_SWAP", "AtomicETH", O, 'a', false, false),
            (0x14, "FETCH_ADD", "AtomicETH", O, 'a', false, false),
            (0x16, "SEND_LAST_WITH_INVALIDATE", "IETH", L, 'S', false, true),
            (0x17, "SEND_ONLY_WITH_INVALIDATE", "IETH", O, 'S', true, true),
        ]
    };

    /// The header set a §1.3 "Extension headers" cell names.
    fn headers(cell: &str) -> ExtHeaders {
        let mut h = NONE;
        for name in cell.split_whitespace() {
            match name {
                "RETH" => h.reth = true,
                "AETH" => h.aeth = true,
                "AtomicETH" => h.atomic_eth = true,
                "AtomicAckETH" => h.atomic_ack_eth = true,
                "ImmDt" => h.immdt = true,
                "IETH" => h.ieth = true,
                _ => panic!("unknown header {name}"),
            }
        }
        h
    }

    #[test]
    fn every_rc_opcode_matches_the_spec_table() {
        for (i, (v, name, cell, pos, kind, rwr, comp)) in SPEC.into_iter().enumerate() {
            let op = Opcode::from(v);
            assert_eq!(op, ALL_RC[i], "{name}");
            assert_eq!((u8::from(op), op.name()), (v, name));
            assert_eq!(Opcode::from_name(name), Some(op));
            let h = headers(cell);
            assert_eq!(op.ext_headers(), Some(h), "{name}");
            assert_eq!(h.is_empty(), cell.is_empty(), "{name}");
            assert_eq!(op.position(), Some(pos), "{name}");
            assert_eq!(
                op.is_last_or_only(),
                matches!(pos, Position::Last | Position::Only)
            );
            let request = matches!(kind, 'S' | 'W' | 'R' | 'a');
            let mut got = classes(op).to_vec();
            got.push(op.is_unknown());
            let want = [
                kind == 'S',
                kind == 'W',
                kind == 'r',
                kind == 'A',
                matches!(kind, 'a' | 'k'),
                request,
                request,
                !request,
                matches!(kind, 'S' | 'W' | 'r'),
                rwr,
                comp,
                false,
            ];
            assert_eq!(
                got, want,
                "{name}: send write read_response ack atomic request may_ack response payload rwr comp unknown"
            );
        }
    }

    /// The classifications of `op` that both opcode-table tests check, in one order.
    fn classes(op: Opcode) -> [bool; 11] {
        [
            op.is_send(),
            op.is_write(),
            op.is_read_response(),
            op.is_ack(),
            op.is_atomic(),
            op.is_request(),
            op.may_request_ack(),
            op.is_response(),
            op.has_payload(),
            op.consumes_recv_wqe(),
            op.generates_recv_completion(),
        ]
    }

    #[test]
    fn non_rc_bytes_are_unknown_with_no_properties() {
        for v in (0x18..=0xFF).chain([0x15]) {
            let op = Opcode::from(v);
            assert_eq!(op, Opcode::Unknown(v));
            assert!(op.is_unknown());
            assert_eq!(op.name(), "UNKNOWN");
            assert_eq!(
                (op.ext_headers(), op.header_len(), op.position()),
                (None, None, None)
            );
            assert_eq!(classes(op), [false; 11], "{v:#04x}");
            assert!(!op.is_last_or_only(), "{v:#04x}");
        }
    }

    /// rc-transport.md §1.4: each extension header's size, alone and summed.
    #[test]
    fn extension_header_lengths() {
        let sizes = [
            ("RETH", 16),
            ("AETH", 4),
            ("AtomicETH", 28),
            ("AtomicAckETH", 8),
            ("ImmDt", 4),
            ("IETH", 4),
        ];
        assert_eq!((NONE.len(), NONE.is_empty()), (0, true));
        let mut all = String::new();
        for (name, len) in sizes {
            assert_eq!(
                (headers(name).len(), headers(name).is_empty()),
                (len, false),
                "{name}"
            );
            all = all + " " + name;
        }
        assert_eq!(headers(&all).len(), 64);
    }
}
