// Converting floating values between dtypes as torch's Tensor.to() does: to
// float32, float16 and bfloat16 by rounding to nearest, ties to even (float64
// goes through float32 first, as torch's casts do); widening is exact. NaNs stay
// quiet NaNs with their sign (tpreload/core/float_bits.h says which bits). No
// torch here: the sink converts
// checkpoint tensors of another dtype as they land, and the device kernel
// (DeviceStream::convert) gives the same bytes.
#pragma once

#include <cstdint>

#include "tpreload/core/dtype.h"

namespace tpreload {

// `rows` rows of `cols` elements: row r of the source at src + r * src_stride
// elements of `from`, into dst (contiguous rows of `to`). Both dtypes floating;
// UsageError otherwise.
void convert_rows(const void* src, DType from, std::int64_t src_stride, void* dst, DType to,
                  std::int64_t rows, std::int64_t cols);

}  // namespace tpreload
