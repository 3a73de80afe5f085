#!/usr/bin/env bash
# The README's performance table: each figure measured RUNS times (default 5), interleaved, with
# `softverbs perf --json`, reported as median (min–max) of ours ÷ the same-run raw UDP baseline.
#
#   scripts/perf-table.sh [RUNS]        (needs a release build: cargo build --release)
#   SUMMARY_ONLY=1 scripts/perf-table.sh [RUNS]   (re-print the table from the last runs' JSON)
#
# Figures: 64 KiB WRITE bandwidth (GSO→GRO baseline), 8 B WRITE latency blocking and busy-poll
# (each against raw UDP ping-pong in the same poll mode), 8 B SEND message rate (`-e`), the
# in-process 8 B WRITE rate (no baseline: ops/s), and goodput at 1 % loss ÷ lossless at the QP
# timeouts 14 (67 ms, perftest's default) and 10 (4.2 ms). Raw JSON goes to target/perf-table/.
set -euo pipefail
export LC_ALL=C
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/target/release/softverbs
RUNS=${1:-5}
OUT=$ROOT/target/perf-table
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }
command -v python3 >/dev/null || { echo "needs python3 (JSON summaries)" >&2; exit 1; }
if [ -z "${SUMMARY_ONLY:-}" ]; then
rm -rf "$OUT"
mkdir -p "$OUT"

run() { # name, perf arguments...
  local name=$1
  shift
  "$BIN" perf "$@" --json "$OUT/$name.$i.json" >"$OUT/$name.$i.log" 2>&1 ||
    echo "run $i of $name failed (see $OUT/$name.$i.log)" >&2
}

for i in $(seq 1 "$RUNS"); do
  echo "round $i of $RUNS" >&2
  run bw64k write_bw -s 65536 -n 5000 --baseline
  run lat write_lat -s 8 -n 10000 --baseline
  run latbusy write_lat -s 8 -n 10000 --baseline --busy-poll
  run sendbw send_bw -s 8 -n 200000 --baseline -e
  run inproc write_bw --backend inproc -s 8 -n 1000000
  run loss0 write_bw -s 65536 -n 3000
  run loss1 write_bw -s 65536 -n 3000 --loss 0.01
  run loss0u10 write_bw -s 65536 -n 3000 -u 10
  run loss1u10 write_bw -s 65536 -n 3000 -u 10 --loss 0.01
done
fi

python3 - "$OUT" "$RUNS" <<'EOF'
import json, statistics, sys, glob, os
out, runs = sys.argv[1], int(sys.argv[2])
def rows(name):
    res = []
    for i in range(1, runs + 1):
        p = os.path.join(out, f"{name}.{i}.json")
        try:
            res.append(json.load(open(p))["rows"][0])
        except (OSError, ValueError, KeyError, IndexError):
            res.append(None)
    return res
def fmt(vals, unit=""):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "n/a"
    def g(v):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return f"{g(statistics.median(vals))}{unit} ({g(min(vals))}–{g(max(vals))})"
def field(name, f):
    return [f(r) if r else None for r in rows(name)]
print(f"| figure | softverbs | raw UDP (same run) | ratio, median (min–max) of {runs} | target |")
print("|---|---|---|---|---|")
print("| 64 KiB WRITE bandwidth | " + fmt(field("bw64k", lambda r: r["bw_average"]), " MiB/s")
      + " | " + fmt(field("bw64k", lambda r: r["bw_average"] / r["ratio"] if r.get("ratio") else None), " MiB/s")
      + " GSO→GRO | " + fmt(field("bw64k", lambda r: r.get("ratio"))) + " | ≥ 0.8 |")
for name, label in (("lat", "blocking"), ("latbusy", "busy-poll")):
    print(f"| 8 B WRITE latency, {label} | " + fmt(field(name, lambda r: r["latency"]["t_typical"]), " µs")
          + " | " + fmt(field(name, lambda r: r["baseline"]["t_typical"] if r.get("baseline") else None), " µs")
          + " | " + fmt(field(name, lambda r: r.get("ratio"))) + " | ≤ 1.25 |")
print("| 8 B SEND message rate (`-e`) | " + fmt(field("sendbw", lambda r: r["msg_rate_mpps"]), " Mpps")
      + " | " + fmt(field("sendbw", lambda r: r["msg_rate_mpps"] / r["ratio"] if r.get("ratio") else None), " M/s")
      + " GSO→GRO | " + fmt(field("sendbw", lambda r: r.get("ratio"))) + " | ≥ 0.6 |")
print("| in-process 8 B WRITE, one thread | " + fmt(field("inproc", lambda r: r["msg_rate_mpps"]), " M/s")
      + " | — | — | ≥ 2 M/s |")
for suffix, label in (("", "timeout 14 (67 ms)"), ("u10", "timeout 10 (4.2 ms)")):
    lossless = field("loss0" + suffix, lambda r: r["bw_average"])
    lossy = field("loss1" + suffix, lambda r: r["bw_average"])
    ratio = [b / a if a and b else None for a, b in zip(lossless, lossy)]
    print(f"| goodput at 1 % loss ÷ lossless, {label} | " + fmt(lossy, " MiB/s") + " vs "
          + fmt(lossless, " MiB/s") + " | — | " + fmt(ratio) + " | ≥ 0.5 |")
EOF
