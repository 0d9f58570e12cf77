// The device CRC-32C kernel (src/cuda/crc32c.cu) against a bit-at-a-time CRC-32C
// written here: every block count, unaligned starts, short tails, an empty range,
// and a range of many thread blocks. Needs a CUDA device: built in every CUDA
// build, run by scripts/gpu_check.sh (registered with ctest only with
// TPRELOAD_GPU_TESTS).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "tpreload/comm/cuda_device.h"
#include "tpreload/core/crc32c.h"

namespace tpreload {
namespace {

using namespace std::chrono_literals;

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial and final value
// all ones), one bit at a time: the definition, not the library's tables.
std::uint32_t crc32c_bitwise(const std::uint8_t* p, std::uint64_t n) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::uint64_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return crc ^ 0xFFFFFFFFu;
}

// The CRC-32C of device bytes [offset, offset + bytes) as the reload computes it:
// the kernel's block values into pinned memory, combined on the host.
std::uint32_t device_crc32c(Device& d, DeviceStream& stream, const Buffer& on_device,
                            std::uint64_t offset, std::uint64_t bytes) {
  Buffer raw = d.pinned_memory().allocate(std::max<std::uint64_t>(1, crc32c_blocks(bytes)) *
                                          sizeof(std::uint32_t));
  auto* values = reinterpret_cast<std::uint32_t*>(raw.data());
  stream.crc32c_blocks(on_device.data() + offset, bytes, values);
  synchronize(stream, 30s, "crc32c test");
  return crc32c_from_blocks(values, bytes);
}

TEST(CudaCrc32c, EqualsTheDefinitionAtEveryOffsetAndLength) {
  const std::uint8_t check[] = {'1', '2', '3', '4', '5', '6', '7', '8', '9'};
  ASSERT_EQ(0xE3069283u, crc32c_bitwise(check, sizeof check));  // the standard check value

  std::shared_ptr<Device> device = open_cuda_device(0);
  auto stream = device->make_stream();
  const std::uint64_t block = kCrc32cBlock;
  std::vector<std::uint8_t> host(5 * block + 64);
  std::mt19937 gen(11);
  for (auto& b : host) b = static_cast<std::uint8_t>(gen());
  Buffer on_device = device->memory().allocate(host.size());
  stream->copy(on_device.data(), host.data(), host.size(), CopyKind::kHostToDevice);

  const std::uint64_t lengths[] = {
      0, 1, 3, 4, 5, 9, block - 1, block, block + 1, 2 * block + 7, 3 * block, 4 * block + 4095};
  for (std::uint64_t offset : {0, 1, 2, 3, 5, 8, 63})
    for (std::uint64_t n : lengths) {
      ASSERT_LE(offset + n, host.size());
      EXPECT_EQ(crc32c_bitwise(host.data() + offset, n),
                device_crc32c(*device, *stream, on_device, offset, n))
          << "offset " << offset << ", " << n << " bytes";
    }
}

// Many thread blocks (128 threads each, one 4 KiB CRC block per thread): 96 MiB
// and 3 bytes, so the last thread block is partly idle and the last CRC block short.
TEST(CudaCrc32c, ALargeRangeOfManyThreadBlocks) {
  std::shared_ptr<Device> device = open_cuda_device(0);
  auto stream = device->make_stream();
  const std::uint64_t bytes = (std::uint64_t{96} << 20) + 3;
  std::vector<std::uint8_t> host(bytes);
  std::uint32_t x = 0x9E3779B9u;
  for (auto& b : host) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    b = static_cast<std::uint8_t>(x);
  }
  Buffer on_device = device->memory().allocate(bytes);
  stream->copy(on_device.data(), host.data(), bytes, CopyKind::kHostToDevice);
  EXPECT_EQ(crc32c_bitwise(host.data(), bytes),
            device_crc32c(*device, *stream, on_device, 0, bytes));
}

}  // namespace
}  // namespace tpreload
