//! The built `librdmacm.so.1` defines every symbol and version node of the committed export
//! list (Debian 12's librdmacm1, rdma-core 44), its SONAME is `librdmacm.so.1` and it needs
//! `libibverbs.so.1`; the committed list matches the installed rdma-core 44 library when
//! there is one.
//!
//! Needs `scripts/build-librdmacm.sh` to have run (the test does not build it) and `nm` /
//! `readelf`; skipped loudly otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn expected() -> BTreeSet<String> {
    std::fs::read_to_string(root().join("emu/rdmacm/librdmacm-44-exports.txt"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// `name@@VERSION` of every defined versioned symbol of `lib`, or `None` without nm.
fn nm(lib: &Path) -> Option<BTreeSet<String>> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .ok()?;
    assert!(out.status.success());
    Some(
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            .filter(|s| s.contains("@@") && !s.starts_with("RDMACM"))
            .map(str::to_string)
            .collect(),
    )
}

fn built() -> Option<PathBuf> {
    let dir = std::env::var_os("LIBIBVERBS_DIR")
        .map_or_else(|| root().join("target/libibverbs"), PathBuf::from);
    let lib = dir.join("librdmacm.so.1");
    if lib.exists() {
        Some(lib)
    } else {
        eprintln!(
            "SKIPPED: {} is absent (run scripts/build-librdmacm.sh)",
            lib.display()
        );
        None
    }
}

#[test]
fn built_library_defines_every_export_in_its_version() {
    let Some(lib) = built() else { return };
    let Some(syms) = nm(&lib) else {
        eprintln!("SKIPPED: nm is not installed");
        return;
    };
    assert_eq!(syms, expected());
}

#[test]
fn built_library_is_librdmacm_so_1_over_libibverbs_so_1() {
    let Some(lib) = built() else { return };
    let Ok(out) = Command::new("readelf").arg("-d").arg(&lib).output() else {
        eprintln!("SKIPPED: readelf is not installed");
        return;
    };
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Library soname: [librdmacm.so.1]"), "{text}");
    assert!(text.contains("Shared library: [libibverbs.so.1]"), "{text}");
}

#[test]
fn committed_list_matches_installed_rdma_core_44() {
    let real = Path::new("/usr/lib/x86_64-linux-gnu/librdmacm.so.1");
    let target = std::fs::read_link(real).unwrap_or_default();
    if !target.to_string_lossy().contains(".44.") {
        eprintln!(
            "SKIPPED: no rdma-core 44 librdmacm.so.1 installed ({})",
            target.display()
        );
        return;
    }
    let Some(syms) = nm(real) else {
        eprintln!("SKIPPED: nm is not installed");
        return;
    };
    assert_eq!(syms, expected());
}
