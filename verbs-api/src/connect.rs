//! Connecting an RC QP to a peer: the RESET → INIT → RTR → RTS walk every RDMA program writes,
//! with the masks of rc-transport.md §5.1.

use crate::attr::{AhAttr, QpAttr, Recovery};
use crate::error::Result;
use crate::traits::QueuePair;
use crate::types::{AccessFlags, Endpoint, Mtu, QpAttrMask, QpState};

/// Transport parameters for [`connect_rc`]. The defaults are those of perftest
/// (`timeout` 14 ≈ 67 ms, `retry_cnt` 7, `rnr_retry` 7, `min_rnr_timer` 12).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RcConnectOptions {
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Remote access rights granted to the peer.
    pub access: AccessFlags,
    /// Local ACK timeout code (rc-transport.md §3.5).
    pub timeout: u8,
    /// Transport retry count (§3.7).
    pub retry_cnt: u8,
    /// RNR retry count; 7 = infinite (§3.7).
    pub rnr_retry: u8,
    /// RNR NAK timer code we send (§3.6).
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests we initiate.
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic requests we accept.
    pub max_dest_rd_atomic: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
    /// Port number.
    pub port_num: u8,
    /// Loss recovery (a softverbs extension, [`Recovery`]): anything but the default sets
    /// [`QpAttrMask::RECOVERY`] at RESET → INIT, which only softverbs backends accept. Both
    /// ends must agree.
    pub recovery: Recovery,
}

impl Default for RcConnectOptions {
    fn default() -> RcConnectOptions {
        RcConnectOptions {
            path_mtu: Mtu::Mtu1024,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            hop_limit: 64,
            port_num: 1,
            recovery: Recovery::Ibta,
        }
    }
}

/// Walks `qp` from RESET to RTS, sending from `local_psn` and connected to `remote`.
///
/// Fails with the error of the first `modify` that fails, leaving the QP in the state it reached.
pub fn connect_rc<Q: QueuePair>(
    qp: &Q,
    local_psn: u32,
    remote: &Endpoint,
    opts: &RcConnectOptions,
) -> Result<()> {
    let attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: opts.port_num,
        qp_access_flags: opts.access,
        path_mtu: opts.path_mtu,
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        max_dest_rd_atomic: opts.max_dest_rd_atomic,
        min_rnr_timer: opts.min_rnr_timer,
        ah_attr: AhAttr {
            dgid: remote.gid,
            hop_limit: opts.hop_limit,
            port_num: opts.port_num,
            udp_dport: remote.udp_port,
            ..AhAttr::default()
        },
        timeout: opts.timeout,
        retry_cnt: opts.retry_cnt,
        rnr_retry: opts.rnr_retry,
        sq_psn: local_psn,
        max_rd_atomic: opts.max_rd_atomic,
        recovery: opts.recovery,
        ..QpAttr::default()
    };
    let init = if opts.recovery == Recovery::Ibta {
        INIT_MASK
    } else {
        INIT_MASK | QpAttrMask::RECOVERY
    };
    qp.modify(&attr, init)?;
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rtr,
            ..attr
        },
        RTR_MASK,
    )?;
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rts,
            ..attr
        },
        RTS_MASK,
    )
}

/// The mask of RESET → INIT (rc-transport.md §5.1).
pub const INIT_MASK: QpAttrMask = QpAttrMask::STATE
    .union(QpAttrMask::PKEY_INDEX)
    .union(QpAttrMask::PORT)
    .union(QpAttrMask::ACCESS_FLAGS);

/// The required mask of INIT → RTR (rc-transport.md §5.1).
pub const RTR_MASK: QpAttrMask = QpAttrMask::STATE
    .union(QpAttrMask::AV)
    .union(QpAttrMask::PATH_MTU)
    .union(QpAttrMask::DEST_QPN)
    .union(QpAttrMask::RQ_PSN)
    .union(QpAttrMask::MAX_DEST_RD_ATOMIC)
    .union(QpAttrMask::MIN_RNR_TIMER);

/// The required mask of RTR → RTS (rc-transport.md §5.1).
pub const RTS_MASK: QpAttrMask = QpAttrMask::STATE
    .union(QpAttrMask::TIMEOUT)
    .union(QpAttrMask::RETRY_CNT)
    .union(QpAttrMask::RNR_RETRY)
    .union(QpAttrMask::SQ_PSN)
    .union(QpAttrMask::MAX_QP_RD_ATOMIC);
