//! The exported entry points called in-process, the way a C program calls them (the data path
//! through the context's ops table and the `ibv_qp_ex`/`ibv_cq_ex` function pointers): two
//! devices on 127.0.91.1 and 127.0.91.2 (`SOFTVERBS_UDP_ADDRS`), RC connect, WRITE into the
//! peer application's buffer, SEND with immediate, READ, atomics, completion channels, the
//! extended builder and poller, and the errors libibverbs gives for bad use.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::undocumented_unsafe_blocks
)]

use std::ffi::{CStr, c_int, c_void};
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

mod common;

use common::errno;
use ibverbs_sys::*;
use softverbs_ibverbs::device::*;
use softverbs_ibverbs::objects::*;
use softverbs_ibverbs::qp::*;
use softverbs_ibverbs::stubs;

const ADDRS: &str = "127.0.91.1,127.0.91.2";
const ACCESS: c_int = 1 | 2 | 4 | 8; // LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC
const BUF: usize = 4096;

/// Opens device `i`.
fn open(i: usize) -> *mut ibv_context {
    common::open(ADDRS, i)
}

struct Node {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    buf: Box<[u8; BUF]>,
    mr: *mut ibv_mr,
}

impl Node {
    /// A context, PD, MR over `buf`, a CQ and an RC QP (extended when `ex`).
    fn new(i: usize, ex: bool) -> Node {
        Node::typed(i, ex, 2)
    }

    /// [`Node::new`] with a QP of type `qp_type` (`IBV_QPT_*`).
    fn typed(i: usize, ex: bool, qp_type: u32) -> Node {
        let ctx = open(i);
        unsafe {
            let pd = ibv_alloc_pd(ctx);
            assert!(!pd.is_null());
            let mut buf = Box::new([0u8; BUF]);
            let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), BUF, ACCESS);
            assert!(!mr.is_null(), "reg_mr errno {}", errno());
            assert_eq!((*mr).addr, buf.as_mut_ptr().cast());
            let (cq, qp) = if ex {
                let vctx = verbs(ctx);
                let mut cattr = ibv_cq_init_attr_ex {
                    cqe: 64,
                    cq_context: null_mut(),
                    channel: null_mut(),
                    comp_vector: 0,
                    wc_flags: 0x7f,
                    comp_mask: 0,
                    flags: 0,
                    parent_domain: null_mut(),
                };
                let cqx = ((*vctx).create_cq_ex.unwrap())(ctx, &mut cattr);
                assert!(!cqx.is_null());
                let cq = cqx.cast::<ibv_cq>();
                let mut qattr: ibv_qp_init_attr_ex = std::mem::zeroed();
                qattr.send_cq = cq;
                qattr.recv_cq = cq;
                qattr.cap = cap();
                qattr.qp_type = qp_type;
                qattr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
                qattr.pd = pd;
                qattr.send_ops_flags = IBV_QP_EX_RC_OPS;
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
                    qp_type,
                    sq_sig_all: 0,
                };
                let qp = ibv_create_qp(pd, &mut init);
                assert!(!qp.is_null());
                assert!(init.cap.max_send_wr >= 16);
                (cq, qp)
            };
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

    fn gid(&self) -> ibv_gid {
        let mut gid = ibv_gid::default();
        assert_eq!(unsafe { ibv_query_gid(self.ctx, 1, 0, &mut gid) }, 0);
        gid
    }

    fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    fn post_send(&self, wr: &mut ibv_send_wr) -> c_int {
        let mut bad = null_mut();
        unsafe { ((*self.ctx).ops.post_send.unwrap())(self.qp, wr, &mut bad) }
    }

    fn post_recv(&self, sge: &mut ibv_sge, wr_id: u64) {
        common::post_recv_one(self.ctx, self.qp, sge, wr_id);
    }

    /// Polls `n` completions through the ops table (5 s at most).
    fn poll(&self, n: usize) -> Vec<ibv_wc> {
        common::poll_n(self.ctx, self.cq, n)
    }

    fn sge(&self, offset: usize, len: u32) -> ibv_sge {
        ibv_sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: unsafe { (*self.mr).lkey },
        }
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

fn modify(qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: c_int) -> c_int {
    unsafe { ibv_modify_qp(qp, attr, mask) }
}

/// RESET → INIT → RTR → RTS towards `peer`.
fn connect(a: &Node, peer: &Node) {
    let mut attr = ibv_qp_attr {
        qp_state: 1,
        port_num: 1,
        qp_access_flags: ACCESS as u32,
        ..Default::default()
    };
    assert_eq!(modify(a.qp, &mut attr, 1 | 8 | 16 | 32), 0);
    let mut attr = ibv_qp_attr {
        qp_state: 2,
        path_mtu: 3,
        dest_qp_num: unsafe { (*peer.qp).qp_num },
        rq_psn: 100,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
        ..Default::default()
    };
    attr.ah_attr.is_global = 1;
    attr.ah_attr.port_num = 1;
    attr.ah_attr.grh.dgid = peer.gid();
    attr.ah_attr.grh.hop_limit = 64;
    let rtr = 1 | (1 << 7) | (1 << 8) | (1 << 20) | (1 << 12) | (1 << 17) | (1 << 15);
    assert_eq!(modify(a.qp, &mut attr, rtr), 0, "RTR");
    let mut attr = ibv_qp_attr {
        qp_state: 3,
        sq_psn: 100,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..Default::default()
    };
    let rts = 1 | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 16) | (1 << 13);
    assert_eq!(modify(a.qp, &mut attr, rts), 0, "RTS");
    assert_eq!(unsafe { (*a.qp).state }, 3);
}

fn pair(ex: bool) -> (Node, Node) {
    let (a, b) = (Node::new(0, ex), Node::new(1, ex));
    connect(&a, &b);
    connect(&b, &a);
    (a, b)
}

fn send_wr(opcode: u32, sge: &mut ibv_sge, wr_id: u64) -> ibv_send_wr {
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = wr_id;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.opcode = opcode;
    wr.send_flags = 2; // SIGNALED
    wr
}

#[test]
fn devices_ports_and_gids() {
    let ctx = open(1);
    unsafe {
        let dev = (*ctx).device;
        let name = CStr::from_ptr(ibv_get_device_name(dev)).to_str().unwrap();
        assert_eq!(name, "softverbs1");
        assert_eq!((*dev).transport_type, 0);
        assert_eq!((*dev).node_type, 1);
        assert_ne!(ibv_get_device_guid(dev), 0);
        assert_eq!(ibv_get_device_index(dev), 1);
        assert_eq!((*ctx).abi_compat, VERBS_ABI_IS_EXTENDED);
        assert_eq!((*verbs(ctx)).sz, size_of::<verbs_context>());

        let mut attr: ibv_device_attr = std::mem::zeroed();
        assert_eq!(ibv_query_device(ctx, &mut attr), 0);
        assert_eq!(attr.phys_port_cnt, 1);
        assert!(attr.max_qp_wr > 0);

        // query_port through verbs_context writes only the caller's length.
        let mut port = [0xAAu8; 64];
        let q = (*verbs(ctx)).query_port.unwrap();
        assert_eq!(
            q(ctx, 1, port.as_mut_ptr().cast(), IBV_PORT_ATTR_SIZE_V44),
            0
        );
        assert!(port[IBV_PORT_ATTR_SIZE_V44..].iter().all(|b| *b == 0xAA));
        let pa = &*port.as_ptr().cast::<ibv_port_attr>();
        assert_eq!(pa.state, 4);
        assert_eq!(pa.link_layer, 2);
        assert_eq!(q(ctx, 2, port.as_mut_ptr().cast(), 52), libc::EINVAL);
        // The exported 3-argument call fills rdma-core's compat struct (up to `flags`).
        let mut port = [0xAAu8; 64];
        assert_eq!(ibv_query_port(ctx, 1, port.as_mut_ptr().cast()), 0);
        assert!(port[48..].iter().all(|b| *b == 0xAA));
        assert_eq!(port[46], 2);

        let mut gid = ibv_gid::default();
        assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        assert_eq!(gid.raw[10..], [0xff, 0xff, 127, 0, 91, 2]);
        // A table of 16 entries, only index 0 populated: an empty entry reads as the zero GID
        // through ibv_query_gid and as ENODATA through ibv_query_gid_ex, as in rdma-core.
        assert_eq!(pa.gid_tbl_len, 16);
        assert_eq!(ibv_query_gid(ctx, 1, 1, &mut gid), 0);
        assert_eq!(gid.raw, [0; 16]);
        assert_eq!(ibv_query_gid(ctx, 1, 16, &mut gid), -1);
        let mut t = 0;
        assert_eq!(ibv_query_gid_type(ctx, 1, 0, &mut t), 0);
        assert_eq!(t, IBV_GID_TYPE_SYSFS_ROCE_V2);
        let mut entry = ibv_gid_entry::default();
        assert_eq!(_ibv_query_gid_ex(ctx, 1, 0, &mut entry, 0, 32), 0);
        assert_eq!(entry.gid_type, IBV_GID_TYPE_ROCE_V2);
        assert_eq!(
            _ibv_query_gid_ex(ctx, 1, 5, &mut entry, 0, 32),
            libc::ENODATA
        );
        assert_eq!(
            _ibv_query_gid_ex(ctx, 1, 16, &mut entry, 0, 32),
            libc::EINVAL
        );
        let mut table = [ibv_gid_entry::default(); 16];
        assert_eq!(_ibv_query_gid_table(ctx, table.as_mut_ptr(), 16, 0, 32), 1);
        assert_eq!(table[0].gid_index, 0);
        let mut pkey = 0;
        assert_eq!(ibv_query_pkey(ctx, 1, 0, &mut pkey), 0);
        assert_eq!(pkey, 0xffffu16.to_be());

        let mut ex: ibv_device_attr_ex = std::mem::zeroed();
        let qd = (*verbs(ctx)).query_device_ex.unwrap();
        assert_eq!(qd(ctx, null(), &mut ex, size_of::<ibv_device_attr_ex>()), 0);
        assert_eq!(ex.phys_port_cnt_ex, 1);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

#[test]
fn rc_write_send_read_and_atomics_through_the_ops_table() {
    let (mut a, mut b) = pair(false);
    let b_rkey = unsafe { (*b.mr).rkey };

    // WRITE lands in b's own buffer.
    a.buf[..5].copy_from_slice(b"hello");
    let mut sge = a.sge(0, 5);
    let mut wr = send_wr(0, &mut sge, 1);
    wr.wr.rdma = ibv_send_wr_rdma {
        remote_addr: b.addr() + 100,
        rkey: b_rkey,
    };
    assert_eq!(a.post_send(&mut wr), 0);
    let wc = a.poll(1);
    assert_eq!((wc[0].status, wc[0].opcode, wc[0].wr_id), (0, 1, 1));
    assert_eq!(&b.buf[100..105], b"hello");

    // SEND with immediate (network order in both structs), inline.
    let mut rsge = b.sge(200, 64);
    b.post_recv(&mut rsge, 7);
    a.buf[10..14].copy_from_slice(b"ping");
    let mut sge = a.sge(10, 4);
    let mut wr = send_wr(3, &mut sge, 2);
    wr.imm_data = 0x1234_5678u32.to_be();
    wr.send_flags |= 8; // INLINE
    assert_eq!(a.post_send(&mut wr), 0);
    assert_eq!(a.poll(1)[0].status, 0);
    let wc = b.poll(1);
    assert_eq!((wc[0].status, wc[0].opcode, wc[0].wr_id), (0, 128, 7));
    assert_eq!(wc[0].byte_len, 4);
    assert_eq!(u32::from_be(wc[0].imm_data), 0x1234_5678);
    assert_eq!(wc[0].wc_flags & 2, 2);
    assert_eq!(&b.buf[200..204], b"ping");

    // READ b's bytes into a.
    b.buf[300..303].copy_from_slice(b"abc");
    let mut sge = a.sge(400, 3);
    let mut wr = send_wr(4, &mut sge, 3);
    wr.wr.rdma = ibv_send_wr_rdma {
        remote_addr: b.addr() + 300,
        rkey: b_rkey,
    };
    assert_eq!(a.post_send(&mut wr), 0);
    assert_eq!(a.poll(1)[0].opcode, 2);
    assert_eq!(&a.buf[400..403], b"abc");

    // Fetch-and-add, then compare-and-swap, on an aligned word of b.
    b.buf[512..520].copy_from_slice(&5u64.to_ne_bytes());
    let mut sge = a.sge(600, 8);
    let mut wr = send_wr(6, &mut sge, 4);
    wr.wr.atomic = ibv_send_wr_atomic {
        remote_addr: b.addr() + 512,
        compare_add: 3,
        swap: 0,
        rkey: b_rkey,
    };
    assert_eq!(a.post_send(&mut wr), 0);
    assert_eq!(a.poll(1)[0].opcode, 4);
    assert_eq!(u64::from_ne_bytes(a.buf[600..608].try_into().unwrap()), 5);
    let mut wr = send_wr(5, &mut sge, 5);
    wr.wr.atomic = ibv_send_wr_atomic {
        remote_addr: b.addr() + 512,
        compare_add: 8,
        swap: 42,
        rkey: b_rkey,
    };
    assert_eq!(a.post_send(&mut wr), 0);
    assert_eq!(a.poll(1)[0].opcode, 3);
    assert_eq!(u64::from_ne_bytes(b.buf[512..520].try_into().unwrap()), 42);

    // query_qp reports the connection.
    let mut attr = ibv_qp_attr::default();
    let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { ibv_query_qp(a.qp, &mut attr, 0, &mut init) }, 0);
    assert_eq!(attr.qp_state, 3);
    assert_eq!(attr.dest_qp_num, unsafe { (*b.qp).qp_num });
    assert_eq!(init.send_cq, a.cq);
}

#[test]
fn qp_ex_builder_and_cq_ex_polling() {
    let (mut a, b) = pair(true);
    let b_rkey = unsafe { (*b.mr).rkey };
    unsafe {
        let qpx = ibv_qp_to_qp_ex(a.qp);
        assert_eq!(qpx.cast::<ibv_qp>(), a.qp);
        a.buf[..3].copy_from_slice(b"xyz");
        let mut rsge = b.sge(1000, 64);
        b.post_recv(&mut rsge, 9);
        ((*qpx).wr_start.unwrap())(qpx);
        (*qpx).wr_id = 11;
        (*qpx).wr_flags = 2;
        ((*qpx).wr_rdma_write.unwrap())(qpx, b_rkey, b.addr() + 50);
        ((*qpx).wr_set_sge.unwrap())(qpx, (*a.mr).lkey, a.addr(), 3);
        (*qpx).wr_id = 12;
        ((*qpx).wr_send_imm.unwrap())(qpx, 99u32.to_be());
        let mut data = *b"inline!";
        ((*qpx).wr_set_inline_data.unwrap())(qpx, data.as_mut_ptr().cast(), data.len());
        (*qpx).wr_id = 13;
        ((*qpx).wr_atomic_fetch_add.unwrap())(qpx, b_rkey, b.addr() + 64, 1);
        ((*qpx).wr_set_sge.unwrap())(qpx, (*a.mr).lkey, a.addr() + 8, 8);
        assert_eq!(((*qpx).wr_complete.unwrap())(qpx), 0);

        // Poll a's three completions through ibv_cq_ex.
        let cqx = a.cq.cast::<ibv_cq_ex>();
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while seen.len() < 3 {
            assert!(Instant::now() < deadline);
            let mut pattr = ibv_poll_cq_attr { comp_mask: 0 };
            let mut r = ((*cqx).start_poll.unwrap())(cqx, &mut pattr);
            if r == libc::ENOENT {
                continue;
            }
            while r == 0 {
                assert_eq!((*cqx).status, 0);
                seen.push(((*cqx).wr_id, ((*cqx).read_opcode.unwrap())(cqx)));
                r = ((*cqx).next_poll.unwrap())(cqx);
            }
            assert_eq!(r, libc::ENOENT);
            ((*cqx).end_poll.unwrap())(cqx);
        }
        assert_eq!(seen, vec![(11, 1), (12, 0), (13, 4)]);
        assert_eq!(&b.buf[50..53], b"xyz");
        assert_eq!(b.buf[64], 1);

        let wc = b.poll(1);
        assert_eq!((wc[0].wr_id, wc[0].byte_len), (9, 7));
        assert_eq!(u32::from_be(wc[0].imm_data), 99);
        assert_eq!(&b.buf[1000..1007], b"inline!");

        // A session that stops after one completion leaves the rest to ibv_poll_cq.
        ((*qpx).wr_start.unwrap())(qpx);
        for id in 21..24 {
            (*qpx).wr_id = id;
            ((*qpx).wr_rdma_write.unwrap())(qpx, b_rkey, b.addr() + 80);
            ((*qpx).wr_set_sge.unwrap())(qpx, (*a.mr).lkey, a.addr(), 8);
        }
        assert_eq!(((*qpx).wr_complete.unwrap())(qpx), 0);
        std::thread::sleep(Duration::from_millis(50));
        let mut pattr = ibv_poll_cq_attr { comp_mask: 0 };
        let deadline = Instant::now() + Duration::from_secs(5);
        while ((*cqx).start_poll.unwrap())(cqx, &mut pattr) == libc::ENOENT {
            assert!(Instant::now() < deadline);
        }
        let first = (*cqx).wr_id;
        ((*cqx).end_poll.unwrap())(cqx);
        let mut ids: Vec<u64> = a.poll(2).iter().map(|w| w.wr_id).collect();
        ids.insert(0, first);
        assert_eq!(ids, vec![21, 22, 23]);

        // An unsupported op poisons the batch; wr_abort discards it.
        ((*qpx).wr_start.unwrap())(qpx);
        ((*qpx).wr_set_ud_addr.unwrap())(qpx, null_mut(), 1, 1);
        assert_eq!(((*qpx).wr_complete.unwrap())(qpx), libc::EOPNOTSUPP);
        ((*qpx).wr_start.unwrap())(qpx);
        ((*qpx).wr_send.unwrap())(qpx);
        ((*qpx).wr_abort.unwrap())(qpx);
    }
}

#[test]
fn completion_channel_is_a_real_fd() {
    let ctx = open(0);
    unsafe {
        let ch = ibv_create_comp_channel(ctx);
        assert!(!ch.is_null());
        let pd = ibv_alloc_pd(ctx);
        let cq = ibv_create_cq(ctx, 8, 0x55 as *mut c_void, ch, 0);
        assert!(!cq.is_null());
        assert_eq!(ibv_destroy_comp_channel(ch), libc::EBUSY);
        let mut init = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: null_mut(),
            cap: cap(),
            qp_type: 2,
            sq_sig_all: 1,
        };
        let qp = ibv_create_qp(pd, &mut init);
        assert!(!qp.is_null());
        assert_eq!(((*ctx).ops.req_notify_cq.unwrap())(cq, 0), 0);
        // Moving the QP to ERR flushes a posted receive: a completion, hence an event.
        let mut attr = ibv_qp_attr {
            qp_state: 1,
            port_num: 1,
            ..Default::default()
        };
        assert_eq!(ibv_modify_qp(qp, &mut attr, 1 | 8 | 16 | 32), 0);
        let mut buf = [0u8; 8];
        let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), 8, 1);
        let mut sge = ibv_sge {
            addr: buf.as_ptr() as u64,
            length: 8,
            lkey: (*mr).lkey,
        };
        let mut rwr = ibv_recv_wr {
            wr_id: 3,
            next: null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = null_mut();
        assert_eq!(((*ctx).ops.post_recv.unwrap())(qp, &mut rwr, &mut bad), 0);
        let mut attr = ibv_qp_attr {
            qp_state: 6,
            ..Default::default()
        };
        assert_eq!(ibv_modify_qp(qp, &mut attr, 1), 0);
        let mut p = libc::pollfd {
            fd: (*ch).fd,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!(
            libc::poll(&mut p, 1, 5000),
            1,
            "channel fd never became readable"
        );
        let (mut ev_cq, mut ev_ctx) = (null_mut(), null_mut());
        assert_eq!(ibv_get_cq_event(ch, &mut ev_cq, &mut ev_ctx), 0);
        assert_eq!((ev_cq, ev_ctx), (cq, 0x55 as *mut c_void));
        // Unacknowledged events keep the CQ alive.
        assert_eq!(ibv_destroy_qp(qp), 0);
        assert_eq!(ibv_destroy_cq(cq), libc::EBUSY);
        ibv_ack_cq_events(cq, 1);
        assert_eq!(ibv_dereg_mr(mr), 0);
        assert_eq!(ibv_destroy_cq(cq), 0);
        assert_eq!(ibv_destroy_comp_channel(ch), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
        // The channel fd is non-blocking only if the application says so.
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

#[test]
fn bad_use_gets_libibverbs_errors() {
    let n = Node::new(0, false);
    unsafe {
        // Posting a send in RESET fails and names the WR.
        let mut sge = n.sge(0, 8);
        let mut wr = send_wr(2, &mut sge, 1);
        let mut bad = null_mut();
        let r = ((*n.ctx).ops.post_send.unwrap())(n.qp, &mut wr, &mut bad);
        assert_eq!(r, libc::EINVAL);
        assert_eq!(bad, &raw mut wr);
        // An unknown opcode too.
        let mut wr2 = send_wr(77, &mut sge, 2);
        let r = ((*n.ctx).ops.post_send.unwrap())(n.qp, &mut wr2, &mut bad);
        assert_eq!(r, libc::EINVAL);
        assert_eq!(bad, &raw mut wr2);
        // Destroying objects in use.
        assert_eq!(ibv_dealloc_pd(n.pd), libc::EBUSY);
        assert_eq!(ibv_destroy_cq(n.cq), libc::EBUSY);
        // NULL where forbidden.
        assert!(ibv_alloc_pd(null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(ibv_dealloc_pd(null_mut()), libc::EINVAL);
        assert_eq!(ibv_modify_qp(n.qp, null_mut(), 1), libc::EINVAL);
        assert!(ibv_create_qp(n.pd, null_mut()).is_null());
        assert_eq!(ibv_query_device(n.ctx, null_mut()), libc::EINVAL);
        // An illegal transition or a bad mask.
        let mut attr = ibv_qp_attr {
            qp_state: 3,
            ..Default::default()
        };
        assert_eq!(ibv_modify_qp(n.qp, &mut attr, 1), libc::EINVAL);
        // RoCE needs the GRH in the address vector.
        let mut attr = ibv_qp_attr {
            qp_state: 1,
            port_num: 1,
            ..Default::default()
        };
        assert_eq!(ibv_modify_qp(n.qp, &mut attr, 1 | 8 | 16 | 32), 0);
        let mut attr = ibv_qp_attr {
            qp_state: 2,
            path_mtu: 3,
            dest_qp_num: 1,
            max_dest_rd_atomic: 1,
            ..Default::default()
        };
        attr.ah_attr.port_num = 1;
        let rtr = 1 | (1 << 7) | (1 << 8) | (1 << 20) | (1 << 12) | (1 << 17) | (1 << 15);
        assert_eq!(ibv_modify_qp(n.qp, &mut attr, rtr), libc::EINVAL);
        let mut ah_attr = attr.ah_attr;
        assert!(ibv_create_ah(n.pd, &mut ah_attr).is_null());
        // Raw-packet QPs, iova != addr, multicast and the provider-private calls are not
        // supported (UD is: tests/ud.rs).
        let mut init = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: n.cq,
            recv_cq: n.cq,
            srq: null_mut(),
            cap: cap(),
            qp_type: 8,
            sq_sig_all: 0,
        };
        assert!(ibv_create_qp(n.pd, &mut init).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        let mut x = [0u8; 16];
        let p = x.as_mut_ptr().cast();
        assert!(ibv_reg_mr_iova2(n.pd, p, 16, 0x1000, 1).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert_eq!(stubs::ibv_attach_mcast(), libc::EOPNOTSUPP);
        assert_eq!(stubs::ibv_cmd_create_qp(), libc::EOPNOTSUPP);
        assert!(stubs::ibv_import_device().is_null());
        stubs::verbs_register_driver_34();
    }
}

#[test]
fn closing_a_context_with_objects_keeps_their_destroy_defined() {
    let ctx = open(1);
    unsafe {
        let pd = ibv_alloc_pd(ctx);
        let cq = ibv_create_cq(ctx, 4, null_mut(), null_mut(), 0);
        assert_eq!(ibv_close_device(ctx), 0);
        assert_eq!(ibv_destroy_cq(cq), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
    }
}

#[test]
fn srq_receives_for_its_qps() {
    let ctx = open(0);
    unsafe {
        let pd = ibv_alloc_pd(ctx);
        let mut init = ibv_srq_init_attr {
            srq_context: null_mut(),
            attr: ibv_srq_attr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
        };
        let srq = ibv_create_srq(pd, &mut init);
        assert!(!srq.is_null());
        assert!(init.attr.max_wr >= 8);
        let mut buf = [0u8; 16];
        let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), 16, 1);
        let mut sge = ibv_sge {
            addr: buf.as_ptr() as u64,
            length: 16,
            lkey: (*mr).lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id: 1,
            next: null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = null_mut();
        assert_eq!(
            ((*ctx).ops.post_srq_recv.unwrap())(srq, &mut wr, &mut bad),
            0
        );
        let mut attr = ibv_srq_attr::default();
        assert_eq!(ibv_query_srq(srq, &mut attr), 0);
        assert_eq!(attr.max_sge, 1);
        let mut num = 0;
        assert_eq!(((*verbs(ctx)).get_srq_num.unwrap())(srq, &mut num), 0);
        let cq = ibv_create_cq(ctx, 8, null_mut(), null_mut(), 0);
        let mut qinit = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq,
            cap: cap(),
            qp_type: 2,
            sq_sig_all: 0,
        };
        let qp = ibv_create_qp(pd, &mut qinit);
        assert!(!qp.is_null());
        assert_eq!(ibv_destroy_srq(srq), libc::EBUSY);

        // A QP of an SRQ moved to ERR raises LAST_WQE_REACHED on the context's async_fd.
        let mut attr = ibv_qp_attr {
            qp_state: 1,
            port_num: 1,
            ..Default::default()
        };
        assert_eq!(ibv_modify_qp(qp, &mut attr, 1 | 8 | 16 | 32), 0);
        let mut attr = ibv_qp_attr {
            qp_state: 6,
            ..Default::default()
        };
        assert_eq!(ibv_modify_qp(qp, &mut attr, 1), 0);
        let mut p = libc::pollfd {
            fd: (*ctx).async_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!(
            libc::poll(&mut p, 1, 5000),
            1,
            "async_fd never became readable"
        );
        let mut ev: ibv_async_event = std::mem::zeroed();
        assert_eq!(ibv_get_async_event(ctx, &mut ev), 0);
        assert_eq!(ev.event_type, 16);
        assert_eq!(ev.element.qp, qp);
        ibv_ack_async_event(&mut ev);
        // Non-blocking async_fd with nothing pending: EAGAIN.
        let fl = libc::fcntl((*ctx).async_fd, libc::F_GETFL);
        libc::fcntl((*ctx).async_fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        assert_eq!(ibv_get_async_event(ctx, &mut ev), -1);
        assert_eq!(errno(), libc::EAGAIN);
        assert_eq!(ibv_destroy_qp(qp), 0);
        assert_eq!(ibv_destroy_srq(srq), 0);
        assert_eq!(ibv_destroy_cq(cq), 0);
        assert_eq!(ibv_dereg_mr(mr), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

/// RESET → INIT → RTR → RTS of a UC QP towards `peer`, with UC's masks (RC's RTR and RTS
/// attributes for READ/atomics, RNR and retries are refused).
fn connect_uc(a: &Node, peer: &Node) {
    let mut attr = ibv_qp_attr {
        qp_state: 1,
        port_num: 1,
        qp_access_flags: 2, // REMOTE_WRITE
        ..Default::default()
    };
    assert_eq!(modify(a.qp, &mut attr, 1 | 8 | 16 | 32), 0);
    let mut attr = ibv_qp_attr {
        qp_state: 2,
        path_mtu: 1,
        dest_qp_num: unsafe { (*peer.qp).qp_num },
        rq_psn: 7,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
        ..Default::default()
    };
    attr.ah_attr.is_global = 1;
    attr.ah_attr.port_num = 1;
    attr.ah_attr.grh.dgid = peer.gid();
    attr.ah_attr.grh.hop_limit = 64;
    let rtr = 1 | (1 << 7) | (1 << 8) | (1 << 20) | (1 << 12);
    let rc_only = (1 << 17) | (1 << 15); // MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER
    assert_eq!(modify(a.qp, &mut attr, rtr | rc_only), libc::EINVAL);
    assert_eq!(modify(a.qp, &mut attr, rtr), 0, "RTR");
    let mut attr = ibv_qp_attr {
        qp_state: 3,
        sq_psn: 7,
        timeout: 14,
        ..Default::default()
    };
    assert_eq!(
        modify(a.qp, &mut attr, 1 | (1 << 16) | (1 << 9)),
        libc::EINVAL
    );
    assert_eq!(modify(a.qp, &mut attr, 1 | (1 << 16)), 0, "RTS");
    assert_eq!(unsafe { (*a.qp).state }, 3);
}

#[test]
fn uc_qps_send_and_write_through_both_posting_paths() {
    for ex in [false, true] {
        let (mut a, b) = (Node::typed(0, ex, 3), Node::typed(1, ex, 3));
        connect_uc(&a, &b);
        connect_uc(&b, &a);
        let b_rkey = unsafe { (*b.mr).rkey };
        unsafe {
            let mut qattr = ibv_qp_attr::default();
            let mut init: ibv_qp_init_attr = std::mem::zeroed();
            assert_eq!(ibv_query_qp(a.qp, &mut qattr, 1, &mut init), 0);
            assert_eq!((init.qp_type, qattr.qp_state, qattr.path_mtu), (3, 3, 1));
        }
        // ibv_post_send: a 600-byte SEND (three 256-byte packets) and a WRITE_WITH_IMM.
        for (i, byte) in a.buf[..600].iter_mut().enumerate() {
            *byte = i as u8;
        }
        let mut rsge = b.sge(0, 1024);
        b.post_recv(&mut rsge, 1);
        let mut rsge = b.sge(3000, 16);
        b.post_recv(&mut rsge, 2);
        let mut sge = a.sge(0, 600);
        let mut wr = send_wr(2, &mut sge, 10); // SEND
        assert_eq!(a.post_send(&mut wr), 0);
        let mut sge = a.sge(0, 300);
        let mut wr = send_wr(1, &mut sge, 11); // RDMA_WRITE_WITH_IMM
        wr.imm_data = 5u32.to_be();
        wr.wr.rdma.remote_addr = b.addr() + 2000;
        wr.wr.rdma.rkey = b_rkey;
        assert_eq!(a.post_send(&mut wr), 0);
        let ids: Vec<(u64, u32)> = a.poll(2).iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(ids, vec![(10, 0), (11, 0)]);
        let wc = b.poll(2);
        assert_eq!((wc[0].wr_id, wc[0].byte_len, wc[0].opcode), (1, 600, 128));
        assert_eq!((wc[1].wr_id, wc[1].byte_len, wc[1].opcode), (2, 300, 129));
        assert_eq!(u32::from_be(wc[1].imm_data), 5);
        assert_eq!(b.buf[..600], a.buf[..600]);
        assert_eq!(b.buf[2000..2300], a.buf[..300]);
        // READ is not a UC operation.
        let mut sge = a.sge(0, 8);
        let mut wr = send_wr(4, &mut sge, 12);
        assert_eq!(a.post_send(&mut wr), libc::EINVAL);
        // The ibv_qp_ex builder: send_imm and rdma_write.
        let mut rsge = b.sge(1000, 64);
        b.post_recv(&mut rsge, 3);
        unsafe {
            let qpx = ibv_qp_to_qp_ex(a.qp);
            a.buf[..3].copy_from_slice(b"abc");
            ((*qpx).wr_start.unwrap())(qpx);
            (*qpx).wr_id = 20;
            (*qpx).wr_flags = 2;
            ((*qpx).wr_rdma_write.unwrap())(qpx, b_rkey, b.addr() + 3500);
            ((*qpx).wr_set_sge.unwrap())(qpx, (*a.mr).lkey, a.addr(), 3);
            (*qpx).wr_id = 21;
            ((*qpx).wr_send_imm.unwrap())(qpx, 8u32.to_be());
            ((*qpx).wr_set_sge.unwrap())(qpx, (*a.mr).lkey, a.addr(), 3);
            assert_eq!(((*qpx).wr_complete.unwrap())(qpx), 0);
        }
        let ids: Vec<u64> = a.poll(2).iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, vec![20, 21]);
        let wc = b.poll(1);
        assert_eq!((wc[0].wr_id, wc[0].byte_len), (3, 3));
        assert_eq!(&b.buf[3500..3503], b"abc");
        assert_eq!(&b.buf[1000..1003], b"abc");
    }
}

/// A type 2 window of `b` over 256 bytes at offset 2048 of a second MR on `b`'s buffer (which
/// allows MW_BIND), bound with `IBV_WR_BIND_MW`: returns (window, MR, R_Key).
fn bind_type2(b: &mut Node) -> (*mut ibv_mw, *mut ibv_mr, u32) {
    unsafe {
        let base = b.buf.as_mut_ptr().add(2048);
        let mr = ibv_reg_mr(b.pd, base.cast(), 1024, 1 | 16); // LOCAL_WRITE | MW_BIND
        assert!(!mr.is_null());
        let mw = ((*b.ctx).ops.alloc_mw.unwrap())(b.pd, 2);
        assert!(!mw.is_null(), "alloc_mw errno {}", errno());
        assert_eq!((*mw).mw_type, 2);
        let rkey = verbs_api::inc_rkey((*mw).rkey);
        let mut wr: ibv_send_wr = std::mem::zeroed();
        wr.wr_id = 50;
        wr.opcode = 8; // IBV_WR_BIND_MW
        wr.send_flags = 2;
        let bind = ibv_send_wr_bind_mw {
            mw,
            rkey,
            bind_info: ibv_mw_bind_info {
                mr,
                addr: base as u64,
                length: 256,
                mw_access_flags: 2, // REMOTE_WRITE
            },
        };
        wr.bind_mw_or_tso = bind.to_words();
        assert_eq!(b.post_send(&mut wr), 0);
        let wc = b.poll(1);
        assert_eq!((wc[0].status, wc[0].opcode, wc[0].wr_id), (0, 5, 50));
        (mw, mr, rkey)
    }
}

/// `a` writes `len` bytes at `va` of `b` under `rkey`; returns the completion status.
fn write_status(a: &Node, va: u64, rkey: u32, len: u32) -> u32 {
    let mut sge = a.sge(0, len);
    let mut wr = send_wr(0, &mut sge, 9);
    wr.wr.rdma = ibv_send_wr_rdma {
        remote_addr: va,
        rkey,
    };
    assert_eq!(a.post_send(&mut wr), 0);
    a.poll(1)[0].status
}

#[test]
fn memory_windows_through_the_ops_table() {
    // Type 2: BIND_MW, a WRITE through the window, SEND_WITH_INV, then the key is dead.
    let (mut a, mut b) = pair(false);
    let (mw, mr, rkey) = bind_type2(&mut b);
    assert_eq!(
        unsafe { ibv_dereg_mr(mr) },
        libc::EBUSY,
        "a window is bound to the MR"
    );
    a.buf[..4].copy_from_slice(b"wind");
    let va = b.addr() + 2048 + 16;
    assert_eq!(write_status(&a, va, rkey, 4), 0);
    assert_eq!(&b.buf[2064..2068], b"wind");
    let mut rsge = b.sge(0, 64);
    b.post_recv(&mut rsge, 7);
    let mut sge = a.sge(0, 8);
    let mut wr = send_wr(9, &mut sge, 2); // IBV_WR_SEND_WITH_INV
    wr.imm_data = rkey; // invalidate_rkey, host order
    assert_eq!(a.post_send(&mut wr), 0);
    assert_eq!(a.poll(1)[0].status, 0);
    let wc = b.poll(1);
    assert_eq!((wc[0].status, wc[0].opcode), (0, 128));
    assert_eq!(wc[0].wc_flags & 8, 8, "IBV_WC_WITH_INV");
    assert_eq!(wc[0].imm_data, rkey, "invalidated_rkey");
    assert_eq!(write_status(&a, va, rkey, 4), 10, "REM_ACCESS_ERR");
    unsafe {
        assert_eq!(((*b.ctx).ops.dealloc_mw.unwrap())(mw), 0);
        assert_eq!(ibv_dereg_mr(mr), 0);
    }

    // Type 1: ibv_bind_mw through the ops table moves the key; a zero-length bind unbinds.
    let (mut a, b) = pair(false);
    unsafe {
        let base = b.buf.as_ptr().add(1024).cast_mut();
        let mr = ibv_reg_mr(b.pd, base.cast(), 512, 1 | 16);
        let mw = ((*b.ctx).ops.alloc_mw.unwrap())(b.pd, 1);
        let old = (*mw).rkey;
        let mut bind = ibv_mw_bind {
            wr_id: 60,
            send_flags: 2,
            bind_info: ibv_mw_bind_info {
                mr,
                addr: base as u64,
                length: 512,
                mw_access_flags: 2,
            },
        };
        assert_eq!(((*b.ctx).ops.bind_mw.unwrap())(b.qp, mw, &mut bind), 0);
        let rkey = (*mw).rkey;
        assert_eq!(rkey, verbs_api::inc_rkey(old));
        assert_eq!(b.poll(1)[0].opcode, 5);
        a.buf[..2].copy_from_slice(b"t1");
        assert_eq!(write_status(&a, base as u64 + 8, rkey, 2), 0);
        assert_eq!(&b.buf[1032..1034], b"t1");
        bind.bind_info.length = 0;
        assert_eq!(((*b.ctx).ops.bind_mw.unwrap())(b.qp, mw, &mut bind), 0);
        assert_eq!(b.poll(1)[0].status, 0);
        assert_eq!(write_status(&a, base as u64 + 8, (*mw).rkey, 2), 10);
        assert_eq!(((*b.ctx).ops.dealloc_mw.unwrap())(mw), 0);
        assert_eq!(ibv_dereg_mr(mr), 0);
    }
}
