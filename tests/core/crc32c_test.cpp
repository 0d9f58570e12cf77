// CRC-32C against the published check value and a bit-at-a-time reference
// written here from the polynomial, by every method this CPU has (fold,
// instruction, table), whole and from block values.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <random>
#include <vector>

#include "tpreload/core/crc32c.h"

namespace tpreload {
namespace {

// One bit at a time, reflected Castagnoli polynomial 0x82F63B78.
std::uint32_t reference(std::uint32_t crc, const unsigned char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return crc;
}

std::uint32_t standard(const std::vector<unsigned char>& v) {
  return reference(0xFFFFFFFFu, v.data(), v.size()) ^ 0xFFFFFFFFu;
}

std::vector<unsigned char> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(gen());
  return v;
}

TEST(Crc32c, CheckValue) {
  const char* text = "123456789";
  EXPECT_EQ(crc32c(text, 9), 0xE3069283u);  // RFC 3720, B.4
  EXPECT_EQ(crc32c(text, 0), 0u);
}

TEST(Crc32c, EqualsTheBitwiseReferenceAtEverySizeAroundTheBlocks) {
  for (std::size_t n : {1, 7, 8, 9, 4095, 4096, 4097, 8192, 12287, 12288, 12289, 3 * 4096 + 4103,
                        100000, 1 << 20}) {
    const auto v = random_bytes(n, static_cast<unsigned>(n));
    const std::uint32_t want = standard(v);
    EXPECT_EQ(crc32c(v.data(), n), want) << n << " bytes";
    EXPECT_EQ(detail::crc32c_raw_table(0xFFFFFFFFu, v.data(), n) ^ 0xFFFFFFFFu, want)
        << n << " bytes, table";
    // From raw block values (as a device computes them), combined on the host.
    std::vector<std::uint32_t> blocks;
    for (std::size_t at = 0; at < n; at += kCrc32cBlock) {
      const std::size_t len = std::min<std::size_t>(kCrc32cBlock, n - at);
      blocks.push_back(reference(0, v.data() + at, len));
      EXPECT_EQ(crc32c_raw(v.data() + at, len), blocks.back());
    }
    ASSERT_EQ(blocks.size(), crc32c_blocks(n));
    EXPECT_EQ(crc32c_from_blocks(blocks.data(), n), want) << n << " bytes from blocks";
  }
}

// Bytes summed in the steps they arrive in: extended from the empty CRC (0)
// over cuts at random places, including empty steps, equals the reference over
// the whole.
TEST(Crc32c, ExtendedStepByStepEqualsTheWhole) {
  const auto v = random_bytes(3 << 20, 7);
  const std::uint32_t want = standard(v);
  std::mt19937 gen(11);
  for (std::size_t max_step : {1, 300, 4096, 70000, 1 << 20}) {
    std::uint32_t crc = 0;
    std::size_t at = 0, steps = 0;
    while (at < v.size()) {
      const std::size_t n = std::min<std::size_t>(gen() % (max_step + 1), v.size() - at);
      if (max_step == 1 && v.size() - at > 40000) {  // bytes one at a time only at the end
        crc = crc32c_extend(crc, v.data() + at, v.size() - at - 40000);
        at = v.size() - 40000;
        continue;
      }
      crc = crc32c_extend(crc, v.data() + at, n);
      at += n;
      ++steps;
    }
    EXPECT_EQ(crc, want) << "steps of up to " << max_step << " bytes (" << steps << " steps)";
  }
  EXPECT_EQ(crc32c_extend(0, v.data(), 0), 0u);
}

// Every method this CPU has, against the bitwise reference: every length to
// 1,100 bytes (the fold's 256-byte rounds, its 16-byte steps and the bytes
// after them), each from an odd address and a register other than 0, and a few
// long ranges. The methods the CPU lacks are named in the output.
TEST(Crc32c, EveryMethodEqualsTheReferenceAtEveryLengthAndAlignment) {
  const auto v = random_bytes((1 << 20) + 4096, 11);
  std::mt19937 gen(5);
  int methods = 0;
  for (Crc32cMethod method :
       {Crc32cMethod::kTable, Crc32cMethod::kInstruction, Crc32cMethod::kFold}) {
    if (!crc32c_supports(method)) {
      std::cout << "[ NOTE     ] this CPU cannot run the " << crc32c_method_name(method)
                << " method: not checked here\n";
      continue;
    }
    ++methods;
    for (std::size_t n = 0; n <= 1100; ++n) {
      const std::size_t at = 1 + n % 63;
      const std::uint32_t crc = static_cast<std::uint32_t>(gen());
      ASSERT_EQ(detail::crc32c_raw_with(method, crc, v.data() + at, n),
                reference(crc, v.data() + at, n))
          << crc32c_method_name(method) << ", " << n << " bytes at +" << at;
    }
    for (std::size_t n : {4096 * 3 + 17, 65536, 1 << 20}) {
      const std::uint32_t crc = static_cast<std::uint32_t>(gen());
      EXPECT_EQ(detail::crc32c_raw_with(method, crc, v.data() + 3, n),
                reference(crc, v.data() + 3, n))
          << crc32c_method_name(method) << ", " << n << " bytes";
    }
  }
  EXPECT_GE(methods, 1);
  // Unless TPRELOAD_CRC32C asks for another, the fastest the CPU has is used.
  const Crc32cMethod fastest = crc32c_supports(Crc32cMethod::kFold) ? Crc32cMethod::kFold
                               : crc32c_supports(Crc32cMethod::kInstruction)
                                   ? Crc32cMethod::kInstruction
                                   : Crc32cMethod::kTable;
  if (!std::getenv("TPRELOAD_CRC32C")) {
    EXPECT_EQ(crc32c_method(), fastest) << crc32c_method_name(crc32c_method());
  }
}

TEST(Crc32c, EveryFlippedBitChangesIt) {
  auto v = random_bytes(3 * 4096 + 100, 7);
  const std::uint32_t clean = crc32c(v.data(), v.size());
  for (std::size_t bit = 0; bit < v.size() * 8; bit += 37) {
    v[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    EXPECT_NE(crc32c(v.data(), v.size()), clean) << "bit " << bit;
    v[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
  EXPECT_EQ(crc32c(v.data(), v.size()), clean);
}

}  // namespace
}  // namespace tpreload
