#!/usr/bin/env bash
# The GPU check (docs/GPU.md): what only a machine with an NVIDIA GPU proves.
#
#   scripts/gpu_check.sh bundle    # here (CI too): build gpu_tests and tpreload_gpu_check
#                                  # into .gpu-bundle/ (git-ignored) with every shared
#                                  # library they need but the driver; carry it
#   scripts/gpu_check.sh rehearse  # here: nothing missing (ldd), and a run without a GPU
#                                  # ends with exit 1, saying so, within 5 s
#   scripts/gpu_check.sh [run]     # on the GPU machine: probe, gpu_tests, tpreload_gpu_check
#
# `run` builds nothing: it runs the bundle under a deadline (GPU_CHECK_DEADLINE,
# 200 s from its start), with NCCL_DEBUG=WARN and NCCL on the loopback interface,
# NCCL itself being the GPU machine's (PyTorch's wheel, else the loader's path).
# It prints one pass/fail line and exits with the status of what it ran. Then,
# only with GPU_CHECK_SUITES=1 and where the deadline leaves time, an optional
# step: the single-process model and reload suites built against that machine's
# CUDA LibTorch (with the Debian packages `prepare` put in .gpu-deps/).
#
#   scripts/gpu_check.sh prepare   # here: the packages the optional step may lack
#
# Output goes to stdout and, when $OUT is set, to $OUT/gpu_check.log (the
# optional step's configure and build logs beside it).
#
# Environment: GPU_CHECK_BUNDLE (.gpu-bundle), GPU_CHECK_SCENARIO (tiny),
# GPU_CHECK_BENCH (tinyllama; none for no bench row), GPU_CHECK_ITERS (3),
# GPU_CHECK_DIR (/tmp/tpreload-gpu-check), GPU_CHECK_DEADLINE (200),
# GPU_CHECK_SUITES (0), CUDA_ARCHS (90-real;100: sm_90 and sm_100 machine code,
# sm_100 PTX), JOBS (nproc).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
deps_dir=$root/.gpu-deps
bundle_dir=${GPU_CHECK_BUNDLE:-$root/.gpu-bundle}
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
left() { echo $(( ${GPU_CHECK_DEADLINE:-200} - SECONDS )); }

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
  # cuDNN as PyTorch's wheel ships it (nvidia/cudnn), for a CUDA LibTorch's config.
  local cudnn
  cudnn=$(python3 -c 'import glob, os, site
for r in site.getsitepackages() + [site.getusersitepackages()]:
    hits = sorted(glob.glob(os.path.join(r, "nvidia", "cudnn*", "lib", "libcudnn.so*")))
    if hits:
        print(hits[0]); break' 2>/dev/null)
  cudnn_args=()
  [ -n "$cudnn" ] && cudnn_args=("-DCUDNN_LIBRARY_PATH=$cudnn" "-DCUDNN_INCLUDE_PATH=$(dirname "$(dirname "$cudnn")")/include")
  log "cuDNN ${cudnn:-not found in site-packages}"
  find_nccl
  zlib_so=$(ldconfig -p | awk '/libz\.so\.1 .*x86-64/{print $NF; exit}')
  generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
  build=${GPU_CHECK_BUILD:-build-gpu}
  log "configure: torch ${torch_prefix:-from Debian}, zlib ${zlib_so:-system}"
  if ! cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTPRELOAD_CUDA=ON -DTPRELOAD_MPI=OFF \
    -DTPRELOAD_HDF5=OFF -DTPRELOAD_GPU_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" \
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined" \
    "-DCMAKE_PREFIX_PATH=${torch_prefix:+$torch_prefix;}$prefix/usr" "${cudnn_args[@]}" \
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

# The optional step: the single-process suites against the machine's CUDA LibTorch.
suites() {
  local rc=0
  unpack_deps
  configure_and_build || { log "FAILED: configure (log: $logs/configure.log)"; return 1; }
  build_targets model_tests reload_tests || return 1
  step 120 "model_tests against this LibTorch" "$build/tests/model_tests" --gtest_brief=1 || rc=1
  step 180 "reload_tests against this LibTorch" "$build/tests/reload_tests" --gtest_brief=1 || rc=1
  return $rc
}

# The bundle: both programs built without MPI, HDF5 or LibTorch (neither links
# it), RelWithDebInfo as the main build, machine code for sm_90 and sm_100 and
# sm_100's PTX, and beside them in lib/ every shared library they load that is
# not the C library's (found through their RUNPATH, $ORIGIN/lib). The driver
# and NCCL are loaded at run time, from the GPU machine.
bundle() {
  set -e
  local build=${GPU_CHECK_BUNDLE_BUILD:-build-gpu-bundle} start=$SECONDS
  # (the main build's type, flags and ccache settings: each object both builds
  # compile alike, all but the checkpoint layer's and the .cu files', comes
  # from the cache the main build filled)
  . scripts/ccache_env.sh
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPRELOAD_CUDA=ON -DTPRELOAD_MPI=OFF \
    -DTPRELOAD_HDF5=OFF -DTPRELOAD_PYTHON=OFF "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-90-real;100}" \
    '-DCMAKE_BUILD_RPATH=$ORIGIN/lib' >/dev/null
  cmake --build "$build" -j "${JOBS:-$(nproc)}" --target gpu_tests tpreload_gpu_check
  rm -rf "$bundle_dir" && mkdir -p "$bundle_dir/lib"
  cp "$build/tests/gpu_tests" "$build/tpreload_gpu_check" "$bundle_dir/"
  local lib
  for lib in $(ldd "$bundle_dir/gpu_tests" "$bundle_dir/tpreload_gpu_check" | awk '/=> \//{print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|ld-linux*) ;;
      *) cp -L "$lib" "$bundle_dir/lib/" ;;
    esac
  done
  echo "gpu_check: bundle in $bundle_dir ($(du -sh "$bundle_dir" | cut -f1), $(ls "$bundle_dir/lib" | wc -l) libraries) in $((SECONDS - start)) s"
}

# What a GPU machine will meet, checked here: every library found, and a run
# without a GPU ends with exit 1, saying so, within 5 s.
rehearse() {
  local missing program out rc start lib
  for program in gpu_tests tpreload_gpu_check; do
    [ -x "$bundle_dir/$program" ] || { echo "gpu_check: no $bundle_dir/$program (run: scripts/gpu_check.sh bundle)" >&2; return 1; }
    missing=$(ldd "$bundle_dir/$program" | grep "not found")
    [ -z "$missing" ] || { echo "gpu_check: $program lacks libraries: $missing" >&2; return 1; }
    # Each library the bundle carries is the one found (not the system's copy).
    for lib in "$bundle_dir"/lib/*; do
      if ldd "$bundle_dir/$program" | grep -q "$(basename "$lib") => " &&
         ! ldd "$bundle_dir/$program" | grep -q "$(basename "$lib") => $bundle_dir/lib/"; then
        echo "gpu_check: $program loads $(basename "$lib") from outside the bundle" >&2
        return 1
      fi
    done
  done
  start=$(date +%s%N)
  out=$(env -u OUT GPU_CHECK_BUNDLE="$bundle_dir" scripts/gpu_check.sh run 2>&1)
  rc=$?
  local ms=$(( ($(date +%s%N) - start) / 1000000 ))
  if [ $rc -ne 1 ] || ! grep -q "no usable GPU" <<<"$out" || [ $ms -ge 5000 ]; then
    echo "$out"
    echo "gpu_check: rehearsal FAILED: a run without a GPU exited $rc after $ms ms (want 1, 'no usable GPU', < 5000 ms)" >&2
    return 1
  fi
  echo "$out" | tail -2
  echo "gpu_check: rehearsal passed: nothing missing but the driver, and a run without a GPU exits 1 in $ms ms"
}

# On the GPU machine: the bundle's programs under the deadline.
checks() {
  local rc=0 dir=${GPU_CHECK_DIR:-/tmp/tpreload-gpu-check}
  step 60 "gpu_tests: kernels against the CPU's, copies, a launch after 'not ready', frees on a stuck device" \
    "$bundle_dir/gpu_tests" --gtest_brief=1 || rc=1
  step 120 "tpreload_gpu_check: reloads into CUDA parameters against host reloads, send/recv, bench row" \
    "$bundle_dir/tpreload_gpu_check" --dir "$dir" --scenario "${GPU_CHECK_SCENARIO:-tiny}" \
    --bench-scenario "${GPU_CHECK_BENCH:-tinyllama}" --iters "${GPU_CHECK_ITERS:-3}" || rc=1
  return $rc
}

run() {
  local rc=0
  logs=${OUT:-/tmp/gpu-check-logs}
  mkdir -p "$logs"
  log "$(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -m), $(nproc) cores"
  [ -x "$bundle_dir/tpreload_gpu_check" ] ||
    { log "FAILED: no bundle in $bundle_dir (build it with scripts/gpu_check.sh bundle and carry it)"; return 1; }
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
  # (the bundle's libraries first: a RUNPATH yields to LD_LIBRARY_PATH)
  export LD_LIBRARY_PATH=$bundle_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  find_nccl  # (sets TPRELOAD_NCCL_LIBRARY to PyTorch's NCCL where it finds one)
  if ! "$bundle_dir/tpreload_gpu_check" --probe; then
    log "no usable GPU here: nothing run"
    return 1
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,pcie.link.gen.max,pcie.link.width.max \
    --format=csv 2>&1
  checks || rc=1
  log "$([ $rc -eq 0 ] && echo "PASSED: gpu_tests and tpreload_gpu_check" || echo "FAILED: see above") in $SECONDS s"
  if [ "${GPU_CHECK_SUITES:-0}" = 1 ]; then
    if [ "$(left)" -lt 150 ]; then
      log "optional suites: skipped, $(left) s left"
    else
      probe
      suites || rc=1
    fi
  fi
  return $rc
}

case "${1:-run}" in
  prepare) prepare ;;
  bundle) bundle ;;
  rehearse) rehearse ;;
  run)
    if [ -n "${OUT:-}" ]; then run 2>&1 | tee "$OUT/gpu_check.log"; exit "${PIPESTATUS[0]}"; fi
    run
    ;;
  *) echo "usage: scripts/gpu_check.sh [bundle|rehearse|run|prepare]" >&2; exit 2 ;;
esac
