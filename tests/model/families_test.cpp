// The family registry against everything that lists families: the tiny
// configs every family is reloaded with in the tests, docs/FAMILIES.md's table,
// the README, and the error for an unknown architecture.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../support/tiny_models.h"
#include "tpreload/core/error.h"
#include "tpreload/model/config.h"
#include "tpreload/model/row_writes.h"
#include "tpreload/model/sharding.h"

namespace tpreload {
namespace {

std::string read_text(const std::string& relative) {
  std::ifstream in(std::string(TPRELOAD_SOURCE_DIR) + "/" + relative);
  EXPECT_TRUE(in) << relative;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::set<std::string> registered() {
  const std::vector<std::string>& all = supported_architectures();
  return {all.begin(), all.end()};
}

TEST(Families, ArchitecturesAndNamesAreUniqueAndComplete) {
  std::set<std::string> architectures, names;
  for (const ModelFamily& f : model_families()) {
    EXPECT_TRUE(architectures.insert(f.architecture).second) << f.architecture;
    EXPECT_TRUE(names.insert(f.name).second) << f.name;
    EXPECT_EQ(f.architecture.find("ForCausalLM"), f.architecture.size() - 11) << f.architecture;
    EXPECT_EQ(f.vllm_model.substr(f.vllm_model.size() - 3), ".py") << f.architecture;
  }
  EXPECT_EQ(architectures, registered());
}

// A family added without a tiny config is reloaded by no test.
TEST(Families, EveryFamilyHasATinyConfig) {
  std::set<std::string> covered;
  for (const char* name : testdata::kTinyConfigs)
    covered.insert(testdata::tiny_config(name).architecture);
  EXPECT_EQ(covered, registered());
}

// The layout's list of checkpoint tensors (checkpoint_tensor_specs) is the
// Hugging Face checkpoint's, as the tests write it from each family's modules
// (testdata::hf_checkpoint_tensors): a tensor the layout forgets, invents or
// shapes otherwise is named here, for every tiny config.
TEST(Families, TheLayoutListsTheHuggingFaceCheckpointOfEveryTinyConfig) {
  for (const char* name : testdata::kTinyConfigs) {
    const ModelConfig config = testdata::tiny_config(name);
    std::map<std::string, std::vector<std::int64_t>> hf, layout;
    for (const auto& [tensor, shape] : testdata::hf_checkpoint_tensors(config))
      EXPECT_TRUE(hf.emplace(tensor, shape).second) << name << ": " << tensor << " twice";
    for (const CheckpointTensorSpec& spec : checkpoint_tensor_specs(config))
      EXPECT_TRUE(layout.emplace(spec.name, spec.shape).second)
          << name << ": " << spec.name << " twice in the layout";
    for (const auto& [tensor, shape] : hf) {
      const auto it = layout.find(tensor);
      if (it == layout.end())
        ADD_FAILURE() << name << ": the layout lacks " << tensor;
      else
        EXPECT_EQ(it->second, shape) << name << ": " << tensor;
    }
    for (const auto& [tensor, shape] : layout)
      EXPECT_TRUE(hf.count(tensor)) << name << ": the layout lists " << tensor
                                    << ", which the Hugging Face checkpoint does not hold";
    EXPECT_GT(hf.size(), 5u) << name;
  }
}

// The plan takes a placed slice's rows and row bytes from Placement::slice_rows
// and slice_row_bytes (no shape built); they agree with the slice's shape as
// row_writes measures any shape, for every tensor of every tiny config at tp 1
// and 2, on every rank that holds it, with and without expert parallelism
// (MoE configs).
TEST(Families, APlacementsRowsAreThoseOfItsSliceShape) {
  for (const char* name : testdata::kTinyConfigs) {
    const ModelConfig config = testdata::tiny_config(name);
    for (const int tp : {1, 2})
      for (const bool ep : {false, true}) {
        if (ep && config.num_experts == 0) continue;  // (expert parallelism: MoE models only)
        const ShardingRules rules(config, tp, "", ep);
        std::size_t held = 0;
        for (const auto& [tensor, shape] : testdata::hf_checkpoint_tensors(config))
          for (int rank = 0; rank < tp; ++rank) {
            const std::optional<Placement> pl = rules.place(tensor, rank);
            if (!pl || !pl->held) continue;
            ++held;
            const std::vector<std::int64_t> slice = pl->slice_shape();
            EXPECT_EQ(pl->slice_rows(), shape_rows(slice))
                << name << " tp " << tp << ": " << tensor;
            for (const DType dtype : {DType::kBFloat16, DType::kFloat32})
              EXPECT_EQ(pl->slice_row_bytes(dtype), shape_row_bytes(slice, dtype))
                  << name << " tp " << tp << ": " << tensor;
          }
        EXPECT_GT(held, 5u) << name << " tp " << tp;
      }
  }
}

// The first column of the table headed "Architecture" in docs/FAMILIES.md.
std::set<std::string> documented_architectures() {
  std::istringstream doc(read_text("docs/FAMILIES.md"));
  std::set<std::string> out;
  bool in_table = false;
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind("| Architecture", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.rfind("|", 0) != 0) break;
    const auto open = line.find('`'), close = line.find('`', open + 1);
    if (open == std::string::npos || close == std::string::npos) continue;  // (the rule)
    out.insert(line.substr(open + 1, close - open - 1));
  }
  return out;
}

TEST(Families, TheDocsListEveryFamilyAndNoOther) {
  EXPECT_EQ(documented_architectures(), registered());
  EXPECT_NE(read_text("README.md").find(model_family_names()), std::string::npos)
      << "README.md does not list the families as: " << model_family_names();
}

TEST(Families, AnUnknownArchitectureNamesTheKnownOnes) {
  try {
    parse_model_config(R"({"architectures":["NoSuchForCausalLM"],"hidden_size":8})", "cfg");
    FAIL() << "an unknown architecture was accepted";
  } catch (const ModelError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'NoSuchForCausalLM' is not supported"), std::string::npos) << what;
    for (const std::string& a : supported_architectures())
      EXPECT_NE(what.find(a), std::string::npos) << a << " missing from: " << what;
  }
}

}  // namespace
}  // namespace tpreload
