//! Profiling driver: N 8-byte RDMA WRITEs posted and polled on one thread of the in-process
//! backend (the loop of the `inproc` bench's `write_8b/post_poll`), for instruction counts
//! under callgrind:
//!
//! `cargo build --release -p emu-sim --example write_loop &&
//!  valgrind --tool=callgrind target/release/examples/write_loop 100000`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use emu_sim::SimProvider;
use verbs_api::{CompletionQueue, MemoryRegion, QueuePair, SendOp, SendWr, WorkCompletion};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let p = SimProvider::pair().unwrap();
    let sge = [p.mr_a.sge(0, 8).unwrap()];
    let op = SendOp::RdmaWrite {
        remote_addr: p.mr_b.addr(),
        rkey: p.mr_b.rkey(),
    };
    let wr = [SendWr::new(1, op, &sge)];
    let mut wc = [WorkCompletion::default(); 1];
    let start = std::time::Instant::now();
    for _ in 0..n {
        p.qp_a.post_send(&wr).unwrap();
        while p.cq_a.poll(&mut wc).unwrap() == 0 {}
    }
    let secs = start.elapsed().as_secs_f64();
    println!("{n} writes in {secs:.3} s = {:.0} ops/s", n as f64 / secs);
}
