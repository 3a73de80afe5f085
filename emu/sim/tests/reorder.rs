//! Issue 19 item 3: reordering without loss must not cause retransmissions. A stream of 16 KiB
//! RDMA WRITEs over a link paced at 100 MB/s (a 1 KiB packet every ~10 µs) whose every datagram
//! is delayed by a uniform 0–50 µs (so packets overtake each other by up to ~5 places), in
//! virtual time, deterministic: with selective repeat retransmitted packets stay ≤ 1 % of
//! packets sent; IBTA mode is measured (it does not meet that).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use emu_sim::fault::{FaultPlan, delay, rate_limit};
use emu_sim::{PairOptions, SimProvider};
use verbs_api::{MemoryRegion, QueuePair, RcConnectOptions, Recovery, SendOp, SendWr, WcStatus};

/// WRITEs in the stream and at most this many outstanding.
const WRS: u64 = 200;
const DEPTH: u64 = 16;
const LEN: usize = 16 * 1024;

/// Runs the stream with `recovery` on both QPs; returns (retransmitted, sent) packets of a.
fn stream(recovery: Recovery) -> (u64, u64) {
    let plan = FaultPlan::new(19)
        .rule(rate_limit(100_000_000))
        .rule(delay(Duration::ZERO..=Duration::from_micros(50)));
    let sim = SimProvider::builder().faults(plan).build().unwrap();
    let opts = PairOptions {
        rc: RcConnectOptions {
            recovery,
            ..RcConnectOptions::default()
        },
        mr_len: 2 * LEN,
        ..PairOptions::default()
    };
    let p = sim.connect_pair(opts).unwrap();
    let (mut posted, mut done) = (0u64, 0u64);
    while done < WRS {
        while posted < WRS && posted - done < DEPTH {
            let sge = [p.mr_a.sge(0, LEN).unwrap()];
            let op = SendOp::RdmaWrite {
                remote_addr: p.mr_b.addr() + LEN as u64,
                rkey: p.mr_b.rkey(),
            };
            p.qp_a.post_send(&[SendWr::new(posted, op, &sge)]).unwrap();
            posted += 1;
        }
        let wc = p.cq_a.next_completion().unwrap();
        assert_eq!((wc.wr_id, wc.status), (done, WcStatus::Success));
        done += 1;
    }
    let a = p.qp_a.stats().unwrap();
    let c = p.sim.fault_counters().total();
    assert!(c.delayed > 0, "the plan delayed nothing: {c:?}");
    (a.retransmits(), a.sent_pkts)
}

#[test]
fn selective_repeat_reordering_without_loss_retransmits_at_most_one_percent() {
    let (retx, sent) = stream(Recovery::SelectiveRepeat);
    eprintln!("selective repeat: {retx} of {sent} packets retransmitted");
    assert!(sent >= WRS * 16);
    assert!(retx * 100 <= sent, "{retx} of {sent} packets retransmitted");
}

/// IBTA mode under the same jitter: every reordered packet draws a sequence NAK and a
/// go-back-N round, whose resends queue behind the paced link and reorder again. That is the
/// spec's behaviour, not ours to change (the responder discards past a PSN gap and NAKs, the
/// requester goes back to the NAK's PSN; DIVERGENCES.md "Limits of IBTA mode"): issue 19 item
/// 3 (≤ 1 % retransmitted) cannot hold in IBTA mode, and this test pins that it does not —
/// measured 383,839 of 387,039 packets — while the stream still completes, exactly once and in
/// order.
#[test]
fn ibta_reordering_without_loss_completes() {
    let (retx, sent) = stream(Recovery::Ibta);
    eprintln!("IBTA: {retx} of {sent} packets retransmitted");
    assert!(sent >= WRS * 16);
    assert!(
        retx * 100 > sent,
        "IBTA mode under reordering: {retx} of {sent}"
    );
}
