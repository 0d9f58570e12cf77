// CRC-32C of device memory, block by block (tpreload/core/crc32c.h): one thread
// per kCrc32cBlock-byte block, slicing-by-4 from a table in shared memory, the
// raw value written straight into pinned host memory; the host combines them.
#include "launch.h"
#include "quantize_int8.h"
#include "tpreload/core/crc32c.h"

namespace tpreload::cuda {
namespace {

__device__ std::uint32_t table_entry(int k, std::uint32_t b) {
  std::uint32_t c = b;
  for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  for (int j = 0; j < k; ++j) {
    std::uint32_t t = c & 0xFF;
    for (int i = 0; i < 8; ++i) t = (t >> 1) ^ (0x82F63B78u & (0u - (t & 1u)));
    c = t ^ (c >> 8);
  }
  return c;
}

__global__ void crc32c_blocks_kernel(const unsigned char* src, std::uint64_t bytes,
                                     std::uint32_t* raw) {
  __shared__ std::uint32_t table[4][256];
  for (int i = threadIdx.x; i < 4 * 256; i += blockDim.x)
    table[i / 256][i % 256] = table_entry(i / 256, i % 256);
  __syncthreads();
  const std::uint64_t block = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  const std::uint64_t begin = block * kCrc32cBlock;
  if (begin >= bytes) return;
  const std::uint64_t end = begin + kCrc32cBlock < bytes ? begin + kCrc32cBlock : bytes;
  std::uint32_t crc = 0;
  std::uint64_t i = begin;
  const bool aligned = (reinterpret_cast<std::uintptr_t>(src + begin) & 3) == 0;
  for (; aligned && i + 4 <= end; i += 4) {
    crc ^= *reinterpret_cast<const std::uint32_t*>(src + i);
    crc = table[3][crc & 0xFF] ^ table[2][(crc >> 8) & 0xFF] ^ table[1][(crc >> 16) & 0xFF] ^
          table[0][crc >> 24];
  }
  for (; i < end; ++i) crc = table[0][(crc ^ src[i]) & 0xFF] ^ (crc >> 8);
  raw[block] = crc;
}

}  // namespace

cudaError_t launch_crc32c_blocks(const void* src, std::uint64_t bytes, std::uint32_t* raw,
                                 cudaStream_t stream) {
  const std::uint64_t blocks = crc32c_blocks(bytes);
  if (blocks == 0) return cudaSuccess;
  const unsigned threads = 128;
  return launch(crc32c_blocks_kernel, static_cast<unsigned>((blocks + threads - 1) / threads),
                threads, stream, static_cast<const unsigned char*>(src), bytes, raw);
}

cudaError_t load_crc32c() {
  return preload(crc32c_blocks_kernel);
}

}  // namespace tpreload::cuda
