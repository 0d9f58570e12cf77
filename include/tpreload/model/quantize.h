// Per-row int8 quantization, the kernel behind the int8 processing of checkpoint
// weights. No torch here, so the kernels are tested and benchmarked alone.
//
// For each of `rows` rows of `cols` contiguous elements, row r starting at
// w + r * row_stride (row_stride >= cols; the output is contiguous):
//   scale[r] = max|w| / 127, or 1 when max|w| == 0 (NaNs are ignored in the max);
//   q[r][c]  = clamp(nearbyint(w / scale[r]), -127, 127), ties to even (as
//              at::round), a NaN becoming -127.
// The result is exact: the same bytes as that formula evaluated element by element
// in float, whatever the vector width the processor offers. The device kernel
// (DeviceStream::quantize_int8) computes the same bytes.
#pragma once

#include <cstdint>

namespace tpreload {

// `w` holds bfloat16 bit patterns.
void quantize_rows_bf16(const std::uint16_t* w, std::int64_t rows, std::int64_t cols,
                        std::int64_t row_stride, std::int8_t* q, float* scale);
// `w` holds IEEE float16 bit patterns (converted to float exactly).
void quantize_rows_f16(const std::uint16_t* w, std::int64_t rows, std::int64_t cols,
                       std::int64_t row_stride, std::int8_t* q, float* scale);
void quantize_rows_f32(const float* w, std::int64_t rows, std::int64_t cols,
                       std::int64_t row_stride, std::int8_t* q, float* scale);

}  // namespace tpreload
