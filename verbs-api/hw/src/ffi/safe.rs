//! Safe owners of libibverbs objects: each `Raw*` value owns one C object, keeps its parents
//! alive through `Arc`s (a QP its PD, CQs and SRQ; an MR its PD and memory; everything its
//! context), frees it on drop, and offers the verbs on it as safe methods that return the
//! positive errno of a failure.
//!
//! Invariants that make the methods sound:
//! * the pointer of a `Raw*` value is the non-null object libibverbs returned and stays valid
//!   until the value's `destroy` succeeded or it is dropped; both need ownership, so no method
//!   call can overlap them (callers share values through `&` or `Arc` only);
//! * a parent outlives its children (children hold `Arc`s to their parents);
//! * every struct handed to libibverbs is a `#[repr(C)]` mirror of the header's
//!   ([`super::sys`], layout-tested) and lives across the call;
//! * libibverbs' verbs are thread-safe (rdma-core documents every verb as callable from any
//!   thread), which is what the `Send`/`Sync` impls rely on.

use std::ffi::{CStr, c_int, c_void};
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use verbs_api::{RecvWr, SendFlags, SendOp, SendWr};

use super::loader::Verbs;
use super::sys::*;
use mr_region::Region;

const EINVAL: i32 = libc::EINVAL;
const EBUSY: i32 = libc::EBUSY;
const EOPNOTSUPP: i32 = libc::EOPNOTSUPP;

/// The errno of the last failed libc/libibverbs call on this thread (EIO if none is set).
fn last_errno() -> i32 {
    match io::Error::last_os_error().raw_os_error() {
        Some(0) | None => libc::EIO,
        Some(e) => e,
    }
}

/// The errno a verb that "returns 0 or an errno value" reported: positive values are the
/// errno, negative ones (some providers return -1 or -errno) fall back to `errno`/`-rc`.
fn rc_errno(rc: c_int) -> i32 {
    if rc > 0 {
        rc
    } else if rc == -1 {
        last_errno()
    } else {
        rc.saturating_neg()
    }
}

/// Declares `Send` and `Sync` for a `Raw*` owner (see the module's invariants).
macro_rules! thread_safe {
    ($($t:ty),*) => {$(
        // SAFETY: the value owns a libibverbs object whose verbs are thread-safe, and it is
        // freed only through ownership (drop or `destroy(self)`), never while shared.
        unsafe impl Send for $t {}
        // SAFETY: as for Send; `&self` methods only call thread-safe verbs or read fields that
        // libibverbs sets once at creation.
        unsafe impl Sync for $t {}
    )*};
}

thread_safe!(
    DeviceList, RawContext, RawPd, RawMr, RawChannel, RawCq, RawSrq, RawQp, RawAh, RawMw
);

// ---- devices ----------------------------------------------------------------------------

/// The array `ibv_get_device_list` returned, freed on drop. Device pointers stay valid while
/// it lives; contexts opened from them keep their own reference (rdma-core refcounts devices).
pub(crate) struct DeviceList {
    verbs: &'static Verbs,
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    /// The current device list; `Ok(None)` when the kernel has no RDMA support (`ENOSYS`).
    pub(crate) fn get(verbs: &'static Verbs) -> Result<Option<DeviceList>, i32> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer for the count.
        let list = unsafe { (verbs.get_device_list)(&mut n) };
        match NonNull::new(list) {
            Some(list) => Ok(Some(DeviceList {
                verbs,
                list,
                len: usize::try_from(n).unwrap_or(0),
            })),
            None => match last_errno() {
                libc::ENOSYS => Ok(None),
                e => Err(e),
            },
        }
    }

    /// Number of devices.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn device(&self, index: usize) -> Option<*mut ibv_device> {
        if index >= self.len {
            return None;
        }
        // SAFETY: the array holds `len` device pointers (then a NULL) while the list lives.
        let dev = unsafe { *self.list.as_ptr().add(index) };
        (!dev.is_null()).then_some(dev)
    }

    /// The kernel name of device `index` (`ibv_get_device_name`), e.g. `rxe0`.
    pub(crate) fn name(&self, index: usize) -> Option<String> {
        let dev = self.device(index)?;
        // SAFETY: `dev` is a live device of the list; the returned string is NUL-terminated
        // and lives inside the device struct, which outlives this copy.
        let name = unsafe { (self.verbs.get_device_name)(dev) };
        if name.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated (see above).
        Some(
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// The node GUID of device `index` in host order (`ibv_get_device_guid` is big-endian).
    pub(crate) fn guid(&self, index: usize) -> Option<u64> {
        let dev = self.device(index)?;
        // SAFETY: `dev` is a live device of the list.
        Some(u64::from_be(unsafe { (self.verbs.get_device_guid)(dev) }))
    }

    /// Opens device `index` (`ibv_open_device`).
    pub(crate) fn open(self: &Arc<Self>, index: usize) -> Result<RawContext, i32> {
        let dev = self.device(index).ok_or(libc::ENODEV)?;
        // SAFETY: `dev` is a live device of the list.
        let ctx = unsafe { (self.verbs.open_device)(dev) };
        let ptr = NonNull::new(ctx).ok_or_else(last_errno)?;
        Ok(RawContext {
            verbs: self.verbs,
            ptr,
            _list: self.clone(),
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed exactly once.
        unsafe { (self.verbs.free_device_list)(self.list.as_ptr()) }
    }
}

// ---- context ----------------------------------------------------------------------------

/// An open device context (`ibv_context`), closed on drop.
pub(crate) struct RawContext {
    verbs: &'static Verbs,
    ptr: NonNull<ibv_context>,
    _list: Arc<DeviceList>,
}

/// The object an asynchronous event names, decoded while the event is held.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum RawElement {
    /// A CQ: the handle this backend stored in `cq_context`.
    Cq(u32),
    /// A QP, by number.
    Qp(u32),
    /// An SRQ: the handle stored in `srq_context`.
    Srq(u32),
    /// A port.
    Port(u8),
    /// The device (or an object this backend does not create, such as a WQ).
    Device,
}

/// One asynchronous event, already acknowledged.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawEvent {
    /// `ibv_event_type`.
    pub(crate) kind: u32,
    /// What it is about.
    pub(crate) element: RawElement,
}

impl RawContext {
    fn ctx(&self) -> *mut ibv_context {
        self.ptr.as_ptr()
    }

    /// `ibv_query_device`.
    pub(crate) fn query_device(&self) -> Result<ibv_device_attr, i32> {
        // SAFETY: all-zero bytes are a valid ibv_device_attr (integers and a char array).
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context; `attr` is a writable ibv_device_attr.
        let rc = unsafe { (self.verbs.query_device)(self.ctx(), &mut attr) };
        if rc != 0 {
            return Err(rc_errno(rc));
        }
        Ok(attr)
    }

    /// `ibv_query_port` (the exported `IBVERBS_1.1` entry point, which fills the compat
    /// prefix of the struct).
    pub(crate) fn query_port(&self, port: u8) -> Result<ibv_port_attr, i32> {
        // SAFETY: all-zero bytes are a valid ibv_port_attr (integers only).
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context; `attr` is larger than the prefix the call writes.
        let rc = unsafe { (self.verbs.query_port)(self.ctx(), port, &mut attr) };
        if rc != 0 {
            return Err(rc_errno(rc));
        }
        Ok(attr)
    }

    /// `ibv_query_gid` (returns -1 with errno on failure).
    pub(crate) fn query_gid(&self, port: u8, index: i32) -> Result<[u8; 16], i32> {
        let mut gid = ibv_gid::default();
        // SAFETY: live context; `gid` is a writable 16-byte union.
        let rc = unsafe { (self.verbs.query_gid)(self.ctx(), port, index, &mut gid) };
        if rc != 0 {
            return Err(rc_errno(rc));
        }
        Ok(gid.raw)
    }

    /// `ibv_query_pkey` in host order (the call returns it big-endian).
    pub(crate) fn query_pkey(&self, port: u8, index: i32) -> Result<u16, i32> {
        let mut pkey: u16 = 0;
        // SAFETY: live context; `pkey` is a writable u16.
        let rc = unsafe { (self.verbs.query_pkey)(self.ctx(), port, index, &mut pkey) };
        if rc != 0 {
            return Err(rc_errno(rc));
        }
        Ok(u16::from_be(pkey))
    }

    /// The context's async-event fd (owned by libibverbs).
    fn async_fd(&self) -> RawFd {
        // SAFETY: live context; `async_fd` is set at open and never changes.
        unsafe { (*self.ctx()).async_fd }
    }

    /// Puts the async-event fd in non-blocking mode, so [`Self::get_async_event`] never waits.
    pub(crate) fn set_async_nonblocking(&self) -> io::Result<()> {
        set_nonblocking(self.async_fd())
    }

    /// The next asynchronous event, if one is pending (the fd must be non-blocking). The event
    /// is decoded and acknowledged at once, so destroying its object never waits for us.
    pub(crate) fn get_async_event(&self) -> Result<Option<RawEvent>, i32> {
        // SAFETY: all-zero bytes are a valid ibv_async_event (a pointer/int union and an int).
        let mut ev: ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: live context; `ev` is writable.
        let rc = unsafe { (self.verbs.get_async_event)(self.ctx(), &mut ev) };
        if rc != 0 {
            return match last_errno() {
                libc::EAGAIN | libc::EINTR => Ok(None),
                e => Err(e),
            };
        }
        let kind = ev.event_type;
        // SAFETY: (all reads below) the union member read is the one `ibv_event_type` says is
        // set, and the object it points to stays alive until the event is acknowledged below
        // (libibverbs' destroy calls wait for acknowledgements). Our CQs and SRQs carry their
        // handle in the context pointer (see `create_cq`/`create_srq`).
        let element = unsafe {
            match kind {
                0 => {
                    let state = (*ev.element.cq).cq_context as *const CqEventState;
                    if state.is_null() {
                        RawElement::Device
                    } else {
                        RawElement::Cq((*state).handle)
                    }
                }
                1..=7 | 16 => RawElement::Qp((*ev.element.qp).qp_num),
                14 | 15 => RawElement::Srq(handle_of((*ev.element.srq).srq_context)),
                9..=13 | 17 | 18 => {
                    RawElement::Port(u8::try_from(ev.element.port_num).unwrap_or(0))
                }
                _ => RawElement::Device,
            }
        };
        // SAFETY: `ev` is the event just returned by ibv_get_async_event, acknowledged once.
        unsafe { (self.verbs.ack_async_event)(&mut ev) };
        Ok(Some(RawEvent { kind, element }))
    }

    /// `ibv_alloc_pd`.
    pub(crate) fn alloc_pd(self: &Arc<Self>) -> Result<RawPd, i32> {
        // SAFETY: live context.
        let pd = unsafe { (self.verbs.alloc_pd)(self.ctx()) };
        let ptr = NonNull::new(pd).ok_or_else(last_errno)?;
        Ok(RawPd {
            ctx: self.clone(),
            ptr,
            freed: false,
        })
    }

    /// `ibv_create_comp_channel`, with its fd made non-blocking.
    pub(crate) fn create_comp_channel(self: &Arc<Self>) -> Result<RawChannel, i32> {
        // SAFETY: live context.
        let ch = unsafe { (self.verbs.create_comp_channel)(self.ctx()) };
        let ptr = NonNull::new(ch).ok_or_else(last_errno)?;
        let channel = RawChannel {
            ctx: self.clone(),
            ptr,
            freed: false,
        };
        set_nonblocking(channel.fd()).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        Ok(channel)
    }

    /// `ibv_create_cq` with `cqe` entries on `channel` (comp vector 0); `handle` comes back in
    /// completion and async events for this CQ.
    pub(crate) fn create_cq(
        self: &Arc<Self>,
        cqe: i32,
        channel: Option<&Arc<RawChannel>>,
        handle: u32,
    ) -> Result<RawCq, i32> {
        if let Some(ch) = channel {
            if !Arc::ptr_eq(&ch.ctx, self) {
                return Err(EINVAL);
            }
        }
        let state = Box::new(CqEventState {
            handle,
            unacked: AtomicU32::new(0),
        });
        let state_ptr = ptr::from_ref::<CqEventState>(&state)
            .cast_mut()
            .cast::<c_void>();
        let ch_ptr = channel.map_or(ptr::null_mut(), |c| c.ptr.as_ptr());
        // SAFETY: live context and (same-context) channel; `state_ptr` stays valid for the
        // CQ's life because the box is owned by the returned RawCq and dropped after the CQ.
        let cq = unsafe { (self.verbs.create_cq)(self.ctx(), cqe, state_ptr, ch_ptr, 0) };
        let ptr = NonNull::new(cq).ok_or_else(last_errno)?;
        Ok(RawCq {
            ctx: self.clone(),
            channel: channel.cloned(),
            ptr,
            state,
            freed: false,
        })
    }
}

impl Drop for RawContext {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc to this context, so none is left; closed once.
        unsafe { (self.verbs.close_device)(self.ctx()) };
    }
}

/// The handle stored in an object's context pointer.
fn handle_of(p: *mut c_void) -> u32 {
    u32::try_from(p.addr()).unwrap_or(u32::MAX)
}

/// An object's context pointer carrying `handle`.
fn context_of(handle: u32) -> *mut c_void {
    ptr::without_provenance_mut(handle as usize)
}

/// Sets `O_NONBLOCK` on `fd`.
fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on an fd libibverbs owns and keeps open; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` becomes readable within `timeout` (forever with `None`): `poll(2)`.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    let ms = match timeout {
        None => -1,
        Some(t) => {
            c_int::try_from(t.as_millis().max(u128::from(!t.is_zero()))).unwrap_or(c_int::MAX)
        }
    };
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one initialised pollfd that outlives the call; the fd is kept open by the
        // borrow.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n >= 0 {
            return Ok(n > 0 && pfd.revents & libc::POLLIN != 0);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

// ---- PD and MR ----------------------------------------------------------------------------

/// A protection domain (`ibv_pd`), deallocated on drop.
pub(crate) struct RawPd {
    ctx: Arc<RawContext>,
    ptr: NonNull<ibv_pd>,
    freed: bool,
}

impl RawPd {
    /// `ibv_dealloc_pd`; on failure the PD is handed back with the errno.
    pub(crate) fn destroy(mut self) -> Result<(), (RawPd, i32)> {
        // SAFETY: live PD, owned exclusively here.
        let rc = unsafe { (self.ctx.verbs.dealloc_pd)(self.ptr.as_ptr()) };
        if rc != 0 {
            return Err((self, rc_errno(rc)));
        }
        self.freed = true;
        Ok(())
    }

    /// Registers `region` (`ibv_reg_mr`, or `ibv_reg_mr_iova2` when an optional access bit is
    /// set, as the header's `ibv_reg_mr` macro chooses). The MR owns the region.
    pub(crate) fn reg_mr(self: &Arc<Self>, region: Region, access: u32) -> Result<RawMr, i32> {
        let v = self.ctx.verbs;
        let addr = region.as_ptr().cast::<c_void>();
        let len = region.len();
        let mr = if access & IBV_ACCESS_OPTIONAL_RANGE == 0 {
            let access = c_int::try_from(access).map_err(|_| EINVAL)?;
            // SAFETY: live PD; the region is valid for `len` bytes while the MR (which owns it)
            // is registered.
            unsafe { (v.reg_mr)(self.ptr.as_ptr(), addr, len, access) }
        } else {
            let Some(reg_mr_iova2) = v.reg_mr_iova2 else {
                return Err(EOPNOTSUPP);
            };
            // SAFETY: as above; the iova is the region's own address.
            unsafe { reg_mr_iova2(self.ptr.as_ptr(), addr, len, addr.addr() as u64, access) }
        };
        let ptr = NonNull::new(mr).ok_or_else(last_errno)?;
        Ok(RawMr {
            pd: self.clone(),
            ptr,
            region: ManuallyDrop::new(region),
            freed: false,
        })
    }

    /// Creates an address handle (`ibv_create_ah`) in this PD.
    pub(crate) fn create_ah(self: &Arc<Self>, attr: ibv_ah_attr) -> Result<RawAh, i32> {
        let mut attr = attr;
        // SAFETY: live PD; `attr` is a valid `ibv_ah_attr` that outlives the call.
        let ah = unsafe { (self.ctx.verbs.create_ah)(self.ptr.as_ptr(), &mut attr) };
        let ptr = NonNull::new(ah).ok_or_else(last_errno)?;
        Ok(RawAh {
            pd: self.clone(),
            ptr,
            freed: false,
        })
    }

    /// Creates an SRQ (`ibv_create_srq`) whose async events carry `handle`.
    pub(crate) fn create_srq(
        self: &Arc<Self>,
        attr: ibv_srq_attr,
        handle: u32,
    ) -> Result<RawSrq, i32> {
        let mut init = ibv_srq_init_attr {
            srq_context: context_of(handle),
            attr,
        };
        // SAFETY: live PD; `init` is a valid init struct that outlives the call.
        let srq = unsafe { (self.ctx.verbs.create_srq)(self.ptr.as_ptr(), &mut init) };
        let ptr = NonNull::new(srq).ok_or_else(last_errno)?;
        Ok(RawSrq {
            pd: self.clone(),
            ptr,
            freed: false,
        })
    }

    /// Creates a QP (`ibv_create_qp`) on this PD, its CQs and optional SRQ, all of the PD's
    /// context. Returns the QP and the capacities the provider granted.
    pub(crate) fn create_qp(
        self: &Arc<Self>,
        send_cq: &Arc<RawCq>,
        recv_cq: &Arc<RawCq>,
        srq: Option<&Arc<RawSrq>>,
        cap: ibv_qp_cap,
        qp_type: u32,
        sq_sig_all: bool,
    ) -> Result<(RawQp, ibv_qp_cap), i32> {
        let same = |c: &Arc<RawContext>| Arc::ptr_eq(c, &self.ctx);
        if !same(&send_cq.ctx) || !same(&recv_cq.ctx) || srq.is_some_and(|s| !same(&s.pd.ctx)) {
            return Err(EINVAL);
        }
        let mut init = ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.ptr.as_ptr(),
            recv_cq: recv_cq.ptr.as_ptr(),
            srq: srq.map_or(ptr::null_mut(), |s| s.ptr.as_ptr()),
            cap,
            qp_type,
            sq_sig_all: c_int::from(sq_sig_all),
        };
        // SAFETY: live PD, CQs and SRQ of one context; `init` outlives the call (libibverbs
        // writes the granted capacities back into it).
        let qp = unsafe { (self.ctx.verbs.create_qp)(self.ptr.as_ptr(), &mut init) };
        let ptr = NonNull::new(qp).ok_or_else(last_errno)?;
        Ok((
            RawQp {
                pd: self.clone(),
                _send_cq: send_cq.clone(),
                _recv_cq: recv_cq.clone(),
                srq: srq.cloned(),
                ptr,
                freed: false,
            },
            init.cap,
        ))
    }
}

impl Drop for RawPd {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: live PD; children hold Arcs to it, so none is left.
            unsafe { (self.ctx.verbs.dealloc_pd)(self.ptr.as_ptr()) };
        }
    }
}

/// A registered memory region (`ibv_mr`) with the memory it covers; deregistered on drop,
/// before the memory is released — and only if the deregistration succeeded: while the NIC
/// may still hold the registration it may still DMA into the memory, so after a failed
/// `ibv_dereg_mr` the memory is leaked, never freed.
pub(crate) struct RawMr {
    pd: Arc<RawPd>,
    ptr: NonNull<ibv_mr>,
    /// Dropped by hand, after a successful deregistration only.
    region: ManuallyDrop<Region>,
    freed: bool,
}

impl RawMr {
    /// The `ibv_mr` pointer a BIND_MW work request carries.
    pub(crate) fn as_ptr(&self) -> *mut ibv_mr {
        self.ptr.as_ptr()
    }

    /// `(lkey, rkey)`.
    pub(crate) fn keys(&self) -> (u32, u32) {
        // SAFETY: live MR; the keys are set at registration and never change.
        unsafe { ((*self.ptr.as_ptr()).lkey, (*self.ptr.as_ptr()).rkey) }
    }

    /// The memory.
    pub(crate) fn region(&self) -> &Region {
        &self.region
    }

    /// `ibv_dereg_mr`; on failure the MR is handed back with the errno.
    pub(crate) fn destroy(mut self) -> Result<(), (RawMr, i32)> {
        // SAFETY: live MR, owned exclusively here.
        let rc = unsafe { (self.pd.ctx.verbs.dereg_mr)(self.ptr.as_ptr()) };
        if rc != 0 {
            return Err((self, rc_errno(rc)));
        }
        self.freed = true;
        Ok(())
    }
}

impl Drop for RawMr {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: live MR, deregistered once; the region is dropped after this.
            let rc = unsafe { (self.pd.ctx.verbs.dereg_mr)(self.ptr.as_ptr()) };
            self.freed = rc == 0;
        }
        if self.freed {
            // SAFETY: dropped once, here, and never used again; the NIC no longer holds the
            // registration, so nothing can DMA into the memory any more.
            unsafe { ManuallyDrop::drop(&mut self.region) };
        }
        // Otherwise the registration may still be live: the memory is leaked on purpose.
    }
}

// ---- completion channel and CQ -----------------------------------------------------------

/// A completion channel (`ibv_comp_channel`), destroyed on drop.
pub(crate) struct RawChannel {
    ctx: Arc<RawContext>,
    ptr: NonNull<ibv_comp_channel>,
    freed: bool,
}

impl RawChannel {
    /// The channel's fd (owned by libibverbs).
    fn fd(&self) -> RawFd {
        // SAFETY: live channel; `fd` is set at creation.
        unsafe { (*self.ptr.as_ptr()).fd }
    }

    /// A duplicate of the channel's fd: the same open file (readiness, non-blocking mode),
    /// owned by the caller, so it stays valid after the channel is destroyed.
    pub(crate) fn dup_fd(&self) -> io::Result<OwnedFd> {
        // SAFETY: F_DUPFD_CLOEXEC on a live fd returns a new fd we own (or -1).
        let fd = unsafe { libc::fcntl(self.fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The handle of the CQ of the next pending completion event, without blocking
    /// (`ibv_get_cq_event` on the non-blocking fd). The event counts as unacknowledged on its
    /// CQ until [`RawCq::ack`].
    pub(crate) fn get_cq_event(&self) -> Result<Option<u32>, i32> {
        let mut cq: *mut ibv_cq = ptr::null_mut();
        let mut cq_ctx: *mut c_void = ptr::null_mut();
        // SAFETY: live channel; both out-pointers are writable.
        let rc = unsafe { (self.ctx.verbs.get_cq_event)(self.ptr.as_ptr(), &mut cq, &mut cq_ctx) };
        if rc != 0 {
            return match last_errno() {
                libc::EAGAIN | libc::EINTR => Ok(None),
                e => Err(e),
            };
        }
        if cq_ctx.is_null() {
            return Err(libc::EIO);
        }
        // SAFETY: every CQ on our channels was created by `create_cq` with a pointer to its
        // CqEventState, which lives as long as the CQ; an event read for a CQ keeps the CQ from
        // being destroyed (`ibv_destroy_cq` waits for its acknowledgement).
        let state = unsafe { &*(cq_ctx as *const CqEventState) };
        state.unacked.fetch_add(1, Ordering::AcqRel);
        Ok(Some(state.handle))
    }

    /// `ibv_destroy_comp_channel`; on failure the channel is handed back with the errno.
    pub(crate) fn destroy(mut self) -> Result<(), (RawChannel, i32)> {
        // SAFETY: live channel, owned exclusively (no CQ holds it: CQs hold Arcs).
        let rc = unsafe { (self.ctx.verbs.destroy_comp_channel)(self.ptr.as_ptr()) };
        if rc != 0 {
            return Err((self, rc_errno(rc)));
        }
        self.freed = true;
        Ok(())
    }
}

impl Drop for RawChannel {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: live channel, destroyed once; no CQ is left on it.
            unsafe { (self.ctx.verbs.destroy_comp_channel)(self.ptr.as_ptr()) };
        }
    }
}

/// What a CQ's `cq_context` points to: its handle and its count of events read but not
/// acknowledged.
struct CqEventState {
    handle: u32,
    unacked: AtomicU32,
}

/// A completion queue (`ibv_cq`). Dropping it acknowledges its outstanding events (so that
/// `ibv_destroy_cq` cannot block) and destroys it.
pub(crate) struct RawCq {
    ctx: Arc<RawContext>,
    channel: Option<Arc<RawChannel>>,
    ptr: NonNull<ibv_cq>,
    state: Box<CqEventState>,
    freed: bool,
}

impl RawCq {
    /// The number of entries (`cq->cqe`), which the provider updates on resize.
    pub(crate) fn cqe(&self) -> u32 {
        // SAFETY: live CQ; callers serialise `resize` against this read.
        u32::try_from(unsafe { (*self.ptr.as_ptr()).cqe }).unwrap_or(0)
    }

    /// Whether the CQ reports to a completion channel.
    pub(crate) fn has_channel(&self) -> bool {
        self.channel.is_some()
    }

    /// Events read from the channel for this CQ and not yet acknowledged.
    pub(crate) fn unacked(&self) -> u32 {
        self.state.unacked.load(Ordering::Acquire)
    }

    /// Acknowledges up to `n` events (never more than were read, which would make
    /// `ibv_destroy_cq` wait forever).
    pub(crate) fn ack(&self, n: u32) {
        let mut k = 0;
        let _ = self
            .state
            .unacked
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                k = cur.min(n);
                Some(cur - k)
            });
        if k > 0 {
            // SAFETY: live CQ; `k` events were read for it and not yet acknowledged.
            unsafe { (self.ctx.verbs.ack_cq_events)(self.ptr.as_ptr(), k) };
        }
    }

    /// `ibv_poll_cq` through `ctx->ops.poll_cq`, as the header's inline does; returns how many
    /// entries of `out` were filled.
    pub(crate) fn poll(&self, out: &mut [ibv_wc]) -> Result<usize, i32> {
        let n = c_int::try_from(out.len()).unwrap_or(c_int::MAX);
        // SAFETY: live CQ; its context's ops table is set at open and never changes.
        let poll = unsafe { (*(*self.ptr.as_ptr()).context).ops.poll_cq }.ok_or(EOPNOTSUPP)?;
        // SAFETY: live CQ; `out` has room for `n` completions.
        let rc = unsafe { poll(self.ptr.as_ptr(), n, out.as_mut_ptr()) };
        usize::try_from(rc).map_err(|_| rc_errno(rc))
    }

    /// `ibv_req_notify_cq` through `ctx->ops.req_notify_cq`.
    pub(crate) fn req_notify(&self, solicited_only: bool) -> Result<(), i32> {
        // SAFETY: as in `poll`.
        let arm = unsafe { (*(*self.ptr.as_ptr()).context).ops.req_notify_cq }.ok_or(EOPNOTSUPP)?;
        // SAFETY: live CQ.
        let rc = unsafe { arm(self.ptr.as_ptr(), c_int::from(solicited_only)) };
        if rc != 0 {
            return Err(rc_errno(rc));
        }
        Ok(())
    }

    /// `ibv_resize_cq` (callers serialise it against `poll` and `cqe`).
    pub(crate) fn resize(&self, cqe: i32) -> Result<(), i32> {
        // SAFETY: live CQ.
        let rc = unsafe { (self.ctx.verbs.resize_cq)(self.ptr.as_ptr(), cqe) };
        if rc != 0 {
            return Err(rc_errno(rc));
        }
        Ok(())
    }

    /// `ibv_destroy_cq`; `EBUSY` (without calling it) while events are unacknowledged, since
    /// libibverbs would block; on failure the CQ is handed back with the errno.
    pub(crate) fn destroy(mut self) -> Result<(), (RawCq, i32)> {
        if self.unacked() > 0 {
            return Err((self, EBUSY));
        }
        // SAFETY: live CQ, owned exclusively (QPs hold Arcs, so none uses it).
        let rc = unsafe { (self.ctx.verbs.destroy_cq)(self.ptr.as_ptr()) };
        if rc != 0 {
            return Err((self, rc_errno(rc)));
        }
        self.freed = true;
        Ok(())
    }
}

impl Drop for RawCq {
    fn drop(&mut self) {
        if !self.freed {
            self.ack(u32::MAX);
            // SAFETY: live CQ, destroyed once, with every read event acknowledged.
            unsafe { (self.ctx.verbs.destroy_cq)(self.ptr.as_ptr()) };
        }
    }
}

// ---- work requests ------------------------------------------------------------------------

fn sge(s: &verbs_api::Sge) -> ibv_sge {
    ibv_sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
}

/// Index of `bad` in the chain starting at `base` of `n` elements of `T` (0 when libibverbs
/// did not say).
fn bad_index<T>(base: *const T, bad: *const T, n: usize) -> usize {
    let size = size_of::<T>().max(1);
    let idx = bad.addr().wrapping_sub(base.addr()) / size;
    if bad.is_null() || idx >= n { 0 } else { idx }
}

/// Receive work requests in libibverbs' form: the chain and the SGE array it points into.
struct RecvChain {
    wrs: Vec<ibv_recv_wr>,
    _sges: Vec<ibv_sge>,
}

impl RecvChain {
    fn new(wrs: &[RecvWr<'_>]) -> Result<RecvChain, (usize, i32)> {
        let mut sges: Vec<ibv_sge> = wrs.iter().flat_map(|w| w.sg_list.iter().map(sge)).collect();
        let base = sges.as_mut_ptr();
        let mut raw = Vec::with_capacity(wrs.len());
        let mut start = 0usize;
        for (i, w) in wrs.iter().enumerate() {
            let n = w.sg_list.len();
            let num_sge = c_int::try_from(n).map_err(|_| (i, EINVAL))?;
            raw.push(ibv_recv_wr {
                wr_id: w.wr_id,
                next: ptr::null_mut(),
                // `start <= sges.len()`, so this stays within (or one past) the allocation.
                sg_list: if n == 0 {
                    ptr::null_mut()
                } else {
                    base.wrapping_add(start)
                },
                num_sge,
            });
            start += n;
        }
        link(&mut raw, |w, next| w.next = next);
        Ok(RecvChain {
            wrs: raw,
            _sges: sges,
        })
    }
}

/// Sets each element's `next` to the following element (the last one's stays null).
fn link<T>(v: &mut [T], mut set: impl FnMut(&mut T, *mut T)) {
    let base = v.as_mut_ptr();
    let n = v.len();
    for i in 0..n.saturating_sub(1) {
        // SAFETY: i and i + 1 are in bounds; the pointer stored is derived from `base` and only
        // dereferenced by libibverbs while `v` is alive and unmoved.
        unsafe { set(&mut *base.add(i), base.add(i + 1)) };
    }
}

/// Resolves the handle numbers a work request names to live libibverbs objects; the caller
/// keeps them alive across the post.
pub(crate) struct WrObjects<'a> {
    /// A UD destination's AH handle → its `ibv_ah`.
    pub(crate) ah: &'a dyn Fn(u32) -> Option<*mut c_void>,
    /// A BIND_MW's window handle → its `ibv_mw`.
    pub(crate) mw: &'a dyn Fn(u32) -> Option<*mut ibv_mw>,
    /// A BIND_MW's MR lkey → its `ibv_mr`.
    pub(crate) mr: &'a dyn Fn(u32) -> Option<*mut ibv_mr>,
}

fn send_wr_raw(w: &SendWr<'_>, objs: &WrObjects<'_>) -> Result<ibv_send_wr, i32> {
    let mut wr = ibv_send_wr {
        wr_id: w.wr_id,
        next: ptr::null_mut(),
        sg_list: ptr::null_mut(),
        num_sge: 0,
        opcode: w.op.raw(),
        send_flags: w.flags.bits(),
        imm_data: w.op.imm().unwrap_or(0).to_be(),
        wr: ibv_send_wr_wr {
            atomic: ibv_send_wr_atomic::default(),
        },
        qp_type_xrc_remote_srqn: 0,
        bind_mw_or_tso: [0; 6],
    };
    match w.op {
        SendOp::Send | SendOp::SendWithImm { .. } => {}
        SendOp::RdmaWrite { remote_addr, rkey }
        | SendOp::RdmaWriteWithImm {
            remote_addr, rkey, ..
        }
        | SendOp::RdmaRead { remote_addr, rkey } => {
            wr.wr.rdma = ibv_send_wr_rdma { remote_addr, rkey };
        }
        SendOp::AtomicCmpAndSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            wr.wr.atomic = ibv_send_wr_atomic {
                remote_addr,
                compare_add: compare,
                swap,
                rkey,
            };
        }
        SendOp::AtomicFetchAndAdd {
            remote_addr,
            rkey,
            add,
        } => {
            wr.wr.atomic = ibv_send_wr_atomic {
                remote_addr,
                compare_add: add,
                swap: 0,
                rkey,
            };
        }
        // `invalidate_rkey` shares the `imm_data` slot, in host order.
        SendOp::LocalInv { rkey: key }
        | SendOp::SendWithInv {
            invalidate_rkey: key,
        } => wr.imm_data = key,
        SendOp::BindMw {
            mw,
            rkey,
            mr,
            addr,
            length,
            access,
        } => {
            let bind = ibv_send_wr_bind_mw {
                mw: (objs.mw)(mw).ok_or(EINVAL)?,
                rkey,
                bind_info: ibv_mw_bind_info {
                    // An unbind may name no MR (rdma-core allows NULL with length 0).
                    mr: match (objs.mr)(mr) {
                        Some(p) => p,
                        None if length == 0 => ptr::null_mut(),
                        None => return Err(EINVAL),
                    },
                    addr,
                    length,
                    mw_access_flags: access.bits(),
                },
            };
            wr.bind_mw_or_tso = bind.to_words();
        }
    }
    Ok(wr)
}

/// Send work requests in libibverbs' form. Inline payloads become one SGE pointing at the
/// caller's bytes (no lkey), which the provider copies during the post.
struct SendChain {
    wrs: Vec<ibv_send_wr>,
    _sges: Vec<ibv_sge>,
}

impl SendChain {
    /// `objs` maps the AH, MW and MR handles the requests name to live objects (`None`: no
    /// such object, `EINVAL`).
    fn new(wrs: &[SendWr<'_>], objs: &WrObjects<'_>) -> Result<SendChain, (usize, i32)> {
        let payload = |w: &SendWr<'_>| -> Result<Vec<ibv_sge>, i32> {
            if w.flags.contains(SendFlags::INLINE) {
                if w.inline_data.is_empty() {
                    return Ok(Vec::new());
                }
                let length = u32::try_from(w.inline_data.len()).map_err(|_| EINVAL)?;
                Ok(vec![ibv_sge {
                    addr: w.inline_data.as_ptr().addr() as u64,
                    length,
                    lkey: 0,
                }])
            } else {
                Ok(w.sg_list.iter().map(sge).collect())
            }
        };
        let mut sges = Vec::new();
        let mut counts = Vec::with_capacity(wrs.len());
        for (i, w) in wrs.iter().enumerate() {
            let p = payload(w).map_err(|e| (i, e))?;
            counts.push(p.len());
            sges.extend(p);
        }
        let base = sges.as_mut_ptr();
        let mut raw = Vec::with_capacity(wrs.len());
        let mut start = 0usize;
        for (i, (w, n)) in wrs.iter().zip(counts).enumerate() {
            let mut r = send_wr_raw(w, objs).map_err(|e| (i, e))?;
            if let Some(ud) = w.ud {
                r.wr.ud = ibv_send_wr_ud {
                    ah: (objs.ah)(ud.ah).ok_or((i, EINVAL))?,
                    remote_qpn: ud.remote_qpn,
                    remote_qkey: ud.remote_qkey,
                };
            }
            r.num_sge = c_int::try_from(n).map_err(|_| (i, EINVAL))?;
            r.sg_list = if n == 0 {
                ptr::null_mut()
            } else {
                base.wrapping_add(start)
            };
            start += n;
            raw.push(r);
        }
        link(&mut raw, |w, next| w.next = next);
        Ok(SendChain {
            wrs: raw,
            _sges: sges,
        })
    }
}

// ---- AH -----------------------------------------------------------------------------------

/// An address handle (`ibv_ah`, opaque here), destroyed on drop; keeps its PD alive.
pub(crate) struct RawAh {
    pd: Arc<RawPd>,
    ptr: NonNull<c_void>,
    freed: bool,
}

impl RawAh {
    /// The `ibv_ah` pointer a UD work request carries.
    pub(crate) fn as_ptr(&self) -> *mut c_void {
        self.ptr.as_ptr()
    }

    /// `ibv_destroy_ah`; on failure the AH is handed back with the errno.
    pub(crate) fn destroy(mut self) -> Result<(), (RawAh, i32)> {
        // SAFETY: live AH, owned exclusively here.
        let rc = unsafe { (self.pd.ctx.verbs.destroy_ah)(self.ptr.as_ptr()) };
        if rc != 0 {
            return Err((self, rc_errno(rc)));
        }
        self.freed = true;
        Ok(())
    }
}

impl Drop for RawAh {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: live AH, destroyed once, before its PD Arc is released.
            unsafe { (self.pd.ctx.verbs.destroy_ah)(self.ptr.as_ptr()) };
        }
    }
}

// ---- MW -----------------------------------------------------------------------------------

/// A memory window (`ibv_mw`), deallocated on drop; keeps its PD alive. Allocated, bound and
/// deallocated through the context's ops table, as the header's inline `ibv_alloc_mw`,
/// `ibv_bind_mw` and `ibv_dealloc_mw` do.
pub(crate) struct RawMw {
    /// Kept alive while the window exists.
    _pd: Arc<RawPd>,
    ptr: NonNull<ibv_mw>,
    freed: bool,
}

impl RawPd {
    /// `ibv_alloc_mw`: `EOPNOTSUPP` if the provider has no `alloc_mw`.
    pub(crate) fn alloc_mw(self: &Arc<Self>, mw_type: u32) -> Result<RawMw, i32> {
        // SAFETY: live PD; its context and ops table are set at open and never change.
        let alloc = unsafe { (*(*self.ptr.as_ptr()).context).ops.alloc_mw }.ok_or(EOPNOTSUPP)?;
        // SAFETY: live PD; `alloc_mw` takes the PD and a window type.
        let mw = unsafe { alloc(self.ptr.as_ptr(), mw_type) };
        let ptr = NonNull::new(mw).ok_or_else(last_errno)?;
        Ok(RawMw {
            _pd: self.clone(),
            ptr,
            freed: false,
        })
    }
}

impl RawMw {
    /// The `ibv_mw` pointer a BIND_MW work request carries.
    pub(crate) fn as_ptr(&self) -> *mut ibv_mw {
        self.ptr.as_ptr()
    }

    /// Records `rkey` in `ibv_mw.rkey` after a type 2 bind was posted, as an application
    /// does: the rxe provider names the window to the kernel by this field, which must hold the
    /// window's current key for the next bind, and does not update it itself.
    pub(crate) fn set_rkey(&self, rkey: u32) {
        // SAFETY: live MW; `rkey` is a public field of `ibv_mw` the application owns; the
        // provider reads it only while posting, which the caller's table lock excludes.
        unsafe { (*self.ptr.as_ptr()).rkey = rkey };
    }

    /// `ibv_mw.rkey`: the key from the allocation or the latest `ibv_bind_mw`.
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: live MW; the provider updates `rkey` only inside `bind_mw`, which callers
        // serialise with this read through the QP's post path.
        unsafe { (*self.ptr.as_ptr()).rkey }
    }

    fn dealloc(&self) -> i32 {
        // SAFETY: live MW; the ops table is set at open.
        let ops = unsafe { (*(*self.ptr.as_ptr()).context).ops.dealloc_mw };
        match ops {
            // SAFETY: live MW, deallocated once (the caller marks it freed on success).
            Some(dealloc) => match unsafe { dealloc(self.ptr.as_ptr()) } {
                0 => 0,
                rc => rc_errno(rc),
            },
            None => EOPNOTSUPP,
        }
    }

    /// `ibv_dealloc_mw`; on failure the window is handed back with the errno.
    pub(crate) fn destroy(mut self) -> Result<(), (RawMw, i32)> {
        match self.dealloc() {
            0 => {
                self.freed = true;
                Ok(())
            }
            e => Err((self, e)),
        }
    }
}

impl Drop for RawMw {
    fn drop(&mut self) {
        if !self.freed {
            self.freed = self.dealloc() == 0;
        }
    }
}

impl RawQp {
    /// `ibv_bind_mw` of type 1 window `mw` (the header inline's checks: `EINVAL` for another
    /// type or a range without an MR, `EPERM` for an MR of another PD); returns the window's
    /// new R_Key. `bind.bind_info.mr` must be a live MR or null.
    pub(crate) fn bind_mw(&self, mw: &RawMw, bind: &ibv_mw_bind) -> Result<u32, i32> {
        let m = mw.as_ptr();
        let info = bind.bind_info;
        // SAFETY: live MW and (when non-null) live MR, per the caller; fields set at creation.
        let (mw_type, mw_pd, mr_pd) = unsafe {
            let mr_pd = (!info.mr.is_null()).then(|| (*info.mr.cast::<ibv_mr_head>()).pd);
            ((*m).mw_type, (*m).pd, mr_pd)
        };
        if mw_type != 1 || (info.mr.is_null() && (info.addr != 0 || info.length != 0)) {
            return Err(EINVAL);
        }
        if mr_pd.is_some_and(|pd| pd != mw_pd) {
            return Err(libc::EPERM);
        }
        // SAFETY: live MW; the ops table is set at open.
        let bind_fn = unsafe { (*(*m).context).ops.bind_mw }.ok_or(EOPNOTSUPP)?;
        let mut bind = *bind;
        // SAFETY: live QP and MW; `bind` outlives the call.
        let rc = unsafe { bind_fn(self.ptr.as_ptr(), m, &mut bind) };
        if rc != 0 {
            return Err(rc_errno(rc));
        }
        Ok(mw.rkey())
    }
}

/// The first members of `struct ibv_mr` (`context`, `pd`), to read an MR's PD.
#[repr(C)]
struct ibv_mr_head {
    context: *mut c_void,
    pd: *mut ibv_pd,
}

// ---- SRQ and QP ---------------------------------------------------------------------------

/// A shared receive queue (`ibv_srq`), destroyed on drop.
pub(crate) struct RawSrq {
    pd: Arc<RawPd>,
    ptr: NonNull<ibv_srq>,
    freed: bool,
}

impl RawSrq {
    /// `ibv_post_srq_recv` through `ctx->ops.post_srq_recv`; on failure, the index of the first
    /// work request not posted and the errno.
    pub(crate) fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, i32)> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut chain = RecvChain::new(wrs)?;
        // SAFETY: live SRQ; the ops table is set at open and never changes.
        let post =
            unsafe { (*(*self.ptr.as_ptr()).context).ops.post_srq_recv }.ok_or((0, EOPNOTSUPP))?;
        let base = chain.wrs.as_mut_ptr();
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: live SRQ; the chain and its SGEs live across the call.
        let rc = unsafe { post(self.ptr.as_ptr(), base, &mut bad) };
        if rc != 0 {
            return Err((bad_index(base, bad, wrs.len()), rc_errno(rc)));
        }
        Ok(())
    }

    /// `ibv_query_srq`.
    pub(crate) fn query(&self) -> Result<ibv_srq_attr, i32> {
        let mut attr = ibv_srq_attr::default();
        // SAFETY: live SRQ; `attr` is writable.
        let rc = unsafe { (self.pd.ctx.verbs.query_srq)(self.ptr.as_ptr(), &mut attr) };
        if rc != 0 {
            return Err(rc_errno(rc));
        }
        Ok(attr)
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`.
    pub(crate) fn arm_limit(&self, limit: u32) -> Result<(), i32> {
        let mut attr = ibv_srq_attr {
            srq_limit: limit,
            ..ibv_srq_attr::default()
        };
        // SAFETY: live SRQ; `attr` outlives the call.
        let rc =
            unsafe { (self.pd.ctx.verbs.modify_srq)(self.ptr.as_ptr(), &mut attr, IBV_SRQ_LIMIT) };
        if rc != 0 {
            return Err(rc_errno(rc));
        }
        Ok(())
    }

    /// `ibv_destroy_srq`; on failure the SRQ is handed back with the errno.
    pub(crate) fn destroy(mut self) -> Result<(), (RawSrq, i32)> {
        // SAFETY: live SRQ, owned exclusively (QPs hold Arcs).
        let rc = unsafe { (self.pd.ctx.verbs.destroy_srq)(self.ptr.as_ptr()) };
        if rc != 0 {
            return Err((self, rc_errno(rc)));
        }
        self.freed = true;
        Ok(())
    }
}

impl Drop for RawSrq {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: live SRQ, destroyed once.
            unsafe { (self.pd.ctx.verbs.destroy_srq)(self.ptr.as_ptr()) };
        }
    }
}

/// Every `ibv_qp_attr_mask` bit `ibv_query_qp` is asked for (STATE … DEST_QPN).
const QUERY_MASK: c_int = (1 << 21) - 1;

/// A queue pair (`ibv_qp`), destroyed on drop.
pub(crate) struct RawQp {
    pd: Arc<RawPd>,
    /// Kept alive (and `Busy` to destroy) while the QP exists.
    _send_cq: Arc<RawCq>,
    _recv_cq: Arc<RawCq>,
    srq: Option<Arc<RawSrq>>,
    ptr: NonNull<ibv_qp>,
    freed: bool,
}

impl RawQp {
    /// The QP number.
    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: live QP; `qp_num` is set at creation.
        unsafe { (*self.ptr.as_ptr()).qp_num }
    }

    /// `ibv_modify_qp`.
    pub(crate) fn modify(&self, attr: &ibv_qp_attr, mask: u32) -> Result<(), i32> {
        let mask = c_int::try_from(mask).map_err(|_| EOPNOTSUPP)?;
        let mut attr = *attr;
        // SAFETY: live QP; `attr` outlives the call.
        let rc = unsafe { (self.pd.ctx.verbs.modify_qp)(self.ptr.as_ptr(), &mut attr, mask) };
        if rc != 0 {
            return Err(rc_errno(rc));
        }
        Ok(())
    }

    /// `ibv_query_qp` for every attribute.
    pub(crate) fn query(&self) -> Result<(ibv_qp_attr, ibv_qp_init_attr), i32> {
        let mut attr = ibv_qp_attr::default();
        let mut init = ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: ptr::null_mut(),
            recv_cq: ptr::null_mut(),
            srq: ptr::null_mut(),
            cap: ibv_qp_cap::default(),
            qp_type: 0,
            sq_sig_all: 0,
        };
        // SAFETY: live QP; both structs are writable and outlive the call.
        let rc = unsafe {
            (self.pd.ctx.verbs.query_qp)(self.ptr.as_ptr(), &mut attr, QUERY_MASK, &mut init)
        };
        if rc != 0 {
            return Err(rc_errno(rc));
        }
        Ok((attr, init))
    }

    /// `ibv_post_send` through `ctx->ops.post_send`; on failure, the index of the first work
    /// request not posted and the errno. `objs` resolves the AH, MW and MR handles the
    /// requests name to live objects, which the caller keeps alive across the call.
    pub(crate) fn post_send(
        &self,
        wrs: &[SendWr<'_>],
        objs: &WrObjects<'_>,
    ) -> Result<(), (usize, i32)> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut chain = SendChain::new(wrs, objs)?;
        // SAFETY: live QP; the ops table is set at open and never changes.
        let post =
            unsafe { (*(*self.ptr.as_ptr()).context).ops.post_send }.ok_or((0, EOPNOTSUPP))?;
        let base = chain.wrs.as_mut_ptr();
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: live QP; the chain, its SGEs and the inline bytes they point at live across
        // the call (the provider copies inline data before returning).
        let rc = unsafe { post(self.ptr.as_ptr(), base, &mut bad) };
        if rc != 0 {
            return Err((bad_index(base, bad, wrs.len()), rc_errno(rc)));
        }
        Ok(())
    }

    /// `ibv_post_recv` through `ctx->ops.post_recv`; on failure, the index of the first work
    /// request not posted and the errno.
    pub(crate) fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, i32)> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut chain = RecvChain::new(wrs)?;
        // SAFETY: live QP; the ops table is set at open and never changes.
        let post =
            unsafe { (*(*self.ptr.as_ptr()).context).ops.post_recv }.ok_or((0, EOPNOTSUPP))?;
        let base = chain.wrs.as_mut_ptr();
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: live QP; the chain and its SGEs live across the call.
        let rc = unsafe { post(self.ptr.as_ptr(), base, &mut bad) };
        if rc != 0 {
            return Err((bad_index(base, bad, wrs.len()), rc_errno(rc)));
        }
        Ok(())
    }

    /// `ibv_destroy_qp`; on failure the QP is handed back with the errno.
    pub(crate) fn destroy(mut self) -> Result<(), (RawQp, i32)> {
        // SAFETY: live QP, owned exclusively.
        let rc = unsafe { (self.pd.ctx.verbs.destroy_qp)(self.ptr.as_ptr()) };
        if rc != 0 {
            return Err((self, rc_errno(rc)));
        }
        self.freed = true;
        Ok(())
    }

    /// Whether the QP receives through an SRQ.
    pub(crate) fn has_srq(&self) -> bool {
        self.srq.is_some()
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        if !self.freed {
            // SAFETY: live QP, destroyed once, before its CQs/SRQ/PD Arcs are released.
            unsafe { (self.pd.ctx.verbs.destroy_qp)(self.ptr.as_ptr()) };
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use verbs_api::{SendOp, SendWr, Sge};

    /// Objects with only the AHs of `ah`: no window, no MR.
    fn no_objects<'a>(ah: &'a dyn Fn(u32) -> Option<*mut c_void>) -> WrObjects<'a> {
        WrObjects {
            ah,
            mw: &|_| None,
            mr: &|_| None,
        }
    }

    use super::*;

    #[test]
    fn send_chain_links_and_points_at_sges() {
        let sg = [
            Sge {
                addr: 0x1000,
                length: 8,
                lkey: 7,
            },
            Sge {
                addr: 0x2000,
                length: 4,
                lkey: 7,
            },
        ];
        let data = *b"inline!";
        let op = SendOp::RdmaWrite {
            remote_addr: 0xdead_0000,
            rkey: 0x55,
        };
        let wrs = [
            SendWr::new(1, op, &sg),
            SendWr::inline(2, SendOp::SendWithImm { imm: 0x0102_0304 }, &data),
            SendWr::new(3, SendOp::Send, &[]),
        ];
        let chain = SendChain::new(&wrs, &no_objects(&|_| None)).unwrap();
        let w = &chain.wrs;
        assert_eq!(w[0].next, ptr::from_ref(&w[1]).cast_mut());
        assert_eq!(w[1].next, ptr::from_ref(&w[2]).cast_mut());
        assert!(w[2].next.is_null());
        assert_eq!(w[0].num_sge, 2);
        assert_eq!(w[1].num_sge, 1);
        assert_eq!(w[2].num_sge, 0);
        // SAFETY: test-only reads of the SGEs the chain points at (alive in `chain`).
        let (s0, s1) = unsafe { (*w[0].sg_list.add(1), *w[1].sg_list) };
        assert_eq!((s0.addr, s0.length), (0x2000, 4));
        assert_eq!(s1.addr, data.as_ptr().addr() as u64);
        assert_eq!(w[1].imm_data, 0x0102_0304u32.to_be());
        assert_eq!(w[1].opcode, 3);
        // SAFETY: the rdma member was the one written for an RDMA WRITE.
        let rdma = unsafe { w[0].wr.rdma };
        assert_eq!((rdma.remote_addr, rdma.rkey), (0xdead_0000, 0x55));
        assert_eq!(bad_index(w.as_ptr(), &w[2], 3), 2);
        assert_eq!(bad_index(w.as_ptr(), ptr::null(), 3), 0);
    }

    #[test]
    fn send_chain_fills_ud_and_refuses_unknown_ahs() {
        use verbs_api::UdDest;
        let ud = UdDest {
            ah: 4,
            remote_qpn: 0x12,
            remote_qkey: 0x1111,
        };
        let wrs = [SendWr::new(1, SendOp::Send, &[]).with_ud(ud)];
        let fake = 0x4000usize as *mut c_void;
        let chain = SendChain::new(&wrs, &no_objects(&|h| (h == 4).then_some(fake))).unwrap();
        // SAFETY: the ud member was the one written for a UD send.
        let got = unsafe { chain.wrs[0].wr.ud };
        assert_eq!(
            (got.ah, got.remote_qpn, got.remote_qkey),
            (fake, 0x12, 0x1111)
        );
        assert_eq!(
            SendChain::new(&wrs, &no_objects(&|_| None)).err(),
            Some((0, EINVAL))
        );
    }
}
