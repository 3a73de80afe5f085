//! The completer (rxe `rxe_comp.c`): ACKs, NAKs, READ responses and atomic ACKs retire send
//! WQEs in order; timers drive go-back-N retransmission; exhausted retries fail the QP
//! (rc-transport.md §2.8–§2.10, §3.5–§3.9).

use verbs_api::{
    AccessFlags, AsyncEventKind, EventElement, QpState, SendOp, WcOpcode, WcStatus, WorkCompletion,
};

use std::time::Duration;

use super::requester::sg_copy;
use super::{Ctx, ack_timeout, nak_status};
use crate::memory::MemoryFault;
use crate::qp::{Qp, SendWqe};
use crate::stats::RxDropCause;
use crate::time::Instant;
use crate::wire::{NakCode, Opcode, PacketRepr, Position, Psn, SackPacketRepr, Syndrome};

/// What the completer asks of the HCA after handling a response.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Disposition {
    /// Nothing more to do.
    Done,
    /// A WQE completed with an error: the QP must move to ERR and flush.
    Fatal,
}

/// Handles one response packet (ACK, NAK, READ response, atomic ACK) for `qp`.
pub(crate) fn handle_response(qp: &mut Qp, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) -> Disposition {
    let psn = pkt.bth.psn;
    let rc = &mut qp.rc;
    // Only PSNs we sent and have not seen acknowledged are interesting (§2.10). "Sent" is up
    // to the highest PSN ever sent, not up to `req_psn`: after a go-back-N rewind, a late ACK
    // for a PSN sent before the rewind is genuine and saves resending what it covers.
    let in_window =
        !psn.is_before(rc.comp_psn.wrapping_add(0xFF_FFFF)) && psn.is_before(rc.sent_high);
    if !in_window {
        rc.stats.count_drop(RxDropCause::StaleResponse);
        return Disposition::Done;
    }
    let op = pkt.bth.opcode;
    let verdict = if op == Opcode::Acknowledge {
        match pkt.aeth.map(|a| a.syndrome) {
            Some(Syndrome::Ack { .. }) => {
                ack_through(qp, ctx, psn);
                Disposition::Done
            }
            Some(Syndrome::RnrNak { timer }) => {
                ack_through(qp, ctx, psn.wrapping_add(0xFF_FFFF));
                rnr_nak(qp, ctx, psn, timer.duration())
            }
            Some(Syndrome::Nak(NakCode::PsnSequenceError)) => {
                qp.rc.stats.rcvd_seq_err += 1;
                ack_through(qp, ctx, psn.wrapping_add(0xFF_FFFF));
                if psn.is_before(qp.rc.comp_psn) {
                    Disposition::Done
                } else {
                    nak_retry(qp, ctx)
                }
            }
            Some(Syndrome::Nak(code)) => {
                ack_through(qp, ctx, psn.wrapping_add(0xFF_FFFF));
                // A NAK past a READ/atomic still waiting for its responses: they were lost
                // (ack_through started the retry), and the NAK names a later WR, not the head
                // (§2.8; rxe `check_psn` → COMPST_ERROR_RETRY). The retried sequence meets the
                // error again at its request, or the retry budget runs out.
                let head_pending = qp.sq.front().is_some_and(|h| {
                    h.tx.started && h.op.is_read_or_atomic() && psn.is_after(h.tx.last_psn())
                });
                if head_pending {
                    Disposition::Done
                } else {
                    fail_head(qp, ctx, nak_status(code))
                }
            }
            _ => {
                qp.rc.stats.count_drop(RxDropCause::Malformed);
                Disposition::Done
            }
        }
    } else if op.is_read_response() {
        read_response(qp, ctx, pkt)
    } else if op == Opcode::AtomicAcknowledge {
        atomic_ack(qp, ctx, pkt)
    } else {
        // Unreachable: the HCA hands the completer responses only.
        qp.rc.stats.count_drop(RxDropCause::WrongState);
        Disposition::Done
    };
    // A late ACK past where the resend after a rewind has got to: resume after what it
    // acknowledged instead of resending it (§2.8: an ACK covers every earlier PSN). Done once
    // the WQEs it completed are retired, so the cursor lands in the first one still open.
    if qp.rc.comp_psn.is_after(qp.rc.req_psn) {
        rewind(qp);
    }
    if verdict == Disposition::Done {
        return complete_head_errors(qp, ctx);
    }
    verdict
}

/// A selective ACK (selective repeat only): its PSN is the first one the responder misses,
/// so it acknowledges every PSN before it (as a sequence NAK's implied ACK does, §2.9), and its
/// bitmap names what arrived after; what is still missing is resent alone.
pub(crate) fn handle_sack(qp: &mut Qp, ctx: &mut Ctx<'_>, sack: &SackPacketRepr) -> Disposition {
    let psn = sack.bth.psn;
    let rc = &mut qp.rc;
    // The PSN before it must be one we sent and have not seen acknowledged (§2.10).
    if psn.is_before(rc.comp_psn) || psn.is_after(rc.sent_high) {
        rc.stats.count_drop(RxDropCause::StaleResponse);
        return Disposition::Done;
    }
    rc.stats.rcvd_pkts += 1;
    super::sr::note_sack(rc, psn, &sack.sack.bitmap);
    ack_through(qp, ctx, psn.wrapping_add(0xFF_FFFF));
    if qp.rc.comp_psn.is_after(qp.rc.req_psn) {
        rewind(qp);
    }
    super::sr::queue_holes(&mut qp.rc, false);
    complete_head_errors(qp, ctx)
}

/// An ACK (explicit or implied) for every PSN up to and including `psn`: retires SEND and WRITE
/// WQEs whose last PSN it covers. An ACK past an unanswered READ/atomic means its responses were
/// lost: retry (§2.8).
fn ack_through(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn) {
    let mut new_comp = psn.wrapping_add(1);
    if !new_comp.is_after(qp.rc.comp_psn) {
        return;
    }
    while let Some(head) = qp.sq.front() {
        let t = head.tx;
        if !t.started || t.error.is_some() {
            break;
        }
        if head.op.is_local() {
            // Carried out when the requester reached it; it completes in order.
            complete_head(qp, ctx, WcStatus::Success);
            continue;
        }
        if head.op.is_read_or_atomic() {
            // Everything before the READ/atomic is acknowledged; comp_psn never moves back
            // (it may already be inside a partly answered READ).
            new_comp = t.first_psn;
            // Only an ACK past the whole READ/atomic means its responses were lost: retry
            // (§2.8, rxe `check_psn`: psn after wqe->last_psn). A newer response *inside* the
            // READ is dropped and the timer recovers (§2.10).
            if !psn.is_before(t.last_psn()) && !qp.rc.started_retry {
                progress(qp, ctx, new_comp);
                qp.rc.started_retry = true;
                qp.rc.retry_by_timeout = false;
                go_back(qp, ctx);
                return;
            }
            break;
        }
        // `psn` is before `sent_high` (the window check), so a WQE it covers was sent whole,
        // even if a rewind since reset its cursor.
        if psn.is_before(t.last_psn()) {
            break;
        }
        complete_head(qp, ctx, WcStatus::Success);
    }
    progress(qp, ctx, new_comp);
}

/// Records that the responder acknowledged everything before `comp`.
fn progress(qp: &mut Qp, ctx: &mut Ctx<'_>, comp: Psn) {
    let rc = &mut qp.rc;
    if !comp.is_after(rc.comp_psn) {
        return;
    }
    rc.comp_psn = comp;
    if qp.attr.recovery == verbs_api::Recovery::SelectiveRepeat {
        super::sr::progress(rc, ctx.now);
    }
    if let Some((_, sent)) = rc.rtt_probe.filter(|(probe, _)| probe.is_before(comp)) {
        let sample = ctx.now.saturating_duration_since(sent);
        rc.srtt = Some(rc.srtt.map_or(sample, |s| (s * 7 + sample) / 8));
        rc.rtt_probe = None;
    }
    // Progress reloads both retry counters and ends the retry burst (§3.7).
    rc.retry_left = qp.attr.retry_cnt;
    rc.rnr_retry_left = qp.attr.rnr_retry;
    rc.started_retry = false;
    rc.retransmit_at = if rc.comp_psn == rc.req_psn {
        None
    } else {
        ack_timeout(qp.attr.timeout).map(|d| ctx.now + d)
    };
}

/// Retires the head WQE with `status`, reporting it if signaled or failed (IBA 10.7.3.1: an
/// error always generates a completion).
pub(crate) fn complete_head(qp: &mut Qp, ctx: &mut Ctx<'_>, status: WcStatus) {
    // What the completion needs, read in place: popping the WQE by value copied all of it.
    let Some((holds_slot, report, wc)) = qp.sq.front().map(|wqe| {
        let wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status,
            opcode: wc_opcode(wqe),
            byte_len: if status == WcStatus::Success {
                u32::try_from(wqe.length).unwrap_or(u32::MAX)
            } else {
                0
            },
            qp_num: qp.qpn,
            ..WorkCompletion::default()
        };
        let report = wqe.signaled || status != WcStatus::Success;
        (wqe.tx.holds_slot, report, wc)
    }) else {
        return;
    };
    qp.sq.pop_front();
    qp.rc.req_index = qp.rc.req_index.saturating_sub(1);
    if holds_slot {
        qp.rc.rd_atomic_outstanding = qp.rc.rd_atomic_outstanding.saturating_sub(1);
    }
    if report {
        ctx.wcs.push((qp.send_cq, wc, false));
    }
    if qp.rc.sqd_notify && !qp.sq_draining() {
        qp.rc.sqd_notify = false;
        ctx.events.push_back(verbs_api::AsyncEvent {
            kind: AsyncEventKind::SqDrained,
            element: EventElement::Qp(qp.qpn),
        });
    }
}

/// Completes a head WQE the requester marked with a local error (in order, once every WQE
/// before it completed), and head local operations (BIND_MW, LOCAL_INV) it carried out.
pub(crate) fn complete_head_errors(qp: &mut Qp, ctx: &mut Ctx<'_>) -> Disposition {
    loop {
        match qp.sq.front().map(|w| (w.tx, w.op.is_local())) {
            Some((t, _)) if t.error.is_some() => {
                let status = t.error.unwrap_or(WcStatus::LocQpOpErr);
                return fail_head(qp, ctx, status);
            }
            Some((t, true)) if t.started => complete_head(qp, ctx, WcStatus::Success),
            _ => return Disposition::Done,
        }
    }
}

/// Fails the head WQE with `status`; the QP must enter ERR.
fn fail_head(qp: &mut Qp, ctx: &mut Ctx<'_>, status: WcStatus) -> Disposition {
    complete_head(qp, ctx, status);
    Disposition::Fatal
}

/// The send-side completion opcode of a WQE.
pub(crate) fn wc_opcode(wqe: &SendWqe) -> WcOpcode {
    match wqe.op {
        SendOp::Send | SendOp::SendWithImm { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
        SendOp::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
        SendOp::SendWithInv { .. } => WcOpcode::Send,
        SendOp::BindMw { .. } => WcOpcode::BindMw,
        SendOp::LocalInv { .. } => WcOpcode::LocalInv,
    }
}

/// Go-back-N: resend from `comp_psn`, resuming the head WQE at its first unacknowledged packet
/// and every later started WQE from scratch with its original PSNs (§3.8).
pub(crate) fn rewind(qp: &mut Qp) {
    super::sr::rewound(&mut qp.rc);
    let comp = qp.rc.comp_psn;
    qp.rc.req_psn = comp;
    qp.rc.req_index = 0;
    for (i, wqe) in qp.sq.iter_mut().enumerate() {
        if !wqe.tx.started {
            break;
        }
        wqe.tx.next_pkt = if i == 0 {
            u32::try_from(comp.diff(wqe.tx.first_psn).max(0))
                .unwrap_or(0)
                .min(wqe.tx.npkts)
        } else {
            0
        };
        if wqe.op.is_atomic() {
            wqe.tx.next_pkt = 0;
        }
    }
    if let Some(head) = qp.sq.front() {
        if head.tx.started && head.tx.next_pkt < head.tx.npkts {
            qp.rc.req_psn = head.tx.first_psn.wrapping_add(head.tx.next_pkt);
        }
    }
}

/// Go-back-N from `comp_psn` as a new retry round: remembers when and from where, and drops
/// the pending RTT sample (its ACK would be ambiguous).
fn go_back(qp: &mut Qp, ctx: &Ctx<'_>) {
    let (from, to, left) = (
        qp.rc.comp_psn.value(),
        qp.rc.req_psn.value(),
        qp.rc.retry_left,
    );
    tracing::debug!(
        kind = "retransmit",
        from_psn = from,
        req_psn = to,
        retry_left = left
    );
    qp.rc.rewound = Some((ctx.now, qp.rc.comp_psn));
    qp.rc.rtt_probe = None;
    rewind(qp);
}

/// A PSN sequence NAK, for `comp_psn` once its implied ACK was applied: retry from there
/// unless the NAK is an echo.
fn nak_retry(qp: &mut Qp, ctx: &mut Ctx<'_>) -> Disposition {
    // While an RNR wait runs, no other retry starts (§3.7 "RNR wait").
    if qp.rc.rnr_at.is_some() {
        return Disposition::Done;
    }
    if let Some(until) = nak_is_echo(qp, ctx) {
        // Look again once an echo could no longer arrive: if the NAKed PSN is still the
        // oldest unacknowledged one then, the resend was lost after all.
        let psn = qp.rc.comp_psn;
        if until > ctx.now && qp.rc.nak_deferred.is_none_or(|(old, _)| old != psn) {
            qp.rc.nak_deferred = Some((psn, until));
        }
        return Disposition::Done;
    }
    nak_go_back(qp, ctx)
}

/// Starts the retry a sequence NAK asks for. A repeat for the PSN the current round already
/// went back to (no progress since) is the same retry again: it does not spend `retry_cnt`
/// and leaves the ACK timer running, so a gap that never closes still ends at the timeout
/// (§3.7: the budget counts retries of a PSN, and the timer bounds them).
fn nak_go_back(qp: &mut Qp, ctx: &mut Ctx<'_>) -> Disposition {
    let comp = qp.rc.comp_psn;
    if qp.rc.rewound.is_some_and(|(_, from)| from == comp) && !qp.rc.retry_by_timeout {
        qp.rc.started_retry = true;
        go_back(qp, ctx);
        return Disposition::Done;
    }
    retry(qp, ctx, false)
}

/// A deferred sequence NAK falls due: retry unless progress was made since.
fn deferred_nak(qp: &mut Qp, ctx: &mut Ctx<'_>) -> Disposition {
    let Some((psn, _)) = qp.rc.nak_deferred.take() else {
        return Disposition::Done;
    };
    let rc = &qp.rc;
    if psn != rc.comp_psn || !rc.req_psn.is_after(psn) || rc.rnr_at.is_some() {
        return Disposition::Done;
    }
    nak_go_back(qp, ctx)
}

/// The shortest time after a rewind within which a NAK for a PSN it resent counts as an echo
/// (an RTT estimate of zero, as in tests where the wire takes no time, must not make every
/// echo look like a new loss).
const MIN_ECHO_GUARD: Duration = Duration::from_micros(1);

/// Whether a sequence NAK for `comp_psn` asks for nothing a retry would add (§3.7 burst
/// protection, made precise).
///
/// rxe ignores every NAK after the one that started a retry until progress or the ACK timeout
/// (`started_retry`, [S44]), because packets sent before the rewind keep drawing NAKs. That
/// also ignores the NAK our responder repeats when the resent packet was lost again
/// (`responder::seq_nak_due`). Instead, with `from` the PSN the current round went back to
/// and `t` when:
/// * if the requester is about to send `comp_psn` anyway (`req_psn` is there), the NAK adds
///   nothing;
/// * a NAK for `from` itself (no progress since) within about a round trip of `t` was drawn
///   by a packet sent before the rewind: an echo. Later, it means the resend was lost;
/// * a NAK for a PSN after `from` (the responder got `from`) arriving within half a round
///   trip of `t` cannot answer a resent packet: it answers an original that arrived after a
///   reordered one (an echo). Later, a resent packet was lost.
///
/// Returns `None` if the NAK must be acted on now, else until when it may be an echo.
fn nak_is_echo(qp: &Qp, ctx: &Ctx<'_>) -> Option<Instant> {
    let rc = &qp.rc;
    let q = rc.comp_psn;
    if !rc.req_psn.is_after(q) {
        return Some(ctx.now);
    }
    let srtt = rc.srtt.unwrap_or_default();
    let (at, from) = rc.rewound?;
    let guard = if q == from { srtt * 5 / 4 } else { srtt / 2 };
    let until = at + guard.max(MIN_ECHO_GUARD);
    (!q.is_before(from) && ctx.now < until).then_some(until)
}

/// Starts a retry, or fails the head WQE with RETRY_EXC_ERR when `retry_cnt` is used up.
/// `retry_cnt` 7 means seven retries, as IBTA and hardware (rxe treats it as infinite;
/// DIVERGENCES.md).
fn retry(qp: &mut Qp, ctx: &mut Ctx<'_>, by_timeout: bool) -> Disposition {
    if qp.rc.retry_left == 0 {
        qp.rc.stats.retry_exceeded_err += 1;
        return fail_head(qp, ctx, WcStatus::RetryExcErr);
    }
    qp.rc.retry_left -= 1;
    // Counts retries actually started, as rxe's `completer_retry_err` (stats.rs); the timeout
    // that finds `retry_cnt` used up counts as `retry_exceeded_err` only.
    if by_timeout {
        qp.rc.stats.timeout_retries += 1;
    }
    qp.rc.started_retry = !by_timeout;
    qp.rc.retry_by_timeout = by_timeout;
    qp.rc.retransmit_at = None;
    go_back(qp, ctx);
    Disposition::Done
}

/// An RNR NAK for `psn`: wait `delay`, then resend from `psn`; `rnr_retry` 7 is infinite.
fn rnr_nak(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn, delay: std::time::Duration) -> Disposition {
    qp.rc.stats.rcvd_rnr_err += 1;
    if psn != qp.rc.comp_psn {
        return Disposition::Done;
    }
    if qp.attr.rnr_retry != 7 {
        if qp.rc.rnr_retry_left == 0 {
            qp.rc.stats.retry_rnr_exceeded_err += 1;
            return fail_head(qp, ctx, WcStatus::RnrRetryExcErr);
        }
        qp.rc.rnr_retry_left -= 1;
    }
    // No retry of any kind until the RNR timer expires (§3.7 "RNR wait").
    tracing::debug!(
        kind = "rnr.wait",
        psn = psn.value(),
        delay_ns = delay.as_nanos() as u64
    );
    qp.rc.retransmit_at = None;
    qp.rc.rnr_at = Some(ctx.now + delay);
    Disposition::Done
}

/// Timer expiry: the RNR wait ends with a resend; the local ACK timeout retries.
pub(crate) fn handle_timeout(qp: &mut Qp, ctx: &mut Ctx<'_>) -> Disposition {
    if !matches!(qp.state(), QpState::Rts | QpState::Sqd) {
        qp.rc.retransmit_at = None;
        qp.rc.rnr_at = None;
        qp.rc.nak_deferred = None;
        qp.rc.sr.probe_at = None;
        return Disposition::Done;
    }
    if qp.rc.rnr_at.is_some_and(|t| t <= ctx.now) {
        qp.rc.rnr_at = None;
        qp.rc.retry_by_timeout = false;
        go_back(qp, ctx);
    }
    if qp.rc.nak_deferred.is_some_and(|(_, t)| t <= ctx.now) {
        let d = deferred_nak(qp, ctx);
        if d != Disposition::Done {
            return d;
        }
    }
    if qp.rc.sr.probe_at.is_some_and(|t| t <= ctx.now) {
        if qp.rc.rnr_at.is_some() {
            // The RNR wait ends with a resend from the oldest unacknowledged PSN anyway.
            qp.rc.sr.probe_at = None;
        } else {
            super::sr::probe(&mut qp.rc, ctx.now);
        }
    }
    if qp.rc.retransmit_at.is_some_and(|t| t <= ctx.now) {
        qp.rc.retransmit_at = None;
        if qp.rc.comp_psn != qp.rc.req_psn && qp.rc.rnr_at.is_none() {
            return retry(qp, ctx, true);
        }
    }
    Disposition::Done
}

/// A READ response packet (§2.8, §2.10, §3.9).
fn read_response(qp: &mut Qp, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) -> Disposition {
    let psn = pkt.bth.psn;
    // Responses imply ACKs for the SENDs and WRITEs before them.
    ack_through(qp, ctx, psn.wrapping_add(0xFF_FFFF));
    if psn != qp.rc.comp_psn {
        if psn.is_after(qp.rc.comp_psn) && super::sr::enabled(qp) {
            read_response_early(qp, ctx, pkt);
            return Disposition::Done;
        }
        // Older: a duplicate. Newer: earlier responses were lost; the timer recovers (§2.10).
        qp.rc.stats.count_drop(RxDropCause::StaleResponse);
        return Disposition::Done;
    }
    if qp.sq.is_empty() {
        return Disposition::Done;
    }
    let last = match place_read_response(qp, ctx, 0, pkt) {
        Ok(last) => last,
        Err(status) => return fail_head(qp, ctx, status),
    };
    progress(qp, ctx, psn.wrapping_add(1));
    if last {
        complete_head(qp, ctx, WcStatus::Success);
    }
    if super::sr::enabled(qp) {
        read_responses_placed_early(qp, ctx);
    }
    Disposition::Done
}

/// Checks READ response `pkt` against WQE `idx` (a started RDMA READ whose PSNs include it;
/// its position in the message and its length) and places its payload in the WQE's SGEs.
/// Returns whether it is the READ's last response packet, or the status the WQE fails with.
fn place_read_response(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    idx: usize,
    pkt: &PacketRepr<'_>,
) -> Result<bool, WcStatus> {
    let psn = pkt.bth.psn;
    let mtu = qp.attr.path_mtu.bytes();
    let wqe = qp.sq.get(idx).ok_or(WcStatus::BadRespErr)?;
    let t = wqe.tx;
    if !matches!(wqe.op, SendOp::RdmaRead { .. }) || !t.started {
        return Err(WcStatus::BadRespErr);
    }
    let i = u32::try_from(psn.diff(t.first_psn)).unwrap_or(u32::MAX);
    if i >= t.npkts || i < t.read_from {
        return Err(WcStatus::BadRespErr);
    }
    // The opcode's position must fit packet i of a request that started at some packet
    // s <= i: after a go-back-N the responses of the original request and of a partial
    // re-request (§3.8) may both still be in flight, so either is in sequence.
    let n = t.npkts;
    let last = i + 1 == n;
    let pos_ok = match pkt.bth.opcode.position() {
        Some(Position::First) => !last,
        Some(Position::Middle) => i > 0 && !last,
        Some(Position::Last) => i > 0 && last,
        Some(Position::Only) => last,
        None => false,
    };
    let offset = u64::from(i) * u64::from(mtu);
    let want = wqe.length.saturating_sub(offset).min(u64::from(mtu));
    if !pos_ok || pkt.payload.len() as u64 != want {
        return Err(WcStatus::BadRespErr);
    }
    let placed = sg_copy(
        ctx,
        &wqe.sges,
        offset,
        pkt.payload.len(),
        |key, at, range| ctx.mem.write(key, at, &pkt.payload[range]),
    );
    if placed.is_err() || !local_writable(qp, ctx, idx) {
        return Err(WcStatus::LocProtErr);
    }
    qp.rc.stats.rcvd_bytes += want;
    Ok(last)
}

/// Selective repeat: a READ response after `comp_psn` (earlier ones were lost or overtaken)
/// lands in its READ's SGEs on arrival, once, if it passes the in-order checks
/// ([`place_read_response`]); the READ still completes in order, when `comp_psn` reaches it
/// ([`read_responses_placed_early`]). One that fails a check, or was placed already, is
/// dropped: the in-order path meets it again when it is resent.
fn read_response_early(qp: &mut Qp, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) {
    let psn = pkt.bth.psn;
    let idx = qp.sq.iter().position(|w| {
        w.tx.started
            && matches!(w.op, SendOp::RdmaRead { .. })
            && !psn.is_before(w.tx.first_psn)
            && !psn.is_after(w.tx.last_psn())
    });
    let fresh = !qp.rc.sr.read_placed.contains(&psn.value());
    match idx.filter(|_| fresh) {
        Some(idx) if place_read_response(qp, ctx, idx, pkt).is_ok() => {
            qp.rc.sr.read_placed.insert(psn.value());
            qp.rc.stats.sr_placed_early += 1;
        }
        _ => qp.rc.stats.count_drop(RxDropCause::StaleResponse),
    }
}

/// Selective repeat: moves `comp_psn` over READ responses placed on arrival that it has
/// reached, completing each READ whose last response it passes.
fn read_responses_placed_early(qp: &mut Qp, ctx: &mut Ctx<'_>) {
    while qp.rc.sr.read_placed.remove(&qp.rc.comp_psn.value()) {
        let psn = qp.rc.comp_psn;
        let last = qp
            .sq
            .front()
            .is_some_and(|h| h.op.is_read_or_atomic() && h.tx.last_psn() == psn);
        progress(qp, ctx, psn.wrapping_add(1));
        if last {
            complete_head(qp, ctx, WcStatus::Success);
        }
    }
}

/// True if WQE `idx`'s SGEs still name MRs with LOCAL_WRITE (they were checked at start; an
/// MR may have been deregistered since).
fn local_writable(qp: &Qp, ctx: &Ctx<'_>, idx: usize) -> bool {
    qp.sq.get(idx).is_some_and(|w| {
        w.sges.iter().filter(|s| s.length != 0).all(|s| {
            ctx.mr(s.lkey, qp.pd)
                .is_some_and(|m| m.access.contains(AccessFlags::LOCAL_WRITE))
        })
    })
}

/// An ATOMIC ACKNOWLEDGE: the original value lands in the local 8-byte SGE (§4.6).
fn atomic_ack(qp: &mut Qp, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) -> Disposition {
    let psn = pkt.bth.psn;
    ack_through(qp, ctx, psn.wrapping_add(0xFF_FFFF));
    if psn != qp.rc.comp_psn {
        qp.rc.stats.count_drop(RxDropCause::StaleResponse);
        return Disposition::Done;
    }
    let Some(head) = qp.sq.front() else {
        return Disposition::Done;
    };
    if !head.op.is_atomic() || !head.tx.started || head.tx.first_psn != psn {
        return fail_head(qp, ctx, WcStatus::BadRespErr);
    }
    let Some(orig) = pkt.atomic_ack_eth.map(|a| a.orig_remote_data) else {
        return fail_head(qp, ctx, WcStatus::BadRespErr);
    };
    let bytes = orig.to_ne_bytes();
    let placed: Result<(), MemoryFault> = sg_copy(ctx, &head.sges, 0, 8, |key, at, range| {
        ctx.mem.write(key, at, &bytes[range])
    });
    if placed.is_err() || !local_writable(qp, ctx, 0) {
        return fail_head(qp, ctx, WcStatus::LocProtErr);
    }
    progress(qp, ctx, psn.wrapping_add(1));
    complete_head(qp, ctx, WcStatus::Success);
    Disposition::Done
}
