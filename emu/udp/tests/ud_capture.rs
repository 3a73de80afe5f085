//! UD over real UDP sockets (issue 15): datagrams both ways between two devices, captured to a
//! pcap file that decodes in tshark as RoCEv2 UD (`UD_SEND_ONLY` and
//! `UD_SEND_ONLY_WITH_IMMEDIATE`) with the DETH's Q_Key and source QP, nothing malformed and a
//! valid ICRC.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::Instant;

use common::*;
use emu_udp::{UdpContext, UdpCq, UdpMr, UdpPd, UdpQp};
use verbs_api::{
    AccessFlags, AddressHandle, AhAttr, CompletionQueue, Context, Device, GRH_LEN, MemoryRegion,
    Provider, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QueuePair, RecvWr, SendOp, SendWr,
    UdDest, WcFlags, WcStatus, WorkCompletion,
};

const QKEY: u32 = 0x2222_3333;

struct Ud {
    ctx: UdpContext,
    pd: UdpPd,
    cq: UdpCq,
    qp: UdpQp,
    mr: UdpMr,
}

fn ud(ctx: UdpContext) -> Ud {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = ctx
        .create_qp(&pd, &cq, &cq, None, &QpInitAttr::ud(cap))
        .unwrap();
    let attr = |state| QpAttr {
        qp_state: state,
        qkey: QKEY,
        port_num: 1,
        ..QpAttr::default()
    };
    use QpAttrMask as M;
    qp.modify(
        &attr(QpState::Init),
        M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
    )
    .unwrap();
    qp.modify(&attr(QpState::Rtr), M::STATE).unwrap();
    qp.modify(&attr(QpState::Rts), M::STATE | M::SQ_PSN)
        .unwrap();
    let mr = ctx.alloc_mr(&pd, 8192, AccessFlags::LOCAL_WRITE).unwrap();
    Ud {
        ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

impl Ud {
    /// Sends `data` to `to` (with immediate `imm` if some) and waits for both completions.
    fn send_to(&self, to: &Ud, data: &[u8], imm: Option<u32>) -> WorkCompletion {
        let ep = to.qp.endpoint(0).unwrap();
        let ah = self
            .ctx
            .create_ah(
                &self.pd,
                &AhAttr {
                    dgid: ep.gid,
                    udp_dport: ep.udp_port,
                    ..AhAttr::default()
                },
            )
            .unwrap();
        let rsge = [to.mr.sge(4096, 1024).unwrap()];
        to.qp.post_recv(&[RecvWr::new(9, &rsge)]).unwrap();
        self.mr.write(0, data).unwrap();
        let sge = [self.mr.sge(0, data.len()).unwrap()];
        let op = imm.map_or(SendOp::Send, |imm| SendOp::SendWithImm { imm });
        let dest = UdDest {
            ah: ah.handle(),
            remote_qpn: to.qp.qp_num(),
            remote_qkey: QKEY,
        };
        self.qp
            .post_send(&[SendWr::new(1, op, &sge).with_ud(dest)])
            .unwrap();
        assert_eq!(poll(&self.cq).status, WcStatus::Success);
        let wc = poll(&to.cq);
        let mut got = vec![0; data.len()];
        to.mr.read(4096 + GRH_LEN, &mut got).unwrap();
        assert_eq!(got, data);
        wc
    }
}

fn poll(cq: &UdpCq) -> WorkCompletion {
    let start = Instant::now();
    let mut wc = [WorkCompletion::default(); 1];
    while start.elapsed() < WAIT {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        std::thread::yield_now();
    }
    panic!("no completion in {WAIT:?}");
}

#[test]
fn ud_datagrams_cross_sockets_and_decode_in_tshark_with_deth_fields() {
    let path = std::env::temp_dir().join(format!("softverbs-ud-{}.pcap", std::process::id()));
    let p = emu_udp::UdpProvider::builder()
        .device(addr("127.0.0.81:0"))
        .device(addr("127.0.0.82:0"))
        .capture(&path)
        .build()
        .unwrap();
    let devs = p.devices().unwrap();
    let a = ud(devs[0].open().unwrap());
    let b = ud(devs[1].open().unwrap());
    let wc = a.send_to(&b, b"over the socket", None);
    assert_eq!(wc.src_qp, a.qp.qp_num());
    assert_eq!(wc.wc_flags, WcFlags::GRH);
    let wc = b.send_to(&a, b"and back, with an immediate", Some(0xABCD_0123));
    assert_eq!(wc.src_qp, b.qp.qp_num());
    assert_eq!(wc.imm_data, 0xABCD_0123);
    let (pa, pb) = (a.ctx.local_addr(), b.ctx.local_addr());
    let (qa, qb) = (a.qp.qp_num(), b.qp.qp_num());
    drop((a, b));
    p.shutdown();
    p.finish_capture().unwrap();
    if tshark::available("tshark") {
        let decoded = tshark::decode(&path, &[pa.port(), pb.port()]);
        let ops: Vec<u8> = decoded.iter().map(|f| f.opcode).collect();
        assert_eq!(
            ops,
            [0x64, 0x65],
            "UD SEND_ONLY, then SEND_ONLY_WITH_IMMEDIATE"
        );
        let mut cmd = Command::new("tshark");
        cmd.arg("-n").arg("-r").arg(&path);
        for port in [pa.port(), pb.port()] {
            cmd.args(["-d", &format!("udp.port=={port},infiniband")]);
        }
        cmd.args(["-T", "fields", "-E", "separator=|"]);
        for f in [
            "infiniband.bth.destqp",
            "infiniband.deth.q_key",
            "infiniband.deth.srcqp",
        ] {
            cmd.args(["-e", f]);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let rows: Vec<Vec<u32>> = text
            .lines()
            .map(|l| l.split('|').map(parse_num).collect())
            .collect();
        assert_eq!(rows, [vec![qb, QKEY, qa], vec![qa, QKEY, qb]], "{text}");
    }
    std::fs::remove_file(&path).unwrap();
}

/// A tshark number: decimal or `0x` hex.
fn parse_num(s: &str) -> u32 {
    match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}
