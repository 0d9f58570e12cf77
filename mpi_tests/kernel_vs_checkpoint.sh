#!/usr/bin/env bash
# End to end through the programs: generate a checkpoint, shard it into int8
# kernel format with reload_ckpt, reload it with reload_runner both ways, and
# require every parameter CRC-32 of every rank to agree between the two reports.
#   mpi_tests/kernel_vs_checkpoint.sh BUILD_DIR NP TP
set -euo pipefail
build=$1 np=$2 tp=$3
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../scripts/mpi_env.sh"
work=$(mktemp -d /tmp/tpreload-e2e-XXXXXX)
trap 'rm -rf "$work"' EXIT
cat > "$work/config.json" <<JSON
{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "vocab_size": 300, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}
JSON
"$build/reload_ckpt" generate --config "$work/config.json" --out "$work/model" --shards 2 --seed 7 --with-inv-freq
"$build/reload_ckpt" shard "$work/model" "$work/kernel" --tp "$tp" --quantization int8
run() { mpirun -np "$np" --oversubscribe --bind-to none "$build/reload_runner" --model "$work/model" \
          --tp "$tp" --quantization int8 --log-level warn "$@"; }
run --report "$work/checkpoint.json" --distribution broadcast
run --report "$work/kernel.json" --weights "$work/kernel" --kernel-format --distribution scatter
python3 - "$work/checkpoint.json" "$work/kernel.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["format"] == "checkpoint" and b["format"] == "kernel", (a["format"], b["format"])
assert not a["not_loaded"]["on_all_ranks"] and not b["not_loaded"]["on_all_ranks"]
assert a["skipped"] and not b["skipped"], "inv_freq must be skipped in checkpoint format only"
differ = [(ra["rank"], n) for ra, rb in zip(a["ranks"], b["ranks"])
          for n, p in ra["params"].items() if p != rb["params"][n]]
count = sum(len(r["params"]) for r in a["ranks"])
assert not differ, f"{len(differ)} parameters differ, e.g. {differ[:3]}"
print(f"kernel-format and checkpoint-format reloads agree on all {count} parameter CRCs")
PY
