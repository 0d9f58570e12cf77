// Listing a ~2 GB safetensors checkpoint reads no tensor data: the header is read
// with pread and the data only mapped. The file is sparse (header, then ftruncate),
// so it costs neither disk nor time.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "test_util.h"
#include "tpreload/checkpoint/safetensors.h"

namespace tpreload {
namespace {

// "rchar" of /proc/self/io: bytes this process asked read()/pread() for; -1 if unknown.
long long rchar() {
  std::ifstream io("/proc/self/io");
  std::string key;
  long long value = -1;
  while (io >> key >> value)
    if (key == "rchar:") return value;
  return -1;
}

TEST(LargeListing, ListingTwoGigabytesReadsOnlyTheHeader) {
  test::TempDir dir;
  const std::string path = dir / "big.safetensors";
  constexpr int kTensors = 64;
  constexpr std::uint64_t kRows = 4096, kCols = 2048;  // 32 MiB of float32 each, 2 GiB total
  std::string header = "{";
  for (int i = 0; i < kTensors; ++i) {
    const std::uint64_t n = kRows * kCols * 4;
    header += (i ? "," : "") + std::string("\"model.layers.") + std::to_string(i) +
              ".w\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(kRows) + "," +
              std::to_string(kCols) + "],\"data_offsets\":[" + std::to_string(i * n) + "," +
              std::to_string((i + 1) * n) + "]}";
  }
  header += "}";
  test::write_file(path, test::safetensors_bytes(header, ""));
  const std::uint64_t total = 8 + header.size() + kTensors * kRows * kCols * 4;
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(total)), 0);
  ASSERT_GT(total, 2'000'000'000ull);

  const long long before = rchar();
  const auto start = std::chrono::steady_clock::now();
  auto source = open_safetensors(path);
  std::uint64_t listed = 0;
  for (const auto& t : source->tensors()) listed += t.nbytes;
  const auto elapsed = std::chrono::steady_clock::now() - start;
  const long long after = rchar();

  EXPECT_EQ(listed, total - 8 - header.size());
  EXPECT_EQ(source->tensors().size(), static_cast<std::size_t>(kTensors));
  EXPECT_EQ(source->bytes_read(), 0u);
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count(), 2000);
  if (before >= 0 && after >= 0) {
    // The 8-byte length and the header, plus the read of /proc/self/io itself; not a
    // single 32 MiB tensor.
    EXPECT_GE(after - before, static_cast<long long>(8 + header.size()));
    EXPECT_LE(after - before, static_cast<long long>(8 + header.size() + 4096));
  }
  // The view of the last tensor is zero-copy into the (sparse) mapping.
  const auto view = source->view(kTensors - 1, {0, 16});
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(source->bytes_read(), 16u);
  EXPECT_EQ(static_cast<int>(view->data[15]), 0);
}

}  // namespace
}  // namespace tpreload
