//! `softverbs_open_gsi` through the exported entry points, called in-process the way the
//! rdma_cm drop-in calls it: two devices on 127.0.95.1 and 127.0.95.2, each opens its GSI (a
//! UD `ibv_qp` numbered 1, in RTS, Q_Key 0x8001_0000), a MAD goes from one QP1 to the other
//! and arrives with source QPN 1 and the sender's address in the GRH; a second open is
//! `EBUSY`, bad arguments `EINVAL`, `ibv_destroy_qp` closes it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::undocumented_unsafe_blocks
)]

use std::ptr::null_mut;

mod common;

use common::errno;
use ibverbs_sys::*;
use softverbs_ibverbs::device::*;
use softverbs_ibverbs::objects::*;
use softverbs_ibverbs::qp::*;

const ADDRS: &str = "127.0.95.1,127.0.95.2";
const GRH: usize = 40;
const MAD: usize = 256;
const BUF: usize = 4096;
const GSI_QKEY: u32 = 0x8001_0000;
const SIGNALED: u32 = 2;

struct Node {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    buf: Box<[u8; BUF]>,
    mr: *mut ibv_mr,
}

impl Node {
    fn new(i: usize) -> Node {
        let ctx = common::open(ADDRS, i);
        unsafe {
            let pd = ibv_alloc_pd(ctx);
            let mut buf = Box::new([0u8; BUF]);
            let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), BUF, 1);
            let cq = ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0);
            assert!(!pd.is_null() && !mr.is_null() && !cq.is_null());
            let qp = softverbs_open_gsi(pd, cq, cq, 8, 8);
            assert!(!qp.is_null(), "softverbs_open_gsi errno {}", errno());
            Node {
                ctx,
                pd,
                cq,
                qp,
                buf,
                mr,
            }
        }
    }

    fn sge(&self, offset: usize, len: usize) -> ibv_sge {
        ibv_sge {
            addr: self.buf.as_ptr() as u64 + offset as u64,
            length: len as u32,
            lkey: unsafe { (*self.mr).lkey },
        }
    }

    fn gid(&self) -> ibv_gid {
        let mut gid = ibv_gid::default();
        assert_eq!(unsafe { ibv_query_gid(self.ctx, 1, 0, &mut gid) }, 0);
        gid
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        unsafe {
            assert_eq!(ibv_destroy_qp(self.qp), 0);
            assert_eq!(ibv_destroy_cq(self.cq), 0);
            assert_eq!(ibv_dereg_mr(self.mr), 0);
            assert_eq!(ibv_dealloc_pd(self.pd), 0);
            assert_eq!(ibv_close_device(self.ctx), 0);
        }
    }
}

#[test]
fn gsi_is_qp1_in_rts_and_carries_a_mad_with_its_source() {
    let (mut a, mut b) = (Node::new(0), Node::new(1));
    unsafe {
        assert_eq!(((*a.qp).qp_num, (*a.qp).qp_type, (*a.qp).state), (1, 4, 3));
        let mut attr = ibv_qp_attr::default();
        let mut init: ibv_qp_init_attr = std::mem::zeroed();
        assert_eq!(ibv_query_qp(a.qp, &mut attr, 1 | (1 << 6), &mut init), 0);
        assert_eq!((attr.qp_state, attr.qkey), (3, GSI_QKEY));

        // One GSI per device; bad arguments.
        assert!(softverbs_open_gsi(a.pd, a.cq, a.cq, 8, 8).is_null());
        assert_eq!(errno(), libc::EBUSY);
        assert!(softverbs_open_gsi(null_mut(), a.cq, a.cq, 8, 8).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(softverbs_open_gsi(a.pd, null_mut(), a.cq, 8, 8).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(softverbs_open_gsi(a.pd, a.cq, a.cq, 0, 8).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(softverbs_open_gsi(a.pd, a.cq, a.cq, 8, 1 << 30).is_null());
        assert_eq!(errno(), libc::EBUSY, "the open GSI is checked first");

        // A MAD from a's QP1 to b's QP1.
        let mut rsge = b.sge(0, GRH + MAD);
        common::post_recv_one(b.ctx, b.qp, &mut rsge, 9);
        for (i, x) in a.buf[..MAD].iter_mut().enumerate() {
            *x = (i * 5) as u8;
        }
        let mut ah_attr = ibv_ah_attr {
            is_global: 1,
            port_num: 1,
            ..Default::default()
        };
        ah_attr.grh.dgid = b.gid();
        ah_attr.grh.hop_limit = 64;
        let ah = ibv_create_ah(a.pd, &mut ah_attr);
        assert!(!ah.is_null());
        let mut sge = a.sge(0, MAD);
        let mut wr: ibv_send_wr = std::mem::zeroed();
        wr.wr_id = 1;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = 2;
        wr.send_flags = SIGNALED;
        wr.wr.ud = ibv_send_wr_ud {
            ah: ah.cast(),
            remote_qpn: 1,
            remote_qkey: GSI_QKEY,
        };
        let mut bad = null_mut();
        assert_eq!(
            ((*a.ctx).ops.post_send.unwrap())(a.qp, &mut wr, &mut bad),
            0
        );
        assert_eq!(common::poll_n(a.ctx, a.cq, 1)[0].status, 0);
        let wc = common::poll_n(b.ctx, b.cq, 1)[0];
        assert_eq!(
            (
                wc.wr_id,
                wc.status,
                wc.src_qp,
                wc.qp_num,
                wc.byte_len as usize
            ),
            (9, 0, 1, 1, GRH + MAD)
        );
        assert_eq!(&b.buf[32..36], &[127, 0, 95, 1], "GRH: IPv4 source");
        assert_eq!(&b.buf[GRH..GRH + MAD], &a.buf[..MAD]);
        let mut back = ibv_ah_attr::default();
        let mut wc_copy = wc;
        let grh = b.buf.as_mut_ptr().cast();
        assert_eq!(
            ibv_init_ah_from_wc(b.ctx, 1, &mut wc_copy, grh, &mut back),
            0
        );
        assert_eq!(back.grh.dgid.raw, a.gid().raw);
        assert_eq!(ibv_destroy_ah(ah), 0);

        // Closed by ibv_destroy_qp, then open again.
        assert_eq!(ibv_destroy_qp(a.qp), 0);
        a.qp = softverbs_open_gsi(a.pd, a.cq, a.cq, 4, 4);
        assert!(!a.qp.is_null(), "reopen errno {}", errno());
        assert_eq!((*a.qp).qp_num, 1);
    }
}
