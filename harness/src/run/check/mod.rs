//! The invariants checked after a run, from evidence: the nodes' completion logs (what each
//! sender saw succeed) and their memory-region files (what is really at the targets), read
//! after every node has exited — killed ones included, since a killed process's shared file
//! mapping stays in the page cache.
//!
//! | invariant | what it checks |
//! |---|---|
//! | `log-integrity` | every complete log line parses; only a killed node's log may end in a cut line |
//! | `completion-order` | per QP, send completions carry wr_ids 1, 2, 3, … (each exactly once, in posting order), and all of them for a node that drained; the same for receives |
//! | `flush-after-error` | after a QP's first error completion, everything else on it is WR_FLUSH_ERR |
//! | `write-data` | every successful WRITE record and fin word is at the target, byte for byte |
//! | `send-data` | every successful SEND is in the target's receive slot, byte for byte; every received slot holds a well-formed record with the completion's immediate data |
//! | `send-delivery` | every successful SEND has exactly one receive completion at the receiver with its bytes and immediate (unless the receiver was killed before it could log it); every receive completion has a SEND its (drained) sender logged; in `pingpong`, every delivered ping got its pong unless a fault explains it |
//! | `datagram-data` | (`ud-send`, in place of `send-data`) every received datagram's slot holds the GRH from the peer's address to this node's and a record the peer sends to this node, byte for byte, with the completion's immediate data |
//! | `datagram-delivery` | (`ud-send`, in place of `send-delivery`) every received datagram was sent; per sender, datagrams lost and extra copies received stay within what its fault injector dropped/corrupted/truncated/partitioned and duplicated |
//! | `read-data` | every successful READ landed the peer's pattern; every pattern is intact |
//! | `atomic-exactly-once` | successful FETCH_ADDs fetched distinct values, each below the final counter; the counter equals their number when no FETCH_ADD failed, and lies between the two bounds otherwise |
//! | `untouched-memory` | in every MR file, every byte outside the ranges a logged operation addresses (and the counter, fin words, pattern and staging) is still zero |
//! | `dead-peer-detection` | a killed node's partners end their QP to it in RETRY_EXC_ERR or RNR_RETRY_EXC_ERR within (retry_cnt + 1) × ACK timeout + slack of the kill (or of posting, if later) |
//! | `liveness` | no error completion that no process fault (or `expect_errors`) explains; every node not killed finished its workload, drained, and exited 0 |
//! | `node-self-checks` | nothing the nodes noticed on their own (bad records on receipt, wrong READ data, pongs out of turn) |
//!
//! Each invariant is one function (in the submodules `logs`, `memory`, `delivery`, `ud`, `untouched` and `process`) that
//! takes the evidence with the logs read and the MR files open (`Input`, the files read in
//! bounded pieces by [`mr`]) and returns its [`Invariant`];
//! [`check`] reads the files and calls them in the order above. The checker does not gather
//! evidence (the orchestrator does, and passes it in as [`Evidence`]) and never trusts what a
//! node says it sent: every expected byte is regenerated from [`layout`] and the run seed.

mod delivery;
mod logs;
mod memory;
mod mr;
mod process;
mod ud;
mod untouched;

#[cfg(test)]
mod fixture;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use verbs_api::WcStatus;

use crate::run::layout::{self, RecordKind, Workload};
use crate::run::log::{Entry, LogRead, OpKind, read_log};
use crate::run::proto::{InjectedFaults, QpParams};
use mr::MrFile;

/// At most this many violation messages are kept per invariant (all are counted).
pub const MAX_MESSAGES: usize = 25;

/// Outcome of one invariant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Invariant {
    /// Short name.
    pub name: String,
    /// Things checked (completions, records, words, links).
    pub checked: u64,
    /// Violations found.
    pub violation_count: u64,
    /// The first [`MAX_MESSAGES`] violations, described.
    pub violations: Vec<String>,
    /// Remarks that are not violations (what was skipped and why).
    pub notes: Vec<String>,
}

impl Invariant {
    fn new(name: &str) -> Invariant {
        Invariant {
            name: name.to_owned(),
            ..Invariant::default()
        }
    }

    /// True if no violation was found.
    pub fn passed(&self) -> bool {
        self.violation_count == 0
    }

    fn fail(&mut self, msg: String) {
        self.violation_count += 1;
        if self.violations.len() < MAX_MESSAGES {
            self.violations.push(msg);
        }
    }

    fn note(&mut self, msg: String) {
        if self.notes.len() < MAX_MESSAGES {
            self.notes.push(msg);
        }
    }
}

/// What the orchestrator knows about one node (gen 0, the one that ran the workload).
#[derive(Clone, Debug, Default)]
pub struct NodeFacts {
    /// When it was killed (ms since the Unix epoch), if it was.
    pub killed_at: Option<u64>,
    /// Pauses: start (ms since the Unix epoch) and length (ms).
    pub pauses: Vec<(u64, u64)>,
    /// It reported `finished`.
    pub finished: bool,
    /// It drained and reported `done`.
    pub drained: bool,
    /// Its exit status was 0 after `exit`.
    pub exited_cleanly: bool,
    /// How it ended, when not cleanly (for messages).
    pub end_note: Option<String>,
    /// Problems the node reported itself.
    pub problems: Vec<String>,
    /// An `error` message it sent.
    pub error: Option<String>,
    /// The harness killed it at the hard timeout (so its log may end in a cut line).
    pub timed_out: bool,
    /// What its device's fault injector did to the datagrams it sent, from its final report
    /// (`None` if it did not drain).
    pub injected: Option<InjectedFaults>,
}

/// The facts of a node the orchestrator said nothing about.
static NO_FACTS: NodeFacts = NodeFacts {
    killed_at: None,
    pauses: Vec::new(),
    finished: false,
    drained: false,
    exited_cleanly: false,
    end_note: None,
    problems: Vec::new(),
    error: None,
    timed_out: false,
    injected: None,
};

/// Everything the checker needs.
#[derive(Clone, Debug)]
pub struct Evidence {
    /// Node count.
    pub nodes: u32,
    /// Workload.
    pub workload: Workload,
    /// RC QPs per pair of peers (`--qps-per-peer`): each is a link of its own.
    pub qps_per_peer: u32,
    /// Run seed.
    pub seed: u64,
    /// QP parameters.
    pub qp: QpParams,
    /// Slack allowed on top of the retry budget.
    pub slack: Duration,
    /// The run directory.
    pub run_dir: PathBuf,
    /// Errors caused by network faults are expected.
    pub expect_errors: bool,
    /// The most extra copies the plan's rules can give one datagram (the sum of its
    /// `duplicate` rules' `copies`): `datagram-delivery` bounds a sender's duplicates by this
    /// times its injector's count of duplicated datagrams.
    pub max_copies: u64,
    /// Per node index.
    pub facts: Vec<NodeFacts>,
}

/// Per-node numbers reconstructed from its log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LogCounts {
    /// Successful workload operations seen in the log.
    pub ops_ok: u64,
    /// Work completions by status name.
    pub completions: BTreeMap<String, u64>,
    /// Log lines read.
    pub lines: u64,
    /// The log ended in a cut line.
    pub truncated: bool,
}

/// The checker's result.
#[derive(Clone, Debug, Default)]
pub struct CheckResult {
    /// Invariants in a fixed order.
    pub invariants: Vec<Invariant>,
    /// Per node, from its log.
    pub counts: Vec<LogCounts>,
    /// Dead-peer detection latencies: (partner, dead node, ms from kill or post to error).
    pub detections: Vec<(u32, u32, u64)>,
    /// Final counter value per node that was a FETCH_ADD target.
    pub counters: BTreeMap<u32, u64>,
}

impl CheckResult {
    /// Total violations.
    pub fn violations(&self) -> u64 {
        self.invariants.iter().map(|i| i.violation_count).sum()
    }
}

/// Runs every check: reads each node's log and MR file from the run directory, then checks
/// the invariants in the order of the module table.
pub fn check(ev: &Evidence) -> CheckResult {
    let data: Vec<NodeData> = (0..ev.nodes)
        .map(|i| NodeData::read(&ev.run_dir, i))
        .collect();
    check_read(&Input { ev, data: &data })
}

/// The driver: every invariant on evidence whose files are read, violations gathered per
/// invariant in the fixed order.
fn check_read(input: &Input<'_>) -> CheckResult {
    let mut result = CheckResult {
        counts: input.nodes().map(|i| logs::log_counts(input, i)).collect(),
        ..CheckResult::default()
    };
    result.invariants = vec![
        logs::log_integrity(input),
        logs::completion_order(input),
        logs::flush_after_error(input),
        memory::write_data(input),
        if input.ev.workload.is_ud() {
            ud::datagram_data(input)
        } else {
            memory::send_data(input)
        },
        if input.ev.workload.is_ud() {
            ud::datagram_delivery(input)
        } else {
            delivery::send_delivery(input)
        },
        memory::read_data(input),
        memory::atomic_exactly_once(input, &mut result.counters),
        untouched::untouched_memory(input),
        process::dead_peer_detection(input, &mut result.detections),
        process::liveness(input),
        process::node_self_checks(input),
    ];
    result
}

/// A node's log and MR file (gen 0), `None` where the file could not be read.
#[derive(Debug, Default)]
struct NodeData {
    log: Option<LogRead>,
    mr: Option<MrFile>,
}

impl NodeData {
    fn read(run_dir: &Path, i: u32) -> NodeData {
        NodeData {
            log: read_log(&run_dir.join(layout::log_file(i, 0))).ok(),
            mr: MrFile::open(&run_dir.join(layout::mr_file(i, 0))),
        }
    }
}

/// The evidence with every node's files read: what each invariant function takes.
struct Input<'a> {
    ev: &'a Evidence,
    /// Per node index; a missing index reads as a node without files.
    data: &'a [NodeData],
}

impl Input<'_> {
    /// Every node index of the run.
    fn nodes(&self) -> std::ops::Range<u32> {
        0..self.ev.nodes
    }

    /// Node `i`'s completion log, if it could be read.
    fn log(&self, i: u32) -> Option<&LogRead> {
        self.data.get(i as usize).and_then(|d| d.log.as_ref())
    }

    /// Node `i`'s MR file, if it could be opened.
    fn mr(&self, i: u32) -> Option<&MrFile> {
        self.data.get(i as usize).and_then(|d| d.mr.as_ref())
    }

    /// What the orchestrator knows about node `i` (nothing, if it did not say).
    fn fact(&self, i: u32) -> &NodeFacts {
        self.ev.facts.get(i as usize).unwrap_or(&NO_FACTS)
    }

    /// Position of node `i`'s QP `q` to `j` among its links (its link block and fin word).
    fn position(&self, i: u32, j: u32, q: u32) -> Option<usize> {
        let qps = self.ev.qps_per_peer.max(1);
        layout::link_position(self.ev.nodes, self.ev.workload, qps, i, j, q)
    }
}

fn status_name(raw: u32) -> String {
    WcStatus::from_raw(raw).map_or_else(|| format!("status {raw}"), |s| s.name().to_owned())
}

const SUCCESS: u32 = WcStatus::Success as u32;
const FLUSH: u32 = WcStatus::WrFlushErr as u32;
const RETRY_EXC: u32 = WcStatus::RetryExcErr as u32;
const RNR_RETRY_EXC: u32 = WcStatus::RnrRetryExcErr as u32;

/// One send-queue completion, unpacked.
#[derive(Copy, Clone, Debug)]
struct SendWc {
    peer: u32,
    /// Which of the QPs to `peer`.
    qp: u32,
    wr: u64,
    op: OpKind,
    status: u32,
    posted: u64,
    at: u64,
    seq: u64,
    len: u32,
    roff: Option<u64>,
    loff: Option<u64>,
    imm: Option<u32>,
    kind: Option<RecordKind>,
    val: Option<u64>,
}

/// The send-queue completions of a log, in log order.
fn sends(log: &LogRead) -> impl Iterator<Item = SendWc> + '_ {
    log.entries.iter().filter_map(|e| match *e {
        Entry::Send {
            peer,
            qp,
            wr,
            op,
            status,
            posted,
            at,
            seq,
            len,
            roff,
            loff,
            imm,
            kind,
            val,
        } => Some(SendWc {
            peer,
            qp,
            wr,
            op,
            status,
            posted,
            at,
            seq,
            len,
            roff,
            loff,
            imm,
            kind,
            val,
        }),
        _ => None,
    })
}

/// One successful receive completion: (peer, wr_id, bytes, immediate data).
type GoodRecv = (Link, u64, u32, Option<u32>);

/// One QP of a node to a peer: the peer's index and which of the QPs to it
/// (`--qps-per-peer`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Link {
    peer: u32,
    qp: u32,
}

impl std::fmt::Display for Link {
    /// `node J` (and ` QP q` when there is more than one QP to it).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {}", self.peer)?;
        if self.qp > 0 {
            write!(f, " QP {}", self.qp)?;
        }
        Ok(())
    }
}

/// The successful receive completions of a log, in log order.
fn good_receives(log: &LogRead) -> impl Iterator<Item = GoodRecv> + '_ {
    log.entries.iter().filter_map(|e| match *e {
        Entry::Recv {
            peer,
            qp,
            wr,
            status: SUCCESS,
            len,
            imm,
            ..
        } => Some((Link { peer, qp }, wr, len, imm)),
        _ => None,
    })
}

/// Fails `inv` unless `file` holds `want` at `off`; the message starts with `what()`.
fn compare(
    inv: &mut Invariant,
    file: Option<&MrFile>,
    off: u64,
    want: &[u8],
    what: impl FnOnce() -> String,
) {
    match file.and_then(|f| f.get(off, want.len())) {
        None => inv.fail(format!("{}: outside the target's file", what())),
        Some(got) if *got == *want => {}
        Some(got) => {
            let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            let differ = got.iter().zip(want).filter(|(a, b)| a != b).count();
            inv.fail(format!(
                "{}: {differ} of {} bytes differ at the target, first at byte {first}",
                what(),
                want.len()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::fixture::Fixture;
    use super::*;

    #[test]
    fn a_correct_run_passes_every_invariant_in_order() {
        let fx = Fixture::busy(0);
        let result = check_read(&fx.input());
        let names: Vec<&str> = result.invariants.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "log-integrity",
                "completion-order",
                "flush-after-error",
                "write-data",
                "send-data",
                "send-delivery",
                "read-data",
                "atomic-exactly-once",
                "untouched-memory",
                "dead-peer-detection",
                "liveness",
                "node-self-checks",
            ]
        );
        assert_eq!(result.violations(), 0, "{:?}", result.invariants);
        assert_eq!(result.counts.len(), 2);
        assert_eq!(result.counts[0].ops_ok, 4);
        assert_eq!(result.counters, BTreeMap::from([(0, 1), (1, 1)]));
    }

    #[test]
    fn check_reads_the_evidence_from_the_run_directory() {
        let dir = std::env::temp_dir().join(format!("softverbs-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut fx = Fixture::busy(0);
        let record = fx.write(0, 1);
        fx.flip(1, record);
        // The end line comes after the new WRITE.
        fx.log(0)
            .entries
            .retain(|e| !matches!(e, Entry::End { .. }));
        fx.end(0);
        fx.ev.run_dir = dir.clone();
        fx.save(&dir);
        let from_files = check(&fx.ev);
        std::fs::remove_dir_all(&dir).unwrap();
        let in_memory = check_read(&fx.input());
        assert_eq!(from_files.invariants, in_memory.invariants);
        assert_eq!(from_files.counts, in_memory.counts);
        assert_eq!(from_files.counters, in_memory.counters);
        // Only the damaged WRITE is reported.
        assert_eq!(from_files.violations(), 1);
        assert_eq!(from_files.invariants[3].violation_count, 1);
        // A node without files: no log, no pattern, no counter.
        fx.ev.nodes = 3;
        let missing = check(&fx.ev);
        assert_eq!(
            missing.invariants[0].violations,
            [
                "node 0: no completion log",
                "node 1: no completion log",
                "node 2: no completion log",
            ]
        );
    }

    #[test]
    fn violations_are_all_counted_but_only_the_first_messages_kept() {
        let mut inv = Invariant::new("x");
        for k in 0..MAX_MESSAGES + 5 {
            inv.fail(format!("violation {k}"));
            inv.note(format!("note {k}"));
        }
        assert_eq!(inv.violation_count, MAX_MESSAGES as u64 + 5);
        assert_eq!(inv.violations.len(), MAX_MESSAGES);
        assert_eq!(inv.notes.len(), MAX_MESSAGES);
        assert_eq!(inv.violations[0], "violation 0");
        assert!(!inv.passed());
    }
}
