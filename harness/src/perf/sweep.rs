//! `--sweep-loss`: goodput of a bandwidth test versus the loss rate each side injects, in both
//! loss-recovery modes (IBTA go-back-N and softverbs' selective repeat), as a table (median of
//! `--rounds` runs per point, with the spread and the ratio to lossless, of medians and
//! paired by round) and one SVG line plot (written by hand: a few dozen elements need no
//! plotting crate).

use std::fmt::Write as _;

use super::{Output, PerfArgs, PerfError, say};
use crate::recovery::RecoveryArg;

/// The loss rates of the sweep: 0, 0.1, 0.5, 1, 2, 5 and 10 %.
pub(crate) const LOSS_RATES: [f64; 7] = [0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1];

/// One measured run of the sweep.
#[derive(Clone, Debug)]
pub(crate) struct Point {
    pub(crate) recovery: RecoveryArg,
    pub(crate) loss: f64,
    pub(crate) bytes_per_sec: f64,
    /// The client side's transport counters of the run (`verbs::transport_json`).
    pub(crate) transport: serde_json::Value,
}

/// The runs of one (mode, loss) point, summarised.
#[derive(Clone, Debug)]
struct Summary {
    recovery: RecoveryArg,
    loss: f64,
    rounds: usize,
    median: f64,
    /// Median over the rounds of each run's goodput over the lossless run of its round and
    /// mode (1 for the lossless point): a slow stretch of the machine moves both runs of a
    /// pair, and cancels out.
    paired: f64,
    min: f64,
    max: f64,
    /// Median over the rounds of each counter.
    counters: serde_json::Map<String, serde_json::Value>,
}

/// The counters summarised per point.
const COUNTERS: [&str; 9] = [
    "dropped_injected",
    "retransmits",
    "retransmits_sack",
    "timeout_retries",
    "seq_naks_sent",
    "rcvd_seq_err",
    "sacks_sent",
    "sacks_rcvd",
    "sr_probes",
];

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Each run's goodput over that of the latest lossless run of its mode before it (a round
/// starts with its lossless run); 0 where there is none.
fn paired_ratios(points: &[Point]) -> Vec<f64> {
    let mut base: Vec<(RecoveryArg, f64)> = Vec::new();
    points
        .iter()
        .map(|p| {
            if p.loss == 0.0 {
                base.retain(|(mode, _)| *mode != p.recovery);
                base.push((p.recovery, p.bytes_per_sec));
            }
            match base.iter().find(|(mode, _)| *mode == p.recovery) {
                Some(&(_, b)) if b > 0.0 => p.bytes_per_sec / b,
                _ => 0.0,
            }
        })
        .collect()
}

/// Groups the runs by mode and loss rate, in the order they ran.
fn summarise(points: &[Point]) -> Vec<Summary> {
    let mut keys: Vec<(RecoveryArg, f64)> = Vec::new();
    for p in points {
        if !keys.contains(&(p.recovery, p.loss)) {
            keys.push((p.recovery, p.loss));
        }
    }
    let paired = paired_ratios(points);
    keys.into_iter()
        .map(|(recovery, loss)| {
            let of_point = |p: &Point| p.recovery == recovery && p.loss == loss;
            let runs: Vec<&Point> = points.iter().filter(|p| of_point(p)).collect();
            let mut pairs: Vec<f64> = points
                .iter()
                .zip(&paired)
                .filter(|(p, _)| of_point(p))
                .map(|(_, &r)| r)
                .collect();
            let mut bps: Vec<f64> = runs.iter().map(|p| p.bytes_per_sec).collect();
            let counters = COUNTERS
                .iter()
                .map(|&name| {
                    let mut v: Vec<f64> = runs
                        .iter()
                        .map(|p| p.transport[name].as_f64().unwrap_or(0.0))
                        .collect();
                    (name.to_owned(), median(&mut v).into())
                })
                .collect();
            Summary {
                recovery,
                loss,
                rounds: runs.len(),
                min: bps.iter().copied().fold(f64::INFINITY, f64::min),
                max: bps.iter().copied().fold(0.0, f64::max),
                median: median(&mut bps),
                paired: median(&mut pairs),
                counters,
            }
        })
        .collect()
}

/// The lossless median of `recovery`'s runs.
fn lossless(sums: &[Summary], recovery: RecoveryArg) -> f64 {
    sums.iter()
        .find(|s| s.recovery == recovery && s.loss == 0.0)
        .map_or(0.0, |s| s.median)
}

/// The sweep for the JSON document: per mode and loss rate the median goodput, its spread,
/// the ratio to the same mode's lossless median, the median of the per-round ratios
/// (`paired_ratio_median`), and the median counters (with retransmitted packets per injected
/// loss).
pub(crate) fn summary(points: &[Point]) -> serde_json::Value {
    let sums = summarise(points);
    let rows: Vec<serde_json::Value> = sums
        .iter()
        .map(|s| {
            let base = lossless(&sums, s.recovery);
            let dropped = s.counters["dropped_injected"].as_f64().unwrap_or(0.0);
            let retx = s.counters["retransmits"].as_f64().unwrap_or(0.0);
            serde_json::json!({
                "recovery": s.recovery.name(),
                "loss": s.loss,
                "rounds": s.rounds,
                "goodput_median_mib": mib(s.median),
                "goodput_min_mib": mib(s.min),
                "goodput_max_mib": mib(s.max),
                "ratio_to_lossless": if base > 0.0 { s.median / base } else { 0.0 },
                "paired_ratio_median": s.paired,
                "retransmits_per_loss": if dropped > 0.0 { retx / dropped } else { 0.0 },
                "counters": s.counters,
            })
        })
        .collect();
    serde_json::Value::Array(rows)
}

fn mib(b: f64) -> f64 {
    b / f64::from(1u32 << 20)
}

/// Prints goodput per mode and loss rate (median, spread, ratio to lossless, what recovery
/// cost), and writes the plot if `--svg` asked for one.
pub(crate) fn print_and_plot(out: &Output, args: &PerfArgs) -> Result<(), PerfError> {
    let sums = summarise(&out.sweep);
    say!(" goodput versus loss (each side drops this fraction of the datagrams it sends)");
    say!(
        " mode  loss[%]  rounds  median[MiB/s]  min..max[MiB/s]     ratio to lossless  \
         paired  retx/loss  timeouts"
    );
    for s in &sums {
        let base = lossless(&sums, s.recovery);
        let dropped = s.counters["dropped_injected"].as_f64().unwrap_or(0.0);
        let retx = s.counters["retransmits"].as_f64().unwrap_or(0.0);
        let timeouts = s.counters["timeout_retries"].as_f64().unwrap_or(0.0);
        say!(
            " {:<4}  {:<7.1}  {:<6}  {:<13.1}  {:<18}  {:<17.2}  {:<6.2}  {:<9}  {}",
            s.recovery.name(),
            s.loss * 100.0,
            s.rounds,
            mib(s.median),
            format!("{:.1}..{:.1}", mib(s.min), mib(s.max)),
            if base > 0.0 { s.median / base } else { 0.0 },
            s.paired,
            if dropped > 0.0 {
                format!("{:.2}", retx / dropped)
            } else {
                "-".to_owned()
            },
            timeouts
        );
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, svg(&sums))
            .map_err(|e| PerfError::run(format!("writing {}: {e}", path.display())))?;
        say!(" plot written to {}", path.display());
    }
    Ok(())
}

/// A line plot of median goodput (MiB/s) against loss (%), one line per mode, with each
/// point's min..max as a bar.
fn svg(sums: &[Summary]) -> String {
    let (w, h, left, right, top, bottom) = (640.0, 400.0, 70.0, 20.0, 30.0, 50.0);
    let max_x = sums.iter().map(|p| p.loss * 100.0).fold(1.0, f64::max);
    let max_y = sums.iter().map(|p| mib(p.max)).fold(1.0, f64::max) * 1.1;
    let x = |v: f64| left + v / max_x * (w - left - right);
    let y = |v: f64| h - bottom - v / max_y * (h - top - bottom);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{}" y="18" text-anchor="middle" font-size="14">softverbs goodput versus random loss</text>"#,
        w / 2.0
    );
    // Axes and ticks.
    let (x0, y0) = (x(0.0), y(0.0));
    let _ = write!(
        s,
        r#"<line x1="{x0}" y1="{y0}" x2="{}" y2="{y0}" stroke="black"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{top}" stroke="black"/>"#,
        w - right
    );
    for i in 0..=5 {
        let vx = max_x * f64::from(i) / 5.0;
        let vy = max_y * f64::from(i) / 5.0;
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{vx:.1}</text><text x="{:.1}" y="{:.1}" text-anchor="end">{vy:.0}</text><line x1="{x0}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            x(vx),
            y0 + 18.0,
            x0 - 6.0,
            y(vy) + 4.0,
            y(vy),
            w - right,
            y(vy)
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">loss rate [%]</text><text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">goodput [MiB/s]</text>"#,
        (left + w - right) / 2.0,
        h - 12.0,
        h / 2.0,
        h / 2.0
    );
    for (k, (mode, color, label)) in [
        (RecoveryArg::Ibta, "#1f77b4", "IBTA go-back-N"),
        (RecoveryArg::Sr, "#d62728", "selective repeat"),
    ]
    .into_iter()
    .enumerate()
    {
        let pts: Vec<&Summary> = sums.iter().filter(|p| p.recovery == mode).collect();
        if pts.is_empty() {
            continue;
        }
        let path: Vec<String> = pts
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.loss * 100.0), y(mib(p.median))))
            .collect();
        let _ = write!(
            s,
            r##"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"##,
            path.join(" ")
        );
        for p in &pts {
            let cx = x(p.loss * 100.0);
            let _ = write!(
                s,
                r##"<line x1="{cx:.1}" y1="{:.1}" x2="{cx:.1}" y2="{:.1}" stroke="{color}"/><circle cx="{cx:.1}" cy="{:.1}" r="4" fill="{color}"/>"##,
                y(mib(p.min)),
                y(mib(p.max)),
                y(mib(p.median))
            );
        }
        let ly = top + 16.0 * k as f64 + 10.0;
        let lx = w - right - 170.0;
        let _ = write!(
            s,
            r##"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">{label}</text>"##,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(recovery: RecoveryArg, loss: f64, bytes_per_sec: f64) -> Point {
        Point {
            recovery,
            loss,
            bytes_per_sec,
            transport: serde_json::Value::Null,
        }
    }

    /// Two rounds, the second on a machine running at half speed: each lossy run is divided
    /// by the lossless run of its own round and mode.
    #[test]
    fn paired_ratio_divides_by_the_lossless_run_of_the_same_round_and_mode() {
        use RecoveryArg::{Ibta, Sr};
        let points = [
            point(Ibta, 0.0, 100.0),
            point(Ibta, 0.01, 50.0),
            point(Sr, 0.0, 200.0),
            point(Sr, 0.01, 180.0),
            point(Ibta, 0.0, 50.0),
            point(Ibta, 0.01, 40.0),
            point(Sr, 0.0, 100.0),
            point(Sr, 0.01, 95.0),
        ];
        assert_eq!(
            paired_ratios(&points),
            [1.0, 0.5, 1.0, 0.9, 1.0, 0.8, 1.0, 0.95]
        );
        let sums = summarise(&points);
        let of = |mode: RecoveryArg, loss: f64| {
            sums.iter()
                .find(|s| s.recovery == mode && s.loss == loss)
                .map(|s| (s.median, s.paired))
        };
        assert_eq!(of(Ibta, 0.0), Some((75.0, 1.0)));
        assert_eq!(of(Ibta, 0.01), Some((45.0, 0.65)));
        assert_eq!(of(Sr, 0.01), Some((137.5, 0.925)));
    }

    #[test]
    fn a_run_before_any_lossless_run_of_its_mode_has_no_pair() {
        let points = [point(RecoveryArg::Sr, 0.01, 10.0)];
        assert_eq!(paired_ratios(&points), [0.0]);
    }
}
