//! `--sweep-loss`: goodput of a bandwidth test versus the loss rate each side injects, as a
//! table and an SVG line plot (written by hand: a few dozen elements need no plotting crate).

use std::fmt::Write as _;

use super::{Output, PerfArgs, PerfError, say};

/// The loss rates of the sweep: 0, 0.1, 1, 5 and 10 %.
pub(crate) const LOSS_RATES: [f64; 5] = [0.0, 0.001, 0.01, 0.05, 0.1];

/// Prints goodput per loss rate (and its ratio to the lossless run), and writes the plot if
/// `--svg` asked for one.
pub(crate) fn print_and_plot(out: &Output, args: &PerfArgs) -> Result<(), PerfError> {
    let lossless = out
        .sweep
        .iter()
        .find(|(l, _)| *l == 0.0)
        .map_or(0.0, |p| p.1);
    say!(" goodput versus loss (each side drops this fraction of the datagrams it sends)");
    say!(" loss[%]    goodput[MiB/sec]    ratio to lossless");
    for &(loss, bps) in &out.sweep {
        let ratio = if lossless > 0.0 { bps / lossless } else { 0.0 };
        say!(
            " {:<7.1}    {:<16.2}    {:.2}",
            loss * 100.0,
            bps / f64::from(1u32 << 20),
            ratio
        );
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, svg(&out.sweep))
            .map_err(|e| PerfError::run(format!("writing {}: {e}", path.display())))?;
        say!(" plot written to {}", path.display());
    }
    Ok(())
}

/// A line plot of goodput (MiB/s) against loss (%).
fn svg(points: &[(f64, f64)]) -> String {
    let (w, h, left, right, top, bottom) = (640.0, 400.0, 70.0, 20.0, 30.0, 50.0);
    let max_x = points.iter().map(|p| p.0 * 100.0).fold(1.0, f64::max);
    let mib = |b: f64| b / f64::from(1u32 << 20);
    let max_y = points.iter().map(|p| mib(p.1)).fold(1.0, f64::max) * 1.1;
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
    let path: Vec<String> = points
        .iter()
        .map(|&(l, b)| format!("{:.1},{:.1}", x(l * 100.0), y(mib(b))))
        .collect();
    let _ = write!(
        s,
        r##"<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{}"/>"##,
        path.join(" ")
    );
    for &(l, b) in points {
        let _ = write!(
            s,
            r##"<circle cx="{:.1}" cy="{:.1}" r="4" fill="#1f77b4"/>"##,
            x(l * 100.0),
            y(mib(b))
        );
    }
    s.push_str("</svg>\n");
    s
}
