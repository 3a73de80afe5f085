//! Fuzz target `verbs_ops`: arbitrary verbs calls against the in-process backend
//! (`emu_sim::SimProvider`) compared with a reference model of the object lifecycle and the RC
//! QP state machine (rc-transport.md §5.1, §5.2, §6.3, §7).

use core::net::{IpAddr, Ipv4Addr};
use std::collections::HashMap;

use emu_sim::{SimCq, SimMr, SimPd, SimProvider, SimQp, SimSrq};
use verbs_api::{
    AccessFlags, AhAttr, CompletionQueue, Context, ErrorKind, Gid, MemoryRegion, Mtu, PostError,
    ProtectionDomain, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, QueuePair, RecvWr,
    SendFlags, SendOp, SendWr, Sge, SharedReceiveQueue, SrqAttr, WcStatus, WorkCompletion,
};

use super::common::Input;

/// Calls per input at most.
const MAX_CALLS: usize = 200;
/// Objects of each kind at most (creations beyond are skipped).
const MAX_OBJECTS: usize = 12;

// Device limits the model knows (rxe's, `emu_proto::Limits::default`).
const MAX_QP_WR: u32 = 0x4000;
const MAX_SGE: u32 = 32;
const MAX_CQE: u32 = 0x7FFF;
const MAX_SRQ_WR: u32 = 0x4000;
const MAX_SRQ_SGE: u32 = 27;
const MAX_INLINE: u32 = 512;
const MAX_RD_ATOMIC: u8 = 128;
const MAX_MSG: u64 = 0x8000_0000;

/// Fuzz target `verbs_ops`: up to 200 verbs calls, valid and invalid, on device 0 of an
/// `emu_sim::SimProvider` (two devices, virtual time): alloc/destroy PD, alloc/destroy MR
/// (lengths, every access bit), create/destroy/resize/poll CQ, create/destroy/post/arm/query
/// SRQ, create (RC/UC, capacities around the limits, with or without SRQ)/destroy/query QP,
/// modify QP (target states, masks that are exact, short, padded or carry unknown bits, values
/// in and out of range), post_send (every opcode, SGE counts, inline, atomic shape, bogus keys)
/// and post_recv. QPs point at device 1, where no QP listens: sends retry and fail, nothing
/// ever succeeds.
///
/// A reference model written from the spec predicts every result. Asserts, besides "never
/// panics":
/// * every create/destroy/post/modify succeeds iff the model says so, and fails with the
///   model's error kind (`Destroyed`, `Busy`, `InvalidArgument`, `InvalidState`, `NotSupported`,
///   `NoMemory`) and, for posts, at the model's WR index;
/// * `modify`: unknown mask bits → `NotSupported`; a transition not in §5.1's table →
///   `InvalidState`; a mask not exactly required ⊆ given ⊆ required ∪ optional →
///   `InvalidArgument`; out-of-range values → `InvalidArgument`; a failed modify changes
///   nothing (queried attributes equal the model's);
/// * `post_send`/`post_recv` per §5.2: state, SGE counts, inline rules, atomic shape, message
///   size, full queues;
/// * the QP state only changes by a successful modify, except RTS/SQD → ERR for a QP that
///   posted sends (its retries fail);
/// * completions: no SUCCESS (there is no peer); each WR completes at most once, in posting
///   order per queue, on the CQ of its queue; receive completions are flushes.
pub fn verbs_ops(data: &[u8]) {
    let mut inp = Input::new(data);
    let sim = match SimProvider::builder().seed(u64::from(inp.u8())).build() {
        Ok(sim) => sim,
        Err(e) => panic!("building the provider failed: {e}"),
    };
    let ctx = match sim.context(0) {
        Ok(ctx) => ctx,
        Err(e) => panic!("opening device 0 failed: {e}"),
    };
    let mut m = Model {
        ctx,
        pds: Vec::new(),
        mrs: Vec::new(),
        cqs: Vec::new(),
        srqs: Vec::new(),
        qps: Vec::new(),
        wrs: HashMap::new(),
        next_wr_id: 1,
    };
    for _ in 0..MAX_CALLS {
        if inp.is_empty() {
            break;
        }
        m.call(&mut inp);
        m.sync();
    }
}

/// Legal RC transitions: (required, optional) mask bits, rc-transport.md §5.1 (STATE aside).
fn transition(from: QpState, to: QpState) -> Option<(QpAttrMask, QpAttrMask)> {
    use QpAttrMask as M;
    use QpState::*;
    let none = M::empty();
    Some(match (from, to) {
        (Reset, Reset) => (none, none),
        // RECOVERY: softverbs' loss-recovery extension, settable until the QP is in RTR.
        (Reset, Init) => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, M::RECOVERY),
        (Init, Init) => (
            none,
            M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS | M::RECOVERY,
        ),
        (Init, Rtr) => (
            M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
            M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::RECOVERY,
        ),
        (Rtr, Rts) => (
            M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
            M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
        ),
        (Rts, Rts) | (Sqd, Rts) => (
            none,
            M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
        ),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (
            none,
            M::PORT
                | M::AV
                | M::TIMEOUT
                | M::RETRY_CNT
                | M::RNR_RETRY
                | M::MAX_QP_RD_ATOMIC
                | M::MAX_DEST_RD_ATOMIC
                | M::ALT_PATH
                | M::ACCESS_FLAGS
                | M::PKEY_INDEX
                | M::MIN_RNR_TIMER
                | M::PATH_MIG_STATE,
        ),
        (Init | Rtr | Rts | Sqd | Sqe | Err, Reset | Err) => (none, none),
        _ => return None,
    })
}

/// The value rules of §5.1 ("extra rules") for the fields `mask` names.
fn values_ok(attr: &QpAttr, mask: QpAttrMask, state: QpState) -> bool {
    use QpAttrMask as M;
    let remote = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let ah = &attr.ah_attr;
    let bad = [
        mask.contains(M::CUR_STATE) && attr.cur_qp_state != state,
        mask.contains(M::ALT_PATH),
        mask.contains(M::ACCESS_FLAGS) && !remote.contains(attr.qp_access_flags),
        mask.contains(M::PKEY_INDEX) && attr.pkey_index != 0,
        mask.contains(M::PORT) && attr.port_num != 1,
        mask.contains(M::AV)
            && (ah.port_num > 1 || ah.sgid_index != 0 || ah.dgid.is_zero() || ah.udp_dport == 0),
        mask.contains(M::DEST_QPN) && attr.dest_qp_num > 0xFF_FFFF,
        mask.contains(M::RQ_PSN) && attr.rq_psn > 0xFF_FFFF,
        mask.contains(M::SQ_PSN) && attr.sq_psn > 0xFF_FFFF,
        mask.contains(M::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > MAX_RD_ATOMIC,
        mask.contains(M::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > MAX_RD_ATOMIC,
        mask.contains(M::MIN_RNR_TIMER) && attr.min_rnr_timer > 31,
        mask.contains(M::TIMEOUT) && attr.timeout > 31,
        mask.contains(M::RETRY_CNT) && attr.retry_cnt > 7,
        mask.contains(M::RNR_RETRY) && attr.rnr_retry > 7,
    ];
    !bad.contains(&true)
}

/// Copies the fields `mask` names (what `query` must then report).
fn apply(dst: &mut QpAttr, a: &QpAttr, mask: QpAttrMask) {
    use QpAttrMask as M;
    let m = |bit| mask.contains(bit);
    if m(M::EN_SQD_ASYNC_NOTIFY) {
        dst.en_sqd_async_notify = a.en_sqd_async_notify;
    }
    if m(M::ACCESS_FLAGS) {
        dst.qp_access_flags = a.qp_access_flags;
    }
    if m(M::PKEY_INDEX) {
        dst.pkey_index = a.pkey_index;
    }
    if m(M::PORT) {
        dst.port_num = a.port_num;
    }
    if m(M::AV) {
        dst.ah_attr = a.ah_attr;
    }
    if m(M::PATH_MTU) {
        dst.path_mtu = a.path_mtu;
    }
    if m(M::TIMEOUT) {
        dst.timeout = a.timeout;
    }
    if m(M::RETRY_CNT) {
        dst.retry_cnt = a.retry_cnt;
    }
    if m(M::RNR_RETRY) {
        dst.rnr_retry = a.rnr_retry;
    }
    if m(M::RQ_PSN) {
        dst.rq_psn = a.rq_psn;
    }
    if m(M::MAX_QP_RD_ATOMIC) {
        dst.max_rd_atomic = a.max_rd_atomic;
    }
    if m(M::MIN_RNR_TIMER) {
        dst.min_rnr_timer = a.min_rnr_timer;
    }
    if m(M::SQ_PSN) {
        dst.sq_psn = a.sq_psn;
    }
    if m(M::MAX_DEST_RD_ATOMIC) {
        dst.max_dest_rd_atomic = a.max_dest_rd_atomic;
    }
    if m(M::DEST_QPN) {
        dst.dest_qp_num = a.dest_qp_num;
    }
}

/// The attributes `query` reports, for comparison.
fn observable(a: &QpAttr) -> impl PartialEq + core::fmt::Debug {
    (
        (a.qp_state, a.path_mtu, a.rq_psn, a.sq_psn, a.dest_qp_num),
        (a.qp_access_flags, a.pkey_index, a.port_num, a.ah_attr),
        (a.timeout, a.retry_cnt, a.rnr_retry, a.min_rnr_timer),
        (
            a.max_rd_atomic,
            a.max_dest_rd_atomic,
            a.en_sqd_async_notify,
            a.cap,
        ),
    )
}

/// What the model expects of a `modify`.
#[derive(Copy, Clone, Debug)]
enum Want {
    Ok,
    Fail(ErrorKind),
    /// From SQD with sends that may be in flight: success, or InvalidState while draining.
    OkOrDraining,
    /// As `OkOrDraining`, with a bad value: InvalidState while draining, else InvalidArgument.
    DrainingOrInvalid,
}

fn kind_of<T>(r: &verbs_api::Result<T>) -> Option<ErrorKind> {
    r.as_ref().err().map(|e| e.kind)
}

struct Pd {
    h: SimPd,
    alive: bool,
    /// Live MRs, QPs and SRQs in it.
    refs: u32,
}

struct Mr {
    h: SimMr,
    alive: bool,
    pd: usize,
}

struct Cq {
    h: SimCq,
    alive: bool,
    /// Live QPs using it (twice for a QP using it for both queues).
    refs: u32,
}

struct Srq {
    h: SimSrq,
    alive: bool,
    pd: usize,
    refs: u32,
    attr: SrqAttr,
    posted: u32,
}

struct Qp {
    h: SimQp,
    alive: bool,
    pd: usize,
    scq: usize,
    rcq: usize,
    srq: Option<usize>,
    /// The model's attributes (state included).
    attr: QpAttr,
    /// Send WRs queued (RTS/SQD) since the last RESET: a bound on the send queue's length.
    sq_posted: u32,
    /// Receive WQEs queued (exact: nothing consumes them).
    rq_len: u32,
    /// A send WR was queued since the last RESET: the QP may fail on its own (RTS/SQD → ERR)
    /// and may be draining in SQD.
    sent_any: bool,
    last_send_wc: Option<u64>,
    last_recv_wc: Option<u64>,
}

struct Model {
    ctx: emu_sim::SimContext,
    pds: Vec<Pd>,
    mrs: Vec<Mr>,
    cqs: Vec<Cq>,
    srqs: Vec<Srq>,
    qps: Vec<Qp>,
    /// Posted WRs: wr_id → (QP index, send queue?).
    wrs: HashMap<u64, (usize, bool)>,
    next_wr_id: u64,
}

/// An index into `v` (`None` if empty).
fn pick<T>(inp: &mut Input<'_>, v: &[T]) -> Option<usize> {
    (!v.is_empty()).then(|| inp.index(v.len()))
}

fn access_from(inp: &mut Input<'_>) -> AccessFlags {
    // Mostly valid combinations; sometimes unknown, optional-range or unsupported bits.
    let base = [
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        AccessFlags::LOCAL_WRITE,
        AccessFlags::REMOTE_READ,
        AccessFlags::empty(),
        AccessFlags::REMOTE_WRITE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
        AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND | AccessFlags::HUGETLB,
        AccessFlags::ZERO_BASED,
        AccessFlags::ON_DEMAND | AccessFlags::LOCAL_WRITE,
        AccessFlags::from_bits_retain(1 << 8),
        AccessFlags::from_bits_retain(1 << 21) | AccessFlags::LOCAL_WRITE,
        AccessFlags::from_bits_retain(1 << 30),
        AccessFlags::RELAXED_ORDERING | AccessFlags::REMOTE_READ,
    ];
    base[inp.index(base.len())]
}

impl Model {
    fn call(&mut self, inp: &mut Input<'_>) {
        match inp.u8() % 24 {
            0 | 1 => self.alloc_pd(),
            2 => self.destroy_pd(inp),
            3 | 4 => self.alloc_mr(inp),
            5 => self.destroy_mr(inp),
            6 | 7 => self.create_cq(inp),
            8 => self.destroy_cq(inp),
            9 => self.create_srq(inp),
            10 => self.destroy_srq(inp),
            11 | 12 => self.create_qp(inp),
            13 => self.destroy_qp(inp),
            14..=17 => self.modify(inp),
            18 | 19 => self.post_send(inp),
            20 => self.post_recv(inp),
            21 => self.post_srq_recv(inp),
            22 => self.poll(inp),
            _ => self.misc(inp),
        }
    }

    fn alloc_pd(&mut self) {
        if self.pds.len() >= MAX_OBJECTS {
            return;
        }
        match self.ctx.alloc_pd() {
            Ok(h) => self.pds.push(Pd {
                h,
                alive: true,
                refs: 0,
            }),
            Err(e) => panic!("alloc_pd failed: {e}"),
        }
    }

    fn destroy_pd(&mut self, inp: &mut Input<'_>) {
        let Some(i) = pick(inp, &self.pds) else {
            return;
        };
        let pd = &mut self.pds[i];
        let want = if !pd.alive {
            Some(ErrorKind::Destroyed)
        } else if pd.refs > 0 {
            Some(ErrorKind::Busy)
        } else {
            None
        };
        let got = pd.h.destroy();
        assert_eq!(kind_of(&got), want, "destroy PD {i}: {got:?}");
        if got.is_ok() {
            pd.alive = false;
        }
    }

    fn alloc_mr(&mut self, inp: &mut Input<'_>) {
        let Some(p) = pick(inp, &self.pds) else {
            return;
        };
        if self.mrs.len() >= MAX_OBJECTS {
            return;
        }
        let len = match inp.below(4) {
            0 => 1 + inp.below(8192) as usize,
            1 => 0,
            2 => 1 + inp.below(16) as usize,
            _ => 4096,
        };
        let access = access_from(inp);
        let known = AccessFlags::all().bits() | 0x3FF0_0000;
        let want = if len == 0 {
            Some(ErrorKind::InvalidArgument)
        } else if !self.pds[p].alive {
            Some(ErrorKind::Destroyed)
        } else if access.bits() & !known != 0
            || (access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
                && !access.contains(AccessFlags::LOCAL_WRITE))
        {
            Some(ErrorKind::InvalidArgument)
        } else if access.intersects(AccessFlags::ZERO_BASED | AccessFlags::ON_DEMAND) {
            Some(ErrorKind::NotSupported)
        } else {
            None
        };
        let got = self.ctx.alloc_mr(&self.pds[p].h, len, access);
        assert_eq!(
            kind_of(&got),
            want,
            "alloc_mr({len}, {access:?}) in PD {p}: {:?}",
            got.as_ref().err()
        );
        if let Ok(h) = got {
            assert_eq!((h.len(), h.access()), (len, access));
            self.pds[p].refs += 1;
            self.mrs.push(Mr {
                h,
                alive: true,
                pd: p,
            });
        }
    }

    fn destroy_mr(&mut self, inp: &mut Input<'_>) {
        let Some(i) = pick(inp, &self.mrs) else {
            return;
        };
        let mr = &mut self.mrs[i];
        let want = (!mr.alive).then_some(ErrorKind::Destroyed);
        let got = mr.h.destroy();
        assert_eq!(kind_of(&got), want, "destroy MR {i}: {got:?}");
        if got.is_ok() {
            mr.alive = false;
            self.pds[mr.pd].refs -= 1;
        }
    }

    fn create_cq(&mut self, inp: &mut Input<'_>) {
        if self.cqs.len() >= MAX_OBJECTS {
            return;
        }
        let cqe = match inp.below(4) {
            0 => 1 + inp.below(64),
            1 => 0,
            2 => MAX_CQE + inp.below(2),
            _ => 1 + inp.below(4),
        };
        let want = (cqe == 0 || cqe > MAX_CQE).then_some(ErrorKind::InvalidArgument);
        let got = self.ctx.create_cq(cqe, None);
        assert_eq!(
            kind_of(&got),
            want,
            "create_cq({cqe}): {:?}",
            got.as_ref().err()
        );
        if let Ok(h) = got {
            self.cqs.push(Cq {
                h,
                alive: true,
                refs: 0,
            });
        }
    }

    fn destroy_cq(&mut self, inp: &mut Input<'_>) {
        let Some(i) = pick(inp, &self.cqs) else {
            return;
        };
        let cq = &mut self.cqs[i];
        let want = if !cq.alive {
            Some(ErrorKind::Destroyed)
        } else if cq.refs > 0 {
            Some(ErrorKind::Busy)
        } else {
            None
        };
        let got = cq.h.destroy();
        assert_eq!(kind_of(&got), want, "destroy CQ {i}: {got:?}");
        if got.is_ok() {
            cq.alive = false;
        }
    }

    fn create_srq(&mut self, inp: &mut Input<'_>) {
        let Some(p) = pick(inp, &self.pds) else {
            return;
        };
        if self.srqs.len() >= MAX_OBJECTS {
            return;
        }
        let attr = SrqAttr {
            max_wr: match inp.below(4) {
                0 => 1 + inp.below(8),
                1 => 0,
                2 => MAX_SRQ_WR + inp.below(2),
                _ => 2,
            },
            max_sge: match inp.below(4) {
                0 | 1 => inp.below(4),
                2 => MAX_SRQ_SGE,
                _ => MAX_SRQ_SGE + 1,
            },
            srq_limit: inp.below(4),
        };
        let want = if !self.pds[p].alive {
            Some(ErrorKind::Destroyed)
        } else if attr.max_wr == 0 || attr.max_wr > MAX_SRQ_WR || attr.max_sge > MAX_SRQ_SGE {
            Some(ErrorKind::InvalidArgument)
        } else {
            None
        };
        let got = self.ctx.create_srq(&self.pds[p].h, &attr);
        assert_eq!(
            kind_of(&got),
            want,
            "create_srq({attr:?}): {:?}",
            got.as_ref().err()
        );
        if let Ok(h) = got {
            self.pds[p].refs += 1;
            self.srqs.push(Srq {
                h,
                alive: true,
                pd: p,
                refs: 0,
                // srq_limit is ignored at creation (the limit starts disarmed).
                attr: SrqAttr {
                    srq_limit: 0,
                    ..attr
                },
                posted: 0,
            });
        }
    }

    fn destroy_srq(&mut self, inp: &mut Input<'_>) {
        let Some(i) = pick(inp, &self.srqs) else {
            return;
        };
        let srq = &mut self.srqs[i];
        let want = if !srq.alive {
            Some(ErrorKind::Destroyed)
        } else if srq.refs > 0 {
            Some(ErrorKind::Busy)
        } else {
            None
        };
        let got = srq.h.destroy();
        assert_eq!(kind_of(&got), want, "destroy SRQ {i}: {got:?}");
        if got.is_ok() {
            srq.alive = false;
            self.pds[srq.pd].refs -= 1;
        }
    }

    fn create_qp(&mut self, inp: &mut Input<'_>) {
        let (Some(p), Some(s), Some(r)) = (
            pick(inp, &self.pds),
            pick(inp, &self.cqs),
            pick(inp, &self.cqs),
        ) else {
            return;
        };
        if self.qps.len() >= MAX_OBJECTS {
            return;
        }
        let srq = if inp.below(4) == 3 {
            pick(inp, &self.srqs)
        } else {
            None
        };
        // The engine has UC and UD QPs, but this model follows RC QPs only: a UC QP it
        // creates is checked like an RC one at creation and destroyed at once.
        let qp_type = match inp.below(16) {
            14 | 15 => QpType::Uc,
            _ => QpType::Rc,
        };
        let wr = |inp: &mut Input<'_>| match inp.below(8) {
            0..=3 => 1 + inp.below(8),
            4 => 0,
            5 => MAX_QP_WR,
            6 => MAX_QP_WR + 1,
            _ => 2,
        };
        let sge = |inp: &mut Input<'_>| match inp.below(8) {
            0..=4 => inp.below(4),
            5 => MAX_SGE,
            6 => MAX_SGE + 1,
            _ => 1,
        };
        let cap = QpCap {
            max_send_wr: wr(inp),
            max_recv_wr: wr(inp),
            max_send_sge: sge(inp),
            max_recv_sge: sge(inp),
            max_inline_data: match inp.below(8) {
                0..=3 => 0,
                4 => 64,
                5 => MAX_INLINE,
                6 => MAX_INLINE + 1,
                _ => 16,
            },
        };
        let init = QpInitAttr {
            qp_type,
            cap,
            sq_sig_all: inp.u8() & 1 == 1,
        };
        let too_big = cap.max_send_wr > MAX_QP_WR
            || cap.max_recv_wr > MAX_QP_WR
            || cap.max_send_sge > MAX_SGE
            || cap.max_recv_sge > MAX_SGE
            || cap.max_inline_data > MAX_INLINE;
        let dead = !self.pds[p].alive
            || !self.cqs[s].alive
            || !self.cqs[r].alive
            || srq.is_some_and(|q| !self.srqs[q].alive);
        let want = if dead {
            Some(ErrorKind::Destroyed)
        } else if srq.is_some_and(|q| self.srqs[q].pd != p) || too_big {
            Some(ErrorKind::InvalidArgument)
        } else {
            None
        };
        let got = self.ctx.create_qp(
            &self.pds[p].h,
            &self.cqs[s].h,
            &self.cqs[r].h,
            srq.map(|q| &self.srqs[q].h),
            &init,
        );
        assert_eq!(
            kind_of(&got),
            want,
            "create_qp({init:?}): {:?}",
            got.as_ref().err()
        );
        let Ok(h) = got else {
            return;
        };
        if qp_type != QpType::Rc {
            assert_eq!(h.qp_type(), qp_type);
            assert!(h.destroy().is_ok(), "destroy a fresh {qp_type:?} QP");
            return;
        }
        self.pds[p].refs += 1;
        self.cqs[s].refs += 1;
        self.cqs[r].refs += 1;
        if let Some(q) = srq {
            self.srqs[q].refs += 1;
        }
        let cap = if srq.is_some() {
            QpCap {
                max_recv_wr: 0,
                max_recv_sge: 0,
                ..cap
            }
        } else {
            cap
        };
        let attr = QpAttr {
            cap,
            ..QpAttr::default()
        };
        self.qps.push(Qp {
            h,
            alive: true,
            pd: p,
            scq: s,
            rcq: r,
            srq,
            attr,
            sq_posted: 0,
            rq_len: 0,
            sent_any: false,
            last_send_wc: None,
            last_recv_wc: None,
        });
    }

    fn destroy_qp(&mut self, inp: &mut Input<'_>) {
        let Some(i) = pick(inp, &self.qps) else {
            return;
        };
        let qp = &mut self.qps[i];
        let want = (!qp.alive).then_some(ErrorKind::Destroyed);
        let got = qp.h.destroy();
        assert_eq!(kind_of(&got), want, "destroy QP {i}: {got:?}");
        if got.is_ok() {
            qp.alive = false;
            self.pds[qp.pd].refs -= 1;
            self.cqs[qp.scq].refs -= 1;
            self.cqs[qp.rcq].refs -= 1;
            if let Some(q) = qp.srq {
                self.srqs[q].refs -= 1;
            }
        }
    }

    fn modify(&mut self, inp: &mut Input<'_>) {
        use QpState::*;
        let Some(i) = pick(inp, &self.qps) else {
            return;
        };
        let from = self.qps[i].attr.qp_state;
        let natural = match from {
            Reset => Init,
            Init => Rtr,
            Rtr | Rts | Sqd => Rts,
            Sqe | Err => Reset,
        };
        let to = match inp.below(8) {
            1 => Reset,
            2 => Err,
            3 => Sqd,
            4 => QpState::ALL[inp.index(QpState::ALL.len())],
            5 => from,
            _ => natural,
        };
        let (req, opt) = transition(from, to)
            .or_else(|| transition(from, natural))
            .unwrap_or_default();
        let mut mask = QpAttrMask::STATE | req;
        for bit in opt.iter() {
            if inp.below(4) == 3 {
                mask |= bit;
            }
        }
        match inp.below(16) {
            12 => {
                let bits: Vec<QpAttrMask> = req.iter().collect();
                if let Some(&b) = bits.get(inp.index(bits.len().max(1))) {
                    mask -= b;
                }
            }
            13 => mask |= QpAttrMask::from_bits_retain(1 << inp.below(21)),
            14 => mask |= QpAttrMask::from_bits_retain(1 << (21 + inp.below(11))),
            15 => mask -= QpAttrMask::STATE,
            _ => {}
        }
        let mut attr = QpAttr {
            qp_state: to,
            cur_qp_state: from,
            path_mtu: [
                Mtu::Mtu1024,
                Mtu::Mtu256,
                Mtu::Mtu512,
                Mtu::Mtu2048,
                Mtu::Mtu4096,
            ][inp.index(5)],
            qkey: 0,
            rq_psn: inp.u24(),
            sq_psn: inp.u24(),
            dest_qp_num: 0x11 + inp.below(4),
            qp_access_flags: [
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
                AccessFlags::empty(),
                AccessFlags::REMOTE_ATOMIC,
            ][inp.index(3)],
            cap: QpCap::default(),
            ah_attr: AhAttr {
                // Device 1 (where no QP listens) or no device at all; never device 0 itself.
                dgid: Gid::from_ip(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + inp.below(2) as u8))),
                udp_dport: 4791,
                ..AhAttr::default()
            },
            pkey_index: 0,
            en_sqd_async_notify: inp.u8() & 1 == 1,
            sq_draining: false,
            max_rd_atomic: inp.below(17) as u8,
            max_dest_rd_atomic: inp.below(17) as u8,
            min_rnr_timer: inp.below(32) as u8,
            port_num: 1,
            timeout: inp.below(20) as u8,
            retry_cnt: inp.below(8) as u8,
            rnr_retry: inp.below(8) as u8,
            // The RECOVERY mask bit comes from the mask cases above; the value stays IBTA.
            recovery: verbs_api::Recovery::Ibta,
        };
        // Sometimes one value out of range (or a wrong CUR_STATE / zero GID / port).
        match inp.below(32) {
            0 => attr.cur_qp_state = QpState::ALL[inp.index(7)],
            1 => attr.qp_access_flags |= AccessFlags::MW_BIND,
            2 => attr.pkey_index = 1,
            3 => attr.port_num = 2,
            4 => attr.ah_attr.dgid = Gid::default(),
            5 => attr.ah_attr.udp_dport = 0,
            6 => attr.ah_attr.sgid_index = 1,
            7 => attr.ah_attr.port_num = 2,
            8 => attr.dest_qp_num = 0x100_0000,
            9 => attr.rq_psn = 0x100_0000,
            10 => attr.sq_psn = 0x100_0000 + inp.below(4),
            11 => attr.max_dest_rd_atomic = 129,
            12 => attr.max_rd_atomic = 200,
            13 => attr.min_rnr_timer = 32,
            14 => attr.timeout = 32,
            15 => attr.retry_cnt = 8,
            16 => attr.rnr_retry = 9,
            17 => attr.ah_attr.port_num = 0,
            _ => {}
        }
        let qp = &self.qps[i];
        let unknown = mask.bits() & !QpAttrMask::all().bits() != 0;
        let target = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            from
        };
        let table = transition(from, target);
        let given = mask - QpAttrMask::STATE;
        let want = if !qp.alive {
            Want::Fail(ErrorKind::Destroyed)
        } else if unknown {
            Want::Fail(ErrorKind::NotSupported)
        } else if let Some((req, opt)) = table {
            let mask_ok = req.difference(given).is_empty() && (given - req - opt).is_empty();
            // SQD with sends that may still be in flight: "draining" (InvalidState) or not.
            let draining = from == Sqd && !matches!(target, Err | Reset) && qp.sent_any;
            match (mask_ok, draining, values_ok(&attr, mask, from)) {
                (false, _, _) => Want::Fail(ErrorKind::InvalidArgument),
                (true, true, true) => Want::OkOrDraining,
                (true, true, false) => Want::DrainingOrInvalid,
                (true, false, false) => Want::Fail(ErrorKind::InvalidArgument),
                (true, false, true) => Want::Ok,
            }
        } else {
            Want::Fail(ErrorKind::InvalidState)
        };
        let got = qp.h.modify(&attr, mask);
        let fine = match (&want, got.as_ref().map_err(|e| e.kind)) {
            (Want::Ok | Want::OkOrDraining, Ok(())) => true,
            (Want::Fail(k), Result::Err(e)) => *k == e,
            (Want::OkOrDraining, Result::Err(e)) => e == ErrorKind::InvalidState,
            (Want::DrainingOrInvalid, Result::Err(e)) => {
                matches!(e, ErrorKind::InvalidState | ErrorKind::InvalidArgument)
            }
            _ => false,
        };
        assert!(
            fine,
            "modify QP {i} {from} -> {target} mask {mask:?}: model {want:?}, got {got:?} ({attr:?})"
        );
        if got.is_ok() {
            let qp = &mut self.qps[i];
            apply(&mut qp.attr, &attr, mask);
            qp.attr.qp_state = target;
            if target == Reset && from != Reset {
                // Entering RESET clears everything but the capacities.
                qp.attr = QpAttr {
                    cap: qp.attr.cap,
                    ..QpAttr::default()
                };
                qp.sq_posted = 0;
                qp.rq_len = 0;
                qp.sent_any = false;
            }
            if target == Err {
                qp.rq_len = 0;
            }
        }
    }

    /// A scatter/gather list of `n` entries aimed at the MRs (live or not) or anywhere.
    fn sges(&self, inp: &mut Input<'_>, n: u32) -> Vec<Sge> {
        (0..n)
            .map(|_| match pick(inp, &self.mrs) {
                Some(k) if inp.below(8) != 7 => {
                    let mr = &self.mrs[k].h;
                    let len = mr.len() as u64;
                    let off = u64::from(inp.u16()) % len;
                    let l = match inp.below(4) {
                        0 => 8,
                        1 => (len - off) as u32,
                        2 => u32::MAX,
                        _ => inp.below((len - off) as u32 + 1),
                    };
                    Sge {
                        addr: mr.addr() + off,
                        length: l,
                        lkey: mr.lkey(),
                    }
                }
                _ => Sge {
                    addr: inp.u64(),
                    length: inp.below(64),
                    lkey: inp.u32(),
                },
            })
            .collect()
    }

    fn post_send(&mut self, inp: &mut Input<'_>) {
        let Some(i) = pick(inp, &self.qps) else {
            return;
        };
        let n = 1 + inp.below(3) as usize;
        let mut lists = Vec::with_capacity(n);
        let mut specs = Vec::with_capacity(n);
        let inline_buf = vec![0x5Au8; 600];
        for _ in 0..n {
            let remote_addr = if inp.below(8) == 7 {
                inp.u64()
            } else {
                inp.u64() & !7
            };
            let rkey = inp.u32();
            let op = match inp.below(7) {
                0 => SendOp::Send,
                1 => SendOp::SendWithImm { imm: 1 },
                2 => SendOp::RdmaWrite { remote_addr, rkey },
                3 => SendOp::RdmaWriteWithImm {
                    remote_addr,
                    rkey,
                    imm: 2,
                },
                4 => SendOp::RdmaRead { remote_addr, rkey },
                5 => SendOp::AtomicCmpAndSwp {
                    remote_addr,
                    rkey,
                    compare: 0,
                    swap: 1,
                },
                _ => SendOp::AtomicFetchAndAdd {
                    remote_addr,
                    rkey,
                    add: 1,
                },
            };
            let mut flags = SendFlags::from_bits_retain(u32::from(inp.u8() & 0x7));
            let inline = inp.below(4) == 3;
            let inline_len = if inline {
                flags |= SendFlags::INLINE;
                match inp.below(4) {
                    0 => inp.below(17) as usize,
                    1 => 64,
                    2 => 512,
                    _ => 513,
                }
            } else {
                0
            };
            let n_sges = match inp.below(8) {
                0..=4 => u32::from(!inline),
                5 => 0,
                6 => 2,
                _ => 1 + inp.below(40),
            };
            lists.push(self.sges(inp, n_sges));
            specs.push((op, flags, inline_len));
        }
        let wrs: Vec<SendWr<'_>> = specs
            .iter()
            .zip(&lists)
            .map(|(&(op, flags, inline_len), sges)| {
                let id = self.next_wr_id;
                self.next_wr_id += 1;
                SendWr {
                    wr_id: id,
                    op,
                    sg_list: sges,
                    inline_data: &inline_buf[..inline_len],
                    flags,
                    ud: None,
                }
            })
            .collect();
        let qp = &self.qps[i];
        let cap = qp.attr.cap;
        let statically_bad = |wr: &SendWr<'_>| {
            let atomic = wr.op.is_atomic();
            let (remote, sge_ok) = match wr.op {
                SendOp::AtomicCmpAndSwp { remote_addr, .. }
                | SendOp::AtomicFetchAndAdd { remote_addr, .. } => (
                    remote_addr,
                    wr.sg_list.len() == 1 && wr.sg_list[0].length == 8,
                ),
                _ => (0, true),
            };
            let inline = wr.flags.contains(SendFlags::INLINE);
            (inline
                && (!wr.sg_list.is_empty()
                    || wr.op.is_read_or_atomic()
                    || wr.inline_data.len() > cap.max_inline_data as usize))
                || (!inline && wr.sg_list.len() > cap.max_send_sge as usize)
                || (atomic && (!sge_ok || remote % 8 != 0))
                || wr.total_len() > MAX_MSG
        };
        let state = qp.attr.qp_state;
        let bad = wrs.iter().position(statically_bad);
        let got = qp.h.post_send(&wrs);
        let queued = matches!(state, QpState::Rts | QpState::Sqd);
        let accepted = self.check_post(
            &got,
            qp.alive,
            matches!(state, QpState::Rts | QpState::Sqd | QpState::Err),
            bad,
            wrs.len(),
            |k| u64::from(qp.sq_posted) + k as u64 >= u64::from(cap.max_send_wr),
            false,
            "post_send",
        );
        for wr in &wrs[..accepted] {
            self.wrs.insert(wr.wr_id, (i, true));
        }
        let qp = &mut self.qps[i];
        if queued && accepted > 0 {
            qp.sq_posted += accepted as u32;
            qp.sent_any = true;
        }
    }

    /// Checks a post's result against the model: `alive`, `state_ok`, the first statically
    /// bad WR, and `full(k)`: may the queue be full when WR `k` is posted (exactly: is it full,
    /// if `exact`). Returns how many WRs were accepted.
    #[allow(clippy::too_many_arguments)]
    fn check_post(
        &self,
        got: &Result<(), PostError>,
        alive: bool,
        state_ok: bool,
        bad: Option<usize>,
        n: usize,
        full: impl Fn(usize) -> bool,
        exact: bool,
        what: &str,
    ) -> usize {
        let accepted = match got {
            Ok(()) => n,
            Err(e) => e.index,
        };
        if exact && alive && state_ok {
            assert!(
                (0..accepted.min(n)).all(|k| !full(k)),
                "{what}: accepted a WR into a full queue"
            );
        }
        match got {
            Ok(()) => {
                assert!(
                    alive && state_ok,
                    "{what} succeeded on a dead QP or in a bad state"
                );
                assert_eq!(
                    bad, None,
                    "{what} accepted WR {bad:?}, which the model rejects"
                );
                n
            }
            Err(PostError { index, error }) => {
                let want = if !alive {
                    Some((0, ErrorKind::Destroyed))
                } else if !state_ok {
                    Some((0, ErrorKind::InvalidState))
                } else {
                    None
                };
                match (want, error.kind) {
                    (Some(w), _) => assert_eq!((*index, error.kind), w, "{what}: {error}"),
                    (None, ErrorKind::NoMemory) => {
                        assert!(
                            bad.is_none_or(|b| *index < b) && *index < n && full(*index),
                            "{what}: NoMemory at WR {index} ({error}) but the queue cannot be full"
                        );
                    }
                    (None, kind) => assert_eq!(
                        (Some(*index), kind),
                        (bad, ErrorKind::InvalidArgument),
                        "{what}: {error}"
                    ),
                }
                *index
            }
        }
    }

    fn post_recv(&mut self, inp: &mut Input<'_>) {
        let Some(i) = pick(inp, &self.qps) else {
            return;
        };
        let n = 1 + inp.below(3) as usize;
        let lists: Vec<Vec<Sge>> = (0..n)
            .map(|_| {
                let k = match inp.below(8) {
                    0..=5 => 1,
                    6 => 0,
                    _ => 1 + inp.below(40),
                };
                self.sges(inp, k)
            })
            .collect();
        let wrs: Vec<RecvWr<'_>> = lists
            .iter()
            .map(|s| {
                let id = self.next_wr_id;
                self.next_wr_id += 1;
                RecvWr::new(id, s)
            })
            .collect();
        let qp = &self.qps[i];
        let state = qp.attr.qp_state;
        let cap = qp.attr.cap;
        let bad = wrs
            .iter()
            .position(|w| w.sg_list.len() > cap.max_recv_sge as usize);
        let occupancy = if state == QpState::Err { 0 } else { qp.rq_len };
        let got = qp.h.post_recv(&wrs);
        // Exact: nothing consumes receive WQEs here, and in ERR they complete at once.
        let full = |k: usize| {
            u64::from(occupancy) + if state == QpState::Err { 0 } else { k as u64 }
                >= u64::from(cap.max_recv_wr)
        };
        let accepted = self.check_post(
            &got,
            qp.alive,
            state != QpState::Reset && qp.srq.is_none(),
            bad,
            wrs.len(),
            full,
            true,
            "post_recv",
        );
        for wr in &wrs[..accepted] {
            self.wrs.insert(wr.wr_id, (i, false));
        }
        if state != QpState::Err {
            self.qps[i].rq_len += accepted as u32;
        }
    }

    fn post_srq_recv(&mut self, inp: &mut Input<'_>) {
        let Some(i) = pick(inp, &self.srqs) else {
            return;
        };
        let n = 1 + inp.below(3) as usize;
        let lists: Vec<Vec<Sge>> = (0..n)
            .map(|_| {
                let k = inp.below(4);
                self.sges(inp, k)
            })
            .collect();
        let wrs: Vec<RecvWr<'_>> = lists
            .iter()
            .map(|s| {
                let id = self.next_wr_id;
                self.next_wr_id += 1;
                RecvWr::new(id, s)
            })
            .collect();
        let srq = &self.srqs[i];
        let max_sge = srq.attr.max_sge as usize;
        let bad = wrs.iter().position(|w| w.sg_list.len() > max_sge);
        let posted = srq.posted;
        let max_wr = srq.attr.max_wr;
        let got = srq.h.post_recv(&wrs);
        let accepted = self.check_post(
            &got,
            srq.alive,
            true,
            bad,
            wrs.len(),
            |k| u64::from(posted) + k as u64 >= u64::from(max_wr),
            true,
            "post_srq_recv",
        );
        self.srqs[i].posted += accepted as u32;
    }

    fn poll(&mut self, inp: &mut Input<'_>) {
        let Some(c) = pick(inp, &self.cqs) else {
            return;
        };
        let mut out = [WorkCompletion::default(); 16];
        let n = 1 + inp.index(16);
        let got = self.cqs[c].h.poll(&mut out[..n]);
        let alive = self.cqs[c].alive;
        let k = match got {
            Ok(k) => {
                assert!(alive, "poll succeeded on a destroyed CQ");
                assert!(k <= n);
                k
            }
            Err(e) => {
                let want = if alive {
                    ErrorKind::InvalidState // overrun
                } else {
                    ErrorKind::Destroyed
                };
                assert_eq!(e.kind, want, "poll CQ {c}: {e}");
                return;
            }
        };
        for wc in &out[..k] {
            assert_ne!(
                wc.status,
                WcStatus::Success,
                "a success without a peer: {wc:?}"
            );
            let Some(&(q, send)) = self.wrs.get(&wc.wr_id) else {
                panic!("completion for a WR never posted: {wc:?}");
            };
            let qp = &mut self.qps[q];
            assert_eq!(wc.qp_num, qp.h.qp_num(), "{wc:?}");
            assert_eq!(
                if send { qp.scq } else { qp.rcq },
                c,
                "completion on the wrong CQ: {wc:?}"
            );
            let last = if send {
                &mut qp.last_send_wc
            } else {
                &mut qp.last_recv_wc
            };
            assert!(
                last.is_none_or(|l| l < wc.wr_id),
                "WR {} completed after {last:?}: twice or out of order",
                wc.wr_id
            );
            *last = Some(wc.wr_id);
            if !send {
                assert_eq!(wc.status, WcStatus::WrFlushErr, "{wc:?}");
            }
        }
    }

    fn misc(&mut self, inp: &mut Input<'_>) {
        match inp.below(4) {
            0 => {
                let Some(c) = pick(inp, &self.cqs) else {
                    return;
                };
                let cqe = match inp.below(4) {
                    0 => 1 + inp.below(64),
                    1 => 0,
                    2 => MAX_CQE + 1,
                    _ => 1,
                };
                let cq = &self.cqs[c];
                let got = cq.h.resize(cqe);
                match got {
                    Ok(()) => {
                        assert!(
                            cq.alive && cqe != 0 && cqe <= MAX_CQE,
                            "resize to {cqe} succeeded"
                        )
                    }
                    // A valid size below the completions held is refused too (their number
                    // depends on timing the model does not follow).
                    Err(e) => assert_eq!(
                        e.kind,
                        if cq.alive {
                            ErrorKind::InvalidArgument
                        } else {
                            ErrorKind::Destroyed
                        },
                        "resize CQ {c} to {cqe}: {e}"
                    ),
                }
            }
            1 => {
                let Some(s) = pick(inp, &self.srqs) else {
                    return;
                };
                let limit = inp.below(12);
                let srq = &mut self.srqs[s];
                let want = if !srq.alive {
                    Some(ErrorKind::Destroyed)
                } else if limit > srq.attr.max_wr {
                    Some(ErrorKind::InvalidArgument)
                } else {
                    None
                };
                let got = srq.h.arm_limit(limit);
                assert_eq!(kind_of(&got), want, "arm SRQ {s} limit {limit}: {got:?}");
                if got.is_ok() {
                    srq.attr.srq_limit = limit;
                }
            }
            2 => {
                let Some(s) = pick(inp, &self.srqs) else {
                    return;
                };
                let srq = &self.srqs[s];
                match srq.h.query() {
                    Ok(a) => {
                        assert!(srq.alive);
                        assert_eq!(a, srq.attr, "SRQ {s} attributes");
                    }
                    Err(e) => {
                        assert!(!srq.alive && e.kind == ErrorKind::Destroyed, "{e}");
                    }
                }
            }
            _ => {
                // Async events must name objects of this context.
                while let Some(ev) = self.ctx.poll_async_event() {
                    let _ = ev;
                }
            }
        }
    }

    /// After every call: each live QP's queried attributes equal the model's, except that a
    /// QP that posted sends may have failed on its own (RTS/SQD → ERR).
    fn sync(&mut self) {
        for (i, qp) in self.qps.iter_mut().enumerate() {
            let got = qp.h.query();
            if !qp.alive {
                assert_eq!(kind_of(&got), Some(ErrorKind::Destroyed), "query QP {i}");
                continue;
            }
            let a = match got {
                Ok(a) => a,
                Err(e) => panic!("query QP {i} failed: {e}"),
            };
            let model = qp.attr.qp_state;
            if a.qp_state != model {
                assert!(
                    a.qp_state == QpState::Err
                        && matches!(model, QpState::Rts | QpState::Sqd)
                        && qp.sent_any,
                    "QP {i} moved from {model} to {} on its own",
                    a.qp_state
                );
                qp.attr.qp_state = QpState::Err;
                qp.rq_len = 0;
            }
            assert_eq!(observable(&a), observable(&qp.attr), "QP {i} attributes");
            assert_eq!(a.cur_qp_state, a.qp_state);
        }
        // A dead MR's handle refuses access.
        for mr in &self.mrs {
            if !mr.alive {
                let mut b = [0u8; 1];
                assert!(mr.h.read(0, &mut b).is_err(), "a destroyed MR is readable");
            }
        }
    }
}
