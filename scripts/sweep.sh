#!/usr/bin/env bash
# The sweep behind the defaults (docs/PERFORMANCE.md, "Defaults"): bucket size x
# pipeline depth x distribution x readers mode for both formats of one scenario
# at one world size (checksums on, as by default).
#   scripts/sweep.sh [scenario] [ranks]        default: tinyllama 2
# SWEEP_BUCKETS (MiB), SWEEP_DEPTHS and SWEEP_READERS override the grid;
# BENCH_ITERS the iterations.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/mpi_env.sh
scenario=${1:-tinyllama}
np=${2:-2}
for depth in ${SWEEP_DEPTHS:-0 1 2 4}; do  # (0: chosen per rank; the depth column says what it chose)
  echo "## pipeline depth $depth"
  mpirun -np "$np" --oversubscribe --bind-to none build/bench/reload_bench --scenario "$scenario" \
    --dir "${BENCH_DIR:-/tmp/tpreload-bench}" --iters "${BENCH_ITERS:-3}" \
    --bucket-mb ${SWEEP_BUCKETS:-4 8 16 32 64} --pipeline-depth "$depth" \
    --readers ${SWEEP_READERS:-one all}
done
