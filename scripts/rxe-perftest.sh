#!/usr/bin/env bash
# Unmodified perftest between softverbs and Linux SoftRoCE: Debian's perftest on the host runs on
# the drop-in libibverbs.so.1 (softverbs' UDP device at 10.99.0.1:4791, in the rxe-vm namespace),
# the guest's perftest on rxe0 (10.99.0.2, GID index 1); perftest's own TCP exchange, real RoCEv2.
#
#   scripts/rxe-perftest.sh [--out DIR] [--tests "PROG..."] [--bw-iters N] [--lat-iters N]
#                           [--qp-timeout N] [--no-pcap]
#
# One VM boot runs, in this order (each program bounded by `timeout`), for each perftest program
# (default: ib_write_bw ib_send_lat):
#   host-server-*: the host's program as server, the guest's as client, for each program
#   guest-server-*: the guest's program as server, the host's as client, for each program
# Both sides use -m 1024 (rxe0's active MTU; the tap's is 1500), -u 18 (QP timeout 1.07 s, see
# --qp-timeout) and a TCP port of their own per run. A run passes when both programs exit 0 and
# the client printed perftest's result row.
#
#   --out DIR      logs: rxe.log (guest console and [host] lines), rxe-vm.stderr, host-*.log,
#                  host-*.pcap (the drop-in's capture, SOFTVERBS_PCAP; retransmissions in it are
#                  counted by scripts/roce-retransmits.py), summary.txt
#                  (default target/rxe-perftest)
#   --tests LIST   the perftest RC programs to run (ib_{write,send,read,atomic}_{bw,lat})
#   --bw-iters N   -n of the *_bw programs (default 200), --lat-iters N  of the *_lat (default 100)
#   --qp-timeout N perftest -u on both sides (default 18: 4.096 us * 2^18 = 1.07 s). perftest's
#                  own default, 14 (67 ms), is shorter than the stalls of a TCG guest on a busy
#                  host, and rxe (kernel 6.1) then retransmits; one such go-back-N retry of an
#                  RDMA WRITE already acknowledged in part was seen to resend it shifted by one
#                  PSN (a zero-length WRITE ONLY first), which the responder must NAK as an
#                  invalid request: a flaky rxe failure, not an interop one. 14 reproduces it.
#   --no-pcap      no SOFTVERBS_PCAP capture on the host
#
# Needs the drop-in (scripts/build-libibverbs.sh → target/libibverbs; LIBIBVERBS_DIR overrides),
# Debian's perftest on the host, and what `rxe-vm run` needs (root, /dev/net/tun).
# Environment: RXE_VM (default ../shared/rxe-vm/rxe-vm), RXE_VM_TIMEOUT (default 600 s),
# RXE_VM_NS (default rxe-vm), PERFTEST_TIMEOUT (bound of one perftest program, default 120 s).
# Prints PASS/FAIL per run and the numbers. Exit status: 0 when every run passed, 1 otherwise,
# 2 bad usage or a missing prerequisite.
set -euo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RXE_VM=${RXE_VM:-$ROOT/../shared/rxe-vm/rxe-vm}
OUT=$ROOT/target/rxe-perftest
TESTS="ib_write_bw ib_send_lat"
BW_ITERS=200
LAT_ITERS=100
QP_TIMEOUT=18
PCAP=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift ;;
    --tests) TESTS=$2; shift ;;
    --bw-iters) BW_ITERS=$2; shift ;;
    --lat-iters) LAT_ITERS=$2; shift ;;
    --qp-timeout) QP_TIMEOUT=$2; shift ;;
    --no-pcap) PCAP=0 ;;
    *) echo "usage: $0 [--out DIR] [--tests \"PROG...\"] [--bw-iters N] [--lat-iters N] [--qp-timeout N] [--no-pcap]" >&2; exit 2 ;;
  esac
  shift
done
for n in "$BW_ITERS" "$LAT_ITERS" "$QP_TIMEOUT"; do
  case "$n" in ''|*[!0-9]*) echo "rxe-perftest: not a number: $n" >&2; exit 2 ;; esac
done
[ "$BW_ITERS" -ge 5 ] && [ "$LAT_ITERS" -ge 5 ] ||
  { echo "rxe-perftest: perftest needs at least 5 iterations" >&2; exit 2; }
[ "$QP_TIMEOUT" -le 31 ] || { echo "rxe-perftest: --qp-timeout is 0..31" >&2; exit 2; }
say() { printf 'rxe-perftest: %s\n' "$*" >&2; }
LIB_DIR=${LIBIBVERBS_DIR:-$ROOT/target/libibverbs}
[ -f "$LIB_DIR/libibverbs.so.1" ] ||
  { say "no $LIB_DIR/libibverbs.so.1: run scripts/build-libibverbs.sh first"; exit 2; }
LIB_DIR=$(cd "$LIB_DIR" && pwd)
[ -x "$RXE_VM" ] || { say "rxe-vm not found at $RXE_VM (set RXE_VM)"; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/host-*.log "$OUT"/host-*.pcap "$OUT/summary.txt"
T=${PERFTEST_TIMEOUT:-120}

# Runs, one a line: name:program:flags:TCP port. Host servers first, then guest servers.
RUNS="" i=0
for role in host-server guest-server; do
  for prog in $TESTS; do
    case $prog in
      ib_write_bw|ib_send_bw|ib_read_bw|ib_atomic_bw) n=$BW_ITERS ;;
      ib_write_lat|ib_send_lat|ib_read_lat|ib_atomic_lat) n=$LAT_ITERS ;;
      *) say "not a perftest RC program: $prog"; exit 2 ;;
    esac
    command -v "$prog" >/dev/null || { say "no $prog on the host (Debian package perftest)"; exit 2; }
    RUNS="$RUNS${RUNS:+
}$role-${prog#ib_}:$prog:-n $n -u $QP_TIMEOUT:$((18700 + i))"
    i=$((i + 1))
  done
done
[ $i -le 40 ] || { say "at most 20 programs"; exit 2; }
NRUNS=$i

# Shared by both sides (bash on the host, busybox sh in the guest): run one perftest program
# and print its output prefixed and a verdict line; a client retries while it cannot connect
# (the server does not listen yet), up to 300 times.
common=$OUT/common.sh
cat >"$common" <<EOF
RUNS='$RUNS'
T=$T
EOF
cat >>"$common" <<'EOF'
# perftest's stdout is a file: line-buffer it where stdbuf exists (the host), so that a program
# ended by timeout still shows how far it got.
LINEBUF=""
command -v stdbuf >/dev/null 2>&1 && LINEBUF="stdbuf -oL"
# perf SIDE NAME RETRY PROGRAM ARGS...: output to NAME.out, then "@@<SIDE> NAME PASS|FAIL"
perf() {
  side=$1 name=$2 retry=$3; shift 3
  try=0
  while :; do
    timeout "$T" $LINEBUF "$@" </dev/null >"$name.out" 2>&1
    rc=$?
    if [ $rc != 0 ] && [ "$retry" = 1 ] && grep -q "Couldn't connect" "$name.out" && [ $try -lt 300 ]; then
      try=$((try + 1)); sleep 0.3; continue
    fi
    break
  done
  sed "s/^/$side $name: /" "$name.out"
  if [ $rc = 0 ]; then echo "@@$side $name PASS"; else echo "@@$side $name FAIL (exit $rc, $try retries)"; fi
}
EOF

host_script=$OUT/host.sh
cat >"$host_script" <<EOF
. '$common'
export LD_LIBRARY_PATH='$LIB_DIR'
PCAP=$PCAP
EOF
cat >>"$host_script" <<'EOF'
export SOFTVERBS_UDP_ADDRS=$HOST_IP:4791 SOFTVERBS_FOREIGN_IPV4_IDENT=1 SOFTVERBS_DEBUG=1
echo "$RUNS" | while IFS=: read -r name prog args port; do
  [ "$PCAP" = 1 ] && export SOFTVERBS_PCAP=$PWD/host-$name.pcap
  # ib_write_lat waits on memory, not on a completion: the drop-in's progress threads must spin.
  case $prog in ib_write_lat) export SOFTVERBS_BUSY_POLL=1 ;; *) unset SOFTVERBS_BUSY_POLL ;; esac
  case $name in
    host-server-*) perf HOST "$name" 0 $prog -d softverbs0 -x 0 -m 1024 -F $args -p $port ;;
    *) until [ -e "$RXE_VM_READY" ]; do sleep 0.1; done
       perf HOST "$name" 1 $prog -d softverbs0 -x 0 -m 1024 -F $args -p $port "$GUEST_IP" ;;
  esac
  cp "$name.out" "host-$name.log"
done
exit 0
EOF

guest_script=$OUT/guest.sh
cat "$common" >"$guest_script"
cat >>"$guest_script" <<'EOF'
cd /root
# rxe0 is ACTIVE, but its first connection towards the host can fail while the neighbour is
# unresolved; one ping settles it.
i=0
until ping -c 1 -W 1 "$HOST_IP" >/dev/null 2>&1; do
  i=$((i + 1)); [ $i -ge 30 ] && { echo "@@GUEST-NOTE host does not answer ping"; break; }
  sleep 0.5
done
echo "$RUNS" | while IFS=: read -r name prog args port; do
  case $name in
    host-server-*) perf GUEST "$name" 1 $prog -d "$RXE_DEV" -x "$GID_INDEX" -m 1024 -F $args -p $port "$HOST_IP" ;;
    *) perf GUEST "$name" 0 $prog -d "$RXE_DEV" -x "$GID_INDEX" -m 1024 -F $args -p $port ;;
  esac
done
echo "guest rxe0 counters:"; counters
exit 0
EOF

say "running $TESTS: host server/guest client, then guest server/host client"
t0=$(date +%s)
set +e
(cd "$OUT" && "$RXE_VM" run --timeout "${RXE_VM_TIMEOUT:-600}" --host-cmd "bash $host_script" \
  "$guest_script") >"$OUT/rxe.log" 2>"$OUT/rxe-vm.stderr"
vm_rc=$?
set -e
say "rxe-vm exit $vm_rc after $(( $(date +%s) - t0 )) s ($(tail -1 "$OUT/rxe-vm.stderr"))"

# ---- verdicts --------------------------------------------------------------------------------
tr -d '\r' <"$OUT/rxe.log" >"$OUT/rxe.clean.log"
# The result row: "#bytes #iterations ..." numbers (bw: BW peak/average MB/s, MsgRate Mpps;
# lat: t_min t_max t_typical t_avg t_stdev 99% 99.9% usec).
row() { # log-prefix
  grep -E "^$1:[[:space:]]+[0-9]+[[:space:]]+[0-9]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+" "$OUT/rxe.clean.log" | tail -1 |
    sed "s/^$1: *//; s/softverbs-ibverbs: .*//" || true # the drop-in's stderr can share the line
}
head_row() { # log-prefix
  grep -E "^$1: +#bytes" "$OUT/rxe.clean.log" | tail -1 | sed "s/^$1: *//" || true
}
fail=0
{
  echo "$RUNS" | while IFS=: read -r name prog args port; do
    g=$(grep -E "^@@GUEST $name (PASS|FAIL)" "$OUT/rxe.clean.log" | tail -1 | cut -d' ' -f3- || true)
    h=$(grep -E "^\[host\] @@HOST $name (PASS|FAIL)" "$OUT/rxe.clean.log" | tail -1 | cut -d' ' -f4- || true)
    case $name in
      host-server-*) client="GUEST $name" server="\[host\] HOST $name" ;;
      *) client="\[host\] HOST $name" server="GUEST $name" ;;
    esac
    crow=$(row "$client")
    if [ "${g%% *}" = PASS ] && [ "${h%% *}" = PASS ] && [ -n "$crow" ]; then v=PASS; else v=FAIL; fi
    printf '%-4s  %-22s (%s %s)  host: %-10s guest: %s\n' "$v" "$name" "$prog" "$args" "${h:-missing}" "${g:-missing}"
    printf '      %-14s %s\n' "" "$(head_row "$client")"
    printf '      %-14s %s\n' "client row:" "${crow:-(none)}"
    srow=$(row "$server")
    [ -z "$srow" ] || printf '      %-14s %s\n' "server row:" "$srow"
  done
  echo "(host: softverbs drop-in on $LIB_DIR; guest: rxe0 under TCG: the numbers say nothing about speed)"
  if grep -q '^guest rxe0 counters' "$OUT/rxe.clean.log"; then
    echo "guest rxe0 counters:"
    sed -n '/^guest rxe0 counters:/,/@@RXE-VM EXIT/p' "$OUT/rxe.clean.log" | grep -E '^[a-z_]+=[0-9]+$' |
      sed 's/^/  /' || true
  fi
  if [ "$PCAP" = 1 ] && compgen -G "$OUT/host-*.pcap" >/dev/null; then
    echo "retransmissions in the drop-in's captures (scripts/roce-retransmits.py):"
    (cd "$OUT" && python3 "$ROOT/scripts/roce-retransmits.py" host-*.pcap) | sed 's/^/  /' || true
  fi
  errs=$(grep -hE '^softverbs|SOFTVERBS' "$OUT"/host-*.log 2>/dev/null | sort | uniq -c | head -20 || true)
  [ -z "$errs" ] || { echo "host drop-in messages:"; echo "$errs" | sed 's/^/  /'; }
} >"$OUT/summary.txt"
cat "$OUT/summary.txt"
grep -q '^FAIL  ' "$OUT/summary.txt" && fail=1
if [ "$(grep -c '^PASS  ' "$OUT/summary.txt")" != "$NRUNS" ]; then fail=1; fi
if [ "$vm_rc" != 0 ] && [ $fail = 0 ]; then
  say "rxe-vm exited $vm_rc although every run passed"
  fail=1
fi
if [ $fail = 0 ]; then say "PASS: every run passed (logs in $OUT)"; else say "FAIL (logs in $OUT)"; fi
exit $fail
