//! Runs the built `softverbs` binary for the `run_*` tests: in its own process group (so a
//! guard can kill the orchestrator and every node it started), with a hard time limit, one run
//! at a time per test binary (the machine has two cores), in a fresh directory under
//! `CARGO_TARGET_TMPDIR`.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A finished run.
pub struct Outcome {
    /// Exit code.
    pub code: i32,
    /// Standard output (the human summary).
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// The JSON report, if one was written.
    pub report: Option<Value>,
    /// The run directory.
    pub run_dir: PathBuf,
}

impl Outcome {
    /// The report; panics with the output if there is none.
    pub fn report(&self) -> &Value {
        self.report
            .as_ref()
            .unwrap_or_else(|| panic!("no report\n{}\n{}", self.stdout, self.stderr))
    }

    /// The invariant named `name`.
    pub fn invariant(&self, name: &str) -> &Value {
        self.report()["invariants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == name)
            .unwrap_or_else(|| panic!("no invariant {name}"))
    }

    /// Asserts the run passed: exit 0, the report's verdict, no violation, the PASS line.
    pub fn assert_passed(&self) {
        assert_eq!(self.code, 0, "{}", self.dump());
        let report = self.report();
        assert_eq!(report["passed"], true, "{}", self.dump());
        assert_eq!(num(&report["violations"]), 0);
        assert!(self.stdout.contains("result: PASS"), "{}", self.dump());
    }

    /// Everything, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Kills the process group of a still-running child on drop (the orchestrator and its
/// nodes): the child is the group's leader and not reaped yet, so the id is still its own.
struct GroupGuard(Option<Child>);

fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            kill_group(child.id());
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Processes whose process group is `pgid` (from /proc).
fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // Fields after the parenthesised command: state ppid pgrp ...
                    let rest = stat.rsplit_once(')')?.1;
                    rest.split_whitespace().nth(2)?.parse::<u32>().ok()
                })
                == Some(pgid)
        })
        .collect()
}

/// A fresh directory for test `name`.
pub fn test_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("softverbs-run-tests")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `softverbs run ARGS` with `plan` (if any) as `--faults`, a run dir and a report in a
/// fresh directory, killing everything after `limit`.
pub fn run(name: &str, args: &[&str], plan: Option<&str>, limit: Duration) -> Outcome {
    let dir = test_dir(name);
    let run_dir = dir.join("run");
    let report = dir.join("report.json");
    let mut full: Vec<String> = vec!["run".into()];
    full.extend(args.iter().map(|a| a.to_string()));
    if let Some(plan) = plan {
        let path = dir.join("plan.toml");
        std::fs::write(&path, plan).unwrap();
        full.push("--faults".into());
        full.push(path.display().to_string());
    }
    full.extend([
        "--run-dir".to_string(),
        run_dir.display().to_string(),
        "--report".to_string(),
        report.display().to_string(),
    ]);
    let full: Vec<&str> = full.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = softverbs(&full, limit);
    let report = std::fs::read(&report)
        .ok()
        .map(|bytes| serde_json::from_slice(&bytes).unwrap());
    Outcome {
        code,
        stdout,
        stderr,
        report,
        run_dir,
    }
}

/// Runs `softverbs ARGS` (any subcommand) in its own process group, one at a time, killing
/// everything after `limit`; checks that it left no process of its group behind. Returns the
/// exit code, stdout and stderr.
pub fn softverbs(args: &[&str], limit: Duration) -> (i32, String, String) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_softverbs"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut guard = GroupGuard(Some(cmd.spawn().unwrap()));
    let child = guard.0.as_mut().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let pgid = child.id();
    let status = loop {
        if Instant::now() >= deadline {
            drop(guard);
            panic!("softverbs {args:?} did not finish in {limit:?}");
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    guard.0 = None;
    // The orchestrator must have reaped every node: nothing of its group may be left.
    let left = group_members(pgid);
    if !left.is_empty() {
        kill_group(pgid);
        panic!("softverbs {args:?} left processes {left:?} behind");
    }
    let stdout = out_thread.join().unwrap();
    let stderr = err_thread.join().unwrap();
    (status.code().unwrap_or(-1), stdout, stderr)
}

/// `n` as u64 from a JSON number (0 if absent).
pub fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}
