// CRC-32C (Castagnoli, iSCSI: reflected polynomial 0x82F63B78), the checksum of
// every bucket the reader sends and every receiver verifies. With SSE4.2 the
// CPU's crc32 instruction runs three 4 KiB blocks at once; without it, a
// slicing-by-8 table. Both give the same values (standard CRC-32C: initial and
// final value 0xFFFFFFFF; crc32c("123456789") == 0xE3069283).
//
// Blocks: a range is cut into kCrc32cBlock-byte blocks (the last one shorter),
// each checksummed on its own (a "raw" CRC: initial value 0, no final xor), and
// the block values are combined in order. A device computes the raw block values
// in parallel and the host combines them (crc32c_from_blocks), which gives the
// same CRC-32C as crc32c() over the whole range.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tpreload {

inline constexpr std::uint64_t kCrc32cBlock = 4096;

// The standard CRC-32C of `n` bytes.
std::uint32_t crc32c(const void* data, std::uint64_t n);

// The raw CRC of one block: initial value 0, no final xor.
std::uint32_t crc32c_raw(const void* data, std::uint64_t n);

// Blocks in `n` bytes: ceil(n / kCrc32cBlock).
inline std::uint64_t crc32c_blocks(std::uint64_t n) {
  return (n + kCrc32cBlock - 1) / kCrc32cBlock;
}

// The standard CRC-32C of `n` bytes from the raw CRCs of their blocks.
std::uint32_t crc32c_from_blocks(const std::uint32_t* raw, std::uint64_t n);

// Whether the CPU instruction is used (for the benchmark's notes).
bool crc32c_hardware();

namespace detail {
// The table version, whatever the CPU (tests compare the two).
std::uint32_t crc32c_raw_table(std::uint32_t crc, const void* data, std::uint64_t n);
}  // namespace detail

}  // namespace tpreload
