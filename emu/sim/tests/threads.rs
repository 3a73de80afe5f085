//! Several application threads on one fabric: four threads, each posting and polling on its
//! own RC pair (all pairs between the same two devices), in virtual time without a background
//! thread. The fabric mutex serialises the calls; each thread's pumping also moves the other
//! threads' traffic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::Barrier;

use emu_sim::fault::{FaultPlan, drop};
use emu_sim::{PairOptions, SimProvider, connect_pair};
use verbs_api::{
    CompletionQueue, MemoryRegion, QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
    WorkCompletion,
};

const THREADS: usize = 4;
const OPS: u64 = 300;

fn run(sim: &SimProvider) {
    let a = sim.context(0).unwrap();
    let b = sim.context(1).unwrap();
    let pairs: Vec<_> = (0..THREADS)
        .map(|_| connect_pair(&a, &b, PairOptions::default()).unwrap())
        .collect();
    let barrier = Arc::new(Barrier::new(THREADS));
    std::thread::scope(|s| {
        for (t, p) in pairs.iter().enumerate() {
            let barrier = barrier.clone();
            s.spawn(move || {
                barrier.wait();
                let tag = t as u8;
                let mut wc = [WorkCompletion::default(); 4];
                for i in 0..OPS {
                    // WRITE 8 bytes, then SEND 8 bytes into a receive, alternating.
                    let off = (i as usize % 512) * 8;
                    let value = (i << 8 | u64::from(tag)).to_ne_bytes();
                    p.mr_a.write(off, &value).unwrap();
                    let sge = [p.mr_a.sge(off, 8).unwrap()];
                    if i % 2 == 0 {
                        let op = SendOp::RdmaWrite {
                            remote_addr: p.mr_b.addr() + off as u64,
                            rkey: p.mr_b.rkey(),
                        };
                        p.qp_a.post_send(&[SendWr::new(i, op, &sge)]).unwrap();
                    } else {
                        let rsge = [p.mr_b.sge(32768 + off, 8).unwrap()];
                        p.qp_b.post_recv(&[RecvWr::new(i, &rsge)]).unwrap();
                        p.qp_a
                            .post_send(&[SendWr::new(i, SendOp::Send, &sge)])
                            .unwrap();
                        let got = p.cq_b.next_completion().unwrap();
                        assert_eq!((got.wr_id, got.status), (i, WcStatus::Success));
                        assert_eq!(got.opcode, WcOpcode::Recv);
                    }
                    let done = p.cq_a.next_completion().unwrap();
                    assert_eq!(
                        (done.wr_id, done.status),
                        (i, WcStatus::Success),
                        "thread {t}"
                    );
                    let mut got = [0u8; 8];
                    let at = if i % 2 == 0 { off } else { 32768 + off };
                    p.mr_b.read(at, &mut got).unwrap();
                    assert_eq!(got, value, "thread {t} op {i}");
                    assert_eq!(p.cq_a.poll(&mut wc).unwrap(), 0);
                }
            });
        }
    });
    for p in &pairs {
        assert_eq!(p.cq_a.poll(&mut [WorkCompletion::default(); 1]).unwrap(), 0);
        assert_eq!(p.cq_b.poll(&mut [WorkCompletion::default(); 1]).unwrap(), 0);
    }
}

#[test]
fn four_threads_post_and_poll_on_four_pairs() {
    run(&SimProvider::builder().build().unwrap());
}

#[test]
fn four_threads_under_loss() {
    // Retransmission timers fire in whichever thread waits; every thread still completes.
    let seed = emu_sim::seed_from_env(11);
    let plan = FaultPlan::new(seed).rule(drop(0.02));
    let sim = SimProvider::builder()
        .seed(seed)
        .faults(plan)
        .build()
        .unwrap();
    run(&sim);
    assert!(sim.fault_counters().total().dropped > 0);
}

#[test]
fn four_threads_in_real_time() {
    let sim = SimProvider::builder().real_time().build().unwrap();
    run(&sim);
}
