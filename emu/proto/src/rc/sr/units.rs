//! The requester's units in flight (selective repeat), indexed so that a selective ACK costs
//! what it reports new, not a walk over every unit (issue 19 round 4): units sorted by PSN
//! (binary search), a bitset of the PSNs already reported received (a selective ACK's bitmap is
//! compared with it a word at a time), the highest unit reported received kept as it rises, and
//! the units that may become holes in transmission order (their sequence numbers rise), so that
//! finding the holes old enough to resend pops a prefix. It is not the policy of what to resend:
//! see the parent module.

use std::collections::VecDeque;
use std::fmt;

use super::Unit;
use super::bits::PsnBits;
use crate::wire::{Psn, SACK_SPAN, SackBitmap};

/// Units in flight by PSN (a READ or atomic is one unit at its first PSN), with the indexes.
#[derive(Clone, Default)]
pub(crate) struct Units {
    /// The units, in PSN order.
    list: VecDeque<(Psn, Unit)>,
    /// Units in `list` reported received.
    sacked: i32,
    /// The highest unit reported received.
    high: Option<Psn>,
    /// PSNs reported received and taken into account: a unit's bit is cleared when it is sent again, so that the next report
    /// of it counts its new transmission as delivered.
    known: PsnBits,
    /// (sequence number, PSN) of every transmission whose unit may still be a hole, in
    /// sequence-number order; entries of units since reported, queued or sent again are stale
    /// and skipped. Every unit neither reported received nor queued has its entry here.
    candidates: VecDeque<(u64, Psn)>,
}

impl Units {
    /// Whether there are none.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Units reported received.
    pub(crate) fn sacked(&self) -> i32 {
        self.sacked
    }

    /// The highest unit reported received.
    pub(crate) fn high(&self) -> Option<Psn> {
        self.high
    }

    /// The newest unit (the highest PSN sent and not acknowledged).
    pub(crate) fn newest(&self) -> Option<Psn> {
        self.list.back().map(|&(p, _)| p)
    }

    /// Where unit `psn` is in `list` (`Err`: where it would go).
    fn position(&self, psn: Psn) -> Result<usize, usize> {
        let Some(&(front, _)) = self.list.front() else {
            return Err(0);
        };
        let key = psn.diff(front);
        if key < 0 {
            return Err(0);
        }
        if self.list.back().is_some_and(|&(b, _)| psn.is_after(b)) {
            return Err(self.list.len());
        }
        // A stream of one-packet units (SEND and WRITE packets) has one unit per PSN: the
        // offset is the index, and the search is a single probe.
        let at = usize::try_from(key).unwrap_or(usize::MAX);
        if self.list.get(at).is_some_and(|&(p, _)| p == psn) {
            return Ok(at);
        }
        self.list.binary_search_by(|(p, _)| p.diff(front).cmp(&key))
    }

    /// Unit `psn`.
    pub(crate) fn get(&self, psn: Psn) -> Option<&Unit> {
        let i = self.position(psn).ok()?;
        self.list.get(i).map(|(_, u)| u)
    }

    /// Unit `psn`, mutable (for the flags only: [`Units::sent`] changes its sequence number and
    /// [`Units::report`] marks it received).
    pub(crate) fn get_mut(&mut self, psn: Psn) -> Option<&mut Unit> {
        let i = self.position(psn).ok()?;
        self.list.get_mut(i).map(|(_, u)| u)
    }

    /// The units in PSN order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Psn, &Unit)> {
        self.list.iter().map(|(p, u)| (*p, u))
    }

    /// Adds unit `psn` as it is (test fixtures; the requester adds units by sending them).
    #[cfg(test)]
    pub(crate) fn insert(&mut self, psn: Psn, unit: Unit) {
        match self.position(psn) {
            Ok(i) => {
                if let Some(slot) = self.list.get_mut(i) {
                    *slot = (psn, unit);
                }
            }
            Err(i) => self.list.insert(i, (psn, unit)),
        }
        self.reindex(0);
    }

    /// Records transmission `seq` of unit `psn` (adding it if new): no longer queued, and a hole
    /// candidate again unless reported received.
    pub(crate) fn sent(&mut self, psn: Psn, seq: u64) {
        let i = match self.position(psn) {
            Ok(i) => i,
            Err(i) => {
                self.list.insert(i, (psn, Unit::default()));
                i
            }
        };
        let Some((_, u)) = self.list.get_mut(i) else {
            return;
        };
        u.seq = seq;
        u.queued = false;
        if u.sacked {
            self.known.set(psn, false);
        } else {
            self.candidates.push_back((seq, psn));
        }
    }

    /// Marks unit `i` of `list` reported received; its sequence number.
    fn mark(&mut self, i: usize) -> Option<u64> {
        let (psn, u) = self.list.get_mut(i)?;
        if !u.sacked {
            u.sacked = true;
            self.sacked += 1;
            if self.high.is_none_or(|h| psn.is_after(h)) {
                self.high = Some(*psn);
            }
        }
        Some(u.seq)
    }

    /// A selective ACK with BTH PSN `psn` and `bitmap`, for a requester that has sent every PSN
    /// before `sent_high`: marks the units it reports received (every one before `psn`, and
    /// those its bitmap names) and returns the highest sequence number among them — the
    /// units before `psn` every time, a unit its bitmap names only the first time since its
    /// latest transmission.
    pub(crate) fn report(&mut self, psn: Psn, bitmap: &SackBitmap, sent_high: Psn) -> u64 {
        let mut delivered = 0;
        let mut i = 0;
        while self.list.get(i).is_some_and(|(p, _)| p.is_before(psn)) {
            delivered = delivered.max(self.mark(i).unwrap_or(0));
            i += 1;
        }
        let base = psn.wrapping_add(1);
        let n = u32::try_from(sent_high.diff(base))
            .unwrap_or(0)
            .min(SACK_SPAN);
        for (j, &word) in (0u32..).zip(bitmap.0.iter()) {
            let lo = 64 * j;
            let valid = match n.saturating_sub(lo) {
                0 => break,
                r if r >= 64 => u64::MAX,
                r => (1 << r) - 1,
            };
            let mut new = word & valid & !self.known.word_at(base.wrapping_add(lo));
            while new != 0 {
                let bit = new.trailing_zeros();
                new &= new - 1;
                let p = base.wrapping_add(lo + bit);
                self.known.set(p, true);
                if let Ok(k) = self.position(p) {
                    delivered = delivered.max(self.mark(k).unwrap_or(0));
                }
            }
        }
        delivered
    }

    /// Forgets the units before `comp` (acknowledged).
    pub(crate) fn forget_before(&mut self, comp: Psn) {
        while let Some((_, u)) = self.list.front().filter(|(p, _)| p.is_before(comp)) {
            self.sacked -= i32::from(u.sacked);
            self.list.pop_front();
        }
        if self.high.is_some_and(|h| h.is_before(comp)) {
            self.high = None;
        }
        self.known.drop_before(comp);
        while let Some(&e) = self.candidates.front() {
            if !e.1.is_before(comp) && self.live(e) {
                break;
            }
            self.candidates.pop_front();
        }
    }

    /// Whether candidate entry `(seq, psn)` still stands for a unit that may be a hole.
    fn live(&self, (seq, psn): (u64, Psn)) -> bool {
        self.get(psn)
            .is_some_and(|u| u.seq == seq && !u.sacked && !u.queued)
    }

    /// The units before the highest one reported received (from `comp` on), neither reported
    /// nor queued, whose latest transmission's sequence number is at most `limit`; in
    /// sequence-number order. Pops the candidates it passes except those not yet below the
    /// highest one reported received.
    pub(crate) fn old_holes(&mut self, comp: Psn, limit: u64) -> Vec<Psn> {
        let Some(high) = self.high else {
            return Vec::new();
        };
        let high = high.diff(comp);
        let (mut holes, mut above) = (Vec::new(), Vec::new());
        while let Some(&(seq, psn)) = self.candidates.front().filter(|(s, _)| *s <= limit) {
            self.candidates.pop_front();
            if !self.live((seq, psn)) {
                continue;
            }
            let off = psn.diff(comp);
            if off >= 0 && off < high {
                holes.push(psn);
            } else {
                above.push((seq, psn));
            }
        }
        for e in above.into_iter().rev() {
            self.candidates.push_front(e);
        }
        holes
    }

    /// Rebuilds the indexes from the units (after their flags changed wholesale), for a
    /// requester whose highest sequence number known delivered is `delivered`: a unit reported
    /// received counts as taken into account if its latest transmission is not after that.
    pub(crate) fn reindex(&mut self, delivered: u64) {
        self.sacked = 0;
        self.high = None;
        self.known.clear();
        let mut candidates = Vec::new();
        for i in 0..self.list.len() {
            let Some(&(psn, u)) = self.list.get(i) else {
                continue;
            };
            if u.sacked {
                self.sacked += 1;
                self.high = Some(psn);
                if u.seq <= delivered {
                    self.known.set(psn, true);
                }
            } else if !u.queued {
                candidates.push((u.seq, psn));
            }
        }
        // Stable: units sent with one sequence number (fixtures only) stay in PSN order.
        candidates.sort_by_key(|&(seq, _)| seq);
        self.candidates = candidates.into();
    }

    /// Clears every unit's queued flag (they are all hole candidates again).
    pub(crate) fn unqueue_all(&mut self, delivered: u64) {
        for (_, u) in &mut self.list {
            u.queued = false;
        }
        self.reindex(delivered);
    }

    /// Subtracts `base` from every sequence number and `delivered` (see `rebase_seq`).
    pub(crate) fn rebase(&mut self, base: u64, delivered: u64) {
        for (_, u) in &mut self.list {
            u.seq -= base;
        }
        self.reindex(delivered);
    }

    /// The smallest sequence number of a unit.
    pub(crate) fn min_seq(&self) -> Option<u64> {
        self.list.iter().map(|(_, u)| u.seq).min()
    }
}

/// As a map from PSN to unit (the indexes are derived, not state).
impl fmt::Debug for Units {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.list.iter().map(|(p, u)| (p.value(), u)))
            .finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A unit reported received and then sent again (a go-back-N resend of a READ) counts its
    /// new transmission as delivered when it is reported again; reported again without being
    /// sent again, it adds nothing.
    #[test]
    fn a_unit_sent_again_after_its_report_counts_its_new_transmission() {
        let mut units = Units::default();
        for (k, seq) in [(10, 1), (11, 2), (12, 3)] {
            units.sent(Psn::new(k), seq);
        }
        let mut b = SackBitmap::default();
        b.set(1); // PSN 11: bit 0 is PSN 10, the one after the SACK's PSN
        let sack = Psn::new(9);
        assert_eq!(units.report(sack, &b, Psn::new(13)), 2);
        assert_eq!(units.report(sack, &b, Psn::new(13)), 0, "nothing new");
        units.sent(Psn::new(11), 7);
        assert_eq!(units.report(sack, &b, Psn::new(13)), 7);
        assert_eq!((units.sacked(), units.high()), (1, Some(Psn::new(11))));
        // Bits at or after sent_high name nothing sent.
        b.set(3);
        units.sent(Psn::new(13), 8);
        assert_eq!(units.report(sack, &b, Psn::new(13)), 0);
        assert_eq!(units.report(sack, &b, Psn::new(14)), 8);
    }

    /// Random transmissions, resends, selective ACKs, acknowledgements, holes queued and
    /// rewinds (across the PSN wrap) agree with a plain map walked in full per step, as the
    /// requester did before the indexes: units reported, the delivered sequence number, the
    /// highest unit reported and the holes old enough.
    #[test]
    fn the_indexes_agree_with_a_map_walked_in_full() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut rnd = |n: u32| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            u32::try_from(x % u64::from(n)).unwrap()
        };
        let start = Psn::new(0xFF_FE00);
        let psn = |off: u32| start.wrapping_add(off);
        let mut units = Units::default();
        let mut map: BTreeMap<u32, Unit> = BTreeMap::new();
        let (mut comp, mut high_sent, mut seq, mut delivered) = (0u32, 0u32, 0u64, 0u64);
        for _ in 0..30_000 {
            match rnd(10) {
                0..=3 if high_sent - comp < 600 => {
                    // A new unit: one PSN, or a READ of several.
                    seq += 1;
                    units.sent(psn(high_sent), seq);
                    let u = map.entry(high_sent).or_default();
                    (u.seq, u.queued) = (seq, false);
                    high_sent += if rnd(8) == 0 { 1 + rnd(20) } else { 1 };
                }
                4 if !map.is_empty() => {
                    // A resend of an existing unit.
                    let keys: Vec<u32> = map.keys().copied().collect();
                    let k = keys[rnd(u32::try_from(keys.len()).unwrap()) as usize];
                    seq += 1;
                    units.sent(psn(k), seq);
                    let u = map.get_mut(&k).unwrap();
                    (u.seq, u.queued) = (seq, false);
                }
                5 | 6 => {
                    // A selective ACK at a PSN from comp to sent_high, sometimes acknowledged.
                    let at = comp + rnd(high_sent - comp + 1);
                    let mut b = SackBitmap::default();
                    let bits = if rnd(2) == 0 { rnd(4) } else { rnd(300) };
                    for _ in 0..bits {
                        b.set(rnd(SACK_SPAN + 8));
                    }
                    let got = units.report(psn(at), &b, psn(high_sent));
                    let mut want = 0;
                    for (&k, u) in &mut map {
                        let hit = k < at
                            || (k > at && k - at - 1 < high_sent - at - 1 && b.has(k - at - 1));
                        if hit {
                            want = want.max(u.seq);
                            u.sacked = true;
                        }
                    }
                    assert_eq!(delivered.max(got), delivered.max(want));
                    delivered = delivered.max(want);
                    if rnd(2) == 0 {
                        comp = at;
                        units.forget_before(psn(comp));
                        map.retain(|&k, _| k >= comp);
                    }
                }
                7 | 8 => {
                    let limit = delivered.saturating_sub(u64::from(rnd(10)));
                    let high = map.iter().filter(|(_, u)| u.sacked).map(|(&k, _)| k).max();
                    let mut want: Vec<u32> = map
                        .iter()
                        .filter(|&(&k, u)| {
                            high.is_some_and(|h| k < h) && !u.sacked && !u.queued && u.seq <= limit
                        })
                        .map(|(&k, _)| k)
                        .collect();
                    let mut got: Vec<u32> = units
                        .old_holes(psn(comp), limit)
                        .iter()
                        .map(|p| u32::try_from(p.diff(start)).unwrap())
                        .collect();
                    got.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(got, want);
                    for k in got {
                        units.get_mut(psn(k)).unwrap().queued = true;
                        map.get_mut(&k).unwrap().queued = true;
                    }
                }
                9 => {
                    units.unqueue_all(delivered);
                    map.values_mut().for_each(|u| u.queued = false);
                }
                _ => {}
            }
            let got: Vec<(u32, bool, bool, u64)> = units
                .iter()
                .map(|(p, u)| {
                    (
                        u32::try_from(p.diff(start)).unwrap(),
                        u.sacked,
                        u.queued,
                        u.seq,
                    )
                })
                .collect();
            let want: Vec<(u32, bool, bool, u64)> = map
                .iter()
                .map(|(&k, u)| (k, u.sacked, u.queued, u.seq))
                .collect();
            assert_eq!(got, want);
            let sacked = map.values().filter(|u| u.sacked).count();
            assert_eq!(units.sacked(), i32::try_from(sacked).unwrap());
            let high = map
                .iter()
                .filter(|(_, u)| u.sacked)
                .map(|(&k, _)| psn(k))
                .next_back();
            assert_eq!(units.high(), high);
        }
    }
}
