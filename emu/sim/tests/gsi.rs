//! The GSI (QP1) on simulated devices: each device opens one, a MAD-sized datagram sent to a
//! peer's QP1 arrives with source QPN 1 and the sender's GID in the GRH, and a second open
//! is refused while the first is live.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use emu_sim::{SimContext, SimProvider};
use verbs_api::{
    AccessFlags, AddressHandle, AhAttr, CompletionQueue, Context, ErrorKind, GRH_LEN, MemoryRegion,
    QpCap, QpState, QueuePair, RecvWr, SendOp, SendWr, UdDest, WcStatus, WorkCompletion,
    init_ah_from_wc,
};

const GSI_QKEY: u32 = 0x8001_0000;

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

fn poll_one(cq: &<SimContext as Context>::Cq) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    for _ in 0..1000 {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
    }
    panic!("no completion");
}

#[test]
fn mad_to_the_peers_qp1_arrives_with_its_source() {
    let sim = SimProvider::builder().build().unwrap();
    let (a, b) = (sim.context(0).unwrap(), sim.context(1).unwrap());
    let open = |ctx: &SimContext| {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let qp = ctx.open_gsi(&pd, &cq, &cq, cap()).unwrap();
        let mr = ctx.alloc_mr(&pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        (pd, cq, qp, mr)
    };
    let (a_pd, a_cq, a_qp, a_mr) = open(&a);
    let (_b_pd, b_cq, b_qp, b_mr) = open(&b);
    assert_eq!((a_qp.qp_num(), b_qp.qp_num()), (1, 1));
    let attr = a_qp.query().unwrap();
    assert_eq!((attr.qp_state, attr.qkey), (QpState::Rts, GSI_QKEY));
    let again = a.open_gsi(&a_pd, &a_cq, &a_cq, cap()).unwrap_err();
    assert_eq!(again.kind, ErrorKind::Busy);

    let sge = [b_mr.sge(0, GRH_LEN + 256).unwrap()];
    b_qp.post_recv(&[RecvWr::new(7, &sge)]).unwrap();
    let ep = b_qp.endpoint(0).unwrap();
    let ah = a
        .create_ah(
            &a_pd,
            &AhAttr {
                dgid: ep.gid,
                udp_dport: ep.udp_port,
                ..AhAttr::default()
            },
        )
        .unwrap();
    let mad: Vec<u8> = (0..256u32).map(|i| (i * 3) as u8).collect();
    a_mr.write(0, &mad).unwrap();
    let sge = [a_mr.sge(0, 256).unwrap()];
    let dest = UdDest {
        ah: ah.handle(),
        remote_qpn: 1,
        remote_qkey: GSI_QKEY,
    };
    a_qp.post_send(&[SendWr::new(1, SendOp::Send, &sge).with_ud(dest)])
        .unwrap();
    assert_eq!(poll_one(&a_cq).status, WcStatus::Success);
    let wc = poll_one(&b_cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.src_qp, wc.qp_num),
        (7, WcStatus::Success, 1, 1)
    );
    let mut grh = [0u8; GRH_LEN];
    b_mr.read(0, &mut grh).unwrap();
    let back = init_ah_from_wc(&wc, &grh, 1).unwrap();
    assert_eq!(back.dgid, a.query_gid(1, 0).unwrap());
    let mut got = vec![0u8; 256];
    b_mr.read(GRH_LEN, &mut got).unwrap();
    assert_eq!(got, mad);

    // Closing the GSI lets it be opened again.
    a_qp.destroy().unwrap();
    assert_eq!(a.open_gsi(&a_pd, &a_cq, &a_cq, cap()).unwrap().qp_num(), 1);
}
