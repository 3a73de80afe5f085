//! The only randomness and hashing in the crate: seeded ChaCha8 streams and a stable hash.
//!
//! Every random draw comes from a [`ChaCha8Rng`] keyed by the plan seed, on a stream (ChaCha
//! nonce) chosen by hashing the link and the rule's position in the plan. Streams never share
//! draws, so traffic on one link or a rule appended to the plan leaves every other
//! (link, rule) schedule unchanged.

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use crate::meta::Link;

/// 64-bit FNV-1a: a fixed, platform-independent hash (unlike `std`'s `DefaultHasher`, whose
/// output may change between Rust releases).
#[derive(Copy, Clone, Debug)]
pub(crate) struct StableHasher(u64);

impl StableHasher {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;

    pub(crate) const fn new() -> Self {
        StableHasher(Self::OFFSET)
    }

    pub(crate) fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(Self::PRIME);
        }
        self
    }

    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// Mixes in a whole word at once (one multiply instead of FNV's eight): for the per-datagram
    /// trace, which is on the hot path. Stream derivation keeps [`StableHasher::u64`].
    pub(crate) fn word(&mut self, v: u64) -> &mut Self {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(K);
        self
    }

    pub(crate) const fn finish(&self) -> u64 {
        self.0
    }
}

/// The random stream of rule number `rule` on `link`, for a plan seeded with `seed`.
pub(crate) fn stream(seed: u64, link: Link, rule: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let id = StableHasher::new()
        .u64(link.src.0.into())
        .u64(link.dst.0.into())
        .u64(rule as u64)
        .finish();
    rng.set_stream(id);
    rng
}

/// A uniform draw from `0..n` (`n > 0`), without modulo bias (Lemire's method).
pub(crate) fn below(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    let threshold = n.wrapping_neg() % n;
    loop {
        let wide = u128::from(rng.next_u64()) * u128::from(n);
        // The low half decides rejection; the high half is the draw.
        if (wide as u64) >= threshold {
            return (wide >> 64) as u64;
        }
    }
}

/// True with probability `p` (`0 ≤ p ≤ 1`); draws nothing when `p` is 0 or 1.
pub(crate) fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    if p >= 1.0 {
        return true;
    }
    if p <= 0.0 {
        return false;
    }
    // 53 random bits give every representable value in [0, 1) with step 2^-53.
    let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    unit < p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::NodeId;

    #[test]
    fn fnv1a_matches_reference_vectors() {
        assert_eq!(StableHasher::new().finish(), 0xcbf2_9ce4_8422_2325);
        assert_eq!(
            StableHasher::new().bytes(b"a").finish(),
            0xaf63_dc4c_8601_ec8c
        );
        assert_eq!(
            StableHasher::new().bytes(b"foobar").finish(),
            0x85944171f73967e8
        );
    }

    #[test]
    fn streams_are_stable_and_distinct() {
        let ab = Link::new(NodeId(0), NodeId(1));
        let ba = Link::new(NodeId(1), NodeId(0));
        let draw = |link, rule| stream(7, link, rule).next_u64();
        assert_eq!(draw(ab, 0), draw(ab, 0));
        assert_ne!(draw(ab, 0), draw(ba, 0));
        assert_ne!(draw(ab, 0), draw(ab, 1));
        assert_ne!(stream(7, ab, 0).next_u64(), stream(8, ab, 0).next_u64());
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut rng = stream(1, Link::new(NodeId(0), NodeId(0)), 0);
        let mut seen = [false; 5];
        for _ in 0..200 {
            seen[below(&mut rng, 5) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(below(&mut rng, 1), 0);
        assert!(below(&mut rng, u64::MAX) < u64::MAX);
    }

    #[test]
    fn chance_extremes_draw_nothing() {
        let link = Link::new(NodeId(0), NodeId(0));
        let mut a = stream(1, link, 0);
        assert!(chance(&mut a, 1.0) && !chance(&mut a, 0.0));
        assert_eq!(a.next_u64(), stream(1, link, 0).next_u64());
        let hits = (0..1000).filter(|_| chance(&mut a, 0.25)).count();
        assert!((180..320).contains(&hits), "{hits}");
    }
}
