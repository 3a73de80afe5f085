//! Rendering a [`Ladder`] as plain SVG text (and an HTML page around it).
//!
//! Lanes are columns headed by device and QP; time runs down, one row per event, its time on
//! the left. A packet is a `<g class="packet …">` with one arrow from sender to receiver (to
//! the middle, with a cross, if the fault model dropped it); a note is a `<g class="note …">`
//! with a dot on its lane.

use std::fmt::Write as _;

use super::model::{Fate, Ladder, Packet};

const LANE_W: u32 = 250;
const LEFT: u32 = 100;
const ROW_H: u32 = 22;
const HEADER: u32 = 60;

const STYLE: &str = "text{font-family:monospace;font-size:10px}\
.head{font-size:12px;font-weight:bold}.time{fill:#666}.title{font-size:13px}\
.remark{fill:#a60}.lane{stroke:#999;stroke-dasharray:2,3}\
.packet line{stroke-width:1.3}.req line{stroke:#1f5fbf}.req text{fill:#1f5fbf}\
.resp line{stroke:#2a8a2a}.resp text{fill:#2a8a2a}.nak line{stroke:#c05000}.nak text{fill:#c05000}\
.dropped line{stroke:#d00;stroke-dasharray:5,3}.dropped text{fill:#d00}\
.corrupt line{stroke:#d00}.corrupt text{fill:#d00}.truncated line{stroke:#d00}\
.dup line{stroke:#8a2be2}.dup text{fill:#8a2be2}.delayed line{stroke-dasharray:1,2}\
.note circle{fill:#444}.timer text{fill:#b8860b}.timer circle{fill:#b8860b}\
.retx text{fill:#c05000}.retx circle{fill:#c05000}.wc text{fill:#2a8a2a}\
.err text{fill:#d00}.err circle{fill:#d00}.rxdrop text{fill:#d00}.verbs text{fill:#555}\
.x{stroke:#d00;stroke-width:2}";

/// Escapes text for XML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// A duration in ns as a short text with unit.
pub fn format_ns(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.3} µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.3} ms", ns as f64 / 1e6),
        _ => format!("{:.3} s", ns as f64 / 1e9),
    }
}

fn lane_x(lane: usize) -> u32 {
    LEFT + LANE_W / 2 + LANE_W * u32::try_from(lane).unwrap_or(u32::MAX / LANE_W / 2)
}

fn row_y(top: u32, row: usize) -> u32 {
    top + ROW_H / 2 + ROW_H * u32::try_from(row).unwrap_or(u32::MAX / ROW_H / 2)
}

/// The SVG document of `ladder` with `title`.
pub fn render(ladder: &Ladder, title: &str) -> String {
    let remarks = u32::try_from(ladder.remarks.len()).unwrap_or(0);
    let head = 30 + 14 * remarks;
    let top = head + HEADER - 30;
    let lanes = u32::try_from(ladder.lanes.len().max(1)).unwrap_or(1);
    let rows = u32::try_from(ladder.rows.len()).unwrap_or(0);
    let width = LEFT + LANE_W * lanes + 160;
    let height = top + ROW_H * (rows + 1) + 10;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\">\n<title>{}</title>\n<style>{STYLE}</style>\n\
         <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" \
         markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">\
         <path d=\"M0,0 L10,5 L0,10 z\" fill=\"context-stroke\"/></marker></defs>\n",
        escape(title)
    );
    let _ = writeln!(
        s,
        "<text class=\"title\" x=\"8\" y=\"16\">{} — time ({}) runs down</text>",
        escape(title),
        ladder.clock
    );
    for (i, r) in ladder.remarks.iter().enumerate() {
        let y = 30 + 14 * u32::try_from(i).unwrap_or(0);
        let _ = writeln!(
            s,
            "<text class=\"remark\" x=\"8\" y=\"{y}\">{}</text>",
            escape(r)
        );
    }
    for (i, lane) in ladder.lanes.iter().enumerate() {
        let x = lane_x(i);
        let (dev, qp) = lane.label();
        let _ = writeln!(
            s,
            "<g class=\"lane-head\"><text class=\"head\" x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
             <text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{} · {}</text></g>\n\
             <line class=\"lane\" x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\"/>",
            head + 4,
            escape(&dev),
            head + 18,
            escape(&qp),
            escape(&lane.addr),
            top - 6,
            height - 6
        );
    }
    let mut last = None;
    for (row, t) in ladder.rows.iter().enumerate() {
        let label = format_ns(*t);
        if last.as_ref() != Some(&label) {
            let _ = writeln!(
                s,
                "<text class=\"time\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
                LEFT - 8,
                row_y(top, row) + 3,
                escape(&label)
            );
            last = Some(label);
        }
    }
    for p in &ladder.packets {
        packet(&mut s, p, top);
    }
    for n in &ladder.notes {
        let (x, y) = (lane_x(n.lane), row_y(top, n.row));
        let _ = writeln!(
            s,
            "<g class=\"note {}\"><circle cx=\"{x}\" cy=\"{y}\" r=\"3\"/>\
             <text x=\"{}\" y=\"{}\">{}</text></g>",
            n.kind.class(),
            x + 6,
            y + 3,
            escape(&n.text)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn packet(s: &mut String, p: &Packet, top: u32) {
    let (x1, y1) = (lane_x(p.from), row_y(top, p.tx_row));
    let (mut x2, y2) = match p.rx_row {
        Some(r) => (lane_x(p.to), row_y(top, r)),
        None => (lane_x(p.to), y1 + ROW_H * 4 / 5),
    };
    let dropped = matches!(p.fate, Fate::Dropped(_));
    if dropped {
        x2 = (x1 + x2) / 2;
    }
    let dir = if p.opcode.contains("REQUEST")
        || !(p.opcode.contains("RESPONSE") || p.opcode.contains("ACK"))
    {
        "req"
    } else if p.is_nak() {
        "nak"
    } else {
        "resp"
    };
    let mut label = p.label();
    if p.retransmit {
        label.insert_str(0, "↺ ");
    }
    match &p.fate {
        Fate::Delivered => {}
        Fate::Dropped(cause) => label.push_str(&format!(" ✕ dropped ({cause})")),
        f => label.push_str(&format!(" [{}]", f.class())),
    }
    if p.rx_cut {
        label.push_str(" (received after this window)");
    }
    if let Some(cause) = &p.rx_drop {
        label.push_str(&format!(" → rx drop: {cause}"));
    }
    // The label sits above the arrow's start, on the side it goes to.
    let (tx, anchor) = if x2 >= x1 {
        (x1 + 8, "start")
    } else {
        (x1.saturating_sub(8), "end")
    };
    let ty = y1.saturating_sub(3);
    let _ = write!(
        s,
        "<g class=\"packet {dir} {}\"><line x1=\"{x1}\" y1=\"{y1}\" x2=\"{x2}\" y2=\"{y2}\" \
         marker-end=\"url(#arrow)\"/><text x=\"{tx}\" y=\"{ty}\" text-anchor=\"{anchor}\">{}</text>",
        p.fate.class(),
        escape(&label)
    );
    if dropped {
        let _ = write!(
            s,
            "<path class=\"x\" d=\"M{},{} l8,8 M{},{} l-8,8\"/>",
            x2.saturating_sub(4),
            y2.saturating_sub(4),
            x2 + 4,
            y2.saturating_sub(4)
        );
    }
    s.push_str("</g>\n");
}

/// An HTML page showing the SVG, with a legend.
pub fn html(svg: &str, title: &str) -> String {
    let legend = [
        ("req", "request"),
        ("resp", "response / ACK"),
        ("nak", "NAK / RNR NAK"),
        ("dropped", "dropped by the fault model"),
        ("dup", "duplicate"),
    ];
    let mut items = String::new();
    for (class, text) in legend {
        let _ = write!(items, "<li class=\"{class}\">{text}</li>");
    }
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:sans-serif}}li.req{{color:#1f5fbf}}li.resp{{color:#2a8a2a}}\
         li.nak{{color:#c05000}}li.dropped{{color:#d00}}li.dup{{color:#8a2be2}}</style></head>\
         <body><h1>{t}</h1><ul>{items}</ul>\n{svg}</body></html>\n",
        t = escape(title)
    )
}
