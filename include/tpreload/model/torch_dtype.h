// Mapping between tpreload's DType and LibTorch's scalar types.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/csrc/api/include/torch/version.h>

#include "tpreload/core/dtype.h"

namespace tpreload {

// Whether this LibTorch has the FP8 scalar types (2.1 and later; Debian's 1.13
// has none). The one place that asks for LibTorch's version.
#if defined(TORCH_VERSION_MAJOR) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))
#define TPRELOAD_TORCH_HAS_FLOAT8 1
#else
#define TPRELOAD_TORCH_HAS_FLOAT8 0
#endif

// Throws UsageError for a scalar type tpreload does not handle (e.g. complex).
DType dtype_from_torch(c10::ScalarType type);
// The same, for a tensor meant for a parameter of dtype `expected`: on a
// LibTorch without FP8 types, a uint8 tensor for an FP8 parameter holds its
// FP8 bytes, and is taken as that FP8 dtype.
DType dtype_from_torch(c10::ScalarType type, DType expected);
// An FP8 dtype on a LibTorch without FP8 types: uint8 (Byte), the same bytes;
// such a tensor maps back to uint8, not to its FP8 dtype.
c10::ScalarType dtype_to_torch(DType dtype);

}  // namespace tpreload
