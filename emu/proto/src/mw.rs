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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const PD: PdId = PdId(1);
    const QPN: u32 = 0x11;

    /// An MR table with one MR (index 1, key 0x1AB) of 4096 bytes at 0x1000 allowing MW_BIND.
    fn mrs() -> Table<MrInfo> {
        let mut t = Table::default();
        t.insert(MrInfo {
            pd: PdId(u32::MAX),
            lkey: 0,
            rkey: 0,
            iova: 0,
            length: 0,
            access: AccessFlags::empty(),
        });
        t.insert(MrInfo {
            pd: PD,
            lkey: 0x1AB,
            rkey: 0x1AB,
            iova: 0x1000,
            length: 4096,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
        });
        t
    }

    /// A window of `mw_type` at table index 0 with its first key.
    fn window(mw_type: MwType) -> (Table<MwEntry>, u32) {
        let mut t = Table::default();
        let key = (MW_INDEX_BASE << 8) | 0x42;
        t.insert(MwEntry {
            pd: PD,
            mw_type,
            rkey: key,
            binding: None,
        });
        (t, key)
    }

    fn args(rkey: u32, addr: u64, length: u64, access: AccessFlags) -> BindArgs {
        BindArgs {
            mw: 0,
            rkey,
            mr: 0x1AB,
            addr,
            length,
            access,
        }
    }

    #[test]
    fn type2_window_resolves_for_its_qp_pd_range_and_rights_only() {
        let (mut mws, key) = window(MwType::Type2);
        let rkey = key + 1;
        let a = args(rkey, 0x1100, 0x100, AccessFlags::REMOTE_WRITE);
        bind(&mut mws, &mrs(), QPN, PD, &a).unwrap();
        let w = AccessFlags::REMOTE_WRITE;
        assert_eq!(
            resolve(&mws, rkey, PD, QPN, 0x1180, 0x80, w),
            Some((0x1AB, 0x180))
        );
        assert_eq!(
            resolve(&mws, rkey, PD, QPN + 1, 0x1180, 8, w),
            None,
            "other QP"
        );
        assert_eq!(
            resolve(&mws, rkey, PdId(2), QPN, 0x1180, 8, w),
            None,
            "other PD"
        );
        assert_eq!(resolve(&mws, key, PD, QPN, 0x1180, 8, w), None, "stale key");
        assert_eq!(
            resolve(&mws, rkey, PD, QPN, 0x11F8, 16, w),
            None,
            "past the end"
        );
        assert_eq!(
            resolve(&mws, rkey, PD, QPN, 0x10F8, 8, w),
            None,
            "before the start"
        );
        let r = AccessFlags::REMOTE_READ;
        assert_eq!(
            resolve(&mws, rkey, PD, QPN, 0x1180, 8, r),
            None,
            "no read right"
        );
        assert!(still_bound(&mws, rkey, 0x1AB));
        assert!(mr_has_windows(&mws, 0x1AB));
        unbind_qp(&mut mws, QPN);
        assert!(!still_bound(&mws, rkey, 0x1AB));
        assert!(!mr_has_windows(&mws, 0x1AB));
    }

    #[test]
    fn zero_based_window_is_addressed_from_zero() {
        let (mut mws, key) = window(MwType::Type2);
        let access = AccessFlags::REMOTE_READ | AccessFlags::ZERO_BASED;
        bind(
            &mut mws,
            &mrs(),
            QPN,
            PD,
            &args(key + 1, 0x1200, 0x100, access),
        )
        .unwrap();
        let r = AccessFlags::REMOTE_READ;
        assert_eq!(
            resolve(&mws, key + 1, PD, QPN, 0x10, 8, r),
            Some((0x1AB, 0x210))
        );
        assert_eq!(resolve(&mws, key + 1, PD, QPN, 0x1210, 8, r), None);
    }

    #[test]
    fn bind_rules() {
        let m = mrs();
        let w = AccessFlags::REMOTE_WRITE;
        let bind_err = Err(WcStatus::MwBindErr);
        // Type 1: zero based refused; rebinding allowed; length 0 unbinds.
        let (mut mws, key) = window(MwType::Type1);
        let zb = w | AccessFlags::ZERO_BASED;
        assert_eq!(
            bind(&mut mws, &m, QPN, PD, &args(key + 1, 0x1000, 8, zb)),
            bind_err
        );
        bind(&mut mws, &m, QPN, PD, &args(key + 1, 0x1000, 8, w)).unwrap();
        bind(&mut mws, &m, QPN, PD, &args(key + 2, 0x1000, 16, w)).unwrap();
        bind(&mut mws, &m, QPN, PD, &args(key + 3, 0, 0, w)).unwrap();
        assert!(!mr_has_windows(&mws, 0x1AB));
        assert!(
            !invalidate(&mut mws, key + 3, PD),
            "type 1 is not invalidated"
        );
        // Type 2: another key index, a range outside the MR, another PD, length 0, and a
        // second bind while bound are refused; LOCAL_INV frees it for a new bind.
        let (mut mws, key) = window(MwType::Type2);
        let other_index = key + 0x100;
        assert_eq!(
            bind(&mut mws, &m, QPN, PD, &args(other_index, 0x1000, 8, w)),
            bind_err
        );
        assert_eq!(
            bind(&mut mws, &m, QPN, PD, &args(key + 1, 0x1F00, 0x200, w)),
            bind_err
        );
        assert_eq!(
            bind(&mut mws, &m, QPN, PdId(2), &args(key + 1, 0x1000, 8, w)),
            bind_err
        );
        assert_eq!(
            bind(&mut mws, &m, QPN, PD, &args(key + 1, 0x1000, 0, w)),
            bind_err
        );
        bind(&mut mws, &m, QPN, PD, &args(key + 1, 0x1000, 8, w)).unwrap();
        assert_eq!(
            bind(&mut mws, &m, QPN, PD, &args(key + 2, 0x1000, 8, w)),
            bind_err
        );
        assert!(!invalidate(&mut mws, key, PD), "stale key");
        assert!(invalidate(&mut mws, key + 1, PD));
        bind(&mut mws, &m, QPN, PD, &args(key + 2, 0x1000, 8, w)).unwrap();
    }

    #[test]
    fn mr_keys_are_not_window_keys() {
        assert!(!is_window_key(0x1AB));
        assert!(is_window_key(MW_INDEX_BASE << 8));
        assert_eq!(index_of((MW_INDEX_BASE + 5) << 8 | 7), 5);
    }
}
