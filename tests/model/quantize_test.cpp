#include "tpreload/model/quantize.h"

#include "tpreload/core/error.h"

#include <gtest/gtest.h>

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace tpreload {
namespace {

float bf16_to_float(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::uint16_t float_to_bf16(float f) {  // truncation is fine: any bit pattern is a test value
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<std::uint16_t>(u >> 16);
}

// The formula of quantize.h, one element at a time with libm.
void reference(const std::vector<float>& w, std::int64_t cols, std::vector<std::int8_t>& q,
               std::vector<float>& scale) {
  const std::int64_t rows = static_cast<std::int64_t>(w.size()) / cols;
  q.assign(w.size(), 0);
  scale.assign(rows, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    float amax = 0;
    for (std::int64_t c = 0; c < cols; ++c)
      if (!std::isnan(w[r * cols + c])) amax = std::max(amax, std::fabs(w[r * cols + c]));
    const float s = amax == 0 ? 1.0f : amax / 127.0f;
    scale[r] = s;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float v = std::nearbyint(w[r * cols + c] / s);
      q[r * cols + c] =
          std::isnan(v) ? -127 : static_cast<std::int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
}

// Checks both kernels on the same values (as bfloat16 patterns and as floats).
void expect_matches_formula(const std::vector<std::uint16_t>& bits, std::int64_t cols) {
  const std::int64_t rows = static_cast<std::int64_t>(bits.size()) / cols;
  std::vector<float> values(bits.size());
  std::transform(bits.begin(), bits.end(), values.begin(), bf16_to_float);
  std::vector<std::int8_t> want_q;
  std::vector<float> want_scale;
  reference(values, cols, want_q, want_scale);

  std::vector<std::int8_t> q(bits.size(), 99);
  std::vector<float> scale(rows, -1);
  quantize_rows_bf16(bits.data(), rows, cols, cols, q.data(), scale.data());
  EXPECT_EQ(q, want_q) << "bf16, cols " << cols;
  EXPECT_EQ(std::memcmp(scale.data(), want_scale.data(), rows * sizeof(float)), 0) << "bf16 scales";

  std::fill(q.begin(), q.end(), 99);
  quantize_rows_f32(values.data(), rows, cols, cols, q.data(), scale.data());
  EXPECT_EQ(q, want_q) << "f32, cols " << cols;
  EXPECT_EQ(std::memcmp(scale.data(), want_scale.data(), rows * sizeof(float)), 0) << "f32 scales";
}

// Every test runs at each instruction-set level this CPU has (the kernels are
// compiled once per level: vector widths and tails differ, the bytes may not).
class Quantize : public ::testing::TestWithParam<QuantizeLevel> {
  detail::ScopedQuantizeLevel level_{GetParam()};
};

std::vector<QuantizeLevel> levels_of_this_cpu() {
  std::vector<QuantizeLevel> out;
  for (QuantizeLevel l : {QuantizeLevel::kBaseline, QuantizeLevel::kAvx2, QuantizeLevel::kAvx512})
    if (quantize_supports(l)) out.push_back(l);
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryLevel, Quantize, ::testing::ValuesIn(levels_of_this_cpu()),
                         [](const ::testing::TestParamInfo<QuantizeLevel>& p) {
                           return std::string(quantize_level_name(p.param));
                         });

// The level chosen is the best this CPU runs, by its features asked one by one
// (x86-64-v4 is v3 plus AVX-512 F, BW, CD, DQ and VL; v3 is AVX2, FMA, BMI1/2
// and more, of which these are the ones every v3 CPU is named for).
TEST(QuantizeLevels, TheLevelChosenIsTheBestThisCpuRuns) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                  __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
  const bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
  const QuantizeLevel want = v4   ? QuantizeLevel::kAvx512
                             : v3 ? QuantizeLevel::kAvx2
                                  : QuantizeLevel::kBaseline;
#else
  const QuantizeLevel want = QuantizeLevel::kBaseline;  // (one level built)
#endif
  EXPECT_EQ(quantize_level(), want) << quantize_level_name(quantize_level());
}

TEST(QuantizeLevels, AScopedLevelIsTheOneInUseUntilItEnds) {
  const QuantizeLevel best = quantize_level();
  EXPECT_TRUE(quantize_supports(QuantizeLevel::kBaseline));
  EXPECT_EQ(detail::quantize_level_in_use(), best);
  for (QuantizeLevel l : levels_of_this_cpu()) {
    detail::ScopedQuantizeLevel use(l);
    EXPECT_EQ(detail::quantize_level_in_use(), l);
    {
      detail::ScopedQuantizeLevel inner(QuantizeLevel::kBaseline);
      EXPECT_EQ(detail::quantize_level_in_use(), QuantizeLevel::kBaseline);
    }
    EXPECT_EQ(detail::quantize_level_in_use(), l);
  }
  EXPECT_EQ(detail::quantize_level_in_use(), best);
  for (QuantizeLevel l : {QuantizeLevel::kAvx2, QuantizeLevel::kAvx512}) {
    if (!quantize_supports(l)) {
      EXPECT_THROW(detail::ScopedQuantizeLevel{l}, UsageError) << quantize_level_name(l);
    }
  }
}

TEST_P(Quantize, RandomRowsOfEveryWidthMatchTheFormula) {
  std::mt19937 gen(11);
  std::uniform_int_distribution<int> exponent(-20, 4);
  std::normal_distribution<float> mantissa(0.0f, 1.0f);
  // Widths around every vector length and its tails.
  for (std::int64_t cols : {1, 2, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 129, 1000, 2061}) {
    std::vector<std::uint16_t> bits(5 * cols);
    for (auto& b : bits) b = float_to_bf16(std::ldexp(mantissa(gen), exponent(gen)));
    expect_matches_formula(bits, cols);
  }
}

TEST_P(Quantize, TiesRoundToEvenAndZeroRowsScaleByOne) {
  // max 127 makes the scale exactly 1, so every .5 is a tie.
  const std::vector<float> row = {127.0f, 2.5f, 3.5f,   -2.5f,   -3.5f, 0.5f, -0.5f, 1.5f,
                                  -0.0f,  0.0f, 126.5f, -127.0f, 64.5f, 1.0f, -1.0f, 0.25f};
  std::vector<std::uint16_t> bits(row.size());
  std::transform(row.begin(), row.end(), bits.begin(), float_to_bf16);
  std::vector<std::int8_t> q(row.size());
  float scale = 0;
  quantize_rows_bf16(bits.data(), 1, static_cast<std::int64_t>(row.size()),
                     static_cast<std::int64_t>(row.size()), q.data(), &scale);
  EXPECT_EQ(scale, 1.0f);
  const std::vector<std::int8_t> want = {127, 2, 4, -2, -4, 0, 0, 2, 0, 0, 126, -127, 64, 1, -1, 0};
  EXPECT_EQ(q, want);
  expect_matches_formula(bits, static_cast<std::int64_t>(row.size()));

  std::vector<std::uint16_t> zeros(40, 0);
  zeros[3] = 0x8000;  // -0
  expect_matches_formula(zeros, 20);
}

TEST_P(Quantize, NanIsLeftOutOfTheScaleAndInfinityAndSubnormalsFollowTheFormula) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float tiny = std::numeric_limits<float>::denorm_min() * 65536.0f * 3;  // a bf16 subnormal
  const std::vector<std::vector<float>> rows = {
      {1.0f, nan, -2.0f, 0.5f, 3.0f, nan, 0.0f, -1.0f, 2.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f,
       1.0f, 1.0f},
      {1.0f, inf, -2.0f, 0.5f, 3.0f, -inf, 0.0f, -1.0f, 2.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f,
       1.0f, 1.0f},
      {tiny, -tiny, tiny / 3, 0.0f, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny,
       tiny, tiny, -tiny},
  };
  for (const auto& row : rows) {
    std::vector<std::uint16_t> bits(row.size());
    std::transform(row.begin(), row.end(), bits.begin(), float_to_bf16);
    expect_matches_formula(bits, static_cast<std::int64_t>(row.size()));
  }
  // The NaN row: the scale comes from the largest finite value (3 / 127), the NaN is -127.
  std::vector<std::uint16_t> bits(rows[0].size());
  std::transform(rows[0].begin(), rows[0].end(), bits.begin(), float_to_bf16);
  std::vector<std::int8_t> q(bits.size());
  float scale = 0;
  quantize_rows_bf16(bits.data(), 1, static_cast<std::int64_t>(bits.size()),
                     static_cast<std::int64_t>(bits.size()), q.data(), &scale);
  EXPECT_EQ(scale, 3.0f / 127.0f);
  EXPECT_EQ(q[1], -127);
  EXPECT_EQ(q[4], 127);
}

TEST_P(Quantize, StridedRowsQuantizeAsTheirContiguousCopy) {
  // A row-parallel shard seen inside the whole tensor: columns [5, 5 + 37) of 70.
  std::mt19937 gen(12);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const std::int64_t rows = 9, width = 70, col0 = 5, cols = 37;
  std::vector<std::uint16_t> whole(rows * width), block(rows * cols);
  std::vector<float> whole_f(rows * width), block_f(rows * cols);
  for (std::int64_t i = 0; i < rows * width; ++i) {
    whole[i] = float_to_bf16(normal(gen));
    whole_f[i] = bf16_to_float(whole[i]);
  }
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      block[r * cols + c] = whole[r * width + col0 + c];
      block_f[r * cols + c] = whole_f[r * width + col0 + c];
    }
  std::vector<std::int8_t> want_q, q(rows * cols), q_f(rows * cols);
  std::vector<float> want_scale, scale(rows), scale_f(rows);
  reference(block_f, cols, want_q, want_scale);
  quantize_rows_bf16(whole.data() + col0, rows, cols, width, q.data(), scale.data());
  quantize_rows_f32(whole_f.data() + col0, rows, cols, width, q_f.data(), scale_f.data());
  EXPECT_EQ(q, want_q);
  EXPECT_EQ(q_f, want_q);
  EXPECT_EQ(scale, want_scale);
  EXPECT_EQ(scale_f, want_scale);
}

}  // namespace
}  // namespace tpreload

namespace tpreload {
namespace {

// float16 sources: every one of the 65,536 bit patterns (zeros, subnormals, the
// largest normals, infinities, NaNs), converted here by c10::Half, not by the
// kernel's own conversion.
TEST_P(Quantize, EveryFloat16PatternMatchesTheFormula) {
  for (std::int64_t cols : {1, 3, 16, 257, 4096}) {
    std::vector<std::uint16_t> bits(65536);
    for (std::uint32_t i = 0; i < bits.size(); ++i)
      bits[i] = static_cast<std::uint16_t>(i * 40503u);
    bits.resize(bits.size() / cols * cols);
    std::vector<float> values(bits.size());
    for (std::size_t i = 0; i < bits.size(); ++i)
      values[i] = static_cast<float>(c10::Half(bits[i], c10::Half::from_bits()));
    std::vector<std::int8_t> want_q;
    std::vector<float> want_scale;
    reference(values, cols, want_q, want_scale);
    const std::int64_t rows = static_cast<std::int64_t>(bits.size()) / cols;
    std::vector<std::int8_t> q(bits.size(), 99);
    std::vector<float> scale(rows, -1);
    quantize_rows_f16(bits.data(), rows, cols, cols, q.data(), scale.data());
    EXPECT_EQ(q, want_q) << "cols " << cols;
    EXPECT_EQ(std::memcmp(scale.data(), want_scale.data(), rows * sizeof(float)), 0)
        << "cols " << cols;
  }
}

}  // namespace
}  // namespace tpreload
