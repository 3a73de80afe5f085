//! [`Injector`]: runs a [`FaultPlan`] over a sequence of datagrams, with run-time link state,
//! per-link [`Counters`] and a trace hash.

use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet};

use emu_proto::Instant;
use rand_chacha::ChaCha8Rng;
use rand_core::RngCore;

use crate::meta::{DatagramMeta, Link, NodeId};
use crate::plan::{FaultPlan, PlanError, rule_error};
use crate::rng::{self, StableHasher};
use crate::rule::{Action, Rule};
use crate::verdict::{DropCause, Verdict};

/// The fault model in motion: decides a [`Verdict`] for each datagram.
///
/// Pure and deterministic: the same plan and the same sequence of calls (datagrams, times and
/// run-time changes) give the same verdicts, counters and [`Injector::trace_hash`] on every run
/// and platform. It does no IO, reads no clock and keeps no datagram bytes: `now` is an argument
/// and held datagrams stay with the caller ([`crate::Stage`]). Callers must pass
/// non-decreasing `now` values; earlier ones are treated as no time passing for rate limits.
#[derive(Clone, Debug)]
pub struct Injector {
    plan: FaultPlan,
    /// Run-time state of `plan.rules[i]`, index for index.
    states: Vec<RuleState>,
    /// Links cut by [`Injector::partition`] and [`Injector::partition_oneway`].
    partitions: BTreeSet<Link>,
    counters: Counters,
    trace: StableHasher,
}

/// What an installed rule remembers between datagrams.
#[derive(Clone, Debug, Default)]
struct RuleState {
    /// False once [`Injector::heal`] or [`Injector::release`] retired the rule.
    retired: bool,
    /// Datagrams the rule has selected so far (for [`crate::Nth`]).
    selected: u64,
    /// Random stream and rate-limit bucket, per link, created on first use.
    links: BTreeMap<Link, LinkState>,
}

#[derive(Clone, Debug)]
struct LinkState {
    rng: ChaCha8Rng,
    bucket: Bucket,
}

/// A token bucket kept as its fill level: bytes sent but not yet drained at the link rate,
/// scaled by 10^9 so that draining by `rate × elapsed_ns` is exact integer arithmetic.
#[derive(Clone, Debug, Default)]
struct Bucket {
    level: u128,
    last: Instant,
}

const NANOS_PER_SEC: u128 = 1_000_000_000;

impl Bucket {
    /// Adds a `len`-byte datagram at `now` and returns how long it waits for the bucket to
    /// drain back to `burst` bytes.
    fn delay(&mut self, now: Instant, len: usize, bytes_per_sec: u64, burst: u64) -> Duration {
        let rate = u128::from(bytes_per_sec.max(1));
        let elapsed = (now - self.last).as_nanos();
        self.level = self.level.saturating_sub(rate.saturating_mul(elapsed));
        self.last = self.last.max(now);
        self.level = self.level.saturating_add(len as u128 * NANOS_PER_SEC);
        let excess = self.level.saturating_sub(u128::from(burst) * NANOS_PER_SEC);
        Duration::from_nanos(u64::try_from(excess.div_ceil(rate)).unwrap_or(u64::MAX))
    }
}

impl Injector {
    /// An injector running `plan`, after [`FaultPlan::validate`].
    pub fn new(plan: FaultPlan) -> Result<Injector, PlanError> {
        plan.validate()?;
        Ok(Injector {
            states: vec![RuleState::default(); plan.rules.len()],
            plan,
            partitions: BTreeSet::new(),
            counters: Counters::default(),
            trace: StableHasher::new(),
        })
    }

    /// Decides the fate of `meta`, seen at `now`, and records it in the counters and trace.
    ///
    /// A run-time partition of the link wins outright. Then rules run in plan order; see the
    /// crate doc for the evaluation order.
    pub fn on_datagram(&mut self, now: Instant, meta: &DatagramMeta) -> Verdict {
        let verdict = self.decide(now, meta);
        trace_verdict(now, meta, verdict);
        self.counters.record(meta.link(), verdict);
        self.trace_datagram(now, meta, verdict);
        verdict
    }

    /// Classifies the datagram `bytes` sent from `src` to `dst` with
    /// [`DatagramMeta::classify`] and decides its fate as [`Injector::on_datagram`] does.
    pub fn judge(&mut self, now: Instant, src: NodeId, dst: NodeId, bytes: &[u8]) -> Verdict {
        self.on_datagram(now, &DatagramMeta::classify(src, dst, bytes))
    }

    fn decide(&mut self, now: Instant, meta: &DatagramMeta) -> Verdict {
        // No plan and no partition (every run without faults): nothing to match or draw.
        if self.states.is_empty() && self.partitions.is_empty() {
            return Verdict::Deliver {
                delay: Duration::ZERO,
            };
        }
        let link = meta.link();
        if self.partitions.contains(&link) {
            return Verdict::Drop(DropCause::Partition);
        }
        let seed = self.plan.seed;
        let mut delay = Duration::ZERO;
        for (index, (rule, state)) in self.plan.rules.iter().zip(&mut self.states).enumerate() {
            if state.retired || !selects(rule, now, meta) {
                continue;
            }
            state.selected += 1;
            if rule.matcher.nth.is_some_and(|n| !n.fires(state.selected)) {
                continue;
            }
            let link_state = state.links.entry(link).or_insert_with(|| LinkState {
                rng: rng::stream(seed, link, index),
                bucket: Bucket::default(),
            });
            if !rng::chance(&mut link_state.rng, rule.probability) {
                continue;
            }
            match rule.action {
                Action::Delay { min, max } => {
                    delay = delay.saturating_add(jitter(&mut link_state.rng, min, max));
                }
                Action::RateLimit {
                    bytes_per_sec,
                    burst,
                } => {
                    let wait = link_state.bucket.delay(now, meta.len, bytes_per_sec, burst);
                    delay = delay.saturating_add(wait);
                }
                Action::Drop => return Verdict::Drop(DropCause::Loss),
                Action::Partition { .. } => return Verdict::Drop(DropCause::Partition),
                Action::Hold { until } => return Verdict::Hold { until },
                Action::Duplicate { copies } => return Verdict::Duplicate { copies, delay },
                Action::Corrupt => {
                    let bit = corrupt_bit(&mut link_state.rng, meta.len);
                    return Verdict::Corrupt { bit, delay };
                }
                Action::Truncate { len } => {
                    let len = len as usize;
                    return Verdict::Truncate { len, delay };
                }
            }
        }
        Verdict::Deliver { delay }
    }

    /// The plan as installed (rules retired by [`Injector::heal`] or [`Injector::release`]
    /// included): print it with a failing test to reproduce the run.
    pub fn plan(&self) -> &FaultPlan {
        &self.plan
    }

    /// Replaces the seed and rules with `plan`'s, after [`FaultPlan::validate`]. The new rules
    /// start fresh (counts, random streams, buckets); link partitions, counters and the trace
    /// hash carry on. On error nothing changes.
    pub fn set_plan(&mut self, plan: FaultPlan) -> Result<(), PlanError> {
        plan.validate()?;
        self.states = vec![RuleState::default(); plan.rules.len()];
        self.plan = plan;
        Ok(())
    }

    /// Appends `rule` after the installed rules, after checking it (the error names the index
    /// it would have had). Earlier rules keep their state and random streams.
    pub fn add_rule(&mut self, rule: Rule) -> Result<(), PlanError> {
        let index = self.plan.rules.len();
        rule.check()
            .map_err(|(field, msg)| rule_error(index, field, msg))?;
        self.plan.rules.push(rule);
        self.states.push(RuleState::default());
        Ok(())
    }

    /// Removes every rule; the seed, link partitions, counters and trace hash stay.
    pub fn clear_rules(&mut self) {
        self.plan.rules.clear();
        self.states.clear();
    }

    /// Cuts the link between `a` and `b` in both directions until [`Injector::repair`] or
    /// [`Injector::heal`].
    pub fn partition(&mut self, a: NodeId, b: NodeId) {
        self.partitions.insert(Link::new(a, b));
        self.partitions.insert(Link::new(b, a));
    }

    /// Cuts only the `from → to` direction.
    pub fn partition_oneway(&mut self, from: NodeId, to: NodeId) {
        self.partitions.insert(Link::new(from, to));
    }

    /// Undoes run-time partitions between `a` and `b`, both directions. Partition rules in the
    /// plan are unaffected.
    pub fn repair(&mut self, a: NodeId, b: NodeId) {
        self.partitions.remove(&Link::new(a, b));
        self.partitions.remove(&Link::new(b, a));
    }

    /// Ends every hold: hold rules stop selecting datagrams, and the caller must now deliver
    /// everything it holds for this injector ([`crate::HoldQueue::drain`]).
    pub fn release(&mut self) {
        self.retire(|action| matches!(action, Action::Hold { .. }));
    }

    /// Restores a healthy network: removes run-time partitions, retires partition and hold
    /// rules, and, as [`Injector::release`] does, requires the caller to deliver every held
    /// datagram. Other rules (loss, delay, …) keep running; use [`Injector::clear_rules`] to
    /// stop them too.
    pub fn heal(&mut self) {
        self.partitions.clear();
        self.retire(|action| matches!(action, Action::Hold { .. } | Action::Partition { .. }));
    }

    fn retire(&mut self, which: impl Fn(&Action) -> bool) {
        for (rule, state) in self.plan.rules.iter().zip(&mut self.states) {
            state.retired |= which(&rule.action);
        }
    }

    /// Per-link counts of the verdicts given so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// A running 64-bit hash over every `(now, meta, verdict)` decided so far, in order: two
    /// runs that made identical decisions have equal hashes.
    pub fn trace_hash(&self) -> u64 {
        self.trace.finish()
    }

    fn trace_datagram(&mut self, now: Instant, meta: &DatagramMeta, verdict: Verdict) {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let (tag, a, b) = match verdict {
            Verdict::Deliver { delay } => (0, nanos(delay), 0),
            Verdict::Drop(DropCause::Loss) => (1, 0, 0),
            Verdict::Drop(DropCause::Partition) => (2, 0, 0),
            Verdict::Duplicate { copies, delay } => (3, nanos(delay), u64::from(copies)),
            Verdict::Corrupt { bit, delay } => (4, nanos(delay), bit as u64),
            Verdict::Truncate { len, delay } => (5, nanos(delay), len as u64),
            Verdict::Hold { until } => (6, until.map_or(u64::MAX, Instant::as_nanos), 0),
        };
        self.trace
            .word(now.as_nanos())
            .word(meta.src.0.into())
            .word(meta.dst.0.into())
            .word(meta.dest_qpn.into())
            .word(u8::from(meta.opcode).into())
            .word(meta.psn.value().into())
            .word(meta.aeth_syndrome.map_or(0x100, u64::from))
            .word(meta.len as u64)
            .word(tag)
            .word(a)
            .word(b);
    }
}

/// True if `rule` selects `meta` at `now`: its matcher plus what the action needs.
fn selects(rule: &Rule, now: Instant, meta: &DatagramMeta) -> bool {
    let both_ways = matches!(rule.action, Action::Partition { oneway: false });
    let applicable = match rule.action {
        Action::Truncate { len } => meta.len > len as usize,
        Action::Corrupt => meta.len > 0,
        Action::Hold { until } => until.is_none_or(|t| now < t),
        _ => true,
    };
    applicable && rule.matcher.selects(now, meta, both_ways)
}

/// A uniform delay in `[min, max]` (nanosecond resolution); draws nothing when fixed.
fn jitter(rng: &mut ChaCha8Rng, min: Duration, max: Duration) -> Duration {
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let (lo, hi) = (nanos(min), nanos(max));
    if hi <= lo {
        return min;
    }
    let offset = match (hi - lo).checked_add(1) {
        Some(n) => rng::below(rng, n),
        None => rng.next_u64(),
    };
    Duration::from_nanos(lo + offset)
}

/// BTH byte 4 (FECN, BECN, reserved) is not covered by the ICRC; see [`crate::Edit::FlipBit`].
const UNCHECKED_BYTE: u64 = 4;

/// A uniformly drawn bit of a `len`-byte datagram (`len > 0`), skipping [`UNCHECKED_BYTE`].
fn corrupt_bit(rng: &mut ChaCha8Rng, len: usize) -> usize {
    let len = len as u64;
    let skip = len > UNCHECKED_BYTE;
    let bits = len.saturating_mul(8) - if skip { 8 } else { 0 };
    let bit = rng::below(rng, bits);
    let bit = if skip && bit >= UNCHECKED_BYTE * 8 {
        bit + 8
    } else {
        bit
    };
    usize::try_from(bit).unwrap_or(usize::MAX)
}

/// Verdict counts per link; see [`LinkCounters`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Sorted by link, each link once: a binary search per datagram over the few links a run
    /// has, cheaper than a B-tree entry.
    links: Vec<(Link, LinkCounters)>,
}

/// Verdict counts for one link. Each datagram counts once in `passed`, `dropped`,
/// `partitioned` or `held`, or once in each effect it received among `duplicated`, `corrupted`,
/// `truncated` and `delayed` (a delayed duplicate counts in both).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinkCounters {
    /// Delivered unchanged and undelayed.
    pub passed: u64,
    /// Lost to a drop rule.
    pub dropped: u64,
    /// Delivered with extra copies.
    pub duplicated: u64,
    /// Delivered after a non-zero delay.
    pub delayed: u64,
    /// Delivered with a flipped bit.
    pub corrupted: u64,
    /// Delivered cut short.
    pub truncated: u64,
    /// Handed back to the caller to hold.
    pub held: u64,
    /// Lost to a partition (rule or run-time).
    pub partitioned: u64,
}

impl LinkCounters {
    fn add(mut self, o: &LinkCounters) -> LinkCounters {
        self.passed += o.passed;
        self.dropped += o.dropped;
        self.duplicated += o.duplicated;
        self.delayed += o.delayed;
        self.corrupted += o.corrupted;
        self.truncated += o.truncated;
        self.held += o.held;
        self.partitioned += o.partitioned;
        self
    }
}

impl Counters {
    /// Counts for `link` (all zero if it carried nothing).
    pub fn link(&self, link: Link) -> LinkCounters {
        self.links
            .binary_search_by_key(&link, |(l, _)| *l)
            .map_or_else(|_| LinkCounters::default(), |i| self.links[i].1)
    }

    /// Every link that carried a datagram, in `(src, dst)` order.
    pub fn iter(&self) -> impl Iterator<Item = (Link, &LinkCounters)> {
        self.links.iter().map(|(link, c)| (*link, c))
    }

    /// Counts summed over all links.
    pub fn total(&self) -> LinkCounters {
        self.links
            .iter()
            .map(|(_, c)| c)
            .fold(LinkCounters::default(), LinkCounters::add)
    }

    /// The counts of `link`, added (zero) if it carried nothing yet.
    fn entry(&mut self, link: Link) -> &mut LinkCounters {
        let i = match self.links.binary_search_by_key(&link, |(l, _)| *l) {
            Ok(i) => i,
            Err(i) => {
                self.links.insert(i, (link, LinkCounters::default()));
                i
            }
        };
        &mut self.links[i].1
    }

    fn record(&mut self, link: Link, verdict: Verdict) {
        let c = self.entry(link);
        let delayed = |c: &mut LinkCounters, d: Duration| c.delayed += u64::from(!d.is_zero());
        match verdict {
            Verdict::Deliver { delay } if delay.is_zero() => c.passed += 1,
            Verdict::Deliver { .. } => c.delayed += 1,
            Verdict::Drop(DropCause::Loss) => c.dropped += 1,
            Verdict::Drop(DropCause::Partition) => c.partitioned += 1,
            Verdict::Hold { .. } => c.held += 1,
            Verdict::Duplicate { delay, .. } => {
                c.duplicated += 1;
                delayed(c, delay);
            }
            Verdict::Corrupt { delay, .. } => {
                c.corrupted += 1;
                delayed(c, delay);
            }
            Verdict::Truncate { delay, .. } => {
                c.truncated += 1;
                delayed(c, delay);
            }
        }
    }
}

/// The `fault.verdict` event: `debug` for a verdict that changes the datagram's fate or
/// timing, `trace` for a plain delivery. With `debug` off (so `trace` too), one level check.
#[inline]
fn trace_verdict(now: Instant, meta: &DatagramMeta, verdict: Verdict) {
    if tracing::level_enabled!(tracing::Level::DEBUG) {
        log_verdict(now, meta, verdict);
    }
}

/// [`trace_verdict`] once some subscriber may take `debug` events.
#[cold]
#[inline(never)]
fn log_verdict(now: Instant, meta: &DatagramMeta, verdict: Verdict) {
    macro_rules! verdict_event {
        ($level:expr) => {
            tracing::event!(
                $level,
                kind = "fault.verdict",
                verdict = ?verdict,
                opcode = %emu_proto::trace::opcode_label(meta.opcode),
                psn = meta.psn.value(),
                dqp = meta.dest_qpn,
                src_node = meta.src.0,
                dst_node = meta.dst.0,
                len = meta.len,
                at = now.as_nanos(),
            )
        };
    }
    if verdict
        == (Verdict::Deliver {
            delay: Duration::ZERO,
        })
    {
        verdict_event!(tracing::Level::TRACE);
    } else {
        verdict_event!(tracing::Level::DEBUG);
    }
}
