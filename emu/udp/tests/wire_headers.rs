//! What our UDP sender puts on the wire, captured from the loopback interface with dumpcap:
//! IPv4 with DF set and identification 0, UDP destination port the peer's, and an ICRC that is
//! valid over the *real* IP and UDP headers, so that a real RoCEv2 peer's check passes
//! (issue 3; rc-transport.md §1.8 and its addendum; `emu_proto::wire::ip` lists the assumed
//! header values).
//!
//! Needs root and dumpcap (Debian's `wireshark-common`, installed with tshark by `.ci/run`).
//! Without them the test fails under `CI=true` and prints a skip notice elsewhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use emu_proto::wire::icrc::icrc_over_headers;
use emu_proto::wire::{ICRC_LEN, Packet, PacketRepr};
use verbs_api::{MemoryRegion, QueuePair, RcConnectOptions, RecvWr, SendOp, SendWr};

const ETH_LEN: usize = 14;

#[test]
fn sender_headers_are_df_id0_and_the_icrc_covers_them() {
    if Command::new("dumpcap").arg("--version").output().is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "dumpcap is required in CI (apt-get install tshark)"
        );
        eprintln!("SKIP sender_headers: dumpcap not installed");
        return;
    }
    let dir = std::env::temp_dir().join(format!("softverbs-wire-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("lo.pcap");
    // Capture what 127.0.0.41 sends, on its own address so parallel tests do not interfere.
    let mut dumpcap = Command::new("dumpcap")
        .args([
            "-P",
            "-i",
            "lo",
            "-f",
            "udp and src host 127.0.0.41",
            "-c",
            "8",
            "-a",
            "duration:20",
        ])
        .arg("-w")
        .arg(&pcap)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = dumpcap.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let started = Instant::now();
    loop {
        let line = lines
            .next()
            .expect("dumpcap exited before capturing")
            .unwrap();
        if line.contains("Capturing on") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "dumpcap did not start"
        );
    }

    let p = common::provider(&["127.0.0.41:0", "127.0.0.42:0"]);
    let (a, b) = common::pair(&p, &RcConnectOptions::default());
    let src = a.mr(4096);
    let dst = b.mr(4096);
    src.write(0, &common::pattern(3000, 7)).unwrap();
    let rsge = [dst.sge(0, 4096).unwrap()];
    b.qp.post_recv(&[RecvWr::new(1, &rsge)]).unwrap();
    let ssge = [src.sge(0, 3000).unwrap()];
    a.qp.post_send(&[SendWr::new(2, SendOp::Send, &ssge)])
        .unwrap();
    assert!(a.wc().is_success());
    assert!(b.wc().is_success());
    // "Capturing on" can come before the capture filter is live: keep sending until dumpcap
    // has its packets (bounded).
    let write = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut wr_id = 10;
    let status = loop {
        if let Some(status) = dumpcap.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "dumpcap captured nothing");
        a.qp.post_send(&[SendWr::new(wr_id, write, &ssge)]).unwrap();
        assert!(a.wc().is_success());
        wr_id += 1;
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "dumpcap failed: {status}");
    drop(lines);

    let file = std::fs::File::open(&pcap).unwrap();
    let mut reader = pcap_file::pcap::PcapReader::new(file).unwrap();
    let mut seen = 0;
    while let Some(pkt) = reader.next_packet() {
        let frame = pkt.unwrap().data.into_owned();
        let ip = &frame[ETH_LEN..];
        assert_eq!(ip[0], 0x45, "IPv4 without options");
        assert_eq!(
            u16::from_be_bytes([ip[4], ip[5]]),
            0,
            "IPv4 identification must be 0"
        );
        assert_eq!(ip[6] & 0x40, 0x40, "DF must be set");
        let headers = &ip[..28];
        let udp_payload = &ip[28..];
        let stored = u32::from_le_bytes(
            udp_payload[udp_payload.len() - ICRC_LEN..]
                .try_into()
                .unwrap(),
        );
        assert_eq!(
            icrc_over_headers(headers, udp_payload).unwrap(),
            stored,
            "the ICRC must be valid over the headers on the wire"
        );
        PacketRepr::parse(&Packet::new_unchecked(udp_payload)).unwrap();
        seen += 1;
    }
    assert_eq!(seen, 8);
    std::fs::remove_dir_all(&dir).unwrap();
}
