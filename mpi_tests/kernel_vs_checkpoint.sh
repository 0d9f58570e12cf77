#!/usr/bin/env bash
# End to end through the programs: generate a checkpoint, shard it into kernel
# format with reload_ckpt, reload it with reload_runner from safetensors, from an
# HDF5 copy and from the kernel-format shards, and require every parameter CRC-32
# of every rank to agree between the reports.
#   mpi_tests/kernel_vs_checkpoint.sh BUILD_DIR NP TP [MODEL [--one-file]]
# MODEL: qwen2 (default; int8), qwen3-moe (tensor-parallel experts), qwen3-moe-ep
# (expert parallelism), qwen3-moe-fp8 and qwen3-moe-fp8-ep (a block-scaled FP8
# checkpoint: FP8 weights and their scale grids, not quantized again),
# qwen3-moe-fp8-tensor (per-tensor FP8 with static activations: the checkpoint
# reloads requantize each fused layer, the kernel-format one copies the result),
# qwen3-moe-fp8-online (a bfloat16 checkpoint quantized to FP8 on load, a scale
# per weight), qwen3-moe-fp8-block-online (the same with a scale per 128 x 128
# block; sizes whose shards end inside blocks), phi3-fp8-block-online (the same
# for a family whose checkpoint holds q/k/v and gate/up stacked).
# --one-file: also shard the same weights written as one file, named alone from
# its own directory, and require the same shards byte for byte (a property of
# the source, not of the family: the case list runs it on two checkpoints).
set -euo pipefail
build=$1 np=$2 tp=$3 model=${4:-qwen2} one_file=${5:-}
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../scripts/mpi_env.sh"
work=$(mktemp -d /tmp/tpreload-e2e-XXXXXX)
trap 'rm -rf "$work"' EXIT
layout=()
quant=(--quantization int8)
case "$model" in
  qwen2)
    cat > "$work/config.json" <<JSON
{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "vocab_size": 300, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}
JSON
    ;;
  qwen3-moe|qwen3-moe-ep)
    cat > "$work/config.json" <<JSON
{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
 "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32,
 "vocab_size": 300, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
 "mlp_only_layers": [1], "norm_topk_prob": true, "tie_word_embeddings": false, "dtype": "bfloat16"}
JSON
    [ "$model" = qwen3-moe-ep ] && layout=(--expert-parallel)
    ;;
  qwen3-moe-fp8|qwen3-moe-fp8-ep)
    cat > "$work/config.json" <<JSON
{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256, "intermediate_size": 256,
 "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 128,
 "vocab_size": 300, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
 "mlp_only_layers": [1], "norm_topk_prob": true, "tie_word_embeddings": false, "dtype": "bfloat16",
 "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
   "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}}
JSON
    quant=()
    [ "$model" = qwen3-moe-fp8-ep ] && layout=(--expert-parallel)
    ;;
  qwen3-moe-fp8-online)
    cat > "$work/config.json" <<JSON
{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
 "vocab_size": 300, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
 "mlp_only_layers": [1], "norm_topk_prob": true, "tie_word_embeddings": false, "dtype": "bfloat16"}
JSON
    quant=(--quantization fp8)
    ;;
  qwen3-moe-fp8-block-online)
    cat > "$work/config.json" <<JSON
{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 192, "intermediate_size": 320,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 48,
 "vocab_size": 300, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 160,
 "mlp_only_layers": [1], "norm_topk_prob": true, "tie_word_embeddings": false, "dtype": "bfloat16"}
JSON
    quant=(--quantization fp8-block)
    ;;
  phi3-fp8-block-online)
    cat > "$work/config.json" <<JSON
{"architectures": ["Phi3ForCausalLM"], "hidden_size": 192, "intermediate_size": 320,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "vocab_size": 300, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}
JSON
    quant=(--quantization fp8-block)
    ;;
  qwen3-moe-fp8-tensor)
    cat > "$work/config.json" <<JSON
{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
 "vocab_size": 300, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
 "mlp_only_layers": [1], "norm_topk_prob": true, "tie_word_embeddings": false, "dtype": "bfloat16",
 "quantization_config": {"quant_method": "fp8", "activation_scheme": "static",
   "ignored_layers": ["lm_head"]}}
JSON
    quant=()
    ;;
  *) echo "unknown model $model" >&2; exit 2 ;;
esac
"$build/reload_ckpt" generate --config "$work/config.json" --out "$work/model" --shards 2 --seed 7 --with-inv-freq
"$build/reload_ckpt" shard "$work/model" "$work/kernel" --tp "$tp" "${quant[@]}" "${layout[@]}"
# The same weights in one file, named alone from its own directory (its
# config.json is found there): the same shards, byte for byte.
if [ "$one_file" = --one-file ]; then
  "$build/reload_ckpt" generate --config "$work/config.json" --out "$work/one" --seed 7 --with-inv-freq
  (cd "$work/one" && "$build/reload_ckpt" shard model.safetensors "$work/kernel-one" --tp "$tp" \
     "${quant[@]}" "${layout[@]}")
  for f in "$work/kernel"/*; do cmp "$f" "$work/kernel-one/${f##*/}"; done
fi
mkdir -p "$work/h5" && cp "$work/config.json" "$work/h5/"
"$build/reload_ckpt" convert "$work/model" "$work/h5/model.h5" --format hdf5
run() { mpirun -np "$np" --oversubscribe --bind-to none "$build/reload_runner" --model "$work/model" \
          --tp "$tp" "${quant[@]}" "${layout[@]}" --log-level warn "$@"; }
run --report "$work/checkpoint.json" --distribution broadcast
run --report "$work/hdf5.json" --weights "$work/h5/model.h5" --distribution scatter
run --report "$work/kernel.json" --weights "$work/kernel" --kernel-format --distribution scatter
PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$here" python3 - "$work/checkpoint.json" "$work/hdf5.json" "$work/kernel.json" <<'PY'
import sys
from reports import load, parameter_count, differing
a, h, b = (load(p) for p in sys.argv[1:4])
assert a["format"] == "checkpoint" and b["format"] == "kernel", (a["format"], b["format"])
assert not a["not_loaded"]["on_all_ranks"] and not b["not_loaded"]["on_all_ranks"]
assert a["skipped"] and not b["skipped"], "inv_freq must be skipped in checkpoint format only"
count = parameter_count(a)
assert count > 0 and count == parameter_count(h) == parameter_count(b), "parameter counts differ"
for other, what in ((h, "HDF5"), (b, "kernel-format")):
    differ = differing(a, other)
    assert not differ, f"{what}: {len(differ)} parameters differ, e.g. {differ[:3]}"
print(f"kernel-format, HDF5 and checkpoint-format reloads agree on all {count} parameter CRCs")
PY
