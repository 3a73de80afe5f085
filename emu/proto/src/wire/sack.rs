//! The selective ACK of softverbs' selective-repeat extension (rc-transport.md "softverbs
//! extensions"): a manufacturer-specific BTH opcode followed by a 68-byte SACK extended
//! header. Only QPs that both set `Recovery::SelectiveRepeat` ever send or accept it.
//!
//! IBTA vol. 1 Table 38 leaves the opcodes whose transport bits are `111` (0xE0..=0xFF) to
//! manufacturers (the kernel's `ib_pack.h`: `IB_OPCODE_MSP = 0xe0`); [`SACK_OPCODE`] sits at
//! the offset ACKNOWLEDGE has among the RC opcodes. rxe drops any packet whose transport bits
//! do not match the QP's type, and [`super::Opcode`] decodes it as `Unknown`, so a standard
//! peer that received one anyway would drop it.
//!
//! Layout, after a BTH whose PSN is the first PSN the responder still misses (its ePSN: every
//! PSN before it is acknowledged, as a sequence NAK implies):
//!
//! | bytes | field |
//! |-------|-------|
//! | 0     | reserved, 0 |
//! | 1–3   | MSN (24 bits, as the AETH's) |
//! | 4–67  | bitmap, one 512-bit big-endian number: bit *i* (LSB = 0) set = PSN `bth.psn + 1 + i` received |
//!
//! The bitmap spans [`SACK_SPAN`] PSNs, four times the requester's flight
//! (`rc::sr::FLIGHT`), so a hole at the window's left edge does not stop new data while its
//! resend queues behind the packets in flight.
//!
//! What it is not: it carries no credits and no NAK codes; errors still travel as IBTA NAKs.

use super::{
    BTH_LEN, Bth, BthRepr, ICRC_LEN, Opcode, WireError, header_view, read, read_u24, write_u24,
};

/// The BTH opcode of a selective ACK: manufacturer-specific range 0xE0 + ACKNOWLEDGE's 0x11.
pub const SACK_OPCODE: u8 = 0xF1;

/// SACK extended header length in bytes.
pub const SACK_ETH_LEN: usize = 4 + SACK_BITMAP_LEN;

/// Bitmap length in bytes.
const SACK_BITMAP_LEN: usize = SACK_SPAN as usize / 8;

/// Length of a whole SACK packet (BTH, SACK ETH, ICRC; no payload, no pad).
pub const SACK_PACKET_LEN: usize = BTH_LEN + SACK_ETH_LEN + ICRC_LEN;

/// PSNs after the BTH PSN one SACK can describe.
pub const SACK_SPAN: u32 = 512;

/// The received-PSN bitmap of a selective ACK: bit *i* set = PSN `bth.psn + 1 + i` received,
/// for *i* below [`SACK_SPAN`].
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SackBitmap(pub [u64; SACK_SPAN as usize / 64]);

impl SackBitmap {
    /// Whether bit `i` is set (false beyond [`SACK_SPAN`]).
    pub fn has(&self, i: u32) -> bool {
        let i = i as usize;
        self.0.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    /// Sets bit `i`; ignored beyond [`SACK_SPAN`].
    pub fn set(&mut self, i: u32) {
        let i = i as usize;
        if let Some(w) = self.0.get_mut(i / 64) {
            *w |= 1 << (i % 64);
        }
    }

    /// The bitmap with bits `0..n` set (all of them if `n` ≥ [`SACK_SPAN`]).
    pub fn first(n: u32) -> SackBitmap {
        let mut b = SackBitmap::default();
        for (k, w) in b.0.iter_mut().enumerate() {
            let lo = 64 * k as u32;
            *w = match n.saturating_sub(lo) {
                0 => 0,
                r if r >= 64 => u64::MAX,
                r => (1 << r) - 1,
            };
        }
        b
    }

    /// The wire form: one big-endian number, so bit 0 is the last byte's LSB.
    fn to_bytes(self) -> [u8; SACK_BITMAP_LEN] {
        let mut out = [0u8; SACK_BITMAP_LEN];
        for (k, w) in self.0.iter().enumerate() {
            let at = SACK_BITMAP_LEN - 8 * (k + 1);
            out[at..at + 8].copy_from_slice(&w.to_be_bytes());
        }
        out
    }

    /// Reads the wire form ([`SackBitmap::to_bytes`]).
    fn from_bytes(bytes: &[u8; SACK_BITMAP_LEN]) -> SackBitmap {
        let mut b = SackBitmap::default();
        for (k, w) in b.0.iter_mut().enumerate() {
            let at = SACK_BITMAP_LEN - 8 * (k + 1);
            *w = u64::from_be_bytes(read(&bytes[at..at + 8], 0));
        }
        b
    }
}

header_view!(
    /// A view over a SACK extended header (this module's table).
    SackEth,
    SACK_ETH_LEN
);

impl<T: AsRef<[u8]>> SackEth<T> {
    /// Byte 0: reserved, 0 on emit, ignored on parse.
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// Bytes 1–3: the responder's MSN.
    pub fn msn(&self) -> u32 {
        read_u24(self.buffer.as_ref(), 1)
    }

    /// Bytes 4–67: the received-PSN bitmap.
    pub fn bitmap(&self) -> SackBitmap {
        SackBitmap::from_bytes(&read(self.buffer.as_ref(), 4))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SackEth<T> {
    /// Sets the MSN (low 24 bits) and clears the reserved byte.
    pub fn set_msn(&mut self, msn: u32) {
        let b = self.buffer.as_mut();
        b[0] = 0;
        write_u24(b, 1, msn);
    }

    /// Sets the bitmap.
    pub fn set_bitmap(&mut self, bitmap: SackBitmap) {
        self.buffer.as_mut()[4..SACK_ETH_LEN].copy_from_slice(&bitmap.to_bytes());
    }
}

/// A parsed SACK extended header.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct SackRepr {
    /// The responder's MSN (24 bits).
    pub msn: u32,
    /// Bit *i* set: PSN `bth.psn + 1 + i` was received.
    pub bitmap: SackBitmap,
}

impl SackRepr {
    /// Parses a view; [`WireError::Truncated`] if short. Any value decodes.
    pub fn parse<T: AsRef<[u8]>>(eth: &SackEth<T>) -> Result<SackRepr, WireError> {
        eth.check_len()?;
        Ok(SackRepr {
            msn: eth.msn(),
            bitmap: eth.bitmap(),
        })
    }

    /// Writes all [`SACK_ETH_LEN`] bytes. Panics if the view is shorter than [`SACK_ETH_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, eth: &mut SackEth<T>) {
        eth.set_msn(self.msn);
        eth.set_bitmap(self.bitmap);
    }

    /// Emitted length: [`SACK_ETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        SACK_ETH_LEN
    }

    /// Whether PSN `first + 1 + i` is marked received.
    pub fn has(&self, i: u32) -> bool {
        self.bitmap.has(i)
    }
}

/// A whole SACK packet: its BTH and SACK ETH (the ICRC is checked by the caller).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct SackPacketRepr {
    /// The BTH; its opcode is [`SACK_OPCODE`] and its PSN the responder's ePSN.
    pub bth: BthRepr,
    /// The selective part.
    pub sack: SackRepr,
}

impl SackPacketRepr {
    /// Parses a UDP payload: [`WireError::UnknownOpcode`] unless the opcode is
    /// [`SACK_OPCODE`], [`WireError::Truncated`] if short, [`WireError::UnexpectedPayload`] if
    /// bytes follow the SACK ETH. Total over all inputs.
    pub fn parse(bytes: &[u8]) -> Result<SackPacketRepr, WireError> {
        let bth = BthRepr::parse(&Bth::new_checked(bytes)?)?;
        if u8::from(bth.opcode) != SACK_OPCODE {
            return Err(WireError::UnknownOpcode(bth.opcode.into()));
        }
        if bytes.len() < SACK_PACKET_LEN {
            return Err(WireError::Truncated {
                need: SACK_PACKET_LEN,
                have: bytes.len(),
            });
        }
        if bytes.len() > SACK_PACKET_LEN {
            return Err(WireError::UnexpectedPayload {
                opcode: bth.opcode,
                len: bytes.len() - SACK_PACKET_LEN,
            });
        }
        let eth = SackEth::new_checked(&bytes[BTH_LEN..BTH_LEN + SACK_ETH_LEN])?;
        Ok(SackPacketRepr {
            bth,
            sack: SackRepr::parse(&eth)?,
        })
    }

    /// Writes BTH and SACK ETH (the ICRC bytes are left for `fill_icrc`); returns
    /// [`SACK_PACKET_LEN`]. The BTH's opcode is forced to [`SACK_OPCODE`] and its pad to 0.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let have = buf.len();
        let out = buf.get_mut(..SACK_PACKET_LEN).ok_or(WireError::Truncated {
            need: SACK_PACKET_LEN,
            have,
        })?;
        let bth = BthRepr {
            opcode: Opcode::from(SACK_OPCODE),
            pad_count: 0,
            ..self.bth
        };
        bth.emit(&mut Bth::new_unchecked(&mut out[..BTH_LEN]));
        self.sack.emit(&mut SackEth::new_unchecked(
            &mut out[BTH_LEN..BTH_LEN + SACK_ETH_LEN],
        ));
        out[BTH_LEN + SACK_ETH_LEN..].fill(0);
        Ok(SACK_PACKET_LEN)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::wire::Psn;

    fn bth(psn: u32) -> BthRepr {
        BthRepr::new(Opcode::from(SACK_OPCODE), 0x12, Psn::new(psn))
    }

    #[test]
    fn round_trip_and_layout() {
        let mut bitmap = SackBitmap::default();
        for i in [0, 64, 127, SACK_SPAN - 1, SACK_SPAN] {
            bitmap.set(i);
        }
        let p = SackPacketRepr {
            bth: bth(0xAB_CDEF),
            sack: SackRepr {
                msn: 0x01_0203,
                bitmap,
            },
        };
        let mut buf = [0xFFu8; SACK_PACKET_LEN + 4];
        assert_eq!(p.emit(&mut buf).unwrap(), SACK_PACKET_LEN);
        assert_eq!(buf[0], SACK_OPCODE);
        assert_eq!(&buf[BTH_LEN..BTH_LEN + 4], &[0, 1, 2, 3]);
        assert_eq!(buf[BTH_LEN + 4], 0x80);
        assert_eq!(buf[BTH_LEN + SACK_ETH_LEN - 1], 0x01);
        assert_eq!(buf[BTH_LEN + SACK_ETH_LEN - 9], 0x01);
        assert_eq!(buf[BTH_LEN + SACK_ETH_LEN - 16], 0x80);
        assert_eq!(SackPacketRepr::parse(&buf[..SACK_PACKET_LEN]).unwrap(), p);
        assert!(p.sack.has(0) && p.sack.has(127) && !p.sack.has(1) && !p.sack.has(128));
        assert!(p.sack.has(SACK_SPAN - 1) && !p.sack.has(SACK_SPAN));
        assert_eq!(SackBitmap::first(65).0[..2], [u64::MAX, 1]);
        assert_eq!(SackBitmap::first(SACK_SPAN + 3), SackBitmap([u64::MAX; 8]));
    }

    #[test]
    fn other_opcodes_lengths_are_typed_errors() {
        let mut buf = [0u8; SACK_PACKET_LEN];
        let p = SackPacketRepr {
            bth: bth(1),
            sack: SackRepr {
                msn: 0,
                bitmap: SackBitmap::default(),
            },
        };
        p.emit(&mut buf).unwrap();
        assert!(matches!(
            SackPacketRepr::parse(&buf[..SACK_PACKET_LEN - 1]),
            Err(WireError::Truncated { .. })
        ));
        let mut long = buf.to_vec();
        long.push(0);
        assert!(matches!(
            SackPacketRepr::parse(&long),
            Err(WireError::UnexpectedPayload { .. })
        ));
        buf[0] = 0x11;
        assert_eq!(
            SackPacketRepr::parse(&buf),
            Err(WireError::UnknownOpcode(0x11))
        );
        assert_eq!(Opcode::from(SACK_OPCODE), Opcode::Unknown(SACK_OPCODE));
    }

    /// Bit *i* of the bitmap, read from the words as the type documents them.
    fn word_bit(b: &SackBitmap, i: u32) -> bool {
        b.0[i as usize / 64] >> (i % 64) & 1 == 1
    }

    #[test]
    fn each_bit_is_its_own_and_sits_where_the_wire_layout_says() {
        for i in 0..SACK_SPAN {
            let mut b = SackBitmap::default();
            b.set(i);
            for j in 0..SACK_SPAN + 8 {
                assert_eq!(b.has(j), i == j, "set {i}, has {j}");
            }
            assert!(word_bit(&b, i));
            assert_eq!(b.0.iter().map(|w| w.count_ones()).sum::<u32>(), 1);
            // One big-endian number: bit i is bit i % 8 of the (i / 8)-th byte from the end.
            let p = SackPacketRepr {
                bth: bth(3),
                sack: SackRepr { msn: 9, bitmap: b },
            };
            let mut buf = [0u8; SACK_PACKET_LEN];
            p.emit(&mut buf).unwrap();
            let bitmap = &buf[BTH_LEN + 4..BTH_LEN + SACK_ETH_LEN];
            let at = bitmap.len() - 1 - i as usize / 8;
            for (k, &byte) in bitmap.iter().enumerate() {
                let want = if k == at { 1u8 << (i % 8) } else { 0 };
                assert_eq!(byte, want, "bit {i}, byte {k}");
            }
            assert_eq!(SackPacketRepr::parse(&buf), Ok(p));
        }
        let mut b = SackBitmap::default();
        b.set(SACK_SPAN);
        b.set(u32::MAX);
        assert_eq!(b, SackBitmap::default(), "beyond the span: ignored");
        assert!(!SackBitmap([u64::MAX; 8]).has(SACK_SPAN));
    }

    #[test]
    fn first_n_sets_exactly_bits_below_n() {
        for n in 0..SACK_SPAN + 70 {
            let b = SackBitmap::first(n);
            for i in 0..SACK_SPAN {
                assert_eq!(word_bit(&b, i), i < n, "first({n}), bit {i}");
            }
        }
        assert_eq!(SackBitmap::first(u32::MAX), SackBitmap([u64::MAX; 8]));
    }

    #[test]
    fn reserved_byte_is_zero_on_emit_and_ignored_on_parse() {
        let repr = SackRepr {
            msn: 0xAB_CDEF,
            bitmap: SackBitmap::first(3),
        };
        let mut bytes = [0x5Au8; SACK_ETH_LEN];
        let mut eth = SackEth::new_checked(&mut bytes[..]).unwrap();
        repr.emit(&mut eth);
        assert_eq!(eth.reserved(), 0);
        assert_eq!(repr.buffer_len(), SACK_ETH_LEN);
        assert_eq!(SACK_ETH_LEN, 68);
        assert_eq!(SACK_PACKET_LEN, BTH_LEN + 68 + ICRC_LEN);
        bytes[0] = 0x5A;
        let eth = SackEth::new_checked(&bytes[..]).unwrap();
        assert_eq!(eth.reserved(), 0x5A);
        assert_eq!((eth.msn(), eth.bitmap()), (0xAB_CDEF, SackBitmap::first(3)));
        assert_eq!(SackRepr::parse(&eth), Ok(repr));
        assert!(SackEth::new_checked(&bytes[..SACK_ETH_LEN - 1]).is_err());
    }

    #[test]
    fn emit_forces_the_opcode_and_pad_and_zeroes_the_icrc_bytes_only() {
        let p = SackPacketRepr {
            bth: BthRepr {
                opcode: Opcode::Acknowledge,
                pad_count: 3,
                ..bth(0x12_3456)
            },
            sack: SackRepr {
                msn: 1,
                bitmap: SackBitmap::first(1),
            },
        };
        let mut buf = [0xFFu8; SACK_PACKET_LEN + 2];
        assert_eq!(p.emit(&mut buf), Ok(SACK_PACKET_LEN));
        let parsed = SackPacketRepr::parse(&buf[..SACK_PACKET_LEN]).unwrap();
        assert_eq!(parsed.bth.opcode, Opcode::from(SACK_OPCODE));
        assert_eq!(parsed.bth.pad_count, 0);
        assert_eq!(parsed.bth.psn, Psn::new(0x12_3456));
        assert_eq!(parsed.sack, p.sack);
        assert_eq!(buf[SACK_PACKET_LEN - ICRC_LEN..SACK_PACKET_LEN], [0; 4]);
        assert_eq!(
            buf[SACK_PACKET_LEN..],
            [0xFF; 2],
            "past the packet: untouched"
        );
        assert_eq!(
            p.emit(&mut [0u8; SACK_PACKET_LEN - 1]),
            Err(WireError::Truncated {
                need: SACK_PACKET_LEN,
                have: SACK_PACKET_LEN - 1
            })
        );
    }

    #[test]
    fn parse_errors_name_the_lengths() {
        let mut buf = [0u8; SACK_PACKET_LEN + 3];
        let p = SackPacketRepr {
            bth: bth(1),
            sack: SackRepr {
                msn: 0,
                bitmap: SackBitmap::default(),
            },
        };
        p.emit(&mut buf).unwrap();
        assert_eq!(
            SackPacketRepr::parse(&buf[..SACK_PACKET_LEN - 1]),
            Err(WireError::Truncated {
                need: SACK_PACKET_LEN,
                have: SACK_PACKET_LEN - 1
            })
        );
        assert_eq!(
            SackPacketRepr::parse(&buf),
            Err(WireError::UnexpectedPayload {
                opcode: Opcode::from(SACK_OPCODE),
                len: 3
            })
        );
        assert!(SackPacketRepr::parse(&buf[..BTH_LEN - 1]).is_err());
    }
}
