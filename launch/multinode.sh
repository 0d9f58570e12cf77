#!/usr/bin/env bash
# Run on several nodes with Open MPI's launcher.
#   launch/multinode.sh HOSTFILE NP [reload_runner args...]
# HOSTFILE lists "host slots=N" lines; the build must be at the same path on every host.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../scripts/mpi_env.sh"
if [ $# -lt 2 ]; then
  echo "usage: $0 HOSTFILE NP [reload_runner args...]" >&2
  exit 2
fi
hostfile=$1 np=$2
shift 2
# reload_runner: $TPRELOAD_RUNNER, else the build tree's, else an installed one.
runner=${TPRELOAD_RUNNER:-}
for candidate in "$here/../build/reload_runner" "$here/../../../bin/reload_runner"; do
  if [ -z "$runner" ] && [ -x "$candidate" ]; then runner=$candidate; fi
done
runner=${runner:-$(command -v reload_runner || echo reload_runner)}
# The remote ranks start (over ssh) without this environment: export to them the
# root/oversubscription settings, and tpreload's, NCCL's and the loader's
# settings that are set here (TPRELOAD_NCCL_LIBRARY, NCCL_*, LD_LIBRARY_PATH...),
# so that every host runs with the same ones.
# (LD_LIBRARY_PATH replaces the remote hosts' own: the hosts are alike, with the
# build at the same path.)
forward=(-x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
         -x OMPI_MCA_btl_vader_single_copy_mechanism)
for name in "${!TPRELOAD_@}" "${!NCCL_@}" LD_LIBRARY_PATH; do
  # exported ones only
  if [[ $(declare -p "$name" 2>/dev/null) =~ ^declare\ -[a-zA-Z]*x ]]; then
    forward+=(-x "$name")
  fi
done
exec mpirun --hostfile "$hostfile" -np "$np" --bind-to none "${forward[@]}" "$runner" "$@"
