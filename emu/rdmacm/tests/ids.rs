//! The exported rdma_cm calls in process, over the softverbs-ibverbs rlib: event channels,
//! ids, address and route resolution, QPs on ids, strings, and the errno of unsupported or
//! misused calls. Two devices on 127.0.71.1 and 127.0.71.2.
#![allow(clippy::unwrap_used, clippy::undocumented_unsafe_blocks)]

mod common;

use std::ffi::CStr;
use std::ptr::null_mut;

use common::*;
use ibverbs_sys::{ibv_qp_attr, ibv_qp_init_attr};
use softverbs_rdmacm::abi::*;
use softverbs_rdmacm::addr::*;
use softverbs_rdmacm::agent::*;
use softverbs_rdmacm::channel::*;
use softverbs_rdmacm::devices::*;
use softverbs_rdmacm::id::*;
use softverbs_rdmacm::set_errno;
use softverbs_rdmacm::stubs::*;

const ADDRS: &str = "127.0.71.1:4791,127.0.71.2:4791";

fn id_on(ch: *mut rdma_event_channel) -> *mut rdma_cm_id {
    setup(ADDRS);
    let mut id = std::ptr::null_mut();
    assert_eq!(
        unsafe { rdma_create_id(ch, &mut id, std::ptr::null_mut(), RDMA_PS_TCP) },
        0
    );
    id
}

/// An id resolved (address and route) from device 0 (a source address with port 0) to
/// device 1's address, port 7000.
fn resolved(ch: *mut rdma_event_channel) -> *mut rdma_cm_id {
    let id = id_on(ch);
    let mut src = sa("127.0.71.1:0");
    let mut dst = sa("127.0.71.2:7000");
    let r = unsafe {
        rdma_resolve_addr(
            id,
            &mut src as *mut _ as *mut _,
            &mut dst as *mut _ as *mut _,
            100,
        )
    };
    assert_eq!(r, 0, "errno {}", errno());
    assert_eq!(next(ch).0, RDMA_CM_EVENT_ADDR_RESOLVED);
    assert_eq!(unsafe { rdma_resolve_route(id, 100) }, 0);
    assert_eq!(next(ch).0, RDMA_CM_EVENT_ROUTE_RESOLVED);
    id
}

#[test]
fn channel_fd_polls_and_non_blocking_get_says_eagain() {
    let ch = unsafe { rdma_create_event_channel() };
    assert!(!ch.is_null());
    let fd = unsafe { (*ch).fd };
    unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) };
    let mut ev = std::ptr::null_mut();
    assert_eq!(unsafe { rdma_get_cm_event(ch, &mut ev) }, -1);
    assert_eq!(errno(), libc::EAGAIN);
    let id = id_on(ch);
    let mut dst = sa("127.0.71.2:7001");
    assert_eq!(
        unsafe { rdma_resolve_addr(id, std::ptr::null_mut(), &mut dst as *mut _ as *mut _, 100) },
        0
    );
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    assert_eq!(unsafe { libc::poll(&mut p, 1, 1000) }, 1);
    let (kind, status, eid) = next(ch);
    assert_eq!((kind, status, eid), (RDMA_CM_EVENT_ADDR_RESOLVED, 0, id));
    assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0);
    // Without a source address, a destination that is a device of this process resolves
    // from that device (loopback).
    assert_eq!(
        unsafe { (*id).route.addr.ibaddr.sgid.raw },
        gid_of("127.0.71.2".parse().unwrap())
    );
    assert_eq!(unsafe { rdma_destroy_id(id) }, 0);
    unsafe { rdma_destroy_event_channel(ch) };
}

#[test]
fn resolution_fills_the_route_and_ports() {
    let ch = unsafe { rdma_create_event_channel() };
    let id = resolved(ch);
    unsafe {
        assert!(!(*id).verbs.is_null());
        assert_eq!((*id).port_num, 1);
        let r = &(*id).route;
        assert_eq!(r.num_paths, 1);
        assert_eq!(
            (*r.path_rec).dgid.raw,
            gid_of("127.0.71.2".parse().unwrap())
        );
        assert_eq!(
            r.addr.ibaddr.sgid.raw,
            gid_of("127.0.71.1".parse().unwrap())
        );
        assert_eq!(u16::from_be(rdma_get_dst_port(id)), 7000);
        assert_ne!(rdma_get_src_port(id), 0);
        assert_eq!(rdma_destroy_id(id), 0);
        rdma_destroy_event_channel(ch);
    }
}

#[test]
fn bind_selects_the_device_with_that_address() {
    let ch = unsafe { rdma_create_event_channel() };
    let id = id_on(ch);
    let mut a = sa("127.0.71.2:7100");
    assert_eq!(unsafe { rdma_bind_addr(id, &mut a as *mut _ as *mut _) }, 0);
    let dev = find_ctx(unsafe { (*id).verbs }).unwrap();
    assert_eq!(devices(None)[dev].ip.to_string(), "127.0.71.2");
    assert_eq!(u16::from_be(unsafe { rdma_get_src_port(id) }), 7100);
    // Bound twice, an unknown address, an IPv6 address.
    assert_eq!(
        unsafe { rdma_bind_addr(id, &mut a as *mut _ as *mut _) },
        -1
    );
    assert_eq!(errno(), libc::EINVAL);
    let other = id_on(ch);
    let mut nowhere = sa("10.9.9.9:1");
    assert_eq!(
        unsafe { rdma_bind_addr(other, &mut nowhere as *mut _ as *mut _) },
        -1
    );
    assert_eq!(errno(), libc::EADDRNOTAVAIL);
    let mut v6: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    v6.sin6_family = libc::AF_INET6 as u16;
    assert_eq!(
        unsafe { rdma_bind_addr(other, &mut v6 as *mut _ as *mut _) },
        -1
    );
    assert_eq!(errno(), libc::EAFNOSUPPORT);
    unsafe {
        rdma_destroy_id(id);
        rdma_destroy_id(other);
        rdma_destroy_event_channel(ch);
    }
}

#[test]
fn create_qp_leaves_an_rc_qp_in_init_with_its_own_cqs() {
    let ch = unsafe { rdma_create_event_channel() };
    let id = resolved(ch);
    let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    attr.cap.max_send_wr = 4;
    attr.cap.max_recv_wr = 4;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    attr.qp_type = 2; // IBV_QPT_RC
    assert_eq!(
        unsafe { rdma_create_qp(id, std::ptr::null_mut(), &mut attr) },
        0,
        "errno {}",
        errno()
    );
    unsafe {
        assert!(!(*id).qp.is_null());
        assert!(!(*id).send_cq.is_null() && !(*id).recv_cq.is_null());
        let mut a = ibv_qp_attr::default();
        let mut init: ibv_qp_init_attr = std::mem::zeroed();
        let r = softverbs_ibverbs::qp::ibv_query_qp((*id).qp, &mut a, 1, &mut init);
        assert_eq!(r, 0);
        assert_eq!(a.qp_state, 1, "INIT");
        // A second QP on the same id is refused.
        assert_eq!(rdma_create_qp(id, std::ptr::null_mut(), &mut attr), -1);
        assert_eq!(errno(), libc::EINVAL);
        rdma_destroy_qp(id);
        assert!((*id).qp.is_null() && (*id).send_cq.is_null());
        assert_eq!(rdma_destroy_id(id), 0);
        rdma_destroy_event_channel(ch);
    }
}

#[test]
fn create_qp_on_a_udp_id_leaves_a_ud_qp_in_rts_with_rdma_cm_s_qkey() {
    setup(ADDRS);
    let ch = unsafe { rdma_create_event_channel() };
    let mut id = std::ptr::null_mut();
    assert_eq!(
        unsafe { rdma_create_id(ch, &mut id, std::ptr::null_mut(), RDMA_PS_UDP) },
        0
    );
    assert_eq!(unsafe { (*id).qp_type }, 4, "IBV_QPT_UD");
    let mut a = sa("127.0.71.1:7300");
    assert_eq!(unsafe { rdma_bind_addr(id, &mut a as *mut _ as *mut _) }, 0);
    let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    attr.cap.max_send_wr = 2;
    attr.cap.max_recv_wr = 2;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    attr.qp_type = 4;
    assert_eq!(
        unsafe { rdma_create_qp(id, std::ptr::null_mut(), &mut attr) },
        0,
        "errno {}",
        errno()
    );
    unsafe {
        let mut q = ibv_qp_attr::default();
        let mut init: ibv_qp_init_attr = std::mem::zeroed();
        assert_eq!(
            softverbs_ibverbs::qp::ibv_query_qp((*id).qp, &mut q, 0x1f_ffff, &mut init),
            0
        );
        assert_eq!((q.qp_state, q.qkey), (3, RDMA_UDP_QKEY));
        // UD "connections" would need SIDR, which the CM lacks.
        let mut dst = sa("127.0.71.2:7301");
        assert_eq!(
            rdma_resolve_addr(id, null_mut(), &mut dst as *mut _ as *mut _, 10),
            0
        );
        assert_eq!(next(ch).0, RDMA_CM_EVENT_ADDR_RESOLVED);
        assert_eq!(rdma_resolve_route(id, 10), 0);
        assert_eq!(next(ch).0, RDMA_CM_EVENT_ROUTE_RESOLVED);
        assert_eq!(rdma_connect(id, null_mut()), -1);
        assert_eq!(errno(), libc::ENOSYS);
        rdma_destroy_qp(id);
        rdma_destroy_id(id);
        rdma_destroy_event_channel(ch);
    }
}

#[test]
fn migrate_id_moves_later_events_to_the_new_channel() {
    let a = unsafe { rdma_create_event_channel() };
    let b = unsafe { rdma_create_event_channel() };
    let id = id_on(a);
    assert_eq!(unsafe { rdma_migrate_id(id, b) }, 0);
    assert_eq!(unsafe { (*id).channel }, b);
    let mut src = sa("127.0.71.1:0");
    let mut dst = sa("127.0.71.2:7400");
    let r = unsafe {
        rdma_resolve_addr(
            id,
            &mut src as *mut _ as *mut _,
            &mut dst as *mut _ as *mut _,
            10,
        )
    };
    assert_eq!(r, 0);
    assert_eq!(next(b).0, RDMA_CM_EVENT_ADDR_RESOLVED);
    unsafe { libc::fcntl((*a).fd, libc::F_SETFL, libc::O_NONBLOCK) };
    let mut ev = std::ptr::null_mut();
    assert_eq!(unsafe { rdma_get_cm_event(a, &mut ev) }, -1);
    assert_eq!(errno(), libc::EAGAIN);
    unsafe {
        rdma_destroy_id(id);
        rdma_destroy_event_channel(a);
        rdma_destroy_event_channel(b);
    }
}

#[test]
fn synchronous_endpoint_resolves_without_a_channel() {
    setup(ADDRS);
    let mut hints: rdma_addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_port_space = RDMA_PS_TCP;
    let mut res = std::ptr::null_mut();
    let r = unsafe { rdma_getaddrinfo(c"127.0.71.2".as_ptr(), c"7200".as_ptr(), &hints, &mut res) };
    assert_eq!(r, 0);
    unsafe {
        assert_eq!((*res).ai_family, libc::AF_INET);
        assert!((*res).ai_src_addr.is_null() && !(*res).ai_dst_addr.is_null());
        let mut id = std::ptr::null_mut();
        assert_eq!(
            rdma_create_ep(&mut id, res, std::ptr::null_mut(), std::ptr::null_mut()),
            0,
            "errno {}",
            errno()
        );
        assert!(!(*id).verbs.is_null());
        assert_eq!(u16::from_be(rdma_get_dst_port(id)), 7200);
        rdma_destroy_ep(id);
        rdma_freeaddrinfo(res);
        hints.ai_flags = RAI_PASSIVE;
        assert_eq!(
            rdma_getaddrinfo(std::ptr::null(), c"7201".as_ptr(), &hints, &mut res),
            0
        );
        assert!(!(*res).ai_src_addr.is_null());
        rdma_freeaddrinfo(res);
        assert_eq!(
            rdma_getaddrinfo(c"::1".as_ptr(), c"1".as_ptr(), &hints, &mut res),
            -1
        );
        assert_eq!(errno(), libc::EAFNOSUPPORT);
    }
}

#[test]
fn init_qp_attr_gives_init_now_and_rtr_only_after_the_peer_answered() {
    let ch = unsafe { rdma_create_event_channel() };
    let id = resolved(ch);
    let mut a = ibv_qp_attr {
        qp_state: 1,
        ..Default::default()
    };
    let mut mask = 0;
    unsafe {
        assert_eq!(
            softverbs_rdmacm::qp::rdma_init_qp_attr(id, &mut a, &mut mask),
            0
        );
        assert_eq!((a.qp_state, a.port_num, a.qp_access_flags), (1, 1, 15));
        assert_eq!(
            mask,
            1 | 8 | 16 | 32,
            "STATE | ACCESS_FLAGS | PKEY_INDEX | PORT"
        );
        a.qp_state = 2;
        assert_eq!(
            softverbs_rdmacm::qp::rdma_init_qp_attr(id, &mut a, &mut mask),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_destroy_id(id), 0);
        rdma_destroy_event_channel(ch);
    }
}

#[test]
fn event_strings_are_librdmacm_s() {
    let s = |e| {
        unsafe { CStr::from_ptr(rdma_event_str(e)) }
            .to_str()
            .unwrap()
    };
    assert_eq!(
        s(RDMA_CM_EVENT_ADDR_RESOLVED),
        "RDMA_CM_EVENT_ADDR_RESOLVED"
    );
    assert_eq!(s(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED");
    assert_eq!(
        s(RDMA_CM_EVENT_TIMEWAIT_EXIT),
        "RDMA_CM_EVENT_TIMEWAIT_EXIT"
    );
    assert_eq!(s(99), "UNKNOWN EVENT");
    assert_eq!(s(-1), "UNKNOWN EVENT");
}

#[test]
fn unsupported_and_misused_calls_fail_with_an_errno() {
    let ch = unsafe { rdma_create_event_channel() };
    let id = id_on(ch);
    unsafe {
        assert_eq!(rdma_join_multicast(), -1);
        assert_eq!(errno(), libc::ENOSYS);
        assert_eq!(rdma_notify(), -1);
        assert_eq!(errno(), libc::ENOSYS);
        assert_eq!(rsocket(), -1);
        assert_eq!(errno(), libc::ENOSYS);
        assert_eq!(rdma_get_remote_ece(id, std::ptr::null_mut()), -1);
        assert_eq!(errno(), libc::EOPNOTSUPP);
        let mut v: u8 = 16;
        let p = &mut v as *mut u8 as *mut _;
        assert_eq!(
            rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, p, 1),
            0
        );
        assert_eq!(rdma_set_option(id, RDMA_OPTION_ID, 42, p, 1), -1);
        assert_eq!(errno(), libc::ENOSYS);
        let mut out = std::ptr::null_mut();
        assert_eq!(
            rdma_create_id(ch, &mut out, std::ptr::null_mut(), 0x7777),
            -1
        );
        assert_eq!(errno(), libc::EPROTONOSUPPORT);
        // Connecting before the route, accepting without a request, disconnecting nothing.
        assert_eq!(rdma_connect(id, std::ptr::null_mut()), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_accept(id, std::ptr::null_mut()), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_disconnect(id), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_resolve_route(id, 10), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_destroy_id(id), 0);
        rdma_destroy_event_channel(ch);
    }
}

/// perftest 4.5's client, refused on its connection, destroys its ids and channel and then
/// retries on them: resolves, destroys them again. Each call on a destroyed id or channel
/// fails with `EINVAL` (as librdmacm's kernel ABI refuses a stale handle) and frees nothing
/// twice; no call reads the freed memory.
#[test]
fn calls_on_destroyed_ids_and_channels_fail_with_einval() {
    let ch = unsafe { rdma_create_event_channel() };
    let other = unsafe { rdma_create_event_channel() };
    let id = resolved(ch);
    let live = id_on(other);
    unsafe {
        assert_eq!(rdma_destroy_id(id), 0);
        rdma_destroy_event_channel(ch);
        let mut src = sa("127.0.71.1:0");
        let mut dst = sa("127.0.71.2:7000");
        let (s, d) = (&mut src as *mut _ as *mut _, &mut dst as *mut _ as *mut _);
        assert_eq!(rdma_resolve_addr(id, s, d, 100), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_destroy_id(id), -1);
        assert_eq!(errno(), libc::EINVAL);
        set_errno(0);
        rdma_destroy_event_channel(ch);
        assert_eq!(errno(), libc::EINVAL);
        let mut ev = std::ptr::null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut ev), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_migrate_id(live, ch), -1);
        assert_eq!(errno(), libc::EINVAL);
        let mut out = std::ptr::null_mut();
        assert_eq!(
            rdma_create_id(ch, &mut out, std::ptr::null_mut(), RDMA_PS_TCP),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_destroy_id(std::ptr::null_mut()), -1);
        assert_eq!(errno(), libc::EINVAL);
        // The live id and channel still work.
        assert_eq!(rdma_destroy_id(live), 0);
        rdma_destroy_event_channel(other);
    }
}

#[test]
fn get_devices_lists_both_contexts() {
    setup(ADDRS);
    let mut n = 0;
    let list = unsafe { rdma_get_devices(&mut n) };
    assert_eq!(n, 2);
    unsafe {
        assert!(!(*list).is_null() && !(*list.add(1)).is_null() && (*list.add(2)).is_null());
        rdma_free_devices(list);
    }
}

#[test]
fn source_gid_reads_ipv4_and_ipv6_grhs() {
    let mut grh = [0u8; 40];
    grh[32..36].copy_from_slice(&[127, 0, 71, 2]);
    assert_eq!(source_gid(&grh), gid_of("127.0.71.2".parse().unwrap()));
    let mut v6 = [0u8; 40];
    v6[0] = 0x60;
    v6[8..24].copy_from_slice(&[7; 16]);
    assert_eq!(source_gid(&v6), [7; 16]);
}
