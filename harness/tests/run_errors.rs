//! `softverbs run` fails the right way: bad input is refused before anything starts (exit 2),
//! and a corrupted piece of evidence is caught (exit 1), which shows the checker can fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{num, run, test_dir};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn a_bad_plan_file_is_refused_with_its_line_and_field() {
    let cases = [
        (
            "[[rule]]\naction = \"drop\"\nprobability = 1.5\n",
            "line 3, column 15: rule[0]: field `probability`",
        ),
        (
            "[[process]]\nnode = 1\naction = \"pause\"\nat = \"100ms\"\n",
            "process[0]: field `duration`: required by action `pause`",
        ),
        (
            "[[process]]\nnode = 5\naction = \"kill\"\nat = \"100ms\"\n",
            "line 2, column 8: process[0]: field `node`: node 5 does not exist",
        ),
        (
            "[[process]]\nnode = 1\naction = \"pause\"\nat = \"100ms\"\nduration = \"5000000000s\"\n",
            "field `duration`: time `5000000000s` is too long: at most 604800s (7 days)",
        ),
        (
            "[[process]]\nnode = 1\naction = \"explode\"\nat = \"100ms\"\n",
            "line 3, column 10: process[0]: field `action`",
        ),
        ("seed = 1\n[[rule]\n", "line 2"),
    ];
    for (k, (plan, want)) in cases.iter().enumerate() {
        let out = run(
            &format!("bad-plan-{k}"),
            &["--nodes", "3"],
            Some(plan),
            LIMIT,
        );
        assert_eq!(out.code, 2, "{}", out.dump());
        assert!(out.stderr.contains(want), "want {want:?}\n{}", out.dump());
        assert!(out.report.is_none(), "nothing ran, so no report");
        assert!(
            !out.run_dir.exists(),
            "nothing started, not even the run dir"
        );
    }
}

/// Times too long to honour are refused with a message, never cut short into a PASS.
#[test]
fn times_that_would_overflow_are_refused() {
    for (flag, value) in [
        ("--duration", "5000000000s"),
        ("--slack", "18446744073709551615ms"),
        ("--timeout", "604801s"),
    ] {
        let out = run("too-long", &[flag, value], None, LIMIT);
        assert_eq!(out.code, 2, "{flag} {value}\n{}", out.dump());
        assert!(
            out.stderr.contains(&format!("time `{value}` is too long")),
            "{flag} {value}\n{}",
            out.dump()
        );
        assert!(out.report.is_none(), "{}", out.dump());
    }
}

#[test]
fn bad_flags_exit_2() {
    for args in [
        &["--workload", "unknown"][..],
        &["--nodes", "1"],
        &["--ops", "5", "--duration", "1s"],
        &["--duration", "soon"],
    ] {
        let out = run("bad-flags", args, None, LIMIT);
        assert_eq!(out.code, 2, "{args:?}\n{}", out.dump());
    }
    let dir = test_dir("missing-plan");
    let out = run(
        "missing-plan",
        &["--faults", dir.join("nope.toml").to_str().unwrap()],
        None,
        LIMIT,
    );
    assert_eq!(out.code, 2, "{}", out.dump());
    assert!(out.stderr.contains("nope.toml"), "{}", out.dump());
}

#[test]
fn a_corrupted_target_byte_is_caught() {
    let out = run(
        "self-test-corrupt",
        &[
            "--nodes",
            "3",
            "--workload",
            "stream-write",
            "--ops",
            "100",
            "--seed",
            "4",
            "--self-test-corrupt",
            "--timeout",
            "30s",
        ],
        None,
        LIMIT,
    );
    assert_eq!(out.code, 1, "{}", out.dump());
    let report = out.report();
    assert_eq!(report["passed"], false);
    let write = out.invariant("write-data");
    assert_eq!(num(&write["violation_count"]), 1, "{write}");
    assert!(
        write["violations"][0]
            .as_str()
            .unwrap()
            .contains("differ at the target"),
        "{write}"
    );
    assert!(out.stdout.contains("result: FAIL"), "{}", out.dump());
    assert!(
        out.stdout
            .contains("replay: softverbs run --nodes 3 --workload stream-write --seed 4"),
        "{}",
        out.dump()
    );
}

#[test]
fn a_run_that_overstays_its_timeout_is_stopped_and_reported() {
    let out = run(
        "hard-timeout",
        &[
            "--nodes",
            "3",
            "--workload",
            "stream-write",
            "--ops",
            "1000000",
            "--seed",
            "6",
            "--timeout",
            "300ms",
        ],
        None,
        LIMIT,
    );
    // The helper has already checked that no process of the run is left.
    assert_eq!(out.code, 1, "{}", out.dump());
    let report = out.report();
    let errors = report["harness_errors"].as_array().unwrap();
    assert!(
        errors
            .iter()
            .any(|e| e.as_str().unwrap().contains("hard timeout")),
        "{}",
        out.dump()
    );
    for node in report["node_reports"].as_array().unwrap() {
        assert_eq!(node["state"], "timed-out", "{node}");
    }
    assert!(num(&out.invariant("liveness")["violation_count"]) >= 3);
    // What the nodes did before they were stopped still checks out.
    assert_eq!(num(&out.invariant("write-data")["violation_count"]), 0);
    assert!(num(&out.invariant("write-data")["checked"]) > 0);
}

/// `--self-test KIND` plants one failure of each kind the verifier must catch; each run must
/// fail with the invariant that names it, and nothing else may break.
#[test]
fn every_planted_failure_kind_fails_the_run() {
    let cases = [
        ("lost-receive", &["send-delivery"][..]),
        ("duplicated-atomic", &["atomic-exactly-once"][..]),
        ("misplaced-write", &["write-data", "untouched-memory"][..]),
        ("ack-without-delivery", &["write-data"][..]),
        ("accepted-psn-gap", &["send-data"][..]),
    ];
    for (kind, caught_by) in cases {
        let out = run(
            &format!("self-test-{kind}"),
            &[
                "--nodes",
                "2",
                "--workload",
                "mixed",
                "--ops",
                "200",
                "--seed",
                "5",
                "--self-test",
                kind,
                "--timeout",
                "30s",
            ],
            None,
            LIMIT,
        );
        assert_eq!(out.code, 1, "{kind}: {}", out.dump());
        let report = out.report();
        assert_eq!(report["passed"], false, "{kind}");
        assert!(
            report["harness_errors"].as_array().unwrap().is_empty(),
            "{kind}: {report}"
        );
        let failed: Vec<&str> = report["invariants"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| num(&i["violation_count"]) > 0)
            .map(|i| i["name"].as_str().unwrap())
            .collect();
        assert_eq!(failed, caught_by, "{kind}: {report}");
        assert!(
            out.stdout.contains(&format!("--self-test {kind}")),
            "{kind}: the replay names the self-test\n{}",
            out.dump()
        );
    }
}
