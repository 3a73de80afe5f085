//! The invariants read from the completion logs alone: `log-integrity`, `completion-order`
//! and `flush-after-error`, and the per-node counts of the report. Nothing here looks at
//! memory or at what the peers logged.

use std::collections::BTreeMap;

use super::{FLUSH, Input, Invariant, Link, LogCounts, SUCCESS, status_name};
use crate::run::layout::{RecordKind, Workload};
use crate::run::log::{Entry, LogRead, MAX_LOG, OpKind, Posted};

/// Node `i`'s numbers for the report: lines, whether the log was cut, completions by status,
/// and successful workload operations (every send-queue completion but fin words and pongs;
/// received pongs in `pingpong`). All zero for a node without a log.
pub(super) fn log_counts(input: &Input<'_>, i: u32) -> LogCounts {
    let mut counts = LogCounts::default();
    let Some(log) = input.log(i) else {
        return counts;
    };
    counts.lines = log.entries.len() as u64;
    counts.truncated = log.truncated_tail;
    for e in &log.entries {
        let Some((status, is_op)) = completion(input.ev.workload, e) else {
            continue;
        };
        *counts.completions.entry(status_name(status)).or_insert(0) += 1;
        if is_op && status == SUCCESS {
            counts.ops_ok += 1;
        }
    }
    counts
}

/// A completion's status, and whether it counts as a workload operation when successful;
/// `None` for lines that are not completions.
fn completion(workload: Workload, e: &Entry) -> Option<(u32, bool)> {
    match e {
        Entry::Send {
            status, op, kind, ..
        } => {
            let is_op = match op {
                OpKind::Fin => false,
                OpKind::Send => {
                    kind.is_some_and(|k| matches!(k, RecordKind::Send | RecordKind::Datagram))
                }
                _ => true,
            };
            Some((*status, is_op))
        }
        Entry::Recv { status, imm, .. } => {
            let pong = imm.is_some_and(|v| v & 0x8000_0000 != 0);
            Some((*status, pong && workload == Workload::Pingpong))
        }
        _ => None,
    }
}

/// `log-integrity`: every node left a completion log, and every complete line of it parses;
/// a log ends in a cut line only if its node was killed, by a process fault or by the
/// harness at the hard timeout (a note, not a violation). Nothing else is excused.
pub(super) fn log_integrity(input: &Input<'_>) -> Invariant {
    let mut inv = Invariant::new("log-integrity");
    for i in input.nodes() {
        let Some(log) = input.log(i) else {
            inv.fail(format!("node {i}: no completion log"));
            continue;
        };
        inv.checked += log.entries.len() as u64;
        for line in &log.bad_lines {
            inv.fail(format!("node {i}: log line {line} does not parse"));
        }
        if log.oversize {
            inv.fail(format!(
                "node {i}: log larger than {} GiB: read only up to there, not verified whole",
                MAX_LOG >> 30
            ));
        } else if log.truncated_tail {
            let f = input.fact(i);
            if f.killed_at.is_some() || f.timed_out {
                inv.note(format!("node {i}: last log line cut by the kill"));
            } else {
                inv.fail(format!("node {i}: log ends in a cut line"));
            }
        }
    }
    inv
}

/// One queue's completions per QP (peer and which of the QPs to it), as (wr_id, status) in
/// log order.
type PerPeer = BTreeMap<Link, Vec<(u64, u32)>>;

/// One node's completions per QP, as (wr_id, status) in log order.
struct Queues {
    /// Send queue, per peer.
    send: PerPeer,
    /// Receive queue, per peer.
    recv: PerPeer,
}

impl Queues {
    fn of(log: &LogRead) -> Queues {
        let mut q = Queues {
            send: BTreeMap::new(),
            recv: BTreeMap::new(),
        };
        for e in &log.entries {
            match e {
                Entry::Send {
                    peer,
                    qp,
                    wr,
                    status,
                    ..
                } => q
                    .send
                    .entry(Link {
                        peer: *peer,
                        qp: *qp,
                    })
                    .or_default()
                    .push((*wr, *status)),
                Entry::Recv {
                    peer,
                    qp,
                    wr,
                    status,
                    ..
                } => q
                    .recv
                    .entry(Link {
                        peer: *peer,
                        qp: *qp,
                    })
                    .or_default()
                    .push((*wr, *status)),
                _ => {}
            }
        }
        q
    }

    /// Both queues, named as in messages, send first.
    fn named(&self) -> [(&'static str, &PerPeer); 2] {
        [("send", &self.send), ("receive", &self.recv)]
    }

    /// Every queue of node `i` with completions, send queues first, peers in order: its name
    /// in messages ("node i → node peer send queue"), which queue it is (as in [`Self::named`])
    /// and its completions.
    fn each(&self, i: u32) -> impl Iterator<Item = (String, &'static str, &[(u64, u32)])> + '_ {
        self.named().into_iter().flat_map(move |(queue, per_peer)| {
            per_peer.iter().map(move |(peer, list)| {
                let name = format!("node {i} → {peer} {queue} queue");
                (name, queue, list.as_slice())
            })
        })
    }
}

/// `completion-order`: on every QP, each queue's completions carry wr_ids 1, 2, 3, … — each
/// exactly once, in posting order; and a node that drained (its log has an end line) logged
/// a completion for every send WR it posted and no more receive completions than receive WRs
/// posted. Excused: completeness of a node that did not drain (a note unless it was killed);
/// receive WRs still posted at the end.
pub(super) fn completion_order(input: &Input<'_>) -> Invariant {
    let mut inv = Invariant::new("completion-order");
    for i in input.nodes() {
        let Some(log) = input.log(i) else {
            continue;
        };
        let queues = Queues::of(log);
        for (name, _, list) in queues.each(i) {
            inv.checked += list.len() as u64;
            check_wr_sequence(&mut inv, &name, list);
        }
        match end_line(log) {
            Some(posted) => check_all_completed(&mut inv, i, &queues, posted),
            None if input.fact(i).killed_at.is_none() => inv.note(format!(
                "node {i}: no end line (did not drain), completeness not checked"
            )),
            None => {}
        }
    }
    inv
}

/// Fails `inv` for each wr_id of `list` that is not the next in 1, 2, 3, …; after a gap or
/// a repeat the count goes on from the larger of the two.
fn check_wr_sequence(inv: &mut Invariant, queue: &str, list: &[(u64, u32)]) {
    let mut expected = 1u64;
    for &(wr, _) in list {
        if wr != expected {
            let what = if wr < expected {
                "again (completed twice or out of order)"
            } else {
                "too early (an earlier WR never completed)"
            };
            inv.fail(format!(
                "{queue}: wr {wr} completed {what}; expected wr {expected}"
            ));
            expected = wr.max(expected);
        }
        expected += 1;
    }
}

/// The per-QP posted counts of the log's (first) end line, if it has one.
fn end_line(log: &LogRead) -> Option<&[Posted]> {
    log.entries.iter().find_map(|e| match e {
        Entry::End { posted, .. } => Some(posted.as_slice()),
        _ => None,
    })
}

/// Fails `inv` for each QP of node `i` whose send completions are not exactly the send WRs
/// posted, or whose receive completions outnumber the receive WRs posted.
fn check_all_completed(inv: &mut Invariant, i: u32, queues: &Queues, posted: &[Posted]) {
    for p in posted {
        let link = Link {
            peer: p.peer,
            qp: p.qp,
        };
        let got = queues.send.get(&link).map_or(0, |l| l.len() as u64);
        if got != p.send {
            inv.fail(format!(
                "node {i} → {link} send queue: {} WRs posted, {got} completions logged",
                p.send
            ));
        }
        let got = queues.recv.get(&link).map_or(0, |l| l.len() as u64);
        if got > p.recv {
            inv.fail(format!(
                "node {i} → {link} receive queue: {} WRs posted, {got} completions",
                p.recv
            ));
        }
    }
}

/// `flush-after-error`: on every QP, once a queue has logged an error completion, every later
/// completion of that queue is IBV_WC_WR_FLUSH_ERR; and a receive completion is only ever a
/// success or a flush (a receive queue has no error of its own). Nothing is excused.
pub(super) fn flush_after_error(input: &Input<'_>) -> Invariant {
    let mut inv = Invariant::new("flush-after-error");
    for i in input.nodes() {
        let Some(log) = input.log(i) else {
            continue;
        };
        for (name, queue, list) in Queues::of(log).each(i) {
            check_flushes(&mut inv, &name, queue, list);
        }
    }
    inv
}

/// Checks one queue's completions against `flush-after-error`.
fn check_flushes(inv: &mut Invariant, name: &str, queue: &str, list: &[(u64, u32)]) {
    let mut errored = false;
    for &(wr, status) in list {
        inv.checked += 1;
        if let Some(what) = flush_violation(queue, errored, status) {
            inv.fail(format!("{name}: wr {wr} {what}"));
        }
        errored |= status != SUCCESS;
    }
}

/// What is wrong with a completion of `status` on `queue`, given whether the queue already
/// saw an error.
fn flush_violation(queue: &str, errored: bool, status: u32) -> Option<String> {
    if status == SUCCESS && errored {
        Some("succeeded after an error".to_owned())
    } else if status != SUCCESS && status != FLUSH && queue == "receive" {
        Some(format!("completed with {}", status_name(status)))
    } else if errored && status != FLUSH {
        Some(format!(
            "completed with {} after the QP's first error (expected IBV_WC_WR_FLUSH_ERR)",
            status_name(status)
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::Fixture;
    use super::*;
    use crate::run::log::Entry;

    const RETRY_EXC: u32 = super::super::RETRY_EXC;
    const REM_ACCESS: u32 = 10;

    #[test]
    fn counts_ops_and_statuses_per_node() {
        let mut fx = Fixture::busy(0);
        fx.fail(0, 1, OpKind::Write, RETRY_EXC);
        let counts = log_counts(&fx.input(), 0);
        // WRITE, SEND, READ, FETCH_ADD succeeded; the fin word is not an op.
        assert_eq!(counts.ops_ok, 4);
        assert_eq!(counts.completions["IBV_WC_SUCCESS"], 6);
        assert_eq!(counts.completions["IBV_WC_RETRY_EXC_ERR"], 1);
        assert_eq!(counts.lines, 9);
        assert!(!counts.truncated);
        fx.data[1].log = None;
        assert_eq!(log_counts(&fx.input(), 1), LogCounts::default());
    }

    #[test]
    fn log_integrity_holds_for_whole_logs_and_a_killed_nodes_cut_line() {
        let mut fx = Fixture::busy(0);
        fx.log(1).truncated_tail = true;
        fx.fact(1).killed_at = Some(fx.now);
        let inv = log_integrity(&fx.input());
        assert!(inv.passed(), "{inv:?}");
        assert_eq!(inv.checked, 16);
        assert_eq!(inv.notes, ["node 1: last log line cut by the kill"]);
    }

    #[test]
    fn log_integrity_reports_missing_logs_bad_lines_and_a_live_nodes_cut_line() {
        let mut fx = Fixture::new(4, Workload::Mixed);
        fx.log(0).bad_lines = vec![4];
        fx.log(1).truncated_tail = true;
        fx.data[2].log = None;
        // A log cut by the reader's size limit is not excused, even for a killed node.
        fx.log(3).oversize = true;
        fx.log(3).truncated_tail = true;
        fx.fact(3).killed_at = Some(fx.now);
        let inv = log_integrity(&fx.input());
        assert_eq!(
            inv.violations,
            [
                "node 0: log line 4 does not parse",
                "node 1: log ends in a cut line",
                "node 2: no completion log",
                "node 3: log larger than 64 GiB: read only up to there, not verified whole",
            ]
        );
    }

    #[test]
    fn completion_order_holds_for_wr_ids_in_order_and_complete() {
        let fx = Fixture::busy(0);
        let inv = completion_order(&fx.input());
        assert!(inv.passed(), "{inv:?}");
        // 5 send and 1 receive completion per node.
        assert_eq!(inv.checked, 12);
        assert!(inv.notes.is_empty());
    }

    #[test]
    fn completion_order_reports_repeats_gaps_and_missing_completions() {
        let mut fx = Fixture::new(2, Workload::StreamWrite);
        fx.write(0, 1);
        fx.write(0, 1);
        fx.write(0, 1);
        fx.end(0);
        // Node 0: the end line says 3 WRITEs, the log has wr 1, 3, 3 (entry 0 is the start).
        if let Entry::Send { wr, .. } = &mut fx.log(0).entries[2] {
            *wr = 3;
        }
        // Node 1 logs a receive its end line does not account for.
        fx.send(1, 0, 1);
        fx.end(1);
        if let Some(Entry::End { posted, .. }) = fx.log(1).entries.last_mut() {
            posted[0].send = 2;
        }
        if let Some(Entry::End { posted, .. }) = fx.log(0).entries.last_mut() {
            posted[0].recv = 0;
        }
        let inv = completion_order(&fx.input());
        assert_eq!(
            inv.violations,
            [
                "node 0 → node 1 send queue: wr 3 completed too early (an earlier WR never \
                 completed); expected wr 2",
                "node 0 → node 1 send queue: wr 3 completed again (completed twice or out of \
                 order); expected wr 4",
                "node 0 → node 1 receive queue: 0 WRs posted, 1 completions",
                "node 1 → node 0 send queue: 2 WRs posted, 1 completions logged",
            ]
        );
    }

    #[test]
    fn completion_order_notes_a_node_that_did_not_drain() {
        let mut fx = Fixture::new(2, Workload::StreamWrite);
        fx.write(0, 1);
        fx.fact(1).killed_at = Some(fx.now);
        let inv = completion_order(&fx.input());
        assert!(inv.passed(), "{inv:?}");
        // Node 1 was killed: no note for it.
        assert_eq!(
            inv.notes,
            ["node 0: no end line (did not drain), completeness not checked"]
        );
    }

    #[test]
    fn flush_after_error_holds_for_an_error_then_flushes() {
        let mut fx = Fixture::busy(0);
        fx.fail(0, 1, OpKind::Write, RETRY_EXC);
        fx.fail(0, 1, OpKind::Write, FLUSH);
        fx.fail(0, 1, OpKind::Fin, FLUSH);
        fx.push(1, recv(0, 2, FLUSH));
        let inv = flush_after_error(&fx.input());
        assert!(inv.passed(), "{inv:?}");
        assert_eq!(inv.checked, 16);
    }

    #[test]
    fn flush_after_error_reports_success_or_another_error_after_an_error() {
        let mut fx = Fixture::new(2, Workload::Mixed);
        fx.write(0, 1);
        fx.fail(0, 1, OpKind::Write, RETRY_EXC);
        fx.write(0, 1);
        fx.fail(0, 1, OpKind::Write, REM_ACCESS);
        fx.push(1, recv(0, 1, REM_ACCESS));
        let inv = flush_after_error(&fx.input());
        assert_eq!(
            inv.violations,
            [
                "node 0 → node 1 send queue: wr 3 succeeded after an error",
                "node 0 → node 1 send queue: wr 4 completed with IBV_WC_REM_ACCESS_ERR after \
                 the QP's first error (expected IBV_WC_WR_FLUSH_ERR)",
                "node 1 → node 0 receive queue: wr 1 completed with IBV_WC_REM_ACCESS_ERR",
            ]
        );
    }

    fn recv(peer: u32, wr: u64, status: u32) -> Entry {
        Entry::Recv {
            peer,
            qp: 0,
            wr,
            status,
            at: 0,
            len: 0,
            imm: None,
        }
    }
}
