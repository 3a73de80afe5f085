//! Fuzz target `responder`: hostile request packets against one RC QP in RTS
//! (rc-transport.md §2.6, §4).

use core::net::{IpAddr, SocketAddr};
use std::collections::HashMap;

use emu_proto::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, IethRepr, ImmDtRepr, NakCode, Opcode,
    Packet, PacketRepr, Position, Psn, RethRepr, Syndrome, fill_icrc, ip::udp_sport, pad_len,
};
use emu_proto::{CqId, Hca, HcaConfig, Instant, MAX_PACKET_LEN, MrInfo, PdId, SrqId};
use verbs_api::{
    AccessFlags, AhAttr, Gid, Mtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, RecvWr, Sge,
    SrqAttr, WcOpcode, WcStatus, WorkCompletion, connect,
};

use super::common::{
    A_IP, Access, AccessKind, B_IP, C_IP, Input, PEER_QPN, PORT, TestMemory, emit, icrc_ok, ip_ctx,
    pattern, poll_all,
};

/// Out-of-sequence requests of one gap between two repeated sequence NAKs (the engine's
/// `responder::SEQ_NAK_REPEAT`, restated: an oracle does not call the code it checks).
const SEQ_NAK_REPEAT: u32 = 32;

/// Actions per input at most.
const MAX_ACTIONS: usize = 400;

/// Request opcodes the generator picks from, then a few responses (which the responder must
/// leave alone: they go to the completer of a QP that sent nothing).
const OPS: [Opcode; 20] = [
    Opcode::SendOnly,
    Opcode::SendFirst,
    Opcode::SendMiddle,
    Opcode::SendLast,
    Opcode::SendLastWithImmediate,
    Opcode::SendOnlyWithImmediate,
    Opcode::RdmaWriteOnly,
    Opcode::RdmaWriteFirst,
    Opcode::RdmaWriteMiddle,
    Opcode::RdmaWriteLast,
    Opcode::RdmaWriteLastWithImmediate,
    Opcode::RdmaWriteOnlyWithImmediate,
    Opcode::RdmaReadRequest,
    Opcode::CompareSwap,
    Opcode::FetchAdd,
    Opcode::SendLastWithInvalidate,
    Opcode::SendOnlyWithInvalidate,
    Opcode::Acknowledge,
    Opcode::RdmaReadResponseOnly,
    Opcode::AtomicAcknowledge,
];

/// Fuzz target `responder`: an arbitrary QP configuration (path MTU, access flags,
/// `max_dest_rd_atomic`, `min_rnr_timer`, `rq_psn`, RQ or SRQ) and 1–4 MRs (lengths, access,
/// PD, iova), then up to 400 actions: request packets built with the codec and a valid ICRC
/// (opcode, PSN near ePSN, RETH/AtomicETH aimed at the MRs or anywhere, payload; sometimes a
/// foreign P_Key, QPN or source, or a spoiled ICRC), raw datagrams, resends, receive WQEs
/// (valid or not), MR registration, deregistration and key-index reuse, SQD/RTS toggles,
/// reconnection with new parameters and ERR. Transmits are drained after every action.
///
/// Asserts, besides "never panics":
/// * memory: every access goes to a live MR of the QP's PD, inside it, with the right the
///   request needs (REMOTE_WRITE for WRITE payload, LOCAL_WRITE for SEND payload,
///   REMOTE_ATOMIC, REMOTE_READ for READ responses), and only while handling a request of that
///   kind; duplicates are never re-executed;
/// * ePSN (`Hca::debug_epsn`) only moves forward: by 1 for an accepted in-order SEND, WRITE or
///   atomic, by the response packet count for a READ, not at all otherwise;
/// * NAKs: a sequence NAK carries ePSN, only for a PSN after ePSN, once per gap; an RNR NAK
///   only answers SEND_FIRST/SEND_ONLY*/WRITE_*_WITH_IMMEDIATE with no receive WQE, carries
///   the request's PSN and `min_rnr_timer` and leaves the QP in RTS; a remote access NAK only
///   when the R_Key, bounds, PD or rights check really fails; a remote operational NAK only
///   for a receive WQE with an unusable SGE (LOC_PROT_ERR at the responder); every other NAK is for the in-order request and
///   moves the QP to ERR; duplicates are never NAKed (except a READ whose MR is gone);
/// * responses: in-order SEND/WRITE are ACKed with their PSN iff AckReq; READ responses carry
///   consecutive PSNs, the right opcodes and lengths and the MR's bytes; an atomic is
///   answered once and a duplicate replays the same original value; nothing answers a
///   foreign or out-of-state packet;
/// * receive completions come at most once, in posting order, with legal statuses.
pub fn responder(data: &[u8]) {
    let mut inp = Input::new(data);
    let mut r = Responder::new(&mut inp);
    for _ in 0..MAX_ACTIONS {
        if inp.is_empty() {
            break;
        }
        r.action(&mut inp);
    }
}

fn ok<T>(r: verbs_api::Result<T>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what} failed: {e}"),
    }
}

/// An MR as the target registered it.
#[derive(Copy, Clone, Debug)]
struct Mr {
    info: MrInfo,
    live: bool,
}

/// An RDMA WRITE in progress, as the model sees it.
#[derive(Copy, Clone, Debug)]
struct OpenWrite {
    /// R_Key of the target MR (0 for a zero-length WRITE, which names no MR).
    key: u32,
    remaining: u64,
}

/// The fields of an in-scope request the checks need.
#[derive(Copy, Clone, Debug)]
struct Req {
    op: Opcode,
    psn: Psn,
    ack_req: bool,
    reth: Option<RethRepr>,
    atomic: Option<AtomicEthRepr>,
    payload_len: u64,
}

/// One emitted response.
#[derive(Clone, Debug)]
struct Out {
    op: Opcode,
    psn: Psn,
    syndrome: Option<Syndrome>,
    orig: Option<u64>,
    payload: Vec<u8>,
}

struct Responder {
    hca: Hca,
    mem: TestMemory,
    pds: [PdId; 2],
    cq: CqId,
    srq: Option<SrqId>,
    qpn: u32,
    now: Instant,
    mrs: Vec<Mr>,
    mtu: u32,
    min_rnr_timer: u8,
    // ---- model ----
    epsn: Psn,
    /// The ePSN a sequence NAK was sent for (the gap's first NAK).
    seq_nak_for: Option<Psn>,
    /// The PSN of the gap's latest out-of-sequence request, and how many came since the last
    /// sequence NAK: the responder repeats its NAK when a request does not follow the previous
    /// one (the requester went back) and after every `SEQ_NAK_REPEAT` further ones
    /// (DIVERGENCES.md #19).
    gap_last: Psn,
    gap_unanswered: u32,
    /// Receive WQEs available (RQ or SRQ); `None` when the model lost track.
    avail: Option<u32>,
    open_send: bool,
    open_write: Option<OpenWrite>,
    /// Original values of executed atomics by PSN (a duplicate must replay the same).
    atomics: HashMap<u32, u64>,
    recvs: HashMap<u64, Vec<Sge>>,
    next_wr_id: u64,
    last_recv_wc: Option<u64>,
    last_datagram: Option<(SocketAddr, Vec<u8>)>,
}

impl Responder {
    fn new(inp: &mut Input<'_>) -> Responder {
        let seed = u64::from(inp.u8());
        let mut hca = Hca::new(HcaConfig::new("b", Gid::from_ip(B_IP.into()), seed));
        let pds = [
            ok(hca.alloc_pd(), "alloc_pd"),
            ok(hca.alloc_pd(), "alloc_pd"),
        ];
        let cq = ok(hca.create_cq(4096, None), "create_cq");
        let srq = (inp.u8() % 4 == 3).then(|| {
            let attr = SrqAttr {
                max_wr: 64,
                max_sge: 4,
                srq_limit: 0,
            };
            ok(hca.create_srq(pds[0], &attr), "create_srq")
        });
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 0,
        };
        let qpn = ok(
            hca.create_qp(pds[0], cq, cq, srq, &QpInitAttr::rc(cap)),
            "create_qp",
        );
        let mut r = Responder {
            hca,
            mem: TestMemory::recording(),
            pds,
            cq,
            srq,
            qpn,
            now: Instant::ZERO,
            mrs: Vec::new(),
            mtu: 256,
            min_rnr_timer: 0,
            epsn: Psn::new(0),
            seq_nak_for: None,
            gap_last: Psn::new(0),
            gap_unanswered: 0,
            avail: Some(0),
            open_send: false,
            open_write: None,
            atomics: HashMap::new(),
            recvs: HashMap::new(),
            next_wr_id: 1,
            last_recv_wc: None,
            last_datagram: None,
        };
        for _ in 0..=inp.below(4) {
            r.reg_mr(inp);
        }
        r.connect(inp);
        for _ in 0..inp.below(8) {
            r.post_recv(inp, true);
        }
        r
    }

    fn state(&self) -> QpState {
        ok(self.hca.query_qp(self.qpn), "query_qp").qp_state
    }

    fn hca_epsn(&self) -> Psn {
        match self.hca.debug_epsn(self.qpn) {
            Some(v) => Psn::new(v),
            None => panic!("debug_epsn: no QP {:#x}", self.qpn),
        }
    }

    fn peer(&self) -> SocketAddr {
        SocketAddr::new(A_IP.into(), udp_sport(PEER_QPN, self.qpn))
    }

    fn me() -> SocketAddr {
        SocketAddr::new(B_IP.into(), PORT)
    }

    // ---- setup actions -------------------------------------------------------------------

    fn reg_mr(&mut self, inp: &mut Input<'_>) {
        let len = 1 + u64::from(inp.u16() % 12288);
        let bits = !inp.u8();
        let mut access = AccessFlags::empty();
        for (bit, flag) in [
            (1, AccessFlags::LOCAL_WRITE),
            (2, AccessFlags::REMOTE_WRITE),
            (4, AccessFlags::REMOTE_READ),
            (8, AccessFlags::REMOTE_ATOMIC),
        ] {
            if bits & bit != 0 {
                access |= flag;
            }
        }
        let pd = self.pds[usize::from(inp.u8() % 5 == 4)];
        let iova = match inp.below(4) {
            0 | 1 => 0x1000_0000 * (self.mrs.len() as u64 + 1),
            2 => inp.u64(),
            _ => u64::MAX - len - u64::from(inp.u8()),
        };
        // Fails for REMOTE_WRITE/ATOMIC without LOCAL_WRITE or a wrapping range: fine.
        if let Ok(info) = self.hca.reg_mr(pd, iova, len, access) {
            self.mem.insert(info.lkey, len as usize);
            self.mrs.push(Mr { info, live: true });
        }
    }

    fn dereg_mr(&mut self, inp: &mut Input<'_>) {
        let live: Vec<usize> = (0..self.mrs.len()).filter(|&i| self.mrs[i].live).collect();
        if live.is_empty() {
            return;
        }
        let i = live[inp.index(live.len())];
        let key = self.mrs[i].info.lkey;
        ok(self.hca.dereg_mr(key), "dereg_mr");
        self.mem.remove(key);
        self.mrs[i].live = false;
    }

    /// Frees enough MR indices that the next registration reuses the oldest freed one (the
    /// table reuses an index after 64 frees), then registers an MR.
    fn churn(&mut self, inp: &mut Input<'_>) {
        for _ in 0..64 {
            let info = ok(
                self.hca
                    .reg_mr(self.pds[0], 0x7000_0000, 64, AccessFlags::LOCAL_WRITE),
                "reg_mr",
            );
            ok(self.hca.dereg_mr(info.lkey), "dereg_mr");
        }
        self.reg_mr(inp);
    }

    /// RESET (if needed) → INIT → RTR → RTS with parameters from the input.
    fn connect(&mut self, inp: &mut Input<'_>) {
        if self.state() != QpState::Reset {
            let attr = QpAttr {
                qp_state: QpState::Reset,
                ..QpAttr::default()
            };
            ok(
                self.hca
                    .modify_qp(self.now, self.qpn, &attr, QpAttrMask::STATE),
                "modify to RESET",
            );
        }
        let mtu = [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ][inp.index(5)];
        let bits = !inp.u8();
        let mut access = AccessFlags::LOCAL_WRITE;
        for (bit, flag) in [
            (2, AccessFlags::REMOTE_WRITE),
            (4, AccessFlags::REMOTE_READ),
            (8, AccessFlags::REMOTE_ATOMIC),
        ] {
            if bits & bit != 0 {
                access |= flag;
            }
        }
        let max_dest_rd_atomic = match inp.below(8) {
            0 => 4,
            1 => 0,
            2 => 1,
            3 => 128,
            n => n as u8,
        };
        let min_rnr_timer = inp.below(32) as u8;
        let rq_psn = match inp.below(4) {
            0 => 0x100,
            1 => 0xFF_FFF0 + inp.below(16),
            _ => inp.u24(),
        };
        let attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: access,
            path_mtu: mtu,
            dest_qp_num: PEER_QPN,
            rq_psn,
            max_dest_rd_atomic,
            min_rnr_timer,
            ah_attr: AhAttr {
                dgid: Gid::from_ip(A_IP.into()),
                udp_dport: PORT,
                ..AhAttr::default()
            },
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: 0,
            max_rd_atomic: 1,
            ..QpAttr::default()
        };
        for (state, mask) in [
            (QpState::Init, connect::INIT_MASK),
            (QpState::Rtr, connect::RTR_MASK),
            (QpState::Rts, connect::RTS_MASK),
        ] {
            let a = QpAttr {
                qp_state: state,
                ..attr
            };
            ok(
                self.hca.modify_qp(self.now, self.qpn, &a, mask),
                "connect modify",
            );
        }
        self.mtu = mtu.bytes();
        self.min_rnr_timer = min_rnr_timer;
        self.epsn = Psn::new(rq_psn);
        assert_eq!(self.hca_epsn(), self.epsn, "ePSN after RTR is not rq_psn");
        self.seq_nak_for = None;
        self.open_send = false;
        self.open_write = None;
        self.atomics.clear();
        if self.srq.is_none() {
            // RESET cleared the RQ without completions.
            self.avail = Some(0);
        }
    }

    /// Posts one receive WR with 0–3 SGEs, aimed inside the MRs (`valid`) or anywhere.
    fn post_recv(&mut self, inp: &mut Input<'_>, valid: bool) {
        let mut sges = Vec::new();
        for _ in 0..inp.below(4) {
            let k = inp.index(self.mrs.len() + 1);
            let sge = match self.mrs.get(k) {
                Some(mr) if valid => {
                    let len = mr.info.length;
                    let off = u64::from(inp.u16()) % len;
                    let l = u64::from(inp.u16()) % (len - off + 1);
                    Sge {
                        addr: mr.info.iova.wrapping_add(off),
                        length: l as u32,
                        lkey: mr.info.lkey,
                    }
                }
                Some(mr) => Sge {
                    addr: mr.info.iova.wrapping_add(u64::from(inp.u16())),
                    length: u32::from(inp.u16()),
                    lkey: if inp.u8() & 1 == 0 {
                        mr.info.lkey
                    } else {
                        inp.u32()
                    },
                },
                None => Sge {
                    addr: inp.u64(),
                    length: u32::from(inp.u16()),
                    lkey: inp.u32(),
                },
            };
            sges.push(sge);
        }
        let wr_id = self.next_wr_id;
        self.next_wr_id += 1;
        let state = self.state();
        let wr = [RecvWr::new(wr_id, &sges)];
        let posted = match self.srq {
            Some(srq) => self.hca.post_srq_recv(srq, &wr).is_ok(),
            None => self.hca.post_recv(self.qpn, &wr).is_ok(),
        };
        if posted {
            self.recvs.insert(wr_id, sges);
            // In ERR a posted WR completes at once with a flush (RQ only).
            if self.srq.is_some() || state != QpState::Err {
                self.avail = self.avail.map(|a| a + 1);
            }
        }
        self.settle();
    }

    fn modify(&mut self, to: QpState) -> bool {
        let attr = QpAttr {
            qp_state: to,
            ..QpAttr::default()
        };
        self.hca
            .modify_qp(self.now, self.qpn, &attr, QpAttrMask::STATE)
            .is_ok()
    }

    /// The model's view of entering ERR (`fatal`: through a NAK).
    fn entered_err(&mut self, fatal: bool) {
        self.open_send = false;
        self.open_write = None;
        if self.srq.is_none() {
            self.avail = Some(0);
        } else if fatal {
            self.avail = None;
        }
    }

    // ---- actions -------------------------------------------------------------------------

    fn action(&mut self, inp: &mut Input<'_>) {
        match inp.u8() {
            0..=199 => {
                let (src, bytes) = self.request(inp);
                self.deliver(src, bytes);
            }
            200..=209 => {
                let (src, bytes) = self.garbage(inp);
                self.deliver(src, bytes);
            }
            210..=221 => self.post_recv(inp, true),
            222..=226 => self.post_recv(inp, false),
            227..=231 => {
                self.reg_mr(inp);
                self.settle();
            }
            232..=235 => {
                self.dereg_mr(inp);
                self.settle();
            }
            236 => {
                self.churn(inp);
                self.settle();
            }
            237..=240 => {
                match self.state() {
                    QpState::Rts => self.modify(QpState::Sqd),
                    QpState::Sqd => self.modify(QpState::Rts),
                    _ => false,
                };
                self.settle();
            }
            241..=245 => {
                self.connect(inp);
                self.settle();
            }
            246 => {
                let was_err = self.state() == QpState::Err;
                if self.modify(QpState::Err) && !was_err {
                    self.entered_err(false);
                }
                self.settle();
            }
            247 => {
                if let Some(srq) = self.srq {
                    let _ = self.hca.arm_srq_limit(srq, inp.below(8));
                }
                self.settle();
            }
            _ => {
                if let Some((src, bytes)) = self.last_datagram.clone() {
                    self.deliver(src, bytes);
                }
            }
        }
        while self.hca.poll_event().is_some() {}
    }

    /// After an action that sends nothing: nothing may be transmitted; completions are checked.
    fn settle(&mut self) {
        let out = self.drain();
        assert!(out.is_empty(), "responses without a request: {out:?}");
        let log = self.mem.take_log();
        assert!(log.is_empty(), "memory accessed without a request: {log:?}");
        let wcs = poll_all(&mut self.hca, self.cq);
        self.check_recv_wcs(&wcs);
        assert_eq!(self.hca_epsn(), self.epsn, "ePSN moved without a request");
    }

    /// A request packet from the fake peer.
    fn request(&mut self, inp: &mut Input<'_>) -> (SocketAddr, Vec<u8>) {
        let op = OPS[inp.index(OPS.len())];
        let epsn = self.epsn;
        let psn = match inp.below(8) {
            0..=3 => epsn,
            4 => Psn::new(epsn.value().wrapping_sub(1 + inp.below(4))),
            5 => epsn.wrapping_add(1 + inp.below(4)),
            6 => epsn.wrapping_add(0x7F_FFFF + inp.below(3)),
            _ => Psn::new(inp.u24()),
        };
        let flags = inp.u8();
        let mtu = self.mtu;
        let ext = op.ext_headers().unwrap_or_default();
        let pos = op.position().unwrap_or(Position::Only);
        let natural = match pos {
            Position::First | Position::Middle => u64::from(mtu),
            Position::Last if op.is_write() => self
                .open_write
                .map_or(1, |w| w.remaining.clamp(1, u64::from(mtu))),
            Position::Last => 1 + u64::from(inp.below(mtu)),
            Position::Only => u64::from(inp.below(mtu + 1)),
        };
        let payload_len = if op.has_payload() {
            match inp.below(4) {
                0 | 1 => natural,
                2 => u64::from(inp.below(mtu + 1)),
                _ => u64::from(inp.below(mtu + 64)),
            }
        } else {
            0
        };
        let reth = ext.reth.then(|| {
            let natural = if op == Opcode::RdmaReadRequest {
                inp.below(3 * mtu + 1)
            } else if pos == Position::First {
                mtu * (1 + inp.below(3)) + inp.below(mtu)
            } else {
                payload_len as u32
            };
            let (va, rkey, dma_len) = self.target(inp, natural, false);
            RethRepr { va, rkey, dma_len }
        });
        let atomic_eth = ext.atomic_eth.then(|| {
            let (va, rkey, _) = self.target(inp, 8, true);
            AtomicEthRepr {
                va,
                rkey,
                swap_add: inp.u64(),
                compare: inp.u64(),
            }
        });
        let immdt = ext.immdt.then(|| ImmDtRepr { imm: inp.u32() });
        let ieth = ext.ieth.then(|| IethRepr { rkey: inp.u32() });
        let aeth = ext.aeth.then_some(AethRepr {
            syndrome: Syndrome::ACK_UNLIMITED,
            msn: 0,
        });
        let atomic_ack_eth = ext.atomic_ack_eth.then_some(AtomicAckEthRepr {
            orig_remote_data: 7,
        });
        let payload = pattern(psn.value(), payload_len as usize);
        let spoil = flags >> 4;
        let repr = PacketRepr {
            bth: BthRepr {
                opcode: op,
                solicited: flags & 2 != 0,
                mig_req: flags & 4 != 0,
                pad_count: pad_len(payload.len()),
                pkey: match spoil {
                    1 => u16::from(flags) << 4,
                    5 => 0x7FFF,
                    _ => BthRepr::DEFAULT_PKEY,
                },
                fecn: spoil == 6,
                becn: spoil == 6,
                dest_qp: if spoil == 2 {
                    self.qpn ^ (1 + u32::from(flags & 0x0F))
                } else {
                    self.qpn
                },
                ack_req: flags & 1 == 0,
                psn,
            },
            reth,
            aeth,
            atomic_eth,
            atomic_ack_eth,
            immdt,
            ieth,
            payload: &payload,
        };
        let mut src = self.peer();
        if spoil == 3 {
            src.set_ip(C_IP.into());
        }
        let mut bytes = emit(&repr, src, Self::me());
        if let (4, Some(last)) = (spoil, bytes.last_mut()) {
            *last ^= 0x40;
        }
        (src, bytes)
    }

    /// A (va, rkey, length) aimed at one of the MRs (live or dead) or anywhere.
    fn target(&mut self, inp: &mut Input<'_>, natural: u32, align: bool) -> (u64, u32, u32) {
        let k = inp.index(self.mrs.len() + 1);
        let Some(mr) = self.mrs.get(k).copied() else {
            return (inp.u64(), inp.u32(), inp.u32());
        };
        let len = mr.info.length;
        let mut off = match inp.below(4) {
            0 => 0,
            1 => u64::from(inp.u16()) % len,
            2 => len.saturating_sub(u64::from(inp.u8() % 16)),
            _ => inp.u64(),
        };
        if align && inp.u8() % 8 != 7 {
            off &= !7;
        }
        let va = mr.info.iova.wrapping_add(off);
        let rkey = match inp.below(8) {
            0..=5 => mr.info.rkey,
            6 => mr.info.rkey ^ (1 + u32::from(inp.u8() % 0xFF)),
            _ => inp.u32(),
        };
        let dma_len = match inp.below(6) {
            0 | 1 => natural,
            2 => 0,
            3 => (len.saturating_sub(off) + u64::from(inp.u8() % 2)) as u32,
            4 => inp.u32(),
            _ => 0x8000_0000 + inp.below(2),
        };
        (va, rkey, dma_len)
    }

    /// Raw bytes, usually with our QPN patched in and a valid ICRC.
    fn garbage(&mut self, inp: &mut Input<'_>) -> (SocketAddr, Vec<u8>) {
        let len = inp.index(96);
        let mut bytes = inp.bytes(len).to_vec();
        let fix = inp.u8();
        if bytes.len() >= 12 && fix & 1 == 0 {
            Packet::new_unchecked(&mut bytes[..])
                .bth_mut()
                .set_dest_qp(self.qpn);
        }
        let src = self.peer();
        if let (0, Some(ctx)) = (fix & 2, ip_ctx(src, Self::me())) {
            let _ = fill_icrc(&ctx, &mut bytes);
        }
        (src, bytes)
    }

    // ---- delivery and checks -------------------------------------------------------------

    /// The request the QP will process, or `None` if the HCA must drop the datagram.
    fn in_scope(&self, src: SocketAddr, bytes: &[u8], state: QpState) -> Option<Req> {
        if !icrc_ok(src, Self::me(), bytes) {
            return None;
        }
        let p = PacketRepr::parse(&Packet::new_unchecked(bytes)).ok()?;
        let ours = p.bth.dest_qp == self.qpn
            && src.ip() == IpAddr::from(A_IP)
            && p.bth.pkey & 0x7FFF == 0x7FFF;
        let accepts = matches!(state, QpState::Rtr | QpState::Rts | QpState::Sqd);
        (ours && accepts && p.bth.opcode.is_request()).then_some(Req {
            op: p.bth.opcode,
            psn: p.bth.psn,
            ack_req: p.bth.ack_req,
            reth: p.reth,
            atomic: p.atomic_eth,
            payload_len: p.payload.len() as u64,
        })
    }

    /// Drains every transmit, checking each datagram's addressing, ICRC and form.
    fn drain(&mut self) -> Vec<Out> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; MAX_PACKET_LEN];
        while let Some(tx) = self.hca.poll_transmit(self.now, &self.mem, &mut buf) {
            assert!(out.len() < 100_000, "transmit storm");
            assert_eq!(
                tx.dst,
                SocketAddr::new(A_IP.into(), PORT),
                "wrong destination"
            );
            let bytes = &buf[..tx.len];
            let src = SocketAddr::new(B_IP.into(), tx.src_port);
            let dst = SocketAddr::new(A_IP.into(), PORT);
            assert!(icrc_ok(src, dst, bytes), "emitted a bad ICRC");
            let p = match PacketRepr::parse(&Packet::new_unchecked(bytes)) {
                Ok(p) => p,
                Err(e) => panic!("emitted an unparsable packet: {e}"),
            };
            assert_eq!(p.bth.dest_qp, PEER_QPN, "response to the wrong QP");
            assert!(
                p.bth.opcode.is_response(),
                "responder sent {:?}",
                p.bth.opcode
            );
            out.push(Out {
                op: p.bth.opcode,
                psn: p.bth.psn,
                syndrome: p.aeth.map(|a| a.syndrome),
                orig: p.atomic_ack_eth.map(|a| a.orig_remote_data),
                payload: p.payload.to_vec(),
            });
        }
        out
    }

    fn deliver(&mut self, src: SocketAddr, bytes: Vec<u8>) {
        let state = self.state();
        let epsn = self.hca_epsn();
        assert_eq!(epsn, self.epsn, "ePSN changed between actions");
        let req = self.in_scope(src, &bytes, state);
        let _ = self.mem.take_log();
        self.hca.handle_datagram(self.now, src, &bytes, &self.mem);
        let during = self.mem.take_log();
        let out = self.drain();
        let after = self.mem.take_log();
        let wcs = poll_all(&mut self.hca, self.cq);
        let state_after = self.state();
        let epsn_after = self.hca_epsn();
        self.last_datagram = Some((src, bytes));

        self.check_recv_wcs(&wcs);
        for a in &after {
            self.check_access(a, AccessKind::Read, AccessFlags::REMOTE_READ);
        }
        let Some(req) = req else {
            assert!(during.is_empty(), "memory accessed for a dropped datagram");
            assert!(out.is_empty(), "answered a dropped datagram: {out:?}");
            assert!(wcs.is_empty(), "completions for a dropped datagram");
            assert_eq!(state_after, state, "state changed for a dropped datagram");
            assert_eq!(epsn_after, epsn, "ePSN moved for a dropped datagram");
            return;
        };
        let op = req.op;
        let need = if op.is_write() {
            Some((AccessKind::Write, AccessFlags::REMOTE_WRITE))
        } else if op.is_send() {
            Some((AccessKind::Write, AccessFlags::LOCAL_WRITE))
        } else if op.is_atomic() {
            Some((AccessKind::Atomic, AccessFlags::REMOTE_ATOMIC))
        } else {
            None
        };
        for a in &during {
            match need {
                Some((kind, right)) => self.check_access(a, kind, right),
                None => panic!("{op:?} accessed memory: {a:?}"),
            }
        }
        // A duplicate READ is re-executed from its own PSN for its own length once its range
        // is an address subset of the original (§4.5, as rxe): a malformed one (the original
        // RETH at a later PSN) gets responses past the original PSNs, even at ePSN. Those are
        // checked against the duplicate's own range in `check_read_payload`.
        let dup_read = req.op == Opcode::RdmaReadRequest && req.psn.diff(epsn) < 0;
        for o in out
            .iter()
            .filter(|o| !(dup_read && o.op.is_read_response()))
        {
            match o.syndrome {
                Some(Syndrome::Ack { .. }) | None => assert!(
                    o.psn.is_before(epsn_after),
                    "{:?} for PSN {:?}, not before ePSN {epsn_after:?}",
                    o.op,
                    o.psn
                ),
                Some(Syndrome::Nak(NakCode::InvalidRdRequest | NakCode::Reserved(_)))
                | Some(Syndrome::Reserved(_)) => panic!("illegal syndrome in {o:?}"),
                _ => assert_eq!(o.op, Opcode::Acknowledge, "NAK in {o:?}"),
            }
        }

        let d = req.psn.diff(epsn);
        if d > 0 {
            // Out of sequence (§2.6).
            assert_eq!(epsn_after, epsn, "ePSN moved for a PSN after ePSN");
            assert!(during.is_empty() && wcs.is_empty());
            assert_eq!(state_after, state);
            let nak_due = if self.seq_nak_for != Some(epsn) || !req.psn.is_after(self.gap_last) {
                self.gap_unanswered = 0;
                true
            } else {
                self.gap_unanswered += 1;
                self.gap_unanswered % SEQ_NAK_REPEAT == 0
            };
            self.gap_last = req.psn;
            match out.as_slice() {
                [] => assert!(!nak_due, "gap without its sequence NAK ({req:?})"),
                [o] if o.syndrome == Some(Syndrome::Nak(NakCode::PsnSequenceError)) => {
                    assert_eq!(o.psn, epsn, "sequence NAK must carry ePSN");
                    assert!(nak_due, "sequence NAK not due for {req:?}");
                    self.seq_nak_for = Some(epsn);
                }
                _ => panic!("answer to an out-of-sequence request: {out:?}"),
            }
        } else if d < 0 {
            self.check_duplicate(&req, &out, &during, state, state_after, epsn, epsn_after);
        } else {
            self.check_in_order(&req, &out, &wcs, state, state_after, epsn, epsn_after);
        }
        self.epsn = epsn_after;
    }

    #[allow(clippy::too_many_arguments)]
    fn check_duplicate(
        &mut self,
        req: &Req,
        out: &[Out],
        during: &[Access],
        state: QpState,
        state_after: QpState,
        epsn: Psn,
        epsn_after: Psn,
    ) {
        assert_eq!(epsn_after, epsn, "ePSN moved for a duplicate");
        assert!(
            during.is_empty(),
            "duplicate {req:?} re-executed: {during:?}"
        );
        let mut fatal = false;
        for o in out {
            match o.syndrome {
                Some(Syndrome::Nak(NakCode::RemoteAccessError)) => {
                    // A re-executed READ whose MR went away (§4.4: each response re-checks).
                    assert_eq!(req.op, Opcode::RdmaReadRequest, "NAK for duplicate {req:?}");
                    assert!(
                        self.remote_access_fails(req),
                        "remote access NAK for {req:?}"
                    );
                    fatal = true;
                }
                Some(Syndrome::Nak(_) | Syndrome::RnrNak { .. }) => {
                    panic!("duplicate {req:?} NAKed: {o:?}")
                }
                _ => {}
            }
            if o.op == Opcode::AtomicAcknowledge {
                assert!(req.op.is_atomic() && o.psn == req.psn, "{o:?} for {req:?}");
                let saved = self.atomics.get(&o.psn.value()).copied();
                assert!(
                    saved.is_none() || saved == o.orig,
                    "replayed atomic original {:?}, executed {saved:?}",
                    o.orig
                );
            }
            if o.op.is_read_response() {
                assert_eq!(req.op, Opcode::RdmaReadRequest, "{o:?} for {req:?}");
                self.check_read_payload(req, o);
            }
        }
        if fatal {
            assert_eq!(state_after, QpState::Err);
            self.entered_err(true);
        } else {
            assert_eq!(state_after, state, "duplicate changed the state");
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check_in_order(
        &mut self,
        req: &Req,
        out: &[Out],
        wcs: &[WorkCompletion],
        state: QpState,
        state_after: QpState,
        epsn: Psn,
        epsn_after: Psn,
    ) {
        let op = req.op;
        let npkts = match (op, req.reth) {
            (Opcode::RdmaReadRequest, Some(reth)) => {
                u64::from(reth.dma_len).div_ceil(u64::from(self.mtu)).max(1) as u32
            }
            _ => 1,
        };
        // (A READ of 2^24 packets, which would look unchanged, is rejected: at most 2^31 bytes.)
        if epsn_after != epsn && epsn_after == epsn.wrapping_add(npkts) {
            // Accepted. Only a SEND_WITH_INV whose R_Key cannot be invalidated may also move
            // the QP to ERR: acknowledged, its receive WQE completed with REM_INV_REQ_ERR
            // (rxe's class J; `rc::responder::invalidate_failed`).
            let invalidate_failed = matches!(
                op,
                Opcode::SendLastWithInvalidate | Opcode::SendOnlyWithInvalidate
            ) && state_after == QpState::Err;
            if !invalidate_failed {
                assert_eq!(state_after, state, "accepted {req:?} changed the state");
            }
            if let Some(o) = out
                .iter()
                .find(|o| matches!(o.syndrome, Some(Syndrome::Nak(_) | Syndrome::RnrNak { .. })))
            {
                panic!("accepted {req:?} but NAKed: {o:?}");
            }
            let (key_len, need) = match (op, req.reth, req.atomic) {
                (Opcode::RdmaReadRequest, Some(r), _) => {
                    (Some((r, r.dma_len)), AccessFlags::REMOTE_READ)
                }
                (
                    Opcode::RdmaWriteFirst
                    | Opcode::RdmaWriteOnly
                    | Opcode::RdmaWriteOnlyWithImmediate,
                    Some(r),
                    _,
                ) => (Some((r, r.dma_len)), AccessFlags::REMOTE_WRITE),
                (_, _, Some(a)) => (
                    Some((
                        RethRepr {
                            va: a.va,
                            rkey: a.rkey,
                            dma_len: 8,
                        },
                        8,
                    )),
                    AccessFlags::REMOTE_ATOMIC,
                ),
                _ => (None, AccessFlags::empty()),
            };
            if let Some((r, len)) = key_len {
                assert!(
                    len == 0 || self.resolve(r.rkey, r.va, u64::from(len), need).is_some(),
                    "accepted {req:?} although the R_Key check fails"
                );
            }
            if let (true, Some(a)) = (op.consumes_recv_wqe(), self.avail) {
                assert!(a > 0, "accepted {req:?} without a receive WQE");
                self.avail = Some(a - 1);
            }
            match op {
                Opcode::SendFirst => self.open_send = true,
                Opcode::SendLast
                | Opcode::SendLastWithImmediate
                | Opcode::SendLastWithInvalidate => self.open_send = false,
                Opcode::RdmaWriteFirst => {
                    let r = req.reth.unwrap_or(RethRepr {
                        va: 0,
                        rkey: 0,
                        dma_len: 0,
                    });
                    self.open_write = Some(OpenWrite {
                        key: if r.dma_len == 0 { 0 } else { r.rkey },
                        remaining: u64::from(r.dma_len).saturating_sub(req.payload_len),
                    });
                }
                Opcode::RdmaWriteMiddle => {
                    if let Some(w) = self.open_write.as_mut() {
                        w.remaining = w.remaining.saturating_sub(req.payload_len);
                    }
                }
                Opcode::RdmaWriteLast | Opcode::RdmaWriteLastWithImmediate => {
                    self.open_write = None
                }
                _ => {}
            }
            if op == Opcode::RdmaReadRequest {
                assert_eq!(out.len() as u32, npkts, "READ answered with {out:?}");
                for (i, o) in out.iter().enumerate() {
                    assert_eq!(o.psn, req.psn.wrapping_add(i as u32), "READ response PSNs");
                    self.check_read_payload(req, o);
                }
            } else if op.is_atomic() {
                match out {
                    [o] if o.op == Opcode::AtomicAcknowledge && o.psn == req.psn => {
                        if let Some(orig) = o.orig {
                            self.atomics.insert(req.psn.value(), orig);
                        }
                    }
                    _ => panic!("atomic {req:?} answered with {out:?}"),
                }
            } else {
                match out {
                    [] => assert!(!req.ack_req, "{req:?} with AckReq not ACKed"),
                    [o] => {
                        assert!(req.ack_req, "{req:?} without AckReq ACKed");
                        assert!(
                            o.op == Opcode::Acknowledge && o.psn == req.psn,
                            "ACK {o:?} for {req:?}"
                        );
                    }
                    _ => panic!("{req:?} answered with {out:?}"),
                }
            }
            self.seq_nak_for = None;
            return;
        }
        assert_eq!(
            epsn_after, epsn,
            "ePSN moved from {epsn:?} to {epsn_after:?} for {req:?}"
        );
        let [o] = out else {
            panic!("in-order {req:?} neither accepted nor NAKed once: {out:?}");
        };
        assert_eq!(o.psn, req.psn, "NAK PSN is not the request's");
        match o.syndrome {
            Some(Syndrome::RnrNak { timer }) => {
                assert!(op.consumes_recv_wqe(), "RNR NAK for {req:?}");
                assert_eq!(timer.code(), self.min_rnr_timer, "RNR NAK timer");
                assert!(
                    self.avail.is_none_or(|a| a == 0),
                    "RNR NAK with {:?} receive WQEs posted",
                    self.avail
                );
                assert_eq!(state_after, state, "RNR NAK changed the state");
            }
            Some(Syndrome::Nak(code)) => {
                assert_eq!(
                    state_after,
                    QpState::Err,
                    "NAK {code:?} left the QP in {state_after}"
                );
                match code {
                    NakCode::RemoteAccessError => assert!(
                        self.remote_access_fails(req),
                        "remote access NAK for {req:?}, which passes the R_Key check"
                    ),
                    NakCode::RemoteOperationalError => {
                        assert!(op.is_send(), "remote operational NAK for {req:?}");
                        let bad = wcs.iter().any(|wc| {
                            matches!(wc.status, WcStatus::LocProtErr | WcStatus::LocQpOpErr)
                                && self
                                    .recvs
                                    .get(&wc.wr_id)
                                    .is_some_and(|s| s.iter().any(|s| !self.sge_ok(s)))
                        });
                        assert!(bad, "remote operational NAK without a bad receive WQE");
                    }
                    NakCode::InvalidRequest => {}
                    other => panic!("NAK {other:?} for in-order {req:?}"),
                }
                for wc in wcs {
                    match wc.status {
                        WcStatus::LocProtErr | WcStatus::LocQpOpErr => {
                            assert_eq!(code, NakCode::RemoteOperationalError)
                        }
                        WcStatus::LocLenErr => assert_eq!(code, NakCode::InvalidRequest),
                        _ => {}
                    }
                }
                self.entered_err(true);
            }
            _ => panic!("in-order {req:?} not accepted, answered {o:?}"),
        }
    }

    /// The MR key and offset `va..va+len` resolves to under the responder's rules (§4.4).
    fn resolve(&self, rkey: u32, va: u64, len: u64, need: AccessFlags) -> Option<(u32, u64)> {
        self.mrs.iter().find_map(|m| {
            let i = m.info;
            let off = va.checked_sub(i.iova)?;
            let inside = off.checked_add(len).is_some_and(|end| end <= i.length);
            (m.live && i.rkey == rkey && i.pd == self.pds[0] && i.access.contains(need) && inside)
                .then_some((i.lkey, off))
        })
    }

    fn sge_ok(&self, s: &Sge) -> bool {
        s.length == 0
            || self
                .resolve(
                    s.lkey,
                    s.addr,
                    u64::from(s.length),
                    AccessFlags::LOCAL_WRITE,
                )
                .is_some()
    }

    /// True if the R_Key check for `req` really fails (or its MR went away mid-message).
    fn remote_access_fails(&self, req: &Req) -> bool {
        match (req.op, req.reth, req.atomic) {
            (
                Opcode::RdmaWriteFirst | Opcode::RdmaWriteOnly | Opcode::RdmaWriteOnlyWithImmediate,
                Some(r),
                _,
            ) => {
                r.dma_len != 0
                    && self
                        .resolve(
                            r.rkey,
                            r.va,
                            u64::from(r.dma_len),
                            AccessFlags::REMOTE_WRITE,
                        )
                        .is_none()
            }
            (
                Opcode::RdmaWriteMiddle
                | Opcode::RdmaWriteLast
                | Opcode::RdmaWriteLastWithImmediate,
                _,
                _,
            ) => self.open_write.is_some_and(|w| {
                w.key != 0 && !self.mrs.iter().any(|m| m.live && m.info.rkey == w.key)
            }),
            (Opcode::RdmaReadRequest, Some(r), _) => {
                r.dma_len != 0
                    && self
                        .resolve(r.rkey, r.va, u64::from(r.dma_len), AccessFlags::REMOTE_READ)
                        .is_none()
            }
            (_, _, Some(a)) => self
                .resolve(a.rkey, a.va, 8, AccessFlags::REMOTE_ATOMIC)
                .is_none(),
            _ => false,
        }
    }

    /// A READ response `o` to `req` (new or re-executed) carries the right opcode, length and
    /// the MR's bytes.
    fn check_read_payload(&self, req: &Req, o: &Out) {
        let Some(r) = req.reth else {
            panic!("READ without RETH: {req:?}");
        };
        let mtu = u64::from(self.mtu);
        let len = u64::from(r.dma_len);
        let n = len.div_ceil(mtu).max(1);
        let i = u64::from(o.psn.diff(req.psn) as u32);
        assert!(i < n, "READ response {o:?} beyond {n} packets of {req:?}");
        let want_op = match (i, n) {
            (_, 1) => Opcode::RdmaReadResponseOnly,
            (0, _) => Opcode::RdmaReadResponseFirst,
            (i, n) if i + 1 == n => Opcode::RdmaReadResponseLast,
            _ => Opcode::RdmaReadResponseMiddle,
        };
        assert_eq!(o.op, want_op, "READ response opcode");
        let want_len = len.saturating_sub(i * mtu).min(mtu) as usize;
        assert_eq!(o.payload.len(), want_len, "READ response length");
        if want_len == 0 {
            return;
        }
        let at = r.va.wrapping_add(i * mtu);
        let Some((key, off)) = self.resolve(r.rkey, at, want_len as u64, AccessFlags::REMOTE_READ)
        else {
            panic!("READ response {o:?} from memory that fails the R_Key check");
        };
        assert_eq!(
            self.mem.get(key, off, want_len).as_deref(),
            Some(&o.payload[..]),
            "READ response bytes differ from the MR"
        );
    }

    /// `a` targets a live MR of the QP's PD, inside it, with `right`.
    fn check_access(&self, a: &Access, kind: AccessKind, right: AccessFlags) {
        assert_eq!(a.kind, kind, "unexpected memory access {a:?}");
        let Some(mr) = self.mrs.iter().find(|m| m.live && m.info.lkey == a.key) else {
            panic!("memory access {a:?} to a key that is not registered");
        };
        assert_eq!(
            mr.info.pd, self.pds[0],
            "memory access {a:?} to an MR of another PD"
        );
        assert!(
            mr.info.access.contains(right),
            "memory access {a:?} to an MR without {right:?}"
        );
        assert!(
            a.offset
                .checked_add(a.len as u64)
                .is_some_and(|end| end <= mr.info.length),
            "memory access {a:?} outside the MR of {} bytes",
            mr.info.length
        );
    }

    /// Receive completions: each posted WR at most once, in posting order, legal statuses.
    fn check_recv_wcs(&mut self, wcs: &[WorkCompletion]) {
        for wc in wcs {
            assert_eq!(wc.qp_num, self.qpn);
            assert!(
                self.recvs.contains_key(&wc.wr_id),
                "completion for unknown WR {wc:?}"
            );
            assert!(
                self.last_recv_wc.is_none_or(|l| l < wc.wr_id),
                "receive completion {} after {:?}: twice or out of order",
                wc.wr_id,
                self.last_recv_wc
            );
            self.last_recv_wc = Some(wc.wr_id);
            match wc.status {
                WcStatus::Success => assert!(
                    matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm),
                    "{wc:?}"
                ),
                WcStatus::WrFlushErr
                | WcStatus::LocProtErr
                | WcStatus::LocQpOpErr
                | WcStatus::LocLenErr => {}
                // A SEND_WITH_INV whose R_Key names no type 2 window of the QP's PD: the
                // message is acknowledged and its receive WQE completes with REM_INV_REQ_ERR
                // (rxe's class J; `rc::responder::invalidate_failed`).
                WcStatus::RemInvReqErr => {}
                other => panic!("receive completion with status {other:?}"),
            }
        }
    }
}
