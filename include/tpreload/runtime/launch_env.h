// Where this process sits in the job, read from the launcher's environment:
// Open MPI's mpirun (OMPI_COMM_WORLD_*), a PMIx launcher (PMIX_RANK), SLURM's
// srun (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NNODES,
// SLURM_TASKS_PER_NODE). The runner uses it to choose the default tensor-parallel
// size and to say how ranks map to tp groups and replicas. No MPI here: it reads
// variables only, so it is tested against each launcher's set.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace tpreload {

struct LaunchLayout {
  std::string launcher = "none";  // "open-mpi", "slurm", "pmix" or "none"
  int world_rank = 0;
  int world_size = 1;
  std::optional<int> local_rank;  // this process's index on its node
  std::optional<int> local_size;  // processes on this node
  std::optional<int> nodes;       // nodes in the job
  // Whether every node runs the same number of processes (as far as the
  // variables say; SLURM_TASKS_PER_NODE "4(x2)" does, "4,2" does not).
  bool uniform = true;
};

// Reads the variables through `get` (std::getenv by default). Open MPI's
// variables win over SLURM's when both are set (mpirun inside an allocation),
// SLURM's over PMIx's (srun --mpi=pmix sets both; SLURM's name the node count).
// Throws UsageError for a variable that is set but not a number.
LaunchLayout layout_from_environment(const std::function<const char*(const char*)>& get =
                                         [](const char* name) { return std::getenv(name); });

// The tensor-parallel size when none is given: the processes per node when the
// nodes are known, uniform and divide the world (one tp group per node,
// replicas across nodes), else the world size. `why` (optional) gets one line
// saying which and why, for the log.
int default_tp_size(const LaunchLayout& layout, std::string* why = nullptr);

// One line: "world rank 5 of 8 on node-local rank 1 of 4, 2 nodes; tp 4: tp rank 1
// of replica 1" for logs.
std::string describe_layout(const LaunchLayout& layout, int tp_size);

}  // namespace tpreload
