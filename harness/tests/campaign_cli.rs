//! `softverbs campaign`: plans are a function of the seed, a small campaign passes and reports
//! every run, a violation fails the campaign (exit 1) with only the failing run's evidence kept
//! and a replay command that works, and bad flags are refused before anything starts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{num, softverbs, test_dir};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(120);

/// Runs `softverbs campaign ARGS --run-dir DIR/runs --report DIR/report.json`.
fn campaign(name: &str, args: &[&str]) -> (i32, String, String, Option<Value>, std::path::PathBuf) {
    let dir = test_dir(name);
    let runs = dir.join("runs");
    let report = dir.join("report.json");
    let mut full = vec!["campaign"];
    full.extend_from_slice(args);
    let (runs_s, report_s) = (runs.display().to_string(), report.display().to_string());
    full.extend(["--run-dir", &runs_s, "--report", &report_s]);
    let (code, stdout, stderr) = softverbs(&full, LIMIT);
    let report = std::fs::read(&report)
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap());
    (code, stdout, stderr, report, runs)
}

/// What identifies a run's draw: seed, workload and plan.
fn draws(report: &Value) -> Vec<(u64, String, Value)> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                num(&r["seed"]),
                r["workload"].as_str().unwrap().to_owned(),
                r["plan"].clone(),
            )
        })
        .collect()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn the_same_seed_draws_the_same_plans_and_another_seed_other_ones() {
    let args = ["--runs", "12", "--seed", "5", "--dry-run"];
    let (code, stdout, stderr, a, dir) = campaign("dry-a", &args);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let a = a.unwrap();
    assert_eq!(a["dry_run"], true);
    assert_eq!(num(&a["totals"]["not_run"]), 12);
    let plans = entries(&dir.join("plans"));
    assert_eq!(plans.len(), 12, "{plans:?}");
    assert_eq!(plans[0], "run-000.toml");
    assert_eq!(entries(&dir), ["plans"], "a dry run runs nothing");
    let (_, _, _, b, _) = campaign("dry-b", &args);
    let b = b.unwrap();
    assert_eq!(draws(&a), draws(&b));
    let (_, _, _, c, _) = campaign("dry-c", &["--runs", "12", "--seed", "6", "--dry-run"]);
    let c = c.unwrap();
    let (da, dc) = (draws(&a), draws(&c));
    assert!(
        da.iter().zip(&dc).all(|(x, y)| x.0 != y.0 && x.2 != y.2),
        "seed 6 must draw other seeds and plans"
    );
    // `cycle` gives every workload in turn.
    let workloads: Vec<&str> = da.iter().map(|d| d.1.as_str()).take(5).collect();
    assert_eq!(
        workloads,
        [
            "pingpong",
            "stream-write",
            "read-verify",
            "atomic-counter",
            "mixed"
        ]
    );
    // Every kind of fault shows up in a dozen plans.
    for fault in ["loss", "dup", "jitter", "storm", "cut", "pause"] {
        assert!(stdout.contains(fault), "no {fault} in\n{stdout}");
    }
    // The plan files are `softverbs run` plans with the replay command in their header.
    let text = std::fs::read_to_string(dir.join("plans/run-003.toml")).unwrap();
    let seed = da[3].0;
    assert!(text.contains(&format!("--seed {seed} --faults")), "{text}");
    assert!(text.contains(&format!("seed = {seed}")), "{text}");
}

#[test]
fn a_small_campaign_passes_and_reports_every_run() {
    let args = ["--runs", "3", "--seed", "11", "--duration", "1s"];
    let (code, stdout, stderr, report, dir) = campaign("small", &args);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let r = report.unwrap();
    assert_eq!(r["passed"], true);
    assert_eq!(num(&r["seed"]), 11);
    let rows = r["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let mut ops = 0;
    for (k, row) in rows.iter().enumerate() {
        assert_eq!(row["verdict"], "pass", "{row}");
        assert_eq!(num(&row["index"]), k as u64);
        assert!(num(&row["ops_ok"]) > 0, "{row}");
        assert_eq!(num(&row["violations"]), 0);
        assert!(row["evidence"].is_null(), "a passing run keeps no evidence");
        assert!(
            row["replay"]
                .as_str()
                .unwrap()
                .contains(&format!("--seed {} --faults", num(&row["seed"]))),
            "{row}"
        );
        ops += num(&row["ops_ok"]);
    }
    let t = &r["totals"];
    assert_eq!((num(&t["runs"]), num(&t["passed"])), (3, 3));
    assert_eq!(num(&t["ops_ok"]), ops);
    // Only the plans are left.
    assert_eq!(entries(&dir), ["plans"]);
    assert!(stdout.contains("ops ok"), "{stdout}");
    assert!(stdout.contains("totals: 3 runs: 3 passed"), "{stdout}");
    assert!(
        stdout.contains("result: PASS (campaign seed 11)"),
        "{stdout}"
    );
    // A dry run with the same flags drew the same plans.
    let mut dry = args.to_vec();
    dry.push("--dry-run");
    let (_, _, _, d, _) = campaign("small-dry", &dry);
    assert_eq!(draws(&d.unwrap()), draws(&r));
}

#[test]
fn a_violation_fails_the_campaign_keeps_its_evidence_and_replays() {
    let args = [
        "--runs",
        "2",
        "--seed",
        "21",
        "--workload",
        "stream-write",
        "--ops",
        "200",
        "--self-test-corrupt",
        "1",
    ];
    let (code, stdout, stderr, report, dir) = campaign("violation", &args);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let r = report.unwrap();
    assert_eq!(r["passed"], false);
    assert_eq!(num(&r["exit_code"]), 1);
    let rows = r["rows"].as_array().unwrap();
    assert_eq!(rows[0]["verdict"], "pass", "{}", rows[0]);
    assert_eq!(rows[1]["verdict"], "FAIL", "{}", rows[1]);
    assert!(num(&rows[1]["violations"]) >= 1);
    assert!(
        rows[1]["failed_invariants"][0]
            .as_str()
            .unwrap()
            .starts_with("write-data"),
        "{}",
        rows[1]
    );
    assert_eq!(num(&r["totals"]["failed"]), 1);
    // The failing run's evidence, and only its.
    assert_eq!(entries(&dir), ["plans", "run-001"]);
    let evidence = entries(&dir.join("run-001"));
    assert!(evidence.contains(&"report.json".to_owned()), "{evidence:?}");
    assert!(evidence.contains(&"node0.g0.mr".to_owned()), "{evidence:?}");
    // With the nodes' traces and the ladder of the violating QPs, named in the row.
    assert!(
        evidence.contains(&"node0.g0.trace.jsonl".to_owned()),
        "{evidence:?}"
    );
    assert!(
        evidence.contains(&"violation-ladder.svg".to_owned()),
        "{evidence:?}"
    );
    let ladder = rows[1]["ladder"].as_str().unwrap();
    assert!(ladder.ends_with("run-001/violation-ladder.svg"), "{ladder}");
    assert!(stdout.contains(&format!("ladder: {ladder}")), "{stdout}");
    assert!(stdout.contains("run 1 FAIL"), "{stdout}");
    assert!(
        stdout.contains("result: FAIL (1 of 2 runs violated)"),
        "{stdout}"
    );
    // The printed replay command runs that plan again (without the corruption: it passes).
    let replay = rows[1]["replay"].as_str().unwrap();
    assert!(stdout.contains(replay), "{stdout}");
    assert!(replay.contains("plans/run-001.toml"), "{replay}");
    let mut words: Vec<String> = replay
        .split_whitespace()
        .skip(1)
        .filter(|w| *w != "--self-test-corrupt")
        .map(str::to_owned)
        .collect();
    let again = test_dir("violation-replay").join("run");
    words.extend(["--run-dir".to_owned(), again.display().to_string()]);
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = softverbs(&words, LIMIT);
    assert_eq!(code, 0, "{words:?}\n{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("seed {}", num(&rows[1]["seed"]))),
        "{stdout}"
    );
}

#[test]
fn bad_campaign_flags_exit_2_and_start_nothing() {
    for args in [
        &["--runs", "0"][..],
        &["--workload", "chaos"],
        &["--ops", "5", "--duration", "1s"],
        &["--duration", "soon"],
        &["--jobs", "0"],
        &["--runs", "2", "--self-test-corrupt", "2"],
    ] {
        let (code, stdout, stderr, report, dir) = campaign("bad-flags", args);
        assert_eq!(code, 2, "{args:?}\n{stdout}\n{stderr}");
        assert!(report.is_none());
        assert!(!dir.exists(), "{args:?}: nothing may be created");
    }
    let dir = test_dir("busy-dir");
    std::fs::write(dir.join("something"), "x").unwrap();
    let d = dir.display().to_string();
    let (code, _, stderr) = softverbs(&["campaign", "--runs", "1", "--run-dir", &d], LIMIT);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is not empty"), "{stderr}");
}

/// The row fields that do not depend on timing, with the run directory taken out of the replay.
fn outcome(row: &Value, run_dir: &str) -> Value {
    let mut o = serde_json::Map::new();
    for key in ["index", "seed", "workload", "plan", "plan_hash", "verdict"] {
        o.insert(key.to_owned(), row[key].clone());
    }
    let failed: Vec<String> = row["failed_invariants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().split(' ').next().unwrap().to_owned())
        .collect();
    o.insert("failed".to_owned(), failed.into());
    o.insert("violated".to_owned(), (num(&row["violations"]) > 0).into());
    let replay = row["replay"].as_str().unwrap().replace(run_dir, "DIR");
    o.insert("replay".to_owned(), replay.into());
    Value::Object(o)
}

#[test]
fn shards_merged_equal_the_unsharded_campaign() {
    let base = [
        "--runs",
        "5",
        "--seed",
        "21",
        "--workload",
        "stream-write",
        "--ops",
        "150",
        "--self-test-corrupt",
        "3",
    ];
    let (code, whole_stdout, stderr, whole, whole_dir) = campaign("shard-whole", &base);
    assert_eq!(code, 1, "{whole_stdout}\n{stderr}");
    let whole = whole.unwrap();
    assert!(whole["shard"].is_null());
    let id = whole["campaign_id"].as_str().unwrap().to_owned();
    // Shard K of 2 does the runs i with i mod 2 == K - 1, and writes only their plans.
    let mut reports = Vec::new();
    for (k, runs) in [(1, vec![0, 2, 4]), (2, vec![1, 3])] {
        let mut args = base.to_vec();
        let shard = format!("{k}/2");
        args.extend(["--shard", &shard]);
        let (code, stdout, stderr, r, dir) = campaign(&format!("shard-{k}"), &args);
        let r = r.unwrap();
        assert_eq!(code, if k == 2 { 1 } else { 0 }, "{stdout}\n{stderr}");
        assert_eq!(r["campaign_id"], id.as_str());
        assert_eq!(num(&r["shard"]["index"]), k);
        let done: Vec<u64> = r["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| num(&x["index"]))
            .collect();
        assert_eq!(done, runs);
        let plans: Vec<String> = runs.iter().map(|i| format!("run-{i:03}.toml")).collect();
        assert_eq!(entries(&dir.join("plans")), plans);
        reports.push((dir.parent().unwrap().join("report.json"), r, dir));
    }
    let out = test_dir("shard-merged").join("merged.json");
    let (a, b) = (
        reports[0].0.display().to_string(),
        reports[1].0.display().to_string(),
    );
    let o = out.display().to_string();
    // Order does not matter.
    let (code, stdout, stderr) = softverbs(&["campaign", "merge", &b, &a, "--report", &o], LIMIT);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let merged: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(merged["campaign_id"], id.as_str());
    for key in [
        "seed",
        "runs",
        "nodes",
        "workload",
        "ops",
        "passed",
        "exit_code",
    ] {
        assert_eq!(merged[key], whole[key], "{key}");
    }
    for key in ["runs", "passed", "failed", "harness_errors", "not_run"] {
        assert_eq!(merged["totals"][key], whole["totals"][key], "totals.{key}");
    }
    let whole_dir = whole_dir.display().to_string();
    let rows = |r: &Value, dirs: &[&str]| -> Vec<Value> {
        r["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                let d = dirs
                    .iter()
                    .find(|d| x["replay"].as_str().unwrap().contains(*d))
                    .unwrap();
                outcome(x, d)
            })
            .collect()
    };
    let shard_dirs: Vec<String> = reports.iter().map(|r| r.2.display().to_string()).collect();
    let shard_dirs: Vec<&str> = shard_dirs.iter().map(String::as_str).collect();
    assert_eq!(rows(&merged, &shard_dirs), rows(&whole, &[&whole_dir]));
    assert_eq!(merged["rows"][3]["verdict"], "FAIL");
    assert!(stdout.contains("run 3 FAIL"), "{stdout}");
    assert!(
        stdout.contains("result: FAIL (1 of 5 runs violated)"),
        "{stdout}"
    );
    // The merged table has the unsharded one's header and rows, up to the columns that depend
    // on timing (ops, errors, retransmits).
    let table = |s: &str| -> Vec<String> {
        let header = s.lines().find(|l| l.starts_with(" run ")).unwrap();
        let cut = header.find("  ops ok").unwrap();
        s.lines()
            .skip_while(|l| !l.starts_with(" run "))
            .take(6)
            .map(|l| l.chars().take(cut).collect())
            .collect()
    };
    assert_eq!(table(&stdout), table(&whole_stdout));
}

#[test]
fn merge_refuses_other_campaigns_and_duplicate_or_missing_shards() {
    let dry = |name: &str, seed: &str, shard: &str| -> String {
        let (code, stdout, stderr, _, dir) = campaign(
            name,
            &["--runs", "6", "--seed", seed, "--dry-run", "--shard", shard],
        );
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        dir.parent()
            .unwrap()
            .join("report.json")
            .display()
            .to_string()
    };
    let s1 = dry("m-s1", "7", "1/3");
    let s2 = dry("m-s2", "7", "2/3");
    let s3 = dry("m-s3", "7", "3/3");
    let other = dry("m-other", "8", "3/3");
    let (code, stdout, stderr) = softverbs(&["campaign", "merge", &s1, &s2, &s3], LIMIT);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("dry run: 6 plans"), "{stdout}");
    for (args, says) in [
        (vec![&s1, &s2, &other], "different campaigns"),
        (vec![&s1, &s2, &s2, &s3], "given twice"),
        (vec![&s1, &s3], "missing shard(s) 2/3"),
    ] {
        let mut full = vec!["campaign", "merge"];
        full.extend(args.iter().map(|s| s.as_str()));
        let (code, stdout, stderr) = softverbs(&full, LIMIT);
        assert_eq!(code, 2, "{full:?}\n{stdout}\n{stderr}");
        assert!(stderr.contains(says), "{full:?}: {stderr}");
        assert!(stdout.is_empty(), "nothing merged: {stdout}");
    }
    for shard in ["0/3", "4/3", "3", "1/0", "a/b"] {
        let (code, _, stderr, report, _) = campaign("m-bad", &["--shard", shard]);
        assert_eq!(code, 2, "{shard}: {stderr}");
        assert!(report.is_none());
    }
}

#[test]
fn qps_per_peer_is_part_of_the_campaign_and_of_its_replays() {
    let (code, stdout, stderr, one, _) =
        campaign("qps-1", &["--runs", "2", "--seed", "3", "--dry-run"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let args = [
        "--runs",
        "2",
        "--seed",
        "3",
        "--qps-per-peer",
        "2",
        "--dry-run",
    ];
    let (code, stdout, stderr, two, dir) = campaign("qps-2", &args);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let (one, two) = (one.unwrap(), two.unwrap());
    assert_eq!(num(&two["qps_per_peer"]), 2);
    assert_ne!(one["campaign_id"], two["campaign_id"]);
    let plan = std::fs::read_to_string(dir.join("plans/run-001.toml")).unwrap();
    assert!(plan.contains("--qps-per-peer 2 --workload"), "{plan}");
    // 2 peers x 1,100 QPs is more than a node holds.
    let (code, _, stderr, report, _) = campaign("qps-bad", &["--qps-per-peer", "1100"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("at most 2048"), "{stderr}");
    assert!(report.is_none());
}
