//! `#[repr(C)]` mirrors of the libibverbs structs this backend touches, written from the ABI
//! digest (libibverbs-abi.md §4.2) and checked against rdma-core 44's `infiniband/verbs.h`
//! (x86-64 sizes asserted in the tests below). Only the public, stable part of each struct is
//! declared; the provider-private tails that follow the public objects are never touched.
//!
//! Names keep rdma-core's spelling so that the fields can be found in its documentation.

#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `struct _ibv_device_ops`: two obsolete pointers at the start of `ibv_device`.
#[repr(C)]
pub(crate) struct ibv_device_ops_obsolete {
    pub(crate) _dummy: [*mut c_void; 2],
}

/// `struct ibv_device` (664 bytes).
#[repr(C)]
pub(crate) struct ibv_device {
    pub(crate) _ops: ibv_device_ops_obsolete,
    pub(crate) node_type: c_int,
    pub(crate) transport_type: c_int,
    pub(crate) name: [c_char; 64],
    pub(crate) dev_name: [c_char; 64],
    pub(crate) dev_path: [c_char; 256],
    pub(crate) ibdev_path: [c_char; 256],
}

/// `ops.poll_cq`.
pub(crate) type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// `ops.req_notify_cq`.
pub(crate) type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
/// `ops.post_srq_recv`.
pub(crate) type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ops.post_send`.
pub(crate) type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// `ops.post_recv`.
pub(crate) type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// `struct ibv_context_ops` (32 pointers, 256 bytes): the classic dispatch table the
/// header-inline data-path calls go through. Members this backend does not call are opaque.
#[repr(C)]
pub(crate) struct ibv_context_ops {
    /// `_compat_query_device` … `_compat_dereg_mr` (7), `alloc_mw`, `bind_mw`, `dealloc_mw`,
    /// `_compat_create_cq`.
    pub(crate) _before_poll_cq: [*mut c_void; 11],
    pub(crate) poll_cq: Option<PollCqFn>,
    pub(crate) req_notify_cq: Option<ReqNotifyCqFn>,
    /// `_compat_cq_event` … `_compat_destroy_srq` (7).
    pub(crate) _before_post_srq_recv: [*mut c_void; 7],
    pub(crate) post_srq_recv: Option<PostSrqRecvFn>,
    /// `_compat_create_qp`, `_compat_query_qp`, `_compat_modify_qp`, `_compat_destroy_qp`.
    pub(crate) _before_post_send: [*mut c_void; 4],
    pub(crate) post_send: Option<PostSendFn>,
    pub(crate) post_recv: Option<PostRecvFn>,
    /// `_compat_create_ah` … `_compat_async_event` (5).
    pub(crate) _after_post_recv: [*mut c_void; 5],
}

/// `struct ibv_context` (328 bytes).
#[repr(C)]
pub(crate) struct ibv_context {
    pub(crate) device: *mut ibv_device,
    pub(crate) ops: ibv_context_ops,
    pub(crate) cmd_fd: c_int,
    pub(crate) async_fd: c_int,
    pub(crate) num_comp_vectors: c_int,
    pub(crate) mutex: libc::pthread_mutex_t,
    pub(crate) abi_compat: *mut c_void,
}

/// `struct ibv_pd` (16 bytes).
#[repr(C)]
pub(crate) struct ibv_pd {
    pub(crate) context: *mut ibv_context,
    pub(crate) handle: u32,
}

/// `struct ibv_mr` (48 bytes).
#[repr(C)]
pub(crate) struct ibv_mr {
    pub(crate) context: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) addr: *mut c_void,
    pub(crate) length: usize,
    pub(crate) handle: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

/// `struct ibv_comp_channel` (16 bytes).
#[repr(C)]
pub(crate) struct ibv_comp_channel {
    pub(crate) context: *mut ibv_context,
    pub(crate) fd: c_int,
    pub(crate) refcnt: c_int,
}

/// `struct ibv_cq` (128 bytes).
#[repr(C)]
pub(crate) struct ibv_cq {
    pub(crate) context: *mut ibv_context,
    pub(crate) channel: *mut ibv_comp_channel,
    pub(crate) cq_context: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) cqe: c_int,
    pub(crate) mutex: libc::pthread_mutex_t,
    pub(crate) cond: libc::pthread_cond_t,
    pub(crate) comp_events_completed: u32,
    pub(crate) async_events_completed: u32,
}

/// `struct ibv_srq` (128 bytes).
#[repr(C)]
pub(crate) struct ibv_srq {
    pub(crate) context: *mut ibv_context,
    pub(crate) srq_context: *mut c_void,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) handle: u32,
    pub(crate) mutex: libc::pthread_mutex_t,
    pub(crate) cond: libc::pthread_cond_t,
    pub(crate) events_completed: u32,
}

/// `struct ibv_qp` (160 bytes).
#[repr(C)]
pub(crate) struct ibv_qp {
    pub(crate) context: *mut ibv_context,
    pub(crate) qp_context: *mut c_void,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut ibv_srq,
    pub(crate) handle: u32,
    pub(crate) qp_num: u32,
    pub(crate) state: c_uint,
    pub(crate) qp_type: c_uint,
    pub(crate) mutex: libc::pthread_mutex_t,
    pub(crate) cond: libc::pthread_cond_t,
    pub(crate) events_completed: u32,
}

/// `union ibv_gid` (16 bytes, 8-byte aligned because of its `__be64` view).
#[repr(C, align(8))]
#[derive(Copy, Clone, Default)]
pub(crate) struct ibv_gid {
    pub(crate) raw: [u8; 16],
}

/// `struct ibv_global_route` (24 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub(crate) struct ibv_global_route {
    pub(crate) dgid: ibv_gid,
    pub(crate) flow_label: u32,
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
}

/// `struct ibv_ah_attr` (32 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub(crate) struct ibv_ah_attr {
    pub(crate) grh: ibv_global_route,
    pub(crate) dlid: u16,
    pub(crate) sl: u8,
    pub(crate) src_path_bits: u8,
    pub(crate) static_rate: u8,
    pub(crate) is_global: u8,
    pub(crate) port_num: u8,
}

/// `struct ibv_qp_cap` (20 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub(crate) struct ibv_qp_cap {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (64 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub(crate) struct ibv_qp_init_attr {
    pub(crate) qp_context: *mut c_void,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut ibv_srq,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) qp_type: c_uint,
    pub(crate) sq_sig_all: c_int,
}

/// `struct ibv_qp_attr` (144 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub(crate) struct ibv_qp_attr {
    pub(crate) qp_state: c_uint,
    pub(crate) cur_qp_state: c_uint,
    pub(crate) path_mtu: c_uint,
    pub(crate) path_mig_state: c_uint,
    pub(crate) qkey: u32,
    pub(crate) rq_psn: u32,
    pub(crate) sq_psn: u32,
    pub(crate) dest_qp_num: u32,
    pub(crate) qp_access_flags: c_uint,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) ah_attr: ibv_ah_attr,
    pub(crate) alt_ah_attr: ibv_ah_attr,
    pub(crate) pkey_index: u16,
    pub(crate) alt_pkey_index: u16,
    pub(crate) en_sqd_async_notify: u8,
    pub(crate) sq_draining: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) port_num: u8,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) alt_port_num: u8,
    pub(crate) alt_timeout: u8,
    pub(crate) rate_limit: u32,
}

/// `struct ibv_srq_attr` (12 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub(crate) struct ibv_srq_attr {
    pub(crate) max_wr: u32,
    pub(crate) max_sge: u32,
    pub(crate) srq_limit: u32,
}

/// `struct ibv_srq_init_attr` (24 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub(crate) struct ibv_srq_init_attr {
    pub(crate) srq_context: *mut c_void,
    pub(crate) attr: ibv_srq_attr,
}

/// `ibv_srq_attr_mask`: `IBV_SRQ_LIMIT`.
pub(crate) const IBV_SRQ_LIMIT: c_int = 1 << 1;

/// `struct ibv_sge` (16 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub(crate) struct ibv_sge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

/// `wr.rdma` of `ibv_send_wr`.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub(crate) struct ibv_send_wr_rdma {
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
}

/// `wr.atomic` of `ibv_send_wr`.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub(crate) struct ibv_send_wr_atomic {
    pub(crate) remote_addr: u64,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    pub(crate) rkey: u32,
}

/// `wr.ud` of `ibv_send_wr`: the `ibv_ah` pointer, remote QPN and Q_Key of a UD send.
#[repr(C)]
#[derive(Copy, Clone)]
pub(crate) struct ibv_send_wr_ud {
    pub(crate) ah: *mut c_void,
    pub(crate) remote_qpn: u32,
    pub(crate) remote_qkey: u32,
}

/// The `wr` union of `ibv_send_wr` (32 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub(crate) union ibv_send_wr_wr {
    pub(crate) rdma: ibv_send_wr_rdma,
    pub(crate) atomic: ibv_send_wr_atomic,
    pub(crate) ud: ibv_send_wr_ud,
}

/// `struct ibv_send_wr` (128 bytes). `imm_data` is in network byte order; the trailing
/// `bind_mw`/`tso` union (48 bytes) is never used by RC sends and is kept zeroed.
#[repr(C)]
#[derive(Copy, Clone)]
pub(crate) struct ibv_send_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_send_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
    pub(crate) opcode: c_uint,
    pub(crate) send_flags: c_uint,
    pub(crate) imm_data: u32,
    pub(crate) wr: ibv_send_wr_wr,
    pub(crate) qp_type_xrc_remote_srqn: u32,
    pub(crate) bind_mw_or_tso: [u64; 6],
}

/// `struct ibv_recv_wr` (32 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub(crate) struct ibv_recv_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_recv_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
}

/// `struct ibv_wc` (48 bytes). `imm_data` is in network byte order.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub(crate) struct ibv_wc {
    pub(crate) wr_id: u64,
    pub(crate) status: c_uint,
    pub(crate) opcode: c_uint,
    pub(crate) vendor_err: u32,
    pub(crate) byte_len: u32,
    pub(crate) imm_data: u32,
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) wc_flags: c_uint,
    pub(crate) pkey_index: u16,
    pub(crate) slid: u16,
    pub(crate) sl: u8,
    pub(crate) dlid_path_bits: u8,
}

/// `struct ibv_device_attr` (232 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub(crate) struct ibv_device_attr {
    pub(crate) fw_ver: [c_char; 64],
    pub(crate) node_guid: u64,
    pub(crate) sys_image_guid: u64,
    pub(crate) max_mr_size: u64,
    pub(crate) page_size_cap: u64,
    pub(crate) vendor_id: u32,
    pub(crate) vendor_part_id: u32,
    pub(crate) hw_ver: u32,
    pub(crate) max_qp: c_int,
    pub(crate) max_qp_wr: c_int,
    pub(crate) device_cap_flags: c_uint,
    pub(crate) max_sge: c_int,
    pub(crate) max_sge_rd: c_int,
    pub(crate) max_cq: c_int,
    pub(crate) max_cqe: c_int,
    pub(crate) max_mr: c_int,
    pub(crate) max_pd: c_int,
    pub(crate) max_qp_rd_atom: c_int,
    pub(crate) max_ee_rd_atom: c_int,
    pub(crate) max_res_rd_atom: c_int,
    pub(crate) max_qp_init_rd_atom: c_int,
    pub(crate) max_ee_init_rd_atom: c_int,
    pub(crate) atomic_cap: c_uint,
    pub(crate) max_ee: c_int,
    pub(crate) max_rdd: c_int,
    pub(crate) max_mw: c_int,
    pub(crate) max_raw_ipv6_qp: c_int,
    pub(crate) max_raw_ethy_qp: c_int,
    pub(crate) max_mcast_grp: c_int,
    pub(crate) max_mcast_qp_attach: c_int,
    pub(crate) max_total_mcast_qp_attach: c_int,
    pub(crate) max_ah: c_int,
    pub(crate) max_fmr: c_int,
    pub(crate) max_map_per_fmr: c_int,
    pub(crate) max_srq: c_int,
    pub(crate) max_srq_wr: c_int,
    pub(crate) max_srq_sge: c_int,
    pub(crate) max_pkeys: u16,
    pub(crate) local_ca_ack_delay: u8,
    pub(crate) phys_port_cnt: u8,
}

/// `struct ibv_port_attr` as of rdma-core 44 (52 bytes) plus spare room for members newer
/// libraries append. The exported `ibv_query_port@IBVERBS_1.1` writes only the
/// `_compat_ibv_port_attr` prefix (up to `flags`), which this layout covers.
#[repr(C)]
#[derive(Copy, Clone)]
pub(crate) struct ibv_port_attr {
    pub(crate) state: c_uint,
    pub(crate) max_mtu: c_uint,
    pub(crate) active_mtu: c_uint,
    pub(crate) gid_tbl_len: c_int,
    pub(crate) port_cap_flags: u32,
    pub(crate) max_msg_sz: u32,
    pub(crate) bad_pkey_cntr: u32,
    pub(crate) qkey_viol_cntr: u32,
    pub(crate) pkey_tbl_len: u16,
    pub(crate) lid: u16,
    pub(crate) sm_lid: u16,
    pub(crate) lmc: u8,
    pub(crate) max_vl_num: u8,
    pub(crate) sm_sl: u8,
    pub(crate) subnet_timeout: u8,
    pub(crate) init_type_reply: u8,
    pub(crate) active_width: u8,
    pub(crate) active_speed: u8,
    pub(crate) phys_state: u8,
    pub(crate) link_layer: u8,
    pub(crate) flags: u8,
    pub(crate) port_cap_flags2: u16,
    pub(crate) _newer: [u8; 32],
}

/// The `element` union of `ibv_async_event`.
#[repr(C)]
#[derive(Copy, Clone)]
pub(crate) union ibv_async_event_element {
    pub(crate) cq: *mut ibv_cq,
    pub(crate) qp: *mut ibv_qp,
    pub(crate) srq: *mut ibv_srq,
    pub(crate) wq: *mut c_void,
    pub(crate) port_num: c_int,
}

/// `struct ibv_async_event` (16 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub(crate) struct ibv_async_event {
    pub(crate) element: ibv_async_event_element,
    pub(crate) event_type: c_uint,
}

/// `IBV_LINK_LAYER_ETHERNET`.
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// `IBV_ACCESS_OPTIONAL_RANGE`: access bits a kernel may ignore; registering with any of them
/// goes through `ibv_reg_mr_iova2`, as the header's `ibv_reg_mr` macro does.
pub(crate) const IBV_ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// Sizes from libibverbs-abi.md §4.2 (and `sizeof` under rdma-core 44's header).
    #[test]
    fn layouts_match_rdma_core() {
        assert_eq!(size_of::<ibv_device>(), 664);
        assert_eq!(size_of::<ibv_context_ops>(), 256);
        assert_eq!(size_of::<ibv_context>(), 328);
        assert_eq!(size_of::<ibv_pd>(), 16);
        assert_eq!(size_of::<ibv_mr>(), 48);
        assert_eq!(size_of::<ibv_comp_channel>(), 16);
        assert_eq!(size_of::<ibv_cq>(), 128);
        assert_eq!(size_of::<ibv_srq>(), 128);
        assert_eq!(size_of::<ibv_qp>(), 160);
        assert_eq!(size_of::<ibv_global_route>(), 24);
        assert_eq!(size_of::<ibv_ah_attr>(), 32);
        assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
        assert_eq!(size_of::<ibv_qp_attr>(), 144);
        assert_eq!(size_of::<ibv_srq_init_attr>(), 24);
        assert_eq!(size_of::<ibv_sge>(), 16);
        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(size_of::<ibv_recv_wr>(), 32);
        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(size_of::<ibv_device_attr>(), 232);
        assert_eq!(size_of::<ibv_async_event>(), 16);
        assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
        assert_eq!(offset_of!(ibv_port_attr, _newer), 50);
    }

    /// Offsets of the members read or written, as rdma-core 44 compiles them.
    #[test]
    fn offsets_match_rdma_core() {
        assert_eq!(offset_of!(ibv_device, name), 24);
        assert_eq!(offset_of!(ibv_context, ops), 8);
        assert_eq!(offset_of!(ibv_context, async_fd), 268);
        assert_eq!(offset_of!(ibv_context_ops, poll_cq), 88);
        assert_eq!(offset_of!(ibv_context_ops, req_notify_cq), 96);
        assert_eq!(offset_of!(ibv_context_ops, post_srq_recv), 160);
        assert_eq!(offset_of!(ibv_context_ops, post_send), 200);
        assert_eq!(offset_of!(ibv_context_ops, post_recv), 208);
        assert_eq!(offset_of!(ibv_cq, cq_context), 16);
        assert_eq!(offset_of!(ibv_qp, qp_num), 52);
        assert_eq!(offset_of!(ibv_srq, srq_context), 8);
        assert_eq!(offset_of!(ibv_send_wr, imm_data), 36);
        assert_eq!(offset_of!(ibv_send_wr, wr), 40);
        assert_eq!(offset_of!(ibv_send_wr, qp_type_xrc_remote_srqn), 72);
        assert_eq!(offset_of!(ibv_send_wr, bind_mw_or_tso), 80);
        assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
        assert_eq!(offset_of!(ibv_wc, sl), 44);
        assert_eq!(offset_of!(ibv_qp_attr, retry_cnt), 131);
        assert_eq!(offset_of!(ibv_qp_init_attr, qp_type), 52);
        assert_eq!(offset_of!(ibv_device_attr, atomic_cap), 164);
        assert_eq!(offset_of!(ibv_port_attr, port_cap_flags2), 48);
        assert_eq!(offset_of!(ibv_qp_attr, ah_attr), 56);
        assert_eq!(offset_of!(ibv_qp_attr, pkey_index), 120);
        assert_eq!(offset_of!(ibv_qp_attr, rate_limit), 136);
        assert_eq!(offset_of!(ibv_device_attr, phys_port_cnt), 227);
        assert_eq!(offset_of!(ibv_device_attr, max_srq_sge), 220);
    }
}
