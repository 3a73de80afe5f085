#!/usr/bin/env bash
# Long fuzzing with a recorded result: runs each cargo-fuzz target for a time budget, one after
# the other, from its committed corpus, and prints per target the executions, the coverage
# (libFuzzer's cov: edges and ft: features at the end), the corpus size before and after, and
# the crashes. Then it merges what the run found into fuzz/corpus/<target>/ minimized: only the
# inputs that add coverage to the committed corpus are added (libFuzzer -merge=1, what
# `cargo fuzz cmin` does, but into the committed directory, so no committed seed or reproducer
# is ever removed), ready to commit.
#
#   scripts/fuzz-long.sh TARGET... --budget SECONDS [--runs N] [--jobs N] [--no-merge]
#   scripts/fuzz-long.sh all --budget 3600          # every target (cargo fuzz list)
#   scripts/fuzz-long.sh wire_decode --budget 3600 --runs 10000000   # stop at 10 M executions
#
# --runs N ends a target after N executions (libFuzzer -runs) or at the budget, whichever comes
# first. The cpu-s column is the CPU time (user + system) the fuzzer and its children used, read
# by /usr/bin/time, so a record made at `nice -n 19` on a shared machine still says how much
# fuzzing it holds.
# --jobs N runs N libFuzzer workers per target (-fork=N; each gets the whole budget of wall
# time). A crash stops that target; the script carries on with the others, prints the
# reproducer path (fuzz/artifacts/<target>/crash-…) and exits 1. Exit 2: bad arguments or no
# nightly toolchain / cargo-fuzz. Logs: target/fuzz-long/<target>.log.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { echo "usage: $0 TARGET...|all --budget SECONDS [--runs N] [--jobs N] [--no-merge]" >&2; exit 2; }
targets=() budget='' runs='' jobs=1 merge=1
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) budget=${2:-}; shift ;;
    --runs) runs=${2:-}; shift ;;
    --jobs) jobs=${2:-}; shift ;;
    --no-merge) merge=0 ;;
    -h|--help) usage ;;
    -*) usage ;;
    *) targets+=("$1") ;;
  esac
  shift
done
[[ "$budget" =~ ^[1-9][0-9]*$ ]] || usage
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || usage
[ -z "$runs" ] || [[ "$runs" =~ ^[1-9][0-9]*$ ]] || usage
[ -x /usr/bin/time ] || { echo "fuzz-long: /usr/bin/time is needed for the CPU column (Debian: time)" >&2; exit 2; }
[ ${#targets[@]} -gt 0 ] || usage
cargo +nightly --version >/dev/null 2>&1 || { echo "fuzz-long: no nightly toolchain" >&2; exit 2; }
command -v cargo-fuzz >/dev/null || { echo "fuzz-long: cargo-fuzz is not installed" >&2; exit 2; }
cd "$ROOT/fuzz"
known=$(cargo +nightly fuzz list)
if [ "${targets[*]}" = all ]; then mapfile -t targets <<<"$known"; fi
for t in "${targets[@]}"; do
  grep -qx "$t" <<<"$known" || { echo "fuzz-long: no target $t (targets: $(echo $known))" >&2; exit 2; }
done
logs=$ROOT/target/fuzz-long
mkdir -p "$logs"
cargo +nightly fuzz build >&2
count() { find "$1" -maxdepth 1 -type f | wc -l; }
crashed=()
rows=()
for t in "${targets[@]}"; do
  corpus=corpus/$t
  mkdir -p "$corpus"
  before=$(count "$corpus")
  scratch=$(mktemp -d)
  extra=()
  [ -f "$t.dict" ] && extra+=(-dict="$t.dict")
  [ "$jobs" -gt 1 ] && extra+=(-fork="$jobs")
  [ -n "$runs" ] && extra+=(-runs="$runs")
  log=$logs/$t.log
  echo "== $t: $budget s, corpus $before files" >&2
  rc=0
  # New inputs go to the scratch directory; the committed corpus is read only here.
  cpufile=$logs/$t.cpu
  /usr/bin/time -f '%U %S' -o "$cpufile" cargo +nightly fuzz run "$t" "$scratch" "$corpus" -- \
    -max_total_time="$budget" -print_final_stats=1 "${extra[@]}" >"$log" 2>&1 || rc=$?
  cpu=$(awk 'END { if (NF == 2) printf "%.0f", $1 + $2; else print "?" }' "$cpufile")
  execs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || true)
  [ -n "$execs" ] || execs=$(grep -oE 'Done [0-9]+ runs' "$log" | grep -oE '[0-9]+' | tail -1 || true)
  [ -n "$execs" ] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#' || true)
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
  cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo '?')
  ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo '?')
  eps=$(grep -oE 'exec/s: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo '?')
  crash=$(grep -oE 'Test unit written to [^ ]+' "$log" | awk '{print $5}' | head -1 || true)
  found=$(count "$scratch")
  if [ "$merge" = 1 ] && [ "$found" -gt 0 ]; then
    cargo +nightly fuzz run "$t" "$corpus" "$scratch" -- -merge=1 >>"$log" 2>&1 || true
  fi
  rm -rf "$scratch"
  after=$(count "$corpus")
  crashes=0
  if [ -n "$crash" ] || [ "$rc" -ne 0 ]; then
    crashes=1
    crashed+=("$t: ${crash:-exit $rc, see $log}")
  fi
  rows+=("$(printf '%-12s %7ss %7s %12s %9s %7s %7s %6s -> %-6s %7s' "$t" "$budget" "$cpu" \
    "${execs:-?}" "$eps" "$cov" "$ft" "$before" "$after" "$crashes")")
done
printf '%-12s %8s %7s %12s %9s %7s %7s %16s %7s\n' target budget cpu-s executions exec/s cov ft \
  "corpus (files)" crashes
printf '%s\n' "${rows[@]}"
echo "logs: $logs/<target>.log; corpus growth (minimized): git status fuzz/corpus"
if [ ${#crashed[@]} -gt 0 ]; then
  printf 'CRASH %s\n' "${crashed[@]}"
  echo "reproduce: cd fuzz && cargo +nightly fuzz run TARGET fuzz/artifacts/TARGET/crash-…" >&2
  exit 1
fi
