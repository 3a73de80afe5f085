//! Profiling driver: N 8-byte SENDs on one thread of the in-process backend, each into a
//! receive posted just before it, with both completions polled (the sender's and the
//! receiver's), for instruction counts of the SEND path under callgrind — the receive side's
//! per-packet work and both completion queues, which the WRITE loop does not reach:
//!
//! `cargo build --release -p emu-sim --example send_loop &&
//!  valgrind --tool=callgrind target/release/examples/send_loop 20000`
//!
//! Instructions per SEND + both completions: the difference between two counts (e.g. 20,000
//! and 10,000 SENDs) divided by the difference in N, so that setup cancels out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use emu_sim::SimProvider;
use verbs_api::{
    CompletionQueue, MemoryRegion, QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
    WorkCompletion,
};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let p = SimProvider::pair().unwrap();
    let send_sge = [p.mr_a.sge(0, 8).unwrap()];
    let recv_sge = [p.mr_b.sge(0, 8).unwrap()];
    let send = [SendWr::new(1, SendOp::Send, &send_sge)];
    let recv = [RecvWr::new(2, &recv_sge)];
    let mut wc = [WorkCompletion::default(); 1];
    let start = std::time::Instant::now();
    for _ in 0..n {
        p.qp_b.post_recv(&recv).unwrap();
        p.qp_a.post_send(&send).unwrap();
        while p.cq_a.poll(&mut wc).unwrap() == 0 {}
        assert_eq!(
            (wc[0].opcode, wc[0].status),
            (WcOpcode::Send, WcStatus::Success)
        );
        while p.cq_b.poll(&mut wc).unwrap() == 0 {}
        assert_eq!(
            (wc[0].opcode, wc[0].status),
            (WcOpcode::Recv, WcStatus::Success)
        );
    }
    let secs = start.elapsed().as_secs_f64();
    println!("{n} sends in {secs:.3} s = {:.0} ops/s", n as f64 / secs);
}
