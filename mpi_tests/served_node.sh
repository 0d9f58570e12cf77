#!/usr/bin/env bash
# served_node.sh BUILD_DIR
# reload_runner --readers node where one of two emulated nodes (2 ranks each)
# cannot read the weights: its ranks are started with a --weights path that does
# not exist (an MPMD job), as on a host that does not mount the checkpoint.
#  - the last node served (scatter) and the first (broadcast, --reader-rank 2):
#    exit status 0, the summary and --report say one node was served, each
#    served rank warns naming its host and the node (rank, host) that serves it,
#    and every parameter CRC of every rank equals a reload where one reader read
#    for all;
#  - the reader rank's node cannot read: exit status 1 and, on every rank, the
#    same error naming the path and a rank whose node could be the reader.
set -uo pipefail
build=$(cd "$1" && pwd)
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../scripts/mpi_env.sh"
work=$(mktemp -d /tmp/tpreload-served-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "served: FAIL: $*"; exit 1; }
cat > "$work/config.json" <<'JSON'
{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "vocab_size": 300, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}
JSON
# The model starts from v1 and reloads v2 (other values, two files).
"$build/reload_ckpt" generate --config "$work/config.json" --out "$work/v1" --seed 1 > /dev/null &&
  "$build/reload_ckpt" generate --config "$work/config.json" --out "$work/v2" --seed 2 \
    --shards 2 > /dev/null || fail "reload_ckpt generate"
common=(--model "$work/v1" --tp 2 --log-level warn)
one() { timeout 45 mpiexec -n 4 --oversubscribe --bind-to none "$build/reload_runner" \
          "${common[@]}" "$@"; }
# Ranks 0-1 (node 0) get --weights $1, ranks 2-3 (node 1) $2; the rest for all.
nodes() {
  local first=$1 second=$2
  shift 2
  local opts=("${common[@]}" --readers node --ranks-per-node 2 "$@")
  timeout 45 mpiexec --oversubscribe --bind-to none \
    -n 2 "$build/reload_runner" "${opts[@]}" --weights "$first" : \
    -n 2 "$build/reload_runner" "${opts[@]}" --weights "$second" 2>&1
}
for v in v1 v2; do
  out=$(one --weights "$work/$v" --report "$work/$v.json" 2>&1) || { echo "$out"; fail "reload of $v"; }
done

missing=$work/not-mounted
host=$(uname -n)  # (every emulated node's)
check_served() {  # NAME SERVED_RANKS SERVING_RANK OUTPUT STATUS
  local name=$1 served=$2 serving=$3 out=$4 status=$5
  [ "$status" -eq 0 ] || { echo "$out"; fail "$name: exit status $status, not 0"; }
  grep -q "1 node(s) that cannot read served by another's" <<<"$out" ||
    { echo "$out"; fail "$name: the summary does not say a node was served"; }
  [ "$(grep -c 'cannot read the weights' <<<"$out")" -eq 2 ] ||
    { echo "$out"; fail "$name: not exactly the two served ranks warned"; }
  for r in $served; do
    grep -qF "[rank $r/4] [warning] --readers node: rank $r (host $host) cannot read the weights (checkpoint '$missing': no such file or directory); its node is served by the reader of the node of rank $serving (host $host) over the data plane" <<<"$out" ||
      { echo "$out"; fail "$name: rank $r did not warn, naming its host, that rank $serving's node serves it"; }
  done
  PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$here" python3 - "$work/v1.json" "$work/v2.json" "$work/$name.json" "$name" \
    <<'PY' || fail "$name: report"
import sys
from reports import load, parameter_count, differing
v1, v2, got = (load(p) for p in sys.argv[1:4])
name = sys.argv[4]
assert got["nodes_served"] == 1, f"nodes_served {got['nodes_served']}, not 1"
assert got["readers"] == "node", got["readers"]
nl = got["not_loaded"]
assert not nl["on_all_ranks"] and not nl["on_some_ranks"], nl
assert len(v1["ranks"]) == len(v2["ranks"]) == len(got["ranks"]) == 4, "reports of 4 ranks"
count = parameter_count(v2)
assert count > 0 and count == parameter_count(got), count
changed = len(differing(v2, v1))
assert changed == count, f"only {changed} of {count} parameters differ between v1 and v2"
differ = differing(v2, got)
assert not differ, f"{len(differ)} parameters differ from one reader's reload of v2, e.g. {differ[:3]}"
print(f"{name}: all {count} parameter CRCs of the 4 ranks equal one reader's reload of v2")
PY
}

out=$(nodes "$work/v2" "$missing" --distribution scatter --report "$work/last.json")
check_served last "2 3" 0 "$out" $?
out=$(nodes "$missing" "$work/v2" --distribution broadcast --reader-rank 2 \
        --report "$work/first.json")
check_served first "0 1" 2 "$out" $?

out=$(nodes "$missing" "$work/v2")
status=$?
[ "$status" -eq 1 ] || { echo "$out"; fail "reader rank's node: exit status $status, not 1"; }
for r in 0 1 2 3; do
  grep -q "\[rank $r/4\] \[error\] opening the weight source failed on rank 0/4: checkpoint '$missing': no such file or directory; with a reader per node the reader rank's node must read the weights, and the node of rank 2 can: make it the reader rank (--reader-rank 2) (and on 1 other rank)" <<<"$out" ||
    { echo "$out"; fail "reader rank's node: rank $r did not give the error"; }
done
echo "served: PASS"
