#!/usr/bin/env bash
# Differential conformance: the conformance suite through the hardware backend (verbs-hw) against
# Linux SoftRoCE (rxe0) in the rxe-vm guest, and the same suite on the emulator (emu-sim) on the
# host; prints a per-case table and writes a case-by-case comparison.
#
#   scripts/rxe-conformance.sh [--no-vm] [--out DIR]
#
#   --no-vm    reuse DIR/rxe.log from an earlier run instead of booting the VM
#   --out DIR  where logs and the report go (default: target/rxe-conformance)
#
# Needs what `rxe-vm run` needs (root, /dev/net/tun, the Debian mirror for the first `build`).
# Environment: RXE_VM (path of the rxe-vm tool; default ../shared/rxe-vm/rxe-vm next to the
# repository), RXE_VM_TIMEOUT (VM time bound, default 600 s), CARGO_PROFILE_ARGS (e.g. --release).
#
# Outputs in DIR: rxe.log (guest console), emu.log (host run), rxe.tsv / emu.tsv (case, outcome,
# note), report.md (table and differences). Outcomes: pass, fail, xfail (a listed known failure
# that failed), skip. Exit status: 0 when both runs completed (whatever the differences), 1 when a
# run could not be made or parsed.
set -euo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RXE_VM=${RXE_VM:-$ROOT/../shared/rxe-vm/rxe-vm}
OUT=$ROOT/target/rxe-conformance
USE_VM=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-vm) USE_VM=0 ;;
    --out) OUT=$2; shift ;;
    *) echo "usage: $0 [--no-vm] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
say() { printf 'rxe-conformance: %s\n' "$*" >&2; }

# The executable cargo built for integration test $1 of verbs-conformance.
test_binary() {
  # shellcheck disable=SC2086
  cargo test -p verbs-conformance --test "$1" --no-run ${CARGO_PROFILE_ARGS:-} \
    --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*"' | sed 's/^"executable":"//; s/"$//' | tail -1
}

cd "$ROOT"
say "building the conformance binaries (hw, emu_sim)"
cargo test -p verbs-conformance --test hw --test emu_sim --no-run ${CARGO_PROFILE_ARGS:-} >&2
HW_BIN=$(test_binary hw)
EMU_BIN=$(test_binary emu_sim)
[ -x "$HW_BIN" ] && [ -x "$EMU_BIN" ] || { say "could not locate the test binaries"; exit 1; }
say "hw binary: $HW_BIN"

# glibc: rxe-vm copies the binary's shared libraries (ldd) into the guest at their host paths,
# so the guest runs the host's libc; libibverbs is not linked (dlopen), and the guest's own
# rdma-core (Debian bookworm) is loaded against that libc. Report the versions involved.
need=$(objdump -T "$HW_BIN" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 || true)
host=$(ldd --version 2>/dev/null | head -1 | grep -o '[0-9][0-9.]*$' || true)
cache=${RXE_VM_CACHE:-/var/tmp/rxe-vm}
guest=$(ls "$cache"/debs/libc6_*.deb 2>/dev/null | head -1 | sed 's/.*libc6_//; s/_.*//' || true)
say "binary needs ${need:-?}; host glibc ${host:-?} (copied into the guest); guest's own libc6 ${guest:-not built yet}"
if ldd "$HW_BIN" | grep -q 'libibverbs'; then
  say "error: the hw binary links libibverbs; it must only dlopen it"
  exit 1
fi

if [ "$USE_VM" = 1 ]; then
  [ -x "$RXE_VM" ] || { say "rxe-vm not found at $RXE_VM (set RXE_VM)"; exit 1; }
  guest_script=$(mktemp)
  trap 'rm -f "$guest_script"' EXIT
  cat >"$guest_script" <<'EOF'
cd /root
# Readiness: rxe0 is ACTIVE when the guest script starts, but on a loaded host its first
# modify_qp(RTR) can still fail with ENETUNREACH for a few seconds (the route to the GID's
# address is not resolvable yet). Wait until one RC connection works (at most 30 tries), so
# that the suite measures rxe, not boot timing.
i=0
until ./hw-conformance --exact rdma::write_small --test-threads=1 >/root/probe.txt 2>&1; do
  i=$((i+1))
  if [ $i -ge 30 ]; then echo "@@PROBE gave up after $i tries"; tail -5 /root/probe.txt; break; fi
  sleep 1
done
echo "@@PROBE ready after $i failed tries (uptime $(cut -d' ' -f1 /proc/uptime)s)"
./hw-conformance --test-threads=1 --logfile /root/cases.txt >/root/stdout.txt 2>/root/stderr.txt
rc=$?
cat /root/stdout.txt
grep -v 'is deprecated' /root/stderr.txt
sed 's/^/@@CASE /' /root/cases.txt
grep -E '^(SKIP|XFAIL) ' /root/stderr.txt | sed 's/^/@@NOTE /'
echo "@@SUITE-EXIT $rc"
EOF
  say "running the suite on rxe0 in the VM (TCG: allow a few minutes)"
  set +e
  "$RXE_VM" run --timeout "${RXE_VM_TIMEOUT:-600}" --add "$HW_BIN:/root/hw-conformance" \
    "$guest_script" >"$OUT/rxe.log" 2>"$OUT/rxe-vm.stderr"
  vm_rc=$?
  set -e
  say "rxe-vm exit $vm_rc ($(tail -1 "$OUT/rxe-vm.stderr"))"
  grep -a '@@PROBE' "$OUT/rxe.log" | tr -d '\r' | sed 's/^@@PROBE /rxe-conformance: guest /' >&2 || true
fi
[ -s "$OUT/rxe.log" ] || { say "no guest log at $OUT/rxe.log"; exit 1; }

say "running the suite on the emulator (host)"
set +e
"$EMU_BIN" --test-threads=2 --logfile "$OUT/emu-cases.txt" >"$OUT/emu.log" 2>"$OUT/emu.stderr"
set -e

# Case outcomes: "ok NAME" / "failed NAME" from libtest's log, refined by SKIP/XFAIL notes.
tabulate() { # $1 = file with "ok|failed|ignored NAME" lines, $2 = file with SKIP/XFAIL lines
  awk -v notes="$2" '
    BEGIN {
      while ((getline line < notes) > 0) {
        if (match(line, /^(SKIP|XFAIL) [^ ]+: /)) {
          kind = substr(line, 1, index(line, " ") - 1)
          rest = substr(line, index(line, " ") + 1)
          name = substr(rest, 1, index(rest, ": ") - 1)
          why = substr(rest, index(rest, ": ") + 2)
          note[name] = why; tag[name] = (kind == "SKIP") ? "skip" : "xfail"
        }
      }
    }
    $1 == "ok" || $1 == "failed" || $1 == "ignored" {
      name = $2
      out = ($1 == "ok") ? "pass" : ($1 == "failed" ? "fail" : "skip")
      if (out == "pass" && (name in tag)) out = tag[name]
      printf "%s\t%s\t%s\n", name, out, note[name]
    }' "$1" | sort
}

sed -n 's/^@@CASE //p' "$OUT/rxe.log" | tr -d '\r' >"$OUT/rxe-cases.txt"
sed -n 's/^@@NOTE //p' "$OUT/rxe.log" | tr -d '\r' >"$OUT/rxe-notes.txt"
grep -E '^(SKIP|XFAIL) ' "$OUT/emu.stderr" >"$OUT/emu-notes.txt" || true
tabulate "$OUT/rxe-cases.txt" "$OUT/rxe-notes.txt" >"$OUT/rxe.tsv"
tabulate "$OUT/emu-cases.txt" "$OUT/emu-notes.txt" >"$OUT/emu.tsv"
[ -s "$OUT/rxe.tsv" ] || { say "no case outcomes in the guest log (see $OUT/rxe.log)"; exit 1; }

# Failure messages of failed cases, from libtest's "---- NAME stdout ----" sections.
failure_of() { # $1 log, $2 case
  awk -v want="---- $2 stdout ----" '
    $0 == want { grab = 1; next }
    grab && /^---- / { exit }
    grab && / on (hw|emu): / { sub(/^.* on (hw|emu): /, ""); print; exit }' "$1"
}

report=$OUT/report.md
{
  echo "# Differential conformance: rxe (verbs-hw in the rxe-vm guest) vs emu-sim"
  echo
  echo "| case | rxe | emu | |"
  echo "|---|---|---|---|"
  join -t $'\t' -a1 -a2 -e '-' -o 0,1.2,2.2 "$OUT/rxe.tsv" "$OUT/emu.tsv" |
    while IFS=$'\t' read -r name r e; do
      mark=""
      rp=$([ "$r" = pass ] && echo 1 || echo 0)
      ep=$([ "$e" = pass ] && echo 1 || echo 0)
      if [ "$r" = skip ] || [ "$e" = skip ] || [ "$r" = - ] || [ "$e" = - ]; then mark="skipped"
      elif [ "$rp" != "$ep" ]; then mark="**differs**"
      elif [ "$rp" = 0 ]; then mark="both fail"
      fi
      echo "| $name | $r | $e | $mark |"
    done
} >"$report.table"

equal=$(grep -c '| pass | pass |' "$report.table" || true)
differ=$(grep -c 'differs' "$report.table" || true)
bothfail=$(grep -c 'both fail' "$report.table" || true)
skipped=$(grep -c '| skipped |$' "$report.table" || true)
count() { cut -f2 "$1" | sort | uniq -c | awk '{printf "%s%s %s", sep, $1, $2; sep=", "}'; }
{
  cat "$report.table"
  echo
  echo "Totals: $equal equal (pass on both), $differ different, $bothfail failing on both, $skipped skipped."
  echo "rxe: $(count "$OUT/rxe.tsv"). emu: $(count "$OUT/emu.tsv")."
  echo
  echo "## Differences"
  echo
  grep -E 'differs|both fail' "$report.table" | while IFS='|' read -r _ name r e _; do
    name=$(echo "$name" | xargs); r=$(echo "$r" | xargs); e=$(echo "$e" | xargs)
    echo "- \`$name\`: rxe $r, emu $e"
    for side in rxe emu; do
      out=$([ $side = rxe ] && echo "$r" || echo "$e")
      tsv=$OUT/$side.tsv
      log=$([ $side = rxe ] && echo "$OUT/rxe.log" || echo "$OUT/emu.log")
      case "$out" in
        xfail) echo "  - $side (known): $(awk -F'\t' -v n="$name" '$1 == n { print $3 }' "$tsv")" ;;
        fail) echo "  - $side: $(failure_of "$log" "$name")" ;;
      esac
    done
  done
} >"$report"
rm -f "$report.table"

cat "$report"
say "report: $report"
