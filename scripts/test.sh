#!/usr/bin/env bash
# The README's second command (and CI's): install, build, and run every test:
# unit tests, mpi_tests at 1, 2, 4 and 8 ranks, then the checkpoint tests under ASan.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh
. scripts/mpi_env.sh
ctest --test-dir build --output-on-failure --timeout 900
# The checkpoint readers again under AddressSanitizer + UBSan (broken-file corpus):
# a second build dir holding only the checkpoint test binary.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPRELOAD_ASAN=ON >/dev/null
cmake --build build-asan -j "${JOBS:-$(nproc)}" --target checkpoint_tests
ctest --test-dir build-asan -L checkpoint --output-on-failure --timeout 900
echo "test.sh: all tests passed in $(( $(date +%s) - start )) s"
