//! Wall-clock driver: `write_loop`'s 8-byte WRITE + completion loop in slices, to tell a slow
//! run of our code from a slow machine (issue 18, README "Round 8, in-process").
//!
//! `target/release/examples/write_slices [slices] [writes per slice]` (default 20 × 20,000)
//! prints one line per slice: wall ns per WRITE, this thread's CPU ns per WRITE
//! (`CLOCK_THREAD_CPUTIME_ID`, so time spent descheduled does not count), then the CPU ns per
//! iteration of two fixed reference computations run right after the slice on the same thread:
//! an L1-resident table update (`table`) and four independent integer chains (`alu`). Neither
//! touches the fabric, so a slice that is slow together with them was slowed by the machine,
//! and the memory layout of one process cannot change between its slices.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Instant;

use emu_sim::SimProvider;
use rustix::time::{ClockId, clock_gettime};
use verbs_api::{CompletionQueue, MemoryRegion, QueuePair, SendOp, SendWr, WorkCompletion};

/// CPU nanoseconds this thread has run.
fn cpu_ns() -> f64 {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
}

/// A dependent chain through a 32 KiB table (fits L1d): load, store, branch per iteration.
fn table(iters: u64) -> u64 {
    let mut table = [0u64; 4096];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..iters {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x as usize) & 4095;
        table[j] = table[j].wrapping_add(i);
        if table[(j * 7) & 4095] & 1 == 0 {
            x = x.wrapping_add(1);
        }
    }
    black_box(table[17] ^ x)
}

/// Four integer chains, no memory: sensitive to the clock, not to caches.
fn alu(iters: u64) -> u64 {
    let (mut a, mut b, mut c, mut d) = (1u64, 2u64, 3u64, 4u64);
    for i in 0..iters {
        a = a.wrapping_mul(0x9E37_79B9).wrapping_add(i);
        b = (b ^ (b >> 7)).wrapping_add(a);
        c = c.rotate_left(5) ^ i;
        d = d.wrapping_add(c ^ b);
    }
    black_box(a ^ b ^ c ^ d)
}

/// CPU ns per iteration of `f(iters)`.
fn per_iter(f: fn(u64) -> u64, iters: u64) -> f64 {
    let c = cpu_ns();
    f(iters);
    (cpu_ns() - c) / iters as f64
}

fn main() {
    let arg = |i: usize, default: u64| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let (slices, per) = (arg(1, 20), arg(2, 20_000));
    let p = SimProvider::pair().unwrap();
    let sge = [p.mr_a.sge(0, 8).unwrap()];
    let op = SendOp::RdmaWrite {
        remote_addr: p.mr_b.addr(),
        rkey: p.mr_b.rkey(),
    };
    let wr = [SendWr::new(1, op, &sge)];
    let mut wc = [WorkCompletion::default(); 1];
    println!("wall_ns cpu_ns table_ns alu_ns");
    for _ in 0..slices {
        let (t, c) = (Instant::now(), cpu_ns());
        for _ in 0..per {
            p.qp_a.post_send(&wr).unwrap();
            while p.cq_a.poll(&mut wc).unwrap() == 0 {}
        }
        let cpu = (cpu_ns() - c) / per as f64;
        let wall = t.elapsed().as_secs_f64() * 1e9 / per as f64;
        let (t1, t2) = (per_iter(table, 1_000_000), per_iter(alu, 10_000_000));
        println!("{wall:.0} {cpu:.0} {t1:.2} {t2:.3}");
    }
}
