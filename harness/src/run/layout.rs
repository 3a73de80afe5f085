//! What every process of a run agrees on without talking: the topology (who has a QP to
//! whom), the layout of each node's file-backed memory region, the byte format of the records
//! nodes WRITE and SEND, and the READ patterns. The orchestrator's checker regenerates every
//! expected byte from these functions and the run seed, so it never trusts what a node says
//! it sent — only which operations the sender saw succeed.
//!
//! # Memory region of node `i` (file `node{i}.g{gen}.mr` in the run directory)
//!
//! ```text
//! 0            counter word (u64, native endian): target of FETCH_ADD
//! 64 + 8*p     fin word of the peer at position p of this node's peer list
//! PATTERN_OFF  READ pattern, PATTERN_LEN bytes (pattern(seed, i, offset)); the first page
//!              after the MAX_LINKS fin words
//! LINK_BASE + p*LINK_LEN, for the peer at position p of this node's peer list:
//!   + WRITE_OFF  inbound WRITE records from that peer, appended (WRITE_AREA bytes)
//!   + RECV_OFF   inbound SENDs from that peer, receive slot k at k*RECV_SLOT (RECV_SLOTS)
//!   + READ_OFF   landing area of this node's READs from that peer, appended (READ_AREA)
//!   + FAA_OFF    fetched values of this node's FETCH_ADDs to that peer, slot k (FAA_SLOTS)
//!   + STAGE_OFF  source buffers of this node's WRITEs/SENDs to that peer (STAGE_SLOTS)
//! ```
//!
//! Every area a peer writes into is append-only, so after the run each byte a successful
//! operation put there is still in place to be checked.

use serde::{Deserialize, Serialize};

/// The workloads of `softverbs run`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// SEND with immediate data to each peer, which answers with a SEND with immediate data
    /// (one ping in flight per QP).
    Pingpong,
    /// Streams of sequence-stamped, checksummed RDMA WRITE records into each peer's memory.
    StreamWrite,
    /// RDMA READs of each peer's known pattern, checked byte for byte.
    ReadVerify,
    /// Every node FETCH_ADDs 1 to one counter on node 0 (node 0 through a loopback QP pair).
    AtomicCounter,
    /// A seeded random mix of WRITE, SEND with immediate, READ and FETCH_ADD.
    Mixed,
    /// Unreliable datagrams: each link is a pair of UD QPs, and each node SENDs (with
    /// immediate) checksummed datagram records to each peer. Lost datagrams are allowed where
    /// the fault plan dropped, corrupted, truncated or partitioned; duplicates where it
    /// duplicated. Not drawn by `softverbs campaign`'s `cycle` and `draw`.
    UdSend,
}

/// The workloads over RC QPs: the ones `softverbs campaign` cycles through and draws from.
pub const RC_WORKLOADS: [Workload; 5] = [
    Workload::Pingpong,
    Workload::StreamWrite,
    Workload::ReadVerify,
    Workload::AtomicCounter,
    Workload::Mixed,
];

impl Workload {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Pingpong => "pingpong",
            Workload::StreamWrite => "stream-write",
            Workload::ReadVerify => "read-verify",
            Workload::AtomicCounter => "atomic-counter",
            Workload::Mixed => "mixed",
            Workload::UdSend => "ud-send",
        }
    }

    /// True for the workloads whose links are UD QPs.
    pub fn is_ud(self) -> bool {
        self == Workload::UdSend
    }
}

/// Workload operations a node keeps outstanding per QP at most (pongs and fin WRITEs aside).
/// A node polls its completions and writes their log lines before it posts again, so a node
/// killed at any moment has at most this many operations per QP posted but not logged.
pub fn window(workload: Workload) -> usize {
    match workload {
        Workload::Pingpong => 1,
        Workload::StreamWrite | Workload::Mixed | Workload::UdSend => 16,
        Workload::ReadVerify => 8,
        Workload::AtomicCounter => 4,
    }
}

/// Workload operations a node keeps in flight over all its QPs together at most. With many
/// QPs (`--qps-per-peer`) the per-QP windows alone would put thousands of packets in flight,
/// and a go-back-N timeout on many QPs at once re-sends whole windows in one burst: more than a
/// receiver's UDP socket buffer holds on a loaded machine, so the kernel drops datagrams the
/// fault plan never chose (seen as `RcvbufErrors` in `/proc/net/snmp`) and QPs run out of
/// retries. Never reached with one QP per peer (at most 64 peers × a window of 16 … 4).
pub const NODE_WINDOW: usize = 256;

/// The per-QP window of a node issuing on `links` QPs: [`window`], cut to an equal share of
/// [`NODE_WINDOW`] (at least 1) so that every QP keeps something in flight.
pub fn qp_window(workload: Workload, links: usize) -> usize {
    window(workload).min((NODE_WINDOW / links.max(1)).max(1))
}

/// Largest node count `softverbs run` accepts (addresses 127.0.0.10 to 127.0.0.73).
pub const MAX_NODES: u32 = 64;

/// Node counts up to this one are connected as a full mesh, larger ones as a ring.
pub const MESH_MAX: u32 = 4;

/// The sorted peer list of node `i` in a run of `n` nodes: every other node for `n ≤ 4`,
/// the two ring neighbours otherwise; with `atomic-counter`, node 0 is everybody's peer and
/// its own (a loopback QP pair, so that node 0 increments the counter too).
pub fn peers(n: u32, workload: Workload, i: u32) -> Vec<u32> {
    let mut list: Vec<u32> = if n <= MESH_MAX {
        (0..n).filter(|&j| j != i).collect()
    } else {
        vec![(i + n - 1) % n, (i + 1) % n]
    };
    if workload == Workload::AtomicCounter {
        if i == 0 {
            list = (0..n).collect();
        } else {
            list.push(0);
        }
    }
    list.sort_unstable();
    list.dedup();
    list
}

/// Position of `j` in node `i`'s peer list.
pub fn position(n: u32, workload: Workload, i: u32, j: u32) -> Option<usize> {
    peers(n, workload, i).iter().position(|&p| p == j)
}

/// The link position of QP `q` of node `i`'s `qps` QPs to `j` (`--qps-per-peer`): its link
/// block in `i`'s region and its fin word. Every QP is a link of its own: the QPs of a peer
/// are `qps` consecutive links, in the peer list's order.
pub fn link_position(
    n: u32,
    workload: Workload,
    qps: u32,
    i: u32,
    j: u32,
    q: u32,
) -> Option<usize> {
    (q < qps).then_some(position(n, workload, i, j)? * qps as usize + q as usize)
}

/// Most links (QPs) one node's region holds: a fin word each from [`FIN_OFF`] on, before
/// [`PATTERN_OFF`]. This sets `--qps-per-peer`'s limit (peers × QPs per peer); the device
/// allows far more QPs and CQs (emu-proto's `max_qp`, `max_cq`).
pub const MAX_LINKS: u64 = 2048;

/// The loopback address of node `i`'s device: 127.0.0.(10 + i), port chosen by the OS.
pub fn node_ip(i: u32) -> std::net::Ipv4Addr {
    let last = u8::try_from(10 + i.min(MAX_NODES)).unwrap_or(u8::MAX);
    std::net::Ipv4Addr::new(127, 0, 0, last)
}

/// Offset of the counter word.
pub const COUNTER_OFF: u64 = 0;
/// Offset of the first fin word.
pub const FIN_OFF: u64 = 64;
/// Offset of the READ pattern: the first page after the fin words of [`MAX_LINKS`] links.
pub const PATTERN_OFF: u64 = (FIN_OFF + 8 * MAX_LINKS).next_multiple_of(4096);
/// Length of the READ pattern.
pub const PATTERN_LEN: u64 = 64 * 1024;
/// Offset of the first per-link block.
pub const LINK_BASE: u64 = PATTERN_OFF + PATTERN_LEN;

/// Inbound WRITE records, within a link block.
pub const WRITE_OFF: u64 = 0;
/// Bytes of inbound WRITE records per link.
pub const WRITE_AREA: u64 = 4 << 20;
/// Inbound SENDs, within a link block.
pub const RECV_OFF: u64 = WRITE_OFF + WRITE_AREA;
/// Bytes per receive slot (the largest SEND; on a UD link the GRH and the largest datagram).
pub const RECV_SLOT: u64 = 256;
/// Bytes of the GRH in front of every datagram a UD receive slot holds.
pub const UD_GRH: u64 = 40;
/// Datagrams a node sends to one peer at most: a quarter of the peer's receive slots, so that
/// the datagrams and a duplicate of each fit in the receives the peer keeps posted
/// ([`UD_RQ_DEPTH`]) even if it never polled.
pub const UD_SENDS: u64 = RECV_SLOTS / 4;
/// Receive WRs a node keeps posted on a UD QP.
pub const UD_RQ_DEPTH: u64 = RECV_SLOTS / 2;
/// Receive slots per link.
pub const RECV_SLOTS: u64 = 4096;
/// READ landing area, within a link block.
pub const READ_OFF: u64 = RECV_OFF + RECV_SLOT * RECV_SLOTS;
/// Bytes of READ landing area per link.
pub const READ_AREA: u64 = 1 << 20;
/// FETCH_ADD landing slots, within a link block.
pub const FAA_OFF: u64 = READ_OFF + READ_AREA;
/// FETCH_ADD slots per link.
pub const FAA_SLOTS: u64 = 16 * 1024;
/// Source buffers, within a link block.
pub const STAGE_OFF: u64 = FAA_OFF + 8 * FAA_SLOTS;
/// Bytes per source buffer (the largest WRITE record).
pub const STAGE_SLOT: u64 = 4096;
/// Source buffers per link; more than a send queue holds, so a buffer is never reused while
/// the WR that reads it is outstanding.
pub const STAGE_SLOTS: u64 = 64;
/// Bytes of one link block.
pub const LINK_LEN: u64 = STAGE_OFF + STAGE_SLOT * STAGE_SLOTS;

/// Length of the region of a node with `links` peers.
pub fn region_len(links: usize) -> u64 {
    LINK_BASE + LINK_LEN * links as u64
}

/// Start of the link block of peer position `pos`.
pub fn link_base(pos: usize) -> u64 {
    LINK_BASE + LINK_LEN * pos as u64
}

/// The file of node `i`, generation `gen` (a restarted node is a new generation).
pub fn mr_file(i: u32, generation: u32) -> String {
    format!("node{i}.g{generation}.mr")
}

/// The packet capture of node `i`, generation `gen` (with `--pcap-dir`).
pub fn pcap_file(i: u32, generation: u32) -> String {
    format!("node{i}.g{generation}.pcap")
}

/// The completion log of node `i`, generation `gen`.
pub fn log_file(i: u32, generation: u32) -> String {
    format!("node{i}.g{generation}.log")
}

/// The standard error of node `i`, generation `gen`.
pub fn stderr_file(i: u32, generation: u32) -> String {
    format!("node{i}.g{generation}.stderr")
}

/// What a record carries.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// An RDMA WRITE record.
    Write = 1,
    /// A pingpong ping (SEND with immediate).
    Ping = 2,
    /// A pingpong pong (SEND with immediate).
    Pong = 3,
    /// A `mixed` SEND with immediate.
    Send = 4,
    /// A `ud-send` datagram (SEND with immediate on a UD QP).
    Datagram = 5,
}

/// The immediate-data bit that marks a pong (the rest is the ping's number).
pub const PONG: u32 = 0x8000_0000;

/// Magic number at the start of every record: "SVRC".
pub const RECORD_MAGIC: u32 = 0x5356_5243;
/// Bytes of a record header.
pub const RECORD_HEADER: usize = 32;

/// SplitMix64: the one mixing function of the harness (seeds, payloads, patterns).
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A small seeded generator (SplitMix64 stream) for workload choices.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(mix(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// A number in `lo..=hi` (`lo` if `hi < lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

fn fill(seed: u64, out: &mut [u8]) {
    let mut state = seed;
    for chunk in out.chunks_mut(8) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let word = mix(state).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// The record of `kind` number `seq` from `src` to `dst`, `len` bytes (at least
/// [`RECORD_HEADER`]): header (magic, kind, src, dst, len, seq, CRC-32 of the payload, imm)
/// then a payload derived from all of these and the run seed.
pub fn record(
    seed: u64,
    kind: RecordKind,
    src: u32,
    dst: u32,
    seq: u64,
    imm: u32,
    len: usize,
) -> Vec<u8> {
    let len = len.max(RECORD_HEADER);
    let mut out = vec![0u8; len];
    let key = mix(seed ^ mix((kind as u64) << 56 ^ u64::from(src) << 40 ^ u64::from(dst) << 24))
        ^ mix(seq ^ u64::from(imm) << 32);
    fill(key, &mut out[RECORD_HEADER..]);
    let crc = crc32fast::hash(&out[RECORD_HEADER..]);
    out[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    out[4] = kind as u8;
    out[6..8].copy_from_slice(&(src as u16).to_le_bytes());
    out[8..10].copy_from_slice(&(dst as u16).to_le_bytes());
    out[12..16].copy_from_slice(&(len as u32).to_le_bytes());
    out[16..24].copy_from_slice(&seq.to_le_bytes());
    out[24..28].copy_from_slice(&crc.to_le_bytes());
    out[28..32].copy_from_slice(&imm.to_le_bytes());
    out
}

/// Checks a record's header fields and payload CRC (without knowing the seed); `Err` says
/// what is wrong. Used by nodes on receipt; the checker compares exact bytes instead.
pub fn check_record(bytes: &[u8]) -> Result<(RecordKind, u64, u32), String> {
    if bytes.len() < RECORD_HEADER {
        return Err(format!("{} bytes, shorter than a header", bytes.len()));
    }
    let u32_at =
        |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    if u32_at(0) != RECORD_MAGIC {
        return Err("bad magic".into());
    }
    let kind = match bytes[4] {
        1 => RecordKind::Write,
        2 => RecordKind::Ping,
        3 => RecordKind::Pong,
        4 => RecordKind::Send,
        5 => RecordKind::Datagram,
        k => return Err(format!("unknown kind {k}")),
    };
    let len = u32_at(12) as usize;
    if len != bytes.len() {
        return Err(format!("header says {len} bytes, got {}", bytes.len()));
    }
    if crc32fast::hash(&bytes[RECORD_HEADER..]) != u32_at(24) {
        return Err("payload CRC mismatch".into());
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&bytes[16..24]);
    Ok((kind, u64::from_le_bytes(seq), u32_at(28)))
}

/// `len` bytes of node `node`'s READ pattern starting at pattern offset `off`.
pub fn pattern(seed: u64, node: u32, off: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let key = mix(seed ^ 0x5041_5454 ^ u64::from(node) << 32);
    let mut word = off / 8;
    let mut skip = (off % 8) as usize;
    while out.len() < len {
        let bytes = mix(key ^ mix(word)).to_le_bytes();
        let take = (8 - skip).min(len - out.len());
        out.extend_from_slice(&bytes[skip..skip + take]);
        skip = 0;
        word += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn topology_is_a_mesh_then_a_ring() {
        assert_eq!(peers(3, Workload::StreamWrite, 1), vec![0, 2]);
        assert_eq!(peers(4, Workload::Mixed, 0), vec![1, 2, 3]);
        assert_eq!(peers(6, Workload::Mixed, 0), vec![1, 5]);
        assert_eq!(peers(6, Workload::Mixed, 3), vec![2, 4]);
        assert_eq!(peers(3, Workload::AtomicCounter, 0), vec![0, 1, 2]);
        assert_eq!(peers(6, Workload::AtomicCounter, 3), vec![0, 2, 4]);
        // Links are symmetric.
        for w in [Workload::Mixed, Workload::AtomicCounter] {
            for n in 2..9 {
                for i in 0..n {
                    for j in peers(n, w, i) {
                        assert!(peers(n, w, j).contains(&i), "{n} {i} {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn records_round_trip() {
        let r = record(7, RecordKind::Ping, 1, 2, 99, 0x42, 100);
        assert_eq!(r.len(), 100);
        assert_eq!(check_record(&r), Ok((RecordKind::Ping, 99, 0x42)));
        assert_eq!(r, record(7, RecordKind::Ping, 1, 2, 99, 0x42, 100));
        assert_ne!(r, record(8, RecordKind::Ping, 1, 2, 99, 0x42, 100));
        let mut bad = r.clone();
        bad[50] ^= 1;
        assert!(check_record(&bad).is_err());
        assert!(check_record(&r[..10]).is_err());
    }

    #[test]
    fn pattern_slices_agree() {
        let whole = pattern(3, 1, 0, 100);
        assert_eq!(pattern(3, 1, 13, 40), whole[13..53].to_vec());
        assert_ne!(pattern(3, 2, 0, 100), whole);
    }

    #[test]
    fn the_qps_of_a_peer_are_consecutive_links() {
        // Node 1 of 3 (mesh): peers 0 and 2; with 4 QPs each, links 0..4 and 4..8.
        let at = |j, q| link_position(3, Workload::Mixed, 4, 1, j, q);
        assert_eq!(
            (at(0, 0), at(0, 3), at(2, 0), at(2, 3)),
            (Some(0), Some(3), Some(4), Some(7))
        );
        assert_eq!(at(2, 4), None);
        assert_eq!(at(1, 0), None);
        // One QP per peer: the peer list position.
        assert_eq!(
            link_position(3, Workload::Mixed, 1, 1, 2, 0),
            position(3, Workload::Mixed, 1, 2)
        );
        assert_eq!(MAX_LINKS, 2048);
        const { assert!(FIN_OFF + 8 * MAX_LINKS <= PATTERN_OFF) };
        assert_eq!(PATTERN_OFF % 4096, 0);
    }

    #[test]
    fn many_qps_share_the_node_window() {
        assert_eq!(qp_window(Workload::Mixed, 2), 16);
        assert_eq!(qp_window(Workload::AtomicCounter, 64), 4);
        assert_eq!(qp_window(Workload::Mixed, 128), 2);
        assert_eq!(qp_window(Workload::Mixed, 1000), 1);
        assert_eq!(qp_window(Workload::Mixed, 0), 16);
        // One QP per peer never meets the node window.
        assert!(window(Workload::Mixed) * 2 <= NODE_WINDOW);
        assert!(window(Workload::AtomicCounter) * MAX_NODES as usize <= NODE_WINDOW);
    }

    #[test]
    fn layout_fits() {
        assert!(FIN_OFF + 8 * u64::from(MAX_NODES) <= PATTERN_OFF);
        assert_eq!(LINK_LEN % 8, 0);
        assert!(region_len(3) < 64 << 20);
    }
}
