#!/usr/bin/env bash
# Builds softverbs' libibverbs.so.1 drop-in: the softverbs-ibverbs staticlib relinked with a
# version script (a cdylib cannot carry symbol versions; libibverbs-abi.md §4.3), so that every
# symbol and version node of Debian 12's libibverbs1 (emu/ibverbs/libibverbs-44-exports.txt) is
# defined and BIND_NOW programs and providers load.
#
#   scripts/build-libibverbs.sh [--release]
#
# Output: $LIBIBVERBS_DIR (default target/libibverbs)/libibverbs.so.1, the libibverbs.so symlink
# and the generated libibverbs.map. Run a program with LD_LIBRARY_PATH=target/libibverbs.
# Honours CARGO_TARGET_DIR for the cargo build; needs cc (GNU ld or compatible).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROFILE=debug
CARGO_FLAGS=()
case "${1:-}" in
  --release) PROFILE=release CARGO_FLAGS=(--release) ;;
  "") ;;
  *) echo "usage: $0 [--release]" >&2; exit 2 ;;
esac
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=${LIBIBVERBS_DIR:-$ROOT/target/libibverbs}
EXPORTS=$ROOT/emu/ibverbs/libibverbs-44-exports.txt
# softverbs' own symbols (softverbs_open_gsi for the rdma_cm drop-in), in their own node.
PRIVATE=$ROOT/emu/ibverbs/softverbs-private-exports.txt

cargo build --manifest-path "$ROOT/Cargo.toml" -p softverbs-ibverbs "${CARGO_FLAGS[@]}"
ARCHIVE=$TARGET_DIR/$PROFILE/libsoftverbs_ibverbs.a
[ -f "$ARCHIVE" ] || { echo "missing $ARCHIVE" >&2; exit 1; }
mkdir -p "$OUT"

# Version script: each symbol in the node of its default version (name@@NODE); a symbol that
# only has an old version (name@NODE, e.g. ibv_register_driver) gets that node. Nodes chain in
# release order, then the other nodes (IBVERBS_PRIVATE_34, SOFTVERBS_PRIVATE_1) in file order;
# everything else (Rust's own symbols) stays local.
awk '
  /^#/ || NF == 0 { next }
  {
    split($0, p, "@")
    name = p[1]; node = ($0 ~ /@@/) ? p[3] : p[2]
    if ($0 ~ /@@/) { def[name] = node } else if (!(name in old)) { old[name] = node }
    if (!(node in seen)) { seen[node] = 1; order[n++] = node }
  }
  END {
    for (s in old) if (!(s in def)) def[s] = old[s]
    for (i = 0; i < n; i++) {
      node = order[i]; body = ""
      for (s in def) if (def[s] == node) body = body "    " s ";\n"
      nodes[node] = body
    }
    # release order: IBVERBS_1.0, 1.1, 1.5 ... 1.14, then the private node
    m = 0
    for (i = 0; i < n; i++) if (order[i] ~ /^IBVERBS_1\./) pub[m++] = order[i]
    for (i = 0; i < m; i++) for (j = i + 1; j < m; j++) {
      split(pub[i], a, "."); split(pub[j], b, ".")
      if (a[2] + 0 > b[2] + 0) { t = pub[i]; pub[i] = pub[j]; pub[j] = t }
    }
    for (i = 0; i < n; i++) if (order[i] !~ /^IBVERBS_1\./) pub[m++] = order[i]
    prev = ""
    for (i = 0; i < m; i++) {
      printf "%s {\n  global:\n%s", pub[i], nodes[pub[i]]
      if (i == 0) printf "  local: *;\n"
      printf "}%s;\n", (prev == "" ? "" : " " prev)
      prev = pub[i]
    }
  }' "$EXPORTS" "$PRIVATE" >"$OUT/libibverbs.map"

cc -shared -o "$OUT/libibverbs.so.1" \
  -Wl,--whole-archive "$ARCHIVE" -Wl,--no-whole-archive \
  -Wl,--version-script="$OUT/libibverbs.map" -Wl,-soname,libibverbs.so.1 \
  -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
ln -sf libibverbs.so.1 "$OUT/libibverbs.so"
echo "$OUT/libibverbs.so.1"
