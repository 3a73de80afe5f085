//! Queue pairs: the QP object, its attribute/state machine (rc-transport.md §5.1; UC's and
//! UD's masks from the kernel's `qp_state_table`) and the validation of posted work (§5.2).
//!
//! This module decides whether a `modify` or a post is legal and what it changes; it moves no
//! data. The RC transport engines (requester, completer, responder) consume the queues kept
//! here.

use std::collections::VecDeque;

use verbs_api::{
    AccessFlags, Error, MAX_24BIT, Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType, RecvWr, Result,
    SendFlags, SendOp, SendWr, Sge,
};

use crate::config::Limits;
use crate::ids::{CqId, PdId, SrqId};

/// SGEs held inline.
const INLINE_SGES: usize = 2;

/// A posted work request's scatter/gather list, owned: up to [`INLINE_SGES`] elements held
/// inline — most work requests carry one, and a post then allocates nothing — more on the
/// heap. Reads as a slice; prints and compares as one.
#[derive(Clone)]
pub(crate) enum SgeList {
    /// `len` elements at the front of the array.
    Inline { len: u8, sges: [Sge; INLINE_SGES] },
    /// More than [`INLINE_SGES`] elements.
    Heap(Vec<Sge>),
}

impl SgeList {
    /// A copy of `sges`.
    pub(crate) fn new(sges: &[Sge]) -> SgeList {
        if sges.len() > INLINE_SGES {
            return SgeList::Heap(sges.to_vec());
        }
        let mut inline = [Sge::default(); INLINE_SGES];
        inline[..sges.len()].copy_from_slice(sges);
        SgeList::Inline {
            len: sges.len() as u8,
            sges: inline,
        }
    }
}

impl Default for SgeList {
    fn default() -> SgeList {
        SgeList::new(&[])
    }
}

impl core::ops::Deref for SgeList {
    type Target = [Sge];

    fn deref(&self) -> &[Sge] {
        match self {
            SgeList::Inline { len, sges } => &sges[..usize::from(*len)],
            SgeList::Heap(v) => v,
        }
    }
}

impl core::fmt::Debug for SgeList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for SgeList {
    fn eq(&self, other: &SgeList) -> bool {
        **self == **other
    }
}

impl Eq for SgeList {}

/// A send work queue entry: the posted request, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) sges: SgeList,
    /// Inline payload copied at post time (empty unless INLINE).
    pub(crate) inline: Vec<u8>,
    pub(crate) flags: SendFlags,
    /// Whether a successful completion is reported (SIGNALED or `sq_sig_all`).
    pub(crate) signaled: bool,
    pub(crate) length: u64,
    /// UD only: the destination resolved from the work request's AH at post time.
    pub(crate) ud: Option<crate::ud::UdDst>,
    /// Transport progress, set by the requester (all zero until the WQE starts).
    pub(crate) tx: WqeTx,
}

/// A send WQE's transport progress.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct WqeTx {
    /// PSNs were assigned and limits checked (fence, `max_rd_atomic`).
    pub(crate) started: bool,
    /// First PSN of the message (of its response packets, for READ).
    pub(crate) first_psn: crate::wire::Psn,
    /// Packets of the message (response packets, for READ).
    pub(crate) npkts: u32,
    /// Next packet to send; for READ and atomics, `npkts` once the request went out.
    pub(crate) next_pkt: u32,
    /// For READ: the packet index the latest request started at (a retried READ asks for the
    /// remainder only, rc-transport.md §3.8).
    pub(crate) read_from: u32,
    /// Holds one of the `max_rd_atomic` slots.
    pub(crate) holds_slot: bool,
    /// A local error found while starting it; reported when it reaches the head.
    pub(crate) error: Option<verbs_api::WcStatus>,
}

impl WqeTx {
    /// Last PSN of the message.
    pub(crate) fn last_psn(&self) -> crate::wire::Psn {
        self.first_psn.wrapping_add(self.npkts.saturating_sub(1))
    }
}

/// A receive work queue entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) sges: SgeList,
}

impl RecvWqe {
    pub(crate) fn from_wr(wr: &RecvWr<'_>) -> RecvWqe {
        RecvWqe {
            wr_id: wr.wr_id,
            sges: SgeList::new(wr.sg_list),
        }
    }
}

/// One QP.
#[derive(Clone, Debug)]
pub(crate) struct Qp {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) pd: PdId,
    pub(crate) send_cq: CqId,
    pub(crate) recv_cq: CqId,
    pub(crate) srq: Option<SrqId>,
    pub(crate) cap: QpCap,
    pub(crate) sq_sig_all: bool,
    /// Current attributes, `attr.qp_state` being the state.
    pub(crate) attr: QpAttr,
    pub(crate) sq: VecDeque<SendWqe>,
    pub(crate) rq: VecDeque<RecvWqe>,
    /// RC transport state.
    pub(crate) rc: crate::rc::RcState,
    /// `attr.ah_attr.dgid` as an IP address, cached (needed for every packet).
    pub(crate) peer_ip: std::net::IpAddr,
    /// The IP context and ICRC prefixes of the QP's path, for its RC/UC packet builders.
    pub(crate) tx: crate::rc::tx::PathTemplate,
}

impl Qp {
    pub(crate) fn state(&self) -> QpState {
        self.attr.qp_state
    }

    /// The attributes `query` reports.
    pub(crate) fn query(&self) -> QpAttr {
        QpAttr {
            cur_qp_state: self.attr.qp_state,
            cap: self.cap,
            sq_draining: false,
            ..self.attr
        }
    }
}

/// The mask bits libibverbs defines and softverbs' `RECOVERY`; any other bit is unknown
/// (`EOPNOTSUPP`).
const KNOWN_BITS: QpAttrMask = QpAttrMask::all();

/// Required and optional mask bits of an RC transition, or `None` if it is illegal
/// (rc-transport.md §5.1, the kernel's `qp_state_table`).
pub(crate) fn rc_transition(from: QpState, to: QpState) -> Option<(QpAttrMask, QpAttrMask)> {
    use QpAttrMask as M;
    use QpState::*;
    let none = M::empty();
    Some(match (from, to) {
        (Reset, Reset) => (none, none),
        // RECOVERY (a softverbs extension) is set before the QP carries traffic.
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
        (Init | Rtr | Rts | Sqd | Sqe | Err, Reset) => (none, none),
        (Init | Rtr | Rts | Sqd | Sqe | Err, Err) => (none, none),
        _ => return None,
    })
}

/// Required and optional mask bits of a UD transition, or `None` if it is illegal (the
/// kernel's `qp_state_table`: no path, remote or RDMA attributes; `QKEY` where RC has
/// `ACCESS_FLAGS`; RTR → RTS needs only `SQ_PSN`).
pub(crate) fn ud_transition(from: QpState, to: QpState) -> Option<(QpAttrMask, QpAttrMask)> {
    use QpAttrMask as M;
    use QpState::*;
    let none = M::empty();
    Some(match (from, to) {
        (Reset, Reset) => (none, none),
        (Reset, Init) => (M::PKEY_INDEX | M::PORT | M::QKEY, none),
        (Init, Init) => (none, M::PKEY_INDEX | M::PORT | M::QKEY),
        (Init, Rtr) => (none, M::PKEY_INDEX | M::QKEY),
        (Rtr, Rts) => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
        (Rts, Rts) | (Sqd, Rts) | (Sqe, Rts) => (none, M::CUR_STATE | M::QKEY),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (none, M::PKEY_INDEX | M::QKEY),
        (Init | Rtr | Rts | Sqd | Sqe | Err, Reset) => (none, none),
        (Init | Rtr | Rts | Sqd | Sqe | Err, Err) => (none, none),
        _ => return None,
    })
}

/// Required and optional mask bits of a UC transition, or `None` if it is illegal (the
/// kernel's `qp_state_table`): RC's path and access attributes without the ones that only
/// serve acknowledgements, retries and RDMA READ/atomics (`MAX_DEST_RD_ATOMIC`,
/// `MIN_RNR_TIMER`, `TIMEOUT`, `RETRY_CNT`, `RNR_RETRY`, `MAX_QP_RD_ATOMIC`); like UD, SQE →
/// RTS is legal.
pub(crate) fn uc_transition(from: QpState, to: QpState) -> Option<(QpAttrMask, QpAttrMask)> {
    use QpAttrMask as M;
    use QpState::*;
    let none = M::empty();
    let path = M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE;
    Some(match (from, to) {
        (Reset, Reset) => (none, none),
        (Reset, Init) => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        (Init, Init) => (none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        (Init, Rtr) => (
            M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
            M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
        ),
        (Rtr, Rts) => (M::SQ_PSN, path),
        (Rts, Rts) | (Sqd, Rts) => (none, path),
        (Sqe, Rts) => (none, M::CUR_STATE | M::ACCESS_FLAGS),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (
            none,
            M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
        ),
        (Init | Rtr | Rts | Sqd | Sqe | Err, Reset) => (none, none),
        (Init | Rtr | Rts | Sqd | Sqe | Err, Err) => (none, none),
        _ => return None,
    })
}

/// What a legal `modify` asks for, once checked.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Transition {
    pub(crate) from: QpState,
    pub(crate) to: QpState,
}

/// Checks a modify against the current state and limits without changing anything.
///
/// Order of checks: unknown mask bits (`NotSupported`), the transition (`InvalidState`), the
/// mask against the table (`InvalidArgument`, naming missing and extra bits), then each value.
pub(crate) fn check_modify(
    qp: &Qp,
    attr: &QpAttr,
    mask: QpAttrMask,
    limits: &Limits,
    max_mtu: Mtu,
) -> Result<Transition> {
    let unknown = mask.bits() & !KNOWN_BITS.bits();
    if unknown != 0 {
        return Err(Error::unsupported(format!(
            "unknown attribute mask bits {unknown:#x}"
        )));
    }
    let from = qp.state();
    let to = if mask.contains(QpAttrMask::STATE) {
        attr.qp_state
    } else {
        from
    };
    let table = match qp.qp_type {
        QpType::Rc => rc_transition,
        QpType::Ud => ud_transition,
        QpType::Uc => uc_transition,
    };
    let (required, optional) = table(from, to).ok_or_else(|| {
        Error::state(format!(
            "illegal {:?} transition {from} -> {to}",
            qp.qp_type
        ))
    })?;
    let given = mask - QpAttrMask::STATE;
    let missing = required - given;
    let extra = given - required - optional;
    if !missing.is_empty() || !extra.is_empty() {
        return Err(Error::invalid(format!(
            "{from} -> {to}: attribute mask missing {missing:?}, not allowed {extra:?}"
        )));
    }
    if from == QpState::Sqd && to != QpState::Err && to != QpState::Reset && qp.sq_draining() {
        return Err(Error::state("SQD: send queue still draining"));
    }
    check_values(qp, attr, mask, limits, max_mtu)?;
    Ok(Transition { from, to })
}

impl Qp {
    /// True while started send WQEs have not completed (in SQD: the queue is draining).
    pub(crate) fn sq_draining(&self) -> bool {
        self.sq.front().is_some_and(|w| w.tx.started)
    }
}

fn check_values(
    qp: &Qp,
    attr: &QpAttr,
    mask: QpAttrMask,
    limits: &Limits,
    max_mtu: Mtu,
) -> Result<()> {
    use QpAttrMask as M;
    let bad = |what: &str| Err(Error::invalid(what.to_string()));
    if mask.contains(M::CUR_STATE) && attr.cur_qp_state != qp.state() {
        return bad("cur_qp_state does not match the QP's state");
    }
    if mask.contains(M::ALT_PATH) {
        // The core bans automatic path migration on RoCE (rc-transport.md §5.1).
        return bad("alternate paths are not supported on RoCE");
    }
    let remote = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    if mask.contains(M::ACCESS_FLAGS) && !remote.contains(attr.qp_access_flags) {
        return bad("qp_access_flags has bits other than LOCAL_WRITE and REMOTE_*");
    }
    if mask.contains(M::PKEY_INDEX) && attr.pkey_index != 0 {
        return bad("pkey_index out of range (table length 1)");
    }
    if mask.contains(M::PORT) && attr.port_num != 1 {
        return bad("port_num must be 1");
    }
    if mask.contains(M::AV) {
        let ah = &attr.ah_attr;
        if ah.port_num != 1 && ah.port_num != 0 {
            return bad("ah_attr.port_num must be 1");
        }
        if ah.sgid_index != 0 {
            return bad("ah_attr.sgid_index names no GID (only index 0 holds one)");
        }
        if ah.dgid.is_zero() {
            return bad("ah_attr.dgid is zero: RoCE needs a global address");
        }
        if ah.udp_dport == 0 {
            return bad("ah_attr.udp_dport is zero");
        }
    }
    if mask.contains(M::PATH_MTU) && attr.path_mtu > max_mtu {
        return bad("path_mtu above the port's max_mtu");
    }
    if mask.contains(M::DEST_QPN) && attr.dest_qp_num > MAX_24BIT {
        return bad("dest_qp_num is not a 24-bit number");
    }
    if mask.contains(M::RQ_PSN) && attr.rq_psn > MAX_24BIT {
        return bad("rq_psn is not a 24-bit number");
    }
    if mask.contains(M::SQ_PSN) && attr.sq_psn > MAX_24BIT {
        return bad("sq_psn is not a 24-bit number");
    }
    if mask.contains(M::MAX_DEST_RD_ATOMIC)
        && u32::from(attr.max_dest_rd_atomic) > limits.max_rd_atomic
    {
        return bad("max_dest_rd_atomic above the device's max_qp_rd_atom");
    }
    if mask.contains(M::MAX_QP_RD_ATOMIC) && u32::from(attr.max_rd_atomic) > limits.max_rd_atomic {
        return bad("max_rd_atomic above the device's max_qp_init_rd_atom");
    }
    if mask.contains(M::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return bad("min_rnr_timer above 31");
    }
    if mask.contains(M::TIMEOUT) && attr.timeout > 31 {
        return bad("timeout above 31");
    }
    if mask.contains(M::RETRY_CNT) && attr.retry_cnt > 7 {
        return bad("retry_cnt above 7");
    }
    if mask.contains(M::RNR_RETRY) && attr.rnr_retry > 7 {
        return bad("rnr_retry above 7");
    }
    Ok(())
}

/// Copies the fields named by `mask` from `attr` into `dst`.
pub(crate) fn apply_attrs(dst: &mut QpAttr, attr: &QpAttr, mask: QpAttrMask) {
    use QpAttrMask as M;
    macro_rules! copy {
        ($($bit:ident => $field:ident),* $(,)?) => {
            $(if mask.contains(M::$bit) { dst.$field = attr.$field; })*
        };
    }
    copy!(
        STATE => qp_state,
        EN_SQD_ASYNC_NOTIFY => en_sqd_async_notify,
        ACCESS_FLAGS => qp_access_flags,
        PKEY_INDEX => pkey_index,
        PORT => port_num,
        AV => ah_attr,
        PATH_MTU => path_mtu,
        TIMEOUT => timeout,
        RETRY_CNT => retry_cnt,
        RNR_RETRY => rnr_retry,
        RQ_PSN => rq_psn,
        MAX_QP_RD_ATOMIC => max_rd_atomic,
        MIN_RNR_TIMER => min_rnr_timer,
        SQ_PSN => sq_psn,
        MAX_DEST_RD_ATOMIC => max_dest_rd_atomic,
        DEST_QPN => dest_qp_num,
        QKEY => qkey,
        RECOVERY => recovery,
    );
}

/// Checks one send WR against the QP's capacities, the device limits and §5.2's rules; on
/// success returns its message length, for [`send_wqe`].
pub(crate) fn check_send_wr(qp: &Qp, wr: &SendWr<'_>, limits: &Limits) -> Result<u64> {
    let inline = wr.flags.contains(SendFlags::INLINE);
    if inline {
        if !wr.sg_list.is_empty() {
            return Err(Error::invalid("INLINE work request must carry no SGEs"));
        }
        if wr.op.is_read_or_atomic() {
            return Err(Error::invalid("INLINE is not allowed for READ or atomics"));
        }
        if wr.inline_data.len() > qp.cap.max_inline_data as usize {
            return Err(Error::invalid(format!(
                "inline data of {} bytes above max_inline_data {}",
                wr.inline_data.len(),
                qp.cap.max_inline_data
            )));
        }
    } else if wr.sg_list.len() > qp.cap.max_send_sge as usize {
        return Err(Error::invalid(format!(
            "{} SGEs above max_send_sge {}",
            wr.sg_list.len(),
            qp.cap.max_send_sge
        )));
    }
    if let SendOp::AtomicCmpAndSwp { remote_addr, .. }
    | SendOp::AtomicFetchAndAdd { remote_addr, .. } = wr.op
    {
        if wr.sg_list.len() != 1 || wr.sg_list.first().map(|s| s.length) != Some(8) {
            return Err(Error::invalid("an atomic needs exactly one 8-byte SGE"));
        }
        if remote_addr % 8 != 0 {
            return Err(Error::invalid(
                "atomic remote address is not 8-byte aligned",
            ));
        }
    }
    if qp.qp_type == QpType::Uc && wr.op.is_read_or_atomic() {
        return Err(Error::invalid(
            "a UC QP sends only SEND, SEND_WITH_IMM, RDMA_WRITE and RDMA_WRITE_WITH_IMM",
        ));
    }
    let length = wr.total_len();
    if length > u64::from(limits.max_msg_sz) {
        return Err(Error::invalid(format!(
            "message of {length} bytes above max_msg_sz {}",
            limits.max_msg_sz
        )));
    }
    Ok(length)
}

/// The send WQE of `wr`, which [`check_send_wr`] accepted with `length`, to UD destination
/// `ud` (`None` for RC and UC). Built where the caller stores it: a WQE is large, and moving
/// it through a `Result` cost three copies per post.
#[inline]
pub(crate) fn send_wqe(
    qp: &Qp,
    wr: &SendWr<'_>,
    length: u64,
    ud: Option<crate::ud::UdDst>,
) -> SendWqe {
    SendWqe {
        wr_id: wr.wr_id,
        op: wr.op,
        sges: SgeList::new(wr.sg_list),
        inline: if wr.flags.contains(SendFlags::INLINE) {
            wr.inline_data.to_vec()
        } else {
            Vec::new()
        },
        flags: wr.flags,
        signaled: qp.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED),
        length,
        ud,
        tx: WqeTx::default(),
    }
}

/// Checks one receive WR's SGE count against `max_sge`.
pub(crate) fn check_recv_wr(wr: &RecvWr<'_>, max_sge: u32) -> Result<()> {
    if wr.sg_list.len() > max_sge as usize {
        return Err(Error::invalid(format!(
            "{} SGEs above max_recv_sge {max_sge}",
            wr.sg_list.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_of_states_is_classified() {
        let legal: usize = QpState::ALL
            .iter()
            .flat_map(|a| QpState::ALL.iter().map(move |b| (*a, *b)))
            .filter(|(a, b)| rc_transition(*a, *b).is_some())
            .count();
        // RESET->{RESET,INIT}, INIT->{INIT,RTR}, RTR->RTS, RTS->{RTS,SQD}, SQD->{RTS,SQD},
        // six states ->RESET, six states ->ERR.
        assert_eq!(legal, 9 + 12);
        assert!(rc_transition(QpState::Reset, QpState::Err).is_none());
        assert!(rc_transition(QpState::Sqe, QpState::Rts).is_none());
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn ud_masks_have_no_path_attributes() {
        use QpAttrMask as M;
        let (req, opt) = ud_transition(QpState::Reset, QpState::Init).unwrap();
        assert_eq!((req, opt), (M::PKEY_INDEX | M::PORT | M::QKEY, M::empty()));
        assert_eq!(
            ud_transition(QpState::Init, QpState::Rtr).unwrap().0,
            M::empty()
        );
        assert_eq!(
            ud_transition(QpState::Rtr, QpState::Rts).unwrap().0,
            M::SQ_PSN
        );
        assert!(ud_transition(QpState::Reset, QpState::Rtr).is_none());
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn uc_masks_have_no_ack_or_rdma_read_attributes() {
        use QpAttrMask as M;
        use QpState::*;
        assert_eq!(
            uc_transition(Reset, Init).unwrap().0,
            M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS
        );
        let (req, opt) = uc_transition(Init, Rtr).unwrap();
        assert_eq!(req, M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN);
        assert!(!opt.intersects(M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER));
        let (req, opt) = uc_transition(Rtr, Rts).unwrap();
        assert_eq!(req, M::SQ_PSN);
        let rc_only = M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
        assert!(!opt.intersects(rc_only | M::MIN_RNR_TIMER));
        assert!(uc_transition(Sqe, Rts).is_some());
        assert!(rc_transition(Sqe, Rts).is_none());
        let legal = QpState::ALL
            .iter()
            .flat_map(|a| QpState::ALL.iter().map(move |b| (*a, *b)))
            .filter(|(a, b)| uc_transition(*a, *b).is_some())
            .count();
        // RC's 21 plus SQE -> RTS.
        assert_eq!(legal, 22);
    }
}
