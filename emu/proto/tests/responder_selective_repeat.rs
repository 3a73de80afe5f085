//! The responder under selective repeat (the module docs of `rc::sr`), packet by packet with
//! crafted requests:
//!
//! * early placement (`rc::responder::place_early`): a WRITE packet held past a PSN gap lands
//!   in memory on arrival only if it passes the checks the in-order stages would make — the QP
//!   grants REMOTE_WRITE, its bytes fit the message its RETH opened, and the MR still grants
//!   the message. A packet that fails one is held unplaced (the in-order stages decide once the
//!   gap fills);
//! * draining (`rc::responder::drain_held`): when the gap fills, the held requests run in PSN
//!   order, and a selective ACK reports what is still held, or what ran without an ACK of its
//!   own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{ALL_ACCESS, Dir, Opts, Pair, bth};
use emu_proto::wire::{Opcode, PacketRepr, RethRepr, SackBitmap};
use verbs_api::{AccessFlags, Recovery};

use Opcode::*;

/// a's first PSN (b's expected PSN) with the default options.
const P: u32 = 0x100;
/// Where the crafted WRITEs land in b's MR.
const AT: u64 = 4096;

fn sr_pair(b_access: AccessFlags) -> Pair {
    Pair::with(Opts {
        recovery: Recovery::SelectiveRepeat,
        b_access,
        ..Opts::default()
    })
}

/// Hands b a crafted WRITE packet from a: `op` at `psn` with `len` bytes of `fill`, and a RETH
/// of `dma_len` bytes at [`AT`] if `dma_len` is given.
fn write_pkt(p: &mut Pair, op: Opcode, psn: u32, len: usize, fill: u8, dma_len: Option<u32>) {
    let payload = vec![fill; len];
    let repr = PacketRepr {
        reth: dma_len.map(|dma_len| RethRepr {
            va: p.b.va(AT),
            rkey: p.b.mr.rkey,
            dma_len,
        }),
        ..PacketRepr::new(bth(op, p.b.qpn, psn, false), &payload)
    };
    let pkt = p.craft(Dir::AtoB, &repr);
    p.inject_pkt(&pkt);
}

/// §4.3 check_op_valid: a QP without REMOTE_WRITE does not place a WRITE held past a gap.
#[test]
fn write_past_a_gap_is_not_placed_without_the_qps_remote_write_right() {
    let mut p = sr_pair(ALL_ACCESS - AccessFlags::REMOTE_WRITE);
    write_pkt(&mut p, RdmaWriteOnly, P + 1, 64, 0xAB, Some(64));
    assert_eq!(p.b.stats().sr_placed_early, 0);
    assert_eq!(p.b.read(&p.b.mr, AT, 64), vec![0; 64]);
    // The same packet at a QP that grants the right is placed.
    let mut p = sr_pair(ALL_ACCESS);
    write_pkt(&mut p, RdmaWriteOnly, P + 1, 64, 0xAB, Some(64));
    assert_eq!(p.b.stats().sr_placed_early, 1);
    assert_eq!(p.b.read(&p.b.mr, AT, 64), vec![0xAB; 64]);
}

/// §1.7: a packet held past a gap whose bytes would run past the RETH length of the message
/// open in order is not placed: no byte outside the message's range is written.
#[test]
fn write_past_a_gap_running_past_its_reth_length_is_not_placed() {
    let mut p = sr_pair(ALL_ACCESS);
    // A 600-byte WRITE opens in order (FIRST, 256 bytes); P+1 is missing; a MIDDLE at P+2
    // would cover bytes 512..768, past the 600 the RETH granted.
    write_pkt(&mut p, RdmaWriteFirst, P, 256, 0x11, Some(600));
    write_pkt(&mut p, RdmaWriteMiddle, P + 2, 256, 0x33, None);
    assert_eq!(p.b.stats().sr_placed_early, 0);
    assert_eq!(p.b.read(&p.b.mr, AT, 256), vec![0x11; 256]);
    assert_eq!(p.b.read(&p.b.mr, AT + 256, 512), vec![0; 512]);
    // The LAST that does fit (88 bytes at 512) is placed.
    let mut p = sr_pair(ALL_ACCESS);
    write_pkt(&mut p, RdmaWriteFirst, P, 256, 0x11, Some(600));
    write_pkt(&mut p, RdmaWriteLast, P + 2, 88, 0x33, None);
    assert_eq!(p.b.stats().sr_placed_early, 1);
    assert_eq!(p.b.read(&p.b.mr, AT + 512, 88), vec![0x33; 88]);
}

/// A packet held past a gap is placed when its bytes reach exactly to the end of the range its
/// RETH names: a FIRST as long as its RETH length lands on arrival, before the gap fills.
#[test]
fn write_past_a_gap_filling_its_reth_length_exactly_is_placed() {
    for (op, len) in [(RdmaWriteFirst, 256), (RdmaWriteOnly, 100)] {
        let mut p = sr_pair(ALL_ACCESS);
        write_pkt(&mut p, op, P + 1, len, 0x5A, Some(len as u32));
        assert_eq!(p.b.stats().sr_placed_early, 1, "{op:?}");
        assert_eq!(p.b.read(&p.b.mr, AT, len), vec![0x5A; len], "{op:?}");
    }
}

/// §4.4: a packet held past a gap is not placed once the MR its message opened in has been
/// deregistered.
#[test]
fn write_past_a_gap_is_not_placed_after_its_mr_is_deregistered() {
    for dereg in [false, true] {
        let mut p = sr_pair(ALL_ACCESS);
        write_pkt(&mut p, RdmaWriteFirst, P, 256, 0x11, Some(768));
        if dereg {
            let lkey = p.b.mr.lkey;
            p.b.hca.dereg_mr(lkey).unwrap();
        }
        write_pkt(&mut p, RdmaWriteLast, P + 2, 256, 0x33, None);
        let placed = !dereg;
        assert_eq!(p.b.stats().sr_placed_early, u64::from(placed));
        let want = if placed { 0x33 } else { 0 };
        assert_eq!(p.b.read(&p.b.mr, AT + 512, 256), vec![want; 256]);
    }
}

/// Hands b a crafted SEND packet from a: `op` at `psn`, one MTU (256 bytes) of `psn`'s low
/// byte, AckReq as given.
fn send_pkt(p: &mut Pair, op: Opcode, psn: u32, ack_req: bool) {
    let payload = [psn as u8; 256];
    let repr = PacketRepr::new(bth(op, p.b.qpn, psn, ack_req), &payload);
    let pkt = p.craft(Dir::AtoB, &repr);
    p.inject_pkt(&pkt);
}

/// What b sent since trace index `from`: (opcode, PSN, selective ACK bitmap).
fn answers(p: &Pair, from: usize) -> Vec<(Opcode, u32, Option<SackBitmap>)> {
    p.seen_since(from, Dir::BtoA)
        .iter()
        .map(|s| (s.op, s.psn, s.sack))
        .collect()
}

fn bitmap(offsets: &[u32]) -> Option<SackBitmap> {
    let mut b = SackBitmap::default();
    for &o in offsets {
        b.set(o);
    }
    Some(b)
}

/// The gap fills and every held request runs, the last without AckReq: a selective ACK for the
/// new ePSN reports that they ran (the requester learns it before the message's ACK).
#[test]
fn drained_requests_without_an_ack_are_reported_by_a_selective_ack() {
    let mut p = sr_pair(ALL_ACCESS);
    p.b.post_recv(1, &[p.b.at(0, 4096)]);
    send_pkt(&mut p, SendFirst, P, false);
    send_pkt(&mut p, SendMiddle, P + 1, false);
    send_pkt(&mut p, SendMiddle, P + 3, false);
    send_pkt(&mut p, SendMiddle, P + 4, false);
    p.transmit();
    let sack = Opcode::Unknown(emu_proto::wire::SACK_OPCODE);
    assert_eq!(answers(&p, 0), [(sack, P + 2, bitmap(&[0, 1]))]);
    let from = p.trace.len();
    send_pkt(&mut p, SendMiddle, P + 2, false);
    p.transmit();
    assert_eq!(answers(&p, from), [(sack, P + 5, bitmap(&[]))]);
    assert_eq!(p.b.read(&p.b.mr, 4 * 256, 256), vec![(P + 4) as u8; 256]);
}

/// The gap fills, the held requests run up to the next gap, and the last one that ran asked
/// for an ACK: the ACK goes, then a selective ACK for what is still held past the new gap.
#[test]
fn drain_stopping_at_another_gap_reports_what_is_still_held() {
    let mut p = sr_pair(ALL_ACCESS);
    p.b.post_recv(1, &[p.b.at(0, 4096)]);
    send_pkt(&mut p, SendFirst, P, false);
    send_pkt(&mut p, SendMiddle, P + 2, true);
    send_pkt(&mut p, SendMiddle, P + 4, false);
    p.transmit();
    let from = p.trace.len();
    send_pkt(&mut p, SendMiddle, P + 1, false);
    p.transmit();
    let sack = Opcode::Unknown(emu_proto::wire::SACK_OPCODE);
    assert_eq!(
        answers(&p, from),
        [
            (Opcode::Acknowledge, P + 2, None),
            (sack, P + 3, bitmap(&[0]))
        ]
    );
}

/// §4.3, §4.4: selective repeat changes nothing for an in-order request that fails: a WRITE at
/// ePSN with a bad R_Key draws NAK 0x62 and moves the QP to ERR, as in IBTA mode.
#[test]
fn in_order_request_that_fails_moves_the_qp_to_err() {
    let mut p = sr_pair(ALL_ACCESS);
    let repr = PacketRepr {
        reth: Some(RethRepr {
            va: p.b.va(AT),
            rkey: p.b.mr.rkey ^ 0x100,
            dma_len: 8,
        }),
        ..PacketRepr::new(bth(RdmaWriteOnly, p.b.qpn, P, true), &[1; 8])
    };
    let pkt = p.craft(Dir::AtoB, &repr);
    p.inject_pkt(&pkt);
    p.transmit();
    let back = p.seen(Dir::BtoA);
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(
        (back[0].syndrome, back[0].psn),
        (
            Some(emu_proto::wire::Syndrome::Nak(
                emu_proto::wire::NakCode::RemoteAccessError
            )),
            P
        )
    );
    assert_eq!(p.b.state(), verbs_api::QpState::Err);
}

/// Past a gap the responder coalesces its selective ACKs: one for the first packet held (the
/// requester learns of the gap at once), then one per eight held, one for a packet asking for
/// an ACK and one for a duplicate of a held packet (its sender may have lost the last report).
#[test]
fn selective_acks_past_a_gap_go_for_the_first_every_eighth_an_ack_request_and_a_duplicate() {
    let mut p = sr_pair(ALL_ACCESS);
    p.b.post_recv(1, &[p.b.at(0, 8192)]);
    let sack = Opcode::Unknown(emu_proto::wire::SACK_OPCODE);
    let held = |n: u32| bitmap(&(0..n).collect::<Vec<_>>());
    // P is missing.
    let mut sent = Vec::new();
    for k in 1..=10 {
        let from = p.trace.len();
        send_pkt(&mut p, SendMiddle, P + k, false);
        p.transmit();
        if !answers(&p, from).is_empty() {
            sent.push((k, answers(&p, from)));
        }
    }
    assert_eq!(
        sent,
        [(1, vec![(sack, P, held(1))]), (9, vec![(sack, P, held(9))])]
    );
    let from = p.trace.len();
    send_pkt(&mut p, SendMiddle, P + 11, true);
    p.transmit();
    assert_eq!(answers(&p, from), [(sack, P, held(11))]);
    let from = p.trace.len();
    send_pkt(&mut p, SendMiddle, P + 5, false);
    p.transmit();
    assert_eq!(answers(&p, from), [(sack, P, held(11))]);
    assert_eq!(p.b.stats().duplicate_request, 1);
}
