// trainer_push: an RL loop. Rank 0 is also the trainer: it holds the policy's
// weights in the serving layout (kernel format: every tp rank's shards, as a
// trainer sharded like the inference engine holds them) and changes them every
// step. Every step the inference ranks reload them in place from memory, and
// every rank checks that its parameters hold exactly what the trainer pushed:
// the trainer's own CRC-32 of each shard against the fingerprints the ranks read
// back from their parameters.
//
//   launch/mpirun.sh 4 build/examples/trainer_push [--steps 5] [--hidden 512] [--layers 4]
#include <zlib.h>
#include <CLI/CLI.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <map>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"
#include "tpreload/model/model.h"
#include "tpreload/model/torch_dtype.h"
#include "tpreload/reload/reload.h"
#include "tpreload/reload/report.h"
#include "tpreload/runtime/program.h"

using namespace tpreload;

namespace {

ModelConfig policy_config(int hidden, int layers) {
  return parse_model_config(
      tpreload::detail::concat(
          R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": )", hidden,
          R"(, "intermediate_size": )", hidden * 3, R"(, "num_hidden_layers": )", layers,
          R"(, "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 4000,
                     "tie_word_embeddings": false, "torch_dtype": "bfloat16"})"),
      "trainer_push config");
}

// The trainer's copy of the policy: one model per tp rank, in the serving layout.
struct Trainer {
  std::vector<std::unique_ptr<TensorParallelModel>> shards;

  Trainer(const ModelConfig& config, int tp) {
    std::vector<at::Tensor> keep;
    std::vector<InMemoryTensor> initial;
    at::manual_seed(0);
    for (const auto& spec : checkpoint_tensor_specs(config)) {
      keep.push_back((at::randn(spec.shape) * 0.02).to(at::kBFloat16));
      initial.push_back(
          {spec.name, DType::kBFloat16, spec.shape, tensor_bytes(keep.back()), nullptr});
    }
    for (int r = 0; r < tp; ++r) {
      ModelOptions o;
      o.tp_size = tp;
      o.tp_rank = r;
      shards.push_back(std::make_unique<TensorParallelModel>(config, o));
      auto source = make_in_memory_source(initial);
      shards.back()->load_weights(*source);
    }
  }

  // One optimizer step, in place: w += lr * noise.
  void step(int k) {
    at::manual_seed(1000 + k);
    for (auto& shard : shards)
      for (const auto& [name, p] : shard->named_parameters())
        p.add_(at::randn_like(p, at::kFloat).to(p.scalar_type()), 1e-3);
  }

  // Every shard, tagged with its tp rank (the bytes stay the trainer's).
  std::vector<InMemoryTensor> push() const {
    std::vector<InMemoryTensor> out;
    for (std::size_t r = 0; r < shards.size(); ++r)
      for (const auto& [name, p] : shards[r]->named_parameters())
        out.push_back({name, dtype_from_torch(p.scalar_type()), p.sizes().vec(), tensor_bytes(p),
                       nullptr, static_cast<int>(r)});
    return out;
  }

  // zlib's CRC-32 of every shard the trainer pushed, by (name, tp rank).
  std::map<std::string, std::vector<std::uint32_t>> crcs() const {
    std::map<std::string, std::vector<std::uint32_t>> out;
    for (const auto& shard : shards)
      for (const auto& [name, p] : shard->named_parameters()) {
        const ConstBytes b = tensor_bytes(p);
        out[name].push_back(static_cast<std::uint32_t>(
            crc32(0, reinterpret_cast<const Bytef*>(b.data), static_cast<uInt>(b.size))));
      }
    return out;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "An RL loop: the trainer pushes new weights in memory every step; every rank "
      "reloads them in place and checks them."};
  int steps = 5, hidden = 512, layers = 4;
  app.add_option("--steps", steps, "Training steps")->capture_default_str();
  app.add_option("--hidden", hidden, "Hidden size of the policy (a multiple of 8)")
      ->capture_default_str();
  app.add_option("--layers", layers, "Decoder layers")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  return run_mpi_program(&argc, &argv, "warn", CommOptions{}, [&](MpiCommunicator& world) {
    const ModelConfig config = policy_config(hidden, layers);
    const int tp = world.size();
    ModelOptions options;
    options.tp_size = tp;
    options.tp_rank = world.rank();
    TensorParallelModel policy(config, options);  // what this rank serves
    std::unique_ptr<Trainer> trainer;
    if (world.rank() == 0) trainer = std::make_unique<Trainer>(config, tp);
    const KernelFormatInfo layout{tp, config.dtype, "", config.json, false};
    ReloadOptions kernel_format;
    kernel_format.format = WeightFormat::kKernel;  // copied by name, no weight loaders
    ReloadWorkspace workspace;                     // staging and plan kept between steps
    int mismatched_steps = 0;

    for (int k = 1; k <= steps; ++k) {
      std::unique_ptr<WeightSource> source;
      std::vector<std::int64_t> want;  // the trainer's CRCs, sorted by name, then by tp rank
      if (trainer) {
        trainer->step(k);
        source = make_in_memory_source(trainer->push(), layout);
        for (const auto& [name, by_rank] : trainer->crcs())
          for (auto c : by_rank) want.push_back(c);
      }
      const ReloadResult r = reload_weights(policy, world, source.get(), kernel_format, &workspace);
      // Every rank: its parameters read back, against what the trainer pushed.
      const auto fingerprints = gather_fingerprints(policy, world);
      want.resize(fingerprints.size() * static_cast<std::size_t>(tp));
      world.broadcast(MutableBytes(want.data(), want.size() * sizeof(std::int64_t)), 0);
      std::int64_t bad = 0;
      for (std::size_t i = 0; i < fingerprints.size(); ++i)
        if (fingerprints[i].crc32_by_rank.at(world.rank()) != want[i * tp + world.rank()]) ++bad;
      world.allreduce_ints(&bad, 1, IntOp::kSum);
      if (bad) ++mismatched_steps;
      if (world.rank() == 0)
        std::printf(
            "step %d: reloaded %.1f MB in %.1f ms (%.2f GB/s); fingerprint %s: %s on all %d "
            "ranks\n",
            k, r.bytes_transferred / 1e6, r.seconds.total * 1e3,
            r.bytes_transferred / 1e9 / r.seconds.total, model_fingerprint(fingerprints).c_str(),
            bad ? "MISMATCH" : "matches the trainer", tp);
    }
    return mismatched_steps ? 1 : 0;
  });
}
