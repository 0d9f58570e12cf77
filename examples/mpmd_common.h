// What the two programs of the MPMD example share (examples/mpmd_server.cpp,
// examples/mpmd_trainer.cpp): the model, each training step's weights, and
// which world ranks serve.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>

#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/model/config.h"

namespace mpmd {

inline tpreload::ModelConfig config() {
  return tpreload::parse_model_config(
      R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16"})",
      "the MPMD example's config");
}

constexpr int kSteps = 3;

// Step `step`'s full weights, as the trainer's optimizer left them (the same
// on every rank that asks: the server checks its shards against them).
inline std::map<std::string, at::Tensor> weights(const tpreload::ModelConfig& c, int step) {
  std::map<std::string, at::Tensor> out;
  at::manual_seed(1000 + step);
  for (const auto& spec : tpreload::checkpoint_tensor_specs(c))
    out[spec.name] = (at::randn(spec.shape) * 0.05).to(at::kBFloat16);
  return out;
}

// COLLECTIVE. How many ranks serve: the server program's, which mpirun
// places first (`mpirun -np S mpmd_server : -np T mpmd_trainer`).
inline int serving_ranks(tpreload::Communicator& world, bool serves) {
  std::int64_t count = serves ? 1 : 0;
  world.allreduce_ints(&count, 1, tpreload::IntOp::kSum);
  const auto serving = static_cast<int>(count);
  if (serves != (world.rank() < serving))
    tpreload::raise<tpreload::UsageError>(
        "rank ", world.rank(), " runs the ", serves ? "server" : "trainer", " program, but the ",
        serving, " server ranks must come first: mpirun -np S mpmd_server : -np T mpmd_trainer");
  if (serving == 0 || serving == world.size())
    tpreload::raise<tpreload::UsageError>("the MPMD example needs server and trainer ranks (",
                                          serving, " of ", world.size(), " serve)");
  return serving;
}

}  // namespace mpmd
