//! `softverbs campaign`: many short `softverbs run`s, each with a fault plan drawn from the
//! campaign seed ([`crate::run::draw`]), all judged by the same invariants.
//!
//! Run `k` gets its own seed and workload from one ChaCha8 stream of the campaign seed, and its
//! plan from its own seed, so a campaign seed always gives the same runs and plans. Every plan
//! is written to `DIR/plans/run-NNN.toml` before the first run starts; a failing run keeps its
//! evidence (MR files, completion logs, node stderr, `report.json`) in `DIR/run-NNN/` and is
//! replayed alone with the `softverbs run … --faults DIR/plans/run-NNN.toml --seed X` command
//! the summary prints. Passing runs leave only their plan behind.
//!
//! `--shard K/N` (K from 1) runs only the runs `i` with `i mod N == K - 1` of the same drawn
//! set, and `softverbs campaign merge` ([`merge`]) combines the N shard reports into the report
//! and table of the unsharded campaign. Every report carries the campaign's identity
//! ([`CampaignReport::campaign_id`]: a hash of its parameters and every run's seed, workload and
//! plan), so reports of different campaigns are never merged.
//!
//! Exit codes: 0 every run passed; 1 at least one run violated an invariant; 2 invalid flags
//! (nothing was started); 3 a run could not be started (and none violated).

pub mod merge;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::run::draw::{DrawParams, DrawnPlan};
use crate::run::layout::{self, Workload};
use crate::run::orchestrator::{self, Options, Progress, RunError};
use crate::run::plan::format_duration;
use crate::run::proto::QpParams;
use crate::run::report::Report;
use crate::run::{CmMode, EXIT_HARNESS, EXIT_PASS, EXIT_USAGE, EXIT_VIOLATION, RunArgs};

/// How long each run's workload lasts when neither `--ops` nor `--duration` is given.
pub const DEFAULT_DURATION: Duration = Duration::from_millis(1500);

/// Where faults are placed when runs are bounded by `--ops` (their length is not known).
const OPS_HORIZON: Duration = Duration::from_secs(1);

/// The campaign gives up after this many runs in a row that could not start.
const MAX_HARNESS_ERRORS_IN_A_ROW: usize = 3;

/// Which workload each run gets.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WorkloadChoice {
    /// Run `k` gets the `k mod 5`-th workload (pingpong, stream-write, read-verify,
    /// atomic-counter, mixed).
    Cycle,
    /// One of those five, drawn from the campaign seed.
    Draw,
    /// Always this one.
    Fixed(Workload),
}

impl WorkloadChoice {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadChoice::Cycle => "cycle",
            WorkloadChoice::Draw => "draw",
            WorkloadChoice::Fixed(w) => w.name(),
        }
    }
}

fn workload_choice(s: &str) -> Result<WorkloadChoice, String> {
    match s {
        "cycle" => Ok(WorkloadChoice::Cycle),
        "draw" => Ok(WorkloadChoice::Draw),
        other => Workload::from_str(other, false)
            .map(WorkloadChoice::Fixed)
            .map_err(|_| {
                let names: Vec<&str> = Workload::value_variants()
                    .iter()
                    .map(|w| w.name())
                    .collect();
                format!(
                    "unknown workload `{other}`: expected cycle, draw or one of {}",
                    names.join(", ")
                )
            }),
    }
}

fn duration_arg(s: &str) -> Result<Duration, String> {
    crate::run::plan::parse_duration(s)
}

/// One of N deterministic slices of a campaign (`--shard K/N`, K from 1): run `i` belongs to
/// shard `i mod N + 1`, so shards 1..=N together do every run exactly once.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// K, 1..=`count`.
    pub index: u32,
    /// N, at least 1.
    pub count: u32,
}

impl Shard {
    /// Whether run `run` (0-based) belongs to this shard.
    pub fn owns(self, run: u32) -> bool {
        run % self.count == self.index - 1
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Parses `K/N` with 1 ≤ K ≤ N ≤ 100,000.
pub fn shard_arg(s: &str) -> Result<Shard, String> {
    let bad = || format!("`{s}`: expected K/N with 1 <= K <= N (shards count from 1), e.g. 1/4");
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    let index: u32 = k.trim().parse().map_err(|_| bad())?;
    let count: u32 = n.trim().parse().map_err(|_| bad())?;
    if index == 0 || count == 0 || index > count || count > 100_000 {
        return Err(bad());
    }
    Ok(Shard { index, count })
}

/// What `softverbs campaign` can do besides running a campaign.
#[derive(clap::Subcommand, Clone, Debug)]
pub enum CampaignCommand {
    /// Combine the JSON reports of the shards of one campaign (`--shard K/N --report …`) into
    /// the report and table of the unsharded campaign. Refuses reports of different campaigns,
    /// a shard given twice and missing shards (exit 2). Exit code otherwise as the campaign's.
    Merge(merge::MergeArgs),
}

/// Flags of `softverbs campaign`.
#[derive(clap::Args, Clone, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CampaignArgs {
    /// `merge`, instead of running a campaign.
    #[command(subcommand)]
    pub command: Option<CampaignCommand>,
    /// Runs to do.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub runs: u32,
    /// Loss recovery of every run's RC QPs: IBTA go-back-N, or selective repeat (a softverbs
    /// extension, on every node alike). The verifier judges either.
    #[arg(long, value_enum, default_value_t = crate::recovery::RecoveryArg::Ibta)]
    pub recovery: crate::recovery::RecoveryArg,
    /// Campaign seed: every run's seed, workload and fault plan derive from it (the same seed
    /// gives the same plans); default: drawn from the clock and printed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Node processes per run (2–64).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub nodes: u32,
    /// Workload of each run: `cycle` (through the five RC workloads in turn), `draw` (one of
    /// them, from the seed), or a workload name (pingpong, stream-write, read-verify,
    /// atomic-counter, mixed, ud-send).
    #[arg(long, default_value = "cycle", value_parser = workload_choice)]
    pub workload: WorkloadChoice,
    /// RC QPs between each pair of peers in every run (`softverbs run --qps-per-peer`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=layout::MAX_LINKS as i64))]
    pub qps_per_peer: u32,
    /// How every run's node pairs connect their RC QPs (`softverbs run --cm`).
    #[arg(long, value_enum, default_value_t = CmMode::None)]
    pub cm: CmMode,
    /// Operations each node of each run posts (faults are then placed within the first
    /// second and may come after a short workload has ended).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "duration")]
    pub ops: Option<u64>,
    /// How long each run's workload lasts (default 1500ms).
    #[arg(long, value_parser = duration_arg)]
    pub duration: Option<Duration>,
    /// Directory for the plans (`plans/run-NNN.toml`) and the evidence of failing runs
    /// (`run-NNN/`); must be empty or absent (default: a new directory under the system temp
    /// dir).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Write the campaign's JSON report here.
    #[arg(long, value_name = "FILE.json")]
    pub report: Option<PathBuf>,
    /// Runs at a time (1–16). More than one loads a small machine enough to slow the nodes
    /// down; the invariants allow for that, but 1 keeps the runs comparable.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub jobs: u32,
    /// Draw the plans, write them and print the table, but run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do only shard K of N (K from 1): the runs `i` with `i mod N == K - 1` of the same drawn
    /// set; `softverbs campaign merge` combines the N reports.
    #[arg(long, value_name = "K/N", value_parser = shard_arg)]
    pub shard: Option<Shard>,
    /// Corrupt one byte of the evidence of this run (proves a violation fails the campaign).
    #[arg(long, hide = true, value_name = "RUN")]
    pub self_test_corrupt: Option<u32>,
}

/// One run of a campaign, as reported.
#[derive(Clone, Debug, Serialize)]
pub struct RunRow {
    /// Run index (0-based).
    pub index: u32,
    /// The run's seed (`softverbs run --seed`).
    pub seed: u64,
    /// Workload name.
    pub workload: String,
    /// The drawn plan.
    pub plan: DrawnPlan,
    /// The plan in one line.
    pub plan_summary: String,
    /// The plan file.
    pub plan_file: String,
    /// `FaultPlan::hash` of the network faults, hex.
    pub plan_hash: String,
    /// `pass`, `FAIL` (violations), `ERROR` (could not run) or `not run`.
    pub verdict: String,
    /// Successful workload operations, all nodes.
    pub ops_ok: u64,
    /// Work completions by status, all nodes.
    pub completions: BTreeMap<String, u64>,
    /// Retransmitted packets (after timeouts and NAKs), all nodes that reported.
    pub retransmits: u64,
    /// Datagrams the injectors dropped (drop and partition rules), all nodes that reported.
    pub dropped: u64,
    /// Datagrams the injectors duplicated.
    pub duplicated: u64,
    /// Datagrams the injectors corrupted.
    pub corrupted: u64,
    /// Invariant violations.
    pub violations: u64,
    /// The invariants that failed, with their first violation.
    pub failed_invariants: Vec<String>,
    /// Harness errors of the run (a node that could not start, a hard timeout).
    pub harness_errors: Vec<String>,
    /// What became of the process fault (`applied`, `skipped: …`), if there was one.
    pub process_fault: Option<String>,
    /// Dead-peer detection latencies, ms.
    pub detections_ms: Vec<u64>,
    /// Wall-clock time of the run, ms.
    pub elapsed_ms: u64,
    /// The command that replays the run.
    pub replay: String,
    /// Where the evidence was kept (failing runs only).
    pub evidence: Option<String>,
    /// The ladder of the violating QPs in the evidence (failing runs only).
    pub ladder: Option<String>,
}

/// Sums over every run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Totals {
    /// Runs done.
    pub runs: u32,
    /// Runs that passed.
    pub passed: u32,
    /// Runs with at least one violation (or a harness error inside the run).
    pub failed: u32,
    /// Runs that could not start.
    pub harness_errors: u32,
    /// Runs not done (the campaign gave up, or `--dry-run`).
    pub not_run: u32,
    /// Invariant violations, all runs.
    pub violations: u64,
    /// Successful operations, all runs.
    pub ops_ok: u64,
    /// Work completions by status, all runs.
    pub completions: BTreeMap<String, u64>,
    /// Retransmitted packets, all runs.
    pub retransmits: u64,
    /// Datagrams dropped by the injectors, all runs.
    pub dropped: u64,
    /// Datagrams duplicated by the injectors, all runs.
    pub duplicated: u64,
    /// Datagrams corrupted by the injectors, all runs.
    pub corrupted: u64,
    /// Process faults applied, by action.
    pub process_faults: BTreeMap<String, u64>,
    /// Process faults not applied (the workload ended before their time).
    pub process_faults_skipped: u64,
}

/// The campaign's JSON report (`--report`).
#[derive(Clone, Debug, Serialize)]
pub struct CampaignReport {
    /// softverbs version.
    pub version: String,
    /// The campaign's identity: a hash of its parameters (seed, runs, nodes, workload choice,
    /// bound, QP parameters) and of every run's seed, workload and plan hash, hex. Shards of
    /// one campaign share it.
    pub campaign_id: String,
    /// The shard this report covers (`None`: the whole campaign, or a merge of its shards).
    pub shard: Option<Shard>,
    /// The campaign seed.
    pub seed: u64,
    /// Runs asked for.
    pub runs: u32,
    /// Loss recovery of every run's RC QPs (`ibta` or `sr`).
    pub recovery: String,
    /// Nodes per run.
    pub nodes: u32,
    /// RC QPs per pair of peers in every run (`--qps-per-peer`).
    pub qps_per_peer: u32,
    /// Every run connects through the CM (`--cm rdma`); left out when not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cm: bool,
    /// `cycle`, `draw` or a workload name.
    pub workload: String,
    /// `--ops`, if given.
    pub ops: Option<u64>,
    /// Each run's duration in ms, if bounded by time.
    pub duration_ms: Option<u64>,
    /// Runs at a time.
    pub jobs: u32,
    /// Nothing was run.
    pub dry_run: bool,
    /// Plans and evidence.
    pub run_dir: String,
    /// Wall-clock time of the campaign, ms.
    pub elapsed_ms: u64,
    /// Every run done passed.
    pub passed: bool,
    /// The exit code.
    pub exit_code: u8,
    /// Sums.
    pub totals: Totals,
    /// Per run, in run order.
    pub rows: Vec<RunRow>,
}

/// A run to do: its index, seed, workload, plan and where it goes.
#[derive(Clone, Debug)]
struct Job {
    index: u32,
    seed: u64,
    workload: Workload,
    plan: DrawnPlan,
    plan_file: PathBuf,
    run_dir: PathBuf,
}

/// The run seeds and workloads of a campaign: one ChaCha8 stream of the campaign seed, two
/// draws per run whatever the workload choice (so `--workload` does not change the seeds).
pub fn run_seeds(seed: u64, runs: u32, choice: WorkloadChoice) -> Vec<(u64, Workload)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let all = &crate::run::layout::RC_WORKLOADS;
    (0..runs)
        .map(|k| {
            let run_seed = rng.next_u64() >> 16;
            let pick = rng.next_u64();
            let workload = match choice {
                WorkloadChoice::Cycle => all[k as usize % all.len()],
                WorkloadChoice::Draw => all[(pick % all.len() as u64) as usize],
                WorkloadChoice::Fixed(w) => w,
            };
            (run_seed, workload)
        })
        .collect()
}

/// The flags of a default `softverbs run` (its QP parameters and slack).
fn default_run_args() -> Result<RunArgs, String> {
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: RunArgs,
    }
    Wrap::try_parse_from(["run"])
        .map(|w| w.args)
        .map_err(|e| e.to_string())
}

/// A validated campaign.
struct Setup {
    seed: u64,
    dir: PathBuf,
    /// The runs to do: every run, or the shard's.
    jobs: Vec<Job>,
    base: RunArgs,
    /// Width of the plan column, over every run of the campaign (so shards print alike).
    plan_width: usize,
    /// [`CampaignReport::campaign_id`].
    id: String,
}

fn validate(args: &CampaignArgs) -> Result<Setup, String> {
    let seed = args.seed.unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        layout::mix(nanos ^ u64::from(std::process::id())) >> 16
    });
    if let Some(k) = args.self_test_corrupt {
        if k >= args.runs {
            return Err(format!(
                "--self-test-corrupt {k}: there are only {} runs",
                args.runs
            ));
        }
    }
    if let Some(report) = &args.report {
        let parent = report.parent().filter(|p| !p.as_os_str().is_empty());
        if parent.is_some_and(|p| !p.is_dir()) {
            return Err(format!(
                "--report {}: its directory does not exist",
                report.display()
            ));
        }
    }
    if let Some(dir) = &args.run_dir {
        given_dir_is_empty(dir)?;
    }
    let base = default_run_args()?;
    check_qps(args, &base)?;
    setup_jobs(args, seed, base)
}

/// Refuses a `--qps-per-peer` that some run of the campaign could not take (see
/// `softverbs run`).
fn check_qps(args: &CampaignArgs, base: &RunArgs) -> Result<(), String> {
    let workloads: Vec<Workload> = match args.workload {
        WorkloadChoice::Fixed(w) => vec![w],
        _ => crate::run::layout::RC_WORKLOADS.to_vec(),
    };
    for workload in workloads {
        let mut run = base.clone();
        run.nodes = args.nodes;
        run.workload = workload;
        run.qps_per_peer = args.qps_per_peer;
        run.cm = args.cm;
        orchestrator::check_qps_per_peer(&run)?;
        orchestrator::check_cm(&run)?;
    }
    Ok(())
}

/// Refuses a given campaign directory that exists and is not empty.
fn given_dir_is_empty(dir: &Path) -> Result<(), String> {
    if dir.exists() {
        let mut entries =
            std::fs::read_dir(dir).map_err(|e| format!("run dir {}: {e}", dir.display()))?;
        if entries.next().is_some() {
            return Err(format!(
                "run dir {} is not empty (evidence of two campaigns would mix); give an empty or \
                 new directory",
                dir.display()
            ));
        }
    }
    Ok(())
}

/// Continues [`validate`] once the flags are known to be good: the base run flags and the
/// jobs; creates the campaign directory when none was given (a private one: mode 0700, an
/// unguessable name under the system temp dir).
fn setup_jobs(args: &CampaignArgs, seed: u64, mut base: RunArgs) -> Result<Setup, String> {
    let dir = match &args.run_dir {
        Some(d) => d.clone(),
        None => orchestrator::private_dir(
            &std::env::temp_dir(),
            &format!("softverbs-campaign-{seed}-"),
        )?,
    };
    base.nodes = args.nodes;
    base.qps_per_peer = args.qps_per_peer;
    base.cm = args.cm;
    base.ops = args.ops;
    base.duration = match args.ops {
        Some(_) => None,
        None => Some(args.duration.unwrap_or(DEFAULT_DURATION)),
    };
    let horizon = base.duration.unwrap_or(OPS_HORIZON);
    // A run that hangs is stopped well before the default minute.
    base.timeout = Some(horizon + Duration::from_secs(30));
    base.recovery = args.recovery;
    let qp = QpParams {
        timeout: base.qp_timeout,
        retry_cnt: base.retry_cnt,
        rnr_retry: base.rnr_retry,
        recovery: base.recovery,
    };
    let params = DrawParams {
        nodes: args.nodes,
        horizon,
        qp,
    };
    let jobs: Vec<Job> = run_seeds(seed, args.runs, args.workload)
        .into_iter()
        .enumerate()
        .map(|(k, (run_seed, workload))| Job {
            index: k as u32,
            seed: run_seed,
            workload,
            plan: DrawnPlan::draw(run_seed, &params),
            plan_file: dir.join("plans").join(format!("run-{k:03}.toml")),
            run_dir: dir.join(format!("run-{k:03}")),
        })
        .collect();
    let plan_width = jobs
        .iter()
        .map(|j| j.plan.summary().chars().count())
        .max()
        .unwrap_or(0);
    let id = campaign_id(args, seed, &base, &jobs);
    let jobs = match args.shard {
        Some(shard) => jobs.into_iter().filter(|j| shard.owns(j.index)).collect(),
        None => jobs,
    };
    Ok(Setup {
        seed,
        dir,
        jobs,
        base,
        plan_width,
        id,
    })
}

/// [`CampaignReport::campaign_id`]: FNV-1a over the parameters that decide what is run and
/// how it is judged, and every run's seed, workload and plan hash.
fn campaign_id(args: &CampaignArgs, seed: u64, base: &RunArgs, jobs: &[Job]) -> String {
    let mut text = format!(
        "seed={seed};runs={};nodes={};qps_per_peer={};workload={};ops={:?};duration_ms={:?};\
         qp_timeout={};retry_cnt={};rnr_retry={};recovery={}",
        args.runs,
        args.nodes,
        base.qps_per_peer,
        args.workload.name(),
        base.ops,
        base.duration.map(|d| d.as_millis()),
        base.qp_timeout,
        base.retry_cnt,
        base.rnr_retry,
        base.recovery.name(),
    );
    // Absent for `--cm none`, so the identities of campaigns without the CM are unchanged.
    if base.cm == CmMode::Rdma {
        text += ";cm=rdma";
    }
    for j in jobs {
        let _ = write!(
            text,
            ";{}:{}:{}:{:x}",
            j.index,
            j.seed,
            j.workload.name(),
            j.plan.network().hash()
        );
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Writes every plan file (creating `DIR/plans`).
fn write_plans(setup: &Setup, args: &CampaignArgs) -> Result<(), String> {
    let plans = setup.dir.join("plans");
    std::fs::create_dir_all(&plans)
        .map_err(|e| format!("cannot create {}: {e}", plans.display()))?;
    for job in &setup.jobs {
        let bound = match (args.ops, setup.base.duration) {
            (Some(o), _) => format!("--ops {o}"),
            (None, Some(d)) => format!("--duration {}", format_duration(d)),
            (None, None) => String::new(),
        };
        let header = format!(
            "softverbs campaign --seed {} run {}: seed {}, workload {}\nreplay: softverbs run \
             --nodes {} --workload {} --seed {} --faults {} {bound}",
            setup.seed,
            job.index,
            job.seed,
            job.workload.name(),
            args.nodes,
            job.workload.name(),
            job.seed,
            job.plan_file.display()
        );
        let header = if args.qps_per_peer > 1 {
            header.replacen(
                "--workload",
                &format!("--qps-per-peer {} --workload", args.qps_per_peer),
                2,
            )
        } else {
            header
        };
        let header = if args.recovery == crate::recovery::RecoveryArg::Ibta {
            header
        } else {
            format!("{header} --recovery {}", args.recovery.name())
        };
        std::fs::write(&job.plan_file, job.plan.to_toml(&header))
            .map_err(|e| format!("cannot write {}: {e}", job.plan_file.display()))?;
    }
    Ok(())
}

/// Runs `softverbs campaign` (or `softverbs campaign merge`); returns the exit code.
pub fn campaign(args: &CampaignArgs) -> u8 {
    if let Some(CampaignCommand::Merge(m)) = &args.command {
        return merge::merge(m);
    }
    let setup = match validate(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("softverbs campaign: {e}");
            return EXIT_USAGE;
        }
    };
    if let Err(e) = write_plans(&setup, args) {
        eprintln!("softverbs campaign: {e}");
        return EXIT_HARNESS;
    }
    let started = Instant::now();
    let per_run = match (args.ops, setup.base.duration) {
        (Some(o), _) => format!("{o} ops/node per run"),
        (None, Some(d)) => format!("{} per run", format_duration(d)),
        (None, None) => String::new(),
    };
    let shard = match args.shard {
        Some(s) => format!(", shard {s} ({} of them)", setup.jobs.len()),
        None => String::new(),
    };
    println!(
        "softverbs campaign: {} runs{shard}, seed {}, {} nodes, workload {}, {per_run}, {} at a \
         time, run dir {}",
        args.runs,
        setup.seed,
        args.nodes,
        args.workload.name(),
        args.jobs,
        setup.dir.display()
    );
    println!("{}", header_line(setup.plan_width));

    let multi = indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stderr());
    let bar = campaign_bar(&multi, setup.jobs.len() as u32);
    let rows: Mutex<Vec<Option<RunRow>>> = Mutex::new(vec![None; setup.jobs.len()]);
    let next = AtomicUsize::new(0);
    let give_up = AtomicBool::new(false);
    let in_a_row = AtomicUsize::new(0);
    let stats = Mutex::new((0u32, 0u32, 0u64));
    if !args.dry_run {
        std::thread::scope(|scope| {
            for _ in 0..(args.jobs as usize).min(setup.jobs.len()) {
                scope.spawn(|| {
                    loop {
                        let k = next.fetch_add(1, Ordering::SeqCst);
                        let Some(job) = setup.jobs.get(k) else {
                            break;
                        };
                        if give_up.load(Ordering::SeqCst) {
                            break;
                        }
                        let progress = match &bar {
                            Some(_) => Progress::In(multi.clone()),
                            None => Progress::Hidden,
                        };
                        let corrupt = args.self_test_corrupt == Some(job.index);
                        let row = do_run(&setup.base, job, corrupt, progress);
                        if row.verdict == "ERROR" {
                            let n = in_a_row.fetch_add(1, Ordering::SeqCst) + 1;
                            if n >= MAX_HARNESS_ERRORS_IN_A_ROW {
                                give_up.store(true, Ordering::SeqCst);
                            }
                        } else {
                            in_a_row.store(0, Ordering::SeqCst);
                        }
                        let line = row_line(&row, setup.plan_width);
                        multi.suspend(|| println!("{line}"));
                        if let Some(bar) = &bar {
                            let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
                            s.0 += u32::from(row.verdict == "FAIL");
                            s.1 += u32::from(row.verdict == "ERROR");
                            s.2 += row.violations;
                            bar.set_message(format!(
                                "{} failed ({} violations), {} could not run",
                                s.0, s.2, s.1
                            ));
                            bar.inc(1);
                        }
                        let mut rows = rows.lock().unwrap_or_else(|p| p.into_inner());
                        if let Some(slot) = rows.get_mut(k) {
                            *slot = Some(row);
                        }
                    }
                });
            }
        });
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let rows: Vec<RunRow> = rows
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .zip(&setup.jobs)
        .map(|(row, job)| row.unwrap_or_else(|| not_run(job)))
        .collect();
    if args.dry_run {
        for row in &rows {
            println!("{}", row_line(row, setup.plan_width));
        }
    }
    let totals = totals(&rows);
    let exit_code = exit_code(&totals, args.dry_run);
    let report = CampaignReport {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        campaign_id: setup.id.clone(),
        shard: args.shard,
        seed: setup.seed,
        runs: args.runs,
        recovery: args.recovery.name().to_owned(),
        nodes: args.nodes,
        qps_per_peer: args.qps_per_peer,
        cm: args.cm == CmMode::Rdma,
        workload: args.workload.name().to_owned(),
        ops: args.ops,
        duration_ms: setup.base.duration.map(|d| d.as_millis() as u64),
        jobs: args.jobs,
        dry_run: args.dry_run,
        run_dir: setup.dir.display().to_string(),
        elapsed_ms: started.elapsed().as_millis() as u64,
        passed: exit_code == EXIT_PASS,
        exit_code,
        totals,
        rows,
    };
    print!("{}", render_end(&report));
    if let Some(path) = &args.report {
        if let Err(e) = write_campaign_report(&report, path) {
            eprintln!("softverbs campaign: {e}");
            return EXIT_HARNESS;
        }
    }
    exit_code
}

/// The campaign's exit code from its totals.
fn exit_code(totals: &Totals, dry_run: bool) -> u8 {
    if totals.failed > 0 {
        EXIT_VIOLATION
    } else if totals.harness_errors > 0 || (totals.not_run > 0 && !dry_run) {
        EXIT_HARNESS
    } else {
        EXIT_PASS
    }
}

/// Writes `report` as pretty JSON to `path`.
fn write_campaign_report(report: &CampaignReport, path: &Path) -> Result<(), String> {
    serde_json::to_vec_pretty(report)
        .map_err(|e| e.to_string())
        .and_then(|j| std::fs::write(path, j).map_err(|e| e.to_string()))
        .map_err(|e| format!("cannot write the report {}: {e}", path.display()))
}

fn campaign_bar(multi: &indicatif::MultiProgress, runs: u32) -> Option<indicatif::ProgressBar> {
    let bar = multi.add(indicatif::ProgressBar::new(u64::from(runs)));
    if bar.is_hidden() {
        return None;
    }
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "campaign [{bar:30}] {pos}/{len} runs, {elapsed_precise}, eta {eta}  {msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message("0 failed");
    Some(bar)
}

/// Does one run and turns its outcome into a row; keeps the evidence only if it failed.
fn do_run(base: &RunArgs, job: &Job, corrupt: bool, progress: Progress) -> RunRow {
    let mut args = base.clone();
    args.workload = job.workload;
    args.seed = Some(job.seed);
    args.faults = Some(job.plan_file.clone());
    args.run_dir = Some(job.run_dir.clone());
    args.report = None;
    args.self_test_corrupt = corrupt;
    let opts = Options {
        plan_text: None,
        quiet: true,
        progress,
    };
    let started = Instant::now();
    let mut row = not_run(job);
    match orchestrator::execute(&args, &opts) {
        Ok(report) => {
            fill_row(&mut row, &report);
            if report.passed {
                // Only what this run created: the directory was new or empty.
                let _ = std::fs::remove_dir_all(&job.run_dir);
            } else {
                let path = job.run_dir.join("report.json");
                if let Err(e) = orchestrator::write_report(&report, &path) {
                    row.harness_errors.push(e);
                }
                row.evidence = Some(job.run_dir.display().to_string());
                row.ladder.clone_from(&report.trace.ladder);
            }
        }
        Err(e) => {
            row.verdict = "ERROR".to_owned();
            row.harness_errors.push(e.to_string());
            if let RunError::Harness { run_dir, .. } = &e {
                row.evidence = Some(run_dir.display().to_string());
            }
            row.replay = replay(&args, job);
        }
    }
    row.elapsed_ms = started.elapsed().as_millis() as u64;
    row
}

fn replay(args: &RunArgs, job: &Job) -> String {
    let bound = match (args.ops, args.duration) {
        (_, Some(d)) => format!(" --duration {}", format_duration(d)),
        (Some(o), None) => format!(" --ops {o}"),
        (None, None) => String::new(),
    };
    let qps = if args.qps_per_peer > 1 {
        format!(" --qps-per-peer {}", args.qps_per_peer)
    } else {
        String::new()
    };
    let recovery = if args.recovery == crate::recovery::RecoveryArg::Ibta {
        String::new()
    } else {
        format!(" --recovery {}", args.recovery.name())
    };
    let cm = if args.cm == CmMode::Rdma {
        " --cm rdma"
    } else {
        ""
    };
    format!(
        "softverbs run --nodes {}{qps} --workload {} --seed {} --faults {}{bound}{recovery}{cm}",
        args.nodes,
        job.workload.name(),
        job.seed,
        job.plan_file.display()
    )
}

fn not_run(job: &Job) -> RunRow {
    RunRow {
        index: job.index,
        seed: job.seed,
        workload: job.workload.name().to_owned(),
        plan: job.plan.clone(),
        plan_summary: job.plan.summary(),
        plan_file: job.plan_file.display().to_string(),
        plan_hash: format!("{:#018x}", job.plan.network().hash()),
        verdict: "not run".to_owned(),
        ops_ok: 0,
        completions: BTreeMap::new(),
        retransmits: 0,
        dropped: 0,
        duplicated: 0,
        corrupted: 0,
        violations: 0,
        failed_invariants: Vec::new(),
        harness_errors: Vec::new(),
        process_fault: None,
        detections_ms: Vec::new(),
        elapsed_ms: 0,
        replay: String::new(),
        evidence: None,
        ladder: None,
    }
}

fn fill_row(row: &mut RunRow, r: &Report) {
    row.verdict = if r.passed { "pass" } else { "FAIL" }.to_owned();
    for n in &r.node_reports {
        row.ops_ok += n.ops_ok;
        for (k, v) in &n.completions {
            *row.completions.entry(k.clone()).or_insert(0) += v;
        }
        if let Some(s) = &n.stats {
            row.retransmits += s.retransmits_timeout + s.retransmits_nak + s.retransmits_sack;
        }
        if let Some(f) = n.injected {
            row.dropped += f.dropped + f.partitioned;
            row.duplicated += f.duplicated;
            row.corrupted += f.corrupted;
        }
    }
    row.violations = r.violations;
    row.failed_invariants = r
        .invariants
        .iter()
        .filter(|i| !i.passed())
        .map(|i| match i.violations.first() {
            Some(v) => format!("{} ({}): {v}", i.name, i.violation_count),
            None => format!("{} ({})", i.name, i.violation_count),
        })
        .collect();
    row.harness_errors = r.harness_errors.clone();
    row.process_fault = r.process_faults.first().map(|f| match &f.note {
        Some(n) => format!("{}: {n}", f.status),
        None => f.status.clone(),
    });
    row.detections_ms = r.detections.iter().map(|d| d.latency_ms).collect();
    row.replay = r.replay.clone();
}

fn totals(rows: &[RunRow]) -> Totals {
    let mut t = Totals::default();
    for row in rows {
        match row.verdict.as_str() {
            "pass" => t.passed += 1,
            "FAIL" => t.failed += 1,
            "ERROR" => t.harness_errors += 1,
            _ => {
                t.not_run += 1;
                continue;
            }
        }
        t.runs += 1;
        t.violations += row.violations;
        t.ops_ok += row.ops_ok;
        for (k, v) in &row.completions {
            *t.completions.entry(k.clone()).or_insert(0) += v;
        }
        t.retransmits += row.retransmits;
        t.dropped += row.dropped;
        t.duplicated += row.duplicated;
        t.corrupted += row.corrupted;
        if let (Some(p), Some(state)) = (row.plan.process, &row.process_fault) {
            if state == "applied" {
                *t.process_faults.entry(p.action.to_owned()).or_insert(0) += 1;
            } else {
                t.process_faults_skipped += 1;
            }
        }
    }
    t
}

/// `IBV_WC_RETRY_EXC_ERR` → `RETRY_EXC`.
fn short_status(name: &str) -> &str {
    let s = name.strip_prefix("IBV_WC_").unwrap_or(name);
    s.strip_suffix("_ERR").unwrap_or(s)
}

fn errors_cell(completions: &BTreeMap<String, u64>) -> String {
    let errors: Vec<String> = completions
        .iter()
        .filter(|(k, v)| k.as_str() != "IBV_WC_SUCCESS" && **v > 0)
        .map(|(k, v)| format!("{} {v}", short_status(k)))
        .collect();
    if errors.is_empty() {
        "-".to_owned()
    } else {
        errors.join(", ")
    }
}

const ERRORS_WIDTH: usize = 22;

fn header_line(plan_width: usize) -> String {
    format!(
        "{:>4} {:>15} {:<14} {:<pw$} {:>7} {:<ew$} {:>6} verdict",
        "run",
        "seed",
        "workload",
        "plan",
        "ops ok",
        "errors",
        "retx",
        pw = plan_width.max(4),
        ew = ERRORS_WIDTH
    )
}

fn row_line(row: &RunRow, plan_width: usize) -> String {
    let mut verdict = match row.verdict.as_str() {
        "FAIL" => format!("FAIL ({} violations)", row.violations),
        v => v.to_owned(),
    };
    if let (Some(p), Some(state)) = (row.plan.process, &row.process_fault) {
        if state != "applied" {
            verdict += &format!(" ({} not reached)", p.action);
        }
    }
    let ran = matches!(row.verdict.as_str(), "pass" | "FAIL");
    let dash = |v: u64| if ran { v.to_string() } else { "-".to_owned() };
    format!(
        "{:>4} {:>15} {:<14} {:<pw$} {:>7} {:<ew$} {:>6} {verdict}",
        row.index,
        row.seed,
        row.workload,
        row.plan_summary,
        dash(row.ops_ok),
        if ran {
            errors_cell(&row.completions)
        } else {
            "-".to_owned()
        },
        dash(row.retransmits),
        pw = plan_width.max(4),
        ew = ERRORS_WIDTH
    )
}

/// The totals, the failing runs with their replay commands, and the result line.
fn render_end(r: &CampaignReport) -> String {
    let mut s = String::new();
    let t = &r.totals;
    if r.dry_run {
        let _ = writeln!(
            s,
            "dry run: {} plans written to {}",
            r.rows.len(),
            Path::new(&r.run_dir).join("plans").display()
        );
        return s;
    }
    let faults: Vec<String> = t
        .process_faults
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    let _ = writeln!(
        s,
        "totals: {} runs: {} passed, {} failed ({} violations), {} could not run{}; {:.1} s",
        t.runs,
        t.passed,
        t.failed,
        t.violations,
        t.harness_errors,
        if t.not_run > 0 {
            format!(", {} not run", t.not_run)
        } else {
            String::new()
        },
        r.elapsed_ms as f64 / 1000.0
    );
    let _ = writeln!(
        s,
        "        {} ops ok; errors: {}; {} retransmits; injected: {} dropped, {} duplicated, {} \
         corrupted; process faults applied: {}",
        t.ops_ok,
        errors_cell(&t.completions),
        t.retransmits,
        t.dropped,
        t.duplicated,
        t.corrupted,
        match (faults.is_empty(), t.process_faults_skipped) {
            (true, 0) => "none".to_owned(),
            (_, 0) => faults.join(", "),
            (_, skipped) => format!(
                "{} ({skipped} not reached: the workload ended first)",
                if faults.is_empty() {
                    "none".to_owned()
                } else {
                    faults.join(", ")
                }
            ),
        }
    );
    for row in r
        .rows
        .iter()
        .filter(|x| x.verdict == "FAIL" || x.verdict == "ERROR")
    {
        let _ = writeln!(
            s,
            "run {} {} (seed {}, {}, plan {})",
            row.index, row.verdict, row.seed, row.workload, row.plan_summary
        );
        for f in &row.failed_invariants {
            let _ = writeln!(s, "    {f}");
        }
        for e in &row.harness_errors {
            let _ = writeln!(s, "    harness error: {e}");
        }
        let _ = writeln!(s, "    replay: {}", row.replay);
        if let Some(e) = &row.evidence {
            let _ = writeln!(s, "    evidence: {e}");
        }
        if let Some(l) = &row.ladder {
            let _ = writeln!(s, "    ladder: {l}");
        }
    }
    let result = match r.exit_code {
        EXIT_PASS => "PASS".to_owned(),
        EXIT_VIOLATION => format!("FAIL ({} of {} runs violated)", t.failed, t.runs),
        _ => format!(
            "ERROR ({} runs could not run, {} not run)",
            t.harness_errors, t.not_run
        ),
    };
    let _ = writeln!(s, "result: {result} (campaign seed {})", r.seed);
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn run_seeds_are_a_function_of_the_campaign_seed() {
        let a = run_seeds(1, 10, WorkloadChoice::Cycle);
        assert_eq!(a, run_seeds(1, 10, WorkloadChoice::Cycle));
        assert_ne!(a, run_seeds(2, 10, WorkloadChoice::Cycle));
        // The workload choice does not move the seeds; a longer campaign extends a shorter one.
        let drawn = run_seeds(1, 10, WorkloadChoice::Draw);
        assert!(a.iter().zip(&drawn).all(|(x, y)| x.0 == y.0));
        assert_eq!(&run_seeds(1, 20, WorkloadChoice::Cycle)[..10], &a[..]);
        assert_eq!(a[0].1, Workload::Pingpong);
        assert_eq!(a[4].1, Workload::Mixed);
        assert_eq!(a[5].1, Workload::Pingpong);
        let kinds: std::collections::BTreeSet<_> = run_seeds(3, 50, WorkloadChoice::Draw)
            .into_iter()
            .map(|(_, w)| w.name())
            .collect();
        assert_eq!(kinds.len(), 5);
    }

    #[test]
    fn shards_partition_the_runs() {
        assert_eq!(shard_arg("2/3"), Ok(Shard { index: 2, count: 3 }));
        for bad in ["0/3", "4/3", "3", "1/0", "x/2", ""] {
            assert!(shard_arg(bad).is_err(), "{bad}");
        }
        let shards: Vec<Shard> = (1..=3).map(|k| Shard { index: k, count: 3 }).collect();
        for run in 0..10 {
            let owners: Vec<u32> = shards
                .iter()
                .filter(|s| s.owns(run))
                .map(|s| s.index)
                .collect();
            assert_eq!(owners, [run % 3 + 1]);
        }
    }

    #[test]
    fn workload_choice_parses() {
        assert_eq!(workload_choice("cycle"), Ok(WorkloadChoice::Cycle));
        assert_eq!(
            workload_choice("atomic-counter"),
            Ok(WorkloadChoice::Fixed(Workload::AtomicCounter))
        );
        assert!(
            workload_choice("chaos")
                .unwrap_err()
                .contains("cycle, draw")
        );
    }

    #[test]
    fn default_run_args_are_the_cli_defaults() {
        let a = default_run_args().unwrap();
        assert_eq!((a.qp_timeout, a.retry_cnt, a.nodes), (14, 7, 3));
    }

    #[test]
    fn short_status_names() {
        assert_eq!(short_status("IBV_WC_RETRY_EXC_ERR"), "RETRY_EXC");
        assert_eq!(short_status("IBV_WC_WR_FLUSH_ERR"), "WR_FLUSH");
        let mut c = BTreeMap::new();
        c.insert("IBV_WC_SUCCESS".to_owned(), 5);
        assert_eq!(errors_cell(&c), "-");
        c.insert("IBV_WC_WR_FLUSH_ERR".to_owned(), 2);
        assert_eq!(errors_cell(&c), "WR_FLUSH 2");
    }
}
