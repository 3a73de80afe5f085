//! End-to-end smoke test of the in-process backend: every RC operation between two devices.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use emu_sim::SimProvider;
use verbs_api::{
    AccessFlags, CompletionQueue, Context, Device, MemoryRegion, Provider, QpCap, QpInitAttr,
    QueuePair, RcConnectOptions, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
    connect_rc,
};

fn poll_one<C: CompletionQueue>(cq: &C) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    for _ in 0..100 {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
    }
    panic!("no completion");
}

#[test]
fn every_rc_operation_between_two_devices() {
    let sim = SimProvider::builder().devices(2).build().unwrap();
    let devs = sim.devices().unwrap();
    let (a, b) = (devs[0].open().unwrap(), devs[1].open().unwrap());
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let pa = a.alloc_pd().unwrap();
    let pb = b.alloc_pd().unwrap();
    let ca = a.create_cq(64, None).unwrap();
    let cb = b.create_cq(64, None).unwrap();
    let qa = a
        .create_qp(&pa, &ca, &ca, None, &QpInitAttr::rc(cap))
        .unwrap();
    let qb = b
        .create_qp(&pb, &cb, &cb, None, &QpInitAttr::rc(cap))
        .unwrap();
    let ma = a.alloc_mr(&pa, 10_000, access).unwrap();
    let mb = b.alloc_mr(&pb, 10_000, access).unwrap();
    connect_rc(
        &qa,
        100,
        &qb.endpoint(0xFF_FFF0).unwrap(),
        &RcConnectOptions::default(),
    )
    .unwrap();
    connect_rc(
        &qb,
        0xFF_FFF0,
        &qa.endpoint(100).unwrap(),
        &RcConnectOptions::default(),
    )
    .unwrap();

    // RDMA WRITE of 5000 bytes (5 packets at MTU 1024).
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    ma.write(0, &data).unwrap();
    let sge = [ma.sge(0, 5000).unwrap()];
    qa.post_send(&[SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: mb.addr() + 100,
            rkey: mb.rkey(),
        },
        &sge,
    )])
    .unwrap();
    let wc = poll_one(&ca);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (1, WcStatus::Success, WcOpcode::RdmaWrite, 5000)
    );
    let mut got = vec![0u8; 5000];
    mb.read(100, &mut got).unwrap();
    assert_eq!(got, data);

    // SEND with immediate from b (PSN wraps past 2^24) into a's receive buffer.
    let rsge = [ma.sge(6000, 3000).unwrap()];
    qa.post_recv(&[RecvWr::new(7, &rsge)]).unwrap();
    mb.write(5200, b"hello over RC").unwrap();
    let ssge = [mb.sge(5200, 13).unwrap()];
    qb.post_send(&[SendWr::new(2, SendOp::SendWithImm { imm: 0xabcd }, &ssge)])
        .unwrap();
    let wc = poll_one(&cb);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    let wc = poll_one(&ca);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data),
        (7, WcStatus::Success, WcOpcode::Recv, 13, 0xabcd)
    );
    let mut got = [0u8; 13];
    ma.read(6000, &mut got).unwrap();
    assert_eq!(&got, b"hello over RC");

    // RDMA READ of 3000 bytes back.
    let dst = [ma.sge(7000, 3000).unwrap()];
    qa.post_send(&[SendWr::new(
        3,
        SendOp::RdmaRead {
            remote_addr: mb.addr() + 100,
            rkey: mb.rkey(),
        },
        &dst,
    )])
    .unwrap();
    let wc = poll_one(&ca);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (3, WcStatus::Success, WcOpcode::RdmaRead)
    );
    let mut got = vec![0u8; 3000];
    ma.read(7000, &mut got).unwrap();
    assert_eq!(got, data[..3000]);

    // Atomics on b's word at offset 8192.
    mb.write(8192, &40u64.to_ne_bytes()).unwrap();
    let res = [ma.sge(8, 8).unwrap()];
    qa.post_send(&[SendWr::new(
        4,
        SendOp::AtomicFetchAndAdd {
            remote_addr: mb.addr() + 8192,
            rkey: mb.rkey(),
            add: 2,
        },
        &res,
    )])
    .unwrap();
    let wc = poll_one(&ca);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (4, WcStatus::Success, WcOpcode::FetchAdd)
    );
    let mut word = [0u8; 8];
    ma.read(8, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 40);
    qa.post_send(&[SendWr::new(
        5,
        SendOp::AtomicCmpAndSwp {
            remote_addr: mb.addr() + 8192,
            rkey: mb.rkey(),
            compare: 42,
            swap: 7,
        },
        &res,
    )])
    .unwrap();
    assert_eq!(poll_one(&ca).status, WcStatus::Success);
    mb.read(8192, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 7);

    // Remote access error: bad rkey -> REM_ACCESS_ERR, QP to ERR.
    qa.post_send(&[SendWr::new(
        6,
        SendOp::RdmaWrite {
            remote_addr: mb.addr(),
            rkey: mb.rkey() ^ 0x100,
        },
        &sge,
    )])
    .unwrap();
    let wc = poll_one(&ca);
    assert_eq!((wc.wr_id, wc.status), (6, WcStatus::RemAccessErr));
    assert_eq!(qa.state().unwrap(), verbs_api::QpState::Err);
}
