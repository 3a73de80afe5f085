//! Shared by the seeded fault campaign and the determinism test: random fault plans that heal
//! within the retry budget, and a small mixed RC workload whose invariants are checked.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::time::Duration;

use emu_proto::Instant;
use emu_sim::fault::{
    FaultPlan, LinkCounters, NodeId, OpcodeClass, Rule, corrupt, delay, drop, drop_nth, duplicate,
    partition,
};
use emu_sim::{PairOptions, SimCq, SimPair, SimProvider, Stats};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use verbs_api::{
    MemoryRegion, Mtu, QpState, QueuePair, RcConnectOptions, RecvWr, SendOp, SendWr, WcOpcode,
    WcStatus, WorkCompletion,
};

/// Draws for plan generation, from their own stream (independent of the provider's).
pub struct Draw(ChaCha8Rng);

impl Draw {
    pub fn new(seed: u64) -> Draw {
        Draw(ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_ca4a_a161_0000))
    }

    /// Uniform in `0..n` (n > 0; slight modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// A random plan for `seed` (VOPR-style swarm): 0–30 % loss, 0–50 % duplication, jittered
/// delay (reordering), some corruption, sometimes a short (possibly one-way) partition and a
/// targeted ACK/READ-response/atomic loss. Every rule is confined to `[0, heal)`, where `heal`
/// is 1.5 local ACK timeouts: at most two timeout retries and two NAK retries can happen before
/// the network is healthy, well inside `retry_cnt` 7. Returns the plan and the `timeout` code.
pub fn random_plan(seed: u64) -> (FaultPlan, u8) {
    let mut d = Draw::new(seed);
    let timeout = 8 + d.below(7) as u8; // 1 ms .. 67 ms
    let ack_timeout = 4_096u64 << timeout;
    let heal = Instant::from_nanos(ack_timeout + ack_timeout / 2);
    let window = |r: Rule| r.between(Instant::ZERO, heal);
    let mut plan = FaultPlan::new(seed);
    if d.chance(0.8) {
        let max = Duration::from_nanos(d.below(50_000));
        plan = plan.rule(window(delay(Duration::ZERO..=max)));
    }
    plan = plan.rule(window(drop(d.unit() * 0.3)));
    if d.chance(0.7) {
        let copies = 1 + d.below(2) as u8;
        plan = plan.rule(window(duplicate(copies).probability(d.unit() * 0.5)));
    }
    if d.chance(0.3) {
        plan = plan.rule(window(corrupt(d.unit() * 0.05)));
    }
    if d.chance(0.3) {
        let class = [
            OpcodeClass::Acks,
            OpcodeClass::ReadResponses,
            OpcodeClass::Atomics,
            OpcodeClass::Naks,
        ][d.below(4) as usize];
        let nth = 1 + d.below(4) as u32;
        plan = plan.rule(window(drop_nth(nth).opcode_class(class)));
    }
    if d.chance(0.4) {
        let (a, b) = if d.chance(0.5) {
            (NodeId(0), NodeId(1))
        } else {
            (NodeId(1), NodeId(0))
        };
        // Half the partitions cover the initial burst of traffic, the rest start later.
        let start = if d.chance(0.5) {
            0
        } else {
            d.below(heal.as_nanos() / 2)
        };
        let len = 1 + d.below(heal.as_nanos() / 2);
        let mut rule =
            partition(a, b).between(Instant::from_nanos(start), Instant::from_nanos(start + len));
        if d.chance(0.5) {
            rule = rule.oneway();
        }
        plan = plan.rule(rule);
    }
    (plan, timeout)
}

/// The outcome of one seeded run.
#[derive(Debug)]
pub struct Run {
    pub trace_hash: u64,
    pub delivered: u64,
    pub virtual_time: Duration,
    /// Fault verdicts over both links.
    pub faults: LinkCounters,
    /// Transport counters of both devices.
    pub stats: Stats,
}

/// `total += c`, field by field.
pub fn add_counters(total: &mut LinkCounters, c: &LinkCounters) {
    total.passed += c.passed;
    total.dropped += c.dropped;
    total.duplicated += c.duplicated;
    total.delayed += c.delayed;
    total.corrupted += c.corrupted;
    total.truncated += c.truncated;
    total.held += c.held;
    total.partitioned += c.partitioned;
}

/// Connection parameters for `seed`: path MTU (packetization) and the READ/atomic limits,
/// drawn from a stream of their own.
pub fn random_rc(seed: u64, timeout: u8) -> RcConnectOptions {
    let mut d = Draw::new(seed ^ 0x0000_0000_00c0_ffee);
    let path_mtu = [
        Mtu::Mtu256,
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu4096,
    ][d.below(5) as usize];
    let rd_atomic = [1, 2, 4, 16][d.below(4) as usize];
    RcConnectOptions {
        path_mtu,
        timeout,
        max_rd_atomic: rd_atomic,
        max_dest_rd_atomic: rd_atomic,
        ..RcConnectOptions::default()
    }
}

/// Builds a provider with `plan` and runs [`mixed_workload`] on a fresh pair connected with
/// [`random_rc`].
pub fn run_plan(seed: u64, plan: FaultPlan, timeout: u8) -> Result<Run, String> {
    let sim = SimProvider::builder()
        .seed(seed)
        .faults(plan)
        .build()
        .map_err(|e| e.to_string())?;
    let opts = PairOptions {
        rc: random_rc(seed, timeout),
        psn_a: 0xFF_FFF0, // cross the PSN wrap
        ..PairOptions::default()
    };
    let pair = sim.connect_pair(opts).map_err(|e| e.to_string())?;
    mixed_workload(&pair)?;
    let mut stats = pair.a.device_stats().map_err(|e| e.to_string())?;
    stats += pair.b.device_stats().map_err(|e| e.to_string())?;
    Ok(Run {
        trace_hash: sim.trace_hash(),
        delivered: sim.delivered_datagrams(),
        virtual_time: sim.now(),
        faults: sim.fault_counters().total(),
        stats,
    })
}

/// [`random_plan`] + [`run_plan`].
pub fn run_seed(seed: u64) -> Result<Run, String> {
    let (plan, timeout) = random_plan(seed);
    run_plan(seed, plan, timeout)
}

/// Deterministic bytes for buffer `tag`.
pub fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(tag))
        .collect()
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

// Layout of each side's 64 KiB MR.
const B_W8: usize = 0; // A writes 8 bytes
const B_W700: usize = 1024; // A writes 700 bytes
const B_WIMM: usize = 2048; // A writes 100 bytes with immediate
const B_READ_SRC: usize = 4096; // A reads 500 bytes
const B_RECV: usize = 8192; // A's SEND lands here
const B_FAA: usize = 16384;
const B_CAS: usize = 16392;
const B_SRC: usize = 20000; // what B sends and writes
const A_SRC: usize = 0;
const A_READ_DST: usize = 8192;
const A_FAA_RES: usize = 12288;
const A_CAS_RES: usize = 12296;
const A_RECV: usize = 24576; // B's SEND lands here
const A_W64: usize = 32768; // B writes 64 bytes

/// A small mixed workload in both directions, posted in two batches, then every invariant:
/// each signaled WR completes exactly once, in posting order, with SUCCESS; receives complete in
/// order with the right length and immediate; written, sent and read bytes are intact; each
/// atomic took effect exactly once and returned the original value; after the fabric is idle no
/// further completion appears and both QPs are still in RTS.
pub fn mixed_workload(p: &SimPair) -> Result<(), String> {
    let e = |what: &'static str| move |err: verbs_api::Error| format!("{what}: {err}");
    let pe = |what: &'static str| move |err: verbs_api::PostError| format!("{what}: {err}");
    let a_src = pattern(1, 1000);
    let b_src = pattern(2, 500);
    let b_read = pattern(3, 500);
    p.mr_a.write(A_SRC, &a_src).map_err(e("fill a"))?;
    p.mr_b.write(B_SRC, &b_src).map_err(e("fill b"))?;
    p.mr_b
        .write(B_READ_SRC, &b_read)
        .map_err(e("fill b read"))?;
    p.mr_b
        .write(B_FAA, &100u64.to_ne_bytes())
        .map_err(e("fill faa"))?;
    p.mr_b
        .write(B_CAS, &7u64.to_ne_bytes())
        .map_err(e("fill cas"))?;

    // Receives first, so that no RNR NAK is needed.
    let b_recv = [p.mr_b.sge(B_RECV, 1024).map_err(e("sge"))?];
    p.qp_b
        .post_recv(&[RecvWr::new(101, &b_recv), RecvWr::new(102, &[])])
        .map_err(pe("b recv"))?;
    let a_recv = [p.mr_a.sge(A_RECV, 1024).map_err(e("sge"))?];
    p.qp_a
        .post_recv(&[RecvWr::new(201, &a_recv)])
        .map_err(pe("a recv"))?;

    let (raddr, rkey) = (p.mr_b.addr(), p.mr_b.rkey());
    let at = |off: usize| raddr + off as u64;
    let sge_a = |off: usize, len: usize| p.mr_a.sge(off, len).map_err(e("sge"));
    let s8 = [sge_a(A_SRC, 8)?];
    let s700 = [sge_a(A_SRC + 8, 700)?];
    let s300 = [sge_a(A_SRC + 100, 300)?];
    let sread = [sge_a(A_READ_DST, 500)?];
    let sfaa = [sge_a(A_FAA_RES, 8)?];
    let scas = [sge_a(A_CAS_RES, 8)?];
    let s100 = [sge_a(A_SRC + 200, 100)?];
    let batch1 = [
        SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: at(B_W8),
                rkey,
            },
            &s8,
        ),
        SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: at(B_W700),
                rkey,
            },
            &s700,
        ),
        SendWr::new(3, SendOp::Send, &s300),
        SendWr::new(
            4,
            SendOp::RdmaRead {
                remote_addr: at(B_READ_SRC),
                rkey,
            },
            &sread,
        ),
    ];
    let batch2 = [
        SendWr::new(
            5,
            SendOp::AtomicFetchAndAdd {
                remote_addr: at(B_FAA),
                rkey,
                add: 3,
            },
            &sfaa,
        ),
        SendWr::new(
            6,
            SendOp::AtomicCmpAndSwp {
                remote_addr: at(B_CAS),
                rkey,
                compare: 7,
                swap: 9,
            },
            &scas,
        ),
        SendWr::new(
            7,
            SendOp::RdmaWriteWithImm {
                remote_addr: at(B_WIMM),
                rkey,
                imm: 0xfeed,
            },
            &s100,
        ),
    ];
    p.qp_a.post_send(&batch1).map_err(pe("a batch 1"))?;
    // B sends and writes towards A while A's first batch is in flight.
    let sb_send = [p.mr_b.sge(B_SRC, 200).map_err(e("sge"))?];
    let sb_write = [p.mr_b.sge(B_SRC + 200, 64).map_err(e("sge"))?];
    let a_w64 = SendOp::RdmaWrite {
        remote_addr: p.mr_a.addr() + A_W64 as u64,
        rkey: p.mr_a.rkey(),
    };
    p.qp_b
        .post_send(&[
            SendWr::new(301, SendOp::Send, &sb_send),
            SendWr::new(302, a_w64, &sb_write),
        ])
        .map_err(pe("b sends"))?;
    // One poll lets the fabric reach a timer deadline before the second batch is posted.
    let mut early = [WorkCompletion::default(); 16];
    let n = p.cq_a.clone_poll(&mut early)?;
    p.qp_a.post_send(&batch2).map_err(pe("a batch 2"))?;

    // Collect: a gets sends 1..=7 and receive 201; b gets receives 101, 102 and sends 301, 302.
    let mut a_wcs: Vec<WorkCompletion> = early[..n].to_vec();
    collect(&p.cq_a, &mut a_wcs, 8)?;
    let mut b_wcs = Vec::new();
    collect(&p.cq_b, &mut b_wcs, 4)?;

    let (a_sends, a_recvs): (Vec<_>, Vec<_>) = a_wcs.iter().partition(|w| !w.opcode.is_recv());
    let ids = |w: &[&WorkCompletion]| w.iter().map(|w| w.wr_id).collect::<Vec<_>>();
    ensure!(
        ids(&a_sends) == [1, 2, 3, 4, 5, 6, 7],
        "a's send completions out of order or missing/duplicated: {a_sends:?}"
    );
    for w in a_wcs.iter().chain(&b_wcs) {
        ensure!(w.status == WcStatus::Success, "failed completion {w:?}");
    }
    let want_ops = [
        WcOpcode::RdmaWrite,
        WcOpcode::RdmaWrite,
        WcOpcode::Send,
        WcOpcode::RdmaRead,
        WcOpcode::FetchAdd,
        WcOpcode::CompSwap,
        WcOpcode::RdmaWrite,
    ];
    let got_ops: Vec<_> = a_sends.iter().map(|w| w.opcode).collect();
    ensure!(got_ops == want_ops, "a's send opcodes {got_ops:?}");
    ensure!(
        a_recvs.len() == 1 && a_recvs[0].wr_id == 201 && a_recvs[0].byte_len == 200,
        "a's receive {a_recvs:?}"
    );
    let (b_sends, b_recvs): (Vec<_>, Vec<_>) = b_wcs.iter().partition(|w| !w.opcode.is_recv());
    ensure!(ids(&b_sends) == [301, 302], "b's sends {b_sends:?}");
    ensure!(ids(&b_recvs) == [101, 102], "b's receives {b_recvs:?}");
    ensure!(
        b_recvs[0].byte_len == 300 && b_recvs[0].opcode == WcOpcode::Recv,
        "b's SEND receive {:?}",
        b_recvs[0]
    );
    ensure!(
        b_recvs[1].opcode == WcOpcode::RecvRdmaWithImm && b_recvs[1].imm_data == 0xfeed,
        "b's WRITE_WITH_IMM receive {:?}",
        b_recvs[1]
    );

    // Data.
    let read_a = |off: usize, len: usize| {
        let mut v = vec![0; len];
        p.mr_a.read(off, &mut v).map(|_| v).map_err(e("read a"))
    };
    let read_b = |off: usize, len: usize| {
        let mut v = vec![0; len];
        p.mr_b.read(off, &mut v).map(|_| v).map_err(e("read b"))
    };
    ensure!(read_b(B_W8, 8)? == a_src[..8], "8-byte WRITE data");
    ensure!(read_b(B_W700, 700)? == a_src[8..708], "700-byte WRITE data");
    ensure!(read_b(B_RECV, 300)? == a_src[100..400], "SEND data");
    ensure!(
        read_b(B_WIMM, 100)? == a_src[200..300],
        "WRITE_WITH_IMM data"
    );
    ensure!(read_a(A_READ_DST, 500)? == b_read, "READ data");
    ensure!(read_a(A_RECV, 200)? == b_src[..200], "b's SEND data");
    ensure!(read_a(A_W64, 64)? == b_src[200..264], "b's WRITE data");
    let word = |v: Vec<u8>| u64::from_ne_bytes(v.try_into().unwrap_or_default());
    ensure!(
        word(read_b(B_FAA, 8)?) == 103,
        "FETCH_ADD applied other than once"
    );
    ensure!(
        word(read_a(A_FAA_RES, 8)?) == 100,
        "FETCH_ADD original value"
    );
    ensure!(word(read_b(B_CAS, 8)?) == 9, "COMPARE_SWAP result");
    ensure!(
        word(read_a(A_CAS_RES, 8)?) == 7,
        "COMPARE_SWAP original value"
    );

    // Quiescence: nothing else completes, both QPs healthy.
    p.sim.run_until_idle().map_err(e("run until idle"))?;
    let mut extra = [WorkCompletion::default(); 4];
    for (name, cq) in [("a", &p.cq_a), ("b", &p.cq_b)] {
        let n = cq.clone_poll(&mut extra)?;
        ensure!(n == 0, "extra completions on {name}: {:?}", &extra[..n]);
    }
    ensure!(
        p.qp_a.state().map_err(e("state"))? == QpState::Rts
            && p.qp_b.state().map_err(e("state"))? == QpState::Rts,
        "a QP left RTS"
    );
    Ok(())
}

/// Polls `cq` until `out` holds `n` completions.
fn collect(cq: &SimCq, out: &mut Vec<WorkCompletion>, n: usize) -> Result<(), String> {
    while out.len() < n {
        match cq.next_completion() {
            Ok(wc) => out.push(wc),
            Err(err) => {
                return Err(format!(
                    "expected {n} completions, have {}: {err}: {out:?}",
                    out.len()
                ));
            }
        }
    }
    Ok(())
}

/// `CompletionQueue::poll` with the error as a string.
trait ClonePoll {
    fn clone_poll(&self, out: &mut [WorkCompletion]) -> Result<usize, String>;
}

impl ClonePoll for SimCq {
    fn clone_poll(&self, out: &mut [WorkCompletion]) -> Result<usize, String> {
        verbs_api::CompletionQueue::poll(self, out).map_err(|e| format!("poll: {e}"))
    }
}
