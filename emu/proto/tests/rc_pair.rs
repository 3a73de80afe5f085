//! Packet-level tests of the RC engine between two `Hca`s (issue 4, item 8): each test scripts
//! the wire (deliver, drop, duplicate, hold/reorder, rewrite or craft packets), then asserts the
//! exact packets, PSNs, completions, timers and counters that come out (rc-transport.md §2–§6).
//!
//! Tests named `trap_NN_*` cover item NN of rc-transport.md §9's traps list (1–13); the others
//! cover the behaviours of issue 4's list (segmentation, faults, errors, limits, ordering).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::{
    ALL_ACCESS, Action, Dir, MR_LEN, Node, Opts, Pair, Seen, Side, Step, ack_timeout, bth, ip_ctx,
};
use emu_proto::Instant;
use emu_proto::wire::{
    AtomicEthRepr, BthRepr, IpAddrs, IpContext, NakCode, Opcode, Packet, PacketRepr, RethRepr,
    RnrTimer, Syndrome, check_icrc,
};
use verbs_api::{
    AccessFlags, AsyncEventKind, ErrorKind, EventElement, QpAttr, QpAttrMask, QpState, SendFlags,
    SendOp, SendWr, WcFlags, WcOpcode, WcStatus, WorkCompletion, connect,
};

use Opcode::*;

/// a's first PSN with the default options.
const P: u32 = 0x100;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// (wr_id, status, opcode, byte_len) of each completion.
fn brief(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus, WcOpcode, u32)> {
    wcs.iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect()
}

/// (wr_id, status) of each completion.
fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn opls(seen: &[Seen]) -> Vec<(Opcode, u32, usize)> {
    seen.iter().map(Seen::opl).collect()
}

fn unsignaled(wr: SendWr<'_>) -> SendWr<'_> {
    let flags = wr.flags - SendFlags::SIGNALED;
    wr.with_flags(flags)
}

fn ack(psn: u32) -> (Opcode, u32, usize) {
    (Acknowledge, psn, 0)
}

fn nak_of(s: &Seen) -> Option<NakCode> {
    match s.syndrome {
        Some(Syndrome::Nak(c)) => Some(c),
        _ => None,
    }
}

fn at(t: Duration) -> Instant {
    Instant::ZERO + t
}

// ---- plain operations --------------------------------------------------------------------

#[test]
fn send_single_packet() {
    let mut p = Pair::new();
    let data = pattern(100, 1);
    p.a.write(&p.a.mr, 0, &data);
    let r = p.b.at(0, 512);
    p.b.post_recv(7, &[r]);
    let s = p.a.at(0, 100);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_until_idle());

    let out = p.seen(Dir::AtoB);
    assert_eq!(opls(&out), [(SendOnly, P, 100)]);
    assert!(out[0].ack_req);
    assert_eq!(out[0].dest_qp, p.b.qpn);
    assert_eq!(out[0].pkey, 0xFFFF);
    let back = p.seen(Dir::BtoA);
    assert_eq!(opls(&back), [ack(P)]);
    assert_eq!(back[0].syndrome, Some(Syndrome::ACK_UNLIMITED));
    assert_eq!(back[0].msn, Some(1));

    assert_eq!(
        brief(&p.a.send_wcs()),
        [(1, WcStatus::Success, WcOpcode::Send, 100)]
    );
    let rwc = p.b.recv_wcs();
    assert_eq!(brief(&rwc), [(7, WcStatus::Success, WcOpcode::Recv, 100)]);
    assert_eq!(rwc[0].qp_num, p.b.qpn);
    assert_eq!(p.b.read(&p.b.mr, 0, 100), data);
    assert_eq!(p.next_deadline(), None, "no timer once everything is ACKed");
}

/// Trap 8: FIRST and MIDDLE carry exactly one MTU, LAST carries 1..=MTU; AckReq only on the
/// last packet; the RETH (WRITE) carries the whole message length.
#[test]
fn trap_08_send_segmentation_first_middle_last() {
    for (len, sizes) in [
        (1000usize, vec![256usize, 256, 256, 232]),
        (512, vec![256, 256]),
        (257, vec![256, 1]),
        (256, vec![256]),
    ] {
        let mut p = Pair::new();
        let data = pattern(len, 3);
        p.a.write(&p.a.mr, 0, &data);
        let r = p.b.at(0, 2000);
        p.b.post_recv(9, &[r]);
        let s = p.a.at(0, len as u32);
        p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
        assert!(p.run_until_idle());

        let out = p.seen(Dir::AtoB);
        let n = sizes.len();
        let want: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(i, &sz)| {
                let op = match (i, n) {
                    (_, 1) => SendOnly,
                    (0, _) => SendFirst,
                    (i, n) if i + 1 == n => SendLast,
                    _ => SendMiddle,
                };
                (op, P + i as u32, sz)
            })
            .collect();
        assert_eq!(opls(&out), want, "len {len}");
        let ack_reqs: Vec<bool> = out.iter().map(|s| s.ack_req).collect();
        let mut want_ack = vec![false; n];
        want_ack[n - 1] = true;
        assert_eq!(ack_reqs, want_ack, "AckReq only on the last packet");
        for s in &out {
            assert_eq!(usize::from(s.pad), (4 - s.len % 4) % 4, "pad count");
        }
        assert_eq!(opls(&p.seen(Dir::BtoA)), [ack(P + n as u32 - 1)]);
        assert_eq!(
            brief(&p.b.recv_wcs()),
            [(9, WcStatus::Success, WcOpcode::Recv, len as u32)]
        );
        assert_eq!(p.b.read(&p.b.mr, 0, len), data);
        assert_eq!(
            brief(&p.a.send_wcs()),
            [(1, WcStatus::Success, WcOpcode::Send, len as u32)]
        );
    }
}

/// Trap 8 (RETH) and trap 9: a multi-packet WRITE with immediate carries the RETH with the
/// whole length on FIRST only and ImmDt on LAST; it consumes a receive WQE only at the LAST
/// packet (no receive posted → the FIRST and MIDDLE are accepted, the LAST is RNR-NAKed with its
/// own PSN), and the receive completion reports `byte_len` = the RETH length.
#[test]
fn trap_09_write_with_imm_consumes_recv_wqe_at_last() {
    let mut p = Pair::new();
    let data = pattern(600, 5);
    p.a.write(&p.a.mr, 0, &data);
    let s = p.a.at(0, 600);
    let va = p.b.va(1000);
    let rkey = p.b.mr.rkey;
    p.post_a(&[SendWr::new(
        1,
        SendOp::RdmaWriteWithImm {
            remote_addr: va,
            rkey,
            imm: 0xdead_beef,
        },
        &[s],
    )
    .with_flags(SendFlags::SIGNALED | SendFlags::SOLICITED)]);
    assert!(p.flush());

    let out = p.seen(Dir::AtoB);
    assert_eq!(
        opls(&out),
        [
            (RdmaWriteFirst, P, 256),
            (RdmaWriteMiddle, P + 1, 256),
            (RdmaWriteLastWithImmediate, P + 2, 88)
        ]
    );
    assert_eq!(
        out[0].reth,
        Some(RethRepr {
            va,
            rkey,
            dma_len: 600
        })
    );
    assert_eq!((out[1].reth, out[2].reth), (None, None));
    assert_eq!(out[2].imm, Some(0xdead_beef));
    assert_eq!(
        out.iter().map(|s| s.solicited).collect::<Vec<_>>(),
        [false, false, true],
        "SE only on the last packet"
    );
    let back = p.seen(Dir::BtoA);
    assert_eq!(opls(&back), [ack(P + 2)]);
    assert!(back[0].is_rnr(), "the LAST packet found no receive WQE");
    assert_eq!(p.b.stats().send_rnr_err, 1);
    // FIRST and MIDDLE were placed already.
    assert_eq!(p.b.read(&p.b.mr, 1000, 512), data[..512]);

    p.b.post_recv(77, &[]);
    assert!(p.run_until_idle());
    let resent = p.seen_since(4, Dir::AtoB);
    assert_eq!(opls(&resent), [(RdmaWriteLastWithImmediate, P + 2, 88)]);
    let rwc = p.b.recv_wcs();
    assert_eq!(
        brief(&rwc),
        [(77, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 600)]
    );
    assert_eq!(rwc[0].imm_data, 0xdead_beef);
    assert!(rwc[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(p.b.read(&p.b.mr, 1000, 600), data);
    assert_eq!(
        brief(&p.a.send_wcs()),
        [(1, WcStatus::Success, WcOpcode::RdmaWrite, 600)]
    );
}

/// A zero-length SEND and WRITE are one *_ONLY packet each and use one PSN each
/// (rc-transport.md §3.1); a zero-length WRITE's R_Key and VA are not checked (C9-88).
#[test]
fn zero_length_send_and_write() {
    let mut p = Pair::new();
    for id in [10, 11] {
        let r = p.b.at(0, 64);
        p.b.post_recv(id, &[r]);
    }
    let one = p.a.at(0, 1);
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[]),
        SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: 0xdead_0000,
                rkey: 0x1234_5678,
            },
            &[],
        ),
        SendWr::new(3, SendOp::Send, &[one]),
    ]);
    assert!(p.run_until_idle());
    let out = p.seen(Dir::AtoB);
    assert_eq!(
        opls(&out),
        [
            (SendOnly, P, 0),
            (RdmaWriteOnly, P + 1, 0),
            (SendOnly, P + 2, 1)
        ]
    );
    assert_eq!(out[1].reth.map(|r| r.dma_len), Some(0));
    assert_eq!(
        brief(&p.a.send_wcs()),
        [
            (1, WcStatus::Success, WcOpcode::Send, 0),
            (2, WcStatus::Success, WcOpcode::RdmaWrite, 0),
            (3, WcStatus::Success, WcOpcode::Send, 1)
        ]
    );
    assert_eq!(
        brief(&p.b.recv_wcs()),
        [
            (10, WcStatus::Success, WcOpcode::Recv, 0),
            (11, WcStatus::Success, WcOpcode::Recv, 1)
        ]
    );
    assert_eq!(p.b.state(), QpState::Rts);
}

/// INLINE data is copied at post time (rc-transport.md §3.2): changing the caller's buffer
/// afterwards changes nothing; no lkey is involved.
#[test]
fn inline_send_and_write() {
    let mut p = Pair::new();
    let r = p.b.at(0, 512);
    p.b.post_recv(5, &[r]);
    let mut data = pattern(200, 9);
    let want = data.clone();
    let va = p.b.va(4096);
    let rkey = p.b.mr.rkey;
    p.post_a(&[
        SendWr::inline(1, SendOp::SendWithImm { imm: 42 }, &data),
        SendWr::inline(
            2,
            SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            },
            &data,
        ),
    ]);
    data.fill(0);
    assert!(p.run_until_idle());
    assert_eq!(
        opls(&p.seen(Dir::AtoB)),
        [(SendOnlyWithImmediate, P, 200), (RdmaWriteOnly, P + 1, 200)]
    );
    let rwc = p.b.recv_wcs();
    assert_eq!(brief(&rwc), [(5, WcStatus::Success, WcOpcode::Recv, 200)]);
    assert_eq!(rwc[0].imm_data, 42);
    assert_eq!(p.b.read(&p.b.mr, 0, 200), want);
    assert_eq!(p.b.read(&p.b.mr, 4096, 200), want);
    assert_eq!(
        statuses(&p.a.send_wcs()),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

/// Gather from three SGEs in two MRs, scatter into three receive SGEs; READ scatters into two.
#[test]
fn multi_sge_gather_and_scatter() {
    let mut p = Pair::new();
    let a2 = p.a.reg(4096, ALL_ACCESS);
    let b2 = p.b.reg(4096, ALL_ACCESS);
    let (x, y, z) = (pattern(300, 1), pattern(10, 2), pattern(500, 3));
    p.a.write(&p.a.mr, 100, &x);
    p.a.write(&a2, 7, &y);
    p.a.write(&p.a.mr, 2000, &z);
    let msg: Vec<u8> = [x, y, z].concat();
    let rs = [p.b.at(0, 400), Node::sge(&b2, 5, 100), p.b.at(5000, 600)];
    p.b.post_recv(1, &rs);
    let ss = [p.a.at(100, 300), Node::sge(&a2, 7, 10), p.a.at(2000, 500)];
    p.post_a(&[SendWr::new(1, SendOp::Send, &ss)]);
    assert!(p.run_until_idle());
    assert_eq!(
        brief(&p.b.recv_wcs()),
        [(1, WcStatus::Success, WcOpcode::Recv, 810)]
    );
    assert_eq!(p.b.read(&p.b.mr, 0, 400), msg[..400]);
    assert_eq!(p.b.read(&b2, 5, 100), msg[400..500]);
    assert_eq!(p.b.read(&p.b.mr, 5000, 310), msg[500..]);
    assert_eq!(p.b.read(&p.b.mr, 5310, 290), vec![0; 290]);

    // READ b's 700 bytes at 0 back into two SGEs.
    let ds = [p.a.at(10_000, 100), Node::sge(&a2, 1000, 600)];
    let va = p.b.va(0);
    let rkey = p.b.mr.rkey;
    p.post_a(&[SendWr::new(
        2,
        SendOp::RdmaRead {
            remote_addr: va,
            rkey,
        },
        &ds,
    )]);
    assert!(p.run_until_idle());
    let remote = p.b.read(&p.b.mr, 0, 700);
    assert_eq!(p.a.read(&p.a.mr, 10_000, 100), remote[..100]);
    assert_eq!(p.a.read(&a2, 1000, 600), remote[100..]);
    assert_eq!(
        brief(&p.a.send_wcs()),
        [
            (1, WcStatus::Success, WcOpcode::Send, 810),
            (2, WcStatus::Success, WcOpcode::RdmaRead, 700)
        ]
    );
}

/// Trap 3: a READ of N MTUs uses N PSNs at the requester (the next request's PSN is first + N)
/// and at the responder (which accepts that next request in order).
#[test]
fn trap_03_read_consumes_n_psns_on_both_sides() {
    let mut p = Pair::new();
    let remote = pattern(1000, 7);
    p.b.write(&p.b.mr, 0, &remote);
    let r = p.b.at(8000, 64);
    p.b.post_recv(3, &[r]);
    let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
    let dst = p.a.at(0, 1000);
    let small = p.a.at(2000, 10);
    p.post_a(&[
        SendWr::new(
            1,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[dst],
        ),
        SendWr::new(2, SendOp::Send, &[small]),
    ]);
    assert!(p.run_until_idle());
    let out = p.seen(Dir::AtoB);
    assert_eq!(
        opls(&out),
        [(RdmaReadRequest, P, 0), (SendOnly, P + 4, 10)],
        "a 4-MTU READ consumes 4 PSNs"
    );
    assert_eq!(
        out[0].reth,
        Some(RethRepr {
            va,
            rkey,
            dma_len: 1000
        })
    );
    assert!(out[0].ack_req);
    let back = p.seen(Dir::BtoA);
    assert_eq!(
        opls(&back),
        [
            (RdmaReadResponseFirst, P, 256),
            (RdmaReadResponseMiddle, P + 1, 256),
            (RdmaReadResponseMiddle, P + 2, 256),
            (RdmaReadResponseLast, P + 3, 232),
            ack(P + 4),
        ]
    );
    // AETH on FIRST/LAST/ONLY only, never on MIDDLE (rc-transport.md §1.3).
    let aeths: Vec<bool> = back.iter().map(|s| s.syndrome.is_some()).collect();
    assert_eq!(aeths, [true, false, false, true, true]);
    assert_eq!(p.a.read(&p.a.mr, 0, 1000), remote);
    assert_eq!(
        brief(&p.a.send_wcs()),
        [
            (1, WcStatus::Success, WcOpcode::RdmaRead, 1000),
            (2, WcStatus::Success, WcOpcode::Send, 10)
        ]
    );
    assert_eq!(statuses(&p.b.recv_wcs()), [(3, WcStatus::Success)]);
}

/// CMP_SWAP and FETCH_ADD: one PSN each, the original value comes back in the ATOMIC
/// ACKNOWLEDGE and lands in the local SGE (rc-transport.md §4.6).
#[test]
fn compare_swap_and_fetch_add_results() {
    let mut p = Pair::new();
    p.b.write(&p.b.mr, 64, &40u64.to_ne_bytes());
    let (va, rkey) = (p.b.va(64), p.b.mr.rkey);
    let res = [p.a.at(8, 8)];
    let res2 = [p.a.at(16, 8)];
    let res3 = [p.a.at(24, 8)];
    p.post_a(&[
        SendWr::new(
            1,
            SendOp::AtomicFetchAndAdd {
                remote_addr: va,
                rkey,
                add: 2,
            },
            &res,
        ),
        SendWr::new(
            2,
            SendOp::AtomicCmpAndSwp {
                remote_addr: va,
                rkey,
                compare: 42,
                swap: 7,
            },
            &res2,
        ),
        SendWr::new(
            3,
            SendOp::AtomicCmpAndSwp {
                remote_addr: va,
                rkey,
                compare: 100,
                swap: 1,
            },
            &res3,
        ),
    ]);
    assert!(p.run_until_idle());
    let out = p.seen(Dir::AtoB);
    assert_eq!(
        opls(&out),
        [
            (FetchAdd, P, 0),
            (CompareSwap, P + 1, 0),
            (CompareSwap, P + 2, 0)
        ]
    );
    assert_eq!(
        out[1].atomic,
        Some(AtomicEthRepr {
            va,
            rkey,
            swap_add: 7,
            compare: 42
        })
    );
    let back = p.seen(Dir::BtoA);
    assert_eq!(
        back.iter()
            .map(|s| (s.op, s.psn, s.orig))
            .collect::<Vec<_>>(),
        [
            (AtomicAcknowledge, P, Some(40)),
            (AtomicAcknowledge, P + 1, Some(42)),
            (AtomicAcknowledge, P + 2, Some(7))
        ]
    );
    assert_eq!(p.a.word(&p.a.mr, 8), 40);
    assert_eq!(p.a.word(&p.a.mr, 16), 42);
    assert_eq!(
        p.a.word(&p.a.mr, 24),
        7,
        "failed compare returns the current value"
    );
    assert_eq!(p.b.word(&p.b.mr, 64), 7);
    assert_eq!(
        brief(&p.a.send_wcs()),
        [
            (1, WcStatus::Success, WcOpcode::FetchAdd, 8),
            (2, WcStatus::Success, WcOpcode::CompSwap, 8),
            (3, WcStatus::Success, WcOpcode::CompSwap, 8)
        ]
    );
}

// ---- loss, duplication, retransmission ---------------------------------------------------

/// Drops the first packet matching `pred`, delivers the rest.
fn drop_first(
    mut pred: impl FnMut(&Seen) -> bool + 'static,
) -> impl FnMut(&mut common::Pkt) -> Action {
    let mut done = false;
    move |pkt| {
        if !done && pred(&pkt.seen()) {
            done = true;
            Action::Drop
        } else {
            Action::Deliver
        }
    }
}

/// Trap 6 (duplicate SEND): the first ACK of a 4-packet SEND is lost. The requester resends the
/// whole message after exactly the local ACK timeout (4.096 µs × 2^timeout, §3.5); the responder
/// treats all four as duplicates and re-ACKs once with the last ACKed PSN (P+3, not the
/// duplicate's own P), without delivering the message twice.
#[test]
fn trap_06_drop_first_ack_retransmits_after_exact_timeout() {
    let mut p = Pair::new();
    let t = ack_timeout(p.opts.timeout);
    assert_eq!(t, Duration::from_nanos(1_048_576));
    let data = pattern(1000, 2);
    p.a.write(&p.a.mr, 0, &data);
    let r = p.b.at(0, 1000);
    p.b.post_recv(1, &[r]);
    p.set_filter(drop_first(|s| s.op == Acknowledge));
    let s = p.a.at(0, 1000);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.flush());
    assert_eq!(
        p.next_deadline(),
        Some(at(t)),
        "retransmit timer armed at send + timeout"
    );
    assert!(p.a.send_wcs().is_empty());
    assert!(p.run_until_idle());

    let out = p.seen(Dir::AtoB);
    let times: Vec<_> = out.iter().map(|s| (s.psn, s.at)).collect();
    assert_eq!(
        times,
        [
            (P, at(Duration::ZERO)),
            (P + 1, at(Duration::ZERO)),
            (P + 2, at(Duration::ZERO)),
            (P + 3, at(Duration::ZERO)),
            (P, at(t)),
            (P + 1, at(t)),
            (P + 2, at(t)),
            (P + 3, at(t)),
        ]
    );
    assert_eq!(
        out[4..].iter().map(|s| s.op).collect::<Vec<_>>(),
        [SendFirst, SendMiddle, SendMiddle, SendLast],
        "the resend uses the original opcodes"
    );
    let back = p.seen(Dir::BtoA);
    assert_eq!(opls(&back), [ack(P + 3), ack(P + 3)]);
    assert_eq!(back[1].at, at(t));
    let (a, b) = (p.a.stats(), p.b.stats());
    assert_eq!(
        (a.retransmits_timeout, a.timeout_retries, a.retransmits_nak),
        (4, 1, 0)
    );
    assert_eq!(b.duplicate_request, 4);
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
    assert_eq!(
        statuses(&p.b.recv_wcs()),
        [(1, WcStatus::Success)],
        "delivered once"
    );
    assert_eq!(p.b.read(&p.b.mr, 0, 1000), data);
}

/// A READ of 3 MTUs loses its 2nd response. The LAST response is newer than expected and is
/// dropped (§2.10); at the ACK timeout the requester re-reads only the remainder: PSN =
/// comp_psn, VA advanced by one MTU, length = the rest (§3.8). The data ends correct.
#[test]
fn drop_read_response_2_of_3() {
    let mut p = Pair::new();
    let t = ack_timeout(p.opts.timeout);
    let remote = pattern(600, 4);
    p.b.write(&p.b.mr, 100, &remote);
    p.set_filter(drop_first(|s| s.op == RdmaReadResponseMiddle));
    let (va, rkey) = (p.b.va(100), p.b.mr.rkey);
    let dst = p.a.at(0, 600);
    p.post_a(&[SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: va,
            rkey,
        },
        &[dst],
    )]);
    assert!(p.run_until_idle());
    let out = p.seen(Dir::AtoB);
    assert_eq!(
        opls(&out),
        [(RdmaReadRequest, P, 0), (RdmaReadRequest, P + 1, 0)]
    );
    assert_eq!(out[1].at, at(t), "the timer drives the recovery");
    assert_eq!(
        out[1].reth,
        Some(RethRepr {
            va: va + 256,
            rkey,
            dma_len: 344
        })
    );
    let back = p.seen(Dir::BtoA);
    assert_eq!(
        opls(&back),
        [
            (RdmaReadResponseFirst, P, 256),
            (RdmaReadResponseMiddle, P + 1, 256),
            (RdmaReadResponseLast, P + 2, 88),
            (RdmaReadResponseFirst, P + 1, 256),
            (RdmaReadResponseLast, P + 2, 88),
        ]
    );
    assert_eq!(p.a.read(&p.a.mr, 0, 600), remote);
    assert_eq!(
        brief(&p.a.send_wcs()),
        [(1, WcStatus::Success, WcOpcode::RdmaRead, 600)]
    );
    assert_eq!(p.b.stats().duplicate_request, 1);
    assert_eq!(p.a.stats().retransmits_timeout, 1);
}

/// Trap 6 (duplicate ATOMIC): a duplicated CMP_SWAP or FETCH_ADD is answered by replaying the
/// saved original value, never by executing it again; a lost ATOMIC ACK is recovered the same
/// way after the timeout.
#[test]
fn trap_06_duplicate_atomic_replays_saved_result() {
    let mut p = Pair::new();
    p.b.write(&p.b.mr, 0, &5u64.to_ne_bytes());
    let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
    p.set_filter(|pkt| {
        if matches!(pkt.seen().op, CompareSwap | FetchAdd) {
            Action::Duplicate
        } else {
            Action::Deliver
        }
    });
    let r1 = [p.a.at(8, 8)];
    let r2 = [p.a.at(16, 8)];
    p.post_a(&[
        SendWr::new(
            1,
            SendOp::AtomicFetchAndAdd {
                remote_addr: va,
                rkey,
                add: 10,
            },
            &r1,
        ),
        SendWr::new(
            2,
            SendOp::AtomicCmpAndSwp {
                remote_addr: va,
                rkey,
                compare: 15,
                swap: 99,
            },
            &r2,
        ),
    ]);
    assert!(p.run_until_idle());
    assert_eq!(
        p.b.word(&p.b.mr, 0),
        99,
        "each atomic executed exactly once"
    );
    assert_eq!((p.a.word(&p.a.mr, 8), p.a.word(&p.a.mr, 16)), (5, 15));
    let acks: Vec<_> = p
        .seen(Dir::BtoA)
        .iter()
        .map(|s| (s.op, s.psn, s.orig))
        .collect();
    assert_eq!(
        acks,
        [
            (AtomicAcknowledge, P, Some(5)),
            (AtomicAcknowledge, P, Some(5)),
            (AtomicAcknowledge, P + 1, Some(15)),
            (AtomicAcknowledge, P + 1, Some(15)),
        ],
        "the duplicates replay the saved original values"
    );
    assert_eq!(p.b.stats().duplicate_request, 2);
    assert_eq!(p.a.stats().duplicate_response, 2);
    assert_eq!(
        statuses(&p.a.send_wcs()),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );

    // A lost ATOMIC ACK: the resent FETCH_ADD is a duplicate, answered from the saved value.
    p.set_filter(drop_first(|s| s.op == AtomicAcknowledge));
    let r3 = [p.a.at(24, 8)];
    p.post_a(&[SendWr::new(
        3,
        SendOp::AtomicFetchAndAdd {
            remote_addr: va,
            rkey,
            add: 1,
        },
        &r3,
    )]);
    assert!(p.run_until_idle());
    assert_eq!(p.b.word(&p.b.mr, 0), 100);
    assert_eq!(p.a.word(&p.a.mr, 24), 99);
    assert_eq!(statuses(&p.a.send_wcs()), [(3, WcStatus::Success)]);
    assert_eq!(p.a.stats().retransmits_timeout, 1);
}

/// Trap 5 (sequence NAK PSN = ePSN): a lost MIDDLE packet draws exactly one PSN-sequence NAK
/// carrying the responder's ePSN; the requester goes back to that PSN at once (no timeout) and
/// resends from there with the original opcodes.
#[test]
fn trap_05_drop_middle_send_packet_one_sequence_nak() {
    let mut p = Pair::new();
    let data = pattern(1000, 8);
    p.a.write(&p.a.mr, 0, &data);
    let r = p.b.at(0, 1000);
    p.b.post_recv(1, &[r]);
    p.set_filter(drop_first(|s| s.op == SendMiddle));
    let s = p.a.at(0, 1000);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_until_idle());
    let out = p.seen(Dir::AtoB);
    assert_eq!(
        opls(&out),
        [
            (SendFirst, P, 256),
            (SendMiddle, P + 1, 256),
            (SendMiddle, P + 2, 256),
            (SendLast, P + 3, 232),
            (SendMiddle, P + 1, 256),
            (SendMiddle, P + 2, 256),
            (SendLast, P + 3, 232),
        ]
    );
    assert!(
        out.iter().all(|s| s.at == Instant::ZERO),
        "NAK-driven, no timeout"
    );
    let back = p.seen(Dir::BtoA);
    assert_eq!(opls(&back), [ack(P + 1), ack(P + 3)]);
    assert_eq!(nak_of(&back[0]), Some(NakCode::PsnSequenceError));
    assert_eq!(back[1].syndrome, Some(Syndrome::ACK_UNLIMITED));
    let (a, b) = (p.a.stats(), p.b.stats());
    assert_eq!((b.seq_naks_sent, b.out_of_seq_request), (1, 2));
    assert_eq!(
        (a.rcvd_seq_err, a.retransmits_nak, a.retransmits_timeout),
        (1, 3, 0)
    );
    assert_eq!(statuses(&p.b.recv_wcs()), [(1, WcStatus::Success)]);
    assert_eq!(p.b.read(&p.b.mr, 0, 1000), data);
}

/// Trap 5 and issue 19 (lost first retransmission): the resent packet at the NAKed PSN is
/// lost again. rxe stays silent for the rest of the gap (§2.6) and leaves recovery to the ACK
/// timeout; our responder sees the requester go back (an out-of-sequence PSN not after the
/// previous one) and NAKs again, and the requester trusts that repeat because it arrives after
/// its resend passed the NAKed PSN (DIVERGENCES.md #19). No timeout.
#[test]
fn trap_05_lost_first_retransmission_draws_a_second_nak() {
    let mut p = Pair::new();
    let r = p.b.at(0, 1000);
    p.b.post_recv(1, &[r]);
    let mut dropped = 0;
    p.set_filter(move |pkt| {
        let s = pkt.seen();
        if s.dir == Dir::AtoB && s.psn == P + 1 && dropped < 2 {
            dropped += 1;
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    let s = p.a.at(0, 1000);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_with_latency(Duration::from_micros(10)));
    let naks: Vec<_> = p.seen(Dir::BtoA).into_iter().filter(Seen::is_nak).collect();
    assert_eq!(naks.len(), 2, "one NAK per round of the gap: {naks:?}");
    assert!(naks.iter().all(|n| n.psn == P + 1));
    let out = p.seen(Dir::AtoB);
    assert_eq!(
        out.iter().map(|s| s.psn).collect::<Vec<_>>(),
        [
            P,
            P + 1,
            P + 2,
            P + 3,
            P + 1,
            P + 2,
            P + 3,
            P + 1,
            P + 2,
            P + 3
        ]
    );
    assert!(
        out.last().unwrap().at < at(ack_timeout(p.opts.timeout)),
        "no timeout"
    );
    let (a, b) = (p.a.stats(), p.b.stats());
    assert_eq!((b.seq_naks_sent, b.out_of_seq_request), (2, 4));
    assert_eq!((a.rcvd_seq_err, a.timeout_retries), (2, 0));
    assert_eq!(statuses(&p.b.recv_wcs()), [(1, WcStatus::Success)]);
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
}

/// Issue 19 (lost NAK): the only NAK of a gap is lost. rxe would wait for the ACK timeout;
/// our responder NAKs again after `SEQ_NAK_REPEAT` (32) more out-of-sequence packets of the
/// same round, and the requester, not in a retry, goes back at once.
#[test]
fn lost_sequence_nak_is_repeated_while_the_gap_persists() {
    let mut p = Pair::new();
    let len = 40 * 256;
    let r = p.b.at(0, len);
    p.b.post_recv(1, &[r]);
    let (mut data_lost, mut nak_lost) = (false, false);
    p.set_filter(move |pkt| {
        let s = pkt.seen();
        if s.dir == Dir::AtoB && s.psn == P + 1 && !data_lost {
            data_lost = true;
            Action::Drop
        } else if s.is_nak() && !nak_lost {
            nak_lost = true;
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    let s = p.a.at(0, len);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_until_idle());
    let naks: Vec<_> = p.seen(Dir::BtoA).into_iter().filter(Seen::is_nak).collect();
    // The first out-of-sequence packet (P+2) and the 33rd (P+34) draw NAKs.
    assert_eq!(naks.len(), 2, "{naks:?}");
    let out = p.seen(Dir::AtoB);
    assert!(out.iter().all(|s| s.at == Instant::ZERO), "no timeout");
    assert_eq!(out.len(), 40 + 39, "one go-back-N round from P+1");
    let (a, b) = (p.a.stats(), p.b.stats());
    assert_eq!((b.seq_naks_sent, b.out_of_seq_request), (2, 38));
    assert_eq!((a.rcvd_seq_err, a.timeout_retries), (1, 0));
    assert_eq!(statuses(&p.b.recv_wcs()), [(1, WcStatus::Success)]);
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
}

/// Issue 19 (late ACK after a rewind): the ACK of a whole SEND is delayed past the ACK
/// timeout. The timeout rewinds the requester to the SEND's first PSN; the late ACK then
/// arrives before anything was resent. It is no ghost (its PSN was sent, §2.10): it completes
/// the SEND and nothing is resent.
#[test]
fn late_ack_after_a_rewind_completes_instead_of_being_ignored() {
    let mut p = Pair::new();
    let r = p.b.at(0, 1000);
    p.b.post_recv(1, &[r]);
    p.set_filter(|pkt| {
        if pkt.dir == Dir::BtoA {
            Action::Hold
        } else {
            Action::Deliver
        }
    });
    let s = p.a.at(0, 1000);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.flush());
    assert_eq!(p.held(), 1, "the ACK of P+3");
    // The ACK timeout fires: a goes back to P (nothing transmitted yet).
    p.now = p.next_deadline().unwrap();
    p.fire_timers();
    assert_eq!(p.a.stats().timeout_retries, 1);
    p.clear_filter();
    p.release_held(false);
    assert_eq!(p.deliver(), 1);
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
    assert!(p.run_until_idle());
    assert_eq!(p.seen(Dir::AtoB).len(), 4, "nothing resent");
    let a = p.a.stats();
    assert_eq!((a.retransmits_timeout, a.duplicate_response), (0, 0));
    assert_eq!(p.a.state(), QpState::Rts);
}

/// Issue 19 (partly late ACK): after a NAK rewound the requester, an ACK for a later PSN
/// (sent before the rewind, answered late) moves the resend past what it acknowledges.
#[test]
fn late_ack_inside_the_resent_range_skips_what_it_acknowledges() {
    let mut p = Pair::new();
    for id in [1, 2] {
        let r = p.b.at(0, 1000);
        p.b.post_recv(id, &[r]);
    }
    p.set_filter(|pkt| {
        if pkt.dir == Dir::BtoA {
            Action::Hold
        } else {
            Action::Deliver
        }
    });
    let (s1, s2) = (p.a.at(0, 1000), p.a.at(0, 1000));
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[s1]),
        SendWr::new(2, SendOp::Send, &[s2]),
    ]);
    // One SEND per round trip, so that b answers each with its own ACK.
    p.transmit_at_most(4);
    p.deliver();
    assert!(p.flush());
    assert_eq!(p.held(), 2, "ACK(P+3) and ACK(P+7)");
    p.now = p.next_deadline().unwrap();
    p.fire_timers();
    p.clear_filter();
    // Only the first ACK gets through before the resend starts.
    p.release_one(0);
    assert_eq!(p.deliver(), 1);
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
    p.drop_held();
    assert!(p.run_until_idle());
    let resent: Vec<_> = p.seen(Dir::AtoB)[8..].iter().map(|s| s.psn).collect();
    assert_eq!(resent, [P + 4, P + 5, P + 6, P + 7], "SEND 1 not resent");
    assert_eq!(statuses(&p.a.send_wcs()), [(2, WcStatus::Success)]);
    assert_eq!(
        statuses(&p.b.recv_wcs()),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

/// Issue 19 (reordering without loss): two packets of a message swap places. The responder
/// must drop the early one and NAK (§2.6; IBTA mode has no reorder buffer), so the requester
/// resends from the NAKed PSN, once: the echo NAKs of the same gap start no second round and
/// nothing times out.
#[test]
fn reordering_without_loss_resends_one_round_only() {
    let mut p = Pair::new();
    let len = 8 * 256;
    let mut held_once = false;
    p.set_filter(move |pkt| {
        let s = pkt.seen();
        if s.dir == Dir::AtoB && s.psn == P + 2 && !held_once {
            held_once = true;
            Action::Hold
        } else {
            Action::Deliver
        }
    });
    // A first SEND, answered 100 µs later, gives a its round-trip time.
    let rtt = Duration::from_micros(100);
    let r0 = p.b.at(0, 16);
    p.b.post_recv(0, &[r0]);
    let s0 = p.a.at(0, 16);
    p.post_a(&[SendWr::new(0, SendOp::Send, &[s0])]);
    p.transmit();
    p.deliver();
    p.transmit();
    p.now += rtt;
    p.deliver();
    assert_eq!(statuses(&p.a.send_wcs()), [(0, WcStatus::Success)]);
    let before = p.a.stats().retransmits_nak;
    let r = p.b.at(0, len);
    p.b.post_recv(1, &[r]);
    let s = p.a.at(0, len);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    // P+2 arrives after P+3 and P+4 (reordered by two places), then everything else, all
    // within one round trip.
    p.transmit_at_most(4);
    let early = p.deliver();
    assert_eq!(early, 3);
    p.release_held(false);
    assert!(p.run_until_idle());
    let (a, b) = (p.a.stats(), p.b.stats());
    assert_eq!(a.timeout_retries, 0);
    // One round from P+2 (the NAK of the early P+3); the second NAK (for P+3, once the late
    // P+2 was taken) names a PSN that round already resent: an echo.
    assert_eq!(a.retransmits_nak - before, 7, "{a:?}");
    assert_eq!(b.seq_naks_sent, 2, "{b:?}");
    assert_eq!(
        statuses(&p.b.recv_wcs()),
        [(0, WcStatus::Success), (1, WcStatus::Success)]
    );
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
}

/// Trap 5: a sequence NAK for PSN n implicitly ACKs every PSN before n (§2.9): the SEND whose
/// own ACK was lost completes when the NAK arrives, before any retransmission.
#[test]
fn trap_05_sequence_nak_implicitly_acks_earlier_psns() {
    let mut p = Pair::new();
    for id in [1, 2] {
        let r = p.b.at(0, 1000);
        p.b.post_recv(id, &[r]);
    }
    let mut n = 0;
    p.set_filter(move |pkt| {
        let s = pkt.seen();
        let lose = (s.dir == Dir::BtoA && s.op == Acknowledge && s.psn == P)
            || (s.dir == Dir::AtoB && s.op == SendMiddle);
        if lose && n < 2 {
            n += 1;
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    let s1 = p.a.at(0, 10);
    let s2 = p.a.at(0, 600);
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[s1]),
        SendWr::new(2, SendOp::Send, &[s2]),
    ]);
    // One round: packets out, responses back, nothing resent yet.
    p.transmit();
    p.deliver();
    p.transmit(); // b's ACK(P) (dropped) and NAK(P+2)
    assert_eq!(p.deliver(), 1);
    assert_eq!(
        statuses(&p.a.send_wcs()),
        [(1, WcStatus::Success)],
        "the NAK for P+2 acknowledged P"
    );
    assert!(p.run_until_idle());
    assert_eq!(statuses(&p.a.send_wcs()), [(2, WcStatus::Success)]);
    let back = p.seen(Dir::BtoA);
    assert_eq!(opls(&back), [ack(P), ack(P + 2), ack(P + 3)]);
    assert_eq!(nak_of(&back[1]), Some(NakCode::PsnSequenceError));
}

// ---- RNR ---------------------------------------------------------------------------------

/// Trap 5 (RNR NAK PSN = the refused request's PSN) and §3.6/§3.7: with no receive posted the
/// responder answers an RNR NAK carrying its `min_rnr_timer` code; the requester sends nothing
/// (not even at its ACK timeout, which is shorter) until that RNR delay has passed, then
/// resends from the refused PSN.
#[test]
fn trap_05_rnr_nak_waits_the_rnr_delay_then_succeeds() {
    let mut p = Pair::with(Opts {
        min_rnr_timer: 14,
        ..Opts::default()
    });
    let delay = RnrTimer::from_code(14).duration();
    assert_eq!(delay, Duration::from_micros(1280));
    assert!(ack_timeout(p.opts.timeout) < delay);
    let ok = p.a.at(0, 10);
    let r0 = p.b.at(0, 64);
    p.b.post_recv(1, &[r0]);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[ok])]);
    assert!(p.run_until_idle());
    p.clear_trace();

    let s = p.a.at(0, 10);
    p.post_a(&[SendWr::new(2, SendOp::Send, &[s])]);
    assert!(p.flush());
    let back = p.seen(Dir::BtoA);
    assert_eq!(opls(&back), [ack(P + 1)]);
    assert_eq!(
        back[0].syndrome,
        Some(Syndrome::RnrNak {
            timer: RnrTimer::from_code(14)
        })
    );
    assert_eq!(p.next_deadline(), Some(at(delay)));
    // Nothing moves before the RNR delay, though the ACK timeout is shorter.
    assert!(p.run_until(at(delay - Duration::from_nanos(1))));
    assert_eq!(p.seen(Dir::AtoB).len(), 1);
    let r = p.b.at(0, 64);
    p.b.post_recv(2, &[r]);
    assert!(p.run_until_idle());
    let out = p.seen(Dir::AtoB);
    assert_eq!(
        out.iter().map(|s| (s.psn, s.at)).collect::<Vec<_>>(),
        [(P + 1, Instant::ZERO), (P + 1, at(delay))]
    );
    assert_eq!(
        statuses(&p.a.send_wcs()),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(
        statuses(&p.b.recv_wcs()),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let (a, b) = (p.a.stats(), p.b.stats());
    assert_eq!(
        (b.send_rnr_err, a.rcvd_rnr_err, a.retransmits_nak),
        (1, 1, 1)
    );
    assert_eq!(a.timeout_retries, 0);
}

/// Trap 7: RNR timer code 0 is the longest delay, 655.36 ms, not zero.
#[test]
fn trap_07_rnr_code_0_is_the_longest_delay() {
    let mut p = Pair::with(Opts {
        min_rnr_timer: 0,
        ..Opts::default()
    });
    let s = p.a.at(0, 10);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.flush());
    assert_eq!(p.next_deadline(), Some(at(Duration::from_micros(655_360))));
    let r = p.b.at(0, 64);
    p.b.post_recv(1, &[r]);
    assert!(p.run_until_idle());
    let out = p.seen(Dir::AtoB);
    assert_eq!(out[1].at, at(Duration::from_micros(655_360)));
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
}

/// `rnr_retry` exhausted: rnr_retry + 1 RNR NAKs, then RNR_RETRY_EXC_ERR for the WQE and
/// WR_FLUSH_ERR for every later one (trap 13); the QP is in ERR. The multi-packet SEND also
/// draws a PSN-sequence NAK for its MIDDLE packet while the RNR wait runs: that must not start
/// a transport retry (§3.7 "RNR wait"), so `retry_cnt` 0 does not turn this into
/// RETRY_EXC_ERR.
#[test]
fn rnr_retry_exhausted_then_flush() {
    let mut p = Pair::with(Opts {
        rnr_retry: 2,
        retry_cnt: 0,
        ..Opts::default()
    });
    let s1 = p.a.at(0, 600);
    let s2 = p.a.at(0, 10);
    let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[s1]),
        SendWr::new(2, SendOp::Send, &[s2]),
        SendWr::new(
            3,
            SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            },
            &[s2],
        ),
    ]);
    assert!(p.run_until_idle());
    let rnrs: Vec<_> = p
        .seen(Dir::BtoA)
        .into_iter()
        .filter(Seen::is_rnr)
        .map(|s| s.psn)
        .collect();
    assert_eq!(
        rnrs,
        [P, P, P],
        "rnr_retry + 1 RNR NAKs, all for the refused PSN"
    );
    assert_eq!(
        statuses(&p.a.send_wcs()),
        [
            (1, WcStatus::RnrRetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.a.state(), QpState::Err);
    assert_eq!(
        p.b.state(),
        QpState::Rts,
        "RNR is not an error for the responder"
    );
    let a = p.a.stats();
    assert_eq!((a.retry_rnr_exceeded_err, a.rcvd_rnr_err), (1, 3));
    assert_eq!(a.retry_exceeded_err, 0);
}

/// Trap 7: `rnr_retry` 7 means infinite: hundreds of RNR NAKs later the QP still waits.
#[test]
fn trap_07_rnr_retry_7_is_infinite() {
    let mut p = Pair::new();
    assert_eq!(p.opts.rnr_retry, 7);
    let s = p.a.at(0, 10);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.advance(Duration::from_millis(3)));
    let rnrs = p.seen(Dir::BtoA).into_iter().filter(Seen::is_rnr).count();
    assert!(rnrs > 200, "{rnrs} RNR NAKs");
    assert!(p.a.send_wcs().is_empty());
    assert_eq!(p.a.state(), QpState::Rts);
    let r = p.b.at(0, 64);
    p.b.post_recv(1, &[r]);
    assert!(p.run_until_idle());
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
}

// ---- transport retries -------------------------------------------------------------------

/// Trap 7 (`retry_cnt` 7 is finite per IBTA, unlike rxe) and §3.7/§3.9: with the peer silent,
/// the oldest request is sent exactly retry_cnt + 1 times, one local ACK timeout apart; then
/// RETRY_EXC_ERR, WR_FLUSH_ERR for the rest, QP in ERR.
#[test]
fn trap_07_retry_cnt_is_finite_peer_silent() {
    for retry_cnt in [0u8, 3, 7] {
        let mut p = Pair::with(Opts {
            retry_cnt,
            ..Opts::default()
        });
        let t = ack_timeout(p.opts.timeout);
        p.set_filter(|pkt| {
            if pkt.dir == Dir::AtoB {
                Action::Drop
            } else {
                Action::Deliver
            }
        });
        let s = p.a.at(0, 10);
        p.post_a(&[
            SendWr::new(1, SendOp::Send, &[s]),
            unsignaled(SendWr::new(2, SendOp::Send, &[s])),
        ]);
        assert!(p.run_until_idle());
        let first: Vec<_> = p
            .seen(Dir::AtoB)
            .into_iter()
            .filter(|s| s.psn == P)
            .map(|s| s.at)
            .collect();
        let want: Vec<_> = (0..=u32::from(retry_cnt)).map(|k| at(t * k)).collect();
        assert_eq!(first, want, "retry_cnt {retry_cnt}");
        assert_eq!(
            statuses(&p.a.send_wcs()),
            [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)],
            "an unsignaled WR still reports its flush"
        );
        assert_eq!(p.a.state(), QpState::Err);
        assert_eq!(p.now, at(t * (u32::from(retry_cnt) + 1)));
        let a = p.a.stats();
        assert_eq!(
            (a.retry_exceeded_err, a.timeout_retries),
            (1, u64::from(retry_cnt))
        );
        assert_eq!(p.next_deadline(), None);
    }
}

/// Trap 7: `timeout` 0 means an infinite local ACK timeout: no timer, no retransmission.
#[test]
fn trap_07_timeout_0_is_infinite() {
    let mut p = Pair::with(Opts {
        timeout: 0,
        ..Opts::default()
    });
    p.set_filter(|_| Action::Drop);
    let s = p.a.at(0, 10);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_until_idle());
    assert_eq!(p.next_deadline(), None);
    assert_eq!(p.seen(Dir::AtoB).len(), 1);
    assert!(p.a.send_wcs().is_empty());
    assert_eq!(p.a.state(), QpState::Rts);
}

// ---- remote errors -----------------------------------------------------------------------

/// The one NAK `b` sent, if any.
fn only_nak(p: &Pair) -> Seen {
    let naks: Vec<_> = p.seen(Dir::BtoA).into_iter().filter(Seen::is_nak).collect();
    assert_eq!(naks.len(), 1, "{naks:?}");
    naks[0]
}

/// Trap 13 and §4.4/§7.5: remote access violations (bad R_Key, out of bounds, an MR without
/// REMOTE_WRITE, an MR of another PD) draw NAK 0x62 for the offending PSN: REM_ACCESS_ERR at the
/// requester, both QPs in ERR, every other WQE on both sides flushed with WR_FLUSH_ERR, and a
/// WR posted in ERR is flushed at once.
#[test]
fn trap_13_remote_access_errors_nak_flush_and_err() {
    for case in [
        "bad rkey",
        "out of bounds",
        "no REMOTE_WRITE",
        "other PD",
        "read bad rkey",
        "atomic out of bounds",
    ] {
        let mut p = Pair::new();
        let ro =
            p.b.reg(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
        let pd2 = p.b.hca.alloc_pd().unwrap();
        let foreign = p.b.reg_in(pd2, 4096, ALL_ACCESS);
        let rb = p.b.at(0, 64);
        p.b.post_recv(50, &[rb]);
        let mr = p.b.mr;
        let s = p.a.at(0, 100);
        let res = p.a.at(512, 8);
        let op = match case {
            "bad rkey" => SendOp::RdmaWrite {
                remote_addr: mr.iova,
                rkey: mr.rkey ^ 0x100,
            },
            "out of bounds" => SendOp::RdmaWrite {
                remote_addr: mr.iova + MR_LEN - 10,
                rkey: mr.rkey,
            },
            "no REMOTE_WRITE" => SendOp::RdmaWrite {
                remote_addr: ro.iova,
                rkey: ro.rkey,
            },
            "other PD" => SendOp::RdmaWrite {
                remote_addr: foreign.iova,
                rkey: foreign.rkey,
            },
            "read bad rkey" => SendOp::RdmaRead {
                remote_addr: mr.iova,
                rkey: mr.rkey.wrapping_add(1),
            },
            _ => SendOp::AtomicFetchAndAdd {
                remote_addr: mr.iova + MR_LEN,
                rkey: mr.rkey,
                add: 1,
            },
        };
        let sges = if op.is_atomic() { [res] } else { [s] };
        p.post_a(&[
            SendWr::new(1, SendOp::Send, &[Node::sge(&p.a.mr, 0, 10)]),
            SendWr::new(2, op, &sges),
            unsignaled(SendWr::new(3, SendOp::Send, &[s])),
        ]);
        assert!(p.run_until_idle(), "{case}");
        let nak = only_nak(&p);
        assert_eq!(nak_of(&nak), Some(NakCode::RemoteAccessError), "{case}");
        assert_eq!(nak.psn, P + 1, "{case}: NAK carries the offending PSN");
        assert_eq!(
            statuses(&p.a.send_wcs()),
            [
                (1, WcStatus::Success),
                (2, WcStatus::RemAccessErr),
                (3, WcStatus::WrFlushErr)
            ],
            "{case}"
        );
        assert_eq!(
            (p.a.state(), p.b.state()),
            (QpState::Err, QpState::Err),
            "{case}"
        );
        // b's first receive took the SEND; nothing else was queued there.
        assert_eq!(
            statuses(&p.b.recv_wcs()),
            [(50, WcStatus::Success)],
            "{case}"
        );
        assert_eq!(p.b.read(&foreign, 0, 100), vec![0; 100]);
        assert_eq!(p.b.read(&ro, 0, 100), vec![0; 100]);
        // In ERR, posting still succeeds and the WR flushes at once (trap 13).
        p.post_a(&[SendWr::new(4, SendOp::Send, &[s])]);
        assert_eq!(statuses(&p.a.send_wcs()), [(4, WcStatus::WrFlushErr)]);
        let rb = p.b.at(0, 8);
        p.b.post_recv(51, &[rb]);
        assert_eq!(statuses(&p.b.recv_wcs()), [(51, WcStatus::WrFlushErr)]);
        assert!(p.run_until_idle());
        assert_eq!(p.seen(Dir::AtoB).len(), 3, "{case}: nothing sent in ERR");
    }
}

/// The responder's queued receive WQEs are flushed when a remote error moves it to ERR.
#[test]
fn trap_13_responder_error_flushes_its_receive_queue() {
    let mut p = Pair::new();
    for id in [60, 61] {
        let r = p.b.at(0, 64);
        p.b.post_recv(id, &[r]);
    }
    let s = p.a.at(0, 8);
    let mr = p.b.mr;
    p.post_a(&[SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: mr.iova,
            rkey: 0,
        },
        &[s],
    )]);
    assert!(p.run_until_idle());
    assert_eq!(
        statuses(&p.b.recv_wcs()),
        [(60, WcStatus::WrFlushErr), (61, WcStatus::WrFlushErr)]
    );
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::RemAccessErr)]);
}

/// §4.3: a QP whose `qp_access_flags` lack the right for the operation answers NAK 0x61
/// (invalid request, not remote access): REM_INV_REQ_ERR, both QPs in ERR.
#[test]
fn qp_access_flags_missing_nak_invalid_request() {
    for (access, op_name) in [
        (AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE, "read"),
        (AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ, "write"),
        (ALL_ACCESS - AccessFlags::REMOTE_ATOMIC, "atomic"),
    ] {
        let mut p = Pair::with(Opts {
            b_access: access,
            ..Opts::default()
        });
        let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
        let op = match op_name {
            "read" => SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            "write" => SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            },
            _ => SendOp::AtomicCmpAndSwp {
                remote_addr: va,
                rkey,
                compare: 0,
                swap: 1,
            },
        };
        let s = p.a.at(0, 8);
        p.post_a(&[SendWr::new(1, op, &[s])]);
        assert!(p.run_until_idle());
        let nak = only_nak(&p);
        assert_eq!(
            (nak_of(&nak), nak.psn),
            (Some(NakCode::InvalidRequest), P),
            "{op_name}"
        );
        assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::RemInvReqErr)]);
        assert_eq!((p.a.state(), p.b.state()), (QpState::Err, QpState::Err));
        assert_eq!(p.b.word(&p.b.mr, 0), 0, "{op_name}: memory untouched");
    }
}

/// §4.6: an atomic at a VA that is not 8-byte aligned (crafted: `post_send` refuses it) draws
/// NAK 0x61 and changes nothing.
#[test]
fn misaligned_atomic_va_nak_invalid_request() {
    let mut p = Pair::new();
    p.b.write(&p.b.mr, 0, &[7u8; 16]);
    let bth = bth(CompareSwap, p.b.qpn, P, true);
    let repr = PacketRepr {
        atomic_eth: Some(AtomicEthRepr {
            va: p.b.va(4),
            rkey: p.b.mr.rkey,
            swap_add: 0,
            compare: 0x0707_0707_0707_0707,
        }),
        ..PacketRepr::new(bth, &[])
    };
    let pkt = p.craft(Dir::AtoB, &repr);
    p.inject_pkt(&pkt);
    assert!(p.flush());
    let nak = only_nak(&p);
    assert_eq!((nak_of(&nak), nak.psn), (Some(NakCode::InvalidRequest), P));
    assert_eq!(p.b.read(&p.b.mr, 0, 16), vec![7u8; 16]);
    assert_eq!(p.b.state(), QpState::Err);
}

/// §4.3: a SEND larger than the receive buffers: the responder's receive WC is LOC_LEN_ERR
/// (DIVERGENCES.md #5), the requester's REM_INV_REQ_ERR (NAK 0x61); both QPs in ERR.
#[test]
fn receive_buffer_too_small_loc_len_err() {
    let mut p = Pair::new();
    let r = p.b.at(0, 100);
    p.b.post_recv(5, &[r]);
    let r2 = p.b.at(0, 100);
    p.b.post_recv(6, &[r2]);
    let s = p.a.at(0, 300);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_until_idle());
    let nak = only_nak(&p);
    assert_eq!((nak_of(&nak), nak.psn), (Some(NakCode::InvalidRequest), P));
    assert_eq!(
        statuses(&p.b.recv_wcs()),
        [(5, WcStatus::LocLenErr), (6, WcStatus::WrFlushErr)]
    );
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::RemInvReqErr)]);
    assert_eq!((p.a.state(), p.b.state()), (QpState::Err, QpState::Err));
}

/// §4.3 op-sequence: a MIDDLE with no message open ("missing FIRST") and a new FIRST/ONLY while
/// a message is open ("missing LAST") draw NAK 0x61 for that PSN; the QP enters ERR.
#[test]
fn out_of_sequence_opcode_nak_invalid_request() {
    // Missing FIRST.
    let mut p = Pair::new();
    let r = p.b.at(0, 1024);
    p.b.post_recv(1, &[r]);
    let payload = [1u8; 256];
    let pkt = p.craft(
        Dir::AtoB,
        &PacketRepr::new(bth(SendMiddle, p.b.qpn, P, false), &payload),
    );
    p.inject_pkt(&pkt);
    assert!(p.flush());
    let nak = only_nak(&p);
    assert_eq!((nak_of(&nak), nak.psn), (Some(NakCode::InvalidRequest), P));
    assert_eq!(p.b.state(), QpState::Err);
    assert_eq!(statuses(&p.b.recv_wcs()), [(1, WcStatus::WrFlushErr)]);

    // Missing LAST: FIRST, then ONLY.
    let mut p = Pair::new();
    let r = p.b.at(0, 1024);
    p.b.post_recv(1, &[r]);
    p.b.post_recv(2, &[r]);
    for (op, psn, len) in [(SendFirst, P, 256), (SendOnly, P + 1, 10)] {
        let pkt = p.craft(
            Dir::AtoB,
            &PacketRepr::new(bth(op, p.b.qpn, psn, false), &payload[..len]),
        );
        p.inject_pkt(&pkt);
    }
    assert!(p.flush());
    let nak = only_nak(&p);
    assert_eq!(
        (nak_of(&nak), nak.psn),
        (Some(NakCode::InvalidRequest), P + 1)
    );
    assert_eq!(p.b.state(), QpState::Err);
}

/// Trap 8 at the responder (§1.7): FIRST/MIDDLE must carry exactly one MTU, LAST 1..=MTU, and
/// a WRITE's payload must add up to its RETH length; otherwise NAK 0x61.
#[test]
fn trap_08_responder_enforces_packet_lengths() {
    let payload = [3u8; 300];
    /// (opcode, payload length, RETH length) of each crafted packet.
    type Crafted = Vec<(Opcode, usize, Option<u32>)>;
    let cases: [(&str, Crafted); 4] = [
        ("short FIRST", vec![(SendFirst, 100, None)]),
        (
            "empty LAST",
            vec![(SendFirst, 256, None), (SendLast, 0, None)],
        ),
        ("ONLY above MTU", vec![(SendOnly, 300, None)]),
        (
            "WRITE shorter than RETH",
            vec![(RdmaWriteOnly, 10, Some(20))],
        ),
    ];
    for (name, pkts) in cases {
        let mut p = Pair::new();
        let r = p.b.at(0, 1024);
        p.b.post_recv(1, &[r]);
        for (i, (op, len, reth)) in pkts.iter().enumerate() {
            let psn = P + i as u32;
            let mut repr = PacketRepr::new(bth(*op, p.b.qpn, psn, true), &payload[..*len]);
            repr.reth = reth.map(|dma_len| RethRepr {
                va: p.b.va(0),
                rkey: p.b.mr.rkey,
                dma_len,
            });
            let pkt = p.craft(Dir::AtoB, &repr);
            p.inject_pkt(&pkt);
        }
        assert!(p.flush());
        let nak = only_nak(&p);
        assert_eq!(
            (nak_of(&nak), nak.psn),
            (Some(NakCode::InvalidRequest), P + pkts.len() as u32 - 1),
            "{name}"
        );
        assert_eq!(p.b.state(), QpState::Err, "{name}");
    }
}

// ---- what must be ignored ----------------------------------------------------------------

/// §2.10: an ACK or NAK for a PSN that was never sent ("ghost ACK") is ignored: nothing
/// completes, nothing is retried, the genuine ACK still completes the WQE later.
#[test]
fn ghost_ack_is_ignored() {
    let mut p = Pair::new();
    let r = p.b.at(0, 64);
    p.b.post_recv(1, &[r]);
    // With nothing outstanding.
    for psn in [P, P + 50, P.wrapping_sub(100)] {
        let pkt = p.crafted_ack(psn, Syndrome::ACK_UNLIMITED);
        p.inject_pkt(&pkt);
    }
    assert!(p.flush());
    assert!(p.trace.is_empty());
    // With one SEND outstanding (its ACK held).
    p.set_filter(|pkt| {
        if pkt.dir == Dir::BtoA {
            Action::Hold
        } else {
            Action::Deliver
        }
    });
    let s = p.a.at(0, 10);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.flush());
    let before = p.a.stats().duplicate_response;
    for (psn, syn) in [
        (P + 1, Syndrome::ACK_UNLIMITED),
        (P + 7, Syndrome::ACK_UNLIMITED),
        (P + 1, Syndrome::Nak(NakCode::PsnSequenceError)),
        (P + 1, Syndrome::Nak(NakCode::RemoteAccessError)),
    ] {
        let pkt = p.crafted_ack(psn, syn);
        p.inject_pkt(&pkt);
    }
    assert!(p.flush());
    assert!(p.a.send_wcs().is_empty(), "a ghost ACK completed nothing");
    assert_eq!(p.a.state(), QpState::Rts);
    assert_eq!(p.a.stats().duplicate_response - before, 4);
    assert_eq!(p.seen(Dir::AtoB).len(), 1, "nothing resent");
    p.clear_filter();
    p.release_held(false);
    assert!(p.run_until_idle());
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
}

/// §2.10: stale duplicate responses (replayed READ responses, ATOMIC ACKs and ACKs of
/// completed WQEs) are ignored: no completion, no memory write.
#[test]
fn stale_duplicate_responses_are_ignored() {
    let mut p = Pair::new();
    p.b.write(&p.b.mr, 0, &pattern(600, 1));
    let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
    let dst = p.a.at(0, 600);
    let res = p.a.at(1000, 8);
    let r = p.b.at(2000, 64);
    p.b.post_recv(1, &[r]);
    p.post_a(&[
        SendWr::new(
            1,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[dst],
        ),
        SendWr::new(
            2,
            SendOp::AtomicFetchAndAdd {
                remote_addr: va + 1024,
                rkey,
                add: 1,
            },
            &[res],
        ),
        SendWr::new(3, SendOp::Send, &[res]),
    ]);
    assert!(p.run_until_idle());
    assert_eq!(p.a.send_wcs().len(), 3);
    // Scribble over the local buffers, then replay every response b ever sent.
    p.a.write(&p.a.mr, 0, &[0xEE; 600]);
    p.a.write(&p.a.mr, 1000, &[0xEE; 8]);
    let replay: Vec<_> = p
        .raw
        .iter()
        .filter(|pkt| pkt.dir == Dir::BtoA)
        .cloned()
        .collect();
    assert_eq!(replay.len(), 5);
    let before = p.a.stats().duplicate_response;
    for pkt in &replay {
        p.inject_pkt(pkt);
    }
    assert!(p.flush());
    // The ACK of the last PSN (comp_psn − 1) is the one a responder re-sends for duplicates:
    // it is processed as an ACK that changes nothing; the four older ones count as duplicates.
    assert_eq!(p.a.stats().duplicate_response - before, 4);
    assert!(p.a.send_wcs().is_empty());
    assert_eq!(p.a.read(&p.a.mr, 0, 600), vec![0xEE; 600]);
    assert_eq!(p.a.read(&p.a.mr, 1000, 8), vec![0xEE; 8]);
    assert_eq!(p.a.state(), QpState::Rts);
    assert_eq!(p.next_deadline(), None);
}

/// §1.10: runts, garbage, bad ICRCs, unknown opcodes (CNP 0x81, UC), TVer ≠ 0 and unknown
/// destination QPs are counted (`icrc_errors`, `dropped`) and never answered.
#[test]
fn malformed_truncated_and_bad_icrc_datagrams_are_counted_and_dropped() {
    let mut p = Pair::new();
    let r = p.b.at(0, 64);
    p.b.post_recv(1, &[r]);
    let good = p.craft(
        Dir::AtoB,
        &PacketRepr::new(bth(SendOnly, p.b.qpn, P, true), &[1, 2, 3, 4, 5]),
    );
    let src = good.src;
    let base = p.b.hca.stats();

    let mut bad_icrc: Vec<Vec<u8>> = vec![
        vec![],
        vec![0x04, 0, 0],
        pattern(20, 3),
        good.bytes[..good.bytes.len() - 1].to_vec(),
    ];
    let mut flipped = good.bytes.clone();
    flipped[13] ^= 1;
    bad_icrc.push(flipped);
    for bytes in &bad_icrc {
        p.inject(common::Side::B, src, bytes);
    }
    let after_icrc = p.b.hca.stats();
    assert_eq!(
        after_icrc.icrc_errors - base.icrc_errors,
        bad_icrc.len() as u64
    );

    // Valid ICRC, but undecodable or for no QP.
    let mut resealed = Vec::new();
    for edit in 0..4 {
        let mut pkt = good.clone();
        {
            let mut pk = Packet::new_unchecked(pkt.bytes.as_mut_slice());
            let mut b = pk.bth_mut();
            match edit {
                0 => b.set_opcode(Opcode::from(0x81)), // CNP
                1 => b.set_opcode(Opcode::from(0x24)), // UC SEND_ONLY
                2 => b.set_tver(1),
                _ => b.set_dest_qp(0x77_7777),
            }
        }
        pkt.reseal();
        resealed.push(pkt);
    }
    for pkt in &resealed {
        p.inject_pkt(pkt);
    }
    let after = p.b.hca.stats();
    assert_eq!(after.dropped - after_icrc.dropped, 4);
    assert_eq!(after.icrc_errors, after_icrc.icrc_errors);
    assert!(p.flush());
    assert!(p.trace.is_empty(), "nothing answered");
    assert!(p.b.recv_wcs().is_empty());

    // The genuine packet is still accepted in order afterwards.
    p.inject_pkt(&good);
    assert!(p.flush());
    assert_eq!(opls(&p.seen(Dir::BtoA)), [ack(P)]);
    assert_eq!(
        brief(&p.b.recv_wcs()),
        [(1, WcStatus::Success, WcOpcode::Recv, 5)]
    );
}

/// Trap 10: a packet from a source IP other than the QP's AV, or with a P_Key whose low 15 bits
/// are not 0x7FFF, is dropped silently (no NAK, no state change); a limited-member P_Key
/// 0x7FFF is accepted since our own P_Key 0xFFFF is a full member (§1.2).
#[test]
fn trap_10_foreign_source_and_pkey_are_dropped_silently() {
    let mut p = Pair::new();
    let r = p.b.at(0, 64);
    p.b.post_recv(1, &[r]);
    let repr = PacketRepr::new(bth(SendOnly, p.b.qpn, P, true), &[9; 8]);
    let good = p.craft(Dir::AtoB, &repr);

    let mut foreign = good.clone();
    foreign.src = SocketAddr::new(Ipv4Addr::new(127, 0, 0, 3).into(), good.src.port());
    foreign.reseal();
    p.inject_pkt(&foreign);
    for pkey in [0x7FFE, 0xFFFE, 0x8000, 0x0000] {
        let pkt = p.craft(
            Dir::AtoB,
            &PacketRepr {
                bth: BthRepr { pkey, ..repr.bth },
                ..repr
            },
        );
        p.inject_pkt(&pkt);
    }
    // A CNP to a's QP with a valid ICRC: ignored, not NAKed (§1.3).
    let mut cnp = p.crafted_ack(P, Syndrome::ACK_UNLIMITED);
    Packet::new_unchecked(cnp.bytes.as_mut_slice())
        .bth_mut()
        .set_opcode(Opcode::from(0x81));
    cnp.reseal();
    p.inject_pkt(&cnp);
    assert!(p.flush());
    assert!(p.trace.is_empty());
    assert_eq!(p.b.stats().dropped, 5);
    assert!(p.b.recv_wcs().is_empty());

    // Still expecting P: the limited-member P_Key is accepted.
    let limited = p.craft(
        Dir::AtoB,
        &PacketRepr {
            bth: BthRepr {
                pkey: 0x7FFF,
                ..repr.bth
            },
            ..repr
        },
    );
    p.inject_pkt(&limited);
    assert!(p.flush());
    assert_eq!(opls(&p.seen(Dir::BtoA)), [ack(P)]);
    assert_eq!(statuses(&p.b.recv_wcs()), [(1, WcStatus::Success)]);
}

// ---- PSN arithmetic, ordering, limits ----------------------------------------------------

/// Trap 4: PSNs wrap at 2^24 and are compared as signed 24-bit distances. a starts at
/// 0xFFFFFE: a 4-packet SEND spans the wrap (one packet lost there), a READ follows (one
/// response lost), then a SEND; b starts at 0xFFFFFF for a multi-packet WRITE the other way.
#[test]
fn trap_04_psn_wraparound() {
    let mut p = Pair::with(Opts {
        a_psn: 0xFF_FFFE,
        b_psn: 0xFF_FFFF,
        ..Opts::default()
    });
    let data = pattern(1000, 6);
    p.a.write(&p.a.mr, 0, &data);
    let remote = pattern(600, 7);
    p.b.write(&p.b.mr, 8192, &remote);
    for id in [1, 2] {
        let r = p.b.at(0, 1000);
        p.b.post_recv(id, &[r]);
    }
    let mut lost = [false; 2];
    p.set_filter(move |pkt| {
        let s = pkt.seen();
        let i = match (s.op, s.psn) {
            (SendMiddle, 0) => 0,
            (RdmaReadResponseMiddle, 3) => 1,
            _ => return Action::Deliver,
        };
        if lost[i] {
            Action::Deliver
        } else {
            lost[i] = true;
            Action::Drop
        }
    });
    let s = p.a.at(0, 1000);
    let d = p.a.at(4096, 600);
    let small = p.a.at(0, 10);
    let (va, rkey) = (p.b.va(8192), p.b.mr.rkey);
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[s]),
        SendWr::new(
            2,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[d],
        ),
        SendWr::new(3, SendOp::Send, &[small]),
    ]);
    let (ava, arkey) = (p.a.va(20_000), p.a.mr.rkey);
    p.b.write(&p.b.mr, 30_000, &pattern(700, 8));
    let bs = p.b.at(30_000, 700);
    p.post_b(&[SendWr::new(
        9,
        SendOp::RdmaWrite {
            remote_addr: ava,
            rkey: arkey,
        },
        &[bs],
    )]);
    assert!(p.run_until_idle());
    let first: Vec<_> = p
        .seen(Dir::AtoB)
        .iter()
        .filter(|s| s.op.is_request())
        .take(6)
        .map(|s| (s.op, s.psn))
        .collect();
    assert_eq!(
        first,
        [
            (SendFirst, 0xFF_FFFE),
            (SendMiddle, 0xFF_FFFF),
            (SendMiddle, 0),
            (SendLast, 1),
            (RdmaReadRequest, 2),
            (SendOnly, 5)
        ]
    );
    let naks: Vec<_> = p.seen(Dir::BtoA).into_iter().filter(Seen::is_nak).collect();
    assert_eq!(naks.iter().map(|s| s.psn).collect::<Vec<_>>(), [0]);
    let rereads: Vec<_> = p
        .seen(Dir::AtoB)
        .into_iter()
        .filter(|s| s.op == RdmaReadRequest)
        .map(|s| (s.psn, s.reth.unwrap().va - va, s.reth.unwrap().dma_len))
        .collect();
    assert_eq!(rereads.last(), Some(&(3, 256, 344)), "{rereads:?}");
    let bw: Vec<_> = p
        .seen(Dir::BtoA)
        .iter()
        .filter(|s| s.op.is_request())
        .map(|s| (s.op, s.psn))
        .collect();
    assert_eq!(
        bw,
        [
            (RdmaWriteFirst, 0xFF_FFFF),
            (RdmaWriteMiddle, 0),
            (RdmaWriteLast, 1)
        ]
    );
    assert_eq!(
        statuses(&p.a.send_wcs()),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(statuses(&p.b.send_wcs()), [(9, WcStatus::Success)]);
    assert_eq!(p.b.read(&p.b.mr, 0, 1000), data);
    assert_eq!(p.a.read(&p.a.mr, 4096, 600), remote);
    assert_eq!(p.a.read(&p.a.mr, 20_000, 700), pattern(700, 8));
}

/// §3.4: with `max_rd_atomic` 1 the second READ (and the SEND queued behind it, in-order issue)
/// waits until the first READ completed.
#[test]
fn max_rd_atomic_limits_outstanding_reads() {
    let mut p = Pair::with(Opts {
        max_rd_atomic: 1,
        ..Opts::default()
    });
    let r = p.b.at(0, 64);
    p.b.post_recv(1, &[r]);
    let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
    let d1 = p.a.at(0, 300);
    let d2 = p.a.at(1000, 300);
    let s = p.a.at(0, 4);
    let read = SendOp::RdmaRead {
        remote_addr: va,
        rkey,
    };
    p.post_a(&[
        SendWr::new(1, read, &[d1]),
        SendWr::new(2, read, &[d2]),
        SendWr::new(3, SendOp::Send, &[s]),
    ]);
    assert!(p.run_until_idle());
    let order: Vec<_> = p.trace.iter().map(|(s, _)| (s.dir, s.op, s.psn)).collect();
    assert_eq!(
        order,
        [
            (Dir::AtoB, RdmaReadRequest, P),
            (Dir::BtoA, RdmaReadResponseFirst, P),
            (Dir::BtoA, RdmaReadResponseLast, P + 1),
            (Dir::AtoB, RdmaReadRequest, P + 2),
            (Dir::AtoB, SendOnly, P + 4),
            (Dir::BtoA, RdmaReadResponseFirst, P + 2),
            (Dir::BtoA, RdmaReadResponseLast, P + 3),
            (Dir::BtoA, Acknowledge, P + 4),
        ]
    );
    assert_eq!(p.a.send_wcs().len(), 3);
}

/// §3.3: a FENCEd WR waits for every earlier READ/atomic to complete; without FENCE it goes
/// out right behind the READ.
#[test]
fn fence_waits_for_prior_reads() {
    for fence in [true, false] {
        let mut p = Pair::new();
        let r = p.b.at(0, 64);
        p.b.post_recv(1, &[r]);
        let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
        let d = p.a.at(0, 600);
        let s = p.a.at(0, 4);
        let flags = if fence {
            SendFlags::SIGNALED | SendFlags::FENCE
        } else {
            SendFlags::SIGNALED
        };
        p.post_a(&[
            SendWr::new(
                1,
                SendOp::RdmaRead {
                    remote_addr: va,
                    rkey,
                },
                &[d],
            ),
            SendWr::new(2, SendOp::Send, &[s]).with_flags(flags),
        ]);
        assert!(p.run_until_idle());
        let order: Vec<_> = p.trace.iter().map(|(s, _)| (s.dir, s.op)).collect();
        let send_at = order
            .iter()
            .position(|x| *x == (Dir::AtoB, SendOnly))
            .unwrap();
        let last_resp = order
            .iter()
            .position(|x| *x == (Dir::BtoA, RdmaReadResponseLast))
            .unwrap();
        if fence {
            assert!(send_at > last_resp, "{order:?}");
        } else {
            assert_eq!(send_at, 1, "{order:?}");
        }
        assert_eq!(
            statuses(&p.a.send_wcs()),
            [(1, WcStatus::Success), (2, WcStatus::Success)]
        );
    }
}

/// §3.2: an unsignaled WR gives no completion on success, but an error always does (IBA
/// 10.7.3.1).
#[test]
fn unsignaled_success_is_silent_but_errors_complete() {
    let mut p = Pair::new();
    for id in [1, 2] {
        let r = p.b.at(0, 64);
        p.b.post_recv(id, &[r]);
    }
    let s = p.a.at(0, 4);
    p.post_a(&[
        unsignaled(SendWr::new(1, SendOp::Send, &[s])),
        SendWr::new(2, SendOp::Send, &[s]),
    ]);
    assert!(p.run_until_idle());
    assert_eq!(statuses(&p.a.send_wcs()), [(2, WcStatus::Success)]);
    let mr = p.b.mr;
    p.post_a(&[unsignaled(SendWr::new(
        3,
        SendOp::RdmaWrite {
            remote_addr: mr.iova,
            rkey: mr.rkey ^ 0xFF,
        },
        &[s],
    ))]);
    assert!(p.run_until_idle());
    assert_eq!(statuses(&p.a.send_wcs()), [(3, WcStatus::RemAccessErr)]);
}

/// Completions come in posting order per QP, whatever order the responses arrive in: the READ
/// responses are held and released late (reversed) while the ACKs of later WRs arrive.
#[test]
fn completions_in_posting_order() {
    let mut p = Pair::new();
    let r = p.b.at(4000, 64);
    p.b.post_recv(1, &[r]);
    let r = p.b.at(4100, 64);
    p.b.post_recv(2, &[r]);
    let remote = pattern(300, 9);
    p.b.write(&p.b.mr, 0, &remote);
    let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
    let s = p.a.at(8000, 16);
    let d = p.a.at(0, 300);
    let res = p.a.at(512, 8);
    p.set_filter(move |pkt| {
        if pkt.seen().op.is_read_response() {
            Action::Hold
        } else {
            Action::Deliver
        }
    });
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[s]),
        SendWr::new(
            2,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[d],
        ),
        SendWr::new(
            3,
            SendOp::RdmaWrite {
                remote_addr: va + 1000,
                rkey,
            },
            &[s],
        ),
        SendWr::new(
            4,
            SendOp::AtomicFetchAndAdd {
                remote_addr: va + 2048,
                rkey,
                add: 3,
            },
            &[res],
        ),
        SendWr::new(5, SendOp::Send, &[s]),
    ]);
    assert!(p.flush());
    // The ACK past the READ made a re-read it at once (§2.8); its responses are held too.
    assert_eq!(p.held(), 4);
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
    p.clear_filter();
    p.release_held(true);
    assert!(p.run_until_idle());
    assert_eq!(
        statuses(&p.a.send_wcs()),
        [
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success),
            (5, WcStatus::Success)
        ]
    );
    assert_eq!(p.a.read(&p.a.mr, 0, 300), remote);
    assert_eq!(p.b.word(&p.b.mr, 2048), 3, "the FETCH_ADD executed once");
    assert_eq!(p.a.word(&p.a.mr, 512), 0);
    assert_eq!(
        statuses(&p.b.recv_wcs()),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

/// §5.1/§5.3: RTS → SQD with EN_SQD_ASYNC_NOTIFY raises SQ_DRAINED only once the outstanding
/// WQEs completed; a WR posted in SQD is queued, not started, until SQD → RTS.
#[test]
fn sqd_raises_sq_drained_after_outstanding_wqes_complete() {
    let mut p = Pair::new();
    for id in [1, 2] {
        let r = p.b.at(0, 1000);
        p.b.post_recv(id, &[r]);
    }
    p.set_filter(|pkt| {
        if pkt.dir == Dir::BtoA {
            Action::Hold
        } else {
            Action::Deliver
        }
    });
    let s = p.a.at(0, 1000);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.flush());
    let sqd = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    let now = p.now;
    p.a.modify(
        now,
        &sqd,
        QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY,
    )
    .unwrap();
    assert_eq!(p.a.state(), QpState::Sqd);
    assert!(p.a.events().is_empty(), "still draining");
    // Leaving SQD while draining is refused (§5.1).
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    assert_eq!(
        p.a.modify(now, &rts, QpAttrMask::STATE).unwrap_err().kind,
        ErrorKind::InvalidState
    );
    let s2 = p.a.at(0, 10);
    p.post_a(&[SendWr::new(2, SendOp::Send, &[s2])]);
    assert!(p.flush());
    assert_eq!(p.seen(Dir::AtoB).len(), 4, "nothing new starts in SQD");
    p.clear_filter();
    p.release_held(false);
    assert!(p.flush());
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
    let ev = p.a.events();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].kind, AsyncEventKind::SqDrained);
    assert_eq!(ev[0].element, EventElement::Qp(p.a.qpn));
    assert_eq!(p.seen(Dir::AtoB).len(), 4);
    let now = p.now;
    p.a.modify(now, &rts, QpAttrMask::STATE).unwrap();
    assert!(p.run_until_idle());
    assert_eq!(statuses(&p.a.send_wcs()), [(2, WcStatus::Success)]);
    assert_eq!(p.seen(Dir::AtoB).last().map(|s| s.psn), Some(P + 4));
}

// ---- header-level traps ------------------------------------------------------------------

/// Traps 1 and 2. The ICRC algorithm itself is tested against the two published vectors of
/// rc-transport.md §1.8 in `emu/proto/src/wire/icrc.rs` (`published_vectors_from_wire_headers`,
/// `published_vectors_from_ip_context`) and the IPv4 header layout in
/// `emu/proto/src/wire/ip.rs` (`ipv4_headers_match_spec_vector_layout`). Here: every packet
/// either engine emits in a mixed exchange carries a valid ICRC for IPv4 ID 0 (the harness
/// checks each one), and trap 2 holds: the same bytes fail the check if the IP ID is anything
/// else, since the ICRC covers it.
#[test]
fn trap_01_02_every_emitted_packet_passes_check_icrc() {
    let mut p = Pair::new();
    let r = p.b.at(0, 1000);
    p.b.post_recv(1, &[r]);
    let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
    let s = p.a.at(0, 700);
    let res = p.a.at(4096, 8);
    p.post_a(&[
        SendWr::new(1, SendOp::SendWithImm { imm: 5 }, &[s]),
        SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            },
            &[s],
        ),
        SendWr::new(
            3,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[s],
        ),
        SendWr::new(
            4,
            SendOp::AtomicCmpAndSwp {
                remote_addr: va + 1024,
                rkey,
                compare: 0,
                swap: 1,
            },
            &[res],
        ),
    ]);
    let mut n = 0;
    p.set_filter(move |_| {
        n += 1;
        if n == 2 {
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    assert!(p.run_until_idle());
    assert!(p.raw.len() > 12);
    for pkt in &p.raw {
        check_icrc(&pkt.ip(), &pkt.bytes).unwrap();
        let mut other = pkt.ip();
        if let IpAddrs::V4 { ident, .. } = &mut other.addrs {
            *ident = 1;
        }
        assert!(check_icrc(&other, &pkt.bytes).is_err());
        let swapped = IpContext {
            src_port: pkt.ip().src_port ^ 1,
            ..pkt.ip()
        };
        assert!(
            check_icrc(&swapped, &pkt.bytes).is_err(),
            "the ICRC covers the UDP ports"
        );
    }
    assert_eq!(p.a.send_wcs().len(), 4);
    assert_eq!(
        ip_ctx(p.raw[0].src, p.raw[0].dst).src_port,
        emu_proto::wire::ip::udp_sport(p.a.qpn, p.b.qpn)
    );
}

/// Trap 11: every ACK, ATOMIC ACKNOWLEDGE and AETH-carrying READ response advertises
/// unlimited credits (syndrome 0x1F); MIDDLE responses carry no AETH.
#[test]
fn trap_11_acks_advertise_unlimited_credits() {
    let mut p = Pair::new();
    let r = p.b.at(0, 1000);
    p.b.post_recv(1, &[r]);
    let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
    let s = p.a.at(0, 900);
    let res = p.a.at(4096, 8);
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[s]),
        SendWr::new(
            2,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[s],
        ),
        SendWr::new(
            3,
            SendOp::AtomicFetchAndAdd {
                remote_addr: va + 1024,
                rkey,
                add: 1,
            },
            &[res],
        ),
        SendWr::new(
            4,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[res],
        ),
    ]);
    assert!(p.run_until_idle());
    let back = p.seen(Dir::BtoA);
    assert_eq!(back.len(), 1 + 4 + 1 + 1);
    for s in &back {
        if s.op == RdmaReadResponseMiddle {
            assert_eq!(s.syndrome, None);
        } else {
            assert_eq!(s.syndrome, Some(Syndrome::ACK_UNLIMITED), "{s:?}");
            assert_eq!(u8::from(s.syndrome.unwrap()), 0x1F);
        }
    }
}

/// Trap 12: the modify masks must match §5.1 exactly; an extra or a missing bit is EINVAL and
/// changes nothing (the connected QP then keeps working with its old PSNs).
#[test]
fn trap_12_modify_masks_are_exact_and_failed_modify_changes_nothing() {
    let mut p = Pair::new();
    let now = p.now;
    let before = p.a.hca.query_qp(p.a.qpn).unwrap();
    // RTS → RTS may not carry SQ_PSN or TIMEOUT.
    for extra in [QpAttrMask::SQ_PSN, QpAttrMask::TIMEOUT, QpAttrMask::RQ_PSN] {
        let attr = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: 0x77,
            rq_psn: 0x77,
            timeout: 1,
            ..before
        };
        let err =
            p.a.modify(now, &attr, QpAttrMask::STATE | extra)
                .unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{extra:?}");
    }
    assert_eq!(p.a.hca.query_qp(p.a.qpn).unwrap(), before);
    // A fresh QP: RESET → INIT with a missing or an extra bit.
    let pd = p.a.pd;
    let cq = p.a.scq;
    let qpn =
        p.a.hca
            .create_qp(pd, cq, cq, None, &verbs_api::QpInitAttr::rc(p.opts.cap))
            .unwrap();
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    for mask in [
        connect::INIT_MASK - QpAttrMask::PORT,
        connect::INIT_MASK | QpAttrMask::TIMEOUT,
    ] {
        let err = p.a.hca.modify_qp(now, qpn, &init, mask).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert_eq!(p.a.hca.query_qp(qpn).unwrap().qp_state, QpState::Reset);
    }
    p.a.hca
        .modify_qp(now, qpn, &init, connect::INIT_MASK)
        .unwrap();
    // The connected pair still uses its original PSNs.
    let r = p.b.at(0, 8);
    p.b.post_recv(1, &[r]);
    let s = p.a.at(0, 8);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_until_idle());
    assert_eq!(opls(&p.seen(Dir::AtoB)), [(SendOnly, P, 8)]);
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
}

/// Trap 6 / §4.5: a duplicate SEND is re-ACKed with the last ACKed *request* PSN, never with a
/// READ-response PSN (rxe fix 4e4c53df5677, [S48]): after SEND P and READ P+1..P+3 were
/// accepted, a resent SEND P draws ACK P, so the requester does not take it as "the READ's
/// responses were lost" and re-read.
#[test]
fn trap_06_duplicate_send_after_read_is_reacked_with_a_request_psn() {
    let mut p = Pair::new();
    let t = ack_timeout(p.opts.timeout);
    let r = p.b.at(0, 64);
    p.b.post_recv(1, &[r]);
    let remote = pattern(600, 2);
    p.b.write(&p.b.mr, 1000, &remote);
    let mut first_round = true;
    p.set_filter(move |pkt| {
        let s = pkt.seen();
        if s.at > Instant::ZERO {
            first_round = false;
        }
        if first_round && s.dir == Dir::BtoA {
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    let (va, rkey) = (p.b.va(1000), p.b.mr.rkey);
    let s = p.a.at(0, 10);
    let d = p.a.at(100, 600);
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[s]),
        SendWr::new(
            2,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[d],
        ),
    ]);
    assert!(p.run_until_idle());
    let resent: Vec<_> = p
        .seen(Dir::BtoA)
        .into_iter()
        .filter(|s| s.at == at(t))
        .map(|s| (s.op, s.psn))
        .collect();
    assert_eq!(
        resent,
        [
            (Acknowledge, P),
            (RdmaReadResponseFirst, P + 1),
            (RdmaReadResponseMiddle, P + 2),
            (RdmaReadResponseLast, P + 3)
        ]
    );
    let reads = p
        .seen(Dir::AtoB)
        .iter()
        .filter(|s| s.op == RdmaReadRequest)
        .count();
    assert_eq!(
        reads, 2,
        "one original, one timeout resend, no spurious re-read"
    );
    assert_eq!(
        statuses(&p.a.send_wcs()),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.a.read(&p.a.mr, 100, 600), remote);
}

// ---- limits, local errors, bookkeeping ---------------------------------------------------

/// §2.11: at most 64 un-ACKed PSNs per QP (rxe allows 128 PSNs, `RXE_MAX_UNACKED_PSNS`, and
/// 64 packets in flight; we use the lower bound as the window, DIVERGENCES.md #20); the
/// requester resumes as ACKs come back. AckReq is also set inside long messages (every 64th
/// packet, §2.7).
#[test]
fn at_most_64_unacked_psns_then_resume() {
    let mut p = Pair::new();
    for id in 0..50 {
        let r = p.b.at(0, 768);
        p.b.post_recv(id, &[r]);
    }
    p.set_filter(|pkt| {
        if pkt.dir == Dir::BtoA {
            Action::Hold
        } else {
            Action::Deliver
        }
    });
    let s = [p.a.at(0, 768)];
    let wrs: Vec<_> = (0..50)
        .map(|i| unsignaled(SendWr::new(i, SendOp::Send, &s)))
        .collect();
    p.post_a(&wrs);
    assert!(p.flush());
    let out = p.seen(Dir::AtoB);
    assert_eq!(out.len(), 64);
    assert_eq!(out.last().map(|s| s.psn), Some(P + 63));
    p.clear_filter();
    p.release_held(false);
    assert!(p.run_until_idle());
    assert_eq!(p.seen(Dir::AtoB).len(), 150);
    assert_eq!(p.b.recv_wcs().len(), 50);
    assert!(p.a.send_wcs().is_empty(), "all unsignaled");
    assert_eq!(p.next_deadline(), None);

    // One long message: AckReq on packets 64, 128 and the last.
    let mut p = Pair::with(Opts {
        cap: verbs_api::QpCap {
            max_send_sge: 1,
            ..Opts::default().cap
        },
        ..Opts::default()
    });
    let r = p.b.at(0, 40_000);
    p.b.post_recv(1, &[r]);
    let s = p.a.at(0, 150 * 256);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_until_idle());
    let reqs: Vec<u32> = p
        .seen(Dir::AtoB)
        .iter()
        .filter(|s| s.ack_req)
        .map(|s| s.psn - P)
        .collect();
    assert_eq!(reqs, [63, 127, 149]);
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
}

/// §3.9 / DIVERGENCES.md #4: a WR whose SGE names a bad lkey (or an MR without LOCAL_WRITE for
/// a READ destination) completes with LOC_PROT_ERR in order, after the WRs before it, and is
/// never sent; the rest is flushed.
#[test]
fn local_protection_errors_complete_in_order() {
    let mut p = Pair::new();
    let ro = p.a.reg(4096, AccessFlags::empty());
    for id in [1, 2] {
        let r = p.b.at(0, 64);
        p.b.post_recv(id, &[r]);
    }
    let ok = p.a.at(0, 8);
    let bad = verbs_api::Sge {
        lkey: p.a.mr.lkey ^ 0x100,
        ..ok
    };
    let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[ok]),
        SendWr::new(2, SendOp::Send, &[bad]),
        SendWr::new(3, SendOp::Send, &[ok]),
    ]);
    assert!(p.run_until_idle());
    assert_eq!(
        statuses(&p.a.send_wcs()),
        [
            (1, WcStatus::Success),
            (2, WcStatus::LocProtErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(opls(&p.seen(Dir::AtoB)), [(SendOnly, P, 8)]);
    assert_eq!(p.a.state(), QpState::Err);

    let mut p = Pair::new();
    let dst = Node::sge(&ro, 0, 64);
    p.post_a(&[SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: va,
            rkey,
        },
        &[dst],
    )]);
    assert!(p.run_until_idle());
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::LocProtErr)]);
    assert!(p.trace.is_empty());
}

/// A zero-length READ is one request and one RDMA_READ_RESPONSE_ONLY without payload; its
/// R_Key and VA are not checked (C9-88). A QP created with `sq_sig_all` signals every WR.
#[test]
fn zero_length_read_and_sq_sig_all() {
    let mut p = Pair::with(Opts {
        sq_sig_all: true,
        ..Opts::default()
    });
    p.post_a(&[unsignaled(SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: 0x42,
            rkey: 0xBAD,
        },
        &[],
    ))]);
    assert!(p.run_until_idle());
    assert_eq!(opls(&p.seen(Dir::AtoB)), [(RdmaReadRequest, P, 0)]);
    assert_eq!(opls(&p.seen(Dir::BtoA)), [(RdmaReadResponseOnly, P, 0)]);
    assert_eq!(
        brief(&p.a.send_wcs()),
        [(1, WcStatus::Success, WcOpcode::RdmaRead, 0)]
    );
}

/// §4.4: each READ response packet resolves the R_Key again; an MR deregistered in the middle
/// of a READ turns the rest into NAK 0x62 for the next response PSN: REM_ACCESS_ERR at the
/// requester, and the responder QP enters ERR like any class C error (§4.3).
#[test]
fn mr_deregistered_mid_read_naks_remote_access() {
    let mut p = Pair::new();
    let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
    let d = p.a.at(0, 768);
    let r = p.b.at(1000, 8);
    p.b.post_recv(9, &[r]);
    p.post_a(&[SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: va,
            rkey,
        },
        &[d],
    )]);
    p.transmit();
    p.deliver();
    assert_eq!(p.transmit_at_most(1), 1, "the READ response FIRST");
    let lkey = p.b.mr.lkey;
    p.b.hca.dereg_mr(lkey).unwrap();
    assert!(p.run_until_idle());
    let back = p.seen(Dir::BtoA);
    assert_eq!(back[0].opl(), (RdmaReadResponseFirst, P, 256));
    assert_eq!(back.len(), 2, "{back:?}");
    assert_eq!(
        (nak_of(&back[1]), back[1].psn),
        (Some(NakCode::RemoteAccessError), P + 1)
    );
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::RemAccessErr)]);
    assert_eq!(p.a.state(), QpState::Err);
    assert_eq!(p.b.state(), QpState::Err);
    assert_eq!(statuses(&p.b.recv_wcs()), [(9, WcStatus::WrFlushErr)]);
}

/// `Hca::stats` sums live and destroyed QPs (stats.rs); destroying a QP leaves no timer behind.
#[test]
fn device_stats_include_destroyed_qps_and_destroy_clears_timers() {
    let mut p = Pair::new();
    p.set_filter(|_| Action::Drop);
    let s = p.a.at(0, 8);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.flush());
    assert!(p.a.hca.poll_timeout().is_some());
    let before = p.a.hca.stats();
    assert_eq!(before.sent_pkts, 1);
    let qpn = p.a.qpn;
    p.a.hca.destroy_qp(qpn).unwrap();
    assert_eq!(p.a.hca.stats(), before);
    assert_eq!(p.a.hca.poll_timeout(), None);
}

/// The HCA's next deadline is always a live one (the timer index's lazy deletion): an ACK that
/// moves a QP's ACK timeout later (progress with more outstanding, §3.7) shows the new
/// deadline, not the dead entry before it, and the ACK that cancels it leaves none.
#[test]
fn next_deadline_follows_the_ack_timeout_as_it_moves_and_ends() {
    let mut p = Pair::new();
    let va = p.b.va(0);
    let rkey = p.b.mr.rkey;
    let sge = [p.a.at(0, 8)];
    let write = |id| {
        SendWr::new(
            id,
            SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            },
            &sge,
        )
        .with_flags(SendFlags::SIGNALED)
    };
    let t = ack_timeout(p.opts.timeout);
    // Both WRITEs held on the wire: the first arms the timeout at `t`, the second leaves it.
    p.set_filter(|_| Action::Hold);
    p.post_a(&[write(1)]);
    assert_eq!(p.transmit(), 1);
    assert_eq!(p.a.hca.poll_timeout(), Some(at(t)));
    let later = Duration::from_micros(3);
    p.now = at(later);
    p.post_a(&[write(2)]);
    assert_eq!(p.transmit(), 1);
    assert_eq!(p.a.hca.poll_timeout(), Some(at(t)));
    // The first one delivered and acknowledged at `later`: the timeout restarts from there.
    p.clear_filter();
    p.release_one(0);
    assert!(p.flush());
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
    assert_eq!(p.a.hca.poll_timeout(), Some(at(later + t)));
    // The second one acknowledged: no deadline is left.
    p.release_held(false);
    assert!(p.flush());
    assert_eq!(statuses(&p.a.send_wcs()), [(2, WcStatus::Success)]);
    assert_eq!(p.a.hca.poll_timeout(), None);
}

/// A receive completion that overruns the responder's CQ: `CQ_ERR` for the CQ, and the
/// responder's QP enters ERR (rc-transport.md §4.3 class G, rxe's RESPST_ERR_CQ_OVERFLOW), so
/// its peer sees silence and ends in RETRY_EXC_ERR instead of believing a lost receive worked.
#[test]
fn recv_cq_overrun_moves_responder_qp_to_err() {
    let mut p = Pair::with(Opts {
        recv_cq_depth: 1,
        retry_cnt: 1,
        ..Opts::default()
    });
    for id in 0..3 {
        let r = p.b.at(id * 64, 64);
        p.b.post_recv(10 + id, &[r]);
    }
    let s = p.a.at(0, 8);
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[s]),
        SendWr::new(2, SendOp::Send, &[s]),
        SendWr::new(3, SendOp::Send, &[s]),
    ]);
    assert!(p.run_until_idle());
    let events = p.b.events();
    assert!(
        events
            .iter()
            .any(|e| e.kind == AsyncEventKind::CqErr && e.element == EventElement::Cq(p.b.rcq.0)),
        "CQ_ERR for the overrun CQ: {events:?}"
    );
    assert_eq!(p.b.state(), QpState::Err, "the responder QP is in ERR");
    // The one completion that fit is intact.
    assert_eq!(
        brief(&p.b.recv_wcs()),
        [(10, WcStatus::Success, WcOpcode::Recv, 8)]
    );
    // The requester: the first SEND was ACKed before the overrun; the rest end in
    // RETRY_EXC_ERR against the silent peer, then flush.
    let a = statuses(&p.a.send_wcs());
    assert_eq!(a.first(), Some(&(1, WcStatus::Success)), "{a:?}");
    assert!(
        a.iter().any(|(_, s)| *s == WcStatus::RetryExcErr),
        "requester sees the error: {a:?}"
    );
    assert_eq!(p.a.state(), QpState::Err);
}

/// §1.8 addendum: a foreign sender (Linux rxe) puts a numbered IPv4 identification under its
/// ICRC, which a UDP receiver cannot see. By default such a packet fails the check; with
/// `foreign_ipv4_ident` the identification is solved for, the packet is delivered and counted
/// in `icrc_ident_solved`, and a corrupted packet is still dropped.
#[test]
fn foreign_ipv4_ident_is_solved_only_when_configured() {
    for foreign in [false, true] {
        let mut p = Pair::with(Opts {
            foreign_ident: foreign,
            ..Opts::default()
        });
        let seal = |p: &Pair, psn: u32, payload: &[u8], ident: u16| {
            let mut pkt = p.craft(
                Dir::AtoB,
                &PacketRepr::new(bth(SendOnly, p.b.qpn, psn, true), payload),
            );
            let mut ip = ip_ctx(pkt.src, pkt.dst);
            if let IpAddrs::V4 { ident: id, .. } = &mut ip.addrs {
                *id = ident;
            }
            emu_proto::wire::fill_icrc(&ip, &mut pkt.bytes).unwrap();
            pkt
        };
        for (k, r) in [(1u64, 0u64), (2, 64), (3, 128)] {
            let sge = p.b.at(r, 64);
            p.b.post_recv(k, &[sge]);
        }
        // Sealed as rxe would: the ICRC over identification 0x4936.
        let pkt = seal(&p, P, &[1, 2, 3, 4, 5], 0x4936);
        p.inject_pkt(&pkt);
        let s = p.b.hca.stats();
        let wcs = p.b.recv_wcs();
        if foreign {
            assert_eq!((s.icrc_errors, s.icrc_ident_solved), (0, 1));
            assert_eq!(wcs.len(), 1);
            assert_eq!((wcs[0].status, wcs[0].byte_len), (WcStatus::Success, 5));
        } else {
            assert_eq!((s.icrc_errors, s.icrc_ident_solved), (1, 0));
            assert!(wcs.is_empty());
        }
        // A corrupted foreign packet is dropped either way.
        let psn = if foreign { P + 1 } else { P };
        let mut bad = seal(&p, psn, &[6, 7, 8, 9], 0x0102);
        let at = bad.bytes.len() - 6;
        bad.bytes[at] ^= 0x10;
        p.inject_pkt(&bad);
        let s2 = p.b.hca.stats();
        assert_eq!(s2.icrc_errors, s.icrc_errors + 1, "foreign {foreign}");
        assert_eq!(s2.icrc_ident_solved, s.icrc_ident_solved);
        // A packet with identification 0 verifies directly and is not counted as solved.
        let good = seal(&p, psn, &[6], 0);
        p.inject_pkt(&good);
        assert_eq!(p.b.hca.stats().icrc_ident_solved, s.icrc_ident_solved);
        assert_eq!(p.b.recv_wcs().len(), 1);
    }
}

/// §2.8 / rxe `check_psn`: an error NAK for a PSN *after* a READ whose responses were lost says
/// nothing about the READ itself: the requester retries the READ instead of failing it with the
/// NAK's status. Here the responder entered ERR with that NAK (class C, an R_Key violation), so
/// the retried READ meets silence and ends in RETRY_EXC_ERR, the WRITE is flushed — what rxe
/// reports; failing the READ with REM_ACCESS_ERR would blame the wrong WR.
#[test]
fn error_nak_past_a_read_with_lost_responses_retries_the_read() {
    let mut p = Pair::with(Opts {
        retry_cnt: 1,
        ..Opts::default()
    });
    let remote = pattern(100, 9);
    p.b.write(&p.b.mr, 0, &remote);
    let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
    // The only READ response is lost.
    p.set_filter(move |pkt| {
        if pkt.dir == Dir::BtoA && pkt.repr().bth.opcode == RdmaReadResponseOnly {
            Action::Drop
        } else {
            Action::Deliver
        }
    });
    let dst = p.a.at(0, 100);
    let src = p.a.at(1000, 8);
    p.post_a(&[
        SendWr::new(
            1,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[dst],
        ),
        // A WRITE to an rkey that does not exist: NAK 0x62 for PSN P + 1.
        SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: va,
                rkey: rkey ^ 0xFF,
            },
            &[src],
        ),
    ]);
    assert!(p.run_until_idle());
    let back = p.seen(Dir::BtoA);
    assert!(
        back.iter().any(
            |s| s.psn == P + 1 && s.syndrome == Some(Syndrome::Nak(NakCode::RemoteAccessError))
        ),
        "{back:?}"
    );
    let reads = p
        .seen(Dir::AtoB)
        .iter()
        .filter(|s| s.op == RdmaReadRequest)
        .count();
    assert!(
        reads >= 2,
        "the READ was retried after the NAK ({reads} sent)"
    );
    assert_eq!(
        statuses(&p.a.send_wcs()),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.a.state(), QpState::Err);
}

// ---- schedules found by the model checker (emu-model, issue 21) --------------------------

/// Found by emu-model (configuration `rnr`, before its fairness rule allowed for it): the
/// SEND meets an empty receive queue (RNR NAK); the WRITE_WITH_IMM behind it draws a PSN
/// sequence NAK that overtakes the RNR NAK and restarts the SEND at once, which draws a second
/// RNR NAK; the network duplicates the first. Three RNR NAKs for one PSN reach a, and each is
/// charged against `rnr_retry` (2), as rxe's completer charges every RNR NAK: the SEND fails
/// with RNR_RETRY_EXC_ERR although b posted its receives before any RNR wait ended. Pins that
/// rxe-compatible accounting, and that `Pair::replay` follows the model packet for packet.
#[test]
fn model_rnr_every_rnr_nak_costs_a_retry_even_stale_or_duplicated() {
    let mut p = Pair::with(Opts {
        rnr_retry: 2,
        ..Opts::default()
    });
    let mr = p.a.mr;
    p.a.write(&mr, 0x0, &pattern(16, 1));
    p.a.write(&mr, 0x40, &pattern(16, 2));
    let sge = [p.a.at(0x0, 16)];
    p.post_a(&[SendWr::new(0, SendOp::Send, &sge)]);
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: p.b.va(0x60),
        rkey: p.b.mr.rkey,
        imm: 0xc0de0001,
    };
    let sge = [p.a.at(0x40, 16)];
    p.post_a(&[SendWr::new(1, op, &sge)]);
    p.set_filter(|_| Action::Hold);
    p.transmit();
    p.replay(&[
        Step::Deliver(0), // SEND → RNR NAK
        Step::Deliver(0), // WRITE_WITH_IMM → PSN sequence NAK
        Step::Deliver(1), // the NAK overtakes the RNR NAK: a restarts at the SEND
        Step::Deliver(1), // SEND again → second RNR NAK
        Step::Duplicate(0),
        Step::PostRecv(Side::B, 1000, 0x20, 16),
        Step::PostRecv(Side::B, 1001, 0x60, 16),
        Step::Deliver(0), // RNR NAK 1: rnr_retry 2 → 1
        Step::Deliver(0), // the restarted WRITE_WITH_IMM: out of sequence, NAKed again
        Step::Deliver(0), // RNR NAK 1 again: 1 → 0
        Step::Deliver(0), // RNR NAK 2: exhausted
    ]);
    let seen = p.seen(Dir::BtoA);
    let rnr_naks = seen.iter().filter(|s| s.is_rnr()).count();
    assert_eq!(rnr_naks, 2, "two RNR NAKs sent (and one duplicated)");
    // The restarted WRITE_WITH_IMM, out of sequence again, draws a second sequence NAK
    // (the responder repeats its NAK when the requester went back: DIVERGENCES.md #19); it is
    // still in flight when the SEND fails, and changes nothing.
    let seq_naks = seen.iter().filter(|s| s.is_nak()).count();
    assert_eq!(
        seq_naks, 2,
        "a sequence NAK, and its repeat for the resent request"
    );
    assert_eq!(
        statuses(&p.a.send_wcs()),
        vec![(0, WcStatus::RnrRetryExcErr), (1, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.a.state(), QpState::Err);
    assert_eq!(p.held(), 1, "only the repeated sequence NAK is left");
}

// ---- the responder's rules, one at a time ------------------------------------------------

/// A pair whose b QP receives through an SRQ (8 WQEs deep): b gets a new QP on a new SRQ, and
/// a's QP is reconnected to it.
fn srq_pair() -> (Pair, emu_proto::SrqId) {
    let mut p = Pair::new();
    let attr = verbs_api::SrqAttr {
        max_wr: 8,
        max_sge: 2,
        srq_limit: 0,
    };
    let srq = p.b.hca.create_srq(p.b.pd, &attr).unwrap();
    let init = verbs_api::QpInitAttr::rc(p.opts.cap);
    let (pd, scq, rcq) = (p.b.pd, p.b.scq, p.b.rcq);
    p.b.qpn = p.b.hca.create_qp(pd, scq, rcq, Some(srq), &init).unwrap();
    let (a_qpn, b_qpn) = (p.a.qpn, p.b.qpn);
    common::connect_qp(&mut p.b, common::A_IP, a_qpn, &p.opts, Side::B);
    common::connect_qp(&mut p.a, common::B_IP, b_qpn, &p.opts, Side::A);
    (p, srq)
}

/// `ibv_modify_srq(3)` / IBTA o11-5.2.x: an armed SRQ limit raises SRQ_LIMIT_REACHED once, when
/// a receive taken from the SRQ leaves fewer WQEs than the limit, and disarms it.
#[test]
fn srq_limit_event_fires_once_when_the_srq_falls_below_the_limit() {
    let (mut p, srq) = srq_pair();
    for id in 1..=4 {
        let sge = [p.b.at(id * 64, 64)];
        p.b.hca
            .post_srq_recv(srq, &[verbs_api::RecvWr::new(id, &sge)])
            .unwrap();
    }
    p.b.hca.arm_srq_limit(srq, 2).unwrap();
    let s = p.a.at(0, 8);
    let mut fired = Vec::new();
    for id in 1..=4 {
        p.post_a(&[SendWr::new(id, SendOp::Send, &[s])]);
        assert!(p.run_until_idle());
        let left = 4 - id;
        let kinds: Vec<_> = p.b.events().iter().map(|e| (e.kind, e.element)).collect();
        if !kinds.is_empty() {
            fired.push((left, kinds));
        }
    }
    assert_eq!(
        fired,
        [(
            1,
            vec![(AsyncEventKind::SrqLimitReached, EventElement::Srq(srq.0))]
        )],
        "(WQEs left, events) after each SEND"
    );
    assert_eq!(p.b.hca.query_srq(srq).unwrap().srq_limit, 0, "disarmed");
    let rwc = p.b.recv_wcs();
    assert_eq!(
        statuses(&rwc),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success)
        ]
    );
}

/// §1.3 check_resource through an SRQ: a WRITE_WITH_IMM needs a WQE of the SRQ; with none
/// posted it draws an RNR NAK, and once one is posted the retry completes it.
#[test]
fn write_with_imm_takes_its_receive_wqe_from_the_srq() {
    let (mut p, srq) = srq_pair();
    let data = pattern(100, 9);
    p.a.write(&p.a.mr, 0, &data);
    let s = p.a.at(0, 100);
    let (va, rkey) = (p.b.va(2000), p.b.mr.rkey);
    p.post_a(&[SendWr::new(
        1,
        SendOp::RdmaWriteWithImm {
            remote_addr: va,
            rkey,
            imm: 0x0102_0304,
        },
        &[s],
    )]);
    assert!(p.flush());
    let back = p.seen(Dir::BtoA);
    assert_eq!(back.len(), 1);
    assert!(back[0].is_rnr(), "{back:?}");
    p.b.hca
        .post_srq_recv(srq, &[verbs_api::RecvWr::new(5, &[])])
        .unwrap();
    assert!(p.run_until_idle());
    let rwc = p.b.recv_wcs();
    assert_eq!(
        brief(&rwc),
        [(5, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 100)]
    );
    assert_eq!(rwc[0].imm_data, 0x0102_0304);
    assert_eq!(p.b.read(&p.b.mr, 2000, 100), data);
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
}

/// A receive completion (IBTA 11.4.2.1) names the WQE, the receiving QP and the sending QP,
/// and carries the immediate data and WITH_IMM exactly when the message had one.
#[test]
fn receive_completions_name_both_qps_and_carry_immediate_data() {
    let mut p = Pair::new();
    for id in 1..=3 {
        let r = p.b.at(id * 256, 256);
        p.b.post_recv(id, &[r]);
    }
    let s = p.a.at(0, 16);
    let (va, rkey) = (p.b.va(4096), p.b.mr.rkey);
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[s]),
        SendWr::new(2, SendOp::SendWithImm { imm: 0x1234_5678 }, &[s]),
        SendWr::new(
            3,
            SendOp::RdmaWriteWithImm {
                remote_addr: va,
                rkey,
                imm: 0x9abc_def0,
            },
            &[s],
        ),
    ]);
    assert!(p.run_until_idle());
    let (a_qpn, b_qpn) = (p.a.qpn, p.b.qpn);
    let got: Vec<_> = p
        .b
        .recv_wcs()
        .iter()
        .map(|w| {
            (
                w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data, w.wc_flags, w.qp_num, w.src_qp,
            )
        })
        .collect();
    use WcStatus::Success;
    assert_eq!(
        got,
        [
            (
                1,
                Success,
                WcOpcode::Recv,
                16,
                0,
                WcFlags::empty(),
                b_qpn,
                a_qpn
            ),
            (
                2,
                Success,
                WcOpcode::Recv,
                16,
                0x1234_5678,
                WcFlags::WITH_IMM,
                b_qpn,
                a_qpn
            ),
            (
                3,
                Success,
                WcOpcode::RecvRdmaWithImm,
                16,
                0x9abc_def0,
                WcFlags::WITH_IMM,
                b_qpn,
                a_qpn
            ),
        ]
    );
}

/// A receive WQE that fails at the responder completes with its own `wr_id`, status, the
/// receive opcode and the receiving QP (§4.3), before the rest of the queue is flushed.
#[test]
fn failed_receive_completion_names_its_wqe_and_qp() {
    let mut p = Pair::new();
    let r = p.b.at(0, 10);
    p.b.post_recv(5, &[r]);
    let s = p.a.at(0, 100);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_until_idle());
    let rwc = p.b.recv_wcs();
    assert_eq!(
        brief(&rwc),
        [(5, WcStatus::LocLenErr, WcOpcode::Recv, 0)],
        "{rwc:?}"
    );
    assert_eq!(rwc[0].qp_num, p.b.qpn);
}

/// §1.5: the AETH's MSN counts the messages the responder completed — a SEND, an RDMA WRITE,
/// an RDMA READ and an atomic each count one.
#[test]
fn aeth_msn_counts_each_completed_message() {
    let mut p = Pair::new();
    let r = p.b.at(0, 64);
    p.b.post_recv(1, &[r]);
    let (va, rkey) = (p.b.va(1024), p.b.mr.rkey);
    let s = p.a.at(0, 8);
    let ops = [
        SendOp::Send,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        SendOp::RdmaRead {
            remote_addr: va,
            rkey,
        },
        SendOp::AtomicFetchAndAdd {
            remote_addr: va,
            rkey,
            add: 1,
        },
    ];
    let mut msns = Vec::new();
    for (id, op) in ops.into_iter().enumerate() {
        let from = p.trace.len();
        p.post_a(&[SendWr::new(id as u64, op, &[s])]);
        assert!(p.run_until_idle());
        let back = p.seen_since(from, Dir::BtoA);
        msns.push(back.iter().map(|s| (s.op, s.msn)).collect::<Vec<_>>());
    }
    assert_eq!(
        msns,
        [
            vec![(Acknowledge, Some(1))],
            vec![(Acknowledge, Some(2))],
            vec![(RdmaReadResponseOnly, Some(3))],
            vec![(AtomicAcknowledge, Some(4))],
        ]
    );
}

/// C9-94: an RDMA message is at most 2^31 bytes. A RETH length of exactly 2^31 is a legal
/// length (here beyond the MR: NAK remote access), one more is an invalid request.
#[test]
fn reth_length_above_two_gib_is_an_invalid_request() {
    for op in [RdmaWriteOnly, RdmaReadRequest] {
        for (dma_len, want) in [
            (0x8000_0000u32, NakCode::RemoteAccessError),
            (0x8000_0001, NakCode::InvalidRequest),
        ] {
            let mut p = Pair::new();
            let payload = [5u8; 8];
            let body: &[u8] = if op == RdmaWriteOnly { &payload } else { &[] };
            let repr = PacketRepr {
                reth: Some(RethRepr {
                    va: p.b.va(0),
                    rkey: p.b.mr.rkey,
                    dma_len,
                }),
                ..PacketRepr::new(bth(op, p.b.qpn, P, true), body)
            };
            let pkt = p.craft(Dir::AtoB, &repr);
            p.inject_pkt(&pkt);
            assert!(p.flush());
            let nak = only_nak(&p);
            assert_eq!(
                (nak_of(&nak), nak.psn),
                (Some(want), P),
                "{op:?} of {dma_len:#x}"
            );
            assert_eq!(
                p.b.read(&p.b.mr, 0, 8),
                vec![0; 8],
                "{op:?} of {dma_len:#x}"
            );
        }
    }
}

/// §4.5: a duplicate READ request is executed again if it asks for the original request or a
/// part of it (same R_Key, range inside the original's), its responses starting at its own
/// PSN; any other duplicate READ (another key, a range reaching outside, a PSN no READ used) is
/// dropped unanswered.
#[test]
fn duplicate_read_is_answered_only_within_the_original_request() {
    let mut p = Pair::new();
    let remote = pattern(600, 4);
    p.b.write(&p.b.mr, 16, &remote);
    let (va, rkey) = (p.b.va(16), p.b.mr.rkey);
    // A SEND at P first, then the READ at P+1..=P+3.
    let r = p.b.at(4096, 64);
    p.b.post_recv(1, &[r]);
    let s = p.a.at(0, 8);
    let d = p.a.at(1000, 600);
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[s]),
        SendWr::new(
            2,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[d],
        ),
    ]);
    assert!(p.run_until_idle());
    assert_eq!(
        statuses(&p.a.send_wcs()),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let q = P + 1;
    /// (case, PSN, VA, length, R_Key, the responses b sends).
    type Case = (&'static str, u32, u64, u32, u32, Vec<(Opcode, u32, usize)>);
    let cases: [Case; 8] = [
        (
            "the same READ",
            q,
            va,
            600,
            rkey,
            vec![
                (RdmaReadResponseFirst, q, 256),
                (RdmaReadResponseMiddle, q + 1, 256),
                (RdmaReadResponseLast, q + 2, 88),
            ],
        ),
        (
            "its first packet's bytes",
            q,
            va,
            256,
            rkey,
            vec![(RdmaReadResponseOnly, q, 256)],
        ),
        (
            "its tail, from its second PSN",
            q + 1,
            va + 256,
            344,
            rkey,
            vec![
                (RdmaReadResponseFirst, q + 1, 256),
                (RdmaReadResponseLast, q + 2, 88),
            ],
        ),
        ("one byte past its end", q, va, 601, rkey, vec![]),
        ("starting before it", q, va - 8, 16, rkey, vec![]),
        ("another R_Key", q, va, 600, rkey ^ 0x100, vec![]),
        ("the SEND's PSN", P, va, 600, rkey, vec![]),
        ("a PSN before the connection", P - 1, va, 600, rkey, vec![]),
    ];
    for (name, psn, at, len, key, want) in cases {
        let from = p.trace.len();
        let repr = PacketRepr {
            reth: Some(RethRepr {
                va: at,
                rkey: key,
                dma_len: len,
            }),
            ..PacketRepr::new(bth(RdmaReadRequest, p.b.qpn, psn, false), &[])
        };
        let pkt = p.craft(Dir::AtoB, &repr);
        p.inject_pkt(&pkt);
        p.transmit();
        let back = p.seen_since(from, Dir::BtoA);
        assert_eq!(opls(&back), want, "{name}");
        if let Some(first) = p.raw[from..].iter().find(|k| k.dir == Dir::BtoA) {
            let off = (at - va) as usize;
            assert_eq!(
                first.repr().payload,
                &remote[off..off + 256.min(len as usize)],
                "{name}"
            );
        }
        p.clear_trace();
        assert!(p.flush());
    }
    assert_eq!(p.b.state(), QpState::Rts);
}

/// C9-105 / §4.5: a duplicate SEND that arrives while the ACK of the original is still queued
/// is answered by that same ACK — one ACK for both, not two.
#[test]
fn duplicate_send_before_the_ack_left_shares_the_queued_ack() {
    let mut p = Pair::new();
    let r = p.b.at(0, 64);
    p.b.post_recv(1, &[r]);
    p.set_filter(|pkt| {
        if pkt.dir == Dir::AtoB {
            Action::Duplicate
        } else {
            Action::Deliver
        }
    });
    let s = p.a.at(0, 8);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_until_idle());
    assert_eq!(opls(&p.seen(Dir::BtoA)), [ack(P)]);
    let st = p.b.stats();
    assert_eq!(st.duplicate_request, 1);
    assert_eq!(
        st.rx_drops.get(emu_proto::RxDropCause::DuplicateRequest),
        0,
        "a re-ACKed duplicate is answered, not dropped"
    );
    assert_eq!(statuses(&p.b.recv_wcs()), [(1, WcStatus::Success)]);
}

/// §2.7 / issue 19: one ACK answers AckReq requests spanning at most 32 PSNs
/// (`MAX_ACK_COALESCE`); the next request after that gets an ACK of its own.
#[test]
fn one_ack_answers_at_most_32_psns() {
    let mut p = Pair::new();
    for id in 0..34 {
        let r = p.b.at(id * 8, 8);
        p.b.post_recv(id, &[r]);
    }
    let payload = [1u8; 8];
    for i in 0..34 {
        let repr = PacketRepr::new(bth(SendOnly, p.b.qpn, P + i, true), &payload);
        let pkt = p.craft(Dir::AtoB, &repr);
        p.inject_pkt(&pkt);
    }
    p.transmit();
    assert_eq!(opls(&p.seen(Dir::BtoA)), [ack(P + 31), ack(P + 33)]);
    assert_eq!(p.b.recv_wcs().len(), 34);
}

/// The responder's counters (stats.rs): requests accepted and their payload bytes, responses
/// sent, ACKs among them, and the READ payload bytes sent.
#[test]
fn responder_counts_requests_and_responses() {
    let mut p = Pair::new();
    let r = p.b.at(0, 128);
    p.b.post_recv(1, &[r]);
    let (va, rkey) = (p.b.va(1024), p.b.mr.rkey);
    let s = p.a.at(0, 100);
    let d = p.a.at(1000, 600);
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[s]),
        SendWr::new(
            2,
            SendOp::RdmaRead {
                remote_addr: va,
                rkey,
            },
            &[d],
        ),
    ]);
    assert!(p.run_until_idle());
    let st = p.b.stats();
    assert_eq!(
        (
            st.rcvd_pkts,
            st.rcvd_bytes,
            st.sent_pkts,
            st.sent_bytes,
            st.acks_sent
        ),
        (2, 100, 4, 600, 1),
        "(rcvd_pkts, rcvd_bytes, sent_pkts, sent_bytes, acks_sent)"
    );
}

/// §4.3: a receive WQE with an SGE whose L_Key is bad is malformed (class A) even where the
/// message would fit in its good SGEs: NAK 0x63 (remote operational error), the receive
/// completes with LOC_PROT_ERR (DIVERGENCES.md #4), the requester's WR with REM_OP_ERR.
#[test]
fn receive_wqe_with_a_bad_sge_fails_with_remote_operational_error() {
    let mut p = Pair::new();
    let good = p.b.at(0, 64);
    let bad = verbs_api::Sge {
        lkey: p.b.mr.lkey ^ 0x100,
        ..p.b.at(64, 64)
    };
    p.b.post_recv(1, &[good, bad]);
    let s = p.a.at(0, 8);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_until_idle());
    let nak = only_nak(&p);
    assert_eq!(
        (nak_of(&nak), nak.psn),
        (Some(NakCode::RemoteOperationalError), P)
    );
    assert_eq!(statuses(&p.b.recv_wcs()), [(1, WcStatus::LocProtErr)]);
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::RemOpErr)]);
    assert_eq!((p.a.state(), p.b.state()), (QpState::Err, QpState::Err));
    assert_eq!(p.b.read(&p.b.mr, 0, 8), vec![0; 8], "nothing placed");
}

/// A zero-length SGE of a receive WQE takes no bytes, so its L_Key is not checked; the
/// message lands in the other SGEs.
#[test]
fn zero_length_receive_sge_is_not_checked() {
    let mut p = Pair::new();
    let empty = verbs_api::Sge {
        addr: 0,
        length: 0,
        lkey: 0x0bad_0000,
    };
    let good = p.b.at(128, 64);
    p.b.post_recv(1, &[empty, good]);
    let data = pattern(8, 6);
    p.a.write(&p.a.mr, 0, &data);
    let s = p.a.at(0, 8);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_until_idle());
    assert_eq!(
        brief(&p.b.recv_wcs()),
        [(1, WcStatus::Success, WcOpcode::Recv, 8)]
    );
    assert_eq!(p.b.read(&p.b.mr, 128, 8), data);
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
}

/// §4.3: a SEND exactly as long as its receive WQE's SGEs together fits (one byte more is
/// LOC_LEN_ERR, `receive_buffer_too_small_loc_len_err`), scattered in SGE order.
#[test]
fn send_exactly_filling_the_receive_sges_succeeds() {
    let mut p = Pair::new();
    let (r1, r2) = (p.b.at(0, 200), p.b.at(1000, 100));
    p.b.post_recv(1, &[r1, r2]);
    let data = pattern(300, 7);
    p.a.write(&p.a.mr, 0, &data);
    let s = p.a.at(0, 300);
    p.post_a(&[SendWr::new(1, SendOp::Send, &[s])]);
    assert!(p.run_until_idle());
    assert_eq!(
        brief(&p.b.recv_wcs()),
        [(1, WcStatus::Success, WcOpcode::Recv, 300)]
    );
    assert_eq!(p.b.read(&p.b.mr, 0, 200), data[..200]);
    assert_eq!(p.b.read(&p.b.mr, 1000, 100), data[200..]);
    assert_eq!(statuses(&p.a.send_wcs()), [(1, WcStatus::Success)]);
}

/// stats.rs: a READ response the responder cannot build (its MR deregistered under it)
/// counts in `dropped`; the NAK sent instead counts as a packet sent.
#[test]
fn read_response_that_cannot_be_built_counts_as_dropped() {
    let mut p = Pair::new();
    let (va, rkey) = (p.b.va(0), p.b.mr.rkey);
    let d = p.a.at(0, 512);
    p.post_a(&[SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: va,
            rkey,
        },
        &[d],
    )]);
    p.transmit();
    p.deliver();
    let lkey = p.b.mr.lkey;
    p.b.hca.dereg_mr(lkey).unwrap();
    assert!(p.run_until_idle());
    let back = p.seen(Dir::BtoA);
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(nak_of(&back[0]), Some(NakCode::RemoteAccessError));
    let st = p.b.stats();
    assert_eq!((st.dropped, st.sent_pkts, st.sent_bytes), (1, 1, 0));
}

/// At the largest path MTU (4096) every packet still fits the transmit buffer
/// (`MAX_PACKET_LEN`): a full-MTU SEND, WRITE_WITH_IMM (BTH, RETH and ImmDt) and READ
/// response go out whole and complete.
#[test]
fn full_4096_byte_packets_fit_the_transmit_buffer() {
    let mut p = Pair::with(Opts {
        mtu: verbs_api::Mtu::Mtu4096,
        ..Opts::default()
    });
    let data = pattern(4096, 8);
    p.a.write(&p.a.mr, 0, &data);
    p.b.write(&p.b.mr, 8192, &data);
    for id in [1, 2] {
        p.b.post_recv(id, &[p.b.at(0, 4096)]);
    }
    let s = p.a.at(0, 4096);
    let d = p.a.at(16384, 4096);
    let rkey = p.b.mr.rkey;
    p.post_a(&[
        SendWr::new(1, SendOp::Send, &[s]),
        SendWr::new(
            2,
            SendOp::RdmaWriteWithImm {
                remote_addr: p.b.va(24576),
                rkey,
                imm: 1,
            },
            &[s],
        ),
        SendWr::new(
            3,
            SendOp::RdmaRead {
                remote_addr: p.b.va(8192),
                rkey,
            },
            &[d],
        ),
    ]);
    assert!(p.run_until_idle());
    assert_eq!(
        opls(&p.seen(Dir::AtoB)),
        [
            (SendOnly, P, 4096),
            (RdmaWriteOnlyWithImmediate, P + 1, 4096),
            (RdmaReadRequest, P + 2, 0)
        ]
    );
    assert_eq!(
        statuses(&p.a.send_wcs()),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(p.b.read(&p.b.mr, 0, 4096), data);
    assert_eq!(p.b.read(&p.b.mr, 24576, 4096), data);
    assert_eq!(p.a.read(&p.a.mr, 16384, 4096), data);
}
