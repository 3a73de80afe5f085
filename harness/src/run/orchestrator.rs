//! The orchestrator of `softverbs run`: validates the flags and the plan (before anything is
//! started), starts the node processes, brokers their setup, applies process faults, stops
//! the run within its bounds, checks the evidence and reports.
//!
//! Every child is held in a guard that kills (SIGCONT first if stopped, then SIGKILL) and
//! reaps it when the orchestrator returns or unwinds; nodes also exit by themselves when
//! their stdin closes or their deadline passes.

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::run::check::{self, Evidence, NodeFacts};
use crate::run::layout::{self, Workload};
use crate::run::log::{Entry, OpKind, read_log};
use crate::run::node::unix_ms;
use crate::run::plan::{self, ProcessAction, ProcessFault, RunPlan, Trigger, format_duration};
use crate::run::proto::{FromNode, NodeConfig, NodeSummary, PeerInfo, QpParams, ToNode};
use crate::run::report::{Detection, FaultReport, NodeReport, PlanInfo, QpInfo, Report, render};
use crate::run::selftest::{self, SelfTest};
use crate::run::{CmMode, EXIT_HARNESS, EXIT_PASS, EXIT_USAGE, EXIT_VIOLATION, RunArgs, signal};

/// How long setup (spawn, hello, connect) may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long nodes get to exit after `exit`.
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// A validated run.
#[derive(Clone, Debug)]
struct Config {
    nodes: u32,
    workload: Workload,
    qps_per_peer: u32,
    cm: CmMode,
    seed: u64,
    ops: Option<u64>,
    duration: Option<Duration>,
    plan: RunPlan,
    plan_path: Option<PathBuf>,
    pcap_dir: Option<PathBuf>,
    run_dir: PathBuf,
    qp: QpParams,
    slack: Duration,
    timeout: Duration,
    self_test_corrupt: bool,
    self_test: Option<SelfTest>,
    exe: PathBuf,
}

/// How a run is driven from inside this process: `softverbs run` uses the defaults, while
/// `softverbs campaign` and `softverbs demo` give the plan text, silence the run's own output
/// and place its progress bar.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The plan file's text, read instead of the file named by [`RunArgs::faults`] (which then
    /// only names the plan in the report and the replay command).
    pub plan_text: Option<String>,
    /// Print nothing (no start line, no summary): the caller renders the [`Report`].
    pub quiet: bool,
    /// Where the progress bar of the workload phase is drawn.
    pub progress: Progress,
}

/// Where a run draws its progress bar. Every bar is drawn on stderr and only when stderr is a
/// terminal (indicatif hides it otherwise), so logs and tests never see it.
#[derive(Clone, Debug, Default)]
pub enum Progress {
    /// No bar.
    Hidden,
    /// A bar of its own on stderr.
    #[default]
    Stderr,
    /// A bar added to the caller's group of bars (removed again when the run ends).
    In(indicatif::MultiProgress),
}

/// Why a run produced no report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunError {
    /// Invalid flags or plan: nothing was started (exit code 2).
    Usage(String),
    /// The harness could not run: a node failed to start or connect. Every process was
    /// stopped and reaped; the evidence is in `run_dir` (exit code 3).
    Harness {
        /// What went wrong.
        message: String,
        /// The run directory.
        run_dir: PathBuf,
    },
}

impl RunError {
    /// The exit code `softverbs run` returns for this error: [`EXIT_USAGE`] or
    /// [`EXIT_HARNESS`].
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Usage(_) => EXIT_USAGE,
            RunError::Harness { .. } => EXIT_HARNESS,
        }
    }
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Usage(m) => f.write_str(m),
            RunError::Harness { message, run_dir } => write!(
                f,
                "{message}; every node process was stopped; evidence in {}",
                run_dir.display()
            ),
        }
    }
}

impl std::error::Error for RunError {}

/// Runs `softverbs run`; returns the exit code.
pub fn run(args: &RunArgs) -> u8 {
    let report = match execute(args, &Options::default()) {
        Ok(r) => r,
        Err(RunError::Usage(e)) => {
            eprintln!("softverbs run: {e}");
            return EXIT_USAGE;
        }
        Err(RunError::Harness { message, run_dir }) => {
            eprintln!("softverbs run: {message}");
            eprintln!(
                "softverbs run: every node process was stopped; evidence in {}",
                run_dir.display()
            );
            return EXIT_HARNESS;
        }
    };
    let mut report = report;
    if report.passed && args.run_dir.is_none() && !args.keep {
        // The private directory this run created, and nothing else.
        match std::fs::remove_dir_all(&report.run_dir) {
            Ok(()) => report.run_dir = REMOVED.to_owned(),
            Err(e) => eprintln!("softverbs run: cannot remove {}: {e}", report.run_dir),
        }
    }
    print!("{}", render(&report));
    if let Some(path) = &args.report {
        if let Err(e) = write_report(&report, path) {
            eprintln!("softverbs run: {e}");
            return EXIT_HARNESS;
        }
    }
    report.exit_code
}

/// What the report says for the run dir of a passing run whose evidence was removed.
pub const REMOVED: &str = "removed after the pass (keep it with --keep or --run-dir DIR)";

/// Writes `report` as pretty JSON to `path`. Errors name the file.
pub fn write_report(report: &Report, path: &Path) -> Result<(), String> {
    serde_json::to_vec_pretty(report)
        .map_err(|e| e.to_string())
        .and_then(|j| std::fs::write(path, j).map_err(|e| e.to_string()))
        .map_err(|e| format!("cannot write the report {}: {e}", path.display()))
}

/// Runs one fault-injection run as `softverbs run` does — validate, start the nodes, run the
/// workload with its faults, stop everything, check the evidence — and returns its report
/// (whose `exit_code` is 0 or 1) without printing it or writing `args.report`.
///
/// Errors: [`RunError::Usage`] for invalid flags or plan (nothing was started, not even the
/// run directory); [`RunError::Harness`] when the nodes could not be started or connected.
/// Every child process is reaped before this returns, in every case.
pub fn execute(args: &RunArgs, opts: &Options) -> Result<Report, RunError> {
    let cfg = validate(args, opts.plan_text.as_deref()).map_err(RunError::Usage)?;
    let started = Instant::now();
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut orch = Orchestrator {
        procs: Procs(Vec::new()),
        nodes: (0..cfg.nodes).map(|_| NodeState::default()).collect(),
        faults: cfg
            .plan
            .process
            .iter()
            .map(|f| (f.clone(), FaultState::Pending))
            .collect(),
        harness_errors: Vec::new(),
        tx,
        rx,
        cfg,
        t0: None,
        resumes: Vec::new(),
    };
    if !opts.quiet {
        eprintln!(
            "softverbs run: {} nodes, {}, seed {}, run dir {}",
            orch.cfg.nodes,
            orch.cfg.workload.name(),
            orch.cfg.seed,
            orch.cfg.run_dir.display()
        );
    }
    if let Err(message) = orch.setup() {
        orch.procs.kill_all();
        return Err(RunError::Harness {
            message,
            run_dir: orch.cfg.run_dir.clone(),
        });
    }
    orch.workload_phase(&opts.progress);
    orch.shutdown();
    if orch.cfg.self_test_corrupt {
        match corrupt_evidence(&orch.cfg) {
            Ok(what) => {
                if !opts.quiet {
                    eprintln!("softverbs run: self-test: corrupted {what}");
                }
            }
            Err(e) => orch
                .harness_errors
                .push(format!("self-test corruption failed: {e}")),
        }
    }
    if let Some(kind) = orch.cfg.self_test {
        let run = selftest::Run {
            dir: &orch.cfg.run_dir,
            nodes: orch.cfg.nodes,
            workload: orch.cfg.workload,
            qps_per_peer: orch.cfg.qps_per_peer,
        };
        match selftest::plant(kind, run) {
            Ok(what) if !opts.quiet => eprintln!("softverbs run: self-test: planted {what}"),
            Ok(_) => {}
            Err(e) => orch.harness_errors.push(e),
        }
    }
    Ok(orch.report(started))
}

fn validate(args: &RunArgs, plan_text: Option<&str>) -> Result<Config, String> {
    let seed = args.seed.unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        layout::mix(nanos ^ u64::from(std::process::id())) >> 16
    });
    let plan = match (&args.faults, plan_text) {
        (None, None) => RunPlan::empty(seed),
        (None, Some(text)) => plan::parse(text, seed, args.nodes).map_err(|e| e.to_string())?,
        (Some(path), Some(text)) => {
            plan::parse(text, seed, args.nodes).map_err(|e| format!("{}: {e}", path.display()))?
        }
        (Some(path), None) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the plan file {}: {e}", path.display()))?;
            plan::parse(&text, seed, args.nodes).map_err(|e| format!("{}: {e}", path.display()))?
        }
    };
    check_qps_per_peer(args)?;
    check_cm(args)?;
    if let Some(d) = &args.run_dir {
        check_given_run_dir(d)?;
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
    let run_dir = match &args.run_dir {
        Some(d) => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)
                .map_err(|e| format!("cannot create the run dir {}: {e}", d.display()))?;
            d.clone()
        }
        None => private_dir(&std::env::temp_dir(), &format!("softverbs-run-{seed}-"))?,
    };
    if let Some(d) = &args.pcap_dir {
        std::fs::create_dir_all(d)
            .map_err(|e| format!("cannot create the pcap dir {}: {e}", d.display()))?;
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let ops = match (args.ops, args.duration) {
        (None, None) => Some(500),
        (ops, _) => ops,
    };
    let timeout = args.timeout.unwrap_or_else(|| match args.duration {
        Some(d) => d + Duration::from_secs(60),
        None => Duration::from_secs(120),
    });
    Ok(Config {
        nodes: args.nodes,
        workload: args.workload,
        qps_per_peer: args.qps_per_peer,
        cm: args.cm,
        seed,
        ops,
        duration: args.duration,
        plan,
        plan_path: args.faults.clone(),
        pcap_dir: args.pcap_dir.clone(),
        run_dir,
        qp: QpParams {
            timeout: args.qp_timeout,
            retry_cnt: args.retry_cnt,
            rnr_retry: args.rnr_retry,
            recovery: args.recovery,
        },
        slack: args.slack,
        timeout,
        self_test_corrupt: args.self_test_corrupt,
        self_test: args.self_test,
        exe,
    })
}

/// Refuses `--cm rdma` where a link is not one RC QP: UD workloads, `--qps-per-peer` above 1.
pub(crate) fn check_cm(args: &RunArgs) -> Result<(), String> {
    if args.cm == CmMode::Rdma && (args.workload.is_ud() || args.qps_per_peer > 1) {
        return Err("--cm rdma: one RC QP per peer only (not ud-send, not --qps-per-peer)".into());
    }
    Ok(())
}

/// Refuses a `--qps-per-peer` the workload or a node's region cannot take: UD (its links are
/// datagram QPs), or more links (peers × QPs per peer) on a node than it has fin words for.
pub(crate) fn check_qps_per_peer(args: &RunArgs) -> Result<(), String> {
    let q = args.qps_per_peer;
    if q == 1 {
        return Ok(());
    }
    if args.workload.is_ud() {
        return Err(format!(
            "--qps-per-peer {q}: the {} workload has one UD QP per link",
            args.workload.name()
        ));
    }
    let most = (0..args.nodes)
        .map(|i| layout::peers(args.nodes, args.workload, i).len() as u64)
        .max()
        .unwrap_or(0);
    if most * u64::from(q) > layout::MAX_LINKS {
        return Err(format!(
            "--qps-per-peer {q}: a node of this run has {most} peers, so {} QPs; a node holds at \
             most {}",
            most * u64::from(q),
            layout::MAX_LINKS
        ));
    }
    Ok(())
}

/// Refuses a `--run-dir` that is a symbolic link (evidence would be written wherever it
/// points) or that exists and is not empty (evidence of two runs would mix).
fn check_given_run_dir(run_dir: &Path) -> Result<(), String> {
    let meta = match std::fs::symlink_metadata(run_dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("run dir {}: {e}", run_dir.display())),
    };
    if meta.file_type().is_symlink() {
        return Err(format!(
            "run dir {} is a symbolic link; give the directory itself",
            run_dir.display()
        ));
    }
    let mut entries =
        std::fs::read_dir(run_dir).map_err(|e| format!("run dir {}: {e}", run_dir.display()))?;
    if entries.next().is_some() {
        return Err(format!(
            "run dir {} is not empty (evidence of two runs would mix); give an empty or new \
             directory",
            run_dir.display()
        ));
    }
    Ok(())
}

/// Creates a new directory `parent/prefix<random>`, mode 0700, with an unguessable name
/// (128 bits from the OS's random source). `mkdir` never follows a symbolic link and fails on
/// any existing name, so a name planted in advance (a symlink, a directory of another user)
/// is never used; it tries other names.
pub(crate) fn private_dir(parent: &Path, prefix: &str) -> Result<PathBuf, String> {
    let mut last = None;
    for _ in 0..8 {
        let mut bytes = [0u8; 16];
        File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
        let name: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let path = parent.join(format!("{prefix}{name}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(format!("cannot create the run dir {}: {e}", path.display())),
        }
    }
    Err(format!(
        "cannot create a run dir in {}: {}",
        parent.display(),
        last.map_or_else(String::new, |e| e.to_string())
    ))
}

/// One child process.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    index: u32,
    generation: u32,
    alive: bool,
    paused: bool,
    killed: bool,
    done: bool,
    status: Option<ExitStatus>,
}

/// Every child; dropping it kills and reaps the live ones.
struct Procs(Vec<Proc>);

impl Procs {
    fn kill_all(&mut self) {
        for p in &mut self.0 {
            if p.alive {
                if p.paused {
                    let _ = signal(p.child.id(), libc::SIGCONT);
                }
                let _ = p.child.kill();
                p.status = p.child.wait().ok();
                p.alive = false;
                p.killed = true;
            }
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.kill_all();
    }
}

enum Event {
    Msg(usize, Box<FromNode>),
    Garbage(usize, String),
    Closed(usize),
}

/// What a node said in its hello: device address, MR, and its QP per peer.
#[derive(Clone, Debug)]
struct Hello {
    addr: String,
    mr: String,
    endpoints: Vec<(u32, String)>,
}

#[derive(Clone, Debug, Default)]
struct NodeState {
    /// Slot of the first process (the one that runs the workload).
    gen0: Option<usize>,
    /// Slot of the newest process.
    current: Option<usize>,
    processes: u32,
    hello: Option<Hello>,
    connected: bool,
    ops: u64,
    finished: bool,
    summary: Option<Box<NodeSummary>>,
    error: Option<String>,
    killed_at: Option<u64>,
    timed_out: bool,
    pauses: Vec<(u64, u64)>,
    /// Problems the node reported as it went (all of them are in `summary` if it drained).
    problems: Vec<String>,
}

impl NodeState {
    /// Every problem the node reported: all of them are in its summary if it drained; a node
    /// killed before that reported them as it went (`problems` messages).
    fn problems(&self) -> Vec<String> {
        self.summary
            .as_ref()
            .map_or_else(|| self.problems.clone(), |s| s.problems.clone())
    }
}

#[derive(Clone, Debug)]
enum FaultState {
    Pending,
    Applied(u64),
    Skipped(String),
}

struct Orchestrator {
    cfg: Config,
    procs: Procs,
    nodes: Vec<NodeState>,
    faults: Vec<(ProcessFault, FaultState)>,
    harness_errors: Vec<String>,
    tx: Sender<Event>,
    rx: Receiver<Event>,
    t0: Option<Instant>,
    /// Paused slots and when to resume them.
    resumes: Vec<(usize, Instant)>,
}

impl Orchestrator {
    fn node_config(&self, index: u32, generation: u32, standby: bool) -> NodeConfig {
        let budget = self.cfg.qp.retry_budget();
        let deadline =
            SETUP_TIMEOUT + self.cfg.timeout + budget * 2 + self.cfg.slack * 2 + EXIT_TIMEOUT * 4;
        let plan = &self.cfg.plan.network;
        NodeConfig {
            index,
            generation,
            nodes: self.cfg.nodes,
            workload: self.cfg.workload,
            qps_per_peer: self.cfg.qps_per_peer,
            cm: self.cfg.cm == CmMode::Rdma,
            seed: self.cfg.seed,
            ops: self.cfg.ops,
            duration_ms: self.cfg.duration.map(|d| d.as_millis() as u64),
            run_dir: self.cfg.run_dir.clone(),
            plan: (!plan.rules.is_empty()).then(|| plan.to_toml()),
            qp: self.cfg.qp,
            slack_ms: self.cfg.slack.as_millis() as u64,
            standby,
            deadline_ms: deadline.as_millis() as u64,
            pcap: self
                .cfg
                .pcap_dir
                .as_ref()
                .map(|d| d.join(layout::pcap_file(index, generation))),
        }
    }

    fn spawn(&mut self, index: u32, generation: u32, standby: bool) -> Result<usize, String> {
        let stderr_path = self
            .cfg
            .run_dir
            .join(layout::stderr_file(index, generation));
        let stderr = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&stderr_path)
            .map_err(|e| format!("cannot create {}: {e}", stderr_path.display()))?;
        let mut child = Command::new(&self.cfg.exe)
            .arg("node")
            .envs(crate::run::trace::node_env(
                &self.cfg.run_dir,
                index,
                generation,
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start node {index}: {e}"))?;
        let slot = self.procs.0.len();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        self.procs.0.push(Proc {
            child,
            stdin,
            index,
            generation,
            alive: true,
            paused: false,
            killed: false,
            done: false,
            status: None,
        });
        let Some(stdout) = stdout else {
            return Err(format!("node {index}: no stdout pipe"));
        };
        let tx = self.tx.clone();
        std::thread::Builder::new()
            .name(format!("node{index}.g{generation}"))
            .spawn(move || read_node(slot, stdout, &tx))
            .map_err(|e| format!("cannot start a reader thread: {e}"))?;
        let state = &mut self.nodes[index as usize];
        state.processes += 1;
        state.current = Some(slot);
        if generation == 0 {
            state.gen0 = Some(slot);
        }
        let config = self.node_config(index, generation, standby);
        self.send(slot, &ToNode::Config(config));
        Ok(slot)
    }

    /// Writes a message to a child's stdin; false if it is gone.
    fn send(&mut self, slot: usize, msg: &ToNode) -> bool {
        let Some(p) = self.procs.0.get_mut(slot) else {
            return false;
        };
        let Some(stdin) = p.stdin.as_mut() else {
            return false;
        };
        let Ok(mut line) = serde_json::to_vec(msg) else {
            return false;
        };
        line.push(b'\n');
        stdin.write_all(&line).and_then(|()| stdin.flush()).is_ok()
    }

    fn handle(&mut self, ev: Event) {
        let (slot, msg) = match ev {
            Event::Msg(slot, m) => (slot, *m),
            Event::Garbage(slot, line) => {
                let who = self.who(slot);
                self.node_error(
                    slot,
                    format!("{who} sent an unreadable control line: {line}"),
                );
                return;
            }
            Event::Closed(slot) => {
                // Its stdout closed: it exited (or is about to); reap it if it has.
                if let Some(p) = self.procs.0.get_mut(slot) {
                    if p.alive {
                        if let Ok(Some(status)) = p.child.try_wait() {
                            p.alive = false;
                            p.status = Some(status);
                        }
                    }
                }
                return;
            }
        };
        let Some(p) = self.procs.0.get_mut(slot) else {
            return;
        };
        let (index, gen0) = (p.index as usize, p.generation == 0);
        if let FromNode::Done(_) = &msg {
            p.done = true;
        }
        let state = &mut self.nodes[index];
        match msg {
            FromNode::Hello {
                addr,
                mr,
                endpoints,
            } if gen0 => {
                let endpoints = endpoints
                    .into_iter()
                    .map(|e| (e.peer, e.endpoint))
                    .collect();
                state.hello = Some(Hello {
                    addr,
                    mr,
                    endpoints,
                });
            }
            FromNode::Connected if gen0 => state.connected = true,
            FromNode::Progress { ops } if gen0 => state.ops = ops,
            FromNode::Finished { ops } if gen0 => {
                state.ops = ops;
                state.finished = true;
            }
            FromNode::Problems { problems } if gen0 => state.problems.extend(problems),
            FromNode::Done(summary) if gen0 => state.summary = Some(summary),
            FromNode::Error { message } => self.node_error(slot, message),
            _ => {}
        }
    }

    fn who(&self, slot: usize) -> String {
        self.procs.0.get(slot).map_or_else(
            || "a node".to_owned(),
            |p| {
                if p.generation == 0 {
                    format!("node {}", p.index)
                } else {
                    format!("node {} (restart {})", p.index, p.generation)
                }
            },
        )
    }

    fn node_error(&mut self, slot: usize, message: String) {
        let Some(p) = self.procs.0.get(slot) else {
            return;
        };
        if p.generation == 0 {
            self.nodes[p.index as usize].error.get_or_insert(message);
        } else {
            let who = self.who(slot);
            self.harness_errors.push(format!("{who}: {message}"));
        }
    }

    /// Reaps children that exited.
    fn reap(&mut self) {
        for p in &mut self.procs.0 {
            if p.alive {
                if let Ok(Some(status)) = p.child.try_wait() {
                    p.alive = false;
                    p.status = Some(status);
                }
            }
        }
    }

    fn stderr_tail(&self, index: u32, generation: u32) -> String {
        let path = self
            .cfg
            .run_dir
            .join(layout::stderr_file(index, generation));
        let mut text = String::new();
        if let Ok(f) = File::open(&path) {
            let _ = f.take(64 * 1024).read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().rev().take(5).collect();
        let tail: Vec<&str> = lines.into_iter().rev().collect();
        format!("{} says: {}", path.display(), tail.join(" | "))
    }

    /// Waits until `done(self)` holds, failing if a first-generation node dies or errs.
    fn wait_setup(
        &mut self,
        what: &str,
        done: impl Fn(&Orchestrator) -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + SETUP_TIMEOUT;
        loop {
            if done(self) {
                return Ok(());
            }
            for (i, n) in self.nodes.iter().enumerate() {
                if let Some(e) = &n.error {
                    return Err(format!(
                        "node {i} failed while {what}: {e} ({})",
                        self.stderr_tail(i as u32, 0)
                    ));
                }
                if let Some(slot) = n.gen0 {
                    let p = &self.procs.0[slot];
                    if !p.alive {
                        let status = p
                            .status
                            .map_or_else(|| "unknown status".into(), |s| s.to_string());
                        return Err(format!(
                            "node {i} exited ({status}) while {what} ({})",
                            self.stderr_tail(i as u32, 0)
                        ));
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let missing: Vec<usize> = (0..self.nodes.len())
                    .filter(|&i| !node_ready(self, i, what))
                    .collect();
                return Err(format!(
                    "timed out after {SETUP_TIMEOUT:?} while {what}; nodes {missing:?} did not answer"
                ));
            }
            match self.rx.recv_timeout(left.min(Duration::from_millis(50))) {
                Ok(ev) => self.handle(ev),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Err("internal channel closed".into()),
            }
            self.reap();
        }
    }

    fn setup(&mut self) -> Result<(), String> {
        for i in 0..self.cfg.nodes {
            self.spawn(i, 0, false)?;
        }
        self.wait_setup("starting", |o| o.nodes.iter().all(|n| n.hello.is_some()))?;
        let n = self.cfg.nodes;
        for i in 0..n {
            let mut peers = Vec::new();
            for j in layout::peers(n, self.cfg.workload, i) {
                if j == i {
                    continue;
                }
                let Some(hello) = &self.nodes[j as usize].hello else {
                    return Err(format!("node {j} sent no hello"));
                };
                let endpoint = hello
                    .endpoints
                    .iter()
                    .find(|(p, _)| *p == i)
                    .map(|(_, e)| e.clone())
                    .ok_or_else(|| format!("node {j} has no QP for node {i}"))?;
                peers.push(PeerInfo {
                    index: j,
                    addr: hello.addr.clone(),
                    endpoint,
                    mr: hello.mr.clone(),
                });
            }
            if let Some(slot) = self.nodes[i as usize].gen0 {
                self.send(slot, &ToNode::Peers { peers });
            }
        }
        self.wait_setup("connecting", |o| o.nodes.iter().all(|n| n.connected))?;
        for i in 0..n as usize {
            if let Some(slot) = self.nodes[i].gen0 {
                self.send(slot, &ToNode::Start);
            }
        }
        self.t0 = Some(Instant::now());
        Ok(())
    }

    fn elapsed(&self) -> Duration {
        self.t0.map_or(Duration::ZERO, |t| t.elapsed())
    }

    fn gen0_alive(&self, i: usize) -> bool {
        self.nodes[i].gen0.is_some_and(|s| self.procs.0[s].alive)
    }

    fn workload_phase(&mut self, progress: &Progress) {
        let hard = self.t0.unwrap_or_else(Instant::now) + self.cfg.timeout;
        let bar = self.progress_bar(progress);
        let mut last_draw = Instant::now();
        loop {
            match self.rx.recv_timeout(Duration::from_millis(5)) {
                Ok(ev) => {
                    self.handle(ev);
                    while let Ok(ev) = self.rx.try_recv() {
                        self.handle(ev);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.reap();
            self.apply_faults();
            self.resume_due(false);
            if let Some(bar) = &bar {
                if last_draw.elapsed() >= Duration::from_millis(100) {
                    self.update_bar(bar);
                    last_draw = Instant::now();
                }
            }
            let all_over =
                (0..self.nodes.len()).all(|i| self.nodes[i].finished || !self.gen0_alive(i));
            if all_over && self.resumes.is_empty() {
                break;
            }
            if Instant::now() >= hard {
                let late: Vec<usize> = (0..self.nodes.len())
                    .filter(|&i| !self.nodes[i].finished && self.gen0_alive(i))
                    .collect();
                self.harness_errors.push(format!(
                    "hard timeout after {}: nodes {late:?} had not finished and were killed",
                    format_duration(self.cfg.timeout)
                ));
                for i in late {
                    self.nodes[i].timed_out = true;
                    if let Some(slot) = self.nodes[i].gen0 {
                        self.kill_slot(slot);
                    }
                }
                break;
            }
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
            if let Progress::In(multi) = progress {
                multi.remove(&bar);
            }
        }
        for (f, state) in &mut self.faults {
            if matches!(state, FaultState::Pending) {
                *state = FaultState::Skipped(format!(
                    "not reached: the workload ended before {}",
                    f.trigger
                ));
            }
        }
    }

    /// The workload phase's bar: operations done of the target (`--ops`), or time elapsed of
    /// `--duration`; per-node operations and states in its message.
    fn progress_bar(&self, progress: &Progress) -> Option<indicatif::ProgressBar> {
        use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
        let (len, template) = match (self.cfg.ops, self.cfg.duration) {
            (_, Some(d)) => (
                d.as_millis() as u64,
                "{prefix} [{bar:30}] {pos}/{len} ms  {msg}",
            ),
            (Some(ops), None) => (
                ops.saturating_mul(u64::from(self.cfg.nodes)),
                "{prefix} [{bar:30}] {pos}/{len} ops  {msg}",
            ),
            (None, None) => return None,
        };
        let bar = match progress {
            Progress::Hidden => return None,
            Progress::Stderr => {
                ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
            }
            Progress::In(multi) => multi.add(ProgressBar::new(len)),
        };
        if bar.is_hidden() {
            return None;
        }
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(format!(
            "{} seed {}",
            self.cfg.workload.name(),
            self.cfg.seed
        ));
        Some(bar)
    }

    fn update_bar(&self, bar: &indicatif::ProgressBar) {
        let pos = match self.cfg.duration {
            Some(_) => self.elapsed().as_millis() as u64,
            None => self.nodes.iter().map(|n| n.ops).sum(),
        };
        bar.set_position(pos.min(bar.length().unwrap_or(u64::MAX)));
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let paused = n.current.is_some_and(|s| self.procs.0[s].paused);
                let state = if n.killed_at.is_some() {
                    " killed"
                } else if paused {
                    " paused"
                } else if n.finished {
                    " done"
                } else {
                    ""
                };
                format!("n{i} {}{state}", n.ops)
            })
            .collect();
        bar.set_message(nodes.join(" | "));
    }

    fn kill_slot(&mut self, slot: usize) -> u64 {
        let at = unix_ms();
        if let Some(p) = self.procs.0.get_mut(slot) {
            if p.alive {
                let _ = p.child.kill();
                p.status = p.child.wait().ok();
                p.alive = false;
                p.killed = true;
                p.paused = false;
            }
        }
        self.resumes.retain(|(s, _)| *s != slot);
        at
    }

    fn apply_faults(&mut self) {
        let elapsed = self.elapsed();
        for k in 0..self.faults.len() {
            let (fault, state) = &self.faults[k];
            if !matches!(state, FaultState::Pending) {
                continue;
            }
            let i = fault.node as usize;
            let due = match fault.trigger {
                Trigger::At(t) => elapsed >= t,
                Trigger::AfterOps(n) => self.nodes[i].ops >= n,
            };
            if !due {
                continue;
            }
            let fault = fault.clone();
            let at_ms = elapsed.as_millis() as u64;
            let result = self.apply(&fault);
            self.faults[k].1 = match result {
                Ok(()) => FaultState::Applied(at_ms),
                Err(why) => FaultState::Skipped(why),
            };
        }
    }

    fn apply(&mut self, fault: &ProcessFault) -> Result<(), String> {
        let i = fault.node as usize;
        let current = self.nodes[i].current;
        let alive = current.is_some_and(|s| self.procs.0[s].alive);
        match fault.action {
            ProcessAction::Kill => {
                let slot = current.filter(|_| alive).ok_or("the node is not running")?;
                let at = self.kill_slot(slot);
                if self.procs.0[slot].generation == 0 {
                    self.nodes[i].killed_at.get_or_insert(at);
                }
                Ok(())
            }
            ProcessAction::Pause => {
                let slot = current.filter(|_| alive).ok_or("the node is not running")?;
                if self.procs.0[slot].paused {
                    return Err("the node is already paused".into());
                }
                let pid = self.procs.0[slot].child.id();
                signal(pid, libc::SIGSTOP).map_err(|e| format!("SIGSTOP: {e}"))?;
                self.procs.0[slot].paused = true;
                let d = fault.duration.unwrap_or_default();
                self.resumes.push((slot, Instant::now() + d));
                if self.procs.0[slot].generation == 0 {
                    self.nodes[i].pauses.push((unix_ms(), d.as_millis() as u64));
                }
                Ok(())
            }
            ProcessAction::Restart => {
                if let Some(slot) = current.filter(|_| alive) {
                    let at = self.kill_slot(slot);
                    if self.procs.0[slot].generation == 0 {
                        self.nodes[i].killed_at.get_or_insert(at);
                    }
                }
                let generation = self.nodes[i].processes;
                self.spawn(fault.node, generation, true).map(|_| ())
            }
        }
    }

    /// SIGCONTs paused processes whose time has come (all of them if `all`).
    fn resume_due(&mut self, all: bool) {
        let now = Instant::now();
        let (due, keep): (Vec<_>, Vec<_>) = self
            .resumes
            .drain(..)
            .partition(|(_, at)| all || *at <= now);
        self.resumes = keep;
        for (slot, _) in due {
            if let Some(p) = self.procs.0.get_mut(slot) {
                if p.alive && p.paused {
                    if let Err(e) = signal(p.child.id(), libc::SIGCONT) {
                        self.harness_errors.push(format!("SIGCONT: {e}"));
                    }
                    p.paused = false;
                }
            }
        }
    }

    fn shutdown(&mut self) {
        self.resume_due(true);
        let live: Vec<usize> = (0..self.procs.0.len())
            .filter(|&s| self.procs.0[s].alive)
            .collect();
        for &slot in &live {
            self.send(slot, &ToNode::Quiesce);
        }
        let budget = self.cfg.qp.retry_budget();
        let deadline = Instant::now() + budget + self.cfg.slack + EXIT_TIMEOUT;
        while Instant::now() < deadline {
            self.reap();
            if live
                .iter()
                .all(|&s| !self.procs.0[s].alive || self.procs.0[s].done)
            {
                break;
            }
            match self.rx.recv_timeout(Duration::from_millis(10)) {
                Ok(ev) => self.handle(ev),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        for &slot in &live {
            self.send(slot, &ToNode::Exit);
            // Closing stdin is the second way to say exit.
            self.procs.0[slot].stdin = None;
        }
        let deadline = Instant::now() + EXIT_TIMEOUT;
        while Instant::now() < deadline && self.procs.0.iter().any(|p| p.alive) {
            self.reap();
            while let Ok(ev) = self.rx.try_recv() {
                self.handle(ev);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for slot in 0..self.procs.0.len() {
            if self.procs.0[slot].alive {
                let who = self.who(slot);
                self.harness_errors.push(format!(
                    "{who} did not exit within {EXIT_TIMEOUT:?}; killed"
                ));
                self.kill_slot(slot);
            }
        }
        while let Ok(ev) = self.rx.try_recv() {
            self.handle(ev);
        }
    }

    fn facts(&self) -> Vec<NodeFacts> {
        self.nodes
            .iter()
            .map(|n| {
                let proc = n.gen0.and_then(|s| self.procs.0.get(s));
                let exited_cleanly =
                    proc.is_some_and(|p| !p.killed && p.status.is_some_and(|s| s.success()));
                let end_note = proc.and_then(|p| {
                    if n.timed_out {
                        Some("killed at the hard timeout".to_owned())
                    } else if p.killed {
                        Some("killed after not exiting".to_owned())
                    } else {
                        p.status.filter(|s| !s.success()).map(|s| s.to_string())
                    }
                });
                NodeFacts {
                    killed_at: n.killed_at,
                    pauses: n.pauses.clone(),
                    finished: n.finished,
                    drained: n.summary.is_some(),
                    exited_cleanly,
                    end_note,
                    problems: n.problems(),
                    error: n.error.clone(),
                    timed_out: n.timed_out,
                    injected: n.summary.as_ref().map(|s| s.injected),
                }
            })
            .collect()
    }

    fn replay(&self) -> String {
        let c = &self.cfg;
        let mut cmd = format!(
            "softverbs run --nodes {} --workload {} --seed {}",
            c.nodes,
            c.workload.name(),
            c.seed
        );
        if c.qps_per_peer != 1 {
            cmd += &format!(" --qps-per-peer {}", c.qps_per_peer);
        }
        if c.cm == CmMode::Rdma {
            cmd += " --cm rdma";
        }
        if let Some(p) = &c.plan_path {
            cmd += &format!(" --faults {}", shell_quote(p));
        }
        match (c.ops, c.duration) {
            (_, Some(d)) => cmd += &format!(" --duration {}", format_duration(d)),
            (Some(o), None) => cmd += &format!(" --ops {o}"),
            (None, None) => {}
        }
        if c.qp.timeout != 14 {
            cmd += &format!(" --qp-timeout {}", c.qp.timeout);
        }
        if c.qp.retry_cnt != 7 {
            cmd += &format!(" --retry-cnt {}", c.qp.retry_cnt);
        }
        if c.qp.rnr_retry != 7 {
            cmd += &format!(" --rnr-retry {}", c.qp.rnr_retry);
        }
        if c.qp.recovery != crate::recovery::RecoveryArg::Ibta {
            cmd += &format!(" --recovery {}", c.qp.recovery.name());
        }
        if c.slack != Duration::from_millis(500) {
            cmd += &format!(" --slack {}", format_duration(c.slack));
        }
        if c.self_test_corrupt {
            cmd += " --self-test-corrupt";
        }
        if let Some(kind) = c.self_test {
            cmd += &format!(" --self-test {}", kind.name());
        }
        cmd
    }

    fn report(&self, started: Instant) -> Report {
        let c = &self.cfg;
        let expect_reason = if c.plan.expect_errors {
            Some("the plan says [harness] expect_errors = true".to_owned())
        } else {
            plan::retry_exhaustion_reason(&c.plan.network, &c.qp)
        };
        let evidence = Evidence {
            nodes: c.nodes,
            workload: c.workload,
            qps_per_peer: c.qps_per_peer,
            seed: c.seed,
            qp: c.qp,
            slack: c.slack,
            run_dir: c.run_dir.clone(),
            expect_errors: expect_reason.is_some(),
            max_copies: plan::max_copies(&c.plan.network),
            facts: self.facts(),
        };
        let result = check::check(&evidence);
        let node_reports = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let counts = result.counts.get(i).cloned().unwrap_or_default();
                let state = if n.timed_out {
                    "timed-out"
                } else if n.killed_at.is_some() {
                    "killed"
                } else if n.error.is_some() {
                    "failed"
                } else if n.summary.is_some() {
                    "finished"
                } else {
                    "unfinished"
                };
                NodeReport {
                    index: i as u32,
                    state: state.to_owned(),
                    processes: n.processes,
                    ops_ok: counts.ops_ok,
                    ops_failed: n.summary.as_ref().map(|s| s.ops_failed),
                    bytes: n.summary.as_ref().map(|s| s.bytes),
                    completions: counts.completions,
                    stats: n.summary.as_ref().map(|s| s.stats.clone()),
                    injected: n
                        .summary
                        .as_ref()
                        .map(|s| s.injected)
                        .filter(|_| !c.plan.network.rules.is_empty()),
                    log_lines: counts.lines,
                    log_truncated: counts.truncated,
                }
            })
            .collect();
        let process_faults = self
            .faults
            .iter()
            .map(|(f, s)| {
                let (status, at, note) = match s {
                    FaultState::Pending => ("pending", None, None),
                    FaultState::Applied(t) => ("applied", Some(*t), None),
                    FaultState::Skipped(why) => ("skipped", None, Some(why.clone())),
                };
                FaultReport {
                    fault: f.to_string(),
                    status: status.to_owned(),
                    applied_at_ms: at,
                    note,
                }
            })
            .collect();
        let violations = result.violations();
        let passed = violations == 0 && self.harness_errors.is_empty();
        let trace = crate::run::trace::collect(&c.run_dir, &result.invariants, violations > 0);
        let exit_code = if passed { EXIT_PASS } else { EXIT_VIOLATION };
        let budget = c.qp.retry_budget();
        Report {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            passed,
            exit_code,
            seed: c.seed,
            workload: c.workload.name().to_owned(),
            nodes: c.nodes,
            qps_per_peer: c.qps_per_peer,
            ops: c.ops,
            duration_ms: c.duration.map(|d| d.as_millis() as u64),
            plan: PlanInfo {
                file: c.plan_path.as_ref().map(|p| p.display().to_string()),
                hash: format!("{:#018x}", c.plan.network.hash()),
                network_seed: c.plan.network.seed,
                rules: c.plan.network.rules.len(),
                process: c.plan.process.iter().map(ToString::to_string).collect(),
                expect_errors: evidence.expect_errors,
                expect_errors_reason: expect_reason,
            },
            qp: QpInfo {
                timeout: c.qp.timeout,
                retry_cnt: c.qp.retry_cnt,
                rnr_retry: c.qp.rnr_retry,
                recovery: c.qp.recovery.name().to_owned(),
                ack_timeout_ms: c.qp.ack_timeout().as_secs_f64() * 1000.0,
                retry_budget_ms: budget.as_secs_f64() * 1000.0,
                detect_bound_ms: (budget + c.slack).as_millis() as u64,
            },
            run_dir: c.run_dir.display().to_string(),
            elapsed_ms: started.elapsed().as_millis() as u64,
            node_reports,
            process_faults,
            invariants: result.invariants,
            violations,
            detections: result
                .detections
                .iter()
                .map(|&(partner, dead, latency_ms)| Detection {
                    partner,
                    dead,
                    latency_ms,
                })
                .collect(),
            counters: result
                .counters
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            harness_errors: self.harness_errors.clone(),
            replay: self.replay(),
            trace,
            pcap: match &c.pcap_dir {
                Some(d) => format!(
                    "{}/node<i>.g<generation>.pcap: each node process's traffic, as its device \
                     sent it (after the plan's faults) and received it",
                    d.display()
                ),
                None => "off".to_owned(),
            },
        }
    }
}

fn node_ready(o: &Orchestrator, i: usize, what: &str) -> bool {
    let n = &o.nodes[i];
    if what == "starting" {
        n.hello.is_some()
    } else {
        n.connected
    }
}

fn read_node(slot: usize, stdout: std::process::ChildStdout, tx: &Sender<Event>) {
    let mut reader = BufReader::new(stdout);
    loop {
        let mut line = Vec::new();
        let read = (&mut reader)
            .take(crate::run::proto::MAX_LINE)
            .read_until(b'\n', &mut line);
        let ev = match read {
            Ok(0) | Err(_) => {
                let _ = tx.send(Event::Closed(slot));
                return;
            }
            Ok(_) => match serde_json::from_slice::<FromNode>(&line) {
                Ok(m) => Event::Msg(slot, Box::new(m)),
                Err(_) => {
                    let text = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                    Event::Garbage(slot, text.trim_end().to_owned())
                }
            },
        };
        if tx.send(ev).is_err() {
            return;
        }
    }
}

fn shell_quote(p: &Path) -> String {
    let s = p.display().to_string();
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,".contains(c))
    {
        s
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// `--self-test-corrupt`: flips one byte that a successful operation put at a target (the
/// first WRITE record, else SEND, READ landing, counter, or pattern).
fn corrupt_evidence(cfg: &Config) -> Result<String, String> {
    let n = cfg.nodes;
    let w = cfg.workload;
    let lp = |i: u32, j: u32, q: u32| layout::link_position(n, w, cfg.qps_per_peer, i, j, q);
    let mut target: Option<(u32, u64, String)> = None;
    'find: for i in 0..n {
        let Ok(log) = read_log(&cfg.run_dir.join(layout::log_file(i, 0))) else {
            continue;
        };
        for e in &log.entries {
            let Entry::Send {
                peer,
                qp,
                op,
                status: 0,
                seq,
                roff,
                loff,
                ..
            } = e
            else {
                continue;
            };
            let (file, off) = match op {
                OpKind::Write => {
                    let Some(pos) = lp(*peer, i, *qp) else {
                        continue;
                    };
                    let off = layout::link_base(pos)
                        + layout::WRITE_OFF
                        + roff.unwrap_or(0)
                        + layout::RECORD_HEADER as u64;
                    (*peer, off)
                }
                OpKind::Send => {
                    let Some(pos) = lp(*peer, i, *qp) else {
                        continue;
                    };
                    // A UD slot starts with the GRH (and a clean run fills slot k with
                    // datagram k).
                    let grh = if w.is_ud() { layout::UD_GRH } else { 0 };
                    let off = layout::link_base(pos)
                        + layout::RECV_OFF
                        + seq * layout::RECV_SLOT
                        + grh
                        + layout::RECORD_HEADER as u64 / 2;
                    (*peer, off)
                }
                OpKind::Read => {
                    let Some(pos) = lp(i, *peer, *qp) else {
                        continue;
                    };
                    (
                        i,
                        layout::link_base(pos) + layout::READ_OFF + loff.unwrap_or(0),
                    )
                }
                OpKind::Faa => (*peer, layout::COUNTER_OFF),
                OpKind::Fin => continue,
            };
            target = Some((file, off, format!("{op:?} of node {i} at node {peer}")));
            break 'find;
        }
    }
    let (node, off, what) =
        target.unwrap_or((0, layout::PATTERN_OFF, "node 0's READ pattern".to_owned()));
    let path = cfg.run_dir.join(layout::mr_file(node, 0));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, off)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    byte[0] ^= 0x20;
    file.write_all_at(&byte, off)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(format!(
        "one byte of the {what} ({} at +{off:#x})",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_nodes_streamed_problems_are_its_facts() {
        let mut n = NodeState::default();
        assert!(n.problems().is_empty());
        // Killed before it drained: what it streamed.
        n.problems = vec!["bad record".to_owned()];
        assert_eq!(n.problems(), ["bad record"]);
        // Drained: the summary holds them all (the streamed ones and any later).
        n.summary = Some(Box::new(NodeSummary {
            problems: vec!["bad record".to_owned(), "late one".to_owned()],
            ..NodeSummary::default()
        }));
        assert_eq!(n.problems(), ["bad record", "late one"]);
    }
}
