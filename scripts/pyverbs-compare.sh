#!/usr/bin/env bash
# rdma-core's pyverbs suite on rxe and on softverbs, side by side:
#
#   scripts/pyverbs-compare.sh RXE.tsv SOFTVERBS.tsv
#
# RXE.tsv comes from scripts/rxe-pyverbs.sh (target/rxe-pyverbs/rxe.tsv), SOFTVERBS.tsv from
# scripts/pyverbs.sh (target/pyverbs/results.tsv) or `scripts/pyverbs-table.py parse LOG` of any
# run_tests.py -v log; both are id <TAB> pass|fail|skip <TAB> detail.
# Prints one row per test (its result on rxe and on softverbs: pass, fail, error, skip, or - when
# it did not report) and the totals of both, and fails when a test that passes on rxe does not
# pass on softverbs, unless the expectations file lists that test as a non-pass with a reason.
#
# Environment: PYVERBS_EXPECTED (default tests/pyverbs-expected.tsv; when the file does not
# exist, no exception is accepted).
# Exit status: 0 softverbs passes everything rxe passes (or the exception is listed), 1 it does
# not, 2 bad usage or an unreadable file.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ $# -ne 2 ]; then
  echo "usage: $0 RXE.tsv SOFTVERBS.tsv" >&2
  exit 2
fi
for f in "$1" "$2"; do
  [ -r "$f" ] || { echo "pyverbs-compare: cannot read $f" >&2; exit 2; }
done
EXPECTED=${PYVERBS_EXPECTED:-$ROOT/tests/pyverbs-expected.tsv}
args=("$1" "$2")
if [ -f "$EXPECTED" ]; then
  args+=("$EXPECTED")
else
  echo "pyverbs-compare: no $EXPECTED: no exception accepted" >&2
fi
rc=0
python3 "$ROOT/scripts/pyverbs-table.py" compare "${args[@]}" || rc=$?
case $rc in
  0) echo "pyverbs-compare: PASS: softverbs passes every test rxe passes (or lists why not)" ;;
  1) echo "pyverbs-compare: FAIL: tests rxe passes that softverbs does not (REGRESSION rows)" ;;
  *) exit 2 ;;
esac
exit $rc
