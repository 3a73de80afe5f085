//! What the in-process tests of the exported entry points share: the device list of a test
//! binary (two devices on the addresses it names) and `errno`.
#![allow(dead_code, clippy::unwrap_used, clippy::undocumented_unsafe_blocks)]

use std::sync::Once;

use ibverbs_sys::ibv_context;
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
