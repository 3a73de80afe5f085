//! Stable-toolchain replay of the cargo-fuzz corpora (`fuzz/corpus/<target>/`).
//!
//! The fuzz target bodies live in `fuzz/targets/src/lib.rs`, a file the nightly-only fuzz
//! workspace compiles as a library and this test includes as a module, so every seed and every
//! reproducer committed to a corpus directory is checked by a plain `cargo test`, with the real
//! ICRC check (the fuzz build compiles `emu-proto` with `cfg(fuzzing)`, which accepts every
//! ICRC). See `fuzz/README.md`.

// Test code: a failing unwrap is a failing test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

// The module is private here, but its functions are the public API of the fuzz library.
#[allow(unreachable_pub)]
#[path = "../../fuzz/targets/src/lib.rs"]
mod targets;

/// The corpus directory of fuzz target `target`.
fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

/// Runs `body` on every file of `target`'s corpus, which must hold at least `min_files` files,
/// and fails listing every file that panicked.
fn replay(target: &str, min_files: usize, body: fn(&[u8])) {
    let dir = corpus_dir(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    assert!(
        files.len() >= min_files,
        "{}: {} corpus files, expected at least {min_files}",
        dir.display(),
        files.len()
    );
    let failed: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let data = std::fs::read(path).unwrap();
            let outcome = panic::catch_unwind(AssertUnwindSafe(|| body(&data)));
            outcome.err().map(|payload| {
                let msg = payload
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| payload.downcast_ref::<&str>().copied())
                    .unwrap_or("<non-string panic>");
                format!("{}: {msg}", path.display())
            })
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} {target} corpus files panicked:\n{}",
        failed.len(),
        files.len(),
        failed.join("\n")
    );
}

#[test]
fn wire_decode_corpus() {
    // One seed per RC opcode (23) at least.
    replay(
        "wire_decode",
        emu_proto::wire::ALL_RC.len(),
        targets::wire_decode,
    );
}

#[test]
fn fault_plan_corpus() {
    replay("fault_plan", 10, targets::fault_plan);
}

#[test]
fn run_plan_corpus() {
    replay("run_plan", 10, targets::run_plan);
}

#[test]
fn responder_corpus() {
    replay("responder", 10, targets::responder);
}

#[test]
fn completer_corpus() {
    replay("completer", 10, targets::completer);
}

#[test]
fn verbs_ops_corpus() {
    replay("verbs_ops", 5, targets::verbs_ops);
}

#[test]
fn pair_corpus() {
    replay("pair", 5, targets::pair);
}

#[test]
fn cm_mad_corpus() {
    replay("cm_mad", 5, targets::cm_mad);
}

#[test]
fn engine_targets_accept_any_short_input() {
    // The engine targets read an exhausted input as zeros, the ordinary choices: short inputs
    // (the empty one included) must run without a panic, not only the committed seeds.
    type Body = fn(&[u8]);
    let bodies: [(&str, Body); 5] = [
        ("cm_mad", targets::cm_mad),
        ("responder", targets::responder),
        ("completer", targets::completer),
        ("verbs_ops", targets::verbs_ops),
        ("pair", targets::pair),
    ];
    for (name, body) in bodies {
        for len in 0..24 {
            let data: Vec<u8> = (0..len).map(|i| (i * 37 + len) as u8).collect();
            let outcome = panic::catch_unwind(AssertUnwindSafe(|| body(&data)));
            assert!(outcome.is_ok(), "{name} panicked on {data:?}");
        }
    }
}

#[test]
fn wire_decode_seeds_are_valid_packets() {
    // The seeds are well-formed packets with ICRCs for `CTX_V4`: one per RC opcode.
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(corpus_dir("wire_decode")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|ext| ext != "bin") {
            continue;
        }
        let data = std::fs::read(&path).unwrap();
        let packet = emu_proto::wire::Packet::new_unchecked(&data[..]);
        let Ok(repr) = emu_proto::wire::PacketRepr::parse(&packet) else {
            continue; // reproducers need not parse
        };
        if emu_proto::wire::check_icrc(&targets::CTX_V4, &data).is_ok() {
            seen.push(repr.bth.opcode);
        }
    }
    for op in emu_proto::wire::ALL_RC {
        assert!(seen.contains(&op), "no valid seed for {op:?}");
    }
}

#[test]
fn fault_plan_seeds_cover_every_action() {
    let mut actions = Vec::new();
    for entry in std::fs::read_dir(corpus_dir("fault_plan")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
        if let Ok(plan) = emu_fault::FaultPlan::from_toml(&text) {
            actions.extend(plan.rules.iter().map(|r| r.action.name()));
        }
    }
    for name in [
        "drop",
        "duplicate",
        "delay",
        "corrupt",
        "truncate",
        "partition",
        "hold",
        "rate_limit",
    ] {
        assert!(actions.contains(&name), "no valid seed plan uses `{name}`");
    }
}

/// The files of `target`'s corpus whose parse outcome disagrees with their name: `invalid_*`
/// must be rejected, every other file accepted. A file that is not UTF-8 (fuzzer growth can
/// hold such bytes) counts as rejected, as the fuzz target and the CLI reject it.
fn misnamed<E: std::fmt::Debug>(
    target: &str,
    parse: impl Fn(&str) -> Result<(), E>,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(corpus_dir(target)).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        let outcome = match std::str::from_utf8(&bytes) {
            Ok(text) => parse(text).map_err(|e| format!("{e:?}")),
            Err(e) => Err(format!("not UTF-8: {e}")),
        };
        if outcome.is_err() != name.starts_with("invalid_") {
            wrong.push(format!("{name}: {outcome:?}"));
        }
    }
    wrong
}

#[test]
fn run_plan_seeds_named_invalid_are_rejected_and_only_they() {
    // The corpus doubles as the CLI's bad-input list: `invalid_*` plans must be refused (exit 2
    // in `softverbs run`), every other seed accepted.
    let wrong = misnamed("run_plan", |text| {
        softverbs_cli::run::plan::parse(text, 1, 3).map(drop)
    });
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn fault_plan_seeds_named_invalid_are_rejected_and_only_they() {
    let wrong = misnamed("fault_plan", |text| {
        emu_fault::FaultPlan::from_toml(text).map(drop)
    });
    assert!(wrong.is_empty(), "{wrong:#?}");
}
