//! The responder's held requests (selective repeat): a ring indexed by a PSN's offset from the
//! oldest slot, so that holding, finding, taking the next one in order and finding the nearest
//! placed one before a PSN cost O(1) or the distance walked, not a walk over every held packet
//! (issue 19 round 4), with a bitset of the PSNs held, so that a selective ACK's bitmap is
//! built a word at a time. It is not the policy of what to hold: see the parent module.

use std::collections::VecDeque;
use std::fmt;

use super::bits::PsnBits;
use super::{Held, Placed};
use crate::wire::{Psn, SACK_SPAN, SackBitmap};

/// Held requests by PSN. Every PSN held is at most a selective ACK's span after the responder's
/// ePSN, so the ring stays that short.
#[derive(Clone, Default)]
pub(crate) struct HeldRing {
    /// The PSN of `slots[0]`.
    base: Psn,
    /// One slot per PSN from `base` on; the first and last are occupied when any is.
    slots: VecDeque<Option<Held>>,
    /// Occupied slots.
    len: usize,
    /// The PSNs of the held requests that cover one PSN.
    bits: PsnBits,
    /// Held requests that cover more than one PSN (READs): not in `bits`.
    wide: usize,
}

impl HeldRing {
    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slot of `psn`, if it is inside the ring.
    fn index(&self, psn: Psn) -> Option<usize> {
        usize::try_from(psn.diff(self.base))
            .ok()
            .filter(|&i| i < self.slots.len())
    }

    /// Whether a request at `psn` is held.
    pub(crate) fn contains(&self, psn: Psn) -> bool {
        self.index(psn)
            .and_then(|i| self.slots.get(i))
            .is_some_and(Option::is_some)
    }

    /// Holds `held` at `psn`, replacing one held there.
    pub(crate) fn insert(&mut self, psn: Psn, held: Held) {
        // One held there already is replaced (never by the responder: it holds first copies).
        if self.contains(psn) {
            let _replaced = self.take(psn);
        }
        if self.len == 0 {
            self.slots.clear();
            self.base = psn;
            self.bits.clear();
        }
        if held.span > 1 {
            self.wide += 1;
        } else {
            self.bits.set(psn, true);
        }
        let d = psn.diff(self.base);
        if d < 0 {
            for _ in 0..d.unsigned_abs() {
                self.slots.push_front(None);
            }
            self.base = psn;
        }
        let i = usize::try_from(psn.diff(self.base)).unwrap_or(0);
        // Appending (the usual case: PSNs arrive in order past a gap) moves `held` once, and
        // writes no empty slot to overwrite.
        if self.slots.len() <= i {
            self.slots.resize_with(i, || None);
            self.slots.push_back(Some(held));
            self.len += 1;
        } else if let Some(slot) = self.slots.get_mut(i) {
            self.len += 1;
            *slot = Some(held);
        }
    }

    /// Accounts for `held`, leaving the ring.
    fn left(&mut self, psn: Psn, held: &Held) {
        self.len -= 1;
        if held.span > 1 {
            self.wide -= 1;
        } else {
            self.bits.set(psn, false);
        }
    }

    /// Discards every request held before `psn`.
    pub(crate) fn discard_before(&mut self, psn: Psn) {
        let Ok(n) = usize::try_from(psn.diff(self.base)) else {
            return;
        };
        if n == 0 {
            return;
        }
        if self.len == 0 {
            self.base = psn;
            return;
        }
        for _ in 0..n.min(self.slots.len()) {
            if let Some(Some(held)) = self.slots.pop_front() {
                self.left(self.base, &held);
            }
            self.base = self.base.wrapping_add(1);
        }
        self.base = psn;
        if self.len == 0 {
            self.slots.clear();
        }
        self.trim();
    }

    /// Takes the request held at `psn`.
    pub(crate) fn take(&mut self, psn: Psn) -> Option<Held> {
        let i = self.index(psn)?;
        // The oldest one (the usual case: the gap filled) leaves with its slot, moved once.
        let held = if i == 0 {
            let slot = self.slots.pop_front()?;
            self.base = self.base.wrapping_add(1);
            slot?
        } else {
            self.slots.get_mut(i)?.take()?
        };
        self.left(psn, &held);
        self.trim();
        Some(held)
    }

    /// Drops empty slots at both ends, and the words of `bits` before the first slot.
    fn trim(&mut self) {
        if self.len == 0 {
            self.slots.clear();
            self.bits.clear();
            return;
        }
        while self.slots.front().is_some_and(Option::is_none) {
            self.slots.pop_front();
            self.base = self.base.wrapping_add(1);
        }
        while self.slots.back().is_some_and(Option::is_none) {
            self.slots.pop_back();
        }
        self.bits.drop_before(self.base);
    }

    /// Sets in `bitmap`, whose bit 0 stands for `base`, the bit of every PSN a held request
    /// covers (a READ covers its response PSNs).
    pub(crate) fn add_to(&self, bitmap: &mut SackBitmap, base: Psn) {
        for (w, j) in bitmap.0.iter_mut().zip(0u32..) {
            *w |= self.bits.word_at(base.wrapping_add(64 * j));
        }
        if self.wide == 0 {
            return;
        }
        for (k, h) in self.iter().filter(|(_, h)| h.span > 1) {
            let start = i64::from(k.diff(base));
            for j in 0..i64::from(h.span.min(SACK_SPAN)) {
                if let Ok(o) = u32::try_from(start + j) {
                    bitmap.set(o);
                }
            }
        }
    }

    /// The held requests in PSN order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Psn, &Held)> {
        let base = self.base;
        self.slots.iter().zip(0u32..).filter_map(move |(slot, i)| {
            let held = slot.as_ref()?;
            Some((base.wrapping_add(i), held))
        })
    }

    /// The held packet placed on arrival nearest before `psn`: how many PSNs before, and where
    /// it went. Walks back from `psn` to the first placed one.
    pub(crate) fn nearest_placed_before(&self, psn: Psn) -> Option<(u32, Placed)> {
        let d = usize::try_from(psn.diff(self.base)).ok()?;
        // The PSN just before placed (the usual case: a stream held past a gap) ends the walk.
        let prev = d
            .checked_sub(1)
            .and_then(|i| self.slots.get(i)?.as_ref()?.placed);
        if let Some(placed) = prev {
            return Some((1, placed));
        }
        let end = d.min(self.slots.len());
        let (i, placed) = self
            .slots
            .range(..end)
            .enumerate()
            .rev()
            .find_map(|(i, slot)| Some((i, slot.as_ref()?.placed?)))?;
        Some((u32::try_from(d - i).ok()?, placed))
    }
}

/// As a map from PSN to request (the ring's layout is not state).
impl fmt::Debug for HeldRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(psn, h)| (psn.value(), h)))
            .finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::wire::{BthRepr, Opcode, PacketRepr};

    fn held(span: u32, placed: bool) -> Held {
        let bth = BthRepr::new(Opcode::RdmaWriteMiddle, 1, Psn::new(0));
        Held {
            hdrs: PacketRepr::new(bth, &[]),
            payload: Vec::new(),
            len: 0,
            span,
            placed: placed.then_some(Placed {
                rkey: span,
                key: 0,
                offset: 0,
                room: 0,
            }),
        }
    }

    /// Holding at a PSN held already replaces that request: counted once, in `bits` or `wide` as
    /// the new one covers.
    #[test]
    fn holding_again_at_a_held_psn_replaces_it() {
        let mut ring = HeldRing::default();
        ring.insert(Psn::new(5), held(1, false));
        ring.insert(Psn::new(7), held(1, true));
        ring.insert(Psn::new(5), held(3, true));
        assert_eq!((ring.len, ring.wide), (2, 1));
        let spans: Vec<(Psn, u32)> = ring.iter().map(|(p, h)| (p, h.span)).collect();
        assert_eq!(spans, [(Psn::new(5), 3), (Psn::new(7), 1)]);
        let mut b = SackBitmap::default();
        ring.add_to(&mut b, Psn::new(5));
        assert_eq!(b.0.first(), Some(&0b111));
        assert_eq!(ring.take(Psn::new(5)).map(|h| h.span), Some(3));
        assert_eq!((ring.len, ring.wide), (1, 0));
        // Taking one after the oldest leaves the oldest where it is.
        ring.insert(Psn::new(9), held(2, false));
        assert_eq!(ring.take(Psn::new(9)).map(|h| h.span), Some(2));
        let left: Vec<(Psn, u32)> = ring.iter().map(|(p, h)| (p, h.span)).collect();
        assert_eq!(left, [(Psn::new(7), 1)]);
        assert!(ring.contains(Psn::new(7)) && !ring.contains(Psn::new(9)));
    }

    /// Random holds, takes and discards around a moving ePSN (across the PSN wrap) agree with
    /// a plain map walked in full: membership, order, the nearest placed packet and the
    /// selective ACK bitmap.
    #[test]
    fn the_ring_agrees_with_a_map_walked_in_full() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = |n: u32| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            u32::try_from(x % u64::from(n)).unwrap()
        };
        let mut ring = HeldRing::default();
        let mut map: BTreeMap<i32, (u32, bool)> = BTreeMap::new();
        let start = Psn::new(0xFF_FF00);
        let mut epsn = 0i32;
        for _ in 0..20_000 {
            let psn = |off: i32| start.wrapping_add(u32::try_from(off).unwrap());
            match rnd(8) {
                0..=3 => {
                    let off = epsn + 1 + i32::try_from(rnd(300)).unwrap();
                    let span = if rnd(10) == 0 { 1 + rnd(600) } else { 1 };
                    let placed = rnd(3) > 0;
                    ring.discard_before(psn(epsn));
                    map.retain(|&k, _| k >= epsn);
                    if !ring.contains(psn(off)) {
                        assert!(!map.contains_key(&off));
                        ring.insert(psn(off), held(span, placed));
                        map.insert(off, (span, placed));
                    }
                }
                4 | 5 => {
                    epsn += i32::try_from(rnd(3)).unwrap();
                    ring.discard_before(psn(epsn));
                    map.retain(|&k, _| k >= epsn);
                    let got = ring.take(psn(epsn)).map(|h| (h.span, h.placed.is_some()));
                    assert_eq!(got, map.remove(&epsn));
                }
                6 => epsn += i32::try_from(rnd(40)).unwrap(),
                _ => {
                    let at = epsn + i32::try_from(rnd(400)).unwrap();
                    let want = map
                        .range(..at)
                        .rev()
                        .find(|(_, (_, p))| *p)
                        .map(|(&k, &(span, _))| (u32::try_from(at - k).unwrap(), span));
                    let got = ring
                        .nearest_placed_before(psn(at))
                        .map(|(d, p)| (d, p.rkey));
                    assert_eq!(got, want);
                    let sack = i32::try_from(rnd(3)).unwrap();
                    let base = psn(epsn - 1 + sack);
                    let mut b = SackBitmap::default();
                    ring.add_to(&mut b, base);
                    let mut w = SackBitmap::default();
                    for (&k, &(span, _)) in &map {
                        for j in 0..span.min(SACK_SPAN) {
                            let o = k - (epsn - 1 + sack) + i32::try_from(j).unwrap();
                            if let Ok(o) = u32::try_from(o) {
                                w.set(o);
                            }
                        }
                    }
                    assert_eq!(b, w);
                }
            }
            let keys: Vec<Psn> = ring.iter().map(|(p, _)| p).collect();
            let want: Vec<Psn> = map.keys().map(|&k| psn(k)).collect();
            assert_eq!(keys, want);
            assert_eq!(ring.is_empty(), map.is_empty());
            // The ring is no longer than its held span: the first and last slots are occupied.
            let occupied = ring.slots.iter().filter(|s| s.is_some()).count();
            assert_eq!((ring.len, occupied), (map.len(), map.len()));
            let wide = map.values().filter(|&&(span, _)| span > 1).count();
            assert_eq!(ring.wide, wide, "the count of held READs");
            assert!(ring.slots.front().is_none_or(Option::is_some));
            assert!(ring.slots.back().is_none_or(Option::is_some));
        }
    }
}
