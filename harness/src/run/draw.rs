//! The fault plans of `softverbs campaign`, drawn from a seed.
//!
//! A drawn plan has two parts:
//!
//! - *background* faults for the whole run: random loss (0–5 %), duplication (0–50 %, one or
//!   two extra copies), jittered delay that reorders (up to 2 ms), corruption (0–1 %, caught by
//!   the receiver's ICRC check);
//! - up to three *disruptions*, each at its own time: a loss storm (5–30 % for half an ACK
//!   timeout to two), a partition between two nodes (one way or both, a quarter of an ACK
//!   timeout to two), and one process fault (kill, or a pause of half an ACK timeout to two).
//!   Disruptions are at least one retry budget apart, so no retry sequence sees two of them.
//!
//! Every drawn plan *heals within the retry budget*: [`crate::run::plan::retry_exhaustion_reason`]
//! finds it strict, so the run's invariants hold it to "every operation completes, exactly
//! once, in order" — any error completion not explained by the kill is a violation. A plan is
//! a pure function of its seed and [`DrawParams`].

use std::fmt::Write as _;
use std::time::Duration;

use emu_fault::{FaultPlan, NodeId, Rule};
use emu_proto::Instant;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use serde::Serialize;

use crate::run::plan::{self, format_duration};
use crate::run::proto::QpParams;

/// What a drawn plan depends on besides its seed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DrawParams {
    /// Node count of the run (process faults and partitions pick nodes below it; at least 2).
    pub nodes: u32,
    /// How long the workload runs: disruptions start within it.
    pub horizon: Duration,
    /// The QPs' transport parameters: windows scale with the ACK timeout, gaps with the
    /// retry budget.
    pub qp: QpParams,
}

/// A stretch of heavier random loss.
#[derive(Copy, Clone, Debug, PartialEq, Serialize)]
pub struct Storm {
    /// Drop probability inside the window.
    pub loss: f64,
    /// Window start, ms after the workload's start.
    pub start_ms: u64,
    /// Window length, ms.
    pub len_ms: u64,
}

/// A partition that heals.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cut {
    /// One node of the link.
    pub from: u32,
    /// The other.
    pub to: u32,
    /// Only `from → to` is cut.
    pub oneway: bool,
    /// Window start, ms after the workload's start.
    pub start_ms: u64,
    /// Window length, ms.
    pub len_ms: u64,
}

/// The process fault of a drawn plan.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Proc {
    /// `kill` or `pause`.
    pub action: &'static str,
    /// The node.
    pub node: u32,
    /// When, ms after the workload's start.
    pub at_ms: u64,
    /// How long a pause lasts, ms.
    pub duration_ms: Option<u64>,
}

/// A campaign run's fault plan, as drawn.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DrawnPlan {
    /// The seed it was drawn from (also the network faults' seed).
    pub seed: u64,
    /// Background drop probability.
    pub loss: f64,
    /// Background duplication probability (0: none).
    pub duplicate: f64,
    /// Extra copies of a duplicated datagram.
    pub copies: u8,
    /// Longest jitter delay, µs (0: none).
    pub delay_max_us: u64,
    /// Share of datagrams delayed.
    pub delay_probability: f64,
    /// Background corruption probability.
    pub corrupt: f64,
    /// A loss storm, if drawn.
    pub storm: Option<Storm>,
    /// A partition, if drawn.
    pub partition: Option<Cut>,
    /// A process fault, if drawn.
    pub process: Option<Proc>,
}

/// A seeded stream of draws.
struct Draw(ChaCha8Rng);

impl Draw {
    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in `[0, n)` (0 for `n = 0`).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.0.next_u64() % n }
    }

    /// Uniform in `[lo, hi]`, rounded to `step`.
    fn between(&mut self, lo: f64, hi: f64, step: f64) -> f64 {
        let v = lo + (hi - lo) * self.unit();
        ((v / step).round() * step).clamp(lo, hi)
    }

    /// Uniform in `[lo, hi]` (`lo` when `hi <= lo`).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }
}

/// The kinds of disruption, placed in the order drawn.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kind {
    Storm,
    Cut,
    Process,
}

impl DrawnPlan {
    /// Draws the plan of seed `seed`: the same seed and parameters always give the same plan.
    pub fn draw(seed: u64, params: &DrawParams) -> DrawnPlan {
        let mut d = Draw(ChaCha8Rng::seed_from_u64(seed));
        let nodes = u64::from(params.nodes.max(2));
        let t_ms = (params.qp.ack_timeout().as_millis() as u64).max(1);
        let budget_ms = params.qp.retry_budget().as_millis() as u64;
        let horizon_ms = params.horizon.as_millis() as u64;
        let mut plan = DrawnPlan {
            seed,
            loss: 0.0,
            duplicate: 0.0,
            copies: 1,
            delay_max_us: 0,
            delay_probability: 0.0,
            corrupt: 0.0,
            storm: None,
            partition: None,
            process: None,
        };
        // Background: every draw is made whether or not it is used, so that one choice does
        // not shift the draws of the next.
        let (loss_on, loss) = (d.chance(0.8), d.between(0.0, 0.05, 0.001));
        let (dup_on, dup, copies) = (d.chance(0.6), d.between(0.0, 0.5, 0.01), d.range(1, 2));
        let (delay_on, delay_max, delay_p) =
            (d.chance(0.6), d.range(50, 2000), d.between(0.05, 0.5, 0.01));
        let (corrupt_on, corrupt) = (d.chance(0.3), d.between(0.0, 0.01, 0.001));
        if loss_on {
            plan.loss = loss;
        }
        if dup_on && dup > 0.0 {
            plan.duplicate = dup;
            plan.copies = copies as u8;
        }
        if delay_on {
            plan.delay_max_us = delay_max;
            plan.delay_probability = delay_p;
        }
        if corrupt_on {
            plan.corrupt = corrupt;
        }
        // Disruptions: which, in which order, where.
        let mut kinds = Vec::new();
        let storm = (
            d.chance(0.5),
            d.between(0.05, 0.3, 0.01),
            d.range(t_ms / 2, 2 * t_ms),
        );
        let cut_from = d.below(nodes) as u32;
        let cut_to = ((u64::from(cut_from) + 1 + d.below(nodes - 1)) % nodes) as u32;
        let cut = (d.chance(0.4), d.chance(0.5), d.range(t_ms / 4, 2 * t_ms));
        let proc_on = d.chance(0.5);
        let kill = d.chance(0.3);
        let proc_node = d.below(nodes) as u32;
        let pause_ms = d.range(t_ms / 2, 2 * t_ms);
        if storm.0 {
            kinds.push(Kind::Storm);
        }
        if cut.0 {
            kinds.push(Kind::Cut);
        }
        if proc_on {
            kinds.push(Kind::Process);
        }
        // A seeded shuffle (Fisher–Yates).
        for i in (1..kinds.len()).rev() {
            let j = d.below(i as u64 + 1) as usize;
            kinds.swap(i, j);
        }
        // Early, because a workload can run out of MR capacity (and end) before its duration.
        let mut at = d.range(horizon_ms / 20, horizon_ms * 3 / 20);
        for kind in kinds {
            let len = match kind {
                Kind::Storm => storm.2,
                Kind::Cut => cut.2,
                Kind::Process if kill => 0,
                Kind::Process => pause_ms,
            };
            if at + len > horizon_ms {
                break;
            }
            match kind {
                Kind::Storm => {
                    plan.storm = Some(Storm {
                        loss: storm.1,
                        start_ms: at,
                        len_ms: len,
                    });
                }
                Kind::Cut => {
                    plan.partition = Some(Cut {
                        from: cut_from,
                        to: cut_to,
                        oneway: cut.1,
                        start_ms: at,
                        len_ms: len,
                    });
                }
                Kind::Process => {
                    plan.process = Some(Proc {
                        action: if kill { "kill" } else { "pause" },
                        node: proc_node,
                        at_ms: at,
                        duration_ms: (!kill).then_some(len),
                    });
                }
            }
            at += len + budget_ms + d.range(0, t_ms);
        }
        // The bounds above keep every plan strict; should one not be (other QP parameters),
        // give up its disruptions, heaviest first, rather than run a plan nobody can judge.
        if plan.exhaustion_reason(&params.qp).is_some() {
            plan.storm = None;
        }
        if plan.exhaustion_reason(&params.qp).is_some() {
            plan.partition = None;
        }
        plan
    }

    /// The network part as an emu-fault plan (seed = [`DrawnPlan::seed`]), times counted from
    /// the workload's start.
    pub fn network(&self) -> FaultPlan {
        let ms = |v: u64| Instant::from_nanos(v.saturating_mul(1_000_000));
        let mut p = FaultPlan::new(self.seed);
        if self.loss > 0.0 {
            p = p.rule(emu_fault::drop(self.loss));
        }
        if self.corrupt > 0.0 {
            p = p.rule(emu_fault::corrupt(self.corrupt));
        }
        if let Some(s) = self.storm {
            p = p.rule(emu_fault::drop(s.loss).between(ms(s.start_ms), ms(s.start_ms + s.len_ms)));
        }
        if let Some(c) = self.partition {
            let mut rule = emu_fault::partition(NodeId(c.from), NodeId(c.to))
                .between(ms(c.start_ms), ms(c.start_ms + c.len_ms));
            if c.oneway {
                rule = rule.oneway();
            }
            p = p.rule(rule);
        }
        if self.duplicate > 0.0 {
            p = p.rule(emu_fault::duplicate(self.copies).probability(self.duplicate));
        }
        if self.delay_max_us > 0 {
            let max = Duration::from_micros(self.delay_max_us);
            let rule: Rule = emu_fault::delay(Duration::ZERO..=max);
            p = p.rule(rule.probability(self.delay_probability));
        }
        p
    }

    /// Why a run could legitimately exhaust its retries under this plan, if it could (never,
    /// for a plan [`DrawnPlan::draw`] returns with the same `qp`). A pause counts as a
    /// partition of the paused node for its length.
    pub fn exhaustion_reason(&self, qp: &QpParams) -> Option<String> {
        let mut network = self.network();
        if let Some(Proc {
            node,
            at_ms,
            duration_ms: Some(len),
            ..
        }) = self.process
        {
            let ms = |v: u64| Instant::from_nanos(v.saturating_mul(1_000_000));
            network = network.rule(
                emu_fault::partition(NodeId(node), NodeId(node))
                    .between(ms(at_ms), ms(at_ms + len)),
            );
        }
        plan::retry_exhaustion_reason(&network, qp)
    }

    /// The plan file (`softverbs run --faults`): `header` as comment lines, the network rules
    /// and seed, then the process fault.
    pub fn to_toml(&self, header: &str) -> String {
        let mut text = String::new();
        for line in header.lines() {
            let _ = writeln!(text, "# {line}");
        }
        let _ = writeln!(text, "# {}", self.summary());
        text.push_str(&self.network().to_toml());
        if let Some(p) = self.process {
            let _ = write!(
                text,
                "\n[[process]]\nnode = {}\naction = \"{}\"\nat = \"{}ms\"\n",
                p.node, p.action, p.at_ms
            );
            if let Some(d) = p.duration_ms {
                let _ = writeln!(text, "duration = \"{d}ms\"");
            }
        }
        text
    }

    /// One line: every fault with its numbers, e.g. `loss 3.1% dup 20%x1 jitter<=1200us/30%
    /// storm 25%@300+90ms cut 0<>2@900+40ms pause n1@150+80ms`; `no faults` for none.
    pub fn summary(&self) -> String {
        let pct = |p: f64| {
            let v = p * 100.0;
            if (v - v.round()).abs() < 1e-9 {
                format!("{v:.0}%")
            } else {
                format!("{v:.1}%")
            }
        };
        let mut parts = Vec::new();
        if self.loss > 0.0 {
            parts.push(format!("loss {}", pct(self.loss)));
        }
        if self.duplicate > 0.0 {
            parts.push(format!("dup {}x{}", pct(self.duplicate), self.copies));
        }
        if self.delay_max_us > 0 {
            parts.push(format!(
                "jitter<={}/{}",
                format_duration(Duration::from_micros(self.delay_max_us)),
                pct(self.delay_probability)
            ));
        }
        if self.corrupt > 0.0 {
            parts.push(format!("corrupt {}", pct(self.corrupt)));
        }
        if let Some(s) = self.storm {
            parts.push(format!(
                "storm {}@{}+{}ms",
                pct(s.loss),
                s.start_ms,
                s.len_ms
            ));
        }
        if let Some(c) = self.partition {
            let arrow = if c.oneway { ">" } else { "<>" };
            parts.push(format!(
                "cut {}{arrow}{}@{}+{}ms",
                c.from, c.to, c.start_ms, c.len_ms
            ));
        }
        if let Some(p) = self.process {
            match p.duration_ms {
                Some(d) => parts.push(format!("{} n{}@{}+{d}ms", p.action, p.node, p.at_ms)),
                None => parts.push(format!("{} n{}@{}ms", p.action, p.node, p.at_ms)),
            }
        }
        if parts.is_empty() {
            "no faults".to_owned()
        } else {
            parts.join(" ")
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn params(nodes: u32) -> DrawParams {
        DrawParams {
            nodes,
            horizon: Duration::from_millis(1500),
            qp: QpParams {
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                recovery: crate::recovery::RecoveryArg::Ibta,
            },
        }
    }

    #[test]
    fn same_seed_same_plan_and_other_seeds_differ() {
        let a = DrawnPlan::draw(7, &params(3));
        assert_eq!(a, DrawnPlan::draw(7, &params(3)));
        assert_eq!(
            a.network().hash(),
            DrawnPlan::draw(7, &params(3)).network().hash()
        );
        let distinct: std::collections::BTreeSet<String> = (0..50)
            .map(|s| DrawnPlan::draw(s, &params(3)).summary())
            .collect();
        assert!(distinct.len() > 45, "{distinct:?}");
    }

    #[test]
    fn every_drawn_plan_heals_within_the_budget_and_parses_back() {
        let mut seen = (0, 0, 0, 0, 0);
        for nodes in [2, 3, 5] {
            let p = params(nodes);
            for seed in 0..2000 {
                let plan = DrawnPlan::draw(seed, &p);
                assert_eq!(plan.exhaustion_reason(&p.qp), None, "seed {seed}: {plan:?}");
                assert!(plan.loss <= 0.05 && plan.duplicate <= 0.5 && plan.corrupt <= 0.01);
                let text = plan.to_toml("test");
                let back = plan::parse(&text, 999, nodes).unwrap();
                assert_eq!(back.network, plan.network(), "{text}");
                assert_eq!(back.network.seed, seed);
                assert_eq!(back.process.len(), usize::from(plan.process.is_some()));
                if let Some(c) = plan.partition {
                    assert!(c.from < nodes && c.to < nodes && c.from != c.to);
                }
                if let Some(pf) = plan.process {
                    assert!(pf.node < nodes);
                    assert!(pf.at_ms + pf.duration_ms.unwrap_or(0) <= 1500);
                    if pf.action == "kill" {
                        seen.3 += 1;
                    } else {
                        seen.4 += 1;
                    }
                }
                seen.0 += u32::from(plan.storm.is_some());
                seen.1 += u32::from(plan.partition.is_some());
                seen.2 += u32::from(plan.storm.is_some_and(|s| s.loss > 0.25));
            }
        }
        // Every kind of disruption is drawn, storms up to 30 % loss among them.
        assert!(seen.0 > 500 && seen.1 > 500 && seen.2 > 50, "{seen:?}");
        assert!(seen.3 > 200 && seen.4 > 500, "{seen:?}");
    }

    #[test]
    fn summary_names_every_fault() {
        let plan = DrawnPlan {
            seed: 1,
            loss: 0.031,
            duplicate: 0.2,
            copies: 1,
            delay_max_us: 1200,
            delay_probability: 0.3,
            corrupt: 0.005,
            storm: Some(Storm {
                loss: 0.25,
                start_ms: 300,
                len_ms: 90,
            }),
            partition: Some(Cut {
                from: 0,
                to: 2,
                oneway: false,
                start_ms: 900,
                len_ms: 40,
            }),
            process: Some(Proc {
                action: "pause",
                node: 1,
                at_ms: 150,
                duration_ms: Some(80),
            }),
        };
        assert_eq!(
            plan.summary(),
            "loss 3.1% dup 20%x1 jitter<=1200us/30% corrupt 0.5% storm 25%@300+90ms \
             cut 0<>2@900+40ms pause n1@150+80ms"
        );
    }
}
