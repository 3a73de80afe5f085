//! Plain value types of the verbs object model: GIDs, MTUs, states, flag sets.
//!
//! Numeric values are rdma-core's (`<infiniband/verbs.h>`), so they can be exchanged with
//! libibverbs and printed the way RDMA users expect (rc-transport.md §5, §6, §7).

use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The largest valid QP number or PSN: both are 24-bit quantities on the wire.
pub const MAX_24BIT: u32 = 0x00FF_FFFF;

/// The UDP destination port of RoCEv2 (rc-transport.md §1.1).
pub const ROCE_V2_UDP_PORT: u16 = 4791;

/// A 128-bit global identifier. For RoCEv2 it is the port's IP address, IPv4 addresses in their
/// IPv4-mapped IPv6 form `::ffff:a.b.c.d` (rc-transport.md §1.1).
#[derive(Copy, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address: IPv4 becomes IPv4-mapped IPv6.
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID stands for: IPv4 for an IPv4-mapped GID, IPv6 otherwise.
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// The IPv4 address if this GID is IPv4-mapped.
    pub fn to_ipv4(self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }

    /// True for the all-zero GID (an empty GID table slot).
    pub fn is_zero(self) -> bool {
        self.0 == [0; 16]
    }
}

impl fmt::Display for Gid {
    /// Formats as an IPv6 address, e.g. `::ffff:127.0.0.1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Ipv6Addr::from(self.0), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// IB path MTU (`ibv_mtu`): the payload bytes per packet.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes (`IBV_MTU_256` = 1).
    Mtu256 = 1,
    /// 512 bytes (`IBV_MTU_512` = 2).
    Mtu512 = 2,
    /// 1024 bytes (`IBV_MTU_1024` = 3).
    #[default]
    Mtu1024 = 3,
    /// 2048 bytes (`IBV_MTU_2048` = 4).
    Mtu2048 = 4,
    /// 4096 bytes (`IBV_MTU_4096` = 5).
    Mtu4096 = 5,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The MTU for a byte count (256, 512, 1024, 2048, 4096).
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Some(match bytes {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// The MTU for rdma-core's enum value 1..=5.
    pub fn from_raw(v: u8) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

/// QP transport type (`ibv_qp_type`). The emulator implements all three; a backend without
/// one answers [`ErrorKind::NotSupported`](crate::ErrorKind::NotSupported) at creation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u32)]
pub enum QpType {
    /// Reliable connected (`IBV_QPT_RC` = 2).
    Rc = 2,
    /// Unreliable connected (`IBV_QPT_UC` = 3).
    Uc = 3,
    /// Unreliable datagram (`IBV_QPT_UD` = 4).
    Ud = 4,
}

/// QP state (`ibv_qp_state`), IBTA names and rdma-core values (rc-transport.md §5).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u32)]
pub enum QpState {
    /// RESET (0): just created or reset; nothing may be posted.
    #[default]
    Reset = 0,
    /// INIT (1): receives may be posted.
    Init = 1,
    /// RTR (2): ready to receive.
    Rtr = 2,
    /// RTS (3): ready to send.
    Rts = 3,
    /// SQD (4): send queue drain; new sends are queued but not started.
    Sqd = 4,
    /// SQE (5): send queue error (never entered by RC).
    Sqe = 5,
    /// ERR (6): all work is flushed with `WR_FLUSH_ERR`.
    Err = 6,
}

impl QpState {
    /// The IBTA upper-case name, e.g. `"RTS"`.
    pub const fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }

    /// All states in numeric order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Port state (`ibv_port_state`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u32)]
pub enum PortState {
    /// `IBV_PORT_DOWN` = 1.
    Down = 1,
    /// `IBV_PORT_INIT` = 2.
    Init = 2,
    /// `IBV_PORT_ARMED` = 3.
    Armed = 3,
    /// `IBV_PORT_ACTIVE` = 4.
    Active = 4,
}

/// Port link layer (`IBV_LINK_LAYER_*`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LinkLayer {
    /// Native InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE); every softverbs emulated port is Ethernet.
    Ethernet,
}

bitflags::bitflags! {
    /// Memory and QP access rights (`ibv_access_flags`, rc-transport.md §7.1).
    ///
    /// REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE on an MR (§7.2); local read is always
    /// allowed.
    #[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: the HCA may write the memory for local operations.
        const LOCAL_WRITE = 1;
        /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE it.
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ it.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics on it.
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to it.
        const MW_BIND = 1 << 4;
        /// `IBV_ACCESS_ZERO_BASED`: addresses are offsets from 0.
        const ZERO_BASED = 1 << 5;
        /// `IBV_ACCESS_ON_DEMAND`: on-demand paging.
        const ON_DEMAND = 1 << 6;
        /// `IBV_ACCESS_HUGETLB`.
        const HUGETLB = 1 << 7;
        /// `IBV_ACCESS_RELAXED_ORDERING` (optional; may be ignored).
        const RELAXED_ORDERING = 1 << 20;
    }
}

bitflags::bitflags! {
    /// Device capability bits (`ibv_device_cap_flags`), as rdma-core numbers them. Only the
    /// memory-window bits are named; other bits a backend reports are kept as they are.
    #[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
    pub struct DeviceCapFlags: u32 {
        /// `IBV_DEVICE_MEM_WINDOW`: memory windows (type 1) are supported.
        const MEM_WINDOW = 1 << 17;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2A`: type 2A windows (bound to a QP, key checked).
        const MEM_WINDOW_TYPE_2A = 1 << 23;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`: type 2B windows (bound to a QP and its PD).
        const MEM_WINDOW_TYPE_2B = 1 << 24;
        const _ = !0;
    }
}

/// The type of a memory window (`ibv_mw_type`, IBTA §10.6.7).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MwType {
    /// `IBV_MW_TYPE_1`: bound with `ibv_bind_mw`, which picks a new R_Key; a zero-length bind
    /// unbinds it; never invalidated by LOCAL_INV or SEND_WITH_INV.
    Type1,
    /// `IBV_MW_TYPE_2`: bound by a BIND_MW work request to the posting QP, with the R_Key the
    /// request names; unbound by LOCAL_INV or a peer's SEND_WITH_INV.
    Type2,
}

impl MwType {
    /// rdma-core's `ibv_mw_type` value (1 or 2).
    pub const fn raw(self) -> u32 {
        match self {
            MwType::Type1 => 1,
            MwType::Type2 => 2,
        }
    }

    /// The type for rdma-core's value; `None` for any other number.
    pub const fn from_raw(v: u32) -> Option<MwType> {
        match v {
            1 => Some(MwType::Type1),
            2 => Some(MwType::Type2),
            _ => None,
        }
    }
}

/// rdma-core's `ibv_inc_rkey`: the same key index with the next key byte (the low 8 bits), as
/// applications pick the R_Key of a type 2 bind.
pub const fn inc_rkey(rkey: u32) -> u32 {
    (rkey & 0xFFFF_FF00) | ((rkey.wrapping_add(1)) & 0xFF)
}

bitflags::bitflags! {
    /// Send work-request flags (`ibv_send_flags`).
    #[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
    pub struct SendFlags: u32 {
        /// `IBV_SEND_FENCE`: wait for earlier READs/atomics to complete before starting.
        const FENCE = 1;
        /// `IBV_SEND_SIGNALED`: generate a completion on success.
        const SIGNALED = 1 << 1;
        /// `IBV_SEND_SOLICITED`: set SE on the last packet.
        const SOLICITED = 1 << 2;
        /// `IBV_SEND_INLINE`: the payload is copied at post time from
        /// [`SendWr::inline_data`](crate::SendWr::inline_data); no lkey is checked.
        const INLINE = 1 << 3;
    }
}

bitflags::bitflags! {
    /// Which fields of a [`QpAttr`](crate::QpAttr) a modify or query names (`ibv_qp_attr_mask`,
    /// rc-transport.md §5.1).
    #[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
    pub struct QpAttrMask: u32 {
        /// `IBV_QP_STATE`.
        const STATE = 1;
        /// `IBV_QP_CUR_STATE`.
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS`.
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`.
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`.
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY`.
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`.
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`.
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`.
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`.
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`.
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`.
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_ALT_PATH`.
        const ALT_PATH = 1 << 14;
        /// `IBV_QP_MIN_RNR_TIMER`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`.
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_PATH_MIG_STATE`.
        const PATH_MIG_STATE = 1 << 18;
        /// `IBV_QP_CAP`.
        const CAP = 1 << 19;
        /// `IBV_QP_DEST_QPN`.
        const DEST_QPN = 1 << 20;
        /// `IBV_QP_RATE_LIMIT`.
        const RATE_LIMIT = 1 << 25;
        /// [`QpAttr::recovery`](crate::QpAttr::recovery): a softverbs extension, no
        /// libibverbs bit (RC only; RESET → INIT, INIT → INIT and INIT → RTR).
        const RECOVERY = 1 << 29;
    }
}

bitflags::bitflags! {
    /// Work-completion flags (`ibv_wc_flags`, rc-transport.md §6.2).
    #[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
    pub struct WcFlags: u32 {
        /// `IBV_WC_GRH`: a GRH (for RoCEv2, the IP header) preceded the data.
        const GRH = 1;
        /// `IBV_WC_WITH_IMM`: `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// `IBV_WC_IP_CSUM_OK`.
        const IP_CSUM_OK = 1 << 2;
        /// `IBV_WC_WITH_INV`: `invalidated_rkey` is valid.
        const WITH_INV = 1 << 3;
    }
}

/// Everything a peer needs to connect an RC QP to ours, exchanged out of band (as perftest and
/// `ibv_rc_pingpong` exchange LID/QPN/PSN/GID).
///
/// Serialisable with serde and as a single text line (`Display`/`FromStr`:
/// `qpn=0x000011 psn=0x00abcd gid=::ffff:127.0.0.1 port=4791`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    /// The QP number (24-bit).
    pub qpn: u32,
    /// The first PSN the QP will send (the peer's `rq_psn`).
    pub psn: u32,
    /// The port's GID.
    pub gid: Gid,
    /// The UDP port the device receives on (4791 unless the device was bound elsewhere).
    pub udp_port: u16,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "qpn={:#08x} psn={:#08x} gid={} port={}",
            self.qpn, self.psn, self.gid, self.udp_port
        )
    }
}

impl core::str::FromStr for Endpoint {
    type Err = Error;

    /// Parses the `Display` form; every field must appear exactly once.
    fn from_str(s: &str) -> Result<Endpoint> {
        let (mut qpn, mut psn, mut gid, mut port) = (None, None, None, None);
        for field in s.split_whitespace() {
            let (key, value) = field
                .split_once('=')
                .ok_or_else(|| Error::invalid(format!("endpoint field {field:?} lacks '='")))?;
            let slot_taken = match key {
                "qpn" => qpn.replace(parse_u24(value, "qpn")?).is_some(),
                "psn" => psn.replace(parse_u24(value, "psn")?).is_some(),
                "gid" => {
                    let ip: Ipv6Addr = value.parse().map_err(|_| {
                        Error::invalid(format!("endpoint gid {value:?} is not an address"))
                    })?;
                    gid.replace(Gid(ip.octets())).is_some()
                }
                "port" => {
                    let p: u16 = value.parse().map_err(|_| {
                        Error::invalid(format!("endpoint port {value:?} is not a u16"))
                    })?;
                    port.replace(p).is_some()
                }
                other => return Err(Error::invalid(format!("unknown endpoint field {other:?}"))),
            };
            if slot_taken {
                return Err(Error::invalid(format!(
                    "endpoint field {key:?} given twice"
                )));
            }
        }
        match (qpn, psn, gid, port) {
            (Some(qpn), Some(psn), Some(gid), Some(udp_port)) => Ok(Endpoint {
                qpn,
                psn,
                gid,
                udp_port,
            }),
            _ => Err(Error::invalid("endpoint needs qpn, psn, gid and port")),
        }
    }
}

fn parse_u24(value: &str, what: &str) -> Result<u32> {
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => value.parse(),
    };
    match parsed {
        Ok(v) if v <= MAX_24BIT => Ok(v),
        _ => Err(Error::invalid(format!(
            "endpoint {what} {value:?} is not a 24-bit number"
        ))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn gid_ipv4_mapped_round_trip() {
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        let gid = Gid::from_ip(ip);
        assert_eq!(gid.to_string(), "::ffff:127.0.0.2");
        assert_eq!(gid.to_ip(), ip);
    }

    #[test]
    fn mtu_values_match_rdma_core() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_raw(3), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_raw(6), None);
        assert_eq!(Mtu::from_bytes(2048), Some(Mtu::Mtu2048));
    }

    #[test]
    fn endpoint_text_round_trip_and_errors() {
        let ep = Endpoint {
            qpn: 0x11,
            psn: 0xab_cdef,
            gid: Gid::from_ip("127.0.0.1".parse().unwrap()),
            udp_port: 4791,
        };
        let text = ep.to_string();
        assert_eq!(text.parse::<Endpoint>().unwrap(), ep);
        assert!(
            "qpn=0x1000000 psn=0 gid=::1 port=1"
                .parse::<Endpoint>()
                .is_err()
        );
        assert!("qpn=1 psn=0 gid=::1".parse::<Endpoint>().is_err());
        assert!(
            "qpn=1 qpn=2 psn=0 gid=::1 port=1"
                .parse::<Endpoint>()
                .is_err()
        );
        assert!("garbage".parse::<Endpoint>().is_err());
        let json = serde_json::to_string(&ep).unwrap();
        assert_eq!(serde_json::from_str::<Endpoint>(&json).unwrap(), ep);
    }
}
