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
# Output goes to stdout and, when $OUT is set, to $OUT/gpu_check.log, with the
# configure and build logs beside it (else under /tmp/gpu-check-logs).
#
# Environment: GPU_CHECK_SCENARIO (tinyllama), GPU_CHECK_ITERS (3), JOBS (nproc),
# GPU_CHECK_BUILD (build-gpu), GPU_CHECK_DIR (/tmp/tpreload-gpu-check),
# GPU_CHECK_DEADLINE (540: seconds from the start after which the later, optional
# steps are skipped).
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
  # nccl.h of this machine's NCCL, for a GPU machine whose NCCL came without headers
  # (the library itself is loaded at run time: the machine's own).
  local nccl_h
  for nccl_h in "${NCCL_HOME:-/nonexistent}/include/nccl.h" /usr/local/cuda/include/nccl.h /usr/include/nccl.h; do
    if [ -e "$nccl_h" ]; then mkdir -p "$deps_dir/nccl/include" && cp "$nccl_h" "$deps_dir/nccl/include/"; break; fi
  done
  du -sh "$deps_dir"
  echo "gpu_check: packages in $deps_dir; carry .gpu-deps with the run"
}

log() { echo "== gpu_check: $*"; }

# Seconds left before the run's own deadline (GPU_CHECK_DEADLINE, from its start).
left() { echo $(( ${GPU_CHECK_DEADLINE:-540} - SECONDS )); }

probe() {
  log "probe ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -m), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,pcie.link.gen.max,pcie.link.width.max \
    --format=csv 2>&1 || echo "nvidia-smi: none"
  command -v nvcc >/dev/null && { command -v nvcc; nvcc --version | tail -2; } || echo "nvcc: none on PATH"
  ls -d /usr/local/cuda* 2>/dev/null
  for c in c++ g++ gcc; do command -v $c >/dev/null && { echo "$c: $($c --version | head -1)"; break; }; done
  python3 - <<'PY' 2>&1
import glob, os, site
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
          "cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI)
    print("torch cmake", torch.utils.cmake_prefix_path)
    print("torch nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")
except Exception as e:
    print("torch: none", e)
roots = [r for r in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(r)]
for r in roots:
    for p in sorted(glob.glob(os.path.join(r, "nvidia", "**", "libnccl.so*"), recursive=True)
                    + glob.glob(os.path.join(r, "nvidia", "**", "nccl.h"), recursive=True)):
        print("nccl file", p)
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

# NCCL: PyTorch's own (its wheel's libnccl.so.2 and, where shipped, nccl.h beside
# it), else the CUDA toolkit's; nccl.h carried by `prepare` where none is found.
find_nccl() {
  local find='import glob, os, site
for r in site.getsitepackages() + [site.getusersitepackages()]:
    hits = sorted(glob.glob(os.path.join(r, "nvidia", "**", "libnccl.so.2"), recursive=True))
    if hits:
        print(hits[0]); break'
  nccl_lib=$(python3 -c "$find" 2>/dev/null)
  nccl_include=
  if [ -n "$nccl_lib" ] && [ -e "$(dirname "$(dirname "$nccl_lib")")/include/nccl.h" ]; then
    nccl_include=$(dirname "$(dirname "$nccl_lib")")/include
  fi
  for d in /usr/local/cuda/include /usr/include "$deps_dir/nccl/include"; do
    [ -z "$nccl_include" ] && [ -e "$d/nccl.h" ] && nccl_include=$d
  done
  [ -n "$nccl_lib" ] && export TPRELOAD_NCCL_LIBRARY=$nccl_lib
  log "NCCL library ${nccl_lib:-libnccl.so.2 from the loader path}, nccl.h in ${nccl_include:-none found}"
  # The header and the library may come from two places: say both versions, and
  # warn where they differ (a newer header can declare what the library lacks).
  local header_version=none library_version
  [ -n "$nccl_include" ] && header_version=$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v ? "." : "") $3} END {print v}' "$nccl_include/nccl.h")
  library_version=$(python3 -c 'import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
v = ctypes.c_int()
lib.ncclGetVersion(ctypes.byref(v))
code = v.value
print("%d.%d.%d" % ((code // 10000, code // 100 % 100, code % 100) if code >= 10000 else (code // 1000, code // 100 % 10, code % 100)))' "${nccl_lib:-libnccl.so.2}" 2>/dev/null || echo unknown)
  log "nccl.h $header_version, libnccl $library_version"
  if [ "$header_version" != none ] && [ "$library_version" != unknown ] &&
     [ "${header_version%.*}" != "${library_version%.*}" ]; then
    log "WARNING: nccl.h $header_version and libnccl $library_version differ in major or minor version"
  fi
}

configure_and_build() {
  torch_prefix=$(python3 -c "import torch; print(torch.utils.cmake_prefix_path)" 2>/dev/null)
  find_nccl
  zlib_so=$(ldconfig -p | awk '/libz\.so\.1 .*x86-64/{print $NF; exit}')
  generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
  build=${GPU_CHECK_BUILD:-build-gpu}
  log "configure: torch ${torch_prefix:-from Debian}, zlib ${zlib_so:-system}"
  if ! cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTPRELOAD_CUDA=ON -DTPRELOAD_MPI=OFF \
    -DTPRELOAD_HDF5=OFF -DTPRELOAD_GPU_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" \
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined" \
    "-DCMAKE_PREFIX_PATH=${torch_prefix:+$torch_prefix;}$prefix/usr" \
    ${nccl_include:+-DNCCL_INCLUDE_DIR=$nccl_include} \
    ${zlib_so:+-DZLIB_LIBRARY=$zlib_so} -DZLIB_INCLUDE_DIR="$([ -e "$prefix/usr/include/zlib.h" ] && echo "$prefix/usr/include" || echo /usr/include)" \
    > "$logs/configure.log" 2>&1; then
    tail -60 "$logs/configure.log"
    [ -e "$build/CMakeFiles/CMakeConfigureLog.yaml" ] && tail -c 20000 "$build/CMakeFiles/CMakeConfigureLog.yaml" > "$logs/cmake_configure_tail.yaml"
    return 1
  fi
  grep -E "tpreload:|Torch|CUDA|nvtx|NCCL|Warning" "$logs/configure.log" | head -30
}

# build <targets...>: keep going past errors so that one run shows all of them.
build_targets() {
  local start=$SECONDS keep=(-k 0)
  [ ${#generator[@]} -eq 0 ] && keep=(-k)
  log "build $* ($(left) s left)"
  if ! cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "$@" -- "${keep[@]}" >> "$logs/build.log" 2>&1; then
    grep -E -B2 -A12 "error|Error" "$logs/build.log" | head -150
    log "FAILED: build of $*"
    return 1
  fi
  log "built $* in $((SECONDS - start)) s"
}

# step <seconds> <what> <command...>: one check under its own time limit.
step() {
  local limit=$1 what=$2; shift 2
  log "$what ($(left) s left)"
  timeout -k 10 "$limit" "$@"
  local rc=$?
  [ $rc -eq 124 ] && log "$what: stopped after $limit s"
  [ $rc -ne 0 ] && log "$what: FAILED (exit $rc)"
  return $rc
}

checks() {
  local rc=0 dir=${GPU_CHECK_DIR:-/tmp/tpreload-gpu-check}
  # What only the GPU proves first: the kernels, copies and frees, then the reloads.
  if build_targets gpu_tests tpreload_gpu_check; then
    step 180 "gpu_tests: the device int8 kernel against the CPU kernel, strided copies, frees on a stuck device" \
      "$build/tests/gpu_tests" || rc=1
    step 240 "tpreload_gpu_check: reloads into CUDA parameters, CRC-32 against the host, bench row" \
      "$build/tpreload_gpu_check" --dir "$dir" --scenario "${GPU_CHECK_SCENARIO:-tinyllama}" \
      --iters "${GPU_CHECK_ITERS:-3}" || rc=1
  else
    rc=1
  fi
  # Then the single-process suites against this LibTorch, where time is left.
  if [ "$(left)" -lt 150 ]; then
    log "model and reload suites: skipped, $(left) s left"
    return 1
  fi
  if build_targets model_tests reload_tests; then
    step 120 "model_tests against this LibTorch" "$build/tests/model_tests" --gtest_brief=1 || rc=1
    step 180 "reload_tests against this LibTorch" "$build/tests/reload_tests" --gtest_brief=1 || rc=1
  else
    rc=1
  fi
  # A second bench row with larger buckets, where time is left.
  if [ $rc -eq 0 ] && [ "$(left)" -gt 90 ]; then
    step 80 "tpreload_gpu_check with 64 MiB buckets" "$build/tpreload_gpu_check" --dir "$dir" \
      --scenario "${GPU_CHECK_SCENARIO:-tinyllama}" --iters "${GPU_CHECK_ITERS:-3}" --bucket-mb 64 || rc=1
  fi
  return $rc
}

run() {
  local rc=0
  logs=${OUT:-/tmp/gpu-check-logs}
  mkdir -p "$logs"
  probe
  unpack_deps
  configure_and_build || { log "FAILED: configure (log: $logs/configure.log)"; return 1; }
  checks || rc=1
  log "$([ $rc -eq 0 ] && echo "all checks passed" || echo "SOME CHECKS FAILED") in $SECONDS s"
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
