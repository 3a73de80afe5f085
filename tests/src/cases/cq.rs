//! Checklist item 3: completion queues (pyverbs `test_cq.py`, `test_cq_events.py`): size
//! limits, resize, polling, `Busy` while in use, completion channels (arming, one-shot,
//! solicited, get/ack counts, a real fd readiness test with `poll(2)`) and overflow
//! (rc-transport.md §6.3).
//!
//! Completions are produced without a peer: a QP in ERR completes every posted WR at once with
//! `WR_FLUSH_ERR` (§5.2).

use std::os::fd::AsFd;
use std::time::Duration;

use verbs_api::{
    AsyncEventKind, CompletionChannel, CompletionQueue, Context, ErrorKind, EventElement, QpState,
    QueuePair, WcStatus, WorkCompletion,
};

use crate::check::{Outcome, Stop, expect_kind, failure, needs};
use crate::fixture::{
    Env, Fixture, TestQp, WAIT, expect_flushed, fd_readable, recv_wr, send_wr, wait_async,
};
use crate::{check_eq, ensure, fail};

/// A CQ of 1 entry is allowed; it holds at least 1.
pub fn create_min_size<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let cq = ctx.create_cq(1, None)?;
    ensure!(cq.capacity() >= 1, "capacity {} < 1", cq.capacity());
    cq.destroy()?;
    Ok(())
}

/// A CQ of `max_cqe` entries is allowed; it holds at least that many.
pub fn create_max_size<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let max = ctx.query_device()?.max_cqe;
    let cq = ctx.create_cq(max, None)?;
    ensure!(
        cq.capacity() >= max,
        "capacity {} < max_cqe {max}",
        cq.capacity()
    );
    cq.destroy()?;
    Ok(())
}

/// A CQ of 0 entries is `InvalidArgument` (§6.3).
pub fn create_zero_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    expect_kind(
        ctx.create_cq(0, None),
        ErrorKind::InvalidArgument,
        "create_cq(0)",
    )
}

/// A CQ above `max_cqe` is `InvalidArgument` (§6.3).
pub fn create_above_max_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let max = ctx.query_device()?.max_cqe;
    if let Some(above) = max.checked_add(1) {
        expect_kind(
            ctx.create_cq(above, None),
            ErrorKind::InvalidArgument,
            "create_cq(max_cqe + 1)",
        )?;
    }
    expect_kind(
        ctx.create_cq(u32::MAX, None),
        ErrorKind::InvalidArgument,
        "create_cq(u32::MAX)",
    )
}

/// A CQ can grow and shrink (`ibv_resize_cq`); capacity follows.
pub fn resize_up_and_down<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let cq = ctx.create_cq(16, None)?;
    needs(cq.resize(256), "ibv_resize_cq")?;
    ensure!(
        cq.capacity() >= 256,
        "capacity {} after resize(256)",
        cq.capacity()
    );
    cq.resize(4)?;
    ensure!(
        cq.capacity() >= 4,
        "capacity {} after resize(4)",
        cq.capacity()
    );
    let mut out = [WorkCompletion::default(); 4];
    check_eq!(cq.poll(&mut out)?, 0, "resized CQ is empty");
    cq.destroy()?;
    Ok(())
}

/// Resizing to 0 or above `max_cqe` is `InvalidArgument` and changes nothing.
pub fn resize_bounds_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let max = ctx.query_device()?.max_cqe;
    let cq = ctx.create_cq(16, None)?;
    let before = cq.capacity();
    expect_kind(cq.resize(0), ErrorKind::InvalidArgument, "resize(0)")?;
    if let Some(above) = max.checked_add(1) {
        expect_kind(
            cq.resize(above),
            ErrorKind::InvalidArgument,
            "resize(max_cqe + 1)",
        )?;
    }
    check_eq!(cq.capacity(), before, "capacity after rejected resizes");
    Ok(())
}

/// Resizing below the completions a CQ holds is `InvalidArgument` (§6.3); they survive intact.
pub fn resize_below_held_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let s = ArmedQp::new(env, 8)?;
    for id in 1..=3 {
        s.cq.req_notify(false)?;
        s.t.qp.post_send(&[send_wr(id)])?;
        // The event proves the completion is in the CQ (a backend may complete asynchronously).
        check_eq!(
            next_event(&s.ch)?,
            s.cq.handle(),
            "event for completion {id}"
        );
        s.cq.ack_events(1);
    }
    expect_kind(
        s.cq.resize(2),
        ErrorKind::InvalidArgument,
        "resize(2) holding 3",
    )?;
    needs(s.cq.resize(3), "ibv_resize_cq")?;
    expect_flushed(&s.cq, &[1, 2, 3], s.t.qpn())
}

/// Polling an empty CQ returns 0 (also with an empty output slice).
pub fn poll_empty<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let cq = ctx.create_cq(4, None)?;
    let mut out = [WorkCompletion::default(); 4];
    check_eq!(cq.poll(&mut out)?, 0, "poll of an empty CQ");
    check_eq!(cq.poll(&mut [])?, 0, "poll into an empty slice");
    Ok(())
}

/// Destroying a CQ a QP uses (as send or receive CQ) is `Busy` (the uverbs use count); after
/// the QP is destroyed, it succeeds.
pub fn destroy_in_use_busy<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp()?;
    expect_kind(
        t.send_cq.destroy(),
        ErrorKind::Busy,
        "destroy the send CQ of a live QP",
    )?;
    expect_kind(
        t.recv_cq.destroy(),
        ErrorKind::Busy,
        "destroy the receive CQ of a live QP",
    )?;
    let mut out = [WorkCompletion::default(); 1];
    check_eq!(t.send_cq.poll(&mut out)?, 0, "CQ still usable after Busy");
    t.qp.destroy()?;
    t.send_cq.destroy()?;
    t.recv_cq.destroy()?;
    Ok(())
}

/// Every call on a destroyed CQ fails with `Destroyed`.
pub fn use_after_destroy<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let ch = ctx.create_comp_channel()?;
    let cq = ctx.create_cq(4, Some(&ch))?;
    let clone = cq.clone();
    cq.destroy()?;
    let d = ErrorKind::Destroyed;
    let mut out = [WorkCompletion::default(); 1];
    expect_kind(clone.poll(&mut out), d, "poll after destroy")?;
    expect_kind(clone.req_notify(false), d, "req_notify after destroy")?;
    expect_kind(clone.resize(8), d, "resize after destroy")?;
    expect_kind(cq.destroy(), d, "second destroy")?;
    ch.destroy()?;
    Ok(())
}

/// Arming a CQ without a completion channel is `InvalidState` (the `verbs_api` contract; rxe
/// itself accepts the call and notifies nobody, so a libibverbs backend must check).
pub fn req_notify_without_channel<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let cq = ctx.create_cq(4, None)?;
    expect_kind(
        cq.req_notify(false),
        ErrorKind::InvalidState,
        "req_notify(next)",
    )?;
    expect_kind(
        cq.req_notify(true),
        ErrorKind::InvalidState,
        "req_notify(solicited)",
    )
}

/// A completion channel of another context is `InvalidArgument` for `create_cq`.
pub fn foreign_channel_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let same_dev = env.open(0)?;
    let peer = env.open_peer()?;
    for (label, other) in [("same device", &same_dev), ("peer device", &peer)] {
        let ch = other.create_comp_channel()?;
        expect_kind(
            ctx.create_cq(4, Some(&ch)),
            ErrorKind::InvalidArgument,
            &format!("create_cq with a channel of another context ({label})"),
        )?;
        ch.destroy()?;
    }
    Ok(())
}

/// A channel with nothing pending: fd not readable, no event, a zero-timeout wait returns none.
pub fn channel_idle_not_readable<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let ch = ctx.create_comp_channel()?;
    let cq = ctx.create_cq(4, Some(&ch))?;
    cq.req_notify(false)?;
    ensure!(
        !fd_readable(ch.as_fd(), Duration::ZERO)?,
        "idle channel fd is readable"
    );
    check_eq!(ch.get_cq_event()?, None, "event on an idle channel");
    check_eq!(
        ch.wait_cq_event(Some(Duration::ZERO))?,
        None,
        "zero-timeout wait"
    );
    Ok(())
}

/// Arm, complete a WR: the channel fd becomes readable (`poll(2)`, 1 s), `get_cq_event`
/// names the CQ, the fd is quiet again, the completion is there, and after `ack_events` the CQ
/// can be destroyed.
pub fn channel_event_fd_readable<C: Context>(env: &Env<C>) -> Outcome {
    let s = ArmedQp::new(env, 16)?;
    s.cq.req_notify(false)?;
    ensure!(
        !fd_readable(s.ch.as_fd(), Duration::ZERO)?,
        "fd readable before any completion"
    );
    s.t.qp.post_send(&[send_wr(7)])?;
    ensure!(
        fd_readable(s.ch.as_fd(), WAIT)?,
        "channel fd not readable within {WAIT:?} of an armed completion"
    );
    check_eq!(
        s.ch.get_cq_event()?,
        Some(s.cq.handle()),
        "event names the CQ"
    );
    ensure!(
        !fd_readable(s.ch.as_fd(), Duration::ZERO)?,
        "fd still readable after the only event was taken"
    );
    s.cq.ack_events(1);
    expect_flushed(&s.cq, &[7], s.t.qpn())?;
    s.t.qp.destroy()?;
    s.cq.destroy()?;
    s.ch.destroy()?;
    Ok(())
}

/// Arming is one-shot: after an event, a completion without re-arming raises no event; the
/// next armed completion raises exactly one.
pub fn channel_arming_one_shot<C: Context>(env: &Env<C>) -> Outcome {
    let s = ArmedQp::new(env, 16)?;
    s.cq.req_notify(false)?;
    s.t.qp.post_send(&[send_wr(1)])?;
    check_eq!(next_event(&s.ch)?, s.cq.handle(), "first armed completion");
    expect_flushed(&s.cq, &[1], s.t.qpn())?;
    // Not re-armed: this completion must not raise an event. Wait for the completion itself so
    // that a wrong event would be queued before the next one.
    s.t.qp.post_send(&[send_wr(2)])?;
    expect_flushed(&s.cq, &[2], s.t.qpn())?;
    s.cq.req_notify(false)?;
    s.t.qp.post_send(&[send_wr(3)])?;
    check_eq!(next_event(&s.ch)?, s.cq.handle(), "re-armed completion");
    check_eq!(
        s.ch.get_cq_event()?,
        None,
        "a second event: the unarmed completion raised one"
    );
    expect_flushed(&s.cq, &[3], s.t.qpn())?;
    s.cq.ack_events(2);
    Ok(())
}

/// A solicited-only arm fires for an error completion (IBTA; the `verbs_api` contract): a
/// receive WR flushed in ERR raises the event.
pub fn channel_solicited_arm_fires_on_error<C: Context>(env: &Env<C>) -> Outcome {
    let s = ArmedQp::new(env, 16)?;
    s.cq.req_notify(true)?;
    s.t.qp.post_recv(&[recv_wr(5)])?;
    check_eq!(
        next_event(&s.ch)?,
        s.cq.handle(),
        "solicited arm, error completion"
    );
    s.cq.ack_events(1);
    expect_flushed(&s.cq, &[5], s.t.qpn())
}

/// Two CQs on one channel: each event names the CQ that got the completion.
pub fn channel_event_names_cq<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let ch = fx.ctx.create_comp_channel()?;
    let scq = fx.ctx.create_cq(8, Some(&ch))?;
    let rcq = fx.ctx.create_cq(8, Some(&ch))?;
    ensure!(scq.handle() != rcq.handle(), "two CQs share a handle");
    let t = fx.qp_on(&scq, &rcq, None)?;
    fx.walk(&t.qp, QpState::Err)?;
    scq.req_notify(false)?;
    rcq.req_notify(false)?;
    t.qp.post_recv(&[recv_wr(1)])?;
    check_eq!(
        next_event(&ch)?,
        rcq.handle(),
        "event after a receive flush"
    );
    t.qp.post_send(&[send_wr(2)])?;
    check_eq!(next_event(&ch)?, scq.handle(), "event after a send flush");
    check_eq!(ch.get_cq_event()?, None, "no third event");
    scq.ack_events(1);
    rcq.ack_events(1);
    expect_flushed(&rcq, &[1], t.qpn())?;
    expect_flushed(&scq, &[2], t.qpn())
}

/// `wait_cq_event` with a timeout returns the pending event.
pub fn channel_wait_cq_event<C: Context>(env: &Env<C>) -> Outcome {
    let s = ArmedQp::new(env, 16)?;
    s.cq.req_notify(false)?;
    s.t.qp.post_send(&[send_wr(9)])?;
    check_eq!(
        s.ch.wait_cq_event(Some(WAIT))?,
        Some(s.cq.handle()),
        "wait_cq_event"
    );
    s.cq.ack_events(1);
    expect_flushed(&s.cq, &[9], s.t.qpn())
}

/// A CQ with unacknowledged events cannot be destroyed (`Busy`) until all are acknowledged
/// (libibverbs blocks in `ibv_destroy_cq` instead; the contract says `Busy`).
pub fn destroy_with_unacked_events_busy<C: Context>(env: &Env<C>) -> Outcome {
    let s = ArmedQp::new(env, 16)?;
    for id in [1, 2] {
        s.cq.req_notify(false)?;
        s.t.qp.post_send(&[send_wr(id)])?;
        check_eq!(next_event(&s.ch)?, s.cq.handle(), "event {id}");
        expect_flushed(&s.cq, &[id], s.t.qpn())?;
    }
    s.t.qp.destroy()?;
    expect_kind(
        s.cq.destroy(),
        ErrorKind::Busy,
        "destroy with 2 unacked events",
    )?;
    s.cq.ack_events(1);
    expect_kind(
        s.cq.destroy(),
        ErrorKind::Busy,
        "destroy with 1 unacked event",
    )?;
    s.cq.ack_events(1);
    s.cq.destroy()?;
    s.ch.destroy()?;
    Ok(())
}

/// An event the application never read does not hold its CQ: `ibv_destroy_cq` waits only for
/// the events it handed out (libibverbs; the kernel drops the unread ones), so a program that
/// destroys its CQ while a last event is still in the channel (ibv_srq_pingpong -e) succeeds.
pub fn destroy_with_unread_event_succeeds<C: Context>(env: &Env<C>) -> Outcome {
    let s = ArmedQp::new(env, 16)?;
    s.cq.req_notify(false)?;
    s.t.qp.post_send(&[send_wr(1)])?;
    ensure!(
        fd_readable(s.ch.as_fd(), WAIT)?,
        "no completion event within {WAIT:?}"
    );
    expect_flushed(&s.cq, &[1], s.t.qpn())?;
    s.t.qp.destroy()?;
    s.cq.destroy()?;
    s.ch.destroy()?;
    Ok(())
}

/// A channel a CQ uses cannot be destroyed (`Busy`, as `ibv_destroy_comp_channel`); after
/// the CQ is gone it can.
pub fn channel_destroy_busy_while_cq_uses_it<C: Context>(env: &Env<C>) -> Outcome {
    let ctx = env.open(0)?;
    let ch = ctx.create_comp_channel()?;
    let cq = ctx.create_cq(4, Some(&ch))?;
    expect_kind(ch.destroy(), ErrorKind::Busy, "destroy a channel in use")?;
    cq.req_notify(false)?;
    cq.destroy()?;
    ch.destroy()?;
    expect_kind(
        ch.destroy(),
        ErrorKind::Destroyed,
        "second destroy of a channel",
    )
}

/// Overrunning a CQ raises `CQ_ERR` for it; the completions it held are intact, in order, and
/// nothing beyond its capacity appears (§6.3).
pub fn overflow_raises_cq_err<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let cq = fx.ctx.create_cq(2, None)?;
    let cap = cq.capacity();
    ensure!(cap >= 2, "capacity {cap} < 2");
    let rcq = fx.cq()?;
    let mut qcap = fx.cap();
    qcap.max_send_wr = qcap.max_send_wr.max(cap + 1);
    let qp = fx
        .ctx
        .create_qp(&fx.pd, &cq, &rcq, None, &verbs_api::QpInitAttr::rc(qcap))?;
    fx.walk(&qp, QpState::Err)?;
    for id in 0..=u64::from(cap) {
        qp.post_send(&[send_wr(id)])?;
    }
    let handle = cq.handle();
    let ev = wait_async(&fx.ctx, "CQ_ERR", |e| {
        e.kind == AsyncEventKind::CqErr && e.element == EventElement::Cq(handle)
    })?;
    check_eq!(ev.element, EventElement::Cq(handle), "CQ_ERR element");
    let mut out = vec![WorkCompletion::default(); cap as usize + 1];
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    while got.len() < cap as usize && std::time::Instant::now() < deadline {
        match cq.poll(&mut out[..cap as usize - got.len()]) {
            Ok(0) => std::thread::yield_now(),
            Ok(n) => got.extend_from_slice(&out[..n]),
            Err(e) => fail!("poll of an overrun CQ holding entries: {e}"),
        }
    }
    let ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
    check_eq!(
        ids,
        (0..u64::from(cap)).collect::<Vec<_>>(),
        "held completions"
    );
    for wc in &got {
        check_eq!(wc.status, WcStatus::WrFlushErr, "status of {}", wc.wr_id);
        check_eq!(wc.qp_num, qp.qp_num(), "qp_num of {}", wc.wr_id);
    }
    match cq.poll(&mut out) {
        Ok(0) => {}
        Err(e) if e.kind == ErrorKind::InvalidState => {}
        Ok(n) => fail!("overrun CQ yielded {n} more completions: {:?}", &out[..n]),
        Err(e) => fail!("poll after draining an overrun CQ: {e}"),
    }
    Ok(())
}

/// A QP in ERR whose send and receive CQ is `cq` (of `cqe` entries) on channel `ch`.
struct ArmedQp<C: Context> {
    _fx: Fixture<C>,
    ch: C::Channel,
    cq: C::Cq,
    t: TestQp<C>,
}

impl<C: Context> ArmedQp<C> {
    fn new(env: &Env<C>, cqe: u32) -> Result<ArmedQp<C>, Stop> {
        let fx = Fixture::new(env)?;
        let ch = fx.ctx.create_comp_channel()?;
        let cq = fx.ctx.create_cq(cqe, Some(&ch))?;
        let t = fx.qp_on(&cq, &cq, None)?;
        fx.walk(&t.qp, QpState::Err)?;
        Ok(ArmedQp { _fx: fx, ch, cq, t })
    }
}

/// Waits (fd readable, bounded) for the next event on `ch` and returns its CQ handle.
fn next_event<Ch: CompletionChannel>(ch: &Ch) -> Result<u32, Stop> {
    if !fd_readable(ch.as_fd(), WAIT)? {
        return Err(failure(format!("no completion event within {WAIT:?}")));
    }
    match ch.get_cq_event()? {
        Some(h) => Ok(h),
        None => Err(failure("fd readable but get_cq_event returned none")),
    }
}
