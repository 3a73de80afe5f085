//! Breadth-first exploration with state hashing, and the fairness run.
//!
//! Every state is stored once, by its 64-bit [`System::fingerprint`]; the arena keeps each
//! state's parent and the choice that reached it, so a violation's schedule is rebuilt by
//! walking parents. Breadth-first order makes that schedule a shortest one to the first
//! violating state found (up to fingerprint collisions: with 64 bits and 10⁷ states their
//! chance is about 10⁻⁵, and a collision can only hide states, never invent a violation).

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant as WallClock};

use crate::config::{Config, FairCheck, Side};
use crate::props::{check_complete, check_state};
use crate::system::{Choice, System};

/// Steps a fairness run may take before it counts as a livelock.
const FAIR_STEPS: usize = 2_000;

/// A property violation and the shortest schedule found that shows it.
#[derive(Clone, Debug)]
pub struct Violation {
    /// What failed (the property's name first).
    pub message: String,
    /// The choices from the initial state.
    pub schedule: Vec<Choice>,
}

/// What one exploration did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Configuration name.
    pub config: String,
    /// Distinct states.
    pub states: usize,
    /// Transitions taken (including those into known states).
    pub transitions: usize,
    /// Deepest level reached.
    pub depth: u32,
    /// States without any choice.
    pub terminal: usize,
    /// Fairness runs done.
    pub fair_runs: usize,
    /// Fairness runs that ended in an allowed retry-exhausted error.
    pub fair_errors: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// True if `max_states` cut the search short.
    pub truncated: bool,
    /// The first violation, if any.
    pub violation: Option<Violation>,
}

/// Explores `cfg` breadth-first up to its depth, checking every property; stops at the first
/// violation.
pub fn explore(cfg: &Config) -> Report {
    explore_with(cfg, false)
}

/// [`explore`], printing the state count at each new depth to stderr if `progress`.
pub fn explore_with(cfg: &Config, progress: bool) -> Report {
    let start = WallClock::now();
    let mut report = Report {
        config: cfg.name.clone(),
        ..Report::default()
    };
    let cap = disturbance_cap(cfg);
    let init = match System::new(cfg) {
        Ok(s) => s,
        Err(message) => {
            report.violation = Some(Violation {
                message: format!("set-up: {message}"),
                schedule: Vec::new(),
            });
            report.elapsed = start.elapsed();
            return report;
        }
    };
    // Arena: (parent, choice, depth) per state, in breadth-first order, which makes the
    // arena its own queue. States are not kept: one is rebuilt by replaying its path from
    // the initial state when its turn comes (a path is at most `depth` steps), so memory is
    // a few dozen bytes per state instead of the engines' ~10 KB.
    let root = init.fingerprint(cap);
    let mut arena: Vec<Entry> = vec![Entry {
        parent: 0,
        choice: None,
        depth: 0,
        fingerprint: root,
    }];
    let mut seen: HashSet<u64> = HashSet::new();
    seen.insert(root);
    if let Err(message) = check_state(cfg, &init) {
        report.violation = Some(Violation {
            message,
            schedule: Vec::new(),
        });
    }
    let mut cursor = 0;
    while report.violation.is_none() && cursor < arena.len() {
        let (idx, depth) = (cursor, arena[cursor].depth);
        cursor += 1;
        let sys = match rebuild(cfg, &init, &arena, idx, cap) {
            Ok(sys) => sys,
            Err(message) => {
                let schedule = path(&arena, idx);
                report.violation = Some(Violation { message, schedule });
                break;
            }
        };
        if progress && depth > report.depth {
            eprintln!("  depth {depth}: {} states so far", seen.len());
        }
        report.depth = report.depth.max(depth);
        let choices = sys.choices(cfg);
        let leaf = choices.is_empty() || depth >= cfg.depth;
        report.terminal += usize::from(choices.is_empty());
        if cfg.fair == FairCheck::Every || leaf {
            report.fair_runs += 1;
            match fair_run(cfg, &sys) {
                Ok((failed, _)) => report.fair_errors += usize::from(failed),
                Err((message, tail)) => {
                    let mut schedule = path(&arena, idx);
                    schedule.extend(tail);
                    report.violation = Some(Violation { message, schedule });
                    break;
                }
            }
        }
        if leaf {
            continue;
        }
        for choice in choices {
            report.transitions += 1;
            let mut next = sys.clone();
            if let Err(message) = run_step(cfg, &mut next, choice) {
                let mut schedule = path(&arena, idx);
                schedule.push(choice);
                report.violation = Some(Violation { message, schedule });
                break;
            }
            if seen.len() >= cfg.max_states {
                report.truncated = true;
                break;
            }
            let fingerprint = next.fingerprint(cap);
            if seen.insert(fingerprint) {
                arena.push(Entry {
                    parent: idx,
                    choice: Some(choice),
                    depth: depth + 1,
                    fingerprint,
                });
            }
        }
    }
    report.states = seen.len();
    report.elapsed = start.elapsed();
    report
}

/// One step with panics caught, then the safety properties.
fn run_step(cfg: &Config, sys: &mut System, choice: Choice) -> Result<(), String> {
    let stepped = catch_unwind(AssertUnwindSafe(|| sys.step(cfg, choice)));
    match stepped {
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_default();
            Err(format!("no-panic: the engine panicked: {what}"))
        }
        Ok(Err(e)) => Err(format!("bounded-queue: {e}")),
        Ok(Ok(())) => check_state(cfg, sys),
    }
}

/// Retries the disturbances so far may have cost before an error is allowed: the smaller of
/// `retry_cnt` and a finite `rnr_retry`.
fn disturbance_cap(cfg: &Config) -> u32 {
    let rnr = if cfg.rnr_retry == 7 {
        u8::MAX
    } else {
        cfg.rnr_retry
    };
    u32::from(cfg.retry_cnt.min(rnr))
}

/// RNR NAKs that cost an RNR retry before the network did anything wrong: with late receives,
/// each receive-consuming message may meet an empty receive queue once. (Every later RNR NAK
/// needs a timer firing, a duplicate or a stale retransmission, which are disturbances: the
/// engine, as rxe's completer, charges every RNR NAK it gets for the oldest PSN, duplicates
/// included.)
fn free_rnr_naks(cfg: &Config) -> u32 {
    if cfg.recvs == crate::config::Recvs::Late {
        let n = cfg.wrs.iter().filter(|w| w.op.consumes_recv()).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    } else {
        0
    }
}

/// From `sys`, the network stops misbehaving: the application posts every receive, then
/// datagrams are delivered oldest first and a timer fires only when nothing is in flight,
/// until quiescence. Checks every state on the way and completeness at the end. Ok: whether
/// it ended in an (allowed) retry-exhausted error, and the steps it took. Err: the violation
/// and the steps up to it.
pub fn fair_run(cfg: &Config, sys: &System) -> Result<(bool, Vec<Choice>), (String, Vec<Choice>)> {
    let mut sys = sys.clone();
    let mut steps = Vec::new();
    for side in [Side::A, Side::B] {
        for pair in 0..cfg.pairs {
            while sys.recv_pending(cfg, side, pair) {
                let c = Choice::PostRecv { side, pair };
                steps.push(c);
                run_step(cfg, &mut sys, c).map_err(|e| (e, steps.clone()))?;
            }
        }
    }
    let may_fail = sys.disturbances + free_rnr_naks(cfg) > disturbance_cap(cfg);
    for _ in 0..FAIR_STEPS {
        let c = if !sys.flight.is_empty() {
            Choice::Deliver(0)
        } else if sys.next_deadline().is_some() {
            Choice::Fire
        } else {
            return check_complete(cfg, &sys, may_fail)
                .map(|failed| (failed, steps.clone()))
                .map_err(|e| (e, steps));
        };
        steps.push(c);
        // Firing on an idle network is the normal recovery from an earlier loss, not a new
        // disturbance; keep the count as it was.
        let before = sys.disturbances;
        run_step(cfg, &mut sys, c).map_err(|e| (e, steps.clone()))?;
        sys.disturbances = before;
    }
    Err((
        format!("fair-completion: no quiescence within {FAIR_STEPS} lossless steps (livelock)"),
        steps,
    ))
}

/// One discovered state: how it was first reached.
struct Entry {
    parent: usize,
    choice: Option<Choice>,
    depth: u32,
    /// The state's fingerprint, to check that replaying its path rebuilds it.
    fingerprint: u64,
}

/// The choices from the root to state `idx`.
fn path(arena: &[Entry], mut idx: usize) -> Vec<Choice> {
    let mut out = Vec::new();
    while let Some(Entry {
        parent,
        choice: Some(choice),
        ..
    }) = arena.get(idx)
    {
        out.push(*choice);
        idx = *parent;
    }
    out.reverse();
    out
}

/// State `idx`, rebuilt by replaying its path from `init`. The engine is deterministic and
/// `Hca::clone` faithful, so this is the state that was fingerprinted; an error means one of
/// them is not.
fn rebuild(
    cfg: &Config,
    init: &System,
    arena: &[Entry],
    idx: usize,
    cap: u32,
) -> Result<System, String> {
    let mut sys = init.clone();
    for choice in path(arena, idx) {
        sys.step(cfg, choice)
            .map_err(|e| format!("determinism: replaying a known path failed: {e}"))?;
    }
    if sys.fingerprint(cap) != arena[idx].fingerprint {
        return Err("determinism: replaying a path gave another state".into());
    }
    Ok(sys)
}
