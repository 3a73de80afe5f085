//! The invariants that compare what senders saw succeed with what is in the MR files:
//! `write-data`, `send-data`, `read-data` and `atomic-exactly-once`. Only successful
//! completions are checked; a failed operation may or may not have left bytes behind, and its
//! QP's later completions are `flush-after-error`'s business.

use std::collections::{BTreeMap, BTreeSet};

use super::{GoodRecv, Input, Invariant, SUCCESS, SendWc, compare, good_receives, sends};
use crate::run::layout::{self, RecordKind, Workload};
use crate::run::log::{Entry, LogRead, OpKind};

/// A successful send-queue completion on a link both ends have: node `i` → node `j`.
struct LinkOp {
    i: u32,
    j: u32,
    /// Position of `i` in `j`'s peer list (its link block at the target).
    tpos: usize,
    /// Position of `j` in `i`'s peer list (its link block at the issuer).
    mpos: usize,
    s: SendWc,
}

impl LinkOp {
    /// "node i → node j" (and " QP q" for a QP but the first), the start of the link's
    /// messages.
    fn link(&self) -> String {
        let link = super::Link {
            peer: self.j,
            qp: self.s.qp,
        };
        format!("node {} → {link}", self.i)
    }
}

/// Sorts node `i`'s completion `s`: `Ok(Some)` to check, `Ok(None)` for a failed one,
/// `Err` (a `write-data` violation) for one that names a node outside the run, or, when it
/// succeeded, a node that is not a peer.
fn link_op(input: &Input<'_>, i: u32, s: SendWc) -> Result<Option<LinkOp>, String> {
    let j = s.peer;
    if j >= input.ev.nodes {
        return Err(format!("node {i}: completion for unknown peer {j}"));
    }
    if s.status != SUCCESS {
        return Ok(None);
    }
    match (input.position(j, i, s.qp), input.position(i, j, s.qp)) {
        (Some(tpos), Some(mpos)) => Ok(Some(LinkOp {
            i,
            j,
            tpos,
            mpos,
            s,
        })),
        _ => Err(format!(
            "node {i}: completion for node {j}, which is not its peer"
        )),
    }
}

/// Node `i`'s successful completions of `op` on its links, in log order.
fn link_ops<'a>(input: &'a Input<'_>, i: u32, op: OpKind) -> impl Iterator<Item = LinkOp> + 'a {
    input
        .log(i)
        .into_iter()
        .flat_map(sends)
        .filter(move |s| s.op == op)
        .filter_map(move |s| link_op(input, i, s).ok().flatten())
}

/// `write-data`: every successful WRITE left its record, byte for byte, in the target's
/// write area at the logged offset, and every successful fin WRITE left 1 in the target's
/// fin word for the issuer. Also charged here: a completion naming a node outside the run
/// (whatever its status) or a successful one naming a node that is not a peer. Excused:
/// nothing.
pub(super) fn write_data(input: &Input<'_>) -> Invariant {
    let mut inv = Invariant::new("write-data");
    for i in input.nodes() {
        let Some(log) = input.log(i) else {
            continue;
        };
        for s in sends(log) {
            match link_op(input, i, s) {
                Err(msg) => inv.fail(msg),
                Ok(Some(op)) if matches!(s.op, OpKind::Write | OpKind::Fin) => {
                    check_write(&mut inv, input, &op);
                }
                Ok(_) => {}
            }
        }
    }
    inv
}

/// Checks one successful WRITE or fin WRITE at its target.
fn check_write(inv: &mut Invariant, input: &Input<'_>, op: &LinkOp) {
    let (ev, s, link) = (input.ev, &op.s, op.link());
    let target = input.mr(op.j);
    inv.checked += 1;
    if s.op == OpKind::Fin {
        let off = layout::FIN_OFF + 8 * op.tpos as u64;
        compare(inv, target, off, &1u64.to_le_bytes(), || {
            format!("{link} fin word")
        });
        return;
    }
    let want = layout::record(
        ev.seed,
        RecordKind::Write,
        op.i,
        op.j,
        s.seq,
        0,
        s.len as usize,
    );
    let off = layout::link_base(op.tpos) + layout::WRITE_OFF + s.roff.unwrap_or(0);
    compare(inv, target, off, &want, || {
        format!(
            "{link} WRITE record {} ({} bytes at +{:#x})",
            s.seq, s.len, off
        )
    });
}

/// `send-data`: every successful SEND left its record, byte for byte, in the target's receive
/// slot `seq` for the issuer; and every successful receive completion's slot holds a
/// well-formed record numbered for that slot, carrying the completion's immediate data, from
/// a peer. Excused: nothing.
pub(super) fn send_data(input: &Input<'_>) -> Invariant {
    let mut inv = Invariant::new("send-data");
    for i in input.nodes() {
        let Some(log) = input.log(i) else {
            continue;
        };
        for op in link_ops(input, i, OpKind::Send) {
            check_sent(&mut inv, input, &op);
        }
        for recv in good_receives(log) {
            check_received(&mut inv, input, i, recv);
        }
    }
    inv
}

/// Checks one successful SEND at its target's receive slot.
fn check_sent(inv: &mut Invariant, input: &Input<'_>, op: &LinkOp) {
    let (s, link) = (&op.s, op.link());
    inv.checked += 1;
    let (Some(kind), Some(imm)) = (s.kind, s.imm) else {
        inv.fail(format!("{link} SEND wr {} logged without kind/imm", s.wr));
        return;
    };
    let want = layout::record(input.ev.seed, kind, op.i, op.j, s.seq, imm, s.len as usize);
    let off = layout::link_base(op.tpos) + layout::RECV_OFF + s.seq * layout::RECV_SLOT;
    compare(inv, input.mr(op.j), off, &want, || {
        format!("{link} SEND {} (slot {}, imm {imm:#x})", s.wr, s.seq)
    });
}

/// Checks the receive slot of node `i`'s successful receive completion (peer, wr_id, bytes,
/// immediate data).
fn check_received(inv: &mut Invariant, input: &Input<'_>, i: u32, (peer, wr, len, imm): GoodRecv) {
    inv.checked += 1;
    let Some(pos) = input.position(i, peer.peer, peer.qp) else {
        inv.fail(format!("node {i}: receive from node {peer}, not a peer"));
        return;
    };
    let slot = wr.saturating_sub(1);
    let off = layout::link_base(pos) + layout::RECV_OFF + slot * layout::RECV_SLOT;
    let bytes = input.mr(i).and_then(|m| m.get(off, len as usize));
    let what = format!("node {i} receive slot {slot} from {peer}");
    match bytes.as_deref().map(layout::check_record) {
        None => inv.fail(format!("{what}: unreadable")),
        Some(Err(e)) => inv.fail(format!("{what}: {e}")),
        Some(Ok((_, seq, rimm))) => {
            if Some(rimm) != imm {
                inv.fail(format!(
                    "{what}: record immediate {rimm:#x}, completion {imm:?}"
                ));
            }
            if seq != slot {
                inv.fail(format!("{what}: holds record {seq}"));
            }
        }
    }
}

/// `read-data`: every successful READ landed, byte for byte, the logged stretch of the
/// peer's pattern in the issuer's landing area; and every node's own pattern is intact in its
/// MR file. Excused: nothing (a node without an MR file has no pattern to check).
pub(super) fn read_data(input: &Input<'_>) -> Invariant {
    let mut inv = Invariant::new("read-data");
    for i in input.nodes() {
        for op in link_ops(input, i, OpKind::Read) {
            let (s, link) = (&op.s, op.link());
            inv.checked += 1;
            let roff = s.roff.unwrap_or(0);
            let want = layout::pattern(input.ev.seed, op.j, roff, s.len as usize);
            let off = layout::link_base(op.mpos) + layout::READ_OFF + s.loff.unwrap_or(0);
            compare(&mut inv, input.mr(i), off, &want, || {
                format!(
                    "{link} READ {} ({} bytes of the pattern at +{roff:#x})",
                    s.seq, s.len
                )
            });
        }
    }
    for i in input.nodes() {
        if let Some(m) = input.mr(i) {
            inv.checked += 1;
            let want = layout::pattern(input.ev.seed, i, 0, layout::PATTERN_LEN as usize);
            compare(&mut inv, Some(m), layout::PATTERN_OFF, &want, || {
                format!("node {i} READ pattern")
            });
        }
    }
    inv
}

/// FETCH_ADDs per target node, gathered per issuer.
#[derive(Default)]
struct FaaTally {
    /// Successes per target: (issuer, wr_id, fetched value).
    ok: BTreeMap<u32, Vec<(u32, u64, u64)>>,
    /// Per target, per issuer: how many FETCH_ADDs may have executed beyond its successes —
    /// its failed completions, plus, if it did not drain, the most it can have had posted
    /// but not logged ([`layout::window`]).
    extra: BTreeMap<u32, BTreeMap<u32, Extra>>,
}

/// FETCH_ADDs of one issuer to one target that may have executed without a logged success.
#[derive(Copy, Clone, Default)]
struct Extra {
    /// Failed completions.
    failed: u64,
    /// Posted but never logged: 0 for an issuer that drained, at most one window otherwise.
    unlogged: u64,
}

impl FaaTally {
    /// Counts node `i`'s failed FETCH_ADDs per target, and, if `i` did not drain, one window
    /// of unlogged ones for every peer its workload may send FETCH_ADDs to — whether or not a
    /// FETCH_ADD to that peer was logged before it was killed (successes are added by the
    /// caller, once their landing slot is checked).
    fn count_issuer(&mut self, input: &Input<'_>, i: u32, log: &LogRead) {
        let (nodes, workload) = (input.ev.nodes, input.ev.workload);
        for s in sends(log).filter(|s| s.op == OpKind::Faa && s.peer < nodes) {
            let extra = self.extra.entry(s.peer).or_default().entry(i).or_default();
            if s.status != SUCCESS {
                extra.failed += 1;
            }
        }
        let drained = log.entries.iter().any(|e| matches!(e, Entry::End { .. }));
        if drained || !matches!(workload, Workload::AtomicCounter | Workload::Mixed) {
            return;
        }
        for j in layout::peers(nodes, workload, i) {
            let extra = self.extra.entry(j).or_default().entry(i).or_default();
            extra.unlogged = layout::window(workload) as u64;
        }
    }

    /// Every node some FETCH_ADD was sent to.
    fn targets(&self) -> BTreeSet<u32> {
        self.ok.keys().chain(self.extra.keys()).copied().collect()
    }
}

/// `atomic-exactly-once`: every successful FETCH_ADD's fetched value is logged and is in the
/// issuer's landing slot; per target, no value was fetched twice and each is below the final
/// counter, and the counter is at least the number of successes and at most that number plus,
/// per issuer, its failed FETCH_ADDs and — for an issuer that did not drain (killed) — one
/// window of FETCH_ADDs posted but never logged ([`layout::window`]). So the upper bound holds
/// per issuer: one killed issuer does not lift it for the others. Excused: nothing. Fills
/// `counters` with each target's final value.
pub(super) fn atomic_exactly_once(
    input: &Input<'_>,
    counters: &mut BTreeMap<u32, u64>,
) -> Invariant {
    let mut inv = Invariant::new("atomic-exactly-once");
    let mut tally = FaaTally::default();
    for i in input.nodes() {
        let Some(log) = input.log(i) else {
            continue;
        };
        tally.count_issuer(input, i, log);
        for op in link_ops(input, i, OpKind::Faa) {
            if let Some(val) = check_landing_slot(&mut inv, input, &op) {
                tally.ok.entry(op.j).or_default().push((i, op.s.wr, val));
            }
        }
    }
    for t in tally.targets() {
        let Some(counter) = input.mr(t).and_then(|m| m.word(layout::COUNTER_OFF)) else {
            inv.fail(format!("node {t}: counter unreadable"));
            continue;
        };
        counters.insert(t, counter);
        check_counter(&mut inv, t, counter, &tally);
    }
    inv
}

/// Checks that one successful FETCH_ADD's value is logged and in the issuer's landing slot;
/// the value, if logged.
fn check_landing_slot(inv: &mut Invariant, input: &Input<'_>, op: &LinkOp) -> Option<u64> {
    let (s, link) = (&op.s, op.link());
    inv.checked += 1;
    let Some(val) = s.val else {
        inv.fail(format!("{link} FETCH_ADD wr {} logged without value", s.wr));
        return None;
    };
    let off = layout::link_base(op.mpos) + layout::FAA_OFF + 8 * s.seq;
    match input.mr(op.i).and_then(|m| m.word(off)) {
        Some(landed) if landed != val => inv.fail(format!(
            "{link} FETCH_ADD wr {}: logged value {val}, landing slot holds {landed}",
            s.wr
        )),
        Some(_) => {}
        None => inv.fail(format!("{link}: FETCH_ADD landing slot unreadable")),
    }
    Some(val)
}

/// Checks target `t`'s final `counter` against the values fetched from it and the bounds.
fn check_counter(inv: &mut Invariant, t: u32, counter: u64, tally: &FaaTally) {
    let oks = tally.ok.get(&t).map_or(&[][..], Vec::as_slice);
    check_fetched_values(inv, t, counter, oks);
    let ok = oks.len() as u64;
    let no_extra = BTreeMap::new();
    let extra = tally.extra.get(&t).unwrap_or(&no_extra);
    let failed: u64 = extra.values().map(|e| e.failed).sum();
    let unlogged: u64 = extra.values().map(|e| e.unlogged).sum();
    let undrained: Vec<u32> = extra
        .iter()
        .filter(|(_, e)| e.unlogged > 0)
        .map(|(&i, _)| i)
        .collect();
    let upper = ok + failed + unlogged;
    let unlogged_note = if unlogged > 0 {
        format!(" + {unlogged} posted but not logged by issuers {undrained:?} that did not drain")
    } else {
        String::new()
    };
    if counter < ok {
        inv.fail(format!(
            "node {t} counter is {counter}, below the {ok} successful FETCH_ADDs"
        ));
    } else if failed + unlogged == 0 && counter != ok {
        inv.fail(format!(
            "node {t} counter is {counter}, but exactly {ok} FETCH_ADDs were posted and all \
             succeeded"
        ));
    } else if counter > upper {
        inv.fail(format!(
            "node {t} counter is {counter}, above {ok} successful + {failed} failed \
             FETCH_ADDs{unlogged_note}"
        ));
    } else {
        inv.note(format!(
            "node {t} counter {counter}: {ok} successful, {failed} failed \
             FETCH_ADDs{unlogged_note}"
        ));
    }
}

/// Checks that the values fetched from target `t` ((issuer, wr_id, value) in issuer order)
/// are distinct and below its final `counter`.
fn check_fetched_values(inv: &mut Invariant, t: u32, counter: u64, oks: &[(u32, u64, u64)]) {
    let mut seen: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
    for &(issuer, wr, val) in oks {
        if let Some((other, owr)) = seen.insert(val, (issuer, wr)) {
            inv.fail(format!(
                "node {t} counter: value {val} fetched twice (node {other} wr {owr}, node \
                 {issuer} wr {wr}): an atomic executed more than once or not atomically"
            ));
        }
        if val >= counter {
            inv.fail(format!(
                "node {t} counter: node {issuer} wr {wr} fetched {val}, but the final value \
                 is {counter}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::{Fixture, SEED};
    use super::super::{RETRY_EXC, SUCCESS};
    use super::*;

    #[test]
    fn every_data_invariant_holds_on_a_correct_run() {
        let fx = Fixture::busy(100);
        let input = fx.input();
        let mut counters = BTreeMap::new();
        for (inv, checked) in [
            (write_data(&input), 4),
            (send_data(&input), 4),
            (read_data(&input), 4),
            (atomic_exactly_once(&input, &mut counters), 2),
        ] {
            assert!(inv.passed(), "{inv:?}");
            assert_eq!(inv.checked, checked, "{}", inv.name);
        }
        assert_eq!(counters, BTreeMap::from([(0, 1), (1, 1)]));
    }

    #[test]
    fn write_data_reports_a_damaged_record_and_a_missing_fin_word() {
        let mut fx = Fixture::new(2, Workload::StreamWrite);
        let record = fx.write(0, 1);
        let fin = fx.fin(0, 1);
        fx.flip(1, record + 40);
        fx.put(1, fin, &[0; 8]);
        assert_eq!(
            write_data(&fx.input()).violations,
            [
                format!(
                    "node 0 → node 1 WRITE record 0 (64 bytes at +{record:#x}): 1 of 64 bytes \
                     differ at the target, first at byte 40"
                ),
                "node 0 → node 1 fin word: 1 of 8 bytes differ at the target, first at byte 0"
                    .to_owned(),
            ]
        );
    }

    #[test]
    fn write_data_reports_completions_for_strangers_and_missing_files() {
        // Nodes 0 and 2 of a ring of 5 are not peers.
        let mut fx = Fixture::new(5, Workload::StreamWrite);
        fx.write(0, 1);
        let mut wc = fx.next_wc(0, 2, OpKind::Write);
        fx.push(0, wc.clone().entry());
        wc.peer = 9;
        wc.status = RETRY_EXC;
        fx.push(0, wc.entry());
        fx.data[1].mr = None;
        assert_eq!(
            write_data(&fx.input()).violations,
            [
                "node 0 → node 1 WRITE record 0 (64 bytes at +0x15000): outside the \
                 target's file",
                "node 0: completion for node 2, which is not its peer",
                "node 0: completion for unknown peer 9",
            ]
        );
    }

    #[test]
    fn send_data_reports_a_damaged_slot_on_both_ends() {
        let mut fx = Fixture::new(2, Workload::Mixed);
        let slot = fx.send(0, 1, 0x11);
        fx.send(0, 1, 0x22);
        fx.flip(1, slot + 40);
        // The second receive completion says another immediate than its record carries.
        if let Some(Entry::Recv { imm, .. }) = fx.log(1).entries.last_mut() {
            *imm = Some(0x33);
        }
        let inv = send_data(&fx.input());
        assert_eq!(
            inv.violations,
            [
                "node 0 → node 1 SEND 1 (slot 0, imm 0x11): 1 of 48 bytes differ at the \
                 target, first at byte 40",
                "node 1 receive slot 0 from node 0: payload CRC mismatch",
                "node 1 receive slot 1 from node 0: record immediate 0x22, completion Some(51)",
            ]
        );
    }

    #[test]
    fn send_data_reports_a_send_logged_without_kind_and_a_slot_with_another_record() {
        let mut fx = Fixture::new(2, Workload::Mixed);
        let mut wc = fx.next_wc(0, 1, OpKind::Send);
        wc.imm = Some(1);
        fx.push(0, wc.entry());
        fx.send(1, 0, 5);
        // Node 0's second slot from node 1 gets the record of the first.
        let first = fx.link_base(0, 1) + layout::RECV_OFF;
        let record = layout::record(SEED, RecordKind::Send, 1, 0, 0, 5, 48);
        fx.put(0, first + layout::RECV_SLOT, &record);
        fx.push(
            0,
            Entry::Recv {
                peer: 1,
                qp: 0,
                wr: 2,
                status: SUCCESS,
                at: fx.now,
                len: 48,
                imm: Some(5),
            },
        );
        assert_eq!(
            send_data(&fx.input()).violations,
            [
                "node 0 → node 1 SEND wr 1 logged without kind/imm",
                "node 0 receive slot 1 from node 1: holds record 0",
            ]
        );
    }

    #[test]
    fn read_data_reports_a_wrong_landing_and_a_damaged_pattern() {
        let mut fx = Fixture::new(2, Workload::ReadVerify);
        let landed = fx.read(0, 1, 8);
        fx.flip(0, landed + 3);
        fx.flip(1, layout::PATTERN_OFF + 5);
        assert_eq!(
            read_data(&fx.input()).violations,
            [
                "node 0 → node 1 READ 0 (32 bytes of the pattern at +0x8): 1 of 32 bytes \
                 differ at the target, first at byte 3",
                "node 1 READ pattern: 1 of 65536 bytes differ at the target, first at byte 5",
            ]
        );
    }

    #[test]
    fn atomic_exactly_once_reports_a_value_fetched_twice() {
        let mut fx = Fixture::new(3, Workload::AtomicCounter);
        fx.faa(1, 0);
        fx.faa(2, 0);
        // Node 2's FETCH_ADD executed twice: it fetched 1 and the counter is 3, but it and the
        // landing slot say 0 (as if it had executed before node 1's).
        let slot = fx.faa(2, 0);
        fx.put(2, slot, &1u64.to_ne_bytes());
        if let Some(Entry::Send { val, .. }) = fx.log(2).entries.last_mut() {
            *val = Some(1);
        }
        fx.end_all();
        let mut counters = BTreeMap::new();
        let inv = atomic_exactly_once(&fx.input(), &mut counters);
        assert_eq!(
            inv.violations,
            [
                "node 0 counter: value 1 fetched twice (node 2 wr 1, node 2 wr 2): an atomic \
                 executed more than once or not atomically",
            ]
        );
        assert_eq!(counters[&0], 3);
    }

    #[test]
    fn atomic_exactly_once_reports_a_counter_off_the_bounds_and_a_wrong_landing_slot() {
        let mut fx = Fixture::new(2, Workload::AtomicCounter);
        let slot = fx.faa(1, 0);
        fx.faa(0, 0);
        fx.put(1, slot, &5u64.to_ne_bytes());
        fx.end_all();
        // An increment nobody saw: the counter is 3 after two FETCH_ADDs that both succeeded.
        fx.put(0, layout::COUNTER_OFF, &3u64.to_ne_bytes());
        let inv = atomic_exactly_once(&fx.input(), &mut BTreeMap::new());
        assert_eq!(
            inv.violations,
            [
                "node 1 → node 0 FETCH_ADD wr 1: logged value 0, landing slot holds 5",
                "node 0 counter is 3, but exactly 2 FETCH_ADDs were posted and all succeeded",
            ]
        );
        // With one failed FETCH_ADD, 3 is out of bounds too; below the successes always is.
        fx.fail(1, 0, OpKind::Faa, RETRY_EXC);
        fx.put(0, layout::COUNTER_OFF, &4u64.to_ne_bytes());
        let inv = atomic_exactly_once(&fx.input(), &mut BTreeMap::new());
        assert_eq!(
            inv.violations[1],
            "node 0 counter is 4, above 2 successful + 1 failed FETCH_ADDs"
        );
        fx.put(0, layout::COUNTER_OFF, &1u64.to_ne_bytes());
        let inv = atomic_exactly_once(&fx.input(), &mut BTreeMap::new());
        assert!(
            inv.violations[1..]
                .contains(&"node 0 counter is 1, below the 2 successful FETCH_ADDs".to_owned())
        );
    }

    /// A killed issuer may have posted a window of FETCH_ADDs to a peer before any of them
    /// completed: its log then names no FETCH_ADD to that peer, and the bound still counts
    /// them. An issuer that drained gets no such allowance.
    #[test]
    fn atomic_exactly_once_allows_a_window_to_every_peer_of_a_killed_issuer() {
        let mut fx = Fixture::new(3, Workload::Mixed);
        fx.faa(1, 0);
        fx.end(0);
        fx.end(1);
        // Node 2 was killed with FETCH_ADDs to node 0 posted but none completed or logged.
        fx.put(0, layout::COUNTER_OFF, &4u64.to_ne_bytes());
        let inv = atomic_exactly_once(&fx.input(), &mut BTreeMap::new());
        assert!(inv.passed(), "{inv:?}");
        assert!(
            inv.notes.contains(
                &"node 0 counter 4: 1 successful, 0 failed FETCH_ADDs + 16 posted but not \
                  logged by issuers [2] that did not drain"
                    .to_owned()
            ),
            "{:?}",
            inv.notes
        );
        fx.put(0, layout::COUNTER_OFF, &18u64.to_ne_bytes());
        let inv = atomic_exactly_once(&fx.input(), &mut BTreeMap::new());
        assert!(!inv.passed(), "a window is the most: {inv:?}");
        fx.end(2);
        fx.put(0, layout::COUNTER_OFF, &2u64.to_ne_bytes());
        let inv = atomic_exactly_once(&fx.input(), &mut BTreeMap::new());
        assert_eq!(
            inv.violations,
            ["node 0 counter is 2, but exactly 1 FETCH_ADDs were posted and all succeeded"]
        );
    }

    #[test]
    fn atomic_exactly_once_accepts_failures_within_bounds_and_undrained_issuers() {
        let mut fx = Fixture::new(3, Workload::AtomicCounter);
        fx.faa(1, 0);
        fx.fail(1, 0, OpKind::Faa, RETRY_EXC);
        fx.end(0);
        fx.end(1);
        fx.end(2);
        // The failed FETCH_ADD may or may not have executed.
        fx.put(0, layout::COUNTER_OFF, &2u64.to_ne_bytes());
        let inv = atomic_exactly_once(&fx.input(), &mut BTreeMap::new());
        assert!(inv.passed(), "{inv:?}");
        assert_eq!(
            inv.notes,
            ["node 0 counter 2: 1 successful, 1 failed FETCH_ADDs"]
        );
        // Node 2 did not drain: up to one window (4) of its FETCH_ADDs may have executed
        // without a log line, and no more.
        fx.log(2)
            .entries
            .retain(|e| !matches!(e, Entry::End { .. }));
        fx.faa(2, 0);
        fx.put(0, layout::COUNTER_OFF, &7u64.to_ne_bytes());
        let inv = atomic_exactly_once(&fx.input(), &mut BTreeMap::new());
        assert!(inv.passed(), "{inv:?}");
        assert_eq!(
            inv.notes[0],
            "node 0 counter 7: 2 successful, 1 failed FETCH_ADDs + 4 posted but not logged by \
             issuers [2] that did not drain"
        );
        fx.put(0, layout::COUNTER_OFF, &8u64.to_ne_bytes());
        let inv = atomic_exactly_once(&fx.input(), &mut BTreeMap::new());
        assert_eq!(
            inv.violations,
            [
                "node 0 counter is 8, above 2 successful + 1 failed FETCH_ADDs + 4 posted but \
                 not logged by issuers [2] that did not drain"
            ]
        );
    }

    #[test]
    fn atomic_exactly_once_keeps_the_bound_of_drained_issuers_when_another_was_killed() {
        // Issuers 1 and 2 drained, each with 3 successes; issuer 3 was killed after one.
        let mut fx = Fixture::new(4, Workload::AtomicCounter);
        for _ in 0..3 {
            fx.faa(1, 0);
            fx.faa(2, 0);
        }
        fx.faa(3, 0);
        fx.end(0);
        fx.end(1);
        fx.end(2);
        fx.fact(3).killed_at = Some(fx.now);
        // Issuer 1's last FETCH_ADD executed a second time, and issuer 3 had all of its window
        // (4) posted and executed but not logged: one more than the bound.
        let counter = 7 + 4 + 1;
        fx.put(0, layout::COUNTER_OFF, &(counter as u64).to_ne_bytes());
        let inv = atomic_exactly_once(&fx.input(), &mut BTreeMap::new());
        assert_eq!(
            inv.violations,
            [
                "node 0 counter is 12, above 7 successful + 0 failed FETCH_ADDs + 4 posted but \
                 not logged by issuers [3] that did not drain"
            ]
        );
    }
}
