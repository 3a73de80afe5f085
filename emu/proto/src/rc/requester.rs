//! The requester (rxe `rxe_req.c`): walks the send queue, segments messages by the path MTU,
//! assigns PSNs and builds request packets (rc-transport.md §3.1–§3.4).
//!
//! State is committed only after a packet was built, so a failed build changes nothing.
//!
//! UC QPs use it too (`crate::uc`): the same segmentation and packets with UC opcodes, no
//! AckReq, no window, no ACK timer; a WQE completes once its last packet is built.

use std::net::SocketAddr;

use verbs_api::{AccessFlags, QpState, QpType, SendFlags, SendOp, Sge, WcStatus};

use super::tx::{self, TxError};
use super::{Ctx, MAX_PKT_PER_ACK, MAX_UNACKED_PSNS, ack_timeout, packets};
use crate::memory::MemoryFault;
use crate::qp::Qp;
use crate::wire::{
    AtomicEthRepr, BthRepr, IethRepr, ImmDtRepr, Opcode, PacketRepr, Position, Psn, RethRepr,
};

/// Builds the next request packet of `qp` into `buf` and returns its length, or `None` when
/// nothing may be sent now (empty queue, limits, window, RNR wait, state).
pub(crate) fn next_packet(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    src: SocketAddr,
    buf: &mut [u8],
) -> Option<usize> {
    let state = qp.state();
    if !matches!(state, QpState::Rts | QpState::Sqd) || qp.rc.rnr_at.is_some() {
        return None;
    }
    let sr = super::sr::enabled(qp);
    if sr {
        if let Some(len) = resend(qp, ctx, src, buf) {
            return Some(len);
        }
    }
    loop {
        let idx = qp.rc.req_index;
        let wqe = qp.sq.get(idx)?;
        if wqe.tx.error.is_some() {
            return None;
        }
        if !wqe.tx.started {
            if state == QpState::Sqd {
                return None;
            }
            if wqe.op.is_local() {
                if !start_local(qp, ctx, idx) {
                    return None;
                }
                continue;
            }
            if !start(qp, ctx, idx) {
                return None;
            }
            continue;
        }
        if wqe.tx.next_pkt >= wqe.tx.npkts {
            qp.rc.req_index += 1;
            continue;
        }
        if sr && skip_sacked(qp, idx) {
            continue;
        }
        let uc = qp.qp_type == QpType::Uc;
        if !uc && window_full(qp) {
            return None;
        }
        return match build(qp, ctx, idx, src, buf) {
            Ok(len) => {
                if uc {
                    crate::uc::packet_sent(qp, ctx);
                }
                Some(len)
            }
            Err(TxError::Memory) => {
                if let Some(w) = qp.sq.get_mut(idx) {
                    w.tx.error = Some(WcStatus::LocProtErr);
                }
                None
            }
            Err(_) => {
                qp.rc.stats.dropped += 1;
                if let Some(w) = qp.sq.get_mut(idx) {
                    w.tx.error = Some(WcStatus::LocQpOpErr);
                }
                None
            }
        };
    }
}

/// Whether the window is full: [`MAX_UNACKED_PSNS`] un-ACKed PSNs in IBTA mode; with
/// selective repeat, see [`super::sr::window_full`] (a loss there holds back only the PSN
/// lost, not the window behind it).
fn window_full(qp: &Qp) -> bool {
    if super::sr::enabled(qp) {
        super::sr::window_full(&qp.rc)
    } else {
        qp.rc.req_psn.diff(qp.rc.comp_psn) >= MAX_UNACKED_PSNS
    }
}

/// Selective repeat, after a go-back-N rewind: steps over the next packet of WQE `idx` if the
/// responder reported it received (a SEND/WRITE packet; READ and atomic requests always go).
fn skip_sacked(qp: &mut Qp, idx: usize) -> bool {
    let Some(w) = qp.sq.get_mut(idx) else {
        return false;
    };
    let psn = w.tx.first_psn.wrapping_add(w.tx.next_pkt);
    let rc = &mut qp.rc;
    // The oldest unacknowledged PSN always goes: the responder dropped it if it was held
    // when it refused it (an RNR NAK), and cannot hold what its ePSN names otherwise.
    if w.op.is_read_or_atomic()
        || psn == rc.comp_psn
        || !psn.is_before(rc.sent_high)
        || !super::sr::is_sacked(rc, psn)
    {
        return false;
    }
    w.tx.next_pkt += 1;
    let end = w.tx.first_psn.wrapping_add(w.tx.next_pkt);
    if end.is_after(rc.req_psn) || w.tx.next_pkt == w.tx.npkts {
        rc.req_psn = end;
    }
    true
}

/// Selective repeat: builds the next queued resend, a packet the responder reported missing,
/// without moving the requester's cursor. `None` when there is none.
fn resend(qp: &mut Qp, ctx: &mut Ctx<'_>, src: SocketAddr, buf: &mut [u8]) -> Option<usize> {
    while let Some(psn) = qp.rc.sr.resend.pop_front() {
        let rc = &qp.rc;
        if psn.is_before(rc.comp_psn) || !psn.is_before(rc.sent_high) {
            continue;
        }
        if psn != rc.comp_psn && super::sr::is_sacked(rc, psn) {
            continue;
        }
        let Some((idx, i)) = locate(qp, psn) else {
            continue;
        };
        let (saved_next, saved_req) = (qp.sq.get(idx)?.tx.next_pkt, qp.rc.req_psn);
        if let Some(w) = qp.sq.get_mut(idx) {
            w.tx.next_pkt = i;
        }
        qp.rc.sr.resending = true;
        let built = build(qp, ctx, idx, src, buf);
        qp.rc.sr.resending = false;
        if let Some(w) = qp.sq.get_mut(idx) {
            w.tx.next_pkt = saved_next;
        }
        qp.rc.req_psn = saved_req;
        if let Ok(len) = built {
            return Some(len);
        }
    }
    None
}

/// The started remote WQE whose PSNs include `psn`, and the packet index to send for it (a
/// READ resumes at `psn`, an atomic is resent whole).
fn locate(qp: &Qp, psn: Psn) -> Option<(usize, u32)> {
    qp.sq.iter().enumerate().find_map(|(idx, w)| {
        let t = w.tx;
        let inside = t.started
            && t.error.is_none()
            && !w.op.is_local()
            && !psn.is_before(t.first_psn)
            && !psn.is_after(t.last_psn());
        let i = if w.op.is_atomic() {
            0
        } else {
            u32::try_from(psn.diff(t.first_psn)).ok()?
        };
        inside.then_some((idx, i))
    })
}

/// Starts WQE `idx`: fence and `max_rd_atomic` checks, local SGE validation, PSN assignment.
/// Returns false if it must wait. A WQE that fails validation is marked with its error status.
fn start(qp: &mut Qp, ctx: &Ctx<'_>, idx: usize) -> bool {
    let Some(wqe) = qp.sq.get(idx) else {
        return false;
    };
    let rd = wqe.op.is_read_or_atomic();
    // IBA 10.8.3.3: a fenced WQE waits for every earlier READ and atomic (§3.3).
    if wqe.flags.contains(SendFlags::FENCE) && qp.rc.rd_atomic_outstanding > 0 {
        return false;
    }
    if rd
        && qp.attr.max_rd_atomic != 0
        && qp.rc.rd_atomic_outstanding >= u32::from(qp.attr.max_rd_atomic)
    {
        return false;
    }
    if qp.qp_type != QpType::Uc && window_full(qp) {
        return false;
    }
    let mtu = qp.attr.path_mtu.bytes();
    let error = if rd && qp.attr.max_rd_atomic == 0 {
        // rxe would stall forever here (§3.4, inference); we fail the WQE instead.
        Some(WcStatus::LocQpOpErr)
    } else if wqe.flags.contains(SendFlags::INLINE) {
        None
    } else {
        // READ and atomic results are written locally: LOCAL_WRITE needed (§7.4).
        let need = if rd {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::empty()
        };
        check_sges(ctx, qp.pd, &wqe.sges, need)
    };
    let npkts = match wqe.op {
        SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. } => 1,
        _ => packets(wqe.length, mtu),
    };
    let first_psn = qp.rc.req_psn;
    let Some(wqe) = qp.sq.get_mut(idx) else {
        return false;
    };
    wqe.tx = crate::qp::WqeTx {
        started: true,
        first_psn,
        npkts,
        next_pkt: 0,
        read_from: 0,
        holds_slot: rd && error.is_none(),
        error,
    };
    if rd && error.is_none() {
        qp.rc.rd_atomic_outstanding += 1;
    }
    true
}

/// Carries out local operation WQE `idx` (BIND_MW, LOCAL_INV) when the requester reaches it,
/// in order with the packets around it (a FENCE waits for earlier READs and atomics, §3.3). It
/// takes no PSN; the completer retires it in order (`completer::complete_head_errors`). A
/// failed bind is `MW_BIND_ERR`, a failed invalidation `LOC_QP_OP_ERR` (rxe's statuses).
fn start_local(qp: &mut Qp, ctx: &mut Ctx<'_>, idx: usize) -> bool {
    let Some(wqe) = qp.sq.get(idx) else {
        return false;
    };
    if wqe.flags.contains(SendFlags::FENCE) && qp.rc.rd_atomic_outstanding > 0 {
        return false;
    }
    let error = match wqe.op {
        SendOp::BindMw {
            mw,
            rkey,
            mr,
            addr,
            length,
            access,
        } => {
            let args = crate::mw::BindArgs {
                mw,
                rkey,
                mr,
                addr,
                length,
                access,
            };
            crate::mw::bind(ctx.mws, ctx.mrs, qp.qpn, qp.pd, &args).err()
        }
        SendOp::LocalInv { rkey } => {
            (!crate::mw::invalidate(ctx.mws, rkey, qp.pd)).then_some(WcStatus::LocQpOpErr)
        }
        _ => Some(WcStatus::LocQpOpErr),
    };
    let first_psn = qp.rc.req_psn;
    if let Some(wqe) = qp.sq.get_mut(idx) {
        wqe.tx = crate::qp::WqeTx {
            started: true,
            first_psn,
            error,
            ..crate::qp::WqeTx::default()
        };
    }
    true
}

/// Checks every non-empty SGE: registered in the QP's PD, in range, with `need` rights (§7.4).
fn check_sges(
    ctx: &Ctx<'_>,
    pd: crate::ids::PdId,
    sges: &[Sge],
    need: AccessFlags,
) -> Option<WcStatus> {
    let bad = sges.iter().filter(|s| s.length != 0).any(|s| {
        ctx.mr(s.lkey, pd).is_none_or(|mr| {
            !mr.access.contains(need)
                || s.addr < mr.iova
                || (s.addr - mr.iova).saturating_add(u64::from(s.length)) > mr.length
        })
    });
    bad.then_some(WcStatus::LocProtErr)
}

/// Copies `out.len()` message bytes starting at message offset `offset` out of `sges`.
pub(crate) fn gather(
    ctx: &Ctx<'_>,
    sges: &[Sge],
    offset: u64,
    out: &mut [u8],
) -> Result<(), MemoryFault> {
    sg_copy(ctx, sges, offset, out.len(), |key, at, range| {
        ctx.mem.read(key, at, &mut out[range])
    })
}

/// Walks `sges` for `len` message bytes from `offset`, calling `f(key, mr_offset, range)` for
/// each piece, where `range` indexes the caller's contiguous buffer.
pub(crate) fn sg_copy(
    ctx: &Ctx<'_>,
    sges: &[Sge],
    mut offset: u64,
    len: usize,
    mut f: impl FnMut(u32, u64, std::ops::Range<usize>) -> Result<(), MemoryFault>,
) -> Result<(), MemoryFault> {
    let mut done = 0usize;
    for sge in sges {
        if done == len {
            break;
        }
        let sge_len = u64::from(sge.length);
        if offset >= sge_len {
            offset -= sge_len;
            continue;
        }
        let take = usize::try_from(sge_len - offset)
            .unwrap_or(usize::MAX)
            .min(len - done);
        let mr = ctx
            .mrs
            .get(sge.lkey >> 8)
            .filter(|m| m.lkey == sge.lkey)
            .ok_or(MemoryFault)?;
        let at = sge
            .addr
            .checked_sub(mr.iova)
            .and_then(|o| o.checked_add(offset))
            .ok_or(MemoryFault)?;
        f(sge.lkey, at, done..done + take)?;
        done += take;
        offset = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(MemoryFault)
    }
}

/// Builds packet `next_pkt` of WQE `idx` and commits the requester state.
fn build(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    idx: usize,
    src: SocketAddr,
    buf: &mut [u8],
) -> Result<usize, TxError> {
    let wqe = qp.sq.get(idx).ok_or(TxError::Memory)?;
    let mtu = qp.attr.path_mtu.bytes();
    let uc = qp.qp_type == QpType::Uc;
    let transport = if uc { crate::uc::TRANSPORT } else { 0 };
    let t = wqe.tx;
    let rd = wqe.op.is_read_or_atomic();
    let i = t.next_pkt;
    let psn = t.first_psn.wrapping_add(i);
    let tpl = &mut qp.tx;
    tpl.prepare(src, qp.peer_ip, qp.attr.ah_attr.udp_dport)?;
    let bth = |opcode: Opcode, ack_req: bool, solicited: bool| BthRepr {
        solicited,
        ack_req,
        ..BthRepr::new(opcode, qp.attr.dest_qp_num, psn)
    };
    let (len, next_pkt, payload, ack_req) = match wqe.op {
        SendOp::RdmaRead { remote_addr, rkey } => {
            let skip = u64::from(i) * u64::from(mtu);
            let reth = RethRepr {
                va: remote_addr.wrapping_add(skip),
                rkey,
                dma_len: u32::try_from(wqe.length.saturating_sub(skip)).unwrap_or(u32::MAX),
            };
            let hdrs = PacketRepr {
                reth: Some(reth),
                ..PacketRepr::new(bth(Opcode::RdmaReadRequest, true, false), &[])
            };
            let len = tx::emit(&hdrs, 0, tpl, buf, |_| Ok(()))?;
            (len, t.npkts, 0, true)
        }
        SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. } => {
            let (opcode, atomic) = match wqe.op {
                SendOp::AtomicCmpAndSwp {
                    remote_addr,
                    rkey,
                    compare,
                    swap,
                } => (
                    Opcode::CompareSwap,
                    AtomicEthRepr {
                        va: remote_addr,
                        rkey,
                        swap_add: swap,
                        compare,
                    },
                ),
                SendOp::AtomicFetchAndAdd {
                    remote_addr,
                    rkey,
                    add,
                } => (
                    Opcode::FetchAdd,
                    AtomicEthRepr {
                        va: remote_addr,
                        rkey,
                        swap_add: add,
                        compare: 0,
                    },
                ),
                _ => return Err(TxError::Memory),
            };
            let hdrs = PacketRepr {
                atomic_eth: Some(atomic),
                ..PacketRepr::new(bth(opcode, true, false), &[])
            };
            (tx::emit(&hdrs, 0, tpl, buf, |_| Ok(()))?, 1, 0, true)
        }
        op => {
            let offset = u64::from(i) * u64::from(mtu);
            let n =
                usize::try_from(wqe.length.saturating_sub(offset).min(u64::from(mtu))).unwrap_or(0);
            let pos = position(i, t.npkts);
            let last = matches!(pos, Position::Last | Position::Only);
            let opcode = request_opcode(&op, pos);
            let ack_req = !uc && (last || (i + 1) % MAX_PKT_PER_ACK == 0);
            let solicited = last && wqe.flags.contains(SendFlags::SOLICITED);
            let mut hdrs = PacketRepr::new(bth(opcode, ack_req, solicited), &[]);
            if let SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } = op
            {
                if matches!(pos, Position::First | Position::Only) {
                    hdrs.reth = Some(RethRepr {
                        va: remote_addr,
                        rkey,
                        dma_len: u32::try_from(wqe.length).unwrap_or(u32::MAX),
                    });
                }
            }
            if let Some(imm) = op.imm().filter(|_| last) {
                hdrs.immdt = Some(ImmDtRepr { imm });
            }
            if let SendOp::SendWithInv { invalidate_rkey } = op {
                hdrs.ieth = last.then_some(IethRepr {
                    rkey: invalidate_rkey,
                });
            }
            let inline = wqe.flags.contains(SendFlags::INLINE);
            let len = tx::emit_as(&hdrs, transport, n, tpl, buf, |out| {
                if inline {
                    let start = usize::try_from(offset).map_err(|_| MemoryFault)?;
                    let src = wqe
                        .inline
                        .get(start..start + out.len())
                        .ok_or(MemoryFault)?;
                    out.copy_from_slice(src);
                    Ok(())
                } else {
                    gather(ctx, &wqe.sges, offset, out)
                }
            })?;
            (len, i + 1, n, ack_req)
        }
    };
    // Commit.
    let rc = &mut qp.rc;
    let retransmit = psn.is_before(rc.sent_high);
    if let Some(w) = qp.sq.get_mut(idx) {
        if matches!(w.op, SendOp::RdmaRead { .. }) {
            w.tx.read_from = i;
        }
        w.tx.next_pkt = next_pkt;
    }
    // The WQE's last packet is out: step past it now, as the requester's next turn would do
    // before anything else, so that turn (a no-op otherwise) can be skipped (`Hca::poll_transmit`
    // skips an idle QP). Not while resending an earlier packet out of turn.
    if next_pkt >= t.npkts && !rc.sr.resending && rc.req_index == idx {
        rc.req_index = idx + 1;
    }
    let end = t.first_psn.wrapping_add(next_pkt);
    if end.is_after(rc.req_psn) || next_pkt == t.npkts {
        rc.req_psn = end;
    }
    if rc.req_psn.is_after(rc.sent_high) {
        rc.sent_high = rc.req_psn;
    }
    rc.stats.sent_pkts += 1;
    rc.stats.sent_bytes += payload as u64;
    if uc {
        // No ACK comes: no RTT sample, no retransmission timer.
        return Ok(len);
    }
    // One RTT sample at a time, from a first transmission that asks for an ACK (Karn: never
    // from a retransmission, whose ACK is ambiguous).
    if !retransmit && ack_req && rc.rtt_probe.is_none() {
        rc.rtt_probe = Some((psn, ctx.now));
    }
    if super::sr::enabled(qp) {
        // A READ or atomic is one unit at its first PSN.
        let unit = if rd { t.first_psn } else { psn };
        super::sr::sent(&mut qp.rc, unit, ctx.now);
    }
    let rc = &mut qp.rc;
    if retransmit {
        if rc.sr.resending {
            rc.stats.retransmits_sack += 1;
        } else if rc.retry_by_timeout {
            rc.stats.retransmits_timeout += 1;
        } else {
            rc.stats.retransmits_nak += 1;
        }
    }
    if rc.retransmit_at.is_none() {
        rc.retransmit_at = ack_timeout(qp.attr.timeout).map(|d| ctx.now + d);
    }
    Ok(len)
}

/// Position of packet `i` of `n` in its message.
pub(crate) fn position(i: u32, n: u32) -> Position {
    match (i, n) {
        (_, 0 | 1) => Position::Only,
        (0, _) => Position::First,
        (i, n) if i + 1 == n => Position::Last,
        _ => Position::Middle,
    }
}

/// The request opcode of a SEND or WRITE packet at `pos` (rc-transport.md §3.1).
fn request_opcode(op: &SendOp, pos: Position) -> Opcode {
    use Opcode::*;
    let imm = op.imm().is_some();
    let write = matches!(
        op,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }
    );
    if matches!(op, SendOp::SendWithInv { .. }) {
        match pos {
            Position::Last => return SendLastWithInvalidate,
            Position::Only => return SendOnlyWithInvalidate,
            _ => {}
        }
    }
    match (write, pos, imm) {
        (false, Position::First, _) => SendFirst,
        (false, Position::Middle, _) => SendMiddle,
        (false, Position::Last, false) => SendLast,
        (false, Position::Last, true) => SendLastWithImmediate,
        (false, Position::Only, false) => SendOnly,
        (false, Position::Only, true) => SendOnlyWithImmediate,
        (true, Position::First, _) => RdmaWriteFirst,
        (true, Position::Middle, _) => RdmaWriteMiddle,
        (true, Position::Last, false) => RdmaWriteLast,
        (true, Position::Last, true) => RdmaWriteLastWithImmediate,
        (true, Position::Only, false) => RdmaWriteOnly,
        (true, Position::Only, true) => RdmaWriteOnlyWithImmediate,
    }
}
