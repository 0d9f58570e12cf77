// One MPI job, two programs: the trainer's ranks hold FSDP row slices of
// weights that change every step and send them straight to the serving ranks
// that need them (push_shards); no byte passes through a rank that does not
// keep it. Run with the server, the server first:
//
//   launch/mpirun.sh ... -np 2 build/examples/mpmd_server : -np 2 build/examples/mpmd_trainer
//
// (mpi_tests runs it so). A trainer rank holds only its slices; here each rank
// draws the step's weights whole to cut them, as the example has no optimizer.
#include <ATen/ATen.h>

#include <iostream>

#include "mpmd_common.h"
#include "tpreload/comm/mpi_communicator.h"
#include "tpreload/model/model.h"
#include "tpreload/model/sharding.h"
#include "tpreload/reload/reload.h"
#include "tpreload/reload/sharded_source.h"
#include "tpreload/runtime/program.h"

using namespace tpreload;

int main(int argc, char** argv) {
  return run_mpi_program(&argc, &argv, "info", CommOptions{}, [](MpiCommunicator& world) {
    const ModelConfig config = mpmd::config();
    const int serving = mpmd::serving_ranks(world, false);
    const int trainers = world.size() - serving, me = world.rank() - serving;
    // The servers' layout: one tensor-parallel group over every serving rank.
    const ShardingRules rules(config, serving);
    const auto data = world.make_data_transport();
    ReloadOptions options;
    options.serving_ranks = serving;
    options.bucket_bytes = std::uint64_t{64} << 10;
    ReloadWorkspace workspace;  // the plan, made at the first step and replayed
    for (int step = 1; step <= mpmd::kSteps; ++step) {
      std::vector<HeldTensor> held;  // this rank's row slice of every tensor
      for (const auto& [name, t] : mpmd::weights(config, step)) {
        const Box box = slice_box(t.sizes().vec(), 0, me, trainers);
        if (box.elements() == 0) continue;
        auto part =
            std::make_shared<at::Tensor>(t.narrow(0, box.offset[0], box.size[0]).contiguous());
        held.push_back({name, DType::kBFloat16, t.sizes().vec(), box, tensor_bytes(*part), part});
      }
      const ReloadResult r =
          push_shards(world, *data, ShardedSource(std::move(held)), rules, options, &workspace);
      if (me == 0)
        std::cout << "trainer step " << step << ": rank " << world.rank() << " sent "
                  << r.bytes_sent_by_rank.at(static_cast<std::size_t>(world.rank()))
                  << " bytes, received "
                  << r.bytes_received_by_rank.at(static_cast<std::size_t>(world.rank()))
                  << std::endl;
    }
    return 0;
  });
}
