//! The modelled system: two [`Hca`]s with one or two connected RC QP pairs, their memory, the
//! datagrams in flight and the completions the application has polled.
//!
//! The set-up mirrors emu-proto's packet-level harness (`tests/common/mod.rs`, `Pair::with`)
//! call for call — same names, seeds, CQs, MR, PSNs and connection masks — so that a schedule
//! found here replays there packet for packet. Transmits are drained eagerly after every step,
//! a's first, as `Pair::transmit` does; the datagrams in flight are kept in emission order, so
//! an index into them is an index into the harness's held packets.
//!
//! This module only executes choices; [`crate::props`] judges states and [`crate::explore`]
//! decides which choices to try.

use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use emu_proto::{AtomicOp, CqId, Hca, HcaConfig, Instant, MAX_PACKET_LEN, Memory, MemoryFault};
use verbs_api::{
    AccessFlags, AhAttr, Gid, QpAttr, QpCap, QpInitAttr, QpState, RecvWr, SendOp, SendWr, Sge,
    WorkCompletion, connect,
};

use crate::config::{Config, Op, Recvs, Side};

/// The UDP port both nodes listen on.
pub(crate) const PORT: u16 = 4791;
/// Length of the MR each node registers (as the harness's `MR_LEN`); the model backs only
/// the slots it uses, so an engine access past them faults (and is reported as an error).
const MR_LEN: u64 = 64 * 1024;
/// Virtual address of each node's MR (the harness's first `reg`).
pub(crate) const MR_IOVA: u64 = 0x1000_0000;
/// a's send PSN (`Opts::default().a_psn`).
const A_PSN: u32 = 0x100;
/// b's send PSN.
const B_PSN: u32 = 0x5000;
/// More datagrams than this from one drain is a transmit storm.
pub(crate) const MAX_BURST: usize = 256;
/// Receive WQEs have `wr_id` = this + the index of the work request that consumes them.
pub const RECV_WR_BASE: u64 = 1000;

/// The IP address of a node.
pub(crate) fn ip_of(side: Side) -> Ipv4Addr {
    match side {
        Side::A => Ipv4Addr::new(127, 0, 0, 1),
        Side::B => Ipv4Addr::new(127, 0, 0, 2),
    }
}

/// One network choice, the edge label of the state graph.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Choice {
    /// Deliver the in-flight datagram at this index.
    Deliver(usize),
    /// Lose it.
    Drop(usize),
    /// Put a copy of it at the end of the flight.
    Duplicate(usize),
    /// Advance time to the earliest deadline of either HCA and fire what is due.
    Fire,
    /// The application at `side` posts the next receive of pair `pair`.
    PostRecv {
        /// The node that posts.
        side: Side,
        /// The QP pair.
        pair: usize,
    },
}

/// A datagram on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Datagram {
    /// The sending node.
    pub from: Side,
    /// Source address and port.
    pub src: SocketAddr,
    /// The RoCEv2 UDP payload.
    pub bytes: Vec<u8>,
}

/// A node's memory: the used prefix of its one MR, plus how often each 8-byte word was the
/// target of an atomic (to check "at most once").
#[derive(Clone, Debug, Default)]
pub struct ModelMemory {
    key: u32,
    bytes: RefCell<Vec<u8>>,
    atomics: RefCell<Vec<u8>>,
}

impl ModelMemory {
    fn range(
        &self,
        key: u32,
        offset: u64,
        len: usize,
    ) -> Result<std::ops::Range<usize>, MemoryFault> {
        let start = usize::try_from(offset).map_err(|_| MemoryFault)?;
        let end = start.checked_add(len).ok_or(MemoryFault)?;
        if key != self.key || end > self.bytes.borrow().len() {
            return Err(MemoryFault);
        }
        Ok(start..end)
    }

    /// `len` bytes at `offset`.
    pub fn get(&self, offset: u64, len: usize) -> Vec<u8> {
        let b = self.bytes.borrow();
        usize::try_from(offset)
            .ok()
            .and_then(|s| b.get(s..s.checked_add(len)?))
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }

    /// The native-endian word at `offset`.
    pub fn word(&self, offset: u64) -> u64 {
        let v = self.get(offset, 8);
        v.try_into().map(u64::from_ne_bytes).unwrap_or(0)
    }

    /// Times the word at `offset` was the target of an atomic.
    pub fn atomic_count(&self, offset: u64) -> u8 {
        let i = usize::try_from(offset / 8).unwrap_or(usize::MAX);
        self.atomics.borrow().get(i).copied().unwrap_or(0)
    }

    fn put(&self, offset: u64, data: &[u8]) {
        let key = self.key;
        if let Ok(r) = self.range(key, offset, data.len()) {
            self.bytes.borrow_mut()[r].copy_from_slice(data);
        }
    }

    fn hash_into(&self, h: &mut impl Hasher) {
        self.bytes.borrow().hash(h);
        self.atomics.borrow().hash(h);
    }
}

impl Memory for ModelMemory {
    fn read(&self, key: u32, offset: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        let r = self.range(key, offset, buf.len())?;
        buf.copy_from_slice(&self.bytes.borrow()[r]);
        Ok(())
    }

    fn write(&self, key: u32, offset: u64, data: &[u8]) -> Result<(), MemoryFault> {
        let r = self.range(key, offset, data.len())?;
        self.bytes.borrow_mut()[r].copy_from_slice(data);
        Ok(())
    }

    fn atomic(&self, key: u32, offset: u64, op: AtomicOp) -> Result<u64, MemoryFault> {
        if offset % 8 != 0 {
            return Err(MemoryFault);
        }
        let r = self.range(key, offset, 8)?;
        let mut bytes = self.bytes.borrow_mut();
        let word = &mut bytes[r];
        let orig = u64::from_ne_bytes(word.try_into().map_err(|_| MemoryFault)?);
        if let Some(new) = op.apply(orig) {
            word.copy_from_slice(&new.to_ne_bytes());
        }
        let i = usize::try_from(offset / 8).map_err(|_| MemoryFault)?;
        if let Some(c) = self.atomics.borrow_mut().get_mut(i) {
            *c = c.saturating_add(1);
        }
        Ok(orig)
    }
}

/// One HCA, its memory and what its application polled.
#[derive(Clone, Debug)]
pub struct Node {
    /// The engine.
    pub hca: Hca,
    /// The MR's bytes.
    pub mem: ModelMemory,
    /// QP number of each pair's QP on this node.
    pub qpns: Vec<u32>,
    scq: CqId,
    rcq: CqId,
    /// The MR's key (lkey = rkey).
    pub key: u32,
    /// Send completions polled, per pair, in order.
    pub send_wcs: Vec<Vec<WorkCompletion>>,
    /// Receive completions polled, per pair, in order.
    pub recv_wcs: Vec<Vec<WorkCompletion>>,
    /// Receives posted so far, per pair.
    pub recvs_posted: Vec<usize>,
}

impl Node {
    /// The pair index of QP `qpn`.
    fn pair_of(&self, qpn: u32) -> Option<usize> {
        self.qpns.iter().position(|&q| q == qpn)
    }

    /// The state of pair `pair`'s QP.
    pub fn qp_state(&self, pair: usize) -> Option<QpState> {
        let qpn = *self.qpns.get(pair)?;
        self.hca.query_qp(qpn).ok().map(|a| a.qp_state)
    }
}

/// Test data of work request `k`: `len` bytes, none zero.
pub fn pattern(k: usize, len: u32) -> Vec<u8> {
    (0..len as usize)
        .map(|i| 0x80 | ((k * 16 + i) & 0x7F) as u8)
        .collect()
}

/// The initial value of work request `k`'s atomic target.
pub fn atomic_init(k: usize) -> u64 {
    0x1111_0000_0000_0000 + (k as u64) * 0x100
}

/// What FETCH_ADD `k` adds.
pub fn atomic_add(k: usize) -> u64 {
    0x10 + k as u64
}

/// What CMP_SWAP `k` swaps in (its compare is [`atomic_init`]).
pub fn atomic_swap(k: usize) -> u64 {
    0xABCD_0000 + k as u64
}

/// The immediate data of WRITE_WITH_IMM `k`.
pub fn imm_of(k: usize) -> u32 {
    0xC0DE_0000 + k as u32
}

/// The whole system.
#[derive(Clone, Debug)]
pub struct System {
    /// a and b.
    pub nodes: [Node; 2],
    /// Virtual time.
    pub now: Instant,
    /// Datagrams in flight, in emission order (duplicates appended).
    pub flight: Vec<Datagram>,
    /// Datagrams dropped so far.
    pub drops: u8,
    /// Datagrams duplicated so far.
    pub dups: u8,
    /// Drops, duplicates, timer firings and out-of-order deliveries so far: each may cost the
    /// QPs at most one retry, which is what the fairness property allows for.
    pub disturbances: u32,
}

impl System {
    /// Builds both nodes, connects the pairs, fills memory, posts the receives (if
    /// [`Recvs::Posted`]) and every work request, and drains the first transmits.
    ///
    /// Errors: the engine refused the set-up (a configuration it does not support).
    pub fn new(cfg: &Config) -> Result<System, String> {
        let mut nodes = [new_node(cfg, Side::A)?, new_node(cfg, Side::B)?];
        for pair in 0..cfg.pairs {
            let (qa, qb) = (nodes[0].qpns[pair], nodes[1].qpns[pair]);
            connect_qp(cfg, &mut nodes[0].hca, qa, Side::A, qb);
            connect_qp(cfg, &mut nodes[1].hca, qb, Side::B, qa);
        }
        let mut sys = System {
            nodes,
            now: Instant::ZERO,
            flight: Vec::new(),
            drops: 0,
            dups: 0,
            disturbances: 0,
        };
        sys.fill_memory(cfg);
        if cfg.recvs == Recvs::Posted {
            sys.post_all_recvs(cfg);
        }
        for (k, wr) in cfg.wrs.iter().enumerate() {
            sys.post_send(cfg, k, wr.from, wr.pair);
        }
        sys.settle();
        Ok(sys)
    }

    fn fill_memory(&mut self, cfg: &Config) {
        let slot = cfg.slot();
        for (k, wr) in cfg.wrs.iter().enumerate() {
            let target = cfg.target(k);
            let mem = &self.nodes[wr.from.peer().index()].mem;
            match wr.op {
                Op::Read => mem.put(target, &pattern(k, cfg.len)),
                Op::FetchAdd | Op::CmpSwap => mem.put(target, &atomic_init(k).to_ne_bytes()),
                Op::Write | Op::WriteImm => {
                    self.nodes[wr.from.index()]
                        .mem
                        .put(slot * k as u64, &pattern(k, cfg.len));
                }
                Op::Send => self.nodes[wr.from.index()]
                    .mem
                    .put(slot * k as u64, &pattern(k, cfg.len)),
            }
        }
    }

    fn post_send(&mut self, cfg: &Config, k: usize, side: Side, pair: usize) {
        let rkey = self.nodes[side.peer().index()].key;
        let node = &mut self.nodes[side.index()];
        let slot = cfg.slot();
        let remote_addr = MR_IOVA + cfg.target(k);
        let op = match cfg.wrs[k].op {
            Op::Send => SendOp::Send,
            Op::Write => SendOp::RdmaWrite { remote_addr, rkey },
            Op::WriteImm => SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm: imm_of(k),
            },
            Op::Read => SendOp::RdmaRead { remote_addr, rkey },
            Op::FetchAdd => SendOp::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add: atomic_add(k),
            },
            Op::CmpSwap => SendOp::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare: atomic_init(k),
                swap: atomic_swap(k),
            },
        };
        let sge = [Sge {
            addr: MR_IOVA + slot * k as u64,
            length: cfg.len_of(cfg.wrs[k].op),
            lkey: node.key,
        }];
        let qpn = node.qpns[pair];
        let posted = node
            .hca
            .post_send(self.now, qpn, &[SendWr::new(k as u64, op, &sge)]);
        debug_assert!(posted.is_ok(), "post_send {k}: {posted:?}");
    }

    /// The work requests whose receives `side` posts on `pair`, in posting order.
    pub fn recv_list(cfg: &Config, side: Side, pair: usize) -> Vec<usize> {
        cfg.wrs
            .iter()
            .enumerate()
            .filter(|(_, w)| w.from == side.peer() && w.pair == pair && w.op.consumes_recv())
            .map(|(k, _)| k)
            .collect()
    }

    /// Posts the next unposted receive of `side` on `pair`; false if none is left.
    pub fn post_next_recv(&mut self, cfg: &Config, side: Side, pair: usize) -> bool {
        let list = System::recv_list(cfg, side, pair);
        let node = &mut self.nodes[side.index()];
        let Some(&k) = list.get(node.recvs_posted[pair]) else {
            return false;
        };
        let slot = cfg.slot();
        let sge = [Sge {
            addr: MR_IOVA + slot * k as u64 + slot / 2,
            length: cfg.len,
            lkey: node.key,
        }];
        let qpn = node.qpns[pair];
        let posted = node
            .hca
            .post_recv(qpn, &[RecvWr::new(RECV_WR_BASE + k as u64, &sge)]);
        node.recvs_posted[pair] += 1;
        // Only a QP in RESET or on an SRQ refuses a receive, and the model has neither.
        debug_assert!(posted.is_ok(), "post_recv {k}: {posted:?}");
        true
    }

    /// Posts every receive not yet posted.
    pub fn post_all_recvs(&mut self, cfg: &Config) {
        for side in [Side::A, Side::B] {
            for pair in 0..cfg.pairs {
                while self.post_next_recv(cfg, side, pair) {}
            }
        }
    }

    /// True if some receive is still to be posted.
    pub fn recv_pending(&self, cfg: &Config, side: Side, pair: usize) -> bool {
        self.nodes[side.index()].recvs_posted[pair] < System::recv_list(cfg, side, pair).len()
    }

    /// The earliest deadline of either HCA.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.nodes.iter().filter_map(|n| n.hca.poll_timeout()).min()
    }

    /// The choices available in this state, within the budgets.
    pub fn choices(&self, cfg: &Config) -> Vec<Choice> {
        let mut out = Vec::new();
        let n = self.flight.len();
        out.extend((0..n).map(Choice::Deliver));
        if self.drops < cfg.loss_budget {
            out.extend((0..n).map(Choice::Drop));
        }
        if self.dups < cfg.dup_budget {
            out.extend((0..n).map(Choice::Duplicate));
        }
        if self.next_deadline().is_some() {
            out.push(Choice::Fire);
        }
        if cfg.recvs == Recvs::Late {
            for side in [Side::A, Side::B] {
                for pair in 0..cfg.pairs {
                    if self.recv_pending(cfg, side, pair) {
                        out.push(Choice::PostRecv { side, pair });
                    }
                }
            }
        }
        out
    }

    /// Applies `choice`, then drains transmits, completions and events. Errors: a transmit
    /// storm, a choice that does not apply.
    pub fn step(&mut self, cfg: &Config, choice: Choice) -> Result<(), String> {
        match choice {
            Choice::Deliver(i) => {
                if i >= self.flight.len() {
                    return Err(format!("no datagram {i} in flight"));
                }
                let d = self.flight.remove(i);
                if self.flight[..i].iter().any(|e| e.from == d.from) {
                    self.disturbances += 1;
                }
                self.deliver(&d);
            }
            Choice::Drop(i) => {
                if i >= self.flight.len() {
                    return Err(format!("no datagram {i} in flight"));
                }
                self.flight.remove(i);
                self.drops += 1;
                self.disturbances += 1;
            }
            Choice::Duplicate(i) => {
                let d = self
                    .flight
                    .get(i)
                    .cloned()
                    .ok_or_else(|| format!("no datagram {i} in flight"))?;
                self.flight.push(d);
                self.dups += 1;
                self.disturbances += 1;
            }
            Choice::Fire => {
                let t = self.next_deadline().ok_or("no timer armed")?;
                self.now = self.now.max(t);
                self.disturbances += 1;
                for node in &mut self.nodes {
                    node.hca.handle_timeout(self.now, &node.mem);
                }
            }
            Choice::PostRecv { side, pair } => {
                if !self.post_next_recv(cfg, side, pair) {
                    return Err("no receive left to post".into());
                }
            }
        }
        self.drain()
    }

    fn deliver(&mut self, d: &Datagram) {
        let node = &mut self.nodes[d.from.peer().index()];
        node.hca
            .handle_datagram(self.now, d.src, &d.bytes, &node.mem);
    }

    /// Drains transmits (a then b), completions and async events.
    fn drain(&mut self) -> Result<(), String> {
        let mut buf = vec![0u8; MAX_PACKET_LEN];
        for side in [Side::A, Side::B] {
            let node = &mut self.nodes[side.index()];
            let mut burst = 0;
            while let Some(tx) = node.hca.poll_transmit(self.now, &node.mem, &mut buf) {
                burst += 1;
                if burst > MAX_BURST {
                    return Err(format!(
                        "transmit storm: more than {MAX_BURST} datagrams from {side:?} in one step"
                    ));
                }
                self.flight.push(Datagram {
                    from: side,
                    src: SocketAddr::new(IpAddr::V4(ip_of(side)), tx.src_port),
                    bytes: buf[..tx.len].to_vec(),
                });
            }
        }
        for node in &mut self.nodes {
            poll_into(node, true);
            poll_into(node, false);
            while node.hca.poll_event().is_some() {}
        }
        Ok(())
    }

    /// Drains without a choice (after set-up). A storm here is reported by the first step.
    fn settle(&mut self) {
        let _ = self.drain();
    }

    /// The state's fingerprint: both engines' canonical encodings (time rebased to `now`,
    /// counters left out), memory and atomic counts, the in-flight multiset (sorted), the
    /// budgets used, the completions polled and the receives posted. `disturbances` enters
    /// only as "more than `cap`", the one thing the properties ask of it.
    pub fn fingerprint(&self, cap: u32) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        for node in &self.nodes {
            node.hca.canonical_state(self.now).hash(&mut h);
            node.mem.hash_into(&mut h);
            node.send_wcs.hash(&mut h);
            node.recv_wcs.hash(&mut h);
            node.recvs_posted.hash(&mut h);
        }
        let mut flight: Vec<&Datagram> = self.flight.iter().collect();
        flight.sort();
        flight.hash(&mut h);
        (self.drops, self.dups, self.disturbances.min(cap + 1)).hash(&mut h);
        h.finish()
    }
}

fn poll_into(node: &mut Node, send: bool) {
    let cq = if send { node.scq } else { node.rcq };
    let mut buf = [WorkCompletion::default(); 16];
    loop {
        let n = node.hca.poll_cq(cq, &mut buf).unwrap_or(0);
        for wc in &buf[..n] {
            let pair = node.pair_of(wc.qp_num).unwrap_or(usize::MAX);
            let lists = if send {
                &mut node.send_wcs
            } else {
                &mut node.recv_wcs
            };
            if let Some(list) = lists.get_mut(pair) {
                list.push(*wc);
            }
        }
        if n < buf.len() {
            break;
        }
    }
}

/// Builds one node as the harness's `Node::new` does, plus the QPs of further pairs.
fn new_node(cfg: &Config, side: Side) -> Result<Node, String> {
    let (name, seed) = match side {
        Side::A => ("a", 1),
        Side::B => ("b", 2),
    };
    let mut hca = Hca::new(HcaConfig::new(name, Gid::from_ip(ip_of(side).into()), seed));
    let (scq, rcq, qpns, key) =
        build_objects(cfg, &mut hca).map_err(|e| format!("set-up of {side:?}: {e}"))?;
    let used = usize::try_from(cfg.slot()).unwrap_or(0) * cfg.wrs.len().max(1);
    Ok(Node {
        hca,
        mem: ModelMemory {
            key,
            bytes: RefCell::new(vec![0; used]),
            atomics: RefCell::new(vec![0; used.div_ceil(8)]),
        },
        qpns,
        scq,
        rcq,
        key,
        send_wcs: vec![Vec::new(); cfg.pairs],
        recv_wcs: vec![Vec::new(); cfg.pairs],
        recvs_posted: vec![0; cfg.pairs],
    })
}

/// Every access right.
const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// The harness's QP capabilities.
const CAP: QpCap = QpCap {
    max_send_wr: 64,
    max_recv_wr: 64,
    max_send_sge: 4,
    max_recv_sge: 4,
    max_inline_data: 256,
};

fn build_objects(cfg: &Config, hca: &mut Hca) -> verbs_api::Result<(CqId, CqId, Vec<u32>, u32)> {
    let pd = hca.alloc_pd()?;
    let scq = hca.create_cq(1024, None)?;
    let rcq = hca.create_cq(1024, None)?;
    let init = QpInitAttr::rc(CAP);
    let first = hca.create_qp(pd, scq, rcq, None, &init)?;
    let mr = hca.reg_mr(pd, MR_IOVA, MR_LEN, ALL_ACCESS)?;
    let mut qpns = vec![first];
    for _ in 1..cfg.pairs {
        qpns.push(hca.create_qp(pd, scq, rcq, None, &init)?);
    }
    Ok((scq, rcq, qpns, mr.lkey))
}

/// RESET → INIT → RTR → RTS towards the peer, with the harness's attributes.
fn connect_qp(cfg: &Config, hca: &mut Hca, qpn: u32, side: Side, peer_qpn: u32) {
    let (sq_psn, rq_psn) = match side {
        Side::A => (A_PSN, B_PSN),
        Side::B => (B_PSN, A_PSN),
    };
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ALL_ACCESS,
        path_mtu: cfg.mtu,
        dest_qp_num: peer_qpn,
        rq_psn,
        sq_psn,
        max_dest_rd_atomic: cfg.max_rd_atomic,
        max_rd_atomic: cfg.max_rd_atomic,
        min_rnr_timer: cfg.min_rnr_timer,
        timeout: cfg.timeout,
        retry_cnt: cfg.retry_cnt,
        rnr_retry: cfg.rnr_retry,
        ah_attr: AhAttr {
            dgid: Gid::from_ip(ip_of(side.peer()).into()),
            udp_dport: PORT,
            ..AhAttr::default()
        },
        recovery: cfg.recovery,
        ..QpAttr::default()
    };
    let init = if cfg.recovery == verbs_api::Recovery::Ibta {
        connect::INIT_MASK
    } else {
        connect::INIT_MASK | verbs_api::QpAttrMask::RECOVERY
    };
    let steps = [
        (QpState::Init, init),
        (QpState::Rtr, connect::RTR_MASK),
        (QpState::Rts, connect::RTS_MASK),
    ];
    for (qp_state, mask) in steps {
        let r = hca.modify_qp(Instant::ZERO, qpn, &QpAttr { qp_state, ..attr }, mask);
        debug_assert!(r.is_ok(), "modify_qp to {qp_state:?}: {r:?}");
    }
}
