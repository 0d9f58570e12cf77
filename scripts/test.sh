#!/usr/bin/env bash
# The README's second command (and CI's): install, build, and run every test:
# unit tests, mpi_tests at 1, 2, 4 and 8 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh
. scripts/mpi_env.sh
ctest --test-dir build --output-on-failure --timeout 900
echo "test.sh: all tests passed in $(( $(date +%s) - start )) s"
