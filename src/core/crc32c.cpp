#include "tpreload/core/crc32c.h"

#include <algorithm>
#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace tpreload {
namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli

// Slicing-by-8 tables: table[k][b] is the CRC of byte b followed by k zero bytes.
struct Tables {
  std::array<std::array<std::uint32_t, 256>, 8> slice{};
  // shift[k][b]: the raw CRC register value b << (8k), advanced over one block
  // of zero bytes (x^(8 * kCrc32cBlock) mod P, by linearity byte by byte).
  std::array<std::array<std::uint32_t, 256>, 4> shift{};
};

std::uint32_t advance_zeros_slow(const Tables& t, std::uint32_t crc, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) crc = t.slice[0][crc & 0xFF] ^ (crc >> 8);
  return crc;
}

Tables make_tables() {
  Tables t;
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
    t.slice[0][b] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (std::uint32_t b = 0; b < 256; ++b)
      t.slice[k][b] = t.slice[0][t.slice[k - 1][b] & 0xFF] ^ (t.slice[k - 1][b] >> 8);
  for (int k = 0; k < 4; ++k)
    for (std::uint32_t b = 0; b < 256; ++b)
      t.shift[k][b] = advance_zeros_slow(t, b << (8 * k), kCrc32cBlock);
  return t;
}

const Tables& tables() {
  static const Tables t = make_tables();
  return t;
}

// The register advanced over one block of zeros.
std::uint32_t shift_block(const Tables& t, std::uint32_t crc) {
  return t.shift[0][crc & 0xFF] ^ t.shift[1][(crc >> 8) & 0xFF] ^ t.shift[2][(crc >> 16) & 0xFF] ^
         t.shift[3][crc >> 24];
}

std::uint32_t raw_table(const Tables& t, std::uint32_t crc, const unsigned char* p,
                        std::uint64_t n) {
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= crc;
    crc = t.slice[7][w & 0xFF] ^ t.slice[6][(w >> 8) & 0xFF] ^ t.slice[5][(w >> 16) & 0xFF] ^
          t.slice[4][(w >> 24) & 0xFF] ^ t.slice[3][(w >> 32) & 0xFF] ^
          t.slice[2][(w >> 40) & 0xFF] ^ t.slice[1][(w >> 48) & 0xFF] ^ t.slice[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = t.slice[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint32_t raw_hw(std::uint32_t crc, const unsigned char* p,
                                                       std::uint64_t n) {
  std::uint64_t c = crc;
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
    p += 8;
    n -= 8;
  }
  while (n--) c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
  return static_cast<std::uint32_t>(c);
}

// Three whole blocks at once (the instruction's latency is three cycles, its
// throughput one), each a raw CRC.
__attribute__((target("sse4.2"))) void raw_hw_3blocks(const unsigned char* p,
                                                      std::uint32_t out[3]) {
  std::uint64_t a = 0, b = 0, c = 0;
  const unsigned char* q = p + kCrc32cBlock;
  const unsigned char* r = p + 2 * kCrc32cBlock;
  for (std::uint64_t i = 0; i < kCrc32cBlock; i += 8) {
    std::uint64_t x, y, z;
    std::memcpy(&x, p + i, 8);
    std::memcpy(&y, q + i, 8);
    std::memcpy(&z, r + i, 8);
    a = _mm_crc32_u64(a, x);
    b = _mm_crc32_u64(b, y);
    c = _mm_crc32_u64(c, z);
  }
  out[0] = static_cast<std::uint32_t>(a);
  out[1] = static_cast<std::uint32_t>(b);
  out[2] = static_cast<std::uint32_t>(c);
}

bool has_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#else
bool has_sse42() {
  return false;
}
#endif

std::uint32_t raw(std::uint32_t crc, const void* data, std::uint64_t n) {
#if defined(__x86_64__)
  if (has_sse42()) return raw_hw(crc, static_cast<const unsigned char*>(data), n);
#endif
  return raw_table(tables(), crc, static_cast<const unsigned char*>(data), n);
}

// Appends a block's raw CRC to the running register (the register advanced over
// the block's length, then the block's own raw value: CRC linearity).
std::uint32_t append(const Tables& t, std::uint32_t reg, std::uint32_t block_raw,
                     std::uint64_t block_len) {
  static const unsigned char zeros[kCrc32cBlock] = {};
  const std::uint32_t shifted =
      block_len == kCrc32cBlock ? shift_block(t, reg) : raw(reg, zeros, block_len);
  return shifted ^ block_raw;
}

}  // namespace

std::uint32_t crc32c_raw(const void* data, std::uint64_t n) {
  return raw(0, data, n);
}

std::uint32_t crc32c(const void* data, std::uint64_t n) {
  const Tables& t = tables();
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t reg = 0xFFFFFFFFu;
#if defined(__x86_64__)
  if (has_sse42()) {
    while (n >= 3 * kCrc32cBlock) {
      std::uint32_t blocks[3];
      raw_hw_3blocks(p, blocks);
      for (std::uint32_t b : blocks) reg = shift_block(t, reg) ^ b;
      p += 3 * kCrc32cBlock;
      n -= 3 * kCrc32cBlock;
    }
    return raw_hw(reg, p, n) ^ 0xFFFFFFFFu;
  }
#endif
  return raw_table(t, reg, p, n) ^ 0xFFFFFFFFu;
}

std::uint32_t crc32c_from_blocks(const std::uint32_t* raw_blocks, std::uint64_t n) {
  const Tables& t = tables();
  std::uint32_t reg = 0xFFFFFFFFu;
  for (std::uint64_t i = 0; i < crc32c_blocks(n); ++i)
    reg = append(t, reg, raw_blocks[i], std::min(kCrc32cBlock, n - i * kCrc32cBlock));
  return reg ^ 0xFFFFFFFFu;
}

bool crc32c_hardware() {
  return has_sse42();
}

namespace detail {
std::uint32_t crc32c_raw_table(std::uint32_t crc, const void* data, std::uint64_t n) {
  return raw_table(tables(), crc, static_cast<const unsigned char*>(data), n);
}
}  // namespace detail

}  // namespace tpreload
