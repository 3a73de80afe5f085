//! ACK Extended Transport Header, 4 bytes: syndrome (1) · MSN (3) (rc-transport.md §1.4, §1.5).
//!
//! [`Syndrome`] is a lossless decoding of the syndrome byte: every `u8` maps to a variant and
//! back to the same byte, reserved encodings included. [`RnrTimer`] carries the §3.6 delay table
//! and [`Credits`] the §1.5 credit table. This module does not decide when to ACK or NAK.

use core::time::Duration;

use super::{AETH_LEN, WireError, header_view, read_u24, write_u24};

const SYNDROME: usize = 0;
const MSN: usize = 1;

const TYPE_MASK: u8 = 0x60;
const VALUE_MASK: u8 = 0x1F;
const TYPE_ACK: u8 = 0x00;
const TYPE_RNR_NAK: u8 = 0x20;
const TYPE_NAK: u8 = 0x60;
const RESERVED_BIT: u8 = 0x80;

/// An AETH credit code, 5 bits (rc-transport.md §1.5).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Credits(u8);

/// Receive WQEs advertised by credit codes 0..=30 (rc-transport.md §1.5).
const CREDIT_WQES: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

impl Credits {
    /// Code 0x1F: "invalid", i.e. no end-to-end flow control. rxe always sends it.
    pub const UNLIMITED: Credits = Credits(0x1F);

    /// The credit code in the low 5 bits of `code`.
    pub const fn from_code(code: u8) -> Credits {
        Credits(code & VALUE_MASK)
    }

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// True for [`Credits::UNLIMITED`].
    pub const fn is_unlimited(self) -> bool {
        self.0 == Self::UNLIMITED.0
    }

    /// Number of receive WQEs advertised; `None` when unlimited.
    pub fn wqes(self) -> Option<u32> {
        CREDIT_WQES.get(usize::from(self.0)).copied()
    }
}

/// A 5-bit RNR NAK timer code (rc-transport.md §3.6). Code 0 is the *longest* delay.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RnrTimer(u8);

/// RNR delays in microseconds indexed by code (rc-transport.md §3.6; code 25 is 61.44 ms).
const RNR_USEC: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

impl RnrTimer {
    /// The timer code in the low 5 bits of `code`.
    pub const fn from_code(code: u8) -> RnrTimer {
        RnrTimer(code & VALUE_MASK)
    }

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The delay this code stands for (rc-transport.md §3.6): code 0 = 655.36 ms,
    /// 1 = 10 µs, ..., 31 = 491.52 ms.
    pub const fn duration(self) -> Duration {
        Duration::from_micros(RNR_USEC[self.0 as usize] as u64)
    }
}

/// NAK codes, syndrome bits 6–5 = 11 (rc-transport.md §1.5). `u8::from` gives the whole
/// syndrome byte (0x60..=0x7F).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0x60: PSN sequence error.
    PsnSequenceError,
    /// 0x61: invalid request.
    InvalidRequest,
    /// 0x62: remote access error.
    RemoteAccessError,
    /// 0x63: remote operational error.
    RemoteOperationalError,
    /// 0x64: invalid RD request (RD transport only).
    InvalidRdRequest,
    /// A reserved NAK code, holding the syndrome byte (0x65..=0x7F).
    Reserved(u8),
}

impl From<NakCode> for u8 {
    fn from(code: NakCode) -> u8 {
        match code {
            NakCode::PsnSequenceError => 0x60,
            NakCode::InvalidRequest => 0x61,
            NakCode::RemoteAccessError => 0x62,
            NakCode::RemoteOperationalError => 0x63,
            NakCode::InvalidRdRequest => 0x64,
            NakCode::Reserved(v) => TYPE_NAK | (v & VALUE_MASK),
        }
    }
}

/// The AETH syndrome byte (rc-transport.md §1.5), decoded losslessly:
/// `u8::from(Syndrome::from(b)) == b` for every `b`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// 0x00–0x1F: ACK with a credit code.
    Ack {
        /// Advertised credits ([`Credits::UNLIMITED`] from rxe).
        credits: Credits,
    },
    /// 0x20–0x3F: receiver not ready; retry after `timer`.
    RnrNak {
        /// The responder's `min_rnr_timer`.
        timer: RnrTimer,
    },
    /// 0x60–0x7F: NAK.
    Nak(NakCode),
    /// Any byte with a reserved type: 0x40–0x5F, or bit 7 set. Holds the byte.
    Reserved(u8),
}

impl Syndrome {
    /// An ACK advertising unlimited credits, as rxe sends (rc-transport.md §1.5).
    pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack {
        credits: Credits::UNLIMITED,
    };
}

impl From<u8> for Syndrome {
    fn from(b: u8) -> Syndrome {
        let value = b & VALUE_MASK;
        if b & RESERVED_BIT != 0 {
            return Syndrome::Reserved(b);
        }
        match b & TYPE_MASK {
            TYPE_ACK => Syndrome::Ack {
                credits: Credits(value),
            },
            TYPE_RNR_NAK => Syndrome::RnrNak {
                timer: RnrTimer(value),
            },
            TYPE_NAK => Syndrome::Nak(match value {
                0x00 => NakCode::PsnSequenceError,
                0x01 => NakCode::InvalidRequest,
                0x02 => NakCode::RemoteAccessError,
                0x03 => NakCode::RemoteOperationalError,
                0x04 => NakCode::InvalidRdRequest,
                _ => NakCode::Reserved(b),
            }),
            _ => Syndrome::Reserved(b),
        }
    }
}

impl From<Syndrome> for u8 {
    fn from(s: Syndrome) -> u8 {
        match s {
            Syndrome::Ack { credits } => TYPE_ACK | credits.0,
            Syndrome::RnrNak { timer } => TYPE_RNR_NAK | timer.0,
            Syndrome::Nak(code) => code.into(),
            Syndrome::Reserved(b) => b,
        }
    }
}

header_view!(
    /// A view over an AETH (rc-transport.md §1.4).
    Aeth,
    AETH_LEN
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// Byte 0, decoded.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from(self.buffer.as_ref()[SYNDROME])
    }

    /// Bytes 1–3: MSN, 24 bits.
    pub fn msn(&self) -> u32 {
        read_u24(self.buffer.as_ref(), MSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Sets byte 0.
    pub fn set_syndrome(&mut self, s: Syndrome) {
        self.buffer.as_mut()[SYNDROME] = s.into();
    }

    /// Sets the MSN from the low 24 bits of `msn`.
    pub fn set_msn(&mut self, msn: u32) {
        write_u24(self.buffer.as_mut(), MSN, msn);
    }
}

/// Parsed AETH (rc-transport.md §1.4, §1.5).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// ACK / RNR NAK / NAK syndrome.
    pub syndrome: Syndrome,
    /// Message sequence number, 24 bits; emit uses the low 24 bits.
    pub msn: u32,
}

impl AethRepr {
    /// Parses an AETH view; [`WireError::Truncated`] if short. Every syndrome byte is accepted.
    pub fn parse<T: AsRef<[u8]>>(aeth: &Aeth<T>) -> Result<AethRepr, WireError> {
        aeth.check_len()?;
        Ok(AethRepr {
            syndrome: aeth.syndrome(),
            msn: aeth.msn(),
        })
    }

    /// Writes all 4 bytes. Panics if the view is shorter than [`AETH_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, aeth: &mut Aeth<T>) {
        aeth.set_syndrome(self.syndrome);
        aeth.set_msn(self.msn);
    }

    /// Emitted length: [`AETH_LEN`].
    pub const fn buffer_len(&self) -> usize {
        AETH_LEN
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn syndrome_byte_round_trip() {
        for b in 0..=u8::MAX {
            assert_eq!(u8::from(Syndrome::from(b)), b, "{b:#04x}");
        }
        assert_eq!(Syndrome::from(0x1F), Syndrome::ACK_UNLIMITED);
        assert_eq!(
            Syndrome::from(0x2C),
            Syndrome::RnrNak {
                timer: RnrTimer::from_code(12)
            }
        );
        assert_eq!(
            Syndrome::from(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            Syndrome::from(0x64),
            Syndrome::Nak(NakCode::InvalidRdRequest)
        );
        assert_eq!(Syndrome::from(0x65), Syndrome::Nak(NakCode::Reserved(0x65)));
        assert_eq!(Syndrome::from(0x40), Syndrome::Reserved(0x40));
        assert_eq!(Syndrome::from(0x9F), Syndrome::Reserved(0x9F));
    }

    #[test]
    fn rnr_table() {
        let ms = |c| RnrTimer::from_code(c).duration();
        assert_eq!(ms(0), Duration::from_micros(655_360));
        assert_eq!(ms(1), Duration::from_micros(10));
        assert_eq!(ms(12), Duration::from_micros(640));
        assert_eq!(ms(25), Duration::from_micros(61_440));
        assert_eq!(ms(31), Duration::from_micros(491_520));
        assert_eq!(RnrTimer::from_code(0x3F).code(), 0x1F);
        for c in 2..32 {
            assert!(ms(c) > ms(c - 1), "monotonic from code 1");
        }
    }

    #[test]
    fn credits() {
        assert!(Credits::UNLIMITED.is_unlimited());
        assert_eq!(Credits::UNLIMITED.wqes(), None);
        assert_eq!(Credits::from_code(0).wqes(), Some(0));
        assert_eq!(Credits::from_code(5).wqes(), Some(6));
        assert_eq!(Credits::from_code(30).wqes(), Some(32768));
    }

    #[test]
    fn bytes() {
        let buf = [0x60, 0x00, 0x01, 0x02];
        let aeth = Aeth::new_checked(&buf[..]).unwrap();
        let repr = AethRepr::parse(&aeth).unwrap();
        assert_eq!(
            repr,
            AethRepr {
                syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                msn: 0x102
            }
        );
        let mut out = [0; 4];
        AethRepr {
            syndrome: Syndrome::ACK_UNLIMITED,
            msn: 0xAB_CDEF,
        }
        .emit(&mut Aeth::new_unchecked(&mut out));
        assert_eq!(out, [0x1F, 0xAB, 0xCD, 0xEF]);
        assert!(Aeth::new_checked(&buf[..3]).is_err());
        assert_eq!(repr.buffer_len(), AETH_LEN);
    }

    /// The rows of rc-transport.md §1.5 at their edges: the type in bits 6–5, the credit code,
    /// RNR timer code or NAK code in bits 4–0, and bit 7 and type 10 reserved.
    #[test]
    fn syndrome_bytes_decode_by_the_spec_table() {
        let ack = |c| Syndrome::Ack {
            credits: Credits::from_code(c),
        };
        let rnr = |c| Syndrome::RnrNak {
            timer: RnrTimer::from_code(c),
        };
        let rows = [
            (0x00, ack(0)),
            (0x05, ack(5)),
            (0x1E, ack(30)),
            (0x1F, Syndrome::ACK_UNLIMITED),
            (0x20, rnr(0)),
            (0x2C, rnr(12)),
            (0x3F, rnr(31)),
            (0x40, Syndrome::Reserved(0x40)),
            (0x5F, Syndrome::Reserved(0x5F)),
            (0x60, Syndrome::Nak(NakCode::PsnSequenceError)),
            (0x61, Syndrome::Nak(NakCode::InvalidRequest)),
            (0x62, Syndrome::Nak(NakCode::RemoteAccessError)),
            (0x63, Syndrome::Nak(NakCode::RemoteOperationalError)),
            (0x64, Syndrome::Nak(NakCode::InvalidRdRequest)),
            (0x65, Syndrome::Nak(NakCode::Reserved(0x65))),
            (0x7F, Syndrome::Nak(NakCode::Reserved(0x7F))),
            (0x80, Syndrome::Reserved(0x80)),
            (0x9F, Syndrome::Reserved(0x9F)),
            (0xE1, Syndrome::Reserved(0xE1)),
            (0xFF, Syndrome::Reserved(0xFF)),
        ];
        for (byte, syndrome) in rows {
            assert_eq!(Syndrome::from(byte), syndrome, "{byte:#04x}");
            assert_eq!(u8::from(syndrome), byte, "{syndrome:?}");
            let mut out = [0xAA; 4];
            AethRepr { syndrome, msn: 0 }.emit(&mut Aeth::new_unchecked(&mut out));
            assert_eq!(out, [byte, 0, 0, 0]);
        }
        // A NAK code's byte keeps only its low 5 bits under type 11.
        assert_eq!(u8::from(NakCode::Reserved(0xE5)), 0x65);
    }

    /// rc-transport.md §1.5: codes 0..=30 advertise the table's WQE counts, 31 is "invalid"
    /// (no end-to-end flow control); a code is 5 bits.
    #[test]
    fn credit_codes_by_the_spec_table() {
        let wqes = [
            0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
            1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
        ];
        for (code, n) in (0u8..).zip(wqes) {
            let c = Credits::from_code(code | 0xE0);
            assert_eq!(
                (c.code(), c.wqes(), c.is_unlimited()),
                (code, Some(n), false)
            );
        }
        let c = Credits::from_code(0xFF);
        assert_eq!((c.code(), c.wqes(), c), (31, None, Credits::UNLIMITED));
        assert_eq!(RnrTimer::from_code(0xE5).code(), 5);
    }
}
