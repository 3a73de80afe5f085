//! Process faults in `softverbs run`: kill -9 mid-run, and a pause inside the retry budget.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{num, run};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn kill_dash_nine_is_detected_within_the_bound_and_no_acknowledged_data_is_lost() {
    let plan = "[[process]]\nnode = 2\naction = \"kill\"\nat = \"300ms\"\n";
    let out = run(
        "kill",
        &[
            "--nodes",
            "3",
            "--workload",
            "stream-write",
            "--duration",
            "1500ms",
            "--seed",
            "21",
            "--timeout",
            "30s",
        ],
        Some(plan),
        LIMIT,
    );
    assert_eq!(out.code, 0, "{}", out.dump());
    let report = out.report();
    assert_eq!(report["passed"], true, "{}", out.dump());
    let fault = &report["process_faults"][0];
    assert_eq!(fault["status"], "applied", "{fault}");
    let nodes = report["node_reports"].as_array().unwrap();
    assert_eq!(nodes[2]["state"], "killed");
    let bound = num(&report["qp"]["detect_bound_ms"]);
    assert!(bound > 0);
    for partner in [0, 1] {
        assert_eq!(nodes[partner]["state"], "finished");
        let completions = nodes[partner]["completions"].as_object().unwrap();
        assert!(
            num(&completions["IBV_WC_RETRY_EXC_ERR"]) >= 1,
            "node {partner}: {completions:?}"
        );
        let detection = report["detections"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| num(&d["partner"]) == partner as u64 && num(&d["dead"]) == 2)
            .unwrap_or_else(|| panic!("no detection by node {partner}\n{}", out.dump()));
        assert!(num(&detection["latency_ms"]) <= bound, "{detection}");
    }
    let detect = out.invariant("dead-peer-detection");
    assert_eq!(num(&detect["checked"]), 2, "{detect}");
    assert_eq!(num(&detect["violation_count"]), 0);
    // Everything any sender saw succeed -- including what node 2 wrote before it died and
    // what the others wrote into node 2's file -- was found at its target.
    let write = out.invariant("write-data");
    assert!(num(&write["checked"]) > 100, "{write}");
    assert_eq!(num(&write["violation_count"]), 0);
    assert!(
        num(&nodes[2]["ops_ok"]) > 0,
        "node 2 did work before the kill"
    );
}

#[test]
fn a_pause_shorter_than_the_retry_budget_passes_cleanly() {
    let plan = "[[process]]\nnode = 1\naction = \"pause\"\nat = \"200ms\"\nduration = \"150ms\"\n";
    let out = run(
        "pause",
        &[
            "--nodes",
            "3",
            "--workload",
            "mixed",
            "--duration",
            "1s",
            "--seed",
            "22",
            "--timeout",
            "30s",
        ],
        Some(plan),
        LIMIT,
    );
    assert_eq!(out.code, 0, "{}", out.dump());
    let report = out.report();
    assert_eq!(report["passed"], true);
    assert_eq!(report["process_faults"][0]["status"], "applied");
    for node in report["node_reports"].as_array().unwrap() {
        assert_eq!(node["state"], "finished");
        let completions = node["completions"].as_object().unwrap();
        assert_eq!(completions.len(), 1, "only successes: {completions:?}");
    }
}

#[test]
fn a_killed_node_restarts_with_a_fresh_device_and_the_run_goes_on() {
    let plan = r#"
[[process]]
node = 2
action = "kill"
after_ops = 50

[[process]]
node = 2
action = "restart"
at = "1s"
"#;
    let out = run(
        "restart",
        &[
            "--nodes",
            "3",
            "--workload",
            "mixed",
            "--duration",
            "2s",
            "--seed",
            "23",
            "--timeout",
            "30s",
        ],
        Some(plan),
        LIMIT,
    );
    assert_eq!(out.code, 0, "{}", out.dump());
    let report = out.report();
    for fault in report["process_faults"].as_array().unwrap() {
        assert_eq!(fault["status"], "applied", "{fault}");
    }
    let node2 = &report["node_reports"][2];
    assert_eq!(node2["state"], "killed");
    assert_eq!(num(&node2["processes"]), 2, "{node2}");
    // The restarted process mapped a new generation of node 2's files.
    assert!(out.run_dir.join("node2.g1.mr").is_file());
    assert_eq!(num(&out.invariant("dead-peer-detection")["checked"]), 2);
}
