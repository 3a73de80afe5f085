//! Criterion benchmarks of the in-process backend (virtual time, no faults):
//!
//! * `write_8b/post_poll`: one 8-byte RDMA WRITE posted and its completion polled, on one thread
//!   (target: ≥ 2 M ops/s);
//! * `qp_pair_setup/create_connect`: two RC QPs created on two devices and walked RESET → RTS
//!   with `connect_rc` (target: < 50 µs), and `qp_pair_setup/connect_pair` for the whole
//!   `connect_pair` fixture (PDs, CQs, 4 KiB MRs, QPs).
//!
//! Run: `cargo bench -p emu-sim --bench inproc -- --warm-up-time 1 --measurement-time 3`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use emu_sim::{PairOptions, SimProvider, connect_pair};
use verbs_api::{
    CompletionQueue, Context, MemoryRegion, QpCap, QpInitAttr, QueuePair, RcConnectOptions, SendOp,
    SendWr, WorkCompletion, connect_rc,
};

fn write_8b(c: &mut Criterion) {
    let p = SimProvider::pair().unwrap();
    let sge = [p.mr_a.sge(0, 8).unwrap()];
    let op = SendOp::RdmaWrite {
        remote_addr: p.mr_b.addr(),
        rkey: p.mr_b.rkey(),
    };
    let wr = [SendWr::new(1, op, &sge)];
    let mut wc = [WorkCompletion::default(); 1];
    let mut g = c.benchmark_group("write_8b");
    g.throughput(Throughput::Elements(1));
    g.bench_function("post_poll", |b| {
        b.iter(|| {
            p.qp_a.post_send(&wr).unwrap();
            while p.cq_a.poll(&mut wc).unwrap() == 0 {}
        })
    });
    g.finish();
}

fn qp_pair_setup(c: &mut Criterion) {
    let sim = SimProvider::builder().build().unwrap();
    let a = sim.context(0).unwrap();
    let b = sim.context(1).unwrap();
    let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        a.create_cq(1024, None).unwrap(),
        b.create_cq(1024, None).unwrap(),
    );
    let cap = QpCap {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    };
    let rc = RcConnectOptions::default();
    let mut g = c.benchmark_group("qp_pair_setup");
    g.bench_function("create_connect", |bench| {
        bench.iter_with_large_drop(|| {
            let qa = a
                .create_qp(&pd_a, &cq_a, &cq_a, None, &QpInitAttr::rc(cap))
                .unwrap();
            let qb = b
                .create_qp(&pd_b, &cq_b, &cq_b, None, &QpInitAttr::rc(cap))
                .unwrap();
            connect_rc(&qa, 1, &qb.endpoint(2).unwrap(), &rc).unwrap();
            connect_rc(&qb, 2, &qa.endpoint(1).unwrap(), &rc).unwrap();
            (qa, qb)
        })
    });
    let opts = PairOptions {
        mr_len: 4096,
        ..PairOptions::default()
    };
    g.bench_function("connect_pair", |bench| {
        bench.iter_with_large_drop(|| connect_pair(&a, &b, opts).unwrap())
    });
    g.finish();
}

criterion_group!(benches, write_8b, qp_pair_setup);
criterion_main!(benches);
