//! `softverbs ladder` (issue 22 item 3): the SVG of `softverbs capture`'s exchange parses as
//! XML with one lane per device/QP and one arrow per packet, from the pcap and from the trace
//! (which adds the dropped packet, the timers and the completions); bad input exits 2.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use softverbs_cli::capture::write_demo_capture;
use softverbs_cli::ladder::{self, Fate, Window};

fn dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("ladder")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn softverbs(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_softverbs"))
        .args(args)
        .env_remove("SOFTVERBS_LOG")
        .env_remove("SOFTVERBS_TRACE")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// (lane headings, packet groups, note groups) of an SVG, which must be well-formed XML.
fn shape(svg: &str) -> (Vec<String>, usize, usize) {
    let doc = roxmltree::Document::parse(svg).expect("well-formed XML");
    let class_of =
        |n: &roxmltree::Node<'_, '_>| n.attribute("class").unwrap_or_default().to_owned();
    let groups: Vec<_> = doc.descendants().filter(|n| n.has_tag_name("g")).collect();
    let lanes = groups
        .iter()
        .filter(|g| class_of(g) == "lane-head")
        .map(|g| {
            g.descendants()
                .filter(roxmltree::Node::is_text)
                .filter_map(|t| t.text())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let count = |prefix: &str| {
        groups
            .iter()
            .filter(|g| class_of(g).split(' ').next() == Some(prefix))
            .count()
    };
    (lanes, count("packet"), count("note"))
}

#[test]
fn the_capture_pcap_draws_four_lanes_and_every_packet() {
    let d = dir("pcap");
    let pcap = d.join("demo.pcap");
    let summary = write_demo_capture(&pcap).unwrap();
    let svg = d.join("demo.svg");
    let (code, out) = softverbs(&[
        "ladder",
        pcap.to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    let (lanes, packets, notes) = shape(&std::fs::read_to_string(&svg).unwrap());
    assert_eq!(
        lanes,
        [
            "127.0.0.1 QP 0x11 · 127.0.0.1",
            "127.0.0.2 QP 0x11 · 127.0.0.2",
            "127.0.0.1 QP 0x12 · 127.0.0.1",
            "127.0.0.2 QP 0x12 · 127.0.0.2"
        ]
    );
    assert_eq!(packets, summary.packet_count());
    assert_eq!(notes, 0);
    // HTML: the same SVG inside a page.
    let html = d.join("demo.html");
    let (code, out) = softverbs(&[
        "ladder",
        pcap.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    let page = std::fs::read_to_string(&html).unwrap();
    let start = page.find("<svg").unwrap();
    let end = page.rfind("</svg>").unwrap() + "</svg>".len();
    assert_eq!(shape(&page[start..end]).1, summary.packet_count());
}

#[test]
fn the_capture_trace_adds_the_dropped_packet_timers_and_completions() {
    let trace = emu_trace::testing::capture();
    let d = dir("trace");
    let summary = write_demo_capture(&d.join("demo.pcap")).unwrap();
    let jsonl = trace.jsonl();
    drop(trace);
    let l = ladder::from_bytes(&[("demo.jsonl".into(), jsonl.into_bytes())]).unwrap();
    assert_eq!(l.lanes.len(), 4);
    assert!(l.lanes.iter().all(|lane| lane.dev.is_some()));
    // Every delivered packet of the pcap plus the one the fault plan dropped.
    assert_eq!(l.packets.len(), summary.packet_count() + 1);
    let dropped: Vec<_> = l
        .packets
        .iter()
        .filter(|p| matches!(p.fate, Fate::Dropped(_)))
        .collect();
    assert_eq!(dropped.len(), 1);
    assert_eq!(dropped[0].opcode, "RDMA_WRITE_MIDDLE");
    assert!(dropped[0].rx_row.is_none());
    assert!(l.packets.iter().filter(|p| p.is_nak()).count() >= 3);
    assert!(l.packets.iter().any(|p| p.retransmit));
    assert!(
        l.packets
            .iter()
            .filter(|p| !matches!(p.fate, Fate::Dropped(_)))
            .all(|p| p.rx_row.is_some())
    );
    let texts: Vec<&str> = l.notes.iter().map(|n| n.text.as_str()).collect();
    assert!(texts.iter().any(|t| t.starts_with("WC ")), "{texts:?}");
    assert!(texts.iter().any(|t| t.starts_with("go back")), "{texts:?}");
    assert!(
        texts.iter().any(|t| t.starts_with("timer fired")),
        "{texts:?}"
    );
    let svg = ladder::render(&l, "demo");
    let (lanes, packets, _) = shape(&svg);
    assert_eq!((lanes.len(), packets), (4, summary.packet_count() + 1));
    // One QP: its two lanes only.
    let one = ladder::cut(
        &l,
        &Window {
            qp: Some(0x12),
            max_events: 1000,
            ..Window::default()
        },
    )
    .unwrap();
    assert_eq!(one.lanes.len(), 2);
    assert!(one.packets.len() >= 2 && one.packets.len() < l.packets.len());
    // A cut window says so.
    let cut = ladder::cut(
        &l,
        &Window {
            max_events: 10,
            ..Window::default()
        },
    )
    .unwrap();
    assert_eq!(cut.rows.len(), 10);
    assert!(
        cut.remarks.iter().any(|r| r.starts_with("cut: 10 of ")),
        "{:?}",
        cut.remarks
    );
    let (_, packets, notes) = shape(&ladder::render(&cut, "cut"));
    assert_eq!(packets + notes, cut.packets.len() + cut.notes.len());
    assert!(packets + notes >= 10);
}

#[test]
fn bad_input_exits_2_with_a_message() {
    let d = dir("bad");
    let pcap = d.join("demo.pcap");
    write_demo_capture(&pcap).unwrap();
    let out = d.join("out.svg");
    let out = out.to_str().unwrap();
    let text = d.join("notes.txt");
    std::fs::write(&text, "hello\n").unwrap();
    let bytes = std::fs::read(&pcap).unwrap();
    let truncated = d.join("truncated.pcap");
    std::fs::write(&truncated, &bytes[..bytes.len() - 7]).unwrap();
    let p = pcap.to_str().unwrap();
    let cases: [(Vec<&str>, &str); 5] = [
        (vec![text.to_str().unwrap()], "not a softverbs trace record"),
        (vec![truncated.to_str().unwrap()], "truncated"),
        (vec![p, "--from", "5s", "--to", "6s"], "no events between"),
        (vec![p, "--from", "2ms", "--to", "1ms"], "is after --to"),
        (vec![p, "--qp", "0x99"], "nothing touches QP 0x99"),
    ];
    for (args, message) in cases {
        let mut all = vec!["ladder"];
        all.extend(&args);
        all.extend(["-o", out]);
        let (code, stderr) = softverbs(&all);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    let (code, stderr) = softverbs(&["ladder", p, "-o", out, "--from", "3 parsecs"]);
    assert_eq!(code, 2, "{stderr}");
}

#[test]
fn the_committed_readme_ladder_is_well_formed() {
    let svg = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ladder-capture.svg");
    let (lanes, packets, notes) = shape(&std::fs::read_to_string(svg).unwrap());
    assert_eq!(lanes.len(), 4);
    assert!(packets > 40 && notes > 0);
}
