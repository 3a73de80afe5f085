//! Unmodified rdmacm-utils programs on the built libraries, server and client as two
//! processes: `rping -v -C 100` and `ucmatose`, and a client whose server is killed
//! mid-handshake. The server binds a fixed loopback address (its process's device then sits on
//! it); the client's device takes its zero-configuration `127.x.y.z`.
//!
//! Needs `scripts/build-librdmacm.sh` to have run (`LIBIBVERBS_DIR`, default
//! `target/libibverbs`) and Debian's `rdmacm-utils`; skipped loudly otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn lib_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("LIBIBVERBS_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/libibverbs"),
        PathBuf::from,
    );
    if dir.join("librdmacm.so.1").exists() && dir.join("libibverbs.so.1").exists() {
        Some(dir)
    } else {
        eprintln!(
            "SKIPPED: {} lacks librdmacm.so.1 (run scripts/build-librdmacm.sh)",
            dir.display()
        );
        None
    }
}

fn program(name: &str) -> Option<PathBuf> {
    let path = Path::new("/usr/bin").join(name);
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "SKIPPED: {} is absent (apt-get install rdmacm-utils)",
            path.display()
        );
        None
    }
}

fn spawn(prog: &Path, lib: &Path, args: &[&str]) -> Child {
    Command::new(prog)
        .args(args)
        .env("LD_LIBRARY_PATH", lib)
        .env_remove("SOFTVERBS_UDP_ADDRS")
        .env_remove("SOFTVERBS_FAULTS")
        .env_remove("SOFTVERBS_PCAP")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a child with a deadline, killing it when the deadline passes.
fn wait(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs a server and a client; returns their outputs.
fn pair(prog: &Path, lib: &Path, server: &[&str], client: &[&str]) -> (Output, Output) {
    let s = spawn(prog, lib, server);
    std::thread::sleep(Duration::from_millis(500));
    let c = wait(spawn(prog, lib, client), Duration::from_secs(60));
    let s = wait(s, Duration::from_secs(10));
    (s, c)
}

#[test]
fn rping_server_and_client_100_pings() {
    let (Some(lib), Some(prog)) = (lib_dir(), program("rping")) else {
        return;
    };
    let a = ["-v", "-C", "100", "-a", "127.0.98.1", "-p", "19801"];
    let (s, c) = pair(
        &prog,
        &lib,
        &[&["-s"][..], &a].concat(),
        &[&["-c"][..], &a].concat(),
    );
    assert!(c.status.success(), "client: {}", text(&c));
    assert!(s.status.success(), "server: {}", text(&s));
    assert_eq!(text(&c).matches("ping data").count(), 100, "{}", text(&c));
}

#[test]
fn ucmatose_server_and_client() {
    let (Some(lib), Some(prog)) = (lib_dir(), program("ucmatose")) else {
        return;
    };
    let (s, c) = pair(
        &prog,
        &lib,
        &["-b", "127.0.98.2", "-p", "19802"],
        &["-s", "127.0.98.2", "-p", "19802"],
    );
    assert!(c.status.success(), "client: {}", text(&c));
    assert!(s.status.success(), "server: {}", text(&s));
    assert!(text(&c).contains("return status 0"), "{}", text(&c));
}

/// A server killed mid-handshake: rping's server listens, is frozen (SIGSTOP) so that the
/// client's REQ reaches its socket unanswered, then killed. The client sees
/// `RDMA_CM_EVENT_UNREACHABLE` once its REQ retries run out, within the CM timeout bound:
/// (retries + 1) × (`ib_time(response timeout)` + `ib_time(ACK timeout 14)`) — shortened here
/// with `SOFTVERBS_CM_RESPONSE_TIMEOUT=16` and `SOFTVERBS_CM_RETRIES=3` to 4 × 335.5 ms.
#[test]
fn client_of_a_server_killed_mid_handshake_is_unreachable_within_the_cm_bound() {
    let (Some(lib), Some(prog)) = (lib_dir(), program("rping")) else {
        return;
    };
    let a = ["-v", "-C", "1", "-a", "127.0.98.3", "-p", "19803"];
    let mut server = spawn(&prog, &lib, &[&["-s"][..], &a].concat());
    std::thread::sleep(Duration::from_millis(500));
    let pid = server.id() as libc::pid_t;
    // SAFETY: signals our own child, which has not been reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let bound = 4.0 * (emu_cm::ib_time(16) + emu_cm::ib_time(14)).as_secs_f64();
    let start = Instant::now();
    let client = Command::new(&prog)
        .args([&["-c"][..], &a].concat())
        .env("LD_LIBRARY_PATH", &lib)
        .env("SOFTVERBS_CM_RESPONSE_TIMEOUT", "16")
        .env("SOFTVERBS_CM_RETRIES", "3")
        .env_remove("SOFTVERBS_UDP_ADDRS")
        .env_remove("SOFTVERBS_FAULTS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    server.kill().unwrap();
    let _ = server.wait();
    let c = wait(client, Duration::from_secs(30));
    let took = start.elapsed().as_secs_f64();
    let t = text(&c);
    assert!(!c.status.success(), "{t}");
    assert!(t.contains("RDMA_CM_EVENT_UNREACHABLE"), "{t}");
    assert!(
        took >= bound * 0.95 && took < bound + 5.0,
        "UNREACHABLE after {took:.2} s, bound {bound:.2} s: {t}"
    );
}
