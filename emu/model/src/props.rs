//! The properties: what every reachable state must satisfy ([`check_state`]) and what a
//! quiescent state reached without further loss must satisfy ([`check_complete`]).
//!
//! A property names itself in the returned error's first word so that reports group them.
//! The work requests are all valid, so any completion status other than SUCCESS, the two
//! retry-exhausted errors and WR_FLUSH_ERR is itself a violation.

use verbs_api::{QpState, WcFlags, WcOpcode, WcStatus, WorkCompletion};

use crate::config::{Config, Op, Side};
use crate::system::{RECV_WR_BASE, System, atomic_add, atomic_init, atomic_swap, imm_of, pattern};

/// Datagrams in flight beyond this is an unbounded queue.
pub const MAX_IN_FLIGHT: usize = 64;

/// Checks the safety properties of one state.
pub fn check_state(cfg: &Config, sys: &System) -> Result<(), String> {
    if sys.flight.len() > MAX_IN_FLIGHT {
        return Err(format!(
            "bounded-queue: {} datagrams in flight",
            sys.flight.len()
        ));
    }
    for side in [Side::A, Side::B] {
        for pair in 0..cfg.pairs {
            check_sends(cfg, sys, side, pair)?;
            check_recvs(cfg, sys, side, pair)?;
        }
    }
    check_atomic_targets(cfg, sys)
}

/// The work requests `side` posted on `pair`, in order.
fn posted(cfg: &Config, side: Side, pair: usize) -> Vec<usize> {
    cfg.wrs
        .iter()
        .enumerate()
        .filter(|(_, w)| w.from == side && w.pair == pair)
        .map(|(k, _)| k)
        .collect()
}

/// Send completions: at most once, in order; SUCCESS*, then at most one retry-exhausted error
/// with the QP in ERR and every later WR flushed in the same step; each SUCCESS correct.
fn check_sends(cfg: &Config, sys: &System, side: Side, pair: usize) -> Result<(), String> {
    let node = &sys.nodes[side.index()];
    let wcs = &node.send_wcs[pair];
    let want = posted(cfg, side, pair);
    if wcs.len() > want.len() {
        return Err(format!(
            "once-in-order: {side:?} pair {pair} has {} send completions for {} WRs",
            wcs.len(),
            want.len()
        ));
    }
    let mut failed = false;
    for (i, wc) in wcs.iter().enumerate() {
        let k = want[i];
        if wc.wr_id != k as u64 {
            return Err(format!(
                "once-in-order: {side:?} pair {pair} completion {i} is wr_id {} (want {k})",
                wc.wr_id
            ));
        }
        match wc.status {
            WcStatus::Success if !failed => check_success(cfg, sys, k, wc)?,
            WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr if !failed => {
                failed = true;
                if wcs.len() != want.len() {
                    return Err(format!(
                        "retry-exhausted-flush: WR {k} failed with {:?} but only {} of {} WRs completed",
                        wc.status,
                        wcs.len(),
                        want.len()
                    ));
                }
                if node.qp_state(pair) != Some(QpState::Err) {
                    return Err(format!(
                        "retry-exhausted-flush: WR {k} failed with {:?} but the QP is {:?}",
                        wc.status,
                        node.qp_state(pair)
                    ));
                }
            }
            WcStatus::WrFlushErr if failed => {}
            s => {
                return Err(format!(
                    "status: WR {k} ({:?}) completed with {s:?}{}",
                    cfg.wrs[k].op,
                    if failed { " after the error" } else { "" }
                ));
            }
        }
    }
    Ok(())
}

/// A successful send completion's effects, at both ends.
fn check_success(cfg: &Config, sys: &System, k: usize, wc: &WorkCompletion) -> Result<(), String> {
    let wr = cfg.wrs[k];
    let slot = cfg.slot();
    let local = &sys.nodes[wr.from.index()].mem;
    let remote = &sys.nodes[wr.from.peer().index()].mem;
    let (l_off, r_off) = (slot * k as u64, cfg.target(k));
    let len = cfg.len as usize;
    let data = pattern(k, cfg.len);
    let opcode = match wr.op {
        Op::Send => WcOpcode::Send,
        Op::Write | Op::WriteImm => WcOpcode::RdmaWrite,
        Op::Read => WcOpcode::RdmaRead,
        Op::FetchAdd => WcOpcode::FetchAdd,
        Op::CmpSwap => WcOpcode::CompSwap,
    };
    let fail = |what: String| {
        Err(format!(
            "success-effects: WR {k} ({:?}) SUCCESS but {what}",
            wr.op
        ))
    };
    if wc.opcode != opcode {
        return fail(format!("opcode {:?}", wc.opcode));
    }
    match wr.op {
        Op::Write | Op::WriteImm if !write_in_place(cfg, sys, k) => {
            return fail("the responder's memory lacks the data".into());
        }
        Op::Send if remote.get(r_off, len) != data => {
            return fail("the responder's memory lacks the data".into());
        }
        Op::Read if local.get(l_off, len) != data => {
            return fail("the local buffer lacks the data read".into());
        }
        Op::FetchAdd | Op::CmpSwap if local.word(l_off) != atomic_init(k) => {
            return fail(format!("the original value is {:#x}", local.word(l_off)));
        }
        Op::FetchAdd | Op::CmpSwap if remote.word(r_off) != atomic_final(wr.op, k) => {
            return fail(format!("the target is {:#x}", remote.word(r_off)));
        }
        _ => {}
    }
    if wr.op.consumes_recv() {
        let rwcs = &sys.nodes[wr.from.peer().index()].recv_wcs[wr.pair];
        let got = rwcs
            .iter()
            .any(|r| r.wr_id == RECV_WR_BASE + k as u64 && r.status == WcStatus::Success);
        if !got {
            return fail("the responder has no successful receive completion".into());
        }
    }
    Ok(())
}

/// A completed WRITE `k`'s target holds its data — or, with a shared target, the data of a
/// later WRITE to it that has not completed yet; once a later one completed, that one is
/// judged instead.
fn write_in_place(cfg: &Config, sys: &System, k: usize) -> bool {
    let wr = cfg.wrs[k];
    let later = cfg.later_writers(k);
    let wcs = &sys.nodes[wr.from.index()].send_wcs[wr.pair];
    let done = |j: usize| {
        wcs.iter()
            .any(|w| w.wr_id == j as u64 && w.status == WcStatus::Success)
    };
    if later.iter().any(|&j| done(j)) {
        return true;
    }
    let have = sys.nodes[wr.from.peer().index()]
        .mem
        .get(cfg.target(k), cfg.len as usize);
    std::iter::once(k)
        .chain(later)
        .any(|j| have == pattern(j, cfg.len))
}

fn atomic_final(op: Op, k: usize) -> u64 {
    match op {
        Op::FetchAdd => atomic_init(k).wrapping_add(atomic_add(k)),
        _ => atomic_swap(k),
    }
}

/// Receive completions: a prefix of the posted receives, in order, each SUCCESS matching its
/// one send exactly; WR_FLUSH_ERR only with the QP in ERR.
fn check_recvs(cfg: &Config, sys: &System, side: Side, pair: usize) -> Result<(), String> {
    let node = &sys.nodes[side.index()];
    let wcs = &node.recv_wcs[pair];
    let list = System::recv_list(cfg, side, pair);
    let posted = &list[..node.recvs_posted[pair].min(list.len())];
    if wcs.len() > posted.len() {
        return Err(format!(
            "recv-matches-send: {side:?} pair {pair} has {} receive completions for {} receives",
            wcs.len(),
            posted.len()
        ));
    }
    for (wc, &k) in wcs.iter().zip(posted) {
        let fail = |what: String| Err(format!("recv-matches-send: receive for WR {k}: {what}"));
        if wc.wr_id != RECV_WR_BASE + k as u64 {
            return fail(format!("completion has wr_id {}", wc.wr_id));
        }
        match wc.status {
            WcStatus::Success => {}
            WcStatus::WrFlushErr if node.qp_state(pair) == Some(QpState::Err) => continue,
            s => return fail(format!("status {s:?} (QP {:?})", node.qp_state(pair))),
        }
        let data = pattern(k, cfg.len);
        let at = node.mem.get(cfg.target(k), cfg.len as usize);
        let imm = wc.wc_flags.contains(WcFlags::WITH_IMM);
        let ok = match cfg.wrs[k].op {
            Op::Send => wc.opcode == WcOpcode::Recv && !imm && wc.byte_len == cfg.len,
            _ => wc.opcode == WcOpcode::RecvRdmaWithImm && imm && wc.imm_data == imm_of(k),
        };
        if !ok {
            return fail(format!(
                "{:?} byte_len {} imm {:?}",
                wc.opcode,
                wc.byte_len,
                imm.then_some(wc.imm_data)
            ));
        }
        let in_place = match cfg.wrs[k].op {
            Op::Send => at == data,
            _ => write_in_place(cfg, sys, k),
        };
        if !in_place {
            return fail("the data is not in place".into());
        }
    }
    Ok(())
}

/// Every atomic target holds its initial or its final value and was hit at most once.
fn check_atomic_targets(cfg: &Config, sys: &System) -> Result<(), String> {
    let slot = cfg.slot();
    for (k, wr) in cfg.wrs.iter().enumerate() {
        if !wr.op.is_atomic() {
            continue;
        }
        let mem = &sys.nodes[wr.from.peer().index()].mem;
        let off = slot * k as u64 + slot / 2;
        let n = mem.atomic_count(off);
        if n > 1 {
            return Err(format!(
                "atomic-once: WR {k} ({:?}) executed {n} times",
                wr.op
            ));
        }
        let v = mem.word(off);
        if v != atomic_init(k) && v != atomic_final(wr.op, k) {
            return Err(format!("atomic-once: WR {k} target holds {v:#x}"));
        }
    }
    Ok(())
}

/// In a quiescent state (nothing in flight, no timer, every receive posted): every WR and
/// every receive completed. All SUCCESS unless `may_fail`, when a retry-exhausted error (and
/// its flush) is allowed too.
pub fn check_complete(cfg: &Config, sys: &System, may_fail: bool) -> Result<bool, String> {
    let mut failed = false;
    for side in [Side::A, Side::B] {
        let node = &sys.nodes[side.index()];
        for pair in 0..cfg.pairs {
            let want = posted(cfg, side, pair).len();
            let wcs = &node.send_wcs[pair];
            if wcs.len() != want {
                return Err(format!(
                    "fair-completion: quiescent with {} of {want} WRs of {side:?} pair {pair} completed",
                    wcs.len()
                ));
            }
            let bad = wcs.iter().find(|w| w.status != WcStatus::Success);
            if let Some(wc) = bad {
                failed = true;
                if !may_fail {
                    return Err(format!(
                        "fair-completion: WR {} ended {:?} after only {} disturbances (retry_cnt {}, rnr_retry {})",
                        wc.wr_id, wc.status, sys.disturbances, cfg.retry_cnt, cfg.rnr_retry
                    ));
                }
            }
            let rwant = System::recv_list(cfg, side, pair).len();
            let rgot = node.recv_wcs[pair].len();
            let in_err = node.qp_state(pair) == Some(QpState::Err);
            let peer_err = sys.nodes[side.peer().index()].qp_state(pair) == Some(QpState::Err);
            if rgot != rwant && !in_err && !peer_err {
                return Err(format!(
                    "fair-completion: quiescent with {rgot} of {rwant} receives of {side:?} pair {pair} completed"
                ));
            }
        }
    }
    Ok(failed)
}
