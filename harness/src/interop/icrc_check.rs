//! `softverbs icrc-check FILE.pcap`: verifies the ICRC of every RoCEv2 packet of a capture
//! taken on the wire (e.g. on the rxe-vm tap), over the packet's real IPv4/UDP headers.
//!
//! A UDP socket cannot see the IPv4 identification, which the ICRC covers, so a softverbs device
//! verifies the ICRC of a peer that sends a non-zero ID (Linux rxe numbers its datagrams) only up
//! to that field ([`emu_proto::wire::solve_ipv4_ident`]). A capture verifies all of it: every
//! packet that passes here was sent with an ICRC computed exactly as softverbs computes it
//! ([`emu_proto::wire::icrc::icrc_over_headers`]), in both directions.
//!
//! Input: a classic pcap file (microsecond or nanosecond, either byte order) of Ethernet
//! (`dumpcap -P -i TAP`) or raw IPv4 frames. RoCEv2 packets are IPv4/UDP to port 4791; anything
//! else is skipped and counted.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use emu_proto::wire::icrc::icrc_over_headers;
use pcap_file::DataLink;
use pcap_file::pcap::PcapReader;

use super::{InteropError, Result};

/// `softverbs icrc-check` arguments.
#[derive(clap::Args, Clone, Debug)]
pub struct IcrcCheckArgs {
    /// The capture (classic pcap, Ethernet or raw IPv4).
    #[arg(value_name = "FILE.pcap")]
    pub file: PathBuf,
    /// Fail unless the capture holds at least this many RoCEv2 packets.
    #[arg(long, default_value_t = 1)]
    pub min_packets: u64,
}

/// Per-source counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SourceCounts {
    /// RoCEv2 packets from this address.
    pub packets: u64,
    /// Packets whose ICRC verified.
    pub good: u64,
    /// Packets sent with a non-zero IPv4 identification.
    pub nonzero_ip_id: u64,
}

/// What [`check_capture`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IcrcSummary {
    /// Counts by IPv4 source address.
    pub by_source: BTreeMap<Ipv4Addr, SourceCounts>,
    /// Frames that are not IPv4/UDP to or from port 4791.
    pub skipped: u64,
    /// One line per packet whose ICRC did not verify (the first 10).
    pub bad: Vec<String>,
    /// Number of packets whose ICRC did not verify.
    pub bad_count: u64,
}

impl IcrcSummary {
    /// RoCEv2 packets seen.
    pub fn packets(&self) -> u64 {
        self.by_source.values().map(|c| c.packets).sum()
    }
}

/// Runs `softverbs icrc-check`: exit code 0 when every RoCEv2 packet verified and there were
/// at least `--min-packets`, 1 otherwise.
pub fn run(args: &IcrcCheckArgs) -> u8 {
    let summary = match std::fs::read(&args.file)
        .map_err(|e| InteropError::new(format!("{}: {e}", args.file.display())))
        .and_then(|bytes| check_capture(&bytes))
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("softverbs icrc-check: {e}");
            return 1;
        }
    };
    for (src, c) in &summary.by_source {
        println!(
            "icrc-check: from {src}: {} RoCEv2 packets, {} with a valid ICRC over their real \
             headers, {} with a non-zero IPv4 identification",
            c.packets, c.good, c.nonzero_ip_id
        );
    }
    for line in &summary.bad {
        println!("icrc-check: BAD {line}");
    }
    println!(
        "icrc-check: {} RoCEv2 packets, {} bad ICRC, {} other frames skipped",
        summary.packets(),
        summary.bad_count,
        summary.skipped
    );
    if summary.bad_count == 0 && summary.packets() >= args.min_packets {
        0
    } else {
        if summary.packets() < args.min_packets {
            eprintln!(
                "softverbs icrc-check: only {} RoCEv2 packets, expected at least {}",
                summary.packets(),
                args.min_packets
            );
        }
        1
    }
}

fn u16_be(b: &[u8], at: usize) -> u16 {
    match b.get(at..at + 2) {
        Some(&[x, y]) => u16::from_be_bytes([x, y]),
        _ => 0,
    }
}

/// Verifies every RoCEv2 packet of a classic pcap file (read with `pcap-file`). Errors: not a
/// pcap file (pcapng gets its own hint), a truncated record, an unsupported link type.
pub fn check_capture(bytes: &[u8]) -> Result<IcrcSummary> {
    if bytes.starts_with(&[0x0a, 0x0d, 0x0d, 0x0a]) {
        return Err(InteropError::new(
            "pcapng is not supported: capture with `dumpcap -P` or convert with `tshark -F pcap`",
        ));
    }
    let mut reader =
        PcapReader::new(bytes).map_err(|e| InteropError::new(format!("not a pcap file: {e}")))?;
    // Ethernet, or raw IPv4 (LINKTYPE_RAW, LINKTYPE_IPV4).
    let l2 = match reader.header().datalink {
        DataLink::ETHERNET => 14,
        DataLink::RAW | DataLink::IPV4 => 0,
        other => {
            return Err(InteropError::new(format!(
                "pcap link type {} is not supported (Ethernet or raw IPv4)",
                u32::from(other)
            )));
        }
    };
    let mut summary = IcrcSummary::default();
    let mut index = 0u64;
    while let Some(packet) = reader.next_packet() {
        index += 1;
        let packet = packet.map_err(|e| {
            InteropError::new(format!(
                "record {index} of the capture is truncated or malformed: {e}"
            ))
        })?;
        check_frame(&packet.data, l2, index, &mut summary);
    }
    Ok(summary)
}

/// Checks one frame; anything that is not a complete IPv4/UDP/4791 datagram is skipped.
fn check_frame(frame: &[u8], l2: usize, index: u64, summary: &mut IcrcSummary) {
    if l2 == 14 && u16_be(frame, 12) != 0x0800 {
        summary.skipped += 1;
        return;
    }
    let Some(ip) = frame.get(l2..) else {
        summary.skipped += 1;
        return;
    };
    // IPv4 without options, UDP, not a fragment.
    if ip.len() < 28 || ip[0] != 0x45 || ip[9] != 17 || u16_be(ip, 6) & 0x3FFF != 0 {
        summary.skipped += 1;
        return;
    }
    let total = usize::from(u16_be(ip, 2));
    let udp_len = usize::from(u16_be(ip, 24));
    let (sport, dport) = (u16_be(ip, 20), u16_be(ip, 22));
    if dport != 4791 || total > ip.len() || udp_len < 8 || 20 + udp_len > total {
        summary.skipped += 1;
        return;
    }
    let headers = &ip[..28];
    let payload = &ip[28..20 + udp_len];
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let ident = u16_be(ip, 4);
    let counts = summary.by_source.entry(src).or_default();
    counts.packets += 1;
    if ident != 0 {
        counts.nonzero_ip_id += 1;
    }
    let wire = payload
        .len()
        .checked_sub(4)
        .and_then(|n| payload.get(n..))
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let computed = icrc_over_headers(headers, payload).ok();
    match (wire, computed) {
        (Some(w), Some(c)) if w == c => counts.good += 1,
        _ => {
            summary.bad_count += 1;
            if summary.bad.len() < 10 {
                let opcode = payload.first().copied().unwrap_or(0);
                let psn = payload
                    .get(9..12)
                    .map_or(0, |p| u32::from_be_bytes([0, p[0], p[1], p[2]]));
                summary.bad.push(format!(
                    "frame {index}: {src}:{sport} -> {dst}:{dport} IPv4 id {ident:#06x}, opcode \
                     {opcode:#04x}, PSN {psn}, ICRC on the wire {}, computed {}",
                    wire.map_or_else(|| "none".into(), |w| format!("{w:#010x}")),
                    computed.map_or_else(|| "impossible (runt)".into(), |c| format!("{c:#010x}")),
                ));
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use emu_proto::wire::{IpContext, fill_icrc};

    /// A pcap of raw IPv4 frames carrying `payloads` from 10.0.0.1 to 10.0.0.2:4791 with the
    /// given IPv4 identifications, ICRCs filled for those headers.
    fn capture(frames: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        out.extend_from_slice(&[2, 0, 4, 0]);
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&65535u32.to_le_bytes());
        out.extend_from_slice(&101u32.to_le_bytes());
        for (ident, payload) in frames {
            let total = 28 + payload.len();
            let mut ip = vec![0x45, 0];
            ip.extend_from_slice(&(total as u16).to_be_bytes());
            ip.extend_from_slice(&ident.to_be_bytes());
            ip.extend_from_slice(&[0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
            ip.extend_from_slice(&49152u16.to_be_bytes());
            ip.extend_from_slice(&4791u16.to_be_bytes());
            ip.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
            ip.extend_from_slice(&[0, 0]);
            ip.extend_from_slice(payload);
            out.extend_from_slice(&[0; 8]);
            out.extend_from_slice(&(ip.len() as u32).to_le_bytes());
            out.extend_from_slice(&(ip.len() as u32).to_le_bytes());
            out.extend_from_slice(&ip);
        }
        out
    }

    fn packet(fill: u8) -> Vec<u8> {
        // BTH (SEND_ONLY to QP 0x11, PSN 5), 8 payload bytes, ICRC.
        let mut p = vec![4, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 5];
        p.extend_from_slice(&[fill; 8]);
        p.extend_from_slice(&[0; 4]);
        p
    }

    #[test]
    fn verifies_id_zero_and_reports_a_mismatch() {
        let ip = IpContext::v4(
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            49152,
        );
        let mut good = packet(1);
        fill_icrc(&ip, &mut good).unwrap();
        // The same ICRC sent with a non-zero identification: what a receiver assuming ID 0
        // would accept, and what the wire proves wrong.
        let mut bad = packet(2);
        fill_icrc(&ip, &mut bad).unwrap();
        let s = check_capture(&capture(&[(0, good), (0x1234, bad)])).unwrap();
        let c = s.by_source[&"10.0.0.1".parse::<Ipv4Addr>().unwrap()];
        assert_eq!((c.packets, c.good, c.nonzero_ip_id), (2, 1, 1));
        assert_eq!(s.bad_count, 1);
        assert!(s.bad[0].contains("IPv4 id 0x1234"), "{}", s.bad[0]);
    }

    #[test]
    fn rejects_what_is_not_a_classic_pcap() {
        assert!(check_capture(b"short").is_err());
        let ng = [
            0x0a, 0x0d, 0x0d, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert!(check_capture(&ng).unwrap_err().0.contains("pcapng"));
        let mut truncated = capture(&[(0, packet(1))]);
        truncated.truncate(truncated.len() - 3);
        assert!(
            check_capture(&truncated)
                .unwrap_err()
                .0
                .contains("truncated")
        );
    }
}
