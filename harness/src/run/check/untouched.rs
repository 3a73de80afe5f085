//! The invariant about memory nobody addressed: `untouched-memory`. From every completion
//! logged on both ends of each link (whatever its status: a failed operation may still have
//! placed its bytes) it rebuilds the byte ranges an operation could have written in a node's
//! MR file, and checks that every byte outside them is still zero. It does not check what is
//! inside the ranges (`write-data`, `send-data`, `read-data` and `atomic-exactly-once` do).

use super::mr::MrFile;
use std::collections::BTreeMap;

use super::{Input, Invariant, Link, MAX_MESSAGES, SendWc, sends};
use crate::run::layout;
use crate::run::log::{Entry, LogRead, OpKind};

/// Byte ranges `[start, end)` of one MR file.
type Ranges = Vec<(u64, u64)>;

/// `untouched-memory`: in every node's MR file, every byte outside the ranges the run could
/// have written is zero. The ranges: the counter word, the fin words of its peers, its READ
/// pattern, its staging buffers, and per link the bytes each logged WRITE, SEND, READ and
/// FETCH_ADD addresses (the records' padding to 8 bytes and the rest of each receive slot
/// are outside). Excused: everything past the last logged operation of a kind, on a link whose
/// issuer did not drain (it may have had operations posted but not logged); a node without
/// an MR file (nothing to check).
pub(super) fn untouched_memory(input: &Input<'_>) -> Invariant {
    let mut inv = Invariant::new("untouched-memory");
    for i in input.nodes() {
        let Some(mr) = input.mr(i) else {
            continue;
        };
        inv.checked += 1;
        let ranges = merge(allowed(input, i));
        report_outside(&mut inv, input, i, mr, &ranges);
    }
    inv
}

/// Fails `inv` once per stretch of non-zero bytes of node `i`'s `mr` outside `ranges`
/// (sorted, disjoint).
fn report_outside(inv: &mut Invariant, input: &Input<'_>, i: u32, mr: &MrFile, ranges: &Ranges) {
    let len = mr.len();
    let mut gaps = Vec::new();
    let mut at = 0u64;
    for &(s, e) in ranges {
        if s > at {
            gaps.push((at, s.min(len)));
        }
        at = at.max(e);
    }
    gaps.push((at, len));
    for (s, e) in gaps.into_iter().filter(|(s, e)| s < e) {
        let Some((off, count)) = mr.nonzero(s, e) else {
            continue;
        };
        inv.fail(format!(
            "node {i}: {count} non-zero bytes where no operation wrote, first at +{off:#x} ({})",
            describe(input, i, off)
        ));
        if inv.violations.len() >= MAX_MESSAGES {
            return;
        }
    }
}

/// Where `off` is in node `i`'s MR, for messages.
fn describe(input: &Input<'_>, i: u32, off: u64) -> String {
    if off < layout::LINK_BASE {
        return "header: counter, fin words, pattern".to_owned();
    }
    let pos = (off - layout::LINK_BASE) / layout::LINK_LEN;
    let peers = layout::peers(input.ev.nodes, input.ev.workload, i);
    let qps = u64::from(input.ev.qps_per_peer.max(1));
    let peer = peers.get((pos / qps) as usize).map_or_else(
        || "no peer".to_owned(),
        |&p| {
            Link {
                peer: p,
                qp: (pos % qps) as u32,
            }
            .to_string()
        },
    );
    let rel = (off - layout::LINK_BASE) % layout::LINK_LEN;
    let area = match rel {
        r if r < layout::RECV_OFF => "WRITE area",
        r if r < layout::READ_OFF => "receive slots",
        r if r < layout::FAA_OFF => "READ landing area",
        r if r < layout::STAGE_OFF => "FETCH_ADD slots",
        _ => "staging",
    };
    format!("{area} of the link to {peer}, +{rel:#x} in the link block")
}

/// Sorts and merges overlapping or touching ranges.
fn merge(mut ranges: Ranges) -> Ranges {
    ranges.sort_unstable();
    let mut out: Ranges = Vec::with_capacity(ranges.len());
    for (s, e) in ranges {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Every range of node `i`'s MR the run could have written.
fn allowed(input: &Input<'_>, i: u32) -> Ranges {
    let peers = layout::peers(input.ev.nodes, input.ev.workload, i);
    let qps = input.ev.qps_per_peer.max(1);
    // The QPs of a peer are consecutive links (`layout::link_position`).
    let links: Vec<(u32, u32)> = peers
        .iter()
        .flat_map(|&j| (0..qps).map(move |q| (j, q)))
        .collect();
    let mut ranges = vec![
        (layout::COUNTER_OFF, layout::COUNTER_OFF + 8),
        (layout::FIN_OFF, layout::FIN_OFF + 8 * links.len() as u64),
        (
            layout::PATTERN_OFF,
            layout::PATTERN_OFF + layout::PATTERN_LEN,
        ),
    ];
    // Each log's send completions sorted by link once: a thousand QPs must not mean a
    // thousand passes over a million-line log.
    let mut by_link: BTreeMap<u32, LinkSends> = BTreeMap::new();
    for n in peers.iter().copied().chain([i]) {
        by_link
            .entry(n)
            .or_insert_with(|| LinkSends::of(input.log(n)));
    }
    for (pos, &(j, q)) in links.iter().enumerate() {
        let base = layout::link_base(pos);
        ranges.push((base + layout::STAGE_OFF, base + layout::LINK_LEN));
        // What peer j put here (WRITE, SEND; datagrams), and what node i fetched here (READ,
        // FETCH_ADD).
        if input.ev.workload.is_ud() {
            datagram_ranges(&mut ranges, input.log(i), j, base);
        } else {
            if let Some(log) = by_link.get(&j) {
                link_ranges(&mut ranges, log, Link { peer: i, qp: q }, base, Inbound);
            }
        }
        if let Some(log) = by_link.get(&i) {
            link_ranges(&mut ranges, log, Link { peer: j, qp: q }, base, Outbound);
        }
    }
    ranges
}

/// One node's send completions per QP (the peer and QP they name), and whether its log has
/// an end line (the node drained).
#[derive(Default)]
struct LinkSends {
    per_link: BTreeMap<Link, Vec<SendWc>>,
    drained: bool,
}

impl LinkSends {
    /// Sorts the send completions of `log` (none without a log) by link, in log order.
    fn of(log: Option<&LogRead>) -> LinkSends {
        let mut out = LinkSends {
            drained: log.is_some_and(|l| l.entries.iter().any(|e| matches!(e, Entry::End { .. }))),
            ..LinkSends::default()
        };
        for s in log.into_iter().flat_map(sends) {
            let link = Link {
                peer: s.peer,
                qp: s.qp,
            };
            out.per_link.entry(link).or_default().push(s);
        }
        out
    }
}

/// Which operations of a log land in the link block being built.
#[derive(Copy, Clone)]
enum Direction {
    /// The issuer's WRITEs and SENDs (they land at the target).
    Inbound,
    /// The issuer's READs and FETCH_ADDs (they land at the issuer).
    Outbound,
}
use Direction::{Inbound, Outbound};

/// Adds the ranges the operations of `log` (its issuer's) on its QP `link` address in the
/// link block at `base`; for an issuer without a log or an end line, everything past its last
/// logged operation of each kind.
fn link_ranges(ranges: &mut Ranges, log: &LinkSends, link: Link, base: u64, dir: Direction) {
    let kinds: &[(OpKind, u64, u64)] = match dir {
        Inbound => &[
            (OpKind::Write, layout::WRITE_OFF, layout::RECV_OFF),
            (OpKind::Send, layout::RECV_OFF, layout::READ_OFF),
        ],
        Outbound => &[
            (OpKind::Read, layout::READ_OFF, layout::FAA_OFF),
            (OpKind::Faa, layout::FAA_OFF, layout::STAGE_OFF),
        ],
    };
    let drained = log.drained;
    let on_link = log.per_link.get(&link).map_or(&[][..], Vec::as_slice);
    for &(op, start, end) in kinds {
        let mut last = start;
        for s in on_link {
            if s.op != op {
                continue;
            }
            let (off, len) = match op {
                OpKind::Write => (start + s.roff.unwrap_or(0), u64::from(s.len)),
                OpKind::Send => (start + s.seq * layout::RECV_SLOT, u64::from(s.len)),
                OpKind::Read => (start + s.loff.unwrap_or(0), u64::from(s.len)),
                _ => (start + 8 * s.seq, 8),
            };
            let stop = off.saturating_add(len).min(end);
            ranges.push((base + off, base + stop));
            last = last.max(match op {
                OpKind::Send => off + layout::RECV_SLOT,
                _ => stop,
            });
        }
        if !drained {
            ranges.push((base + last, base + end));
        }
    }
}

/// Adds the receive slots of a UD link to `peer` in the link block at `base`, from the
/// receiver's own log (datagrams land in arrival order, not in their sender's numbering): each
/// logged receive's bytes (GRH included), and every whole slot after the last logged one that
/// had a receive posted (a late datagram may have filled it after the last poll) — up to the
/// end of the area for a receiver without an end line.
fn datagram_ranges(ranges: &mut Ranges, log: Option<&LogRead>, peer: u32, base: u64) {
    let slot_at = |slot: u64| base + layout::RECV_OFF + slot * layout::RECV_SLOT;
    let mut next = 0u64;
    let mut posted = None;
    for e in log.into_iter().flat_map(|l| &l.entries) {
        match e {
            Entry::Recv {
                peer: p, wr, len, ..
            } if *p == peer => {
                let slot = wr.saturating_sub(1);
                let len = u64::from(*len).min(layout::RECV_SLOT);
                ranges.push((slot_at(slot), slot_at(slot) + len));
                next = next.max(slot + 1);
            }
            Entry::End { posted: list, .. } => {
                posted = list.iter().find(|p| p.peer == peer).map(|p| p.recv);
            }
            _ => {}
        }
    }
    let end = posted.map_or(base + layout::READ_OFF, |n| slot_at(n.max(next)));
    ranges.push((slot_at(next), end.max(slot_at(next))));
}

#[cfg(test)]
mod tests {
    use super::super::fixture::Fixture;
    use super::*;
    use crate::run::layout::Workload;

    #[test]
    fn a_run_that_wrote_only_where_it_addressed_passes() {
        let mut fx = Fixture::busy(0);
        // Staging buffers are the node's own business.
        let stage = fx.link_base(0, 1) + layout::STAGE_OFF + 100;
        fx.put(0, stage, &[0xff; 64]);
        let inv = untouched_memory(&fx.input());
        assert!(inv.passed(), "{inv:?}");
        assert_eq!(inv.checked, 2);
    }

    #[test]
    fn bytes_past_a_record_in_a_slot_tail_or_in_the_header_fail() {
        let mut fx = Fixture::busy(0);
        let base = fx.link_base(1, 0);
        // Right after node 0's only WRITE record (64 bytes) at node 1.
        fx.put(1, base + layout::WRITE_OFF + 64, &[1]);
        // Past the 48 bytes of the SEND in receive slot 0, and in slot 1 nobody sent to.
        fx.put(1, base + layout::RECV_OFF + 48, &[2, 2]);
        fx.put(1, base + layout::RECV_OFF + layout::RECV_SLOT, &[3]);
        // Between the counter word and the fin words.
        fx.put(0, 8, &[4]);
        let inv = untouched_memory(&fx.input());
        assert_eq!(
            inv.violations,
            [
                "node 0: 1 non-zero bytes where no operation wrote, first at +0x8 (header: \
                 counter, fin words, pattern)"
                    .to_owned(),
                format!(
                    "node 1: 1 non-zero bytes where no operation wrote, first at +{:#x} (WRITE \
                     area of the link to node 0, +0x40 in the link block)",
                    base + 64
                ),
                format!(
                    "node 1: 3 non-zero bytes where no operation wrote, first at +{:#x} \
                     (receive slots of the link to node 0, +0x400030 in the link block)",
                    base + layout::RECV_OFF + 48
                ),
            ]
        );
    }

    #[test]
    fn an_issuer_that_did_not_drain_excuses_only_what_lies_past_its_last_operation() {
        let mut fx = Fixture::new(2, Workload::StreamWrite);
        fx.write(0, 1);
        fx.write(0, 1);
        fx.end(1);
        let base = fx.link_base(1, 0);
        // Node 0 was killed with a WRITE posted but not logged: it may have landed.
        fx.put(1, base + layout::WRITE_OFF + 128, &[9; 64]);
        assert!(untouched_memory(&fx.input()).passed());
        // Its WRITE area at node 1 is excused past its last record only; its READ landing
        // area in its own MR too, but not node 1's (node 1 drained).
        fx.put(0, fx.link_base(0, 1) + layout::READ_OFF, &[5]);
        fx.put(1, base + layout::READ_OFF, &[6]);
        let inv = untouched_memory(&fx.input());
        assert_eq!(inv.violation_count, 1, "{inv:?}");
        assert!(inv.violations[0].starts_with("node 1: 1 non-zero bytes"));
        assert!(inv.violations[0].contains("READ landing area"));
    }
}
