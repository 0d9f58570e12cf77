// The launcher's environment read into a layout, for each launcher's set of
// variables as it exports them, and the --tp default that follows from it. The
// expected layouts are written out by hand from how each launcher places ranks.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tpreload/core/error.h"
#include "tpreload/runtime/launch_env.h"

namespace tpreload {
namespace {

using Vars = std::map<std::string, std::string>;

LaunchLayout read(const Vars& vars) {
  return layout_from_environment([&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(LaunchEnv, NoLauncherIsOneProcess) {
  const LaunchLayout l = read({{"HOME", "/root"}});
  EXPECT_EQ(l.launcher, "none");
  EXPECT_EQ(l.world_rank, 0);
  EXPECT_EQ(l.world_size, 1);
  EXPECT_FALSE(l.nodes);
  EXPECT_EQ(default_tp_size(l), 1);
}

// mpirun -np 8 over two hosts with 4 slots each: rank 6 is the third on host 2.
TEST(LaunchEnv, OpenMpiAcrossTwoNodes) {
  const LaunchLayout l = read({{"OMPI_COMM_WORLD_RANK", "6"},
                               {"OMPI_COMM_WORLD_SIZE", "8"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                               {"OMPI_COMM_WORLD_NODE_RANK", "2"}});
  EXPECT_EQ(l.launcher, "open-mpi");
  EXPECT_EQ(l.world_rank, 6);
  EXPECT_EQ(l.world_size, 8);
  EXPECT_EQ(l.local_rank, 2);
  EXPECT_EQ(l.local_size, 4);
  EXPECT_EQ(l.nodes, 2);
  std::string why;
  EXPECT_EQ(default_tp_size(l, &why), 4);
  EXPECT_NE(why.find("tp 4 (the ranks per node: 8 ranks on 2 nodes"), std::string::npos) << why;
  EXPECT_EQ(describe_layout(l, 4),
            "world rank 6 of 8 on node-local rank 2 of 4, 2 nodes (open-mpi); tp 4: tp rank 2 of "
            "replica 1");
}

TEST(LaunchEnv, OpenMpiOnOneNodeUsesTheWorld) {
  const LaunchLayout l = read({{"OMPI_COMM_WORLD_RANK", "1"},
                               {"OMPI_COMM_WORLD_SIZE", "4"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(l.nodes, 1);
  std::string why;
  EXPECT_EQ(default_tp_size(l, &why), 4);
  EXPECT_NE(why.find("the world; one node"), std::string::npos) << why;
}

// sbatch --nodes=2 --ntasks-per-node=2, then srun: task 3 is the second on node 2.
TEST(LaunchEnv, SlurmSrunStep) {
  const LaunchLayout l = read({{"SLURM_PROCID", "3"},
                               {"SLURM_NTASKS", "4"},
                               {"SLURM_LOCALID", "1"},
                               {"SLURM_NNODES", "2"},
                               {"SLURM_STEP_NUM_NODES", "2"},
                               {"SLURM_TASKS_PER_NODE", "2(x2)"},
                               {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                               {"PMIX_RANK", "3"},
                               {"PMIX_SIZE", "4"}});  // srun --mpi=pmix sets both
  EXPECT_EQ(l.launcher, "slurm");
  EXPECT_EQ(l.world_rank, 3);
  EXPECT_EQ(l.world_size, 4);
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.local_size, 2);
  EXPECT_EQ(l.nodes, 2);
  EXPECT_TRUE(l.uniform);
  EXPECT_EQ(default_tp_size(l), 2);
  EXPECT_EQ(
      describe_layout(l, 2),
      "world rank 3 of 4 on node-local rank 1 of 2, 2 nodes (slurm); tp 2: tp rank 1 of replica 1");
}

// 6 tasks on 2 nodes as 4 + 2: no per-node tp, the world it is.
TEST(LaunchEnv, SlurmUnevenNodesFallBackToTheWorld) {
  const LaunchLayout l = read({{"SLURM_PROCID", "5"},
                               {"SLURM_NTASKS", "6"},
                               {"SLURM_LOCALID", "1"},
                               {"SLURM_NNODES", "2"},
                               {"SLURM_TASKS_PER_NODE", "4,2"}});
  EXPECT_FALSE(l.uniform);
  EXPECT_FALSE(l.local_size);
  std::string why;
  EXPECT_EQ(default_tp_size(l, &why), 6);
  EXPECT_NE(why.find("do not split evenly"), std::string::npos) << why;
}

// The batch script itself (no srun step yet) sees SLURM_NPROCS on older SLURMs.
TEST(LaunchEnv, SlurmWithNprocsOnly) {
  const LaunchLayout l =
      read({{"SLURM_PROCID", "0"}, {"SLURM_NPROCS", "8"}, {"SLURM_NNODES", "4"}});
  EXPECT_EQ(l.world_size, 8);
  EXPECT_EQ(l.local_size, 2);
  EXPECT_EQ(default_tp_size(l), 2);
}

TEST(LaunchEnv, PmixLauncher) {
  const LaunchLayout l = read({{"PMIX_RANK", "5"},
                               {"PMIX_SIZE", "12"},
                               {"PMIX_LOCAL_RANK", "2"},
                               {"PMIX_LOCAL_SIZE", "3"}});
  EXPECT_EQ(l.launcher, "pmix");
  EXPECT_EQ(l.nodes, 4);
  EXPECT_EQ(default_tp_size(l), 3);
  EXPECT_EQ(
      describe_layout(l, 3),
      "world rank 5 of 12 on node-local rank 2 of 3, 4 nodes (pmix); tp 3: tp rank 2 of replica 1");
}

// mpirun inside a SLURM allocation: Open MPI's variables describe the ranks.
TEST(LaunchEnv, OpenMpiWinsInsideAnAllocation) {
  const LaunchLayout l = read({{"SLURM_PROCID", "0"},
                               {"SLURM_NTASKS", "1"},
                               {"SLURM_NNODES", "1"},
                               {"OMPI_COMM_WORLD_RANK", "3"},
                               {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(l.launcher, "open-mpi");
  EXPECT_EQ(l.world_rank, 3);
  EXPECT_FALSE(l.nodes);  // no local size given: unknown
  EXPECT_EQ(default_tp_size(l), 4);
}

TEST(LaunchEnv, AVariableThatIsNotANumberIsNamed) {
  try {
    read({{"OMPI_COMM_WORLD_RANK", "two"}});
    FAIL() << "accepted a rank that is not a number";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_RANK='two'"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(read({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "-4"}}), UsageError);
}

}  // namespace
}  // namespace tpreload
