//! Two devices on the RoCEv2 port itself, 127.0.0.1:4791 and 127.0.0.2:4791: SEND/RECV, WRITE,
//! READ and atomics with their data checked, and their traffic — from the driver's own capture
//! and, when dumpcap is installed, from the loopback interface — decodes in tshark as RoCEv2
//! with no "Decode As", nothing malformed and a valid ICRC over the headers on the wire.
//!
//! Skips (printing why) if port 4791 is taken on those addresses, or if tshark is missing
//! outside CI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use emu_udp::UdpProvider;
use verbs_api::{QueuePair, RcConnectOptions};

const A: &str = "127.0.0.1:4791";
const B: &str = "127.0.0.2:4791";

/// Frames dumpcap is asked for.
const DUMPCAP_FRAMES: usize = 40;

#[test]
fn rc_on_port_4791_decodes_as_rocev2() {
    let dir = std::env::temp_dir().join(format!("softverbs-4791-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let own = dir.join("driver.pcap");
    let p = match UdpProvider::builder()
        .device(addr(A))
        .device(addr(B))
        .capture(&own)
        .build()
    {
        Ok(p) => p,
        Err(e) if e.kind == verbs_api::ErrorKind::Io => {
            eprintln!("SKIP rc_on_port_4791: cannot bind {A} and {B}: {e}");
            std::fs::remove_dir_all(&dir).unwrap();
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let (a, b) = pair(&p, &RcConnectOptions::default());
    assert_eq!(a.ctx.local_addr(), addr(A));
    assert_eq!(b.ctx.local_addr(), addr(B));
    assert_eq!(a.qp.endpoint(0).unwrap().udp_port, 4791);

    // dumpcap on lo, if present, while the exchange runs.
    let wire = dir.join("lo.pcap");
    let dumpcap = start_dumpcap(&wire);
    rc_exchange(&a, &b);
    if let Some(mut child) = dumpcap {
        // "Capturing on" can come before the capture filter is live: keep the traffic going
        // until dumpcap has its frames (bounded).
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "dumpcap captured too little");
            rc_exchange(&a, &b);
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "dumpcap failed: {status}");
    }
    p.shutdown();
    p.finish_capture().unwrap();
    let captured = a.ctx.driver_stats().captured + b.ctx.driver_stats().captured;
    let sent = a.ctx.driver_stats().datagrams_sent + b.ctx.driver_stats().datagrams_sent;
    assert_eq!(captured, sent);

    if !tshark::available("tshark") {
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    let ends = [addr(A), addr(B)];
    let check = |f: &tshark::Frame| {
        assert!(
            ends.contains(&f.src) && ends.contains(&f.dst) && f.src != f.dst,
            "{f:?}"
        );
    };
    // No "Decode As": port 4791 is RoCEv2 to tshark.
    let decoded = tshark::decode(&own, &[]);
    assert_eq!(decoded.len() as u64, captured);
    decoded.iter().for_each(check);
    if wire.exists() {
        let decoded = tshark::decode(&wire, &[]);
        assert_eq!(decoded.len(), DUMPCAP_FRAMES);
        decoded.iter().for_each(check);
        eprintln!("dumpcap: {} frames on lo, all RoCEv2", decoded.len());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Starts dumpcap on lo for the two devices' port-4791 traffic; `None` (with the reason
/// printed) if it is not installed or cannot capture here.
fn start_dumpcap(out: &std::path::Path) -> Option<std::process::Child> {
    if Command::new("dumpcap").arg("--version").output().is_err() {
        eprintln!("SKIP dumpcap part: dumpcap not installed");
        return None;
    }
    let (a, b): (SocketAddr, SocketAddr) = (addr(A), addr(B));
    let filter = format!("udp port 4791 and host {} and host {}", a.ip(), b.ip());
    let frames = DUMPCAP_FRAMES.to_string();
    let mut child = Command::new("dumpcap")
        .args(["-P", "-i", "lo", "-f", &filter, "-c", &frames])
        .args(["-a", "duration:30", "-w"])
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let stderr = child.stderr.take()?;
    let mut lines = BufReader::new(stderr).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.contains("Capturing on") => break,
            Some(Ok(_)) => {}
            _ => {
                let status = child.wait().ok();
                eprintln!("SKIP dumpcap part: dumpcap exited before capturing ({status:?})");
                return None;
            }
        }
    }
    // Drain the rest of dumpcap's stderr so it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Some(child)
}
