// The host's online FP8 kernels (quantize.h: quantize_fp8_host,
// quantize_fp8_blocks_host) at each instruction-set level of the int8 kernels:
// the baseline is tpreload/core/float8.h's scalar code (the CUDA kernels' too);
// AVX2 and AVX-512 compute the same bytes 8 and 16 values at a time (amaxes of
// 16-bit values 16 and 32 at a time). Compiled for
// baseline x86-64 whatever the build's -march (CMakeLists.txt), the wider
// levels by target attributes, so that nothing here needs more than the CPU has.
#include "tpreload/core/error.h"
#include "tpreload/core/float8.h"
#include "tpreload/model/quantize.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define TPRELOAD_FP8_LEVELS 1
#include <immintrin.h>
#define TPRELOAD_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TPRELOAD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#endif

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace tpreload {
namespace {

// ---- the baseline: float8.h's scalar code ----

template <typename T>
float amax_baseline(const T* x, std::uint64_t n) {
  return fp8::amax_of(x, n);
}

template <typename T>
void encode_baseline(const T* x, std::uint64_t n, float amax, std::uint8_t* codes, float* scale) {
  fp8::quantize_with_amax(x, n, amax, codes, scale);
}

template <typename T>
void blocks_baseline(const T* x, std::int64_t rows, std::int64_t cols, std::int64_t block,
                     std::uint8_t* codes, float* grid) {
  fp8::quantize_block_step(x, rows, cols, block, codes, grid);
}

#if defined(TPRELOAD_FP8_LEVELS)

// (GCC 12's intrinsics start some results from _mm512_undefined_*(), which
// -Wuninitialized reports where they inline into a target-attributed function.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The encoder of fp8::to_e4m3fn (`torch_nan`: of fp8::cast_e4m3fn) on 16 or 8
// lanes, rounded by the float adder rather than in the bits. |x| is clamped to
// 448 (a NaN to 448 by the min, as fminf does; with `torch_nan` the NaN code
// 0x7F later). Let ec be the exponent of max(|x|, 2^-6): the codes of |x|'s
// binade (or of the subnormals, ec = -6) are 2^(ec-3) apart. The float
//   M = 2^(ec+20) + (ec+6) * 2^ec
// has ulp 2^(ec-3), its low 23 bits are 8 * (ec+6) and its parity is even, so
// |x| + M, rounded to nearest even by the adder, is M plus |x| in code steps
// rounded to nearest even (the sum stays in M's binade: |x| < 2^(ec+1)); its
// low byte is 8 * (ec+6) + that count: the code of |x| (a normal's exponent
// field ec+7 times 8 plus its mantissa, which a carry moves up; a subnormal's
// count itself). M by ec: the 15 possible ones in a table (AVX-512) or
// computed from the exponent bits (AVX2). The sign: of a value that is not NaN.

// M's bits for the exponent bits e (max(|x|, 2^-6) & 0x7F800000):
// e + (20 << 23) + 8 * (ec + 6), with 8 * (ec + 6) = (e >> 20) - 968.
constexpr std::uint32_t kMagicPlus = (20u << 23) - 968u;

// M for the biased exponents 121..135 (2^-6 to 2^8), indexed by the exponent's
// low 4 bits (distinct over the 15).
struct MagicTable {
  alignas(64) std::uint32_t m[16] = {};
  constexpr MagicTable() {
    for (std::uint32_t e = 121; e <= 135; ++e) m[e & 15] = (e << 23) + kMagicPlus + (e << 3);
  }
};
constexpr MagicTable kMagic;

TPRELOAD_AVX512 inline __m128i encode16(__m512 v, bool torch_nan) {
  const __m512 a = _mm512_min_ps(_mm512_abs_ps(v), _mm512_set1_ps(448.0f));
  // (negative finite, negative infinity, -0: not a NaN of either sign)
  const __mmask16 negative = _mm512_fpclass_ps_mask(v, 0x54);
  const __m512i exponent = _mm512_srli_epi32(
      _mm512_max_epu32(_mm512_castps_si512(a), _mm512_set1_epi32(0x3C800000)), 23);
  const __m512i magic = _mm512_permutexvar_epi32(exponent, _mm512_load_si512(kMagic.m));
  __m512i code = _mm512_castps_si512(_mm512_add_ps(a, _mm512_castsi512_ps(magic)));
  code = _mm512_mask_or_epi32(code, negative, code, _mm512_set1_epi32(0x80));
  if (torch_nan)
    code = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), code,
                                   _mm512_set1_epi32(0x7F));
  return _mm512_cvtepi32_epi8(code);  // (the low byte)
}

TPRELOAD_AVX2 inline void encode8(__m256 v, bool torch_nan, std::uint8_t* out) {
  // (_mm256_min_ps(v, 448): a NaN v gives 448, the second operand)
  const __m256 c = _mm256_max_ps(_mm256_min_ps(v, _mm256_set1_ps(448.0f)), _mm256_set1_ps(-448.0f));
  const __m256i u = _mm256_castps_si256(c);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
  const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i e = _mm256_and_si256(_mm256_max_epu32(a, _mm256_set1_epi32(0x3C800000)),
                                     _mm256_set1_epi32(0x7F800000));
  const __m256i magic = _mm256_add_epi32(_mm256_add_epi32(e, _mm256_srli_epi32(e, 20)),
                                         _mm256_set1_epi32(static_cast<std::int32_t>(kMagicPlus)));
  __m256i code = _mm256_and_si256(
      _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(magic))),
      _mm256_set1_epi32(0x7F));
  code = _mm256_or_si256(code, sign);
  if (torch_nan) {
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7F), nan);
  }
  const __m256i p16 = _mm256_packus_epi32(code, code);  // (per 128-bit lane)
  const __m256i p8 = _mm256_packus_epi16(p16, p16);
  const std::int32_t lo = _mm_cvtsi128_si32(_mm256_castsi256_si128(p8));
  const std::int32_t hi = _mm_cvtsi128_si32(_mm256_extracti128_si256(p8, 1));
  std::memcpy(out, &lo, 4);
  std::memcpy(out + 4, &hi, 4);
}

// 16 or 8 staged values as floats: float32 loaded, bfloat16 moved up a half,
// float16 converted (exactly) by the instruction.
TPRELOAD_AVX512 inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
TPRELOAD_AVX512 inline __m512 load16(const fp8::Bf16Bits* p) {
  const __m512i wide =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
TPRELOAD_AVX512 inline __m512 load16(const fp8::HalfBits* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
TPRELOAD_AVX2 inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
TPRELOAD_AVX2 inline __m256 load8(const fp8::Bf16Bits* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
TPRELOAD_AVX2 inline __m256 load8(const fp8::HalfBits* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The magnitude bits of a float32, bfloat16 or float16 value (non-negative
// values order as their bits, a NaN above every number, in either width), and
// the value of the largest.
inline std::uint32_t magnitude_bits(float v) {
  return fbits::bits_of(v) & 0x7FFFFFFFu;
}
template <typename T>
std::uint32_t magnitude_bits(T v) {
  return v.bits & 0x7FFFu;
}
inline float of_magnitude_bits(std::uint32_t b, const float*) {
  return fbits::float_of(b);
}
template <typename T>
float of_magnitude_bits(std::uint32_t b, const T*) {
  return fp8::as_float(T{static_cast<std::uint16_t>(b)});
}
// A 16-bit type's infinity: the magnitudes above it are NaNs.
constexpr std::uint16_t infinity_bits(const fp8::Bf16Bits*) {
  return 0x7F80;
}
constexpr std::uint16_t infinity_bits(const fp8::HalfBits*) {
  return 0x7C00;
}

// fp8::amax_of of bfloat16 or float16 values in their own width, 32 or 16 at
// a time: the largest magnitude pattern that is not a NaN's.
template <typename T>
TPRELOAD_AVX512 float amax16_avx512(const T* x, std::uint64_t n) {
  const __m512i abs_mask = _mm512_set1_epi16(0x7FFF), inf = _mm512_set1_epi16(infinity_bits(x));
  __m512i m = _mm512_setzero_si512();
  std::uint64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i v = _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask);
    m = _mm512_mask_max_epu16(m, _mm512_cmple_epu16_mask(v, inf), m, v);
  }
  alignas(64) T lanes[32];
  _mm512_store_si512(lanes, m);
  std::uint32_t top = 0;
  for (const T l : lanes) top = std::max(top, magnitude_bits(l));
  const float amax = of_magnitude_bits(top, x), tail = fp8::amax_of(x + i, n - i);
  return tail > amax ? tail : amax;
}

template <typename T>
TPRELOAD_AVX2 float amax16_avx2(const T* x, std::uint64_t n) {
  const __m256i abs_mask = _mm256_set1_epi16(0x7FFF), inf = _mm256_set1_epi16(infinity_bits(x));
  __m256i m = _mm256_setzero_si256();
  std::uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs_mask);
    // (magnitudes are below 0x8000: the signed compare orders them)
    m = _mm256_max_epu16(m, _mm256_andnot_si256(_mm256_cmpgt_epi16(v, inf), v));
  }
  alignas(32) T lanes[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m);
  std::uint32_t top = 0;
  for (const T l : lanes) top = std::max(top, magnitude_bits(l));
  const float amax = of_magnitude_bits(top, x), tail = fp8::amax_of(x + i, n - i);
  return tail > amax ? tail : amax;
}

// fp8::amax_of: of float32 values by the float max, whose NaN operand is
// ignored when it comes first (_mm*_max_ps returns the second operand then);
// of 16-bit values by amax16_*; fp8::quantize_with_amax.

template <typename T>
TPRELOAD_AVX512 float amax_avx512(const T* x, std::uint64_t n) {
  if constexpr (sizeof(T) == 2) return amax16_avx512(x, n);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  __m512 m0 = _mm512_setzero_ps(), m1 = m0;
  std::uint64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm512_max_ps(_mm512_and_ps(load16(x + i), abs_mask), m0);
    m1 = _mm512_max_ps(_mm512_and_ps(load16(x + i + 16), abs_mask), m1);
  }
  float amax = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
  const float tail = fp8::amax_of(x + i, n - i);
  return tail > amax ? tail : amax;
}

template <typename T>
TPRELOAD_AVX512 void encode_avx512(const T* x, std::uint64_t n, float amax, std::uint8_t* codes,
                                   float* scale) {
  const float inverse = 1.0f / fp8::amax_scale(amax);
  const __m512 inv = _mm512_set1_ps(inverse);
  std::uint64_t k = 0;
  for (; k + 16 <= n; k += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + k),
                     encode16(_mm512_mul_ps(load16(x + k), inv), false));
  fp8::quantize_with_amax(x + k, n - k, amax, codes + k, scale);  // (the tail; the scale)
}

template <typename T>
TPRELOAD_AVX2 float amax_avx2(const T* x, std::uint64_t n) {
  if constexpr (sizeof(T) == 2) return amax16_avx2(x, n);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 m0 = _mm256_setzero_ps(), m1 = m0;
  std::uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(_mm256_and_ps(load8(x + i), abs_mask), m0);
    m1 = _mm256_max_ps(_mm256_and_ps(load8(x + i + 8), abs_mask), m1);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  float amax = 0;
  for (const float l : lanes) amax = l > amax ? l : amax;
  const float tail = fp8::amax_of(x + i, n - i);
  return tail > amax ? tail : amax;
}

template <typename T>
TPRELOAD_AVX2 void encode_avx2(const T* x, std::uint64_t n, float amax, std::uint8_t* codes,
                               float* scale) {
  const float inverse = 1.0f / fp8::amax_scale(amax);
  const __m256 inv = _mm256_set1_ps(inverse);
  std::uint64_t k = 0;
  for (; k + 8 <= n; k += 8) encode8(_mm256_mul_ps(load8(x + k), inv), false, codes + k);
  fp8::quantize_with_amax(x + k, n - k, amax, codes + k, scale);  // (the tail; the scale)
}

// fp8::quantize_block_step, a tile at a time: the tile's amax as the largest
// |x| bit pattern in the staged type's own width (non-negative floats, float32,
// bfloat16 or float16, order as their bits; a NaN's pattern is above every
// number's, so a NaN is the amax, as fp8::nan_max makes it), then its codes. A
// row of the tile in whole vectors, its last columns one by one.

template <typename T>
TPRELOAD_AVX512 float tile_amax_avx512(const T* x, std::int64_t h, std::int64_t w,
                                       std::int64_t pitch) {
  constexpr bool k16 = sizeof(T) == 2;
  constexpr std::int64_t kLanes = 64 / sizeof(T);
  const __m512i abs_mask = k16 ? _mm512_set1_epi16(0x7FFF) : _mm512_set1_epi32(0x7FFFFFFF);
  __m512i m = _mm512_setzero_si512();
  std::uint32_t top = 0;
  const std::int64_t whole = w / kLanes * kLanes;
  for (std::int64_t r = 0; r < h; ++r) {
    const T* row = x + r * pitch;
    for (std::int64_t c = 0; c < whole; c += kLanes) {
      const __m512i v = _mm512_and_si512(_mm512_loadu_si512(row + c), abs_mask);
      m = k16 ? _mm512_max_epu16(m, v) : _mm512_max_epu32(m, v);
    }
    for (std::int64_t c = whole; c < w; ++c) top = std::max(top, magnitude_bits(row[c]));
  }
  alignas(64) T lanes[kLanes];
  _mm512_store_si512(lanes, m);
  for (const T l : lanes) top = std::max(top, magnitude_bits(l));
  return of_magnitude_bits(top, x);
}

template <typename T>
TPRELOAD_AVX2 float tile_amax_avx2(const T* x, std::int64_t h, std::int64_t w, std::int64_t pitch) {
  constexpr bool k16 = sizeof(T) == 2;
  constexpr std::int64_t kLanes = 32 / sizeof(T);
  const __m256i abs_mask = k16 ? _mm256_set1_epi16(0x7FFF) : _mm256_set1_epi32(0x7FFFFFFF);
  __m256i m = _mm256_setzero_si256();
  std::uint32_t top = 0;
  const std::int64_t whole = w / kLanes * kLanes;
  for (std::int64_t r = 0; r < h; ++r) {
    const T* row = x + r * pitch;
    for (std::int64_t c = 0; c < whole; c += kLanes) {
      const __m256i v =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c)), abs_mask);
      m = k16 ? _mm256_max_epu16(m, v) : _mm256_max_epu32(m, v);
    }
    for (std::int64_t c = whole; c < w; ++c) top = std::max(top, magnitude_bits(row[c]));
  }
  alignas(32) T lanes[kLanes];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m);
  for (const T l : lanes) top = std::max(top, magnitude_bits(l));
  return of_magnitude_bits(top, x);
}

template <typename T>
TPRELOAD_AVX512 float tile_avx512(const T* x, std::int64_t h, std::int64_t w, std::int64_t pitch,
                                  std::uint8_t* codes) {
  const float s = fp8::block_scale(tile_amax_avx512(x, h, w, pitch)), inverse = 1.0f / s;
  const __m512 inv = _mm512_set1_ps(inverse);
  const std::int64_t whole = w / 16 * 16;
  for (std::int64_t r = 0; r < h; ++r) {
    const T* row = x + r * pitch;
    std::uint8_t* out = codes + r * pitch;
    for (std::int64_t c = 0; c < whole; c += 16)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c),
                       encode16(_mm512_mul_ps(load16(row + c), inv), true));
    for (std::int64_t c = whole; c < w; ++c)
      out[c] = fp8::cast_e4m3fn(fp8::as_float(row[c]) * inverse);
  }
  return s;
}

template <typename T>
TPRELOAD_AVX2 float tile_avx2(const T* x, std::int64_t h, std::int64_t w, std::int64_t pitch,
                              std::uint8_t* codes) {
  const float s = fp8::block_scale(tile_amax_avx2(x, h, w, pitch)), inverse = 1.0f / s;
  const __m256 inv = _mm256_set1_ps(inverse);
  const std::int64_t whole = w / 8 * 8;
  for (std::int64_t r = 0; r < h; ++r) {
    const T* row = x + r * pitch;
    std::uint8_t* out = codes + r * pitch;
    for (std::int64_t c = 0; c < whole; c += 8)
      encode8(_mm256_mul_ps(load8(row + c), inv), true, out + c);
    for (std::int64_t c = whole; c < w; ++c)
      out[c] = fp8::cast_e4m3fn(fp8::as_float(row[c]) * inverse);
  }
  return s;
}

template <typename T,
          float (*kTile)(const T*, std::int64_t, std::int64_t, std::int64_t, std::uint8_t*)>
void blocks_by_tile(const T* x, std::int64_t rows, std::int64_t cols, std::int64_t block,
                    std::uint8_t* codes, float* grid) {
  fp8::each_block(x, rows, cols, block, codes, grid, kTile);
}

#pragma GCC diagnostic pop

#endif  // TPRELOAD_FP8_LEVELS

// One level's kernels for staged values of type T.
template <typename T>
struct Fp8Kernels {
  float (*amax)(const T*, std::uint64_t);
  void (*encode)(const T*, std::uint64_t, float, std::uint8_t*, float*);
  void (*blocks)(const T*, std::int64_t, std::int64_t, std::int64_t, std::uint8_t*, float*);
};

// By QuantizeLevel.
template <typename T>
const Fp8Kernels<T>& fp8_kernels() {
#if defined(TPRELOAD_FP8_LEVELS)
  static constexpr Fp8Kernels<T> kLevels[] = {
      {&amax_baseline<T>, &encode_baseline<T>, &blocks_baseline<T>},
      {&amax_avx2<T>, &encode_avx2<T>, &blocks_by_tile<T, tile_avx2<T>>},
      {&amax_avx512<T>, &encode_avx512<T>, &blocks_by_tile<T, tile_avx512<T>>}};
#else
  static constexpr Fp8Kernels<T> kBaseline = {&amax_baseline<T>, &encode_baseline<T>,
                                              &blocks_baseline<T>};
  static constexpr Fp8Kernels<T> kLevels[] = {kBaseline, kBaseline, kBaseline};
#endif
  return kLevels[static_cast<int>(detail::quantize_level_in_use())];
}

// `f` called with x as the staged type of `dtype`.
template <typename F>
void with_staged(const void* x, DType dtype, F f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(static_cast<const float*>(x));
    case DType::kBFloat16:
      return f(static_cast<const fp8::Bf16Bits*>(x));
    case DType::kFloat16:
      return f(static_cast<const fp8::HalfBits*>(x));
    default:
      raise<ModelError>("online FP8 of staged ", dtype_name(dtype),
                        " values (float32, bfloat16 or float16 only)");
  }
}

}  // namespace

float fp8_amax_host(const void* x, DType dtype, std::uint64_t n) {
  float amax = 0;
  with_staged(x, dtype, [&](const auto* v) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(v)>>;
    amax = fp8_kernels<T>().amax(v, n);
  });
  return amax;
}

void quantize_fp8_with_amax_host(const void* x, DType dtype, std::uint64_t n, float amax,
                                 std::uint8_t* codes, float* scale) {
  with_staged(x, dtype, [&](const auto* v) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(v)>>;
    fp8_kernels<T>().encode(v, n, amax, codes, scale);
  });
}

void quantize_fp8_host(const void* x, DType dtype, std::uint64_t n, std::uint8_t* codes,
                       float* scale) {
  quantize_fp8_with_amax_host(x, dtype, n, fp8_amax_host(x, dtype, n), codes, scale);
}

void quantize_fp8_blocks_host(const void* x, DType dtype, std::int64_t rows, std::int64_t cols,
                              std::int64_t block, std::uint8_t* codes, float* grid) {
  with_staged(x, dtype, [&](const auto* v) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(v)>>;
    fp8_kernels<T>().blocks(v, rows, cols, block, codes, grid);
  });
}

}  // namespace tpreload
