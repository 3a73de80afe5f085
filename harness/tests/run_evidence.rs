//! `softverbs run` evidence hygiene: the default run directory is private (mode 0700, an
//! unguessable name, files 0600), removed after a pass unless `--keep`, kept after a failure;
//! a `--run-dir` that is a symbolic link is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use common::{softverbs, test_dir};

const LIMIT: Duration = Duration::from_secs(60);

/// The run directory a run announced on stderr.
fn announced_dir(stderr: &str) -> PathBuf {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("softverbs run: ") && l.contains(", run dir "))
        .unwrap_or_else(|| panic!("no run dir line\n{stderr}"));
    PathBuf::from(line.rsplit(", run dir ").next().unwrap())
}

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

const SMALL: [&str; 8] = [
    "--nodes",
    "2",
    "--workload",
    "stream-write",
    "--ops",
    "20",
    "--seed",
    "3",
];

#[test]
fn a_passing_run_removes_its_private_directory() {
    let (code, stdout, stderr) = softverbs(&[&["run"][..], &SMALL].concat(), LIMIT);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let dir = announced_dir(&stderr);
    let name = dir.file_name().unwrap().to_str().unwrap();
    let random = name.strip_prefix("softverbs-run-3-").unwrap();
    assert_eq!(random.len(), 32, "{name}");
    assert!(random.chars().all(|c| c.is_ascii_hexdigit()), "{name}");
    assert!(!dir.exists(), "{} was left behind", dir.display());
    assert!(
        stdout.contains("run dir: removed after the pass"),
        "{stdout}"
    );
}

#[test]
fn keep_keeps_it_private_and_a_failing_run_keeps_it_too() {
    for extra in [&["--keep"][..], &["--self-test", "ack-without-delivery"]] {
        let (code, stdout, stderr) = softverbs(&[&["run"][..], &SMALL, extra].concat(), LIMIT);
        assert_eq!(
            code,
            if extra[0] == "--keep" { 0 } else { 1 },
            "{stdout}\n{stderr}"
        );
        let dir = announced_dir(&stderr);
        assert!(dir.is_dir(), "{extra:?}: {} was removed", dir.display());
        assert_eq!(mode(&dir), 0o700, "{extra:?}");
        let mut files = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            assert_eq!(mode(&path), 0o600, "{}", path.display());
            files += 1;
        }
        // Per node: MR file, log, stderr, trace; a failing run adds its violation ladder.
        assert_eq!(files, if extra[0] == "--keep" { 8 } else { 9 }, "{extra:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_run_dir_that_is_a_symlink_is_refused() {
    let dir = test_dir("symlink-run-dir");
    let target = dir.join("elsewhere");
    std::fs::create_dir_all(&target).unwrap();
    let link = dir.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let link_arg = link.display().to_string();
    let (code, stdout, stderr) = softverbs(
        &[&["run"][..], &SMALL, &["--run-dir", &link_arg]].concat(),
        LIMIT,
    );
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(stderr.contains("is a symbolic link"), "{stderr}");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
}
