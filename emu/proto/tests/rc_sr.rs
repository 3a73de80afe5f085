//! Packet-level tests of selective repeat, softverbs' opt-in loss recovery (issue 19; the
//! module docs of `rc::sr`; rc-transport.md "softverbs extensions"): each recovery path with
//! the exact packets that go out, and what a QP in IBTA mode does with a selective ACK.
//!
//! * lost data: resent alone once the selective ACK shows 8 later transmissions delivered;
//! * lost selective ACK: the probe resends the oldest unacknowledged PSN, whose duplicate
//!   draws a new selective ACK;
//! * reordering without loss: nothing is resent below the reorder threshold (8 places), one
//!   packet resent once at or beyond it;
//! * lost retransmission: the probe resends it again;
//! * lossless: the same packets as IBTA mode (a standard peer could not tell).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{A_IP, Action, B_IP, Dir, Opts, PORT, Pair, Pkt, Seen, ip_ctx};
use emu_proto::Instant;
use emu_proto::stats::RxDropCause;
use emu_proto::wire::{
    BthRepr, Opcode, Psn, SACK_OPCODE, SACK_PACKET_LEN, SackBitmap, SackPacketRepr, SackRepr,
    fill_icrc,
};
use verbs_api::{Recovery, SendOp, SendWr, WcStatus, WorkCompletion};

/// a's first PSN with the default options.
const P: u32 = 0x100;
/// A SEND of 32 packets at MTU 256.
const LEN: u32 = 32 * 256;

fn sr_pair() -> Pair {
    Pair::with(Opts {
        recovery: Recovery::SelectiveRepeat,
        ..Opts::default()
    })
}

fn pattern(len: u32) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(5))
        .collect()
}

fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// Posts one 32-packet SEND from a to b (and its receive).
fn post_send(p: &mut Pair) {
    let data = pattern(LEN);
    p.a.write(&p.a.mr, 0, &data);
    let r = p.b.at(0, LEN);
    p.b.post_recv(1, &[r]);
    let s = p.a.at(0, LEN);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
}

/// The SEND arrived once, whole, and both sides completed it.
fn assert_delivered(p: &mut Pair) {
    assert_eq!(statuses(&p.b.recv_wcs()), [(1, WcStatus::Success)]);
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
    assert_eq!(p.b.read(&p.b.mr, 0, LEN as usize), pattern(LEN));
}

/// Drops the first `n` request packets with PSN `psn`.
fn drop_psn(p: &mut Pair, psn: u32, mut n: u32) {
    p.set_filter(move |pkt| {
        let s = pkt.seen();
        if s.dir == Dir::AtoB && s.psn == psn && n > 0 {
            n -= 1;
            Action::Drop
        } else {
            Action::Deliver
        }
    });
}

fn psns(seen: &[Seen]) -> Vec<u32> {
    seen.iter().map(|s| s.psn).collect()
}

/// The bitmap of PSNs `from..=to` after a selective ACK for `base`.
fn bits(base: u32, from: u32, to: u32) -> SackBitmap {
    let mut b = SackBitmap::default();
    for q in from..=to {
        b.set(q - base - 1);
    }
    b
}

#[test]
fn lost_data_is_resent_alone_without_waiting() {
    let mut p = sr_pair();
    drop_psn(&mut p, P + 1, 1);
    post_send(&mut p);
    assert!(p.run_until_idle());
    let out = p.seen(Dir::AtoB);
    let mut want: Vec<u32> = (P..P + 32).collect();
    want.push(P + 1);
    assert_eq!(psns(&out), want, "only the lost packet goes again");
    assert!(
        out.iter().all(|s| s.at == Instant::ZERO),
        "no probe, no timeout"
    );
    let back = p.seen(Dir::BtoA);
    assert!(back[0].is_sack());
    assert_eq!(back[0].op, Opcode::Unknown(SACK_OPCODE));
    assert_eq!(back[0].psn, P + 1, "the first PSN missing");
    assert_eq!(back[0].sack, Some(bits(P + 1, P + 2, P + 31)));
    assert_eq!((back[1].op, back[1].psn), (Opcode::Acknowledge, P + 31));
    assert_eq!(back.len(), 2);
    let (a, b) = (p.a.stats(), p.b.stats());
    assert_eq!(
        (a.retransmits_sack, a.retransmits(), a.sacks_rcvd),
        (1, 1, 1)
    );
    assert_eq!(
        (b.sacks_sent, b.seq_naks_sent, b.out_of_seq_request),
        (1, 0, 30)
    );
    assert_delivered(&mut p);
}

#[test]
fn lost_sack_is_recovered_by_the_probe() {
    let mut p = sr_pair();
    let mut dropped_data = false;
    let mut dropped_sack = false;
    p.set_filter(move |pkt| {
        let s = pkt.seen();
        if s.dir == Dir::AtoB && s.psn == P + 1 && !dropped_data {
            dropped_data = true;
            Action::Drop
        } else if s.is_sack() && !dropped_sack {
            dropped_sack = true;
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    post_send(&mut p);
    assert!(p.run_until_idle());
    let out = p.seen(Dir::AtoB);
    let mut want: Vec<u32> = (P..P + 32).collect();
    // The probe resends the oldest unacknowledged PSN; its duplicate draws a selective ACK
    // that names P+1.
    want.extend([P, P + 1]);
    assert_eq!(psns(&out), want);
    let probe_at = out[32].at;
    assert_eq!(probe_at, Instant::ZERO + Duration::from_micros(100));
    assert!(probe_at < Instant::ZERO + common::ack_timeout(p.opts.timeout));
    let (a, b) = (p.a.stats(), p.b.stats());
    assert_eq!(
        (a.sr_probes, a.timeout_retries, a.retransmits_sack),
        (1, 0, 2)
    );
    assert_eq!(b.sacks_sent, 2);
    assert_delivered(&mut p);
}

#[test]
fn reordering_without_loss_resends_nothing() {
    // Below the reorder threshold (8) nothing is resent; at or beyond it the packet counts as
    // lost and is resent once, alone (and still delivered exactly once).
    for (late_by, resends) in [(2usize, 0u64), (7, 0), (8, 1), (14, 1)] {
        let mut p = sr_pair();
        let mut held = false;
        p.set_filter(move |pkt| {
            let s = pkt.seen();
            if s.dir == Dir::AtoB && s.psn == P + 2 && !held {
                held = true;
                Action::Hold
            } else {
                Action::Deliver
            }
        });
        post_send(&mut p);
        // P+2 arrives after `late_by` later packets.
        p.transmit_at_most(3 + late_by);
        p.deliver();
        p.release_held(false);
        assert!(p.run_until_idle());
        let (a, b) = (p.a.stats(), p.b.stats());
        assert_eq!(a.retransmits(), resends, "late by {late_by}: {a:?}");
        assert_eq!((a.sr_probes, a.timeout_retries), (0, 0));
        assert!(b.sacks_sent >= 1);
        assert_eq!(p.seen(Dir::AtoB).len(), 32 + resends as usize);
        assert_delivered(&mut p);
    }
}

#[test]
fn lost_retransmission_is_resent_by_the_probe() {
    let mut p = sr_pair();
    drop_psn(&mut p, P + 1, 2);
    post_send(&mut p);
    assert!(p.run_until_idle());
    let out = p.seen(Dir::AtoB);
    let mut want: Vec<u32> = (P..P + 32).collect();
    want.extend([P + 1, P + 1]);
    assert_eq!(psns(&out), want);
    assert_eq!(
        out[32].at,
        Instant::ZERO,
        "the first resend follows the SACK"
    );
    assert_eq!(
        out[33].at,
        Instant::ZERO + Duration::from_micros(100),
        "the second, the probe"
    );
    let a = p.a.stats();
    assert_eq!(
        (a.retransmits_sack, a.sr_probes, a.timeout_retries),
        (2, 1, 0)
    );
    assert_delivered(&mut p);
}

#[test]
fn lossless_wire_is_the_same_as_ibta_mode() {
    let run = |recovery| {
        let mut p = Pair::with(Opts {
            recovery,
            ..Opts::default()
        });
        post_send(&mut p);
        let s = p.a.at(0, 1000);
        let rkey = p.b.mr.rkey;
        let remote = common::Node::sge(&p.b.mr, 16384, 0).addr;
        p.post_a(&[
            SendWr::new(
                2,
                SendOp::RdmaWrite {
                    remote_addr: remote,
                    rkey,
                },
                &[s],
            ),
            SendWr::new(
                3,
                SendOp::RdmaRead {
                    remote_addr: remote,
                    rkey,
                },
                &[p.a.at(20000, 1000)],
            ),
        ]);
        assert!(p.run_until_idle());
        p.trace
            .iter()
            .map(|(s, _)| (s.dir, s.op, s.psn, s.len))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(Recovery::SelectiveRepeat), run(Recovery::Ibta));
}

/// A selective ACK to a QP in IBTA mode (a standard peer) is dropped as malformed and changes
/// nothing; the transfer completes as usual.
#[test]
fn ibta_qp_drops_a_selective_ack() {
    let mut p = Pair::new();
    let src = SocketAddr::new(B_IP.into(), 0xC000);
    let dst = SocketAddr::new(A_IP.into(), PORT);
    let repr = SackPacketRepr {
        bth: BthRepr {
            opcode: Opcode::from(SACK_OPCODE),
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: BthRepr::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: p.a.qpn,
            ack_req: false,
            psn: Psn::new(P),
        },
        sack: SackRepr {
            msn: 0,
            bitmap: SackBitmap::first(1),
        },
    };
    let mut bytes = vec![0u8; SACK_PACKET_LEN];
    repr.emit(&mut bytes).unwrap();
    fill_icrc(&ip_ctx(src, dst), &mut bytes).unwrap();
    let pkt = Pkt {
        dir: Dir::BtoA,
        at: p.now,
        src,
        dst,
        bytes,
    };
    post_send(&mut p);
    p.inject_pkt(&pkt);
    assert_eq!(p.a.stats().rx_drops.get(RxDropCause::Malformed), 1);
    assert!(p.run_until_idle());
    assert_eq!(p.a.stats().retransmits(), 0);
    assert_delivered(&mut p);
}
