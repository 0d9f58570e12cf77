#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
# Builds the libFuzzer targets of tests/fuzz with clang (-fsanitize=fuzzer,
# address,undefined) into build-fuzz/ and runs each for SECONDS_PER_TARGET
# (default 60; JOBS runs at a time, a core each, JOBS defaulting to the
# cores), starting from the committed seeds in tests/fuzz/corpus/<target>
# (never written to: new inputs go to build-fuzz/corpus/<target>). Exits
# non-zero on the first finding, whose input is left in build-fuzz/artifacts/
# (add it to tests/fuzz/corpus/<target> as a regression case once fixed).
#   scripts/fuzz.sh 10            # the short run of the test command
#   scripts/fuzz.sh 150           # 150 s each: 5 minutes on 2 cores
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors_header index kernel_format metadata)
out=${TPRELOAD_FUZZ_BUILD:-$root/build-fuzz}
mkdir -p "$out/artifacts"
cxx=${CXX_FUZZ:-clang++}
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, long) { return 0; }' |
    "$cxx" -x c++ -fsanitize=fuzzer - -o "$out/probe" 2>/dev/null; then
  echo "fuzz: $cxx cannot build libFuzzer targets (apt-get install clang)" >&2
  exit 77
fi
flags=(-std=c++17 -O1 -g1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/include" -I"$root/src/checkpoint")
# What the parsers need, and nothing that needs LibTorch, MPI or HDF5, built
# once (each object rebuilt when its source or any header changed).
lib_sources=("$root"/src/core/*.cpp  # (every core source: the layer is small and torch-free)
             "$root"/src/checkpoint/{safetensors_header,safetensors_source,safetensors_writer,file_util,mapping_guard,kernel_format,shape_util,in_memory_source,open_source}.cpp
             "$root"/src/checkpoint/no_hdf5/no_hdf5.cpp
             "$root"/src/reload/metadata.cpp)
newest_header=$(find "$root/include" "$root/src" -name '*.h' -printf '%T@\n' | sort -n | tail -1)
objects=()
compiles=()  # (JOBS at a time: the objects are independent)
mkdir -p "$out/obj"
for src in "${lib_sources[@]}"; do
  obj="$out/obj/$(basename "$src" .cpp).o"
  objects+=("$obj")
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] ||
     awk -v h="$newest_header" -v o="$(stat -c %Y "$obj")" 'BEGIN { exit !(h > o) }'; then
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-$(nproc)}" ]; do sleep 0.2; done
    echo "fuzz: compiling $(basename "$src")"
    rm -f "$obj"  # (a failed compile leaves none, and the check below sees it)
    "$cxx" "${flags[@]/-fsanitize=fuzzer,address,undefined/-fsanitize=fuzzer-no-link,address,undefined}" \
      -c "$src" -o "$obj" &
    compiles+=("$!")
  fi
done
for pid in "${compiles[@]}"; do
  wait "$pid" || { echo "fuzz: a library object failed to compile" >&2; exit 1; }
done
# The targets, then their runs, JOBS at a time (each run is one process on one core).
jobs_at_most() { while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-$(nproc)}" ]; do sleep 0.2; done; }
builds=()
for t in "${targets[@]}"; do
  bin="$out/${t}_fuzz"
  src="$root/tests/fuzz/${t}_fuzz.cpp"
  if [ ! -x "$bin" ] || [ -n "$(find "$root/tests/fuzz" "${objects[@]}" -newer "$bin" -print -quit)" ]; then
    jobs_at_most
    echo "fuzz: building $t"
    rm -f "$bin"
    "$cxx" "${flags[@]}" "$src" "${objects[@]}" -lspdlog -lfmt -o "$bin" &
    builds+=("$!")
  fi
done
for pid in "${builds[@]}"; do
  wait "$pid" || { echo "fuzz: a target failed to build" >&2; exit 1; }
done
runs=()
for t in "${targets[@]}"; do
  mkdir -p "$out/corpus/$t"
  rm -f "$out/artifacts/$t-"*  # a finding of an earlier run is judged by this run
  jobs_at_most
  echo "fuzz: running $t for $seconds s"
  (cd "$out/artifacts" &&
    "$out/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$out/artifacts/$t-" "$out/corpus/$t" "$root/tests/fuzz/corpus/$t" \
      > "$out/$t.log" 2>&1 || true) &
  runs+=("$!")
done
wait "${runs[@]}"
for t in "${targets[@]}"; do
  echo "fuzz: $t:"
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+==|SUMMARY|artifact)" "$out/$t.log" || true
  if compgen -G "$out/artifacts/$t-*" > /dev/null; then
    echo "fuzz: FINDING in $t: $(ls "$out"/artifacts/"$t"-*)" >&2
    exit 1
  fi
done
echo "fuzz: no findings (${#targets[@]} targets, $seconds s each, ${JOBS:-$(nproc)} at a time)"
