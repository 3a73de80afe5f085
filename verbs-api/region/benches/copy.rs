//! MR copies as a packet sees them: `Region::read` of one 4 KiB payload into a packet buffer
//! (the requester), `Region::write` of one into the MR (the responder), and the 8-byte copies
//! of the small-message tests. The region is 1 MiB, and the copies walk through it as a WRITE
//! stream does; the packet side starts 28 bytes into its buffer (BTH + RETH), as a first or
//! only WRITE packet's payload does. `cargo bench -p mr-region`.
#![allow(clippy::unwrap_used, missing_docs)]

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use mr_region::Region;

const REGION: usize = 1 << 20;

fn copies(c: &mut Criterion) {
    let r = Region::heap(REGION);
    for len in [8usize, 4096] {
        let mut g = c.benchmark_group(format!("copy_{len}"));
        g.throughput(Throughput::Bytes(len as u64));
        let mut packet = vec![0u8; 28 + len];
        let buf = &mut packet[28..];
        let mut at = 0;
        g.bench_function("read", |b| {
            b.iter(|| {
                at = (at + len) % REGION;
                r.read(black_box(at), buf).unwrap();
            })
        });
        g.bench_function("write", |b| {
            b.iter(|| {
                at = (at + len) % REGION;
                r.write(black_box(at), buf).unwrap();
            })
        });
        g.finish();
    }
}

criterion_group!(benches, copies);
criterion_main!(benches);
