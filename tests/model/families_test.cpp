// The family registry against everything that lists families: the tiny
// configs every family is reloaded with in the tests, docs/FAMILIES.md's table,
// the README, and the error for an unknown architecture.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "../support/tiny_models.h"
#include "tpreload/core/error.h"
#include "tpreload/model/config.h"

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
