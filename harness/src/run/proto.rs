//! The control protocol between the orchestrator and its node processes: one JSON object per
//! line, orchestrator → node on the node's stdin, node → orchestrator on its stdout (a node
//! writes nothing else there; its diagnostics go to stderr, which the orchestrator sends to
//! `node{i}.g{gen}.stderr` in the run directory).
//!
//! ```text
//! orchestrator                         node i
//!   config  ───────────────────────▶   builds its device (127.0.0.(10+i), OS-chosen port),
//!                                      maps its MR file, creates a CQ + RC QP per peer
//!           ◀───────────────────────   hello {addr, mr, endpoints per peer}
//!   peers   ───────────────────────▶   (each peer's addr, MR and endpoint for this node)
//!                                      connects its QPs (RESET → RTS)
//!           ◀───────────────────────   connected
//!   start   ───────────────────────▶   installs the fault plan, runs the workload
//!           ◀───────────────────────   progress {ops}   (every 20 ms)
//!           ◀───────────────────────   finished {ops}   (workload and fin WRITEs done;
//!                                      keeps answering peers)
//!   quiesce ───────────────────────▶   (once every node finished or died) stops posting,
//!                                      drains, writes the log's end entry
//!           ◀───────────────────────   done {summary}
//!   exit    ───────────────────────▶   exits 0
//! ```
//!
//! Any message may be answered by `error {message}`, after which the node exits non-zero. A
//! node exits by itself when its stdin closes or its deadline passes. Endpoints and MRs travel
//! in the text forms of [`verbs_api::Endpoint`] and [`emu_udp::oob::RemoteMr`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::run::layout::Workload;

/// Transport parameters of every QP of a run.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpParams {
    /// Local ACK timeout code: 4.096 µs × 2^timeout.
    pub timeout: u8,
    /// Transport retries (0–7; 7 means seven).
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// Loss recovery of every RC QP (`--recovery`; selective repeat is a softverbs extension
    /// every node enables alike).
    #[serde(default)]
    pub recovery: crate::recovery::RecoveryArg,
}

impl QpParams {
    /// The local ACK timeout.
    pub fn ack_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(4096u64 << self.timeout.min(31))
    }

    /// How long a requester keeps retrying without progress before it reports
    /// RETRY_EXC_ERR: (retry_cnt + 1) local ACK timeouts.
    pub fn retry_budget(&self) -> std::time::Duration {
        self.ack_timeout() * (u32::from(self.retry_cnt) + 1)
    }
}

/// Everything a node needs to know, sent first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeConfig {
    /// This node's index.
    pub index: u32,
    /// Generation: 0 for the first process of a node, n for its n-th restart.
    pub generation: u32,
    /// Node count of the run.
    pub nodes: u32,
    /// The workload.
    pub workload: Workload,
    /// The run seed.
    pub seed: u64,
    /// Operations this node posts, if the run is bounded by a count.
    pub ops: Option<u64>,
    /// How long this node posts operations, if the run is bounded by time.
    pub duration_ms: Option<u64>,
    /// The run directory (MR file and completion log go there).
    pub run_dir: PathBuf,
    /// The network fault plan (emu-fault TOML), or `None` for no faults.
    pub plan: Option<String>,
    /// QP transport parameters.
    pub qp: QpParams,
    /// Extra time after the retry budget a node waits for outstanding work before it gives
    /// up on it.
    pub slack_ms: u64,
    /// A restarted node: builds its device and MR, takes no part in the workload.
    pub standby: bool,
    /// The node exits by itself this long after it started, whatever happens.
    pub deadline_ms: u64,
    /// Capture this process's traffic to this pcap file (what its device sent, after the
    /// network faults, and what it received).
    #[serde(default)]
    pub pcap: Option<PathBuf>,
    /// RC QPs per peer (`--qps-per-peer`); each is a link of its own.
    #[serde(default = "one")]
    pub qps_per_peer: u32,
    /// Connect the RC links through the IB CM over the GSIs (`--cm rdma`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cm: bool,
}

fn one() -> u32 {
    1
}

/// One peer, as a node learns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    /// The peer's index.
    pub index: u32,
    /// The peer device's UDP address.
    pub addr: String,
    /// The peer's QPs for this node (`Endpoint` text form; with `--qps-per-peer` N > 1, the
    /// N endpoints in QP order, separated by `;`).
    pub endpoint: String,
    /// The peer's memory region (`RemoteMr` text form).
    pub mr: String,
}

/// Orchestrator → node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToNode {
    /// The configuration (first message).
    Config(NodeConfig),
    /// The peers' endpoints and MRs.
    Peers {
        /// One entry per peer of this node (itself excluded).
        peers: Vec<PeerInfo>,
    },
    /// Start the workload now.
    Start,
    /// Stop posting, drain and report.
    Quiesce,
    /// Exit.
    Exit,
}

/// A node's QP for one peer, in its hello.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloEndpoint {
    /// The peer this QP is for.
    pub peer: u32,
    /// The QP (`Endpoint` text form; with `--qps-per-peer` N > 1, the N QPs in order,
    /// separated by `;`).
    pub endpoint: String,
}

/// Node → orchestrator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromNode {
    /// Device and QPs are ready.
    Hello {
        /// The device's UDP address.
        addr: String,
        /// The node's memory region (`RemoteMr` text form).
        mr: String,
        /// One QP per peer.
        endpoints: Vec<HelloEndpoint>,
    },
    /// Every QP is in RTS.
    Connected,
    /// Operations completed so far.
    Progress {
        /// Successful operations.
        ops: u64,
    },
    /// The workload and the fin WRITEs are done.
    Finished {
        /// Successful operations.
        ops: u64,
    },
    /// Problems the node noticed on its own since its last `problems` message (sent at
    /// once, so that a node killed later has reported them).
    Problems {
        /// What it noticed, in order.
        problems: Vec<String>,
    },
    /// Drained after `quiesce`.
    Done(Box<NodeSummary>),
    /// A fatal error; the node exits.
    Error {
        /// What went wrong.
        message: String,
    },
}

/// What a node reports at the end (counters the files cannot show).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    /// Successful operations.
    pub ops_ok: u64,
    /// Operations that completed in error.
    pub ops_failed: u64,
    /// Payload bytes of successful operations.
    pub bytes: u64,
    /// Work completions by status name (send and receive queues).
    pub completions: BTreeMap<String, u64>,
    /// Device transport counters.
    pub stats: TransportStats,
    /// Datagrams the node's fault injector dropped, duplicated, … (all links).
    pub injected: InjectedFaults,
    /// Problems the node saw itself (bad records on receipt, unexpected completions).
    pub problems: Vec<String>,
}

/// The device counters a report shows (from `UdpContext::device_stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportStats {
    /// Packets sent.
    pub sent_pkts: u64,
    /// Packets received.
    pub rcvd_pkts: u64,
    /// Packets sent again after an ACK timeout.
    pub retransmits_timeout: u64,
    /// Packets sent again after a NAK.
    pub retransmits_nak: u64,
    /// Packets sent again after a selective ACK or probe (selective repeat only).
    #[serde(default)]
    pub retransmits_sack: u64,
    /// Selective ACKs sent (selective repeat only).
    #[serde(default)]
    pub sacks_sent: u64,
    /// Duplicate requests received.
    pub duplicate_request: u64,
    /// Sequence NAKs sent.
    pub seq_naks_sent: u64,
    /// Sequence NAKs received.
    pub rcvd_seq_err: u64,
    /// RNR NAKs sent.
    pub send_rnr_err: u64,
    /// RNR NAKs received.
    pub rcvd_rnr_err: u64,
    /// Packets dropped by the receiver (malformed, bad ICRC, unknown QP, wrong state).
    pub dropped: u64,
    /// Packets dropped for a bad ICRC.
    pub icrc_errors: u64,
    /// Retries exhausted.
    pub retry_exceeded_err: u64,
    /// Received packets the device discarded, by cause ([`emu_proto::RxDropCause::name`]);
    /// every cause is listed. Empty from a node that predates the breakdown.
    #[serde(default)]
    pub rx_drops: BTreeMap<String, u64>,
}

impl TransportStats {
    /// Converts the engine's counters.
    pub fn from_stats(s: &emu_proto::Stats) -> TransportStats {
        TransportStats {
            sent_pkts: s.sent_pkts,
            rcvd_pkts: s.rcvd_pkts,
            retransmits_timeout: s.retransmits_timeout,
            retransmits_nak: s.retransmits_nak,
            retransmits_sack: s.retransmits_sack,
            sacks_sent: s.sacks_sent,
            duplicate_request: s.duplicate_request,
            seq_naks_sent: s.seq_naks_sent,
            rcvd_seq_err: s.rcvd_seq_err,
            send_rnr_err: s.send_rnr_err,
            rcvd_rnr_err: s.rcvd_rnr_err,
            dropped: s.dropped,
            icrc_errors: s.icrc_errors,
            retry_exceeded_err: s.retry_exceeded_err,
            rx_drops: s
                .rx_drops
                .iter()
                .map(|(cause, n)| (cause.name().to_owned(), n))
                .collect(),
        }
    }
}

/// What the node's injector did to the datagrams it sent.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectedFaults {
    /// Lost to a drop rule.
    pub dropped: u64,
    /// Sent with extra copies.
    pub duplicated: u64,
    /// Sent late.
    pub delayed: u64,
    /// Sent with a flipped bit.
    pub corrupted: u64,
    /// Sent cut short.
    pub truncated: u64,
    /// Lost to a partition.
    pub partitioned: u64,
}

/// The longest control line read (1 MiB); longer lines are an error.
pub const MAX_LINE: u64 = 1 << 20;
