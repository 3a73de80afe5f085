#!/usr/bin/env bash
# Long fuzzing with a recorded result: runs each cargo-fuzz target for a time budget, one after
# the other, from its committed corpus, and prints per target the executions, the coverage
# (libFuzzer's cov: edges and ft: features at the end), the corpus size before and after, and
# the crashes. Then it merges what the run found into fuzz/corpus/<target>/ minimized: only the
# inputs that add coverage to the committed corpus are added (libFuzzer -merge=1, what
# `cargo fuzz cmin` does, but into the committed directory, so no committed seed or reproducer
# is ever removed), ready to commit.
#
#   scripts/fuzz-long.sh TARGET... --budget SECONDS [--cpu-budget SECONDS] [--runs N] [--jobs N]
#                        [--no-merge]
#   scripts/fuzz-long.sh all --budget 3600          # every target (cargo fuzz list)
#   scripts/fuzz-long.sh wire_decode --budget 3600 --runs 10000000   # stop at 10 M executions
#
# --cpu-budget S ends a target once the fuzzer's processes have used S seconds of CPU (user +
# system, read from /proc every 10 s), or at the wall budget, whichever comes first: on a shared
# machine at `nice -n 19`, "one CPU-hour" is `--budget 14400 --cpu-budget 3600`. The fuzzer is
# stopped with SIGINT, so libFuzzer still prints its final statistics; that stop is not a crash.
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
usage() {
  echo "usage: $0 TARGET...|all --budget SECONDS [--cpu-budget SECONDS] [--runs N] [--jobs N] [--no-merge]" >&2
  exit 2
}
targets=() budget='' cpu_budget='' runs='' jobs=1 merge=1
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) budget=${2:-}; shift ;;
    --cpu-budget) cpu_budget=${2:-}; shift ;;
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
[ -z "$cpu_budget" ] || [[ "$cpu_budget" =~ ^[1-9][0-9]*$ ]] || usage
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
tck=$(getconf CLK_TCK)
# descendants PID: PID and every process below it (from the parent field of /proc/*/stat).
descendants() {
  local -A kids=()
  local f line rest ppid pid all=("$1") i=0
  for f in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null <"$f" || continue
    rest=${line##*) }
    read -r _ ppid _ <<<"$rest"
    pid=${f#/proc/}
    kids[$ppid]+=" ${pid%/stat}"
  done
  while [ "$i" -lt ${#all[@]} ]; do
    for pid in ${kids[${all[$i]}]:-}; do all+=("$pid"); done
    i=$((i + 1))
  done
  echo "${all[@]}"
}
# cpu_of PID...: CPU seconds (user + system, with reaped children) of the processes.
cpu_of() {
  local p line ticks=0 f
  for p in "$@"; do
    read -r line 2>/dev/null <"/proc/$p/stat" || continue
    read -r -a f <<<"${line##*) }"
    ticks=$((ticks + f[11] + f[12] + f[13] + f[14]))
  done
  echo $((ticks / tck))
}
# watch_cpu PID LIMIT MARK: once the tree below PID has used LIMIT CPU seconds, stops it: the
# processes above libFuzzer are frozen (cargo-fuzz would take libFuzzer's interrupt exit for a
# failure and rebuild the target to replay every slow-unit artifact), libFuzzer gets SIGINT and
# prints its final statistics, then the frozen ones are killed. Leaves MARK so the stop is not
# taken for a crash.
watch_cpu() {
  local top=$1 limit=$2 mark=$3 tree p fuzzers=() others=()
  while kill -0 "$top" 2>/dev/null; do
    sleep 10
    read -r -a tree <<<"$(descendants "$top")"
    [ "$(cpu_of "${tree[@]}")" -ge "$limit" ] || continue
    touch "$mark"
    for p in "${tree[@]}"; do
      if [ "$(basename "$(readlink "/proc/$p/exe" 2>/dev/null)")" = "$t" ]; then
        fuzzers+=("$p")
      elif [ "$p" != "$top" ]; then
        others+=("$p")
      fi
    done
    [ ${#others[@]} -eq 0 ] || kill -STOP "${others[@]}" 2>/dev/null || true
    [ ${#fuzzers[@]} -eq 0 ] || kill -INT "${fuzzers[@]}" 2>/dev/null || true
    # An exited libFuzzer stays a zombie under the frozen cargo-fuzz: no exe, times still kept.
    for p in "${fuzzers[@]}"; do
      while readlink "/proc/$p/exe" >/dev/null 2>&1; do sleep 1; done
    done
    # /usr/bin/time never sees the killed processes' children: the CPU column comes from here.
    cpu_of "${tree[@]}" >"$mark"
    [ ${#others[@]} -eq 0 ] || kill -KILL "${others[@]}" 2>/dev/null || true
    return
  done
}
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
  mark=$logs/$t.cpu-budget-reached
  rm -f "$mark"
  /usr/bin/time -f '%U %S' -o "$cpufile" cargo +nightly fuzz run "$t" "$scratch" "$corpus" -- \
    -max_total_time="$budget" -print_final_stats=1 "${extra[@]}" >"$log" 2>&1 &
  fuzz_pid=$!
  [ -z "$cpu_budget" ] || watch_cpu "$fuzz_pid" "$cpu_budget" "$mark" &
  wait "$fuzz_pid" || rc=$?
  wait || true
  # Stopped at the CPU budget: libFuzzer exits 72 after "run interrupted", not a crash.
  if [ -f "$mark" ] && [ "$rc" -ne 0 ] && grep -q 'run interrupted' "$log"; then rc=0; fi
  cpu=$(awk 'END { if (NF == 2) printf "%.0f", $1 + $2; else print "?" }' "$cpufile")
  [ ! -s "$mark" ] || cpu=$(cat "$mark")
  execs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || true)
  [ -n "$execs" ] || execs=$(grep -oE 'Done [0-9]+ runs' "$log" | grep -oE '[0-9]+' | tail -1 || true)
  [ -n "$execs" ] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#' || true)
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
  cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo '?')
  ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo '?')
  eps=$(grep -oE 'exec/s: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo '?')
  # A slow-unit artifact (an input that ran over -report_slow_units seconds, e.g. while the
  # machine was busy) is reported, not counted as a crash.
  crash=$(grep -oE 'Test unit written to [^ ]+' "$log" | awk '{print $5}' | grep -v '/slow-unit-' |
    head -1 || true)
  slow=$(grep -oE 'Test unit written to [^ ]+/slow-unit-[^ ]+' "$log" | awk '{print $5}' || true)
  [ -z "$slow" ] || echo "fuzz-long: $t: slow inputs (not crashes): $(echo $slow)" >&2
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
