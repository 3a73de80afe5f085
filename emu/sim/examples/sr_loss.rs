//! Profiling driver for selective repeat under loss (issue 19): the `sr_goodput` test's stream
//! (64 KiB RDMA WRITEs at 4 KiB MTU, all of a batch posted at once, a 1 GB/s link with 50 µs
//! one-way latency, seeded random loss both ways, virtual time), `batches` batches of 256 WRs,
//! for instruction counts under callgrind — deterministic, so independent of machine load:
//!
//! `cargo build --release -p emu-sim --example sr_loss &&
//!  valgrind --tool=callgrind target/release/examples/sr_loss 0.01 4`
//!
//! Arguments: the loss fraction (default 0.01), the batch count (default 4), and `ibta` to run
//! go-back-N instead. Prints the packets delivered and the requester's and responder's
//! counters.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use emu_sim::fault::{FaultPlan, drop, rate_limit};
use emu_sim::{PairOptions, SimProvider};
use verbs_api::{
    MemoryRegion, Mtu, QueuePair, RcConnectOptions, Recovery, SendOp, SendWr, WcStatus,
};

/// WRs per batch (the QP's send queue depth).
const WRS: u64 = 256;
const LEN: usize = 64 * 1024;

fn main() {
    let mut args = std::env::args().skip(1);
    let loss: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(0.01);
    let batches: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(4);
    let recovery = match args.next().as_deref() {
        Some("ibta") => Recovery::Ibta,
        _ => Recovery::SelectiveRepeat,
    };
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
    let sge = [p.mr_a.sge(0, LEN).unwrap()];
    let op = SendOp::RdmaWrite {
        remote_addr: p.mr_b.addr() + LEN as u64,
        rkey: p.mr_b.rkey(),
    };
    for _ in 0..batches {
        let wrs: Vec<SendWr<'_>> = (0..WRS).map(|i| SendWr::new(i, op, &sge)).collect();
        p.qp_a.post_send(&wrs).unwrap();
        for i in 0..WRS {
            let wc = p.cq_a.next_completion().unwrap();
            assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
        }
    }
    let a = p.qp_a.stats().unwrap();
    let b = p.qp_b.stats().unwrap();
    let delivered = batches * WRS * (LEN as u64 / 4096);
    println!(
        "loss {loss} {recovery:?}: {delivered} packets delivered in {:?} virtual; requester \
         sent {} (retx {}), sacks rcvd {}, probes {}; responder sacks sent {}, acks sent {}, \
         held {}, placed early {}; dropped {}",
        p.sim.now() - start,
        a.sent_pkts,
        a.retransmits(),
        a.sacks_rcvd,
        a.sr_probes,
        b.sacks_sent,
        b.acks_sent,
        b.out_of_seq_request,
        b.sr_placed_early,
        p.sim.fault_counters().total().dropped,
    );
}
