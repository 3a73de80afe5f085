#!/usr/bin/env bash
# A softverbs fault campaign as a Slurm job array: array task K (SLURM_ARRAY_TASK_ID, 1..N) runs
# shard K of N (`--shard K/N`) of the same seeded campaign and writes reports/report-K.json to
# the shared working directory. Submit, then merge when the array is done:
#
#   jid=$(sbatch --parsable harness/deploy/slurm-campaign.sh)
#   sbatch --dependency=afterany:$jid --wrap \
#     'softverbs campaign merge reports/report-*.json --report campaign.json'
#
# SEED, RUNS and SOFTVERBS (the binary) can be set in the environment (sbatch --export).
#SBATCH --job-name=softverbs-campaign
#SBATCH --array=1-8
#SBATCH --cpus-per-task=2
#SBATCH --mem=1G
#SBATCH --time=02:00:00
#SBATCH --output=reports/slurm-%A_%a.out
set -euo pipefail
: "${SLURM_ARRAY_TASK_ID:?run this with sbatch --array (it is one shard of a job array)}"
SEED=${SEED:-1}
RUNS=${RUNS:-1000}
SOFTVERBS=${SOFTVERBS:-softverbs}
# N: the array's task count (--array=1-N above).
SHARDS=${SLURM_ARRAY_TASK_COUNT:-8}
K=$SLURM_ARRAY_TASK_ID
mkdir -p reports
rc=0
"$SOFTVERBS" campaign --seed "$SEED" --runs "$RUNS" --shard "$K/$SHARDS" \
  --run-dir "reports/shard-$K" --report "reports/report-$K.json" || rc=$?
# 0 pass, 1 a run violated (the merge reports it); anything else: the shard did not finish.
[ "$rc" -le 1 ] || exit "$rc"
test -s "reports/report-$K.json"
