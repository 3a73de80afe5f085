//! The RoCEv2 invariant CRC (rc-transport.md §1.8).
//!
//! The ICRC is the zlib/Ethernet CRC-32 (reflected 0xEDB88320, init all ones, final NOT; computed
//! with `crc32fast`, never CRC-32C) over the pseudo-packet
//!
//! `0xFF × 8 ‖ IP header ‖ UDP header ‖ BTH ‖ extension headers ‖ payload ‖ pad`
//!
//! with these fields replaced by all ones: IPv4 TOS, TTL and header checksum; IPv6 traffic class,
//! flow label and hop limit; the UDP checksum; BTH byte 4 (FECN, BECN, Resv6). Everything else is
//! covered as-is, including the IPv4 total length, identification and flags, the UDP ports and
//! length, BTH Resv7 and the PSN. The 32-bit result is stored **little-endian** in the last four
//! bytes of the UDP payload (`crc.to_le_bytes()`).
//!
//! Since the IP/UDP headers are not part of the bytes this codec sees, [`compute_icrc`] rebuilds
//! them from an [`IpContext`] with the sender-side values documented in [`super::ip`] (notably
//! IPv4 identification = `ident`, DF set, no options). A peer whose headers differ in a covered
//! field needs [`icrc_over_headers`] with its real headers; for the one such field a UDP receiver
//! cannot see, the IPv4 identification that rxe and NICs set, [`solve_ipv4_ident`] checks the
//! ICRC up to that unknown field (§1.8 addendum).
//!
//! The CRC of the invariant prefix (`0xFF × 8 ‖ IP header ‖ UDP header`, masked) depends only
//! on the [`IpContext`] and the UDP payload length; [`compute_icrc`] keeps it in a small
//! per-thread cache and resumes the CRC from it, so a packet costs the CRC of its BTH onwards.
//!
//! Fuzzing: when compiled with `cfg(fuzzing)`, [`check_icrc`] accepts every ICRC so that fuzzers
//! reach the code behind it. [`compute_icrc`] and [`fill_icrc`] are unaffected.

use crc32fast::Hasher;

use core::net::Ipv4Addr;

use super::ip::{IPV4_HEADER_LEN, IPV6_HEADER_LEN, MAX_HEADERS_LEN, UDP_HEADER_LEN};
use super::{BTH_LEN, IpAddrs, IpContext, WireError, read};

/// ICRC length in bytes.
pub const ICRC_LEN: usize = 4;

/// Bytes of 0xFF standing in for the absent LRH.
const LRH_STAND_IN: usize = 8;
/// Offset of the masked BTH byte (FECN, BECN, Resv6).
const BTH_MASKED_BYTE: usize = 4;

/// Computes the ICRC of a RoCEv2 UDP payload (BTH through the 4 ICRC bytes, which are
/// excluded), given the IP and UDP headers exactly as on the wire: a 20-byte IPv4 header (IHL 5)
/// or a 40-byte IPv6 header, followed by the 8-byte UDP header. Masking is applied here.
/// Errors: [`WireError::Truncated`] if `udp_payload` is shorter than BTH + ICRC or `headers` is
/// short, [`WireError::BadIpHeader`] for other IP versions or IPv4 options.
pub fn icrc_over_headers(headers: &[u8], udp_payload: &[u8]) -> Result<u32, WireError> {
    check_payload_len(udp_payload)?;
    let prefix = prefix_crc(headers)?;
    Ok(crc_from_prefix(prefix, udp_payload))
}

/// [`WireError::Truncated`] unless `udp_payload` holds at least a BTH and an ICRC.
fn check_payload_len(udp_payload: &[u8]) -> Result<(), WireError> {
    let min = BTH_LEN + ICRC_LEN;
    if udp_payload.len() < min {
        return Err(WireError::Truncated {
            need: min,
            have: udp_payload.len(),
        });
    }
    Ok(())
}

/// The CRC (as [`Hasher::finalize`] returns it, so that it can be resumed) of the invariant
/// prefix `0xFF × 8 ‖ masked IP header ‖ masked UDP header`, from the headers on the wire.
fn prefix_crc(headers: &[u8]) -> Result<u32, WireError> {
    let first = *headers.first().ok_or(WireError::Truncated {
        need: IPV4_HEADER_LEN + UDP_HEADER_LEN,
        have: 0,
    })?;
    let ip_len = match first {
        0x45 => IPV4_HEADER_LEN,
        _ if first >> 4 == 6 => IPV6_HEADER_LEN,
        _ => return Err(WireError::BadIpHeader(first)),
    };
    let len = ip_len + UDP_HEADER_LEN;
    let src = headers.get(..len).ok_or(WireError::Truncated {
        need: len,
        have: headers.len(),
    })?;
    let mut pseudo = [0xFF; LRH_STAND_IN + MAX_HEADERS_LEN];
    let ip_udp = &mut pseudo[LRH_STAND_IN..LRH_STAND_IN + len];
    ip_udp.copy_from_slice(src);
    if ip_len == IPV4_HEADER_LEN {
        ip_udp[1] = 0xFF; // TOS
        ip_udp[8] = 0xFF; // TTL
        ip_udp[10..12].fill(0xFF); // header checksum
    } else {
        ip_udp[0] |= 0x0F; // traffic class, high nibble
        ip_udp[1..4].fill(0xFF); // traffic class, low nibble + flow label
        ip_udp[7] = 0xFF; // hop limit
    }
    ip_udp[ip_len + 6..].fill(0xFF); // UDP checksum
    let mut h = Hasher::new();
    h.update(&pseudo[..LRH_STAND_IN + len]);
    Ok(h.finalize())
}

/// Resumes the CRC of the invariant prefix (`prefix`, from [`prefix_crc`]) over the masked
/// BTH and the rest of `udp_payload` up to its ICRC. `udp_payload` holds at least BTH + ICRC
/// bytes ([`check_payload_len`]).
fn crc_from_prefix(prefix: u32, udp_payload: &[u8]) -> u32 {
    let mut word = [0; 8];
    word.copy_from_slice(&udp_payload[..8]);
    word[BTH_MASKED_BYTE] = 0xFF; // FECN, BECN, Resv6
    let crc = small::word(!prefix, u64::from_le_bytes(word));
    let rest = &udp_payload[8..udp_payload.len() - ICRC_LEN];
    if rest.len() < small::LONG {
        !small::update(crc, rest)
    } else {
        let mut h = Hasher::new_with_initial(!crc);
        h.update(rest);
        h.finalize()
    }
}

/// The same CRC-32 as `crc32fast`, slice-by-8 over a table built at compile time: for the
/// short runs of a packet (headers, small payloads), where `crc32fast`'s set-up per call costs
/// more than the bytes. States here are the running register (not inverted).
mod small {
    /// From this many bytes on, `crc32fast` (carry-less multiply) is faster.
    pub(super) const LONG: usize = 128;

    const POLY: u32 = 0xEDB8_8320;

    static TABLE: [[u32; 256]; 8] = table();

    const fn table() -> [[u32; 256]; 8] {
        let mut t = [[0u32; 256]; 8];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
                k += 1;
            }
            t[0][i] = c;
            i += 1;
        }
        let mut j = 1;
        while j < 8 {
            let mut i = 0;
            while i < 256 {
                let prev = t[j - 1][i];
                t[j][i] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
                i += 1;
            }
            j += 1;
        }
        t
    }

    /// Runs the register `crc` over 8 bytes given as a little-endian word.
    pub(super) fn word(crc: u32, w: u64) -> u32 {
        let x = w ^ u64::from(crc);
        let b = |k: u32| ((x >> (8 * k)) & 0xFF) as usize;
        TABLE[7][b(0)]
            ^ TABLE[6][b(1)]
            ^ TABLE[5][b(2)]
            ^ TABLE[4][b(3)]
            ^ TABLE[3][b(4)]
            ^ TABLE[2][b(5)]
            ^ TABLE[1][b(6)]
            ^ TABLE[0][b(7)]
    }

    /// Runs the register `crc` over `bytes`.
    pub(super) fn update(mut crc: u32, bytes: &[u8]) -> u32 {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0; 8];
            w.copy_from_slice(c);
            crc = word(crc, u64::from_le_bytes(w));
        }
        let mut rest = chunks.remainder();
        // Packets are padded to 4 bytes: a 4-byte step (slice-by-4) before single bytes.
        if let Some((four, tail)) = rest.split_first_chunk::<4>() {
            let x = crc ^ u32::from_le_bytes(*four);
            let b = |k: u32| ((x >> (8 * k)) & 0xFF) as usize;
            crc = TABLE[3][b(0)] ^ TABLE[2][b(1)] ^ TABLE[1][b(2)] ^ TABLE[0][b(3)];
            rest = tail;
        }
        for &b in rest {
            crc = TABLE[0][((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
        }
        crc
    }
}

/// Prefix CRCs remembered per thread, by (context, UDP payload length): a connection's
/// packets share a handful of lengths, so the IP/UDP headers are rebuilt and hashed once per
/// (path, length) instead of once per packet. A pure cache: a miss computes the same value.
mod prefix_cache {
    use core::cell::RefCell;

    use super::IpContext;

    /// Entries kept; replaced round-robin.
    const SLOTS: usize = 4;

    /// A UDP payload length, its context and the prefix CRC.
    type Entry = Option<(usize, IpContext, u32)>;

    /// The entries and the next one to replace.
    struct Slots {
        entries: [Entry; SLOTS],
        next: usize,
    }

    thread_local! {
        // Compared in place (a `Cell` per entry would copy each one out to look at it).
        static CACHE: RefCell<Slots> = const {
            RefCell::new(Slots {
                entries: [None; SLOTS],
                next: 0,
            })
        };
    }

    /// The cached prefix CRC for `ip` and a `len`-byte UDP payload, if any.
    pub(super) fn get(ip: &IpContext, len: usize) -> Option<u32> {
        CACHE.with_borrow(|c| {
            c.entries.iter().find_map(|slot| match slot {
                Some((l, c, crc)) if *l == len && c == ip => Some(*crc),
                _ => None,
            })
        })
    }

    /// Remembers `crc` for `ip` and `len`, evicting the oldest entry.
    pub(super) fn put(ip: &IpContext, len: usize, crc: u32) {
        CACHE.with_borrow_mut(|c| {
            let at = c.next;
            c.next = (at + 1) % SLOTS;
            if let Some(slot) = c.entries.get_mut(at) {
                *slot = Some((len, *ip, crc));
            }
        });
    }
}

/// Computes the ICRC of `udp_payload` (BTH through the ICRC bytes, which are excluded) as sent
/// with the IP/UDP headers [`IpContext::emit_headers`] produces.
/// Errors: as [`icrc_over_headers`], plus [`WireError::TooLong`].
pub fn compute_icrc(ip: &IpContext, udp_payload: &[u8]) -> Result<u32, WireError> {
    check_payload_len(udp_payload)?;
    let len = udp_payload.len();
    let prefix = icrc_prefix(ip, len)?;
    Ok(crc_from_prefix(prefix, udp_payload))
}

/// The CRC of the ICRC's invariant prefix (`0xFF × 8 ‖ masked IP header ‖ masked UDP header`)
/// of a packet with a `udp_payload_len`-byte UDP payload sent with `ip`: it depends on nothing
/// else, so a sender may keep it per path and length and finish each packet's ICRC with
/// [`fill_icrc_from_prefix`]. Errors: [`WireError::TooLong`].
/// Kept in a small per-thread cache by (context, length).
pub(crate) fn icrc_prefix(ip: &IpContext, udp_payload_len: usize) -> Result<u32, WireError> {
    if let Some(crc) = prefix_cache::get(ip, udp_payload_len) {
        return Ok(crc);
    }
    let mut headers = [0; MAX_HEADERS_LEN];
    // The header checksum is masked by the ICRC: no need to compute it.
    let n = ip.write_headers(udp_payload_len, &mut headers, false)?;
    let crc = prefix_crc(&headers[..n])?;
    prefix_cache::put(ip, udp_payload_len, crc);
    Ok(crc)
}

/// [`check_icrc`] with the prefix CRC [`icrc_prefix`] gave for this packet's context and length
/// (the caller's to match). Errors: [`WireError::Truncated`] below BTH + ICRC bytes,
/// [`WireError::BadIcrc`]; under `cfg(fuzzing)` a mismatch is accepted.
#[allow(unexpected_cfgs)] // `fuzzing` is set by cargo-fuzz.
pub(crate) fn check_icrc_from_prefix(prefix: u32, udp_payload: &[u8]) -> Result<(), WireError> {
    check_payload_len(udp_payload)?;
    let computed = crc_from_prefix(prefix, udp_payload);
    let stored = u32::from_le_bytes(read(udp_payload, udp_payload.len() - ICRC_LEN));
    if stored == computed || cfg!(fuzzing) {
        Ok(())
    } else {
        Err(WireError::BadIcrc { computed, stored })
    }
}

/// [`fill_icrc`] with the prefix CRC [`icrc_prefix`] gave for this packet's context and length
/// (the caller's to match). Errors: [`WireError::Truncated`] below BTH + ICRC bytes.
pub(crate) fn fill_icrc_from_prefix(prefix: u32, udp_payload: &mut [u8]) -> Result<(), WireError> {
    check_payload_len(udp_payload)?;
    let crc = crc_from_prefix(prefix, udp_payload);
    let at = udp_payload.len() - ICRC_LEN;
    udp_payload[at..].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Computes the ICRC and stores it little-endian in the last 4 bytes of `udp_payload`.
pub fn fill_icrc(ip: &IpContext, udp_payload: &mut [u8]) -> Result<(), WireError> {
    let crc = compute_icrc(ip, udp_payload)?;
    let at = udp_payload.len() - ICRC_LEN;
    udp_payload[at..].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// `Ok` if the stored ICRC matches [`compute_icrc`], else [`WireError::BadIcrc`] (or the
/// errors of [`compute_icrc`]). Under `cfg(fuzzing)` a mismatch is accepted.
#[allow(unexpected_cfgs)] // `fuzzing` is set by cargo-fuzz.
pub fn check_icrc(ip: &IpContext, udp_payload: &[u8]) -> Result<(), WireError> {
    let computed = compute_icrc(ip, udp_payload)?;
    // compute_icrc succeeded, so at least BTH + ICRC bytes are present.
    let stored = u32::from_le_bytes(read(udp_payload, udp_payload.len() - ICRC_LEN));
    if stored == computed || cfg!(fuzzing) {
        Ok(())
    } else {
        Err(WireError::BadIcrc { computed, stored })
    }
}

/// How the ICRC of an IPv4 RoCEv2 packet whose UDP payload is `udp_payload_len` bytes long
/// depends on its IPv4 identification: setting bit `k` of the identification flips the ICRC
/// bits `basis[k]`. CRC-32 is affine, so this does not depend on any other byte of the packet,
/// only on the length. Errors: as [`compute_icrc`] (`udp_payload_len` below BTH + ICRC).
pub fn ipv4_ident_basis(udp_payload_len: usize) -> Result<[u32; 16], WireError> {
    let zeros = vec![0u8; udp_payload_len];
    let at = |ident: u16| {
        let ip = IpContext {
            addrs: IpAddrs::V4 {
                src: Ipv4Addr::UNSPECIFIED,
                dst: Ipv4Addr::UNSPECIFIED,
                ident,
            },
            src_port: 0,
            dst_port: 0,
        };
        compute_icrc(&ip, &zeros)
    };
    let base = at(0)?;
    let mut basis = [0u32; 16];
    for (k, b) in basis.iter_mut().enumerate() {
        *b = at(1 << k)? ^ base;
    }
    Ok(basis)
}

/// For an IPv4 packet from a sender whose IPv4 identification is unknown (Linux rxe and NICs
/// number their datagrams; a UDP socket cannot see the field, yet the ICRC covers it:
/// rc-transport.md §1.8 addendum): the identification that makes the stored ICRC of
/// `udp_payload` match, if there is one, given `ip` (its own `ident` is ignored) and the
/// [`ipv4_ident_basis`] of the payload's length. `Ok(None)` means no identification explains
/// the ICRC: the packet is corrupt. A random corruption still fails this check with
/// probability 1 − 2⁻¹⁶ (16 of the ICRC's 32 bits are spent on the unknown field).
/// Errors: as [`compute_icrc`]; [`WireError::BadIpHeader`] (0x60) for an IPv6 context, which
/// has no identification.
pub fn solve_ipv4_ident(
    ip: &IpContext,
    udp_payload: &[u8],
    basis: &[u32; 16],
) -> Result<Option<u16>, WireError> {
    let IpAddrs::V4 { src, dst, .. } = ip.addrs else {
        return Err(WireError::BadIpHeader(0x60));
    };
    let with = |ident: u16| IpContext {
        addrs: IpAddrs::V4 { src, dst, ident },
        ..*ip
    };
    let computed = compute_icrc(&with(0), udp_payload)?;
    // compute_icrc succeeded, so at least BTH + ICRC bytes are present.
    let stored = u32::from_le_bytes(read(udp_payload, udp_payload.len() - ICRC_LEN));
    // Gaussian elimination over GF(2): pivots by highest set bit, each with the combination of
    // identification bits that produced it.
    let mut pivots = [(0u32, 0u16); 32];
    for (k, &b) in basis.iter().enumerate() {
        let (mut v, mut bits) = (b, 1u16 << k);
        while v != 0 {
            let top = (31 - v.leading_zeros()) as usize;
            if pivots[top].0 == 0 {
                pivots[top] = (v, bits);
                break;
            }
            v ^= pivots[top].0;
            bits ^= pivots[top].1;
        }
    }
    let (mut v, mut ident) = (computed ^ stored, 0u16);
    while v != 0 {
        let top = (31 - v.leading_zeros()) as usize;
        if pivots[top].0 == 0 {
            return Ok(None);
        }
        v ^= pivots[top].0;
        ident ^= pivots[top].1;
    }
    // Confirm with the real computation (guards the algebra, costs one CRC).
    Ok((compute_icrc(&with(ident), udp_payload)? == stored).then_some(ident))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use core::net::Ipv6Addr;

    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Real CNP from a ConnectX-4 Lx (rc-transport.md §1.8, first vector).
    const CNP_HEADERS: &str = "45c2003c 718c4000 40119161 0a001101 0a001201  0000 12b7 0028 0000";
    const CNP_PAYLOAD: &str = "81 00 ffff 40 000118 00 000000  00000000000000000000000000000000";
    /// Synthetic UC SEND_ONLY (rc-transport.md §1.8, second vector).
    const UC_HEADERS: &str = "45010040 04784000 4011b4d5 c0a80007 c0a80007  c000 12b7 002c aca2";
    const UC_PAYLOAD: &str =
        "24 60 ffff 00 0000d3 00 cf1710  4630818be28935d90e9a95505401be885e500000";

    fn with_icrc(payload: &str, icrc: [u8; 4]) -> Vec<u8> {
        let mut p = hex(payload);
        p.extend_from_slice(&icrc);
        p
    }

    #[test]
    fn published_vectors_from_wire_headers() {
        let cnp = with_icrc(CNP_PAYLOAD, [0x82, 0xFD, 0x00, 0x2A]);
        assert_eq!(icrc_over_headers(&hex(CNP_HEADERS), &cnp), Ok(0x2A00_FD82));
        let uc = with_icrc(UC_PAYLOAD, [0x78, 0xF3, 0x53, 0xF3]);
        assert_eq!(
            icrc_over_headers(&hex(UC_HEADERS), &uc).map(u32::to_le_bytes),
            Ok([0x78, 0xF3, 0x53, 0xF3])
        );
    }

    #[test]
    fn published_vectors_from_ip_context() {
        // The IpContext path rebuilds the headers; masked fields (TOS, TTL, checksums) differ
        // from the captured ones but must not matter.
        let cnp_ctx = IpContext {
            addrs: IpAddrs::V4 {
                src: Ipv4Addr::new(10, 0, 17, 1),
                dst: Ipv4Addr::new(10, 0, 18, 1),
                ident: 0x718C,
            },
            src_port: 0,
            dst_port: 4791,
        };
        let cnp = with_icrc(CNP_PAYLOAD, [0x82, 0xFD, 0x00, 0x2A]);
        assert_eq!(check_icrc(&cnp_ctx, &cnp), Ok(()));

        let uc_ctx = IpContext {
            addrs: IpAddrs::V4 {
                src: Ipv4Addr::new(192, 168, 0, 7),
                dst: Ipv4Addr::new(192, 168, 0, 7),
                ident: 0x0478,
            },
            src_port: 0xC000,
            dst_port: 4791,
        };
        let mut uc = with_icrc(UC_PAYLOAD, [0; 4]);
        fill_icrc(&uc_ctx, &mut uc).unwrap();
        assert_eq!(uc[uc.len() - 4..], [0x78, 0xF3, 0x53, 0xF3]);
        assert_eq!(check_icrc(&uc_ctx, &uc), Ok(()));

        // BTH byte 4 is masked; the PSN is not.
        uc[4] ^= 0xC0;
        assert_eq!(check_icrc(&uc_ctx, &uc), Ok(()));
        uc[11] ^= 0x01;
        assert!(matches!(
            check_icrc(&uc_ctx, &uc),
            Err(WireError::BadIcrc { .. })
        ));
    }

    #[test]
    fn ipv6_masks_traffic_class_flow_label_and_hop_limit() {
        let mut v6 = [0u8; 48];
        v6[0] = 0x60;
        v6[4..6].copy_from_slice(&(8u16 + 32).to_be_bytes());
        v6[6] = 0x11;
        v6[7] = 0x40;
        v6[23] = 1;
        v6[39] = 2;
        v6[42..44].copy_from_slice(&4791u16.to_be_bytes());
        let payload = with_icrc(CNP_PAYLOAD, [0; 4]);
        let a = icrc_over_headers(&v6, &payload).unwrap();
        let mut other = v6;
        other[0] = 0x6A;
        other[1..4].copy_from_slice(&[0x12, 0x34, 0x56]);
        other[7] = 1;
        other[46..48].copy_from_slice(&[0xAB, 0xCD]);
        assert_eq!(icrc_over_headers(&other, &payload), Ok(a));
        other[39] = 3;
        assert_ne!(icrc_over_headers(&other, &payload), Ok(a));
    }

    #[test]
    fn unknown_ipv4_ident_is_solved_and_corruption_still_caught() {
        let uc_ctx = |ident| IpContext {
            addrs: IpAddrs::V4 {
                src: Ipv4Addr::new(192, 168, 0, 7),
                dst: Ipv4Addr::new(192, 168, 0, 7),
                ident,
            },
            src_port: 0xC000,
            dst_port: 4791,
        };
        // The published UC vector was sealed with identification 0x0478.
        let uc = with_icrc(UC_PAYLOAD, [0x78, 0xF3, 0x53, 0xF3]);
        let basis = ipv4_ident_basis(uc.len()).unwrap();
        assert_eq!(solve_ipv4_ident(&uc_ctx(0), &uc, &basis), Ok(Some(0x0478)));
        // Every identification is recovered, for several lengths.
        for len in [16usize, 40, 1500, 4124] {
            let mut p = vec![0x5A; len];
            p[..12].copy_from_slice(&hex(UC_PAYLOAD)[..12]);
            let basis = ipv4_ident_basis(len).unwrap();
            for ident in [0u16, 1, 0x4936, 0x8000, 0xFFFF] {
                fill_icrc(&uc_ctx(ident), &mut p).unwrap();
                assert_eq!(
                    solve_ipv4_ident(&uc_ctx(0x1234), &p, &basis),
                    Ok(Some(ident)),
                    "len {len}"
                );
            }
        }
        // Any single flipped bit of the payload (past the masked BTH byte) is still caught.
        let mut caught = 0;
        let mut flipped = uc.clone();
        for bit in 8 * 5..8 * (uc.len() - ICRC_LEN) {
            flipped[bit / 8] ^= 1 << (bit % 8);
            if solve_ipv4_ident(&uc_ctx(0), &flipped, &basis) == Ok(None) {
                caught += 1;
            }
            flipped[bit / 8] ^= 1 << (bit % 8);
        }
        assert_eq!(
            caught,
            8 * (uc.len() - ICRC_LEN - 5),
            "every single-bit flip"
        );
        let v6 = IpContext::v6(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST, 1);
        assert!(solve_ipv4_ident(&v6, &uc, &basis).is_err());
        assert!(ipv4_ident_basis(3).is_err());
    }

    #[test]
    fn small_crc_matches_crc32fast() {
        let bytes: Vec<u8> = (0..600u32).map(|i| (i * 7 + i / 5) as u8).collect();
        for len in 0..bytes.len() {
            let mut h = Hasher::new_with_initial(0x1234_5678);
            h.update(&bytes[..len]);
            assert_eq!(!small::update(!0x1234_5678, &bytes[..len]), h.finalize());
        }
        for len in [16usize, 17, 20, 40, 135, 136, 137, 500] {
            let ctx = IpContext::v4(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 0xC000);
            let p = &bytes[..len];
            let mut headers = [0; MAX_HEADERS_LEN];
            let n = ctx.write_headers(len, &mut headers, true).unwrap();
            assert_eq!(compute_icrc(&ctx, p), icrc_over_headers(&headers[..n], p));
        }
    }

    #[test]
    fn bad_inputs() {
        let headers = hex(UC_HEADERS);
        let uc = with_icrc(UC_PAYLOAD, [0; 4]);
        assert!(matches!(
            icrc_over_headers(&headers, &uc[..15]),
            Err(WireError::Truncated { need: 16, .. })
        ));
        assert!(icrc_over_headers(&headers[..27], &uc).is_err());
        assert!(icrc_over_headers(&[], &uc).is_err());
        let mut opts = headers.clone();
        opts[0] = 0x46;
        assert_eq!(
            icrc_over_headers(&opts, &uc),
            Err(WireError::BadIpHeader(0x46))
        );
        let ctx = IpContext::v4(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 0xC000);
        assert!(check_icrc(&ctx, &uc[..3]).is_err());
    }

    /// CRC-32 (reflected 0xEDB88320, init and final NOT), bit by bit: a reference independent
    /// of both `crc32fast` and the table-driven `small` module.
    fn crc32_bitwise(bytes: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in bytes {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ 0xEDB8_8320
                } else {
                    c >> 1
                };
            }
        }
        !c
    }

    /// The ICRC as rc-transport.md §1.8 defines it, spelled out: CRC-32 over
    /// `0xFF × 8 ‖ IP header ‖ UDP header ‖ BTH ‖ rest` (ICRC excluded) with IPv4 TOS, TTL and
    /// header checksum (or IPv6 traffic class, flow label and hop limit), the UDP checksum and
    /// BTH byte 4 replaced by all ones.
    fn reference_icrc(headers: &[u8], udp_payload: &[u8]) -> u32 {
        let ip_len = if headers[0] == 0x45 { 20 } else { 40 };
        let mut ip_udp = headers[..ip_len + 8].to_vec();
        if ip_len == 20 {
            ip_udp[1] = 0xFF;
            ip_udp[8] = 0xFF;
            ip_udp[10] = 0xFF;
            ip_udp[11] = 0xFF;
        } else {
            ip_udp[0] |= 0x0F;
            ip_udp[1] = 0xFF;
            ip_udp[2] = 0xFF;
            ip_udp[3] = 0xFF;
            ip_udp[7] = 0xFF;
        }
        ip_udp[ip_len + 6] = 0xFF;
        ip_udp[ip_len + 7] = 0xFF;
        let mut pseudo = vec![0xFF; 8];
        pseudo.extend_from_slice(&ip_udp);
        let mut bth_on = udp_payload[..udp_payload.len() - 4].to_vec();
        bth_on[4] = 0xFF;
        pseudo.extend_from_slice(&bth_on);
        crc32_bitwise(&pseudo)
    }

    /// A UDP payload of `len` bytes with varied contents (no byte is 0xFF where masking
    /// would hide it).
    fn varied(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed) & 0x7F)
            .collect()
    }

    #[test]
    fn reference_crc_reproduces_the_published_vectors() {
        let cnp = with_icrc(CNP_PAYLOAD, [0; 4]);
        assert_eq!(reference_icrc(&hex(CNP_HEADERS), &cnp), 0x2A00_FD82);
        let uc = with_icrc(UC_PAYLOAD, [0; 4]);
        assert_eq!(
            reference_icrc(&hex(UC_HEADERS), &uc).to_le_bytes(),
            [0x78, 0xF3, 0x53, 0xF3]
        );
    }

    /// Every length from a bare BTH to well past the table-driven path's limit, over IPv4 and
    /// IPv6 headers: the ICRC is the §1.8 CRC, whichever path computes it.
    #[test]
    fn icrc_matches_a_bitwise_reference_at_every_length() {
        let mut v6 = [0u8; 48];
        v6[0] = 0x6B;
        v6[1..4].copy_from_slice(&[0xC1, 0x23, 0x45]);
        v6[6] = 0x11;
        v6[7] = 0x40;
        v6[8..24].copy_from_slice(&[0x20, 1, 0xD, 0xB8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
        v6[24..40].copy_from_slice(&[0xFE, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        v6[40..42].copy_from_slice(&0xD00Du16.to_be_bytes());
        v6[42..44].copy_from_slice(&4791u16.to_be_bytes());
        v6[46..48].copy_from_slice(&[0x12, 0x34]);
        for headers in [hex(CNP_HEADERS), hex(UC_HEADERS), v6.to_vec()] {
            for len in BTH_LEN + ICRC_LEN..BTH_LEN + ICRC_LEN + 300 {
                let payload = varied(len, len as u8);
                assert_eq!(
                    icrc_over_headers(&headers, &payload),
                    Ok(reference_icrc(&headers, &payload)),
                    "len {len}, headers {:02x}",
                    headers[0]
                );
            }
        }
    }

    /// `compute_icrc` (headers rebuilt from the context, prefix cached) agrees with the
    /// reference over the headers `write_headers` produces, for interleaved contexts and
    /// lengths: more pairs than the cache holds, several contexts of the same length, several
    /// lengths of the same context, and each pair again after the others.
    #[test]
    fn compute_icrc_is_the_reference_over_rebuilt_headers_for_interleaved_paths() {
        let v4 = |src: u8, ident: u16, port: u16| IpContext {
            addrs: IpAddrs::V4 {
                src: Ipv4Addr::new(10, 0, 0, src),
                dst: Ipv4Addr::new(10, 0, 1, 1),
                ident,
            },
            src_port: port,
            dst_port: 4791,
        };
        let ctxs = [
            v4(1, 0, 0xC000),
            v4(2, 0, 0xC000),
            v4(1, 7, 0xC000),
            v4(1, 0, 0xC001),
            IpContext::v6(Ipv6Addr::LOCALHOST, Ipv6Addr::UNSPECIFIED, 0xC000),
        ];
        let lens = [16usize, 44, 300];
        for round in 0..2 {
            for len in lens {
                for (i, ctx) in ctxs.iter().enumerate() {
                    let payload = varied(len, i as u8 + round);
                    let mut headers = [0; MAX_HEADERS_LEN];
                    let n = ctx.write_headers(len, &mut headers, true).unwrap();
                    let want = reference_icrc(&headers[..n], &payload);
                    assert_eq!(compute_icrc(ctx, &payload), Ok(want), "ctx {i}, len {len}");
                }
            }
        }
    }

    /// IPv4 (§1.8): TOS, TTL, the header checksum and the UDP checksum are masked; every other
    /// header byte (total length, identification, flags, protocol, addresses, ports, UDP
    /// length) is covered.
    #[test]
    fn ipv4_masks_tos_ttl_and_checksums_and_covers_the_rest() {
        let headers = hex(UC_HEADERS);
        let payload = with_icrc(UC_PAYLOAD, [0; 4]);
        let base = icrc_over_headers(&headers, &payload).unwrap();
        for at in 1..headers.len() {
            let mut h = headers.clone();
            h[at] ^= 0x21;
            let masked = matches!(at, 1 | 8 | 10 | 11 | 26 | 27);
            assert_eq!(
                icrc_over_headers(&h, &payload) == Ok(base),
                masked,
                "header byte {at}"
            );
        }
    }

    /// A payload of exactly BTH + ICRC bytes is the shortest accepted; the errors name what
    /// was needed.
    #[test]
    fn shortest_payload_and_error_values() {
        let ctx = IpContext::v4(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 0xC000);
        let mut p = hex(UC_PAYLOAD)[..BTH_LEN].to_vec();
        p.extend_from_slice(&[0; ICRC_LEN]);
        fill_icrc(&ctx, &mut p).unwrap();
        assert_eq!(check_icrc(&ctx, &p), Ok(()));
        let headers = hex(UC_HEADERS);
        assert_eq!(
            icrc_over_headers(&headers, &p),
            Ok(reference_icrc(&headers, &p))
        );
        assert_eq!(
            icrc_over_headers(&[], &p),
            Err(WireError::Truncated { need: 28, have: 0 })
        );
        assert_eq!(
            icrc_over_headers(&headers[..27], &p),
            Err(WireError::Truncated { need: 28, have: 27 })
        );
        assert_eq!(
            check_icrc(&ctx, &p[..15]),
            Err(WireError::Truncated { need: 16, have: 15 })
        );
    }
}
