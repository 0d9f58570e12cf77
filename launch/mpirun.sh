#!/usr/bin/env bash
# Run a tpreload program on one node under Open MPI.
#   launch/mpirun.sh NP PROGRAM [ARGS...]
# e.g. launch/mpirun.sh 4 build/reload_runner --demo
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../scripts/mpi_env.sh"
if [ $# -lt 2 ]; then
  echo "usage: $0 NP PROGRAM [ARGS...]" >&2
  exit 2
fi
np=$1
shift
# Ranks' stderr is a pipe under mpirun: tell them whether the user's is a terminal.
if [ -t 2 ]; then export TPRELOAD_PROGRESS=${TPRELOAD_PROGRESS:-tty}; else export TPRELOAD_PROGRESS=${TPRELOAD_PROGRESS:-log}; fi
exec mpirun -np "$np" --oversubscribe --bind-to none -x TPRELOAD_PROGRESS "$@"
