//! The invariant that matches the two ends of every SEND: `send-delivery`. It reads both
//! nodes' completion logs; the bytes in the receive slots are `send-data`'s business.

use std::collections::{BTreeMap, HashSet};

use super::{Input, Invariant, Link, SUCCESS, good_receives, sends};
use crate::run::layout::{self, RecordKind, Workload};
use crate::run::log::{Entry, LogRead, OpKind};

/// One node's successful receive completions per link (peer and QP): wr_id → (bytes,
/// immediate data) of each completion with that wr_id.
type Received = BTreeMap<Link, BTreeMap<u64, Vec<(u32, Option<u32>)>>>;

fn received(log: &LogRead) -> Received {
    let mut got: Received = BTreeMap::new();
    for (peer, wr, len, imm) in good_receives(log) {
        got.entry(peer)
            .or_default()
            .entry(wr)
            .or_default()
            .push((len, imm));
    }
    got
}

/// `send-delivery`: every SEND its sender saw succeed is matched to exactly one successful
/// receive completion at the receiver — the one for its receive slot (wr_id = slot + 1) —
/// with the same byte count and immediate data; every successful receive completion is
/// matched to a SEND its sender logged (successful or not: the ACK may be what was lost); and
/// in `pingpong`, every ping that was delivered got its pong back. Excused: a receive
/// completion missing at a receiver killed within the slack (plus its pauses) of the SEND's
/// completion, before it could poll it; a receive completion whose sender did not drain; a
/// missing pong when the plan expects errors or a process fault or an error completion on
/// that QP explains it (either end killed or paused long, an error on either end).
pub(super) fn send_delivery(input: &Input<'_>) -> Invariant {
    let mut inv = Invariant::new("send-delivery");
    let got: Vec<Received> = input
        .nodes()
        .map(|i| input.log(i).map(received).unwrap_or_default())
        .collect();
    for i in input.nodes() {
        let Some(log) = input.log(i) else {
            continue;
        };
        for s in sends(log).filter(|s| s.op == OpKind::Send && s.status == SUCCESS) {
            let Some(at_peer) = got.get(s.peer as usize) else {
                continue;
            };
            inv.checked += 1;
            let back = Link { peer: i, qp: s.qp };
            let to = Link {
                peer: s.peer,
                qp: s.qp,
            };
            let matches = at_peer
                .get(&back)
                .and_then(|m| m.get(&(s.seq + 1)))
                .map_or(&[][..], Vec::as_slice);
            match matches {
                [] => missing_receive(&mut inv, input, i, &s),
                [(len, imm)] if *len == s.len && *imm == s.imm => {}
                [(len, imm)] => inv.fail(format!(
                    "node {i} → {to} SEND {} (slot {}): received as {len} bytes, imm \
                     {imm:?}; sent {} bytes, imm {:?}",
                    s.wr, s.seq, s.len, s.imm
                )),
                more => inv.fail(format!(
                    "node {i} → {to} SEND {} (slot {}): {} receive completions",
                    s.wr,
                    s.seq,
                    more.len()
                )),
            }
        }
        check_unsent(&mut inv, input, i, &got[i as usize]);
        if input.ev.workload == Workload::Pingpong {
            check_pongs(&mut inv, input, i, log, &got[i as usize]);
        }
    }
    inv
}

/// A successful SEND `s` of node `i` with no receive completion at its target.
fn missing_receive(inv: &mut Invariant, input: &Input<'_>, i: u32, s: &super::SendWc) {
    let j = s.peer;
    let allowance = input.ev.slack.as_millis() as u64 + input.paused_ms(j);
    if input
        .fact(j)
        .killed_at
        .is_some_and(|k| k <= s.at + allowance)
    {
        inv.note(format!(
            "node {i} → node {j} SEND {}: no receive completion; node {j} was killed before \
             it could log one",
            s.wr
        ));
        return;
    }
    inv.fail(format!(
        "node {i} → node {j} SEND {} (slot {}) completed successfully, but node {j} logged \
         no receive completion for it",
        s.wr, s.seq
    ));
}

/// Fails `inv` for each of node `i`'s successful receive completions (`got`) whose sender,
/// having drained, logged no SEND for that slot.
fn check_unsent(inv: &mut Invariant, input: &Input<'_>, i: u32, got: &Received) {
    // Per sender, the (QP, slot) of every SEND it logged to node `i`: one pass over each log.
    let mut logged: BTreeMap<u32, Option<HashSet<(u32, u64)>>> = BTreeMap::new();
    for (&link, per_wr) in got {
        let peer = link.peer;
        let Some(sent) = logged
            .entry(peer)
            .or_insert_with(|| sends_to(input, peer, i))
        else {
            continue;
        };
        for &wr in per_wr.keys() {
            inv.checked += 1;
            if !wr
                .checked_sub(1)
                .is_some_and(|slot| sent.contains(&(link.qp, slot)))
            {
                inv.fail(format!(
                    "node {i} receive slot {} from {link}: a receive completion for a SEND \
                     node {peer} never logged",
                    wr.saturating_sub(1)
                ));
            }
        }
    }
}

/// The (QP, slot) of every SEND node `peer` logged to node `i`, whatever its status; `None`
/// if `peer` has no log or did not drain (no end line).
fn sends_to(input: &Input<'_>, peer: u32, i: u32) -> Option<HashSet<(u32, u64)>> {
    let log = input.log(peer)?;
    if !log.entries.iter().any(|e| matches!(e, Entry::End { .. })) {
        return None;
    }
    Some(
        sends(log)
            .filter(|s| s.peer == i && s.op == OpKind::Send)
            .map(|s| (s.qp, s.seq))
            .collect(),
    )
}

/// In `pingpong`: fails `inv` for each ping of node `i` that was delivered (its SEND
/// succeeded) but whose pong never came back, unless a fault excuses it.
fn check_pongs(inv: &mut Invariant, input: &Input<'_>, i: u32, log: &LogRead, got: &Received) {
    for s in sends(log).filter(|s| s.status == SUCCESS && s.kind == Some(RecordKind::Ping)) {
        let Some(no) = s.imm else { continue };
        inv.checked += 1;
        let link = Link {
            peer: s.peer,
            qp: s.qp,
        };
        let pong = got
            .get(&link)
            .into_iter()
            .flat_map(|m| m.values().flatten())
            .any(|&(_, imm)| imm == Some(no | layout::PONG));
        if pong {
            continue;
        }
        if pong_excused(input, i, link) {
            inv.note(format!(
                "node {i} → {link}: no pong for ping {no}, explained by a fault"
            ));
        } else {
            inv.fail(format!(
                "node {i} → {link}: ping {no} was delivered but its pong never came back"
            ));
        }
    }
}

/// Whether a fault explains a missing pong between `i` and `j`: the plan expects errors,
/// either was killed or paused long, or either logged an error completion on their QP
/// (`link`: `j` and which of the QPs between them).
fn pong_excused(input: &Input<'_>, i: u32, link: Link) -> bool {
    let j = link.peer;
    let errored = |a: u32, b: u32| {
        input.log(a).is_some_and(|l| {
            l.entries.iter().any(|e| match *e {
                Entry::Send {
                    peer, qp, status, ..
                }
                | Entry::Recv {
                    peer, qp, status, ..
                } => peer == b && qp == link.qp && status != SUCCESS,
                _ => false,
            })
        })
    };
    input.ev.expect_errors
        || [i, j]
            .into_iter()
            .any(|n| input.fact(n).killed_at.is_some() || input.long_pauses(n).next().is_some())
        || errored(i, j)
        || errored(j, i)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::fixture::Fixture;
    use super::*;

    /// Removes node `i`'s receive completion from `peer` with wr_id `wr`.
    fn lose_receive(fx: &mut Fixture, i: u32, peer: u32, wr: u64) {
        fx.log(i)
            .entries
            .retain(|e| !matches!(e, Entry::Recv { peer: p, wr: w, .. } if *p == peer && *w == wr));
    }

    #[test]
    fn every_send_matched_to_one_receive_passes() {
        let mut fx = Fixture::new(2, Workload::Mixed);
        fx.send(0, 1, 7);
        fx.send(0, 1, 8);
        fx.send(1, 0, 9);
        fx.end_all();
        let inv = send_delivery(&fx.input());
        assert!(inv.passed(), "{inv:?}");
        // 3 SENDs, 3 receive completions.
        assert_eq!(inv.checked, 6);
    }

    #[test]
    fn a_lost_receive_completion_fails_unless_the_receiver_was_killed_first() {
        let mut fx = Fixture::new(2, Workload::Mixed);
        fx.send(0, 1, 7);
        fx.send(0, 1, 8);
        lose_receive(&mut fx, 1, 0, 2);
        let inv = send_delivery(&fx.input());
        assert_eq!(
            inv.violations,
            [
                "node 0 → node 1 SEND 2 (slot 1) completed successfully, but node 1 logged no \
                 receive completion for it"
            ]
        );
        // Killed within the slack of the completion: it may not have polled it.
        fx.fact(1).killed_at = Some(fx.now + 400);
        let inv = send_delivery(&fx.input());
        assert!(inv.passed(), "{inv:?}");
        assert_eq!(inv.notes.len(), 1);
        // Killed long after: it would have logged it.
        fx.fact(1).killed_at = Some(fx.now + 5000);
        assert_eq!(send_delivery(&fx.input()).violation_count, 1);
    }

    #[test]
    fn a_duplicated_or_different_receive_completion_fails() {
        let mut fx = Fixture::new(2, Workload::Mixed);
        fx.send(0, 1, 7);
        fx.send(0, 1, 8);
        let dup = fx.log(1).entries.last().cloned().unwrap();
        fx.push(1, dup);
        if let Some(Entry::Recv { len, .. }) = fx.log(1).entries.get_mut(1) {
            *len = 40;
        }
        let inv = send_delivery(&fx.input());
        assert_eq!(
            inv.violations,
            [
                "node 0 → node 1 SEND 1 (slot 0): received as 40 bytes, imm Some(7); sent 48 \
                 bytes, imm Some(7)",
                "node 0 → node 1 SEND 2 (slot 1): 2 receive completions",
            ]
        );
    }

    #[test]
    fn a_receive_completion_for_a_send_never_logged_fails() {
        let mut fx = Fixture::new(2, Workload::Mixed);
        fx.send(0, 1, 7);
        // Node 0's SEND vanishes from its log; node 0 drained.
        fx.log(0)
            .entries
            .retain(|e| !matches!(e, Entry::Send { .. }));
        fx.end_all();
        let inv = send_delivery(&fx.input());
        assert_eq!(
            inv.violations,
            [
                "node 1 receive slot 0 from node 0: a receive completion for a SEND node 0 never \
              logged"
            ]
        );
        // A sender that did not drain may have lost its log line in the kill.
        fx.log(0)
            .entries
            .retain(|e| !matches!(e, Entry::End { .. }));
        assert!(send_delivery(&fx.input()).passed());
    }

    #[test]
    fn a_pong_that_never_came_fails_unless_a_fault_explains_it() {
        let mut fx = Fixture::new(2, Workload::Pingpong);
        fx.send_as(0, 1, RecordKind::Ping, 1);
        fx.send_as(1, 0, RecordKind::Pong, 1 | layout::PONG);
        fx.send_as(0, 1, RecordKind::Ping, 2);
        let inv = send_delivery(&fx.input());
        assert_eq!(
            inv.violations,
            ["node 0 → node 1: ping 2 was delivered but its pong never came back"]
        );
        // An error on the QP (the pong ran out of retries) explains it.
        fx.fail(1, 0, OpKind::Send, super::super::RETRY_EXC);
        let inv = send_delivery(&fx.input());
        assert!(inv.passed(), "{inv:?}");
        assert_eq!(
            inv.notes,
            ["node 0 → node 1: no pong for ping 2, explained by a fault"]
        );
    }
}
