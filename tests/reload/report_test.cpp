// The JSON report of a reload (docs/REPORT.md), built from a result and
// fingerprints written here.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tpreload/reload/report.h"

namespace tpreload {
namespace {

// A file name need not be UTF-8, and JSON must be: such bytes become U+FFFD
// instead of failing the report (and with it the job that writes it).
TEST(ReportJson, BytesThatAreNotUtf8AreReplacedAndTheRestKept) {
  ReloadResult r;
  r.source = "safetensors '/m/v\xff\xfe': 1 file(s), 1 tensors";
  r.error = "opening '/m/v\xff\xfe' failed";
  r.possibly_mixed = {"model.norm.weight"};
  ParamFingerprint f{"model.norm.weight", {64}, DType::kBFloat16, {11u, 4000000000u}};
  std::string text;
  ASSERT_NO_THROW(text = report_json(r, {2, 2, "mpi"}, {f}));
  const auto doc = nlohmann::json::parse(text);
  const std::string replaced = "\xEF\xBF\xBD\xEF\xBF\xBD";  // U+FFFD twice
  EXPECT_EQ(doc.at("source"), "safetensors '/m/v" + replaced + "': 1 file(s), 1 tensors");
  EXPECT_EQ(doc.at("error"), "opening '/m/v" + replaced + "' failed");
  EXPECT_EQ(doc.at("possibly_changed"), nlohmann::json::array({"model.norm.weight"}));
  ASSERT_EQ(doc.at("ranks").size(), 2u);
  EXPECT_EQ(doc.at("ranks")[1].at("tp_rank"), 1);
  EXPECT_EQ(doc.at("ranks")[1].at("params").at("model.norm.weight").at("crc32"), 4000000000u);
  EXPECT_EQ(doc.at("ranks")[0].at("params").at("model.norm.weight").at("shape"),
            nlohmann::json::array({64}));
}

}  // namespace
}  // namespace tpreload
