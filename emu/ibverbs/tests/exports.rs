//! The built `libibverbs.so.1` defines every symbol and version node of the committed export
//! list (Debian 12's libibverbs1, rdma-core 44) plus softverbs' private exports
//! (`softverbs-private-exports.txt`, node `SOFTVERBS_PRIVATE_1`) and nothing else, and the
//! committed list matches the installed rdma-core 44 library when there is one.
//!
//! Needs `scripts/build-libibverbs.sh` to have run (the test does not build it: a nested cargo
//! build would wait on this one's lock) and `nm`; skipped loudly otherwise. A symbol that
//! rdma-core exports in two versions (`name@IBVERBS_1.0` and `name@@IBVERBS_1.1`) is provided
//! in its default version only: Rust cannot emit `.symver` aliases, and no program linked
//! after 2006 binds the old one (libibverbs-abi.md §4.3).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Versioned symbols `(name, version)` and version nodes.
type Exports = (BTreeSet<(String, String)>, BTreeSet<String>);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `(name, version)` pairs of the committed list, the default version of each name (or its
/// only one), and the version nodes.
fn expected() -> Exports {
    list("emu/ibverbs/libibverbs-44-exports.txt")
}

/// Like [`expected`] for the export list at `path` (relative to the repository root).
fn list(path: &str) -> Exports {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    let mut default = std::collections::BTreeMap::new();
    let mut nodes = BTreeSet::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (name, rest) = line.split_once('@').unwrap();
        let (is_default, node) = match rest.strip_prefix('@') {
            Some(n) => (true, n),
            None => (false, rest),
        };
        nodes.insert(node.to_string());
        if is_default || !default.contains_key(name) {
            default.insert(name.to_string(), node.to_string());
        }
    }
    (default.into_iter().collect(), nodes)
}

/// `nm -D --defined-only` of `lib`: versioned symbols and version-definition nodes, or `None`
/// when nm cannot run.
fn nm(lib: &Path) -> Option<Exports> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .ok()?;
    assert!(out.status.success(), "nm {} failed", lib.display());
    let mut syms = BTreeSet::new();
    let mut nodes = BTreeSet::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let Some(sym) = line.split_whitespace().nth(2) else {
            continue;
        };
        match sym.split_once('@') {
            Some(("", ver)) => {
                nodes.insert(ver.trim_start_matches('@').to_string());
            }
            Some((name, ver)) if name == ver.trim_start_matches('@') => {
                nodes.insert(name.to_string());
            }
            Some((name, ver)) => {
                syms.insert((name.to_string(), ver.trim_start_matches('@').to_string()));
            }
            None => {
                nodes.insert(sym.to_string());
            }
        }
    }
    Some((syms, nodes))
}

#[test]
fn built_library_defines_every_export_and_version_node() {
    let dir = std::env::var_os("LIBIBVERBS_DIR")
        .map_or_else(|| root().join("target/libibverbs"), PathBuf::from);
    let lib = dir.join("libibverbs.so.1");
    if !lib.exists() {
        eprintln!(
            "SKIPPED: {} is absent (run scripts/build-libibverbs.sh)",
            lib.display()
        );
        return;
    }
    let Some((syms, nodes)) = nm(&lib) else {
        eprintln!("SKIPPED: nm is not installed");
        return;
    };
    let (mut want, mut want_nodes) = expected();
    let (private, private_nodes) = list("emu/ibverbs/softverbs-private-exports.txt");
    assert!(
        private_nodes
            .iter()
            .all(|n| n.starts_with("SOFTVERBS_PRIVATE_")),
        "softverbs' own exports stay out of rdma-core's nodes: {private_nodes:?}"
    );
    want.extend(private);
    want_nodes.extend(private_nodes);
    let missing: Vec<_> = want.difference(&syms).collect();
    assert!(missing.is_empty(), "missing exports: {missing:?}");
    let extra: Vec<_> = syms.difference(&want).collect();
    assert!(extra.is_empty(), "exports not in the list: {extra:?}");
    let missing_nodes: Vec<_> = want_nodes.difference(&nodes).collect();
    assert!(
        missing_nodes.is_empty(),
        "missing version nodes: {missing_nodes:?}"
    );
}

#[test]
fn committed_list_matches_installed_rdma_core_44() {
    let real = Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    let target = std::fs::read_link(real).unwrap_or_default();
    if !target.to_string_lossy().contains(".44.") {
        eprintln!(
            "SKIPPED: no rdma-core 44 libibverbs.so.1 installed ({})",
            target.display()
        );
        return;
    }
    let Some((syms, _)) = nm(real) else {
        eprintln!("SKIPPED: nm is not installed");
        return;
    };
    let (want, _) = expected();
    // The real library also has the old versions; every default one must be there.
    let missing: Vec<_> = want.difference(&syms).collect();
    assert!(
        missing.is_empty(),
        "list entries the real library lacks: {missing:?}"
    );
    let names: BTreeSet<_> = syms.iter().map(|(n, _)| n.clone()).collect();
    let listed: BTreeSet<_> = want.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names, listed, "symbol names differ from the real library");
}
