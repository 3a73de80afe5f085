//! What the injector decides about one datagram ([`Verdict`]) and what it asks of the caller
//! ([`Verdict::deliveries`], [`Edit`], [`HoldQueue`]); [`crate::Stage`] carries it out for both
//! backends.

use core::iter::FusedIterator;
use core::time::Duration;

use emu_proto::Instant;

/// The fate of one datagram. Every variant that delivers carries the summed delay of the delay
/// and rate-limit rules that fired before the deciding rule.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Deliver it unchanged after `delay` (zero when no rule fired).
    Deliver {
        /// Time from now until delivery.
        delay: Duration,
    },
    /// Lose it.
    Drop(DropCause),
    /// Deliver it and `copies` identical copies, all after `delay`.
    Duplicate {
        /// Extra copies beyond the original (at least 1).
        copies: u8,
        /// Time from now until delivery.
        delay: Duration,
    },
    /// Deliver it with bit `bit` flipped (see [`Edit::FlipBit`]) after `delay`.
    Corrupt {
        /// Index of the flipped bit.
        bit: usize,
        /// Time from now until delivery.
        delay: Duration,
    },
    /// Deliver only its first `len` bytes after `delay`.
    Truncate {
        /// Bytes kept; shorter than the datagram.
        len: usize,
        /// Time from now until delivery.
        delay: Duration,
    },
    /// The caller keeps it, unchanged, and delivers it at `until` or when
    /// [`crate::Injector::release`] or [`crate::Injector::heal`] is called, whichever comes
    /// first; `None` waits for the call. [`HoldQueue`] implements this.
    Hold {
        /// When it becomes due on its own.
        until: Option<Instant>,
    },
}

/// Why a datagram was lost.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropCause {
    /// A drop rule fired.
    Loss,
    /// The link is partitioned, by a partition rule or [`crate::Injector::partition`].
    Partition,
}

impl Verdict {
    /// True if the verdict hands the datagram on unchanged, at once, exactly once: a caller
    /// may then skip copying it into a [`crate::Stage`].
    pub fn passes(&self) -> bool {
        matches!(self, Verdict::Deliver { delay } if delay.is_zero())
    }

    /// The deliveries this verdict asks for, for a datagram seen at `now`: none for
    /// [`Verdict::Drop`] and [`Verdict::Hold`], `1 + copies` for [`Verdict::Duplicate`], one
    /// otherwise. Allocation-free.
    pub fn deliveries(&self, now: Instant) -> Deliveries {
        let (count, delay, edit) = match *self {
            Verdict::Deliver { delay } => (1, delay, Edit::None),
            Verdict::Duplicate { copies, delay } => (1 + u16::from(copies), delay, Edit::None),
            Verdict::Corrupt { bit, delay } => (1, delay, Edit::FlipBit(bit)),
            Verdict::Truncate { len, delay } => (1, delay, Edit::Truncate(len)),
            Verdict::Drop(_) | Verdict::Hold { .. } => (0, Duration::ZERO, Edit::None),
        };
        Deliveries {
            delivery: Delivery {
                at: now + delay,
                edit,
            },
            remaining: count,
        }
    }
}

/// One datagram to deliver: when, and what to change in its bytes first.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Delivery time.
    pub at: Instant,
    /// Change to make to the bytes before delivering.
    pub edit: Edit,
}

/// A change to a datagram's bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Edit {
    /// Deliver the bytes as they are.
    None,
    /// Flip bit `i % 8` (bit 0 = least significant) of byte `i / 8`. The injector never picks
    /// a bit of byte 4 of a datagram longer than 4 bytes: in a RoCEv2 payload that is the BTH
    /// byte holding FECN, BECN and reserved bits, which the ICRC does not cover, so every
    /// corruption it picks is detectable by the receiver's ICRC check.
    FlipBit(usize),
    /// Keep only the first `n` bytes.
    Truncate(usize),
}

impl Edit {
    /// Applies the edit to `datagram` in place and returns how many leading bytes to deliver.
    /// Out-of-range edits change nothing.
    pub fn apply(self, datagram: &mut [u8]) -> usize {
        match self {
            Edit::None => datagram.len(),
            Edit::FlipBit(bit) => {
                if let Some(byte) = datagram.get_mut(bit / 8) {
                    *byte ^= 1 << (bit % 8);
                }
                datagram.len()
            }
            Edit::Truncate(n) => n.min(datagram.len()),
        }
    }
}

/// Iterator over the [`Delivery`]s of one verdict; see [`Verdict::deliveries`].
#[derive(Clone, Debug)]
pub struct Deliveries {
    delivery: Delivery,
    remaining: u16,
}

impl Iterator for Deliveries {
    type Item = Delivery;

    fn next(&mut self) -> Option<Delivery> {
        self.remaining = self.remaining.checked_sub(1)?;
        Some(self.delivery)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::from(self.remaining);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Deliveries {}

impl FusedIterator for Deliveries {}

/// The caller's side of [`Verdict::Hold`]: held datagrams (any `T`), released when due or all at
/// once. Order is the order they were held in.
#[derive(Clone, Debug)]
pub struct HoldQueue<T> {
    held: Vec<(Option<Instant>, T)>,
}

impl<T> Default for HoldQueue<T> {
    fn default() -> Self {
        HoldQueue { held: Vec::new() }
    }
}

impl<T> HoldQueue<T> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps `item` until `until` (from [`Verdict::Hold`]), or until [`HoldQueue::drain`].
    pub fn push(&mut self, until: Option<Instant>, item: T) {
        self.held.push((until, item));
    }

    /// The earliest instant a held item becomes due on its own: the timer to arm.
    pub fn next_due(&self) -> Option<Instant> {
        self.held.iter().filter_map(|(until, _)| *until).min()
    }

    /// Removes and returns the oldest item due at `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<T> {
        let i = self
            .held
            .iter()
            .position(|(until, _)| until.is_some_and(|t| t <= now))?;
        Some(self.held.remove(i).1)
    }

    /// Removes and returns every item, oldest first: call it together with
    /// [`crate::Injector::release`] or [`crate::Injector::heal`].
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.held.drain(..).map(|(_, item)| item)
    }

    /// Number of held items.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// True if nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Instant = Instant::from_nanos(1_000);

    #[test]
    fn duplicate_yields_original_plus_copies() {
        let d = Duration::from_nanos(5);
        let all: Vec<_> = Verdict::Duplicate {
            copies: 2,
            delay: d,
        }
        .deliveries(NOW)
        .collect();
        let one = Delivery {
            at: Instant::from_nanos(1_005),
            edit: Edit::None,
        };
        assert_eq!(all, [one; 3]);
        assert_eq!(
            Verdict::Duplicate {
                copies: 255,
                delay: d
            }
            .deliveries(NOW)
            .len(),
            256
        );
    }

    #[test]
    fn drop_and_hold_yield_nothing() {
        assert_eq!(Verdict::Drop(DropCause::Loss).deliveries(NOW).count(), 0);
        assert_eq!(Verdict::Hold { until: None }.deliveries(NOW).count(), 0);
    }

    #[test]
    fn edits_apply_in_place() {
        let mut bytes = [0u8; 4];
        let v = Verdict::Corrupt {
            bit: 13,
            delay: Duration::ZERO,
        };
        for d in v.deliveries(NOW) {
            assert_eq!(d.at, NOW);
            assert_eq!(d.edit.apply(&mut bytes), 4);
        }
        assert_eq!(bytes, [0, 0x20, 0, 0]);
        assert_eq!(Edit::FlipBit(32).apply(&mut bytes), 4);
        assert_eq!(bytes, [0, 0x20, 0, 0]);
        assert_eq!(Edit::Truncate(3).apply(&mut bytes), 3);
        assert_eq!(Edit::Truncate(9).apply(&mut bytes), 4);
        assert_eq!(Edit::None.apply(&mut bytes), 4);
    }

    #[test]
    fn hold_queue_releases_due_then_all() {
        let mut q = HoldQueue::new();
        q.push(None, 'a');
        q.push(Some(Instant::from_nanos(20)), 'b');
        q.push(Some(Instant::from_nanos(10)), 'c');
        assert_eq!(q.next_due(), Some(Instant::from_nanos(10)));
        assert_eq!(q.pop_due(Instant::from_nanos(9)), None);
        assert_eq!(q.pop_due(Instant::from_nanos(20)), Some('b'));
        assert_eq!(q.pop_due(Instant::from_nanos(20)), Some('c'));
        assert_eq!(q.pop_due(Instant::from_nanos(20)), None);
        assert_eq!(q.len(), 1);
        assert_eq!(q.drain().collect::<Vec<_>>(), ['a']);
        assert!(q.is_empty() && q.next_due().is_none());
    }
}
