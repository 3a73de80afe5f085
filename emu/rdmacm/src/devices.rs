//! The process's devices as rdma_cm sees them: each softverbs device's context, IPv4 address
//! (its GID 0 is the address IPv4-mapped), port attributes, and a default PD.
//!
//! The list is opened once, on the first call that needs a device (binding or resolving an
//! address, `rdma_get_devices`), through `ibv_get_device_list`. The first such call may name
//! the address the process wants: when `SOFTVERBS_UDP_ADDRS` is unset and libibverbs has not
//! built its devices yet, binding a specific IPv4 address (`rping -s -a 127.0.0.5`) sets
//! `SOFTVERBS_UDP_ADDRS=ADDR:4791` first, so the process's one device is on that address
//! instead of the zero-configuration `127.x.y.z`. Otherwise an address selects the device
//! whose GID matches it. What it is not: a routing table — any destination is reached from
//! the first device unless a device has that very address.

use std::ffi::c_int;
use std::net::Ipv4Addr;
use std::sync::OnceLock;

use ibverbs_sys::{ibv_context, ibv_device_attr, ibv_gid, ibv_pd, ibv_port_attr};

use crate::addr::ip_of_gid;
use crate::verbs::*;

/// Environment variable libibverbs reads for its devices' addresses.
pub const UDP_ADDRS_ENV: &str = "SOFTVERBS_UDP_ADDRS";
/// The UDP port of RoCEv2, where every softverbs device listens.
pub const ROCE_PORT: u16 = 4791;

/// One device.
#[derive(Debug)]
pub struct Dev {
    ctx: usize,
    /// Its IPv4 address (from GID 0).
    pub ip: Ipv4Addr,
    /// GID 0.
    pub gid: [u8; 16],
    /// The port's active MTU (IBTA encoding).
    pub active_mtu: u8,
    /// `max_qp_rd_atom` (incoming READs/atomics a QP accepts).
    pub max_rd_atom: u8,
    /// `max_qp_init_rd_atom` (outstanding READs/atomics a QP issues).
    pub max_init_rd_atom: u8,
    pd: OnceLock<usize>,
}

impl Dev {
    /// The open context.
    pub fn ctx(&self) -> *mut ibv_context {
        self.ctx as *mut ibv_context
    }

    /// The device's default PD (allocated on first use), for QPs created without one.
    pub fn default_pd(&self) -> *mut ibv_pd {
        // SAFETY: an open context of this process.
        *self
            .pd
            .get_or_init(|| unsafe { ibv_alloc_pd(self.ctx()) } as usize) as *mut ibv_pd
    }
}

static DEVS: OnceLock<Vec<Dev>> = OnceLock::new();

/// The devices, opened on first use; `want` is the address the first caller binds (see the
/// module docs).
pub fn devices(want: Option<Ipv4Addr>) -> &'static [Dev] {
    DEVS.get_or_init(|| {
        if let Some(ip) = want.filter(|ip| !ip.is_unspecified())
            && std::env::var_os(UDP_ADDRS_ENV).is_none()
        {
            // SAFETY: set before this library's first ibv_get_device_list, the only reader
            // of the variable in a program that uses libibverbs through rdma_cm; a program
            // that reads the environment on another thread at this moment races as with any
            // setenv (documented in the README).
            unsafe { std::env::set_var(UDP_ADDRS_ENV, format!("{ip}:{ROCE_PORT}")) };
        }
        open_all()
    })
}

/// The device at `index` of [`devices`] (already opened).
pub fn dev(index: usize) -> Option<&'static Dev> {
    DEVS.get().and_then(|d| d.get(index))
}

/// The index of the device whose address is `ip`.
pub fn find(ip: Ipv4Addr) -> Option<usize> {
    devices(Some(ip)).iter().position(|d| d.ip == ip)
}

/// The index of the device with context `ctx`.
pub fn find_ctx(ctx: *mut ibv_context) -> Option<usize> {
    DEVS.get()?.iter().position(|d| d.ctx() == ctx)
}

fn open_all() -> Vec<Dev> {
    let mut out = Vec::new();
    let mut n: c_int = 0;
    // SAFETY: libibverbs' device list; freed below, contexts stay open for the process.
    unsafe {
        let list = ibv_get_device_list(&mut n);
        if list.is_null() {
            return out;
        }
        for i in 0..usize::try_from(n).unwrap_or(0) {
            let ctx = ibv_open_device(*list.add(i));
            if let Some(d) = (!ctx.is_null()).then(|| describe(ctx)).flatten() {
                out.push(d);
            }
        }
        ibv_free_device_list(list);
    }
    out
}

/// # Safety
/// `ctx` is an open context.
unsafe fn describe(ctx: *mut ibv_context) -> Option<Dev> {
    let mut gid = ibv_gid::default();
    let mut port = ibv_port_attr::default();
    // SAFETY: an all-zero ibv_device_attr is valid (integers and arrays).
    let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's open context and our out-parameters.
    let ok = unsafe {
        ibv_query_gid(ctx, 1, 0, &mut gid) == 0
            && ibv_query_port(ctx, 1, &mut port) == 0
            && ibv_query_device(ctx, &mut attr) == 0
    };
    if !ok {
        return None;
    }
    Some(Dev {
        ctx: ctx as usize,
        ip: ip_of_gid(&gid.raw)?,
        gid: gid.raw,
        active_mtu: port.active_mtu as u8,
        max_rd_atom: attr.max_qp_rd_atom.clamp(0, 255) as u8,
        max_init_rd_atom: attr.max_qp_init_rd_atom.clamp(0, 255) as u8,
        pd: OnceLock::new(),
    })
}

/// `rdma_get_devices`: a NULL-terminated array (freed with `rdma_free_devices`) of the open
/// contexts, its length in `*num_devices` when that is not NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    crate::guard(std::ptr::null_mut(), || {
        let devs = devices(None);
        // SAFETY: calloc of len+1 pointers, zeroed (NULL-terminated).
        let list = unsafe { libc::calloc(devs.len() + 1, std::mem::size_of::<usize>()) }
            as *mut *mut ibv_context;
        if list.is_null() {
            crate::set_errno(libc::ENOMEM);
            return list;
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: within the len+1 entries allocated.
            unsafe { *list.add(i) = d.ctx() };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller's out-parameter.
            unsafe { *num_devices = devs.len() as c_int };
        }
        list
    })
}

/// `rdma_free_devices`: frees an array `rdma_get_devices` returned (the contexts stay open).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: allocated with calloc by rdma_get_devices (or NULL).
    unsafe { libc::free(list as *mut libc::c_void) };
}
