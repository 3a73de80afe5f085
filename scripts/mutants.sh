#!/usr/bin/env bash
# Mutation testing of the RC engine and the wire codec (emu/proto/src/rc, emu/proto/src/wire)
# against emu-proto's own tests, with cargo-mutants (configuration: .cargo/mutants.toml).
#
#   scripts/mutants.sh                 # every mutant (about 1,100; ~7 s each on 2 cores)
#   scripts/mutants.sh --shard K/N     # the K-th of N shards (K from 0), as cargo-mutants splits
#   scripts/mutants.sh --in-diff FILE  # only mutants in the lines a diff touches
#
# Results in target/mutants/<shard>/mutants.out (caught.txt, missed.txt, timeout.txt,
# unviable.txt); the last line printed is the score: caught / (caught + missed).
# Needs cargo-mutants (`cargo install cargo-mutants --locked`).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
command -v cargo-mutants >/dev/null || { echo "mutants: cargo-mutants is not installed" >&2; exit 2; }
tag=all
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --shard) args+=(--shard "$2"); tag=shard-${2/\//-of-}; shift ;;
    --in-diff) args+=(--in-diff "$2"); tag=diff; shift ;;
    *) echo "usage: $0 [--shard K/N] [--in-diff FILE]" >&2; exit 2 ;;
  esac
  shift
done
out=target/mutants/$tag
mkdir -p "$out"
rc=0
cargo mutants --no-shuffle "${args[@]}" -o "$out" || rc=$?
# 0: all caught; 2: some missed; 3: some timed out. Anything else is a failure of the run.
case $rc in 0|2|3) ;; *) echo "mutants: cargo mutants exited $rc" >&2; exit "$rc" ;; esac
count() { [ -f "$out/mutants.out/$1" ] && grep -c . "$out/mutants.out/$1" || echo 0; }
caught=$(count caught.txt); missed=$(count missed.txt)
timeout=$(count timeout.txt); unviable=$(count unviable.txt)
echo "mutants ($tag): caught $caught, missed $missed, timeout $timeout, unviable $unviable;" \
  "score $caught/$((caught + missed))"
