//! Loss recovery in IBTA mode under a timed wire (issue 19): a stream of RDMA WRITEs and SENDs
//! between two `Hca`s over a link with a rate (packets per step) and a one-step latency, with
//! seeded random loss, duplication and reordering.
//!
//! * `data_loss_alone_never_waits_for_the_ack_timeout`: when only request packets are lost,
//!   sequence NAKs (first, repeated, per round) recover every loss; the local ACK timer never
//!   fires before the stream's tail.
//! * `stream_completes_exactly_once_in_order` (property): under random loss, duplication and
//!   reordering in both directions, every WR completes exactly once, in posting order, with
//!   SUCCESS; every SEND is received once and in order with its data.
//!
//! Unlike `rc_props.rs` (zero-time wire), time passes here, so the requester's RTT estimate and
//! its echo-NAK guard (`completer::nak_is_echo`) take part.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use common::{Action, Dir, Node, Pair};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError};
use verbs_api::{QpState, Recovery, SendOp, SendWr, WcOpcode, WcStatus};

/// Deterministic 64-bit generator (SplitMix64).
#[derive(Clone, Debug)]
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `per_mille` / 1000.
    fn chance(&mut self, per_mille: u64) -> bool {
        self.next() % 1000 < per_mille
    }
}

/// Fault rates in ‰ per datagram, per direction.
#[derive(Copy, Clone, Debug)]
struct Faults {
    /// Requests (a → b) lost.
    data_drop: u64,
    /// Responses (b → a) lost.
    ack_drop: u64,
    dup: u64,
    /// Held back and released a few steps later (reordering).
    hold: u64,
}

/// What a stream run observed.
#[derive(Debug, Default)]
struct Outcome {
    done: bool,
    steps: usize,
}

const WRITE_LEN: u32 = 4096;
const SEND_LEN: u32 = 300;
/// At most this many WRs outstanding on a's send queue.
const DEPTH: usize = 24;

/// Runs `wrs` WRs from a to b (every fourth a SEND, the rest 4 KiB WRITEs at MTU 256, i.e. 16
/// packets each) over a link carrying `rate` datagrams per direction per step of `hop`.
fn stream(
    p: &mut Pair,
    wrs: usize,
    rate: usize,
    hop: Duration,
    faults: Faults,
    seed: u64,
) -> Outcome {
    let rng = Rc::new(Cell::new(seed));
    let r = rng.clone();
    p.set_filter(move |pkt| {
        let mut m = Mix(r.get());
        let drop = if pkt.dir == Dir::AtoB {
            faults.data_drop
        } else {
            faults.ack_drop
        };
        let action = if m.chance(drop) {
            Action::Drop
        } else if m.chance(faults.dup) {
            Action::Duplicate
        } else if m.chance(faults.hold) {
            Action::Hold
        } else {
            Action::Deliver
        };
        r.set(m.0);
        action
    });
    let mut release = Mix(seed ^ 0x5555);
    let (mut posted, mut completed) = (0usize, 0usize);
    let b_mr = p.b.mr;
    for step in 0..200_000 {
        while posted < wrs && posted - completed < DEPTH {
            let id = posted as u64;
            if posted % 4 == 3 {
                let r = p.b.at(u64::from(SEND_LEN) * (id % 16), SEND_LEN);
                p.b.post_recv(id, &[r]);
                let s = p.a.at(u64::from(SEND_LEN) * (id % 16), SEND_LEN);
                p.post_a(&[SendWr::new(id, SendOp::Send, &[s])]);
            } else {
                let s = p.a.at(0, WRITE_LEN);
                let op = SendOp::RdmaWrite {
                    remote_addr: Node::sge(&b_mr, 8192 + u64::from(WRITE_LEN) * (id % 8), 0).addr,
                    rkey: b_mr.rkey,
                };
                p.post_a(&[SendWr::new(id, op, &[s])]);
            }
            posted += 1;
        }
        for wc in p.a.send_wcs() {
            assert_eq!(
                (wc.wr_id, wc.status),
                (completed as u64, WcStatus::Success),
                "send completions exactly once, in order"
            );
            completed += 1;
        }
        if completed == wrs {
            return Outcome {
                done: true,
                steps: step,
            };
        }
        p.transmit_at_most(rate);
        p.now += hop;
        if p.next_deadline().is_some_and(|t| t <= p.now) {
            p.fire_timers();
        }
        if p.held() > 0 && release.chance(300) {
            p.release_one(release.next() as usize);
        }
        p.deliver();
    }
    Outcome::default()
}

fn fill(p: &mut Pair) {
    let data: Vec<u8> = (0..WRITE_LEN).map(|i| (i * 7 + 3) as u8).collect();
    p.a.write(&p.a.mr, 0, &data);
}

#[test]
fn data_loss_alone_never_waits_for_the_ack_timeout() {
    for seed in 0..8u64 {
        let mut p = Pair::with(common::Opts {
            timeout: 14,
            ..common::Opts::default()
        });
        fill(&mut p);
        let faults = Faults {
            data_drop: 10,
            ack_drop: 0,
            dup: 0,
            hold: 0,
        };
        let out = stream(&mut p, 400, 16, Duration::from_micros(5), faults, seed);
        assert!(out.done, "seed {seed}: stalled");
        let (a, b) = (p.a.stats(), p.b.stats());
        assert_eq!(a.timeout_retries, 0, "seed {seed}: {a:?} {b:?}");
        assert!(b.seq_naks_sent > 0);
        assert_eq!(p.b.recv_wcs().len(), 100);
    }
}

fn config(cases: u32, seed: u64) -> Config {
    let mut c = Config::with_cases(cases);
    c.rng_seed = RngSeed::Fixed(seed);
    c.max_shrink_iters = 500;
    c
}

proptest! {
    #![proptest_config(config(48, 0x5eed_0019))]

    #[test]
    fn stream_completes_exactly_once_in_order(
        seed in any::<u64>(),
        data_drop in 0u64..60,
        ack_drop in 0u64..60,
        dup in 0u64..40,
        hold in 0u64..60,
        rate in 1usize..24,
    ) {
        let faults = Faults { data_drop, ack_drop, dup, hold };
        check_stream(Recovery::Ibta, faults, rate, seed)?;
    }
}

proptest! {
    #![proptest_config(config(48, 0x5eed_5319))]

    /// The same property with selective repeat on both ends.
    #[test]
    fn selective_repeat_stream_completes_exactly_once_in_order(
        seed in any::<u64>(),
        data_drop in 0u64..60,
        ack_drop in 0u64..60,
        dup in 0u64..40,
        hold in 0u64..60,
        rate in 1usize..24,
    ) {
        let faults = Faults { data_drop, ack_drop, dup, hold };
        check_stream(Recovery::SelectiveRepeat, faults, rate, seed)?;
    }
}

/// Runs 120 WRs under `faults` and checks exactly-once, in-order completion and the data.
fn check_stream(
    recovery: Recovery,
    faults: Faults,
    rate: usize,
    seed: u64,
) -> Result<(), TestCaseError> {
    let mut p = Pair::with(common::Opts {
        timeout: 10,
        recovery,
        ..common::Opts::default()
    });
    fill(&mut p);
    let out = stream(&mut p, 120, rate, Duration::from_micros(5), faults, seed);
    prop_assert!(out.done, "did not finish ({:?})", p.a.stats());
    prop_assert_eq!(p.a.state(), QpState::Rts);
    prop_assert_eq!(p.b.state(), QpState::Rts);
    let rwcs = p.b.recv_wcs();
    let want: Vec<u64> = (0..120u64).filter(|i| i % 4 == 3).collect();
    let got: Vec<u64> = rwcs.iter().map(|w| w.wr_id).collect();
    prop_assert_eq!(got, want, "receives exactly once, in order");
    for wc in &rwcs {
        prop_assert_eq!(
            (wc.status, wc.opcode, wc.byte_len),
            (WcStatus::Success, WcOpcode::Recv, SEND_LEN)
        );
        let off = u64::from(SEND_LEN) * (wc.wr_id % 16);
        prop_assert_eq!(
            p.b.read(&p.b.mr, off, SEND_LEN as usize),
            p.a.read(&p.a.mr, off, SEND_LEN as usize)
        );
    }
    let w = p.b.read(&p.b.mr, 8192, WRITE_LEN as usize);
    prop_assert_eq!(w, p.a.read(&p.a.mr, 0, WRITE_LEN as usize));
    let _ = out.steps;
    Ok(())
}

/// Selective repeat under data loss alone: no ACK timeout, no sequence NAK, and each loss costs
/// about one resent packet, not a window.
#[test]
fn selective_repeat_resends_only_what_is_lost() {
    for seed in 0..8u64 {
        let mut p = Pair::with(common::Opts {
            timeout: 14,
            recovery: Recovery::SelectiveRepeat,
            ..common::Opts::default()
        });
        fill(&mut p);
        let faults = Faults {
            data_drop: 10,
            ack_drop: 0,
            dup: 0,
            hold: 0,
        };
        let out = stream(&mut p, 400, 16, Duration::from_micros(5), faults, seed);
        assert!(out.done, "seed {seed}: stalled");
        let (a, b) = (p.a.stats(), p.b.stats());
        let lost = p
            .trace
            .iter()
            .filter(|(s, act)| s.dir == Dir::AtoB && *act == Action::Drop)
            .count() as u64;
        assert_eq!(a.timeout_retries, 0, "seed {seed}: {a:?} {b:?}");
        assert_eq!(b.seq_naks_sent, 0);
        assert!(b.sacks_sent > 0 && a.sacks_rcvd > 0);
        assert_eq!(a.retransmits_nak + a.retransmits_timeout, 0, "{a:?}");
        // One resend per loss, plus the odd probe (go-back-N resends ~a window per loss).
        assert!(
            a.retransmits_sack <= lost + lost / 8 + 2,
            "seed {seed}: {lost} lost, {a:?}"
        );
        assert_eq!(p.b.recv_wcs().len(), 100);
    }
}
