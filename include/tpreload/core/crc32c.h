// CRC-32C (Castagnoli, iSCSI: reflected polynomial 0x82F63B78), the checksum of
// every bucket the reader sends and every receiver verifies. The fastest method
// the CPU has is chosen once: folding 256 bytes a round with carry-less
// multiplies (VPCLMULQDQ on AVX-512 registers), else the crc32 instruction
// (SSE4.2) on three 4 KiB blocks at once, else a slicing-by-8 table. All give
// the same values (standard CRC-32C: initial and final value 0xFFFFFFFF;
// crc32c("123456789") == 0xE3069283).
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

// The CRC-32C of some bytes whose CRC-32C was `so_far`, followed by these `n`:
// crc32c_extend(crc32c(a), b) is the CRC-32C of a then b, and
// crc32c_extend(0, data, n) == crc32c(data, n). How bytes are summed in the
// steps in which they arrive.
std::uint32_t crc32c_extend(std::uint32_t so_far, const void* data, std::uint64_t n);

// The raw CRC of one block: initial value 0, no final xor.
std::uint32_t crc32c_raw(const void* data, std::uint64_t n);

// Blocks in `n` bytes: ceil(n / kCrc32cBlock).
inline std::uint64_t crc32c_blocks(std::uint64_t n) {
  return (n + kCrc32cBlock - 1) / kCrc32cBlock;
}

// The standard CRC-32C of `n` bytes from the raw CRCs of their blocks.
std::uint32_t crc32c_from_blocks(const std::uint32_t* raw, std::uint64_t n);

enum class Crc32cMethod { kTable, kInstruction, kFold };

// The method this CPU uses, and its name (for the benchmark's notes).
Crc32cMethod crc32c_method();
const char* crc32c_method_name(Crc32cMethod method);
// Whether this CPU can run `method` (the table always).
bool crc32c_supports(Crc32cMethod method);

namespace detail {
// The table version, whatever the CPU (tests compare the two).
std::uint32_t crc32c_raw_table(std::uint32_t crc, const void* data, std::uint64_t n);
// The raw CRC continued from `crc` by `method` (by the CPU's best where it
// cannot run `method`; tests ask crc32c_supports first).
std::uint32_t crc32c_raw_with(Crc32cMethod method, std::uint32_t crc, const void* data,
                              std::uint64_t n);
}  // namespace detail

}  // namespace tpreload
