//! `softverbs-ibverbs`: a `libibverbs.so.1` that unmodified RDMA programs load instead of
//! rdma-core's, backed by the softverbs UDP device (`emu-udp`).
//!
//! `scripts/build-libibverbs.sh` links this crate's staticlib into
//! `target/libibverbs/libibverbs.so.1` with the version script generated from
//! `libibverbs-44-exports.txt` (the export list of Debian 12's libibverbs1), so every symbol
//! and version node a Debian RDMA binary or provider imports at `BIND_NOW` time is defined.
//! Programs then run with `LD_LIBRARY_PATH=target/libibverbs`.
//!
//! * [`device`]: the process's devices (`softverbs0`, …), contexts, device/port/GID queries,
//!   async events. Zero configuration: one device on a free `127.x.y.z:4791`;
//!   `SOFTVERBS_UDP_ADDRS`, `SOFTVERBS_FAULTS`, `SOFTVERBS_PCAP`, `SOFTVERBS_SEED` override.
//! * [`objects`]: PD, MR (the application's own memory), completion channel, CQ (classic and
//!   extended), SRQ, AH (with `ibv_init_ah_from_wc` / `ibv_create_ah_from_wc`).
//! * [`qp`]: QPs (RC, UC and UD), `ibv_post_send`/`recv` through the context's ops table, the
//!   `ibv_qp_ex` work-request builder.
//! * [`mw`]: memory windows (the context's `alloc_mw`/`bind_mw`/`dealloc_mw` ops) and the
//!   window operations of both posting paths.
//! * [`strings`]: `ibv_*_str` and rate conversions, with rdma-core's strings.
//! * [`stubs`]: every other exported symbol, failing as libibverbs fails for an unsupported
//!   verb (`EOPNOTSUPP`, NULL).
//!
//! Every exported function is `unsafe extern "C"` and follows libibverbs' contract for that
//! call (pointers valid, objects of this library); within it, NULL where the API forbids it
//! gives `EINVAL`, and no panic crosses the boundary ([`guard`]). What it is not: an XRC or
//! RDMA-CM implementation (those answer `EOPNOTSUPP`).
#![allow(clippy::missing_safety_doc)] // every export follows libibverbs' documented contract

pub mod convert;
pub mod device;
pub mod mw;
pub mod objects;
pub mod qp;
pub mod strings;
pub mod stubs;

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

/// Sets `errno` to `e` and returns NULL: the failure of a call returning a pointer.
pub fn null_with<T>(e: i32) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// The errno of a verbs-api error.
pub fn errno_of(e: &verbs_api::Error) -> i32 {
    e.errno()
}

/// Installs the `SOFTVERBS_LOG` / `SOFTVERBS_TRACE` subscriber ([`emu_trace::init_from_env`])
/// at the first call in the process; a bad setting is reported once on stderr and never fails
/// the program.
pub fn init_tracing() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Err(e) = emu_trace::init_from_env() {
            eprintln!("softverbs-ibverbs: tracing disabled: {e}");
        }
    });
}

/// Logs one line to stderr when `SOFTVERBS_DEBUG` is set (as libibverbs' `IBV_*` debug
/// variables do); never fails.
pub fn debug(msg: impl FnOnce() -> String) {
    if std::env::var_os("SOFTVERBS_DEBUG").is_some() {
        eprintln!("softverbs-ibverbs: {}", msg());
    }
}
