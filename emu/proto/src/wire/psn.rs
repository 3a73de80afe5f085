//! 24-bit packet sequence numbers (rc-transport.md §2).
//!
//! [`Psn`] is always reduced mod 2^24 and deliberately implements neither `PartialOrd` nor `Ord`:
//! PSNs wrap, so ordering is only meaningful as a signed 24-bit distance ([`Psn::diff`],
//! [`Psn::is_before`], [`Psn::is_after`]) per rc-transport.md §2.1. This module does not track
//! windows or outstanding counts; the RC engine does.

use core::fmt;

/// A 24-bit packet sequence number (rc-transport.md §1.2 bytes 9–11, §2.1).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Mask of the 24 PSN bits.
    pub const MASK: u32 = 0x00FF_FFFF;

    /// Builds a PSN from the low 24 bits of `v`; higher bits are discarded (rc-transport.md §2.3).
    pub const fn new(v: u32) -> Psn {
        Psn(v & Self::MASK)
    }

    /// The PSN as an integer in `0..=0xFF_FFFF`.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` mod 2^24 (rc-transport.md §2.1).
    #[must_use]
    pub const fn wrapping_add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// Signed 24-bit distance `self − other` in `-2^23..2^23` (rc-transport.md §2.1): positive
    /// if `self` is after `other`. Computed as rxe does, `((a − b) << 8) as i32 >> 8`.
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// True if `self` comes strictly before `other` in 24-bit serial order (rc-transport.md §2.1).
    pub const fn is_before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// True if `self` comes strictly after `other` in 24-bit serial order (rc-transport.md §2.1).
    pub const fn is_after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_wraps() {
        assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
        assert_eq!(Psn::new(0xFF_FFFF).wrapping_add(1), Psn::new(0));
        assert_eq!(Psn::new(0xFF_FFFE).wrapping_add(5).value(), 3);
        assert_eq!(Psn::new(7).wrapping_add(u32::MAX).value(), 6);
    }

    #[test]
    fn diff_across_wrap() {
        let a = Psn::new(0xFF_FFFF);
        let b = Psn::new(0);
        assert_eq!(b.diff(a), 1);
        assert_eq!(a.diff(b), -1);
        assert!(a.is_before(b) && b.is_after(a));
        assert!(!a.is_after(a) && !a.is_before(a));
        assert_eq!(Psn::new(5).diff(Psn::new(0xFF_FFF0)), 21);
        // The half-space boundary: exactly 2^23 apart reads as "before" from both sides.
        assert_eq!(Psn::new(0x80_0000).diff(Psn::new(0)), -0x80_0000);
        assert_eq!(Psn::new(0x7F_FFFF).diff(Psn::new(0)), 0x7F_FFFF);
    }
}
