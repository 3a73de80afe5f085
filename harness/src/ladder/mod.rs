//! `softverbs ladder`: a sequence (ladder) diagram of an exchange, as SVG or HTML.
//!
//! Input: a pcap written by softverbs (`softverbs capture`, `SOFTVERBS_PCAP`; packets only) or
//! one or more trace files written with `SOFTVERBS_TRACE` / `--trace` (packets, the fault
//! model's verdicts, the receiver's drops, timers, retransmissions, verbs calls and
//! completions). One lane per device/QP, one arrow per packet, time down the page. `--qp`
//! keeps what touches one QP number, `--from`/`--to` a time window, and a ladder longer than
//! `--max-events` rows is cut with a note saying so.
//!
//! What it is not: a protocol checker (it draws what the input says) or a pcapng reader.

mod input;
mod model;
mod svg;

use std::path::{Path, PathBuf};

pub use input::InputError;
pub use model::{Fate, Ladder, Lane, Note, NoteKind, Packet};
pub use svg::{escape, format_ns, html, render};

/// Arguments of `softverbs ladder`.
#[derive(clap::Args, Debug, Clone)]
pub struct LadderArgs {
    /// A pcap written by softverbs, or SOFTVERBS_TRACE files (several are merged by time).
    #[arg(required = true, value_name = "INPUT")]
    pub inputs: Vec<PathBuf>,
    /// Output file: `.svg`, or `.html` for a page around the SVG.
    #[arg(short = 'o', long = "out", value_name = "OUT.svg|OUT.html")]
    pub out: PathBuf,
    /// Only what touches QPs with this number (decimal or 0x hex).
    #[arg(long, value_parser = parse_qpn)]
    pub qp: Option<u32>,
    /// Start of the window, from the input's first event (e.g. 150us, 2.5ms, 1s).
    #[arg(long, value_parser = parse_time)]
    pub from: Option<u64>,
    /// End of the window (inclusive).
    #[arg(long, value_parser = parse_time)]
    pub to: Option<u64>,
    /// Most rows drawn; a longer ladder is cut to its first rows, with a note.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_events: u64,
}

/// A QP number, decimal or `0x` hex, at most 24 bits.
fn parse_qpn(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|_| format!("{s:?} is not a QP number"))?;
    if v > 0xFF_FFFF {
        return Err(format!("{s} is not a 24-bit QP number"));
    }
    Ok(v)
}

/// A time like `150us`, `2.5ms`, `1s`, `300ns` (or `0`), in ns.
pub fn parse_time(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(0);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{s:?} needs a unit: ns, us, ms or s"))?;
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("{s:?} is not a time"))?;
    let scale = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e3 * 1e3,
        "s" => 1e9,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ns, us, ms, s)")),
    };
    let ns = value * scale;
    if !ns.is_finite() || !(0.0..=1e18).contains(&ns) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(ns as u64)
}

/// Which part of a ladder to draw.
#[derive(Clone, Debug, Default)]
pub struct Window {
    /// Only what touches QPs with this number.
    pub qp: Option<u32>,
    /// Rows from this time (ns from the first event).
    pub from: Option<u64>,
    /// Rows up to this time.
    pub to: Option<u64>,
    /// Most rows; more are cut.
    pub max_events: usize,
    /// With a cut: keep the rows around this time instead of the first ones.
    pub center: Option<u64>,
}

/// Reads inputs: one pcap, or trace files. Errors: unreadable, neither kind, a mix.
pub fn load(inputs: &[PathBuf]) -> Result<Ladder, InputError> {
    let mut files = Vec::new();
    for path in inputs {
        let bytes = std::fs::read(path)
            .map_err(|e| InputError(format!("cannot read {}: {e}", path.display())))?;
        files.push((path.display().to_string(), bytes));
    }
    from_bytes(&files)
}

/// [`load`] on contents already read (`name`, bytes).
pub fn from_bytes(files: &[(String, Vec<u8>)]) -> Result<Ladder, InputError> {
    let pcaps = files.iter().filter(|(_, b)| input::is_pcap(b)).count();
    match (pcaps, files.len()) {
        (_, 0) => Err(InputError("no input".into())),
        (1, 1) => input::from_pcap(&files[0].1),
        (0, _) => {
            let mut texts = Vec::new();
            for (name, bytes) in files {
                let text = String::from_utf8(bytes.clone()).map_err(|_| {
                    InputError(format!(
                        "{name}: neither a pcap nor a softverbs trace file (not text)"
                    ))
                })?;
                texts.push((name.clone(), text));
            }
            let records = input::parse_traces(&texts)?;
            if records.is_empty() {
                return Err(InputError("the trace files hold no records".into()));
            }
            Ok(input::from_trace(&records))
        }
        _ => Err(InputError(
            "give one pcap, or trace files only (not a mix, not several pcaps)".into(),
        )),
    }
}

/// The part of `ladder` that `window` asks for. Errors: an empty or inverted window, a QP
/// with nothing to show.
pub fn cut(ladder: &Ladder, window: &Window) -> Result<Ladder, InputError> {
    if let (Some(f), Some(t)) = (window.from, window.to) {
        if f > t {
            return Err(InputError(format!(
                "--from {} is after --to {}",
                format_ns(f),
                format_ns(t)
            )));
        }
    }
    let mut l = ladder.select(0..ladder.rows.len(), window.qp);
    if l.rows.is_empty() {
        let mut qps: Vec<String> = ladder
            .lanes
            .iter()
            .filter_map(|l| l.qp.map(|q| format!("{q:#x}")))
            .collect();
        qps.sort();
        qps.dedup();
        return Err(InputError(match window.qp {
            Some(q) => format!(
                "nothing touches QP {q:#x} (QPs in the input: {})",
                qps.join(" ")
            ),
            None => "the input holds no packets or events to draw".into(),
        }));
    }
    let last = l.rows.last().copied().unwrap_or(0);
    let first = l
        .rows
        .partition_point(|t| window.from.is_some_and(|f| *t < f));
    let end = l
        .rows
        .partition_point(|t| window.to.is_none_or(|to| *t <= to));
    if first >= end {
        return Err(InputError(format!(
            "no events between {} and {} (the input spans 0 to {})",
            format_ns(window.from.unwrap_or(0)),
            window.to.map_or_else(|| "the end".to_owned(), format_ns),
            format_ns(last)
        )));
    }
    let max = window.max_events.max(1);
    let (mut a, mut b) = (first, end);
    if b - a > max {
        let total = b - a;
        if let Some(c) = window.center {
            let mid = l.rows.partition_point(|t| *t < c).clamp(a, b);
            a = mid.saturating_sub(max / 2).max(first);
            b = (a + max).min(end);
            a = b - max;
        } else {
            b = a + max;
        }
        l.remarks.push(format!(
            "cut: {max} of {total} rows shown ({} to {}); use --from/--to/--qp/--max-events for others",
            format_ns(l.rows[a]),
            format_ns(l.rows[b - 1])
        ));
    }
    if a == 0 && b == l.rows.len() {
        return Ok(l);
    }
    Ok(l.select(a..b, None))
}

/// Writes the diagram to `out`: HTML if it ends in `.html`/`.htm`, else SVG.
pub fn write(out: &Path, ladder: &Ladder, title: &str) -> std::io::Result<()> {
    let svg = render(ladder, title);
    let html_out = out
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("html") || e.eq_ignore_ascii_case("htm"));
    let text = if html_out { html(&svg, title) } else { svg };
    std::fs::write(out, text)
}

/// `softverbs ladder`. Exit code: 0 written, 1 cannot write the output, 2 bad input or flags.
pub fn run(args: &LadderArgs) -> u8 {
    let window = Window {
        qp: args.qp,
        from: args.from,
        to: args.to,
        max_events: usize::try_from(args.max_events).unwrap_or(usize::MAX),
        center: None,
    };
    let ladder = match load(&args.inputs).and_then(|l| cut(&l, &window)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("softverbs ladder: {e}");
            return 2;
        }
    };
    let title = args
        .inputs
        .iter()
        .map(|p| {
            p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
        })
        .collect::<Vec<_>>()
        .join(" + ");
    if let Err(e) = write(&args.out, &ladder, &title) {
        eprintln!("softverbs ladder: cannot write {}: {e}", args.out.display());
        return 1;
    }
    println!(
        "wrote {} lanes, {} packets, {} notes to {}",
        ladder.lanes.len(),
        ladder.packets.len(),
        ladder.notes.len(),
        args.out.display()
    );
    0
}
