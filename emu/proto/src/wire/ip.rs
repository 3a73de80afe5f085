//! The IP and UDP headers a RoCEv2 sender writes in front of the transport headers
//! (rc-transport.md §1.1, §1.8, §1.9).
//!
//! [`IpContext`] names the addresses and ports of one packet; [`IpContext::emit_headers`] writes
//! the IPv4 (20 B) or IPv6 (40 B) header and the UDP header exactly as a softverbs sender puts
//! them on the wire. The ICRC ([`super::icrc`]) covers several of these fields, so both the ICRC
//! pseudo-header and capture framing are built from this one function. The values assumed are:
//!
//! * IPv4: version/IHL 0x45 (no options), TOS 0, total length = 20 + 8 + UDP payload,
//!   identification = [`IpAddrs::V4::ident`] (0 for softverbs senders; Linux leaves 0 on an
//!   unconnected DF socket, §1.8 addendum), flags/fragment 0x4000 (DF, no fragmentation),
//!   TTL 64, protocol 17, real header checksum. TOS, TTL and checksum are masked in the ICRC.
//! * IPv6: version 6, traffic class 0, flow label 0 (both masked in the ICRC), payload length =
//!   8 + UDP payload, next header 17, hop limit 64 (masked).
//! * UDP: the given ports, length = 8 + UDP payload, checksum 0 (rxe sends 0; masked in the
//!   ICRC).
//!
//! This module does not parse IP or UDP headers and opens no sockets.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::WireError;

/// The RoCEv2 UDP destination port, 4791 (rc-transport.md §1.1).
pub const ROCE_V2_UDP_PORT: u16 = 0x12B7;
/// IPv4 header length without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// IPv6 fixed header length.
pub const IPV6_HEADER_LEN: usize = 40;
/// UDP header length.
pub const UDP_HEADER_LEN: usize = 8;
/// The longest output of [`IpContext::emit_headers`] (IPv6 + UDP).
pub const MAX_HEADERS_LEN: usize = IPV6_HEADER_LEN + UDP_HEADER_LEN;

const IPV4_DF: u16 = 0x4000;
const IP_PROTO_UDP: u8 = 0x11;
const DEFAULT_TTL: u8 = 0x40;

/// Source and destination addresses of one packet (one IP version for both).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum IpAddrs {
    /// IPv4 addresses and the IPv4 identification, which the ICRC covers (rc-transport.md §1.8).
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// IPv4 identification field; 0 for softverbs senders.
        ident: u16,
    },
    /// IPv6 addresses.
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
    },
}

/// Everything outside the UDP payload that a RoCEv2 packet's ICRC and framing depend on.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct IpContext {
    /// IP addresses (and IPv4 identification).
    pub addrs: IpAddrs,
    /// UDP source port (rc-transport.md §1.9; receivers do not check it).
    pub src_port: u16,
    /// UDP destination port, normally [`ROCE_V2_UDP_PORT`].
    pub dst_port: u16,
}

impl IpContext {
    /// IPv4 packet from `src:src_port` to `dst:4791` with identification 0.
    pub const fn v4(src: Ipv4Addr, dst: Ipv4Addr, src_port: u16) -> IpContext {
        IpContext {
            addrs: IpAddrs::V4 { src, dst, ident: 0 },
            src_port,
            dst_port: ROCE_V2_UDP_PORT,
        }
    }

    /// IPv6 packet from `src:src_port` to `dst:4791`.
    pub const fn v6(src: Ipv6Addr, dst: Ipv6Addr, src_port: u16) -> IpContext {
        IpContext {
            addrs: IpAddrs::V6 { src, dst },
            src_port,
            dst_port: ROCE_V2_UDP_PORT,
        }
    }

    /// The context of a datagram from `src` to `dst` (addresses and UDP ports), IPv4
    /// identification 0; `None` if the two are of different IP versions.
    pub fn between(src: SocketAddr, dst: SocketAddr) -> Option<IpContext> {
        let addrs = match (src.ip(), dst.ip()) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IpAddrs::V4 { src, dst, ident: 0 },
            (IpAddr::V6(src), IpAddr::V6(dst)) => IpAddrs::V6 { src, dst },
            _ => return None,
        };
        Some(IpContext {
            addrs,
            src_port: src.port(),
            dst_port: dst.port(),
        })
    }

    /// Length of the IP + UDP headers: 28 (IPv4) or 48 (IPv6).
    pub const fn headers_len(&self) -> usize {
        match self.addrs {
            IpAddrs::V4 { .. } => IPV4_HEADER_LEN + UDP_HEADER_LEN,
            IpAddrs::V6 { .. } => IPV6_HEADER_LEN + UDP_HEADER_LEN,
        }
    }

    /// The UDP length field for `udp_payload_len` bytes of payload, or [`WireError::TooLong`]
    /// if it, or the IPv4 total length, would not fit 16 bits.
    pub(super) fn udp_len(&self, udp_payload_len: usize) -> Result<u16, WireError> {
        let ip_len = match self.addrs {
            IpAddrs::V4 { .. } => IPV4_HEADER_LEN,
            IpAddrs::V6 { .. } => 0,
        };
        match u16::try_from(ip_len + UDP_HEADER_LEN + udp_payload_len) {
            Ok(_) => Ok((UDP_HEADER_LEN + udp_payload_len) as u16),
            Err(_) => Err(WireError::TooLong(udp_payload_len)),
        }
    }

    /// Writes the IP and UDP headers for a UDP payload of `udp_payload_len` bytes into the start
    /// of `buf`, with the values listed in the module doc, and returns their length.
    /// Errors: [`WireError::TooLong`] if a length field would overflow, [`WireError::Truncated`]
    /// if `buf` is shorter than [`IpContext::headers_len`].
    pub fn emit_headers(&self, udp_payload_len: usize, buf: &mut [u8]) -> Result<usize, WireError> {
        self.write_headers(udp_payload_len, buf, true)
    }

    /// As [`IpContext::emit_headers`]; with `checksum` false the IPv4 header checksum is left
    /// zero (the ICRC masks it, so its pseudo-header need not compute it).
    pub(super) fn write_headers(
        &self,
        udp_payload_len: usize,
        buf: &mut [u8],
        checksum: bool,
    ) -> Result<usize, WireError> {
        let len = self.headers_len();
        let have = buf.len();
        let buf = buf
            .get_mut(..len)
            .ok_or(WireError::Truncated { need: len, have })?;
        let udp_len = self.udp_len(udp_payload_len)?;
        let (ip, udp) = buf.split_at_mut(len - UDP_HEADER_LEN);
        match self.addrs {
            IpAddrs::V4 { src, dst, ident } => {
                let total = udp_len + IPV4_HEADER_LEN as u16;
                ip[0] = 0x45;
                ip[1] = 0;
                ip[2..4].copy_from_slice(&total.to_be_bytes());
                ip[4..6].copy_from_slice(&ident.to_be_bytes());
                ip[6..8].copy_from_slice(&IPV4_DF.to_be_bytes());
                ip[8] = DEFAULT_TTL;
                ip[9] = IP_PROTO_UDP;
                ip[10..12].fill(0);
                ip[12..16].copy_from_slice(&src.octets());
                ip[16..20].copy_from_slice(&dst.octets());
                if checksum {
                    let csum = ipv4_checksum(ip);
                    ip[10..12].copy_from_slice(&csum.to_be_bytes());
                }
            }
            IpAddrs::V6 { src, dst } => {
                ip[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
                ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
                ip[6] = IP_PROTO_UDP;
                ip[7] = DEFAULT_TTL;
                ip[8..24].copy_from_slice(&src.octets());
                ip[24..40].copy_from_slice(&dst.octets());
            }
        }
        udp[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        udp[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        udp[6..8].fill(0);
        Ok(len)
    }
}

/// The IPv4 header checksum (RFC 791 one's-complement sum) over `header`, whose checksum field
/// must be zero.
fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// The RoCEv2 UDP source port for a connection with flow label 0, as Linux's
/// `rdma_get_udp_sport` derives it from the two QPNs (rc-transport.md §1.9). Symmetric in
/// `lqpn` and `rqpn`; always in 0xC000..=0xFFFF.
pub const fn udp_sport(lqpn: u32, rqpn: u32) -> u16 {
    let mut v = (lqpn as u64) * (rqpn as u64);
    v ^= v >> 20;
    v ^= v >> 40;
    let fl = (v & 0xF_FFFF) as u32;
    0xC000 | (((fl & 0x3FFF) ^ ((fl & 0xF_C000) >> 14)) as u16)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_headers_match_spec_vector_layout() {
        // rc-transport.md §1.8 CNP vector: 45c2003c 718c4000 40119161 0a001101 0a001201 /
        // UDP 0000 12b7 0028 0000. Ours differs only in TOS (0), which changes the checksum.
        let ctx = IpContext {
            addrs: IpAddrs::V4 {
                src: Ipv4Addr::new(10, 0, 17, 1),
                dst: Ipv4Addr::new(10, 0, 18, 1),
                ident: 0x718C,
            },
            src_port: 0,
            dst_port: ROCE_V2_UDP_PORT,
        };
        let mut buf = [0; 28];
        assert_eq!(ctx.emit_headers(32, &mut buf), Ok(28));
        let mut with_tos = buf;
        with_tos[1] = 0xC2;
        with_tos[10..12].fill(0);
        assert_eq!(ipv4_checksum(&with_tos[..20]), 0x9161, "checksum routine");
        assert_eq!(
            buf,
            [
                0x45, 0x00, 0x00, 0x3C, 0x71, 0x8C, 0x40, 0x00, 0x40, 0x11, 0x92, 0x23, 0x0A, 0x00,
                0x11, 0x01, 0x0A, 0x00, 0x12, 0x01, 0x00, 0x00, 0x12, 0xB7, 0x00, 0x28, 0x00, 0x00
            ]
        );
    }

    #[test]
    fn length_limits() {
        let ctx = IpContext::v4(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 0xC000);
        let mut buf = [0; 28];
        assert_eq!(ctx.emit_headers(0xFFFF - 28, &mut buf), Ok(28));
        assert_eq!(
            ctx.emit_headers(0xFFFF - 27, &mut buf),
            Err(WireError::TooLong(0xFFFF - 27))
        );
        assert!(matches!(
            ctx.emit_headers(10, &mut buf[..27]),
            Err(WireError::Truncated { need: 28, have: 27 })
        ));
        let v6 = IpContext::v6(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST, 0xC000);
        let mut buf = [0; MAX_HEADERS_LEN];
        assert_eq!(v6.emit_headers(0xFFFF - 8, &mut buf), Ok(48));
        assert_eq!(&buf[..8], &[0x60, 0, 0, 0, 0xFF, 0xFF, 0x11, 0x40]);
        assert!(v6.emit_headers(0xFFFF - 7, &mut buf).is_err());
    }

    #[test]
    fn sport_example() {
        assert_eq!(udp_sport(0x11, 0x12), 0xC132);
        assert_eq!(udp_sport(0x12, 0x11), 0xC132);
        assert!(udp_sport(0xFF_FFFF, 0xFF_FFFE) >= 0xC000);
    }

    /// RFC 791: the one's-complement sum of the whole IPv4 header, checksum included, is
    /// 0xFFFF. The idents make the sum of the other words exactly 0xFFFF (checksum 0), and
    /// need two end-around carries (checksum 0xFFFE).
    #[test]
    fn ipv4_checksum_folds_every_carry() {
        let rows = [
            (Ipv4Addr::UNSPECIFIED, 0x3AD2, [0x00, 0x00]),
            (Ipv4Addr::BROADCAST, 0x3AD3, [0xFF, 0xFE]),
        ];
        for (addr, ident, csum) in rows {
            let ctx = IpContext {
                addrs: IpAddrs::V4 {
                    src: addr,
                    dst: addr,
                    ident,
                },
                src_port: 0xC000,
                dst_port: ROCE_V2_UDP_PORT,
            };
            let mut buf = [0; 28];
            assert_eq!(ctx.emit_headers(0, &mut buf), Ok(28));
            assert_eq!(buf[10..12], csum, "{addr} ident {ident:#06x}");
            let mut sum: u32 = buf[..20]
                .chunks(2)
                .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
                .sum();
            sum = (sum & 0xFFFF) + (sum >> 16);
            sum = (sum & 0xFFFF) + (sum >> 16);
            assert_eq!(sum, 0xFFFF, "{addr} ident {ident:#06x}");
        }
    }

    /// rc-transport.md §1.1: IPv6 version 6, traffic class and flow label 0, payload length
    /// 8 + UDP payload, next header 17, hop limit 64, then UDP with checksum 0.
    #[test]
    fn ipv6_headers_layout() {
        let src = Ipv6Addr::new(0xFE80, 0, 0, 0, 0, 0, 0, 1);
        let dst = Ipv6Addr::new(0xFE80, 0, 0, 0, 0, 0, 0, 2);
        let ctx = IpContext::v6(src, dst, 0xC132);
        assert_eq!(ctx.headers_len(), MAX_HEADERS_LEN);
        assert_eq!(MAX_HEADERS_LEN, 48);
        let mut buf = [0xAA; 64];
        assert_eq!(ctx.emit_headers(32, &mut buf), Ok(48));
        assert_eq!(buf[..8], [0x60, 0, 0, 0, 0x00, 0x28, 0x11, 0x40]);
        assert_eq!(buf[8..24], src.octets());
        assert_eq!(buf[24..40], dst.octets());
        assert_eq!(buf[40..48], [0xC1, 0x32, 0x12, 0xB7, 0x00, 0x28, 0, 0]);
        assert_eq!(buf[48..], [0xAA; 16], "nothing written past the headers");
        let v4 = IpContext::v4(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 0xC132);
        assert_eq!(v4.headers_len(), 28);
    }

    #[test]
    fn context_between_two_sockets() {
        let a4: SocketAddr = "10.0.0.1:49152".parse().unwrap();
        let b4: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let a6: SocketAddr = "[fe80::1]:50000".parse().unwrap();
        let b6: SocketAddr = "[fe80::2]:4791".parse().unwrap();
        assert_eq!(
            IpContext::between(a4, b4),
            Some(IpContext::v4(
                Ipv4Addr::new(10, 0, 0, 1),
                Ipv4Addr::new(10, 0, 0, 2),
                49152
            ))
        );
        let v6 = IpContext::between(b6, a6).unwrap();
        assert_eq!(
            v6.addrs,
            IpAddrs::V6 {
                src: "fe80::2".parse().unwrap(),
                dst: "fe80::1".parse().unwrap()
            }
        );
        assert_eq!((v6.src_port, v6.dst_port), (4791, 50000));
        assert_eq!(IpContext::between(a4, b6), None);
        assert_eq!(IpContext::between(a6, b4), None);
    }

    /// rc-transport.md §1.9 with flow label 0, for QPN products that reach the `>> 20` and
    /// `>> 40` folds (values from the formula there).
    #[test]
    fn sport_folds_high_bits() {
        for (l, r, sport) in [
            (0x1234, 0x5678, 0xC01A),
            (0xAB_CDEF, 0x12_3456, 0xC3C8),
            (0xFF_FFFF, 0xFF_FFFE, 0xFF12),
        ] {
            assert_eq!(udp_sport(l, r), sport, "{l:#x} x {r:#x}");
            assert_eq!(udp_sport(r, l), sport, "{r:#x} x {l:#x}");
        }
    }
}
