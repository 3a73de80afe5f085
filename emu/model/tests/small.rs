//! The model checker's configurations that run in `cargo test` (seconds in a debug build);
//! the larger ones run from `scripts/model-check.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use emu_model::system::{Choice, System};
use emu_model::{Config, Side, explore, scenario};

fn run(cfg: &Config) -> emu_model::Report {
    let r = explore(cfg);
    if let Some(v) = &r.violation {
        panic!(
            "{}: {}\n{}\n{}",
            cfg.name,
            v.message,
            scenario::render(cfg, v),
            scenario::narrate(cfg, &v.schedule)
        );
    }
    assert!(!r.truncated, "{} hit max_states", cfg.name);
    r
}

/// SEND then READ, one loss and one duplicate, every state fairness-checked, to depth 7.
#[test]
fn small_send_read() {
    let mut cfg = Config::named("small").unwrap();
    cfg.depth = 7;
    let r = run(&cfg);
    assert_eq!(r.depth, 7);
    assert!(r.states > 1_000, "{r:?}");
    assert_eq!(r.fair_runs, r.states);
}

/// The same with selective repeat on both QPs (the softverbs extension): holding, selective
/// ACKs, resends and the probe keep every property.
#[test]
fn small_send_read_selective_repeat() {
    let mut cfg = Config::named("small").unwrap();
    cfg.depth = 7;
    cfg.recovery = verbs_api::Recovery::SelectiveRepeat;
    let r = run(&cfg);
    assert!(r.states > 1_000, "{r:?}");
    assert_eq!(r.fair_runs, r.states);
}

/// retry_cnt 1 and two losses: the retry-exhausted path (ERR, RETRY_EXC_ERR, flush) is
/// reached and checked.
#[test]
fn small_retry_exhaustion() {
    let cfg = Config::named("small-exhaust").unwrap();
    let r = run(&cfg);
    assert!(r.fair_errors > 0, "retry exhaustion never reached: {r:?}");
}

/// `narrate` and `render` turn a schedule into a narration and an rc_pair.rs test.
#[test]
fn schedules_render_as_replayable_tests() {
    let cfg = Config::named("rnr").unwrap();
    // The first delivery of the SEND meets an empty receive queue: an RNR NAK comes back.
    let text = scenario::narrate(&cfg, &[Choice::Deliver(0)]);
    assert!(text.contains("RnrNak"), "{text}");
    let v = emu_model::Violation {
        message: "example: not a real violation".into(),
        schedule: vec![
            Choice::Deliver(0),
            Choice::PostRecv {
                side: Side::B,
                pair: 0,
            },
            Choice::Fire,
        ],
    };
    let test = scenario::render(&cfg, &v);
    assert!(test.contains("p.replay(&["), "{test}");
    assert!(
        test.contains("Step::PostRecv(Side::B, 1000, 0x20, 16)"),
        "{test}"
    );
    assert!(test.contains("Step::Fire"), "{test}");
}

/// The properties do catch wrong effects: after a fair run completes SEND and READ, a
/// corrupted byte at the SEND's destination (or the READ's local buffer) is a violation.
#[test]
fn properties_catch_corrupted_effects() {
    use emu_proto::Memory;
    let cfg = Config::named("small").unwrap();
    let sys = System::new(&cfg).unwrap();
    let (failed, steps) = emu_model::explore::fair_run(&cfg, &sys).unwrap();
    assert!(!failed);
    let mut done = sys.clone();
    for c in steps {
        done.step(&cfg, c).unwrap();
    }
    emu_model::props::check_state(&cfg, &done).unwrap();
    let slot = cfg.slot();
    for (side, off) in [(Side::B, slot / 2), (Side::A, slot)] {
        let mut bad = done.clone();
        let node = &mut bad.nodes[side.index()];
        node.mem.write(node.key, off, &[0]).unwrap();
        let err = emu_model::props::check_state(&cfg, &bad).unwrap_err();
        assert!(
            err.starts_with("success-effects") || err.starts_with("recv-matches-send"),
            "{err}"
        );
    }
}

/// With a shared WRITE target, a stale WRITE's data reappearing after a later WRITE completed
/// is a violation.
#[test]
fn properties_catch_a_stale_overwrite() {
    use emu_proto::Memory;
    let cfg = Config::named("overwrite").unwrap();
    let sys = System::new(&cfg).unwrap();
    let (failed, steps) = emu_model::explore::fair_run(&cfg, &sys).unwrap();
    assert!(!failed);
    let mut done = sys.clone();
    for c in steps {
        done.step(&cfg, c).unwrap();
    }
    emu_model::props::check_state(&cfg, &done).unwrap();
    let b = &mut done.nodes[Side::B.index()];
    let stale = emu_model::system::pattern(0, cfg.len);
    b.mem.write(b.key, cfg.target(2), &stale).unwrap();
    let err = emu_model::props::check_state(&cfg, &done).unwrap_err();
    assert!(err.starts_with("success-effects: WR 2"), "{err}");
}
