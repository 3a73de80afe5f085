//! UD through the exported entry points, called in-process the way a C program calls them: two
//! devices on 127.0.94.1 and 127.0.94.2 (`SOFTVERBS_UDP_ADDRS`), UD QPs (classic and
//! `ibv_create_qp_ex`), `ibv_create_ah`, `wr.ud` and `ibv_wr_set_ud_addr`, the GRH at the start
//! of the receive buffer, the UD fields of `ibv_wc` and of the `ibv_cq_ex` readers,
//! `ibv_init_ah_from_wc` / `ibv_create_ah_from_wc`, the Q_Key and AH lifetime rules.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::undocumented_unsafe_blocks
)]

use std::ffi::c_int;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

mod common;

use common::errno;
use ibverbs_sys::*;
use softverbs_ibverbs::device::*;
use softverbs_ibverbs::objects::*;
use softverbs_ibverbs::qp::*;

const ADDRS: &str = "127.0.94.1,127.0.94.2";
const BUF: usize = 8192;
const GRH: usize = 40;
const QKEY: u32 = 0x1111_1111;
const IBV_QPT_UD: u32 = 4;
const IBV_WC_GRH: u32 = 1;
const IBV_WC_WITH_IMM: u32 = 2;
const SIGNALED: u32 = 2;

/// Opens device `i`.
fn open(i: usize) -> *mut ibv_context {
    common::open(ADDRS, i)
}

fn cap() -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

fn verbs(ctx: *mut ibv_context) -> *mut verbs_context {
    let off = std::mem::offset_of!(verbs_context, context);
    ctx.wrapping_byte_sub(off).cast()
}

/// A context, PD, MR, CQ and UD QP (created with `ibv_create_qp_ex` and an `ibv_cq_ex` when
/// `ex`), brought to RTS with Q_Key [`QKEY`].
struct Node {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    buf: Box<[u8; BUF]>,
    mr: *mut ibv_mr,
}

impl Node {
    fn new(i: usize, ex: bool) -> Node {
        let ctx = open(i);
        unsafe {
            let pd = ibv_alloc_pd(ctx);
            assert!(!pd.is_null());
            let mut buf = Box::new([0u8; BUF]);
            let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), BUF, 1);
            assert!(!mr.is_null());
            let (cq, qp) = if ex {
                let vctx = verbs(ctx);
                let mut cattr: ibv_cq_init_attr_ex = std::mem::zeroed();
                cattr.cqe = 64;
                cattr.wc_flags = 0x7f;
                let cq = ((*vctx).create_cq_ex.unwrap())(ctx, &mut cattr).cast::<ibv_cq>();
                assert!(!cq.is_null());
                let mut qattr: ibv_qp_init_attr_ex = std::mem::zeroed();
                qattr.send_cq = cq;
                qattr.recv_cq = cq;
                qattr.cap = cap();
                qattr.qp_type = IBV_QPT_UD;
                qattr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
                qattr.pd = pd;
                // A UD QP offers SEND and SEND_WITH_IMM only.
                qattr.send_ops_flags = 1 << 0;
                assert!(((*vctx).create_qp_ex.unwrap())(ctx, &mut qattr).is_null());
                assert_eq!(errno(), libc::EOPNOTSUPP);
                qattr.send_ops_flags = (1 << 2) | (1 << 3);
                let qp = ((*vctx).create_qp_ex.unwrap())(ctx, &mut qattr);
                assert!(!qp.is_null(), "create_qp_ex errno {}", errno());
                (cq, qp)
            } else {
                let cq = ibv_create_cq(ctx, 64, null_mut(), null_mut(), 0);
                assert!(!cq.is_null());
                let mut init = ibv_qp_init_attr {
                    qp_context: null_mut(),
                    send_cq: cq,
                    recv_cq: cq,
                    srq: null_mut(),
                    cap: cap(),
                    qp_type: IBV_QPT_UD,
                    sq_sig_all: 0,
                };
                let qp = ibv_create_qp(pd, &mut init);
                assert!(!qp.is_null(), "create_qp errno {}", errno());
                (cq, qp)
            };
            let n = Node {
                ctx,
                pd,
                cq,
                qp,
                buf,
                mr,
            };
            n.to_rts();
            n
        }
    }

    /// RESET → INIT (P_Key index, port, Q_Key) → RTR (state only) → RTS (SQ PSN).
    fn to_rts(&self) {
        unsafe {
            let mut attr = ibv_qp_attr {
                qp_state: 1,
                port_num: 1,
                qkey: QKEY,
                ..Default::default()
            };
            // An RC mask (access flags instead of Q_Key) is refused.
            assert_eq!(
                ibv_modify_qp(self.qp, &mut attr, 1 | 8 | 16 | 32),
                libc::EINVAL
            );
            assert_eq!(ibv_modify_qp(self.qp, &mut attr, 1 | 16 | 32 | 64), 0);
            let mut attr = ibv_qp_attr {
                qp_state: 2,
                ..Default::default()
            };
            assert_eq!(ibv_modify_qp(self.qp, &mut attr, 1), 0, "RTR");
            let mut attr = ibv_qp_attr {
                qp_state: 3,
                sq_psn: 5,
                ..Default::default()
            };
            assert_eq!(ibv_modify_qp(self.qp, &mut attr, 1 | (1 << 16)), 0, "RTS");
            assert_eq!((*self.qp).state, 3);
        }
    }

    fn qpn(&self) -> u32 {
        unsafe { (*self.qp).qp_num }
    }

    fn gid(&self) -> ibv_gid {
        let mut gid = ibv_gid::default();
        assert_eq!(unsafe { ibv_query_gid(self.ctx, 1, 0, &mut gid) }, 0);
        gid
    }

    fn sge(&self, offset: usize, len: u32) -> ibv_sge {
        ibv_sge {
            addr: self.buf.as_ptr() as u64 + offset as u64,
            length: len,
            lkey: unsafe { (*self.mr).lkey },
        }
    }

    /// An AH in this node's PD towards `peer`.
    fn ah_to(&self, peer: &Node) -> *mut ibv_ah {
        let mut attr = ibv_ah_attr {
            is_global: 1,
            port_num: 1,
            ..Default::default()
        };
        attr.grh.dgid = peer.gid();
        attr.grh.hop_limit = 64;
        let ah = unsafe { ibv_create_ah(self.pd, &mut attr) };
        assert!(!ah.is_null(), "create_ah errno {}", errno());
        ah
    }

    fn post_send(&self, wr: &mut ibv_send_wr) -> (c_int, *mut ibv_send_wr) {
        let mut bad = null_mut();
        let r = unsafe { ((*self.ctx).ops.post_send.unwrap())(self.qp, wr, &mut bad) };
        (r, bad)
    }

    fn post_recv(&self, offset: usize, len: u32, wr_id: u64) {
        let mut sge = self.sge(offset, len);
        common::post_recv_one(self.ctx, self.qp, &mut sge, wr_id);
    }

    /// Polls `n` completions through the ops table (5 s at most).
    fn poll(&self, n: usize) -> Vec<ibv_wc> {
        common::poll_n(self.ctx, self.cq, n)
    }

    /// No completion within 200 ms.
    fn quiet(&self) {
        std::thread::sleep(Duration::from_millis(200));
        let mut wc = [ibv_wc::default(); 1];
        let got = unsafe { ((*self.ctx).ops.poll_cq.unwrap())(self.cq, 1, wc.as_mut_ptr()) };
        assert_eq!(got, 0, "unexpected completion {:?}", wc[0].wr_id);
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

fn ud_send(sge: &mut ibv_sge, wr_id: u64, ah: *mut ibv_ah, qpn: u32, qkey: u32) -> ibv_send_wr {
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = wr_id;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.opcode = 2; // SEND
    wr.send_flags = SIGNALED;
    wr.wr.ud = ibv_send_wr_ud {
        ah: ah.cast(),
        remote_qpn: qpn,
        remote_qkey: qkey,
    };
    wr
}

/// The IPv4 header rdma-core expects in the last 20 bytes of the GRH; `ib_payload` is what
/// follows the DETH (ImmDt, payload and pad).
fn assert_ipv4_grh(grh: &[u8], src: [u8; 4], dst: [u8; 4], ib_payload: usize) {
    assert_eq!(grh[20], 0x45, "IPv4, IHL 5");
    let total = u16::from_be_bytes([grh[22], grh[23]]) as usize;
    // IPv4 + UDP + BTH + DETH + ib_payload + ICRC.
    assert_eq!(total, 20 + 8 + 12 + 8 + ib_payload + 4);
    assert_eq!(grh[29], 17, "UDP");
    assert_eq!(&grh[32..36], &src);
    assert_eq!(&grh[36..40], &dst);
}

#[test]
fn ud_send_grh_wc_fields_and_reply_from_wc() {
    let (mut a, mut b) = (Node::new(0, false), Node::new(1, true));
    unsafe {
        // ibv_query_qp of a UD QP reports its type and Q_Key.
        let mut attr = ibv_qp_attr::default();
        let mut init: ibv_qp_init_attr = std::mem::zeroed();
        assert_eq!(ibv_query_qp(a.qp, &mut attr, 1 << 6, &mut init), 0);
        assert_eq!(
            (attr.qkey, attr.qp_state, init.qp_type),
            (QKEY, 3, IBV_QPT_UD)
        );

        // a → b with wr.ud, a payload of 100 bytes behind b's 40-byte GRH.
        b.post_recv(0, (GRH + 1024) as u32, 7);
        for (i, x) in a.buf[..100].iter_mut().enumerate() {
            *x = i as u8;
        }
        let ah = a.ah_to(&b);
        let mut sge = a.sge(0, 100);
        let mut wr = ud_send(&mut sge, 1, ah, b.qpn(), QKEY);
        assert_eq!(a.post_send(&mut wr).0, 0);
        let wc = a.poll(1);
        assert_eq!((wc[0].wr_id, wc[0].status, wc[0].opcode), (1, 0, 0));
        let wc = b.poll(1)[0];
        assert_eq!((wc.wr_id, wc.status, wc.opcode), (7, 0, 128));
        assert_eq!(wc.byte_len as usize, GRH + 100);
        assert_eq!(wc.src_qp, a.qpn());
        assert_eq!(wc.qp_num, b.qpn());
        assert_eq!(wc.wc_flags & IBV_WC_GRH, IBV_WC_GRH);
        assert_eq!((wc.pkey_index, wc.sl), (0, 0));
        assert_ipv4_grh(&b.buf[..GRH], [127, 0, 94, 1], [127, 0, 94, 2], 100);
        assert_eq!(&b.buf[GRH..GRH + 100], &a.buf[..100]);

        // ibv_init_ah_from_wc names a's GID; ibv_create_ah_from_wc answers a.
        let mut wc_copy = wc;
        let grh_ptr = b.buf.as_mut_ptr().cast();
        let mut back = ibv_ah_attr::default();
        assert_eq!(
            ibv_init_ah_from_wc(b.ctx, 1, &mut wc_copy, grh_ptr, &mut back),
            0
        );
        assert_eq!(back.is_global, 1);
        assert_eq!(back.grh.dgid.raw, a.gid().raw);
        assert_eq!((back.grh.hop_limit, back.port_num), (0xff, 1));
        let reply = ibv_create_ah_from_wc(b.pd, &mut wc_copy, grh_ptr, 1);
        assert!(!reply.is_null(), "create_ah_from_wc errno {}", errno());
        let mut no_grh = wc;
        no_grh.wc_flags = 0;
        assert_eq!(
            ibv_init_ah_from_wc(b.ctx, 1, &mut no_grh, grh_ptr, &mut back),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        assert!(ibv_create_ah_from_wc(b.pd, &mut no_grh, grh_ptr, 1).is_null());

        // b → a through the ibv_qp_ex builder with SEND_WITH_IMM and ibv_wr_set_ud_addr.
        a.post_recv(1024, (GRH + 64) as u32, 8);
        b.buf[2000..2005].copy_from_slice(b"hello");
        let qpx = ibv_qp_to_qp_ex(b.qp);
        ((*qpx).wr_start.unwrap())(qpx);
        (*qpx).wr_id = 2;
        (*qpx).wr_flags = SIGNALED;
        ((*qpx).wr_send_imm.unwrap())(qpx, 0xabcdu32.to_be());
        ((*qpx).wr_set_ud_addr.unwrap())(qpx, reply, a.qpn(), QKEY);
        ((*qpx).wr_set_sge.unwrap())(qpx, (*b.mr).lkey, b.buf.as_ptr() as u64 + 2000, 5);
        assert_eq!(((*qpx).wr_complete.unwrap())(qpx), 0);
        let wc = a.poll(1)[0];
        assert_eq!((wc.wr_id, wc.status, wc.byte_len), (8, 0, (GRH + 5) as u32));
        assert_eq!(u32::from_be(wc.imm_data), 0xabcd);
        assert_eq!(wc.wc_flags, IBV_WC_GRH | IBV_WC_WITH_IMM);
        assert_eq!(&a.buf[1024 + GRH..1024 + GRH + 5], b"hello");
        // ImmDt (4) and the payload padded to 4 bytes (8).
        assert_ipv4_grh(
            &a.buf[1024..1024 + GRH],
            [127, 0, 94, 2],
            [127, 0, 94, 1],
            4 + 8,
        );

        // b's send completion through the ibv_cq_ex readers.
        let cqx = b.cq.cast::<ibv_cq_ex>();
        let mut pattr = ibv_poll_cq_attr { comp_mask: 0 };
        let deadline = Instant::now() + Duration::from_secs(5);
        while ((*cqx).start_poll.unwrap())(cqx, &mut pattr) == libc::ENOENT {
            assert!(Instant::now() < deadline);
        }
        assert_eq!(((*cqx).wr_id, (*cqx).status), (2, 0));
        ((*cqx).end_poll.unwrap())(cqx);

        // a → b again, read through the ibv_cq_ex readers on b.
        b.post_recv(0, (GRH + 64) as u32, 9);
        let mut sge = a.sge(0, 3);
        let mut wr = ud_send(&mut sge, 3, ah, b.qpn(), QKEY);
        assert_eq!(a.post_send(&mut wr).0, 0);
        let deadline = Instant::now() + Duration::from_secs(5);
        while ((*cqx).start_poll.unwrap())(cqx, &mut pattr) == libc::ENOENT {
            assert!(Instant::now() < deadline);
        }
        assert_eq!(((*cqx).wr_id, (*cqx).status), (9, 0));
        assert_eq!(((*cqx).read_src_qp.unwrap())(cqx), a.qpn());
        assert_eq!(((*cqx).read_wc_flags.unwrap())(cqx), IBV_WC_GRH);
        assert_eq!(((*cqx).read_byte_len.unwrap())(cqx), (GRH + 3) as u32);
        assert_eq!(((*cqx).read_sl.unwrap())(cqx), 0);
        ((*cqx).end_poll.unwrap())(cqx);
        assert_eq!(a.poll(1)[0].wr_id, 3);

        // The PD is busy while an AH uses it.
        assert_eq!(ibv_dealloc_pd(b.pd), libc::EBUSY);
        assert_eq!(ibv_destroy_ah(reply), 0);
        assert_eq!(ibv_destroy_ah(ah), 0);
        assert_eq!(ibv_destroy_ah(null_mut()), libc::EINVAL);
    }
}

#[test]
fn qkey_rules_bad_posts_and_oversized_messages() {
    let (mut a, b) = (Node::new(0, false), Node::new(1, false));
    unsafe {
        let ah = a.ah_to(&b);
        // A wrong Q_Key is dropped at the receiver: no completion there.
        b.post_recv(0, (GRH + 64) as u32, 1);
        let mut sge = a.sge(0, 8);
        let mut wr = ud_send(&mut sge, 10, ah, b.qpn(), QKEY ^ 1);
        assert_eq!(a.post_send(&mut wr).0, 0);
        assert_eq!(a.poll(1)[0].status, 0, "UD gives the sender no error");
        b.quiet();
        // A controlled Q_Key (high bit set) sends the QP's own, which matches.
        let mut wr = ud_send(&mut sge, 11, ah, b.qpn(), 0x8000_0000);
        assert_eq!(a.post_send(&mut wr).0, 0);
        assert_eq!(a.poll(1)[0].wr_id, 11);
        assert_eq!(b.poll(1)[0].wr_id, 1);

        // A NULL AH fails the post and names the work request.
        let mut wr = ud_send(&mut sge, 12, null_mut(), b.qpn(), QKEY);
        let (r, bad) = a.post_send(&mut wr);
        assert_eq!(r, libc::EINVAL);
        assert_eq!(bad, &mut wr as *mut _);
        // RDMA WRITE is not a UD operation.
        let mut wr = ud_send(&mut sge, 13, ah, b.qpn(), QKEY);
        wr.opcode = 0;
        assert_ne!(a.post_send(&mut wr).0, 0);
        // ibv_wr_set_ud_addr without a work request or with a NULL AH fails the batch.
        let qpx = ibv_qp_to_qp_ex(a.qp);
        ((*qpx).wr_start.unwrap())(qpx);
        ((*qpx).wr_set_ud_addr.unwrap())(qpx, ah, b.qpn(), QKEY);
        assert_eq!(((*qpx).wr_complete.unwrap())(qpx), libc::EINVAL);
        ((*qpx).wr_start.unwrap())(qpx);
        ((*qpx).wr_send.unwrap())(qpx);
        ((*qpx).wr_set_ud_addr.unwrap())(qpx, null_mut(), b.qpn(), QKEY);
        ((*qpx).wr_set_sge.unwrap())(qpx, (*a.mr).lkey, a.buf.as_ptr() as u64, 8);
        assert_eq!(((*qpx).wr_complete.unwrap())(qpx), libc::EINVAL);

        // A receive buffer too small for GRH + payload completes with LOC_LEN_ERR.
        b.post_recv(0, (GRH + 4) as u32, 2);
        let mut sge = a.sge(0, 8);
        let mut wr = ud_send(&mut sge, 14, ah, b.qpn(), QKEY);
        assert_eq!(a.post_send(&mut wr).0, 0);
        assert_eq!(a.poll(1)[0].status, 0);
        assert_eq!(b.poll(1)[0].status, 1, "IBV_WC_LOC_LEN_ERR");

        // Above the path MTU: completes at the sender, never arrives.
        let mut port = ibv_port_attr::default();
        assert_eq!(ibv_query_port(a.ctx, 1, &mut port), 0);
        let mtu = 128u32 << port.active_mtu;
        assert!((mtu as usize) < BUF);
        b.post_recv(0, BUF as u32, 3);
        let mut sge = a.sge(0, mtu + 1);
        let mut wr = ud_send(&mut sge, 15, ah, b.qpn(), QKEY);
        assert_eq!(a.post_send(&mut wr).0, 0);
        assert_eq!(a.poll(1)[0].wr_id, 15);
        b.quiet();
        // Exactly the MTU arrives.
        a.buf[mtu as usize - 1] = 0x5a;
        let mut sge = a.sge(0, mtu);
        let mut wr = ud_send(&mut sge, 16, ah, b.qpn(), QKEY);
        assert_eq!(a.post_send(&mut wr).0, 0);
        assert_eq!(a.poll(1)[0].wr_id, 16);
        let wc = b.poll(1)[0];
        assert_eq!((wc.wr_id, wc.status, wc.byte_len), (3, 0, mtu + GRH as u32));
        assert_eq!(ibv_destroy_ah(ah), 0);
    }
}

#[test]
fn resize_below_just_posted_ud_sends_is_einval() {
    // pyverbs' test_resize_cq: a burst of signaled UD sends, then at once a resize below the
    // completions they make. The sends go out (and complete) before the resize counts, as on
    // a NIC, so the resize fails with EINVAL and no completion is lost.
    let (mut a, b) = (Node::new(0, false), Node::new(1, false));
    let ah = a.ah_to(&b);
    for round in 0..20 {
        unsafe {
            assert_eq!(ibv_resize_cq(a.cq, 7), 0);
            let n = (*a.cq).cqe - 1;
            for i in 0..n {
                let mut sge = a.sge(0, 8);
                let mut wr = ud_send(&mut sge, u64::from(i as u32), ah, b.qpn(), QKEY);
                assert_eq!(a.post_send(&mut wr).0, 0);
            }
            assert_eq!(ibv_resize_cq(a.cq, 1), libc::EINVAL, "round {round}");
            let statuses: Vec<u32> = a.poll(n as usize).iter().map(|w| w.status).collect();
            assert!(
                statuses.iter().all(|s| *s == 0),
                "round {round}: {statuses:?}"
            );
        }
    }
    a.buf[0] = 0;
    assert_eq!(unsafe { ibv_destroy_ah(ah) }, 0);
}
