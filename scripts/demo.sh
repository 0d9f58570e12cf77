#!/usr/bin/env bash
# The README's first command: install, build, and run reload_runner's demo on 4 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
export BUILD_DIR=${BUILD_DIR:-build}  # (setup.sh builds there)
TARGETS=reload_runner scripts/setup.sh  # (what the demo runs, and nothing else)
NP=${NP:-4}
launch/mpirun.sh "$NP" "$BUILD_DIR/reload_runner" --demo
