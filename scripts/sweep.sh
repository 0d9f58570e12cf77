#!/usr/bin/env bash
# The sweep behind the defaults (docs/PERFORMANCE.md, "Defaults"): bucket size x
# pipeline depth x distribution for both formats of one scenario at one world size.
#   scripts/sweep.sh [scenario] [ranks]        default: tinyllama 2
# SWEEP_BUCKETS (MiB) and SWEEP_DEPTHS override the grid; BENCH_ITERS the iterations.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/mpi_env.sh
scenario=${1:-tinyllama}
np=${2:-2}
for depth in ${SWEEP_DEPTHS:-1 2 4}; do
  echo "## pipeline depth $depth"
  mpirun -np "$np" --oversubscribe --bind-to none build/bench/reload_bench --scenario "$scenario" \
    --dir "${BENCH_DIR:-/tmp/tpreload-bench}" --iters "${BENCH_ITERS:-3}" \
    --bucket-mb ${SWEEP_BUCKETS:-8 16 32 64 256} --pipeline-depth "$depth"
done
