//! Queue pairs: create (classic and `ibv_create_qp_ex`), modify, query, destroy, posting
//! through the context's ops table, and the `ibv_qp_ex` work-request builder (`ibv_wr_*`).
//!
//! Both posting paths collect work requests into a `Batch` (SGEs and inline bytes copied
//! into two flat vectors, so a post allocates nothing once the thread's batch has grown) and
//! post it with one `post_send` of the UDP QP. RC, UC and UD are offered (a UC QP takes the
//! same calls as RC; the engine refuses RC-only masks and operations; a UD work request names
//! its AH, remote QPN and Q_Key in `wr.ud` or through `ibv_wr_set_ud_addr`); XRC and TSO
//! answer `EOPNOTSUPP`. The memory-window operations convert in `crate::mw`.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ops::Range;
use std::sync::Mutex;

use emu_udp::UdpQp;
use ibverbs_sys::*;
use verbs_api::{
    Context, PostError, QpAttr, QpAttrMask, QpInitAttr, QpState, QpType, QueuePair, Recovery,
    RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest,
};

use crate::device::{release, retain, udp_context};
use crate::objects::{ah_handle, cq_inner, pd_udp, srq_udp};
use crate::{convert, guard, null_with};

/// `IBV_SEND_INLINE`.
const SEND_INLINE: u32 = 1 << 3;
/// `IBV_QPT_UD`.
const IBV_QPT_UD: u32 = 4;
/// The `send_ops_flags` of a UD QP: `IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM`.
const IBV_QP_EX_UD_OPS: u64 = (1 << 2) | (1 << 3);

/// One work request of a [`Batch`].
#[derive(Clone, Debug)]
struct BatchWr {
    wr_id: u64,
    flags: SendFlags,
    op: SendOp,
    sge: Range<usize>,
    inline: Option<Range<usize>>,
    /// The destination of a UD work request.
    ud: Option<UdDest>,
}

/// Send work requests being collected, with their SGEs and inline bytes in flat vectors.
#[derive(Default, Debug)]
pub(crate) struct Batch {
    sges: Vec<Sge>,
    bytes: Vec<u8>,
    wrs: Vec<BatchWr>,
    /// The first error of an `ibv_wr_*` call since `wr_start`, reported by `wr_complete`.
    error: Option<c_int>,
}

impl Batch {
    fn clear(&mut self) {
        self.sges.clear();
        self.bytes.clear();
        self.wrs.clear();
        self.error = None;
    }

    fn push(&mut self, wr_id: u64, flags: u32, op: SendOp) {
        let n = self.sges.len();
        self.wrs.push(BatchWr {
            wr_id,
            flags: SendFlags::from_bits_truncate(flags & !SEND_INLINE),
            op,
            sge: n..n,
            inline: None,
            ud: None,
        });
    }

    /// Appends SGEs to the last work request.
    fn add_sges(&mut self, sges: impl IntoIterator<Item = Sge>) {
        let Some(last) = self.wrs.last_mut() else {
            self.error.get_or_insert(libc::EINVAL);
            return;
        };
        self.sges.extend(sges);
        last.sge.end = self.sges.len();
    }

    /// Appends inline bytes to the last work request.
    fn add_inline(&mut self, data: &[u8]) {
        let Some(last) = self.wrs.last_mut() else {
            self.error.get_or_insert(libc::EINVAL);
            return;
        };
        let start = last.inline.as_ref().map_or(self.bytes.len(), |r| r.start);
        self.bytes.extend_from_slice(data);
        last.inline = Some(start..self.bytes.len());
        last.flags |= SendFlags::INLINE;
    }

    /// Sets the UD destination of the last work request.
    fn set_ud(&mut self, ud: UdDest) {
        match self.wrs.last_mut() {
            Some(last) => last.ud = Some(ud),
            None => {
                self.error.get_or_insert(libc::EINVAL);
            }
        }
    }

    /// Posts every collected work request.
    fn post(&self, qp: &UdpQp) -> Result<(), PostError> {
        let wrs: Vec<SendWr<'_>> = self
            .wrs
            .iter()
            .map(|w| SendWr {
                wr_id: w.wr_id,
                op: w.op,
                sg_list: if w.inline.is_some() {
                    &[]
                } else {
                    &self.sges[w.sge.clone()]
                },
                inline_data: w.inline.clone().map_or(&[][..], |r| &self.bytes[r]),
                flags: w.flags,
                ud: w.ud,
            })
            .collect();
        qp.post_send(&wrs)
    }
}

thread_local! {
    static SCRATCH: RefCell<Batch> = RefCell::new(Batch::default());
}

/// Runs `f` with this thread's scratch batch (a fresh one if it is in use).
fn with_scratch<R>(f: impl FnOnce(&mut Batch) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut b) => {
            b.clear();
            f(&mut b)
        }
        Err(_) => f(&mut Batch::default()),
    })
}

// ---- QP objects ----------------------------------------------------------------------------

/// The private part of a QP.
pub(crate) struct QpInner {
    pub(crate) udp: UdpQp,
    sq_sig_all: bool,
    /// A UD QP: send work requests carry `wr.ud`.
    ud: bool,
    builder: Mutex<Batch>,
}

/// A queue pair: its `ibv_qp_ex` (whose prefix is the `ibv_qp`), then the private part.
#[repr(C)]
pub struct SvQp {
    /// The public part.
    pub qpx: ibv_qp_ex,
    pub(crate) inner: QpInner,
}

/// # Safety
///
/// `qp` is NULL or a live QP of this library (`ibv_qp` or `ibv_qp_ex` pointer).
pub(crate) unsafe fn qp_inner<'a, T>(qp: *mut T) -> Option<&'a QpInner> {
    let sv = qp.cast::<SvQp>();
    // SAFETY: per the contract; only the private part is borrowed.
    (!sv.is_null()).then(|| unsafe { &(*sv).inner })
}

fn fill_qp_ex_ops(q: &mut ibv_qp_ex) {
    q.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    q.wr_bind_mw = Some(crate::mw::wr_bind_mw);
    q.wr_local_inv = Some(crate::mw::wr_local_inv);
    q.wr_rdma_read = Some(wr_rdma_read);
    q.wr_rdma_write = Some(wr_rdma_write);
    q.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    q.wr_send = Some(wr_send);
    q.wr_send_imm = Some(wr_send_imm);
    q.wr_send_inv = Some(crate::mw::wr_send_inv);
    q.wr_send_tso = Some(wr_send_tso);
    q.wr_set_ud_addr = Some(wr_set_ud_addr);
    q.wr_set_xrc_srqn = Some(wr_unsupported_u32);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
    q.wr_atomic_write = Some(wr_atomic_write);
}

/// Creates a QP from the classic attributes in `init` (whose `cap` receives the granted
/// capacities) in `pd`.
fn new_qp(pd: *mut ibv_pd, init: *mut ibv_qp_init_attr) -> Result<*mut SvQp, c_int> {
    // SAFETY: a live PD of ours (or NULL).
    let udp_pd = unsafe { pd_udp(pd) }.ok_or(libc::EINVAL)?;
    // SAFETY: a live PD records its live context.
    let context = unsafe { (*pd).context };
    // SAFETY: same context.
    let c = unsafe { udp_context(context) }.ok_or(libc::EINVAL)?;
    // SAFETY: the caller's attribute struct (checked non-NULL by the callers).
    let a = unsafe { *init };
    // SAFETY: live CQs/SRQ of ours (or NULL).
    let (scq, rcq, srq) = unsafe { (cq_inner(a.send_cq), cq_inner(a.recv_cq), srq_udp(a.srq)) };
    let (Some(scq), Some(rcq)) = (scq, rcq) else {
        return Err(libc::EINVAL);
    };
    let qp_type = match a.qp_type {
        2 => QpType::Rc,
        3 => QpType::Uc,
        IBV_QPT_UD => QpType::Ud,
        // Refused as libibverbs refuses a QP type its provider lacks.
        _ => return Err(libc::EOPNOTSUPP),
    };
    let attr = QpInitAttr {
        qp_type,
        cap: convert::cap_from(&a.cap),
        sq_sig_all: a.sq_sig_all != 0,
    };
    let udp = c
        .udp
        .create_qp(udp_pd, &scq.udp, &rcq.udp, srq, &attr)
        .map_err(|e| e.errno())?;
    if let Ok(q) = udp.query() {
        // SAFETY: the caller's attribute struct: report the granted capacities.
        unsafe { (*init).cap = convert::cap_to(&q.cap) };
    }
    // SAFETY: `pd` is a live PD of ours, `context` its context, `c` that context's state.
    Ok(unsafe { wrap_qp(pd, context, c, &a, udp, 0) })
}

/// The `ibv_qp` of new engine QP `udp` (created from `a` in `pd`, in state `state`), registered
/// in its context, which it keeps alive.
///
/// # Safety
/// `pd` is a live PD of this library, `context` its context and `c` that context's state.
unsafe fn wrap_qp(
    pd: *mut ibv_pd,
    context: *mut ibv_context,
    c: &crate::device::CtxInner,
    a: &ibv_qp_init_attr,
    udp: UdpQp,
    state: u32,
) -> *mut SvQp {
    let qp_type = udp.qp_type();
    // SAFETY: ibv_qp_ex is pointers, integers, Option<fn> and pthread objects whose all-zero
    // pattern is their static initializer on glibc: all-zero is valid.
    let mut q: ibv_qp_ex = unsafe { std::mem::zeroed() };
    let b = &mut q.qp_base;
    b.context = context;
    b.qp_context = a.qp_context;
    b.pd = pd;
    b.send_cq = a.send_cq;
    b.recv_cq = a.recv_cq;
    b.srq = a.srq;
    b.handle = udp.qp_num();
    b.qp_num = udp.qp_num();
    b.state = state;
    b.qp_type = a.qp_type;
    fill_qp_ex_ops(&mut q);
    let qpn = udp.qp_num();
    let sv = Box::into_raw(Box::new(SvQp {
        qpx: q,
        inner: QpInner {
            udp,
            sq_sig_all: a.sq_sig_all != 0,
            ud: qp_type == QpType::Ud,
            builder: Mutex::new(Batch::default()),
        },
    }));
    if let Ok(mut m) = c.maps.lock() {
        m.qps.insert(qpn, sv as usize);
    }
    // SAFETY: the PD's live context.
    unsafe { retain(context) };
    sv
}

/// `IBV_QPS_RTS`.
const IBV_QPS_RTS: u32 = 3;

/// `softverbs_open_gsi` — softverbs-private, outside rdma-core's version nodes (node
/// `SOFTVERBS_PRIVATE_1`); the rdma_cm drop-in finds it with `dlsym(RTLD_DEFAULT, …)`:
///
/// ```c
/// struct ibv_qp *softverbs_open_gsi(struct ibv_pd *pd, struct ibv_cq *send_cq,
///                                   struct ibv_cq *recv_cq, uint32_t max_send_wr,
///                                   uint32_t max_recv_wr);
/// ```
///
/// Opens the GSI of `pd`'s device: a UD `ibv_qp` with `qp_num` 1, already in RTS with Q_Key
/// 0x8001_0000 (IBTA 14.2.5), one SGE per work request, receiving the datagrams peers send to
/// QP1 (CM MADs, with the GRH first as on any UD QP). NULL with `errno` `EBUSY` while the
/// device's GSI is open, `EINVAL` for a NULL or foreign PD/CQ or a capacity of 0 or above the
/// device's limit. `ibv_destroy_qp` closes it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn softverbs_open_gsi(
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    max_send_wr: u32,
    max_recv_wr: u32,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        if max_send_wr == 0 || max_recv_wr == 0 {
            return null_with(libc::EINVAL);
        }
        // SAFETY: a live PD and CQs of ours (or NULL), per this call's contract.
        match unsafe { open_gsi(pd, send_cq, recv_cq, max_send_wr, max_recv_wr) } {
            Ok(sv) => sv.cast(),
            Err(e) => null_with(e),
        }
    })
}

/// [`softverbs_open_gsi`]'s body.
///
/// # Safety
/// `pd`, `send_cq` and `recv_cq` are live objects of this library or NULL.
unsafe fn open_gsi(
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    max_send_wr: u32,
    max_recv_wr: u32,
) -> Result<*mut SvQp, c_int> {
    // SAFETY: a live PD of ours (or NULL).
    let udp_pd = unsafe { pd_udp(pd) }.ok_or(libc::EINVAL)?;
    // SAFETY: a live PD records its live context.
    let context = unsafe { (*pd).context };
    // SAFETY: same context.
    let c = unsafe { udp_context(context) }.ok_or(libc::EINVAL)?;
    // SAFETY: live CQs of ours (or NULL).
    let (Some(scq), Some(rcq)) = (unsafe { (cq_inner(send_cq), cq_inner(recv_cq)) }) else {
        return Err(libc::EINVAL);
    };
    let cap = verbs_api::QpCap {
        max_send_wr,
        max_recv_wr,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let udp = c
        .udp
        .open_gsi(udp_pd, &scq.udp, &rcq.udp, cap)
        .map_err(|e| e.errno())?;
    let a = ibv_qp_init_attr {
        qp_context: std::ptr::null_mut(),
        send_cq,
        recv_cq,
        srq: std::ptr::null_mut(),
        cap: convert::cap_to(&cap),
        qp_type: IBV_QPT_UD,
        sq_sig_all: 0,
    };
    // SAFETY: `pd` is a live PD of ours, `context` its context, `c` that context's state.
    Ok(unsafe { wrap_qp(pd, context, c, &a, udp, IBV_QPS_RTS) })
}

/// `ibv_create_qp`: RC, UC and UD (`EOPNOTSUPP` for XRC and raw-packet QPs); the granted
/// capacities are written back into `qp_init_attr->cap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        if qp_init_attr.is_null() {
            return null_with(libc::EINVAL);
        }
        match new_qp(pd, qp_init_attr) {
            Ok(sv) => sv.cast(),
            Err(e) => null_with(e),
        }
    })
}

const QP_EX_MASKS: u32 =
    IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

/// `verbs_context.create_qp_ex`: `comp_mask` PD (required), SEND_OPS_FLAGS (RC operations on
/// an RC QP — a UC QP's READ/atomic builders fail at `wr_complete` —, SEND and SEND_WITH_IMM on
/// a UD QP) and CREATE_FLAGS (0 only); anything else `EOPNOTSUPP`.
pub unsafe extern "C" fn create_qp_ex(
    _context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        if attr.is_null() {
            return null_with(libc::EINVAL);
        }
        // SAFETY: the caller's attribute struct.
        let a = unsafe { *attr };
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return null_with(libc::EINVAL);
        }
        let bad_ops = a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0
            && a.send_ops_flags & !send_ops_of(a.qp_type) != 0;
        let bad_flags = a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0;
        if a.comp_mask & !QP_EX_MASKS != 0 || bad_ops || bad_flags {
            return null_with(libc::EOPNOTSUPP);
        }
        let mut init = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        match new_qp(a.pd, &mut init) {
            Ok(sv) => {
                // SAFETY: the caller's attribute struct.
                unsafe { (*attr).cap = init.cap };
                sv.cast()
            }
            Err(e) => null_with(e),
        }
    })
}

/// The `send_ops_flags` a QP of type `qp_type` offers.
fn send_ops_of(qp_type: u32) -> u64 {
    if qp_type == IBV_QPT_UD {
        IBV_QP_EX_UD_OPS
    } else {
        IBV_QP_EX_RC_OPS
    }
}

/// `ibv_qp_to_qp_ex`: every QP of this library has the extended builder.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    if qp.is_null() {
        return null_with(libc::EINVAL);
    }
    qp.cast()
}

/// `ibv_modify_qp`: the mask rules of rc-transport.md §5.1 (a missing or extra bit, an illegal
/// transition → `EINVAL`; an unknown bit → `EOPNOTSUPP`); an address vector without a GRH is
/// `EINVAL` (every port is RoCE).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live QP of ours (or NULL).
        let Some(inner) = (unsafe { qp_inner(qp) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller's attribute struct.
        let c = unsafe { *attr };
        // RoCE: the address vector must carry the GRH, whose GID names the peer (as rxe
        // requires).
        if attr_mask & (1 << 7) != 0 && c.ah_attr.is_global == 0 {
            return libc::EINVAL;
        }
        let (mut a, mut mask) = match convert::qp_attr_from(&c, attr_mask) {
            Ok(v) => v,
            Err(e) => return e.errno(),
        };
        with_env_recovery(inner.udp.qp_type() == QpType::Rc, &mut a, &mut mask);
        match inner.udp.modify(&a, mask) {
            Ok(()) => {
                if let Ok(s) = inner.udp.state() {
                    // SAFETY: a live QP; `state` is the public field libibverbs maintains.
                    unsafe { (*qp).state = s as u32 };
                }
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// `SOFTVERBS_RECOVERY` ([`crate::device::RECOVERY_ENV`]): a modify of an RC QP to INIT also
/// sets the loss recovery the process asked for (RESET → INIT and INIT → INIT accept
/// `QpAttrMask::RECOVERY`). IBTA, the default, adds nothing, so the modify is exactly the
/// caller's.
fn with_env_recovery(rc: bool, a: &mut QpAttr, mask: &mut QpAttrMask) {
    let recovery = crate::device::recovery();
    let to_init = mask.contains(QpAttrMask::STATE) && a.qp_state == QpState::Init;
    if rc && to_init && recovery != Recovery::Ibta {
        a.recovery = recovery;
        *mask |= QpAttrMask::RECOVERY;
    }
}

/// `ibv_query_qp`: every attribute (whatever `attr_mask` says) and the creation attributes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live QP of ours (or NULL).
        let Some(inner) = (unsafe { qp_inner(qp) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() || init_attr.is_null() {
            return libc::EINVAL;
        }
        let a = match inner.udp.query() {
            Ok(a) => a,
            Err(e) => return e.errno(),
        };
        let c = convert::qp_attr_to(&a);
        // SAFETY: a live QP (public fields read and `state` written) and the caller's structs.
        unsafe {
            (*qp).state = c.qp_state;
            attr.write(c);
            init_attr.write(ibv_qp_init_attr {
                qp_context: (*qp).qp_context,
                send_cq: (*qp).send_cq,
                recv_cq: (*qp).recv_cq,
                srq: (*qp).srq,
                cap: c.cap,
                qp_type: (*qp).qp_type,
                sq_sig_all: c_int::from(inner.sq_sig_all),
            });
        }
        0
    })
}

/// `ibv_destroy_qp`: outstanding work is discarded.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live QP of ours (or NULL).
        let Some(inner) = (unsafe { qp_inner(qp) }) else {
            return libc::EINVAL;
        };
        let qpn = inner.udp.qp_num();
        if let Err(e) = inner.udp.destroy() {
            return e.errno();
        }
        // SAFETY: a live QP records its live context.
        if let Some(c) = unsafe { udp_context((*qp).context) }
            && let Ok(mut m) = c.maps.lock()
        {
            m.qps.remove(&qpn);
        }
        // SAFETY: as above.
        unsafe { release((*qp).context) };
        // SAFETY: allocated by new_qp; the caller gives it up.
        drop(unsafe { Box::from_raw(qp.cast::<SvQp>()) });
        0
    })
}

/// `IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG`.
const DATA_IN_ORDER_WHOLE_MSG: c_int = 1;

/// `ibv_query_qp_data_in_order`: the responder places each message's data in PSN order.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(
    qp: *mut ibv_qp,
    _op: u32,
    _flags: u32,
) -> c_int {
    if qp.is_null() {
        return 0;
    }
    DATA_IN_ORDER_WHOLE_MSG
}

// ---- posting -------------------------------------------------------------------------------

/// The SGEs of a C work request, converted.
///
/// # Safety
///
/// `sg_list` holds `num_sge` entries when `num_sge > 0`.
unsafe fn sges<'a>(sg_list: *const ibv_sge, num_sge: c_int) -> Result<&'a [ibv_sge], c_int> {
    let n = usize::try_from(num_sge).map_err(|_| libc::EINVAL)?;
    if n == 0 {
        return Ok(&[]);
    }
    if sg_list.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    Ok(unsafe { std::slice::from_raw_parts(sg_list, n) })
}

fn sge(s: &ibv_sge) -> Sge {
    Sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
}

/// The operation of a classic send work request.
///
/// # Safety
///
/// `wr` follows `ibv_post_send`'s contract (a BIND_MW names a live window and MR).
unsafe fn send_op(wr: &ibv_send_wr) -> Result<SendOp, c_int> {
    // SAFETY: the union is read as the variant the opcode selects; both are plain integers.
    let (rdma, atomic) = unsafe { (wr.wr.rdma, wr.wr.atomic) };
    let imm = u32::from_be(wr.imm_data);
    Ok(match wr.opcode {
        0 => SendOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        1 => SendOp::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm,
        },
        2 => SendOp::Send,
        3 => SendOp::SendWithImm { imm },
        4 => SendOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        5 => SendOp::AtomicCmpAndSwp {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        6 => SendOp::AtomicFetchAndAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        // SAFETY: per the contract.
        7..=9 => return unsafe { crate::mw::send_op(wr) },
        10..=14 => return Err(libc::EOPNOTSUPP),
        _ => return Err(libc::EINVAL),
    })
}

/// The UD destination of a classic send work request (`wr.ud`); a NULL AH is `EINVAL`.
///
/// # Safety
///
/// `wr.wr.ud.ah` is NULL or a live AH of this library.
unsafe fn ud_dest(wr: &ibv_send_wr) -> Result<UdDest, c_int> {
    // SAFETY: on a UD QP the union holds `ud`: a pointer and two integers.
    let ud = unsafe { wr.wr.ud };
    Ok(UdDest {
        // SAFETY: per the contract.
        ah: unsafe { ah_handle(ud.ah.cast()) }.ok_or(libc::EINVAL)?,
        remote_qpn: ud.remote_qpn,
        remote_qkey: ud.remote_qkey,
    })
}

/// Adds one classic send work request to `batch` (with its `wr.ud` destination when `ud`);
/// inline payloads are copied now.
///
/// # Safety
///
/// `wr` follows `ibv_post_send`'s contract (valid SGE list; inline SGEs name readable memory;
/// on a UD QP a live AH).
unsafe fn add_send_wr(batch: &mut Batch, wr: &ibv_send_wr, ud: bool) -> Result<(), c_int> {
    // SAFETY: per the contract.
    let op = unsafe { send_op(wr) }?;
    let dest = if ud {
        // SAFETY: per the contract, a UD work request names a live AH (or NULL).
        Some(unsafe { ud_dest(wr) }?)
    } else {
        None
    };
    // SAFETY: per the contract.
    let list = unsafe { sges(wr.sg_list, wr.num_sge) }?;
    batch.push(wr.wr_id, wr.send_flags, op);
    if let Some(d) = dest {
        batch.set_ud(d);
    }
    if wr.send_flags & SEND_INLINE != 0 {
        for s in list {
            let n = s.length as usize;
            if n == 0 {
                continue;
            }
            if s.addr == 0 {
                return Err(libc::EINVAL);
            }
            // SAFETY: per ibv_post_send, an inline SGE names `length` readable bytes, copied
            // before the call returns.
            let data = unsafe { std::slice::from_raw_parts(s.addr as usize as *const u8, n) };
            batch.add_inline(data);
        }
        if let Some(last) = batch.wrs.last_mut() {
            last.flags |= SendFlags::INLINE;
            last.inline
                .get_or_insert(batch.bytes.len()..batch.bytes.len());
        }
    } else {
        batch.add_sges(list.iter().map(sge));
    }
    Ok(())
}

/// Posts a classic WR list: WRs before a failing one are posted, `*bad_wr` names the failing
/// one and its errno is returned.
///
/// # Safety
///
/// `wr` is a valid NULL-terminated list; `bad_wr` is NULL or writable.
unsafe fn post_send_list(
    qp: &QpInner,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    with_scratch(|batch| {
        let mut ptrs: Vec<*mut ibv_send_wr> = Vec::new();
        let mut cur = wr;
        let mut conv_err = None;
        while !cur.is_null() {
            // SAFETY: a node of the caller's list.
            let w = unsafe { &*cur };
            // SAFETY: per ibv_post_send's contract.
            if let Err(e) = unsafe { add_send_wr(batch, w, qp.ud) } {
                batch.wrs.truncate(ptrs.len());
                conv_err = Some((ptrs.len(), e));
                ptrs.push(cur);
                break;
            }
            ptrs.push(cur);
            cur = w.next;
        }
        let result = match batch.post(&qp.udp) {
            Err(e) => Some((e.index, e.error.errno())),
            Ok(()) => conv_err,
        };
        match result {
            None => 0,
            Some((i, errno)) => {
                if !bad_wr.is_null() {
                    let p = ptrs.get(i).copied().unwrap_or(wr);
                    // SAFETY: the caller's out-pointer.
                    unsafe { bad_wr.write(p) };
                }
                errno
            }
        }
    })
}

/// `ops.post_send` (`ibv_post_send`).
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live QP of ours (or NULL).
        let Some(inner) = (unsafe { qp_inner(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: ibv_post_send's contract.
        unsafe { post_send_list(inner, wr, bad_wr) }
    })
}

/// Posts a receive WR list through `post`, with `ibv_post_recv`'s `bad_wr` semantics.
///
/// # Safety
///
/// `wr` is a valid NULL-terminated list; `bad_wr` is NULL or writable.
pub(crate) unsafe fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl FnOnce(&[RecvWr<'_>]) -> Result<(), PostError>,
) -> c_int {
    let mut all: Vec<Sge> = Vec::new();
    let mut items: Vec<(u64, Range<usize>, *mut ibv_recv_wr)> = Vec::new();
    let mut cur = wr;
    let mut conv_err = None;
    while !cur.is_null() {
        // SAFETY: a node of the caller's list.
        let w = unsafe { &*cur };
        // SAFETY: per ibv_post_recv's contract.
        match unsafe { sges(w.sg_list, w.num_sge) } {
            Ok(list) => {
                let start = all.len();
                all.extend(list.iter().map(sge));
                items.push((w.wr_id, start..all.len(), cur));
            }
            Err(e) => {
                conv_err = Some((items.len(), e, cur));
                break;
            }
        }
        cur = w.next;
    }
    let wrs: Vec<RecvWr<'_>> = items
        .iter()
        .map(|(id, r, _)| RecvWr::new(*id, &all[r.clone()]))
        .collect();
    let result = match post(&wrs) {
        Err(e) => Some((e.error.errno(), items.get(e.index).map_or(wr, |i| i.2))),
        Ok(()) => conv_err.map(|(_, e, p)| (e, p)),
    };
    match result {
        None => 0,
        Some((errno, p)) => {
            if !bad_wr.is_null() {
                // SAFETY: the caller's out-pointer.
                unsafe { bad_wr.write(p) };
            }
            errno
        }
    }
}

/// `ops.post_recv` (`ibv_post_recv`).
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live QP of ours (or NULL).
        let Some(inner) = (unsafe { qp_inner(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: ibv_post_recv's contract.
        unsafe { post_recv_list(wr, bad_wr, |wrs| inner.udp.post_recv(wrs)) }
    })
}

// ---- ibv_qp_ex builder ---------------------------------------------------------------------

/// Runs `f` on the QP's builder (nothing for a NULL or poisoned one).
fn with_builder(qp: *mut ibv_qp_ex, f: impl FnOnce(&mut Batch)) {
    guard((), || {
        // SAFETY: a live QP of ours (or NULL).
        if let Some(inner) = unsafe { qp_inner(qp) }
            && let Ok(mut b) = inner.builder.lock()
        {
            f(&mut b);
        }
    })
}

/// Starts a work request of `op` with the QP's current `wr_id` and `wr_flags`.
pub(crate) fn start_wr(qp: *mut ibv_qp_ex, op: SendOp) {
    if qp.is_null() {
        return;
    }
    // SAFETY: a live QP; `wr_id`/`wr_flags` are the public fields the application set.
    let (wr_id, flags) = unsafe { ((*qp).wr_id, (*qp).wr_flags) };
    with_builder(qp, |b| b.push(wr_id, flags, op));
}

pub(crate) fn fail_wr(qp: *mut ibv_qp_ex, errno: c_int) {
    with_builder(qp, |b| {
        b.error.get_or_insert(errno);
    });
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    with_builder(qp, Batch::clear);
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live QP of ours (or NULL).
        let Some(inner) = (unsafe { qp_inner(qp) }) else {
            return libc::EINVAL;
        };
        let Ok(mut b) = inner.builder.lock() else {
            return libc::EIO;
        };
        let r = match b.error {
            Some(e) => e,
            None => match b.post(&inner.udp) {
                Ok(()) => 0,
                Err(e) => e.error.errno(),
            },
        };
        b.clear();
        r
    })
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    with_builder(qp, Batch::clear);
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    start_wr(qp, SendOp::Send);
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    start_wr(
        qp,
        SendOp::SendWithImm {
            imm: u32::from_be(imm),
        },
    );
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    start_wr(qp, SendOp::RdmaWrite { remote_addr, rkey });
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    let imm = u32::from_be(imm);
    start_wr(
        qp,
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        },
    );
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    start_wr(qp, SendOp::RdmaRead { remote_addr, rkey });
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    let op = SendOp::AtomicCmpAndSwp {
        remote_addr,
        rkey,
        compare,
        swap,
    };
    start_wr(qp, op);
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    start_wr(
        qp,
        SendOp::AtomicFetchAndAdd {
            remote_addr,
            rkey,
            add,
        },
    );
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    with_builder(qp, |b| b.add_sges([Sge { addr, length, lkey }]));
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    if num_sge > 0 && sg_list.is_null() {
        return fail_wr(qp, libc::EINVAL);
    }
    with_builder(qp, |b| {
        if num_sge == 0 {
            return b.add_sges([]);
        }
        // SAFETY: ibv_wr_set_sge_list's contract: `sg_list` holds `num_sge` entries.
        let list = unsafe { std::slice::from_raw_parts(sg_list, num_sge) };
        b.add_sges(list.iter().map(sge));
    });
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    if length > 0 && addr.is_null() {
        return fail_wr(qp, libc::EINVAL);
    }
    with_builder(qp, |b| {
        let data: &[u8] = if length == 0 {
            &[]
        } else {
            // SAFETY: ibv_wr_set_inline_data's contract: `length` readable bytes at `addr`,
            // copied now.
            unsafe { std::slice::from_raw_parts(addr.cast(), length) }
        };
        b.add_inline(data);
    });
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    if num_buf > 0 && buf_list.is_null() {
        return fail_wr(qp, libc::EINVAL);
    }
    with_builder(qp, |b| {
        if num_buf == 0 {
            return b.add_inline(&[]);
        }
        // SAFETY: the contract: `buf_list` holds `num_buf` entries.
        let bufs = unsafe { std::slice::from_raw_parts(buf_list, num_buf) };
        for d in bufs {
            if d.length == 0 {
                b.add_inline(&[]);
                continue;
            }
            if d.addr.is_null() {
                b.error.get_or_insert(libc::EINVAL);
                return;
            }
            // SAFETY: each buffer names `length` readable bytes, copied now.
            b.add_inline(unsafe { std::slice::from_raw_parts(d.addr.cast(), d.length) });
        }
    });
}

unsafe extern "C" fn wr_unsupported_u32(qp: *mut ibv_qp_ex, _v: u32) {
    fail_wr(qp, libc::EOPNOTSUPP);
}

unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _hdr: *mut c_void, _hdr_sz: u16, _mss: u16) {
    fail_wr(qp, libc::EOPNOTSUPP);
}

/// `ibv_wr_set_ud_addr`: the destination of the current work request of a UD QP
/// (`EOPNOTSUPP` on other QP types, `EINVAL` for a NULL AH; reported by `wr_complete`).
unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    // SAFETY: a live QP of ours (or NULL).
    let ud = unsafe { qp_inner(qp) }.is_some_and(|i| i.ud);
    if !ud {
        return fail_wr(qp, libc::EOPNOTSUPP);
    }
    // SAFETY: ibv_wr_set_ud_addr's contract: a live AH of this library (or NULL).
    let Some(handle) = (unsafe { ah_handle(ah) }) else {
        return fail_wr(qp, libc::EINVAL);
    };
    with_builder(qp, |b| {
        b.set_ud(UdDest {
            ah: handle,
            remote_qpn: qpn,
            remote_qkey: qkey,
        });
    });
}

unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    _rkey: u32,
    _remote_addr: u64,
    _wr: *const c_void,
) {
    fail_wr(qp, libc::EOPNOTSUPP);
}
