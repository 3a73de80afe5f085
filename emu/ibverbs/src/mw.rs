//! Memory windows: `ibv_alloc_mw`, `ibv_dealloc_mw` and `ibv_bind_mw` (the context's
//! `alloc_mw`/`dealloc_mw`/`bind_mw` ops, which the header's inline wrappers call), and the
//! send operations that name windows: `IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV` and
//! `IBV_WR_SEND_WITH_INV` in `ibv_post_send`, and `ibv_wr_bind_mw`, `ibv_wr_local_inv`,
//! `ibv_wr_send_inv` in the `ibv_qp_ex` builder.
//!
//! A window is a `#[repr(C)]` [`SvMw`]: the public `ibv_mw`, then the UDP device's window. What
//! a window may do (bind rules, invalidation, remote access) is the engine's (`emu-proto`); this
//! module only converts.

use std::ffi::{c_int, c_uint, c_void};

use emu_udp::UdpMw;
use ibverbs_sys::*;
use verbs_api::{AccessFlags, Context, MemoryWindow, MwBind, MwType, SendFlags, SendOp};

use crate::device::{release, retain, udp_context};
use crate::objects::pd_udp;
use crate::qp::{fail_wr, qp_inner, start_wr};
use crate::{guard, null_with};

/// A memory window: the public `ibv_mw`, then the private part.
#[repr(C)]
pub struct SvMw {
    /// The public part.
    pub mw: ibv_mw,
    pub(crate) udp: UdpMw,
}

/// The UDP window behind an `ibv_mw` (NULL → `None`).
///
/// # Safety
///
/// `mw` is NULL or a live window of this library.
unsafe fn mw_udp<'a>(mw: *mut ibv_mw) -> Option<&'a UdpMw> {
    let sv = mw.cast::<SvMw>();
    // SAFETY: per the contract; only the private part is borrowed.
    (!sv.is_null()).then(|| unsafe { &(*sv).udp })
}

/// `ops.alloc_mw` (`ibv_alloc_mw`): type 1 or 2; another type is `EINVAL`.
pub unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: c_uint) -> *mut ibv_mw {
    guard(std::ptr::null_mut(), || {
        // SAFETY: a live PD of ours (or NULL).
        let Some(udp_pd) = (unsafe { pd_udp(pd) }) else {
            return null_with(libc::EINVAL);
        };
        let Some(t) = MwType::from_raw(mw_type) else {
            return null_with(libc::EINVAL);
        };
        // SAFETY: a live PD records its live context.
        let context = unsafe { (*pd).context };
        // SAFETY: same context.
        let Some(c) = (unsafe { udp_context(context) }) else {
            return null_with(libc::EINVAL);
        };
        match c.udp.alloc_mw(udp_pd, t) {
            Ok(udp) => {
                let mw = ibv_mw {
                    context,
                    pd,
                    rkey: udp.rkey(),
                    handle: udp.handle(),
                    mw_type,
                };
                // SAFETY: a context we opened.
                unsafe { retain(context) };
                Box::into_raw(Box::new(SvMw { mw, udp })).cast()
            }
            Err(e) => null_with(e.errno()),
        }
    })
}

/// `ops.dealloc_mw` (`ibv_dealloc_mw`): allowed while bound (the window is invalidated).
pub unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live window of ours (or NULL).
        let Some(udp) = (unsafe { mw_udp(mw) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = udp.destroy() {
            return e.errno();
        }
        // SAFETY: the window is ours and destroyed; nothing refers to it any more.
        let sv = unsafe { Box::from_raw(mw.cast::<SvMw>()) };
        // SAFETY: its live context.
        unsafe { release(sv.mw.context) };
        0
    })
}

/// `ops.bind_mw` (`ibv_bind_mw`, after the inline wrapper's checks): posts the type 1 bind on
/// `qp` and stores the window's new R_Key in `mw->rkey`.
pub unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live QP and window of ours (or NULL).
        let (Some(q), Some(w)) = (unsafe { qp_inner(qp) }, unsafe { mw_udp(mw) }) else {
            return libc::EINVAL;
        };
        if mw_bind.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller's bind description.
        let b = unsafe { *mw_bind };
        // SAFETY: `bind_info.mr` is NULL or a live MR (the inline wrapper checked its PD).
        let mr = unsafe { mr_lkey(b.bind_info.mr) };
        let bind = MwBind {
            wr_id: b.wr_id,
            flags: SendFlags::from_bits_truncate(b.send_flags),
            mr,
            addr: b.bind_info.addr,
            length: b.bind_info.length,
            access: AccessFlags::from_bits_retain(b.bind_info.mw_access_flags),
        };
        // SAFETY: a live QP records its live context.
        let Some(c) = (unsafe { udp_context((*qp).context) }) else {
            return libc::EINVAL;
        };
        match c.udp.bind_mw(&q.udp, w, &bind) {
            Ok(rkey) => {
                // SAFETY: the caller's live window; `rkey` is the public field to update.
                unsafe { (*mw).rkey = rkey };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// The lkey of MR `mr` (0 for NULL).
///
/// # Safety
///
/// `mr` is NULL or a live MR.
unsafe fn mr_lkey(mr: *mut ibv_mr) -> u32 {
    if mr.is_null() {
        0
    } else {
        // SAFETY: per the contract.
        unsafe { (*mr).lkey }
    }
}

/// The operation of a classic send work request with a window opcode: LOCAL_INV (7),
/// BIND_MW (8) or SEND_WITH_INV (9); `EINVAL` for another opcode or a BIND_MW without a window.
///
/// # Safety
///
/// For BIND_MW, `wr.bind_mw` names a live window of this library and a live MR (or NULL).
pub(crate) unsafe fn send_op(wr: &ibv_send_wr) -> Result<SendOp, c_int> {
    // `invalidate_rkey` shares the `imm_data` slot, in host order.
    let key = wr.imm_data;
    Ok(match wr.opcode {
        7 => SendOp::LocalInv { rkey: key },
        9 => SendOp::SendWithInv {
            invalidate_rkey: key,
        },
        8 => {
            // SAFETY: the trailing union holds `bind_mw` for this opcode; it is as large and
            // as aligned as the words that mirror it.
            let b = unsafe {
                std::ptr::from_ref(&wr.bind_mw_or_tso)
                    .cast::<ibv_send_wr_bind_mw>()
                    .read()
            };
            // SAFETY: per the contract.
            unsafe { bind_op(b.mw, b.rkey, &b.bind_info) }?
        }
        _ => return Err(libc::EINVAL),
    })
}

/// The BIND_MW of window `mw` with `rkey` and `info`.
///
/// # Safety
///
/// `mw` is NULL or a live window of this library; `info.mr` is NULL or a live MR.
unsafe fn bind_op(mw: *mut ibv_mw, rkey: u32, info: &ibv_mw_bind_info) -> Result<SendOp, c_int> {
    // SAFETY: per the contract.
    let w = unsafe { mw_udp(mw) }.ok_or(libc::EINVAL)?;
    Ok(SendOp::BindMw {
        mw: w.handle(),
        rkey,
        // SAFETY: per the contract.
        mr: unsafe { mr_lkey(info.mr) },
        addr: info.addr,
        length: info.length,
        access: AccessFlags::from_bits_retain(info.mw_access_flags),
    })
}

/// `ibv_wr_bind_mw`.
pub(crate) unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut c_void,
    rkey: u32,
    info: *const c_void,
) {
    let info = info.cast::<ibv_mw_bind_info>();
    if info.is_null() {
        return fail_wr(qp, libc::EINVAL);
    }
    // SAFETY: `ibv_wr_bind_mw`'s contract: a live window and bind description (its MR live).
    match unsafe { bind_op(mw.cast(), rkey, &*info) } {
        Ok(op) => start_wr(qp, op),
        Err(e) => fail_wr(qp, e),
    }
}

/// `ibv_wr_local_inv`.
pub(crate) unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    start_wr(qp, SendOp::LocalInv { rkey });
}

/// `ibv_wr_send_inv`.
pub(crate) unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    start_wr(
        qp,
        SendOp::SendWithInv {
            invalidate_rkey: rkey,
        },
    );
}
