//! Packet-level tests of the UD transport through the public `Hca` API (issue 15): the state
//! machine's masks, what a post accepts, the packet on the wire (BTH, DETH, ICRC), and every
//! receive rule (GRH, Q_Key, P_Key, no WQE, too long), each drop counted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use common::VecMemory;
use emu_proto::wire::{Bth, Deth, IpContext, check_icrc, fill_icrc};
use emu_proto::{
    AhId, CqId, Hca, HcaConfig, Instant, MAX_PACKET_LEN, Memory, MrInfo, PdId, RxDropCause,
};
use verbs_api::{
    AccessFlags, AhAttr, ErrorKind, GRH_LEN, Gid, QKEY_CONTROLLED, QpAttr, QpAttrMask, QpCap,
    QpInitAttr, QpState, RecvWr, SendOp, SendWr, Sge, UdDest, WcFlags, WcOpcode, WcStatus,
    WorkCompletion, init_ah_from_wc,
};

const A_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const PORT: u16 = 4791;
const QKEY: u32 = 0x1111_2222;
const MR_LEN: u64 = 16 * 1024;

/// One HCA with a PD, a CQ, a UD QP in RTS, an MR and an AH to the other node.
struct Node {
    hca: Hca,
    mem: VecMemory,
    ip: Ipv4Addr,
    pd: PdId,
    cq: CqId,
    qpn: u32,
    mr: MrInfo,
    ah: AhId,
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

fn ud_attr(qkey: u32) -> QpAttr {
    QpAttr {
        qkey,
        pkey_index: 0,
        port_num: 1,
        sq_psn: 0x10,
        ..QpAttr::default()
    }
}

/// RESET → INIT → RTR → RTS with UD's masks.
fn to_rts(hca: &mut Hca, qpn: u32, qkey: u32) {
    use QpAttrMask as M;
    let attr = ud_attr(qkey);
    let now = Instant::ZERO;
    let init = QpAttr {
        qp_state: QpState::Init,
        ..attr
    };
    hca.modify_qp(
        now,
        qpn,
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
    )
    .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..attr
    };
    hca.modify_qp(now, qpn, &rtr, M::STATE).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..attr
    };
    hca.modify_qp(now, qpn, &rts, M::STATE | M::SQ_PSN).unwrap();
}

impl Node {
    fn new(ip: Ipv4Addr, peer: Ipv4Addr) -> Node {
        let mut hca = Hca::new(HcaConfig::new("ud", Gid::from_ip(ip.into()), 7));
        let pd = hca.alloc_pd().unwrap();
        let cq = hca.create_cq(64, None).unwrap();
        let qpn = hca
            .create_qp(pd, cq, cq, None, &QpInitAttr::ud(cap()))
            .unwrap();
        to_rts(&mut hca, qpn, QKEY);
        let mr = hca
            .reg_mr(pd, 0x1000_0000, MR_LEN, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let mem = VecMemory::default();
        mem.insert(mr.lkey, MR_LEN as usize);
        let ah = hca.create_ah(pd, &ah_to(peer)).unwrap();
        Node {
            hca,
            mem,
            ip,
            pd,
            cq,
            qpn,
            mr,
            ah,
        }
    }

    fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.mr.iova + off,
            length: len,
            lkey: self.mr.lkey,
        }
    }

    fn send(&mut self, wr_id: u64, op: SendOp, off: u64, len: u32, dest: UdDest) {
        let sge = [self.sge(off, len)];
        self.hca
            .post_send(
                Instant::ZERO,
                self.qpn,
                &[SendWr::new(wr_id, op, &sge).with_ud(dest)],
            )
            .unwrap();
    }

    fn recv(&mut self, wr_id: u64, off: u64, len: u32) {
        let sge = [self.sge(off, len)];
        self.hca
            .post_recv(self.qpn, &[RecvWr::new(wr_id, &sge)])
            .unwrap();
    }

    /// Every datagram the HCA has to send: (destination, source port, bytes).
    fn transmit(&mut self) -> Vec<(SocketAddr, u16, Vec<u8>)> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; MAX_PACKET_LEN];
        while let Some(t) = self.hca.poll_transmit(Instant::ZERO, &self.mem, &mut buf) {
            out.push((t.dst, t.src_port, buf[..t.len].to_vec()));
        }
        out
    }

    fn deliver(&mut self, from: Ipv4Addr, sport: u16, bytes: &[u8]) {
        let src = SocketAddr::new(from.into(), sport);
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
}

fn ah_to(ip: Ipv4Addr) -> AhAttr {
    AhAttr {
        dgid: Gid::from_ip(ip.into()),
        ..AhAttr::default()
    }
}

fn dest(a: &Node, b: &Node) -> UdDest {
    UdDest {
        ah: a.ah.0,
        remote_qpn: b.qpn,
        remote_qkey: QKEY,
    }
}

fn pair() -> (Node, Node) {
    (Node::new(A_IP, B_IP), Node::new(B_IP, A_IP))
}

/// Sends one SEND of `len` bytes (pattern) from a to b and delivers it; a's datagrams.
fn send_one(a: &mut Node, b: &mut Node, op: SendOp, len: u32) -> Vec<(SocketAddr, u16, Vec<u8>)> {
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
    a.mem.write(a.mr.lkey, 0, &data).unwrap();
    let d = dest(a, b);
    a.send(1, op, 0, len, d);
    let sent = a.transmit();
    for (_, sport, bytes) in &sent {
        b.deliver(a.ip, *sport, bytes);
    }
    sent
}

#[test]
fn datagram_carries_deth_and_valid_icrc_and_completes_both_sides() {
    let (mut a, mut b) = pair();
    b.recv(9, 0, 1024);
    let sent = send_one(&mut a, &mut b, SendOp::Send, 100);
    assert_eq!(sent.len(), 1);
    let (dst, sport, bytes) = &sent[0];
    assert_eq!(*dst, SocketAddr::new(B_IP.into(), PORT));
    let bth = Bth::new_checked(&bytes[..]).unwrap();
    assert_eq!(u8::from(bth.opcode()), 0x64);
    assert_eq!(bth.dest_qp(), b.qpn);
    assert_eq!(bth.psn().value(), 0x10);
    assert!(!bth.ack_req());
    let deth = Deth::new_checked(&bytes[12..]).unwrap();
    assert_eq!((deth.qkey(), deth.src_qp()), (QKEY, a.qpn));
    let ip = IpContext::v4(A_IP, B_IP, *sport);
    assert_eq!(check_icrc(&ip, bytes), Ok(()));
    assert_eq!(bytes.len(), 12 + 8 + 100 + 4);

    let swc = a.wcs();
    assert_eq!(swc.len(), 1);
    assert_eq!(
        (swc[0].wr_id, swc[0].status, swc[0].opcode, swc[0].byte_len),
        (1, WcStatus::Success, WcOpcode::Send, 100)
    );
    let rwc = b.wcs();
    assert_eq!(rwc.len(), 1);
    let wc = rwc[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (9, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(wc.byte_len, GRH_LEN as u32 + 100);
    assert_eq!(wc.src_qp, a.qpn);
    assert_eq!(wc.wc_flags, WcFlags::GRH);
    assert_eq!((wc.pkey_index, wc.sl, wc.qp_num), (0, 0, b.qpn));
    let payload: Vec<u8> = (0..100u32).map(|i| (i * 7 + 1) as u8).collect();
    assert_eq!(b.read(GRH_LEN as u64, 100), payload);
}

#[test]
fn grh_holds_the_ipv4_header_in_its_last_20_bytes() {
    let (mut a, mut b) = pair();
    b.recv(1, 0, 256);
    send_one(&mut a, &mut b, SendOp::Send, 8);
    let wc = b.wcs()[0];
    let grh = b.read(0, GRH_LEN);
    assert_eq!(grh[..20], [0u8; 20]);
    assert_eq!(grh[20], 0x45);
    assert_eq!(grh[29], 17, "protocol UDP");
    assert_eq!(grh[32..36], A_IP.octets());
    assert_eq!(grh[36..40], B_IP.octets());
    let ah = init_ah_from_wc(&wc, &grh, 1).unwrap();
    assert_eq!(ah.dgid, Gid::from_ip(IpAddr::V4(A_IP)));
}

#[test]
fn send_with_imm_sets_with_imm_and_grh() {
    let (mut a, mut b) = pair();
    b.recv(1, 0, 256);
    let sent = send_one(&mut a, &mut b, SendOp::SendWithImm { imm: 0xDEAD_BEEF }, 4);
    assert_eq!(sent[0].2[0], 0x65);
    let wc = b.wcs()[0];
    assert_eq!(wc.wc_flags, WcFlags::GRH | WcFlags::WITH_IMM);
    assert_eq!(wc.imm_data, 0xDEAD_BEEF);
}

#[test]
fn no_receive_wqe_drops_silently_and_counts() {
    let (mut a, mut b) = pair();
    let sent = send_one(&mut a, &mut b, SendOp::Send, 16);
    assert_eq!(sent.len(), 1);
    assert_eq!(a.wcs()[0].status, WcStatus::Success);
    assert!(b.wcs().is_empty());
    assert!(b.transmit().is_empty(), "never an RNR NAK");
    assert_eq!(b.drops(RxDropCause::NoRecvWqe), 1);
    assert_eq!(b.hca.query_qp(b.qpn).unwrap().qp_state, QpState::Rts);
}

#[test]
fn wrong_qkey_drops_and_counts_controlled_qkey_uses_the_qps() {
    let (mut a, mut b) = pair();
    b.recv(1, 0, 256);
    let d = UdDest {
        remote_qkey: QKEY ^ 1,
        ..dest(&a, &b)
    };
    a.send(1, SendOp::Send, 0, 4, d);
    for (_, sport, bytes) in a.transmit() {
        b.deliver(A_IP, sport, &bytes);
    }
    assert!(b.wcs().is_empty());
    assert_eq!(b.drops(RxDropCause::BadQkey), 1);

    // A controlled Q_Key (high bit) sends the QP's own Q_Key, which b accepts.
    let d = UdDest {
        remote_qkey: QKEY_CONTROLLED | 0x1234,
        ..dest(&a, &b)
    };
    a.send(2, SendOp::Send, 0, 4, d);
    let sent = a.transmit();
    assert_eq!(Deth::new_checked(&sent[0].2[12..]).unwrap().qkey(), QKEY);
    b.deliver(A_IP, sent[0].1, &sent[0].2);
    assert_eq!(b.wcs()[0].status, WcStatus::Success);
}

#[test]
fn foreign_pkey_drops_and_counts() {
    let (mut a, mut b) = pair();
    b.recv(1, 0, 256);
    let d = dest(&a, &b);
    a.send(1, SendOp::Send, 0, 4, d);
    let (_, sport, mut bytes) = a.transmit().remove(0);
    bytes[2..4].copy_from_slice(&0x1234u16.to_be_bytes());
    fill_icrc(&IpContext::v4(A_IP, B_IP, sport), &mut bytes).unwrap();
    b.deliver(A_IP, sport, &bytes);
    assert!(b.wcs().is_empty());
    assert_eq!(b.drops(RxDropCause::BadPkey), 1);
}

#[test]
fn too_long_for_the_receive_buffer_is_loc_len_err_and_the_qp_stays() {
    let (mut a, mut b) = pair();
    b.recv(1, 0, GRH_LEN as u32 + 10);
    send_one(&mut a, &mut b, SendOp::Send, 11);
    let wc = b.wcs()[0];
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::LocLenErr));
    assert_eq!(b.hca.query_qp(b.qpn).unwrap().qp_state, QpState::Rts);
    // Exactly GRH + payload fits.
    b.recv(2, 0, GRH_LEN as u32 + 10);
    send_one(&mut a, &mut b, SendOp::Send, 10);
    assert_eq!(b.wcs()[0].status, WcStatus::Success);
}

#[test]
fn post_rules_opcodes_mtu_and_ah() {
    let (mut a, b) = pair();
    let sge = [a.sge(0, 8)];
    let d = dest(&a, &b);
    let write = SendOp::RdmaWrite {
        remote_addr: 0,
        rkey: 1,
    };
    for op in [
        write,
        SendOp::RdmaRead {
            remote_addr: 0,
            rkey: 1,
        },
        SendOp::AtomicFetchAndAdd {
            remote_addr: 0,
            rkey: 1,
            add: 1,
        },
    ] {
        let e = a
            .hca
            .post_send(Instant::ZERO, a.qpn, &[SendWr::new(1, op, &sge).with_ud(d)])
            .unwrap_err();
        assert_eq!(e.error.kind, ErrorKind::InvalidArgument, "{op:?}");
    }
    // No UD destination.
    let e = a
        .hca
        .post_send(Instant::ZERO, a.qpn, &[SendWr::new(1, SendOp::Send, &sge)])
        .unwrap_err();
    assert_eq!(e.error.kind, ErrorKind::InvalidArgument);
    // Exactly the MTU (4096 by default) is one datagram; above it the post succeeds, the
    // send completes with success and nothing is sent (IBTA C10-93.1.1, rxe).
    let mtu = a.hca.port_attr(1).unwrap().active_mtu.bytes();
    let exact = [a.sge(0, mtu)];
    a.hca
        .post_send(
            Instant::ZERO,
            a.qpn,
            &[SendWr::new(1, SendOp::Send, &exact).with_ud(d)],
        )
        .unwrap();
    assert_eq!(a.transmit().len(), 1);
    let big = [a.sge(0, mtu + 1)];
    a.hca
        .post_send(
            Instant::ZERO,
            a.qpn,
            &[SendWr::new(2, SendOp::Send, &big).with_ud(d)],
        )
        .unwrap();
    assert!(a.transmit().is_empty());
    let wcs = a.wcs();
    assert_eq!(wcs.len(), 2);
    assert_eq!(
        (wcs[1].wr_id, wcs[1].status, wcs[1].byte_len),
        (2, WcStatus::Success, mtu + 1)
    );
    // A destroyed AH fails the post.
    a.hca.destroy_ah(a.ah).unwrap();
    let e = a
        .hca
        .post_send(
            Instant::ZERO,
            a.qpn,
            &[SendWr::new(1, SendOp::Send, &sge).with_ud(d)],
        )
        .unwrap_err();
    assert_eq!(e.error.kind, ErrorKind::InvalidArgument);
}

#[test]
fn ah_keeps_its_pd_busy() {
    let (mut a, _b) = pair();
    let pd = a.hca.alloc_pd().unwrap();
    let ah = a.hca.create_ah(pd, &ah_to(B_IP)).unwrap();
    assert_eq!(a.hca.dealloc_pd(pd).unwrap_err().kind, ErrorKind::Busy);
    a.hca.destroy_ah(ah).unwrap();
    a.hca.dealloc_pd(pd).unwrap();
    assert_eq!(
        a.hca.destroy_ah(ah).unwrap_err().kind,
        ErrorKind::InvalidArgument
    );
    for bad in [
        AhAttr {
            port_num: 2,
            ..ah_to(B_IP)
        },
        AhAttr {
            sgid_index: 1,
            ..ah_to(B_IP)
        },
        AhAttr::default(),
    ] {
        let pd = a.pd;
        assert_eq!(
            a.hca.create_ah(pd, &bad).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
    }
}

#[test]
fn ud_state_machine_masks() {
    use QpAttrMask as M;
    let mut hca = Hca::new(HcaConfig::new("ud", Gid::from_ip(A_IP.into()), 1));
    let pd = hca.alloc_pd().unwrap();
    let cq = hca.create_cq(8, None).unwrap();
    let qpn = hca
        .create_qp(pd, cq, cq, None, &QpInitAttr::ud(cap()))
        .unwrap();
    let now = Instant::ZERO;
    let init = QpAttr {
        qp_state: QpState::Init,
        ..ud_attr(5)
    };
    // RC's RESET→INIT mask (ACCESS_FLAGS instead of QKEY) is refused.
    let e = hca
        .modify_qp(
            now,
            qpn,
            &init,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        )
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    hca.modify_qp(
        now,
        qpn,
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
    )
    .unwrap();
    assert_eq!(hca.query_qp(qpn).unwrap().qkey, 5);
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..ud_attr(5)
    };
    // Path attributes are not UD's.
    let e = hca
        .modify_qp(now, qpn, &rtr, M::STATE | M::AV | M::DEST_QPN)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    hca.modify_qp(now, qpn, &rtr, M::STATE).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..ud_attr(6)
    };
    let e = hca.modify_qp(now, qpn, &rts, M::STATE).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "SQ_PSN is required");
    hca.modify_qp(now, qpn, &rts, M::STATE | M::SQ_PSN | M::QKEY)
        .unwrap();
    assert_eq!(hca.query_qp(qpn).unwrap().qkey, 6);
}

#[test]
fn ud_packets_to_an_unknown_qp_are_dropped() {
    let (mut a, mut b) = pair();
    b.recv(1, 0, 256);
    let d = UdDest {
        remote_qpn: 0x4242,
        ..dest(&a, &b)
    };
    a.send(1, SendOp::Send, 0, 4, d);
    for (_, sport, bytes) in a.transmit() {
        b.deliver(A_IP, sport, &bytes);
    }
    assert!(b.wcs().is_empty());
    assert_eq!(b.hca.stats().rx_drops.get(RxDropCause::UnknownQp), 1);
}

/// Opens the GSI on `n` (QPN 1, RTS, Q_Key 0x8001_0000) and makes it the node's QP.
fn open_gsi(n: &mut Node) {
    let qpn = n
        .hca
        .create_gsi(Instant::ZERO, n.pd, n.cq, n.cq, &QpInitAttr::ud(cap()))
        .unwrap();
    assert_eq!(qpn, emu_proto::GSI_QPN);
    n.qpn = qpn;
}

#[test]
fn gsi_is_qp1_in_rts_with_the_well_known_qkey_and_one_per_device() {
    let (mut a, _) = pair();
    let ud_qpn = a.qpn;
    open_gsi(&mut a);
    let attr = a.hca.query_qp(1).unwrap();
    assert_eq!(
        (attr.qp_state, attr.qkey),
        (QpState::Rts, emu_proto::GSI_QKEY)
    );
    const { assert!(emu_proto::FIRST_QPN > emu_proto::GSI_QPN) };
    let again = a
        .hca
        .create_gsi(Instant::ZERO, a.pd, a.cq, a.cq, &QpInitAttr::ud(cap()));
    assert_eq!(again.unwrap_err().kind, ErrorKind::Busy);
    // Ordinary QPs keep their numbers; the GSI closes like any QP and may be opened again.
    let next = a
        .hca
        .create_qp(a.pd, a.cq, a.cq, None, &QpInitAttr::ud(cap()))
        .unwrap();
    assert_eq!(next, ud_qpn + 1);
    a.hca.destroy_qp(1).unwrap();
    assert!(a.hca.query_qp(1).is_err());
    open_gsi(&mut a);
    let bad = a
        .hca
        .create_gsi(Instant::ZERO, PdId(99), a.cq, a.cq, &QpInitAttr::ud(cap()));
    assert!(bad.is_err());
}

/// A MAD-sized datagram from A's GSI to B's QP1: B's receive completion names source QPN 1 and
/// the GRH gives A's GID, as for any UD QP.
#[test]
fn gsi_to_gsi_datagram_names_its_source() {
    let (mut a, mut b) = pair();
    open_gsi(&mut a);
    open_gsi(&mut b);
    b.recv(5, 0, (GRH_LEN + 256) as u32);
    let dest = UdDest {
        ah: a.ah.0,
        remote_qpn: 1,
        remote_qkey: emu_proto::GSI_QKEY,
    };
    let mad: Vec<u8> = (0..256u32).map(|i| i as u8).collect();
    a.mem.write(a.mr.lkey, 0, &mad).unwrap();
    a.send(1, SendOp::Send, 0, 256, dest);
    let sent = a.transmit();
    assert_eq!(sent.len(), 1);
    let deth = Deth::new_checked(&sent[0].2[12..]).unwrap();
    assert_eq!((deth.qkey(), deth.src_qp()), (emu_proto::GSI_QKEY, 1));
    b.deliver(a.ip, sent[0].1, &sent[0].2);
    let wc = b.wcs()[0];
    assert_eq!(
        (wc.status, wc.src_qp, wc.qp_num, wc.byte_len),
        (WcStatus::Success, 1, 1, GRH_LEN as u32 + 256)
    );
    let grh = b.read(0, GRH_LEN);
    let ah = init_ah_from_wc(&wc, &grh, 1).unwrap();
    assert_eq!(ah.dgid, Gid::from_ip(IpAddr::V4(A_IP)));
    assert_eq!(b.read(GRH_LEN as u64, 256), mad);
    // A datagram to QP1 with another Q_Key is dropped (IBTA 14.2.5.7).
    let dest = UdDest {
        remote_qkey: QKEY,
        ..dest
    };
    b.recv(6, 0, (GRH_LEN + 256) as u32);
    a.send(2, SendOp::Send, 0, 256, dest);
    for (_, sport, bytes) in a.transmit() {
        b.deliver(a.ip, sport, &bytes);
    }
    assert_eq!(b.drops(RxDropCause::BadQkey), 1);
}
