//! `softverbs campaign merge REPORT.json…`: the shard reports of one campaign
//! (`softverbs campaign --shard K/N --report …`) combined into the report and table of the
//! unsharded campaign.
//!
//! The merge does not trust the reports for what was drawn: it draws the campaign again from
//! the parameters in the reports, checks that its identity matches theirs (same seed, flags,
//! runs and plans, so the same softverbs drew them), and takes only what each run's outcome
//! was (verdict, counters, invariants, replay command, evidence) from the shard that did it.
//! It is not a scheduler: it neither starts nor retries runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{
    CampaignArgs, CampaignReport, RunRow, Shard, exit_code, header_line, not_run, render_end,
    row_line, setup_jobs, totals, workload_choice, write_campaign_report,
};
use crate::run::{EXIT_HARNESS, EXIT_USAGE};

/// Flags of `softverbs campaign merge`.
#[derive(clap::Args, Clone, Debug)]
pub struct MergeArgs {
    /// The shard reports (`softverbs campaign --shard K/N --report FILE.json`), one per shard.
    #[arg(required = true, value_name = "REPORT.json")]
    pub reports: Vec<PathBuf>,
    /// Write the merged JSON report here.
    #[arg(long, value_name = "FILE.json")]
    pub report: Option<PathBuf>,
}

/// What merge reads of a campaign report.
#[derive(Clone, Debug, Deserialize)]
struct ShardReport {
    version: String,
    campaign_id: String,
    seed: u64,
    runs: u32,
    nodes: u32,
    #[serde(default = "one")]
    qps_per_peer: u32,
    #[serde(default = "ibta")]
    recovery: String,
    #[serde(default)]
    cm: bool,
    workload: String,
    ops: Option<u64>,
    duration_ms: Option<u64>,
    jobs: u32,
    dry_run: bool,
    run_dir: String,
    elapsed_ms: u64,
    shard: Option<Shard>,
    rows: Vec<RowOutcome>,
}

fn one() -> u32 {
    1
}

/// The `--recovery` a shard report names.
fn recovery_choice(s: &str) -> Result<crate::recovery::RecoveryArg, String> {
    <crate::recovery::RecoveryArg as clap::ValueEnum>::from_str(s, false)
        .map_err(|_| format!("unknown recovery {s:?} in a shard report"))
}

fn ibta() -> String {
    crate::recovery::RecoveryArg::Ibta.name().to_owned()
}

/// What merge reads of a run's row: how the run went (what was drawn is drawn again).
#[derive(Clone, Debug, Deserialize)]
struct RowOutcome {
    index: u32,
    seed: u64,
    plan_file: String,
    plan_hash: String,
    verdict: String,
    ops_ok: u64,
    completions: BTreeMap<String, u64>,
    retransmits: u64,
    dropped: u64,
    duplicated: u64,
    corrupted: u64,
    violations: u64,
    failed_invariants: Vec<String>,
    harness_errors: Vec<String>,
    process_fault: Option<String>,
    detections_ms: Vec<u64>,
    elapsed_ms: u64,
    replay: String,
    evidence: Option<String>,
    ladder: Option<String>,
}

/// Runs `softverbs campaign merge`; returns the exit code (2 for reports that cannot be merged).
pub fn merge(args: &MergeArgs) -> u8 {
    let merged = match read_all(&args.reports).and_then(|r| combine(&args.reports, &r)) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("softverbs campaign merge: {e}");
            return EXIT_USAGE;
        }
    };
    println!(
        "softverbs campaign merge: {} report(s) of campaign {} ({} runs, seed {}, {} nodes, \
         workload {})",
        args.reports.len(),
        merged.report.campaign_id,
        merged.report.runs,
        merged.report.seed,
        merged.report.nodes,
        merged.report.workload
    );
    println!("{}", header_line(merged.plan_width));
    for row in &merged.report.rows {
        println!("{}", row_line(row, merged.plan_width));
    }
    print!("{}", render_end(&merged.report));
    if let Some(path) = &args.report {
        if let Err(e) = write_campaign_report(&merged.report, path) {
            eprintln!("softverbs campaign merge: {e}");
            return EXIT_HARNESS;
        }
    }
    merged.report.exit_code
}

/// The merged report and the plan column's width.
struct Merged {
    report: CampaignReport,
    plan_width: usize,
}

fn read_all(paths: &[PathBuf]) -> Result<Vec<ShardReport>, String> {
    paths
        .iter()
        .map(|p| {
            let bytes = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
            serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "{}: not a campaign report of this softverbs ({e})",
                    p.display()
                )
            })
        })
        .collect()
}

/// Checks the reports are the shards of one campaign, each once, none missing; merges them.
fn combine(paths: &[PathBuf], reports: &[ShardReport]) -> Result<Merged, String> {
    let first = reports.first().ok_or("no reports given")?;
    let name = |k: usize| {
        paths
            .get(k)
            .map_or(String::new(), |p| p.display().to_string())
    };
    for (k, r) in reports.iter().enumerate() {
        if r.campaign_id != first.campaign_id || r.dry_run != first.dry_run {
            return Err(format!(
                "{} and {} are reports of different campaigns (campaign {} seed {} runs {} vs \
                 campaign {} seed {} runs {}{}); only the shards of one campaign merge",
                name(0),
                name(k),
                first.campaign_id,
                first.seed,
                first.runs,
                r.campaign_id,
                r.seed,
                r.runs,
                if r.dry_run != first.dry_run {
                    ", one a dry run"
                } else {
                    ""
                }
            ));
        }
    }
    check_shards(paths, reports)?;
    let (setup_args, plan_width, jobs, id) = redraw(first)?;
    if id != first.campaign_id {
        return Err(format!(
            "{}: drawing campaign seed {} again gives campaign {id}, not {} (written by \
             softverbs {}); merge with the softverbs that ran the campaign",
            name(0),
            first.seed,
            first.campaign_id,
            first.version
        ));
    }
    let mut rows: Vec<Option<RunRow>> = vec![None; jobs.len()];
    for (k, r) in reports.iter().enumerate() {
        for o in &r.rows {
            let job = jobs
                .get(o.index as usize)
                .filter(|j| {
                    j.seed == o.seed && format!("{:#018x}", j.plan.network().hash()) == o.plan_hash
                })
                .filter(|_| r.shard.is_none_or(|s| s.owns(o.index)))
                .ok_or_else(|| {
                    format!(
                        "{}: run {} (seed {}) is not a run of this campaign's shard",
                        name(k),
                        o.index,
                        o.seed
                    )
                })?;
            let slot = rows
                .get_mut(o.index as usize)
                .ok_or("run index out of range")?;
            if slot.is_some() {
                return Err(format!("{}: run {} is given twice", name(k), o.index));
            }
            *slot = Some(outcome_row(not_run(job), o));
        }
    }
    let missing: Vec<String> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_none())
        .map(|(k, _)| k.to_string())
        .take(10)
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the reports lack runs {} (a truncated report?)",
            missing.join(", ")
        ));
    }
    let rows: Vec<RunRow> = rows.into_iter().flatten().collect();
    let totals = totals(&rows);
    let exit_code = exit_code(&totals, first.dry_run);
    let dirs: Vec<&str> = reports.iter().map(|r| r.run_dir.as_str()).collect();
    let report = CampaignReport {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        campaign_id: id,
        shard: None,
        seed: first.seed,
        runs: setup_args.runs,
        nodes: setup_args.nodes,
        recovery: setup_args.recovery.name().to_owned(),
        qps_per_peer: setup_args.qps_per_peer,
        cm: setup_args.cm == crate::run::CmMode::Rdma,
        workload: first.workload.clone(),
        ops: first.ops,
        duration_ms: first.duration_ms,
        jobs: reports.iter().map(|r| r.jobs).max().unwrap_or(1),
        dry_run: first.dry_run,
        run_dir: dirs.join(" "),
        // The shards ran side by side: the longest of them.
        elapsed_ms: reports.iter().map(|r| r.elapsed_ms).max().unwrap_or(0),
        passed: exit_code == crate::run::EXIT_PASS,
        exit_code,
        totals,
        rows,
    };
    Ok(Merged { report, plan_width })
}

/// Every report a shard of the same N, each K once, none missing (or one unsharded report).
fn check_shards(paths: &[PathBuf], reports: &[ShardReport]) -> Result<(), String> {
    let name = |k: usize| {
        paths
            .get(k)
            .map_or(String::new(), |p| p.display().to_string())
    };
    let mut seen: BTreeMap<u32, usize> = BTreeMap::new();
    let mut count = None;
    for (k, r) in reports.iter().enumerate() {
        let s = match r.shard {
            Some(s) => s,
            None if reports.len() == 1 => return Ok(()),
            None => {
                return Err(format!(
                    "{} is the report of a whole campaign, not of a shard",
                    name(k)
                ));
            }
        };
        if *count.get_or_insert(s.count) != s.count {
            return Err(format!(
                "{} is shard {s}, but {} is of {} shards",
                name(k),
                name(0),
                count.unwrap_or(0)
            ));
        }
        if let Some(&other) = seen.get(&s.index) {
            return Err(format!(
                "shard {s} is given twice: {} and {}",
                name(other),
                name(k)
            ));
        }
        seen.insert(s.index, k);
    }
    let n = count.unwrap_or(1);
    let missing: Vec<String> = (1..=n)
        .filter(|i| !seen.contains_key(i))
        .map(|i| format!("{i}/{n}"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "missing shard(s) {} of the campaign ({} of {n} given)",
            missing.join(", "),
            seen.len()
        ))
    }
}

/// Draws the campaign of `r` again: its flags, the plan column's width, every job and the
/// campaign identity.
fn redraw(r: &ShardReport) -> Result<(CampaignArgs, usize, Vec<super::Job>, String), String> {
    let args = CampaignArgs {
        command: None,
        runs: r.runs,
        seed: Some(r.seed),
        nodes: r.nodes,
        qps_per_peer: r.qps_per_peer,
        cm: if r.cm {
            crate::run::CmMode::Rdma
        } else {
            crate::run::CmMode::None
        },
        recovery: recovery_choice(&r.recovery)?,
        workload: workload_choice(&r.workload)?,
        ops: r.ops,
        duration: match r.ops {
            Some(_) => None,
            None => r.duration_ms.map(Duration::from_millis),
        },
        run_dir: Some(PathBuf::from(&r.run_dir)),
        report: None,
        jobs: 1,
        dry_run: r.dry_run,
        shard: None,
        self_test_corrupt: None,
    };
    let base = super::default_run_args()?;
    let setup = setup_jobs(&args, r.seed, base)?;
    Ok((args, setup.plan_width, setup.jobs, setup.id))
}

/// The row of `job` with the outcome the shard reported.
fn outcome_row(mut row: RunRow, o: &RowOutcome) -> RunRow {
    row.plan_file.clone_from(&o.plan_file);
    row.verdict.clone_from(&o.verdict);
    row.ops_ok = o.ops_ok;
    row.completions.clone_from(&o.completions);
    row.retransmits = o.retransmits;
    row.dropped = o.dropped;
    row.duplicated = o.duplicated;
    row.corrupted = o.corrupted;
    row.violations = o.violations;
    row.failed_invariants.clone_from(&o.failed_invariants);
    row.harness_errors.clone_from(&o.harness_errors);
    row.process_fault.clone_from(&o.process_fault);
    row.detections_ms.clone_from(&o.detections_ms);
    row.elapsed_ms = o.elapsed_ms;
    row.replay.clone_from(&o.replay);
    row.evidence.clone_from(&o.evidence);
    row.ladder.clone_from(&o.ladder);
    row
}
