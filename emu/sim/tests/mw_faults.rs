//! Fault injection around memory windows (issue 23): remote access through a type 2 window
//! while the window's owner invalidates it. Requests held on the wire arrive after a LOCAL_INV
//! and are refused; a WRITE whose FIRST packet was accepted before the invalidation has the rest
//! of its packets refused (the window is re-checked on every packet), so nothing lands past the
//! invalidation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use emu_sim::fault::{FaultPlan, NodeId, OpcodeClass, hold};
use emu_sim::{PairOptions, SimPair, SimProvider};
use verbs_api::{
    AccessFlags, Context, MemoryRegion, MemoryWindow, Mtu, MwType, QpState, QueuePair,
    RcConnectOptions, SendOp, SendWr, WcOpcode, WcStatus, inc_rkey,
};

const A: NodeId = NodeId(0);
const WIN_OFF: usize = 4096;
const WIN_LEN: usize = 8192;

/// A pair at MTU 1024 whose MRs allow MW_BIND, under `plan`.
fn pair(plan: FaultPlan) -> SimPair {
    let sim = SimProvider::builder().faults(plan).build().unwrap();
    let opts = PairOptions {
        rc: RcConnectOptions {
            path_mtu: Mtu::Mtu1024,
            ..RcConnectOptions::default()
        },
        mr_access: PairOptions::default().mr_access | AccessFlags::MW_BIND,
        ..PairOptions::default()
    };
    sim.connect_pair(opts).unwrap()
}

/// Binds a type 2 window of b over `WIN_LEN` bytes at `WIN_OFF` of its MR; returns its R_Key.
fn bind_window(p: &SimPair) -> (emu_sim::SimMw, u32) {
    let mw = p.b.alloc_mw(&p.pd_b, MwType::Type2).unwrap();
    let rkey = inc_rkey(mw.rkey());
    let op = SendOp::BindMw {
        mw: mw.handle(),
        rkey,
        mr: p.mr_b.lkey(),
        addr: p.mr_b.addr() + WIN_OFF as u64,
        length: WIN_LEN as u64,
        access: AccessFlags::REMOTE_WRITE,
    };
    p.qp_b.post_send(&[SendWr::new(1, op, &[])]).unwrap();
    let wc = p.cq_b.next_completion().unwrap();
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    (mw, rkey)
}

/// b invalidates `rkey` locally and sees the LOCAL_INV complete.
fn invalidate(p: &SimPair, rkey: u32) {
    p.qp_b
        .post_send(&[SendWr::new(2, SendOp::LocalInv { rkey }, &[])])
        .unwrap();
    let wc = p.cq_b.next_completion().unwrap();
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::LocalInv)
    );
}

/// a writes `len` bytes of 0xAB at the window's start under `rkey`.
fn write(p: &SimPair, rkey: u32, len: usize) {
    p.mr_a.write(0, &vec![0xAB; len]).unwrap();
    let sge = [p.mr_a.sge(0, len).unwrap()];
    let op = SendOp::RdmaWrite {
        remote_addr: p.mr_b.addr() + WIN_OFF as u64,
        rkey,
    };
    p.qp_a.post_send(&[SendWr::new(7, op, &sge)]).unwrap();
}

fn b_bytes(p: &SimPair, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    p.mr_b.read(off, &mut v).unwrap();
    v
}

#[test]
fn held_write_arriving_after_local_invalidate_is_refused() {
    let p = pair(FaultPlan::new(41).rule(hold().from(A).opcode_class(OpcodeClass::Requests)));
    let (_mw, rkey) = bind_window(&p);
    write(&p, rkey, 3000);
    assert!(p.sim.pending_datagrams() > 0, "the WRITE is held");
    invalidate(&p, rkey);
    p.sim.release_held();
    let wc = p.cq_a.next_completion().unwrap();
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::RemAccessErr));
    assert_eq!(b_bytes(&p, WIN_OFF, 3000), vec![0; 3000], "nothing landed");
    assert_eq!(p.qp_b.state().unwrap(), QpState::Err);
}

#[test]
fn invalidation_between_first_and_last_packet_stops_the_write() {
    // The WRITE's FIRST packet passes; its MIDDLE and LAST packets wait on the wire while b
    // invalidates the window.
    let p = pair(
        FaultPlan::new(42).rule(
            hold()
                .from(A)
                .opcode_class(OpcodeClass::Requests)
                .after_nth(1),
        ),
    );
    let (_mw, rkey) = bind_window(&p);
    write(&p, rkey, 3000);
    assert_eq!(b_bytes(&p, WIN_OFF, 1024), vec![0xAB; 1024], "FIRST landed");
    invalidate(&p, rkey);
    p.sim.release_held();
    let wc = p.cq_a.next_completion().unwrap();
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::RemAccessErr));
    assert_eq!(
        b_bytes(&p, WIN_OFF + 1024, 3000 - 1024),
        vec![0; 3000 - 1024],
        "nothing landed after the invalidation"
    );
}

#[test]
fn write_completed_before_invalidation_stays_and_later_ones_fail() {
    let p = pair(FaultPlan::new(43));
    let (_mw, rkey) = bind_window(&p);
    write(&p, rkey, 2048);
    let wc = p.cq_a.next_completion().unwrap();
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
    invalidate(&p, rkey);
    write(&p, rkey, 16);
    let wc = p.cq_a.next_completion().unwrap();
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::RemAccessErr));
    assert_eq!(b_bytes(&p, WIN_OFF, 2048), vec![0xAB; 2048]);
}
