//! `softverbs run --qps-per-peer N`: N RC QPs between each pair of nodes, operations spread
//! over them, each QP verified on its own — exactly once, in order, intact — and a failure
//! planted on one of them is caught.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{num, run};

const LIMIT: Duration = Duration::from_secs(120);

const LOSS: &str = "seed = 3\n[[rule]]\naction = \"drop\"\nprobability = 0.05\n";

/// The QP indices of the send completions in node `i`'s log (0 when the field is left out).
fn qps_used(out: &common::Outcome, i: u32) -> BTreeSet<u64> {
    let log = std::fs::read_to_string(out.run_dir.join(format!("node{i}.g0.log"))).unwrap();
    log.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["ev"] == "send")
        .map(|v| v["qp"].as_u64().unwrap_or(0))
        .collect()
}

#[test]
fn eight_qps_per_peer_under_five_percent_loss_pass_every_invariant() {
    for workload in ["mixed", "pingpong"] {
        let args = [
            "--nodes",
            "2",
            "--workload",
            workload,
            "--qps-per-peer",
            "8",
            "--ops",
            "200",
            "--seed",
            "5",
        ];
        let out = run(&format!("qps8-{workload}"), &args, Some(LOSS), LIMIT);
        assert_eq!(out.code, 0, "{}", out.dump());
        let report = out.report();
        assert_eq!(report["passed"], true, "{}", out.dump());
        assert_eq!(num(&report["qps_per_peer"]), 8);
        assert!(out.stdout.contains("8 QPs per peer"), "{}", out.dump());
        assert!(
            report["replay"]
                .as_str()
                .unwrap()
                .contains("--qps-per-peer 8")
        );
        let mut retransmits = 0;
        for (i, node) in report["node_reports"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            assert_eq!(num(&node["ops_ok"]), 200, "{node}");
            retransmits +=
                num(&node["stats"]["retransmits_timeout"]) + num(&node["stats"]["retransmits_nak"]);
            // Every QP carried operations; one fin WRITE per QP.
            assert_eq!(qps_used(&out, i as u32), (0..8).collect(), "node {i}");
        }
        assert!(retransmits > 0, "5 % loss must cost retransmissions");
        // 8 fin words per node: each QP's own.
        assert!(num(&out.invariant("write-data")["checked"]) >= 16);
        assert!(num(&out.invariant("completion-order")["checked"]) > 400);
    }
}

#[test]
fn a_failure_planted_on_one_of_many_qps_is_caught() {
    for (kind, invariant) in [
        ("lost-receive", "send-delivery"),
        ("misplaced-write", "write-data"),
        ("accepted-psn-gap", "send-data"),
    ] {
        let args = [
            "--nodes",
            "2",
            "--workload",
            "mixed",
            "--qps-per-peer",
            "4",
            "--ops",
            "120",
            "--seed",
            "9",
            "--self-test",
            kind,
        ];
        let out = run(&format!("qps4-{kind}"), &args, None, LIMIT);
        assert_eq!(out.code, 1, "{kind}: {}", out.dump());
        let inv = out.invariant(invariant);
        assert!(num(&inv["violation_count"]) >= 1, "{kind}: {inv}");
    }
}

#[test]
fn qps_per_peer_the_run_cannot_hold_are_refused() {
    for (args, says) in [
        (&["--workload", "ud-send", "--qps-per-peer", "2"][..], "UD"),
        (
            &["--nodes", "3", "--qps-per-peer", "1100"],
            "holds at most 2048",
        ),
        (&["--qps-per-peer", "0"], "qps-per-peer"),
        (&["--qps-per-peer", "2049"], "qps-per-peer"),
    ] {
        let out = run("qps-bad", args, None, LIMIT);
        assert_eq!(out.code, 2, "{args:?}: {}", out.dump());
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
        assert!(!out.run_dir.exists(), "{args:?}: nothing may be started");
    }
}

/// More QPs than the old fin area held (504 per node), in several groups of QPs that share
/// CQs: every QP carries operations and is verified, and a failure planted on one of them is
/// still caught.
#[test]
fn six_hundred_qps_per_peer_pass_and_a_planted_failure_is_caught() {
    let args = [
        "--nodes",
        "2",
        "--workload",
        "mixed",
        "--qps-per-peer",
        "600",
        "--ops",
        "1200",
        "--qp-timeout",
        "18",
        "--seed",
        "5",
    ];
    let out = run("qps600", &args, Some(LOSS), LIMIT);
    assert_eq!(out.code, 0, "{}", out.dump());
    for i in 0..2 {
        assert_eq!(qps_used(&out, i), (0..600).collect(), "node {i}");
    }
    // 600 fin words per node, each QP's own.
    assert!(num(&out.invariant("write-data")["checked"]) >= 1200);
    assert!(num(&out.invariant("completion-order")["checked"]) >= 2400);
    let mut planted: Vec<&str> = args.to_vec();
    planted.extend(["--self-test", "misplaced-write"]);
    let out = run("qps600-planted", &planted, Some(LOSS), LIMIT);
    assert_eq!(out.code, 1, "{}", out.dump());
    assert!(num(&out.invariant("write-data")["violation_count"]) >= 1);
}
