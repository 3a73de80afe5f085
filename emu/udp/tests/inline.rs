//! Run-to-completion on the UDP path: verbs calls send the packets they make ready from the
//! caller's thread, through the same send-side faults and capture as the progress thread; in
//! busy-poll mode the application threads that poll the devices drive them. Every wait is
//! bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use common::*;
use emu_fault::{FaultPlan, drop, duplicate};
use emu_udp::{UdpMr, UdpProvider};
use verbs_api::{
    CompletionChannel, CompletionQueue, MemoryRegion, QueuePair, RcConnectOptions, RecvWr,
    SendFlags, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

/// Held by the tests whose threads spin and by the one that counts on a polling thread being
/// on its CPU when a datagram arrives, so that they do not run at the same time.
static SPINNING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("softverbs-{name}-{}.pcap", std::process::id()))
}

/// The frames of a pcap file, in order.
fn frames(path: &Path) -> Vec<Vec<u8>> {
    let file = std::fs::File::open(path).unwrap();
    let mut reader = pcap_file::pcap::PcapReader::new(file).unwrap();
    let mut out = Vec::new();
    while let Some(pkt) = reader.next_packet() {
        out.push(pkt.unwrap().data.into_owned());
    }
    out
}

#[test]
fn inline_sends_pass_the_send_side_faults_and_the_capture() {
    let path = temp("inline-capture");
    let p = UdpProvider::builder()
        .device(addr("127.0.0.101:0"))
        .device(addr("127.0.0.102:0"))
        .capture(&path)
        .build()
        .unwrap();
    let opts = RcConnectOptions {
        timeout: 10, // ~4.2 ms: the retransmission after the drops comes quickly
        ..RcConnectOptions::default()
    };
    let (a, b) = pair(&p, &opts);
    let dst = b.mr(4096);

    // Every datagram a sends goes out twice; b drops each copy as a duplicate request.
    a.ctx
        .set_faults(Some(FaultPlan::new(1).rule(duplicate(1))))
        .unwrap();
    let before = a.ctx.driver_stats();
    const PINGS: u64 = 20;
    for i in 0..PINGS {
        b.qp.post_recv(&[RecvWr::new(i, &[dst.sge(0, 64).unwrap()])])
            .unwrap();
        a.qp.post_send(&[SendWr::inline(i, SendOp::Send, b"ping")])
            .unwrap();
        assert_eq!(a.wc().status, WcStatus::Success);
        let wc = b.wc();
        assert_eq!((wc.wr_id, wc.byte_len), (i, 4));
    }
    let s = a.ctx.driver_stats();
    // The posts sent their SENDs from this thread (a post leaves them to the progress thread
    // only while that one runs a pass, never for all of them)...
    assert!(s.inline_sends > before.inline_sends, "{s:?}");
    // ... through the fault stage: each SEND went out twice.
    let duplicated = a.ctx.fault_counters().unwrap().total().duplicated;
    assert!(duplicated >= PINGS, "{duplicated} duplicated");
    assert!(
        s.datagrams_sent - before.datagrams_sent >= 2 * PINGS,
        "{s:?}"
    );
    // (The last copy may still be on its way.)
    assert!(wait_until(WAIT, || {
        b.qp.stats().unwrap().duplicate_request >= PINGS
    }));

    // Every datagram a sends is dropped: nothing reaches b until the plan is removed, then
    // a retransmission does.
    a.ctx
        .set_faults(Some(FaultPlan::new(2).rule(drop(1.0))))
        .unwrap();
    b.qp.post_recv(&[RecvWr::new(99, &[dst.sge(0, 64).unwrap()])])
        .unwrap();
    // (Counted as packets b accepts, not datagrams it reads: a copy sent under the last plan,
    // a late retransmission's duplicate say, may still arrive, and b drops it as a duplicate.)
    let accepted = b.qp.stats().unwrap().rcvd_pkts;
    a.qp.post_send(&[SendWr::inline(99, SendOp::Send, b"lost once")])
        .unwrap();
    assert!(wait_until(WAIT, || {
        a.ctx.fault_counters().unwrap().total().dropped >= 2
    }));
    assert_eq!(
        b.qp.stats().unwrap().rcvd_pkts,
        accepted,
        "a dropped SEND reached b"
    );
    a.ctx.set_faults(None).unwrap();
    assert_eq!(b.wc().wr_id, 99);
    assert_eq!(a.wc().status, WcStatus::Success);
    assert!(a.qp.stats().unwrap().retransmits_timeout >= 1);

    p.shutdown();
    p.finish_capture().unwrap();
    let (sa, sb) = (a.ctx.driver_stats(), b.ctx.driver_stats());
    // The file holds what the sockets carried (duplicates twice, drops never), each once.
    let sent = sa.datagrams_sent + sb.datagrams_sent;
    assert_eq!(sa.captured + sb.captured, sent, "{sa:?} {sb:?}");
    assert_eq!(frames(&path).len() as u64, sent);
    let _ = std::fs::remove_file(&path);
}

/// The next completion of `node`'s CQ, spinning on `poll` (no channel, no sleep).
fn spin_wc(node: &Node) -> WorkCompletion {
    let deadline = Instant::now() + WAIT;
    let mut wc = [WorkCompletion::default()];
    loop {
        if node.cq.poll(&mut wc).unwrap() == 1 {
            assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
            return wc[0];
        }
        assert!(Instant::now() < deadline, "no completion in time");
    }
}

const ROUNDS: u8 = 100;

/// A SEND ping-pong of `ROUNDS` messages each way, `first` sending first, waiting by spinning
/// on the CQ.
fn send_pingpong(me: &Node, first: bool) {
    let buf = me.mr(64 * ROUNDS as usize);
    for i in 0..ROUNDS {
        let at = 64 * i as usize;
        me.qp
            .post_recv(&[RecvWr::new(u64::from(i), &[buf.sge(at, 64).unwrap()])])
            .unwrap();
    }
    let (mut sent, mut received) = (0u8, 0u8);
    let send = |n: u8| {
        me.qp
            .post_send(&[SendWr::inline(u64::from(n), SendOp::Send, &[n; 8])])
            .unwrap();
    };
    for n in 0..ROUNDS {
        if first {
            send(n);
        }
        while received <= n {
            let wc = spin_wc(me);
            if wc.opcode == WcOpcode::Recv {
                let mut got = [0u8; 8];
                buf.read(64 * wc.wr_id as usize, &mut got).unwrap();
                assert_eq!(got, [received; 8], "message {received}");
                received += 1;
            } else {
                sent += 1;
            }
        }
        if !first {
            send(n);
        }
    }
    while sent < ROUNDS {
        assert_ne!(spin_wc(me).opcode, WcOpcode::Recv);
        sent += 1;
    }
}

/// `ib_write_lat`'s pattern: WRITE round `n` into the peer's byte, wait for the peer's WRITE by
/// spinning on our own MR's byte (reaping our completions meanwhile).
fn write_pingpong(me: &Node, mine: &UdpMr, peer: (u64, u32), first: bool) {
    let src = me.mr(8);
    let op = SendOp::RdmaWrite {
        remote_addr: peer.0,
        rkey: peer.1,
    };
    let mut unreaped = 0u32;
    let mut write = |n: u8| {
        src.write(0, &[n]).unwrap();
        me.qp
            .post_send(&[SendWr::new(u64::from(n), op, &[src.sge(0, 1).unwrap()])
                .with_flags(SendFlags::SIGNALED)])
            .unwrap();
        unreaped += 1;
    };
    for n in 1..=ROUNDS {
        if first {
            write(n);
        }
        let deadline = Instant::now() + WAIT;
        let mut byte = [0u8];
        while byte[0] != n {
            mine.read(0, &mut byte).unwrap();
            assert!(Instant::now() < deadline, "no WRITE {n} from the peer");
        }
        if !first {
            write(n);
        }
    }
    for _ in 0..unreaped {
        assert_eq!(spin_wc(me).opcode, WcOpcode::RdmaWrite);
    }
}

#[test]
fn busy_poll_application_threads_drive_both_directions() {
    let _serial = SPINNING.lock().unwrap_or_else(|p| p.into_inner());
    let p = UdpProvider::builder()
        .device(addr("127.0.0.103:0"))
        .device(addr("127.0.0.104:0"))
        .busy_poll(true)
        .build()
        .unwrap();
    let (a, b) = pair(&p, &RcConnectOptions::default());
    assert!(a.ctx.busy_poll() && b.ctx.busy_poll());
    let (ma, mb) = (a.mr(64), b.mr(64));
    let (ra, rb) = ((ma.addr(), ma.rkey()), (mb.addr(), mb.rkey()));
    let before = (a.ctx.driver_stats(), b.ctx.driver_stats());
    std::thread::scope(|s| {
        s.spawn(|| {
            send_pingpong(&a, true);
            write_pingpong(&a, &ma, rb, true);
        });
        s.spawn(|| {
            send_pingpong(&b, false);
            write_pingpong(&b, &mb, ra, false);
        });
    });
    let after = (a.ctx.driver_stats(), b.ctx.driver_stats());
    for (x, y) in [(before.0, after.0), (before.1, after.1)] {
        // The polling threads ran passes themselves, and traffic went both ways.
        assert!(y.app_passes > x.app_passes, "{y:?}");
        assert!(y.datagrams_sent >= x.datagrams_sent + 2 * u64::from(ROUNDS));
        assert!(y.datagrams_received >= x.datagrams_received + 2 * u64::from(ROUNDS));
    }
    // Nobody polls any more: the progress threads take over, and a waiter on a completion
    // channel is served by them.
    let dst = b.mr(64);
    b.qp.post_recv(&[RecvWr::new(7, &[dst.sge(0, 64).unwrap()])])
        .unwrap();
    a.qp.post_send(&[SendWr::inline(7, SendOp::Send, b"after")])
        .unwrap();
    assert_eq!(b.wc().wr_id, 7);
    assert_eq!(a.wc().wr_id, 7);
}

/// An application that polled its CQ and then spins on its memory without calling the library
/// (perftest's `ib_write_lat`): the peer's WRITE arriving within the hand-off time wakes the
/// progress thread, which moves it (`covered`) instead of waiting for the hand-off to end.
#[test]
fn a_write_for_an_application_that_stopped_polling_is_covered() {
    let p = UdpProvider::builder()
        .device(addr("127.0.0.105:0"))
        .device(addr("127.0.0.106:0"))
        .build()
        .unwrap();
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let dst = a.mr(64);
    let src = b.mr(8);
    let op = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    let mut wc = [WorkCompletion::default()];
    for n in 0..50u64 {
        // a polls once (empty: a's thread leaves the device to it), then stops calling.
        assert_eq!(a.cq.poll(&mut wc).unwrap(), 0);
        b.qp.post_send(&[
            SendWr::new(n, op, &[src.sge(0, 8).unwrap()]).with_flags(SendFlags::SIGNALED)
        ])
        .unwrap();
        // b's completion needs a's device to take the WRITE and ACK it.
        assert_eq!(spin_wc(&b).wr_id, n);
    }
    let s = a.ctx.driver_stats();
    assert!(s.covered > 0, "{s:?}");
    p.shutdown();
}

/// Posting receives makes nothing ready to send: it sends nothing from the caller's thread
/// and rings no doorbell, and the SEND it lets in is ACKed all the same (an ACK a polling
/// pass held back leaves with the caller's next pass or call, not with the repost).
#[test]
fn posting_receives_sends_nothing_and_rings_nothing() {
    let p = provider(&["127.0.0.113:0", "127.0.0.114:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let dst = b.mr(64 * 64);
    let settled = |n: &Node| {
        let s = n.ctx.driver_stats();
        (s.send_syscalls, s.doorbells, s.inline_sends)
    };
    let before = settled(&b);
    for i in 0..64 {
        b.qp.post_recv(&[RecvWr::new(i, &[dst.sge(64 * i as usize, 64).unwrap()])])
            .unwrap();
    }
    assert_eq!(settled(&b), before, "64 receives posted");
    for n in 0..8u8 {
        a.qp.post_send(&[SendWr::inline(u64::from(n), SendOp::Send, &[n; 8])])
            .unwrap();
        let wc = spin_wc(&b);
        assert_eq!((wc.opcode, wc.wr_id), (WcOpcode::Recv, u64::from(n)));
        // The repost after each receive, as a receiver keeps its queue full, sends nothing
        // (the ACK the polling pass held back left when the poll found the receive; it used
        // to leave with the repost).
        let held = settled(&b);
        b.qp.post_recv(&[RecvWr::new(64 + u64::from(n), &[dst.sge(0, 64).unwrap()])])
            .unwrap();
        assert_eq!(settled(&b), held, "repost {n}");
        assert_eq!(spin_wc(&a).wr_id, u64::from(n), "SEND {n} acknowledged");
    }
}

/// While an application thread keeps polling, the progress thread looks whether it stopped
/// after `POLL_HANDOFF`, then at doubling intervals up to `HANDOFF_CHECK_MAX`: each look is a
/// wake-up on a CPU the polling thread holds. 100 ms of polling an empty CQ took about 100
/// wake-ups at a fixed 1 ms; with the doubling, 1 + 2 + 4 + 8 + 8 + … ms, about 15 (a loaded
/// machine wakes the thread later, not more often).
#[test]
fn a_polling_application_is_checked_on_at_doubling_intervals() {
    let p = provider(&["127.0.0.115:0", "127.0.0.116:0"]);
    let (a, _b) = pair(&p, &RcConnectOptions::default());
    let mut wc = [WorkCompletion::default()];
    // The first poll takes the device; the thread's next wake-up sees it driven.
    assert_eq!(a.cq.poll(&mut wc).unwrap(), 0);
    let before = a.ctx.driver_stats().wakeups;
    let start = Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(100) {
        assert_eq!(a.cq.poll(&mut wc).unwrap(), 0);
    }
    let wakeups = a.ctx.driver_stats().wakeups - before;
    assert!(wakeups <= 30, "{wakeups} wake-ups in 100 ms of polling");
    p.shutdown();
}

/// A thread waiting on a completion channel first drives its device itself (up to
/// `CHANNEL_SPIN`): the SEND it waits for is received, completed and signalled in its own
/// thread instead of the progress thread's, which then had to wake it.
#[test]
fn a_thread_waiting_on_a_channel_moves_its_own_traffic() {
    let p = provider(&["127.0.0.117:0", "127.0.0.118:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let dst = b.mr(64);
    const N: u64 = 100;
    let before = b.ctx.driver_stats();
    for i in 0..N {
        b.qp.post_recv(&[RecvWr::new(i, &[dst.sge(0, 64).unwrap()])])
            .unwrap();
        b.cq.req_notify(false).unwrap();
        a.qp.post_send(&[SendWr::inline(i, SendOp::Send, &[i as u8; 8])])
            .unwrap();
        let event = b.ch.wait_cq_event(Some(std::time::Duration::from_secs(10)));
        assert!(event.unwrap().is_some(), "no event for SEND {i}");
        b.cq.ack_events(1);
        let mut wc = [WorkCompletion::default()];
        assert_eq!(b.cq.poll(&mut wc).unwrap(), 1, "SEND {i}");
        assert_eq!((wc[0].status, wc[0].wr_id), (WcStatus::Success, i));
    }
    // The waits ran passes in the waiting thread: without the spin none, the progress
    // thread moved every SEND and woke the waiter. (A SEND that arrives while the socket is
    // back in the thread's poller, after a poll found the completion before it, is still
    // the thread's to move if the application thread does not poll within `APP_GRACE`:
    // on a loaded machine a third to half of them here.)
    let after = b.ctx.driver_stats();
    let passes = after.app_passes - before.app_passes;
    assert!(passes >= N / 10, "{passes} passes in {N} waits: {after:?}");
    p.shutdown();
}

/// The opcode and PSN of each RoCEv2 datagram a pcap file holds from `src`, in order
/// (Ethernet, IPv4 without options, UDP, then the BTH).
fn bths_from(path: &Path, src: [u8; 4]) -> Vec<(u8, u32)> {
    frames(path)
        .iter()
        .filter(|data| data.get(26..30) == Some(&src[..]))
        .map(|data| {
            (
                data[42],
                u32::from_be_bytes([0, data[51], data[52], data[53]]),
            )
        })
        .collect()
}

/// An ACK held back by the pass of the poll that found the request's completion leaves with
/// the application's next call, after that call's own packet: b answers each SEND of a, and
/// its answer goes out before the ACK of a's SEND, so that a's poll finds both together (as in
/// a ping-pong whose two applications move their traffic themselves). Sent by the poll that
/// found the completion, the ACK left first in every round.
#[test]
fn an_ack_held_by_the_poll_that_found_the_request_trails_the_answer() {
    let _serial = SPINNING.lock().unwrap_or_else(|p| p.into_inner());
    let path = temp("held-ack-order");
    let p = UdpProvider::builder()
        .device(addr("127.0.0.119:0"))
        .device(addr("127.0.0.120:0"))
        .capture(&path)
        .build()
        .unwrap();
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let (a_buf, b_buf) = (a.mr(64), b.mr(64));
    const ROUNDS: u64 = 50;
    for i in 0..ROUNDS {
        b.qp.post_recv(&[RecvWr::new(i, &[b_buf.sge(0, 64).unwrap()])])
            .unwrap();
        a.qp.post_recv(&[RecvWr::new(i, &[a_buf.sge(0, 64).unwrap()])])
            .unwrap();
        a.qp.post_send(&[SendWr::inline(i, SendOp::Send, &[1; 8])])
            .unwrap();
        assert_eq!(spin_wc(&b).opcode, WcOpcode::Recv);
        b.qp.post_send(&[SendWr::inline(i, SendOp::Send, &[2; 8])])
            .unwrap();
        // a: its SEND's completion and b's answer; b: its answer's completion.
        for _ in 0..2 {
            spin_wc(&a);
        }
        spin_wc(&b);
    }
    p.shutdown();
    p.finish_capture().unwrap();
    const SEND_ONLY: u8 = 0x04;
    const ACK: u8 = 0x11;
    // Round i: b's answer carries b's i-th PSN, the ACK of a's SEND a's i-th PSN.
    let from_b = bths_from(&path, [127, 0, 0, 120]);
    let at = |opcode: u8, i: u32| {
        let first = from_b.iter().find(|(o, _)| *o == opcode).unwrap().1;
        from_b
            .iter()
            .position(|&(o, psn)| o == opcode && psn == (first + i) & 0xff_ffff)
    };
    let answer_first = (0..ROUNDS as u32)
        .filter(|&i| matches!((at(SEND_ONLY, i), at(ACK, i)), (Some(s), Some(a)) if s < a))
        .count();
    // A SEND that b's progress thread takes in (b did not poll within `APP_GRACE` of its
    // arrival: in this debug build, often after the test's own calls between two polls) is
    // ACKed by the thread at once, and the round's ACK leaves first: with 20 rounds, 5 to 20
    // left the answer first here, none before this order, and none in one CI run while the
    // busy-poll test's four spinning threads ran beside it (hence `SPINNING` and 50 rounds).
    assert!(
        answer_first > 0,
        "the answer left first in none of {ROUNDS} rounds: {from_b:x?}"
    );
    let _ = std::fs::remove_file(&path);
}

/// An ACK held back for the application's next call still leaves when the application stops
/// calling the library: b receives a's SEND by polling (the pass that found it holds the ACK)
/// and then makes no call; the progress thread sends the ACK when it next looks, and a's SEND
/// completes.
#[test]
fn a_held_ack_leaves_when_the_application_stops_calling() {
    let p = provider(&["127.0.0.121:0", "127.0.0.122:0"]);
    let (a, b) = pair(&p, &RcConnectOptions::default());
    let dst = b.mr(64);
    for i in 0..5u64 {
        b.qp.post_recv(&[RecvWr::new(i, &[dst.sge(0, 64).unwrap()])])
            .unwrap();
        a.qp.post_send(&[SendWr::inline(i, SendOp::Send, &[1; 8])])
            .unwrap();
        assert_eq!(spin_wc(&b).wr_id, i);
        // b calls nothing more until a's SEND completed.
        let wc = a.wc();
        assert_eq!((wc.opcode, wc.wr_id), (WcOpcode::Send, i));
    }
    p.shutdown();
}
