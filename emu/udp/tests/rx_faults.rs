//! Receive-side faults: a device judges what it reads from its socket with its own injector, so
//! faults apply even when the peer injects none (a real RoCEv2 NIC, rxe, another provider).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use emu_fault::{FaultPlan, Link, NodeId, corrupt, delay, duplicate, hold};
use emu_udp::UdpProvider;
use verbs_api::{
    Device, MemoryRegion, Provider, QueuePair, RcConnectOptions, RecvWr, SendOp, SendWr, WcOpcode,
    WcStatus,
};

/// A device of its own provider (so the two sides share no configuration).
fn lone(addr_: &str, builder: emu_udp::UdpBuilder) -> (UdpProvider, Node) {
    let p = builder.device(addr(addr_)).build().unwrap();
    let ctx = p.devices().unwrap()[0].open().unwrap();
    (p, Node::new(ctx))
}

fn write(a: &Node, b: &Node, len: usize, seed: u8, wr_id: u64) {
    let src = a.mr(len);
    let dst = b.mr(len);
    let data = pattern(len, seed);
    src.write(0, &data).unwrap();
    let op = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    a.qp.post_send(&[SendWr::new(wr_id, op, &[src.sge(0, len).unwrap()])])
        .unwrap();
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success), "{wc:?}");
    let mut got = vec![0; len];
    dst.read(0, &mut got).unwrap();
    assert!(got == data, "WRITE data differs");
}

fn send(a: &Node, b: &Node, msg: &[u8], wr_id: u64) {
    let dst = b.mr(msg.len().max(1));
    let src = a.mr(msg.len().max(1));
    src.write(0, msg).unwrap();
    b.qp.post_recv(&[RecvWr::new(wr_id, &[dst.sge(0, msg.len()).unwrap()])])
        .unwrap();
    a.qp.post_send(&[SendWr::new(
        wr_id,
        SendOp::Send,
        &[src.sge(0, msg.len()).unwrap()],
    )])
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!((r.wr_id, r.status), (wr_id, WcStatus::Success), "{r:?}");
    assert_eq!(r.byte_len as usize, msg.len());
    let mut got = vec![0; msg.len()];
    dst.read(0, &mut got).unwrap();
    assert!(got == msg, "SEND data differs");
}

#[test]
fn rc_completes_through_thirty_percent_receive_loss_from_a_clean_peer() {
    // a injects nothing; b drops 30 % of what it reads from its socket.
    let (_pa, a) = lone("127.0.0.61:0", UdpProvider::builder());
    let plan = FaultPlan::new(0x5eed).rule(emu_fault::drop(0.3));
    let (_pb, b) = lone(
        "127.0.0.62:0",
        UdpProvider::builder()
            .first_node(NodeId(1))
            .peer_node(a.ctx.local_addr(), NodeId(0))
            .rx_faults(plan),
    );
    let opts = RcConnectOptions {
        path_mtu: verbs_api::Mtu::Mtu4096,
        timeout: 12, // ~16.8 ms: losses at the tail of a burst recover quickly
        ..RcConnectOptions::default()
    };
    connect(&a, &b, &opts);

    write(&a, &b, 64 * 1024, 3, 1);
    send(&a, &b, &pattern(6000, 4), 2);
    // READ: the request crosses the lossy receive path, the responses come back clean.
    let local = a.mr(16 * 1024);
    let remote = b.mr(16 * 1024);
    remote.write(0, &pattern(16 * 1024, 5)).unwrap();
    let read = SendOp::RdmaRead {
        remote_addr: remote.addr(),
        rkey: remote.rkey(),
    };
    a.qp.post_send(&[SendWr::new(3, read, &[local.sge(0, 16 * 1024).unwrap()])])
        .unwrap();
    let wc = a.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (3, WcStatus::Success, WcOpcode::RdmaRead)
    );
    let mut got = vec![0; 16 * 1024];
    local.read(0, &mut got).unwrap();
    assert!(got == pattern(16 * 1024, 5), "READ data differs");

    assert!(a.ctx.fault_counters().is_none() && a.ctx.rx_fault_counters().is_none());
    assert!(
        b.ctx.fault_counters().is_none(),
        "b judges nothing it sends"
    );
    let rx = b.ctx.rx_fault_counters().unwrap();
    let link = rx.link(Link::new(NodeId(0), NodeId(1)));
    assert!(link.dropped > 0, "{rx:?}");
    assert_eq!(rx.total(), link, "every datagram b read came from node 0");
    let s = a.qp.stats().unwrap();
    assert!(s.retransmits_timeout + s.retransmits_nak > 0, "{s:?}");
    eprintln!("30 % receive loss: {link:?}; requester {s:?}");
}

#[test]
fn receive_faults_change_at_run_time() {
    let p = provider(&["127.0.0.63:0", "127.0.0.64:0"]);
    let opts = RcConnectOptions {
        timeout: 12,
        ..RcConnectOptions::default()
    };
    let (a, b) = pair(&p, &opts);
    assert!(b.ctx.rx_fault_counters().is_none());

    // The same TOML plans as the send side: lose the first datagram b reads.
    let plan = FaultPlan::from_toml("seed = 1\n[[rule]]\naction = \"drop\"\nnth = 1\n").unwrap();
    b.ctx.set_rx_faults(Some(plan)).unwrap();
    send(&a, &b, b"lost once, then retransmitted", 1);
    let rx = b.ctx.rx_fault_counters().unwrap().total();
    assert_eq!(rx.dropped, 1, "{rx:?}");
    assert!(a.qp.stats().unwrap().retransmits_timeout >= 1);

    // Duplicate everything b reads: its responder sees each request twice.
    let before = b.qp.stats().unwrap().duplicate_request;
    b.ctx
        .set_rx_faults(Some(FaultPlan::new(2).rule(duplicate(1))))
        .unwrap();
    write(&a, &b, 8 * 1024, 6, 2);
    assert!(b.qp.stats().unwrap().duplicate_request > before);
    assert!(b.ctx.rx_fault_counters().unwrap().total().duplicated > 0);

    // Delay: the datagram reaches the engine later, from the progress thread's timer.
    let d = Duration::from_millis(5);
    b.ctx
        .set_rx_faults(Some(FaultPlan::new(3).rule(delay(d..=d))))
        .unwrap();
    send(&a, &b, b"late", 3);
    assert!(b.ctx.rx_fault_counters().unwrap().total().delayed >= 1);

    // Corruption is caught by b's own ICRC check.
    let icrc_before = b.ctx.device_stats().icrc_errors;
    b.ctx
        .set_rx_faults(Some(FaultPlan::new(4).rule(corrupt(1.0).nth(1))))
        .unwrap();
    send(&a, &b, b"one flipped bit", 4);
    assert_eq!(b.ctx.device_stats().icrc_errors, icrc_before + 1);

    // Hold everything b reads until released; the requester's retransmissions are held too.
    b.ctx
        .set_rx_faults(Some(FaultPlan::new(5).rule(hold())))
        .unwrap();
    let dst = b.mr(64);
    b.qp.post_recv(&[RecvWr::new(5, &[dst.sge(0, 64).unwrap()])])
        .unwrap();
    a.qp.post_send(&[SendWr::inline(5, SendOp::Send, b"held")])
        .unwrap();
    assert!(wait_until(WAIT, || {
        b.ctx.rx_fault_counters().unwrap().total().held >= 1
    }));
    b.ctx.release_held();
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(b.wc().wr_id, 5);

    // Cleared: nothing is judged any more.
    b.ctx.set_rx_faults(None).unwrap();
    assert!(b.ctx.rx_fault_counters().is_none());
    write(&a, &b, 4096, 7, 6);
    assert!(b.ctx.rx_fault_counters().is_none());
    // An invalid plan is refused and leaves the old (no) plan in place.
    let bad = FaultPlan::new(6).rule(emu_fault::drop(2.0));
    let err = b.ctx.set_rx_faults(Some(bad)).unwrap_err();
    assert_eq!(err.kind, verbs_api::ErrorKind::InvalidArgument);
    assert!(b.ctx.rx_fault_counters().is_none());
}

#[test]
fn an_invalid_receive_plan_fails_the_build() {
    let err = UdpProvider::builder()
        .device(addr("127.0.0.65:0"))
        .rx_faults(FaultPlan::new(1).rule(emu_fault::drop(-1.0)))
        .build()
        .unwrap_err();
    assert_eq!(err.kind, verbs_api::ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("receive-side"), "{err}");
}
