//! `softverbs demo`: the 3-node mixed workload under 5 % loss with node 1 paused passes with a
//! verified summary; `--pair` still connects two devices and prints their attributes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{num, softverbs, test_dir};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn the_demo_passes_with_a_verified_summary() {
    let dir = test_dir("demo");
    let (run_dir, report) = (dir.join("run"), dir.join("report.json"));
    let (r, j) = (run_dir.display().to_string(), report.display().to_string());
    let args = ["demo", "--duration", "1s", "--run-dir", &r, "--report", &j];
    let (code, stdout, stderr) = softverbs(&args, LIMIT);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    for want in [
        "softverbs demo: 3 node processes",
        "result: PASS",
        "demo: node 1 was stopped at",
        "demo: 12 of 12 invariants held",
        "demo: PASS",
    ] {
        assert!(stdout.contains(want), "no {want:?} in\n{stdout}");
    }
    let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["passed"], true);
    assert_eq!(report["workload"], "mixed");
    assert_eq!(num(&report["nodes"]), 3);
    assert_eq!(report["process_faults"][0]["status"], "applied");
    assert_eq!(report["plan"]["file"], "harness/plans/demo.toml");
    let dropped: u64 = report["node_reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| num(&n["injected"]["dropped"]))
        .sum();
    assert!(dropped > 0, "the 5 % loss was injected");
    // With --run-dir the evidence is kept.
    assert!(run_dir.join("node1.g0.mr").exists());
}

#[test]
fn demo_pair_connects_two_devices_and_prints_their_attributes() {
    let (code, stdout, stderr) = softverbs(&["demo", "--pair"], LIMIT);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(stdout.matches("state=RTS").count(), 2, "{stdout}");
    assert!(stdout.contains("received: \"hello, RDMA\""), "{stdout}");
}

#[test]
fn bad_demo_flags_exit_2() {
    for args in [
        &["demo", "--duration", "500ms"][..],
        &["demo", "--pair", "--seed", "3"],
    ] {
        let (code, stdout, stderr) = softverbs(args, LIMIT);
        assert_eq!(code, 2, "{args:?}\n{stdout}\n{stderr}");
    }
}
