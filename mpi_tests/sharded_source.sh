#!/usr/bin/env bash
# End to end through the programs: generate two versions of a checkpoint, split
# the second among SOURCES ranks with `reload_ckpt split`, and reload it into a
# model holding the first with `reload_runner --sharded-source` (each rank its
# own file, point to point) and, for reference, from the unsplit files; every
# parameter CRC-32 of every rank must agree between the two reports. Then a
# split among more ranks than the job has: the missing ranges are named and
# nothing is reloaded.
#   mpi_tests/sharded_source.sh BUILD_DIR NP TP BY SOURCES
set -euo pipefail
build=$1 np=$2 tp=$3 by=$4 sources=$5
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../scripts/mpi_env.sh"
work=$(mktemp -d /tmp/tpreload-sharded-XXXXXX)
trap 'rm -rf "$work"' EXIT
# Mixtral: every layer's experts as separate checkpoint tensors, stacked into
# one parameter per layer; an odd vocabulary (padded rows on the last tp rank).
cat > "$work/config.json" <<JSON
{"architectures": ["MixtralForCausalLM"], "hidden_size": 128, "intermediate_size": 96,
 "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 301,
 "num_local_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": false,
 "torch_dtype": "bfloat16"}
JSON
"$build/reload_ckpt" generate --config "$work/config.json" --out "$work/v1" --seed 1
"$build/reload_ckpt" generate --config "$work/config.json" --out "$work/v2" --seed 2 --shards 2
"$build/reload_ckpt" split "$work/v2" "$work/split" --ranks "$sources" --by "$by"
run() { mpirun -np "$np" --oversubscribe --bind-to none "$build/reload_runner" --model "$work/v1" \
          --tp "$tp" --log-level warn --bucket-mb 0.02 "$@"; }
run --report "$work/files.json" --weights "$work/v2"
run --report "$work/sharded.json" --weights "$work/split" --sharded-source
PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$here" python3 - "$work/files.json" "$work/sharded.json" <<'PY'
import sys
from reports import load, parameter_count, differing
a, b = (load(p) for p in sys.argv[1:3])
assert b["source"].startswith("sharded sources"), b["source"]
assert not b["not_loaded"]["on_all_ranks"] and not b["not_loaded"]["on_some_ranks"], b["not_loaded"]
count = parameter_count(a)
assert count > 0 and count == parameter_count(b), "parameter counts differ"
differ = differing(a, b)
assert not differ, f"{len(differ)} parameters differ, e.g. {differ[:3]}"
PY
echo "sharded source (by $by, $sources of $np ranks) and files agree on every parameter CRC"
# A split among one rank more than the job: that rank's boxes are held by none.
# Slices: the ranges it held are missing from tensors the others hold, named
# before anything is written. Whole tensors: the ones it held are not loaded,
# as a source that lacks them (the run ends incomplete, status 3).
"$build/reload_ckpt" split "$work/v2" "$work/over" --ranks $((np + 1)) --by "$by"
status=0
run --weights "$work/over" --sharded-source > "$work/over.log" 2>&1 || status=$?
if [ "$by" = whole ]; then
  expect=("NOT LOADED on any rank" "3")
else
  expect=("which no rank holds.*(nothing was reloaded)" "1")
fi
if ! grep -Eq "${expect[0]}" "$work/over.log" || [ "$status" != "${expect[1]}" ]; then
  cat "$work/over.log" >&2
  echo "a split with a rank missing: exit status $status, expected ${expect[1]} and '${expect[0]}'" >&2
  exit 1
fi
echo "the ranges of a missing source rank are named"
