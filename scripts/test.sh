#!/usr/bin/env bash
# The README's second command (and CI's): install, build, and run every test:
# unit tests, mpi_tests at 1, 2, 4 and 8 ranks, then the checkpoint tests under ASan.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
mark=$start
# (each phase's seconds, for docs/BUILD.md)
phase() { echo "test.sh: $1 in $(( $(date +%s) - mark )) s"; mark=$(date +%s); }
export BUILD_DIR=${BUILD_DIR:-build}  # (setup.sh builds there)
scripts/setup.sh
. scripts/mpi_env.sh
# The CUDA variant (CUDA device, NCCL transport, GPU check, gpu_tests) is built
# whenever the machine has the toolkit; make sure detection did not quietly fail.
if grep -q '^TPRELOAD_CUDA:BOOL=ON' "$BUILD_DIR/CMakeCache.txt"; then
  echo "test.sh: CUDA variant built (tpreload_cuda, tpreload_nccl, tpreload_gpu_check, gpu_tests)"
elif [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then
  echo "test.sh: a CUDA toolkit is installed but the build has TPRELOAD_CUDA off" >&2
  exit 1
fi
# The single-process unit tests (labelled by their layer) a core each; then the
# rest (ranks under mpirun or as threads, programs) one at a time, as
# their deadlines assume.
units='^(core|comm|checkpoint|model|reload|runtime)$'
ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 900 -j "${JOBS:-$(nproc)}" -L "$units"
ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 900 -LE "$units"
phase "build and ctest"
# The checkpoint readers again under AddressSanitizer + UBSan (broken-file corpus),
# and the parsers fuzzed: a second build dir holding only the checkpoint test
# binary, the libFuzzer targets and the layers they link (core, checkpoint),
# built once with clang for both. Unoptimized, with assertions: it compiles in a
# quarter of the time an -O2 build takes, and its tests still run in seconds.
asan=(-DCMAKE_BUILD_TYPE=Debug -DTPRELOAD_ASAN=ON -DTPRELOAD_CUDA=OFF)
asan_targets=(checkpoint_tests)
if scripts/fuzz.sh --can-build; then
  asan+=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DTPRELOAD_FUZZ=ON)
  asan_targets+=(fuzz_targets)
else
  echo "test.sh: clang cannot build libFuzzer targets here: the parsers are not fuzzed" >&2
  [ -z "${CI:-}" ] || exit 1  # (setup.sh installs clang: CI must fuzz)
fi
# (a folder configured for the other compiler starts afresh: CMake keeps the first one)
fuzz_now=OFF; [[ " ${asan[*]} " == *" -DTPRELOAD_FUZZ=ON "* ]] && fuzz_now=ON
if [ -f build-asan/CMakeCache.txt ] && ! grep -q "^TPRELOAD_FUZZ:BOOL=$fuzz_now" build-asan/CMakeCache.txt; then
  rm -rf build-asan
fi
cmake -S . -B build-asan "${asan[@]}" >/dev/null
cmake --build build-asan -j "${JOBS:-$(nproc)}" --target "${asan_targets[@]}"
ctest --test-dir build-asan -L '^(checkpoint|fuzz)$' --output-on-failure --timeout 900 -j "${JOBS:-$(nproc)}"
phase "the ASan build and run"
# The GPU check's bundle, built as a GPU machine will run it (docs/GPU.md), and
# its run rehearsed here: every library found, and without a GPU exit 1 in < 5 s.
if grep -q '^TPRELOAD_CUDA:BOOL=ON' "$BUILD_DIR/CMakeCache.txt"; then
  scripts/gpu_check.sh bundle
  # (on a machine with a GPU a run is the check itself: scripts/gpu_check.sh run)
  if nvidia-smi -L >/dev/null 2>&1; then
    echo "test.sh: a GPU is here; the no-GPU rehearsal is skipped (run scripts/gpu_check.sh run)"
  else
    scripts/gpu_check.sh rehearse
  fi
  phase "the GPU check's bundle"
fi
echo "test.sh: all tests passed in $(( $(date +%s) - start )) s"
