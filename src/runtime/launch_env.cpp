#include "tpreload/runtime/launch_env.h"

#include <cstdlib>
#include <string>

#include "tpreload/core/error.h"

namespace tpreload {
namespace {

std::optional<int> number(const std::function<const char*(const char*)>& get, const char* name) {
  const char* value = get(name);
  if (!value || !*value) return std::nullopt;
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (*end != '\0' || v < 0 || v > 1 << 30)
    raise<UsageError>("environment variable ", name, "='", value, "' is not a non-negative number");
  return static_cast<int>(v);
}

// SLURM_TASKS_PER_NODE: "4", "4(x2)", "4(x2),2": uniform when one count covers every node.
bool uniform_tasks(const char* text) {
  if (!text || !*text) return true;
  const std::string s = text;
  return s.find(',') == std::string::npos;
}

}  // namespace

LaunchLayout layout_from_environment(const std::function<const char*(const char*)>& get) {
  LaunchLayout l;
  // Open MPI's mpirun and PMIx launchers: rank, size and the node-local pair.
  // Neither exports the node count; with the same count on every node (the usual
  // --map-by) it is world / local size.
  struct Names {
    const char *launcher, *rank, *size, *local_rank, *local_size;
  };
  for (const Names& n :
       {Names{"open-mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
              "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
        Names{"pmix", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"}}) {
    if (n.launcher == std::string("pmix") && number(get, "SLURM_PROCID")) continue;  // srun's own
    const auto rank = number(get, n.rank);
    if (!rank) continue;
    l.launcher = n.launcher;
    l.world_rank = *rank;
    l.world_size = number(get, n.size).value_or(1);
    l.local_rank = number(get, n.local_rank);
    l.local_size = number(get, n.local_size);
    if (l.local_size && *l.local_size > 0 && l.world_size % *l.local_size == 0)
      l.nodes = l.world_size / *l.local_size;
    return l;
  }
  if (const auto rank = number(get, "SLURM_PROCID")) {
    l.launcher = "slurm";
    l.world_rank = *rank;
    l.world_size = number(get, "SLURM_NTASKS").value_or(number(get, "SLURM_NPROCS").value_or(1));
    l.local_rank = number(get, "SLURM_LOCALID");
    l.nodes = number(get, "SLURM_STEP_NUM_NODES");
    if (!l.nodes) l.nodes = number(get, "SLURM_NNODES");
    l.uniform = uniform_tasks(get("SLURM_STEP_TASKS_PER_NODE") ? get("SLURM_STEP_TASKS_PER_NODE")
                                                               : get("SLURM_TASKS_PER_NODE"));
    if (l.nodes && *l.nodes > 0 && l.uniform && l.world_size % *l.nodes == 0)
      l.local_size = l.world_size / *l.nodes;
    return l;
  }
  return l;
}

int default_tp_size(const LaunchLayout& l, std::string* why) {
  auto say = [&](const std::string& text) {
    if (why) *why = text;
  };
  if (l.nodes && *l.nodes > 1 && l.uniform && l.world_size % *l.nodes == 0) {
    const int per_node = l.world_size / *l.nodes;
    say(detail::concat("--tp not given: tp ", per_node, " (the ranks per node: ", l.world_size,
                       " ranks on ", *l.nodes, " nodes, from ", l.launcher,
                       "'s variables); one tp group per node, ", *l.nodes, " replicas"));
    return per_node;
  }
  if (l.nodes && *l.nodes > 1)
    say(detail::concat("--tp not given: tp ", l.world_size, " (the world: ", l.world_size,
                       " ranks on ", *l.nodes, " nodes do not split evenly)"));
  else
    say(detail::concat("--tp not given: tp ", l.world_size, " (the world; one node)"));
  return l.world_size;
}

std::string describe_layout(const LaunchLayout& l, int tp) {
  std::string local =
      l.local_rank ? detail::concat(" on node-local rank ", *l.local_rank,
                                    l.local_size ? detail::concat(" of ", *l.local_size) : "")
                   : "";
  std::string nodes =
      l.nodes ? detail::concat(", ", *l.nodes, " node", *l.nodes == 1 ? "" : "s") : "";
  return detail::concat("world rank ", l.world_rank, " of ", l.world_size, local, nodes, " (",
                        l.launcher, "); tp ", tp, ": tp rank ", l.world_rank % tp, " of replica ",
                        l.world_rank / tp);
}

}  // namespace tpreload
