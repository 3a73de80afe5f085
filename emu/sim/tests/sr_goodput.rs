//! Issue 19, round 2: selective repeat's goodput under random loss, in virtual time
//! (deterministic, immune to machine load). A stream of 256 RDMA WRITEs of 64 KiB (16 packets
//! at 4 KiB MTU), posted at once, over a link paced at 1 GB/s with 50 µs one-way latency; both
//! directions lose packets at random with a fixed seed (selective ACKs are lost too). Goodput
//! at 1 % and 5 % loss is compared with the lossless run (which fills the link) and each ratio
//! pinned by a floor a little below what the engine reaches: measured 0.991 at 1 % and 0.951
//! at 5 % (issue 19's targets are 0.9 and 0.7; round 2 reached 0.852 and 0.787 with a window of
//! 128 PSNs, which a hole stalled while its resend crossed the queue at the rate limiter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use emu_sim::fault::{FaultPlan, drop, rate_limit};
use emu_sim::{PairOptions, SimProvider};
use verbs_api::{
    MemoryRegion, Mtu, QueuePair, RcConnectOptions, Recovery, SendOp, SendWr, WcStatus,
};

/// WRITEs in the stream, all posted at once (the QP's send queue depth).
const WRS: u64 = 256;
const LEN: usize = 64 * 1024;

/// What one stream measured (the counters are printed).
#[derive(Debug)]
#[allow(dead_code)]
struct Run {
    /// Virtual time from the first post to the last completion.
    elapsed: Duration,
    /// Packets a retransmitted.
    retx: u64,
    sent: u64,
    /// Packets the plan dropped.
    dropped: u64,
}

/// Streams [`WRS`] WRITEs with `recovery` on both QPs at random loss `loss`.
fn stream(recovery: Recovery, loss: f64) -> Run {
    let mut plan = FaultPlan::new(19).rule(rate_limit(1_000_000_000));
    if loss > 0.0 {
        plan = plan.rule(drop(loss));
    }
    let sim = SimProvider::builder()
        .latency(Duration::from_micros(50))
        .faults(plan)
        .build()
        .unwrap();
    let opts = PairOptions {
        rc: RcConnectOptions {
            recovery,
            path_mtu: Mtu::Mtu4096,
            ..RcConnectOptions::default()
        },
        mr_len: 2 * LEN,
        ..PairOptions::default()
    };
    let p = sim.connect_pair(opts).unwrap();
    let start = p.sim.now();
    // One post for the whole stream: in virtual time every verbs call lets the fabric settle,
    // so WRs posted one by one would each wait a round trip.
    let sge = [p.mr_a.sge(0, LEN).unwrap()];
    let op = SendOp::RdmaWrite {
        remote_addr: p.mr_b.addr() + LEN as u64,
        rkey: p.mr_b.rkey(),
    };
    let wrs: Vec<SendWr<'_>> = (0..WRS).map(|i| SendWr::new(i, op, &sge)).collect();
    p.qp_a.post_send(&wrs).unwrap();
    for i in 0..WRS {
        let wc = p.cq_a.next_completion().unwrap();
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }
    let a = p.qp_a.stats().unwrap();
    Run {
        elapsed: p.sim.now() - start,
        retx: a.retransmits(),
        sent: a.sent_pkts,
        dropped: p.sim.fault_counters().total().dropped,
    }
}

/// Goodput of `run` relative to `base` (lossless).
fn ratio(base: &Run, run: &Run) -> f64 {
    base.elapsed.as_secs_f64() / run.elapsed.as_secs_f64()
}

#[test]
fn selective_repeat_goodput_under_loss() {
    let base = stream(Recovery::SelectiveRepeat, 0.0);
    eprintln!("lossless: {base:?}");
    for (loss, floor) in [(0.01, 0.96), (0.05, 0.92)] {
        let run = stream(Recovery::SelectiveRepeat, loss);
        let r = ratio(&base, &run);
        eprintln!("loss {loss}: ratio {r:.3} {run:?}");
        assert!(r >= floor, "loss {loss}: ratio {r:.3} below {floor}");
    }
}
