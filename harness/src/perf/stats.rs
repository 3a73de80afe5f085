//! perftest's formulas and report formats (perftest.md §5.1, §5.3).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

/// perftest's separator: a run of 87 `-`.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// How many of the first posts and completions the peak bandwidth looks at (perftest's
/// `num_of_calculated_iters` bound).
const PEAK_ITERS: usize = 20_000;

/// Bytes per unit of the bandwidth columns.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BwUnit {
    /// MiB/s (perftest's default, `F = 2^20`).
    MiB,
    /// Gb/s (`--report_gbits`, `F = 125 000 000` bytes).
    Gbit,
}

impl BwUnit {
    /// Converts bytes per second into this unit.
    pub fn from_bytes_per_sec(self, bps: f64) -> f64 {
        match self {
            BwUnit::MiB => bps / f64::from(1u32 << 20),
            BwUnit::Gbit => bps / 125_000_000.0,
        }
    }

    fn label(self) -> &'static str {
        match self {
            BwUnit::MiB => "MiB/sec",
            BwUnit::Gbit => "Gb/sec",
        }
    }

    /// perftest's number format: 2 decimals, 6 for Gb/s values below 0.1.
    fn fmt(self, v: f64) -> String {
        if self == BwUnit::Gbit && v < 0.1 {
            format!("{v:.6}")
        } else {
            format!("{v:.2}")
        }
    }
}

/// One bandwidth measurement: what the client saw between its first post and its last
/// completion.
#[derive(Clone, Debug, Serialize)]
pub struct BwResult {
    /// Message size.
    pub bytes: u64,
    /// Messages completed (all QPs).
    pub iterations: u64,
    /// Seconds from the first post to the last completion.
    pub seconds: f64,
    /// Best bytes/s over perftest's windows; `None` in duration mode or when too few samples.
    pub peak_bytes_per_sec: Option<f64>,
}

impl BwResult {
    /// Average bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        if self.seconds > 0.0 {
            (self.bytes * self.iterations) as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// Messages per second, in millions.
    pub fn mpps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.iterations as f64 / self.seconds / 1e6
        } else {
            0.0
        }
    }
}

/// Timestamps of a bandwidth run, for [`BwResult`].
#[derive(Debug)]
pub struct BwTimes {
    start: Option<Instant>,
    /// Post time of each WR, in post order (first [`PEAK_ITERS`] only).
    posted: Vec<Instant>,
    /// (time, WRs completed so far) at each completion, first [`PEAK_ITERS`] WRs only.
    completed: Vec<(Instant, u64)>,
    last: Option<Instant>,
    done: u64,
}

impl BwTimes {
    /// Room for `expected` posts.
    pub fn new(expected: u64) -> BwTimes {
        let cap = usize::try_from(expected)
            .unwrap_or(PEAK_ITERS)
            .min(PEAK_ITERS);
        BwTimes {
            start: None,
            posted: Vec::with_capacity(cap),
            completed: Vec::with_capacity(cap),
            last: None,
            done: 0,
        }
    }

    /// Records one post at `t`.
    pub fn post(&mut self, t: Instant) {
        self.start.get_or_insert(t);
        if self.posted.len() < PEAK_ITERS {
            self.posted.push(t);
        }
    }

    /// Records `n` posts made now: reads the clock only while post times are still kept
    /// (the first post, and the first [`PEAK_ITERS`] for the peak).
    pub fn posts(&mut self, n: u64) {
        if n > 0 && (self.start.is_none() || self.posted.len() < PEAK_ITERS) {
            let t = Instant::now();
            for _ in 0..n {
                self.post(t);
            }
        }
    }

    /// Records that `n` more WRs completed at `t`.
    pub fn complete(&mut self, t: Instant, n: u64) {
        self.done += n;
        self.last = Some(t);
        if (self.done as usize) <= PEAK_ITERS || self.completed.is_empty() {
            self.completed.push((t, self.done));
        }
    }

    /// The result for `bytes`-byte messages; the peak only when `peak` is asked.
    pub fn result(&self, bytes: u64, peak: bool) -> BwResult {
        let seconds = match (self.start, self.last) {
            (Some(s), Some(l)) => l.saturating_duration_since(s).as_secs_f64(),
            _ => 0.0,
        };
        let peak_bytes_per_sec = if peak {
            self.peak_time().map(|t| bytes as f64 / t)
        } else {
            None
        };
        BwResult {
            bytes,
            iterations: self.done,
            seconds,
            peak_bytes_per_sec,
        }
    }

    /// perftest's peak: the smallest per-message time over windows [post i … completion j].
    fn peak_time(&self) -> Option<f64> {
        let mut best: Option<f64> = None;
        // Window starts at posts, stepping so that the work stays near linear × completions.
        let step = (self.posted.len() / 64).max(1);
        for i in (0..self.posted.len()).step_by(step) {
            let tp = self.posted[i];
            for &(tc, done) in &self.completed {
                // Completions covering WR i onward: `done` WRs done means WRs 0..done.
                let Some(msgs) = done.checked_sub(i as u64).filter(|&m| m > 0) else {
                    continue;
                };
                let t = tc.saturating_duration_since(tp).as_secs_f64() / msgs as f64;
                if t > 0.0 && best.is_none_or(|b| t < b) {
                    best = Some(t);
                }
            }
        }
        best
    }
}

/// perftest's bandwidth column header.
pub fn bw_header(unit: BwUnit, baseline: bool) -> String {
    let u = unit.label();
    let mut s =
        format!(" #bytes     #iterations    BW peak[{u}]    BW average[{u}]   MsgRate[Mpps]");
    if baseline {
        let _ = write!(s, "   UDP average[{u}]   ratio");
    }
    s
}

/// One bandwidth row (perftest's `REPORT_FMT`), with the UDP baseline's average and our
/// ratio to it when given.
pub fn bw_row(r: &BwResult, unit: BwUnit, baseline: Option<f64>) -> String {
    let peak = r.peak_bytes_per_sec.unwrap_or(0.0);
    let mut s = format!(
        " {:<7}    {:<10}       {:<7}            {:<7}            {:<7.6}",
        r.bytes,
        r.iterations,
        unit.fmt(unit.from_bytes_per_sec(peak)),
        unit.fmt(unit.from_bytes_per_sec(r.bytes_per_sec())),
        r.mpps()
    );
    if let Some(b) = baseline {
        let ratio = if b > 0.0 { r.bytes_per_sec() / b } else { 0.0 };
        let _ = write!(
            s,
            "     {:<7}            {:.2}",
            unit.fmt(unit.from_bytes_per_sec(b)),
            ratio
        );
    }
    s
}

/// Latency statistics in µs, as perftest computes them (perftest.md §5.3).
#[derive(Clone, Debug, Serialize)]
pub struct LatResult {
    /// Message size.
    pub bytes: u64,
    /// Iterations (round trips).
    pub iterations: u64,
    /// Smallest sample.
    pub t_min: f64,
    /// Second-largest sample (the largest two are excluded).
    pub t_max: f64,
    /// Median of the samples without the largest two.
    pub t_typical: f64,
    /// 50th percentile of all samples (the median; `t_typical` leaves the largest two out).
    pub p50: f64,
    /// Mean of the samples without the largest two.
    pub t_avg: f64,
    /// Standard deviation of those samples (exact, not perftest's integer-truncated one).
    pub t_stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// Latency statistics from post timestamps: deltas between consecutive posts divided by
/// `rtt_factor` (2 for WRITE/SEND, 1 for READ/atomics); `None` with fewer than 5 posts.
pub fn latency(bytes: u64, posts: &[Instant], rtt_factor: u32) -> Option<LatResult> {
    if posts.len() < 5 {
        return None;
    }
    let mut samples: Vec<f64> = posts
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]).as_secs_f64() * 1e6 / f64::from(rtt_factor))
        .collect();
    samples.sort_by(f64::total_cmp);
    lat_from_sorted(bytes, posts.len() as u64, &samples)
}

/// As [`latency`], from samples already in µs and sorted ascending.
pub fn lat_from_sorted(bytes: u64, iterations: u64, s: &[f64]) -> Option<LatResult> {
    if s.len() < 4 {
        return None;
    }
    let n = s.len() - 2;
    let kept = &s[..n];
    let mean = kept.iter().sum::<f64>() / n as f64;
    let var = kept.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
    let at = |q: f64| s[((n as f64 * q).ceil() as usize).min(n)];
    Some(LatResult {
        bytes,
        iterations,
        t_min: s[0],
        t_max: s[n],
        t_typical: kept[n / 2],
        p50: at(0.5),
        t_avg: mean,
        t_stdev: var.sqrt(),
        p99: at(0.99),
        p999: at(0.999),
    })
}

/// perftest's latency column header.
pub fn lat_header(baseline: bool) -> String {
    let mut s = String::from(
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]",
    );
    if baseline {
        s.push_str("   UDP t_typical[usec]   ratio");
    }
    s
}

/// One latency row (perftest's `REPORT_FMT_LAT`), with the baseline's typical latency and our
/// ratio to it when given.
pub fn lat_row(r: &LatResult, baseline: Option<f64>) -> String {
    let mut s = format!(
        " {:<7} {:<10}       {:<7.2}        {:<7.2}      {:<7.2}          {:<7.2}        {:<7.2}          {:<7.2}                {:<7.2}",
        r.bytes, r.iterations, r.t_min, r.t_max, r.t_typical, r.t_avg, r.t_stdev, r.p99, r.p999
    );
    if let Some(b) = baseline {
        let ratio = if b > 0.0 { r.t_typical / b } else { 0.0 };
        let _ = write!(s, "                {b:<7.2}           {ratio:.2}");
    }
    s
}

/// Latency in duration mode (perftest's `-D` format): iterations, average and transactions
/// per second.
#[derive(Clone, Debug, Serialize)]
pub struct LatDuration {
    /// Message size.
    pub bytes: u64,
    /// Round trips completed.
    pub iterations: u64,
    /// Average latency in µs (RTT / factor).
    pub t_avg: f64,
    /// Round trips per second.
    pub tps: f64,
}

impl LatDuration {
    /// From the run's round trips and wall time.
    pub fn new(bytes: u64, iterations: u64, elapsed: Duration, rtt_factor: u32) -> LatDuration {
        let secs = elapsed.as_secs_f64();
        let (t_avg, tps) = if iterations > 0 && secs > 0.0 {
            (
                secs * 1e6 / iterations as f64 / f64::from(rtt_factor),
                iterations as f64 / secs,
            )
        } else {
            (0.0, 0.0)
        };
        LatDuration {
            bytes,
            iterations,
            t_avg,
            tps,
        }
    }
}

/// perftest's header for latency in duration mode.
pub fn lat_duration_header() -> &'static str {
    " #bytes        #iterations       t_avg[usec]    tps average"
}

/// One duration-mode latency row.
pub fn lat_duration_row(r: &LatDuration) -> String {
    format!(
        " {:<7}       {:<10}        {:<7.2}        {:<7.2}",
        r.bytes, r.iterations, r.t_avg, r.tps
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_follows_perftest() {
        // Samples 1..=10 µs: n' = 8, min 1, max = s[8] = 9, typical = kept[4] = 5.
        let s: Vec<f64> = (1..=10).map(f64::from).collect();
        let r = lat_from_sorted(8, 11, &s).unwrap_or_else(|| panic!("too few"));
        assert_eq!((r.t_min, r.t_max, r.t_typical), (1.0, 9.0, 5.0));
        assert!((r.t_avg - 4.5).abs() < 1e-9);
        assert_eq!((r.p50, r.p99, r.p999), (5.0, 9.0, 9.0));
    }

    #[test]
    fn bandwidth_units() {
        assert_eq!(BwUnit::MiB.from_bytes_per_sec(f64::from(1u32 << 20)), 1.0);
        assert_eq!(BwUnit::Gbit.from_bytes_per_sec(125_000_000.0), 1.0);
        assert_eq!(BwUnit::Gbit.fmt(0.05), "0.050000");
    }
}
