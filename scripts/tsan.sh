#!/usr/bin/env bash
# scripts/tsan.sh [NP...]
# The threaded code under ThreadSanitizer: builds the single-process tests of the
# layers that run threads (the reload pipeline's reader and apply threads, the
# progress reporter, the readers' staging copies, the comm waits) and the MPI
# tests of the engine into build-tsan/ (-fsanitize=thread, CUDA off), runs the
# first alone and the second at each NP (default 2 and 4), and fails on any
# ThreadSanitizer report. Not part of the test command: on 2 cores the build
# takes about 15 minutes and the runs 8 more. Races inside Open MPI, which is not instrumented,
# are suppressed (scripts/tsan.supp); every report in tpreload's code counts.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(2 4)
out=${TPRELOAD_TSAN_BUILD:-$root/build-tsan}
cmake -S . -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPRELOAD_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread >/dev/null
single=(reload_tests comm_tests runtime_tests checkpoint_tests)
multi=(mpi_reload_tests mpi_data_plane_tests mpi_reliability_tests mpi_integrity_tests)
cmake --build "$out" -j "${JOBS:-$(nproc)}" --target "${single[@]}" "${multi[@]}"
. scripts/mpi_env.sh
export TSAN_OPTIONS="halt_on_error=0 report_signal_unsafe=0 suppressions=$root/scripts/tsan.supp"
logs=$out/tsan-logs
rm -rf "$logs" && mkdir -p "$logs"
failed=0
check() {  # NAME LOG: the run's status and its reports
  local reports
  reports=$(grep -c 'WARNING: ThreadSanitizer' "$2" || true)
  if [ "$3" -ne 0 ] || [ "$reports" -ne 0 ]; then
    echo "tsan: $1: exit status $3, $reports report(s): $2" >&2
    failed=1
  else
    echo "tsan: $1: passed, no reports"
  fi
}
for t in "${single[@]}"; do
  rc=0
  "$out/tests/$t" >"$logs/$t.log" 2>&1 || rc=$?
  check "$t" "$logs/$t.log" "$rc"
done
for n in "${sizes[@]}"; do
  for t in "${multi[@]}"; do
    rc=0
    TSAN_OPTIONS="$TSAN_OPTIONS log_path=$logs/$t.np$n" \
      launch/mpirun.sh "$n" "$out/mpi_tests/$t" >"$logs/$t.np$n.log" 2>&1 || rc=$?
    cat "$logs/$t.np$n".* >>"$logs/$t.np$n.log" 2>/dev/null || true
    check "$t at $n ranks" "$logs/$t.np$n.log" "$rc"
  done
done
[ "$failed" -eq 0 ] && echo "tsan: no ThreadSanitizer reports"
exit "$failed"
