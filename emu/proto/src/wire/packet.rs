//! A whole RoCEv2 UDP payload: BTH ‖ extension headers ‖ payload ‖ pad ‖ ICRC
//! (rc-transport.md §1.1, §1.3, §1.6, §1.8).
//!
//! [`Packet`] is the view: it checks that the buffer is long enough for the headers the opcode
//! prescribes plus pad and ICRC, and borrows the payload without copying. [`PacketRepr`] is the
//! parsed form (RC opcodes only). Parsing does **not** verify the ICRC, because the receiver may
//! not know the IP headers it covers; call [`super::check_icrc`] where it does. Emission writes
//! the ICRC. Neither allocates. Sequencing rules (PSN order, FIRST/MIDDLE/LAST order, payload
//! length versus MTU) belong to the RC engine, not here.

use super::{
    AETH_LEN, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN, Aeth, AethRepr, AtomicAckEth, AtomicAckEthRepr,
    AtomicEth, AtomicEthRepr, BTH_LEN, Bth, BthRepr, ExtHeaders, ICRC_LEN, IETH_LEN, IMMDT_LEN,
    Ieth, IethRepr, ImmDt, ImmDtRepr, IpContext, RETH_LEN, Reth, RethRepr, WireError, fill_icrc,
};

/// The pad a payload of `payload_len` bytes needs: `(4 − len mod 4) mod 4` (rc-transport.md §1.6).
pub const fn pad_len(payload_len: usize) -> u8 {
    (payload_len.wrapping_neg() & 0x3) as u8
}

/// A view over a RoCEv2 UDP payload (rc-transport.md §1.1).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without validation. Accessors never panic; on a buffer that fails
    /// [`Packet::check_len`] the payload reads as empty.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after [`Packet::check_len`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks the structure: a BTH, a known RC opcode ([`WireError::UnknownOpcode`]), room for
    /// its extension headers plus the ICRC ([`WireError::Truncated`]), and PadCnt not exceeding
    /// the bytes left for payload and pad ([`WireError::BadPad`]).
    pub fn check_len(&self) -> Result<(), WireError> {
        let have = self.buffer.as_ref().len();
        let bth = Bth::new_checked(self.buffer.as_ref())?;
        let op = bth.opcode();
        let need = op.header_len().ok_or(WireError::UnknownOpcode(op.into()))? + ICRC_LEN;
        let avail = have
            .checked_sub(need)
            .ok_or(WireError::Truncated { need, have })?;
        let pad = bth.pad_count();
        if usize::from(pad) > avail {
            return Err(WireError::BadPad { pad, len: avail });
        }
        Ok(())
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The BTH view over the start of the buffer. Its accessors panic if the buffer is shorter
    /// than [`BTH_LEN`], which [`Packet::check_len`] excludes.
    pub fn bth(&self) -> Bth<&[u8]> {
        Bth::new_unchecked(self.buffer.as_ref())
    }

    /// Byte range of the payload (after the headers, before pad and ICRC); `None` if the
    /// packet fails [`Packet::check_len`].
    fn payload_range(&self) -> Option<core::ops::Range<usize>> {
        let b = self.buffer.as_ref();
        let bth = Bth::new_checked(b).ok()?;
        let start = bth.opcode().header_len()?;
        let end = b
            .len()
            .checked_sub(ICRC_LEN + usize::from(bth.pad_count()))?;
        (start <= end).then_some(start..end)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The payload, borrowed from the underlying buffer (zero-copy); empty if the packet fails
    /// [`Packet::check_len`].
    pub fn payload(&self) -> &'a [u8] {
        let b: &'a [u8] = self.buffer.as_ref();
        self.payload_range()
            .and_then(|r| b.get(r))
            .unwrap_or_default()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// A mutable BTH view, e.g. to patch a field before [`super::fill_icrc`]. Panics on access
    /// if the buffer is shorter than [`BTH_LEN`].
    pub fn bth_mut(&mut self) -> Bth<&mut [u8]> {
        Bth::new_unchecked(self.buffer.as_mut())
    }
}

/// A parsed RC packet (rc-transport.md §1.3): the BTH, the extension headers its opcode
/// carries (each `Some` exactly when [`super::Opcode::ext_headers`] says so) and the payload
/// borrowed from the input. Pad bytes and the ICRC are not represented: emission derives them.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct PacketRepr<'a> {
    /// Base transport header. On emit, `pad_count` must equal [`pad_len`] of the payload.
    pub bth: BthRepr,
    /// RETH, for RDMA_WRITE_FIRST/ONLY(_WITH_IMMEDIATE) and RDMA_READ_REQUEST.
    pub reth: Option<RethRepr>,
    /// AETH, for read responses except MIDDLE, ACKNOWLEDGE and ATOMIC_ACKNOWLEDGE.
    pub aeth: Option<AethRepr>,
    /// AtomicETH, for COMPARE_SWAP and FETCH_ADD.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AtomicAckETH, for ATOMIC_ACKNOWLEDGE.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// ImmDt, for the *_WITH_IMMEDIATE opcodes.
    pub immdt: Option<ImmDtRepr>,
    /// IETH, for the SEND_*_WITH_INVALIDATE opcodes.
    pub ieth: Option<IethRepr>,
    /// Payload bytes (empty for opcodes without payload).
    pub payload: &'a [u8],
}

/// Takes `len` bytes at `*at` and advances `*at`. Callers have sized `buf` from the same header
/// set, so the range is in bounds.
fn take<'b>(buf: &'b mut [u8], at: &mut usize, len: usize) -> &'b mut [u8] {
    let s = &mut buf[*at..*at + len];
    *at += len;
    s
}

impl<'a> PacketRepr<'a> {
    /// A packet with no extension headers and `bth.pad_count` set from the payload length;
    /// add extension headers with struct-update syntax.
    pub const fn new(bth: BthRepr, payload: &'a [u8]) -> PacketRepr<'a> {
        PacketRepr {
            bth: BthRepr {
                pad_count: pad_len(payload.len()),
                ..bth
            },
            reth: None,
            aeth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            payload,
        }
    }

    /// Parses a packet; total over all inputs, and calls [`Packet::check_len`] itself, so an
    /// unchecked view is fine. Errors: those of [`Packet::check_len`] and [`BthRepr::parse`],
    /// and [`WireError::UnexpectedPayload`] for payload on an opcode that carries none. The ICRC
    /// is not checked.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        packet: &Packet<&'a T>,
    ) -> Result<PacketRepr<'a>, WireError> {
        packet.check_len()?;
        let b: &'a [u8] = packet.buffer.as_ref();
        let bth = BthRepr::parse(&packet.bth())?;
        let op = bth.opcode;
        let hdrs = op
            .ext_headers()
            .ok_or(WireError::UnknownOpcode(op.into()))?;
        let mut at = BTH_LEN;
        let mut next = |present: bool, len: usize| -> Result<Option<&'a [u8]>, WireError> {
            if !present {
                return Ok(None);
            }
            let s = b.get(at..at + len).ok_or(WireError::Truncated {
                need: at + len,
                have: b.len(),
            })?;
            at += len;
            Ok(Some(s))
        };
        let reth = next(hdrs.reth, RETH_LEN)?
            .map(|s| RethRepr::parse(&Reth::new_unchecked(s)))
            .transpose()?;
        let aeth = next(hdrs.aeth, AETH_LEN)?
            .map(|s| AethRepr::parse(&Aeth::new_unchecked(s)))
            .transpose()?;
        let atomic_eth = next(hdrs.atomic_eth, ATOMIC_ETH_LEN)?
            .map(|s| AtomicEthRepr::parse(&AtomicEth::new_unchecked(s)))
            .transpose()?;
        let atomic_ack_eth = next(hdrs.atomic_ack_eth, ATOMIC_ACK_ETH_LEN)?
            .map(|s| AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(s)))
            .transpose()?;
        let immdt = next(hdrs.immdt, IMMDT_LEN)?
            .map(|s| ImmDtRepr::parse(&ImmDt::new_unchecked(s)))
            .transpose()?;
        let ieth = next(hdrs.ieth, IETH_LEN)?
            .map(|s| IethRepr::parse(&Ieth::new_unchecked(s)))
            .transpose()?;
        let payload = packet.payload();
        if !op.has_payload() && !payload.is_empty() {
            return Err(WireError::UnexpectedPayload {
                opcode: op,
                len: payload.len(),
            });
        }
        Ok(PacketRepr {
            bth,
            reth,
            aeth,
            atomic_eth,
            atomic_ack_eth,
            immdt,
            ieth,
            payload,
        })
    }

    /// The extension headers present in this repr.
    pub const fn ext_headers(&self) -> ExtHeaders {
        ExtHeaders {
            reth: self.reth.is_some(),
            aeth: self.aeth.is_some(),
            atomic_eth: self.atomic_eth.is_some(),
            atomic_ack_eth: self.atomic_ack_eth.is_some(),
            immdt: self.immdt.is_some(),
            ieth: self.ieth.is_some(),
        }
    }

    /// Bytes [`PacketRepr::emit`] writes: headers + payload + pad + ICRC, i.e. the UDP payload
    /// length.
    pub const fn buffer_len(&self) -> usize {
        let n = self.payload.len();
        BTH_LEN + self.ext_headers().len() + n + pad_len(n) as usize + ICRC_LEN
    }

    /// Writes the packet, zero pad bytes and the ICRC for `ip` into the start of `buf`, and
    /// returns [`PacketRepr::buffer_len`]. Errors, checked before anything is written:
    /// [`WireError::UnknownOpcode`], [`WireError::HeaderMismatch`] (extension headers differ
    /// from the opcode's), [`WireError::UnexpectedPayload`], [`WireError::BadPad`] (non-canonical
    /// `bth.pad_count`), [`WireError::Truncated`] (`buf` too small), [`WireError::TooLong`].
    pub fn emit(&self, ip: &IpContext, buf: &mut [u8]) -> Result<usize, WireError> {
        let n = self.payload.len();
        if self.bth.pad_count != pad_len(n) {
            return Err(WireError::BadPad {
                pad: self.bth.pad_count,
                len: n,
            });
        }
        let len = self.buffer_len();
        ip.udp_len(len)?;
        let have = buf.len();
        let out = buf
            .get_mut(..len)
            .ok_or(WireError::Truncated { need: len, have })?;
        let at = self.emit_headers(out)?;
        out[at..at + n].copy_from_slice(self.payload);
        out[at + n..len - ICRC_LEN].fill(0);
        fill_icrc(ip, out)?;
        Ok(len)
    }

    /// Writes only the BTH and extension headers into the start of `buf` and returns their
    /// length; the caller appends `payload_len` bytes (whatever `self.payload` holds is
    /// ignored), zero pad bytes as `bth.pad_count` says, and the ICRC ([`super::fill_icrc`]).
    /// This lets a sender copy the payload straight from memory into the datagram.
    /// Errors: [`WireError::UnknownOpcode`], [`WireError::HeaderMismatch`],
    /// [`WireError::UnexpectedPayload`] (payload on an opcode without one, judged from
    /// `self.payload`), [`WireError::Truncated`].
    pub fn emit_headers(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let op = self.bth.opcode;
        let hdrs = op
            .ext_headers()
            .ok_or(WireError::UnknownOpcode(op.into()))?;
        if hdrs != self.ext_headers() {
            return Err(WireError::HeaderMismatch(op));
        }
        let n = self.payload.len();
        if !op.has_payload() && n != 0 {
            return Err(WireError::UnexpectedPayload { opcode: op, len: n });
        }
        let len = BTH_LEN + self.ext_headers().len();
        let have = buf.len();
        let out = buf
            .get_mut(..len)
            .ok_or(WireError::Truncated { need: len, have })?;

        let mut at = 0;
        self.bth
            .emit(&mut Bth::new_unchecked(take(out, &mut at, BTH_LEN)));
        if let Some(h) = &self.reth {
            h.emit(&mut Reth::new_unchecked(take(out, &mut at, RETH_LEN)));
        }
        if let Some(h) = &self.aeth {
            h.emit(&mut Aeth::new_unchecked(take(out, &mut at, AETH_LEN)));
        }
        if let Some(h) = &self.atomic_eth {
            h.emit(&mut AtomicEth::new_unchecked(take(
                out,
                &mut at,
                ATOMIC_ETH_LEN,
            )));
        }
        if let Some(h) = &self.atomic_ack_eth {
            h.emit(&mut AtomicAckEth::new_unchecked(take(
                out,
                &mut at,
                ATOMIC_ACK_ETH_LEN,
            )));
        }
        if let Some(h) = &self.immdt {
            h.emit(&mut ImmDt::new_unchecked(take(out, &mut at, IMMDT_LEN)));
        }
        if let Some(h) = &self.ieth {
            h.emit(&mut Ieth::new_unchecked(take(out, &mut at, IETH_LEN)));
        }
        Ok(at)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use core::net::Ipv4Addr;

    use super::*;
    use crate::wire::{
        ALL_RC, Credits, NakCode, Opcode, Psn, RnrTimer, Syndrome, check_icrc, ip::udp_sport,
    };

    const CTX: IpContext = IpContext::v4(
        Ipv4Addr::new(127, 0, 0, 1),
        Ipv4Addr::new(127, 0, 0, 2),
        udp_sport(0x11, 0x12),
    );

    fn bth(opcode: Opcode) -> BthRepr {
        BthRepr {
            ack_req: true,
            ..BthRepr::new(opcode, 0x12, Psn::new(0x10))
        }
    }

    /// A valid repr for every RC opcode, with `payload` where the opcode allows one.
    fn sample(op: Opcode, payload: &[u8]) -> PacketRepr<'_> {
        let h = op.ext_headers().unwrap();
        let payload = if op.has_payload() { payload } else { &[] };
        PacketRepr {
            reth: h.reth.then_some(RethRepr {
                va: 0x1000,
                rkey: 0x2222,
                dma_len: 3,
            }),
            aeth: h.aeth.then_some(AethRepr {
                syndrome: Syndrome::ACK_UNLIMITED,
                msn: 7,
            }),
            atomic_eth: h.atomic_eth.then_some(AtomicEthRepr {
                va: 0x2000,
                rkey: 0x3333,
                swap_add: 1,
                compare: 2,
            }),
            atomic_ack_eth: h.atomic_ack_eth.then_some(AtomicAckEthRepr {
                orig_remote_data: 9,
            }),
            immdt: h.immdt.then_some(ImmDtRepr { imm: 0xAABB_CCDD }),
            ieth: h.ieth.then_some(IethRepr { rkey: 0x4444 }),
            ..PacketRepr::new(bth(op), payload)
        }
    }

    #[test]
    fn send_only_known_bytes() {
        let repr = PacketRepr::new(bth(Opcode::SendOnly), b"hello");
        let mut buf = [0; 64];
        let n = repr.emit(&CTX, &mut buf).unwrap();
        assert_eq!(n, 12 + 5 + 3 + 4);
        assert_eq!(
            buf[..20],
            [
                0x04, 0x30, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x12, 0x80, 0x00, 0x00, 0x10, b'h', b'e',
                b'l', b'l', b'o', 0, 0, 0
            ]
        );
        assert_eq!(check_icrc(&CTX, &buf[..n]), Ok(()));
        let parsed = PacketRepr::parse(&Packet::new_unchecked(&buf[..n])).unwrap();
        assert_eq!(parsed, repr);
        assert_eq!(parsed.payload.as_ptr(), buf[12..].as_ptr(), "zero-copy");
    }

    #[test]
    fn every_opcode_round_trips_with_header_layout() {
        for op in ALL_RC {
            let repr = sample(op, b"abcdef");
            let mut buf = [0; 128];
            let n = repr.emit(&CTX, &mut buf).unwrap();
            assert_eq!(n, repr.buffer_len());
            let expected_payload = if op.has_payload() { 6 + 2 } else { 0 };
            assert_eq!(
                n,
                op.header_len().unwrap() + expected_payload + ICRC_LEN,
                "{op:?}"
            );
            let packet = Packet::new_checked(&buf[..n]).unwrap();
            assert_eq!(PacketRepr::parse(&packet), Ok(repr), "{op:?}");
            assert_eq!(check_icrc(&CTX, &buf[..n]), Ok(()));
        }
    }

    #[test]
    fn write_only_with_immediate_layout() {
        // RETH then ImmDt (rc-transport.md §1.3, 0x0B: 32 header bytes).
        let repr = sample(Opcode::RdmaWriteOnlyWithImmediate, b"xyz");
        let mut buf = [0; 64];
        let n = repr.emit(&CTX, &mut buf).unwrap();
        assert_eq!(n, 32 + 3 + 1 + 4);
        assert_eq!(
            buf[12..28],
            [0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x22, 0x22, 0, 0, 0, 3]
        );
        assert_eq!(buf[28..32], [0xAA, 0xBB, 0xCC, 0xDD]);
        assert_eq!(&buf[32..36], b"xyz\0");
    }

    #[test]
    fn nak_syndromes_round_trip() {
        for syndrome in [
            Syndrome::Nak(NakCode::PsnSequenceError),
            Syndrome::Nak(NakCode::RemoteAccessError),
            Syndrome::RnrNak {
                timer: RnrTimer::from_code(12),
            },
            Syndrome::Ack {
                credits: Credits::from_code(3),
            },
        ] {
            let repr = PacketRepr {
                aeth: Some(AethRepr { syndrome, msn: 1 }),
                ..PacketRepr::new(bth(Opcode::Acknowledge), &[])
            };
            let mut buf = [0; 20];
            let n = repr.emit(&CTX, &mut buf).unwrap();
            assert_eq!(n, 20);
            assert_eq!(buf[12], u8::from(syndrome));
            assert_eq!(
                PacketRepr::parse(&Packet::new_unchecked(&buf[..])),
                Ok(repr)
            );
        }
    }

    #[test]
    fn parse_errors() {
        let mut buf = [0; 64];
        let n = sample(Opcode::RdmaWriteFirst, &[1; 8])
            .emit(&CTX, &mut buf)
            .unwrap();
        let good = &buf[..n];
        fn parse(b: &[u8]) -> Result<PacketRepr<'_>, WireError> {
            PacketRepr::parse(&Packet::new_unchecked(b))
        }
        for cut in 0..n - 12 {
            assert!(parse(&good[..cut]).is_err(), "truncated to {cut}");
        }
        assert_eq!(
            parse(&good[..31]),
            Err(WireError::Truncated { need: 32, have: 31 })
        );

        // Pad count larger than the bytes between headers and ICRC.
        let ack = sample(Opcode::Acknowledge, &[]);
        let mut b = [0; 20];
        ack.emit(&CTX, &mut b).unwrap();
        Packet::new_unchecked(&mut b[..]).bth_mut().set_pad_count(1);
        assert_eq!(parse(&b), Err(WireError::BadPad { pad: 1, len: 0 }));

        // Unknown opcodes: reserved RC value, UC, CNP.
        for v in [0x15, 0x24, 0x81, 0xFF] {
            b[0] = v;
            assert_eq!(parse(&b), Err(WireError::UnknownOpcode(v)));
        }

        // TVer != 0.
        let mut t = [0; 20];
        ack.emit(&CTX, &mut t).unwrap();
        Packet::new_unchecked(&mut t[..]).bth_mut().set_tver(2);
        assert_eq!(parse(&t), Err(WireError::BadTver(2)));

        // Stray payload on an ACK.
        let mut long = [0; 24];
        long[..16].copy_from_slice(&t[..16]);
        long[1] = 0;
        assert_eq!(
            parse(&long),
            Err(WireError::UnexpectedPayload {
                opcode: Opcode::Acknowledge,
                len: 4
            })
        );
        assert_eq!(Packet::new_unchecked(&long[..3]).payload(), &[] as &[u8]);
    }

    #[test]
    fn emit_errors() {
        let mut buf = [0; 64];
        let mut repr = sample(Opcode::SendOnly, b"abc");
        repr.bth.pad_count = 0;
        assert_eq!(
            repr.emit(&CTX, &mut buf),
            Err(WireError::BadPad { pad: 0, len: 3 })
        );
        let repr = PacketRepr::new(bth(Opcode::RdmaWriteOnly), b"abc");
        assert_eq!(
            repr.emit(&CTX, &mut buf),
            Err(WireError::HeaderMismatch(Opcode::RdmaWriteOnly))
        );
        let repr = PacketRepr::new(bth(Opcode::RdmaReadRequest), b"abc");
        assert!(repr.emit(&CTX, &mut buf).is_err());
        let repr = PacketRepr::new(bth(Opcode::Unknown(0x64)), &[]);
        assert_eq!(
            repr.emit(&CTX, &mut buf),
            Err(WireError::UnknownOpcode(0x64))
        );
        let repr = sample(Opcode::SendOnly, b"abc");
        assert_eq!(
            repr.emit(&CTX, &mut buf[..19]),
            Err(WireError::Truncated { need: 20, have: 19 })
        );
        let big = [0; 0x1_0000];
        let repr = PacketRepr::new(bth(Opcode::SendOnly), &big);
        let mut out = [0; 0x1_0020];
        assert_eq!(repr.emit(&CTX, &mut out), Err(WireError::TooLong(0x1_0010)));
    }

    #[test]
    fn pad_lengths() {
        assert_eq!([0, 1, 2, 3, 4, 5].map(pad_len), [0, 3, 2, 1, 0, 3]);
    }
}
