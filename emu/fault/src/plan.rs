//! [`FaultPlan`]: a seed plus ordered rules, its TOML form, its stable hash, and [`PlanError`].
//!
//! The TOML schema is documented, with an example, in the crate doc. Reading goes through a
//! private mirror of the schema whose fields keep their source spans, so every rejection names a
//! line, a column and, where one is at fault, a field.

use core::fmt;
use core::ops::Range;
use core::str::FromStr;
use core::time::Duration;

use emu_proto::Instant;
use emu_proto::wire::Psn;
use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::meta::{NodeId, OpcodeMatch};
use crate::rng::StableHasher;
use crate::rule::{Action, Matcher, Nth, PsnRange, Rule, Window};

/// A complete, reproducible fault schedule: the seed of every random draw and the rules, in
/// evaluation order. Plain data; [`crate::Injector`] runs it.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultPlan {
    /// Seed of every random stream.
    pub seed: u64,
    /// Rules in evaluation order.
    pub rules: Vec<Rule>,
}

impl FaultPlan {
    /// A plan with `seed` and no rules.
    pub fn new(seed: u64) -> FaultPlan {
        FaultPlan {
            seed,
            rules: Vec::new(),
        }
    }

    /// Appends `rule`, evaluated after the rules already present.
    #[must_use]
    pub fn rule(mut self, rule: Rule) -> FaultPlan {
        self.rules.push(rule);
        self
    }

    /// Checks every rule's values (probability in `[0, 1]`, `copies ≥ 1`, `min ≤ max`, a
    /// non-empty window, `nth ≥ 1`, a positive rate, values TOML can hold); the error names the
    /// rule index and field. Structural mistakes are impossible in code and caught by
    /// [`FaultPlan::from_toml`] in text.
    pub fn validate(&self) -> Result<(), PlanError> {
        self.rules.iter().enumerate().try_for_each(|(i, rule)| {
            rule.check()
                .map_err(|(field, msg)| rule_error(i, field, msg))
        })
    }

    /// Reads and validates a plan from TOML. Never panics; errors carry the 1-based line and
    /// column and, when known, the rule index and field.
    pub fn from_toml(text: &str) -> Result<FaultPlan, PlanError> {
        let raw: RawPlan = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        let at =
            |span: Range<usize>, rule: Option<usize>, field: &str, message: String| PlanError {
                position: Some(Position::of(text, span.start)),
                rule,
                field: Some(field.to_owned()),
                message,
            };
        let seed = parse_seed(raw.seed.get_ref())
            .ok_or_else(|| at(raw.seed.span(), None, "seed", SEED_EXPECTED.to_owned()))?;
        let mut plan = FaultPlan::new(seed);
        for (i, raw_rule) in raw.rules.iter().enumerate() {
            let rule = raw_rule
                .to_rule()
                .map_err(|(span, field, msg)| at(span, Some(i), field, msg))?;
            if let Err((field, msg)) = rule.check() {
                let span = raw_rule
                    .span_of(field)
                    .unwrap_or_else(|| raw_rule.action.span());
                return Err(at(span, Some(i), field, msg));
            }
            plan.rules.push(rule);
        }
        Ok(plan)
    }

    /// The canonical TOML text of the plan, which [`FaultPlan::from_toml`] reads back to an
    /// equal plan when the plan is valid.
    pub fn to_toml(&self) -> String {
        let raw = RawPlan {
            seed: unspanned(i64::try_from(self.seed).map_or_else(
                |_| toml::Value::String(format!("{:#x}", self.seed)),
                toml::Value::Integer,
            )),
            rules: self.rules.iter().map(RawRule::from_rule).collect(),
        };
        // Cannot fail: the schema has no maps with non-string keys, no `None` in arrays, and
        // every integer is converted to `i64` first.
        toml::to_string(&raw).unwrap_or_else(|e| format!("# unserialisable plan: {e}\n"))
    }

    /// A 64-bit FNV-1a hash of [`FaultPlan::to_toml`]: equal for equal plans on every run,
    /// platform and Rust release (given the locked `toml` version).
    pub fn hash(&self) -> u64 {
        text_hash(&self.to_toml())
    }
}

impl fmt::Display for FaultPlan {
    /// The canonical TOML, preceded by a comment line with the seed and hash; the whole text
    /// reads back with [`FaultPlan::from_toml`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.to_toml();
        let (seed, hash) = (self.seed, text_hash(&text));
        write!(f, "# fault plan: seed {seed}, hash {hash:#018x}\n{text}")
    }
}

fn text_hash(text: &str) -> u64 {
    StableHasher::new().bytes(text.as_bytes()).finish()
}

impl FromStr for FaultPlan {
    type Err = PlanError;

    /// Same as [`FaultPlan::from_toml`].
    fn from_str(text: &str) -> Result<FaultPlan, PlanError> {
        FaultPlan::from_toml(text)
    }
}

/// Why a plan was rejected, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlanError {
    /// Where in the plan text; `None` for a plan built in code.
    pub position: Option<Position>,
    /// Index of the offending rule in [`FaultPlan::rules`], when known.
    pub rule: Option<usize>,
    /// The plan-file field at fault, when known (e.g. `"probability"`).
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

/// A 1-based line and column (in characters) in a plan text.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Position {
    /// Line number, from 1.
    pub line: usize,
    /// Column number in characters, from 1.
    pub column: usize,
}

impl Position {
    /// The position of byte `offset` in `text` (clamped to the text).
    fn of(text: &str, offset: usize) -> Position {
        let before = &text.as_bytes()[..offset.min(text.len())];
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        // Count UTF-8 leading bytes, i.e. characters.
        let chars = before[line_start..]
            .iter()
            .filter(|&&b| b & 0xC0 != 0x80)
            .count();
        Position {
            line: before.iter().filter(|&&b| b == b'\n').count() + 1,
            column: chars + 1,
        }
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(Position { line, column }) = self.position {
            write!(f, "line {line}, column {column}: ")?;
        }
        if let Some(rule) = self.rule {
            write!(f, "rule[{rule}]: ")?;
        }
        if let Some(field) = &self.field {
            write!(f, "field `{field}`: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for PlanError {}

pub(crate) fn rule_error(rule: usize, field: &str, message: String) -> PlanError {
    PlanError {
        position: None,
        rule: Some(rule),
        field: Some(field.to_owned()),
        message,
    }
}

/// Converts a `toml` error (syntax, type, unknown or missing key) into a located [`PlanError`].
fn toml_error(text: &str, e: &toml::de::Error) -> PlanError {
    let span = e.span().unwrap_or(0..0);
    PlanError {
        position: Some(Position::of(text, span.start)),
        rule: None,
        field: key_at(text, span),
        message: e
            .message()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; "),
    }
}

/// Best-effort name of the key a `toml` error span belongs to: the span itself when it is a key
/// (unknown-field errors), otherwise the nearest `key =` before it on the same line.
fn key_at(text: &str, span: Range<usize>) -> Option<String> {
    let is_key = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    let spanned = text.get(span.clone())?;
    let after = text.get(span.end..)?.trim_start();
    if is_key(spanned) && after.starts_with('=') {
        return Some(spanned.to_owned());
    }
    let line = text.get(..span.start)?.rsplit('\n').next()?;
    let (lhs, _) = line.rsplit_once('=')?;
    let key = lhs.rsplit(['{', ',', '.']).next()?.trim().trim_matches('"');
    is_key(key).then(|| key.to_owned())
}

const SEED_EXPECTED: &str =
    "expected an integer in 0..=i64::MAX or a string holding a u64 (decimal or 0x-hex)";

/// Reads a seed: TOML integers stop at `i64::MAX`, so larger seeds are written as hex strings.
fn parse_seed(value: &toml::Value) -> Option<u64> {
    match value {
        toml::Value::Integer(i) => u64::try_from(*i).ok(),
        toml::Value::String(s) => match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => s.parse().ok(),
        },
        _ => None,
    }
}

/// The TOML document. Field names are the plan-file keys.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    seed: Spanned<toml::Value>,
    #[serde(default, rename = "rule", skip_serializing_if = "Vec::is_empty")]
    rules: Vec<RawRule>,
}

type Opt<T> = Option<Spanned<T>>;

/// One `[[rule]]` table; see the crate doc for each key.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    action: Spanned<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from: Opt<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    to: Opt<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    qpn: Opt<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    opcode: Opt<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    psn: Opt<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nth: Opt<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    after: Opt<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    start: Opt<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    end: Opt<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    probability: Opt<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    copies: Opt<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min: Opt<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max: Opt<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    len: Opt<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    oneway: Opt<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    until: Opt<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bytes_per_sec: Opt<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    burst: Opt<i64>,
}

/// The parameters each action accepts; every other parameter is rejected.
const ACTIONS: [(&str, &[&str]); 8] = [
    ("drop", &[]),
    ("duplicate", &["copies"]),
    ("delay", &["min", "max"]),
    ("corrupt", &[]),
    ("truncate", &["len"]),
    ("partition", &["oneway"]),
    ("hold", &["until"]),
    ("rate_limit", &["bytes_per_sec", "burst"]),
];

/// A conversion failure: span, field, message.
type Located = (Range<usize>, &'static str, String);

/// Action parameter keys, as opposed to matcher keys.
const PARAMS: [&str; 8] = [
    "copies",
    "min",
    "max",
    "len",
    "oneway",
    "until",
    "bytes_per_sec",
    "burst",
];

impl RawRule {
    /// Span of the value of `field`, if present.
    fn span_of(&self, field: &str) -> Option<Range<usize>> {
        fn s<T>(v: &Opt<T>) -> Option<Range<usize>> {
            v.as_ref().map(Spanned::span)
        }
        match field {
            "from" => s(&self.from),
            "to" => s(&self.to),
            "qpn" => s(&self.qpn),
            "opcode" => s(&self.opcode),
            "psn" => s(&self.psn),
            "nth" => s(&self.nth),
            "after" => s(&self.after),
            "start" => s(&self.start),
            "end" => s(&self.end),
            "probability" => s(&self.probability),
            "copies" => s(&self.copies),
            "min" => s(&self.min),
            "max" => s(&self.max),
            "len" => s(&self.len),
            "oneway" => s(&self.oneway),
            "until" => s(&self.until),
            "bytes_per_sec" => s(&self.bytes_per_sec),
            "burst" => s(&self.burst),
            _ => None,
        }
    }

    fn to_rule(&self) -> Result<Rule, Located> {
        let name = self.action.get_ref().as_str();
        let Some((_, params)) = ACTIONS.iter().find(|(n, _)| *n == name) else {
            let names: Vec<_> = ACTIONS.iter().map(|(n, _)| *n).collect();
            let msg = format!(
                "unknown action `{name}`: expected one of {}",
                names.join(", ")
            );
            return Err((self.action.span(), "action", msg));
        };
        if let Some((field, span)) = PARAMS
            .iter()
            .filter(|p| !params.contains(p))
            .find_map(|&p| Some((p, self.span_of(p)?)))
        {
            let msg = format!("not allowed for action `{name}`");
            return Err((span, field, msg));
        }
        let missing = |field: &'static str| {
            let msg = format!("required by action `{name}`");
            (self.action.span(), field, msg)
        };
        let action = match name {
            "drop" => Action::Drop,
            "corrupt" => Action::Corrupt,
            "duplicate" => Action::Duplicate {
                copies: *self
                    .copies
                    .as_ref()
                    .ok_or_else(|| missing("copies"))?
                    .get_ref(),
            },
            "delay" => {
                let min = duration(self.min.as_ref().ok_or_else(|| missing("min"))?, "min")?;
                let max = self.max.as_ref().map(|m| duration(m, "max")).transpose()?;
                Action::Delay {
                    min,
                    max: max.unwrap_or(min),
                }
            }
            "truncate" => Action::Truncate {
                len: *self.len.as_ref().ok_or_else(|| missing("len"))?.get_ref(),
            },
            "partition" => Action::Partition {
                oneway: self.oneway.as_ref().is_some_and(|o| *o.get_ref()),
            },
            "hold" => Action::Hold {
                until: self
                    .until
                    .as_ref()
                    .map(|t| instant(t, "until"))
                    .transpose()?,
            },
            // "rate_limit", the only name in `ACTIONS` not matched above.
            _ => Action::RateLimit {
                bytes_per_sec: non_negative(
                    self.bytes_per_sec
                        .as_ref()
                        .ok_or_else(|| missing("bytes_per_sec"))?,
                    "bytes_per_sec",
                )?,
                burst: self
                    .burst
                    .as_ref()
                    .map_or(Ok(0), |b| non_negative(b, "burst"))?,
            },
        };
        let nth = match (&self.nth, &self.after) {
            (Some(_), Some(after)) => {
                let msg = "cannot be combined with `nth`".to_owned();
                return Err((after.span(), "after", msg));
            }
            (Some(n), None) => Some(Nth::Only(*n.get_ref())),
            (None, Some(n)) => Some(Nth::After(*n.get_ref())),
            (None, None) => None,
        };
        let window = match (&self.start, &self.end) {
            (None, None) => None,
            (start, end) => Some(Window {
                start: start
                    .as_ref()
                    .map_or(Ok(Instant::ZERO), |s| instant(s, "start"))?,
                end: end
                    .as_ref()
                    .map_or(Ok(Instant::MAX), |e| instant(e, "end"))?,
            }),
        };
        let psn = self.psn.as_ref().map(psn_range).transpose()?;
        let opcode = self.opcode.as_ref().map(opcode_match).transpose()?;
        Ok(Rule {
            action,
            matcher: Matcher {
                from: self.from.as_ref().map(|n| NodeId(*n.get_ref())),
                to: self.to.as_ref().map(|n| NodeId(*n.get_ref())),
                qpn: self.qpn.as_ref().map(|q| *q.get_ref()),
                opcode,
                psn,
                nth,
                window,
            },
            probability: self.probability.as_ref().map_or(1.0, |p| *p.get_ref()),
        })
    }

    fn from_rule(rule: &Rule) -> RawRule {
        let m = &rule.matcher;
        let int = |v: u64| Some(unspanned(i64::try_from(v).unwrap_or(i64::MAX)));
        let mut raw = RawRule {
            action: unspanned(rule.action.name().to_owned()),
            from: m.from.map(|n| unspanned(n.0)),
            to: m.to.map(|n| unspanned(n.0)),
            qpn: m.qpn.map(unspanned),
            opcode: m.opcode.map(|o| unspanned(o.to_string())),
            psn: m.psn.map(|r| unspanned(vec![r.lo.value(), r.hi.value()])),
            nth: None,
            after: None,
            // `start` is always written so that a window of [0, MAX) survives the round trip.
            start: m
                .window
                .map(|w| unspanned(format_nanos(w.start.as_nanos().into()))),
            end: m
                .window
                .filter(|w| w.end != Instant::MAX)
                .map(|w| unspanned(format_nanos(w.end.as_nanos().into()))),
            probability: (rule.probability != 1.0).then(|| unspanned(rule.probability)),
            copies: None,
            min: None,
            max: None,
            len: None,
            oneway: None,
            until: None,
            bytes_per_sec: None,
            burst: None,
        };
        match m.nth {
            Some(Nth::Only(n)) => raw.nth = Some(unspanned(n)),
            Some(Nth::After(n)) => raw.after = Some(unspanned(n)),
            None => {}
        }
        match rule.action {
            Action::Drop | Action::Corrupt => {}
            Action::Duplicate { copies } => raw.copies = Some(unspanned(copies)),
            Action::Delay { min, max } => {
                raw.min = Some(unspanned(format_nanos(min.as_nanos())));
                raw.max = (max != min).then(|| unspanned(format_nanos(max.as_nanos())));
            }
            Action::Truncate { len } => raw.len = Some(unspanned(len)),
            Action::Partition { oneway } => raw.oneway = oneway.then(|| unspanned(true)),
            Action::Hold { until } => {
                raw.until = until.map(|t| unspanned(format_nanos(t.as_nanos().into())));
            }
            Action::RateLimit {
                bytes_per_sec,
                burst,
            } => {
                raw.bytes_per_sec = int(bytes_per_sec);
                raw.burst = (burst != 0).then(|| int(burst)).flatten();
            }
        }
        raw
    }
}

/// A value for serialisation; the span is only meaningful when deserialised.
fn unspanned<T>(value: T) -> Spanned<T> {
    Spanned::new(0..0, value)
}

fn non_negative(v: &Spanned<i64>, field: &'static str) -> Result<u64, Located> {
    u64::try_from(*v.get_ref()).map_err(|_| (v.span(), field, "must not be negative".to_owned()))
}

fn opcode_match(v: &Spanned<String>) -> Result<OpcodeMatch, Located> {
    OpcodeMatch::parse(v.get_ref()).ok_or_else(|| {
        let msg = format!(
            "unknown opcode or class `{}`: expected an opcode name such as \"SEND_ONLY\", a \
             class (requests, acks, naks, read_responses, atomics, any) or a byte such as \
             \"0x64\"",
            v.get_ref()
        );
        (v.span(), "opcode", msg)
    })
}

fn psn_range(v: &Spanned<Vec<u32>>) -> Result<PsnRange, Located> {
    let &[lo, hi] = v.get_ref().as_slice() else {
        return Err((v.span(), "psn", "expected two PSNs, [lo, hi]".to_owned()));
    };
    if lo.max(hi) > Psn::MASK {
        let msg = format!("PSNs are 24-bit: [{lo:#x}, {hi:#x}] exceeds 0xffffff");
        return Err((v.span(), "psn", msg));
    }
    Ok(PsnRange {
        lo: Psn::new(lo),
        hi: Psn::new(hi),
    })
}

fn duration(v: &Spanned<String>, field: &'static str) -> Result<Duration, Located> {
    parse_nanos(v.get_ref())
        .map(Duration::from_nanos)
        .ok_or_else(|| (v.span(), field, time_error(v.get_ref())))
}

fn instant(v: &Spanned<String>, field: &'static str) -> Result<Instant, Located> {
    parse_nanos(v.get_ref())
        .map(Instant::from_nanos)
        .ok_or_else(|| (v.span(), field, time_error(v.get_ref())))
}

fn time_error(text: &str) -> String {
    format!(
        "invalid time `{text}`: expected an integer and a unit (ns, us, ms, s), e.g. \"50us\", \
         of at most 2^64-1 ns"
    )
}

const UNITS: [(&str, u128); 4] = [
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("ns", 1),
];

/// Parses `"<digits><unit>"` with unit ns, us, ms or s into nanoseconds.
fn parse_nanos(text: &str) -> Option<u64> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(split);
    let (_, scale) = UNITS.iter().find(|(u, _)| *u == unit)?;
    if digits.is_empty() {
        return None;
    }
    let n: u128 = digits.parse().ok()?;
    u64::try_from(n.checked_mul(*scale)?).ok()
}

/// Formats nanoseconds in the largest unit that represents them exactly.
fn format_nanos(nanos: u128) -> String {
    let (unit, scale) = UNITS
        .iter()
        .find(|(_, scale)| nanos % scale == 0)
        .copied()
        .unwrap_or(("ns", 1));
    format!("{}{unit}", nanos / scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_and_format() {
        assert_eq!(parse_nanos("50us"), Some(50_000));
        assert_eq!(parse_nanos("0s"), Some(0));
        assert_eq!(parse_nanos("18446744073709551615ns"), Some(u64::MAX));
        for bad in [
            "",
            "us",
            "5",
            "5 us",
            "5m",
            "-5ns",
            "1.5ms",
            "18446744073709551616ns",
        ] {
            assert_eq!(parse_nanos(bad), None, "{bad:?}");
        }
        assert_eq!(format_nanos(1_500_000), "1500us");
        assert_eq!(format_nanos(2_000_000_000), "2s");
        assert_eq!(format_nanos(0), "0s");
        assert_eq!(format_nanos(7), "7ns");
    }

    #[test]
    fn positions_count_lines_and_chars() {
        let text = "a\nµb = 1\n";
        assert_eq!(Position::of(text, 0), Position { line: 1, column: 1 });
        assert_eq!(Position::of(text, 5), Position { line: 2, column: 3 });
        assert_eq!(Position::of(text, 99), Position { line: 3, column: 1 });
    }

    #[test]
    fn key_at_finds_the_field() {
        let text = "x = 1\nmin = { a = \"5\" }\nfoo = 2";
        assert_eq!(key_at(text, 12..19).as_deref(), Some("min"));
        assert_eq!(key_at(text, 18..21).as_deref(), Some("a"));
        assert_eq!(key_at(text, 24..27).as_deref(), Some("foo"));
        assert_eq!(key_at(text, 0..0), None);
    }
}
