//! Decoding captures with tshark: every frame must be RoCEv2 (the `infiniband` protocol), not
//! malformed, with an ICRC valid over the IP and UDP headers tshark shows.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Command;

use emu_proto::wire::{IpAddrs, IpContext, check_icrc};

/// One decoded frame.
#[derive(Clone, Debug)]
pub struct Frame {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// The BTH opcode byte.
    pub opcode: u8,
    /// The UDP payload (BTH … ICRC).
    pub payload: Vec<u8>,
}

/// Whether `tool` runs; without it a test prints why it skips (and fails under `CI=true`,
/// where `.ci/run` installs it).
pub fn available(tool: &str) -> bool {
    let found = Command::new(tool).arg("--version").output().is_ok();
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{tool} is required in CI (apt-get install -y tshark)"
        );
        eprintln!("SKIP: {tool} not found on PATH; install tshark to run this check");
    }
    found
}

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

/// Decodes `path` with tshark, UDP ports `ports` as RoCEv2 (4791 needs nothing), and checks
/// every frame: the `infiniband` protocol is present, nothing is malformed, and the ICRC is
/// valid over the headers as captured. Panics naming the frame otherwise.
pub fn decode(path: &Path, ports: &[u16]) -> Vec<Frame> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-n").arg("-r").arg(path);
    for port in ports.iter().filter(|&&p| p != 4791) {
        cmd.args(["-d", &format!("udp.port=={port},infiniband")]);
    }
    cmd.args(["-T", "fields", "-E", "separator=|"]);
    for f in [
        "frame.protocols",
        "_ws.malformed",
        "ip.src",
        "ip.dst",
        "ip.id",
        "udp.srcport",
        "udp.dstport",
        "infiniband.bth.opcode",
        "udp.payload",
    ] {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut frames = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let cols: Vec<&str> = line.split('|').collect();
        let [
            protocols,
            malformed,
            src,
            dst,
            id,
            sport,
            dport,
            opcode,
            payload,
        ] = cols[..]
        else {
            panic!("frame {n}: unexpected columns {line:?}");
        };
        assert!(
            protocols.split(':').any(|p| p == "infiniband"),
            "frame {n} is not RoCEv2: {protocols}"
        );
        assert_eq!(malformed, "", "frame {n} is malformed");
        let (src_ip, dst_ip): (IpAddr, IpAddr) = (src.parse().unwrap(), dst.parse().unwrap());
        let (IpAddr::V4(s4), IpAddr::V4(d4)) = (src_ip, dst_ip) else {
            panic!("frame {n}: not IPv4");
        };
        let payload = parse_hex(payload);
        let ip = IpContext {
            addrs: IpAddrs::V4 {
                src: s4,
                dst: d4,
                ident: parse_int(id) as u16,
            },
            src_port: parse_int(sport) as u16,
            dst_port: parse_int(dport) as u16,
        };
        assert_eq!(check_icrc(&ip, &payload), Ok(()), "frame {n}: bad ICRC");
        frames.push(Frame {
            src: SocketAddr::new(src_ip, ip.src_port),
            dst: SocketAddr::new(dst_ip, ip.dst_port),
            opcode: parse_int(opcode) as u8,
            payload,
        });
    }
    // Belt and braces: tshark's own filter finds no malformed frame either.
    let out = Command::new("tshark")
        .arg("-n")
        .arg("-r")
        .arg(path)
        .args(
            ports
                .iter()
                .filter(|&&p| p != 4791)
                .flat_map(|p| ["-d".to_string(), format!("udp.port=={p},infiniband")]),
        )
        .args(["-Y", "_ws.malformed"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        out.stdout.is_empty(),
        "malformed frames: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    frames
}
