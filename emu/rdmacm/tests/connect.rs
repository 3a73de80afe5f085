//! Connection setup between two ids of one process (server on device 1, client on device 0,
//! a thread each side): connect/accept/ESTABLISHED/disconnect with the QPs moved to RTS, and a
//! rejected connection, and the listen itself. They run emu-cm's state machine over libibverbs'
//! `softverbs_open_gsi` (found by `dlsym` in this `-rdynamic` test binary).
#![allow(clippy::unwrap_used, clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use ibverbs_sys::{ibv_qp_attr, ibv_qp_init_attr};
use softverbs_rdmacm::abi::*;
use softverbs_rdmacm::agent::*;
use softverbs_rdmacm::channel::*;
use softverbs_rdmacm::id::*;

const ADDRS: &str = "127.0.72.1:4791,127.0.72.2:4791";

fn rc_attr() -> ibv_qp_init_attr {
    let mut a: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    a.cap.max_send_wr = 4;
    a.cap.max_recv_wr = 4;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    a.qp_type = 2;
    a
}

fn qp_state(id: *mut rdma_cm_id) -> u32 {
    let mut a = ibv_qp_attr::default();
    let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { softverbs_ibverbs::qp::ibv_query_qp((*id).qp, &mut a, 1, &mut init) },
        0
    );
    a.qp_state
}

/// A listening id on device 1, port `port`.
fn listener(ch: *mut rdma_event_channel, port: u16) -> *mut rdma_cm_id {
    setup(ADDRS);
    let mut id = std::ptr::null_mut();
    assert_eq!(
        unsafe { rdma_create_id(ch, &mut id, std::ptr::null_mut(), RDMA_PS_TCP) },
        0
    );
    let mut a = sa(&format!("127.0.72.2:{port}"));
    assert_eq!(unsafe { rdma_bind_addr(id, &mut a as *mut _ as *mut _) }, 0);
    assert_eq!(unsafe { rdma_listen(id, 4) }, 0, "errno {}", errno());
    id
}

/// A client id on device 0 resolved to device 1's `port`, with an RC QP.
fn client(ch: *mut rdma_event_channel, port: u16) -> *mut rdma_cm_id {
    let mut id = std::ptr::null_mut();
    assert_eq!(
        unsafe { rdma_create_id(ch, &mut id, std::ptr::null_mut(), RDMA_PS_TCP) },
        0
    );
    let mut src = sa("127.0.72.1:0");
    let mut dst = sa(&format!("127.0.72.2:{port}"));
    unsafe {
        assert_eq!(
            rdma_resolve_addr(
                id,
                &mut src as *mut _ as *mut _,
                &mut dst as *mut _ as *mut _,
                100
            ),
            0
        );
        assert_eq!(next(ch).0, RDMA_CM_EVENT_ADDR_RESOLVED);
        assert_eq!(rdma_resolve_route(id, 100), 0);
        assert_eq!(next(ch).0, RDMA_CM_EVENT_ROUTE_RESOLVED);
        let mut attr = rc_attr();
        assert_eq!(rdma_create_qp(id, std::ptr::null_mut(), &mut attr), 0);
    }
    id
}

fn param(pd: &[u8]) -> rdma_conn_param {
    rdma_conn_param {
        private_data: pd.as_ptr() as *const _,
        private_data_len: pd.len() as u8,
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

/// The next event of `ch` with its private data.
fn next_pd(ch: *mut rdma_event_channel) -> (i32, i32, *mut rdma_cm_id, Vec<u8>) {
    let mut ev = std::ptr::null_mut();
    assert_eq!(unsafe { rdma_get_cm_event(ch, &mut ev) }, 0);
    let r = unsafe {
        let c = (*ev).param.conn;
        let pd = if c.private_data.is_null() {
            Vec::new()
        } else {
            std::slice::from_raw_parts(c.private_data as *const u8, c.private_data_len.into())
                .to_vec()
        };
        ((*ev).event, (*ev).status, (*ev).id, pd)
    };
    assert_eq!(unsafe { rdma_ack_cm_event(ev) }, 0);
    r
}

#[test]
fn connect_accept_establish_disconnect() {
    let sch = unsafe { rdma_create_event_channel() };
    let cch = unsafe { rdma_create_event_channel() };
    let l = listener(sch, 7300);
    let c = client(cch, 7300);
    assert_eq!(
        unsafe { rdma_connect(c, &mut param(b"hello")) },
        0,
        "errno {}",
        errno()
    );
    let (kind, _, child, pd) = next_pd(sch);
    assert_eq!(kind, RDMA_CM_EVENT_CONNECT_REQUEST);
    assert_eq!(&pd[..5], b"hello");
    assert_ne!(child, l);
    let mut attr = rc_attr();
    assert_eq!(
        unsafe { rdma_create_qp(child, std::ptr::null_mut(), &mut attr) },
        0
    );
    assert_eq!(
        unsafe { rdma_accept(child, &mut param(b"welcome")) },
        0,
        "errno {}",
        errno()
    );
    let (kind, _, id, pd) = next_pd(cch);
    assert_eq!((kind, id), (RDMA_CM_EVENT_ESTABLISHED, c));
    assert_eq!(&pd[..7], b"welcome");
    assert_eq!(next(sch).0, RDMA_CM_EVENT_ESTABLISHED);
    assert_eq!((qp_state(c), qp_state(child)), (3, 3), "both QPs in RTS");
    assert_eq!(unsafe { rdma_disconnect(c) }, 0);
    assert_eq!(next(cch).0, RDMA_CM_EVENT_DISCONNECTED);
    assert_eq!(next(sch).0, RDMA_CM_EVENT_DISCONNECTED);
    unsafe {
        rdma_destroy_qp(c);
        rdma_destroy_qp(child);
        rdma_destroy_id(c);
        rdma_destroy_id(child);
        rdma_destroy_id(l);
        rdma_destroy_event_channel(sch);
        rdma_destroy_event_channel(cch);
    }
}

#[test]
fn rejected_connection_reports_the_consumer_reason_and_private_data() {
    let sch = unsafe { rdma_create_event_channel() };
    let cch = unsafe { rdma_create_event_channel() };
    let l = listener(sch, 7301);
    let c = client(cch, 7301);
    assert_eq!(
        unsafe { rdma_connect(c, &mut param(&[])) },
        0,
        "errno {}",
        errno()
    );
    let (kind, _, child, _) = next_pd(sch);
    assert_eq!(kind, RDMA_CM_EVENT_CONNECT_REQUEST);
    assert_eq!(
        unsafe { rdma_reject(child, b"no".as_ptr() as *const _, 2) },
        0
    );
    let (kind, status, _, pd) = next_pd(cch);
    assert_eq!(
        (kind, status),
        (RDMA_CM_EVENT_REJECTED, i32::from(REJ_CONSUMER))
    );
    assert_eq!(&pd[..2], b"no");
    unsafe {
        rdma_destroy_qp(c);
        rdma_destroy_id(c);
        rdma_destroy_id(child);
        rdma_destroy_id(l);
        rdma_destroy_event_channel(sch);
        rdma_destroy_event_channel(cch);
    }
}

/// The CM runs on the GSI libibverbs exports (this `-rdynamic` binary carries
/// `softverbs_open_gsi`): a listen succeeds, and a second listen on the same port is refused.
#[test]
fn listen_opens_the_gsi_and_a_port_is_listened_once() {
    assert!(
        softverbs_rdmacm::verbs::open_gsi_fn().is_some(),
        "softverbs_open_gsi not found"
    );
    let ch = unsafe { rdma_create_event_channel() };
    let l = listener(ch, 7302);
    let mut id = std::ptr::null_mut();
    assert_eq!(
        unsafe { rdma_create_id(ch, &mut id, std::ptr::null_mut(), RDMA_PS_TCP) },
        0
    );
    let mut a = sa("127.0.72.2:7302");
    unsafe {
        let bound = rdma_bind_addr(id, &mut a as *mut _ as *mut _);
        let listened = if bound == 0 {
            rdma_listen(id, 1)
        } else {
            bound
        };
        assert_eq!(listened, -1);
        assert_eq!(errno(), libc::EADDRINUSE);
        rdma_destroy_id(id);
        rdma_destroy_id(l);
        rdma_destroy_event_channel(ch);
    }
}
