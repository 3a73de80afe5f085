//! The UC transport (unreliable connected, IBTA 9.7 and 9.8.2): RC's connection and packets
//! without acknowledgements.
//!
//! The requester is RC's (`rc::requester`, which asks here about completion): messages are
//! segmented at the path MTU into SEND/RDMA WRITE packets with UC opcodes (RC's | 0x20, same
//! layout), no AckReq, no window and no timer; a WQE completes successfully once its last
//! packet is handed to the port, whatever becomes of it.
//!
//! The responder checks PSNs and the FIRST/MIDDLE/LAST order, and delivers a message only
//! whole: after a PSN gap, a missing FIRST, a refused request (no REMOTE_WRITE, R_Key or length
//! violation) or a missing receive WQE it drops the rest of the message silently (counted) and
//! resynchronises on the next FIRST/ONLY, whatever its PSN (rxe's `drop_msg`). A receive WQE
//! a cut-off SEND had taken goes back to the head of its queue: only a delivered message
//! consumes one. A packet behind the expected PSN is a duplicate and is dropped (rxe would
//! deliver a duplicated FIRST/ONLY again; DIVERGENCES.md). Nothing is ever sent back. Errors
//! that concern the receiving QP itself (a malformed receive WQE) move it to ERR as for RC.
//!
//! Not here: READ and atomics (refused at post time, `qp::check_send_wr`), UD.

use verbs_api::{AccessFlags, WcStatus};

use crate::qp::{Qp, RecvWqe};
use crate::rc::responder::{self, Disposition, Reject};
use crate::rc::{Ctx, InMsg, completer};
use crate::stats::RxDropCause;
use crate::wire::{Packet, PacketRepr, Position};

/// The transport bits of UC opcodes (IBTA 9.2.1: 001 in the opcode's top three bits).
pub(crate) const TRANSPORT: u8 = 0x20;

/// True for the twelve UC opcodes: SEND_FIRST (0x20) … RDMA_WRITE_ONLY_WITH_IMMEDIATE (0x2B).
pub(crate) fn is_uc_opcode(byte: u8) -> bool {
    (TRANSPORT..=TRANSPORT | 0x0B).contains(&byte)
}

/// Parses a UC packet (ICRC already checked) as the RC packet of the same operation, into
/// `scratch` (the packet is copied so that its opcode byte can be rewritten): `None` if it is
/// malformed or longer than `scratch`.
pub(crate) fn parse<'a>(bytes: &[u8], scratch: &'a mut [u8]) -> Option<PacketRepr<'a>> {
    let copy = scratch.get_mut(..bytes.len())?;
    copy.copy_from_slice(bytes);
    let opcode = copy.first_mut()?;
    if !is_uc_opcode(*opcode) {
        return None;
    }
    *opcode &= !TRANSPORT;
    PacketRepr::parse(&Packet::new_unchecked(&*copy)).ok()
}

/// Called by the requester after it built a packet of the head WQE: once the last one is out,
/// the WQE completes successfully (IBTA 9.8.2: the requester learns nothing more).
pub(crate) fn packet_sent(qp: &mut Qp, ctx: &mut Ctx<'_>) {
    let done = qp
        .sq
        .front()
        .is_some_and(|w| w.tx.started && w.tx.next_pkt >= w.tx.npkts);
    if done {
        completer::complete_head(qp, ctx, WcStatus::Success);
        qp.rc.comp_psn = qp.rc.req_psn;
    }
}

/// Handles one UC request packet (RC opcode, from the QP's peer, QP in RTR/RTS/SQD). Returns
/// true if the QP must enter ERR (a malformed receive WQE).
pub(crate) fn receive(qp: &mut Qp, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) -> bool {
    let psn = pkt.bth.psn;
    let Some(pos) = pkt.bth.opcode.position() else {
        qp.rc.stats.count_drop(RxDropCause::Malformed);
        return false;
    };
    let start = matches!(pos, Position::First | Position::Only);
    let d = psn.diff(qp.rc.epsn);
    if d < 0 {
        qp.rc.stats.duplicate_request += 1;
        qp.rc.stats.count_drop(RxDropCause::DuplicateRequest);
        return false;
    }
    if d > 0 || qp.rc.uc_drop {
        if !start {
            abort(qp, ctx, RxDropCause::IncompleteMessage);
            return false;
        }
        // Resynchronise: whatever was open is lost; this message starts afresh.
        if !matches!(qp.rc.msg, InMsg::None) {
            abort(qp, ctx, RxDropCause::IncompleteMessage);
        }
        qp.rc.uc_drop = false;
    }
    if let Some(cause) = refused(qp, pkt, pos) {
        abort(qp, ctx, cause);
        return false;
    }
    let op = pkt.bth.opcode;
    let result = if op.is_write() {
        responder::write(qp, ctx, pkt, pos)
    } else {
        responder::send(qp, ctx, pkt, pos)
    };
    match result {
        Ok(Disposition::Accepted) => {
            qp.rc.stats.rcvd_pkts += 1;
            qp.rc.epsn = psn.wrapping_add(1);
            false
        }
        Ok(Disposition::NotReady) => {
            abort(qp, ctx, RxDropCause::NoRecvWqe);
            false
        }
        Ok(_) => {
            abort(qp, ctx, RxDropCause::UcRejected);
            false
        }
        Err(r) => rejected(qp, ctx, &r),
    }
}

/// The order, access and length checks that precede execution (rxe's `check_op_seq`,
/// `check_op_valid`, `check_length` for UC): the drop cause if the packet is refused.
fn refused(qp: &Qp, pkt: &PacketRepr<'_>, pos: Position) -> Option<RxDropCause> {
    let op = pkt.bth.opcode;
    let open_send = matches!(qp.rc.msg, InMsg::Send { .. });
    let open_write = matches!(qp.rc.msg, InMsg::Write { .. });
    let seq_ok = match pos {
        Position::Middle | Position::Last => {
            (op.is_send() && open_send) || (op.is_write() && open_write)
        }
        _ => !open_send && !open_write,
    };
    if !seq_ok || !(op.is_send() || op.is_write()) {
        return Some(RxDropCause::IncompleteMessage);
    }
    if op.is_write() && !qp.attr.qp_access_flags.contains(AccessFlags::REMOTE_WRITE) {
        return Some(RxDropCause::UcRejected);
    }
    let n = pkt.payload.len() as u64;
    let mtu = u64::from(qp.attr.path_mtu.bytes());
    let length_ok = match pos {
        Position::First | Position::Middle => n == mtu,
        Position::Last => n >= 1 && n <= mtu,
        Position::Only => n <= mtu,
    };
    (!length_ok).then_some(RxDropCause::UcRejected)
}

/// An execution error: a malformed receive WQE (or one whose memory failed) is class A for
/// every transport: the WQE completes in error and the QP enters ERR (returns true). Any other
/// (R_Key, length) drops the message silently.
fn rejected(qp: &mut Qp, ctx: &mut Ctx<'_>, r: &Reject) -> bool {
    match r.recv_status {
        Some(status @ WcStatus::LocProtErr) => {
            if let InMsg::Send { wqe, .. } = std::mem::take(&mut qp.rc.msg) {
                ctx.wcs
                    .push((qp.recv_cq, responder::recv_error(qp, &wqe, status), false));
            }
            true
        }
        _ => {
            abort(qp, ctx, RxDropCause::UcRejected);
            false
        }
    }
}

/// Drops the packet at hand and the rest of its message: counts `cause`, gives back the
/// receive WQE an open SEND held, and waits for the next FIRST/ONLY.
fn abort(qp: &mut Qp, ctx: &mut Ctx<'_>, cause: RxDropCause) {
    qp.rc.stats.count_drop(cause);
    qp.rc.uc_drop = true;
    if let InMsg::Send { wqe, .. } = std::mem::take(&mut qp.rc.msg) {
        give_back(qp, ctx, wqe);
    }
}

/// Returns a receive WQE to the head of the queue it came from (the QP's RQ or its SRQ).
fn give_back(qp: &mut Qp, ctx: &mut Ctx<'_>, wqe: RecvWqe) {
    match qp.srq {
        Some(srq) => {
            if let Some(entry) = ctx.srqs.get_mut(srq.0) {
                entry.queue.push_front(wqe);
            }
        }
        None => qp.rq.push_front(wqe),
    }
}
