//! `softverbs run` end to end: real node processes over UDP loopback, checked from the
//! evidence the report summarises. Each run is bounded (a few seconds; killed after 60 s).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{num, run};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn clean_three_node_stream_write_passes_every_invariant() {
    let out = run(
        "clean-stream-write",
        &[
            "--nodes",
            "3",
            "--workload",
            "stream-write",
            "--ops",
            "400",
            "--seed",
            "1",
            "--timeout",
            "30s",
        ],
        None,
        LIMIT,
    );
    out.assert_passed();
    let report = out.report();
    for node in report["node_reports"].as_array().unwrap() {
        assert_eq!(node["state"], "finished", "{}", out.dump());
        assert_eq!(num(&node["ops_ok"]), 400, "{node}");
        let completions = node["completions"].as_object().unwrap();
        assert_eq!(completions.len(), 1, "only successes: {completions:?}");
        // 400 WRITEs and one fin WRITE per peer.
        assert_eq!(num(&completions["IBV_WC_SUCCESS"]), 402);
    }
    // Every successful WRITE (1200 records + 6 fin words) was found at its target.
    let write = out.invariant("write-data");
    assert_eq!(num(&write["checked"]), 1206, "{write}");
    assert_eq!(num(&out.invariant("completion-order")["checked"]), 1206);
    // The MR files and logs are there as evidence.
    for i in 0..3 {
        assert!(out.run_dir.join(format!("node{i}.g0.mr")).is_file());
        assert!(out.run_dir.join(format!("node{i}.g0.log")).is_file());
    }
}

#[test]
fn ten_percent_loss_and_duplication_still_pass() {
    let plan = r#"
[[rule]]
action = "drop"
probability = 0.1

[[rule]]
action = "duplicate"
copies = 1
probability = 0.1
"#;
    let out = run(
        "loss-dup",
        &[
            "--nodes",
            "3",
            "--workload",
            "stream-write",
            "--ops",
            "300",
            "--seed",
            "7",
            "--timeout",
            "30s",
        ],
        Some(plan),
        LIMIT,
    );
    out.assert_passed();
    let report = out.report();
    assert_eq!(num(&report["plan"]["rules"]), 2);
    let (mut dropped, mut duplicated, mut retransmits) = (0, 0, 0);
    for node in report["node_reports"].as_array().unwrap() {
        assert_eq!(num(&node["ops_ok"]), 300, "{node}");
        dropped += num(&node["injected"]["dropped"]);
        duplicated += num(&node["injected"]["duplicated"]);
        retransmits +=
            num(&node["stats"]["retransmits_timeout"]) + num(&node["stats"]["retransmits_nak"]);
    }
    assert!(dropped > 50 && duplicated > 50, "{}", out.dump());
    assert!(retransmits > 0, "{}", out.dump());
    assert_eq!(num(&out.invariant("write-data")["checked"]), 906);
}

#[test]
fn atomic_counter_counts_every_fetch_add_exactly_once() {
    let plan = "[[rule]]\naction = \"drop\"\nprobability = 0.05\n";
    let out = run(
        "atomic-counter",
        &[
            "--nodes",
            "3",
            "--workload",
            "atomic-counter",
            "--ops",
            "300",
            "--seed",
            "3",
            "--timeout",
            "30s",
        ],
        Some(plan),
        LIMIT,
    );
    out.assert_passed();
    let report = out.report();
    let successes: u64 = report["node_reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| num(&n["ops_ok"]))
        .sum();
    assert_eq!(successes, 900);
    assert_eq!(num(&report["counters"]["0"]), 900, "{}", out.dump());
    let atomic = out.invariant("atomic-exactly-once");
    assert_eq!(num(&atomic["checked"]), 900, "{atomic}");
}

#[test]
fn pingpong_and_mixed_pass_under_light_loss() {
    let plan = "[[rule]]\naction = \"drop\"\nprobability = 0.03\n";
    for workload in ["pingpong", "mixed", "read-verify"] {
        let out = run(
            workload,
            &[
                "--nodes",
                "3",
                "--workload",
                workload,
                "--ops",
                "150",
                "--seed",
                "5",
                "--timeout",
                "30s",
            ],
            Some(plan),
            LIMIT,
        );
        out.assert_passed();
    }
}

/// `--pcap-dir`: every node process writes its traffic to its own pcap file, and the report
/// says where they are.
#[test]
fn pcap_dir_holds_one_capture_per_node() {
    let pcaps = std::env::temp_dir().join(format!("softverbs-run-pcap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&pcaps);
    let dir = pcaps.display().to_string();
    let out = run(
        "pcap-dir",
        &[
            "--nodes",
            "2",
            "--workload",
            "pingpong",
            "--ops",
            "50",
            "--seed",
            "3",
            "--pcap-dir",
            &dir,
        ],
        None,
        LIMIT,
    );
    out.assert_passed();
    for i in 0..2 {
        let file = pcaps.join(format!("node{i}.g0.pcap"));
        let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        // The 24-byte pcap header plus at least the 50 SENDs and their ACKs, each a record of
        // 16 + 14 + 20 + 8 + at least 16 bytes.
        assert!(
            bytes.len() > 24 + 100 * 74,
            "{}: {} bytes",
            file.display(),
            bytes.len()
        );
        let magic = u32::from_le_bytes(bytes[..4].try_into().unwrap());
        assert!(
            magic == 0xA1B2_C3D4 || magic == 0xA1B2_3C4D,
            "pcap magic {magic:#x}"
        );
    }
    let pcap = out.report()["pcap"].as_str().unwrap().to_owned();
    assert!(pcap.contains(&dir), "{pcap}");
    std::fs::remove_dir_all(&pcaps).unwrap();
}
