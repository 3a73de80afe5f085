//! [`Stage`]: the one place a [`Verdict`] is carried out on a datagram's bytes — dropped,
//! duplicated, delayed, corrupted, truncated or held — with the queue of datagrams that are not
//! due yet.
//!
//! The in-process fabric and the UDP driver both put their datagrams through a `Stage`; what
//! differs between them is only how a datagram's bytes are kept ([`Payload`], [`Buffers`]),
//! the fixed latency added to every delivery (the fabric's wire latency; zero on a socket) and
//! what the caller does with a datagram once it is due.
//!
//! What it is not: it reads no clock (`now` is an argument, non-decreasing from call to call),
//! does no IO and decides nothing — the [`Injector`] decides, [`Stage::submit`] only asks it.

use core::cmp::{Ordering, Reverse};
use core::time::Duration;
use std::collections::{BinaryHeap, VecDeque};

use emu_proto::Instant;

use crate::injector::Injector;
use crate::meta::Link;
use crate::verdict::{HoldQueue, Verdict};

/// A datagram as the caller keeps it: bytes the stage may read, edit in place and shorten.
pub trait Payload {
    /// The datagram's bytes.
    fn bytes(&self) -> &[u8];
    /// The datagram's bytes, to edit in place.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// Keeps only the first `len` bytes (`len` is at most [`Payload::bytes`]`.len()`).
    fn set_len(&mut self, len: usize);
}

/// Where the caller's datagram buffers come from and go back to.
pub trait Buffers<D> {
    /// A new datagram with the same bytes (and addressing) as `original`: a duplicate.
    fn copy(&mut self, original: &D) -> D;
    /// Takes back a datagram the stage dropped.
    fn recycle(&mut self, datagram: D);
}

/// A datagram waiting for its delivery time, ordered by `(at, seq)`.
#[derive(Debug)]
struct Scheduled<D> {
    at: Instant,
    seq: u64,
    datagram: D,
}

impl<D> PartialEq for Scheduled<D> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<D> Eq for Scheduled<D> {}

impl<D> PartialOrd for Scheduled<D> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<D> Ord for Scheduled<D> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// Carries out verdicts: datagrams scheduled for delivery, in time order, and held ones.
///
/// Every delivery a verdict asks for is scheduled at its time plus the stage's latency; a
/// datagram held by [`Verdict::Hold`] is scheduled, after the latency, once its hold ends
/// ([`Stage::release_due`], [`Stage::release_held`]). [`Stage::pop_due`] hands datagrams back
/// in `(time, scheduling order)` order, so ties are broken the same way on every run. Of the
/// deliveries of one verdict the copies are scheduled first and the original last.
///
/// A delivery due no earlier than the last one scheduled in order (every delivery of a run
/// without delays: `now` never decreases and the latency is fixed) joins a FIFO; only the
/// others (a delay shorter than an earlier one's) go to a heap. Popping merges the two by
/// `(time, scheduling order)`, the order one heap of everything gave, without a heap's
/// per-datagram cost.
#[derive(Debug)]
pub struct Stage<D> {
    latency: Duration,
    in_order: VecDeque<Scheduled<D>>,
    scheduled: BinaryHeap<Reverse<Scheduled<D>>>,
    held: HoldQueue<D>,
    seq: u64,
}

impl<D> Stage<D> {
    /// An empty stage adding `latency` to every delivery.
    pub fn new(latency: Duration) -> Stage<D> {
        Stage {
            latency,
            in_order: VecDeque::new(),
            scheduled: BinaryHeap::new(),
            held: HoldQueue::new(),
            seq: 0,
        }
    }

    /// Judges `datagram`, travelling on `link` at `now`, with `injector` (through the one
    /// classifier, [`Injector::judge`]) and carries out the verdict, which it returns.
    pub fn submit<B: Buffers<D>>(
        &mut self,
        injector: &mut Injector,
        now: Instant,
        link: Link,
        datagram: D,
        buffers: &mut B,
    ) -> Verdict
    where
        D: Payload,
    {
        let verdict = injector.judge(now, link.src, link.dst, datagram.bytes());
        self.carry_out(verdict, now, datagram, buffers);
        verdict
    }

    /// Carries out `verdict` on `datagram`, seen at `now`: holds it, drops it (back to
    /// `buffers`), or schedules each delivery the verdict asks for ([`Verdict::deliveries`]),
    /// its bytes edited first; all but the last delivery are copies made by `buffers`.
    pub fn carry_out<B: Buffers<D>>(
        &mut self,
        verdict: Verdict,
        now: Instant,
        datagram: D,
        buffers: &mut B,
    ) where
        D: Payload,
    {
        match verdict {
            Verdict::Hold { until } => {
                self.held.push(until, datagram);
                return;
            }
            // The common verdict, without the general loop below.
            Verdict::Deliver { delay } => {
                self.schedule(now + delay + self.latency, datagram);
                return;
            }
            _ => {}
        }
        let mut deliveries = verdict.deliveries(now);
        let mut original = datagram;
        while let Some(delivery) = deliveries.next() {
            if deliveries.len() == 0 {
                let len = delivery.edit.apply(original.bytes_mut());
                original.set_len(len);
                self.schedule(delivery.at + self.latency, original);
                return;
            }
            let mut copy = buffers.copy(&original);
            let len = delivery.edit.apply(copy.bytes_mut());
            copy.set_len(len);
            self.schedule(delivery.at + self.latency, copy);
        }
        buffers.recycle(original);
    }

    /// Schedules every held datagram whose hold ended by `now` (after the latency); true if
    /// there was one.
    #[inline]
    pub fn release_due(&mut self, now: Instant) -> bool {
        // Called on every pump step; nothing is held in a run without hold rules.
        if self.held.is_empty() {
            return false;
        }
        let mut any = false;
        while let Some(datagram) = self.held.pop_due(now) {
            self.schedule(now + self.latency, datagram);
            any = true;
        }
        any
    }

    /// Schedules every held datagram (after the latency), oldest first: call it together with
    /// [`Injector::release`] or [`Injector::heal`].
    pub fn release_held(&mut self, now: Instant) {
        let held: Vec<D> = self.held.drain().collect();
        for datagram in held {
            self.schedule(now + self.latency, datagram);
        }
    }

    /// Removes and returns the earliest scheduled datagram due at `now`. Held datagrams wait
    /// for [`Stage::release_due`] or [`Stage::release_held`].
    #[inline]
    pub fn pop_due(&mut self, now: Instant) -> Option<D> {
        let (from_heap, at) = match (self.in_order.front(), self.scheduled.peek()) {
            (None, None) => return None,
            (Some(f), None) => (false, f.at),
            (None, Some(Reverse(h))) => (true, h.at),
            (Some(f), Some(Reverse(h))) if h < f => (true, h.at),
            (Some(f), Some(_)) => (false, f.at),
        };
        if at > now {
            return None;
        }
        if from_heap {
            self.scheduled.pop().map(|Reverse(s)| s.datagram)
        } else {
            self.in_order.pop_front().map(|s| s.datagram)
        }
    }

    /// The earliest instant something becomes due: a scheduled delivery or the end of a
    /// timed hold. The timer to arm.
    #[inline]
    pub fn next_due(&self) -> Option<Instant> {
        if self.scheduled.is_empty() && self.held.is_empty() {
            return self.in_order.front().map(|s| s.at);
        }
        let scheduled = self.scheduled.peek().map(|Reverse(s)| s.at);
        let in_order = self.in_order.front().map(|s| s.at);
        [scheduled, in_order, self.held.next_due()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Datagrams scheduled or held.
    pub fn len(&self) -> usize {
        self.in_order.len() + self.scheduled.len() + self.held.len()
    }

    /// True if nothing is scheduled or held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn schedule(&mut self, at: Instant, datagram: D) {
        self.seq += 1;
        let s = Scheduled {
            at,
            seq: self.seq,
            datagram,
        };
        if self.in_order.back().is_none_or(|last| last.at <= at) {
            self.in_order.push_back(s);
        } else {
            self.scheduled.push(Reverse(s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::DropCause;

    /// A datagram tagged with a number, so tests can tell copies and originals apart.
    #[derive(Clone, Debug, PartialEq)]
    struct Tagged(u32, Vec<u8>);

    impl Payload for Tagged {
        fn bytes(&self) -> &[u8] {
            &self.1
        }
        fn bytes_mut(&mut self) -> &mut [u8] {
            &mut self.1
        }
        fn set_len(&mut self, len: usize) {
            self.1.truncate(len);
        }
    }

    /// Copies get tag 100 + the original's; recycled datagrams are kept.
    #[derive(Default)]
    struct Bin(Vec<Tagged>);

    impl Buffers<Tagged> for Bin {
        fn copy(&mut self, original: &Tagged) -> Tagged {
            Tagged(100 + original.0, original.1.clone())
        }
        fn recycle(&mut self, datagram: Tagged) {
            self.0.push(datagram);
        }
    }

    const NOW: Instant = Instant::from_nanos(1_000);
    const LATENCY: Duration = Duration::from_nanos(10);

    fn at(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    fn drain(stage: &mut Stage<Tagged>, now: Instant) -> Vec<u32> {
        std::iter::from_fn(|| stage.pop_due(now))
            .map(|t| t.0)
            .collect()
    }

    #[test]
    fn copies_go_first_and_everything_waits_for_the_latency() {
        let (mut stage, mut bin) = (Stage::new(LATENCY), Bin::default());
        let dup = Verdict::Duplicate {
            copies: 2,
            delay: Duration::ZERO,
        };
        stage.carry_out(dup, NOW, Tagged(1, vec![7; 4]), &mut bin);
        assert_eq!(stage.len(), 3);
        assert_eq!(stage.next_due(), Some(NOW + LATENCY));
        assert!(drain(&mut stage, NOW).is_empty());
        assert_eq!(drain(&mut stage, NOW + LATENCY), [101, 101, 1]);
        assert!(stage.is_empty() && bin.0.is_empty());
    }

    #[test]
    fn drops_are_recycled_and_edits_applied() {
        let (mut stage, mut bin) = (Stage::new(Duration::ZERO), Bin::default());
        stage.carry_out(
            Verdict::Drop(DropCause::Loss),
            NOW,
            Tagged(1, vec![0; 4]),
            &mut bin,
        );
        assert_eq!(bin.0, [Tagged(1, vec![0; 4])]);
        let cut = Verdict::Truncate {
            len: 2,
            delay: Duration::ZERO,
        };
        stage.carry_out(cut, NOW, Tagged(2, vec![0; 4]), &mut bin);
        let flip = Verdict::Corrupt {
            bit: 9,
            delay: Duration::ZERO,
        };
        stage.carry_out(flip, NOW, Tagged(3, vec![0; 4]), &mut bin);
        assert_eq!(stage.pop_due(NOW), Some(Tagged(2, vec![0; 2])));
        assert_eq!(stage.pop_due(NOW), Some(Tagged(3, vec![0, 2, 0, 0])));
        assert_eq!(stage.pop_due(NOW), None);
    }

    #[test]
    fn deliveries_come_out_in_time_then_scheduling_order() {
        let (mut stage, mut bin) = (Stage::new(Duration::ZERO), Bin::default());
        let late = Verdict::Deliver {
            delay: Duration::from_nanos(50),
        };
        stage.carry_out(late, NOW, Tagged(1, vec![]), &mut bin);
        let now = Verdict::Deliver {
            delay: Duration::ZERO,
        };
        stage.carry_out(now, at(1_050), Tagged(2, vec![]), &mut bin);
        stage.carry_out(now, at(1_020), Tagged(3, vec![]), &mut bin);
        assert_eq!(drain(&mut stage, at(1_050)), [3, 1, 2]);
    }

    proptest::proptest! {
        /// Deliveries come out in `(time, scheduling order)` order, whichever of the FIFO and
        /// the heap holds them: against a sorted list, over runs mixing undelayed deliveries,
        /// delays (which reorder) and pops at a clock that moves forward.
        #[test]
        fn pops_follow_time_then_scheduling_order(
            steps in proptest::collection::vec((0u64..3, 0u64..40, proptest::bool::ANY), 1..200)
        ) {
            let (mut stage, mut bin) = (Stage::new(LATENCY), Bin::default());
            let mut model: Vec<(Instant, u32)> = Vec::new();
            let mut now = NOW;
            for (tag, (step, delay, pop)) in (0u32..).zip(steps) {
                now += Duration::from_nanos(step);
                // Two thirds of the deliveries undelayed, as in a run without faults.
                let delay = Duration::from_nanos(if delay % 3 == 0 { delay } else { 0 });
                stage.carry_out(Verdict::Deliver { delay }, now, Tagged(tag, vec![]), &mut bin);
                model.push((now + delay + LATENCY, tag));
                if pop {
                    // Stable: equal times keep scheduling order.
                    model.sort_by_key(|&(at, _)| at);
                    let due = model.iter().take_while(|&&(at, _)| at <= now).count();
                    let want: Vec<u32> = model.drain(..due).map(|(_, t)| t).collect();
                    proptest::prop_assert_eq!(drain(&mut stage, now), want);
                }
                proptest::prop_assert_eq!(stage.len(), model.len());
                model.sort_by_key(|&(at, _)| at);
                proptest::prop_assert_eq!(stage.next_due(), model.first().map(|&(at, _)| at));
            }
        }
    }

    #[test]
    fn holds_wait_for_their_time_or_a_release() {
        let (mut stage, mut bin) = (Stage::new(LATENCY), Bin::default());
        let timed = Verdict::Hold {
            until: Some(at(2_000)),
        };
        stage.carry_out(timed, NOW, Tagged(1, vec![]), &mut bin);
        stage.carry_out(
            Verdict::Hold { until: None },
            NOW,
            Tagged(2, vec![]),
            &mut bin,
        );
        assert_eq!(stage.next_due(), Some(at(2_000)));
        assert!(!stage.release_due(at(1_999)));
        assert!(stage.release_due(at(2_000)));
        assert_eq!(stage.next_due(), Some(at(2_010)));
        assert_eq!(drain(&mut stage, at(2_010)), [1]);
        assert_eq!(stage.len(), 1);
        stage.release_held(at(3_000));
        assert_eq!(drain(&mut stage, at(3_009)), [] as [u32; 0]);
        assert_eq!(drain(&mut stage, at(3_010)), [2]);
    }
}
