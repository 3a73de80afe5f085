//! Checklist item 5, third part: atomics (pyverbs `test_atomic.py`), rc-transport.md §4.3,
//! §4.4, §4.6: fetch-and-add and compare-and-swap results and memory, atomicity across two
//! QPs, and the access errors (MR without REMOTE_ATOMIC, QP without REMOTE_ATOMIC, invalid
//! rkey, invalid local lkey).
//!
//! The misaligned-address case is a post-time `InvalidArgument` (`posting::
//! atomic_misaligned_invalid`); the remote NAK for it (§4.3) cannot be provoked through the API.
//! Every case skips when the device reports `atomic_cap` NONE. Words are host-order u64
//! (§4.6).

use verbs_api::{
    AccessFlags, AtomicCap, Context, MemoryRegion, QueuePair, SendFlags, SendOp, SendWr, WcOpcode,
    WcStatus,
};

use crate::check::{Outcome, Stop};
use crate::check_eq;
use crate::fixture::{Env, Pair, check_success, poll_exact};

fn atomic_pair<C: Context>(
    env: &Env<C>,
    tune: impl FnOnce(&mut crate::PairConfig),
) -> Result<Pair<C>, Stop> {
    let p = Pair::with(env, tune)?;
    if p.a.dev.atomic_cap == AtomicCap::None || p.b.dev.atomic_cap == AtomicCap::None {
        return Err(Stop::Skip("device reports atomic_cap NONE".into()));
    }
    Ok(p)
}

/// Fetch-and-add returns the original word into the local 8-byte SGE and adds, wrapping at
/// 2^64; the send WC is `FETCH_ADD` with `byte_len` 8.
pub fn fetch_add<C: Context>(env: &Env<C>) -> Outcome {
    let p = atomic_pair(env, |_| {})?;
    p.b.set_word(64, 40)?;
    let res = [p.a.sge(8, 8)?];
    p.a.qp
        .post_send(&[SendWr::new(1, p.b.faa_op(64, 2), &res)])?;
    p.a.expect_send(1, WcOpcode::FetchAdd, 8)?;
    check_eq!(p.a.word(8)?, 40, "original value returned");
    check_eq!(p.b.word(64)?, 42, "memory after +2");
    p.a.qp
        .post_send(&[SendWr::new(2, p.b.faa_op(64, u64::MAX), &res)])?;
    p.a.expect_send(2, WcOpcode::FetchAdd, 8)?;
    check_eq!(p.a.word(8)?, 42, "original value returned");
    check_eq!(p.b.word(64)?, 41, "memory after adding 2^64 - 1 (wraps)");
    check_eq!(p.b.word(56)?, 0, "word before the target");
    check_eq!(p.b.word(72)?, 0, "word after the target");
    Ok(())
}

/// Compare-and-swap with a matching compare value stores the swap value and returns the
/// original; the send WC is `COMP_SWAP` with `byte_len` 8.
pub fn cmp_swap_success<C: Context>(env: &Env<C>) -> Outcome {
    let p = atomic_pair(env, |_| {})?;
    p.b.set_word(128, 0x1111_2222_3333_4444)?;
    let res = [p.a.sge(0, 8)?];
    let op =
        p.b.cas_op(128, 0x1111_2222_3333_4444, 0xAAAA_BBBB_CCCC_DDDD);
    p.a.qp.post_send(&[SendWr::new(1, op, &res)])?;
    p.a.expect_send(1, WcOpcode::CompSwap, 8)?;
    check_eq!(
        p.a.word(0)?,
        0x1111_2222_3333_4444,
        "original value returned"
    );
    check_eq!(
        p.b.word(128)?,
        0xAAAA_BBBB_CCCC_DDDD,
        "memory after the swap"
    );
    Ok(())
}

/// Compare-and-swap with a different compare value leaves memory unchanged and still returns
/// the original word, successfully.
pub fn cmp_swap_failure<C: Context>(env: &Env<C>) -> Outcome {
    let p = atomic_pair(env, |_| {})?;
    p.b.set_word(128, 5)?;
    p.a.set_word(0, 0xFFFF)?;
    let res = [p.a.sge(0, 8)?];
    p.a.qp
        .post_send(&[SendWr::new(1, p.b.cas_op(128, 6, 7), &res)])?;
    p.a.expect_send(1, WcOpcode::CompSwap, 8)?;
    check_eq!(p.a.word(0)?, 5, "original value returned");
    check_eq!(p.b.word(128)?, 5, "memory after a failed compare");
    Ok(())
}

/// Fetch-and-adds from two QPs on one counter are atomic: 2 × 2 batches of 32 FAAs, one QP
/// adding 1 and the other 2^32, leave exactly 64 + 64 × 2^32, and each QP's returned
/// originals count its own previous additions in order (0, 1, 2, … in its half of the word).
pub fn fetch_add_two_qps_sum<C: Context>(env: &Env<C>) -> Outcome {
    const BATCH: usize = 32;
    let dev = env.open(0)?.query_device()?;
    if (dev.max_qp_wr as usize) < BATCH || dev.max_cqe < 2 * BATCH as u32 {
        return Err(Stop::Skip(format!("needs {BATCH} WRs per queue")));
    }
    let p = atomic_pair(env, |c| {
        c.cap.max_send_wr = BATCH as u32;
        c.cqe = 2 * BATCH as u32;
    })?;
    let (qa2, _qb2) = p.connect_another()?;
    let counter = 0usize;
    let mut seen = [Vec::new(), Vec::new()];
    for round in 0..2 {
        let slots: Vec<_> = (0..2 * BATCH)
            .map(|i| p.a.sge(4096 + i * 8, 8))
            .collect::<Result<_, _>>()?;
        let mut wrs = [Vec::new(), Vec::new()];
        for (i, slot) in slots.iter().enumerate() {
            let (q, add) = if i < BATCH { (0, 1) } else { (1, 1u64 << 32) };
            let id = (round * 2 * BATCH + i) as u64;
            wrs[q].push(SendWr::new(
                id,
                p.b.faa_op(counter, add),
                std::slice::from_ref(slot),
            ));
        }
        p.a.qp.post_send(&wrs[0])?;
        qa2.post_send(&wrs[1])?;
        let wcs = poll_exact(&p.a.send_cq, 2 * BATCH)?;
        let mut order = [Vec::new(), Vec::new()];
        for wc in &wcs {
            let i = (wc.wr_id as usize) % (2 * BATCH);
            let (q, qpn) = if i < BATCH {
                (0, p.a.qpn())
            } else {
                (1, qa2.qp_num())
            };
            check_success(wc, wc.wr_id, WcOpcode::FetchAdd, 8, qpn)?;
            order[q].push(wc.wr_id);
            seen[q].push(p.a.word(4096 + i * 8)?);
        }
        for (q, ids) in order.iter().enumerate() {
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            check_eq!(ids, &sorted, "completion order of QP {q}");
        }
    }
    let n = 2 * BATCH as u64;
    check_eq!(p.b.word(counter)?, n + (n << 32), "counter after all FAAs");
    let low: Vec<u64> = seen[0].iter().map(|v| v & 0xFFFF_FFFF).collect();
    let high: Vec<u64> = seen[1].iter().map(|v| v >> 32).collect();
    check_eq!(
        low,
        (0..n).collect::<Vec<_>>(),
        "QP 1's originals (low half)"
    );
    check_eq!(
        high,
        (0..n).collect::<Vec<_>>(),
        "QP 2's originals (high half)"
    );
    Ok(())
}

/// A fetch-and-add on a peer MR registered without REMOTE_ATOMIC is `REM_ACCESS_ERR` (§4.4);
/// the word is unchanged; both QPs enter ERR and the rest flushes.
pub fn mr_without_remote_atomic<C: Context>(env: &Env<C>) -> Outcome {
    let p = atomic_pair(env, |_| {})?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = p.b.ctx.alloc_mr(&p.b.pd, 64, access)?;
    mr.write(0, &9u64.to_ne_bytes())?;
    let op = SendOp::AtomicFetchAndAdd {
        remote_addr: mr.addr(),
        rkey: mr.rkey(),
        add: 1,
    };
    let res = [p.a.sge(64, 8)?];
    p.expect_fatal_error(op, &res, SendFlags::SIGNALED, WcStatus::RemAccessErr, true)?;
    let mut word = [0u8; 8];
    mr.read(0, &mut word)?;
    check_eq!(
        u64::from_ne_bytes(word),
        9,
        "word of the MR without REMOTE_ATOMIC"
    );
    Ok(())
}

/// A fetch-and-add to a QP whose access flags lack REMOTE_ATOMIC is `REM_INV_REQ_ERR` (NAK
/// 0x61, not a remote access error, §4.3); the word is unchanged; both QPs enter ERR.
pub fn qp_without_remote_atomic<C: Context>(env: &Env<C>) -> Outcome {
    let p = atomic_pair(env, |c| {
        c.opts_b.access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    })?;
    p.b.set_word(0, 9)?;
    let res = [p.a.sge(64, 8)?];
    p.expect_fatal_error(
        p.b.faa_op(0, 1),
        &res,
        SendFlags::SIGNALED,
        WcStatus::RemInvReqErr,
        true,
    )?;
    check_eq!(p.b.word(0)?, 9, "word behind a QP without REMOTE_ATOMIC");
    Ok(())
}

/// A compare-and-swap with an invalid rkey is `REM_ACCESS_ERR` (§4.4); memory unchanged.
pub fn invalid_rkey<C: Context>(env: &Env<C>) -> Outcome {
    let p = atomic_pair(env, |_| {})?;
    p.b.set_word(0, 3)?;
    let op = SendOp::AtomicCmpAndSwp {
        remote_addr: p.b.addr(0),
        rkey: p.b.mr.rkey() ^ 0x80,
        compare: 3,
        swap: 4,
    };
    let res = [p.a.sge(64, 8)?];
    p.expect_fatal_error(op, &res, SendFlags::SIGNALED, WcStatus::RemAccessErr, true)?;
    check_eq!(p.b.word(0)?, 3, "word after a CAS with a bad rkey");
    Ok(())
}

/// A fetch-and-add whose local 8-byte SGE has an invalid lkey is `LOC_PROT_ERR` (§3.9: a bad
/// local SGE for atomic response data is `LOC_PROT_ERR`, in rxe too); the requester enters
/// ERR, the responder stays in RTS. Whether the peer's word changed is not checked: rxe
/// executes the atomic and fails when placing the response.
pub fn invalid_lkey<C: Context>(env: &Env<C>) -> Outcome {
    let p = atomic_pair(env, |_| {})?;
    let mut res = p.a.sge(64, 8)?;
    res.lkey ^= 0x80;
    p.expect_fatal_error(
        p.b.faa_op(0, 1),
        &[res],
        SendFlags::SIGNALED,
        WcStatus::LocProtErr,
        false,
    )
}
