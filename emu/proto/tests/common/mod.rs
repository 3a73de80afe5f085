//! Test harness for packet-level tests of the RC engine through the public `Hca` API
//! (issue 4, items 8 and 9).
//!
//! Two HCAs, "a" (127.0.0.1) and "b" (127.0.0.2), each with one RC QP, separate send and
//! receive CQs and a [`VecMemory`]; a virtual clock; and a scripted wire between them. Every
//! datagram an HCA emits is checked (ICRC, parse), recorded in [`Pair::trace`] and handed to the
//! test's filter, which decides its fate ([`Action`]): deliver, drop, duplicate or hold (held
//! packets are released by the test, which is how reordering is scripted). The filter may
//! rewrite a packet (e.g. its PSN) with [`Pkt::set_psn`] / [`Pkt::reseal`].
//!
//! Delivery has zero latency: [`Pair::flush`] alternates "drain every transmit" and "deliver
//! everything in flight" until nothing moves; virtual time advances only in
//! [`Pair::run_until_idle`] / [`Pair::run_until`], to the next timer deadline.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use emu_proto::wire::{
    AethRepr, AtomicEthRepr, BthRepr, IpAddrs, IpContext, Opcode, Packet, PacketRepr, Psn,
    RethRepr, SACK_OPCODE, SackBitmap, SackPacketRepr, Syndrome, check_icrc, fill_icrc,
};
use emu_proto::{
    AtomicOp, CqId, Hca, HcaConfig, Instant, MAX_PACKET_LEN, Memory, MemoryFault, MrInfo,
    PacketClass, PdId, Stats,
};
use verbs_api::{
    AccessFlags, AhAttr, AsyncEvent, Gid, Mtu, QpAttr, QpCap, QpInitAttr, QpState, Recovery,
    RecvWr, SendWr, Sge, WorkCompletion, connect,
};

/// Address of node a.
pub(crate) const A_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
/// Address of node b.
pub(crate) const B_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// The RoCEv2 port both nodes listen on.
pub(crate) const PORT: u16 = 4791;
/// Every access right.
pub(crate) const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
/// Size of each node's default MR.
pub(crate) const MR_LEN: u64 = 64 * 1024;

// ---- memory ------------------------------------------------------------------------------

/// MR bytes by key, with bounds checks; `&self` methods as the `Memory` trait needs.
#[derive(Debug, Default)]
pub(crate) struct VecMemory {
    regions: RefCell<HashMap<u32, Vec<u8>>>,
}

impl VecMemory {
    pub(crate) fn insert(&self, key: u32, len: usize) {
        self.regions.borrow_mut().insert(key, vec![0; len]);
    }

    fn range(
        &self,
        key: u32,
        offset: u64,
        len: usize,
    ) -> Result<std::ops::Range<usize>, MemoryFault> {
        let regions = self.regions.borrow();
        let r = regions.get(&key).ok_or(MemoryFault)?;
        let start = usize::try_from(offset).map_err(|_| MemoryFault)?;
        let end = start.checked_add(len).ok_or(MemoryFault)?;
        if end > r.len() {
            return Err(MemoryFault);
        }
        Ok(start..end)
    }
}

impl Memory for VecMemory {
    fn read(&self, key: u32, offset: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        let range = self.range(key, offset, buf.len())?;
        buf.copy_from_slice(&self.regions.borrow()[&key][range]);
        Ok(())
    }

    fn write(&self, key: u32, offset: u64, data: &[u8]) -> Result<(), MemoryFault> {
        let range = self.range(key, offset, data.len())?;
        self.regions.borrow_mut().get_mut(&key).ok_or(MemoryFault)?[range].copy_from_slice(data);
        Ok(())
    }

    fn atomic(&self, key: u32, offset: u64, op: AtomicOp) -> Result<u64, MemoryFault> {
        if offset % 8 != 0 {
            return Err(MemoryFault);
        }
        let range = self.range(key, offset, 8)?;
        let mut regions = self.regions.borrow_mut();
        let bytes = &mut regions.get_mut(&key).ok_or(MemoryFault)?[range];
        let orig = u64::from_ne_bytes(bytes.try_into().map_err(|_| MemoryFault)?);
        if let Some(new) = op.apply(orig) {
            bytes.copy_from_slice(&new.to_ne_bytes());
        }
        Ok(orig)
    }
}

// ---- connection options ------------------------------------------------------------------

/// Connection parameters, applied to both QPs (the PSNs per side).
#[derive(Copy, Clone, Debug)]
pub(crate) struct Opts {
    pub(crate) mtu: Mtu,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    /// `qp_access_flags` of a's QP.
    pub(crate) a_access: AccessFlags,
    /// `qp_access_flags` of b's QP.
    pub(crate) b_access: AccessFlags,
    /// a's `sq_psn` (= b's `rq_psn`).
    pub(crate) a_psn: u32,
    /// b's `sq_psn` (= a's `rq_psn`).
    pub(crate) b_psn: u32,
    pub(crate) cap: QpCap,
    pub(crate) sq_sig_all: bool,
    /// Capacity of each node's receive CQ.
    pub(crate) recv_cq_depth: u32,
    /// `HcaConfig::foreign_ipv4_ident` of both nodes.
    pub(crate) foreign_ident: bool,
    /// Loss recovery of both QPs (selective repeat is set at RESET → INIT).
    pub(crate) recovery: Recovery,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            mtu: Mtu::Mtu256,
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
            a_access: ALL_ACCESS,
            b_access: ALL_ACCESS,
            a_psn: 0x100,
            b_psn: 0x5000,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 256,
            },
            sq_sig_all: false,
            recv_cq_depth: 1024,
            foreign_ident: false,
            recovery: Recovery::Ibta,
        }
    }
}

/// The local ACK timeout of `timeout`: 4.096 µs × 2^timeout (rc-transport.md §3.5).
pub(crate) fn ack_timeout(timeout: u8) -> Duration {
    Duration::from_nanos(4096 << timeout)
}

// ---- nodes -------------------------------------------------------------------------------

/// Which side.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Side {
    A,
    B,
}

/// One HCA with its memory, one PD, two CQs and one RC QP.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) hca: Hca,
    pub(crate) mem: VecMemory,
    pub(crate) ip: Ipv4Addr,
    pub(crate) pd: PdId,
    pub(crate) scq: CqId,
    pub(crate) rcq: CqId,
    pub(crate) qpn: u32,
    /// A 64 KiB MR with every right.
    pub(crate) mr: MrInfo,
    mrs: u64,
}

impl Node {
    fn new(name: &str, ip: Ipv4Addr, seed: u64, opts: &Opts) -> Node {
        let mut config = HcaConfig::new(name, Gid::from_ip(ip.into()), seed);
        config.foreign_ipv4_ident = opts.foreign_ident;
        let mut hca = Hca::new(config);
        let pd = hca.alloc_pd().unwrap();
        let scq = hca.create_cq(1024, None).unwrap();
        let rcq = hca.create_cq(opts.recv_cq_depth, None).unwrap();
        let init = QpInitAttr {
            sq_sig_all: opts.sq_sig_all,
            ..QpInitAttr::rc(opts.cap)
        };
        let qpn = hca.create_qp(pd, scq, rcq, None, &init).unwrap();
        let mut node = Node {
            hca,
            mem: VecMemory::default(),
            ip,
            pd,
            scq,
            rcq,
            qpn,
            mr: MrInfo {
                pd,
                lkey: 0,
                rkey: 0,
                iova: 0,
                length: 0,
                access: AccessFlags::empty(),
            },
            mrs: 0,
        };
        node.mr = node.reg(MR_LEN, ALL_ACCESS);
        node
    }

    /// Registers a zeroed MR of `len` bytes in the node's PD at a fake iova 0x1000_0000 × n.
    pub(crate) fn reg(&mut self, len: u64, access: AccessFlags) -> MrInfo {
        let pd = self.pd;
        self.reg_in(pd, len, access)
    }

    /// Registers a zeroed MR in `pd`.
    pub(crate) fn reg_in(&mut self, pd: PdId, len: u64, access: AccessFlags) -> MrInfo {
        self.mrs += 1;
        let info = self
            .hca
            .reg_mr(pd, 0x1000_0000 * self.mrs, len, access)
            .unwrap();
        self.mem.insert(info.lkey, usize::try_from(len).unwrap());
        info
    }

    /// Writes `data` at `off` of `mr`.
    pub(crate) fn write(&self, mr: &MrInfo, off: u64, data: &[u8]) {
        self.mem.write(mr.lkey, off, data).unwrap();
    }

    /// Reads `len` bytes at `off` of `mr`.
    pub(crate) fn read(&self, mr: &MrInfo, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read(mr.lkey, off, &mut v).unwrap();
        v
    }

    /// The 8 bytes at `off` of `mr` as a host-native u64.
    pub(crate) fn word(&self, mr: &MrInfo, off: u64) -> u64 {
        u64::from_ne_bytes(self.read(mr, off, 8).try_into().unwrap())
    }

    /// An SGE for `len` bytes at `off` of `mr`.
    pub(crate) fn sge(mr: &MrInfo, off: u64, len: u32) -> Sge {
        Sge {
            addr: mr.iova + off,
            length: len,
            lkey: mr.lkey,
        }
    }

    /// An SGE in the default MR.
    pub(crate) fn at(&self, off: u64, len: u32) -> Sge {
        Node::sge(&self.mr, off, len)
    }

    /// The remote address of `off` in the default MR.
    pub(crate) fn va(&self, off: u64) -> u64 {
        self.mr.iova + off
    }

    pub(crate) fn post_recv(&mut self, wr_id: u64, sges: &[Sge]) {
        self.hca
            .post_recv(self.qpn, &[RecvWr::new(wr_id, sges)])
            .unwrap();
    }

    pub(crate) fn state(&self) -> QpState {
        self.hca.query_qp(self.qpn).unwrap().qp_state
    }

    pub(crate) fn stats(&self) -> Stats {
        self.hca.qp_stats(self.qpn).unwrap()
    }

    /// Every completion in the send CQ.
    pub(crate) fn send_wcs(&mut self) -> Vec<WorkCompletion> {
        poll_all(&mut self.hca, self.scq)
    }

    /// Every completion in the receive CQ.
    pub(crate) fn recv_wcs(&mut self) -> Vec<WorkCompletion> {
        poll_all(&mut self.hca, self.rcq)
    }

    /// Every pending async event.
    pub(crate) fn events(&mut self) -> Vec<AsyncEvent> {
        std::iter::from_fn(|| self.hca.poll_event()).collect()
    }

    /// Modifies the QP.
    pub(crate) fn modify(
        &mut self,
        now: Instant,
        attr: &QpAttr,
        mask: verbs_api::QpAttrMask,
    ) -> verbs_api::Result<()> {
        self.hca.modify_qp(now, self.qpn, attr, mask)
    }
}

fn poll_all(hca: &mut Hca, cq: CqId) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut buf = [WorkCompletion::default(); 16];
    for _ in 0..1000 {
        let n = hca.poll_cq(cq, &mut buf).unwrap();
        out.extend_from_slice(&buf[..n]);
        if n < buf.len() {
            break;
        }
    }
    out
}

/// Walks `node`'s QP (from any state, through RESET) RESET → INIT → RTR → RTS towards the
/// peer, with the masks of `verbs_api::connect` (rc-transport.md §5.1).
pub(crate) fn connect_qp(
    node: &mut Node,
    peer_ip: Ipv4Addr,
    peer_qpn: u32,
    opts: &Opts,
    side: Side,
) {
    let (access, sq_psn, rq_psn) = match side {
        Side::A => (opts.a_access, opts.a_psn, opts.b_psn),
        Side::B => (opts.b_access, opts.b_psn, opts.a_psn),
    };
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: access,
        path_mtu: opts.mtu,
        dest_qp_num: peer_qpn,
        rq_psn,
        sq_psn,
        max_dest_rd_atomic: opts.max_dest_rd_atomic,
        max_rd_atomic: opts.max_rd_atomic,
        min_rnr_timer: opts.min_rnr_timer,
        timeout: opts.timeout,
        retry_cnt: opts.retry_cnt,
        rnr_retry: opts.rnr_retry,
        ah_attr: AhAttr {
            dgid: Gid::from_ip(peer_ip.into()),
            udp_dport: PORT,
            ..AhAttr::default()
        },
        recovery: opts.recovery,
        ..QpAttr::default()
    };
    let now = Instant::ZERO;
    if node.state() != QpState::Reset {
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..attr
        };
        node.modify(now, &reset, verbs_api::QpAttrMask::STATE)
            .unwrap();
    }
    let init_mask = if opts.recovery == Recovery::Ibta {
        connect::INIT_MASK
    } else {
        connect::INIT_MASK | verbs_api::QpAttrMask::RECOVERY
    };
    node.modify(now, &attr, init_mask).unwrap();
    node.modify(
        now,
        &QpAttr {
            qp_state: QpState::Rtr,
            ..attr
        },
        connect::RTR_MASK,
    )
    .unwrap();
    node.modify(
        now,
        &QpAttr {
            qp_state: QpState::Rts,
            ..attr
        },
        connect::RTS_MASK,
    )
    .unwrap();
}

// ---- packets -----------------------------------------------------------------------------

/// Direction of a datagram.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Dir {
    AtoB,
    BtoA,
}

/// What the wire does with a datagram.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Deliver,
    Drop,
    /// Deliver it twice, back to back.
    Duplicate,
    /// Keep it aside until [`Pair::release_held`].
    Hold,
}

/// One datagram on the wire.
#[derive(Clone, Debug)]
pub(crate) struct Pkt {
    pub(crate) dir: Dir,
    pub(crate) at: Instant,
    pub(crate) src: SocketAddr,
    pub(crate) dst: SocketAddr,
    pub(crate) bytes: Vec<u8>,
}

impl Pkt {
    /// The parsed packet (the harness checked it parses).
    pub(crate) fn repr(&self) -> PacketRepr<'_> {
        PacketRepr::parse(&Packet::new_unchecked(self.bytes.as_slice())).unwrap()
    }

    /// The IP context the ICRC covers.
    pub(crate) fn ip(&self) -> IpContext {
        ip_ctx(self.src, self.dst)
    }

    pub(crate) fn seen(&self) -> Seen {
        if let Ok(s) = SackPacketRepr::parse(&self.bytes) {
            return Seen::of_sack(self.dir, self.at, &s);
        }
        Seen::of(self.dir, self.at, &self.repr())
    }

    /// The selective ACK this is, if it is one.
    pub(crate) fn sack(&self) -> Option<SackPacketRepr> {
        SackPacketRepr::parse(&self.bytes).ok()
    }

    /// Recomputes the ICRC after the test edited the bytes.
    pub(crate) fn reseal(&mut self) {
        let ip = self.ip();
        fill_icrc(&ip, &mut self.bytes).unwrap();
    }

    /// Rewrites the BTH PSN (and the ICRC).
    pub(crate) fn set_psn(&mut self, psn: u32) {
        Packet::new_unchecked(self.bytes.as_mut_slice())
            .bth_mut()
            .set_psn(Psn::new(psn));
        self.reseal();
    }
}

/// The IPv4 context of a datagram from `src` to `dst` (IP ID 0, as softverbs sends).
pub(crate) fn ip_ctx(src: SocketAddr, dst: SocketAddr) -> IpContext {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
        panic!("IPv4 only");
    };
    IpContext {
        addrs: IpAddrs::V4 {
            src: s,
            dst: d,
            ident: 0,
        },
        src_port: src.port(),
        dst_port: dst.port(),
    }
}

/// The parts of a packet tests assert on.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) dir: Dir,
    pub(crate) at: Instant,
    pub(crate) op: Opcode,
    pub(crate) psn: u32,
    pub(crate) ack_req: bool,
    pub(crate) solicited: bool,
    pub(crate) pkey: u16,
    pub(crate) dest_qp: u32,
    /// Payload bytes.
    pub(crate) len: usize,
    pub(crate) pad: u8,
    pub(crate) syndrome: Option<Syndrome>,
    pub(crate) msn: Option<u32>,
    pub(crate) reth: Option<RethRepr>,
    pub(crate) atomic: Option<AtomicEthRepr>,
    pub(crate) orig: Option<u64>,
    pub(crate) imm: Option<u32>,
    /// A selective ACK's bitmap.
    pub(crate) sack: Option<SackBitmap>,
}

impl Seen {
    fn of(dir: Dir, at: Instant, p: &PacketRepr<'_>) -> Seen {
        Seen {
            dir,
            at,
            op: p.bth.opcode,
            psn: p.bth.psn.value(),
            ack_req: p.bth.ack_req,
            solicited: p.bth.solicited,
            pkey: p.bth.pkey,
            dest_qp: p.bth.dest_qp,
            len: p.payload.len(),
            pad: p.bth.pad_count,
            syndrome: p.aeth.map(|a| a.syndrome),
            msn: p.aeth.map(|a| a.msn),
            reth: p.reth,
            atomic: p.atomic_eth,
            orig: p.atomic_ack_eth.map(|a| a.orig_remote_data),
            imm: p.immdt.map(|i| i.imm),
            sack: None,
        }
    }

    fn of_sack(dir: Dir, at: Instant, p: &SackPacketRepr) -> Seen {
        Seen {
            dir,
            at,
            op: p.bth.opcode,
            psn: p.bth.psn.value(),
            ack_req: p.bth.ack_req,
            solicited: p.bth.solicited,
            pkey: p.bth.pkey,
            dest_qp: p.bth.dest_qp,
            len: 0,
            pad: p.bth.pad_count,
            syndrome: None,
            msn: Some(p.sack.msn),
            reth: None,
            atomic: None,
            orig: None,
            imm: None,
            sack: Some(p.sack.bitmap),
        }
    }

    /// Whether this is a selective ACK.
    pub(crate) fn is_sack(&self) -> bool {
        self.sack.is_some()
    }

    /// (opcode, PSN, payload length): the usual assertion triple.
    pub(crate) fn opl(&self) -> (Opcode, u32, usize) {
        (self.op, self.psn, self.len)
    }

    pub(crate) fn is_nak(&self) -> bool {
        matches!(self.syndrome, Some(Syndrome::Nak(_)))
    }

    pub(crate) fn is_rnr(&self) -> bool {
        matches!(self.syndrome, Some(Syndrome::RnrNak { .. }))
    }
}

/// The class a packet with opcode `op` belongs to: a bare ACKNOWLEDGE (ACK, NAK, RNR NAK) is
/// an ACK, READ responses and ATOMIC ACKNOWLEDGE are responses, the rest are requests.
pub(crate) fn class_of(op: Opcode) -> PacketClass {
    match op {
        Opcode::Acknowledge => PacketClass::Ack,
        Opcode::Unknown(SACK_OPCODE) => PacketClass::Ack,
        op if op.is_response() => PacketClass::Response,
        _ => PacketClass::Request,
    }
}

/// A BTH for a crafted request from a to b (or b to a).
pub(crate) fn bth(opcode: Opcode, dest_qp: u32, psn: u32, ack_req: bool) -> BthRepr {
    BthRepr {
        ack_req,
        ..BthRepr::new(opcode, dest_qp, Psn::new(psn))
    }
}

// ---- the pair ----------------------------------------------------------------------------

/// A packet filter: decides each datagram's fate; may edit it.
pub(crate) type Filter = Box<dyn FnMut(&mut Pkt) -> Action>;

/// Two connected nodes and the scripted wire.
pub(crate) struct Pair {
    pub(crate) a: Node,
    pub(crate) b: Node,
    pub(crate) now: Instant,
    pub(crate) opts: Opts,
    /// Every datagram either HCA emitted, in order, with the fate the filter chose.
    pub(crate) trace: Vec<(Seen, Action)>,
    /// The raw datagrams of `trace` (same indices), for replay.
    pub(crate) raw: Vec<Pkt>,
    /// The class the engine gave each datagram of `trace` (same indices).
    pub(crate) classes: Vec<PacketClass>,
    queue: VecDeque<Pkt>,
    held: Vec<Pkt>,
    filter: Option<Filter>,
}

/// Steps a run may take before it gives up (a QP may retry forever).
const STEP_BUDGET: usize = 100_000;

impl Pair {
    /// Two connected nodes with the default options.
    pub(crate) fn new() -> Pair {
        Pair::with(Opts::default())
    }

    /// Two connected nodes.
    pub(crate) fn with(opts: Opts) -> Pair {
        let mut a = Node::new("a", A_IP, 1, &opts);
        let mut b = Node::new("b", B_IP, 2, &opts);
        connect_qp(&mut a, B_IP, b.qpn, &opts, Side::A);
        connect_qp(&mut b, A_IP, a.qpn, &opts, Side::B);
        Pair {
            a,
            b,
            now: Instant::ZERO,
            opts,
            trace: Vec::new(),
            raw: Vec::new(),
            classes: Vec::new(),
            queue: VecDeque::new(),
            held: Vec::new(),
            filter: None,
        }
    }

    pub(crate) fn node(&mut self, side: Side) -> &mut Node {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Installs the packet filter (replacing any previous one).
    pub(crate) fn set_filter(&mut self, f: impl FnMut(&mut Pkt) -> Action + 'static) {
        self.filter = Some(Box::new(f));
    }

    /// Removes the filter: everything is delivered.
    pub(crate) fn clear_filter(&mut self) {
        self.filter = None;
    }

    /// Posts send WRs on a's QP.
    pub(crate) fn post_a(&mut self, wrs: &[SendWr<'_>]) {
        let qpn = self.a.qpn;
        self.a.hca.post_send(self.now, qpn, wrs).unwrap();
    }

    /// Posts send WRs on b's QP.
    pub(crate) fn post_b(&mut self, wrs: &[SendWr<'_>]) {
        let qpn = self.b.qpn;
        self.b.hca.post_send(self.now, qpn, wrs).unwrap();
    }

    /// Drains both HCAs' transmits through the filter. Returns how many datagrams were sent.
    pub(crate) fn transmit(&mut self) -> usize {
        self.transmit_at_most(usize::MAX)
    }

    /// Takes at most `limit` datagrams from each HCA through the filter (the rest wait in the
    /// HCA, as behind a slow link). Returns how many datagrams were sent.
    pub(crate) fn transmit_at_most(&mut self, limit: usize) -> usize {
        let mut sent = 0;
        for dir in [Dir::AtoB, Dir::BtoA] {
            for _ in 0..limit {
                let node = match dir {
                    Dir::AtoB => &mut self.a,
                    Dir::BtoA => &mut self.b,
                };
                let mut buf = vec![0u8; MAX_PACKET_LEN];
                let Some(tx) = node.hca.poll_transmit(self.now, &node.mem, &mut buf) else {
                    break;
                };
                sent += 1;
                assert!(sent < STEP_BUDGET, "transmit storm");
                buf.truncate(tx.len);
                let src = SocketAddr::new(node.ip.into(), tx.src_port);
                let mut pkt = Pkt {
                    dir,
                    at: self.now,
                    src,
                    dst: tx.dst,
                    bytes: buf,
                };
                // Every packet the engine emits parses and carries a valid ICRC (traps 1, 2).
                check_icrc(&pkt.ip(), &pkt.bytes).expect("engine emitted a bad ICRC");
                let want_dst = match dir {
                    Dir::AtoB => B_IP,
                    Dir::BtoA => A_IP,
                };
                assert_eq!(tx.dst, SocketAddr::new(want_dst.into(), PORT));
                let seen = pkt.seen();
                // The engine labels every packet with the class its opcode implies.
                assert_eq!(tx.class, class_of(seen.op), "class of {:?}", seen.op);
                self.classes.push(tx.class);
                let action = match self.filter.as_mut() {
                    Some(f) => f(&mut pkt),
                    None => Action::Deliver,
                };
                self.trace.push((seen, action));
                self.raw.push(pkt.clone());
                match action {
                    Action::Deliver => self.queue.push_back(pkt),
                    Action::Drop => {}
                    Action::Duplicate => {
                        self.queue.push_back(pkt.clone());
                        self.queue.push_back(pkt);
                    }
                    Action::Hold => self.held.push(pkt),
                }
            }
        }
        sent
    }

    /// Delivers everything in flight. Returns how many datagrams were delivered.
    pub(crate) fn deliver(&mut self) -> usize {
        let mut n = 0;
        while let Some(pkt) = self.queue.pop_front() {
            self.inject_pkt(&pkt);
            n += 1;
        }
        n
    }

    /// Hands `pkt` to its destination HCA now (bypassing the filter and the trace).
    pub(crate) fn inject_pkt(&mut self, pkt: &Pkt) {
        let node = match pkt.dst.ip() {
            ip if ip == IpAddr::from(A_IP) => &mut self.a,
            ip if ip == IpAddr::from(B_IP) => &mut self.b,
            other => panic!("no node at {other}"),
        };
        node.hca
            .handle_datagram(self.now, pkt.src, &pkt.bytes, &node.mem);
    }

    /// Hands raw bytes to `to` as if sent from `src`.
    pub(crate) fn inject(&mut self, to: Side, src: SocketAddr, bytes: &[u8]) {
        let now = self.now;
        let node = self.node(to);
        node.hca.handle_datagram(now, src, bytes, &node.mem);
    }

    /// A crafted packet from one node's QP to the other's, sealed with a valid ICRC.
    pub(crate) fn craft(&self, dir: Dir, repr: &PacketRepr<'_>) -> Pkt {
        let (from, to) = match dir {
            Dir::AtoB => (&self.a, &self.b),
            Dir::BtoA => (&self.b, &self.a),
        };
        let src = SocketAddr::new(
            from.ip.into(),
            emu_proto::wire::ip::udp_sport(from.qpn, to.qpn),
        );
        let dst = SocketAddr::new(to.ip.into(), PORT);
        let mut bytes = vec![0u8; repr.buffer_len()];
        repr.emit(&ip_ctx(src, dst), &mut bytes).unwrap();
        Pkt {
            dir,
            at: self.now,
            src,
            dst,
            bytes,
        }
    }

    /// An ACKNOWLEDGE (ACK, NAK or RNR NAK, as `syndrome` says) for `psn` from b's QP to a's,
    /// crafted and sealed: the test plays the responder.
    pub(crate) fn crafted_ack(&self, psn: u32, syndrome: Syndrome) -> Pkt {
        let repr = PacketRepr {
            aeth: Some(AethRepr { syndrome, msn: 0 }),
            ..PacketRepr::new(bth(Opcode::Acknowledge, self.a.qpn, psn, false), &[])
        };
        self.craft(Dir::BtoA, &repr)
    }

    /// Transmit and deliver until nothing moves (no time passes). Returns false if the budget
    /// ran out.
    pub(crate) fn flush(&mut self) -> bool {
        for _ in 0..STEP_BUDGET {
            let sent = self.transmit();
            let delivered = self.deliver();
            if sent == 0 && delivered == 0 {
                return true;
            }
        }
        false
    }

    /// The earliest timer deadline of either HCA.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        [self.a.hca.poll_timeout(), self.b.hca.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Fires the timers due at `now` on both HCAs.
    pub(crate) fn fire_timers(&mut self) {
        let now = self.now;
        self.a.hca.handle_timeout(now, &self.a.mem);
        self.b.hca.handle_timeout(now, &self.b.mem);
    }

    /// Flushes, then repeatedly jumps virtual time to the next deadline and fires it, until no
    /// timer is armed. Returns false if the step budget ran out (a QP retrying forever). Held
    /// packets stay held.
    pub(crate) fn run_until_idle(&mut self) -> bool {
        self.run_until(Instant::MAX)
    }

    /// As [`Pair::run_until_idle`], but fires no deadline after `end`; virtual time ends at
    /// `end` (unless that is `Instant::MAX`) or at the last deadline fired.
    pub(crate) fn run_until(&mut self, end: Instant) -> bool {
        for _ in 0..STEP_BUDGET {
            if !self.flush() {
                return false;
            }
            match self.next_deadline() {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    self.fire_timers();
                }
                _ => {
                    if end != Instant::MAX {
                        self.now = self.now.max(end);
                    }
                    return true;
                }
            }
        }
        false
    }

    /// Runs the pair with every datagram taking `hop` on the wire: transmit, let `hop` pass
    /// (firing the timers due), deliver; until nothing moves and no timer is armed. Returns
    /// false if the step budget ran out.
    pub(crate) fn run_with_latency(&mut self, hop: Duration) -> bool {
        for _ in 0..10_000 {
            let sent = self.transmit();
            if sent == 0 && self.in_flight() == 0 {
                match self.next_deadline() {
                    Some(t) => {
                        self.now = self.now.max(t);
                        self.fire_timers();
                        continue;
                    }
                    None => return true,
                }
            }
            self.now += hop;
            if self.next_deadline().is_some_and(|t| t <= self.now) {
                self.fire_timers();
            }
            self.deliver();
        }
        false
    }

    /// Advances virtual time by `d`, firing whatever falls due on the way.
    pub(crate) fn advance(&mut self, d: Duration) -> bool {
        let end = self.now + d;
        self.run_until(end)
    }

    /// Puts the held datagrams back on the wire (in reverse order if `reverse`).
    pub(crate) fn release_held(&mut self, reverse: bool) {
        let mut held = std::mem::take(&mut self.held);
        if reverse {
            held.reverse();
        }
        self.queue.extend(held);
    }

    /// Discards the held datagrams (they are lost).
    pub(crate) fn drop_held(&mut self) {
        self.held.clear();
    }

    /// Releases only the held datagram at `index` (taken modulo their number).
    pub(crate) fn release_one(&mut self, index: usize) {
        if !self.held.is_empty() {
            let i = index % self.held.len();
            let pkt = self.held.remove(i);
            self.queue.push_back(pkt);
        }
    }

    /// Number of datagrams in flight (queued for delivery).
    pub(crate) fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// Number of held datagrams.
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// The traced packets in direction `dir`.
    pub(crate) fn seen(&self, dir: Dir) -> Vec<Seen> {
        self.trace
            .iter()
            .filter(|(s, _)| s.dir == dir)
            .map(|(s, _)| *s)
            .collect()
    }

    /// The traced packets from index `from` on.
    pub(crate) fn seen_since(&self, from: usize, dir: Dir) -> Vec<Seen> {
        self.trace[from..]
            .iter()
            .filter(|(s, _)| s.dir == dir)
            .map(|(s, _)| *s)
            .collect()
    }

    /// Forgets the trace.
    pub(crate) fn clear_trace(&mut self) {
        self.trace.clear();
        self.raw.clear();
        self.classes.clear();
    }
}

// ---- replaying model-checker schedules ---------------------------------------------------

/// One network choice of a schedule printed by `emu-model` (issue 21). Indices are into the
/// held datagrams, which `replay` keeps in emission order as the model does.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Hand the held datagram at this index to its destination.
    Deliver(usize),
    /// Lose it.
    Drop(usize),
    /// Append a copy of it to the held datagrams.
    Duplicate(usize),
    /// Jump to the earliest deadline of either HCA and fire it.
    Fire,
    /// The node posts a receive (`wr_id`, offset and length in its default MR).
    PostRecv(Side, u64, u64, u32),
}

impl Pair {
    /// Replays a schedule printed by `emu-model`, transmitting after every step as the model
    /// does. The filter must hold every datagram
    /// (`p.set_filter(|_| Action::Hold)`), and the initial transmits must already be held.
    pub(crate) fn replay(&mut self, steps: &[Step]) {
        for (n, step) in steps.iter().enumerate() {
            match *step {
                Step::Deliver(i) => {
                    assert!(i < self.held.len(), "step {n}: no held datagram {i}");
                    let pkt = self.held.remove(i);
                    self.inject_pkt(&pkt);
                }
                Step::Drop(i) => {
                    assert!(i < self.held.len(), "step {n}: no held datagram {i}");
                    self.held.remove(i);
                }
                Step::Duplicate(i) => {
                    let pkt = self.held[i].clone();
                    self.held.push(pkt);
                }
                Step::Fire => {
                    let t = self.next_deadline().expect("Fire with no timer armed");
                    self.now = self.now.max(t);
                    self.fire_timers();
                }
                Step::PostRecv(side, wr_id, off, len) => {
                    let node = self.node(side);
                    let sge = node.at(off, len);
                    node.post_recv(wr_id, &[sge]);
                }
            }
            self.transmit();
        }
    }
}
