// Transfers above INT32_MAX bytes, which MPI's int counts cannot express in one
// message: the communicator must split them, deliver every byte, and use no
// staging copy of the buffer.
#include <gtest/gtest.h>

#include <climits>
#include <fstream>
#include <memory>
#include <string>

#include "mpi_test_main.h"
#include "tpreload/comm/mpi_communicator.h"

namespace tpreload {
namespace {

using mpitest::world;

// Peak resident set (VmHWM) of this process, in bytes.
std::uint64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmHWM:") {
      std::uint64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 12, '\n');
  }
  return 0;
}

std::uint64_t word_at(std::uint64_t index, std::uint64_t tag) {
  return (index * 0x9E3779B97F4A7C15ull) ^ tag;
}

TEST(LargeTransfer, BroadcastAboveInt32Max) {
  TPRELOAD_REQUIRE_RANKS(2);
  const std::uint64_t bytes = std::uint64_t{INT_MAX} + 4097;  // not a multiple of 8
  const std::uint64_t words = bytes / 8;
  const std::uint64_t before = peak_rss_bytes();
  std::vector<std::uint64_t> buffer(words + 1, 0);  // the tail bytes sit in the last word
  auto* bytes_view = reinterpret_cast<std::uint8_t*>(buffer.data());
  if (world().rank() == 0) {
    for (std::uint64_t i = 0; i < words; ++i) buffer[i] = word_at(i, 17);
    for (std::uint64_t b = words * 8; b < bytes; ++b) bytes_view[b] = static_cast<std::uint8_t>(b);
  }
  world().broadcast(MutableBytes(buffer.data(), bytes), 0);
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < words; ++i) wrong += buffer[i] != word_at(i, 17);
  for (std::uint64_t b = words * 8; b < bytes; ++b)
    wrong += bytes_view[b] != static_cast<std::uint8_t>(b);
  EXPECT_EQ(wrong, 0u);
  // The buffer itself plus at most 256 MiB: no second copy of 2 GiB anywhere.
  const std::uint64_t growth = peak_rss_bytes() - before;
  EXPECT_LT(growth, bytes + (std::uint64_t{256} << 20)) << "peak RSS grew by " << growth;
}

TEST(LargeTransfer, ScattervRangeAboveInt32Max) {
  TPRELOAD_REQUIRE_RANKS(2);
  // Rank 1 receives 2 GiB + 8 bytes from beyond offset 2^31 of root's buffer.
  const std::uint64_t offset = std::uint64_t{1} << 31, length = (std::uint64_t{1} << 31) + 8;
  std::vector<ByteRange> ranges(world().size());
  ranges[0] = {8, 16};
  ranges[1] = {offset, length};
  // The root's 4 GiB buffer is left uninitialised except for the two ranges
  // sent: the 2 GiB between them are never touched (nor made resident).
  const std::uint64_t send_words = world().rank() == 0 ? (offset + length) / 8 : 0;
  std::unique_ptr<std::uint64_t[]> send(send_words ? new std::uint64_t[send_words] : nullptr);
  for (const ByteRange& r : ranges)
    for (std::uint64_t i = r.offset / 8; i < (r.offset + r.length) / 8 && i < send_words; ++i)
      send[i] = word_at(i, 3);
  std::vector<std::uint64_t> recv(ranges[world().rank()].length / 8, 0);
  world().scatterv(ConstBytes(send.get(), send_words * 8), ranges,
                   MutableBytes(recv.data(), recv.size() * 8), 0);
  const std::uint64_t first = ranges[world().rank()].offset / 8;
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < recv.size(); ++i) wrong += recv[i] != word_at(first + i, 3);
  EXPECT_EQ(wrong, 0u);
}

}  // namespace
}  // namespace tpreload
