//! Issue 19, round 2: selective repeat's goodput under random loss, in virtual time
//! (deterministic, immune to machine load). A stream of 64 KiB RDMA WRITEs (16 packets at
//! 4 KiB MTU, up to 16 outstanding) over a link paced at 1 GB/s with 10 µs one-way latency;
//! both directions lose packets at random with a fixed seed. Goodput at 1 % and 5 % loss is
//! compared with the lossless run, and each ratio pinned by a floor a little below what the
//! engine reaches (measured: 0.963 at 1 %, 0.940 at 5 %; the wall-clock `perf --sweep-loss`
//! figures in the README are lower: there the machine, not a paced link, sets the pace).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use emu_sim::fault::{FaultPlan, drop, rate_limit};
use emu_sim::{PairOptions, SimProvider};
use verbs_api::{
    MemoryRegion, Mtu, QueuePair, RcConnectOptions, Recovery, SendOp, SendWr, WcStatus,
};

/// WRITEs in the stream and at most this many outstanding.
const WRS: u64 = 400;
const DEPTH: u64 = 16;
const LEN: usize = 64 * 1024;

/// What one stream measured (the counters are printed).
#[derive(Debug)]
#[allow(dead_code)]
struct Run {
    /// Virtual time from the first post to the last completion.
    elapsed: Duration,
    /// Packets a retransmitted.
    retx: u64,
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
        .latency(Duration::from_micros(10))
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
    Run {
        elapsed: p.sim.now() - start,
        retx: a.retransmits(),
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
    for (loss, floor) in [(0.01, 0.93), (0.05, 0.9)] {
        let run = stream(Recovery::SelectiveRepeat, loss);
        let r = ratio(&base, &run);
        eprintln!("loss {loss}: ratio {r:.3} {run:?}");
        assert!(r >= floor, "loss {loss}: ratio {r:.3} below {floor}");
    }
}
