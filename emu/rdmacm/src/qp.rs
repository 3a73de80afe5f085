//! The QP attributes rdma_cm applies: INIT for a new connected QP (UD: through RTS), RTR and
//! RTS with the values the CM negotiated ([`Path`]), ERR on disconnect; and
//! `rdma_init_qp_attr`, which gives the same attributes to programs that create and move their
//! own QPs (`rping -q`).
//!
//! What it is not: the negotiation (see [`crate::agent`]).

use std::ffi::c_int;

use emu_cm::{ConnectParams, RepInfo, ReqInfo};
use ibverbs_sys::*;

use crate::abi::{RDMA_UDP_QKEY, rdma_cm_id};
use crate::agent::{self, passive_rd_atomic};
use crate::devices::{self, Dev};
use crate::verbs::*;
use crate::{fail, guard};

/// The min RNR NAK timer rdma_cm sets at RTR (IBTA encoding 12 = 0.64 ms).
pub const MIN_RNR_TIMER: u8 = 12;
/// The hop limit of the connected QPs' GRH.
pub const HOP_LIMIT: u8 = 64;

/// The negotiated values a connected QP's RTR and RTS transitions take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Path {
    /// The peer port's GID.
    pub dgid: [u8; 16],
    /// Traffic class (`RDMA_OPTION_ID_TOS`).
    pub tos: u8,
    /// The peer QP.
    pub dest_qpn: u32,
    /// The first PSN we expect: the starting PSN of the CM message we sent.
    pub rq_psn: u32,
    /// Our first send PSN: the starting PSN of the peer's CM message.
    pub sq_psn: u32,
    /// Path MTU, IBTA encoding.
    pub mtu: u8,
    /// Incoming READs/atomics accepted.
    pub max_dest_rd_atomic: u8,
    /// Outstanding READs/atomics issued.
    pub max_rd_atomic: u8,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Transport retry count.
    pub retry: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
}

/// A CM message's starting PSN is the PSN its *sender* expects to receive first, the
/// convention of Linux's CM (`ib_send_cm_req`/`ib_send_cm_rep` keep it as their `rq_psn`, the
/// REQ's and REP's receivers take it as their `sq_psn`; rdma_cm's RTR sets `rq_psn` to the
/// id's own sequence number): the active side sends from the REP's PSN, the passive side from
/// the REQ's.
impl Path {
    /// The active side's path: our REQ and the peer's REP.
    pub fn active(c: &ConnectParams, rep: &RepInfo, tos: u8) -> Path {
        Path {
            dgid: c.remote.gid,
            tos,
            dest_qpn: rep.remote_qpn,
            rq_psn: c.starting_psn,
            sq_psn: rep.starting_psn,
            mtu: c.path_mtu,
            max_dest_rd_atomic: c.responder_resources,
            max_rd_atomic: c.initiator_depth.min(rep.responder_resources),
            timeout: c.local_ack_timeout,
            retry: c.retry_count,
            rnr_retry: rep.rnr_retry_count,
        }
    }

    /// The passive side's path: the peer's REQ and what we answer.
    pub fn passive(req: &ReqInfo, d: &Dev, resp: u8, init: u8, psn: u32, tos: u8) -> Path {
        Path {
            dgid: req.remote.gid,
            tos,
            dest_qpn: req.remote_qpn,
            rq_psn: psn,
            sq_psn: req.starting_psn,
            mtu: req.path_mtu.min(d.active_mtu),
            max_dest_rd_atomic: resp,
            max_rd_atomic: init,
            timeout: req.local_ack_timeout,
            retry: req.retry_count,
            rnr_retry: req.rnr_retry_count,
        }
    }

    /// RTR's attributes and mask.
    pub fn rtr(&self) -> (ibv_qp_attr, c_int) {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: u32::from(self.mtu),
            dest_qp_num: self.dest_qpn,
            rq_psn: self.rq_psn,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            min_rnr_timer: MIN_RNR_TIMER,
            ..Default::default()
        };
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.dgid.raw = self.dgid;
        a.ah_attr.grh.hop_limit = HOP_LIMIT;
        a.ah_attr.grh.traffic_class = self.tos;
        let mask = IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER;
        (a, mask)
    }

    /// RTS's attributes and mask.
    pub fn rts(&self) -> (ibv_qp_attr, c_int) {
        let a = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            sq_psn: self.sq_psn,
            timeout: self.timeout,
            retry_cnt: self.retry,
            rnr_retry: self.rnr_retry,
            max_rd_atomic: self.max_rd_atomic,
            ..Default::default()
        };
        let mask = IBV_QP_STATE
            | IBV_QP_SQ_PSN
            | IBV_QP_TIMEOUT
            | IBV_QP_RETRY_CNT
            | IBV_QP_RNR_RETRY
            | IBV_QP_MAX_QP_RD_ATOMIC;
        (a, mask)
    }

    /// INIT → RTR → RTS.
    ///
    /// # Safety
    /// `qp` is a live QP in INIT.
    pub unsafe fn rtr_rts(&self, qp: *mut ibv_qp) -> Result<(), i32> {
        for (mut a, mask) in [self.rtr(), self.rts()] {
            // SAFETY: the caller's live QP.
            let r = unsafe { ibv_modify_qp(qp, &mut a, mask) };
            if r != 0 {
                return Err(r);
            }
        }
        Ok(())
    }
}

/// INIT's attributes and mask: port 1, P_Key index 0, and for RC/UC local write and remote
/// read/write/atomic access, for UD the Q_Key `RDMA_UDP_QKEY`.
pub fn init_attr(ud: bool) -> (ibv_qp_attr, c_int) {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        port_num: 1,
        ..Default::default()
    };
    let mut mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if ud {
        a.qkey = RDMA_UDP_QKEY;
        mask |= IBV_QP_QKEY;
    } else {
        a.qp_access_flags = (IBV_ACCESS_LOCAL_WRITE
            | IBV_ACCESS_REMOTE_WRITE
            | IBV_ACCESS_REMOTE_READ
            | IBV_ACCESS_REMOTE_ATOMIC) as u32;
        mask |= IBV_QP_ACCESS_FLAGS;
    }
    (a, mask)
}

/// Moves a new QP to INIT ([`init_attr`]) or, for UD, through INIT and RTR to RTS, as
/// librdmacm leaves them.
///
/// # Safety
/// `qp` is a live QP in RESET.
pub unsafe fn init_qp(qp: *mut ibv_qp) -> Result<(), i32> {
    // SAFETY: per the contract.
    let ud = unsafe { (*qp).qp_type } == IBV_QPT_UD;
    let mut steps = vec![init_attr(ud)];
    if ud {
        for (state, extra) in [(IBV_QPS_RTR, 0), (IBV_QPS_RTS, IBV_QP_SQ_PSN)] {
            let a = ibv_qp_attr {
                qp_state: state,
                ..Default::default()
            };
            steps.push((a, IBV_QP_STATE | extra));
        }
    }
    for (mut a, mask) in steps {
        // SAFETY: per the contract.
        let r = unsafe { ibv_modify_qp(qp, &mut a, mask) };
        if r != 0 {
            return Err(r);
        }
    }
    Ok(())
}

/// Moves `qp` (if any) to ERR, flushing its work requests, as rdma_cm does on disconnect.
///
/// # Safety
/// `qp` is NULL or a live QP.
pub unsafe fn qp_to_err(qp: *mut ibv_qp) {
    if qp.is_null() {
        return;
    }
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    // SAFETY: the caller's live QP.
    unsafe { ibv_modify_qp(qp, &mut a, IBV_QP_STATE) };
}

/// The attributes for `state` of `id`'s connection: INIT always; RTR and RTS once the peer's
/// values are known (passive: after CONNECT_REQUEST; active: after CONNECT_RESPONSE).
fn attr_for(id: *mut rdma_cm_id, state: u32) -> Result<(ibv_qp_attr, c_int), i32> {
    let s = agent::lock();
    let st = s.ids.get(&(id as usize)).ok_or(libc::EINVAL)?;
    // SAFETY: a live id of this library.
    let ud = unsafe { (*id).qp_type } as u32 == IBV_QPT_UD;
    if state == IBV_QPS_INIT {
        return Ok(init_attr(ud));
    }
    let d = st.dev.and_then(devices::dev).ok_or(libc::EINVAL)?;
    let path = match (&st.req, &st.connect, &st.rep) {
        (Some(req), _, _) => {
            let (resp, init) = passive_rd_atomic(req, d, None);
            Path::passive(req, d, resp, init, st.psn, st.tos)
        }
        (None, Some(c), Some(rep)) => Path::active(c, rep, st.tos),
        _ => return Err(libc::EINVAL),
    };
    match state {
        IBV_QPS_RTR => Ok(path.rtr()),
        IBV_QPS_RTS => Ok(path.rts()),
        _ => Err(libc::EINVAL),
    }
}

/// `rdma_init_qp_attr`: the attributes and mask for `qp_attr->qp_state` (INIT, RTR or RTS)
/// of the id's connection, for a QP the program moves itself; `EINVAL` for other states or
/// before the peer's values are known.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        if id.is_null() || qp_attr.is_null() || qp_attr_mask.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's attribute struct.
        let state = unsafe { (*qp_attr).qp_state };
        match attr_for(id, state) {
            Ok((a, mask)) => {
                // SAFETY: the caller's out-parameters.
                unsafe {
                    *qp_attr = a;
                    *qp_attr_mask = mask;
                }
                0
            }
            Err(e) => fail(e),
        }
    })
}

#[cfg(test)]
mod tests {
    use emu_cm::MadAddr;

    use super::*;

    #[test]
    fn active_path_takes_the_rep_s_psn_qpn_and_rnr_retry_and_caps_reads() {
        let c = ConnectParams {
            service_id: emu_cm::service_id(0x0106, 7),
            remote: MadAddr {
                gid: [9; 16],
                qpn: 1,
            },
            local_qpn: 17,
            starting_psn: 100,
            reliable: true,
            responder_resources: 4,
            initiator_depth: 4,
            path_mtu: 5,
            retry_count: 7,
            rnr_retry_count: 6,
            local_ack_timeout: 14,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            private_data: vec![],
        };
        let rep = RepInfo {
            remote_qpn: 33,
            starting_psn: 200,
            responder_resources: 2,
            initiator_depth: 1,
            rnr_retry_count: 3,
            private_data: vec![],
        };
        let p = Path::active(&c, &rep, 0);
        assert_eq!((p.dest_qpn, p.rq_psn, p.sq_psn), (33, 100, 200));
        assert_eq!(
            (p.max_rd_atomic, p.max_dest_rd_atomic, p.rnr_retry),
            (2, 4, 3)
        );
        let (rtr, mask) = p.rtr();
        assert_eq!(rtr.ah_attr.grh.dgid.raw, [9; 16]);
        assert_eq!(rtr.path_mtu, 5);
        assert_ne!(mask & IBV_QP_DEST_QPN, 0);
        let (rts, _) = p.rts();
        assert_eq!((rts.sq_psn, rts.timeout, rts.retry_cnt), (200, 14, 7));
    }

    #[test]
    fn init_is_connected_or_ud() {
        let (rc, m) = init_attr(false);
        assert_eq!(rc.qp_access_flags, 15);
        assert_eq!(m & IBV_QP_QKEY, 0);
        let (ud, m) = init_attr(true);
        assert_eq!(ud.qkey, RDMA_UDP_QKEY);
        assert_ne!(m & IBV_QP_QKEY, 0);
    }
}
