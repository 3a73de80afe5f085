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

use emu_proto::wire::Psn;
use emu_sim::fault::{FaultPlan, drop, drop_nth, rate_limit};
use emu_sim::{PairOptions, SimPair, SimProvider};
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
    /// Selective repeat's probes, and retries after the local ACK timeout.
    probes: u64,
    timeouts: u64,
}

/// Streams [`WRS`] WRITEs with `recovery` on both QPs at random loss `loss`.
fn stream(recovery: Recovery, loss: f64) -> Run {
    let mut plan = link();
    if loss > 0.0 {
        plan = plan.rule(drop(loss));
    }
    let p = pair(recovery, plan, PairOptions::default().psn_a);
    let start = p.sim.now();
    post_stream(&p);
    let a = p.qp_a.stats().unwrap();
    Run {
        elapsed: p.sim.now() - start,
        retx: a.retransmits(),
        sent: a.sent_pkts,
        dropped: p.sim.fault_counters().total().dropped,
        probes: a.sr_probes,
        timeouts: a.timeout_retries,
    }
}

/// The link of every pair here: 1 GB/s (the one-way latency is the provider's).
fn link() -> FaultPlan {
    FaultPlan::new(19).rule(rate_limit(1_000_000_000))
}

/// A pair with `recovery` on both QPs, 4 KiB MTU, on a fabric of its own (50 µs one way) with
/// fault plan `plan`; side a sends from PSN `psn_a`.
fn pair(recovery: Recovery, plan: FaultPlan, psn_a: u32) -> SimPair {
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
        psn_a,
        ..PairOptions::default()
    };
    sim.connect_pair(opts).unwrap()
}

/// Posts [`WRS`] 64 KiB WRITEs from a to b in one call and waits for their completions, in
/// order and successful. One post for the whole stream: in virtual time every verbs call lets
/// the fabric settle, so WRs posted one by one would each wait a round trip.
fn post_stream(p: &SimPair) {
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

/// PSNs of one stream of [`WRS`] WRITEs (16 packets each at 4 KiB MTU).
const STREAM_PSNS: u32 = 16 * WRS as u32;

/// The first PSN the long-lived pairs' requester sends: 2,048 before the PSN space wraps, so
/// that their episodes cross the wrap.
const FIRST_PSN: u32 = 0xFF_F800;

/// What one loss episode on a long-lived QP pair cost (the requester's counters, this
/// episode's share).
#[derive(Debug, PartialEq)]
struct Episode {
    elapsed: Duration,
    sent: u64,
    retx: u64,
    probes: u64,
}

/// Episode `k` of pair `p` (selective repeat): streams [`WRS`] WRITEs at random loss `loss`
/// and, in a lossy episode, also loses the first transmission of the stream's last packet,
/// which only the probe recovers (nothing behind it draws a selective ACK). The loss rule's
/// random stream starts afresh, so an episode meets the same verdicts as every other at its
/// rate. Then the pair idles lossless for 5 ms.
fn episode(p: &SimPair, k: u32, loss: f64) -> Episode {
    episode_with(p, k, loss, loss > 0.0)
}

/// [`episode`], losing the first transmission of the stream's last packet if `tail`.
fn episode_with(p: &SimPair, k: u32, loss: f64, tail: bool) -> Episode {
    let mut plan = link();
    if tail {
        let last = Psn::new(FIRST_PSN).wrapping_add((k + 1) * STREAM_PSNS - 1);
        plan = plan.rule(drop_nth(1).psn_range(last, last));
    }
    if loss > 0.0 {
        plan = plan.rule(drop(loss));
    }
    p.sim.set_faults(plan).unwrap();
    let before = p.qp_a.stats().unwrap();
    let start = p.sim.now();
    post_stream(p);
    let elapsed = p.sim.now() - start;
    let a = p.qp_a.stats().unwrap();
    p.sim.set_faults(link()).unwrap();
    p.sim.advance(Duration::from_millis(5));
    Episode {
        elapsed,
        sent: a.sent_pkts - before.sent_pkts,
        retx: a.retransmits() - before.retransmits(),
        probes: a.sr_probes - before.sr_probes,
    }
}

/// A pair with selective repeat on a fabric of its own (1 GB/s, 50 µs one way).
fn long_lived_pair() -> SimPair {
    pair(Recovery::SelectiveRepeat, link(), FIRST_PSN)
}

/// Issue 19 (`perf --sweep-loss` reuses one QP pair for every run, in rising loss): a QP that
/// has been through loss episodes recovers the next one exactly as a QP that has only warmed
/// up (one lossless episode, so that both start with an RTT estimate): the same packets,
/// retransmissions and probes, and the virtual time within 1 % (the RTT estimate is a moving
/// average, so the one carried in differs a little: 0.4 % here). The long-lived pair runs the
/// sweep's order (lossless, 0.1 %, 0.5 %, then 1 %), a 5 % episode, and 1 % again, across the
/// PSN wrap; every 1 % episode must match the reference. Each lossy episode needs a probe for
/// its tail, so RTT estimate and probe back-off carried from earlier episodes would show.
#[test]
fn a_later_loss_episode_on_one_qp_costs_what_the_first_did() {
    let fresh = long_lived_pair();
    episode(&fresh, 0, 0.0);
    let reference = episode(&fresh, 1, 0.01);
    eprintln!("reference (second episode of a fresh pair): {reference:?}");
    assert!(
        reference.retx > 1 && reference.probes > 0,
        "the reference must lose packets and probe: {reference:?}"
    );

    let p = long_lived_pair();
    let mut compared = 0;
    for (k, loss) in (0..).zip([0.0, 0.0, 0.001, 0.001, 0.005, 0.01, 0.01, 0.05, 0.01]) {
        let e = episode(&p, k, loss);
        eprintln!("episode {k}, loss {loss}: {e:?}");
        if loss == 0.01 {
            let r = e.elapsed.as_secs_f64() / reference.elapsed.as_secs_f64();
            assert!(
                (e.sent, e.retx, e.probes) == (reference.sent, reference.retx, reference.probes)
                    && (0.99..=1.01).contains(&r),
                "episode {k} (1 %) of the long-lived pair: {e:?}, {r:.4} of the reference"
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 3);
}

/// Issue 19: losing only the stream's last packet costs one probe and one resend (the probe
/// resends the newest unit, not the oldest unacknowledged one, which had arrived); the extra
/// virtual time it costs is printed.
#[test]
fn a_lost_tail_costs_one_probe_and_one_resend() {
    let p = long_lived_pair();
    episode(&p, 0, 0.0);
    let lossless = episode(&p, 1, 0.0);
    let tail = episode_with(&p, 2, 0.0, true);
    let cost = tail.elapsed.saturating_sub(lossless.elapsed);
    eprintln!("lossless: {lossless:?}; tail lost: {tail:?}; cost {cost:?}");
    assert_eq!((lossless.retx, lossless.probes), (0, 0));
    assert_eq!(
        (tail.sent, tail.retx, tail.probes),
        (lossless.sent + 1, 1, 1)
    );
}
