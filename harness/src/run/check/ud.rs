//! The invariants of the `ud-send` workload, in place of `send-data` and `send-delivery`
//! (which assume RC's exactly-once delivery into slot `seq`): `datagram-data` and
//! `datagram-delivery`.
//!
//! On a UD link the receiver's receive WRs are consumed in arrival order, so the datagram in
//! receive slot `k` is whichever arrived `k`-th; the slot holds the 40-byte GRH (the IPv4
//! header in its last 20 bytes) and then the datagram record, which names its sender,
//! receiver and number. The sender never learns of a loss: a lost datagram completes
//! successfully at the sender like a delivered one.

use std::collections::BTreeMap;

use super::{Input, Invariant, SUCCESS, good_receives, sends};
use crate::run::layout::{self, RecordKind};
use crate::run::log::{Entry, OpKind};
use crate::run::proto::InjectedFaults;

/// A received datagram, read back from the receiver's MR file: its record number, record
/// bytes and immediate data.
type Datagram = (u64, u32, u32);

/// Reads and checks the datagram in node `i`'s receive slot `wr - 1` of the link to `peer`
/// (`len` bytes, GRH included, immediate `imm` in the completion).
fn read_datagram(
    input: &Input<'_>,
    i: u32,
    (link, wr, len, imm): super::GoodRecv,
) -> Result<Datagram, String> {
    // UD links are one QP per peer (`--qps-per-peer` is refused for ud-send).
    let peer = link.peer;
    let pos = input
        .position(i, peer, link.qp)
        .ok_or_else(|| "a receive from a node that is not a peer".to_owned())?;
    let slot = wr.saturating_sub(1);
    let off = layout::link_base(pos) + layout::RECV_OFF + slot * layout::RECV_SLOT;
    let grh_len = layout::UD_GRH as usize;
    if (len as usize) < grh_len + layout::RECORD_HEADER {
        return Err(format!("{len} bytes, less than a GRH and a record header"));
    }
    let bytes = input
        .mr(i)
        .and_then(|m| m.get(off, len as usize))
        .ok_or_else(|| "unreadable".to_owned())?;
    let (grh, rec) = bytes.split_at(grh_len);
    let (src, dst) = (layout::node_ip(peer).octets(), layout::node_ip(i).octets());
    if grh[..20].iter().any(|b| *b != 0)
        || grh[20] != 0x45
        || grh[32..36] != src
        || grh[36..40] != dst
    {
        return Err(format!(
            "the GRH is not 20 zero bytes and an IPv4 header from {} to {}",
            layout::node_ip(peer),
            layout::node_ip(i)
        ));
    }
    let (kind, seq, rimm) = layout::check_record(rec)?;
    if kind != RecordKind::Datagram || Some(rimm) != imm {
        return Err(format!(
            "a {kind:?} record with immediate {rimm:#x}; the completion says {imm:?}"
        ));
    }
    let want = layout::record(
        input.ev.seed,
        RecordKind::Datagram,
        peer,
        i,
        seq,
        rimm,
        rec.len(),
    );
    if rec != want.as_slice() {
        return Err(format!(
            "record {seq} is not, byte for byte, datagram {seq} of node {peer} to node {i}"
        ));
    }
    Ok((seq, rec.len() as u32, rimm))
}

/// `datagram-data`: every successful receive completion of a UD link holds, in its receive
/// slot, the GRH of a datagram from the link's peer to this node (IPv4 header with their
/// addresses) followed by a datagram record that is, byte for byte, one the peer's seed makes
/// for this node, carrying the completion's immediate data. Excused: nothing.
pub(super) fn datagram_data(input: &Input<'_>) -> Invariant {
    let mut inv = Invariant::new("datagram-data");
    for i in input.nodes() {
        let Some(log) = input.log(i) else {
            continue;
        };
        for recv in good_receives(log) {
            inv.checked += 1;
            if let Err(e) = read_datagram(input, i, recv) {
                inv.fail(format!(
                    "node {i} receive slot {} from node {}: {e}",
                    recv.1.saturating_sub(1),
                    recv.0
                ));
            }
        }
    }
    inv
}

/// Per (sender, receiver): record number → the (bytes, immediate) of each copy received.
type Copies = BTreeMap<(u32, u32), BTreeMap<u64, Vec<(u32, u32)>>>;

fn copies(input: &Input<'_>) -> Copies {
    let mut out = Copies::new();
    for i in input.nodes() {
        let Some(log) = input.log(i) else {
            continue;
        };
        for recv in good_receives(log) {
            if let Ok((seq, len, imm)) = read_datagram(input, i, recv) {
                out.entry((recv.0.peer, i))
                    .or_default()
                    .entry(seq)
                    .or_default()
                    .push((len, imm));
            }
        }
    }
    out
}

/// Losses and duplicates of one sender's datagrams.
#[derive(Default)]
struct Tally {
    lost: u64,
    duplicated: u64,
}

/// `datagram-delivery`: every datagram received was sent (its sender, having drained, logged
/// it with the same length and immediate data); no datagram arrives more often than once
/// plus the copies the sender's fault injector made (per sender: extra copies received ≤ its
/// `duplicated` × the plan's most copies per datagram); and datagrams are lost only where the plan lost them (per sender: sent but
/// never received ≤ its `dropped + corrupted + truncated + partitioned`). Excused (notes):
/// losses towards a receiver that was killed, paused or did not drain (its socket or its log
/// may have lost them), and the counts of a sender that did not report its injector's
/// numbers.
pub(super) fn datagram_delivery(input: &Input<'_>) -> Invariant {
    let mut inv = Invariant::new("datagram-delivery");
    let got = copies(input);
    for j in input.nodes() {
        let Some(log) = input.log(j) else {
            continue;
        };
        let mut tally = Tally::default();
        for s in sends(log).filter(|s| s.op == OpKind::Send && s.status == SUCCESS) {
            inv.checked += 1;
            let i = s.peer;
            let received = got
                .get(&(j, i))
                .and_then(|m| m.get(&s.seq))
                .map_or(&[][..], Vec::as_slice);
            if received.is_empty() {
                if receiver_excused(input, i) {
                    continue;
                }
                tally.lost += 1;
                continue;
            }
            tally.duplicated += received.len() as u64 - 1;
            for &(len, imm) in received {
                if len != s.len || Some(imm) != s.imm {
                    inv.fail(format!(
                        "node {j} → node {i} datagram {}: received as {len} bytes, imm \
                         {imm:#x}; sent {} bytes, imm {:?}",
                        s.seq, s.len, s.imm
                    ));
                }
            }
        }
        check_unsent(&mut inv, input, j, &got);
        judge(
            &mut inv,
            j,
            &tally,
            input.fact(j).injected,
            input.ev.max_copies,
        );
    }
    inv
}

/// True when node `i` may have lost datagrams the plan did not: killed, paused or not
/// drained.
fn receiver_excused(input: &Input<'_>, i: u32) -> bool {
    let f = input.fact(i);
    f.killed_at.is_some() || !f.pauses.is_empty() || !f.drained
}

/// Fails `inv` for each datagram received from node `j`, which drained, that `j` never
/// logged sending.
fn check_unsent(inv: &mut Invariant, input: &Input<'_>, j: u32, got: &Copies) {
    let Some(log) = input.log(j) else {
        return;
    };
    if !log.entries.iter().any(|e| matches!(e, Entry::End { .. })) {
        return;
    }
    for (&(src, i), per_seq) in got.range((j, 0)..=(j, u32::MAX)) {
        debug_assert_eq!(src, j);
        for &seq in per_seq.keys() {
            inv.checked += 1;
            let sent = sends(log).any(|s| s.peer == i && s.op == OpKind::Send && s.seq == seq);
            if !sent {
                inv.fail(format!(
                    "node {i} received datagram {seq} of node {j}, which node {j} never logged \
                     sending"
                ));
            }
        }
    }
}

/// Compares node `j`'s losses and duplicates with what its injector did.
fn judge(
    inv: &mut Invariant,
    j: u32,
    tally: &Tally,
    injected: Option<InjectedFaults>,
    max_copies: u64,
) {
    let Some(f) = injected else {
        if tally.lost + tally.duplicated > 0 {
            inv.note(format!(
                "node {j}: {} datagrams lost, {} duplicated; its injector's counts are unknown \
                 (it did not drain)",
                tally.lost, tally.duplicated
            ));
        }
        return;
    };
    let copies = f.duplicated.saturating_mul(max_copies);
    if tally.duplicated > copies {
        inv.fail(format!(
            "node {j}: {} extra copies of its datagrams received; its injector duplicated {} \
             datagrams, with at most {max_copies} extra copies each",
            tally.duplicated, f.duplicated
        ));
    } else if tally.duplicated > 0 {
        inv.note(format!(
            "node {j}: {} duplicate datagrams, injected",
            tally.duplicated
        ));
    }
    let lossy = f.dropped + f.corrupted + f.truncated + f.partitioned;
    if tally.lost > lossy {
        inv.fail(format!(
            "node {j}: {} datagrams lost, but its injector dropped, corrupted, truncated or \
             partitioned only {lossy}{}",
            tally.lost,
            if f.delayed > 0 {
                format!(
                    " ({} delayed ones may have come after the last poll)",
                    f.delayed
                )
            } else {
                String::new()
            }
        ));
    } else if tally.lost > 0 {
        inv.note(format!(
            "node {j}: {} datagrams lost, explained by its injector",
            tally.lost
        ));
    }
}
