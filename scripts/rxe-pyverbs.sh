#!/usr/bin/env bash
# rdma-core's own pyverbs test suite against Linux SoftRoCE (rxe0 in the rxe-vm guest): the
# reference that softverbs' run of the same suite (scripts/pyverbs.sh) is compared with.
#
#   scripts/rxe-pyverbs.sh [--out DIR]
#
# Boots the rxe-vm guest with python3-pyverbs (RXE_VM_EXTRA_PKGS, its own cached image), copies
# the suite from /usr/share/doc/rdma-core/tests there, gunzips it and runs
#   python3 tests/run_tests.py --dev rxe0 --gid 1 -v
# The verbose unittest output is parsed (scripts/pyverbs-table.py) into
#   DIR/rxe.tsv     one line per test: id <TAB> pass|fail|skip <TAB> detail (the shape of
#                   scripts/pyverbs.sh's results; an unittest ERROR is a fail whose detail
#                   starts with "ERROR"), after a "#" line with the totals
#   DIR/totals.txt  tests, pass, fail, error, skip
# plus DIR/run.log (the suite's output), DIR/rxe.log (guest console), DIR/rxe-vm.stderr.
# Compare with softverbs: scripts/pyverbs-compare.sh DIR/rxe.tsv target/pyverbs/results.tsv
#
# Environment: RXE_VM (default ../shared/rxe-vm/rxe-vm next to the repository), RXE_VM_TIMEOUT
# (VM bound, default 900 s), RXE_VM_MEM (default 1G: the suite needs more than the 512M default),
# RXE_VM_NS (namespace, default rxe-vm).
# Exit status: 0 when the suite ran to its end (whatever its results), 1 when it did not
# (the VM failed, timed out, or no test reported), 2 on bad usage.
set -euo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RXE_VM=${RXE_VM:-$ROOT/../shared/rxe-vm/rxe-vm}
OUT=$ROOT/target/rxe-pyverbs
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift ;;
    *) echo "usage: $0 [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
say() { printf 'rxe-pyverbs: %s\n' "$*" >&2; }
[ -x "$RXE_VM" ] || { say "rxe-vm not found at $RXE_VM (set RXE_VM)"; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT/rxe.tsv" "$OUT/totals.txt" "$OUT/run.log" "$OUT/rxe.log"

# Guest (busybox sh): the suite's output between markers, each line prefixed, so that kernel
# messages on the console cannot be mistaken for it.
guest_script=$OUT/guest.sh
cat >"$guest_script" <<'EOF'
cd /root
cp -r /usr/share/doc/rdma-core/tests /root/tests && gunzip -f /root/tests/*.gz || exit 3
t0=$(date +%s)
python3 tests/run_tests.py --dev "$RXE_DEV" --gid "$GID_INDEX" -v >py.log 2>&1
rc=$?
echo "@@PYVERBS-BEGIN"
sed 's/^/@@PY /' py.log
echo "@@PYVERBS-END exit=$rc seconds=$(( $(date +%s) - t0 ))"
exit 0
EOF

say "running the pyverbs suite on rxe0 in the VM (logs in $OUT)"
t0=$(date +%s)
set +e
(cd "$OUT" && RXE_VM_EXTRA_PKGS="python3-pyverbs${RXE_VM_EXTRA_PKGS:+ $RXE_VM_EXTRA_PKGS}" \
  RXE_VM_MEM=${RXE_VM_MEM:-1G} "$RXE_VM" run --timeout "${RXE_VM_TIMEOUT:-900}" "$guest_script") \
  >"$OUT/rxe.log" 2>"$OUT/rxe-vm.stderr"
vm_rc=$?
set -e
say "rxe-vm exit $vm_rc after $(( $(date +%s) - t0 )) s"

tr -d '\r' <"$OUT/rxe.log" | sed -n 's/^@@PY //p; s/^@@PY$//p' >"$OUT/run.log"
end=$(tr -d '\r' <"$OUT/rxe.log" | grep -E '^@@PYVERBS-END' | tail -1 || true)
python3 "$ROOT/scripts/pyverbs-table.py" parse "$OUT/run.log" >"$OUT/rxe.tsv.tmp"
python3 "$ROOT/scripts/pyverbs-table.py" totals "$OUT/rxe.tsv.tmp" "pyverbs on rxe0" >"$OUT/totals.txt"
{ echo "# $(cat "$OUT/totals.txt") (rdma-core $(dpkg-query -W -f '${Version}' python3-pyverbs 2>/dev/null || echo '?'), rxe-vm guest)"
  cat "$OUT/rxe.tsv.tmp"; } >"$OUT/rxe.tsv"
rm -f "$OUT/rxe.tsv.tmp"
grep -E '^(Ran |OK|FAILED)' "$OUT/run.log" | sed 's/^/  run_tests.py: /' >&2 || true
cat "$OUT/totals.txt"
if [ -z "$end" ] || [ ! -s "$OUT/run.log" ] || ! grep -q $'\t' "$OUT/rxe.tsv"; then
  say "FAIL: the suite did not run to its end (rxe-vm exit $vm_rc; see $OUT/rxe.log, $OUT/rxe-vm.stderr)"
  exit 1
fi
say "done: ${end#@@PYVERBS-END } ($OUT/rxe.tsv)"
