//! The trace evidence of a run: every node process writes its trace events to
//! `node{i}.g{gen}.trace.jsonl` in the run directory (packets, fault verdicts, receiver drops,
//! retransmissions, completions; `SOFTVERBS_TRACE_FILTER=debug`, rotated at
//! [`TRACE_MAX_MB`]); a failing run draws `violation-ladder.svg`, the ladder of the QPs
//! between the nodes its first violation names.
//!
//! The window: violations name nodes, not instants, so the ladder is centred on the first
//! anomaly the trace shows on those QPs — an error completion or a QP entering ERR first, else
//! a packet dropped by the fault model or the receiver, else a retransmission — and on the end
//! of the trace when there is none (a failure planted in the evidence after the run).
//!
//! What it is not: a judge. The checker decides what failed; this only keeps the pictures.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::ladder::{self, Fate, Ladder, NoteKind, Window};
use crate::run::check::Invariant;
use crate::run::layout;

/// Size at which a node's trace file is rotated (the older part kept as `FILE.1`), MiB.
pub const TRACE_MAX_MB: u64 = 64;

/// Rows the violation ladder shows at most.
pub const LADDER_ROWS: usize = 300;

/// File name of the ladder a failing run leaves.
pub const LADDER_FILE: &str = "violation-ladder.svg";

/// The trace file of node `i`, generation `gen`.
pub fn trace_file(i: u32, generation: u32) -> String {
    format!("node{i}.g{generation}.trace.jsonl")
}

/// The environment a node process is started with so that it writes its trace. The filter
/// is `debug` unless `SOFTVERBS_TRACE_FILTER` is set for the orchestrator (`off`: no events).
pub fn node_env(run_dir: &Path, i: u32, generation: u32) -> [(&'static str, String); 3] {
    let filter = std::env::var("SOFTVERBS_TRACE_FILTER")
        .ok()
        .filter(|f| !f.trim().is_empty())
        .unwrap_or_else(|| "debug".to_owned());
    [
        (
            "SOFTVERBS_TRACE",
            run_dir
                .join(trace_file(i, generation))
                .display()
                .to_string(),
        ),
        ("SOFTVERBS_TRACE_FILTER", filter),
        ("SOFTVERBS_TRACE_MAX_MB", TRACE_MAX_MB.to_string()),
    ]
}

/// What a report says of the trace evidence.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TraceEvidence {
    /// The nodes' trace files (rotated halves included), relative to the run directory.
    pub files: Vec<String>,
    /// The ladder of the violating QPs, if one was drawn (a path in the run directory).
    pub ladder: Option<String>,
    /// Which QPs and which window the ladder shows, or why there is none.
    pub note: String,
}

/// The trace files in `run_dir`, oldest part first per process.
fn trace_files(run_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(run_dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.starts_with("node") && (n.ends_with(".trace.jsonl") || n.ends_with(".trace.jsonl.1"))
        })
        .collect();
    // "x.trace.jsonl.1" (older) before "x.trace.jsonl".
    names.sort_by_key(|n| (n.trim_end_matches(".1").to_owned(), !n.ends_with(".1")));
    names.into_iter().map(|n| run_dir.join(n)).collect()
}

/// The node indices the first violation names (`node N`), at most two, in order of mention.
pub fn violating_nodes(invariants: &[Invariant]) -> Vec<u32> {
    let Some(first) = invariants.iter().find_map(|i| i.violations.first()) else {
        return Vec::new();
    };
    let mut nodes = Vec::new();
    let mut rest = first.as_str();
    while let Some(at) = rest.find("node ") {
        rest = &rest[at + 5..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(n) = digits.parse::<u32>() {
            if !nodes.contains(&n) {
                nodes.push(n);
            }
        }
    }
    nodes.truncate(2);
    nodes
}

/// The trace evidence of a finished run; with `failed`, also draws the ladder of the QPs the
/// first violation names. Never fails the run: problems end up in the note.
pub fn collect(run_dir: &Path, invariants: &[Invariant], failed: bool) -> TraceEvidence {
    let files = trace_files(run_dir);
    let mut ev = TraceEvidence {
        files: files
            .iter()
            .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect(),
        ..TraceEvidence::default()
    };
    if !failed {
        ev.note = "the run passed: no ladder drawn".into();
        return ev;
    }
    if files.is_empty() {
        ev.note = "no trace files: no ladder drawn".into();
        return ev;
    }
    let nodes = violating_nodes(invariants);
    match draw(run_dir, &files, &nodes) {
        Ok((path, note)) => {
            ev.ladder = Some(path.display().to_string());
            ev.note = note;
        }
        Err(e) => ev.note = format!("no ladder drawn: {e}"),
    }
    ev
}

fn draw(run_dir: &Path, files: &[PathBuf], nodes: &[u32]) -> Result<(PathBuf, String), String> {
    let full = ladder::load(files).map_err(|e| e.to_string())?;
    let ips: Vec<String> = nodes
        .iter()
        .map(|&n| layout::node_ip(n).to_string())
        .collect();
    let of_nodes = |addr: &str| {
        ips.is_empty()
            || ips
                .iter()
                .any(|ip| addr.split(':').next() == Some(ip.as_str()))
    };
    // Packets between the named nodes (or of the one named), notes on their lanes.
    let lanes: Vec<bool> = full.lanes.iter().map(|l| of_nodes(&l.addr)).collect();
    let mut l = full.clone();
    l.packets.retain(|p| {
        lanes[p.from]
            && lanes[p.to]
            && (ips.len() < 2 || full.lanes[p.from].addr != full.lanes[p.to].addr)
    });
    l.notes.retain(|n| lanes[n.lane]);
    let center = first_anomaly(&l).or_else(|| l.rows.last().copied());
    let window = Window {
        max_events: LADDER_ROWS,
        center,
        ..Window::default()
    };
    let cut = ladder::cut(&l, &window).map_err(|e| e.to_string())?;
    let who = match nodes {
        [] => "all nodes".to_owned(),
        [a] => format!("node {a}"),
        [a, b, ..] => format!("nodes {a} and {b}"),
    };
    let qps: Vec<String> = cut
        .lanes
        .iter()
        .map(|lane| {
            format!(
                "{} QP {}",
                lane.addr,
                lane.qp.map_or("?".into(), |q| format!("{q:#x}"))
            )
        })
        .collect();
    let path = run_dir.join(LADDER_FILE);
    let title = format!("first violation: {who}");
    ladder::write(&path, &cut, &title)
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        })
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let note = format!(
        "{who}: {} ({} rows around {}, {})",
        qps.join(", "),
        cut.rows.len(),
        center.map_or_else(|| "the start".to_owned(), ladder::format_ns),
        cut.clock
    );
    Ok((path, note))
}

/// The time of the first anomaly in `l` (module doc for the order).
fn first_anomaly(l: &Ladder) -> Option<u64> {
    let error = l
        .notes
        .iter()
        .filter(|n| n.kind == NoteKind::Error)
        .map(|n| n.row)
        .min();
    let lost = l
        .packets
        .iter()
        .filter(|p| !matches!(p.fate, Fate::Delivered) || p.rx_drop.is_some())
        .map(|p| p.tx_row)
        .min();
    let retx = l
        .packets
        .iter()
        .filter(|p| p.retransmit)
        .map(|p| p.tx_row)
        .min();
    error.or(lost).or(retx).map(|row| l.rows[row])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_violation_names_its_nodes() {
        let inv = |v: &[&str]| Invariant {
            name: "x".into(),
            violations: v.iter().map(|s| (*s).to_owned()).collect(),
            ..Invariant::default()
        };
        let invs = [
            inv(&[]),
            inv(&["node 0 → node 1: IBV_WC_RETRY_EXC_ERR", "node 3 → node 2"]),
        ];
        assert_eq!(violating_nodes(&invs), [0, 1]);
        assert_eq!(violating_nodes(&[inv(&["node 12's counter, now 3"])]), [12]);
        assert!(violating_nodes(&[inv(&["no nodes"])]).is_empty());
    }
}
