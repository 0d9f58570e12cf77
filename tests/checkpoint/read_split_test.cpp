// WeightSource::read_split: one contiguous byte range cut into consecutive parts,
// as the reader cuts row-parallel slices. preadv for safetensors (more parts than
// one call takes; runs of small parts read whole into a bounce buffer and copied
// out), the default through view() or read() for the other sources.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <map>
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

// read_split of `range` of tensor 0 (holding `bytes`) into parts of `sizes`, each
// followed by a gap byte that must stay untouched.
void expect_split_reads(WeightSource& source, const std::vector<std::uint8_t>& bytes,
                        ByteRange range, const std::vector<std::size_t>& sizes) {
  std::vector<std::uint8_t> out(range.length + sizes.size(), 0xEE);  // a gap byte after each part
  std::vector<MutableBytes> parts;
  std::size_t at = 0;
  for (std::size_t n : sizes) {
    parts.emplace_back(out.data() + at, n);
    at += n + 1;
  }
  const std::uint64_t before = source.bytes_read();
  source.read_split(0, range, parts);
  at = 0;
  std::size_t src = range.offset;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t n = sizes[i];
    for (std::size_t k = 0; k < n; ++k)
      ASSERT_EQ(out[at + k], bytes[src + k])
          << source.describe() << ": part " << i << " of " << n << " bytes, byte " << k;
    EXPECT_EQ(out[at + n], 0xEE) << "part " << i << " overran into the gap after it";
    at += n + 1;
    src += n;
  }
  EXPECT_EQ(source.bytes_read() - before, range.length);
  while (parts.back().size == 0) parts.pop_back();
  parts.pop_back();
  EXPECT_THROW(source.read_split(0, range, parts), UsageError) << "parts short of the range";
}

void expect_split_reads(WeightSource& source, const std::vector<std::uint8_t>& bytes) {
  const ByteRange range{7, bytes.size() - 20};
  const auto sizes = part_sizes(range.length);
  ASSERT_GT(sizes.size(), 2048u);
  expect_split_reads(source, bytes, range, sizes);
}

std::vector<std::uint8_t> pattern(std::size_t n) {
  std::vector<std::uint8_t> bytes(n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::uint8_t>(i * 131 + i / 256);
  return bytes;
}

// `path`: a safetensors file of one uint8 tensor "w" holding `bytes`, opened.
std::unique_ptr<WeightSource> one_tensor_file(const std::string& path,
                                              const std::vector<std::uint8_t>& bytes) {
  write_safetensors(path,
                    std::vector<InMemoryTensor>{{"w",
                                                 DType::kUInt8,
                                                 {static_cast<std::int64_t>(bytes.size())},
                                                 ConstBytes(bytes),
                                                 nullptr}},
                    {});
  return open_safetensors(path);
}

TEST(ReadSplit, SafetensorsReadsManyPartsStraightFromTheFile) {
  TempDir dir;
  const auto bytes = pattern(6000);
  auto source = one_tensor_file(dir / "w.safetensors", bytes);
  expect_split_reads(*source, bytes);
}

// Small parts (a narrow row-parallel window per row) are read through a bounce
// buffer, large ones straight into place: a run of 1,500 large parts (more than
// one preadv takes) before a run of small ones, a part larger than the bounce
// buffer, a cycle of mixed sizes with zero-sized parts, and small parts last.
TEST(ReadSplit, SafetensorsMixesSmallAndLargePartsInOneSplit) {
  TempDir dir;
  const std::size_t total = 12u << 20;
  const auto bytes = pattern(total);
  auto source = one_tensor_file(dir / "w.safetensors", bytes);
  const ByteRange range{5, total - 9};
  std::vector<std::size_t> sizes;
  std::size_t sum = 0;
  auto add = [&](std::size_t n) {
    sizes.push_back(n);
    sum += n;
  };
  for (int i = 0; i < 1500; ++i) add(4096 + i % 7);  // large: straight, over 1,024 iovecs
  for (int i = 0; i < 3000; ++i) add(32);            // small: bounced
  add(600000);                                       // larger than the bounce buffer
  const std::size_t cycle[] = {3, 700, 40, 0, 1, 5000, 90, 200, 513, 64};
  for (int i = 0; i < 5000; ++i) add(cycle[i % 10]);
  const std::size_t small_tail = 2000 * 48;  // small again, after the mixed parts
  ASSERT_LT(sum + small_tail, range.length) << "the parts above must fit whole";
  while (sum + 4099 <= range.length - small_tail) add(4099);
  for (int i = 0; i < 2000; ++i) add(48);
  add(range.length - sum);  // the rest
  ASSERT_EQ(sum, range.length);
  expect_split_reads(*source, bytes, range, sizes);
}

// A file cut short after it was opened: the read of small parts (bounced) and of
// large ones both fail with the file's name.
TEST(ReadSplit, AFileCutShortFailsSmallAndLargePartsAlike) {
  TempDir dir;
  const auto bytes = pattern(200000);
  auto source = one_tensor_file(dir / "w.safetensors", bytes);
  ASSERT_EQ(::truncate((dir / "w.safetensors").c_str(), 100000), 0);
  for (std::size_t part : {16, 8192}) {
    std::vector<std::uint8_t> out(150000);
    std::vector<MutableBytes> parts;
    for (std::size_t at = 0; at < out.size(); at += part)
      parts.emplace_back(out.data() + at, std::min(part, out.size() - at));
    try {
      source->read_split(0, {0, out.size()}, parts);
      FAIL() << "a read past the end of the cut file went unnoticed (parts of " << part << ")";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("w.safetensors"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("end of file"), std::string::npos) << e.what();
    }
  }
}

TEST(ReadSplit, Hdf5AndInMemorySourcesSplitThroughTheDefault) {
  TempDir dir;
  const auto bytes = pattern(6000);
  const std::vector<InMemoryTensor> tensors{
      {"w", DType::kUInt8, {6000}, ConstBytes(bytes), nullptr}};
  write_hdf5(dir / "w.h5", tensors);
  auto h5 = open_hdf5(dir / "w.h5");
  expect_split_reads(*h5, bytes);
  auto memory = make_in_memory_source(tensors);
  expect_split_reads(*memory, bytes);
}

// read_many == read() of each request, whether the requests follow each other in
// the file (merged into one preadv), skip bytes, go backwards, or cross tensors.
void expect_read_many_matches_read(WeightSource& source) {
  std::vector<std::pair<std::size_t, ByteRange>> wanted;
  for (std::size_t i = 0; i < source.tensors().size(); ++i) {
    const std::uint64_t n = source.tensors()[i].nbytes;
    wanted.push_back({i, {0, n / 3}});
    wanted.push_back({i, {n / 3, n / 3}});      // follows the previous request
    wanted.push_back({i, {n - n / 4, n / 4}});  // skips a gap
  }
  wanted.push_back({0, {1, 2}});  // backwards, into another tensor
  std::uint64_t total = 0;
  for (const auto& [i, r] : wanted) total += r.length;
  std::vector<std::uint8_t> got(total, 0xEE), want(total, 0);
  std::vector<ReadRequest> requests;
  std::uint64_t at = 0;
  for (const auto& [i, r] : wanted) {
    requests.push_back({i, r, MutableBytes(got.data() + at, r.length)});
    source.read(i, r, MutableBytes(want.data() + at, r.length));
    at += r.length;
  }
  const std::uint64_t before = source.bytes_read();
  source.read_many(requests);
  EXPECT_EQ(got, want) << source.describe();
  EXPECT_EQ(source.bytes_read() - before, total);
  requests[1].dst.size -= 1;
  EXPECT_THROW(source.read_many(requests), UsageError) << "a destination of the wrong size";
}

TEST(ReadMany, MergedReadsEqualSingleReadsInEverySource) {
  TempDir dir;
  const auto a = pattern(3000), b = pattern(1001), c = pattern(77);
  const std::vector<InMemoryTensor> tensors{{"a", DType::kUInt8, {3000}, ConstBytes(a), nullptr},
                                            {"b", DType::kUInt8, {1001}, ConstBytes(b), nullptr},
                                            {"c", DType::kUInt8, {77}, ConstBytes(c), nullptr}};
  write_safetensors(dir / "w.safetensors", tensors, {});
  write_safetensors_sharded(dir / "sharded", tensors, 2);
  write_hdf5(dir / "w.h5", tensors);
  for (const std::string& path : {dir / "w.safetensors", dir / "sharded", dir / "w.h5"}) {
    auto source = open_weight_source(path);
    expect_read_many_matches_read(*source);
  }
  auto memory = make_in_memory_source(tensors);
  expect_read_many_matches_read(*memory);
}

// A source without views that counts its reads (HDF5 reads like this: a read
// per call, whatever its size).
class CountingSource final : public WeightSource {
 public:
  // Tensor 0 holds `bytes`, tensor 1 the same bytes each plus 1.
  explicit CountingSource(std::vector<std::uint8_t> bytes) : bytes_(std::move(bytes)) {
    infos_.push_back({"w",
                      DType::kUInt8,
                      {static_cast<std::int64_t>(bytes_.size())},
                      bytes_.size(),
                      "counting",
                      0,
                      -1});
    infos_.push_back({"v",
                      DType::kUInt8,
                      {static_cast<std::int64_t>(bytes_.size())},
                      bytes_.size(),
                      "counting",
                      0,
                      -1});
  }
  std::string describe() const override { return "counting"; }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }
  std::optional<ConstBytes> view(std::size_t, ByteRange) override { return std::nullopt; }
  void read(std::size_t index, ByteRange range, MutableBytes dst) override {
    ASSERT_LE(range.end(), bytes_.size());
    for (std::uint64_t k = 0; k < range.length; ++k)
      dst.data[k] = static_cast<std::byte>(bytes_[range.offset + k] + index);
    ++reads;
  }
  std::uint64_t bytes_read() const override { return 0; }
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }
  int reads = 0;

 private:
  std::vector<std::uint8_t> bytes_;
  std::vector<TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

// Requests that continue each other within one tensor (a row-parallel piece's
// windows, row after row) are one read of the source, not one per window.
TEST(ReadMany, RequestsThatContinueEachOtherInATensorAreOneReadByDefault) {
  const auto bytes = pattern(1000);
  CountingSource source(bytes);
  std::vector<std::uint8_t> out(1000, 0xEE);
  // Tensor 0: [0,100) [100,250) [250,260) continue each other: one read. Then a
  // gap ([300,400): a read), then tensor 1 at [400,500), which continues tensor
  // 0's range but is another tensor (a read), then tensor 1 backwards (a read).
  const std::vector<std::pair<std::size_t, ByteRange>> wanted = {{0, {0, 100}},   {0, {100, 150}},
                                                                 {0, {250, 10}},  {0, {300, 100}},
                                                                 {1, {400, 100}}, {1, {10, 20}}};
  std::vector<ReadRequest> requests;
  std::uint64_t at = 0;
  for (const auto& [i, r] : wanted) {
    requests.push_back({i, r, MutableBytes(out.data() + at, r.length)});
    at += r.length;
  }
  source.read_many(requests);
  EXPECT_EQ(source.reads, 4);
  at = 0;
  for (const auto& [i, r] : wanted) {
    for (std::uint64_t k = 0; k < r.length; ++k)
      ASSERT_EQ(out[at + k], static_cast<std::uint8_t>(bytes[r.offset + k] + i))
          << "tensor " << i << ", request at " << r.offset << ", byte " << k;
    at += r.length;
  }
  // Large requests (64 KiB and more) are read straight into their destinations,
  // each its own read, though they continue each other.
  const auto big = pattern(200000);
  CountingSource large(big);
  std::vector<std::uint8_t> into(200000, 0xEE);
  large.read_many({{0, {0, 100000}, MutableBytes(into.data(), 100000)},
                   {0, {100000, 100000}, MutableBytes(into.data() + 100000, 100000)}});
  EXPECT_EQ(large.reads, 2);
  EXPECT_EQ(into, big);
}

TEST(ReadMany, AFileCutShortAfterOpeningNamesTheFileAndHowFarItGot) {
  TempDir dir;
  const auto bytes = pattern(4000);
  auto source = one_tensor_file(dir / "w.safetensors", bytes);
  const std::uint64_t data_start = source->tensors()[0].file_offset;
  ASSERT_EQ(::truncate((dir / "w.safetensors").c_str(), static_cast<off_t>(data_start + 1000)), 0);
  std::vector<std::uint8_t> out(4000);
  try {
    source->read_many({{0, {0, 2000}, MutableBytes(out.data(), 2000)},
                       {0, {2000, 2000}, MutableBytes(out.data() + 2000, 2000)}});
    FAIL() << "a read past the end of the file succeeded";
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("w.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("read of 4000 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hit end of file after 1000 bytes"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace tpreload
