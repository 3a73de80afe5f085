//! Unmodified rdma-core programs on the built library: `ibv_devinfo -v`, an
//! `ibv_rc_pingpong` and an `ibv_ud_pingpong` server/client pair (two processes, zero configuration: each binds its
//! own 127.x.y.z:4791), `tests/c/extended.c`, a C program of the extended verbs, and
//! `tests/c/gsi.c`, which opens the GSI through `dlsym(RTLD_DEFAULT, "softverbs_open_gsi")`, and
//! perftest's `ib_write_bw` with `SOFTVERBS_RECOVERY=sr` in both processes.
//!
//! Needs `scripts/build-libibverbs.sh` to have run (its output directory: `LIBIBVERBS_DIR`,
//! default `target/libibverbs`) and Debian's `ibverbs-utils`; skipped
//! loudly otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn lib_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("LIBIBVERBS_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/libibverbs"),
        PathBuf::from,
    );
    if dir.join("libibverbs.so.1").exists() {
        Some(dir)
    } else {
        eprintln!(
            "SKIPPED: {} has no libibverbs.so.1 (run scripts/build-libibverbs.sh)",
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
            "SKIPPED: {} is absent (apt-get install ibverbs-utils)",
            path.display()
        );
        None
    }
}

fn command(prog: &Path, lib: &Path) -> Command {
    let mut c = Command::new(prog);
    c.env("LD_LIBRARY_PATH", lib)
        .env_remove("SOFTVERBS_UDP_ADDRS")
        .env_remove("SOFTVERBS_FAULTS")
        .env_remove("SOFTVERBS_PCAP")
        .env_remove("SOFTVERBS_RECOVERY");
    c
}

/// Waits for a child with a deadline, killing it when the deadline passes.
fn wait(mut child: std::process::Child, limit: Duration) -> Output {
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

#[test]
fn ibv_devinfo_lists_softverbs0() {
    let (Some(lib), Some(prog)) = (lib_dir(), program("ibv_devinfo")) else {
        return;
    };
    let out = command(&prog, &lib).arg("-v").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("hca_id:\tsoftverbs0"), "{text}");
    assert!(text.contains("PORT_ACTIVE"), "{text}");
    assert!(text.contains("link_layer:\t\tEthernet"), "{text}");
    assert!(text.contains("::ffff:127."), "{text}");
    assert!(text.contains("RoCE v2"), "{text}");
}

#[test]
fn ibv_rc_pingpong_server_and_client() {
    let (Some(lib), Some(prog)) = (lib_dir(), program("ibv_rc_pingpong")) else {
        return;
    };
    for extra in [&[][..], &["-e"][..], &["-s", "65536"][..]] {
        pingpong_pair(&lib, &prog, extra);
    }
}

/// UD through the drop-in: `ibv_ud_pingpong -g 0 -c` (each side checks the bytes it
/// receives), polling and with events, up to the 4096-byte MTU payload.
#[test]
fn ibv_ud_pingpong_server_and_client() {
    let (Some(lib), Some(prog)) = (lib_dir(), program("ibv_ud_pingpong")) else {
        return;
    };
    for extra in [&["-c"][..], &["-c", "-e", "-s", "4096"][..]] {
        pingpong_pair(&lib, &prog, extra);
    }
}

/// Runs `prog -g 0 -n 50 EXTRA` as server and client on the built library; both must pass.
fn pingpong_pair(lib: &Path, prog: &Path, extra: &[&str]) {
    // A free TCP port for the programs' own exchange.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let args = |c: &mut Command| {
        c.args(["-g", "0", "-n", "50", "-p", &port.to_string()])
            .args(extra);
    };
    let mut server = command(prog, lib);
    args(&mut server);
    let server = server
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut client = command(prog, lib);
    args(&mut client);
    let mut tries = 0;
    let client = loop {
        let out = wait(
            client
                .arg("127.0.0.1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
            Duration::from_secs(60),
        );
        // The server may not listen yet on a loaded machine: retry the connect.
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        if out.status.success() || !err.contains("Couldn't connect") || tries == 10 {
            break out;
        }
        tries += 1;
        std::thread::sleep(Duration::from_millis(300));
        client = command(prog, lib);
        args(&mut client);
    };
    let server = wait(server, Duration::from_secs(60));
    let show = |o: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(
        client.status.success(),
        "client {extra:?}: {}",
        show(&client)
    );
    assert!(
        server.status.success(),
        "server {extra:?}: {}",
        show(&server)
    );
    assert!(show(&client).contains("50 iters in"), "{}", show(&client));
}

/// `tests/c/extended.c`, compiled against the installed `verbs.h` and linked with the built
/// library: the header's inline dispatch (`ibv_create_qp_ex`, `ibv_wr_*`, `ibv_start_poll`, …)
/// reaches this library's function pointers.
#[test]
fn c_program_uses_the_extended_verbs_through_the_header() {
    run_c_program("extended", "127.0.93.1,127.0.93.2");
}

/// `tests/c/gsi.c`: `softverbs_open_gsi` found with `dlsym(RTLD_DEFAULT, …)` as the rdma_cm
/// drop-in finds it; a MAD between two devices' QP1s.
#[test]
fn c_program_opens_the_gsi_through_dlsym() {
    run_c_program("gsi", "127.0.96.1,127.0.96.2");
}

/// Compiles `tests/c/<name>.c` against the installed `verbs.h`, links it with the built library
/// and runs it on two devices at `addrs`; it must print "ok" and exit 0.
fn run_c_program(name: &str, addrs: &str) {
    let Some(lib) = lib_dir() else {
        return;
    };
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!(
            "SKIPPED: /usr/include/infiniband/verbs.h is absent (apt-get install libibverbs-dev)"
        );
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let dir =
        std::env::temp_dir().join(format!("softverbs-ibverbs-c-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(name);
    let built = Command::new("cc")
        .arg("-Wall")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", lib.display()))
        .arg("-libverbs")
        .arg("-ldl")
        .output();
    let built = match built {
        Ok(b) => b,
        Err(e) => {
            eprintln!("SKIPPED: cannot run cc: {e}");
            return;
        }
    };
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let child = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib)
        .env("SOFTVERBS_UDP_ADDRS", addrs)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait(child, Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success() && out.stdout == b"ok\n",
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `SOFTVERBS_RECOVERY=sr` in both processes: perftest's `ib_write_bw` (RC, 64 KiB WRITEs)
/// under 2 % loss on each side runs with selective repeat — the server, the WRITEs' responder,
/// sends selective ACKs (opcode 0xF1 in its capture) — and passes; the same run without the
/// variable sends none (IBTA go-back-N).
#[test]
fn ib_write_bw_runs_with_selective_repeat_when_both_processes_ask() {
    let (Some(lib), Some(prog)) = (lib_dir(), program("ib_write_bw")) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("sv-recovery-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan = dir.join("loss.toml");
    std::fs::write(
        &plan,
        "seed = 19\n\n[[rule]]\naction = \"drop\"\nprobability = 0.02\n",
    )
    .unwrap();
    for (recovery, want_sacks) in [(Some("sr"), true), (None, false)] {
        let pcap = dir.join(format!("server-{}.pcap", recovery.unwrap_or("ibta")));
        let env = |c: &mut Command, pcap: Option<&Path>| {
            c.env("SOFTVERBS_FAULTS", &plan);
            if let Some(pcap) = pcap {
                c.env("SOFTVERBS_PCAP", pcap);
            }
            match recovery {
                Some(r) => c.env("SOFTVERBS_RECOVERY", r),
                None => c.env_remove("SOFTVERBS_RECOVERY"),
            };
        };
        let (client, server) =
            server_client(&lib, &prog, &["-s", "65536", "-n", "200"], env, &pcap);
        assert!(client.status.success(), "client {recovery:?}: {client:?}");
        assert!(server.status.success(), "server {recovery:?}: {server:?}");
        let text = String::from_utf8_lossy(&client.stdout);
        assert!(text.contains("65536"), "client {recovery:?}: {text}");
        let sacks = bth_opcodes(&std::fs::read(&pcap).unwrap())
            .filter(|&op| op == 0xF1)
            .count();
        assert_eq!(
            sacks > 0,
            want_sacks,
            "{recovery:?}: {sacks} selective ACKs"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `prog ARGS` as server (capturing to `pcap`) and client on the built library, each
/// with `env` applied; returns (client, server) output.
fn server_client(
    lib: &Path,
    prog: &Path,
    args: &[&str],
    env: impl Fn(&mut Command, Option<&Path>),
    pcap: &Path,
) -> (Output, Output) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let mut server = command(prog, lib);
    server.args(args).args(["-p", &port]);
    env(&mut server, Some(pcap));
    let server = server
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mut tries = 0;
    let client = loop {
        let mut client = command(prog, lib);
        client.args(args).args(["-p", &port, "127.0.0.1"]);
        env(&mut client, None);
        let out = wait(
            client
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
            Duration::from_secs(120),
        );
        // The server may not listen yet on a loaded machine: retry the connect.
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        if out.status.success() || !err.contains("Couldn't connect") || tries == 10 {
            break out;
        }
        tries += 1;
        std::thread::sleep(Duration::from_millis(300));
    };
    (client, wait(server, Duration::from_secs(120)))
}

/// The BTH opcodes of the RoCEv2 packets in a pcap file (LINKTYPE_ETHERNET, IPv4, native byte
/// order, as `SOFTVERBS_PCAP` writes).
fn bth_opcodes(pcap: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let mut at = 24;
    std::iter::from_fn(move || {
        loop {
            let hdr = pcap.get(at..at + 16)?;
            let len = u32::from_ne_bytes(hdr[8..12].try_into().unwrap()) as usize;
            let frame = pcap.get(at + 16..at + 16 + len)?;
            at += 16 + len;
            if frame.get(12..14) != Some(&[0x08, 0x00][..]) || frame.get(23) != Some(&17) {
                continue;
            }
            let udp = 14 + usize::from(frame[14] & 0xF) * 4;
            if frame.get(udp + 2..udp + 4) == Some(&4791u16.to_be_bytes()[..]) {
                if let Some(&op) = frame.get(udp + 8) {
                    return Some(op);
                }
            }
        }
    })
}
