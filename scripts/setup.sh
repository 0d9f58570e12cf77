#!/usr/bin/env bash
# Install what is missing (Debian 12), configure and build tpreload.
#   scripts/setup.sh [extra cmake args...]
# Environment: BUILD_DIR (default build), BUILD_TYPE (default RelWithDebInfo), JOBS,
# TARGETS (default: everything; the demo builds reload_runner alone, and then
# installs only what building it needs).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=${TARGETS:-}
# What configuring and building the libraries and programs needs (GoogleTest:
# the configure step finds it whether or not the tests are built).
PACKAGES=(cmake g++ make ccache pkg-config
          libtorch-dev libopenmpi-dev openmpi-bin libhdf5-dev libspdlog-dev libgtest-dev
          nlohmann-json3-dev libcli11-dev zlib1g-dev)
if [ -z "$TARGETS" ]; then
  PACKAGES+=(python3-h5py python3-numpy python3-dev pybind11-dev python3-torch python3-pytest
             iproute2 slurm-wlm munge     # the multi-host and SLURM tests
             clang libclang-rt-14-dev)    # the libFuzzer targets (scripts/fuzz.sh)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo}
JOBS=${JOBS:-$(nproc)}
. scripts/ccache_env.sh
start=$(date +%s)
# The Python module is built for Debian's python3, the one python3-torch and
# python3-pytest belong to (another python3 earlier on PATH would not see them).
python=()
[ -x /usr/bin/python3 ] && python=(-DPython3_EXECUTABLE=/usr/bin/python3)
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "${python[@]}" "$@" >/dev/null
target=()
[ -n "$TARGETS" ] && target=(--target $TARGETS)
cmake --build "$BUILD_DIR" -j "$JOBS" "${target[@]}"
echo "setup: built ${TARGETS:-everything} in $BUILD_DIR ($BUILD_TYPE) in $(( $(date +%s) - start )) s"
