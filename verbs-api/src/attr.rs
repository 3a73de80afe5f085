//! Attribute structs for queries, creation and modification (`ibv_device_attr`,
//! `ibv_port_attr`, `ibv_qp_init_attr`, `ibv_qp_attr`, `ibv_ah_attr`, `ibv_srq_attr`).

use serde::{Deserialize, Serialize};

use crate::types::{AccessFlags, DeviceCapFlags, Gid, LinkLayer, Mtu, PortState, QpState, QpType};

/// Device limits and identity (`ibv_query_device`).
///
/// A conforming backend rejects requests above these limits with `InvalidArgument` (sizes) or
/// `NoMemory` (object counts).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID.
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Largest MR in bytes.
    pub max_mr_size: u64,
    /// Supported page sizes (bit n set: 2^n bytes).
    pub page_size_cap: u64,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Maximum number of QPs.
    pub max_qp: u32,
    /// Maximum work requests per send or receive queue.
    pub max_qp_wr: u32,
    /// Maximum scatter/gather entries per work request.
    pub max_sge: u32,
    /// Maximum number of CQs.
    pub max_cq: u32,
    /// Maximum entries per CQ.
    pub max_cqe: u32,
    /// Maximum number of MRs.
    pub max_mr: u32,
    /// Maximum number of PDs.
    pub max_pd: u32,
    /// Maximum outstanding RDMA READ/atomic operations a QP may receive (`max_dest_rd_atomic`).
    pub max_qp_rd_atom: u32,
    /// Maximum outstanding RDMA READ/atomic operations a QP may initiate (`max_rd_atomic`).
    pub max_qp_init_rd_atom: u32,
    /// Maximum number of SRQs.
    pub max_srq: u32,
    /// Maximum work requests per SRQ.
    pub max_srq_wr: u32,
    /// Maximum SGEs per SRQ work request.
    pub max_srq_sge: u32,
    /// Maximum inline data per send work request, in bytes.
    pub max_inline_data: u32,
    /// Number of physical ports (ports are numbered from 1).
    pub phys_port_cnt: u8,
    /// Whether atomics are supported and how they are made atomic.
    pub atomic_cap: AtomicCap,
    /// Maximum number of memory windows (0: none).
    pub max_mw: u32,
    /// Capability bits (`ibv_device_cap_flags`); only the memory-window bits are modelled.
    pub device_cap_flags: DeviceCapFlags,
}

/// Atomic capability (`ibv_atomic_cap`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AtomicCap {
    /// `IBV_ATOMIC_NONE`.
    None,
    /// `IBV_ATOMIC_HCA`: atomic with respect to this HCA only.
    Hca,
    /// `IBV_ATOMIC_GLOB`: atomic with respect to CPU accesses too.
    Global,
}

/// Port attributes (`ibv_query_port`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortAttr {
    /// Logical port state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU currently usable on the port's link.
    pub active_mtu: Mtu,
    /// Entries in the GID table.
    pub gid_tbl_len: u32,
    /// Port capability flags.
    pub port_cap_flags: u32,
    /// Largest message in bytes.
    pub max_msg_sz: u32,
    /// Entries in the P_Key table.
    pub pkey_tbl_len: u16,
    /// LID (0 on Ethernet).
    pub lid: u16,
    /// Link layer; Ethernet for RoCE.
    pub link_layer: LinkLayer,
}

/// Queue capacities requested at QP creation and reported back (`ibv_qp_cap`).
///
/// On creation a backend may round each value up; the created QP's actual capacities are
/// reported by `query`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (ignored when an SRQ is attached).
    pub max_recv_wr: u32,
    /// SGEs per send work request.
    pub max_send_sge: u32,
    /// SGEs per receive work request.
    pub max_recv_sge: u32,
    /// Inline bytes per send work request.
    pub max_inline_data: u32,
}

/// QP creation attributes (`ibv_qp_init_attr`, less the CQ/SRQ handles, which are arguments of
/// [`Context::create_qp`](crate::Context::create_qp)).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpInitAttr {
    /// Transport type.
    pub qp_type: QpType,
    /// Requested queue capacities.
    pub cap: QpCap,
    /// If true, every send WR generates a completion, whatever its SIGNALED flag.
    pub sq_sig_all: bool,
}

impl QpInitAttr {
    /// An RC QP with the given capacities, signalling only SIGNALED WRs.
    pub fn rc(cap: QpCap) -> QpInitAttr {
        QpInitAttr {
            qp_type: QpType::Rc,
            cap,
            sq_sig_all: false,
        }
    }

    /// A UD QP with the given capacities, signalling only SIGNALED WRs.
    pub fn ud(cap: QpCap) -> QpInitAttr {
        QpInitAttr {
            qp_type: QpType::Ud,
            ..QpInitAttr::rc(cap)
        }
    }
}

/// Address vector (`ibv_ah_attr` with its GRH). For RoCEv2 the GRH is mandatory: `dgid` is the
/// peer port's GID, i.e. its IP address (rc-transport.md §1.1).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AhAttr {
    /// Destination GID.
    pub dgid: Gid,
    /// Index of our source GID in the port's GID table.
    pub sgid_index: u8,
    /// IPv6 flow label (used for the UDP source port).
    pub flow_label: u32,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv4 TOS / IPv6 traffic class.
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
    /// Local port number (from 1).
    pub port_num: u8,
    /// softverbs extension: the peer's UDP port. Real RoCEv2 always uses 4791; the emulator lets
    /// devices bind other ports (e.g. OS-chosen ones in tests). Hardware backends require 4791.
    pub udp_dport: u16,
}

impl Default for AhAttr {
    fn default() -> AhAttr {
        AhAttr {
            dgid: Gid::default(),
            sgid_index: 0,
            flow_label: 0,
            hop_limit: 64,
            traffic_class: 0,
            sl: 0,
            port_num: 1,
            udp_dport: crate::types::ROCE_V2_UDP_PORT,
        }
    }
}

/// QP attributes for `modify` and `query` (`ibv_qp_attr`). Which fields a modify applies is
/// given by its [`QpAttrMask`](crate::QpAttrMask); the others are ignored.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpAttr {
    /// Target state (`STATE`).
    pub qp_state: QpState,
    /// Current state as the caller believes it (`CUR_STATE`).
    pub cur_qp_state: QpState,
    /// Path MTU (`PATH_MTU`).
    pub path_mtu: Mtu,
    /// Q_Key (`QKEY`, UD only).
    pub qkey: u32,
    /// Expected PSN of the first incoming request (`RQ_PSN`), 24-bit.
    pub rq_psn: u32,
    /// PSN of the first outgoing request (`SQ_PSN`), 24-bit.
    pub sq_psn: u32,
    /// Remote QP number (`DEST_QPN`), 24-bit.
    pub dest_qp_num: u32,
    /// Remote access rights granted to incoming requests (`ACCESS_FLAGS`); only the REMOTE_*
    /// bits and LOCAL_WRITE are meaningful.
    pub qp_access_flags: AccessFlags,
    /// Queue capacities (`CAP`; reported by query).
    pub cap: QpCap,
    /// Primary path address vector (`AV`).
    pub ah_attr: AhAttr,
    /// P_Key index (`PKEY_INDEX`).
    pub pkey_index: u16,
    /// Raise `SQ_DRAINED` when SQD is reached (`EN_SQD_ASYNC_NOTIFY`).
    pub en_sqd_async_notify: bool,
    /// Query only: the send queue is still draining in SQD.
    pub sq_draining: bool,
    /// Outstanding RDMA READ/atomic requests this QP may initiate (`MAX_QP_RD_ATOMIC`).
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ/atomic requests this QP accepts (`MAX_DEST_RD_ATOMIC`).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code sent to peers, 0..=31 (`MIN_RNR_TIMER`, rc-transport.md §3.6).
    pub min_rnr_timer: u8,
    /// Port number, from 1 (`PORT`).
    pub port_num: u8,
    /// Local ACK timeout code 0..=31: 4.096 µs × 2^timeout, 0 = infinite (`TIMEOUT`, §3.5).
    pub timeout: u8,
    /// Transport retries before RETRY_EXC_ERR, 0..=7 (`RETRY_CNT`, §3.7).
    pub retry_cnt: u8,
    /// RNR retries before RNR_RETRY_EXC_ERR, 0..=7, 7 = infinite (`RNR_RETRY`, §3.7).
    pub rnr_retry: u8,
    /// Loss recovery of an RC QP (`RECOVERY`, a softverbs extension with no libibverbs
    /// counterpart): [`Recovery::Ibta`] unless set.
    #[serde(default)]
    pub recovery: Recovery,
}

/// How an RC QP recovers from lost packets: a **softverbs extension** (rc-transport.md
/// "softverbs extensions"), set with [`QpAttrMask::RECOVERY`](crate::QpAttrMask::RECOVERY).
///
/// Selective repeat changes what goes on the wire, so both ends must set it; a standard peer
/// (hardware, rxe, a QP left at the default) only ever sees IBTA packets. Backends that cannot
/// do it (`verbs-hw`) reject [`Recovery::SelectiveRepeat`] with `NotSupported`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Recovery {
    /// IBTA go-back-N: sequence NAKs and the local ACK timeout (the default).
    #[default]
    Ibta,
    /// Selective repeat: the responder keeps out-of-order packets and answers with selective
    /// ACKs; the requester resends only what is missing.
    SelectiveRepeat,
}

impl Default for QpAttr {
    fn default() -> QpAttr {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::empty(),
            cap: QpCap::default(),
            ah_attr: AhAttr::default(),
            pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            recovery: Recovery::Ibta,
        }
    }
}

/// SRQ creation and modification attributes (`ibv_srq_attr`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrqAttr {
    /// Queue depth.
    pub max_wr: u32,
    /// SGEs per receive work request.
    pub max_sge: u32,
    /// Limit event threshold: when fewer WRs remain, `SRQ_LIMIT_REACHED` fires (0 = disarmed).
    pub srq_limit: u32,
}
