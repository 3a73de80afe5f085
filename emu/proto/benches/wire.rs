//! Criterion benchmarks for the RoCEv2 wire codec: packet parse, packet emit (which includes
//! the ICRC), and the ICRC alone, for 64 B and 4 KiB payloads.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use emu_proto::wire::{
    BthRepr, IpContext, Opcode, Packet, PacketRepr, Psn, RethRepr, compute_icrc, ip::udp_sport,
};

const CTX: IpContext = IpContext::v4(
    Ipv4Addr::new(10, 0, 0, 1),
    Ipv4Addr::new(10, 0, 0, 2),
    udp_sport(0x11, 0x12),
);

fn repr(payload: &[u8]) -> PacketRepr<'_> {
    let bth = BthRepr {
        ack_req: true,
        ..BthRepr::new(Opcode::RdmaWriteOnly, 0x12, Psn::new(1))
    };
    PacketRepr {
        reth: Some(RethRepr {
            va: 0x7F00_0000_0000,
            rkey: 0x1A02,
            dma_len: payload.len() as u32,
        }),
        ..PacketRepr::new(bth, payload)
    }
}

fn bench(c: &mut Criterion) {
    for size in [64usize, 4096] {
        let payload = vec![0xA5; size];
        let repr = repr(&payload);
        let mut buf = vec![0; repr.buffer_len()];
        repr.emit(&CTX, &mut buf).unwrap();

        let mut g = c.benchmark_group(format!("wire/{size}B"));
        g.throughput(Throughput::Bytes(buf.len() as u64));
        g.bench_function("parse", |b| {
            b.iter(|| PacketRepr::parse(&Packet::new_unchecked(black_box(&buf[..]))).unwrap())
        });
        g.bench_function("emit+icrc", |b| {
            b.iter(|| {
                black_box(&repr)
                    .emit(&CTX, black_box(&mut buf[..]))
                    .unwrap()
            })
        });
        g.bench_function("icrc", |b| {
            b.iter(|| compute_icrc(&CTX, black_box(&buf[..])).unwrap())
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
