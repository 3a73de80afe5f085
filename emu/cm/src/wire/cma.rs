//! The rdma_cm private-data header (`cma_hdr`, 36 bytes) that librdmacm and the kernel's CMA
//! put first in a REQ's private data on IP port spaces: version, IP version, the source port
//! and the source and destination addresses (an IPv4 address in the last 4 of 16 bytes).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The header's length: the REQ leaves 92 − 36 = 56 bytes to the user.
pub const CMA_HDR_LEN: usize = 36;
/// The only CMA header version.
pub const CMA_VERSION: u8 = 0x00;

/// The parsed CMA header.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct CmaHdrRepr {
    /// Header version (0).
    pub cma_version: u8,
    /// IP version (the high nibble of byte 1: 4 or 6; any value decodes).
    pub ip_version: u8,
    /// The active side's port.
    pub src_port: u16,
    /// The active side's address (16 bytes as on the wire).
    pub src_addr: [u8; 16],
    /// The passive side's address (16 bytes as on the wire).
    pub dst_addr: [u8; 16],
}

impl CmaHdrRepr {
    /// The header of an IPv4 or IPv6 connection from `src`:`src_port` to `dst` (both of the
    /// same family; a mixed pair is written as IPv6 with a mapped IPv4 address).
    pub fn new(src: IpAddr, src_port: u16, dst: IpAddr) -> Self {
        let v4 = src.is_ipv4() && dst.is_ipv4();
        CmaHdrRepr {
            cma_version: CMA_VERSION,
            ip_version: if v4 { 4 } else { 6 },
            src_port,
            src_addr: addr_bytes(src, v4),
            dst_addr: addr_bytes(dst, v4),
        }
    }

    /// Parses the first 36 bytes of private data; `None` if shorter.
    pub fn parse(pd: &[u8]) -> Option<Self> {
        let b = pd.get(..CMA_HDR_LEN)?;
        let mut src_addr = [0u8; 16];
        let mut dst_addr = [0u8; 16];
        src_addr.copy_from_slice(&b[4..20]);
        dst_addr.copy_from_slice(&b[20..36]);
        Some(CmaHdrRepr {
            cma_version: b[0],
            ip_version: b[1] >> 4,
            src_port: u16::from_be_bytes([b[2], b[3]]),
            src_addr,
            dst_addr,
        })
    }

    /// Writes the 36 bytes at the start of `pd`; `None` if `pd` is shorter.
    pub fn emit(&self, pd: &mut [u8]) -> Option<()> {
        let b = pd.get_mut(..CMA_HDR_LEN)?;
        b[0] = self.cma_version;
        b[1] = self.ip_version << 4;
        b[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        b[4..20].copy_from_slice(&self.src_addr);
        b[20..36].copy_from_slice(&self.dst_addr);
        Some(())
    }

    /// The source address by IP version (`None` for versions other than 4 and 6).
    pub fn src_ip(&self) -> Option<IpAddr> {
        ip_of(self.ip_version, &self.src_addr)
    }

    /// The destination address by IP version (`None` for versions other than 4 and 6).
    pub fn dst_ip(&self) -> Option<IpAddr> {
        ip_of(self.ip_version, &self.dst_addr)
    }
}

fn addr_bytes(ip: IpAddr, v4: bool) -> [u8; 16] {
    let mut out = [0u8; 16];
    match ip {
        IpAddr::V4(a) if v4 => out[12..].copy_from_slice(&a.octets()),
        IpAddr::V4(a) => out = a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => out = a.octets(),
    }
    out
}

fn ip_of(version: u8, b: &[u8; 16]) -> Option<IpAddr> {
    match version {
        4 => Some(IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))),
        6 => Some(IpAddr::V6(Ipv6Addr::from(*b))),
        _ => None,
    }
}
