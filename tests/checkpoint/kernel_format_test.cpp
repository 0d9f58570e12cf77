// Kernel-format shards: write/read round trip, tp_rank, info, and broken directories.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tpreload/checkpoint/kernel_format.h"

namespace tpreload {
namespace {

using test::TempDir;

const char* const kConfig = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8})";

KernelFormatInfo info(int tp_size, const std::string& quantization = "") {
  return {tp_size, DType::kBFloat16, quantization, kConfig};
}

std::vector<std::vector<test::OwnedTensor>> rank_tensors(int tp_size) {
  std::vector<std::vector<test::OwnedTensor>> out(tp_size);
  for (int r = 0; r < tp_size; ++r) {
    out[r].push_back(test::random_tensor("model.layers.0.self_attn.qkv_proj.weight",
                                         DType::kBFloat16, {6, 8}, 10 + r));
    out[r].push_back(
        test::random_tensor("model.layers.0.mlp.down_proj.weight", DType::kInt8, {8, 4}, 20 + r));
    out[r].push_back(test::random_tensor("model.layers.0.mlp.down_proj.weight_scale",
                                         DType::kFloat32, {8}, 30 + r));
  }
  return out;
}

void write(const std::string& dir, const KernelFormatInfo& i,
           const std::vector<std::vector<test::OwnedTensor>>& tensors) {
  std::vector<std::vector<InMemoryTensor>> mem;
  for (const auto& r : tensors) mem.push_back(test::as_memory(r));
  write_kernel_format(dir, i, mem);
}

TEST(KernelFormat, RoundTripsEveryRanksTensors) {
  TempDir dir;
  const auto tensors = rank_tensors(4);
  write(dir.path(), info(4, "int8"), tensors);
  EXPECT_EQ(test::dir_entries(dir.path()),
            (std::vector<std::string>{"kernel_format.json", "rank-00000-of-00004.safetensors",
                                      "rank-00001-of-00004.safetensors",
                                      "rank-00002-of-00004.safetensors",
                                      "rank-00003-of-00004.safetensors"}));
  auto source = open_kernel_format(dir.path());
  ASSERT_TRUE(source->kernel_format().has_value());
  EXPECT_EQ(source->kernel_format()->tp_size, 4);
  EXPECT_EQ(source->kernel_format()->dtype, DType::kBFloat16);
  EXPECT_EQ(source->kernel_format()->quantization, "int8");
  EXPECT_EQ(nlohmann::json::parse(source->kernel_format()->config_json),
            nlohmann::json::parse(kConfig));
  ASSERT_EQ(source->tensors().size(), 12u);
  for (std::size_t i = 0; i < source->tensors().size(); ++i) {
    const TensorInfo& t = source->tensors()[i];
    const int rank = static_cast<int>(i / 3);
    EXPECT_EQ(t.tp_rank, rank);
    const test::OwnedTensor* want = nullptr;
    for (const auto& w : tensors[rank])
      if (w.name == t.name) want = &w;
    ASSERT_NE(want, nullptr) << t.name;
    const auto view = source->view(i, {0, t.nbytes});
    ASSERT_TRUE(view.has_value());
    EXPECT_EQ(std::memcmp(view->data, want->bytes.data(), t.nbytes), 0)
        << t.name << " rank " << rank;
  }
  const auto j = nlohmann::json::parse(test::read_file(dir / "kernel_format.json"));
  EXPECT_EQ(j["format"], "tpreload-kernel");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["dtype"], "bfloat16");
  EXPECT_EQ(open_weight_source(dir.path())->kernel_format()->tp_size, 4);
}

TEST(KernelFormat, UnquantizedIsNull) {
  TempDir dir;
  write(dir.path(), info(1), rank_tensors(1));
  const auto j = nlohmann::json::parse(test::read_file(dir / "kernel_format.json"));
  EXPECT_TRUE(j["quantization"].is_null());
  EXPECT_EQ(read_kernel_format_info(dir.path()).quantization, "");
}

TEST(KernelFormat, BrokenDirectoriesNameTheProblem) {
  TempDir dir;
  write(dir.path(), info(2), rank_tensors(2));
  const std::string json_path = dir / "kernel_format.json";
  const std::string prefix = "kernel format '" + json_path + "': ";
  ::remove((dir / "rank-00001-of-00002.safetensors").c_str());
  EXPECT_EQ(test::error_of([&] { open_kernel_format(dir.path()); }),
            prefix + "rank 1 file 'rank-00001-of-00002.safetensors' is missing (tp_size 2)");
  auto j = nlohmann::json::parse(test::read_file(json_path));
  j["version"] = 2;
  test::write_file(json_path, j.dump());
  EXPECT_EQ(test::error_of([&] { read_kernel_format_info(dir.path()); }),
            prefix + "'version' 2 is not supported (expected 1)");
  j["version"] = 1;
  j["quantization"] = "fp4";
  test::write_file(json_path, j.dump());
  EXPECT_EQ(test::error_of([&] { read_kernel_format_info(dir.path()); }),
            prefix + "'quantization' \"fp4\" is not null, \"int8\", \"fp8\" or \"fp8-block\"");
  j["quantization"] = nullptr;
  j["tp_size"] = 0;
  test::write_file(json_path, j.dump());
  EXPECT_EQ(test::error_of([&] { read_kernel_format_info(dir.path()); }),
            prefix + "'tp_size' 0 is not an integer in [1, 99999]");
  // Nested too deep to print (printing recurses once per level): refused as parsed.
  test::write_file(json_path, "{\"x\":" + std::string(100'000, '[') + std::string(100'000, ']') +
                                  "," + j.dump().substr(1));
  const std::string deep = test::error_of([&] { read_kernel_format_info(dir.path()); });
  EXPECT_EQ(deep.rfind(prefix + "not valid JSON: ", 0), 0u) << deep;
  EXPECT_NE(deep.find("nested deeper than 64 levels"), std::string::npos) << deep;
  EXPECT_THROW(write(dir / "x", info(3), rank_tensors(2)), UsageError);
}

TEST(KernelFormat, RankFilesSwappedOrFromAnotherTpSizeAreRefusedByTheirMetadata) {
  TempDir dir, other;
  write(dir.path(), info(2), rank_tensors(2));
  const std::string r0 = dir / "rank-00000-of-00002.safetensors";
  const std::string r1 = dir / "rank-00001-of-00002.safetensors";
  ASSERT_EQ(::rename(r0.c_str(), (dir / "tmp").c_str()), 0);
  ASSERT_EQ(::rename(r1.c_str(), r0.c_str()), 0);
  ASSERT_EQ(::rename((dir / "tmp").c_str(), r1.c_str()), 0);
  const std::string swapped = test::error_of([&] { open_kernel_format(dir.path()); });
  EXPECT_NE(swapped.find("rank file '" + r0 + "' holds tp rank '1' of tp size '2' by its metadata"),
            std::string::npos)
      << swapped;
  EXPECT_NE(swapped.find("make it tp rank 0 of 2"), std::string::npos) << swapped;
  // Rank 0 of a tp-4 directory copied in as rank 0 of this tp-2 one.
  write(other.path(), info(4), rank_tensors(4));
  test::write_file(r0, test::read_file(other / "rank-00000-of-00004.safetensors"));
  test::write_file(r1, test::read_file(other / "rank-00001-of-00004.safetensors"));
  const std::string foreign = test::error_of([&] { open_kernel_format(dir.path()); });
  EXPECT_NE(foreign.find("holds tp rank '0' of tp size '4' by its metadata"), std::string::npos)
      << foreign;
}

}  // namespace
}  // namespace tpreload
