//! `ibverbs-sys`: `#[repr(C)]` mirrors of libibverbs' public structs, shared by the hardware
//! backend (`verbs-hw`, which calls a real libibverbs) and the `libibverbs.so.1` drop-in
//! (`softverbs-ibverbs`, which *is* one).
//!
//! Written from the ABI digest (libibverbs-abi.md §4.2) and checked against rdma-core 44's
//! `infiniband/verbs.h` (x86-64 sizes asserted in the unit tests below; `tests/c_layout.rs`
//! compiles a C program against the installed header and compares every offset the two users
//! touch). Where rdma-core 65 grew a struct, the newest layout is declared: `verbs_context` grows
//! at the front, `ibv_qp_ex` and `ibv_port_attr` at the end, so the newest layout serves
//! programs compiled against either header.
//!
//! [`convert`] holds the conversions to and from `verbs_api` values that both users share.
//!
//! What this crate is not: bindings to functions (the hardware backend resolves those at run
//! time) or the provider-private tails that follow the public objects.
//!
//! Names keep rdma-core's spelling so that the fields can be found in its documentation; the
//! fields are documented there, not here.

#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_uint, c_void};

pub mod convert;

/// `struct _ibv_device_ops`: two obsolete pointers at the start of `ibv_device`.
#[repr(C)]
pub struct ibv_device_ops_obsolete {
    pub _dummy: [*mut c_void; 2],
}

/// `struct ibv_device` (664 bytes).
#[repr(C)]
pub struct ibv_device {
    pub _ops: ibv_device_ops_obsolete,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

/// `ops.poll_cq`.
pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// `ops.req_notify_cq`.
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
/// `ops.post_srq_recv`.
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ops.post_send`.
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// `ops.post_recv`.
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// `ops.alloc_mw(pd, type)`.
pub type AllocMwFn = unsafe extern "C" fn(*mut ibv_pd, c_uint) -> *mut ibv_mw;
/// `ops.bind_mw(qp, mw, mw_bind)`.
pub type BindMwFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int;
/// `ops.dealloc_mw(mw)`.
pub type DeallocMwFn = unsafe extern "C" fn(*mut ibv_mw) -> c_int;

/// `struct ibv_mw` (32 bytes): a memory window.
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    /// `enum ibv_mw_type`: 1 or 2.
    pub mw_type: c_uint,
}

/// `struct ibv_mw_bind_info` (32 bytes): what a bind covers; also the last 32 bytes of an
/// `ibv_send_wr`'s `bind_mw`.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind` (48 bytes): the argument of `ibv_bind_mw`.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

/// The `bind_mw` member of an `ibv_send_wr`'s trailing union (48 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

impl ibv_send_wr_bind_mw {
    /// The six words of [`ibv_send_wr::bind_mw_or_tso`] holding this member (pointers as
    /// addresses; `rkey` and `mw_access_flags` in their word as a C compiler lays them out).
    pub fn to_words(&self) -> [u64; 6] {
        [
            self.mw.addr() as u64,
            u32_word(self.rkey),
            self.bind_info.mr.addr() as u64,
            self.bind_info.addr,
            self.bind_info.length,
            u32_word(self.bind_info.mw_access_flags),
        ]
    }

    /// The member held by the six words of [`ibv_send_wr::bind_mw_or_tso`] (the pointers
    /// exposed again from their addresses).
    pub fn from_words(w: &[u64; 6]) -> ibv_send_wr_bind_mw {
        ibv_send_wr_bind_mw {
            mw: std::ptr::with_exposed_provenance_mut(w[0] as usize),
            rkey: word_u32(w[1]),
            bind_info: ibv_mw_bind_info {
                mr: std::ptr::with_exposed_provenance_mut(w[2] as usize),
                addr: w[3],
                length: w[4],
                mw_access_flags: word_u32(w[5]),
            },
        }
    }
}

/// A `u32` at the start of an 8-byte word, as the word reads.
fn u32_word(v: u32) -> u64 {
    if cfg!(target_endian = "little") {
        u64::from(v)
    } else {
        u64::from(v) << 32
    }
}

/// The `u32` at the start of an 8-byte word.
fn word_u32(w: u64) -> u32 {
    if cfg!(target_endian = "little") {
        w as u32
    } else {
        (w >> 32) as u32
    }
}

/// `struct ibv_context_ops` (32 pointers, 256 bytes): the classic dispatch table the
/// header-inline data-path calls go through. Members this backend does not call are opaque.
#[repr(C)]
pub struct ibv_context_ops {
    /// `_compat_query_device` … `_compat_dereg_mr` (7).
    pub _before_alloc_mw: [*mut c_void; 7],
    pub alloc_mw: Option<AllocMwFn>,
    pub bind_mw: Option<BindMwFn>,
    pub dealloc_mw: Option<DeallocMwFn>,
    /// `_compat_create_cq`.
    pub _compat_create_cq: *mut c_void,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    /// `_compat_cq_event` … `_compat_destroy_srq` (7).
    pub _before_post_srq_recv: [*mut c_void; 7],
    pub post_srq_recv: Option<PostSrqRecvFn>,
    /// `_compat_create_qp`, `_compat_query_qp`, `_compat_modify_qp`, `_compat_destroy_qp`.
    pub _before_post_send: [*mut c_void; 4],
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    /// `_compat_create_ah` … `_compat_async_event` (5).
    pub _after_post_recv: [*mut c_void; 5],
}

/// `struct ibv_context` (328 bytes).
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct ibv_pd` (16 bytes).
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr` (48 bytes).
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel` (16 bytes).
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq` (128 bytes).
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_srq` (128 bytes).
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp` (160 bytes).
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

/// `union ibv_gid` (16 bytes, 8-byte aligned because of its `__be64` view).
#[repr(C, align(8))]
#[derive(Copy, Clone, Default)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_global_route` (24 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr` (32 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_cap` (20 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (64 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `struct ibv_qp_attr` (144 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_srq_attr` (12 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr` (24 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `ibv_srq_attr_mask`: `IBV_SRQ_LIMIT`.
pub const IBV_SRQ_LIMIT: c_int = 1 << 1;

/// `struct ibv_sge` (16 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` of `ibv_send_wr`.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic` of `ibv_send_wr`.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud` of `ibv_send_wr`: the `ibv_ah` pointer, remote QPN and Q_Key of a UD send.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_send_wr_ud {
    pub ah: *mut c_void,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of `ibv_send_wr` (32 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

/// `struct ibv_send_wr` (128 bytes). `imm_data` is in network byte order, except for
/// LOCAL_INV and SEND_WITH_INV, where the same slot is `invalidate_rkey` in host order; the
/// trailing `bind_mw`/`tso` union (48 bytes) holds a BIND_MW's [`ibv_send_wr_bind_mw`] (see
/// its `to_words`) and is zero otherwise.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    pub qp_type_xrc_remote_srqn: u32,
    pub bind_mw_or_tso: [u64; 6],
}

/// `struct ibv_recv_wr` (32 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc` (48 bytes). `imm_data` is in network byte order.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_device_attr` (232 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_uint,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr` as of rdma-core 65 (56 bytes; rdma-core 44's is the first 52). The
/// exported `ibv_query_port@IBVERBS_1.1` writes only the `_compat_ibv_port_attr` prefix (up to
/// `flags`); the header's `ibv_query_port` macro passes `sizeof` of the caller's version to
/// `verbs_context.query_port`, which must write no more than that.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
    pub active_speed_ex: u32,
}

/// Bytes of `ibv_port_attr` in rdma-core 44 (`sizeof` in a program built against its header).
pub const IBV_PORT_ATTR_SIZE_V44: usize = 52;

/// The `element` union of `ibv_async_event`.
#[repr(C)]
#[derive(Copy, Clone)]
pub union ibv_async_event_element {
    pub cq: *mut ibv_cq,
    pub qp: *mut ibv_qp,
    pub srq: *mut ibv_srq,
    pub wq: *mut c_void,
    pub port_num: c_int,
}

/// `struct ibv_async_event` (16 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_async_event {
    pub element: ibv_async_event_element,
    pub event_type: c_uint,
}

/// `IBV_LINK_LAYER_ETHERNET`.
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// `IBV_ACCESS_OPTIONAL_RANGE`: access bits a kernel may ignore; registering with any of them
/// goes through `ibv_reg_mr_iova2`, as the header's `ibv_reg_mr` macro does.
pub const IBV_ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

/// `struct ibv_ah` (24 bytes).
#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// `struct ibv_gid_entry` (32 bytes), filled by `_ibv_query_gid_ex`.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `enum ibv_gid_type` (public): `IBV_GID_TYPE_ROCE_V2`.
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `enum ibv_gid_type_sysfs` (private, `ibv_query_gid_type`): `IBV_GID_TYPE_SYSFS_ROCE_V2`.
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: c_int = 1;

/// `struct ibv_query_device_ex_input` (4 bytes).
#[repr(C)]
pub struct ibv_query_device_ex_input {
    pub comp_mask: u32,
}

/// `struct ibv_odp_caps`.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_odp_caps {
    pub general_caps: u64,
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

/// `struct ibv_tso_caps`.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_tso_caps {
    pub max_tso: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_rss_caps`.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_rss_caps {
    pub supported_qpts: u32,
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    pub rx_hash_function: u8,
}

/// `struct ibv_packet_pacing_caps`.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_packet_pacing_caps {
    pub qp_rate_limit_min: u32,
    pub qp_rate_limit_max: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_tm_caps`.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_tm_caps {
    pub max_rndv_hdr_size: u32,
    pub max_num_tags: u32,
    pub flags: u32,
    pub max_ops: u32,
    pub max_sge: u32,
}

/// `struct ibv_cq_moderation_caps`.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_cq_moderation_caps {
    pub max_cq_count: u16,
    pub max_cq_period: u16,
}

/// `struct ibv_pci_atomic_caps`.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_pci_atomic_caps {
    pub fetch_add: u16,
    pub swap: u16,
    pub compare_swap: u16,
}

/// `struct ibv_device_attr_ex` (rdma-core 44 and 65 alike). `query_device_ex` gets the
/// caller's `sizeof` and writes no more.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_caps: ibv_odp_caps,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    pub tso_caps: ibv_tso_caps,
    pub rss_caps: ibv_rss_caps,
    pub max_wq_type_rq: u32,
    pub packet_pacing_caps: ibv_packet_pacing_caps,
    pub raw_packet_caps: u32,
    pub tm_caps: ibv_tm_caps,
    pub cq_mod_caps: ibv_cq_moderation_caps,
    pub max_dm_size: u64,
    pub pci_atomic_caps: ibv_pci_atomic_caps,
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

/// `IBV_DEVICE_RC_RNR_NAK_GEN` of `ibv_device_cap_flags`.
pub const IBV_DEVICE_RC_RNR_NAK_GEN: c_uint = 1 << 12;

/// `struct ibv_rx_hash_conf` (24 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex` (136 bytes): `ibv_qp_init_attr`, then the extended members
/// named by `comp_mask`.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

/// `IBV_QP_INIT_ATTR_PD` of `ibv_qp_init_attr_mask`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
/// `IBV_QP_INIT_ATTR_CREATE_FLAGS`.
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
/// The `ibv_qp_create_send_ops_flags` an RC QP of softverbs offers: RDMA_WRITE(_WITH_IMM),
/// SEND(_WITH_IMM), RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD, LOCAL_INV, BIND_MW,
/// SEND_WITH_INV.
pub const IBV_QP_EX_RC_OPS: u64 = 0x3ff;

/// `struct ibv_cq_init_attr_ex` (56 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

/// `struct ibv_poll_cq_attr` (4 bytes).
#[repr(C)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

/// `struct ibv_data_buf` (16 bytes), for `wr_set_inline_data_list`.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

/// `ibv_cq_ex.start_poll`.
pub type StartPollFn = unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int;
/// `ibv_cq_ex.next_poll`.
pub type NextPollFn = unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int;
/// `ibv_cq_ex.end_poll`.
pub type EndPollFn = unsafe extern "C" fn(*mut ibv_cq_ex);
/// `ibv_cq_ex.read_*` returning 32 bits.
pub type ReadU32Fn = unsafe extern "C" fn(*mut ibv_cq_ex) -> u32;
/// `ibv_cq_ex.read_*` returning 16 bits.
pub type ReadU16Fn = unsafe extern "C" fn(*mut ibv_cq_ex) -> u16;
/// `ibv_cq_ex.read_*` returning 8 bits.
pub type ReadU8Fn = unsafe extern "C" fn(*mut ibv_cq_ex) -> u8;
/// `ibv_cq_ex.read_*` returning 64 bits.
pub type ReadU64Fn = unsafe extern "C" fn(*mut ibv_cq_ex) -> u64;
/// `ibv_cq_ex.read_tm_info`.
pub type ReadTmInfoFn = unsafe extern "C" fn(*mut ibv_cq_ex, *mut c_void);

/// `struct ibv_cq_ex` (288 bytes): the `ibv_cq` members, then the polling ops.
#[repr(C)]
pub struct ibv_cq_ex {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    pub status: c_uint,
    pub wr_id: u64,
    pub start_poll: Option<StartPollFn>,
    pub next_poll: Option<NextPollFn>,
    pub end_poll: Option<EndPollFn>,
    pub read_opcode: Option<ReadU32Fn>,
    pub read_vendor_err: Option<ReadU32Fn>,
    pub read_byte_len: Option<ReadU32Fn>,
    pub read_imm_data: Option<ReadU32Fn>,
    pub read_qp_num: Option<ReadU32Fn>,
    pub read_src_qp: Option<ReadU32Fn>,
    pub read_wc_flags: Option<ReadU32Fn>,
    pub read_slid: Option<ReadU32Fn>,
    pub read_sl: Option<ReadU8Fn>,
    pub read_dlid_path_bits: Option<ReadU8Fn>,
    pub read_completion_ts: Option<ReadU64Fn>,
    pub read_cvlan: Option<ReadU16Fn>,
    pub read_flow_tag: Option<ReadU32Fn>,
    pub read_tm_info: Option<ReadTmInfoFn>,
    pub read_completion_wallclock_ns: Option<ReadU64Fn>,
}

/// `ibv_qp_ex` op without arguments (`wr_send`, `wr_start`, `wr_abort`).
pub type WrFn = unsafe extern "C" fn(*mut ibv_qp_ex);
/// `wr_complete`.
pub type WrCompleteFn = unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int;
/// `wr_atomic_cmp_swp(qp, rkey, remote_addr, compare, swap)`.
pub type WrCmpSwpFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64);
/// `wr_atomic_fetch_add(qp, rkey, remote_addr, add)`.
pub type WrFetchAddFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64);
/// `wr_rdma_read`/`wr_rdma_write(qp, rkey, remote_addr)`.
pub type WrRdmaFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64);
/// `wr_rdma_write_imm(qp, rkey, remote_addr, imm_data)` (imm in network order).
pub type WrRdmaImmFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32);
/// `wr_send_imm(qp, imm_data)`, `wr_send_inv(qp, rkey)`, `wr_local_inv(qp, rkey)`,
/// `wr_set_xrc_srqn(qp, srqn)`.
pub type WrU32Fn = unsafe extern "C" fn(*mut ibv_qp_ex, u32);
/// `wr_send_tso(qp, hdr, hdr_sz, mss)`.
pub type WrSendTsoFn = unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16);
/// `wr_bind_mw(qp, mw, rkey, bind_info)`.
pub type WrBindMwFn = unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u32, *const c_void);
/// `wr_set_ud_addr(qp, ah, remote_qpn, remote_qkey)`.
pub type WrSetUdAddrFn = unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32);
/// `wr_set_inline_data(qp, addr, length)`.
pub type WrSetInlineFn = unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize);
/// `wr_set_inline_data_list(qp, num_buf, buf_list)`.
pub type WrSetInlineListFn = unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf);
/// `wr_set_sge(qp, lkey, addr, length)`.
pub type WrSetSgeFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32);
/// `wr_set_sge_list(qp, num_sge, sg_list)`.
pub type WrSetSgeListFn = unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge);
/// `wr_atomic_write(qp, rkey, remote_addr, atomic_wr)`.
pub type WrAtomicWriteFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void);

/// `struct ibv_qp_ex` as of rdma-core 65 (360 bytes; rdma-core 44's is the first 352): the
/// `ibv_qp`, then the work-request builder ops `ibv_wr_*` call.
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<WrCmpSwpFn>,
    pub wr_atomic_fetch_add: Option<WrFetchAddFn>,
    pub wr_bind_mw: Option<WrBindMwFn>,
    pub wr_local_inv: Option<WrU32Fn>,
    pub wr_rdma_read: Option<WrRdmaFn>,
    pub wr_rdma_write: Option<WrRdmaFn>,
    pub wr_rdma_write_imm: Option<WrRdmaImmFn>,
    pub wr_send: Option<WrFn>,
    pub wr_send_imm: Option<WrU32Fn>,
    pub wr_send_inv: Option<WrU32Fn>,
    pub wr_send_tso: Option<WrSendTsoFn>,
    pub wr_set_ud_addr: Option<WrSetUdAddrFn>,
    pub wr_set_xrc_srqn: Option<WrU32Fn>,
    pub wr_set_inline_data: Option<WrSetInlineFn>,
    pub wr_set_inline_data_list: Option<WrSetInlineListFn>,
    pub wr_set_sge: Option<WrSetSgeFn>,
    pub wr_set_sge_list: Option<WrSetSgeListFn>,
    pub wr_start: Option<WrFn>,
    pub wr_complete: Option<WrCompleteFn>,
    pub wr_abort: Option<WrFn>,
    pub wr_atomic_write: Option<WrAtomicWriteFn>,
    /// Appended after rdma-core 44 (`wr_flush`); left NULL.
    pub _v65_tail: *mut c_void,
}

/// `verbs_context.query_port(ctx, port_num, port_attr, port_attr_len)`.
pub type QueryPortExFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
/// `verbs_context.create_cq_ex`.
pub type CreateCqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;
/// `verbs_context.query_device_ex`.
pub type QueryDeviceExFn = unsafe extern "C" fn(
    *mut ibv_context,
    *const ibv_query_device_ex_input,
    *mut ibv_device_attr_ex,
    usize,
) -> c_int;
/// `verbs_context.create_qp_ex`.
pub type CreateQpExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
/// `verbs_context.get_srq_num`.
pub type GetSrqNumFn = unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int;

/// `struct verbs_context` as of rdma-core 65 (696 bytes; rdma-core 44's is the last 648). It
/// grows at the front, so every op keeps its (negative) distance from `context`, which is
/// last; `sz` just before it tells how much of the front a library filled. Ops this crate's
/// users do not provide are opaque and must be NULL.
#[repr(C)]
pub struct verbs_context {
    /// Members rdma-core added after 44 (`alloc_dmah` and others); NULL.
    pub _v65_front: [*mut c_void; 6],
    pub query_port: Option<QueryPortExFn>,
    /// `advise_mr` … `modify_wq` (22 ops, rdma-core 44 order).
    pub _before_create_wq: [*mut c_void; 22],
    pub create_wq: *mut c_void,
    pub query_rt_values: *mut c_void,
    pub create_cq_ex: Option<CreateCqExFn>,
    pub priv_: *mut c_void,
    pub query_device_ex: Option<QueryDeviceExFn>,
    pub ibv_destroy_flow: *mut c_void,
    pub abi_placeholder2: *mut c_void,
    pub ibv_create_flow: *mut c_void,
    pub abi_placeholder1: *mut c_void,
    pub open_qp: *mut c_void,
    pub create_qp_ex: Option<CreateQpExFn>,
    pub get_srq_num: Option<GetSrqNumFn>,
    pub create_srq_ex: *mut c_void,
    pub open_xrcd: *mut c_void,
    pub close_xrcd: *mut c_void,
    pub _abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

/// `__VERBS_ABI_IS_EXTENDED`: the `ibv_context.abi_compat` sentinel of a `verbs_context`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

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
        assert_eq!(size_of::<ibv_ah>(), 24);
        assert_eq!(size_of::<ibv_gid_entry>(), 32);
        assert_eq!(size_of::<ibv_qp_ex>(), 360);
        assert_eq!(size_of::<ibv_cq_ex>(), 288);
        assert_eq!(size_of::<verbs_context>(), 696);
        assert_eq!(
            size_of::<verbs_context>() - offset_of!(verbs_context, query_port),
            320 + 328
        );
        assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
        assert_eq!(offset_of!(ibv_port_attr, active_speed_ex), 52);
        assert_eq!(size_of::<ibv_port_attr>(), 56);
        assert_eq!(size_of::<ibv_mw>(), 32);
        assert_eq!(size_of::<ibv_mw_bind_info>(), 32);
        assert_eq!(size_of::<ibv_mw_bind>(), 48);
        assert_eq!(size_of::<ibv_send_wr_bind_mw>(), 48);
    }

    /// Offsets of the members read or written, as rdma-core 44 compiles them.
    #[test]
    fn offsets_match_rdma_core() {
        assert_eq!(offset_of!(ibv_device, name), 24);
        assert_eq!(offset_of!(ibv_context, ops), 8);
        assert_eq!(offset_of!(ibv_context, async_fd), 268);
        assert_eq!(offset_of!(ibv_context_ops, alloc_mw), 56);
        assert_eq!(offset_of!(ibv_context_ops, dealloc_mw), 72);
        assert_eq!(offset_of!(ibv_mw, mw_type), 24);
        assert_eq!(offset_of!(ibv_mw_bind, bind_info), 16);
        assert_eq!(offset_of!(ibv_send_wr_bind_mw, bind_info), 16);
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
