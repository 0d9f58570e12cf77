#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <stdlib.h>

#include <filesystem>

#include "../support/tiny_models.h"
#include "tpreload/checkpoint/kernel_format.h"
#include "tpreload/core/error.h"
#include "tpreload/model/kernel_shards.h"
#include "tpreload/model/model.h"

namespace tpreload {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/tpreload-shards-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string path;
};

// Each rank's file holds exactly that rank's parameters, as the tests' own
// slicing (and int8 formula) makes them from the checkpoint (DeepSeek's derived
// W_UK_T and W_UV too), and a kernel-format load of them gives a model those
// bytes.
TEST(KernelShards, EqualCheckpointFormatLoadingByteForByte) {
  for (const char* name : {"llama_gqa", "deepseek_v3"}) {
    const ModelConfig config = testdata::tiny_config(name);
    const auto ckpt = testdata::random_checkpoint(config, 21);
    for (const std::string quantization : {"", "int8"}) {
      TempDir dir;
      auto source = testdata::memory_source(ckpt);
      write_kernel_shards(config, *source, dir.path, {4, quantization});
      auto shards = open_kernel_format(dir.path);
      ASSERT_TRUE(shards->kernel_format().has_value());
      EXPECT_EQ(shards->kernel_format()->quantization, quantization);
      for (int rank = 0; rank < 4; ++rank) {
        const std::string what =
            std::string(name) + " " + quantization + " rank " + std::to_string(rank);
        const auto want = quantization.empty()
                              ? testdata::expected_shards(config, ckpt, 4, rank)
                              : testdata::expected_int8_shards(config, ckpt, 4, rank);
        ASSERT_FALSE(want.empty()) << what;
        std::size_t compared = 0;
        const auto& infos = shards->tensors();
        for (std::size_t i = 0; i < infos.size(); ++i) {
          if (infos[i].tp_rank != rank) continue;
          const auto view = shards->view(i, {0, infos[i].nbytes});
          ASSERT_TRUE(view.has_value());
          const auto expected = want.find(infos[i].name);
          ASSERT_NE(expected, want.end()) << what << ": the file holds " << infos[i].name;
          const at::Tensor stored = tensor_view(*view, infos[i].dtype, infos[i].shape);
          EXPECT_TRUE(testdata::same_bytes(stored, expected->second))
              << what << " " << infos[i].name;
          ++compared;
        }
        EXPECT_EQ(compared, want.size()) << what << ": a parameter is missing from its file";
        ModelOptions o;
        o.tp_size = 4;
        o.tp_rank = rank;
        o.quantization = quantization;
        TensorParallelModel model(config, o);
        auto kernel = open_kernel_format(dir.path);
        model.load_weights(*kernel);
        for (const auto& [param, bytes] : want)
          EXPECT_TRUE(testdata::same_bytes(model.parameter_for_reload(param), bytes))
              << what << ": kernel-format load of " << param;
      }
    }
  }
}

TEST(KernelShards, MissingTensorIsNamed) {
  const ModelConfig config = testdata::tiny_config("llama_gqa");
  auto ckpt = testdata::random_checkpoint(config, 22);
  ckpt.erase("model.layers.0.mlp.gate_proj.weight");
  TempDir dir;
  auto source = testdata::memory_source(ckpt);
  try {
    write_kernel_shards(config, *source, dir.path + "/out", {2, ""});
    FAIL() << "sharded a checkpoint that lacks a tensor";
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'model.layers.0.mlp.gate_up_proj.weight' of tp "
                                         "rank 0 was not loaded"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.path + "/out/kernel_format.json"));
}

}  // namespace
}  // namespace tpreload
