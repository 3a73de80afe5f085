//! `emu-capture`: writes RoCEv2 packets to pcap files that Wireshark and tshark decode as
//! InfiniBand ("infiniband" protocol) without configuration (rc-transport.md §1.1, §1.11).
//!
//! Each packet is given as its UDP payload (BTH ‖ … ‖ ICRC, as `emu_proto::wire` emits it) plus
//! the [`IpContext`] it travels in. [`build_frame`] wraps it in an Ethernet II header with
//! synthesized, locally administered MACs (`02:00:` followed by the last four bytes of the IP
//! address) and the IP/UDP headers from [`IpContext::emit_headers`], i.e. exactly the headers the
//! ICRC was computed over (real IPv4 checksum, UDP checksum 0, DF, TTL 64). Wireshark
//! dissects UDP port 4791 as RoCEv2 by default; other ports need "Decode As".
//!
//! [`Capture`] is what the backends write through: one file shared by a set of member devices,
//! framing each datagram from its socket addresses, keeping the first error instead of failing
//! a send.
//!
//! What it is not: it never reads a clock (the caller passes every timestamp), does not capture
//! from a live interface and does not read pcap files.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use emu_proto::wire::{IpAddrs, IpContext, WireError};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};

/// Ethernet II header length.
pub const ETHERNET_HEADER_LEN: usize = 14;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
/// pcap snap length: larger than any IPv6 jumbo-free frame (14 + 40 + 65535).
const SNAPLEN: u32 = 0x4_0000;

/// Errors from building frames or writing the capture.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Creating or flushing the output failed.
    #[error("capture I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// The pcap writer rejected the header or a packet.
    #[error("pcap write failed: {0}")]
    Pcap(#[from] pcap_file::PcapError),
    /// The packet cannot be framed (e.g. too long for the IP length fields) or encoded.
    #[error("cannot encode packet: {0}")]
    Wire(#[from] WireError),
}

/// The synthesized MAC for `addr`: `02:00` (locally administered, unicast) ‖ last four address
/// bytes.
fn mac_for(addr: IpAddr) -> [u8; 6] {
    let tail = match addr {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(a) => {
            let o = a.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    [0x02, 0x00, tail[0], tail[1], tail[2], tail[3]]
}

/// Replaces the contents of `frame` with the Ethernet II frame (no FCS) carrying `udp_payload`
/// in the IP/UDP headers `ip` describes (module doc). Errors: [`WireError::TooLong`] if the
/// payload does not fit the IP/UDP length fields.
pub fn build_frame(
    ip: &IpContext,
    udp_payload: &[u8],
    frame: &mut Vec<u8>,
) -> Result<(), WireError> {
    let (src, dst, ethertype) = match ip.addrs {
        IpAddrs::V4 { src, dst, .. } => (IpAddr::V4(src), IpAddr::V4(dst), ETHERTYPE_IPV4),
        IpAddrs::V6 { src, dst } => (IpAddr::V6(src), IpAddr::V6(dst), ETHERTYPE_IPV6),
    };
    let headers = ETHERNET_HEADER_LEN + ip.headers_len();
    frame.clear();
    frame.resize(headers, 0);
    frame[0..6].copy_from_slice(&mac_for(dst));
    frame[6..12].copy_from_slice(&mac_for(src));
    frame[12..14].copy_from_slice(&ethertype.to_be_bytes());
    ip.emit_headers(udp_payload.len(), &mut frame[ETHERNET_HEADER_LEN..])?;
    frame.extend_from_slice(udp_payload);
    Ok(())
}

/// A pcap file (LINKTYPE_ETHERNET, nanosecond timestamps, native byte order) receiving RoCEv2
/// packets.
#[derive(Debug)]
pub struct PcapSink<W: Write> {
    writer: PcapWriter<W>,
    frame: Vec<u8>,
}

impl<W: Write> PcapSink<W> {
    /// Writes the pcap global header to `out` and returns the sink.
    pub fn new(out: W) -> Result<PcapSink<W>, CaptureError> {
        let header = PcapHeader {
            snaplen: SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::native(),
            ..PcapHeader::default()
        };
        Ok(PcapSink {
            writer: PcapWriter::with_header(out, header)?,
            frame: Vec::new(),
        })
    }

    /// Appends one packet: `udp_payload` (a RoCEv2 UDP payload) framed per [`build_frame`],
    /// stamped with `timestamp` since the Unix epoch (must be below 2^32 s).
    pub fn write_packet(
        &mut self,
        timestamp: Duration,
        ip: &IpContext,
        udp_payload: &[u8],
    ) -> Result<(), CaptureError> {
        build_frame(ip, udp_payload, &mut self.frame)?;
        // build_frame bounds the frame far below u32::MAX (IP length fields are 16 bits).
        let len =
            u32::try_from(self.frame.len()).map_err(|_| WireError::TooLong(self.frame.len()))?;
        self.writer
            .write_packet(&PcapPacket::new(timestamp, len, &self.frame))?;
        Ok(())
    }

    /// Flushes and returns the underlying writer.
    pub fn finish(self) -> Result<W, CaptureError> {
        let mut out = self.writer.into_writer();
        out.flush()?;
        Ok(out)
    }
}

impl PcapSink<BufWriter<File>> {
    /// Creates (or truncates) the file at `path` and writes the pcap global header.
    pub fn create(path: &Path) -> Result<Self, CaptureError> {
        PcapSink::new(BufWriter::new(File::create(path)?))
    }
}

/// One pcap file receiving the traffic of a set of member devices (by socket address), as the
/// backends capture: each datagram is framed from its source and destination addresses
/// ([`IpContext::between`]), a datagram that cannot be framed (mixed IP versions, too long) is
/// skipped, and the first I/O error stops the capture and is kept for [`Capture::finish`];
/// nothing panics. Members let a device that writes what it sends also write what it receives
/// from outside without writing a member's datagram twice ([`CaptureWriter::write_received`]).
#[derive(Debug)]
pub struct Capture {
    /// The file, named in errors (`None`: the caller made the sink).
    path: Option<PathBuf>,
    members: Vec<SocketAddr>,
    latch: Mutex<Latch>,
}

/// The sink and the first error; `sink` is `None` once finished or after an error.
#[derive(Debug)]
struct Latch {
    sink: Option<PcapSink<BufWriter<File>>>,
    error: Option<String>,
}

impl Capture {
    /// Creates (or truncates) the file at `path`, writes the pcap header and returns a capture
    /// for `members`. The error names the file.
    pub fn create(path: &Path, members: Vec<SocketAddr>) -> Result<Capture, String> {
        let sink =
            PcapSink::create(path).map_err(|e| format!("capture {}: {e}", path.display()))?;
        let mut capture = Capture::new(sink, members);
        capture.path = Some(path.to_path_buf());
        Ok(capture)
    }

    /// A capture for `members` writing into `sink` (errors do not name a file).
    pub fn new(sink: PcapSink<BufWriter<File>>, members: Vec<SocketAddr>) -> Capture {
        Capture {
            path: None,
            members,
            latch: Mutex::new(Latch {
                sink: Some(sink),
                error: None,
            }),
        }
    }

    /// Whether `addr` is a member device.
    pub fn is_member(&self, addr: SocketAddr) -> bool {
        self.members.contains(&addr)
    }

    /// Locks the file for a batch of writes.
    pub fn writer(&self) -> CaptureWriter<'_> {
        CaptureWriter {
            capture: self,
            latch: self.latch.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Stops capturing: flushes and closes the file. Idempotent; returns the first error met
    /// while creating, writing, flushing or closing.
    pub fn finish(&self) -> Result<(), String> {
        let mut w = self.writer();
        if let Some(sink) = w.latch.sink.take() {
            if let Err(e) = sink.finish() {
                w.fail(e);
            }
        }
        match &w.latch.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

/// A [`Capture`] locked for writing a batch of datagrams.
#[derive(Debug)]
pub struct CaptureWriter<'a> {
    capture: &'a Capture,
    latch: MutexGuard<'a, Latch>,
}

impl CaptureWriter<'_> {
    /// Appends the datagram `bytes` from `src` to `dst`, stamped `at` (since the Unix epoch);
    /// true if it was written. See [`Capture`] for what is skipped.
    pub fn write(&mut self, at: Duration, src: SocketAddr, dst: SocketAddr, bytes: &[u8]) -> bool {
        let Some(sink) = self.latch.sink.as_mut() else {
            return false;
        };
        let Some(ip) = IpContext::between(src, dst) else {
            return false;
        };
        match sink.write_packet(at, &ip, bytes) {
            Ok(()) => true,
            // Only this datagram cannot be framed; the file is fine.
            Err(CaptureError::Wire(_)) => false,
            Err(e) => {
                self.fail(e);
                false
            }
        }
    }

    /// As [`CaptureWriter::write`] for a datagram a member received, unless `src` is a member
    /// too: then it was written when it was sent.
    pub fn write_received(
        &mut self,
        at: Duration,
        src: SocketAddr,
        dst: SocketAddr,
        bytes: &[u8],
    ) -> bool {
        !self.capture.is_member(src) && self.write(at, src, dst, bytes)
    }

    /// Keeps the first error and stops writing.
    fn fail(&mut self, e: CaptureError) {
        self.latch.sink = None;
        let error = match &self.capture.path {
            Some(path) => format!("capture {}: {e}", path.display()),
            None => e.to_string(),
        };
        self.latch.error.get_or_insert(error);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use emu_proto::wire::icrc::icrc_over_headers;
    use emu_proto::wire::{BthRepr, ICRC_LEN, Opcode, PacketRepr, Psn};
    use pcap_file::pcap::PcapReader;

    use super::*;

    fn packet(ip: &IpContext) -> Vec<u8> {
        let bth = BthRepr {
            ack_req: true,
            ..BthRepr::new(Opcode::SendOnly, 0x12, Psn::new(1))
        };
        let repr = PacketRepr::new(bth, b"capture!!");
        let mut buf = vec![0; repr.buffer_len()];
        repr.emit(ip, &mut buf).unwrap();
        buf
    }

    fn ones_complement_sum(b: &[u8]) -> u16 {
        let mut sum: u32 = b
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xFFFF {
            sum = (sum & 0xFFFF) + (sum >> 16);
        }
        sum as u16
    }

    #[test]
    fn frames_are_consistent_with_the_icrc() {
        let v4 = IpContext::v4(
            Ipv4Addr::new(127, 0, 0, 1),
            Ipv4Addr::new(127, 0, 0, 2),
            0xC132,
        );
        let v6 = IpContext::v6(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST, 0xC132);
        let mut sink = PcapSink::new(Vec::new()).unwrap();
        for (i, ip) in [v4, v6].iter().enumerate() {
            sink.write_packet(Duration::new(1_700_000_000, i as u32), ip, &packet(ip))
                .unwrap();
        }
        let bytes = sink.finish().unwrap();

        let mut reader = PcapReader::new(&bytes[..]).unwrap();
        assert_eq!(reader.header().datalink, DataLink::ETHERNET);
        assert_eq!(reader.header().ts_resolution, TsResolution::NanoSecond);

        let f = reader.next_packet().unwrap().unwrap();
        assert_eq!(f.timestamp, Duration::new(1_700_000_000, 0));
        let d = &f.data;
        assert_eq!(
            d[..14],
            [2, 0, 127, 0, 0, 2, 2, 0, 127, 0, 0, 1, 0x08, 0x00]
        );
        assert_eq!(ones_complement_sum(&d[14..34]), 0xFFFF, "IPv4 checksum");
        assert_eq!(d[20..22], [0x40, 0x00], "DF, ID 0 before it");
        assert_eq!(d[36..38], [0x12, 0xB7], "UDP dst 4791");
        let payload = &d[42..];
        let crc = icrc_over_headers(&d[14..42], payload).unwrap();
        assert_eq!(payload[payload.len() - ICRC_LEN..], crc.to_le_bytes());

        let f = reader.next_packet().unwrap().unwrap();
        assert_eq!(f.data[12..14], [0x86, 0xDD]);
        let crc = icrc_over_headers(&f.data[14..62], &f.data[62..]).unwrap();
        assert_eq!(f.data[f.data.len() - 4..], crc.to_le_bytes());
        assert!(reader.next_packet().is_none());
    }

    #[test]
    fn oversized_payload_is_an_error() {
        let ip = IpContext::v4(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 0xC000);
        let mut sink = PcapSink::new(Vec::new()).unwrap();
        let huge = vec![0; 0x1_0000];
        assert!(matches!(
            sink.write_packet(Duration::ZERO, &ip, &huge),
            Err(CaptureError::Wire(WireError::TooLong(_)))
        ));
    }

    #[test]
    fn capture_skips_members_and_unframeable_datagrams_and_latches_nothing_for_them() {
        let path = std::env::temp_dir().join(format!("emu-capture-{}.pcap", std::process::id()));
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.1:4791".parse().unwrap(),
            "127.0.0.2:4791".parse().unwrap(),
        );
        let outsider: SocketAddr = "127.0.0.9:4791".parse().unwrap();
        let v6: SocketAddr = "[::1]:4791".parse().unwrap();
        let capture = Capture::create(&path, vec![a, b]).unwrap();
        let ip = IpContext::between(a, b).unwrap();
        let bytes = packet(&ip);
        {
            let mut w = capture.writer();
            assert!(w.write(Duration::ZERO, a, b, &bytes));
            assert!(
                !w.write_received(Duration::ZERO, a, b, &bytes),
                "a member's datagram"
            );
            assert!(w.write_received(Duration::ZERO, outsider, b, &bytes));
            assert!(!w.write(Duration::ZERO, a, v6, &bytes), "mixed IP versions");
            assert!(
                !w.write(Duration::ZERO, a, b, &vec![0; 0x1_0000]),
                "too long"
            );
        }
        assert_eq!(capture.finish(), Ok(()));
        assert_eq!(capture.finish(), Ok(()), "idempotent");
        assert!(
            !capture.writer().write(Duration::ZERO, a, b, &bytes),
            "finished"
        );
        let file = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut reader = PcapReader::new(&file[..]).unwrap();
        let mut count = 0;
        while let Some(p) = reader.next_packet() {
            p.unwrap();
            count += 1;
        }
        assert_eq!(count, 2);
        let missing = Path::new("/nonexistent-dir/x.pcap");
        assert!(
            Capture::create(missing, vec![])
                .unwrap_err()
                .starts_with("capture /nonexistent-dir/x.pcap: ")
        );
    }
}
