//! Memory windows (IBTA §10.6.7): the window table's entries, the rules of a bind and of an
//! invalidation, and the resolution of an R_Key that names a window into MR bytes.
//!
//! Window keys live in their own key-index range ([`MW_INDEX_BASE`] and up, as rxe keeps MR and
//! MW indices apart), so one look at a key tells which table it names. This module checks and
//! changes windows only; the MR table, the QPs and the packets are the HCA's and the RC
//! engine's. A window key is never an lkey: only remote accesses resolve through windows.

use verbs_api::{AccessFlags, MwType, WcStatus};

use crate::ids::{MrInfo, PdId};
use crate::table::Table;

/// The first key index of a window (MR indices stay below it: `max_mr` is far smaller).
pub(crate) const MW_INDEX_BASE: u32 = 0x80_0000;

/// One memory window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MwEntry {
    pub(crate) pd: PdId,
    pub(crate) mw_type: MwType,
    /// The R_Key `ibv_mw.rkey` reports: from the allocation, the latest type 1 bind posted, or
    /// the latest type 2 bind carried out.
    pub(crate) rkey: u32,
    /// The current binding; `None` while the window is unbound (free, or invalidated).
    pub(crate) binding: Option<Binding>,
}

/// What a bound window grants.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Binding {
    /// The R_Key accesses must carry.
    pub(crate) rkey: u32,
    /// The MR's key (what the memory is reached by).
    pub(crate) mr_key: u32,
    /// Type 2: the only QP accesses may come through.
    pub(crate) qpn: Option<u32>,
    /// The window's first address as peers name it: a virtual address inside the MR, or 0 for
    /// a zero-based window.
    pub(crate) base: u64,
    pub(crate) length: u64,
    /// Where the window starts inside the MR.
    pub(crate) mr_offset: u64,
    pub(crate) access: AccessFlags,
}

/// A bind request as the engine carries it out (from `SendOp::BindMw` or a type 1 bind).
#[derive(Copy, Clone, Debug)]
pub(crate) struct BindArgs {
    pub(crate) mw: u32,
    pub(crate) rkey: u32,
    pub(crate) mr: u32,
    pub(crate) addr: u64,
    pub(crate) length: u64,
    pub(crate) access: AccessFlags,
}

/// The rights a window may grant.
const WINDOW_RIGHTS: AccessFlags = AccessFlags::REMOTE_READ
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_ATOMIC)
    .union(AccessFlags::LOCAL_WRITE)
    .union(AccessFlags::ZERO_BASED);

/// True if `key` names a window rather than an MR.
pub(crate) fn is_window_key(key: u32) -> bool {
    (key >> 8) >= MW_INDEX_BASE
}

/// The table index of window key `key`.
pub(crate) fn index_of(key: u32) -> u32 {
    (key >> 8).wrapping_sub(MW_INDEX_BASE)
}

/// Resolves a remote access of `len` bytes at `va` with `need` rights through the window whose
/// R_Key is `key`, for QP `qpn` of `pd`: the MR key and the offset into the MR, or `None` if the
/// window is unknown, unbound, under another key, of another PD, bound to another QP (type 2),
/// lacks the rights, or the range leaves it (IBTA C10-52: checked as an MR access is).
pub(crate) fn resolve(
    mws: &Table<MwEntry>,
    key: u32,
    pd: PdId,
    qpn: u32,
    va: u64,
    len: u64,
    need: AccessFlags,
) -> Option<(u32, u64)> {
    let mw = mws.get(index_of(key)).filter(|m| m.pd == pd)?;
    let b = mw.binding.filter(|b| b.rkey == key)?;
    if b.qpn.is_some_and(|q| q != qpn) || !b.access.contains(need) {
        return None;
    }
    let offset = va.checked_sub(b.base)?;
    let end = offset.checked_add(len)?;
    (end <= b.length).then_some((b.mr_key, b.mr_offset + offset))
}

/// True while `key` still grants what it granted: any MR key, or a window key whose window is
/// bound under it to MR `mr_key` (the later packets of a WRITE check this).
pub(crate) fn still_bound(mws: &Table<MwEntry>, key: u32, mr_key: u32) -> bool {
    if !is_window_key(key) {
        return true;
    }
    mws.get(index_of(key))
        .and_then(|m| m.binding)
        .is_some_and(|b| b.rkey == key && b.mr_key == mr_key)
}

/// Carries out a bind of window `args.mw` for QP `qpn` of `pd` (IBTA §10.6.7.2, rxe's
/// `rxe_check_bind_mw`): `Err(MW_BIND_ERR)` if a rule is broken, the window unchanged.
///
/// Rules: the window exists in the QP's PD and the key keeps its index (only the key byte is
/// the consumer's); a type 2 window is not bound already and gets a length; with a length, the
/// MR exists in the QP's PD and allows MW_BIND, remote write or atomic rights need the MR's
/// LOCAL_WRITE, a type 1 window is not zero based, and the range lies inside the MR. A type 1
/// bind of length 0 unbinds.
pub(crate) fn bind(
    mws: &mut Table<MwEntry>,
    mrs: &Table<MrInfo>,
    qpn: u32,
    pd: PdId,
    args: &BindArgs,
) -> Result<(), WcStatus> {
    let err = WcStatus::MwBindErr;
    let mw = mws.get(args.mw).ok_or(err)?;
    if mw.pd != pd || index_of(args.rkey) != args.mw || !is_window_key(args.rkey) {
        return Err(err);
    }
    let type2 = mw.mw_type == MwType::Type2;
    // o10-37.2.30: a type 2 window binds only while free; o10-37.2.40: never to nothing.
    if type2 && (mw.binding.is_some() || args.length == 0) {
        return Err(err);
    }
    let binding = if args.length == 0 {
        None
    } else {
        Some(check_binding(mrs, pd, args, type2.then_some(qpn))?)
    };
    let mw = mws.get_mut(args.mw).ok_or(err)?;
    mw.binding = binding;
    mw.rkey = args.rkey;
    Ok(())
}

/// The binding a non-empty bind makes, if the MR allows it (see [`bind`]).
fn check_binding(
    mrs: &Table<MrInfo>,
    pd: PdId,
    args: &BindArgs,
    qpn: Option<u32>,
) -> Result<Binding, WcStatus> {
    let err = WcStatus::MwBindErr;
    let mr = mrs
        .get(args.mr >> 8)
        .filter(|m| m.lkey == args.mr && m.length != 0 && m.pd == pd)
        .ok_or(err)?;
    let access = args.access;
    if !mr.access.contains(AccessFlags::MW_BIND) || !WINDOW_RIGHTS.contains(access) {
        return Err(err);
    }
    let writes = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if access.intersects(writes) && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(err);
    }
    let zero_based = access.contains(AccessFlags::ZERO_BASED);
    if zero_based && qpn.is_none() {
        return Err(err);
    }
    // The window starts at `addr` inside the MR either way; a zero-based window is addressed
    // by peers from 0 (IBTA §10.6.7.2.2, rxe's `mw->addr` offset).
    let mr_offset = args.addr.checked_sub(mr.iova).ok_or(err)?;
    let base = if zero_based { 0 } else { args.addr };
    let end = mr_offset.checked_add(args.length).ok_or(err)?;
    if end > mr.length {
        return Err(err);
    }
    Ok(Binding {
        rkey: args.rkey,
        mr_key: mr.lkey,
        qpn,
        base,
        length: args.length,
        mr_offset,
        access,
    })
}

/// Invalidates the type 2 window whose R_Key is `key` in `pd` (LOCAL_INV, or a peer's
/// SEND_WITH_INV; IBTA §10.6.7.2.4, rxe's `rxe_invalidate_mw`). False — nothing changes — for
/// an unknown or stale key, a window of another PD, or a type 1 window.
pub(crate) fn invalidate(mws: &mut Table<MwEntry>, key: u32, pd: PdId) -> bool {
    if !is_window_key(key) {
        return false;
    }
    match mws.get_mut(index_of(key)) {
        Some(mw) if mw.pd == pd && mw.mw_type == MwType::Type2 && mw.rkey == key => {
            mw.binding = None;
            true
        }
        _ => false,
    }
}

/// True if some window is bound to MR `lkey` (which then cannot be deregistered).
pub(crate) fn mr_has_windows(mws: &Table<MwEntry>, lkey: u32) -> bool {
    (0..u32::try_from(mws.capacity()).unwrap_or(u32::MAX))
        .filter_map(|i| mws.get(i))
        .any(|m| m.binding.is_some_and(|b| b.mr_key == lkey))
}

/// Unbinds every type 2 window bound to QP `qpn` (the QP is being destroyed).
pub(crate) fn unbind_qp(mws: &mut Table<MwEntry>, qpn: u32) {
    for i in 0..u32::try_from(mws.capacity()).unwrap_or(u32::MAX) {
        if let Some(mw) = mws.get_mut(i) {
            if mw.binding.is_some_and(|b| b.qpn == Some(qpn)) {
                mw.binding = None;
            }
        }
    }
}
