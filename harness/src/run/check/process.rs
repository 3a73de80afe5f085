//! The invariants about processes and process faults: `dead-peer-detection`, `liveness` and
//! `node-self-checks`. They judge error completions against what the orchestrator did to the
//! nodes (kills, pauses) and how each node ended; they do not look at memory.

use std::collections::BTreeMap;

use super::{
    FLUSH, Input, Invariant, Link, NodeFacts, RETRY_EXC, RNR_RETRY_EXC, SUCCESS, SendWc, sends,
};
use crate::run::layout;
use crate::run::log::{Entry, LogRead, OpKind};

impl Input<'_> {
    /// The QPs' retry budget, (retry_cnt + 1) × ACK timeout, in ms.
    fn budget_ms(&self) -> u64 {
        self.ev.qp.retry_budget().as_millis() as u64
    }

    /// The dead-peer detection bound: retry budget + slack, in ms.
    fn bound_ms(&self) -> u64 {
        self.budget_ms() + self.ev.slack.as_millis() as u64
    }

    /// Node `i`'s pauses (start, length in ms) long enough (pause + one ACK timeout ≥ the
    /// retry budget) for its peers to give up on it, or for it to give up on them.
    pub(super) fn long_pauses(&self, i: u32) -> impl Iterator<Item = (u64, u64)> + '_ {
        let timeout_ms = self.ev.qp.ack_timeout().as_millis() as u64;
        let budget_ms = self.budget_ms();
        self.fact(i)
            .pauses
            .iter()
            .copied()
            .filter(move |&(_, d)| d + timeout_ms >= budget_ms)
    }

    /// Node `i`'s pauses, summed, in ms.
    pub(super) fn paused_ms(&self, i: u32) -> u64 {
        self.fact(i).pauses.iter().map(|&(_, d)| d).sum()
    }

    /// When the run started: the earliest start line of any log (0 if none), for messages.
    fn run_start(&self) -> u64 {
        self.nodes()
            .filter_map(|i| self.log(i))
            .filter_map(|l| {
                l.entries.iter().find_map(|e| match e {
                    Entry::Start { at, .. } => Some(*at),
                    _ => None,
                })
            })
            .min()
            .unwrap_or(0)
    }
}

/// `dead-peer-detection`: for every killed node, each of its partners' QP to it ends, first,
/// in IBV_WC_RETRY_EXC_ERR or IBV_WC_RNR_RETRY_EXC_ERR, within the bound (retry budget +
/// slack, plus the partner's own pause time) of the kill or of the WR's posting, if later.
/// Excused (notes): a partner killed itself within the bound of the kill, and a partner that
/// had finished with the dead node (a successful fin WRITE) before the kill; a partner
/// without a log is skipped. Records each latency in `detections`. On UD links (`ud-send`)
/// there is no connection to lose: nothing to detect (a note).
pub(super) fn dead_peer_detection(
    input: &Input<'_>,
    detections: &mut Vec<(u32, u32, u64)>,
) -> Invariant {
    let mut inv = Invariant::new("dead-peer-detection");
    if input.ev.workload.is_ud() {
        inv.note("UD links: a dead peer's datagrams are lost, nothing to detect".to_owned());
        return inv;
    }
    for b in input.nodes() {
        let Some(kill) = input.fact(b).killed_at else {
            continue;
        };
        for a in layout::peers(input.ev.nodes, input.ev.workload, b) {
            for qp in (0..input.ev.qps_per_peer.max(1)).filter(|_| a != b) {
                check_detection(&mut inv, input, (a, Link { peer: b, qp }, kill), detections);
            }
        }
    }
    inv
}

/// Checks how partner `a` detected, on its QP `link`, that `link.peer` was killed at `kill`.
fn check_detection(
    inv: &mut Invariant,
    input: &Input<'_>,
    (a, link, kill): (u32, Link, u64),
    detections: &mut Vec<(u32, u32, u64)>,
) {
    let b = link.peer;
    if input
        .fact(a)
        .killed_at
        .is_some_and(|ka| ka <= kill + input.bound_ms())
    {
        inv.note(format!(
            "node {a} was killed itself before it could detect node {b}"
        ));
        return;
    }
    let Some(log) = input.log(a) else {
        return;
    };
    inv.checked += 1;
    let on_link: Vec<SendWc> = sends(log)
        .filter(|s| s.peer == b && s.qp == link.qp)
        .collect();
    if on_link
        .iter()
        .any(|s| s.op == OpKind::Fin && s.status == SUCCESS && s.at <= kill)
    {
        inv.note(format!("node {a} had finished with {link} before the kill"));
        return;
    }
    let Some(first) = on_link.iter().find(|s| s.status != SUCCESS) else {
        inv.fail(format!(
            "node {a}: no error on its QP to {link} after node {b} was killed"
        ));
        return;
    };
    detections.extend(judge_detection(inv, input, (a, b, kill), first));
}

/// Judges `first`, partner `a`'s first error on its QP to `b` (killed at `kill`): its status
/// and its latency against the bound. The detection, if the status is the right one.
fn judge_detection(
    inv: &mut Invariant,
    input: &Input<'_>,
    (a, b, kill): (u32, u32, u64),
    first: &SendWc,
) -> Option<(u32, u32, u64)> {
    let name = super::status_name(first.status);
    if first.status != RETRY_EXC && first.status != RNR_RETRY_EXC {
        inv.fail(format!(
            "node {a} → dead node {b}: first error is {name}, expected \
             IBV_WC_RETRY_EXC_ERR or IBV_WC_RNR_RETRY_EXC_ERR"
        ));
        return None;
    }
    let latency = first.at.saturating_sub(kill.max(first.posted));
    let bound_ms = input.bound_ms();
    if latency > bound_ms + input.paused_ms(a) {
        inv.fail(format!(
            "node {a} → dead node {b}: {name} after {latency} ms, above the bound of \
             {bound_ms} ms ((retry_cnt + 1) × ACK timeout + slack)"
        ));
    }
    Some((a, b, latency))
}

/// `liveness`: every node that was not killed finished its workload, drained when asked,
/// and exited 0, without sending an `error`; and every QP's first error completion (on
/// either queue) is explained. Excused: errors when the plan expects them (`expect_errors`);
/// otherwise only an IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR or IBV_WC_WR_FLUSH_ERR
/// that a process fault explains in time (see [`fault_explains`]). A killed node's own
/// errors get no other excuse: a node logs nothing after its kill.
pub(super) fn liveness(input: &Input<'_>) -> Invariant {
    let mut inv = Invariant::new("liveness");
    for i in input.nodes() {
        let f = input.fact(i);
        if f.killed_at.is_none() {
            inv.checked += 1;
            if let Some(why) = unhealthy_end(i, f) {
                inv.fail(why);
            }
        }
        let Some(log) = input.log(i) else {
            continue;
        };
        for (link, first) in first_errors(log) {
            inv.checked += 1;
            if !input.ev.expect_errors && !fault_explains(input, i, link, &first) {
                inv.fail(format!(
                    "node {i} → {link}: {} at +{} ms with no process fault to explain it",
                    super::status_name(first.status),
                    first.at.saturating_sub(input.run_start())
                ));
            }
        }
    }
    inv
}

/// Why node `i`, not killed, did not end well, if it did not.
fn unhealthy_end(i: u32, f: &NodeFacts) -> Option<String> {
    if let Some(e) = &f.error {
        Some(format!("node {i} failed: {e}"))
    } else if !f.finished {
        Some(format!("node {i} did not finish its workload"))
    } else if !f.drained {
        Some(format!("node {i} did not drain when asked to quiesce"))
    } else if !f.exited_cleanly {
        Some(format!(
            "node {i} did not exit cleanly: {}",
            f.end_note.as_deref().unwrap_or("unknown")
        ))
    } else {
        None
    }
}

/// The first error completion on one QP (either queue), and when the QP's first failed
/// send WR was posted.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct FirstError {
    /// Its status.
    status: u32,
    /// When it was polled.
    at: u64,
    /// When the QP's first send WR to fail was posted (`at` if no send WR failed).
    posted: u64,
}

/// Per QP (peer and which of the QPs to it), the first error completion (send or receive
/// queue).
fn first_errors(log: &LogRead) -> BTreeMap<Link, FirstError> {
    let mut first: BTreeMap<Link, FirstError> = BTreeMap::new();
    let mut first_send: BTreeMap<Link, u64> = BTreeMap::new();
    for e in &log.entries {
        let (peer, status, at) = match *e {
            Entry::Send {
                peer,
                qp,
                status,
                at,
                posted,
                ..
            } => {
                let peer = Link { peer, qp };
                if status != SUCCESS {
                    first_send.entry(peer).or_insert(posted);
                }
                (peer, status, at)
            }
            Entry::Recv {
                peer,
                qp,
                status,
                at,
                ..
            } => (Link { peer, qp }, status, at),
            _ => continue,
        };
        if status != SUCCESS {
            first.entry(peer).or_insert(FirstError {
                status,
                at,
                posted: at,
            });
        }
    }
    for (peer, e) in &mut first {
        e.posted = first_send.get(peer).copied().unwrap_or(e.at);
    }
    first
}

/// Whether a process fault explains node `i`'s first error `e` on its QP to `peer`: directly
/// ([`fault_explains_directly`]), or because the other end's QP failed first for a reason a
/// fault explains directly, and `e` came within the bound (retry budget + slack + `i`'s
/// pauses) of that failure or of posting its WR (a QP in error answers nothing).
fn fault_explains(input: &Input<'_>, i: u32, link: Link, e: &FirstError) -> bool {
    let peer = link.peer;
    if fault_explains_directly(input, i, peer, e) {
        return true;
    }
    let back = Link {
        peer: i,
        qp: link.qp,
    };
    let Some(other) = input
        .log(peer)
        .and_then(|l| first_errors(l).get(&back).copied())
    else {
        return false;
    };
    fault_explains_directly(input, peer, i, &other)
        && e.at >= other.at
        && e.at <= other.at.max(e.posted) + input.bound_ms() + input.paused_ms(i)
}

/// Whether a process fault explains node `i`'s first error `e` on its QP to `peer` by itself.
/// Only the statuses a silent peer causes count: IBV_WC_RETRY_EXC_ERR,
/// IBV_WC_RNR_RETRY_EXC_ERR, and IBV_WC_WR_FLUSH_ERR (a flushed receive can be polled before
/// the send error that caused it). And only in time, with `bound` the retry budget + slack +
/// `i`'s pauses:
/// - `peer` was killed at `k`, and `k ≤ at ≤ max(k, posted) + bound`, `posted` being when the
///   failed WR was posted;
/// - `i` or `peer` was paused at `s` for `d`, long enough for the other end to give up on it
///   (`d` + one ACK timeout ≥ the retry budget), and `s ≤ at ≤ s + d + bound`.
///
/// Nothing else: not an error before the kill, not a pause of a third node, not a pause long
/// before.
fn fault_explains_directly(input: &Input<'_>, i: u32, peer: u32, e: &FirstError) -> bool {
    if ![RETRY_EXC, RNR_RETRY_EXC, FLUSH].contains(&e.status) {
        return false;
    }
    let bound = input.bound_ms() + input.paused_ms(i);
    let killed = input
        .fact(peer)
        .killed_at
        .is_some_and(|k| e.at >= k && e.at <= k.max(e.posted) + bound);
    let paused = [i, peer].into_iter().any(|p| {
        input
            .long_pauses(p)
            .any(|(s, d)| e.at >= s && e.at <= s + d + bound)
    });
    killed || paused
}

/// `node-self-checks`: no node reported a problem it noticed on its own (a bad record on
/// receipt, wrong READ data, a pong out of turn). Nothing is excused.
pub(super) fn node_self_checks(input: &Input<'_>) -> Invariant {
    let mut inv = Invariant::new("node-self-checks");
    for i in input.nodes() {
        inv.checked += 1;
        for p in &input.fact(i).problems {
            inv.fail(format!("node {i}: {p}"));
        }
    }
    inv
}

#[cfg(test)]
mod tests {
    use super::super::fixture::{Fixture, T0};
    use super::super::{FLUSH, RETRY_EXC, RNR_RETRY_EXC};
    use super::*;
    use crate::run::layout::Workload;

    const REM_ACCESS: u32 = 10;

    /// Node `i`'s completion to `j` that failed with `status`, posted and polled at the
    /// given times.
    fn fail_at(fx: &mut Fixture, (i, j): (u32, u32), status: u32, posted: u64, at: u64) {
        let mut wc = fx.next_wc(i, j, OpKind::Write);
        (wc.status, wc.posted, wc.at) = (status, posted, at);
        fx.push(i, wc.entry());
    }

    /// A three-node `stream-write` mesh: every node WRITEs once to each other node.
    fn mesh() -> Fixture {
        let mut fx = Fixture::new(3, Workload::StreamWrite);
        for i in 0..3 {
            for j in (0..3).filter(|&j| j != i) {
                fx.write(i, j);
            }
        }
        fx
    }

    #[test]
    fn dead_peer_detection_holds_for_retry_exhaustion_within_the_bound() {
        let mut fx = mesh();
        let kill = T0 + 100;
        fx.fact(2).killed_at = Some(kill);
        // Node 0 was posting when node 2 died; node 1 posted its WR later.
        fail_at(&mut fx, (0, 2), RETRY_EXC, kill - 50, kill + 600);
        fail_at(&mut fx, (1, 2), RNR_RETRY_EXC, kill + 400, kill + 1400);
        fail_at(&mut fx, (1, 2), FLUSH, kill + 400, kill + 1400);
        let mut detections = Vec::new();
        let inv = dead_peer_detection(&fx.input(), &mut detections);
        assert!(inv.passed(), "{inv:?}");
        assert_eq!(inv.checked, 2);
        assert_eq!(detections, [(0, 2, 600), (1, 2, 1000)]);
    }

    #[test]
    fn dead_peer_detection_excuses_partners_done_or_dead_before() {
        let mut fx = mesh();
        let kill = T0 + 100;
        fx.fin(0, 1);
        fx.fin(0, 2);
        fx.fact(2).killed_at = Some(kill);
        fx.fact(1).killed_at = Some(kill + 1000);
        let mut detections = Vec::new();
        let inv = dead_peer_detection(&fx.input(), &mut detections);
        assert!(inv.passed(), "{inv:?}");
        assert!(detections.is_empty());
        assert_eq!(
            inv.notes,
            [
                "node 0 had finished with node 1 before the kill",
                "node 2 was killed itself before it could detect node 1",
                "node 0 had finished with node 2 before the kill",
                "node 1 was killed itself before it could detect node 2",
            ]
        );
    }

    #[test]
    fn dead_peer_detection_reports_no_error_a_wrong_error_and_a_late_one() {
        let mut fx = Fixture::new(5, Workload::StreamWrite);
        let kill = T0 + 100;
        // Node 2's ring neighbours: 1 (no error at all) and 3 (a wrong first error).
        fx.fact(2).killed_at = Some(kill);
        fx.write(1, 2);
        fail_at(&mut fx, (3, 2), REM_ACCESS, kill, kill + 10);
        // Node 4's neighbours: 3 (too late, even with its 300 ms pause) and 0 (in time).
        fx.fact(4).killed_at = Some(kill);
        fx.fact(3).pauses = vec![(kill, 300)];
        fail_at(&mut fx, (3, 4), RETRY_EXC, kill - 10, kill + 1337);
        fail_at(&mut fx, (0, 4), RETRY_EXC, kill - 10, kill + 1036);
        let mut detections = Vec::new();
        let inv = dead_peer_detection(&fx.input(), &mut detections);
        assert_eq!(
            inv.violations,
            [
                "node 1: no error on its QP to node 2 after node 2 was killed",
                "node 3 → dead node 2: first error is IBV_WC_REM_ACCESS_ERR, expected \
                 IBV_WC_RETRY_EXC_ERR or IBV_WC_RNR_RETRY_EXC_ERR",
                "node 3 → dead node 4: IBV_WC_RETRY_EXC_ERR after 1337 ms, above the bound of \
                 1036 ms ((retry_cnt + 1) × ACK timeout + slack)",
            ]
        );
        assert_eq!(inv.checked, 4);
        assert_eq!(detections, [(0, 4, 1036), (3, 4, 1337)]);
    }

    #[test]
    fn liveness_holds_for_errors_a_process_fault_explains_in_time() {
        let mut fx = mesh();
        let kill = T0 + 100;
        // Node 2 was killed; node 0 was posting to it then, node 1 posted later.
        fx.fact(2).killed_at = Some(kill);
        fail_at(&mut fx, (0, 2), RETRY_EXC, kill - 50, kill + 600);
        fail_at(&mut fx, (1, 2), RNR_RETRY_EXC, kill + 2000, kill + 3000);
        let inv = liveness(&fx.input());
        assert!(inv.passed(), "{inv:?}");
        // Nodes 0 and 1 ended, and two QPs had errors.
        assert_eq!(inv.checked, 4);
        // Node 1 paused about the retry budget: its QP to node 0 may fail, on both ends, while
        // it is paused or within the bound after it resumed.
        let resume = T0 + 5000 + 469;
        fx.fact(1).pauses = vec![(T0 + 5000, 469)];
        fail_at(&mut fx, (0, 1), RETRY_EXC, T0 + 4990, T0 + 5400);
        fail_at(&mut fx, (1, 0), FLUSH, T0 + 4990, resume + 1036);
        assert!(liveness(&fx.input()).passed());
        // Node 2's end of its QP to node 1 fails later, after posting, because node 1's end
        // failed first within the pause's bound: the QP in error answers nothing.
        fail_at(&mut fx, (1, 2), RETRY_EXC, T0 + 5100, T0 + 5600);
        fail_at(&mut fx, (2, 1), RETRY_EXC, T0 + 9000, T0 + 9000 + 1036);
        assert!(liveness(&fx.input()).passed());
        // A plan that expects errors excuses any.
        fail_at(&mut fx, (0, 2), REM_ACCESS, T0, T0 + 1);
        fx.ev.expect_errors = true;
        assert!(liveness(&fx.input()).passed());
    }

    #[test]
    fn liveness_reports_errors_before_a_kill_a_killed_nodes_own_and_wrong_or_late_ones() {
        let mut fx = Fixture::new(4, Workload::StreamWrite);
        let kill = T0 + 1000;
        fx.fact(3).killed_at = Some(kill);
        fx.fact(3).drained = false;
        // 1 ms before the kill: not the kill's doing.
        fail_at(&mut fx, (0, 3), RETRY_EXC, T0, kill - 1);
        // After the kill, but a status a silent peer cannot cause.
        fail_at(&mut fx, (1, 3), REM_ACCESS, kill, kill + 10);
        // Past the bound (1036 ms) of the kill and of the last post.
        fail_at(&mut fx, (2, 3), RETRY_EXC, kill, kill + 1037);
        // The killed node's own error: nothing explains it.
        fail_at(&mut fx, (3, 0), RETRY_EXC, T0, kill - 5);
        let inv = liveness(&fx.input());
        assert_eq!(
            inv.violations,
            [
                "node 0 → node 3: IBV_WC_RETRY_EXC_ERR at +999 ms with no process fault to \
                 explain it",
                "node 1 → node 3: IBV_WC_REM_ACCESS_ERR at +1010 ms with no process fault to \
                 explain it",
                "node 2 → node 3: IBV_WC_RETRY_EXC_ERR at +2037 ms with no process fault to \
                 explain it",
                "node 3 → node 0: IBV_WC_RETRY_EXC_ERR at +995 ms with no process fault to \
                 explain it",
            ]
        );
    }

    #[test]
    fn liveness_a_pause_excuses_only_its_own_qps_and_only_for_a_while() {
        let mut fx = mesh();
        // Node 1 paused for the retry budget at T0.
        fx.fact(1).pauses = vec![(T0, 469)];
        // Nodes 0 and 2 are not paused: their QP has no excuse.
        fail_at(&mut fx, (0, 2), RETRY_EXC, T0, T0 + 600);
        // Long after the pause and its bound, with node 1's end of the QP still healthy.
        fail_at(&mut fx, (2, 1), RETRY_EXC, T0 + 9000, T0 + 9600);
        // Before the pause began.
        fail_at(&mut fx, (0, 1), RETRY_EXC, T0 - 600, T0 - 1);
        // A pause just short of the retry budget explains nothing.
        fx.fact(0).pauses = vec![(T0 + 20_000, 468)];
        fail_at(&mut fx, (1, 0), RETRY_EXC, T0 + 20_000, T0 + 20_100);
        let inv = liveness(&fx.input());
        assert_eq!(inv.violation_count, 4, "{inv:?}");
        assert!(inv.violations[0].starts_with("node 0 → node 1: IBV_WC_RETRY_EXC_ERR"));
        assert!(inv.violations[1].starts_with("node 0 → node 2: IBV_WC_RETRY_EXC_ERR"));
        assert!(inv.violations[2].starts_with("node 1 → node 0: IBV_WC_RETRY_EXC_ERR"));
        assert!(inv.violations[3].starts_with("node 2 → node 1: IBV_WC_RETRY_EXC_ERR"));
    }

    #[test]
    fn liveness_reports_nodes_that_did_not_end_well() {
        let mut fx = Fixture::new(5, Workload::StreamWrite);
        fx.fact(0).error = Some("device gone".to_owned());
        fx.fact(1).finished = false;
        fx.fact(2).drained = false;
        fx.fact(3).exited_cleanly = false;
        fx.fact(3).end_note = Some("signal 6".to_owned());
        fx.fact(4).killed_at = Some(T0 + 151);
        fx.fact(4).drained = false;
        let inv = liveness(&fx.input());
        assert_eq!(
            inv.violations,
            [
                "node 0 failed: device gone",
                "node 1 did not finish its workload",
                "node 2 did not drain when asked to quiesce",
                "node 3 did not exit cleanly: signal 6",
            ]
        );
        // Node 4 was killed: how it ended is not checked.
        assert_eq!(inv.checked, 4);
    }

    #[test]
    fn node_self_checks_report_every_problem_a_node_noticed() {
        let mut fx = mesh();
        assert!(node_self_checks(&fx.input()).passed());
        fx.fact(1).problems = vec!["pong 3 out of turn".to_owned(), "bad record".to_owned()];
        // A killed node's problems (streamed before its kill) count as much.
        fx.fact(2).killed_at = Some(T0 + 10);
        fx.fact(2).problems = vec!["receive slot 4: payload CRC mismatch".to_owned()];
        let inv = node_self_checks(&fx.input());
        assert_eq!(
            inv.violations,
            [
                "node 1: pong 3 out of turn",
                "node 1: bad record",
                "node 2: receive slot 4: payload CRC mismatch",
            ]
        );
        assert_eq!(inv.checked, 3);
    }
}
