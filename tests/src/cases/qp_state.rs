//! Checklist item 4, first half: QP creation per type with capacity limits (pyverbs
//! `test_qp.py`) and the RC state machine with the exact required/optional attribute masks of
//! every transition (rc-transport.md §5.1, the kernel's `qp_state_table`): legal transitions,
//! each required bit missing, each extra bit, illegal transitions, out-of-range values, query
//! after connect, RESET/ERR/SQD effects and async events (§5.3).
//!
//! Expected kinds: a legal transition with a wrong mask or an out-of-range value is
//! `InvalidArgument`; an illegal transition is `InvalidState` or `InvalidArgument` (the
//! contract allows both; libibverbs returns `EINVAL` for each); an unknown mask bit is
//! `NotSupported` (`EOPNOTSUPP`). A failed modify changes nothing: every case re-queries the
//! state, and most then apply the valid attributes to show nothing was half-applied.

use std::collections::HashSet;

use verbs_api::connect::{INIT_MASK, RTR_MASK, RTS_MASK};
use verbs_api::{
    AccessFlags, AsyncEventKind, CompletionQueue, Context, ErrorKind, EventElement, MAX_24BIT, Mtu,
    ProtectionDomain, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, QueuePair,
    SharedReceiveQueue, SrqAttr,
};

use crate::check::{Outcome, Stop, expect_err, expect_kind, expect_post_err};
use crate::fixture::{
    Env, Fixture, TestQp, expect_flushed, expect_only_recv_sentinel, recv_wr, send_wr, wait_async,
    wait_drained,
};
use crate::{check_eq, ensure, fail};

/// Kinds accepted for an illegal transition (the contract: `InvalidArgument`/`InvalidState`).
const ILLEGAL: [ErrorKind; 2] = [ErrorKind::InvalidState, ErrorKind::InvalidArgument];

/// Every defined attribute-mask bit except STATE (always allowed) and RATE_LIMIT (a raw-packet
/// extension that libibverbs sends through another command).
const MASK_BITS: [QpAttrMask; 20] = [
    QpAttrMask::CUR_STATE,
    QpAttrMask::EN_SQD_ASYNC_NOTIFY,
    QpAttrMask::ACCESS_FLAGS,
    QpAttrMask::PKEY_INDEX,
    QpAttrMask::PORT,
    QpAttrMask::QKEY,
    QpAttrMask::AV,
    QpAttrMask::PATH_MTU,
    QpAttrMask::TIMEOUT,
    QpAttrMask::RETRY_CNT,
    QpAttrMask::RNR_RETRY,
    QpAttrMask::RQ_PSN,
    QpAttrMask::MAX_QP_RD_ATOMIC,
    QpAttrMask::ALT_PATH,
    QpAttrMask::MIN_RNR_TIMER,
    QpAttrMask::SQ_PSN,
    QpAttrMask::MAX_DEST_RD_ATOMIC,
    QpAttrMask::PATH_MIG_STATE,
    QpAttrMask::CAP,
    QpAttrMask::DEST_QPN,
];

/// The RC transition table of rc-transport.md §5.1: `(required, optional)` or `None` if the
/// transition is illegal. Written from the spec, independently of any backend.
pub fn rc_transition(from: QpState, to: QpState) -> Option<(QpAttrMask, QpAttrMask)> {
    use QpAttrMask as M;
    use QpState::*;
    let none = M::empty();
    let to_rts_opt =
        M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER;
    Some(match (from, to) {
        (Reset, Reset) => (none, none),
        (Reset, Init) => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        (Init, Init) => (none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        (Init, Rtr) => (
            M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
            M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
        ),
        (Rtr, Rts) => (
            M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
            to_rts_opt,
        ),
        (Rts, Rts) | (Sqd, Rts) => (none, to_rts_opt),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (
            none,
            M::PORT
                | M::AV
                | M::TIMEOUT
                | M::RETRY_CNT
                | M::RNR_RETRY
                | M::MAX_QP_RD_ATOMIC
                | M::MAX_DEST_RD_ATOMIC
                | M::ALT_PATH
                | M::ACCESS_FLAGS
                | M::PKEY_INDEX
                | M::MIN_RNR_TIMER
                | M::PATH_MIG_STATE,
        ),
        (Init | Rtr | Rts | Sqd | Sqe | Err, Reset | Err) => (none, none),
        _ => return None,
    })
}

// ---- creation ---------------------------------------------------------------------------

/// An RC QP is created in RESET and `query` reports at least the requested capacities.
pub fn create_rc_caps_reported<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let d = &fx.dev;
    let cap = QpCap {
        max_send_wr: d.max_qp_wr.min(8),
        max_recv_wr: d.max_qp_wr.min(12),
        max_send_sge: d.max_sge.min(3),
        max_recv_sge: d.max_sge.min(2),
        max_inline_data: d.max_inline_data.min(32),
    };
    let t = fx.qp_with_cap(&cap)?;
    check_eq!(t.qp.qp_type(), QpType::Rc, "qp_type");
    let a = t.qp.query()?;
    check_eq!(a.qp_state, QpState::Reset, "state of a new QP");
    let got = a.cap;
    let pairs = [
        ("max_send_wr", got.max_send_wr, cap.max_send_wr),
        ("max_recv_wr", got.max_recv_wr, cap.max_recv_wr),
        ("max_send_sge", got.max_send_sge, cap.max_send_sge),
        ("max_recv_sge", got.max_recv_sge, cap.max_recv_sge),
        ("max_inline_data", got.max_inline_data, cap.max_inline_data),
    ];
    for (name, got, want) in pairs {
        ensure!(
            got >= want,
            "query reports {name} {got} below the requested {want}"
        );
    }
    Ok(())
}

fn create_rejected<C: Context>(
    env: &Env<C>,
    what: &str,
    tweak: impl Fn(&mut QpCap, u32),
) -> Outcome {
    let fx = Fixture::new(env)?;
    let cq = fx.cq()?;
    let d = &fx.dev;
    let mut cap = fx.cap();
    let limit = match what {
        "max_send_wr" | "max_recv_wr" => d.max_qp_wr,
        "max_send_sge" | "max_recv_sge" => d.max_sge,
        _ => d.max_inline_data,
    };
    let Some(above) = limit.checked_add(1) else {
        return Ok(());
    };
    tweak(&mut cap, above);
    expect_kind(
        fx.ctx
            .create_qp(&fx.pd, &cq, &cq, None, &QpInitAttr::rc(cap)),
        ErrorKind::InvalidArgument,
        &format!("create_qp with {what} = device limit + 1 ({above})"),
    )?;
    // Nothing was created: the CQ is not in use.
    cq.destroy()?;
    Ok(())
}

/// `max_send_wr` above `max_qp_wr` is `InvalidArgument`.
pub fn create_send_wr_above_limit_invalid<C: Context>(env: &Env<C>) -> Outcome {
    create_rejected(env, "max_send_wr", |c, v| c.max_send_wr = v)
}

/// `max_recv_wr` above `max_qp_wr` is `InvalidArgument`.
pub fn create_recv_wr_above_limit_invalid<C: Context>(env: &Env<C>) -> Outcome {
    create_rejected(env, "max_recv_wr", |c, v| c.max_recv_wr = v)
}

/// `max_send_sge` above `max_sge` is `InvalidArgument`.
pub fn create_send_sge_above_limit_invalid<C: Context>(env: &Env<C>) -> Outcome {
    create_rejected(env, "max_send_sge", |c, v| c.max_send_sge = v)
}

/// `max_recv_sge` above `max_sge` is `InvalidArgument`.
pub fn create_recv_sge_above_limit_invalid<C: Context>(env: &Env<C>) -> Outcome {
    create_rejected(env, "max_recv_sge", |c, v| c.max_recv_sge = v)
}

/// `max_inline_data` above the device's is `InvalidArgument` (rxe: `rxe_qp_chk_cap`).
pub fn create_inline_above_limit_invalid<C: Context>(env: &Env<C>) -> Outcome {
    create_rejected(env, "max_inline_data", |c, v| c.max_inline_data = v)
}

fn create_other_type<C: Context>(env: &Env<C>, qp_type: QpType) -> Outcome {
    let fx = Fixture::new(env)?;
    let cq = fx.cq()?;
    let attr = QpInitAttr {
        qp_type,
        cap: fx.cap(),
        sq_sig_all: false,
    };
    match fx.ctx.create_qp(&fx.pd, &cq, &cq, None, &attr) {
        // Hardware (and rxe) supports it: a real QP of that type in RESET.
        Ok(qp) => {
            check_eq!(qp.qp_type(), qp_type, "type of the created QP");
            check_eq!(
                qp.query()?.qp_state,
                QpState::Reset,
                "state of the created QP"
            );
            qp.destroy()?;
        }
        // A backend that does not implement the type says so, and creates nothing.
        Err(e) if e.kind == ErrorKind::NotSupported => {}
        Err(e) => fail!("create {qp_type:?} QP: expected success or NotSupported, got {e}"),
    }
    cq.destroy()?;
    Ok(())
}

/// A UC QP is created in RESET with type UC: every backend has UC (the emulator, rxe, RoCE
/// HCAs), so `NotSupported` is a failure.
pub fn create_uc_in_reset<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let cq = fx.cq()?;
    let attr = QpInitAttr {
        qp_type: QpType::Uc,
        cap: fx.cap(),
        sq_sig_all: false,
    };
    let qp = fx.ctx.create_qp(&fx.pd, &cq, &cq, None, &attr)?;
    check_eq!(qp.qp_type(), QpType::Uc, "type of the created QP");
    check_eq!(
        qp.query()?.qp_state,
        QpState::Reset,
        "state of the created QP"
    );
    qp.destroy()?;
    cq.destroy()?;
    Ok(())
}

/// A UD QP is either created (hardware supports UD) or refused with `NotSupported`.
pub fn create_ud_supported_or_not<C: Context>(env: &Env<C>) -> Outcome {
    create_other_type(env, QpType::Ud)
}

/// QP numbers are distinct 24-bit numbers other than the special QPs 0 and 1.
pub fn qp_numbers_unique_24bit<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let qps = (0..8).map(|_| fx.qp()).collect::<Result<Vec<_>, Stop>>()?;
    let nums: HashSet<u32> = qps.iter().map(|t| t.qpn()).collect();
    check_eq!(nums.len(), qps.len(), "distinct QP numbers");
    for n in nums {
        ensure!(
            (2..=MAX_24BIT).contains(&n),
            "QP number {n:#x} outside 2..=2^24-1"
        );
    }
    Ok(())
}

/// CQs and SRQs of another context (same device, other device) are `InvalidArgument`.
pub fn create_foreign_objects_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let same_dev = env.open(0)?;
    let cq = fx.cq()?;
    let srq = fx.ctx.create_srq(&fx.pd, &srq_attr())?;
    let attr = QpInitAttr::rc(fx.cap());
    let inv = ErrorKind::InvalidArgument;
    for (label, other) in [("same device", &same_dev), ("peer device", &fx.peer_ctx)] {
        let opd = other.alloc_pd()?;
        let ocq = other.create_cq(8, None)?;
        let osrq = other.create_srq(&opd, &srq_attr())?;
        let c = &fx.ctx;
        let what = |s: &str| format!("create_qp with a {s} of another context ({label})");
        expect_kind(
            c.create_qp(&fx.pd, &ocq, &cq, None, &attr),
            inv,
            &what("send CQ"),
        )?;
        expect_kind(
            c.create_qp(&fx.pd, &cq, &ocq, None, &attr),
            inv,
            &what("receive CQ"),
        )?;
        expect_kind(
            c.create_qp(&fx.pd, &cq, &cq, Some(&osrq), &attr),
            inv,
            &what("SRQ"),
        )?;
        osrq.destroy()?;
        ocq.destroy()?;
        opd.destroy()?;
    }
    // None of the rejected calls created a QP that holds our CQ or SRQ.
    srq.destroy()?;
    cq.destroy()?;
    Ok(())
}

/// A destroyed CQ or SRQ passed to `create_qp` is rejected (`Destroyed`, or
/// `InvalidArgument` as the creation contract says).
pub fn create_destroyed_cq_rejected<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let cq = fx.cq()?;
    let dead = fx.cq()?;
    dead.destroy()?;
    let srq = fx.ctx.create_srq(&fx.pd, &srq_attr())?;
    srq.destroy()?;
    let attr = QpInitAttr::rc(fx.cap());
    let kinds = [ErrorKind::Destroyed, ErrorKind::InvalidArgument];
    let c = &fx.ctx;
    expect_err(
        c.create_qp(&fx.pd, &dead, &cq, None, &attr),
        &kinds,
        "destroyed send CQ",
    )?;
    expect_err(
        c.create_qp(&fx.pd, &cq, &dead, None, &attr),
        &kinds,
        "destroyed recv CQ",
    )?;
    expect_err(
        c.create_qp(&fx.pd, &cq, &cq, Some(&srq), &attr),
        &kinds,
        "destroyed SRQ",
    )?;
    cq.destroy()?;
    Ok(())
}

fn srq_attr() -> SrqAttr {
    SrqAttr {
        max_wr: 8,
        max_sge: 1,
        srq_limit: 0,
    }
}

// ---- legal transitions ------------------------------------------------------------------

/// RESET → INIT → RTR → RTS, each with exactly its required mask.
pub fn walk_reset_init_rtr_rts<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp()?;
    let ep = fx.peer_ep;
    for (from, to, mask) in [
        (QpState::Reset, QpState::Init, INIT_MASK),
        (QpState::Init, QpState::Rtr, RTR_MASK),
        (QpState::Rtr, QpState::Rts, RTS_MASK),
    ] {
        check_eq!(t.state()?, from, "state before {from} -> {to}");
        t.qp.modify(&fx.full_attr(to, from, &ep), mask)?;
        check_eq!(t.state()?, to, "state after {from} -> {to}");
    }
    Ok(())
}

/// RESET → RESET with only STATE, and a modify with an empty mask in RESET, succeed.
pub fn reset_to_reset<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp()?;
    let attr = QpAttr::default();
    t.qp.modify(&attr, QpAttrMask::STATE)?;
    check_eq!(t.state()?, QpState::Reset);
    t.qp.modify(&attr, QpAttrMask::empty())?;
    check_eq!(t.state()?, QpState::Reset);
    Ok(())
}

/// INIT → INIT with each optional bit (ACCESS_FLAGS, PKEY_INDEX, PORT) and with none.
pub fn init_to_init_optional<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Init)?;
    let mut attr = fx.full_attr(QpState::Init, QpState::Init, &fx.peer_ep);
    attr.qp_access_flags = AccessFlags::REMOTE_READ;
    t.qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS)?;
    check_eq!(
        t.qp.query()?.qp_access_flags,
        AccessFlags::REMOTE_READ,
        "access after INIT -> INIT"
    );
    t.qp.modify(
        &attr,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT,
    )?;
    t.qp.modify(&attr, QpAttrMask::STATE)?;
    check_eq!(t.state()?, QpState::Init);
    Ok(())
}

/// RTS → RTS with the optional MIN_RNR_TIMER, ACCESS_FLAGS and CUR_STATE.
pub fn rts_to_rts_optional<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Rts)?;
    let mut attr = fx.full_attr(QpState::Rts, QpState::Rts, &fx.peer_ep);
    attr.min_rnr_timer = 5;
    t.qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::MIN_RNR_TIMER)?;
    check_eq!(
        t.qp.query()?.min_rnr_timer,
        5,
        "min_rnr_timer after RTS -> RTS"
    );
    attr.qp_access_flags = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    t.qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS)?;
    check_eq!(
        t.qp.query()?.qp_access_flags,
        attr.qp_access_flags,
        "access after RTS -> RTS"
    );
    t.qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::CUR_STATE)?;
    check_eq!(t.state()?, QpState::Rts);
    Ok(())
}

/// RTS → SQD → RTS (no required bits; CUR_STATE and MIN_RNR_TIMER optional on the way back).
pub fn rts_sqd_rts<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Rts)?;
    let ep = fx.peer_ep;
    t.qp.modify(
        &fx.full_attr(QpState::Sqd, QpState::Rts, &ep),
        QpAttrMask::STATE,
    )?;
    check_eq!(t.state()?, QpState::Sqd);
    wait_drained(&t.qp)?;
    t.qp.modify(
        &fx.full_attr(QpState::Rts, QpState::Sqd, &ep),
        QpAttrMask::STATE | QpAttrMask::CUR_STATE,
    )?;
    check_eq!(t.state()?, QpState::Rts);
    t.qp.modify(
        &fx.full_attr(QpState::Sqd, QpState::Rts, &ep),
        QpAttrMask::STATE,
    )?;
    wait_drained(&t.qp)?;
    let mut back = fx.full_attr(QpState::Rts, QpState::Sqd, &ep);
    back.min_rnr_timer = 3;
    t.qp.modify(&back, QpAttrMask::STATE | QpAttrMask::MIN_RNR_TIMER)?;
    let a = t.qp.query()?;
    check_eq!(a.qp_state, QpState::Rts);
    check_eq!(a.min_rnr_timer, 3, "min_rnr_timer set on SQD -> RTS");
    Ok(())
}

/// SQD → SQD may change path and retry attributes.
pub fn sqd_to_sqd_optional<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Sqd)?;
    let mut attr = fx.full_attr(QpState::Sqd, QpState::Sqd, &fx.peer_ep);
    attr.timeout = 20;
    attr.retry_cnt = 3;
    attr.rnr_retry = 4;
    attr.min_rnr_timer = 9;
    let mask = QpAttrMask::STATE
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MIN_RNR_TIMER;
    t.qp.modify(&attr, mask)?;
    let a = t.qp.query()?;
    check_eq!(a.qp_state, QpState::Sqd);
    check_eq!(
        (a.timeout, a.retry_cnt, a.rnr_retry, a.min_rnr_timer),
        (20, 3, 4, 9),
        "SQD -> SQD"
    );
    t.qp.modify(&attr, QpAttrMask::STATE)?;
    check_eq!(t.state()?, QpState::Sqd);
    Ok(())
}

/// Every reachable state → RESET with only STATE; the QP can then be walked to RTS again.
pub fn any_to_reset<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    for from in [
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Err,
    ] {
        let t = fx.qp_in(from)?;
        t.qp.modify(&QpAttr::default(), QpAttrMask::STATE)?;
        check_eq!(t.state()?, QpState::Reset, "after {from} -> RESET");
        fx.walk(&t.qp, QpState::Rts)?;
    }
    Ok(())
}

/// Every reachable state → ERR with only STATE.
pub fn any_to_err<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    for from in [
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Err,
    ] {
        let t = fx.qp_in(from)?;
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        t.qp.modify(&attr, QpAttrMask::STATE)?;
        check_eq!(t.state()?, QpState::Err, "after {from} -> ERR");
    }
    Ok(())
}

/// Without the STATE bit the target is the current state: RTS → RTS (MIN_RNR_TIMER),
/// INIT → INIT (ACCESS_FLAGS).
pub fn modify_without_state_bit<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let rts = fx.qp_in(QpState::Rts)?;
    let mut attr = fx.full_attr(QpState::Err, QpState::Rts, &fx.peer_ep);
    attr.min_rnr_timer = 7;
    rts.qp.modify(&attr, QpAttrMask::MIN_RNR_TIMER)?;
    let a = rts.qp.query()?;
    check_eq!(
        a.qp_state,
        QpState::Rts,
        "qp_state is ignored without STATE"
    );
    check_eq!(a.min_rnr_timer, 7);
    let init = fx.qp_in(QpState::Init)?;
    attr.qp_access_flags = AccessFlags::REMOTE_READ;
    init.qp.modify(&attr, QpAttrMask::ACCESS_FLAGS)?;
    let a = init.qp.query()?;
    check_eq!(a.qp_state, QpState::Init);
    check_eq!(a.qp_access_flags, AccessFlags::REMOTE_READ);
    Ok(())
}

// ---- masks ------------------------------------------------------------------------------

fn missing_each<C: Context>(env: &Env<C>, from: QpState, to: QpState, mask: QpAttrMask) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(from)?;
    let attr = fx.full_attr(to, from, &fx.peer_ep);
    let before = t.qp.query()?;
    for bit in mask.iter().filter(|b| *b != QpAttrMask::STATE) {
        expect_kind(
            t.qp.modify(&attr, mask - bit),
            ErrorKind::InvalidArgument,
            &format!("{from} -> {to} without required {bit:?}"),
        )?;
        check_eq!(
            t.qp.query()?,
            before,
            "attributes after {from} -> {to} without {bit:?}"
        );
    }
    t.qp.modify(&attr, mask)?;
    check_eq!(t.state()?, to, "the complete mask still works");
    Ok(())
}

/// RESET → INIT without each of PKEY_INDEX, PORT, ACCESS_FLAGS: `InvalidArgument`, unchanged.
pub fn reset_to_init_missing_each_required<C: Context>(env: &Env<C>) -> Outcome {
    missing_each(env, QpState::Reset, QpState::Init, INIT_MASK)
}

/// INIT → RTR without each of AV, PATH_MTU, DEST_QPN, RQ_PSN, MAX_DEST_RD_ATOMIC,
/// MIN_RNR_TIMER: `InvalidArgument`, unchanged.
pub fn init_to_rtr_missing_each_required<C: Context>(env: &Env<C>) -> Outcome {
    missing_each(env, QpState::Init, QpState::Rtr, RTR_MASK)
}

/// RTR → RTS without each of TIMEOUT, RETRY_CNT, RNR_RETRY, SQ_PSN, MAX_QP_RD_ATOMIC:
/// `InvalidArgument`, unchanged.
pub fn rtr_to_rts_missing_each_required<C: Context>(env: &Env<C>) -> Outcome {
    missing_each(env, QpState::Rtr, QpState::Rts, RTS_MASK)
}

fn extra_bits<C: Context>(
    fx: &Fixture<C>,
    t: &TestQp<C>,
    to: QpState,
    base: QpAttrMask,
) -> Outcome {
    let from = t.state()?;
    let Some((req, opt)) = rc_transition(from, to) else {
        fail!("{from} -> {to} is not a legal transition");
    };
    let before = t.qp.query()?;
    let mut attr = fx.full_attr(to, from, &fx.peer_ep);
    attr.cap = before.cap;
    for bit in MASK_BITS {
        if req.contains(bit) || opt.contains(bit) {
            continue;
        }
        expect_kind(
            t.qp.modify(&attr, base | bit),
            ErrorKind::InvalidArgument,
            &format!("{from} -> {to} with the extra bit {bit:?}"),
        )?;
        check_eq!(
            t.qp.query()?,
            before,
            "attributes after {from} -> {to} with {bit:?}"
        );
    }
    Ok(())
}

/// RESET → INIT with any bit besides its three (DEST_QPN, SQ_PSN, AV, CUR_STATE, …):
/// `InvalidArgument`, unchanged.
pub fn reset_to_init_extra_bits_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp()?;
    extra_bits(&fx, &t, QpState::Init, INIT_MASK)
}

/// INIT → RTR with any non-optional extra bit (SQ_PSN, TIMEOUT, PORT, …): `InvalidArgument`.
pub fn init_to_rtr_extra_bits_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Init)?;
    extra_bits(&fx, &t, QpState::Rtr, RTR_MASK)
}

/// RTR → RTS with any non-optional extra bit (RQ_PSN, DEST_QPN, AV, …): `InvalidArgument`.
pub fn rtr_to_rts_extra_bits_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Rtr)?;
    extra_bits(&fx, &t, QpState::Rts, RTS_MASK)
}

/// RTS → SQD with any bit but EN_SQD_ASYNC_NOTIFY: `InvalidArgument`.
pub fn rts_to_sqd_extra_bits_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Rts)?;
    extra_bits(&fx, &t, QpState::Sqd, QpAttrMask::STATE)
}

/// RTS → RESET and RTS → ERR accept no attribute bit at all.
pub fn to_reset_and_err_extra_bits_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Rts)?;
    extra_bits(&fx, &t, QpState::Reset, QpAttrMask::STATE)?;
    extra_bits(&fx, &t, QpState::Err, QpAttrMask::STATE)
}

/// The mask a transition to `to` would carry from its usual predecessor.
fn natural_mask(to: QpState) -> QpAttrMask {
    match to {
        QpState::Init => INIT_MASK,
        QpState::Rtr => RTR_MASK,
        QpState::Rts => RTS_MASK,
        _ => QpAttrMask::STATE,
    }
}

fn illegal_from<C: Context>(env: &Env<C>, from: QpState) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(from)?;
    let before = t.qp.query()?;
    let mut tried = 0;
    for to in QpState::ALL {
        if rc_transition(from, to).is_some() {
            continue;
        }
        for mask in [QpAttrMask::STATE, natural_mask(to)] {
            expect_err(
                t.qp.modify(&fx.full_attr(to, from, &fx.peer_ep), mask),
                &ILLEGAL,
                &format!("illegal {from} -> {to} with {mask:?}"),
            )?;
            check_eq!(
                t.qp.query()?,
                before,
                "attributes after illegal {from} -> {to}"
            );
            tried += 1;
        }
    }
    ensure!(tried > 0, "no illegal transition from {from}");
    Ok(())
}

/// From RESET: RTR, RTS, SQD, SQE and ERR are illegal (RESET → ERR too, in current kernels).
pub fn illegal_from_reset<C: Context>(env: &Env<C>) -> Outcome {
    illegal_from(env, QpState::Reset)
}

/// From INIT: RTS, SQD and SQE are illegal.
pub fn illegal_from_init<C: Context>(env: &Env<C>) -> Outcome {
    illegal_from(env, QpState::Init)
}

/// From RTR: INIT, RTR, SQD and SQE are illegal.
pub fn illegal_from_rtr<C: Context>(env: &Env<C>) -> Outcome {
    illegal_from(env, QpState::Rtr)
}

/// From RTS: INIT, RTR and SQE (an RC QP never enters SQE) are illegal.
pub fn illegal_from_rts<C: Context>(env: &Env<C>) -> Outcome {
    illegal_from(env, QpState::Rts)
}

/// From SQD: INIT, RTR and SQE are illegal.
pub fn illegal_from_sqd<C: Context>(env: &Env<C>) -> Outcome {
    illegal_from(env, QpState::Sqd)
}

/// From ERR: INIT, RTR, RTS, SQD and SQE are illegal (only RESET and ERR).
pub fn illegal_from_err<C: Context>(env: &Env<C>) -> Outcome {
    illegal_from(env, QpState::Err)
}

/// A mask bit libibverbs does not define is `NotSupported` (`EOPNOTSUPP`), unchanged.
pub fn unknown_mask_bit_not_supported<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp()?;
    let attr = fx.full_attr(QpState::Init, QpState::Reset, &fx.peer_ep);
    expect_kind(
        t.qp.modify(&attr, INIT_MASK | QpAttrMask::from_bits_retain(1 << 30)),
        ErrorKind::NotSupported,
        "RESET -> INIT with mask bit 30",
    )?;
    check_eq!(t.state()?, QpState::Reset);
    Ok(())
}

// ---- values -----------------------------------------------------------------------------

/// Walks a fresh QP to `from`, expects `from -> to` with `mask` and the tweaked attributes to
/// fail with `InvalidArgument` leaving the state, then applies the valid attributes.
fn value_rejected<C: Context>(
    fx: &Fixture<C>,
    from: QpState,
    to: QpState,
    mask: QpAttrMask,
    what: &str,
    tweak: impl Fn(&mut QpAttr),
) -> Outcome {
    let t = fx.qp_in(from)?;
    let good = fx.full_attr(to, from, &fx.peer_ep);
    let mut bad = good;
    tweak(&mut bad);
    let before = t.qp.query()?;
    expect_kind(
        t.qp.modify(&bad, mask),
        ErrorKind::InvalidArgument,
        &format!("{from} -> {to} with {what}"),
    )?;
    check_eq!(
        t.qp.query()?,
        before,
        "attributes after {from} -> {to} with {what}"
    );
    t.qp.modify(&good, mask)?;
    check_eq!(t.state()?, to, "valid attributes after the rejected {what}");
    Ok(())
}

/// `timeout` above 31 is `InvalidArgument` (rxe checks it).
pub fn timeout_out_of_range<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    for v in [32, u8::MAX] {
        value_rejected(
            &fx,
            QpState::Rtr,
            QpState::Rts,
            RTS_MASK,
            &format!("timeout {v}"),
            |a| a.timeout = v,
        )?;
    }
    Ok(())
}

/// `retry_cnt` above 7 is `InvalidArgument` (a 3-bit field; the `verbs_api` contract).
pub fn retry_cnt_out_of_range<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    value_rejected(
        &fx,
        QpState::Rtr,
        QpState::Rts,
        RTS_MASK,
        "retry_cnt 8",
        |a| a.retry_cnt = 8,
    )
}

/// `rnr_retry` above 7 is `InvalidArgument` (a 3-bit field; the `verbs_api` contract).
pub fn rnr_retry_out_of_range<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    value_rejected(
        &fx,
        QpState::Rtr,
        QpState::Rts,
        RTS_MASK,
        "rnr_retry 8",
        |a| a.rnr_retry = 8,
    )
}

/// `min_rnr_timer` above 31 is `InvalidArgument` on INIT → RTR and RTS → RTS; the old value
/// stays.
pub fn min_rnr_timer_out_of_range<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    value_rejected(
        &fx,
        QpState::Init,
        QpState::Rtr,
        RTR_MASK,
        "min_rnr_timer 32",
        |a| a.min_rnr_timer = 32,
    )?;
    let t = fx.qp_in(QpState::Rts)?;
    let before = t.qp.query()?.min_rnr_timer;
    let mut attr = fx.full_attr(QpState::Rts, QpState::Rts, &fx.peer_ep);
    attr.min_rnr_timer = 32;
    expect_kind(
        t.qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::MIN_RNR_TIMER),
        ErrorKind::InvalidArgument,
        "RTS -> RTS with min_rnr_timer 32",
    )?;
    check_eq!(
        t.qp.query()?.min_rnr_timer,
        before,
        "min_rnr_timer after the rejected modify"
    );
    Ok(())
}

/// `rq_psn` and `sq_psn` must be 24-bit: `InvalidArgument` (the contract; the kernel masks).
pub fn psn_out_of_range<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    for v in [MAX_24BIT + 1, u32::MAX] {
        value_rejected(
            &fx,
            QpState::Init,
            QpState::Rtr,
            RTR_MASK,
            &format!("rq_psn {v:#x}"),
            |a| a.rq_psn = v,
        )?;
        value_rejected(
            &fx,
            QpState::Rtr,
            QpState::Rts,
            RTS_MASK,
            &format!("sq_psn {v:#x}"),
            |a| a.sq_psn = v,
        )?;
    }
    Ok(())
}

/// `dest_qp_num` must be 24-bit: `InvalidArgument`.
pub fn dest_qpn_out_of_range<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    value_rejected(
        &fx,
        QpState::Init,
        QpState::Rtr,
        RTR_MASK,
        "dest_qp_num 2^24",
        |a| a.dest_qp_num = MAX_24BIT + 1,
    )
}

/// `path_mtu` up to the port's `max_mtu` is accepted (even above `active_mtu`, as rxe does);
/// above `max_mtu` (when the enum can say so) is `InvalidArgument`.
pub fn path_mtu_bounded_by_max_mtu<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let max = fx.port.max_mtu;
    let t = fx.qp_in(QpState::Init)?;
    let mut attr = fx.full_attr(QpState::Rtr, QpState::Init, &fx.peer_ep);
    attr.path_mtu = max;
    t.qp.modify(&attr, RTR_MASK)?;
    check_eq!(t.qp.query()?.path_mtu, max, "path_mtu = max_mtu accepted");
    if let Some(above) = Mtu::from_raw(max as u8 + 1) {
        value_rejected(
            &fx,
            QpState::Init,
            QpState::Rtr,
            RTR_MASK,
            "path_mtu above max_mtu",
            |a| a.path_mtu = above,
        )?;
    }
    Ok(())
}

/// A port that does not exist (0, `phys_port_cnt + 1`) is `InvalidArgument`.
pub fn port_out_of_range<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let beyond = fx.dev.phys_port_cnt.saturating_add(1);
    for port in [0, beyond] {
        value_rejected(
            &fx,
            QpState::Reset,
            QpState::Init,
            INIT_MASK,
            &format!("port {port}"),
            |a| a.port_num = port,
        )?;
    }
    Ok(())
}

/// A P_Key index at or above `pkey_tbl_len` is `InvalidArgument`.
pub fn pkey_index_out_of_range<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let len = fx.port.pkey_tbl_len;
    value_rejected(
        &fx,
        QpState::Reset,
        QpState::Init,
        INIT_MASK,
        &format!("pkey_index {len}"),
        |a| a.pkey_index = len,
    )
}

/// `max_rd_atomic` above the device's `max_qp_init_rd_atom` is `InvalidArgument` (rxe checks
/// it); the maximum itself is accepted.
pub fn max_rd_atomic_above_device_max<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let max = fx.dev.max_qp_init_rd_atom;
    if let Ok(at) = u8::try_from(max) {
        let t = fx.qp_in(QpState::Rtr)?;
        let mut attr = fx.full_attr(QpState::Rts, QpState::Rtr, &fx.peer_ep);
        attr.max_rd_atomic = at;
        t.qp.modify(&attr, RTS_MASK)?;
    }
    if let Some(above) = max.checked_add(1).and_then(|v| u8::try_from(v).ok()) {
        value_rejected(
            &fx,
            QpState::Rtr,
            QpState::Rts,
            RTS_MASK,
            "max_rd_atomic above max",
            |a| a.max_rd_atomic = above,
        )?;
    }
    Ok(())
}

/// `max_dest_rd_atomic` above the device's `max_qp_rd_atom` is `InvalidArgument`.
pub fn max_dest_rd_atomic_above_device_max<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let max = fx.dev.max_qp_rd_atom;
    if let Some(above) = max.checked_add(1).and_then(|v| u8::try_from(v).ok()) {
        value_rejected(
            &fx,
            QpState::Init,
            QpState::Rtr,
            RTR_MASK,
            "max_dest_rd_atomic above max",
            |a| a.max_dest_rd_atomic = above,
        )?;
    }
    Ok(())
}

/// CUR_STATE naming a state the QP is not in fails (`InvalidArgument`/`InvalidState`: rxe
/// then looks up an illegal transition from the claimed state); the true state is accepted.
pub fn cur_state_mismatch_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let ep = fx.peer_ep;
    let rts = fx.qp_in(QpState::Rts)?;
    for wrong in [QpState::Reset, QpState::Init] {
        expect_err(
            rts.qp.modify(
                &fx.full_attr(QpState::Rts, wrong, &ep),
                QpAttrMask::STATE | QpAttrMask::CUR_STATE,
            ),
            &ILLEGAL,
            &format!("RTS -> RTS claiming cur_qp_state {wrong}"),
        )?;
        check_eq!(rts.state()?, QpState::Rts);
    }
    rts.qp.modify(
        &fx.full_attr(QpState::Rts, QpState::Rts, &ep),
        QpAttrMask::STATE | QpAttrMask::CUR_STATE,
    )?;
    let rtr = fx.qp_in(QpState::Rtr)?;
    expect_err(
        rtr.qp.modify(
            &fx.full_attr(QpState::Rts, QpState::Reset, &ep),
            RTS_MASK | QpAttrMask::CUR_STATE,
        ),
        &ILLEGAL,
        "RTR -> RTS claiming cur_qp_state RESET",
    )?;
    check_eq!(rtr.state()?, QpState::Rtr);
    rtr.qp.modify(
        &fx.full_attr(QpState::Rts, QpState::Rtr, &ep),
        RTS_MASK | QpAttrMask::CUR_STATE,
    )?;
    check_eq!(rtr.state()?, QpState::Rts);
    Ok(())
}

// ---- effects ----------------------------------------------------------------------------

/// After `connect_rc` on both sides, `query` reports what was set: peer QPN and PSN, own PSN,
/// path MTU, timers, retry counts, atomics depth, access, address vector.
pub fn query_after_connect<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let (a, b, a_psn, b_psn) = fx.connect_pair()?;
    let opts = fx.connect_options();
    let a_gid = fx.ctx.query_gid(1, 0)?;
    let b_gid = fx.peer_ctx.query_gid(1, 0)?;
    for (me, peer, my_psn, peer_psn, peer_gid) in
        [(&a, &b, a_psn, b_psn, b_gid), (&b, &a, b_psn, a_psn, a_gid)]
    {
        let q = me.qp.query()?;
        let who = format!("QP {:#x}", me.qpn());
        check_eq!(q.qp_state, QpState::Rts, "{who} state");
        check_eq!(q.dest_qp_num, peer.qpn(), "{who} dest_qp_num");
        check_eq!(q.rq_psn, peer_psn, "{who} rq_psn");
        check_eq!(q.sq_psn, my_psn, "{who} sq_psn");
        check_eq!(q.path_mtu, opts.path_mtu, "{who} path_mtu");
        check_eq!(q.timeout, opts.timeout, "{who} timeout");
        check_eq!(q.retry_cnt, opts.retry_cnt, "{who} retry_cnt");
        check_eq!(q.rnr_retry, opts.rnr_retry, "{who} rnr_retry");
        check_eq!(q.min_rnr_timer, opts.min_rnr_timer, "{who} min_rnr_timer");
        check_eq!(q.max_rd_atomic, opts.max_rd_atomic, "{who} max_rd_atomic");
        check_eq!(
            q.max_dest_rd_atomic,
            opts.max_dest_rd_atomic,
            "{who} max_dest_rd_atomic"
        );
        check_eq!(q.qp_access_flags, opts.access, "{who} qp_access_flags");
        check_eq!(q.port_num, opts.port_num, "{who} port_num");
        check_eq!(q.ah_attr.dgid, peer_gid, "{who} ah_attr.dgid");
    }
    Ok(())
}

/// Entering RESET empties the queues: receives posted in INIT are gone (no completion when the
/// QP later enters ERR).
pub fn reset_clears_queues<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Init)?;
    t.qp.post_recv(&[recv_wr(1), recv_wr(2), recv_wr(3)])?;
    t.qp.modify(&QpAttr::default(), QpAttrMask::STATE)?;
    check_eq!(t.state()?, QpState::Reset);
    fx.walk(&t.qp, QpState::Err)?;
    expect_only_recv_sentinel(&t, 99)
}

/// RTS → SQD with EN_SQD_ASYNC_NOTIFY raises `SQ_DRAINED` for that QP once drained (§5.3).
pub fn sqd_async_notify_raises_sq_drained<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Rts)?;
    let mut attr = fx.full_attr(QpState::Sqd, QpState::Rts, &fx.peer_ep);
    attr.en_sqd_async_notify = true;
    t.qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY)?;
    let qpn = t.qpn();
    wait_async(&fx.ctx, "SQ_DRAINED", |e| {
        e.kind == AsyncEventKind::SqDrained && e.element == EventElement::Qp(qpn)
    })?;
    check_eq!(t.state()?, QpState::Sqd);
    Ok(())
}

/// Async events go to the context that owns the object (`ibv_get_async_event` is per
/// context): another context of the same device does not see the QP's `SQ_DRAINED`.
pub fn async_event_scoped_to_context<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let other = env.open(0)?;
    let t = fx.qp_in(QpState::Rts)?;
    let qpn = t.qpn();
    let mut attr = fx.full_attr(QpState::Sqd, QpState::Rts, &fx.peer_ep);
    attr.en_sqd_async_notify = true;
    t.qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY)?;
    while let Some(e) = other.poll_async_event() {
        ensure!(
            e.element != EventElement::Qp(qpn),
            "another context of the device received {e} for QP {qpn:#x}"
        );
    }
    wait_async(&fx.ctx, "SQ_DRAINED", |e| {
        e.kind == AsyncEventKind::SqDrained && e.element == EventElement::Qp(qpn)
    })?;
    Ok(())
}

/// Every call on a destroyed QP fails with `Destroyed` (posts at index 0).
pub fn destroyed_qp_calls_fail<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let t = fx.qp_in(QpState::Rts)?;
    let clone = t.qp.clone();
    t.qp.destroy()?;
    let d = ErrorKind::Destroyed;
    expect_kind(clone.query(), d, "query after destroy")?;
    expect_kind(
        clone.modify(&QpAttr::default(), QpAttrMask::STATE),
        d,
        "modify after destroy",
    )?;
    expect_post_err(
        clone.post_send(&[send_wr(1)]),
        0,
        &[d],
        "post_send after destroy",
    )?;
    expect_post_err(
        clone.post_recv(&[recv_wr(1)]),
        0,
        &[d],
        "post_recv after destroy",
    )?;
    expect_kind(clone.endpoint(0), d, "endpoint after destroy")?;
    expect_kind(t.qp.destroy(), d, "second destroy")?;
    // The QP released its CQs.
    t.send_cq.destroy()?;
    t.recv_cq.destroy()?;
    Ok(())
}

/// Destroying a QP discards its queued work without completions.
pub fn destroy_discards_work<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let scq = fx.cq()?;
    let rcq = fx.cq()?;
    let a = fx.qp_on(&scq, &rcq, None)?;
    fx.walk(&a.qp, QpState::Init)?;
    a.qp.post_recv(&[recv_wr(1), recv_wr(2), recv_wr(3)])?;
    a.qp.destroy()?;
    // A second QP on the same CQ: its flush is the only completion there.
    let b = fx.qp_on(&scq, &rcq, None)?;
    fx.walk(&b.qp, QpState::Err)?;
    b.qp.post_recv(&[recv_wr(99)])?;
    expect_flushed(&rcq, &[99], b.qpn())?;
    let mut out = [verbs_api::WorkCompletion::default(); 1];
    check_eq!(scq.poll(&mut out)?, 0, "send CQ");
    Ok(())
}
