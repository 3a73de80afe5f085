//! What the engine says about its packets (issue 13, item 3): every transmit carries its
//! packet's class (request, data-carrying response, bare ACK/NAK), and every received packet
//! the device discards is counted under its cause ([`RxDropCause`]) as well as in the older
//! counter that has always counted it.
//!
//! The class of every packet any `Pair` test emits is also checked against its opcode in
//! `common::Pair::transmit_at_most`; the tests here make sure each class occurs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use common::{Dir, Pair, Side, bth, ip_ctx};
use emu_proto::wire::{AethRepr, AtomicEthRepr, Opcode, Packet, PacketRepr, RethRepr, Syndrome};
use emu_proto::{PacketClass, RxDropCause, Stats};
use verbs_api::{QpAttr, QpAttrMask, QpState, SendOp, SendWr};

/// a's first PSN (b's expected PSN) with the default options.
const P: u32 = 0x100;

/// The classes of the traced packets in direction `dir`.
fn classes(p: &Pair, dir: Dir) -> Vec<(Opcode, PacketClass)> {
    p.trace
        .iter()
        .zip(&p.classes)
        .filter(|((s, _), _)| s.dir == dir)
        .map(|((s, _), c)| (s.op, *c))
        .collect()
}

#[test]
fn send_is_a_request_and_its_ack_an_ack() {
    let mut p = Pair::new();
    let r = p.b.at(0, 64);
    p.b.post_recv(1, &[r]);
    let s = p.a.at(0, 64);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_until_idle());
    assert_eq!(
        classes(&p, Dir::AtoB),
        [(Opcode::SendOnly, PacketClass::Request)]
    );
    assert_eq!(
        classes(&p, Dir::BtoA),
        [(Opcode::Acknowledge, PacketClass::Ack)]
    );
}

#[test]
fn read_and_atomic_answers_are_responses() {
    let mut p = Pair::new();
    let (read_va, atomic_va, rkey) = (p.b.va(0), p.b.va(4096), p.b.mr.rkey);
    let read_dst = p.a.at(0, 600);
    let atomic_dst = p.a.at(1024, 8);
    p.post_a(&[
        SendWr::new(
            1,
            SendOp::RdmaRead {
                remote_addr: read_va,
                rkey,
            },
            &[read_dst],
        ),
        SendWr::new(
            2,
            SendOp::AtomicFetchAndAdd {
                remote_addr: atomic_va,
                rkey,
                add: 5,
            },
            &[atomic_dst],
        ),
    ]);
    assert!(p.run_until_idle());
    let requests = classes(&p, Dir::AtoB);
    assert_eq!(
        requests,
        [
            (Opcode::RdmaReadRequest, PacketClass::Request),
            (Opcode::FetchAdd, PacketClass::Request),
        ]
    );
    // 600 bytes at MTU 256: FIRST, MIDDLE, LAST, then the atomic's answer.
    assert_eq!(
        classes(&p, Dir::BtoA),
        [
            (Opcode::RdmaReadResponseFirst, PacketClass::Response),
            (Opcode::RdmaReadResponseMiddle, PacketClass::Response),
            (Opcode::RdmaReadResponseLast, PacketClass::Response),
            (Opcode::AtomicAcknowledge, PacketClass::Response),
        ]
    );
}

#[test]
fn naks_are_acks() {
    let mut p = Pair::new();
    // No receive WQE at b: an RNR NAK.
    let s = p.a.at(0, 8);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    p.flush();
    // A gap: a sequence NAK.
    p.inject_pkt(&send_only(&p, P + 5));
    p.flush();
    let back = classes(&p, Dir::BtoA);
    assert_eq!(back.len(), 2);
    assert!(
        back.iter()
            .all(|c| *c == (Opcode::Acknowledge, PacketClass::Ack))
    );
    let seen = p.seen(Dir::BtoA);
    assert!(seen[0].is_rnr());
    assert!(seen[1].is_nak());
}

// ---- drop causes --------------------------------------------------------------------------

/// A crafted SEND ONLY (8 bytes, AckReq) from a's QP to b's with PSN `psn`.
fn send_only(p: &Pair, psn: u32) -> common::Pkt {
    let repr = PacketRepr::new(bth(Opcode::SendOnly, p.b.qpn, psn, true), &[7; 8]);
    p.craft(Dir::AtoB, &repr)
}

/// Re-seals `pkt` after `edit` changed its bytes.
fn edited(mut pkt: common::Pkt, edit: impl FnOnce(&mut Vec<u8>)) -> common::Pkt {
    edit(&mut pkt.bytes);
    pkt.reseal();
    pkt
}

/// Asserts that `stats` counts `n` drops for `cause` and none for any other cause.
fn only(stats: &Stats, cause: RxDropCause, n: u64) {
    for (c, count) in stats.rx_drops.iter() {
        let want = if c == cause { n } else { 0 };
        assert_eq!(
            count,
            want,
            "{} drops (expected only {})",
            c.name(),
            cause.name()
        );
    }
    assert_eq!(stats.rx_drops.total(), n);
}

/// b's device counters after `f` handed it packets; b's posts one receive WQE first.
fn b_after(f: impl FnOnce(&mut Pair)) -> (Pair, Stats) {
    let mut p = Pair::new();
    let r = p.b.at(0, 64);
    p.b.post_recv(1, &[r]);
    f(&mut p);
    let stats = p.b.hca.stats();
    (p, stats)
}

#[test]
fn foreign_address_family_is_counted() {
    let (_, s) = b_after(|p| {
        let src = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 4791);
        let bytes = send_only(p, P).bytes;
        p.inject(Side::B, src, &bytes);
    });
    only(&s, RxDropCause::AddressFamily, 1);
    assert_eq!(s.dropped, 1);
}

#[test]
fn bad_icrc_is_counted() {
    let (_, s) = b_after(|p| {
        let mut pkt = send_only(p, P);
        let last = pkt.bytes.len() - 1;
        pkt.bytes[last] ^= 1;
        p.inject_pkt(&pkt);
    });
    only(&s, RxDropCause::BadIcrc, 1);
    assert_eq!((s.icrc_errors, s.dropped), (1, 0));
}

#[test]
fn unparsable_packet_is_malformed() {
    let (_, s) = b_after(|p| {
        // 0x64 is a UD SEND ONLY: not an RC opcode, so the codec refuses it.
        let pkt = edited(send_only(p, P), |b| b[0] = 0x64);
        assert!(PacketRepr::parse(&Packet::new_unchecked(&pkt.bytes[..])).is_err());
        p.inject_pkt(&pkt);
    });
    only(&s, RxDropCause::Malformed, 1);
    assert_eq!(s.dropped, 1);
}

#[test]
fn reserved_syndrome_is_malformed() {
    let mut p = Pair::new();
    // PSN P-1 is inside a's window (the last acknowledged PSN) while nothing is outstanding.
    let repr = PacketRepr {
        aeth: Some(AethRepr {
            syndrome: Syndrome::Reserved(0x40),
            msn: 0,
        }),
        ..PacketRepr::new(bth(Opcode::Acknowledge, p.a.qpn, P - 1, false), &[])
    };
    let pkt = p.craft(Dir::BtoA, &repr);
    p.inject_pkt(&pkt);
    let s = p.a.hca.stats();
    only(&s, RxDropCause::Malformed, 1);
    assert_eq!(s.dropped, 1);
}

#[test]
fn unknown_qp_is_counted() {
    let (_, s) = b_after(|p| {
        let repr = PacketRepr::new(bth(Opcode::SendOnly, p.b.qpn + 100, P, true), &[1; 8]);
        let pkt = p.craft(Dir::AtoB, &repr);
        p.inject_pkt(&pkt);
    });
    only(&s, RxDropCause::UnknownQp, 1);
    assert_eq!(s.dropped, 1);
}

#[test]
fn qp_in_err_is_wrong_state() {
    let (p, s) = b_after(|p| {
        let err = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let now = p.now;
        p.b.modify(now, &err, QpAttrMask::STATE).unwrap();
        p.inject_pkt(&send_only(p, P));
    });
    only(&s, RxDropCause::WrongState, 1);
    assert_eq!(s.dropped, 1);
    assert_eq!(
        p.b.stats().rx_drops.get(RxDropCause::WrongState),
        1,
        "per QP"
    );
}

#[test]
fn foreign_source_is_counted() {
    let (_, s) = b_after(|p| {
        let src = SocketAddr::new(Ipv4Addr::new(127, 0, 0, 9).into(), 50000);
        let dst = SocketAddr::new(p.b.ip.into(), common::PORT);
        let repr = PacketRepr::new(bth(Opcode::SendOnly, p.b.qpn, P, true), &[1; 8]);
        let mut bytes = vec![0u8; repr.buffer_len()];
        repr.emit(&ip_ctx(src, dst), &mut bytes).unwrap();
        p.inject(Side::B, src, &bytes);
    });
    only(&s, RxDropCause::WrongSource, 1);
    assert_eq!(s.dropped, 1);
}

#[test]
fn foreign_pkey_is_counted() {
    let (_, s) = b_after(|p| {
        let mut hdr = bth(Opcode::SendOnly, p.b.qpn, P, true);
        hdr.pkey = 0x8001;
        let pkt = p.craft(Dir::AtoB, &PacketRepr::new(hdr, &[1; 8]));
        p.inject_pkt(&pkt);
    });
    only(&s, RxDropCause::BadPkey, 1);
    assert_eq!(s.dropped, 1);
}

#[test]
fn full_response_queue_is_responder_busy() {
    // 256 zero-length READs queue 256 responses that b never gets to send; the 257th request
    // finds the queue full.
    let (_, s) = b_after(|p| {
        for i in 0..257 {
            let repr = PacketRepr {
                reth: Some(RethRepr {
                    va: 0,
                    rkey: 0,
                    dma_len: 0,
                }),
                ..PacketRepr::new(bth(Opcode::RdmaReadRequest, p.b.qpn, P + i, true), &[])
            };
            let pkt = p.craft(Dir::AtoB, &repr);
            p.inject_pkt(&pkt);
        }
    });
    only(&s, RxDropCause::ResponderBusy, 1);
    assert_eq!(s.dropped, 1);
}

#[test]
fn psn_gap_is_out_of_sequence() {
    let (_, s) = b_after(|p| {
        p.inject_pkt(&send_only(p, P + 3));
        p.inject_pkt(&send_only(p, P + 4));
    });
    only(&s, RxDropCause::OutOfSequence, 2);
    assert_eq!(
        (s.out_of_seq_request, s.seq_naks_sent, s.dropped),
        (2, 1, 0)
    );
}

#[test]
fn unanswerable_duplicate_is_counted() {
    let (_, s) = b_after(|p| {
        // An atomic before ePSN that b never executed: nothing to replay.
        let repr = PacketRepr {
            atomic_eth: Some(AtomicEthRepr {
                va: p.b.va(0),
                rkey: p.b.mr.rkey,
                swap_add: 1,
                compare: 0,
            }),
            ..PacketRepr::new(bth(Opcode::FetchAdd, p.b.qpn, P - 1, true), &[])
        };
        let pkt = p.craft(Dir::AtoB, &repr);
        p.inject_pkt(&pkt);
        // A duplicate SEND is answered (re-ACKed), not dropped.
        p.inject_pkt(&send_only(p, P));
        p.inject_pkt(&send_only(p, P));
    });
    only(&s, RxDropCause::DuplicateRequest, 1);
    assert_eq!((s.duplicate_request, s.dropped), (2, 0));
}

#[test]
fn send_without_receive_wqe_is_receiver_not_ready() {
    let mut p = Pair::new();
    p.inject_pkt(&send_only(&p, P));
    let s = p.b.hca.stats();
    only(&s, RxDropCause::ReceiverNotReady, 1);
    assert_eq!((s.send_rnr_err, s.dropped), (1, 0));
}

#[test]
fn ack_outside_the_window_is_stale() {
    let mut p = Pair::new();
    let repr = PacketRepr {
        aeth: Some(AethRepr {
            syndrome: Syndrome::ACK_UNLIMITED,
            msn: 0,
        }),
        ..PacketRepr::new(bth(Opcode::Acknowledge, p.a.qpn, P + 1000, false), &[])
    };
    let pkt = p.craft(Dir::BtoA, &repr);
    p.inject_pkt(&pkt);
    let s = p.a.hca.stats();
    only(&s, RxDropCause::StaleResponse, 1);
    assert_eq!((s.duplicate_response, s.dropped), (1, 0));
}

#[test]
fn every_cause_has_a_distinct_name() {
    let mut names: Vec<&str> = RxDropCause::ALL.iter().map(|c| c.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), RxDropCause::ALL.len());
}
