//! `softverbs run --cm rdma`: node pairs connect their RC QPs through the IB CM over the
//! devices' GSIs (REQ from the higher node, REP, RTU), then run and verify as usual.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::run;

const LIMIT: Duration = Duration::from_secs(60);

fn cm_run(name: &str, nodes: &str, plan: Option<&str>) -> common::Outcome {
    let args = [
        "--cm",
        "rdma",
        "--nodes",
        nodes,
        "--workload",
        "mixed",
        "--ops",
        "200",
        "--seed",
        "3",
        "--timeout",
        "30s",
    ];
    run(name, &args, plan, LIMIT)
}

#[test]
fn two_nodes_connect_through_the_cm_and_pass() {
    let out = cm_run("cm-two", "2", None);
    out.assert_passed();
    let replay = out.report()["replay"].as_str().unwrap();
    assert!(replay.contains(" --cm rdma"), "{replay}");
}

#[test]
fn three_nodes_connect_through_the_cm_and_pass() {
    cm_run("cm-three", "3", None).assert_passed();
}

#[test]
/// 10 % loss on every packet, the CM MADs included (their retries), and on the workload.
fn cm_run_with_loss_passes() {
    let plan = "seed = 11\n[[rule]]\naction = \"drop\"\nprobability = 0.1\n";
    let out = cm_run("cm-loss", "3", Some(plan));
    out.assert_passed();
}

#[test]
fn cm_rdma_refuses_ud_and_many_qps() {
    for extra in [["--workload", "ud-send"], ["--qps-per-peer", "2"]] {
        let mut args = vec!["--cm", "rdma", "--nodes", "2"];
        args.extend(extra);
        let out = run("cm-refused", &args, None, LIMIT);
        assert_ne!(out.code, 0, "{}", out.dump());
        assert!(out.stderr.contains("--cm rdma"), "{}", out.dump());
    }
}

/// `softverbs campaign --cm rdma`: every run connects through the CM, the replays say so, and
/// the campaign identity differs from the same campaign without the CM.
#[test]
fn campaign_carries_cm_rdma() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("run-cm-campaign");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let report = |cm: bool| {
        let path = dir.join(format!("report-{cm}.json"));
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_softverbs"));
        cmd.args(["campaign", "--runs", "2", "--nodes", "2", "--ops", "100"])
            .args(["--seed", "1", "--workload", "mixed", "--report"])
            .arg(&path)
            .arg("--run-dir")
            .arg(dir.join(format!("runs-{cm}")));
        if cm {
            cmd.args(["--cm", "rdma"]);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = std::fs::read_to_string(&path).unwrap();
        serde_json::from_str::<serde_json::Value>(&text).unwrap()
    };
    let with = report(true);
    let without = report(false);
    assert_eq!(with["cm"], true);
    assert!(without.get("cm").is_none());
    assert_ne!(with["campaign_id"], without["campaign_id"]);
    for row in with["rows"].as_array().unwrap() {
        assert!(
            row["replay"].as_str().unwrap().contains(" --cm rdma"),
            "{row}"
        );
    }
}
