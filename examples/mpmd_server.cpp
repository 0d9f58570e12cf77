// One MPI job, two programs: the serving ranks (this program, placed first)
// hold a tensor-parallel model and, every training step, take its new weights
// from the trainer's ranks (examples/mpmd_trainer.cpp), which send each serving
// rank exactly the slices it keeps. Each step is checked here against the
// step's weights loaded locally through the weight loaders.
//
//   launch/mpirun.sh ... -np 2 build/examples/mpmd_server : -np 2 build/examples/mpmd_trainer
#include <ATen/ATen.h>

#include <iostream>

#include "mpmd_common.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/mpi_communicator.h"
#include "tpreload/model/model.h"
#include "tpreload/reload/reload.h"
#include "tpreload/reload/report.h"
#include "tpreload/reload/sharded_source.h"
#include "tpreload/runtime/program.h"

using namespace tpreload;

namespace {

// Parameters of `model` whose bytes differ from a local load of `weights`.
int differing(const TensorParallelModel& model, const ModelConfig& config, const ModelOptions& o,
              const std::map<std::string, at::Tensor>& weights) {
  std::vector<InMemoryTensor> tensors;
  for (const auto& [name, t] : weights)
    tensors.push_back({name, DType::kBFloat16, t.sizes().vec(), tensor_bytes(t), nullptr});
  TensorParallelModel reference(config, o);
  reference.load_weights(*make_in_memory_source(std::move(tensors)));
  int wrong = 0;
  for (const auto& [name, t] : reference.named_parameters()) {
    const at::Tensor got = model.parameter_for_reload(name);
    if (!got.view(at::kShort).equal(t.view(at::kShort))) ++wrong;
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  return run_mpi_program(&argc, &argv, "info", CommOptions{}, [](MpiCommunicator& world) {
    const ModelConfig config = mpmd::config();
    const int serving = mpmd::serving_ranks(world, true);
    ModelOptions mo;
    mo.tp_size = serving;
    mo.tp_rank = world.rank();
    TensorParallelModel model(config, mo);
    const auto data = world.make_data_transport();
    ReloadOptions options;
    options.serving_ranks = serving;
    options.bucket_bytes = std::uint64_t{64} << 10;
    ReloadWorkspace workspace;
    int wrong = 0;
    for (int step = 1; step <= mpmd::kSteps; ++step) {
      // The servers hold nothing to send: an empty source.
      const ReloadResult r =
          reload_weights(model, world, *data, ShardedSource{}, options, &workspace);
      const int differ = differing(model, config, mo, mpmd::weights(config, step));
      wrong += differ;
      if (world.rank() == 0)
        std::cout << "step " << step << ": " << summary_text(r) << "\n  " << differ
                  << " parameters of rank 0 differ from the step's weights" << std::endl;
    }
    return wrong == 0 ? 0 : 3;
  });
}
