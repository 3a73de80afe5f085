//! What the in-process tests of the exported rdma_cm calls share: the devices of a test binary
//! (two, on the addresses it names), `errno`, event helpers.
#![allow(dead_code, clippy::unwrap_used, clippy::undocumented_unsafe_blocks)]

use std::net::SocketAddrV4;
use std::sync::Once;

use softverbs_ibverbs as _;
use softverbs_rdmacm::abi::*;
use softverbs_rdmacm::addr::sockaddr_in;
use softverbs_rdmacm::channel::*;

/// `errno` of the last failed call.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

/// Sets `SOFTVERBS_UDP_ADDRS` to `addrs` once, before the first device list of the binary.
pub(crate) fn setup(addrs: &'static str) {
    static ONCE: Once = Once::new();
    // SAFETY: set once, before any thread of this test binary opens devices.
    ONCE.call_once(|| unsafe { std::env::set_var("SOFTVERBS_UDP_ADDRS", addrs) });
}

/// `a` as a `sockaddr` pointer's storage.
pub(crate) fn sa(a: &str) -> libc::sockaddr_in {
    sockaddr_in(a.parse::<SocketAddrV4>().unwrap())
}

/// The next event of `ch` (blocking), its kind and status; acknowledged.
pub(crate) fn next(ch: *mut rdma_event_channel) -> (c_kind, i32, *mut rdma_cm_id) {
    let mut ev = std::ptr::null_mut();
    assert_eq!(
        unsafe { rdma_get_cm_event(ch, &mut ev) },
        0,
        "errno {}",
        errno()
    );
    let r = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
    assert_eq!(unsafe { rdma_ack_cm_event(ev) }, 0);
    r
}

/// The event kind type.
#[allow(non_camel_case_types)]
pub(crate) type c_kind = std::ffi::c_int;
