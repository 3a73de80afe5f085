#!/usr/bin/env bash
# Profile-guided release build of the `softverbs` CLI (issue 18, round 11).
#
#   scripts/pgo-build.sh              # prints the path of the optimized binary
#   SOFTVERBS_BIN=$(scripts/pgo-build.sh | tail -1) scripts/perf-table.sh 10
#   scripts/pgo-build.sh --drop-ins   # also libibverbs.so.1 and librdmacm.so.1, built with the
#                                     # same profile into target/pgo/libibverbs
#
# Three steps, each in its own target directory under target/pgo (a plain `cargo build
# --release` is left as it is), all with `lto = "fat"` and `codegen-units = 1`:
#   1. build the CLI instrumented (`-Cprofile-generate`);
#   2. train it: the perf runs below, without `--baseline`, so that the raw-UDP baseline's code
#      gets no profile and is built exactly as in a plain release build;
#   3. merge the profiles with the `llvm-profdata` of rustc's own LLVM major version and
#      rebuild with `-Cprofile-use`; with `--drop-ins`, build the drop-in libraries with it too
#      (their engine, device and UDP code is the CLI's, so the profile covers it; the C ABI
#      layer gets none and is optimized as usual).
# Only the packages' code is built for the host triple given with `--target`, so build scripts
# and proc macros are neither instrumented nor optimized with the profile.
#
# Needs `llvm-profdata-N`, N = the LLVM major version `rustc -vV` reports (Debian: `apt-get
# install llvm-N`), or LLVM_PROFDATA set to a matching one. Exit codes: 0 built, 1 a step
# failed, 2 bad usage or no matching llvm-profdata.
set -euo pipefail
export LC_ALL=C
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/target/pgo
DROP_INS=0
case "${1:-}" in
  --drop-ins) DROP_INS=1 ;;
  "") ;;
  *) echo "usage: $0 [--drop-ins]" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "usage: $0 [--drop-ins]" >&2; exit 2; }
LTO=(CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1)

llvm_major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
host=$(rustc -vV | sed -n 's/^host: //p')
[ -n "$llvm_major" ] && [ -n "$host" ] || { echo "cannot read rustc -vV" >&2; exit 1; }
PROFDATA=${LLVM_PROFDATA:-llvm-profdata-$llvm_major}
if ! command -v "$PROFDATA" >/dev/null 2>&1; then
  echo "no $PROFDATA: rustc uses LLVM $llvm_major, whose profile format only a matching" >&2
  echo "llvm-profdata reads (Debian: apt-get install llvm-$llvm_major)" >&2
  exit 2
fi
# (Older llvm-profdata know `--version` only after a subcommand.)
have=$({ "$PROFDATA" --version 2>/dev/null || "$PROFDATA" merge --version 2>/dev/null || true; } |
  sed -n 's/.*LLVM version \([0-9]*\).*/\1/p' | head -1)
if [ "$have" != "$llvm_major" ]; then
  echo "$PROFDATA is LLVM ${have:-?}, rustc's LLVM is $llvm_major: the profiles would not" >&2
  echo "match (Debian: apt-get install llvm-$llvm_major)" >&2
  exit 2
fi

RAW=$OUT/profiles
rm -rf "$RAW"
mkdir -p "$RAW"
build() { # target dir, RUSTFLAGS
  env "${LTO[@]}" RUSTFLAGS="$2" cargo build --manifest-path "$ROOT/Cargo.toml" --release \
    --target "$host" --target-dir "$1" -p softverbs-cli --bin softverbs >&2
}

echo "pgo: 1/3 instrumented build" >&2
build "$OUT/gen" "-Cprofile-generate=$RAW"
GEN=$OUT/gen/$host/release/softverbs

echo "pgo: 2/3 training runs" >&2
train() {
  "$GEN" perf "$@" >/dev/null 2>&1 || { echo "pgo: training run failed: perf $*" >&2; exit 1; }
}
train write_bw --backend inproc -s 8 -n 300000
train write_bw -s 65536 -n 3000
train write_bw -s 8 -n 100000
train write_lat -s 8 -n 20000
train write_lat -s 8 -n 20000 --busy-poll
train send_bw -s 8 -n 200000 -e
train send_lat -s 8 -n 10000
train read_lat -s 8 -n 10000
train read_bw -s 65536 -n 2000
train atomic_lat -n 10000

echo "pgo: 3/3 merge and optimized build" >&2
"$PROFDATA" merge -o "$OUT/merged.profdata" "$RAW"
# Cargo rebuilds on a change of RUSTFLAGS, not of the file a flag names: the profile's name
# carries its digest, so a new profile rebuilds everything and an unchanged one nothing.
PROFILE=$OUT/softverbs-$(sha256sum "$OUT/merged.profdata" | cut -c1-16).profdata
mv "$OUT/merged.profdata" "$PROFILE"
find "$OUT" -maxdepth 1 -name 'softverbs-*.profdata' ! -path "$PROFILE" -delete
build "$OUT/use" "-Cprofile-use=$PROFILE"
if [ "$DROP_INS" = 1 ]; then
  # The library scripts build without `--target`, so build scripts see the flag too: they are
  # not in the profile and are optimized as usual.
  env "${LTO[@]}" CARGO_TARGET_DIR="$OUT/drop-ins" LIBIBVERBS_DIR="$OUT/libibverbs" \
    RUSTFLAGS="-Cprofile-use=$PROFILE" \
    "$ROOT/scripts/build-librdmacm.sh" --release >&2
  echo "pgo: drop-in libraries in $OUT/libibverbs" >&2
fi
echo "$OUT/use/$host/release/softverbs"
