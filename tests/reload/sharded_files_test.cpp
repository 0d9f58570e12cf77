// Splits on disk (reload_ckpt split): every element of every tensor is held
// by the rank the test's own arithmetic says, at its place, read back through
// open_split_source; a rank past the split holds nothing; a directory without
// a manifest is named.
#include "tpreload/reload/sharded_files.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tpreload/core/error.h"

namespace tpreload {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/tpreload-split-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Element i of tensor t: a 16-bit value no other element of any tensor has.
std::uint16_t value(int t, std::int64_t i) {
  return static_cast<std::uint16_t>(t * 4096 + i);
}

struct Checkpoint {
  std::vector<std::vector<std::int64_t>> shapes = {{7, 5}, {4}, {3, 2, 6}, {}, {2, 9}};
  std::vector<std::vector<std::uint16_t>> data;
  std::vector<InMemoryTensor> tensors;
  Checkpoint() {
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      std::int64_t n = 1;
      for (auto s : shapes[t]) n *= s;
      auto& d = data.emplace_back();
      for (std::int64_t i = 0; i < n; ++i) d.push_back(value(static_cast<int>(t), i));
    }
    for (std::size_t t = 0; t < shapes.size(); ++t)
      tensors.push_back({"t" + std::to_string(t), DType::kBFloat16, shapes[t],
                         ConstBytes(data[t].data(), data[t].size() * 2), nullptr});
  }
};

// The rank that holds coordinate `c` of tensor `t` of `shape` split `by`
// among `ranks` (the first size % ranks parts one longer), written here.
int owner(const std::vector<std::int64_t>& shape, int t, const std::vector<std::int64_t>& c,
          SplitBy by, int ranks) {
  if (by == SplitBy::kWhole) return t % ranks;
  if (shape.empty()) return 0;
  const std::size_t dim = by == SplitBy::kColumns && shape.size() >= 2 ? 1 : 0;
  const std::int64_t n = shape[dim], base = n / ranks, extra = n % ranks;
  std::int64_t begin = 0;
  for (int r = 0; r < ranks; ++r) {
    const std::int64_t length = base + (r < extra ? 1 : 0);
    if (c[dim] < begin + length) return r;
    begin += length;
  }
  return -1;
}

TEST(ShardedFiles, EveryElementIsHeldOnceByItsRankAtItsPlace) {
  const Checkpoint ckpt;
  for (SplitBy by : {SplitBy::kRows, SplitBy::kColumns, SplitBy::kWhole}) {
    TempDir dir;
    auto source = make_in_memory_source(ckpt.tensors);
    const int ranks = 3;
    write_split_source(dir.path, *source, ranks, by);
    // Per tensor, per element: how many boxes hold it, and whether each one
    // holds its value on the rank the test expects.
    std::vector<std::vector<int>> seen;
    for (const auto& d : ckpt.data) seen.emplace_back(d.size(), 0);
    for (int r = 0; r < ranks + 1; ++r) {
      const auto held = open_split_source(dir.path, r);
      if (r == ranks) {
        EXPECT_TRUE(held->held().empty()) << "a rank past the split holds nothing";
        continue;
      }
      for (const HeldTensor& h : held->held()) {
        const int t = std::stoi(h.name.substr(1));
        const auto& shape = ckpt.shapes[static_cast<std::size_t>(t)];
        ASSERT_EQ(h.shape, shape) << h.name;
        const auto* got = reinterpret_cast<const std::uint16_t*>(h.bytes.data);
        // Walk the box row-major; map each element to its place in the tensor.
        std::vector<std::int64_t> c(h.box.offset);
        const std::int64_t count = h.box.elements();
        for (std::int64_t k = 0; k < count; ++k) {
          std::int64_t flat = 0;
          for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + c[d];
          EXPECT_EQ(got[k], value(t, flat)) << split_by_name(by) << " " << h.name << " rank " << r;
          EXPECT_EQ(owner(shape, t, c, by, ranks), r) << split_by_name(by) << " " << h.name;
          ++seen[static_cast<std::size_t>(t)][static_cast<std::size_t>(flat)];
          for (std::size_t d = shape.size(); d-- > 0;) {
            if (++c[d] < h.box.offset[d] + h.box.size[d]) break;
            c[d] = h.box.offset[d];
          }
        }
      }
    }
    for (std::size_t t = 0; t < seen.size(); ++t)
      for (std::size_t i = 0; i < seen[t].size(); ++i)
        ASSERT_EQ(seen[t][i], 1) << split_by_name(by) << " t" << t << " element " << i;
  }
}

TEST(ShardedFiles, ADirectoryWithoutAManifestIsNamed) {
  TempDir dir;
  try {
    open_split_source(dir.path, 0);
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path + "/manifest.json"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(parse_split_by("diagonal"));
  EXPECT_EQ(parse_split_by("cols"), SplitBy::kColumns);
}

}  // namespace
}  // namespace tpreload
