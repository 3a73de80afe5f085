//! `softverbs exec` and `softverbs env`: the drop-in's environment reaches the program (library
//! directory first on LD_LIBRARY_PATH, absolute SOFTVERBS_FAULTS / SOFTVERBS_PCAP), the
//! program's exit status comes back, and bad input (flags, plan, capture path, a missing
//! library) exits 2 before anything runs. With the library built, `ibv_devices` lists
//! `softverbs0` through it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");

/// A fresh directory for one test.
fn test_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("softverbs-exec-tests")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A directory holding a (fake, empty) libibverbs.so.1: enough for `exec`, which never loads it.
fn fake_lib(dir: &Path) -> PathBuf {
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("libibverbs.so.1"), b"").unwrap();
    lib
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn dump(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `softverbs ARGS` in `cwd` (bounded by `timeout`) with `env` set and the drop-in's
/// variables otherwise removed.
fn softverbs(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new("timeout");
    cmd.arg("60")
        .arg(BIN)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .env_remove("SOFTVERBS_LIB_DIR")
        .env_remove("SOFTVERBS_FAULTS")
        .env_remove("SOFTVERBS_PCAP")
        .env_remove("LD_LIBRARY_PATH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

const PLAN: &str = "seed = 7\n[[rule]]\naction = \"drop\"\nprobability = 0.01\n";

#[test]
fn exec_passes_the_environment_and_the_exit_status() {
    let dir = test_dir("exec-env");
    let lib = fake_lib(&dir);
    std::fs::write(dir.join("plan.toml"), PLAN).unwrap();
    let lib_arg = lib.display().to_string();
    let script =
        r#"printf '%s\n' "$LD_LIBRARY_PATH" "$SOFTVERBS_FAULTS" "$SOFTVERBS_PCAP" "$1"; exit 7"#;
    let args = [
        "exec",
        "--lib",
        &lib_arg,
        "--faults",
        "plan.toml",
        "--pcap",
        "out.pcap",
        "--",
        "sh",
        "-c",
        script,
        "sh",
        "--an-argument",
    ];
    let out = softverbs(&dir, &args, &[("LD_LIBRARY_PATH", "/old/a:/old/b")]);
    assert_eq!(out.code, 7, "the program's status\n{}", out.dump());
    let lib = lib.canonicalize().unwrap();
    let dir = std::path::absolute(&dir).unwrap();
    let want = format!(
        "{}:/old/a:/old/b\n{}\n{}\n--an-argument\n",
        lib.display(),
        dir.join("plan.toml").display(),
        dir.join("out.pcap").display()
    );
    assert_eq!(out.stdout, want, "{}", out.dump());
}

#[test]
fn without_faults_or_capture_only_the_loader_path_is_set() {
    let dir = test_dir("exec-plain");
    let lib = fake_lib(&dir);
    let script = r#"echo "${LD_LIBRARY_PATH}|${SOFTVERBS_FAULTS-unset}|${SOFTVERBS_PCAP-unset}""#;
    let lib_env = lib.display().to_string();
    // The library directory from SOFTVERBS_LIB_DIR; the program without `--`.
    let out = softverbs(
        &dir,
        &["exec", "sh", "-c", script],
        &[("SOFTVERBS_LIB_DIR", &lib_env)],
    );
    assert_eq!(out.code, 0, "{}", out.dump());
    let lib = lib.canonicalize().unwrap();
    assert_eq!(out.stdout, format!("{}|unset|unset\n", lib.display()));
}

#[test]
fn the_lib_flag_wins_over_the_variable() {
    let dir = test_dir("exec-precedence");
    let lib = fake_lib(&dir);
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (lib_arg, empty_env) = (lib.display().to_string(), empty.display().to_string());
    let out = softverbs(
        &dir,
        &["exec", "--lib", &lib_arg, "--", "true"],
        &[("SOFTVERBS_LIB_DIR", &empty_env)],
    );
    assert_eq!(out.code, 0, "{}", out.dump());
}

#[test]
fn env_prints_export_lines_a_shell_can_eval() {
    let dir = test_dir("env");
    let lib = fake_lib(&dir);
    std::fs::write(dir.join("plan.toml"), PLAN).unwrap();
    let lib_arg = lib.display().to_string();
    let args = ["env", "--lib", &lib_arg, "--faults", "plan.toml"];
    let out = softverbs(&dir, &args, &[]);
    assert_eq!(out.code, 0, "{}", out.dump());
    assert_eq!(out.stdout.lines().count(), 2, "{}", out.dump());
    assert!(out.stdout.lines().all(|l| l.starts_with("export ")));
    // Evaluated in a shell whose LD_LIBRARY_PATH is set, and in one where it is not.
    let lib = lib.canonicalize().unwrap();
    for (old, want_path) in [
        (Some("/old"), format!("{}:/old", lib.display())),
        (None, lib.display().to_string()),
    ] {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(r#"eval "$(cat)"; echo "$LD_LIBRARY_PATH"; echo "$SOFTVERBS_FAULTS""#)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .env_remove("LD_LIBRARY_PATH");
        if let Some(old) = old {
            sh.env("LD_LIBRARY_PATH", old);
        }
        let mut child = sh.spawn().unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(out.stdout.as_bytes())
            .unwrap();
        let got = child.wait_with_output().unwrap();
        let want = format!(
            "{want_path}\n{}\n",
            std::path::absolute(dir.join("plan.toml"))
                .unwrap()
                .display()
        );
        assert_eq!(String::from_utf8_lossy(&got.stdout), want);
    }
}

#[test]
fn a_missing_library_exits_2_naming_the_build_command() {
    let dir = test_dir("no-lib");
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let empty_s = empty.display().to_string();
    for (args, env) in [
        (vec!["exec", "--lib", &empty_s, "--", "true"], vec![]),
        (vec!["env", "--lib", &empty_s], vec![]),
        (
            vec!["exec", "--", "true"],
            vec![("SOFTVERBS_LIB_DIR", &*empty_s)],
        ),
        (vec!["env"], vec![("SOFTVERBS_LIB_DIR", &*empty_s)]),
    ] {
        let out = softverbs(&dir, &args, &env);
        assert_eq!(out.code, 2, "{args:?}\n{}", out.dump());
        assert!(
            out.stderr.contains("scripts/build-libibverbs.sh --release")
                && out.stderr.contains(&empty_s),
            "{args:?}\n{}",
            out.dump()
        );
        assert!(out.stdout.is_empty(), "{}", out.dump());
    }
}

#[test]
fn the_default_library_directory_is_next_to_the_binary() {
    let dir = test_dir("default-lib");
    let target = Path::new(BIN).parent().unwrap().parent().unwrap();
    let next_to_binary = target.join("libibverbs");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/libibverbs");
    let out = softverbs(&dir, &["env"], &[]);
    let found = [&next_to_binary, &workspace]
        .into_iter()
        .find(|d| d.join("libibverbs.so.1").is_file());
    if let Some(want) = found {
        assert_eq!(out.code, 0, "{}", out.dump());
        let want = want.canonicalize().unwrap();
        assert!(
            out.stdout
                .contains(&format!("LD_LIBRARY_PATH='{}'", want.display())),
            "{}",
            out.dump()
        );
    } else {
        assert_eq!(out.code, 2, "{}", out.dump());
        assert!(
            out.stderr.contains(&next_to_binary.display().to_string()),
            "{}",
            out.dump()
        );
    }
}

#[test]
fn bad_flags_exit_2() {
    let dir = test_dir("bad-flags");
    let lib = fake_lib(&dir);
    std::fs::write(
        dir.join("bad.toml"),
        "seed = 1\n[[rule]]\naction = \"drop\"\nprobability = 1.5\n",
    )
    .unwrap();
    let l = lib.display().to_string();
    let cases: [(&[&str], &str); 7] = [
        (&["exec", "--lib", &l], "PROGRAM"),
        (&["exec", "--bogus", "--", "true"], "--bogus"),
        (&["env", "--lib", &l, "extra"], "extra"),
        (
            &["exec", "--lib", &l, "--faults", "nope.toml", "--", "true"],
            "nope.toml",
        ),
        (
            &["exec", "--lib", &l, "--faults", "bad.toml", "--", "true"],
            "probability",
        ),
        (&["env", "--lib", &l, "--faults", "bad.toml"], "line 4"),
        (
            &[
                "exec",
                "--lib",
                &l,
                "--pcap",
                "no/such/dir/x.pcap",
                "--",
                "true",
            ],
            "no/such/dir/x.pcap",
        ),
    ];
    for (args, want) in cases {
        let out = softverbs(&dir, args, &[]);
        assert_eq!(out.code, 2, "{args:?}\n{}", out.dump());
        assert!(
            out.stderr.contains(want),
            "{args:?}: want {want:?}\n{}",
            out.dump()
        );
        assert!(out.stdout.is_empty(), "{}", out.dump());
    }
}

#[test]
fn a_program_that_is_not_there_exits_127() {
    let dir = test_dir("not-found");
    let l = fake_lib(&dir).display().to_string();
    let out = softverbs(
        &dir,
        &["exec", "--lib", &l, "--", "softverbs-no-such-program"],
        &[],
    );
    assert_eq!(out.code, 127, "{}", out.dump());
    assert!(
        out.stderr.contains("softverbs-no-such-program"),
        "{}",
        out.dump()
    );
}

/// With the drop-in built (scripts/build-libibverbs.sh) and ibverbs-utils installed, an
/// unmodified `ibv_devices` lists softverbs0 through it. Skipped, loudly, otherwise.
#[test]
fn ibv_devices_lists_softverbs0_through_the_drop_in() {
    let target = Path::new(BIN).parent().unwrap().parent().unwrap();
    let lib = target.join("libibverbs");
    if !lib.join("libibverbs.so.1").is_file() {
        eprintln!(
            "SKIPPED: no {}/libibverbs.so.1 (scripts/build-libibverbs.sh builds it)",
            lib.display()
        );
        return;
    }
    if Command::new("ibv_devices").arg("--help").output().is_err() {
        eprintln!("SKIPPED: ibv_devices is not installed (Debian package ibverbs-utils)");
        return;
    }
    let dir = test_dir("ibv-devices");
    let out = softverbs(&dir, &["exec", "--", "ibv_devices"], &[]);
    assert_eq!(out.code, 0, "{}", out.dump());
    assert!(out.stdout.contains("softverbs0"), "{}", out.dump());
}
