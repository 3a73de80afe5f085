//! PD, MR, completion channel, CQ (classic and `ibv_cq_ex`), SRQ and AH.
//!
//! Each object is a `#[repr(C)]` struct whose first member is the public libibverbs struct the
//! application holds a pointer to, followed by the private part (the UDP device's handle). The
//! private part is only ever borrowed on its own, never together with the public fields the
//! application may write. Destroying an object another still uses fails with `EBUSY` and
//! leaves it intact.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use emu_udp::{UdpChannel, UdpCq, UdpMr, UdpPd, UdpSrq};
use ibverbs_sys::*;
use verbs_api::{
    AccessFlags, AddressHandle, CompletionChannel, CompletionQueue, Context, MemoryRegion,
    ProtectionDomain, SharedReceiveQueue, SrqAttr, WorkCompletion,
};

use crate::device::{CtxInner, fd_nonblocking, release, retain, udp_context, wait_readable};
use crate::{convert, guard, null_with, set_errno};

// ---- PD ------------------------------------------------------------------------------------

/// A protection domain.
#[repr(C)]
pub struct SvPd {
    /// The public part.
    pub pd: ibv_pd,
    pub(crate) udp: UdpPd,
}

/// The UDP PD behind an `ibv_pd` (NULL → `None`).
///
/// # Safety
///
/// `pd` is NULL or a live PD of this library.
pub(crate) unsafe fn pd_udp<'a>(pd: *mut ibv_pd) -> Option<&'a UdpPd> {
    let sv = pd.cast::<SvPd>();
    // SAFETY: per the contract; only the private part is borrowed.
    (!sv.is_null()).then(|| unsafe { &(*sv).udp })
}

/// The context state of a PD.
///
/// # Safety
///
/// `pd` is NULL or a live PD of this library.
unsafe fn pd_ctx<'a>(pd: *mut ibv_pd) -> Option<&'a CtxInner> {
    if pd.is_null() {
        return None;
    }
    // SAFETY: a live PD records its live context.
    unsafe { udp_context((*pd).context) }
}

/// `ibv_alloc_pd`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard(std::ptr::null_mut(), || {
        // SAFETY: a context we opened (or NULL).
        let Some(c) = (unsafe { udp_context(context) }) else {
            return null_with(libc::EINVAL);
        };
        match c.udp.alloc_pd() {
            Ok(udp) => {
                let pd = ibv_pd {
                    context,
                    handle: udp.handle(),
                };
                // SAFETY: a context we opened.
                unsafe { retain(context) };
                Box::into_raw(Box::new(SvPd { pd, udp })).cast()
            }
            Err(e) => null_with(e.errno()),
        }
    })
}

/// `ibv_dealloc_pd`: `EBUSY` while MRs, QPs, SRQs or AHs use it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live PD of ours (or NULL).
        let Some(udp) = (unsafe { pd_udp(pd) }) else {
            return libc::EINVAL;
        };
        match udp.destroy() {
            Ok(()) => {
                // SAFETY: a live PD's context is kept alive while it has objects.
                unsafe { release((*pd).context) };
                // SAFETY: allocated by ibv_alloc_pd; the caller gives it up.
                drop(unsafe { Box::from_raw(pd.cast::<SvPd>()) });
                0
            }
            Err(e) => e.errno(),
        }
    })
}

// ---- MR ------------------------------------------------------------------------------------

/// A memory region over the application's own buffer.
#[repr(C)]
pub struct SvMr {
    /// The public part.
    pub mr: ibv_mr,
    pub(crate) udp: UdpMr,
}

fn reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: u32) -> *mut ibv_mr {
    // SAFETY: a live PD of ours (or NULL).
    let Some(udp_pd) = (unsafe { pd_udp(pd) }) else {
        return null_with(libc::EINVAL);
    };
    // SAFETY: same PD.
    let Some(c) = (unsafe { pd_ctx(pd) }) else {
        return null_with(libc::EINVAL);
    };
    let access = AccessFlags::from_bits_retain(access & !IBV_ACCESS_OPTIONAL_RANGE);
    // SAFETY: libibverbs' contract for ibv_reg_mr: the application keeps `addr..addr+length`
    // mapped and valid until ibv_dereg_mr, exactly what reg_mr_raw requires.
    let r = unsafe { c.udp.reg_mr_raw(udp_pd, addr.cast(), length, access) };
    match r {
        Ok(udp) => {
            let mr = ibv_mr {
                // SAFETY: a live PD.
                context: unsafe { (*pd).context },
                pd,
                addr,
                length,
                handle: udp.lkey(),
                lkey: udp.lkey(),
                rkey: udp.rkey(),
            };
            // SAFETY: the PD's live context.
            unsafe { retain(mr.context) };
            Box::into_raw(Box::new(SvMr { mr, udp })).cast()
        }
        Err(e) => null_with(e.errno()),
    }
}

/// `ibv_reg_mr`: registers the application's buffer; peers' WRITEs land in it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        reg_mr(pd, addr, length, access as u32)
    })
}

/// `ibv_reg_mr_iova2`: only `iova == addr` is supported (`EOPNOTSUPP` otherwise).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        if iova != addr as u64 {
            return null_with(libc::EOPNOTSUPP);
        }
        reg_mr(pd, addr, length, access)
    })
}

/// `ibv_reg_mr_iova`: as `ibv_reg_mr_iova2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: same contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, iova, access as c_uint) }
}

/// `ibv_dereg_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        let sv = mr.cast::<SvMr>();
        if sv.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live MR of ours; only the private part is borrowed.
        match unsafe { &(*sv).udp }.destroy() {
            Ok(()) => {
                // SAFETY: a live MR's context is kept alive while it has objects.
                unsafe { release((*mr).context) };
                // SAFETY: allocated by reg_mr; the caller gives it up.
                drop(unsafe { Box::from_raw(sv) });
                0
            }
            Err(e) => e.errno(),
        }
    })
}

// ---- completion channel --------------------------------------------------------------------

/// A completion channel; `fd` is the UDP channel's real descriptor.
#[repr(C)]
pub struct SvChannel {
    /// The public part.
    pub ch: ibv_comp_channel,
    pub(crate) udp: UdpChannel,
}

/// # Safety
///
/// `ch` is NULL or a live channel of this library.
unsafe fn channel_udp<'a>(ch: *mut ibv_comp_channel) -> Option<&'a UdpChannel> {
    let sv = ch.cast::<SvChannel>();
    // SAFETY: per the contract; only the private part is borrowed.
    (!sv.is_null()).then(|| unsafe { &(*sv).udp })
}

/// `ibv_create_comp_channel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(std::ptr::null_mut(), || {
        // SAFETY: a context we opened (or NULL).
        let Some(c) = (unsafe { udp_context(context) }) else {
            return null_with(libc::EINVAL);
        };
        match c.udp.create_comp_channel() {
            Ok(udp) => {
                use std::os::fd::AsRawFd;
                // libibverbs' channel fd blocks until the application makes it non-blocking;
                // the device's is non-blocking, and only ever read when a byte is pending.
                let fd = udp.as_raw_fd();
                // SAFETY: F_GETFL/F_SETFL on the channel's live descriptor.
                unsafe {
                    let fl = libc::fcntl(fd, libc::F_GETFL);
                    if fl >= 0 {
                        libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
                    }
                }
                let ch = ibv_comp_channel {
                    context,
                    fd: udp.as_raw_fd(),
                    refcnt: 0,
                };
                // SAFETY: a context we opened.
                unsafe { retain(context) };
                Box::into_raw(Box::new(SvChannel { ch, udp })).cast()
            }
            Err(e) => null_with(e.errno()),
        }
    })
}

/// `ibv_destroy_comp_channel`: `EBUSY` while a CQ uses it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live channel of ours (or NULL).
        let Some(udp) = (unsafe { channel_udp(channel) }) else {
            return libc::EINVAL;
        };
        match udp.destroy() {
            Ok(()) => {
                // SAFETY: a live channel's context is kept alive while it has objects.
                unsafe { release((*channel).context) };
                // SAFETY: allocated by ibv_create_comp_channel; the caller gives it up.
                drop(unsafe { Box::from_raw(channel.cast::<SvChannel>()) });
                0
            }
            Err(e) => e.errno(),
        }
    })
}

// ---- CQ ------------------------------------------------------------------------------------

/// Completions taken from the device for `ibv_start_poll`/`ibv_next_poll`, not yet consumed.
#[derive(Default)]
struct Cursor {
    buf: Vec<WorkCompletion>,
    pos: usize,
}

/// The private part of a CQ.
pub(crate) struct CqInner {
    pub(crate) udp: UdpCq,
    cursor: Mutex<Cursor>,
    /// The work completions `read_*` report on (`ibv_cq_ex` polling).
    current: Mutex<WorkCompletion>,
}

/// A completion queue: an `ibv_cq_ex` (whose prefix is the classic `ibv_cq`), for both
/// `ibv_create_cq` and `ibv_create_cq_ex`.
#[repr(C)]
pub struct SvCq {
    /// The public part.
    pub cq: ibv_cq_ex,
    pub(crate) inner: CqInner,
}

/// # Safety
///
/// `cq` is NULL or a live CQ of this library (`ibv_cq` or `ibv_cq_ex` pointer).
pub(crate) unsafe fn cq_inner<'a, T>(cq: *mut T) -> Option<&'a CqInner> {
    let sv = cq.cast::<SvCq>();
    // SAFETY: per the contract; only the private part is borrowed.
    (!sv.is_null()).then(|| unsafe { &(*sv).inner })
}

const CQ_POLL_BATCH: usize = 16;

/// Fills `cq`'s extended polling ops.
fn fill_cq_ex_ops(cq: &mut ibv_cq_ex) {
    cq.start_poll = Some(cq_start_poll);
    cq.next_poll = Some(cq_next_poll);
    cq.end_poll = Some(cq_end_poll);
    cq.read_opcode = Some(cq_read_opcode);
    cq.read_vendor_err = Some(cq_read_vendor_err);
    cq.read_byte_len = Some(cq_read_byte_len);
    cq.read_imm_data = Some(cq_read_imm_data);
    cq.read_qp_num = Some(cq_read_qp_num);
    cq.read_src_qp = Some(cq_read_src_qp);
    cq.read_wc_flags = Some(cq_read_wc_flags);
    cq.read_slid = Some(cq_read_slid);
    cq.read_sl = Some(cq_read_sl);
    cq.read_dlid_path_bits = Some(cq_read_dlid_path_bits);
}

fn new_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut SvCq, c_int> {
    // SAFETY: a context we opened (or NULL).
    let c = unsafe { udp_context(context) }.ok_or(libc::EINVAL)?;
    // SAFETY: same context; `num_comp_vectors` is a public field set at open.
    if comp_vector < 0 || comp_vector >= unsafe { (*context).num_comp_vectors } {
        return Err(libc::EINVAL);
    }
    let cqe = u32::try_from(cqe).map_err(|_| libc::EINVAL)?;
    // SAFETY: a live channel of ours (or NULL).
    let ch = unsafe { channel_udp(channel) };
    let udp = c.udp.create_cq(cqe, ch).map_err(|e| e.errno())?;
    // SAFETY: ibv_cq_ex is pointers, integers, Option<fn> and pthread objects whose all-zero
    // pattern is their static initializer on glibc: all-zero is valid.
    let mut pubcq: ibv_cq_ex = unsafe { std::mem::zeroed() };
    pubcq.context = context;
    pubcq.channel = channel;
    pubcq.cq_context = cq_context;
    pubcq.handle = udp.handle();
    pubcq.cqe = c_int::try_from(udp.capacity()).unwrap_or(c_int::MAX);
    fill_cq_ex_ops(&mut pubcq);
    let handle = udp.handle();
    let sv = Box::into_raw(Box::new(SvCq {
        cq: pubcq,
        inner: CqInner {
            udp,
            cursor: Mutex::new(Cursor::default()),
            current: Mutex::new(WorkCompletion::default()),
        },
    }));
    if let Ok(mut m) = c.maps.lock() {
        m.cqs.insert(handle, sv as usize);
    }
    // SAFETY: a context we opened.
    unsafe { retain(context) };
    Ok(sv)
}

/// `ibv_create_cq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard(std::ptr::null_mut(), || {
        match new_cq(context, cqe, cq_context, channel, comp_vector) {
            Ok(sv) => sv.cast(),
            Err(e) => null_with(e),
        }
    })
}

/// The `ibv_create_cq_wc_flags` softverbs reports (`IBV_WC_STANDARD_FLAGS`).
const WC_STANDARD_FLAGS: u64 = 0x7f;
/// `IBV_CQ_INIT_ATTR_MASK_FLAGS`.
const CQ_INIT_ATTR_MASK_FLAGS: u32 = 1;

/// `verbs_context.create_cq_ex`: standard `wc_flags` only (timestamps, CVLAN, flow tag and tag
/// matching → `EOPNOTSUPP`), no parent domain.
pub unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(std::ptr::null_mut(), || {
        if attr.is_null() {
            return null_with(libc::EINVAL);
        }
        // SAFETY: the caller's attribute struct.
        let a = unsafe { *attr };
        if a.comp_mask & !CQ_INIT_ATTR_MASK_FLAGS != 0 || a.wc_flags & !WC_STANDARD_FLAGS != 0 {
            return null_with(libc::EOPNOTSUPP);
        }
        let Ok(cqe) = c_int::try_from(a.cqe) else {
            return null_with(libc::EINVAL);
        };
        let Ok(vector) = c_int::try_from(a.comp_vector) else {
            return null_with(libc::EINVAL);
        };
        match new_cq(context, cqe, a.cq_context, a.channel, vector) {
            Ok(sv) => sv.cast(),
            Err(e) => null_with(e),
        }
    })
}

/// `ibv_destroy_cq`: `EBUSY` while a QP uses it or events are unacknowledged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live CQ of ours (or NULL).
        let Some(inner) = (unsafe { cq_inner(cq) }) else {
            return libc::EINVAL;
        };
        let handle = inner.udp.handle();
        if let Err(e) = inner.udp.destroy() {
            return e.errno();
        }
        // SAFETY: a live CQ records its live context.
        if let Some(c) = unsafe { udp_context((*cq).context) }
            && let Ok(mut m) = c.maps.lock()
        {
            m.cqs.remove(&handle);
        }
        // SAFETY: as above.
        unsafe { release((*cq).context) };
        // SAFETY: allocated by new_cq; the caller gives it up.
        drop(unsafe { Box::from_raw(cq.cast::<SvCq>()) });
        0
    })
}

/// `ibv_resize_cq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live CQ of ours (or NULL).
        let Some(inner) = (unsafe { cq_inner(cq) }) else {
            return libc::EINVAL;
        };
        let Ok(n) = u32::try_from(cqe) else {
            return libc::EINVAL;
        };
        match inner.udp.resize(n) {
            Ok(()) => {
                // SAFETY: a live CQ; `cqe` is the public field apps read.
                unsafe { (*cq).cqe = c_int::try_from(inner.udp.capacity()).unwrap_or(cqe) };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// `ops.poll_cq`: up to `num_entries` completions, or a negative errno.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: a live CQ of ours (or NULL).
        let Some(inner) = (unsafe { cq_inner(cq) }) else {
            return -libc::EINVAL;
        };
        let want = usize::try_from(num_entries).unwrap_or(0);
        if want > 0 && wc.is_null() {
            return -libc::EINVAL;
        }
        let mut done = 0usize;
        // Completions an ibv_start_poll/ibv_next_poll session took from the device but did not
        // consume come first.
        if let Ok(mut cur) = inner.cursor.lock() {
            while done < want && cur.pos < cur.buf.len() {
                let w = cur.buf[cur.pos];
                // SAFETY: the caller's array has `num_entries` entries; done < want.
                unsafe { wc.add(done).write(convert::wc_to(&w)) };
                cur.pos += 1;
                done += 1;
            }
        }
        let mut buf = [WorkCompletion::default(); CQ_POLL_BATCH];
        while done < want {
            let chunk = (want - done).min(CQ_POLL_BATCH);
            let n = match inner.udp.poll(&mut buf[..chunk]) {
                Ok(n) => n,
                Err(e) if done == 0 => return -e.errno(),
                Err(_) => break,
            };
            for (i, w) in buf[..n].iter().enumerate() {
                // SAFETY: the caller's array has `num_entries` entries; done + i < want.
                unsafe { wc.add(done + i).write(convert::wc_to(w)) };
            }
            done += n;
            if n < chunk {
                break;
            }
        }
        c_int::try_from(done).unwrap_or(c_int::MAX)
    })
}

/// `ops.req_notify_cq`.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live CQ of ours (or NULL).
        let Some(inner) = (unsafe { cq_inner(cq) }) else {
            return libc::EINVAL;
        };
        match inner.udp.req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

/// The CQ handle of the channel's next event: waits unless `fd` is non-blocking (`EAGAIN`).
fn next_cq_event(udp: &UdpChannel, fd: c_int) -> Result<u32, c_int> {
    loop {
        match udp.get_cq_event() {
            Ok(Some(h)) => return Ok(h),
            Ok(None) if fd_nonblocking(fd) => return Err(libc::EAGAIN),
            Ok(None) => match udp.wait_cq_event(None) {
                Ok(Some(h)) => return Ok(h),
                Ok(None) => wait_readable(fd),
                Err(e) => return Err(e.errno()),
            },
            Err(e) => return Err(e.errno()),
        }
    }
}

/// `ibv_get_cq_event`: the CQ of the next event on `channel` and its `cq_context`; blocks
/// unless the channel's fd was made non-blocking (then −1 with `EAGAIN`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live channel of ours (or NULL).
        let Some(udp) = (unsafe { channel_udp(channel) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if cq.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: a live channel records its fd and context.
        let (fd, context) = unsafe { ((*channel).fd, (*channel).context) };
        // Events of CQs destroyed since are skipped.
        let p = loop {
            let handle = match next_cq_event(udp, fd) {
                Ok(h) => h,
                Err(e) => {
                    set_errno(e);
                    return -1;
                }
            };
            // SAFETY: a live channel's context is live.
            let found = unsafe { udp_context(context) }
                .and_then(|c| c.maps.lock().ok().and_then(|m| m.cqs.get(&handle).copied()));
            match found {
                Some(p) => break p,
                None => crate::debug(|| format!("ibv_get_cq_event: dropped event of CQ {handle}")),
            }
        };
        let p = p as *mut ibv_cq;
        // SAFETY: the caller's out-pointers; `p` is a live CQ (in the map until destroyed).
        unsafe {
            cq.write(p);
            cq_context.write((*p).cq_context);
        }
        0
    })
}

/// `ibv_ack_cq_events`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    guard((), || {
        // SAFETY: a live CQ of ours (or NULL).
        if let Some(inner) = unsafe { cq_inner(cq) } {
            inner.udp.ack_events(nevents);
        }
    })
}

/// Moves the cursor to the next completion, refilling from the device; `ENOENT` when empty.
fn cq_advance(cq: *mut ibv_cq_ex, first: bool) -> c_int {
    // SAFETY: a live CQ of ours (or NULL).
    let Some(inner) = (unsafe { cq_inner(cq) }) else {
        return libc::EINVAL;
    };
    let Ok(mut cur) = inner.cursor.lock() else {
        return libc::EIO;
    };
    if !first {
        cur.pos += 1;
    }
    if cur.pos >= cur.buf.len() {
        cur.buf.clear();
        cur.buf.resize(CQ_POLL_BATCH, WorkCompletion::default());
        let n = match inner.udp.poll(&mut cur.buf) {
            Ok(n) => n,
            Err(e) => {
                cur.buf.clear();
                return e.errno();
            }
        };
        cur.buf.truncate(n);
        cur.pos = 0;
        if n == 0 {
            // The device yielded the CPU if this thread keeps polling in vain (as for
            // `ibv_poll_cq`).
            return libc::ENOENT;
        }
    }
    let w = cur.buf[cur.pos];
    if let Ok(mut c) = inner.current.lock() {
        *c = w;
    }
    // SAFETY: a live CQ; `status`/`wr_id` are the public fields ibv_cq_ex readers use.
    unsafe {
        (*cq).status = w.status as u32;
        (*cq).wr_id = w.wr_id;
    }
    0
}

unsafe extern "C" fn cq_start_poll(cq: *mut ibv_cq_ex, _attr: *mut ibv_poll_cq_attr) -> c_int {
    guard(libc::EIO, || cq_advance(cq, true))
}

unsafe extern "C" fn cq_next_poll(cq: *mut ibv_cq_ex) -> c_int {
    guard(libc::EIO, || cq_advance(cq, false))
}

unsafe extern "C" fn cq_end_poll(cq: *mut ibv_cq_ex) {
    guard((), || {
        // SAFETY: a live CQ of ours (or NULL).
        if let Some(inner) = unsafe { cq_inner(cq) }
            && let Ok(mut cur) = inner.cursor.lock()
        {
            // The current completion is consumed; the next start_poll begins after it.
            cur.pos += 1;
        }
    })
}

fn current(cq: *mut ibv_cq_ex) -> WorkCompletion {
    // SAFETY: a live CQ of ours (or NULL).
    unsafe { cq_inner(cq) }
        .and_then(|i| i.current.lock().ok().map(|c| *c))
        .unwrap_or_default()
}

unsafe extern "C" fn cq_read_opcode(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || current(cq).opcode as u32)
}
unsafe extern "C" fn cq_read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || current(cq).vendor_err)
}
unsafe extern "C" fn cq_read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || current(cq).byte_len)
}
unsafe extern "C" fn cq_read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || convert::imm_or_invalidated(&current(cq)))
}
unsafe extern "C" fn cq_read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || current(cq).qp_num)
}
unsafe extern "C" fn cq_read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || current(cq).src_qp)
}
unsafe extern "C" fn cq_read_wc_flags(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || current(cq).wc_flags.bits())
}
unsafe extern "C" fn cq_read_slid(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || u32::from(current(cq).slid))
}
unsafe extern "C" fn cq_read_sl(cq: *mut ibv_cq_ex) -> u8 {
    guard(0, || current(cq).sl)
}
unsafe extern "C" fn cq_read_dlid_path_bits(_cq: *mut ibv_cq_ex) -> u8 {
    0
}

// ---- SRQ -----------------------------------------------------------------------------------

/// A shared receive queue.
#[repr(C)]
pub struct SvSrq {
    /// The public part.
    pub srq: ibv_srq,
    pub(crate) udp: UdpSrq,
}

/// # Safety
///
/// `srq` is NULL or a live SRQ of this library.
pub(crate) unsafe fn srq_udp<'a>(srq: *mut ibv_srq) -> Option<&'a UdpSrq> {
    let sv = srq.cast::<SvSrq>();
    // SAFETY: per the contract; only the private part is borrowed.
    (!sv.is_null()).then(|| unsafe { &(*sv).udp })
}

fn srq_attr_to(a: &SrqAttr) -> ibv_srq_attr {
    ibv_srq_attr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

/// `ibv_create_srq`: writes the granted capacities back into `srq_init_attr->attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    srq_init_attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(std::ptr::null_mut(), || {
        // SAFETY: a live PD of ours (or NULL).
        let (Some(udp_pd), Some(c)) = (unsafe { pd_udp(pd) }, unsafe { pd_ctx(pd) }) else {
            return null_with(libc::EINVAL);
        };
        if srq_init_attr.is_null() {
            return null_with(libc::EINVAL);
        }
        // SAFETY: the caller's attribute struct.
        let init = unsafe { *srq_init_attr };
        let attr = SrqAttr {
            max_wr: init.attr.max_wr,
            max_sge: init.attr.max_sge,
            srq_limit: init.attr.srq_limit,
        };
        let udp = match c.udp.create_srq(udp_pd, &attr) {
            Ok(s) => s,
            Err(e) => return null_with(e.errno()),
        };
        if let Ok(granted) = udp.query() {
            // SAFETY: the caller's attribute struct.
            unsafe { (*srq_init_attr).attr = srq_attr_to(&granted) };
        }
        // SAFETY: ibv_srq is pointers, integers and pthread objects: all-zero is valid.
        let mut pubsrq: ibv_srq = unsafe { std::mem::zeroed() };
        // SAFETY: a live PD.
        pubsrq.context = unsafe { (*pd).context };
        pubsrq.srq_context = init.srq_context;
        pubsrq.pd = pd;
        pubsrq.handle = udp.handle();
        let handle = udp.handle();
        let sv = Box::into_raw(Box::new(SvSrq { srq: pubsrq, udp }));
        if let Ok(mut m) = c.maps.lock() {
            m.srqs.insert(handle, sv as usize);
        }
        // SAFETY: the PD's live context.
        unsafe { retain((*pd).context) };
        sv.cast()
    })
}

/// `ibv_modify_srq`: `IBV_SRQ_LIMIT` arms the limit event; resizing (`IBV_SRQ_MAX_WR`) is not
/// supported (`EOPNOTSUPP`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    srq_attr: *mut ibv_srq_attr,
    srq_attr_mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live SRQ of ours (or NULL).
        let Some(udp) = (unsafe { srq_udp(srq) }) else {
            return libc::EINVAL;
        };
        if srq_attr.is_null() {
            return libc::EINVAL;
        }
        if srq_attr_mask & !IBV_SRQ_LIMIT != 0 {
            return libc::EOPNOTSUPP;
        }
        if srq_attr_mask & IBV_SRQ_LIMIT == 0 {
            return 0;
        }
        // SAFETY: the caller's attribute struct.
        let limit = unsafe { (*srq_attr).srq_limit };
        match udp.arm_limit(limit) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

/// `ibv_query_srq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, srq_attr: *mut ibv_srq_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live SRQ of ours (or NULL).
        let Some(udp) = (unsafe { srq_udp(srq) }) else {
            return libc::EINVAL;
        };
        if srq_attr.is_null() {
            return libc::EINVAL;
        }
        match udp.query() {
            Ok(a) => {
                // SAFETY: the caller's attribute struct.
                unsafe { srq_attr.write(srq_attr_to(&a)) };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// `ibv_destroy_srq`: `EBUSY` while a QP uses it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live SRQ of ours (or NULL).
        let Some(udp) = (unsafe { srq_udp(srq) }) else {
            return libc::EINVAL;
        };
        let handle = udp.handle();
        if let Err(e) = udp.destroy() {
            return e.errno();
        }
        // SAFETY: a live SRQ records its live context.
        if let Some(c) = unsafe { udp_context((*srq).context) }
            && let Ok(mut m) = c.maps.lock()
        {
            m.srqs.remove(&handle);
        }
        // SAFETY: as above.
        unsafe { release((*srq).context) };
        // SAFETY: allocated by ibv_create_srq; the caller gives it up.
        drop(unsafe { Box::from_raw(srq.cast::<SvSrq>()) });
        0
    })
}

/// `ops.post_srq_recv`.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live SRQ of ours (or NULL).
        let Some(udp) = (unsafe { srq_udp(srq) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller's WR list, per ibv_post_srq_recv's contract.
        unsafe { crate::qp::post_recv_list(wr, bad_wr, |wrs| udp.post_recv(wrs)) }
    })
}

/// `verbs_context.get_srq_num`: the SRQ's handle.
pub unsafe extern "C" fn get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live SRQ of ours (or NULL).
        let Some(udp) = (unsafe { srq_udp(srq) }) else {
            return libc::EINVAL;
        };
        if srq_num.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller's u32.
        unsafe { srq_num.write(udp.handle()) };
        0
    })
}

// ---- AH ------------------------------------------------------------------------------------

/// The UDP device's address handle.
type UdpAh = <emu_udp::UdpContext as Context>::Ah;

/// An address handle: where a UD send goes (`wr.ud.ah`, `ibv_wr_set_ud_addr`).
#[repr(C)]
pub struct SvAh {
    /// The public part.
    pub ah: ibv_ah,
    udp: UdpAh,
}

/// The handle of the device AH behind an `ibv_ah` (NULL → `None`): what a UD work request
/// carries ([`verbs_api::UdDest::ah`]).
///
/// # Safety
///
/// `ah` is NULL or a live AH of this library.
pub(crate) unsafe fn ah_handle(ah: *mut ibv_ah) -> Option<u32> {
    let sv = ah.cast::<SvAh>();
    // SAFETY: per the contract; only the private part is borrowed.
    (!sv.is_null()).then(|| unsafe { &(*sv).udp }.handle())
}

/// Creates an AH in `pd` from the caller's attributes.
fn new_ah(pd: *mut ibv_pd, attr: &ibv_ah_attr) -> Result<*mut SvAh, c_int> {
    // SAFETY: a live PD of ours (or NULL).
    let (Some(udp_pd), Some(c)) = (unsafe { pd_udp(pd) }, unsafe { pd_ctx(pd) }) else {
        return Err(libc::EINVAL);
    };
    // Every softverbs port is RoCE: an address needs the GRH (the peer's GID).
    if attr.is_global == 0 {
        return Err(libc::EINVAL);
    }
    let udp = c
        .udp
        .create_ah(udp_pd, &convert::ah_from(attr))
        .map_err(|e| e.errno())?;
    // SAFETY: a live PD records its live context.
    let context = unsafe { (*pd).context };
    let ah = ibv_ah {
        context,
        pd,
        handle: udp.handle(),
    };
    // SAFETY: the PD's live context.
    unsafe { retain(context) };
    Ok(Box::into_raw(Box::new(SvAh { ah, udp })))
}

/// `ibv_create_ah`: `EINVAL` without a GRH (RoCE needs one), for a port other than 1 or a
/// GID index outside the table. `grh.dgid` `::ffff:a.b.c.d` names the peer `a.b.c.d:4791`.
/// The PD is busy (`ibv_dealloc_pd` → `EBUSY`) until the AH is destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        if attr.is_null() {
            return null_with(libc::EINVAL);
        }
        // SAFETY: the caller's attribute struct.
        match new_ah(pd, unsafe { &*attr }) {
            Ok(sv) => sv.cast(),
            Err(e) => null_with(e),
        }
    })
}

/// `ibv_destroy_ah`: datagrams already posted with it still go out (the address was copied at
/// post time); later posts naming it fail with `EINVAL`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard(libc::EIO, || {
        let sv = ah.cast::<SvAh>();
        if sv.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live AH of ours; only the private part is borrowed.
        if let Err(e) = unsafe { &(*sv).udp }.destroy() {
            return e.errno();
        }
        // SAFETY: a live AH's context is kept alive while it has objects.
        unsafe { release((*ah).context) };
        // SAFETY: allocated by new_ah; the caller gives it up.
        drop(unsafe { Box::from_raw(sv) });
        0
    })
}

/// The address handle attributes answering the datagram of `wc` whose receive buffer starts
/// with `grh` (`ibv_init_ah_from_wc`'s rule, for RoCEv2: the GRH's source GID becomes `dgid`).
fn ah_attr_from_wc(wc: &ibv_wc, grh: &[u8], port_num: u8) -> Result<ibv_ah_attr, c_int> {
    let w = WorkCompletion {
        wc_flags: verbs_api::WcFlags::from_bits_truncate(wc.wc_flags),
        sl: wc.sl,
        ..WorkCompletion::default()
    };
    let a = verbs_api::init_ah_from_wc(&w, grh, port_num).map_err(|e| e.errno())?;
    Ok(ibv_ah_attr {
        dlid: wc.slid,
        src_path_bits: wc.dlid_path_bits,
        ..convert::ah_to(&a)
    })
}

/// The 40 bytes of `struct ibv_grh` at `grh` (NULL → `EINVAL`).
///
/// # Safety
///
/// `grh` is NULL or names 40 readable bytes.
unsafe fn grh_bytes<'a>(grh: *const c_void) -> Result<&'a [u8], c_int> {
    if grh.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    Ok(unsafe { std::slice::from_raw_parts(grh.cast::<u8>(), verbs_api::GRH_LEN) })
}

/// `ibv_init_ah_from_wc`: fills `ah_attr` to answer the datagram of `wc` (which must have
/// `IBV_WC_GRH`), whose GRH is `grh` (for RoCEv2 over IPv4, the IPv4 header in its last 20
/// bytes, as rdma-core parses it). 0, or −1 with `errno` (as its man page says): `EINVAL` for
/// a completion without a GRH or a GRH holding neither an IPv4 nor an IPv6 header.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    let fail = |e| {
        set_errno(e);
        -1
    };
    guard(-1, || {
        // SAFETY: a context we opened (or NULL).
        if unsafe { udp_context(context) }.is_none() || wc.is_null() || ah_attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's GRH (40 bytes) and completion.
        let attr =
            unsafe { grh_bytes(grh) }.and_then(|g| ah_attr_from_wc(unsafe { &*wc }, g, port_num));
        match attr {
            Ok(a) => {
                // SAFETY: the caller's out-struct.
                unsafe { ah_attr.write(a) };
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// `ibv_create_ah_from_wc`: `ibv_init_ah_from_wc`, then `ibv_create_ah` in `pd`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    port_num: u8,
) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        if wc.is_null() {
            return null_with(libc::EINVAL);
        }
        // SAFETY: the caller's GRH (40 bytes) and completion.
        let attr = unsafe { grh_bytes(grh) }
            .and_then(|g| ah_attr_from_wc(unsafe { &*wc }, g, port_num))
            .and_then(|a| new_ah(pd, &a));
        match attr {
            Ok(sv) => sv.cast(),
            Err(e) => null_with(e),
        }
    })
}
