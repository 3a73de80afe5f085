#!/usr/bin/env bash
# Runs the unsafe MR-memory code's tests (`mr-region`) under Miri, weak-memory emulation
# included, within a time bound. Usage: scripts/miri.sh [SECONDS] (default 600).
# Exit codes: 0 passed; 1 failed (or timed out); 2 the nightly toolchain or Miri is missing
# (with CI=true, said loudly on stderr).
set -euo pipefail
cd "$(dirname "$0")/.."
limit="${1:-600}"
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "scripts/miri.sh: SKIPPED: no nightly toolchain with Miri" \
        "(rustup toolchain install nightly --component miri)" >&2
    exit 2
fi
# Stacked Borrows, bounds, data races and weak memory all on; the file-mapping tests are
# ignored under Miri (it cannot map a file).
if ! timeout --signal=KILL "$limit" cargo +nightly miri test -p mr-region; then
    echo "scripts/miri.sh: FAILED (or ran over ${limit}s)" >&2
    exit 1
fi
