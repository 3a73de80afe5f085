//! Packet-level tests of memory windows (IBTA §10.6.7) between two `Hca`s: binds of type 1 and
//! type 2 windows, remote access through a window checked like an MR access (R_Key, range,
//! rights), local invalidation, remote invalidation by SEND_WITH_INV (IETH on the wire,
//! `IBV_WC_WITH_INV` at the responder), bind errors, and the MR/window lifetime rules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Dir, MR_LEN, Pair};
use emu_proto::wire::{NakCode, Opcode, Syndrome};
use verbs_api::{
    AccessFlags, ErrorKind, MwBind, MwType, QpState, SendOp, SendWr, WcFlags, WcOpcode, WcStatus,
    inc_rkey,
};

const WIN_OFF: u64 = 0x100;
const WIN_LEN: u64 = 0x200;

/// An MR of b's that windows may be bound to (LOCAL_WRITE | MW_BIND, no remote rights).
fn bindable(p: &mut Pair) -> emu_proto::MrInfo {
    p.b.reg(MR_LEN, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
}

/// Binds a new type 2 window of b to `WIN_LEN` bytes at `WIN_OFF` of `mr` with `access`;
/// returns (window, rkey) after the bind completed.
fn bind_type2(p: &mut Pair, mr: &emu_proto::MrInfo, access: AccessFlags) -> (u32, u32) {
    let (mw, key) = p.b.hca.alloc_mw(p.b.pd, MwType::Type2).unwrap();
    let rkey = inc_rkey(key);
    let op = SendOp::BindMw {
        mw,
        rkey,
        mr: mr.lkey,
        addr: mr.iova + WIN_OFF,
        length: WIN_LEN,
        access,
    };
    p.post_b(&[SendWr::new(50, op, &[])]);
    assert!(p.run_until_idle());
    let wcs = p.b.send_wcs();
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (50, WcStatus::Success));
    assert_eq!(wcs[0].opcode, WcOpcode::BindMw);
    assert_eq!(p.b.hca.mw_rkey(mw).unwrap(), rkey);
    (mw, rkey)
}

/// a writes `len` bytes to `va` under `rkey`; returns a's completion status.
fn write(p: &mut Pair, rkey: u32, va: u64, len: u32) -> WcStatus {
    let s = p.a.at(0, len);
    let op = SendOp::RdmaWrite {
        remote_addr: va,
        rkey,
    };
    p.post_a(&[SendWr::new(9, op, &[s])]);
    assert!(p.run_until_idle());
    let wcs = p.a.send_wcs();
    assert_eq!(wcs.len(), 1);
    wcs[0].status
}

#[test]
fn type2_window_grants_exactly_its_range_and_rights() {
    let mut p = Pair::new();
    let mr = bindable(&mut p);
    let (_, rkey) = bind_type2(&mut p, &mr, AccessFlags::REMOTE_WRITE);
    p.a.write(&p.a.mr, 0, &[0xAB; 16]);
    assert_eq!(
        write(&mut p, rkey, mr.iova + WIN_OFF + 8, 16),
        WcStatus::Success
    );
    assert_eq!(p.b.read(&mr, WIN_OFF + 8, 16), vec![0xAB; 16]);
    // One byte past the window: a remote access NAK, both QPs in ERR.
    let last = mr.iova + WIN_OFF + WIN_LEN - 8;
    assert_eq!(write(&mut p, rkey, last, 16), WcStatus::RemAccessErr);
    let naks: Vec<_> = p
        .seen(Dir::BtoA)
        .iter()
        .filter_map(|s| s.syndrome)
        .collect();
    assert!(naks.contains(&Syndrome::Nak(NakCode::RemoteAccessError)));
    assert_eq!(p.b.state(), QpState::Err);
}

#[test]
fn window_rights_are_narrower_than_the_mr_s() {
    let mut p = Pair::new();
    // The MR itself allows remote writes; the window only reads.
    let mr = p.b.reg(
        MR_LEN,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND,
    );
    let (_, rkey) = bind_type2(&mut p, &mr, AccessFlags::REMOTE_READ);
    assert_eq!(
        write(&mut p, rkey, mr.iova + WIN_OFF, 8),
        WcStatus::RemAccessErr
    );
}

#[test]
fn local_invalidate_revokes_the_window() {
    let mut p = Pair::new();
    let mr = bindable(&mut p);
    let (_, rkey) = bind_type2(&mut p, &mr, AccessFlags::REMOTE_WRITE);
    p.post_b(&[SendWr::new(60, SendOp::LocalInv { rkey }, &[])]);
    assert!(p.run_until_idle());
    let wcs = p.b.send_wcs();
    assert_eq!(
        (wcs[0].status, wcs[0].opcode),
        (WcStatus::Success, WcOpcode::LocalInv)
    );
    assert!(
        p.seen(Dir::BtoA).is_empty(),
        "a local operation sends nothing"
    );
    assert_eq!(
        write(&mut p, rkey, mr.iova + WIN_OFF, 8),
        WcStatus::RemAccessErr
    );
}

#[test]
fn send_with_invalidate_carries_an_ieth_and_unbinds_at_the_responder() {
    let mut p = Pair::new();
    let mr = bindable(&mut p);
    let (_, rkey) = bind_type2(&mut p, &mr, AccessFlags::REMOTE_WRITE);
    let r = p.b.at(0, 64);
    p.b.post_recv(7, &[r]);
    let s = p.a.at(0, 32);
    let op = SendOp::SendWithInv {
        invalidate_rkey: rkey,
    };
    p.post_a(&[SendWr::new(1, op, &[s])]);
    assert!(p.run_until_idle());
    let out = p.seen(Dir::AtoB);
    assert_eq!(out.last().unwrap().opl().0, Opcode::SendOnlyWithInvalidate);
    assert_eq!(p.a.send_wcs()[0].opcode, WcOpcode::Send);
    let rwc = p.b.recv_wcs();
    assert_eq!(rwc[0].status, WcStatus::Success);
    assert!(rwc[0].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(rwc[0].invalidated_rkey, rkey);
    assert_eq!(
        write(&mut p, rkey, mr.iova + WIN_OFF, 8),
        WcStatus::RemAccessErr
    );
}

#[test]
fn send_with_invalidate_of_an_unknown_key_fails_the_receive() {
    let mut p = Pair::new();
    let r = p.b.at(0, 64);
    p.b.post_recv(7, &[r]);
    let s = p.a.at(0, 32);
    let op = SendOp::SendWithInv {
        invalidate_rkey: p.b.mr.rkey,
    };
    p.post_a(&[SendWr::new(1, op, &[s])]);
    assert!(p.run_until_idle());
    assert_eq!(p.b.recv_wcs()[0].status, WcStatus::RemInvReqErr);
    // The message itself was acknowledged (rxe's class J): the sender's WR succeeds.
    assert_eq!(p.a.send_wcs()[0].status, WcStatus::Success);
    assert!(p.seen(Dir::BtoA).iter().all(|s| !s.is_nak()));
    assert_eq!(p.b.state(), QpState::Err);
}

#[test]
fn bind_to_an_mr_without_mw_bind_is_a_bind_error() {
    let mut p = Pair::new();
    let (mw, key) = p.b.hca.alloc_mw(p.b.pd, MwType::Type2).unwrap();
    let mr = p.b.mr;
    let op = SendOp::BindMw {
        mw,
        rkey: inc_rkey(key),
        mr: mr.lkey,
        addr: mr.iova,
        length: 64,
        access: AccessFlags::REMOTE_READ,
    };
    p.post_b(&[SendWr::new(5, op, &[])]);
    assert!(p.run_until_idle());
    let wcs = p.b.send_wcs();
    assert_eq!(
        (wcs[0].status, wcs[0].opcode),
        (WcStatus::MwBindErr, WcOpcode::BindMw)
    );
    assert_eq!(p.b.state(), QpState::Err);
}

#[test]
fn remote_write_rights_need_the_mr_s_local_write() {
    let mut p = Pair::new();
    let mr =
        p.b.reg(MR_LEN, AccessFlags::MW_BIND | AccessFlags::REMOTE_READ);
    let (mw, key) = p.b.hca.alloc_mw(p.b.pd, MwType::Type2).unwrap();
    let op = SendOp::BindMw {
        mw,
        rkey: inc_rkey(key),
        mr: mr.lkey,
        addr: mr.iova,
        length: 64,
        access: AccessFlags::REMOTE_WRITE,
    };
    p.post_b(&[SendWr::new(5, op, &[])]);
    assert!(p.run_until_idle());
    assert_eq!(p.b.send_wcs()[0].status, WcStatus::MwBindErr);
}

#[test]
fn type1_bind_moves_the_key_and_zero_length_unbinds() {
    let mut p = Pair::new();
    let mr = bindable(&mut p);
    let (mw, key) = p.b.hca.alloc_mw(p.b.pd, MwType::Type1).unwrap();
    let bind = MwBind {
        wr_id: 70,
        flags: verbs_api::SendFlags::SIGNALED,
        mr: mr.lkey,
        addr: mr.iova + WIN_OFF,
        length: WIN_LEN,
        access: AccessFlags::REMOTE_WRITE,
    };
    let now = emu_proto::Instant::ZERO;
    let rkey = p.b.hca.bind_mw(now, p.b.qpn, mw, &bind).unwrap();
    assert_eq!(rkey, inc_rkey(key));
    assert_eq!(p.b.hca.mw_rkey(mw).unwrap(), rkey);
    assert!(p.run_until_idle());
    assert_eq!(p.b.send_wcs()[0].opcode, WcOpcode::BindMw);
    assert_eq!(write(&mut p, rkey, mr.iova + WIN_OFF, 8), WcStatus::Success);
    assert_eq!(
        write(&mut p, key, mr.iova + WIN_OFF, 8),
        WcStatus::RemAccessErr
    );

    let mut p = Pair::new();
    let mr = bindable(&mut p);
    let (mw, _) = p.b.hca.alloc_mw(p.b.pd, MwType::Type1).unwrap();
    let first =
        p.b.hca
            .bind_mw(
                now,
                p.b.qpn,
                mw,
                &MwBind {
                    mr: mr.lkey,
                    ..bind
                },
            )
            .unwrap();
    let unbind = MwBind { length: 0, ..bind };
    let second = p.b.hca.bind_mw(now, p.b.qpn, mw, &unbind).unwrap();
    assert_ne!(first, second);
    assert!(p.run_until_idle());
    assert_eq!(
        write(&mut p, second, mr.iova + WIN_OFF, 8),
        WcStatus::RemAccessErr
    );
}

#[test]
fn type1_windows_are_not_invalidated_locally() {
    let mut p = Pair::new();
    let (_, key) = p.b.hca.alloc_mw(p.b.pd, MwType::Type1).unwrap();
    p.post_b(&[SendWr::new(61, SendOp::LocalInv { rkey: key }, &[])]);
    assert!(p.run_until_idle());
    assert_eq!(p.b.send_wcs()[0].status, WcStatus::LocQpOpErr);
}

#[test]
fn bound_mr_cannot_be_deregistered_and_dealloc_revokes() {
    let mut p = Pair::new();
    let mr = bindable(&mut p);
    let (mw, rkey) = bind_type2(&mut p, &mr, AccessFlags::REMOTE_WRITE);
    assert_eq!(p.b.hca.dereg_mr(mr.lkey).unwrap_err().kind, ErrorKind::Busy);
    assert_eq!(
        p.b.hca.dealloc_pd(p.b.pd).unwrap_err().kind,
        ErrorKind::Busy
    );
    p.b.hca.dealloc_mw(mw).unwrap();
    assert_eq!(
        write(&mut p, rkey, mr.iova + WIN_OFF, 8),
        WcStatus::RemAccessErr
    );
    p.b.hca.dereg_mr(mr.lkey).unwrap();
}

#[test]
fn type2_bind_of_length_zero_is_a_bind_error() {
    let mut p = Pair::new();
    let mr = bindable(&mut p);
    let (mw, key) = p.b.hca.alloc_mw(p.b.pd, MwType::Type2).unwrap();
    let op = SendOp::BindMw {
        mw,
        rkey: inc_rkey(key),
        mr: mr.lkey,
        addr: mr.iova,
        length: 0,
        access: AccessFlags::REMOTE_WRITE,
    };
    p.post_b(&[SendWr::new(5, op, &[])]);
    assert!(p.run_until_idle());
    assert_eq!(p.b.send_wcs()[0].status, WcStatus::MwBindErr);
}

#[test]
fn type2_bind_of_a_bound_window_fails() {
    let mut p = Pair::new();
    let mr = bindable(&mut p);
    let (mw, rkey) = bind_type2(&mut p, &mr, AccessFlags::REMOTE_WRITE);
    let op = SendOp::BindMw {
        mw,
        rkey: inc_rkey(rkey),
        mr: mr.lkey,
        addr: mr.iova,
        length: 8,
        access: AccessFlags::REMOTE_WRITE,
    };
    p.post_b(&[SendWr::new(5, op, &[])]);
    assert!(p.run_until_idle());
    assert_eq!(p.b.send_wcs()[0].status, WcStatus::MwBindErr);
}
