//! The HCA's timer index: each QP's earliest deadline, earliest first, with lazy deletion.
//!
//! A QP's deadline is the one in its `rc.timer_key`; an entry `(at, qpn)` is *live* while that
//! QP exists and its key is `Some(at)`. Arming pushes an entry; cancelling or moving a deadline
//! leaves the old entry in place, and the owner drops dead entries from the front after every
//! change ([`TimerIndex::purge`]), so [`TimerIndex::first`] is always live. A WRITE that arms
//! its ACK timeout and an ACK that cancels it cost a heap push and pop of a tiny heap instead of
//! a B-tree insert and remove. Dead entries behind a live one are dropped in batches when they
//! outnumber what the index held after its last compaction.
//!
//! What it is not: it knows nothing of QPs; liveness is the caller's predicate.

use core::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::time::Instant;

/// Entries the index may hold before its first compaction.
const COMPACT_FLOOR: usize = 64;

/// Deadlines `(at, qpn)`, popped in `(at, qpn)` order; see the module doc.
#[derive(Clone, Debug)]
pub(crate) struct TimerIndex {
    heap: BinaryHeap<Reverse<(Instant, u32)>>,
    /// Length above which the next [`TimerIndex::purge`] compacts.
    compact_at: usize,
}

impl Default for TimerIndex {
    fn default() -> TimerIndex {
        TimerIndex {
            heap: BinaryHeap::new(),
            compact_at: COMPACT_FLOOR,
        }
    }
}

impl TimerIndex {
    /// An index holding exactly `entries` (live ones, as the caller decides).
    pub(crate) fn from_entries(mut entries: Vec<(Instant, u32)>) -> TimerIndex {
        entries.sort_unstable();
        entries.dedup();
        TimerIndex {
            heap: entries.into_iter().map(Reverse).collect(),
            compact_at: COMPACT_FLOOR,
        }
    }

    /// Adds QP `qpn`'s deadline `at`.
    pub(crate) fn arm(&mut self, at: Instant, qpn: u32) {
        self.heap.push(Reverse((at, qpn)));
    }

    /// The earliest entry (live once [`TimerIndex::purge`] ran after the last change).
    pub(crate) fn first(&self) -> Option<(Instant, u32)> {
        self.heap.peek().map(|Reverse(e)| *e)
    }

    /// Removes the earliest entry.
    pub(crate) fn pop_first(&mut self) {
        self.heap.pop();
    }

    /// Every entry, live or not, in no particular order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (Instant, u32)> + '_ {
        self.heap.iter().map(|Reverse(e)| *e)
    }

    /// Drops dead entries (`live` false) from the front, and all of them once the index has
    /// grown past twice its size at the last compaction.
    pub(crate) fn purge(&mut self, live: impl Fn(Instant, u32) -> bool) {
        if self.heap.len() > self.compact_at {
            self.heap.retain(|Reverse((at, qpn))| live(*at, *qpn));
            self.compact_at = (2 * self.heap.len()).max(COMPACT_FLOOR);
        }
        while let Some(Reverse((at, qpn))) = self.heap.peek() {
            if live(*at, *qpn) {
                return;
            }
            self.heap.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    #[test]
    fn dead_entries_never_show_first_and_do_not_pile_up() {
        let mut t = TimerIndex::default();
        t.arm(at(20), 1);
        t.arm(at(10), 2);
        t.arm(at(10), 1);
        assert_eq!(t.first(), Some((at(10), 1)));
        // QP 1 moved to 30; (10, 1) and (20, 1) are dead.
        t.arm(at(30), 1);
        let live = |a: Instant, q: u32| (a, q) == (at(10), 2) || (a, q) == (at(30), 1);
        t.purge(live);
        assert_eq!(t.first(), Some((at(10), 2)));
        t.pop_first();
        t.purge(|a, q| (a, q) == (at(30), 1));
        assert_eq!(t.first(), Some((at(30), 1)));
        // A long-lived first entry: dead ones behind it are compacted away.
        for i in 0..1000 {
            t.arm(at(100 + i), 7);
            t.purge(|a, q| (a, q) == (at(30), 1));
        }
        assert!(t.entries().count() <= 2 * COMPACT_FLOOR + 1);
        assert_eq!(t.first(), Some((at(30), 1)));
    }

    #[test]
    fn from_entries_sorts_and_dedups() {
        let t = TimerIndex::from_entries(vec![(at(5), 2), (at(1), 3), (at(5), 2)]);
        assert_eq!(t.entries().count(), 2);
        assert_eq!(t.first(), Some((at(1), 3)));
    }
}
