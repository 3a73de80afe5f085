//! The seeded fault campaign: at least 1,000 seeds of random fault plans (0–30 % loss, 0–50 %
//! duplication, jittered delay that reorders, corruption, short partitions, targeted ACK/READ
//! response/atomic loss), all healing within the retry budget, each running a small mixed
//! workload on an RC pair in virtual time with every invariant checked (see
//! `common::mixed_workload`).
//!
//! A failure prints the seed, the plan and how to replay it: `SOFTVERBS_SEED=<seed> cargo test
//! -p emu-sim --test campaign` runs only that seed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Instant;

use emu_sim::Stats;
use emu_sim::fault::LinkCounters;

/// Seeds per test function; two functions let the two CI cores share the campaign.
const SEEDS_PER_HALF: u64 = 1000;

fn campaign(first: u64, count: u64) {
    let seeds: Vec<u64> = match std::env::var(emu_sim::SEED_ENV) {
        Ok(_) => vec![emu_sim::seed_from_env(0)],
        Err(_) => (first..first + count).collect(),
    };
    let start = Instant::now();
    let mut failures = Vec::new();
    let (mut delivered, mut virtual_time) = (0, std::time::Duration::ZERO);
    let mut faults = LinkCounters::default();
    let mut stats = Stats::default();
    for &seed in &seeds {
        match common::run_seed(seed) {
            Ok(run) => {
                delivered += run.delivered;
                virtual_time += run.virtual_time;
                common::add_counters(&mut faults, &run.faults);
                stats += run.stats;
            }
            Err(why) => {
                let (plan, timeout) = common::random_plan(seed);
                failures.push(format!(
                    "seed {seed} (timeout code {timeout}, {:?}): {why}\n{plan}\nreplay: {}={seed} \
                     cargo test -p emu-sim --test campaign",
                    common::random_rc(seed, timeout),
                    emu_sim::SEED_ENV
                ));
            }
        }
    }
    eprintln!(
        "{} seeds, {} datagrams, {:?} of virtual time in {:?} of wall time\n{faults:?}\n{stats:?}",
        seeds.len(),
        delivered,
        virtual_time,
        start.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of {} seeds violated an invariant:\n\n{}",
        failures.len(),
        seeds.len(),
        failures.join("\n\n")
    );
    if seeds.len() > 1 {
        // The campaign is not vacuous: every fault kind fired and every recovery path ran.
        assert!(faults.dropped > 0 && faults.duplicated > 0 && faults.delayed > 0);
        assert!(faults.corrupted > 0 && faults.partitioned > 0);
        assert_eq!(
            stats.icrc_errors, faults.corrupted,
            "every corruption caught by the ICRC"
        );
        assert!(stats.timeout_retries > 0 && stats.retransmits_nak > 0);
        assert!(stats.seq_naks_sent > 0 && stats.duplicate_request > 0);
        assert!(stats.out_of_seq_request > 0 && stats.duplicate_response > 0);
        assert_eq!(stats.retry_exceeded_err, 0);
    }
}

#[test]
fn campaign_seeds_0_to_999() {
    campaign(0, SEEDS_PER_HALF);
}

#[test]
fn campaign_seeds_1000_to_1999() {
    if std::env::var(emu_sim::SEED_ENV).is_ok() {
        return; // the replay runs in the other half
    }
    campaign(SEEDS_PER_HALF, SEEDS_PER_HALF);
}
