#!/usr/bin/env bash
# Differential conformance: the conformance suite through the hardware backend (verbs-hw) against
# Linux SoftRoCE (rxe0) in the rxe-vm guest, and the same suite on the emulator (emu-sim) on the
# host; prints a per-case table and writes a case-by-case comparison. The guest runs the hw binary
# twice in one boot: checked (verbs-hw enforces the verbs_api contract where libibverbs/rxe
# differ) and raw (SOFTVERBS_HW_RAW=1: those checks off, so the cases see rxe's own answers).
#
#   scripts/rxe-conformance.sh [--no-vm] [--out DIR]
#
#   --no-vm    reuse DIR/rxe.log from an earlier run instead of booting the VM
#   --out DIR  where logs and the report go (default: target/rxe-conformance)
#
# Needs what `rxe-vm run` needs (root, /dev/net/tun, the Debian mirror for the first `build`).
# Environment: RXE_VM (path of the rxe-vm tool; default ../shared/rxe-vm/rxe-vm next to the
# repository), RXE_VM_TIMEOUT (VM time bound, default 600 s), CARGO_PROFILE_ARGS (e.g. --release);
# the rxe-vm tool's own (RXE_VM_ACCEL=kvm, …) pass through.
#
# Outputs in DIR: rxe.log (guest console), emu.log (host run), rxe.tsv / rxe-raw.tsv / emu.tsv
# (case, outcome, note), report.md (table and differences). Outcomes: pass, fail, xfail (a listed
# known failure that failed as expected), skip. A known failure that fails differently ("XFAIL
# mismatch") or passes ("XPASS") is a fail.
# Exit status: 0 when all runs completed and executed cases (whatever the differences), 1 when a
# run could not be made or parsed, 3 when a hw run executed no case (no libibverbs or no device
# in the guest: every case skipped) — "SKIPPED", never a pass.
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
# Twice in this boot: checked, then raw (verbs-hw's contract-only checks off).
for mode in checked raw; do
  [ "$mode" = raw ] && export SOFTVERBS_HW_RAW=1
  ./hw-conformance --test-threads=1 --logfile /root/cases-$mode.txt >/root/stdout-$mode.txt \
    2>/root/stderr-$mode.txt
  rc=$?
  sed "s/^/@@OUT-$mode /" /root/stdout-$mode.txt
  grep -v 'is deprecated' /root/stderr-$mode.txt | grep -v '^$'
  sed "s/^/@@CASE-$mode /" /root/cases-$mode.txt
  grep -E '^(SKIP|XFAIL) ' /root/stderr-$mode.txt | sed "s/^/@@NOTE-$mode /"
  echo "@@SUITE-EXIT-$mode $rc"
done
EOF
  say "running the suite on rxe0 in the VM, checked then raw (TCG: allow a few minutes)"
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
    ($1 == "ok" || $1 == "failed" || $1 == "ignored") && $2 ~ /::/ {
      name = $2
      out = ($1 == "ok") ? "pass" : ($1 == "failed" ? "fail" : "skip")
      if (out == "pass" && (name in tag)) out = tag[name]
      printf "%s\t%s\t%s\n", name, out, note[name]
    }' "$1" | sort
}

for mode in checked raw; do
  tag=$([ $mode = checked ] && echo rxe || echo rxe-raw)
  sed -n "s/^@@CASE-$mode //p" "$OUT/rxe.log" | tr -d '\r' >"$OUT/$tag-cases.txt"
  sed -n "s/^@@NOTE-$mode //p" "$OUT/rxe.log" | tr -d '\r' >"$OUT/$tag-notes.txt"
  sed -n "s/^@@OUT-$mode //p" "$OUT/rxe.log" | tr -d '\r' >"$OUT/$tag.out"
  tabulate "$OUT/$tag-cases.txt" "$OUT/$tag-notes.txt" >"$OUT/$tag.tsv"
  [ -s "$OUT/$tag.tsv" ] || { say "no $mode case outcomes in the guest log (see $OUT/rxe.log)"; exit 1; }
done
grep -E '^(SKIP|XFAIL) ' "$OUT/emu.stderr" >"$OUT/emu-notes.txt" || true
tabulate "$OUT/emu-cases.txt" "$OUT/emu-notes.txt" >"$OUT/emu.tsv"

# Failure messages of failed cases, from libtest's "---- NAME stdout ----" sections.
failure_of() { # $1 log, $2 case
  awk -v want="---- $2 stdout ----" '
    $0 == want { grab = 1; next }
    grab && /^---- / { exit }
    grab && / on (hw|emu): / { sub(/^.* on (hw|emu): /, ""); print; exit }' "$1"
}

# The mark of one rxe column against emu.
mark_of() { # $1 rxe outcome, $2 emu outcome
  if [ "$1" = skip ] || [ "$2" = skip ] || [ "$1" = - ] || [ "$2" = - ]; then echo skipped
  elif [ "$1" = pass ] && [ "$2" = pass ]; then echo equal
  elif [ "$1" = pass ] || [ "$2" = pass ]; then echo differs
  else echo "both fail"
  fi
}

report=$OUT/report.md
join -t $'\t' -a1 -a2 -e '-' -o 0,1.2,2.2 "$OUT/rxe.tsv" "$OUT/rxe-raw.tsv" >"$OUT/rxe-both.tsv"
join -t $'\t' -a1 -a2 -e '-' -o 0,1.2,1.3,2.2 "$OUT/rxe-both.tsv" "$OUT/emu.tsv" |
  while IFS=$'\t' read -r name r w e; do
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$r" "$w" "$e" "$(mark_of "$r" "$e")" "$(mark_of "$w" "$e")"
  done >"$OUT/compare.tsv"
rm -f "$OUT/rxe-both.tsv"

total=$(wc -l <"$OUT/compare.tsv")
n() { awk -F'\t' -v col="$1" -v want="$2" '$col == want' "$OUT/compare.tsv" | wc -l; }
count() { cut -f2 "$1" | sort | uniq -c | awk '{printf "%s%s %s", sep, $1, $2; sep=", "}'; }
executed() { awk -F'\t' '$2 != "skip"' "$1" | wc -l; }
{
  echo "# Differential conformance: rxe (verbs-hw in the rxe-vm guest, checked and raw) vs emu-sim"
  echo
  echo "*rxe checked*: verbs-hw enforces the verbs_api contract where libibverbs/rxe differ (the"
  echo "list is in verbs-api/hw/src/lib.rs). *rxe raw*: \`SOFTVERBS_HW_RAW=1\`, those checks off;"
  echo "only the memory-safety checks remain, so this column is rxe's own answer."
  echo
  echo "| case | rxe checked | rxe raw | emu | checked vs emu | raw vs emu |"
  echo "|---|---|---|---|---|---|"
  while IFS=$'\t' read -r name r w e mc mw; do
    bold() { case "$1" in differs) echo "**differs**" ;; equal) echo "" ;; *) echo "$1" ;; esac; }
    echo "| $name | $r | $w | $e | $(bold "$mc") | $(bold "$mw") |"
  done <"$OUT/compare.tsv"
  echo
  echo "Totals ($total cases):"
  echo
  echo "| | equal (pass on both) | different | failing on both | skipped |"
  echo "|---|---|---|---|---|"
  echo "| rxe checked vs emu | $(n 5 equal) | $(n 5 differs) | $(n 5 'both fail') | $(n 5 skipped) |"
  echo "| rxe raw vs emu | $(n 6 equal) | $(n 6 differs) | $(n 6 'both fail') | $(n 6 skipped) |"
  echo
  echo "rxe checked: $(count "$OUT/rxe.tsv"). rxe raw: $(count "$OUT/rxe-raw.tsv"). emu: $(count "$OUT/emu.tsv")."
  echo
  echo "## Differences"
  echo
  awk -F'\t' '$5 != "equal" || $6 != "equal"' "$OUT/compare.tsv" |
    while IFS=$'\t' read -r name r w e mc mw; do
      echo "- \`$name\`: rxe checked $r, rxe raw $w, emu $e"
      for side in rxe rxe-raw emu; do
        case $side in rxe) out=$r ;; rxe-raw) out=$w ;; emu) out=$e ;; esac
        log=$OUT/$side.out; [ $side = emu ] && log=$OUT/emu.log
        label=$([ $side = rxe ] && echo "rxe checked" || { [ $side = rxe-raw ] && echo "rxe raw" || echo emu; })
        case "$out" in
          xfail) echo "  - $label (known): $(awk -F'\t' -v n="$name" '$1 == n { print $3 }' "$OUT/$side.tsv")" ;;
          fail) echo "  - $label: $(failure_of "$log" "$name")" ;;
        esac
      done
    done
} >"$report"

status=0
for tag in rxe rxe-raw; do
  if [ "$(executed "$OUT/$tag.tsv")" -eq 0 ]; then
    status=3
    line="SKIPPED: the rxe $([ $tag = rxe ] && echo checked || echo raw) run executed 0 of $(wc -l <"$OUT/$tag.tsv") cases (no libibverbs or no RDMA device in the guest): this is not a pass."
    awk -v l="**$line**" 'NR == 2 { print ""; print l } { print }' "$report" >"$report.new"
    mv "$report.new" "$report"
    say "################################################################################"
    say "$line"
    say "$(grep -a -m1 '^SUMMARY hw' "$OUT/rxe.log" | tr -d '\r' || true)"
    say "################################################################################"
  fi
done
cat "$report"
say "report: $report"
exit $status
