// The two FP8 formats of checkpoints and kernels, by their bit patterns, as
// plain inline functions that compile for the host and, in .cu files, for the
// device (as float_bits.h), so that the CPU and the GPU give the same bytes.
//
//   e4m3fn (F8_E4M3, torch.float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa
//     bits; no infinities; 0x7F and 0xFF are NaN; largest finite 448 (0x7E);
//     smallest subnormal 2^-9.
//   e5m2 (F8_E5M2, torch.float8_e5m2): 1 sign, 5 exponent (bias 15), 2 mantissa
//     bits, IEEE-like: 0x7C infinity, 0x7D-0x7F NaN; largest finite 57344 (0x7B);
//     smallest subnormal 2^-16.
//
// Encoding is vLLM's quantization step: the value is clamped to the largest
// finite magnitude first, as fmaxf(-max, fminf(x, max)) clamps it (so a NaN
// becomes +max, as fminf/fmaxf return the number of a NaN/number pair, and an
// infinity its signed max), then rounded to the nearest code, ties to the even
// code (mantissa's last bit 0), through the subnormals; a magnitude at most half
// the smallest subnormal becomes a zero of its sign. Decoding is exact.
#pragma once

#include <cstdint>

#include "tpreload/core/float_bits.h"

namespace tpreload::fp8 {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;

namespace detail {

// Clamped as vLLM's kernels clamp: NaN -> +max.
TPRELOAD_HOST_DEVICE inline float clamp(float x, float max) {
  const float lo = x < max ? x : max;  // fminf(x, max): NaN -> max
  const bool nan = !(x == x);
  const float c = nan ? max : lo;
  return c > -max ? c : -max;  // fmaxf(-max, c)
}

// `x` (finite, |x| <= the format's max) as a code of kMan mantissa bits and
// exponent bias kBias: round to nearest, ties to even.
template <int kMan, int kBias>
TPRELOAD_HOST_DEVICE inline std::uint8_t encode(float x) {
  const std::uint32_t u = fbits::bits_of(x);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  const int exp = static_cast<int>(a >> 23) - 127;  // unbiased (-127: zero or subnormal float)
  std::uint32_t code;
  if (exp >= 1 - kBias) {  // a normal of the format: keep kMan of float's 23 mantissa bits
    const int drop = 23 - kMan;
    code = (static_cast<std::uint32_t>(exp + kBias) << kMan) | ((a & 0x7FFFFFu) >> drop);
    const std::uint32_t rest = a & ((1u << drop) - 1), half = 1u << (drop - 1);
    // (without a branch: random data would mispredict it half the time; a carry
    // moves up the exponent)
    code += static_cast<std::uint32_t>(rest > half) |
            (static_cast<std::uint32_t>(rest == half) & (code & 1u));
  } else {  // a subnormal of the format: |x| in units of its smallest subnormal
    // 2^(1 - kBias - kMan) is the unit; x / unit is exact (a power-of-two scale)
    // and below 2^kMan, so float's own round-to-nearest-even integer is the code.
    const float units = fbits::float_of(a) *
                        fbits::float_of(static_cast<std::uint32_t>(127 - (1 - kBias - kMan)) << 23);
    const float big = 8388608.0f;  // 2^23: adding it rounds to an integer, ties to even
    code = static_cast<std::uint32_t>((units + big) - big);
  }
  return static_cast<std::uint8_t>(sign | code);
}

template <int kMan, int kBias>
TPRELOAD_HOST_DEVICE inline float decode_finite(std::uint8_t c) {
  const std::uint32_t sign = static_cast<std::uint32_t>(c & 0x80u) << 24;
  const std::uint32_t e = (c & 0x7Fu) >> kMan, m = c & ((1u << kMan) - 1);
  if (e == 0) {  // subnormal: m units of 2^(1 - kBias - kMan)
    const float unit = fbits::float_of(static_cast<std::uint32_t>(127 + 1 - kBias - kMan) << 23);
    return fbits::float_of(sign | fbits::bits_of(static_cast<float>(m) * unit));
  }
  return fbits::float_of(sign | ((e - kBias + 127) << 23) | (m << (23 - kMan)));
}

}  // namespace detail

// (The same rounding as detail::encode<3, 7>, written without branches so that
// a loop over many values vectorizes: a normal keeps 3 of float's 23 mantissa
// bits, rounded by adding 0x7FFFF plus the kept last bit (a carry moves up the
// exponent), and rebased from float's exponent bias 127 to 7; a subnormal
// (below 2^-6) is its value in units of 2^-9, rounded by float's own
// round-to-nearest-even integer.)
TPRELOAD_HOST_DEVICE inline std::uint8_t to_e4m3fn(float x) {
  const float c = detail::clamp(x, kE4M3Max);
  const std::uint32_t u = fbits::bits_of(c);
  const std::uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
  const std::uint32_t normal = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  const float units = fbits::float_of(a) * 512.0f;  // (2^9, exact)
  const auto subnormal = static_cast<std::uint32_t>((units + 8388608.0f) - 8388608.0f);
  return static_cast<std::uint8_t>(sign | (a < 0x3C800000u ? subnormal : normal));  // (2^-6)
}

TPRELOAD_HOST_DEVICE inline float from_e4m3fn(std::uint8_t c) {
  if ((c & 0x7Fu) == 0x7Fu)
    return fbits::float_of(0x7FC00000u | (static_cast<std::uint32_t>(c & 0x80u) << 24));
  return detail::decode_finite<3, 7>(c);
}

TPRELOAD_HOST_DEVICE inline std::uint8_t to_e5m2(float x) {
  return detail::encode<2, 15>(detail::clamp(x, kE5M2Max));
}

TPRELOAD_HOST_DEVICE inline float from_e5m2(std::uint8_t c) {
  const std::uint32_t sign = static_cast<std::uint32_t>(c & 0x80u) << 24;
  if ((c & 0x7Fu) == 0x7Cu) return fbits::float_of(sign | 0x7F800000u);
  if ((c & 0x7Fu) > 0x7Cu) return fbits::float_of(sign | 0x7FC00000u);
  return detail::decode_finite<2, 15>(c);
}

// vLLM's requantize_with_max_scale for one e4m3fn code of a per-tensor FP8
// weight: per_tensor_dequantize (the code as float16 times its scale, which
// PyTorch evaluates in float16: the 0-dim float32 scale rounded to float16, the
// product rounded to float16), then scaled_fp8_quant with the new scale
// (the float16 value times `inverse`, 1.0f / that scale in float, clamped, rounded
// to nearest even). `scale_half` is the old scale already rounded to float16.
TPRELOAD_HOST_DEVICE inline std::uint8_t requantize_e4m3fn(std::uint8_t c, float scale_half,
                                                           float inverse) {
  const float dq = fbits::from_half(fbits::to_half(from_e4m3fn(c) * scale_half));
  return to_e4m3fn(dq * inverse);
}

// The largest of n >= 1 scales, as torch's max(): a NaN among them is the result.
TPRELOAD_HOST_DEVICE inline float largest(const float* s, std::uint32_t n) {
  float m = s[0];
  for (std::uint32_t i = 1; i < n; ++i)
    if (s[i] != s[i] || (m == m && s[i] > m)) m = s[i];
  return m;
}

// One processing step of a per-tensor FP8 layer (ScaleStep in sharding.h): the
// largest of staged[first, first + count) into *out (when out is not null) and
// the n codes at w requantized from staged[from] to it.
TPRELOAD_HOST_DEVICE inline void requantize_step(std::uint8_t* w, std::uint64_t n,
                                                 const float* staged, std::uint32_t from,
                                                 std::uint32_t first, std::uint32_t count,
                                                 float* out) {
  const float m = largest(staged + first, count);
  if (out) *out = m;
  const float scale_half = fbits::from_half(fbits::to_half(staged[from])), inverse = 1.0f / m;
  // (a code's new code depends on the code alone: a table of the 256, then a
  // lookup per byte)
  std::uint8_t table[256];
  for (int c = 0; c < 256; ++c)
    table[c] = requantize_e4m3fn(static_cast<std::uint8_t>(c), scale_half, inverse);
  for (std::uint64_t i = 0; i < n; ++i) w[i] = table[w[i]];
}

// vLLM's dynamic per-tensor FP8 quantization (scaled_fp8_quant without a
// scale) of n values: the scale is amax / 448 (NaNs ignored, as fmaxf ignores
// them; an all-zero input gives 0, and then every code +448, as vLLM's does),
// each value times 1.0f / scale, clamped and rounded to nearest even.
TPRELOAD_HOST_DEVICE inline float amax_scale(float amax) {
  return amax / kE4M3Max;
}
// Online FP8 stages a weight in the model's dtype: float32 values, or bfloat16
// and float16 bit patterns (read exactly as floats).
struct Bf16Bits {
  std::uint16_t bits;
};
struct HalfBits {
  std::uint16_t bits;
};
TPRELOAD_HOST_DEVICE inline float as_float(float v) {
  return v;
}
TPRELOAD_HOST_DEVICE inline float as_float(Bf16Bits v) {
  return fbits::from_bfloat16(v.bits);
}
TPRELOAD_HOST_DEVICE inline float as_float(HalfBits v) {
  return fbits::from_half(v.bits);
}

// The largest |x| of n values, NaNs ignored.
template <typename T>
TPRELOAD_HOST_DEVICE inline float amax_of(const T* x, std::uint64_t n) {
  // (eight running maxima, so that the compares do not wait on each other; a
  // NaN compares false: ignored)
  float m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::uint64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const float v = as_float(x[i + j]), a = v < 0 ? -v : v;
      m[j] = a > m[j] ? a : m[j];
    }
  for (; i < n; ++i) {
    const float v = as_float(x[i]), a = v < 0 ? -v : v;
    m[0] = a > m[0] ? a : m[0];
  }
  float amax = m[0];
  for (int j = 1; j < 8; ++j) amax = m[j] > amax ? m[j] : amax;
  return amax;
}

// quantize_step with the amax already known (the largest of the amaxes of the
// values' parts, which is theirs).
template <typename T>
TPRELOAD_HOST_DEVICE inline void quantize_with_amax(const T* x, std::uint64_t n, float amax,
                                                    std::uint8_t* codes, float* scale) {
  const float s = amax_scale(amax), inverse = 1.0f / s;
  *scale = s;
  for (std::uint64_t k = 0; k < n; ++k) codes[k] = to_e4m3fn(as_float(x[k]) * inverse);
}

template <typename T>
TPRELOAD_HOST_DEVICE inline void quantize_step(const T* x, std::uint64_t n, std::uint8_t* codes,
                                               float* scale) {
  quantize_with_amax(x, n, amax_of(x, n), codes, scale);
}

// vLLM's online per-block FP8 (per_block_cast_to_fp8 of vllm/utils/deep_gemm.py
// as PyTorch evaluates it on CUDA) of one block of a rank's fused weight: the
// block's amax over |x| (a NaN among the values is the amax, as torch.amax
// propagates it; the zero padding of a partial block changes nothing), at
// least 1e-4 (clamp), times the float reciprocal of 448 (PyTorch multiplies a
// CUDA tensor divided by a number by the number's reciprocal): that is the
// scale; each value times 1.0f / scale, cast as PyTorch casts it (cast_e4m3fn).
// The larger of two magnitudes (sign bits clear) by their bit patterns: the
// numbers' order, and a NaN above every number (of two NaNs, the larger
// pattern), the same however a reduction is ordered.
TPRELOAD_HOST_DEVICE inline float nan_max(float a, float b) {
  return fbits::bits_of(a) > fbits::bits_of(b) ? a : b;
}
TPRELOAD_HOST_DEVICE inline float magnitude(float x) {
  return fbits::float_of(fbits::bits_of(x) & 0x7FFFFFFFu);
}
// (A NaN amax gives the NaN a GPU's arithmetic gives, the canonical
// 0x7FFFFFFF, whatever the payload: vLLM runs this on CUDA.)
TPRELOAD_HOST_DEVICE inline float block_scale(float amax) {
  if (amax != amax) return fbits::float_of(0x7FFFFFFFu);
  const float a = amax < 1e-4f ? 1e-4f : amax;
  return a * (1.0f / kE4M3Max);
}

// PyTorch's cast to float8_e4m3fn (c10::Float8_e4m3fn) of a product computed on
// a GPU, for values that are NaN or within +-448 and a rounding: a NaN is the
// NaN code 0x7F (the GPU's NaN is the canonical, positive one; vLLM's own
// kernels clamp a NaN to 448 instead), the rest as to_e4m3fn.
TPRELOAD_HOST_DEVICE inline std::uint8_t cast_e4m3fn(float x) {
  if (x != x) return 0x7Fu;
  return to_e4m3fn(x);
}

// One block: rows x cols values at x (row r at x + r * pitch), codes likewise
// at `codes`; returns the scale.
template <typename T>
TPRELOAD_HOST_DEVICE inline float quantize_block(const T* x, std::int64_t rows, std::int64_t cols,
                                                 std::int64_t pitch, std::uint8_t* codes) {
  float m = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * pitch;
    for (std::int64_t c = 0; c < cols; ++c) m = nan_max(magnitude(as_float(row[c])), m);
  }
  const float s = block_scale(m), inverse = 1.0f / s;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      codes[r * pitch + c] = cast_e4m3fn(as_float(x[r * pitch + c]) * inverse);
  return s;
}

// The rows x cols values at x cut into block x block tiles from the first row
// and column (the last ones partial): tile(x, h, w, pitch, codes) quantizes one
// and returns its scale, stored in the row-major grid of ceil(rows / block) x
// ceil(cols / block).
template <typename T, typename Tile>
TPRELOAD_HOST_DEVICE inline void each_block(const T* x, std::int64_t rows, std::int64_t cols,
                                            std::int64_t block, std::uint8_t* codes, float* grid,
                                            Tile tile) {
  const std::int64_t grid_cols = (cols + block - 1) / block;
  for (std::int64_t r = 0; r < rows; r += block)
    for (std::int64_t c = 0; c < cols; c += block)
      grid[r / block * grid_cols + c / block] =
          tile(x + r * cols + c, rows - r < block ? rows - r : block,
               cols - c < block ? cols - c : block, cols, codes + r * cols + c);
}

// One online block-scaled FP8 step (ScaleStep::block in sharding.h): each tile
// by quantize_block.
template <typename T>
TPRELOAD_HOST_DEVICE inline void quantize_block_step(const T* x, std::int64_t rows,
                                                     std::int64_t cols, std::int64_t block,
                                                     std::uint8_t* codes, float* grid) {
  each_block(x, rows, cols, block, codes, grid, &quantize_block<T>);
}

}  // namespace tpreload::fp8
