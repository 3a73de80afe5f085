//! 10,000 8-byte RDMA WRITEs (each waited for) on a connected pair. Only correctness is
//! asserted; the elapsed time is printed (`--nocapture`) — timing belongs to the `inproc`
//! bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use emu_sim::SimProvider;
use verbs_api::{
    CompletionQueue, MemoryRegion, QueuePair, SendOp, SendWr, WcStatus, WorkCompletion,
};

#[test]
fn ten_thousand_8_byte_writes() {
    let p = SimProvider::pair().unwrap();
    let start = Instant::now();
    let mut wc = [WorkCompletion::default(); 1];
    for i in 0..10_000u64 {
        let off = (i as usize % 4096) * 8;
        p.mr_a.write(off, &i.to_le_bytes()).unwrap();
        let sge = [p.mr_a.sge(off, 8).unwrap()];
        let op = SendOp::RdmaWrite {
            remote_addr: p.mr_b.addr() + off as u64,
            rkey: p.mr_b.rkey(),
        };
        p.qp_a.post_send(&[SendWr::new(i, op, &sge)]).unwrap();
        while p.cq_a.poll(&mut wc).unwrap() == 0 {}
        assert_eq!((wc[0].wr_id, wc[0].status), (i, WcStatus::Success));
    }
    let elapsed = start.elapsed();
    eprintln!("10,000 8-byte WRITEs + completions in {elapsed:?}");
    for i in 5_904..10_000u64 {
        let off = (i as usize % 4096) * 8;
        let mut got = [0u8; 8];
        p.mr_b.read(off, &mut got).unwrap();
        assert_eq!(u64::from_le_bytes(got), i);
    }
    let stats = p.qp_a.stats().unwrap();
    assert_eq!(stats.sent_pkts, 10_000);
    assert_eq!(stats.retransmits_timeout + stats.retransmits_nak, 0);
}
