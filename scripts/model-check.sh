#!/usr/bin/env bash
# Runs the RC engine's model checker (emu/model, issue 21) over the larger configurations in a
# release build and prints the README's "Model checking" table (markdown) on stdout.
#
#   scripts/model-check.sh                 every configuration (minutes)
#   scripts/model-check.sh mix4 rnr        some of them
#   scripts/model-check.sh mix4 --depth 12 with another depth bound
#   scripts/model-check.sh all --recovery sr  selective repeat (the softverbs extension) on both QPs
#
# MODEL_PROGRESS=1 prints the state count at each depth; MODEL_NARRATE=1 narrates a violating
# schedule step by step. A violation exits 1 after printing its schedule as an rc_pair.rs test.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
cargo build --release -q -p emu-model --bin model-check
if [ $# -eq 0 ]; then set -- all; fi
exec "$ROOT/target/release/model-check" "$@"
