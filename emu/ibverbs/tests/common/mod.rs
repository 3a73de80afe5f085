//! What the in-process tests of the exported entry points share: the device list of a test
//! binary (two devices on the addresses it names) and `errno`.
#![allow(dead_code, clippy::unwrap_used, clippy::undocumented_unsafe_blocks)]

use std::sync::Once;
use std::time::{Duration, Instant};

use ibverbs_sys::{ibv_context, ibv_cq, ibv_qp, ibv_recv_wr, ibv_sge, ibv_wc};
use softverbs_ibverbs::device::*;

/// `errno` of the last failed call.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

/// Opens device `i` of the two this test binary runs on, `addrs` (`SOFTVERBS_UDP_ADDRS`; set
/// once, before the first device list, so every call of one binary must pass the same value).
pub(crate) fn open(addrs: &'static str, i: usize) -> *mut ibv_context {
    static ONCE: Once = Once::new();
    // SAFETY: set once, before any thread of this test binary reads the variable.
    ONCE.call_once(|| unsafe { std::env::set_var("SOFTVERBS_UDP_ADDRS", addrs) });
    unsafe {
        let mut n = 0;
        let list = ibv_get_device_list(&mut n);
        assert!(!list.is_null(), "errno {}", errno());
        assert_eq!(n, 2);
        let ctx = ibv_open_device(*list.add(i));
        ibv_free_device_list(list);
        assert!(!ctx.is_null());
        ctx
    }
}

/// Polls `n` completions of `cq` through `ctx`'s ops table (5 s at most).
pub(crate) fn poll_n(ctx: *mut ibv_context, cq: *mut ibv_cq, n: usize) -> Vec<ibv_wc> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions",
            out.len()
        );
        let mut wc = [ibv_wc::default(); 4];
        let got = unsafe { ((*ctx).ops.poll_cq.unwrap())(cq, 4, wc.as_mut_ptr()) };
        assert!(got >= 0);
        out.extend_from_slice(&wc[..got as usize]);
    }
    out
}

/// Posts one receive WR of one SGE to `qp` through `ctx`'s ops table; it must be accepted.
pub(crate) fn post_recv_one(ctx: *mut ibv_context, qp: *mut ibv_qp, sge: &mut ibv_sge, wr_id: u64) {
    let mut wr = ibv_recv_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: sge,
        num_sge: 1,
    };
    let mut bad = std::ptr::null_mut();
    let r = unsafe { ((*ctx).ops.post_recv.unwrap())(qp, &mut wr, &mut bad) };
    assert_eq!(r, 0);
}
