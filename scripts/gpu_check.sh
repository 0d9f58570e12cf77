#!/usr/bin/env bash
# The GPU check (docs/GPU.md): what only a machine with an NVIDIA GPU proves.
#
#   scripts/gpu_check.sh prepare   # on a Debian 12 machine with apt: fetch the Debian
#                                  # packages a GPU machine may lack into .gpu-deps/
#                                  # (git-ignored; carry it to the GPU machine)
#   scripts/gpu_check.sh [run]     # on the GPU machine: probe, build, check
#
# `run` builds against that machine's own CUDA LibTorch (PyTorch's, found from
# python3) and NCCL (PyTorch's nvidia-nccl package, or the CUDA toolkit's), with
# no MPI and no HDF5 (the engine needs neither; the check runs at world size 1),
# taking spdlog, fmt, nlohmann-json, GoogleTest and zlib's headers from .gpu-deps/
# where the machine lacks them. Then: the CUDA kernel and copy tests (gpu_tests),
# the single-process model and reload suites, and tpreload_gpu_check (a
# TinyLlama-sized checkpoint reloaded into CUDA parameters over NCCL, over host
# staging, and in int8, each compared by CRC-32 with a host reload, pointers
# unchanged, and one bench row against a pinned cudaMemcpy of the same bytes).
# Output goes to stdout and, when $OUT is set, to $OUT/gpu_check.log.
#
# Environment: GPU_CHECK_SCENARIO (tinyllama), GPU_CHECK_ITERS (3), JOBS (nproc),
# GPU_CHECK_BUILD (build-gpu), GPU_CHECK_DIR (/tmp/tpreload-gpu-check).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
deps_dir=$root/.gpu-deps
DEB_PACKAGES=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 nlohmann-json3-dev libgtest-dev zlib1g-dev)

prepare() {
  set -e
  mkdir -p "$deps_dir"
  apt-get update -qq
  (cd "$deps_dir" && apt-get download "${DEB_PACKAGES[@]}")
  du -sh "$deps_dir"
  echo "gpu_check: packages in $deps_dir; carry .gpu-deps with the run"
}

log() { echo "== gpu_check: $*"; }

probe() {
  log "probe ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -m), $(nproc) cores)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "nvidia-smi: none"
  command -v nvcc >/dev/null && nvcc --version | tail -2 || echo "nvcc: none on PATH"
  ls -d /usr/local/cuda* 2>/dev/null
  python3 - <<'PY' 2>&1
import importlib, os
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
          "cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI)
    print("torch cmake", torch.utils.cmake_prefix_path)
except Exception as e:
    print("torch: none", e)
try:
    import nvidia.nccl as n
    print("nccl package", list(n.__path__)[0])
except Exception as e:
    print("nccl package: none", e)
PY
  cmake --version | head -1 || true
  command -v ninja >/dev/null && echo "ninja $(ninja --version)" || echo "ninja: none"
  command -v mpirun >/dev/null && mpirun --version 2>&1 | head -1 || echo "mpirun: none (not needed)"
  for h in spdlog/spdlog.h nlohmann/json.hpp gtest/gtest.h zlib.h hdf5.h; do
    [ -e "/usr/include/$h" ] && echo "system header $h: yes" || echo "system header $h: no"
  done
}

# Unpack the carried packages (headers, static and shared libraries, CMake configs).
unpack_deps() {
  prefix=/tmp/gpu-deps
  rm -rf "$prefix" && mkdir -p "$prefix"
  if ls "$deps_dir"/*.deb >/dev/null 2>&1; then
    for deb in "$deps_dir"/*.deb; do dpkg -x "$deb" "$prefix"; done
    log "unpacked $(ls "$deps_dir"/*.deb | wc -l) carried packages into $prefix"
  else
    log "no carried packages in $deps_dir (scripts/gpu_check.sh prepare); using the system's"
  fi
  export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

configure_and_build() {
  torch_prefix=$(python3 -c "import torch; print(torch.utils.cmake_prefix_path)" 2>/dev/null)
  nccl_home=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null)
  [ -n "$nccl_home" ] && export NCCL_HOME=$nccl_home TPRELOAD_NCCL_LIBRARY=$nccl_home/lib/libnccl.so.2
  zlib_so=$(ldconfig -p | awk '/libz\.so\.1 .*x86-64/{print $NF; exit}')
  generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
  build=${GPU_CHECK_BUILD:-build-gpu}
  log "configure: torch ${torch_prefix:-from Debian}, NCCL ${nccl_home:-from the CUDA toolkit}, zlib ${zlib_so:-system}"
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTPRELOAD_CUDA=ON -DTPRELOAD_MPI=OFF \
    -DTPRELOAD_HDF5=OFF -DTPRELOAD_GPU_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" \
    "-DCMAKE_PREFIX_PATH=${torch_prefix:+$torch_prefix;}$prefix/usr" \
    ${nccl_home:+-DNCCL_INCLUDE_DIR=$nccl_home/include} \
    ${zlib_so:+-DZLIB_LIBRARY=$zlib_so} -DZLIB_INCLUDE_DIR="$([ -e "$prefix/usr/include/zlib.h" ] && echo "$prefix/usr/include" || echo /usr/include)" \
    || return 1
  local start=$SECONDS
  cmake --build "$build" -j "${JOBS:-$(nproc)}" --target tpreload_gpu_check gpu_tests model_tests reload_tests \
    || return 1
  log "built in $((SECONDS - start)) s"
}

checks() {
  local rc=0
  log "gpu_tests: the device int8 kernel against the CPU kernel, strided copies, frees on a stuck device"
  "$build/tests/gpu_tests" || rc=1
  log "model and reload suites (single process) against this LibTorch"
  "$build/tests/model_tests" --gtest_brief=1 || rc=1
  "$build/tests/reload_tests" --gtest_brief=1 || rc=1
  log "tpreload_gpu_check: reloads into CUDA parameters, CRC-32 against the host, bench row"
  "$build/tpreload_gpu_check" --dir "${GPU_CHECK_DIR:-/tmp/tpreload-gpu-check}" \
    --scenario "${GPU_CHECK_SCENARIO:-tinyllama}" --iters "${GPU_CHECK_ITERS:-3}" || rc=1
  return $rc
}

run() {
  local start=$SECONDS rc=0
  probe
  unpack_deps
  configure_and_build || { log "FAILED: configure or build"; return 1; }
  checks || rc=1
  log "$([ $rc -eq 0 ] && echo "all checks passed" || echo "SOME CHECKS FAILED") in $((SECONDS - start)) s"
  return $rc
}

case "${1:-run}" in
  prepare) prepare ;;
  run)
    if [ -n "${OUT:-}" ]; then run 2>&1 | tee "$OUT/gpu_check.log"; exit "${PIPESTATUS[0]}"; fi
    run
    ;;
  *) echo "usage: scripts/gpu_check.sh [prepare|run]" >&2; exit 2 ;;
esac
