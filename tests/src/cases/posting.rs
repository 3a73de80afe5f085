//! Checklist item 4, second half: posting work per QP state and its errors
//! (rc-transport.md §5.2; pyverbs `test_qpex.py` bad flows), flush to ERR with `WR_FLUSH_ERR`
//! (§6.3), and shared receive queues (`test_srq.py`).
//!
//! Sends are kept from executing by posting them in SQD, where they are queued but not
//! started, or in ERR, where they flush at once; so no case depends on a peer. How many WRs
//! were really posted before a rejected one is proven by flushing the queue and counting.

use verbs_api::{
    AccessFlags, AsyncEventKind, CompletionQueue, Context, ErrorKind, EventElement, MemoryRegion,
    QpState, QueuePair, RecvWr, SendFlags, SendOp, SendWr, Sge, SharedReceiveQueue, SrqAttr,
    WorkCompletion,
};

use crate::check::{Outcome, Stop, expect_err, expect_kind, expect_post_err, needs};
use crate::fixture::{
    Env, Fixture, TestQp, expect_flushed, expect_only_recv_sentinel, expect_only_send_sentinel,
    poll_exact, recv_wr, send_wr, wait_async,
};
use crate::{check_eq, ensure};

fn to_err<C: Context>(fx: &Fixture<C>, t: &TestQp<C>) -> Outcome {
    let attr = fx.full_attr(QpState::Err, t.state()?, &fx.peer_ep);
    t.qp.modify(&attr, verbs_api::QpAttrMask::STATE)?;
    Ok(())
}

fn post_send_rejected_in<C: Context>(env: &Env<C>, state: QpState) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(state)?;
    expect_post_err(
        t.qp.post_send(&[send_wr(1), send_wr(2)]),
        0,
        &[ErrorKind::InvalidState],
        &format!("post_send in {state}"),
    )?;
    check_eq!(t.state()?, state, "state after the rejected post");
    if state != QpState::Reset {
        // Nothing was queued: after ERR only a sentinel completes.
        to_err(&fx, &t)?;
        expect_only_send_sentinel(&t, 99)?;
    }
    Ok(())
}

/// `post_send` in RESET is `InvalidState` at index 0.
pub fn post_send_in_reset_invalid_state<C: Context>(env: &Env<C>) -> Outcome {
    post_send_rejected_in(env, QpState::Reset)
}

/// `post_send` in INIT is `InvalidState` at index 0; nothing is queued.
pub fn post_send_in_init_invalid_state<C: Context>(env: &Env<C>) -> Outcome {
    post_send_rejected_in(env, QpState::Init)
}

/// `post_send` in RTR is `InvalidState` at index 0; nothing is queued.
pub fn post_send_in_rtr_invalid_state<C: Context>(env: &Env<C>) -> Outcome {
    post_send_rejected_in(env, QpState::Rtr)
}

/// `post_recv` in RESET is `InvalidState` at index 0 (rdma-core fixed accepting it in 2022).
pub fn post_recv_in_reset_invalid_state<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp()?;
    expect_post_err(
        t.qp.post_recv(&[recv_wr(1), recv_wr(2)]),
        0,
        &[ErrorKind::InvalidState],
        "post_recv in RESET",
    )?;
    fx.walk(&t.qp, QpState::Err)?;
    expect_only_recv_sentinel(&t, 99)
}

/// `post_recv` is allowed in INIT and RTR; the WRs stay queued (flushed in order by ERR).
pub fn post_recv_in_init_and_rtr_allowed<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Init)?;
    t.qp.post_recv(&[recv_wr(1), recv_wr(2)])?;
    let attr = fx.full_attr(QpState::Rtr, QpState::Init, &fx.peer_ep);
    t.qp.modify(&attr, verbs_api::connect::RTR_MASK)?;
    t.qp.post_recv(&[recv_wr(3), recv_wr(4)])?;
    let mut out = [WorkCompletion::default(); 1];
    check_eq!(t.recv_cq.poll(&mut out)?, 0, "receives complete before ERR");
    to_err(&fx, &t)?;
    expect_flushed(&t.recv_cq, &[1, 2, 3, 4], t.qpn())
}

/// `post_send` in SQD is allowed: queued, not started, the QP stays in SQD.
pub fn post_send_in_sqd_queued<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Sqd)?;
    t.qp.post_send(&[send_wr(1), send_wr(2)])?;
    check_eq!(t.state()?, QpState::Sqd);
    let mut out = [WorkCompletion::default(); 1];
    check_eq!(t.send_cq.poll(&mut out)?, 0, "sends completed in SQD");
    to_err(&fx, &t)?;
    expect_flushed(&t.send_cq, &[1, 2], t.qpn())
}

/// In ERR every posted send completes at once with `WR_FLUSH_ERR` on the send CQ, in order,
/// with its `wr_id` and `qp_num`, unsignaled ones included ("an error always generates a WC").
pub fn post_send_in_err_flushes<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Err)?;
    let unsignaled = send_wr(2).with_flags(SendFlags::empty());
    t.qp.post_send(&[send_wr(1), unsignaled, send_wr(3)])?;
    expect_flushed(&t.send_cq, &[1, 2, 3], t.qpn())?;
    poll_exact(&t.recv_cq, 0)?;
    Ok(())
}

/// In ERR every posted receive completes at once with `WR_FLUSH_ERR` on the receive CQ.
pub fn post_recv_in_err_flushes<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Err)?;
    t.qp.post_recv(&[recv_wr(1), recv_wr(2), recv_wr(3)])?;
    expect_flushed(&t.recv_cq, &[1, 2, 3], t.qpn())?;
    poll_exact(&t.send_cq, 0)?;
    Ok(())
}

/// Entering ERR flushes queued receives with `WR_FLUSH_ERR`, in order.
pub fn err_flushes_queued_recvs_in_order<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Init)?;
    t.qp.post_recv(&[recv_wr(10), recv_wr(11)])?;
    t.qp.post_recv(&[recv_wr(12)])?;
    to_err(&fx, &t)?;
    expect_flushed(&t.recv_cq, &[10, 11, 12], t.qpn())
}

/// Entering ERR flushes queued sends (unsignaled included) and receives, each on its CQ, in
/// order.
pub fn err_flushes_queued_sends_in_order<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Sqd)?;
    let unsignaled = send_wr(21).with_flags(SendFlags::empty());
    t.qp.post_send(&[send_wr(20), unsignaled])?;
    t.qp.post_send(&[send_wr(22)])?;
    t.qp.post_recv(&[recv_wr(30), recv_wr(31)])?;
    to_err(&fx, &t)?;
    expect_flushed(&t.send_cq, &[20, 21, 22], t.qpn())?;
    expect_flushed(&t.recv_cq, &[30, 31], t.qpn())
}

/// A batch overfilling the send queue fails with `NoMemory` at the first WR that does not
/// fit; the earlier ones are posted (exactly `max_send_wr` flush).
pub fn send_queue_full_nomem<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let mut cap = fx.cap();
    cap.max_send_wr = cap.max_send_wr.min(4);
    let t = fx.qp_with_cap(&cap)?;
    fx.walk(&t.qp, QpState::Sqd)?;
    let n = t.qp.query()?.cap.max_send_wr as usize;
    let wrs: Vec<SendWr<'_>> = (0..n as u64 + 2).map(send_wr).collect();
    expect_post_err(
        t.qp.post_send(&wrs),
        n,
        &[ErrorKind::NoMemory],
        "overfull send batch",
    )?;
    expect_post_err(
        t.qp.post_send(&[send_wr(100)]),
        0,
        &[ErrorKind::NoMemory],
        "post to a full send queue",
    )?;
    to_err(&fx, &t)?;
    expect_flushed(&t.send_cq, &(0..n as u64).collect::<Vec<_>>(), t.qpn())
}

/// A batch overfilling the receive queue fails with `NoMemory` at the first WR that does not
/// fit; the earlier ones are posted.
pub fn recv_queue_full_nomem<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let mut cap = fx.cap();
    cap.max_recv_wr = cap.max_recv_wr.min(4);
    let t = fx.qp_with_cap(&cap)?;
    fx.walk(&t.qp, QpState::Init)?;
    let n = t.qp.query()?.cap.max_recv_wr as usize;
    let wrs: Vec<RecvWr<'_>> = (0..n as u64 + 2).map(recv_wr).collect();
    expect_post_err(
        t.qp.post_recv(&wrs),
        n,
        &[ErrorKind::NoMemory],
        "overfull receive batch",
    )?;
    to_err(&fx, &t)?;
    expect_flushed(&t.recv_cq, &(0..n as u64).collect::<Vec<_>>(), t.qpn())
}

fn sges<M: MemoryRegion>(mr: &M, count: usize) -> Result<Vec<Sge>, Stop> {
    (0..count).map(|i| Ok(mr.sge(i * 8, 8)?)).collect()
}

/// A send WR with more SGEs than `max_send_sge` is `InvalidArgument` at its index; the WR
/// before it is posted.
pub fn send_too_many_sges_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Sqd)?;
    let max = t.qp.query()?.cap.max_send_sge as usize;
    let mr = fx
        .ctx
        .alloc_mr(&fx.pd, 8 * (max + 1), AccessFlags::LOCAL_WRITE)?;
    let one = sges(&mr, 1)?;
    let many = sges(&mr, max + 1)?;
    let wrs = [
        SendWr::new(1, SendOp::Send, &one),
        SendWr::new(2, SendOp::Send, &many),
        SendWr::new(3, SendOp::Send, &one),
    ];
    expect_post_err(
        t.qp.post_send(&wrs),
        1,
        &[ErrorKind::InvalidArgument],
        "send with max_send_sge + 1 SGEs",
    )?;
    to_err(&fx, &t)?;
    expect_flushed(&t.send_cq, &[1], t.qpn())
}

/// A receive WR with more SGEs than `max_recv_sge` is `InvalidArgument` at its index.
pub fn recv_too_many_sges_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Init)?;
    let max = t.qp.query()?.cap.max_recv_sge as usize;
    let mr = fx
        .ctx
        .alloc_mr(&fx.pd, 8 * (max + 1), AccessFlags::LOCAL_WRITE)?;
    let one = sges(&mr, 1)?;
    let many = sges(&mr, max + 1)?;
    let wrs = [
        RecvWr::new(1, &one),
        RecvWr::new(2, &many),
        RecvWr::new(3, &one),
    ];
    expect_post_err(
        t.qp.post_recv(&wrs),
        1,
        &[ErrorKind::InvalidArgument],
        "receive with max_recv_sge + 1 SGEs",
    )?;
    to_err(&fx, &t)?;
    expect_flushed(&t.recv_cq, &[1], t.qpn())
}

/// Inline data up to the QP's `max_inline_data` is accepted; one byte more is
/// `InvalidArgument` at its index.
pub fn inline_above_max_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Sqd)?;
    let max = t.qp.query()?.cap.max_inline_data as usize;
    let fits = vec![0x5Au8; max];
    let too_big = vec![0xA5u8; max + 1];
    let wrs = [
        SendWr::inline(1, SendOp::Send, &fits),
        SendWr::inline(2, SendOp::Send, &too_big),
    ];
    expect_post_err(
        t.qp.post_send(&wrs),
        1,
        &[ErrorKind::InvalidArgument],
        "inline send of max_inline_data + 1 bytes",
    )?;
    to_err(&fx, &t)?;
    expect_flushed(&t.send_cq, &[1], t.qpn())
}

/// An atomic whose local SGE is not 8 bytes is `InvalidArgument` (rxe: "atomic length != 8").
pub fn atomic_short_sge_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Sqd)?;
    let mr = fx.ctx.alloc_mr(&fx.pd, 64, AccessFlags::LOCAL_WRITE)?;
    let eight = [mr.sge(0, 8)?];
    let four = [mr.sge(8, 4)?];
    let op = SendOp::AtomicFetchAndAdd {
        remote_addr: 0x1000,
        rkey: mr.rkey(),
        add: 1,
    };
    let wrs = [SendWr::new(1, op, &eight), SendWr::new(2, op, &four)];
    expect_post_err(
        t.qp.post_send(&wrs),
        1,
        &[ErrorKind::InvalidArgument],
        "fetch-and-add with a 4-byte SGE",
    )?;
    to_err(&fx, &t)?;
    expect_flushed(&t.send_cq, &[1], t.qpn())
}

/// An atomic on a remote address that is not 8-byte aligned is `InvalidArgument`.
pub fn atomic_misaligned_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Sqd)?;
    let mr = fx.ctx.alloc_mr(&fx.pd, 64, AccessFlags::LOCAL_WRITE)?;
    let eight = [mr.sge(0, 8)?];
    let cas = |remote_addr| SendOp::AtomicCmpAndSwp {
        remote_addr,
        rkey: mr.rkey(),
        compare: 0,
        swap: 1,
    };
    let wrs = [
        SendWr::new(1, cas(0x2000), &eight),
        SendWr::new(2, cas(0x2004), &eight),
    ];
    expect_post_err(
        t.qp.post_send(&wrs),
        1,
        &[ErrorKind::InvalidArgument],
        "compare-and-swap at remote address 0x2004",
    )?;
    to_err(&fx, &t)?;
    expect_flushed(&t.send_cq, &[1], t.qpn())
}

/// `post_recv` on a QP attached to an SRQ fails: `InvalidState` per the `QueuePair::post_recv`
/// contract (`EINVAL` in rxe).
pub fn post_recv_on_srq_qp_rejected<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let srq = needs(fx.ctx.create_srq(&fx.pd, &srq_attr(8, 1)), "SRQ")?;
    let (scq, rcq) = (fx.cq()?, fx.cq()?);
    let t = fx.qp_on(&scq, &rcq, Some(&srq))?;
    fx.walk(&t.qp, QpState::Init)?;
    expect_post_err(
        t.qp.post_recv(&[recv_wr(1)]),
        0,
        &[ErrorKind::InvalidState],
        "post_recv on a QP with an SRQ",
    )
}

fn srq_attr(max_wr: u32, max_sge: u32) -> SrqAttr {
    SrqAttr {
        max_wr,
        max_sge,
        srq_limit: 0,
    }
}

/// SRQ creation: `max_wr` 0 or above `max_srq_wr`, `max_sge` above `max_srq_sge` are
/// `InvalidArgument`; a valid one reports at least what was asked.
pub fn srq_create_limits<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let d = &fx.dev;
    if d.max_srq == 0 {
        return Err(Stop::Skip("device reports max_srq = 0".into()));
    }
    let inv = ErrorKind::InvalidArgument;
    let c = &fx.ctx;
    expect_kind(c.create_srq(&fx.pd, &srq_attr(0, 1)), inv, "SRQ max_wr 0")?;
    if let Some(above) = d.max_srq_wr.checked_add(1) {
        expect_kind(
            c.create_srq(&fx.pd, &srq_attr(above, 1)),
            inv,
            "SRQ max_wr above max",
        )?;
    }
    if let Some(above) = d.max_srq_sge.checked_add(1) {
        expect_kind(
            c.create_srq(&fx.pd, &srq_attr(4, above)),
            inv,
            "SRQ max_sge above max",
        )?;
    }
    let srq = c.create_srq(&fx.pd, &srq_attr(16, d.max_srq_sge.min(2)))?;
    let a = srq.query()?;
    ensure!(a.max_wr >= 16, "SRQ reports max_wr {}", a.max_wr);
    ensure!(
        a.max_sge >= d.max_srq_sge.min(2),
        "SRQ reports max_sge {}",
        a.max_sge
    );
    srq.destroy()?;
    Ok(())
}

/// An SRQ takes `max_wr` receives; the next in the batch is `NoMemory` at its index.
pub fn srq_post_and_full<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let srq = needs(fx.ctx.create_srq(&fx.pd, &srq_attr(4, 1)), "SRQ")?;
    let n = srq.query()?.max_wr as usize;
    let wrs: Vec<RecvWr<'_>> = (0..n as u64 + 2).map(recv_wr).collect();
    expect_post_err(
        srq.post_recv(&wrs),
        n,
        &[ErrorKind::NoMemory],
        "overfull SRQ batch",
    )?;
    expect_post_err(
        srq.post_recv(&[recv_wr(100)]),
        0,
        &[ErrorKind::NoMemory],
        "post to a full SRQ",
    )
}

/// An SRQ receive with more SGEs than the SRQ's `max_sge` is `InvalidArgument` at its index.
pub fn srq_too_many_sges_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let srq = needs(fx.ctx.create_srq(&fx.pd, &srq_attr(8, 1)), "SRQ")?;
    let max = srq.query()?.max_sge as usize;
    let mr = fx
        .ctx
        .alloc_mr(&fx.pd, 8 * (max + 1), AccessFlags::LOCAL_WRITE)?;
    let one = sges(&mr, 1)?;
    let many = sges(&mr, max + 1)?;
    let wrs = [RecvWr::new(1, &one), RecvWr::new(2, &many)];
    expect_post_err(
        srq.post_recv(&wrs),
        1,
        &[ErrorKind::InvalidArgument],
        "SRQ receive with max_sge + 1 SGEs",
    )
}

/// Destroying an SRQ a QP uses is `Busy`; after the QP is gone it succeeds.
pub fn srq_destroy_busy_while_qp_uses_it<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let srq = needs(fx.ctx.create_srq(&fx.pd, &srq_attr(8, 1)), "SRQ")?;
    let cq = fx.cq()?;
    let t = fx.qp_on(&cq, &cq, Some(&srq))?;
    expect_kind(srq.destroy(), ErrorKind::Busy, "destroy an SRQ in use")?;
    srq.post_recv(&[recv_wr(1)])?;
    t.qp.destroy()?;
    srq.destroy()?;
    Ok(())
}

/// Every call on a destroyed SRQ fails with `Destroyed`.
pub fn srq_use_after_destroy<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let srq = needs(fx.ctx.create_srq(&fx.pd, &srq_attr(8, 1)), "SRQ")?;
    let clone = srq.clone();
    srq.destroy()?;
    let d = ErrorKind::Destroyed;
    expect_post_err(
        clone.post_recv(&[recv_wr(1)]),
        0,
        &[d],
        "post to a destroyed SRQ",
    )?;
    expect_kind(clone.query(), d, "query a destroyed SRQ")?;
    expect_kind(clone.arm_limit(1), d, "arm a destroyed SRQ")?;
    expect_err(srq.destroy(), &[d], "second destroy of an SRQ")?;
    Ok(())
}

/// A QP with an SRQ entering ERR raises `QP_LAST_WQE_REACHED` and does not flush the shared
/// queue's WRs (§6.3); the SRQ stays usable.
pub fn err_with_srq_raises_last_wqe_reached<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let srq = needs(fx.ctx.create_srq(&fx.pd, &srq_attr(8, 1)), "SRQ")?;
    let (scq, rcq) = (fx.cq()?, fx.cq()?);
    let t = fx.qp_on(&scq, &rcq, Some(&srq))?;
    fx.walk(&t.qp, QpState::Init)?;
    srq.post_recv(&[recv_wr(1), recv_wr(2)])?;
    to_err(&fx, &t)?;
    let qpn = t.qpn();
    wait_async(&fx.ctx, "QP_LAST_WQE_REACHED", |e| {
        e.kind == AsyncEventKind::QpLastWqeReached && e.element == EventElement::Qp(qpn)
    })?;
    let mut out = [WorkCompletion::default(); 2];
    check_eq!(
        rcq.poll(&mut out)?,
        0,
        "SRQ receives flushed by one QP's ERR"
    );
    srq.post_recv(&[recv_wr(3)])?;
    Ok(())
}
