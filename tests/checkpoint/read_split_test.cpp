// WeightSource::read_split: one contiguous byte range cut into consecutive parts,
// as the reader cuts row-parallel slices. preadv for safetensors (more parts than
// one call takes), the default through view() or read() for the other sources.
#include <gtest/gtest.h>

#include <numeric>

#include "test_util.h"
#include "tpreload/checkpoint/hdf5.h"
#include "tpreload/checkpoint/safetensors.h"
#include "tpreload/checkpoint/writers.h"

namespace tpreload {
namespace {

using test::TempDir;

// Parts of sizes 0..3 (zeros included) covering `total` bytes: well over 1,024 parts.
std::vector<std::size_t> part_sizes(std::size_t total) {
  std::vector<std::size_t> sizes;
  std::size_t sum = 0;
  for (std::size_t i = 0; sum < total; ++i) {
    const std::size_t n = std::min<std::size_t>(i % 4, total - sum);
    sizes.push_back(n);
    sum += n;
  }
  return sizes;
}

void expect_split_reads(WeightSource& source, const std::vector<std::uint8_t>& bytes) {
  const ByteRange range{7, bytes.size() - 20};
  const auto sizes = part_sizes(range.length);
  ASSERT_GT(sizes.size(), 2048u);
  std::vector<std::uint8_t> out(range.length + sizes.size(), 0xEE);  // a gap byte after each part
  std::vector<MutableBytes> parts;
  std::size_t at = 0;
  for (std::size_t n : sizes) {
    parts.emplace_back(out.data() + at, n);
    at += n + 1;
  }
  source.read_split(0, range, parts);
  at = 0;
  std::size_t src = range.offset;
  for (std::size_t n : sizes) {
    for (std::size_t k = 0; k < n; ++k) ASSERT_EQ(out[at + k], bytes[src + k]) << source.describe();
    EXPECT_EQ(out[at + n], 0xEE) << "a part overran into the gap after it";
    at += n + 1;
    src += n;
  }
  EXPECT_EQ(source.bytes_read(), range.length);
  parts.pop_back();
  EXPECT_THROW(source.read_split(0, range, parts), UsageError) << "parts short of the range";
}

std::vector<std::uint8_t> pattern(std::size_t n) {
  std::vector<std::uint8_t> bytes(n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::uint8_t>(i * 131 + i / 256);
  return bytes;
}

TEST(ReadSplit, SafetensorsReadsManyPartsStraightFromTheFile) {
  TempDir dir;
  const auto bytes = pattern(6000);
  write_safetensors(dir / "w.safetensors",
                    std::vector<InMemoryTensor>{{"w", DType::kUInt8, {6000}, ConstBytes(bytes), nullptr}},
                    {});
  auto source = open_safetensors(dir / "w.safetensors");
  expect_split_reads(*source, bytes);
}

TEST(ReadSplit, Hdf5AndInMemorySourcesSplitThroughTheDefault) {
  TempDir dir;
  const auto bytes = pattern(6000);
  const std::vector<InMemoryTensor> tensors{{"w", DType::kUInt8, {6000}, ConstBytes(bytes), nullptr}};
  write_hdf5(dir / "w.h5", tensors);
  auto h5 = open_hdf5(dir / "w.h5");
  expect_split_reads(*h5, bytes);
  auto memory = make_in_memory_source(tensors);
  expect_split_reads(*memory, bytes);
}

}  // namespace
}  // namespace tpreload
