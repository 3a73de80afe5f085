//! `repr(C)` mirrors of rdma-core 44's `<rdma/rdma_cma.h>` and `<infiniband/sa.h>` structs the
//! library hands to programs, with the constants programs pass in.
//!
//! Sizes and offsets are those of a program compiled against Debian 12's librdmacm-dev 44.0
//! on x86-64 (the `layout` tests pin them). The verbs structs they embed come from
//! `ibverbs-sys`. What it is not: the kernel's `rdma_user_cm.h` ABI (this library talks to no
//! kernel).
#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_void};

use ibverbs_sys::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp, ibv_srq,
};

/// `enum rdma_cm_event_type`.
pub type rdma_cm_event_type = c_int;
pub const RDMA_CM_EVENT_ADDR_RESOLVED: c_int = 0;
pub const RDMA_CM_EVENT_ADDR_ERROR: c_int = 1;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: c_int = 2;
pub const RDMA_CM_EVENT_ROUTE_ERROR: c_int = 3;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_int = 4;
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: c_int = 5;
pub const RDMA_CM_EVENT_CONNECT_ERROR: c_int = 6;
pub const RDMA_CM_EVENT_UNREACHABLE: c_int = 7;
pub const RDMA_CM_EVENT_REJECTED: c_int = 8;
pub const RDMA_CM_EVENT_ESTABLISHED: c_int = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: c_int = 10;
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: c_int = 11;
pub const RDMA_CM_EVENT_MULTICAST_JOIN: c_int = 12;
pub const RDMA_CM_EVENT_MULTICAST_ERROR: c_int = 13;
pub const RDMA_CM_EVENT_ADDR_CHANGE: c_int = 14;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: c_int = 15;

/// `enum rdma_port_space`.
pub const RDMA_PS_IPOIB: c_int = 0x0002;
pub const RDMA_PS_TCP: c_int = 0x0106;
pub const RDMA_PS_UDP: c_int = 0x0111;
pub const RDMA_PS_IB: c_int = 0x013F;

/// `RAI_*` flags of `rdma_addrinfo.ai_flags`.
pub const RAI_PASSIVE: c_int = 1;
pub const RAI_NUMERICHOST: c_int = 2;
pub const RAI_NOROUTE: c_int = 4;
pub const RAI_FAMILY: c_int = 8;

/// `rdma_set_option` levels and names.
pub const RDMA_OPTION_ID: c_int = 0;
pub const RDMA_OPTION_IB: c_int = 1;
pub const RDMA_OPTION_ID_TOS: c_int = 0;
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
pub const RDMA_OPTION_IB_PATH: c_int = 1;

/// The Q_Key rdma_cm gives UD QPs (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// `struct ibv_sa_path_rec` (64 bytes; `__be*` fields in network order).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct ibv_sa_path_rec {
    pub dgid: ibv_gid,
    pub sgid: ibv_gid,
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: c_int,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// `struct rdma_ib_addr` (40 bytes).
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    pub pkey: u16,
}

/// `struct rdma_addr` (296 bytes): the source and destination unions are each a
/// `sockaddr_storage` (128 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub struct rdma_addr {
    pub src_storage: libc::sockaddr_storage,
    pub dst_storage: libc::sockaddr_storage,
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_route` (312 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut ibv_sa_path_rec,
    pub num_paths: c_int,
}

/// `struct rdma_event_channel` (4 bytes).
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_cm_id` (416 bytes).
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: c_int,
}

/// `struct rdma_conn_param` (24 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param` (56 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The `param` union of `rdma_cm_event` (56 bytes).
#[repr(C)]
#[derive(Copy, Clone)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event` (80 bytes).
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: rdma_cm_event_type,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo` (96 bytes).
#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: libc::socklen_t,
    pub ai_dst_len: libc::socklen_t,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

#[cfg(test)]
mod layout {
    use std::mem::{align_of, offset_of, size_of};

    use super::*;

    /// Values printed by a C program built against librdmacm-dev 44.0 (Debian 12, x86-64).
    #[test]
    fn sizes_match_rdma_core_44() {
        assert_eq!(size_of::<ibv_sa_path_rec>(), 64);
        assert_eq!(size_of::<rdma_ib_addr>(), 40);
        assert_eq!(size_of::<rdma_addr>(), 296);
        assert_eq!(size_of::<rdma_route>(), 312);
        assert_eq!(size_of::<rdma_event_channel>(), 4);
        assert_eq!(size_of::<rdma_cm_id>(), 416);
        assert_eq!(size_of::<rdma_conn_param>(), 24);
        assert_eq!(size_of::<rdma_ud_param>(), 56);
        assert_eq!(size_of::<rdma_cm_event>(), 80);
        assert_eq!(size_of::<rdma_addrinfo>(), 96);
        assert_eq!(align_of::<rdma_cm_id>(), 8);
        assert_eq!(align_of::<ibv_sa_path_rec>(), 8);
    }

    #[test]
    fn path_rec_offsets() {
        assert_eq!(offset_of!(ibv_sa_path_rec, sgid), 16);
        assert_eq!(offset_of!(ibv_sa_path_rec, dlid), 32);
        assert_eq!(offset_of!(ibv_sa_path_rec, slid), 34);
        assert_eq!(offset_of!(ibv_sa_path_rec, raw_traffic), 36);
        assert_eq!(offset_of!(ibv_sa_path_rec, flow_label), 40);
        assert_eq!(offset_of!(ibv_sa_path_rec, hop_limit), 44);
        assert_eq!(offset_of!(ibv_sa_path_rec, traffic_class), 45);
        assert_eq!(offset_of!(ibv_sa_path_rec, reversible), 48);
        assert_eq!(offset_of!(ibv_sa_path_rec, numb_path), 52);
        assert_eq!(offset_of!(ibv_sa_path_rec, pkey), 54);
        assert_eq!(offset_of!(ibv_sa_path_rec, sl), 56);
        assert_eq!(offset_of!(ibv_sa_path_rec, mtu), 58);
        assert_eq!(offset_of!(ibv_sa_path_rec, rate), 60);
        assert_eq!(offset_of!(ibv_sa_path_rec, packet_life_time), 62);
        assert_eq!(offset_of!(ibv_sa_path_rec, preference), 63);
    }

    #[test]
    fn addr_and_route_offsets() {
        assert_eq!(offset_of!(rdma_ib_addr, dgid), 16);
        assert_eq!(offset_of!(rdma_ib_addr, pkey), 32);
        assert_eq!(offset_of!(rdma_addr, dst_storage), 128);
        assert_eq!(offset_of!(rdma_addr, ibaddr), 256);
        assert_eq!(offset_of!(rdma_route, path_rec), 296);
        assert_eq!(offset_of!(rdma_route, num_paths), 304);
    }

    #[test]
    fn cm_id_offsets() {
        assert_eq!(offset_of!(rdma_cm_id, channel), 8);
        assert_eq!(offset_of!(rdma_cm_id, context), 16);
        assert_eq!(offset_of!(rdma_cm_id, qp), 24);
        assert_eq!(offset_of!(rdma_cm_id, route), 32);
        assert_eq!(offset_of!(rdma_cm_id, ps), 344);
        assert_eq!(offset_of!(rdma_cm_id, port_num), 348);
        assert_eq!(offset_of!(rdma_cm_id, event), 352);
        assert_eq!(offset_of!(rdma_cm_id, send_cq_channel), 360);
        assert_eq!(offset_of!(rdma_cm_id, send_cq), 368);
        assert_eq!(offset_of!(rdma_cm_id, recv_cq_channel), 376);
        assert_eq!(offset_of!(rdma_cm_id, recv_cq), 384);
        assert_eq!(offset_of!(rdma_cm_id, srq), 392);
        assert_eq!(offset_of!(rdma_cm_id, pd), 400);
        assert_eq!(offset_of!(rdma_cm_id, qp_type), 408);
    }

    #[test]
    fn event_and_param_offsets() {
        assert_eq!(offset_of!(rdma_conn_param, private_data_len), 8);
        assert_eq!(offset_of!(rdma_conn_param, responder_resources), 9);
        assert_eq!(offset_of!(rdma_conn_param, initiator_depth), 10);
        assert_eq!(offset_of!(rdma_conn_param, flow_control), 11);
        assert_eq!(offset_of!(rdma_conn_param, retry_count), 12);
        assert_eq!(offset_of!(rdma_conn_param, rnr_retry_count), 13);
        assert_eq!(offset_of!(rdma_conn_param, srq), 14);
        assert_eq!(offset_of!(rdma_conn_param, qp_num), 16);
        assert_eq!(offset_of!(rdma_ud_param, private_data_len), 8);
        assert_eq!(offset_of!(rdma_ud_param, ah_attr), 16);
        assert_eq!(offset_of!(rdma_ud_param, qp_num), 48);
        assert_eq!(offset_of!(rdma_ud_param, qkey), 52);
        assert_eq!(offset_of!(rdma_cm_event, listen_id), 8);
        assert_eq!(offset_of!(rdma_cm_event, event), 16);
        assert_eq!(offset_of!(rdma_cm_event, status), 20);
        assert_eq!(offset_of!(rdma_cm_event, param), 24);
    }

    #[test]
    fn addrinfo_offsets() {
        assert_eq!(offset_of!(rdma_addrinfo, ai_family), 4);
        assert_eq!(offset_of!(rdma_addrinfo, ai_qp_type), 8);
        assert_eq!(offset_of!(rdma_addrinfo, ai_port_space), 12);
        assert_eq!(offset_of!(rdma_addrinfo, ai_src_len), 16);
        assert_eq!(offset_of!(rdma_addrinfo, ai_dst_len), 20);
        assert_eq!(offset_of!(rdma_addrinfo, ai_src_addr), 24);
        assert_eq!(offset_of!(rdma_addrinfo, ai_dst_addr), 32);
        assert_eq!(offset_of!(rdma_addrinfo, ai_src_canonname), 40);
        assert_eq!(offset_of!(rdma_addrinfo, ai_dst_canonname), 48);
        assert_eq!(offset_of!(rdma_addrinfo, ai_route_len), 56);
        assert_eq!(offset_of!(rdma_addrinfo, ai_route), 64);
        assert_eq!(offset_of!(rdma_addrinfo, ai_connect_len), 72);
        assert_eq!(offset_of!(rdma_addrinfo, ai_connect), 80);
        assert_eq!(offset_of!(rdma_addrinfo, ai_next), 88);
    }
}
