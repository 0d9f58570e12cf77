#!/usr/bin/env bash
# install_consumer.sh SOURCE_DIR BUILD_DIR
# Installs the build into a temporary prefix, builds docs/API.md's program and
# CMakeLists.txt against it with find_package(tpreload), runs it at 2 ranks
# through the installed launcher on two generated checkpoints (each way round:
# reloading in place must answer as the first load of the same weights), and
# imports the installed Python module.
set -euo pipefail
src=$1 build=$2
work=$(mktemp -d /tmp/tpreload-install-XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "install_consumer: FAIL: $*"; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for f in include/tpreload/reload/reload.h lib/libtpreload_reload.a bin/reload_runner bin/reload_ckpt \
         lib/cmake/tpreload/tpreloadConfig.cmake lib/cmake/tpreload/tpreloadConfigVersion.cmake \
         share/tpreload/launch/mpirun.sh share/tpreload/scripts/mpi_env.sh; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
# The exported package points into the prefix, never at this source or build tree.
if grep -rlE "$src|$build" "$prefix/lib/cmake/tpreload"; then fail "the package refers to the build tree"; fi

# The consumer: both files exactly as docs/API.md shows them.
mkdir "$work/consumer"
extract() {  # the fenced block after "<!-- consumer: NAME -->"
  awk -v marker="<!-- consumer: $1 -->" '
    $0 == marker { found = 1; next }
    found == 1 && /^```/ { found = 2; next }
    found == 2 && /^```/ { exit }
    found == 2 { print }' "$src/docs/API.md"
}
extract CMakeLists.txt >"$work/consumer/CMakeLists.txt"
extract my_server.cpp >"$work/consumer/my_server.cpp"
[ -s "$work/consumer/CMakeLists.txt" ] && [ -s "$work/consumer/my_server.cpp" ] ||
  fail "docs/API.md lost its consumer blocks"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >"$work/configure.log" ||
  { cat "$work/configure.log"; fail "find_package(tpreload) failed"; }
cmake --build "$work/consumer/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "the consumer does not build"; }
echo "consumer built against $prefix"

cat >"$work/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96,
 "torch_dtype": "float32", "tie_word_embeddings": false}
JSON
"$prefix/bin/reload_ckpt" generate --config "$work/config.json" --out "$work/v1" --seed 1 --std 0.5 >/dev/null
"$prefix/bin/reload_ckpt" generate --config "$work/config.json" --out "$work/v2" --seed 2 --std 0.5 >/dev/null
run() { TPRELOAD_PROGRESS=off "$prefix/share/tpreload/launch/mpirun.sh" 2 "$work/consumer/build/my_server" "$@" 2>&1; }
one=$(run "$work/v1" "$work/v2") || { echo "$one"; fail "my_server v1 v2 failed"; }
two=$(run "$work/v2" "$work/v1") || { echo "$two"; fail "my_server v2 v1 failed"; }
echo "$one" | grep -E "next token|every expected"
echo "$two" | grep -E "next token"
re='next token after \[1 2 3\]: ([0-9]+) -> ([0-9]+); caches dropped 2 times; serving '
[[ $one =~ $re ]] || fail "no answer line: $one"
a=${BASH_REMATCH[1]} b=${BASH_REMATCH[2]}
[[ $two =~ $re ]] || fail "no answer line: $two"
[ "${BASH_REMATCH[1]}" = "$b" ] && [ "${BASH_REMATCH[2]}" = "$a" ] ||
  fail "reloading in place does not answer as loading: v1 $a, v2 $b, then v2 ${BASH_REMATCH[1]}, v1 ${BASH_REMATCH[2]}"
[ "$a" != "$b" ] || echo "note: both versions answer $a (the test still checks each way round)"
grep -q "serving $work/v2" <<<"$one" || fail "the model's location did not become the new path"

# The installed Python module, when it was built.
if [ -d "$prefix"/lib/python3*/*-packages/tpreload ]; then
  site=$(echo "$prefix"/lib/python3*/*-packages)
  PYTHONPATH=$site /usr/bin/python3 -c "import tpreload, sys; assert tpreload.__file__.startswith('$site'); print('python module imports from', '$site')"
fi
echo "install_consumer: PASS"
