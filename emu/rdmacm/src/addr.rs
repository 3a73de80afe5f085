//! IPv4 socket addresses as rdma_cm stores them, their IPv4-mapped GIDs, the CMA
//! private-data header, and `rdma_getaddrinfo` / `rdma_freeaddrinfo`.
//!
//! What it is not: a resolver for IPv6 or InfiniBand (`AF_IB`) addresses; those answer
//! `EAFNOSUPPORT`.

use std::ffi::{CStr, c_char, c_int};
use std::net::{Ipv4Addr, SocketAddrV4, ToSocketAddrs};

use crate::abi::*;
use crate::verbs::{IBV_QPT_RC, IBV_QPT_UD};
use crate::{fail, guard};

/// Bytes of the CMA header at the start of a REQ's private data (IPv4 or IPv6 addresses and
/// the active side's port; the kernel's `struct cma_hdr`).
pub const CMA_HDR_LEN: usize = 36;
/// REQ private data available to the user after the CMA header (92 − 36).
pub const MAX_REQ_USER_PRIVATE_DATA: usize = 92 - CMA_HDR_LEN;

/// The IPv4-mapped GID of `ip` (`::ffff:a.b.c.d`), as RoCEv2 GID 0 of a softverbs device.
pub fn gid_of(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// The IPv4 address an IPv4-mapped GID carries.
pub fn ip_of_gid(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    std::net::Ipv6Addr::from(*gid).to_ipv4_mapped()
}

/// Reads an `AF_INET` socket address; `Err(EAFNOSUPPORT)` for other families, `EINVAL` for
/// NULL.
///
/// # Safety
/// `sa` is NULL or points to a socket address of at least the size its family implies.
pub unsafe fn read_sockaddr(sa: *const libc::sockaddr) -> Result<SocketAddrV4, i32> {
    if sa.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's socket address; the family field is first in every variant.
    let family = unsafe { (*sa).sa_family } as c_int;
    if family != libc::AF_INET {
        return Err(libc::EAFNOSUPPORT);
    }
    // SAFETY: an AF_INET address is a sockaddr_in.
    let sin = unsafe { *(sa as *const libc::sockaddr_in) };
    Ok(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        u16::from_be(sin.sin_port),
    ))
}

/// `addr` as a `sockaddr_in`.
pub fn sockaddr_in(addr: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Stores `addr` in an `rdma_addr` union slot.
pub fn store(slot: &mut libc::sockaddr_storage, addr: SocketAddrV4) {
    // SAFETY: sockaddr_storage is plain integers: all-zero is valid.
    *slot = unsafe { std::mem::zeroed() };
    let sin = sockaddr_in(addr);
    // SAFETY: a sockaddr_in (16 bytes) fits at the start of a sockaddr_storage (128).
    unsafe { std::ptr::write(slot as *mut _ as *mut libc::sockaddr_in, sin) };
}

/// Reads back an address [`store`]d in a slot (`None` when the slot is empty).
pub fn load(slot: &libc::sockaddr_storage) -> Option<SocketAddrV4> {
    // SAFETY: a sockaddr_storage is large enough for any family read_sockaddr accepts.
    unsafe { read_sockaddr(slot as *const _ as *const libc::sockaddr) }.ok()
}

/// The CMA header for a REQ from `src` to `dst` (IPv4: version nibble 4, the addresses in the
/// last 4 bytes of their 16-byte slots, the source port).
pub fn cma_header(src: SocketAddrV4, dst: SocketAddrV4) -> [u8; CMA_HDR_LEN] {
    let mut h = [0u8; CMA_HDR_LEN];
    h[1] = 4 << 4;
    h[2..4].copy_from_slice(&src.port().to_be_bytes());
    h[16..20].copy_from_slice(&src.ip().octets());
    h[32..36].copy_from_slice(&dst.ip().octets());
    h
}

/// What a received REQ's CMA header says: the active side's address (with its port) and the
/// destination IP; `None` when the private data holds no IPv4 CMA header.
pub fn parse_cma_header(pd: &[u8]) -> Option<(SocketAddrV4, Ipv4Addr)> {
    if pd.len() < CMA_HDR_LEN || pd[0] != 0 || pd[1] >> 4 != 4 {
        return None;
    }
    let ip = |o: usize| Ipv4Addr::new(pd[o], pd[o + 1], pd[o + 2], pd[o + 3]);
    let port = u16::from_be_bytes([pd[2], pd[3]]);
    Some((SocketAddrV4::new(ip(16), port), ip(32)))
}

/// The port space of a service ID's port-space byte (`0x…01PS_PPPP`) and the port.
pub fn port_of_service(service_id: u64) -> u16 {
    service_id as u16
}

/// An `rdma_addrinfo` with its addresses, as `rdma_getaddrinfo` returns it.
fn new_addrinfo(
    flags: c_int,
    qp_type: c_int,
    ps: c_int,
    src: Option<SocketAddrV4>,
    dst: Option<SocketAddrV4>,
) -> *mut rdma_addrinfo {
    let boxed = |a: SocketAddrV4| Box::into_raw(Box::new(sockaddr_in(a))) as *mut libc::sockaddr;
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    Box::into_raw(Box::new(rdma_addrinfo {
        ai_flags: flags,
        ai_family: libc::AF_INET,
        ai_qp_type: qp_type,
        ai_port_space: ps,
        ai_src_len: if src.is_some() { len } else { 0 },
        ai_dst_len: if dst.is_some() { len } else { 0 },
        ai_src_addr: src.map_or(std::ptr::null_mut(), boxed),
        ai_dst_addr: dst.map_or(std::ptr::null_mut(), boxed),
        ai_src_canonname: std::ptr::null_mut(),
        ai_dst_canonname: std::ptr::null_mut(),
        ai_route_len: 0,
        ai_route: std::ptr::null_mut(),
        ai_connect_len: 0,
        ai_connect: std::ptr::null_mut(),
        ai_next: std::ptr::null_mut(),
    }))
}

/// An IPv4 address of `node` (numeric, or a name the system resolver knows).
fn resolve_node(node: &str, numeric: bool) -> Result<Ipv4Addr, i32> {
    if let Ok(ip) = node.parse::<Ipv4Addr>() {
        return Ok(ip);
    }
    if numeric || node.parse::<std::net::Ipv6Addr>().is_ok() {
        return Err(libc::EAFNOSUPPORT);
    }
    (node, 0)
        .to_socket_addrs()
        .map_err(|_| libc::ENOENT)?
        .find_map(|a| match a {
            std::net::SocketAddr::V4(v4) => Some(*v4.ip()),
            std::net::SocketAddr::V6(_) => None,
        })
        .ok_or(libc::ENOENT)
}

/// # Safety
/// Each pointer is NULL or a NUL-terminated string.
unsafe fn opt_str<'a>(p: *const c_char) -> Result<Option<&'a str>, i32> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(Some).map_err(|_| libc::EINVAL)
}

/// `rdma_getaddrinfo` over IPv4: `node` (numeric or a host name; NULL for a passive wildcard)
/// and `service` (a port number) become one `rdma_addrinfo` — the source address for
/// `RAI_PASSIVE`, else the destination. The QP type defaults to RC and the port space to
/// `RDMA_PS_TCP` (`RDMA_PS_UDP` for UD). Failure: −1 with `errno` (`EINVAL` bad arguments,
/// `EAFNOSUPPORT` IPv6/IB families, `ENOENT` unknown host).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        if res.is_null() || (node.is_null() && service.is_null()) {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's strings and optional hints.
        let (node, service, hints) = unsafe {
            match (opt_str(node), opt_str(service)) {
                (Ok(n), Ok(s)) => (n, s, hints.as_ref()),
                _ => return fail(libc::EINVAL),
            }
        };
        match addrinfo(node, service, hints) {
            Ok(ai) => {
                // SAFETY: checked non-NULL; the caller's result slot.
                unsafe { *res = ai };
                0
            }
            Err(e) => fail(e),
        }
    })
}

fn addrinfo(
    node: Option<&str>,
    service: Option<&str>,
    hints: Option<&rdma_addrinfo>,
) -> Result<*mut rdma_addrinfo, i32> {
    let flags = hints.map_or(0, |h| h.ai_flags);
    if let Some(h) = hints
        && h.ai_family != 0
        && h.ai_family != libc::AF_INET
    {
        return Err(libc::EAFNOSUPPORT);
    }
    let port = match service {
        Some(s) => s.trim().parse::<u16>().map_err(|_| libc::EINVAL)?,
        None => 0,
    };
    let ip = match node {
        Some(n) => resolve_node(n, flags & RAI_NUMERICHOST != 0)?,
        None => Ipv4Addr::UNSPECIFIED,
    };
    let qp_type = match hints.map_or(0, |h| h.ai_qp_type) {
        0 => IBV_QPT_RC as c_int,
        t => t,
    };
    let ps = match hints.map_or(0, |h| h.ai_port_space) {
        0 if qp_type == IBV_QPT_UD as c_int => RDMA_PS_UDP,
        0 => RDMA_PS_TCP,
        p => p,
    };
    let a = SocketAddrV4::new(ip, port);
    Ok(if flags & RAI_PASSIVE != 0 || node.is_none() {
        new_addrinfo(flags | RAI_PASSIVE, qp_type, ps, Some(a), None)
    } else {
        new_addrinfo(flags, qp_type, ps, None, Some(a))
    })
}

/// `rdma_freeaddrinfo`: frees a list `rdma_getaddrinfo` returned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard((), || {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: every node and address of the list was boxed by new_addrinfo.
            let ai = unsafe { Box::from_raw(p) };
            for a in [ai.ai_src_addr, ai.ai_dst_addr] {
                if !a.is_null() {
                    // SAFETY: boxed as a sockaddr_in by new_addrinfo.
                    drop(unsafe { Box::from_raw(a as *mut libc::sockaddr_in) });
                }
            }
            p = ai.ai_next;
        }
    })
}

/// The IB MTU (IBTA encoding, 1 = 256 … 5 = 4096) a RoCEv2 path from `src` can carry: the
/// largest one that fits the MTU of the network interface holding `src`, less the RoCEv2
/// headers as Linux counts them (`iboe_get_mtu`: 96 bytes). `None` for loopback addresses
/// (any `127.x`, unlimited here) and for an address no interface holds.
pub fn roce_mtu_from(src: Ipv4Addr) -> Option<u8> {
    if src.is_loopback() || src.is_unspecified() {
        return None;
    }
    ib_mtu_for(interface_mtu(src)?)
}

/// The largest IB MTU (IBTA encoding) whose packets fit an IP MTU of `ip_mtu` bytes with
/// RoCEv2's headers (96 bytes, as Linux's `iboe_get_mtu` counts them).
pub fn ib_mtu_for(ip_mtu: u32) -> Option<u8> {
    let payload = ip_mtu.checked_sub(96)?;
    (1u8..=5).rev().find(|m| 128u32 << m <= payload)
}

/// The MTU of the interface holding `ip` (getifaddrs, then `/sys/class/net/NAME/mtu`).
fn interface_mtu(ip: Ipv4Addr) -> Option<u32> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut name = None;
    let mut p = list;
    while !p.is_null() && name.is_none() {
        // SAFETY: a node of the list getifaddrs returned; its address, if any, is a sockaddr
        // of the family it names, and its name a NUL-terminated string.
        unsafe {
            let a = (*p).ifa_addr;
            if !a.is_null() && c_int::from((*a).sa_family) == libc::AF_INET {
                let sin = &*(a as *const libc::sockaddr_in);
                if Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)) == ip {
                    name = Some(CStr::from_ptr((*p).ifa_name).to_string_lossy().into_owned());
                }
            }
            p = (*p).ifa_next;
        }
    }
    // SAFETY: the list getifaddrs returned, not used afterwards.
    unsafe { libc::freeifaddrs(list) };
    let text = std::fs::read_to_string(format!("/sys/class/net/{}/mtu", name?)).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roce_mtu_fits_the_interface_less_the_headers() {
        assert_eq!(ib_mtu_for(1500), Some(3));
        assert_eq!(ib_mtu_for(9000), Some(5));
        assert_eq!(ib_mtu_for(65536), Some(5));
        assert_eq!(ib_mtu_for(2200), Some(4));
        assert_eq!(ib_mtu_for(400), Some(1));
        assert_eq!(ib_mtu_for(300), None);
        assert_eq!(roce_mtu_from(Ipv4Addr::new(127, 0, 97, 1)), None);
        assert_eq!(roce_mtu_from(Ipv4Addr::new(192, 0, 2, 77)), None);
    }

    #[test]
    fn cma_header_round_trips_and_matches_the_kernel_layout() {
        let src = SocketAddrV4::new(Ipv4Addr::new(127, 1, 2, 3), 0x1234);
        let dst = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 9), 7174);
        let h = cma_header(src, dst);
        assert_eq!(&h[..4], &[0, 0x40, 0x12, 0x34]);
        assert_eq!(&h[4..16], &[0; 12]);
        assert_eq!(&h[16..20], &[127, 1, 2, 3]);
        assert_eq!(&h[32..36], &[127, 0, 0, 9]);
        assert_eq!(parse_cma_header(&h), Some((src, *dst.ip())));
        assert_eq!(parse_cma_header(&h[..35]), None);
    }

    #[test]
    fn gids_are_ipv4_mapped() {
        let ip = Ipv4Addr::new(127, 0, 0, 1);
        let g = gid_of(ip);
        assert_eq!(&g[10..], &[0xff, 0xff, 127, 0, 0, 1]);
        assert_eq!(ip_of_gid(&g), Some(ip));
    }
}
