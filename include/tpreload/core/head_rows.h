// A window of every head's rows of a weight, dequantized and laid out anew:
// the arithmetic of a family's post-reload step (DeepSeek's MLA: W_UK_T and
// W_UV from kv_b_proj, as vLLM's process_weights_after_loading computes them),
// one element at a time, the same on the host and the device
// (DeviceStream::head_rows). No torch here.
#pragma once

#include <cstdint>

#include "tpreload/core/dtype.h"
#include "tpreload/core/float8.h"
#include "tpreload/core/float_bits.h"

namespace tpreload {

// `w` holds heads x head_rows rows of `cols` elements (float8_e4m3fn, int8,
// bfloat16, float16 or float32). For each head n, rows [first, first + rows)
// of its head_rows go to out [heads, rows, cols], or transposed to [heads,
// cols, rows]; each value times its scale (none; one for the tensor; one per
// row of w; or one per block_n x block_k block of w, a grid of grid_cols
// columns), the product in float32 (vLLM's scaled_dequantize), rounded to
// the output's dtype (bfloat16, float16 or float32) to nearest, ties to even.
struct HeadRows {
  enum class Scale : std::uint8_t { kNone, kTensor, kRow, kBlocks };
  const void* w = nullptr;
  DType w_dtype = DType::kFloat32;
  std::int64_t heads = 0, head_rows = 0, first = 0, rows = 0, cols = 0;
  Scale scale_kind = Scale::kNone;
  const float* scale = nullptr;
  std::int64_t block_n = 0, block_k = 0, grid_cols = 0;
  bool transpose = false;
  void* out = nullptr;
  DType out_dtype = DType::kFloat32;

  TPRELOAD_HOST_DEVICE std::int64_t elements() const { return heads * rows * cols; }
};

// Element `i` (row-major over out's shape) of `a`.
TPRELOAD_HOST_DEVICE inline void head_rows_element(const HeadRows& a, std::int64_t i) {
  const std::int64_t per_head = a.rows * a.cols, n = i / per_head, at = i % per_head;
  const std::int64_t r = a.first + (a.transpose ? at % a.rows : at / a.cols),
                     c = a.transpose ? at / a.rows : at % a.cols;
  const std::int64_t row = n * a.head_rows + r, k = row * a.cols + c;
  float v;
  switch (a.w_dtype) {
    case DType::kFloat8E4M3:
      v = fp8::from_e4m3fn(static_cast<const std::uint8_t*>(a.w)[k]);
      break;
    case DType::kInt8:
      v = static_cast<float>(static_cast<const std::int8_t*>(a.w)[k]);
      break;
    case DType::kBFloat16:
      v = fbits::from_bfloat16(static_cast<const std::uint16_t*>(a.w)[k]);
      break;
    case DType::kFloat16:
      v = fbits::from_half(static_cast<const std::uint16_t*>(a.w)[k]);
      break;
    default:
      v = static_cast<const float*>(a.w)[k];
  }
  switch (a.scale_kind) {
    case HeadRows::Scale::kTensor:
      v *= a.scale[0];
      break;
    case HeadRows::Scale::kRow:
      v *= a.scale[row];
      break;
    case HeadRows::Scale::kBlocks:
      v *= a.scale[(row / a.block_n) * a.grid_cols + c / a.block_k];
      break;
    case HeadRows::Scale::kNone:
      break;
  }
  switch (a.out_dtype) {
    case DType::kBFloat16:
      static_cast<std::uint16_t*>(a.out)[i] = fbits::to_bfloat16(v);
      break;
    case DType::kFloat16:
      static_cast<std::uint16_t*>(a.out)[i] = fbits::to_half(v);
      break;
    default:
      static_cast<float*>(a.out)[i] = v;
  }
}

// Every element, on the host.
inline void head_rows_host(const HeadRows& a) {
  for (std::int64_t i = 0, n = a.elements(); i < n; ++i) head_rows_element(a, i);
}

}  // namespace tpreload
