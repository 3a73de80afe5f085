//! `softverbs-rdmacm`: a `librdmacm.so.1` that unmodified rdma_cm programs (rping, ucmatose,
//! perftest's `-R`) load instead of rdma-core's, connecting QPs of softverbs' `libibverbs.so.1`
//! with the InfiniBand CM (`emu-cm`) spoken over each device's GSI QP.
//!
//! `scripts/build-librdmacm.sh` links this crate's staticlib into
//! `target/libibverbs/librdmacm.so.1` with the version script generated from
//! `librdmacm-44-exports.txt` (the export list of Debian 12's librdmacm1) and against the
//! drop-in `libibverbs.so.1` in the same directory: like rdma-core's librdmacm, this library
//! reaches the devices only through the libibverbs C ABI ([`verbs`]).
//!
//! * [`abi`]: the `repr(C)` structs of `<rdma/rdma_cma.h>`.
//! * [`channel`]: event channels (an eventfd per channel), `rdma_get_cm_event`,
//!   `rdma_ack_cm_event`, `rdma_event_str`.
//! * [`addr`]: IPv4 socket addresses, GIDs, the CMA private-data header, `rdma_getaddrinfo`.
//! * [`devices`]: the process's devices as rdma_cm sees them (address, GID, port) and how a
//!   bound address picks or configures one.
//! * [`id`]: `rdma_cm_id`s: create/destroy/migrate, bind, address and route resolution, QPs,
//!   endpoints, options.
//! * [`agent`]: the CM agent — one thread per process that drives each device's `emu_cm::Cm`
//!   through the device's GSI QP — and the connection calls (`rdma_connect`, `rdma_listen`,
//!   `rdma_accept`, `rdma_reject`, `rdma_disconnect`, `rdma_establish`, `rdma_get_request`).
//! * [`qp`]: the QP attributes rdma_cm applies (INIT, RTR/RTS with the negotiated values, ERR)
//!   and `rdma_init_qp_attr`, which hands them to programs that move their own QPs.
//! * [`stubs`]: exported calls softverbs does not implement (multicast, ECE, rsockets): they
//!   fail with an errno, never crash.
//!
//! Every export follows librdmacm's contract: 0 on success, −1 with `errno` on failure (NULL
//! with `errno` for pointer results); no panic crosses the boundary ([`guard`]). What it is
//! not: a kernel `rdma_ucm` client, an IPv6, multicast, UD-SIDR or iWARP implementation.
#![allow(clippy::missing_safety_doc)] // every export follows librdmacm's documented contract

pub mod abi;
pub mod addr;
pub mod agent;
pub mod channel;
pub mod devices;
pub mod id;
pub mod qp;
pub mod stubs;
pub mod verbs;

use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs an exported function's body; a panic becomes `fail` with `errno = EIO` instead of
/// unwinding into C.
pub fn guard<R>(fail: R, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => {
            set_errno(libc::EIO);
            fail
        }
    }
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// librdmacm's failure convention: `errno = e`, return −1.
pub fn fail(e: i32) -> c_int {
    set_errno(e);
    -1
}

/// `Ok` → 0, `Err(e)` → −1 with `errno = e`.
pub fn ret(r: Result<(), i32>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// Logs one line to stderr when `SOFTVERBS_DEBUG` is set; never fails.
pub fn debug(msg: impl FnOnce() -> String) {
    if std::env::var_os("SOFTVERBS_DEBUG").is_some() {
        eprintln!("softverbs-rdmacm: {}", msg());
    }
}
