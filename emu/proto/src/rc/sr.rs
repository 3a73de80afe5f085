//! Selective repeat, softverbs' opt-in loss recovery for RC (rc-transport.md "softverbs
//! extensions"; `QpAttr::recovery`). Both ends must enable it: it puts a manufacturer-specific
//! selective ACK ([`crate::wire::SackPacketRepr`]) on the wire, which a standard peer never
//! sees because a QP left at `Recovery::Ibta` never sends one and drops any it receives.
//!
//! * Responder: a request up to [`SACK_SPAN`] PSNs ahead of ePSN is *held* instead of drawing
//!   a sequence NAK; a selective ACK answers the first one held past a gap, then every
//!   [`SACK_EVERY`]th, one asking for an ACK and a duplicate (`sack_due`). An RDMA WRITE packet without
//!   immediate data whose place is known (it opens its message, or the message open in order
//!   or a held packet placed before it covers its PSN) and that passes the in-order path's own
//!   checks is placed in memory on arrival and held without its payload
//!   (`responder::place_early`); any other request is held with a copy of its payload. When
//!   the gap fills, held packets run in PSN order through the ordinary in-order stages, which
//!   check a placed packet again but do not write it again, so SENDs, WRITEs, READs and
//!   atomics complete in order and exactly once, and SENDs, immediate data and the MSN
//!   advance in order. A duplicate of a held packet is not placed again.
//!
//!   If the QP enters ERR before the gap fills (an error at or before a placed packet's PSN),
//!   the bytes placed stay in memory, as on hardware with out-of-order placement (IRN,
//!   ConnectX adaptive routing): the WR they belong to never completes successfully (it is
//!   flushed or fails at the requester), so the application must treat its target as
//!   undefined, which IBTA already requires of a WRITE that did not complete.
//! * Requester/completer: every transmission gets a sequence number; a selective ACK marks
//!   what arrived, and a unit still missing when [`REORDER_THRESHOLD`] transmissions sent
//!   after it have been delivered is resent, alone (not the window behind it). A probe timer
//!   of a few round trips resends what is still missing when no selective ACK can tell (a lost
//!   resend with nothing behind it, the stream's tail, a lost selective ACK); the local ACK
//!   timeout stays the last resort and still spends `retry_cnt`.
//!
//! * Completer: a READ response after `comp_psn` (earlier ones lost or overtaken) that passes
//!   the in-order checks lands in its READ's SGEs on arrival, once ([`SrState::read_placed`]);
//!   the READ completes in order when `comp_psn` reaches it. A gap in the responses is still
//!   recovered by re-requesting the rest (as in IBTA mode) or by the probe; responses placed
//!   already are dropped when they come again.
//!
//! What it is not: IBTA behaviour. IBTA mode never reaches this module.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use verbs_api::{QpType, Recovery};

use super::{RcState, Response, packets};
use crate::qp::Qp;
use crate::time::Instant;
use crate::wire::{Opcode, PacketRepr, Psn, SACK_SPAN, SackBitmap};

mod bits;
mod held;
mod units;

pub(crate) use held::HeldRing;
pub(crate) use units::Units;

/// A missing unit is resent once transmissions this many sequence numbers after its own have
/// been delivered: reordering by fewer packets never causes a resend (issue 19 item 3). Eight
/// keeps a margin over the ~5 places the emu-sim reordering test overtakes by, and detects a
/// loss 8 deliveries sooner than 16 did (5 % loss, `emu-sim` `sr_goodput`: 0.60× → 0.79×).
pub(crate) const REORDER_THRESHOLD: u64 = 8;

/// The requester's window with selective repeat, in un-ACKed PSNs: everything sent stays
/// within one selective ACK's bitmap ([`SACK_SPAN`] PSNs after the responder's ePSN, which is
/// never before the requester's oldest un-ACKed PSN).
const WINDOW: i32 = SACK_SPAN as i32;

/// The requester's flight with selective repeat: PSNs sent and neither acknowledged nor
/// reported received. It bounds what sits in the network; [`WINDOW`], four times larger,
/// lets new data flow past a hole while its resend crosses the queue the flight built
/// (`emu-sim` `sr_goodput`, 1 % loss: 0.852× with the window equal to the flight).
const FLIGHT: i32 = 128;

/// Past a gap, a selective ACK goes out for every this many packets held (and for the first
/// one, and for one asking for an ACK): see `sack_due`.
const SACK_EVERY: u32 = 8;

/// The shortest probe interval.
const MIN_PROBE: Duration = Duration::from_micros(100);

/// The probe interval doubles per probe without progress, at most this many times.
const MAX_BACKOFF: u32 = 6;

/// Selective-repeat state of one QP (both sides); empty in IBTA mode.
#[derive(Clone, Debug, Default)]
pub(crate) struct SrState {
    // ---- responder ----
    /// Requests received ahead of ePSN, by PSN.
    pub(crate) held: HeldRing,
    /// The in-order stages are running a held packet placed on arrival: RDMA WRITE checks it
    /// and advances, but does not write it again.
    pub(crate) replaying_placed: bool,
    /// Packets held since the last selective ACK was queued ([`SACK_EVERY`]).
    pub(crate) unreported: u32,
    // ---- requester ----
    /// Units in flight by PSN (a READ or atomic is one unit at its first PSN), and which are
    /// reported received (a READ counts once).
    pub(crate) units: Units,
    /// PSNs after `comp_psn` of READ responses placed on arrival (`completer`).
    pub(crate) read_placed: BTreeSet<u32>,
    /// Sequence number of the latest transmission.
    pub(crate) seq: u64,
    /// The highest sequence number known delivered.
    pub(crate) delivered: u64,
    /// Units to resend, in order.
    pub(crate) resend: VecDeque<Psn>,
    /// The requester is building a resend (counted as `retransmits_sack`).
    pub(crate) resending: bool,
    /// When the probe fires.
    pub(crate) probe_at: Option<Instant>,
    /// Probes since the last progress.
    pub(crate) backoff: u32,
    /// Sequence number of the first transmission after the latest probe fired, until a
    /// selective ACK shows it delivered: then every hole sent before it is lost, whatever the
    /// reorder threshold says (see [`queue_holes`]).
    pub(crate) probe_seq: Option<u64>,
}

/// A request held by the responder until the PSNs before it arrive.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    /// The headers (payload empty).
    pub(crate) hdrs: PacketRepr<'static>,
    /// The payload; empty if it was placed on arrival.
    pub(crate) payload: Vec<u8>,
    /// Payload length.
    pub(crate) len: usize,
    /// PSNs it covers: a READ request's response packets, else 1.
    pub(crate) span: u32,
    /// An RDMA WRITE packet placed in memory on arrival (`responder::place_early`): where.
    pub(crate) placed: Option<Placed>,
}

/// Where an RDMA WRITE packet placed on arrival went.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    /// The R_Key its message named.
    pub(crate) rkey: u32,
    /// The memory key and offset of its first byte.
    pub(crate) key: u32,
    pub(crate) offset: u64,
    /// Bytes of its message from its first byte on.
    pub(crate) room: u64,
}

/// Stands in for the payload of a packet placed on arrival when the in-order stages run it:
/// they check its length and account for it but do not write it again
/// (`SrState::replaying_placed`). The largest path MTU long.
static PLACED_PAYLOAD: [u8; 4096] = [0; 4096];

impl Held {
    /// The packet again (for a placed one, with a stand-in payload of its length).
    pub(crate) fn repr(&self) -> PacketRepr<'_> {
        let payload = match self.placed {
            Some(_) => PLACED_PAYLOAD.get(..self.len).unwrap_or(&[]),
            None => &self.payload,
        };
        PacketRepr {
            payload,
            ..self.hdrs
        }
    }
}

/// What the requester knows of one unit in flight.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct Unit {
    /// Sequence number of its latest transmission.
    pub(crate) seq: u64,
    /// A selective ACK reported it received.
    pub(crate) sacked: bool,
    /// Waiting in the resend queue.
    pub(crate) queued: bool,
}

/// Whether `qp` runs selective repeat.
pub(crate) fn enabled(qp: &Qp) -> bool {
    qp.qp_type == QpType::Rc && qp.attr.recovery == Recovery::SelectiveRepeat
}

// ---- responder -----------------------------------------------------------------------------

/// Holds request `pkt`, `ahead` PSNs after ePSN, and queues a selective ACK if one is due
/// ([`sack_due`]); the first copy of it is offered to `place` (which places it in memory now, or
/// declines), a duplicate is not. False if it is too far ahead to describe in a selective ACK
/// (then it is dropped).
pub(crate) fn hold(
    qp: &mut Qp,
    pkt: &PacketRepr<'_>,
    ahead: i32,
    place: impl FnOnce(&mut Qp, u32) -> Option<Placed>,
) -> bool {
    let Some(ahead) = u32::try_from(ahead).ok().filter(|&a| a <= SACK_SPAN) else {
        return false;
    };
    let span = match (pkt.bth.opcode, pkt.reth) {
        (Opcode::RdmaReadRequest, Some(reth)) => {
            packets(u64::from(reth.dma_len), qp.attr.path_mtu.bytes())
        }
        _ => 1,
    };
    qp.rc.stats.out_of_seq_request += 1;
    let psn = pkt.bth.psn;
    let epsn = qp.rc.epsn;
    qp.rc.sr.held.discard_before(epsn);
    let first = qp.rc.sr.held.is_empty();
    let duplicate = qp.rc.sr.held.contains(psn);
    if duplicate {
        qp.rc.stats.duplicate_request += 1;
    } else {
        let placed = place(qp, ahead);
        let payload = match placed {
            Some(_) => Vec::new(),
            None => pkt.payload.to_vec(),
        };
        let held = Held {
            hdrs: PacketRepr {
                payload: &[],
                ..*pkt
            },
            payload,
            len: pkt.payload.len(),
            span,
            placed,
        };
        qp.rc.sr.held.insert(psn, held);
    }
    qp.rc.sr.unreported += 1;
    if duplicate || sack_due(&qp.rc, pkt, first) {
        queue_sack(&mut qp.rc);
    }
    true
}

/// Whether packet `pkt`, just held, calls for a selective ACK: the first one held past a gap
/// (the requester learns of the gap at once), one that asks for an ACK (a message's end, the
/// stream's tail), or the [`SACK_EVERY`]th held since the last selective ACK. One selective ACK
/// per packet held cost the requester and the responder a packet each way per packet past a
/// gap; the requester's [`REORDER_THRESHOLD`] counts deliveries, so a hole is still detected
/// within one selective ACK after it.
fn sack_due(rc: &RcState, pkt: &PacketRepr<'_>, first: bool) -> bool {
    first || pkt.bth.ack_req || rc.sr.unreported >= SACK_EVERY
}

/// The held packet placed on arrival nearest before `psn`: how many PSNs before, and where it
/// went.
pub(crate) fn nearest_placed_before(rc: &RcState, psn: Psn) -> Option<(u32, Placed)> {
    rc.sr.held.nearest_placed_before(psn)
}

/// Queues a selective ACK for the current ePSN, merged into one still queued last.
pub(crate) fn queue_sack(rc: &mut RcState) {
    rc.sr.unreported = 0;
    let epsn = rc.epsn;
    match rc.responses.back_mut() {
        Some(Response::Sack { psn }) => *psn = epsn,
        _ => rc.responses.push_back(Response::Sack { psn: epsn }),
    }
}

/// The held request at ePSN, if any, after discarding held ones ePSN has passed.
pub(crate) fn take_next_held(rc: &mut RcState) -> Option<Held> {
    let epsn = rc.epsn;
    rc.sr.held.discard_before(epsn);
    rc.sr.held.take(epsn)
}

/// The bitmap of a selective ACK whose BTH PSN is `psn`: PSNs after it executed since it was
/// queued, and PSNs held (a held READ covers its response PSNs).
pub(crate) fn bitmap(rc: &RcState, psn: Psn) -> SackBitmap {
    let base = psn.wrapping_add(1);
    let mut bits = SackBitmap::first(u32::try_from(rc.epsn.diff(base)).unwrap_or(0));
    rc.sr.held.add_to(&mut bits, base);
    bits
}

// ---- requester -----------------------------------------------------------------------------

/// Records a transmission of unit `unit` and arms the probe.
pub(crate) fn sent(rc: &mut RcState, unit: Psn, now: Instant) {
    let sr = &mut rc.sr;
    sr.seq += 1;
    sr.units.sent(unit, sr.seq);
    if rc.sr.probe_at.is_none() {
        rc.sr.probe_at = Some(now + probe_interval(rc));
    }
}

/// The probe interval: three smoothed round trips (at least [`MIN_PROBE`]), doubled per probe
/// without progress.
fn probe_interval(rc: &RcState) -> Duration {
    let base = (rc.srtt.unwrap_or_default() * 3).max(MIN_PROBE);
    base.saturating_mul(1 << rc.sr.backoff.min(MAX_BACKOFF))
}

/// The responder acknowledged everything before `comp`: forget those units, restart the probe.
pub(crate) fn progress(rc: &mut RcState, now: Instant) {
    let comp = rc.comp_psn;
    rc.sr.units.forget_before(comp);
    rc.sr.read_placed.retain(|&k| !Psn::new(k).is_before(comp));
    rc.sr.backoff = 0;
    rc.sr.probe_at = comp
        .is_before(rc.sent_high)
        .then(|| now + probe_interval(rc));
}

/// A selective ACK (BTH PSN `psn`, `bitmap`) before its cumulative part is applied: what it
/// shows delivered raises the delivered sequence number; what it reports received is marked.
pub(crate) fn note_sack(rc: &mut RcState, psn: Psn, bitmap: &SackBitmap) {
    rc.stats.sacks_rcvd += 1;
    let delivered = rc.sr.units.report(psn, bitmap, rc.sent_high);
    rc.sr.delivered = rc.sr.delivered.max(delivered);
}

/// Queues for resend every unit before the highest one reported received that is still
/// missing: all of them if `all` (the probe), else those [`REORDER_THRESHOLD`] transmissions
/// older than the newest delivered one, and, once a transmission sent after the latest probe
/// fired is shown delivered (the probe's answer), every one sent before the probe.
///
/// Without `all` it pops the units' hole candidates old enough ([`Units::old_holes`]) instead of
/// walking every unit: a selective ACK costs what changed.
pub(crate) fn queue_holes(rc: &mut RcState, all: bool) {
    let comp = rc.comp_psn;
    let sr = &mut rc.sr;
    let mut holes = if all {
        all_holes(&sr.units, comp)
    } else {
        let delivered = sr.delivered;
        let answered = sr.probe_seq.filter(|&s| s <= delivered);
        if answered.is_some() {
            sr.probe_seq = None;
        }
        // A probe sequence number rebased to 0 (`rebase_seq`) precedes every transmission
        // still compared: nothing was sent before it.
        let limit = delivered
            .checked_sub(REORDER_THRESHOLD)
            .max(answered.and_then(|s| s.checked_sub(1)));
        match limit {
            Some(limit) => sr.units.old_holes(comp, limit),
            None => return,
        }
    };
    holes.sort_unstable_by_key(|p| p.diff(comp));
    for p in holes {
        if let Some(u) = sr.units.get_mut(p) {
            u.queued = true;
        }
        sr.resend.push_back(p);
    }
}

/// Every unit from `comp` on before the highest one reported received that is neither
/// reported nor queued (the probe's holes).
fn all_holes(units: &Units, comp: Psn) -> Vec<Psn> {
    let Some(high) = units.high().map(|h| h.diff(comp)) else {
        return Vec::new();
    };
    units
        .iter()
        .filter(|(p, u)| {
            let off = p.diff(comp);
            off >= 0 && off < high && !u.sacked && !u.queued
        })
        .map(|(p, _)| p)
        .collect()
}

/// The probe fired: resend every unit that may be missing, and back off. False if nothing is
/// outstanding.
///
/// If some unit is reported received, the probe resends the oldest unacknowledged PSN first
/// (its answer acknowledges what arrived in order) and every hole before the highest one
/// reported. Past that, nothing can tell a loss: the probe resends the newest unit unless it
/// is reported (as TCP's tail loss probe does), since a lost tail has no later packet to reveal
/// it. If nothing is reported, the newest unit is all it resends: if that was the loss, it
/// fills the gap and its ACK covers everything; if it had arrived, its duplicate draws an ACK
/// or a selective ACK, and that answer shows every hole sent before the probe
/// ([`queue_holes`]). Resending the oldest instead cost a lost tail a second probe: the oldest
/// had usually arrived, its ACK held back by coalescing.
pub(crate) fn probe(rc: &mut RcState, now: Instant) -> bool {
    rc.sr.probe_at = None;
    let comp = rc.comp_psn;
    if !comp.is_before(rc.sent_high) {
        return false;
    }
    rc.stats.sr_probes += 1;
    let newest = rc.sr.units.newest();
    if rc.sr.units.high().is_some() || newest.is_none() {
        queue_probed(&mut rc.sr, comp, true);
    }
    queue_holes(rc, true);
    if let Some(n) = newest.filter(|&n| !is_sacked(rc, n)) {
        queue_probed(&mut rc.sr, n, false);
    }
    rc.sr.probe_seq = Some(rc.sr.seq + 1);
    rc.sr.backoff = (rc.sr.backoff + 1).min(MAX_BACKOFF);
    rc.sr.probe_at = Some(now + probe_interval(rc));
    true
}

/// Queues unit `psn` for resend (first if `front`) unless it is queued already.
fn queue_probed(sr: &mut SrState, psn: Psn, front: bool) {
    if sr.units.get(psn).is_some_and(|u| u.queued) || sr.resend.contains(&psn) {
        return;
    }
    if front {
        sr.resend.push_front(psn);
    } else {
        sr.resend.push_back(psn);
    }
    if let Some(u) = sr.units.get_mut(psn) {
        u.queued = true;
    }
}

/// A go-back-N rewind resends everything not reported received: the resend queue is void.
pub(crate) fn rewound(rc: &mut RcState) {
    rc.sr.resend.clear();
    let delivered = rc.sr.delivered;
    rc.sr.units.unqueue_all(delivered);
}

/// Whether the requester must wait: [`WINDOW`] PSNs after the oldest unacknowledged one are
/// used, or [`FLIGHT`] PSNs are in flight (a READ reported received counts as one PSN, so its
/// flight is overestimated, never under). A go-back-N resend of what was sent before is never
/// held back by the flight: it is part of it.
pub(crate) fn window_full(rc: &RcState) -> bool {
    let used = rc.req_psn.diff(rc.comp_psn);
    let new = !rc.req_psn.is_before(rc.sent_high);
    used >= WINDOW || (new && used - rc.sr.units.sacked() >= FLIGHT)
}

/// Whether unit `psn` was reported received.
pub(crate) fn is_sacked(rc: &RcState, psn: Psn) -> bool {
    rc.sr.units.get(psn).is_some_and(|u| u.sacked)
}

/// Shifts every transmission sequence number down by the smallest one still compared (only
/// their differences steer the requester): states that differ in history only compare equal
/// (`Hca::canonical_state`).
pub(crate) fn rebase_seq(sr: &mut SrState) {
    let base = sr.units.min_seq().unwrap_or(sr.delivered).min(sr.delivered);
    sr.seq -= base.min(sr.seq);
    sr.delivered -= base;
    sr.probe_seq = sr.probe_seq.map(|s| s.saturating_sub(base));
    sr.units.rebase(base, sr.delivered);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::wire::BthRepr;

    fn at(us: u64) -> Instant {
        Instant::from_nanos(us * 1000)
    }

    fn unit(seq: u64, sacked: bool, queued: bool) -> Unit {
        Unit {
            seq,
            sacked,
            queued,
        }
    }

    /// An RcState whose requester has `units` (PSN → unit) in flight from `comp` on.
    fn requester(comp: u32, sent_high: u32, units: &[(u32, Unit)]) -> RcState {
        let mut rc = RcState {
            comp_psn: Psn::new(comp),
            req_psn: Psn::new(sent_high),
            sent_high: Psn::new(sent_high),
            ..RcState::default()
        };
        for &(k, u) in units {
            rc.sr.units.insert(Psn::new(k), u);
        }
        rc
    }

    fn resend(rc: &RcState) -> Vec<u32> {
        rc.sr.resend.iter().map(|p| p.value()).collect()
    }

    fn held(psn: u32, span: u32, placed: Option<Placed>, payload: &[u8]) -> Held {
        let bth = BthRepr::new(Opcode::SendOnly, 0x11, Psn::new(psn));
        Held {
            hdrs: PacketRepr::new(bth, &[]),
            payload: payload.to_vec(),
            len: payload.len().max(if placed.is_some() { 300 } else { 0 }),
            span,
            placed,
        }
    }

    fn placed(rkey: u32) -> Placed {
        Placed {
            rkey,
            key: rkey + 1,
            offset: 64,
            room: 4096,
        }
    }

    #[test]
    fn held_packet_is_replayed_with_its_payload_or_a_stand_in_of_its_length() {
        let h = held(7, 1, None, b"payload");
        let r = h.repr();
        assert_eq!((r.bth.psn, r.bth.opcode), (Psn::new(7), Opcode::SendOnly));
        assert_eq!(r.payload, b"payload");
        let p = held(8, 1, Some(placed(5)), &[]);
        let r = p.repr();
        assert_eq!(r.bth.psn, Psn::new(8));
        assert_eq!(r.payload, &[0u8; 300][..]);
    }

    #[test]
    fn nearest_placed_before_is_the_closest_placed_packet_strictly_before() {
        let mut rc = RcState::default();
        rc.sr
            .held
            .insert(Psn::new(10), held(10, 1, Some(placed(1)), &[]));
        rc.sr.held.insert(Psn::new(12), held(12, 1, None, b"x"));
        rc.sr
            .held
            .insert(Psn::new(14), held(14, 1, Some(placed(2)), &[]));
        rc.sr
            .held
            .insert(Psn::new(20), held(20, 1, Some(placed(3)), &[]));
        assert_eq!(
            nearest_placed_before(&rc, Psn::new(16)),
            Some((2, placed(2)))
        );
        assert_eq!(
            nearest_placed_before(&rc, Psn::new(14)),
            Some((4, placed(1)))
        );
        assert_eq!(
            nearest_placed_before(&rc, Psn::new(13)),
            Some((3, placed(1)))
        );
        assert_eq!(nearest_placed_before(&rc, Psn::new(10)), None);
        assert_eq!(nearest_placed_before(&rc, Psn::new(9)), None);
    }

    #[test]
    fn selective_acks_queued_back_to_back_merge_into_one_for_the_latest_epsn() {
        let mut rc = RcState {
            epsn: Psn::new(5),
            ..RcState::default()
        };
        queue_sack(&mut rc);
        rc.epsn = Psn::new(6);
        queue_sack(&mut rc);
        assert_eq!(
            rc.responses.iter().copied().collect::<Vec<_>>(),
            [Response::Sack { psn: Psn::new(6) }]
        );
        let ack = Response::Ack {
            psn: Psn::new(6),
            first: Psn::new(6),
        };
        rc.responses.push_back(ack);
        rc.epsn = Psn::new(9);
        queue_sack(&mut rc);
        assert_eq!(
            rc.responses.iter().copied().collect::<Vec<_>>(),
            [
                Response::Sack { psn: Psn::new(6) },
                ack,
                Response::Sack { psn: Psn::new(9) }
            ]
        );
    }

    #[test]
    fn next_held_is_the_one_at_epsn_and_those_passed_are_discarded() {
        let mut rc = RcState {
            epsn: Psn::new(7),
            ..RcState::default()
        };
        for k in [5, 7, 9] {
            rc.sr.held.insert(Psn::new(k), held(k, 1, None, b"p"));
        }
        let h = take_next_held(&mut rc).unwrap();
        assert_eq!(h.hdrs.bth.psn, Psn::new(7));
        assert_eq!(
            rc.sr
                .held
                .iter()
                .map(|(p, _)| p.value())
                .collect::<Vec<_>>(),
            [9]
        );
        assert!(take_next_held(&mut rc).is_none());
        assert_eq!(rc.sr.held.iter().count(), 1);
    }

    #[test]
    fn sack_bitmap_marks_executed_and_held_psns_after_its_psn() {
        // Queued at ePSN 10; 11 and 12 executed since; 15 held; a READ of 3 PSNs held at 20;
        // a READ spanning more than a SACK held at 30.
        let mut rc = RcState {
            epsn: Psn::new(13),
            ..RcState::default()
        };
        rc.sr.held.insert(Psn::new(15), held(15, 1, None, b"p"));
        rc.sr.held.insert(Psn::new(20), held(20, 3, None, &[]));
        let b = bitmap(&rc, Psn::new(10));
        let set: Vec<u32> = (0..SACK_SPAN).filter(|&i| b.has(i)).collect();
        assert_eq!(set, [0, 1, 4, 9, 10, 11]);
        rc.sr.held.insert(Psn::new(30), held(30, 1000, None, &[]));
        let b = bitmap(&rc, Psn::new(10));
        assert_eq!((0..SACK_SPAN).filter(|&i| b.has(i)).count(), 6 + 512 - 19);
        // A SACK queued before the gap closed: nothing executed after it is claimed before it.
        let b = bitmap(&rc, Psn::new(13));
        assert!(!b.has(0) && b.has(1) && !b.has(2));
    }

    #[test]
    fn a_transmission_gets_the_next_sequence_number_and_arms_the_probe_once() {
        let mut rc = RcState::default();
        rc.sr.units.insert(Psn::new(5), unit(0, false, true));
        sent(&mut rc, Psn::new(5), at(10));
        assert_eq!(rc.sr.seq, 1);
        let u = *rc.sr.units.get(Psn::new(5)).unwrap();
        assert_eq!((u.seq, u.queued), (1, false));
        assert_eq!(rc.sr.probe_at, Some(at(110)), "MIN_PROBE after now");
        sent(&mut rc, Psn::new(6), at(50));
        assert_eq!(
            (rc.sr.seq, rc.sr.units.get(Psn::new(6)).unwrap().seq),
            (2, 2)
        );
        assert_eq!(rc.sr.probe_at, Some(at(110)), "already armed");
    }

    #[test]
    fn probe_interval_is_three_round_trips_at_least_min_probe_doubled_per_backoff() {
        let mut rc = RcState::default();
        assert_eq!(probe_interval(&rc), MIN_PROBE);
        rc.srtt = Some(Duration::from_micros(20));
        assert_eq!(probe_interval(&rc), MIN_PROBE);
        rc.srtt = Some(Duration::from_micros(200));
        assert_eq!(probe_interval(&rc), Duration::from_micros(600));
        rc.sr.backoff = 2;
        assert_eq!(probe_interval(&rc), Duration::from_micros(2400));
        rc.sr.backoff = 40;
        assert_eq!(
            probe_interval(&rc),
            Duration::from_micros(600 << MAX_BACKOFF)
        );
    }

    #[test]
    fn progress_forgets_acknowledged_units_and_restarts_the_probe() {
        let mut rc = requester(
            5,
            8,
            &[
                (3, unit(1, true, false)),
                (4, unit(2, false, true)),
                (6, unit(3, true, false)),
                (7, unit(4, false, false)),
            ],
        );
        rc.sr.read_placed.extend([4, 7]);
        rc.sr.backoff = 3;
        progress(&mut rc, at(1000));
        assert_eq!(
            rc.sr
                .units
                .iter()
                .map(|(p, _)| p.value())
                .collect::<Vec<_>>(),
            [6, 7]
        );
        assert_eq!(rc.sr.units.sacked(), 1);
        assert_eq!(rc.sr.read_placed.iter().copied().collect::<Vec<_>>(), [7]);
        assert_eq!(rc.sr.backoff, 0);
        assert_eq!(rc.sr.probe_at, Some(at(1100)));
        rc.comp_psn = Psn::new(8);
        progress(&mut rc, at(2000));
        assert!(rc.sr.units.is_empty());
        assert_eq!((rc.sr.units.sacked(), rc.sr.probe_at), (0, None));
    }

    #[test]
    fn a_sack_marks_what_it_reports_and_raises_the_delivered_sequence_number() {
        let mut rc = requester(
            3,
            9,
            &[
                (3, unit(1, false, false)),
                (5, unit(2, false, false)),
                (6, unit(3, false, false)),
                (8, unit(4, false, false)),
            ],
        );
        let mut b = SackBitmap::default();
        b.set(0); // PSN 6
        note_sack(&mut rc, Psn::new(5), &b);
        let sacked: Vec<u32> = rc
            .sr
            .units
            .iter()
            .filter(|(_, u)| u.sacked)
            .map(|(p, _)| p.value())
            .collect();
        assert_eq!(sacked, [3, 6]);
        assert_eq!((rc.sr.units.sacked(), rc.sr.delivered), (2, 3));
        note_sack(&mut rc, Psn::new(5), &b);
        assert_eq!(
            (rc.sr.units.sacked(), rc.stats.sacks_rcvd),
            (2, 2),
            "counted once"
        );
        assert!(is_sacked(&rc, Psn::new(6)) && !is_sacked(&rc, Psn::new(5)));
        assert!(!is_sacked(&rc, Psn::new(4)));
    }

    /// Units 9..=16 from comp 10: the holes below the highest unit reported received (15) that
    /// are neither reported nor queued are resent once 8 later transmissions were delivered;
    /// the probe resends them regardless.
    fn holes_fixture() -> RcState {
        let mut rc = requester(
            10,
            17,
            &[
                (9, unit(1, false, false)),   // before comp: acknowledged
                (10, unit(2, false, false)),  // hole, old enough
                (11, unit(3, true, false)),   // reported
                (12, unit(4, false, true)),   // queued already
                (13, unit(11, false, false)), // hole, too recent
                (14, unit(1, false, false)),  // hole, old enough
                (15, unit(5, true, false)),   // the highest reported
                (16, unit(1, false, false)),  // after it: maybe in flight
            ],
        );
        rc.sr.delivered = 12;
        rc
    }

    #[test]
    fn holes_are_queued_once_past_the_reorder_threshold_or_all_on_a_probe() {
        let mut rc = holes_fixture();
        queue_holes(&mut rc, false);
        assert_eq!(resend(&rc), [10, 14]);
        assert!(
            rc.sr.units.get(Psn::new(10)).unwrap().queued
                && rc.sr.units.get(Psn::new(14)).unwrap().queued
        );
        assert!(!rc.sr.units.get(Psn::new(13)).unwrap().queued);
        queue_holes(&mut rc, false);
        assert_eq!(resend(&rc), [10, 14], "not queued twice");
        queue_holes(&mut rc, true);
        assert_eq!(resend(&rc), [10, 14, 13]);
        // Exactly at the threshold: seq + 8 == delivered.
        let mut rc = holes_fixture();
        rc.sr.delivered = 10;
        queue_holes(&mut rc, false);
        assert_eq!(resend(&rc), [10, 14]);
        let mut rc2 = holes_fixture();
        rc2.sr.delivered = 9;
        queue_holes(&mut rc2, false);
        assert_eq!(resend(&rc2), [14]);
        // The probe's answer: a transmission sent after the latest probe fired (sequence
        // number `probe_seq` or later) is delivered, so every hole sent before it is lost.
        for (probe_seq, want, left) in [
            (12, &[10, 13, 14][..], None),
            (11, &[10, 14][..], None),
            (13, &[10, 14][..], Some(13)),
            (0, &[10, 14][..], None),
        ] {
            let mut rc = holes_fixture();
            rc.sr.probe_seq = Some(probe_seq);
            queue_holes(&mut rc, false);
            assert_eq!(resend(&rc), want, "probe_seq {probe_seq}");
            assert_eq!(rc.sr.probe_seq, left, "cleared once answered");
        }
        // Nothing reported received: no hole can be told.
        let mut rc = requester(10, 12, &[(10, unit(1, false, false))]);
        rc.sr.delivered = 100;
        queue_holes(&mut rc, true);
        assert!(rc.sr.resend.is_empty());
    }

    #[test]
    fn holes_are_resent_in_psn_order_across_the_psn_wrap() {
        let mut rc = requester(
            0xFF_FFFE,
            3,
            &[
                (0xFF_FFFE, unit(1, false, false)),
                (0xFF_FFFF, unit(1, false, false)),
                (0, unit(2, false, false)),
                (1, unit(3, true, false)),
            ],
        );
        rc.sr.delivered = 20;
        queue_holes(&mut rc, false);
        assert_eq!(resend(&rc), [0xFF_FFFE, 0xFF_FFFF, 0]);
    }

    #[test]
    fn probe_resends_the_oldest_or_if_nothing_is_reported_the_newest_then_every_hole() {
        let mut rc = holes_fixture();
        rc.sr.probe_at = Some(at(5));
        assert!(probe(&mut rc, at(5)));
        // The oldest, the holes before the highest reported (15), and the newest past it.
        assert_eq!(resend(&rc), [10, 13, 14, 16]);
        assert_eq!((rc.stats.sr_probes, rc.sr.backoff), (1, 1));
        assert_eq!(rc.sr.probe_at, Some(at(205)), "MIN_PROBE doubled once");
        // Again: all queued already; nothing new.
        assert!(probe(&mut rc, at(300)));
        assert_eq!(resend(&rc), [10, 13, 14, 16]);
        assert_eq!((rc.stats.sr_probes, rc.sr.backoff), (2, 2));
        assert_eq!(rc.sr.probe_at, Some(at(700)));
        for _ in 0..10 {
            probe(&mut rc, at(1000));
        }
        assert_eq!(rc.sr.backoff, MAX_BACKOFF);
        // Nothing reported received (a lost tail or selective ACK): the newest goes again,
        // alone, and the first transmission after the probe is the one whose delivery answers it.
        let mut rc = requester(
            10,
            13,
            &[
                (10, unit(1, false, false)),
                (11, unit(2, false, false)),
                (12, unit(3, false, false)),
            ],
        );
        rc.sr.seq = 3;
        assert!(probe(&mut rc, at(0)));
        assert_eq!(resend(&rc), [12]);
        assert_eq!(rc.sr.probe_seq, Some(4));
        assert!(
            rc.sr.units.get(Psn::new(12)).unwrap().queued
                && !rc.sr.units.get(Psn::new(10)).unwrap().queued
                && !rc.sr.units.get(Psn::new(11)).unwrap().queued
        );
        // Again, with the newest still queued: not twice.
        assert!(probe(&mut rc, at(300)));
        assert_eq!(resend(&rc), [12]);
        // The newest is reported received: only the oldest goes.
        let mut rc = requester(
            10,
            12,
            &[(10, unit(1, false, false)), (11, unit(2, true, false))],
        );
        assert!(probe(&mut rc, at(0)));
        assert_eq!(resend(&rc), [10]);
        // No unit at all: the oldest goes.
        let mut rc = requester(10, 12, &[]);
        assert!(probe(&mut rc, at(0)));
        assert_eq!(resend(&rc), [10]);
        // The oldest is in the resend queue without being marked (no unit for it): not twice.
        let mut rc = requester(10, 12, &[(11, unit(1, true, false))]);
        rc.sr.resend.push_back(Psn::new(10));
        assert!(probe(&mut rc, at(0)));
        assert_eq!(resend(&rc), [10]);
        // Nothing outstanding: the probe is disarmed and does nothing.
        let mut rc = requester(12, 12, &[]);
        rc.sr.probe_at = Some(at(5));
        assert!(!probe(&mut rc, at(5)));
        assert_eq!(
            (rc.sr.probe_at, rc.stats.sr_probes, rc.sr.backoff),
            (None, 0, 0)
        );
        assert!(rc.sr.resend.is_empty());
    }

    #[test]
    fn a_go_back_n_rewind_voids_the_resend_queue() {
        let mut rc = holes_fixture();
        queue_holes(&mut rc, true);
        rewound(&mut rc);
        assert!(rc.sr.resend.is_empty());
        assert!(rc.sr.units.iter().map(|(_, u)| u).all(|u| !u.queued));
    }

    #[test]
    fn window_holds_512_psns_and_the_flight_128_not_reported_received() {
        let full = |used: u32, sacked: i32, resending: bool| {
            let reported: Vec<(u32, Unit)> = (0..sacked.unsigned_abs())
                .map(|i| (100 + i, unit(0, true, false)))
                .collect();
            let mut rc = requester(100, 100 + used, &reported);
            assert_eq!(rc.sr.units.sacked(), sacked);
            if resending {
                rc.req_psn = Psn::new(100 + used - 1);
            }
            window_full(&rc)
        };
        assert!(!full(127, 0, false));
        assert!(full(128, 0, false));
        assert!(!full(128, 1, false));
        assert!(full(129, 1, false));
        assert!(!full(511, 400, false));
        assert!(full(512, 400, false));
        // A go-back-N resend is never held back by the flight, only by the window.
        assert!(!full(300, 0, true));
        assert!(!full(512, 0, true));
        assert!(full(513, 0, true));
    }

    #[test]
    fn rebasing_shifts_every_sequence_number_by_the_smallest_one_compared() {
        let mut sr = SrState {
            seq: 12,
            delivered: 7,
            probe_seq: Some(11),
            ..SrState::default()
        };
        sr.units.insert(Psn::new(1), unit(5, false, false));
        sr.units.insert(Psn::new(2), unit(9, true, false));
        rebase_seq(&mut sr);
        assert_eq!((sr.seq, sr.delivered, sr.probe_seq), (7, 2, Some(6)));
        assert_eq!(
            sr.units.iter().map(|(_, u)| u.seq).collect::<Vec<_>>(),
            [0, 4]
        );
        let mut sr = SrState {
            seq: 10,
            delivered: 3,
            ..SrState::default()
        };
        rebase_seq(&mut sr);
        assert_eq!((sr.seq, sr.delivered), (7, 0));
    }
}
