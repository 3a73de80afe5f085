//! Safety under faults that never heal: up to 45 % loss, duplication, jitter and corruption for
//! the whole run, random `retry_cnt` (0–7), `rnr_retry` (0–7) and receives posted late (RNR
//! NAKs). WRs may fail (RETRY_EXC_ERR, RNR_RETRY_EXC_ERR), but never unsafely: completions
//! arrive exactly once and in order, errors are followed only by flushes, every WR that
//! succeeded moved intact data, FETCH_ADDs took effect at most once each (exactly once for the
//! successful ones, with the right original value), and receives complete in order.
//!
//! Replay a failing seed with `SOFTVERBS_SEED=<seed> cargo test -p emu-sim --test safety`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Draw, pattern, random_rc};
use emu_sim::fault::{FaultPlan, corrupt, delay, drop, duplicate};
use emu_sim::{PairOptions, SimProvider};
use verbs_api::{
    CompletionQueue, MemoryRegion, QueuePair, RecvWr, SendOp, SendWr, Sge, WcStatus, WorkCompletion,
};

const WRS: u64 = 12;
const B_FAA: usize = 16384;
const B_READ: usize = 40000;
const A_FAA_RES: usize = 8192;
const A_READ_DST: usize = 20000;

/// WR `i`: WRITE, SEND, FETCH_ADD, READ, repeating.
fn kind(i: u64) -> u64 {
    i % 4
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

fn plan(seed: u64, d: &mut Draw) -> FaultPlan {
    FaultPlan::new(seed)
        .rule(delay(
            Duration::ZERO..=Duration::from_nanos(d.below(40_000)),
        ))
        .rule(drop(d.unit() * 0.45))
        .rule(duplicate(1 + d.below(2) as u8).probability(d.unit() * 0.5))
        .rule(corrupt(d.unit() * 0.05))
}

fn run(seed: u64) -> Result<(), String> {
    let mut d = Draw::new(seed ^ 0x5afe);
    let plan = plan(seed, &mut d);
    let timeout = 8 + d.below(4) as u8;
    let sim = SimProvider::builder()
        .seed(seed)
        .faults(plan)
        .build()
        .map_err(|e| e.to_string())?;
    let mut rc = random_rc(seed, timeout);
    rc.retry_cnt = d.below(8) as u8;
    rc.rnr_retry = d.below(8) as u8;
    rc.min_rnr_timer = 1 + d.below(5) as u8;
    let late = d.below(6) as usize;
    let opts = PairOptions {
        rc,
        psn_a: 0xFF_FFF0,
        ..PairOptions::default()
    };
    let p = sim.connect_pair(opts).map_err(|e| e.to_string())?;
    let a_src = pattern(1, 4000);
    let b_read = pattern(5, 3000);
    p.mr_a.write(0, &a_src).unwrap();
    p.mr_b.write(B_FAA, &100u64.to_ne_bytes()).unwrap();
    p.mr_b.write(B_READ, &b_read).unwrap();

    let recv_sges: Vec<[Sge; 1]> = (0..WRS as usize)
        .map(|i| [p.mr_b.sge(20000 + i * 1000, 1000).unwrap()])
        .collect();
    let recvs: Vec<_> = recv_sges
        .iter()
        .enumerate()
        .map(|(i, s)| RecvWr::new(100 + i as u64, s))
        .collect();
    p.qp_b.post_recv(&recvs[..late]).unwrap();
    let sges: Vec<[Sge; 1]> = (0..WRS)
        .map(|i| {
            let i = i as usize;
            match kind(i as u64) {
                2 => [p.mr_a.sge(A_FAA_RES + i * 8, 8).unwrap()],
                3 => [p.mr_a.sge(A_READ_DST + i * 1000, 900).unwrap()],
                _ => [p.mr_a.sge(i * 100, 700).unwrap()],
            }
        })
        .collect();
    let (base, rkey) = (p.mr_b.addr(), p.mr_b.rkey());
    let wrs: Vec<_> = (0..WRS)
        .map(|i| {
            let op = match kind(i) {
                0 => SendOp::RdmaWrite {
                    remote_addr: base + i * 1000,
                    rkey,
                },
                1 => SendOp::Send,
                2 => SendOp::AtomicFetchAndAdd {
                    remote_addr: base + B_FAA as u64,
                    rkey,
                    add: 1,
                },
                _ => SendOp::RdmaRead {
                    remote_addr: base + B_READ as u64,
                    rkey,
                },
            };
            SendWr::new(i, op, &sges[i as usize])
        })
        .collect();
    p.qp_a.post_send(&wrs).unwrap();
    let mut got = Vec::new();
    let mut one = [WorkCompletion::default(); 1];
    for _ in 0..d.below(4) {
        if p.cq_a.poll(&mut one).unwrap() == 1 {
            got.push(one[0]);
        }
    }
    p.qp_b.post_recv(&recvs[late..]).unwrap();
    while got.len() < WRS as usize {
        let wc = p
            .cq_a
            .next_completion()
            .map_err(|e| format!("stuck after {} completions: {e}: {got:?}", got.len()))?;
        got.push(wc);
    }
    sim.run_until_idle().map_err(|e| e.to_string())?;
    ensure!(
        p.cq_a.poll(&mut one).unwrap() == 0,
        "extra completion {:?}",
        one[0]
    );

    // Order, exactly once, errors then flushes only.
    let ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
    ensure!(
        ids == (0..WRS).collect::<Vec<_>>(),
        "completion order {ids:?}"
    );
    let first_err = got.iter().position(|w| w.status != WcStatus::Success);
    if let Some(k) = first_err {
        ensure!(
            got[k].status != WcStatus::WrFlushErr,
            "a flush before the error: {got:?}"
        );
        ensure!(
            got[k + 1..]
                .iter()
                .all(|w| w.status == WcStatus::WrFlushErr),
            "not only flushes after the error: {got:?}"
        );
    }

    // Effects of the successful WRs.
    let succeeded = first_err.unwrap_or(WRS as usize) as u64;
    let mut faa_done = 0;
    for i in 0..succeeded {
        let at = i as usize;
        match kind(i) {
            0 => {
                let mut v = vec![0; 700];
                p.mr_b.read(at * 1000, &mut v).unwrap();
                ensure!(v == a_src[at * 100..at * 100 + 700], "WRITE {i} data");
            }
            2 => {
                let mut w = [0u8; 8];
                p.mr_a.read(A_FAA_RES + at * 8, &mut w).unwrap();
                let orig = u64::from_ne_bytes(w);
                ensure!(orig == 100 + faa_done, "FETCH_ADD {i} returned {orig}");
                faa_done += 1;
            }
            3 => {
                let mut v = vec![0; 900];
                p.mr_a.read(A_READ_DST + at * 1000, &mut v).unwrap();
                ensure!(v == b_read[..900], "READ {i} data");
            }
            _ => {}
        }
    }
    let mut w = [0u8; 8];
    p.mr_b.read(B_FAA, &mut w).unwrap();
    let applied = u64::from_ne_bytes(w) - 100;
    let issued = (0..WRS).filter(|&i| kind(i) == 2).count() as u64;
    ensure!(
        (faa_done..=issued).contains(&applied),
        "FETCH_ADD applied {applied} times, {faa_done} succeeded, {issued} issued"
    );

    // b's receives: successes are in order and cover every successful SEND.
    let mut b_wcs = Vec::new();
    let mut buf = [WorkCompletion::default(); 16];
    loop {
        let k = p.cq_b.poll(&mut buf).unwrap();
        if k == 0 {
            break;
        }
        b_wcs.extend_from_slice(&buf[..k]);
    }
    let ok: Vec<u64> = b_wcs
        .iter()
        .filter(|w| w.status == WcStatus::Success)
        .map(|w| w.wr_id)
        .collect();
    let sends = (0..succeeded).filter(|&i| kind(i) == 1).count();
    ensure!(
        ok.len() >= sends && ok == (100..100 + ok.len() as u64).collect::<Vec<_>>(),
        "b's receives {b_wcs:?} for {sends} successful SENDs"
    );
    Ok(())
}

#[test]
fn never_healing_faults_are_safe() {
    let seeds: Vec<u64> = match std::env::var(emu_sim::SEED_ENV) {
        Ok(_) => vec![emu_sim::seed_from_env(0)],
        Err(_) => (0..1000).collect(),
    };
    let failures: Vec<String> = seeds
        .iter()
        .filter_map(|&seed| {
            run(seed).err().map(|why| {
                let mut d = Draw::new(seed ^ 0x5afe);
                format!(
                    "seed {seed}: {why}\n{}\nreplay: {}={seed} cargo test -p emu-sim --test safety",
                    plan(seed, &mut d),
                    emu_sim::SEED_ENV
                )
            })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n\n{}",
        failures.len(),
        seeds.len(),
        failures.join("\n\n")
    );
}
