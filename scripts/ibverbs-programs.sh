#!/usr/bin/env bash
# Unmodified RDMA programs on softverbs: Debian's own binaries (ibverbs-utils, perftest), run
# with the drop-in libibverbs.so.1 through `softverbs exec`, server and client as two processes
# on loopback (each process's device binds its own 127.x.y.z:4791, zero configuration; TCP
# exchange to 127.0.0.1).
#
#   scripts/ibverbs-programs.sh [--out DIR] [--only REGEX] [--no-perf-table]
#
# Cases (each PASS/FAIL on the programs' exit codes AND their output):
#   ibv_devices                    lists softverbs0
#   ibv_devinfo -v                 softverbs0, PORT_ACTIVE, link layer Ethernet, GID 0 ::ffff:127.*
#   ibv_rc_pingpong / ibv_srq_pingpong -g 0, with and without -e, sizes 64 B … 1 MiB (×4):
#                                  both sides print "B bytes in … seconds" with B = 2·size·iters
#                                  and "N iters in … usec/iter"
#   ibv_ud_pingpong -g 0 -c, with and without -e, sizes 64 B … 4096 B (the MTU payload): as
#                                  the RC pingpongs (-c: each side checks the received bytes)
#   ibv_rc_pingpong-loss-pcap      4 KiB pingpong with `softverbs exec --faults` (2 % drop on
#                                  each side) and `--pcap`: completes, both captures hold packets
#   perftest RC ib_{write,send,read,atomic}_{bw,lat}: default flags, -a (-n ALL_ITERS), and
#                                  --use_old_post_send: the client prints one result row per
#                                  size (23 for -a), message rate (BW) or t_avg (latency) > 0;
#                                  perftest 4.5 itself refuses -a for the atomic tests (size
#                                  fixed at 8 B), so those two are SKIP, not run
#   perftest UD ib_send_{bw,lat} -c UD: default flags and -a (sizes 2 B … the 4096-byte MTU:
#                                  12 rows), checked as the RC ones
# Then a table of perftest's figures (default flags, the cases that passed) next to
# `softverbs perf`'s for the same test, size and iterations (release build of this repository):
# medians (min-max) of PERF_ROUNDS interleaved rounds, and perftest's median / ours.
#
# Needs: the drop-in (scripts/build-libibverbs.sh --release), Debian's ibverbs-utils and
# perftest, python3 (the table). Environment:
#   SOFTVERBS_LIB_DIR  directory of libibverbs.so.1 (default: $LIBIBVERBS_DIR, else target/libibverbs,
#                      where scripts/build-libibverbs.sh puts it)
#   SOFTVERBS_BIN      the softverbs binary (default: cargo build --release, then its path)
#   CASE_TIMEOUT       bound of every process, seconds (default 120; ib_write_lat -a takes
#                      about 40 s on a loaded 2-core machine)
#   PP_ITERS           pingpong iterations up to 64 KiB (default 200; 50 above)
#   ALL_ITERS          perftest -n with -a (default 20; perftest's minimum is 5)
#   DEFAULT_ITERS      perftest -n for the other cases (default: perftest's own, 5000/1000)
#   PORT_BASE          first TCP port of the exchanges (default 19100; one per case)
#   PERF_ROUNDS        interleaved rounds of perftest and softverbs perf for the table (default 3)
#
# Output: DIR (default target/ibverbs-programs) holds each process's output
# (<case>.server.out, <case>.client.out), results.tsv and summary.txt. Ends with
# "N passed, N failed, N skipped". Exit status: 0 when nothing failed, 1 a case failed, 2 bad
# usage or a missing prerequisite (library, programs).
set -uo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/target/ibverbs-programs
ONLY=""
PERF_TABLE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --no-perf-table) PERF_TABLE=0 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--out DIR] [--only REGEX] [--no-perf-table]" >&2; exit 2 ;;
  esac
  shift
done
CASE_TIMEOUT=${CASE_TIMEOUT:-120}
PP_ITERS=${PP_ITERS:-200}
ALL_ITERS=${ALL_ITERS:-20}
DEFAULT_ITERS=${DEFAULT_ITERS:-}
PORT=${PORT_BASE:-19100}
PERF_ROUNDS=${PERF_ROUNDS:-3}
for v in "$CASE_TIMEOUT" "$PP_ITERS" "$ALL_ITERS" "$PORT" "$PERF_ROUNDS" ${DEFAULT_ITERS:+"$DEFAULT_ITERS"}; do
  case "$v" in ''|*[!0-9]*) echo "ibverbs-programs: not a number: $v" >&2; exit 2 ;; esac
done
say() { printf 'ibverbs-programs: %s\n' "$*" >&2; }

# ---- prerequisites --------------------------------------------------------------------------
LIB_DIR=${SOFTVERBS_LIB_DIR:-${LIBIBVERBS_DIR:-$ROOT/target/libibverbs}}
if [ ! -f "$LIB_DIR/libibverbs.so.1" ]; then
  say "error: no libibverbs.so.1 in $LIB_DIR: build the drop-in first with"
  say "       scripts/build-libibverbs.sh --release   (or set SOFTVERBS_LIB_DIR)"
  exit 2
fi
missing=""
for p in ibv_devices ibv_devinfo ibv_rc_pingpong ibv_srq_pingpong ibv_ud_pingpong ib_write_bw ib_write_lat \
  ib_send_bw ib_send_lat ib_read_bw ib_read_lat ib_atomic_bw ib_atomic_lat; do
  command -v "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  say "error: not installed:$missing (Debian packages ibverbs-utils, perftest)"
  exit 2
fi
if [ -z "${SOFTVERBS_BIN:-}" ]; then
  say "building softverbs (release)"
  SOFTVERBS_BIN=$(cd "$ROOT" && cargo build -q --release --bin softverbs \
    --message-format=json | grep -o '"executable":"[^"]*softverbs"' |
    sed 's/^"executable":"//; s/"$//' | tail -1)
fi
BIN=${SOFTVERBS_BIN:-}
[ -n "$BIN" ] && [ -x "$BIN" ] || { say "error: no softverbs binary (set SOFTVERBS_BIN)"; exit 2; }
BIN=$(realpath "$BIN")
# Extra `softverbs exec` options of the server and client of the next pair (word-split).
SRV_EXEC_OPTS=""
CLI_EXEC_OPTS=""

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/*.out "$OUT"/*.json "$OUT/results.tsv" "$OUT/summary.txt"
: >"$OUT/results.tsv"
say "library: $LIB_DIR/libibverbs.so.1; binary: $BIN; logs: $OUT"

# ---- helpers --------------------------------------------------------------------------------
ms() { echo $(( $(date +%s%N) / 1000000 )); }
# Is a TCP socket listening on port $1 (IPv4 or IPv6)?
listening() {
  local hex
  hex=$(printf ':%04X' "$1")
  awk -v p="$hex" '$2 ~ p "$" && $4 == "0A" { f = 1 } END { exit !f }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
# The next TCP port nobody listens on.
next_port() {
  PORT=$((PORT + 1))
  while listening "$PORT"; do PORT=$((PORT + 1)); done
}
selected() { [ -z "$ONLY" ] || [[ "$1" =~ $ONLY ]]; }
# record NAME VERDICT SECONDS NOTE
record() {
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$OUT/results.tsv"
  printf '%-4s  %-44s %6ss  %s\n' "$2" "$1" "$3" "$4"
}
passed() { awk -F'\t' -v n="$1" '$1 == n && $2 == "PASS" { f = 1 } END { exit !f }' "$OUT/results.tsv"; }
elapsed() { awk -v ms=$(( $(ms) - $1 )) 'BEGIN { printf "%.1f", ms / 1000 }'; }
# The line of a program's output that says what went wrong (else its last line), short.
why_line() {
  local line
  line=$(grep -Ei -m1 "fail|couldn't|error|unable|unsupported|not supported|invalid|abort|exceeded" "$1")
  [ -n "$line" ] || line=$(tail -1 "$1")
  printf '%s' "$line" | tr -s ' \t' ' ' | cut -c1-90
}
# exit 124/137 are timeout's.
status_word() { case $1 in 124|137) echo "timed out (${CASE_TIMEOUT}s)" ;; *) echo "exit $1" ;; esac; }
# bounded "EXEC OPTIONS" PROGRAM ARGS...: the program on the drop-in, under timeout.
bounded() {
  local opts=$1
  shift
  # shellcheck disable=SC2086
  timeout -k 5 "$CASE_TIMEOUT" "$BIN" exec --lib "$LIB_DIR" $opts -- "$@" </dev/null
}

# single NAME CHECK PROGRAM ARGS...: one process; CHECK OUTFILE says whether its output is right.
single() {
  local name=$1 check=$2
  shift 2
  selected "$name" || return 0
  local t0 rc=0 why
  t0=$(ms)
  bounded "" "$@" >"$OUT/$name.out" 2>&1 || rc=$?
  if [ $rc != 0 ]; then
    why="$(status_word $rc): $(why_line "$OUT/$name.out")"
  else
    why=$("$check" "$OUT/$name.out")
  fi
  if [ -z "$why" ]; then record "$name" PASS "$(elapsed "$t0")" ""; else record "$name" FAIL "$(elapsed "$t0")" "$why"; fi
}

# run_pair SERVER_OUT CLIENT_OUT "SERVER ARGS" "CLIENT ARGS": a server, then (once it listens
# on TCP) a client, each bounded; the word @PORT in the arguments becomes a free TCP port. Sets
# PAIR_SRC and PAIR_CRC to their exit statuses (255: the client never started).
run_pair() {
  local so=$1 co=$2 srv_args cli_args srv i
  next_port
  srv_args=${3//@PORT/$PORT}
  cli_args=${4//@PORT/$PORT}
  PAIR_SRC=0
  PAIR_CRC=0
  # shellcheck disable=SC2086
  bounded "$SRV_EXEC_OPTS" $srv_args >"$so" 2>&1 &
  srv=$!
  for i in $(seq 100); do
    listening "$PORT" && break
    kill -0 "$srv" 2>/dev/null || break
    sleep 0.1
  done
  if listening "$PORT"; then
    # shellcheck disable=SC2086
    bounded "$CLI_EXEC_OPTS" $cli_args >"$co" 2>&1 || PAIR_CRC=$?
  else
    echo "(not started: the server never listened on TCP port $PORT)" >"$co"
    PAIR_CRC=255
  fi
  wait "$srv" || PAIR_SRC=$?
}

# pair NAME CHECK "SERVER ARGS" "CLIENT ARGS": one case of run_pair; CHECK SERVER_OUT
# CLIENT_OUT prints what is wrong (nothing when both outputs are right).
pair() {
  local name=$1 check=$2 t0 why="" so=$OUT/$1.server.out co=$OUT/$1.client.out
  selected "$name" || return 0
  t0=$(ms)
  run_pair "$so" "$co" "$3" "$4"
  if calibration_failed "$so" "$co"; then
    # perftest times itself with the TSC and gives up when its own calibration against the
    # clock is too noisy (a loaded CI machine): that run says nothing about the emulator.
    echo "!!! RETRY $name: perftest's CPU-clock calibration failed (r^2 < 0.9); running it again" >&2
    run_pair "$so" "$co" "$3" "$4"
  fi
  if [ $PAIR_SRC != 0 ] || [ $PAIR_CRC != 0 ]; then
    why="server $(status_word $PAIR_SRC): $(why_line "$so") | client $(status_word $PAIR_CRC): $(why_line "$co")"
  else
    why=$("$check" "$so" "$co")
  fi
  if [ -z "$why" ]; then record "$name" PASS "$(elapsed "$t0")" ""; else record "$name" FAIL "$(elapsed "$t0")" "$why"; fi
}

# True if perftest on either side stopped on its own clock calibration ("Correlation
# coefficient r^2: … < 0.9", then "Can't produce a report"), not on the device.
calibration_failed() {
  grep -q "Can't produce a report" "$1" "$2" 2>/dev/null &&
    grep -q 'Correlation coefficient r^2' "$1" "$2" 2>/dev/null
}

skip() {
  selected "$1" || return 0
  record "$1" SKIP 0.0 "$2"
}

# ---- output checks --------------------------------------------------------------------------
check_devices() {
  grep -Eq '^[[:space:]]+softverbs0[[:space:]]+[0-9a-f]{16}[[:space:]]*$' "$1" ||
    echo "softverbs0 with a 16-digit node GUID not listed"
}
check_devinfo() {
  local f=$1 want
  for want in 'hca_id:[[:space:]]+softverbs0' 'transport:[[:space:]]+InfiniBand' \
    'state:[[:space:]]+PORT_ACTIVE' 'link_layer:[[:space:]]+Ethernet' \
    'GID\[ *0\]:[[:space:]]+::ffff:127\.[0-9]+\.[0-9]+\.[0-9]+'; do
    grep -Eq "$want" "$f" || { echo "no /$want/"; return; }
  done
}
# check_pingpong SIZE ITERS SERVER_OUT CLIENT_OUT
check_pingpong() {
  local size=$1 iters=$2 f bytes n
  for f in "$3" "$4"; do
    bytes=$(sed -nE 's/^([0-9]+) bytes in [0-9.]+ seconds = [0-9.]+ Mbit\/sec$/\1/p' "$f")
    n=$(sed -nE 's/^([0-9]+) iters in [0-9.]+ seconds = [0-9.]+ usec\/iter$/\1/p' "$f")
    if [ "$bytes" != $((2 * size * iters)) ] || [ "$n" != "$iters" ]; then
      echo "$(basename "$f"): want $((2 * size * iters)) bytes / $iters iters, got '${bytes}' / '${n}'"
      return
    fi
  done
}
# perftest result rows of a file: BW rows have 5 numbers, latency rows 9 (perftest's own
# t_stdev arithmetic prints -nan now and then).
perf_rows() {
  awk '/#bytes/ { on = 1; next }
    on && /^[ \t]*[0-9]+([ \t]+([0-9.]+|-?nan|-?inf))+[ \t]*$/' "$1" | tr -s ' \t' ' '
}
# check_perftest KIND ROWS SERVER_OUT CLIENT_OUT: KIND bw|lat, ROWS expected on the client.
check_perftest() {
  local kind=$1 want=$2 rows fields bad
  rows=$(perf_rows "$4")
  fields=5
  [ "$kind" = lat ] && fields=9
  if [ "$(printf '%s' "$rows" | grep -c .)" != "$want" ]; then
    echo "client: want $want result rows, got $(printf '%s' "$rows" | grep -c .)"
    return
  fi
  # Every row: the right number of columns, iterations > 0, a message rate (BW; the MiB/s
  # columns print 0.00 for 2-byte messages) or t_avg (latency) > 0.
  bad=$(printf '%s\n' "$rows" | awk -v n="$fields" -v kind="$kind" '
    NF != n || $2 <= 0 || (kind == "bw" && $5 <= 0) || (kind == "lat" && $6 <= 0) { print; exit }')
  [ -z "$bad" ] || echo "client: bad row: $bad"
}
pp_iters() { if [ "$1" -le 65536 ]; then echo "$PP_ITERS"; else echo 50; fi; }

# ---- the cases ------------------------------------------------------------------------------
T0=$(ms)
echo "== devices"
single ibv_devices check_devices ibv_devices
single ibv_devinfo-v check_devinfo ibv_devinfo -v

echo "== pingpong (64 B … 1 MiB)"
for prog in ibv_rc_pingpong ibv_srq_pingpong; do
  for ev in "" "-e"; do
    for size in 64 256 1024 4096 16384 65536 262144 1048576; do
      n=$(pp_iters "$size")
      chk() { check_pingpong "$size" "$n" "$1" "$2"; }
      args="$prog -g 0 -p @PORT -s $size -n $n $ev"
      pair "$prog${ev:+-e}-$size" chk "$args" "$args 127.0.0.1"
    done
  done
done

echo "== UD pingpong (64 B … the 4096-byte MTU payload)"
for ev in "" "-e"; do
  for size in 64 1024 2048 4096; do
    n=$PP_ITERS
    chk() { check_pingpong "$size" "$n" "$1" "$2"; }
    args="ibv_ud_pingpong -g 0 -c -p @PORT -s $size -n $n $ev"
    pair "ibv_ud_pingpong${ev:+-e}-$size" chk "$args" "$args 127.0.0.1"
  done
done

echo "== faults and capture through softverbs exec (--faults, --pcap)"
# Each side drops 2 % of the datagrams it sends and captures its traffic: RC recovers, both
# pcaps hold packets.
printf 'seed = 14\n[[rule]]\naction = "drop"\nprobability = 0.02\n' >"$OUT/loss.toml"
rm -f "$OUT"/pingpong-loss.*.pcap
check_loss() {
  local why f
  why=$(check_pingpong 4096 200 "$1" "$2")
  [ -z "$why" ] || { echo "$why"; return; }
  for f in "$OUT/pingpong-loss.server.pcap" "$OUT/pingpong-loss.client.pcap"; do
    # A pcap header is 24 bytes; 400 packets of 4 KiB are far more.
    [ "$(stat -c %s "$f" 2>/dev/null || echo 0)" -gt 100000 ] || { echo "$(basename "$f") too small"; return; }
  done
}
SRV_EXEC_OPTS="--faults $OUT/loss.toml --pcap $OUT/pingpong-loss.server.pcap"
CLI_EXEC_OPTS="--faults $OUT/loss.toml --pcap $OUT/pingpong-loss.client.pcap"
args="ibv_rc_pingpong -g 0 -p @PORT -s 4096 -n 200"
pair ibv_rc_pingpong-loss-pcap check_loss "$args" "$args 127.0.0.1"
SRV_EXEC_OPTS=""
CLI_EXEC_OPTS=""

echo "== perftest RC"
PERFTEST_DEFAULT=()
for t in write_bw write_lat send_bw send_lat read_bw read_lat atomic_bw atomic_lat; do
  kind=${t#*_}
  for variant in default all old; do
    name="ib_$t-$variant"
    case $variant in
      default) flags=${DEFAULT_ITERS:+-n $DEFAULT_ITERS}; rows=1 ;;
      all) flags="-a -n $ALL_ITERS"; rows=23 ;;
      old) flags="--use_old_post_send${DEFAULT_ITERS:+ -n $DEFAULT_ITERS}"; rows=1 ;;
    esac
    if [ "$variant" = all ] && [ "${t%_*}" = atomic ]; then
      skip "$name" "perftest 4.5 refuses -a for atomics ('Message size cannot be changed for Atomic tests')"
      continue
    fi
    chk() { check_perftest "$kind" "$rows" "$1" "$2"; }
    pair "$name" chk "ib_$t -p @PORT $flags" "ib_$t -p @PORT $flags 127.0.0.1"
    if [ "$variant" = default ] && passed "$name"; then
      PERFTEST_DEFAULT+=("$t")
    fi
  done
done

echo "== perftest UD"
for t in send_bw send_lat; do
  kind=${t#*_}
  for variant in default all; do
    name="ib_$t-ud-$variant"
    case $variant in
      default) flags=${DEFAULT_ITERS:+-n $DEFAULT_ITERS}; rows=1 ;;
      all) flags="-a -n $ALL_ITERS"; rows=12 ;;
    esac
    chk() { check_perftest "$kind" "$rows" "$1" "$2"; }
    pair "$name" chk "ib_$t -c UD -p @PORT $flags" "ib_$t -c UD -p @PORT $flags 127.0.0.1"
  done
done
say "cases done in $(elapsed "$T0") s"

# ---- perftest next to softverbs perf --------------------------------------------------------
# PERF_ROUNDS interleaved rounds: perftest (default flags; round 1 is the case above), then
# `softverbs perf` with the same test, size and iterations; medians (min-max) of the rounds.
if [ "$PERF_TABLE" = 1 ] && [ ${#PERFTEST_DEFAULT[@]} -gt 0 ]; then
  echo "== perftest (drop-in) next to softverbs perf: same test, size, iterations; $PERF_ROUNDS rounds"
  rm -f "$OUT"/perf-*.json "$OUT"/perf-*.out "$OUT"/ib_*-round*.out
  for r in $(seq 1 "$PERF_ROUNDS"); do
    for t in "${PERFTEST_DEFAULT[@]}"; do
      row=$(perf_rows "$OUT/ib_$t-default.client.out" | head -1)
      [ -n "$row" ] || continue
      read -r size iters _ <<<"$row"
      if [ "$r" -gt 1 ]; then
        run_pair "$OUT/ib_$t-round$r.server.out" "$OUT/ib_$t-round$r.client.out" \
          "ib_$t -p @PORT ${DEFAULT_ITERS:+-n $DEFAULT_ITERS}" \
          "ib_$t -p @PORT ${DEFAULT_ITERS:+-n $DEFAULT_ITERS} 127.0.0.1"
      fi
      timeout -k 5 "$CASE_TIMEOUT" "$BIN" perf "$t" -s "$size" -n "$iters" \
        --json "$OUT/perf-$t.$r.json" >"$OUT/perf-$t.$r.out" 2>&1 </dev/null ||
        say "softverbs perf $t failed (see $OUT/perf-$t.$r.out)"
    done
  done
  python3 - "$OUT" "$PERF_ROUNDS" "${PERFTEST_DEFAULT[@]}" <<'EOF' | tee "$OUT/perf-table.txt"
import json, re, statistics, sys
out, rounds, tests = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ROW = re.compile(r"^[ \t]*(\d+(?:[ \t]+(?:[\d.]+|-?nan|-?inf))+)[ \t]*$", re.M)
def perftest_row(path):
    try:
        rows = ROW.findall(open(path).read().split("#bytes", 1)[-1])
    except OSError:
        return None
    return [float(x) for x in rows[0].split()] if rows else None
def ours_row(path):
    try:
        return json.load(open(path))["rows"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return None
def fmt(vals):
    if not vals:
        return "failed"
    return f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"
print(f"{'test':<11} {'bytes':>7} {'iters':>5}  {'figure':<16} {'perftest: median (min-max)':>28}"
      f" {'softverbs perf: median (min-max)':>33} {'ratio':>6}")
for t in tests:
    files = [f"{out}/ib_{t}-default.client.out"]
    files += [f"{out}/ib_{t}-round{r}.client.out" for r in range(2, rounds + 1)]
    theirs_rows = [r for r in map(perftest_row, files) if r]
    if not theirs_rows:
        print(f"{t:<11} (no perftest result)")
        continue
    ours_rows = [r for r in (ours_row(f"{out}/perf-{t}.{r}.json") for r in range(1, rounds + 1)) if r]
    if t.endswith("_bw"):
        label = "BW avg [MiB/s]"
        theirs = [r[3] for r in theirs_rows]
        ours = [r["bw_average"] for r in ours_rows]
    else:
        label = "t_typical [usec]"
        theirs = [r[4] for r in theirs_rows]
        ours = [r["latency"]["t_typical"] for r in ours_rows]
    ratio = f"{statistics.median(theirs) / statistics.median(ours):.2f}" if ours else "-"
    first = theirs_rows[0]
    print(f"{t:<11} {int(first[0]):>7} {int(first[1]):>5}  {label:<16} {fmt(theirs):>28}"
          f" {fmt(ours):>33} {ratio:>6}")
EOF
fi

# ---- summary --------------------------------------------------------------------------------
{
  echo "== pingpong figures (client)"
  for f in "$OUT"/ibv_*pingpong*.client.out; do
    [ -e "$f" ] || continue
    line=$(grep -E 'iters in .* usec/iter' "$f" | head -1)
    [ -n "$line" ] && printf '%-34s %s\n' "$(basename "$f" .client.out)" "$line"
  done
  echo
  echo "== perftest result rows (client), every case"
  for f in "$OUT"/ib_*.client.out; do
    [ -e "$f" ] || continue
    rows=$(perf_rows "$f")
    [ -n "$rows" ] || continue
    echo "$(basename "$f" .client.out):"
    printf '%s\n' "$rows" | sed 's/^/  /'
  done
  echo
  awk -F'\t' '{ printf "%-4s  %-44s %6ss  %s\n", $2, $1, $3, $4 }' "$OUT/results.tsv"
  awk -F'\t' '$2 == "PASS" { p++ } $2 == "FAIL" { f++ } $2 == "SKIP" { s++ }
    END { printf "%d passed, %d failed, %d skipped\n", p, f, s }' "$OUT/results.tsv"
} >"$OUT/summary.txt"
sed -n '/^== perftest result rows/,/^$/p' "$OUT/summary.txt"
tail -1 "$OUT/summary.txt"
say "total $(elapsed "$T0") s; logs in $OUT"
if awk -F'\t' '$2 == "FAIL" { bad = 1 } END { exit !bad }' "$OUT/results.tsv"; then exit 1; fi
exit 0
