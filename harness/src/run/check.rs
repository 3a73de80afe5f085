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
//! | `read-data` | every successful READ landed the peer's pattern; every pattern is intact |
//! | `atomic-exactly-once` | successful FETCH_ADDs fetched distinct values, each below the final counter; the counter equals their number when no FETCH_ADD failed, and lies between the two bounds otherwise |
//! | `dead-peer-detection` | a killed node's partners end their QP to it in RETRY_EXC_ERR or RNR_RETRY_EXC_ERR within (retry_cnt + 1) × ACK timeout + slack of the kill (or of posting, if later) |
//! | `liveness` | no error completion that no process fault (or `expect_errors`) explains; every node not killed finished its workload, drained, and exited 0 |
//! | `node-self-checks` | nothing the nodes noticed on their own (bad records on receipt, wrong READ data, pongs out of turn) |

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use verbs_api::WcStatus;

use crate::run::layout::{self, RecordKind, Workload};
use crate::run::log::{Entry, LogRead, OpKind, read_log};
use crate::run::proto::QpParams;

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
}

/// Everything the checker needs.
#[derive(Clone, Debug)]
pub struct Evidence {
    /// Node count.
    pub nodes: u32,
    /// Workload.
    pub workload: Workload,
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

fn status_name(raw: u32) -> String {
    WcStatus::from_raw(raw).map_or_else(|| format!("status {raw}"), |s| s.name().to_owned())
}

const SUCCESS: u32 = WcStatus::Success as u32;
const FLUSH: u32 = WcStatus::WrFlushErr as u32;
const RETRY_EXC: u32 = WcStatus::RetryExcErr as u32;
const RNR_RETRY_EXC: u32 = WcStatus::RnrRetryExcErr as u32;

/// A node's log and MR file.
struct NodeData {
    log: Option<LogRead>,
    mr: Option<Vec<u8>>,
}

fn read_file(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}

fn slice(bytes: &[u8], off: u64, len: usize) -> Option<&[u8]> {
    let start = usize::try_from(off).ok()?;
    bytes.get(start..start.checked_add(len)?)
}

/// One send-queue completion, unpacked.
struct SendWc<'a> {
    peer: u32,
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
    _entry: &'a Entry,
}

fn sends(log: &LogRead) -> impl Iterator<Item = SendWc<'_>> {
    log.entries.iter().filter_map(|e| match e {
        Entry::Send {
            peer,
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
            peer: *peer,
            wr: *wr,
            op: *op,
            status: *status,
            posted: *posted,
            at: *at,
            seq: *seq,
            len: *len,
            roff: *roff,
            loff: *loff,
            imm: *imm,
            kind: *kind,
            val: *val,
            _entry: e,
        }),
        _ => None,
    })
}

/// Runs every check.
pub fn check(ev: &Evidence) -> CheckResult {
    let n = ev.nodes;
    let data: Vec<NodeData> = (0..n)
        .map(|i| NodeData {
            log: read_log(&ev.run_dir.join(layout::log_file(i, 0))).ok(),
            mr: read_file(&ev.run_dir.join(layout::mr_file(i, 0))),
        })
        .collect();
    let fact = |i: u32| ev.facts.get(i as usize).cloned().unwrap_or_default();
    let mut result = CheckResult::default();

    // log-integrity, and per-node counts.
    let mut integrity = Invariant::new("log-integrity");
    for i in 0..n {
        let f = fact(i);
        let mut counts = LogCounts::default();
        match &data[i as usize].log {
            None => integrity.fail(format!("node {i}: no completion log")),
            Some(log) => {
                counts.lines = log.entries.len() as u64;
                counts.truncated = log.truncated_tail;
                integrity.checked += log.entries.len() as u64;
                for line in &log.bad_lines {
                    integrity.fail(format!("node {i}: log line {line} does not parse"));
                }
                if log.truncated_tail {
                    if f.killed_at.is_some() || f.timed_out {
                        integrity.note(format!("node {i}: last log line cut by the kill"));
                    } else {
                        integrity.fail(format!("node {i}: log ends in a cut line"));
                    }
                }
                for e in &log.entries {
                    let (status, counted) = match e {
                        Entry::Send {
                            status, op, kind, ..
                        } => {
                            let counts_op = match op {
                                OpKind::Fin => false,
                                OpKind::Send => kind.is_some_and(|k| k == RecordKind::Send),
                                _ => true,
                            };
                            (*status, counts_op)
                        }
                        Entry::Recv { status, imm, .. } => {
                            let pong = imm.is_some_and(|v| v & 0x8000_0000 != 0);
                            (*status, pong && ev.workload == Workload::Pingpong)
                        }
                        _ => continue,
                    };
                    *counts.completions.entry(status_name(status)).or_insert(0) += 1;
                    if counted && status == SUCCESS {
                        counts.ops_ok += 1;
                    }
                }
            }
        }
        result.counts.push(counts);
    }

    let mut order = Invariant::new("completion-order");
    let mut flush = Invariant::new("flush-after-error");
    for i in 0..n {
        let Some(log) = &data[i as usize].log else {
            continue;
        };
        let end = log.entries.iter().find_map(|e| match e {
            Entry::End { posted, .. } => Some(posted.clone()),
            _ => None,
        });
        let mut send_seq: BTreeMap<u32, Vec<(u64, u32)>> = BTreeMap::new();
        let mut recv_seq: BTreeMap<u32, Vec<(u64, u32)>> = BTreeMap::new();
        for e in &log.entries {
            match e {
                Entry::Send {
                    peer, wr, status, ..
                } => send_seq.entry(*peer).or_default().push((*wr, *status)),
                Entry::Recv {
                    peer, wr, status, ..
                } => recv_seq.entry(*peer).or_default().push((*wr, *status)),
                _ => {}
            }
        }
        for (queue, seqs) in [("send", &send_seq), ("receive", &recv_seq)] {
            for (peer, list) in seqs {
                order.checked += list.len() as u64;
                let mut expected = 1u64;
                for &(wr, _) in list {
                    if wr != expected {
                        let what = if wr < expected {
                            "again (completed twice or out of order)"
                        } else {
                            "too early (an earlier WR never completed)"
                        };
                        order.fail(format!(
                            "node {i} → node {peer} {queue} queue: wr {wr} completed {what}; \
                             expected wr {expected}"
                        ));
                        expected = wr.max(expected);
                    }
                    expected += 1;
                }
                let mut errored = false;
                for &(wr, status) in list {
                    flush.checked += 1;
                    if status == SUCCESS && errored {
                        flush.fail(format!(
                            "node {i} → node {peer} {queue} queue: wr {wr} succeeded after an error"
                        ));
                    } else if status != SUCCESS && status != FLUSH && queue == "receive" {
                        flush.fail(format!(
                            "node {i} → node {peer} receive queue: wr {wr} completed with {}",
                            status_name(status)
                        ));
                    } else if errored && status != FLUSH {
                        flush.fail(format!(
                            "node {i} → node {peer} {queue} queue: wr {wr} completed with {} \
                             after the QP's first error (expected IBV_WC_WR_FLUSH_ERR)",
                            status_name(status)
                        ));
                    }
                    errored |= status != SUCCESS;
                }
            }
        }
        if let Some(posted) = end {
            for p in posted {
                let got = send_seq.get(&p.peer).map_or(0, |l| l.len() as u64);
                if got != p.send {
                    order.fail(format!(
                        "node {i} → node {} send queue: {} WRs posted, {got} completions logged",
                        p.peer, p.send
                    ));
                }
                let got = recv_seq.get(&p.peer).map_or(0, |l| l.len() as u64);
                if got > p.recv {
                    order.fail(format!(
                        "node {i} → node {} receive queue: {} WRs posted, {got} completions",
                        p.peer, p.recv
                    ));
                }
            }
        } else if fact(i).killed_at.is_none() {
            order.note(format!(
                "node {i}: no end line (did not drain), completeness not checked"
            ));
        }
    }

    // Data checks.
    let mut write = Invariant::new("write-data");
    let mut send = Invariant::new("send-data");
    let mut read = Invariant::new("read-data");
    let mut atomic = Invariant::new("atomic-exactly-once");
    // Per FAA target: (issuer, wr, value) of successes; failed count; whether bounded.
    let mut faa_ok: BTreeMap<u32, Vec<(u32, u64, u64)>> = BTreeMap::new();
    let mut faa_failed: BTreeMap<u32, u64> = BTreeMap::new();
    let mut faa_unbounded: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for i in 0..n {
        let Some(log) = &data[i as usize].log else {
            continue;
        };
        let drained = log.entries.iter().any(|e| matches!(e, Entry::End { .. }));
        let mine = data[i as usize].mr.as_deref();
        let mut faa_targets = BTreeSet::new();
        for s in sends(log) {
            let j = s.peer;
            if j >= n {
                write.fail(format!("node {i}: completion for unknown peer {j}"));
                continue;
            }
            if s.op == OpKind::Faa {
                faa_targets.insert(j);
                if s.status != SUCCESS {
                    *faa_failed.entry(j).or_insert(0) += 1;
                }
            }
            if s.status != SUCCESS {
                continue;
            }
            let target = data[j as usize].mr.as_deref();
            let at_target = layout::position(n, ev.workload, j, i);
            let at_mine = layout::position(n, ev.workload, i, j);
            let (Some(tpos), Some(mpos)) = (at_target, at_mine) else {
                write.fail(format!(
                    "node {i}: completion for node {j}, which is not its peer"
                ));
                continue;
            };
            let link = format!("node {i} → node {j}");
            match s.op {
                OpKind::Write => {
                    write.checked += 1;
                    let want =
                        layout::record(ev.seed, RecordKind::Write, i, j, s.seq, 0, s.len as usize);
                    let off = layout::link_base(tpos) + layout::WRITE_OFF + s.roff.unwrap_or(0);
                    compare(&mut write, target, off, &want, || {
                        format!(
                            "{link} WRITE record {} ({} bytes at +{:#x})",
                            s.seq, s.len, off
                        )
                    });
                }
                OpKind::Fin => {
                    write.checked += 1;
                    let off = layout::FIN_OFF + 8 * tpos as u64;
                    compare(&mut write, target, off, &1u64.to_le_bytes(), || {
                        format!("{link} fin word")
                    });
                }
                OpKind::Send => {
                    send.checked += 1;
                    let (Some(kind), Some(imm)) = (s.kind, s.imm) else {
                        send.fail(format!("{link} SEND wr {} logged without kind/imm", s.wr));
                        continue;
                    };
                    let want = layout::record(ev.seed, kind, i, j, s.seq, imm, s.len as usize);
                    let off =
                        layout::link_base(tpos) + layout::RECV_OFF + s.seq * layout::RECV_SLOT;
                    compare(&mut send, target, off, &want, || {
                        format!("{link} SEND {} (slot {}, imm {imm:#x})", s.wr, s.seq)
                    });
                }
                OpKind::Read => {
                    read.checked += 1;
                    let want = layout::pattern(ev.seed, j, s.roff.unwrap_or(0), s.len as usize);
                    let off = layout::link_base(mpos) + layout::READ_OFF + s.loff.unwrap_or(0);
                    compare(&mut read, mine, off, &want, || {
                        format!(
                            "{link} READ {} ({} bytes of the pattern at +{:#x})",
                            s.seq,
                            s.len,
                            s.roff.unwrap_or(0)
                        )
                    });
                }
                OpKind::Faa => {
                    atomic.checked += 1;
                    let Some(val) = s.val else {
                        atomic.fail(format!("{link} FETCH_ADD wr {} logged without value", s.wr));
                        continue;
                    };
                    let off = layout::link_base(mpos) + layout::FAA_OFF + 8 * s.seq;
                    match mine.and_then(|m| slice(m, off, 8)) {
                        Some(b) => {
                            let mut w = [0u8; 8];
                            w.copy_from_slice(b);
                            if u64::from_ne_bytes(w) != val {
                                atomic.fail(format!(
                                    "{link} FETCH_ADD wr {}: logged value {val}, landing slot \
                                     holds {}",
                                    s.wr,
                                    u64::from_ne_bytes(w)
                                ));
                            }
                        }
                        None => atomic.fail(format!("{link}: FETCH_ADD landing slot unreadable")),
                    }
                    faa_ok.entry(j).or_default().push((i, s.wr, val));
                }
            }
        }
        if !drained {
            for t in faa_targets {
                faa_unbounded.entry(t).or_default().push(i);
            }
        }
        // Received slots.
        for e in &log.entries {
            let Entry::Recv {
                peer,
                wr,
                status,
                len,
                imm,
                ..
            } = e
            else {
                continue;
            };
            if *status != SUCCESS {
                continue;
            }
            send.checked += 1;
            let Some(pos) = layout::position(n, ev.workload, i, *peer) else {
                send.fail(format!("node {i}: receive from node {peer}, not a peer"));
                continue;
            };
            let off = layout::link_base(pos)
                + layout::RECV_OFF
                + wr.saturating_sub(1) * layout::RECV_SLOT;
            let bytes = mine.and_then(|m| slice(m, off, *len as usize));
            let what = format!(
                "node {i} receive slot {} from node {peer}",
                wr.saturating_sub(1)
            );
            match bytes.map(layout::check_record) {
                None => send.fail(format!("{what}: unreadable")),
                Some(Err(e)) => send.fail(format!("{what}: {e}")),
                Some(Ok((_, seq, rimm))) => {
                    if Some(rimm) != *imm {
                        send.fail(format!(
                            "{what}: record immediate {rimm:#x}, completion {imm:?}"
                        ));
                    }
                    if seq != wr.saturating_sub(1) {
                        send.fail(format!("{what}: holds record {seq}"));
                    }
                }
            }
        }
    }
    // Patterns intact.
    for i in 0..n {
        if let Some(m) = data[i as usize].mr.as_deref() {
            read.checked += 1;
            let want = layout::pattern(ev.seed, i, 0, layout::PATTERN_LEN as usize);
            compare(&mut read, Some(m), layout::PATTERN_OFF, &want, || {
                format!("node {i} READ pattern")
            });
        }
    }
    // Atomics.
    let targets: BTreeSet<u32> = faa_ok.keys().chain(faa_failed.keys()).copied().collect();
    for t in targets {
        let Some(counter) = data[t as usize]
            .mr
            .as_deref()
            .and_then(|m| slice(m, layout::COUNTER_OFF, 8))
            .map(|b| {
                let mut w = [0u8; 8];
                w.copy_from_slice(b);
                u64::from_ne_bytes(w)
            })
        else {
            atomic.fail(format!("node {t}: counter unreadable"));
            continue;
        };
        result.counters.insert(t, counter);
        let oks = faa_ok.get(&t).cloned().unwrap_or_default();
        let failed = faa_failed.get(&t).copied().unwrap_or(0);
        let mut seen: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
        for &(issuer, wr, val) in &oks {
            if let Some((other, owr)) = seen.insert(val, (issuer, wr)) {
                atomic.fail(format!(
                    "node {t} counter: value {val} fetched twice (node {other} wr {owr}, node \
                     {issuer} wr {wr}): an atomic executed more than once or not atomically"
                ));
            }
            if val >= counter {
                atomic.fail(format!(
                    "node {t} counter: node {issuer} wr {wr} fetched {val}, but the final value \
                     is {counter}"
                ));
            }
        }
        let ok = oks.len() as u64;
        let unbounded = faa_unbounded.get(&t).cloned().unwrap_or_default();
        if counter < ok {
            atomic.fail(format!(
                "node {t} counter is {counter}, below the {ok} successful FETCH_ADDs"
            ));
        } else if unbounded.is_empty() && failed == 0 && counter != ok {
            atomic.fail(format!(
                "node {t} counter is {counter}, but exactly {ok} FETCH_ADDs were posted and all \
                 succeeded"
            ));
        } else if unbounded.is_empty() && counter > ok + failed {
            atomic.fail(format!(
                "node {t} counter is {counter}, above {ok} successful + {failed} failed \
                 FETCH_ADDs"
            ));
        } else if !unbounded.is_empty() {
            atomic.note(format!(
                "node {t} counter {counter} ≥ {ok} successes; no upper bound, issuers {unbounded:?} \
                 did not drain"
            ));
        } else {
            atomic.note(format!(
                "node {t} counter {counter}: {ok} successful, {failed} failed FETCH_ADDs"
            ));
        }
    }

    // Liveness and dead-peer detection.
    let mut live = Invariant::new("liveness");
    let mut detect = Invariant::new("dead-peer-detection");
    let budget_ms = ev.qp.retry_budget().as_millis() as u64;
    let timeout_ms = ev.qp.ack_timeout().as_millis() as u64;
    let bound_ms = budget_ms + ev.slack.as_millis() as u64;
    let long_pause = |i: u32| {
        fact(i)
            .pauses
            .iter()
            .any(|&(_, d)| d + timeout_ms >= budget_ms)
    };
    for i in 0..n {
        let f = fact(i);
        if f.killed_at.is_none() {
            live.checked += 1;
            if let Some(e) = &f.error {
                live.fail(format!("node {i} failed: {e}"));
            } else if !f.finished {
                live.fail(format!("node {i} did not finish its workload"));
            } else if !f.drained {
                live.fail(format!("node {i} did not drain when asked to quiesce"));
            } else if !f.exited_cleanly {
                live.fail(format!(
                    "node {i} did not exit cleanly: {}",
                    f.end_note.as_deref().unwrap_or("unknown")
                ));
            }
        }
        let Some(log) = &data[i as usize].log else {
            continue;
        };
        // First error per peer (send or receive queue).
        let mut first_err: BTreeMap<u32, (u32, u64)> = BTreeMap::new();
        for e in &log.entries {
            let (peer, status, at) = match e {
                Entry::Send {
                    peer, status, at, ..
                }
                | Entry::Recv {
                    peer, status, at, ..
                } => (*peer, *status, *at),
                _ => continue,
            };
            if status != SUCCESS {
                first_err.entry(peer).or_insert((status, at));
            }
        }
        for (&peer, &(status, at)) in &first_err {
            live.checked += 1;
            let peer_fact = fact(peer);
            let explained = ev.expect_errors
                || peer_fact.killed_at.is_some_and(|k| at + 50 >= k)
                || f.killed_at.is_some()
                || long_pause(i)
                || long_pause(peer);
            if !explained {
                live.fail(format!(
                    "node {i} → node {peer}: {} with no process fault to explain it",
                    status_name(status)
                ));
            }
        }
    }
    for b in 0..n {
        let Some(kill) = fact(b).killed_at else {
            continue;
        };
        for a in layout::peers(n, ev.workload, b) {
            if a == b {
                continue;
            }
            let fa = fact(a);
            if fa.killed_at.is_some_and(|ka| ka <= kill + bound_ms) {
                detect.note(format!(
                    "node {a} was killed itself before it could detect node {b}"
                ));
                continue;
            }
            let Some(log) = &data[a as usize].log else {
                continue;
            };
            detect.checked += 1;
            let on_link: Vec<SendWc<'_>> = sends(log).filter(|s| s.peer == b).collect();
            if on_link
                .iter()
                .any(|s| s.op == OpKind::Fin && s.status == SUCCESS && s.at <= kill)
            {
                detect.note(format!(
                    "node {a} had finished with node {b} before the kill"
                ));
                continue;
            }
            let Some(first) = on_link.iter().find(|s| s.status != SUCCESS) else {
                detect.fail(format!(
                    "node {a}: no error on its QP to node {b} after node {b} was killed"
                ));
                continue;
            };
            if first.status != RETRY_EXC && first.status != RNR_RETRY_EXC {
                detect.fail(format!(
                    "node {a} → dead node {b}: first error is {}, expected \
                     IBV_WC_RETRY_EXC_ERR or IBV_WC_RNR_RETRY_EXC_ERR",
                    status_name(first.status)
                ));
                continue;
            }
            let from = kill.max(first.posted);
            let latency = first.at.saturating_sub(from);
            let paused: u64 = fa.pauses.iter().map(|&(_, d)| d).sum();
            result.detections.push((a, b, latency));
            if latency > bound_ms + paused {
                detect.fail(format!(
                    "node {a} → dead node {b}: {} after {latency} ms, above the bound of \
                     {bound_ms} ms ((retry_cnt + 1) × ACK timeout + slack)",
                    status_name(first.status)
                ));
            }
        }
    }

    let mut selfcheck = Invariant::new("node-self-checks");
    for i in 0..n {
        let f = fact(i);
        selfcheck.checked += 1;
        for p in &f.problems {
            selfcheck.fail(format!("node {i}: {p}"));
        }
    }

    result.invariants = vec![
        integrity, order, flush, write, send, read, atomic, detect, live, selfcheck,
    ];
    result
}

fn compare(
    inv: &mut Invariant,
    file: Option<&[u8]>,
    off: u64,
    want: &[u8],
    what: impl FnOnce() -> String,
) {
    match file.and_then(|f| slice(f, off, want.len())) {
        None => inv.fail(format!("{}: outside the target's file", what())),
        Some(got) if got == want => {}
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
