//! The responder's held requests (selective repeat): a ring indexed by a PSN's offset from the
//! oldest slot, so that holding, finding, taking the next one in order and finding the nearest
//! placed one before a PSN cost O(1) or the distance walked, not a walk over every held packet
//! (issue 19 round 4). It is not the policy of what to hold: see the parent module.

use std::collections::VecDeque;
use std::fmt;

use super::{Held, Placed};
use crate::wire::Psn;

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
        if self.len == 0 {
            self.slots.clear();
            self.base = psn;
        }
        let d = psn.diff(self.base);
        if d < 0 {
            for _ in 0..d.unsigned_abs() {
                self.slots.push_front(None);
            }
            self.base = psn;
        }
        let i = usize::try_from(psn.diff(self.base)).unwrap_or(0);
        if self.slots.len() <= i {
            self.slots.resize(i + 1, None);
        }
        if let Some(slot) = self.slots.get_mut(i) {
            if slot.is_none() {
                self.len += 1;
            }
            *slot = Some(held);
        }
    }

    /// Discards every request held before `psn`.
    pub(crate) fn discard_before(&mut self, psn: Psn) {
        let Ok(n) = usize::try_from(psn.diff(self.base)) else {
            return;
        };
        let n = n.min(self.slots.len());
        for slot in self.slots.drain(..n) {
            self.len -= usize::from(slot.is_some());
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
        let held = self.slots.get_mut(i)?.take()?;
        self.len -= 1;
        self.trim();
        Some(held)
    }

    /// Drops empty slots at both ends.
    fn trim(&mut self) {
        while self.slots.front().is_some_and(Option::is_none) {
            self.slots.pop_front();
            self.base = self.base.wrapping_add(1);
        }
        while self.slots.back().is_some_and(Option::is_none) {
            self.slots.pop_back();
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
