#!/usr/bin/env bash
# Builds softverbs' librdmacm.so.1 drop-in next to the libibverbs.so.1 drop-in: the
# softverbs-rdmacm staticlib relinked with a version script generated from
# emu/rdmacm/librdmacm-44-exports.txt (every symbol and version node RDMACM_1.0 … 1.3 of
# Debian 12's librdmacm1) and linked against the drop-in libibverbs.so.1 (the ibv_* calls go
# through its C ABI, as rdma-core's librdmacm's do). Builds the libibverbs drop-in first.
#
#   scripts/build-librdmacm.sh [--release]
#
# Output: $LIBIBVERBS_DIR (default target/libibverbs)/librdmacm.so.1, the librdmacm.so
# symlink and the generated librdmacm.map. Run a program with LD_LIBRARY_PATH=target/libibverbs
# (or `softverbs exec`). Honours CARGO_TARGET_DIR; needs cc (GNU ld or compatible).
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
EXPORTS=$ROOT/emu/rdmacm/librdmacm-44-exports.txt

"$ROOT/scripts/build-libibverbs.sh" "$@" >/dev/null
cargo build --manifest-path "$ROOT/Cargo.toml" -p softverbs-rdmacm "${CARGO_FLAGS[@]}"
ARCHIVE=$TARGET_DIR/$PROFILE/libsoftverbs_rdmacm.a
[ -f "$ARCHIVE" ] || { echo "missing $ARCHIVE" >&2; exit 1; }

# Version script: one node per version (every librdmacm symbol has a single, default
# version), chained in release order; everything else stays local.
awk '
  /^#/ || NF == 0 { next }
  {
    split($0, p, "@@"); node = p[2]
    body[node] = body[node] "    " p[1] ";\n"
    if (!(node in seen)) { seen[node] = 1; order[n++] = node }
  }
  END {
    for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (order[i] > order[j]) {
      t = order[i]; order[i] = order[j]; order[j] = t
    }
    prev = ""
    for (i = 0; i < n; i++) {
      printf "%s {\n  global:\n%s", order[i], body[order[i]]
      if (i == 0) printf "  local: *;\n"
      printf "}%s;\n", (prev == "" ? "" : " " prev)
      prev = order[i]
    }
  }' "$EXPORTS" >"$OUT/librdmacm.map"

cc -shared -o "$OUT/librdmacm.so.1" \
  -Wl,--whole-archive "$ARCHIVE" -Wl,--no-whole-archive \
  -Wl,--version-script="$OUT/librdmacm.map" -Wl,-soname,librdmacm.so.1 \
  -L"$OUT" -l:libibverbs.so.1 -Wl,-rpath,'$ORIGIN' \
  -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
ln -sf librdmacm.so.1 "$OUT/librdmacm.so"
echo "$OUT/librdmacm.so.1"
