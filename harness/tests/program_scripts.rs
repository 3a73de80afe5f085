//! The CI scripts that run unmodified programs on the drop-in (scripts/ibverbs-programs.sh,
//! scripts/pyverbs.sh): without the library they stop at once with exit 2 and the build
//! command; the pyverbs result parser reads unittest's verbose output (skips with reasons,
//! FAIL/ERROR with the traceback's last line, subtests, output in between) and the comparison
//! fails only on unexpected failures; the committed expectations file is well-formed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn test_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("softverbs-script-tests")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn python() -> Option<&'static str> {
    ["python3", "/usr/bin/python3"].into_iter().find(|p| {
        Command::new(p)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

#[test]
fn without_the_library_the_scripts_exit_2_naming_the_build_command() {
    let dir = test_dir("no-lib");
    for script in ["scripts/ibverbs-programs.sh", "scripts/pyverbs.sh"] {
        let out = Command::new("bash")
            .arg(repo().join(script))
            .args(["--out", dir.join("out").to_str().unwrap()])
            .env("SOFTVERBS_LIB_DIR", &dir)
            .env("SOFTVERBS_BIN", "/nonexistent/softverbs")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{script}\n{}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("scripts/build-libibverbs.sh --release")
                && stderr.contains(dir.to_str().unwrap()),
            "{script}\n{}",
            text(&out)
        );
    }
}

/// unittest's verbose output (Python 3.11) for every kind of outcome.
const LOG: &str = "\
test_err (tests.test_x.A.test_err) ... ERROR
test_fail (tests.test_x.A.test_fail) ... FAIL
test_ok (tests.test_x.A.test_ok)
Doc line one. ... noise to stderr
ok
test_skip (tests.test_x.A.test_skip) ... skipped \"no 'mlx5' here\"
test_sub (tests.test_x.A.test_sub) ... 
  test_sub (tests.test_x.A.test_sub) (i=1) ... FAIL
test_xf (tests.test_x.A.test_xf) ... expected failure
test_crash (tests.test_x.A.test_crash) ... 
======================================================================
ERROR: test_err (tests.test_x.A.test_err)
----------------------------------------------------------------------
Traceback (most recent call last):
  File \"/tmp/ut/tests/test_x.py\", line 10, in test_err
    raise RuntimeError(\"boom\")
RuntimeError: boom

======================================================================
FAIL: test_fail (tests.test_x.A.test_fail)
----------------------------------------------------------------------
Traceback (most recent call last):
  File \"/tmp/ut/tests/test_x.py\", line 8, in test_fail
    self.assertEqual(1, 2, \"one is not two\")
AssertionError: 1 != 2 : one is not two

----------------------------------------------------------------------
Ran 7 tests in 0.001s

FAILED (failures=2, errors=1, skipped=1, expected failures=1)
";

fn results_py(py: &str, args: &[&str]) -> Output {
    Command::new(py)
        .arg(repo().join("scripts/pyverbs-results.py"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_pyverbs_parser_reads_every_outcome_and_the_comparison_fails_only_when_it_should() {
    let Some(py) = python() else {
        eprintln!("SKIPPED: no python3");
        return;
    };
    let dir = test_dir("parse");
    let log = dir.join("run.log");
    std::fs::write(&log, LOG).unwrap();
    let out = results_py(py, &["parse", log.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let got = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        got,
        "tests.test_x.A.test_err\tfail\tERROR: RuntimeError: boom\n\
         tests.test_x.A.test_fail\tfail\tFAIL: AssertionError: 1 != 2 : one is not two\n\
         tests.test_x.A.test_ok\tpass\t\n\
         tests.test_x.A.test_skip\tskip\tno 'mlx5' here\n\
         tests.test_x.A.test_sub\tfail\tFAIL\n\
         tests.test_x.A.test_xf\tpass\t\n\
         tests.test_x.A.test_crash\tfail\tno result printed\n"
    );
    let results = dir.join("results.tsv");
    std::fs::write(&results, &got).unwrap();
    let compare = |expected: &str| {
        let path = dir.join("expected.tsv");
        std::fs::write(&path, expected).unwrap();
        results_py(
            py,
            &["compare", results.to_str().unwrap(), path.to_str().unwrap()],
        )
    };
    // Everything as expected (the failures listed with reasons): exit 0.
    let all = "# comment\n\
        tests.test_x.A.test_err\tfail\traises\n\
        tests.test_x.A.test_fail\tfail\tasserts\n\
        tests.test_x.A.test_ok\tpass\n\
        tests.test_x.A.test_skip\tskip\tno mlx5\n\
        tests.test_x.A.test_sub\tfail\tsubtest 1\n\
        tests.test_x.A.test_xf\tpass\t\n\
        tests.test_x.A.test_crash\tfail\tcrashes\n";
    let out = compare(all);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("7 tests: 2 passed, 4 failed, 1 skipped"),
        "{}",
        text(&out)
    );
    // A test expected to pass that failed: exit 1, named.
    let out = compare(&all.replace("test_err\tfail\traises", "test_err\tpass\t"));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("UNEXPECTED: tests.test_x.A.test_err"),
        "{}",
        text(&out)
    );
    // A test expected to skip that passes: reported, exit 0.
    let out = compare(&all.replace("test_ok\tpass", "test_ok\tskip\tneeds mlx5"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("newly passing"),
        "{}",
        text(&out)
    );
    // An expected pass that did not report at all (the run crashed before it): exit 1.
    let out = compare(&format!("{all}tests.test_x.A.test_later\tpass\n"));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // A non-pass expectation without a reason is refused.
    let out = compare(&all.replace("\traises", ""));
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn the_committed_pyverbs_expectations_are_well_formed() {
    let Some(py) = python() else {
        eprintln!("SKIPPED: no python3");
        return;
    };
    let expected = repo().join("tests/pyverbs-expected.tsv");
    let path = expected.to_str().unwrap();
    // Compared with itself: every line parses, every non-pass has a reason.
    let out = results_py(py, &["compare", path, path]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
