//! `HwProvider` and its handles: the `verbs_api` traits over the safe owners of
//! [`crate::ffi::safe`].
//!
//! Each handle is an `Arc` around a slot (`RwLock<Option<…>>`) holding the libibverbs object:
//! calls take the read lock (so a concurrent `destroy` waits for them), `destroy` takes the
//! write lock and empties the slot, after which every call fails with `Destroyed`. Objects
//! that others depend on (PD, CQ, SRQ, channel) sit in the slot behind an `Arc`, which their
//! dependants clone: `destroy` succeeds only when it holds the last one, else it is `Busy`.
//! Where libibverbs or rxe behave differently from the `verbs_api` contract, the checks here
//! enforce the contract (see the crate documentation for the list).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use verbs_api::{
    AccessFlags, AddressHandle, AhAttr, AsyncEvent, CompletionChannel, CompletionQueue, Context,
    Device, DeviceAttr, Endpoint, Error, ErrorKind, Gid, MAX_24BIT, MemoryRegion, MemoryWindow,
    MwBind, MwType, PortAttr, PostError, ProtectionDomain, Provider, QpAttr, QpAttrMask,
    QpInitAttr, QpState, QpType, QueuePair, ROCE_V2_UDP_PORT, Recovery, RecvWr, Result, SendWr,
    SharedReceiveQueue, SrqAttr, WorkCompletion,
};

use crate::convert::{self, errno_error};
use crate::ffi::loader;
use crate::ffi::safe::{
    DeviceList, RawAh, RawChannel, RawContext, RawCq, RawMr, RawMw, RawPd, RawQp, RawSrq,
    WrObjects, wait_readable,
};
use crate::ffi::sys::{ibv_mr, ibv_mw, ibv_mw_bind, ibv_mw_bind_info, ibv_srq_attr, ibv_wc};
use mr_region::Region;

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

fn destroyed(what: &str) -> Error {
    Error::destroyed(what)
}

fn foreign(what: &str) -> Error {
    Error::invalid(format!("the {what} belongs to another context"))
}

// ---- provider and devices -----------------------------------------------------------------

/// The real-hardware provider (`"hw"`): the RDMA devices libibverbs lists (a NIC, or Linux
/// SoftRoCE's `rxe0`), with `libibverbs.so.1` loaded at run time.
///
/// Creating it loads the library once per process; without rdma-core it fails with
/// [`ErrorKind::NotFound`] naming the library, so a program can fall back to the emulator.
#[derive(Clone, Debug)]
pub struct HwProvider {
    raw: bool,
}

impl HwProvider {
    /// Loads libibverbs (once per process) and resolves its symbols. Its contexts enforce the
    /// `verbs_api` contract where libibverbs or rxe differ (see the crate documentation).
    ///
    /// Errors: `NotFound` when `libibverbs.so.1` is missing or lacks a symbol (the message
    /// names the library and the package to install).
    pub fn new() -> Result<HwProvider> {
        loader::verbs()?;
        Ok(HwProvider { raw: false })
    }

    /// As [`HwProvider::new`], in raw mode: the contract checks that only make libibverbs and
    /// rxe look like the `verbs_api` contract are off, so calls go straight to libibverbs and
    /// return the library's and the device's own answer. The checks that keep the process
    /// memory-safe stay on (the crate documentation lists both kinds). Meant for measuring a
    /// device against the contract (the differential run), not for applications.
    pub fn raw() -> Result<HwProvider> {
        loader::verbs()?;
        Ok(HwProvider { raw: true })
    }

    /// Whether this provider (and every context it opens) is in raw mode.
    pub fn is_raw(&self) -> bool {
        self.raw
    }

    /// Whether libibverbs can be loaded in this process (devices may still be absent).
    pub fn is_available() -> bool {
        loader::verbs().is_ok()
    }
}

impl Provider for HwProvider {
    type Device = HwDevice;

    fn name(&self) -> &'static str {
        "hw"
    }

    /// The devices `ibv_get_device_list` lists now; empty when the kernel has no RDMA support.
    fn devices(&self) -> Result<Vec<HwDevice>> {
        let verbs = loader::verbs()?;
        let Some(list) =
            DeviceList::get(verbs).map_err(|e| errno_error("ibv_get_device_list", e))?
        else {
            return Ok(Vec::new());
        };
        let list = Arc::new(list);
        let mut out = Vec::with_capacity(list.len());
        for index in 0..list.len() {
            let (Some(name), Some(guid)) = (list.name(index), list.guid(index)) else {
                continue;
            };
            out.push(HwDevice {
                list: list.clone(),
                index,
                name,
                guid,
                raw: self.raw,
            });
        }
        Ok(out)
    }
}

/// One device of the list (`ibv_device`); cheap to clone.
#[derive(Clone)]
pub struct HwDevice {
    list: Arc<DeviceList>,
    index: usize,
    name: String,
    guid: u64,
    /// Raw mode (see [`HwProvider::raw`]), passed on to the contexts it opens.
    raw: bool,
}

impl std::fmt::Debug for HwDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HwDevice")
            .field("name", &self.name)
            .field("guid", &format_args!("{:#018x}", self.guid))
            .field("raw", &self.raw)
            .finish()
    }
}

impl Device for HwDevice {
    type Context = HwContext;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn node_guid(&self) -> u64 {
        self.guid
    }

    fn open(&self) -> Result<HwContext> {
        let raw = self
            .list
            .open(self.index)
            .map_err(|e| errno_error(&format!("ibv_open_device({})", self.name), e))?;
        raw.set_async_nonblocking()
            .map_err(|e| Error::new(ErrorKind::Io, format!("async fd O_NONBLOCK: {e}")))?;
        let raw = Arc::new(raw);
        let attr = raw
            .query_device()
            .map_err(|e| errno_error("ibv_query_device", e))?;
        let mut attr = convert::device_attr(&attr);
        attr.max_inline_data = max_inline_data(&raw, &self.name, attr.node_guid);
        let pkey_tbl_len = (1..=attr.phys_port_cnt)
            .map(|p| raw.query_port(p).map(|a| a.pkey_tbl_len))
            .collect::<std::result::Result<Vec<u16>, i32>>()
            .map_err(|e| errno_error("ibv_query_port", e))?;
        static NEXT_CTX: AtomicU64 = AtomicU64::new(1);
        Ok(HwContext(Arc::new(CtxInner {
            id: NEXT_CTX.fetch_add(1, Ordering::Relaxed),
            raw,
            name: self.name.clone(),
            attr,
            pkey_tbl_len,
            contract: !self.raw,
            next_handle: AtomicU32::new(1),
            ahs: RwLock::new(HashMap::new()),
            mws: RwLock::new(HashMap::new()),
            mrs: RwLock::new(HashMap::new()),
        })))
    }
}

/// The largest `max_inline_data` the device accepts at QP creation. libibverbs reports no
/// such limit (`ibv_device_attr` has none), so it is found once per device and process by
/// creating throw-away QPs (a binary search, about a dozen creations).
fn max_inline_data(raw: &Arc<RawContext>, name: &str, guid: u64) -> u32 {
    static CACHE: OnceLock<Mutex<HashMap<(String, u64), u32>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let key = (name.to_string(), guid);
    if let Some(v) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return *v;
    }
    let found = probe_inline(raw).unwrap_or(0);
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, found);
    found
}

fn probe_inline(raw: &Arc<RawContext>) -> Option<u32> {
    let pd = Arc::new(raw.alloc_pd().ok()?);
    let cq = Arc::new(raw.create_cq(4, None, 0).ok()?);
    let fits = |inline: u32| {
        let cap = crate::ffi::sys::ibv_qp_cap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: inline,
        };
        pd.create_qp(&cq, &cq, None, cap, QpType::Rc as u32, false)
            .is_ok()
    };
    let (mut lo, mut hi) = (0u32, 1u32 << 16);
    if !fits(lo) {
        return None;
    }
    if fits(hi) {
        return Some(hi);
    }
    // Invariant: fits(lo) && !fits(hi).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo)
}

// ---- context ------------------------------------------------------------------------------

struct CtxInner {
    id: u64,
    raw: Arc<RawContext>,
    name: String,
    attr: DeviceAttr,
    /// `pkey_tbl_len` of ports 1..=phys_port_cnt, read at open.
    pkey_tbl_len: Vec<u16>,
    /// Whether the contract-only checks are made (false in raw mode, [`HwProvider::raw`]).
    /// The checks that keep the process memory-safe do not look at it.
    contract: bool,
    next_handle: AtomicU32,
    /// Live address handles by handle number: what a UD work request's `ah` names.
    ahs: RwLock<HashMap<u32, Arc<RawAh>>>,
    /// Live memory windows by handle number: what a BIND_MW work request's `mw` names.
    mws: RwLock<HashMap<u32, Arc<RawMw>>>,
    /// Live MRs' `ibv_mr` addresses by lkey: what a bind's `mr` names. An MR leaves the table
    /// (under its write lock) before it is deregistered.
    mrs: RwLock<HashMap<u32, usize>>,
}

impl CtxInner {
    fn handle(&self) -> u32 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// Contract check (off in raw mode): the port exists.
    fn check_port(&self, port: u8) -> Result<()> {
        if self.contract && (port == 0 || port > self.attr.phys_port_cnt) {
            return Err(Error::invalid(format!(
                "port {port} does not exist ({} has {} port(s), numbered from 1)",
                self.name, self.attr.phys_port_cnt
            )));
        }
        Ok(())
    }
}

/// An open device context (`ibv_context`); cheap to clone. Every object it creates keeps it
/// open; the device is closed when the last context handle and object are gone.
#[derive(Clone)]
pub struct HwContext(Arc<CtxInner>);

impl std::fmt::Debug for HwContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HwContext")
            .field("device", &self.0.name)
            .field("id", &self.0.id)
            .field("raw", &!self.0.contract)
            .finish()
    }
}

impl HwContext {
    /// Whether the context is in raw mode ([`HwProvider::raw`]).
    pub fn is_raw(&self) -> bool {
        !self.0.contract
    }

    fn own_pd<'a>(&self, pd: &'a HwPd) -> Result<&'a HwPd> {
        if pd.0.ctx.id != self.0.id {
            return Err(foreign("PD"));
        }
        Ok(pd)
    }

    fn register(&self, pd: &HwPd, region: Region, access: AccessFlags) -> Result<HwMr> {
        let pd = self.own_pd(pd)?;
        let raw_pd = pd.live()?;
        let len = region.len();
        let raw = raw_pd
            .reg_mr(region, access.bits())
            .map_err(|e| errno_error("ibv_reg_mr", e))?;
        let (lkey, rkey) = raw.keys();
        let addr = raw.region().as_ptr().addr() as u64;
        write(&self.0.mrs).insert(lkey, raw.as_ptr().expose_provenance());
        Ok(HwMr(Arc::new(MrInner {
            ctx: self.0.clone(),
            lkey,
            rkey,
            addr,
            len,
            access,
            raw: RwLock::new(Some(raw)),
        })))
    }

    fn check_mr_len(&self, len: usize) -> Result<()> {
        if len == 0 {
            return Err(Error::invalid("MR length is zero"));
        }
        if u64::try_from(len).map_or(true, |l| l > self.0.attr.max_mr_size) {
            return Err(Error::invalid(format!(
                "MR length {len} above max_mr_size {}",
                self.0.attr.max_mr_size
            )));
        }
        Ok(())
    }
}

impl Context for HwContext {
    type Pd = HwPd;
    type Mr = HwMr;
    type Cq = HwCq;
    type Channel = HwChannel;
    type Srq = HwSrq;
    type Qp = HwQp;
    type Ah = HwAh;
    type Mw = HwMw;

    fn device_name(&self) -> String {
        self.0.name.clone()
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        let a = self
            .0
            .raw
            .query_device()
            .map_err(|e| errno_error("ibv_query_device", e))?;
        let mut attr = convert::device_attr(&a);
        attr.max_inline_data = self.0.attr.max_inline_data;
        Ok(attr)
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        self.0.check_port(port_num)?;
        let a = self
            .0
            .raw
            .query_port(port_num)
            .map_err(|e| errno_error("ibv_query_port", e))?;
        Ok(convert::port_attr(&a))
    }

    fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid> {
        let len = self.query_port(port_num)?.gid_tbl_len;
        if self.0.contract && index >= len {
            return Err(Error::invalid(format!(
                "GID index {index} at or above gid_tbl_len {len}"
            )));
        }
        let index = i32::try_from(index).map_err(|_| Error::invalid("GID index too large"))?;
        self.0
            .raw
            .query_gid(port_num, index)
            .map(Gid)
            .map_err(|e| errno_error("ibv_query_gid", e))
    }

    fn query_pkey(&self, port_num: u8, index: u16) -> Result<u16> {
        self.0.check_port(port_num)?;
        self.0
            .raw
            .query_pkey(port_num, i32::from(index))
            .map_err(|e| errno_error("ibv_query_pkey", e))
    }

    fn alloc_pd(&self) -> Result<HwPd> {
        let raw = self
            .0
            .raw
            .alloc_pd()
            .map_err(|e| errno_error("ibv_alloc_pd", e))?;
        Ok(HwPd(Arc::new(PdInner {
            ctx: self.0.clone(),
            handle: self.0.handle(),
            raw: RwLock::new(Some(Arc::new(raw))),
        })))
    }

    fn alloc_mr(&self, pd: &HwPd, len: usize, access: AccessFlags) -> Result<HwMr> {
        self.own_pd(pd)?.live()?;
        self.check_mr_len(len)?;
        let region = Region::anon(len)
            .map_err(|e| Error::new(ErrorKind::NoMemory, format!("allocating {len} bytes: {e}")))?;
        self.register(pd, region, access)
    }

    fn reg_mr_file(&self, pd: &HwPd, path: &Path, len: usize, access: AccessFlags) -> Result<HwMr> {
        self.own_pd(pd)?.live()?;
        self.check_mr_len(len)?;
        let region = Region::file(path, len)
            .map_err(|e| Error::new(ErrorKind::Io, format!("mapping {}: {e}", path.display())))?;
        self.register(pd, region, access)
    }

    #[allow(unsafe_code)] // implements the trait's `unsafe fn`; the caller's contract passes on
    unsafe fn reg_mr_raw(
        &self,
        pd: &HwPd,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<HwMr> {
        self.own_pd(pd)?.live()?;
        let ptr = NonNull::new(addr).ok_or_else(|| Error::invalid("MR address is null"))?;
        self.check_mr_len(len)?;
        // SAFETY: the caller promises, per `Context::reg_mr_raw`, that the range stays valid
        // for reads and writes while the MR is registered; the region lives no longer.
        let region = unsafe { Region::caller(ptr, len) };
        self.register(pd, region, access)
    }

    fn create_comp_channel(&self) -> Result<HwChannel> {
        let raw = self
            .0
            .raw
            .create_comp_channel()
            .map_err(|e| errno_error("ibv_create_comp_channel", e))?;
        let fd = raw
            .dup_fd()
            .map_err(|e| Error::new(ErrorKind::Io, format!("dup of the channel fd: {e}")))?;
        Ok(HwChannel(Arc::new(ChannelInner {
            ctx: self.0.clone(),
            fd,
            raw: RwLock::new(Some(Arc::new(raw))),
        })))
    }

    fn create_cq(&self, cqe: u32, channel: Option<&HwChannel>) -> Result<HwCq> {
        let ch = match channel {
            Some(ch) if ch.0.ctx.id != self.0.id => return Err(foreign("completion channel")),
            Some(ch) => Some(ch.live()?),
            None => None,
        };
        let cqe_c =
            i32::try_from(cqe).map_err(|_| Error::invalid(format!("cqe {cqe} too large")))?;
        let handle = self.0.handle();
        let raw = self
            .0
            .raw
            .create_cq(cqe_c, ch.as_ref(), handle)
            .map_err(|e| errno_error("ibv_create_cq", e))?;
        Ok(HwCq(Arc::new(CqInner {
            ctx_id: self.0.id,
            contract: self.0.contract,
            handle,
            raw: RwLock::new(Some(Arc::new(raw))),
        })))
    }

    fn create_srq(&self, pd: &HwPd, attr: &SrqAttr) -> Result<HwSrq> {
        let raw_pd = self.own_pd(pd)?.live()?;
        let handle = self.0.handle();
        let raw = raw_pd
            .create_srq(
                ibv_srq_attr {
                    max_wr: attr.max_wr,
                    max_sge: attr.max_sge,
                    srq_limit: attr.srq_limit,
                },
                handle,
            )
            .map_err(|e| errno_error("ibv_create_srq", e))?;
        Ok(HwSrq(Arc::new(SrqInner {
            ctx_id: self.0.id,
            handle,
            raw: RwLock::new(Some(Arc::new(raw))),
        })))
    }

    fn create_qp(
        &self,
        pd: &HwPd,
        send_cq: &HwCq,
        recv_cq: &HwCq,
        srq: Option<&HwSrq>,
        attr: &QpInitAttr,
    ) -> Result<HwQp> {
        let raw_pd = self.own_pd(pd)?.live()?;
        for cq in [send_cq, recv_cq] {
            if cq.0.ctx_id != self.0.id {
                return Err(foreign("CQ"));
            }
        }
        let scq = send_cq.live()?;
        let rcq = recv_cq.live()?;
        let srq = match srq {
            Some(s) if s.0.ctx_id != self.0.id => return Err(foreign("SRQ")),
            Some(s) => Some(s.live()?),
            None => None,
        };
        let (raw, _granted) = raw_pd
            .create_qp(
                &scq,
                &rcq,
                srq.as_ref(),
                convert::cap_to(&attr.cap),
                attr.qp_type as u32,
                attr.sq_sig_all,
            )
            .map_err(|e| errno_error("ibv_create_qp", e))?;
        Ok(HwQp(Arc::new(QpInner {
            ctx: self.0.clone(),
            qpn: raw.qp_num(),
            qp_type: attr.qp_type,
            has_srq: raw.has_srq(),
            state: AtomicU32::new(QpState::Reset as u32),
            raw: RwLock::new(Some(raw)),
        })))
    }

    fn create_ah(&self, pd: &HwPd, attr: &AhAttr) -> Result<HwAh> {
        let raw_pd = self.own_pd(pd)?.live()?;
        let port = attr.port_num.max(1);
        self.0.check_port(port)?;
        if self.0.contract && attr.udp_dport != ROCE_V2_UDP_PORT {
            return Err(Error::invalid(format!(
                "udp_dport {} is not RoCEv2's {ROCE_V2_UDP_PORT}",
                attr.udp_dport
            )));
        }
        let raw_attr = convert::ah_to(&AhAttr {
            port_num: port,
            ..*attr
        });
        // As for a modify with AV: the kernel resolves the destination's Ethernet address and
        // may give up with ETIMEDOUT under a slow VM; nothing was created, so try again.
        let mut tries = 3;
        let raw = loop {
            tries -= 1;
            match raw_pd.create_ah(raw_attr) {
                Ok(raw) => break raw,
                Err(libc::ETIMEDOUT) if tries > 0 => continue,
                Err(e) => return Err(errno_error("ibv_create_ah", e)),
            }
        };
        let handle = self.0.handle();
        write(&self.0.ahs).insert(handle, Arc::new(raw));
        Ok(HwAh(Arc::new(AhInner {
            ctx: self.0.clone(),
            handle,
        })))
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        loop {
            match self.0.raw.get_async_event() {
                Ok(Some(raw)) => {
                    if let Some(ev) = convert::async_event(&raw) {
                        return Some(ev);
                    }
                }
                Ok(None) | Err(_) => return None,
            }
        }
    }

    fn alloc_mw(&self, pd: &HwPd, mw_type: MwType) -> Result<HwMw> {
        let pd = self.own_pd(pd)?;
        let raw_pd = pd.live()?;
        let raw = raw_pd
            .alloc_mw(mw_type.raw())
            .map_err(|e| errno_error("ibv_alloc_mw", e))?;
        let handle = self.0.handle();
        write(&self.0.mws).insert(handle, Arc::new(raw));
        Ok(HwMw(Arc::new(MwInner {
            ctx: self.0.clone(),
            handle,
            mw_type,
            _pd: raw_pd,
        })))
    }

    fn bind_mw(&self, qp: &HwQp, mw: &HwMw, bind: &MwBind) -> Result<u32> {
        if qp.0.ctx.id != self.0.id || mw.0.ctx.id != self.0.id {
            return Err(foreign("QP or MW"));
        }
        let guard = read(&qp.0.raw);
        let raw_qp = guard.as_ref().ok_or_else(|| destroyed("QP"))?;
        let raw_mw = mw.live()?;
        // The read lock keeps the MR registered across the bind.
        let mrs = read(&self.0.mrs);
        // An unbind (length 0) may name no MR; rdma-core then wants NULL.
        let mr = match mr_ptr(&mrs, bind.mr) {
            Some(p) => p,
            None if bind.length == 0 => std::ptr::null_mut(),
            None => return Err(Error::invalid("no such MR (bind.mr)")),
        };
        let raw_bind = ibv_mw_bind {
            wr_id: bind.wr_id,
            send_flags: bind.flags.bits(),
            bind_info: ibv_mw_bind_info {
                mr,
                addr: bind.addr,
                length: bind.length,
                mw_access_flags: bind.access.bits(),
            },
        };
        raw_qp
            .bind_mw(&raw_mw, &raw_bind)
            .map_err(|e| errno_error("ibv_bind_mw", e))
    }
}

// ---- AH -----------------------------------------------------------------------------------

struct AhInner {
    ctx: Arc<CtxInner>,
    handle: u32,
}

impl Drop for AhInner {
    fn drop(&mut self) {
        // The context's table holds the AH; dropping it there destroys it.
        write(&self.ctx.ahs).remove(&self.handle);
    }
}

/// An address handle (`ibv_ah`); cheap to clone. UD work requests name it by
/// [`AddressHandle::handle`], resolved in its context's table at post time.
#[derive(Clone)]
pub struct HwAh(Arc<AhInner>);

impl std::fmt::Debug for HwAh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HwAh({})", self.0.handle)
    }
}

impl AddressHandle for HwAh {
    fn handle(&self) -> u32 {
        self.0.handle
    }

    fn destroy(&self) -> Result<()> {
        let mut table = write(&self.0.ctx.ahs);
        let raw = table
            .remove(&self.0.handle)
            .ok_or_else(|| destroyed("AH"))?;
        match Arc::try_unwrap(raw) {
            Ok(raw) => raw.destroy().map_err(|(raw, e)| {
                table.insert(self.0.handle, Arc::new(raw));
                errno_error("ibv_destroy_ah", e)
            }),
            Err(raw) => {
                table.insert(self.0.handle, raw);
                Err(Error::busy("the AH is in use"))
            }
        }
    }
}

// ---- PD and MR ----------------------------------------------------------------------------

struct PdInner {
    ctx: Arc<CtxInner>,
    handle: u32,
    raw: RwLock<Option<Arc<RawPd>>>,
}

/// A protection domain (`ibv_pd`); cheap to clone.
#[derive(Clone)]
pub struct HwPd(Arc<PdInner>);

impl std::fmt::Debug for HwPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HwPd({})", self.0.handle)
    }
}

impl HwPd {
    fn live(&self) -> Result<Arc<RawPd>> {
        read(&self.0.raw).clone().ok_or_else(|| destroyed("PD"))
    }
}

/// Destroys the object in `slot` if nobody else holds it: `Busy` (naming `users`) otherwise.
fn destroy_shared<T>(
    slot: &RwLock<Option<Arc<T>>>,
    what: &str,
    users: &str,
    destroy: impl FnOnce(T) -> std::result::Result<(), (T, i32)>,
    call: &str,
) -> Result<()> {
    let mut guard = write(slot);
    let Some(arc) = guard.take() else {
        return Err(destroyed(what));
    };
    match Arc::try_unwrap(arc) {
        Ok(raw) => match destroy(raw) {
            Ok(()) => Ok(()),
            Err((raw, e)) => {
                *guard = Some(Arc::new(raw));
                Err(errno_error(call, e))
            }
        },
        Err(arc) => {
            let n = Arc::strong_count(&arc) - 1;
            *guard = Some(arc);
            Err(Error::busy(format!("the {what} is in use by {n} {users}")))
        }
    }
}

impl ProtectionDomain for HwPd {
    fn handle(&self) -> u32 {
        self.0.handle
    }

    fn destroy(&self) -> Result<()> {
        destroy_shared(
            &self.0.raw,
            "PD",
            "MR(s), QP(s), SRQ(s) or AH(s)",
            RawPd::destroy,
            "ibv_dealloc_pd",
        )
    }
}

struct MrInner {
    ctx: Arc<CtxInner>,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: usize,
    access: AccessFlags,
    raw: RwLock<Option<RawMr>>,
}

/// A registered memory region (`ibv_mr`) with its memory; cheap to clone.
#[derive(Clone)]
pub struct HwMr(Arc<MrInner>);

impl std::fmt::Debug for HwMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HwMr(lkey {:#x}, rkey {:#x}, {} bytes at {:#x})",
            self.0.lkey, self.0.rkey, self.0.len, self.0.addr
        )
    }
}

impl MemoryRegion for HwMr {
    fn lkey(&self) -> u32 {
        self.0.lkey
    }

    fn rkey(&self) -> u32 {
        self.0.rkey
    }

    fn addr(&self) -> u64 {
        self.0.addr
    }

    fn len(&self) -> usize {
        self.0.len
    }

    fn access(&self) -> AccessFlags {
        self.0.access
    }

    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let guard = read(&self.0.raw);
        let mr = guard.as_ref().ok_or_else(|| destroyed("MR"))?;
        if mr.region().read(offset, buf).is_err() {
            return Err(Error::invalid(format!(
                "read {offset}+{} outside MR of {} bytes",
                buf.len(),
                self.0.len
            )));
        }
        Ok(())
    }

    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let guard = read(&self.0.raw);
        let mr = guard.as_ref().ok_or_else(|| destroyed("MR"))?;
        if mr.region().write(offset, data).is_err() {
            return Err(Error::invalid(format!(
                "write {offset}+{} outside MR of {} bytes",
                data.len(),
                self.0.len
            )));
        }
        Ok(())
    }

    fn destroy(&self) -> Result<()> {
        let mut guard = write(&self.0.raw);
        let raw = guard.take().ok_or_else(|| destroyed("MR"))?;
        let mut table = write(&self.0.ctx.mrs);
        let entry = table.remove(&self.0.lkey);
        raw.destroy().map_err(|(raw, e)| {
            if let Some(p) = entry {
                table.insert(self.0.lkey, p);
            }
            *guard = Some(raw);
            errno_error("ibv_dereg_mr", e)
        })
    }
}

impl Drop for MrInner {
    fn drop(&mut self) {
        // The last handle: the registration goes with `raw` right after this.
        if read(&self.raw).is_some() {
            write(&self.ctx.mrs).remove(&self.lkey);
        }
    }
}

// ---- MW -----------------------------------------------------------------------------------

struct MwInner {
    ctx: Arc<CtxInner>,
    handle: u32,
    mw_type: MwType,
    /// Keeps the PD's `Arc` count up (its `destroy` is `Busy`) while the window lives.
    _pd: Arc<RawPd>,
}

impl Drop for MwInner {
    fn drop(&mut self) {
        // The context's table holds the window; dropping it there deallocates it.
        write(&self.ctx.mws).remove(&self.handle);
    }
}

/// A memory window (`ibv_mw`); cheap to clone. BIND_MW work requests name it by
/// [`MemoryWindow::handle`], resolved in its context's table at post time.
#[derive(Clone)]
pub struct HwMw(Arc<MwInner>);

impl std::fmt::Debug for HwMw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HwMw({}, {:?})", self.0.handle, self.0.mw_type)
    }
}

impl HwMw {
    fn live(&self) -> Result<Arc<RawMw>> {
        read(&self.0.ctx.mws)
            .get(&self.0.handle)
            .cloned()
            .ok_or_else(|| destroyed("MW"))
    }
}

impl MemoryWindow for HwMw {
    fn handle(&self) -> u32 {
        self.0.handle
    }

    fn mw_type(&self) -> MwType {
        self.0.mw_type
    }

    fn rkey(&self) -> u32 {
        self.live().map_or(0, |mw| mw.rkey())
    }

    fn destroy(&self) -> Result<()> {
        let mut table = write(&self.0.ctx.mws);
        let raw = table
            .remove(&self.0.handle)
            .ok_or_else(|| destroyed("MW"))?;
        match Arc::try_unwrap(raw) {
            Ok(raw) => raw.destroy().map_err(|(raw, e)| {
                table.insert(self.0.handle, Arc::new(raw));
                errno_error("ibv_dealloc_mw", e)
            }),
            Err(raw) => {
                table.insert(self.0.handle, raw);
                Err(Error::busy("the MW is in use"))
            }
        }
    }
}

/// The `ibv_mr` of live MR `lkey` in `mrs`, if any.
fn mr_ptr(mrs: &HashMap<u32, usize>, lkey: u32) -> Option<*mut ibv_mr> {
    mrs.get(&lkey)
        .map(|p| std::ptr::with_exposed_provenance_mut(*p))
}

/// After BIND_MW requests were posted: each window's `ibv_mw.rkey` takes the key its bind named
/// (the contract of [`MemoryWindow::rkey`]; rxe names a window by it in the next bind).
fn record_bound_keys(mws: &HashMap<u32, Arc<RawMw>>, posted: &[SendWr<'_>]) {
    for w in posted {
        if let verbs_api::SendOp::BindMw { mw, rkey, .. } = w.op {
            if let Some(m) = mws.get(&mw) {
                m.set_rkey(rkey);
            }
        }
    }
}

/// The `ibv_mw` of live window `handle` in `mws`, if any.
fn mw_ptr(mws: &HashMap<u32, Arc<RawMw>>, handle: u32) -> Option<*mut ibv_mw> {
    mws.get(&handle).map(|m| m.as_ptr())
}

// ---- completion channel and CQ -----------------------------------------------------------

struct ChannelInner {
    ctx: Arc<CtxInner>,
    /// A duplicate of the channel fd (same open file), valid for the handle's whole life.
    fd: OwnedFd,
    raw: RwLock<Option<Arc<RawChannel>>>,
}

/// A completion channel (`ibv_comp_channel`): its fd becomes readable when an armed CQ gets a
/// completion; cheap to clone.
#[derive(Clone)]
pub struct HwChannel(Arc<ChannelInner>);

impl std::fmt::Debug for HwChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HwChannel(fd {})", self.0.fd.as_raw_fd())
    }
}

impl HwChannel {
    fn live(&self) -> Result<Arc<RawChannel>> {
        read(&self.0.raw)
            .clone()
            .ok_or_else(|| destroyed("completion channel"))
    }
}

impl AsFd for HwChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.fd.as_fd()
    }
}

impl AsRawFd for HwChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd.as_raw_fd()
    }
}

impl CompletionChannel for HwChannel {
    fn get_cq_event(&self) -> Result<Option<u32>> {
        let guard = read(&self.0.raw);
        let ch = guard
            .as_ref()
            .ok_or_else(|| destroyed("completion channel"))?;
        ch.get_cq_event()
            .map_err(|e| errno_error("ibv_get_cq_event", e))
    }

    fn wait_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(h) = self.get_cq_event()? {
                return Ok(Some(h));
            }
            let left = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(None);
                    }
                    Some(d - now)
                }
            };
            let ready = wait_readable(self.0.fd.as_fd(), left)
                .map_err(|e| Error::new(ErrorKind::Io, format!("poll(2): {e}")))?;
            if !ready && left.is_some() {
                return self.get_cq_event();
            }
        }
    }

    fn destroy(&self) -> Result<()> {
        destroy_shared(
            &self.0.raw,
            "completion channel",
            "CQ(s)",
            RawChannel::destroy,
            "ibv_destroy_comp_channel",
        )
    }
}

struct CqInner {
    ctx_id: u64,
    /// [`CtxInner::contract`] of the context that created it.
    contract: bool,
    handle: u32,
    raw: RwLock<Option<Arc<RawCq>>>,
}

/// A completion queue (`ibv_cq`); cheap to clone.
#[derive(Clone)]
pub struct HwCq(Arc<CqInner>);

impl std::fmt::Debug for HwCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HwCq({})", self.0.handle)
    }
}

impl HwCq {
    fn live(&self) -> Result<Arc<RawCq>> {
        read(&self.0.raw).clone().ok_or_else(|| destroyed("CQ"))
    }
}

impl CompletionQueue for HwCq {
    fn handle(&self) -> u32 {
        self.0.handle
    }

    fn capacity(&self) -> u32 {
        read(&self.0.raw).as_ref().map_or(0, |cq| cq.cqe())
    }

    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let guard = read(&self.0.raw);
        let cq = guard.as_ref().ok_or_else(|| destroyed("CQ"))?;
        let mut buf = [ibv_wc::default(); 32];
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(buf.len());
            let n = cq
                .poll(&mut buf[..want])
                .map_err(|e| errno_error("ibv_poll_cq", e))?;
            for (dst, src) in out[done..done + n].iter_mut().zip(&buf[..n]) {
                *dst = convert::wc(src);
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    /// Contract check (off in raw mode): the CQ has a channel to notify.
    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let guard = read(&self.0.raw);
        let cq = guard.as_ref().ok_or_else(|| destroyed("CQ"))?;
        if self.0.contract && !cq.has_channel() {
            return Err(Error::state(
                "the CQ has no completion channel to notify (created without one)",
            ));
        }
        cq.req_notify(solicited_only)
            .map_err(|e| errno_error("ibv_req_notify_cq", e))
    }

    fn ack_events(&self, n: u32) {
        if let Some(cq) = read(&self.0.raw).as_ref() {
            cq.ack(n);
        }
    }

    fn resize(&self, cqe: u32) -> Result<()> {
        // The write lock keeps polls and `capacity` out while the provider swaps the queue.
        let guard = write(&self.0.raw);
        let cq = guard.as_ref().ok_or_else(|| destroyed("CQ"))?;
        let cqe = i32::try_from(cqe).map_err(|_| Error::invalid(format!("cqe {cqe} too large")))?;
        cq.resize(cqe).map_err(|e| errno_error("ibv_resize_cq", e))
    }

    fn destroy(&self) -> Result<()> {
        {
            let guard = read(&self.0.raw);
            let cq = guard.as_ref().ok_or_else(|| destroyed("CQ"))?;
            // Made in raw mode too: libibverbs' `ibv_destroy_cq` would wait for the
            // acknowledgements forever, with this handle's lock held.
            let unacked = cq.unacked();
            if unacked > 0 {
                return Err(Error::busy(format!(
                    "the CQ has {unacked} unacknowledged completion event(s)"
                )));
            }
        }
        destroy_shared(&self.0.raw, "CQ", "QP(s)", RawCq::destroy, "ibv_destroy_cq")
    }
}

// ---- SRQ ----------------------------------------------------------------------------------

struct SrqInner {
    ctx_id: u64,
    handle: u32,
    raw: RwLock<Option<Arc<RawSrq>>>,
}

/// A shared receive queue (`ibv_srq`); cheap to clone.
#[derive(Clone)]
pub struct HwSrq(Arc<SrqInner>);

impl std::fmt::Debug for HwSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HwSrq({})", self.0.handle)
    }
}

impl HwSrq {
    fn live(&self) -> Result<Arc<RawSrq>> {
        read(&self.0.raw).clone().ok_or_else(|| destroyed("SRQ"))
    }
}

fn post_error(call: &str, (index, errno): (usize, i32)) -> PostError {
    PostError::new(index, errno_error(call, errno))
}

impl SharedReceiveQueue for HwSrq {
    fn handle(&self) -> u32 {
        self.0.handle
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let guard = read(&self.0.raw);
        let srq = guard
            .as_ref()
            .ok_or_else(|| PostError::new(0, destroyed("SRQ")))?;
        srq.post_recv(wrs)
            .map_err(|e| post_error("ibv_post_srq_recv", e))
    }

    fn query(&self) -> Result<SrqAttr> {
        let guard = read(&self.0.raw);
        let srq = guard.as_ref().ok_or_else(|| destroyed("SRQ"))?;
        let a = srq.query().map_err(|e| errno_error("ibv_query_srq", e))?;
        Ok(SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        })
    }

    fn arm_limit(&self, srq_limit: u32) -> Result<()> {
        let guard = read(&self.0.raw);
        let srq = guard.as_ref().ok_or_else(|| destroyed("SRQ"))?;
        srq.arm_limit(srq_limit)
            .map_err(|e| errno_error("ibv_modify_srq", e))
    }

    fn destroy(&self) -> Result<()> {
        destroy_shared(
            &self.0.raw,
            "SRQ",
            "QP(s)",
            RawSrq::destroy,
            "ibv_destroy_srq",
        )
    }
}

// ---- QP -----------------------------------------------------------------------------------

struct QpInner {
    ctx: Arc<CtxInner>,
    qpn: u32,
    qp_type: QpType,
    has_srq: bool,
    /// The state the last successful `modify` set (asynchronous moves to ERR are not seen; the
    /// checks that use it confirm with `ibv_query_qp`).
    state: AtomicU32,
    raw: RwLock<Option<RawQp>>,
}

/// A queue pair (`ibv_qp`); cheap to clone.
#[derive(Clone)]
pub struct HwQp(Arc<QpInner>);

impl std::fmt::Debug for HwQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HwQp({:#x})", self.0.qpn)
    }
}

/// Every mask bit libibverbs defines for `ibv_modify_qp` (STATE … DEST_QPN, RATE_LIMIT).
const KNOWN_MASK: u32 = ((1 << 21) - 1) | QpAttrMask::RATE_LIMIT.bits();

/// The checks of device limits that rxe does not make: `max_dest_rd_atomic` above
/// `max_qp_rd_atom` and a P_Key index beyond the port's table are accepted by rxe (found by the
/// differential run), `max_rd_atomic` above `max_qp_init_rd_atom` is checked here too.
fn check_limits(ctx: &CtxInner, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
    let d = &ctx.attr;
    if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC)
        && u32::from(attr.max_dest_rd_atomic) > d.max_qp_rd_atom
    {
        return Err(Error::invalid(format!(
            "max_dest_rd_atomic {} above the device's max_qp_rd_atom {}",
            attr.max_dest_rd_atomic, d.max_qp_rd_atom
        )));
    }
    if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC)
        && u32::from(attr.max_rd_atomic) > d.max_qp_init_rd_atom
    {
        return Err(Error::invalid(format!(
            "max_rd_atomic {} above the device's max_qp_init_rd_atom {}",
            attr.max_rd_atomic, d.max_qp_init_rd_atom
        )));
    }
    if mask.contains(QpAttrMask::PKEY_INDEX) {
        let port = if mask.contains(QpAttrMask::PORT) {
            attr.port_num
        } else {
            1
        };
        let len = usize::from(port)
            .checked_sub(1)
            .and_then(|i| ctx.pkey_tbl_len.get(i))
            .copied();
        if let Some(len) = len
            && attr.pkey_index >= len
        {
            return Err(Error::invalid(format!(
                "pkey_index {} at or above port {port}'s pkey_tbl_len {len}",
                attr.pkey_index
            )));
        }
    }
    Ok(())
}

/// The range checks of the `verbs_api` contract that the kernel does not make (it masks PSNs
/// and QPNs to 24 bits and retry counts to 3 bits instead of failing).
fn check_values(attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
    let bad = |what: &str, v: u64, max: u64| -> Result<()> {
        if v > max {
            Err(Error::invalid(format!("{what} {v} above {max}")))
        } else {
            Ok(())
        }
    };
    let m = |bit| mask.contains(bit);
    if m(QpAttrMask::RETRY_CNT) {
        bad("retry_cnt", attr.retry_cnt.into(), 7)?;
    }
    if m(QpAttrMask::RNR_RETRY) {
        bad("rnr_retry", attr.rnr_retry.into(), 7)?;
    }
    if m(QpAttrMask::TIMEOUT) {
        bad("timeout", attr.timeout.into(), 31)?;
    }
    if m(QpAttrMask::MIN_RNR_TIMER) {
        bad("min_rnr_timer", attr.min_rnr_timer.into(), 31)?;
    }
    let max24 = u64::from(MAX_24BIT);
    if m(QpAttrMask::RQ_PSN) {
        bad("rq_psn", attr.rq_psn.into(), max24)?;
    }
    if m(QpAttrMask::SQ_PSN) {
        bad("sq_psn", attr.sq_psn.into(), max24)?;
    }
    if m(QpAttrMask::DEST_QPN) {
        bad("dest_qp_num", attr.dest_qp_num.into(), max24)?;
    }
    if m(QpAttrMask::AV) && attr.ah_attr.udp_dport != ROCE_V2_UDP_PORT {
        return Err(Error::invalid(format!(
            "UDP port {} in the address vector: RoCEv2 hardware always uses {ROCE_V2_UDP_PORT}",
            attr.ah_attr.udp_dport
        )));
    }
    Ok(())
}

/// The softverbs `RECOVERY` extension (not a libibverbs bit): hardware does IBTA loss recovery
/// only, so selective repeat is refused in every mode and the bit never reaches libibverbs.
fn recovery_mask(attr: &QpAttr, mask: QpAttrMask) -> Result<QpAttrMask> {
    if !mask.contains(QpAttrMask::RECOVERY) {
        return Ok(mask);
    }
    if attr.recovery != Recovery::Ibta {
        return Err(Error::unsupported(
            "selective repeat (QpAttr::recovery) is a softverbs extension; RDMA hardware \
             recovers by IBTA go-back-N only",
        ));
    }
    Ok(mask - QpAttrMask::RECOVERY)
}

/// The contract checks of `modify` (off in raw mode): defined mask bits, value ranges, device
/// limits.
fn check_modify(ctx: &CtxInner, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
    let unknown = mask.bits() & !KNOWN_MASK;
    if unknown != 0 {
        return Err(Error::unsupported(format!(
            "attribute mask bits {unknown:#x} are not defined by libibverbs"
        )));
    }
    check_values(attr, mask)?;
    check_limits(ctx, attr, mask)
}

impl HwQp {
    /// The QP's state now, from `ibv_query_qp` (used on the rare paths that reject a post).
    fn queried_state(&self, qp: &RawQp) -> Result<QpState> {
        let (a, _) = qp.query().map_err(|e| errno_error("ibv_query_qp", e))?;
        let s = convert::qp_state(a.qp_state);
        self.0.state.store(s as u32, Ordering::Relaxed);
        Ok(s)
    }

    fn tracked_state(&self) -> QpState {
        convert::qp_state(self.0.state.load(Ordering::Relaxed))
    }
}

impl QueuePair for HwQp {
    fn qp_num(&self) -> u32 {
        self.0.qpn
    }

    fn qp_type(&self) -> QpType {
        self.0.qp_type
    }

    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let guard = read(&self.0.raw);
        let qp = guard.as_ref().ok_or_else(|| destroyed("QP"))?;
        let mask = recovery_mask(attr, mask)?;
        if self.0.ctx.contract {
            check_modify(&self.0.ctx, attr, mask)?;
        }
        let raw_attr = convert::qp_attr_to(attr);
        // With AV, the kernel resolves the destination's Ethernet address and gives up with
        // ETIMEDOUT after a second (seen under a slow VM); a failed modify changes nothing, so
        // it is simply tried again.
        let mut tries = if mask.contains(QpAttrMask::AV) { 3 } else { 1 };
        loop {
            tries -= 1;
            match qp.modify(&raw_attr, mask.bits()) {
                Ok(()) => break,
                Err(libc::ETIMEDOUT) if tries > 0 => continue,
                Err(e) => return Err(errno_error("ibv_modify_qp", e)),
            }
        }
        if mask.contains(QpAttrMask::STATE) {
            self.0.state.store(attr.qp_state as u32, Ordering::Relaxed);
        }
        Ok(())
    }

    fn query(&self) -> Result<QpAttr> {
        let guard = read(&self.0.raw);
        let qp = guard.as_ref().ok_or_else(|| destroyed("QP"))?;
        let (a, init) = qp.query().map_err(|e| errno_error("ibv_query_qp", e))?;
        Ok(convert::qp_attr_from(&a, &init.cap))
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let guard = read(&self.0.raw);
        let qp = guard
            .as_ref()
            .ok_or_else(|| PostError::new(0, destroyed("QP")))?;
        if self.0.ctx.contract
            && matches!(
                self.tracked_state(),
                QpState::Reset | QpState::Init | QpState::Rtr
            )
        {
            // rxe queues the WRs and only its doorbell fails, so the check is made here (a
            // contract check: in raw mode the WRs go to the provider).
            let now = self.queried_state(qp).map_err(|e| PostError::new(0, e))?;
            if matches!(now, QpState::Reset | QpState::Init | QpState::Rtr) {
                return Err(PostError::new(
                    0,
                    Error::state(format!("post_send in {now}: allowed in RTS, SQD and ERR")),
                ));
            }
        }
        if self.0.qp_type == QpType::Ud {
            // A UD WR without an AH would hand the provider a null `ibv_ah` (memory safety:
            // made in raw mode too).
            if let Some(i) = wrs.iter().position(|w| w.ud.is_none()) {
                return Err(PostError::new(
                    i,
                    Error::invalid("a UD send needs an AH, remote QPN and Q_Key"),
                ));
            }
        }
        // The read locks keep every AH, window and MR named by the chain alive across the post.
        let ahs = read(&self.0.ctx.ahs);
        let mws = read(&self.0.ctx.mws);
        let mrs = read(&self.0.ctx.mrs);
        let objs = WrObjects {
            ah: &|h| ahs.get(&h).map(|a| a.as_ptr()),
            mw: &|h| mw_ptr(&mws, h),
            mr: &|k| mr_ptr(&mrs, k),
        };
        let posted = qp.post_send(wrs, &objs);
        let n = posted.map_or_else(|(i, _)| i, |()| wrs.len());
        record_bound_keys(&mws, &wrs[..n]);
        posted.map_err(|e| post_error("ibv_post_send", e))
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let guard = read(&self.0.raw);
        let qp = guard
            .as_ref()
            .ok_or_else(|| PostError::new(0, destroyed("QP")))?;
        if self.0.has_srq {
            // Made in raw mode too: such a QP has no receive queue of its own, and whether a
            // provider checks that before writing a WQE is not part of libibverbs' contract.
            return Err(PostError::new(
                0,
                Error::state("post_recv on a QP that receives through an SRQ"),
            ));
        }
        if self.0.ctx.contract && self.tracked_state() == QpState::Reset {
            return Err(PostError::new(0, Error::state("post_recv in RESET")));
        }
        qp.post_recv(wrs)
            .map_err(|e| post_error("ibv_post_recv", e))
    }

    fn endpoint(&self, psn: u32) -> Result<Endpoint> {
        if psn > MAX_24BIT {
            return Err(Error::invalid(format!("PSN {psn:#x} is not 24-bit")));
        }
        if read(&self.0.raw).is_none() {
            return Err(destroyed("QP"));
        }
        let gid = HwContext(self.0.ctx.clone()).query_gid(1, 0)?;
        Ok(Endpoint {
            qpn: self.0.qpn,
            psn,
            gid,
            udp_port: ROCE_V2_UDP_PORT,
        })
    }

    fn destroy(&self) -> Result<()> {
        let mut guard = write(&self.0.raw);
        let raw = guard.take().ok_or_else(|| destroyed("QP"))?;
        raw.destroy().map_err(|(raw, e)| {
            *guard = Some(raw);
            errno_error("ibv_destroy_qp", e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selective_repeat_is_refused_and_the_bit_never_reaches_libibverbs() {
        let mut a = QpAttr::default();
        let m = QpAttrMask::STATE | QpAttrMask::RECOVERY;
        assert_eq!(recovery_mask(&a, m).ok(), Some(QpAttrMask::STATE));
        a.recovery = Recovery::SelectiveRepeat;
        assert_eq!(
            recovery_mask(&a, m).map_err(|e| e.kind),
            Err(ErrorKind::NotSupported)
        );
        assert_eq!(
            recovery_mask(&a, QpAttrMask::STATE).ok(),
            Some(QpAttrMask::STATE)
        );
    }

    #[test]
    fn value_checks_follow_the_mask() {
        let mut a = QpAttr {
            retry_cnt: 8,
            ..QpAttr::default()
        };
        assert!(check_values(&a, QpAttrMask::STATE).is_ok());
        assert_eq!(
            check_values(&a, QpAttrMask::RETRY_CNT).map_err(|e| e.kind),
            Err(ErrorKind::InvalidArgument)
        );
        a.retry_cnt = 7;
        a.sq_psn = MAX_24BIT + 1;
        assert!(check_values(&a, QpAttrMask::RETRY_CNT).is_ok());
        assert!(check_values(&a, QpAttrMask::SQ_PSN).is_err());
        a.ah_attr.udp_dport = 5000;
        assert!(check_values(&a, QpAttrMask::AV).is_err());
    }

    #[test]
    fn raw_mode_is_passed_from_provider_to_devices() {
        let (Ok(checked), Ok(raw)) = (HwProvider::new(), HwProvider::raw()) else {
            return; // no libibverbs on this machine
        };
        assert!(!checked.is_raw());
        assert!(raw.is_raw());
        assert!(raw.devices().unwrap_or_default().iter().all(|d| d.raw));
        assert!(checked.devices().unwrap_or_default().iter().all(|d| !d.raw));
    }

    #[test]
    fn provider_without_devices_or_library_never_panics() {
        match HwProvider::new() {
            Ok(p) => {
                let _ = p.devices();
            }
            Err(e) => assert_eq!(e.kind, ErrorKind::NotFound),
        }
    }
}
