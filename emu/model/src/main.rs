//! `model-check [NAME|all] [--depth N] [--fair every|leaves] [--recovery ibta|sr]`: explores the named configurations
//! (see `emu_model::Config::NAMES`) and prints one table row each; on a violation, prints the
//! schedule as a packet-level test and exits with status 1.

use std::process::ExitCode;

use emu_model::explore::explore_with;
use emu_model::{Config, FairCheck, scenario};
use verbs_api::Recovery;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut names: Vec<String> = Vec::new();
    let mut depth: Option<u32> = None;
    let mut fair: Option<FairCheck> = None;
    let mut recovery = Recovery::Ibta;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--depth" => depth = it.next().and_then(|d| d.parse().ok()),
            "--fair" => {
                fair = match it.next().map(String::as_str) {
                    Some("every") => Some(FairCheck::Every),
                    Some("leaves") => Some(FairCheck::Leaves),
                    _ => return usage(),
                }
            }
            "--recovery" => {
                recovery = match it.next().map(String::as_str) {
                    Some("ibta") => Recovery::Ibta,
                    Some("sr") => Recovery::SelectiveRepeat,
                    _ => return usage(),
                }
            }
            "all" => names.extend(Config::NAMES.iter().map(|s| (*s).to_string())),
            n => names.push(n.to_string()),
        }
    }
    if names.is_empty() {
        return usage();
    }
    println!(
        "| configuration | WRs | budgets (loss/dup) | depth | states | transitions | fair runs | retry-exhausted | time | result |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut failed = false;
    for name in names {
        let Some(mut cfg) = Config::named(&name) else {
            eprintln!("unknown configuration {name}");
            return usage();
        };
        if let Some(d) = depth {
            cfg.depth = d;
        }
        if let Some(f) = fair {
            cfg.fair = f;
        }
        cfg.recovery = recovery;
        if recovery != Recovery::Ibta {
            cfg.name = format!("{} (sr)", cfg.name);
        }
        let r = explore_with(&cfg, std::env::var_os("MODEL_PROGRESS").is_some());
        let wrs: Vec<String> = cfg.wrs.iter().map(|w| format!("{:?}", w.op)).collect();
        let result = match (&r.violation, r.truncated) {
            (Some(v), _) => v
                .message
                .split(':')
                .next()
                .unwrap_or("violation")
                .to_string(),
            (None, true) => "no violation (truncated)".to_string(),
            (None, false) => "no violation".to_string(),
        };
        println!(
            "| {} | {} | {}/{} | {}/{} | {} | {} | {} ({:?}) | {} | {:.1} s | {} |",
            cfg.name,
            wrs.join(", "),
            cfg.loss_budget,
            cfg.dup_budget,
            r.depth,
            cfg.depth,
            r.states,
            r.transitions,
            r.fair_runs,
            cfg.fair,
            r.fair_errors,
            r.elapsed.as_secs_f64(),
            result
        );
        if let Some(v) = &r.violation {
            failed = true;
            eprintln!("{}: {}", cfg.name, v.message);
            eprintln!("{}", scenario::render(&cfg, v));
            if std::env::var_os("MODEL_NARRATE").is_some() {
                eprintln!("{}", scenario::narrate(&cfg, &v.schedule));
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: model-check NAME...|all [--depth N] [--fair every|leaves] [--recovery ibta|sr]"
    );
    eprintln!("configurations: {}", Config::NAMES.join(", "));
    ExitCode::from(2)
}
