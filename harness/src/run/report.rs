//! The run report: JSON for machines (`--report FILE.json`) and a short summary for people
//! (stdout).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::run::check::Invariant;
use crate::run::proto::{InjectedFaults, TransportStats};

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// softverbs version.
    pub version: String,
    /// No violation and no harness error.
    pub passed: bool,
    /// The process exit code (0 pass, 1 violations, 3 harness error).
    pub exit_code: u8,
    /// The run seed.
    pub seed: u64,
    /// Workload name.
    pub workload: String,
    /// Node count.
    pub nodes: u32,
    /// RC QPs per pair of peers (`--qps-per-peer`; left out when 1).
    #[serde(skip_serializing_if = "is_one")]
    pub qps_per_peer: u32,
    /// `--ops`, if given.
    pub ops: Option<u64>,
    /// `--duration` in ms, if given.
    pub duration_ms: Option<u64>,
    /// The fault plan.
    pub plan: PlanInfo,
    /// QP transport parameters and the bounds derived from them.
    pub qp: QpInfo,
    /// Where the evidence is.
    pub run_dir: String,
    /// Wall-clock time of the whole run (setup to checks), ms.
    pub elapsed_ms: u64,
    /// Per node.
    pub node_reports: Vec<NodeReport>,
    /// Process faults and what became of them.
    pub process_faults: Vec<FaultReport>,
    /// Invariants, in check order.
    pub invariants: Vec<Invariant>,
    /// Total violations.
    pub violations: u64,
    /// Dead-peer detection latencies.
    pub detections: Vec<Detection>,
    /// Final FETCH_ADD counter per target node.
    pub counters: BTreeMap<String, u64>,
    /// Problems of the harness itself (a node that could not start, a timeout).
    pub harness_errors: Vec<String>,
    /// The command that replays this run.
    pub replay: String,
    /// The nodes' trace files and, for a failing run, the ladder of the violating QPs.
    pub trace: crate::run::trace::TraceEvidence,
    /// Packet capture.
    pub pcap: String,
}

/// The plan part of a report.
#[derive(Clone, Debug, Serialize)]
pub struct PlanInfo {
    /// The plan file, if any.
    pub file: Option<String>,
    /// `FaultPlan::hash` of the network faults, hex.
    pub hash: String,
    /// The network faults' seed.
    pub network_seed: u64,
    /// Network rules.
    pub rules: usize,
    /// Process faults, described.
    pub process: Vec<String>,
    /// Retry exhaustion is an accepted outcome of the network faults (so errors they cause
    /// are not liveness violations).
    pub expect_errors: bool,
    /// Why errors are accepted, if they are.
    pub expect_errors_reason: Option<String>,
}

/// QP parameters and derived bounds.
#[derive(Clone, Debug, Serialize)]
pub struct QpInfo {
    /// Local ACK timeout code.
    pub timeout: u8,
    /// Transport retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// Loss recovery: `ibta` or `sr` (selective repeat).
    pub recovery: String,
    /// 4.096 µs × 2^timeout, ms.
    pub ack_timeout_ms: f64,
    /// (retry_cnt + 1) × ACK timeout, ms.
    pub retry_budget_ms: f64,
    /// Retry budget + slack: the dead-peer detection bound, ms.
    pub detect_bound_ms: u64,
}

/// One node.
#[derive(Clone, Debug, Serialize)]
pub struct NodeReport {
    /// Index.
    pub index: u32,
    /// finished, killed, failed, timed out, …
    pub state: String,
    /// Processes started for this index (1 + restarts).
    pub processes: u32,
    /// Successful workload operations, from the log.
    pub ops_ok: u64,
    /// Failed operations (node summary).
    pub ops_failed: Option<u64>,
    /// Payload bytes (node summary).
    pub bytes: Option<u64>,
    /// Work completions by status, from the log.
    pub completions: BTreeMap<String, u64>,
    /// Device counters (node summary; absent for a killed node).
    pub stats: Option<TransportStats>,
    /// What the node's injector did (node summary).
    pub injected: Option<InjectedFaults>,
    /// Log lines read.
    pub log_lines: u64,
    /// The log ended in a cut line.
    pub log_truncated: bool,
}

/// One process fault.
#[derive(Clone, Debug, Serialize)]
pub struct FaultReport {
    /// As written in the plan.
    pub fault: String,
    /// applied, skipped, not reached.
    pub status: String,
    /// When it was applied, ms after the start.
    pub applied_at_ms: Option<u64>,
    /// Why it was skipped, or details.
    pub note: Option<String>,
}

/// How fast a partner noticed a dead node.
#[derive(Clone, Debug, Serialize)]
pub struct Detection {
    /// The partner.
    pub partner: u32,
    /// The killed node.
    pub dead: u32,
    /// Kill (or later post) to error completion, ms.
    pub latency_ms: u64,
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

/// The human summary.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let mut run = match (r.ops, r.duration_ms) {
        (Some(o), _) => format!("{o} ops/node"),
        (None, Some(d)) => format!("{d} ms"),
        _ => String::new(),
    };
    if r.qps_per_peer > 1 {
        run += &format!(", {} QPs per peer", r.qps_per_peer);
    }
    let _ = writeln!(
        s,
        "softverbs run: {} nodes, {}, {run}, seed {}, plan {} ({} rules, {} process faults), {:.2} s",
        r.nodes,
        r.workload,
        r.seed,
        r.plan.hash,
        r.plan.rules,
        r.plan.process.len(),
        r.elapsed_ms as f64 / 1000.0
    );
    if let Some(why) = &r.plan.expect_errors_reason {
        let _ = writeln!(s, "liveness: retry exhaustion accepted ({why})");
    }
    let _ = writeln!(
        s,
        "qp: timeout {} ({:.1} ms) × (retry_cnt {} + 1) = budget {:.0} ms; detection bound {} ms",
        r.qp.timeout,
        r.qp.ack_timeout_ms,
        r.qp.retry_cnt,
        r.qp.retry_budget_ms,
        r.qp.detect_bound_ms
    );
    let _ = writeln!(
        s,
        "{:<5} {:<10} {:>7} {:>7} {:>10} {:>7} {:>6} {:>6} {:>8} {:>8}",
        "node", "state", "ops", "errors", "bytes", "retx", "naks", "rnr", "dropped", "dup'd"
    );
    for n in &r.node_reports {
        let errors: u64 = n
            .completions
            .iter()
            .filter(|(k, _)| k.as_str() != "IBV_WC_SUCCESS")
            .map(|(_, v)| v)
            .sum();
        let dash = || "-".to_owned();
        let st = n.stats.as_ref();
        let inj = n.injected;
        let _ = writeln!(
            s,
            "{:<5} {:<10} {:>7} {:>7} {:>10} {:>7} {:>6} {:>6} {:>8} {:>8}",
            n.index,
            n.state,
            n.ops_ok,
            errors,
            n.bytes.map_or_else(dash, human_bytes),
            st.map_or_else(dash, |t| (t.retransmits_timeout
                + t.retransmits_nak
                + t.retransmits_sack)
                .to_string()),
            st.map_or_else(dash, |t| t.rcvd_seq_err.to_string()),
            st.map_or_else(dash, |t| t.rcvd_rnr_err.to_string()),
            inj.map_or_else(dash, |f| (f.dropped + f.partitioned).to_string()),
            inj.map_or_else(dash, |f| f.duplicated.to_string()),
        );
    }
    let mut statuses: BTreeMap<&str, u64> = BTreeMap::new();
    for n in &r.node_reports {
        for (k, v) in &n.completions {
            *statuses.entry(k.as_str()).or_insert(0) += v;
        }
    }
    let list: Vec<String> = statuses.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(s, "completions: {}", list.join(", "));
    for f in &r.process_faults {
        let when = f
            .applied_at_ms
            .map(|t| format!(" at {t} ms"))
            .unwrap_or_default();
        let note = f
            .note
            .as_deref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        let _ = writeln!(s, "process fault: {} -> {}{when}{note}", f.fault, f.status);
    }
    for d in &r.detections {
        let _ = writeln!(
            s,
            "detection: node {} saw node {} dead after {} ms",
            d.partner, d.dead, d.latency_ms
        );
    }
    for (node, value) in &r.counters {
        let _ = writeln!(s, "counter on node {node}: {value}");
    }
    let _ = writeln!(s, "invariants:");
    for inv in &r.invariants {
        let verdict = if inv.passed() { "PASS" } else { "FAIL" };
        let _ = writeln!(
            s,
            "  {verdict} {:<22} {} checked, {} violations",
            inv.name, inv.checked, inv.violation_count
        );
        for v in &inv.violations {
            let _ = writeln!(s, "       {v}");
        }
    }
    for e in &r.harness_errors {
        let _ = writeln!(s, "harness error: {e}");
    }
    if r.passed {
        let _ = writeln!(s, "result: PASS");
    } else {
        let _ = writeln!(
            s,
            "result: FAIL ({} violations{})",
            r.violations,
            if r.harness_errors.is_empty() {
                String::new()
            } else {
                format!(", {} harness errors", r.harness_errors.len())
            }
        );
        let _ = writeln!(s, "seed {}, plan hash {}", r.seed, r.plan.hash);
        let _ = writeln!(s, "replay: {}", r.replay);
        match &r.trace.ladder {
            Some(l) => {
                let _ = writeln!(s, "ladder: {l} ({})", r.trace.note);
            }
            None => {
                let _ = writeln!(s, "ladder: none ({})", r.trace.note);
            }
        }
    }
    let _ = writeln!(s, "run dir: {}", r.run_dir);
    s
}
