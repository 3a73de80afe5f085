//! Batching on the UDP path: GSO sends (`UdpBuilder::gso`), GRO receives (on by default,
//! `UdpBuilder::gro`) and `recvmmsg`. The same data arrives whatever the strategy; the driver's
//! counters tell how many system calls it took.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use emu_fault::FaultPlan;
use emu_udp::{DriverStats, UdpProvider};
use verbs_api::{
    Device, MemoryRegion, Mtu, Provider, QueuePair, RcConnectOptions, SendOp, SendWr, WcStatus,
};

const MIB: usize = 1 << 20;

fn mtu4096() -> RcConnectOptions {
    RcConnectOptions {
        path_mtu: Mtu::Mtu4096,
        ..RcConnectOptions::default()
    }
}

/// WRITEs `len` bytes of pattern `seed` from `a` to `b` and returns what arrived.
fn write(a: &Node, b: &Node, len: usize, seed: u8) -> Vec<u8> {
    let src = a.mr(len);
    let dst = b.mr(len);
    src.write(0, &pattern(len, seed)).unwrap();
    let op = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    a.qp.post_send(&[SendWr::new(1, op, &[src.sge(0, len).unwrap()])])
        .unwrap();
    let wc = a.wc();
    assert_eq!((wc.status, wc.byte_len as usize), (WcStatus::Success, len));
    let mut got = vec![0; len];
    dst.read(0, &mut got).unwrap();
    got
}

fn delta(after: DriverStats, before: DriverStats) -> [u64; 6] {
    [
        after.datagrams_sent - before.datagrams_sent,
        after.send_syscalls - before.send_syscalls,
        after.gso_sends - before.gso_sends,
        after.datagrams_received - before.datagrams_received,
        after.recv_syscalls - before.recv_syscalls,
        after.gro_receives - before.gro_receives,
    ]
}

#[test]
fn gso_on_and_off_deliver_identical_data_for_a_1mib_write() {
    let mut arrived = Vec::new();
    for gso in [false, true] {
        let p = UdpProvider::builder()
            .device(addr("127.0.0.81:0"))
            .device(addr("127.0.0.82:0"))
            .gso(gso)
            .build()
            .unwrap();
        let (a, b) = pair(&p, &mtu4096());
        let info = a.ctx.socket_info();
        assert_eq!(info.gso_enabled, gso && info.gso_segments > 1, "{info:?}");
        let (a0, b0) = (a.ctx.driver_stats(), b.ctx.driver_stats());
        let got = write(&a, &b, MIB, 9);
        assert!(got == pattern(MIB, 9), "WRITE data differs (GSO {gso})");
        arrived.push(got);
        let [sent, send_calls, gso_sends, ..] = delta(a.ctx.driver_stats(), a0);
        let [.., received, recv_calls, gro] = delta(b.ctx.driver_stats(), b0);
        eprintln!(
            "1 MiB WRITE, MTU 4096, GSO {}: requester sent {sent} datagrams in {send_calls} send \
             calls ({gso_sends} GSO); responder received {received} datagrams in {recv_calls} \
             receive calls ({gro} GRO buffers)",
            if gso { "on" } else { "off" },
        );
        assert!(sent >= 256 && received >= 256);
        assert_eq!(a.ctx.driver_stats().gso_refused, 0);
        if !gso {
            assert_eq!(gso_sends, 0);
            assert!(send_calls >= sent);
        } else if info.gso_segments > 1 {
            assert!(gso_sends > 0);
            assert!(send_calls < sent, "{send_calls} calls for {sent} datagrams");
            assert!(a.ctx.socket_info().gso_enabled);
        } else {
            eprintln!("SKIP GSO counters: this kernel has no UDP GSO");
        }
    }
    assert!(arrived[0] == arrived[1]);
}

#[test]
fn gso_sends_reach_a_receiver_without_gro() {
    let pa = UdpProvider::builder()
        .device(addr("127.0.0.83:0"))
        .gso(true)
        .build()
        .unwrap();
    let pb = UdpProvider::builder()
        .device(addr("127.0.0.84:0"))
        .gro(false)
        .build()
        .unwrap();
    let a = Node::new(pa.devices().unwrap()[0].open().unwrap());
    let b = Node::new(pb.devices().unwrap()[0].open().unwrap());
    assert!(!b.ctx.socket_info().gro_enabled);
    connect(&a, &b, &mtu4096());
    let before = b.ctx.driver_stats();
    assert!(write(&a, &b, 256 * 1024, 3) == pattern(256 * 1024, 3));
    let after = b.ctx.driver_stats();
    assert_eq!(after.gro_receives, before.gro_receives);
    // The kernel cut every GSO send into datagrams for b.
    assert!(after.datagrams_received - before.datagrams_received >= 64);
}

#[test]
fn default_sockets_batch_receives_and_keep_df() {
    let p = provider(&["127.0.0.85:0"]);
    let info = p.devices().unwrap()[0].socket_info();
    assert!(!info.gso_enabled, "GSO is opt-in: {info:?}");
    assert!(info.dont_fragment_forced, "{info:?}");
    assert!(info.gso_segments >= 1);
    assert!(info.recv_batch > 1, "recvmmsg: {info:?}");
    eprintln!("default socket: {info:?}");
}

#[test]
fn gso_runs_are_cut_after_send_faults_and_captured_packet_by_packet() {
    let path = std::env::temp_dir().join(format!("softverbs-gso-{}.pcap", std::process::id()));
    let p = UdpProvider::builder()
        .device(addr("127.0.0.86:0"))
        .device(addr("127.0.0.87:0"))
        .gso(true)
        .faults(FaultPlan::new(11).rule(emu_fault::drop(0.02)))
        .capture(&path)
        .build()
        .unwrap();
    let opts = RcConnectOptions {
        timeout: 12,
        ..mtu4096()
    };
    let (a, b) = pair(&p, &opts);
    assert!(write(&a, &b, 256 * 1024, 4) == pattern(256 * 1024, 4));
    rc_exchange(&a, &b);
    p.shutdown();
    p.finish_capture().unwrap();
    let (sa, sb) = (a.ctx.driver_stats(), b.ctx.driver_stats());
    assert_eq!(
        sa.captured + sb.captured,
        sa.datagrams_sent + sb.datagrams_sent
    );
    if tshark::available("tshark") {
        let ports = [a.ctx.local_addr().port(), b.ctx.local_addr().port()];
        let frames = tshark::decode(&path, &ports);
        assert_eq!(frames.len() as u64, sa.captured + sb.captured);
        // Every frame is one RoCEv2 packet, at most one MTU of payload.
        assert!(frames.iter().all(|f| f.payload.len() <= 4096 + 64));
    }
    std::fs::remove_file(&path).unwrap();
}
