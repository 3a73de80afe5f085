//! A failing `softverbs run` keeps its nodes' traces and the ladder of the violating QPs
//! (issue 22 item 4), tested with a planted failure (`--self-test lost-receive`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::run;

const LIMIT: Duration = Duration::from_secs(90);

#[test]
fn a_failing_run_keeps_the_traces_and_the_ladder_of_the_violating_qps() {
    let out = run(
        "trace-self-test",
        &[
            "--nodes",
            "2",
            "--workload",
            "mixed",
            "--ops",
            "100",
            "--seed",
            "5",
            "--self-test",
            "lost-receive",
            "--timeout",
            "30s",
        ],
        None,
        LIMIT,
    );
    assert_eq!(out.code, 1, "{}", out.dump());
    let trace = &out.report()["trace"];
    let files: Vec<&str> = trace["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(files, ["node0.g0.trace.jsonl", "node1.g0.trace.jsonl"]);
    let ladder = trace["ladder"]
        .as_str()
        .unwrap_or_else(|| panic!("{trace}"));
    assert!(ladder.ends_with("violation-ladder.svg"), "{ladder}");
    assert!(
        out.stdout.contains(&format!("ladder: {ladder}")),
        "{}",
        out.dump()
    );
    let note = trace["note"].as_str().unwrap();
    assert!(note.starts_with("nodes 1 and 0: "), "{note}");
    let svg = std::fs::read_to_string(ladder).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let class = |n: &roxmltree::Node<'_, '_>| n.attribute("class").unwrap_or_default().to_owned();
    let lanes = doc
        .descendants()
        .filter(|n| class(n) == "lane-head")
        .count();
    let packets = doc
        .descendants()
        .filter(|n| class(n).starts_with("packet "))
        .count();
    assert_eq!(lanes, 2, "one QP on each of the two nodes");
    assert!(packets > 0);
    for f in files
        .iter()
        .map(|f| out.run_dir.join(f))
        .chain([ladder.into()])
    {
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", f.display());
    }
}
