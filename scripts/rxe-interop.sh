#!/usr/bin/env bash
# Wire interop: softverbs' UDP device on the host (in the rxe-vm namespace, 10.99.0.1:4791)
# against Linux SoftRoCE (rxe0 in the rxe-vm guest, 10.99.0.2), over real RoCEv2 packets.
#
#   scripts/rxe-interop.sh [--out DIR] [--sizes "64 1024 4096 10000"] [--ud-sizes "64 512 1024"]
#                          [--iters N] [--no-capture] [--no-dropin] [--cm-only]
#
# One VM boot runs, in this order:
#   (i) host `softverbs cm-probe` (emu-cm on the UDP device's GSI, QP1) sends a REQ for an
#       rdma_cm service nobody listens on to rxe0's QP1; the guest's kernel CM must answer REJ
#       reason 8 (invalid service ID); then a REQ to the guest's `rping -s` (rdma_cm TCP port 7174)
#       must get the kernel's REP (which cm-probe then rejects): check cm-rep
#   (j) unmodified `rping -v -C 100` both roles over the drop-ins (librdmacm.so.1 and
#       libibverbs.so.1 on the host, softverbs0 on HOST_IP:4791) against the guest's rping on the
#       kernel's rdma_cm: rping-guest-client (the kernel CM's REQ to our listener: we accept),
#       then rping-host-client (our REQ to the kernel's listener: it accepts); each needs 100
#       "ping data" lines on both sides and both exits 0. Then ucmatose the same way
#       (ucmatose-guest-client, ucmatose-host-client: both exit 0 with "return status 0"),
#       then `ib_write_bw -R -n 200` (write-bw-R-guest-client, write-bw-R-host-client: both
#       exit 0 with a result row; the host's server binds the wildcard, so softverbs0 is put
#       on HOST_IP with SOFTVERBS_UDP_ADDRS), then `ib_send_lat -R -n 200` the same way
#       (send-lat-R-guest-client, send-lat-R-host-client). perftest 4.5 (Debian 12) connects
#       its data QP right after a handshake on its first connection, and its server listens for
#       it only after that handshake: a server slower than the client's REQ refuses it (REJ,
#       invalid service ID), and 4.5's own retry reuses the ids it has just destroyed (fixed in
#       later perftest) and gives up. So our client's CM MADs take a 100 ms slower path (an
#       emu-fault delay rule, SOFTVERBS_FAULTS), and each perftest role gets up to 6 attempts (a server waits
#       60 s for its client at the first, 20 s at later ones), attempt k on
#       port BASE+100k on both sides in step; the logs say which attempt passed.
#       Run with (i), also under --cm-only; SKIP with a note without
#       scripts/build-librdmacm.sh's library or the host's rping (rdmacm-utils)
#   (a) guest `ibv_rc_pingpong` client  vs host `softverbs pingpong` server, for each size
#   (b) guest `ibv_rc_pingpong` server  vs host `softverbs pingpong` client, for each size
#   (c) `softverbs rdma-check` with the host (udp provider) as server and the guest (hw provider,
#       libibverbs on rxe0, GID index 1) as client: RDMA WRITE and READ-back of 8 B..64 KiB,
#       WRITE_WITH_IMM and SEND_WITH_IMM, FETCH_ADD and CMP_SWAP, in both directions, verified on
#       both sides, and the host device's ICRC drop counter checked to be 0
#   (d) `softverbs icrc-check` on a capture of the tap (dumpcap): the ICRC of every packet in both
#       directions verified over its real IPv4/UDP headers (a UDP socket cannot see rxe's IPv4
#       identification, which the ICRC covers; the capture can)
#   (e) guest `ibv_ud_pingpong` client  vs host `softverbs ud-pingpong` server, for each UD size
#   (f) guest `ibv_ud_pingpong` server  vs host `softverbs ud-pingpong` client, for each UD size
#   (g) guest `ibv_ud_pingpong` client  vs host `ibv_ud_pingpong` server on the drop-in
#       libibverbs.so.1 (unmodified Debian binary), for each UD size
#   (h) guest `ibv_ud_pingpong` server  vs host `ibv_ud_pingpong` client on the drop-in
#   (g) and (h) need the drop-in (scripts/build-libibverbs.sh; LIBIBVERBS_DIR overrides its
#   directory) and Debian's ibverbs-utils on the host; without them they are SKIP with a note.
#   UD loses what the network loses: a lost datagram stalls a pingpong (bounded by timeouts).
# The guest runs the same `softverbs` binary (copied with --add; libibverbs is dlopened).
#
#   --out DIR   logs: rxe.log (guest console and [host] lines), rxe-vm.stderr, summary.txt
#               (default: target/rxe-interop)
#   --sizes     pingpong message sizes (default "64 1024 4096 10000": below, at and above the
#               1024-byte MTU)
#   --ud-sizes  UD pingpong message sizes (default "64 512 1024": up to rxe0's 1024-byte MTU,
#               which bounds a UD message)
#   --iters N   pingpong iterations per size (default 200)
#   --no-dropin skip (g) and (h)
#   --cm-only   run (i) and (j) only (the tap capture is kept for reading; (d) is skipped)
#   --no-capture  skip the tap capture (DIR/tap.pcap) and check (d); without dumpcap (package
#               wireshark-common, which tshark pulls in) (d) is skipped with a note
#
# Needs what `rxe-vm run` needs (root, /dev/net/tun, the Debian mirror for the first `build`).
# Environment: RXE_VM (the rxe-vm tool; default ../shared/rxe-vm/rxe-vm next to the repository),
# RXE_VM_TIMEOUT (VM time bound, default 600 s), RXE_VM_NS (namespace, default rxe-vm),
# CARGO_PROFILE_ARGS (e.g. --release).
#
# Prints PASS/FAIL per check. Exit status: 0 when every check passed, 1 otherwise.
set -euo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RXE_VM=${RXE_VM:-$ROOT/../shared/rxe-vm/rxe-vm}
OUT=$ROOT/target/rxe-interop
SIZES="64 1024 4096 10000"
UD_SIZES="64 512 1024"
ITERS=200
PCAP=1
DROPIN=1
CM_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift ;;
    --sizes) SIZES=$2; shift ;;
    --ud-sizes) UD_SIZES=$2; shift ;;
    --no-dropin) DROPIN=0 ;;
    --iters) ITERS=$2; shift ;;
    --no-capture) PCAP=0 ;;
    --cm-only) CM_ONLY=1 ;;
    *) echo "usage: $0 [--out DIR] [--sizes \"S1 S2 ...\"] [--ud-sizes \"S1 S2 ...\"] [--iters N] [--no-capture] [--no-dropin] [--cm-only]" >&2; exit 2 ;;
  esac
  shift
done
if [ "$CM_ONLY" = 1 ]; then SIZES="" UD_SIZES="" DROPIN=0; fi
for s in $SIZES $UD_SIZES $ITERS; do
  case "$s" in ''|*[!0-9]*) echo "rxe-interop: not a number: $s" >&2; exit 2 ;; esac
done
# TCP ports: (a) 18515 + i, (b) 18535 + i, (c) 18600, (e) 18640 + i, (f) 18660 + i,
# (g) 18680 + i, (h) 18720 + i.
[ "$(echo $SIZES | wc -w)" -le 20 ] || { echo "rxe-interop: at most 20 sizes" >&2; exit 2; }
[ "$(echo $UD_SIZES | wc -w)" -le 20 ] || { echo "rxe-interop: at most 20 UD sizes" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/host-*.log "$OUT/tap.pcap"
say() { printf 'rxe-interop: %s\n' "$*" >&2; }

cd "$ROOT"
say "building softverbs ${CARGO_PROFILE_ARGS:-(debug)}"
# shellcheck disable=SC2086
BIN=$(cargo build -p softverbs-cli --bin softverbs ${CARGO_PROFILE_ARGS:-} --message-format=json |
  grep -o '"executable":"[^"]*softverbs"' | sed 's/^"executable":"//; s/"$//' | tail -1)
[ -n "$BIN" ] && [ -x "$BIN" ] || { say "could not locate the softverbs binary"; exit 1; }
if ldd "$BIN" | grep -q libibverbs; then
  say "error: $BIN links libibverbs; it must only dlopen it"
  exit 1
fi
[ -x "$RXE_VM" ] || { say "rxe-vm not found at $RXE_VM (set RXE_VM)"; exit 1; }
say "binary: $BIN"
LIB_DIR=${LIBIBVERBS_DIR:-$ROOT/target/libibverbs}
DROPIN_NOTE=""
if [ "$DROPIN" = 1 ]; then
  if [ ! -f "$LIB_DIR/libibverbs.so.1" ]; then
    DROPIN=0 DROPIN_NOTE="no $LIB_DIR/libibverbs.so.1 (scripts/build-libibverbs.sh)"
  elif ! command -v ibv_ud_pingpong >/dev/null 2>&1; then
    DROPIN=0 DROPIN_NOTE="no ibv_ud_pingpong on the host (Debian package ibverbs-utils)"
  else
    LIB_DIR=$(cd "$LIB_DIR" && pwd)
  fi
else
  DROPIN_NOTE="--no-dropin"
fi
[ -z "$DROPIN_NOTE" ] || say "note: (g) and (h) skipped: $DROPIN_NOTE"
RDMACM=1
RDMACM_DIR=${LIBIBVERBS_DIR:-$ROOT/target/libibverbs}
if [ ! -f "$RDMACM_DIR/librdmacm.so.1" ] || [ ! -f "$RDMACM_DIR/libibverbs.so.1" ]; then
  RDMACM=0; say "note: (j) skipped: no $RDMACM_DIR/librdmacm.so.1 (scripts/build-librdmacm.sh)"
elif ! command -v rping >/dev/null 2>&1; then
  RDMACM=0; say "note: (j) skipped: no rping on the host (Debian package rdmacm-utils)"
else
  RDMACM_DIR=$(cd "$RDMACM_DIR" && pwd)
fi
if [ "$PCAP" = 1 ] && ! command -v dumpcap >/dev/null 2>&1; then
  say "note: dumpcap not found (tshark's wireshark-common): no tap capture, check (d) skipped"
  PCAP=0
fi

GUEST_BIN=/root/softverbs
PP_TIMEOUT=30          # bound of each ibv_rc_pingpong in the guest (rxe retries forever)
CHECK_TIMEOUT=120      # bound of the guest's rdma-check

# ---- host side: runs inside the namespace, in $OUT -------------------------------------------
host_script=$OUT/host.sh
cat >"$host_script" <<EOF
BIN='$BIN'
SIZES='$SIZES'
UD_SIZES='$UD_SIZES'
ITERS=$ITERS
PCAP=$PCAP
DROPIN=$DROPIN
LIB_DIR='$LIB_DIR'
PP_TIMEOUT=$PP_TIMEOUT
CM_ONLY=$CM_ONLY
RDMACM=$RDMACM
RDMACM_DIR='$RDMACM_DIR'
EOF
cat >>"$host_script" <<'EOF'
export SOFTVERBS_PROVIDER=udp
# --timeout: stall bound once connected; --connect-timeout: waiting for / retrying the peer.
COMMON="--bind $HOST_IP:4791 -g 0 --timeout 15 --connect-timeout 120"
ms() { echo $(( $(date +%s%N) / 1000000 )); }
# Runs "$@", prints its output and one "@@HOST <check> PASS|FAIL <seconds>" line.
check() {
  local name=$1; shift
  local t0 rc=0 dt
  t0=$(ms)
  "$@" >"host-$name.log" 2>&1 || rc=$?
  sed "s/^/$name: /" "host-$name.log"
  dt=$(awk -v ms=$(( $(ms) - t0 )) 'BEGIN { printf "%.1f", ms / 1000 }')
  if [ $rc = 0 ]; then echo "@@HOST $name PASS ${dt}s"; else echo "@@HOST $name FAIL ${dt}s (exit $rc)"; fi
}
cap=""
if [ "$PCAP" = 1 ]; then
  # Classic pcap (-P) of everything to UDP 4791 on the tap, full frames.
  dumpcap -q -P -i "$RXE_VM_TAP" -f 'udp dst port 4791' -w tap.pcap >dumpcap.log 2>&1 &
  cap=$!
  for _ in $(seq 50); do [ -s tap.pcap ] && break; sleep 0.1; done
fi
# (i) a REQ from our CM to rxe0's QP1 for an unlistened service: REJ reason 8. The guest's
# clients of (a) retry meanwhile.
until [ -e "$RXE_VM_READY" ]; do sleep 0.1; done
check cm-reject "$BIN" cm-probe --bind "$HOST_IP:4791" --expect-reject 8 --timeout 60 "$GUEST_IP"
check cm-rep "$BIN" cm-probe --bind "$HOST_IP:4791" --port 7174 --expect-rep --timeout 60 "$GUEST_IP"
# (j) rping, ucmatose and ib_write_bw -R on the drop-ins against the guest's on the kernel's
# rdma_cm, both roles.
pings_ok() { # rc output-file: exit 0 and 100 pings printed (-v: "[server ]ping data")
  cat "$2"
  [ "$1" = 0 ] && [ "$(grep -c 'ping data' "$2")" = 100 ]
}
rping_server() {
  local rc=0
  timeout 150 rping -s -v -C 100 -a "$HOST_IP" -p 7175 >rping-s.out 2>&1 || rc=$?
  pings_ok "$rc" rping-s.out
}
rping_client() { # retries while the guest's server does not listen yet (REJ 8 / unreachable)
  local rc try=0
  while :; do
    rc=0
    timeout 60 rping -c -v -C 100 -a "$GUEST_IP" -p 7176 >rping-c.out 2>&1 || rc=$?
    if [ $rc != 0 ] && ! grep -q 'ping data' rping-c.out && [ $try -lt 400 ]; then
      try=$((try + 1)); sleep 0.5; continue
    fi
    pings_ok "$rc" rping-c.out
    return
  done
}
ucmatose_server() {
  local rc=0
  timeout 120 ucmatose -b "$HOST_IP" -p 7177 >ucmatose-s.out 2>&1 || rc=$?
  cat ucmatose-s.out
  [ $rc = 0 ] && grep -q 'return status 0' ucmatose-s.out
}
ucmatose_client() { # retries while the guest's server does not listen yet
  local rc try=0
  while :; do
    rc=0
    timeout 60 ucmatose -s "$GUEST_IP" -p 7178 >ucmatose-c.out 2>&1 || rc=$?
    if [ $rc != 0 ] && ! grep -q 'receiving data transfers' ucmatose-c.out && [ $try -lt 400 ]; then
      try=$((try + 1)); sleep 0.5; continue
    fi
    cat ucmatose-c.out
    [ $rc = 0 ] && grep -q 'return status 0' ucmatose-c.out
    return
  done
}
BW_ROW='^ *[0-9]+ +[0-9]+ '
perftest_r_server() { # PROGRAM BASEPORT OUT: perftest binds the wildcard, so softverbs0 is on
  # HOST_IP by SOFTVERBS_UDP_ADDRS; passes on exit 0 with a result row, in one of 6 attempts
  local rc k t
  for k in 0 1 2 3 4 5; do
    rc=0
    t=20; [ $k = 0 ] && t=60
    timeout $t "$1" -R -p $(($2 + 100 * k)) -n 200 >"$3" 2>&1 || rc=$?
    cat "$3"
    if [ $rc = 0 ] && grep -Eq "$BW_ROW" "$3"; then echo "attempt $((k + 1)) passed"; return 0; fi
    echo "attempt $((k + 1)) failed: exit $rc"
  done
  return 1
}
# Our client's CM MADs (to QP1) take a path 100 ms slower (an emu-fault delay rule): the
# emulated guest's perftest server, listening for the data connection only after the handshake,
# missed our REQ in 1 to 3 of every 4 attempts without it under load (perftest 4.5's race above).
printf 'seed = 1\n[[rule]]\naction = "delay"\nqpn = 1\nmin = "100ms"\nmax = "100ms"\n' >cm-delay.toml
perftest_r_client() { # PROGRAM BASEPORT OUT: retries while the guest's server does not listen
  # yet (its first connection refused); a later failure moves on to the next attempt's port
  local rc k try
  for k in 0 1 2 3 4 5; do
    try=0
    while :; do
      rc=0
      SOFTVERBS_FAULTS=$PWD/cm-delay.toml timeout 60 "$1" -R -p $(($2 + 100 * k)) -n 200 \
        "$GUEST_IP" >"$3" 2>&1 || rc=$?
      if [ $rc = 0 ] && grep -Eq "$BW_ROW" "$3"; then
        cat "$3"; echo "attempt $((k + 1)) passed"; return 0
      fi
      if grep -q 'Unable to init the socket connection' "$3" && [ $try -lt 200 ]; then
        try=$((try + 1)); sleep 0.5; continue
      fi
      cat "$3"; echo "attempt $((k + 1)) failed: exit $rc"; break
    done
  done
  return 1
}
if [ "$RDMACM" = 1 ]; then
  # SOFTVERBS_DEBUG: the CM events in the host logs.
  export LD_LIBRARY_PATH=$RDMACM_DIR SOFTVERBS_UDP_ADDRS=$HOST_IP:4791 SOFTVERBS_FOREIGN_IPV4_IDENT=1
  export SOFTVERBS_DEBUG=1
  check rping-guest-client rping_server
  check rping-host-client rping_client
  check ucmatose-guest-client ucmatose_server
  check ucmatose-host-client ucmatose_client
  check write-bw-R-guest-client perftest_r_server ib_write_bw 7179 bw-s.out
  check write-bw-R-host-client perftest_r_client ib_write_bw 7180 bw-c.out
  check send-lat-R-guest-client perftest_r_server ib_send_lat 7181 lat-s.out
  check send-lat-R-host-client perftest_r_client ib_send_lat 7182 lat-c.out
  unset LD_LIBRARY_PATH SOFTVERBS_UDP_ADDRS SOFTVERBS_FOREIGN_IPV4_IDENT SOFTVERBS_DEBUG
fi
[ "$CM_ONLY" = 0 ] || exit 0
# (a) the guest's ibv_rc_pingpong connects to us; one server per size, each on its own port.
i=0
for s in $SIZES; do
  check "pingpong-guest-client-$s" "$BIN" pingpong $COMMON -e -p $((18515 + i)) -s "$s" -n "$ITERS"
  i=$((i + 1))
done
# (b) we connect to the guest's ibv_rc_pingpong servers (retrying until each listens).
until [ -e "$RXE_VM_READY" ]; do sleep 0.1; done
i=0
for s in $SIZES; do
  check "pingpong-host-client-$s" "$BIN" pingpong $COMMON -e -p $((18535 + i)) -s "$s" -n "$ITERS" "$GUEST_IP"
  i=$((i + 1))
done
# (c) rdma-check: we serve, the guest (hw provider on rxe0) connects.
check rdma-check "$BIN" rdma-check $COMMON -p 18600
# (e) the guest's ibv_ud_pingpong connects to our ud-pingpong servers.
i=0
for s in $UD_SIZES; do
  check "ud-pingpong-guest-client-$s" "$BIN" ud-pingpong $COMMON -e -p $((18640 + i)) -s "$s" -n "$ITERS"
  i=$((i + 1))
done
# (f) our ud-pingpong connects to the guest's ibv_ud_pingpong servers.
i=0
for s in $UD_SIZES; do
  check "ud-pingpong-host-client-$s" "$BIN" ud-pingpong $COMMON -e -p $((18660 + i)) -s "$s" -n "$ITERS" "$GUEST_IP"
  i=$((i + 1))
done
# (g), (h): Debian's ibv_ud_pingpong on the drop-in libibverbs.so.1 (softverbs0 on HOST_IP:4791).
# dropin_client ARGS...: retries while the guest's server does not listen yet.
dropin_client() {
  local try=0 rc
  while :; do
    rc=0
    timeout "$PP_TIMEOUT" ibv_ud_pingpong "$@" >dropin.out 2>&1 || rc=$?
    if [ $rc != 0 ] && grep -q "Couldn't connect" dropin.out && [ $try -lt 300 ]; then
      try=$((try + 1)); sleep 0.2; continue
    fi
    cat dropin.out
    return $rc
  done
}
if [ "$DROPIN" = 1 ]; then
  export LD_LIBRARY_PATH=$LIB_DIR SOFTVERBS_UDP_ADDRS=$HOST_IP:4791 SOFTVERBS_FOREIGN_IPV4_IDENT=1
  DROPIN_ARGS="-d softverbs0 -g 0"
  i=0
  for s in $UD_SIZES; do
    check "dropin-ud-pingpong-guest-client-$s" timeout "$PP_TIMEOUT" ibv_ud_pingpong $DROPIN_ARGS -p $((18680 + i)) -s "$s" -n "$ITERS"
    i=$((i + 1))
  done
  i=0
  for s in $UD_SIZES; do
    check "dropin-ud-pingpong-host-client-$s" dropin_client $DROPIN_ARGS -p $((18720 + i)) -s "$s" -n "$ITERS" "$GUEST_IP"
    i=$((i + 1))
  done
  unset LD_LIBRARY_PATH SOFTVERBS_UDP_ADDRS SOFTVERBS_FOREIGN_IPV4_IDENT
fi
if [ -n "$cap" ]; then sleep 1; kill "$cap" 2>/dev/null || true; wait "$cap" 2>/dev/null || true; fi
exit 0
EOF

# ---- guest side: busybox sh in the VM ------------------------------------------------------
guest_script=$OUT/guest.sh
cat >"$guest_script" <<EOF
SIZES='$SIZES'
UD_SIZES='$UD_SIZES'
DROPIN=$DROPIN
ITERS=$ITERS
B=$GUEST_BIN
PP_TIMEOUT=$PP_TIMEOUT
CHECK_TIMEOUT=$CHECK_TIMEOUT
CM_ONLY=$CM_ONLY
RDMACM=$RDMACM
EOF
cat >>"$guest_script" <<'EOF'
cd /root
# Readiness: rxe0 is ACTIVE, but the first modify_qp(RTR) towards the host can fail while the
# neighbour is unresolved; one ping settles it.
i=0
until ping -c 1 -W 1 "$HOST_IP" >/dev/null 2>&1; do
  i=$((i + 1)); [ $i -ge 30 ] && { echo "@@GUEST-NOTE host does not answer ping"; break; }
  sleep 0.5
done
verdict() { # name rc
  if [ "$2" = 0 ]; then echo "@@GUEST $1 PASS"; else echo "@@GUEST $1 FAIL (exit $2)"; fi
}
# (i) the kernel CM (ib_cm) answers on rxe0's QP1 once loaded; the host's REQ retries meanwhile.
modprobe ib_cm 2>/dev/null
[ -d /sys/module/ib_cm ]
verdict cm-reject $?
# The listener of cm-rep: rping's server accepts the host's REQ (a REP), then sees the REJ.
timeout 30 rping -s -a "$GUEST_IP" -p 7174 -C 1 -v >rping.out 2>&1
rc=$?
sed 's/^/guest cm-rep: /' rping.out
# rping's server exits non-zero once the client's REJ aborts the connection: any exit short of
# the timeout (124) means it listened and answered.
[ $rc != 124 ]
verdict cm-rep $?
# (j) our rping server first (the kernel CM resends its REQ until the host listens; rping is
# retried if it gives up), then the guest's server for our client.
if [ "$RDMACM" = 1 ]; then
  try=0
  while :; do
    timeout 30 rping -c -v -C 100 -a "$HOST_IP" -p 7175 >rping.out 2>&1
    rc=$?
    sed "s/^/guest rping-guest-client: /" rping.out
    if [ $rc != 0 ] && ! grep -q 'ping data' rping.out && [ $try -lt 2 ]; then
      try=$((try + 1)); echo "guest rping-guest-client: exit $rc, retrying"; sleep 1; continue
    fi
    break
  done
  [ $rc = 0 ] && [ "$(grep -c 'ping data' rping.out)" = 100 ]
  verdict rping-guest-client $?
  timeout 120 rping -s -v -C 100 -a "$GUEST_IP" -p 7176 >rping.out 2>&1
  rc=$?
  sed 's/^/guest rping-host-client: /' rping.out
  [ $rc = 0 ] && [ "$(grep -c 'ping data' rping.out)" = 100 ]
  verdict rping-host-client $?
  # ucmatose: the guest's client against our server, then our client against the guest's.
  try=0
  while :; do
    timeout 30 ucmatose -s "$HOST_IP" -p 7177 >ucm.out 2>&1
    rc=$?
    sed "s/^/guest ucmatose-guest-client: /" ucm.out
    if [ $rc != 0 ] && ! grep -q 'receiving data transfers' ucm.out && [ $try -lt 2 ]; then
      try=$((try + 1)); echo "guest ucmatose-guest-client: exit $rc, retrying"; sleep 1; continue
    fi
    break
  done
  [ $rc = 0 ] && grep -q 'return status 0' ucm.out
  verdict ucmatose-guest-client $?
  timeout 120 ucmatose -b "$GUEST_IP" -p 7178 >ucm.out 2>&1
  rc=$?
  sed 's/^/guest ucmatose-host-client: /' ucm.out
  [ $rc = 0 ] && grep -q 'return status 0' ucm.out
  verdict ucmatose-host-client $?
  # perftest -R, both roles, as the host does: up to 6 attempts, attempt k on BASE+100k.
  BW_ROW='^ *[0-9]+ +[0-9]+ '
  perftest_r_client() { # NAME PROGRAM BASEPORT: retries while our server does not listen yet
    for k in 0 1 2 3 4 5; do
      try=0
      while :; do
        timeout 60 "$2" -R -d "$RXE_DEV" -p $(($3 + 100 * k)) -n 200 "$HOST_IP" >pt.out 2>&1
        rc=$?
        sed "s/^/guest $1: /" pt.out
        [ $rc = 0 ] && grep -Eq "$BW_ROW" pt.out && { echo "guest $1: attempt $((k + 1)) passed"; return 0; }
        if grep -q 'Unable to init the socket connection' pt.out && [ $try -lt 120 ]; then
          try=$((try + 1)); sleep 1; continue
        fi
        echo "guest $1: attempt $((k + 1)) failed: exit $rc"; break
      done
    done
    return 1
  }
  perftest_r_server() { # NAME PROGRAM BASEPORT
    for k in 0 1 2 3 4 5; do
      t=20; [ $k = 0 ] && t=60
      timeout $t "$2" -R -d "$RXE_DEV" -p $(($3 + 100 * k)) -n 200 >pt.out 2>&1
      rc=$?
      sed "s/^/guest $1: /" pt.out
      [ $rc = 0 ] && grep -Eq "$BW_ROW" pt.out && { echo "guest $1: attempt $((k + 1)) passed"; return 0; }
      echo "guest $1: attempt $((k + 1)) failed: exit $rc"
    done
    return 1
  }
  perftest_r_client write-bw-R-guest-client ib_write_bw 7179
  verdict write-bw-R-guest-client $?
  perftest_r_server write-bw-R-host-client ib_write_bw 7180
  verdict write-bw-R-host-client $?
  perftest_r_client send-lat-R-guest-client ib_send_lat 7181
  verdict send-lat-R-guest-client $?
  perftest_r_server send-lat-R-host-client ib_send_lat 7182
  verdict send-lat-R-host-client $?
fi
if [ "$CM_ONLY" = 1 ]; then sleep 20; echo "guest rxe0 counters:"; counters; exit 0; fi
# (a) guest client -> host server; retry while the host's server for this size is not listening.
n=0
for s in $SIZES; do
  port=$((18515 + n)); try=0
  while :; do
    timeout $PP_TIMEOUT ibv_rc_pingpong -d "$RXE_DEV" -g "$GID_INDEX" -s "$s" -n "$ITERS" -p $port "$HOST_IP" >pp.out 2>&1
    rc=$?
    if [ $rc != 0 ] && grep -q "Couldn't connect" pp.out && [ $try -lt 300 ]; then
      try=$((try + 1)); sleep 0.2; continue
    fi
    break
  done
  sed "s/^/guest pingpong-guest-client-$s: /" pp.out
  verdict "pingpong-guest-client-$s" $rc
  n=$((n + 1))
done
# (b) guest server <- host client.
n=0
for s in $SIZES; do
  port=$((18535 + n))
  timeout $PP_TIMEOUT ibv_rc_pingpong -d "$RXE_DEV" -g "$GID_INDEX" -s "$s" -n "$ITERS" -p $port >pp.out 2>&1
  rc=$?
  sed "s/^/guest pingpong-host-client-$s: /" pp.out
  verdict "pingpong-host-client-$s" $rc
  n=$((n + 1))
done
# (c) rdma-check on libibverbs (rxe0, GID index 1) against the host's UDP device.
timeout $CHECK_TIMEOUT $B rdma-check --provider hw -d "$RXE_DEV" -g "$GID_INDEX" -p 18600 --timeout 20 --connect-timeout 60 --seed 2 "$HOST_IP" >rc.out 2>&1
rc=$?
sed 's/^/guest rdma-check: /' rc.out
verdict rdma-check $rc
# ud_client NAME PORT SIZE: the guest's ibv_ud_pingpong client, retrying until the host listens.
ud_client() {
  try=0
  while :; do
    timeout $PP_TIMEOUT ibv_ud_pingpong -d "$RXE_DEV" -g "$GID_INDEX" -s "$3" -n "$ITERS" -p "$2" "$HOST_IP" >pp.out 2>&1
    rc=$?
    if [ $rc != 0 ] && grep -q "Couldn't connect" pp.out && [ $try -lt 300 ]; then
      try=$((try + 1)); sleep 0.2; continue
    fi
    break
  done
  sed "s/^/guest $1: /" pp.out
  verdict "$1" $rc
}
# ud_server NAME PORT SIZE: the guest's ibv_ud_pingpong server.
ud_server() {
  timeout $PP_TIMEOUT ibv_ud_pingpong -d "$RXE_DEV" -g "$GID_INDEX" -s "$3" -n "$ITERS" -p "$2" >pp.out 2>&1
  rc=$?
  sed "s/^/guest $1: /" pp.out
  verdict "$1" $rc
}
# (e) guest UD client -> host softverbs ud-pingpong server; (f) the reverse.
n=0
for s in $UD_SIZES; do ud_client "ud-pingpong-guest-client-$s" $((18640 + n)) "$s"; n=$((n + 1)); done
n=0
for s in $UD_SIZES; do ud_server "ud-pingpong-host-client-$s" $((18660 + n)) "$s"; n=$((n + 1)); done
# (g), (h): the same against the host's ibv_ud_pingpong on the drop-in.
if [ "$DROPIN" = 1 ]; then
  n=0
  for s in $UD_SIZES; do ud_client "dropin-ud-pingpong-guest-client-$s" $((18680 + n)) "$s"; n=$((n + 1)); done
  n=0
  for s in $UD_SIZES; do ud_server "dropin-ud-pingpong-host-client-$s" $((18720 + n)) "$s"; n=$((n + 1)); done
fi
echo "guest rxe0 counters:"; counters
exit 0
EOF

say "running (i) CM REJ, (a) guest client / host server, (b) host client / guest server for sizes $SIZES, (c) rdma-check, (e)-(h) UD for sizes $UD_SIZES"
t0=$(date +%s)
set +e
(cd "$OUT" && "$RXE_VM" run --timeout "${RXE_VM_TIMEOUT:-600}" --add "$BIN:$GUEST_BIN" \
  --host-cmd "bash $host_script" "$guest_script") >"$OUT/rxe.log" 2>"$OUT/rxe-vm.stderr"
vm_rc=$?
set -e
say "rxe-vm exit $vm_rc after $(( $(date +%s) - t0 )) s ($(tail -1 "$OUT/rxe-vm.stderr"))"

# ---- verdicts: a check passes when both sides say PASS ----------------------------------------
tr -d '\r' <"$OUT/rxe.log" >"$OUT/rxe.clean.log"
checks="cm-reject cm-rep"
[ "$RDMACM" = 0 ] || checks="$checks rping-guest-client rping-host-client ucmatose-guest-client ucmatose-host-client write-bw-R-guest-client write-bw-R-host-client send-lat-R-guest-client send-lat-R-host-client"
for s in $SIZES; do checks="$checks pingpong-guest-client-$s"; done
for s in $SIZES; do checks="$checks pingpong-host-client-$s"; done
[ "$CM_ONLY" = 1 ] || checks="$checks rdma-check"
for s in $UD_SIZES; do checks="$checks ud-pingpong-guest-client-$s"; done
for s in $UD_SIZES; do checks="$checks ud-pingpong-host-client-$s"; done
if [ "$DROPIN" = 1 ]; then
  for s in $UD_SIZES; do checks="$checks dropin-ud-pingpong-guest-client-$s"; done
  for s in $UD_SIZES; do checks="$checks dropin-ud-pingpong-host-client-$s"; done
fi
fail=0
usec() { # log-prefix: the usec/iter figure of that pingpong run
  grep -E "^$1: [0-9]+ iters in .* usec/iter" "$OUT/rxe.clean.log" | tail -1 | sed 's/.*= //; s/ usec\/iter//'
}
{
  for c in $checks; do
    g=$(grep -E "^@@GUEST $c (PASS|FAIL)" "$OUT/rxe.clean.log" | tail -1 | cut -d' ' -f3- || true)
    h=$(grep -E "^\[host\] @@HOST $c (PASS|FAIL)" "$OUT/rxe.clean.log" | tail -1 | cut -d' ' -f4- || true)
    if [ "${g%% *}" = PASS ] && [ "${h%% *}" = PASS ]; then v=PASS; else v=FAIL; fail=1; fi
    extra=""
    case "$c" in
      pingpong-*|ud-pingpong-*|dropin-ud-pingpong-*) extra="usec/iter: softverbs $(usec "\[host\] $c" || true), rxe $(usec "guest $c" || true)" ;;
    esac
    printf '%-4s  %-36s guest: %-16s host: %-24s %s\n' "$v" "$c" "${g:-missing}" "${h:-missing}" "$extra"
  done
  [ -z "$DROPIN_NOTE" ] || echo "SKIP  dropin-ud-pingpong-*               ($DROPIN_NOTE)"
  if [ "$PCAP" = 1 ] && [ "$CM_ONLY" = 0 ]; then
    # Every data packet of (a)-(c) and its ACK: thousands; fewer means the capture missed them.
    if "$BIN" icrc-check --min-packets 1000 "$OUT/tap.pcap" >"$OUT/icrc-check.log" 2>&1; then
      v=PASS
    else
      v=FAIL
    fi
    printf '%-4s  %-28s %s\n' "$v" "wire-icrc" "every packet on the tap, both directions ($OUT/tap.pcap)"
    sed 's/^/  /' "$OUT/icrc-check.log"
  else
    echo "SKIP  wire-icrc                    (no capture, or --cm-only)"
  fi
  echo
  echo "rdma-check, host side (udp provider):"
  grep -E '^\[host\] rdma-check: (PASS|FAIL|rdma-check:|device counters|socket:)' "$OUT/rxe.clean.log" |
    sed 's/^\[host\] rdma-check: /  /' || true
  echo "rdma-check, guest side (hw provider, rxe0):"
  grep -E '^guest rdma-check: (PASS|FAIL|rdma-check:)' "$OUT/rxe.clean.log" | sed 's/^guest rdma-check: /  /' || true
  failed_logs=$(grep -lE '^(softverbs (pingpong|ud-pingpong|rdma-check):|FAIL)' "$OUT"/host-*.log 2>/dev/null || true)
  if [ -n "$failed_logs" ]; then
    echo "host errors:"
    grep -hE 'softverbs (pingpong|ud-pingpong|rdma-check):|FAIL|device counters' $failed_logs | sed 's/^/  /' || true
  fi
} >"$OUT/summary.txt"
cat "$OUT/summary.txt"
if grep -q '^FAIL  ' "$OUT/summary.txt"; then fail=1; fi
if [ "$vm_rc" != 0 ] && [ $fail = 0 ]; then
  say "rxe-vm exited $vm_rc although every check passed"
  fail=1
fi
if [ $fail = 0 ]; then say "PASS: every check passed (logs in $OUT)"; else say "FAIL (logs in $OUT)"; fi
exit $fail
