//! Exported calls softverbs does not implement: each fails with an errno, never crashes.
//!
//! * multicast (`rdma_join_multicast(_ex)`, `rdma_leave_multicast`), `rdma_notify`: −1 with
//!   `ENOSYS`;
//! * ECE (`rdma_set_local_ece`, `rdma_get_remote_ece`) and `rdma_create_srq_ex`: −1 with
//!   `EOPNOTSUPP`;
//!   `rdma_reject_ece` rejects as `rdma_reject` (the ECE is not carried);
//! * rsockets (`rsocket`, `rbind`, … `riowrite`): −1 with `ENOSYS`. These stubs take no
//!   parameters on the Rust side: on x86-64 and aarch64 a caller's arguments (including
//!   `rfcntl`'s variadic ones) are then simply unused, and the −1 in the full return register
//!   reads as −1 for the `int`, `ssize_t`, `off_t` and `size_t` results.

use std::ffi::{c_int, c_void};

use crate::abi::rdma_cm_id;
use crate::{fail, set_errno};

macro_rules! enosys {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: not supported (−1, `errno` `ENOSYS`).")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name() -> isize {
            set_errno(libc::ENOSYS);
            -1
        }
    )*};
}

enosys!(
    rdma_join_multicast,
    rdma_join_multicast_ex,
    rdma_leave_multicast,
    rdma_notify,
    raccept,
    rbind,
    rclose,
    rconnect,
    rfcntl,
    rgetpeername,
    rgetsockname,
    rgetsockopt,
    riomap,
    riounmap,
    riowrite,
    rlisten,
    rpoll,
    rread,
    rreadv,
    rrecv,
    rrecvfrom,
    rrecvmsg,
    rselect,
    rsend,
    rsendmsg,
    rsendto,
    rsetsockopt,
    rshutdown,
    rsocket,
    rwrite,
    rwritev,
);

/// `rdma_set_local_ece`: ECE is not supported (−1, `EOPNOTSUPP`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    fail(libc::EOPNOTSUPP)
}

/// `rdma_get_remote_ece`: ECE is not supported (−1, `EOPNOTSUPP`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    fail(libc::EOPNOTSUPP)
}

/// `rdma_create_srq_ex`: extended SRQs (XRC, tag matching) are not supported (−1,
/// `EOPNOTSUPP`); `rdma_create_srq` makes a basic SRQ.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_srq_ex(_id: *mut rdma_cm_id, _attr: *mut c_void) -> c_int {
    fail(libc::EOPNOTSUPP)
}

/// `rdma_reject_ece`: `rdma_reject` (the ECE is not carried).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { crate::agent::rdma_reject(id, private_data, private_data_len) }
}
