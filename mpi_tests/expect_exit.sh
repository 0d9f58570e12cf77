#!/usr/bin/env bash
# expect_exit.sh STATUS SECONDS REGEX -- COMMAND...
# Runs COMMAND; passes when it exits with STATUS within SECONDS and its output
# (stdout and stderr) matches the extended REGEX. For runs that must fail in one
# particular way, fast.
set -uo pipefail
want=$1 limit=$2 regex=$3
shift 3
[ "$1" = "--" ] && shift
start=${EPOCHREALTIME/./}
out=$(timeout "$((limit + 30))" "$@" 2>&1)
status=$?
elapsed_us=$(( ${EPOCHREALTIME/./} - start ))
elapsed="$((elapsed_us / 1000000)).$(printf %06d $((elapsed_us % 1000000)))"
echo "$out"
echo "expect_exit: status $status (want $want), ${elapsed} s (limit ${limit} s)"
[ "$status" -eq "$want" ] || { echo "expect_exit: FAIL: exit status $status, not $want"; exit 1; }
(( elapsed_us < limit * 1000000 )) || { echo "expect_exit: FAIL: took ${elapsed} s"; exit 1; }
grep -Eq -- "$regex" <<<"$out" || { echo "expect_exit: FAIL: output does not match: $regex"; exit 1; }
echo "expect_exit: PASS"
