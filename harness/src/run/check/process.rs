//! The invariants about processes and process faults: `dead-peer-detection`, `liveness` and
//! `node-self-checks`. They judge error completions against what the orchestrator did to the
//! nodes (kills, pauses) and how each node ended; they do not look at memory.

use std::collections::BTreeMap;

use super::{Input, Invariant, NodeFacts, RETRY_EXC, RNR_RETRY_EXC, SUCCESS, SendWc, sends};
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

    /// Node `i` was paused long enough (pause + one ACK timeout ≥ the retry budget) for its
    /// peers to give up on it, or for it to give up on them.
    fn long_pause(&self, i: u32) -> bool {
        let timeout_ms = self.ev.qp.ack_timeout().as_millis() as u64;
        let budget_ms = self.budget_ms();
        self.fact(i)
            .pauses
            .iter()
            .any(|&(_, d)| d + timeout_ms >= budget_ms)
    }
}

/// `dead-peer-detection`: for every killed node, each of its partners' QP to it ends, first,
/// in IBV_WC_RETRY_EXC_ERR or IBV_WC_RNR_RETRY_EXC_ERR, within the bound (retry budget +
/// slack, plus the partner's own pause time) of the kill or of the WR's posting, if later.
/// Excused (notes): a partner killed itself within the bound of the kill, and a partner that
/// had finished with the dead node (a successful fin WRITE) before the kill; a partner
/// without a log is skipped. Records each latency in `detections`.
pub(super) fn dead_peer_detection(
    input: &Input<'_>,
    detections: &mut Vec<(u32, u32, u64)>,
) -> Invariant {
    let mut inv = Invariant::new("dead-peer-detection");
    for b in input.nodes() {
        let Some(kill) = input.fact(b).killed_at else {
            continue;
        };
        for a in layout::peers(input.ev.nodes, input.ev.workload, b) {
            if a != b {
                check_detection(&mut inv, input, (a, b, kill), detections);
            }
        }
    }
    inv
}

/// Checks how partner `a` detected that `b` was killed at `kill`.
fn check_detection(
    inv: &mut Invariant,
    input: &Input<'_>,
    (a, b, kill): (u32, u32, u64),
    detections: &mut Vec<(u32, u32, u64)>,
) {
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
    let on_link: Vec<SendWc> = sends(log).filter(|s| s.peer == b).collect();
    if on_link
        .iter()
        .any(|s| s.op == OpKind::Fin && s.status == SUCCESS && s.at <= kill)
    {
        inv.note(format!(
            "node {a} had finished with node {b} before the kill"
        ));
        return;
    }
    let Some(first) = on_link.iter().find(|s| s.status != SUCCESS) else {
        inv.fail(format!(
            "node {a}: no error on its QP to node {b} after node {b} was killed"
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
    let paused: u64 = input.fact(a).pauses.iter().map(|&(_, d)| d).sum();
    let bound_ms = input.bound_ms();
    if latency > bound_ms + paused {
        inv.fail(format!(
            "node {a} → dead node {b}: {name} after {latency} ms, above the bound of \
             {bound_ms} ms ((retry_cnt + 1) × ACK timeout + slack)"
        ));
    }
    Some((a, b, latency))
}

/// `liveness`: every node that was not killed finished its workload, drained when asked,
/// and exited 0, without sending an `error`; and every QP's first error completion (on
/// either queue) is explained. Excused: errors when the plan expects them (`expect_errors`),
/// on a node that was killed, on a QP to a node killed no later than 50 ms after the error,
/// and on a QP one of whose ends was paused for about the retry budget or longer.
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
        for (peer, (status, at)) in first_errors(log) {
            inv.checked += 1;
            if !error_explained(input, i, peer, at) {
                inv.fail(format!(
                    "node {i} → node {peer}: {} with no process fault to explain it",
                    super::status_name(status)
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

/// Per peer, the first error completion (send or receive queue): status and poll time.
fn first_errors(log: &LogRead) -> BTreeMap<u32, (u32, u64)> {
    let mut first = BTreeMap::new();
    for e in &log.entries {
        let (Entry::Send {
            peer, status, at, ..
        }
        | Entry::Recv {
            peer, status, at, ..
        }) = *e
        else {
            continue;
        };
        if status != SUCCESS {
            first.entry(peer).or_insert((status, at));
        }
    }
    first
}

/// Whether a process fault (or the plan) explains node `i`'s error at `at` on its QP to
/// `peer`.
fn error_explained(input: &Input<'_>, i: u32, peer: u32, at: u64) -> bool {
    input.ev.expect_errors
        || input.fact(peer).killed_at.is_some_and(|k| at + 50 >= k)
        || input.fact(i).killed_at.is_some()
        || input.long_pause(i)
        || input.long_pause(peer)
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
    fn liveness_holds_for_errors_a_process_fault_explains() {
        let mut fx = mesh();
        // Node 2 was killed 30 ms after node 0's error on it; node 2's own errors are its kill's.
        fx.fact(2).killed_at = Some(T0 + 130);
        fail_at(&mut fx, (0, 2), RETRY_EXC, T0, T0 + 100);
        fail_at(&mut fx, (2, 1), RETRY_EXC, T0, T0 + 100);
        let inv = liveness(&fx.input());
        assert!(inv.passed(), "{inv:?}");
        // Nodes 0 and 1 ended, and two QPs had errors.
        assert_eq!(inv.checked, 4);
        // Node 1 paused about the retry budget: its QP to node 0 may fail, on both ends.
        fx.fact(1).pauses = vec![(T0, 536 - 67)];
        fail_at(&mut fx, (0, 1), RETRY_EXC, T0, T0 + 100);
        fail_at(&mut fx, (1, 0), RETRY_EXC, T0, T0 + 100);
        assert!(liveness(&fx.input()).passed());
        // A plan that expects errors excuses any.
        fail_at(&mut fx, (1, 2), REM_ACCESS, T0, T0 + 100);
        fx.ev.expect_errors = true;
        assert!(liveness(&fx.input()).passed());
    }

    #[test]
    fn liveness_reports_unexplained_errors_and_nodes_that_did_not_end_well() {
        let mut fx = Fixture::new(5, Workload::StreamWrite);
        fx.fact(0).error = Some("device gone".to_owned());
        fx.fact(1).finished = false;
        fx.fact(2).drained = false;
        fx.fact(3).exited_cleanly = false;
        fx.fact(3).end_note = Some("signal 6".to_owned());
        // Node 4 was killed too late to explain its ring neighbour's error 51 ms before, and
        // a pause just short of the retry budget explains nothing.
        fail_at(&mut fx, (0, 4), RETRY_EXC, T0, T0 + 100);
        fx.fact(4).killed_at = Some(T0 + 151);
        fx.fact(4).drained = false;
        fx.fact(4).pauses = vec![(T0, 536 - 68)];
        let inv = liveness(&fx.input());
        assert_eq!(
            inv.violations,
            [
                "node 0 failed: device gone",
                "node 0 → node 4: IBV_WC_RETRY_EXC_ERR with no process fault to explain it",
                "node 1 did not finish its workload",
                "node 2 did not drain when asked to quiesce",
                "node 3 did not exit cleanly: signal 6",
            ]
        );
        // Node 4 was killed: how it ended is not checked.
        assert_eq!(inv.checked, 5);
    }

    #[test]
    fn node_self_checks_report_every_problem_a_node_noticed() {
        let mut fx = mesh();
        assert!(node_self_checks(&fx.input()).passed());
        fx.fact(1).problems = vec!["pong 3 out of turn".to_owned(), "bad record".to_owned()];
        let inv = node_self_checks(&fx.input());
        assert_eq!(
            inv.violations,
            ["node 1: pong 3 out of turn", "node 1: bad record"]
        );
        assert_eq!(inv.checked, 3);
    }
}
