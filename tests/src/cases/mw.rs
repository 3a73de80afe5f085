//! Issue 23 item 1: memory windows of type 1 and type 2 (IBTA §10.6.7; rdma-core's
//! `ibv_alloc_mw(3)`, `ibv_bind_mw(3)`, `IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV`,
//! `IBV_WR_SEND_WITH_INV`; pyverbs `test_mr.py` MWTest): allocation and lifetime, binds and
//! their errors (`MW_BIND_ERR`), remote access through a window checked like an MR access
//! (R_Key, range, rights — which may be narrower than the MR's), local and remote invalidation,
//! deallocation while bound, and deregistration of an MR with bound windows.
//!
//! Side `b` owns the windows (its MR allows MW_BIND); side `a` accesses them. Rules follow IBTA
//! and rxe: a window's remote write or atomic rights need the MR's LOCAL_WRITE, not its remote
//! rights; a failed bind completes with `MW_BIND_ERR`, a failed LOCAL_INV with `LOC_QP_OP_ERR`;
//! an MR with bound windows cannot be deregistered (the emulator answers `Busy`, rxe `EINVAL`).

use verbs_api::{
    AccessFlags, CompletionQueue, Context, DeviceCapFlags, ErrorKind, MemoryRegion, MemoryWindow,
    MwBind, MwType, ProtectionDomain, QueuePair, SendFlags, SendOp, SendWr, WcFlags, WcOpcode,
    WcStatus, WorkCompletion, inc_rkey,
};

use crate::check::{Outcome, Stop, expect_err, expect_kind, failure};
use crate::check_eq;
use crate::fixture::{Env, Pair, Side, all_remote, check_bytes, check_status, pattern, poll_one};

/// Where windows start in `b`'s MR, and how long they are.
const WIN_OFF: usize = 1024;
const WIN_LEN: usize = 512;

/// A pair whose MRs also allow MW_BIND; skipped on a device without windows of `mw_type`.
fn mw_pair<C: Context>(env: &Env<C>, mw_type: MwType) -> Result<Pair<C>, Stop> {
    let p = Pair::with(env, |c| c.mr_access = all_remote() | AccessFlags::MW_BIND)?;
    let flags = p.b.dev.device_cap_flags;
    let has = match mw_type {
        MwType::Type1 => flags.contains(DeviceCapFlags::MEM_WINDOW),
        MwType::Type2 => flags
            .intersects(DeviceCapFlags::MEM_WINDOW_TYPE_2A | DeviceCapFlags::MEM_WINDOW_TYPE_2B),
    };
    if !has || p.b.dev.max_mw == 0 {
        return Err(Stop::Skip(format!("the device has no {mw_type:?} windows")));
    }
    Ok(p)
}

/// One completion from `b`'s send CQ: `wr_id`, success and `opcode` (a local operation's
/// `byte_len` is not compared: IBTA leaves it undefined).
fn expect_local<C: Context>(s: &Side<C>, wr_id: u64, opcode: WcOpcode) -> Outcome {
    let wc = poll_one(&s.send_cq)?;
    check_status(&wc, wr_id, WcStatus::Success, s.qpn())?;
    check_eq!(wc.opcode, opcode, "opcode of {wc:?}");
    Ok(())
}

/// The BIND_MW operation binding `mw` to `len` bytes at `off` of `s`'s MR under `rkey`.
fn bind_op<C: Context>(
    s: &Side<C>,
    mw: &C::Mw,
    rkey: u32,
    off: usize,
    len: usize,
    access: AccessFlags,
) -> SendOp {
    SendOp::BindMw {
        mw: mw.handle(),
        rkey,
        mr: s.mr.lkey(),
        addr: s.addr(off),
        length: len as u64,
        access,
    }
}

/// Binds type 2 window `mw` of `b` to `WIN_LEN` bytes at `WIN_OFF` of its MR with `access`;
/// returns the window's new R_Key.
fn bind2<C: Context>(b: &Side<C>, mw: &C::Mw, access: AccessFlags) -> Result<u32, Stop> {
    let rkey = inc_rkey(mw.rkey());
    let op = bind_op(b, mw, rkey, WIN_OFF, WIN_LEN, access);
    b.qp.post_send(&[SendWr::new(900, op, &[])])?;
    expect_local(b, 900, WcOpcode::BindMw)?;
    Ok(rkey)
}

/// A type 2 window of `b`, bound with `access`: (window, R_Key).
fn bound2<C: Context>(p: &Pair<C>, access: AccessFlags) -> Result<(C::Mw, u32), Stop> {
    let mw = p.b.ctx.alloc_mw(&p.b.pd, MwType::Type2)?;
    let rkey = bind2(&p.b, &mw, access)?;
    Ok((mw, rkey))
}

/// `a` writes `len` bytes of pattern `seed` from its MR to `va` under `rkey` (`wr_id`).
fn write_via<C: Context>(
    p: &Pair<C>,
    wr_id: u64,
    rkey: u32,
    va: u64,
    len: usize,
    seed: u8,
) -> Outcome {
    p.a.fill(0, &pattern(seed, len))?;
    let sge = [p.a.sge(0, len)?];
    let op = SendOp::RdmaWrite {
        remote_addr: va,
        rkey,
    };
    p.a.qp.post_send(&[SendWr::new(wr_id, op, &sge)])?;
    Ok(())
}

/// `a` writes through `rkey` and the write fails with a remote access error.
fn write_refused<C: Context>(p: &Pair<C>, rkey: u32, va: u64, len: usize) -> Outcome {
    write_via(p, 77, rkey, va, len, 9)?;
    p.a.expect_send_status(77, WcStatus::RemAccessErr)?;
    Ok(())
}

/// `a` writes 64 bytes through `rkey` at window offset `off` (window at `WIN_OFF` of `b`'s
/// MR) and they land there.
fn write_lands<C: Context>(p: &Pair<C>, rkey: u32, va: u64, off: usize) -> Outcome {
    write_via(p, 70, rkey, va, 64, 5)?;
    p.a.expect_send(70, WcOpcode::RdmaWrite, 64)?;
    check_bytes(
        &p.b.bytes(WIN_OFF + off, 64)?,
        &pattern(5, 64),
        "bytes written via the MW",
    )
}

/// The error completion of `b`'s failed local operation `wr_id`.
fn expect_local_error<C: Context>(s: &Side<C>, wr_id: u64, status: WcStatus) -> Outcome {
    let wc: WorkCompletion = poll_one(&s.send_cq)?;
    check_status(&wc, wr_id, status, s.qpn())
}

// ---- allocation and lifetime ----------------------------------------------------------------

/// A device that reports windows (`max_mw` > 0) reports `IBV_DEVICE_MEM_WINDOW`.
pub fn device_reports_windows<C: Context>(env: &Env<C>) -> Outcome {
    let dev = env.open(0)?.query_device()?;
    if dev.max_mw == 0 {
        return Err(Stop::Skip("the device has no memory windows".into()));
    }
    check_eq!(
        dev.device_cap_flags.contains(DeviceCapFlags::MEM_WINDOW),
        true,
        "IBV_DEVICE_MEM_WINDOW with max_mw {}",
        dev.max_mw
    );
    Ok(())
}

/// Windows of both types allocate with their type and a non-zero R_Key, keep their PD busy,
/// and deallocate once (a second destroy is `Destroyed`).
pub fn alloc_dealloc_both_types<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type1)?;
    let pd = p.b.ctx.alloc_pd()?;
    for t in [MwType::Type1, MwType::Type2] {
        let mw = p.b.ctx.alloc_mw(&pd, t)?;
        check_eq!(mw.mw_type(), t, "type of the window");
        if mw.rkey() == 0 {
            return Err(failure(format!("{t:?} window has R_Key 0")));
        }
        expect_kind(pd.destroy(), ErrorKind::Busy, "dealloc_pd with a window")?;
        mw.destroy()?;
        expect_kind(mw.destroy(), ErrorKind::Destroyed, "second dealloc_mw")?;
    }
    pd.destroy()?;
    Ok(())
}

// ---- type 2 ----------------------------------------------------------------------------------

/// A type 2 bind completes as `IBV_WC_BIND_MW`; a WRITE through the window lands at the
/// window's place in the MR.
pub fn type2_bind_then_write<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let (_mw, rkey) = bound2(&p, AccessFlags::REMOTE_WRITE)?;
    write_lands(&p, rkey, p.b.addr(WIN_OFF + 128), 128)
}

/// A READ through a window with REMOTE_READ returns the window's bytes.
pub fn type2_read_through_window<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let data = pattern(3, 64);
    p.b.fill(WIN_OFF + 64, &data)?;
    let (_mw, rkey) = bound2(&p, AccessFlags::REMOTE_READ)?;
    let sge = [p.a.sge(0, 64)?];
    let op = SendOp::RdmaRead {
        remote_addr: p.b.addr(WIN_OFF + 64),
        rkey,
    };
    p.a.qp.post_send(&[SendWr::new(3, op, &sge)])?;
    p.a.expect_send(3, WcOpcode::RdmaRead, 64)?;
    check_bytes(&p.a.bytes(0, 64)?, &data, "bytes read via the MW")
}

/// The window's rights are narrower than the MR's: an MR open to remote writes, a window that
/// only reads — a WRITE through the window is a remote access error.
pub fn rights_narrower_than_mr<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let (_mw, rkey) = bound2(&p, AccessFlags::REMOTE_READ)?;
    write_refused(&p, rkey, p.b.addr(WIN_OFF), 64)
}

/// A window grants remote writes over an MR that has no remote rights of its own (only
/// LOCAL_WRITE and MW_BIND, as pyverbs' MWTest registers it).
pub fn window_grants_what_the_mr_does_not<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let mr = p.b.ctx.alloc_mr(
        &p.b.pd,
        4096,
        AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
    )?;
    let mw = p.b.ctx.alloc_mw(&p.b.pd, MwType::Type2)?;
    let rkey = inc_rkey(mw.rkey());
    let op = SendOp::BindMw {
        mw: mw.handle(),
        rkey,
        mr: mr.lkey(),
        addr: mr.addr(),
        length: 4096,
        access: AccessFlags::REMOTE_WRITE,
    };
    p.b.qp.post_send(&[SendWr::new(1, op, &[])])?;
    expect_local(&p.b, 1, WcOpcode::BindMw)?;
    write_via(&p, 2, rkey, mr.addr() + 100, 32, 4)?;
    p.a.expect_send(2, WcOpcode::RdmaWrite, 32)?;
    let mut got = [0u8; 32];
    mr.read(100, &mut got)?;
    check_bytes(&got, &pattern(4, 32), "bytes written via the MW")
}

/// A WRITE that runs past the window's end (but not the MR's) is a remote access error.
pub fn write_past_window_refused<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let (_mw, rkey) = bound2(&p, AccessFlags::REMOTE_WRITE)?;
    write_refused(&p, rkey, p.b.addr(WIN_OFF + WIN_LEN - 32), 64)
}

/// A WRITE before the window's start is a remote access error.
pub fn write_before_window_refused<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let (_mw, rkey) = bound2(&p, AccessFlags::REMOTE_WRITE)?;
    write_refused(&p, rkey, p.b.addr(WIN_OFF - 8), 16)
}

/// A bind whose range leaves the MR completes with `MW_BIND_ERR`.
pub fn bind_beyond_mr_is_bind_error<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let mw = p.b.ctx.alloc_mw(&p.b.pd, MwType::Type2)?;
    let len = p.b.mr.len();
    let op = bind_op(
        &p.b,
        &mw,
        inc_rkey(mw.rkey()),
        64,
        len,
        AccessFlags::REMOTE_READ,
    );
    p.b.qp.post_send(&[SendWr::new(4, op, &[])])?;
    expect_local_error(&p.b, 4, WcStatus::MwBindErr)
}

/// A bind to an MR registered without MW_BIND completes with `MW_BIND_ERR`.
pub fn bind_without_mw_bind_access_is_bind_error<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let mr = p.b.ctx.alloc_mr(&p.b.pd, 4096, all_remote())?;
    let mw = p.b.ctx.alloc_mw(&p.b.pd, MwType::Type2)?;
    let op = SendOp::BindMw {
        mw: mw.handle(),
        rkey: inc_rkey(mw.rkey()),
        mr: mr.lkey(),
        addr: mr.addr(),
        length: 64,
        access: AccessFlags::REMOTE_READ,
    };
    p.b.qp.post_send(&[SendWr::new(5, op, &[])])?;
    expect_local_error(&p.b, 5, WcStatus::MwBindErr)
}

/// LOCAL_INV of a bound type 2 window completes as `IBV_WC_LOCAL_INV`; accesses through its
/// key then fail.
pub fn local_invalidate_revokes<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let (_mw, rkey) = bound2(&p, AccessFlags::REMOTE_WRITE)?;
    write_lands(&p, rkey, p.b.addr(WIN_OFF), 0)?;
    p.b.qp
        .post_send(&[SendWr::new(6, SendOp::LocalInv { rkey }, &[])])?;
    expect_local(&p.b, 6, WcOpcode::LocalInv)?;
    write_refused(&p, rkey, p.b.addr(WIN_OFF), 64)
}

/// SEND_WITH_INV: the receive completion carries `IBV_WC_WITH_INV` and the invalidated R_Key;
/// the sender's completion is a SEND; accesses through the key then fail.
pub fn send_with_invalidate_revokes<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let (_mw, rkey) = bound2(&p, AccessFlags::REMOTE_WRITE)?;
    p.b.post_recv_at(8, 0, 64)?;
    let sge = [p.a.sge(0, 16)?];
    let op = SendOp::SendWithInv {
        invalidate_rkey: rkey,
    };
    p.a.qp.post_send(&[SendWr::new(7, op, &sge)])?;
    p.a.expect_send(7, WcOpcode::Send, 16)?;
    let wc = poll_one(&p.b.recv_cq)?;
    check_status(&wc, 8, WcStatus::Success, p.b.qpn())?;
    check_eq!(wc.opcode, WcOpcode::Recv, "opcode of {wc:?}");
    check_eq!(wc.byte_len, 16, "byte_len of {wc:?}");
    check_eq!(
        wc.wc_flags.contains(WcFlags::WITH_INV),
        true,
        "IBV_WC_WITH_INV in {wc:?}"
    );
    check_eq!(wc.invalidated_rkey, rkey, "invalidated_rkey of {wc:?}");
    write_refused(&p, rkey, p.b.addr(WIN_OFF), 64)
}

/// SEND_WITH_INV naming a key that is no window: the receive completes with
/// `REM_INV_REQ_ERR` at the responder.
pub fn send_with_invalidate_bad_key<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    p.b.post_recv_at(8, 0, 64)?;
    let sge = [p.a.sge(0, 16)?];
    let op = SendOp::SendWithInv {
        invalidate_rkey: p.b.mr.rkey() ^ 0x8000_0000,
    };
    p.a.qp.post_send(&[SendWr::new(7, op, &sge)])?;
    p.b.expect_recv_status(8, WcStatus::RemInvReqErr)?;
    Ok(())
}

/// After an invalidation the window binds again under the next key; the old key stays dead.
pub fn rebind_changes_rkey<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let (mw, first) = bound2(&p, AccessFlags::REMOTE_WRITE)?;
    p.b.qp
        .post_send(&[SendWr::new(6, SendOp::LocalInv { rkey: first }, &[])])?;
    expect_local(&p.b, 6, WcOpcode::LocalInv)?;
    let second = bind2(&p.b, &mw, AccessFlags::REMOTE_WRITE)?;
    if second == first {
        return Err(failure("the rebound window kept its R_Key"));
    }
    write_lands(&p, second, p.b.addr(WIN_OFF + 8), 8)?;
    write_refused(&p, first, p.b.addr(WIN_OFF), 64)
}

/// Deallocating a bound window succeeds; accesses through its key then fail.
pub fn dealloc_while_bound_revokes<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let (mw, rkey) = bound2(&p, AccessFlags::REMOTE_WRITE)?;
    mw.destroy()?;
    write_refused(&p, rkey, p.b.addr(WIN_OFF), 64)
}

/// An MR with a bound window cannot be deregistered (emulator `Busy`, rxe `EINVAL`); the window
/// keeps working; once the window is gone the MR deregisters.
pub fn mr_dereg_while_bound_refused<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let mr = p.b.ctx.alloc_mr(
        &p.b.pd,
        4096,
        AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
    )?;
    let mw = p.b.ctx.alloc_mw(&p.b.pd, MwType::Type2)?;
    let rkey = inc_rkey(mw.rkey());
    let op = SendOp::BindMw {
        mw: mw.handle(),
        rkey,
        mr: mr.lkey(),
        addr: mr.addr(),
        length: 4096,
        access: AccessFlags::REMOTE_WRITE,
    };
    p.b.qp.post_send(&[SendWr::new(1, op, &[])])?;
    expect_local(&p.b, 1, WcOpcode::BindMw)?;
    expect_err(
        mr.destroy(),
        &[ErrorKind::Busy, ErrorKind::InvalidArgument],
        "dereg_mr with a bound window",
    )?;
    write_via(&p, 2, rkey, mr.addr(), 32, 6)?;
    p.a.expect_send(2, WcOpcode::RdmaWrite, 32)?;
    mw.destroy()?;
    mr.destroy()?;
    Ok(())
}

/// A zero-based type 2 window is addressed from 0.
pub fn zero_based_window<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let (_mw, rkey) = bound2(&p, AccessFlags::REMOTE_WRITE | AccessFlags::ZERO_BASED)?;
    write_lands(&p, rkey, 64, 64)
}

// ---- type 1 ----------------------------------------------------------------------------------

/// `ibv_bind_mw` returns a new R_Key (the window reports it); accesses under it land, under the
/// allocation's key they fail; binding again moves the key again.
pub fn type1_bind_changes_rkey<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type1)?;
    let mw = p.b.ctx.alloc_mw(&p.b.pd, MwType::Type1)?;
    let old = mw.rkey();
    let bind = MwBind {
        wr_id: 11,
        flags: SendFlags::SIGNALED,
        mr: p.b.mr.lkey(),
        addr: p.b.addr(WIN_OFF),
        length: WIN_LEN as u64,
        access: AccessFlags::REMOTE_WRITE,
    };
    let rkey = p.b.ctx.bind_mw(&p.b.qp, &mw, &bind)?;
    expect_local(&p.b, 11, WcOpcode::BindMw)?;
    if rkey == old {
        return Err(failure("ibv_bind_mw kept the R_Key"));
    }
    check_eq!(mw.rkey(), rkey, "the window's R_Key after the bind");
    write_lands(&p, rkey, p.b.addr(WIN_OFF + 32), 32)?;
    let again =
        p.b.ctx
            .bind_mw(&p.b.qp, &mw, &MwBind { wr_id: 12, ..bind })?;
    expect_local(&p.b, 12, WcOpcode::BindMw)?;
    if again == rkey {
        return Err(failure("a second ibv_bind_mw kept the R_Key"));
    }
    write_refused(&p, rkey, p.b.addr(WIN_OFF), 64)
}

/// A zero-length type 1 bind unbinds the window: accesses fail (pyverbs
/// `test_invalidate_mw_type1`).
pub fn type1_zero_length_unbinds<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type1)?;
    let mw = p.b.ctx.alloc_mw(&p.b.pd, MwType::Type1)?;
    let bind = MwBind {
        wr_id: 11,
        flags: SendFlags::SIGNALED,
        mr: p.b.mr.lkey(),
        addr: p.b.addr(WIN_OFF),
        length: WIN_LEN as u64,
        access: AccessFlags::REMOTE_WRITE,
    };
    p.b.ctx.bind_mw(&p.b.qp, &mw, &bind)?;
    expect_local(&p.b, 11, WcOpcode::BindMw)?;
    let unbind = MwBind {
        wr_id: 12,
        length: 0,
        access: AccessFlags::empty(),
        ..bind
    };
    let rkey = p.b.ctx.bind_mw(&p.b.qp, &mw, &unbind)?;
    expect_local(&p.b, 12, WcOpcode::BindMw)?;
    write_refused(&p, rkey, p.b.addr(WIN_OFF), 64)
}

/// `ibv_bind_mw` takes type 1 windows only: a type 2 window is refused at the call.
pub fn type1_bind_refuses_type2<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type2)?;
    let mw = p.b.ctx.alloc_mw(&p.b.pd, MwType::Type2)?;
    let bind = MwBind {
        wr_id: 1,
        flags: SendFlags::SIGNALED,
        mr: p.b.mr.lkey(),
        addr: p.b.addr(0),
        length: 64,
        access: AccessFlags::REMOTE_READ,
    };
    expect_kind(
        p.b.ctx.bind_mw(&p.b.qp, &mw, &bind),
        ErrorKind::InvalidArgument,
        "ibv_bind_mw of a type 2 window",
    )?;
    let mut wc = [WorkCompletion::default(); 1];
    check_eq!(
        p.b.send_cq.poll(&mut wc)?,
        0,
        "completions after a refused bind"
    );
    Ok(())
}

/// LOCAL_INV cannot invalidate a type 1 window: `LOC_QP_OP_ERR`.
pub fn type1_local_invalidate_fails<C: Context>(env: &Env<C>) -> Outcome {
    let p = mw_pair(env, MwType::Type1)?;
    let mw = p.b.ctx.alloc_mw(&p.b.pd, MwType::Type1)?;
    let op = SendOp::LocalInv { rkey: mw.rkey() };
    p.b.qp.post_send(&[SendWr::new(13, op, &[])])?;
    expect_local_error(&p.b, 13, WcStatus::LocQpOpErr)
}
