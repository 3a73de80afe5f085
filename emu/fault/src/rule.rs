//! Rules as data: [`Rule`] = [`Action`] + [`Matcher`] + probability, and the fluent builders.
//!
//! A rule built in code is checked when it is installed ([`crate::Injector::new`],
//! [`crate::Injector::add_rule`]) or read from TOML, never while building, so the builders do
//! not fail or panic. Modifiers that belong to one action ([`Rule::oneway`], [`Rule::until`],
//! [`Rule::burst`]) leave rules with other actions unchanged.

use core::ops::RangeInclusive;
use core::time::Duration;

use emu_proto::Instant;
use emu_proto::wire::{Opcode, Psn};

use crate::meta::{DatagramMeta, NodeId, OpcodeClass, OpcodeMatch};

/// One fault rule: which datagrams it selects, how often it fires and what it does.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Rule {
    /// What happens to a datagram when the rule fires.
    pub action: Action,
    /// Which datagrams the rule sees.
    pub matcher: Matcher,
    /// Chance in `[0, 1]` that a selected datagram fires the rule (default 1). Drawn from the
    /// rule's own random stream for the datagram's link.
    pub probability: f64,
}

/// What a firing rule does. See the crate doc for how actions combine.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Action {
    /// Lose the datagram.
    Drop,
    /// Deliver the datagram plus `copies` extra identical copies (at least 1).
    Duplicate {
        /// Extra copies beyond the original.
        copies: u8,
    },
    /// Add a delay drawn uniformly from `[min, max]`, in nanoseconds; `min == max` is a fixed
    /// delay. Jitter reorders datagrams. Delays add up and do not end rule evaluation.
    Delay {
        /// Shortest delay.
        min: Duration,
        /// Longest delay (inclusive), not below `min`.
        max: Duration,
    },
    /// Flip one bit at a seeded position (see [`crate::Edit::FlipBit`] for which bits).
    Corrupt,
    /// Cut the datagram to `len` bytes; selects only datagrams longer than `len`.
    Truncate {
        /// Length kept.
        len: u32,
    },
    /// Lose the datagram as a partitioned link would: both ways between the matcher's `from`
    /// and `to` unless `oneway`, in which case only `from → to`.
    Partition {
        /// Cut only the `from → to` direction.
        oneway: bool,
    },
    /// Hand the datagram back to the caller to keep until `until`, or until
    /// [`crate::Injector::release`] when `None`. With `until`, the rule selects only datagrams
    /// seen before that instant.
    Hold {
        /// When held datagrams become due, if not released earlier.
        until: Option<Instant>,
    },
    /// Shape each link to `bytes_per_sec` with a token bucket of `burst` bytes: a datagram that
    /// overdraws the bucket is delayed until the bucket refills, never dropped (FIFO, no
    /// reordering). With `burst = 0` every datagram waits for its own serialisation time.
    /// Delays add up and do not end rule evaluation.
    RateLimit {
        /// Link rate in bytes per second (at least 1).
        bytes_per_sec: u64,
        /// Bucket depth in bytes.
        burst: u64,
    },
}

impl Action {
    /// The plan-file name of this action.
    pub const fn name(&self) -> &'static str {
        match self {
            Action::Drop => "drop",
            Action::Duplicate { .. } => "duplicate",
            Action::Delay { .. } => "delay",
            Action::Corrupt => "corrupt",
            Action::Truncate { .. } => "truncate",
            Action::Partition { .. } => "partition",
            Action::Hold { .. } => "hold",
            Action::RateLimit { .. } => "rate_limit",
        }
    }
}

/// Which datagrams a rule sees. Every field left `None` matches everything.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Matcher {
    /// Sending node.
    pub from: Option<NodeId>,
    /// Receiving node.
    pub to: Option<NodeId>,
    /// BTH destination QP number.
    pub qpn: Option<u32>,
    /// Opcode or opcode class.
    pub opcode: Option<OpcodeMatch>,
    /// PSN range.
    pub psn: Option<PsnRange>,
    /// Which of the selected datagrams fire (1-based count per rule, over all links).
    pub nth: Option<Nth>,
    /// Time window.
    pub window: Option<Window>,
}

impl Matcher {
    /// True if `meta`, seen at `now`, is selected. `both_ways` also accepts the reverse
    /// direction (partitions).
    pub(crate) fn selects(&self, now: Instant, meta: &DatagramMeta, both_ways: bool) -> bool {
        let dir = |src, dst| self.from.is_none_or(|n| n == src) && self.to.is_none_or(|n| n == dst);
        (dir(meta.src, meta.dst) || (both_ways && dir(meta.dst, meta.src)))
            && self.qpn.is_none_or(|q| q == meta.dest_qpn)
            && self.opcode.is_none_or(|o| o.contains(meta))
            && self.psn.is_none_or(|r| r.contains(meta.psn))
            && self.window.is_none_or(|w| w.contains(now))
    }
}

/// Which selected datagrams fire a rule, counting selected datagrams from 1.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Nth {
    /// Only the n-th (n ≥ 1).
    Only(u32),
    /// Every one after the n-th: n+1, n+2, … (`After(0)` is every one).
    After(u32),
}

impl Nth {
    /// True if the `count`-th selected datagram (1-based) fires.
    pub const fn fires(self, count: u64) -> bool {
        match self {
            Nth::Only(n) => count == n as u64,
            Nth::After(n) => count > n as u64,
        }
    }
}

/// An inclusive PSN range in 24-bit modular order: from `lo` counting up to `hi`, wrapping
/// past `0xFF_FFFF` when `hi < lo` (so `[0xFF_FFFE, 1]` is four PSNs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PsnRange {
    /// First PSN in the range.
    pub lo: Psn,
    /// Last PSN in the range.
    pub hi: Psn,
}

impl PsnRange {
    /// True if `psn` lies in the range.
    pub const fn contains(self, psn: Psn) -> bool {
        let offset = psn.value().wrapping_sub(self.lo.value()) & Psn::MASK;
        let width = self.hi.value().wrapping_sub(self.lo.value()) & Psn::MASK;
        offset <= width
    }
}

/// A half-open time window `[start, end)`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// First instant inside the window.
    pub start: Instant,
    /// First instant after the window; must be later than `start`.
    pub end: Instant,
}

impl Window {
    /// True if `now` lies in the window.
    pub fn contains(self, now: Instant) -> bool {
        self.start <= now && now < self.end
    }
}

/// A rule that drops selected datagrams with probability `p`.
pub fn drop(p: f64) -> Rule {
    Rule::new(Action::Drop).probability(p)
}

/// A rule that drops only the `n`-th selected datagram (1-based).
pub fn drop_nth(n: u32) -> Rule {
    Rule::new(Action::Drop).nth(n)
}

/// A rule that delays selected datagrams by a uniform draw from `range` (`d..=d` is fixed).
pub fn delay(range: RangeInclusive<Duration>) -> Rule {
    let (min, max) = range.into_inner();
    Rule::new(Action::Delay { min, max })
}

/// A rule that delivers `copies` extra copies of selected datagrams.
pub fn duplicate(copies: u8) -> Rule {
    Rule::new(Action::Duplicate { copies })
}

/// A rule that flips one bit of selected datagrams with probability `p`.
pub fn corrupt(p: f64) -> Rule {
    Rule::new(Action::Corrupt).probability(p)
}

/// A rule that cuts selected datagrams longer than `len` bytes down to `len`.
pub fn truncate(len: u32) -> Rule {
    Rule::new(Action::Truncate { len })
}

/// A rule that cuts the link between `a` and `b` in both directions; see [`Rule::oneway`].
pub fn partition(a: NodeId, b: NodeId) -> Rule {
    Rule::new(Action::Partition { oneway: false }).from(a).to(b)
}

/// A rule that holds selected datagrams until [`crate::Injector::release`]; see
/// [`Rule::until`].
pub fn hold() -> Rule {
    Rule::new(Action::Hold { until: None })
}

/// A rule that shapes each link to `bytes_per_sec` with no burst allowance; see
/// [`Rule::burst`].
pub fn rate_limit(bytes_per_sec: u64) -> Rule {
    Rule::new(Action::RateLimit {
        bytes_per_sec,
        burst: 0,
    })
}

impl Rule {
    /// A rule with `action` that selects every datagram and always fires.
    pub fn new(action: Action) -> Rule {
        Rule {
            action,
            matcher: Matcher::default(),
            probability: 1.0,
        }
    }

    /// Select datagrams sent by `node`.
    #[must_use]
    pub fn from(mut self, node: NodeId) -> Rule {
        self.matcher.from = Some(node);
        self
    }

    /// Select datagrams sent to `node`.
    #[must_use]
    pub fn to(mut self, node: NodeId) -> Rule {
        self.matcher.to = Some(node);
        self
    }

    /// Select datagrams for destination QP `qpn`.
    #[must_use]
    pub fn qpn(mut self, qpn: u32) -> Rule {
        self.matcher.qpn = Some(qpn);
        self
    }

    /// Select datagrams with this opcode (replaces any opcode or class selector).
    #[must_use]
    pub fn opcode(mut self, opcode: Opcode) -> Rule {
        self.matcher.opcode = Some(OpcodeMatch::Opcode(opcode));
        self
    }

    /// Select datagrams of this class (replaces any opcode or class selector).
    #[must_use]
    pub fn opcode_class(mut self, class: OpcodeClass) -> Rule {
        self.matcher.opcode = Some(OpcodeMatch::Class(class));
        self
    }

    /// Select PSNs from `lo` up to `hi` inclusive, modulo 2^24 (see [`PsnRange`]).
    #[must_use]
    pub fn psn_range(mut self, lo: Psn, hi: Psn) -> Rule {
        self.matcher.psn = Some(PsnRange { lo, hi });
        self
    }

    /// Fire only on the `n`-th selected datagram (1-based).
    #[must_use]
    pub fn nth(mut self, n: u32) -> Rule {
        self.matcher.nth = Some(Nth::Only(n));
        self
    }

    /// Fire on every selected datagram after the `n`-th.
    #[must_use]
    pub fn after_nth(mut self, n: u32) -> Rule {
        self.matcher.nth = Some(Nth::After(n));
        self
    }

    /// Select datagrams seen in `[start, end)`.
    #[must_use]
    pub fn between(mut self, start: Instant, end: Instant) -> Rule {
        self.matcher.window = Some(Window { start, end });
        self
    }

    /// Fire with probability `p` in `[0, 1]`.
    #[must_use]
    pub fn probability(mut self, p: f64) -> Rule {
        self.probability = p;
        self
    }

    /// Make a partition one-way (`from → to` only).
    #[must_use]
    pub fn oneway(mut self) -> Rule {
        if let Action::Partition { oneway } = &mut self.action {
            *oneway = true;
        }
        self
    }

    /// Make held datagrams due at `t`, and stop holding at `t`.
    #[must_use]
    pub fn until(mut self, t: Instant) -> Rule {
        if let Action::Hold { until } = &mut self.action {
            *until = Some(t);
        }
        self
    }

    /// Let a rate limit absorb bursts of up to `bytes` without delay.
    #[must_use]
    pub fn burst(mut self, bytes: u64) -> Rule {
        if let Action::RateLimit { burst, .. } = &mut self.action {
            *burst = bytes;
        }
        self
    }

    /// Checks the rule's values. On failure returns the plan-file field at fault and why.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        // TOML integers are signed 64-bit; larger values could not be written back.
        const TOML_MAX: u64 = i64::MAX as u64;
        if !(0.0..=1.0).contains(&self.probability) {
            let p = self.probability;
            return Err(("probability", format!("{p} is outside [0, 1]")));
        }
        if self.matcher.nth == Some(Nth::Only(0)) {
            return Err(("nth", "counts from 1".into()));
        }
        if self.matcher.window.is_some_and(|w| w.start >= w.end) {
            return Err(("end", "the window must end after it starts".into()));
        }
        match self.action {
            Action::Duplicate { copies: 0 } => Err(("copies", "must be at least 1".into())),
            Action::Delay { min, max } if min > max => {
                Err(("min", format!("{min:?} is longer than max {max:?}")))
            }
            Action::Delay { max, .. } if max.as_nanos() > u128::from(u64::MAX) => {
                Err(("max", "must be below 2^64 ns".into()))
            }
            Action::RateLimit { bytes_per_sec, .. } if !(1..=TOML_MAX).contains(&bytes_per_sec) => {
                Err(("bytes_per_sec", format!("must be in 1..={TOML_MAX}")))
            }
            Action::RateLimit { burst, .. } if burst > TOML_MAX => {
                Err(("burst", format!("must be at most {TOML_MAX}")))
            }
            _ => Ok(()),
        }
    }
}
