//! Checklist item 6: error semantics of RC data operations (rc-transport.md §3.7, §3.9, §4.3,
//! §4.4, §6.1, §6.3; pyverbs `test_mr.py`/`test_atomic.py` bad flows): remote access errors
//! (invalid rkey, an MR of another PD, a deregistered MR, missing MR rights), invalid requests
//! (missing QP access flags), local protection errors, RNR retry exhaustion and infinite RNR
//! retry, transport retry exhaustion, and what every fatal error implies: the QP (and for a
//! NAK the peer QP) in ERR, the failing WR completed even when unsignaled, everything after it
//! flushed in order, nothing later succeeding.
//!
//! Most cases run [`Pair::expect_fatal_error`], which checks that whole pattern.

use verbs_api::{
    AccessFlags, AsyncEventKind, Context, EventElement, MemoryRegion, Mtu, QpState, QueuePair,
    RecvWr, SendFlags, SendOp, SendWr, SrqAttr, WcOpcode, WcStatus,
};

use crate::check::Outcome;
use crate::check_eq;
use crate::fixture::{
    Env, Pair, RETRY_WAIT, check_bytes, check_flushed, check_recv, check_status, check_success,
    expect_error_then_flush, expect_nothing_for_a_while, pattern, poll_exact, poll_exact_within,
    wait_async,
};

/// An RDMA WRITE with an invalid rkey is `REM_ACCESS_ERR` (NAK 0x62, §4.4); the requester and
/// the responder enter ERR; the WRs after it and the receives on both sides flush in order;
/// a WR posted afterwards flushes too; memory is unchanged.
pub fn write_invalid_rkey<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let op = SendOp::RdmaWrite {
        remote_addr: p.b.addr(0),
        rkey: p.b.mr.rkey() ^ 0x80,
    };
    p.a.fill(0, &[0x11; 64])?;
    let src = [p.a.sge(0, 64)?];
    p.expect_fatal_error(op, &src, SendFlags::SIGNALED, WcStatus::RemAccessErr, true)?;
    check_bytes(&p.b.bytes(0, 64)?, &[0; 64], "target of the rejected WRITE")
}

/// An RDMA READ with an invalid rkey is `REM_ACCESS_ERR`; both QPs enter ERR, the rest
/// flushes; the local buffer is unchanged.
pub fn read_invalid_rkey<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    p.b.fill(0, &[0x22; 64])?;
    p.a.fill(4096, &[0xCC; 64])?;
    let op = SendOp::RdmaRead {
        remote_addr: p.b.addr(0),
        rkey: p.b.mr.rkey() ^ 0x80,
    };
    let dst = [p.a.sge(4096, 64)?];
    p.expect_fatal_error(op, &dst, SendFlags::SIGNALED, WcStatus::RemAccessErr, true)?;
    check_bytes(
        &p.a.bytes(4096, 64)?,
        &[0xCC; 64],
        "destination of the rejected READ",
    )
}

/// An RDMA WRITE with the rkey of a peer MR registered in another PD than the peer QP's is
/// `REM_ACCESS_ERR` (a PD mismatch counts as an R_Key violation, §7.5).
pub fn write_rkey_of_other_pd<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let pd2 = p.b.ctx.alloc_pd()?;
    let mr = p.b.ctx.alloc_mr(&pd2, 4096, crate::fixture::all_remote())?;
    let op = SendOp::RdmaWrite {
        remote_addr: mr.addr(),
        rkey: mr.rkey(),
    };
    p.a.fill(0, &[0x33; 64])?;
    let src = [p.a.sge(0, 64)?];
    p.expect_fatal_error(op, &src, SendFlags::SIGNALED, WcStatus::RemAccessErr, true)?;
    let mut got = [0u8; 64];
    mr.read(0, &mut got)?;
    check_bytes(&got, &[0; 64], "MR of the other PD")
}

/// An RDMA WRITE to an MR the peer has deregistered is `REM_ACCESS_ERR`.
pub fn write_deregistered_mr<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let mr =
        p.b.ctx
            .alloc_mr(&p.b.pd, 4096, crate::fixture::all_remote())?;
    let op = SendOp::RdmaWrite {
        remote_addr: mr.addr(),
        rkey: mr.rkey(),
    };
    mr.destroy()?;
    let src = [p.a.sge(0, 64)?];
    p.expect_fatal_error(op, &src, SendFlags::SIGNALED, WcStatus::RemAccessErr, true)
}

/// An RDMA WRITE to a peer MR registered without REMOTE_WRITE is `REM_ACCESS_ERR` (§4.4);
/// the MR is unchanged.
pub fn write_mr_without_remote_write<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let mr = p.b.ctx.alloc_mr(&p.b.pd, 4096, access)?;
    let op = SendOp::RdmaWrite {
        remote_addr: mr.addr(),
        rkey: mr.rkey(),
    };
    p.a.fill(0, &[0x44; 64])?;
    let src = [p.a.sge(0, 64)?];
    p.expect_fatal_error(op, &src, SendFlags::SIGNALED, WcStatus::RemAccessErr, true)?;
    let mut got = [0u8; 64];
    mr.read(0, &mut got)?;
    check_bytes(&got, &[0; 64], "MR without REMOTE_WRITE")
}

/// An RDMA READ of a peer MR registered without REMOTE_READ is `REM_ACCESS_ERR` (§4.4).
pub fn read_mr_without_remote_read<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = p.b.ctx.alloc_mr(&p.b.pd, 4096, access)?;
    mr.write(0, &[0x55; 64])?;
    let op = SendOp::RdmaRead {
        remote_addr: mr.addr(),
        rkey: mr.rkey(),
    };
    p.a.fill(4096, &[0xCC; 64])?;
    let dst = [p.a.sge(4096, 64)?];
    p.expect_fatal_error(op, &dst, SendFlags::SIGNALED, WcStatus::RemAccessErr, true)?;
    check_bytes(
        &p.a.bytes(4096, 64)?,
        &[0xCC; 64],
        "destination of the rejected READ",
    )
}

/// An RDMA WRITE to a QP whose access flags lack REMOTE_WRITE is `REM_INV_REQ_ERR` (NAK 0x61
/// from `check_op_valid`, not a remote access error, §4.3); both QPs enter ERR.
pub fn write_qp_without_remote_write<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::with(env, |c| {
        c.opts_b.access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    })?;
    p.a.fill(0, &[0x66; 64])?;
    let src = [p.a.sge(0, 64)?];
    p.expect_fatal_error(
        p.b.write_op(0),
        &src,
        SendFlags::SIGNALED,
        WcStatus::RemInvReqErr,
        true,
    )?;
    check_bytes(&p.b.bytes(0, 64)?, &[0; 64], "memory behind the QP")
}

/// An RDMA READ from a QP whose access flags lack REMOTE_READ is `REM_INV_REQ_ERR` (§4.3).
pub fn read_qp_without_remote_read<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::with(env, |c| {
        c.opts_b.access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    })?;
    let dst = [p.a.sge(4096, 64)?];
    p.expect_fatal_error(
        p.b.read_op(0),
        &dst,
        SendFlags::SIGNALED,
        WcStatus::RemInvReqErr,
        true,
    )
}

/// A SEND whose SGE has an invalid lkey is `LOC_PROT_ERR` (DIVERGENCES.md #4: rxe reports
/// `LOC_QP_OP_ERR`, §3.9); nothing reaches the peer, which stays in RTS with its receive
/// still posted; the requester enters ERR and the rest flushes.
pub fn send_bad_lkey<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let mut sge = p.a.sge(0, 64)?;
    sge.lkey ^= 0x80;
    p.expect_fatal_error(
        SendOp::Send,
        &[sge],
        SendFlags::SIGNALED,
        WcStatus::LocProtErr,
        false,
    )
}

/// An RDMA READ into a local SGE with an invalid lkey is `LOC_PROT_ERR` (§3.9: placing read
/// response data into a bad local SGE; rxe agrees); the requester enters ERR.
pub fn read_into_bad_lkey<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let mut sge = p.a.sge(4096, 64)?;
    sge.lkey ^= 0x80;
    p.expect_fatal_error(
        p.b.read_op(0),
        &[sge],
        SendFlags::SIGNALED,
        WcStatus::LocProtErr,
        false,
    )
}

/// An RDMA READ into a local MR registered without LOCAL_WRITE is `LOC_PROT_ERR` (§7.4:
/// placing incoming data needs LOCAL_WRITE; `ibv_poll_cq(3)`: the WR's buffers do not
/// reference an MR valid for the operation); the requester enters ERR, the local MR is
/// unchanged.
pub fn read_into_mr_without_local_write<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let mr = p.a.ctx.alloc_mr(&p.a.pd, 4096, AccessFlags::empty())?;
    p.b.fill(0, &[0x5A; 64])?;
    let dst = [mr.sge(0, 64)?];
    p.expect_fatal_error(
        p.b.read_op(0),
        &dst,
        SendFlags::SIGNALED,
        WcStatus::LocProtErr,
        false,
    )?;
    let mut got = [0u8; 64];
    mr.read(0, &mut got)?;
    check_bytes(&got, &[0; 64], "read-only destination MR")
}

/// A SEND into a receive WR whose SGE has an invalid lkey: the responder's receive WC is
/// `LOC_PROT_ERR` (`ibv_poll_cq(3)`: the locally posted WR's buffers do not reference a valid
/// MR; the reasoning of DIVERGENCES.md #4 for the send side; rxe reports `LOC_QP_OP_ERR` for
/// this "malformed WQE", §4.3); it NAKs with a remote operational error, so the requester's
/// WC is `REM_OP_ERR` (NAK 0x63, §3.9); both QPs enter ERR and the rest flushes on both sides.
pub fn recv_bad_lkey<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let mut bad = p.b.sge(0, 64)?;
    bad.lkey ^= 0x80;
    p.b.qp.post_recv(&[RecvWr::new(10, &[bad])])?;
    p.b.post_recv_at(11, 64, 64)?;
    p.a.post_recv_at(20, 0, 64)?;
    let src = [p.a.sge(0, 8)?];
    p.a.qp.post_send(&[
        SendWr::new(1, SendOp::Send, &src),
        SendWr::new(2, SendOp::Send, &src),
    ])?;
    expect_error_then_flush(&p.a.send_cq, p.a.qpn(), 1, WcStatus::RemOpErr, &[2])?;
    check_eq!(p.a.state()?, QpState::Err, "requester state");
    p.b.wait_state(QpState::Err)?;
    expect_error_then_flush(&p.b.recv_cq, p.b.qpn(), 10, WcStatus::LocProtErr, &[11])?;
    p.a.expect_recv_flushed(&[20])
}

/// WRs that completed before a fatal error keep their success: a WRITE, then a WRITE with an
/// invalid rkey, then a SEND complete as `SUCCESS`, `REM_ACCESS_ERR`, `WR_FLUSH_ERR` in that
/// order, and the first WRITE's data is in place (the NAK implicitly acknowledges the earlier
/// PSNs, §2.8).
pub fn error_after_success_in_order<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    p.a.fill(0, &[0x3C; 16])?;
    let src = [p.a.sge(0, 16)?];
    let bad = SendOp::RdmaWrite {
        remote_addr: p.b.addr(64),
        rkey: p.b.mr.rkey() ^ 0x80,
    };
    p.a.qp.post_send(&[
        SendWr::new(1, p.b.write_op(0), &src),
        SendWr::new(2, bad, &src),
        SendWr::new(3, SendOp::Send, &src),
    ])?;
    let wcs = poll_exact(&p.a.send_cq, 3)?;
    check_success(&wcs[0], 1, WcOpcode::RdmaWrite, 16, p.a.qpn())?;
    check_status(&wcs[1], 2, WcStatus::RemAccessErr, p.a.qpn())?;
    check_flushed(&wcs[2..], &[3], p.a.qpn())?;
    check_bytes(
        &p.b.bytes(0, 16)?,
        &[0x3C; 16],
        "the WRITE before the error",
    )?;
    p.b.wait_state(QpState::Err)
}

/// A responder error on a QP attached to an SRQ (an RDMA WRITE with an invalid rkey) moves it
/// to ERR and raises `QP_LAST_WQE_REACHED` for it on the responder's context instead of
/// flushing the shared queue (§6.3): the SRQ's receives stay posted, and a second QP on the
/// same SRQ still receives through it.
pub fn srq_qp_error_raises_last_wqe_reached<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::with(env, |c| {
        c.srq_b = Some(SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        });
    })?;
    let (qa2, qb2) = p.connect_another()?;
    p.b.post_recv_at(1, 0, 64)?;
    let src = [p.a.sge(0, 8)?];
    let bad = SendOp::RdmaWrite {
        remote_addr: p.b.addr(1024),
        rkey: p.b.mr.rkey() ^ 0x80,
    };
    p.a.qp.post_send(&[SendWr::new(1, bad, &src)])?;
    expect_error_then_flush(&p.a.send_cq, p.a.qpn(), 1, WcStatus::RemAccessErr, &[])?;
    p.b.wait_state(QpState::Err)?;
    let qpn = p.b.qpn();
    wait_async(&p.b.ctx, "QP_LAST_WQE_REACHED", |e| {
        e.kind == AsyncEventKind::QpLastWqeReached && e.element == EventElement::Qp(qpn)
    })?;
    poll_exact(&p.b.recv_cq, 0)?;
    qa2.post_send(&[SendWr::new(2, SendOp::Send, &src)])?;
    let sent = poll_exact(&p.a.send_cq, 1)?;
    check_success(&sent[0], 2, WcOpcode::Send, 8, qa2.qp_num())?;
    let got = poll_exact(&p.b.recv_cq, 1)?;
    check_recv(
        &got[0],
        1,
        WcOpcode::Recv,
        8,
        None,
        qb2.qp_num(),
        qa2.qp_num(),
    )
}

/// An error completion is generated for an unsignaled WR ("an error always generates a WC",
/// IBA 10.7.3.1, §3.2): an unsignaled WRITE with an invalid rkey completes with
/// `REM_ACCESS_ERR` and its `wr_id`.
pub fn unsignaled_error_completes<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let op = SendOp::RdmaWrite {
        remote_addr: p.b.addr(0),
        rkey: p.b.mr.rkey() ^ 0x80,
    };
    let src = [p.a.sge(0, 8)?];
    p.expect_fatal_error(op, &src, SendFlags::empty(), WcStatus::RemAccessErr, true)
}

/// After a fatal error no later WR of any kind succeeds: SEND, WRITE, READ and atomic posted
/// in ERR all flush in order (signaled or not) and none touches memory.
pub fn no_wr_succeeds_after_error<C: Context>(env: &Env<C>) -> Outcome {
    let p = Pair::new(env)?;
    let bad = SendOp::RdmaWrite {
        remote_addr: p.b.addr(0),
        rkey: p.b.mr.rkey() ^ 0x80,
    };
    let src = [p.a.sge(0, 8)?];
    p.a.qp.post_send(&[SendWr::new(1, bad, &src)])?;
    expect_error_then_flush(&p.a.send_cq, p.a.qpn(), 1, WcStatus::RemAccessErr, &[])?;
    p.a.fill(0, &[0x77; 8])?;
    p.b.fill(256, &[0x88; 8])?;
    p.b.set_word(512, 1)?;
    let dst = [p.a.sge(64, 8)?];
    let res = [p.a.sge(128, 8)?];
    p.a.qp.post_send(&[
        SendWr::new(2, SendOp::Send, &src),
        SendWr::new(3, p.b.write_op(0), &src),
        SendWr::new(4, p.b.read_op(256), &dst).with_flags(SendFlags::empty()),
        SendWr::new(5, p.b.faa_op(512, 1), &res),
    ])?;
    let wcs = poll_exact(&p.a.send_cq, 4)?;
    check_flushed(&wcs, &[2, 3, 4, 5], p.a.qpn())?;
    check_bytes(&p.b.bytes(0, 8)?, &[0; 8], "WRITE target")?;
    check_bytes(&p.a.bytes(64, 8)?, &[0; 8], "READ destination")?;
    check_eq!(p.b.word(512)?, 1, "atomic target");
    check_eq!(p.a.word(128)?, 0, "atomic result slot");
    Ok(())
}

/// With `rnr_retry` n < 7 and no receive posted, a SEND ends in `RNR_RETRY_EXC_ERR` after
/// n retries (§3.7, §3.9), for n = 0, 3 and 6 (`min_rnr_timer` 1 = 0.01 ms, so real hardware
/// is quick too); the requester enters ERR and the next WR flushes; the responder, which only
/// sent RNR NAKs, stays in RTS.
pub fn rnr_retry_exceeded<C: Context>(env: &Env<C>) -> Outcome {
    for n in [0u8, 3, 6] {
        let p = Pair::with(env, |c| {
            c.both(|o| {
                o.rnr_retry = n;
                o.min_rnr_timer = 1;
            });
        })?;
        let src = [p.a.sge(0, 8)?];
        p.a.qp.post_send(&[
            SendWr::new(1, SendOp::Send, &src),
            SendWr::new(2, p.b.write_op(0), &src),
        ])?;
        expect_error_then_flush(&p.a.send_cq, p.a.qpn(), 1, WcStatus::RnrRetryExcErr, &[2])
            .map_err(|e| crate::check::failure(format!("rnr_retry {n}: {e}")))?;
        check_eq!(p.a.state()?, QpState::Err, "requester with rnr_retry {n}");
        check_eq!(p.b.state()?, QpState::Rts, "responder with rnr_retry {n}");
        poll_exact(&p.b.recv_cq, 0)?;
    }
    Ok(())
}

/// With `rnr_retry` 7 (infinite, §3.7) a SEND to a QP without a receive keeps being retried;
/// the requester stays in RTS; once a receive is posted it completes. Run for 8 bytes and for
/// 5000 (five packets at MTU 1024; the RNR NAK answers the FIRST packet, §4.2).
pub fn rnr_retry_infinite_then_recv<C: Context>(env: &Env<C>) -> Outcome {
    for len in [8usize, 5000] {
        let p = Pair::with(env, |c| {
            c.both(|o| {
                o.rnr_retry = 7;
                o.min_rnr_timer = 1;
                o.path_mtu = Mtu::Mtu1024;
            });
        })?;
        let data = pattern(0x99, len);
        p.a.fill(0, &data)?;
        let src = [p.a.sge(0, len)?];
        p.a.qp.post_send(&[SendWr::new(1, SendOp::Send, &src)])?;
        expect_nothing_for_a_while(&p.a.send_cq, "SEND without a receive, rnr_retry 7")?;
        check_eq!(
            p.a.state()?,
            QpState::Rts,
            "requester during RNR ({len} bytes)"
        );
        p.b.post_recv_at(10, 0, 8192)?;
        p.a.expect_send(1, WcOpcode::Send, len as u32)?;
        p.b.expect_recv(&p.a, 10, WcOpcode::Recv, len as u32, None)?;
        check_bytes(&p.b.bytes(0, len)?, &data, "SEND after RNR")?;
    }
    Ok(())
}

/// Transport retry exhaustion (§3.5, §3.7, §3.9): with the peer QP destroyed, nothing answers;
/// with `timeout` 8 (≈ 1 ms) and `retry_cnt` 2 (then 0) the first WR completes with
/// `RETRY_EXC_ERR` after `retry_cnt` + 1 timeouts, the rest (an unsignaled one included) and
/// the posted receive flush, the QP is in ERR. The wait is [`RETRY_WAIT`], not the usual one
/// second (see there).
pub fn retry_exceeded_peer_gone<C: Context>(env: &Env<C>) -> Outcome {
    for retry_cnt in [2u8, 0] {
        let p = Pair::with(env, |c| {
            c.opts_a.timeout = 8;
            c.opts_a.retry_cnt = retry_cnt;
        })?;
        p.b.qp.destroy()?;
        p.a.post_recv_at(20, 0, 64)?;
        let src = [p.a.sge(0, 8)?];
        p.a.qp.post_send(&[
            SendWr::new(1, SendOp::Send, &src),
            SendWr::new(2, p.b.write_op(0), &src),
            SendWr::new(3, p.b.write_op(8), &src).with_flags(SendFlags::empty()),
        ])?;
        let wcs = poll_exact_within(&p.a.send_cq, 3, RETRY_WAIT)?;
        check_status(&wcs[0], 1, WcStatus::RetryExcErr, p.a.qpn())?;
        check_flushed(&wcs[1..], &[2, 3], p.a.qpn())?;
        check_eq!(
            p.a.state()?,
            QpState::Err,
            "requester after RETRY_EXC_ERR (retry_cnt {retry_cnt})"
        );
        p.a.expect_recv_flushed(&[20])?;
    }
    Ok(())
}
