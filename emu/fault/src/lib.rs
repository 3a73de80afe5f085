//! `emu-fault`: the one seeded fault model of softverbs.
//!
//! The in-process fabric (`emu-sim`), the UDP driver and the multi-process harness all decide
//! what happens to a datagram with this crate, so "drop the 3rd ACK" means the same thing
//! everywhere. It is pure: no IO, no clock, no threads, no unseeded randomness. Time comes in as
//! `now` on every call, every random draw comes from the plan's seed, and datagram bytes are
//! kept in the caller's buffers ([`Payload`], [`Buffers`]).
//!
//! Both backends run the same fault stage: [`DatagramMeta::classify`] is the one packet
//! classifier (a datagram too short for a BTH is judged as opcode `Unknown(0xFF)`, so every
//! datagram counts), and [`Stage`] is the one place a verdict is carried out.
//!
//! # Module map (start at [`FaultPlan`] and [`Injector`])
//!
//! * `meta` — what a rule sees: [`DatagramMeta`] (from [`DatagramMeta::classify`]),
//!   [`NodeId`], [`Link`], [`OpcodeClass`], [`OpcodeMatch`].
//! * `rule` — rules as data: [`Rule`] = [`Action`] + [`Matcher`] + probability, with
//!   [`Nth`], [`PsnRange`], [`Window`], and the builders [`drop()`], [`drop_nth`],
//!   [`delay`], [`duplicate`], [`corrupt`], [`truncate`], [`partition`], [`hold`],
//!   [`rate_limit`].
//! * `plan` — [`FaultPlan`] (seed + ordered rules), its TOML form, stable hash and
//!   [`PlanError`].
//! * `injector` — [`Injector`]: runs a plan, holds run-time link state, [`Counters`] and the
//!   trace hash.
//! * `verdict` — [`Verdict`] and what it asks for: [`Verdict::deliveries`], [`Edit`],
//!   [`HoldQueue`].
//! * `stage` — [`Stage`]: carries verdicts out on the caller's datagrams, with the queue of
//!   delayed and held ones.
//! * `rng` (private) — ChaCha8 streams per (link, rule) and the stable FNV-1a hash.
//!
//! # How a datagram is decided
//!
//! [`Injector::on_datagram`] first drops datagrams on a link cut by [`Injector::partition`].
//! Then it walks the rules in plan order. A rule *selects* a datagram when every matcher field
//! agrees (direction, QPN, opcode or class, PSN range, time window) and its action applies
//! (truncation only to longer datagrams, corruption only to non-empty ones, a timed hold only
//! before its release time, and not after [`Injector::heal`]/[`Injector::release`] retired
//! it). Each selection advances the rule's count; the rule *fires* if the count satisfies its
//! [`Nth`] and a draw from its random stream falls under its probability. Then:
//!
//! * `delay` and `rate_limit` add their delay and evaluation continues;
//! * every other action is final: the **first** one that fires decides the verdict, carrying
//!   the delay added so far;
//! * if none fires, the datagram is delivered after the added delay.
//!
//! A rule only sees datagrams that reach it: put a delay before a duplicate rule to delay the
//! copies too, and a rate limit after the drop rules so lost datagrams take no bandwidth.
//!
//! # Determinism
//!
//! Each (link, rule index) has its own ChaCha8 stream keyed by the plan seed, so traffic on one
//! link never shifts the draws of another, and appending a rule leaves the existing rules'
//! schedules unchanged. Same seed, plan and call sequence ⇒ same verdicts, counters and
//! [`Injector::trace_hash`]. Print the plan ([`FaultPlan`]'s `Display` shows seed and
//! [`FaultPlan::hash`]) on failure to reproduce a run.
//!
//! # Example
//!
//! ```
//! use core::time::Duration;
//! use emu_fault::{DatagramMeta, FaultPlan, Injector, NodeId, OpcodeClass, delay, drop, drop_nth, hold};
//! use emu_proto::Instant;
//! use emu_proto::wire::{Opcode, Psn};
//!
//! let (a, b) = (NodeId(1), NodeId(2));
//! let plan = FaultPlan::new(42)
//!     .rule(drop(0.05).from(a).to(b))
//!     .rule(drop_nth(3).opcode(Opcode::Acknowledge))
//!     .rule(delay(Duration::from_micros(50)..=Duration::from_micros(200)).to(b))
//!     .rule(hold().opcode_class(OpcodeClass::Naks).until(Instant::from_nanos(5_000_000)));
//! println!("{plan}"); // seed, hash and canonical TOML
//! let mut injector = Injector::new(plan)?;
//!
//! // The caller classifies the datagram, asks for a verdict and carries it out (a backend
//! // leaves the last two steps to a `Stage`).
//! let datagram = vec![0u8; 32];
//! let meta = DatagramMeta::classify(a, b, &datagram);
//! assert_eq!((meta.opcode, meta.psn), (Opcode::SendFirst, Psn::new(0)));
//! let now = Instant::ZERO;
//! for delivery in injector.on_datagram(now, &meta).deliveries(now) {
//!     let mut bytes = datagram.clone();
//!     let len = delivery.edit.apply(&mut bytes);
//!     bytes.truncate(len);
//!     assert!(delivery.at >= now + Duration::from_micros(50)); // schedule `bytes` then
//! }
//! # Ok::<(), emu_fault::PlanError>(())
//! ```
//!
//! # Plan files
//!
//! A plan is a TOML document with a `seed` (integer, or a string such as `"0xfeed..."` for
//! seeds above `i64::MAX`) and `[[rule]]` tables evaluated in file order. Keys of a rule:
//!
//! | key | value | meaning |
//! |---|---|---|
//! | `action` | `"drop"`, `"duplicate"`, `"delay"`, `"corrupt"`, `"truncate"`, `"partition"`, `"hold"`, `"rate_limit"` | required |
//! | `from`, `to` | node number | direction; a two-way partition also cuts `to → from` |
//! | `qpn` | integer | destination QP |
//! | `opcode` | opcode name (`"ACKNOWLEDGE"`), class (`"requests"`, `"acks"`, `"naks"`, `"read_responses"`, `"atomics"`, `"any"`) or byte (`"0x64"`) | see [`OpcodeMatch`] |
//! | `psn` | `[lo, hi]` | inclusive, 24-bit, may wrap |
//! | `nth` / `after` | integer | only the n-th selected datagram / every one after the n-th |
//! | `start`, `end` | time | window `[start, end)`; either may be left out |
//! | `probability` | float in `[0, 1]` | default 1 |
//! | `copies` | 1–255 | `duplicate`: extra copies (required) |
//! | `min`, `max` | time | `delay`: uniform in `[min, max]`; `max` defaults to `min` |
//! | `len` | integer | `truncate`: bytes kept (required) |
//! | `oneway` | bool | `partition`: cut only `from → to` |
//! | `until` | time | `hold`: release time; without it, hold until [`Injector::release`] |
//! | `bytes_per_sec`, `burst` | integer | `rate_limit`: rate (required), bucket depth (default 0) |
//!
//! Times are strings of an integer and a unit — `ns`, `us`, `ms` or `s` — such as `"50us"`;
//! instants count from the caller's epoch ([`emu_proto::Instant`]). Unknown keys, keys that do
//! not belong to the rule's action and invalid values are rejected with a [`PlanError`] naming
//! the line, column and field.
//!
//! ```
//! use emu_fault::FaultPlan;
//!
//! let text = r#"
//! seed = 42
//!
//! [[rule]]          # lose 5 % of node 1 -> node 2
//! action = "drop"
//! from = 1
//! to = 2
//! probability = 0.05
//!
//! [[rule]]          # lose the 3rd ACK
//! action = "drop"
//! opcode = "ACKNOWLEDGE"
//! nth = 3
//!
//! [[rule]]
//! action = "delay"
//! min = "50us"
//! max = "200us"
//!
//! [[rule]]
//! action = "duplicate"
//! copies = 2
//! opcode = "requests"
//! psn = [0xfffffe, 1]
//! probability = 0.01
//!
//! [[rule]]
//! action = "partition"
//! from = 1
//! to = 2
//! oneway = true
//! start = "10ms"
//! end = "20ms"
//!
//! [[rule]]
//! action = "hold"
//! opcode = "acks"
//! until = "5ms"
//!
//! [[rule]]
//! action = "rate_limit"
//! bytes_per_sec = 125000000
//! burst = 9000
//! "#;
//! let plan = FaultPlan::from_toml(text)?;
//! assert_eq!(plan.rules.len(), 7);
//! assert_eq!(FaultPlan::from_toml(&plan.to_string())?, plan);
//!
//! let err = FaultPlan::from_toml("seed = 1\n[[rule]]\naction = \"drop\"\nprobability = 1.5\n")
//!     .unwrap_err();
//! assert_eq!(err.to_string(), "line 4, column 15: rule[0]: field `probability`: 1.5 is outside [0, 1]");
//! # Ok::<(), emu_fault::PlanError>(())
//! ```
#![forbid(unsafe_code)]

mod injector;
mod meta;
mod plan;
mod rng;
mod rule;
mod stage;
#[cfg(test)]
mod tests;
mod verdict;

pub use injector::{Counters, Injector, LinkCounters};
pub use meta::{DatagramMeta, Link, NodeId, OpcodeClass, OpcodeMatch};
pub use plan::{FaultPlan, PlanError, Position};
pub use rule::{
    Action, Matcher, Nth, PsnRange, Rule, Window, corrupt, delay, drop, drop_nth, duplicate, hold,
    partition, rate_limit, truncate,
};
pub use stage::{Buffers, Payload, Stage};
pub use verdict::{Deliveries, Delivery, DropCause, Edit, HoldQueue, Verdict};
