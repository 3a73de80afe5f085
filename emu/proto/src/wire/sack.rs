//! The selective ACK of softverbs' selective-repeat extension (rc-transport.md "softverbs
//! extensions"): a manufacturer-specific BTH opcode followed by a 20-byte SACK extended
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
//! | 4–19  | bitmap, big-endian: bit *i* (LSB = 0) set = PSN `bth.psn + 1 + i` received |
//!
//! What it is not: it carries no credits and no NAK codes; errors still travel as IBTA NAKs.

use super::{
    BTH_LEN, Bth, BthRepr, ICRC_LEN, Opcode, WireError, header_view, read, read_u24, write_u24,
};

/// The BTH opcode of a selective ACK: manufacturer-specific range 0xE0 + ACKNOWLEDGE's 0x11.
pub const SACK_OPCODE: u8 = 0xF1;

/// SACK extended header length in bytes.
pub const SACK_ETH_LEN: usize = 20;

/// Length of a whole SACK packet (BTH, SACK ETH, ICRC; no payload, no pad).
pub const SACK_PACKET_LEN: usize = BTH_LEN + SACK_ETH_LEN + ICRC_LEN;

/// PSNs after the BTH PSN one SACK can describe.
pub const SACK_SPAN: u32 = 128;

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

    /// Bytes 4–19: the received-PSN bitmap.
    pub fn bitmap(&self) -> u128 {
        u128::from_be_bytes(read(self.buffer.as_ref(), 4))
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
    pub fn set_bitmap(&mut self, bitmap: u128) {
        self.buffer.as_mut()[4..20].copy_from_slice(&bitmap.to_be_bytes());
    }
}

/// A parsed SACK extended header.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct SackRepr {
    /// The responder's MSN (24 bits).
    pub msn: u32,
    /// Bit *i* set: PSN `bth.psn + 1 + i` was received.
    pub bitmap: u128,
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

    /// Writes all 20 bytes. Panics if the view is shorter than [`SACK_ETH_LEN`].
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
        i < SACK_SPAN && self.bitmap >> i & 1 == 1
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
        BthRepr {
            opcode: Opcode::from(SACK_OPCODE),
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: BthRepr::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: 0x12,
            ack_req: false,
            psn: Psn::new(psn),
        }
    }

    #[test]
    fn round_trip_and_layout() {
        let p = SackPacketRepr {
            bth: bth(0xAB_CDEF),
            sack: SackRepr {
                msn: 0x01_0203,
                bitmap: 1 | 1 << 127,
            },
        };
        let mut buf = [0xFFu8; SACK_PACKET_LEN + 4];
        assert_eq!(p.emit(&mut buf).unwrap(), SACK_PACKET_LEN);
        assert_eq!(buf[0], SACK_OPCODE);
        assert_eq!(&buf[BTH_LEN..BTH_LEN + 4], &[0, 1, 2, 3]);
        assert_eq!(buf[BTH_LEN + 4], 0x80);
        assert_eq!(buf[BTH_LEN + 19], 0x01);
        assert_eq!(SackPacketRepr::parse(&buf[..SACK_PACKET_LEN]).unwrap(), p);
        assert!(p.sack.has(0) && p.sack.has(127) && !p.sack.has(1) && !p.sack.has(128));
    }

    #[test]
    fn other_opcodes_lengths_are_typed_errors() {
        let mut buf = [0u8; SACK_PACKET_LEN];
        let p = SackPacketRepr {
            bth: bth(1),
            sack: SackRepr { msn: 0, bitmap: 0 },
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
}
