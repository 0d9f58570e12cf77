#!/usr/bin/env bash
# The README's first command: install, build, and run reload_runner's demo on 4 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
NP=${NP:-4}
launch/mpirun.sh "$NP" build/reload_runner --demo
