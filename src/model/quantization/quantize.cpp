#include "tpreload/model/quantize.h"

#include "tpreload/core/error.h"
#include "tpreload/core/float_bits.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

// Built once per instruction set (AVX-512, AVX2, baseline x86-64: the
// x86-64-v4, -v3 and baseline levels) and picked once at run time: the loops
// below vectorize, and wider vectors are most of the speed. Loops at -O3 because
// the build's -O2 cost model leaves them scalar. Every level is callable where
// the CPU has it (detail::ScopedQuantizeLevel), so that the tests run each one.
// The file is compiled for baseline x86-64 whatever the build's -march
// (CMakeLists.txt): the inline helpers below then inline into every level's
// kernels, and no copy of them can need more than the baseline. GCC 12 or later:
// __builtin_cpu_supports knows the x86-64-v* levels.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define TPRELOAD_QUANTIZE_LEVELS 1
#define TPRELOAD_QUANTIZE_KERNEL(level) __attribute__((optimize("O3"), target(level)))
#elif defined(__GNUC__) && !defined(__clang__)
#define TPRELOAD_QUANTIZE_KERNEL(level) __attribute__((optimize("O3")))
#else
#define TPRELOAD_QUANTIZE_KERNEL(level)
#endif

namespace tpreload {
namespace {

// bfloat16 travels as its bit pattern: the high half of a float.
__attribute__((always_inline)) inline float to_float(std::uint16_t bf16) {
  const std::uint32_t u = static_cast<std::uint32_t>(bf16) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float to_float(float v) {
  return v;
}

// IEEE half bits, converted to float exactly.
struct Half {
  std::uint16_t bits;
};
__attribute__((always_inline)) inline float to_float(Half h) {
  return fbits::from_half(h.bits);
}

// max|w| as the formula states it, NaNs ignored; the slow path for rows with a NaN.
template <typename T>
__attribute__((always_inline)) inline float plain_amax(const T* row, std::int64_t cols) {
  float amax = 0.0f;
  for (std::int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(to_float(row[c])));
  return amax;
}

// For IEEE values without NaNs, |x| orders as the bits with the sign cleared, and
// an integer max vectorizes where a float max with NaN semantics does not.
__attribute__((always_inline)) inline float row_amax(const std::uint16_t* row, std::int64_t cols) {
  std::uint16_t m = 0;
  for (std::int64_t c = 0; c < cols; ++c) {
    const std::uint16_t a = row[c] & 0x7fffu;
    m = a > m ? a : m;
  }
  return m > 0x7f80u ? plain_amax(row, cols) : to_float(m);
}

// Half: |x| orders as the 15 low bits too (NaN above 0x7c00).
__attribute__((always_inline)) inline float row_amax(const Half* row, std::int64_t cols) {
  std::uint16_t m = 0;
  for (std::int64_t c = 0; c < cols; ++c) {
    const std::uint16_t a = row[c].bits & 0x7fffu;
    m = a > m ? a : m;
  }
  return m > 0x7c00u ? plain_amax(row, cols) : to_float(Half{m});
}

__attribute__((always_inline)) inline float row_amax(const float* row, std::int64_t cols) {
  std::uint32_t m = 0;
  for (std::int64_t c = 0; c < cols; ++c) {
    std::uint32_t a;
    std::memcpy(&a, row + c, sizeof a);
    a &= 0x7fffffffu;
    m = a > m ? a : m;
  }
  if (m > 0x7f800000u) return plain_amax(row, cols);
  float f;
  std::memcpy(&f, &m, sizeof f);
  return f;
}

template <typename T>
__attribute__((always_inline)) inline void quantize(const T* w, std::int64_t rows,
                                                    std::int64_t cols, std::int64_t row_stride,
                                                    std::int8_t* q, float* scale) {
  // |w / s| <= 127 (+ rounding), far below 2^22, so adding and subtracting
  // 1.5 * 2^23 rounds to the nearest integer, ties to even, exactly as nearbyint
  // does in the default rounding mode; unlike a libm call it vectorizes. The
  // division stays a division (no reciprocal): the bytes must match the formula.
  constexpr float kRound = 12582912.0f;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = w + r * row_stride;
    const float amax = row_amax(row, cols);
    const float s = amax == 0.0f ? 1.0f : amax / 127.0f;
    scale[r] = s;
    std::int8_t* out = q + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float v = (to_float(row[c]) / s + kRound) - kRound;
      out[c] = static_cast<std::int8_t>(std::min(127.0f, std::max(-127.0f, v)));
    }
  }
}

static_assert(sizeof(Half) == sizeof(std::uint16_t));

// The three kernels compiled for one instruction-set level.
#define TPRELOAD_QUANTIZE_AT(name, level)                                                          \
  struct name {                                                                                    \
    TPRELOAD_QUANTIZE_KERNEL(level)                                                                \
    static void bf16(const std::uint16_t* w, std::int64_t rows, std::int64_t cols,                 \
                     std::int64_t row_stride, std::int8_t* q, float* scale) {                      \
      quantize(w, rows, cols, row_stride, q, scale);                                               \
    }                                                                                              \
    TPRELOAD_QUANTIZE_KERNEL(level)                                                                \
    static void f16(const std::uint16_t* w, std::int64_t rows, std::int64_t cols,                  \
                    std::int64_t row_stride, std::int8_t* q, float* scale) {                       \
      quantize(reinterpret_cast<const Half*>(w), rows, cols, row_stride, q, scale);                \
    }                                                                                              \
    TPRELOAD_QUANTIZE_KERNEL(level)                                                                \
    static void f32(const float* w, std::int64_t rows, std::int64_t cols, std::int64_t row_stride, \
                    std::int8_t* q, float* scale) {                                                \
      quantize(w, rows, cols, row_stride, q, scale);                                               \
    }                                                                                              \
  };

#if defined(TPRELOAD_QUANTIZE_LEVELS)
TPRELOAD_QUANTIZE_AT(Avx512, "arch=x86-64-v4")
TPRELOAD_QUANTIZE_AT(Avx2, "arch=x86-64-v3")
TPRELOAD_QUANTIZE_AT(Baseline, "arch=x86-64")
#else
TPRELOAD_QUANTIZE_AT(Baseline, "")
#endif

struct Kernels {
  decltype(&Baseline::bf16) bf16;
  decltype(&Baseline::f16) f16;
  decltype(&Baseline::f32) f32;
};

template <typename Level>
constexpr Kernels kernels_of() {
  return {&Level::bf16, &Level::f16, &Level::f32};
}

// By QuantizeLevel.
#if defined(TPRELOAD_QUANTIZE_LEVELS)
constexpr Kernels kKernels[] = {kernels_of<Baseline>(), kernels_of<Avx2>(), kernels_of<Avx512>()};
#else
constexpr Kernels kKernels[] = {kernels_of<Baseline>(), kernels_of<Baseline>(),
                                kernels_of<Baseline>()};
#endif

QuantizeLevel best_level() {
#if defined(TPRELOAD_QUANTIZE_LEVELS)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return QuantizeLevel::kAvx512;
  if (__builtin_cpu_supports("x86-64-v3")) return QuantizeLevel::kAvx2;
#endif
  return QuantizeLevel::kBaseline;
}

// The level a ScopedQuantizeLevel asks for, or -1.
std::atomic<int> asked{-1};

const Kernels& kernels() {
  return kKernels[static_cast<int>(detail::quantize_level_in_use())];
}

}  // namespace

QuantizeLevel quantize_level() {
  static const QuantizeLevel level = best_level();
  return level;
}

const char* quantize_level_name(QuantizeLevel level) {
  switch (level) {
    case QuantizeLevel::kAvx512:
      return "avx512";
    case QuantizeLevel::kAvx2:
      return "avx2";
    default:
      return "baseline";
  }
}

bool quantize_supports(QuantizeLevel level) {
  return level <= quantize_level();
}

void quantize_rows_bf16(const std::uint16_t* w, std::int64_t rows, std::int64_t cols,
                        std::int64_t row_stride, std::int8_t* q, float* scale) {
  kernels().bf16(w, rows, cols, row_stride, q, scale);
}

void quantize_rows_f16(const std::uint16_t* w, std::int64_t rows, std::int64_t cols,
                       std::int64_t row_stride, std::int8_t* q, float* scale) {
  kernels().f16(w, rows, cols, row_stride, q, scale);
}

void quantize_rows_f32(const float* w, std::int64_t rows, std::int64_t cols,
                       std::int64_t row_stride, std::int8_t* q, float* scale) {
  kernels().f32(w, rows, cols, row_stride, q, scale);
}

namespace detail {
ScopedQuantizeLevel::ScopedQuantizeLevel(QuantizeLevel level)
    : before_(asked.load(std::memory_order_relaxed)) {
  if (!quantize_supports(level))
    raise<UsageError>("the int8 kernels cannot run at the ", quantize_level_name(level),
                      " level on this CPU (it has ", quantize_level_name(quantize_level()), ")");
  asked.store(static_cast<int>(level), std::memory_order_relaxed);
}

ScopedQuantizeLevel::~ScopedQuantizeLevel() {
  asked.store(before_, std::memory_order_relaxed);
}

QuantizeLevel quantize_level_in_use() {
  const int level = asked.load(std::memory_order_relaxed);
  return level >= 0 ? static_cast<QuantizeLevel>(level) : quantize_level();
}
}  // namespace detail

}  // namespace tpreload
