// The JSON report of a reload (docs/REPORT.md), built from a result and
// fingerprints written here.
#include <gtest/gtest.h>

#include <cstdio>
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

// docs/REPORT.md: "FNV-1a 64 over every rank's names and CRC-32s, in rank
// order": for each rank, for each parameter, its name's bytes then its CRC-32 as
// 4 little-endian bytes; 16 lowercase hex digits. The test's own FNV-1a.
TEST(ModelFingerprint, IsFnv1a64OverNamesAndLittleEndianCrcsInRankOrder) {
  const std::vector<ParamFingerprint> params = {
      {"model.embed_tokens.weight", {8, 4}, DType::kBFloat16, {0x01020304u, 0xA0B0C0D0u}},
      {"model.norm.weight", {4}, DType::kFloat32, {0xDEADBEEFu, 7u}}};
  std::vector<unsigned char> bytes;
  for (int rank = 0; rank < 2; ++rank)
    for (const auto& p : params) {
      bytes.insert(bytes.end(), p.name.begin(), p.name.end());
      for (int shift = 0; shift < 32; shift += 8)
        bytes.push_back(static_cast<unsigned char>(p.crc32_by_rank[rank] >> shift));
    }
  std::uint64_t h = 14695981039346656037ull;  // (the offset basis, 0xcbf29ce484222325)
  for (unsigned char b : bytes) h = (h ^ b) * 1099511628211ull;
  char want[17];
  std::snprintf(want, sizeof want, "%016llx", static_cast<unsigned long long>(h));
  EXPECT_EQ(model_fingerprint(params), want);
  EXPECT_EQ(model_fingerprint({}), "cbf29ce484222325");
  // Another rank order is another fingerprint.
  std::vector<ParamFingerprint> swapped = params;
  for (auto& p : swapped) std::swap(p.crc32_by_rank[0], p.crc32_by_rank[1]);
  EXPECT_NE(model_fingerprint(swapped), want);
}

}  // namespace
}  // namespace tpreload
