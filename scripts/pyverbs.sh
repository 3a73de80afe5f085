#!/usr/bin/env bash
# rdma-core's own pyverbs test suite (Debian's python3-pyverbs ships it under
# /usr/share/doc/rdma-core/tests) on softverbs, unmodified, through the drop-in libibverbs.so.1:
#
#   scripts/pyverbs.sh [--out DIR] [--update]
#
# Copies the suite into DIR/tests (gunzipping the compressed modules), runs
#   softverbs exec -- python3 tests/run_tests.py --dev softverbs0 --gid 0 -v
# parses unittest's verbose output into DIR/results.tsv (id, pass|fail|skip, detail) with
# scripts/pyverbs-results.py, and compares it with the committed expectations,
# tests/pyverbs-expected.tsv (id, expected result, reason for every non-pass). An unexpected
# failure (a test expected to pass that failed, skipped or never reported) fails the script; a
# newly passing test is reported. --update rewrites the expectations from this run instead
# (keeping the reasons of unchanged lines; review new reasons by hand).
#
# Environment: SOFTVERBS_LIB_DIR (default $LIBIBVERBS_DIR, else target/libibverbs), SOFTVERBS_BIN
# (default: target/{release,debug}/softverbs, else cargo build --release), PYTHON (default
# /usr/bin/python3: Debian's interpreter, the one python3-pyverbs is built for),
# PYVERBS_TIMEOUT (seconds, default 900).
# Exit status: 0 as expected, 1 an unexpected failure, 2 bad usage or a missing prerequisite.
set -uo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/target/pyverbs
UPDATE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift ;;
    --update) UPDATE=1 ;;
    *) echo "usage: $0 [--out DIR] [--update]" >&2; exit 2 ;;
  esac
  shift
done
say() { printf 'pyverbs: %s\n' "$*" >&2; }
SUITE=/usr/share/doc/rdma-core/tests
EXPECTED=$ROOT/tests/pyverbs-expected.tsv
PYTHON=${PYTHON:-/usr/bin/python3}
TIMEOUT=${PYVERBS_TIMEOUT:-900}

LIB_DIR=${SOFTVERBS_LIB_DIR:-${LIBIBVERBS_DIR:-$ROOT/target/libibverbs}}
if [ ! -f "$LIB_DIR/libibverbs.so.1" ]; then
  say "error: no libibverbs.so.1 in $LIB_DIR: build the drop-in first with"
  say "       scripts/build-libibverbs.sh --release   (or set SOFTVERBS_LIB_DIR)"
  exit 2
fi
if [ ! -f "$SUITE/run_tests.py" ]; then
  say "error: no $SUITE/run_tests.py (Debian package python3-pyverbs)"
  exit 2
fi
if ! "$PYTHON" -c 'import pyverbs.device' 2>/dev/null; then
  say "error: $PYTHON cannot import pyverbs (Debian package python3-pyverbs; set PYTHON)"
  exit 2
fi
BIN=${SOFTVERBS_BIN:-}
if [ -z "$BIN" ]; then
  for b in "${CARGO_TARGET_DIR:-$ROOT/target}"/release/softverbs "${CARGO_TARGET_DIR:-$ROOT/target}"/debug/softverbs; do
    [ -x "$b" ] && { BIN=$b; break; }
  done
fi
if [ -z "$BIN" ]; then
  say "building softverbs (release)"
  BIN=$(cd "$ROOT" && cargo build -q --release --bin softverbs --message-format=json |
    grep -o '"executable":"[^"]*softverbs"' | sed 's/^"executable":"//; s/"$//' | tail -1)
fi
[ -n "$BIN" ] && [ -x "$BIN" ] || { say "error: no softverbs binary (set SOFTVERBS_BIN)"; exit 2; }
BIN=$(realpath "$BIN")

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/tests" "$OUT/run.log" "$OUT/run.out" "$OUT/results.tsv"
cp -r "$SUITE" "$OUT/tests"
gunzip -f "$OUT"/tests/*.gz
say "running rdma-core's pyverbs suite on softverbs0 (library $LIB_DIR, logs in $OUT)"
t0=$(date +%s)
rc=0
(cd "$OUT" && timeout -k 10 "$TIMEOUT" "$BIN" exec --lib "$LIB_DIR" -- \
  "$PYTHON" tests/run_tests.py --dev softverbs0 --gid 0 -v) \
  >"$OUT/run.out" 2>"$OUT/run.log" </dev/null || rc=$?
say "run_tests.py exit $rc after $(( $(date +%s) - t0 )) s: $(grep -E '^(Ran |OK|FAILED)' "$OUT/run.log" | tr '\n' ' ')"
case $rc in
  0|1) ;;
  124|137) say "run_tests.py timed out after $TIMEOUT s: tests after the hang did not report" ;;
  *) say "run_tests.py ended abnormally (exit $rc): tests after the crash did not report" ;;
esac
"$PYTHON" "$ROOT/scripts/pyverbs-results.py" parse "$OUT/run.log" >"$OUT/results.tsv" || exit 2
if [ ! -s "$OUT/results.tsv" ]; then
  say "error: no test reported a result; run_tests.py said:"
  tail -5 "$OUT/run.log" >&2
  exit 1
fi
if [ "$UPDATE" = 1 ]; then
  "$PYTHON" "$ROOT/scripts/pyverbs-results.py" update "$OUT/results.tsv" "$EXPECTED"
  say "rewrote $EXPECTED: review the reasons of new non-pass lines"
fi
[ -f "$EXPECTED" ] || { say "error: no $EXPECTED (scripts/pyverbs.sh --update writes it)"; exit 2; }
"$PYTHON" "$ROOT/scripts/pyverbs-results.py" compare "$OUT/results.tsv" "$EXPECTED" | tee "$OUT/summary.txt"
exit "${PIPESTATUS[0]}"
