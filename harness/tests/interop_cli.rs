//! `softverbs pingpong` and `softverbs rdma-check` as two processes over real UDP (loopback,
//! each device bound to port 4791 of its own 127.77.x.y address, as a RoCEv2 peer expects), and
//! the pingpong's handling of a misbehaving peer: malformed messages, a GID of 0, a peer that
//! never sends. The same programs against Linux rxe: `scripts/rxe-interop.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One pair of processes at a time (two cores).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Kills the child if the test fails first.
struct Guard(Option<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

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

fn spawn(args: &[&str]) -> Guard {
    Guard(Some(
        Command::new(env!("CARGO_BIN_EXE_softverbs"))
            .args(args)
            .env("SOFTVERBS_PROVIDER", "udp")
            .env_remove("SOFTVERBS_DEVICE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ))
}

/// Waits for the process (at most `limit`) and collects its output.
fn finish(mut guard: Guard, limit: Duration) -> Out {
    let mut child = guard.0.take().unwrap();
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    Out {
        code: status.code().unwrap_or(-1),
        stdout,
        stderr,
    }
}

/// A TCP port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs a server and a client of `cmd` on devices 127.77.`net`.1 and .2 (port 4791).
fn pair(cmd: &str, net: u8, extra: &[&str]) -> (Out, Out) {
    pair_with(cmd, net, extra, &[])
}

/// As [`pair`], with `server_extra` given to the server only.
fn pair_with(cmd: &str, net: u8, extra: &[&str], server_extra: &[&str]) -> (Out, Out) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let port = free_port().to_string();
    let bind_s = format!("127.77.{net}.1");
    let bind_c = format!("127.77.{net}.2");
    let mut s_args = vec![cmd, "--bind", &bind_s, "-p", &port, "--timeout", "20"];
    s_args.extend_from_slice(extra);
    s_args.extend_from_slice(server_extra);
    let server = spawn(&s_args);
    let mut c_args = vec![cmd, "--bind", &bind_c, "-p", &port, "--timeout", "20"];
    c_args.extend_from_slice(extra);
    c_args.push("127.0.0.1");
    let client = spawn(&c_args);
    let c = finish(client, Duration::from_secs(60));
    let s = finish(server, Duration::from_secs(10));
    (s, c)
}

fn assert_pingpong_output(out: &Out, size: u64, iters: u64) {
    assert_eq!(out.code, 0, "{}", out.dump());
    let bytes = format!("{} bytes in ", size * iters * 2);
    let iters_line = format!("{iters} iters in ");
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with(&bytes) && l.ends_with(" Mbit/sec")),
        "{}",
        out.dump()
    );
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with(&iters_line) && l.ends_with(" usec/iter")),
        "{}",
        out.dump()
    );
    assert!(
        out.stdout.contains("  local address:  LID 0x0000, QPN 0x"),
        "{}",
        out.dump()
    );
    assert!(
        out.stdout.contains("  remote address: LID 0x0000, QPN 0x"),
        "{}",
        out.dump()
    );
    assert!(out.stderr.contains("icrc_errors=0"), "{}", out.dump());
    // softverbs to softverbs: every ICRC verified (none merely accepted as foreign).
    assert!(out.stderr.contains("icrc_ident_solved=0"), "{}", out.dump());
}

#[test]
fn pingpong_two_processes_single_packet_polling() {
    let (s, c) = pair("pingpong", 1, &["-s", "64", "-n", "50"]);
    assert_pingpong_output(&s, 64, 50);
    assert_pingpong_output(&c, 64, 50);
}

#[test]
fn pingpong_two_processes_multi_packet_events() {
    // 10000 B at MTU 1024: SEND_FIRST, 8 MIDDLE, LAST; a small receive queue forces reposting.
    let (s, c) = pair("pingpong", 2, &["-s", "10000", "-n", "30", "-r", "4", "-e"]);
    assert_pingpong_output(&s, 10000, 30);
    assert_pingpong_output(&c, 10000, 30);
}

#[test]
fn ud_pingpong_two_processes_polling_and_events() {
    // UD: one datagram per message, at most the MTU; the receive buffers hold the GRH too.
    let (s, c) = pair("ud-pingpong", 20, &["-s", "1024", "-n", "40"]);
    assert_pingpong_output(&s, 1024, 40);
    assert_pingpong_output(&c, 1024, 40);
    let (s, c) = pair(
        "ud-pingpong",
        21,
        &["-s", "64", "-n", "30", "-r", "4", "-e"],
    );
    assert_pingpong_output(&s, 64, 30);
    assert_pingpong_output(&c, 64, 30);
}

#[test]
fn ud_pingpong_refuses_a_size_above_the_mtu() {
    let (s, c) = pair("ud-pingpong", 22, &["-s", "5000", "-n", "1"]);
    for out in [&s, &c] {
        assert_eq!(out.code, 1, "{}", out.dump());
        assert!(
            out.stderr.contains("larger than the port's MTU"),
            "{}",
            out.dump()
        );
    }
}

#[test]
fn rdma_check_two_processes_every_check_passes() {
    let (s, c) = pair("rdma-check", 3, &[]);
    for out in [&s, &c] {
        assert_eq!(out.code, 0, "{}", out.dump());
        assert!(
            out.stdout.contains("23 checks passed, 0 failed"),
            "{}",
            out.dump()
        );
        assert!(!out.stdout.contains("FAIL"), "{}", out.dump());
    }
    // Both directions ran on each side.
    assert!(
        s.stdout.contains("PASS  this->peer  ATOMIC CMP_SWAP"),
        "{}",
        s.dump()
    );
    assert!(
        s.stdout.contains("PASS  peer->this  target memory equals"),
        "{}",
        s.dump()
    );
    assert!(
        c.stdout.contains("PASS  this->peer  RDMA WRITE 65536 B"),
        "{}",
        c.dump()
    );
}

#[test]
fn pcap_holds_the_traffic_of_the_device() {
    let pcap = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("interop-pingpong.pcap");
    let _ = std::fs::remove_file(&pcap);
    let path = pcap.to_str().unwrap();
    // 3000 B at MTU 1024: 3 packets per SEND, an ACK per SEND; 10 iterations each way.
    let (s, c) = pair_with(
        "pingpong",
        10,
        &["-s", "3000", "-n", "10"],
        &["--pcap", path],
    );
    assert_pingpong_output(&s, 3000, 10);
    assert_pingpong_output(&c, 3000, 10);
    let bytes = std::fs::read(&pcap).unwrap();
    // Classic pcap: a 24-byte header, then one 16-byte record header per packet. At least the
    // 30 data packets the server sent and the 30 it received.
    assert!(
        bytes.len() > 24 + 60 * (16 + 28 + 12),
        "{} bytes",
        bytes.len()
    );
}

/// A pingpong server whose client is this test, speaking raw bytes.
fn fake_client(net: u8, send: &[&[u8]]) -> Out {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let port = free_port();
    let bind = format!("127.77.{net}.1");
    let server = spawn(&[
        "pingpong",
        "--bind",
        &bind,
        "-p",
        &port.to_string(),
        "--timeout",
        "2",
        "-n",
        "5",
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("server never listened: {e}"),
        }
    };
    for chunk in send {
        stream.write_all(chunk).unwrap();
    }
    let out = finish(server, Duration::from_secs(20));
    drop(stream);
    out
}

#[test]
fn pingpong_server_rejects_a_malformed_message() {
    let mut garbage = [b'z'; 52];
    garbage[51] = 0;
    let out = fake_client(4, &[&garbage]);
    assert_eq!(out.code, 1, "{}", out.dump());
    assert!(
        out.stderr.contains("malformed peer message"),
        "{}",
        out.dump()
    );
    assert!(
        out.stderr.contains("LID is not 4 hex digits"),
        "{}",
        out.dump()
    );
}

#[test]
fn pingpong_server_rejects_a_short_message() {
    // 20 bytes, then the peer closes: no hang, a clear error.
    let out = fake_client(5, &[b"0000:000011:000001:0"]);
    assert_eq!(out.code, 1, "{}", out.dump());
    assert!(
        out.stderr.contains("after 20 of the 52 bytes") || out.stderr.contains("timed out reading"),
        "{}",
        out.dump()
    );
}

#[test]
fn pingpong_server_rejects_gid_zero() {
    let msg = b"0000:000011:000001:00000000000000000000000000000000\x00";
    let out = fake_client(6, &[msg]);
    assert_eq!(out.code, 1, "{}", out.dump());
    assert!(out.stderr.contains("GID 0"), "{}", out.dump());
}

#[test]
fn pingpong_server_times_out_when_the_peer_never_sends() {
    // A valid address for a QP that does not exist; then "done", then silence.
    let msg = b"0000:000011:000001:00000000000000000000ffff7f4d0702\x00";
    let out = fake_client(7, &[msg, b"done\0"]);
    assert_eq!(out.code, 1, "{}", out.dump());
    assert!(out.stderr.contains("no completion in 2s"), "{}", out.dump());
}

#[test]
fn pingpong_server_rejects_a_bad_done() {
    let msg = b"0000:000011:000001:00000000000000000000ffff7f4d0802\x00";
    let out = fake_client(8, &[msg, b"nope\0"]);
    assert_eq!(out.code, 1, "{}", out.dump());
    assert!(
        out.stderr.contains("expected \"done\\0\""),
        "{}",
        out.dump()
    );
}

#[test]
fn pingpong_client_rejects_a_malformed_reply() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let client = spawn(&[
        "pingpong",
        "--bind",
        "127.77.9.2",
        "-p",
        &port,
        "--timeout",
        "5",
        "127.0.0.1",
    ]);
    let (mut stream, _) = listener.accept().unwrap();
    let mut theirs = [0u8; 52];
    stream.read_exact(&mut theirs).unwrap();
    assert!(theirs.starts_with(b"0000:0000"), "{theirs:?}");
    assert_eq!(theirs[51], 0);
    assert!(
        theirs.ends_with(b"ffff7f4d0902\0"),
        "{:?}",
        theirs.escape_ascii()
    );
    stream
        .write_all(b"this is not an address message\0")
        .unwrap();
    drop(stream);
    let out = finish(client, Duration::from_secs(20));
    assert_eq!(out.code, 1, "{}", out.dump());
    assert!(
        out.stderr
            .contains("peer closed the connection after 31 of the 52 bytes"),
        "{}",
        out.dump()
    );
}

#[test]
fn bind_is_refused_for_other_providers() {
    let out = finish(
        Guard(Some(
            Command::new(env!("CARGO_BIN_EXE_softverbs"))
                .args(["pingpong", "--provider", "emu", "--bind", "127.0.0.1"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )),
        Duration::from_secs(10),
    );
    assert_eq!(out.code, 1, "{}", out.dump());
    assert!(
        out.stderr
            .contains("--bind applies to the udp provider only"),
        "{}",
        out.dump()
    );
}
