//! What one traced event costs with `SOFTVERBS_TRACE` on (span, JSON line, write): run with
//! `cargo run --release -p emu-trace --example json_layer_cost`. The disabled cost is measured
//! with `softverbs perf` (README, "Tracing and ladder diagrams").
#![allow(clippy::unwrap_used)]

fn main() {
    let path = std::env::temp_dir().join("emu-trace-json-layer-cost.jsonl");
    emu_trace::init(None, Some(&path)).unwrap();
    let n = 100_000u32;
    let started = std::time::Instant::now();
    for i in 0..u64::from(n) {
        let _span = tracing::debug_span!(
            "device",
            dev = "softverbs0",
            addr = "127.0.0.1:4791",
            now = i
        )
        .entered();
        tracing::debug!(
            kind = "pkt.tx",
            opcode = "RDMA_WRITE_ONLY",
            psn = i,
            dqp = 17u32,
            len = 60usize
        );
    }
    println!("{:?} per event ({})", started.elapsed() / n, path.display());
    let _ = std::fs::remove_file(&path);
}
