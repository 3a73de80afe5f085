//! `softverbs run`: the multi-process fault-injection harness.
//!
//! The orchestrator (this process) starts N node processes — the same binary in its hidden
//! `node` mode — each with one emulated UDP device on its own loopback address
//! (127.0.0.(10 + i), OS-chosen port) and one memory region backed by a file in the run
//! directory. It brokers their endpoints and MRs over stdin/stdout JSON lines
//! ([`proto`]), starts the workload ([`layout::Workload`]) on every node at once, applies the
//! plan's process faults (kill -9, SIGSTOP/SIGCONT, restart) while each node's driver applies
//! the network faults to the datagrams it sends ([`plan`]), and stops everything within a
//! bound. Then it checks, from the nodes' completion logs ([`log`]) and their MR files — also
//! those of killed nodes — that every operation a sender saw succeed left exactly the bytes
//! it sent at the target, that completions came exactly once and in order, that atomics ran
//! exactly once, and that a dead peer's partners failed their QPs within the retry budget
//! ([`check`]). The result is a JSON report and a human summary ([`report`]).
//!
//! Exit codes: 0 all invariants hold; 1 a violation (the summary names it and prints the
//! replay command); 2 invalid flags or plan file (nothing was started); 3 the harness itself
//! failed (a node could not start; all children are reaped).
//!
//! Topology: a full mesh of RC QPs for up to [`layout::MESH_MAX`] nodes, a ring beyond
//! (`atomic-counter` adds a QP from every node to node 0, and a loopback QP pair on node 0).
//!
//! [`execute`] runs one run in-process and returns its report; `softverbs campaign`
//! ([`campaign`]) uses it for many short runs with fault plans drawn from a seed ([`draw`]),
//! and `softverbs demo` ([`crate::demo`]) for the demo scenario.

pub mod campaign;
pub mod check;
pub mod cm;
pub mod draw;
pub mod layout;
pub mod log;
pub mod node;
pub mod orchestrator;
pub mod plan;
pub mod proto;
pub mod report;
pub mod selftest;
pub mod trace;

use std::path::PathBuf;
use std::time::Duration;

pub use layout::Workload;

/// How a run's node pairs connect their RC QPs (`--cm`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CmMode {
    /// The harness's own endpoint exchange.
    #[default]
    None,
    /// The IB CM over the devices' GSIs (`crate::run::cm`).
    Rdma,
}
pub use node::node_main;
pub use orchestrator::{Options, Progress, RunError, execute, run};

/// Exit code: every invariant holds.
pub const EXIT_PASS: u8 = 0;
/// Exit code: at least one violation.
pub const EXIT_VIOLATION: u8 = 1;
/// Exit code: invalid flags or plan file; nothing was started.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the harness could not run (a node failed to start).
pub const EXIT_HARNESS: u8 = 3;

fn duration_arg(s: &str) -> Result<Duration, String> {
    plan::parse_duration(s)
}

/// Flags of `softverbs run`.
#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// Node processes to start (2–64).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub nodes: u32,
    /// Workload with built-in verification.
    #[arg(long, value_enum, default_value_t = Workload::Mixed)]
    pub workload: Workload,
    /// RC QPs between each pair of peers (1–2048): each node spreads its operations to a peer
    /// round-robin over them, and each QP is verified on its own (exactly once, in order,
    /// intact). A node holds at most 2048 QPs (peers × this); not with `ud-send`.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=layout::MAX_LINKS as i64))]
    pub qps_per_peer: u32,
    /// How node pairs connect their RC QPs: `none` exchanges QP numbers and PSNs through the
    /// harness; `rdma` runs the IB CM (REQ/REP/RTU) over the devices' GSIs, the lower node
    /// listening. Not with `ud-send` or `--qps-per-peer` above 1.
    #[arg(long, value_enum, default_value_t = CmMode::None)]
    pub cm: CmMode,
    /// Plan file: network fault rules (emu-fault `[[rule]]` tables) and `[[process]]` faults.
    #[arg(long, value_name = "PLAN.toml")]
    pub faults: Option<PathBuf>,
    /// Seed of the workload (and of the network faults unless the plan file has a `seed`);
    /// default: drawn from the clock and printed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run the workload this long (e.g. `2s`, `500ms`).
    #[arg(long, value_parser = duration_arg, conflicts_with = "ops")]
    pub duration: Option<Duration>,
    /// Operations each node posts (default 500 when --duration is not given).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub ops: Option<u64>,
    /// Write the JSON report here.
    #[arg(long, value_name = "FILE.json")]
    pub report: Option<PathBuf>,
    /// Directory for packet captures: one pcap file per node process
    /// (`node<i>.g<generation>.pcap`) with what its device sent (after the plan's faults) and
    /// received. The summary names the directory; Wireshark needs `-d udp.port==PORT,infiniband`
    /// for the OS-chosen ports.
    #[arg(long, value_name = "DIR")]
    pub pcap_dir: Option<PathBuf>,
    /// Directory for MR files, logs and node stderr; must be empty or absent, and not a
    /// symbolic link; kept after the run. Default: a new private directory (mode 0700, an
    /// unguessable name) under the system temp dir, kept only if the run fails or with --keep.
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Keep the default run directory after a passing run too.
    #[arg(long)]
    pub keep: bool,
    /// Local ACK timeout code of every QP: 4.096 µs × 2^N (14 ≈ 67 ms).
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    pub qp_timeout: u8,
    /// Transport retry count of every QP (0–7).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u8).range(0..=7))]
    pub retry_cnt: u8,
    /// RNR retry count of every QP (0–7; 7 = infinite).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u8).range(0..=7))]
    pub rnr_retry: u8,
    /// Loss recovery of every RC QP: IBTA go-back-N, or selective repeat (a softverbs
    /// extension; every node enables it, so no QP ever talks to a peer that does not).
    #[arg(long, value_enum, default_value_t = crate::recovery::RecoveryArg::Ibta)]
    pub recovery: crate::recovery::RecoveryArg,
    /// Time allowed on top of the retry budget: for dead-peer detection and for draining.
    #[arg(long, default_value = "500ms", value_parser = duration_arg)]
    pub slack: Duration,
    /// Hard bound on the workload phase; unfinished nodes are killed and reported after it
    /// (default: --duration + 60s, or 120s).
    #[arg(long, value_parser = duration_arg)]
    pub timeout: Option<Duration>,
    /// Flip a byte of the evidence after the run (proves the checker can fail).
    #[arg(long, hide = true)]
    pub self_test_corrupt: bool,
    /// Plant one failure of this kind in the evidence after the run, before the check (the
    /// verifier's own test: the run must fail).
    #[arg(long, hide = true, value_enum, value_name = "KIND")]
    pub self_test: Option<selftest::SelfTest>,
}

/// Sends `sig` to the child process `pid`.
///
/// The one `unsafe` call of the crate: std has no safe way to send SIGSTOP/SIGCONT.
#[allow(unsafe_code)]
pub(crate) fn signal(pid: u32, sig: libc::c_int) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| std::io::Error::other("not a process id"))?;
    // SAFETY: kill(2) reads no memory of ours; it takes two integers. `pid` is positive, so it
    // names one process (never a group or "all"), and callers pass the id of a child they hold
    // and have not reaped, so the id cannot have been recycled for another process.
    let rc = unsafe { libc::kill(pid, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
