#!/usr/bin/env bash
# Mutation testing of the RC engine and the wire codec (emu/proto/src/rc, emu/proto/src/wire)
# against emu-proto's own tests, with cargo-mutants (configuration: .cargo/mutants.toml).
#
#   scripts/mutants.sh                 # every mutant (about 1,100)
#   scripts/mutants.sh --shard K/N     # the K-th of N consecutive slices (K from 0)
#   scripts/mutants.sh --file PATH     # only the mutants of one source file (repeatable)
#   scripts/mutants.sh --in-diff FILE  # only mutants in the lines a diff touches
#   scripts/mutants.sh --iterate ...   # skip the mutants the last run of the same tag caught
#   scripts/mutants.sh --ci            # CI's bounded step, below
#
# Results in target/mutants/<tag>/mutants.out (caught.txt, missed.txt, timeout.txt,
# unviable.txt); the last line printed is the score: caught / (caught + missed). The copy
# cargo-mutants builds in goes under $TMPDIR (needs ~1 GiB); run it under `nice` on a shared
# machine. Survivors judged harmless are listed, with the reason, in .cargo/mutants-survivors.md.
#
# --ci: the mutants in the lines `git diff ${MUTANTS_BASE:-HEAD~1}..HEAD` changes under
# emu/proto/src/{rc,wire}, bounded by ${MUTANTS_TIMEOUT:-600} s. With CI=true it mutates the
# checkout in place (building it once with the `mutants` profile; the tree is restored
# afterwards) and installs cargo-mutants if missing. Exit codes: 0 every mutant in the
# diff caught (or listed as harmless); 1 a missed mutant not listed in
# .cargo/mutants-survivors.md, or a failure of the run; 2 cargo-mutants missing (outside CI);
# 3 skipped or cut short: the diff touches neither directory, or the time bound cut the run
# (the mutants tested by then were still checked) -- the reason is the last line on stderr
# and in target/mutants/ci/skipped.txt, for CI's summary.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SURVIVORS=.cargo/mutants-survivors.md
ENGINE=(emu/proto/src/rc emu/proto/src/wire)

need_cargo_mutants() {
  command -v cargo-mutants >/dev/null && return 0
  if [ "${CI:-}" = true ]; then
    cargo install cargo-mutants --locked
  else
    echo "mutants: cargo-mutants is not installed (cargo install cargo-mutants --locked)" >&2
    exit 2
  fi
}

count() {
  local n=0
  [ ! -f "$1/mutants.out/$2" ] || n=$(grep -c . "$1/mutants.out/$2") || true
  echo "${n:-0}"
}

# Prints the score line of the run whose output is in $1.
score() {
  local caught missed timeout unviable
  caught=$(count "$1" caught.txt); missed=$(count "$1" missed.txt)
  timeout=$(count "$1" timeout.txt); unviable=$(count "$1" unviable.txt)
  echo "mutants ($2): caught $caught, missed $missed, timeout $timeout, unviable $unviable;" \
    "score $caught/$((caught + missed))"
}

# The missed mutants of the run in $1 that .cargo/mutants-survivors.md does not list. A
# survivor is listed by its name without the line and column (`file: replace a with b in f`),
# so that the list survives edits elsewhere in the file, once per surviving instance: the k-th
# missed mutant of a name needs k entries. `\|` in the table stands for `|`.
unlisted() {
  [ -f "$1/mutants.out/missed.txt" ] || return 0
  local listed name seen=""
  listed=$(sed 's/\\|/|/g' "$SURVIVORS" 2>/dev/null || true)
  while IFS= read -r line; do
    name=$(sed -E 's/^([^:]+):[0-9]+:[0-9]+: /\1: /' <<<"$line")
    seen+="$name"$'\n'
    if [ "$(grep -cxF -- "$name" <<<"$seen")" -gt "$(grep -cF -- "\`$name\`" <<<"$listed")" ]; then
      echo "$line"
    fi
  done <"$1/mutants.out/missed.txt"
}

# The reason a CI run was skipped or cut: on stderr, and in a file for CI's summary.
skip() {
  mkdir -p target/mutants/ci
  echo "$1" >target/mutants/ci/skipped.txt
  echo "mutants: SKIPPED: $1" >&2
  exit 3
}

ci() {
  local base=${MUTANTS_BASE:-HEAD~1} limit=${MUTANTS_TIMEOUT:-600}
  local out=target/mutants/ci diff
  rm -rf "$out"
  mkdir -p "$out"
  diff="$ROOT/$out/engine.diff"
  if ! git rev-parse --verify -q "$base^{commit}" >/dev/null; then
    skip "mutation testing: the base $base is not in this checkout (a shallow clone?)"
  fi
  git diff "$base"..HEAD -- "${ENGINE[@]}" >"$diff"
  if [ ! -s "$diff" ]; then
    skip "mutation testing: $base..HEAD changes nothing under emu/proto/src/rc or emu/proto/src/wire"
  fi
  need_cargo_mutants
  local mode=()
  if [ "${CI:-}" = true ]; then
    # The checkout is CI's own: mutate it in place. The `mutants` profile's first build costs
    # about 90 s more than reusing the test build of the step before, but each mutant's tests
    # then run in ~1 s instead of ~9 s.
    mode=(--in-place)
  fi
  echo "mutants: the mutants in $base..HEAD under emu/proto/src/{rc,wire}, at most ${limit}s"
  # The workspace tests passed in the step before (no baseline run); a mutant whose tests run
  # over 120 s counts as a timeout (caught), as cargo-mutants counts a hang.
  local rc=0
  timeout --signal=INT --kill-after=30 "$limit" \
    cargo mutants --no-shuffle --in-diff "$diff" --baseline skip --timeout 120 \
    --build-timeout 600 "${mode[@]}" -o "$out" || rc=$?
  if [ "${CI:-}" = true ]; then
    if ! git diff --quiet -- "${ENGINE[@]}"; then
      echo "mutants: a mutation was left in the tree: restoring it" >&2
      git checkout -- "${ENGINE[@]}"
    fi
    # Property tests that failed on a mutant recorded it next to the tests: not a real failure.
    git ls-files --others --exclude-standard -- 'emu/proto/*.proptest-regressions' | xargs -r rm -f
  fi
  score "$out" "in diff $base..HEAD"
  local bad
  bad=$(unlisted "$out")
  if [ -n "$bad" ]; then
    echo "mutants: FAILED: missed, and not listed as harmless in $SURVIVORS:" >&2
    echo "$bad" | sed 's/^/  /' >&2
    exit 1
  fi
  case $rc in
    0 | 2 | 3) ;;
    124 | 130 | 137)
      local tested total
      tested=$(cat "$out"/mutants.out/{caught,missed,timeout,unviable}.txt 2>/dev/null | grep -c . || true)
      total=$(cargo mutants --list --in-diff "$diff" 2>/dev/null | grep -c . || true)
      skip "mutation testing cut at ${limit}s: $tested of $total mutants in $base..HEAD tested (none missed)"
      ;;
    *) echo "mutants: cargo mutants exited $rc" >&2; exit "$rc" ;;
  esac
}

# The option handling; everything runs inside functions, so that an error in an expansion ends
# the script instead of falling through to the next command.
main() {
  local tag=all f out rc bad
  local args=() files=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --shard) args+=(--shard "$2"); tag=shard-${2/\//-of-}; shift ;;
      --file) files+=("$2"); tag=$(basename "${2%.rs}"); shift ;;
      --in-diff) args+=(--in-diff "$2"); tag=diff; shift ;;
      --iterate) args+=(--iterate) ;;
      --ci) ci; return 0 ;;
      *) echo "usage: $0 [--shard K/N] [--file PATH]... [--in-diff FILE] [--iterate] | --ci" >&2; exit 2 ;;
    esac
    shift
  done
  # cargo-mutants ignores --file when the configuration names examine_globs: exclude the other
  # engine files instead.
  if [ ${#files[@]} -gt 0 ]; then
    [ ${#files[@]} -eq 1 ] || tag=files
    while IFS= read -r f; do
      [[ " ${files[*]} " == *" $f "* ]] || args+=(--exclude "$f")
    done < <(git ls-files -- 'emu/proto/src/rc/*.rs' 'emu/proto/src/wire/*.rs')
  fi
  need_cargo_mutants
  out=target/mutants/$tag
  mkdir -p "$out"
  rc=0
  cargo mutants --no-shuffle "${args[@]}" -o "$out" || rc=$?
  # 0: all caught; 2: some missed; 3: some timed out. Anything else is a failure of the run.
  case $rc in 0|2|3) ;; *) echo "mutants: cargo mutants exited $rc" >&2; exit "$rc" ;; esac
  bad=$(unlisted "$out")
  [ -z "$bad" ] || { echo "missed and not listed in $SURVIVORS:"; echo "$bad" | sed 's/^/  /'; }
  score "$out" "$tag"
}

main "$@"
