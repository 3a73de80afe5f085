//! UC messages under the fault model (issue 23): the fabric judges UC packets like any other.
//! The requester completes every message successfully whatever happens to its packets (no ACK,
//! no retransmission); the responder delivers only whole messages, each at most once: a lost,
//! duplicated or reordered packet costs at most its own message, never a corrupt or repeated
//! delivery.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use emu_sim::fault::{FaultPlan, Link, NodeId, delay, drop, drop_nth, duplicate};
use emu_sim::{SimContext, SimProvider};
use verbs_api::{
    AccessFlags, AhAttr, CompletionQueue, Context, MemoryRegion, Mtu, QpAttr, QpAttrMask, QpCap,
    QpInitAttr, QpState, QpType, QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
    WorkCompletion,
};

/// Receive slot size: every message fits.
const SLOT: usize = 1024;

type Ctx = SimContext;
type Qp = <Ctx as Context>::Qp;
type Cq = <Ctx as Context>::Cq;
type Mr = <Ctx as Context>::Mr;

/// A UC QP (in RESET until [`connect`]) with one CQ and a 256 KiB MR.
struct Uc {
    qp: Qp,
    cq: Cq,
    mr: Mr,
    ctx: Ctx,
}

fn uc(ctx: &Ctx) -> Uc {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let cap = QpCap {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let init = QpInitAttr {
        qp_type: QpType::Uc,
        cap,
        sq_sig_all: true,
    };
    let qp = ctx.create_qp(&pd, &cq, &cq, None, &init).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = ctx.alloc_mr(&pd, 256 * 1024, access).unwrap();
    Uc {
        qp,
        cq,
        mr,
        ctx: ctx.clone(),
    }
}

/// RESET → RTS with UC's masks towards `peer`, path MTU 256.
fn connect(a: &Uc, peer: &Uc) {
    use QpAttrMask as M;
    let ep = peer.qp.endpoint(0x00FF_FFF0).unwrap();
    let attr = |qp_state| QpAttr {
        qp_state,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE,
        path_mtu: Mtu::Mtu256,
        dest_qp_num: ep.qpn,
        rq_psn: ep.psn,
        sq_psn: 0x00FF_FFF0,
        ah_attr: AhAttr {
            dgid: ep.gid,
            udp_dport: ep.udp_port,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    let steps = [
        (QpState::Init, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        (QpState::Rtr, M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN),
        (QpState::Rts, M::SQ_PSN),
    ];
    for (state, mask) in steps {
        a.qp.modify(&attr(state), mask | M::STATE).unwrap();
    }
}

/// Length of message `seq`: one to three 256-byte packets.
fn len_of(seq: u32) -> usize {
    100 + (seq as usize % 3) * 256
}

fn payload(seq: u32) -> Vec<u8> {
    (0..len_of(seq))
        .map(|i| {
            (i as u32)
                .wrapping_mul(13)
                .wrapping_add(seq.wrapping_mul(101)) as u8
        })
        .collect()
}

impl Uc {
    fn post_recvs(&self, n: usize) {
        for i in 0..n {
            let sge = [self.mr.sge(i * SLOT, SLOT).unwrap()];
            self.qp.post_recv(&[RecvWr::new(i as u64, &sge)]).unwrap();
        }
    }

    /// Sends message `seq` as SEND_WITH_IMM (immediate `seq`) from a slot of its own in the
    /// upper half of the MR: a send buffer must not change until its WR completes (posts of a
    /// burst leave together, at the next call that runs the fabric).
    fn send(&self, seq: u32) {
        let data = payload(seq);
        let at = (128 + seq as usize % 128) * SLOT;
        self.mr.write(at, &data).unwrap();
        let sge = [self.mr.sge(at, data.len()).unwrap()];
        let wr = SendWr::new(u64::from(seq), SendOp::SendWithImm { imm: seq }, &sge);
        self.qp.post_send(&[wr]).unwrap();
    }

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

    /// Checks one receive completion against the message its immediate names.
    fn check_delivery(&self, wc: &WorkCompletion) -> u32 {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        assert_eq!(wc.opcode, WcOpcode::Recv);
        let seq = wc.imm_data;
        assert_eq!(wc.byte_len as usize, len_of(seq), "message {seq} whole");
        let mut got = vec![0; len_of(seq)];
        self.mr.read(wc.wr_id as usize * SLOT, &mut got).unwrap();
        assert_eq!(got, payload(seq), "message {seq} intact");
        seq
    }
}

const A: NodeId = NodeId(0);
const B: NodeId = NodeId(1);

fn setup(plan: FaultPlan) -> (SimProvider, Uc, Uc) {
    let sim = SimProvider::builder().faults(plan).build().unwrap();
    let a = uc(&sim.context(0).unwrap());
    let b = uc(&sim.context(1).unwrap());
    connect(&a, &b);
    connect(&b, &a);
    (sim, a, b)
}

#[test]
fn a_lost_middle_packet_costs_its_message_only() {
    // Message 2 (three packets) loses its second packet, the fabric's second datagram.
    let (sim, a, b) = setup(FaultPlan::new(1).rule(drop_nth(2)));
    b.post_recvs(2);
    a.send(2);
    a.send(4);
    sim.run_until_idle().unwrap();
    let sends = a.drain();
    assert_eq!(sends.len(), 2);
    assert!(sends.iter().all(|w| w.status == WcStatus::Success));
    let recvs = b.drain();
    assert_eq!(recvs.len(), 1, "{recvs:?}");
    assert_eq!(b.check_delivery(&recvs[0]), 4);
    assert_eq!(
        recvs[0].wr_id, 0,
        "the dropped message gave its receive back"
    );
    assert_eq!(sim.fault_counters().link(Link::new(A, B)).dropped, 1);
    // No retransmission, nothing sent back.
    assert_eq!(a.ctx.qp_stats(&a.qp).unwrap().sent_pkts, 3 + 2);
    assert_eq!(b.ctx.qp_stats(&b.qp).unwrap().sent_pkts, 0);
}

#[test]
fn duplicated_packets_deliver_each_message_once() {
    let (sim, a, b) = setup(FaultPlan::new(2).rule(duplicate(1)));
    b.post_recvs(8);
    for seq in 0..6 {
        a.send(seq);
    }
    sim.run_until_idle().unwrap();
    assert_eq!(a.drain().len(), 6);
    let seqs: Vec<u32> = b.drain().iter().map(|w| b.check_delivery(w)).collect();
    assert_eq!(seqs, (0..6).collect::<Vec<_>>());
    assert!(sim.fault_counters().link(Link::new(A, B)).duplicated >= 12);
}

/// The UC workload: numbered messages of one to three packets under random loss, duplication
/// and delay (which reorders). Every send completes successfully; every delivery is whole and
/// intact, at most once per message, in sending order; without loss or delay of any of its
/// packets most messages arrive.
#[test]
fn uc_workload_delivers_whole_messages_at_most_once() {
    for seed in 0..40u64 {
        let plan = FaultPlan::new(seed)
            .rule(drop(0.1))
            .rule(duplicate(1).probability(0.2))
            .rule(delay(Duration::from_micros(1)..=Duration::from_micros(40)).probability(0.2));
        let (sim, a, b) = setup(plan);
        const N: u32 = 60;
        b.post_recvs(200);
        for seq in 0..N {
            a.send(seq);
            if seq % 4 == 3 {
                sim.run_until_idle().unwrap();
            }
        }
        sim.run_until_idle().unwrap();
        let sends = a.drain();
        assert_eq!(sends.len(), N as usize, "seed {seed}: every send completes");
        assert!(sends.iter().all(|w| w.status == WcStatus::Success));
        let mut seen: HashMap<u32, u32> = HashMap::new();
        let mut last = None;
        for wc in b.drain() {
            let seq = b.check_delivery(&wc);
            assert!(seq < N, "seed {seed}");
            *seen.entry(seq).or_default() += 1;
            assert!(
                last.is_none_or(|l| seq > l),
                "seed {seed}: {seq} after {last:?}"
            );
            last = Some(seq);
        }
        assert!(seen.values().all(|&n| n == 1), "seed {seed}: {seen:?}");
        assert!(!seen.is_empty(), "seed {seed}: nothing delivered");
        assert_eq!(b.ctx.qp_stats(&b.qp).unwrap().sent_pkts, 0, "seed {seed}");
        assert_eq!(b.qp.query().unwrap().qp_state, QpState::Rts);
    }
}
