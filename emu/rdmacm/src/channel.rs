//! Event channels: `rdma_create_event_channel` … `rdma_ack_cm_event`, `rdma_event_str`.
//!
//! A channel is an `rdma_event_channel` whose `fd` is an eventfd in semaphore mode: each
//! queued event adds one, so the fd polls readable while events wait; `rdma_get_cm_event`
//! reads one (blocking, unless the program made the fd non-blocking: then `EAGAIN`) and pops
//! the event. Events of an id destroyed before they were read are skipped. A channel pointer
//! the library did not hand out, or one already destroyed, is refused (`EINVAL`) rather than
//! dereferenced: programs do pass them (perftest 4.5's client retries a refused connection
//! on the ids and channel it has just destroyed). What it is not: the producer of events (the
//! [`crate::id`] and [`crate::agent`] calls queue them).

use std::collections::{BTreeSet, VecDeque};
use std::ffi::{c_char, c_int, c_void};
use std::sync::Mutex;

use crate::abi::*;
use crate::{fail, guard, set_errno};

/// A channel as this library allocates it: the public part first.
#[repr(C)]
pub struct SvChannel {
    /// The public part (`fd`).
    pub ch: rdma_event_channel,
    queue: Mutex<VecDeque<Box<SvEvent>>>,
}

/// An event as this library allocates it: the public part first, then what its pointers
/// reference.
#[repr(C)]
pub struct SvEvent {
    /// The public part.
    pub ev: rdma_cm_event,
    /// The private data `ev.param.conn.private_data` points into.
    pub private_data: Vec<u8>,
}

impl SvEvent {
    /// An event of `kind` for `id` with `status` and no parameters.
    pub fn new(id: *mut rdma_cm_id, kind: c_int, status: c_int) -> Box<SvEvent> {
        Box::new(SvEvent {
            ev: rdma_cm_event {
                id,
                listen_id: std::ptr::null_mut(),
                event: kind,
                status,
                param: rdma_cm_event_param {
                    conn: rdma_conn_param {
                        private_data: std::ptr::null(),
                        private_data_len: 0,
                        responder_resources: 0,
                        initiator_depth: 0,
                        flow_control: 0,
                        retry_count: 0,
                        rnr_retry_count: 0,
                        srq: 0,
                        qp_num: 0,
                    },
                },
            },
            private_data: Vec::new(),
        })
    }

    /// Attaches connection parameters and private data (`conn` pointing into the event).
    pub fn with_conn(mut self: Box<Self>, mut conn: rdma_conn_param, pd: &[u8]) -> Box<Self> {
        self.private_data = pd.to_vec();
        conn.private_data = if pd.is_empty() {
            std::ptr::null()
        } else {
            self.private_data.as_ptr() as *const c_void
        };
        conn.private_data_len = pd.len().min(255) as u8;
        self.ev.param.conn = conn;
        self
    }
}

/// The addresses of the channels [`new_channel`] made and [`free_channel`] has not freed.
static LIVE: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

fn live() -> std::sync::MutexGuard<'static, BTreeSet<usize>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `ch` is a channel of this library that has not been destroyed.
pub fn is_live(ch: *const rdma_event_channel) -> bool {
    live().contains(&(ch as usize))
}

/// A new channel (boxed; `None` when no eventfd could be made).
pub fn new_channel() -> Option<*mut SvChannel> {
    // SAFETY: plain eventfd creation.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        return None;
    }
    let ch = Box::into_raw(Box::new(SvChannel {
        ch: rdma_event_channel { fd },
        queue: Mutex::new(VecDeque::new()),
    }));
    live().insert(ch as usize);
    Some(ch)
}

/// Frees a channel made by [`new_channel`]; a pointer that is not a live channel (already
/// freed, or never ours) is left alone and `false` returned.
///
/// # Safety
/// `ch` is not used afterwards.
pub unsafe fn free_channel(ch: *mut rdma_event_channel) -> bool {
    if !live().remove(&(ch as usize)) {
        return false;
    }
    // SAFETY: a live channel of this library: a boxed SvChannel (public part first).
    let ch = unsafe { Box::from_raw(ch as *mut SvChannel) };
    // SAFETY: the channel's own eventfd.
    unsafe { libc::close(ch.ch.fd) };
    true
}

/// Queues `ev` on `ch` and makes the fd readable; drops it when `ch` is not a live channel
/// (the program destroyed it before its ids).
///
/// # Safety
/// `ch` is NULL or points to memory the program has not unmapped.
pub unsafe fn post(ch: *mut rdma_event_channel, ev: Box<SvEvent>) {
    let live = live();
    if !live.contains(&(ch as usize)) {
        return;
    }
    // SAFETY: a live channel, kept alive by holding the table's lock (free removes first).
    let sv = unsafe { &*(ch as *const SvChannel) };
    if let Ok(mut q) = sv.queue.lock() {
        q.push_back(ev);
    }
    let one: u64 = 1;
    // SAFETY: writes 8 bytes to the channel's eventfd.
    unsafe { libc::write(sv.ch.fd, &one as *const u64 as *const c_void, 8) };
}

/// Marks queued events of `id` dead (their id is being destroyed): the reader skips them.
/// Nothing to do when `ch` is not a live channel.
///
/// # Safety
/// `ch` is NULL or points to memory the program has not unmapped.
pub unsafe fn forget_id(ch: *mut rdma_event_channel, id: *mut rdma_cm_id) {
    let live = live();
    if !live.contains(&(ch as usize)) {
        return;
    }
    // SAFETY: a live channel, kept alive by holding the table's lock (free removes first).
    let sv = unsafe { &*(ch as *const SvChannel) };
    if let Ok(mut q) = sv.queue.lock() {
        for ev in q.iter_mut() {
            if ev.ev.id == id || ev.ev.listen_id == id {
                ev.ev.id = std::ptr::null_mut();
            }
        }
    }
}

/// The next event of `ch`, waiting for one unless the fd is non-blocking (`Err(EAGAIN)`).
///
/// # Safety
/// `ch` is a live channel of this library.
pub unsafe fn next_event(ch: *mut rdma_event_channel) -> Result<Box<SvEvent>, i32> {
    // SAFETY: per the contract.
    let sv = unsafe { &*(ch as *const SvChannel) };
    loop {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes from the channel's eventfd into `v`.
        let n = unsafe { libc::read(sv.ch.fd, &mut v as *mut u64 as *mut c_void, 8) };
        if n != 8 {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        let ev = sv.queue.lock().map_err(|_| libc::EIO)?.pop_front();
        match ev {
            Some(ev) if !ev.ev.id.is_null() => return Ok(ev),
            _ => continue,
        }
    }
}

/// `rdma_create_event_channel`: a new channel, or NULL with `errno` (the eventfd's error).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(std::ptr::null_mut(), || match new_channel() {
        Some(c) => c as *mut rdma_event_channel,
        None => std::ptr::null_mut(),
    })
}

/// `rdma_destroy_event_channel`: frees a channel (its ids must be destroyed first). A
/// pointer that is not a live channel (NULL, destroyed already) is left alone with `errno`
/// `EINVAL` (the call returns nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        // SAFETY: only a live channel is freed, and the program gives it up with this call.
        if !unsafe { free_channel(channel) } {
            set_errno(libc::EINVAL);
        }
    })
}

/// `rdma_get_cm_event`: 0 and the next event in `*event` (acknowledge it with
/// `rdma_ack_cm_event`), or −1 with `errno` (`EAGAIN` on a non-blocking fd with no event,
/// `EINVAL` for NULL arguments).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard(-1, || {
        if !is_live(channel) || event.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: a live channel of this library.
        match unsafe { next_event(channel) } {
            Ok(ev) => {
                let raw = Box::into_raw(ev);
                // SAFETY: the caller's result slot; the event's id is live (dead ones skipped).
                unsafe {
                    (*(*raw).ev.id).event = raw as *mut rdma_cm_event;
                    *event = raw as *mut rdma_cm_event;
                }
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// `rdma_ack_cm_event`: frees an event `rdma_get_cm_event` returned; 0, or −1 with `EINVAL`
/// for NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(-1, || {
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: an event of this library (boxed SvEvent, public part first).
        let ev = unsafe { Box::from_raw(event as *mut SvEvent) };
        let id = ev.ev.id;
        // The id may be destroyed already (rdma-core would have waited for this ack): clear
        // its `event` only while it is live.
        let live = !id.is_null() && crate::agent::lock().ids.contains_key(&(id as usize));
        // SAFETY: a live id of this library.
        if live && unsafe { (*id).event } == event {
            // SAFETY: as above.
            unsafe { (*id).event = std::ptr::null_mut() };
        }
        0
    })
}

/// The name librdmacm gives event `kind`.
pub fn event_name(kind: c_int) -> &'static std::ffi::CStr {
    const NAMES: [&std::ffi::CStr; 16] = [
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
    ];
    usize::try_from(kind)
        .ok()
        .and_then(|i| NAMES.get(i).copied())
        .unwrap_or(c"UNKNOWN EVENT")
}

/// `rdma_event_str`: the event's name, `"UNKNOWN EVENT"` for other values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    event_name(event).as_ptr()
}

/// Waits for the next event of a synchronous id's private channel and checks its kind:
/// `Ok(event)` when it is `want` with status 0, else `Err(errno)` (the status's errno, or
/// `ECONNREFUSED`/`ETIMEDOUT`/`EIO` for REJECTED/UNREACHABLE/other events).
///
/// # Safety
/// `ch` is a live channel of this library.
pub unsafe fn wait_for(ch: *mut rdma_event_channel, want: c_int) -> Result<Box<SvEvent>, i32> {
    // SAFETY: per the contract.
    let ev = unsafe { next_event(ch) }?;
    if ev.ev.event == want && ev.ev.status == 0 {
        return Ok(ev);
    }
    let e = match ev.ev.event {
        RDMA_CM_EVENT_REJECTED => libc::ECONNREFUSED,
        RDMA_CM_EVENT_UNREACHABLE => libc::ETIMEDOUT,
        _ if ev.ev.status < 0 => -ev.ev.status,
        _ => libc::EIO,
    };
    set_errno(e);
    Err(e)
}
