//! Fuzz target `pair`: two connected RC QPs (IBTA or selective-repeat recovery, both alike)
//! exchanging arbitrary operations over a wire whose losses, duplicates and reordering the
//! input decides, in virtual time (rc-transport.md §2–§4, §6).

use core::net::SocketAddr;
use std::collections::VecDeque;

use emu_proto::wire::{Packet, PacketRepr, SackPacketRepr};
use emu_proto::{CqId, Hca, HcaConfig, Instant, MAX_PACKET_LEN, MrInfo};
use verbs_api::{
    AccessFlags, AhAttr, Gid, Mtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, Recovery,
    RecvWr, SendFlags, SendOp, SendWr, Sge, WcFlags, WcOpcode, WcStatus, WorkCompletion, connect,
};

use super::common::{A_IP, B_IP, Input, PORT, TestMemory, icrc_ok, pattern, poll_all};

/// Operations per input at most.
const MAX_OPS: u32 = 12;
/// Largest message (so that 12 of them fit the layout below).
const MAX_LEN: u32 = 1200;
/// Largest inline payload.
const MAX_INLINE: u32 = 256;
/// Fault-schedule actions per input at most.
const MAX_ACTIONS: usize = 2000;
/// Steps of the final run (transmit/deliver rounds and timer firings) before it counts as a
/// livelock.
const SETTLE_BUDGET: usize = 200_000;

/// Layout of each node's 64 KiB MR.
const SRC: u64 = 0;
const SRC_LEN: u64 = 16 * 1024;
const WTGT: u64 = 16 * 1024;
const DEST: u64 = 32 * 1024;
const SLOTS: u64 = 56 * 1024;
const WORDS: u64 = 60 * 1024;
const MR_LEN: u64 = 64 * 1024;

/// Fuzz target `pair`: two HCAs, each with one RC QP connected to the other (MTU, timeout,
/// `retry_cnt`, `max_rd_atomic`, both start PSNs and the loss recovery — IBTA or selective
/// repeat, both QPs alike — from the input; `rnr_retry` 7), and up to
/// 12 operations of every kind (SEND ± imm, WRITE ± imm, READ, CMP_SWAP, FETCH_ADD; 0–1200
/// bytes; 1–3 SGEs or inline; signaled or not; fenced; solicited) from either side, their
/// receive WQEs posted up front or lazily (so RNR NAKs happen). The input then schedules up
/// to 2000 steps: transmit a few datagrams per side, each delivered, dropped, duplicated or
/// held as the next input byte says; deliver; release held datagrams (one, all, reversed);
/// fire the next timer; post the next operation or receive WQE. When the input ends the wire
/// turns perfect, everything left is posted and released, and the pair runs until idle.
///
/// Asserts, besides "never panics": every emitted datagram has a valid ICRC and parses; the
/// pair settles (no livelock); per side, the send completions are SUCCESS for a prefix of the
/// signaled WRs in posting order, then, if anything failed, exactly one RETRY_EXC_ERR and a
/// WR_FLUSH_ERR for every later WR (signaled or not) with the QP in ERR, else the QP in RTS
/// and nothing lost; every successful WRITE, READ and atomic left exactly the expected bytes
/// (atomics executed once, in order); receive completions are SUCCESS with the sent data,
/// immediate and length for a prefix of the peer's consuming WRs, then flushes iff the QP is
/// in ERR; with no error anywhere, the atomic words hold the model's final values.
pub fn pair(data: &[u8]) {
    let mut inp = Input::new(data);
    let mut p = Pair::new(&mut inp);
    let specs: Vec<Spec> = (0..=inp.below(MAX_OPS))
        .map(|_| Spec::read(&mut inp, p.mtu))
        .collect();
    let lazy_recv = inp.below(4) == 3;
    let planned = plan(&p, &specs);
    if !lazy_recv {
        for w in &planned {
            p.post_recv_for(w);
        }
    }
    let mut next_op = 0;
    let consumers: Vec<usize> = (0..planned.len())
        .filter(|&i| planned[i].recv.is_some())
        .collect();
    let mut next_recv = if lazy_recv { 0 } else { consumers.len() };
    // Post a first batch so that short inputs still move data.
    while next_op < planned.len() && next_op < 2 {
        p.post(&planned[next_op]);
        next_op += 1;
    }
    for _ in 0..MAX_ACTIONS {
        if inp.is_empty() {
            break;
        }
        match inp.u8() {
            0..=99 => {
                let k = 1 + inp.below(4) as usize;
                p.transmit(k, Some(&mut inp));
            }
            100..=139 => {
                p.deliver();
            }
            140..=149 => p.release(Release::One(inp.index(64))),
            150..=154 => p.release(Release::All),
            155..=159 => p.release(Release::Reversed),
            160..=164 => p.held.clear(),
            165..=199 => p.fire_next_timer(),
            200..=229 => {
                if next_op < planned.len() {
                    p.post(&planned[next_op]);
                    next_op += 1;
                }
            }
            _ => {
                if let Some(&i) = consumers.get(next_recv) {
                    p.post_recv_for(&planned[i]);
                    next_recv += 1;
                }
            }
        }
    }
    // The wire turns perfect: post and release everything, run until idle.
    for w in &planned[next_op..] {
        p.post(w);
    }
    for &i in &consumers[next_recv.min(consumers.len())..] {
        p.post_recv_for(&planned[i]);
    }
    p.release(Release::All);
    assert!(p.run_until_idle(), "the pair did not settle (livelock)");
    check(&mut p, &planned);
}

/// One generated operation.
#[derive(Clone, Debug)]
struct Spec {
    from_b: bool,
    kind: u32,
    len: u32,
    signaled: bool,
    fence: bool,
    solicited: bool,
    inline: bool,
    /// Cut points for SGE splits, offsets, immediate, atomic operands.
    bytes: [u8; 12],
}

impl Spec {
    fn read(inp: &mut Input<'_>, mtu: u32) -> Spec {
        let flags = inp.u8();
        let kind = inp.below(7);
        let cap = (3 * mtu).min(MAX_LEN);
        let len = match inp.below(4) {
            0 => inp.below(mtu + 1),
            1 => inp.below(cap + 1),
            2 => 0,
            _ => mtu.min(MAX_LEN),
        };
        let mut bytes = [0u8; 12];
        for b in &mut bytes {
            *b = inp.u8();
        }
        Spec {
            from_b: flags & 1 != 0,
            kind,
            len,
            signaled: flags & 2 == 0,
            fence: flags & 4 != 0,
            solicited: flags & 8 != 0,
            inline: flags & 16 != 0,
            bytes,
        }
    }
}

/// What a WR must produce.
#[derive(Clone, Debug)]
struct Planned {
    from: usize,
    wr_id: u64,
    op: SendOp,
    signaled: bool,
    flags: SendFlags,
    gather: Vec<Sge>,
    inline: Vec<u8>,
    /// Bytes the WR moves (8 for atomics).
    len: u32,
    /// The message (SEND/WRITE payload, or the bytes a READ must fetch).
    msg: Vec<u8>,
    /// READ: local pieces (offset, length) the data must land in.
    read_dest: Vec<(u64, u32)>,
    /// WRITE: offset in the peer's MR that must hold `msg`.
    write_target: Option<u64>,
    /// Atomics: (result slot offset, expected original value).
    atomic: Option<(u64, u64)>,
    /// The receive WQE it consumes at the peer.
    recv: Option<RecvPlan>,
}

/// A receive WQE a WR consumes: (wr_id, immediate data, its pieces (offset, length)).
type RecvPlan = (u64, Option<u32>, Vec<(u64, u32)>);

/// Splits `len` into 1–3 pieces at cut points taken from `b`.
fn split(len: u32, b: &[u8]) -> Vec<u32> {
    let k = 1 + usize::from(b.first().copied().unwrap_or(0) % 3);
    let mut cuts: Vec<u32> = b
        .iter()
        .skip(1)
        .take(k - 1)
        .map(|&x| (u32::from(x) * (len + 1)) / 256)
        .collect();
    cuts.sort_unstable();
    let mut out = Vec::with_capacity(k);
    let mut prev = 0;
    for c in cuts.into_iter().chain([len]) {
        out.push(c - prev);
        prev = c;
    }
    out
}

fn source(side: usize) -> Vec<u8> {
    pattern(if side == 0 { 11 } else { 97 }, SRC_LEN as usize)
}

/// Turns the specs into WRs, receive WQEs and expectations (rc_props.rs's plan, with the
/// choices read from the input).
fn plan(p: &Pair, specs: &[Spec]) -> Vec<Planned> {
    let srcs = [source(0), source(1)];
    // Per node: write-target cursor, destination cursor, slot cursor, atomic words, recv ids.
    let mut wtgt = [WTGT; 2];
    let mut dest = [DEST; 2];
    let mut slot = [SLOTS; 2];
    let mut words = [[0u64; 2]; 2];
    let mut recv_id = [0u64; 2];
    let mut out = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        let (me, peer) = if s.from_b { (1, 0) } else { (0, 1) };
        let (my_mr, peer_mr) = (p.nodes[me].mr, p.nodes[peer].mr);
        let b = &s.bytes;
        let imm = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        let mut flags = SendFlags::empty();
        if s.signaled {
            flags |= SendFlags::SIGNALED;
        }
        if s.fence {
            flags |= SendFlags::FENCE;
        }
        if s.solicited && matches!(s.kind, 1 | 3) {
            flags |= SendFlags::SOLICITED;
        }
        let len = s.len;
        let mut gather = Vec::new();
        let mut msg = Vec::new();
        for (j, pl) in split(len, &b[0..3]).into_iter().enumerate() {
            let room = SRC_LEN - u64::from(pl) + 1;
            let off = (u64::from(b[3 + j]) * 61 + u64::from(b[4]) * 7) % room;
            gather.push(sge(&my_mr, SRC + off, pl));
            msg.extend_from_slice(&srcs[me][off as usize..(off + u64::from(pl)) as usize]);
        }
        let mut w = Planned {
            from: me,
            wr_id: 1000 + i as u64,
            op: SendOp::Send,
            signaled: s.signaled,
            flags,
            gather,
            inline: Vec::new(),
            len,
            msg,
            read_dest: Vec::new(),
            write_target: None,
            atomic: None,
            recv: None,
        };
        match s.kind {
            0 | 1 => {
                w.op = if s.kind == 0 {
                    SendOp::Send
                } else {
                    SendOp::SendWithImm { imm }
                };
                let extra = u32::from(b[7] % 17);
                let pieces = split(len + extra, &b[5..8])
                    .into_iter()
                    .map(|pl| {
                        let at = dest[peer];
                        dest[peer] += u64::from(pl) + 8;
                        (at, pl)
                    })
                    .collect();
                recv_id[peer] += 1;
                w.recv = Some((recv_id[peer], w.op.imm(), pieces));
            }
            2 | 3 => {
                let target = wtgt[peer];
                wtgt[peer] += u64::from(len) + 8;
                w.write_target = Some(target);
                let remote_addr = peer_mr.iova + target;
                w.op = if s.kind == 2 {
                    SendOp::RdmaWrite {
                        remote_addr,
                        rkey: peer_mr.rkey,
                    }
                } else {
                    recv_id[peer] += 1;
                    w.recv = Some((recv_id[peer], Some(imm), Vec::new()));
                    SendOp::RdmaWriteWithImm {
                        remote_addr,
                        rkey: peer_mr.rkey,
                        imm,
                    }
                };
            }
            4 => {
                let room = SRC_LEN - u64::from(len) + 1;
                let off = (u64::from(b[3]) * 251 + u64::from(b[6])) % room;
                w.op = SendOp::RdmaRead {
                    remote_addr: peer_mr.iova + SRC + off,
                    rkey: peer_mr.rkey,
                };
                w.msg = srcs[peer][off as usize..(off + u64::from(len)) as usize].to_vec();
                w.gather.clear();
                for pl in split(len, &b[5..8]) {
                    let at = dest[me];
                    dest[me] += u64::from(pl) + 8;
                    w.gather.push(sge(&my_mr, at, pl));
                    w.read_dest.push((at, pl));
                }
            }
            _ => {
                let k = usize::from(b[0] & 1);
                let remote_addr = peer_mr.iova + WORDS + 8 * k as u64;
                let orig = words[peer][k];
                if s.kind == 5 {
                    let compare = if b[1] & 1 == 0 {
                        orig
                    } else {
                        u64::from(b[2] % 8)
                    };
                    let swap = u64::from(b[3] % 8);
                    if orig == compare {
                        words[peer][k] = swap;
                    }
                    w.op = SendOp::AtomicCmpAndSwp {
                        remote_addr,
                        rkey: peer_mr.rkey,
                        compare,
                        swap,
                    };
                } else {
                    let add = 1 + u64::from(b[2] % 3);
                    words[peer][k] = orig.wrapping_add(add);
                    w.op = SendOp::AtomicFetchAndAdd {
                        remote_addr,
                        rkey: peer_mr.rkey,
                        add,
                    };
                }
                let at = slot[me];
                slot[me] += 8;
                w.gather = vec![sge(&my_mr, at, 8)];
                w.atomic = Some((at, orig));
                w.len = 8;
                w.msg.clear();
            }
        }
        if s.inline && s.kind <= 3 && len <= MAX_INLINE {
            w.inline = w.msg.clone();
            w.gather.clear();
            w.flags |= SendFlags::INLINE;
        }
        out.push(w);
    }
    out
}

fn sge(mr: &MrInfo, off: u64, len: u32) -> Sge {
    Sge {
        addr: mr.iova + off,
        length: len,
        lkey: mr.lkey,
    }
}

fn ok<T>(r: verbs_api::Result<T>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what} failed: {e}"),
    }
}

/// One HCA with its memory, a CQ per direction, one RC QP and one 64 KiB MR.
struct Node {
    hca: Hca,
    mem: TestMemory,
    addr: SocketAddr,
    scq: CqId,
    rcq: CqId,
    qpn: u32,
    mr: MrInfo,
}

/// A datagram on the wire.
#[derive(Clone, Debug)]
struct Dgram {
    to: usize,
    src: SocketAddr,
    bytes: Vec<u8>,
}

enum Release {
    One(usize),
    All,
    Reversed,
}

struct Pair {
    nodes: [Node; 2],
    now: Instant,
    mtu: u32,
    queue: VecDeque<Dgram>,
    held: Vec<Dgram>,
}

impl Pair {
    fn new(inp: &mut Input<'_>) -> Pair {
        let mtu = [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024][inp.index(3)];
        let timeout = [2, 4, 1, 6][inp.index(4)];
        let retry_cnt = [7, 7, 3, 1, 0, 2, 5, 6][inp.index(8)];
        let max_rd_atomic = [2, 1, 4, 3][inp.index(4)];
        let psns = [
            match inp.below(4) {
                0 => 0x100,
                1 => 0xFF_FFF8 + inp.below(8),
                _ => inp.u24(),
            },
            match inp.below(4) {
                0 => 0x5000,
                1 => 0xFF_FFFC,
                _ => inp.u24(),
            },
        ];
        // Both QPs alike: IBTA go-back-N or selective repeat (the softverbs extension).
        let recovery = if inp.below(2) == 1 {
            Recovery::SelectiveRepeat
        } else {
            Recovery::Ibta
        };
        let init_mask = if recovery == Recovery::Ibta {
            connect::INIT_MASK
        } else {
            connect::INIT_MASK | QpAttrMask::RECOVERY
        };
        let all = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mk = |name: &str, ip: core::net::Ipv4Addr, seed: u64| {
            let mut hca = Hca::new(HcaConfig::new(name, Gid::from_ip(ip.into()), seed));
            let pd = ok(hca.alloc_pd(), "alloc_pd");
            let scq = ok(hca.create_cq(1024, None), "create_cq");
            let rcq = ok(hca.create_cq(1024, None), "create_cq");
            let cap = QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: MAX_INLINE,
            };
            let qpn = ok(
                hca.create_qp(pd, scq, rcq, None, &QpInitAttr::rc(cap)),
                "create_qp",
            );
            let mr = ok(hca.reg_mr(pd, 0x1000_0000, MR_LEN, all), "reg_mr");
            let mem = TestMemory::default();
            mem.insert(mr.lkey, MR_LEN as usize);
            Node {
                hca,
                mem,
                addr: SocketAddr::new(ip.into(), PORT),
                scq,
                rcq,
                qpn,
                mr,
            }
        };
        let mut nodes = [mk("a", A_IP, 1), mk("b", B_IP, 2)];
        for (i, src) in [source(0), source(1)].iter().enumerate() {
            nodes[i].mem.put(nodes[i].mr.lkey, SRC, src);
        }
        for i in 0..2 {
            let peer = 1 - i;
            let attr = QpAttr {
                qp_state: QpState::Init,
                port_num: 1,
                qp_access_flags: all,
                path_mtu: mtu,
                dest_qp_num: nodes[peer].qpn,
                rq_psn: psns[peer],
                sq_psn: psns[i],
                max_dest_rd_atomic: 16,
                max_rd_atomic,
                min_rnr_timer: 1,
                timeout,
                retry_cnt,
                rnr_retry: 7,
                ah_attr: AhAttr {
                    dgid: Gid::from_ip(nodes[peer].addr.ip()),
                    udp_dport: PORT,
                    ..AhAttr::default()
                },
                recovery,
                ..QpAttr::default()
            };
            for (state, mask) in [
                (QpState::Init, init_mask),
                (QpState::Rtr, connect::RTR_MASK),
                (QpState::Rts, connect::RTS_MASK),
            ] {
                let a = QpAttr {
                    qp_state: state,
                    ..attr
                };
                let qpn = nodes[i].qpn;
                ok(
                    nodes[i].hca.modify_qp(Instant::ZERO, qpn, &a, mask),
                    "connect",
                );
            }
        }
        Pair {
            nodes,
            now: Instant::ZERO,
            mtu: mtu.bytes(),
            queue: VecDeque::new(),
            held: Vec::new(),
        }
    }

    fn post(&mut self, w: &Planned) {
        let wr = SendWr {
            wr_id: w.wr_id,
            op: w.op,
            sg_list: &w.gather,
            inline_data: &w.inline,
            flags: w.flags,
            ud: None,
        };
        let n = &mut self.nodes[w.from];
        // Valid WRs, at most 12 of 64 slots; in ERR a post completes with a flush. A refusal
        // is a finding.
        if let Err(e) = n.hca.post_send(self.now, n.qpn, &[wr]) {
            panic!("post_send of a valid WR failed: {e:?}");
        }
    }

    fn post_recv_for(&mut self, w: &Planned) {
        if let Some((rid, _, pieces)) = &w.recv {
            let n = &mut self.nodes[1 - w.from];
            let sges: Vec<Sge> = pieces.iter().map(|&(o, l)| sge(&n.mr, o, l)).collect();
            if let Err(e) = n.hca.post_recv(n.qpn, &[RecvWr::new(*rid, &sges)]) {
                panic!("post_recv failed: {e:?}");
            }
        }
    }

    /// Takes up to `k` datagrams from each HCA; with `fate`, each datagram's fate is the next
    /// input byte, else everything is delivered. Returns how many were sent.
    fn transmit(&mut self, k: usize, mut fate: Option<&mut Input<'_>>) -> usize {
        let mut sent = 0;
        for i in 0..2 {
            for _ in 0..k {
                let n = &mut self.nodes[i];
                let mut buf = vec![0u8; MAX_PACKET_LEN];
                let Some(tx) = n.hca.poll_transmit(self.now, &n.mem, &mut buf) else {
                    break;
                };
                sent += 1;
                buf.truncate(tx.len);
                let src = SocketAddr::new(n.addr.ip(), tx.src_port);
                let to = 1 - i;
                assert_eq!(tx.dst, self.nodes[to].addr, "datagram to the wrong node");
                assert!(icrc_ok(src, tx.dst, &buf), "emitted a bad ICRC");
                // A selective ACK is not an IBTA packet; everything else must parse as one.
                if SackPacketRepr::parse(&buf).is_err() {
                    if let Err(e) = PacketRepr::parse(&Packet::new_unchecked(&buf[..])) {
                        panic!("emitted an unparsable packet: {e}");
                    }
                }
                let d = Dgram {
                    to,
                    src,
                    bytes: buf,
                };
                match fate.as_mut().map_or(0, |inp| inp.u8()) {
                    0..=199 => self.queue.push_back(d),
                    200..=219 => {}
                    220..=234 => {
                        self.queue.push_back(d.clone());
                        self.queue.push_back(d);
                    }
                    _ => self.held.push(d),
                }
            }
        }
        sent
    }

    fn deliver(&mut self) -> usize {
        let mut n = 0;
        while let Some(d) = self.queue.pop_front() {
            let node = &mut self.nodes[d.to];
            node.hca
                .handle_datagram(self.now, d.src, &d.bytes, &node.mem);
            n += 1;
        }
        n
    }

    fn release(&mut self, how: Release) {
        match how {
            Release::One(i) => {
                if !self.held.is_empty() {
                    let d = self.held.remove(i % self.held.len());
                    self.queue.push_back(d);
                }
            }
            Release::All => self.queue.extend(self.held.drain(..)),
            Release::Reversed => self.queue.extend(self.held.drain(..).rev()),
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.nodes.iter().filter_map(|n| n.hca.poll_timeout()).min()
    }

    fn fire_next_timer(&mut self) {
        if let Some(t) = self.next_deadline() {
            self.now = self.now.max(t);
            for n in &mut self.nodes {
                n.hca.handle_timeout(self.now, &n.mem);
            }
        }
    }

    /// Perfect wire: transmit and deliver until quiet, fire the next timer, repeat until no
    /// timer is armed. False if the budget ran out.
    fn run_until_idle(&mut self) -> bool {
        for _ in 0..SETTLE_BUDGET {
            let moved = self.transmit(usize::MAX, None) + self.deliver();
            if moved > 0 {
                continue;
            }
            if self.next_deadline().is_none() {
                return true;
            }
            self.fire_next_timer();
        }
        false
    }
}

fn send_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => WcOpcode::Send,
        SendOp::BindMw { .. } => WcOpcode::BindMw,
        SendOp::LocalInv { .. } => WcOpcode::LocalInv,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
        SendOp::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
    }
}

fn read(n: &Node, off: u64, len: usize) -> Vec<u8> {
    match n.mem.get(n.mr.lkey, off, len) {
        Some(v) => v,
        None => panic!("read {off}+{len} outside the MR"),
    }
}

/// The effects of WR `w`, which completed successfully.
fn check_effects(p: &Pair, w: &Planned) {
    let me = &p.nodes[w.from];
    let mut at = 0usize;
    for &(off, len) in &w.read_dest {
        let got = read(me, off, len as usize);
        assert_eq!(got, w.msg[at..at + len as usize], "READ {} data", w.wr_id);
        at += len as usize;
    }
    if let Some((slot, orig)) = w.atomic {
        let mut b = [0u8; 8];
        b.copy_from_slice(&read(me, slot, 8));
        assert_eq!(u64::from_ne_bytes(b), orig, "atomic {} result", w.wr_id);
    }
    if let Some(target) = w.write_target {
        let peer = &p.nodes[1 - w.from];
        assert_eq!(
            read(peer, target, w.len as usize),
            w.msg,
            "WRITE {} data",
            w.wr_id
        );
    }
}

/// One receive completion against the WR that consumed its WQE.
fn check_recv(p: &Pair, w: &Planned, wc: &WorkCompletion) {
    let Some((rid, imm, pieces)) = &w.recv else {
        panic!("receive completion without a consuming WR");
    };
    assert_eq!((wc.wr_id, wc.status), (*rid, WcStatus::Success), "{wc:?}");
    assert_eq!(wc.byte_len, w.len, "receive byte_len of {}", w.wr_id);
    let want_op = if w.write_target.is_some() {
        WcOpcode::RecvRdmaWithImm
    } else {
        WcOpcode::Recv
    };
    assert_eq!(wc.opcode, want_op);
    assert_eq!(wc.wc_flags.contains(WcFlags::WITH_IMM), imm.is_some());
    if let Some(imm) = imm {
        assert_eq!(wc.imm_data, *imm);
    }
    if w.write_target.is_none() {
        let node = &p.nodes[1 - w.from];
        let got: Vec<u8> = pieces
            .iter()
            .flat_map(|&(o, l)| read(node, o, l as usize))
            .collect();
        assert_eq!(
            &got[..w.len as usize],
            &w.msg[..],
            "received data of {}",
            w.wr_id
        );
        assert!(
            got[w.len as usize..].iter().all(|&b| b == 0),
            "bytes written past the message of {}",
            w.wr_id
        );
    }
}

fn check(p: &mut Pair, planned: &[Planned]) {
    assert!(p.queue.is_empty() && p.held.is_empty());
    let mut failed = [false; 2];
    for (side, side_failed) in failed.iter_mut().enumerate() {
        let mine: Vec<&Planned> = planned.iter().filter(|w| w.from == side).collect();
        let (scq, rcq) = (p.nodes[side].scq, p.nodes[side].rcq);
        let wcs = poll_all(&mut p.nodes[side].hca, scq);
        let state = ok(p.nodes[side].hca.query_qp(p.nodes[side].qpn), "query_qp").qp_state;
        let first_err = wcs.iter().position(|w| w.status != WcStatus::Success);
        let mut k = 0;
        for wc in &wcs[..first_err.unwrap_or(wcs.len())] {
            while k < mine.len() && !mine[k].signaled {
                k += 1;
            }
            assert!(k < mine.len(), "extra success {wc:?}");
            let w = mine[k];
            assert_eq!(wc.wr_id, w.wr_id, "success out of order or twice");
            assert_eq!(wc.opcode, send_opcode(&w.op));
            assert_eq!(wc.byte_len, w.len);
            check_effects(p, w);
            k += 1;
        }
        match first_err {
            None => {
                assert!(
                    mine[k..].iter().all(|w| !w.signaled),
                    "signaled WR lost: {:?}",
                    mine[k..].iter().map(|w| w.wr_id).collect::<Vec<_>>()
                );
                assert_eq!(
                    state,
                    QpState::Rts,
                    "side {side} ended in {state} with no error"
                );
            }
            Some(e) => {
                *side_failed = true;
                let err = &wcs[e];
                assert_eq!(err.status, WcStatus::RetryExcErr, "{err:?}");
                let at = mine.iter().position(|w| w.wr_id == err.wr_id);
                let Some(at) = at.filter(|&i| i >= k) else {
                    panic!("error for an unexpected WR: {err:?}");
                };
                assert!(mine[k..at].iter().all(|w| !w.signaled), "signaled WR lost");
                let flushed: Vec<_> = wcs[e + 1..].iter().map(|w| (w.wr_id, w.status)).collect();
                let want: Vec<_> = mine[at + 1..]
                    .iter()
                    .map(|w| (w.wr_id, WcStatus::WrFlushErr))
                    .collect();
                assert_eq!(flushed, want, "flush of side {side}");
                assert_eq!(state, QpState::Err);
            }
        }
        let consumers: Vec<&Planned> = planned
            .iter()
            .filter(|w| w.from != side && w.recv.is_some())
            .collect();
        let rwcs = poll_all(&mut p.nodes[side].hca, rcq);
        let n_ok = rwcs
            .iter()
            .take_while(|w| w.status == WcStatus::Success)
            .count();
        assert!(n_ok <= consumers.len(), "more receives than consumers");
        for (w, wc) in consumers.iter().zip(&rwcs[..n_ok]) {
            check_recv(p, w, wc);
        }
        let rest: Vec<_> = rwcs[n_ok..].iter().map(|w| (w.wr_id, w.status)).collect();
        if state == QpState::Err {
            let want: Vec<_> = consumers[n_ok..]
                .iter()
                .map(|w| (w.recv.as_ref().map_or(0, |r| r.0), WcStatus::WrFlushErr))
                .collect();
            assert_eq!(rest, want, "receive flush of side {side}");
        } else {
            assert!(rest.is_empty(), "receive errors without ERR: {rest:?}");
        }
    }
    if failed == [false, false] {
        // Every atomic executed exactly once, in order: the words hold the model's values.
        let mut words = [[0u64; 2]; 2];
        for w in planned {
            let t = 1 - w.from;
            match w.op {
                SendOp::AtomicCmpAndSwp {
                    remote_addr,
                    compare,
                    swap,
                    ..
                } => {
                    let i = ((remote_addr - p.nodes[t].mr.iova - WORDS) / 8) as usize;
                    if words[t][i] == compare {
                        words[t][i] = swap;
                    }
                }
                SendOp::AtomicFetchAndAdd {
                    remote_addr, add, ..
                } => {
                    let i = ((remote_addr - p.nodes[t].mr.iova - WORDS) / 8) as usize;
                    words[t][i] = words[t][i].wrapping_add(add);
                }
                _ => {}
            }
        }
        for (t, node) in p.nodes.iter().enumerate() {
            for (i, &want) in words[t].iter().enumerate() {
                let mut b = [0u8; 8];
                b.copy_from_slice(&read(node, WORDS + 8 * i as u64, 8));
                assert_eq!(u64::from_ne_bytes(b), want, "atomic word {i} of node {t}");
            }
        }
    }
}
