//! UC (unreliable connected) QPs (issue 23), after the kernel's `qp_state_table` for UC, IBTA
//! 9.7–9.8 and rxe's UC paths: the state machine's masks (RC's path attributes without the
//! ACK, retry, RNR and READ/atomic ones), the operations a UC QP takes (SEND, SEND_WITH_IMM,
//! RDMA WRITE, RDMA WRITE_WITH_IMM; not READ or atomics), data landing through segmentation at
//! the path MTU, and the absence of acknowledgements: a requester completes whatever becomes
//! of its packets, and a responder that cannot take a message (no receive WQE, no
//! REMOTE_WRITE) drops it silently and stays in RTS.
//!
//! Every backend must have UC (the emulator, rxe, RoCE HCAs). Drops are invisible to the
//! receiver by definition: a drop case waits, then sends a second, distinguishable message and
//! checks that only it arrives.

use std::time::Duration;

use verbs_api::{
    AccessFlags, AhAttr, Context, Endpoint, ErrorKind, MemoryRegion, Mtu, QpAttr, QpAttrMask,
    QpInitAttr, QpState, QpType, QueuePair, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

use crate::check::{Outcome, Stop, failure};
use crate::fixture::{
    Env, check_bytes, check_recv, check_status, check_success, expect_nothing_for_a_while, pattern,
    poll_exact, poll_one,
};
use crate::{check_eq, ensure, fail};

/// Bytes of each side's MR.
const MR_LEN: usize = 64 * 1024;
/// The path MTU of a [`UcPair`]: 1024 bytes, so that a few KiB make multi-packet messages.
const PATH_MTU: Mtu = Mtu::Mtu1024;
/// How long a drop case lets a dropped message travel before posting the next receive.
const SETTLE: Duration = Duration::from_millis(20);

const INIT_MASK: QpAttrMask = QpAttrMask::PKEY_INDEX
    .union(QpAttrMask::PORT)
    .union(QpAttrMask::ACCESS_FLAGS);
const RTR_MASK: QpAttrMask = QpAttrMask::AV
    .union(QpAttrMask::PATH_MTU)
    .union(QpAttrMask::DEST_QPN)
    .union(QpAttrMask::RQ_PSN);

/// One UC endpoint: a context with a PD, a send and a receive CQ, a UC QP and an MR.
pub struct UcSide<C: Context> {
    /// Its context.
    pub ctx: C,
    /// Its PD.
    pub pd: C::Pd,
    /// The QP's send CQ.
    pub send_cq: C::Cq,
    /// The QP's receive CQ.
    pub recv_cq: C::Cq,
    /// The UC QP.
    pub qp: C::Qp,
    /// A 64 KiB MR with LOCAL_WRITE and REMOTE_WRITE.
    pub mr: C::Mr,
}

impl<C: Context> UcSide<C> {
    /// A side on `ctx` with its QP in RESET.
    fn new(ctx: C) -> Result<UcSide<C>, Stop> {
        let pd = ctx.alloc_pd()?;
        let send_cq = ctx.create_cq(64, None)?;
        let recv_cq = ctx.create_cq(64, None)?;
        let dev = ctx.query_device()?;
        let init = QpInitAttr {
            qp_type: QpType::Uc,
            cap: crate::fixture::default_cap(&dev),
            sq_sig_all: false,
        };
        let qp = ctx
            .create_qp(&pd, &send_cq, &recv_cq, None, &init)
            .map_err(|e| failure(format!("create a UC QP: {e}")))?;
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = ctx.alloc_mr(&pd, MR_LEN, access)?;
        Ok(UcSide {
            ctx,
            pd,
            send_cq,
            recv_cq,
            qp,
            mr,
        })
    }

    fn sge(&self, offset: usize, len: usize) -> Result<Sge, Stop> {
        Ok(self.mr.sge(offset, len)?)
    }

    /// Posts a receive of `len` bytes at `offset`.
    fn post_recv(&self, wr_id: u64, offset: usize, len: usize) -> Outcome {
        let sge = [self.sge(offset, len)?];
        self.qp.post_recv(&[RecvWr::new(wr_id, &sge)])?;
        Ok(())
    }

    fn bytes(&self, offset: usize, len: usize) -> Result<Vec<u8>, Stop> {
        let mut v = vec![0; len];
        self.mr.read(offset, &mut v)?;
        Ok(v)
    }

    fn addr(&self, offset: usize) -> u64 {
        self.mr.addr() + offset as u64
    }
}

/// Every attribute a UC walk to `to` sets towards `remote`, with `access` for the QP.
fn uc_attr(to: QpState, remote: &Endpoint, access: AccessFlags) -> QpAttr {
    QpAttr {
        qp_state: to,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: access,
        path_mtu: PATH_MTU,
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        sq_psn: 0x00FF_FFFE,
        ah_attr: AhAttr {
            dgid: remote.gid,
            hop_limit: 64,
            port_num: 1,
            udp_dport: remote.udp_port,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    }
}

/// `modify` to `to` with `mask` (STATE added) and the attributes of [`uc_attr`].
fn modify<Q: QueuePair>(
    qp: &Q,
    to: QpState,
    remote: &Endpoint,
    mask: QpAttrMask,
) -> verbs_api::Result<()> {
    let access = AccessFlags::REMOTE_WRITE;
    qp.modify(&uc_attr(to, remote, access), mask | QpAttrMask::STATE)
}

/// RESET → INIT → RTR → RTS with UC's required masks towards `remote`, the QP's access flags
/// being `access`.
fn to_rts<Q: QueuePair>(qp: &Q, remote: &Endpoint, access: AccessFlags) -> Outcome {
    for (to, mask) in [
        (QpState::Init, INIT_MASK),
        (QpState::Rtr, RTR_MASK),
        (QpState::Rts, QpAttrMask::SQ_PSN),
    ] {
        qp.modify(&uc_attr(to, remote, access), mask | QpAttrMask::STATE)
            .map_err(|e| failure(format!("UC walk to {to}: {e}")))?;
    }
    Ok(())
}

/// Two UC QPs connected to each other in RTS (a on device 0, b on the peer device).
pub struct UcPair<C: Context> {
    /// Side a, the requester of most cases.
    pub a: UcSide<C>,
    /// Side b.
    pub b: UcSide<C>,
}

impl<C: Context> UcPair<C> {
    /// Both sides with REMOTE_WRITE on their QPs.
    pub fn new(env: &Env<C>) -> Result<UcPair<C>, Stop> {
        UcPair::with_access(env, AccessFlags::REMOTE_WRITE)
    }

    /// Both sides, b's QP with access flags `b_access`.
    fn with_access(env: &Env<C>, b_access: AccessFlags) -> Result<UcPair<C>, Stop> {
        let a = UcSide::new(env.open(0)?)?;
        let b = UcSide::new(env.open_peer()?)?;
        let ep_a = a.qp.endpoint(0x00FF_FFFE)?;
        let ep_b = b.qp.endpoint(0x00FF_FFFE)?;
        to_rts(&a.qp, &ep_b, AccessFlags::REMOTE_WRITE)?;
        to_rts(&b.qp, &ep_a, b_access)?;
        Ok(UcPair { a, b })
    }

    /// Posts `op` over `len` bytes of `pattern(wr_id)` at offset 0 of a's MR and checks a's
    /// successful send completion.
    fn post(&self, wr_id: u64, op: SendOp, len: usize) -> Outcome {
        self.a.mr.write(0, &pattern(wr_id as u8, len))?;
        let sge = [self.a.sge(0, len)?];
        self.a.qp.post_send(&[SendWr::new(wr_id, op, &sge)])?;
        let wc = poll_one(&self.a.send_cq)?;
        let opcode = match op {
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            _ => WcOpcode::Send,
        };
        check_success(&wc, wr_id, opcode, len as u32, self.a.qp.qp_num())
    }

    /// Checks b's receive completion `wr_id` (`opcode`, `len`, `imm`).
    fn expect_recv(&self, wr_id: u64, opcode: WcOpcode, len: usize, imm: Option<u32>) -> Outcome {
        let wc = poll_one(&self.b.recv_cq)?;
        let (b, a) = (self.b.qp.qp_num(), self.a.qp.qp_num());
        check_recv(&wc, wr_id, opcode, len as u32, imm, b, a)
    }

    fn write_op(&self, offset: usize) -> SendOp {
        SendOp::RdmaWrite {
            remote_addr: self.b.addr(offset),
            rkey: self.b.mr.rkey(),
        }
    }
}

/// A lone UC QP on device 0 in RESET, and the endpoint of another one on the peer device.
fn lone<C: Context>(env: &Env<C>) -> Result<(UcSide<C>, UcSide<C>, Endpoint), Stop> {
    let s = UcSide::new(env.open(0)?)?;
    let peer = UcSide::new(env.open_peer()?)?;
    let ep = peer.qp.endpoint(0x10)?;
    Ok((s, peer, ep))
}

/// Expects `r` to fail with `kind`, naming `what`.
fn expect_kind<T>(r: verbs_api::Result<T>, kind: ErrorKind, what: &str) -> Outcome {
    match r {
        Ok(_) => fail!("{what}: succeeded, expected {kind:?}"),
        Err(e) if e.kind == kind => Ok(()),
        Err(e) => fail!("{what}: expected {kind:?}, got {e}"),
    }
}

// ---- state machine ------------------------------------------------------------------------

/// RESET → INIT takes UC's mask (PKEY_INDEX, PORT, ACCESS_FLAGS); UD's QKEY is
/// `InvalidArgument` and leaves the QP in RESET.
pub fn uc_init_mask<C: Context>(env: &Env<C>) -> Outcome {
    let (s, _peer, ep) = lone(env)?;
    check_eq!(s.qp.qp_type(), QpType::Uc, "QP type");
    check_eq!(s.qp.query()?.qp_state, QpState::Reset, "state at creation");
    let ud_mask = QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
    expect_kind(
        modify(&s.qp, QpState::Init, &ep, ud_mask),
        ErrorKind::InvalidArgument,
        "RESET -> INIT with QKEY",
    )?;
    check_eq!(s.qp.query()?.qp_state, QpState::Reset, "state after it");
    modify(&s.qp, QpState::Init, &ep, INIT_MASK)?;
    let q = s.qp.query()?;
    check_eq!(q.qp_state, QpState::Init, "state");
    check_eq!(
        q.qp_access_flags,
        AccessFlags::REMOTE_WRITE,
        "qp_access_flags"
    );
    Ok(())
}

/// INIT → RTR with RC's READ/atomic and RNR attributes (MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER) is
/// `InvalidArgument`; with UC's four it succeeds.
pub fn uc_rtr_with_rc_attributes_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let (s, _peer, ep) = lone(env)?;
    modify(&s.qp, QpState::Init, &ep, INIT_MASK)?;
    for extra in [QpAttrMask::MAX_DEST_RD_ATOMIC, QpAttrMask::MIN_RNR_TIMER] {
        expect_kind(
            modify(&s.qp, QpState::Rtr, &ep, RTR_MASK | extra),
            ErrorKind::InvalidArgument,
            &format!("INIT -> RTR with {extra:?}"),
        )?;
        check_eq!(s.qp.query()?.qp_state, QpState::Init, "state after it");
    }
    modify(&s.qp, QpState::Rtr, &ep, RTR_MASK)?;
    check_eq!(s.qp.query()?.qp_state, QpState::Rtr, "state");
    Ok(())
}

/// INIT → RTR without any one of AV, PATH_MTU, DEST_QPN, RQ_PSN is `InvalidArgument`.
pub fn uc_rtr_missing_each_required<C: Context>(env: &Env<C>) -> Outcome {
    let (s, _peer, ep) = lone(env)?;
    modify(&s.qp, QpState::Init, &ep, INIT_MASK)?;
    for bit in RTR_MASK.iter() {
        expect_kind(
            modify(&s.qp, QpState::Rtr, &ep, RTR_MASK - bit),
            ErrorKind::InvalidArgument,
            &format!("INIT -> RTR without {bit:?}"),
        )?;
        check_eq!(s.qp.query()?.qp_state, QpState::Init, "state after it");
    }
    Ok(())
}

/// RTR → RTS needs only SQ_PSN; RC's TIMEOUT, RETRY_CNT, RNR_RETRY and MAX_QP_RD_ATOMIC are
/// each `InvalidArgument`. `query` then reports UC's attributes.
pub fn uc_rts_with_retry_attributes_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let (s, _peer, ep) = lone(env)?;
    modify(&s.qp, QpState::Init, &ep, INIT_MASK)?;
    modify(&s.qp, QpState::Rtr, &ep, RTR_MASK)?;
    for extra in [
        QpAttrMask::TIMEOUT,
        QpAttrMask::RETRY_CNT,
        QpAttrMask::RNR_RETRY,
        QpAttrMask::MAX_QP_RD_ATOMIC,
    ] {
        expect_kind(
            modify(&s.qp, QpState::Rts, &ep, QpAttrMask::SQ_PSN | extra),
            ErrorKind::InvalidArgument,
            &format!("RTR -> RTS with {extra:?}"),
        )?;
        check_eq!(s.qp.query()?.qp_state, QpState::Rtr, "state after it");
    }
    modify(&s.qp, QpState::Rts, &ep, QpAttrMask::SQ_PSN)?;
    let q = s.qp.query()?;
    check_eq!(q.qp_state, QpState::Rts, "state");
    check_eq!(q.path_mtu, PATH_MTU, "path_mtu");
    check_eq!(q.dest_qp_num, ep.qpn, "dest_qp_num");
    check_eq!(q.rq_psn, ep.psn, "rq_psn");
    check_eq!(q.sq_psn, 0x00FF_FFFE, "sq_psn");
    Ok(())
}

/// ERR flushes a UC QP's posted receives with `WR_FLUSH_ERR`, and RESET takes it back.
pub fn uc_err_flushes_and_resets<C: Context>(env: &Env<C>) -> Outcome {
    let p = UcPair::new(env)?;
    p.b.post_recv(1, 0, 64)?;
    p.b.post_recv(2, 64, 64)?;
    let ep = p.a.qp.endpoint(0)?;
    modify(&p.b.qp, QpState::Err, &ep, QpAttrMask::empty())?;
    let wcs = poll_exact(&p.b.recv_cq, 2)?;
    let qpn = p.b.qp.qp_num();
    for (wc, id) in wcs.iter().zip([1, 2]) {
        check_status(wc, id, WcStatus::WrFlushErr, qpn)?;
    }
    modify(&p.b.qp, QpState::Reset, &ep, QpAttrMask::empty())?;
    check_eq!(p.b.qp.query()?.qp_state, QpState::Reset, "state");
    Ok(())
}

// ---- operations ---------------------------------------------------------------------------

/// Expects a READ or atomic on a UC QP to be refused: at the post (`InvalidArgument`: the
/// emulator, the kernel's rxe for kernel users) or, where the provider does not check
/// opcodes at post time (rxe's user-space post), by a `LOC_QP_OP_ERR` completion.
fn expect_not_uc_op<C: Context>(p: &UcPair<C>, op: SendOp, len: usize, what: &str) -> Outcome {
    let sge = [p.a.sge(0, len)?];
    match p.a.qp.post_send(&[SendWr::new(9, op, &sge)]) {
        Err(e) if e.error.kind == ErrorKind::InvalidArgument => {
            check_eq!(e.index, 0, "{what}: index of the failed WR");
            check_eq!(p.a.qp.query()?.qp_state, QpState::Rts, "{what}: state");
            expect_nothing_for_a_while(&p.a.send_cq, what)
        }
        Err(e) => fail!("{what}: expected InvalidArgument, got {e}"),
        Ok(()) => {
            let wc = poll_one(&p.a.send_cq)?;
            check_status(&wc, 9, WcStatus::LocQpOpErr, p.a.qp.qp_num())
        }
    }
}

/// RDMA READ is not a UC operation.
pub fn uc_post_rdma_read_rejected<C: Context>(env: &Env<C>) -> Outcome {
    let p = UcPair::new(env)?;
    let op = SendOp::RdmaRead {
        remote_addr: p.b.addr(0),
        rkey: p.b.mr.rkey(),
    };
    expect_not_uc_op(&p, op, 16, "RDMA READ on a UC QP")
}

/// Atomics are not UC operations.
pub fn uc_post_atomic_rejected<C: Context>(env: &Env<C>) -> Outcome {
    let p = UcPair::new(env)?;
    let op = SendOp::AtomicFetchAndAdd {
        remote_addr: p.b.addr(0),
        rkey: p.b.mr.rkey(),
        add: 1,
    };
    expect_not_uc_op(&p, op, 8, "FETCH_ADD on a UC QP")
}

/// A small SEND arrives: one receive completion with the bytes.
pub fn uc_send_small<C: Context>(env: &Env<C>) -> Outcome {
    let p = UcPair::new(env)?;
    p.b.post_recv(1, 0, 256)?;
    p.post(1, SendOp::Send, 100)?;
    p.expect_recv(1, WcOpcode::Recv, 100, None)?;
    check_bytes(&p.b.bytes(0, 100)?, &pattern(1, 100), "SEND payload")
}

/// A SEND of three path MTUs and a bit (four packets) and a SEND_WITH_IMM of exactly two
/// arrive whole, in order.
pub fn uc_send_segmented_at_path_mtu<C: Context>(env: &Env<C>) -> Outcome {
    let p = UcPair::new(env)?;
    let mtu = PATH_MTU.bytes() as usize;
    p.b.post_recv(1, 0, 8 * mtu)?;
    p.b.post_recv(2, 8 * mtu, 8 * mtu)?;
    p.post(1, SendOp::Send, 3 * mtu + 1)?;
    p.expect_recv(1, WcOpcode::Recv, 3 * mtu + 1, None)?;
    check_bytes(
        &p.b.bytes(0, 3 * mtu + 1)?,
        &pattern(1, 3 * mtu + 1),
        "SEND 1",
    )?;
    p.post(2, SendOp::SendWithImm { imm: 0xC0DE }, 2 * mtu)?;
    p.expect_recv(2, WcOpcode::Recv, 2 * mtu, Some(0xC0DE))?;
    check_bytes(
        &p.b.bytes(8 * mtu, 2 * mtu)?,
        &pattern(2, 2 * mtu),
        "SEND 2",
    )
}

/// An RDMA WRITE of several packets lands with no receive completion; a WRITE_WITH_IMM lands
/// and consumes one receive (`RECV_RDMA_WITH_IMM`, `byte_len` the message length).
pub fn uc_write_and_write_with_imm_land<C: Context>(env: &Env<C>) -> Outcome {
    let p = UcPair::new(env)?;
    let len = 2 * PATH_MTU.bytes() as usize + 100;
    p.post(1, p.write_op(4096), len)?;
    p.b.post_recv(7, 0, 16)?;
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: p.b.addr(16384),
        rkey: p.b.mr.rkey(),
        imm: 0x0102_0304,
    };
    p.post(2, op, len)?;
    p.expect_recv(7, WcOpcode::RecvRdmaWithImm, len, Some(0x0102_0304))?;
    check_bytes(&p.b.bytes(4096, len)?, &pattern(1, len), "WRITE")?;
    check_bytes(&p.b.bytes(16384, len)?, &pattern(2, len), "WRITE_WITH_IMM")?;
    Ok(())
}

/// A SEND with no receive posted is dropped silently (no RNR wait, no error on either side);
/// the next SEND, with a receive posted, arrives into it.
pub fn uc_no_recv_wqe_drops<C: Context>(env: &Env<C>) -> Outcome {
    let p = UcPair::new(env)?;
    p.post(1, SendOp::SendWithImm { imm: 1 }, 2000)?;
    std::thread::sleep(SETTLE);
    expect_nothing_for_a_while(&p.b.recv_cq, "UC SEND without a receive WQE")?;
    check_eq!(p.b.qp.query()?.qp_state, QpState::Rts, "receiver state");
    p.b.post_recv(2, 0, 4096)?;
    p.post(2, SendOp::SendWithImm { imm: 2 }, 2000)?;
    p.expect_recv(2, WcOpcode::Recv, 2000, Some(2))?;
    check_bytes(&p.b.bytes(0, 2000)?, &pattern(2, 2000), "second SEND")
}

/// An RDMA WRITE to a QP without REMOTE_WRITE is dropped silently: memory untouched, the
/// requester completes successfully, both QPs stay in RTS, and a later SEND arrives.
pub fn uc_write_without_remote_write_dropped<C: Context>(env: &Env<C>) -> Outcome {
    let p = UcPair::with_access(env, AccessFlags::empty())?;
    p.post(1, p.write_op(0), 64)?;
    std::thread::sleep(SETTLE);
    check_bytes(&p.b.bytes(0, 64)?, &[0; 64], "target of the refused WRITE")?;
    check_eq!(p.a.qp.query()?.qp_state, QpState::Rts, "requester state");
    check_eq!(p.b.qp.query()?.qp_state, QpState::Rts, "responder state");
    p.b.post_recv(2, 1024, 64)?;
    p.post(2, SendOp::Send, 32)?;
    p.expect_recv(2, WcOpcode::Recv, 32, None)?;
    Ok(())
}

/// No acknowledgement is needed: a requester whose peer QP is in RESET (it drops everything)
/// completes its SEND and WRITE successfully and stays in RTS, where RC would exhaust its
/// retries.
pub fn uc_requester_completes_without_a_peer<C: Context>(env: &Env<C>) -> Outcome {
    let p = UcPair::new(env)?;
    let ep = p.a.qp.endpoint(0)?;
    modify(&p.b.qp, QpState::Reset, &ep, QpAttrMask::empty())?;
    p.post(1, SendOp::Send, 3000)?;
    p.post(2, p.write_op(0), 3000)?;
    check_eq!(p.a.qp.query()?.qp_state, QpState::Rts, "requester state");
    check_bytes(&p.b.bytes(0, 16)?, &[0; 16], "target of the WRITE")?;
    Ok(())
}

/// Many messages of mixed sizes arrive whole and in order, each exactly once.
pub fn uc_many_messages_in_order<C: Context>(env: &Env<C>) -> Outcome {
    let p = UcPair::new(env)?;
    let sizes = [1usize, 1024, 1025, 3000, 0, 4096, 17];
    for (i, _) in sizes.iter().enumerate() {
        p.b.post_recv(i as u64 + 1, i * 4096, 4096)?;
    }
    for (i, &len) in sizes.iter().enumerate() {
        p.post(i as u64 + 1, SendOp::Send, len)?;
    }
    let wcs = poll_exact(&p.b.recv_cq, sizes.len())?;
    for (i, (wc, &len)) in wcs.iter().zip(&sizes).enumerate() {
        let id = i as u64 + 1;
        check_recv(
            wc,
            id,
            WcOpcode::Recv,
            len as u32,
            None,
            p.b.qp.qp_num(),
            p.a.qp.qp_num(),
        )?;
        check_bytes(
            &p.b.bytes(i * 4096, len)?,
            &pattern(id as u8, len),
            "payload",
        )?;
    }
    ensure!(wcs.len() == sizes.len(), "one completion per message");
    Ok(())
}
