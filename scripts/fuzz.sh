#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
# Builds the libFuzzer targets of tests/fuzz with clang (-DTPRELOAD_FUZZ=ON:
# libFuzzer, ASan and UBSan) in build-fuzz/ (TPRELOAD_FUZZ_BUILD names another
# build folder configured so, as the test command's ASan build is) and runs each
# for SECONDS_PER_TARGET (default 60; JOBS runs at a time, a core each, JOBS
# defaulting to the cores), starting from the committed seeds in
# tests/fuzz/corpus/<target> (never written to: new inputs go to
# <build>/fuzz/corpus/<target>). Exits non-zero on the first finding, whose input
# is left in <build>/fuzz/artifacts/ (add it to tests/fuzz/corpus/<target> as a
# regression case once fixed); 77 where clang cannot build libFuzzer targets.
#   scripts/fuzz.sh 10            # the short run of the test command
#   scripts/fuzz.sh 150           # 150 s each: 5 minutes on 2 cores
#   scripts/fuzz.sh --can-build   # exit 0 when clang builds libFuzzer targets here, else 77
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
can_build() {
  echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, long) { return 0; }' |
    clang++ -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null
}
if [ "${1:-}" = --can-build ]; then can_build && exit 0 || exit 77; fi
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors_header index kernel_format metadata)
build=${TPRELOAD_FUZZ_BUILD:-$root/build-fuzz}
if [ ! -f "$build/CMakeCache.txt" ]; then
  mkdir -p "$build"
  if ! can_build; then
    echo "fuzz: clang++ cannot build libFuzzer targets (apt-get install clang libclang-rt-14-dev)" >&2
    exit 77
  fi
  # (optimized: a long run makes more executions; the test command's ASan build is Debug)
  cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPRELOAD_FUZZ=ON -DTPRELOAD_CUDA=OFF >/dev/null
fi
grep -q '^TPRELOAD_FUZZ:BOOL=ON' "$build/CMakeCache.txt" ||
  { echo "fuzz: $build is not configured with -DTPRELOAD_FUZZ=ON" >&2; exit 2; }
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${targets[@]/%/_fuzz}"
out=$build/fuzz
mkdir -p "$out/artifacts"
jobs_at_most() { while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-$(nproc)}" ]; do sleep 0.2; done; }
runs=()
for t in "${targets[@]}"; do
  mkdir -p "$out/corpus/$t"
  rm -f "$out/artifacts/$t-"*  # a finding of an earlier run is judged by this run
  jobs_at_most
  echo "fuzz: running $t for $seconds s"
  (cd "$out/artifacts" &&
    "$build/tests/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$out/artifacts/$t-" "$out/corpus/$t" "$root/tests/fuzz/corpus/$t" \
      > "$out/$t.log" 2>&1 || true) &
  runs+=("$!")
done
wait "${runs[@]}"
for t in "${targets[@]}"; do
  echo "fuzz: $t:"
  grep -E "^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|==[0-9]+==|SUMMARY|artifact)" "$out/$t.log" || true
  if compgen -G "$out/artifacts/$t-*" > /dev/null; then
    echo "fuzz: FINDING in $t: $(ls "$out"/artifacts/"$t"-*)" >&2
    exit 1
  fi
  if ! grep -qE "^#[0-9]+[[:space:]]+DONE" "$out/$t.log"; then
    echo "fuzz: $t did not finish its run (no finding either): the end of $out/$t.log:" >&2
    tail -20 "$out/$t.log" >&2
    exit 1
  fi
done
echo "fuzz: no findings (${#targets[@]} targets, $seconds s each, ${JOBS:-$(nproc)} at a time)"
