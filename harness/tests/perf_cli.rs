//! `softverbs perf`: every test type runs (tiny `-n`, debug build) and prints perftest's
//! columns with positive values; bad flags exit 2 with a message. No timing assertions: these
//! are benchmarks, checked for shape only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One benchmark process at a time (two cores).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn dump(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Kills the child if the test fails first.
struct Guard(Option<std::process::Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn perf(args: &[&str]) -> Out {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut guard = Guard(Some(
        Command::new(env!("CARGO_BIN_EXE_softverbs"))
            .arg("perf")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let child = guard.0.as_mut().unwrap();
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "perf {args:?} ran over 120 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    guard.0 = None;
    Out {
        code: status.code().unwrap_or(-1),
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

/// The rows under the column header line that starts with ` #bytes`, as numbers.
fn rows(out: &Out) -> (Vec<String>, Vec<Vec<f64>>) {
    let lines: Vec<&str> = out.stdout.lines().collect();
    let h = lines
        .iter()
        .position(|l| l.starts_with(" #bytes"))
        .unwrap_or_else(|| panic!("no column header\n{}", out.dump()));
    let header = lines[h].to_string();
    let mut rows = Vec::new();
    for l in &lines[h + 1..] {
        if l.starts_with("---") {
            break;
        }
        if l.trim_start().starts_with("UDP baseline") {
            continue;
        }
        let nums: Vec<f64> = l
            .split_whitespace()
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{v:?} is not a number\n{}", out.dump()))
            })
            .collect();
        rows.push(nums);
    }
    assert!(!rows.is_empty(), "no result rows\n{}", out.dump());
    (vec![header], rows)
}

const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]";
const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]";

fn check_bw(args: &[&str], size: f64, iters: f64, baseline: bool) {
    let out = perf(args);
    assert_eq!(out.code, 0, "{}", out.dump());
    let (header, rows) = rows(&out);
    assert!(header[0].starts_with(BW_HEADER), "{}", out.dump());
    assert_eq!(header[0].ends_with("   ratio"), baseline, "{}", out.dump());
    for r in rows {
        assert_eq!(r.len(), if baseline { 7 } else { 5 }, "{}", out.dump());
        assert_eq!((r[0], r[1]), (size, iters), "{}", out.dump());
        // BW average and message rate are positive (the peak may be 0 for tiny runs).
        assert!(r[3] > 0.0 && r[4] > 0.0, "{}", out.dump());
        if baseline {
            // The ratio prints with 2 decimals: a debug build may show 0.00.
            assert!(r[5] > 0.0 && r[6] >= 0.0, "{}", out.dump());
        }
    }
}

fn check_lat(args: &[&str], size: f64, iters: f64, baseline: bool) {
    let out = perf(args);
    assert_eq!(out.code, 0, "{}", out.dump());
    let (header, rows) = rows(&out);
    assert!(header[0].starts_with(LAT_HEADER), "{}", out.dump());
    for r in rows {
        assert_eq!(r.len(), if baseline { 11 } else { 9 }, "{}", out.dump());
        assert_eq!((r[0], r[1]), (size, iters), "{}", out.dump());
        let (min, max, typical, avg) = (r[2], r[3], r[4], r[5]);
        assert!(
            min > 0.0 && min <= typical && typical <= max,
            "{}",
            out.dump()
        );
        assert!(avg >= min && avg <= max, "{}", out.dump());
        assert!(r[7] >= typical && r[8] >= r[7], "{}", out.dump());
        if baseline {
            assert!(r[9] > 0.0 && r[10] > 0.0, "{}", out.dump());
        }
    }
}

#[test]
fn bandwidth_tests_over_udp() {
    check_bw(&["write_bw", "-n", "50", "-s", "4096"], 4096.0, 50.0, false);
    check_bw(&["send_bw", "-n", "50", "-s", "1024"], 1024.0, 50.0, false);
    // -e: sleep on the completion channel instead of spinning on the CQ.
    check_bw(
        &["send_bw", "-n", "50", "-s", "1024", "-e"],
        1024.0,
        50.0,
        false,
    );
    check_bw(&["read_bw", "-n", "50", "-s", "8192"], 8192.0, 50.0, false);
    check_bw(&["atomic_bw", "-n", "50"], 8.0, 50.0, false);
}

#[test]
fn latency_tests_over_udp() {
    check_lat(&["write_lat", "-n", "20", "-s", "8"], 8.0, 20.0, false);
    check_lat(&["send_lat", "-n", "20", "-s", "64"], 64.0, 20.0, false);
    check_lat(
        &["write_lat", "-n", "20", "-s", "8", "--spin-yield"],
        8.0,
        20.0,
        false,
    );
    check_lat(&["read_lat", "-n", "20", "-s", "8"], 8.0, 20.0, false);
    check_lat(&["atomic_lat", "-n", "20"], 8.0, 20.0, false);
}

#[test]
fn baseline_adds_udp_and_ratio_columns() {
    check_bw(
        &["write_bw", "-n", "50", "-s", "65536", "--baseline"],
        65536.0,
        50.0,
        true,
    );
    check_lat(
        &["write_lat", "-n", "20", "-s", "8", "--baseline"],
        8.0,
        20.0,
        true,
    );
    check_lat(
        &[
            "write_lat",
            "-n",
            "20",
            "-s",
            "8",
            "--baseline",
            "--busy-poll",
        ],
        8.0,
        20.0,
        true,
    );
}

/// The JSON of a baseline run: CPU use of both processes against the baseline's, the
/// baseline strategies by name, latency percentiles and the baseline's poll mode.
#[test]
fn baseline_json_has_cpu_percentiles_and_poll_mode() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let json = dir.join(format!("perf-cli-bl-{}.json", std::process::id()));
    let path = json.to_str().unwrap();
    let out = perf(&[
        "write_bw",
        "-n",
        "50",
        "-s",
        "65536",
        "--baseline",
        "--json",
        path,
    ]);
    assert_eq!(out.code, 0, "{}", out.dump());
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let row = &doc["rows"][0];
    let ours = &row["cpu"]["softverbs"];
    assert!(ours["client_s"].as_f64().unwrap() > 0.0, "{row}");
    assert!(ours["server_s"].as_f64().unwrap() > 0.0, "{row}");
    assert!(ours["bytes_per_cpu_s"].as_f64().unwrap() > 0.0, "{row}");
    assert!(row["cpu"]["ratio"].as_f64().unwrap() > 0.0, "{row}");
    let names: Vec<&str> = row["baseline"]["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"no_gso"), "{row}");

    let out = perf(&[
        "write_lat",
        "-n",
        "20",
        "-s",
        "8",
        "--baseline",
        "--json",
        path,
    ]);
    assert_eq!(out.code, 0, "{}", out.dump());
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let row = &doc["rows"][0];
    // write_lat spins on its buffer even with blocking devices: so does the baseline.
    assert_eq!(row["baseline_poll"], "spin", "{row}");
    for q in ["p50", "p99", "p999"] {
        assert!(row["latency"][q].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["baseline"][q].as_f64().unwrap() > 0.0, "{row}");
    }
    assert!(row["ratio_p99"].as_f64().unwrap() > 0.0, "{row}");
    let _ = std::fs::remove_file(&json);
}

#[test]
fn inproc_backend_and_all_sizes_with_json() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let json = dir.join(format!("perf-cli-{}.json", std::process::id()));
    let out = perf(&[
        "send_bw",
        "--backend",
        "inproc",
        "-a",
        "--max-size",
        "64",
        "-n",
        "20",
        "-q",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.dump());
    let (_, rows) = rows(&out);
    let sizes: Vec<f64> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(sizes, [2.0, 4.0, 8.0, 16.0, 32.0, 64.0], "{}", out.dump());
    // Two QPs: iterations count both.
    assert!(rows.iter().all(|r| r[1] == 40.0), "{}", out.dump());
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["rows"].as_array().unwrap().len(), 6);
    assert!(doc["rows"][0]["bw_average"].as_f64().unwrap() > 0.0);
    let _ = std::fs::remove_file(&json);

    check_lat(
        &["write_lat", "--backend", "inproc", "-n", "20", "-s", "8"],
        8.0,
        20.0,
        false,
    );
    check_lat(
        &["atomic_lat", "--backend", "inproc", "-n", "20"],
        8.0,
        20.0,
        false,
    );
}

#[test]
fn gbits_and_duration_modes() {
    let out = perf(&["write_bw", "-n", "20", "-s", "1024", "--report_gbits"]);
    assert_eq!(out.code, 0, "{}", out.dump());
    let (header, _) = rows(&out);
    assert!(header[0].contains("BW average[Gb/sec]"), "{}", out.dump());

    let out = perf(&["write_lat", "--backend", "inproc", "-D", "1", "-s", "8"]);
    assert_eq!(out.code, 0, "{}", out.dump());
    let (header, rows) = rows(&out);
    assert!(header[0].contains("tps average"), "{}", out.dump());
    assert!(rows[0][1] > 0.0 && rows[0][2] > 0.0 && rows[0][3] > 0.0);
}

/// Real UDP and real time: the timeout (`-u 12`, 16.8 ms, eight tries 134 ms) outlasts a
/// process descheduled on a loaded 2-CPU machine; at `-u 8` (1 ms, 8 ms in all) a debug build
/// beside a CI build exhausted its retries in 5 of 40 runs.
#[test]
fn loss_still_completes() {
    check_bw(
        &[
            "write_bw", "-n", "100", "-s", "4096", "--loss", "0.02", "-u", "12",
        ],
        4096.0,
        100.0,
        false,
    );
}

#[test]
fn scale_reports_memory_and_idle_cpu() {
    for backend in ["inproc", "udp"] {
        let out = perf(&["scale", "--qps", "50", "--backend", backend]);
        assert_eq!(out.code, 0, "{}", out.dump());
        assert!(out.stdout.contains("Memory per QP"), "{}", out.dump());
        assert!(out.stdout.contains("Idle device"), "{}", out.dump());
    }
}

#[test]
fn sweep_loss_writes_svg() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let svg = dir.join(format!("perf-sweep-{}.svg", std::process::id()));
    let out = perf(&[
        "--sweep-loss",
        "--backend",
        "inproc",
        "-s",
        "1024",
        "-n",
        "50",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.dump());
    assert!(out.stdout.contains("ratio to lossless"), "{}", out.dump());
    // Both loss-recovery modes, each at every loss rate.
    for mode in ["ibta", "sr"] {
        let rows = out
            .stdout
            .lines()
            .filter(|l| l.starts_with(&format!(" {mode} ")))
            .count();
        assert_eq!(rows, 7, "{mode}: {}", out.dump());
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains("polyline"));
    assert!(text.contains("selective repeat") && text.contains("IBTA go-back-N"));
    let _ = std::fs::remove_file(&svg);
}

/// `--recovery` with `--sweep-loss` sweeps that mode alone: every loss rate, no IBTA row.
#[test]
fn sweep_loss_with_recovery_sweeps_that_mode_only() {
    let out = perf(&[
        "--sweep-loss",
        "--recovery",
        "sr",
        "--backend",
        "inproc",
        "-s",
        "1024",
        "-n",
        "20",
    ]);
    assert_eq!(out.code, 0, "{}", out.dump());
    let rows = |mode: &str| {
        out.stdout
            .lines()
            .filter(|l| l.starts_with(&format!(" {mode} ")))
            .count()
    };
    assert_eq!(rows("sr"), 7, "{}", out.dump());
    assert_eq!(rows("ibta"), 0, "{}", out.dump());
}

/// Five rounds per point (the README's loss table): the client's configuration, every run
/// of the sweep, still fits the one out-of-band line it travels in. Each round runs every
/// loss rate once in each mode, the modes in turn, and a lossless run reports no drop.
#[test]
fn sweep_loss_with_five_rounds_runs_round_by_round() {
    let dir = std::env::temp_dir();
    let json = dir.join(format!("perf-cli-sweep-{}.json", std::process::id()));
    let out = perf(&[
        "--sweep-loss",
        "--rounds",
        "5",
        "--backend",
        "inproc",
        "-s",
        "1024",
        "-n",
        "20",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.dump());
    assert!(out.stdout.contains(" sr    10.0     5 "), "{}", out.dump());
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * 5 * 7, "{doc}");
    let losses: Vec<f64> = rows.iter().map(|r| r["loss"].as_f64().unwrap()).collect();
    let one_round = [0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1];
    for (i, chunk) in losses.chunks(7).enumerate() {
        assert_eq!(chunk, one_round, "round {i} of {losses:?}");
        let mode = if i % 2 == 0 { "ibta" } else { "sr" };
        for r in &rows[i * 7..i * 7 + 7] {
            assert_eq!(r["recovery"], mode, "session {i}: {r}");
        }
    }
    let lossy_drops: u64 = rows
        .iter()
        .filter(|r| r["loss"].as_f64() == Some(0.1))
        .map(|r| r["transport"]["dropped_injected"].as_u64().unwrap())
        .sum();
    assert!(lossy_drops > 0, "10 % loss dropped nothing: {doc}");
    for r in rows.iter().filter(|r| r["loss"].as_f64() == Some(0.0)) {
        assert_eq!(r["transport"]["dropped_injected"], 0, "lossless run: {r}");
    }
}

#[test]
fn bad_flags_exit_2_with_a_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["nonsense_bw"], "invalid value"),
        (&["write_bw", "-n", "3"], "--iters"),
        (&["write_bw", "-s", "0"], "--size"),
        (&["write_bw", "-m", "1000"], "--mtu"),
        (&["write_bw", "--loss", "1.5"], "--loss"),
        (
            &["write_bw", "--backend", "inproc", "--baseline"],
            "--baseline",
        ),
        (&["atomic_bw", "-s", "64"], "atomics are 8 bytes"),
        (&["write_bw", "-a", "-s", "8"], "--size"),
        (&["write_bw", "--bogus"], "--bogus"),
        (&["write_bw", "-D", "1", "-n", "10"], "--duration"),
        (&[], "required"),
    ];
    for (args, needle) in cases {
        let out = perf(args);
        assert_eq!(out.code, 2, "{args:?}\n{}", out.dump());
        assert!(
            out.stderr.contains(needle),
            "{args:?}: stderr lacks {needle:?}\n{}",
            out.dump()
        );
        assert!(out.stdout.trim().is_empty(), "{args:?}\n{}", out.dump());
    }
}

/// A perf server checks the configuration a client sends before it sizes anything: a client
/// asking for 2^60-byte buffers gets an error line, and the server exits 2 naming the field.
#[test]
fn a_server_refuses_a_configuration_out_of_range() {
    use std::io::{BufRead, BufReader, Write};
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut guard = Guard(Some(
        Command::new(env!("CARGO_BIN_EXE_softverbs"))
            .args(["perf", "write_bw", "--server", "--port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let child = guard.0.as_mut().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let config = r#"{"test":"write_bw","runs":[{"size":65536,"loss":0.0}],"max_size":1152921504606846976,"iters":5,"duration":null,"qps":1,"tx_depth":128,"rx_depth":512,"cq_mod":100,"post_list":1,"mtu":4096,"qp_timeout":14,"busy_poll":false,"no_gso":false,"events":false,"spin_yield":false,"baseline":false,"seed":1}"#;
    writeln!(stream, "config {config}").unwrap();
    let mut reply = String::new();
    BufReader::new(&stream).read_line(&mut reply).unwrap();
    assert!(
        reply.starts_with("error bad configuration from the client: max_size"),
        "{reply}"
    );
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    guard.0 = None;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("max_size 1152921504606846976 is outside 1..=8388608"),
        "{stderr}"
    );
}
