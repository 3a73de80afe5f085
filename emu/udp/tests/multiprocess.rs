//! Two OS processes over UDP loopback: this test binary re-executes itself as the client (the
//! environment variable `SOFTVERBS_UDP_TEST_ROLE=client` selects the role), the parent is the
//! server, and the two connect their QPs with the TCP out-of-band exchange. The client WRITEs
//! and SENDs to the server, READs from it and runs atomics on its memory; both sides verify the
//! data. Each scenario runs without and with 5 % injected loss (each process drops 5 % of the
//! datagrams it sends).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use emu_fault::FaultPlan;
use emu_udp::{UdpProvider, oob};
use verbs_api::{
    Context, Device, MemoryRegion, Provider, QueuePair, RcConnectOptions, RecvWr, SendOp, SendWr,
    WcOpcode, WcStatus,
};

const ROLE_ENV: &str = "SOFTVERBS_UDP_TEST_ROLE";
const OOB_ENV: &str = "SOFTVERBS_UDP_TEST_OOB";
const LOSS_ENV: &str = "SOFTVERBS_UDP_TEST_LOSS";

/// Bytes the client WRITEs, and READs back from the server's second half.
const HALF: usize = 256 * 1024;
/// Offset of the 8-byte word the atomics work on.
const WORD: usize = 2 * HALF;
const MSG: &[u8] = b"write done";

fn options(loss: bool) -> oob::ConnectOptions {
    oob::ConnectOptions {
        channel: true,
        rc: RcConnectOptions {
            timeout: if loss { 12 } else { 14 },
            ..RcConnectOptions::default()
        },
        ..oob::ConnectOptions::default()
    }
}

fn provider_for(loss: bool, seed: u64) -> UdpProvider {
    let mut b = UdpProvider::builder().device(addr("127.0.0.1:0"));
    if loss {
        b = b.faults(FaultPlan::new(seed).rule(emu_fault::drop(0.05)));
    }
    b.build().unwrap()
}

/// Kills the child if the parent's side fails first.
struct ChildGuard(Option<Child>);

impl ChildGuard {
    fn wait(mut self, timeout: Duration) -> std::process::ExitStatus {
        let mut child = self.0.take().unwrap();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("client process did not finish in {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn server(loss: bool) {
    let provider = provider_for(loss, 21);
    let ctx = provider.devices().unwrap()[0].open().unwrap();
    let listener = oob::listen(addr("127.0.0.1:0")).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "client_role", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, "client")
        .env(OOB_ENV, listener.local_addr().unwrap().to_string())
        .env(LOSS_ENV, if loss { "1" } else { "0" })
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let guard = ChildGuard(Some(child));

    let mut conn = oob::connect_server(&ctx, &listener, &options(loss)).unwrap();
    let ch = conn.channel.clone().unwrap();
    let mr = ctx.alloc_mr(&conn.pd, WORD + 8, ALL).unwrap();
    mr.write(HALF, &pattern(HALF, 0x5a)).unwrap();
    mr.write(WORD, &1000u64.to_ne_bytes()).unwrap();
    let inbox = ctx.alloc_mr(&conn.pd, 64, ALL).unwrap();
    conn.qp
        .post_recv(&[RecvWr::new(1, &[inbox.sge(0, 64).unwrap()])])
        .unwrap();
    let remote = oob::RemoteMr {
        addr: mr.addr(),
        rkey: mr.rkey(),
        len: mr.len() as u64,
    };
    oob::exchange_mr(&mut conn.stream, &remote).unwrap();

    // The SEND follows the WRITE on the same QP: when it completes, the WRITE has landed.
    let wc = wait_wc(&conn.cq, &ch, WAIT).expect("no SEND from the client");
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Recv));
    let mut msg = vec![0; wc.byte_len as usize];
    inbox.read(0, &mut msg).unwrap();
    assert_eq!(msg, MSG);
    let mut written = vec![0; HALF];
    mr.read(0, &mut written).unwrap();
    assert!(written == pattern(HALF, 0xc1), "WRITE data differs");

    // The client READs and runs its atomics, then meets us here.
    oob::barrier(&mut conn.stream).unwrap();
    let mut word = [0u8; 8];
    mr.read(WORD, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 2005);
    let status = guard.wait(Duration::from_secs(60));
    assert!(status.success(), "client failed: {status}");
    if loss {
        let lost = ctx.fault_counters().unwrap().total().dropped;
        eprintln!(
            "server dropped {lost} of its datagrams; {:?}",
            ctx.device_stats()
        );
    }
}

fn client(server: SocketAddr, loss: bool) {
    let provider = provider_for(loss, 22);
    let ctx = provider.devices().unwrap()[0].open().unwrap();
    let mut conn = oob::connect_client(&ctx, server, &options(loss)).unwrap();
    let ch = conn.channel.clone().unwrap();
    let local = ctx.alloc_mr(&conn.pd, HALF + 16, ALL).unwrap();
    local.write(0, &pattern(HALF, 0xc1)).unwrap();
    let remote = oob::exchange_mr(
        &mut conn.stream,
        &oob::RemoteMr {
            addr: 0,
            rkey: 0,
            len: 0,
        },
    )
    .unwrap();
    let msg = ctx.alloc_mr(&conn.pd, 64, ALL).unwrap();
    msg.write(0, MSG).unwrap();
    let write_sges = [local.sge(0, HALF).unwrap()];
    let write = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        },
        &write_sges,
    );
    let sges = [msg.sge(0, MSG.len()).unwrap()];
    let send = SendWr::new(2, SendOp::Send, &sges);
    conn.qp.post_send(&[write, send]).unwrap();
    for id in [1, 2] {
        let wc = wait_wc(&conn.cq, &ch, WAIT).expect("no completion");
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "{wc:?}");
    }

    // READ the server's second half over our (already sent) first half.
    conn.qp
        .post_send(&[SendWr::new(
            3,
            SendOp::RdmaRead {
                remote_addr: remote.addr + HALF as u64,
                rkey: remote.rkey,
            },
            &[local.sge(0, HALF).unwrap()],
        )])
        .unwrap();
    let wc = wait_wc(&conn.cq, &ch, WAIT).expect("no READ completion");
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::Success));
    let mut read = vec![0; HALF];
    local.read(0, &mut read).unwrap();
    assert!(read == pattern(HALF, 0x5a), "READ data differs");

    let word = remote.addr + WORD as u64;
    let cas_sge = [local.sge(HALF, 8).unwrap()];
    let cas = SendWr::new(
        4,
        SendOp::AtomicCmpAndSwp {
            remote_addr: word,
            rkey: remote.rkey,
            compare: 1000,
            swap: 2000,
        },
        &cas_sge,
    );
    let faa_sge = [local.sge(HALF + 8, 8).unwrap()];
    let faa = SendWr::new(
        5,
        SendOp::AtomicFetchAndAdd {
            remote_addr: word,
            rkey: remote.rkey,
            add: 5,
        },
        &faa_sge,
    );
    conn.qp.post_send(&[cas, faa]).unwrap();
    for id in [4, 5] {
        let wc = wait_wc(&conn.cq, &ch, WAIT).expect("no atomic completion");
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "{wc:?}");
    }
    let mut originals = [0u8; 16];
    local.read(HALF, &mut originals).unwrap();
    assert_eq!(u64::from_ne_bytes(originals[..8].try_into().unwrap()), 1000);
    assert_eq!(u64::from_ne_bytes(originals[8..].try_into().unwrap()), 2000);
    oob::barrier(&mut conn.stream).unwrap();
}

/// The client side, run only in the child process this file's other tests spawn; a no-op in a
/// normal test run.
#[test]
fn client_role() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("client") {
        return;
    }
    let server: SocketAddr = std::env::var(OOB_ENV).unwrap().parse().unwrap();
    let loss = std::env::var(LOSS_ENV).as_deref() == Ok("1");
    client(server, loss);
}

#[test]
fn two_processes_write_send_read_atomics() {
    if std::env::var(ROLE_ENV).is_ok() {
        return; // never recurse from a child
    }
    server(false);
}

#[test]
fn two_processes_with_five_percent_loss() {
    if std::env::var(ROLE_ENV).is_ok() {
        return;
    }
    server(true);
}
