//! `rdma_cm_id`s: `rdma_create_id` … `rdma_destroy_id`, `rdma_migrate_id`, address binding and
//! resolution, QPs and SRQs on ids, endpoints (`rdma_create_ep`), `rdma_set_option` and the
//! port getters.
//!
//! An id is a boxed `rdma_cm_id` (the program's view: device, QP, route, …) plus its private
//! [`IdState`] in the agent's state. An id created without a channel is synchronous: it gets
//! a private channel and the calls that produce an event wait for it (as librdmacm's
//! `ucma_complete`). Address resolution needs no network exchange: an IPv4 address names a
//! softverbs device's GID (`::ffff:a.b.c.d` → `a.b.c.d:4791`), so `ADDR_RESOLVED` and
//! `ROUTE_RESOLVED` are queued at once. What it is not: the connection calls (see
//! [`crate::agent`]).

use std::ffi::{c_int, c_void};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU32, Ordering};

use ibverbs_sys::*;

use crate::abi::*;
use crate::addr::{self, gid_of};
use crate::agent::{self, IdState};
use crate::channel::{self, SvEvent};
use crate::devices::{self, Dev};
use crate::verbs::*;
use crate::{fail, guard, ret};

/// Allocates an id (public part only; the caller registers its state).
pub fn new_id(
    ch: *mut rdma_event_channel,
    context: *mut c_void,
    ps: c_int,
    qp_type: c_int,
) -> *mut rdma_cm_id {
    // SAFETY: rdma_cm_id is pointers, integers and plain structs: all-zero is valid.
    let mut id: Box<rdma_cm_id> = Box::new(unsafe { std::mem::zeroed() });
    id.channel = ch;
    id.context = context;
    id.ps = ps;
    id.qp_type = qp_type;
    Box::into_raw(id)
}

/// Fills `id`'s device, addresses, GIDs and one path record (freed by `rdma_destroy_id`).
///
/// # Safety
/// `id` is a live id of this library.
pub unsafe fn set_route(
    id: *mut rdma_cm_id,
    d: &Dev,
    local: SocketAddrV4,
    peer: SocketAddrV4,
    dgid: [u8; 16],
) {
    // SAFETY: per the contract.
    let id = unsafe { &mut *id };
    id.verbs = d.ctx();
    id.port_num = 1;
    let a = &mut id.route.addr;
    addr::store(&mut a.src_storage, local);
    addr::store(&mut a.dst_storage, peer);
    a.ibaddr.sgid.raw = d.gid;
    a.ibaddr.dgid.raw = dgid;
    a.ibaddr.pkey = 0xFFFFu16.to_be();
    set_path(id, d);
}

fn set_path(id: &mut rdma_cm_id, d: &Dev) {
    let a = &id.route.addr.ibaddr;
    let rec = ibv_sa_path_rec {
        dgid: a.dgid,
        sgid: a.sgid,
        hop_limit: 64,
        reversible: 1,
        numb_path: 1,
        pkey: 0xFFFFu16.to_be(),
        mtu_selector: 2,
        mtu: d.active_mtu,
        rate_selector: 2,
        packet_life_time_selector: 2,
        packet_life_time: agent::DEFAULT_ACK_TIMEOUT - 1,
        ..Default::default()
    };
    if id.route.path_rec.is_null() {
        id.route.path_rec = Box::into_raw(Box::new(rec));
    } else {
        // SAFETY: a path record this library boxed.
        unsafe { *id.route.path_rec = rec };
    }
    id.route.num_paths = 1;
}

/// The next ephemeral port (the kernel's range, 32768…60999).
fn ephemeral_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let base = std::process::id().wrapping_mul(2_654_435_761);
    (32768 + (base.wrapping_add(n) % 28232)) as u16
}

/// `rdma_create_id`: a new id on `channel` (NULL: synchronous, with a private channel).
/// `EINVAL` for a NULL `id` or a `channel` that is not a live channel of this library,
/// `EPROTONOSUPPORT` for port spaces other than TCP, UDP, IPOIB, IB.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    guard(-1, || {
        if id.is_null() || !(channel.is_null() || channel::is_live(channel)) {
            return fail(libc::EINVAL);
        }
        let qpt = match ps {
            RDMA_PS_TCP | RDMA_PS_IB => IBV_QPT_RC,
            RDMA_PS_UDP | RDMA_PS_IPOIB => IBV_QPT_UD,
            _ => return fail(libc::EPROTONOSUPPORT),
        };
        match create(channel, context, ps, qpt as c_int) {
            Ok(p) => {
                // SAFETY: the caller's result slot.
                unsafe { *id = p };
                0
            }
            Err(e) => fail(e),
        }
    })
}

fn create(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: c_int,
    qpt: c_int,
) -> Result<*mut rdma_cm_id, i32> {
    let sync = channel.is_null();
    let ch = if sync {
        channel::new_channel().ok_or(libc::ENOMEM)? as *mut rdma_event_channel
    } else {
        channel
    };
    let p = new_id(ch, context, ps, qpt);
    agent::lock().ids.insert(
        p as usize,
        IdState {
            sync,
            ..Default::default()
        },
    );
    Ok(p)
}

/// `rdma_destroy_id`: forgets the id's connection (the CM rejects or disconnects it) and
/// listens, drops its unread events, frees it. Its QP must be destroyed first. An `id` that
/// is not a live id of this library (NULL, or destroyed already: perftest 4.5's client
/// destroys its ids twice after a refused connection) fails with `EINVAL` and frees nothing,
/// as librdmacm's kernel ABI refuses an unknown id handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        let sync = {
            let mut s = agent::lock();
            let Some(sync) = s.ids.get(&(id as usize)).map(|st| st.sync) else {
                return fail(libc::EINVAL);
            };
            s.forget(id as usize);
            sync
        };
        // SAFETY: a live id of this library (it was in the id table, and only one caller
        // removes it), not used by the program afterwards.
        unsafe {
            let b = Box::from_raw(id);
            channel::forget_id(b.channel, id);
            if sync {
                if !b.event.is_null() {
                    drop(Box::from_raw(b.event as *mut SvEvent));
                }
                channel::free_channel(b.channel);
            }
            if !b.route.path_rec.is_null() {
                drop(Box::from_raw(b.route.path_rec));
            }
        }
        0
    })
}

/// `rdma_migrate_id`: moves the id to `channel` (NULL: a private channel, synchronous).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let mut s = agent::lock();
        let Some(st) = s.ids.get_mut(&(id as usize)) else {
            return fail(libc::EINVAL);
        };
        if !(channel.is_null() || channel::is_live(channel)) {
            return fail(libc::EINVAL);
        }
        let ch = if channel.is_null() {
            match channel::new_channel() {
                Some(c) => c as *mut rdma_event_channel,
                None => return fail(libc::ENOMEM),
            }
        } else {
            channel
        };
        // SAFETY: a live id; its old private channel (if synchronous) is only its own.
        unsafe {
            let old = (*id).channel;
            channel::forget_id(old, id);
            if st.sync {
                channel::free_channel(old);
            }
            (*id).channel = ch;
        }
        st.sync = channel.is_null();
        0
    })
}

/// Binds `id` to `a`: a specific address selects (or, first in the process, configures) the
/// device with that address; the wildcard binds no device. Port 0 takes an ephemeral port.
///
/// # Safety
/// `id` is a live id of this library.
unsafe fn bind(id: *mut rdma_cm_id, a: SocketAddrV4) -> Result<(), i32> {
    let dev = if a.ip().is_unspecified() {
        None
    } else {
        Some(devices::find(*a.ip()).ok_or(libc::EADDRNOTAVAIL)?)
    };
    let port = if a.port() == 0 {
        ephemeral_port()
    } else {
        a.port()
    };
    let mut s = agent::lock();
    let st = s.ids.get_mut(&(id as usize)).ok_or(libc::EINVAL)?;
    if st.bound {
        return Err(libc::EINVAL);
    }
    st.bound = true;
    st.dev = dev;
    // SAFETY: per the contract.
    let idr = unsafe { &mut *id };
    addr::store(
        &mut idr.route.addr.src_storage,
        SocketAddrV4::new(*a.ip(), port),
    );
    if let Some(d) = dev.and_then(devices::dev) {
        idr.verbs = d.ctx();
        idr.port_num = 1;
        idr.route.addr.ibaddr.sgid.raw = d.gid;
    }
    Ok(())
}

/// Binds an unbound id to the wildcard and an ephemeral port (before listening).
///
/// # Safety
/// `id` is a live id of this library.
pub unsafe fn bind_default(id: *mut rdma_cm_id) -> Result<(), i32> {
    let bound = agent::lock()
        .ids
        .get(&(id as usize))
        .ok_or(libc::EINVAL)?
        .bound;
    if bound {
        return Ok(());
    }
    // SAFETY: per the contract.
    unsafe { bind(id, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)) }
}

/// `rdma_bind_addr`: binds an IPv4 address (see the crate README for how it picks or
/// configures the device). `EAFNOSUPPORT` for other families, `EADDRNOTAVAIL` for an
/// address no device has, `EINVAL` when already bound.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, a: *mut libc::sockaddr) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's socket address and live id.
        ret(unsafe { addr::read_sockaddr(a).and_then(|a| bind(id, a)) })
    })
}

/// `rdma_resolve_addr`: binds `src` (or the device whose address is `dst`, else the first
/// device), records `dst` and its GID (`::ffff:dst`) and queues ADDR_RESOLVED.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's socket addresses and live id.
        ret(unsafe { resolve_addr(id, src, dst) })
    })
}

/// # Safety
/// `id` is a live id of this library; `src` NULL or a socket address; `dst` a socket address.
unsafe fn resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
) -> Result<(), i32> {
    // SAFETY: per the contract.
    let dst = unsafe { addr::read_sockaddr(dst) }?;
    if !src.is_null() {
        // SAFETY: per the contract.
        let a = unsafe { addr::read_sockaddr(src) }?;
        // SAFETY: per the contract.
        unsafe { bind(id, a) }?;
    }
    let (sync, dev, bound) = {
        let s = agent::lock();
        let st = s.ids.get(&(id as usize)).ok_or(libc::EINVAL)?;
        (st.sync, st.dev, st.bound)
    };
    let dev = match dev {
        Some(d) => d,
        None => {
            let devs = devices::devices(None);
            let d = devs.iter().position(|d| d.ip == *dst.ip()).unwrap_or(0);
            devs.get(d).ok_or(libc::ENODEV)?;
            d
        }
    };
    let d = devices::dev(dev).ok_or(libc::ENODEV)?;
    // SAFETY: per the contract.
    let port = match unsafe { addr::load(&(*id).route.addr.src_storage) } {
        Some(a) if bound && a.port() != 0 => a.port(),
        _ => ephemeral_port(),
    };
    // SAFETY: per the contract.
    unsafe { set_route(id, d, SocketAddrV4::new(d.ip, port), dst, gid_of(*dst.ip())) };
    {
        let mut s = agent::lock();
        let st = s.ids.get_mut(&(id as usize)).ok_or(libc::EINVAL)?;
        st.dev = Some(dev);
        st.bound = true;
    }
    // SAFETY: per the contract.
    unsafe { complete(id, sync, RDMA_CM_EVENT_ADDR_RESOLVED) }
}

/// Queues event `kind` for `id`; a synchronous id consumes it at once.
///
/// # Safety
/// `id` is a live id of this library.
unsafe fn complete(id: *mut rdma_cm_id, sync: bool, kind: c_int) -> Result<(), i32> {
    // SAFETY: per the contract.
    unsafe {
        channel::post((*id).channel, SvEvent::new(id, kind, 0));
        if sync {
            channel::wait_for((*id).channel, kind)?;
        }
    }
    Ok(())
}

/// `rdma_resolve_route`: the path (one record: the GIDs, the port's MTU) is known once the
/// address is; queues ROUTE_RESOLVED. `EINVAL` before `rdma_resolve_addr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let sync = {
            let mut s = agent::lock();
            let Some(st) = s.ids.get_mut(&(id as usize)) else {
                return fail(libc::EINVAL);
            };
            // SAFETY: a live id.
            if st.dev.is_none() || unsafe { addr::load(&(*id).route.addr.dst_storage) }.is_none() {
                return fail(libc::EINVAL);
            }
            st.routed = true;
            st.sync
        };
        // SAFETY: a live id.
        ret(unsafe { complete(id, sync, RDMA_CM_EVENT_ROUTE_RESOLVED) })
    })
}

/// `rdma_get_src_port`: the bound port, network order (0 when unbound).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    if id.is_null() {
        return 0;
    }
    // SAFETY: the caller's live id.
    unsafe { addr::load(&(*id).route.addr.src_storage) }.map_or(0, |a| a.port().to_be())
}

/// `rdma_get_dst_port`: the peer's port, network order (0 when none).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    if id.is_null() {
        return 0;
    }
    // SAFETY: the caller's live id.
    unsafe { addr::load(&(*id).route.addr.dst_storage) }.map_or(0, |a| a.port().to_be())
}

/// `rdma_set_option`: `RDMA_OPTION_ID_TOS` (u8: the traffic class of the QP's GRH),
/// `RDMA_OPTION_ID_ACK_TIMEOUT` (u8: the local ACK timeout exponent), `RDMA_OPTION_ID_REUSEADDR`
/// and `RDMA_OPTION_ID_AFONLY` (int, accepted), `RDMA_OPTION_IB_PATH` (accepted, ignored: the
/// path is the device's). Others: `ENOSYS`; a short `optval`: `EINVAL`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    guard(-1, || {
        if id.is_null() || optval.is_null() {
            return fail(libc::EINVAL);
        }
        let mut s = agent::lock();
        let Some(st) = s.ids.get_mut(&(id as usize)) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: the caller's option value of `optlen` bytes (checked below before reading).
        let byte = || unsafe { *(optval as *const u8) };
        match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) if optlen >= 1 => st.tos = byte(),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if optlen >= 1 => {
                st.ack_timeout = Some(byte().min(31));
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY)
                if optlen >= std::mem::size_of::<c_int>() => {}
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {}
            (RDMA_OPTION_ID | RDMA_OPTION_IB, 0..=3) => return fail(libc::EINVAL),
            _ => return fail(libc::ENOSYS),
        }
        0
    })
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::ENOMEM)
}

/// Creates the CQs `attr` lacks (each with a completion channel), recording them on the id.
///
/// # Safety
/// `id` has a device; `attr` is the caller's.
unsafe fn make_cqs(id: &mut rdma_cm_id, attr: &mut ibv_qp_init_attr) -> Result<bool, i32> {
    let mut made = false;
    // SAFETY: the id's open context.
    unsafe {
        if attr.send_cq.is_null() {
            id.send_cq_channel = ibv_create_comp_channel(id.verbs);
            let n = attr.cap.max_send_wr.max(1) as c_int;
            id.send_cq = ibv_create_cq(
                id.verbs,
                n,
                id as *mut _ as *mut c_void,
                id.send_cq_channel,
                0,
            );
            if id.send_cq.is_null() {
                return Err(last_errno());
            }
            attr.send_cq = id.send_cq;
            made = true;
        }
        if attr.recv_cq.is_null() {
            id.recv_cq_channel = ibv_create_comp_channel(id.verbs);
            let n = attr.cap.max_recv_wr.max(1) as c_int;
            id.recv_cq = ibv_create_cq(
                id.verbs,
                n,
                id as *mut _ as *mut c_void,
                id.recv_cq_channel,
                0,
            );
            if id.recv_cq.is_null() {
                return Err(last_errno());
            }
            attr.recv_cq = id.recv_cq;
            made = true;
        }
    }
    Ok(made)
}

/// `rdma_create_qp`: a QP on the id's device (PD: `pd`, else the id's, else the device's
/// default; missing CQs are created with completion channels), left in INIT (RC/UC) or RTS
/// (UD). `EINVAL` before the id has a device or for NULL attributes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        if id.is_null() || qp_init_attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's live id and attributes.
        ret(unsafe { create_qp(&mut *id, pd, &mut *qp_init_attr) })
    })
}

/// # Safety
/// `id` is a live id of this library.
unsafe fn create_qp(
    id: &mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: &mut ibv_qp_init_attr,
) -> Result<(), i32> {
    if id.verbs.is_null() || !id.qp.is_null() {
        return Err(libc::EINVAL);
    }
    let dev = devices::find_ctx(id.verbs)
        .and_then(devices::dev)
        .ok_or(libc::EINVAL)?;
    let pd = [pd, id.pd]
        .into_iter()
        .find(|p| !p.is_null())
        .unwrap_or_else(|| dev.default_pd());
    if pd.is_null() {
        return Err(libc::ENOMEM);
    }
    // SAFETY: the id has a device; attr is the caller's.
    let own = unsafe { make_cqs(id, attr) }?;
    if own && let Some(st) = agent::lock().ids.get_mut(&(id as *mut _ as usize)) {
        st.own_cqs = true;
    }
    // SAFETY: the PD and CQs of the id's device.
    let qp = unsafe { ibv_create_qp(pd, attr) };
    if qp.is_null() {
        return Err(last_errno());
    }
    // SAFETY: the new QP, in RESET.
    if let Err(e) = unsafe { crate::qp::init_qp(qp) } {
        // SAFETY: as above.
        unsafe { ibv_destroy_qp(qp) };
        return Err(e);
    }
    id.qp = qp;
    id.pd = pd;
    Ok(())
}

/// `rdma_create_qp_ex`: as `rdma_create_qp` for the base attributes (with
/// `IBV_QP_INIT_ATTR_PD`); other `comp_mask` bits: `EOPNOTSUPP`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard(-1, || {
        if id.is_null() || attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &mut *attr };
        if a.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        let mut base = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            a.pd
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: the caller's live id.
        let r = unsafe { create_qp(&mut *id, pd, &mut base) };
        a.cap = base.cap;
        ret(r)
    })
}

/// `rdma_destroy_qp`: destroys the id's QP (and the CQs `rdma_create_qp` made for it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        if id.is_null() {
            return;
        }
        let own = agent::lock()
            .ids
            .get_mut(&(id as usize))
            .is_some_and(|st| std::mem::take(&mut st.own_cqs));
        // SAFETY: the caller's live id and its objects.
        unsafe {
            let id = &mut *id;
            if !id.qp.is_null() {
                ibv_destroy_qp(id.qp);
                id.qp = std::ptr::null_mut();
            }
            if own {
                for (cq, ch) in [
                    (&mut id.send_cq, &mut id.send_cq_channel),
                    (&mut id.recv_cq, &mut id.recv_cq_channel),
                ] {
                    if !cq.is_null() {
                        ibv_destroy_cq(*cq);
                        *cq = std::ptr::null_mut();
                    }
                    if !ch.is_null() {
                        ibv_destroy_comp_channel(*ch);
                        *ch = std::ptr::null_mut();
                    }
                }
            }
        }
    })
}

/// `rdma_create_srq`: an SRQ on the id's device (PD as for `rdma_create_qp`), in `id->srq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard(-1, || {
        if id.is_null() || attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's live id and attributes.
        unsafe {
            let id = &mut *id;
            let Some(dev) = devices::find_ctx(id.verbs).and_then(devices::dev) else {
                return fail(libc::EINVAL);
            };
            let pd = [pd, id.pd]
                .into_iter()
                .find(|p| !p.is_null())
                .unwrap_or_else(|| dev.default_pd());
            let srq = ibv_create_srq(pd, attr);
            if srq.is_null() {
                return fail(last_errno());
            }
            id.srq = srq;
            id.pd = pd;
        }
        0
    })
}

/// `rdma_destroy_srq`: destroys the id's SRQ.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: the caller's live id and its SRQ.
        unsafe {
            if let Some(id) = id.as_mut()
                && !id.srq.is_null()
            {
                ibv_destroy_srq(id.srq);
                id.srq = std::ptr::null_mut();
            }
        }
    })
}

/// `rdma_create_ep`: a synchronous id for `res` — passive (`RAI_PASSIVE`): bound to the
/// source address, QPs made by `rdma_get_request` from `qp_init_attr`; active: address and
/// route resolved, with a QP when `qp_init_attr` is given.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        if id.is_null() || res.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's addrinfo and attributes.
        let (res, attr) = unsafe { (&*res, qp_init_attr.as_mut()) };
        let p = match create(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            res.ai_port_space,
            res.ai_qp_type,
        ) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        // SAFETY: the new id; the addrinfo's addresses.
        let r = unsafe { setup_ep(p, res, pd, attr) };
        if let Err(e) = r {
            // SAFETY: the new id, not yet handed out.
            unsafe { rdma_destroy_id(p) };
            return fail(e);
        }
        // SAFETY: the caller's result slot.
        unsafe { *id = p };
        0
    })
}

/// # Safety
/// `p` is a new synchronous id; `res`'s addresses are valid.
unsafe fn setup_ep(
    p: *mut rdma_cm_id,
    res: &rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: Option<&mut ibv_qp_init_attr>,
) -> Result<(), i32> {
    // SAFETY: per the contract.
    unsafe { (*p).pd = pd };
    if res.ai_flags & RAI_PASSIVE != 0 {
        // SAFETY: per the contract.
        unsafe { bind(p, addr::read_sockaddr(res.ai_src_addr)?) }?;
        if let Some(a) = attr
            && let Some(st) = agent::lock().ids.get_mut(&(p as usize))
        {
            st.qp_template = Some(*a);
        }
        return Ok(());
    }
    let src = if res.ai_src_addr.is_null() {
        std::ptr::null_mut()
    } else {
        res.ai_src_addr
    };
    // SAFETY: per the contract.
    unsafe {
        resolve_addr(p, src, res.ai_dst_addr)?;
        if rdma_resolve_route(p, 2000) != 0 {
            return Err(last_errno());
        }
        if let Some(a) = attr {
            create_qp(&mut *p, pd, a)?;
        }
    }
    Ok(())
}

/// `rdma_destroy_ep`: destroys the endpoint's QP, SRQ and id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: the caller's live endpoint.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_srq(id);
        rdma_destroy_id(id);
    }
}
