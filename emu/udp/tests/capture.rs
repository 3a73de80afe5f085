//! pcap capture of live UDP traffic (`UdpBuilder::capture`, `UdpContext::set_capture`): the
//! files hold exactly what crossed the sockets, with the real addresses, ports and wall-clock
//! timestamps, and decode in tshark as RoCEv2 with nothing malformed and a valid ICRC.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use emu_udp::UdpProvider;
use verbs_api::RcConnectOptions;

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("softverbs-{name}-{}.pcap", std::process::id()))
}

fn wall() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

/// The frames of a pcap file: (timestamp, Ethernet frame).
fn frames(path: &Path) -> Vec<(Duration, Vec<u8>)> {
    let file = std::fs::File::open(path).unwrap();
    let mut reader = pcap_file::pcap::PcapReader::new(file).unwrap();
    let mut out = Vec::new();
    while let Some(pkt) = reader.next_packet() {
        let pkt = pkt.unwrap();
        out.push((pkt.timestamp, pkt.data.into_owned()));
    }
    out
}

#[test]
fn a_builder_capture_holds_every_datagram_once_and_decodes_as_rocev2() {
    let path = temp("udp-capture");
    let start = wall();
    let p = UdpProvider::builder()
        .device(addr("127.0.0.71:0"))
        .device(addr("127.0.0.72:0"))
        .capture(&path)
        .build()
        .unwrap();
    let (a, b) = pair(&p, &RcConnectOptions::default());
    rc_exchange(&a, &b);
    let (sa, sb) = (a.ctx.driver_stats(), b.ctx.driver_stats());
    p.shutdown();
    p.finish_capture().unwrap();
    let end = wall();
    // Both devices are members: each datagram is written once, by its sender.
    let (sa2, sb2) = (a.ctx.driver_stats(), b.ctx.driver_stats());
    let sent = sa2.datagrams_sent + sb2.datagrams_sent;
    assert_eq!(sa2.captured + sb2.captured, sent, "{sa2:?} {sb2:?}");
    // a: SEND, three WRITE packets, READ request, two atomics; b: ACKs, READ responses.
    assert!(
        sa.datagrams_sent >= 7 && sb.datagrams_sent >= 5,
        "{sa:?} {sb:?}"
    );

    let frames = frames(&path);
    assert_eq!(frames.len() as u64, sent);
    for (ts, _) in &frames {
        assert!(*ts + Duration::from_secs(1) >= start && *ts <= end + Duration::from_secs(1));
    }
    let (pa, pb) = (a.ctx.local_addr(), b.ctx.local_addr());
    if tshark::available("tshark") {
        let decoded = tshark::decode(&path, &[pa.port(), pb.port()]);
        assert_eq!(decoded.len(), frames.len());
        for f in &decoded {
            assert!(
                (f.src, f.dst) == (pa, pb) || (f.src, f.dst) == (pb, pa),
                "{f:?}"
            );
        }
        // Requests a -> b: SEND_ONLY, WRITE_FIRST, READ_REQUEST, FETCH_ADD, COMPARE_SWAP ...
        let ops: Vec<u8> = decoded
            .iter()
            .filter(|f| f.src == pa)
            .map(|f| f.opcode)
            .collect();
        for op in [0x04, 0x06, 0x07, 0x08, 0x0C, 0x13, 0x14] {
            assert!(ops.contains(&op), "no opcode {op:#04x} from a: {ops:x?}");
        }
        // ... and the responses b -> a: ACK, READ_RESPONSE_*, ATOMIC_ACK.
        let ops: Vec<u8> = decoded
            .iter()
            .filter(|f| f.src == pb)
            .map(|f| f.opcode)
            .collect();
        for op in [0x0D, 0x0E, 0x0F, 0x11, 0x12] {
            assert!(ops.contains(&op), "no opcode {op:#04x} from b: {ops:x?}");
        }
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_device_capture_set_at_run_time_sees_both_directions() {
    let path = temp("udp-capture-rt");
    let p = provider(&["127.0.0.73:0", "127.0.0.74:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    b.ctx.set_capture(Some(&path)).unwrap();
    let before = b.ctx.driver_stats();
    rc_exchange(&a, &b);
    // Everything b sent and received so far is in the file (the last ACK may still leave).
    assert!(wait_until(WAIT, || {
        let s = b.ctx.driver_stats();
        s.captured - before.captured
            == (s.datagrams_sent - before.datagrams_sent)
                + (s.datagrams_received - before.datagrams_received)
    }));
    b.ctx.set_capture(None).unwrap();
    let after = b.ctx.driver_stats();
    let n = after.captured - before.captured;
    let frames = frames(&path);
    assert_eq!(frames.len() as u64, n);
    let (pa, pb) = (a.ctx.local_addr(), b.ctx.local_addr());
    if tshark::available("tshark") {
        let decoded = tshark::decode(&path, &[pa.port(), pb.port()]);
        assert!(
            decoded.iter().any(|f| (f.src, f.dst) == (pa, pb)),
            "received"
        );
        assert!(decoded.iter().any(|f| (f.src, f.dst) == (pb, pa)), "sent");
    }
    // Stopped: nothing more is written.
    rc_exchange(&a, &b);
    assert_eq!(b.ctx.driver_stats().captured, after.captured);
    assert_eq!(a.ctx.driver_stats().captured, 0);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn capture_errors_are_reported() {
    let missing = std::env::temp_dir()
        .join(format!("softverbs-no-such-dir-{}", std::process::id()))
        .join("x.pcap");
    let err = UdpProvider::builder()
        .device(addr("127.0.0.75:0"))
        .capture(&missing)
        .build()
        .unwrap_err();
    assert_eq!(err.kind, verbs_api::ErrorKind::Io);
    assert!(err.to_string().contains("x.pcap"), "{err}");

    let p = provider(&["127.0.0.75:0", "127.0.0.76:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let err = a.ctx.set_capture(Some(&missing)).unwrap_err();
    assert_eq!(err.kind, verbs_api::ErrorKind::Io);
    p.finish_capture().unwrap();

    // A file whose writes fail: /dev/full accepts the open and refuses every byte.
    let full = Path::new("/dev/full");
    if !full.exists() {
        eprintln!("SKIP write-error check: no /dev/full");
        return;
    }
    a.ctx.set_capture(Some(full)).unwrap();
    rc_exchange(&a, &b);
    let err = a.ctx.set_capture(None).unwrap_err();
    assert_eq!(err.kind, verbs_api::ErrorKind::Io);
    assert!(err.to_string().contains("/dev/full"), "{err}");
    // The device no longer uses that file: the provider has nothing left to report.
    p.finish_capture().unwrap();
    // The device keeps working.
    rc_exchange(&a, &b);
}
