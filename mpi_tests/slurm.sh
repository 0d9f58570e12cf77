#!/usr/bin/env bash
# slurm.sh BUILD_DIR
# A one-machine SLURM cluster made here (munged, slurmctld and slurmd with a
# slurm.conf written here, every file in a temporary folder, ports of their own),
# and launch/slurm.sbatch submitted to it with sbatch --wait:
#   1. 4 tasks = 2 replicas x tp 2 reload a checkpoint (srun --mpi=pmix); the
#      job's report must equal, parameter by parameter and rank by rank, the
#      report of the same reload under mpirun, and the replicas must agree;
#   2. the demo without --tp: the runner reads SLURM's variables (one node: tp 4)
#      and its reload equals a fresh load bit for bit.
# The daemons it started are stopped by pid at exit, also on failure. Without
# the slurm-wlm and munge packages (or without root) it says so and exits 77.
set -euo pipefail
build=$(cd "$1" && pwd)
here="$(cd "$(dirname "$0")" && pwd)"
for tool in munged slurmctld slurmd sbatch sinfo; do
  if ! command -v "$tool" >/dev/null; then
    echo "slurm: SKIP: $tool not found (apt-get install slurm-wlm munge; scripts/setup.sh does)"
    exit 77
  fi
done
if [ "$(id -u)" -ne 0 ]; then
  echo "slurm: SKIP: slurmd must run as root to start tasks"
  exit 77
fi
. "$here/../scripts/mpi_env.sh"
work=$(mktemp -d /tmp/tpreload-slurm-XXXXXX)
pids=()
stop() {
  for f in "$work"/slurmd.pid "$work"/slurmctld.pid "$work"/munged.pid; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap stop EXIT
fail() {
  echo "slurm: FAIL: $*"
  for log in "$work"/*.log; do echo "--- $log"; tail -20 "$log"; done
  exit 1
}

# munge: a key of our own, its socket in the work folder.
dd if=/dev/urandom of="$work/munge.key" bs=1024 count=1 2>/dev/null
chmod 600 "$work/munge.key"
munged --force --socket="$work/munge.sock" --key-file="$work/munge.key" --pid-file="$work/munged.pid" \
  --log-file="$work/munged.log" --seed-file="$work/munge.seed" || fail "munged did not start"

host=$(hostname)
port=$((20000 + ($$ % 5000) * 2))
mkdir "$work/state" "$work/spool"
cat >"$work/slurm.conf" <<CONF
ClusterName=tpreload$$
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge.sock
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF=$work/slurm.conf
slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start"
slurmd -f "$SLURM_CONF" || fail "slurmd did not start"
for _ in $(seq 100); do
  [ "$(sinfo -h -o %T 2>/dev/null)" = "idle" ] && break
  sleep 0.2
done
[ "$(sinfo -h -o %T)" = "idle" ] || fail "the node is not idle: $(sinfo 2>&1)"
echo "slurm: cluster up ($(sinfo -h -o '%P %D %T %N'), controller port $port)"
srun --mpi=list 2>&1 | grep -q pmix || fail "this SLURM has no pmix plugin"

cat >"$work/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
 "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 300,
 "torch_dtype": "bfloat16", "tie_word_embeddings": false}
JSON
for v in 1 2; do
  "$build/reload_ckpt" generate --config "$work/config.json" --out "$work/v$v" --seed "$v" >/dev/null
done
args=(--model "$work/v1" --weights "$work/v2" --tp 2 --log-level warn --progress off)

# 1. 2 replicas x tp 2 under SLURM, and the same reload under mpirun.
export TPRELOAD_RUNNER=$build/reload_runner
(cd "$work" && sbatch --wait --ntasks=4 --output="$work/job1.out" "$here/../launch/slurm.sbatch" \
  "${args[@]}" --report "$work/slurm-report.json") >/dev/null || { cat "$work/job1.out"; fail "job 1 failed"; }
cat "$work/job1.out"
mpirun -np 4 --oversubscribe --bind-to none "$build/reload_runner" "${args[@]}" \
  --report "$work/mpirun-report.json" >/dev/null 2>&1 || fail "the mpirun reference run failed"
/usr/bin/python3 - "$work/slurm-report.json" "$work/mpirun-report.json" <<'PY' || fail "the reports differ"
import json, sys
slurm, ref = (json.load(open(p)) for p in sys.argv[1:3])
assert len(slurm["ranks"]) == 4, "SLURM's report has %d ranks" % len(slurm["ranks"])
assert slurm["ranks"] == ref["ranks"], "per-rank parameters, shapes, dtypes or CRCs differ from mpirun's"
by_rank = [r["params"] for r in slurm["ranks"]]
assert by_rank[0] == by_rank[2] and by_rank[1] == by_rank[3], "the two replicas hold different bytes"
assert by_rank[0] != by_rank[1], "tp ranks 0 and 1 hold the same bytes"
print("slurm: report of the job = report under mpirun: %d parameters x 4 ranks; replicas agree"
      % len(by_rank[0]))
PY

# 2. The demo without --tp: the layout comes from SLURM's variables.
(cd "$work" && sbatch --wait --ntasks=4 --output="$work/job2.out" "$here/../launch/slurm.sbatch" \
  --demo --progress off) >/dev/null || { cat "$work/job2.out"; fail "job 2 failed"; }
grep -E "tp not given|logits changed" "$work/job2.out"
grep -q -- "--tp not given: tp 4 (the world; one node)" "$work/job2.out" || fail "no tp default from SLURM's variables"
grep -q "equal to a fresh load of version 2, bit for bit: yes" "$work/job2.out" || fail "the demo under SLURM"
echo "slurm: PASS"
