#!/usr/bin/env bash
# Unmodified rdma_cm programs on softverbs: Debian's rdmacm-utils and perftest binaries with the
# drop-in librdmacm.so.1 and libibverbs.so.1 (LD_LIBRARY_PATH, as `softverbs exec` sets it),
# server and client as two processes on loopback.
#
#   scripts/rdmacm-programs.sh [--only REGEX]
#
# Addressing: the server binds a specific loopback address (rping/ucmatose: -a/-b ADDR; perftest
# binds the wildcard, so its server gets SOFTVERBS_UDP_ADDRS=ADDR:4791); binding that address
# first in the process puts the process's device on ADDR:4791. The client's own device takes the
# zero-configuration 127.x.y.z and resolves ADDR to the server device's GID ::ffff:ADDR.
#
# Cases (PASS/FAIL on both exit codes and the output):
#   rping          rping -s -v -C 100 -a ADDR / rping -c -v -C 100 -a ADDR: the client prints
#                  100 "ping data" lines
#   ucmatose       ucmatose -b ADDR / ucmatose -s ADDR: both exit 0, "return status 0"
#   ib_write_bw-R  ib_write_bw -R (server: SOFTVERBS_UDP_ADDRS=ADDR:4791) / ib_write_bw -R ADDR
#                  (its CM MADs delayed 100 ms: perftest 4.5's connect race, below): the client
#                  prints a result row
#   ib_send_lat-R  ib_send_lat -R, as ib_write_bw -R
#   rping-loss     rping -v -C 100 through `softverbs exec --faults`: each side drops 10 % of
#                  the datagrams it sends, CM MADs included (the CM retries REQ/REP/DREQ after
#                  its timeout, RC retransmits the data): all 100 pings, both exit 0
#   ucmatose-loss  ucmatose through the same plan: both exit 0
#   ib_write_bw-R-refused  perftest 4.5's connect race, made certain: the server's second
#                  rdma_listen (its data connection's) waits 3 s (an LD_PRELOAD shim built
#                  with cc), so the client's data REQ is refused (REJ 8); perftest's retry then
#                  calls the ids and channel it destroyed. The client must end with perftest's
#                  own error (exit 1, "Failed to create RDMA CM connection"), not a signal
#                  (it crashed in rdma_destroy_id before the drop-in checked for stale ids)
#
# Needs: scripts/build-librdmacm.sh (builds both drop-ins), rdmacm-utils, perftest. Environment:
#   SOFTVERBS_LIB_DIR  directory of the drop-ins (default: $LIBIBVERBS_DIR, else target/libibverbs)
#   SOFTVERBS_BIN      the softverbs binary for the -loss cases (default: cargo build --release,
#                      then its path)
#   CASE_TIMEOUT       bound of every process, seconds (default 60)
#   PORT_BASE          first rdma_cm port (default 19700; one per case)
#   ADDR_BASE          the servers' addresses are ADDR_BASE.N (default 127.0.97)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LIB=${SOFTVERBS_LIB_DIR:-${LIBIBVERBS_DIR:-$ROOT/target/libibverbs}}
CASE_TIMEOUT=${CASE_TIMEOUT:-60}
PORT=${PORT_BASE:-19700}
ADDR_BASE=${ADDR_BASE:-127.0.97}
ONLY=.
case "${1:-}" in
  --only) ONLY=${2:?--only REGEX} ;;
  "") ;;
  *) echo "usage: $0 [--only REGEX]" >&2; exit 2 ;;
esac
for f in libibverbs.so.1 librdmacm.so.1; do
  [ -f "$LIB/$f" ] || { echo "no $f in $LIB: run scripts/build-librdmacm.sh --release" >&2; exit 2; }
done
if [ -z "${SOFTVERBS_BIN:-}" ] && [[ rping-loss =~ $ONLY || ucmatose-loss =~ $ONLY ]]; then
  SOFTVERBS_BIN=$(cd "$ROOT" && cargo build -q --release --bin softverbs \
    --message-format=json | grep -o '"executable":"[^"]*softverbs"' |
    sed 's/^"executable":"//; s/"$//' | tail -1)
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset SOFTVERBS_UDP_ADDRS SOFTVERBS_FAULTS SOFTVERBS_PCAP
PASS=0 FAIL=0 N=0

# run_case NAME CHECK SERVER_ENV SERVER_CMD :: CLIENT_CMD: server in the background, then the
# client; CHECK is a shell condition on the client's output file, $OUT.
run_case() {
  local name=$1 check=$2 senv=$3; shift 3
  local server=() client=()
  while [ "$1" != :: ]; do server+=("$1"); shift; done; shift
  client=("$@")
  [[ $name =~ $ONLY ]] || return 0
  env $senv timeout "$CASE_TIMEOUT" "${server[@]}" >"$WORK/$name.server" 2>&1 &
  local spid=$!
  sleep 1
  timeout "$CASE_TIMEOUT" "${client[@]}" >"$WORK/$name.client" 2>&1
  local crc=$?
  wait "$spid"; local src=$?
  if [ "$crc" = 0 ] && [ "$src" = 0 ] && OUT=$WORK/$name.client eval "$check"; then
    echo "PASS $name"; PASS=$((PASS + 1))
  else
    echo "FAIL $name (server exit $src, client exit $crc)"; FAIL=$((FAIL + 1))
    tail -n 5 "$WORK/$name.server" "$WORK/$name.client" | sed 's/^/    /'
  fi
}

next() { N=$((N + 1)); PORT=$((PORT + 1)); ADDR=$ADDR_BASE.$N; }

ROW='grep -Eq "^ *[0-9]+ +[0-9]+ " "$OUT"'
next; run_case rping '[ "$(grep -c "ping data" "$OUT")" = 100 ]' "" \
  rping -s -v -C 100 -a "$ADDR" -p "$PORT" :: rping -c -v -C 100 -a "$ADDR" -p "$PORT"
next; run_case ucmatose 'grep -q "return status 0" "$OUT"' "" \
  ucmatose -b "$ADDR" -p "$PORT" :: \
  ucmatose -s "$ADDR" -p "$PORT"
# perftest 4.5's connect race (the README's rdma_cm section): its client sends the data
# connection's REQ right after the handshake, and if the server does not listen for it yet, the
# REJ sends perftest's retry into the ids it destroyed (EINVAL; the -refused case below makes
# that certain). Our clients' CM MADs (to QP1) take a path 100 ms slower, as in
# scripts/rxe-interop.sh: without it, one CI run's ib_write_bw-R client lost the race.
printf 'seed = 1\n[[rule]]\naction = "delay"\nqpn = 1\nmin = "100ms"\nmax = "100ms"\n' \
  >"$WORK/cm-delay.toml"
CM_DELAY=(env "SOFTVERBS_FAULTS=$WORK/cm-delay.toml")
next; run_case ib_write_bw-R "$ROW" "SOFTVERBS_UDP_ADDRS=$ADDR:4791" \
  ib_write_bw -R -p "$PORT" :: "${CM_DELAY[@]}" ib_write_bw -R -p "$PORT" "$ADDR"
next; run_case ib_send_lat-R "$ROW" "SOFTVERBS_UDP_ADDRS=$ADDR:4791" \
  ib_send_lat -R -p "$PORT" :: "${CM_DELAY[@]}" ib_send_lat -R -p "$PORT" "$ADDR"

# 10 % loss on every datagram each side sends (its own seed per side).
loss() { printf 'seed = %s\n[[rule]]\naction = "drop"\nprobability = 0.1\n' "$2" >"$WORK/$1.toml"; }
loss server 11
loss client 12
SX=("${SOFTVERBS_BIN:-softverbs}" exec --lib "$LIB" --faults "$WORK/server.toml" --)
CX=("${SOFTVERBS_BIN:-softverbs}" exec --lib "$LIB" --faults "$WORK/client.toml" --)
next; run_case rping-loss '[ "$(grep -c "ping data" "$OUT")" = 100 ]' "" \
  "${SX[@]}" rping -s -v -C 100 -a "$ADDR" -p "$PORT" :: \
  "${CX[@]}" rping -c -v -C 100 -a "$ADDR" -p "$PORT"
next; run_case ucmatose-loss 'grep -q "return status 0" "$OUT"' "" \
  "${SX[@]}" ucmatose -b "$ADDR" -p "$PORT" :: \
  "${CX[@]}" ucmatose -s "$ADDR" -p "$PORT"

# perftest 4.5's refused data connection: a clean error, not a crash.
refused_case() {
  local name=ib_write_bw-R-refused
  [[ $name =~ $ONLY ]] || return 0
  command -v cc >/dev/null || { echo "FAIL $name (no C compiler for the shim)"; FAIL=$((FAIL + 1)); return; }
  cat >"$WORK/slowlisten.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>
struct rdma_cm_id;
/* Delays every rdma_listen after the first by 3 s: a server slower than its client. */
int rdma_listen(struct rdma_cm_id *id, int backlog) {
  static int calls;
  int (*real)(struct rdma_cm_id *, int) =
      (int (*)(struct rdma_cm_id *, int))dlsym(RTLD_NEXT, "rdma_listen");
  if (++calls >= 2) sleep(3);
  return real(id, backlog);
}
C
  cc -shared -fPIC -o "$WORK/slowlisten.so" "$WORK/slowlisten.c" -ldl || {
    echo "FAIL $name (the shim did not build)"; FAIL=$((FAIL + 1)); return; }
  env LD_PRELOAD="$WORK/slowlisten.so" SOFTVERBS_UDP_ADDRS="$ADDR:4791" timeout "$CASE_TIMEOUT" \
    ib_write_bw -R -p "$PORT" >"$WORK/$name.server" 2>&1 &
  local spid=$!
  sleep 1
  timeout "$CASE_TIMEOUT" ib_write_bw -R -p "$PORT" "$ADDR" >"$WORK/$name.client" 2>&1
  local crc=$?
  wait "$spid"
  if [ "$crc" = 1 ] && grep -q 'Failed to create RDMA CM connection' "$WORK/$name.client"; then
    echo "PASS $name (client: perftest's own error, exit 1)"; PASS=$((PASS + 1))
  else
    echo "FAIL $name (client exit $crc; 1 with perftest's error expected)"; FAIL=$((FAIL + 1))
    tail -n 5 "$WORK/$name.server" "$WORK/$name.client" | sed 's/^/    /'
  fi
}
next; refused_case

echo "rdma_cm programs: $PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
