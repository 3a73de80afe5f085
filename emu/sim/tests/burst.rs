//! Posts of a burst on the in-process fabric (issue 18): a `post_send` that directly follows
//! another on its device leaves its packets to the next call that runs the fabric, as a
//! doorbell batch does on a NIC. The burst crosses the fabric together and the responder ACKs
//! it as one; whatever observes the fabric or the peer's memory sees every post made so far.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use emu_sim::{SimPair, SimProvider};
use verbs_api::{
    CompletionQueue, MemoryRegion, QueuePair, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion,
};

/// Posts signaled 8-byte WRITEs `ids` from a's MR to the same offsets of b's, one WR per call,
/// byte `i` of WRITE `i` being `i + 1`.
fn post_writes(p: &SimPair, ids: std::ops::Range<u64>) {
    for i in ids {
        let at = 8 * i as usize;
        p.mr_a.write(at, &[i as u8 + 1; 8]).unwrap();
        let op = SendOp::RdmaWrite {
            remote_addr: p.mr_b.addr() + at as u64,
            rkey: p.mr_b.rkey(),
        };
        let sge = [p.mr_a.sge(at, 8).unwrap()];
        let wr = SendWr::new(i, op, &sge).with_flags(SendFlags::SIGNALED);
        p.qp_a.post_send(&[wr]).unwrap();
    }
}

/// The next `n` completions of a's CQ, checked successful and in order from `first`.
fn expect_completions(p: &SimPair, first: u64, n: u64) {
    let mut wc = [WorkCompletion::default()];
    for i in first..first + n {
        assert_eq!(p.cq_a.poll(&mut wc).unwrap(), 1, "completion {i}");
        assert_eq!((wc[0].wr_id, wc[0].status), (i, WcStatus::Success));
    }
}

#[test]
fn a_burst_crosses_the_fabric_together_and_is_acked_once() {
    let p = SimProvider::pair().unwrap();
    const N: u64 = 32;
    post_writes(&p, 0..N);
    expect_completions(&p, 0, N);
    let b = p.b.qp_stats(&p.qp_b).unwrap();
    assert_eq!(b.rcvd_pkts, N);
    // The first post ran the fabric itself and its WRITE was ACKed alone; the other 31
    // crossed together at the poll, and one ACK covers them (one per WRITE before bursts).
    assert_eq!(b.sent_pkts, 2, "{b:?}");
    let mut got = [0u8; 8 * N as usize];
    p.mr_b.read(0, &mut got).unwrap();
    assert!(
        got.chunks(8)
            .enumerate()
            .all(|(i, c)| c == [i as u8 + 1; 8])
    );
}

#[test]
fn reading_the_peers_memory_moves_the_burst() {
    let p = SimProvider::pair().unwrap();
    post_writes(&p, 0..4);
    // The application spins on the last byte the burst writes (as `ib_write_lat` does): the
    // read runs the fabric for the posts that left their packets.
    let mut last = [0u8];
    p.mr_b.read(31, &mut last).unwrap();
    assert_eq!(last, [4]);
    expect_completions(&p, 0, 4);
}

#[test]
fn counters_and_fault_control_see_every_post_of_a_burst() {
    let p = SimProvider::pair().unwrap();
    post_writes(&p, 0..5);
    // No verbs call since the posts: the look at the counters moves the burst first.
    assert_eq!(p.b.qp_stats(&p.qp_b).unwrap().rcvd_pkts, 5);
    post_writes(&p, 5..8);
    // A partition made after the posts does not catch them.
    p.sim
        .partition(emu_sim::fault::NodeId(0), emu_sim::fault::NodeId(1));
    assert_eq!(p.sim.fault_counters().total().partitioned, 0);
    p.sim
        .repair(emu_sim::fault::NodeId(0), emu_sim::fault::NodeId(1));
    expect_completions(&p, 0, 8);
}
