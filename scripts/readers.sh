#!/usr/bin/env bash
# The readers comparison (docs/PERFORMANCE.md, "Readers"): for each scenario and
# world size, the reader rank (broadcast and scatter), a reader per node (the
# world split into two emulated nodes of np/2 ranks: --ranks-per-node), every
# rank reading its own slices, and the baseline users run without tpreload (every rank loading the
# whole checkpoint through the weight loaders), each with its same-run bound and
# the targets' verdicts. Warm page cache unless READERS_COLD=1 (then the files
# are dropped from the cache before every timed reload and bound).
#   scripts/readers.sh [scenario...]     default: tinyllama llama3-8b-4l
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/mpi_env.sh
dir=${BENCH_DIR:-/tmp/tpreload-bench}
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(tinyllama llama3-8b-4l)
cold=()
[ "${READERS_COLD:-0}" = 1 ] && cold=(--cold)
for s in "${scenarios[@]}"; do
  for np in ${BENCH_SIZES:-1 2 4 8}; do
    mpirun -np "$np" --oversubscribe --bind-to none build/bench/reload_bench --scenario "$s" \
      --dir "$dir" --iters "${BENCH_ITERS:-3}" --formats checkpoint --readers one node all \
      --ranks-per-node $((np > 1 ? np / 2 : 1)) --baseline "${cold[@]}"
  done
done
