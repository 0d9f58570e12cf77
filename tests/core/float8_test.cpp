// The FP8 encoders and decoders (core/float8.h) against an oracle written here:
// each format's 256 codes valued by their own formula (sign, exponent, mantissa
// fields in double), and encoding as a search of that table for the nearest
// code of the value's sign, ties to the code whose mantissa is even, after the
// clamp to the largest finite value (a NaN clamps to +max, as vLLM's
// fmaxf(-max, fminf(x, max)) does).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tpreload/core/dtype.h"
#include "tpreload/core/float8.h"

namespace tpreload {
namespace {

struct Format {
  const char* name;
  int exponent_bits, mantissa_bits, bias;
  bool ieee_specials;  // e5m2: the top exponent is infinity and NaN; e4m3fn: only S.1111.111 is NaN
  double max;
  std::uint8_t (*encode)(float);
  float (*decode)(std::uint8_t);
};

const Format kE4M3{"e4m3fn", 4, 3, 7, false, 448.0, fp8::to_e4m3fn, fp8::from_e4m3fn};
const Format kE5M2{"e5m2", 5, 2, 15, true, 57344.0, fp8::to_e5m2, fp8::from_e5m2};

// The value of code `c`: NaN for NaN codes, +-infinity for e5m2's.
double value_of(const Format& f, int c) {
  const int sign = c >> 7;
  const int e = (c >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1);
  const int m = c & ((1 << f.mantissa_bits) - 1);
  const int top = (1 << f.exponent_bits) - 1;
  const double s = sign ? -1.0 : 1.0;
  if (f.ieee_specials && e == top)
    return m == 0 ? s * std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  if (!f.ieee_specials && e == top && m == (1 << f.mantissa_bits) - 1)
    return std::numeric_limits<double>::quiet_NaN();
  const double fraction = static_cast<double>(m) / (1 << f.mantissa_bits);
  if (e == 0) return s * std::ldexp(fraction, 1 - f.bias);
  return s * std::ldexp(1.0 + fraction, e - f.bias);
}

bool finite_code(const Format& f, int c) {
  return std::isfinite(value_of(f, c));
}

// The code the oracle gives `x`.
int oracle(const Format& f, float x) {
  double v = std::isnan(x) ? f.max : std::fmin(std::fmax(static_cast<double>(x), -f.max), f.max);
  const int sign = std::signbit(static_cast<float>(v)) ? 1 : 0;
  int best = -1;
  double best_distance = 0;
  for (int c = sign << 7; c < (sign << 7) + 128; ++c) {
    if (!finite_code(f, c)) continue;
    const double d = std::fabs(value_of(f, c) - v);
    if (best < 0 || d < best_distance || (d == best_distance && (c & 1) == 0 && (best & 1))) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

void expect_encodes(const Format& f, float x, const char* what) {
  const int want = oracle(f, x);
  const int got = f.encode(x);
  EXPECT_EQ(got, want) << f.name << " " << what << ": " << x << " (bits 0x" << std::hex << [&] {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  }() << ")";
}

class Float8 : public ::testing::TestWithParam<const Format*> {};

TEST_P(Float8, EveryCodeDecodesToItsValue) {
  const Format& f = *GetParam();
  for (int c = 0; c < 256; ++c) {
    const double want = value_of(f, c);
    const float got = f.decode(static_cast<std::uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << f.name << " code " << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << f.name << " code " << c;
      EXPECT_EQ(std::signbit(got), (c >> 7) == 1) << f.name << " code " << c << ": its sign";
    }
  }
}

TEST_P(Float8, EveryFiniteCodeEncodesToItself) {
  const Format& f = *GetParam();
  for (int c = 0; c < 256; ++c)
    if (finite_code(f, c)) {
      EXPECT_EQ(f.encode(static_cast<float>(value_of(f, c))), c) << f.name;
    }
}

// Every midpoint between neighbouring codes of one sign (ties: to the even
// mantissa), and the floats just either side of it.
TEST_P(Float8, TiesGoToTheEvenCodeAndNeighboursToTheNearest) {
  const Format& f = *GetParam();
  int ties = 0;
  for (int sign = 0; sign < 2; ++sign) {
    for (int c = sign << 7; c + 1 < (sign << 7) + 128; ++c) {
      if (!finite_code(f, c) || !finite_code(f, c + 1)) continue;
      const double mid = (value_of(f, c) + value_of(f, c + 1)) / 2;
      const float x = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(x), mid) << "a midpoint float cannot hold";
      expect_encodes(f, x, "midpoint");
      EXPECT_EQ(f.encode(x) & 1, 0) << f.name << ": the tie " << x << " went to an odd code";
      expect_encodes(f, std::nextafter(x, 0.0f), "below a midpoint");
      expect_encodes(f, std::nextafter(x, x * 2), "above a midpoint");
      ++ties;
    }
  }
  EXPECT_GT(ties, 200) << f.name;
}

TEST_P(Float8, ClampsAndSpecials) {
  const Format& f = *GetParam();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float max = static_cast<float>(f.max);
  for (float x : {max, std::nextafter(max, inf), max * 1.0625f, max * 1.125f, max * 2, 1e30f, inf,
                  -max, -max * 1.125f, -inf, nan, -nan, 0.0f, -0.0f})
    expect_encodes(f, x, "clamp or special");
  EXPECT_EQ(f.encode(nan), f.encode(max)) << f.name << ": NaN clamps to +max";
  EXPECT_EQ(f.encode(-0.0f), 0x80) << f.name << ": -0 keeps its sign";
  // Around the smallest subnormal and below it (float subnormals too).
  const float tiny = static_cast<float>(value_of(f, 1));
  for (float x : {tiny, tiny / 2, std::nextafter(tiny / 2, 1.0f), std::nextafter(tiny / 2, 0.0f),
                  tiny * 1.5f, tiny / 4, -tiny / 2, -std::nextafter(tiny / 2, 1.0f),
                  std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::min()})
    expect_encodes(f, x, "near zero");
}

TEST_P(Float8, RandomFloatsEncodeAsTheOracle) {
  const Format& f = *GetParam();
  std::mt19937 random(17);
  std::uniform_real_distribution<double> exponent(-20, 20);
  for (int i = 0; i < 20000; ++i) {
    const float sign = (random() & 1) ? -1.0f : 1.0f;
    const float x = sign * static_cast<float>(std::exp2(exponent(random)));
    expect_encodes(f, x, "random");
    if (::testing::Test::HasFailure()) break;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Float8, ::testing::Values(&kE4M3, &kE5M2),
                         [](const auto& info) { return std::string(info.param->name); });

TEST(Float8DType, NamesAndSizes) {
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::kFloat8E4M3);
  EXPECT_EQ(dtype_from_safetensors("F8_E5M2"), DType::kFloat8E5M2);
  EXPECT_EQ(dtype_from_name("float8_e4m3fn"), DType::kFloat8E4M3);
  EXPECT_EQ(dtype_from_name("float8_e5m2"), DType::kFloat8E5M2);
  EXPECT_EQ(dtype_size(DType::kFloat8E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::kFloat8E5M2), 1u);
  EXPECT_TRUE(dtype_is_float8(DType::kFloat8E4M3));
  EXPECT_FALSE(dtype_is_floating(DType::kFloat8E5M2)) << "no plain conversion into FP8";
  EXPECT_FALSE(dtype_is_float8(DType::kUInt8));
}

}  // namespace
}  // namespace tpreload
