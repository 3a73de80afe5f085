//! A set of PSNs as bits (selective repeat's index of the PSNs the responder holds and of those
//! the requester has taken as reported): 64-bit words from a base PSN that is a multiple of 64,
//! grown at either end as bits are set and dropped from the front as the window moves. It is
//! not a policy of which PSNs to hold or report: see the parent module.

use std::collections::VecDeque;

use crate::wire::Psn;

/// PSNs as bits: bit `i % 64` of word `i / 64` stands for `base + i`.
#[derive(Clone, Debug, Default)]
pub(crate) struct PsnBits {
    /// The PSN of bit 0 (a multiple of 64).
    base: Psn,
    words: VecDeque<u64>,
}

impl PsnBits {
    /// Clears every bit.
    pub(crate) fn clear(&mut self) {
        self.words.clear();
    }

    /// Sets (growing the set to cover `psn`) or clears the bit of `psn`.
    pub(crate) fn set(&mut self, psn: Psn, on: bool) {
        if on {
            self.cover(psn);
        }
        let Ok(off) = usize::try_from(psn.diff(self.base)) else {
            return;
        };
        let q = off / 64;
        if self.words.len() <= q {
            if !on {
                return;
            }
            self.words.resize(q + 1, 0);
        }
        if let Some(w) = self.words.get_mut(q) {
            let bit = 1u64 << (off % 64);
            *w = if on { *w | bit } else { *w & !bit };
        }
    }

    /// Moves `base` back to cover `psn` (no words: to `psn`'s word).
    fn cover(&mut self, psn: Psn) {
        if self.words.is_empty() {
            self.base = Psn::new(psn.value() & !63);
        }
        while psn.is_before(self.base) {
            self.words.push_front(0);
            self.base = self.base.wrapping_add(Psn::MASK + 1 - 64);
        }
    }

    /// The 64 bits for the PSNs from `from` on (zero for PSNs outside the set).
    pub(crate) fn word_at(&self, from: Psn) -> u64 {
        let off = i64::from(from.diff(self.base));
        let word = |q: i64| {
            usize::try_from(q)
                .ok()
                .and_then(|q| self.words.get(q))
                .copied()
                .unwrap_or(0)
        };
        let (q, s) = (off.div_euclid(64), off.rem_euclid(64));
        let lo = word(q) >> s;
        let hi = match s {
            0 => 0,
            _ => word(q + 1) << (64 - s),
        };
        lo | hi
    }

    /// Drops the words wholly before `psn`.
    pub(crate) fn drop_before(&mut self, psn: Psn) {
        while !self.words.is_empty() && psn.diff(self.base) >= 64 {
            self.words.pop_front();
            self.base = self.base.wrapping_add(64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(set: &[u32]) -> PsnBits {
        let mut b = PsnBits::default();
        for &p in set {
            b.set(Psn::new(p), true);
        }
        b
    }

    /// The first bit set puts `base` at its PSN's multiple of 64, one word long; a PSN before
    /// it grows the set at the front by whole words, across the PSN wrap too.
    #[test]
    fn base_is_the_multiple_of_64_at_or_before_every_bit() {
        let mut b = bits(&[100]);
        assert_eq!((b.base, b.words.len()), (Psn::new(64), 1));
        b.set(Psn::new(3), true);
        assert_eq!((b.base, b.words.len()), (Psn::new(0), 2));
        b.set(Psn::new(Psn::MASK - 70), true);
        assert_eq!((b.base, b.words.len()), (Psn::new(Psn::MASK + 1 - 128), 4));
        assert_eq!(b.word_at(Psn::new(0)), 1 << 3);
        assert_eq!(b.word_at(Psn::new(64)), 1 << 36);
        assert_eq!(b.word_at(Psn::new(Psn::MASK - 70)), 1);
    }

    /// Setting a bit twice leaves it set; clearing one leaves its neighbours.
    #[test]
    fn set_is_idempotent_and_clearing_is_per_bit() {
        let mut b = bits(&[7, 7, 8]);
        assert_eq!(b.word_at(Psn::new(0)), 0b1_1000_0000);
        b.set(Psn::new(7), false);
        assert_eq!(b.word_at(Psn::new(0)), 0b1_0000_0000);
        b.set(Psn::new(1000), false);
        assert_eq!(
            b.words.len(),
            1,
            "clearing a bit outside the set does not grow it"
        );
    }

    /// A word read from any PSN joins the two words it straddles.
    #[test]
    fn word_at_straddles_two_words() {
        let b = bits(&[60, 63, 64, 70]);
        assert_eq!(b.word_at(Psn::new(60)), 0b100_0001_1001);
        assert_eq!(b.word_at(Psn::new(64)), 0b100_0001);
        assert_eq!(b.word_at(Psn::new(200)), 0);
    }

    /// `clear` forgets every bit; `drop_before` forgets the words wholly before a PSN and
    /// keeps the word holding it.
    #[test]
    fn clear_and_drop_before_forget_bits() {
        let mut b = bits(&[0, 129, 200]);
        b.drop_before(Psn::new(130));
        assert_eq!((b.base, b.words.len()), (Psn::new(128), 2));
        assert_eq!(b.word_at(Psn::new(0)), 0);
        assert_eq!(b.word_at(Psn::new(128)), 0b10);
        assert_eq!(b.word_at(Psn::new(192)), 1 << 8);
        b.clear();
        assert_eq!(b.word_at(Psn::new(128)), 0);
        assert_eq!(b.word_at(Psn::new(192)), 0);
    }
}
