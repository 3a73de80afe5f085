//! The libibverbs calls this library makes, through the C ABI (resolved against softverbs'
//! `libibverbs.so.1` when the library is linked, against `softverbs-ibverbs`' rlib in tests),
//! the verbs constants it needs, and the softverbs-private GSI entry point.
//!
//! What it is not: a safe wrapper; callers uphold libibverbs' contract for each call.
#![allow(missing_docs)]

use std::ffi::{c_int, c_void};

use ibverbs_sys::*;

unsafe extern "C" {
    pub fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device;
    pub fn ibv_free_device_list(list: *mut *mut ibv_device);
    pub fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
    pub fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
    pub fn ibv_query_port(context: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int;
    pub fn ibv_query_gid(
        context: *mut ibv_context,
        port: u8,
        index: c_int,
        gid: *mut ibv_gid,
    ) -> c_int;
    pub fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    pub fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel;
    pub fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int;
    pub fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    pub fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    pub fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    pub fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    pub fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int;
    pub fn ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq;
    pub fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int;
    pub fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int)
    -> *mut ibv_mr;
    pub fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah;
}

/// The softverbs-private export of `libibverbs.so.1` that opens a device's GSI: UD QP 1 in
/// RTS with Q_Key 0x8001_0000, on `pd`, completing on the two CQs.
pub type OpenGsiFn = unsafe extern "C" fn(
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    max_send_wr: u32,
    max_recv_wr: u32,
) -> *mut ibv_qp;

/// The name [`open_gsi_fn`] looks up.
pub const OPEN_GSI_SYMBOL: &std::ffi::CStr = c"softverbs_open_gsi";

/// `softverbs_open_gsi` when the loaded libibverbs exports it (`dlsym(RTLD_DEFAULT, …)`).
pub fn open_gsi_fn() -> Option<OpenGsiFn> {
    // SAFETY: dlsym with a NUL-terminated name; the result is NULL or the address of a
    // function with the documented `OpenGsiFn` signature.
    unsafe {
        let p = libc::dlsym(libc::RTLD_DEFAULT, OPEN_GSI_SYMBOL.as_ptr());
        if p.is_null() {
            None
        } else {
            Some(std::mem::transmute::<*mut c_void, OpenGsiFn>(p))
        }
    }
}

pub const IBV_QPS_RESET: u32 = 0;
pub const IBV_QPS_INIT: u32 = 1;
pub const IBV_QPS_RTR: u32 = 2;
pub const IBV_QPS_RTS: u32 = 3;
pub const IBV_QPS_ERR: u32 = 6;

pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPT_UC: u32 = 3;
pub const IBV_QPT_UD: u32 = 4;

pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_QKEY: c_int = 1 << 6;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_ACCESS_REMOTE_READ: c_int = 4;
pub const IBV_ACCESS_REMOTE_ATOMIC: c_int = 8;

pub const IBV_WR_SEND: u32 = 2;
pub const IBV_SEND_SIGNALED: u32 = 2;
pub const IBV_WC_SUCCESS: u32 = 0;
pub const IBV_WC_RECV: u32 = 128;

#[cfg(test)]
mod tests {
    use super::*;

    /// `enum ibv_qp_attr_mask`, `ibv_qp_state`, `ibv_qp_type` and `ibv_access_flags` as
    /// rdma-core 44's `<infiniband/verbs.h>` numbers them.
    #[test]
    fn constants_match_verbs_h() {
        let masks = [
            (IBV_QP_STATE, 0),
            (IBV_QP_ACCESS_FLAGS, 3),
            (IBV_QP_PKEY_INDEX, 4),
            (IBV_QP_PORT, 5),
            (IBV_QP_QKEY, 6),
            (IBV_QP_AV, 7),
            (IBV_QP_PATH_MTU, 8),
            (IBV_QP_TIMEOUT, 9),
            (IBV_QP_RETRY_CNT, 10),
            (IBV_QP_RNR_RETRY, 11),
            (IBV_QP_RQ_PSN, 12),
            (IBV_QP_MAX_QP_RD_ATOMIC, 13),
            (IBV_QP_MIN_RNR_TIMER, 15),
            (IBV_QP_SQ_PSN, 16),
            (IBV_QP_MAX_DEST_RD_ATOMIC, 17),
            (IBV_QP_DEST_QPN, 20),
        ];
        for (mask, bit) in masks {
            assert_eq!(mask, 1 << bit);
        }
        assert_eq!(
            (IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_ERR),
            (1, 2, 3, 6)
        );
        assert_eq!((IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD), (2, 3, 4));
        assert_eq!((IBV_WR_SEND, IBV_SEND_SIGNALED, IBV_WC_RECV), (2, 2, 128));
    }
}
