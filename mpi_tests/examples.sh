#!/usr/bin/env bash
# examples.sh BUILD_DIR NP
# The two embedding examples at NP ranks, as a user runs them:
#  serve_and_reload answers requests, reloads new weights in place between them
#  (a bad path is refused and the old weights keep serving), and its answers after
#  the reload equal those of a server started on the new weights;
#  trainer_push's fingerprints match the trainer's on every rank at every step.
set -euo pipefail
build=$1 np=$2
here="$(cd "$(dirname "$0")" && pwd)"
work=$(mktemp -d /tmp/tpreload-examples-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "examples: FAIL: $*"; exit 1; }
run() { TPRELOAD_PROGRESS=off "$here/../launch/mpirun.sh" "$np" "$@" 2>&1; }

cat >"$work/config.json" <<'JSON'
{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96,
 "torch_dtype": "bfloat16", "tie_word_embeddings": true}
JSON
for v in 1 2; do
  "$build/reload_ckpt" generate --config "$work/config.json" --out "$work/v$v" --seed "$v" --std 0.5 >/dev/null
done
cat >"$work/requests" <<REQUESTS
# a session: two questions, new weights, the same question, a bad reload, again
generate 5 1 2 3
generate 5 1 2 3
reload $work/v2
generate 5 1 2 3
reload $work/missing
generate 5 1 2 3
generate 3 1 2 3
REQUESTS
served=$(run "$build/examples/serve_and_reload" --model "$work/v1" --requests "$work/requests") ||
  { echo "$served"; fail "serve_and_reload exited with an error"; }
echo "$served"
mapfile -t answers < <(grep -o 'answer: .*' <<<"$served")
[ ${#answers[@]} -eq 5 ] || fail "expected 5 answers, got ${#answers[@]}"
[[ ${answers[0]} == *"(computed)" && ${answers[1]} == *"(cached)" ]] || fail "the cache does not serve a repeat"
[[ ${answers[2]} == *"(computed)" ]] || fail "the reload did not drop the answer cache"
[[ ${answers[3]} == *"(cached)" ]] || fail "a refused reload dropped the cache"
grep -q "reloaded .* from $work/v2 .*(complete); answer cache dropped" <<<"$served" || fail "no reload line"
grep -q "reload failed on every rank: .*$work/missing" <<<"$served" || fail "the bad reload was not refused"
# Computed after the refused reload: greedy decoding's first 3 tokens of the 5 above.
three=$(grep -o '\[[0-9 ]*\] (computed)$' <<<"${answers[4]}" | tr -d '[]()' | awk '{print $1, $2, $3}')
five=$(grep -o '\[[0-9 ]*\] (computed)$' <<<"${answers[2]}" | tr -d '[]()' | awk '{print $1, $2, $3}')
[ -n "$three" ] && [ "$three" = "$five" ] || fail "the weights changed after a refused reload: ${answers[2]} / ${answers[4]}"
strip() { sed 's/ (computed)$//; s/ (cached)$//' <<<"$1"; }
[ "$(strip "${answers[0]}")" != "$(strip "${answers[2]}")" ] || fail "the answer did not change with the weights"
[ "$(strip "${answers[2]}")" = "$(strip "${answers[3]}")" ] || fail "a refused reload changed the answers"
# A server started on v2 answers what the reloaded one answered.
fresh=$(echo "generate 5 1 2 3" | run "$build/examples/serve_and_reload" --model "$work/v2") ||
  { echo "$fresh"; fail "serve_and_reload on v2 failed"; }
[ "$(strip "$(grep -o 'answer: .*' <<<"$fresh")")" = "$(strip "${answers[2]}")" ] ||
  fail "after the reload: ${answers[2]}; a fresh server on v2: $fresh"
echo "serve_and_reload: answers changed with the weights and equal a fresh server's"

pushed=$(run "$build/examples/trainer_push" --steps 3 --hidden 128 --layers 2) ||
  { echo "$pushed"; fail "trainer_push failed"; }
echo "$pushed"
[ "$(grep -c "matches the trainer on all $np ranks" <<<"$pushed")" -eq 3 ] || fail "fingerprints do not match"
[ "$(grep -o 'fingerprint [0-9a-f]*' <<<"$pushed" | sort -u | wc -l)" -eq 3 ] || fail "the weights did not change every step"
echo "examples: PASS"
