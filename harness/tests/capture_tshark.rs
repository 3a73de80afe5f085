//! The demo capture (`softverbs capture`) is a real exchange through the RC engine on the
//! in-process fabric. It holds every opcode the engine emits, the three NAK kinds, requests on
//! both sides of the PSN wrap, and it decodes in tshark as InfiniBand with the opcodes, PSNs,
//! QPNs and AETH syndromes the engine sent, nothing malformed, and a valid ICRC on every packet
//! (rc-transport.md §1.8, §1.11).
//!
//! Needs `tshark` on PATH. Without it the test fails when `CI=true` and is skipped otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::process::Command;

use emu_proto::wire::{ALL_RC, IpAddrs, IpContext, NakCode, Opcode, Syndrome, check_icrc};
use softverbs_cli::capture::{CaptureSummary, NODE_A, NODE_B, write_demo_capture};

/// Opcodes the engine never emits: `verbs_api` has no SEND_WITH_INV work request.
const NOT_EMITTED: [Opcode; 2] = [
    Opcode::SendLastWithInvalidate,
    Opcode::SendOnlyWithInvalidate,
];

/// tshark fields, in output column order.
const FIELDS: [&str; 13] = [
    "infiniband.bth.opcode",
    "infiniband.bth.psn",
    "infiniband.bth.destqp",
    "infiniband.aeth.syndrome",
    "infiniband.invariant.crc",
    "_ws.malformed",
    "_ws.expert",
    "ip.src",
    "ip.dst",
    "ip.id",
    "udp.srcport",
    "udp.dstport",
    "udp.payload",
];

fn parse_int(s: &str) -> u32 {
    match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

fn parse_hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The script's own promises, independent of tshark.
fn check_summary(summary: &CaptureSummary) {
    let seen: HashSet<_> = summary.packets.iter().map(|p| p.opcode).collect();
    for op in ALL_RC.into_iter().filter(|op| !NOT_EMITTED.contains(op)) {
        assert!(seen.contains(&op), "no {} packet in the demo", op.name());
    }
    for op in NOT_EMITTED {
        assert!(
            !seen.contains(&op),
            "{} is not a verbs operation",
            op.name()
        );
    }
    let syndromes: Vec<_> = summary.packets.iter().filter_map(|p| p.syndrome).collect();
    assert!(syndromes.contains(&Syndrome::ACK_UNLIMITED));
    assert!(syndromes.contains(&Syndrome::Nak(NakCode::PsnSequenceError)));
    assert!(syndromes.contains(&Syndrome::Nak(NakCode::RemoteAccessError)));
    assert!(
        syndromes
            .iter()
            .any(|s| matches!(s, Syndrome::RnrNak { .. }))
    );
    // Requests cross the 24-bit PSN wrap.
    assert!(summary.packets.iter().any(|p| p.psn.value() == 0xFF_FFFF));
    assert!(summary.packets.iter().any(|p| p.psn.value() == 0));
}

fn tshark_available() -> bool {
    let found = Command::new("tshark").arg("--version").output().is_ok();
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "tshark is required in CI (apt-get install -y tshark)"
        );
        eprintln!("SKIP: tshark not found on PATH; install it to run the capture decode check");
    }
    found
}

#[test]
fn demo_capture_decodes_in_tshark() {
    let path = std::env::temp_dir().join(format!("softverbs-demo-{}.pcap", std::process::id()));
    let summary = write_demo_capture(&path).unwrap();
    check_summary(&summary);
    if !tshark_available() {
        return;
    }

    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(&path)
        .args(["-T", "fields", "-E", "separator=|"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), summary.packet_count(), "{text}");

    for (i, (row, want)) in rows.iter().zip(&summary.packets).enumerate() {
        let frame = i + 1;
        let [
            opcode,
            psn,
            destqp,
            syndrome,
            icrc,
            malformed,
            expert,
            src,
            dst,
            id,
            sport,
            dport,
            payload,
        ] = row[..]
        else {
            panic!("frame {frame}: unexpected columns {row:?}");
        };
        assert_eq!(
            parse_int(opcode),
            u32::from(u8::from(want.opcode)),
            "frame {frame}"
        );
        assert_eq!(parse_int(psn), want.psn.value(), "frame {frame}");
        assert_eq!(parse_int(destqp), want.dest_qp, "frame {frame}");
        assert_eq!(
            (!syndrome.is_empty()).then(|| parse_int(syndrome)),
            want.syndrome.map(|s| u32::from(u8::from(s))),
            "frame {frame}"
        );
        assert_eq!(malformed, "", "frame {frame} is malformed");
        let (src_ip, dst_ip) = (src.parse::<Ipv4Addr>().unwrap(), dst.parse().unwrap());
        assert!(
            [(NODE_A, NODE_B), (NODE_B, NODE_A)].contains(&(src_ip, dst_ip)),
            "frame {frame}: {src_ip} -> {dst_ip}"
        );
        assert_eq!(expert, "", "frame {frame} has expert info");

        // ICRC: recompute from the headers and bytes as tshark reports them.
        let udp_payload = parse_hex(payload);
        let ip = IpContext {
            addrs: IpAddrs::V4 {
                src: src.parse::<Ipv4Addr>().unwrap(),
                dst: dst.parse::<Ipv4Addr>().unwrap(),
                ident: parse_int(id) as u16,
            },
            src_port: parse_int(sport) as u16,
            dst_port: parse_int(dport) as u16,
        };
        assert_eq!(check_icrc(&ip, &udp_payload), Ok(()), "frame {frame}");
        // tshark shows the ICRC field as the big-endian reading of the four wire bytes.
        let tail: [u8; 4] = udp_payload[udp_payload.len() - 4..].try_into().unwrap();
        assert_eq!(parse_int(icrc), u32::from_be_bytes(tail), "frame {frame}");
    }
}
