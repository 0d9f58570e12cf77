#include "tpreload/model/convert.h"

#include "tpreload/core/error.h"
#include "tpreload/core/float_bits.h"

namespace tpreload {
namespace {

// One element of `from` at `p`, as float (float64 rounds to float32 as a cast does).
float load(const void* p, DType from, std::int64_t i) {
  switch (from) {
    case DType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DType::kFloat64:
      return fbits::narrow(static_cast<const double*>(p)[i]);
    case DType::kBFloat16:
      return fbits::from_bfloat16(static_cast<const std::uint16_t*>(p)[i]);
    default:  // float16
      return fbits::from_half(static_cast<const std::uint16_t*>(p)[i]);
  }
}

double load_exact(const void* p, DType from, std::int64_t i) {
  return from == DType::kFloat64 ? static_cast<const double*>(p)[i]
                                 : fbits::widen(load(p, from, i));
}

template <typename Store>
void each(const void* src, DType from, std::int64_t stride, std::int64_t rows, std::int64_t cols,
          Store store) {
  const std::size_t size = dtype_size(from);
  for (std::int64_t r = 0; r < rows; ++r) {
    const void* row =
        static_cast<const std::byte*>(src) + r * stride * static_cast<std::int64_t>(size);
    for (std::int64_t c = 0; c < cols; ++c) store(r * cols + c, row, c);
  }
}

// bfloat16 into float32, the staging of online FP8 and of every conversion of a
// bfloat16 checkpoint: each value's bits moved up a half, a loop the compiler
// vectorizes (at -O3: -O2's cost model leaves it scalar).
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
void bf16_rows_to_f32(const std::uint16_t* src, std::int64_t stride, std::uint32_t* dst,
                      std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint16_t* in = src + r * stride;
    std::uint32_t* out = dst + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) out[c] = static_cast<std::uint32_t>(in[c]) << 16;
  }
}

}  // namespace

void convert_rows(const void* src, DType from, std::int64_t src_stride, void* dst, DType to,
                  std::int64_t rows, std::int64_t cols) {
  if (!dtype_is_floating(from) || !dtype_is_floating(to))
    raise<UsageError>("convert_rows: ", dtype_name(from), " to ", dtype_name(to),
                      " (only floating dtypes are converted)");
  switch (to) {
    case DType::kFloat64:
      each(src, from, src_stride, rows, cols, [&](std::int64_t o, const void* row, std::int64_t c) {
        static_cast<double*>(dst)[o] = load_exact(row, from, c);
      });
      break;
    case DType::kFloat32:
      if (from == DType::kBFloat16) {
        bf16_rows_to_f32(static_cast<const std::uint16_t*>(src), src_stride,
                         static_cast<std::uint32_t*>(dst), rows, cols);
        break;
      }
      each(src, from, src_stride, rows, cols, [&](std::int64_t o, const void* row, std::int64_t c) {
        static_cast<float*>(dst)[o] = load(row, from, c);
      });
      break;
    case DType::kBFloat16:
      each(src, from, src_stride, rows, cols, [&](std::int64_t o, const void* row, std::int64_t c) {
        static_cast<std::uint16_t*>(dst)[o] = fbits::to_bfloat16(load(row, from, c));
      });
      break;
    default:  // float16
      each(src, from, src_stride, rows, cols, [&](std::int64_t o, const void* row, std::int64_t c) {
        static_cast<std::uint16_t*>(dst)[o] = fbits::to_half(load(row, from, c));
      });
  }
}

}  // namespace tpreload
