//! TEMPORARY, removed in the next commit: the pre-split `check` (519 lines, verbatim but for
//! taking the read files as an argument) as an oracle, and a differential test that runs it
//! and the new driver on 4,000 random fabricated runs with random damage and asserts equal
//! results (invariants with messages and notes, counts, detections, counters). Run with
//! `cargo test -p softverbs --lib run::check::old -- --ignored --nocapture` (≈5 min, debug).
#![allow(warnings, clippy::all)]
use super::{
    CheckResult, Evidence, FLUSH, Invariant, LogCounts, NodeData, RETRY_EXC, RNR_RETRY_EXC,
    SUCCESS, compare, slice, status_name,
};
use crate::run::layout::{self, RecordKind, Workload};
use crate::run::log::{Entry, LogRead, OpKind};
use std::collections::{BTreeMap, BTreeSet};
/// One send-queue completion, unpacked.
struct OldWc<'a> {
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

fn sends(log: &LogRead) -> impl Iterator<Item = OldWc<'_>> {
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
        } => Some(OldWc {
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
pub(super) fn check(ev: &Evidence, data: &[NodeData]) -> CheckResult {
    let n = ev.nodes;
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
            let on_link: Vec<OldWc<'_>> = sends(log).filter(|s| s.peer == b).collect();
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

#[cfg(test)]
mod diff {
    use super::super::fixture::{Fixture, T0};
    use super::super::{NodeData, check_read};
    use crate::run::layout::{self, Rng, Workload};
    use crate::run::log::{Entry, OpKind};

    fn pick<T: Copy>(r: &mut Rng, xs: &[T]) -> T {
        xs[r.range(0, xs.len() as u64 - 1) as usize]
    }

    fn random_run(seed: u64) -> Fixture {
        let mut r = Rng::new(seed);
        let w = pick(
            &mut r,
            &[
                Workload::Pingpong,
                Workload::StreamWrite,
                Workload::ReadVerify,
                Workload::AtomicCounter,
                Workload::Mixed,
            ],
        );
        let n = r.range(2, 6) as u32;
        let mut fx = Fixture::new(n, w);
        let statuses = [4u32, 5, 5, 10, 12, 13, 99];
        let ops = [
            OpKind::Write,
            OpKind::Send,
            OpKind::Read,
            OpKind::Faa,
            OpKind::Fin,
        ];
        for _ in 0..r.range(0, 40) {
            let i = r.range(0, u64::from(n) - 1) as u32;
            let peers = layout::peers(n, w, i);
            let j = pick(&mut r, &peers);
            match r.range(0, 6) {
                0 => {
                    fx.write(i, j);
                }
                1 => {
                    let imm = r.next_u64() as u32;
                    fx.send(i, j, imm);
                }
                2 => {
                    let o = r.range(0, 4000);
                    fx.read(i, j, o);
                }
                3 => {
                    fx.faa(i, j);
                }
                4 => {
                    fx.fin(i, j);
                }
                _ => {
                    let op = pick(&mut r, &ops);
                    let st = pick(&mut r, &statuses);
                    fx.fail(i, j, op, st);
                }
            }
        }
        for i in 0..n {
            if r.percent(70) {
                fx.end(i);
            }
        }
        for _ in 0..r.range(0, 5) {
            damage(&mut fx, &mut r);
        }
        fx
    }

    fn damage(fx: &mut Fixture, r: &mut Rng) {
        let n = fx.ev.nodes;
        let i = r.range(0, u64::from(n) - 1) as u32;
        let time = T0 + r.range(0, 3000);
        if i as usize >= fx.ev.facts.len() {
            return;
        }
        match r.range(0, 14) {
            0 => {
                let base = layout::link_base(r.range(0, 1) as usize).min(layout::LINK_BASE);
                let off = pick(
                    r,
                    &[
                        0,
                        layout::FIN_OFF,
                        layout::PATTERN_OFF,
                        base + layout::WRITE_OFF,
                        base + layout::RECV_OFF,
                        base + layout::READ_OFF,
                        base + layout::FAA_OFF,
                    ],
                );
                let off = off + r.range(0, 300);
                if let Some(m) = fx.data[i as usize].mr.as_mut() {
                    m[off as usize] ^= 1 << r.range(0, 7);
                }
            }
            1..=3 | 10 | 12 | 13 => {
                let Some(log) = fx.data[i as usize].log.as_mut() else {
                    return;
                };
                if log.entries.is_empty() {
                    return;
                }
                let k = r.range(0, log.entries.len() as u64 - 1) as usize;
                let which = r.range(0, 9);
                let v = r.range(0, 20);
                match &mut log.entries[k] {
                    Entry::Send {
                        peer,
                        wr,
                        status,
                        at,
                        posted,
                        val,
                        imm,
                        kind,
                        seq,
                        ..
                    } => match which {
                        0 => *peer = v as u32 % (n + 2),
                        1 => *wr = v,
                        2 => *status = pick(r, &[0, 4, 5, 10, 12, 13]),
                        3 => *at = time,
                        4 => *posted = time,
                        5 => *val = if v > 10 { None } else { Some(v) },
                        6 => *imm = None,
                        7 => *kind = None,
                        8 => *seq = v,
                        _ => {
                            log.entries.remove(k);
                        }
                    },
                    Entry::Recv {
                        peer,
                        wr,
                        status,
                        at,
                        imm,
                        len,
                    } => match which {
                        0 => *peer = v as u32 % (n + 2),
                        1 => *wr = v,
                        2 => *status = pick(r, &[0, 4, 5, 10, 12, 13]),
                        3 => *at = time,
                        4 => *len = v as u32 * 10,
                        5 => *imm = Some(v as u32),
                        _ => {
                            log.entries.remove(k);
                        }
                    },
                    Entry::End { posted, .. } => {
                        if let Some(p) = posted.first_mut() {
                            p.send = v;
                            p.recv = v / 2;
                        }
                    }
                    _ => {}
                }
            }
            4 => fx.ev.facts[i as usize].killed_at = Some(time),
            5 => fx.ev.facts[i as usize]
                .pauses
                .push((time, r.range(0, 1200))),
            6 => {
                let f = &mut fx.ev.facts[i as usize];
                match r.range(0, 4) {
                    0 => f.finished = false,
                    1 => f.drained = false,
                    2 => {
                        f.exited_cleanly = false;
                        if r.percent(50) {
                            f.end_note = Some("x".into());
                        }
                    }
                    3 => f.error = Some("e".into()),
                    _ => f.timed_out = true,
                }
            }
            7 => fx.ev.facts[i as usize].problems.push(format!("p{time}")),
            8 => {
                if r.percent(50) {
                    fx.data[i as usize].log = None
                } else {
                    fx.data[i as usize].mr = None
                }
            }
            9 => {
                if let Some(log) = fx.data[i as usize].log.as_mut() {
                    if r.percent(50) {
                        log.truncated_tail = true
                    } else {
                        log.bad_lines.push(3)
                    }
                }
            }
            _ => {
                if r.percent(30) {
                    fx.ev.expect_errors = true
                } else if r.percent(30) {
                    fx.ev.facts.pop();
                }
            }
        }
        let _ = NodeData::default();
    }

    #[test]
    #[ignore = "slow differential against the pre-split checker"]
    fn new_checker_equals_the_old_one() {
        let mut failing = [0u64; 10];
        for seed in 0..4000 {
            let fx = random_run(seed);
            let new = check_read(&fx.input());
            let old = super::check(&fx.ev, &fx.data);
            assert_eq!(new.invariants, old.invariants, "seed {seed}");
            assert_eq!(new.counts, old.counts, "seed {seed}");
            assert_eq!(new.detections, old.detections, "seed {seed}");
            assert_eq!(new.counters, old.counters, "seed {seed}");
            for (k, inv) in new.invariants.iter().enumerate() {
                failing[k] += u64::from(!inv.passed());
            }
        }
        eprintln!("runs failing per invariant: {failing:?}");
    }
}
