//! The verbs object model as traits: what every backend (emulator, real hardware) implements.
//!
//! Generic code takes `C: Context` and uses its associated handle types, which gives static
//! dispatch on the data path. [`crate::dynamic`] erases the types for run-time backend
//! selection.
//!
//! Ownership follows rdma-core: a QP keeps its PD, CQs and SRQ alive; an MR and an address
//! handle keep their PD alive; so does a memory window.
//! Handles are cheap to clone and are `Send + Sync`; every call may come from any thread.
//! `destroy` is explicit and fails with [`ErrorKind::Busy`](crate::ErrorKind::Busy) while
//! another live object still uses the object; after a successful destroy every call on any clone
//! of the handle fails with [`ErrorKind::Destroyed`](crate::ErrorKind::Destroyed). Dropping the
//! last clone of a handle that was not destroyed releases it too.

use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::time::Duration;

use crate::attr::{AhAttr, DeviceAttr, PortAttr, QpAttr, QpInitAttr, SrqAttr};
use crate::error::{Error, PostError, Result};
use crate::event::AsyncEvent;
use crate::types::{AccessFlags, Endpoint, Gid, MwType, QpAttrMask, QpState, QpType};
use crate::wc::WorkCompletion;
use crate::wr::{MwBind, RecvWr, SendWr, Sge};

/// A source of devices: the emulator, a UDP-backed emulator, libibverbs.
pub trait Provider: Send + Sync {
    /// The device handle type.
    type Device: Device;

    /// The provider's short name (`"emu"`, `"udp"`, `"hw"`), as used by
    /// [`crate::dynamic::PROVIDER_ENV`].
    fn name(&self) -> &'static str;

    /// The devices this provider offers (`ibv_get_device_list`). May be empty.
    fn devices(&self) -> Result<Vec<Self::Device>>;
}

/// A device that can be opened (`ibv_device`).
pub trait Device: Clone + Send + Sync + 'static {
    /// The context type `open` returns.
    type Context: Context;

    /// The device name, e.g. `"softverbs0"` or `"rxe0"`.
    fn name(&self) -> String;

    /// The node GUID.
    fn node_guid(&self) -> u64;

    /// Opens the device (`ibv_open_device`). Several contexts may be open at once.
    fn open(&self) -> Result<Self::Context>;
}

/// An open device (`ibv_context`): the factory of every other object.
///
/// Every `create_*`/`alloc_*` call validates its arguments against [`DeviceAttr`] limits and
/// fails without creating anything: `InvalidArgument` for bad sizes or handles of another
/// context, `Destroyed` for destroyed handles, `NoMemory` for object count limits.
pub trait Context: Clone + Send + Sync + 'static {
    /// Protection domain handle.
    type Pd: ProtectionDomain;
    /// Memory region handle.
    type Mr: MemoryRegion;
    /// Completion queue handle.
    type Cq: CompletionQueue;
    /// Completion channel handle.
    type Channel: CompletionChannel;
    /// Shared receive queue handle.
    type Srq: SharedReceiveQueue;
    /// Queue pair handle.
    type Qp: QueuePair;
    /// Address handle.
    type Ah: AddressHandle;
    /// Memory window handle.
    type Mw: MemoryWindow;

    /// The device's name.
    fn device_name(&self) -> String;

    /// Device limits (`ibv_query_device`).
    fn query_device(&self) -> Result<DeviceAttr>;

    /// Port attributes; ports are numbered from 1 (`ibv_query_port`). A port number of 0 or above
    /// `phys_port_cnt` fails with `InvalidArgument`.
    fn query_port(&self, port_num: u8) -> Result<PortAttr>;

    /// The GID at `index` of the port's GID table (`ibv_query_gid`); an empty entry reads as
    /// the zero GID, as `ibv_query_gid` reports it; an index at or above `gid_tbl_len` fails
    /// with `InvalidArgument`.
    fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid>;

    /// The P_Key at `index` (`ibv_query_pkey`); RoCE ports hold 0xFFFF at index 0.
    fn query_pkey(&self, port_num: u8, index: u16) -> Result<u16>;

    /// Allocates a protection domain (`ibv_alloc_pd`).
    fn alloc_pd(&self) -> Result<Self::Pd>;

    /// Registers `len` bytes of zeroed memory owned by the MR (`ibv_reg_mr` over a buffer the
    /// backend allocates). Access it with [`MemoryRegion::read`]/[`MemoryRegion::write`].
    ///
    /// Errors: `len` 0 or above `max_mr_size`, REMOTE_WRITE or REMOTE_ATOMIC without
    /// LOCAL_WRITE (rc-transport.md §7.2), unknown access bits → `InvalidArgument`; too many MRs,
    /// or `len` bytes the machine cannot provide → `NoMemory` (never an abort: the memory is
    /// mapped, and committed as it is touched).
    fn alloc_mr(&self, pd: &Self::Pd, len: usize, access: AccessFlags) -> Result<Self::Mr>;

    /// Registers a shared mapping of the file at `path`, created if absent (mode 0600 on Unix)
    /// and grown to `len` bytes, so that another process can map the same file and inspect what peers wrote.
    /// Same errors as [`Context::alloc_mr`], plus `Io` when the file cannot be mapped.
    ///
    /// Contract: the file must keep at least `len` bytes while the MR is registered. Shrinking
    /// it (`truncate`, `ftruncate` by any process) turns every later access to the pages past
    /// its new end — a peer's WRITE, a local copy — into SIGBUS, which kills the process:
    /// softverbs does not catch it. Other processes may read and write the file's bytes,
    /// through `pread`/`pwrite` or a shared mapping (with the access sizes of `mr-region`'s
    /// module docs for concurrent access), but not resize it.
    fn reg_mr_file(
        &self,
        pd: &Self::Pd,
        path: &Path,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self::Mr>;

    /// Registers caller memory `addr..addr + len` (`ibv_reg_mr`).
    ///
    /// # Safety
    ///
    /// The caller guarantees that the range is valid for reads and writes for as long as the MR
    /// is registered (until `destroy` succeeds or the last handle is dropped), and that it is
    /// not deallocated, remapped or shrunk meanwhile.
    ///
    /// While the MR is registered the device may read or write any byte of the range at any
    /// moment a peer's operation or a posted WR targets it, with atomic accesses of the sizes
    /// `mr-region` documents (an `AtomicU64` per aligned 8-byte word inside the range, an
    /// `AtomicU8` per byte at its unaligned ends). So the caller:
    /// - may access bytes with plain (non-atomic) loads and stores, or through references
    ///   (`&[u8]`, `&mut [u8]`), only while no device access to them can be in flight: before
    ///   posting the WR that uses them, after polling its completion, and — for bytes a peer
    ///   may reach — only when the application's protocol says the peer is done with them
    ///   (polling the completion is the synchronisation point);
    /// - may access bytes concurrently with the device only through
    ///   [`MemoryRegion::read`]/[`MemoryRegion::write`], or with atomics of those same sizes;
    /// - must not do anything else concurrently: a plain access, or an atomic of another size,
    ///   racing with the device's is a data race (undefined behaviour), not merely unspecified
    ///   bytes. Overlapping atomic accesses give unspecified bytes but never touch memory
    ///   outside the range.
    #[allow(unsafe_code)] // declares the contract only; implementations hold the unsafe code
    unsafe fn reg_mr_raw(
        &self,
        pd: &Self::Pd,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self::Mr>;

    /// Creates a completion channel (`ibv_create_comp_channel`).
    fn create_comp_channel(&self) -> Result<Self::Channel>;

    /// Creates a CQ with room for at least `cqe` entries (`ibv_create_cq`); `cqe` 0 or above
    /// `max_cqe` fails with `InvalidArgument`. With a channel, armed notifications are
    /// delivered there.
    fn create_cq(&self, cqe: u32, channel: Option<&Self::Channel>) -> Result<Self::Cq>;

    /// Creates a shared receive queue in `pd` (`ibv_create_srq`).
    fn create_srq(&self, pd: &Self::Pd, attr: &SrqAttr) -> Result<Self::Srq>;

    /// Creates a QP in RESET (`ibv_create_qp`). Errors: capacities above the device limits →
    /// `InvalidArgument`; a QP type the backend lacks → `NotSupported`; too many QPs →
    /// `NoMemory`.
    fn create_qp(
        &self,
        pd: &Self::Pd,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        srq: Option<&Self::Srq>,
        attr: &QpInitAttr,
    ) -> Result<Self::Qp>;

    /// Creates an address handle in `pd` for UD sends (`ibv_create_ah`). Errors
    /// (`InvalidArgument`): a port other than 1 (0 is taken as 1), an `sgid_index` outside the
    /// GID table, a zero `dgid` (RoCE needs a global address), a zero `udp_dport`.
    fn create_ah(&self, pd: &Self::Pd, attr: &AhAttr) -> Result<Self::Ah>;

    /// The next asynchronous event, if any, without blocking (`ibv_get_async_event` on a
    /// non-blocking fd). Events need no acknowledgement.
    fn poll_async_event(&self) -> Option<AsyncEvent>;

    /// Allocates an unbound memory window of `mw_type` in `pd` (`ibv_alloc_mw`), keeping the PD
    /// alive. Errors: a backend or device without that window type → `NotSupported`; more than
    /// `max_mw` windows → `NoMemory`.
    fn alloc_mw(&self, pd: &Self::Pd, mw_type: MwType) -> Result<Self::Mw>;

    /// Binds type 1 window `mw` through `qp`'s send queue (`ibv_bind_mw`) and returns its new
    /// R_Key (the key byte moves on; [`MemoryWindow::rkey`] reports it from now on). The bind
    /// is a send-queue operation: it takes effect and completes (`IBV_WC_BIND_MW`, when
    /// signaled) in order with the QP's other work. A bind of length 0 unbinds the window.
    ///
    /// Errors at the call: a type 2 window, a QP that is not RC, or a QP not in RTS/SQD →
    /// `InvalidArgument`/`InvalidState`. Errors of the bind itself (MR without MW_BIND, rights
    /// beyond the MR's — REMOTE_WRITE or REMOTE_ATOMIC need the MR's LOCAL_WRITE —, a range
    /// outside the MR, a PD mismatch) complete the bind with `MW_BIND_ERR` and move the QP to
    /// ERR (IBTA §10.6.7.2.1, as rxe).
    fn bind_mw(&self, qp: &Self::Qp, mw: &Self::Mw, bind: &MwBind) -> Result<u32>;
}

/// A protection domain (`ibv_pd`).
pub trait ProtectionDomain: Clone + Send + Sync + 'static {
    /// A number identifying the PD within its context.
    fn handle(&self) -> u32;

    /// Deallocates the PD (`ibv_dealloc_pd`); `Busy` while MRs, QPs, SRQs or AHs use it.
    fn destroy(&self) -> Result<()>;
}

/// An address handle (`ibv_ah`): the address vector a UD send goes to, named in
/// [`UdDest::ah`](crate::wr::UdDest::ah) by its [`handle`](Self::handle).
pub trait AddressHandle: Clone + Send + Sync + 'static {
    /// A number identifying the AH within its context; what a UD work request carries.
    fn handle(&self) -> u32;

    /// Destroys the AH (`ibv_destroy_ah`). Work already posted with it is unaffected (the
    /// address was copied at post time); later posts naming it fail with `InvalidArgument`.
    fn destroy(&self) -> Result<()>;
}

/// A registered memory region (`ibv_mr`).
pub trait MemoryRegion: Clone + Send + Sync + 'static {
    /// Local key, for SGEs.
    fn lkey(&self) -> u32;
    /// Remote key, for peers' RDMA and atomic requests.
    fn rkey(&self) -> u32;
    /// The region's start address as seen in SGEs and by peers (its virtual address).
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True if the region has length 0 (never, for a registered MR).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Access rights.
    fn access(&self) -> AccessFlags;

    /// Copies `buf.len()` bytes at `offset` into `buf`; `InvalidArgument` if the range leaves
    /// the region.
    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()>;

    /// Copies `data` into the region at `offset`; `InvalidArgument` if the range leaves the
    /// region.
    fn write(&self, offset: usize, data: &[u8]) -> Result<()>;

    /// An SGE for `len` bytes at `offset`; `InvalidArgument` if the range leaves the region or
    /// `len` exceeds `u32`.
    fn sge(&self, offset: usize, len: usize) -> Result<Sge> {
        let end = offset.checked_add(len);
        let length = u32::try_from(len).ok();
        match (end, length) {
            (Some(end), Some(length)) if end <= self.len() => Ok(Sge {
                addr: self.addr() + offset as u64,
                length,
                lkey: self.lkey(),
            }),
            _ => Err(Error::invalid(format!(
                "sge {offset}+{len} outside MR of {} bytes",
                self.len()
            ))),
        }
    }

    /// Deregisters the region (`ibv_dereg_mr`). Fails while memory windows are bound to it
    /// (IBTA §10.6.7.2.6): `Busy` on the emulator (rxe answers `EINVAL`).
    fn destroy(&self) -> Result<()>;
}

/// A memory window (`ibv_mw`, IBTA §10.6.7): remote access to part of an MR under its own
/// R_Key and narrower rights. Peers use its R_Key as they would an MR's.
pub trait MemoryWindow: Clone + Send + Sync + 'static {
    /// A number identifying the window within its context; what
    /// [`SendOp::BindMw`](crate::SendOp::BindMw) names.
    fn handle(&self) -> u32;

    /// The window's type.
    fn mw_type(&self) -> MwType;

    /// The R_Key from the allocation or the latest type 1 bind (`ibv_mw.rkey`). A type 2
    /// window's key after a bind is the one its BIND_MW request named.
    fn rkey(&self) -> u32;

    /// Deallocates the window (`ibv_dealloc_mw`); allowed while bound: the window is
    /// invalidated first, and later accesses through its R_Key fail.
    fn destroy(&self) -> Result<()>;
}

/// A completion queue (`ibv_cq`).
pub trait CompletionQueue: Clone + Send + Sync + 'static {
    /// A number identifying the CQ within its context (reported by completion events).
    fn handle(&self) -> u32;

    /// The number of entries the CQ holds.
    fn capacity(&self) -> u32;

    /// Moves up to `out.len()` completions into `out`, oldest first, and returns how many
    /// (`ibv_poll_cq`). Fails with `InvalidState` after the CQ overran.
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize>;

    /// Arms the CQ for one notification on its channel (`ibv_req_notify_cq`): for the next
    /// completion, or with `solicited_only` for the next receive completion of a packet with
    /// the SE bit or the next error completion (rc-transport.md §6.3). `InvalidState` without a
    /// channel.
    fn req_notify(&self, solicited_only: bool) -> Result<()>;

    /// Acknowledges `n` events received from the channel for this CQ (`ibv_ack_cq_events`).
    fn ack_events(&self, n: u32);

    /// Resizes the CQ (`ibv_resize_cq`): `InvalidArgument` for 0, above `max_cqe`, or below
    /// the number of completions it holds.
    fn resize(&self, cqe: u32) -> Result<()>;

    /// Destroys the CQ (`ibv_destroy_cq`): `Busy` while a QP uses it or events are
    /// unacknowledged.
    fn destroy(&self) -> Result<()>;
}

/// A completion channel (`ibv_comp_channel`): a file descriptor that becomes readable when an
/// armed CQ gets a completion, usable from epoll, mio or tokio.
pub trait CompletionChannel: Clone + Send + Sync + AsFd + AsRawFd + 'static {
    /// The CQ handle of the next pending event, without blocking (`ibv_get_cq_event` on a
    /// non-blocking channel); `None` if there is none.
    fn get_cq_event(&self) -> Result<Option<u32>>;

    /// As [`get_cq_event`](Self::get_cq_event), waiting up to `timeout` (forever with `None`).
    fn wait_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>>;

    /// Destroys the channel; `Busy` while a CQ uses it.
    fn destroy(&self) -> Result<()>;
}

/// A shared receive queue (`ibv_srq`).
pub trait SharedReceiveQueue: Clone + Send + Sync + 'static {
    /// A number identifying the SRQ within its context.
    fn handle(&self) -> u32;

    /// Posts receive work requests (`ibv_post_srq_recv`); `NoMemory` when full.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError>;

    /// Current attributes (`ibv_query_srq`).
    fn query(&self) -> Result<SrqAttr>;

    /// Arms the limit event with `srq_limit` (`ibv_modify_srq` with `IBV_SRQ_LIMIT`).
    fn arm_limit(&self, srq_limit: u32) -> Result<()>;

    /// Destroys the SRQ; `Busy` while a QP uses it.
    fn destroy(&self) -> Result<()>;
}

/// A queue pair (`ibv_qp`).
pub trait QueuePair: Clone + Send + Sync + 'static {
    /// The QP number (24-bit).
    fn qp_num(&self) -> u32;

    /// The transport type.
    fn qp_type(&self) -> QpType;

    /// Modifies attributes and state (`ibv_modify_qp`). The mask must match the transition's
    /// required and optional bits exactly (rc-transport.md §5.1): a missing or extra bit, an
    /// illegal transition or an out-of-range value fails with `InvalidArgument`/`InvalidState`
    /// and changes nothing; an unknown bit fails with `NotSupported`.
    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()>;

    /// Current attributes (`ibv_query_qp`).
    fn query(&self) -> Result<QpAttr>;

    /// Current state.
    fn state(&self) -> Result<QpState> {
        Ok(self.query()?.qp_state)
    }

    /// Posts send work requests (`ibv_post_send`): allowed in RTS and SQD (queued), and in ERR
    /// (each completes with `WR_FLUSH_ERR`); `InvalidState` elsewhere; `NoMemory` when the send
    /// queue is full; `InvalidArgument` for too many SGEs, inline data above the limit, an
    /// atomic without one 8-byte SGE or with a misaligned remote address
    /// (rc-transport.md §5.2).
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError>;

    /// Posts receive work requests (`ibv_post_recv`): allowed from INIT on (in ERR they flush);
    /// `InvalidState` in RESET or when the QP uses an SRQ; `NoMemory` when full.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError>;

    /// What a peer needs to connect to this QP if it starts sending at `psn`: our QPN, GID
    /// (port 1, index 0) and UDP port.
    fn endpoint(&self, psn: u32) -> Result<Endpoint>;

    /// Destroys the QP (`ibv_destroy_qp`); its outstanding work is discarded without
    /// completions.
    fn destroy(&self) -> Result<()>;
}
