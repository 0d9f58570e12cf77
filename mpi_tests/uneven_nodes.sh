#!/usr/bin/env bash
# uneven_nodes.sh RUNNER [ARGS...]
# Runs RUNNER on 2 ranks as if the launcher had put them on nodes of different
# sizes: rank 0 is told its node holds 1 rank (OMPI_COMM_WORLD_LOCAL_SIZE), rank
# 1 that its node holds 2. Each rank alone would choose a different default tp.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../scripts/mpi_env.sh"
exec mpirun -np 2 --oversubscribe --bind-to none bash -c \
  '[ "$OMPI_COMM_WORLD_RANK" = 0 ] && export OMPI_COMM_WORLD_LOCAL_SIZE=1; exec "$@"' \
  uneven "$@"
