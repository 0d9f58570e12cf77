#!/usr/bin/env bash
# tools_usage.sh RELOAD_RUNNER RELOAD_CKPT
# Mistakes a user makes with the programs, each answered at once with what to do:
# the exit status and one line of the output, per case. Prints
# "tools_usage: all passed" when every case did.
set -uo pipefail
runner=$1 ckpt=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failed=0

# expect NAME STATUS TEXT -- COMMAND...: COMMAND exits with STATUS and prints TEXT
# (a fixed string); with "!TEXT2" after TEXT, it must not print TEXT2.
expect() {
  local name=$1 want=$2 text=$3 absent=
  shift 3
  if [ "$1" != "--" ]; then absent=${1#!}; shift; fi
  shift
  local out status
  out=$("$@" 2>&1)
  status=$?
  if [ "$status" -ne "$want" ]; then
    echo "tools_usage: FAIL: $name: exit status $status, not $want"; echo "$out"; failed=1
  elif ! grep -qF -- "$text" <<<"$out"; then
    echo "tools_usage: FAIL: $name: the output does not say: $text"; echo "$out"; failed=1
  elif [ -n "$absent" ] && grep -qF -- "$absent" <<<"$out"; then
    echo "tools_usage: FAIL: $name: the output says: $absent"; echo "$out"; failed=1
  else
    echo "tools_usage: ok: $name"
  fi
}

cat >"$dir/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "vocab_size": 128, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}
JSON
"$ckpt" generate --config "$dir/config.json" --out "$dir/model" >/dev/null || exit 1
"$ckpt" shard "$dir/model" "$dir/k2" --tp 2 >/dev/null || exit 1

# reload_ckpt
expect "an unknown subcommand is named" 2 "unknown subcommand 'frob'" -- "$ckpt" frob
expect "generate refuses an integer dtype" 1 \
  "--dtype int8: torch_dtype 'int8' is not a floating type" -- \
  "$ckpt" generate --config "$dir/config.json" --out "$dir/int8" --dtype int8
expect "generate refuses a negative std" 1 "--std must be 0 or more, got -1" -- \
  "$ckpt" generate --config "$dir/config.json" --out "$dir/neg" --std -1
expect "generate counts the index apart" 0 "2 files + model.safetensors.index.json + config.json" -- \
  "$ckpt" generate --config "$dir/config.json" --out "$dir/two" --shards 2
expect "shard names an input that does not exist" 1 \
  "shard: checkpoint '$dir/nope' does not exist" -- "$ckpt" shard "$dir/nope" "$dir/k" --tp 2
expect "convert refuses shards of an HDF5 file" 1 \
  "convert: --shards splits safetensors; an HDF5 output is one file" -- \
  "$ckpt" convert "$dir/model" "$dir/out.h5" --shards 2

# reload_runner (one process: no launcher needed)
expect "kernel shards of another tp are refused before the initial load" 1 \
  "checking --weights before the initial load failed on rank 0/1: kernel-format source (kernel format '$dir/k2' (tp_size 2, bfloat16): 2 file(s)" \
  "!initial load:" -- "$runner" --model "$dir/model" --weights "$dir/k2" --kernel-format
expect "the layouts and the way to make shards are named" 1 \
  "was made for tp 2, quantization none, not expert parallel; the model is tp 1, quantization none, not expert parallel (kernel-format shards fit one layout: shard the checkpoint for this one, e.g. reload_ckpt shard IN OUT --tp 1" \
  -- "$runner" --model "$dir/model" --weights "$dir/k2" --kernel-format
expect "kernel shards as a checkpoint are refused before the initial load" 1 \
  "which holds kernel-format shards: reload it in kernel format (reload_runner --kernel-format" \
  "!initial load:" -- "$runner" --model "$dir/model" --weights "$dir/k2"
sed 's/"vocab_size": 128/"vocab_size": 256/' "$dir/config.json" >"$dir/other.json"
"$ckpt" generate --config "$dir/other.json" --out "$dir/other" >/dev/null || exit 1
expect "a failed reload names the load that failed" 1 \
  "reload 1 of 1 from --weights $dir/other failed:" -- \
  "$runner" --model "$dir/model" --weights "$dir/other" --report "$dir/failed.json"
# ... and its report names the source tried and where the parameters live.
expect "the report of a failure names its source and memory" 0 "report names them" -- \
  python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
assert r["source"] == sys.argv[2], r["source"]
assert r["parameter_memory"] == "host", r["parameter_memory"]
assert r["error"], r
print("report names them")' "$dir/failed.json" "$dir/other"
expect "ranks per node without node readers are refused" 1 \
  "--ranks-per-node makes the nodes of --readers node; with --readers one it would be ignored" -- \
  "$runner" --model "$dir/model" --ranks-per-node 1
expect "broadcast with every rank reading is said to be ignored" 0 \
  "--distribution broadcast is ignored with --readers all" -- \
  "$runner" --model "$dir/model" --readers all --distribution broadcast
expect "one bucket is one bucket" 0 "(checkpoint format, scatter, 1 bucket)" -- \
  "$runner" --model "$dir/model"

[ "$failed" -eq 0 ] && echo "tools_usage: all passed"
exit "$failed"
