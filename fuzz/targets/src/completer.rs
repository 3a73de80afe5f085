//! Fuzz target `completer`: hostile responses against an RC requester with outstanding work
//! (rc-transport.md §2.8–§2.10, §3, §6).

use core::net::SocketAddr;
use std::collections::HashSet;

use emu_proto::wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, Credits, NakCode, Opcode, Packet, PacketRepr, Position,
    Psn, RnrTimer, Syndrome, fill_icrc, ip::udp_sport,
};
use emu_proto::{CqId, Hca, HcaConfig, Instant, MAX_PACKET_LEN, MrInfo};
use verbs_api::{
    AccessFlags, AhAttr, Gid, Mtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, SendFlags,
    SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, connect,
};

use super::common::{
    A_IP, B_IP, Input, PEER_QPN, PORT, TestMemory, emit, icrc_ok, ip_ctx, pattern, poll_all,
};

/// Actions per input at most.
const MAX_ACTIONS: usize = 300;
/// WRs posted per input at most.
const MAX_WQES: usize = 48;
/// Send queue capacity (posting beyond it fails, which is fine).
const SQ_CAP: u32 = 32;
/// Largest inline payload.
const MAX_INLINE: u32 = 64;

/// Layout of MR 0 (64 KiB, every right): constant source bytes, READ destinations, atomic
/// result slots.
const SRC_LEN: u64 = 16 * 1024;
const DEST: u64 = 16 * 1024;
const DEST_END: u64 = 48 * 1024;
const SLOTS: u64 = 48 * 1024;
const MR0_LEN: u64 = 64 * 1024;
/// MR 2 (8 KiB, every right, may be deregistered): sources in the first half, destinations in
/// the second.
const MR2_LEN: u64 = 8 * 1024;

/// Fuzz target `completer`: a requester QP (MTU, timeout, retry counts, `max_rd_atomic`,
/// `sq_psn` near the wrap, `sq_sig_all` from the input) with work requests of every kind
/// (SEND ± imm, WRITE ± imm, READ, CMP_SWAP, FETCH_ADD; 0–3 MTUs; 1–2 SGEs or inline;
/// signaled or not; fenced; local buffers in a good MR, an MR without LOCAL_WRITE, an MR that
/// may be deregistered, or a bogus key), then up to 300 actions: responses from the fake peer
/// (ACKs with any syndrome, sequence/RNR/other NAKs, READ responses of any position and length,
/// atomic ACKs) at PSNs around the posted WQEs, raw datagrams, resends, timer firings, time
/// jumps, more posts, deregistering an MR, SQD/RTS toggles. Transmits and the CQ are drained
/// after every action.
///
/// Asserts, besides "never panics":
/// * every request packet belongs to an outstanding WQE, at a PSN inside its range, with the
///   opcode, position, RETH/AtomicETH/ImmDt and payload bytes of that WQE (retransmissions
///   included); nothing is sent from ERR;
/// * each WQE completes at most once and in posting order; a gap is only an unsignaled WQE that
///   succeeded silently; after the first error completion the QP is in ERR and only flushes
///   follow, one per remaining WQE;
/// * a success is reported only for a signaled WQE whose responses arrived: an ACK (or a later
///   response) covering its last PSN for SEND/WRITE, a READ response for each of its PSNs (and
///   the destination holds exactly their bytes), an atomic ACK for its PSN (and the result slot
///   holds its original value);
/// * error statuses are among those an RC requester reports.
pub fn completer(data: &[u8]) {
    let mut inp = Input::new(data);
    let mut c = Completer::new(&mut inp);
    for _ in 0..=inp.below(6) {
        c.post(&mut inp);
    }
    c.check_step();
    for _ in 0..MAX_ACTIONS {
        if inp.is_empty() {
            break;
        }
        c.action(&mut inp);
        c.check_step();
    }
}

fn ok<T>(r: verbs_api::Result<T>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what} failed: {e}"),
    }
}

/// The bytes of the READ response with PSN `psn` (`len` of them): a function of the PSN only,
/// so any accepted copy of a response places the same bytes.
fn read_bytes(psn: Psn, len: usize) -> Vec<u8> {
    pattern(psn.value() ^ 0x00A5_5A00, len)
}

/// The original value the atomic ACK with PSN `psn` carries.
fn orig_of(psn: Psn) -> u64 {
    u64::from(psn.value()).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED
}

/// A posted work request as the model knows it.
#[derive(Clone, Debug)]
struct Wqe {
    wr_id: u64,
    op: SendOp,
    len: u64,
    npkts: u32,
    first: Psn,
    signaled: bool,
    /// The message bytes of a SEND/WRITE.
    msg: Vec<u8>,
    /// READ destination pieces (MR key, offset in the MR, length).
    dest: Vec<(u32, u64, u32)>,
    /// Atomic result slot (MR key, offset).
    slot: Option<(u32, u64)>,
    done: bool,
}

impl Wqe {
    fn last(&self) -> Psn {
        self.first.wrapping_add(self.npkts - 1)
    }

    fn contains(&self, psn: Psn) -> bool {
        !psn.is_before(self.first) && !psn.is_after(self.last())
    }
}

/// A response the fake peer delivered.
#[derive(Copy, Clone, Debug)]
struct Delivered {
    op: Opcode,
    psn: Psn,
    syndrome: Option<Syndrome>,
}

struct Completer {
    hca: Hca,
    mem: TestMemory,
    cq: CqId,
    qpn: u32,
    now: Instant,
    /// MR 0 (all rights), MR 1 (REMOTE_READ only: no LOCAL_WRITE), MR 2 (all rights, may go).
    mrs: [MrInfo; 3],
    mr2_live: bool,
    mtu: u32,
    sq_sig_all: bool,
    /// PSN the next queued WQE gets.
    next_psn: Psn,
    wqes: Vec<Wqe>,
    last_done: Option<usize>,
    /// An error completion was seen: only flushes may follow.
    in_error: bool,
    delivered: Vec<Delivered>,
    read_psns: HashSet<u32>,
    atomic_psns: HashSet<u32>,
    dest_at: u64,
    dest2_at: u64,
    slot_at: u64,
    last_datagram: Option<Vec<u8>>,
}

impl Completer {
    fn new(inp: &mut Input<'_>) -> Completer {
        let mut hca = Hca::new(HcaConfig::new("a", Gid::from_ip(A_IP.into()), 3));
        let pd = ok(hca.alloc_pd(), "alloc_pd");
        let cq = ok(hca.create_cq(1024, None), "create_cq");
        let sq_sig_all = inp.u8() % 4 == 3;
        let init = QpInitAttr {
            sq_sig_all,
            ..QpInitAttr::rc(QpCap {
                max_send_wr: SQ_CAP,
                max_recv_wr: 4,
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: MAX_INLINE,
            })
        };
        let qpn = ok(hca.create_qp(pd, cq, cq, None, &init), "create_qp");
        let mem = TestMemory::default();
        let all = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let specs = [
            (0x1000_0000, MR0_LEN, all),
            (0x2000_0000, 4096, AccessFlags::REMOTE_READ),
            (0x3000_0000, MR2_LEN, all),
        ];
        let mrs = specs.map(|(iova, len, access)| {
            let info = ok(hca.reg_mr(pd, iova, len, access), "reg_mr");
            mem.insert(info.lkey, len as usize);
            info
        });
        mem.put(mrs[0].lkey, 0, &pattern(11, SRC_LEN as usize));
        mem.put(mrs[1].lkey, 0, &pattern(22, 4096));
        mem.put(mrs[2].lkey, 0, &pattern(33, (MR2_LEN / 2) as usize));

        let mtu = [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024][inp.index(3)];
        let timeout = [4, 1, 8, 0, 14, 2, 3, 5][inp.index(8)];
        let retry_cnt = (7 - inp.below(8)) as u8;
        let rnr_retry = (7 - inp.below(8)) as u8;
        let max_rd_atomic = [2, 1, 4, 0, 16, 3, 8, 128][inp.index(8)];
        let sq_psn = match inp.below(4) {
            0 => 0x100,
            1 => 0xFF_FFF0 + inp.below(16),
            _ => inp.u24(),
        };
        let attr = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: all,
            path_mtu: mtu,
            dest_qp_num: PEER_QPN,
            rq_psn: 0,
            sq_psn,
            max_dest_rd_atomic: 4,
            max_rd_atomic,
            min_rnr_timer: 1,
            timeout,
            retry_cnt,
            rnr_retry,
            ah_attr: AhAttr {
                dgid: Gid::from_ip(B_IP.into()),
                udp_dport: PORT,
                ..AhAttr::default()
            },
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
            ok(hca.modify_qp(Instant::ZERO, qpn, &a, mask), "connect");
        }
        Completer {
            hca,
            mem,
            cq,
            qpn,
            now: Instant::ZERO,
            mrs,
            mr2_live: true,
            mtu: mtu.bytes(),
            sq_sig_all,
            next_psn: Psn::new(sq_psn),
            wqes: Vec::new(),
            last_done: None,
            in_error: false,
            delivered: Vec::new(),
            read_psns: HashSet::new(),
            atomic_psns: HashSet::new(),
            dest_at: DEST,
            dest2_at: MR2_LEN / 2,
            slot_at: SLOTS,
            last_datagram: None,
        }
    }

    fn state(&self) -> QpState {
        ok(self.hca.query_qp(self.qpn), "query_qp").qp_state
    }

    fn peer() -> SocketAddr {
        SocketAddr::new(B_IP.into(), udp_sport(PEER_QPN, 0x11))
    }

    fn me() -> SocketAddr {
        SocketAddr::new(A_IP.into(), PORT)
    }

    // ---- posting -------------------------------------------------------------------------

    /// Which local MR a WR's buffers use: 0 mostly; 1 (no LOCAL_WRITE), 2 (may be gone) or a
    /// bogus key sometimes.
    fn pick_mr(&self, inp: &mut Input<'_>) -> Option<usize> {
        match inp.below(16) {
            0..=12 => Some(0),
            13 => Some(1),
            14 => Some(2),
            _ => None,
        }
    }

    /// Room for `len` destination bytes in MR `m` (wrapping around its destination area).
    fn dest_room(&mut self, m: usize, len: u64) -> u64 {
        match m {
            0 => {
                if self.dest_at + len > DEST_END {
                    self.dest_at = DEST;
                }
                let at = self.dest_at;
                self.dest_at += len + 8;
                at
            }
            2 => {
                if self.dest2_at + len > MR2_LEN - 8 {
                    self.dest2_at = MR2_LEN / 2;
                }
                let at = self.dest2_at;
                self.dest2_at += len + 8;
                at
            }
            _ => 0,
        }
    }

    fn post(&mut self, inp: &mut Input<'_>) {
        if self.wqes.len() >= MAX_WQES {
            return;
        }
        let mtu = self.mtu;
        let kind = inp.below(7);
        let mut len = u64::from(match inp.below(4) {
            0 => inp.below(mtu + 1),
            1 => inp.below(3 * mtu + 1),
            2 => 0,
            _ => mtu * (1 + inp.below(3)),
        });
        let atomic = kind >= 5;
        if atomic {
            len = 8;
        }
        let m = self.pick_mr(inp);
        let info = m.map(|m| self.mrs[m]);
        let remote_addr = inp.u64() & !7;
        let rkey = inp.u32();
        let imm = inp.u32();
        let mut flags = SendFlags::empty();
        let signaled = inp.below(8) != 7;
        if signaled {
            flags |= SendFlags::SIGNALED;
        }
        if inp.below(8) == 7 {
            flags |= SendFlags::FENCE;
        }
        let inline = kind < 4 && len <= u64::from(MAX_INLINE) && inp.below(4) == 3;
        let split = inp.below(2) == 1 && !atomic;
        let cut = if split {
            u64::from(inp.u16()) % (len + 1)
        } else {
            len
        };
        let mut sges = Vec::new();
        let mut msg = Vec::new();
        let mut dest = Vec::new();
        let mut slot = None;
        for piece in [cut, len - cut] {
            if piece == 0 && !sges.is_empty() {
                continue;
            }
            let (lkey, iova, off) = match (m, info) {
                (Some(m), Some(i)) => {
                    let off = match (kind, m) {
                        (4, _) => self.dest_room(m, piece),
                        (5 | 6, 0) => {
                            let at = self.slot_at;
                            self.slot_at = if at + 16 > MR0_LEN { SLOTS } else { at + 8 };
                            at
                        }
                        (5 | 6, 2) => MR2_LEN - 8,
                        (5 | 6, _) => 0,
                        (_, 0) => u64::from(inp.u16()) % (SRC_LEN - piece + 1),
                        (_, 1) => u64::from(inp.u16()) % (4096 - piece + 1),
                        _ => u64::from(inp.u16()) % (MR2_LEN / 2 - piece + 1),
                    };
                    (i.lkey, i.iova, off)
                }
                _ => (inp.u32(), 0x1000_0000, 0),
            };
            sges.push(Sge {
                addr: iova + off,
                length: piece as u32,
                lkey,
            });
            match kind {
                4 => dest.push((lkey, off, piece as u32)),
                5 | 6 => slot = Some((lkey, off)),
                _ => msg.extend(
                    self.mem
                        .get(lkey, off, piece as usize)
                        .unwrap_or_else(|| vec![0; piece as usize]),
                ),
            }
        }
        let op = match kind {
            0 => SendOp::Send,
            1 => SendOp::SendWithImm { imm },
            2 => SendOp::RdmaWrite { remote_addr, rkey },
            3 => SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            4 => SendOp::RdmaRead { remote_addr, rkey },
            5 => SendOp::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare: inp.u64(),
                swap: inp.u64(),
            },
            _ => SendOp::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add: inp.u64(),
            },
        };
        let inline_data = if inline { msg.clone() } else { Vec::new() };
        if inline {
            flags |= SendFlags::INLINE;
            sges.clear();
        }
        let index = self.wqes.len();
        let wr_id = 1000 + index as u64;
        let wr = SendWr {
            wr_id,
            op,
            sg_list: &sges,
            inline_data: &inline_data,
            flags,
            ud: None,
        };
        let state = self.state();
        if self.hca.post_send(self.now, self.qpn, &[wr]).is_err() {
            return;
        }
        let npkts = if atomic {
            1
        } else {
            len.div_ceil(u64::from(mtu)).max(1) as u32
        };
        let first = self.next_psn;
        if state != QpState::Err {
            self.next_psn = first.wrapping_add(npkts);
        }
        self.wqes.push(Wqe {
            wr_id,
            op,
            len,
            npkts,
            first,
            signaled: signaled || self.sq_sig_all,
            msg,
            dest,
            slot,
            done: false,
        });
    }

    // ---- actions -------------------------------------------------------------------------

    fn action(&mut self, inp: &mut Input<'_>) {
        match inp.u8() {
            0..=159 => {
                let bytes = self.response(inp);
                self.deliver(bytes);
            }
            160..=189 => {
                if let Some(t) = self.hca.poll_timeout() {
                    self.now = self.now.max(t);
                    self.hca.handle_timeout(self.now, &self.mem);
                }
            }
            190..=199 => {
                self.now = Instant::from_nanos(self.now.as_nanos() + (u64::from(inp.u16()) << 6));
                self.hca.handle_timeout(self.now, &self.mem);
            }
            200..=219 => {
                for _ in 0..=inp.below(3) {
                    self.post(inp);
                }
            }
            220..=229 => {
                let bytes = self.garbage(inp);
                self.deliver(bytes);
            }
            230..=233 => {
                if self.mr2_live {
                    ok(self.hca.dereg_mr(self.mrs[2].lkey), "dereg_mr");
                    self.mem.remove(self.mrs[2].lkey);
                    self.mr2_live = false;
                }
            }
            234..=237 => {
                let to = match self.state() {
                    QpState::Rts => QpState::Sqd,
                    _ => QpState::Rts,
                };
                let attr = QpAttr {
                    qp_state: to,
                    ..QpAttr::default()
                };
                let _ = self
                    .hca
                    .modify_qp(self.now, self.qpn, &attr, QpAttrMask::STATE);
            }
            _ => {
                if let Some(bytes) = self.last_datagram.clone() {
                    self.deliver(bytes);
                }
            }
        }
        while self.hca.poll_event().is_some() {}
    }

    /// A response from the fake peer, aimed at one of the WQEs.
    fn response(&mut self, inp: &mut Input<'_>) -> Vec<u8> {
        let mtu = u64::from(self.mtu);
        let (first, npkts, op, len) = match self.wqes.len() {
            0 => (self.next_psn, 1, SendOp::Send, 0),
            n => {
                // Recent WQEs first: index from the end.
                let w = &self.wqes[n - 1 - inp.index(n)];
                (w.first, w.npkts, w.op, w.len)
            }
        };
        let i = match inp.below(4) {
            0 => npkts - 1,
            1 => inp.below(npkts),
            2 => npkts,
            _ => inp.below(npkts + 3),
        };
        let delta = match inp.below(8) {
            0..=5 => 0,
            6 => 0xFF_FFFF,
            _ => inp.u24(),
        };
        let psn = first.wrapping_add(i).wrapping_add(delta);
        let kind = inp.below(16);
        let natural = kind <= 5;
        let read_op = |i: u32, n: u32| match (i, n) {
            (_, 0 | 1) => Opcode::RdmaReadResponseOnly,
            (0, _) => Opcode::RdmaReadResponseFirst,
            (i, n) if i + 1 == n => Opcode::RdmaReadResponseLast,
            _ => Opcode::RdmaReadResponseMiddle,
        };
        let (opcode, syndrome, payload_len) = match op {
            SendOp::RdmaRead { .. } if natural => {
                let l = len.saturating_sub(u64::from(i) * mtu).min(mtu);
                (read_op(i, npkts), Syndrome::ACK_UNLIMITED, l)
            }
            SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. } if natural => {
                (Opcode::AtomicAcknowledge, Syndrome::ACK_UNLIMITED, 0)
            }
            _ => match kind {
                0..=7 => (
                    Opcode::Acknowledge,
                    Syndrome::Ack {
                        credits: Credits::from_code(inp.u8() & 0x1F),
                    },
                    0,
                ),
                8 => (
                    Opcode::Acknowledge,
                    Syndrome::Nak(NakCode::PsnSequenceError),
                    0,
                ),
                9 => (
                    Opcode::Acknowledge,
                    Syndrome::RnrNak {
                        timer: RnrTimer::from_code(inp.u8() & 0x1F),
                    },
                    0,
                ),
                10 => (
                    Opcode::Acknowledge,
                    Syndrome::Nak(
                        [
                            NakCode::InvalidRequest,
                            NakCode::RemoteAccessError,
                            NakCode::RemoteOperationalError,
                            NakCode::InvalidRdRequest,
                            NakCode::Reserved(0x70),
                        ][inp.index(5)],
                    ),
                    0,
                ),
                11 | 12 => (
                    read_op(inp.below(3), 3),
                    Syndrome::ACK_UNLIMITED,
                    u64::from(inp.below(self.mtu + 2)),
                ),
                13 => (Opcode::AtomicAcknowledge, Syndrome::ACK_UNLIMITED, 0),
                14 => (Opcode::RdmaReadResponseOnly, Syndrome::ACK_UNLIMITED, 0),
                _ => (Opcode::Acknowledge, Syndrome::from(inp.u8()), 0),
            },
        };
        let payload = read_bytes(psn, payload_len as usize);
        let ext = opcode.ext_headers().unwrap_or_default();
        let bth = BthRepr::new(opcode, self.qpn, psn);
        let repr = PacketRepr {
            aeth: ext.aeth.then_some(AethRepr { syndrome, msn: 0 }),
            atomic_ack_eth: ext.atomic_ack_eth.then(|| AtomicAckEthRepr {
                orig_remote_data: orig_of(psn),
            }),
            ..PacketRepr::new(bth, &payload)
        };
        emit(&repr, Self::peer(), Self::me())
    }

    fn garbage(&mut self, inp: &mut Input<'_>) -> Vec<u8> {
        let len = inp.index(64);
        let mut bytes = inp.bytes(len).to_vec();
        if bytes.len() >= 12 {
            Packet::new_unchecked(&mut bytes[..])
                .bth_mut()
                .set_dest_qp(self.qpn);
        }
        if let Some(ctx) = ip_ctx(Self::peer(), Self::me()) {
            let _ = fill_icrc(&ctx, &mut bytes);
        }
        bytes
    }

    fn deliver(&mut self, bytes: Vec<u8>) {
        let parsed = icrc_ok(Self::peer(), Self::me(), &bytes)
            .then(|| PacketRepr::parse(&Packet::new_unchecked(&bytes[..])).ok())
            .flatten()
            .filter(|p| p.bth.dest_qp == self.qpn);
        if let Some(p) = parsed {
            let d = Delivered {
                op: p.bth.opcode,
                psn: p.bth.psn,
                syndrome: p.aeth.map(|a| a.syndrome),
            };
            if d.op.is_read_response() {
                self.read_psns.insert(d.psn.value());
            }
            if d.op == Opcode::AtomicAcknowledge {
                self.atomic_psns.insert(d.psn.value());
            }
            self.delivered.push(d);
        }
        self.hca
            .handle_datagram(self.now, Self::peer(), &bytes, &self.mem);
        self.last_datagram = Some(bytes);
    }

    // ---- checks --------------------------------------------------------------------------

    /// Drains transmits (checking every request) and the CQ (checking every completion).
    fn check_step(&mut self) {
        let wcs = poll_all(&mut self.hca, self.cq);
        self.check_wcs(&wcs);
        let state = self.state();
        let mut buf = vec![0u8; MAX_PACKET_LEN];
        let mut sent = 0usize;
        while let Some(tx) = self.hca.poll_transmit(self.now, &self.mem, &mut buf) {
            sent += 1;
            assert!(sent < 100_000, "transmit storm");
            assert_eq!(
                tx.dst,
                SocketAddr::new(B_IP.into(), PORT),
                "wrong destination"
            );
            let src = SocketAddr::new(A_IP.into(), tx.src_port);
            let bytes = &buf[..tx.len];
            assert!(
                icrc_ok(src, SocketAddr::new(B_IP.into(), PORT), bytes),
                "emitted a bad ICRC"
            );
            let p = match PacketRepr::parse(&Packet::new_unchecked(bytes)) {
                Ok(p) => p,
                Err(e) => panic!("emitted an unparsable packet: {e}"),
            };
            // Raw datagrams may be requests: the QP's responder side answers those.
            if !p.bth.opcode.is_response() {
                assert_ne!(state, QpState::Err, "a request sent from ERR");
                self.check_request(&p);
            }
        }
        let wcs = poll_all(&mut self.hca, self.cq);
        self.check_wcs(&wcs);
    }

    /// A request packet matches the outstanding WQE whose PSN range holds it.
    fn check_request(&self, p: &PacketRepr<'_>) {
        let psn = p.bth.psn;
        let op = p.bth.opcode;
        assert_eq!(p.bth.dest_qp, PEER_QPN, "request to the wrong QP");
        let Some(w) = self.wqes.iter().find(|w| !w.done && w.contains(psn)) else {
            panic!("request {op:?} PSN {psn:?} belongs to no outstanding WQE");
        };
        let mtu = u64::from(self.mtu);
        let i = psn.diff(w.first) as u32;
        let pos = match (i, w.npkts) {
            (_, 1) => Position::Only,
            (0, _) => Position::First,
            (i, n) if i + 1 == n => Position::Last,
            _ => Position::Middle,
        };
        let last = matches!(pos, Position::Last | Position::Only);
        match w.op {
            SendOp::BindMw { .. } | SendOp::LocalInv { .. } => {
                panic!("{op:?} for a local operation, which sends nothing: {w:?}")
            }
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                assert!(
                    op.is_send() && op.position() == Some(pos),
                    "{op:?} for {w:?}"
                );
            }
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } => {
                assert!(
                    op.is_write() && op.position() == Some(pos),
                    "{op:?} for {w:?}"
                );
                if i == 0 {
                    let reth = p.reth.map(|r| (r.va, r.rkey, u64::from(r.dma_len)));
                    assert_eq!(reth, Some((remote_addr, rkey, w.len)), "WRITE RETH");
                }
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                assert_eq!(op, Opcode::RdmaReadRequest, "{op:?} for {w:?}");
                let skip = u64::from(i) * mtu;
                let reth = p.reth.map(|r| (r.va, r.rkey, u64::from(r.dma_len)));
                assert_eq!(
                    reth,
                    Some((remote_addr.wrapping_add(skip), rkey, w.len - skip)),
                    "READ RETH at packet {i}"
                );
            }
            SendOp::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                assert_eq!(op, Opcode::CompareSwap);
                let eth = p.atomic_eth.map(|a| (a.va, a.rkey, a.compare, a.swap_add));
                assert_eq!(eth, Some((remote_addr, rkey, compare, swap)));
            }
            SendOp::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add,
            } => {
                assert_eq!(op, Opcode::FetchAdd);
                let eth = p.atomic_eth.map(|a| (a.va, a.rkey, a.swap_add));
                assert_eq!(eth, Some((remote_addr, rkey, add)));
            }
        }
        if !w.op.is_read_or_atomic() {
            let imm = w.op.imm().filter(|_| last);
            assert_eq!(p.immdt.map(|x| x.imm), imm, "ImmDt of {op:?} for {w:?}");
            let off = (u64::from(i) * mtu) as usize;
            let want = w.msg.get(off..).unwrap_or_default();
            let want = &want[..want.len().min(mtu as usize)];
            assert_eq!(
                p.payload, want,
                "payload of {op:?} PSN {psn:?} of WR {}",
                w.wr_id
            );
        } else {
            assert!(p.payload.is_empty());
        }
    }

    fn check_wcs(&mut self, wcs: &[WorkCompletion]) {
        for wc in wcs {
            assert_eq!(wc.qp_num, self.qpn);
            let k = wc.wr_id.wrapping_sub(1000) as usize;
            let Some(w) = self.wqes.get(k) else {
                panic!("completion for unknown WR {wc:?}");
            };
            assert!(!w.done, "WR {} completed twice", wc.wr_id);
            let from = self.last_done.map_or(0, |l| l + 1);
            assert!(k >= from, "WR {} completed out of order", wc.wr_id);
            if wc.status == WcStatus::WrFlushErr && self.in_error {
                assert_eq!(k, from, "flush skipped WRs before {}", wc.wr_id);
            }
            for j in from..k {
                assert!(
                    !self.wqes[j].signaled,
                    "signaled WR {} skipped by the completion of {}",
                    self.wqes[j].wr_id, wc.wr_id
                );
                self.wqes[j].done = true;
            }
            match wc.status {
                WcStatus::Success => {
                    assert!(!self.in_error, "success after an error: {wc:?}");
                    self.check_success(k, wc);
                }
                WcStatus::WrFlushErr => {
                    // The responder side of the QP (answering a raw datagram) may have moved
                    // it to ERR without a send-side error.
                    assert!(
                        self.in_error || self.state() == QpState::Err,
                        "flush without an error first: {wc:?}"
                    );
                    self.in_error = true;
                }
                WcStatus::RetryExcErr
                | WcStatus::RnrRetryExcErr
                | WcStatus::RemInvReqErr
                | WcStatus::RemAccessErr
                | WcStatus::RemOpErr
                | WcStatus::BadRespErr
                | WcStatus::LocProtErr
                | WcStatus::LocQpOpErr => {
                    assert!(!self.in_error, "a second error {wc:?}");
                    self.in_error = true;
                    assert_eq!(self.state(), QpState::Err, "{wc:?} left the QP out of ERR");
                }
                other => panic!("requester completion status {other:?}"),
            }
            self.wqes[k].done = true;
            self.last_done = Some(k);
        }
    }

    /// A success is reported only once the responses it needs arrived; its data is in place.
    fn check_success(&self, k: usize, wc: &WorkCompletion) {
        let w = &self.wqes[k];
        assert!(
            w.signaled,
            "success completion for unsignaled WR {}",
            w.wr_id
        );
        let want_op = match w.op {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                WcOpcode::Send
            }
            SendOp::BindMw { .. } => WcOpcode::BindMw,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
            SendOp::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
        };
        assert_eq!(wc.opcode, want_op);
        assert_eq!(u64::from(wc.byte_len), w.len, "byte_len of {wc:?}");
        let last = w.last();
        match w.op {
            SendOp::RdmaRead { .. } => {
                let mtu = u64::from(self.mtu);
                for i in 0..w.npkts {
                    let psn = w.first.wrapping_add(i);
                    assert!(
                        self.read_psns.contains(&psn.value()),
                        "READ {} succeeded without a response for PSN {psn:?}",
                        w.wr_id
                    );
                }
                let mut got = Vec::new();
                for &(key, off, len) in w.dest.iter().filter(|d| d.2 != 0) {
                    match self.mem.get(key, off, len as usize) {
                        Some(b) => got.extend(b),
                        None => panic!("READ {} succeeded into a dead buffer: {w:?}", w.wr_id),
                    }
                }
                let mut want = Vec::new();
                for i in 0..w.npkts {
                    let n = w.len.saturating_sub(u64::from(i) * mtu).min(mtu) as usize;
                    want.extend(read_bytes(w.first.wrapping_add(i), n));
                }
                assert_eq!(got, want, "READ {} destination bytes", w.wr_id);
            }
            SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. } => {
                assert!(
                    self.atomic_psns.contains(&w.first.value()),
                    "atomic {} succeeded without an atomic ACK",
                    w.wr_id
                );
                let Some((key, off)) = w.slot else {
                    panic!("atomic without a slot");
                };
                assert_eq!(
                    self.mem.get(key, off, 8),
                    Some(orig_of(w.first).to_ne_bytes().to_vec()),
                    "atomic {} result",
                    w.wr_id
                );
            }
            _ => {
                let covered = self.delivered.iter().any(|d| {
                    let ahead = d.psn.diff(last);
                    ahead > 0 || (ahead == 0 && matches!(d.syndrome, Some(Syndrome::Ack { .. })))
                });
                assert!(
                    covered,
                    "{:?} {} (PSNs {:?}..={last:?}) succeeded without an ACK",
                    w.op, w.wr_id, w.first
                );
            }
        }
    }
}
