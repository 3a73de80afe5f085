//! The responder (rxe `rxe_resp.c`): checks and executes incoming requests and queues the
//! responses (rc-transport.md §4), in rxe's stage order: `check_psn`, `check_op_seq`,
//! `check_op_valid`, `check_resource`, `check_length`, `check_rkey`, `execute`, `complete`,
//! `acknowledge`.
//!
//! Each check either passes or yields a [`Disposition`]; only `execute` touches memory.

use std::net::SocketAddr;

use verbs_api::{
    AccessFlags, AsyncEventKind, EventElement, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

use super::requester::{position, sg_copy};
use super::tx::{self, PacketClass, TxError};
use super::{Ctx, InMsg, Resource, ResourceKind, Response, packets};
use crate::ids::PdId;
use crate::memory::AtomicOp;
use crate::qp::{Qp, RecvWqe};
use crate::stats::RxDropCause;
use crate::wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, NakCode, Opcode, PacketRepr, Position, Psn, RethRepr,
    RnrTimer, SACK_OPCODE, SackPacketRepr, SackRepr, Syndrome,
};

/// How many responses a QP may have queued; beyond it, new requests are dropped (the requester
/// retries). Bounds the memory a peer can make us spend.
const MAX_QUEUED_RESPONSES: usize = 256;

/// The largest RDMA message (RETH DMA length, C9-94).
const MAX_DMA_LEN: u32 = 0x8000_0000;

/// What happened to one request, after the stages.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Disposition {
    /// Accepted (and possibly acknowledged).
    Accepted,
    /// Dropped without changing state (duplicates with nothing to replay, queue full, gaps).
    Dropped,
    /// A class A/C error: a NAK was queued and the QP must enter ERR.
    Fatal,
    /// The request needs a receive WQE and none is posted; nothing was consumed. RC answers
    /// with an RNR NAK, UC drops the message (`crate::uc`).
    NotReady,
}

/// A responder error: the NAK to send and, if a receive WQE was consumed, its status.
pub(crate) struct Reject {
    pub(crate) nak: NakCode,
    pub(crate) recv_status: Option<WcStatus>,
}

fn reject(nak: NakCode) -> Reject {
    Reject {
        nak,
        recv_status: None,
    }
}

/// Handles one request packet for `qp` (state RTR, RTS or SQD).
pub(crate) fn handle_request(qp: &mut Qp, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) -> Disposition {
    if qp.rc.responses.len() >= MAX_QUEUED_RESPONSES {
        qp.rc.stats.count_drop(RxDropCause::ResponderBusy);
        return Disposition::Dropped;
    }
    // check_psn (§2.6)
    let psn = pkt.bth.psn;
    let d = psn.diff(qp.rc.epsn);
    if d > 0 && super::sr::enabled(qp) {
        let place = |qp: &mut Qp, ahead| place_early(qp, ctx, pkt, ahead);
        if super::sr::hold(qp, pkt, d, place) {
            return Disposition::Accepted;
        }
        qp.rc.stats.count_drop(RxDropCause::OutOfSequence);
        return Disposition::Dropped;
    }
    if d > 0 {
        qp.rc.stats.count_drop(RxDropCause::OutOfSequence);
        if seq_nak_due(&mut qp.rc, psn) {
            qp.rc.stats.seq_naks_sent += 1;
            let epsn = qp.rc.epsn;
            qp.rc.responses.push_back(Response::Nak {
                psn: epsn,
                code: NakCode::PsnSequenceError,
            });
        }
        return Disposition::Dropped;
    }
    if d < 0 {
        qp.rc.stats.duplicate_request += 1;
        let answered = duplicate(qp, pkt);
        if answered == Disposition::Dropped {
            qp.rc.stats.count_drop(RxDropCause::DuplicateRequest);
        }
        return answered;
    }
    let d = in_order(qp, ctx, pkt);
    if d == Disposition::Accepted && super::sr::enabled(qp) {
        return drain_held(qp, ctx);
    }
    d
}

/// Selective repeat: executes the held requests the gap's end made in order, in PSN order,
/// until one is missing or fails; then acknowledges selectively.
fn drain_held(qp: &mut Qp, ctx: &mut Ctx<'_>) -> Disposition {
    let mut drained = false;
    while let Some(held) = super::sr::take_next_held(&mut qp.rc) {
        drained = true;
        qp.rc.sr.replaying_placed = held.placed.is_some();
        let d = in_order(qp, ctx, &held.repr());
        qp.rc.sr.replaying_placed = false;
        match d {
            Disposition::Accepted => {}
            Disposition::Fatal => return Disposition::Fatal,
            Disposition::Dropped | Disposition::NotReady => break,
        }
    }
    // What is still held, or what was executed without an ACK of its own, is reported.
    let acked = matches!(qp.rc.responses.back(), Some(Response::Ack { .. }));
    if drained && (!qp.rc.sr.held.is_empty() || !acked) {
        super::sr::queue_sack(&mut qp.rc);
    }
    Disposition::Accepted
}

/// The stages for the request at ePSN; a rejected one queues its NAK.
fn in_order(qp: &mut Qp, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) -> Disposition {
    let psn = pkt.bth.psn;
    match execute_in_order(qp, ctx, pkt) {
        Ok(d) => d,
        Err(r) => {
            if let Some(status) = r.recv_status {
                if let InMsg::Send { wqe, .. } = std::mem::take(&mut qp.rc.msg) {
                    ctx.wcs
                        .push((qp.recv_cq, recv_error(qp, &wqe, status), false));
                }
            }
            qp.rc
                .responses
                .push_back(Response::Nak { psn, code: r.nak });
            Disposition::Fatal
        }
    }
}

/// Out-of-sequence packets of one round that draw one repeated sequence NAK while the gap
/// persists (see [`seq_nak_due`]).
pub(crate) const SEQ_NAK_REPEAT: u32 = 32;

/// Whether an out-of-sequence request at `psn` draws a PSN sequence NAK (rc-transport.md §2.6).
///
/// rxe NAKs the first out-of-sequence packet of a gap and then stays silent until an in-order
/// packet arrives, so a lost NAK or a lost first retransmission leaves the requester to its
/// ACK timeout. We NAK the first one too, and NAK again while the gap persists:
/// * when a packet does not follow the previous out-of-sequence one (its PSN is not after
///   it): the requester went back (a new go-back-N round), and the PSN we expect was lost
///   again;
/// * after every [`SEQ_NAK_REPEAT`] further out-of-sequence packets of the same round: the
///   requester keeps sending past the gap, so our NAK was lost.
///
/// Every NAK carries the same ePSN, so a repeat only ever asks again for what the first asked
/// for (§2.9); the requester decides whether it starts another retry (§3.7 burst protection,
/// `completer::nak_retry`). DIVERGENCES.md #19.
fn seq_nak_due(rc: &mut super::RcState, psn: Psn) -> bool {
    let due = if !rc.seq_nak_sent || !psn.is_after(rc.gap_last) {
        rc.gap_unanswered = 0;
        true
    } else {
        rc.gap_unanswered += 1;
        rc.gap_unanswered % SEQ_NAK_REPEAT == 0
    };
    rc.seq_nak_sent = true;
    rc.gap_last = psn;
    due
}

pub(crate) fn recv_error(qp: &Qp, wqe: &RecvWqe, status: WcStatus) -> WorkCompletion {
    WorkCompletion {
        wr_id: wqe.wr_id,
        status,
        opcode: WcOpcode::Recv,
        qp_num: qp.qpn,
        ..WorkCompletion::default()
    }
}

/// The stages for an in-order request.
fn execute_in_order(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    pkt: &PacketRepr<'_>,
) -> Result<Disposition, Reject> {
    let op = pkt.bth.opcode;
    let psn = pkt.bth.psn;
    let mtu = u64::from(qp.attr.path_mtu.bytes());
    let pos = op
        .position()
        .ok_or_else(|| reject(NakCode::InvalidRequest))?;
    let n = pkt.payload.len() as u64;

    // check_op_seq (§4.3): a message is open exactly while MIDDLE/LAST packets are expected.
    let open_send = matches!(qp.rc.msg, InMsg::Send { .. });
    let open_write = matches!(qp.rc.msg, InMsg::Write { .. });
    let continues = matches!(pos, Position::Middle | Position::Last);
    let seq_ok = match (continues, op.is_send(), op.is_write()) {
        (true, true, _) => open_send,
        (true, _, true) => open_write,
        (false, _, _) => !open_send && !open_write,
        _ => false,
    };
    if !seq_ok {
        return Err(reject(NakCode::InvalidRequest));
    }

    if !op_valid(qp, op) {
        return Err(reject(NakCode::InvalidRequest));
    }
    let rd = matches!(
        op,
        Opcode::RdmaReadRequest | Opcode::CompareSwap | Opcode::FetchAdd
    );
    if rd && qp.attr.max_dest_rd_atomic == 0 {
        return Err(reject(NakCode::InvalidRequest));
    }

    // check_length (§1.7), before anything is consumed.
    if !length_ok(op, pos, n, mtu) {
        return Err(reject(NakCode::InvalidRequest));
    }

    match op {
        Opcode::RdmaReadRequest => read_request(qp, ctx, pkt),
        Opcode::CompareSwap | Opcode::FetchAdd => atomic(qp, ctx, pkt),
        _ if op.is_write() => write(qp, ctx, pkt, pos),
        _ if op.is_send() => send(qp, ctx, pkt, pos),
        _ => Err(reject(NakCode::InvalidRequest)),
    }
    .map(|d| match d {
        Disposition::NotReady => rnr(qp, psn),
        d => d,
    })
    .inspect(|d| {
        if *d == Disposition::Accepted {
            accept(qp, pkt.bth.ack_req && !rd, psn);
            // A READ does not move the re-ACK PSN (§4.5: never a read-response PSN).
            if op != Opcode::RdmaReadRequest {
                qp.rc.ack_psn = psn.wrapping_add(1);
            }
        }
    })
}

/// check_op_valid (§4.3): whether the QP's access flags grant what `op` needs (rxe answers
/// INVALID_REQUEST otherwise).
fn op_valid(qp: &Qp, op: Opcode) -> bool {
    let need = if op.is_write() {
        Some(AccessFlags::REMOTE_WRITE)
    } else if op == Opcode::RdmaReadRequest {
        Some(AccessFlags::REMOTE_READ)
    } else if matches!(op, Opcode::CompareSwap | Opcode::FetchAdd) {
        Some(AccessFlags::REMOTE_ATOMIC)
    } else {
        None
    };
    need.is_none_or(|need| qp.attr.qp_access_flags.contains(need))
}

/// check_length (§1.7): whether an `op` packet at `pos` may carry `n` payload bytes.
fn length_ok(op: Opcode, pos: Position, n: u64, mtu: u64) -> bool {
    match pos {
        _ if !op.has_payload() => true,
        Position::First | Position::Middle => n == mtu,
        Position::Last => n >= 1 && n <= mtu,
        Position::Only => n <= mtu,
    }
}

/// check_rkey for an RDMA WRITE's RETH (§4.4): the memory key and offset its first byte lands
/// at. A zero-length WRITE is not validated (C9-88).
fn write_target(qp: &Qp, ctx: &Ctx<'_>, reth: &RethRepr) -> Result<(u32, u64), Reject> {
    if reth.dma_len > MAX_DMA_LEN {
        return Err(reject(NakCode::InvalidRequest));
    }
    if reth.dma_len == 0 {
        return Ok((0, 0));
    }
    ctx.resolve_remote(
        reth.rkey,
        qp.pd,
        qp.qpn,
        reth.va,
        u64::from(reth.dma_len),
        AccessFlags::REMOTE_WRITE,
    )
    .ok_or_else(|| reject(NakCode::RemoteAccessError))
}

/// Whether memory key `key`, resolved from `rkey` at a WRITE's first packet, still grants the
/// rest of the message. Later packets reuse it (§4.4), but only while the MR is still
/// registered: once deregistered, its key is stale and its index may already name another
/// MR, which drivers that map memory by key index (emu-sim) would write into. As for an MR
/// gone mid-READ, that is an R_Key violation (class C). A window invalidated since the first
/// packet no longer grants the rest of the message either.
fn write_granted(ctx: &Ctx<'_>, pd: PdId, rkey: u32, key: u32) -> bool {
    ctx.mr(key, pd).is_some() && crate::mw::still_bound(ctx.mws, rkey, key)
}

/// Commits an accepted in-order SEND/WRITE packet: ePSN advances; AckReq asks for an ACK,
/// coalesced with one still queued (§2.7, §4.7).
fn accept(qp: &mut Qp, ack: bool, psn: Psn) {
    let rc = &mut qp.rc;
    rc.seq_nak_sent = false;
    rc.stats.rcvd_pkts += 1;
    if rc.epsn == psn {
        rc.epsn = psn.wrapping_add(1);
    }
    if ack {
        match rc.responses.back_mut() {
            Some(Response::Ack { psn: queued, first })
                if psn.diff(*first) < super::MAX_ACK_COALESCE =>
            {
                *queued = psn
            }
            _ => rc.responses.push_back(Response::Ack { psn, first: psn }),
        }
    }
}

/// Takes the next receive WQE from the QP's RQ or its SRQ, raising SRQ_LIMIT_REACHED when the
/// SRQ falls below an armed limit.
pub(crate) fn take_recv_wqe(qp: &mut Qp, ctx: &mut Ctx<'_>) -> Option<RecvWqe> {
    let Some(srq) = qp.srq else {
        return qp.rq.pop_front();
    };
    let entry = ctx.srqs.get_mut(srq.0)?;
    let wqe = entry.queue.pop_front()?;
    let limit = entry.attr.srq_limit;
    if limit != 0 && (entry.queue.len() as u64) < u64::from(limit) {
        entry.attr.srq_limit = 0;
        ctx.events.push_back(verbs_api::AsyncEvent {
            kind: AsyncEventKind::SrqLimitReached,
            element: EventElement::Srq(srq.0),
        });
    }
    Some(wqe)
}

/// Queues an RNR NAK (§4.2): the request is dropped, the QP stays in RTS.
fn rnr(qp: &mut Qp, psn: Psn) -> Disposition {
    qp.rc.stats.count_drop(RxDropCause::ReceiverNotReady);
    qp.rc.responses.push_back(Response::RnrNak { psn });
    Disposition::Dropped
}

/// Places one SEND packet (any position) into the open message's receive WQE, taking one on
/// FIRST/ONLY ([`Disposition::NotReady`] if none is posted), and completes it on LAST/ONLY.
/// Shared by RC and UC; sequencing and length checks come first.
pub(crate) fn send(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    pkt: &PacketRepr<'_>,
    pos: Position,
) -> Result<Disposition, Reject> {
    if matches!(pos, Position::First | Position::Only) {
        // check_resource: SEND_FIRST/ONLY consume a receive WQE (§4.2).
        let Some(wqe) = take_recv_wqe(qp, ctx) else {
            return Ok(Disposition::NotReady);
        };
        let capacity = wqe.sges.iter().map(|s| u64::from(s.length)).sum();
        // A malformed receive WQE (bad lkey, no LOCAL_WRITE, range) is class A (§4.3).
        let bad = wqe.sges.iter().filter(|s| s.length != 0).any(|s| {
            ctx.resolve(
                s.lkey,
                qp.pd,
                s.addr,
                u64::from(s.length),
                AccessFlags::LOCAL_WRITE,
            )
            .is_none()
        });
        qp.rc.msg = InMsg::Send {
            wqe,
            placed: 0,
            capacity,
        };
        if bad {
            // A malformed receive WQE is class A: NAK 0x63 to the requester (§4.3). Its bad
            // L_Key is a local protection error at the responder; rxe reports LOC_QP_OP_ERR
            // (DIVERGENCES.md #4).
            return Err(Reject {
                nak: NakCode::RemoteOperationalError,
                recv_status: Some(WcStatus::LocProtErr),
            });
        }
    }
    let InMsg::Send {
        wqe,
        placed,
        capacity,
    } = &mut qp.rc.msg
    else {
        return Err(reject(NakCode::InvalidRequest));
    };
    let n = pkt.payload.len() as u64;
    if *placed + n > *capacity {
        // The receive buffers are too small: LOC_LEN_ERR at the responder (§4.3).
        return Err(Reject {
            nak: NakCode::InvalidRequest,
            recv_status: Some(WcStatus::LocLenErr),
        });
    }
    let at = *placed;
    let written = sg_copy(ctx, &wqe.sges, at, pkt.payload.len(), |key, off, range| {
        ctx.mem.write(key, off, &pkt.payload[range])
    });
    if written.is_err() {
        return Err(Reject {
            nak: NakCode::RemoteOperationalError,
            recv_status: Some(WcStatus::LocProtErr),
        });
    }
    *placed += n;
    qp.rc.stats.rcvd_bytes += n;
    if matches!(pos, Position::Last | Position::Only) {
        let Ok(invalidated) = remote_invalidate(qp, ctx, pkt) else {
            return Ok(invalidate_failed(qp, ctx, pkt));
        };
        let InMsg::Send { wqe, placed, .. } = std::mem::take(&mut qp.rc.msg) else {
            return Err(reject(NakCode::InvalidRequest));
        };
        let imm = pkt.immdt.map(|i| i.imm);
        let mut wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: u32::try_from(placed).unwrap_or(u32::MAX),
            imm_data: imm.unwrap_or(0),
            wc_flags: if imm.is_some() {
                WcFlags::WITH_IMM
            } else {
                WcFlags::empty()
            },
            qp_num: qp.qpn,
            src_qp: qp.attr.dest_qp_num,
            ..WorkCompletion::default()
        };
        if let Some(rkey) = invalidated {
            wc.wc_flags |= WcFlags::WITH_INV;
            wc.invalidated_rkey = rkey;
        }
        ctx.wcs.push((qp.recv_cq, wc, pkt.bth.solicited));
        qp.rc.msn = qp.rc.msn.wrapping_add(1) & 0xFF_FFFF;
    }
    Ok(Disposition::Accepted)
}

/// The invalidation a SEND_*_WITH_INVALIDATE asks for at its last packet (IBTA §9.4.1.5,
/// o10-37.2.x): the type 2 window of the QP's PD whose R_Key the IETH names is unbound, and its
/// key is reported. `Err` if the key names no such window (see [`invalidate_failed`]).
fn remote_invalidate(qp: &Qp, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) -> Result<Option<u32>, ()> {
    match pkt.ieth {
        None => Ok(None),
        Some(ieth) if crate::mw::invalidate(ctx.mws, ieth.rkey, qp.pd) => Ok(Some(ieth.rkey)),
        Some(_) => Err(()),
    }
}

/// A SEND_WITH_INV whose R_Key could not be invalidated (rxe's class J,
/// `RESPST_ERR_INVALIDATE_RKEY`): the message is acknowledged — the requester's WR succeeds —
/// but its receive WQE completes with `REM_INV_REQ_ERR` and the QP enters ERR.
fn invalidate_failed(qp: &mut Qp, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) -> Disposition {
    if let InMsg::Send { wqe, .. } = std::mem::take(&mut qp.rc.msg) {
        let wc = recv_error(qp, &wqe, WcStatus::RemInvReqErr);
        ctx.wcs.push((qp.recv_cq, wc, false));
    }
    accept(qp, pkt.bth.ack_req, pkt.bth.psn);
    Disposition::Fatal
}

/// Executes one RDMA WRITE packet (any position): resolves the R_Key on FIRST/ONLY, writes
/// the payload, and on a *_WITH_IMMEDIATE end consumes a receive WQE and completes it
/// ([`Disposition::NotReady`] if none is posted). Shared by RC and UC.
pub(crate) fn write(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    pkt: &PacketRepr<'_>,
    pos: Position,
) -> Result<Disposition, Reject> {
    let n = pkt.payload.len() as u64;
    let last = matches!(pos, Position::Last | Position::Only);
    let imm = pkt.immdt.map(|i| i.imm);
    // check_resource: WRITE_*_WITH_IMMEDIATE consume a receive WQE at the last packet (§1.3).
    if imm.is_some() {
        let available = match qp.srq {
            Some(srq) => ctx.srqs.get(srq.0).is_some_and(|s| !s.queue.is_empty()),
            None => !qp.rq.is_empty(),
        };
        if !available {
            return Ok(Disposition::NotReady);
        }
    }
    if matches!(pos, Position::First | Position::Only) {
        let reth = pkt.reth.ok_or_else(|| reject(NakCode::InvalidRequest))?;
        let (key, offset) = write_target(qp, ctx, &reth)?;
        qp.rc.msg = InMsg::Write {
            rkey: reth.rkey,
            key,
            offset,
            remaining: u64::from(reth.dma_len),
            total: reth.dma_len,
        };
    }
    let pd = qp.pd;
    let InMsg::Write {
        rkey,
        key,
        offset,
        remaining,
        total,
    } = &mut qp.rc.msg
    else {
        return Err(reject(NakCode::InvalidRequest));
    };
    // The payload must add up to the RETH length exactly (§1.7).
    if n > *remaining || (last && n != *remaining) {
        return Err(reject(NakCode::InvalidRequest));
    }
    // MIDDLE and LAST reuse the MR resolved on FIRST while it still grants them. A packet
    // selective repeat placed on arrival (`place_early`) is checked again but not written again.
    let placed = qp.rc.sr.replaying_placed;
    if n != 0
        && (!write_granted(ctx, pd, *rkey, *key)
            || (!placed && ctx.mem.write(*key, *offset, pkt.payload).is_err()))
    {
        return Err(reject(NakCode::RemoteAccessError));
    }
    *offset += n;
    *remaining -= n;
    let total = *total;
    qp.rc.stats.rcvd_bytes += n;
    if last {
        qp.rc.msg = InMsg::None;
        qp.rc.msn = qp.rc.msn.wrapping_add(1) & 0xFF_FFFF;
        if let Some(imm) = imm {
            // Checked available above.
            let Some(wqe) = take_recv_wqe(qp, ctx) else {
                return Ok(Disposition::NotReady);
            };
            let wc = WorkCompletion {
                wr_id: wqe.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: total,
                imm_data: imm,
                wc_flags: WcFlags::WITH_IMM,
                qp_num: qp.qpn,
                src_qp: qp.attr.dest_qp_num,
                ..WorkCompletion::default()
            };
            ctx.wcs.push((qp.recv_cq, wc, pkt.bth.solicited));
        }
    }
    Ok(Disposition::Accepted)
}

/// Selective repeat: places RDMA WRITE packet `pkt`, held `ahead` PSNs after ePSN, in memory
/// on arrival, if where it goes is known and it passes the checks the in-order stages make
/// ([`op_valid`], [`length_ok`], [`write_target`] or [`write_granted`], the bytes fit the
/// message). Where it goes is known when it opens its message (FIRST/ONLY), or when the message
/// open in order or a held packet placed before it covers its PSN: a message's packets have
/// consecutive PSNs, so its length says which PSNs are its own. Packets with immediate data
/// (they need a receive WQE, which may be missing), SENDs, READs and atomics wait for the
/// in-order stages. Returns where it went, or `None` if it was not placed.
pub(crate) fn place_early(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    pkt: &PacketRepr<'_>,
    ahead: u32,
) -> Option<super::sr::Placed> {
    let op = pkt.bth.opcode;
    let pos = op.position()?;
    let n = pkt.payload.len() as u64;
    let mtu = u64::from(qp.attr.path_mtu.bytes());
    if !op.is_write() || pkt.immdt.is_some() || n == 0 {
        return None;
    }
    if !op_valid(qp, op) || !length_ok(op, pos, n, mtu) {
        return None;
    }
    let at = early_target(qp, ctx, pkt, pos, ahead, mtu)?;
    let last = matches!(pos, Position::Last | Position::Only);
    if n > at.room || (last && n != at.room) || !write_granted(ctx, qp.pd, at.rkey, at.key) {
        return None;
    }
    ctx.mem.write(at.key, at.offset, pkt.payload).ok()?;
    qp.rc.stats.sr_placed_early += 1;
    Some(at)
}

/// Where WRITE packet `pkt` at `pos`, `ahead` PSNs after ePSN, goes (see [`place_early`]).
fn early_target(
    qp: &Qp,
    ctx: &Ctx<'_>,
    pkt: &PacketRepr<'_>,
    pos: Position,
    ahead: u32,
    mtu: u64,
) -> Option<super::sr::Placed> {
    use super::sr::Placed;
    if matches!(pos, Position::First | Position::Only) {
        let reth = pkt.reth?;
        let (key, offset) = write_target(qp, ctx, &reth).ok()?;
        let room = u64::from(reth.dma_len);
        return Some(Placed {
            rkey: reth.rkey,
            key,
            offset,
            room,
        });
    }
    // From a packet `k` PSNs before this one whose place is known.
    let from = |p: Placed, k: u32| {
        let skip = u64::from(k) * mtu;
        (p.room > skip).then(|| Placed {
            offset: p.offset + skip,
            room: p.room - skip,
            ..p
        })
    };
    if let InMsg::Write {
        rkey,
        key,
        offset,
        remaining,
        ..
    } = qp.rc.msg
    {
        let open = Placed {
            rkey,
            key,
            offset,
            room: remaining,
        };
        if let Some(at) = from(open, ahead) {
            return Some(at);
        }
    }
    let psn = pkt.bth.psn;
    let (k, placed) = super::sr::nearest_placed_before(&qp.rc, psn)?;
    from(placed, k)
}

/// Adds a responder resource, dropping the oldest beyond `max_dest_rd_atomic` (§4.5).
fn push_resource(qp: &mut Qp, r: Resource) {
    let cap = usize::from(qp.attr.max_dest_rd_atomic.max(1));
    while qp.rc.resources.len() >= cap {
        qp.rc.resources.pop_front();
    }
    qp.rc.resources.push_back(r);
}

fn read_request(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    pkt: &PacketRepr<'_>,
) -> Result<Disposition, Reject> {
    let psn = pkt.bth.psn;
    let reth = pkt.reth.ok_or_else(|| reject(NakCode::InvalidRequest))?;
    if reth.dma_len > MAX_DMA_LEN {
        return Err(reject(NakCode::InvalidRequest));
    }
    if reth.dma_len != 0
        && ctx
            .resolve_remote(
                reth.rkey,
                qp.pd,
                qp.qpn,
                reth.va,
                u64::from(reth.dma_len),
                AccessFlags::REMOTE_READ,
            )
            .is_none()
    {
        return Err(reject(NakCode::RemoteAccessError));
    }
    let npkts = packets(u64::from(reth.dma_len), qp.attr.path_mtu.bytes());
    let last_psn = psn.wrapping_add(npkts - 1);
    push_resource(
        qp,
        Resource {
            first_psn: psn,
            last_psn,
            kind: ResourceKind::Read {
                va: reth.va,
                rkey: reth.rkey,
                len: reth.dma_len,
            },
        },
    );
    qp.rc.responses.push_back(Response::Read {
        first_psn: psn,
        va: reth.va,
        rkey: reth.rkey,
        len: reth.dma_len,
        sent: 0,
    });
    // A READ consumes one PSN per response packet and bumps the MSN when accepted (§2.5, §1.5).
    let rc = &mut qp.rc;
    rc.epsn = last_psn.wrapping_add(1);
    rc.msn = rc.msn.wrapping_add(1) & 0xFF_FFFF;
    Ok(Disposition::Accepted)
}

fn atomic(qp: &mut Qp, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) -> Result<Disposition, Reject> {
    let psn = pkt.bth.psn;
    let eth = pkt
        .atomic_eth
        .ok_or_else(|| reject(NakCode::InvalidRequest))?;
    // The target must be 8-byte aligned (§4.6).
    if eth.va % 8 != 0 {
        return Err(reject(NakCode::InvalidRequest));
    }
    let (key, offset) = ctx
        .resolve_remote(
            eth.rkey,
            qp.pd,
            qp.qpn,
            eth.va,
            8,
            AccessFlags::REMOTE_ATOMIC,
        )
        .ok_or_else(|| reject(NakCode::RemoteAccessError))?;
    let op = if pkt.bth.opcode == Opcode::CompareSwap {
        AtomicOp::CompareSwap {
            compare: eth.compare,
            swap: eth.swap_add,
        }
    } else {
        AtomicOp::FetchAdd { add: eth.swap_add }
    };
    let orig = ctx
        .mem
        .atomic(key, offset, op)
        .map_err(|_| reject(NakCode::RemoteAccessError))?;
    push_resource(
        qp,
        Resource {
            first_psn: psn,
            last_psn: psn,
            kind: ResourceKind::Atomic { orig },
        },
    );
    qp.rc.responses.push_back(Response::AtomicAck { psn, orig });
    let rc = &mut qp.rc;
    rc.epsn = psn.wrapping_add(1);
    rc.msn = rc.msn.wrapping_add(1) & 0xFF_FFFF;
    Ok(Disposition::Accepted)
}

/// A request older than ePSN (§4.5): re-ACK SEND/WRITE, re-execute READ, replay atomics.
fn duplicate(qp: &mut Qp, pkt: &PacketRepr<'_>) -> Disposition {
    let psn = pkt.bth.psn;
    let op = pkt.bth.opcode;
    if (op.is_send() || op.is_write()) && super::sr::enabled(qp) {
        // Selective repeat: answer with everything we have (the requester may have lost it).
        super::sr::queue_sack(&mut qp.rc);
        return Disposition::Accepted;
    }
    let rc = &mut qp.rc;
    if op.is_send() || op.is_write() {
        // Re-ACK with the last acknowledged request PSN, not the duplicate's own (C9-105) and
        // not a READ-response PSN (§4.5, [S48]).
        let last = rc.ack_psn.wrapping_add(0xFF_FFFF);
        match rc.responses.back_mut() {
            Some(Response::Ack { psn, .. }) => *psn = last,
            _ => rc.responses.push_back(Response::Ack {
                psn: last,
                first: last,
            }),
        }
        return Disposition::Accepted;
    }
    let found = rc
        .resources
        .iter()
        .find(|r| !psn.is_before(r.first_psn) && !psn.is_after(r.last_psn))
        .copied();
    match (op, found, pkt.reth, found.map(|r| r.kind)) {
        (
            Opcode::RdmaReadRequest,
            Some(_),
            Some(reth),
            Some(ResourceKind::Read { va, rkey, len }),
        ) => {
            // Same request or a subset of it (§4.5).
            let end = va.saturating_add(u64::from(len));
            let new_end = reth.va.saturating_add(u64::from(reth.dma_len));
            if reth.rkey != rkey || reth.va < va || new_end > end {
                return Disposition::Dropped;
            }
            rc.responses.push_back(Response::Read {
                first_psn: psn,
                va: reth.va,
                rkey,
                len: reth.dma_len,
                sent: 0,
            });
            Disposition::Accepted
        }
        (
            Opcode::CompareSwap | Opcode::FetchAdd,
            Some(r),
            _,
            Some(ResourceKind::Atomic { orig }),
        ) if r.first_psn == psn => {
            // Never executed twice: the saved original value is replayed.
            rc.responses.push_back(Response::AtomicAck { psn, orig });
            Disposition::Accepted
        }
        _ => Disposition::Dropped,
    }
}

/// Builds the next queued response of `qp` into `buf`; returns its length and class.
pub(crate) fn next_packet(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    src: SocketAddr,
    buf: &mut [u8],
) -> Option<(usize, PacketClass)> {
    let resp = *qp.rc.responses.front()?;
    let class = match resp {
        Response::Ack { .. }
        | Response::Nak { .. }
        | Response::RnrNak { .. }
        | Response::Sack { .. } => PacketClass::Ack,
        Response::AtomicAck { .. } | Response::Read { .. } => PacketClass::Response,
    };
    qp.tx
        .prepare(src, qp.peer_ip, qp.attr.ah_attr.udp_dport)
        .ok()?;
    let msn = qp.rc.msn;
    let bth = |opcode: Opcode, psn: Psn| BthRepr::new(opcode, qp.attr.dest_qp_num, psn);
    let aeth = |syndrome: Syndrome| Some(AethRepr { syndrome, msn });
    let result = match resp {
        Response::Ack { psn, .. } => {
            qp.rc.stats.acks_sent += 1;
            let hdrs = PacketRepr {
                aeth: aeth(Syndrome::ACK_UNLIMITED),
                ..PacketRepr::new(bth(Opcode::Acknowledge, psn), &[])
            };
            tx::emit(&hdrs, 0, &mut qp.tx, buf, |_| Ok(())).map(|l| (l, true))
        }
        Response::Nak { psn, code } => {
            let hdrs = PacketRepr {
                aeth: aeth(Syndrome::Nak(code)),
                ..PacketRepr::new(bth(Opcode::Acknowledge, psn), &[])
            };
            tx::emit(&hdrs, 0, &mut qp.tx, buf, |_| Ok(())).map(|l| (l, true))
        }
        Response::RnrNak { psn } => {
            let timer = RnrTimer::from_code(qp.attr.min_rnr_timer);
            let hdrs = PacketRepr {
                aeth: aeth(Syndrome::RnrNak { timer }),
                ..PacketRepr::new(bth(Opcode::Acknowledge, psn), &[])
            };
            tx::emit(&hdrs, 0, &mut qp.tx, buf, |_| Ok(())).map(|l| (l, true))
        }
        Response::Sack { psn } => {
            qp.rc.stats.sacks_sent += 1;
            let repr = SackPacketRepr {
                bth: bth(Opcode::from(SACK_OPCODE), psn),
                sack: SackRepr {
                    msn,
                    bitmap: super::sr::bitmap(&qp.rc, psn),
                },
            };
            emit_sack(&repr, &mut qp.tx, buf).map(|l| (l, true))
        }
        Response::AtomicAck { psn, orig } => {
            let hdrs = PacketRepr {
                aeth: aeth(Syndrome::ACK_UNLIMITED),
                atomic_ack_eth: Some(AtomicAckEthRepr {
                    orig_remote_data: orig,
                }),
                ..PacketRepr::new(bth(Opcode::AtomicAcknowledge, psn), &[])
            };
            tx::emit(&hdrs, 0, &mut qp.tx, buf, |_| Ok(())).map(|l| (l, true))
        }
        Response::Read {
            first_psn,
            va,
            rkey,
            len,
            sent,
        } => {
            let mtu = qp.attr.path_mtu.bytes();
            let npkts = packets(u64::from(len), mtu);
            let offset = u64::from(sent) * u64::from(mtu);
            let n = u64::from(len).saturating_sub(offset).min(u64::from(mtu));
            let pos = position(sent, npkts);
            let opcode = match pos {
                Position::First => Opcode::RdmaReadResponseFirst,
                Position::Middle => Opcode::RdmaReadResponseMiddle,
                Position::Last => Opcode::RdmaReadResponseLast,
                Position::Only => Opcode::RdmaReadResponseOnly,
            };
            let mut hdrs = PacketRepr::new(bth(opcode, first_psn.wrapping_add(sent)), &[]);
            if pos != Position::Middle {
                hdrs.aeth = aeth(Syndrome::ACK_UNLIMITED);
            }
            // Each response packet resolves the R_Key again (§4.4).
            let target = if n == 0 {
                Some((0, 0))
            } else {
                ctx.resolve_remote(
                    rkey,
                    qp.pd,
                    qp.qpn,
                    va.wrapping_add(offset),
                    n,
                    AccessFlags::REMOTE_READ,
                )
            };
            match target {
                Some((key, at)) => {
                    let n = usize::try_from(n).unwrap_or(0);
                    tx::emit(&hdrs, n, &mut qp.tx, buf, |out| {
                        if out.is_empty() {
                            Ok(())
                        } else {
                            ctx.mem.read(key, at, out)
                        }
                    })
                    .map(|l| (l, sent + 1 >= npkts))
                    .inspect(|_| qp.rc.stats.sent_bytes += n as u64)
                }
                None => Err(TxError::Memory),
            }
        }
    };
    match result {
        Ok((len, finished)) => {
            if finished {
                qp.rc.responses.pop_front();
            } else if let Some(Response::Read { sent, .. }) = qp.rc.responses.front_mut() {
                *sent += 1;
            }
            qp.rc.stats.sent_pkts += 1;
            Some((len, class))
        }
        Err(_) => {
            // The MR went away under a READ: answer with a remote access NAK instead.
            qp.rc.stats.dropped += 1;
            if let Some(front) = qp.rc.responses.front_mut() {
                if let Response::Read {
                    first_psn, sent, ..
                } = *front
                {
                    *front = Response::Nak {
                        psn: first_psn.wrapping_add(sent),
                        code: NakCode::RemoteAccessError,
                    };
                    // An R_Key violation is a class C error: the QP enters ERR after this NAK
                    // and answers nothing more (§4.3, §4.4; rxe RESPST_ERR_RKEY_VIOLATION).
                    qp.rc.responses.truncate(1);
                    qp.rc.resp_fatal = true;
                    return next_packet(qp, ctx, src, buf);
                }
            }
            qp.rc.responses.pop_front();
            None
        }
    }
}

/// Writes a selective ACK and its ICRC into `buf`.
fn emit_sack(
    repr: &SackPacketRepr,
    tpl: &mut tx::PathTemplate,
    buf: &mut [u8],
) -> Result<usize, TxError> {
    let len = repr.emit(buf)?;
    let out = buf.get_mut(..len).ok_or(TxError::Memory)?;
    tpl.fill_icrc(out)?;
    Ok(len)
}
