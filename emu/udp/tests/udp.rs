//! The UDP driver over real sockets: two devices in one process on 127.0.0.x loopback
//! addresses with OS-chosen ports. Every wait is bounded and event-driven.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::*;
use emu_fault::{FaultPlan, corrupt, delay, duplicate};
use emu_proto::wire::{BthRepr, IpContext, Opcode, PacketRepr, Psn};
use emu_udp::{UdpProvider, oob};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use verbs_api::{
    CompletionChannel, CompletionQueue, Context, Device, MemoryRegion, ProtectionDomain, Provider,
    QpState, QueuePair, RcConnectOptions, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
};

#[test]
fn device_identity_comes_from_the_socket() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let devs = p.devices().unwrap();
    assert_eq!(p.name(), "udp");
    assert_eq!(devs[0].name(), "udp0");
    let ctx = devs[1].open().unwrap();
    let local = ctx.local_addr();
    assert_eq!(local.ip().to_string(), "127.0.0.2");
    assert_ne!(local.port(), 0);
    let gid = ctx.query_gid(1, 0).unwrap();
    assert_eq!(gid.to_string(), "::ffff:127.0.0.2");
    let info = ctx.socket_info();
    assert!(info.recv_buffer > 0 && info.send_buffer > 0, "{info:?}");
    eprintln!("socket buffers granted: {info:?}");
    let node = Node::new(ctx);
    let ep = node.qp.endpoint(7).unwrap();
    assert_eq!(ep.udp_port, local.port());
    assert_eq!(ep.gid, gid);
}

#[test]
fn bad_addresses_are_rejected() {
    let unspecified = UdpProvider::builder()
        .device(addr("0.0.0.0:0"))
        .build()
        .unwrap_err();
    assert_eq!(unspecified.kind, verbs_api::ErrorKind::InvalidArgument);
    let list = UdpProvider::builder().device_list("127.0.0.1:0, nonsense");
    assert_eq!(
        list.unwrap_err().kind,
        verbs_api::ErrorKind::InvalidArgument
    );
    // A port taken by another socket is an Io error, and nothing keeps running.
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let err = UdpProvider::builder()
        .device(taken.local_addr().unwrap())
        .build()
        .unwrap_err();
    assert_eq!(err.kind, verbs_api::ErrorKind::Io);
}

#[test]
fn send_recv_over_loopback() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let src = a.mr(8192);
    let dst = b.mr(8192);
    let msg = pattern(5000, 1);
    src.write(0, &msg).unwrap();
    b.qp.post_recv(&[RecvWr::new(9, &[dst.sge(0, 8192).unwrap()])])
        .unwrap();
    a.qp.post_send(&[SendWr::new(
        1,
        SendOp::SendWithImm { imm: 0xfeed },
        &[src.sge(0, msg.len()).unwrap()],
    )])
    .unwrap();
    let s = a.wc();
    assert_eq!(
        (s.wr_id, s.status, s.opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    let r = b.wc();
    assert_eq!(
        (r.wr_id, r.status, r.opcode),
        (9, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(r.byte_len as usize, msg.len());
    assert_eq!(r.imm_data, 0xfeed);
    let mut got = vec![0; msg.len()];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, msg);
    let sent = a.ctx.driver_stats();
    assert!(sent.datagrams_sent >= 2, "{sent:?}");
    assert!(b.qp.stats().unwrap().rcvd_pkts >= 2);
}

#[test]
fn two_devices_may_share_an_ip() {
    let p = provider(&["127.0.0.1:0", "127.0.0.1:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    assert_ne!(a.ctx.local_addr(), b.ctx.local_addr());
    let dst = b.mr(64);
    b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0, 64).unwrap()])])
        .unwrap();
    a.qp.post_send(&[SendWr::inline(2, SendOp::Send, b"same host, other port")])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(b.wc().byte_len, 21);
}

#[test]
fn a_device_reaches_itself_without_the_socket() {
    let p = provider(&["127.0.0.1:0"]);
    let ctx = p.devices().unwrap()[0].open().unwrap();
    let a = Node::new(ctx.clone());
    let b = Node::new(ctx.clone());
    connect(&a, &b, &RcConnectOptions::default());
    let src = a.mr(4096);
    let dst = b.mr(4096);
    src.write(0, &pattern(4096, 3)).unwrap();
    a.qp.post_send(&[SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
        },
        &[src.sge(0, 4096).unwrap()],
    )])
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let mut got = vec![0; 4096];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, pattern(4096, 3));
    let stats = ctx.driver_stats();
    assert!(stats.loopback >= 2, "{stats:?}");
    assert_eq!(stats.datagrams_sent, 0, "{stats:?}");
}

/// WRITEs `len` bytes from `a` to `b` in one work request and checks them.
fn write_and_verify(a: &Node, b: &Node, len: usize, seed: u8) {
    let src = a.mr(len);
    let dst = b.mr(len);
    let data = pattern(len, seed);
    src.write(0, &data).unwrap();
    a.qp.post_send(&[SendWr::new(
        7,
        SendOp::RdmaWrite {
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
        },
        &[src.sge(0, len).unwrap()],
    )])
    .unwrap();
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success), "{wc:?}");
    assert_eq!(wc.byte_len as usize, len);
    let mut got = vec![0; len];
    dst.read(0, &mut got).unwrap();
    assert!(got == data, "WRITE data differs");
}

#[test]
fn write_1mib_and_verify() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let opts = RcConnectOptions {
        path_mtu: verbs_api::Mtu::Mtu4096,
        ..RcConnectOptions::default()
    };
    let (a, b) = pair(&p, &opts);
    write_and_verify(&a, &b, 1 << 20, 5);
    let s = a.qp.stats().unwrap();
    assert!(s.sent_pkts >= 256, "{s:?}");
}

#[test]
fn read_remote_memory() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let len = 64 * 1024;
    let local = a.mr(len);
    let remote = b.mr(len);
    remote.write(0, &pattern(len, 9)).unwrap();
    a.qp.post_send(&[SendWr::new(
        3,
        SendOp::RdmaRead {
            remote_addr: remote.addr(),
            rkey: remote.rkey(),
        },
        &[local.sge(0, len).unwrap()],
    )])
    .unwrap();
    let wc = a.wc();
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    let mut got = vec![0; len];
    local.read(0, &mut got).unwrap();
    assert!(got == pattern(len, 9), "READ data differs");
}

#[test]
fn compare_swap_and_fetch_add() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let result = a.mr(16);
    let target = b.mr(16);
    target.write(8, &40u64.to_ne_bytes()).unwrap();
    let word = target.addr() + 8;
    a.qp.post_send(&[SendWr::new(
        1,
        SendOp::AtomicCmpAndSwp {
            remote_addr: word,
            rkey: target.rkey(),
            compare: 40,
            swap: 100,
        },
        &[result.sge(0, 8).unwrap()],
    )])
    .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    a.qp.post_send(&[SendWr::new(
        2,
        SendOp::AtomicFetchAndAdd {
            remote_addr: word,
            rkey: target.rkey(),
            add: 5,
        },
        &[result.sge(8, 8).unwrap()],
    )])
    .unwrap();
    let wc = a.wc();
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    let mut buf = [0u8; 16];
    result.read(0, &mut buf).unwrap();
    assert_eq!(u64::from_ne_bytes(buf[..8].try_into().unwrap()), 40);
    assert_eq!(u64::from_ne_bytes(buf[8..].try_into().unwrap()), 100);
    let mut now = [0u8; 8];
    target.read(8, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 105);
}

#[test]
fn write_survives_five_percent_loss() {
    let plan = FaultPlan::new(7).rule(emu_fault::drop(0.05));
    let p = UdpProvider::builder()
        .device(addr("127.0.0.1:0"))
        .device(addr("127.0.0.2:0"))
        .faults(plan)
        .build()
        .unwrap();
    let opts = RcConnectOptions {
        timeout: 12, // ~16.8 ms: tail losses recover quickly
        ..RcConnectOptions::default()
    };
    let (a, b) = pair(&p, &opts);
    write_and_verify(&a, &b, 256 * 1024, 11);
    let s = a.qp.stats().unwrap();
    assert!(
        s.retransmits_timeout + s.retransmits_nak > 0,
        "no retransmission under 5 % loss: {s:?}"
    );
    let lost: u64 = [&a, &b]
        .iter()
        .map(|n| n.ctx.fault_counters().unwrap().total().dropped)
        .sum();
    assert!(lost > 0);
    eprintln!("5 % loss: {lost} datagrams dropped, requester {s:?}");
}

#[test]
fn peer_shutdown_gives_retry_exceeded() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let opts = RcConnectOptions {
        timeout: 10, // ~4.2 ms
        retry_cnt: 3,
        ..RcConnectOptions::default()
    };
    let (a, b) = pair(&p, &opts);
    b.ctx.device().shutdown();
    let src = a.mr(4096);
    let dst = b.mr(4096);
    let start = Instant::now();
    a.qp.post_send(&[SendWr::new(
        5,
        SendOp::RdmaWrite {
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
        },
        &[src.sge(0, 4096).unwrap()],
    )])
    .unwrap();
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::RetryExcErr), "{wc:?}");
    let took = start.elapsed();
    // 4 transmissions × ~4.2 ms, far below a second even on a loaded machine.
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert_eq!(a.qp.state().unwrap(), QpState::Err);
    assert_eq!(a.qp.stats().unwrap().retry_exceeded_err, 1);
    // The shut-down device's socket is closed: its address can be bound again.
    UdpSocket::bind(b.ctx.local_addr()).unwrap();
}

#[test]
fn channel_fd_wakes_mio() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let dst = b.mr(64);
    b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0, 64).unwrap()])])
        .unwrap();
    b.cq.req_notify(false).unwrap();
    let mut poll = Poll::new().unwrap();
    let fd = b.ch.as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&fd), Token(7), Interest::READABLE)
        .unwrap();
    let mut events = Events::with_capacity(4);
    // Nothing yet: the fd is not readable.
    poll.poll(&mut events, Some(Duration::from_millis(20)))
        .unwrap();
    assert!(events.is_empty());
    a.qp.post_send(&[SendWr::inline(2, SendOp::Send, b"wake up")])
        .unwrap();
    let deadline = Instant::now() + WAIT;
    let mut woke = false;
    while !woke && Instant::now() < deadline {
        poll.poll(&mut events, Some(deadline - Instant::now()))
            .unwrap();
        woke = events
            .iter()
            .any(|e| e.token() == Token(7) && e.is_readable());
    }
    assert!(woke, "channel fd never became readable");
    assert_eq!(b.ch.get_cq_event().unwrap(), Some(b.cq.handle()));
    b.cq.ack_events(1);
    let mut wc = [verbs_api::WorkCompletion::default()];
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 1);
    assert_eq!(wc[0].byte_len, 7);
}

#[test]
fn idle_device_sleeps() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    // One exchange, so that timers were armed and disarmed once.
    let dst = b.mr(64);
    b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0, 64).unwrap()])])
        .unwrap();
    a.qp.post_send(&[SendWr::inline(2, SendOp::Send, b"x")])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(b.wc().status, WcStatus::Success);
    std::thread::sleep(Duration::from_millis(20));
    let before = [a.ctx.driver_stats().wakeups, b.ctx.driver_stats().wakeups];
    std::thread::sleep(Duration::from_millis(300));
    let after = [a.ctx.driver_stats().wakeups, b.ctx.driver_stats().wakeups];
    for (x, y) in before.iter().zip(&after) {
        assert!(y - x <= 3, "idle thread woke {} times in 300 ms", y - x);
    }
}

#[test]
fn busy_poll_mode_round_trip() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    a.ctx.set_busy_poll(true);
    assert!(a.ctx.busy_poll());
    // No application thread polls a: its progress thread spins.
    let before = a.ctx.driver_stats().wakeups;
    assert!(
        wait_until(WAIT, || a.ctx.driver_stats().wakeups > before + 100),
        "busy-poll thread does not spin"
    );
    let dst = b.mr(64);
    for i in 0..10 {
        b.qp.post_recv(&[RecvWr::new(i, &[dst.sge(0, 64).unwrap()])])
            .unwrap();
        a.qp.post_send(&[SendWr::inline(i, SendOp::Send, b"ping")])
            .unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        assert_eq!(b.wc().wr_id, i);
    }
    a.ctx.set_busy_poll(false);
    std::thread::sleep(Duration::from_millis(20));
    let before = a.ctx.driver_stats().wakeups;
    std::thread::sleep(Duration::from_millis(100));
    assert!(a.ctx.driver_stats().wakeups - before <= 3);
}

#[test]
fn malformed_datagrams_are_counted_and_dropped() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let target = b.ctx.local_addr();
    let before = b.ctx.device_stats();
    let rx_before = b.ctx.driver_stats().datagrams_received;
    let junk = UdpSocket::bind("127.0.0.3:0").unwrap();
    let mut bth_only = vec![0u8; 16];
    bth_only[0] = 0x04; // SEND_ONLY
    bth_only[7] = b.qp.qp_num() as u8;
    let garbage: [&[u8]; 5] = [&[], &[1, 2, 3], &[0xff; 100], &[0; 20_000], &bth_only];
    for g in garbage {
        junk.send_to(g, target).unwrap();
    }
    let counted = || {
        let after = b.ctx.device_stats();
        (after.icrc_errors + after.dropped) - (before.icrc_errors + before.dropped)
    };
    assert!(wait_until(WAIT, || counted() >= 5));
    assert_eq!(
        counted(),
        5,
        "before {before:?} after {:?}",
        b.ctx.device_stats()
    );
    assert_eq!(b.ctx.driver_stats().datagrams_received, rx_before + 5);
    // The device still works.
    let dst = b.mr(64);
    b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0, 64).unwrap()])])
        .unwrap();
    a.qp.post_send(&[SendWr::inline(2, SendOp::Send, b"still alive")])
        .unwrap();
    assert_eq!(b.wc().byte_len, 11);
}

#[test]
fn foreign_source_is_dropped_never_delivered() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let dst = b.mr(64);
    b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0, 64).unwrap()])])
        .unwrap();
    // A well-formed SEND with a valid ICRC for b's QP, but from 127.0.0.3, not a's address.
    let intruder = UdpSocket::bind("127.0.0.3:0").unwrap();
    let target = b.ctx.local_addr();
    let bth = BthRepr {
        ack_req: true,
        ..BthRepr::new(Opcode::SendOnly, b.qp.qp_num(), Psn::new(100))
    };
    let pkt = PacketRepr::new(bth, b"intruder");
    let ip = IpContext {
        dst_port: target.port(),
        ..IpContext::v4(
            "127.0.0.3".parse().unwrap(),
            "127.0.0.2".parse().unwrap(),
            intruder.local_addr().unwrap().port(),
        )
    };
    let mut buf = vec![0; pkt.buffer_len()];
    let n = pkt.emit(&ip, &mut buf).unwrap();
    let before = b.qp.stats().unwrap().dropped;
    intruder.send_to(&buf[..n], target).unwrap();
    assert!(wait_until(WAIT, || b.qp.stats().unwrap().dropped > before));
    assert_eq!(b.ctx.device_stats().icrc_errors, 0, "the ICRC was valid");
    let mut wc = [verbs_api::WorkCompletion::default()];
    assert_eq!(
        b.cq.poll(&mut wc).unwrap(),
        0,
        "a foreign packet was delivered"
    );
    // The real peer still gets through, with the PSN the intruder tried.
    a.qp.post_send(&[SendWr::inline(2, SendOp::Send, b"genuine")])
        .unwrap();
    assert_eq!(b.wc().byte_len, 7);
    let mut got = [0u8; 7];
    dst.read(0, &mut got).unwrap();
    assert_eq!(&got, b"genuine");
}

#[test]
fn fault_plans_change_at_run_time() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let dst = b.mr(64);
    let ping = |id: u64| {
        b.qp.post_recv(&[RecvWr::new(id, &[dst.sge(0, 64).unwrap()])])
            .unwrap();
        let start = Instant::now();
        a.qp.post_send(&[SendWr::inline(id, SendOp::Send, b"ping")])
            .unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        assert_eq!(b.wc().wr_id, id);
        start.elapsed()
    };
    // Delay everything a sends by 30 ms.
    let d = Duration::from_millis(30);
    a.ctx
        .set_faults(Some(FaultPlan::new(1).rule(delay(d..=d))))
        .unwrap();
    assert!(ping(1) >= d);
    assert!(a.ctx.fault_counters().unwrap().total().delayed >= 1);
    // Duplicate every request: the responder sees duplicates and ignores them.
    a.ctx
        .set_faults(Some(FaultPlan::new(2).rule(duplicate(1))))
        .unwrap();
    ping(2);
    write_and_verify(&a, &b, 32 * 1024, 4);
    assert!(b.qp.stats().unwrap().duplicate_request > 0);
    // Corrupt a third of what a sends: the receiver's ICRC check catches each one.
    a.ctx
        .set_faults(Some(FaultPlan::new(3).rule(corrupt(0.3))))
        .unwrap();
    write_and_verify(&a, &b, 64 * 1024, 6);
    assert!(b.ctx.device_stats().icrc_errors > 0);
    // Back to a clean path.
    a.ctx.set_faults(None).unwrap();
    assert!(a.ctx.fault_counters().is_none());
    assert!(ping(3) < d);
    // The posts above sent from this thread (through the fault stage), not only the progress
    // thread.
    assert!(a.ctx.driver_stats().inline_sends > 0);
}

#[test]
fn dropping_every_handle_stops_the_threads() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let addrs = [a.ctx.local_addr(), b.ctx.local_addr()];
    drop((a, b));
    // The provider still holds the devices: sockets stay bound.
    assert!(UdpSocket::bind(addrs[0]).is_err());
    drop(p);
    for addr in addrs {
        UdpSocket::bind(addr).unwrap();
    }
}

#[test]
fn destroyed_handles_fail() {
    let p = provider(&["127.0.0.1:0"]);
    let ctx = p.devices().unwrap()[0].open().unwrap();
    let n = Node::new(ctx);
    let mr = n.mr(64);
    assert_eq!(n.pd.destroy().unwrap_err().kind, verbs_api::ErrorKind::Busy);
    mr.destroy().unwrap();
    assert_eq!(
        mr.read(0, &mut [0]).unwrap_err().kind,
        verbs_api::ErrorKind::Destroyed
    );
    n.qp.destroy().unwrap();
    assert_eq!(
        n.qp.query().unwrap_err().kind,
        verbs_api::ErrorKind::Destroyed
    );
    assert_eq!(
        n.qp.stats().unwrap_err().kind,
        verbs_api::ErrorKind::Destroyed
    );
    n.cq.destroy().unwrap();
    assert_eq!(
        n.cq.poll(&mut []).unwrap_err().kind,
        verbs_api::ErrorKind::Destroyed
    );
}

#[test]
fn oob_connects_two_devices_with_one_call_each() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let devs = p.devices().unwrap();
    let server_ctx = devs[0].open().unwrap();
    let client_ctx = devs[1].open().unwrap();
    let listener = oob::listen(addr("127.0.0.1:0")).unwrap();
    let at = listener.local_addr().unwrap();
    let opts = oob::ConnectOptions {
        channel: true,
        ..oob::ConnectOptions::default()
    };
    let client = std::thread::spawn(move || {
        let mut conn = oob::connect_client(&client_ctx, at, &opts).unwrap();
        let mr = client_ctx.alloc_mr(&conn.pd, 4096, ALL).unwrap();
        mr.write(0, b"over tcp setup").unwrap();
        let remote = oob::exchange_mr(
            &mut conn.stream,
            &oob::RemoteMr {
                addr: 0,
                rkey: 0,
                len: 0,
            },
        )
        .unwrap();
        conn.qp
            .post_send(&[SendWr::new(
                1,
                SendOp::RdmaWrite {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                },
                &[mr.sge(0, 14).unwrap()],
            )])
            .unwrap();
        let wc = wait_wc(&conn.cq, conn.channel.as_ref().unwrap(), WAIT).unwrap();
        assert_eq!(wc.status, WcStatus::Success);
        oob::barrier(&mut conn.stream).unwrap();
    });
    let mut conn = oob::connect_server(&server_ctx, &listener, &opts).unwrap();
    assert_eq!(conn.remote.udp_port, devs[1].local_addr().port());
    let mr = server_ctx.alloc_mr(&conn.pd, 4096, ALL).unwrap();
    oob::exchange_mr(
        &mut conn.stream,
        &oob::RemoteMr {
            addr: mr.addr(),
            rkey: mr.rkey(),
            len: 4096,
        },
    )
    .unwrap();
    oob::barrier(&mut conn.stream).unwrap();
    client.join().unwrap();
    let mut got = [0u8; 14];
    mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"over tcp setup");
}

#[test]
fn oob_lines_are_checked() {
    let mr = oob::RemoteMr {
        addr: 0x7f00_1234,
        rkey: 0xabcd,
        len: 4096,
    };
    assert_eq!(mr.to_string().parse::<oob::RemoteMr>().unwrap(), mr);
    assert!("addr=1 rkey=2".parse::<oob::RemoteMr>().is_err());
    assert!(
        "addr=1 rkey=0x1ffffffff len=3"
            .parse::<oob::RemoteMr>()
            .is_err()
    );
    let listener = oob::listen(addr("127.0.0.1:0")).unwrap();
    let err = oob::accept(&listener, Duration::from_millis(30)).unwrap_err();
    assert_eq!(err.kind, verbs_api::ErrorKind::Io);
    let at = listener.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let mut s = oob::connect(at, WAIT).unwrap();
        oob::send_line(&mut s, "not an endpoint").unwrap();
        oob::recv_line(&mut s).unwrap()
    });
    let mut s = oob::accept(&listener, WAIT).unwrap();
    let local = verbs_api::Endpoint {
        qpn: 0x11,
        psn: 0,
        gid: verbs_api::Gid::from_ip("127.0.0.1".parse().unwrap()),
        udp_port: 4791,
    };
    assert_eq!(
        oob::exchange(&mut s, &local).unwrap_err().kind,
        verbs_api::ErrorKind::InvalidArgument
    );
    assert_eq!(
        peer.join().unwrap().parse::<verbs_api::Endpoint>().unwrap(),
        local
    );
}

#[test]
fn async_events_go_to_the_owning_context() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let (a, _b) = pair(&p, &RcConnectOptions::default());
    let other = a.ctx.device().open().unwrap();
    let attr = verbs_api::QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..verbs_api::QpAttr::default()
    };
    a.qp.modify(
        &attr,
        verbs_api::QpAttrMask::STATE | verbs_api::QpAttrMask::EN_SQD_ASYNC_NOTIFY,
    )
    .unwrap();
    let qpn = a.qp.qp_num();
    let drained = verbs_api::AsyncEvent {
        kind: verbs_api::AsyncEventKind::SqDrained,
        element: verbs_api::EventElement::Qp(qpn),
    };
    let mut got = None;
    assert!(wait_until(WAIT, || {
        got = a.ctx.poll_async_event();
        got.is_some()
    }));
    assert_eq!(got, Some(drained));
    assert_eq!(other.poll_async_event(), None);
}

#[test]
fn ipv6_loopback() {
    if UdpSocket::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback here: skipped");
        return;
    }
    let p = provider(&["[::1]:0", "[::1]:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    assert_eq!(a.ctx.query_gid(1, 0).unwrap().to_string(), "::1");
    write_and_verify(&a, &b, 16 * 1024, 8);
}

/// `next_completion` (written once in emu-device for every backend) waits on a UDP device
/// too: it polls, pausing between empty polls, until the peer's ACK completes the WRITE.
#[test]
fn next_completion_waits_for_the_peer() {
    let p = provider(&["127.0.0.1:0", "127.0.0.2:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let (src, dst) = (a.mr(64), b.mr(64));
    src.write(0, b"next").unwrap();
    let write = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    a.qp.post_send(&[SendWr::new(7, write, &[src.sge(0, 4).unwrap()])])
        .unwrap();
    let wc = a.cq.next_completion().unwrap();
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
    let mut got = [0u8; 4];
    dst.read(0, &mut got).unwrap();
    assert_eq!(&got, b"next");
    p.shutdown();
}
