#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "tpreload/core/dtype.h"
#include "tpreload/core/error.h"
#include "tpreload/core/float_bits.h"
#include "tpreload/core/fnv.h"
#include "tpreload/core/log.h"

namespace tpreload {
namespace {

TEST(DType, SizesAndNamesRoundTrip) {
  const std::pair<DType, std::size_t> sizes[] = {
      {DType::kFloat32, 4}, {DType::kFloat16, 2}, {DType::kBFloat16, 2},
      {DType::kInt8, 1},    {DType::kInt32, 4},   {DType::kInt64, 8},
      {DType::kUInt8, 1},   {DType::kBool, 1},    {DType::kFloat64, 8}};
  for (auto [dtype, size] : sizes) {
    EXPECT_EQ(dtype_size(dtype), size) << dtype_name(dtype);
    EXPECT_EQ(dtype_from_name(dtype_name(dtype)), dtype);
    EXPECT_EQ(dtype_from_safetensors(dtype_safetensors_name(dtype)), dtype);
  }
}

TEST(DType, SpellingsOfEachFormat) {
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBFloat16);
  EXPECT_EQ(dtype_from_safetensors("BOOL"), DType::kBool);
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::kBFloat16);
  EXPECT_EQ(dtype_from_name("half"), DType::kFloat16);
  EXPECT_EQ(dtype_safetensors_name(DType::kUInt8), "U8");
  EXPECT_EQ(dtype_from_safetensors("F8_E8M0"), std::nullopt);
  EXPECT_EQ(dtype_from_name("float8"), std::nullopt);
  EXPECT_EQ(dtype_from_safetensors("bf16"), std::nullopt);  // case matters in the format
}

// Every float16 pattern, against its value worked out from the IEEE fields:
// (1 + m / 1024) * 2^(e - 15), m * 2^-24 for e = 0, infinity for e = 31 and
// m = 0, and a NaN that keeps its bits otherwise.
TEST(FloatBits, EveryFloat16PatternConvertsExactly) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const std::uint32_t e = (h >> 10) & 31u, m = h & 1023u;
    const double sign = h & 0x8000u ? -1.0 : 1.0;
    const float got = fbits::from_half(static_cast<std::uint16_t>(h));
    std::uint32_t got_bits;
    std::memcpy(&got_bits, &got, sizeof got_bits);
    if (e == 31 && m != 0) {
      EXPECT_EQ(got_bits, (h & 0x8000u) << 16 | 0x7F800000u | m << 13) << "NaN " << h;
      continue;
    }
    const double want = e == 31  ? sign * HUGE_VAL
                        : e == 0 ? sign * std::ldexp(m, -24)
                                 : sign * std::ldexp(1.0 + m / 1024.0, static_cast<int>(e) - 15);
    EXPECT_EQ(static_cast<double>(got), want) << "pattern " << h;
    EXPECT_EQ(std::signbit(got), (h & 0x8000u) != 0) << "pattern " << h;  // -0 too
  }
}

// The published FNV-1a 64 test vectors (the reference implementation's), and
// hashing in pieces equals hashing at once.
TEST(Fnv1a, PublishedVectorsAndPieces) {
  EXPECT_EQ(fnv1a(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a("foobar"), 0x85944171f73967e8ull);
  EXPECT_EQ(fnv1a("bar", fnv1a("foo")), fnv1a("foobar"));
}

TEST(Errors, RaiseBuildsTheMessageAndType) {
  try {
    raise<CheckpointError>("file ", "a.safetensors", ": tensor 'w' has ", 12, " bytes");
    FAIL() << "raise returned";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "file a.safetensors: tensor 'w' has 12 bytes");
    EXPECT_NE(dynamic_cast<const CheckpointError*>(&e), nullptr);
  }
}

TEST(Errors, TimeoutIsACommError) {
  EXPECT_THROW(raise<CommTimeoutError>("x"), CommError);
}

TEST(Logging, RejectsUnknownLevel) {
  EXPECT_THROW(init_logging(0, 1, "loud"), UsageError);
  EXPECT_NO_THROW(init_logging(3, 8, "off"));
  EXPECT_EQ(log().level(), spdlog::level::off);
}

}  // namespace
}  // namespace tpreload
