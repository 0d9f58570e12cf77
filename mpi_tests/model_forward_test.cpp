// Logits of the tensor-parallel forward pass agree across tp sizes and with a
// plain single-process reference, for every tiny config.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "../tests/support/tiny_models.h"
#include "mpi_test_main.h"
#include "tpreload/model/model.h"
#include "tpreload/reference/forward.h"

namespace tpreload {
namespace {

TPRELOAD_TINY_MODEL_WORLD_SIZES();

using mpitest::world;

const std::vector<std::int64_t> kTokens = {5, 63, 64, 99, 0, 17, 42, 8, 77};

void check_logits_at_tp(Communicator& tp_comm, bool expert_parallel = false) {
  for (const char* name : testdata::kTinyConfigs) {
    const ModelConfig config = testdata::tiny_config(name);
    if (expert_parallel && config.num_experts == 0) continue;
    const auto ckpt = testdata::random_checkpoint(config, 11);
    ModelOptions options;
    options.tp_size = tp_comm.size();
    options.tp_rank = tp_comm.rank();
    options.expert_parallel = expert_parallel;
    TensorParallelModel model(config, options);
    auto source = testdata::memory_source(ckpt);
    model.load_weights(*source);
    const at::Tensor got = reference_forward(model, kTokens, tp_comm);
    const at::Tensor want = testdata::reference_logits(config, ckpt, kTokens);
    ASSERT_EQ(got.sizes(), want.sizes()) << name;
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-4))
        << name << " at tp " << tp_comm.size()
        << (expert_parallel ? " with expert parallelism" : "") << ": max diff "
        << (got - want).abs().max().item<float>();
  }
}

TEST(ForwardAcrossTp, WholeWorldIsOneTpGroup) {
  check_logits_at_tp(world());
}

// Qwen3-MoE with whole experts per rank: the same logits.
TEST(ForwardAcrossTp, ExpertParallelExperts) {
  check_logits_at_tp(world(), true);
}

TEST(ForwardAcrossTp, TwoReplicasOfHalfTheWorld) {
  TPRELOAD_REQUIRE_RANKS(2);
  const int tp = world().size() / 2;
  auto group = world().split(world().rank() / tp, world().rank());
  check_logits_at_tp(*group);
}

}  // namespace
}  // namespace tpreload
