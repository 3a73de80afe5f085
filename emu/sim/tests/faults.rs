//! Each fault action on the fabric, run-time control, counters, plan errors, seeds, capture and
//! the two clocks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use emu_proto::Instant;
use emu_sim::fault::{
    FaultPlan, Link, NodeId, OpcodeClass, corrupt, delay, drop, drop_nth, duplicate, hold,
    partition, rate_limit, truncate,
};
use emu_sim::{Opcode, PairOptions, SimPair, SimProvider, connect_pair};
use verbs_api::{
    AccessFlags, CompletionChannel, CompletionQueue, Context, ErrorKind, MemoryRegion, Mtu, QpCap,
    QpInitAttr, QpState, QueuePair, RcConnectOptions, RecvWr, SendOp, SendWr, WcStatus,
    WorkCompletion, connect_rc,
};

const A: NodeId = NodeId(0);
const B: NodeId = NodeId(1);

fn write(p: &SimPair, wr_id: u64, src: usize, dst: usize, len: usize) {
    let sge = [p.mr_a.sge(src, len).unwrap()];
    let op = SendOp::RdmaWrite {
        remote_addr: p.mr_b.addr() + dst as u64,
        rkey: p.mr_b.rkey(),
    };
    p.qp_a.post_send(&[SendWr::new(wr_id, op, &sge)]).unwrap();
}

fn read_b(p: &SimPair, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    p.mr_b.read(off, &mut v).unwrap();
    v
}

fn success(p: &SimPair, wr_id: u64) {
    let wc = p.cq_a.next_completion().unwrap();
    assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success));
}

fn with_plan(plan: FaultPlan) -> SimPair {
    SimProvider::builder().faults(plan).pair().unwrap()
}

#[test]
fn dropped_ack_is_recovered_by_the_ack_timeout() {
    let p = with_plan(FaultPlan::new(1).rule(drop_nth(1).opcode(Opcode::Acknowledge)));
    p.mr_a.write(0, b"payload!").unwrap();
    write(&p, 1, 0, 0, 8);
    success(&p, 1);
    let a = p.qp_a.stats().unwrap();
    assert_eq!((a.timeout_retries, a.retransmits_timeout), (1, 1));
    assert_eq!(p.qp_b.stats().unwrap().duplicate_request, 1);
    assert_eq!(read_b(&p, 0, 8), b"payload!");
    // The retry waited one local ACK timeout (14: 67 ms) of virtual time.
    assert!(p.sim.now() >= Duration::from_nanos(4096 << 14));
    let c = p.sim.fault_counters();
    assert_eq!(c.link(Link::new(B, A)).dropped, 1);
    assert_eq!(c.link(Link::new(A, B)).dropped, 0);
    assert_eq!(c.total().passed, 3);
}

#[test]
fn duplicates_execute_once() {
    let p = with_plan(FaultPlan::new(2).rule(duplicate(2)));
    p.mr_b.write(1024, &40u64.to_ne_bytes()).unwrap();
    p.mr_a.write(0, b"dup-safe").unwrap();
    write(&p, 1, 0, 0, 8);
    let res = [p.mr_a.sge(64, 8).unwrap()];
    let faa = SendOp::AtomicFetchAndAdd {
        remote_addr: p.mr_b.addr() + 1024,
        rkey: p.mr_b.rkey(),
        add: 2,
    };
    p.qp_a.post_send(&[SendWr::new(2, faa, &res)]).unwrap();
    let rsge = [p.mr_b.sge(2048, 64).unwrap()];
    p.qp_b.post_recv(&[RecvWr::new(9, &rsge)]).unwrap();
    let sge = [p.mr_a.sge(0, 8).unwrap()];
    p.qp_a
        .post_send(&[SendWr::new(3, SendOp::Send, &sge)])
        .unwrap();
    for id in 1..=3 {
        success(&p, id);
    }
    let wc = p.cq_b.next_completion().unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (9, WcStatus::Success, 8)
    );
    p.sim.run_until_idle().unwrap();
    assert_eq!(p.cq_b.poll(&mut [WorkCompletion::default(); 2]).unwrap(), 0);
    let mut word = [0u8; 8];
    p.mr_b.read(1024, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 42, "FETCH_ADD applied once");
    p.mr_a.read(64, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 40);
    assert!(p.qp_b.stats().unwrap().duplicate_request >= 4);
    assert_eq!(
        p.sim.fault_counters().total().duplicated,
        p.sim.fault_counters().total().passed + p.sim.fault_counters().total().duplicated
            - p.sim.fault_counters().total().passed
    );
    assert!(p.sim.fault_counters().link(Link::new(A, B)).duplicated >= 3);
}

#[test]
fn jitter_reorders_and_data_stays_intact() {
    let plan = FaultPlan::new(3).rule(
        delay(Duration::ZERO..=Duration::from_micros(30)).opcode_class(OpcodeClass::Requests),
    );
    let sim = SimProvider::builder().faults(plan).build().unwrap();
    let rc = RcConnectOptions {
        path_mtu: Mtu::Mtu256,
        ..RcConnectOptions::default()
    };
    let p = sim.connect_pair(rc).unwrap();
    let data: Vec<u8> = (0..40_000u32).map(|i| (i * 13 % 251) as u8).collect();
    p.mr_a.write(0, &data).unwrap();
    let sges: Vec<_> = (0..40)
        .map(|i| [p.mr_a.sge(i * 1000, 1000).unwrap()])
        .collect();
    let wrs: Vec<_> = sges
        .iter()
        .enumerate()
        .map(|(i, sge)| {
            let op = SendOp::RdmaWrite {
                remote_addr: p.mr_b.addr() + (i * 1000) as u64,
                rkey: p.mr_b.rkey(),
            };
            SendWr::new(i as u64, op, sge)
        })
        .collect();
    p.qp_a.post_send(&wrs).unwrap();
    for i in 0..40 {
        success(&p, i);
    }
    assert_eq!(read_b(&p, 0, 40_000), data);
    let b = p.qp_b.stats().unwrap();
    assert!(b.out_of_seq_request > 0, "no reordering happened: {b:?}");
    assert!(p.sim.fault_counters().total().delayed > 100);
}

#[test]
fn a_flipped_bit_is_caught_by_the_icrc() {
    let p = with_plan(FaultPlan::new(4).rule(corrupt(1.0).from(A).nth(1)));
    p.mr_a.write(0, b"corrupt?").unwrap();
    write(&p, 1, 0, 0, 8);
    success(&p, 1);
    assert_eq!(p.b.device_stats().unwrap().icrc_errors, 1);
    assert_eq!(p.qp_a.stats().unwrap().timeout_retries, 1);
    assert_eq!(read_b(&p, 0, 8), b"corrupt?");
    assert_eq!(p.sim.fault_counters().total().corrupted, 1);
}

#[test]
fn a_truncated_datagram_is_dropped_by_the_receiver() {
    let p = with_plan(FaultPlan::new(5).rule(truncate(20).from(A).nth(1)));
    write(&p, 1, 0, 0, 64);
    success(&p, 1);
    let b = p.b.device_stats().unwrap();
    assert_eq!(b.icrc_errors + b.dropped, 1, "{b:?}");
    assert_eq!(p.sim.fault_counters().total().truncated, 1);
}

#[test]
fn oneway_partition_loses_only_the_acks() {
    let p = SimProvider::pair().unwrap();
    p.sim.partition_oneway(B, A);
    p.mr_a.write(0, b"one-way!").unwrap();
    write(&p, 1, 0, 0, 8);
    let wc = p.cq_a.next_completion().unwrap();
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    assert_eq!(read_b(&p, 0, 8), b"one-way!", "requests got through");
    assert_eq!(p.qp_b.stats().unwrap().duplicate_request, 7);
    let c = p.sim.fault_counters();
    assert_eq!(c.link(Link::new(B, A)).partitioned, 8);
    assert_eq!(c.link(Link::new(A, B)).passed, 8);
}

#[test]
fn held_datagrams_wait_for_release() {
    let p = with_plan(FaultPlan::new(6).rule(hold().opcode_class(OpcodeClass::Requests)));
    p.mr_a.write(0, b"held....").unwrap();
    write(&p, 1, 0, 0, 8);
    assert_eq!(p.sim.pending_datagrams(), 1);
    assert_eq!(p.sim.fault_counters().total().held, 1);
    assert_eq!(read_b(&p, 0, 8), [0; 8], "not delivered yet");
    p.sim.release_held();
    assert_eq!(read_b(&p, 0, 8), b"held....");
    success(&p, 1);
    assert_eq!(p.qp_a.stats().unwrap().timeout_retries, 0);
    assert_eq!(p.sim.pending_datagrams(), 0);
    // Released rules hold nothing more.
    write(&p, 2, 0, 8, 8);
    success(&p, 2);
    assert_eq!(p.sim.fault_counters().total().held, 1);
}

#[test]
fn a_timed_hold_releases_itself() {
    let until = Instant::from_nanos(2_000_000);
    let p = with_plan(FaultPlan::new(7).rule(hold().opcode(Opcode::Acknowledge).until(until)));
    write(&p, 1, 0, 0, 8);
    success(&p, 1);
    assert!(p.sim.now() >= Duration::from_millis(2));
    assert_eq!(p.qp_a.stats().unwrap().timeout_retries, 0);
}

#[test]
fn heal_delivers_held_datagrams_and_ends_partitions() {
    let p = with_plan(FaultPlan::new(8).rule(hold().from(A)));
    p.sim.partition(A, B);
    write(&p, 1, 0, 0, 8);
    assert_eq!(p.sim.fault_counters().total().partitioned, 1);
    p.sim.repair(A, B);
    write(&p, 2, 0, 8, 8);
    assert_eq!(p.sim.pending_datagrams(), 1, "the second WRITE is held");
    p.sim.heal();
    let wc = p.cq_a.next_completion().unwrap();
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    success(&p, 2);
}

#[test]
fn rate_limit_paces_the_link() {
    let p = with_plan(FaultPlan::new(9).rule(rate_limit(1_000_000).from(A)));
    write(&p, 1, 0, 0, 10_000);
    success(&p, 1);
    // Ten 1 KiB packets at 1 MB/s take about 10 ms of virtual time.
    assert!(p.sim.now() >= Duration::from_millis(9), "{:?}", p.sim.now());
    assert_eq!(p.qp_a.stats().unwrap().timeout_retries, 0);
}

#[test]
fn a_partition_rule_heals_at_the_end_of_its_window() {
    let heal = Instant::from_nanos(100_000_000);
    let p = with_plan(FaultPlan::new(10).rule(partition(A, B).between(Instant::ZERO, heal)));
    write(&p, 1, 0, 0, 8);
    success(&p, 1);
    // Sent at 0 and 67 ms (both lost), then at 134 ms (delivered).
    assert_eq!(p.qp_a.stats().unwrap().timeout_retries, 2);
    assert!(p.sim.now() >= Duration::from_millis(100));
}

#[test]
fn faults_change_between_polls() {
    let p = SimProvider::pair().unwrap();
    p.sim.partition(A, B);
    write(&p, 1, 0, 0, 8);
    // Non-waiting calls never reach a timer deadline.
    p.qp_a.query().unwrap();
    assert!(p.sim.now() < Duration::from_millis(1));
    assert_eq!(p.qp_a.stats().unwrap().timeout_retries, 0);
    // One empty poll passes one deadline: one retransmission, lost too.
    assert_eq!(p.cq_a.poll(&mut [WorkCompletion::default(); 1]).unwrap(), 0);
    assert_eq!(p.qp_a.stats().unwrap().timeout_retries, 1);
    p.sim.heal();
    success(&p, 1);
    assert_eq!(p.qp_a.stats().unwrap().timeout_retries, 2);
}

#[test]
fn advance_lets_virtual_time_pass() {
    let p = SimProvider::pair().unwrap();
    p.sim.partition(A, B);
    write(&p, 1, 0, 0, 8);
    p.sim.advance(Duration::from_millis(100));
    assert_eq!(p.sim.now(), Duration::from_millis(100));
    assert_eq!(p.qp_a.stats().unwrap().timeout_retries, 1);
    p.sim.advance(Duration::from_secs(1));
    assert_eq!(p.qp_a.state().unwrap(), QpState::Err);
    let wc = p.cq_a.next_completion().unwrap();
    assert_eq!(wc.status, WcStatus::RetryExcErr);
}

#[test]
fn next_completion_reports_an_idle_fabric() {
    let p = SimProvider::pair().unwrap();
    let err = p.cq_a.next_completion().unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidState);
    p.sim.run_until_idle().unwrap();
}

#[test]
fn toml_plans_are_checked_with_line_and_field() {
    let bad = "seed = 1\n[[rule]]\naction = \"drop\"\nprobability = 1.5\n";
    let err = SimProvider::builder().faults_toml(bad).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    let msg = err.to_string();
    assert!(msg.contains("line 4, column 15"), "{msg}");
    assert!(msg.contains("field `probability`"), "{msg}");
    let unknown = "seed = 1\n[[rule]]\naction = \"drop\"\nopcode = \"ACK\"\n";
    let msg = SimProvider::builder()
        .faults_toml(unknown)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("line 4") && msg.contains("field `opcode`"),
        "{msg}"
    );
    let malformed = "seed = 1\n[[rule]\n";
    let msg = SimProvider::builder()
        .faults_toml(malformed)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("line 2"), "{msg}");

    let good = "seed = 1\n[[rule]]\naction = \"drop\"\nopcode = \"ACKNOWLEDGE\"\nnth = 1\n";
    let p = SimProvider::builder()
        .faults_toml(good)
        .unwrap()
        .pair()
        .unwrap();
    write(&p, 1, 0, 0, 8);
    success(&p, 1);
    assert_eq!(p.qp_a.stats().unwrap().timeout_retries, 1);
}

#[test]
fn invalid_plans_in_code_are_rejected() {
    let err = SimProvider::builder()
        .faults(FaultPlan::new(1).rule(drop(1.5)))
        .build()
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(
        err.to_string().contains("rule[0]: field `probability`"),
        "{err}"
    );
    let sim = SimProvider::builder()
        .faults(FaultPlan::new(1).rule(drop(0.5)))
        .build()
        .unwrap();
    let before = sim.fault_plan();
    let err = sim
        .set_faults(FaultPlan::new(1).rule(duplicate(0)))
        .unwrap_err();
    assert!(err.to_string().contains("copies"), "{err}");
    assert_eq!(sim.fault_plan(), before, "a rejected plan changes nothing");
}

#[test]
fn one_seed_drives_the_plan() {
    let plan = FaultPlan::new(77).rule(drop(0.1));
    if std::env::var(emu_sim::SEED_ENV).is_ok() {
        return; // the variable overrides every seed below
    }
    let sim = SimProvider::builder().faults(plan.clone()).build().unwrap();
    assert_eq!((sim.seed(), sim.fault_plan().seed), (77, 77));
    let sim = SimProvider::builder().seed(5).faults(plan).build().unwrap();
    assert_eq!((sim.seed(), sim.fault_plan().seed), (5, 5));
    sim.set_faults(FaultPlan::new(123)).unwrap();
    assert_eq!(sim.fault_plan().seed, 5);
    assert_eq!(SimProvider::builder().build().unwrap().seed(), 0);
}

/// Runs this test binary's `name` test in a child process with `SOFTVERBS_SEED=value`.
fn child(name: &str, value: &str) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(emu_sim::SEED_ENV, value)
        .env("EMU_SIM_SEED_CHILD", "1")
        .output()
        .unwrap()
}

#[test]
fn seed_env_overrides_the_builder() {
    if std::env::var("EMU_SIM_SEED_CHILD").is_ok() {
        let env = std::env::var(emu_sim::SEED_ENV).unwrap();
        let built = SimProvider::builder().seed(1).build();
        match env.as_str() {
            "0x63" => {
                assert_eq!(built.unwrap().seed(), 99);
                assert_eq!(emu_sim::seed_from_env(5), 99);
            }
            _ => {
                assert_eq!(built.unwrap_err().kind, ErrorKind::InvalidArgument);
                assert_eq!(emu_sim::seed_from_env(5), 5);
            }
        }
        return;
    }
    let name = "seed_env_overrides_the_builder";
    for value in ["0x63", "banana"] {
        let out = child(name, value);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{value}: {stderr}");
    }
    let out = child(name, "0x63");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("SOFTVERBS_SEED=99"), "{stderr}");
}

#[test]
fn capture_writes_every_delivered_datagram() {
    let dir = std::env::temp_dir().join(format!("emu-sim-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.pcap");
    let plan = FaultPlan::new(12).rule(drop_nth(1).opcode(Opcode::Acknowledge));
    let p = SimProvider::builder()
        .faults(plan)
        .capture(&path)
        .record_trace()
        .pair()
        .unwrap();
    write(&p, 1, 0, 0, 3000);
    success(&p, 1);
    p.sim.finish_capture().unwrap();
    p.sim.finish_capture().unwrap();
    let records = p.sim.take_trace();
    assert_eq!(records.len() as u64, p.sim.delivered_datagrams());

    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let u32_at = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!(u32_at(0), 0xa1b2_3c4d, "nanosecond pcap, native byte order");
    let mut at = 24;
    let mut frames = 0;
    while at < bytes.len() {
        let (sec, nsec, len) = (u32_at(at), u32_at(at + 4), u32_at(at + 8) as usize);
        let frame = &bytes[at + 16..at + 16 + len];
        let record = &records[frames];
        let ts = Duration::new(sec.into(), nsec);
        assert_eq!(ts, record.at, "virtual timestamp");
        assert_eq!(&frame[42..], &record.bytes[..], "UDP payload");
        let (src, dst) = (&frame[26..30], &frame[30..34]);
        let ip = |n: NodeId| [127, 0, 0, n.0 as u8 + 1];
        assert_eq!((src, dst), (&ip(record.src)[..], &ip(record.dst)[..]));
        assert_eq!(&frame[36..38], &4791u16.to_be_bytes());
        frames += 1;
        at += 16 + len;
    }
    assert_eq!(frames, records.len());
    assert!(frames >= 5, "3 requests, a retransmission and an ACK");
}

/// Side a of a hand-built pair whose CQ has a completion channel.
struct Armed {
    p: SimPair,
    ch: emu_sim::SimChannel,
    cq: emu_sim::SimCq,
    qp: emu_sim::SimQp,
    _peer: emu_sim::SimQp,
}

fn armed(sim: &SimProvider, rc: RcConnectOptions) -> Armed {
    let a = sim.context(0).unwrap();
    let b = sim.context(1).unwrap();
    let p = connect_pair(&a, &b, rc).unwrap();
    let ch = a.create_comp_channel().unwrap();
    let cq = a.create_cq(16, Some(&ch)).unwrap();
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = a
        .create_qp(&p.pd_a, &cq, &cq, None, &QpInitAttr::rc(cap))
        .unwrap();
    let peer = b
        .create_qp(&p.pd_b, &p.cq_b, &p.cq_b, None, &QpInitAttr::rc(cap))
        .unwrap();
    connect_rc(&qp, 1, &peer.endpoint(2).unwrap(), &rc).unwrap();
    connect_rc(&peer, 2, &qp.endpoint(1).unwrap(), &rc).unwrap();
    Armed {
        p,
        ch,
        cq,
        qp,
        _peer: peer,
    }
}

fn wait_cq_event_makes_progress(sim: SimProvider, rc: RcConnectOptions) {
    let s = armed(&sim, rc);
    s.cq.req_notify(false).unwrap();
    let sge = [s.p.mr_a.sge(0, 8).unwrap()];
    let op = SendOp::RdmaWrite {
        remote_addr: s.p.mr_b.addr(),
        rkey: s.p.mr_b.rkey(),
    };
    s.qp.post_send(&[SendWr::new(5, op, &sge)]).unwrap();
    let event = s.ch.wait_cq_event(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(event, Some(s.cq.handle()));
    s.cq.ack_events(1);
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(s.cq.poll(&mut wc).unwrap(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::Success));
    assert_eq!(s.qp.stats().unwrap().timeout_retries, 1);
}

#[test]
fn wait_cq_event_passes_timer_deadlines_in_virtual_time() {
    let plan = FaultPlan::new(13).rule(drop_nth(1).opcode(Opcode::RdmaWriteOnly));
    let sim = SimProvider::builder().faults(plan).build().unwrap();
    let start = std::time::Instant::now();
    wait_cq_event_makes_progress(sim.clone(), RcConnectOptions::default());
    assert!(sim.now() >= Duration::from_millis(67));
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn wait_cq_event_runs_the_fabric_in_real_time() {
    let plan = FaultPlan::new(14).rule(drop_nth(1).opcode(Opcode::RdmaWriteOnly));
    let sim = SimProvider::builder()
        .faults(plan)
        .real_time()
        .build()
        .unwrap();
    assert!(sim.is_real_time());
    // timeout 8: 4.096 µs × 2^8 ≈ 1 ms of wall time before the retransmission.
    let rc = RcConnectOptions {
        timeout: 8,
        ..RcConnectOptions::default()
    };
    let start = std::time::Instant::now();
    wait_cq_event_makes_progress(sim.clone(), rc);
    assert!(start.elapsed() >= Duration::from_micros(1000));
    assert!(sim.now() >= Duration::from_micros(1000));
}

#[test]
fn real_time_polling_retransmits_on_the_wall_clock() {
    let plan = FaultPlan::new(15).rule(drop_nth(1).opcode(Opcode::Acknowledge));
    let sim = SimProvider::builder()
        .faults(plan)
        .real_time()
        .build()
        .unwrap();
    let rc = RcConnectOptions {
        timeout: 9, // about 2 ms
        ..RcConnectOptions::default()
    };
    let p = sim.connect_pair(rc).unwrap();
    let start = std::time::Instant::now();
    write(&p, 1, 0, 0, 8);
    let mut wc = [WorkCompletion::default(); 1];
    while p.cq_a.poll(&mut wc).unwrap() == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "no progress");
    }
    assert_eq!(wc[0].status, WcStatus::Success);
    assert!(start.elapsed() >= Duration::from_millis(2));
    assert_eq!(p.qp_a.stats().unwrap().timeout_retries, 1);
    p.sim.advance(Duration::from_millis(1));
}

#[test]
fn get_cq_event_and_async_events_are_waits() {
    let p = SimProvider::pair().unwrap();
    let s = armed(&p.sim, RcConnectOptions::default());
    s.cq.req_notify(false).unwrap();
    p.sim.partition(A, B);
    let sge = [s.p.mr_a.sge(0, 8).unwrap()];
    let op = SendOp::RdmaWrite {
        remote_addr: s.p.mr_b.addr(),
        rkey: s.p.mr_b.rkey(),
    };
    s.qp.post_send(&[SendWr::new(1, op, &sge)]).unwrap();
    // Each empty get_cq_event passes one deadline; the eighth fails the WR.
    let mut polls = 0;
    while s.ch.get_cq_event().unwrap().is_none() {
        polls += 1;
        assert!(polls < 20);
    }
    assert_eq!(polls, 7);
    s.cq.ack_events(1);
    assert_eq!(
        s.cq.next_completion().unwrap().status,
        WcStatus::RetryExcErr
    );
    assert!(p.a.poll_async_event().is_none());
}

#[test]
fn pairs_need_two_devices_of_one_provider() {
    let one = SimProvider::builder().devices(1).build().unwrap();
    assert_eq!(
        one.connect_pair(PairOptions::default()).unwrap_err().kind,
        ErrorKind::NotFound
    );
    let a = one.context(0).unwrap();
    let loopback = connect_pair(&a, &a, PairOptions::default()).unwrap();
    loopback.mr_a.write(0, b"loopback").unwrap();
    write(&loopback, 1, 0, 100, 8);
    success(&loopback, 1);
    assert_eq!(read_b(&loopback, 100, 8), b"loopback");
    let other = SimProvider::pair().unwrap();
    let err = connect_pair(&a, &other.b, PairOptions::default()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert_eq!(other.b.node(), B);
    let err = other.a.qp_stats(&other.qp_b).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
}

#[test]
fn emulator_owned_mrs_have_deterministic_addresses() {
    let addrs = || {
        let p = SimProvider::pair().unwrap();
        (p.mr_a.addr(), p.mr_b.addr())
    };
    assert_eq!(addrs(), addrs());
    let p = SimProvider::pair().unwrap();
    let second =
        p.a.alloc_mr(&p.pd_a, 100, AccessFlags::LOCAL_WRITE)
            .unwrap();
    assert!(second.addr() >= p.mr_a.addr() + p.mr_a.len() as u64 + 4096);
    assert_eq!(second.addr() % 4096, 0);
}
