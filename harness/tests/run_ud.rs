//! `softverbs run --workload ud-send` end to end: UD QPs between real node processes over UDP
//! loopback, checked from the evidence (`datagram-data`, `datagram-delivery` and the common
//! invariants). Each run is bounded (a few seconds; killed after 60 s).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{num, run};

const LIMIT: Duration = Duration::from_secs(60);

/// Datagrams the nodes sent successfully (their operations) and receives they logged.
fn sent_and_received(out: &common::Outcome) -> (u64, u64) {
    let sent = out.report()["node_reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| num(&n["ops_ok"]))
        .sum();
    (sent, num(&out.invariant("datagram-data")["checked"]))
}

#[test]
fn clean_ud_send_delivers_every_datagram_exactly_once() {
    let out = run(
        "ud-send-clean",
        &[
            "--nodes",
            "3",
            "--workload",
            "ud-send",
            "--ops",
            "200",
            "--seed",
            "11",
            "--timeout",
            "30s",
        ],
        None,
        LIMIT,
    );
    out.assert_passed();
    for node in out.report()["node_reports"].as_array().unwrap() {
        assert_eq!(node["state"], "finished", "{}", out.dump());
        assert_eq!(num(&node["ops_ok"]), 200, "{node}");
    }
    // 600 datagrams sent, all of them received, no loss or duplicate noted.
    assert_eq!(sent_and_received(&out), (600, 600), "{}", out.dump());
    let delivery = out.invariant("datagram-delivery");
    assert_eq!(delivery["notes"].as_array().unwrap().len(), 0, "{delivery}");
    assert_eq!(
        num(&out.invariant("untouched-memory")["violation_count"]),
        0
    );
}

#[test]
fn ud_send_loses_and_duplicates_only_what_the_plan_did() {
    let plan = "seed = 4\n\
        [[rule]]\naction = \"drop\"\nprobability = 0.05\n\
        [[rule]]\naction = \"duplicate\"\ncopies = 1\nprobability = 0.05\n\
        [[rule]]\naction = \"corrupt\"\nprobability = 0.02\n\
        [[rule]]\naction = \"delay\"\nmin = \"0ms\"\nmax = \"5ms\"\nprobability = 0.1\n";
    let out = run(
        "ud-send-faults",
        &[
            "--nodes",
            "3",
            "--workload",
            "ud-send",
            "--ops",
            "300",
            "--seed",
            "12",
            "--timeout",
            "30s",
        ],
        Some(plan),
        LIMIT,
    );
    out.assert_passed();
    let (sent, received) = sent_and_received(&out);
    assert_eq!(sent, 900, "{}", out.dump());
    // Some were lost and some duplicated: the notes say so, within the injectors' counts.
    let notes = out.invariant("datagram-delivery")["notes"].to_string();
    assert!(notes.contains("lost, explained by its injector"), "{notes}");
    assert!(notes.contains("duplicate datagrams, injected"), "{notes}");
    assert!(received > 0 && received != sent, "{received} of {sent}");
}

#[test]
fn a_flipped_datagram_byte_fails_the_run() {
    let out = run(
        "ud-send-corrupt-evidence",
        &[
            "--nodes",
            "2",
            "--workload",
            "ud-send",
            "--ops",
            "50",
            "--seed",
            "13",
            "--self-test-corrupt",
        ],
        None,
        LIMIT,
    );
    assert_eq!(out.code, 1, "{}", out.dump());
    assert_eq!(
        num(&out.invariant("datagram-data")["violation_count"]),
        1,
        "{}",
        out.dump()
    );
}

#[test]
fn a_killed_node_leaves_the_other_links_checked() {
    let plan = "[[rule]]\naction = \"drop\"\nprobability = 0.02\n\
        [[process]]\nnode = 2\naction = \"kill\"\nat = \"30ms\"\n";
    let out = run(
        "ud-send-kill",
        &[
            "--nodes",
            "3",
            "--workload",
            "ud-send",
            "--duration",
            "1s",
            "--seed",
            "14",
            "--timeout",
            "30s",
        ],
        Some(plan),
        LIMIT,
    );
    out.assert_passed();
    let nodes = out.report()["node_reports"].as_array().unwrap();
    assert_eq!(nodes[2]["state"], "killed", "{}", out.dump());
    // Nodes 0 and 1 exchanged datagrams throughout: far more than node 2 sent before its kill.
    let received = num(&out.invariant("datagram-data")["checked"]);
    assert!(received > 1000, "{}", out.dump());
    let dead = out.invariant("dead-peer-detection")["notes"].to_string();
    assert!(dead.contains("UD links"), "{dead}");
}
