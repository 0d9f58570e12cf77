#!/usr/bin/env bash
# The full benchmark (docs/PERFORMANCE.md): every scenario at 1, 2 and 4 ranks
# (8, oversubscribed, as a scaling row), both formats, int8 and not, broadcast and
# scatter. Checkpoints are generated once under BENCH_DIR (default /tmp/tpreload-bench,
# about 10 GB) and reused. Output: one table per scenario and world size.
#   scripts/bench.sh [scenario...]      e.g. scripts/bench.sh tinyllama
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/mpi_env.sh
dir=${BENCH_DIR:-/tmp/tpreload-bench}
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(tinyllama llama3-8b-4l qwen3-moe-2l small-tensors)
for s in "${scenarios[@]}"; do
  for np in ${BENCH_SIZES:-1 2 4 8}; do
    tp=()
    # small-tensors has 4 attention heads: 8 ranks are 2 replicas of tp 4.
    if [ "$s" = small-tensors ] && [ "$np" -gt 4 ]; then tp=(--tp 4); fi
    layouts=("")
    [ "$s" = qwen3-moe-2l ] && layouts=("" --expert-parallel)  # both expert layouts
    for layout in "${layouts[@]}"; do
      mpirun -np "$np" --oversubscribe --bind-to none build/bench/reload_bench --scenario "$s" \
        --dir "$dir" --iters "${BENCH_ITERS:-3}" --quantizations none int8 "${tp[@]}" ${layout}
    done
  done
done
