//! Property tests for the RoCEv2 wire codec (rc-transport.md §1, §2): round trips at header and
//! packet level (ICRC included), totality of parsing on arbitrary bytes, ICRC masking, PSN
//! serial arithmetic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, Ipv6Addr};

use emu_proto::wire::{
    ALL_RC, Aeth, AethRepr, AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr, Bth, BthRepr,
    Deth, DethRepr, ICRC_LEN, Ieth, IethRepr, ImmDt, ImmDtRepr, IpAddrs, IpContext, Opcode, Packet,
    PacketRepr, Psn, Reth, RethRepr, SACK_OPCODE, SACK_PACKET_LEN, SackBitmap, SackPacketRepr,
    SackRepr, Syndrome, WireError, check_icrc, compute_icrc, pad_len,
};
use proptest::prelude::*;
use proptest::sample::select;

fn arb_bth() -> impl Strategy<Value = BthRepr> {
    (
        select(ALL_RC.to_vec()),
        any::<[bool; 5]>(),
        0u8..4,
        any::<u16>(),
        0u32..=0xFF_FFFF,
        any::<u32>(),
    )
        .prop_map(
            |(opcode, [solicited, mig_req, fecn, becn, ack_req], pad_count, pkey, dest_qp, psn)| {
                BthRepr {
                    opcode,
                    solicited,
                    mig_req,
                    pad_count,
                    pkey,
                    fecn,
                    becn,
                    dest_qp,
                    ack_req,
                    psn: Psn::new(psn),
                }
            },
        )
}

fn arb_reth() -> impl Strategy<Value = RethRepr> {
    any::<(u64, u32, u32)>().prop_map(|(va, rkey, dma_len)| RethRepr { va, rkey, dma_len })
}

fn arb_aeth() -> impl Strategy<Value = AethRepr> {
    (any::<u8>(), 0u32..=0xFF_FFFF).prop_map(|(s, msn)| AethRepr {
        syndrome: Syndrome::from(s),
        msn,
    })
}

fn arb_atomic_eth() -> impl Strategy<Value = AtomicEthRepr> {
    any::<(u64, u32, u64, u64)>().prop_map(|(va, rkey, swap_add, compare)| AtomicEthRepr {
        va,
        rkey,
        swap_add,
        compare,
    })
}

fn arb_ctx() -> impl Strategy<Value = IpContext> {
    let v4 =
        (any::<[u8; 4]>(), any::<[u8; 4]>(), any::<u16>()).prop_map(|(s, d, ident)| IpAddrs::V4 {
            src: Ipv4Addr::from(s),
            dst: Ipv4Addr::from(d),
            ident,
        });
    let v6 = (any::<[u8; 16]>(), any::<[u8; 16]>()).prop_map(|(s, d)| IpAddrs::V6 {
        src: Ipv6Addr::from(s),
        dst: Ipv6Addr::from(d),
    });
    (prop_oneof![v4, v6], any::<u16>(), any::<u16>()).prop_map(|(addrs, src_port, dst_port)| {
        IpContext {
            addrs,
            src_port,
            dst_port,
        }
    })
}

/// Everything needed to build a valid `PacketRepr` (which borrows its payload).
#[derive(Debug, Clone)]
struct Parts {
    bth: BthRepr,
    reth: RethRepr,
    aeth: AethRepr,
    atomic_eth: AtomicEthRepr,
    orig: u64,
    imm: u32,
    ieth: u32,
    payload: Vec<u8>,
}

impl Parts {
    fn repr(&self) -> PacketRepr<'_> {
        let op = self.bth.opcode;
        let h = op.ext_headers().unwrap();
        let payload: &[u8] = if op.has_payload() { &self.payload } else { &[] };
        PacketRepr {
            reth: h.reth.then_some(self.reth),
            aeth: h.aeth.then_some(self.aeth),
            atomic_eth: h.atomic_eth.then_some(self.atomic_eth),
            atomic_ack_eth: h.atomic_ack_eth.then_some(AtomicAckEthRepr {
                orig_remote_data: self.orig,
            }),
            immdt: h.immdt.then_some(ImmDtRepr { imm: self.imm }),
            ieth: h.ieth.then_some(IethRepr { rkey: self.ieth }),
            ..PacketRepr::new(self.bth, payload)
        }
    }
}

fn arb_parts() -> impl Strategy<Value = Parts> {
    (
        arb_bth(),
        arb_reth(),
        arb_aeth(),
        arb_atomic_eth(),
        any::<(u64, u32, u32)>(),
        proptest::collection::vec(any::<u8>(), 0..600),
    )
        .prop_map(
            |(bth, reth, aeth, atomic_eth, (orig, imm, ieth), payload)| Parts {
                bth,
                reth,
                aeth,
                atomic_eth,
                orig,
                imm,
                ieth,
                payload,
            },
        )
}

fn emit(repr: &PacketRepr<'_>, ctx: &IpContext) -> Vec<u8> {
    let mut buf = vec![0; repr.buffer_len()];
    assert_eq!(repr.emit(ctx, &mut buf), Ok(buf.len()));
    buf
}

proptest! {
    #[test]
    fn bth_round_trip(repr in arb_bth(), junk in any::<u8>()) {
        let mut buf = [junk; 12];
        repr.emit(&mut Bth::new_checked(&mut buf[..]).unwrap());
        prop_assert_eq!(BthRepr::parse(&Bth::new_checked(&buf[..]).unwrap()), Ok(repr));
    }

    #[test]
    fn ext_header_round_trips(
        reth in arb_reth(),
        aeth in arb_aeth(),
        atomic in arb_atomic_eth(),
        (orig, imm, rkey, qkey, src_qp) in any::<(u64, u32, u32, u32, u32)>(),
    ) {
        let mut b = [0u8; 28];
        reth.emit(&mut Reth::new_checked(&mut b[..]).unwrap());
        prop_assert_eq!(RethRepr::parse(&Reth::new_checked(&b[..]).unwrap()), Ok(reth));
        aeth.emit(&mut Aeth::new_checked(&mut b[..]).unwrap());
        prop_assert_eq!(AethRepr::parse(&Aeth::new_checked(&b[..]).unwrap()), Ok(aeth));
        atomic.emit(&mut AtomicEth::new_checked(&mut b[..]).unwrap());
        prop_assert_eq!(AtomicEthRepr::parse(&AtomicEth::new_checked(&b[..]).unwrap()), Ok(atomic));
        let ack = AtomicAckEthRepr { orig_remote_data: orig };
        ack.emit(&mut AtomicAckEth::new_checked(&mut b[..]).unwrap());
        let parsed = AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&b[..]).unwrap());
        prop_assert_eq!(parsed, Ok(ack));
        let immdt = ImmDtRepr { imm };
        immdt.emit(&mut ImmDt::new_checked(&mut b[..]).unwrap());
        prop_assert_eq!(ImmDtRepr::parse(&ImmDt::new_checked(&b[..]).unwrap()), Ok(immdt));
        let ieth = IethRepr { rkey };
        ieth.emit(&mut Ieth::new_checked(&mut b[..]).unwrap());
        prop_assert_eq!(IethRepr::parse(&Ieth::new_checked(&b[..]).unwrap()), Ok(ieth));
        let deth = DethRepr { qkey, src_qp: src_qp & 0xFF_FFFF };
        deth.emit(&mut Deth::new_checked(&mut b[..]).unwrap());
        prop_assert_eq!(DethRepr::parse(&Deth::new_checked(&b[..]).unwrap()), Ok(deth));
    }

    #[test]
    fn packet_round_trip_with_icrc(parts in arb_parts(), ctx in arb_ctx()) {
        let repr = parts.repr();
        let buf = emit(&repr, &ctx);
        let parsed = PacketRepr::parse(&Packet::new_checked(&buf[..]).unwrap());
        prop_assert_eq!(parsed, Ok(repr));
        prop_assert_eq!(check_icrc(&ctx, &buf), Ok(()));
        prop_assert_eq!(usize::from(Bth::new_checked(&buf[..]).unwrap().pad_count()),
            usize::from(pad_len(repr.payload.len())));
    }

    /// Any single-byte change is detected, except in the masked BTH byte 4 (rc-transport.md §1.8).
    #[test]
    fn icrc_detects_corruption(
        parts in arb_parts(),
        ctx in arb_ctx(),
        pos in any::<prop::sample::Index>(),
        flip in 1u8..,
    ) {
        let mut buf = emit(&parts.repr(), &ctx);
        let body = buf.len() - ICRC_LEN;
        let at = pos.index(body);
        buf[at] ^= flip;
        let res = check_icrc(&ctx, &buf);
        if at == 4 {
            prop_assert_eq!(res, Ok(()));
        } else {
            let is_bad_icrc = matches!(res, Err(WireError::BadIcrc { .. }));
            prop_assert!(is_bad_icrc);
        }
    }

    /// The ICRC depends on the covered IP/UDP fields.
    #[test]
    fn icrc_covers_ports(parts in arb_parts(), ctx in arb_ctx(), delta in 1u16..) {
        let buf = emit(&parts.repr(), &ctx);
        let moved = IpContext { src_port: ctx.src_port.wrapping_add(delta), ..ctx };
        prop_assert_ne!(compute_icrc(&moved, &buf), compute_icrc(&ctx, &buf));
    }

    /// Every strict prefix shorter than headers + ICRC fails; no prefix panics.
    #[test]
    fn truncation_is_an_error(parts in arb_parts()) {
        let ctx = IpContext::v4(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 0xC000);
        let repr = parts.repr();
        let buf = emit(&repr, &ctx);
        let min = repr.bth.opcode.header_len().unwrap() + ICRC_LEN;
        for cut in 0..buf.len() {
            let res = PacketRepr::parse(&Packet::new_unchecked(&buf[..cut]));
            if cut < min {
                prop_assert!(res.is_err());
            }
            let _ = check_icrc(&ctx, &buf[..cut]);
        }
    }

    /// Parsing is total: arbitrary bytes give Ok or a typed error, never a panic; what parses
    /// re-emits to the same length when its pad is canonical.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let ctx = IpContext::v4(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 0xC000);
        let packet = Packet::new_unchecked(&bytes[..]);
        let _ = packet.payload();
        let _ = check_icrc(&ctx, &bytes);
        if let Ok(repr) = PacketRepr::parse(&packet) {
            prop_assert!(!repr.bth.opcode.is_unknown());
            if repr.bth.pad_count == pad_len(repr.payload.len()) {
                prop_assert_eq!(repr.buffer_len(), bytes.len());
            }
        }
    }

    /// Arbitrary bytes behind a valid BTH of each opcode (fuzzing the extension headers).
    #[test]
    fn arbitrary_body_never_panics(
        op in select(ALL_RC.to_vec()),
        flags in any::<u8>(),
        body in proptest::collection::vec(any::<u8>(), 0..80),
    ) {
        let mut bytes = vec![u8::from(op), flags & 0x30, 0xFF, 0xFF, 0, 0, 0, 1, 0, 0, 0, 1];
        bytes.extend_from_slice(&body);
        match PacketRepr::parse(&Packet::new_unchecked(&bytes[..])) {
            Ok(repr) => prop_assert_eq!(repr.bth.opcode, op),
            Err(e) => {
                let ok = matches!(e, WireError::Truncated { .. } | WireError::BadPad { .. }
                    | WireError::UnexpectedPayload { .. });
                prop_assert!(ok, "{e:?}");
            }
        }
    }

    #[test]
    fn unknown_opcodes_are_typed_errors(
        v in any::<u8>(),
        rest in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        prop_assume!(Opcode::from(v).is_unknown());
        let mut bytes = vec![v, 0, 0xFF, 0xFF, 0, 0, 0, 1, 0, 0, 0, 1];
        bytes.extend_from_slice(&rest);
        prop_assert_eq!(
            PacketRepr::parse(&Packet::new_unchecked(&bytes[..])),
            Err(WireError::UnknownOpcode(v))
        );
    }

    #[test]
    fn psn_serial_arithmetic(a in any::<u32>(), n in 0u32..0x80_0000) {
        let a = Psn::new(a);
        let b = a.wrapping_add(n);
        prop_assert_eq!(b.diff(a), n as i32);
        prop_assert_eq!(a.diff(b), -(n as i32));
        prop_assert_eq!(b.is_after(a), n != 0);
        prop_assert_eq!(a.is_before(b), n != 0);
        prop_assert!(b.value() <= 0xFF_FFFF);
    }

    /// The selective ACK (softverbs extension) round-trips with its ICRC; the BTH PSN, MSN and
    /// every bitmap bit survive.
    #[test]
    fn sack_round_trip(bth in arb_bth(), msn in 0u32..=0xFF_FFFF, words in any::<[u64; 8]>(), ctx in arb_ctx()) {
        let p = SackPacketRepr {
            bth: BthRepr { opcode: Opcode::from(SACK_OPCODE), pad_count: 0, ..bth },
            sack: SackRepr { msn, bitmap: SackBitmap(words) },
        };
        let mut buf = vec![0u8; SACK_PACKET_LEN];
        prop_assert_eq!(p.emit(&mut buf).unwrap(), SACK_PACKET_LEN);
        emu_proto::wire::fill_icrc(&ctx, &mut buf).unwrap();
        prop_assert!(check_icrc(&ctx, &buf).is_ok());
        prop_assert_eq!(SackPacketRepr::parse(&buf).unwrap(), p);
        // The IBTA parser never takes it for an RC packet.
        prop_assert_eq!(
            PacketRepr::parse(&Packet::new_unchecked(&buf[..])),
            Err(WireError::UnknownOpcode(SACK_OPCODE))
        );
    }

    /// SACK parsing is total: arbitrary bytes (with the SACK opcode or not) decode or give a
    /// typed error.
    #[test]
    fn sack_arbitrary_bytes_never_panic(
        sack_op in any::<bool>(),
        mut bytes in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        if sack_op {
            if let Some(b) = bytes.first_mut() {
                *b = SACK_OPCODE;
            }
        }
        if let Ok(p) = SackPacketRepr::parse(&bytes) {
            prop_assert_eq!(bytes.len(), SACK_PACKET_LEN);
            prop_assert_eq!(u8::from(p.bth.opcode), SACK_OPCODE);
        }
    }
}
