//! Emitting one packet into the caller's transmit buffer with its payload copied straight from
//! MR memory (one copy), then pad and ICRC.

use std::net::{IpAddr, SocketAddr};

use crate::memory::MemoryFault;
use crate::wire::icrc::{check_icrc_from_prefix, fill_icrc_from_prefix, icrc_prefix};
use crate::wire::{BTH_LEN, Bth, ICRC_LEN, IpAddrs, IpContext, PacketRepr, WireError, pad_len};

/// The largest RoCEv2 UDP payload the engine emits: a 4096-byte MTU payload plus the largest
/// header set and the ICRC.
pub(crate) const MAX_PACKET_LEN: usize = 4096 + 64;

/// What kind of packet the engine emitted, as the transport layer sees it (IBTA 9.2, 9.7):
/// drivers use it to schedule packets without parsing them (e.g. to hold back bare ACKs).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum PacketClass {
    /// A request from the requester: SEND, RDMA WRITE, RDMA READ request or atomic.
    Request,
    /// A response that carries data from the responder: an RDMA READ response or an ATOMIC
    /// ACKNOWLEDGE.
    Response,
    /// A bare ACKNOWLEDGE from the responder: an ACK, a NAK or an RNR NAK (rxe's
    /// `IB_OPCODE_RC_ACKNOWLEDGE`).
    Ack,
}

/// Why a packet could not be built.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum TxError {
    /// The codec refused the headers or the buffer is too small.
    Wire(WireError),
    /// Reading the payload from memory failed.
    Memory,
    /// Source and destination are of different IP versions.
    AddressFamily,
}

impl From<WireError> for TxError {
    fn from(e: WireError) -> TxError {
        TxError::Wire(e)
    }
}

impl From<MemoryFault> for TxError {
    fn from(_: MemoryFault) -> TxError {
        TxError::Memory
    }
}

/// The IP context of a packet from `src` to `dst:dst_port`, from UDP port `src_port`
/// (what [`IpContext::between`] gives for the two socket addresses, without building them).
pub(crate) fn ip_context(
    src: IpAddr,
    dst: IpAddr,
    src_port: u16,
    dst_port: u16,
) -> Result<IpContext, TxError> {
    let addrs = match (src, dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => IpAddrs::V4 { src, dst, ident: 0 },
        (IpAddr::V6(src), IpAddr::V6(dst)) => IpAddrs::V6 { src, dst },
        _ => return Err(TxError::AddressFamily),
    };
    Ok(IpContext {
        addrs,
        src_port,
        dst_port,
    })
}

/// What the packets of one path share from one packet to the next: the IP context and the
/// CRC of the ICRC's invariant IP/UDP prefix for the last UDP payload lengths seen (a QP's
/// packets come in a few lengths: full-MTU segments, its ACKs, its small messages). Each QP
/// keeps one for the packets it sends, the HCA one for the last path it received from. Set up
/// by [`PathTemplate::prepare`] before a packet is built or checked, which rebuilds it when the
/// path (source address and UDP port, destination address, UDP destination port) is not the
/// one it was built for. A pure cache: the ICRCs are those [`crate::wire::fill_icrc`] writes
/// and [`crate::wire::check_icrc`] checks.
#[derive(Clone, Default)]
pub(crate) struct PathTemplate {
    /// The path and its context.
    path: Option<(SocketAddr, IpAddr, u16, IpContext)>,
    /// `(UDP payload length, prefix CRC)` on that path; replaced round-robin.
    prefixes: [Option<(usize, u32)>; PREFIXES],
    next: usize,
}

/// Prefix CRCs a [`PathTemplate`] keeps.
const PREFIXES: usize = 2;

impl std::fmt::Debug for PathTemplate {
    /// Only the name: a cache, not QP state (`Hca::canonical_state` prints QPs with `Debug`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PathTemplate")
    }
}

impl PathTemplate {
    /// Makes the template that of the path from `src` to `dst:dst_port`; the IP context is
    /// [`ip_context`]'s ([`PathTemplate::ip`]). Errors: [`TxError::AddressFamily`].
    pub(crate) fn prepare(
        &mut self,
        src: SocketAddr,
        dst: IpAddr,
        dst_port: u16,
    ) -> Result<(), TxError> {
        let same =
            matches!(&self.path, Some((s, d, p, _)) if *s == src && *d == dst && *p == dst_port);
        if !same {
            let ip = ip_context(src.ip(), dst, src.port(), dst_port)?;
            *self = PathTemplate {
                path: Some((src, dst, dst_port, ip)),
                ..PathTemplate::default()
            };
        }
        Ok(())
    }

    /// The IP context of the prepared path. Errors: [`TxError::AddressFamily`] if none is.
    pub(crate) fn ip(&self) -> Result<&IpContext, TxError> {
        self.path
            .as_ref()
            .map(|(.., ip)| ip)
            .ok_or(TxError::AddressFamily)
    }

    /// The prefix CRC of a `len`-byte UDP payload on the prepared path.
    fn prefix(&mut self, len: usize) -> Result<u32, WireError> {
        if let Some(&(_, crc)) = self.prefixes.iter().flatten().find(|(l, _)| *l == len) {
            return Ok(crc);
        }
        let ip = self.ip().map_err(|_| WireError::BadIpHeader(0))?;
        let crc = icrc_prefix(ip, len)?;
        if let Some(slot) = self.prefixes.get_mut(self.next) {
            *slot = Some((len, crc));
        }
        self.next = (self.next + 1) % PREFIXES;
        Ok(crc)
    }

    /// Writes the ICRC of `udp_payload` sent on the prepared path.
    pub(crate) fn fill_icrc(&mut self, udp_payload: &mut [u8]) -> Result<(), TxError> {
        let prefix = self.prefix(udp_payload.len())?;
        fill_icrc_from_prefix(prefix, udp_payload)?;
        Ok(())
    }

    /// [`crate::wire::check_icrc`] of `udp_payload` received on the prepared path.
    pub(crate) fn check_icrc(&mut self, udp_payload: &[u8]) -> Result<(), WireError> {
        let prefix = self.prefix(udp_payload.len())?;
        check_icrc_from_prefix(prefix, udp_payload)
    }
}

/// Writes `hdrs` (whose `payload` must be empty) followed by `payload_len` bytes produced by
/// `fill`, the pad and the ICRC for the path `tpl` was prepared for into `buf`; returns the UDP
/// payload length.
pub(crate) fn emit(
    hdrs: &PacketRepr<'_>,
    payload_len: usize,
    tpl: &mut PathTemplate,
    buf: &mut [u8],
    fill: impl FnOnce(&mut [u8]) -> Result<(), MemoryFault>,
) -> Result<usize, TxError> {
    emit_as(hdrs, 0, payload_len, tpl, buf, fill)
}

/// [`emit`] for the transport whose opcode bits (the BTH opcode's top three bits, IBTA 9.2.1:
/// 0x00 RC, 0x20 UC) are `transport`: `hdrs` carries the RC opcode of the same operation,
/// whose layout every connected transport shares, and the byte is set before the ICRC.
pub(crate) fn emit_as(
    hdrs: &PacketRepr<'_>,
    transport: u8,
    payload_len: usize,
    tpl: &mut PathTemplate,
    buf: &mut [u8],
    fill: impl FnOnce(&mut [u8]) -> Result<(), MemoryFault>,
) -> Result<usize, TxError> {
    let pad = pad_len(payload_len);
    let hdr_len = hdrs.emit_headers(buf)?;
    if let Some(opcode) = buf.first_mut() {
        *opcode |= transport;
    }
    let total = hdr_len + payload_len + usize::from(pad) + ICRC_LEN;
    let have = buf.len();
    let out = buf
        .get_mut(..total)
        .ok_or(WireError::Truncated { need: total, have })?;
    Bth::new_unchecked(&mut out[..BTH_LEN]).set_pad_count(pad);
    fill(&mut out[hdr_len..hdr_len + payload_len])?;
    // The pad (0-3 bytes) zeroed as one 4-byte store that runs into the ICRC's place, which
    // is written next: not a `memset` call of the pad's length.
    let pad_at = hdr_len + payload_len;
    out[pad_at..pad_at + ICRC_LEN].fill(0);
    tpl.fill_icrc(out)?;
    Ok(total)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// `ip_context` gives what `IpContext::between` gives for the two socket addresses, in both
    /// address families, and refuses a path that mixes them.
    #[test]
    fn ip_context_is_between_without_socket_addresses() {
        let paths = [
            ("10.0.0.1:49152", "10.0.0.2:4791"),
            ("[fd00::1]:49152", "[fd00::2]:4791"),
        ];
        for (src, dst) in paths {
            let (src, dst): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
            let got = ip_context(src.ip(), dst.ip(), src.port(), dst.port()).ok();
            assert_eq!(got, IpContext::between(src, dst), "{src} -> {dst}");
            assert!(got.is_some());
        }
        let mixed = ip_context(
            "10.0.0.1".parse().unwrap(),
            "fd00::2".parse().unwrap(),
            1,
            2,
        );
        assert!(matches!(mixed, Err(TxError::AddressFamily)));
    }

    /// A template prints as its name only, so `Hca::canonical_state` holds no cache.
    #[test]
    fn a_template_prints_as_its_name() {
        let mut tpl = PathTemplate::default();
        let src: SocketAddr = "10.0.0.1:49152".parse().unwrap();
        assert!(tpl.prepare(src, "10.0.0.2".parse().unwrap(), 4791).is_ok());
        assert_eq!(format!("{tpl:?}"), "PathTemplate");
    }
}
