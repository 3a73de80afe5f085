//! UD (unreliable datagram) QPs and address handles (issue 15), after rdma-core's
//! `ibv_create_ah(3)`, `ibv_create_ah_from_wc(3)`, `ibv_post_send(3)` (`wr.ud`), the kernel's
//! `qp_state_table` for UD and rxe's UD paths: the state machine's masks (`QKEY`, no path or
//! remote attributes), AH lifetime, what a UD post accepts (SEND and SEND_WITH_IMM with a live
//! AH; a message above the MTU is completed but never sent), the 40-byte GRH at the start of every receive buffer, the Q_Key rules
//! (mismatch drops, controlled Q_Key) and the silent drops (no receive WQE).
//!
//! A backend without UD (it answers `NotSupported` at QP creation) skips every case. Drops are
//! invisible to the receiver by definition: a dropped-datagram case waits, posts a receive and
//! sends a second, distinguishable datagram, and checks that only the second arrives.

use std::time::Duration;

use verbs_api::ud::GrhInfo;
use verbs_api::{
    AccessFlags, AddressHandle, AhAttr, Context, ErrorKind, GRH_LEN, MemoryRegion,
    ProtectionDomain, QKEY_CONTROLLED, QpAttr, QpAttrMask, QpInitAttr, QpState, QpType, QueuePair,
    RecvWr, SendFlags, SendOp, SendWr, Sge, SharedReceiveQueue, SrqAttr, UdDest, WcFlags, WcOpcode,
    WcStatus, WorkCompletion, init_ah_from_wc,
};

use crate::check::{Outcome, Stop, failure, needs};
use crate::fixture::{
    Env, Fixture, check_bytes, check_flushed, check_status, check_success,
    expect_nothing_for_a_while, pattern, poll_exact, poll_one,
};
use crate::{check_eq, ensure, fail};

/// The Q_Key both QPs of a [`UdPair`] use (high bit clear: not a controlled Q_Key).
const QKEY: u32 = 0x1357_2468;
/// The first PSN of UD QPs walked to RTS.
const SQ_PSN: u32 = 0x00_0100;
/// Bytes of each side's MR.
const MR_LEN: usize = 64 * 1024;
/// How long a drop case lets a dropped datagram travel before posting the next receive.
const SETTLE: Duration = Duration::from_millis(20);

/// One UD endpoint: a context with a PD, a send and a receive CQ, a UD QP and an MR.
pub struct UdSide<C: Context> {
    /// Its context.
    pub ctx: C,
    /// Its PD.
    pub pd: C::Pd,
    /// The QP's send CQ.
    pub send_cq: C::Cq,
    /// The QP's receive CQ.
    pub recv_cq: C::Cq,
    /// The UD QP.
    pub qp: C::Qp,
    /// A 64 KiB MR with LOCAL_WRITE.
    pub mr: C::Mr,
}

impl<C: Context> UdSide<C> {
    /// A side on `ctx` with its QP in RESET.
    fn new(ctx: C) -> Result<UdSide<C>, Stop> {
        let pd = ctx.alloc_pd()?;
        let send_cq = ctx.create_cq(64, None)?;
        let recv_cq = ctx.create_cq(64, None)?;
        let dev = ctx.query_device()?;
        let qp = needs(
            ctx.create_qp(
                &pd,
                &send_cq,
                &recv_cq,
                None,
                &QpInitAttr::ud(crate::fixture::default_cap(&dev)),
            ),
            "UD QPs",
        )?;
        let mr = ctx.alloc_mr(&pd, MR_LEN, AccessFlags::LOCAL_WRITE)?;
        Ok(UdSide {
            ctx,
            pd,
            send_cq,
            recv_cq,
            qp,
            mr,
        })
    }

    /// An SGE of `len` bytes at `offset` of the MR.
    fn sge(&self, offset: usize, len: usize) -> Result<Sge, Stop> {
        Ok(self.mr.sge(offset, len)?)
    }

    /// Posts a receive of `len` bytes at `offset`.
    fn post_recv(&self, wr_id: u64, offset: usize, len: usize) -> Outcome {
        let sge = [self.sge(offset, len)?];
        self.qp.post_recv(&[RecvWr::new(wr_id, &sge)])?;
        Ok(())
    }

    /// The address handle attributes that reach this side's QP.
    fn ah_attr(&self) -> Result<AhAttr, Stop> {
        let ep = self.qp.endpoint(0)?;
        Ok(AhAttr {
            dgid: ep.gid,
            udp_dport: ep.udp_port,
            ..AhAttr::default()
        })
    }

    fn bytes(&self, offset: usize, len: usize) -> Result<Vec<u8>, Stop> {
        let mut v = vec![0; len];
        self.mr.read(offset, &mut v)?;
        Ok(v)
    }
}

/// Two UD QPs in RTS with Q_Key [`QKEY`] (a on device 0, b on the peer device) and an AH on
/// each side to the other.
pub struct UdPair<C: Context> {
    /// Side a.
    pub a: UdSide<C>,
    /// Side b.
    pub b: UdSide<C>,
    /// a's AH to b.
    pub ah_ab: C::Ah,
    /// b's AH to a.
    pub ah_ba: C::Ah,
}

impl<C: Context> UdPair<C> {
    /// Opens both sides and walks both QPs to RTS.
    pub fn new(env: &Env<C>) -> Result<UdPair<C>, Stop> {
        let a = UdSide::new(env.open(0)?)?;
        let b = UdSide::new(env.open_peer()?)?;
        to_rts(&a.qp, QKEY)?;
        to_rts(&b.qp, QKEY)?;
        let ah_ab = a.ctx.create_ah(&a.pd, &b.ah_attr()?)?;
        let ah_ba = b.ctx.create_ah(&b.pd, &a.ah_attr()?)?;
        Ok(UdPair { a, b, ah_ab, ah_ba })
    }

    /// a's destination for b's QP with Q_Key `qkey`.
    fn to_b(&self, qkey: u32) -> UdDest {
        UdDest {
            ah: self.ah_ab.handle(),
            remote_qpn: self.b.qp.qp_num(),
            remote_qkey: qkey,
        }
    }

    /// Sends `len` bytes of `pattern(wr_id)` from offset 0 of a's MR to b as `op`; checks a's
    /// send completion.
    fn send(&self, wr_id: u64, op: SendOp, len: usize, qkey: u32) -> Outcome {
        let data = pattern(wr_id as u8, len);
        self.a.mr.write(0, &data)?;
        let sge = [self.a.sge(0, len)?];
        let wr = SendWr::new(wr_id, op, &sge).with_ud(self.to_b(qkey));
        self.a.qp.post_send(&[wr])?;
        let wc = poll_one(&self.a.send_cq)?;
        check_success(&wc, wr_id, WcOpcode::Send, len as u32, self.a.qp.qp_num())
    }

    /// Checks b's receive completion of a `len`-byte datagram from a: `RECV`, `byte_len`
    /// 40 + `len`, `GRH` (and `WITH_IMM` with `imm`), `src_qp`, `qp_num`, `pkey_index` 0; and
    /// the payload after the GRH at `offset`.
    fn expect_recv(
        &self,
        wr_id: u64,
        len: usize,
        imm: Option<u32>,
        offset: usize,
    ) -> Result<WorkCompletion, Stop> {
        let wc = poll_one(&self.b.recv_cq)?;
        check_ud_recv(&wc, wr_id, len, imm, self.b.qp.qp_num(), self.a.qp.qp_num())?;
        let data = pattern(wr_id as u8, len);
        check_bytes(
            &self.b.bytes(offset + GRH_LEN, len)?,
            &data,
            "UD payload after the GRH",
        )?;
        Ok(wc)
    }
}

/// Checks a successful UD receive completion.
fn check_ud_recv(
    wc: &WorkCompletion,
    wr_id: u64,
    len: usize,
    imm: Option<u32>,
    qpn: u32,
    src_qp: u32,
) -> Outcome {
    check_success(wc, wr_id, WcOpcode::Recv, (GRH_LEN + len) as u32, qpn)?;
    let want = match imm {
        Some(_) => WcFlags::GRH | WcFlags::WITH_IMM,
        None => WcFlags::GRH,
    };
    let known = WcFlags::GRH | WcFlags::WITH_IMM | WcFlags::WITH_INV;
    check_eq!(wc.wc_flags & known, want, "wc_flags of wr_id {wr_id}");
    if let Some(imm) = imm {
        check_eq!(wc.imm_data, imm, "imm_data of wr_id {wr_id}");
    }
    check_eq!(wc.src_qp, src_qp, "src_qp of wr_id {wr_id}");
    check_eq!(wc.pkey_index, 0, "pkey_index of wr_id {wr_id}");
    Ok(())
}

/// `modify` to `to` with `mask` (STATE added) and the attributes of [`ud_attr`].
fn modify<Q: QueuePair>(qp: &Q, to: QpState, qkey: u32, mask: QpAttrMask) -> verbs_api::Result<()> {
    let attr = QpAttr {
        qp_state: to,
        cur_qp_state: qp.query()?.qp_state,
        ..ud_attr(qkey)
    };
    qp.modify(&attr, mask | QpAttrMask::STATE)
}

/// UD attributes: `qkey`, P_Key index 0, port 1, `sq_psn` [`SQ_PSN`].
fn ud_attr(qkey: u32) -> QpAttr {
    QpAttr {
        qkey,
        pkey_index: 0,
        port_num: 1,
        sq_psn: SQ_PSN,
        ..QpAttr::default()
    }
}

const INIT_MASK: QpAttrMask = QpAttrMask::PKEY_INDEX
    .union(QpAttrMask::PORT)
    .union(QpAttrMask::QKEY);

/// RESET → INIT → RTR → RTS with UD's required masks.
fn to_rts<Q: QueuePair>(qp: &Q, qkey: u32) -> Outcome {
    modify(qp, QpState::Init, qkey, INIT_MASK)?;
    modify(qp, QpState::Rtr, qkey, QpAttrMask::empty())?;
    modify(qp, QpState::Rts, qkey, QpAttrMask::SQ_PSN)?;
    Ok(())
}

/// A lone UD QP (and its side) on device 0, in RESET.
fn lone<C: Context>(env: &Env<C>) -> Result<UdSide<C>, Stop> {
    UdSide::new(env.open(0)?)
}

/// Expects `r` to fail with `kind`, naming `what`.
fn expect_kind<T>(r: verbs_api::Result<T>, kind: ErrorKind, what: &str) -> Outcome {
    match r {
        Ok(_) => fail!("{what}: succeeded, expected {kind:?}"),
        Err(e) if e.kind == kind => Ok(()),
        Err(e) => fail!("{what}: expected {kind:?}, got {e}"),
    }
}

fn expect_post_kind(
    r: Result<(), verbs_api::PostError>,
    kinds: &[ErrorKind],
    what: &str,
) -> Outcome {
    match r {
        Ok(()) => fail!("{what}: the post succeeded"),
        Err(e) if kinds.contains(&e.error.kind) => {
            check_eq!(e.index, 0, "{what}: index of the failed WR");
            Ok(())
        }
        Err(e) => fail!("{what}: expected one of {kinds:?}, got {e}"),
    }
}

// ---- state machine ------------------------------------------------------------------------

/// A UD QP is created in RESET with type UD.
pub fn ud_create_in_reset<C: Context>(env: &Env<C>) -> Outcome {
    let s = lone(env)?;
    check_eq!(s.qp.qp_type(), QpType::Ud, "QP type");
    check_eq!(s.qp.query()?.qp_state, QpState::Reset, "state");
    Ok(())
}

/// RESET → INIT with RC's mask (ACCESS_FLAGS instead of QKEY) is `InvalidArgument`; the QP
/// stays in RESET.
pub fn ud_init_with_rc_mask_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let s = lone(env)?;
    let mask = QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    expect_kind(
        modify(&s.qp, QpState::Init, QKEY, mask),
        ErrorKind::InvalidArgument,
        "RESET -> INIT with ACCESS_FLAGS",
    )?;
    check_eq!(
        s.qp.query()?.qp_state,
        QpState::Reset,
        "state after the failure"
    );
    Ok(())
}

/// RESET → INIT without QKEY is `InvalidArgument`.
pub fn ud_init_without_qkey_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let s = lone(env)?;
    expect_kind(
        modify(
            &s.qp,
            QpState::Init,
            QKEY,
            QpAttrMask::PKEY_INDEX | QpAttrMask::PORT,
        ),
        ErrorKind::InvalidArgument,
        "RESET -> INIT without QKEY",
    )?;
    check_eq!(
        s.qp.query()?.qp_state,
        QpState::Reset,
        "state after the failure"
    );
    Ok(())
}

/// RESET → INIT with PKEY_INDEX, PORT and QKEY: `query` reports the Q_Key.
pub fn ud_init_sets_qkey<C: Context>(env: &Env<C>) -> Outcome {
    let s = lone(env)?;
    modify(&s.qp, QpState::Init, 0x0BAD_CAFE, INIT_MASK)?;
    let q = s.qp.query()?;
    check_eq!(q.qp_state, QpState::Init, "state");
    check_eq!(q.qkey, 0x0BAD_CAFE, "qkey");
    Ok(())
}

/// INIT → RTR needs no attribute for UD.
pub fn ud_rtr_needs_no_attributes<C: Context>(env: &Env<C>) -> Outcome {
    let s = lone(env)?;
    modify(&s.qp, QpState::Init, QKEY, INIT_MASK)?;
    modify(&s.qp, QpState::Rtr, QKEY, QpAttrMask::empty())?;
    check_eq!(s.qp.query()?.qp_state, QpState::Rtr, "state");
    Ok(())
}

/// INIT → RTR with RC's path attributes (AV, PATH_MTU, DEST_QPN, RQ_PSN) is
/// `InvalidArgument`: a UD QP has no remote.
pub fn ud_rtr_with_path_attributes_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let s = lone(env)?;
    modify(&s.qp, QpState::Init, QKEY, INIT_MASK)?;
    let mask = QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN;
    expect_kind(
        modify(&s.qp, QpState::Rtr, QKEY, mask),
        ErrorKind::InvalidArgument,
        "INIT -> RTR with path attributes",
    )?;
    check_eq!(
        s.qp.query()?.qp_state,
        QpState::Init,
        "state after the failure"
    );
    Ok(())
}

/// RTR → RTS without SQ_PSN is `InvalidArgument`.
pub fn ud_rts_needs_sq_psn<C: Context>(env: &Env<C>) -> Outcome {
    let s = lone(env)?;
    modify(&s.qp, QpState::Init, QKEY, INIT_MASK)?;
    modify(&s.qp, QpState::Rtr, QKEY, QpAttrMask::empty())?;
    expect_kind(
        modify(&s.qp, QpState::Rts, QKEY, QpAttrMask::empty()),
        ErrorKind::InvalidArgument,
        "RTR -> RTS without SQ_PSN",
    )?;
    check_eq!(
        s.qp.query()?.qp_state,
        QpState::Rtr,
        "state after the failure"
    );
    Ok(())
}

/// RTR → RTS with RC's retry attributes (TIMEOUT, RETRY_CNT, RNR_RETRY) is
/// `InvalidArgument`: UD never retries.
pub fn ud_rts_with_retry_attributes_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let s = lone(env)?;
    modify(&s.qp, QpState::Init, QKEY, INIT_MASK)?;
    modify(&s.qp, QpState::Rtr, QKEY, QpAttrMask::empty())?;
    let mask =
        QpAttrMask::SQ_PSN | QpAttrMask::TIMEOUT | QpAttrMask::RETRY_CNT | QpAttrMask::RNR_RETRY;
    expect_kind(
        modify(&s.qp, QpState::Rts, QKEY, mask),
        ErrorKind::InvalidArgument,
        "RTR -> RTS with retry attributes",
    )?;
    Ok(())
}

/// In RTS, `query` reports the state, the Q_Key and the SQ PSN.
pub fn ud_rts_query<C: Context>(env: &Env<C>) -> Outcome {
    let s = lone(env)?;
    to_rts(&s.qp, QKEY)?;
    let q = s.qp.query()?;
    check_eq!(q.qp_state, QpState::Rts, "state");
    check_eq!(q.qkey, QKEY, "qkey");
    check_eq!(q.sq_psn, SQ_PSN, "sq_psn");
    Ok(())
}

/// RTS → RTS with QKEY changes the Q_Key.
pub fn ud_rts_changes_qkey<C: Context>(env: &Env<C>) -> Outcome {
    let s = lone(env)?;
    to_rts(&s.qp, QKEY)?;
    modify(&s.qp, QpState::Rts, 0x0000_0777, QpAttrMask::QKEY)?;
    check_eq!(s.qp.query()?.qkey, 0x0000_0777, "qkey after RTS -> RTS");
    Ok(())
}

/// RESET → RTR is illegal (`InvalidArgument` or `InvalidState`: libibverbs says `EINVAL`).
pub fn ud_reset_to_rtr_illegal<C: Context>(env: &Env<C>) -> Outcome {
    let s = lone(env)?;
    match modify(&s.qp, QpState::Rtr, QKEY, QpAttrMask::empty()) {
        Ok(()) => fail!("RESET -> RTR succeeded"),
        Err(e) if matches!(e.kind, ErrorKind::InvalidArgument | ErrorKind::InvalidState) => {}
        Err(e) => fail!("RESET -> RTR: {e}"),
    }
    check_eq!(
        s.qp.query()?.qp_state,
        QpState::Reset,
        "state after the failure"
    );
    Ok(())
}

/// RTS → ERR flushes posted receives with `WR_FLUSH_ERR`; ERR → RESET → INIT works again.
pub fn ud_err_flushes_and_resets<C: Context>(env: &Env<C>) -> Outcome {
    let s = lone(env)?;
    to_rts(&s.qp, QKEY)?;
    s.post_recv(1, 0, 256)?;
    s.post_recv(2, 256, 256)?;
    modify(&s.qp, QpState::Err, QKEY, QpAttrMask::empty())?;
    let wcs = poll_exact(&s.recv_cq, 2)?;
    check_flushed(&wcs, &[1, 2], s.qp.qp_num())?;
    modify(&s.qp, QpState::Reset, QKEY, QpAttrMask::empty())?;
    to_rts(&s.qp, QKEY)?;
    check_eq!(
        s.qp.query()?.qp_state,
        QpState::Rts,
        "state after reset and walk"
    );
    Ok(())
}

// ---- posting ------------------------------------------------------------------------------

/// `post_recv` in RESET is `InvalidState`.
pub fn ud_post_recv_in_reset_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let s = lone(env)?;
    let sge = [s.sge(0, 64)?];
    expect_post_kind(
        s.qp.post_recv(&[RecvWr::new(1, &sge)]),
        &[ErrorKind::InvalidState],
        "post_recv in RESET",
    )
}

/// `post_send` in INIT is `InvalidState`.
pub fn ud_post_send_in_init_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    let s = UdSide::new(env.open(0)?)?;
    modify(&s.qp, QpState::Init, QKEY, INIT_MASK)?;
    let ah = s.ctx.create_ah(&s.pd, &p.b.ah_attr()?)?;
    let sge = [s.sge(0, 8)?];
    let dest = UdDest {
        ah: ah.handle(),
        remote_qpn: p.b.qp.qp_num(),
        remote_qkey: QKEY,
    };
    expect_post_kind(
        s.qp.post_send(&[SendWr::new(1, SendOp::Send, &sge).with_ud(dest)]),
        &[ErrorKind::InvalidState],
        "post_send in INIT",
    )
}

/// Posts `op` on a's UD QP and expects it refused: the post fails with `InvalidArgument` (the
/// contract, softverbs) or, as rxe does (its requester finds no UD opcode for it), the post
/// succeeds and the WR completes in error (DIVERGENCES.md #17). Either way nothing arrives.
fn post_rejected<C: Context>(p: &UdPair<C>, op: SendOp, what: &str) -> Outcome {
    p.b.post_recv(9, 0, 256)?;
    let sge = [p.a.sge(0, 8)?];
    match p
        .a
        .qp
        .post_send(&[SendWr::new(1, op, &sge).with_ud(p.to_b(QKEY))])
    {
        Err(e) if e.error.kind == ErrorKind::InvalidArgument => {
            check_eq!(e.index, 0, "{what}: index of the failed WR");
            expect_nothing_for_a_while(&p.a.send_cq, what)?;
        }
        Err(e) => fail!("{what}: expected InvalidArgument, got {e}"),
        Ok(()) => {
            let wc = poll_one(&p.a.send_cq)?;
            check_eq!(wc.wr_id, 1, "{what}: wr_id");
            ensure!(
                wc.status != WcStatus::Success,
                "{what}: the post succeeded and so did the WR"
            );
        }
    }
    std::thread::sleep(SETTLE);
    expect_nothing_for_a_while(&p.b.recv_cq, what)
}

/// RDMA WRITE on a UD QP is refused (see `post_rejected`).
pub fn ud_post_rdma_write_rejected<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    let op = SendOp::RdmaWrite {
        remote_addr: 0x1000,
        rkey: 1,
    };
    post_rejected(&p, op, "RDMA WRITE on UD")
}

/// RDMA READ on a UD QP is refused (see `post_rejected`).
pub fn ud_post_rdma_read_rejected<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    let op = SendOp::RdmaRead {
        remote_addr: 0x1000,
        rkey: 1,
    };
    post_rejected(&p, op, "RDMA READ on UD")
}

/// An atomic on a UD QP is refused (see `post_rejected`).
pub fn ud_post_atomic_rejected<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    let op = SendOp::AtomicFetchAndAdd {
        remote_addr: 0x1000,
        rkey: 1,
        add: 1,
    };
    post_rejected(&p, op, "FETCH_ADD on UD")
}

/// A SEND on a UD QP without a UD destination (no AH) fails with `InvalidArgument`.
pub fn ud_post_without_ah_rejected<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    let sge = [p.a.sge(0, 8)?];
    expect_post_kind(
        p.a.qp.post_send(&[SendWr::new(1, SendOp::Send, &sge)]),
        &[ErrorKind::InvalidArgument],
        "UD SEND without AH",
    )
}

/// A message one byte above the port's MTU is accepted, completes with success and is never
/// sent (IBTA C10-93.1.1: "shall not emit any packets … shall not generate an error"; rxe's
/// requester fakes the send): the receive posted for it takes the next datagram instead.
pub fn ud_send_above_mtu_not_emitted<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    let mtu = p.a.ctx.query_port(1)?.active_mtu.bytes() as usize;
    p.b.post_recv(2, 0, 2 * GRH_LEN + 2 * mtu)?;
    p.send(1, SendOp::SendWithImm { imm: 1 }, mtu + 1, QKEY)?;
    std::thread::sleep(SETTLE);
    expect_nothing_for_a_while(&p.b.recv_cq, "datagram above the MTU")?;
    p.send(2, SendOp::SendWithImm { imm: 2 }, 8, QKEY)?;
    p.expect_recv(2, 8, Some(2), 0)?;
    Ok(())
}

/// A message of exactly the path MTU arrives whole after the GRH.
pub fn ud_send_exactly_mtu<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    let mtu = p.a.ctx.query_port(1)?.active_mtu.bytes() as usize;
    p.b.post_recv(7, 0, GRH_LEN + mtu)?;
    p.send(7, SendOp::Send, mtu, QKEY)?;
    p.expect_recv(7, mtu, None, 0)?;
    Ok(())
}

/// After `destroy`, a post naming the AH fails with `InvalidArgument`.
pub fn ud_post_destroyed_ah_rejected<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    let dest = p.to_b(QKEY);
    p.ah_ab.destroy()?;
    let sge = [p.a.sge(0, 8)?];
    expect_post_kind(
        p.a.qp
            .post_send(&[SendWr::new(1, SendOp::Send, &sge).with_ud(dest)]),
        &[ErrorKind::InvalidArgument],
        "UD SEND with a destroyed AH",
    )
}

// ---- address handles ----------------------------------------------------------------------

/// An AH is created and destroyed; a second destroy is `Destroyed`.
pub fn ah_create_destroy<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let attr = AhAttr {
        dgid: fx.peer_ep.gid,
        udp_dport: fx.peer_ep.udp_port,
        ..AhAttr::default()
    };
    let ah = needs(fx.ctx.create_ah(&fx.pd, &attr), "address handles")?;
    ah.destroy()?;
    expect_kind(ah.destroy(), ErrorKind::Destroyed, "second destroy")
}

/// Destroying a PD an AH uses is `Busy`; after the AH is destroyed the PD goes.
pub fn pd_destroy_with_ah_busy<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let pd = fx.ctx.alloc_pd()?;
    let attr = AhAttr {
        dgid: fx.peer_ep.gid,
        udp_dport: fx.peer_ep.udp_port,
        ..AhAttr::default()
    };
    let ah = needs(fx.ctx.create_ah(&pd, &attr), "address handles")?;
    expect_kind(pd.destroy(), ErrorKind::Busy, "PD destroy with an AH")?;
    ah.destroy()?;
    pd.destroy()?;
    Ok(())
}

/// Dropping the last handle of an AH that was not destroyed releases it: its PD can then be
/// destroyed.
pub fn ah_drop_releases_pd<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let pd = fx.ctx.alloc_pd()?;
    let attr = AhAttr {
        dgid: fx.peer_ep.gid,
        udp_dport: fx.peer_ep.udp_port,
        ..AhAttr::default()
    };
    let ah = needs(fx.ctx.create_ah(&pd, &attr), "address handles")?;
    let clone = ah.clone();
    drop(ah);
    expect_kind(
        pd.destroy(),
        ErrorKind::Busy,
        "PD destroy while a clone of the AH lives",
    )?;
    drop(clone);
    pd.destroy()?;
    Ok(())
}

/// An AH on port 2 of a one-port device (or beyond `phys_port_cnt`) is `InvalidArgument`.
pub fn ah_bad_port_invalid<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let attr = AhAttr {
        dgid: fx.peer_ep.gid,
        udp_dport: fx.peer_ep.udp_port,
        port_num: fx.dev.phys_port_cnt.saturating_add(1),
        ..AhAttr::default()
    };
    expect_kind(
        fx.ctx.create_ah(&fx.pd, &attr),
        ErrorKind::InvalidArgument,
        "AH on a port that does not exist",
    )
}

/// An AH with an `sgid_index` that names no GID (past the table, or an empty entry of a table
/// longer than a u8 index reaches) fails.
pub fn ah_sgid_index_beyond_table_fails<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    // The first index past the table; with a table of 256 or more entries (rxe: 1024), the
    // highest u8 index that holds no GID.
    let index = match u8::try_from(fx.port.gid_tbl_len) {
        Ok(index) => index,
        Err(_) => (0..=u8::MAX)
            .rev()
            .find(|&i| {
                fx.ctx
                    .query_gid(1, u32::from(i))
                    .map_or(true, |gid| gid == verbs_api::Gid::default())
            })
            .ok_or_else(|| Stop::Skip("every u8 GID index holds a GID".into()))?,
    };
    let attr = AhAttr {
        dgid: fx.peer_ep.gid,
        udp_dport: fx.peer_ep.udp_port,
        sgid_index: index,
        ..AhAttr::default()
    };
    ensure!(
        fx.ctx.create_ah(&fx.pd, &attr).is_err(),
        "AH with sgid_index {index} (table of {}) was created",
        fx.port.gid_tbl_len
    );
    Ok(())
}

/// A PD of another context is `InvalidArgument`.
pub fn ah_foreign_pd_rejected<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let other = env.open(0)?;
    let foreign = other.alloc_pd()?;
    let attr = AhAttr {
        dgid: fx.peer_ep.gid,
        udp_dport: fx.peer_ep.udp_port,
        ..AhAttr::default()
    };
    expect_kind(
        fx.ctx.create_ah(&foreign, &attr),
        ErrorKind::InvalidArgument,
        "AH in another context's PD",
    )
}

/// A destroyed PD is `Destroyed`.
pub fn ah_destroyed_pd_rejected<C: Context>(env: &Env<C>) -> Outcome {
    let fx = Fixture::new(env)?;
    let pd = fx.ctx.alloc_pd()?;
    pd.destroy()?;
    let attr = AhAttr {
        dgid: fx.peer_ep.gid,
        udp_dport: fx.peer_ep.udp_port,
        ..AhAttr::default()
    };
    expect_kind(
        fx.ctx.create_ah(&pd, &attr),
        ErrorKind::Destroyed,
        "AH in a destroyed PD",
    )
}

// ---- traffic ------------------------------------------------------------------------------

/// A 64-byte SEND: send WC `SEND`/64; receive WC `RECV` with `byte_len` 40 + 64, `GRH`,
/// `src_qp` the sender's QPN, `pkey_index` 0; the payload after the 40 GRH bytes.
pub fn ud_send_small<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    p.b.post_recv(5, 0, 1024)?;
    p.send(5, SendOp::Send, 64, QKEY)?;
    p.expect_recv(5, 64, None, 0)?;
    Ok(())
}

/// SEND_WITH_IMM: `RECV` with `GRH` and `WITH_IMM` and the immediate verbatim.
pub fn ud_send_with_imm<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    p.b.post_recv(6, 0, 1024)?;
    let imm = 0x8765_4321;
    p.send(6, SendOp::SendWithImm { imm }, 100, QKEY)?;
    p.expect_recv(6, 100, Some(imm), 0)?;
    Ok(())
}

/// A zero-length SEND: `byte_len` is the GRH's 40.
pub fn ud_send_zero_length<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    p.b.post_recv(1, 0, 256)?;
    let wr = SendWr::new(1, SendOp::Send, &[]).with_ud(p.to_b(QKEY));
    p.a.qp.post_send(&[wr])?;
    check_success(
        &poll_one(&p.a.send_cq)?,
        1,
        WcOpcode::Send,
        0,
        p.a.qp.qp_num(),
    )?;
    let wc = poll_one(&p.b.recv_cq)?;
    check_ud_recv(&wc, 1, 0, None, p.b.qp.qp_num(), p.a.qp.qp_num())
}

/// The GRH holds the datagram's IP header: for IPv4 GIDs version 4 in byte 20 (the first 20
/// bytes unspecified), the sender's GID as source and the receiver's as destination; for IPv6
/// GIDs the IPv6 header with both GIDs.
pub fn ud_grh_addresses<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    p.b.post_recv(1, 0, 256)?;
    p.send(1, SendOp::Send, 16, QKEY)?;
    p.expect_recv(1, 16, None, 0)?;
    let grh = p.b.bytes(0, GRH_LEN)?;
    let info = GrhInfo::parse(&grh).map_err(|e| failure(format!("GRH {grh:02x?}: {e}")))?;
    let a_gid = p.a.qp.endpoint(0)?.gid;
    let b_gid = p.b.qp.endpoint(0)?.gid;
    check_eq!(info.source, a_gid.to_ip(), "GRH source");
    check_eq!(info.destination, b_gid.to_ip(), "GRH destination");
    if a_gid.to_ipv4().is_some() {
        check_eq!(grh[20] >> 4, 4, "IP version in GRH byte 20");
    } else {
        check_eq!(grh[0] >> 4, 6, "IP version in GRH byte 0");
    }
    Ok(())
}

/// `init_ah_from_wc` on a received datagram gives an AH that reaches the sender: b answers a
/// through it.
pub fn ud_reply_via_ah_from_wc<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    p.b.post_recv(1, 0, 256)?;
    p.send(1, SendOp::Send, 16, QKEY)?;
    let wc = p.expect_recv(1, 16, None, 0)?;
    let grh = p.b.bytes(0, GRH_LEN)?;
    let mut attr = init_ah_from_wc(&wc, &grh, 1)?;
    check_eq!(attr.dgid, p.a.qp.endpoint(0)?.gid, "dgid from the GRH");
    // The emulator's devices may listen on other UDP ports than 4791; the GRH cannot say.
    attr.udp_dport = p.a.qp.endpoint(0)?.udp_port;
    let ah = p.b.ctx.create_ah(&p.b.pd, &attr)?;
    p.a.post_recv(2, 4096, 256)?;
    let data = pattern(2, 24);
    p.b.mr.write(8192, &data)?;
    let sge = [p.b.sge(8192, 24)?];
    let dest = UdDest {
        ah: ah.handle(),
        remote_qpn: wc.src_qp,
        remote_qkey: QKEY,
    };
    p.b.qp
        .post_send(&[SendWr::new(2, SendOp::Send, &sge).with_ud(dest)])?;
    check_success(
        &poll_one(&p.b.send_cq)?,
        2,
        WcOpcode::Send,
        24,
        p.b.qp.qp_num(),
    )?;
    let back = poll_one(&p.a.recv_cq)?;
    check_ud_recv(&back, 2, 24, None, p.a.qp.qp_num(), p.b.qp.qp_num())?;
    check_bytes(&p.a.bytes(4096 + GRH_LEN, 24)?, &data, "reply payload")
}

/// With no receive posted the datagram is dropped silently: the sender completes with
/// success, nothing arrives, the receiver stays in RTS, and a datagram sent after a receive is
/// posted is the one that arrives.
pub fn ud_no_recv_wqe_drops<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    p.send(1, SendOp::SendWithImm { imm: 1 }, 8, QKEY)?;
    std::thread::sleep(SETTLE);
    expect_nothing_for_a_while(&p.b.recv_cq, "receive without a WQE")?;
    check_eq!(p.b.qp.query()?.qp_state, QpState::Rts, "receiver state");
    p.b.post_recv(2, 0, 256)?;
    p.send(2, SendOp::SendWithImm { imm: 2 }, 8, QKEY)?;
    p.expect_recv(2, 8, Some(2), 0)?;
    Ok(())
}

/// A datagram whose Q_Key differs from the receiver's is dropped; a correct one after it
/// arrives into the same receive.
pub fn ud_wrong_qkey_drops<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    p.b.post_recv(2, 0, 256)?;
    p.send(1, SendOp::SendWithImm { imm: 1 }, 8, QKEY ^ 0x10)?;
    std::thread::sleep(SETTLE);
    expect_nothing_for_a_while(&p.b.recv_cq, "datagram with a wrong Q_Key")?;
    p.send(2, SendOp::SendWithImm { imm: 2 }, 8, QKEY)?;
    p.expect_recv(2, 8, Some(2), 0)?;
    Ok(())
}

/// A controlled Q_Key (high bit set in the WR) sends the QP's own Q_Key: with both QPs on
/// [`QKEY`] the datagram arrives although the WR's Q_Key differs.
pub fn ud_controlled_qkey_uses_qp_qkey<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    p.b.post_recv(3, 0, 256)?;
    p.send(3, SendOp::Send, 8, QKEY_CONTROLLED | 0x55)?;
    p.expect_recv(3, 8, None, 0)?;
    Ok(())
}

/// A receive QP whose Q_Key changed (RTS → RTS) takes datagrams with the new Q_Key only.
pub fn ud_receiver_qkey_change_applies<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    modify(&p.b.qp, QpState::Rts, 0x0000_4242, QpAttrMask::QKEY)?;
    p.b.post_recv(2, 0, 256)?;
    p.send(1, SendOp::SendWithImm { imm: 1 }, 8, QKEY)?;
    std::thread::sleep(SETTLE);
    expect_nothing_for_a_while(&p.b.recv_cq, "datagram with the old Q_Key")?;
    p.send(2, SendOp::SendWithImm { imm: 2 }, 8, 0x0000_4242)?;
    p.expect_recv(2, 8, Some(2), 0)?;
    Ok(())
}

/// A message that does not fit the receive buffer after the GRH completes the receive with
/// `LOC_LEN_ERR`.
pub fn ud_too_long_loc_len_err<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    p.b.post_recv(4, 0, GRH_LEN + 10)?;
    p.send(4, SendOp::Send, 11, QKEY)?;
    let wc = poll_one(&p.b.recv_cq)?;
    check_status(&wc, 4, WcStatus::LocLenErr, p.b.qp.qp_num())
}

/// A receive buffer with room for the payload but not the GRH is too short: `LOC_LEN_ERR`.
pub fn ud_recv_without_room_for_grh<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    p.b.post_recv(4, 0, 64)?;
    p.send(4, SendOp::Send, 64, QKEY)?;
    let wc = poll_one(&p.b.recv_cq)?;
    check_status(&wc, 4, WcStatus::LocLenErr, p.b.qp.qp_num())
}

/// A receive of two SGEs, 40 bytes for the GRH and one for the data (the usual layout): the
/// payload lands at the start of the second.
pub fn ud_grh_in_its_own_sge<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    let sges = [p.b.sge(0, GRH_LEN)?, p.b.sge(4096, 512)?];
    p.b.qp.post_recv(&[RecvWr::new(9, &sges)])?;
    p.send(9, SendOp::Send, 300, QKEY)?;
    let wc = poll_one(&p.b.recv_cq)?;
    check_ud_recv(&wc, 9, 300, None, p.b.qp.qp_num(), p.a.qp.qp_num())?;
    check_bytes(
        &p.b.bytes(4096, 300)?,
        &pattern(9, 300),
        "payload in the second SGE",
    )
}

/// Eight datagrams each consume one receive, in order, on a lossless path.
pub fn ud_many_datagrams_in_order<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    for i in 0..8u64 {
        p.b.post_recv(100 + i, (i as usize) * 1024, 1024)?;
    }
    for i in 0..8u64 {
        p.send(100 + i, SendOp::SendWithImm { imm: i as u32 }, 200, QKEY)?;
    }
    let wcs = poll_exact(&p.b.recv_cq, 8)?;
    for (i, wc) in wcs.iter().enumerate() {
        let id = 100 + i as u64;
        check_ud_recv(
            wc,
            id,
            200,
            Some(i as u32),
            p.b.qp.qp_num(),
            p.a.qp.qp_num(),
        )?;
    }
    Ok(())
}

/// An unsignaled UD SEND produces no send completion; the datagram arrives.
pub fn ud_unsignaled_send<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    p.b.post_recv(1, 0, 256)?;
    let data = pattern(1, 32);
    p.a.mr.write(0, &data)?;
    let sge = [p.a.sge(0, 32)?];
    let wr = SendWr::new(1, SendOp::Send, &sge)
        .with_flags(SendFlags::empty())
        .with_ud(p.to_b(QKEY));
    p.a.qp.post_send(&[wr])?;
    p.expect_recv(1, 32, None, 0)?;
    expect_nothing_for_a_while(&p.a.send_cq, "unsignaled UD SEND")
}

/// Datagrams from two QPs to one: `src_qp` tells them apart.
pub fn ud_src_qp_distinguishes_senders<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    let c = UdSide::new(env.open(0)?)?;
    to_rts(&c.qp, QKEY)?;
    let ah = c.ctx.create_ah(&c.pd, &p.b.ah_attr()?)?;
    p.b.post_recv(1, 0, 256)?;
    p.b.post_recv(2, 256, 256)?;
    p.send(1, SendOp::Send, 8, QKEY)?;
    let sge = [c.sge(0, 8)?];
    let dest = UdDest {
        ah: ah.handle(),
        remote_qpn: p.b.qp.qp_num(),
        remote_qkey: QKEY,
    };
    c.qp.post_send(&[SendWr::new(2, SendOp::Send, &sge).with_ud(dest)])?;
    check_success(&poll_one(&c.send_cq)?, 2, WcOpcode::Send, 8, c.qp.qp_num())?;
    let wcs = poll_exact(&p.b.recv_cq, 2)?;
    // The two datagrams may take either receive (two senders): compare the sources.
    let mut srcs: Vec<u32> = wcs.iter().map(|w| w.src_qp).collect();
    srcs.sort_unstable();
    let mut want = vec![p.a.qp.qp_num(), c.qp.qp_num()];
    want.sort_unstable();
    check_eq!(srcs, want, "src_qp of both receives");
    Ok(())
}

/// Inline data on a UD QP (when the device allows 32 inline bytes) arrives like a gathered one.
pub fn ud_send_inline<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    let max = p.a.qp.query()?.cap.max_inline_data as usize;
    if max < 32 {
        return Err(Stop::Skip(format!("max_inline_data {max} < 32")));
    }
    p.b.post_recv(3, 0, 256)?;
    let data = pattern(3, 32);
    let wr = SendWr::inline(3, SendOp::Send, &data).with_ud(p.to_b(QKEY));
    p.a.qp.post_send(&[wr])?;
    check_success(
        &poll_one(&p.a.send_cq)?,
        3,
        WcOpcode::Send,
        32,
        p.a.qp.qp_num(),
    )?;
    p.expect_recv(3, 32, None, 0)?;
    Ok(())
}

/// A UD QP receiving through an SRQ: the datagram takes the SRQ's WQE, the completion names the
/// UD QP, the GRH and payload land in the SRQ WQE's buffer.
pub fn ud_receive_through_srq<C: Context>(env: &Env<C>) -> Outcome {
    let p = UdPair::new(env)?;
    let ctx = env.open_peer()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16, None)?;
    let srq = needs(
        ctx.create_srq(
            &pd,
            &SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
        ),
        "SRQs",
    )?;
    let dev = ctx.query_device()?;
    let qp = needs(
        ctx.create_qp(
            &pd,
            &cq,
            &cq,
            Some(&srq),
            &QpInitAttr::ud(crate::fixture::default_cap(&dev)),
        ),
        "UD QPs with an SRQ",
    )?;
    to_rts(&qp, QKEY)?;
    let mr = ctx.alloc_mr(&pd, 4096, AccessFlags::LOCAL_WRITE)?;
    let rsge = [mr.sge(0, 512)?];
    srq.post_recv(&[RecvWr::new(77, &rsge)])?;
    let ep = qp.endpoint(0)?;
    let ah = p.a.ctx.create_ah(
        &p.a.pd,
        &AhAttr {
            dgid: ep.gid,
            udp_dport: ep.udp_port,
            ..AhAttr::default()
        },
    )?;
    let data = pattern(77, 48);
    p.a.mr.write(0, &data)?;
    let sge = [p.a.sge(0, 48)?];
    let dest = UdDest {
        ah: ah.handle(),
        remote_qpn: qp.qp_num(),
        remote_qkey: QKEY,
    };
    p.a.qp
        .post_send(&[SendWr::new(1, SendOp::Send, &sge).with_ud(dest)])?;
    check_success(
        &poll_one(&p.a.send_cq)?,
        1,
        WcOpcode::Send,
        48,
        p.a.qp.qp_num(),
    )?;
    let wc = poll_one(&cq)?;
    check_ud_recv(&wc, 77, 48, None, qp.qp_num(), p.a.qp.qp_num())?;
    let mut got = vec![0; 48];
    mr.read(GRH_LEN, &mut got)?;
    check_bytes(&got, &data, "payload through the SRQ")
}
