//! UD datagrams under the fault model (issue 15): the fabric judges every UD datagram like any
//! other. A dropped datagram is lost (the sender completes with success and never learns), a
//! duplicated one is delivered twice (UD has no duplicate detection), a corrupted one fails
//! the ICRC and is dropped. The workload check at the end accepts loss but never corruption,
//! duplication beyond what the plan injected, or delivery to the wrong QP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use emu_sim::fault::{FaultPlan, Link, NodeId, corrupt, drop, drop_nth, duplicate};
use emu_sim::{SimContext, SimProvider};
use verbs_api::{
    AccessFlags, AddressHandle, AhAttr, CompletionQueue, Context, GRH_LEN, MemoryRegion, QpAttr,
    QpAttrMask, QpCap, QpInitAttr, QpState, QueuePair, RecvWr, SendOp, SendWr, UdDest, WcFlags,
    WcStatus, WorkCompletion,
};

const QKEY: u32 = 0x0101_0101;
const SLOT: usize = 256;
const MSG: usize = 100;

type Ctx = SimContext;
type Qp = <Ctx as Context>::Qp;
type Cq = <Ctx as Context>::Cq;
type Mr = <Ctx as Context>::Mr;

/// A UD QP in RTS with one CQ and a 64 KiB MR.
struct Ud {
    qp: Qp,
    cq: Cq,
    mr: Mr,
    ctx: Ctx,
    pd: <Ctx as Context>::Pd,
}

fn ud(ctx: &Ctx) -> Ud {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let cap = QpCap {
        max_send_wr: 128,
        max_recv_wr: 128,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = ctx
        .create_qp(&pd, &cq, &cq, None, &QpInitAttr::ud(cap))
        .unwrap();
    let attr = |state| QpAttr {
        qp_state: state,
        qkey: QKEY,
        port_num: 1,
        ..QpAttr::default()
    };
    use QpAttrMask as M;
    qp.modify(
        &attr(QpState::Init),
        M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
    )
    .unwrap();
    qp.modify(&attr(QpState::Rtr), M::STATE).unwrap();
    qp.modify(&attr(QpState::Rts), M::STATE | M::SQ_PSN)
        .unwrap();
    let mr = ctx
        .alloc_mr(&pd, 64 * 1024, AccessFlags::LOCAL_WRITE)
        .unwrap();
    Ud {
        qp,
        cq,
        mr,
        ctx: ctx.clone(),
        pd,
    }
}

impl Ud {
    fn ah_to(&self, peer: &Ud) -> <Ctx as Context>::Ah {
        let ep = peer.qp.endpoint(0).unwrap();
        let attr = AhAttr {
            dgid: ep.gid,
            udp_dport: ep.udp_port,
            ..AhAttr::default()
        };
        self.ctx.create_ah(&self.pd, &attr).unwrap()
    }

    fn post_recvs(&self, n: usize) {
        for i in 0..n {
            let sge = [self.mr.sge(i * SLOT, SLOT).unwrap()];
            self.qp.post_recv(&[RecvWr::new(i as u64, &sge)]).unwrap();
        }
    }

    /// Sends datagram `seq` (payload `payload(seq)`, immediate `seq`) to `to` through `ah`.
    fn send(&self, ah: &<Ctx as Context>::Ah, to: &Ud, seq: u32) {
        self.mr.write(0, &payload(seq)).unwrap();
        let sge = [self.mr.sge(0, MSG).unwrap()];
        let dest = UdDest {
            ah: ah.handle(),
            remote_qpn: to.qp.qp_num(),
            remote_qkey: QKEY,
        };
        let wr = SendWr::new(u64::from(seq), SendOp::SendWithImm { imm: seq }, &sge).with_ud(dest);
        self.qp.post_send(&[wr]).unwrap();
    }

    /// Every completion now in the CQ (lets the fabric deliver what is in flight first).
    fn drain(&self) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let mut buf = [WorkCompletion::default(); 32];
        loop {
            let n = self.cq.poll(&mut buf).unwrap();
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }
}

fn payload(seq: u32) -> Vec<u8> {
    (0..MSG)
        .map(|i| {
            (i as u32)
                .wrapping_mul(13)
                .wrapping_add(seq.wrapping_mul(101)) as u8
        })
        .collect()
}

fn setup(plan: FaultPlan) -> (SimProvider, Ud, Ud) {
    let sim = SimProvider::builder().faults(plan).build().unwrap();
    let a = ud(&sim.context(0).unwrap());
    let b = ud(&sim.context(1).unwrap());
    (sim, a, b)
}

const A: NodeId = NodeId(0);
const B: NodeId = NodeId(1);

#[test]
fn a_dropped_datagram_is_lost_and_the_sender_never_learns() {
    let (sim, a, b) = setup(FaultPlan::new(1).rule(drop_nth(1)));
    let ah = a.ah_to(&b);
    b.post_recvs(2);
    a.send(&ah, &b, 1);
    a.send(&ah, &b, 2);
    sim.run_until_idle().unwrap();
    let sends = a.drain();
    assert_eq!(sends.len(), 2);
    assert!(sends.iter().all(|w| w.status == WcStatus::Success));
    let recvs = b.drain();
    assert_eq!(recvs.len(), 1, "{recvs:?}");
    assert_eq!((recvs[0].imm_data, recvs[0].wr_id), (2, 0));
    assert_eq!(sim.fault_counters().link(Link::new(A, B)).dropped, 1);
    // No ACK, no retransmission: a sent exactly two datagrams.
    assert_eq!(a.ctx.qp_stats(&a.qp).unwrap().sent_pkts, 2);
    assert_eq!(b.ctx.qp_stats(&b.qp).unwrap().sent_pkts, 0);
}

#[test]
fn a_duplicated_datagram_is_delivered_twice() {
    let (sim, a, b) = setup(FaultPlan::new(2).rule(duplicate(1).nth(1)));
    let ah = a.ah_to(&b);
    b.post_recvs(3);
    a.send(&ah, &b, 7);
    sim.run_until_idle().unwrap();
    let recvs = b.drain();
    assert_eq!(recvs.len(), 2, "{recvs:?}");
    for wc in &recvs {
        assert_eq!((wc.status, wc.imm_data), (WcStatus::Success, 7));
        let mut got = vec![0; MSG];
        b.mr.read(wc.wr_id as usize * SLOT + GRH_LEN, &mut got)
            .unwrap();
        assert_eq!(got, payload(7));
    }
    assert_eq!(sim.fault_counters().link(Link::new(A, B)).duplicated, 1);
}

#[test]
fn a_corrupted_datagram_fails_the_icrc_and_is_dropped() {
    let (sim, a, b) = setup(FaultPlan::new(3).rule(corrupt(1.0).nth(1)));
    let ah = a.ah_to(&b);
    b.post_recvs(2);
    a.send(&ah, &b, 1);
    a.send(&ah, &b, 2);
    sim.run_until_idle().unwrap();
    let recvs = b.drain();
    assert_eq!(recvs.len(), 1, "{recvs:?}");
    assert_eq!(recvs[0].imm_data, 2);
    assert_eq!(b.ctx.device_stats().unwrap().icrc_errors, 1);
    assert_eq!(sim.fault_counters().link(Link::new(A, B)).corrupted, 1);
}

/// The UD workload: a sends numbered datagrams alternately to two QPs of b under random loss,
/// duplication and corruption. Every delivery must be intact (payload and immediate agree),
/// reach the QP it was addressed to, carry a's QPN, and no datagram may arrive more often than
/// once plus the copies the plan injected.
#[test]
fn ud_workload_accepts_loss_but_never_corruption_duplication_or_misdelivery() {
    for seed in 0..40u64 {
        let plan = FaultPlan::new(seed)
            .rule(drop(0.2))
            .rule(duplicate(1).probability(0.2))
            .rule(corrupt(0.1));
        let (sim, a, b1) = setup(plan);
        let b2 = ud(&b1.ctx);
        let (ah1, ah2) = (a.ah_to(&b1), a.ah_to(&b2));
        const N: u32 = 60;
        b1.post_recvs(100);
        b2.post_recvs(100);
        for seq in 0..N {
            if seq % 2 == 0 {
                a.send(&ah1, &b1, seq);
            } else {
                a.send(&ah2, &b2, seq);
            }
            sim.run_until_idle().unwrap();
        }
        assert_eq!(
            a.drain().len(),
            N as usize,
            "seed {seed}: every send completes"
        );
        let mut seen: HashMap<u32, u64> = HashMap::new();
        for (parity, b) in [(0, &b1), (1, &b2)] {
            for wc in b.drain() {
                assert_eq!(wc.status, WcStatus::Success, "seed {seed}: {wc:?}");
                assert_eq!(wc.qp_num, b.qp.qp_num());
                assert_eq!(wc.src_qp, a.qp.qp_num(), "seed {seed}");
                assert!(wc.wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
                let seq = wc.imm_data;
                assert!(
                    seq < N && seq % 2 == parity,
                    "seed {seed}: {seq} at the wrong QP"
                );
                let mut got = vec![0; MSG];
                b.mr.read(wc.wr_id as usize * SLOT + GRH_LEN, &mut got)
                    .unwrap();
                assert_eq!(got, payload(seq), "seed {seed}: datagram {seq} corrupted");
                *seen.entry(seq).or_default() += 1;
            }
        }
        let c = sim.fault_counters().link(Link::new(A, B));
        let extra: u64 = seen.values().map(|n| n - 1).sum();
        assert!(
            extra <= c.duplicated,
            "seed {seed}: {extra} extra deliveries, {} injected",
            c.duplicated
        );
        let delivered: u64 = seen.values().sum();
        assert!(delivered <= u64::from(N) + c.duplicated);
        assert!(
            delivered > 0 && c.dropped + c.corrupted > 0,
            "seed {seed}: {c:?}"
        );
    }
}
