#!/usr/bin/env bash
# Online FP8 against the unquantized reload of the same checkpoint (docs/PERFORMANCE.md,
# "TinyLlama, checkpoint format, unquantized and online FP8"), measured so that a machine
# whose speed drifts cannot fake the ratio: each round runs reload_runner once per mode
# (none, fp8, fp8-block) one after the other, REPEAT reloads each; a mode's figure for the
# round is its best reload after the first; the result is the least over the rounds of each
# mode, and the ratios of those. Prints every round, then the summary.
#   scripts/online_fp8_ratio.sh NP [ROUNDS] [MODEL_DIR]
#   (defaults: 4 rounds, /tmp/tpreload-bench/tinyllama, made by
#    `launch/mpirun.sh 1 build/bench/reload_bench --scenario tinyllama --iters 1`)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
np=$1
rounds=${2:-4}
model=${3:-/tmp/tpreload-bench/tinyllama}
repeat=${REPEAT:-8}
[ -f "$model/config.json" ] || { echo "$0: no model at $model (see the usage above)" >&2; exit 1; }
declare -A least
for r in $(seq "$rounds"); do
  for q in none fp8 fp8-block; do
    args=()
    [ "$q" = none ] || args=(--quantization "$q")
    # (the summary line of every reload; the first one is left out: it warms the model)
    best=$(TPRELOAD_PROGRESS=off launch/mpirun.sh "$np" build/reload_runner --model "$model" \
      --repeat "$repeat" --quiet "${args[@]}" 2>&1 |
      awk '/seconds: total/ { n++; if (n > 1) print $3 + 0 }' | sort -g | head -1)
    [ -n "$best" ] || { echo "$0: reload_runner printed no reload for $q" >&2; exit 1; }
    echo "round $r $q $best"
    if [ -z "${least[$q]:-}" ] || awk -v a="$best" -v b="${least[$q]}" 'BEGIN { exit !(a < b) }'
    then least[$q]=$best; fi
  done
done
echo "# np $np, $rounds rounds, least of each round's best reload (s); against none"
for q in none fp8 fp8-block; do
  awk -v q="$q" -v t="${least[$q]}" -v n="${least[none]}" \
    'BEGIN { printf "%-10s %.3f %.2fx\n", q, t, t / n }'
done
