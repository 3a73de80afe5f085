//! Unreliable datagram helpers: the Global Route Header a UD receive finds at the start of its
//! buffer, and `ibv_init_ah_from_wc` (the address handle attributes that answer a datagram).
//!
//! On RoCEv2 the "GRH" is the IP header of the datagram: for IPv6 the 40-byte IPv6 header, for
//! IPv4 the 20-byte IPv4 header in the *last* 20 bytes of the 40, the first 20 being unspecified
//! (rdma-core's `ibv_create_ah_from_wc(3)`). This module only reads those bytes; the transport
//! that writes them is the backend's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::attr::AhAttr;
use crate::error::{Error, Result};
use crate::types::{Gid, ROCE_V2_UDP_PORT, WcFlags};
use crate::wc::WorkCompletion;

/// Bytes of the GRH at the start of every UD receive buffer (`sizeof(struct ibv_grh)`): the
/// receive WR's buffers must be this much larger than the largest message.
pub const GRH_LEN: usize = 40;

/// Offset of the IPv4 header inside the GRH for RoCEv2 over IPv4.
const IPV4_AT: usize = 20;

/// The addresses and routing fields a GRH carries, whichever IP version it holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GrhInfo {
    /// The sender's address (the GRH's SGID).
    pub source: IpAddr,
    /// The receiver's address (the GRH's DGID).
    pub destination: IpAddr,
    /// IPv6 traffic class or IPv4 TOS.
    pub traffic_class: u8,
    /// IPv6 flow label (0 for IPv4).
    pub flow_label: u32,
    /// IPv6 hop limit or IPv4 TTL.
    pub hop_limit: u8,
}

impl GrhInfo {
    /// Parses the 40 GRH bytes: an IPv6 header (version 6 in the first nibble) or an IPv4
    /// header in bytes 20..40 (version 4, IHL 5). Anything else is `InvalidArgument`.
    pub fn parse(grh: &[u8]) -> Result<GrhInfo> {
        let grh: &[u8; GRH_LEN] = grh
            .get(..GRH_LEN)
            .and_then(|g| g.try_into().ok())
            .ok_or_else(|| Error::invalid(format!("a GRH is {GRH_LEN} bytes")))?;
        if grh[0] >> 4 == 6 {
            let word = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
            let addr = |at: usize| {
                let mut b = [0u8; 16];
                b.copy_from_slice(&grh[at..at + 16]);
                let v6 = Ipv6Addr::from(b);
                v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
            };
            return Ok(GrhInfo {
                source: addr(8),
                destination: addr(24),
                traffic_class: ((word >> 20) & 0xFF) as u8,
                flow_label: word & 0xF_FFFF,
                hop_limit: grh[7],
            });
        }
        let ip = &grh[IPV4_AT..];
        if ip[0] != 0x45 {
            return Err(Error::invalid(
                "the GRH holds neither an IPv6 nor an IPv4 header",
            ));
        }
        let v4 = |at: usize| IpAddr::V4(Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]));
        Ok(GrhInfo {
            source: v4(12),
            destination: v4(16),
            traffic_class: ip[1],
            flow_label: 0,
            hop_limit: ip[8],
        })
    }
}

/// The address handle attributes that send back to the sender of the datagram `wc` received,
/// whose GRH is `grh` (the first [`GRH_LEN`] bytes of the receive buffer), on `port_num`
/// (`ibv_init_ah_from_wc`).
///
/// As rdma-core: `dgid` is the GRH's source, `sgid_index` the local GID the datagram was sent
/// to (this crate's devices have one GID: 0), `hop_limit` 0xFF, `traffic_class` and
/// `flow_label` from the GRH, `sl` from the completion. `udp_dport` is RoCEv2's 4791: an
/// emulated peer bound to another port must be given its port by the caller.
///
/// Errors (`InvalidArgument`): `wc` without [`WcFlags::GRH`], a GRH that parses as neither IP
/// version.
pub fn init_ah_from_wc(wc: &WorkCompletion, grh: &[u8], port_num: u8) -> Result<AhAttr> {
    if !wc.wc_flags.contains(WcFlags::GRH) {
        return Err(Error::invalid(
            "the completion has no GRH (IBV_WC_GRH is clear)",
        ));
    }
    let info = GrhInfo::parse(grh)?;
    Ok(AhAttr {
        dgid: Gid::from_ip(info.source),
        sgid_index: 0,
        flow_label: info.flow_label,
        hop_limit: 0xFF,
        traffic_class: info.traffic_class,
        sl: wc.sl,
        port_num,
        udp_dport: ROCE_V2_UDP_PORT,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_grh_in_the_last_20_bytes() {
        let mut grh = [0u8; GRH_LEN];
        grh[20] = 0x45;
        grh[21] = 0x10;
        grh[28] = 64;
        grh[29] = 17;
        grh[32..36].copy_from_slice(&[127, 0, 0, 2]);
        grh[36..40].copy_from_slice(&[127, 0, 0, 1]);
        let info = GrhInfo::parse(&grh).unwrap();
        assert_eq!(info.source, IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
        assert_eq!(info.destination, IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)));
        assert_eq!((info.traffic_class, info.hop_limit), (0x10, 64));
        let wc = WorkCompletion {
            wc_flags: WcFlags::GRH,
            sl: 3,
            ..WorkCompletion::default()
        };
        let ah = init_ah_from_wc(&wc, &grh, 1).unwrap();
        assert_eq!(ah.dgid, Gid::from_ip(info.source));
        assert_eq!((ah.sl, ah.traffic_class, ah.hop_limit), (3, 0x10, 0xFF));
        let no_grh = WorkCompletion::default();
        assert!(init_ah_from_wc(&no_grh, &grh, 1).is_err());
    }

    #[test]
    fn ipv6_grh_and_garbage() {
        let mut grh = [0u8; GRH_LEN];
        grh[..4].copy_from_slice(&0x6123_4567u32.to_be_bytes());
        grh[7] = 9;
        grh[8..24].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
        let info = GrhInfo::parse(&grh).unwrap();
        assert_eq!(info.source, IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!((info.traffic_class, info.flow_label), (0x12, 0x3_4567));
        assert_eq!(info.hop_limit, 9);
        assert!(GrhInfo::parse(&[0u8; GRH_LEN]).is_err());
        assert!(GrhInfo::parse(&[0u8; 10]).is_err());
    }
}
