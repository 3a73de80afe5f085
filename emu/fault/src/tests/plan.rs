use core::time::Duration;

use emu_proto::Instant;
use emu_proto::wire::{Opcode, Psn};
use proptest::prelude::*;

use super::{A, B};
use crate::{
    Action, FaultPlan, Injector, Matcher, Nth, OpcodeClass, OpcodeMatch, PlanError, Position,
    PsnRange, Rule, Window, delay, drop, drop_nth, duplicate, hold, partition, rate_limit,
};

fn sample() -> FaultPlan {
    FaultPlan::new(42)
        .rule(drop(0.05).from(A).to(B))
        .rule(drop_nth(3).opcode(Opcode::Acknowledge))
        .rule(delay(
            Duration::from_micros(50)..=Duration::from_micros(200),
        ))
        .rule(
            duplicate(2)
                .opcode_class(OpcodeClass::Requests)
                .psn_range(Psn::new(0xFF_FFFE), Psn::new(1)),
        )
        .rule(
            partition(A, B)
                .oneway()
                .between(Instant::from_nanos(10_000_000), Instant::MAX),
        )
        .rule(
            hold()
                .opcode_class(OpcodeClass::Acks)
                .until(Instant::from_nanos(5_000_000)),
        )
        .rule(rate_limit(125_000_000).burst(9_000))
}

#[test]
fn canonical_text_and_hash_are_pinned() {
    let plan = FaultPlan::new(1)
        .rule(drop(0.5).from(A).opcode(Opcode::Unknown(0x64)))
        .rule(delay(Duration::from_micros(1500)..=Duration::from_secs(2)).qpn(7));
    let expected = r#"seed = 1

[[rule]]
action = "drop"
from = 1
opcode = "0x64"
probability = 0.5

[[rule]]
action = "delay"
qpn = 7
min = "1500us"
max = "2s"
"#;
    assert_eq!(plan.to_toml(), expected);
    // FNV-1a of the text above; changes only if the canonical form changes.
    assert_eq!(plan.hash(), 0xd84e_900d_52aa_e7c2, "{:#x}", plan.hash());
    assert_eq!(
        plan.to_string().lines().next(),
        Some(format!("# fault plan: seed 1, hash {:#018x}", plan.hash()).as_str())
    );
}

#[test]
fn sample_round_trips_through_text_and_display() {
    let plan = sample();
    assert_eq!(FaultPlan::from_toml(&plan.to_toml()).unwrap(), plan);
    assert_eq!(plan.to_string().parse::<FaultPlan>().unwrap(), plan);
    assert_ne!(
        plan.hash(),
        FaultPlan {
            seed: 43,
            ..plan.clone()
        }
        .hash()
    );
}

#[test]
fn large_seeds_are_hex_strings() {
    let plan = FaultPlan::new(u64::MAX);
    assert_eq!(plan.to_toml(), "seed = \"0xffffffffffffffff\"\n");
    assert_eq!(FaultPlan::from_toml(&plan.to_toml()).unwrap(), plan);
    assert_eq!(FaultPlan::from_toml("seed = \"12\"").unwrap().seed, 12);
}

#[test]
fn defaults_fill_in() {
    let plan = FaultPlan::from_toml(
        "seed = 0\n[[rule]]\naction = \"delay\"\nmin = \"5us\"\nend = \"1s\"\n\
         [[rule]]\naction = \"partition\"\n[[rule]]\naction = \"rate_limit\"\nbytes_per_sec = 10",
    )
    .unwrap();
    let five = Duration::from_micros(5);
    let window = Window {
        start: Instant::ZERO,
        end: Instant::from_nanos(1_000_000_000),
    };
    let expected = FaultPlan::new(0)
        .rule(delay(five..=five).between(window.start, window.end))
        .rule(Rule::new(Action::Partition { oneway: false }))
        .rule(rate_limit(10));
    assert_eq!(plan, expected);
}

/// `(text, line, column, field, message fragment)` for rejected plans.
const REJECTED: &[(&str, usize, usize, Option<&str>, &str)] = &[
    (
        "seed = 1\n[[rule]]\naction = \"drop\"\nopcode = \"ACKNOWLEDGED\"\n",
        4,
        10,
        Some("opcode"),
        "unknown opcode or class `ACKNOWLEDGED`",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"drop\"\nprobability = 1.5\n",
        4,
        15,
        Some("probability"),
        "1.5 is outside [0, 1]",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"delay\"\nmin = \"9us\"\nmax = \"2us\"\n",
        4,
        7,
        Some("min"),
        "longer than max",
    ),
    (
        "seed = 1\n\n[[rule]]\naction = \"duplicate\"\ncopies = 0\n",
        5,
        10,
        Some("copies"),
        "must be at least 1",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"duplicate\"\ncopies = 300\n",
        4,
        10,
        Some("copies"),
        "invalid value",
    ),
    (
        "seed = 1\n[[rule]\naction = \"drop\"\n",
        2,
        7,
        None,
        "invalid table header; expected",
    ),
    ("seed = \n", 1, 8, Some("seed"), ""),
    (
        "seed = 1\n[[rule]]\naction = \"drop\"\nprobabilty = 0.5\n",
        4,
        1,
        Some("probabilty"),
        "unknown field `probabilty`",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"explode\"\n",
        3,
        10,
        Some("action"),
        "unknown action `explode`",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"drop\"\ncopies = 2\n",
        4,
        10,
        Some("copies"),
        "not allowed for action `drop`",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"truncate\"\n",
        3,
        10,
        Some("len"),
        "required by action `truncate`",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"drop\"\nnth = 2\nafter = 3\n",
        5,
        9,
        Some("after"),
        "cannot be combined with `nth`",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"drop\"\nnth = 0\n",
        4,
        7,
        Some("nth"),
        "counts from 1",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"drop\"\npsn = [0, 0x1000000]\n",
        4,
        7,
        Some("psn"),
        "24-bit",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"drop\"\npsn = [1, 2, 3]\n",
        4,
        7,
        Some("psn"),
        "expected two PSNs",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"drop\"\nstart = \"5 ms\"\n",
        4,
        9,
        Some("start"),
        "invalid time `5 ms`",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"drop\"\nstart = \"5ms\"\nend = \"5ms\"\n",
        5,
        7,
        Some("end"),
        "must end after it starts",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"rate_limit\"\nbytes_per_sec = -5\n",
        4,
        17,
        Some("bytes_per_sec"),
        "must not be negative",
    ),
    ("seed = -1\n", 1, 8, Some("seed"), "expected an integer"),
    ("seed = 1.5\n", 1, 8, Some("seed"), "expected an integer"),
    (
        "[[rule]]\naction = \"drop\"\n",
        1,
        1,
        None,
        "missing field `seed`",
    ),
    (
        "seed = 1\n[[rule]]\nfrom = 2\n",
        2,
        1,
        None,
        "missing field `action`",
    ),
    (
        "seed = 1\n[[rule]]\naction = \"drop\"\nfrom = \"a\"\n",
        4,
        8,
        Some("from"),
        "invalid type",
    ),
];

#[test]
fn invalid_plans_name_line_column_and_field() {
    for &(text, line, column, field, fragment) in REJECTED {
        let err: PlanError = FaultPlan::from_toml(text).unwrap_err();
        let shown = err.to_string();
        assert_eq!(
            err.position,
            Some(Position { line, column }),
            "{text:?}: {shown}"
        );
        assert_eq!(err.field.as_deref(), field, "{text:?}: {shown}");
        assert!(err.message.contains(fragment), "{text:?}: {shown}");
        assert!(
            shown.starts_with(&format!("line {line}, column {column}: ")),
            "{shown}"
        );
    }
}

#[test]
fn rule_errors_name_the_rule_index() {
    let text = "seed = 1\n[[rule]]\naction = \"drop\"\n[[rule]]\naction = \"drop\"\nqpn = 1\n\
                probability = 2\n";
    let err = FaultPlan::from_toml(text).unwrap_err();
    assert_eq!(
        err.to_string(),
        "line 7, column 15: rule[1]: field `probability`: 2 is outside [0, 1]"
    );
}

fn time() -> impl Strategy<Value = u64> {
    // Mix round values (written in s/ms/us) with arbitrary nanoseconds.
    prop_oneof![
        (0u64..1_000_000).prop_map(|n| n * 1_000),
        (0u64..100).prop_map(|n| n * 1_000_000_000),
        any::<u64>(),
    ]
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        Just(Action::Drop),
        (1u8..).prop_map(|copies| Action::Duplicate { copies }),
        (time(), time()).prop_map(|(a, b)| Action::Delay {
            min: Duration::from_nanos(a.min(b)),
            max: Duration::from_nanos(a.max(b)),
        }),
        Just(Action::Corrupt),
        any::<u32>().prop_map(|len| Action::Truncate { len }),
        any::<bool>().prop_map(|oneway| Action::Partition { oneway }),
        proptest::option::of(time().prop_map(Instant::from_nanos))
            .prop_map(|until| Action::Hold { until }),
        (1..=i64::MAX as u64, 0..=i64::MAX as u64).prop_map(|(bytes_per_sec, burst)| {
            Action::RateLimit {
                bytes_per_sec,
                burst,
            }
        }),
    ]
}

fn opcode_match() -> impl Strategy<Value = OpcodeMatch> {
    prop_oneof![
        any::<u8>().prop_map(|b| OpcodeMatch::Opcode(Opcode::from(b))),
        proptest::sample::select(OpcodeClass::ALL.to_vec()).prop_map(OpcodeMatch::Class),
    ]
}

fn matcher() -> impl Strategy<Value = Matcher> {
    use proptest::option::of;
    let psn = (0..=Psn::MASK, 0..=Psn::MASK).prop_map(|(lo, hi)| PsnRange {
        lo: Psn::new(lo),
        hi: Psn::new(hi),
    });
    let nth = prop_oneof![
        (1u32..).prop_map(Nth::Only),
        any::<u32>().prop_map(Nth::After)
    ];
    let window = (time(), prop_oneof![Just(u64::MAX), time()])
        .prop_filter("empty window", |(a, b)| a != b)
        .prop_map(|(a, b)| Window {
            start: Instant::from_nanos(a.min(b)),
            end: Instant::from_nanos(a.max(b)),
        });
    (
        (of(any::<u32>()), of(any::<u32>()), of(any::<u32>())),
        of(opcode_match()),
        of(psn),
        of(nth),
        of(window),
    )
        .prop_map(|((from, to, qpn), opcode, psn, nth, window)| Matcher {
            from: from.map(crate::NodeId),
            to: to.map(crate::NodeId),
            qpn,
            opcode,
            psn,
            nth,
            window,
        })
}

fn plan() -> impl Strategy<Value = FaultPlan> {
    let probability = prop_oneof![Just(1.0), Just(0.0), 0.0..=1.0f64];
    let rule = (action(), matcher(), probability).prop_map(|(action, matcher, probability)| Rule {
        action,
        matcher,
        probability,
    });
    (any::<u64>(), proptest::collection::vec(rule, 0..6))
        .prop_map(|(seed, rules)| FaultPlan { seed, rules })
}

/// Fragments that reach every parser path: keys, right and wrong values, headers, junk.
fn toml_ish() -> impl Strategy<Value = String> {
    let keys = [
        "seed",
        "action",
        "from",
        "to",
        "qpn",
        "opcode",
        "psn",
        "nth",
        "after",
        "start",
        "end",
        "probability",
        "copies",
        "min",
        "max",
        "len",
        "oneway",
        "until",
        "bytes_per_sec",
        "burst",
        "bogus",
    ];
    let values = [
        "1",
        "-1",
        "0",
        "300",
        "9223372036854775807",
        "1.5",
        "0.5",
        "nan",
        "inf",
        "true",
        "\"drop\"",
        "\"delay\"",
        "\"duplicate\"",
        "\"hold\"",
        "\"rate_limit\"",
        "\"partition\"",
        "\"truncate\"",
        "\"corrupt\"",
        "\"acks\"",
        "\"SEND_ONLY\"",
        "\"0xff\"",
        "\"5us\"",
        "\"0s\"",
        "\"18446744073709551615ns\"",
        "\"x\"",
        "[1, 2]",
        "[0, 16777216]",
        "[]",
        "{}",
        "\"µs\"",
    ];
    let line = prop_oneof![
        (
            proptest::sample::select(keys.to_vec()),
            proptest::sample::select(values.to_vec())
        )
            .prop_map(|(k, v)| format!("{k} = {v}")),
        Just("[[rule]]".to_owned()),
        Just("[rule]".to_owned()),
        "\\PC{0,12}",
    ];
    proptest::collection::vec(line, 0..24).prop_map(|lines| lines.join("\n"))
}

proptest! {
    #[test]
    fn plans_round_trip_through_toml(plan in plan()) {
        plan.validate().unwrap();
        let text = plan.to_toml();
        prop_assert_eq!(&FaultPlan::from_toml(&text).unwrap(), &plan);
        prop_assert_eq!(FaultPlan::from_toml(&plan.to_string()).unwrap().hash(), plan.hash());
        prop_assert!(Injector::new(plan).is_ok());
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC*") {
        let _ = FaultPlan::from_toml(&text);
    }

    #[test]
    fn toml_like_text_never_panics_and_accepted_plans_are_valid(text in toml_ish()) {
        if let Ok(plan) = FaultPlan::from_toml(&text) {
            plan.validate().unwrap();
            prop_assert_eq!(FaultPlan::from_toml(&plan.to_toml()).unwrap(), plan);
        } else if let Err(err) = FaultPlan::from_toml(&text) {
            prop_assert!(err.position.is_some());
        }
    }
}
