#!/usr/bin/env bash
# multihost.sh BUILD_DIR
# Two hosts on this machine: network namespaces joined by a veth pair on a private
# range that exists only inside them, each with its own hostname (unshare --uts),
# so that Open MPI sees two nodes: shared memory inside each, TCP between them.
# mpirun runs on host A and starts host B's daemon through a plm_rsh_agent script
# (ip netns exec). Across the hosts, 4 ranks (2 per host):
#   1. each rank reports its host and node-local rank;
#   2. mpi_reload_tests reload models with a tp group spanning both hosts, in both
#      distributions and both formats, and replicas across them, checking every
#      byte against their independent slicing; with --readers node each host is a
#      node with its own reader;
#   3. launch/multinode.sh runs reload_runner --demo (which checks its logits
#      against a fresh load); without --tp it takes tp 2 (the ranks per node):
#      one tp group per host, the hosts replicas.
# The namespaces (and anything left running in them) are removed at exit, also on
# failure. Needs root (ip netns); otherwise it says so and exits 77 (ctest: skipped).
set -euo pipefail
build=$(cd "$1" && pwd)
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
  echo "multihost: SKIP: needs root, ip (iproute2) and unshare to make network namespaces"
  exit 77
fi
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../scripts/mpi_env.sh"
tag=tpr$$
net=10.213.7
work=$(mktemp -d /tmp/tpreload-multihost-XXXXXX)
hosts=(a b)
cleanup() {
  for h in "${hosts[@]}"; do
    if ip netns list | grep -qw "$tag$h"; then
      ip netns pids "$tag$h" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
      ip netns del "$tag$h"
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "multihost: FAIL: $*"; exit 1; }

if ! error=$(ip netns add "${tag}a" 2>&1); then
  echo "multihost: SKIP: this machine does not let root make network namespaces: $error"
  exit 77
fi
ip netns add "${tag}b"
ip link add "${tag}va" type veth peer name "${tag}vb"
for i in 0 1; do
  h=${hosts[$i]}
  ip link set "${tag}v$h" netns "$tag$h"
  ip -n "$tag$h" addr add "$net.$((i + 1))/24" dev "${tag}v$h"
  ip -n "$tag$h" link set lo up
  ip -n "$tag$h" link set "${tag}v$h" up
  printf '%s slots=2\n' "$net.$((i + 1))" >>"$work/hostfile"
done
# Nothing but loopback and the pair: no traffic can leave the namespaces.
for h in "${hosts[@]}"; do
  links=$(ip -n "$tag$h" -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort | tr '\n' ' ')
  [ "$links" = "lo ${tag}v$h " ] || fail "namespace $tag$h has links: $links"
done

# Open MPI's remote shell: "agent [options] HOST COMMAND..." runs COMMAND on HOST.
cat >"$work/agent" <<AGENT
#!/usr/bin/env bash
while [[ \$1 == -* ]]; do shift; done
host=\$1; shift
case \$host in
  $net.1) ns=${tag}a name=host-a ;;
  $net.2) ns=${tag}b name=host-b ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec \$ns unshare --uts /bin/sh -c "hostname \$name; exec /bin/sh -c \\"\\\$0\\"" "\$*"
AGENT
chmod +x "$work/agent"

# mpirun on host A; every rank gets the environment scripts/mpi_env.sh set.
across() {
  ip netns exec "${tag}a" unshare --uts /bin/sh -c 'hostname host-a; exec "$@"' sh \
    timeout 300 mpirun --hostfile "$work/hostfile" -np 4 --bind-to none \
    --mca plm_rsh_agent "$work/agent" --mca oob_tcp_if_include "$net.0/24" \
    --mca btl self,vader,tcp --mca btl_tcp_if_include "$net.0/24" \
    -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
    -x OMPI_MCA_btl_vader_single_copy_mechanism -x TPRELOAD_PROGRESS=off "$@"
}

places=$(across /bin/sh -c 'echo "$(hostname) rank $OMPI_COMM_WORLD_RANK local $OMPI_COMM_WORLD_LOCAL_RANK/$OMPI_COMM_WORLD_LOCAL_SIZE"' | sort)
echo "$places"
want=$'host-a rank 0 local 0/2\nhost-a rank 1 local 1/2\nhost-b rank 2 local 0/2\nhost-b rank 3 local 1/2'
[ "$places" = "$want" ] || fail "the ranks are not two per host"

tests=$(across "$build/mpi_tests/mpi_reload_tests" --gtest_color=no \
  --gtest_filter='Reload.CheckpointFormatEverySourceAndDistribution:Reload.KernelFormat*:Reload.TwoReplicasOfHalfTheWorld:UnderMpi.ReadersNodeGroupsTheRanksOfAHost' 2>&1) ||
  { echo "$tests"; fail "mpi_reload_tests across the hosts"; }
grep -E "^\[       OK \]|mpi verdict" <<<"$tests"
[ "$(grep -c '^\[       OK \]' <<<"$tests")" -eq 5 ] || fail "expected 5 tests to pass (rank 0 prints; the verdict counts every rank)"
grep -q "mpi verdict: 0 of 4 ranks had failures" <<<"$tests" || fail "a rank failed"

# The user's way: launch/multinode.sh with the MCA settings in the environment.
demo=$(ip netns exec "${tag}a" unshare --uts /bin/sh -c 'hostname host-a; exec "$@"' sh \
  env OMPI_MCA_plm_rsh_agent="$work/agent" OMPI_MCA_oob_tcp_if_include="$net.0/24" \
  OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include="$net.0/24" TPRELOAD_PROGRESS=off \
  TPRELOAD_RUNNER="$build/reload_runner" timeout 300 "$here/../launch/multinode.sh" "$work/hostfile" 4 \
  --demo 2>&1) || { echo "$demo"; fail "launch/multinode.sh ... --demo across the hosts"; }
grep -E "tp not given|demo: logits" <<<"$demo"
grep -q "logits changed: yes; equal to a fresh load of version 2, bit for bit: yes; parameters stayed in place: yes" \
  <<<"$demo" || fail "the demo's reload across the hosts is not a fresh load's"
grep -q -- "--tp not given: tp 2 (the ranks per node: 4 ranks on 2 nodes" <<<"$demo" ||
  fail "--tp did not default to the ranks per host"
echo "multihost: PASS"
