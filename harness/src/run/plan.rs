//! The plan file of `softverbs run --faults PLAN.toml`: network faults (the `seed` and
//! `[[rule]]` tables of [`emu_fault::FaultPlan`], applied by every node's UDP driver on the
//! datagrams it sends, node ids = node indices) next to process faults and harness settings.
//!
//! ```toml
//! seed = 7                  # optional: the network faults' seed (default: the run's --seed)
//!
//! [[rule]]                  # any emu-fault rule; times count from the run's start
//! action = "drop"
//! probability = 0.1
//!
//! [[process]]               # kill -9 node 2, 300 ms after the start
//! node = 2
//! action = "kill"
//! at = "300ms"
//!
//! [[process]]               # SIGSTOP node 1 once it has completed 200 ops, SIGCONT 150 ms later
//! node = 1
//! action = "pause"
//! after_ops = 200
//! duration = "150ms"
//!
//! [[process]]               # start node 2 again (fresh device, stays out of the workload)
//! node = 2
//! action = "restart"
//! at = "600ms"
//!
//! [harness]
//! expect_errors = false     # true: the network faults may exhaust retries (partitions, holds)
//! ```
//!
//! `[[process]]` keys: `node` (index), `action` (`kill`, `pause`, `restart`), exactly one of
//! `at` (time since the start) or `after_ops` (once the node reported that many completed
//! ops), and `duration` (pause only, required). A restart of a live node kills it first.
//! Errors name the line, column and field; nothing is started for an invalid plan.

use std::fmt;
use std::time::Duration;

use emu_fault::{Action, FaultPlan, PlanError, Position};

use crate::run::proto::QpParams;
use serde::Deserialize;
use toml::Spanned;

/// A parsed plan file.
#[derive(Clone, Debug, PartialEq)]
pub struct RunPlan {
    /// The network faults, with their seed (the file's, else the run seed).
    pub network: FaultPlan,
    /// Whether the file gave the network seed.
    pub seed_in_file: bool,
    /// Process faults, in file order.
    pub process: Vec<ProcessFault>,
    /// `[harness] expect_errors`: errors the network faults cause are not violations.
    pub expect_errors: bool,
}

impl RunPlan {
    /// A plan without faults: `seed` and nothing else.
    pub fn empty(seed: u64) -> RunPlan {
        RunPlan {
            network: FaultPlan::new(seed),
            seed_in_file: false,
            process: Vec::new(),
            expect_errors: false,
        }
    }
}

/// What a process fault does.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessAction {
    /// SIGKILL.
    Kill,
    /// SIGSTOP, then SIGCONT after the duration.
    Pause,
    /// Start the node again (killing it first if it is alive), with a fresh device.
    Restart,
}

impl ProcessAction {
    /// The plan-file name.
    pub fn name(self) -> &'static str {
        match self {
            ProcessAction::Kill => "kill",
            ProcessAction::Pause => "pause",
            ProcessAction::Restart => "restart",
        }
    }
}

/// When a process fault fires.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// This long after the start barrier.
    At(Duration),
    /// Once the node reported at least this many completed operations.
    AfterOps(u64),
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trigger::At(d) => write!(f, "at {}", format_duration(*d)),
            Trigger::AfterOps(n) => write!(f, "after {n} ops"),
        }
    }
}

/// One `[[process]]` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessFault {
    /// Node index.
    pub node: u32,
    /// What to do.
    pub action: ProcessAction,
    /// When.
    pub trigger: Trigger,
    /// How long a pause lasts.
    pub duration: Option<Duration>,
    /// Line of the table in the plan file (1-based), for error messages.
    pub line: usize,
}

impl fmt::Display for ProcessFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} node {} {}",
            self.action.name(),
            self.node,
            self.trigger
        )?;
        if let Some(d) = self.duration {
            write!(f, " for {}", format_duration(d))?;
        }
        Ok(())
    }
}

/// Why a plan file was rejected: where, which field, what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanFileError {
    /// 1-based line and column, when known.
    pub position: Option<Position>,
    /// The table at fault, e.g. `process[1]` or `rule[0]`.
    pub table: Option<String>,
    /// The field at fault.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for PlanFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(Position { line, column }) = self.position {
            write!(f, "line {line}, column {column}: ")?;
        }
        if let Some(t) = &self.table {
            write!(f, "{t}: ")?;
        }
        if let Some(field) = &self.field {
            write!(f, "field `{field}`: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for PlanFileError {}

#[derive(Deserialize)]
struct RawFile {
    #[serde(default)]
    process: Vec<Spanned<RawProcess>>,
    #[serde(default)]
    harness: Option<Spanned<RawHarness>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProcess {
    node: Spanned<i64>,
    action: Spanned<String>,
    #[serde(default)]
    at: Option<Spanned<String>>,
    #[serde(default)]
    after_ops: Option<Spanned<i64>>,
    #[serde(default)]
    duration: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHarness {
    #[serde(default)]
    expect_errors: Option<bool>,
}

fn position(text: &str, offset: usize) -> Position {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = before[line_start..]
        .iter()
        .filter(|&&b| b & 0xC0 != 0x80)
        .count()
        + 1;
    Position {
        line: before.iter().filter(|&&b| b == b'\n').count() + 1,
        column,
    }
}

/// Reads a plan file's text for a run of `nodes` nodes. `seed` is the network seed when the
/// file has none.
///
/// Errors: TOML syntax, unknown keys, missing or invalid fields (a node index of
/// `nodes` or more among them), in `[[process]]`, `[harness]` or the network rules (as
/// [`FaultPlan::from_toml`] reports them), each with its line and column.
pub fn parse(text: &str, seed: u64, nodes: u32) -> Result<RunPlan, PlanFileError> {
    let at = |span: std::ops::Range<usize>, table: Option<String>, field: &str, msg: String| {
        PlanFileError {
            position: Some(position(text, span.start)),
            table,
            field: Some(field.to_owned()),
            message: msg,
        }
    };
    let value: toml::Table = toml::from_str(text).map_err(|e| PlanFileError {
        position: e.span().map(|s| position(text, s.start)),
        table: None,
        field: None,
        message: one_line(e.message()),
    })?;
    let raw: RawFile = toml::from_str(text).map_err(|e| PlanFileError {
        position: e.span().map(|s| position(text, s.start)),
        table: None,
        field: None,
        message: one_line(e.message()),
    })?;
    let mut process = Vec::with_capacity(raw.process.len());
    for (k, entry) in raw.process.iter().enumerate() {
        let table = Some(format!("process[{k}]"));
        let p = entry.get_ref();
        let line = position(text, entry.span().start).line;
        let node = u32::try_from(*p.node.get_ref())
            .ok()
            .filter(|n| *n < nodes)
            .ok_or_else(|| {
                at(
                    p.node.span(),
                    table.clone(),
                    "node",
                    format!(
                        "node {} does not exist (the run has {nodes} nodes, 0 to {})",
                        p.node.get_ref(),
                        nodes.saturating_sub(1)
                    ),
                )
            })?;
        let action = match p.action.get_ref().as_str() {
            "kill" => ProcessAction::Kill,
            "pause" => ProcessAction::Pause,
            "restart" => ProcessAction::Restart,
            other => {
                return Err(at(
                    p.action.span(),
                    table,
                    "action",
                    format!("unknown action `{other}`: expected kill, pause or restart"),
                ));
            }
        };
        let trigger = match (&p.at, &p.after_ops) {
            (Some(_), Some(n)) => {
                return Err(at(
                    n.span(),
                    table,
                    "after_ops",
                    "cannot be combined with `at`".into(),
                ));
            }
            (Some(t), None) => Trigger::At(
                parse_duration(t.get_ref()).map_err(|m| at(t.span(), table.clone(), "at", m))?,
            ),
            (None, Some(n)) => match u64::try_from(*n.get_ref()) {
                Ok(v) if v >= 1 => Trigger::AfterOps(v),
                _ => {
                    return Err(at(
                        n.span(),
                        table,
                        "after_ops",
                        "must be at least 1".into(),
                    ));
                }
            },
            (None, None) => {
                return Err(at(
                    p.action.span(),
                    table,
                    "at",
                    "a process fault needs `at` or `after_ops`".into(),
                ));
            }
        };
        let duration = match (&p.duration, action) {
            (Some(d), ProcessAction::Pause) => {
                let v = parse_duration(d.get_ref())
                    .map_err(|m| at(d.span(), table.clone(), "duration", m))?;
                if v.is_zero() {
                    return Err(at(d.span(), table, "duration", "must be positive".into()));
                }
                Some(v)
            }
            (None, ProcessAction::Pause) => {
                return Err(at(
                    p.action.span(),
                    table,
                    "duration",
                    "required by action `pause`".into(),
                ));
            }
            (Some(d), _) => {
                return Err(at(
                    d.span(),
                    table,
                    "duration",
                    format!("not allowed for action `{}`", action.name()),
                ));
            }
            (None, _) => None,
        };
        process.push(ProcessFault {
            node,
            action,
            trigger,
            duration,
            line,
        });
    }
    let expect_errors = raw
        .harness
        .as_ref()
        .and_then(|h| h.get_ref().expect_errors)
        .unwrap_or(false);

    // The network part: the same text with the harness's own tables blanked (line numbers
    // stay), read by emu-fault.
    let seed_in_file = value.contains_key("seed");
    let mut net = blank_harness_tables(text);
    let shift = if seed_in_file {
        0
    } else {
        net.insert_str(0, &format!("seed = {}\n", seed.min(i64::MAX as u64)));
        1
    };
    let mut network = FaultPlan::from_toml(&net).map_err(|e| plan_error(e, shift))?;
    if !seed_in_file {
        network.seed = seed;
    }
    Ok(RunPlan {
        network,
        seed_in_file,
        process,
        expect_errors,
    })
}

/// `msg` on one line; a parser that gives no message at all (the toml crate does for some
/// inputs, e.g. `sffffffffft =`) still gets one.
fn one_line(msg: &str) -> String {
    let line = msg
        .trim()
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("; ");
    if line.is_empty() {
        "invalid TOML".to_owned()
    } else {
        line
    }
}

fn plan_error(e: PlanError, shift: usize) -> PlanFileError {
    PlanFileError {
        position: e.position.map(|p| Position {
            line: p.line.saturating_sub(shift).max(1),
            column: p.column,
        }),
        table: e.rule.map(|r| format!("rule[{r}]")),
        field: e.field.clone(),
        message: one_line(&e.message),
    }
}

/// The text with every `[[process]]` and `[harness]` table replaced by empty lines.
fn blank_harness_tables(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank = false;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        if t.starts_with('[') {
            let name: String = t
                .trim_start_matches('[')
                .split([']', '#'])
                .next()
                .unwrap_or("")
                .trim()
                .to_owned();
            let root = name
                .split('.')
                .next()
                .unwrap_or("")
                .trim()
                .trim_matches('"');
            blank = root == "process" || root == "harness";
        }
        if blank {
            if line.ends_with('\n') {
                out.push('\n');
            }
        } else {
            out.push_str(line);
        }
    }
    out
}

/// Parses `"<integer><unit>"` with unit `ns`, `us`, `ms` or `s` (e.g. `"300ms"`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "invalid time `{text}`: expected an integer and a unit (ns, us, ms, s), e.g. \"300ms\""
        )
    };
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let d = match unit {
        "ns" => Duration::from_nanos(n),
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        _ => return Err(bad()),
    };
    if d > MAX_TIME {
        return Err(format!(
            "time `{text}` is too long: at most {} ({} days)",
            format_duration(MAX_TIME),
            MAX_TIME.as_secs() / 86_400
        ));
    }
    Ok(d)
}

/// The longest time [`parse_duration`] accepts (7 days): every sum the harness forms from
/// durations, timeouts and slack (deadlines, bounds in ms) then fits with room to spare, and
/// a run asked to last longer is refused rather than cut short.
pub const MAX_TIME: Duration = Duration::from_secs(7 * 86_400);

/// Formats a duration as [`parse_duration`] reads it, in the largest exact unit.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    for (unit, scale) in [("s", 1_000_000_000u128), ("ms", 1_000_000), ("us", 1_000)] {
        if ns % scale == 0 {
            return format!("{}{unit}", ns / scale);
        }
    }
    format!("{ns}ns")
}

/// The chance above which retry exhaustion counts as a plausible outcome of a plan's random
/// loss (per retry sequence: `retry_cnt + 1` attempts in a row failing).
pub const EXHAUSTION_THRESHOLD: f64 = 1e-5;

/// The first rule that can cut a link for good, described: a partition or hold that never
/// ends (no window, or one that never closes; a hold without `until`), or a drop that fires
/// with probability ≥ 0.5 for ever.
pub fn cuts_links_for_good(plan: &FaultPlan) -> Option<String> {
    plan.rules.iter().enumerate().find_map(|(i, r)| {
        let endless = r
            .matcher
            .window
            .is_none_or(|w| w.end == emu_proto::Instant::MAX);
        let once = matches!(r.matcher.nth, Some(emu_fault::Nth::Only(_)));
        match r.action {
            Action::Partition { .. } if endless && !once => {
                Some(format!("rule[{i}] partitions a link and never heals"))
            }
            Action::Hold { until: None } if !once => Some(format!(
                "rule[{i}] holds datagrams until they are released by hand"
            )),
            Action::Drop if endless && !once && r.probability >= 0.5 => Some(format!(
                "rule[{i}] drops {:.0} % of the datagrams for ever",
                r.probability * 100.0
            )),
            _ => None,
        }
    })
}

/// An upper bound on the chance that one datagram is lost to the plan's `drop`, `corrupt`
/// and `truncate` rules (corrupted and truncated datagrams fail the receiver's ICRC check),
/// taking every rule as if it matched every datagram at all times.
pub fn loss_bound(plan: &FaultPlan) -> f64 {
    let kept: f64 = plan
        .rules
        .iter()
        .filter(|r| {
            matches!(
                r.action,
                Action::Drop | Action::Corrupt | Action::Truncate { .. }
            )
        })
        .map(|r| 1.0 - r.probability.clamp(0.0, 1.0))
        .product();
    1.0 - kept
}

/// A rule's loss as a function of time: `p` in `[start, end)` (nanoseconds since the start).
#[derive(Copy, Clone, Debug)]
struct LossSpan {
    start: u64,
    end: u64,
    p: f64,
}

/// The loss spans of the plan: `drop`, `corrupt`, `truncate` (lost to the ICRC check) with
/// their probability, partitions and holds with certainty, each over its window (a hold until
/// its `until`). Rules that fire on one datagram only (`nth`) lose one datagram, not a
/// stretch, and are left out; other matchers (QPN, opcode, PSN, direction) are taken to match
/// everything, so the bound is conservative.
fn loss_spans(plan: &FaultPlan) -> Vec<LossSpan> {
    plan.rules
        .iter()
        .filter(|r| !matches!(r.matcher.nth, Some(emu_fault::Nth::Only(_))))
        .filter_map(|r| {
            let (start, mut end) = r
                .matcher
                .window
                .map_or((0, u64::MAX), |w| (w.start.as_nanos(), w.end.as_nanos()));
            let p = match r.action {
                Action::Drop | Action::Corrupt | Action::Truncate { .. } => r.probability,
                Action::Partition { .. } => r.probability,
                Action::Hold { until } => {
                    end = end.min(until.map_or(u64::MAX, |u| u.as_nanos()));
                    r.probability
                }
                _ => return None,
            };
            Some(LossSpan {
                start,
                end,
                p: p.clamp(0.0, 1.0),
            })
        })
        .collect()
}

/// The worst chance, over every moment a retry sequence can start, that all `retry_cnt + 1`
/// attempts of a requester fail under the plan's loss: an attempt at time `t` (a request and
/// its answer, each crossing one injector) fails with `f(t) = 1 - (1 - p(t))²`, where `p(t)`
/// combines the loss of every rule active at `t`, and attempts are one local ACK timeout
/// apart. A loss window shorter than the retry budget therefore only costs the attempts that
/// fall into it: faults that heal within the budget keep the chance small.
pub fn worst_exhaustion_chance(plan: &FaultPlan, qp: &QpParams) -> f64 {
    let spans = loss_spans(plan);
    let step = qp.ack_timeout().as_nanos() as u64;
    let attempts = u64::from(qp.retry_cnt) + 1;
    let loss_at = |t: u64| {
        1.0 - spans
            .iter()
            .filter(|s| s.start <= t && t < s.end)
            .map(|s| 1.0 - s.p)
            .product::<f64>()
    };
    let chance_from = |t0: u64| {
        (0..attempts)
            .map(|k| {
                let kept = 1.0 - loss_at(t0.saturating_add(k.saturating_mul(step)));
                1.0 - kept * kept
            })
            .product::<f64>()
    };
    // The chance is piecewise constant in the start time, changing only where an attempt
    // crosses a span boundary: evaluating at those start times (and 0) finds the maximum.
    let mut starts = vec![0u64];
    for s in &spans {
        for b in [s.start, s.end] {
            if b == u64::MAX {
                continue;
            }
            for k in 0..attempts {
                starts.push(b.saturating_sub(k.saturating_mul(step)));
            }
        }
    }
    starts.into_iter().map(chance_from).fold(0.0, f64::max)
}

/// Whether the plan's random loss may plausibly exhaust the retries of QPs with `qp`:
/// [`worst_exhaustion_chance`] above [`EXHAUSTION_THRESHOLD`]. Then a retry exhaustion is a
/// legitimate outcome, not a liveness violation (10 % loss for the whole run with 7 retries
/// stays strict, 15 % does not; 30 % for two ACK timeouts stays strict).
pub fn retry_exhaustion_plausible(plan: &FaultPlan, qp: &QpParams) -> bool {
    worst_exhaustion_chance(plan, qp) > EXHAUSTION_THRESHOLD
}

/// Delays (the sum of every delay rule's longest delay, on a request and on its answer) that
/// reach the retry budget: then a requester can run out of retries before any answer arrives.
fn delays_reach_budget(plan: &FaultPlan, qp: &QpParams) -> Option<Duration> {
    let longest: Duration = plan
        .rules
        .iter()
        .filter_map(|r| match r.action {
            Action::Delay { max, .. } => Some(max),
            _ => None,
        })
        .sum();
    (longest * 2 >= qp.retry_budget()).then_some(longest)
}

/// Why retry exhaustion is a legitimate outcome of the plan's network faults for QPs with
/// `qp` — a link cut for good ([`cuts_links_for_good`]), delays that reach the retry budget,
/// or loss heavy or long enough ([`retry_exhaustion_plausible`]) — or `None` when the faults
/// heal within the retry budget, in which case every error they cause is a violation.
pub fn retry_exhaustion_reason(plan: &FaultPlan, qp: &QpParams) -> Option<String> {
    if let Some(why) = cuts_links_for_good(plan) {
        return Some(why);
    }
    if let Some(d) = delays_reach_budget(plan, qp) {
        return Some(format!(
            "delays of up to {} each way reach the retry budget of {} ms",
            format_duration(d),
            qp.retry_budget().as_millis()
        ));
    }
    let chance = worst_exhaustion_chance(plan, qp);
    (chance > EXHAUSTION_THRESHOLD).then(|| {
        format!(
            "up to {:.0} % loss per datagram may exhaust retry_cnt {} (all {} attempts lost: \
             p ≈ {chance:.1e})",
            loss_bound(plan) * 100.0,
            qp.retry_cnt,
            u32::from(qp.retry_cnt) + 1
        )
    })
}

/// The most extra copies `plan` can give one datagram: the sum of the `copies` of its
/// `duplicate` rules (each may fire on the same datagram), 0 without any.
pub fn max_copies(plan: &FaultPlan) -> u64 {
    plan.rules
        .iter()
        .map(|r| match r.action {
            Action::Duplicate { copies } => u64::from(copies),
            _ => 0,
        })
        .sum()
}

/// The network plan with every time (windows, hold release) moved later by `offset`, so that
/// times written relative to the run's start apply to a device created `offset` earlier.
pub fn shift_plan(plan: &FaultPlan, offset: Duration) -> FaultPlan {
    let shift = |t: emu_proto::Instant| {
        if t == emu_proto::Instant::MAX {
            t
        } else {
            t.saturating_add(offset)
        }
    };
    let mut out = plan.clone();
    for rule in &mut out.rules {
        if let Some(w) = rule.matcher.window.as_mut() {
            w.start = shift(w.start);
            w.end = shift(w.end);
        }
        if let Action::Hold { until: Some(u) } = &mut rule.action {
            *u = shift(*u);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const GOOD: &str = r#"
[[rule]]
action = "drop"
probability = 0.1

[[process]]
node = 2
action = "kill"
at = "300ms"

[[rule]]
action = "duplicate"
copies = 1
probability = 0.1

[[process]]
node = 1
action = "pause"
after_ops = 200
duration = "150ms"

[harness]
expect_errors = true
"#;

    #[test]
    fn reads_both_kinds_of_fault() {
        let plan = parse(GOOD, 9, 3).unwrap();
        assert_eq!(plan.network.seed, 9);
        assert!(!plan.seed_in_file);
        assert_eq!(plan.network.rules.len(), 2);
        assert_eq!(plan.process.len(), 2);
        assert_eq!(
            plan.process[0].trigger,
            Trigger::At(Duration::from_millis(300))
        );
        assert_eq!(plan.process[0].line, 6);
        assert_eq!(plan.process[1].duration, Some(Duration::from_millis(150)));
        assert!(plan.expect_errors);
        let with_seed = parse(&format!("seed = 5\n{GOOD}"), 9, 3).unwrap();
        assert_eq!(with_seed.network.seed, 5);
        assert!(with_seed.seed_in_file);
    }

    #[test]
    fn errors_name_line_and_field() {
        let e = parse("[[rule]]\naction = \"drop\"\nprobability = 2.0\n", 1, 3).unwrap_err();
        assert_eq!(e.position.unwrap().line, 3, "{e}");
        assert_eq!(e.field.as_deref(), Some("probability"));
        let e = parse(
            "[[process]]\nnode = 1\naction = \"pause\"\nat = \"1ms\"\n",
            1,
            3,
        )
        .unwrap_err();
        assert!(e.to_string().contains("duration"), "{e}");
        let e = parse(
            "[[process]]\nnode = 1\naction = \"nap\"\nat = \"1ms\"\n",
            1,
            3,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("line 3, column 10: process[0]: field `action`"),
            "{e}"
        );
        let e = parse(
            "[[process]]\nnode = 1\naction = \"kill\"\nat = \"1 ms\"\n",
            1,
            3,
        )
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("at"), "{e}");
        let e = parse("[[process]]\nnode = 1\naction = \"kill\"\nwhen = 3\n", 1, 3).unwrap_err();
        assert!(e.to_string().contains("when"), "{e}");
        let e = parse("[[process]\n", 1, 3).unwrap_err();
        assert!(e.position.is_some(), "{e}");
        let e = parse("bogus = 1\n", 1, 3).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = parse(
            "[[process]]\nnode = 3\naction = \"kill\"\nat = \"1ms\"\n",
            1,
            3,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("line 2, column 8: process[0]: field `node`: node 3"),
            "{e}"
        );
    }

    #[test]
    fn example_plans_parse() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("plans");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).unwrap();
                parse(&text, 1, 4).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                seen += 1;
            }
        }
        assert!(seen >= 5);
    }

    #[test]
    fn heavy_loss_may_exhaust_retries() {
        let qp = |retry_cnt| QpParams {
            timeout: 14,
            retry_cnt,
            rnr_retry: 7,
            recovery: crate::recovery::RecoveryArg::Ibta,
        };
        let plan = |p: f64| FaultPlan::new(1).rule(emu_fault::drop(p));
        assert!(!retry_exhaustion_plausible(&plan(0.1), &qp(7)));
        assert!(retry_exhaustion_plausible(&plan(0.15), &qp(7)));
        assert!(retry_exhaustion_plausible(&plan(0.1), &qp(3)));
        assert!(!retry_exhaustion_plausible(&FaultPlan::new(1), &qp(0)));
        assert!((loss_bound(&plan(0.5).rule(emu_fault::corrupt(0.5))) - 0.75).abs() < 1e-9);
        assert!(retry_exhaustion_reason(&plan(0.05), &qp(7)).is_none());
        assert!(retry_exhaustion_reason(&plan(0.6), &qp(7)).is_some());
    }

    #[test]
    fn faults_that_heal_within_the_budget_stay_strict() {
        let qp = QpParams {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            recovery: crate::recovery::RecoveryArg::Ibta,
        };
        let t = qp.ack_timeout().as_nanos() as u64;
        let at = emu_proto::Instant::from_nanos;
        let base = FaultPlan::new(1).rule(emu_fault::drop(0.05));
        // 30 % loss for two ACK timeouts on top of 5 %: at most two attempts in the storm.
        let storm = base
            .clone()
            .rule(emu_fault::drop(0.3).between(at(100 * t), at(102 * t)));
        assert!(retry_exhaustion_reason(&storm, &qp).is_none());
        // The same storm for the whole run is not.
        assert!(retry_exhaustion_reason(&base.clone().rule(emu_fault::drop(0.3)), &qp).is_some());
        // A partition that heals after two ACK timeouts: strict; one that lasts the whole
        // budget, or never heals: not.
        let cut = |end| {
            base.clone().rule(
                emu_fault::partition(emu_fault::NodeId(0), emu_fault::NodeId(1))
                    .between(at(10 * t), end),
            )
        };
        assert!(retry_exhaustion_reason(&cut(at(12 * t)), &qp).is_none());
        assert!(retry_exhaustion_reason(&cut(at(18 * t)), &qp).is_some());
        assert!(
            retry_exhaustion_reason(&cut(emu_proto::Instant::MAX), &qp)
                .unwrap()
                .contains("never heals")
        );
        // Two short partitions one budget apart cannot hit one retry sequence together; two
        // back to back act as one long one.
        let two = |gap: u64| {
            cut(at(12 * t)).rule(
                emu_fault::partition(emu_fault::NodeId(1), emu_fault::NodeId(2))
                    .between(at((12 + gap) * t), at((14 + gap) * t)),
            )
        };
        assert!(retry_exhaustion_reason(&two(8), &qp).is_none());
        assert!(retry_exhaustion_reason(&two(1), &qp).is_some());
        // Delays that reach the budget.
        let slow = FaultPlan::new(1).rule(emu_fault::delay(
            Duration::ZERO..=Duration::from_millis(300),
        ));
        assert!(
            retry_exhaustion_reason(&slow, &qp)
                .unwrap()
                .contains("delays")
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
        assert_eq!(parse_duration("604800s"), Ok(MAX_TIME));
        assert_eq!(
            parse_duration("5000000000s"),
            Err("time `5000000000s` is too long: at most 604800s (7 days)".to_owned())
        );
        assert!(parse_duration("604800001ms").is_err());
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(2)), "2s");
    }

    #[test]
    fn shifting_moves_windows() {
        let plan = parse(
            "[[rule]]\naction = \"drop\"\nstart = \"10ms\"\nend = \"20ms\"\n",
            1,
            3,
        )
        .unwrap();
        let shifted = shift_plan(&plan.network, Duration::from_millis(5));
        let w = shifted.rules[0].matcher.window.unwrap();
        assert_eq!(w.start.as_nanos(), 15_000_000);
        assert_eq!(w.end.as_nanos(), 25_000_000);
    }
}
