//! The requester's loss-recovery choices, packet by packet (issue 17 item 2): which packets a
//! sends (opcode, PSN, count, time) after each kind of response the completer can get — a PSN
//! sequence NAK (first, repeated, an echo of an earlier round, one during an RNR wait or right
//! after a rewind), an RNR NAK, a late ACK after a rewind, the local ACK timeout at its exact
//! boundary — and what its completions carry.
//!
//! Unlike `rc_pair.rs`, b is silent here: the wire loses every datagram, and the test plays
//! the responder by handing a crafted ACKs and NAKs (`Pair::crafted_ack`) at chosen instants,
//! so every response and every instant is the test's choice. These tests pin the engine as it
//! behaves today (rc-transport.md §2.8–§2.10, §3.5–§3.9; `rc/completer.rs`); they are what
//! makes the mutants of those choices fail (`.cargo/mutants.toml`, README "Mutation testing").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{ALL_ACCESS, Action, Dir, Node, Opts, PORT, Pair, Pkt, ack_timeout, bth, ip_ctx};
use emu_proto::Instant;
use emu_proto::stats::RxDropCause;
use emu_proto::wire::{
    AethRepr, AtomicAckEthRepr, NakCode, Opcode, PacketRepr, RnrTimer, SACK_OPCODE,
    SACK_PACKET_LEN, SackBitmap, SackPacketRepr, SackRepr, Syndrome, fill_icrc,
};
use verbs_api::{
    AccessFlags, QpState, Recovery, SendFlags, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use Opcode::*;

/// a's first PSN with the default options.
const P: u32 = 0x100;
/// The path MTU of the default options.
const MTU: u32 = 256;

fn at(t: Duration) -> Instant {
    Instant::ZERO + t
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

fn seq_nak() -> Syndrome {
    Syndrome::Nak(NakCode::PsnSequenceError)
}

fn rnr_nak(code: u8) -> Syndrome {
    Syndrome::RnrNak {
        timer: RnrTimer::from_code(code),
    }
}

/// A pair whose wire loses every datagram: a's packets are traced, b never hears them.
fn silent(opts: Opts) -> Pair {
    let mut p = Pair::with(opts);
    p.set_filter(|_| Action::Drop);
    p
}

/// As [`silent`] with the default options but `retry_cnt`.
fn silent_with_retry_cnt(retry_cnt: u8) -> Pair {
    silent(Opts {
        retry_cnt,
        ..Opts::default()
    })
}

/// a posts a signaled SEND of `pkts` full MTUs as `wr_id` and sends what it may; returns the
/// (opcode, PSN) of the packets it sent.
fn send(p: &mut Pair, wr_id: u64, pkts: u32) -> Vec<(Opcode, u32)> {
    let mark = p.trace.len();
    let s = p.a.at(0, pkts * MTU);
    p.post_a(&[SendWr::new(wr_id, SendOp::Send, &[s])]);
    assert!(p.flush());
    sent_since(p, mark)
}

/// (opcode, PSN) of what a sent from trace index `mark` on.
fn sent_since(p: &Pair, mark: usize) -> Vec<(Opcode, u32)> {
    p.seen_since(mark, Dir::AtoB)
        .iter()
        .map(|s| (s.op, s.psn))
        .collect()
}

/// b's response `syndrome` for `psn` reaches a now; returns what a sends at once.
fn answer(p: &mut Pair, psn: u32, syndrome: Syndrome) -> Vec<(Opcode, u32)> {
    let mark = p.trace.len();
    let pkt = p.crafted_ack(psn, syndrome);
    p.inject_pkt(&pkt);
    assert!(p.flush());
    sent_since(p, mark)
}

/// Lets time run to `t`, firing what falls due; returns what a sent meanwhile.
fn until(p: &mut Pair, t: Instant) -> Vec<(Opcode, u32)> {
    let mark = p.trace.len();
    assert!(p.run_until(t));
    sent_since(p, mark)
}

/// The SEND packets of PSNs `from..=to` of a message whose packets are `first..=last`.
fn sends(first: u32, last: u32, from: u32, to: u32) -> Vec<(Opcode, u32)> {
    (from..=to)
        .map(|psn| {
            let op = match (psn == first, psn == last) {
                (true, true) => SendOnly,
                (true, false) => SendFirst,
                (false, true) => SendLast,
                (false, false) => SendMiddle,
            };
            (op, psn)
        })
        .collect()
}

/// a's send completions as (wr_id, status, opcode, byte_len), each checked to name a's QP.
fn completions(p: &mut Pair) -> Vec<(u64, WcStatus, WcOpcode, u32)> {
    let qpn = p.a.qpn;
    let wcs: Vec<WorkCompletion> = p.a.send_wcs();
    assert!(wcs.iter().all(|w| w.qp_num == qpn), "qp_num: {wcs:?}");
    wcs.iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect()
}

// ---- sequence NAKs -----------------------------------------------------------------------

/// A sequence NAK for a PSN inside the first of two SENDs: a goes back to exactly that PSN,
/// resuming the first SEND at its packet (a MIDDLE, not a FIRST) and the second from its FIRST,
/// at once and once. The NAK's implied ACK completes nothing (the SEND's last PSN is later);
/// the final ACK completes both, with their lengths and a's QP number.
#[test]
fn sequence_nak_resends_from_the_naked_psn_with_the_original_opcodes() {
    let mut p = silent(Opts::default());
    assert_eq!(send(&mut p, 1, 4), sends(P, P + 3, P, P + 3));
    assert_eq!(send(&mut p, 2, 2), sends(P + 4, P + 5, P + 4, P + 5));
    let resent = answer(&mut p, P + 2, seq_nak());
    let mut want = sends(P, P + 3, P + 2, P + 3);
    want.extend(sends(P + 4, P + 5, P + 4, P + 5));
    assert_eq!(resent, want);
    assert!(completions(&mut p).is_empty());
    let a = p.a.stats();
    assert_eq!(
        (a.rcvd_seq_err, a.retransmits_nak, a.timeout_retries),
        (1, 4, 0)
    );
    assert_eq!(p.next_deadline(), Some(at(ack_timeout(p.opts.timeout))));
    assert_eq!(answer(&mut p, P + 5, Syndrome::ACK_UNLIMITED), []);
    assert_eq!(
        completions(&mut p),
        [
            (1, WcStatus::Success, WcOpcode::Send, 4 * MTU),
            (2, WcStatus::Success, WcOpcode::Send, 2 * MTU),
        ]
    );
    assert_eq!(p.next_deadline(), None, "nothing left to time");
    assert_eq!(p.a.events(), [], "SQ_DRAINED only in SQD");
}

/// A sequence NAK for the oldest PSN with `retry_cnt` 0: the retry it asks for is not there,
/// the SEND fails with RETRY_EXC_ERR (length 0, a's QP number) and the QP enters ERR.
#[test]
fn sequence_nak_with_retry_cnt_0_fails_the_head() {
    let mut p = silent_with_retry_cnt(0);
    send(&mut p, 1, 2);
    assert_eq!(answer(&mut p, P, seq_nak()), []);
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::RetryExcErr, WcOpcode::Send, 0)]
    );
    assert_eq!(p.a.state(), QpState::Err);
    assert_eq!(p.a.stats().retry_exceeded_err, 1);
}

/// A repeat of the NAK the current round went back to: inside the echo guard (1 µs without an
/// RTT estimate) it is deferred to the guard's end, then acted on; after the guard it is acted
/// on at once. Either way the same round starts again without spending `retry_cnt` (1 here),
/// and the ACK timer keeps running from the first transmission. Progress reloads the budget;
/// the next NAK (after the guard) spends it and restarts the timer, whose expiry then finds
/// the budget used up: RETRY_EXC_ERR, at exactly that NAK + timeout.
#[test]
fn repeated_sequence_nak_goes_back_again_without_spending_retry_cnt() {
    let mut p = silent_with_retry_cnt(1);
    let t = ack_timeout(p.opts.timeout);
    send(&mut p, 1, 4);
    let round = sends(P, P + 3, P + 1, P + 3);
    assert_eq!(answer(&mut p, P + 1, seq_nak()), round, "retry_cnt 1 → 0");
    p.now = at(Duration::from_nanos(500));
    assert_eq!(answer(&mut p, P + 1, seq_nak()), [], "an echo: deferred");
    assert_eq!(p.next_deadline(), Some(at(us(1))));
    assert_eq!(
        until(&mut p, at(us(1))),
        round,
        "acted on at the guard's end"
    );
    p.now = at(us(5));
    assert_eq!(answer(&mut p, P + 1, seq_nak()), round, "no echo: at once");
    assert_eq!(p.a.state(), QpState::Rts);
    assert_eq!(p.next_deadline(), Some(at(t)), "the ACK timer still runs");
    let a = p.a.stats();
    assert_eq!((a.rcvd_seq_err, a.retransmits_nak), (3, 9));

    assert_eq!(answer(&mut p, P + 1, Syndrome::ACK_UNLIMITED), []);
    assert_eq!(
        p.next_deadline(),
        Some(at(us(5) + t)),
        "progress restarts it"
    );
    p.now = at(us(7));
    let round2 = sends(P, P + 3, P + 2, P + 3);
    assert_eq!(answer(&mut p, P + 2, seq_nak()), round2, "retry_cnt 1 → 0");
    assert_eq!(
        p.next_deadline(),
        Some(at(us(7) + t)),
        "the retry restarts it"
    );
    assert_eq!(until(&mut p, at(us(7) + t - Duration::from_nanos(1))), []);
    assert!(completions(&mut p).is_empty());
    assert_eq!(until(&mut p, at(us(7) + t)), []);
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::RetryExcErr, WcOpcode::Send, 0)]
    );
    assert_eq!(p.a.state(), QpState::Err);
    let a = p.a.stats();
    assert_eq!((a.retry_exceeded_err, a.timeout_retries), (1, 0));
}

/// A NAK for a later PSN than the round went back to (the responder got the resent packet,
/// then lost another) inside the echo guard replaces an echo deferred for the older PSN: when
/// it falls due, the new gap is resent; an older deferred NAK that progress answered is
/// dropped. Acting on it is a new retry (it spends `retry_cnt`).
#[test]
fn deferred_nak_follows_progress() {
    let mut p = silent(Opts::default());
    send(&mut p, 1, 4);
    assert_eq!(
        answer(&mut p, P + 1, seq_nak()),
        sends(P, P + 3, P + 1, P + 3)
    );
    p.now = at(Duration::from_nanos(200));
    assert_eq!(answer(&mut p, P + 1, seq_nak()), [], "deferred for P+1");
    p.now = at(Duration::from_nanos(400));
    assert_eq!(answer(&mut p, P + 2, seq_nak()), [], "deferred for P+2");
    assert_eq!(p.next_deadline(), Some(at(us(1))));
    assert_eq!(until(&mut p, at(us(1))), sends(P, P + 3, P + 2, P + 3));
    let a = p.a.stats();
    assert_eq!((a.rcvd_seq_err, a.retransmits_nak), (3, 5));

    // Deferred, then answered by an ACK before it falls due: nothing is resent.
    p.now = at(us(1) + Duration::from_nanos(100));
    assert_eq!(answer(&mut p, P + 2, seq_nak()), []);
    assert_eq!(answer(&mut p, P + 2, Syndrome::ACK_UNLIMITED), []);
    assert_eq!(until(&mut p, at(us(3))), []);
    assert_eq!(p.a.stats().retransmits_nak, 5);
    assert_eq!(answer(&mut p, P + 3, Syndrome::ACK_UNLIMITED), []);
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::Success, WcOpcode::Send, 4 * MTU)]
    );
}

/// With an RTT estimate, the echo guard is 5/4 of it for a NAK of the PSN the round went back
/// to, and half of it for a later PSN: a NAK inside is deferred to the guard's end, one at or
/// after it is acted on at once.
#[test]
fn echo_guard_scales_with_the_rtt_estimate() {
    let mut p = silent(Opts::default());
    // One sample of 80 µs: the ACK of the first SEND's last packet (its RTT probe).
    send(&mut p, 1, 1);
    p.now = at(us(80));
    assert_eq!(answer(&mut p, P, Syndrome::ACK_UNLIMITED), []);
    send(&mut p, 2, 4);
    let q = P + 1;
    // The round goes back to q at 80 µs: the guard for q ends at 180 µs.
    assert_eq!(answer(&mut p, q, seq_nak()), sends(q, q + 3, q, q + 3));
    p.now = at(us(179));
    assert_eq!(answer(&mut p, q, seq_nak()), []);
    assert_eq!(p.next_deadline(), Some(at(us(180))));
    assert_eq!(until(&mut p, at(us(180))), sends(q, q + 3, q, q + 3));
    // That round started at 180 µs; a NAK for q + 1 is an echo until 220 µs.
    p.now = at(us(219));
    assert_eq!(answer(&mut p, q + 1, seq_nak()), []);
    assert_eq!(p.next_deadline(), Some(at(us(220))));
    p.now = at(us(220) - Duration::from_nanos(1));
    assert_eq!(answer(&mut p, q + 2, seq_nak()), []);
    assert_eq!(p.next_deadline(), Some(at(us(220))));
    p.now = at(us(220));
    assert_eq!(
        answer(&mut p, q + 2, seq_nak()),
        sends(q, q + 3, q + 2, q + 3)
    );
    assert_eq!(p.a.state(), QpState::Rts);
}

/// A NAK for the PSN an ACK timeout has just gone back to, before the resend left: the
/// requester is about to send it anyway, so the NAK changes nothing (it neither spends
/// `retry_cnt`, 1 here, nor starts another round). Then a late ACK for a PSN sent before the
/// rewind moves the resend past what it covers.
#[test]
fn nak_right_after_a_timeout_rewind_and_a_late_ack() {
    let mut p = silent_with_retry_cnt(1);
    let t = ack_timeout(p.opts.timeout);
    send(&mut p, 1, 2);
    send(&mut p, 2, 2);
    p.now = at(t);
    p.fire_timers();
    assert_eq!(p.a.stats().timeout_retries, 1, "retry_cnt 1 → 0");
    // Before a transmits: the NAK for P and the ACK of the first SEND.
    let nak = p.crafted_ack(P, seq_nak());
    p.inject_pkt(&nak);
    let ack = p.crafted_ack(P + 1, Syndrome::ACK_UNLIMITED);
    p.inject_pkt(&ack);
    let mark = p.trace.len();
    assert!(p.flush());
    assert_eq!(sent_since(&p, mark), sends(P + 2, P + 3, P + 2, P + 3));
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::Success, WcOpcode::Send, 2 * MTU)]
    );
    assert_eq!(p.a.state(), QpState::Rts);
    let a = p.a.stats();
    assert_eq!((a.retransmits_timeout, a.retransmits_nak), (2, 0));
    assert_eq!(p.next_deadline(), Some(at(t + t)));
}

// ---- RNR NAKs ----------------------------------------------------------------------------

/// An RNR NAK for the oldest PSN: a sends nothing for exactly the RNR delay — not for a
/// sequence NAK that arrives meanwhile (which costs no retry with `retry_cnt` 0), nor for an
/// ACK timer that expires inside the wait — then resends from the oldest unacknowledged PSN,
/// once. An RNR NAK for a PSN already acknowledged is counted and changes nothing; progress
/// reloads `rnr_retry` (1 here), and two more RNR NAKs for one PSN exhaust it.
#[test]
fn rnr_nak_waits_exactly_its_delay_then_resends_once() {
    let mut p = silent(Opts {
        retry_cnt: 0,
        rnr_retry: 1,
        ..Opts::default()
    });
    let delay = RnrTimer::from_code(14).duration();
    let t = ack_timeout(p.opts.timeout);
    assert!(t < delay);
    send(&mut p, 1, 4);
    p.now = at(us(10));
    assert_eq!(answer(&mut p, P + 2, rnr_nak(14)), [], "implies ACK of P+1");
    assert_eq!(p.next_deadline(), Some(at(us(10) + delay)));
    p.now = at(us(20));
    assert_eq!(answer(&mut p, P + 2, seq_nak()), []);
    assert_eq!(answer(&mut p, P + 1, rnr_nak(14)), [], "stale");
    assert_eq!(p.next_deadline(), Some(at(us(10) + delay)));
    // An ACK of P+2 during the wait arms the ACK timer, which expires inside the wait.
    assert_eq!(answer(&mut p, P + 2, Syndrome::ACK_UNLIMITED), []);
    assert_eq!(p.next_deadline(), Some(at(us(20) + t)));
    let end = us(10) + delay;
    assert_eq!(until(&mut p, at(end - Duration::from_nanos(1))), []);
    assert_eq!(p.a.stats().timeout_retries, 0);
    assert_eq!(until(&mut p, at(end)), sends(P, P + 3, P + 3, P + 3));
    assert_eq!(p.a.state(), QpState::Rts);
    let a = p.a.stats();
    assert_eq!(
        (a.rcvd_rnr_err, a.rcvd_seq_err, a.retransmits_nak),
        (2, 1, 1)
    );

    assert_eq!(answer(&mut p, P + 3, rnr_nak(14)), []);
    assert!(completions(&mut p).is_empty(), "rnr_retry 1 → 0");
    assert_eq!(answer(&mut p, P + 3, rnr_nak(14)), []);
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::RnrRetryExcErr, WcOpcode::Send, 0)]
    );
    assert_eq!(p.a.stats().retry_rnr_exceeded_err, 1);
    assert_eq!(p.a.state(), QpState::Err);
}

/// A sequence NAK deferred as an echo falls due during an RNR wait: it starts nothing (and
/// spends no `retry_cnt`, 1 here: the ACK timeout after the RNR resend is still a retry).
#[test]
fn rnr_wait_cancels_a_deferred_nak() {
    let mut p = silent_with_retry_cnt(1);
    let t = ack_timeout(p.opts.timeout);
    send(&mut p, 1, 4);
    assert_eq!(
        answer(&mut p, P + 1, seq_nak()),
        sends(P, P + 3, P + 1, P + 3)
    );
    p.now = at(Duration::from_nanos(400));
    assert_eq!(answer(&mut p, P + 2, seq_nak()), [], "deferred to 1 µs");
    p.now = at(Duration::from_nanos(600));
    assert_eq!(answer(&mut p, P + 2, rnr_nak(1)), [], "RNR wait to 10.6 µs");
    let end = Duration::from_nanos(10_600);
    assert_eq!(until(&mut p, at(end - Duration::from_nanos(1))), []);
    assert_eq!(until(&mut p, at(end)), sends(P, P + 3, P + 2, P + 3));
    assert_eq!(until(&mut p, at(end + t)), sends(P, P + 3, P + 2, P + 3));
    assert_eq!(p.a.state(), QpState::Rts);
    assert_eq!(p.a.stats().timeout_retries, 1);
}

/// No packet goes during an RNR wait, not even the first packet of a WQE posted meanwhile
/// (§3.7 "RNR wait"): when the wait ends, the NAKed PSN is resent and the new SEND follows.
#[test]
fn rnr_wait_holds_back_a_wqe_posted_during_it() {
    let mut p = silent(Opts::default());
    let delay = RnrTimer::from_code(1).duration();
    send(&mut p, 1, 1);
    assert_eq!(answer(&mut p, P, rnr_nak(1)), []);
    assert_eq!(send(&mut p, 2, 2), [], "held back by the RNR wait");
    assert_eq!(until(&mut p, at(delay - Duration::from_nanos(1))), []);
    let mut want = sends(P, P, P, P);
    want.extend(sends(P + 1, P + 2, P + 1, P + 2));
    assert_eq!(until(&mut p, at(delay)), want);
}

// ---- the local ACK timeout ---------------------------------------------------------------

/// The local ACK timeout fires at exactly send + timeout, not a nanosecond before, and resends
/// everything unacknowledged from the oldest PSN; each later timeout is one timeout after the
/// previous resend.
#[test]
fn ack_timeout_fires_at_its_exact_boundary() {
    let mut p = silent(Opts::default());
    let t = ack_timeout(p.opts.timeout);
    send(&mut p, 1, 3);
    assert_eq!(until(&mut p, at(t - Duration::from_nanos(1))), []);
    assert_eq!(until(&mut p, at(t)), sends(P, P + 2, P, P + 2));
    assert_eq!(answer(&mut p, P, Syndrome::ACK_UNLIMITED), []);
    assert_eq!(p.next_deadline(), Some(at(t + t)), "progress restarts it");
    assert_eq!(until(&mut p, at(t + t - Duration::from_nanos(1))), []);
    assert_eq!(until(&mut p, at(t + t)), sends(P, P + 2, P + 1, P + 2));
    let a = p.a.stats();
    assert_eq!((a.timeout_retries, a.retransmits_timeout), (2, 5));
}

/// A sequence NAK for the PSN a timeout round went back to, inside the echo guard, is
/// deferred; when it falls due it is a new retry (the round was the timer's), and with
/// `retry_cnt` used up that fails the SEND and the QP at once.
#[test]
fn deferred_nak_after_a_timeout_round_is_a_retry() {
    let mut p = silent_with_retry_cnt(1);
    let t = ack_timeout(p.opts.timeout);
    send(&mut p, 1, 2);
    assert_eq!(
        until(&mut p, at(t)),
        sends(P, P + 1, P, P + 1),
        "retry_cnt 1 → 0"
    );
    p.now = at(t + Duration::from_nanos(200));
    assert_eq!(answer(&mut p, P, seq_nak()), []);
    assert_eq!(p.next_deadline(), Some(at(t + us(1))));
    assert_eq!(until(&mut p, at(t + us(1))), []);
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::RetryExcErr, WcOpcode::Send, 0)]
    );
    assert_eq!(p.a.state(), QpState::Err);
}

// ---- READs and atomics ---------------------------------------------------------------------

/// A READ response `op` for `psn` with `payload`, crafted as from b.
fn read_response(p: &Pair, op: Opcode, psn: u32, payload: &[u8]) -> common::Pkt {
    let aeth = (op != RdmaReadResponseMiddle).then_some(AethRepr {
        syndrome: Syndrome::ACK_UNLIMITED,
        msn: 0,
    });
    let repr = PacketRepr {
        aeth,
        ..PacketRepr::new(bth(op, p.a.qpn, psn, false), payload)
    };
    p.craft(Dir::BtoA, &repr)
}

/// An ATOMIC ACKNOWLEDGE for `psn` carrying `orig`, crafted as from b.
fn atomic_ack(p: &Pair, psn: u32, orig: u64) -> common::Pkt {
    let repr = PacketRepr {
        aeth: Some(AethRepr {
            syndrome: Syndrome::ACK_UNLIMITED,
            msn: 0,
        }),
        atomic_ack_eth: Some(AtomicAckEthRepr {
            orig_remote_data: orig,
        }),
        ..PacketRepr::new(bth(AtomicAcknowledge, p.a.qpn, psn, false), &[])
    };
    p.craft(Dir::BtoA, &repr)
}

/// a posts a READ of `pkts` MTUs from b's MR into its own (`wr_id` 1) and sends it.
fn read(p: &mut Pair, pkts: u32) {
    let op = SendOp::RdmaRead {
        remote_addr: p.b.va(0),
        rkey: p.b.mr.rkey,
    };
    let dst = p.a.at(0, pkts * MTU);
    p.post_a(&[SendWr::new(1, op, &[dst])]);
    assert!(p.flush());
}

/// A crafted READ response: opcode, PSN, payload.
type ReadResponse<'a> = (Opcode, u32, &'a [u8]);

/// READ responses whose position or length does not fit the packet they answer fail the
/// READ with BAD_RESP_ERR and the QP.
#[test]
fn read_responses_that_do_not_fit_the_request_fail_it() {
    let full = vec![7u8; MTU as usize];
    let short = vec![7u8; MTU as usize - 1];
    let cases: [(u32, &[ReadResponse<'_>]); 8] = [
        (3, &[(RdmaReadResponseMiddle, P, &full)]),
        (3, &[(RdmaReadResponseLast, P, &full)]),
        (3, &[(RdmaReadResponseOnly, P, &full)]),
        (3, &[(RdmaReadResponseFirst, P, &short)]),
        (1, &[(RdmaReadResponseLast, P, &full)]),
        (1, &[(RdmaReadResponseFirst, P, &full)]),
        (
            3,
            &[
                (RdmaReadResponseFirst, P, &full),
                (RdmaReadResponseMiddle, P + 1, &full),
                (RdmaReadResponseMiddle, P + 2, &full),
            ],
        ),
        (
            3,
            &[
                (RdmaReadResponseFirst, P, &full),
                (RdmaReadResponseFirst, P + 1, &full),
                (RdmaReadResponseFirst, P + 2, &full),
            ],
        ),
    ];
    for (n, (pkts, responses)) in cases.iter().enumerate() {
        let mut p = silent(Opts::default());
        read(&mut p, *pkts);
        for &(op, psn, payload) in *responses {
            let pkt = read_response(&p, op, psn, payload);
            p.inject_pkt(&pkt);
        }
        assert_eq!(
            completions(&mut p),
            [(1, WcStatus::BadRespErr, WcOpcode::RdmaRead, 0)],
            "case {n}"
        );
        assert_eq!(p.a.state(), QpState::Err, "case {n}");
    }
}

/// In IBTA mode a READ response past the oldest unanswered PSN (the one before it was lost) is
/// dropped and counted, not placed (§2.10: the timer recovers); the responses in order then
/// place the data and complete the READ.
#[test]
fn read_response_past_a_gap_is_dropped_in_ibta_mode() {
    let mut p = silent(Opts::default());
    read(&mut p, 2);
    let last = read_response(&p, RdmaReadResponseLast, P + 1, &[2; MTU as usize]);
    p.inject_pkt(&last);
    assert_eq!(
        p.a.read(&p.a.mr, u64::from(MTU), MTU as usize),
        vec![0; MTU as usize]
    );
    let a = p.a.stats();
    assert_eq!((a.duplicate_response, a.sr_placed_early), (1, 0));
    let first = read_response(&p, RdmaReadResponseFirst, P, &[1; MTU as usize]);
    p.inject_pkt(&first);
    assert!(completions(&mut p).is_empty());
    p.inject_pkt(&last);
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::Success, WcOpcode::RdmaRead, 2 * MTU)]
    );
}

/// READ responses that fit place the data at their offsets and count its bytes.
#[test]
fn read_responses_that_fit_place_the_data() {
    let mut p = silent(Opts::default());
    read(&mut p, 3);
    for (i, op) in [
        RdmaReadResponseFirst,
        RdmaReadResponseMiddle,
        RdmaReadResponseLast,
    ]
    .into_iter()
    .enumerate()
    {
        let data = vec![i as u8 + 1; MTU as usize];
        let pkt = read_response(&p, op, P + i as u32, &data);
        p.inject_pkt(&pkt);
    }
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::Success, WcOpcode::RdmaRead, 3 * MTU)]
    );
    let mut want = vec![1u8; MTU as usize];
    want.extend(vec![2u8; MTU as usize]);
    want.extend(vec![3u8; MTU as usize]);
    assert_eq!(p.a.read(&p.a.mr, 0, 3 * MTU as usize), want);
    assert_eq!(p.a.stats().rcvd_bytes, u64::from(3 * MTU));
}

/// A READ response or an ATOMIC ACKNOWLEDGE when the oldest WQE is a SEND fails it with
/// BAD_RESP_ERR and the QP.
#[test]
fn responses_for_a_send_fail_it() {
    for atomic in [false, true] {
        let mut p = silent(Opts::default());
        send(&mut p, 1, 1);
        let pkt = if atomic {
            atomic_ack(&p, P, 5)
        } else {
            read_response(&p, RdmaReadResponseOnly, P, &[1; MTU as usize])
        };
        p.inject_pkt(&pkt);
        assert_eq!(
            completions(&mut p),
            [(1, WcStatus::BadRespErr, WcOpcode::Send, 0)],
            "atomic {atomic}"
        );
        assert_eq!(p.a.state(), QpState::Err);
    }
}

/// An ACK past a READ whose responses never came means they were lost: a goes back to the
/// READ at once, once per retry round (a repeat of that ACK starts nothing), and again after
/// the ACK timeout's round.
#[test]
fn ack_past_an_unanswered_read_resends_it_once_per_round() {
    let mut p = silent(Opts::default());
    let t = ack_timeout(p.opts.timeout);
    read(&mut p, 1);
    send(&mut p, 2, 1);
    let round = vec![(RdmaReadRequest, P), (SendOnly, P + 1)];
    assert_eq!(answer(&mut p, P + 1, Syndrome::ACK_UNLIMITED), round);
    assert_eq!(answer(&mut p, P + 1, Syndrome::ACK_UNLIMITED), []);
    assert_eq!(until(&mut p, at(t)), round, "the timeout's round");
    assert_eq!(answer(&mut p, P + 1, Syndrome::ACK_UNLIMITED), round);
    assert!(completions(&mut p).is_empty());
    let a = p.a.stats();
    assert_eq!(
        (a.retransmits_nak, a.retransmits_timeout, a.timeout_retries),
        (4, 2, 1)
    );
}

/// One RTT sample at a time (Karn): the probe is the first packet sent that asks for an ACK
/// while none is pending, and is not replaced by a later one. Two SENDs at 0 and 40 µs, both
/// acknowledged at 100 µs, give a sample of 100 µs (not 60 µs), so the echo guard for the PSN
/// a round went back to is 125 µs.
#[test]
fn rtt_sample_is_timed_from_the_oldest_pending_probe() {
    let mut p = silent(Opts::default());
    send(&mut p, 1, 1);
    p.now = at(us(40));
    send(&mut p, 2, 1);
    p.now = at(us(100));
    assert_eq!(answer(&mut p, P + 1, Syndrome::ACK_UNLIMITED), []);
    send(&mut p, 3, 2);
    let q = P + 2;
    assert_eq!(answer(&mut p, q, seq_nak()), sends(q, q + 1, q, q + 1));
    p.now = at(us(120));
    assert_eq!(answer(&mut p, q, seq_nak()), []);
    assert_eq!(p.next_deadline(), Some(at(us(225))));
}

/// After the first response of a 3-packet READ, the ACK timeout re-requests only the rest
/// (§3.8): a READ request at the next PSN whose RETH names the remote address and length
/// after the bytes already placed; responses to that re-request (FIRST, LAST) complete it.
#[test]
fn read_retry_re_requests_only_what_is_missing() {
    let mut p = silent(Opts::default());
    let t = ack_timeout(p.opts.timeout);
    let va = p.b.va(0);
    read(&mut p, 3);
    let first = vec![1u8; MTU as usize];
    let pkt = read_response(&p, RdmaReadResponseFirst, P, &first);
    p.inject_pkt(&pkt);
    let mark = p.trace.len();
    assert!(p.run_until(at(t)));
    let out = p.seen_since(mark, Dir::AtoB);
    assert_eq!(
        out.iter().map(|s| (s.op, s.psn)).collect::<Vec<_>>(),
        [(RdmaReadRequest, P + 1)]
    );
    let reth = out[0].reth.unwrap();
    assert_eq!(
        (reth.va, reth.rkey, reth.dma_len),
        (va + u64::from(MTU), p.b.mr.rkey, 2 * MTU)
    );
    for (op, psn, byte) in [
        (RdmaReadResponseFirst, P + 1, 2u8),
        (RdmaReadResponseLast, P + 2, 3u8),
    ] {
        let pkt = read_response(&p, op, psn, &[byte; MTU as usize]);
        p.inject_pkt(&pkt);
    }
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::Success, WcOpcode::RdmaRead, 3 * MTU)]
    );
    let mut want = first;
    want.extend([2u8; MTU as usize]);
    want.extend([3u8; MTU as usize]);
    assert_eq!(p.a.read(&p.a.mr, 0, 3 * MTU as usize), want);
}

/// The RTT estimate is smoothed (7/8 old + 1/8 new sample): samples of 80 µs then 160 µs give
/// 90 µs, so the echo guard for the PSN a round went back to is 112.5 µs.
#[test]
fn rtt_estimate_is_smoothed() {
    let mut p = silent(Opts::default());
    send(&mut p, 1, 1);
    p.now = at(us(80));
    assert_eq!(answer(&mut p, P, Syndrome::ACK_UNLIMITED), []);
    send(&mut p, 2, 1);
    p.now = at(us(240));
    assert_eq!(answer(&mut p, P + 1, Syndrome::ACK_UNLIMITED), []);
    send(&mut p, 3, 2);
    let q = P + 2;
    assert_eq!(answer(&mut p, q, seq_nak()), sends(q, q + 1, q, q + 1));
    p.now = at(us(352));
    assert_eq!(answer(&mut p, q, seq_nak()), []);
    assert_eq!(
        p.next_deadline(),
        Some(at(us(352) + Duration::from_nanos(500)))
    );
}

/// The local buffer of a READ or an atomic whose MR was deregistered while the request was in
/// flight, and another MR registered since under the same key and address without LOCAL_WRITE:
/// the response may not land there (LOC_PROT_ERR), although the key and address resolve again.
#[test]
fn response_into_a_buffer_that_lost_local_write_fails() {
    for atomic in [false, true] {
        let mut p = silent(Opts::default());
        let mr = p.a.reg(4096, ALL_ACCESS);
        let (remote_addr, rkey) = (p.b.va(0), p.b.mr.rkey);
        let (op, wc_op) = if atomic {
            let add = 1;
            let op = SendOp::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add,
            };
            (op, WcOpcode::FetchAdd)
        } else {
            (SendOp::RdmaRead { remote_addr, rkey }, WcOpcode::RdmaRead)
        };
        let dst = Node::sge(&mr, 0, 8);
        p.post_a(&[SendWr::new(1, op, &[dst])]);
        assert!(p.flush());
        p.a.hca.dereg_mr(mr.lkey).unwrap();
        // Register and deregister in the freed slot until the key byte comes round again.
        let again = (0..10_000)
            .find_map(|_| {
                let pd = p.a.pd;
                let m =
                    p.a.hca
                        .reg_mr(pd, mr.iova, 4096, AccessFlags::REMOTE_READ)
                        .unwrap();
                if m.lkey == mr.lkey {
                    p.a.mem.insert(m.lkey, 4096);
                    return Some(m);
                }
                p.a.hca.dereg_mr(m.lkey).unwrap();
                None
            })
            .expect("the key byte repeats");
        assert_eq!(again.lkey, mr.lkey);
        let pkt = if atomic {
            atomic_ack(&p, P, 5)
        } else {
            read_response(&p, RdmaReadResponseOnly, P, &[9; 8])
        };
        p.inject_pkt(&pkt);
        assert_eq!(
            completions(&mut p),
            [(1, WcStatus::LocProtErr, wc_op, 0)],
            "atomic {atomic}"
        );
    }
}

/// A fenced local operation behind a READ waits for the READ's response before it is carried
/// out; the response completes the READ only. The operation then runs (here a LOCAL_INV of a
/// key that names no window: LOC_QP_OP_ERR), in order.
#[test]
fn fenced_local_operation_runs_after_the_read_completes() {
    let mut p = silent(Opts::default());
    read(&mut p, 1);
    let inv = SendWr::new(2, SendOp::LocalInv { rkey: 0x0bad_0001 }, &[])
        .with_flags(SendFlags::SIGNALED | SendFlags::FENCE);
    p.post_a(&[inv]);
    assert!(p.flush());
    assert!(completions(&mut p).is_empty(), "the fence holds it");
    let pkt = read_response(&p, RdmaReadResponseOnly, P, &[3; MTU as usize]);
    p.inject_pkt(&pkt);
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::Success, WcOpcode::RdmaRead, MTU)]
    );
    assert!(p.flush());
    assert_eq!(
        completions(&mut p),
        [(2, WcStatus::LocQpOpErr, WcOpcode::LocalInv, 0)]
    );
}

// ---- selective ACKs (selective repeat) -----------------------------------------------------

/// A pair as [`silent`] whose QPs run selective repeat.
fn silent_sr() -> Pair {
    silent(Opts {
        recovery: Recovery::SelectiveRepeat,
        ..Opts::default()
    })
}

/// A selective ACK from b to a: BTH PSN `psn` (b's ePSN), bit i of `bitmap` = PSN psn + 1 + i
/// received.
fn crafted_sack(p: &Pair, psn: u32, bitmap: SackBitmap) -> Pkt {
    let ack = p.crafted_ack(psn, Syndrome::ACK_UNLIMITED);
    let repr = SackPacketRepr {
        bth: bth(Opcode::from(SACK_OPCODE), p.a.qpn, psn, false),
        sack: SackRepr { msn: 0, bitmap },
    };
    let mut bytes = vec![0u8; SACK_PACKET_LEN];
    repr.emit(&mut bytes).unwrap();
    fill_icrc(&ip_ctx(ack.src, ack.dst), &mut bytes).unwrap();
    assert_eq!(ack.dst.port(), PORT);
    Pkt { bytes, ..ack }
}

/// A selective ACK whose PSN (the responder's ePSN) is before the oldest unacknowledged PSN
/// or after the next PSN a would send is stale: dropped and counted, nothing it claims is
/// believed (no completion). One inside the window counts as a received packet, and
/// acknowledges every PSN before its own (the SEND ending there completes).
#[test]
fn selective_ack_outside_the_window_is_dropped() {
    let mut p = silent_sr();
    send(&mut p, 1, 2);
    send(&mut p, 2, 2);
    let stale = |p: &Pair| p.a.stats().rx_drops.get(RxDropCause::StaleResponse);
    for (n, psn) in [P + 5, P + 0xFF_FFFF].into_iter().enumerate() {
        let sack = crafted_sack(&p, psn & 0xFF_FFFF, SackBitmap::first(1));
        p.inject_pkt(&sack);
        assert_eq!(stale(&p), n as u64 + 1, "PSN {psn:#x}");
        assert!(completions(&mut p).is_empty(), "PSN {psn:#x}");
    }
    let a = p.a.stats();
    assert_eq!((a.sacks_rcvd, a.rcvd_pkts), (0, 0));

    let sack = crafted_sack(&p, P + 2, SackBitmap::first(1));
    p.inject_pkt(&sack);
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::Success, WcOpcode::Send, 2 * MTU)]
    );
    let a = p.a.stats();
    assert_eq!((a.sacks_rcvd, a.rcvd_pkts, stale(&p)), (1, 1, 2));
    // ePSN P + 1 is now before the oldest unacknowledged PSN (P + 2).
    let old = crafted_sack(&p, P + 1, SackBitmap::first(3));
    p.inject_pkt(&old);
    assert!(completions(&mut p).is_empty());
    let a = p.a.stats();
    assert_eq!((a.sacks_rcvd, a.rcvd_pkts, stale(&p)), (1, 1, 3));
    assert_eq!(p.a.state(), QpState::Rts);
}

/// Selective repeat, go-back-N after an RNR NAK: the resend steps over the packets a selective
/// ACK reported received, except the oldest unacknowledged PSN, which always goes (the
/// responder drops a held packet when it refuses it with an RNR NAK). Here b reported P + 1
/// and P + 3 received, then RNR-NAKed P + 1: a resends P + 1 and P + 2 only.
#[test]
fn selective_repeat_resend_skips_what_was_reported_received_but_the_oldest() {
    let mut p = silent_sr();
    assert_eq!(send(&mut p, 1, 4), sends(P, P + 3, P, P + 3));
    let mut bits = SackBitmap::default();
    bits.set(0);
    bits.set(2);
    let sack = crafted_sack(&p, P, bits);
    p.inject_pkt(&sack);
    assert!(p.flush());
    assert_eq!(sent_since(&p, 0).len(), 4, "nothing resent yet");
    assert_eq!(answer(&mut p, P + 1, rnr_nak(1)), []);
    let delay = RnrTimer::from_code(1).duration();
    assert_eq!(until(&mut p, at(delay)), sends(P, P + 3, P + 1, P + 2));
    assert_eq!(p.a.stats().sacks_rcvd, 1);
}

/// Selective repeat: a READ response past a gap lands in the SGEs of the READ whose PSNs
/// include it — here the second of two READs — on arrival; each READ completes, in order,
/// only once the responses up to its last one have all arrived, whether in order or placed
/// early (module docs of `rc::sr`, "Completer").
#[test]
fn selective_repeat_places_early_read_responses_in_their_own_read() {
    let mut p = silent_sr();
    let (remote_addr, rkey) = (p.b.va(0), p.b.mr.rkey);
    let op = SendOp::RdmaRead { remote_addr, rkey };
    let (d1, d2) = ([p.a.at(0, 4 * MTU)], [p.a.at(8192, 2 * MTU)]);
    p.post_a(&[SendWr::new(1, op, &d1), SendWr::new(2, op, &d2)]);
    assert!(p.flush());
    let chunk = |i: u8| vec![i; MTU as usize];
    let inject = |p: &mut Pair, op: Opcode, psn: u32, i: u8| {
        let pkt = read_response(p, op, psn, &chunk(i));
        p.inject_pkt(&pkt);
    };
    // The second READ's first response, with all of the first READ's missing.
    inject(&mut p, RdmaReadResponseFirst, P + 4, 5);
    assert_eq!(p.a.read(&p.a.mr, 8192, MTU as usize), chunk(5));
    assert_eq!(p.a.stats().sr_placed_early, 1);
    // The first READ: packet 2 early, then 0 and 1 in order; 3 is still missing.
    inject(&mut p, RdmaReadResponseMiddle, P + 2, 3);
    inject(&mut p, RdmaReadResponseFirst, P, 1);
    inject(&mut p, RdmaReadResponseMiddle, P + 1, 2);
    assert!(
        completions(&mut p).is_empty(),
        "the READ's last response is missing"
    );
    assert_eq!(p.a.stats().sr_placed_early, 2);
    inject(&mut p, RdmaReadResponseLast, P + 3, 4);
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::Success, WcOpcode::RdmaRead, 4 * MTU)]
    );
    inject(&mut p, RdmaReadResponseLast, P + 5, 6);
    assert_eq!(
        completions(&mut p),
        [(2, WcStatus::Success, WcOpcode::RdmaRead, 2 * MTU)]
    );
    let got: Vec<u8> = p.a.read(&p.a.mr, 0, 4 * MTU as usize);
    assert_eq!(got, [chunk(1), chunk(2), chunk(3), chunk(4)].concat());
    assert_eq!(
        p.a.read(&p.a.mr, 8192, 2 * MTU as usize),
        [chunk(5), chunk(6)].concat()
    );
}

/// a posts `wrs` (opcode, flags) as wr_ids 1, 2, …: SENDs of one MTU, READs of one MTU from
/// b's MR; returns what it sent at once.
fn post_ops(p: &mut Pair, wrs: &[(WcOpcode, SendFlags)]) -> Vec<(Opcode, u32)> {
    let mark = p.trace.len();
    let (remote_addr, rkey) = (p.b.va(0), p.b.mr.rkey);
    let sges: Vec<[verbs_api::Sge; 1]> = (0..wrs.len() as u64)
        .map(|i| [p.a.at(i * u64::from(MTU), MTU)])
        .collect();
    let wrs: Vec<SendWr<'_>> = wrs
        .iter()
        .zip(&sges)
        .enumerate()
        .map(|(i, (&(op, flags), sge))| {
            let op = match op {
                WcOpcode::RdmaRead => SendOp::RdmaRead { remote_addr, rkey },
                _ => SendOp::Send,
            };
            SendWr::new(i as u64 + 1, op, sge).with_flags(flags | SendFlags::SIGNALED)
        })
        .collect();
    p.post_a(&wrs);
    assert!(p.flush());
    sent_since(p, mark)
}

/// `max_rd_atomic` bounds the READs and atomics outstanding, not other WQEs (§3.3, IBA
/// 10.8.3.3): with a limit of 1, a SEND before a READ neither takes the READ's slot nor frees
/// it when it completes; the second READ waits until the first one's response.
#[test]
fn max_rd_atomic_counts_only_reads_and_atomics() {
    let mut p = silent(Opts {
        max_rd_atomic: 1,
        ..Opts::default()
    });
    let none = SendFlags::empty();
    let ops = [
        (WcOpcode::Send, none),
        (WcOpcode::RdmaRead, none),
        (WcOpcode::RdmaRead, none),
    ];
    assert_eq!(
        post_ops(&mut p, &ops),
        [(SendOnly, P), (RdmaReadRequest, P + 1)]
    );
    assert_eq!(answer(&mut p, P, Syndrome::ACK_UNLIMITED), []);
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::Success, WcOpcode::Send, MTU)]
    );
    assert!(p.flush());
    assert_eq!(sent_since(&p, 0).len(), 2, "the second READ still waits");
    let mark = p.trace.len();
    let pkt = read_response(&p, RdmaReadResponseOnly, P + 1, &[4; MTU as usize]);
    p.inject_pkt(&pkt);
    assert!(p.flush());
    assert_eq!(sent_since(&p, mark), [(RdmaReadRequest, P + 2)]);
    assert_eq!(
        completions(&mut p),
        [(2, WcStatus::Success, WcOpcode::RdmaRead, MTU)]
    );
}

/// A fenced SEND waits for every earlier READ to complete (IBA 10.8.3.3, §3.3); an unfenced one
/// does not, and a fenced one with no READ outstanding goes at once.
#[test]
fn fenced_send_waits_for_earlier_reads_only() {
    let mut p = silent(Opts::default());
    let (none, fence) = (SendFlags::empty(), SendFlags::FENCE);
    assert_eq!(
        post_ops(&mut p, &[(WcOpcode::Send, fence)]),
        [(SendOnly, P)],
        "nothing outstanding"
    );
    let ops = [
        (WcOpcode::RdmaRead, none),
        (WcOpcode::Send, none),
        (WcOpcode::Send, fence),
        (WcOpcode::Send, none),
    ];
    assert_eq!(
        post_ops(&mut p, &ops),
        [(RdmaReadRequest, P + 1), (SendOnly, P + 2)],
        "the fence holds the third WQE and the one behind it"
    );
    let mark = p.trace.len();
    let pkt = read_response(&p, RdmaReadResponseOnly, P + 1, &[4; MTU as usize]);
    p.inject_pkt(&pkt);
    assert!(p.flush());
    assert_eq!(sent_since(&p, mark), [(SendOnly, P + 3), (SendOnly, P + 4)]);
}

/// `bits` with bits `from..=to` set (bit i: PSN ePSN + 1 + i received).
fn sack_bits(from: u32, to: u32) -> SackBitmap {
    let mut b = SackBitmap::default();
    (from..=to).for_each(|i| b.set(i));
    b
}

/// Selective repeat: a PSN queued for resend that is acknowledged, or reported received,
/// before the resend goes is not resent (module docs of `rc::sr`: what is still missing is
/// resent alone). A SEND of 13 packets; b reports P + 2 ..= P + 11 received, so P and P + 1
/// (8 transmissions older than what was delivered) are queued. Before a transmits, either
/// nothing more arrives (both go), or an ACK covers both (neither goes), or a second selective
/// ACK reports P + 1 received (only P goes).
#[test]
fn selective_repeat_does_not_resend_what_was_answered_meanwhile() {
    for case in 0..3 {
        let mut p = silent_sr();
        assert_eq!(send(&mut p, 1, 13).len(), 13);
        let sack = crafted_sack(&p, P, sack_bits(1, 10));
        p.inject_pkt(&sack);
        let (meanwhile, want) = match case {
            0 => (None, vec![(SendFirst, P), (SendMiddle, P + 1)]),
            1 => (Some(p.crafted_ack(P + 1, Syndrome::ACK_UNLIMITED)), vec![]),
            _ => (
                Some(crafted_sack(&p, P, sack_bits(0, 10))),
                vec![(SendFirst, P)],
            ),
        };
        if let Some(pkt) = meanwhile {
            p.inject_pkt(&pkt);
        }
        let mark = p.trace.len();
        assert!(p.flush());
        assert_eq!(sent_since(&p, mark), want, "case {case}");
    }
}

/// A WQE that waits for the window (64 unacknowledged PSNs, §2.11) has not started: if the QP
/// enters SQD meanwhile, it stays unsent when the window opens (§5.1: nothing new starts in
/// SQD), and the ACK that completes the outstanding SEND ends the drain.
#[test]
fn wqe_waiting_for_the_window_does_not_start_in_sqd() {
    let mut p = silent(Opts::default());
    assert_eq!(send(&mut p, 1, 64).len(), 64);
    assert_eq!(send(&mut p, 2, 1), [], "the window is full");
    let sqd = verbs_api::QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..verbs_api::QpAttr::default()
    };
    let mask = verbs_api::QpAttrMask::STATE | verbs_api::QpAttrMask::EN_SQD_ASYNC_NOTIFY;
    let now = p.now;
    p.a.modify(now, &sqd, mask).unwrap();
    assert_eq!(answer(&mut p, P + 63, Syndrome::ACK_UNLIMITED), []);
    assert_eq!(
        completions(&mut p),
        [(1, WcStatus::Success, WcOpcode::Send, 64 * MTU)]
    );
    assert_eq!(p.a.events().len(), 1, "SQ_DRAINED");
}

/// Karn's rule: a retransmitted packet is never an RTT probe (its ACK could answer either
/// copy). A first sample of 80 µs; then a SEND resent by the ACK timeout and acknowledged
/// 10 µs after the resend leaves the estimate at 80 µs, so the echo guard for the PSN a
/// round went back to stays 100 µs.
#[test]
fn retransmission_is_never_an_rtt_probe() {
    let mut p = silent(Opts::default());
    let t = ack_timeout(p.opts.timeout);
    send(&mut p, 1, 1);
    p.now = at(us(80));
    assert_eq!(answer(&mut p, P, Syndrome::ACK_UNLIMITED), []);
    send(&mut p, 2, 1);
    assert_eq!(
        until(&mut p, at(us(80) + t)),
        sends(P + 1, P + 1, P + 1, P + 1)
    );
    let t0 = us(90) + t;
    p.now = at(t0);
    assert_eq!(answer(&mut p, P + 1, Syndrome::ACK_UNLIMITED), []);
    let t1 = t0 + us(200);
    p.now = at(t1);
    send(&mut p, 3, 2);
    let q = P + 2;
    assert_eq!(answer(&mut p, q, seq_nak()), sends(q, q + 1, q, q + 1));
    p.now = at(t1 + us(1));
    assert_eq!(answer(&mut p, q, seq_nak()), []);
    assert_eq!(p.next_deadline(), Some(at(t1 + us(100))));
}
