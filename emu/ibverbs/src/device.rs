//! Devices and contexts: `ibv_get_device_list` … `ibv_close_device`, the device, port and GID
//! queries, and asynchronous events.
//!
//! The process has one UDP provider, built on the first `ibv_get_device_list`:
//!
//! * `SOFTVERBS_UDP_ADDRS=ip[:port],…`: one device per address (as for the `udp` backend);
//! * unset (zero configuration): one device on a free loopback address `127.x.y.z`, port 4791,
//!   picked from the process id (the next candidate on a failed bind, at most
//!   [`ZERO_CONFIG_ATTEMPTS`]), so that two programs started in two terminals reach each other
//!   by GID (`::ffff:127.x.y.z` → `127.x.y.z:4791`);
//! * `SOFTVERBS_FAULTS=plan.toml`: a fault plan (emu-fault's TOML) every device applies to what
//!   it sends; `SOFTVERBS_PCAP=file.pcap`: a capture of the devices' traffic, completed at exit;
//!   `SOFTVERBS_SEED`: the key generators' seed; `SOFTVERBS_BUSY_POLL=1`: progress threads
//!   spin while no application thread polls; `SOFTVERBS_FOREIGN_IPV4_IDENT=1`: accept rxe's
//!   and NICs' packets (interop); `SOFTVERBS_GSO=0|1`: UDP GSO (default: on unless
//!   foreign IPv4 identifications are accepted, see [`GSO_ENV`]); `SOFTVERBS_RECOVERY=sr`:
//!   selective-repeat loss recovery on every RC QP modified to INIT ([`RECOVERY_ENV`]).
//!
//! Devices are named `softverbs0`, `softverbs1`, …: node type CA, transport IB, one port with
//! link layer Ethernet whose GID 0 is the device address, IPv4-mapped, of type RoCE v2. They
//! live until the process exits.
//!
//! A context ([`SvContext`]) is a `verbs_context` in rdma-core 65's layout (`sz` full,
//! `abi_compat` the extended sentinel) followed by the private state; its `async_fd` is an
//! eventfd a watcher thread signals for each asynchronous event.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void};
use std::mem::offset_of;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use emu_fault::FaultPlan;
use emu_udp::{UdpContext, UdpDevice, UdpProvider};
use ibverbs_sys::*;
use verbs_api::{AsyncEvent, Context, Device, EventElement, Provider, Recovery};

use crate::{convert, guard, null_with, set_errno};

/// Environment variable: the devices' addresses (`ip[:port]`, comma-separated).
pub const UDP_ADDRS_ENV: &str = "SOFTVERBS_UDP_ADDRS";
/// Environment variable: a fault plan file (TOML) applied to every device's sends.
pub const FAULTS_ENV: &str = "SOFTVERBS_FAULTS";
/// Environment variable: a pcap file capturing the devices' traffic.
pub const PCAP_ENV: &str = "SOFTVERBS_PCAP";
/// Environment variable: the seed of the devices' key generators.
pub const SEED_ENV: &str = "SOFTVERBS_SEED";
/// Environment variable: `1` starts the devices in busy-poll mode (their progress threads
/// spin while no application thread polls, instead of sleeping in `epoll_wait`). Programs
/// that wait by spinning on memory, as `ib_write_lat` does, do not need it: a datagram wakes
/// the sleeping thread (`emu_udp::APP_GRACE`).
pub const BUSY_POLL_ENV: &str = "SOFTVERBS_BUSY_POLL";
/// Environment variable: `1` accepts packets of peers with an unknown IPv4 identification
/// (Linux rxe, RoCEv2 NICs; `UdpBuilder::foreign_ipv4_ident`), for interop with them.
pub const FOREIGN_IPV4_IDENT_ENV: &str = "SOFTVERBS_FOREIGN_IPV4_IDENT";
/// Environment variable: `1` sends runs of equal-size datagrams with UDP GSO
/// (`UdpBuilder::gso`), `0` one datagram per system call. Unset: on, unless
/// [`FOREIGN_IPV4_IDENT_ENV`] is on — a peer that checks the ICRC over the real IPv4 header
/// (Linux rxe, a RoCEv2 NIC) drops the GSO segments after the first, and such a peer is
/// reachable at all only with that variable set.
pub const GSO_ENV: &str = "SOFTVERBS_GSO";
/// Environment variable: `sr` gives every RC QP the process modifies to INIT softverbs'
/// selective-repeat loss recovery (`Recovery::SelectiveRepeat`, DIVERGENCES.md "softverbs
/// extensions"); `ibta` or unset: IBTA go-back-N. Both processes of a connection must set the
/// same; see [`recovery_wanted`].
pub const RECOVERY_ENV: &str = "SOFTVERBS_RECOVERY";
/// Loopback addresses tried by the zero configuration before giving up.
pub const ZERO_CONFIG_ATTEMPTS: u32 = 64;

/// `IBV_NODE_CA`.
const IBV_NODE_CA: c_int = 1;
/// `IBV_TRANSPORT_IB`.
const IBV_TRANSPORT_IB: c_int = 0;
/// Bytes of rdma-core's `_compat_ibv_port_attr` (members up to `flags`, padded).
const COMPAT_PORT_ATTR_SIZE: usize = std::mem::offset_of!(ibv_port_attr, port_cap_flags2);
/// How often a context's watcher thread looks for asynchronous events.
const ASYNC_POLL: Duration = Duration::from_millis(20);

/// A device as applications see it: the public `ibv_device` first.
#[repr(C)]
pub struct SvDevice {
    /// The public part.
    pub dev: ibv_device,
    /// The UDP device.
    pub(crate) udp: UdpDevice,
    /// Position in the device list.
    pub(crate) index: usize,
}

/// The process's devices, as leaked `SvDevice` addresses, or why there are none.
struct Devices {
    list: Vec<usize>,
    provider: Option<UdpProvider>,
}

static DEVICES: OnceLock<Result<Devices, String>> = OnceLock::new();

fn copy_name(dst: &mut [c_char], s: &str) {
    let max = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(max)) {
        *d = b as c_char;
    }
}

/// The loopback address the zero configuration tries at `attempt`: 127.x.y.z from the process
/// id (x and z never 0 or 255).
pub fn zero_config_addr(pid: u32, attempt: u32) -> Ipv4Addr {
    let h = pid ^ attempt.wrapping_mul(0x9E37_79B9);
    let x = 1 + ((h >> 16) % 254) as u8;
    let y = (h >> 8) as u8;
    let z = 1 + (h % 254) as u8;
    Ipv4Addr::new(127, x, y, z)
}

fn base_builder() -> Result<emu_udp::UdpBuilder, String> {
    let mut b = UdpProvider::builder();
    if let Ok(path) = std::env::var(FAULTS_ENV) {
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{FAULTS_ENV}={path}: {e}"))?;
        let plan = FaultPlan::from_toml(&text).map_err(|e| format!("{FAULTS_ENV}={path}: {e}"))?;
        b = b.faults(plan);
    }
    if let Ok(path) = std::env::var(PCAP_ENV) {
        b = b.capture(path);
    }
    let on = |var| std::env::var(var).is_ok_and(|v| v.trim() == "1");
    if on(BUSY_POLL_ENV) {
        b = b.busy_poll(true);
    }
    let foreign = on(FOREIGN_IPV4_IDENT_ENV);
    if foreign {
        b = b.foreign_ipv4_ident(true);
    }
    b = b.gso(gso_wanted(std::env::var(GSO_ENV).ok().as_deref(), foreign)?);
    let recovery = recovery_wanted(std::env::var(RECOVERY_ENV).ok().as_deref())?;
    // A second provider build (none happens: the device list is built once) keeps the first.
    let _ = RECOVERY.set(recovery);
    if let Ok(seed) = std::env::var(SEED_ENV) {
        let seed = seed
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("{SEED_ENV}={seed:?} is not a number"))?;
        b = b.seed(seed);
    }
    Ok(b)
}

/// Whether the devices send with UDP GSO, from [`GSO_ENV`]'s value and whether foreign IPv4
/// identifications are accepted (see [`GSO_ENV`]).
pub fn gso_wanted(value: Option<&str>, foreign_ipv4_ident: bool) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(!foreign_ipv4_ident),
        Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(v) => Err(format!("{GSO_ENV}={v:?}: want 0 or 1")),
    }
}

/// The loss recovery [`RECOVERY_ENV`] asked for, set when the device list is built.
static RECOVERY: OnceLock<Recovery> = OnceLock::new();

/// The loss recovery of RC QPs, from [`RECOVERY_ENV`]'s value: `sr` is selective repeat,
/// `ibta` or unset (or empty) IBTA go-back-N, anything else an error (the device list is
/// then empty, as for any bad `SOFTVERBS_*` setting).
///
/// Selective repeat puts softverbs' selective ACK on the wire, so both ends must set it. A
/// standard peer (rxe, a NIC, a program on rdma-core) never sees one: it never sets the
/// variable, so a softverbs process talking to it must not either. A mismatch (one end set)
/// is the user's error: the IBTA end drops every selective ACK as malformed. A
/// selective-repeat requester still follows the IBTA responder's sequence NAKs (go-back-N);
/// an IBTA requester facing a selective-repeat responder gets neither sequence NAKs nor ACKs
/// for duplicates and recovers only by its ACK timeout, so under loss it is slow and a lost
/// final ACK can use up `retry_cnt` and fail the WR with `RETRY_EXC_ERR`. Data is still never
/// delivered twice or out of order.
pub fn recovery_wanted(value: Option<&str>) -> Result<Recovery, String> {
    match value.map(str::trim) {
        None | Some("" | "ibta") => Ok(Recovery::Ibta),
        Some("sr") => Ok(Recovery::SelectiveRepeat),
        Some(v) => Err(format!("{RECOVERY_ENV}={v:?}: want sr or ibta")),
    }
}

/// The loss recovery [`RECOVERY_ENV`] set for this process (IBTA before the device list is
/// built).
pub fn recovery() -> Recovery {
    RECOVERY.get().copied().unwrap_or_default()
}

fn build_provider() -> Result<UdpProvider, String> {
    let base = base_builder()?;
    if let Ok(list) = std::env::var(UDP_ADDRS_ENV) {
        let b = base
            .device_list(&list)
            .map_err(|e| format!("{UDP_ADDRS_ENV}: {e}"))?;
        return b.build().map_err(|e| e.to_string());
    }
    let pid = std::process::id();
    let candidates = (0..ZERO_CONFIG_ATTEMPTS)
        .map(|a| SocketAddr::new(IpAddr::V4(zero_config_addr(pid, a)), 4791));
    bind_first(&base, candidates)
}

/// A provider with one device on the first of `candidates` that binds; an address in use
/// (an `Io` error) moves on to the next, any other error stops.
fn bind_first(
    base: &emu_udp::UdpBuilder,
    candidates: impl Iterator<Item = SocketAddr>,
) -> Result<UdpProvider, String> {
    let mut last = String::from("no candidate address");
    for addr in candidates {
        match base.clone().device(addr).build() {
            Ok(p) => return Ok(p),
            Err(e) if e.kind == verbs_api::ErrorKind::Io => last = e.to_string(),
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(format!("no free loopback address: {last}"))
}

extern "C" fn finish_capture_at_exit() {
    if let Some(Ok(d)) = DEVICES.get()
        && let Some(p) = &d.provider
        && let Err(e) = p.finish_capture()
    {
        eprintln!("softverbs-ibverbs: {PCAP_ENV}: {e}");
    }
}

fn load_devices() -> Result<Devices, String> {
    let provider = build_provider()?;
    let udp = provider.devices().map_err(|e| e.to_string())?;
    let mut list = Vec::with_capacity(udp.len());
    for (index, udp) in udp.into_iter().enumerate() {
        // SAFETY: ibv_device is integers, arrays and raw pointers: all-zero is valid.
        let mut dev: ibv_device = unsafe { std::mem::zeroed() };
        dev.node_type = IBV_NODE_CA;
        dev.transport_type = IBV_TRANSPORT_IB;
        copy_name(&mut dev.name, &format!("softverbs{index}"));
        copy_name(&mut dev.dev_name, &format!("uverbs{index}"));
        copy_name(
            &mut dev.dev_path,
            &format!("/sys/class/infiniband_verbs/uverbs{index}"),
        );
        copy_name(
            &mut dev.ibdev_path,
            &format!("/sys/class/infiniband/softverbs{index}"),
        );
        let sv = Box::new(SvDevice { dev, udp, index });
        list.push(Box::into_raw(sv) as usize);
    }
    if std::env::var_os(PCAP_ENV).is_some() {
        // SAFETY: registers a plain extern "C" function with no arguments.
        unsafe { libc::atexit(finish_capture_at_exit) };
    }
    Ok(Devices {
        list,
        provider: Some(provider),
    })
}

/// The process's devices (built on first use); an error is reported once on stderr.
fn devices() -> &'static [usize] {
    let d = DEVICES.get_or_init(|| {
        let r = load_devices();
        if let Err(e) = &r {
            eprintln!("softverbs-ibverbs: no device: {e}");
        }
        r
    });
    match d {
        Ok(d) => &d.list,
        Err(_) => &[],
    }
}

/// `ibv_get_device_list`: a NULL-terminated array of the devices, freed with
/// `ibv_free_device_list`; NULL with `errno` `ENOSYS` when the provider could not start.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    guard(std::ptr::null_mut(), || {
        let list = devices();
        if list.is_empty() && DEVICES.get().is_some_and(|d| d.is_err()) {
            return null_with(libc::ENOSYS);
        }
        // SAFETY: calloc of n+1 pointers; checked for NULL below.
        let arr = unsafe { libc::calloc(list.len() + 1, size_of::<*mut ibv_device>()) }
            as *mut *mut ibv_device;
        if arr.is_null() {
            return null_with(libc::ENOMEM);
        }
        for (i, d) in list.iter().enumerate() {
            // SAFETY: `arr` holds list.len() + 1 slots; the last stays NULL.
            unsafe { *arr.add(i) = *d as *mut ibv_device };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller passes a valid int pointer or NULL.
            unsafe { *num_devices = c_int::try_from(list.len()).unwrap_or(c_int::MAX) };
        }
        arr
    })
}

/// `ibv_free_device_list`: frees the array (the devices live on).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    guard((), || {
        // SAFETY: `list` came from ibv_get_device_list's calloc (or is NULL).
        unsafe { libc::free(list as *mut c_void) };
    })
}

/// Our device behind an `ibv_device` pointer, if it is one of ours.
pub(crate) fn sv_device(dev: *mut ibv_device) -> Option<*mut SvDevice> {
    let addr = dev as usize;
    devices()
        .iter()
        .find(|d| **d == addr)
        .map(|d| *d as *mut SvDevice)
}

/// `ibv_get_device_name`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    guard(std::ptr::null(), || match sv_device(device) {
        // SAFETY: one of our leaked devices; `name` is NUL-terminated.
        Some(d) => unsafe { (*d).dev.name.as_ptr() },
        None => {
            set_errno(libc::EINVAL);
            std::ptr::null()
        }
    })
}

/// `ibv_get_device_guid`: the node GUID in network byte order (0 for a foreign device).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    guard(0, || match sv_device(device) {
        // SAFETY: one of our leaked devices.
        Some(d) => unsafe { (*d).udp.node_guid().to_be() },
        None => 0,
    })
}

/// `ibv_get_device_index`: the position in the device list, −1 for a foreign device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    guard(-1, || match sv_device(device) {
        // SAFETY: one of our leaked devices.
        Some(d) => c_int::try_from(unsafe { (*d).index }).unwrap_or(-1),
        None => -1,
    })
}

// ---- contexts ------------------------------------------------------------------------------

/// Objects of a context that events and completion channels name by number.
#[derive(Default)]
pub(crate) struct ObjMaps {
    /// CQ handle → `*mut SvCq`.
    pub(crate) cqs: HashMap<u32, usize>,
    /// QP number → `*mut SvQp`.
    pub(crate) qps: HashMap<u32, usize>,
    /// SRQ handle → `*mut SvSrq`.
    pub(crate) srqs: HashMap<u32, usize>,
}

/// Asynchronous events collected by the watcher thread, and the eventfd (semaphore mode)
/// that counts them: `ibv_context.async_fd`.
pub(crate) struct AsyncShared {
    queue: Mutex<VecDeque<AsyncEvent>>,
    fd: OwnedFd,
    /// `ibv_context.cmd_fd`: a real descriptor (an idle eventfd) that nothing reads, so that
    /// programs which `dup` it (pyverbs' import tests) get a descriptor.
    cmd_fd: OwnedFd,
    stop: AtomicBool,
}

impl AsyncShared {
    fn new() -> std::io::Result<AsyncShared> {
        let eventfd = |flags| {
            // SAFETY: plain eventfd creation; the result is checked.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | flags) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: `fd` is a fresh descriptor nobody else owns.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        };
        Ok(AsyncShared {
            queue: Mutex::new(VecDeque::new()),
            fd: eventfd(libc::EFD_SEMAPHORE)?,
            cmd_fd: eventfd(0)?,
            stop: AtomicBool::new(false),
        })
    }

    /// Queues an event and counts it on the eventfd; under the queue lock, so that the count
    /// always equals the queue length between calls.
    fn push(&self, ev: AsyncEvent) {
        let Ok(mut q) = self.queue.lock() else {
            return;
        };
        q.push_back(ev);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Takes the oldest event and uncounts it. The count is at least 1 while the queue is not
    /// empty (both change under the lock), so the read never blocks.
    fn pop(&self) -> Option<AsyncEvent> {
        let mut q = self.queue.lock().ok()?;
        let ev = q.pop_front()?;
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our eventfd (semaphore mode: takes 1).
        unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut v).cast(), 8) };
        Some(ev)
    }
}

fn watch(udp: UdpContext, shared: Arc<AsyncShared>) {
    while !shared.stop.load(Ordering::Acquire) {
        while let Some(ev) = udp.poll_async_event() {
            shared.push(ev);
        }
        std::thread::sleep(ASYNC_POLL);
    }
}

/// An open context: the public `verbs_context` (whose last member is the `ibv_context`
/// applications hold) followed by the private state.
#[repr(C)]
pub struct SvContext {
    /// The public part, rdma-core 65's layout.
    pub vctx: verbs_context,
    /// The private part.
    pub(crate) inner: CtxInner,
}

/// The private state of a context, borrowed without its public part (which the application
/// may write).
pub(crate) struct CtxInner {
    pub(crate) udp: UdpContext,
    /// Objects created from the context and not destroyed: while there are any, closing the
    /// context frees nothing their destroy calls would read.
    live: AtomicUsize,
    pub(crate) maps: Mutex<ObjMaps>,
    pub(crate) events: Arc<AsyncShared>,
    watcher: Mutex<Option<JoinHandle<()>>>,
}

const CONTEXT_OFFSET: usize = offset_of!(SvContext, vctx) + offset_of!(verbs_context, context);

/// Our context behind an `ibv_context` pointer (NULL stays NULL).
pub(crate) fn sv_context(ctx: *mut ibv_context) -> *mut SvContext {
    if ctx.is_null() {
        return std::ptr::null_mut();
    }
    ctx.wrapping_byte_sub(CONTEXT_OFFSET).cast()
}

/// The private state of an `ibv_context`, or `None` for NULL.
///
/// # Safety
///
/// `ctx` is NULL or a context this library opened and has not closed.
pub(crate) unsafe fn udp_context<'a>(ctx: *mut ibv_context) -> Option<&'a CtxInner> {
    let sv = sv_context(ctx);
    if sv.is_null() {
        return None;
    }
    // SAFETY: per the contract, `sv` is a live SvContext; only the private part is borrowed.
    Some(unsafe { &(*sv).inner })
}

/// Counts an object created from `ctx` (see [`ibv_close_device`]).
///
/// # Safety
///
/// `ctx` is NULL or a context this library opened.
pub(crate) unsafe fn retain(ctx: *mut ibv_context) {
    // SAFETY: per the contract.
    if let Some(c) = unsafe { udp_context(ctx) } {
        c.live.fetch_add(1, Ordering::AcqRel);
    }
}

/// Uncounts an object of `ctx` being destroyed.
///
/// # Safety
///
/// `ctx` is NULL or a context this library opened (kept alive while it has objects).
pub(crate) unsafe fn release(ctx: *mut ibv_context) {
    // SAFETY: per the contract.
    if let Some(c) = unsafe { udp_context(ctx) } {
        c.live.fetch_sub(1, Ordering::AcqRel);
    }
}

fn fill_ops(ops: &mut ibv_context_ops) {
    ops.poll_cq = Some(crate::objects::poll_cq);
    ops.req_notify_cq = Some(crate::objects::req_notify_cq);
    ops.post_srq_recv = Some(crate::objects::post_srq_recv);
    ops.post_send = Some(crate::qp::post_send);
    ops.post_recv = Some(crate::qp::post_recv);
    ops.alloc_mw = Some(crate::mw::alloc_mw);
    ops.bind_mw = Some(crate::mw::bind_mw);
    ops.dealloc_mw = Some(crate::mw::dealloc_mw);
}

fn new_context(dev: *mut SvDevice) -> Result<*mut SvContext, i32> {
    // SAFETY: `dev` is one of our leaked devices.
    let udp = unsafe { (*dev).udp.open() }.map_err(|e| e.errno())?;
    let events = Arc::new(AsyncShared::new().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?);
    // SAFETY: verbs_context is integers, raw pointers, Option<fn> and a pthread mutex whose
    // all-zero pattern is PTHREAD_MUTEX_INITIALIZER on glibc: all-zero is valid.
    let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
    vctx.query_port = Some(query_port_ex);
    vctx.create_cq_ex = Some(crate::objects::create_cq_ex);
    vctx.query_device_ex = Some(query_device_ex);
    vctx.create_qp_ex = Some(crate::qp::create_qp_ex);
    vctx.get_srq_num = Some(crate::objects::get_srq_num);
    vctx.sz = size_of::<verbs_context>();
    vctx.context.device = dev.cast();
    vctx.context.cmd_fd = events.cmd_fd.as_raw_fd();
    vctx.context.async_fd = events.fd.as_raw_fd();
    vctx.context.num_comp_vectors = 1;
    vctx.context.abi_compat = VERBS_ABI_IS_EXTENDED;
    fill_ops(&mut vctx.context.ops);
    let watcher = {
        let (udp, events) = (udp.clone(), events.clone());
        std::thread::Builder::new()
            .name("softverbs-async".into())
            .spawn(move || watch(udp, events))
            .map_err(|_| libc::EAGAIN)?
    };
    let sv = Box::new(SvContext {
        vctx,
        inner: CtxInner {
            udp,
            live: AtomicUsize::new(0),
            maps: Mutex::new(ObjMaps::default()),
            events,
            watcher: Mutex::new(Some(watcher)),
        },
    });
    Ok(Box::into_raw(sv))
}

/// `ibv_open_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        crate::init_tracing();
        let Some(dev) = sv_device(device) else {
            return null_with(libc::EINVAL);
        };
        match new_context(dev) {
            // SAFETY: a fresh SvContext; the ibv_context is inside it.
            Ok(sv) => unsafe { &raw mut (*sv).vctx.context },
            Err(e) => null_with(e),
        }
    })
}

/// `ibv_close_device`: stops the watcher and frees the context. A context that still has
/// objects is only stopped, not freed, so that destroying them later stays defined (libibverbs
/// leaves that undefined); its memory is leaked.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    guard(libc::EIO, || {
        let sv = sv_context(context);
        if sv.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a context we opened; the caller gives up its pointer.
        let sv = unsafe { Box::from_raw(sv) };
        sv.inner.events.stop.store(true, Ordering::Release);
        if let Some(h) = sv.inner.watcher.lock().ok().and_then(|mut w| w.take()) {
            let _ = h.join();
        }
        let live = sv.inner.live.load(Ordering::Acquire);
        if live > 0 {
            crate::debug(|| format!("ibv_close_device: {live} objects still open; not freed"));
            Box::leak(sv);
        }
        0
    })
}

// ---- queries -------------------------------------------------------------------------------

/// `ibv_query_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    device_attr: *mut ibv_device_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a context we opened (or NULL).
        let Some(c) = (unsafe { udp_context(context) }) else {
            return libc::EINVAL;
        };
        if device_attr.is_null() {
            return libc::EINVAL;
        }
        match c.udp.query_device() {
            Ok(a) => {
                // SAFETY: the caller's struct, written whole.
                unsafe { device_attr.write(convert::device_attr(&a)) };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// Copies `len` bytes (at most `size_of::<T>()`) of `value` to `dst`, zero beyond.
///
/// # Safety
///
/// `dst` is valid for `len` bytes of writes.
unsafe fn write_prefix<T>(dst: *mut u8, value: &T, len: usize) {
    let n = len.min(size_of::<T>());
    // SAFETY: `value` has size_of::<T>() bytes; `dst` has `len` ≥ n bytes.
    unsafe {
        std::ptr::copy_nonoverlapping((value as *const T).cast::<u8>(), dst, n);
        if len > n {
            std::ptr::write_bytes(dst.add(n), 0, len - n);
        }
    }
}

/// `verbs_context.query_device_ex`: the classic attributes and zeroed extensions, writing
/// `attr_size` bytes at most.
pub unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a context we opened (or NULL).
        let Some(c) = (unsafe { udp_context(context) }) else {
            return libc::EINVAL;
        };
        // SAFETY: `input` is NULL or the caller's struct.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return libc::EINVAL;
        }
        if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        let a = match c.udp.query_device() {
            Ok(a) => a,
            Err(e) => return e.errno(),
        };
        // SAFETY: all-zero is a valid ibv_device_attr_ex (integers only).
        let mut ex: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        ex.orig_attr = convert::device_attr(&a);
        ex.phys_port_cnt_ex = u32::from(a.phys_port_cnt);
        // SAFETY: the caller's struct has `attr_size` bytes.
        unsafe { write_prefix(attr.cast(), &ex, attr_size) };
        0
    })
}

fn port_attr_of(context: *mut ibv_context, port_num: u8) -> Result<ibv_port_attr, c_int> {
    // SAFETY: a context we opened (or NULL).
    let c = unsafe { udp_context(context) }.ok_or(libc::EINVAL)?;
    let a = c.udp.query_port(port_num).map_err(|e| e.errno())?;
    Ok(convert::port_attr(&a))
}

/// `verbs_context.query_port` (what the header's `ibv_query_port` macro calls): writes the
/// caller's `port_attr_len` bytes, no more.
pub unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
    port_attr_len: usize,
) -> c_int {
    guard(libc::EIO, || {
        if port_attr.is_null() {
            return libc::EINVAL;
        }
        match port_attr_of(context, port_num) {
            Ok(a) => {
                // SAFETY: the caller's struct has `port_attr_len` bytes.
                unsafe { write_prefix(port_attr.cast(), &a, port_attr_len) };
                0
            }
            Err(e) => e,
        }
    })
}

/// `ibv_query_port@IBVERBS_1.1`, for programs built without the macro and the macro's
/// fallback: the struct is rdma-core's `_compat_ibv_port_attr`, which ends with `flags`, so
/// only that prefix (48 bytes) is written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: same contract, with the old struct size.
    unsafe { query_port_ex(context, port_num, port_attr, COMPAT_PORT_ATTR_SIZE) }
}

fn gid_of(context: *mut ibv_context, port_num: u8, index: u32) -> Result<ibv_gid, c_int> {
    // SAFETY: a context we opened (or NULL).
    let c = unsafe { udp_context(context) }.ok_or(libc::EINVAL)?;
    let g = c.udp.query_gid(port_num, index).map_err(|e| e.errno())?;
    Ok(ibv_gid { raw: g.0 })
}

/// `ibv_query_gid`: 0 (an empty entry reads as the zero GID, as in rdma-core), or −1 with
/// `errno`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        let Ok(index) = u32::try_from(index) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if gid.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        match gid_of(context, port_num, index) {
            Ok(g) => {
                // SAFETY: the caller's 16-byte gid.
                unsafe { gid.write(g) };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

/// The entry at `index`; an empty one (the zero GID) is `ENODATA`, as rdma-core's
/// `ibv_query_gid_ex` reports it.
fn gid_entry(context: *mut ibv_context, port_num: u8, index: u32) -> Result<ibv_gid_entry, c_int> {
    let gid = gid_of(context, port_num, index)?;
    if gid.raw == [0; 16] {
        return Err(libc::ENODATA);
    }
    Ok(ibv_gid_entry {
        gid,
        gid_index: index,
        port_num: u32::from(port_num),
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 1,
    })
}

/// `_ibv_query_gid_ex` (behind the `ibv_query_gid_ex` macro): 0 or an errno (`ENODATA` for
/// an empty entry of the table).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        if entry.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        let Ok(port) = u8::try_from(port_num) else {
            return libc::EINVAL;
        };
        match gid_entry(context, port, gid_index) {
            Ok(e) => {
                // SAFETY: the caller's entry of `entry_size` ≥ 32 bytes.
                unsafe { write_prefix(entry.cast(), &e, entry_size) };
                0
            }
            Err(e) => e,
        }
    })
}

/// `_ibv_query_gid_table` (behind `ibv_query_gid_table`): the number of entries written (the
/// populated ones: index 0 only), or a negative errno.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard(-(libc::EIO as isize), || {
        if entries.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        let e = match gid_entry(context, 1, 0) {
            Ok(e) => e,
            Err(e) => return -(e as isize),
        };
        if max_entries < 1 {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: the caller's table has `max_entries` ≥ 1 entries of `entry_size` bytes.
        unsafe { write_prefix(entries.cast(), &e, entry_size) };
        1
    })
}

/// `ibv_query_gid_type@IBVERBS_PRIVATE_34` (`ibv_devinfo`): every GID is RoCE v2; an empty
/// entry has no type (−1, `errno` `ENODATA`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut c_int,
) -> c_int {
    guard(-1, || {
        if gid_type.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        match gid_entry(context, port_num, index) {
            Ok(_) => {
                // SAFETY: the caller's enum slot.
                unsafe { gid_type.write(IBV_GID_TYPE_SYSFS_ROCE_V2) };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

/// `ibv_query_pkey`: 0, or −1 with `errno`; the P_Key is in network byte order.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: a context we opened (or NULL).
        let c = unsafe { udp_context(context) };
        let (Some(c), Ok(index), false) = (c, u16::try_from(index), pkey.is_null()) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        match c.udp.query_pkey(port_num, index) {
            Ok(p) => {
                // SAFETY: the caller's u16.
                unsafe { pkey.write(p.to_be()) };
                0
            }
            Err(e) => {
                set_errno(e.errno());
                -1
            }
        }
    })
}

/// `ibv_get_pkey_index`: the index of a P_Key (network byte order), or −1.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: a context we opened (or NULL).
        let Some(c) = (unsafe { udp_context(context) }) else {
            return -1;
        };
        match c.udp.query_pkey(port_num, 0) {
            Ok(p) if p.to_be() == pkey => 0,
            _ => -1,
        }
    })
}

// ---- asynchronous events -------------------------------------------------------------------

/// Fills `event` from `ev`; false if the object it names is gone (the event is dropped).
fn async_event(maps: &ObjMaps, ev: &AsyncEvent, out: &mut ibv_async_event) -> bool {
    out.event_type = ev.kind as u32;
    match ev.element {
        EventElement::Qp(n) => match maps.qps.get(&n) {
            Some(p) => out.element.qp = *p as *mut ibv_qp,
            None => return false,
        },
        EventElement::Cq(h) => match maps.cqs.get(&h) {
            Some(p) => out.element.cq = *p as *mut ibv_cq,
            None => return false,
        },
        EventElement::Srq(h) => match maps.srqs.get(&h) {
            Some(p) => out.element.srq = *p as *mut ibv_srq,
            None => return false,
        },
        EventElement::Port(p) => out.element.port_num = c_int::from(p),
        EventElement::Device => out.element.port_num = 0,
    }
    true
}

pub(crate) fn fd_nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL on a descriptor; an invalid one returns −1.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// Waits until `fd` is readable (or the wait fails).
pub(crate) fn wait_readable(fd: c_int) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    unsafe { libc::poll(&mut p, 1, -1) };
}

/// `ibv_get_async_event`: the next event; blocks unless `async_fd` was made non-blocking
/// (then −1 with `EAGAIN`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    guard(-1, || {
        // SAFETY: a context we opened (or NULL).
        let Some(c) = (unsafe { udp_context(context) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if event.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let fd = c.events.fd.as_raw_fd();
        loop {
            while let Some(ev) = c.events.pop() {
                // SAFETY: all-zero is a valid ibv_async_event (pointer union, integer).
                let mut out: ibv_async_event = unsafe { std::mem::zeroed() };
                let known = c.maps.lock().is_ok_and(|m| async_event(&m, &ev, &mut out));
                if known {
                    // SAFETY: the caller's struct.
                    unsafe { event.write(out) };
                    return 0;
                }
            }
            if fd_nonblocking(fd) {
                set_errno(libc::EAGAIN);
                return -1;
            }
            wait_readable(fd);
        }
    })
}

/// `ibv_ack_async_event`: events need no acknowledgement here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}

/// `ibv_fork_init`: nothing to do (no pinned kernel memory).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// `ibv_dontfork_range`: nothing to do.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range`: nothing to do.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn zero_config_skips_an_address_in_use() {
        let taken = std::net::UdpSocket::bind("127.0.94.1:4791").unwrap();
        let candidates = ["127.0.94.1:4791", "127.0.94.2:4791"].map(|a| a.parse().unwrap());
        let p = bind_first(&UdpProvider::builder(), candidates.into_iter()).unwrap();
        let devices = p.devices().unwrap();
        assert_eq!(devices[0].local_addr(), candidates[1]);
        p.shutdown();
        drop(taken);
        let none = bind_first(&UdpProvider::builder(), std::iter::empty());
        assert!(none.is_err());
    }

    #[test]
    fn recovery_is_ibta_unless_sr_is_asked_for() {
        assert_eq!(recovery_wanted(None), Ok(Recovery::Ibta));
        assert_eq!(recovery_wanted(Some("")), Ok(Recovery::Ibta));
        assert_eq!(recovery_wanted(Some("ibta")), Ok(Recovery::Ibta));
        assert_eq!(
            recovery_wanted(Some(" sr\n")),
            Ok(Recovery::SelectiveRepeat)
        );
        assert!(recovery_wanted(Some("SR")).is_err());
        assert!(recovery_wanted(Some("gbn")).is_err());
    }

    #[test]
    fn gso_is_on_unless_foreign_peers_are_expected_or_it_is_set() {
        assert!(gso_wanted(None, false).unwrap());
        assert!(!gso_wanted(None, true).unwrap());
        assert!(gso_wanted(Some(" 1"), true).unwrap());
        assert!(!gso_wanted(Some("0"), false).unwrap());
        assert!(gso_wanted(Some(""), false).unwrap());
        assert!(gso_wanted(Some("yes"), false).is_err());
    }

    #[test]
    fn zero_config_addresses_are_loopback_and_vary() {
        let a = zero_config_addr(1234, 0);
        let b = zero_config_addr(1234, 1);
        assert!(a.is_loopback() && b.is_loopback());
        assert_ne!(a, b);
        assert_ne!(a.octets()[3], 0);
        assert_ne!(a.octets()[3], 255);
    }
}
