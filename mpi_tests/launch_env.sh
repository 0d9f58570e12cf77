#!/usr/bin/env bash
# launch_env.sh
# launch/multinode.sh passes tpreload's, NCCL's and the loader's settings on to
# the remote ranks (which ssh starts without this environment): run it with an
# `mpirun` on PATH that prints its arguments, and check the -x flags it got.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work=$(mktemp -d /tmp/tpreload-launch-env-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "launch_env: FAIL: $*"; exit 1; }
cat >"$work/mpirun" <<'SH'
#!/bin/sh
printf '%s\n' "$@"
SH
chmod +x "$work/mpirun"
printf 'localhost slots=2\n' >"$work/hostfile"
args=$(env -u NCCL_DEBUG PATH="$work:$PATH" TPRELOAD_RUNNER=/bin/true \
  TPRELOAD_NCCL_LIBRARY=/opt/nccl/libnccl.so.2 NCCL_SOCKET_IFNAME=ib0 LD_LIBRARY_PATH=/opt/nccl \
  "$here/../launch/multinode.sh" "$work/hostfile" 2 --demo)
echo "$args"
# Each set variable is exported by name; one that is not set is not.
for name in OMPI_ALLOW_RUN_AS_ROOT TPRELOAD_NCCL_LIBRARY TPRELOAD_RUNNER NCCL_SOCKET_IFNAME LD_LIBRARY_PATH; do
  grep -Fxq -- "$name" <<<"$args" || fail "$name is not exported to the remote ranks"
  [ "$(grep -Fx -B1 -- "$name" <<<"$args" | head -1)" = "-x" ] || fail "$name does not follow -x"
done
! grep -Fxq NCCL_DEBUG <<<"$args" || fail "NCCL_DEBUG is exported but was not set"
# The program and its arguments come last, as given.
[ "$(tail -2 <<<"$args" | tr '\n' ' ')" = "/bin/true --demo " ] || fail "the program's arguments are not last"
echo "launch_env: PASS"
