// safetensors: reading hand-built files, writer output bytes, round trips of every
// dtype (single file and sharded), zero-copy views, bytes_read and atomic writes.
#include <gtest/gtest.h>

#include <map>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tpreload/checkpoint/safetensors.h"
#include "tpreload/checkpoint/writers.h"

namespace tpreload {
namespace {

using test::TempDir;

TEST(Safetensors, ReadsAFileLaidDownByHandFromTheSpec) {
  TempDir dir;
  // float16 [2] = {1.0, -2.0}; int64 [1] = {258}; little-endian as the spec says.
  const std::string data =
      std::string("\x00\x3c\x00\xc0", 4) + std::string("\x02\x01\0\0\0\0\0\0", 8);
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I64","shape":[1],"data_offsets":[4,12]},)"
      R"("w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  test::write_file(dir / "x.safetensors", test::safetensors_bytes(header, data));
  auto source = open_safetensors(dir / "x.safetensors");
  ASSERT_EQ(source->tensors().size(), 2u);
  const TensorInfo& w = source->tensors()[0];  // file (offset) order
  EXPECT_EQ(w.name, "w");
  EXPECT_EQ(w.dtype, DType::kFloat16);
  EXPECT_EQ(w.shape, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(w.file_offset, 8 + header.size());
  EXPECT_EQ(w.tp_rank, -1);
  EXPECT_EQ(source->tensors()[1].name, "b");
  EXPECT_EQ(source->metadata().at("format"), "pt");
  EXPECT_EQ(source->bytes_read(), 0u);
  std::uint16_t halves[2];
  source->read(0, {0, 4}, MutableBytes(halves, 4));
  EXPECT_EQ(half_bits_to_float(halves[0]), 1.0f);
  EXPECT_EQ(half_bits_to_float(halves[1]), -2.0f);
  const auto view = source->view(1, {0, 8});
  ASSERT_TRUE(view.has_value());
  std::int64_t b = 0;
  std::memcpy(&b, view->data, 8);
  EXPECT_EQ(b, 258);
  EXPECT_EQ(source->bytes_read(), 12u);
}

TEST(Safetensors, WriterOutputMatchesTheReferenceLayoutByteForByte) {
  TempDir dir;
  const float values[2] = {1.5f, -3.0f};
  const std::uint8_t flags[3] = {1, 0, 1};
  write_safetensors(
      dir / "w.safetensors",
      std::vector<InMemoryTensor>{{"flags", DType::kBool, {3}, ConstBytes(flags, 3), nullptr},
                                  {"w", DType::kFloat32, {1, 2}, ConstBytes(values, 8), nullptr}},
      {{"format", "pt"}});
  // Larger elements first (alignment), then the given order; header padded with spaces.
  std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},)"
      R"("flags":{"dtype":"BOOL","shape":[3],"data_offsets":[8,11]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string data =
      std::string(reinterpret_cast<const char*>(values), 8) + std::string("\x01\x00\x01", 3);
  EXPECT_EQ(test::read_file(dir / "w.safetensors"), test::safetensors_bytes(header, data));
}

TEST(Safetensors, RoundTripsEveryDTypeInOneFile) {
  TempDir dir;
  const auto tensors = test::every_dtype_tensors();
  write_safetensors(dir / "all.safetensors", test::as_memory(tensors), {{"k", "v"}});
  const auto header = read_safetensors_header(dir / "all.safetensors");
  EXPECT_EQ(header.header_bytes % 8, 0u);
  EXPECT_EQ(header.metadata.at("k"), "v");
  auto source = open_safetensors(dir / "all.safetensors");
  test::expect_same_tensors(*source, tensors);
  // Views point into the file's bytes at file_offset, each aligned to its element size.
  const std::string bytes = test::read_file(dir / "all.safetensors");
  for (std::size_t i = 0; i < source->tensors().size(); ++i) {
    const TensorInfo& t = source->tensors()[i];
    const auto view = source->view(i, {0, t.nbytes});
    ASSERT_TRUE(view.has_value());
    EXPECT_EQ(std::memcmp(view->data, bytes.data() + t.file_offset, t.nbytes), 0) << t.name;
    EXPECT_EQ((t.file_offset - header.data_start) % dtype_size(t.dtype), 0u) << t.name;
  }
  // Write what was read: the same file, byte for byte.
  write_safetensors(dir / "again.safetensors", specs_of(*source), fill_from(*source),
                    source->metadata());
  EXPECT_EQ(test::read_file(dir / "again.safetensors"), bytes);
}

TEST(Safetensors, RoundTripsEveryDTypeShardedWithIndex) {
  const auto tensors = test::every_dtype_tensors();
  for (const int shards : {1, 2, 3, static_cast<int>(tensors.size())}) {
    TempDir dir;
    const auto names = write_safetensors_sharded(dir.path(), test::as_memory(tensors), shards);
    ASSERT_EQ(names.size(), static_cast<std::size_t>(shards) + 1);
    EXPECT_EQ(names.front(), safetensors_shard_name(0, shards));
    EXPECT_EQ(names.back(), "model.safetensors.index.json");
    EXPECT_EQ(test::dir_entries(dir.path()).size(), names.size());
    auto source = open_safetensors(dir.path());
    test::expect_same_tensors(*source, tensors);
    std::uint64_t total = 0;
    for (const auto& t : tensors) total += t.bytes.size();
    EXPECT_EQ(source->metadata().at("total_size"), std::to_string(total));
    const auto index = nlohmann::json::parse(test::read_file(dir / names.back()));
    EXPECT_EQ(index["weight_map"].size(), tensors.size());
  }
  EXPECT_EQ(safetensors_shard_name(1, 3), "model-00002-of-00003.safetensors");
}

TEST(Safetensors, ShardsSplitBytesEvenlyInOrder) {
  TempDir dir;
  std::vector<test::OwnedTensor> tensors;
  for (int i = 0; i < 12; ++i)
    tensors.push_back(test::random_tensor("t" + std::to_string(100 + i), DType::kFloat32, {256}));
  write_safetensors_sharded(dir.path(), test::as_memory(tensors), 4);
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(read_safetensors_header(dir / safetensors_shard_name(s, 4)).tensors.size(), 3u);
  EXPECT_THROW(write_safetensors_sharded(dir / "x", test::as_memory(tensors), 13), UsageError);
}

TEST(Safetensors, AFailedWriteLeavesNoFileBehind) {
  TempDir dir;
  const auto tensors = test::every_dtype_tensors();
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  const FillFn failing = [](std::size_t index, MutableBytes) {
    if (index == 4) throw CheckpointError("disk on fire");
  };
  EXPECT_THROW(write_safetensors(dir / "a.safetensors", specs, failing), CheckpointError);
  EXPECT_THROW(write_safetensors_sharded(dir / "sharded", specs, failing, 3), CheckpointError);
  EXPECT_EQ(test::dir_entries(dir.path()), std::vector<std::string>{"sharded"});
  EXPECT_TRUE(test::dir_entries(dir / "sharded").empty());
}

TEST(Safetensors, RejectsInvalidNamesWhenWriting) {
  TempDir dir;
  const float v = 0;
  const std::vector<InMemoryTensor> dup = {{"a", DType::kFloat32, {1}, ConstBytes(&v, 4), nullptr},
                                           {"a", DType::kFloat32, {1}, ConstBytes(&v, 4), nullptr}};
  EXPECT_EQ(test::error_of([&] { write_safetensors(dir / "d.safetensors", dup); }),
            "writing '" + (dir / "d.safetensors") + "': duplicate tensor name 'a'");
  const std::vector<InMemoryTensor> wrong = {
      {"a", DType::kFloat32, {2}, ConstBytes(&v, 4), nullptr}};
  EXPECT_EQ(test::error_of([&] { write_safetensors(dir / "w.safetensors", wrong); }),
            "in-memory tensor 'a': shape [2] x float32 needs 8 bytes, got 4");
  EXPECT_TRUE(test::dir_entries(dir.path()).empty());
}

TEST(Safetensors, RangesAreCheckedAndCounted) {
  TempDir dir;
  const auto tensors =
      std::vector<test::OwnedTensor>{test::random_tensor("a", DType::kInt32, {10})};
  write_safetensors(dir / "a.safetensors", test::as_memory(tensors));
  auto source = open_safetensors(dir / "a.safetensors");
  std::int32_t two[2];
  source->read(0, {8, 8}, MutableBytes(two, 8));
  EXPECT_EQ(std::memcmp(two, tensors[0].bytes.data() + 8, 8), 0);
  EXPECT_EQ(source->bytes_read(), 8u);
  EXPECT_EQ(test::error_of([&] {
              source->view(0, {36, 8});
            }),
            "safetensors file '" + (dir / "a.safetensors") +
                "': tensor 'a': range [36, 44) exceeds its 40 bytes");
}

// A view of many pages holds the file's bytes, whole and at an offset inside
// the tensor that is not a page boundary.
TEST(Safetensors, LargeViewsHoldTheFilesBytes) {
  TempDir dir;
  const std::string path = dir / "a.safetensors";
  const std::vector<test::OwnedTensor> tensors = {
      test::random_tensor("big", DType::kFloat32, {256, 1024}, 9)};  // 1 MiB
  write_safetensors(path, test::as_memory(tensors));
  auto source = open_weight_source(path);
  const std::uint64_t n = tensors[0].bytes.size();
  for (const ByteRange range : {ByteRange{0, n}, ByteRange{4097, n - 4097 - 3}}) {
    const auto view = source->view(0, range);
    ASSERT_TRUE(view.has_value());
    ASSERT_EQ(view->size, range.length);
    EXPECT_EQ(std::memcmp(view->data, tensors[0].bytes.data() + range.offset, range.length), 0)
        << range.offset;
  }
  source->check_mapped_reads();
}

// A file cut short after it was opened: reads through its mapping would raise
// SIGBUS; they read zeros instead and the source names the file.
TEST(Safetensors, AFileCutShortUnderItsMappingIsAnErrorNotACrash) {
  TempDir dir;
  const std::string path = dir / "a.safetensors";
  const std::vector<test::OwnedTensor> tensors = {
      test::random_tensor("big", DType::kFloat32, {64, 1024}, 7)};  // 256 KiB: many pages
  write_safetensors(path, test::as_memory(tensors));
  auto source = open_weight_source(path);
  source->check_mapped_reads();  // nothing read yet, nothing wrong
  const std::uint64_t data_start = source->tensors()[0].file_offset;
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(data_start + 4096)), 0);
  const auto view = source->view(0, {0, source->tensors()[0].nbytes});
  ASSERT_TRUE(view.has_value());
  std::uint64_t nonzero_after_cut = 0;
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t backed = (data_start + 4096 + page - 1) / page * page - data_start;
  for (std::uint64_t i = 0; i < view->size; ++i)
    nonzero_after_cut += i >= backed && view->data[i] != std::byte{0};
  EXPECT_EQ(nonzero_after_cut, 0u) << "bytes past the cut read as zeros";
  const std::string error = test::error_of([&] { source->check_mapped_reads(); });
  EXPECT_NE(error.find("'" + path + "' no longer holds the "), std::string::npos) << error;
  // Every page wholly past the new end faulted once when read.
  const std::uint64_t pages = (data_start + view->size + page - 1) / page;
  const std::uint64_t kept = (data_start + 4096 + page - 1) / page;
  EXPECT_NE(error.find("(it has " + std::to_string(data_start + 4096) +
                       " now): " + std::to_string(pages - kept) +
                       " page(s) of its mapping could not be read; the file was truncated"),
            std::string::npos)
      << error;
}

// A read that fails (here: the file cut short after it was opened) names the
// tensors it was for, one or the run of them one preadv read.
TEST(Safetensors, AFailedReadNamesItsTensors) {
  TempDir dir;
  const std::string path = dir / "a.safetensors";
  const std::vector<test::OwnedTensor> tensors = {
      test::random_tensor("a", DType::kFloat32, {4}, 1),
      test::random_tensor("b", DType::kFloat32, {4}, 2),
      test::random_tensor("c", DType::kFloat32, {4}, 3)};
  write_safetensors(path, test::as_memory(tensors));
  auto source = open_weight_source(path);
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < source->tensors().size(); ++i) index[source->tensors()[i].name] = i;
  const std::uint64_t b_at = source->tensors()[index.at("b")].file_offset;
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(b_at + 8)), 0);  // half of b left
  std::vector<std::byte> out(48);
  const std::string one = test::error_of([&] {
    source->read(index.at("c"), {0, 16}, MutableBytes(out.data(), 16));
  });
  EXPECT_EQ(one.rfind("tensor 'c': read of 16 bytes at offset " + std::to_string(b_at + 16) +
                          " of '" + path + "' hit end of file after 0 bytes",
                      0),
            0u)
      << one;
  std::vector<ReadRequest> all;
  for (const char* name : {"a", "b", "c"})
    all.push_back({index.at(name), {0, 16}, MutableBytes(out.data() + 16 * all.size(), 16)});
  const std::string run = test::error_of([&] { source->read_many(all); });
  EXPECT_EQ(run.rfind("3 tensors from 'a' to 'c': read of 48 bytes at offset " +
                          std::to_string(b_at - 16) + " of '" + path + "' hit end of file after " +
                          std::to_string(16 + 8) + " bytes",
                      0),
            0u)
      << run;
}

// The handler takes only faults inside mappings it guards: any other SIGBUS still
// ends the process as it would have without it.
TEST(SafetensorsDeathTest, ASigbusOutsideAGuardedMappingStillKillsTheProcess) {
  TempDir dir;
  const std::string path = dir / "a.safetensors";
  write_safetensors(path, test::as_memory({test::random_tensor("t", DType::kFloat32, {16}, 1)}));
  auto source = open_weight_source(path);  // installs the handler
  test::write_file(dir / "plain", std::string(2 * 4096, 'x'));
  EXPECT_EXIT(
      {
        const int fd = ::open((dir / "plain").c_str(), O_RDONLY);
        auto* p =
            static_cast<volatile char*>(::mmap(nullptr, 2 * 4096, PROT_READ, MAP_PRIVATE, fd, 0));
        if (::truncate((dir / "plain").c_str(), 0) != 0) ::_exit(3);
        std::printf("%d", p[4096]);
        ::_exit(0);
      },
      // Killed by SIGBUS, or ended by the handler that was there before ours
      // (AddressSanitizer's, in the sanitizer build, reports it and exits 1);
      // never the read returning (exit 0).
      [](int status) {
        return (WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) ||
               (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3);
      },
      "");
}

}  // namespace
}  // namespace tpreload
