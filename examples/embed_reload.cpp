// Embedding tpreload in a serving engine: the engine owns a tensor-parallel model,
// and between batches it swaps in weights an RL trainer produced in memory
// (vLLM's `weights_iterator`), then drops caches derived from the old weights.
// Step 1 hands the trainer's tensors over all at once (an in-memory source);
// the next steps as a stream, each tensor made as the reload asks for it and
// dropped once sent, so the trainer never holds the whole model.
//
//   launch/mpirun.sh 2 build/examples/embed_reload
#include <ATen/ATen.h>

#include <iostream>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"
#include "tpreload/model/model.h"
#include "tpreload/model/torch_dtype.h"
#include "tpreload/reference/forward.h"
#include "tpreload/reload/reload.h"
#include "tpreload/reload/report.h"
#include "tpreload/runtime/program.h"

using namespace tpreload;

namespace {

ModelConfig small_config() {
  return parse_model_config(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 500, "tie_word_embeddings": true,
    "torch_dtype": "float32"})",
                            "example config");
}

// What a trainer hands over: full (unsharded) tensors under Hugging Face names.
std::vector<at::Tensor> trainer_step(const ModelConfig& config, int step,
                                     std::vector<InMemoryTensor>& out) {
  std::vector<at::Tensor> keep;
  at::manual_seed(step);
  for (const auto& spec : checkpoint_tensor_specs(config)) {
    keep.push_back(at::randn(spec.shape) * 0.05);
    const at::Tensor& t = keep.back();
    out.push_back({spec.name, DType::kFloat32, spec.shape, tensor_bytes(t), nullptr});
  }
  return keep;
}

// The same tensors as a stream: each one drawn when the reload takes it (a
// trainer's gathered temporary), owned by its entry until the reload drops it.
std::unique_ptr<WeightStream> trainer_stream(const ModelConfig& config, int step) {
  auto specs = std::make_shared<std::vector<CheckpointTensorSpec>>(checkpoint_tensor_specs(config));
  auto next = std::make_shared<std::size_t>(0);
  at::manual_seed(step);
  return make_weight_stream([specs, next]() -> std::optional<InMemoryTensor> {
    if (*next == specs->size()) return std::nullopt;
    const CheckpointTensorSpec& spec = (*specs)[(*next)++];
    auto t = std::make_shared<at::Tensor>(at::randn(spec.shape) * 0.05);
    return InMemoryTensor{spec.name, DType::kFloat32, spec.shape, tensor_bytes(*t), t};
  });
}

}  // namespace

int main(int argc, char** argv) {
  return run_mpi_program(&argc, &argv, "info", CommOptions{}, [](MpiCommunicator& world) {
    const ModelConfig config = small_config();
    ModelOptions options;
    options.tp_size = world.size();
    options.tp_rank = world.rank();
    TensorParallelModel model(config, options);
    ReloadableModel served(model, {});
    int cache_generation = 0;
    served.on_reloaded([&](const ReloadResult&) { ++cache_generation; });  // drop derived caches

    for (int step = 1; step <= 3; ++step) {
      std::vector<InMemoryTensor> tensors;
      std::vector<at::Tensor> keep;
      std::unique_ptr<WeightSource> source;
      std::unique_ptr<WeightStream> stream;
      if (world.rank() == 0 && step == 1) {  // only the reader rank holds the trainer's tensors
        keep = trainer_step(config, step, tensors);
        source = make_in_memory_source(std::move(tensors));
      } else if (world.rank() == 0) {
        stream = trainer_stream(config, step);
      }
      const ReloadResult r = step == 1
                                 ? served.reload_from(world, ReloadOptions{}, source.get())
                                 : served.reload_from_stream(world, ReloadOptions{}, stream.get());
      const at::Tensor logits = reference_forward(model, {3, 1, 4, 1, 5}, world);
      if (world.rank() == 0)
        std::cout << "step " << step << ": " << summary_text(r)
                  << "  logits[0][0] = " << logits[0][0].item<float>() << ", cache generation "
                  << cache_generation << "\n";
      if (!r.complete()) return 3;  // the names are in the summary above
    }
    return 0;
  });
}
