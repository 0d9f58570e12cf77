// Per-row int8 quantization, the kernel behind the int8 processing of checkpoint
// weights. No torch here, so the kernels are tested and benchmarked alone.
//
// For each of `rows` rows of `cols` contiguous elements, row r starting at
// w + r * row_stride (row_stride >= cols; the output is contiguous):
//   scale[r] = max|w| / 127, or 1 when max|w| == 0 (NaNs are ignored in the max);
//   q[r][c]  = clamp(nearbyint(w / scale[r]), -127, 127), ties to even (as
//              at::round), a NaN becoming -127.
// The result is exact: the same bytes as that formula evaluated element by element
// in float, whatever the vector width the processor offers (each level below). The device kernel
// (DeviceStream::quantize_int8) computes the same bytes.
#pragma once

#include <cstdint>

#include "tpreload/core/dtype.h"

namespace tpreload {

// `w` holds bfloat16 bit patterns.
void quantize_rows_bf16(const std::uint16_t* w, std::int64_t rows, std::int64_t cols,
                        std::int64_t row_stride, std::int8_t* q, float* scale);
// `w` holds IEEE float16 bit patterns (converted to float exactly).
void quantize_rows_f16(const std::uint16_t* w, std::int64_t rows, std::int64_t cols,
                       std::int64_t row_stride, std::int8_t* q, float* scale);
void quantize_rows_f32(const float* w, std::int64_t rows, std::int64_t cols,
                       std::int64_t row_stride, std::int8_t* q, float* scale);

// The host's online FP8 kernels: fp8::quantize_step and fp8::quantize_block_step
// (tpreload/core/float8.h) of values staged as `dtype` (float32, bfloat16 or
// float16) at the level below, the same bytes at every level
// (src/model/quantization/fp8_kernels.cpp).
void quantize_fp8_host(const void* x, DType dtype, std::uint64_t n, std::uint8_t* codes,
                       float* scale);
// Its two halves: the amax of n values (fp8::amax_of, NaNs ignored), and the
// codes and scale from an amax (fp8::quantize_with_amax): the amax of a weight
// staged in parts is the largest of its parts' amaxes, taken as they land.
float fp8_amax_host(const void* x, DType dtype, std::uint64_t n);
void quantize_fp8_with_amax_host(const void* x, DType dtype, std::uint64_t n, float amax,
                                 std::uint8_t* codes, float* scale);
void quantize_fp8_blocks_host(const void* x, DType dtype, std::int64_t rows, std::int64_t cols,
                              std::int64_t block, std::uint8_t* codes, float* grid);

// The instruction-set level the kernels above are compiled for (x86-64 with
// GCC: x86-64-v4 with AVX-512, x86-64-v3 with AVX2, and the baseline; elsewhere
// the baseline alone), ordered: a CPU that runs one runs those below it.
enum class QuantizeLevel { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// The best level this CPU runs, chosen once; the kernels run at it.
QuantizeLevel quantize_level();
const char* quantize_level_name(QuantizeLevel level);  // "avx512", "avx2", "baseline"
bool quantize_supports(QuantizeLevel level);

namespace detail {
// While alive, the kernels run at `level` instead, in every thread (tests run
// each level this CPU has; one at a time, not nested across threads). Throws
// UsageError for a level this CPU cannot run.
class ScopedQuantizeLevel {
 public:
  explicit ScopedQuantizeLevel(QuantizeLevel level);
  ~ScopedQuantizeLevel();
  ScopedQuantizeLevel(const ScopedQuantizeLevel&) = delete;
  ScopedQuantizeLevel& operator=(const ScopedQuantizeLevel&) = delete;

 private:
  int before_;
};

// The level the kernels run at now: a ScopedQuantizeLevel's, else quantize_level().
QuantizeLevel quantize_level_in_use();
}  // namespace detail

}  // namespace tpreload
