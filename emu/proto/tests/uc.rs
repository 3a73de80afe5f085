//! Packet-level tests of the UC transport through the public `Hca` API (issue 23): UC's masks,
//! what a post accepts, the packets on the wire (UC opcodes, no AckReq, nothing sent back),
//! and the responder's whole-message rule under loss of a middle packet, of FIRST, of LAST,
//! duplication and reordering, each drop counted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{Ipv4Addr, SocketAddr};

use common::VecMemory;
use emu_proto::wire::{Bth, IpContext, check_icrc};
use emu_proto::{
    CqId, Hca, HcaConfig, Instant, MAX_PACKET_LEN, Memory, MrInfo, RxDropCause, SrqId,
};
use verbs_api::{
    AccessFlags, AhAttr, ErrorKind, Gid, Mtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState,
    QpType, RecvWr, SendOp, SendWr, Sge, SrqAttr, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

const A_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const MR_LEN: u64 = 16 * 1024;

type Packets = Vec<(u16, Vec<u8>)>;

/// One HCA with a PD, a CQ, a UC QP and an MR; connected with [`connect`].
struct Node {
    hca: Hca,
    mem: VecMemory,
    srq: Option<SrqId>,
    cq: CqId,
    qpn: u32,
    mr: MrInfo,
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

fn uc_init() -> QpInitAttr {
    QpInitAttr {
        qp_type: QpType::Uc,
        cap: cap(),
        sq_sig_all: false,
    }
}

impl Node {
    fn new(ip: Ipv4Addr, access: AccessFlags) -> Node {
        Node::build(ip, access, false)
    }

    /// A node whose QP receives through an SRQ (`srq` true).
    fn build(ip: Ipv4Addr, access: AccessFlags, srq: bool) -> Node {
        let mut hca = Hca::new(HcaConfig::new("uc", Gid::from_ip(ip.into()), 7));
        let pd = hca.alloc_pd().unwrap();
        let cq = hca.create_cq(64, None).unwrap();
        let srq = srq.then(|| {
            let attr = SrqAttr {
                max_wr: 16,
                max_sge: 2,
                srq_limit: 0,
            };
            hca.create_srq(pd, &attr).unwrap()
        });
        let qpn = hca.create_qp(pd, cq, cq, srq, &uc_init()).unwrap();
        let mr = hca
            .reg_mr(
                pd,
                0x1000_0000,
                MR_LEN,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        let mem = VecMemory::default();
        mem.insert(mr.lkey, MR_LEN as usize);
        let mut n = Node {
            hca,
            mem,
            srq,
            cq,
            qpn,
            mr,
        };
        n.modify(QpState::Init, access, init_mask()).unwrap();
        n
    }

    fn modify(
        &mut self,
        state: QpState,
        access: AccessFlags,
        mask: QpAttrMask,
    ) -> verbs_api::Result<()> {
        let attr = QpAttr {
            qp_state: state,
            qp_access_flags: access,
            port_num: 1,
            ..QpAttr::default()
        };
        self.hca
            .modify_qp(Instant::ZERO, self.qpn, &attr, mask | QpAttrMask::STATE)
    }

    fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.mr.iova + off,
            length: len,
            lkey: self.mr.lkey,
        }
    }

    fn post(&mut self, wr_id: u64, op: SendOp, off: u64, len: u32) -> verbs_api::Result<()> {
        let sge = [self.sge(off, len)];
        let wr = SendWr::new(wr_id, op, &sge);
        self.hca
            .post_send(Instant::ZERO, self.qpn, &[wr])
            .map_err(|e| e.error)
    }

    fn recv(&mut self, wr_id: u64, off: u64, len: u32) {
        let sge = [self.sge(off, len)];
        let wr = [RecvWr::new(wr_id, &sge)];
        match self.srq {
            Some(srq) => self.hca.post_srq_recv(srq, &wr).unwrap(),
            None => self.hca.post_recv(self.qpn, &wr).unwrap(),
        }
    }

    fn transmit(&mut self) -> Packets {
        let mut out = Vec::new();
        let mut buf = vec![0u8; MAX_PACKET_LEN];
        while let Some(t) = self.hca.poll_transmit(Instant::ZERO, &self.mem, &mut buf) {
            out.push((t.src_port, buf[..t.len].to_vec()));
        }
        out
    }

    fn deliver(&mut self, from: Ipv4Addr, (sport, bytes): &(u16, Vec<u8>)) {
        let src = SocketAddr::new(from.into(), *sport);
        self.hca
            .handle_datagram(Instant::ZERO, src, bytes, &self.mem);
    }

    fn wcs(&mut self) -> Vec<WorkCompletion> {
        let mut out = [WorkCompletion::default(); 16];
        let n = self.hca.poll_cq(self.cq, &mut out).unwrap();
        out[..n].to_vec()
    }

    fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read(self.mr.lkey, off, &mut v).unwrap();
        v
    }

    fn drops(&self, cause: RxDropCause) -> u64 {
        self.hca.qp_stats(self.qpn).unwrap().rx_drops.get(cause)
    }

    fn state(&self) -> QpState {
        self.hca.query_qp(self.qpn).unwrap().qp_state
    }
}

fn init_mask() -> QpAttrMask {
    QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS
}

fn rtr_mask() -> QpAttrMask {
    QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN
}

/// INIT → RTR → RTS with UC's masks, `a` addressing `b`.
fn connect(a: &mut Node, b_ip: Ipv4Addr, b_qpn: u32) {
    let av = AhAttr {
        dgid: Gid::from_ip(b_ip.into()),
        ..AhAttr::default()
    };
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: av,
        path_mtu: Mtu::Mtu256,
        dest_qp_num: b_qpn,
        rq_psn: 0x100,
        ..QpAttr::default()
    };
    let now = Instant::ZERO;
    a.hca
        .modify_qp(now, a.qpn, &rtr, rtr_mask() | QpAttrMask::STATE)
        .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0x100,
        ..QpAttr::default()
    };
    a.hca
        .modify_qp(now, a.qpn, &rts, QpAttrMask::SQ_PSN | QpAttrMask::STATE)
        .unwrap();
}

fn pair_with(access_b: AccessFlags) -> (Node, Node) {
    let mut a = Node::new(A_IP, AccessFlags::REMOTE_WRITE);
    let mut b = Node::new(B_IP, access_b);
    let (aq, bq) = (a.qpn, b.qpn);
    connect(&mut a, B_IP, bq);
    connect(&mut b, A_IP, aq);
    (a, b)
}

fn pair() -> (Node, Node) {
    pair_with(AccessFlags::REMOTE_WRITE)
}

fn pattern(len: u32, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

/// Posts a signaled `op` of `len` bytes of pattern `seed` on `a` and returns its packets.
fn post_msg(a: &mut Node, wr_id: u64, op: SendOp, len: u32, seed: u8) -> Packets {
    a.mem.write(a.mr.lkey, 0, &pattern(len, seed)).unwrap();
    a.post(wr_id, op, 0, len).unwrap();
    a.transmit()
}

fn recv_wcs(b: &mut Node) -> Vec<(u64, WcStatus, WcOpcode, u32)> {
    b.wcs()
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect()
}

fn opcodes(pkts: &Packets) -> Vec<u8> {
    pkts.iter()
        .map(|(_, b)| u8::from(Bth::new_checked(&b[..]).unwrap().opcode()))
        .collect()
}

#[test]
fn uc_masks_are_the_kernels() {
    let mut a = Node::new(A_IP, AccessFlags::REMOTE_WRITE);
    // RC's INIT -> RTR attributes that serve READ/atomics and RNR are not UC's.
    let rc_extra = QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
    let e = a
        .modify(QpState::Rtr, AccessFlags::empty(), rtr_mask() | rc_extra)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert_eq!(a.state(), QpState::Init);
    let e = a
        .modify(QpState::Rtr, AccessFlags::empty(), QpAttrMask::AV)
        .unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::InvalidArgument,
        "RTR needs path_mtu, dest_qp, rq_psn"
    );
    connect(&mut a, B_IP, 0x20);
    assert_eq!(a.state(), QpState::Rts);
    let q = a.hca.query_qp(a.qpn).unwrap();
    assert_eq!(
        (q.path_mtu, q.sq_psn, q.rq_psn),
        (Mtu::Mtu256, 0x100, 0x100)
    );
    // RTS -> RTS may not touch RC's retry attributes.
    let e = a
        .modify(QpState::Rts, AccessFlags::empty(), QpAttrMask::TIMEOUT)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
}

#[test]
fn read_and_atomics_are_refused_at_post() {
    let (mut a, _b) = pair();
    for op in [
        SendOp::RdmaRead {
            remote_addr: 0x1000_0000,
            rkey: 1,
        },
        SendOp::AtomicFetchAndAdd {
            remote_addr: 0x1000_0000,
            rkey: 1,
            add: 1,
        },
    ] {
        let len = if matches!(op, SendOp::RdmaRead { .. }) {
            16
        } else {
            8
        };
        let e = a.post(1, op, 0, len).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{op:?}");
    }
    assert!(a.transmit().is_empty());
}

#[test]
fn send_is_segmented_with_uc_opcodes_and_completes_without_ack() {
    let (mut a, mut b) = pair();
    b.recv(9, 0, 4096);
    let pkts = post_msg(&mut a, 1, SendOp::SendWithImm { imm: 0xABCD }, 600, 1);
    assert_eq!(opcodes(&pkts), vec![0x20, 0x21, 0x23]);
    for (i, (sport, bytes)) in pkts.iter().enumerate() {
        let bth = Bth::new_checked(&bytes[..]).unwrap();
        assert!(!bth.ack_req(), "UC never asks for an ACK");
        assert_eq!(bth.psn().value(), 0x100 + i as u32);
        assert_eq!(bth.dest_qp(), b.qpn);
        assert_eq!(
            check_icrc(&IpContext::v4(A_IP, B_IP, *sport), bytes),
            Ok(())
        );
    }
    // The requester completed once the last packet was out.
    let swc = a.wcs();
    assert_eq!(
        swc.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success, WcOpcode::Send, 600)]
    );
    for p in &pkts {
        b.deliver(A_IP, p);
    }
    let wc = b.wcs();
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len, wc[0].imm_data),
        (9, WcStatus::Success, 600, 0xABCD)
    );
    assert_eq!(wc[0].wc_flags, WcFlags::WITH_IMM);
    assert_eq!(wc[0].src_qp, a.qpn);
    assert_eq!(b.read(0, 600), pattern(600, 1));
    assert!(b.transmit().is_empty(), "a UC responder sends nothing back");
}

#[test]
fn write_with_imm_lands_and_consumes_one_receive() {
    let (mut a, mut b) = pair();
    b.recv(5, 8000, 16);
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: b.mr.iova + 1024,
        rkey: b.mr.rkey,
        imm: 7,
    };
    let pkts = post_msg(&mut a, 2, op, 700, 3);
    assert_eq!(opcodes(&pkts), vec![0x26, 0x27, 0x29]);
    for p in &pkts {
        b.deliver(A_IP, p);
    }
    assert_eq!(
        recv_wcs(&mut b),
        vec![(5, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 700)]
    );
    assert_eq!(b.read(1024, 700), pattern(700, 3));
    // A plain WRITE needs no receive WQE.
    let op = SendOp::RdmaWrite {
        remote_addr: b.mr.iova + 4096,
        rkey: b.mr.rkey,
    };
    let pkts = post_msg(&mut a, 3, op, 256, 4);
    assert_eq!(opcodes(&pkts), vec![0x2A]);
    b.deliver(A_IP, &pkts[0]);
    assert!(b.wcs().is_empty());
    assert_eq!(b.read(4096, 256), pattern(256, 4));
}

/// Sends a 3-packet SEND, delivers the packets at `deliver` (indices), then a 1-packet SEND
/// delivered whole; returns b's receive completions.
fn lose_then_resync(deliver: &[usize]) -> (Node, Vec<(u64, WcStatus, WcOpcode, u32)>) {
    let (mut a, mut b) = pair();
    b.recv(1, 0, 1024);
    b.recv(2, 1024, 1024);
    let first = post_msg(&mut a, 1, SendOp::Send, 700, 1);
    assert_eq!(first.len(), 3);
    for &i in deliver {
        b.deliver(A_IP, &first[i]);
    }
    let second = post_msg(&mut a, 2, SendOp::Send, 100, 2);
    b.deliver(A_IP, &second[0]);
    // The requester completed both, whatever happened on the wire.
    assert_eq!(a.wcs().len(), 2);
    assert!(a.wcs().iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(b.state(), QpState::Rts);
    let wcs = recv_wcs(&mut b);
    (b, wcs)
}

#[test]
fn lost_middle_packet_drops_the_message_and_keeps_the_receive() {
    let (b, wcs) = lose_then_resync(&[0, 2]);
    // The first message is gone; the second went into the same (first) receive WQE.
    assert_eq!(wcs, vec![(1, WcStatus::Success, WcOpcode::Recv, 100)]);
    assert_eq!(b.read(0, 100), pattern(100, 2));
    assert_eq!(b.drops(RxDropCause::IncompleteMessage), 1);
}

#[test]
fn lost_first_packet_drops_the_rest_of_the_message() {
    let (b, wcs) = lose_then_resync(&[1, 2]);
    assert_eq!(wcs, vec![(1, WcStatus::Success, WcOpcode::Recv, 100)]);
    assert_eq!(b.drops(RxDropCause::IncompleteMessage), 2);
}

#[test]
fn lost_last_packet_is_noticed_at_the_next_first() {
    let (b, wcs) = lose_then_resync(&[0, 1]);
    assert_eq!(wcs, vec![(1, WcStatus::Success, WcOpcode::Recv, 100)]);
    assert_eq!(b.read(0, 100), pattern(100, 2));
    assert_eq!(b.drops(RxDropCause::IncompleteMessage), 1);
}

#[test]
fn reordered_packets_drop_the_message() {
    let (b, wcs) = lose_then_resync(&[0, 2, 1]);
    assert_eq!(wcs, vec![(1, WcStatus::Success, WcOpcode::Recv, 100)]);
    assert!(b.drops(RxDropCause::IncompleteMessage) >= 1);
}

#[test]
fn duplicated_packets_deliver_each_message_once() {
    let (mut a, mut b) = pair();
    for i in 0..3 {
        b.recv(10 + i, 1024 * i, 1024);
    }
    let one = post_msg(&mut a, 1, SendOp::Send, 700, 1);
    let two = post_msg(&mut a, 2, SendOp::Send, 50, 2);
    for p in one.iter().chain(&two) {
        b.deliver(A_IP, p);
        b.deliver(A_IP, p);
    }
    // Late copies of everything again.
    for p in one.iter().chain(&two) {
        b.deliver(A_IP, p);
    }
    assert_eq!(
        recv_wcs(&mut b),
        vec![
            (10, WcStatus::Success, WcOpcode::Recv, 700),
            (11, WcStatus::Success, WcOpcode::Recv, 50)
        ]
    );
    assert_eq!(b.read(0, 700), pattern(700, 1));
    assert_eq!(b.drops(RxDropCause::DuplicateRequest), 4 + 4);
}

#[test]
fn send_without_receive_is_dropped_silently() {
    let (mut a, mut b) = pair();
    let pkts = post_msg(&mut a, 1, SendOp::Send, 700, 1);
    for p in &pkts {
        b.deliver(A_IP, p);
    }
    assert_eq!(a.wcs()[0].status, WcStatus::Success);
    assert!(b.wcs().is_empty());
    assert!(b.transmit().is_empty(), "no RNR NAK on UC");
    assert_eq!(b.drops(RxDropCause::NoRecvWqe), 1);
    assert_eq!(b.drops(RxDropCause::IncompleteMessage), 2);
    assert_eq!(b.state(), QpState::Rts);
    // The next message, with a receive posted, arrives.
    b.recv(4, 0, 64);
    let pkts = post_msg(&mut a, 2, SendOp::Send, 20, 2);
    b.deliver(A_IP, &pkts[0]);
    assert_eq!(
        recv_wcs(&mut b),
        vec![(4, WcStatus::Success, WcOpcode::Recv, 20)]
    );
}

#[test]
fn refused_writes_are_dropped_without_error() {
    // No REMOTE_WRITE on the responder's QP.
    let (mut a, mut b) = pair_with(AccessFlags::empty());
    let op = SendOp::RdmaWrite {
        remote_addr: b.mr.iova,
        rkey: b.mr.rkey,
    };
    let pkts = post_msg(&mut a, 1, op, 64, 1);
    b.deliver(A_IP, &pkts[0]);
    assert_eq!(b.read(0, 64), vec![0; 64]);
    assert_eq!(b.drops(RxDropCause::UcRejected), 1);
    assert_eq!(b.state(), QpState::Rts);
    // A bad R_Key.
    let (mut a, mut b) = pair();
    let op = SendOp::RdmaWrite {
        remote_addr: b.mr.iova,
        rkey: b.mr.rkey ^ 0xFF,
    };
    let pkts = post_msg(&mut a, 1, op, 600, 1);
    for p in &pkts {
        b.deliver(A_IP, p);
    }
    assert_eq!(b.drops(RxDropCause::UcRejected), 1);
    assert_eq!(b.drops(RxDropCause::IncompleteMessage), 2);
    assert_eq!(
        (a.wcs()[0].status, b.state()),
        (WcStatus::Success, QpState::Rts)
    );
    assert!(b.transmit().is_empty());
}

#[test]
fn too_small_receive_drops_the_send_and_keeps_the_wqe() {
    let (mut a, mut b) = pair();
    b.recv(1, 0, 300);
    let pkts = post_msg(&mut a, 1, SendOp::Send, 700, 1);
    for p in &pkts {
        b.deliver(A_IP, p);
    }
    assert!(b.wcs().is_empty());
    assert_eq!(b.drops(RxDropCause::UcRejected), 1);
    let pkts = post_msg(&mut a, 2, SendOp::Send, 200, 2);
    b.deliver(A_IP, &pkts[0]);
    assert_eq!(
        recv_wcs(&mut b),
        vec![(1, WcStatus::Success, WcOpcode::Recv, 200)]
    );
}

#[test]
fn rc_packets_for_a_uc_qp_are_refused() {
    let (mut a, mut b) = pair();
    b.recv(1, 0, 64);
    let mut pkts = post_msg(&mut a, 1, SendOp::Send, 16, 1);
    // Rewrite the opcode to RC SEND_ONLY and fix the ICRC: the transport does not match.
    let (sport, bytes) = &mut pkts[0];
    bytes[0] = 0x04;
    emu_proto::wire::fill_icrc(&IpContext::v4(A_IP, B_IP, *sport), bytes).unwrap();
    b.deliver(A_IP, &pkts[0]);
    assert!(b.wcs().is_empty());
    assert_eq!(b.drops(RxDropCause::Malformed), 1);
}

#[test]
fn a_cut_off_send_gives_its_srq_wqe_back() {
    let mut a = Node::new(A_IP, AccessFlags::REMOTE_WRITE);
    let mut b = Node::build(B_IP, AccessFlags::REMOTE_WRITE, true);
    let (aq, bq) = (a.qpn, b.qpn);
    connect(&mut a, B_IP, bq);
    connect(&mut b, A_IP, aq);
    b.recv(1, 0, 1024);
    b.recv(2, 1024, 1024);
    let first = post_msg(&mut a, 1, SendOp::Send, 700, 1);
    b.deliver(A_IP, &first[0]);
    b.deliver(A_IP, &first[2]);
    let second = post_msg(&mut a, 2, SendOp::Send, 100, 2);
    b.deliver(A_IP, &second[0]);
    assert_eq!(
        recv_wcs(&mut b),
        vec![(1, WcStatus::Success, WcOpcode::Recv, 100)]
    );
    assert_eq!(b.read(0, 100), pattern(100, 2));
}
