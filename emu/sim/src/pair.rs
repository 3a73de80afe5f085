//! Test fixtures: an RC QP pair between two devices, connected in one call.

use verbs_api::{
    AccessFlags, Context, Error, QpCap, QpInitAttr, QueuePair, RcConnectOptions, Result, connect_rc,
};

use crate::{SimContext, SimCq, SimMr, SimPd, SimProvider, SimQp};

/// What [`connect_pair`] creates. Every field has a default ([`PairOptions::default`]);
/// `From<RcConnectOptions>` changes only the transport parameters.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PairOptions {
    /// Transport parameters of both QPs (path MTU, timeouts, retry counts, access, …).
    pub rc: RcConnectOptions,
    /// Queue capacities of both QPs. Default: 256 send and receive WRs, 4 SGEs each way, 64
    /// inline bytes.
    pub cap: QpCap,
    /// Entries of each side's CQ (default 1024); both queues of a QP complete there.
    pub cq_size: u32,
    /// Length of each side's MR (default 64 KiB, zeroed).
    pub mr_len: usize,
    /// Access of each side's MR (default: local write, remote read, write and atomic).
    pub mr_access: AccessFlags,
    /// First PSN side `a` sends (default 0x1000).
    pub psn_a: u32,
    /// First PSN side `b` sends (default 0x2000).
    pub psn_b: u32,
}

impl Default for PairOptions {
    fn default() -> PairOptions {
        PairOptions {
            rc: RcConnectOptions::default(),
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            cq_size: 1024,
            mr_len: 64 * 1024,
            mr_access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            psn_a: 0x1000,
            psn_b: 0x2000,
        }
    }
}

impl From<RcConnectOptions> for PairOptions {
    fn from(rc: RcConnectOptions) -> PairOptions {
        PairOptions {
            rc,
            ..PairOptions::default()
        }
    }
}

/// A connected RC QP pair and everything around it, ready for traffic: side `a` on one device,
/// side `b` on another (or the same), each with its own PD, CQ (send and receive), MR and QP in
/// RTS. Fields are public; the handles are ordinary `verbs_api` objects.
#[derive(Clone, Debug)]
pub struct SimPair {
    /// The provider: fault control, counters, trace.
    pub sim: SimProvider,
    /// Side a's device.
    pub a: SimContext,
    /// Side b's device.
    pub b: SimContext,
    /// Side a's protection domain.
    pub pd_a: SimPd,
    /// Side b's protection domain.
    pub pd_b: SimPd,
    /// Side a's CQ (send and receive completions).
    pub cq_a: SimCq,
    /// Side b's CQ (send and receive completions).
    pub cq_b: SimCq,
    /// Side a's QP, connected to `qp_b`.
    pub qp_a: SimQp,
    /// Side b's QP, connected to `qp_a`.
    pub qp_b: SimQp,
    /// Side a's MR.
    pub mr_a: SimMr,
    /// Side b's MR.
    pub mr_b: SimMr,
}

/// Creates a PD, a CQ, an MR and an RC QP on each of `a` and `b` and connects the QPs (RESET →
/// RTS on both sides, exchanging endpoints in-process). `opts` is a [`PairOptions`] or just an
/// [`RcConnectOptions`].
///
/// Errors: `InvalidArgument` if `a` and `b` belong to different providers, or for options the
/// device rejects (capacities, MTU, access); any error of the verbs calls involved.
pub fn connect_pair(
    a: &SimContext,
    b: &SimContext,
    opts: impl Into<PairOptions>,
) -> Result<SimPair> {
    if !a.device().same_fabric(b.device()) {
        return Err(Error::invalid(
            "connect_pair: the contexts belong to different providers",
        ));
    }
    let o = opts.into();
    let side = |ctx: &SimContext| -> Result<(SimPd, SimCq, SimQp, SimMr)> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(o.cq_size, None)?;
        let qp = ctx.create_qp(&pd, &cq, &cq, None, &QpInitAttr::rc(o.cap))?;
        let mr = ctx.alloc_mr(&pd, o.mr_len, o.mr_access)?;
        Ok((pd, cq, qp, mr))
    };
    let (pd_a, cq_a, qp_a, mr_a) = side(a)?;
    let (pd_b, cq_b, qp_b, mr_b) = side(b)?;
    connect_rc(&qp_a, o.psn_a, &qp_b.endpoint(o.psn_b)?, &o.rc)?;
    connect_rc(&qp_b, o.psn_b, &qp_a.endpoint(o.psn_a)?, &o.rc)?;
    Ok(SimPair {
        sim: a.provider(),
        a: a.clone(),
        b: b.clone(),
        pd_a,
        pd_b,
        cq_a,
        cq_b,
        qp_a,
        qp_b,
        mr_a,
        mr_b,
    })
}
