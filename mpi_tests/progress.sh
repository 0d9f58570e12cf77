#!/usr/bin/env bash
# progress.sh BUILD_DIR
# The reader rank's progress as a user sees it through launch/mpirun.sh: under a
# pseudo-terminal (script(1)) one line redrawn in place; piped, log lines and no
# terminal control codes; --quiet, neither.
set -euo pipefail
build=$1
here="$(cd "$(dirname "$0")" && pwd)"
launch="$here/../launch/mpirun.sh"
run=("$launch" 2 "$build/reload_runner" --demo)
fail() { echo "progress: FAIL: $*"; exit 1; }

tty_out=$(script -qec "$(printf '%q ' "${run[@]}")" /dev/null)
grep -q $'\r\033\\[Kreload: [0-9.]* / [0-9.]* GB (100%), [0-9.]* GB/s, done in' <<<"$tty_out" ||
  fail "no redrawn progress line under a terminal: $tty_out"
grep -q "reload progress:" <<<"$tty_out" && fail "log lines under a terminal"
echo "terminal: $(grep -c $'\033\\[K' <<<"$tty_out") redrawn line(s)"

piped=$("${run[@]}" 2>&1 | cat)
grep -Eq "\[rank 0/2\] \[info\] reload progress: [0-9.]+ / [0-9.]+ GB \(100%\), [0-9.]+ GB/s, done in" <<<"$piped" ||
  fail "no progress log line when piped: $piped"
grep -q $'\033' <<<"$piped" && fail "terminal control codes in piped output"
grep -q "reload progress:" <<<"$(grep -v '\[rank 0/2\]' <<<"$piped")" && fail "a rank other than the reader printed progress"
echo "piped: $(grep -c 'reload progress:' <<<"$piped") log line(s)"

quiet=$("${run[@]}" --quiet 2>&1 | cat)
grep -Eq "reload progress|\[info\]" <<<"$quiet" && fail "--quiet printed progress or info lines: $quiet"
echo "progress: PASS"
